"""Drives the status page of `zkguard serve` (GET /ui) in headless Chromium through Selenium
and chromedriver (/usr/bin/chromedriver), for tests/serve_ui.rs.

Usage: status_page.py BASE_URL SCENARIO_JSON

The scenario names the monitor the test holds (with a foreground and a background waiter), the
dead letter parked beforehand, the monitor with a stray mutex and the bearer token. The script
prints one line per step on stdout (`step NAME`), which the test reads: after `step shown` the
test releases the holder. Every wait is for a condition in the page, never a fixed sleep. With
ZKGUARD_UI_SCREENSHOT=PATH it saves a screenshot of the page while the lock is held.
"""

import json
import os
import sys
import tempfile

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

WAIT = 20

# The monitors as the page shows them, read in one script so that a refresh in between cannot
# mix two versions of the page.
MONITORS = """
return Array.from(document.querySelectorAll('article.monitor')).map(function (a) {
  var holder = a.querySelector('.holder .owner');
  var info = a.querySelector('.holder .info');
  return {
    monitor: a.getAttribute('data-monitor'),
    name: a.querySelector('code.name').textContent,
    markup: a.querySelector('code.name').children.length,
    holder: holder ? holder.textContent : null,
    info: info ? info.textContent : null,
    token: (a.querySelector('.token') || {}).textContent || null,
    stray: a.classList.contains('stray'),
    waiters: Array.from(a.querySelectorAll('li.waiter')).map(function (li) {
      return { node: li.getAttribute('data-node'), cls: li.className,
               info: (li.querySelector('.info') || {}).textContent || null };
    })
  };
});
"""


def step(name):
    print("step " + name, flush=True)


def monitor(driver, name):
    for m in driver.execute_script(MONITORS):
        if m["monitor"] == name:
            return m
    return None


def wait(driver, what, cond):
    try:
        return WebDriverWait(driver, WAIT, poll_frequency=0.05).until(lambda d: cond(d))
    except Exception:
        state = json.dumps(driver.execute_script(MONITORS), indent=1)
        message = driver.find_element(By.ID, "message").text
        raise AssertionError(
            "the page did not show %s within %ss; monitors: %s; message: %r"
            % (what, WAIT, state, message)
        )


def click(driver, css):
    """Clicks the element, again if the page's refresh replaced it in between."""

    def attempt(d):
        try:
            d.find_element(By.CSS_SELECTOR, css).click()
            return True
        except StaleElementReferenceException:
            return False

    wait(driver, "a clickable " + css, attempt)


def message(driver):
    return driver.find_element(By.ID, "message").text


def main():
    base, scenario = sys.argv[1], json.loads(sys.argv[2])
    held = scenario["monitor"]
    options = webdriver.ChromeOptions()
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,1400",
        "--user-data-dir=" + tempfile.mkdtemp(prefix="zkguard-ui-"),
    ):
        options.add_argument(arg)
    options.binary_location = scenario.get("chromium", "/usr/bin/chromium")
    service = Service(executable_path=scenario.get("chromedriver", "/usr/bin/chromedriver"))
    driver = webdriver.Chrome(service=service, options=options)
    try:
        driver.get(base + "/ui")

        # The holder, then its queue: the foreground waiter before the background one, although
        # the background one queued first. The monitor's name is text, not markup.
        def shown(d):
            m = monitor(d, held)
            return m if m and m["holder"] and len(m["waiters"]) == 2 else None

        m = wait(driver, "the holder and two waiters of " + held, shown)
        assert m["name"] == held and m["markup"] == 0, m
        assert m["info"] == "test holder", m
        assert m["token"] and m["token"].startswith("token "), m
        classes = [w["cls"] for w in m["waiters"]]
        nodes = [w["node"] for w in m["waiters"]]
        assert classes == ["waiter foreground", "waiter background"], m
        assert nodes[0].startswith("A-") and nodes[1].startswith("B-"), m
        assert [w["info"] for w in m["waiters"]] == ["fg waiter", "bg waiter"], m
        letter = driver.find_element(By.CSS_SELECTOR, 'tr.deadletter[data-id="%s"]' % scenario["deadletter"])
        assert "retries exhausted" in letter.text, letter.text
        stray = monitor(driver, scenario["stray"])
        assert stray and stray["stray"], stray
        shot = os.environ.get("ZKGUARD_UI_SCREENSHOT")
        if shot:
            height = driver.execute_script("return document.documentElement.scrollHeight")
            driver.set_window_size(1280, min(max(height + 120, 800), 2400))
            driver.save_screenshot(shot)
            driver.set_window_size(1280, 1400)
        step("shown")

        # The test releases the holder: the foreground waiter holds the lock now, the background
        # one still waits.
        def passed(d):
            m = monitor(d, held)
            return m and m["info"] == "fg waiter" and [w["info"] for w in m["waiters"]] == ["bg waiter"]

        wait(driver, "the lock passed on to the foreground waiter", passed)
        step("passed")

        # Replay without the token: refused, and the page says so.
        replay = 'button[data-action="replay"][data-id="%s"]' % scenario["deadletter"]
        click(driver, replay)
        wait(driver, "the refusal of the replay", lambda d: "Refused (401)" in message(d))
        step("refused")

        # With the token typed into the page: replayed.
        field = driver.find_element(By.ID, "token")
        field.send_keys(scenario["token"])
        click(driver, replay)
        wait(driver, "the replay's success", lambda d: "applied" in message(d) and "Replayed" in message(d))
        wait(
            driver,
            "the replayed dead letter gone",
            lambda d: not d.find_elements(By.CSS_SELECTOR, replay),
        )
        step("replayed")

        # The stray mutex, cleared from the page with the token kept in the tab.
        click(driver, 'button[data-action="clear-stray"][data-monitor="%s"]' % scenario["stray"])
        wait(driver, "the stray mutex removed", lambda d: "removed" in message(d))
        wait(driver, "the stray monitor gone", lambda d: monitor(d, scenario["stray"]) is None)
        assert driver.execute_script("return document.cookie") == "", "the page set a cookie"
        step("cleared")
    except WebDriverException as e:
        print("browser failure: %s" % e, file=sys.stderr)
        raise
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
