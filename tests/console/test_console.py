"""The operator console in a real browser (headless Chromium driven by Selenium): sign-in, keys
made and used through the SDK, top-ups, usage across a UTC midnight, the CSV, deep links and a
cross-site post. Each page is saved as a 1280×800 screenshot (target/console-screenshots/)."""
import csv
import datetime
import http.server
import json
import io
import threading
import urllib.parse
import urllib.error
import urllib.request

import openai
import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from console_env import ADMIN_TOKEN, DAY_AFTER, DAY_BEFORE, OTHER_KEY, TEAM_KEY, left, screenshot


def sign_in(driver, gateway, token=ADMIN_TOKEN, then="/console"):
    driver.delete_all_cookies()
    driver.get(gateway.admin + then)
    driver.find_element(By.NAME, "token").send_keys(token)
    old = driver.find_element(By.TAG_NAME, "html")
    driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    WebDriverWait(driver, 15).until(left(old))


def heading(driver):
    return driver.find_element(By.TAG_NAME, "h1").text


def submit(driver, button, expect):
    """Click a button that loads a page, and wait until the page's heading is `expect`."""
    old = driver.find_element(By.TAG_NAME, "html")
    button.click()
    WebDriverWait(driver, 15).until(left(old))
    WebDriverWait(driver, 15, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: heading(d) == expect
    )


def table_rows(driver, table_id):
    rows = []
    for tr in driver.find_elements(By.CSS_SELECTOR, f"table#{table_id} tbody tr:not(.empty)"):
        rows.append([td.text for td in tr.find_elements(By.TAG_NAME, "td")])
    return rows


def usd(text):
    return float(text.replace("$", "").replace(",", ""))


def session_cookie(driver):
    return next(c["value"] for c in driver.get_cookies() if c["name"] == "tg_console")


def post(url, fields, cookie=None, headers=()):
    data = urllib.parse.urlencode(fields).encode()
    req = urllib.request.Request(url, data=data, method="POST")
    req.add_header("content-type", "application/x-www-form-urlencoded")
    if cookie:
        req.add_header("cookie", f"tg_console={cookie}")
    for k, v in headers:
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_wrong_token_is_refused_and_sign_in_returns_to_the_deep_link(gateway, browser):
    team = gateway.key_by_name("team-a")
    deep = f"/console/keys/{team['id']}"
    sign_in(browser, gateway, token="not-the-token-at-all", then=deep)
    assert heading(browser) == "Sign in"
    assert "Wrong admin token." in browser.find_element(By.CSS_SELECTOR, ".alert").text
    assert not any(c["name"] == "tg_console" for c in browser.get_cookies())
    screenshot(browser, "01-sign-in-refused")
    browser.find_element(By.NAME, "token").send_keys(ADMIN_TOKEN)
    submit(browser, browser.find_element(By.CSS_SELECTOR, "form button[type=submit]"), "Key team-a")
    assert browser.current_url == gateway.admin + deep
    assert heading(browser) == "Key team-a"
    cookie = next(c for c in browser.get_cookies() if c["name"] == "tg_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/console"
    browser.refresh()
    assert browser.current_url == gateway.admin + deep and heading(browser) == "Key team-a"
    screenshot(browser, "05-key-detail")
    # A usage deep link loads directly, and survives a reload.
    link = f"/console/usage?group=model&from={DAY_BEFORE}&to={DAY_AFTER}"
    browser.get(gateway.admin + link)
    browser.refresh()
    assert heading(browser) == "Usage"
    assert [r[0] for r in table_rows(browser, "usage")] == ["alpha-5.5", "genq3-pro"]
    # Signing out ends the session: the deep link asks for the token again.
    submit(browser, browser.find_element(By.CSS_SELECTOR, "header form button"), "Sign in")
    browser.get(gateway.admin + deep)
    assert heading(browser) == "Sign in"


def test_a_key_made_in_the_console_serves_the_sdk_until_it_is_disabled(gateway, browser):
    sign_in(browser, gateway, then="/console/keys")
    form = browser.find_element(By.CSS_SELECTOR, "form[action='/console/keys'][method=post]")
    form.find_element(By.NAME, "name").send_keys("browser-made")
    form.find_element(By.NAME, "balance").send_keys("3")
    submit(browser, form.find_element(By.CSS_SELECTOR, "button[type=submit]"), "Key created")
    # Post/redirect/get: the secret's page is a one-time link, not the answer to the POST.
    created_url = browser.current_url
    assert "/console/keys/created/" in created_url, created_url
    secret = browser.find_element(By.ID, "secret").get_attribute("value")
    assert secret.startswith("sk-tg-")
    copy = browser.find_element(By.CSS_SELECTOR, "button[data-copy=secret]")
    copy.click()
    # The clipboard write answers asynchronously (a promise in a secure context): the button
    # changes when it has.
    WebDriverWait(browser, 15).until(lambda d: copy.text == "Copied")
    screenshot(browser, "03-key-created")
    # Reloading it creates no second key and shows the secret no more (issue 46, point 2).
    old = browser.find_element(By.TAG_NAME, "html")
    browser.refresh()
    WebDriverWait(browser, 15).until(left(old))
    assert heading(browser) == "Secret already shown"
    assert secret not in browser.page_source
    made = [k for k in gateway.admin_json("GET", "/admin/keys")["data"] if k["name"] == "browser-made"]
    assert len(made) == 1, made
    browser.get(created_url + "x")
    assert heading(browser) == "Secret already shown"
    browser.get(gateway.console + "/keys/" + made[0]["id"])
    assert heading(browser) == "Key browser-made"
    # The secret is shown once: the key's own page does not show it.
    assert secret not in browser.page_source
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=secret, max_retries=0)
    reply = client.chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "hello"}])
    assert reply.choices[0].message.content
    submit(browser, browser.find_element(By.CSS_SELECTOR, "form[action$='/disable'] button"), "Key browser-made")
    assert "Key disabled" in browser.find_element(By.CSS_SELECTOR, ".notice").text
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "hello"}])
    assert not gateway.key_by_name("browser-made")["enabled"]
    submit(browser, browser.find_element(By.CSS_SELECTOR, "form[action$='/enable'] button"), "Key browser-made")
    assert client.chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "again"}]).choices
    # The keys list finds it by name, and by state.
    browser.get(gateway.console + "/keys?q=browser&state=active")
    assert [r[0] for r in table_rows(browser, "keys")] == ["browser-made"]
    browser.get(gateway.console + "/keys?q=browser&state=disabled")
    assert table_rows(browser, "keys") == []
    browser.get(gateway.console + "/keys")
    screenshot(browser, "02-keys")


