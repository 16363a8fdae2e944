// Personal API tokens and the audit log in real Chromium: a token is created on the
// tokens page (its secret shown once), works on the JSON API, is revoked on the page and
// stops working at once; the audit page shows both changes, filters them by action, and
// downloads them as CSV. The same creation works without JavaScript. SSH keys are
// checked, listed and removed on the same page.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { adminSession, artifacts, enterOneTimeCode } from './harness.mjs';

let berth, chrome, page, consoleErrors, secret;

before(async () => {
  ({ berth, chrome, page, consoleErrors } = await adminSession('/account'));
});

after(async () => {
  await chrome?.close();
  await berth?.kill();
});

const api = (path, token) => fetch(`${berth.url}${path}`, { headers: { Authorization: `Bearer ${token}` } });

test('a token without a name is refused on the page, and nothing is created', async () => {
  await page.getByRole('heading', { name: 'API tokens' }).waitFor();
  await page.getByText('No tokens yet.').waitFor();
  await page.getByLabel('Name', { exact: true }).fill('  ');
  await page.getByRole('button', { name: 'Create token' }).click();
  await page.getByRole('alert').getByText('Token name must be 1 to 60 characters').waitFor();
  await page.getByLabel('Name', { exact: true }).fill('too-long-lived');
  await page.getByLabel(/^Lifetime \(days/).fill('366');
  await page.getByRole('button', { name: 'Create token' }).click();
  await page.getByRole('alert').getByText('Token lifetime must be a whole number of days from 1 to 365').waitFor();
  assert.equal(await page.getByTestId('new-token').count(), 0);
  assert.equal(await page.locator('tr[data-token]').count(), 0);
});

test('a new token shows its secret once, with a curl example', async () => {
  await page.getByLabel('Name', { exact: true }).fill('ci-e2e');
  await page.getByLabel(/^Lifetime \(days/).fill('30');
  await page.getByRole('button', { name: 'Create token' }).click();
  const box = page.getByTestId('new-token');
  await box.waitFor();
  await box.getByText('Copy it now; it will not be shown again.').waitFor();
  secret = (await box.locator('[data-secret]').innerText()).trim();
  assert.match(secret, /^berth_[0-9a-f]{64}$/);
  // One press copies it.
  await page.context().grantPermissions(['clipboard-read', 'clipboard-write'], { origin: berth.url });
  const copy = box.getByRole('button', { name: 'Copy the token' });
  await copy.click();
  await box.getByRole('button', { name: 'Copy the token', hasText: 'Copied' }).waitFor();
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), secret);
  assert.equal(
    (await box.locator('[data-example]').innerText()).trim(),
    `curl -H "Authorization: Bearer ${secret}" ${berth.url}/api/v1/environments`,
  );
  const row = page.locator('tr[data-token="ci-e2e"]');
  await row.locator('[data-status="active"]').waitFor();
  // No action ticked: everything an administrator's role allows.
  await row.getByText('All your role allows').waitFor();
  await row.getByText('never').waitFor();
  await page.screenshot({ path: join(artifacts, 'account.png'), fullPage: true });

  await page.reload();
  await page.locator('tr[data-token="ci-e2e"]').waitFor();
  assert.equal(await page.getByTestId('new-token').count(), 0);
  assert.ok(!(await page.content()).includes(secret), 'the secret is gone after a reload');
});

test('the token works on the JSON API', async () => {
  const me = await api('/api/v1/me', secret);
  assert.equal(me.status, 200);
  assert.equal((await me.json()).role, 'platform_admin');
  const envs = await api('/api/v1/environments', secret);
  assert.equal(envs.status, 200);
  assert.ok(Array.isArray((await envs.json()).environments));
  await page.reload();
  await page.locator('tr[data-token="ci-e2e"]').getByText(/^\d{4}-\d\d-\d\d \d\d:\d\d UTC$/).first().waitFor();
  assert.equal(await page.locator('tr[data-token="ci-e2e"]').getByText('never').count(), 0, 'last used is shown');
});

