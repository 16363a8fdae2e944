// Volumes in real Chromium: a member of project vision (signed in through the tenant's
// identity provider) makes a project volume on /volumes, books a notebook that attaches it,
// writes a file through the notebook's own origin (Jupyter's contents API), stops it, books
// another notebook with the same volume and reads the file back. Bad input is refused on the
// page: a name that is not a DNS label, a size past the project's storage limit.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { Berth, browser, signInAsAdmin, watchConsole, artifacts } from './harness.mjs';
import { startOidcProvider, signInAtProvider } from './oidc.mjs';

let berth, chrome, idp;

const accounts = {
  'ada@acme.example': { email: 'ada@acme.example', name: 'Ada Acme', groups: ['acme-admins'] },
  'mia@acme.example': { email: 'mia@acme.example', name: 'Mia Acme', groups: ['acme-ml'] },
};

before(async () => {
  berth = await Berth.start({ BERTH_DEMO: 'true' });
  const callback = `${berth.url}/auth/oidc/callback`;
  idp = await startOidcProvider({
    clients: [{ client_id: 'acme-berth', client_secret: 'acme-secret', redirect_uris: [callback] }],
    accounts,
  });
  chrome = await browser();
  const admin = await chrome.newPage({ viewport: { width: 1400, height: 1000 } });
  await signInAsAdmin(admin, berth, '/admin/tenants');
  await admin.getByRole('link', { name: 'Acme Research', exact: true }).click();
  await admin.waitForURL(/\/tenants\/\d+$/);
  await admin.getByLabel('Issuer URL').fill(idp.issuer);
  await admin.getByRole('button', { name: 'Save connection' }).click();
  await admin.getByLabel('Client secret (stored; leave empty to keep it)').waitFor();
  await admin.close();
});

after(async () => {
  await chrome?.close();
  await idp?.stop();
  await berth?.kill();
});

async function ssoSignIn(email) {
  const context = await chrome.newContext({ viewport: { width: 1400, height: 1000 } });
  const page = await context.newPage();
  const consoleErrors = watchConsole(page);
  await page.goto(`${berth.url}/login?next=/environments`);
  await page.getByLabel('Work email or organization').fill(email);
  await page.getByRole('button', { name: 'Continue with single sign-on' }).click();
  await signInAtProvider(page, email);
  await page.waitForURL((url) => url.pathname === '/environments');
  return { context, page, consoleErrors };
}

/** Books a notebook in project vision with volume `volume` ticked; answers its id once ready. */
async function notebookWith(page, name, volume) {
  await page.goto(`${berth.url}/launch/notebook?size=h100-1g.10gb`);
  await page.getByLabel('Name').fill(name);
  await page.getByLabel('Duration (hours)').fill('1');
  await page.getByLabel('Project', { exact: true }).selectOption({ label: 'vision' });
  const option = page.locator(`[data-volume-option="${volume}"]`);
  await option.waitFor();
  assert.match(await option.innerText(), new RegExp(`${volume} \\(20 GiB, shared with project vision\\) at /data/${volume}`));
  // The home volume is always there.
  assert.match(await page.locator('[data-volume-option="home"]').innerText(), /at \/home\/jovyan\/work · always attached/);
  await option.getByRole('checkbox').check();
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  await page.locator('[data-state="ready"]').waitFor({ timeout: 30_000 });
  // The environment's page lists its volumes by mount path.
  await page.locator(`[data-environment-volumes] [data-mount="/data/${volume}"]`).waitFor();
  await page.locator('[data-environment-volumes] [data-mount="/home/jovyan/work"]').waitFor();
  return page.url().split('/').pop();
}

/** Opens the notebook from its page; answers the notebook's tab on its own origin. */
async function openLab(page) {
  const open = page.getByRole('link', { name: 'Open JupyterLab' });
  const [lab] = await Promise.all([page.context().waitForEvent('page'), open.click()]);
  await lab.waitForLoadState();
  await lab.getByRole('heading', { name: 'JupyterLab' }).waitFor();
  return lab;
}

async function stop(page) {
  await page.locator('summary', { hasText: 'Stop and release' }).click();
  await page.getByRole('button', { name: 'Yes, stop and release' }).click();
  await page.locator('[data-state="released"]').waitFor({ timeout: 30_000 });
}

