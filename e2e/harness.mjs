// Starts a real `berth serve` on a fresh database and a real Chromium for the
// end-to-end tests. Nothing is mocked: the simulated fleet is Berth's own backend.
import { spawn } from 'node:child_process';
import http from 'node:http';
import { createHmac } from 'node:crypto';
import { mkdtempSync, mkdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import net from 'node:net';
import { chromium } from 'playwright-core';

export const artifacts = resolve('e2e/artifacts');
mkdirSync(artifacts, { recursive: true });

/** A loopback port nothing listens on now. */
export async function freePort() {
  return new Promise((ok, fail) => {
    const srv = net.createServer();
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => ok(port));
    });
    srv.on('error', fail);
  });
}

/** A running Berth. `restart()` kills it with SIGKILL and starts it again on the same database. */
let logCount = 0;

export class Berth {
  static async start(env = {}) {
    const berth = new Berth();
    berth.dir = mkdtempSync(join(tmpdir(), 'berth-e2e-'));
    berth.port = await freePort();
    berth.metricsPort = await freePort();
    berth.url = `http://127.0.0.1:${berth.port}`;
    berth.env = env;
    await berth.#spawn();
    return berth;
  }

  async #spawn() {
    const bin = process.env.BERTH_BIN ?? 'target/debug/berth';
    this.output = '';
    this.proc = spawn(bin, ['serve'], {
      env: {
        ...process.env,
        BERTH_LISTEN: `127.0.0.1:${this.port}`,
        BERTH_DATABASE: `sqlite://${this.dir}/berth.db`,
        BERTH_SITE_ROOT: process.env.BERTH_SITE_ROOT ?? 'target/site',
        BERTH_FLEET: 'config/fleet.toml',
        BERTH_SIM_SPEED: '0.3',
        BERTH_LOG: 'warn',
        // Metrics on a listener of their own, as an operator keeps them off the public port.
        BERTH_METRICS_LISTEN: `127.0.0.1:${this.metricsPort}`,
        // The tests' identity provider listens on loopback.
        BERTH_ALLOW_PRIVATE_ISSUERS: 'true',
        ...this.env,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    this.proc.stdout.on('data', (d) => (this.output += d));
    this.proc.stderr.on('data', (d) => (this.output += d));
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      if (this.proc.exitCode !== null) throw new Error(`berth exited early:\n${this.output}`);
      try {
        const res = await fetch(`${this.url}/readyz`);
        if (res.ok) return;
      } catch {}
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(`berth did not become ready:\n${this.output}`);
  }

  /**
   * The administrator's password: the one chosen at the first sign-in, or before that the
   * one-time password printed at first start.
   */
  adminPassword() {
    if (this.chosenPassword) return this.chosenPassword;
    const m = this.output.match(/One-time password: (\S+)/);
    if (!m) throw new Error(`no one-time password in the output:\n${this.output}`);
    return m[1];
  }

  async kill() {
    if (this.proc && this.proc.exitCode === null) {
      const exited = new Promise((r) => this.proc.once('exit', r));
      this.proc.kill('SIGKILL');
      await exited;
    }
    // Keep the server's log next to the screenshots, for whoever reads a failure.
    writeFileSync(join(artifacts, `berth-${++logCount}.log`), this.output ?? '');
  }

  async restart() {
    await this.kill();
    await this.#spawn();
  }

  async metrics() {
    // Not on the portal's port: only where the operator chose.
    const portal = await fetch(`${this.url}/metrics`);
    if (portal.status !== 404) throw new Error(`/metrics on the portal answered ${portal.status}`);
    return (await fetch(`http://127.0.0.1:${this.metricsPort}/metrics`)).text();
  }
}

export async function browser() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
      '--disable-component-update', '--no-first-run', '--disable-sync', '--disable-quic',
    ],
  });
}

/**
 * `fetch` for environments' origins beside a loopback Berth (`http://<id>.localhost:<port>`):
 * browsers resolve `*.localhost` to loopback themselves, Node's resolver does not, so the
 * request goes to 127.0.0.1 with the environment's Host. Answers `{ status, text(), json() }`.
 */
export function fetchLocal(url, { method = 'GET', headers = {}, body } = {}) {
  const target = new URL(url);
  return new Promise((ok, fail) => {
    const request = http.request(
      {
        host: target.hostname.endsWith('.localhost') ? '127.0.0.1' : target.hostname,
        port: target.port || 80,
        path: target.pathname + target.search,
        method,
        headers: { ...headers, host: target.host },
      },
      (response) => {
        let data = '';
        response.setEncoding('utf8');
        response.on('data', (chunk) => (data += chunk));
        response.on('end', () => ok({ status: response.statusCode, text: async () => data, json: async () => JSON.parse(data) }));
      },
    );
    request.on('error', fail);
    request.end(body);
  });
}

