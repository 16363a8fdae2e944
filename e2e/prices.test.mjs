// The rate card in real Chromium: a platform admin changes the H100's price from now, the
// catalog (signed out too) and the launch form's cost follow; a change for a coming day is
// listed and withdrawn (asked twice); bad input says what is wrong; a tenant's discount is
// listed with when it starts.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { Berth, browser, signInAsAdmin, watchConsole, artifacts, tomorrow } from './harness.mjs';

let berth, chrome, page, consoleErrors;

before(async () => {
  berth = await Berth.start({ BERTH_DEMO: 'true' });
  chrome = await browser();
  page = await chrome.newPage({ viewport: { width: 1400, height: 1000 } });
  consoleErrors = watchConsole(page);
  await signInAsAdmin(page, berth, '/admin/prices');
});

after(async () => {
  await chrome?.close();
  await berth?.kill();
});

const inForce = (line) => page.locator(`[data-price-line="${line}"] [data-in-force]`);

test('a platform admin changes a price from now, and the catalog and the launch form follow', async () => {
  assert.equal(await inForce('H100-80GB/gpu').innerText(), '$3.20 per GPU-hour');
  await page.getByLabel('Line').selectOption({ label: 'H100-80GB, whole GPU' });
  await page.getByLabel('Dollars per unit-hour').fill('4.00');
  await page.getByRole('button', { name: 'Save price' }).click();
  await page.getByRole('status').getByText('The price is saved.').waitFor();
  await page.waitForFunction(
    () => document.querySelector('[data-price-line="H100-80GB/gpu"] [data-in-force]')?.innerText === '$4.00 per GPU-hour',
  );

  // The catalog, signed out, shows the price in force: a node costs its eight GPUs.
  const visitor = await chrome.newPage();
  await visitor.goto(`${berth.url}/catalog`);
  const node = visitor.getByRole('row', { name: /1 node, 8 x H100 80GB, NVLink/ });
  assert.match(await node.innerText(), /\$32\.00\/h/);
  await visitor.close();

  // The launch form prices the booking by the card, with the duration typed before the page
  // is interactive (its WebAssembly held back until then: a slow network or machine).
  let typed;
  const held = new Promise((resolve) => { typed = resolve; });
  await page.route('**/pkg/*.wasm', async (route) => { await held; await route.continue(); });
  await page.goto(`${berth.url}/launch/training?size=h100-1`, { waitUntil: 'domcontentloaded' });
  await page.getByLabel('Duration (hours)').fill('3');
  typed();
  await page.locator('body[data-hydrated]').waitFor();
  await page.unroute('**/pkg/*.wasm');
  await page.locator('[data-cost]').getByText('$12.00 for 3 h (1 x H100 80GB at $4.00/h)').waitFor();
});

test('a change for a coming day is listed and can be withdrawn', async () => {
  await page.goto(`${berth.url}/admin/prices`);
  await page.getByLabel('Line').selectOption({ label: 'L40S, whole GPU' });
  await page.getByLabel('Dollars per unit-hour').fill('0.95');
  await page.getByLabel('From', { exact: true }).first().fill(tomorrow);
  await page.getByRole('button', { name: 'Save price' }).click();
  await page.getByRole('status').getByText('The price is saved.').waitFor();
  const line = page.locator('[data-price-line="L40S/gpu"]');
  await line.getByText(`$0.95 from ${tomorrow} 00:00 UTC`, { exact: true }).waitFor();
  assert.equal(await inForce('L40S/gpu').innerText(), '$1.10 per GPU-hour', 'the price in force is unchanged');

  await line.locator('summary', { hasText: 'Withdraw' }).click();
  await line.getByText('will not happen; the price in force stays.').waitFor();
  await line.getByRole('button', { name: 'Yes, withdraw' }).click();
  await page.getByRole('status').getByText('The change to come is withdrawn.').waitFor();
  await page.waitForFunction(() => !document.querySelector('[data-price-line="L40S/gpu"] [data-to-come]'));
});

test('bad input says what is wrong, and a tenant discount is listed', async () => {
  await page.getByLabel('Dollars per unit-hour').fill('four');
  await page.getByRole('button', { name: 'Save price' }).click();
  await page.getByText('"four" is not an hourly price like 3.20').waitFor();

  await page.getByLabel('Dollars per unit-hour').fill('3');
  await page.getByLabel('From', { exact: true }).first().fill('2020-01-01');
  await page.getByRole('button', { name: 'Save price' }).click();
  await page.getByText('2020-01-01 has begun').waitFor();

  await page.getByLabel('Whose').selectOption({ label: 'Tenant Acme Research' });
  await page.getByLabel('Percent off').fill('12.5');
  await page.getByLabel('From', { exact: true }).nth(1).fill(tomorrow);
  await page.getByRole('button', { name: 'Save discount' }).click();
  await page.getByRole('status').getByText('The discount is saved.').waitFor();
  const acme = page.locator('[data-discount="acme"]');
  await acme.getByText(`12.5% off from ${tomorrow} 00:00 UTC`, { exact: true }).waitFor();
  assert.match(await acme.innerText(), /^Tenant acme\s+0%/);

  await page.screenshot({ path: join(artifacts, 'prices.png'), fullPage: true });
  assert.deepEqual(consoleErrors, []);
});