def test_a_top_up_shows_its_balance_and_is_audited_and_bad_fields_are_named(gateway, browser):
    other = gateway.key_by_name("other-team")
    sign_in(browser, gateway, then=f"/console/keys/{other['id']}")
    before = usd(browser.find_element(By.ID, "balance").text)
    assert before == pytest.approx(other["balance"], abs=1e-6)
    form = browser.find_element(By.CSS_SELECTOR, "form[action$='/topup']")
    form.find_element(By.NAME, "amount").send_keys("2.5")
    form.find_element(By.NAME, "reason").send_keys("browser top-up")
    submit(browser, form.find_element(By.CSS_SELECTOR, "button"), "Key other-team")
    assert "Balance moved" in browser.find_element(By.CSS_SELECTOR, ".notice").text
    after = usd(browser.find_element(By.ID, "balance").text)
    assert after == pytest.approx(before + 2.5, abs=1e-6)
    assert gateway.key_by_name("other-team")["balance"] == pytest.approx(after, abs=1e-6)
    audit = gateway.admin_json("GET", "/admin/audit?limit=1")["data"][0]
    assert audit["reason"] == "browser top-up" and audit["delta"] == pytest.approx(2.5)
    # A field the policy refuses is named under its input, and nothing changes.
    form = browser.find_element(By.CSS_SELECTOR, "form[action$='/edit']")
    rpm = form.find_element(By.NAME, "rpm")
    rpm.clear()
    rpm.send_keys("many")
    submit(browser, form.find_element(By.CSS_SELECTOR, "button"), "Key other-team")
    assert "rpm: a whole number" in browser.find_element(By.ID, "rpm-error").text
    form = browser.find_element(By.CSS_SELECTOR, "form[action$='/edit']")
    rpm = form.find_element(By.NAME, "rpm")
    rpm.clear()
    ips = form.find_element(By.NAME, "ip_allow")
    ips.clear()
    ips.send_keys("10.0.0.0/33")
    submit(browser, form.find_element(By.CSS_SELECTOR, "button"), "Key other-team")
    assert "ip_allow" in browser.find_element(By.ID, "ip_allow-error").text
    screenshot(browser, "06-key-inline-error")
    unchanged = gateway.key_by_name("other-team")
    assert unchanged["rpm"] is None and unchanged["ip_allow"] is None
    # A valid edit is saved.
    form = browser.find_element(By.CSS_SELECTOR, "form[action$='/edit']")
    ips = form.find_element(By.NAME, "ip_allow")
    ips.clear()
    form.find_element(By.NAME, "rpm").send_keys("120")
    submit(browser, form.find_element(By.CSS_SELECTOR, "button"), "Key other-team")
    assert "Saved" in browser.find_element(By.CSS_SELECTOR, ".notice").text
    assert gateway.key_by_name("other-team")["rpm"] == 120
    # A key that has expired keeps its expiry and can still be edited.
    short = gateway.admin_json("POST", "/admin/keys", {"name": "short-lived", "ttl_secs": 1})
    expires = datetime.datetime.fromisoformat(short["expires_at"].replace("Z", "+00:00"))
    WebDriverWait(browser, 15, poll_frequency=0.2).until(lambda d: gateway.clock() > expires)
    browser.get(f"{gateway.console}/keys/{short['id']}")
    assert "expired" in browser.find_element(By.CSS_SELECTOR, ".card .state").text
    form = browser.find_element(By.CSS_SELECTOR, "form[action$='/edit']")
    form.find_element(By.NAME, "rpm").send_keys("30")
    submit(browser, form.find_element(By.CSS_SELECTOR, "button"), "Key short-lived")
    assert "Saved" in browser.find_element(By.CSS_SELECTOR, ".notice").text
    edited = gateway.key_by_name("short-lived")
    assert edited["rpm"] == 30 and edited["expires_at"] == short["expires_at"]


