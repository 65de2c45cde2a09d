"""The tasks layer's side of the seal: a sealed split's tasks are built only for an opening the ledger
granted in this process and whose "opened" line is on disk.

Two checks, each enough alone (the ledger, evaluation/ledger.py, is the first layer; this is the second):
1. The opening object is the one `grant` registered (the ledger registers an opening only after its
   line is appended and fsynced): an object that merely has a `.split`, or an Opening made by hand, is
   refused.
2. Its ledger file, read back here, holds an "opened" line with its id and split whose sha256 is the
   one it was granted with: a ledger write that silently went nowhere (a device, a write dropped) is
   refused.

This module knows nothing of the ledger's code: it reads the file as JSON lines.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat

# The largest ledger read back (a ledger of 100,000 openings is about 100 MB).
LEDGER_MAX_BYTES = 256 * 1024 * 1024


class SealedSplitError(ValueError):
    """A sealed split's tasks were built or evaluated without an opening of that split granted by the
    ledger, or a plan opened it again without a reason (evaluation/ledger.py raises it too)."""


# opening_id -> the opening object the ledger granted in this process
_GRANTED: dict[str, object] = {}
# opening ids whose line was found on disk (checked once per process)
_SEEN_ON_DISK: set[str] = set()


def grant(opening) -> None:
    """Register `opening` (called by the ledger once its "opened" line is on disk)."""
    for name in ("opening_id", "split", "ledger", "line_sha256"):
        if not getattr(opening, name, None):
            raise SealedSplitError(f"an opening needs {name} to be granted")
    _GRANTED[opening.opening_id] = opening


def revoke(opening) -> None:
    """Forget `opening` (a closed opening builds no more tasks)."""
    if _GRANTED.get(getattr(opening, "opening_id", None)) is opening:
        del _GRANTED[opening.opening_id]
        _SEEN_ON_DISK.discard(opening.opening_id)


def check(split: str, opening, sealed: tuple[str, ...]) -> None:
    """Raise SealedSplitError unless `split` is not sealed or `opening` is a granted, written opening of it."""
    if split not in sealed:
        return
    hint = (f"{split} is a sealed split: its tasks are built only for an opening of it that the ledger granted in "
            f"this process (`glm53 eval --split {split} --open-sealed PURPOSE`, or in Python "
            f"evaluation.ledger.require_open(...).activate() passed as opening=); its task ids and sizes need none "
            f"(split_task_ids, split_units)")
    if opening is None:
        raise SealedSplitError(hint)
    opening_id = getattr(opening, "opening_id", None)
    if not isinstance(opening_id, str) or _GRANTED.get(opening_id) is not opening:
        raise SealedSplitError(f"{hint}; the opening given was not granted (or was closed)")
    if opening.split != split:
        raise SealedSplitError(f"the opening given is for {opening.split}, not {split}")
    if opening_id not in _SEEN_ON_DISK:
        _check_on_disk(opening)
        _SEEN_ON_DISK.add(opening_id)


def _check_on_disk(opening) -> None:
    """The opening's "opened" line is in its ledger file, with the sha256 it was granted with."""
    path = str(opening.ledger)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as error:
        raise SealedSplitError(f"the ledger {path} of opening {opening.opening_id} cannot be read ({error.strerror})")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SealedSplitError(f"the ledger {path} is not a regular file")
        if info.st_size > LEDGER_MAX_BYTES:
            raise SealedSplitError(f"the ledger {path} is larger than {LEDGER_MAX_BYTES} bytes")
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(LEDGER_MAX_BYTES + 1)
    finally:
        os.close(fd)
    for raw in data.splitlines():
        if opening.opening_id.encode() not in raw:
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if (isinstance(line, dict) and line.get("kind") == "opened" and line.get("opening_id") == opening.opening_id
                and line.get("split") == opening.split):
            if hashlib.sha256(raw).hexdigest() == opening.line_sha256:
                return
            raise SealedSplitError(f"the opened line of {opening.opening_id} in {path} differs from the one granted")
    raise SealedSplitError(f"the ledger {path} holds no opened line for {opening.opening_id}: nothing sealed is "
                           f"built before its opening is on disk")


__all__ = ["LEDGER_MAX_BYTES", "SealedSplitError", "check", "grant", "revoke"]
