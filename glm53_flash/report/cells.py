"""Figures in the docs, bound to the exact cell of the receipt they come from.

A doc's text is cut into blocks (a paragraph, a list, a table, a heading). Every number in a block
outside code, links and HTML comments is a *figure*, and the block is followed by a binding comment
that names, for each figure in reading order, the cell it shows and how it is shown:

    The faithful arm gains 51.0 points (p 0.0312).
    <!-- cells: results/headline/summary.json
    comparison.units_and_seeds.rl_gain_faithful.mean_difference +f1*100
    comparison.units_and_seeds.rl_gain_faithful.units.sign_flip_p p
    -->

An entry is `[FILE:]PATH FORMAT`: a path into the JSON (keys separated by dots, `[i]` for a list
item, `min:`/`max:`/`sum:`/`len:` before a path with `*` for an aggregate over a wildcard), and a
format: `[abs:][+][,]KIND[DIGITS][*SCALE|/SCALE]` with KIND `d` (a whole number), `f` (fixed
decimals), `g` (significant digits) or `p` (a p-value as the reports print it), so `+f1*100` shows
0.51 as "+51.0". The shown text, sign included, must equal the formatted cell exactly. An entry `= WHY`
marks a number that is not a measurement (a setting, a count the code defines, a date); a table
rendered by code is bound whole: `<!-- cells-table: FILE PATH -->` (PATH holds `columns` and `rows`),
and so is prose the code writes: `<!-- cells-text: FILE PATH -->` ... `<!-- /cells-text -->` (PATH
holds the text).
`glm53 docs check` checks every doc; `glm53 docs bind DOC --receipts FILE ...` writes entries for the
blocks that have none, choosing for each figure a cell that shows it (`?` where none does: a number to
bind by hand, mark as a setting or remove).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from glm53_flash.core.receipts import read_json, read_text, write_text

DOCS = ("README.md", "docs/BENCHMARKS.md", "docs/TUTORIAL.md")  # docs/STUDIES.md: generated blocks (report/docs.py)
BINDING = re.compile(r"<!--\s*cells:\s*(.*?)-->", re.S)
TABLE_BINDING = re.compile(r"<!--\s*cells-table:\s*(\S+)\s+(\S+)\s*-->")
TEXT_BINDING = re.compile(r"<!--\s*cells-text:\s*(\S+)\s+(\S+)\s*-->")
TEXT_END = "<!-- /cells-text -->"
NOT_MEASURED = re.compile(r"<!--\s*not-measured:\s*(.*?)\s*-->")
# A number: an optional sign that no word character precedes, digits with optional thousands
# separators, decimals and an exponent; not part of a word (bf16, x86) or a version (2.13.0).
NUMBER = re.compile(r"(?:(?<![\w.])([+\-\u2212]))?(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:e([-+]?\d+))?"
                    r"(?![\w.,]\d|\d|[A-Za-z_]\w*\d)")
HEX_WORD = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")
FORMAT = re.compile(r"^(abs:)?(\+)?(,)?([dfgp])(\d*)(?:([*/])([0-9.e+\-]+|2\^-?\d+))?$")


@dataclass
class Figure:
    text: str  # as shown, sign included
    line: int


@dataclass
class Block:
    kind: str  # paragraph, table, heading
    start: int  # first line (1-based)
    lines: list[str]
    figures: list[Figure] = field(default_factory=list)
    binding: str | None = None  # the text of its cells comment
    binding_line: int | None = None
    table_binding: tuple[str, str] | None = None
    text_binding: tuple[str, str] | None = None
    not_measured: str | None = None  # a table of settings and names, with the reason


# --------------------------------------------------------------------------- reading a doc


def _visible(text: str) -> str:
    """The text a reader sees as prose: code, link targets and comments removed."""
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "] ", text)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"<[^>]+>", " ", text)
    text = HEX_WORD.sub(" ", text)
    return text.replace("**", "")


def figures_in(text: str, line: int = 0) -> list[Figure]:
    found = []
    for match in NUMBER.finditer(_visible(text)):
        sign, whole, fraction, exponent = match.groups()
        shown = (("-" if sign == "\u2212" else sign) or "") + whole + (fraction or "")
        if exponent is not None:
            shown += "e" + exponent
        found.append(Figure(shown, line))
    return found


def blocks(path: Path) -> list[Block]:
    """The doc's blocks with their figures and bindings (fenced code is skipped)."""
    lines = read_text(path).splitlines()
    result: list[Block] = []
    i, fenced = 0, False
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            fenced = not fenced
            i += 1
            continue
        if fenced or not line.strip():
            i += 1
            continue
        if line.lstrip().startswith("<!--"):
            comment, j = _comment(lines, i)
            text = TEXT_BINDING.search(comment)
            if text:
                k = j
                while k < len(lines) and lines[k].strip() != TEXT_END:
                    k += 1
                result.append(Block("text", j + 1, lines[j:k], text_binding=(text.group(1), text.group(2))))
                i = k + 1
                continue
            if BINDING.search(comment) and result and result[-1].binding is None:
                result[-1].binding, result[-1].binding_line = BINDING.search(comment).group(1), i + 1
            settings = NOT_MEASURED.search(comment)
            table = TABLE_BINDING.search(comment)
            if settings or table:
                k = j
                while k < len(lines) and not lines[k].strip():
                    k += 1
                if k < len(lines) and lines[k].startswith("|"):
                    block = Block("table", k + 1, [], not_measured=settings.group(1) if settings else None,
                                  table_binding=(table.group(1), table.group(2)) if table else None)
                    while k < len(lines) and lines[k].startswith("|"):
                        block.lines.append(lines[k])
                        k += 1
                    result.append(block)
                    j = k
            i = j
            continue
        kind = "table" if line.startswith("|") else "heading" if line.startswith("#") else "paragraph"
        block = Block(kind, i + 1, [])
        while i < len(lines) and lines[i].strip() and not lines[i].lstrip().startswith(("<!--", "```")):
            if kind == "heading" and block.lines:
                break
            if (kind == "table") != lines[i].startswith("|"):
                break
            block.lines.append(lines[i])
            i += 1
            if kind == "heading":
                break
        if kind == "table":
            # the header names columns and the separator nothing: the figures are in the body rows
            block.figures = [f for n, row in enumerate(block.lines[2:], start=block.start + 2)
                             for f in figures_in(row, n)]
        else:
            block.figures = [f for n, row in enumerate(block.lines, start=block.start) for f in figures_in(row, n)]
        result.append(block)
    return result


