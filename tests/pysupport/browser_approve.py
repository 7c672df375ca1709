"""`$BROWSER` for the sign-in tests: given the verification link Claude Code opens, approves
the code as the person `TOLLGATE_TEST_LOGIN` would in a browser — the page, its form (from the
same site), the provider's sign-in — and appends the gateway's last page's status to
`TOLLGATE_TEST_BROWSER_LOG`."""
import os
import re
import sys
import urllib.parse

import requests

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pysupport.oidc import OidcProvider  # noqa: E402


def main(url):
    parts = urllib.parse.urlparse(url)
    gateway = f"{parts.scheme}://{parts.netloc}"
    s = requests.Session()
    page = s.get(url)
    code = re.search(r'name="user_code" value="([^"]*)"', page.text).group(1)
    r = s.post(f"{gateway}/device", data={"user_code": code}, headers={"sec-fetch-site": "same-origin"}, allow_redirects=False)
    status = r.status_code
    if status == 303:
        back = OidcProvider.follow_to(None, r.headers["location"], os.environ["TOLLGATE_TEST_LOGIN"], f"{gateway}/oauth/callback", s)
        status = s.get(back).status_code
    with open(os.environ["TOLLGATE_TEST_BROWSER_LOG"], "a") as log:
        log.write(f"{url} {status}\n")


if __name__ == "__main__":
    main(sys.argv[1])