/**
 * Fails the test on any error or warning the page logs: a hydration panic is an error, and
 * Leptos warns of hydration trouble (a resource read outside Suspense, a mismatched node).
 */
export function watchConsole(page) {
  const errors = [];
  page.on('console', (msg) => {
    // A refused form answers 4xx on purpose; the browser logs those as failed loads.
    const refusal = /status of 4\d\d/.test(msg.text());
    if ((msg.type() === 'error' || msg.type() === 'warning') && !refusal) {
      errors.push(`${msg.type()}: ${msg.text()} (on ${page.url()})`);
    }
  });
  page.on('pageerror', (err) => errors.push(String(err)));
  return errors;
}

/** RFC 6238 code (HMAC-SHA1, 30 s, 6 digits) of a base32 secret for time step `step`. */
export function totp(secret, step = Math.floor(Date.now() / 30_000)) {
  const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';
  let bits = '';
  for (const c of secret.replace(/=+$/, '')) bits += alphabet.indexOf(c).toString(2).padStart(5, '0');
  const key = Buffer.from(bits.match(/.{8}/g).map((b) => parseInt(b, 2)));
  const counter = Buffer.alloc(8);
  counter.writeBigUInt64BE(BigInt(step));
  const digest = createHmac('sha1', key).update(counter).digest();
  const offset = digest[19] & 0x0f;
  return String((digest.readUInt32BE(offset) & 0x7fffffff) % 1_000_000).padStart(6, '0');
}

/**
 * Signs in as the administrator through the login page, with the one-time code step (the
 * authenticator is set up at the first sign-in and its secret kept on `berth`), and waits
 * to land on `next`.
 */
export async function signInAsAdmin(page, berth, next) {
  await page.goto(`${berth.url}/login?next=${next}`);
  await page.getByLabel('Email', { exact: true }).fill('admin@berth.local');
  await page.getByLabel('Password').fill(berth.adminPassword());
  await page.getByRole('button', { name: 'Sign in' }).click();
  await enterOneTimeCode(page, berth);
  // By path: the login page's own URL ends with `next` too.
  await page.waitForURL((url) => url.pathname === next);
}

/** What the e2e administrator chooses at the first sign-in, for the printed password. */
export const CHOSEN_ADMIN_PASSWORD = 'chosen at the first sign-in, e2e';

/**
 * The administrator's steps after the password: at the first sign-in a password of their
 * own (kept on `berth`), then the one-time code, reading the authenticator secret when the
 * page offers to set one up (the first sign-in) and keeping it on `berth`.
 */
export async function enterOneTimeCode(page, berth) {
  await page.waitForURL((url) => url.pathname === '/login/code' || url.pathname === '/login/password');
  if (new URL(page.url()).pathname === '/login/password') {
    await page.getByLabel('New password', { exact: true }).fill(CHOSEN_ADMIN_PASSWORD);
    await page.getByLabel('New password again').fill(CHOSEN_ADMIN_PASSWORD);
    await page.getByRole('button', { name: 'Save and continue' }).click();
    berth.chosenPassword = CHOSEN_ADMIN_PASSWORD;
    await page.waitForURL((url) => url.pathname === '/login/code');
  }
  await page.getByLabel('Code from your authenticator').waitFor();
  // The step says either "set up with this key" or "enter the code"; wait for which.
  await page.locator('[data-testid="totp-secret"], [data-testid="totp-ready"]').first().waitFor();
  const shown = page.getByTestId('totp-secret');
  if (await shown.count()) {
    berth.totpSecret = (await shown.textContent()).trim();
    // Beside the key, the same key as a QR code the page's policy lets the browser draw.
    const qr = page.getByTestId('totp-qr');
    await qr.waitFor();
    await page.waitForFunction(() => document.querySelector('[data-testid="totp-qr"]')?.naturalWidth > 0);
  }
  // Each code works once: wait for a fresh time step if this one was used.
  let step = Math.floor(Date.now() / 30_000);
  while (step <= (berth.lastTotpStep ?? -1)) {
    await new Promise((r) => setTimeout(r, 1000));
    step = Math.floor(Date.now() / 30_000);
  }
  berth.lastTotpStep = step;
  await page.getByLabel('Code from your authenticator').fill(totp(berth.totpSecret, step));
  await page.getByRole('button', { name: 'Verify' }).click();
}

/** A server, a browser and a page signed in as the administrator at `next`. */
export async function adminSession(next) {
  const berth = await Berth.start();
  const chrome = await browser();
  const page = await chrome.newPage({ viewport: { width: 1400, height: 1000 } });
  const consoleErrors = watchConsole(page);
  await signInAsAdmin(page, berth, next);
  return { berth, chrome, page, consoleErrors };
}

/** Tomorrow's date in UTC, `YYYY-MM-DD`, as the calendar and date inputs write it. */
export const tomorrow = new Date(Date.now() + 86_400_000).toISOString().slice(0, 10);
