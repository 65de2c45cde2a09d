"""Every figure in the docs is the exact cell of the receipt it names (report/cells.py), and every
generated report is what its receipts give today. Written as an attacker would edit a doc: a flipped
sign, two swapped columns, a wrong p-value in a sentence, an unbound number, a doctored generated
table or text must each fail."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from glm53_flash.report.cells import DOCS, blocks, check_doc, figures_in, format_cell, resolve

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("doc", DOCS)
def test_every_figure_in_the_doc_is_its_cell(doc):
    problems = check_doc(ROOT, doc)
    assert not problems, "\n".join(problems[:20])


def test_the_docs_bind_many_figures_to_cells():
    bound = 0
    for doc in DOCS:
        for block in blocks(ROOT / doc):
            if block.binding and block.figures:
                bound += sum(1 for line in block.binding.splitlines()[1:] if line.strip() and not
                             line.strip().startswith("="))
    assert bound >= 100


def test_figures_are_read_as_shown():
    found = [f.text for f in figures_in("**15/24** (p 3.05e-05), 1,218 and `code 99`, -2.3, +4.4 and 80.9x of "
                                        "53-56, bf16, x86, 2.13.0, commit 54a3da4, [a link](docs/x1.md)")]
    assert found == ["15", "24", "3.05e-05", "1,218", "-2.3", "+4.4", "80.9", "53", "56"]


def test_cell_formats():
    assert format_cell(0.51, "+f1*100") == "+51.0" and format_cell(-0.109, "f1*100") == "-10.9"
    assert format_cell(0.03125, "p") == "0.0312" and format_cell(6.1035e-05, "p") == "6.10e-05"
    assert format_cell(25730592, ",d") == "25,730,592" and format_cell(780.9, "f1/60") == "13.0"
    assert format_cell(-20, "abs:d") == "20" and format_cell(-0.0001, "f1") == "0.0"
    assert format_cell("8", "d") == "8"
    with pytest.raises(ValueError, match="not a number"):
        format_cell("eight", "d")
    data = {"a": {"x": [1, 5, 3]}, "b": [{"v": 2}, {"v": 9}]}
    assert resolve(data, "a.x[1]") == 5 and resolve(data, "max:b.*.v") == 9 and resolve(data, "len:a.x.*") == 3
    with pytest.raises(KeyError):
        resolve(data, "a.y")


def write(tmp_path, text, receipt):
    (tmp_path / "r.json").write_text(json.dumps(receipt))
    (tmp_path / "doc.md").write_text(text)
    return check_doc(tmp_path, "doc.md")


RECEIPT = {"gain": 0.51, "drop": -0.109, "p": 0.0312, "rows": [{"a": 15, "b": 24}, {"a": 3, "b": 96}]}
SENTENCE = """RL gains +51.0 points (p 0.0312); ours minus faithful is -10.9.
<!-- cells: r.json
gain +f1*100
p p
drop f1*100
-->
"""
TABLE = """| row | a | b |
|---|---|---|
| first | 15 | 24 |
| second | 3 | 96 |
<!-- cells: r.json
rows[0].a d
rows[0].b d
rows[1].a d
rows[1].b d
-->
"""


def test_a_true_doc_passes(tmp_path):
    assert write(tmp_path, SENTENCE + "\n" + TABLE, RECEIPT) == []


def test_a_flipped_sign_fails(tmp_path):
    problems = write(tmp_path, SENTENCE.replace("-10.9", "+10.9"), RECEIPT)
    assert len(problems) == 1 and "shows +10.9" in problems[0] and "is -10.9" in problems[0]
    assert write(tmp_path, SENTENCE.replace("+51.0", "-51.0"), RECEIPT)


def test_two_swapped_columns_fail(tmp_path):
    swapped = TABLE.replace("| first | 15 | 24 |", "| first | 24 | 15 |").replace("| second | 3 | 96 |",
                                                                                 "| second | 96 | 3 |")
    assert len(write(tmp_path, swapped, RECEIPT)) == 4


def test_a_wrong_p_value_in_a_sentence_fails(tmp_path):
    problems = write(tmp_path, SENTENCE.replace("(p 0.0312)", "(p 0.0031)"), RECEIPT)
    assert problems and "0.0031" in problems[0]


def test_an_unbound_or_miscounted_figure_fails(tmp_path):
    assert "no <!-- cells: --> binding" in write(tmp_path, "We measured 42.\n", RECEIPT)[0]
    assert "binding entries" in write(tmp_path, SENTENCE.replace("drop f1*100\n", ""), RECEIPT)[0]
    assert "not bound to a cell" in write(tmp_path, "We measured 42.\n<!-- cells: r.json\n? 42\n-->\n", RECEIPT)[0]
    assert "no 'missing'" in write(tmp_path, "It is 7.\n<!-- cells: r.json\nmissing d\n-->\n", RECEIPT)[0]
    # a number marked as a setting needs no cell
    assert write(tmp_path, "On 2 cores.\n<!-- cells: none\n= the machine's cores\n-->\n", RECEIPT) == []


def test_generated_tables_and_text_must_be_as_generated(tmp_path):
    receipt = {"table": {"columns": ["arm", "solved"], "rows": [["ours", "15/24"]]},
               "text": "Ours solves 15 of 24.\nThat is all."}
    good = ("<!-- cells-table: r.json table -->\n| arm | solved |\n|---|---|\n| ours | 15/24 |\n\n"
            "<!-- cells-text: r.json text -->\nOurs solves 15 of 24.\nThat is all.\n<!-- /cells-text -->\n")
    assert write(tmp_path, good, receipt) == []
    assert "as rendered" in write(tmp_path, good.replace("| ours | 15/24 |", "| ours | 16/24 |"), receipt)[0]
    assert "as generated" in write(tmp_path, good.replace("solves 15 of", "solves 16 of"), receipt)[0]


@pytest.mark.parametrize("edit", [
    ("before RL -1.0 points (p 1)", "before RL +1.0 points (p 1)"),  # a sign in generated text
    ("seeds p 0.287)", "seeds p 0.0287)"),  # a p-value in generated text
    ("(exact sign-flip p = 0.00391;", "(exact sign-flip p = 0.0391;"),  # a hand-bound sentence
    ("| GLM-style faithful miniature | 60,924 | 0/2000 (0.0%) | 1218/2000", "| GLM-style faithful miniature | "
     "60,924 | 1218/2000 | 0/2000 (0.0%)"),  # two columns of a generated table
])
def test_the_readme_refuses_each_doctored_figure(tmp_path, edit):
    before, after = edit
    text = (ROOT / "README.md").read_text()
    assert before in text
    (tmp_path / "README.md").write_text(text.replace(before, after, 1))
    for name in ("results",):
        (tmp_path / name).symlink_to(ROOT / name)
    assert check_doc(tmp_path, "README.md")


# --------------------------------------------------------------------------- generated reports


@pytest.mark.slow
@pytest.mark.parametrize("name", ["headline", "headline-bf16"])
def test_the_headline_reports_are_what_their_receipts_give(tmp_path, monkeypatch, name):
    from glm53_flash.experiments.reproduce import rebuild_reports

    # the reports name the committed ledger's openings (read only: rebuilding opens nothing)
    from glm53_flash.evaluation import ledger

    monkeypatch.setattr(ledger, "_DEFAULT_OVERRIDE", ROOT / "results" / "ledger.jsonl")
    copy = tmp_path / name
    shutil.copytree(ROOT / "results" / name, copy)
    rebuild_reports(copy)
    for report in sorted((ROOT / "results" / name).rglob("REPORT.md")):
        rebuilt = copy / report.relative_to(ROOT / "results" / name)
        assert rebuilt.read_text() == report.read_text(), f"{report} is not what its receipts give"
    committed = json.loads((ROOT / "results" / name / "summary.json").read_text())
    again = json.loads((copy / "summary.json").read_text())
    for key in ("comparison", "headline_table", "readme", "power"):
        assert again[key] == committed[key], key


@pytest.mark.parametrize("study", ["pretraining-data", "pretraining-data-no-positions", "rl-choices"])
def test_the_study_reports_are_what_their_receipts_give(tmp_path, study):
    copy = tmp_path / study
    shutil.copytree(ROOT / "results" / study, copy)
    subprocess.run([sys.executable, "-m", "glm53_flash.cli", "analyze", str(copy), "--force"], check=True,
                   capture_output=True)
    assert (copy / "REPORT.md").read_text() == (ROOT / "results" / study / "REPORT.md").read_text()


def test_the_vision_report_is_what_its_receipts_give(tmp_path):
    receipts = ROOT / "results" / "vision" / "receipts"
    subprocess.run([sys.executable, "-m", "glm53_flash.cli", "vision", "report", "--train", str(receipts / "train.json"),
                    "--pilot", str(receipts / "pilot.json"), "--output", str(tmp_path / "vision")], check=True,
                   capture_output=True)
    assert (tmp_path / "vision" / "REPORT.md").read_text() == (ROOT / "results" / "vision" / "REPORT.md").read_text()


def test_docs_check_command(capsys):
    from glm53_flash.cli import main

    assert main(["docs", "check"]) == 0 and "0 problem(s)" in capsys.readouterr().out
