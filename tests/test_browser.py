"""The deck in a real headless Chromium (Debian's `chromium` + `chromium-driver`, driven by
Selenium; the playground's page is in test_browser_playground.py). Screenshots go to
tests/artifacts/ for a person to look at."""

from __future__ import annotations

import json
import shutil
import threading
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from web_helpers import serve, stop

pytestmark = pytest.mark.browser  # headless Chromium: `make test-quick` leaves these out


webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')")
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
if not (CHROMIUM and CHROMEDRIVER):
    pytest.skip("no headless browser: install Debian's chromium and chromium-driver (.ci/run does)",
                allow_module_level=True)

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1400,900", "--no-first-run", "--disable-extensions"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    ARTIFACTS.mkdir(exist_ok=True)
    yield driver
    driver.quit()


def wait(driver, condition, seconds=20):
    return WebDriverWait(driver, seconds, poll_frequency=0.1).until(lambda d: condition(d))


def errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def counter(driver) -> str:
    return driver.find_element(By.ID, "counter").text


def test_deck_loads_without_console_errors_and_navigates(browser, server):
    browser.get(server.launch_url)  # the token moves into a cookie; later loads need no token
    wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-notes-loaded") == "true")
    slides = browser.find_elements(By.CSS_SELECTOR, ".slide")
    total = len(slides)
    assert total >= 12 and counter(browser).startswith(f"1 / {total}")
    browser.save_screenshot(str(ARTIFACTS / "deck-01-result.png"))
    body = browser.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.ARROW_RIGHT)
    assert counter(browser).startswith(f"2 / {total}") and browser.current_url.endswith("#2")
    body.send_keys(Keys.SPACE)
    body.send_keys(Keys.ARROW_LEFT)
    assert counter(browser).startswith(f"2 / {total}")
    body.send_keys("s")
    assert browser.find_element(By.CSS_SELECTOR, ".slide.active .notes").is_displayed()
    body.send_keys(Keys.ARROW_RIGHT)
    browser.save_screenshot(str(ARTIFACTS / "deck-03-architecture-with-notes.png"))
    body.send_keys(Keys.END)
    assert counter(browser).startswith(f"{total} / {total}")
    width = browser.execute_script("return document.getElementById('bar').style.width")
    assert width == "100%"
    active = [s.get_attribute("id") for s in slides if "active" in s.get_attribute("class")]
    assert active == ["sources"]
    browser.get(server.url + "?slide=5")
    assert counter(browser).startswith(f"5 / {total}")
    assert errors(browser) == []


def test_deck_opens_from_a_file_without_a_server(browser, deck_html, tmp_path):
    path = tmp_path / "deck.html"
    path.write_text(deck_html)
    browser.get(path.as_uri())
    assert counter(browser).startswith("1 / ")
    assert "in this browser" in browser.find_element(By.ID, "feedback-status").get_attribute("textContent")
    assert errors(browser) == []


def test_a_note_saved_in_the_page_survives_a_server_restart(browser, deck_html, checkpoint, tmp_path):
    first = serve(deck_html, tmp_path / "notes", checkpoint)
    note = "slow down on the bytes slide"
    try:
        browser.get(first.launch_url + "&slide=2")
        wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-notes-loaded") == "true")
        browser.find_element(By.TAG_NAME, "body").send_keys("f")
        browser.find_element(By.ID, "feedback-text").send_keys(note)
        wait(browser, lambda d: d.find_element(By.ID, "feedback-status").text == "saved on the server")
        browser.save_screenshot(str(ARTIFACTS / "deck-feedback-panel.png"))
    finally:
        stop(first)
    stored = json.loads((tmp_path / "notes" / "feedback.json").read_text())
    assert stored["feedback"] == {"bytes-vs-bpe": note}  # the second slide
    browser.execute_script("localStorage.clear()")  # the note must come back from the server, not the browser
    second = serve(deck_html, tmp_path / "notes", checkpoint)
    try:
        browser.get(second.launch_url + "&slide=2")
        wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-notes-loaded") == "true")
        assert browser.find_element(By.ID, "feedback-text").get_attribute("value") == note
        assert errors(browser) == []
    finally:
        stop(second)


def sized(driver, width: int, height: int) -> None:
    """Make the page's viewport exactly width x height CSS pixels. The window's frame is measured and
    corrected for a few times: a resize can land after the size is read (seen when shrinking from
    1920 x 1080), so one correction from a stale reading is not enough."""
    driver.set_window_size(width, height)
    for _ in range(5):
        inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
        if inner == [width, height]:
            return
        outer = driver.get_window_size()
        driver.set_window_size(outer["width"] + width - inner[0], outer["height"] + height - inner[1])
    assert driver.execute_script("return [window.innerWidth, window.innerHeight]") == [width, height]


