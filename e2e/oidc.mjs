// A real OpenID provider (the OpenID-certified `oidc-provider` package) on loopback, for the
// single sign-on end-to-end tests. Plain http on 127.0.0.1, authorization code flow with PKCE
// S256 required, RFC 9207 `iss` in every authorization response, confidential clients that may
// authenticate at the token endpoint with client_secret_basic or client_secret_post.
//
// Claims: the ID token itself carries sub, email, email_verified, name and groups
// (conformIdTokenClaims: false), each for its scope: `openid` → sub, `email` → email and
// email_verified, `profile` → name, and `groups` → groups. `groups` is its own scope, listed in
// scopes_supported (as Dex and Okta do); start with `groupsScope: 'profile'` to carry groups in
// `profile` instead and list no `groups` scope.
//
// The sign-in is oidc-provider's development interactions: a login form that takes any user
// name and any password (the name becomes `sub`), then a consent form. `signInAtProvider`
// completes both.
//
// oidc-provider 9 names Node 22 LTS as its minimum and warns on Node 20 at import; what it
// needs of Node (URL.parse, crypto.hash) is in Node 20.18 and later, and its warnings are kept
// quiet here unless DEBUG is set.
import http from 'node:http';
import { generateKeyPairSync, randomBytes, randomUUID } from 'node:crypto';

const debug = Boolean(process.env.DEBUG);

/** Runs `fn` with oidc-provider's start-up notices swallowed, unless DEBUG is set. */
async function quietly(fn) {
  if (debug) return fn();
  const { warn, info } = console;
  const keep = (orig) => (...args) => {
    if (typeof args[0] === 'string' && args[0].includes('oidc-provider ')) return;
    orig.apply(console, args);
  };
  console.warn = keep(warn);
  console.info = keep(info);
  try {
    return await fn();
  } finally {
    console.warn = warn;
    console.info = info;
  }
}

let providerModule;
async function loadProvider() {
  if (typeof URL.parse !== 'function') {
    throw new Error(`oidc-provider needs Node 20.18 or later (URL.parse); this is ${process.version}`);
  }
  providerModule ??= await quietly(() => import('oidc-provider'));
  return providerModule.Provider;
}

/** A fresh signing key set: one RS256 key with a new kid. */
function newKeys() {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const jwk = privateKey.export({ format: 'jwk' });
  return [{ ...jwk, kid: `k-${randomUUID()}`, alg: 'RS256', use: 'sig' }];
}

/**
 * In-memory storage for the provider's sessions, interactions, grants and codes. One per
 * started provider, so a `rotateKeys()` (a new Provider on the same storage) keeps them.
 */
function memoryAdapter() {
  const store = new Map(); // key → { payload, expiresAt }
  const now = () => Math.floor(Date.now() / 1000);
  const get = (key) => {
    const hit = store.get(key);
    if (!hit) return undefined;
    if (hit.expiresAt && hit.expiresAt <= Date.now()) {
      store.delete(key);
      return undefined;
    }
    return hit.payload;
  };
  return class MemoryAdapter {
    constructor(model) {
      this.model = model;
    }
    key(id) {
      return `${this.model}:${id}`;
    }
    async upsert(id, payload, expiresIn) {
      const expiresAt = expiresIn ? Date.now() + expiresIn * 1000 : undefined;
      store.set(this.key(id), { payload: structuredClone(payload), expiresAt });
      if (payload.uid) store.set(`uid:${this.model}:${payload.uid}`, { payload: id, expiresAt });
      if (payload.userCode) store.set(`userCode:${payload.userCode}`, { payload: id, expiresAt });
      if (payload.grantId) {
        const members = get(`grant:${payload.grantId}`) ?? [];
        members.push(this.key(id));
        store.set(`grant:${payload.grantId}`, { payload: members });
      }
    }
    async find(id) {
      const payload = get(this.key(id));
      return payload && structuredClone(payload);
    }
    async findByUid(uid) {
      const id = get(`uid:${this.model}:${uid}`);
      return id && this.find(id);
    }
    async findByUserCode(userCode) {
      const id = get(`userCode:${userCode}`);
      return id && this.find(id);
    }
    async consume(id) {
      const hit = store.get(this.key(id));
      if (hit) hit.payload.consumed = now();
    }
    async destroy(id) {
      store.delete(this.key(id));
    }
    async revokeByGrantId(grantId) {
      for (const key of get(`grant:${grantId}`) ?? []) store.delete(key);
      store.delete(`grant:${grantId}`);
    }
  };
}

/**
 * Starts the provider on 127.0.0.1.
 *   clients:  [{ client_id, client_secret, redirect_uris: [...] }]
 *   accounts: { '<login name>': { email, email_verified = true, name, groups: [...] } }
 * A login name not in `accounts` signs in too: `sub` is the name, email the name if it holds
 * an '@' (verified), no name, groups [].
 * Returns { issuer, stop(), rotateKeys() }.
 */
