"""`glm53 slides build`: every number comes from the receipts it is given, the build is
deterministic, the deck fetches nothing from the network, and missing studies say what makes them."""

from __future__ import annotations

import html
import json
import re
import shutil
from html.parser import HTMLParser

import pytest
from web_helpers import RESULTS

from glm53_flash.cli import main
from glm53_flash.experiments.registry import deck_entries, study_of
from glm53_flash.report.slides import RELEASED, build_deck as build_deck_with

# The deck's study slides, as `glm53 slides build` reads them from the study registry: (slide id, title, command,
# summary under the results directory).
STUDIES = [(e.slide_id, e.title, e.command, e.summary) for e in deck_entries()]


def build_deck(runs):
    return build_deck_with(runs, deck_entries(), study_of)

# The story, in order (a study's story slide is its first deck entry's id; its rerun joins it there); the
# appendix follows, from the glossary to the sources.
STORY = ["title", "bytes-vs-bpe", "architecture-block", "experts", "streams", "architecture", "pretraining",
         "verifier", "rloo", "example", "splits", "scoring", "draws", "counting", "headline", "vision",
         "research-pretraining-data", "research-rl-choices", "research-rl-choices-compositions",
         "research-rl-generalisation", "research-rl-switches", "research-pretrain-switches", "playground"]
APPENDIX_START = ["glossary", "glossary-2", "glossary-3", "methods", "headline-tests", "headline-cells", "result", "arms",
                  "result-chart", "selection", "confirmation", "failures"]
REPO = RESULTS.parent


@pytest.fixture(scope="module")
def deck():
    return build_deck(RESULTS)


@pytest.mark.slow
def test_course_order_and_no_network_fetches(deck):
    ids = re.findall(r'<section class="slide[^"]*" id="([^"]+)"', deck)
    story = re.findall(r'<section class="slide" id="([^"]+)"', deck)  # the appendix's slides have a class of their own
    assert story == STORY and ids[:len(STORY)] == STORY
    assert ids[len(STORY):len(STORY) + len(APPENDIX_START)] == APPENDIX_START and ids[-1] == "sources"
    for slide_id, *_ in STUDIES:  # every study's answer is in the appendix, in the registry's order
        assert f"{slide_id}-answer" in ids
    assert [i for i in ids if i.endswith("-answer")] == [f"{slide_id}-answer" for slide_id, *_ in STUDIES]
    for pattern in (r'src="(?!data:)', r'href="https?:', r"@import", r"url\((?!#)", r"https?://"):
        assert not re.search(pattern, deck), pattern
    assert deck.count('<aside class="notes">') == len(ids)
    assert '<aside class="notes"></aside>' not in deck  # every slide has speaker notes
    assert "@media print" in deck and "break-after: page" in deck


def test_numbers_come_from_the_code_and_the_receipts(deck):
    summary = json.loads((RESULTS / "headline" / "ours" / "summary.json").read_text())
    first = summary["seeds"][str(summary["plan"]["rl_seeds"][0])]["greedy_trained"]
    assert f"{first['before_solved']}/24" in deck and f"{first['after_solved']}/24" in deck
    assert "25,730,592" in deck and "9,805,344" in deck  # GLM53Flash.parameter_counts() of the flash preset
    assert "320B" in deck and "154,880" in deck  # published, with the source named on the slide
    assert "passed" in deck and "invalid" in deck  # verifier verdicts computed at build time


@pytest.mark.slow
def test_build_is_deterministic_and_follows_its_inputs(tmp_path, deck):
    runs = tmp_path / "results"
    shutil.copytree(RESULTS, runs)
    assert build_deck(runs) == deck
    summary_path = runs / "headline" / "ours" / "summary.json"
    summary = json.loads(summary_path.read_text())
    seed = str(summary["plan"]["rl_seeds"][0])
    summary["seeds"][seed]["greedy_trained"]["after_solved"] = 23
    summary_path.write_text(json.dumps(summary))
    assert "23/24" in build_deck(runs) and "23/24" not in deck


def slides_of(deck) -> dict[str, str]:
    """Each slide's whole section, by id."""
    return {m.group(1): m.group(0) for m in re.finditer(r'<section class="slide[^"]*" id="([^"]+)".*?</section>',
                                                        deck, re.S)}


