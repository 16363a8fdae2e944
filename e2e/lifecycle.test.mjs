// A person's first session with Berth, in real Chromium against a real server:
// browse the catalog, sign in, launch a notebook, watch it become ready without reloading,
// read its connection details, stop it and see its capacity come back.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { Berth, browser, enterOneTimeCode, watchConsole, artifacts } from './harness.mjs';

let berth, chrome, page, consoleErrors;

before(async () => {
  berth = await Berth.start();
  chrome = await browser();
  page = await chrome.newPage({ viewport: { width: 1280, height: 900 } });
  consoleErrors = watchConsole(page);
});

after(async () => {
  await chrome?.close();
  await berth?.kill();
});

function idleH100(metricsOrText) {
  const m = metricsOrText.match(/H100-80GB · (\d+) of (\d+) GPUs free now/);
  return m ? Number(m[1]) : null;
}

test('the catalog lists every offering with sizes and prices, without signing in', async () => {
  await page.goto(`${berth.url}/catalog`);
  for (const title of ['Jupyter notebook', 'Training job', 'Inference endpoint', 'Dedicated cluster']) {
    await page.getByRole('heading', { name: title }).waitFor();
  }
  const notebook = page.getByRole('region', { name: 'Jupyter notebook' });
  await notebook.getByText('H100 slice 1g.10gb').waitFor();
  await notebook.getByText('$0.55').waitFor();
  const cluster = page.getByRole('region', { name: 'Dedicated cluster' });
  await cluster.getByText('1 node, 8 x H100 80GB, NVLink').waitFor();
  assert.equal(idleH100(await page.locator('body').innerText()), 32);
  await page.screenshot({ path: join(artifacts, 'catalog.png'), fullPage: true });
});

test('launching asks for a sign-in and comes back to the form', async () => {
  await page.getByRole('link', { name: 'Launch Jupyter notebook H100 slice 1g.10gb' }).click();
  await page.getByRole('heading', { name: 'Sign in to continue' }).waitFor();
  await page.getByRole('link', { name: 'Sign in' }).last().click();
  await page.waitForURL(/\/login\?next=/);
  await page.getByLabel('Email', { exact: true }).fill('admin@berth.local');
  await page.getByLabel('Password').fill('not the password');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('alert').getByText('The email or password is not right').waitFor();

  await page.getByLabel('Password').fill(berth.adminPassword());
  await page.getByRole('button', { name: 'Sign in' }).click();
  await enterOneTimeCode(page, berth);
  await page.waitForURL(/\/launch\/notebook\?size=h100-1g.10gb/);
  await page.getByRole('heading', { name: 'Launch a Jupyter notebook' }).waitFor();
  assert.equal(await page.getByLabel('H100 slice 1g.10gb').isChecked(), true);
});

test('the form explains a refusal and writes nothing', async () => {
  await page.getByLabel('Name').fill('Not A Valid Name');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.getByRole('alert').getByText('may use only lowercase letters, digits and hyphens').waitFor();
  await page.getByLabel('Name').fill('9lives');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.getByRole('alert').getByText('must start with a letter and not end with a hyphen').waitFor();
  // The refusal is about the name: the field says so to assistive technology, and beside it.
  const name = page.getByLabel('Name');
  assert.equal(await name.getAttribute('aria-invalid'), 'true');
  const described = await name.getAttribute('aria-describedby');
  assert.match(await page.locator(`[id="${described.split(' ').pop()}"]`).innerText(), /must start with a letter/);
  assert.equal(await page.getByLabel('Duration (hours)').getAttribute('aria-invalid'), null, 'only the name');
  // The browser itself holds the duration to the offering's limit.
  assert.equal(await page.getByLabel('Duration (hours)').getAttribute('max'), '24');
  await page.getByLabel('Name').fill('analysis');
  assert.match(await berth.metrics(), /berth_environments\{state="requested"\} 0/);
});

