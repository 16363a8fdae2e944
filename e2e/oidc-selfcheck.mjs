// Checks e2e/oidc.mjs against a stand-in relying party: `node e2e/oidc-selfcheck.mjs`.
// Not a test file of the suite (the suite runs *.test.mjs); run it after changing oidc.mjs.
import assert from 'node:assert/strict';
import http from 'node:http';
import { createHash, createPublicKey, randomBytes, verify } from 'node:crypto';
import { browser } from './harness.mjs';
import { signInAtProvider, startOidcProvider } from './oidc.mjs';

const b64url = (buf) => Buffer.from(buf).toString('base64url');
const decode = (part) => JSON.parse(Buffer.from(part, 'base64url').toString());

/** A relying party on loopback: /login redirects to the provider, the callback is recorded. */
async function startRp() {
  const rp = { callbacks: [], pending: {} };
  rp.server = http.createServer((req, res) => {
    const url = new URL(req.url, rp.url);
    if (url.pathname === '/login') {
      res.writeHead(302, { location: rp.nextAuthorizationUrl }).end();
    } else if (url.pathname === '/auth/oidc/callback') {
      rp.callbacks.push(Object.fromEntries(url.searchParams));
      res.writeHead(200, { 'content-type': 'text/html' }).end('<title>back</title><p>signed in</p>');
    } else {
      res.writeHead(204).end();
    }
  });
  await new Promise((ok) => rp.server.listen(0, '127.0.0.1', ok));
  rp.url = `http://127.0.0.1:${rp.server.address().port}`;
  rp.redirectUri = `${rp.url}/auth/oidc/callback`;
  return rp;
}

async function discover(issuer) {
  return (await fetch(`${issuer}/.well-known/openid-configuration`)).json();
}

async function kids(config) {
  return (await (await fetch(config.jwks_uri)).json()).keys.map((k) => k.kid);
}

/** One sign-in through the browser and one code exchange; returns the verified ID token claims. */
async function signIn({ chrome, rp, config, client, login, auth }) {
  const state = b64url(randomBytes(16));
  const nonce = b64url(randomBytes(16));
  const verifier = b64url(randomBytes(32));
  const scopes = ['openid', 'email', 'profile'];
  if (config.scopes_supported.includes('groups')) scopes.push('groups');
  const authz = new URL(config.authorization_endpoint);
  authz.search = new URLSearchParams({
    response_type: 'code', client_id: client.client_id, redirect_uri: rp.redirectUri,
    scope: scopes.join(' '), state, nonce,
    code_challenge: b64url(createHash('sha256').update(verifier).digest()),
    code_challenge_method: 'S256',
  });
  rp.nextAuthorizationUrl = authz.href;

  const context = await chrome.newContext();
  const page = await context.newPage();
  const consoleErrors = [];
  page.on('console', (m) => m.type() === 'error' && consoleErrors.push(m.text()));
  await page.goto(`${rp.url}/login`);
  await signInAtProvider(page, login);
  assert.equal(new URL(page.url()).pathname, '/auth/oidc/callback');
  assert.deepEqual(consoleErrors, []);
  await context.close();

  const cb = rp.callbacks.at(-1);
  assert.equal(cb.state, state);
  assert.equal(cb.iss, config.issuer, 'RFC 9207 iss in the authorization response');
  assert.ok(cb.code);

  const body = new URLSearchParams({
    grant_type: 'authorization_code', code: cb.code, redirect_uri: rp.redirectUri,
    code_verifier: verifier,
  });
  const headers = { 'content-type': 'application/x-www-form-urlencoded' };
  if (auth === 'basic') {
    const enc = (s) => encodeURIComponent(s);
    headers.authorization = `Basic ${Buffer.from(`${enc(client.client_id)}:${enc(client.client_secret)}`).toString('base64')}`;
  } else {
    body.set('client_id', client.client_id);
    body.set('client_secret', client.client_secret);
  }
  const res = await fetch(config.token_endpoint, { method: 'POST', headers, body });
  const tokens = await res.json();
  assert.equal(res.status, 200, JSON.stringify(tokens));

  const [h, p, s] = tokens.id_token.split('.');
  const header = decode(h);
  const claims = decode(p);
  const jwks = (await (await fetch(config.jwks_uri)).json()).keys;
  const jwk = jwks.find((k) => k.kid === header.kid);
  assert.ok(jwk, `kid ${header.kid} is in the JWKS`);
  assert.ok(verify('RSA-SHA256', Buffer.from(`${h}.${p}`), createPublicKey({ key: jwk, format: 'jwk' }), Buffer.from(s, 'base64url')), 'signature');
  assert.equal(claims.iss, config.issuer);
  assert.equal(claims.aud, client.client_id);
  assert.equal(claims.nonce, nonce);
  return { header, claims, scope: tokens.scope };
}

