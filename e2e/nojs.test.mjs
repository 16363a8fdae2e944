// Every form works before (or without) the WASM: the same journey with JavaScript off.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Berth, browser, enterOneTimeCode, fetchLocal } from './harness.mjs';

let berth, chrome, page;

before(async () => {
  berth = await Berth.start();
  chrome = await browser();
  const context = await chrome.newContext({ javaScriptEnabled: false });
  page = await context.newPage();
});

after(async () => {
  await chrome?.close();
  await berth?.kill();
});

test('sign in, a refused launch, a launch and a stop, all without JavaScript', async () => {
  await page.goto(`${berth.url}/login?next=/launch/inference`);
  await page.getByLabel('Email', { exact: true }).fill('admin@berth.local');
  await page.getByLabel('Password').fill('wrong');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('alert').getByText('The email or password is not right').waitFor();

  // A plain form post reloads the page, so the fields start empty again.
  await page.getByLabel('Email', { exact: true }).fill('admin@berth.local');
  await page.getByLabel('Password').fill(berth.adminPassword());
  await page.getByRole('button', { name: 'Sign in' }).click();
  await enterOneTimeCode(page, berth);
  await page.waitForURL(/\/launch\/inference$/);

  await page.getByLabel('Name').fill('plain-html');
  await page.getByLabel('Container image').fill('https://not/an/image');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.getByRole('alert').getByText('is a reference like ghcr.io/org/model:tag, not a URL').waitFor();
  assert.equal(await page.getByLabel('Container image').getAttribute('aria-invalid'), 'true', 'the field says it too');
  // The refusal comes back to the form as it was typed.
  assert.equal(await page.getByLabel('Name').inputValue(), 'plain-html');
  assert.equal(await page.getByLabel('Container image').inputValue(), 'https://not/an/image');

  // The model, the server's arguments and its variables: Berth's own variables are refused,
  // and the field says so.
  const fillEndpoint = async (env) => {
    await page.getByLabel('Name').fill('plain-html');
    await page.getByLabel('1 x L40S 48GB').check();
    await page.getByLabel('Duration (hours)').fill('3');
    await page.getByLabel('Container image').fill('ghcr.io/acme/server:1');
    await page.getByLabel('Model', { exact: true }).fill('org/tiny-model');
    await page.getByLabel('Server arguments').fill("--model {model} --chat-template 'a b'");
    await page.getByLabel('Environment variables').fill(env);
    await page.getByRole('button', { name: 'Launch' }).click();
  };
  await fillEndpoint('BERTH_API_KEY=k3y_not_shown');
  await page.getByRole('alert').getByText('environment variables: BERTH_API_KEY is set by Berth').waitFor();
  assert.equal(await page.getByLabel('Environment variables').getAttribute('aria-invalid'), 'true');
  // Everything typed is kept but the variables' values, which Berth never shows back.
  assert.equal(await page.getByLabel('1 x L40S 48GB').isChecked(), true);
  assert.equal(await page.getByLabel('Duration (hours)').inputValue(), '3');
  assert.equal(await page.getByLabel('Model', { exact: true }).inputValue(), 'org/tiny-model');
  assert.equal(await page.getByLabel('Server arguments').inputValue(), "--model {model} --chat-template 'a b'");
  assert.equal(await page.getByLabel('Environment variables').inputValue(), 'BERTH_API_KEY=');
  assert.ok(!(await page.content()).includes('k3y_not_shown'), 'a value is never shown back');
  await fillEndpoint('HF_TOKEN=hf_do_not_show\nMAX_BATCH=8');
  await page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  assert.equal(await page.getByTestId('model').innerText(), 'org/tiny-model');
  assert.equal(await page.getByTestId('server-args').innerText(), "--model org/tiny-model --chat-template 'a b'");
  assert.equal(await page.getByTestId('env-names').innerText(), 'HF_TOKEN, MAX_BATCH');
  assert.ok(!(await page.content()).includes('hf_do_not_show'), 'a value is never shown back');
  // No polling without WASM: the page's own Refresh link shows the progress.
  await untilState('ready');
  const url = await page.locator('[data-endpoint-url]').innerText();
  // The endpoint is served on an origin of its own, never the portal's.
  assert.match(url, /^http:\/\/[0-9a-f-]{36}\.localhost:\d+\/v1$/);
  // The key is shown once, through the session, after a plain form post.
  await page.getByRole('button', { name: 'Show API key (once)' }).click();
  const key = (await page.getByTestId('api-key').innerText()).trim();
  assert.match(key, /^berth_ep_[0-9a-f]{64}$/);
  await page.getByRole('link', { name: 'Refresh' }).click();
  assert.equal(await page.getByTestId('api-key').count(), 0, 'shown once');
  await page.getByRole('button', { name: 'Replace API key' }).waitFor();
  const models = await fetchLocal(`${url}/models`, { headers: { authorization: `Bearer ${key}` } });
  assert.equal(models.status, 200);
  assert.equal((await models.json()).data[0].id, 'org/tiny-model', 'the server serves the model asked for');
  assert.equal((await fetchLocal(`${url}/models`)).status, 401);
  // Two replicas, by a plain form too: the second books the other L40S.
  await page.getByLabel('Replicas', { exact: true }).fill('2');
  await page.getByRole('button', { name: 'Apply' }).click();
  for (let i = 0; i < 40 && !(await page.getByTestId('replicas').innerText()).startsWith('2 running'); i++) {
    await new Promise((r) => setTimeout(r, 250));
    await page.getByRole('link', { name: 'Refresh' }).click();
  }
  assert.equal(await page.getByTestId('replicas').innerText(), '2 running');
  const listed = await (await fetchLocal(`${url}/models`, { headers: { authorization: `Bearer ${key}` } })).json();
  assert.equal(listed.replicas, 2);

  // Asked first, without JavaScript too: a <details> holds the real button.
  await page.locator('summary', { hasText: 'Stop and release' }).click();
  await page.getByRole('button', { name: 'Yes, stop and release' }).click();
  await untilState('released');
});