def test_usage_across_a_utc_midnight_equals_the_records_and_the_csv_equals_the_table(gateway, browser):
    sign_in(browser, gateway, then=f"/console/usage?group=day&from={DAY_BEFORE}&to={DAY_AFTER}")
    rows = table_rows(browser, "usage")
    # Billed and refunded apart: what the records net to is billed + refunded (≤ 0).
    shown = {r[0]: (int(r[1].replace(",", "")), usd(r[4]) + usd(r[6])) for r in rows}
    # What the records say, per UTC day (the admin API), and what the test made on each side.
    start = 1795132800  # 2026-11-20T00:00:00Z
    records = gateway.admin_json("GET", f"/admin/usage?group_by=day&start={start}&end={start + 2 * 86400}")["data"]
    by_day = {}
    for r in records:
        n, cost = by_day.get(r["day"], (0, 0.0))
        by_day[r["day"]] = (n + r["requests"], cost + r["cost"])
    made = {DAY_BEFORE: 0, DAY_AFTER: 0}
    for day, _ in gateway.midnight_requests:
        made[day] += 1
    assert made[DAY_BEFORE] == 3 and by_day[DAY_BEFORE][0] == 3
    assert shown[DAY_BEFORE][0] == by_day[DAY_BEFORE][0]
    assert shown[DAY_BEFORE][1] == pytest.approx(by_day[DAY_BEFORE][1], abs=1e-6)
    assert shown[DAY_AFTER][0] == by_day[DAY_AFTER][0] >= made[DAY_AFTER]
    assert shown[DAY_AFTER][1] == pytest.approx(by_day[DAY_AFTER][1], abs=1e-6)
    screenshot(browser, "04-usage")
    # The CSV of the same query is exactly the table's rows.
    href = browser.find_element(By.ID, "csv").get_attribute("href")
    req = urllib.request.Request(href)
    req.add_header("cookie", f"tg_console={session_cookie(browser)}")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["content-type"].startswith("text/csv")
        lines = list(csv.reader(io.StringIO(r.read().decode())))
    head = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "table#usage thead th")]
    assert lines[0] == head
    assert len(lines) - 1 == len(rows)
    for line, row in zip(lines[1:], rows):
        assert line[0] == row[0]
        assert [int(x) for x in (line[1], line[2], line[3], line[5], line[7])] == [
            int(row[i].replace(",", "")) for i in (1, 2, 3, 5, 7)
        ]
        assert float(line[4]) == pytest.approx(usd(row[4]), abs=1e-6)
    # Grouped by tag, each team's spend is its key's.
    browser.get(gateway.console + f"/usage?group=tag&tag=team&from={DAY_BEFORE}&to={DAY_AFTER}")
    teams = {r[0]: usd(r[4]) for r in table_rows(browser, "usage")}
    assert set(teams) >= {"a", "b"}