def _comment(lines: list[str], i: int) -> tuple[str, int]:
    """The HTML comment starting at line i and the index of the line after it."""
    text, j = lines[i], i + 1
    while "-->" not in text and j < len(lines):
        text += "\n" + lines[j]
        j += 1
    return text, j


# --------------------------------------------------------------------------- formatting cells


def format_p(value: float) -> str:
    from glm53_flash.core.stats import format_p as stats_format_p

    return stats_format_p(value)


def format_cell(value, spec: str) -> str:
    """A receipt's value as the doc shows it, under FORMAT (see the module's docstring)."""
    match = FORMAT.match(spec)
    if not match:
        raise ValueError(f"bad format {spec!r}: [abs:][+][,]d|f|g|p[DIGITS][*SCALE|/SCALE]")
    absolute, plus, commas, kind, digits, operator, scale = match.groups()
    if isinstance(value, str) and re.fullmatch(r"-?\d+(\.\d+)?", value):
        value = float(value) if "." in value else int(value)  # a digit written as text (a class label)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"cell is {value!r}, not a number")
    number = float(value)
    if scale:
        factor = 2.0 ** int(scale[2:]) if scale.startswith("2^") else float(scale)
        number = number * factor if operator == "*" else number / factor
    if absolute:
        number = abs(number)
    if kind == "p":
        text = format_p(number)
    elif kind == "d":
        rounded = round(number)
        text = f"{rounded:{',' if commas else ''}d}"
    elif kind == "f":
        text = f"{number:{',' if commas else ''}.{int(digits or 0)}f}"
    else:
        text = f"{number:.{int(digits or 3)}g}"
    if text.startswith("-") and all(ch in "-0.," for ch in text):
        text = text[1:]  # -0.0 is shown as 0.0
    if plus and not text.startswith("-"):
        text = "+" + text
    return text