# For the active slide: does it scroll, does anything reach outside the window or under the footer,
# and the smallest chart text on screen (font size times the SVG's on-screen scale), in CSS pixels.
MEASURE = """
const slide = document.querySelector('.slide.active');
const footer = document.getElementById('chrome').getBoundingClientRect().top;
const cut = [];
for (const el of slide.querySelectorAll('.body *')) {
  const r = el.getBoundingClientRect();
  if (r.width === 0 || r.height === 0 || el.closest('svg') && el.tagName !== 'svg') continue;
  if (r.bottom > footer + 0.5 || r.right > window.innerWidth + 0.5 || r.left < -0.5)
    cut.push(el.tagName + ' ' + (el.textContent || '').slice(0, 40));
}
let smallest = null;
for (const t of slide.querySelectorAll('svg.chart text')) {
  const m = t.getScreenCTM();
  const size = parseFloat(getComputedStyle(t).fontSize) * Math.sqrt(m.a * m.a + m.b * m.b);
  if (t.textContent.trim() && (smallest === null || size < smallest)) smallest = size;
}
return {id: slide.id, scroll: [slide.scrollHeight, slide.clientHeight, slide.scrollWidth, slide.clientWidth],
        cut: cut.slice(0, 5), smallestChartText: smallest, charts: slide.querySelectorAll('svg.chart').length};
"""


@contextmanager
def slide_by_slide(browser, deck_html, tmp_path, width: int, height: int):
    """The deck opened from a file in a width x height window: yields an iterator of slide numbers, each
    shown on a fresh page when it is reached; the window goes back to 1400 x 900 afterwards."""
    path = tmp_path / "deck.html"
    path.write_text(deck_html)
    sized(browser, width, height)

    def slides():
        browser.get(path.as_uri())
        for number in range(1, len(browser.find_elements(By.CSS_SELECTOR, ".slide")) + 1):
            browser.get(f"{path.as_uri()}#{number}")
            browser.refresh()  # a new hash alone does not reload: every slide starts from a fresh page
            yield number

    try:
        yield slides()
    finally:
        sized(browser, 1400, 900)


@pytest.mark.parametrize("width,height", [(1280, 800), (1920, 1080), (1366, 768)])  # and a short laptop screen
def test_every_slide_fits_the_window_and_chart_text_is_readable(browser, deck_html, tmp_path, width, height):
    with slide_by_slide(browser, deck_html, tmp_path, width, height) as slides:
        charts = 0
        for number in slides:
            m = browser.execute_script(MEASURE)
            scroll_height, client_height, scroll_width, client_width = m["scroll"]
            assert scroll_height <= client_height and scroll_width <= client_width, (number, m)
            assert m["cut"] == [], (number, m)
            if m["charts"]:
                charts += m["charts"]
                assert m["smallestChartText"] >= 10, (number, m)
            browser.save_screenshot(str(ARTIFACTS / f"deck-{width}x{height}-{number:02d}-{m['id']}.png"))
        assert charts >= 3
        assert errors(browser) == []


# For each chart on the active slide: the rectangle its drawing covers on screen (the SVG's viewBox
# through its screen transform), the box the page gives it, and the on-screen box of every text
# (titles, axis labels, tick labels, legends, annotations); plus the slide body's box.
MEASURE_CHARTS = """
const slide = document.querySelector('.slide.active');
const rect = r => ({left: r.left, top: r.top, right: r.right, bottom: r.bottom});
const charts = [];
for (const svg of slide.querySelectorAll('svg.chart')) {
  const vb = svg.viewBox.baseVal, m = svg.getScreenCTM();
  const a = new DOMPoint(vb.x, vb.y).matrixTransform(m);
  const b = new DOMPoint(vb.x + vb.width, vb.y + vb.height).matrixTransform(m);
  const texts = [];
  for (const t of svg.querySelectorAll('text')) {
    const r = t.getBoundingClientRect();
    if (t.textContent.trim() && r.width > 0 && r.height > 0) texts.push({text: t.textContent.trim(), ...rect(r)});
  }
  charts.push({drawn: {left: a.x, top: a.y, right: b.x, bottom: b.y},
               box: rect(svg.closest('figure').getBoundingClientRect()), texts: texts});
}
return {id: slide.id, body: rect(slide.querySelector('.body').getBoundingClientRect()), charts: charts};
"""


