"""Selling access in the console (issue 67): open sign-up through a real OpenID Connect provider
(`oidc-provider`) in headless Chromium — a new person gets an account of their own and the
sign-up credit once, an outsider's domain does not, closing sign-up (a reload) keeps existing
customers —; a card top-up's Checkout round trip against a local fake of Stripe's API
(tollgate's call checked: amount, currency, idempotency key, metadata), credited by webhooks
signed with the official `stripe` package's helper; a redemption code redeemed from the
console into the team's account."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait as _Wait

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pysupport import admin_json, free_port, start_mock, start_tollgate  # noqa: E402
from pysupport.oidc import MODULES, OidcProvider  # noqa: E402

from console_env import BIN_DIR, UPSTREAM_KEY, left, screenshot  # noqa: E402

if not os.path.isdir(os.path.join(MODULES, "oidc-provider")) and not os.environ.get("TOLLGATE_OIDC_REQUIRED"):
    pytest.skip("oidc-provider is not installed (tests/run_all.sh installs it)", allow_module_level=True)

ADMIN_TOKEN = "selling-console-admin-token-0123456789"
WEBHOOK_SECRET = "whsec_console_test_0123456789abcdef"
STRIPE_KEY = "sk_test_console_0123456789"
STRIPE_MODULES = os.environ.get("TOLLGATE_STRIPE_MODULES", os.path.expanduser("~/.cache/tollgate/stripe/node_modules"))
PEOPLE = {
    "nell": {"email": "nell@example.com", "roles": [], "teams": []},
    "omar": {"email": "omar@elsewhere.org", "roles": [], "teams": []},
    "lena": {"email": "lena@example.com", "roles": [], "teams": []},
}


def WebDriverWait(driver, secs):
    return _Wait(driver, secs, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException))


def stripe_signature(payload, secret=WEBHOOK_SECRET, timestamp=None):
    """The `Stripe-Signature` header the official package's test helper makes."""
    script = ("const s = require('stripe')('sk_test_unused'); process.stdout.write(s.webhooks.generateTestHeaderString("
              "{payload: process.env.P, secret: process.env.S, timestamp: Number(process.env.T)}));")
    env = {**os.environ, "NODE_PATH": STRIPE_MODULES, "P": payload, "S": secret, "T": str(int(timestamp or time.time()))}
    return subprocess.run(["node", "-e", script], env=env, check=True, capture_output=True, text=True).stdout


class FakeStripe:
    """Stripe's Checkout Sessions API as tollgate calls it: each call kept; a session's `url` is a
    page of this server, where the customer "pays"."""

    def __init__(self):
        self.calls = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0))).decode()
                form = dict(urllib.parse.parse_qsl(body))
                fake.calls.append({"path": self.path, "headers": dict(self.headers), "form": form})
                sid = f"cs_test_{len(fake.calls)}"
                answer = {"id": sid, "object": "checkout.session", "url": f"http://127.0.0.1:{fake.port}/pay/{sid}",
                          "amount_total": int(form.get("line_items[0][price_data][unit_amount]", 0)), "currency": form.get("line_items[0][price_data][currency]")}
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                data = f"<html><body><h1 id='fake-checkout'>Pay {self.path.rsplit('/', 1)[-1]}</h1></body></html>".encode()
                self.send_response(200)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()


class Env:
    def __init__(self, gateway, admin, idp, stripe, proc, config_path, config):
        self.gateway, self.admin, self.idp, self.stripe = gateway, admin, idp, stripe
        self.proc, self.config_path, self.config = proc, config_path, config

    def admin_json(self, method, path, body=None):
        return admin_json(self.admin, ADMIN_TOKEN, method, path, body)

    def accounts(self):
        return {a["name"]: a for a in self.admin_json("GET", "/admin/accounts")["data"]}

    def audit(self, text):
        return [e for e in self.admin_json("GET", "/admin/audit?limit=1000")["data"] if text in (e.get("reason") or "")]


@pytest.fixture(scope="module")
def env():
    tmp = tempfile.mkdtemp(prefix="tollgate-selling-console-")
    gw_port, admin_port = free_port(), free_port()
    idp = OidcProvider(PEOPLE, "https://tollgate.test/api", console_redirect=f"http://127.0.0.1:{admin_port}/console/callback")
    stripe = FakeStripe()
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
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY}, models: [alpha-5.5] }}
groups:
  default: {{ platforms: [openai] }}
  customers: {{ platforms: [openai], price_multiplier: 1.25 }}
prices:
  alpha-5.5: {{ input: 2.0, output: 8.0 }}
identity:
  oidc: {{ issuer: "{idp.issuer}", client_id: tollgate, client_secret_env: OIDC_CONSOLE_SECRET }}
  signup: {{ open: true, credit: 3.0, group: customers, allowed_domains: [example.com] }}
payments:
  stripe: {{ secret_key_env: STRIPE_SK, webhook_secret_env: STRIPE_WH, currency: usd, amounts: [5, 20], min: 5, max: 100, base_url: "http://127.0.0.1:{stripe.port}" }}