@pytest.mark.slow
def test_study_summaries_render_generically_or_name_their_command(tmp_path, deck):
    from glm53_flash.report.glossary import cell, rl_arm_names

    sections = slides_of(deck)
    for slide_id, _, command, relative in STUDIES:
        summary_path = RESULTS / relative
        tables = "".join(text for key, text in sections.items() if key.startswith(f"{slide_id}-table"))
        if summary_path.exists():  # committed results: their own table (the code's identifiers in words), escaped
            summary = json.loads(summary_path.read_text())
            table, names = summary["headline_table"], rl_arm_names(summary.get("arms"))
            cells = html.unescape(re.sub(r"<[^>]+>", "|", tables)).replace("\u00a0", " ").replace("\u2011", "-")
            assert all(f"|{cell(c, names)}|" in cells for c in table["columns"]), slide_id
            for row in table["rows"]:  # every value as the summary has it (kept on one line, never changed)
                assert all(f"|{cell(c, names)}|" in cells for c in row), (slide_id, row)
        else:
            assert command in sections[slide_id] and relative in sections[slide_id], slide_id
    runs = tmp_path / "results"
    shutil.copytree(RESULTS, runs)
    for _, _, _, relative in STUDIES:
        (runs / relative).unlink(missing_ok=True)
    missing = build_deck(runs)
    for _, _, command, relative in STUDIES:  # absent studies name the command that makes them
        assert command in missing and relative in missing
    (runs / "vision" / "summary.json").write_text(json.dumps({
        "headline_table": {"columns": ["arm", "held-out accuracy"], "rows": [["faithful", "0.917"]]},
        "answers": ["The faithful arm <wins> on held-out digits."]}))
    built = slides_of(build_deck(runs))
    assert "<th>held-out accuracy</th>" in built["vision-table"] and "<td>0.917</td>" in built["vision-table"]
    assert "&lt;wins&gt;" in built["vision-answer"]  # text from receipts is escaped
    assert "glm53 vision train" not in built["vision"]


@pytest.mark.slow
def test_cli_build_and_run_directory_layout(tmp_path, capsys):
    out = tmp_path / "deck.html"
    assert main(["slides", "build", "--output", str(out)]) == 0
    assert out.read_text().startswith("<!doctype html>") and "wrote" in capsys.readouterr().out
    run = tmp_path / "demo"  # a reproduce directory: the two-arm summary.json at its top, the arms in it
    shutil.copytree(RESULTS / "headline", run)
    assert main(["slides", "build", "--runs", str(run), "--output", str(tmp_path / "d2.html")]) == 0
    assert main(["slides", "build", "--runs", str(tmp_path / "nothing"), "--output", str(tmp_path / "x.html")]) == 2
    assert "make demo" in capsys.readouterr().err


@pytest.mark.slow
def test_the_deck_describes_the_model_the_run_trained(tmp_path):
    from glm53_flash.model.config import ModelConfig
    from glm53_flash.model import GLM53Flash

    runs = tmp_path / "results"
    shutil.copytree(RESULTS, runs)
    summary_path = runs / "headline" / "ours" / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["plan"]["pretrain"]["preset"], summary["plan"]["pretrain"]["model_overrides"] = "tiny", {}
    summary_path.write_text(json.dumps(summary))
    deck = build_deck(runs)
    tiny = ModelConfig.preset("tiny")
    total = GLM53Flash(tiny).parameter_counts()["total"]
    pattern = tiny.attention_pattern
    assert f"{total:,}" in deck
    assert f"Attention in a rhythm: {pattern.count('linear')} linear, {pattern.count('sparse')} sparse" in deck
    title = slides_of(deck)["title"]
    assert "25.7 million" not in title and f"{total / 1e3:.0f} thousand" in title


def test_every_file_a_slide_cites_is_in_the_repository(deck):
    cited = re.findall(r'data-path="([^"]+)"', deck)
    assert "docs/GLM_MAPPING.md" in cited
    text = re.sub(r"<svg.*?</svg>", "", deck, flags=re.S)
    text = html.unescape(re.sub(r"<[^>]+>", " ", text[:text.index("<script>")]))
    named = re.findall(r"\b((?:docs|results|glm53_flash|tests|slides|shared)/[\w./-]*\w)", text)
    assert named, "the deck names no repository file at all"
    for path in set(cited) | set(named):
        assert (REPO / path).exists(), f"the deck cites {path}, which is not in the repository"
    mapping = (REPO / "docs" / "GLM_MAPPING.md").read_text()
    for number in (RELEASED["total_parameters"], RELEASED["active_parameters"], "154,880", RELEASED["context"]):
        assert number in mapping, number  # the cited table holds the published numbers shown


