// The top bar at phone and desktop widths: one line on a wide screen, a menu on a phone
// that reaches every link and "Sign out", and no page wider than the phone.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { adminSession, artifacts } from './harness.mjs';

let berth, chrome, page, consoleErrors;

before(async () => {
  ({ berth, chrome, page, consoleErrors } = await adminSession('/calendar'));
});

after(async () => {
  await chrome?.close();
  await berth?.kill();
});

test('on a wide screen the administrator\'s bar is one line', async () => {
  for (const width of [1280, 1400]) {
    await page.setViewportSize({ width, height: 900 });
    const bar = await page.locator('header nav').boundingBox();
    assert.ok(bar.height < 64, `the bar wraps at ${width} px: ${bar.height} px high`);
    await page.getByRole('button', { name: 'Sign out' }).waitFor();
    assert.equal(await page.locator('details[data-menu]').isVisible(), false);
  }
});

test('on a phone a menu holds every link and signing out, and nothing runs off the page', async () => {
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(`${berth.url}/catalog`);
  assert.equal(await page.getByRole('button', { name: 'Sign out' }).isVisible(), false, 'behind the menu');
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth);
  assert.ok(overflow <= 390, `the page is ${overflow} px wide on a 390 px screen`);
  await page.locator('summary', { hasText: 'Menu' }).click();
  const signOut = page.getByRole('button', { name: 'Sign out' });
  await signOut.waitFor();
  const box = await signOut.boundingBox();
  assert.ok(box.x >= 0 && box.x + box.width <= 390, `Sign out at ${box.x}..${box.x + box.width}`);
  await page.screenshot({ path: join(artifacts, 'menu-phone.png') });
  await page.locator('details[data-menu]').getByRole('link', { name: 'Fleet' }).click();
  await page.waitForURL(/\/admin\/fleet/);
  await page.getByRole('heading', { name: 'Fleet' }).first().waitFor();
  // Closed once the new page is in (however the link went: by the router or a page load).
  await page.waitForFunction(() => !document.querySelector('details[data-menu]').open, null, { timeout: 5000 });
  assert.deepEqual(consoleErrors, []);
});