test('a file written in one booking is read in the next that attaches the same volume', async () => {
  const ada = await ssoSignIn('ada@acme.example');
  const mia = await ssoSignIn('mia@acme.example');
  // Ada puts Mia in project vision and limits its storage to 100 GiB.
  await ada.page.getByRole('link', { name: 'Team', exact: true }).click();
  const vision = ada.page.locator('li[data-project="vision"]');
  await vision.getByLabel('Member email').fill('mia@acme.example');
  await vision.getByRole('button', { name: 'Add' }).click();
  await vision.getByText('mia@acme.example').waitFor();
  await ada.page.goto(`${berth.url}/admin/quotas`);
  await ada.page.locator('#s-level').selectOption('project');
  await ada.page.getByLabel('Who', { exact: true }).fill('vision');
  await ada.page.getByLabel('Storage (GiB)').fill('100');
  await ada.page.getByRole('button', { name: 'Save storage limit' }).click();
  await ada.page.locator('tr[data-storage-quota="Project acme/vision"]').getByText('100 GiB').waitFor();

  // Bad input is refused on the page, and nothing is made.
  await mia.page.getByRole('link', { name: 'Volumes', exact: true }).click();
  await mia.page.waitForURL((url) => url.pathname === '/volumes');
  await mia.page.getByLabel('Name').fill('Big_Data');
  await mia.page.getByLabel('Size (GiB)').fill('20');
  await mia.page.getByLabel('Shared with').selectOption({ label: 'Project vision' });
  await mia.page.getByRole('button', { name: 'Create volume' }).click();
  await mia.page.getByRole('alert').getByText('may hold only lowercase letters, digits and hyphens').waitFor();
  await mia.page.getByLabel('Name').fill('datasets');
  await mia.page.getByLabel('Size (GiB)').fill('200');
  await mia.page.getByRole('button', { name: 'Create volume' }).click();
  await mia.page
    .getByRole('alert')
    .getByText('project vision has 100 GiB of 100 GiB left; 200 GiB asked')
    .waitFor();
  assert.equal(await mia.page.locator('tr[data-volume]').count(), 0);

  await mia.page.getByLabel('Size (GiB)').fill('20');
  await mia.page.getByRole('button', { name: 'Create volume' }).click();
  const row = mia.page.locator('tr[data-volume="datasets"]');
  await row.waitFor();
  assert.match(await row.innerText(), /Project vision/);
  assert.match(await row.innerText(), /20 GiB/);
  assert.match(await row.innerText(), /\/data\/datasets/);

  // First booking: write a file through the notebook's own origin.
  const first = await notebookWith(mia.page, 'writer', 'datasets');
  const lab = await openLab(mia.page);
  const written = await lab.evaluate(async () => {
    const response = await fetch('/api/contents/data/datasets/notes.txt', {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ type: 'file', format: 'text', content: 'kept across bookings' }),
    });
    return { status: response.status, body: await response.json() };
  });
  assert.equal(written.status, 201, JSON.stringify(written.body));
  assert.equal(written.body.path, 'data/datasets/notes.txt');
  await lab.close();
  // While attached, the volume shows where and cannot be deleted.
  await mia.page.goto(`${berth.url}/volumes`);
  // The simulated fleet's directories hold no size themselves: the page says how it holds.
  assert.match(await mia.page.locator('[data-size-rule]').innerText(), /not attached again until it is grown/);
  assert.match(await row.locator('[data-attached]').innerText(), /writer since \d{4}-\d\d-\d\d \d\d:\d\d UTC/);
  await row.locator('summary', { hasText: 'Delete' }).click();
  await row.getByRole('button', { name: 'Yes, delete' }).click();
  await mia.page
    .getByRole('alert')
    .getByText('volume "datasets" is attached to writer; stop it first, then delete the volume')
    .waitFor();
  await mia.page.goto(`${berth.url}/environments/${first}`);
  await stop(mia.page);

  // Second booking: the file is there.
  await notebookWith(mia.page, 'reader', 'datasets');
  const again = await openLab(mia.page);
  const read = await again.evaluate(async () => {
    const response = await fetch('/api/contents/data/datasets/notes.txt');
    return { status: response.status, body: await response.json() };
  });
  assert.equal(read.status, 200, JSON.stringify(read.body));
  assert.equal(read.body.content, 'kept across bookings');
  assert.equal(read.body.type, 'file');
  await again.screenshot({ path: join(artifacts, 'volume-read-back.png') });
  await again.close();
  await mia.page.goto(`${berth.url}/volumes`);
  await mia.page.locator('tr[data-volume="home"]').waitFor();
  assert.match(await row.locator('[data-attached]').innerText(), /reader since/);
  await mia.page.screenshot({ path: join(artifacts, 'volumes.png'), fullPage: true });

  assert.deepEqual(mia.consoleErrors, []);
  assert.deepEqual(ada.consoleErrors, []);
  await mia.context.close();
  await ada.context.close();
});