test('volumes: made, grown, attached at launch and deleted, all without JavaScript', async () => {
  await page.goto(`${berth.url}/volumes`);
  await page.getByLabel('Name').fill('Not_A_Label');
  await page.getByLabel('Size (GiB)').fill('5');
  await page.getByRole('button', { name: 'Create volume' }).click();
  await page.getByRole('alert').getByText('may hold only lowercase letters, digits and hyphens').waitFor();
  assert.equal(await page.getByLabel('Name').getAttribute('aria-invalid'), 'true');
  for (const name of ['plain', 'spare']) {
    await page.getByLabel('Name').fill(name);
    await page.getByLabel('Size (GiB)').fill('5');
    await page.getByRole('button', { name: 'Create volume' }).click();
    await page.locator(`tr[data-volume="${name}"]`).waitFor();
  }
  await page.getByLabel('New size of plain (GiB)').fill('8');
  await page.getByRole('button', { name: 'Grow plain' }).click();
  await page.locator('tr[data-volume="plain"] [data-size]').getByText('8 GiB').waitFor();
  const spare = page.locator('tr[data-volume="spare"]');
  await spare.locator('summary', { hasText: 'Delete' }).click();
  await spare.getByRole('button', { name: 'Yes, delete' }).click();
  await page.locator('tr[data-volume="plain"]').waitFor();
  assert.equal(await page.locator('tr[data-volume="spare"]').count(), 0);

  // The launch form's checkbox is a plain form field too.
  await page.goto(`${berth.url}/launch/notebook`);
  await page.getByLabel('Name').fill('with-volume');
  await page.getByLabel('Duration (hours)').fill('1');
  await page.getByLabel(/^plain \(8 GiB, personal\) at \/data\/plain$/).check();
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  await page.locator('[data-environment-volumes] [data-mount="/data/plain"]').waitFor();
  await page.locator('[data-environment-volumes] [data-mount="/home/jovyan/work"]').waitFor();
  await page.locator('summary', { hasText: 'Stop and release' }).click();
  await page.getByRole('button', { name: 'Yes, stop and release' }).click();
  await untilState('released');
});

async function untilState(state) {
  for (let i = 0; i < 60; i++) {
    if (await page.locator(`[data-state="${state}"]`).count()) return;
    await new Promise((r) => setTimeout(r, 500));
    await page.getByRole('link', { name: 'Refresh' }).click();
  }
  throw new Error(`never reached ${state}`);
}