def resolve(data, path: str):
    """The value at `path` (see the module's docstring); aggregates over `*`."""
    aggregate = None
    for name in ("min:", "max:", "sum:", "len:"):
        if path.startswith(name):
            aggregate, path = name[:-1], path[len(name):]
    values = [data]
    for part in _parts(path):
        next_values = []
        for value in values:
            if part == "*":
                if isinstance(value, dict):
                    next_values.extend(value.values())
                elif isinstance(value, list):
                    next_values.extend(value)
                else:
                    raise KeyError(f"{path}: '*' over a {type(value).__name__}")
            elif isinstance(value, list):
                next_values.append(value[int(part)])
            elif isinstance(value, dict) and part in value:
                next_values.append(value[part])
            else:
                raise KeyError(f"{path}: no {part!r}")
        values = next_values
    if aggregate is None:
        if len(values) != 1:
            raise KeyError(f"{path}: a wildcard needs min:, max:, sum: or len:")
        return values[0]
    if aggregate == "len":
        return len(values)
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return {"min": min, "max": max, "sum": sum}[aggregate](numbers)


def _parts(path: str) -> list[str]:
    """A path's keys: split at dots, except an escaped one (`splits.compositions\\.dev.tasks`)."""
    parts = []
    for piece in (p.replace("\0", ".") for p in path.replace("\\.", "\0").split(".")):
        head, *indices = piece.split("[")
        if head:
            parts.append(head)
        parts += [index.rstrip("]") for index in indices]
    return parts


# --------------------------------------------------------------------------- checking


@dataclass
class Entry:
    file: str | None
    path: str | None
    spec: str | None
    note: str | None  # "= why" entries
    unresolved: bool = False


def parse_binding(text: str) -> tuple[list[str], list[Entry]]:
    """(the files named on the first line, the entries of the following lines)."""
    lines = [line.strip() for line in text.strip().splitlines()]
    files = [part.strip() for part in lines[0].split(",") if part.strip() and part.strip() != "none"] if lines else []
    entries = []
    for line in lines[1:]:
        if not line:
            continue
        if line.startswith("="):
            entries.append(Entry(None, None, None, line[1:].strip() or "a stated value"))
            continue
        if line.startswith("?"):
            entries.append(Entry(None, None, None, None, unresolved=True))
            continue
        target, _, spec = line.rpartition(" ")
        file = None
        if ":" in target and not target.split(":", 1)[0] in ("min", "max", "sum", "len"):
            head, rest = target.split(":", 1)
            if "/" in head or head.endswith(".json"):
                file, target = head, rest
        entries.append(Entry(file, target, spec, None))
    return files, entries


def _rendered(value, what: str) -> list[str]:
    """The lines a generated block must hold: the text (blank lines aside) or the rendered table."""
    if what == "text":
        if not isinstance(value, str):
            raise TypeError("the cell holds no text")
        return [line.rstrip() for line in value.strip().splitlines() if line.strip()]
    from glm53_flash.report.tables import markdown_table

    return markdown_table(value["columns"], value["rows"])


