"""Tables for every report, one toolkit: markdown for REPORT.md files and the README, HTML for the
deck, and the conversion between them (so a table written once in markdown is the deck's table too)."""

from __future__ import annotations

import html


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def markdown_table(columns: list[str], rows: list[list]) -> list[str]:
    """A GitHub markdown table, one string per line (the README and the reports use this form)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def html_table(columns, rows) -> str:
    out = ["<table><thead><tr>", *[f"<th>{esc(c)}</th>" for c in columns], "</tr></thead><tbody>"]
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def html_from_markdown(lines: list[str]) -> str:
    """A markdown pipe table (as `markdown_table` or report/headline.py write it) as HTML, same cells."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines]
    return html_table(rows[0], rows[2:])
