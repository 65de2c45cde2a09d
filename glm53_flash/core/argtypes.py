"""argparse value types shared by the subcommands (comma-separated lists)."""

from __future__ import annotations

import argparse


def comma_ints(text: str) -> tuple[int, ...]:
    """'1,2,3' -> (1, 2, 3); at least one integer."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values