def chart_text_problems(chart: dict, slack: float = 1.0) -> list[str]:
    """Texts that reach outside the chart's drawing (clipped on screen), and pairs of texts whose boxes
    overlap by more than `slack` pixels both ways (written over each other)."""
    d, texts = chart["drawn"], chart["texts"]
    problems = [f"outside: {t['text']!r}" for t in texts
                if t["left"] < d["left"] - slack or t["right"] > d["right"] + slack
                or t["top"] < d["top"] - slack or t["bottom"] > d["bottom"] + slack]
    for i, a in enumerate(texts):
        for b in texts[i + 1:]:
            if (min(a["right"], b["right"]) - max(a["left"], b["left"]) > slack
                    and min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > slack):
                problems.append(f"overlap: {a['text']!r} / {b['text']!r}")
    return problems


def test_chart_text_problems_finds_clipped_and_overlapping_text():
    """The checker itself, on made-up boxes: it must not pass what a person would see as broken."""
    drawn = {"left": 0, "top": 0, "right": 100, "bottom": 50}
    fine = [{"text": "a", "left": 2, "top": 2, "right": 20, "bottom": 12},
            {"text": "b", "left": 20, "top": 2, "right": 40, "bottom": 12}]  # touching is not overlapping
    assert chart_text_problems({"drawn": drawn, "texts": fine}) == []
    clipped = fine + [{"text": "Dev selection (n=256 rollo", "left": 80, "top": 2, "right": 130, "bottom": 12}]
    assert chart_text_problems({"drawn": drawn, "texts": clipped}) == ["outside: 'Dev selection (n=256 rollo'"]
    crossed = fine + [{"text": "c", "left": 30, "top": 5, "right": 60, "bottom": 15}]
    assert chart_text_problems({"drawn": drawn, "texts": crossed}) == ["overlap: 'b' / 'c'"]


@pytest.mark.parametrize("width,height", [(1280, 800), (1920, 1080)])
def test_chart_text_stays_inside_its_chart_and_charts_take_the_space(browser, deck_html, tmp_path, width, height):
    """At both sizes, on every slide with charts: no title, label, tick label or legend text is clipped
    by its chart's edge or written over another; each drawing is as large as its box allows (it fills
    the box's width or its height), and the charts reach down to the bottom of the slide, so a larger
    window gives larger charts rather than empty space."""
    with slide_by_slide(browser, deck_html, tmp_path, width, height) as slides:
        seen = 0
        for number in slides:
            m = browser.execute_script(MEASURE_CHARTS)
            if not m["charts"]:
                continue
            seen += len(m["charts"])
            for chart in m["charts"]:
                assert len(chart["texts"]) >= 3, (number, m["id"])  # text kept as text, so it can be measured
                assert chart_text_problems(chart) == [], (number, m["id"], chart_text_problems(chart))
                d, box = chart["drawn"], chart["box"]
                fills = max((d["right"] - d["left"]) / (box["right"] - box["left"]),
                            (d["bottom"] - d["top"]) / (box["bottom"] - box["top"]))
                assert fills >= 0.97, (number, m["id"], d, box)
            lowest = max(chart["box"]["bottom"] for chart in m["charts"])
            assert lowest >= m["body"]["bottom"] - 0.03 * height, (number, m["id"], lowest, m["body"])
        assert seen >= 8
        assert errors(browser) == []


def test_hash_links_open_that_slide(browser, deck_html, tmp_path):
    path = tmp_path / "deck.html"
    path.write_text(deck_html)
    browser.get(path.as_uri() + "#5")
    total = len(browser.find_elements(By.CSS_SELECTOR, ".slide"))
    assert counter(browser).startswith(f"5 / {total}")
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ARROW_RIGHT)
    assert browser.current_url.endswith("#6") and counter(browser).startswith(f"6 / {total}")
    browser.execute_script("location.hash = '#3'")
    wait(browser, lambda d: counter(d).startswith(f"3 / {total}"))
    browser.get(path.as_uri() + "#verifier")  # a slide's id works too
    browser.refresh()
    active = browser.find_element(By.CSS_SELECTOR, ".slide.active").get_attribute("id")
    assert active == "verifier" and browser.current_url.endswith(f"#{counter(browser).split(' ')[0]}")
    assert errors(browser) == []