def test_a_cross_site_post_changes_nothing(gateway, browser):
    team = gateway.key_by_name("team-a")
    sign_in(browser, gateway, then="/console/keys")
    cookie = session_cookie(browser)
    target = f"{gateway.console}/keys/{team['id']}/disable"
    # Same cookie, no form token: refused.
    status, body = post(target, {}, cookie=cookie)
    assert status == 403 and "nothing was changed" in body
    # A form token of another session: refused.
    status, _ = post(target, {"csrf": "A" * 32}, cookie=cookie)
    assert status == 403
    # A page on another origin that posts to the console: refused, the key stays enabled.
    page = f"""<!doctype html><form id="f" method="post" action="{target}"><input name="csrf" value="x"></form>
<script>document.getElementById('f').submit()</script>"""

    class Evil(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = page.encode()
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    evil = http.server.HTTPServer(("127.0.0.1", 0), Evil)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://127.0.0.1:{evil.server_address[1]}/")
        # The post lands on the console's answer (the browser left the attacker's page).
        WebDriverWait(browser, 15).until(lambda d: d.current_url.startswith(gateway.admin))
        assert browser.current_url == target
        assert "403" in browser.page_source or "Refused" in browser.page_source or "other web pages" in browser.page_source
    finally:
        evil.shutdown()
    assert gateway.key_by_name("team-a")["enabled"]


def test_every_page_renders(gateway, browser):
    sign_in(browser, gateway)
    assert heading(browser) == "Overview"
    tiles = browser.find_elements(By.CSS_SELECTOR, ".tile .spend")
    assert len(tiles) == 3 and usd(tiles[2].text) > 0
    assert browser.find_element(By.CSS_SELECTOR, "svg.chart rect")
    assert "Times in UTC" in browser.find_element(By.CSS_SELECTOR, "header .tz").text
    screenshot(browser, "00-overview")
    browser.get(gateway.console + "/requests")
    assert heading(browser) == "Requests"
    rows = table_rows(browser, "requests")
    assert rows
    screenshot(browser, "07-requests")
    link = browser.find_element(By.CSS_SELECTOR, "table#requests tbody tr td:last-child a")
    submit(browser, link, "Request " + link.text)
    screenshot(browser, "08-request-detail")
    browser.get(gateway.console + "/providers")
    assert [r[0] for r in table_rows(browser, "providers")] == ["oa"]
    assert "healthy" in table_rows(browser, "providers")[0][2]
    screenshot(browser, "09-providers")
    # Both video tasks are listed; the failed one (once the poller saw it) as refunded.
    browser.get(gateway.console + "/video?status=failed")

    def failed_listed(d):
        d.refresh()
        return any(r[0] == gateway.video_failed for r in table_rows(d, "video"))

    WebDriverWait(browser, 30).until(failed_listed)
    failed = next(r for r in table_rows(browser, "video") if r[0] == gateway.video_failed)
    assert "failed" in failed[3] and "refunded" in failed[3] and failed[1].startswith("other-team")
    browser.get(gateway.console + "/video")
    assert {gateway.video_ok, gateway.video_failed} <= {r[0] for r in table_rows(browser, "video")}
    screenshot(browser, "10-video")
    # The refund is shown apart from what was billed.
    browser.get(gateway.console + f"/usage?group=key&from={DAY_BEFORE}&to={DAY_AFTER}")
    other = next(r for r in table_rows(browser, "usage") if r[0].startswith("other-team"))
    assert int(other[5]) == 1 and usd(other[6]) == pytest.approx(-usd(failed[8]), abs=1e-6)
    assert usd(other[4]) > 0


def test_the_key_page_shows_only_its_key_and_keeps_the_key_out_of_urls(gateway, browser):
    browser.delete_all_cookies()
    browser.get(gateway.url + "/me")
    browser.find_element(By.ID, "key").send_keys("sk-not-a-key-at-all")
    browser.find_element(By.CSS_SELECTOR, "#enter button").click()
    WebDriverWait(browser, 15).until(lambda d: d.find_element(By.ID, "error").is_displayed())
    assert "refused" in browser.find_element(By.ID, "error").text
    browser.find_element(By.ID, "key").send_keys(TEAM_KEY)
    browser.find_element(By.CSS_SELECTOR, "#enter button").click()
    WebDriverWait(browser, 15).until(lambda d: heading(d) == "Key team-a")
    assert TEAM_KEY not in browser.current_url
    assert browser.execute_script("return sessionStorage.getItem('tollgate_key')") == TEAM_KEY
    team = gateway.key_by_name("team-a")
    assert usd(browser.find_element(By.ID, "balance").text) == pytest.approx(team["balance"], abs=1e-6)
    ids = {r[-1] for r in table_rows(browser, "requests")}
    log = gateway.admin_json("GET", "/admin/requests?limit=500")["data"]
    own = {e["id"] for e in log if e.get("key_id") == team["id"]}
    others = {e["id"] for e in log if e.get("key_id") not in (None, team["id"])}
    assert ids and ids <= own and not ids & others
    days = {r[0]: int(r[1]) for r in table_rows(browser, "days")}
    team_midnight = [d for d, _ in gateway.midnight_requests[:2]]
    assert days.get(DAY_BEFORE) == len(team_midnight)
    screenshot(browser, "11-key-page")
    # A reload keeps the key (session storage), and the data call never carries it in a URL.
    browser.refresh()
    WebDriverWait(browser, 15).until(lambda d: heading(d) == "Key team-a")
    req = urllib.request.Request(gateway.url + "/me/data")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10)
    assert refused.value.code == 401
    req.add_header("authorization", f"Bearer {OTHER_KEY}")
    with urllib.request.urlopen(req, timeout=10) as r:
        other = json.loads(r.read())
    assert other["name"] == "other-team"
    assert not {e["id"] for e in other["requests"]} & own
    browser.find_element(By.ID, "forget").click()
    WebDriverWait(browser, 15).until(lambda d: d.find_element(By.ID, "enter").is_displayed())
    assert browser.execute_script("return sessionStorage.getItem('tollgate_key')") is None


