// Reaching what was booked, in real Chromium against a real server and its simulated
// fleet: open a notebook from its page on its own origin, http://<id>.localhost:<port>
// (Chromium resolves *.localhost to loopback by itself), its kernel WebSocket too; come
// back to it after signing in again; and watch a training job's log to its end.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { adminSession, enterOneTimeCode, artifacts } from './harness.mjs';

let berth, chrome, page, consoleErrors, notebookUrl;

before(async () => {
  ({ berth, chrome, page, consoleErrors } = await adminSession('/launch/notebook'));
});

after(async () => {
  await chrome?.close();
  await berth?.kill();
});

test('a ready notebook opens from its page on its own origin, kernel WebSocket included', async () => {
  await page.getByLabel('H100 slice 1g.10gb').check();
  await page.getByLabel('Name').fill('explore');
  await page.getByLabel('Duration (hours)').fill('2');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  const id = page.url().split('/').pop();
  await page.locator('[data-state="ready"]').waitFor({ timeout: 30_000 });

  const open = page.getByRole('link', { name: 'Open JupyterLab' });
  assert.equal(await open.getAttribute('href'), `/environments/${id}/open`);
  const envOrigin = `http://${id}.localhost:${berth.port}`;
  assert.equal(await page.getByTestId('notebook-address').innerText(), `${envOrigin}/`);
  const [lab] = await Promise.all([page.context().waitForEvent('page'), open.click()]);
  await lab.waitForLoadState();
  // Through the portal (a ticket) to the notebook's own origin, where Jupyter goes to /lab.
  notebookUrl = `${envOrigin}/lab`;
  assert.equal(lab.url(), notebookUrl);
  await lab.getByRole('heading', { name: 'JupyterLab' }).waitFor();
  await lab.getByText('Notebook explore on the simulated fleet.').waitFor();
  // The page's script opened the kernel's WebSocket on the notebook's origin and got its echo.
  await lab.getByText(`Kernel: connected (echo: print('hello from Berth'))`).waitFor({ timeout: 10_000 });
  // The notebook's origin holds its own session cookie only: Berth's stays with the portal.
  const cookies = await page.context().cookies(notebookUrl);
  assert.deepEqual(cookies.map((c) => c.name), ['berth_env']);
  assert.equal(cookies[0].domain, `${id}.localhost`, 'host-only');
  assert.equal(cookies[0].httpOnly, true);
  assert.equal(cookies[0].sameSite, 'Lax');
  const portalCookies = await page.context().cookies(berth.url);
  assert.deepEqual(portalCookies.map((c) => c.name), ['berth_session']);
  await lab.screenshot({ path: join(artifacts, 'notebook-on-its-origin.png'), fullPage: true });
  await lab.close();
});

test('signed out, the notebook link leads through sign-in and back to the notebook', async () => {
  const fresh = await chrome.newContext({ viewport: { width: 1280, height: 900 } });
  const other = await fresh.newPage();
  await other.goto(notebookUrl);
  // No session on the notebook's origin: through the portal's open route, which asks to sign in.
  await other.waitForURL((url) => url.origin === berth.url && url.pathname === '/login');
  const id = new URL(notebookUrl).hostname.split('.')[0];
  assert.equal(new URL(other.url()).searchParams.get('next'), `/environments/${id}/open?next=/lab`);
  await other.getByLabel('Email', { exact: true }).fill('admin@berth.local');
  await other.getByLabel('Password').fill(berth.adminPassword());
  await other.getByRole('button', { name: 'Sign in' }).click();
  await enterOneTimeCode(other, berth);
  // Signing in lands in the app's router, which hands the open route back to the server.
  await other.waitForURL(notebookUrl);
  await other.getByRole('heading', { name: 'JupyterLab' }).waitFor();
  await other.getByText(`Kernel: connected (echo: print('hello from Berth'))`).waitFor({ timeout: 10_000 });
  await fresh.close();
});

test("a training job's log and exit status show on its page", async () => {
  await page.goto(`${berth.url}/launch/training?size=h100-1`);
  await page.getByLabel('Name').fill('fit');
  await page.getByLabel('Container image').fill('ghcr.io/acme/trainer:1.0');
  await page.getByLabel('Command').fill('python train.py --epochs 5');
  await page.getByLabel('Duration (hours)').fill('2');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  await page.locator('[data-state="ready"]').waitFor({ timeout: 30_000 });
  const logs = page.getByTestId('job-logs');
  await logs.getByText('$ python train.py --epochs 5').waitFor();
  // The log grows while the page refreshes itself, until the job ends.
  await page.locator('[data-job-state="succeeded"]').waitFor({ timeout: 20_000 });
  const text = await logs.innerText();
  assert.match(text, /epoch 5\/5: loss [0-9.]+/);
  assert.match(text, /training finished$/);
  assert.equal(await page.locator('[data-job-state]').innerText(), 'Succeeded (exit code 0)');
  // A job that ended gives its GPUs back at once; its log stays on the page.
  await page.locator('[data-state="released"]').waitFor({ timeout: 30_000 });
  await logs.getByText('training finished').waitFor();
  await page.screenshot({ path: join(artifacts, 'training-logs.png'), fullPage: true });
  assert.deepEqual(consoleErrors, [], 'no errors in the browser console');
});
