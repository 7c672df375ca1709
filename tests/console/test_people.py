"""People in the console (issue 51, points 1–3): sign-in through a real OpenID Connect
provider (`oidc-provider` from the npm registry) with the authorization-code flow and PKCE in
headless Chromium; a member's own keys made, used with the SDK (billed to their team's
account), rotated and revoked; a member shut out of every operator page, the admin API and
other people's keys; a team admin's page of their team only, allowances never above the
team's account and audited with their name; an operator by role sees the whole console; a
provider that is down leaves the admin token working."""
import json
import re
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import openai
import pytest
import requests
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait as _Wait

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pysupport import admin_json, free_port, start_mock, start_tollgate, wait_listening  # noqa: E402
from pysupport.oidc import MODULES, OidcProvider  # noqa: E402

from console_env import BIN_DIR, UPSTREAM_KEY, left, screenshot  # noqa: E402

if not os.path.isdir(os.path.join(MODULES, "oidc-provider")) and not os.environ.get("TOLLGATE_OIDC_REQUIRED"):
    pytest.skip("oidc-provider is not installed (tests/run_all.sh installs it)", allow_module_level=True)

ADMIN_TOKEN = "identity-console-admin-token-0123456789"


def submit(driver, selector):
    """Click the button `selector` and wait until its page was replaced by the answer."""
    old = driver.find_element(By.TAG_NAME, "html")
    driver.find_element(By.CSS_SELECTOR, selector).click()
    _Wait(driver, 15).until(left(old))


def WebDriverWait(driver, secs):
    """A wait that reads the page again while it is being replaced (an element of the page that
    was left is stale, not an answer)."""
    return _Wait(driver, secs, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException))
PEOPLE = {
    "ada": {"email": "ada@example.com", "roles": ["member"], "teams": ["research"]},
    "tina": {"email": "tina@example.com", "roles": ["team_admin"], "teams": ["research"]},
    "dan": {"email": "dan@example.com", "roles": ["member"], "teams": ["ops"]},
    "olga": {"email": "olga@example.com", "roles": ["operator"], "teams": []},
}
OPERATOR_PAGES = ["/console/keys", "/console/accounts", "/console/accounts/research", "/console/groups", "/console/usage", "/console/usage.csv", "/console/requests", "/console/providers", "/console/video", "/console/mcp", "/console/batches", "/console/files"]


class Env:
    def __init__(self, gateway, admin, idp):
        self.gateway, self.admin, self.idp = gateway, admin, idp

    def admin_json(self, method, path, body=None):
        return admin_json(self.admin, ADMIN_TOKEN, method, path, body)

    def keys_of(self, tag_person):
        return [k for k in self.admin_json("GET", "/admin/keys")["data"] if (k.get("tags") or {}).get("person", "").split(" [")[0] == tag_person]

    def account(self, name):
        return round(self.admin_json("GET", f"/admin/accounts/{name}")["balance"] * 1e9)


@pytest.fixture(scope="module")
def env():
    tmp = tempfile.mkdtemp(prefix="tollgate-identity-console-")
    mock_port, gw_port, admin_port = free_port(), free_port(), free_port()
    idp = OidcProvider(PEOPLE, "https://tollgate.test/api", console_redirect=f"http://127.0.0.1:{admin_port}/console/callback")
    procs = []
    try:
        mock, mock_port = start_mock(BIN_DIR, UPSTREAM_KEY)
        procs.append(mock)
        config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
admin: {{ listen: "127.0.0.1:{admin_port}", token: {ADMIN_TOKEN} }}
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY}, models: [alpha-5.5, alpha-4o-mini] }}
groups:
  default: {{ platforms: [openai] }}
prices:
  alpha-5.5: {{ input: 2.0, output: 8.0 }}
  alpha-4o-mini: {{ input: 0.15, output: 0.6 }}
accounts:
  - {{ name: research, balance: 5.0, budgets: {{ day: 4.0, "5h": 3.0 }} }}
  - {{ name: ops, balance: 5.0 }}