def test_no_slide_shows_placeholder_content(deck):
    sections = slides_of(deck)
    for slide_id in STORY:
        assert "missing" not in sections[slide_id] and "placeholder" not in sections[slide_id].lower(), slide_id
    for slide_id in ("headline", "pretraining", "rloo", "result-chart"):
        assert "<svg" in sections[slide_id], slide_id


def test_charts_are_inline_svg_with_text_and_stated_sample_sizes(deck):
    charts = re.findall(r'<svg class="chart".*?</svg>', deck, flags=re.S)
    # the story: the pretraining loss, the RL reward, the headline distribution, vision, the pretraining-data
    # curves, the RL-choices screen and confirmation on both suites, the generalisation, RL-switch and
    # pretraining-switch effects; the appendix: per seed, selection, families, the pretraining-data
    # differences, and the two reruns' effects
    assert len(charts) == 18
    for svg in charts:
        assert "<text" in svg and re.search(r"n=\d|of \d+", svg)  # each chart says how much it counts
        assert not re.search(r'<svg[^>]*\swidth="', svg)  # sized by the page, not fixed
    ids = re.findall(r'\sid="([^"]+)"', deck)
    assert len(ids) == len(set(ids)), "element ids repeat across charts"


def test_chart_fixes_reference_inside_axis_error_bars_and_families(tmp_path):
    from glm53_flash.report.headline import (draw_family_changes, draw_greedy, family_chart_data,
                                             greedy_chart_data)

    from glm53_flash.report.summary import RunSummary

    summary = RunSummary.read(RESULTS / "headline" / "ours" / "summary.json")
    for v in summary.seeds.values():  # a quick run: 12 tasks, fewer solved than the original's 16
        v["greedy_trained"].update(tasks=12, before_solved=2, after_solved=5)
    data = greedy_chart_data(summary)
    fig = draw_greedy(data)
    ax = fig.axes[0]
    assert data["reference"]["value"] == pytest.approx(100 * 16 / 24)
    assert ax.get_ylim()[0] <= data["reference"]["value"] <= ax.get_ylim()[1]
    assert any("n=12" in t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))
    assert ax.containers and any(type(c).__name__ == "ErrorbarContainer" for c in ax.containers)

    families = family_chart_data(summary)
    fig = draw_family_changes(families)
    bars = [p for c in fig.axes[0].containers if type(c).__name__ == "BarContainer" for p in c
            if p.get_height() != 0]
    hatched = {round(b.get_x() + b.get_width() / 2) for b in bars if b.get_hatch()}
    solid = {round(b.get_x() + b.get_width() / 2) for b in bars if not b.get_hatch()}
    order = families["families"]
    assert {order[i] for i in hatched} <= set(summary.untrained_families)
    assert {order[i] for i in solid} <= set(summary.trained_families)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]  # the figure's legend, outside the data
    assert any("hatched" in label for label in labels) and any("solid" in label for label in labels)


def test_the_ledger_history_is_in_the_notes_not_on_the_result_slide(deck):
    """How often a split was opened, and why it was reopened, is process: the speaker's notes of the
    result slide carry it; the slide itself shows the result."""
    section = re.search(r'<section class="slide[^"]*" id="result".*?</section>', deck, re.S).group(0)
    body, notes = section.split('<aside class="notes">', 1)
    assert "The ledger records" not in body and "reopened" not in body
    assert "The ledger records" in notes


@pytest.mark.slow
def test_each_study_with_a_summary_shows_its_charts(tmp_path, deck):
    """The charts of a study's REPORT.md are on its slide (a rerun's in the appendix), drawn from the same
    summary.json (so a changed summary changes the chart), and a study without a summary gets no chart."""
    sections = slides_of(deck)
    for slide_id, _, _, relative in STUDIES:
        where = f"{slide_id}-charts" if slide_id.endswith("-rerun") else slide_id
        assert '<svg class="chart"' in sections[where], slide_id
    from glm53_flash.report.glossary import rl_arm_names

    charts = sections["research-rl-choices"]
    summary = json.loads((RESULTS / "rl-choices" / "summary.json").read_text())
    names = rl_arm_names(summary["arms"])
    assert len(names) == len(summary["arms"])  # every arm, in words, is a tick label
    assert all(f">{html.escape(names[arm['arm']])}<" in charts for arm in summary["arms"])
    assert f"(n={summary['confirmation']['n']})" in charts
    runs = tmp_path / "results"
    shutil.copytree(RESULTS, runs)
    summary["confirmation"]["n"] = 77
    (runs / "rl-choices" / "summary.json").write_text(json.dumps(summary))
    (runs / "vision" / "summary.json").unlink()
    built = slides_of(build_deck(runs))
    assert "(n=77)" in built["research-rl-choices"] and "<svg" not in built["vision"]