test('a revoked token stops working at once', async () => {
  const row = page.locator('tr[data-token="ci-e2e"]');
  // Revoking asks first (without JavaScript too): the first button only opens the question.
  await row.locator('summary', { hasText: 'Revoke' }).click();
  await row.getByText('Anything that uses this token stops working at once.').waitFor();
  await row.getByRole('button', { name: 'Yes, revoke' }).click();
  await row.locator('[data-status="revoked"]').waitFor();
  assert.equal(await row.locator('summary', { hasText: 'Revoke' }).count(), 0);
  assert.equal((await api('/api/v1/me', secret)).status, 401);
  assert.equal((await api('/api/v1/environments', secret)).status, 401);
});

test('the audit log lists the creation and the revocation, and filters by action', async () => {
  await page.getByRole('link', { name: 'Audit', exact: true }).click();
  await page.waitForURL((url) => url.pathname === '/audit');
  await page.locator('tr[data-audit-action="token.create"]', { hasText: 'ci-e2e' }).waitFor();
  await page.locator('tr[data-audit-action="token.revoke"]', { hasText: 'ci-e2e' }).waitFor();
  await page.locator('tr[data-audit-action="session.sign_in"]').first().waitFor();
  await page.locator('tr[data-audit-action="token.create"] [data-outcome="success"]').waitFor();

  const filters = page.getByRole('search', { name: 'Filter the audit log' });
  await filters.getByLabel('Action starts with').fill('token.');
  await filters.getByRole('button', { name: 'Filter' }).click();
  await page.waitForURL(/[?&]action=token\.(&|$)/);
  await page.locator('tr[data-audit-action="token.revoke"]').waitFor();
  const actions = await page.locator('tr[data-audit-action]').evaluateAll((rows) => rows.map((r) => r.dataset.auditAction));
  assert.ok(actions.length >= 2);
  assert.ok(actions.every((a) => a.startsWith('token.')), `only token actions: ${actions}`);
  assert.ok(actions.includes('token.create') && actions.includes('token.revoke'));
  // The failed use of the revoked token is there too, with no user behind it.
  await page.locator('tr[data-audit-action="token.use"] [data-outcome="failure"]').first().waitFor();
  assert.equal(await filters.getByLabel('Action starts with').inputValue(), 'token.');

  await filters.getByLabel('Outcome').selectOption('failure');
  await filters.getByRole('button', { name: 'Filter' }).click();
  await page.waitForURL(/outcome=failure/);
  const outcomes = await page.locator('tr[data-audit-action] [data-outcome]').evaluateAll((b) => b.map((e) => e.dataset.outcome));
  assert.ok(outcomes.length >= 1 && outcomes.every((o) => o === 'failure'), `only failures: ${outcomes}`);
  await page.screenshot({ path: join(artifacts, 'audit.png'), fullPage: true });
});

test('the CSV download carries the same filters', async () => {
  await page.goto(`${berth.url}/audit?action=token.`);
  const link = page.getByRole('link', { name: 'Download CSV' });
  assert.equal(await link.getAttribute('href'), '/audit.csv?action=token.');
  const [download] = await Promise.all([page.waitForEvent('download'), link.click()]);
  const csv = readFileSync(await download.path(), 'utf8');
  const [header, ...lines] = csv.trim().split('\r\n');
  assert.equal(header, 'id,time_utc,actor,tenant,action,target,target_name,outcome,source,request_id,detail');
  const actions = lines.map((line) => line.split(',')[4]);
  assert.ok(actions.includes('token.create') && actions.includes('token.revoke'), csv);
  assert.ok(actions.every((a) => a.startsWith('token.')), csv);
  assert.deepEqual(consoleErrors, []);
});