def test_the_console_rotates_revokes_and_regroups_a_key(gateway, browser):
    """Issue 46, point 2: rotate (with a grace period, the new secret on its one-time page),
    change the group and account, and revoke, each from the key's page."""
    made = gateway.admin_json("POST", "/admin/keys", {"name": "to-rotate", "balance": 2})
    old_secret, key_id = made["key"], made["id"]
    sign_in(browser, gateway, then="/console/keys/" + key_id)
    form = browser.find_element(By.CSS_SELECTOR, "form[action$='/rotate']")
    form.find_element(By.NAME, "grace_hours").send_keys("1")
    submit(browser, form.find_element(By.CSS_SELECTOR, "button[type=submit]"), "Key created")
    new_secret = browser.find_element(By.ID, "secret").get_attribute("value")
    assert new_secret.startswith("sk-tg-") and new_secret != old_secret
    for secret in (old_secret, new_secret):
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=secret, max_retries=0)
        assert client.chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "hi"}]).choices
    # Three wrong fields: three messages, each under its field.
    browser.get(gateway.console + "/keys/" + key_id)
    edit = browser.find_element(By.CSS_SELECTOR, "form[action$='/edit']")
    for name, value in (("name", ""), ("rpm", "many"), ("tags", "oops")):
        field = edit.find_element(By.NAME, name)
        field.clear()
        if value:
            field.send_keys(value)
    submit(browser, edit.find_element(By.CSS_SELECTOR, "button[type=submit]"), "Key to-rotate")
    named = {e.get_attribute("id") for e in browser.find_elements(By.CSS_SELECTOR, "span.error")}
    assert {"name-error", "rpm-error", "tags-error"} <= named, named
    # The group and the account, in the edit form.
    browser.get(gateway.console + "/keys/" + key_id)
    edit = browser.find_element(By.CSS_SELECTOR, "form[action$='/edit']")
    group = edit.find_element(By.NAME, "group")
    group.clear()
    group.send_keys("nope")
    submit(browser, edit.find_element(By.CSS_SELECTOR, "button[type=submit]"), "Key to-rotate")
    assert browser.find_elements(By.CSS_SELECTOR, "#group-error, .error"), "the bad group is named under its field"
    assert gateway.key_by_name("to-rotate")["group"] == "default"
    # Revoke: refused without the confirmation, then done.
    browser.get(gateway.console + "/keys/" + key_id)
    revoke = browser.find_element(By.CSS_SELECTOR, "form[action$='/revoke']")
    submit(browser, revoke.find_element(By.CSS_SELECTOR, "button[type=submit]"), "Key to-rotate")
    assert gateway.key_by_name("to-rotate")["revoked_at"] is None
    revoke = browser.find_element(By.CSS_SELECTOR, "form[action$='/revoke']")
    revoke.find_element(By.NAME, "confirm").send_keys("revoke")
    submit(browser, revoke.find_element(By.CSS_SELECTOR, "button[type=submit]"), "Key to-rotate")
    assert "Key revoked" in browser.find_element(By.CSS_SELECTOR, ".notice").text
    assert gateway.key_by_name("to-rotate")["revoked_at"] is not None
    for secret in (old_secret, new_secret):
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=secret, max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "hi"}])
    screenshot(browser, "10-key-revoked")


