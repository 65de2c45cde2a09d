"""Unit counts that a document claims for the headline's benchmark (the confirm and holdout splits of the
trained families), read from its sentences so that a test can hold them to the count the tasks give."""
from __future__ import annotations

import re

# A sentence is about the headline's benchmark when it names one of its splits or its families.
_BENCHMARK = re.compile(r"(confirm|holdout|trained famil|families suite|original benchmark|\b(?:24|96) tasks)",
                        re.IGNORECASE)
# "6 units", "6 of 6 units", "3 distinct functions", "6 independent units": the count is the total.
_COUNT = re.compile(r"\b(\d+)\s+(?:of\s+(\d+)\s+)?(?:distinct\s+|independent\s+)?(?:units|functions)\b", re.IGNORECASE)


def sentences(text: str) -> list[str]:
    """The text cut at sentence ends, list items and blank lines, with markup's line breaks joined."""
    text = re.sub(r"<[^>]+>", " ", text)
    pieces = re.split(r"(?<=[.!?])\s+|\n\s*(?:[-*]\s|\|)|\n\s*\n", text)
    return [" ".join(piece.split()) for piece in pieces if piece.strip()]


def claimed_unit_counts(text: str) -> list[tuple[int, str]]:
    """Every unit count in a sentence about the headline's benchmark, with its sentence."""
    found = []
    for sentence in sentences(text):
        if _BENCHMARK.search(sentence):
            for match in _COUNT.finditer(sentence):
                found.append((int(match.group(2) or match.group(1)), sentence))
    return found
