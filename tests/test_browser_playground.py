"""The playground's page in headless Chromium: a real completion and verdict, the launch token
kept in a cookie, and a layout that holds at 1280x800 (the completion wraps and scrolls inside
its box). Screenshots go to tests/artifacts/."""

from __future__ import annotations

import pytest
from test_browser import ARTIFACTS, browser, errors, wait  # noqa: F401 (browser is a fixture)

from selenium.webdriver.common.by import By

VIEWPORT = {"width": 1280, "height": 800}

pytestmark = pytest.mark.browser  # headless Chromium: `make test-quick` leaves these out


@pytest.fixture
def viewport(browser):  # noqa: F811
    """The page's viewport set to exactly 1280x800 CSS pixels (window chrome does not count)."""
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {**VIEWPORT, "deviceScaleFactor": 1, "mobile": False})
    yield browser
    browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def body_attribute(driver, name: str):
    return driver.find_element(By.TAG_NAME, "body").get_attribute(name)


def run_completion(driver) -> None:
    driver.find_element(By.ID, "run").click()
    wait(driver, lambda d: body_attribute(d, "data-finished") == "true", 60)


def overflow(driver) -> dict:
    """How far the completion box and the page reach past their bounds (0 = nothing sticks out)."""
    return driver.execute_script("""
        const box = document.getElementById('output'), rect = box.getBoundingClientRect();
        const root = document.documentElement;
        return {box_horizontal: box.scrollWidth - box.clientWidth,
                box_right_edge: Math.max(0, rect.right - root.clientWidth),
                page_horizontal: root.scrollWidth - root.clientWidth,
                box_height: box.getBoundingClientRect().height,
                box_scrolls: box.scrollHeight > box.clientHeight};""")


def test_playground_completes_a_prompt_and_shows_the_verdict(browser, server):  # noqa: F811
    browser.get(server.url + "playground?token=" + server.token)
    wait(browser, lambda d: body_attribute(d, "data-ready") == "true")
    assert "token=" not in browser.current_url  # the page moved the token out of the address bar
    assert "checkpoint-0000" in browser.find_element(By.ID, "model").text
    options = browser.find_elements(By.CSS_SELECTOR, "#task option")
    assert options[0].get_attribute("value") == ""  # free text first, then every dev task
    assert len(options) == 1 + 32 and all(o.get_attribute("value").startswith("dev-") for o in options[1:])
    assert {g.get_attribute("label") for g in browser.find_elements(By.CSS_SELECTOR, "#task optgroup")} >= {
        "double", "increment"}
    run_completion(browser)
    verdict = browser.find_element(By.ID, "verdict")
    assert "hidden tests passed" in verdict.text, verdict.text
    assert verdict.get_attribute("class") in ("passed", "failed", "invalid", "limit")
    rows = browser.find_elements(By.CSS_SELECTOR, "#cases tbody tr")
    assert len(rows) == 3 and all(r.get_attribute("class") in ("pass", "fail") for r in rows)
    assert all(r.find_element(By.CSS_SELECTOR, ".pill").text.split()[-1] in ("pass", "failed", "invalid", "limit")
               for r in rows)
    output = browser.find_element(By.ID, "output").text
    assert output.startswith("# Complete this Python function.")
    assert "tokens in" in browser.find_element(By.ID, "stats").text
    browser.save_screenshot(str(ARTIFACTS / "playground.png"))
    # reloading without the token works: the cookie carries it
    browser.refresh()
    wait(browser, lambda d: body_attribute(d, "data-ready") == "true")
    assert errors(browser) == []


def test_the_completion_box_never_overflows_at_1280x800(viewport, server):
    page = viewport
    page.get(server.launch_url.replace("/?", "/playground?"))
    wait(page, lambda d: body_attribute(d, "data-ready") == "true")
    assert page.execute_script("return [innerWidth, innerHeight]") == [1280, 800]
    empty = overflow(page)
    # a free-text prompt with no spaces, run to the cap: the real model's output is one long line
    page.execute_script("document.getElementById('task').value = '';"
                           "document.getElementById('prompt').value = 'x'.repeat(60) + 'def f(x):';")
    page.find_element(By.ID, "max-new").clear()
    page.find_element(By.ID, "max-new").send_keys("96")
    run_completion(page)
    assert page.find_element(By.ID, "error").text == ""
    assert len(page.find_element(By.ID, "output").text) > 60
    real = overflow(page)
    assert (real["box_horizontal"], real["box_right_edge"], real["page_horizontal"]) == (0, 0, 0), real
    assert real["box_height"] == empty["box_height"]  # the box keeps its size
    page.save_screenshot(str(ARTIFACTS / "playground-long-line-1280x800.png"))
    # far more text than the box holds, unbroken and in long lines: it wraps and scrolls inside the box
    page.execute_script("document.getElementById('output').textContent ="
                           " ('#'.repeat(3000) + '\\n' + 'y = f(x)  '.repeat(200) + '\\n').repeat(5);")
    stuffed = overflow(page)
    assert (stuffed["box_horizontal"], stuffed["box_right_edge"], stuffed["page_horizontal"]) == (0, 0, 0), stuffed
    assert stuffed["box_scrolls"] and stuffed["box_height"] == empty["box_height"], stuffed
    page.save_screenshot(str(ARTIFACTS / "playground-stuffed-1280x800.png"))
    assert errors(page) == []


