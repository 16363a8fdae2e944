// Every page passes axe-core's WCAG 2.1 A and AA rules, at a desktop and a phone width,
// signed out and signed in, with no violation allowed (contrast, names, labels, landmarks,
// links told apart from text).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { Berth, browser, enterOneTimeCode, CHOSEN_ADMIN_PASSWORD, watchConsole } from './harness.mjs';

const axeSource = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');
const WIDTHS = { desktop: { width: 1400, height: 1000 }, phone: { width: 390, height: 844 } };

let berth, chrome, page, consoleErrors, environment, tenantPage, statementPage;

before(async () => {
  // The demo's tenants, usage and statements give the pages something to show.
  berth = await Berth.start({ BERTH_DEMO: 'true' });
  chrome = await browser();
  page = await chrome.newPage({ viewport: WIDTHS.desktop });
  consoleErrors = watchConsole(page);
});

after(async () => {
  await chrome?.close();
  await berth?.kill();
});

/** axe-core's WCAG 2.1 A/AA violations on the page as it is now, one line each. */
async function violations(on = page) {
  // Injected as a script element: the page's CSP allows only its own scripts, so axe is
  // evaluated in the page's context through Playwright instead.
  await on.evaluate(axeSource);
  const result = await on.evaluate(() =>
    // eslint-disable-next-line no-undef
    axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] } }),
  );
  return result.violations.flatMap((v) =>
    v.nodes.slice(0, 5).map((n) => `${v.id} (${v.impact}): ${n.target.join(' ')}: ${n.failureSummary.replace(/\s+/g, ' ')}`),
  );
}

async function check(path, width) {
  await page.setViewportSize(WIDTHS[width]);
  await page.goto(`${berth.url}${path}`);
  await page.locator('body[data-hydrated]').waitFor({ timeout: 15_000 });
  const found = await violations();
  assert.deepEqual(found, [], `${path} at ${width} width`);
}

for (const width of Object.keys(WIDTHS)) {
  for (const path of ['/login', '/catalog']) {
    test(`signed out, ${path} at ${width} width has no WCAG 2.1 AA violation`, async () => {
      await check(path, width);
    });
  }
}

// The API reference is plain HTML made on the server (no script, nothing to hydrate).
for (const width of Object.keys(WIDTHS)) {
  test(`signed out, /api/docs at ${width} width has no WCAG 2.1 AA violation`, async () => {
    await page.setViewportSize(WIDTHS[width]);
    const response = await page.goto(`${berth.url}/api/docs`);
    assert.equal(response.status(), 200);
    assert.match(response.headers()['content-security-policy'], /script-src 'self'/);
    await page.getByRole('heading', { level: 1, name: 'Berth API reference' }).waitFor();
    assert.deepEqual(await violations(), [], `/api/docs at ${width} width`);
  });
}

test('the API reference shows every operation of the description, without JavaScript', async () => {
  const description = await (await fetch(`${berth.url}/api/v1/openapi.json`)).json();
  const context = await chrome.newContext({ javaScriptEnabled: false });
  const plain = await context.newPage();
  await plain.goto(`${berth.url}/api/docs`);
  const methods = ['get', 'post', 'put', 'patch', 'delete'];
  let operations = 0;
  for (const [path, item] of Object.entries(description.paths)) {
    for (const method of methods.filter((m) => item[m])) {
      operations += 1;
      const heading = plain.getByRole('heading', { level: 3, name: `${method.toUpperCase()} ${path}`, exact: true });
      assert.equal(await heading.count(), 1, `${method.toUpperCase()} ${path} has its section`);
    }
  }
  assert.ok(operations > 20, `${operations} operations`);
  await plain.getByRole('link', { name: '/api/v1/openapi.json' }).first().waitFor();
  await context.close();
});

/** axe on the page `on` shows now, once hydrated. */
async function checkHere(on, what) {
  await on.locator('body[data-hydrated]').waitFor({ timeout: 15_000 });
  assert.deepEqual(await violations(on), [], what);
}