identity:
  oidc: {{ issuer: "{idp.issuer}", client_id: tollgate, client_secret_env: OIDC_CONSOLE_SECRET, allowance: 1.0 }}
"""
        gw = start_tollgate(BIN_DIR, tmp, config, [gw_port, admin_port], env={"OIDC_CONSOLE_SECRET": idp.secret})
        procs.append(gw)
        yield Env(f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{admin_port}", idp)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        idp.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def sign_in(driver, env, login):
    """Sign `login` in through the provider's pages, as a person would."""
    driver.delete_all_cookies()
    driver.get(env.admin + "/console/login")
    driver.find_element(By.ID, "oidc-sign-in").click()
    WebDriverWait(driver, 15).until(lambda d: d.find_elements(By.NAME, "login"))
    driver.find_element(By.NAME, "login").send_keys(login)
    driver.find_element(By.NAME, "password").send_keys("any")
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    # The provider asks for consent the first time.
    WebDriverWait(driver, 15).until(lambda d: d.current_url.startswith(env.admin) or d.find_elements(By.CSS_SELECTOR, "form button[autofocus]"))
    if not driver.current_url.startswith(env.admin):
        driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    WebDriverWait(driver, 15).until(lambda d: d.current_url.startswith(env.admin + "/console") and "/callback" not in d.current_url)


def session_of(driver):
    """The browser's console session, for requests the page would not make."""
    s = requests.Session()
    for c in driver.get_cookies():
        s.cookies.set(c["name"], c["value"])
    csrf = driver.find_element(By.NAME, "csrf").get_attribute("value")
    return s, csrf


def test_a_member_signs_in_makes_uses_rotates_and_revokes_their_own_key_and_nothing_else(env, browser):
    sign_in(browser, env, "ada")
    assert browser.current_url == env.admin + "/console/me"
    assert "ada@example.com (member), team research" in browser.find_element(By.ID, "who").text
    screenshot(browser, "identity-member")
    browser.find_element(By.NAME, "name").send_keys("ada-laptop")
    submit(browser, "form[action='/console/me/keys'] button")
    WebDriverWait(browser, 15).until(lambda d: d.find_elements(By.ID, "secret"))
    secret = browser.find_element(By.ID, "secret").get_attribute("value")
    assert secret.startswith("sk-tg-")
    # The key bills its team's account (and its own allowance).
    research = env.account("research")
    client = openai.OpenAI(base_url=env.gateway + "/v1", api_key=secret, max_retries=0)
    r = client.chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "hi"}], max_tokens=10)
    cost = r.usage.prompt_tokens * 2000 + r.usage.completion_tokens * 8000
    assert env.account("research") == research - cost
    (key,) = [k for k in env.keys_of("ada@example.com") if k["name"] == "ada-laptop"]
    assert key["account"] == "research" and round(key["balance"] * 1e9) == 1_000_000_000 - cost
    # An operator's People page lists her among who has signed in, with the team she draws on.
    operator = requests.Session()
    operator.post(env.admin + "/console/login", data={"token": ADMIN_TOKEN, "next": "/console/people"})
    signed_in = operator.get(env.admin + "/console/people").text.split("Who has signed in")[-1]
    assert re.search(r"ada@example\.com[^<]*</td><td>research</td>", signed_in), signed_in
    audit = env.admin_json("GET", "/admin/audit")["data"]
    assert any(e["id"] == key["id"] and "made on team research by ada@example.com [ada] (member)" in (e.get("reason") or "") for e in audit), audit[:3]
    # Shut out of every operator page, the admin API, and other people's keys.
    session, csrf = session_of(browser)
    home = session.get(env.admin + "/console", allow_redirects=False)
    assert home.status_code == 200 and 'id="who"' in home.text and "Overview" not in home.text, "a person's home is their own page"
    for page in OPERATOR_PAGES + ["/console/team", f"/console/keys/{key['id']}"]:
        assert session.get(env.admin + page, allow_redirects=False).status_code == 404, page
    for method, path in (("GET", "/admin/keys"), ("POST", "/admin/keys"), ("GET", "/admin/accounts"), ("GET", "/admin/accounts/research"),
                         ("PATCH", "/admin/accounts/research"), ("GET", "/admin/audit"), ("GET", "/admin/usage"), ("GET", "/metrics")):
        r = session.request(method, env.admin + path, json={} if method != "GET" else None)
        assert r.status_code == 401, (method, path, r.status_code)
    others = env.admin_json("POST", "/admin/keys", {"name": "not-ada", "balance": 1.0})
    for action in ("revoke", "rotate"):
        r = session.post(f"{env.admin}/console/me/keys/{others['id']}/{action}", data={"csrf": csrf}, allow_redirects=False)
        assert r.status_code == 404, action
    assert env.admin_json("GET", f"/admin/keys/{others['id']}")["enabled"] is True
    # Rotate then revoke their own key: the old secret stops, the new one works until revoked.
    browser.get(env.admin + "/console/me")
    submit(browser, f"form[action='/console/me/keys/{key['id']}/rotate'] button")
    WebDriverWait(browser, 15).until(lambda d: d.find_elements(By.ID, "secret"))
    new_secret = browser.find_element(By.ID, "secret").get_attribute("value")
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    openai.OpenAI(base_url=env.gateway + "/v1", api_key=new_secret, max_retries=0).models.list()
    browser.get(env.admin + "/console/me")
    submit(browser, f"form[action='/console/me/keys/{key['id']}/revoke'] button")
    WebDriverWait(browser, 15).until(lambda d: "revoked" in d.find_element(By.ID, "my-keys").text)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=env.gateway + "/v1", api_key=new_secret, max_retries=0).models.list()
    # Sign-out ends the session.
    submit(browser, "form[action='/console/logout'] button")
    WebDriverWait(browser, 15).until(lambda d: "/console/login" in d.current_url)
    assert session.get(env.admin + "/console/me", allow_redirects=False).status_code == 303


