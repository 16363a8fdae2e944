// The local OpenID provider the end-to-end tests use, started on its own so single sign-on
// can be tried on a laptop next to `make run` (whose demo data connects the Acme tenant to
// it). Any user name signs in; these ones come with groups:
//   ada@acme.example (acme-admins -> tenant admin), bob@acme.example (acme-ml -> member),
//   vic@acme.example (acme-viewers -> viewer).
import { startOidcProvider } from './oidc.mjs';

const berth = process.env.BERTH_URL ?? 'http://127.0.0.1:3000';
const port = Number(process.env.IDP_PORT ?? 9400);
const idp = await startOidcProvider({
  port,
  clients: [{ client_id: 'acme-berth', client_secret: 'acme-secret', redirect_uris: [`${berth}/auth/oidc/callback`] }],
  accounts: {
    'ada@acme.example': { email: 'ada@acme.example', name: 'Ada (Acme admin)', groups: ['acme-admins'] },
    'bob@acme.example': { email: 'bob@acme.example', name: 'Bob (Acme ML)', groups: ['acme-ml'] },
    'vic@acme.example': { email: 'vic@acme.example', name: 'Vic (Acme viewer)', groups: ['acme-viewers'] },
  },
});
process.stdout.write(
  `OpenID provider at ${idp.issuer} (client acme-berth / acme-secret, redirect ${berth}/auth/oidc/callback)\n` +
    'On Berth\'s sign-in page, type ada@acme.example (or "acme") under single sign-on; at the provider, use ada@acme.example, bob@acme.example or vic@acme.example with any password.\n',
);
const stop = async () => {
  await idp.stop();
  process.exit(0);
};
process.on('SIGINT', stop);
process.on('SIGTERM', stop);
