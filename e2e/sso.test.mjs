// Single sign-on in real Chromium against a real OpenID provider (oidc-provider on
// loopback): a platform admin connects two tenants to their provider in the UI; people of
// each tenant sign in with their work email (the sign-in page names no tenant: Berth finds
// the provider by the email's domain, or by the organization's name), land in their tenant
// with the role their groups give, sign out, and their old session is gone. Someone without a role is refused
// with a clear message and no session.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { Berth, browser, signInAsAdmin, watchConsole, artifacts } from './harness.mjs';
import { startOidcProvider, signInAtProvider } from './oidc.mjs';

let berth, chrome, idp, admin;

const accounts = {
  'ada@acme.example': { email: 'ada@acme.example', name: 'Ada Acme', groups: ['acme-admins'] },
  'bob@globex.example': { email: 'bob@globex.example', name: 'Bob Globex', groups: ['globex-ml'] },
  'vic@globex.example': { email: 'vic@globex.example', name: 'Vic Viewer', groups: ['globex-readers'] },
  'eve@acme.example': { email: 'eve@acme.example', name: 'Eve', groups: ['unmapped'] },
  'carol@acme.example': { email: 'carol@acme.example', name: 'Carol Acme', groups: [] },
};

before(async () => {
  berth = await Berth.start({ BERTH_DEMO: 'true' });
  const callback = `${berth.url}/auth/oidc/callback`;
  idp = await startOidcProvider({
    clients: [
      { client_id: 'acme-berth', client_secret: 'acme-secret', redirect_uris: [callback] },
      { client_id: 'globex-berth', client_secret: 'globex-secret', redirect_uris: [callback] },
    ],
    accounts,
  });
  chrome = await browser();
  admin = await chrome.newPage({ viewport: { width: 1400, height: 1000 } });
  await signInAsAdmin(admin, berth, '/admin/tenants');
});

after(async () => {
  await chrome?.close();
  await idp?.stop();
  await berth?.kill();
});

/** Opens a tenant's page from the tenants list and saves its SSO connection. */
async function connect(tenantName, { label, clientId, secret, mappings, domains }) {
  await admin.goto(`${berth.url}/admin/tenants`);
  await admin.getByRole('link', { name: tenantName, exact: true }).click();
  await admin.waitForURL(/\/tenants\/\d+$/);
  assert.equal(await admin.getByTestId('redirect-uri').textContent(), `${berth.url}/auth/oidc/callback`);
  await admin.getByLabel('Button label').fill(label);
  await admin.getByLabel('Issuer URL').fill(idp.issuer);
  await admin.getByLabel('Client id').fill(clientId);
  await admin.getByLabel('Client secret').fill(secret);
  await admin.getByLabel('Allowed email domains').fill(domains);
  await admin.getByLabel('Group to role').fill(mappings);
  await admin.getByRole('button', { name: 'Save connection' }).click();
  await admin.getByLabel('Client secret (stored; leave empty to keep it)').waitFor();
}

/** A fresh browser (no provider session) that types `hint` (a work email or an
 * organization) on Berth's sign-in page, then signs in at the provider as `login`. */
async function ssoSignIn(hint, login = hint) {
  const context = await chrome.newContext({ viewport: { width: 1400, height: 1000 } });
  const page = await context.newPage();
  const consoleErrors = watchConsole(page);
  await page.goto(`${berth.url}/login?next=/environments`);
  await page.getByLabel('Work email or organization').fill(hint);
  await page.getByRole('button', { name: 'Continue with single sign-on' }).click();
  await signInAtProvider(page, login);
  return { context, page, consoleErrors };
}

test('a platform admin connects two tenants to their identity provider', async () => {
  await connect('Acme Research', {
    label: 'Acme SSO', clientId: 'acme-berth', secret: 'acme-secret',
    mappings: 'acme-admins = tenant_admin\nacme-ml = member', domains: 'acme.example',
  });
  await connect('Globex AI', {
    label: 'Globex SSO', clientId: 'globex-berth', secret: 'globex-secret',
    mappings: 'globex-ml = member\nglobex-readers = viewer', domains: 'globex.example',
  });
  // The Team page says how its people sign in; the sign-in page names no tenant.
  assert.equal(await admin.getByTestId('sign-in-link').textContent(), `${berth.url}/auth/oidc/globex/start`);
  const visitor = await chrome.newContext();
  const login = await visitor.newPage();
  await login.goto(`${berth.url}/login`);
  await login.getByRole('button', { name: 'Continue with single sign-on' }).waitFor();
  const text = await login.locator('main').textContent();
  for (const name of ['Acme', 'Globex']) assert.ok(!text.includes(name), `the sign-in page names ${name}`);
  // Someone whose email no tenant allows is told so, on the sign-in page.
  await login.getByLabel('Work email or organization').fill('mallory@elsewhere.example');
  await login.getByRole('button', { name: 'Continue with single sign-on' }).click();
  await login.getByRole('alert').filter({ hasText: 'No organization here signs in with that email or name' }).waitFor();
  await visitor.close();
});

