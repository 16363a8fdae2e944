// Monthly statements in real Chromium: the demo's last month (Dana's jobs and notebooks)
// is closed as Berth starts; a platform admin finds it under Usage, reads its line items
// and total, and downloads it as CSV; the printed page leaves the navigation off.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { Berth, browser, signInAsAdmin, watchConsole, artifacts } from './harness.mjs';

let berth, chrome, page, consoleErrors;

before(async () => {
  berth = await Berth.start({ BERTH_DEMO: 'true' });
  chrome = await browser();
  page = await chrome.newPage({ viewport: { width: 1400, height: 1000 }, acceptDownloads: true });
  consoleErrors = watchConsole(page);
  await signInAsAdmin(page, berth, '/usage');
});

after(async () => {
  await chrome?.close();
  await berth?.kill();
});

const lastMonth = (() => {
  const d = new Date();
  const m = new Date(Date.UTC(d.getUTCFullYear(), d.getUTCMonth() - 1, 1));
  return m.toLocaleString('en-US', { month: 'long', year: 'numeric', timeZone: 'UTC' });
})();

test('last month is closed into a statement with line items that add up', async () => {
  await page.getByRole('link', { name: 'statements' }).click();
  await page.waitForURL(/\/usage\/statements$/);
  const row = page.getByRole('row', { name: new RegExp(`${lastMonth}.*Acme Research`) });
  await row.waitFor({ timeout: 15_000 });
  assert.match(await row.innerText(), /\$361\.60/);
  await row.getByRole('link', { name: `View the statement of Acme Research for ${lastMonth}` }).click();
  await page.getByRole('heading', { name: `Statement: Acme Research, ${lastMonth}` }).waitFor();

  const lines = page.locator('[data-statement-line]');
  assert.equal(await lines.count(), 3);
  const texts = await lines.allInnerTexts();
  assert.ok(texts.some((t) => /vision/.test(t) && /Training job/.test(t) && /96\.00/.test(t) && /\$307\.20/.test(t)), texts.join('\n'));
  assert.ok(texts.every((t) => /\$3\.20 per GPU-hour/.test(t)), texts.join('\n'));
  assert.match(await page.locator('[data-statement-total]').innerText(), /\$361\.60\s+\$0\.00\s+\$361\.60/);
});

test('the statement downloads as CSV and prints without the navigation', async () => {
  const [download] = await Promise.all([page.waitForEvent('download'), page.getByRole('link', { name: 'Download CSV' }).click()]);
  const path = join(artifacts, 'statement.csv');
  await download.saveAs(path);
  const { readFile } = await import('node:fs/promises');
  const csv = await readFile(path, 'utf8');
  assert.match(csv, /^tenant,month,project,person,offering,size,tier,unit_hours,gpu_hours,rate,amount,discount,total\n/);
  assert.match(csv.trim().split('\n').pop(), /total,361\.60,0\.00,361\.60$/);

  await page.emulateMedia({ media: 'print' });
  assert.equal(await page.locator('header').isVisible(), false, 'the navigation is left off on paper');
  await page.screenshot({ path: join(artifacts, 'statement-print.png'), fullPage: true });
  await page.emulateMedia({ media: 'screen' });
  assert.deepEqual(consoleErrors, []);
});
