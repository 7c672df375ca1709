"""A real OpenID Connect provider for the tests (`oidc-provider` from the npm registry, run by
tests/identity/provider.mjs) and the authorization-code flow with PKCE driven over HTTP the
way a browser follows it (its development sign-in pages take any password)."""
import base64
import hashlib
import json
import os
import re
import secrets
import subprocess
import urllib.parse

import requests

from pysupport import free_port, wait_listening

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = os.environ.get("TOLLGATE_OIDC_MODULES", os.path.expanduser("~/.cache/tollgate/oidc/node_modules"))


class OidcProvider:
    def __init__(self, people, audience, console_redirect="http://127.0.0.1:1/console/callback", secret="console-client-secret-0123456789", mcp_secret=None, extra_redirects=()):
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.audience = audience
        self.secret = secret
        env = {**os.environ, "OIDC_PEOPLE": json.dumps(people), "OIDC_SECRET": secret, "NODE_PATH": MODULES}
        if mcp_secret:
            env["OIDC_MCP_SECRET"] = mcp_secret
        if extra_redirects:
            env["OIDC_EXTRA_REDIRECTS"] = ",".join(extra_redirects)
        script = os.path.join(HERE, "identity", "provider.mjs")
        # An ES module finds packages next to itself, not through NODE_PATH: run a copy beside them.
        runner = os.path.join(os.path.dirname(MODULES), "provider.mjs")
        with open(script) as src, open(runner, "w") as dst:
            dst.write(src.read())
        self.proc = subprocess.Popen(["node", runner, str(self.port), audience, console_redirect], env=env, stdout=subprocess.DEVNULL)
        wait_listening(self.port, self.proc, "oidc-provider")

    def stop(self):
        self.proc.kill()
        self.proc.wait()

    def access_token(self, login, client_id="cli", redirect_uri="http://127.0.0.1/cb", resource=None, scope="openid email profile api"):
        """Sign `login` in with the public client and PKCE; the JWT access token for `resource`
        (default: the audience); `short` in `scope`: one that expires after a second."""
        resource = resource or self.audience
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        query = {
            "client_id": client_id, "response_type": "code", "redirect_uri": redirect_uri, "scope": scope,
            "code_challenge": challenge, "code_challenge_method": "S256", "state": "s", "nonce": "n", "resource": resource,
        }
        code = self.follow(f"{self.issuer}/auth?{urllib.parse.urlencode(query)}", login, redirect_uri)
        r = requests.post(f"{self.issuer}/token", data={
            "grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri, "client_id": client_id,
            "code_verifier": verifier, "resource": resource,
        })
        r.raise_for_status()
        return r.json()["access_token"]

    def follow(self, url, login, redirect_uri, client=None):
        """Follow a sign-in from `url` as a browser would, signing `login` in and consenting;
        the code the provider sends to `redirect_uri`."""
        back = self.follow_to(url, login, redirect_uri, client)
        params = urllib.parse.parse_qs(urllib.parse.urlparse(back).query)
        if "code" not in params:
            raise AssertionError(f"the provider answered {params}")
        return params["code"][0]

    def follow_to(self, url, login, redirect_uri, client=None):
        """As `follow`; the whole URL the provider sends the browser back to."""
        c = client or requests.Session()
        for _ in range(12):
            r = c.get(url, allow_redirects=False)
            if r.status_code in (302, 303):
                url = urllib.parse.urljoin(url, r.headers["location"])
                if url.startswith(redirect_uri):
                    return url
                continue
            action = re.search(r'action="([^"]+)"', r.text)
            assert action, r.text[:500]
            form = {"prompt": "login", "login": login, "password": "any"} if 'name="login"' in r.text else {"prompt": "consent"}
            r = c.post(urllib.parse.urljoin(url, action.group(1)), data=form, allow_redirects=False)
            assert r.status_code in (302, 303), r.text[:500]
            url = urllib.parse.urljoin(url, r.headers["location"])
        raise AssertionError("the sign-in did not end")
