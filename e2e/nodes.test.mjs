// A node's health lifecycle on its page, with JavaScript off (every form is a plain post):
// acceptance checks with their figures, a drain with its reason and who did it, and
// retirement asked twice; the fleet page shows the state beside the node.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Berth, browser, signInAsAdmin } from './harness.mjs';

let berth, chrome, page;

before(async () => {
  berth = await Berth.start();
  chrome = await browser();
  const context = await chrome.newContext({ javaScriptEnabled: false, viewport: { width: 1400, height: 1000 } });
  page = await context.newPage();
  await signInAsAdmin(page, berth, '/admin/fleet');
});

after(async () => {
  await chrome?.close();
  await berth?.kill();
});

test('acceptance, a drain and retirement of a node, without JavaScript', async () => {
  const node = 'fra1-a100-01';
  await page.goto(`${berth.url}/admin/fleet?search=${node}`);
  await page.locator(`[data-node="${node}"] [data-node-state="available"]`).waitFor();
  await page.getByRole('link', { name: node, exact: true }).click();
  await page.waitForURL((url) => url.pathname === `/admin/nodes/${node}`);
  await page.locator('[data-state="available"]').waitFor();

  await page.getByLabel('Level').selectOption('medium');
  await page.getByRole('button', { name: 'Run checks' }).click();
  const run = page.locator('[data-check-run][data-outcome="passed"]');
  await run.waitFor();
  assert.match(await run.innerText(), /Acceptance, level medium, by admin@berth\.local/);
  const nccl = run.locator('[data-check="NCCL all-reduce bus bandwidth"]');
  assert.equal(await nccl.getAttribute('data-passed'), 'true');
  assert.match(await nccl.innerText(), /GB\/s/);
  await page.locator('[data-state="available"]').waitFor();

  await page.getByLabel('Action').selectOption('drain');
  await page.getByLabel('Why', { exact: true }).fill('cabling work in row 4');
  await page.getByRole('button', { name: 'Apply' }).click();
  await page.locator('[data-state="draining"]').waitFor();
  const latest = page.locator('[data-change]').first();
  assert.match(await latest.innerText(), /Available → Draining[\s\S]*cabling work in row 4[\s\S]*admin@berth\.local/);

  await page.getByLabel('Why retire it').fill('returned to the vendor');
  await page.getByText('Retire', { exact: true }).click();
  await page.getByRole('button', { name: 'Yes, retire the node' }).click();
  await page.locator('[data-state="retired"]').waitFor();
  assert.deepEqual(await page.getByLabel('Action').locator('option').allInnerTexts(), ['Reinstate (acceptance needed)']);

  await page.goto(`${berth.url}/admin/fleet?search=${node}`);
  await page.locator(`[data-node="${node}"] [data-node-state="retired"]`).waitFor();
  assert.match(await page.locator(`[data-node="${node}"] [data-node-state-note]`).innerText(), /returned to the vendor/);
});