export async function startOidcProvider({
  clients, accounts = {}, port = 0, groupsScope = 'groups',
}) {
  const Provider = await loadProvider();

  let handle = (_req, res) => {
    res.statusCode = 503;
    res.end();
  };
  const server = http.createServer((req, res) => {
    // No favicon: a 404 would land in the browser console of the tests that watch it.
    if (req.url === '/favicon.ico') {
      res.statusCode = 204;
      res.end();
      return;
    }
    handle(req, res);
  });
  await new Promise((ok, fail) => {
    server.once('error', fail);
    server.listen(port, '127.0.0.1', ok);
  });
  const issuer = `http://127.0.0.1:${server.address().port}`;

  const claimsOf = (login) => {
    const known = accounts[login];
    if (known) {
      return {
        email: known.email,
        email_verified: known.email_verified ?? true,
        name: known.name,
        groups: known.groups ?? [],
      };
    }
    const email = login.includes('@') ? login : undefined;
    return { email, email_verified: email ? true : undefined, groups: [] };
  };

  const Adapter = memoryAdapter();
  const cookieKeys = [randomBytes(32).toString('base64url')];
  const claims = {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: groupsScope === 'profile' ? ['name', 'groups'] : ['name'],
    ...(groupsScope === 'profile' ? {} : { groups: ['groups'] }),
  };

  const build = (keys) => {
    const provider = new Provider(issuer, {
      adapter: Adapter,
      clients: clients.map((c) => ({
        client_id: c.client_id,
        client_secret: c.client_secret,
        redirect_uris: c.redirect_uris,
        grant_types: ['authorization_code'],
        response_types: ['code'],
        token_endpoint_auth_method: c.token_endpoint_auth_method ?? 'client_secret_basic',
      })),
      clientAuthMethods: ['client_secret_basic', 'client_secret_post'],
      claims,
      conformIdTokenClaims: false,
      cookies: { keys: cookieKeys },
      features: {
        devInteractions: { enabled: true },
        rpInitiatedLogout: { enabled: true },
      },
      async findAccount(_ctx, sub) {
        return {
          accountId: sub,
          async claims() {
            return { sub, ...claimsOf(sub) };
          },
        };
      },
      jwks: { keys },
      pkce: { required: () => true },
      responseTypes: ['code'],
      ttl: {
        AccessToken: 3600,
        AuthorizationCode: 60,
        Grant: 3600,
        IdToken: 3600,
        Interaction: 3600,
        Session: 3600,
      },
    });
    provider.silent = !debug;
    if (debug) {
      for (const ev of ['server_error', 'authorization.error', 'grant.error', 'userinfo.error']) {
        provider.on(ev, (_ctx, err) => console.error(`oidc-provider ${ev}:`, err));
      }
    }
    // The development pages pull a web font from the internet; there is no internet here, and
    // the failed load would show as a console error in the browser.
    provider.use(async (ctx, next) => {
      await next();
      if (typeof ctx.body === 'string' && ctx.body.includes('@import url(')) {
        ctx.body = ctx.body.replace(/@import url\([^)]*\);?/g, '');
      }
    });
    return provider;
  };

  let provider = await quietly(() => build(newKeys()));
  handle = provider.callback();

  return {
    issuer,
    /** Replaces the signing key set (a new kid; the old key is gone from the JWKS). */
    async rotateKeys() {
      provider = await quietly(() => build(newKeys()));
      handle = provider.callback();
    },
    async stop() {
      await new Promise((ok) => {
        server.close(() => ok());
        server.closeAllConnections();
      });
    },
  };
}

/**
 * Completes the provider's development sign-in in a Playwright page that is at (or on its way
 * to) the provider's login screen: types `login` as the user name and any password, accepts
 * the consent screen if one follows, and waits until the browser has loaded the relying
 * party's page it was redirected back to.
 */
export async function signInAtProvider(page, login, { timeout = 15_000 } = {}) {
  const loginForm = page.locator('form:has(input[name="prompt"][value="login"])');
  const consentForm = page.locator('form:has(input[name="prompt"][value="consent"])');
  try {
    await loginForm.waitFor({ state: 'visible', timeout });
  } catch (err) {
    // A browser context that has signed in at the provider before goes through without it.
    throw new Error(`no login screen of the provider at ${page.url()} (a context already signed in `
      + `there skips it: use a new browser context): ${err.message}`);
  }
  const provider = new URL(page.url()).origin;

  // Submits a form and waits for the next page (redirects in between are not pages).
  const submit = async (form, button) => {
    const here = page.url();
    await Promise.all([
      page.waitForURL((url) => url.href !== here, { timeout }),
      form.getByRole('button', { name: button }).click(),
    ]);
  };

  await loginForm.locator('input[name="login"]').fill(login);
  await loginForm.locator('input[name="password"]').fill('any password');
  await submit(loginForm, 'Sign-in');
  while (new URL(page.url()).origin === provider) {
    if (await consentForm.count()) {
      await submit(consentForm, 'Continue');
    } else {
      const body = (await page.locator('body').innerText()).slice(0, 500);
      throw new Error(`the provider stopped at ${page.url()}:\n${body}`);
    }
  }
  await page.waitForLoadState('load');
}