const chrome = await browser();
const rp = await startRp();
const client = { client_id: 'berth', client_secret: 'berth-secret', redirect_uris: [rp.redirectUri] };
const idp = await startOidcProvider({
  clients: [client],
  accounts: { alice: { email: 'alice@example.com', name: 'Alice Liddell', groups: ['gpu-users', 'admins'] } },
});
try {
  const config = await discover(idp.issuer);
  assert.equal(config.issuer, idp.issuer);
  assert.match(idp.issuer, /^http:\/\/127\.0\.0\.1:\d+$/);
  assert.equal(config.authorization_response_iss_parameter_supported, true);
  assert.deepEqual(config.code_challenge_methods_supported, ['S256']);
  assert.ok(config.scopes_supported.includes('groups'));
  for (const m of ['client_secret_basic', 'client_secret_post']) {
    assert.ok(config.token_endpoint_auth_methods_supported.includes(m));
  }
  console.log('issuer', config.issuer);
  console.log('scopes_supported', config.scopes_supported.join(' '));
  console.log('token_endpoint_auth_methods_supported', config.token_endpoint_auth_methods_supported.join(' '));

  // PKCE is required: no code_challenge, no code.
  const noPkce = new URL(config.authorization_endpoint);
  noPkce.search = new URLSearchParams({
    response_type: 'code', client_id: client.client_id, redirect_uri: rp.redirectUri, scope: 'openid',
  });
  const refused = await fetch(noPkce, { redirect: 'manual' });
  const refusal = new URL(refused.headers.get('location'));
  assert.equal(refusal.searchParams.get('error'), 'invalid_request');
  console.log('without PKCE:', refusal.searchParams.get('error'), '-', refusal.searchParams.get('error_description'));

  const a = await signIn({ chrome, rp, config, client, login: 'alice', auth: 'basic' });
  console.log('callback query keys', Object.keys(rp.callbacks.at(-1)).join(' '), '| iss', rp.callbacks.at(-1).iss);
  console.log('alice (client_secret_basic) scope', a.scope, 'ID token', JSON.stringify(a.claims));
  assert.equal(a.claims.sub, 'alice');
  assert.equal(a.claims.email, 'alice@example.com');
  assert.equal(a.claims.email_verified, true);
  assert.equal(a.claims.name, 'Alice Liddell');
  assert.deepEqual(a.claims.groups, ['gpu-users', 'admins']);

  const b = await signIn({ chrome, rp, config, client, login: 'bob@example.org', auth: 'post' });
  console.log('bob@example.org (client_secret_post) ID token', JSON.stringify(b.claims));
  assert.equal(b.claims.sub, 'bob@example.org');
  assert.equal(b.claims.email, 'bob@example.org');
  assert.equal(b.claims.email_verified, true);
  assert.deepEqual(b.claims.groups, []);

  const before = await kids(config);
  await idp.rotateKeys();
  const after = await kids(config);
  console.log('JWKS kids before', before, 'after rotateKeys()', after);
  assert.ok(!after.some((k) => before.includes(k)), 'rotateKeys gives a new kid');
  const c = await signIn({ chrome, rp, config, client, login: 'alice', auth: 'basic' });
  assert.ok(after.includes(c.header.kid));
  console.log('after rotation the ID token is signed with', c.header.kid);
} finally {
  await idp.stop();
}

// groups in the profile scope instead: no `groups` scope listed, the claim still comes.
const idp2 = await startOidcProvider({
  clients: [client], accounts: { carol: { email: 'carol@example.com', name: 'Carol', groups: ['ops'] } },
  groupsScope: 'profile',
});
try {
  const config = await discover(idp2.issuer);
  assert.ok(!config.scopes_supported.includes('groups'));
  const d = await signIn({ chrome, rp, config, client, login: 'carol', auth: 'post' });
  console.log("groupsScope 'profile': scopes_supported", config.scopes_supported.join(' '), '| ID token', JSON.stringify(d.claims));
  assert.deepEqual(d.claims.groups, ['ops']);
} finally {
  await idp2.stop();
}

await chrome.close();
await new Promise((ok) => rp.server.close(ok));
console.log('oidc selfcheck: all checks passed');
