// Idle reclamation in real Chromium: a platform admin sets the notebooks' idle policy, a
// notebook whose simulated GPUs sit idle shows its GPU use, gets the warning on its page
// and in the bell, "Keep it" starts the clock again, and without it the notebook is
// stopped after the grace and its slice is released.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { Berth, browser, signInAsAdmin, watchConsole, artifacts } from './harness.mjs';

let berth, chrome, page, consoleErrors, environmentId;

before(async () => {
  // Readings every second, so the policy's seconds are seconds here.
  berth = await Berth.start({ BERTH_DEMO: 'true', BERTH_TELEMETRY_INTERVAL: '1s' });
  chrome = await browser();
  page = await chrome.newPage({ viewport: { width: 1400, height: 1000 } });
  consoleErrors = watchConsole(page);
  await signInAsAdmin(page, berth, '/idle-policies');
});

after(async () => {
  await chrome?.close();
  await berth?.kill();
});

test('a platform admin sets the notebooks\' idle policy', async () => {
  // The demo's policy: an hour idle, 15 minutes' grace.
  const demo = page.locator('[data-idle-policy="Platform/notebook"]');
  assert.match(await demo.innerText(), /1h/);
  await page.getByLabel('Whose').selectOption({ label: 'Platform (every tenant)' });
  await page.getByLabel('Offering').selectOption({ label: 'Jupyter notebook' });
  await page.getByLabel('GPUs under (%)').fill('5');
  await page.getByLabel('Idle for').fill('12s');
  await page.getByLabel('Grace after the warning').fill('15s');
  await page.getByLabel('Keeps per booking').fill('1');
  await page.getByRole('button', { name: 'Save policy' }).click();
  await page.getByRole('status').getByText('The idle policy is saved.').waitFor();
  await page.waitForFunction(() => /12s/.test(document.querySelector('[data-idle-policy="Platform/notebook"]')?.innerText ?? ''));

  // A looser tenant policy is refused with why.
  await page.getByLabel('Whose').selectOption({ label: 'Tenant acme' });
  await page.getByLabel('Idle for').fill('2h');
  await page.getByRole('button', { name: 'Save policy' }).click();
  await page.getByText("a tenant's idle policy may only be stricter than the platform's").waitFor();
});

test('an idle notebook shows its GPU use and is warned on its page and in the bell', async () => {
  await page.goto(`${berth.url}/launch/notebook?size=h100-1g.10gb`);
  await page.getByLabel('Name').fill('idle-lab');
  await page.getByLabel('Duration (hours)').fill('2');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  environmentId = page.url().split('/').pop();
  await page.locator('[data-state="ready"]').waitFor({ timeout: 30_000 });

  // Its GPU readings arrive and draw, with the figures in words for screen readers.
  await page.waitForFunction(() => /% busy/.test(document.querySelector('[data-gpu-latest]')?.innerText ?? ''), null, {
    timeout: 20_000,
  });
  const chart = page.getByRole('img', { name: /^Utilization, last hour: average \d+%, peak \d+%$/ });
  await chart.waitFor();

  const warning = page.locator('[data-idle="warned"]');
  await warning.waitFor({ timeout: 40_000 });
  assert.match(await warning.innerText(), /idle since .* will be stopped at .* unless you keep it/i);
  await page.waitForFunction(() => Number(document.querySelector('[data-testid="unread"]')?.textContent.trim()) >= 2, null, {
    timeout: 15_000,
  });
  const bell = page.getByRole('link', { name: /^Notifications, / }).first();
  assert.match(await bell.getAttribute('title'), /idle-lab is idle and will be stopped/);
  await page.screenshot({ path: join(artifacts, 'idle-warning.png'), fullPage: true });
  // The operator's /metrics has its GPU's series, labelled with whose it is.
  assert.match(await berth.metrics(), new RegExp(`berth_gpu_utilization_percent\\{[^}]*environment="${environmentId}"[^}]*\\} \\d`));
});

test('"Keep it" withdraws the warning; the policy allows it once', async () => {
  await page.getByRole('button', { name: 'Keep it' }).click();
  const watched = page.locator('[data-idle="watched"]');
  await watched.waitFor({ timeout: 10_000 });
  assert.match(await watched.innerText(), /1 of 1 keeps used/);
  // Idle again: warned again, now without a way to keep it.
  await page.locator('[data-idle="warned"]').waitFor({ timeout: 40_000 });
  assert.equal(await page.getByRole('button', { name: 'Keep it' }).count(), 0);
});

test('without a keep it is stopped after the grace and its slice is released', async () => {
  await page.locator('[data-state="released"]').waitFor({ timeout: 60_000 });
  const stopped = page.locator('[data-idle="stopped"]');
  await stopped.waitFor({ timeout: 10_000 });
  assert.match(await stopped.innerText(), /Stopped for idleness at/);
  // Its slice is released: the calendar and the launch form count it free again.
  const units = page.locator('[data-unit]');
  assert.ok((await units.count()) > 0);
  assert.equal(await page.locator('[data-unit="released"]').count(), await units.count(), 'every unit released');
  await page.goto(`${berth.url}/notifications`);
  await page.getByRole('link', { name: 'idle-lab was stopped for idleness' }).waitFor();
  await page.goto(`${berth.url}/audit`);
  await page.getByText('environment.idle_stop').first().waitFor();
  // Platform staff's own environment: no tenant.
  assert.match(await berth.metrics(), /berth_idle_stops_total\{tenant=""\} 1/);
  // The fleet chart shows how busy the GPUs still held (the demo's) are, beside what is
  // booked on them.
  await page.goto(`${berth.url}/admin/fleet`);
  const busy = page.locator('[data-gpu-busy]').first();
  await busy.waitFor();
  assert.match(await busy.innerText(), /^\d{1,3}% busy$/);
  assert.deepEqual(consoleErrors, [], 'no errors in the browser console');
});
