// A real OpenID Connect provider for the identity tests: the certified `oidc-provider`
// package (installed by tests/run_all.sh), with its development sign-in pages (any password),
// two clients — tollgate's console (confidential, `OIDC_SECRET`) and a command-line client
// (public, PKCE) —, with `OIDC_MCP_SECRET` a machine client of the client-credentials grant
// (`mcp-gateway`: tollgate calling an MCP server), and the people of `OIDC_PEOPLE` ({id: {email, email_verified?, name?,
// roles, teams}}; an email is verified unless `email_verified: false`). Access tokens for the resource `audience` are JWTs
// carrying the person's email, whether it is verified, name, roles and teams.
//
//   node provider.mjs PORT AUDIENCE CONSOLE_REDIRECT_URI
import Provider from 'oidc-provider';

const [port, audience, consoleRedirect] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;
const people = JSON.parse(process.env.OIDC_PEOPLE || '{}');
const personal = (p) => ({ email: p.email, email_verified: p.email_verified ?? true, name: p.name, roles: p.roles, teams: p.teams });
const claimsOf = (id) => ({ sub: id, ...personal(people[id]) });

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: 'tollgate',
      client_secret: process.env.OIDC_SECRET,
      // Besides the console's: the gateway's own sign-in callbacks (`OIDC_EXTRA_REDIRECTS`, comma-separated).
      redirect_uris: [consoleRedirect, ...(process.env.OIDC_EXTRA_REDIRECTS || '').split(',').filter(Boolean)],
      post_logout_redirect_uris: [consoleRedirect.replace(/\/callback$/, '/login')],
      grant_types: ['authorization_code'],
      response_types: ['code'],
    },
    {
      client_id: 'cli',
      token_endpoint_auth_method: 'none',
      redirect_uris: ['http://127.0.0.1/cb'],
      grant_types: ['authorization_code'],
      response_types: ['code'],
    },
    ...(process.env.OIDC_MCP_SECRET
      ? [{ client_id: 'mcp-gateway', client_secret: process.env.OIDC_MCP_SECRET, grant_types: ['client_credentials'], response_types: [], redirect_uris: [] }]
      : []),
  ],
  async findAccount(ctx, id) {
    if (!people[id]) return undefined;
    return { accountId: id, async claims() { return claimsOf(id); } };
  },
  claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['name', 'roles', 'teams'] },
  scopes: ['openid', 'email', 'profile', 'api', 'short'],
  features: {
    devInteractions: { enabled: true },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => audience,
      useGrantedResource: () => true,
      // The token's audience is the resource asked for (a test asks for another one to get a
      // token that is not tollgate's).
      getResourceServerInfo: (ctx, resource) => ({ scope: 'api short', audience: resource, accessTokenFormat: 'jwt', jwt: { sign: { alg: 'RS256' } } }),
    },
  },
  async extraTokenClaims(ctx, token) {
    const p = people[token.accountId];
    return p ? personal(p) : undefined;
  },
  pkce: { required: () => true },
  // `short` in the scope: an access token that expires after 1 s.
  ttl: { AccessToken: (ctx, token) => (token.scope && token.scope.split(' ').includes('short') ? 1 : 600), IdToken: 600, Interaction: 600, Session: 600, Grant: 600, AuthorizationCode: 60 },
});
provider.listen(Number(port), '127.0.0.1', () => console.log(`oidc-provider listening on ${issuer}`));
