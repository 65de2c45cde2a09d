"""Tables for every report, one toolkit: markdown for REPORT.md files and the README, HTML for the
deck, and the conversion between them (so a table written once in markdown is the deck's table too).

Every cell is escaped, because cells carry values read from receipts, which may be hostile: in HTML
all of `& < > " '`; in markdown what could end the cell or the line, or start markup that acts (raw
HTML, an autolink, a link or an image), and nothing else, so the text of ordinary cells (code spans,
bold, intervals in brackets) is unchanged."""

from __future__ import annotations

import html
import re


def esc(value) -> str:
    return html.escape(str(value), quote=True)


# A `<` that could open a tag, a comment, a declaration or an autolink; `](` that would close a link's
# text and open its target; a `|` that no odd run of backslashes already escapes; a line break.
_TAG_OPEN = re.compile(r"<(?=[A-Za-z0-9/!?])")
_LINK_TARGET = re.compile(r"\]\(")
_BARE_PIPE = re.compile(r"(?<!\\)((?:\\\\)*)\|")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def markdown_escape(value) -> str:
    """`str(value)` as markdown text that stays inside its table cell and its line and makes no tag,
    autolink, link or image: line breaks become spaces, `<` before a tag's first character `&lt;`,
    `](` `]\\(`, and every unescaped `|` `\\|`."""
    text = _LINE_BREAK.sub(" ", str(value))
    text = _TAG_OPEN.sub("&lt;", text)
    text = _LINK_TARGET.sub(r"]\\(", text)
    return _BARE_PIPE.sub(lambda match: match.group(1) + "\\|", text)


class MarkdownLine(str):
    """A line of markdown whose values are escaped already (markdown_table's lines)."""


def markdown_table(columns: list[str], rows: list[list]) -> list[str]:
    """A GitHub markdown table, one string per line (the README and the reports use this form); every
    header and cell is escaped with markdown_escape."""
    lines = ["| " + " | ".join(markdown_escape(c) for c in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(markdown_escape(cell) for cell in row) + " |" for row in rows]
    return [MarkdownLine(line) for line in lines]


def markdown_document(lines: list[str]) -> str:
    """Lines of prose with receipt values in them, and markdown_table's lines, as one markdown text: each
    prose line keeps its own markup (bold, code) but loses its line breaks, tags, autolinks and links
    (markdown_escape, pipes aside); a MarkdownLine is kept as it is."""
    return "\n".join(line if isinstance(line, MarkdownLine) else
                     _LINK_TARGET.sub(r"]\\(", _TAG_OPEN.sub("&lt;", _LINE_BREAK.sub(" ", str(line)))) for line in lines)


def html_table(columns, rows) -> str:
    out = ["<table><thead><tr>", *[f"<th>{esc(c)}</th>" for c in columns], "</tr></thead><tbody>"]
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


_CELL_SEPARATOR = re.compile(r"(?<!\\)\|")


def _markdown_cell_text(cell: str) -> str:
    """A markdown_table cell back to its text (markdown_escape undone, line breaks aside)."""
    return cell.strip().replace("\\|", "|").replace("]\\(", "](").replace("&lt;", "<")


def html_from_markdown(lines: list[str]) -> str:
    """A markdown pipe table (as `markdown_table` or report/headline.py write it) as HTML, same cells."""
    rows = [[_markdown_cell_text(cell) for cell in _CELL_SEPARATOR.split(line.strip().strip("|"))] for line in lines]
    return html_table(rows[0], rows[2:])