test('without JavaScript, a new token is shown once and can be revoked', async () => {
  const context = await chrome.newContext({ javaScriptEnabled: false });
  const plain = await context.newPage();
  await plain.goto(`${berth.url}/login?next=/account`);
  await plain.getByLabel('Email', { exact: true }).fill('admin@berth.local');
  await plain.getByLabel('Password').fill(berth.adminPassword());
  await plain.getByRole('button', { name: 'Sign in' }).click();
  await enterOneTimeCode(plain, berth);
  await plain.waitForURL((url) => url.pathname === '/account');

  await plain.getByRole('button', { name: 'Create token' }).click();
  await plain.getByRole('alert').getByText('Token name must be 1 to 60 characters').waitFor();

  await plain.getByLabel('Name', { exact: true }).fill('plain-html');
  await plain.getByLabel('Read the audit log').check();
  await plain.getByLabel('See environments').check();
  await plain.getByRole('button', { name: 'Create token' }).click();
  const box = plain.getByTestId('new-token');
  await box.waitFor();
  const plainSecret = (await box.locator('[data-secret]').innerText()).trim();
  assert.match(plainSecret, /^berth_[0-9a-f]{64}$/);
  // Copying needs the page's script; without it the token is there to select.
  assert.equal(await box.getByRole('button', { name: 'Copy the token' }).count(), 0);
  const row = plain.locator('tr[data-token="plain-html"]');
  await row.getByText('See environments, Read the audit log').waitFor();
  const me = await (await api('/api/v1/me', plainSecret)).json();
  assert.deepEqual(me.token_actions, ['environment.read', 'audit.read']);
  // Launching is not among its actions.
  const launch = await fetch(`${berth.url}/api/v1/environments`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${plainSecret}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ offering: 'notebook', size: 'l40s-1', name: 'nope', hours: '1' }),
  });
  assert.equal(launch.status, 403);

  await plain.reload();
  await row.waitFor();
  assert.equal(await plain.getByTestId('new-token').count(), 0);
  await row.locator('summary', { hasText: 'Revoke' }).click();
  await row.getByRole('button', { name: 'Yes, revoke' }).click();
  await row.locator('[data-status="revoked"]').waitFor();
  assert.equal((await api('/api/v1/me', plainSecret)).status, 401);
  await context.close();
});

// Made with `ssh-keygen -t ed25519 -C ada@laptop`; the fingerprint is what `ssh-keygen -l` prints.
const ED25519 = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKzNtyR4cmJGDog7LEjOcX9o3mjUze+WPw53Rf+R08s7 ada@laptop';
const ED25519_FINGERPRINT = 'SHA256:Q9LDPLeW+BGJfnAedLLd6G8cdv5eY+N0OaIbpR8yFwk';

