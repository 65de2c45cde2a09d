"""Progress on long work, one rule for every command: a tqdm bar on a terminal, a plain line per
tenth of the work in a log file or a pipe, nothing with --quiet. No torch here."""

from __future__ import annotations

import sys


def progress_bar(total: int, *, quiet: bool = False, initial: int = 0, desc: str = "", unit: str = "step"):
    """A tqdm bar on stderr; None when `quiet`. When stderr is not a terminal (a log file, a pipe), a
    bar would only collect carriage returns: a plain line at every tenth of the work instead."""
    if quiet:
        return None
    if not _stderr_is_terminal():
        return ProgressLines(total, initial=initial, desc=desc, unit=unit)
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, file=sys.stderr)


class ProgressLines:
    """Progress for logs: one line per tenth of the work (and at the end) with the rate and the time
    left, e.g. `pretrain: 40/100 step (40%), 2.1 s/step, about 2 min left, loss 3.12`. It takes the
    calls the loops make on a tqdm bar (update, set_postfix, set_postfix_str, close)."""

    def __init__(self, total: int, *, initial: int = 0, desc: str = "", unit: str = "step", stream=None):
        import time

        self.total, self.n, self.desc, self.unit = total, initial, desc or "progress", unit
        self.stream = stream if stream is not None else sys.stderr
        self._clock = time.perf_counter
        self._start, self._start_n = self._clock(), initial
        self._postfix = ""
        self._next = self._milestone_after(initial)

    def _milestone_after(self, done: int) -> int:
        tenth = max(1, self.total // 10)
        return min(self.total, (done // tenth + 1) * tenth)

    # A milestone's line waits for the postfix that callers set right after update(), so it shows the
    # metrics of the step it reports.
    _pending = False

    def update(self, n: int = 1) -> None:
        self._flush()
        self.n += n
        if self.n >= self._next:
            self._pending = True
            self._next = self._milestone_after(self.n)

    def set_postfix(self, values: dict | None = None, **more) -> None:
        items = {**(values or {}), **more}
        self._postfix = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in items.items())
        self._flush()

    def set_postfix_str(self, text: str) -> None:
        self._postfix = text
        self._flush()

    def close(self) -> None:
        self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._pending = False
            self._line()

    def _line(self) -> None:
        done = self.n - self._start_n
        elapsed = self._clock() - self._start
        parts = [f"{self.desc}: {self.n}/{self.total} {self.unit} ({100 * self.n // max(self.total, 1)}%)"]
        if done > 0 and elapsed > 0:
            per = elapsed / done
            left = per * (self.total - self.n)
            parts.append(f"{per:.3g} s/{self.unit}")
            if self.n < self.total:
                parts.append(f"about {left / 60:.1f} min left" if left >= 90 else f"about {left:.0f} s left")
        if self._postfix:
            parts.append(self._postfix)
        print(", ".join(parts), file=self.stream, flush=True)


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
