// A platform admin's fleet view in real Chromium: the Gantt chart shows a booking on its
// GPUs, maintenance on that node lists the booking for rebooking, and ending the
// maintenance takes it off the chart.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { adminSession, artifacts, tomorrow } from './harness.mjs';

let berth, chrome, page, consoleErrors;

before(async () => {
  ({ berth, chrome, page, consoleErrors } = await adminSession('/catalog'));
});

after(async () => {
  await chrome?.close();
  await berth?.kill();
});

test('the fleet chart shows a booking on the GPUs it holds', async () => {
  await page.goto(`${berth.url}/launch/notebook?size=h100-3g.40gb&start=${tomorrow}T08:00&hours=6`);
  await page.getByLabel('Name').fill('slice-tomorrow');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  await page.locator('[data-state="scheduled"]').waitFor();

  await page.getByRole('link', { name: 'Fleet', exact: true }).click();
  await page.waitForURL(/\/admin\/fleet$/);
  const bar = page.locator('a[data-bar="slice"]', { hasText: 'slice-tomorrow' });
  await bar.waitFor();
  assert.match(await bar.textContent(), /slice-tomorrow · 3g\.40gb/);
  // config/fleet.toml: 4 H100 and 2 A100 nodes of 8 GPUs, 2 L40S nodes of 4, and one L40S
  // node of 4 time-sliced for development.
  assert.equal(await page.locator('[data-node]').count(), 9);
  // The H100 nodes are rail-optimized InfiniBand in scalable units of two nodes.
  assert.equal(await page.locator('[data-node="fra1-h100-03"] [data-fabric]').textContent(), 'IB fra1-h100-su02');
  await page.getByText('GPU 3 · MIG · rail 3').first().waitFor();
});

test('the chart is filtered by site and name, over a month, and keeps the filter', async () => {
  const filter = page.getByRole('form', { name: 'Filter nodes' });
  await filter.getByLabel('Site').selectOption('ams-1');
  await filter.getByLabel('Range').selectOption({ label: 'Month' });
  await filter.getByRole('button', { name: 'Show' }).click();
  await page.waitForURL(/site=ams-1/);
  await page.locator('[data-nodes-shown]').getByText('Nodes 1-3 of 3').waitFor();
  assert.equal(await page.locator('[data-node]').count(), 3);
  // A month is thirty day columns, and moving in time keeps the site.
  await page.getByRole('link', { name: 'Later →' }).click();
  await page.waitForURL(/days=30&site=ams-1/);
  assert.equal(await page.locator('[data-node]').count(), 3);
  await filter.getByLabel('Site').selectOption('');
  await filter.getByLabel('Node name contains').fill('h100-0');
  await filter.getByRole('button', { name: 'Show' }).click();
  await page.locator('[data-nodes-shown]').getByText('Nodes 1-4 of 4').waitFor();
  // The agents section lists the same nodes as the chart.
  assert.equal(await page.locator('[data-agent-node]').count(), 4);
  await filter.getByLabel('Node name contains').fill('no-such-node');
  await filter.getByRole('button', { name: 'Show' }).click();
  await page.locator('[data-nodes-shown]').getByText('No node matches (of 9 in service)').waitFor();
  await page.goto(`${berth.url}/admin/fleet`);
});

test('maintenance on that node lists the booking to rebook, and can be ended', async () => {
  // The node row is followed by its GPU rows; find the node whose GPU rows hold the bar.
  const nodeName = await page.evaluate(() => {
    const bar = document.querySelector('a[data-bar="slice"]');
    let row = bar.closest('.flex');
    while (row && !row.hasAttribute('data-node')) row = row.previousElementSibling;
    return row?.getAttribute('data-node');
  });
  assert.ok(nodeName, 'the slice is drawn under a node');
  const form = page.getByRole('region', { name: 'Schedule maintenance' });
  // A node that does not exist: refused, and the node field says why (the GPU health form's
  // node field, another form, does not).
  await form.getByLabel('Node', { exact: true }).fill('fra1-nowhere-01');
  await form.getByLabel('Reason').fill('firmware update');
  await form.getByLabel('Start (UTC, empty for now)').fill(`${tomorrow}T06:00`);
  await form.getByLabel('End (UTC)').fill(`${tomorrow}T12:00`);
  await form.getByRole('button', { name: 'Schedule maintenance' }).click();
  await form.getByRole('alert').getByText('there is no node called "fra1-nowhere-01"').waitFor();
  assert.equal(await form.getByLabel('Node', { exact: true }).getAttribute('aria-invalid'), 'true');
  assert.match(await page.locator('#m-node-error').innerText(), /no node called/);
  const healthForm = page.getByRole('region', { name: 'GPU health' });
  assert.equal(await healthForm.getByLabel('Node', { exact: true }).getAttribute('aria-invalid'), null);
  await form.getByLabel('Node', { exact: true }).fill(nodeName);
  await form.getByRole('button', { name: 'Schedule maintenance' }).click();
  const windows = page.getByRole('region', { name: 'Maintenance in this range' });
  await windows.getByText(`${nodeName} · firmware update`).waitFor();
  await windows.getByRole('link', { name: 'slice-tomorrow' }).waitFor();
  await page.locator(`[data-node="${nodeName}"] [data-bar="maintenance"]`).waitFor();
  await page.screenshot({ path: join(artifacts, 'fleet.png'), fullPage: true });

  await windows.getByRole('button', { name: 'End now' }).click();
  await windows.getByText('None.').waitFor();
});