def check_doc(root: Path, doc: str, generated_only: bool = False) -> list[str]:
    """Every problem with the figures of one doc: a block with figures and no binding, a count that
    differs, a cell that does not exist, a figure that is not its cell as formatted. `generated_only`:
    only the tables and texts bound whole (for a doc whose other figures are not bound)."""
    problems = []
    cache: dict[str, object] = {}

    def load(name: str):
        if name not in cache:
            path = root / name
            if not path.is_file():
                raise FileNotFoundError(f"{name} is not in the repository")
            cache[name] = read_json(path)
        return cache[name]

    for block in blocks(root / doc):
        where = f"{doc}:{block.start}"
        if block.not_measured is not None:
            if not block.not_measured.strip():
                problems.append(f"{where}: say why the table's numbers are not measurements")
            continue
        generated = block.text_binding or block.table_binding
        if generated is not None:
            file, path = generated
            what = "text" if block.text_binding else "table"
            try:
                value = resolve(load(file), path)
                expected = _rendered(value, what)
            except (KeyError, FileNotFoundError, TypeError, ValueError) as error:
                problems.append(f"{where}: {what} binding: {error}")
                continue
            if [line.rstrip() for line in block.lines if what == "table" or line.strip()] != expected:
                problems.append(f"{where}: the {what} is not {file} {path} as "
                                f"{'generated' if what == 'text' else 'rendered'}")
            continue
        if generated_only:
            continue
        if not block.figures:
            if block.binding and parse_binding(block.binding)[1]:
                problems.append(f"{where}: a binding for a block without figures")
            continue
        if block.binding is None:
            shown = ", ".join(f.text for f in block.figures[:6])
            problems.append(f"{where}: {len(block.figures)} figure(s) with no <!-- cells: --> binding ({shown} ...)")
            continue
        files, entries = parse_binding(block.binding)
        if len(entries) != len(block.figures):
            problems.append(f"{where}: {len(block.figures)} figure(s) but {len(entries)} binding entries")
            continue
        for figure, entry in zip(block.figures, entries):
            if entry.unresolved:
                problems.append(f"{doc}:{figure.line}: {figure.text} is not bound to a cell (an entry '?')")
                continue
            if entry.note is not None:
                continue
            file = entry.file or (files[0] if files else None)
            if file is None:
                problems.append(f"{where}: the binding names no receipt file")
                break
            try:
                value = resolve(load(file), entry.path)
                shown = format_cell(value, entry.spec)
            except (KeyError, IndexError, ValueError, FileNotFoundError, TypeError) as error:
                problems.append(f"{doc}:{figure.line}: {figure.text}: {error}")
                continue
            if shown != figure.text:
                problems.append(f"{doc}:{figure.line}: shows {figure.text} but {file} {entry.path} is {shown}")
    return problems


# --------------------------------------------------------------------------- writing bindings


FORMATS = ["d", ",d", "f1", "f2", "f3", "f4", "g3", "g2", "p", "f1*100", "f0*100", "f2*100", "d*100", "f1/60",
           "f2*1e3", "f1*1e3", "d*1e3", "f2*2^-30", "f1*2^-30", "f2*2^-20", "f1*2^-20", "d*2^-20", "f1/1e3",
           "f1/1e6", "d/1e3"]


def _leaves(node, path=""):
    if isinstance(node, bool) or node is None:
        return
    if isinstance(node, (int, float)):
        if math.isfinite(node):
            yield path, node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _leaves(value, f"{path}[{index}]")


def shown_index(root: Path, files: list[str]) -> dict[str, list[tuple[str, str, str]]]:
    """Every way a cell of `files` can be shown -> [(file, path, format)]."""
    index: dict[str, list[tuple[str, str, str]]] = {}
    for name in files:
        data = read_json(root / name)
        for path, value in _leaves(data):
            for spec in FORMATS:
                for prefix in ("", "+", "abs:"):
                    try:
                        text = format_cell(value, prefix + spec)
                    except ValueError:
                        continue
                    index.setdefault(text, []).append((name, path, prefix + spec))
    return index


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def suggest(block: Block, pools: list[tuple[list[str], dict]]) -> tuple[str, list[tuple[Figure, int]]]:
    """A binding comment for a block: for each figure, the cell that shows it in the first pool that has
    one (the receipts the block names, then its section's marker, then the caller's), the one nearest the
    previous figure's cell; '?' where none does. Also the figures several cells could show."""
    files = [name for names, _ in pools for name in names]
    lines = [", ".join(files[:1] or ["(no receipt named)"])]
    previous, ambiguous = "", []
    for figure in block.figures:
        candidates = next((index[figure.text] for _, index in pools if figure.text in index), [])
        if not candidates:
            lines.append(f"? {figure.text}")
            continue
        if len({c[:2] for c in candidates}) > 1:
            ambiguous.append((figure, len({c[:2] for c in candidates})))
        file, path, spec = max(candidates, key=lambda c: (_common_prefix(c[1], previous), -len(c[1]),
                                                          not c[2].startswith(("+", "abs:"))))
        previous = path
        prefix = "" if file == files[0] else f"{file}:"
        lines.append(f"{prefix}{path} {spec}")
    return "<!-- cells: " + "\n".join(lines) + "\n-->", ambiguous


