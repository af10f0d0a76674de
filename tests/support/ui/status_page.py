"""Drives the status page of `zkguard serve` (GET /ui) in headless Chromium through Selenium
and chromedriver (/usr/bin/chromedriver), for tests/serve_ui.rs.

Usage: status_page.py BASE_URL SCENARIO_JSON

The scenario's `mode` picks what is done. `follow` (the default): the scenario names the monitor
the test holds (with a foreground and a background waiter), the dead letter parked beforehand,
the monitor with a stray mutex and the bearer token; after `step shown` the test releases the
holder. `actions`: the operator's actions (discard, replay all, force release, each confirmed
in a dialog) on the dead letters and the explicit lock the scenario names. `docs`: the API docs
page at /docs, rendered with nothing blocked by its content policy. The script prints one line
per step on stdout (`step NAME`), which the test reads. Every wait is for a condition in the page, never a fixed sleep. With
ZKGUARD_UI_SCREENSHOT=PATH it saves a screenshot of the page while the lock is held.
"""

import json
import os
import socket
import sys
import tempfile

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
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
        try:
            state = json.dumps(driver.execute_script(MONITORS), indent=1)
            message = driver.find_element(By.ID, "message").text
        except Exception:
            state = driver.execute_script("return document.body.textContent")[:4000]
            message = None
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


def texts(driver, what, css, parts):
    """The text of the element `css` and of its `parts` (CSS selectors inside it), read
    together, again if the page's refresh replaced the element while they were read."""

    def attempt(d):
        try:
            found = d.find_elements(By.CSS_SELECTOR, css)
            if not found:
                return False
            read = {p: found[0].find_element(By.CSS_SELECTOR, p).text for p in parts}
            read[""] = found[0].text
            return read
        except StaleElementReferenceException:
            return False

    return wait(driver, what, attempt)


def browser(scenario):
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
    return webdriver.Chrome(service=service, options=options)


def follow(driver, base, scenario):
    """The lock passing on, a replay refused then done, a stray mutex cleared."""
    held = scenario["monitor"]
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


def confirm(driver, what, accept, text=None):
    """Answers the confirmation (or prompt) the page opened: accepted, or dismissed."""
    alert = WebDriverWait(driver, WAIT, poll_frequency=0.05).until(
        EC.alert_is_present(), "no confirmation for " + what
    )
    shown = alert.text
    if text is not None:
        alert.send_keys(text)
    if accept:
        alert.accept()
    else:
        alert.dismiss()
    return shown


def present(driver, css):
    return bool(driver.find_elements(By.CSS_SELECTOR, css))