def test_no_slide_shows_process_text(deck):
    """Slides show results and how to read them; how a split was opened and reopened, install paths and
    version-control states belong in the notes and the reports."""
    for section in re.findall(r'<section class="slide".*?</section>', deck, re.S):
        body = section.split('<aside class="notes">', 1)[0]
        for word in ("ledger", "reopen", ".venv/", "+dirty", "the issue", "this session"):
            assert word not in body, (re.search(r'id="([^"]+)"', section).group(1), word)
    sources = re.search(r'<section class="slide[^"]*" id="sources".*?</section>', deck, re.S).group(0)
    assert "<th></th>" not in sources  # a header bar says what its columns are


def text_problems(fig) -> list[str]:
    """matplotlib's own layout, as the PNG will show it: texts reaching outside the figure, and pairs
    of texts whose boxes overlap (more than a pixel both ways)."""
    from matplotlib.text import Text

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    # an axis keeps labels for ticks outside its limits and does not draw them: leave those out
    undrawn = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            drawn = {id(tick) for tick in axis._update_ticks()}
            undrawn |= {id(label) for tick in axis.get_major_ticks() + axis.get_minor_ticks() if id(tick) not in drawn
                        for label in (tick.label1, tick.label2)}
    texts = [(t.get_text(), t.get_window_extent(renderer)) for t in fig.findobj(Text)
             if t.get_visible() and t.get_text().strip() and id(t) not in undrawn]
    problems = [f"outside: {text!r}" for text, b in texts
                if b.x0 < box.x0 - 1 or b.x1 > box.x1 + 1 or b.y0 < box.y0 - 1 or b.y1 > box.y1 + 1]
    for i, (text_a, a) in enumerate(texts):
        for text_b, b in texts[i + 1:]:
            if min(a.x1, b.x1) - max(a.x0, b.x0) > 1 and min(a.y1, b.y1) - max(a.y0, b.y0) > 1:
                problems.append(f"overlap: {text_a!r} / {text_b!r}")
    return problems


@pytest.mark.slow
def test_report_charts_keep_their_text_inside_and_apart():
    """Every chart the reports save as PNG, drawn at the size the report uses, from the committed
    summaries: no text cut by the figure's edge, none written over another."""
    from glm53_flash.report import figures, study_charts
    from glm53_flash.report.headline import (draw_family_changes, draw_greedy, draw_learning, draw_selection,
                                             family_chart_data, greedy_chart_data, learning_chart_data,
                                             selection_chart_data)
    from glm53_flash.report.summary import RunSummary

    run = RESULTS / "headline" / "ours"
    summary = RunSummary.read(run / "summary.json")
    studies = {name: json.loads((RESULTS / name / "summary.json").read_text())
               for name in ("pretraining-data", "rl-choices", "vision")}
    drawn = {
        "per-seed": draw_greedy(greedy_chart_data(summary)),
        "families": draw_family_changes(family_chart_data(summary)),
        "selection": draw_selection(selection_chart_data(run, summary)),
        "learning": draw_learning(learning_chart_data(run, summary)),
        "study curves": study_charts.draw_learning_curves(studies["pretraining-data"]),
        "study differences": study_charts.draw_paired_differences(studies["pretraining-data"]),
        "screen": study_charts.draw_rl_screen(studies["rl-choices"]),
        "confirmation": study_charts.draw_rl_confirmation(studies["rl-choices"], "final"),
        "vision": study_charts.draw_vision_comparison(studies["vision"]),
    }
    try:
        for name, fig in drawn.items():
            assert fig is not None, name
            assert text_problems(fig) == [], name
    finally:
        for fig in drawn.values():
            if fig is not None:
                figures.pyplot().close(fig)


