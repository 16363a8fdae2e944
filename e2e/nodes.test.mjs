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

test('a dedicated cluster whose node is retired moves to a healthy node, and its page says so', async () => {
  await page.goto(`${berth.url}/launch/cluster`);
  await page.getByLabel('Name').fill('moving-cluster');
  await page.getByLabel('1 node, 8 x H100 80GB, NVLink').check();
  await page.getByLabel('Duration (hours)').fill('2');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  const envUrl = page.url();
  // Without JavaScript the page is read again until the cluster runs.
  const reloadUntil = async (selector) => {
    for (let i = 0; i < 120; i++) {
      if (await page.locator(selector).count()) return;
      await page.waitForTimeout(250);
      await page.reload();
    }
    assert.fail(`${selector} never showed on ${page.url()}`);
  };
  await reloadUntil('[data-state="ready"]');
  // Its nodes passed acceptance first: the step says which.
  await page.getByText(/quick acceptance checks passed on \S+ \(check run \d+\)/).waitFor();
  // "site / node / GPU n"
  const nodeOf = async () => (await page.locator('[data-unit="held"] .text-xs').first().innerText()).split(' / ')[1];
  const failed = await nodeOf();

  await page.goto(`${berth.url}/admin/nodes/${failed}`);
  await page.getByLabel('Why retire it').fill('fan failure');
  await page.getByText('Retire', { exact: true }).click();
  await page.getByRole('button', { name: 'Yes, retire the node' }).click();
  await page.locator('[data-state="retired"]').waitFor();

  await page.goto(envUrl);
  await reloadUntil('[data-node-changes] li:has-text("moved there")');
  const change = await page.locator('[data-node-changes] li').first().innerText();
  assert.match(change, new RegExp(`^${failed} failed .*: fan failure\\. \\S+ replaced it, moved there`));
  assert.notEqual(await nodeOf(), failed);
});

test('a GPU of a node nobody holds is reset from its page, asked twice, without JavaScript', async () => {
  const node = 'fra1-a100-01';
  await page.goto(`${berth.url}/admin/nodes/${node}`);
  const gpu = page.locator('[data-gpu="2"]');
  assert.match(await gpu.innerText(), /GPU 2[\s\S]*Healthy/);
  await gpu.getByText('Reset', { exact: true }).click();
  await gpu.getByRole('button', { name: 'Yes, reset GPU 2' }).click();
  await page.waitForURL((url) => url.pathname === `/admin/nodes/${node}` && url.searchParams.get('reset') === '2');
  assert.match(await page.locator('[data-gpu-reset]').innerText(), /GPU 2 was reset/);
});