test('a launched notebook moves to ready without a reload and shows how to connect', async () => {
  await page.getByLabel('Duration (hours)').fill('2');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  // Marks this document: if the page reloaded, the mark would be gone.
  await page.evaluate(() => { window.__berthMark = true; });
  await page.locator('[data-state="provisioning"]').waitFor({ timeout: 15_000 });
  await page.locator('[data-step-status="succeeded"]').first().waitFor();
  await page.locator('[data-state="ready"]').waitFor({ timeout: 30_000 });
  assert.equal(await page.evaluate(() => window.__berthMark), true, 'progress arrived without reloading');

  // Opened through Berth on the notebook's own origin: a link, no token to copy.
  const id = page.url().split('/').pop();
  assert.equal(await page.getByTestId('open-notebook').getAttribute('href'), `/environments/${id}/open`);
  await page.getByText('MIG 1g.10gb at memory slice').waitFor();
  await page.screenshot({ path: join(artifacts, 'environment-ready.png'), fullPage: true });

  await page.getByRole('link', { name: 'Environments', exact: true }).first().click();
  const row = page.locator('tr[data-environment="analysis"]');
  await row.locator('[data-state="ready"]').waitFor();
});

test('stopping tears it down and gives the capacity back', async () => {
  await page.locator('tr[data-environment="analysis"]').getByRole('link', { name: 'analysis' }).click();
  await page.evaluate(() => { window.__berthMark = true; });
  await page.locator('summary', { hasText: 'Stop and release' }).click();
  await page.getByRole('button', { name: 'Yes, stop and release' }).click();
  await page.locator('[data-state="released"]').waitFor({ timeout: 30_000 });
  assert.equal(await page.evaluate(() => window.__berthMark), true);
  await page.getByText('Release capacity').waitFor();
  await page.screenshot({ path: join(artifacts, 'environment-released.png'), fullPage: true });

  const metrics = await berth.metrics();
  assert.match(metrics, /berth_environments\{state="released"\} 1/);
  await page.goto(`${berth.url}/catalog`);
  assert.equal(idleH100(await page.locator('body').innerText()), 32, 'the slice is free again');
});

test('a server killed mid-provisioning picks the work up after restart', async () => {
  await page.goto(`${berth.url}/launch/training?size=h100-1`);
  await page.getByLabel('Name').fill('crash-test');
  await page.getByLabel('Container image').fill('ghcr.io/acme/trainer:1.0');
  await page.getByLabel('Command').fill('python train.py; sleep infinity');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  await page.locator('[data-state="provisioning"]').waitFor({ timeout: 15_000 });

  // The page is loaded and hydrated, as a person looking at it has it; it keeps polling
  // while the server is down. Those requests are refused or cut off, as they would be for
  // anyone looking at the page during a restart. Nothing else may fail.
  await page.locator('body[data-hydrated]').waitFor();
  const before = consoleErrors.length;
  await berth.restart();
  await page.reload();
  await page.locator('[data-state="ready"]').waitFor({ timeout: 30_000 });
  // A training job at work is running, not "ready", and publishes no endpoint.
  assert.equal((await page.locator('[data-state="ready"]').first().innerText()).trim(), 'Running');
  await page.getByText('Publish how to follow the job').first().waitFor();
  assert.ok(!(await berth.output).includes('One-time password'), 'no second administrator password');
  const duringRestart = consoleErrors.splice(before);
  assert.deepEqual(
    duringRestart.filter((e) => !/^error: Failed to load resource: net::ERR_/.test(e)),
    [],
    'only the requests made while the server was down failed',
  );
  assert.deepEqual(consoleErrors, [], 'no errors in the browser console');
});

test('signing out ends the session', async () => {
  await page.getByRole('button', { name: 'Sign out' }).click();
  await page.waitForURL(/\/catalog$/);
  await page.goto(`${berth.url}/environments`);
  await page.getByRole('heading', { name: 'Sign in to continue' }).waitFor();
});