def test_text_problems_sees_a_clipped_title_and_overlapping_labels():
    from glm53_flash.report import figures

    with figures.style() as plt:
        fig, ax = plt.subplots(figsize=(2, 2))
        ax.set_title("a title far too long for a figure two inches wide")
        ax.text(0.5, 0.5, "here")
        ax.text(0.52, 0.5, "here too")
    problems = text_problems(fig)
    figures.pyplot().close(fig)
    assert any(p.startswith("outside: 'a title") for p in problems)
    assert "overlap: 'here' / 'here too'" in problems


def test_a_hostile_confirm_receipt_is_escaped_on_the_example_slide(tmp_path):
    """A confirm receipt whose verdict counts are markup (not numbers) shows them as text on the slide."""
    from types import SimpleNamespace

    from glm53_flash.report.slides import slide_example

    hostile = "<script>window.pwned = 1</script>"
    confirm = tmp_path / "confirm"
    confirm.mkdir()
    for name, passed in (("before-greedy.json", False), ("rl-7-greedy.json", True)):
        episode = {"task_id": "confirm-double-000", "prompt": "def f(x):\n", "generated_completion": "    return x\n",
                   "evaluation": {"passed": passed, "status": "passed" if passed else "failed",
                                  "tests_passed": hostile, "tests_total": "<img src=x onerror=alert(1)>"}}
        (confirm / name).write_text(json.dumps({"episodes": [episode]}))
    (slide,) = slide_example(SimpleNamespace(run=tmp_path, summary=SimpleNamespace(rl_seeds=["7"])))
    body = slide.html()
    assert "<script" not in body and "<img" not in body and html.escape(hostile) in body


def test_the_deck_carries_its_policy_and_no_inline_style(deck):
    """The file itself (opened from file://, where no server sends a header) allows only its own script
    and stylesheet; charts carry presentation attributes, not style attributes."""
    from glm53_flash.report.page_policy import source_hash

    policy = html.unescape(re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)"', deck).group(1))
    scripts = re.findall(r"<script>(.*?)</script>", deck, flags=re.S)
    styles = re.findall(r"<style[^>]*>(.*?)</style>", deck, flags=re.S)
    assert "unsafe-inline" not in policy and len(scripts) == len(styles) == 1
    assert f"script-src {source_hash(scripts[0])}" in policy and f"style-src {source_hash(styles[0])}" in policy
    assert deck.index("Content-Security-Policy") < deck.index("<style>")
    assert not re.search(r"<[^>]+\sstyle=", deck) and "data-grow=" in deck


# --------------------------------------------------------------------------- the deck teaches (issue 62)


def body_html(section: str) -> str:
    """A slide's body: what the learner reads on it (its title and speaker notes aside)."""
    return section.split('<div class="body', 1)[1].split(">", 1)[1].rsplit('<aside class="notes">', 1)[0]


