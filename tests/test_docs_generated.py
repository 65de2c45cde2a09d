"""Generated doc blocks (report/docs.py): `glm53 docs build` renders every block from committed summaries,
`glm53 docs check` finds a stale block, an unknown one, a number typed into prose, a binding comment."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from glm53_flash.report import docs


@pytest.fixture
def renderer(monkeypatch):
    monkeypatch.setitem(docs.RENDERERS, "answer", lambda root: "The answer is 42 (p 0.01).\n")
    return "answer"


def test_a_renderer_table_can_be_passed_and_names_are_checked(tmp_path):
    table = {"only": lambda root: "x"}
    assert docs.build_text("<!-- generated: only -->\n<!-- /generated -->", tmp_path, table) == (
        "<!-- generated: only -->\nx\n<!-- /generated -->")
    assert "unknown generated block 'model-facts'; known: only" in docs.check_text(
        "<!-- generated: model-facts -->\n<!-- /generated -->", tmp_path, renderers=table)[0]


def test_build_renders_each_block_and_check_accepts_it(renderer, tmp_path):
    text = "# Title\n\nProse with `--steps 300` in code.\n<!-- generated: answer -->\nstale 41\n<!-- /generated -->\nEnd."
    built = docs.build_text(text, tmp_path)
    assert built == ("# Title\n\nProse with `--steps 300` in code.\n<!-- generated: answer -->\n"
                     "The answer is 42 (p 0.01).\n<!-- /generated -->\nEnd.")
    assert docs.check_text(built, tmp_path) == []
    assert docs.build_text(built, tmp_path) == built  # idempotent
    assert docs.check_text(text, tmp_path) == ["doc:4: block 'answer' is not what `glm53 docs build` renders"]


def test_check_refuses_numbers_typed_into_prose_and_binding_comments(renderer, tmp_path):
    text = ("Ours solves 15 of 24, up 3.5% (see [the report](results/x/REPORT.md)).\n"
            "```bash\nglm53 pretrain --steps 300\n```\n1. a step list marker is not a figure\n"
            "bf16 and x86 and glm53 are words; `2.13.0` is code.\n<!-- cells: r.json\n-->\n")
    problems = docs.check_text(text, tmp_path, "README.md")
    assert problems == ["README.md:1: '15' outside a generated block (put it in one, or in code)",
                        "README.md:1: '24' outside a generated block (put it in one, or in code)",
                        "README.md:1: '3.5%' outside a generated block (put it in one, or in code)",
                        "README.md:7: a hand-written binding comment"]


def test_unknown_and_unclosed_blocks_are_named(tmp_path):
    assert docs.check_text("<!-- generated: nothing-here -->\nx\n<!-- /generated -->", tmp_path) == [
        "doc:1: unknown generated block 'nothing-here'; known: " + ", ".join(sorted(docs.RENDERERS))]
    with pytest.raises(ValueError, match="has no <!-- /generated -->"):
        docs.segments("<!-- generated: headline -->\nx")
    with pytest.raises(ValueError, match="lower-case words"):
        docs.check_name("Bad Name")


def test_build_writes_only_the_docs_that_change(renderer, tmp_path):
    (tmp_path / "README.md").write_text("<!-- generated: answer -->\n<!-- /generated -->\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "STUDIES.md").write_text("no blocks\n")
    assert docs.build(tmp_path, ("README.md", "docs/STUDIES.md", "docs/missing.md")) == ["README.md"]
    assert docs.build(tmp_path, ("README.md",)) == []
    assert docs.check(tmp_path, ("README.md", "docs/STUDIES.md")) == []


def test_the_model_facts_block_is_the_flash_preset():
    text = docs.rendered("model-facts", Path("."))[0]
    assert text.startswith("A 25,730,592-parameter byte-level model (9,805,344 active per token): 12 layers")


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def every_block():
    """The renderers of every block the docs may hold (what `glm53 docs build` and `check` use)."""
    from glm53_flash.commands.docs import blocks

    return blocks(ROOT)


@pytest.mark.parametrize("doc", docs.DOCS)
def test_every_doc_is_as_built_and_types_no_figure(doc, every_block):
    """Every doc holds each figure in a generated block: `glm53 docs build` leaves it unchanged and
    `glm53 docs check` finds nothing."""
    text = (ROOT / doc).read_text()
    assert docs.build_text(text, ROOT, every_block) == text
    assert docs.check_text(text, ROOT, doc, every_block) == []


def test_docs_lists_the_readme_and_every_page_under_docs():
    assert set(docs.DOCS) == {"README.md", *(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))}


@pytest.mark.parametrize("doc", docs.DOCS)
def test_a_figure_doctored_inside_a_generated_block_is_caught(doc, every_block):
    """Change one digit of the first generated block that shows one: check names that block."""
    text = (ROOT / doc).read_text()
    line = 1
    for name, lines in docs.segments(text):
        if name is not None and any(re.search(r"\d", content) for content in lines):
            break
        line += len(lines) + (2 if name is not None else 0)
    else:
        pytest.fail(f"{doc} has no generated block with a figure")
    k = next(i for i, content in enumerate(lines) if re.search(r"\d", content))
    digit = re.search(r"\d", lines[k])
    doctored_line = lines[k][:digit.start()] + str((int(digit.group()) + 1) % 10) + lines[k][digit.end():]
    doctored = text.replace("\n".join(lines), "\n".join([*lines[:k], doctored_line, *lines[k + 1:]]), 1)
    assert docs.check_text(doctored, ROOT, doc, every_block) == [
        f"{doc}:{line}: block {name!r} is not what `glm53 docs build` renders"]


def test_the_module_map_is_one_row_per_module_from_its_docstring(tmp_path):
    package = tmp_path / "glm53_flash"
    (package / "core").mkdir(parents=True)
    (package / "__init__.py").write_text('"""The public API."""\n')
    (package / "core" / "__init__.py").write_text('"""Re-exports."""\n')
    (package / "core" / "receipts.py").write_text('"""Receipts for every run. Details follow."""\n')
    (package / "core" / "bare.py").write_text("x = 1\n")
    assert docs.render_module_map(tmp_path).split("\n")[2:] == [
        "| `__init__.py` | The public API. |", "| `core/bare.py` | (no docstring) |",
        "| `core/receipts.py` | Receipts for every run. |"]
    (package / "core" / "receipts.py").write_text('"""Provenance, and how files are written."""\n')
    assert "| `core/receipts.py` | Provenance, and how files are written. |" in docs.render_module_map(tmp_path)


def test_a_first_sentence_is_cut_at_a_word_and_never_inside_code():
    assert docs.first_sentence("Does it stop? It does.") == "Does it stop?"
    assert docs.first_sentence("Ends at `x.py`. Two.\n\nA paragraph.") == "Ends at `x.py`."
    assert docs.first_sentence("alpha beta gamma delta", 16) == "alpha beta..."
    assert docs.first_sentence("alpha `beta gamma delta` epsilon", 22) == "alpha..."


def test_the_module_map_covers_the_package():
    root = Path(__file__).resolve().parents[1]
    modules = [p for p in (root / "glm53_flash").rglob("*.py") if p.name != "__init__.py" or p.parent.name == "glm53_flash"]
    rows = docs.render_module_map(root).split("\n")[2:]
    assert len(rows) == len(modules) and "(no docstring)" not in "\n".join(rows)


def _bench_checkout(tmp_path):
    """A checkout holding copies of the committed receipts BENCHMARKS.md's figures come from."""
    import shutil

    from glm53_flash.report.doc_blocks import BENCH_RECEIPTS

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "results" / "bench").mkdir(parents=True)
    for relative in BENCH_RECEIPTS.values():
        shutil.copy(root / relative, tmp_path / relative)
    return tmp_path