def test_a_team_admin_runs_their_team_within_its_account_and_is_audited(env, browser):
    # A key of ada's (research) and one of dan's (ops), made as they would make them.
    for login, team in (("ada", "research"), ("dan", "ops")):
        sign_in(browser, env, login)
        browser.find_element(By.NAME, "name").send_keys(f"{login}-ci")
        submit(browser, "form[action='/console/me/keys'] button")
        WebDriverWait(browser, 15).until(lambda d: d.find_elements(By.ID, "secret"))
        secret = browser.find_element(By.ID, "secret").get_attribute("value")
        openai.OpenAI(base_url=env.gateway + "/v1", api_key=secret, max_retries=0).chat.completions.create(
            model="alpha-5.5", messages=[{"role": "user", "content": f"{login} was here"}], max_tokens=5
        )
    (ada_key,) = [k for k in env.keys_of("ada@example.com") if k["name"] == "ada-ci"]
    (dan_key,) = [k for k in env.keys_of("dan@example.com") if k["name"] == "dan-ci"]
    sign_in(browser, env, "tina")
    browser.get(env.admin + "/console/team")
    text = browser.find_element(By.TAG_NAME, "main").text
    assert "Team research" in text and "ada-ci" in text and "Team ops" not in text and "dan-ci" not in text
    # The team's own spend windows, which every member's call counts against: cap, spent and
    # when the rolling one frees, as the admin API says them.
    account = env.admin_json("GET", "/admin/accounts/research")
    rows = {}
    for tr in browser.find_elements(By.CSS_SELECTOR, "table#team-windows-research tbody tr"):
        cells = [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        rows[cells[0]] = cells
    assert set(rows) == {"day", "5h"}, rows
    dollars = lambda text: float(text.replace("$", "").replace(",", ""))  # noqa: E731
    for name in ("day", "5h"):
        window = account["budgets"][name]
        assert dollars(rows[name][1]) == window["cap"], (name, rows[name], window)
        assert dollars(rows[name][2]) == pytest.approx(window["spent"], abs=1e-6) and window["spent"] > 0, (name, rows[name], window)
    assert rows["5h"][4] == account["budgets"]["5h"]["next_frees_at"], rows["5h"]
    # The team's request log: its keys' requests, no other team's.
    log = browser.find_element(By.ID, "team-log-research").text
    assert "ada-ci" in log and "alpha-5.5" in log and "dan-ci" not in log, log
    screenshot(browser, "identity-team-admin")
    session, csrf = session_of(browser)
    # Never more than the team's account holds; never another team's key.
    r = session.post(f"{env.admin}/console/team/keys/{ada_key['id']}/allowance", data={"csrf": csrf, "allowance": "1000"}, allow_redirects=False)
    assert r.status_code == 403 and "cannot be more" in r.text
    r = session.post(f"{env.admin}/console/team/keys/{dan_key['id']}/allowance", data={"csrf": csrf, "allowance": "2"}, allow_redirects=False)
    assert r.status_code == 404
    r = session.post(f"{env.admin}/console/team/keys/{dan_key['id']}/disable", data={"csrf": csrf}, allow_redirects=False)
    assert r.status_code == 404 and env.admin_json("GET", f"/admin/keys/{dan_key['id']}")["enabled"] is True
    # Without the form token: refused, nothing changed.
    r = session.post(f"{env.admin}/console/team/keys/{ada_key['id']}/disable", data={}, allow_redirects=False)
    assert r.status_code == 403 and env.admin_json("GET", f"/admin/keys/{ada_key['id']}")["enabled"] is True
    # Their own team's key: allowance set (audited with their name), disabled.
    r = session.post(f"{env.admin}/console/team/keys/{ada_key['id']}/allowance", data={"csrf": csrf, "allowance": "2.5", "reason": "sprint"}, allow_redirects=False)
    assert r.status_code == 303
    assert round(env.admin_json("GET", f"/admin/keys/{ada_key['id']}")["balance"] * 1e9) == 2_500_000_000
    audit = env.admin_json("GET", "/admin/audit")["data"]
    assert any(e["id"] == ada_key["id"] and "tina@example.com" in (e.get("reason") or "") and "sprint" in e["reason"] for e in audit), audit[:3]
    r = session.post(f"{env.admin}/console/team/keys/{ada_key['id']}/disable", data={"csrf": csrf}, allow_redirects=False)
    assert r.status_code == 303 and env.admin_json("GET", f"/admin/keys/{ada_key['id']}")["enabled"] is False
    # Still no operator page.
    for page in OPERATOR_PAGES:
        assert session.get(env.admin + page, allow_redirects=False).status_code == 404, page


def test_a_team_admin_sets_what_members_keys_may_do_within_the_operators_limit(env, browser):
    env.admin_json("PATCH", "/admin/accounts/research", {"member_limit": {"models": ["alpha-*"], "rpm": 30, "budgets": {"day": 2.0}}})
    sign_in(browser, env, "ada")
    browser.find_element(By.NAME, "name").send_keys("ada-before")
    submit(browser, "form[action='/console/me/keys'] button")
    WebDriverWait(browser, 15).until(lambda d: d.find_elements(By.ID, "secret"))
    before_secret = browser.find_element(By.ID, "secret").get_attribute("value")
    sign_in(browser, env, "tina")
    browser.get(env.admin + "/console/team")
    session, csrf = session_of(browser)
    good = {"csrf": csrf, "models": "alpha-5.5", "rpm": "10", "day": "1", "max_days": "7"}
    for field, value, says in (("rpm", "100", "rpm"), ("models", "beta-*", "models"), ("day", "3", "budgets.day")):
        r = session.post(env.admin + "/console/team-policy/research", data={**good, field: value}, allow_redirects=False)
        assert r.status_code == 403 and says in r.text, (field, r.text[-300:])
    r = session.post(env.admin + "/console/team-policy/ops", data=good, allow_redirects=False)
    assert r.status_code == 404, "not tina's team"
    # Within the limit: saved, and applied to the members' keys there are.
    browser.find_element(By.NAME, "models").clear()
    browser.find_element(By.NAME, "models").send_keys("alpha-5.5")
    for name, value in (("rpm", "10"), ("day", "1"), ("max_days", "7")):
        browser.find_element(By.NAME, name).clear()
        browser.find_element(By.NAME, name).send_keys(value)
    submit(browser, "form[action='/console/team-policy/research'] button")
    WebDriverWait(browser, 15).until(lambda d: d.current_url.endswith("/console/team"))
    account = env.admin_json("GET", "/admin/accounts/research")
    assert account["member_policy"]["rpm"] == 10 and account["member_policy"]["models"] == ["alpha-5.5"], account
    (before,) = [k for k in env.keys_of("ada@example.com") if k["name"] == "ada-before"]
    assert before["rpm"] == 10 and before["models"]["allow"] == ["alpha-5.5"] and before["budgets"]["day"]["cap"] == 1.0 and before["expires_at"], before
    client = openai.OpenAI(base_url=env.gateway + "/v1", api_key=before_secret, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model="alpha-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    client.chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    # A key a member makes afterwards has it from the start.
    sign_in(browser, env, "ada")
    browser.find_element(By.NAME, "name").send_keys("ada-after")
    submit(browser, "form[action='/console/me/keys'] button")
    WebDriverWait(browser, 15).until(lambda d: d.find_elements(By.ID, "secret"))
    (after,) = [k for k in env.keys_of("ada@example.com") if k["name"] == "ada-after"]
    assert after["rpm"] == 10 and after["models"]["allow"] == ["alpha-5.5"], after
    audit = env.admin_json("GET", "/admin/audit")["data"]
    assert any("members' key policy of team research set by tina@example.com" in (e.get("reason") or "") for e in audit)


def test_an_operator_puts_a_person_in_a_team_in_the_console_and_they_run_it_from_their_next_sign_in(env, browser):
    browser.delete_all_cookies()
    browser.get(env.admin + "/console/people")
    browser.find_element(By.NAME, "token").send_keys(ADMIN_TOKEN)
    submit(browser, "form[action='/console/login'] button")
    WebDriverWait(browser, 15).until(lambda d: d.current_url.endswith("/console/people"))
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element(By.NAME, "account")).select_by_visible_text("research")
    browser.find_element(By.NAME, "person").send_keys("Dan@Example.com")
    Select(browser.find_element(By.NAME, "role")).select_by_visible_text("team_admin")
    submit(browser, "form[action='/console/people'] button")
    WebDriverWait(browser, 15).until(lambda d: "dan@example.com" in d.find_element(By.ID, "people").text)
    screenshot(browser, "identity-people")
    assert env.admin_json("GET", "/admin/accounts/research")["people"] == {"dan@example.com": "team_admin"}
    # Dan (a member of ops by the provider's claims) now runs research, and only as its admin.
    sign_in(browser, env, "dan")
    browser.get(env.admin + "/console/team")
    text = browser.find_element(By.TAG_NAME, "main").text
    assert "Team research" in text and "Team ops" not in text, text
    # Taken out again: no team page at the next sign-in.
    env.admin_json("PATCH", "/admin/accounts/research", {"people": {"dan@example.com": None}})
    sign_in(browser, env, "dan")
    session, _ = session_of(browser)
    assert session.get(env.admin + "/console/team", allow_redirects=False).status_code == 404
    audit = env.admin_json("GET", "/admin/audit")["data"]
    assert any("dan@example.com set as team_admin of team research by an operator" in (e.get("reason") or "") for e in audit)


def test_an_operator_by_role_sees_the_whole_console_and_a_forged_callback_signs_nobody_in(env, browser):
    sign_in(browser, env, "olga")
    browser.get(env.admin + "/console/keys")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Keys"
    # What she does is audited with her name.
    target = env.admin_json("POST", "/admin/keys", {"name": "olga-target", "balance": 1.0})
    session, csrf = session_of(browser)
    r = session.post(f"{env.admin}/console/keys/{target['id']}/topup", data={"csrf": csrf, "amount": "0.5", "reason": "pilot"}, allow_redirects=False)
    assert r.status_code == 303, r.text[-300:]
    r = session.post(f"{env.admin}/console/keys/{target['id']}/disable", data={"csrf": csrf}, allow_redirects=False)
    assert r.status_code == 303
    reasons = [e.get("reason") or "" for e in env.admin_json("GET", "/admin/audit")["data"] if e["id"] == target["id"]]
    assert "pilot (by olga@example.com [olga], operator)" in reasons and "key disable by olga@example.com [olga] (operator)" in reasons, reasons
    r = requests.get(env.admin + "/console/callback?code=forged&state=forged", allow_redirects=False)
    assert r.status_code == 400 and "tg_console" not in r.headers.get("set-cookie", "")


def test_anonymous_sign_in_starts_hold_nothing_and_lock_nobody_out(env, browser):
    # A sign-in under way lives in its own browser's sealed cookie: 1,200 starts from nobody
    # (past the 1,000 the gateway once kept) leave a person's sign-in working.
    with requests.Session() as anon:
        for _ in range(1200):
            r = anon.get(env.admin + "/console/oidc/start", allow_redirects=False)
            assert r.status_code == 303, r.text[:200]
            anon.cookies.clear()
    sign_in(browser, env, "ada")
    assert browser.find_element(By.ID, "who")
    # A sealed cookie altered, or another browser's state: refused.
    start = requests.get(env.admin + "/console/oidc/start", allow_redirects=False)
    sealed = start.cookies.get("tg_signin")
    forged = sealed[:-2] + ("AA" if not sealed.endswith("AA") else "BB")
    r = requests.get(env.admin + "/console/callback?code=x&state=y", cookies={"tg_signin": forged}, allow_redirects=False)
    assert r.status_code == 400 and "tg_console" not in r.headers.get("set-cookie", "")
    r = requests.get(env.admin + "/console/callback?code=x&state=y", cookies={"tg_signin": sealed}, allow_redirects=False)
    assert r.status_code == 400 and "another browser" in r.text


def test_a_provider_that_is_down_leaves_the_admin_token_working():
    tmp = tempfile.mkdtemp(prefix="tollgate-identity-down-")
    gw_port, admin_port, dead = free_port(), free_port(), free_port()
    config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
admin: {{ listen: "127.0.0.1:{admin_port}", token: {ADMIN_TOKEN} }}
pingora: {{ threads: 1, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:9", api_key: k, models: [alpha-5.5] }}
prices:
  alpha-5.5: {{ input: 2.0, output: 8.0 }}
identity:
  oidc: {{ issuer: "http://127.0.0.1:{dead}", client_id: tollgate }}
"""
    gw = start_tollgate(BIN_DIR, tmp, config, [admin_port], env={"RUST_LOG": "error"})
    try:
        r = requests.get(f"http://127.0.0.1:{admin_port}/console/oidc/start", allow_redirects=False)
        assert r.status_code == 503 and "admin token" in r.text
        s = requests.Session()
        r = s.post(f"http://127.0.0.1:{admin_port}/console/login", data={"token": ADMIN_TOKEN, "next": "/console/keys"}, allow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/console/keys"
        assert s.get(f"http://127.0.0.1:{admin_port}/console/keys").status_code == 200
    finally:
        gw.kill()
        gw.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_consoles_own_listener_serves_only_the_console_over_tls_to_its_public_address():
    import trustme

    tmp = tempfile.mkdtemp(prefix="tollgate-identity-tls-")
    gw_port, admin_port, console_port = free_port(), free_port(), free_port()
    base = f"https://127.0.0.1:{console_port}"
    idp = OidcProvider(PEOPLE, "https://tollgate.test/api", console_redirect=f"{base}/console/callback")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(os.path.join(tmp, "console.pem"))
    cert.private_key_pem.write_to_path(os.path.join(tmp, "console.key"))
    ca.cert_pem.write_to_path(os.path.join(tmp, "ca.pem"))
    config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
admin: {{ listen: "127.0.0.1:{admin_port}", token: {ADMIN_TOKEN} }}
pingora: {{ threads: 1, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:9", api_key: k, models: [alpha-5.5] }}
prices:
  alpha-5.5: {{ input: 2.0, output: 8.0 }}
accounts:
  - {{ name: research, balance: 5.0 }}
identity:
  oidc: {{ issuer: "{idp.issuer}", client_id: tollgate, client_secret_env: OIDC_CONSOLE_SECRET }}
console: {{ listen: "0.0.0.0:{console_port}", public_url: "{base}", tls: {{ cert: {tmp}/console.pem, key: {tmp}/console.key }} }}
"""
    gw = None
    try:
        gw = start_tollgate(BIN_DIR, tmp, config, [console_port], env={"OIDC_CONSOLE_SECRET": idp.secret})
        s = requests.Session()
        # The test CA, not the environment's bundle (REQUESTS_CA_BUNDLE would win otherwise).
        s.trust_env = False
        s.verify = os.path.join(tmp, "ca.pem")
        assert "oidc-sign-in" in s.get(base + "/console/login").text
        # Only the console answers here: the admin API stays on loopback.
        assert s.get(base + "/admin/keys", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 404
        assert s.get(base + "/healthz").status_code == 404
        # Requests for another host, or from another origin, are refused.
        assert s.get(base + "/console/login", headers={"host": "evil.example"}).status_code == 403
        r = s.post(base + "/console/login", data={"token": "x"}, headers={"origin": "https://evil.example"}, allow_redirects=False)
        assert r.status_code == 403
        # A person signs in through the provider; every cookie is Secure.
        start = s.get(base + "/console/oidc/start", allow_redirects=False)
        assert start.status_code == 303 and "; Secure" in start.headers["set-cookie"]
        back = idp.follow_to(start.headers["location"], "ada", f"{base}/console/callback")
        signed = s.get(back, allow_redirects=False)
        assert signed.status_code == 200 and "tg_console=" in signed.headers["set-cookie"] and "; Secure" in signed.headers["set-cookie"]
        me = s.get(base + "/console/me")
        assert me.status_code == 200 and "ada@example.com" in me.text
        # The break-glass token works here too.
        t = requests.Session()
        t.trust_env = False
        t.verify = s.verify
        r = t.post(base + "/console/login", data={"token": ADMIN_TOKEN, "next": "/console/keys"}, allow_redirects=False)
        assert r.status_code == 303 and "; Secure" in r.headers["set-cookie"]
        assert t.get(base + "/console/keys").status_code == 200
    finally:
        if gw is not None:
            gw.kill()
            gw.wait()
        idp.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_person_holds_at_most_ten_keys(env, browser):
    sign_in(browser, env, "dan")
    session, csrf = session_of(browser)
    held = [k for k in env.keys_of("dan@example.com") if not k.get("revoked_at")]
    for i in range(len(held), 10):
        r = session.post(env.admin + "/console/me/keys", data={"csrf": csrf, "team": "ops", "name": f"dan-{i}"}, allow_redirects=False)
        assert r.status_code == 303, r.text[-300:]
    r = session.post(env.admin + "/console/me/keys", data={"csrf": csrf, "team": "ops", "name": "dan-one-too-many"}, allow_redirects=False)
    assert r.status_code == 403 and "revoke one first" in r.text
    assert len([k for k in env.keys_of("dan@example.com") if not k.get("revoked_at")]) == 10