def test_the_verdict_and_its_cases_are_on_the_first_screen_at_1280x800(viewport, server):
    """Run a task and read its verdict without scrolling: the verdict line, every hidden case's row and
    the note under them end inside the 1280x800 window, and the whole page fits it (no scrollbar)."""
    page = viewport
    page.get(server.launch_url.replace("/?", "/playground?"))
    wait(page, lambda d: body_attribute(d, "data-ready") == "true")
    first_task = page.find_elements(By.CSS_SELECTOR, "#task option")[1].get_attribute("value")
    page.execute_script("const s = document.getElementById('task'); s.value = arguments[0];"
                        "s.dispatchEvent(new Event('change'));", first_task)
    run_completion(page)
    rows = page.find_elements(By.CSS_SELECTOR, "#cases tbody tr")
    assert rows and page.find_element(By.ID, "cases").is_displayed()
    placed = page.execute_script("""
        const bottom = id => document.getElementById(id).getBoundingClientRect().bottom;
        return {verdict: bottom('verdict'), cases: bottom('cases'), note: bottom('note'),
                height: innerHeight, scrolled: scrollY, page: document.documentElement.scrollHeight};""")
    assert placed["scrolled"] == 0 and placed["page"] <= placed["height"], placed
    assert max(placed["verdict"], placed["cases"], placed["note"]) <= placed["height"], placed
    page.save_screenshot(str(ARTIFACTS / "playground-verdict-1280x800.png"))
    assert errors(page) == []


def test_the_page_without_the_token_is_refused(browser, server):  # noqa: F811
    browser.delete_all_cookies()
    browser.get(server.url + "playground")
    assert "launch token" in browser.find_element(By.TAG_NAME, "body").text
    assert body_attribute(browser, "data-ready") is None


def test_a_learner_judges_their_own_function_with_their_own_tests(viewport, server):
    """A function and two rows written in the page: the sandboxed verifier passes one row and fails the other."""
    browser = viewport
    browser.get(server.url + "playground?token=" + server.token)
    wait(browser, lambda d: body_attribute(d, "data-ready") == "true")
    errors(browser)  # what earlier tests left in the browser's log
    browser.find_element(By.CSS_SELECTOR, "#task option[value='']").click()
    assert browser.find_element(By.ID, "tests").is_displayed() and browser.find_element(By.ID, "judge").is_displayed()
    prompt, tests = browser.find_element(By.ID, "prompt"), browser.find_element(By.ID, "tests")
    prompt.clear()
    prompt.send_keys("def double(x):\n    return x + x\n")
    tests.clear()
    tests.send_keys("3 -> 6\n'ab' -> 'abba'")
    browser.find_element(By.ID, "judge").click()
    wait(browser, lambda d: body_attribute(d, "data-finished") == "true", 60)
    verdict = browser.find_element(By.ID, "verdict").text
    assert "1/2 of your tests passed" in verdict, verdict
    rows = browser.find_elements(By.CSS_SELECTOR, "#cases tbody tr")
    assert [r.get_attribute("class") for r in rows] == ["pass", "fail"]
    assert [r.find_elements(By.TAG_NAME, "td")[1].text for r in rows] == ["3", "'ab'"]
    browser.save_screenshot(str(ARTIFACTS / "playground-own-tests.png"))
    # a row that is not `arguments -> expected` is one line of error, never a failure of the server
    tests.clear()
    tests.send_keys("3 => 6")
    browser.find_element(By.ID, "judge").click()
    wait(browser, lambda d: body_attribute(d, "data-finished") == "true", 60)
    assert browser.find_element(By.ID, "error").text == "tests row 1: write `arguments -> expected`, got '3 => 6'"
    logged = errors(browser)  # the refused request (400) is the only thing the browser reports
    assert len(logged) == 1 and "/api/judge" in logged[0]["message"] and "400" in logged[0]["message"]
