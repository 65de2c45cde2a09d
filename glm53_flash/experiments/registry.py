"""Every study `glm53 experiment` runs, by name: one line each. Each study is declared in its own module
(experiments/<study>.py, a `study.Study`); the CLI (`glm53 experiment NAME`, `glm53 analyze`), the power
lines, the course deck's study slides (`deck_entries`) and the Makefile's study targets (`makefile_block`)
read it here. A new study is its module, a line here and its section of docs/STUDIES.md."""

from __future__ import annotations

from glm53_flash.experiments.generalisation import Generalisation
from glm53_flash.experiments.pretrain_switches import PretrainSwitches
from glm53_flash.experiments.pretraining_data import PretrainingData
from glm53_flash.experiments.rl_choices import RLChoices
from glm53_flash.experiments.rl_switches import RLSwitches
from glm53_flash.experiments.study import DeckEntry, Study

STUDIES: dict[str, Study] = {study.name: study for study in (
    PretrainingData(),
    RLChoices(),
    Generalisation(),
    RLSwitches(),
    PretrainSwitches(),
)}


def vision_figures(slide_id: str, summary: dict, directory) -> tuple[list, bool]:
    """The vision report's chart at the deck's size."""
    from glm53_flash.report import study_charts

    return [(study_charts.draw_vision_comparison(summary, size=(14.4, 5.4)), "vision",
             "held-out accuracy per seed for both architectures, and their confusion matrices")], False


# The deck's first study slide is the vision path's (`glm53 vision`, not a `glm53 experiment` study).
VISION = DeckEntry("vision", "Vision: images as tokens", "glm53 vision train --architecture both", "vision/summary.json",
                   vision_figures)


def study_of(plan: dict) -> Study:
    """The registered study a plan.json belongs to, or a ValueError naming the known ones."""
    name = plan.get("study")
    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; known: {', '.join(STUDIES)}")
    return STUDIES[name]


def rerunnable() -> list[str]:
    """The studies `--rerun-of` compares with their rerun."""
    return [name for name, study in STUDIES.items() if study.rerunnable]


def deck_entries() -> tuple[DeckEntry, ...]:
    """What the course deck's study slides show, in order (report/slides.py `build_deck(runs, studies, study_of)`)."""
    return (VISION, *(entry for study in STUDIES.values() for entry in study.deck))


MAKEFILE_BEGIN = "# >>> the studies' targets, generated from experiments/registry.py (`glm53 docs makefile`) >>>"
MAKEFILE_END = "# <<< the studies' targets <<<"


def makefile_block() -> str:
    """The Makefile's study targets, from each study's `make_targets` (a recipe line's leading four spaces
    are a tab), between the markers `glm53 docs makefile` rewrites."""
    def tabs(line: str) -> str:
        indent = len(line) - len(line.lstrip(" "))
        return "\t" * (indent // 4) + line[indent // 4 * 4:]

    targets = [target for study in STUDIES.values() for target in study.make_targets]
    phony = [".PHONY:"]
    for target in targets:  # one line up to about 110 characters, then a continued one
        if len(phony[-1]) + len(target.name) > 110:
            phony[-1] += " \\"
            phony.append("\t")
        phony[-1] += ("" if phony[-1] == "\t" else " ") + target.name
    rules = ["\n".join(tabs(line) for line in target.rule.strip("\n").split("\n")) for target in targets]
    return "\n\n".join([MAKEFILE_BEGIN + "\n" + "\n".join(phony), *rules]) + "\n" + MAKEFILE_END


def with_makefile_block(makefile: str) -> str:
    """`makefile` (the Makefile's text) with its block of study targets as the registry renders it."""
    start, end = makefile.find(MAKEFILE_BEGIN), makefile.find(MAKEFILE_END)
    if start < 0 or end < start:
        raise ValueError(f"the Makefile has no block between {MAKEFILE_BEGIN!r} and {MAKEFILE_END!r}")
    return makefile[:start] + makefile_block() + makefile[end + len(MAKEFILE_END):]


def write_makefile_block(path) -> bool:
    """Rewrite the Makefile at `path` with its study targets as the registry renders them; True when it
    changed."""
    from pathlib import Path

    from glm53_flash.core.receipts import read_text, write_text

    text = read_text(Path(path))
    new = with_makefile_block(text)
    if new != text:
        write_text(Path(path), new)
    return new != text


__all__ = ["STUDIES", "VISION", "deck_entries", "makefile_block", "rerunnable", "study_of", "with_makefile_block",
           "write_makefile_block"]
