// Notifications as a person meets them, in real Chromium against a real server with a
// real SMTP server (Debian's aiosmtpd, `make smtp-tools`) on loopback: a notebook becomes
// ready, the bell in the bar counts it, /notifications lists it with a link to it, "Mark
// all read" clears the count (also without JavaScript), and the mail arrives with the
// portal's absolute link.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import http from 'node:http';
import { createHmac, timingSafeEqual } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import net from 'node:net';
import { Berth, browser, freePort, signInAsAdmin, watchConsole, artifacts } from './harness.mjs';

let berth, chrome, page, consoleErrors, smtp, maildir, environmentId, receiver;

/** A webhook receiver on loopback that checks each call's signature with `secret`. */
function startReceiver() {
  const seen = { secret: '', calls: [], badSignatures: 0 };
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => (body += d));
    req.on('end', () => {
      const header = req.headers['berth-signature'] ?? '';
      const parts = Object.fromEntries(header.split(',').map((p) => p.split('=')));
      const expected = createHmac('sha256', seen.secret).update(`${parts.t}.${body}`).digest('hex');
      const given = Buffer.from(parts.v1 ?? '', 'utf8');
      const ok = given.length === expected.length && timingSafeEqual(given, Buffer.from(expected, 'utf8'));
      if (!ok) {
        seen.badSignatures += 1;
        res.writeHead(401).end();
        return;
      }
      seen.calls.push({ delivery: req.headers['berth-delivery'], body: JSON.parse(body) });
      res.writeHead(204).end();
    });
  });
  return new Promise((ok) => server.listen(0, '127.0.0.1', () => ok({ server, seen, url: `http://127.0.0.1:${server.address().port}/hook` })));
}


async function listening(port) {
  const deadline = Date.now() + 10_000;
  while (Date.now() < deadline) {
    const up = await new Promise((ok) => {
      const socket = net.connect(port, '127.0.0.1', () => { socket.end(); ok(true); });
      socket.on('error', () => ok(false));
    });
    if (up) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`aiosmtpd did not listen on ${port}`);
}

/** Every mail aiosmtpd received, quoted-printable soft breaks undone. */
function mails() {
  const dir = join(maildir, 'new');
  if (!existsSync(dir)) return [];
  return readdirSync(dir).map((f) => readFileSync(join(dir, f), 'utf8').replace(/=\r?\n/g, '').replace(/=3D/g, '='));
}

before(async () => {
  const port = await freePort();
  // aiosmtpd makes the maildir (with new/, cur/, tmp/) only where nothing exists yet.
  maildir = join(mkdtempSync(join(tmpdir(), 'berth-e2e-mail-')), 'maildir');
  smtp = spawn('/usr/bin/aiosmtpd', ['-n', '-l', `127.0.0.1:${port}`, '-c', 'aiosmtpd.handlers.Mailbox', maildir], {
    stdio: 'ignore',
  });
  await listening(port);
  receiver = await startReceiver();
  berth = await Berth.start({
    BERTH_SMTP_URL: `smtp://127.0.0.1:${port}`,
    BERTH_SMTP_FROM: 'Berth <berth@berth.local>',
    // The test's webhook receiver listens on loopback: the operator's documented setting.
    BERTH_WEBHOOK_ALLOW_PRIVATE: 'true',
  });
  chrome = await browser();
  page = await chrome.newPage({ viewport: { width: 1400, height: 1000 } });
  consoleErrors = watchConsole(page);
  await signInAsAdmin(page, berth, '/catalog');
});

after(async () => {
  await chrome?.close();
  await berth?.kill();
  smtp?.kill();
  receiver?.server.close();
});

const bell = () => page.getByRole('link', { name: /^Notifications, / }).first();

test('the bell counts a notebook that became ready', async () => {
  assert.equal((await page.getByTestId('unread').textContent()).trim(), '0');
  await page.goto(`${berth.url}/launch/notebook?size=h100-1g.10gb`);
  await page.getByLabel('Name').fill('bell-test');
  await page.getByLabel('Duration (hours)').fill('2');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.waitForURL(/\/environments\/[0-9a-f-]{36}$/);
  environmentId = page.url().split('/').pop();
  await page.locator('[data-state="ready"]').waitFor({ timeout: 30_000 });
  // The bell looks again every few seconds, without a reload.
  await page.waitForFunction(() => document.querySelector('[data-testid="unread"]')?.textContent.trim() === '1', null, {
    timeout: 15_000,
  });
  assert.match(await bell().getAttribute('title'), /1 unread; newest: bell-test is ready/);
});