test('people of two tenants land in their tenant with their role, then sign out for good', async () => {
  const cases = [
    { hint: 'ada@acme.example', login: 'ada@acme.example', role: 'Tenant admin', tenant: 'Acme Research' },
    { hint: 'bob@globex.example', login: 'bob@globex.example', role: 'Member', tenant: 'Globex AI' },
    // By the organization's name, as a person whose email is elsewhere would.
    { hint: 'globex', login: 'vic@globex.example', role: 'Viewer', tenant: 'Globex AI' },
  ];
  for (const c of cases) {
    const { context, page, consoleErrors } = await ssoSignIn(c.hint, c.login);
    await page.waitForURL((url) => url.pathname === '/environments');
    assert.equal(await page.getByTestId('role').textContent(), c.role, c.login);
    assert.equal(await page.getByTestId('tenant').textContent(), c.tenant, c.login);

    // The team page shows their own tenant; a tenant admin may manage it.
    await page.getByRole('link', { name: 'Team', exact: true }).click();
    await page.getByRole('heading', { name: c.tenant }).waitFor();
    const canInvite = await page.getByLabel('Invite by email').count();
    assert.equal(canInvite, c.role === 'Tenant admin' ? 1 : 0, `${c.login} invite form`);

    const cookies = await context.cookies(berth.url);
    const session = cookies.find((k) => k.name === 'berth_session');
    assert.ok(session, 'a session cookie');
    assert.equal(session.httpOnly, true);
    assert.equal(session.sameSite, 'Lax');

    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.getByRole('link', { name: 'Sign in' }).waitFor();
    // The old session id is worthless now: replaying it gets no one.
    const replay = await fetch(`${berth.url}/api/current_user`, {
      method: 'POST',
      headers: {
        cookie: `berth_session=${session.value}`,
        origin: berth.url,
        'content-type': 'application/x-www-form-urlencoded',
      },
      body: '',
    });
    assert.equal(await replay.text(), 'null', `${c.login}: the session must be gone after sign-out`);
    assert.deepEqual(consoleErrors, []);
    await context.close();
  }
});

test('a tenant admin invites someone by email; their first SSO sign-in links the invitation', async () => {
  const ada = await ssoSignIn('ada@acme.example');
  await ada.page.waitForURL((url) => url.pathname === '/environments');
  await ada.page.getByRole('link', { name: 'Team', exact: true }).click();
  await ada.page.getByLabel('Invite by email').fill('carol@acme.example');
  await ada.page.locator('#invite-role').selectOption('viewer');
  await ada.page.getByRole('button', { name: 'Invite' }).click();
  const row = ada.page.locator('tr[data-member="carol@acme.example"]');
  await row.waitFor();
  assert.match(await row.innerText(), /not yet/);
  await ada.context.close();

  // Carol's groups map to nothing; the invitation alone lets her in, as a viewer.
  const carol = await ssoSignIn('carol@acme.example');
  await carol.page.waitForURL((url) => url.pathname === '/environments');
  assert.equal(await carol.page.getByTestId('role').textContent(), 'Viewer');
  assert.equal(await carol.page.getByTestId('tenant').textContent(), 'Acme Research');
  await carol.context.close();
});

