// Every signed-in page hydrates without an error, however the server's rendering went.
//
// On the server a Suspense may build its children more than once; a page that made a
// resource in there served a different set of resources from one load to the next, and
// the browser then hydrated with a discarded build's value (an error now and then) and
// panicked (see `RequireUser`). So: the same page must serve the same resources on every
// load, and must hydrate cleanly in Chromium.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { adminSession } from './harness.mjs';

let berth, chrome, page, consoleErrors;

before(async () => {
  ({ berth, chrome, page, consoleErrors } = await adminSession('/environments'));
});

after(async () => {
  await chrome?.close();
  await berth?.kill();
});

const pages = [
  '/catalog',
  '/launch/notebook',
  '/environments',
  '/calendar',
  '/account',
  '/notifications',
  '/audit',
  '/admin/fleet',
  '/admin/nodes/fra1-h100-01',
  '/admin/fabric',
  '/admin/quotas',
  '/idle-policies',
  '/admin/prices',
  '/usage/statements',
  '/admin/tenants',
  '/volumes',
];

/** The hydration ids of the resources a server-rendered page carries, as Leptos lists them. */
const resourceIds = (html) => html.match(/__PENDING_RESOURCES=\[([^\]]*)\]/)?.[1];

for (const path of pages) {
  test(`${path} serves the same resources on every load and hydrates`, async () => {
    const seen = new Set();
    for (let load = 0; load < 20; load++) {
      const response = await page.request.get(`${berth.url}${path}`);
      assert.equal(response.status(), 200);
      seen.add(resourceIds(await response.text()));
    }
    assert.equal(seen.size, 1, `resource ids differ between loads: ${[...seen].join(' | ')}`);

    await page.goto(`${berth.url}${path}`);
    const hydrated = page.locator('body[data-hydrated]');
    await hydrated.waitFor({ timeout: 10_000 }).catch(() => {});
    assert.deepEqual(consoleErrors, []);
    assert.equal(await hydrated.count(), 1, 'hydrated');
  });
}
