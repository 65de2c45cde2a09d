"""Docs whose figures are generated: every number a doc shows comes from a block that `glm53 docs build`
renders from committed summaries, and `glm53 docs check` verifies.

A generated block sits between two markers and holds exactly what its renderer returns:

    <!-- generated: headline -->
    ...rendered markdown...
    <!-- /generated -->

`RENDERERS` names every block (a function of the checkout's root returning markdown). Outside blocks, a
doc may hold numbers only inside code (`make test`, `--steps 300`, fenced examples) or link targets;
anything else that looks like a figure is a problem for `check`, so a measured number cannot be typed
into prose by hand.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

DOCS = ("README.md", "docs/ARCHITECTURE.md", "docs/BENCHMARKS.md", "docs/STUDIES.md", "docs/TUTORIAL.md",
        "docs/VERIFIER.md", "docs/GLM_MAPPING.md")
START = re.compile(r"^<!-- generated: ([a-z0-9-]+) -->$")
END = "<!-- /generated -->"
# A number in prose: digits not part of a word (bf16, x86, glm53) or of a version-like token.
NUMBER = re.compile(r"(?<![\w.\-/])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?(?![\w.]*\w)")


# --------------------------------------------------------------------------- renderers


def _read(root: Path, relative: str):
    path = root / relative
    return json.loads(path.read_text()) if path.is_file() else None


def render_model_facts(root: Path) -> str:
    """The model in one sentence, from the flash preset's config and its parameter count."""
    import torch

    from glm53_flash.model.config import ModelConfig
    from glm53_flash.model.lm import GLM53Flash

    cfg = ModelConfig()
    with torch.device("meta"):
        counts = GLM53Flash(cfg).parameter_counts()
    rhythm = ", ".join(["linear"] * (cfg.sparse_every - 1) + ["sparse"])
    return (f"A {counts['total']:,}-parameter byte-level model ({counts['active']:,} active per token): "
            f"{cfg.layers} layers in a {rhythm} attention rhythm, {cfg.experts} routed experts (top "
            f"{cfg.top_k}) plus one shared expert, {cfg.streams} residual streams, a tied head, a "
            f"{cfg.vocab_size}-token byte vocabulary and a context of {cfg.max_sequence_length} bytes.")


def render_headline(root: Path) -> str:
    """The headline as a distribution: chart, one table, three sentences (results/headline-distribution)."""
    from glm53_flash.report.distribution import headline_block

    summary = _read(root, "results/headline-distribution/distribution.json")
    if summary is None:
        return "The headline study (`results/headline-distribution/`) has not been committed yet."
    return "\n".join(headline_block(summary, "results/headline-distribution/distribution.png"))


def cpu_name(provenance: dict) -> str:
    """'AMD EPYC (family 26, model 2; AVX512-BF16)' from a receipt's provenance."""
    cpu = (provenance.get("math") or {}).get("cpu") or {}
    flags = cpu.get("math_flags") or []
    isa = ("AMX" if "amx_bf16" in flags else "AVX512-BF16" if "avx512_bf16" in flags else "AVX-512" if "avx512f" in flags
           else "AVX2" if "avx2" in flags else "no AVX2")
    numbers = f"family {cpu.get('family')}, model {cpu.get('model_number')}; " if cpu.get("family") else ""
    return f"{cpu.get('model') or 'an unknown CPU'} ({numbers}{isa}, {provenance.get('cpu_count')} cores)"


def first_sentence(text: str, limit: int = 160) -> str:
    """The first sentence of a docstring, on one line; past `limit` characters, cut at a word (and before
    a code span the cut would leave open) with "...". A sentence ends at a period or a question mark after
    a lower-case letter, a digit, a bracket or a quote, before a space."""
    flat = " ".join(text.split("\n\n")[0].split())
    match = re.search(r"(?<=[a-z0-9)`'\"][.?])\s", flat)
    sentence = flat[:match.start()] if match else flat
    if len(sentence) <= limit:
        return sentence
    cut = sentence[:limit - 3].rsplit(" ", 1)[0]
    if cut.count("`") % 2:
        cut = cut[:cut.rindex("`")]
    return cut.rstrip(" ,;:(") + "..."


def render_module_map(root: Path) -> str:
    """The package as a table, one row per module (its path under glm53_flash/, folder by folder, and
    the first sentence of its docstring), so the map is as true as the modules' docstrings. A folder's
    `__init__.py` is left out (it re-exports its folder), except the package's own: the public API."""
    import ast

    from glm53_flash.report.tables import markdown_table

    package = root / "glm53_flash"
    paths = sorted(package.rglob("*.py"), key=lambda p: (p.parent != package, p.parent.relative_to(package).parts,
                                                          p.name))
    rows = []
    for path in paths:
        if path.name == "__init__.py" and path.parent != package:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        rows.append([f"`{path.relative_to(package).as_posix()}`", first_sentence(doc) if doc else "(no docstring)"])
    return "\n".join(markdown_table(["module (under `glm53_flash/`)", "what it is for"], rows))