test('signing in (choosing a password, setting up the authenticator), and pages to look at', async () => {
  await page.goto(`${berth.url}/login?next=/catalog`);
  await page.getByLabel('Email', { exact: true }).fill('admin@berth.local');
  await page.getByLabel('Password').fill(berth.adminPassword());
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.waitForURL((url) => url.pathname === '/login/password');
  await checkHere(page, '/login/password at desktop width');
  await page.getByLabel('New password', { exact: true }).fill(CHOSEN_ADMIN_PASSWORD);
  await page.getByLabel('New password again').fill(CHOSEN_ADMIN_PASSWORD);
  await page.getByRole('button', { name: 'Save and continue' }).click();
  berth.chosenPassword = CHOSEN_ADMIN_PASSWORD;
  await page.waitForURL((url) => url.pathname === '/login/code');
  await page.getByTestId('totp-secret').waitFor();
  await checkHere(page, '/login/code (setting up) at desktop width');
  await enterOneTimeCode(page, berth);
  await page.waitForURL((url) => url.pathname === '/catalog');

  // The code step of a later sign-in, at phone width.
  const phone = await chrome.newPage({ viewport: WIDTHS.phone });
  await phone.goto(`${berth.url}/login?next=/catalog`);
  await phone.getByLabel('Email', { exact: true }).fill('admin@berth.local');
  await phone.getByLabel('Password').fill(berth.adminPassword());
  await phone.getByRole('button', { name: 'Sign in' }).click();
  await phone.waitForURL((url) => url.pathname === '/login/code');
  await phone.getByTestId('totp-ready').waitFor();
  await checkHere(phone, '/login/code at phone width');
  await phone.close();

  // A tenant's page, its webhooks and a closed statement, by their links.
  await page.goto(`${berth.url}/admin/tenants`);
  tenantPage = await page.getByRole('link', { name: 'Acme Research', exact: true }).getAttribute('href');
  await page.goto(`${berth.url}/usage/statements`);
  statementPage = await page.locator('a[href^="/usage/statements/"]').first().getAttribute('href');
  assert.match(tenantPage, /^\/tenants\/\d+$/);
  assert.match(statementPage, /^\/usage\/statements\/\d+$/);
  await page.goto(`${berth.url}/launch/notebook`);
  await page.getByLabel('Name').fill('a11y-notebook');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.waitForURL(/\/environments\/[^/]+$/);
  environment = new URL(page.url()).pathname;
});

const signedIn = [
  '/catalog',
  '/launch/notebook',
  '/launch/training',
  '/environments',
  '/calendar',
  '/usage',
  '/volumes',
  '/images',
  '/notifications',
  '/account',
  '/audit',
  '/admin/fleet',
  '/admin/nodes/fra1-h100-01',
  '/admin/fabric',
  '/admin/quotas',
  '/idle-policies',
  '/admin/prices',
  '/usage/statements',
  '/admin/tenants',
  '/prices',
  '/admin/images',
  '/launch/inference',
  '/launch/cluster',
];
const found = {
  'the environment page': () => environment,
  'a tenant page': () => tenantPage,
  "a tenant's webhooks": () => `${tenantPage}/webhooks`,
  'a statement': () => statementPage,
};
for (const width of Object.keys(WIDTHS)) {
  for (const path of [...signedIn, ...Object.keys(found)]) {
    test(`signed in, ${path} at ${width} width has no WCAG 2.1 AA violation`, async () => {
      await check(found[path] ? found[path]() : path, width);
    });
  }
}

test('the first Tab stop skips the navigation to the page', async () => {
  await page.setViewportSize(WIDTHS.desktop);
  await page.goto(`${berth.url}/catalog`);
  await page.locator('body[data-hydrated]').waitFor();
  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement.textContent.trim()), 'Skip to content');
  await page.keyboard.press('Enter');
  assert.equal(await page.evaluate(() => document.activeElement.id), 'main');
});

test('a page change in the browser is announced by its title', async () => {
  await page.goto(`${berth.url}/catalog`);
  await page.locator('body[data-hydrated]').waitFor();
  const announcer = page.getByTestId('route-announcer');
  assert.equal((await announcer.textContent()).trim(), '', 'a full page load is announced by the browser');
  await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Availability' }).first().click();
  await page.waitForURL((url) => url.pathname === '/calendar');
  await page.waitForFunction(() => document.querySelector('[data-testid="route-announcer"]').textContent.includes('Availability'));
});

test('no errors or warnings in the browser console', () => {
  assert.deepEqual(consoleErrors, []);
});
