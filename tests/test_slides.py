"""`glm53 slides build`: every number comes from the receipts it is given, the build is
deterministic, the deck fetches nothing from the network, and missing studies say what makes them."""

from __future__ import annotations

import html
import json
import re
import shutil

import pytest
from web_helpers import RESULTS

from glm53_flash.cli import main
from glm53_flash.experiments.registry import deck_entries
from glm53_flash.report.slides import RELEASED, build_deck as build_deck_with

# The deck's study slides, as `glm53 slides build` reads them from the study registry: (slide id, title, command,
# summary under the results directory).
STUDIES = [(e.slide_id, e.title, e.command, e.summary) for e in deck_entries()]


def build_deck(runs):
    return build_deck_with(runs, deck_entries())

SLIDE_ORDER = ["result", "arms", "result-chart", "example", "architecture", "architecture-block", "bytes-vs-bpe", "pretraining",
               "verifier", "rloo", "confirmation", "failures", "vision", "vision-charts", "research-pretraining-data",
               "research-pretraining-data-charts", "research-rl-choices", "research-rl-choices-table",
               "research-rl-choices-charts", "research-rl-choices-compositions", "research-rl-choices-compositions-table",
               "research-rl-choices-compositions-charts", "research-rl-generalisation", "research-rl-generalisation-table",
               "research-rl-generalisation-charts", "research-rl-generalisation-rerun",
               "research-rl-generalisation-rerun-table", "research-rl-generalisation-rerun-charts", "research-rl-switches", "research-rl-switches-table",
               "research-rl-switches-charts", "research-pretrain-switches", "research-pretrain-switches-charts",
               "research-pretrain-switches-rerun", "research-pretrain-switches-rerun-charts",
               "sources"]
REPO = RESULTS.parent


@pytest.fixture(scope="module")
def deck():
    return build_deck(RESULTS)


@pytest.mark.slow
def test_course_order_and_no_network_fetches(deck):
    assert re.findall(r'<section class="slide" id="([^"]+)"', deck) == SLIDE_ORDER
    for pattern in (r'src="(?!data:)', r'href="https?:', r"@import", r"url\((?!#)", r"https?://"):
        assert not re.search(pattern, deck), pattern
    assert deck.count('<aside class="notes">') == len(SLIDE_ORDER)
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


@pytest.mark.slow
def test_study_summaries_render_generically_or_name_their_command(tmp_path, deck):
    for slide_id, _, command, relative in STUDIES:
        summary_path = RESULTS / relative
        slide = deck[deck.index(f'id="{slide_id}"'):]  # its slide, and the table slide a long study adds
        ends = [slide.index(f'<section class="slide" id="{other}"') for other in
                [sid for sid, *_ in STUDIES if sid != slide_id] + ["sources"] if f'id="{other}"' in slide]
        slide = slide[:min(ends)]
        if summary_path.exists():  # committed results: their own table and answers, escaped
            table = json.loads(summary_path.read_text())["headline_table"]
            assert all(f"<th>{html.escape(str(c))}</th>" in slide for c in table["columns"]), slide_id
            assert f"<td>{html.escape(str(table['rows'][0][0]))}</td>" in slide, slide_id
        else:
            assert command in slide and relative in slide, slide_id
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
    built = build_deck(runs)
    vision = built[built.index('id="vision"'):built.index('id="research-pretraining-data"')]
    assert "<th>held-out accuracy</th>" in vision and "<td>0.917</td>" in vision
    assert "&lt;wins&gt;" in vision  # text from receipts is escaped
    assert "glm53 vision train" not in vision


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
    assert f"{total:,}" in deck and f"One hybrid block, {tiny.layers} times" in deck
    result = deck[deck.index('id="result"'):deck.index('id="result-chart"')]
    assert "25.7M" not in result and f"{total / 1e3:.0f}K-parameter" in result


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
    headline = deck[deck.index("<main"):deck.index('id="vision"')]
    assert "missing" not in headline and "placeholder" not in headline.lower()
    assert "<svg" in headline[headline.index('id="result-chart"'):headline.index('id="architecture"')]


def test_charts_are_inline_svg_with_text_and_stated_sample_sizes(deck):
    charts = re.findall(r'<svg class="chart".*?</svg>', deck, flags=re.S)
    # per-seed, pretraining (loss and selection), RL (reward and selection), families; vision; the
    # pretraining-data study's curves and differences; the RL-choices screen and confirmation, on the families
    # and on the compositions suite; the RL-generalisation study's effects and its rerun's; the RL-switches study's effects;
    # the pretraining-switch study's effects and its rerun's
    assert len(charts) == 16
    for svg in charts:
        assert "<text" in svg and "n=" in svg
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
    section = re.search(r'<section class="slide" id="result".*?</section>', deck, re.S).group(0)
    body, notes = section.split('<aside class="notes">', 1)
    assert "The ledger records" not in body and "reopened" not in body
    assert "The ledger records" in notes


@pytest.mark.slow
def test_each_study_with_a_summary_shows_its_charts(tmp_path, deck):
    """The charts of a study's REPORT.md are on a slide of their own, drawn from the same summary.json
    (so a changed summary changes the chart), and a study without a summary gets no chart slide."""
    for slide_id, _, _, relative in STUDIES:
        section = re.search(rf'<section class="slide" id="{slide_id}-charts".*?</section>', deck, re.S)
        assert section and '<svg class="chart"' in section.group(0), slide_id
    charts = re.search(r'id="research-rl-choices-charts".*?</section>', deck, re.S).group(0)
    summary = json.loads((RESULTS / "rl-choices" / "summary.json").read_text())
    assert all(f">{html.escape(arm['arm'])}<" in charts for arm in summary["arms"])  # every arm is a tick label
    assert f"(n={summary['confirmation']['n']})" in charts
    runs = tmp_path / "results"
    shutil.copytree(RESULTS, runs)
    summary["confirmation"]["n"] = 77
    (runs / "rl-choices" / "summary.json").write_text(json.dumps(summary))
    (runs / "vision" / "summary.json").unlink()
    built = build_deck(runs)
    assert "(n=77)" in built and 'id="vision-charts"' not in built


def test_no_slide_shows_process_text(deck):
    """Slides show results and how to read them; how a split was opened and reopened, install paths and
    version-control states belong in the notes and the reports."""
    for section in re.findall(r'<section class="slide".*?</section>', deck, re.S):
        body = section.split('<aside class="notes">', 1)[0]
        for word in ("ledger", "reopen", ".venv/", "+dirty", "the issue", "this session"):
            assert word not in body, (re.search(r'id="([^"]+)"', section).group(1), word)
    sources = re.search(r'<section class="slide" id="sources".*?</section>', deck, re.S).group(0)
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