test('a tenant admin limits a project; a booking in it is refused with the project\'s reason', async () => {
  const ada = await ssoSignIn('ada@acme.example');
  await ada.page.waitForURL((url) => url.pathname === '/environments');
  await ada.page.getByRole('link', { name: 'Quotas', exact: true }).click();
  await ada.page.waitForURL((url) => url.pathname === '/admin/quotas');
  // The demo gives Acme a tenant quota (the platform's to set) and project "vision" one.
  await ada.page.getByRole('rowheader', { name: 'Tenant Acme Research' }).waitFor();
  assert.deepEqual(
    await ada.page.locator('#q-level option').allTextContents(),
    ['Project (by name)', 'Member (by email)'],
  );
  await ada.page.getByLabel('Who (empty for everyone)').fill('vision');
  await ada.page.getByLabel('GPUs at once, per model').fill('0.25');
  await ada.page.getByRole('button', { name: 'Save quota' }).click();
  await ada.page.locator('tr[data-quota^="project:"]').getByText('0.25').waitFor();

  await ada.page.goto(`${berth.url}/launch/notebook?size=h100-3g.40gb`);
  // The form is used again after the refusal: hydrated, it keeps what was typed (a plain
  // form post, on a machine too busy to hydrate in time, comes back to a fresh form).
  await ada.page.locator('body[data-hydrated]').waitFor();
  await ada.page.getByLabel('Name').fill('in-vision');
  await ada.page.getByLabel('Project').selectOption({ label: 'vision' });
  await ada.page.getByRole('button', { name: 'Launch' }).click();
  await ada.page.getByRole('alert').getByText(
    "quota: project vision's limit is 0.25 H100-80GB GPU-equivalents at once",
  ).waitFor();
  // Outside the project only Acme's own limits apply.
  await ada.page.getByLabel('Project').selectOption({ label: 'No project' });
  await ada.page.getByRole('button', { name: 'Launch' }).click();
  await ada.page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  assert.deepEqual(ada.consoleErrors, []);
  await ada.context.close();
});

test('someone whose groups give no role is refused, with no session', async () => {
  const { context, page } = await ssoSignIn('eve@acme.example');
  await page.waitForURL((url) => url.pathname === '/login');
  await page.getByRole('alert').filter({ hasText: 'no access to Berth yet' }).waitFor();
  await page.screenshot({ path: join(artifacts, 'sso-refused.png') });
  assert.equal(await page.getByTestId('role').count(), 0);
  await context.close();
});

test('one tenant\'s provider does not sign in another tenant\'s people', async () => {
  // Bob's email is not in Acme's allowed domains (and Globex's groups mean nothing to Acme).
  const { context, page } = await ssoSignIn('acme', 'bob@globex.example');
  await page.waitForURL((url) => url.pathname === '/login');
  await page.getByRole('alert').waitFor();
  assert.equal(await page.getByTestId('role').count(), 0);
  await context.close();
});

test('a replayed sign-in callback is refused and makes no session, in any browser', async () => {
  const context = await chrome.newContext();
  const page = await context.newPage();
  let callback;
  page.on('request', (r) => {
    if (r.url().includes('/auth/oidc/callback')) callback = r.url();
  });
  // Straight from the link Globex's Team page shows.
  await page.goto(`${berth.url}/auth/oidc/globex/start?next=/environments`);
  await signInAtProvider(page, 'bob@globex.example');
  await page.waitForURL((url) => url.pathname === '/environments');
  assert.match(callback, /[?&]code=.+&?/);
  await page.getByRole('button', { name: 'Sign out' }).click();
  await page.getByRole('link', { name: 'Sign in' }).waitFor();

  // The same browser replaying the callback: its state (and code) are used up.
  await page.goto(callback);
  await page.waitForURL((url) => url.pathname === '/login');
  await page.getByRole('alert').filter({ hasText: 'expired or was already used' }).waitFor();
  assert.equal(await page.getByTestId('role').count(), 0);

  // Another browser with the stolen callback URL: refused as well.
  const thief = await chrome.newContext();
  const stolen = await thief.newPage();
  await stolen.goto(callback);
  await stolen.waitForURL((url) => url.pathname === '/login');
  await stolen.getByRole('alert').waitFor();
  assert.equal(await stolen.getByTestId('role').count(), 0);
  await thief.close();
  await context.close();
});

test('every sign-in, refusal and sign-out is in the audit log', async () => {
  const res = await admin.request.get(`${berth.url}/audit.csv?action=session.`);
  assert.equal(res.status(), 200);
  const csv = await res.text();
  // target, then target_name (empty: a person's email names itself), then the outcome.
  assert.match(csv, /ada@acme\.example,acme,session\.sign_in,ada@acme\.example,,success/);
  assert.match(csv, /bob@globex\.example,globex,session\.sign_out,,,success/);
  assert.match(csv, /,acme,session\.sign_in,,,failure/);
  assert.doesNotMatch(csv, /acme-secret|globex-secret/);
});