def test_the_bench_figures_are_rendered_from_the_receipts_and_follow_them(tmp_path):
    import json

    from glm53_flash.report.doc_blocks import BENCH_RECEIPTS, render_bench_figures
    from glm53_flash.report.docs import cpu_name

    root = _bench_checkout(tmp_path)
    text = render_bench_figures(root)
    model = json.loads((root / BENCH_RECEIPTS["model"]).read_text())
    comparison = model["training"]["precision_comparison"]
    provenance = model["provenance"]
    assert text.startswith(f"Measured on {cpu_name(provenance)}, torch {provenance['versions']['torch']}.")
    assert "family" in cpu_name(provenance) and "cores)" in cpu_name(provenance)
    commit = provenance["git_commit"]
    for relative in BENCH_RECEIPTS.values():  # the committed figures come from clean trees
        assert not json.loads((root / relative).read_text())["provenance"]["git_commit"].endswith("+dirty"), relative
    assert f"{comparison['bf16']['step_seconds_min']:.3f} s" in text and f"at `{commit[:7]}` |" in text
    comparison["bf16"]["step_seconds_min"] = 0.123456
    model["provenance"]["git_commit"] = "abcdef0123456789+dirty"
    (root / BENCH_RECEIPTS["model"]).write_text(json.dumps(model))
    changed = render_bench_figures(root)
    assert "0.123 s" in changed and "at `abcdef0` with uncommitted changes |" in changed and changed != text
    model["provenance"]["math"]["cpu"]["math_flags"] = ["avx2"]
    (root / BENCH_RECEIPTS["model"]).write_text(json.dumps(model))
    with pytest.raises(ValueError, match="2 machines"):
        render_bench_figures(root)
    (root / BENCH_RECEIPTS["model"]).unlink()
    assert "`results/bench/model-precision-zen5-combine.json` has not been committed yet" in render_bench_figures(root)


def test_the_bench_commands_block_lists_every_bench():
    from glm53_flash.commands.docs import render_bench_commands

    rows = render_bench_commands(Path(".")).split("\n")[2:]
    names = [row.split("`")[1] for row in rows]
    assert {"glm53 bench model", "glm53 bench decode-weights", "glm53 bench rl", "glm53 bench verify",
            "glm53 bench quickstart"} <= set(names) and len(names) == len(set(names))
