"""Numbers as text, one rule each, for every report (REPORT.md files, summaries' answers, the deck).

- p-values: `format_p`, the rounding rule of `stats.format_p` (three significant digits, scientific
  notation below 0.001), with `None` (no test possible) shown as "n/a".
- signed differences: `format_signed`, a fixed number of decimals with the sign always shown and no
  "-0.0".
- intervals: `format_interval`, "[low, high]" of two signed numbers; with no interval but a range of
  per-seed values, "range [low, high]".

`scale` turns rates into points (100) where a receipt stores fractions.
"""

from __future__ import annotations

from glm53_flash.core import stats


def format_p(value: float | None) -> str:
    """A p-value: three significant digits, scientific notation below 0.001; None -> "n/a"."""
    return "n/a" if value is None else stats.format_p(value)


def format_signed(value: float | None, digits: int = 1, scale: float = 1.0) -> str:
    """+1.2 / -0.4 / +0.0 (never "-0.0"); None -> "n/a"."""
    if value is None:
        return "n/a"
    rounded = round(scale * value, digits)
    return f"{rounded + 0.0 if rounded else 0.0:+.{digits}f}"


def format_interval(interval, digits: int = 1, scale: float = 1.0, spread=None) -> str:
    """"[low, high]" with signs; no interval: "range [low, high]" of `spread` if given, else "n/a"."""
    if interval is None:
        if spread is None:
            return "n/a"
        return f"range {format_interval(spread, digits, scale)}"
    low, high = interval
    return f"[{format_signed(low, digits, scale)}, {format_signed(high, digits, scale)}]"


__all__ = ["format_interval", "format_p", "format_signed"]