def visible(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", markup))


def body_words(section: str) -> int:
    """The words of a slide's body text: everything on it but its charts' drawn text and its code blocks."""
    return len(visible(re.sub(r"<svg.*?</svg>|<pre>.*?</pre>", " ", body_html(section), flags=re.S)).split())


def test_story_slides_hold_at_most_90_words_of_body_text(deck):
    from glm53_flash.report.slides import BODY_WORDS

    assert BODY_WORDS == 90
    counts = {slide_id: body_words(section) for slide_id, section in slides_of(deck).items()
              if 'class="slide appendix"' not in section}
    assert list(counts) == STORY
    assert {slide_id: n for slide_id, n in counts.items() if n > BODY_WORDS} == {}
    assert min(counts.values()) > 10  # and no slide is empty


def undefined_terms(deck: str) -> list[tuple[str, str]]:
    """(slide, term) for every glossary term a slide uses (its title, its body's text and its charts' text,
    code blocks aside) that no <dfn> on it or on an earlier slide defines."""
    from glm53_flash.report.glossary import GLOSSARY

    defined, problems = set(), []
    for slide_id, section in slides_of(deck).items():
        body = body_html(section)
        defined |= set(re.findall(r'<dfn data-term="([^"]+)"', body))
        title = html.unescape(re.search(r'data-title="([^"]*)"', section).group(1))
        text = title + " " + visible(re.sub(r"<pre>.*?</pre>", " ", body, flags=re.S))
        problems += [(slide_id, term.key) for term in GLOSSARY if term.used_in(text) and term.key not in defined]
    return problems


def test_every_term_is_defined_on_or_before_the_first_slide_that_uses_it(deck):
    from glm53_flash.report.glossary import GLOSSARY, TERMS

    assert undefined_terms(deck) == []
    assert set(re.findall(r'data-term="([^"]+)"', deck)) <= set(TERMS)
    sections = slides_of(deck)
    glossary = "".join(section for slide_id, section in sections.items() if slide_id.startswith("glossary"))
    for term in GLOSSARY:  # the glossary slides define every term, with the definition the tooltips carry
        assert f'<dfn data-term="{term.key}"' in glossary and f"<dd>{html.escape(term.definition)}</dd>" in glossary
    assert 'href="#glossary"' in sections["title"]  # the story's first slide links to it
    assert all('class="slide appendix"' in section for slide_id, section in sections.items()
               if slide_id.startswith("glossary"))
    # and the check sees a term used before its definition: Holm's, taken off the slide that defines it
    first = sections["counting"]
    without = deck.replace(first, first.replace('<dfn data-term="holm"', '<dfn data-term="token"'))
    assert ("counting", "holm") in undefined_terms(without)


class _SeriesColours(HTMLParser):
    """Every data-series of one chart's SVG and the colours its elements draw with (fill and stroke), and
    whether the chart has a legend (matplotlib's group id legend_N)."""

    NEUTRAL = {"none", "#000000", "#ffffff", "black", "white"}

    def __init__(self):
        super().__init__()
        self.stack: list[str | None] = []
        self.colours: dict[str, set] = {}
        self.legend = False

    def _element(self, attrs: dict) -> str | None:
        series = attrs.get("data-series") or (self.stack[-1] if self.stack else None)
        self.legend |= bool(re.search(r"-legend_\d+$", attrs.get("id") or ""))
        if series is not None:
            found = self.colours.setdefault(series, set())
            found |= {attrs[a].lower() for a in ("fill", "stroke") if attrs.get(a)} - self.NEUTRAL
        return series

    def handle_starttag(self, tag, attrs):
        self.stack.append(self._element(dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        self._element(dict(attrs))

    def handle_endtag(self, tag):
        if self.stack:
            self.stack.pop()


def chart_series(svg: str) -> _SeriesColours:
    parser = _SeriesColours()
    parser.feed(svg)
    return parser


def test_every_chart_tags_its_conditions_in_their_palette_colour_with_a_legend(deck):
    """One colour per condition across the deck: every series a chart draws is tagged with its condition's
    name, the name is in the palette and the series is drawn in the palette's colour (so a condition has
    the same colour on every slide); a chart with more than one condition has a legend."""
    from glm53_flash.report.figures import PALETTE

    seen: dict[str, set] = {}
    for slide_id, section in slides_of(deck).items():
        for svg in re.findall(r'<svg class="chart".*?</svg>', section, flags=re.S):
            parsed = chart_series(svg)
            assert parsed.colours, (slide_id, "a chart with no tagged series")
            for name, colours in parsed.colours.items():
                assert name in PALETTE, (slide_id, name)
                assert PALETTE[name] in colours, (slide_id, name, colours)
                seen.setdefault(name, set()).add(slide_id)
            if len(parsed.colours) > 1:
                assert parsed.legend, (slide_id, sorted(parsed.colours))
    assert len(set(PALETTE.values())) == len(PALETTE)  # no colour means two things
    for arm in ("faithful", "ours"):  # the arms' colours are the headline distribution's
        from glm53_flash.report.figures import ARM_COLOURS
        from glm53_flash.report.figures import to_hex_colour

        assert PALETTE[arm] == to_hex_colour(ARM_COLOURS[arm]) and len(seen[arm]) >= 3
    assert len(seen["baseline"]) >= 3  # the vision and both RL-choices slides


def test_the_checker_sees_an_untagged_colour_and_a_missing_legend():
    svg = ('<svg class="chart"><g data-series="ours"><path stroke="#1f77b4"/></g>'
           '<g data-series="faithful"><path fill="#ff7f0e"/></g></svg>')
    parsed = chart_series(svg)
    assert parsed.colours == {"ours": {"#1f77b4"}, "faithful": {"#ff7f0e"}} and not parsed.legend
    assert chart_series(svg.replace("</svg>", '<g id="x-legend_1"></g></svg>')).legend


# Raw identifiers, hashes and timestamps a learner should never meet on a slide (code blocks and code spans
# aside for identifiers: code is code; the sources slide's commit aside for hashes).
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,}\b|\b\d{7,}\b")
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
IDENTIFIER = re.compile(r"\b[A-Za-z][A-Za-z0-9]*_[A-Za-z0-9_]+\b")


def test_no_slide_shows_a_hash_a_timestamp_or_a_code_identifier(deck):
    for slide_id, section in slides_of(deck).items():
        body = re.sub(r"<pre>.*?</pre>", " ", body_html(section), flags=re.S)
        title = html.unescape(re.search(r'data-title="([^"]*)"', section).group(1))
        text = title + " " + visible(re.sub(r"<code class='commit'>.*?</code>", " ", body))
        assert not HASH.search(text), (slide_id, HASH.search(text).group(0))
        assert not TIMESTAMP.search(text), (slide_id, TIMESTAMP.search(text).group(0))
        prose = title + " " + visible(re.sub(r"<code[^>]*>.*?</code>", " ", body, flags=re.S))
        assert not IDENTIFIER.search(prose), (slide_id, IDENTIFIER.search(prose).group(0))
    assert [slide_id for slide_id, section in slides_of(deck).items() if "class='commit'" in section] == ["sources"]


def identifiers_on_slides() -> set[str]:
    """The code's names for conditions, RL arms and settings that are not words (they hold '-', '_' or
    '.'): every study condition the palette colours, every arm of a committed RL-choices summary, and
    every identifier the glossary has a plain name for."""
    from glm53_flash.report.figures import PALETTE
    from glm53_flash.report.glossary import PLAIN

    names = {name for name in PALETTE if re.search(r"[-_.]", name)}
    for path in RESULTS.glob("rl-choices*/summary.json"):
        names |= {arm["arm"] for arm in json.loads(path.read_text())["arms"] if re.search(r"[-_.]", arm["arm"])}
    return names | {key for key in PLAIN if re.search(r"[-_.]", key)}


def test_no_slide_shows_a_condition_by_its_code_name(deck):
    """Conditions, arms and settings are named in words on every slide, charts included (code aside)."""
    names = identifiers_on_slides()
    assert {"repeated-8", "temp-low", "group-16-matched-updates", "linear_rope", "new-constants"} <= names
    for slide_id, section in slides_of(deck).items():
        body = re.sub(r"<pre>.*?</pre>|<code[^>]*>.*?</code>", " ", body_html(section), flags=re.S)
        text = visible(body)
        found = [name for name in names if re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", text)]
        assert found == [], (slide_id, found)


def test_the_rl_switches_are_named_by_what_they_do():
    """A switch and its values read as what they change, in the study's own sentences as in its tables."""
    from glm53_flash.experiments.rl_switches import SWITCHES
    from glm53_flash.report.glossary import PLAIN, plain

    assert plain("faithful: logprob_source untempered -> sampler +1.2 points") == (
        "faithful: temperature in the update dropped -> kept +1.2 points")
    assert plain("ours: eos_handling append -> omit; x -> sampler") == (
        "ours: end-of-text token trained -> not trained; x -> sampler")
    values = {"untempered", "sampler", "sequence-mean", "constant", "omit", "append"}
    assert set(SWITCHES) | values <= set(PLAIN)


def test_no_rl_switches_slide_shows_a_switch_value_by_its_code_name(deck):
    for slide_id, section in slides_of(deck).items():
        if "rl-switches" in slide_id:
            text = visible(re.sub(r"<pre>.*?</pre>|<code[^>]*>.*?</code>", " ", body_html(section), flags=re.S))
            assert not re.search(r"\b(untempered|sampler|constant|omit|append|log-?prob\w*)\b", text), (
                slide_id, re.search(r"\b(untempered|sampler|constant|omit|append|log-?prob\w*)\b", text)[0])


def test_an_rl_arm_is_named_by_what_it_changes():
    from glm53_flash.report.glossary import rl_arm_names, rl_setting

    base = {"groups": 16, "group_size": 8, "temperature": 0.35, "invalid_penalty": -0.1, "reward_mode": "binary"}
    assert rl_setting(dict(base, temperature=0.2), base) == "temperature 0.2"
    assert rl_setting(dict(base, groups=32, group_size=4), base) == "groups of 4 (as many samples)"
    assert rl_setting(dict(base, group_size=16), base) == "groups of 16 (as many updates)"
    assert rl_setting(dict(base, reward_mode="case-fraction", invalid_penalty=0.0), base) == (
        "refusal penalty 0; reward: share of tests passed")
    assert rl_setting(base, base) == "baseline"
    arms = [{"arm": "baseline", "settings": base}, {"arm": "hot", "settings": dict(base, temperature=0.8)}]
    assert rl_arm_names(arms) == {"baseline": "baseline", "hot": "temperature 0.8"}
    assert rl_arm_names({"faithful": {}}) == {} and rl_arm_names([{"arm": "x"}]) == {}


def test_the_sources_slide_names_the_code_that_built_the_deck(deck):
    """The commit and the state of the tree are read when the deck is built, not copied from a receipt."""
    from glm53_flash.core.receipts import git_commit

    commit = git_commit()
    sources = slides_of(deck)["sources"]
    if commit is None:
        assert "not a git checkout" in sources
        return
    assert f"<code class='commit'>{commit.removesuffix('+dirty')[:12]}</code>" in sources
    assert ("with uncommitted changes" in sources) == commit.endswith("+dirty")
    assert ("a clean tree" in sources) != commit.endswith("+dirty")
    assert "glm53 slides build --runs results" in sources


def test_the_story_says_each_finding_from_the_receipts(deck):
    """The headline's findings and the studies' sentences come from the committed summaries at build time."""
    from glm53_flash.report import findings

    sections = slides_of(deck)
    distribution = json.loads((RESULTS / "headline-distribution" / "distribution.json").read_text())
    for sentence in findings.headline_findings(distribution):
        assert html.escape(sentence.split(" took off")[0]) in sections["headline"]
    plan = json.loads((RESULTS / "pretrain-switches" / "plan.json").read_text())
    summary = json.loads((RESULTS / "pretrain-switches" / "summary.json").read_text())
    assert html.escape(findings.study_finding(plan, summary)) in sections["research-pretrain-switches"]
    assert findings.question(plan) == html.unescape(re.search(r'data-title="([^"]*)"',
                                                              sections["research-pretrain-switches"]).group(1))


def test_no_slide_claims_more_units_for_the_headlines_benchmark_than_its_functions_give(deck):
    """The deck's text holds to the unit count of the confirm and holdout splits (3 functions; the count
    itself is recomputed from the tasks in tests/test_tasks.py)."""
    from unit_claims import claimed_unit_counts

    text = html.unescape(re.sub(r"<(script|style)\b.*?</\1>", " ", deck, flags=re.DOTALL))
    assert [claim for claim in claimed_unit_counts(text) if claim[0] > 3] == []


def test_the_headline_finding_says_yet_only_while_seeds_are_to_run():
    from glm53_flash.report import findings

    summary = json.loads((RESULTS / "headline-distribution" / "distribution.json").read_text())
    planned = len(summary["plan"]["pretrain_seeds"])
    seeds = {row["pretrain_seed"] for row in summary["draws"]}
    last = findings.headline_findings(summary)[2]
    assert ("yet" in last) == (len(seeds) < planned)
    held = any(test.get("holds") for test in summary["primary"].values())
    assert last.startswith("Shown" if held else "Nothing is shown")
    partial = dict(summary, draws=[row for row in summary["draws"] if row["pretrain_seed"] != max(seeds)])
    if len(seeds) == planned:
        assert f"({planned - 1} of {planned} planned pretraining seeds have run)" in findings.headline_findings(partial)[2]
        assert f"with all {planned} pretraining seeds in." in last


def test_table_numbers_do_not_wrap_and_wide_tables_split_evenly():
    from glm53_flash.report.slides import TABLE_COLUMNS, split_table, unbreakable

    text = unbreakable("61 (48.75-62.75; 34-70) 37.0%-74.0% [+1.2, -3.4] 3.05e-05 a-b -4")
    assert text == ("61 (48.75\u201162.75; 34\u201170) 37.0%\u201174.0% [+1.2,\u00a0-3.4] 3.05e\u201105 a-b -4")
    for width in range(TABLE_COLUMNS + 1, 3 * TABLE_COLUMNS):
        columns = ["name", "split"] + [f"c{i}" for i in range(width - 2)]
        parts = split_table(columns, [["a", "b"] + ["1"] * (width - 2)])
        sizes = [len(part) - 2 for part, _ in parts]  # each part repeats the two key columns
        assert all(len(part) <= TABLE_COLUMNS and part[:2] == ["name", "split"] for part, _ in parts)
        assert sum(sizes) == width - 2 and max(sizes) - min(sizes) <= 1, (width, sizes)
