"""What the console's browser tests share: the gateway's keys and clock, and screenshots."""
import datetime
import os

from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN_DIR = os.environ.get("TOLLGATE_BIN_DIR", os.path.join(ROOT, "target", "debug"))
SHOTS = os.environ.get("TOLLGATE_SCREENSHOTS", os.path.join(ROOT, "target", "console-screenshots"))
UPSTREAM_KEY = "mock-upstream-key-console"
ADMIN_TOKEN = "console-admin-token-0123456789"
TEAM_KEY = "sk-console-team-0001-0123456789abcdef"
OTHER_KEY = "sk-console-other-0001-0123456789abcdef"
# The gateway starts at this time (UTC) and its clock runs on: the first requests are billed on
# DAY_BEFORE, the later ones on DAY_AFTER.
START = "2026-11-20 23:59:53"
DAY_BEFORE, DAY_AFTER = "2026-11-20", "2026-11-21"
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
MIDNIGHT = datetime.datetime(2026, 11, 21, tzinfo=datetime.timezone.utc)


def screenshot(driver, name):
    """The page as a 1280×800 PNG under target/console-screenshots/."""
    driver.save_screenshot(os.path.join(SHOTS, f"{name}.png"))


def left(old):
    """A wait condition: the page `old` (its <html>) was replaced. ChromeDriver reports an
    element of a replaced page as stale or, at times, as a node outside the document."""

    def check(_driver):
        try:
            old.is_enabled()
            return False
        except (StaleElementReferenceException, WebDriverException):
            return True

    return check