def test_presenter_view_shows_current_next_and_notes(browser, deck_html, tmp_path):
    path = tmp_path / "deck.html"
    path.write_text(deck_html)
    browser.get(path.as_uri() + "?presenter#3")
    slides = browser.find_elements(By.CSS_SELECTOR, "#deck .slide")

    def title(index):
        return slides[index].get_attribute("data-title")

    def notes(index):
        return slides[index].find_element(By.CSS_SELECTOR, ".notes").get_attribute("textContent")

    assert browser.find_element(By.ID, "presenter").is_displayed()
    assert not browser.find_element(By.ID, "deck").is_displayed()
    for step in (2, 3):
        current = browser.find_element(By.CSS_SELECTOR, "#presenter-current h2").text
        following = browser.find_element(By.CSS_SELECTOR, "#presenter-next h2").text
        assert (current, following) == (title(step), title(step + 1))
        assert browser.find_element(By.ID, "presenter-notes").text == notes(step).strip() != ""
        assert browser.find_element(By.ID, "presenter-clock").text.startswith(f"{step + 1} / {len(slides)}")
        browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ARROW_RIGHT)
    browser.save_screenshot(str(ARTIFACTS / "deck-presenter.png"))
    assert errors(browser) == []


# Markup a hostile receipt would plant if the escaping failed: a script, an event handler, a style
# attribute and a javascript: link. Each one, run, changes the page's title or the text's colour.
INJECTED = ("<script>document.title = 'pwned by a script'</script>"
            "<img id='injected-image' src='data:,' onerror=\"document.title = 'pwned by a handler'\">"
            "<p id='injected-style' style='color: rgb(255, 0, 0)'>styled</p>"
            "<a id='injected-link' href=\"javascript:document.title = 'pwned by a link'\">link</a>")


def test_markup_that_got_past_the_escaping_runs_nothing(browser, deck_html, checkpoint, tmp_path):
    """The content security policy alone (the escaping assumed broken: the markup is put into the deck
    as it is): served with the policy header and opened as a file with its <meta> policy, the page's own
    script runs and nothing planted does."""
    tampered = deck_html.replace('<div class="body">', '<div class="body">' + INJECTED, 1)
    path = tmp_path / "deck.html"
    path.write_text(tampered)
    srv = serve(tampered, tmp_path / "notes", checkpoint)
    try:
        for url in (srv.launch_url, path.as_uri()):
            browser.get(url)
            wait(browser, lambda d: counter(d).startswith("1 / "))  # the deck's own script ran
            browser.find_element(By.ID, "injected-link").click()
            title = browser.execute_script("return document.title")
            colour = browser.execute_script(
                "return getComputedStyle(document.getElementById('injected-style')).color")
            assert "pwned" not in title and colour != "rgb(255, 0, 0)", (url, title, colour)
            refused = [e["message"] for e in errors(browser) if "Content Security Policy" in e["message"]]
            assert refused, url  # the browser says what it refused
    finally:
        stop(srv)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def test_a_cross_origin_post_from_another_page_is_refused(browser, server, tmp_path):
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / "index.html").write_text("<!doctype html><title>another site</title><p>another site</p>")
    other = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(tmp_path / "evil")))
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://localhost:{other.server_address[1]}/")
        target = f"{server.url}api/feedback"
        payload = json.dumps({"feedback": {"result": "overwritten by another site"}})
        result = browser.execute_async_script("""
            const [target, payload, token, done] = arguments;
            const outcomes = [];
            // a simple (no-preflight) form-like POST, as a cross-site attacker would send it
            await fetch(target, {method: 'POST', mode: 'no-cors', headers: {'Content-Type': 'text/plain'},
                                 body: payload}).then(() => outcomes.push('sent'), e => outcomes.push('blocked'));
            // even holding a stolen token, the Origin gives it away
            await fetch(target, {method: 'POST', headers: {'Content-Type': 'application/json', 'X-GLM53-Token': token},
                                 body: payload}).then(r => outcomes.push(r.status), e => outcomes.push('blocked'));
            done(outcomes);""", target, payload, server.token)
        # The simple POST reaches the server and is refused (the browser then hides the reply: CORP);
        # the JSON one needs a CORS preflight, which is answered 405, so its POST is never sent.
        assert result == ["blocked", "blocked"], result
        assert server.refusals == {403: 1, 405: 1}
        assert not (server.notes.directory / "feedback.json").exists()
        assert server.notes.history("feedback") == []
        # and the page's own origin still can write
        browser.get(server.launch_url)
        wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-notes-loaded") == "true")
        browser.find_element(By.TAG_NAME, "body").send_keys("f")
        browser.find_element(By.ID, "feedback-text").send_keys("ok")
        wait(browser, lambda d: d.find_element(By.ID, "feedback-status").text == "saved on the server")
    finally:
        other.shutdown()
        other.server_close()
