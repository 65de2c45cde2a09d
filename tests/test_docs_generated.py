"""Generated doc blocks (report/docs.py): `glm53 docs build` renders every block from committed summaries,
`glm53 docs check` finds a stale block, an unknown one, a number typed into prose, a binding comment."""

from __future__ import annotations

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


@pytest.mark.parametrize("doc", ["docs/STUDIES.md", "docs/VERIFIER.md", "docs/GLM_MAPPING.md"])
def test_the_converted_docs_are_as_built_and_type_no_figure(doc):
    """These docs hold every figure in a generated block: `glm53 docs build` leaves them unchanged and
    `glm53 docs check` finds nothing."""
    from glm53_flash.commands.docs import blocks

    root = Path(__file__).resolve().parents[1]
    text = (root / doc).read_text()
    renderers = blocks(root)
    assert docs.build_text(text, root, renderers) == text
    assert docs.check_text(text, root, doc, renderers) == []
