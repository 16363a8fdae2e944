// Usage, cost and budgets in real Chromium: a tenant admin (signed in through the tenant's
// identity provider) gives project "vision" a monthly budget; a member of it runs a job,
// and a booking that would take the project past its budget is refused saying what it costs
// and what is left; the usage page shows the project's cost and the budget, and its CSV
// downloads.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Berth, browser, signInAsAdmin, watchConsole, artifacts } from './harness.mjs';
import { startOidcProvider, signInAtProvider } from './oidc.mjs';

let berth, chrome, idp;

const accounts = {
  'ada@acme.example': { email: 'ada@acme.example', name: 'Ada Acme', groups: ['acme-admins'] },
  'mia@acme.example': { email: 'mia@acme.example', name: 'Mia Acme', groups: ['acme-ml'] },
};

before(async () => {
  berth = await Berth.start({ BERTH_DEMO: 'true' });
  const callback = `${berth.url}/auth/oidc/callback`;
  idp = await startOidcProvider({
    clients: [{ client_id: 'acme-berth', client_secret: 'acme-secret', redirect_uris: [callback] }],
    accounts,
  });
  chrome = await browser();
  // The demo connects Acme to the laptop's provider; the platform admin points it at this one.
  const admin = await chrome.newPage({ viewport: { width: 1400, height: 1000 } });
  await signInAsAdmin(admin, berth, '/admin/tenants');
  await admin.getByRole('link', { name: 'Acme Research', exact: true }).click();
  await admin.waitForURL(/\/tenants\/\d+$/);
  await admin.getByLabel('Issuer URL').fill(idp.issuer);
  await admin.getByRole('button', { name: 'Save connection' }).click();
  await admin.getByLabel('Client secret (stored; leave empty to keep it)').waitFor();
  await admin.close();
});

after(async () => {
  await chrome?.close();
  await idp?.stop();
  await berth?.kill();
});

async function ssoSignIn(email) {
  const context = await chrome.newContext({ viewport: { width: 1400, height: 1000 }, acceptDownloads: true });
  const page = await context.newPage();
  const consoleErrors = watchConsole(page);
  await page.goto(`${berth.url}/login?next=/environments`);
  await page.getByLabel('Work email or organization').fill(email);
  await page.getByRole('button', { name: 'Continue with single sign-on' }).click();
  await signInAtProvider(page, email);
  await page.waitForURL((url) => url.pathname === '/environments');
  return { context, page, consoleErrors };
}

/** Books a training job of 4 x H100 ($12.80 an hour) in project vision from the launch form. */
async function bookInVision(page, name, hours) {
  await page.goto(`${berth.url}/launch/training?size=h100-4`);
  // The hints follow the project picked only once hydrated (on a busy machine that comes
  // later), and the refused form is read again after its refusal.
  await page.locator('body[data-hydrated]').waitFor();
  await page.getByLabel('Name').fill(name);
  await page.getByLabel('Container image').fill('nvcr.io/nvidia/pytorch:24.05-py3');
  await page.getByLabel('Command').fill('python train.py; sleep infinity');
  await page.getByLabel('Duration (hours)').fill(String(hours));
  await page.getByLabel('Project').selectOption({ label: 'vision' });
  await page.getByRole('button', { name: 'Launch' }).click();
}