# The blocks this layer renders; commands/docs.py adds those of the layers above (the first run, the
# studies' answers) and passes the whole table to build and check.
RENDERERS: dict[str, Callable[[Path], str]] = {
    "model-facts": render_model_facts,
    "headline": render_headline,
    "module-map": render_module_map,
}


def check_name(name: str) -> str:
    """A block name: lower-case words joined by '-'."""
    if not re.fullmatch(r"[a-z0-9-]+", name):
        raise ValueError(f"a block name is lower-case words joined by '-', got {name!r}")
    return name


# --------------------------------------------------------------------------- reading and writing docs


def segments(text: str) -> list[tuple[str | None, list[str]]]:
    """The doc as [(block name or None for prose, lines)], in order; markers belong to their block."""
    lines = text.split("\n")
    out: list[tuple[str | None, list[str]]] = []
    prose: list[str] = []
    i = 0
    while i < len(lines):
        match = START.match(lines[i])
        if not match:
            prose.append(lines[i])
            i += 1
            continue
        j = i + 1
        while j < len(lines) and lines[j] != END:
            if START.match(lines[j]):
                raise ValueError(f"line {j + 1}: a generated block starts inside block {match.group(1)!r}")
            j += 1
        if j == len(lines):
            raise ValueError(f"line {i + 1}: block {match.group(1)!r} has no {END}")
        out.append((None, prose))
        prose = []
        out.append((match.group(1), lines[i + 1:j]))
        i = j + 1
    out.append((None, prose))
    return out


def rendered(name: str, root: Path, renderers=None) -> list[str]:
    renderers = RENDERERS if renderers is None else renderers
    if name not in renderers:
        raise ValueError(f"unknown generated block {name!r}; known: {', '.join(sorted(renderers))}")
    return renderers[name](root).rstrip("\n").split("\n")


def build_text(text: str, root: Path, renderers=None) -> str:
    out: list[str] = []
    for name, lines in segments(text):
        out += lines if name is None else [f"<!-- generated: {name} -->", *rendered(name, root, renderers), END]
    return "\n".join(out)


def numbers_in_prose(lines: list[str], first_line: int = 1) -> list[tuple[int, str]]:
    """(line number, text) of every number outside code, link targets and HTML comments."""
    found, fenced = [], False
    for offset, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        visible = re.sub(r"`[^`]*`", " ", line)
        visible = re.sub(r"\]\([^)]*\)", "] ", visible)
        visible = re.sub(r"<!--.*?-->|<[^>]+>", " ", visible)
        visible = re.sub(r"^\s*(?:\d+\.|[-*])\s", " ", visible)  # list markers
        found += [(first_line + offset, m.group(0)) for m in NUMBER.finditer(visible)]
    return found


def check_text(text: str, root: Path, doc: str = "doc", renderers=None) -> list[str]:
    """Problems of one doc: a block that is not its rendering, an unknown block, a number in prose, a
    hand-written binding comment."""
    problems = []
    line = 1  # the doc's line number of the segment's first line
    for name, lines in segments(text):
        if name is None:
            for number, shown in numbers_in_prose(lines, line):
                problems.append(f"{doc}:{number}: {shown!r} outside a generated block (put it in one, or in code)")
            problems += [f"{doc}:{line + k}: a hand-written binding comment" for k, content in enumerate(lines)
                         if "<!-- cells" in content]
            line += len(lines)
            continue
        try:
            if lines != rendered(name, root, renderers):
                problems.append(f"{doc}:{line}: block {name!r} is not what `glm53 docs build` renders")
        except ValueError as error:
            problems.append(f"{doc}:{line}: {error}")
        line += len(lines) + 2
    return problems


def build(root: Path, docs=DOCS, renderers=None) -> list[str]:
    """Rewrite every generated block of `docs`; returns the docs that changed."""
    from glm53_flash.core.receipts import write_text

    changed = []
    for doc in docs:
        path = root / doc
        if not path.is_file():
            continue
        text = path.read_text()
        new = build_text(text, root, renderers)
        if new != text:
            write_text(path, new)
            changed.append(doc)
    return changed


def check(root: Path, docs=DOCS, renderers=None) -> list[str]:
    problems = []
    for doc in docs:
        path = root / doc
        if path.is_file():
            problems += check_text(path.read_text(), root, doc, renderers)
    return problems


__all__ = ["DOCS", "RENDERERS", "build", "build_text", "check", "check_name", "check_text", "cpu_name",
           "numbers_in_prose", "rendered", "segments"]