def test_spend_is_one_figure_on_every_page(gateway, browser):
    """Issue 46, point 3: the overview, the key page's header and its spend per day, the usage
    CSV and /admin/usage say the same spend for the same data (a refunded video netted the same
    way everywhere), and the error rate says the counts it is computed over."""
    other = gateway.key_by_name("other-team")
    sign_in(browser, gateway)

    def refunded(d):
        d.get(gateway.console + "/video?status=failed")
        return any(r[0] == gateway.video_failed and "refunded" in r[3] for r in table_rows(d, "video"))

    WebDriverWait(browser, 30).until(refunded)
    total = gateway.admin_json("GET", "/admin/usage?group_by=key")
    api_total = total["total"]["cost"]
    api_other = next(r["cost"] for r in total["data"] if r["key"]["id"] == other["id"])
    assert api_other == pytest.approx(gateway.admin_json("GET", f"/admin/keys/{other['id']}/usage")["total"]["cost"], abs=1e-9)
    # The overview: the 30-day tile and the top keys.
    browser.get(gateway.console)
    tiles = browser.find_elements(By.CSS_SELECTOR, ".tile .spend")
    assert usd(tiles[2].text) == pytest.approx(api_total, abs=1e-6)
    top = {r[0].split(" ")[0]: usd(r[1]) for r in table_rows(browser, "top-keys")}
    assert top["other-team"] == pytest.approx(api_other, abs=1e-6)
    rate = browser.find_element(By.CSS_SELECTOR, "#period-2 dd:nth-of-type(4)").text
    assert " of " in rate and "logged" in rate, rate
    # The key page: its header and its spend per day.
    browser.get(gateway.console + "/keys/" + other["id"])
    header = browser.find_element(By.CSS_SELECTOR, "section.card p").text
    assert usd(header.rsplit(" ", 1)[1]) == pytest.approx(api_other, abs=1e-6), header
    per_day = sum(usd(r[2]) for r in table_rows(browser, "key-days"))
    assert per_day == pytest.approx(api_other, abs=1e-6)
    # The usage table and its CSV: billed and refunded apart, and they net to the same spend.
    browser.get(gateway.console + f"/usage?group=key&from={DAY_BEFORE}&to={DAY_AFTER}")
    row = next(r for r in table_rows(browser, "usage") if r[0].startswith("other-team"))
    assert usd(row[4]) + usd(row[6]) == pytest.approx(api_other, abs=1e-6)
    # The net spend beside them, and every amount of the table at one precision.
    assert usd(row[8]) == pytest.approx(api_other, abs=1e-6)
    amounts = [r[i] for r in table_rows(browser, "usage") for i in (4, 6, 8)]
    assert len({len(a.split(".")[1]) for a in amounts}) == 1, amounts
    # At list price and the margin (issue 66): no multiplier here, so the list cost is the spend
    # and the margin nothing, as /admin/usage says.
    listed = next(r for r in total["data"] if r["key"]["id"] == other["id"])
    assert usd(row[9]) == pytest.approx(listed["list_cost"], abs=1e-6)
    assert listed["list_cost"] == pytest.approx(api_other, abs=1e-9)
    assert usd(row[10]) == pytest.approx(listed["margin"], abs=1e-6)
    assert listed["margin"] == pytest.approx(0, abs=1e-9)