test('a member\'s booking past the project budget is refused; the usage page shows the cost', async () => {
  const mia = await ssoSignIn('mia@acme.example');
  const ada = await ssoSignIn('ada@acme.example');

  // Ada puts Mia in project vision and gives it $20 a month.
  await ada.page.getByRole('link', { name: 'Team', exact: true }).click();
  const vision = ada.page.locator('li[data-project="vision"]');
  await vision.getByLabel('Member email').fill('mia@acme.example');
  await vision.getByRole('button', { name: 'Add' }).click();
  await vision.getByText('mia@acme.example').waitFor();
  await ada.page.getByRole('link', { name: 'Usage', exact: true }).click();
  await ada.page.waitForURL((url) => url.pathname === '/usage');
  assert.deepEqual(await ada.page.locator('#b-level option').allTextContents(), ['Project (by name)']);
  await ada.page.getByLabel('Which').fill('vision');
  await ada.page.getByLabel('Dollars a month').fill('20');
  await ada.page.getByRole('button', { name: 'Save budget' }).click();
  const budget = ada.page.locator('tr[data-budget="Project acme/vision"]');
  await budget.getByText('$20.00').waitFor();

  // Mia runs a job for a moment ($12.80 for the hour fits), then stops it.
  await bookInVision(mia.page, 'short-run', 1);
  await mia.page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  await mia.page.locator('[data-state="ready"]').waitFor({ timeout: 30_000 });
  await mia.page.waitForTimeout(3_000);
  await mia.page.locator('summary', { hasText: 'Stop and release' }).click();
  await mia.page.getByRole('button', { name: 'Yes, stop and release' }).click();
  await mia.page.locator('[data-state="released"]').waitFor({ timeout: 30_000 });

  // Two hours ($25.60) would take vision past its $20: refused, saying what is left.
  await bookInVision(mia.page, 'long-run', 2);
  const refusal = mia.page.getByRole('alert').filter({ hasText: 'budget:' });
  await refusal.waitFor();
  assert.match(
    await refusal.innerText(),
    /Budget: this booking costs \$25\.60 for 2 h(, \$[\d.]+ of it in \w+)?; project vision has \$19\.\d\d of \$20\.00 left in \w+/,
  );
  assert.equal(new URL(mia.page.url()).pathname, '/launch/training', 'nothing was booked');
  // The size's hint says so before any launch: for vision's budget, no month has room.
  const hint = mia.page.locator('[data-hint="h100-4"]');
  await hint.filter({ hasText: 'over budget' }).waitFor();
  assert.match(
    await hint.innerText(),
    /^over budget now: this booking costs \$25\.60 for 2 h.*; no start within the booking horizon fits the budget$/,
  );

  // Mia's own usage: her line only.
  await mia.page.goto(`${berth.url}/usage?by=person`);
  await mia.page.locator('tr[data-usage-line="mia@acme.example"]').waitFor();
  assert.equal(await mia.page.locator('tr[data-usage-line]').count(), 1);

  // Ada sees the project's cost and the budget's progress, and downloads the CSV.
  await ada.page.goto(`${berth.url}/usage?by=project`);
  const line = ada.page.locator('tr[data-usage-line="vision"]');
  await line.waitFor();
  assert.match(await line.innerText(), /\$0\.\d\d/);
  assert.doesNotMatch(await line.innerText(), /\$0\.00/);
  assert.match(await budget.innerText(), /\$20\.00/);
  await ada.page.getByRole('img', { name: /^Cost per day in / }).waitFor();
  await ada.page.screenshot({ path: join(artifacts, 'usage.png'), fullPage: true });
  const [download] = await Promise.all([
    ada.page.waitForEvent('download'),
    ada.page.getByRole('link', { name: 'Download CSV' }).click(),
  ]);
  const csv = readFileSync(await download.path(), 'utf8');
  const rows = csv.trim().split('\r\n');
  assert.equal(rows[0], 'month,group_by,key,name,gpu_hours,environments,amount_usd');
  assert.ok(rows.some((r) => /^\d{4}-\d{2},project,vision,vision,[\d.]+,1,0\.\d\d$/.test(r)), csv);
  assert.match(rows.at(-1), /^\d{4}-\d{2},project,total,,[\d.]+,,\d+\.\d\d$/);

  // Week by week: the chart per week, the weeks' table, and the CSV by week.
  await ada.page.getByRole('link', { name: 'Per week' }).click();
  await ada.page.getByRole('img', { name: /^Cost per week in / }).waitFor();
  assert.equal(await ada.page.getByRole('link', { name: 'Per week' }).getAttribute('aria-current'), 'page');
  const weeks = ada.page.getByRole('region', { name: 'Week by week' }).locator('tr[data-week]');
  assert.ok((await weeks.count()) >= 4, 'a month has four to six weeks');
  const thisWeek = weeks.filter({ hasText: /\$0\.\d\d/ }).filter({ hasNotText: '$0.00' });
  assert.equal(await thisWeek.count(), 1, 'the job ran in one week');
  assert.match(await thisWeek.innerText(), /^Week \d{1,2}: \w{3} \d{1,2} \w{3}/);
  const [byWeek] = await Promise.all([
    ada.page.waitForEvent('download'),
    ada.page.getByRole('link', { name: 'CSV by week' }).click(),
  ]);
  const weekRows = readFileSync(await byWeek.path(), 'utf8').trim().split('\r\n');
  assert.equal(weekRows[0], 'month,group_by,from,to,key,name,gpu_hours,amount_usd');
  assert.equal(weekRows.filter((r) => /,project,[\d-]+,[\d-]+,vision,vision,[\d.]+,0\.\d\d$/.test(r)).length, 1, weekRows.join('\n'));
  assert.equal(weekRows.filter((r) => /,total,,/.test(r)).length, await weeks.count(), 'a total row per week');

  assert.deepEqual(mia.consoleErrors, []);
  assert.deepEqual(ada.consoleErrors, []);
  await mia.context.close();
  await ada.context.close();
});