test('an SSH key is checked, listed with its fingerprint, refused a second time, and removed', async () => {
  await page.goto(`${berth.url}/account`);
  await page.locator('body[data-hydrated]').waitFor();
  const keys = page.getByRole('region', { name: 'SSH keys' });
  const publicKey = keys.getByLabel(/^Public key/);
  await keys.getByText('No SSH keys yet.').waitFor();

  await publicKey.fill('ssh-dss AAAAB3NzaC1kc3MAAACBAOq8 ada@laptop');
  await keys.getByRole('button', { name: 'Add key' }).click();
  await keys.getByRole('alert').getByText('DSA keys are no longer safe').waitFor();
  await publicKey.fill('-----BEGIN OPENSSH PRIVATE KEY-----');
  await keys.getByRole('button', { name: 'Add key' }).click();
  await keys.getByRole('alert').getByText('this is a private key: never share it').waitFor();
  assert.equal(await page.locator('tr[data-ssh-key]').count(), 0, 'nothing was added');
  // The refusal is about the key: the field says so to assistive technology, and beside it.
  assert.equal(await publicKey.getAttribute('aria-invalid'), 'true');
  assert.match(await publicKey.getAttribute('aria-describedby'), /k-key-error/);
  assert.match(await page.locator('#k-key-error').innerText(), /private key/);
  assert.equal(await keys.getByLabel(/^Name/).getAttribute('aria-invalid'), null, 'only the key');

  await publicKey.fill(ED25519);
  await keys.getByRole('button', { name: 'Add key' }).click();
  const row = page.locator(`tr[data-ssh-key="${ED25519_FINGERPRINT}"]`);
  await row.getByText('ada@laptop').waitFor();
  await row.getByText('ED25519 256').waitFor();

  // The same key again, under another name, is refused with the name it already has.
  await publicKey.fill(ED25519);
  await keys.getByLabel(/^Name \(optional/).fill('work laptop');
  await keys.getByRole('button', { name: 'Add key' }).click();
  await keys.getByRole('alert').getByText('you added this SSH key already (as "ada@laptop")').waitFor();
  assert.equal(await page.locator('tr[data-ssh-key]').count(), 1);

  await row.getByLabel('Remove ada@laptop').click();
  await row.getByRole('button', { name: 'Yes, remove' }).click();
  await keys.getByText('No SSH keys yet.').waitFor();
  await page.reload();
  await keys.getByText('No SSH keys yet.').waitFor();
  assert.deepEqual(consoleErrors, []);
});

test('the printed first-start password was spent at the first sign-in, and a local account changes its password', async () => {
  const printed = berth.output.match(/One-time password: (\S+)/)?.[1];
  assert.ok(printed, 'the first start printed a password');
  assert.notEqual(berth.adminPassword(), printed, 'the first sign-in chose another');
  const context = await chrome.newContext();
  const other = await context.newPage();
  await other.goto(`${berth.url}/login`);
  await other.getByLabel('Email', { exact: true }).fill('admin@berth.local');
  await other.getByLabel('Password').fill(printed);
  await other.getByRole('button', { name: 'Sign in' }).click();
  await other.getByRole('alert').getByText('The email or password is not right').waitFor();
  await context.close();

  await page.goto(`${berth.url}/account`);
  await page.getByRole('heading', { name: 'Password' }).waitFor();
  await page.getByLabel('Current password').fill('not my password at all');
  await page.getByLabel('New password (12 characters or more)').fill('a brand new passphrase');
  await page.getByLabel('New password again').fill('a brand new passphrase');
  await page.getByRole('button', { name: 'Change password' }).click();
  await page.getByRole('alert').getByText('The current password is not right').waitFor();
  assert.equal(await page.getByLabel('Current password').getAttribute('aria-invalid'), 'true');
  assert.equal(await page.getByLabel('New password again').getAttribute('aria-invalid'), null);
  await page.getByLabel('Current password').fill(berth.adminPassword());
  await page.getByLabel('New password (12 characters or more)').fill('a brand new passphrase');
  await page.getByLabel('New password again').fill('a brand new passphrase');
  await page.getByRole('button', { name: 'Change password' }).click();
  await page.getByTestId('password-changed').waitFor();
  berth.chosenPassword = 'a brand new passphrase';

  // One's own authenticator needs another administrator.
  await page.getByLabel('Their email').fill('admin@berth.local');
  await page.getByRole('button', { name: 'Reset authenticator' }).click();
  await page.getByRole('alert').getByText('ask another platform admin to reset your own authenticator').waitFor();
  assert.deepEqual(consoleErrors, []);
});

test('without SMTP the account page says email is not configured, and channel choices are kept', async () => {
  await page.goto(`${berth.url}/account`);
  await page.getByTestId('email-status').getByText('Email is not configured on this Berth').waitFor();
  const byEmail = page.getByLabel('Environment ready by email');
  assert.equal(await byEmail.isChecked(), true, 'email is on by default');
  await byEmail.uncheck();
  await page.getByRole('button', { name: 'Save notification choices' }).click();
  await page.waitForURL((url) => url.pathname === '/account');
  await page.reload();
  assert.equal(await page.getByLabel('Environment ready by email').isChecked(), false);
  assert.equal(await page.getByLabel('Environment ready in the bell').isChecked(), true);
});