def test_the_request_log_filters_by_what_a_guardrail_did(gateway, browser):
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=OTHER_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "card 4111 1111 1111 1111"}])
    sign_in(browser, gateway, then="/console/requests?guardrail=block")
    rows = table_rows(browser, "requests")
    assert len(rows) == 1 and rows[0][1].startswith("other-team") and "content_policy_violation" in rows[0][5], rows
    assert browser.find_element(By.CSS_SELECTOR, "select[name=guardrail] option[selected]").text == "block"
    screenshot(browser, "19-requests-guardrail")
    link = browser.find_element(By.CSS_SELECTOR, "table#requests tbody tr td:last-child a")
    submit(browser, link, "Request " + link.text)
    detail = {r[0]: r[1] for r in table_rows(browser, "request")}
    assert detail["Guardrails"] == "cards:input:block:card"
    assert "4111" not in browser.page_source
    browser.get(gateway.console + "/requests?guardrail=mask")
    assert table_rows(browser, "requests") == []


def test_accounts_groups_and_plans_show_what_is_charged_the_windows_and_the_plan(gateway, browser):
    # A key of the account acme in the resale group (1.25x the price table), used once.
    key = gateway.admin_json("POST", "/admin/keys", {"name": "acme-ci", "group": "resale", "account": "acme", "balance": 5})
    gateway.chat(key["key"])
    account = gateway.admin_json("GET", "/admin/accounts/acme")
    assert account["budgets"]["5h"]["spent"] > 0
    sign_in(browser, gateway, then="/console/accounts")
    assert heading(browser) == "Accounts"
    (row,) = [r for r in table_rows(browser, "accounts") if r[0] == "acme"]
    assert usd(row[1]) == pytest.approx(account["balance"], abs=1e-6) and row[2] == "—" and row[3] == "—"
    assert row[4] == "100 rpm" and row[5] == "1", row
    submit(browser, browser.find_element(By.LINK_TEXT, "acme"), "Account acme")
    # Its windows as the admin API says them: cap, spent, and when the rolling one frees.
    windows = {r[0]: r for r in table_rows(browser, "windows")}
    assert set(windows) == {"day", "5h"}, windows
    for name in ("day", "5h"):
        assert usd(windows[name][1]) == account["budgets"][name]["cap"]
        assert usd(windows[name][2]) == pytest.approx(account["budgets"][name]["spent"], abs=1e-6)
    assert windows["5h"][4] == account["budgets"]["5h"]["next_frees_at"]
    assert "its keys' groups' multipliers" in browser.find_element(By.CSS_SELECTOR, "section.card").text
    screenshot(browser, "14-account")
    # A multiplier of 0 is refused under its field, nothing changed.
    field = browser.find_element(By.NAME, "price_multiplier")
    field.clear()
    field.send_keys("0")
    submit(browser, browser.find_element(By.CSS_SELECTOR, "form.grid button[type=submit]"), "Account acme")
    assert "above 0" in browser.find_element(By.ID, "price_multiplier-error").text
    assert gateway.admin_json("GET", "/admin/accounts/acme")["price_multiplier"] is None
    # The plan starter, a multiplier of 0.8 and a top-up with its reason, in one save.
    for name, value in (("plan", "starter"), ("price_multiplier", "0.8"), ("amount", "5"), ("reason", "console renewal")):
        field = browser.find_element(By.NAME, name)
        field.clear()
        field.send_keys(value)
    submit(browser, browser.find_element(By.CSS_SELECTOR, "form.grid button[type=submit]"), "Account acme")
    assert browser.find_element(By.CSS_SELECTOR, "p.notice").text == "Saved."
    after = gateway.admin_json("GET", "/admin/accounts/acme")
    assert after["plan"] == "starter" and after["price_multiplier"] == 0.8
    # The top-up and the plan's first credit (granted into the balance, spent first).
    assert after["balance"] == pytest.approx(account["balance"] + 5 + 2, abs=1e-9)
    standing = after["plan_standing"]
    assert standing["name"] == "starter" and standing["granted"] and standing["left"] == 2.0, standing
    plan = browser.find_element(By.ID, "plan").text
    assert "starter" in plan and "$2.00 left of $2.00" in plan, plan
    assert usd(browser.find_element(By.ID, "balance").text) == pytest.approx(after["balance"], abs=1e-6)
    # The plan's own window is not the account's: the account's table keeps its two.
    assert {r[0] for r in table_rows(browser, "windows")} == {"day", "5h"}
    audit = gateway.admin_json("GET", "/admin/audit")["data"]
    assert any(e["id"] == "acme" and e["delta"] == 5.0 and e.get("reason") == "console renewal" for e in audit), audit[:4]
    # The key now pays its account's multiplier, and its page says so.
    view = gateway.admin_json("GET", f"/admin/keys/{key['id']}")
    assert (view["price_multiplier"], view["price_multiplier_from"]) == (0.8, "account"), view
    browser.get(gateway.console + f"/keys/{key['id']}")
    assert "0.8×" in browser.find_element(By.ID, "price-multiplier").text
    # Groups and plans: each group's multiplier and keys, each plan with who is under it.
    browser.get(gateway.console + "/groups")
    assert heading(browser) == "Groups and plans"
    groups = {r[0]: r for r in table_rows(browser, "groups")}
    assert groups["default"][1] == "—" and groups["resale"][1] == "1.25×" and groups["resale"][4] == "1", groups
    (starter,) = table_rows(browser, "plans")
    assert starter[:5] == ["starter", "$2.00", "month", "no", "—"] and starter[5] == "5h $1.50" and starter[7] == "acme", starter
    screenshot(browser, "15-groups-and-plans")