test('the notifications page lists it with a link, and mark all read clears the count', async () => {
  await bell().click();
  await page.waitForURL((url) => url.pathname === '/notifications');
  await page.getByTestId('unread-summary').getByText('1 unread.').waitFor();
  const item = page.locator('li[data-kind="environment.ready"]');
  assert.equal(await item.getAttribute('data-read'), 'false');
  assert.equal(await item.getByRole('link', { name: 'bell-test is ready' }).getAttribute('href'), `/environments/${environmentId}`);
  await page.screenshot({ path: join(artifacts, 'notifications.png'), fullPage: true });

  await page.getByRole('button', { name: 'Mark all read' }).click();
  await page.getByTestId('unread-summary').getByText('Nothing unread.').waitFor();
  await page.waitForFunction(() => document.querySelector('[data-testid="unread"]')?.textContent.trim() === '0');
  assert.equal(await page.locator('li[data-kind="environment.ready"]').getAttribute('data-read'), 'true');
  assert.deepEqual(consoleErrors, [], 'no errors in the browser console');
});

test('the mail arrived over SMTP with the portal link, and the account page says email is on', async () => {
  const deadline = Date.now() + 15_000;
  let ready;
  while (!(ready = mails().find((m) => m.includes('Subject: [Berth] bell-test is ready'))) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 200));
  }
  assert.ok(ready, 'the ready mail arrived');
  assert.ok(ready.includes(`${berth.url}/environments/${environmentId}`), ready);
  assert.ok(ready.includes('To: admin@berth.local'), ready);
  assert.match(await berth.metrics(), /berth_notifications_sent_total\{channel="email"\} 1/);

  await page.goto(`${berth.url}/account`);
  await page.getByTestId('email-status').getByText("Email goes to your account's address.").waitFor();
});

test('without JavaScript the bell is a link and mark all read is a plain form post', async () => {
  // A second notification to read: another notebook that becomes ready.
  const context = await chrome.newContext({ javaScriptEnabled: false, viewport: { width: 1400, height: 1000 } });
  await context.addCookies(await page.context().cookies());
  const nojs = await context.newPage();
  await page.goto(`${berth.url}/launch/notebook?size=h100-1g.10gb`);
  await page.getByLabel('Name').fill('bell-two');
  await page.getByLabel('Duration (hours)').fill('2');
  await page.getByRole('button', { name: 'Launch' }).click();
  await page.locator('[data-state="ready"]').waitFor({ timeout: 30_000 });

  await nojs.goto(`${berth.url}/catalog`);
  assert.equal((await nojs.getByTestId('unread').textContent()).trim(), '1');
  await nojs.getByRole('link', { name: /^Notifications, / }).first().click();
  await nojs.waitForURL((url) => url.pathname === '/notifications');
  await nojs.getByTestId('notifications').getByRole('link', { name: 'bell-two is ready' }).waitFor();
  await nojs.getByRole('button', { name: 'Mark all read' }).click();
  await nojs.waitForURL((url) => url.pathname === '/notifications');
  await nojs.getByTestId('unread-summary').getByText('Nothing unread.').waitFor();
  assert.equal((await nojs.getByTestId('unread').textContent()).trim(), '0');
  await context.close();
});

test('a tenant webhook added on the Team page gets the invitation, signed, and logs the call', async () => {
  await page.goto(`${berth.url}/admin/tenants`);
  await page.getByLabel('Short name').fill('acme');
  await page.getByLabel('Name', { exact: true }).fill('Acme Research');
  await page.getByRole('button', { name: 'Create tenant' }).click();
  await page.getByRole('link', { name: 'Acme Research', exact: true }).click();
  await page.waitForURL(/\/tenants\/\d+$/);
  const team = page.url();
  await page.getByTestId('webhooks-link').click();
  await page.waitForURL(/\/tenants\/\d+\/webhooks$/);
  await page.getByLabel('URL').fill(receiver.url);
  await page.getByLabel('Format').selectOption('json');
  await page.getByRole('checkbox', { name: /Added to a tenant/ }).check();
  await page.getByRole('button', { name: 'Add webhook' }).click();
  const secret = (await page.getByTestId('new-webhook').locator('[data-secret]').textContent()).trim();
  assert.match(secret, /^whsec_[0-9a-f]{64}$/);
  receiver.seen.secret = secret;
  await page.locator(`tr[data-webhook="${receiver.url}"]`).waitFor();

  await page.goto(team);
  await page.getByLabel('Invite by email').fill('ines@acme.example');
  await page.getByRole('button', { name: 'Invite' }).click();
  await page.locator('tr[data-member="ines@acme.example"]').waitFor();

  const deadline = Date.now() + 15_000;
  while (receiver.seen.calls.length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200));
  assert.equal(receiver.seen.badSignatures, 0);
  assert.equal(receiver.seen.calls.length, 1);
  const call = receiver.seen.calls[0].body;
  assert.equal(call.kind, 'tenant.invitation');
  assert.equal(call.title, 'You were added to Acme Research');
  assert.match(call.link, new RegExp(`^${berth.url}/tenants/\\d+$`));

  await page.goto(`${team}/webhooks`);
  await page.locator('tr[data-delivery-ok="true"]').getByText('204').waitFor();
  assert.ok(mails().some((m) => m.includes('To: ines@acme.example') && m.includes('Subject: [Berth] You were added to Acme Research')));
  assert.deepEqual(consoleErrors, [], 'no errors in the browser console');
});