RECEIPT_NAME = re.compile(r"results/[\w.\-/]+?\.json")
MARKER = re.compile(r"<!--\s*receipts:\s*(.*?)\s*-->")


def _named_receipts(root: Path, text: str) -> list[str]:
    names = []
    for name in RECEIPT_NAME.findall(text):
        if (root / name).is_file() and name not in names:
            names.append(name)
    return names


def bind(root: Path, doc: str, files: list[str] | None = None) -> dict:
    """Write a suggested binding after every block of `doc` with figures and none. A block's candidate
    cells come from the receipts it names, those of the `<!-- receipts: -->` marker above it in its
    section, and `files`. Returns counts: blocks bound, entries, unresolved ('?'), ambiguous (a figure
    several different cells show)."""
    path = root / doc
    text_lines = read_text(path).splitlines()
    insertions, counts = [], {"blocks": 0, "entries": 0, "unresolved": 0, "ambiguous": []}
    section_marker: list[str] = []
    indexes: dict[tuple, dict] = {}
    marker_at = {}
    for number, line in enumerate(text_lines, start=1):
        found = MARKER.search(line)
        if found:
            marker_at[number] = [part.strip().rstrip("/") for part in found.group(1).split(",") if part.strip()]
    for block in blocks(path):
        if block.kind == "heading" and block.lines[0].startswith("## "):
            section_marker = []
        for number in [n for n in marker_at if n < block.start]:
            section_marker = [name for name in marker_at.pop(number)]
        if not block.figures or block.binding is not None or block.table_binding is not None \
                or block.text_binding is not None or block.not_measured is not None:
            continue
        pools = []
        for group in (_named_receipts(root, "\n".join(block.lines)), section_marker, list(files or [])):
            expanded = []
            for name in group:
                target = root / name
                found = sorted(str(p.relative_to(root)) for p in target.rglob("*.json")) if target.is_dir() else [name]
                expanded += [c for c in found if c not in expanded and (root / c).is_file()]
            if expanded:
                key = tuple(expanded)
                if key not in indexes:
                    indexes[key] = shown_index(root, expanded)
                pools.append((expanded, indexes[key]))
        comment, ambiguous = suggest(block, pools)
        counts["ambiguous"] += [(f.line, f.text, n) for f, n in ambiguous]
        counts["blocks"] += 1
        counts["entries"] += len(block.figures)
        counts["unresolved"] += comment.count("\n? ")
        insertions.append((block.start - 1 + len(block.lines), comment))
    for after, comment in reversed(insertions):
        text_lines[after:after] = comment.splitlines()
    write_text(path, "\n".join(text_lines) + "\n")
    return counts


def insert_bindings(path: Path, bindings: dict[int, str]) -> None:
    """Write binding comments after the blocks that start at the given lines (1-based): {line: comment
    body, the files on its first line and an entry per line}."""
    lines = read_text(path).splitlines()
    by_start = {block.start: block for block in blocks(path)}
    for start in sorted(bindings, reverse=True):
        block = by_start[start]
        if block.binding is not None:
            raise ValueError(f"{path}:{start} already has a binding")
        at = block.start - 1 + len(block.lines)
        lines[at:at] = ("<!-- cells: " + bindings[start].strip() + "\n-->").splitlines()
    write_text(path, "\n".join(lines) + "\n")


def candidates(root: Path, files: list[str], shown: str) -> list[tuple[str, str, str]]:
    """Every (file, path, format) of `files` that shows as `shown` (to write a binding by hand)."""
    return shown_index(root, files).get(shown, [])


__all__ = ["DOCS", "candidates", "Block", "Figure", "bind", "blocks", "check_doc", "figures_in", "format_cell", "resolve"]
