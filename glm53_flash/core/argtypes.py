"""Comma-separated lists, parsed in one place: of integers, the flags' argparse type (`comma_ints`) and the
library's parser (`parse_int_list`) that the option fields, the benchmarks and `glm53 reproduce` use; of
names, `comma_names`."""

from __future__ import annotations

import argparse


def parse_int_list(text: str, what: str = "the value") -> tuple[int, ...]:
    """'1,2,3' -> (1, 2, 3) ('' -> ()); ValueError naming `what` for anything but integers."""
    try:
        return tuple(int(part) for part in str(text).split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{what} must be comma-separated integers, got {text!r}") from None


def comma_ints(text: str) -> tuple[int, ...]:
    """The argparse type: '1,2,3' -> (1, 2, 3); at least one integer."""
    try:
        values = parse_int_list(text, "the value")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def comma_names(text: str) -> tuple[str, ...]:
    """The argparse type of a list of names: 'a, b' -> ('a', 'b') ('' -> ()); what the names may be is the
    library's to check."""
    return tuple(part.strip() for part in str(text).split(",") if part.strip())


__all__ = ["comma_ints", "comma_names", "parse_int_list"]