def test_an_operator_sets_a_teams_claude_code_settings_in_the_console(gateway, browser):
    sign_in(browser, gateway, then="/console/accounts/acme")
    assert heading(browser) == "Account acme"
    box = browser.find_element(By.ID, "claude_code")
    # Not an object: refused with why, what was typed kept, nothing stored.
    box.clear()
    box.send_keys('["WebFetch"]')
    submit(browser, browser.find_element(By.ID, "save-claude-code"), "Account acme")
    assert "a JSON object" in browser.find_element(By.CSS_SELECTOR, "p.alert").text
    assert browser.find_element(By.ID, "claude_code").get_attribute("value") == '["WebFetch"]'
    assert gateway.admin_json("GET", "/admin/accounts/acme")["claude_code"] is None
    box = browser.find_element(By.ID, "claude_code")
    box.clear()
    box.send_keys('{"permissions": {"deny": ["WebFetch"]}, "env": {"TEAM": "acme"}}')
    submit(browser, browser.find_element(By.ID, "save-claude-code"), "Account acme")
    assert browser.find_element(By.CSS_SELECTOR, "p.notice").text == "Saved."
    stored = gateway.admin_json("GET", "/admin/accounts/acme")["claude_code"]
    assert stored == {"permissions": {"deny": ["WebFetch"]}, "env": {"TEAM": "acme"}}
    assert '"TEAM": "acme"' in browser.find_element(By.ID, "claude_code").get_attribute("value")
    # Emptied: none stored.
    browser.find_element(By.ID, "claude_code").clear()
    submit(browser, browser.find_element(By.ID, "save-claude-code"), "Account acme")
    assert gateway.admin_json("GET", "/admin/accounts/acme")["claude_code"] is None


def test_the_console_shows_the_response_caches_hits_and_what_they_saved(gateway, browser):
    """Issue 70: a key's hits and the money they saved, in the usage table (and its CSV) and
    on the request's own page."""
    made = gateway.admin_json("POST", "/admin/keys", {"name": "cached-key", "balance": 1.0})
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=made["key"], max_retries=0)
    ask = dict(model="alpha-5.5", temperature=0, messages=[{"role": "user", "content": "cache me"}],
               extra_headers={"x-tollgate-cache": "ttl=600"})
    heads = [client.chat.completions.with_raw_response.create(**ask).headers["x-tollgate-cache"] for _ in range(3)]
    assert heads == ["miss", "hit", "hit"]
    sign_in(browser, gateway, then=f"/console/usage?group=key&key={made['id']}&from={DAY_BEFORE}&to={DAY_AFTER}")
    head = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "table#usage thead th")]
    row = table_rows(browser, "usage")[0]
    hits, saved = row[head.index("Cache hits")], usd(row[head.index("Saved by the cache")])
    listed = next(r for r in gateway.admin_json("GET", "/admin/usage?group_by=key")["data"] if r["key"]["id"] == made["id"])
    assert (int(hits), listed["cache_hits"]) == (2, 2)
    assert saved == pytest.approx(listed["cache_saved"], abs=1e-9) and saved > 0
    # The request's page: what the cache did, and what it saved.
    browser.get(gateway.console + f"/requests?key={made['id']}")
    browser.find_element(By.CSS_SELECTOR, "table#requests tbody tr td:last-child a").click()
    WebDriverWait(browser, 15).until(lambda d: heading(d).startswith("Request "))
    fields = {r[0]: r[1] for r in table_rows(browser, "request")}
    assert fields["Response cache"].startswith("hit (saved $"), fields
    screenshot(browser, "25-request-cache-hit")