test('a GPU marked failed shows on the chart and can be put back in service', async () => {
  const health = page.getByRole('region', { name: 'GPU health' });
  await health.getByLabel('Node', { exact: true }).fill('fra1-a100-02');
  await health.getByLabel('GPU index').fill('3');
  await health.getByLabel('Health').selectOption('failed');
  await health.getByLabel('Note').fill('XID 79');
  await health.getByRole('button', { name: 'Record health' }).click();
  await page.locator('[data-gpu-health="failed"]').getByText('GPU 3 · MIG').waitFor();
  assert.equal(await page.locator('[data-gpu-health="failed"]').getAttribute('title'), 'XID 79');
  await health.getByLabel('Node', { exact: true }).fill('fra1-a100-02');
  await health.getByLabel('GPU index').fill('15');
  await health.getByRole('button', { name: 'Record health' }).click();
  await health.getByRole('alert').getByText('node fra1-a100-02 has no GPU 15').waitFor();
  await health.getByLabel('GPU index').fill('3');
  await health.getByLabel('Health').selectOption('healthy');
  await health.getByRole('button', { name: 'Record health' }).click();
  await page.locator('[data-gpu-health="failed"]').waitFor({ state: 'detached' });
});

test('a default quota set on the quotas page limits the next launch, with its reason', async () => {
  await page.getByRole('link', { name: 'Quotas', exact: true }).click();
  await page.waitForURL((url) => url.pathname === '/admin/quotas');
  await page.getByText('No quotas: nobody is limited.').waitFor();
  await page.getByLabel('GPUs at once, per model').fill('lots');
  await page.getByRole('button', { name: 'Save quota' }).click();
  await page.getByRole('alert').getByText('GPUs at once must be a number of GPU-equivalents, 0 or more, or empty for no limit').waitFor();
  await page.getByLabel('GPUs at once, per model').fill('0.5');
  await page.getByRole('button', { name: 'Save quota' }).click();
  await page.getByRole('rowheader', { name: 'Everyone (default per user)' }).waitFor();

  await page.goto(`${berth.url}/launch/training?size=h100-1`);
  await page.getByLabel('Name').fill('over-quota');
  await page.getByLabel('Container image').fill('nvcr.io/nvidia/pytorch:24.05-py3');
  await page.getByLabel('Command').fill('python train.py');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.getByRole('alert').getByText('quota: your limit is 0.5 H100-80GB GPU-equivalents at once').waitFor();
});

test('a quota that allows spot lets the same launch burst beyond it, marked as spot', async () => {
  await page.goto(`${berth.url}/admin/quotas`);
  await page.getByLabel('GPUs at once, per model').fill('0.5');
  await page.getByLabel(/May book beyond the GPU limits as spot/).check();
  await page.getByRole('button', { name: 'Save quota' }).click();
  await page.locator('tr[data-quota="everyone"]').getByText('yes').waitFor();

  await page.goto(`${berth.url}/launch/training?size=h100-1`);
  await page.getByLabel('Name').fill('burst');
  await page.getByLabel('Container image').fill('nvcr.io/nvidia/pytorch:24.05-py3');
  await page.getByLabel('Command').fill('python train.py');
  await page.getByLabel('Spot (preemptible)').check();
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  await page.locator('[data-tier="spot"]').waitFor();
  assert.deepEqual(consoleErrors, []);
});

test('a development notebook gets a quarter of a time-sliced GPU, marked as shared', async () => {
  await page.goto(`${berth.url}/catalog`);
  await page.getByText('development tier: time-sliced, shared with others, no isolation guarantees').first().waitFor();
  await page.goto(`${berth.url}/launch/notebook?size=l40s-dev`);
  await page.getByLabel('Name').fill('dev-share');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  await page.getByText(/share 1 of 4 of a time-sliced GPU/).waitFor();
  await page.goto(`${berth.url}/admin/fleet`);
  await page.locator('a[data-bar="slice"]', { hasText: 'dev-share · shared 1/4' }).waitFor();
  assert.deepEqual(consoleErrors, []);
});