"""
        envs = {"OIDC_CONSOLE_SECRET": idp.secret, "STRIPE_SK": STRIPE_KEY, "STRIPE_WH": WEBHOOK_SECRET}
        gw = start_tollgate(BIN_DIR, tmp, config, [gw_port, admin_port], env=envs)
        procs.append(gw)
        yield Env(f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{admin_port}", idp, stripe, gw, os.path.join(tmp, "tollgate.yaml"), config)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        idp.stop()
        stripe.stop()
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
    WebDriverWait(driver, 15).until(lambda d: d.current_url.startswith(env.admin) or d.find_elements(By.CSS_SELECTOR, "form button[autofocus]"))
    if not driver.current_url.startswith(env.admin):
        driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    WebDriverWait(driver, 15).until(lambda d: d.current_url.startswith(env.admin + "/console") and "/callback" not in d.current_url)


def team_balance(driver):
    return driver.find_element(By.CSS_SELECTOR, "section[data-team] .team-balance").text


def test_a_new_person_signs_up_once_and_an_outsider_does_not(env, browser):
    sign_in(browser, env, "nell")
    assert browser.current_url.startswith(env.admin + "/console/me")
    who = browser.find_element(By.ID, "who").text
    match = re.search(r"team (u-[0-9a-f]{16})", who)
    assert match and "(team_admin)" in who, who
    account = match.group(1)
    assert team_balance(browser) == "$3.00"
    screenshot(browser, "selling-signed-up")
    made = env.accounts()[account]
    assert made["origin"] == "signup" and round(made["balance"] * 1e9) == 3_000_000_000, made
    assert list(made["people"].values()) == ["team_admin"], made
    # A key made here is in the sign-up's group, drawing on the new account.
    browser.find_element(By.NAME, "name").send_keys("nell-laptop")
    old = browser.find_element(By.TAG_NAME, "html")
    browser.find_element(By.CSS_SELECTOR, "form[action='/console/me/keys'] button").click()
    WebDriverWait(browser, 15).until(left(old))
    (key,) = [k for k in env.admin_json("GET", "/admin/keys")["data"] if k["name"] == "nell-laptop"]
    assert (key["group"], key["account"]) == ("customers", account), key
    # Signing in again grants nothing again.
    sign_in(browser, env, "nell")
    assert team_balance(browser) == "$3.00"
    assert len(env.audit("sign-up credit")) == 1
    # Another domain than the allowed one: signed in, but no account.
    sign_in(browser, env, "omar")
    assert "no team of this gateway" in browser.find_element(By.ID, "who").text
    assert not any("omar" in json.dumps(a["people"]) or a["origin"] == "signup" and a["name"] != account for a in env.accounts().values())


def test_a_card_top_up_goes_through_checkout_and_is_credited_once_by_the_webhook(env, browser):
    sign_in(browser, env, "nell")
    account = re.search(r"team (u-[0-9a-f]{16})", browser.find_element(By.ID, "who").text).group(1)
    before = round(env.accounts()[account]["balance"] * 1e9)
    # A custom amount out of bounds is refused before anything reaches Stripe.
    browser.find_element(By.CSS_SELECTOR, "form.topup-custom input[name=amount]").send_keys("1000")
    old = browser.find_element(By.TAG_NAME, "html")
    browser.find_element(By.CSS_SELECTOR, "form.topup-custom button").click()
    WebDriverWait(browser, 15).until(left(old))
    assert "between 5.00 USD and 100.00 USD" in browser.page_source
    assert env.stripe.calls == []
    # 20 USD: tollgate makes a Checkout Session and sends the browser to it.
    browser.get(env.admin + "/console/me")
    old = browser.find_element(By.TAG_NAME, "html")
    browser.find_element(By.CSS_SELECTOR, "form.topup button[value='20']").click()
    WebDriverWait(browser, 15).until(lambda d: d.find_elements(By.ID, "fake-checkout"))
    (call,) = env.stripe.calls
    form, headers = call["form"], {k.lower(): v for k, v in call["headers"].items()}
    assert call["path"] == "/v1/checkout/sessions"
    assert headers["authorization"] == f"Bearer {STRIPE_KEY}"
    assert re.fullmatch(r"tollgate-topup-[0-9A-Za-z]{24}", headers["idempotency-key"]), headers
    assert (form["mode"], form["line_items[0][price_data][unit_amount]"], form["line_items[0][price_data][currency]"]) == ("payment", "2000", "usd")
    assert (form["client_reference_id"], form["metadata[tollgate_account]"], form["metadata[tollgate_credit_nanos]"]) == (account, account, "20000000000")
    assert form["metadata[tollgate_by]"].startswith("nell@example.com")
    assert form["success_url"] == env.admin + "/console/me?topup=done"
    # Stripe tells tollgate the session was paid: twice, as Stripe may; credited once.
    session = {"id": "cs_test_1", "object": "checkout.session", "payment_status": "paid", "amount_total": 2000, "currency": "usd",
               "payment_intent": "pi_console_1", "client_reference_id": account,
               "metadata": {k[len("metadata["):-1]: v for k, v in form.items() if k.startswith("metadata[")}}
    event = json.dumps({"id": "evt_console_1", "object": "event", "type": "checkout.session.completed", "data": {"object": session}})
    for _ in range(2):
        r = requests.post(env.gateway + "/payments/stripe/webhook", data=event, headers={"stripe-signature": stripe_signature(event), "content-type": "application/json"})
        assert r.status_code == 200, r.text
    # A forged event (the right shape, the wrong secret) and an old one are refused.
    forged = event.replace("evt_console_1", "evt_forged").replace("cs_test_1", "cs_forged")
    assert requests.post(env.gateway + "/payments/stripe/webhook", data=forged, headers={"stripe-signature": stripe_signature(forged, "whsec_wrong")}).status_code == 400
    assert requests.post(env.gateway + "/payments/stripe/webhook", data=forged, headers={"stripe-signature": stripe_signature(forged, timestamp=time.time() - 600)}).status_code == 400
    assert round(env.accounts()[account]["balance"] * 1e9) == before + 20_000_000_000
    browser.get(env.admin + "/console/me?topup=done")
    assert "Payment received" in browser.page_source
    assert team_balance(browser) == f"${(before + 20_000_000_000) / 1e9:,.2f}"
    screenshot(browser, "selling-topped-up")
    (entry,) = env.audit("card top-up")
    assert "cs_test_1" in entry["reason"] and "pi_console_1" in entry["reason"] and "evt_console_1" in entry["reason"]
    # The team's statement, downloaded from the page: the sign-up credit and the top-up, adding
    # up to the account's balance.
    link = browser.find_element(By.CSS_SELECTOR, "a.statement").get_attribute("href")
    session = requests.Session()
    for c in browser.get_cookies():
        session.cookies.set(c["name"], c["value"])
    csv = session.get(link)
    assert csv.status_code == 200 and csv.headers["content-type"].startswith("text/csv"), csv.text[:300]
    rows = [line.split(",") for line in csv.text.splitlines()[1:]]
    kinds = {r[0]: int(r[-1]) for r in rows}
    assert (kinds["signup_credit"], kinds["top_up"]) == (3_000_000_000, 20_000_000_000), csv.text
    assert kinds["closing"] == round(env.accounts()[account]["balance"] * 1e9), csv.text
    other = session.get(env.admin + "/console/me/statement?team=research&month=2026-11")
    assert other.status_code == 404, "only a team one runs"


def test_a_code_is_redeemed_from_the_console_into_the_team(env, browser):
    sign_in(browser, env, "nell")
    account = re.search(r"team (u-[0-9a-f]{16})", browser.find_element(By.ID, "who").text).group(1)
    before = round(env.accounts()[account]["balance"] * 1e9)
    (code,) = env.admin_json("POST", "/admin/codes", {"count": 1, "amount": 1.5, "note": "welcome"})["codes"]
    browser.find_element(By.CSS_SELECTOR, "form.redeem input[name=code]").send_keys(code)
    old = browser.find_element(By.TAG_NAME, "html")
    browser.find_element(By.CSS_SELECTOR, "form.redeem button").click()
    WebDriverWait(browser, 15).until(left(old))
    assert "Code redeemed: $1.50 credited to team" in browser.find_element(By.CSS_SELECTOR, "p.notice").text
    assert round(env.accounts()[account]["balance"] * 1e9) == before + 1_500_000_000
    # Again: refused, nothing credited.
    browser.find_element(By.CSS_SELECTOR, "form.redeem input[name=code]").send_keys(code)
    old = browser.find_element(By.TAG_NAME, "html")
    browser.find_element(By.CSS_SELECTOR, "form.redeem button").click()
    WebDriverWait(browser, 15).until(left(old))
    assert "already redeemed" in browser.page_source
    assert round(env.accounts()[account]["balance"] * 1e9) == before + 1_500_000_000


def test_closing_sign_up_stops_new_accounts_and_keeps_the_customers(env, browser):
    assert [a["origin"] for a in env.accounts().values()].count("signup") == 1
    with open(env.config_path, "w") as f:
        f.write(env.config.replace("signup: { open: true", "signup: { open: false"))
    os.kill(env.proc.pid, signal.SIGHUP)
    # The reload is applied once its counter says so.
    deadline = time.time() + 20
    while 'tollgate_config_reloads_total{outcome="applied"} 1' not in requests.get(env.admin + "/metrics", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).text:
        assert time.time() < deadline, "the reload was not applied"
        time.sleep(0.05)
    sign_in(browser, env, "lena")
    assert "no team of this gateway" in browser.find_element(By.ID, "who").text
    assert [a["origin"] for a in env.accounts().values()].count("signup") == 1, "only nell's account"

    sign_in(browser, env, "nell")
    assert re.search(r"team u-[0-9a-f]{16}", browser.find_element(By.ID, "who").text), "an existing customer keeps the account"
