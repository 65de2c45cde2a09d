"""Watching processes from /proc: which members of a session are alive, and waiting for an event."""

from __future__ import annotations

import os
import time
from pathlib import Path


def session_members(session: int) -> dict[int, str]:
    """pid -> state letter of every process whose session id is `session` (from /proc)."""
    members = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == session:
            members[int(entry)] = fields[0]
    return members


def live_members(session: int) -> set[int]:
    return {pid for pid, state in session_members(session).items() if state not in "ZX"}


def wait_until(predicate, ceiling: float = 20.0) -> bool:
    """Poll `predicate` until true; the ceiling only bounds a broken run, it is not a speed test."""
    end = time.monotonic() + ceiling
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def require_full_isolation(verifier) -> None:
    """Skip a test of the kernel layers on a host that refuses them (the reason names what is missing)."""
    import pytest

    isolation = verifier.isolation or {}
    if isolation.get("level") != "full":
        pytest.skip(f"this host allows only partial sandbox isolation (missing: "
                    f"{', '.join(isolation.get('missing', []))}); these assertions need the kernel layers")