def actions(driver, base, scenario):
    """The operator's actions: the instance and an explicit lock shown; a dead letter
    discarded, the others replayed, the lock force-released, each only once confirmed."""
    driver.get(base + "/ui")
    host = socket.gethostname()
    instance = texts(driver, "the instance", "body", ["#instance-listen", "#instance-host", "#instance-id"])
    assert instance["#instance-listen"] == scenario["listen"], instance
    assert instance["#instance-host"] == host, instance
    assert instance["#instance-id"].startswith(host + ":"), instance
    lock = 'tr.explicit-lock[data-lock-id="%s"]' % scenario["lock_id"]
    row = texts(driver, "the explicit lock " + scenario["lock_id"], lock, [".lock-id", ".lock-monitor", ".lease", ".expires"])
    assert row[".lock-id"] == scenario["lock_id"], row
    assert row[".lock-monitor"] == scenario["lock_monitor"], row
    assert row[".lease"] == "4 min 0 s", row
    assert "UTC" in row[".expires"], row
    assert "nightly reindex" in row[""], row
    # The monitor's holder says it is that explicit lock, with its lease's end.
    held = 'article.monitor[data-monitor="%s"] .holder' % scenario["lock_monitor"]
    holder = texts(driver, "the holder of " + scenario["lock_monitor"], held, [".lock-id", ".expires"])
    assert holder[".lock-id"] == scenario["lock_id"], holder
    assert "UTC" in holder[".expires"], holder
    step("shown")

    driver.find_element(By.ID, "token").send_keys(scenario["token"])
    discard = 'button[data-action="discard"][data-id="%s"]' % scenario["discard"]
    letter = 'tr.deadletter[data-id="%s"]' % scenario["discard"]
    # Dismissed: nothing happens.
    click(driver, discard)
    asked = confirm(driver, "the discard", False)
    assert "Discard" in asked and scenario["discard"] in asked, asked
    assert present(driver, letter) and "Discarded" not in message(driver), message(driver)
    step("kept")

    click(driver, discard)
    confirm(driver, "the discard", True)
    wait(driver, "the discard's answer", lambda d: "Discarded" in message(d))
    wait(driver, "the discarded dead letter gone", lambda d: not present(d, letter))
    for id in scenario["replay"]:
        assert present(driver, 'tr.deadletter[data-id="%s"]' % id), id
    step("discarded")

    click(driver, 'button[data-action="replay-all"]')
    asked = confirm(driver, "the replay of all", False)
    assert "2" in asked, asked
    assert "Replayed" not in message(driver), message(driver)
    click(driver, 'button[data-action="replay-all"]')
    confirm(driver, "the replay of all", True)
    wait(driver, "the replay's answer", lambda d: "Replayed 2" in message(d) and "2 applied" in message(d))
    wait(driver, "no dead letter left", lambda d: not present(d, "tr.deadletter"))
    step("replayed-all")

    force = 'button[data-action="force-release"][data-lock-id="%s"]' % scenario["lock_id"]
    click(driver, force)
    asked = confirm(driver, "the force release", False)
    assert scenario["lock_monitor"] in asked, asked
    assert present(driver, lock) and "released" not in message(driver), message(driver)
    click(driver, force)
    confirm(driver, "the force release", True, scenario["reason"])
    wait(driver, "the force release's answer", lambda d: "Force-released" in message(d))
    wait(driver, "the released lock gone", lambda d: not present(d, lock))
    assert driver.execute_script("return document.cookie") == "", "the page set a cookie"
    step("forced")


# Recorded from the first script of every document: the content policy's violations.
VIOLATIONS = """
window.__violations = [];
document.addEventListener('securitypolicyviolation', function (e) {
  window.__violations.push(e.violatedDirective + ' ' + e.blockedURI);
});
"""

NDJSON = (
    '{"action":"index","index":"articles","id":"42","doc":{"title":"Hello"}}\n'
    '{"action":"delete","index":"articles","id":"43"}'
)


def docs(driver, base, scenario):
    """`/docs` without a token: rendered with nothing blocked, everything from the service,
    and the NDJSON example shown as lines."""
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": VIOLATIONS})
    driver.get(base + "/docs")
    logo = wait(driver, "the logo", lambda d: d.find_elements(By.CSS_SELECTOR, 'img[alt="redocly logo"]'))[0]
    wait(driver, "the logo loaded", lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", logo))
    assert logo.get_attribute("src").startswith(base + "/"), logo.get_attribute("src")
    loaded = driver.execute_script(
        "return performance.getEntriesByType('resource').map(function (r) { return r.name; })"
    )
    assert all(u.startswith(base + "/") or u.startswith("blob:") for u in loaded), loaded
    step("rendered")

    def ndjson(d):
        return d.execute_script(
            "return Array.from(document.querySelectorAll('pre, code')).map(function (e) { return e.textContent; })"
            ".filter(function (t) { return t.indexOf('\"action\":\"delete\"') >= 0 || t.indexOf('\\\\\"action') >= 0; })"
        )

    shown = wait(driver, "the NDJSON example", ndjson)
    assert any(NDJSON in t for t in shown), shown
    assert not any('\\"' in t for t in shown), shown
    violations = driver.execute_script("return window.__violations")
    assert violations == [], violations
    step("ndjson")

def main():
    base, scenario = sys.argv[1], json.loads(sys.argv[2])
    mode = scenario.get("mode", "follow")
    driver = browser(scenario)
    try:
        {"follow": follow, "actions": actions, "docs": docs}[mode](driver, base, scenario)
    except WebDriverException as e:
        print("browser failure: %s" % e, file=sys.stderr)
        raise
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
