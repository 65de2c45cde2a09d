"""The ledger of sealed-split openings: who looked at a sealed split, when, at which commit, and why.

The sealed splits (`tasks.SEALED_SPLITS`: final, confirm, holdout) can be evaluated only through an
`Opening`, granted by `require_open(split, purpose, ...)`; every receipt written from it appends one
JSON line to the ledger:

    {"split", "utc", "commit", "command" (argv), "purpose", "receipt", "receipt_sha256",
     "opening_id", "plan_sha256", "reopen"}

Lines are only ever appended (under an exclusive lock, then fsync). Where the ledger lives:
`$GLM53_LEDGER` when set; otherwise `results/ledger.jsonl` in the checkout that holds this package (a
directory with pyproject.toml beside `glm53_flash/`); for an installed package outside a checkout,
`results/ledger.jsonl` under the current directory. `ledger_path()` says which.

A plan (`plan_sha256`: a reproduce plan, a study design, the settings of one `glm53 eval`) opens a
split once: a second opening of the same split for the same plan is refused unless it names a
reason (`reopen=`, the CLI's `--reopen`), which its lines record. Within one process the same
(split, plan, purpose) returns the opening already granted, so one run may write several receipts.

Library use (reproduce, studies):

    opening = ledger.require_open("confirm", "headline confirmation", plan_sha256=plan_sha)
    receipt = evaluate_greedy(model, tasks, opening=opening, ...)
    opening.write_receipt(path, receipt)        # writes the receipt, then appends its ledger line
    opening.close()                             # or: with ledger.require_open(...) as opening: ...

Nothing here imports torch.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from glm53_flash.tasks import SEALED_SPLITS, SPLITS
# One error for every refusal of a sealed split (its tasks built, or evaluated, without an opening; a plan
# opening it again without a reason): the tasks layer's, which the CLI prints as one line.
from glm53_flash.tasks.splits import SealedSplitError

LEDGER_ENV = "GLM53_LEDGER"
LEDGER_RELATIVE = Path("results") / "ledger.jsonl"
TEXT_MAX_CHARS = 500
LINE_FIELDS = ("split", "utc", "commit", "command", "purpose", "receipt", "receipt_sha256", "opening_id",
               "plan_sha256", "reopen")




# --------------------------------------------------------------------------- where the ledger is


def repository_root() -> Path | None:
    """The checkout that holds this package (pyproject.toml beside glm53_flash/), or None when the
    package is installed elsewhere."""
    root = Path(__file__).resolve().parents[2]  # glm53_flash/evaluation/ledger.py -> the checkout
    return root if (root / "pyproject.toml").is_file() and (root / "glm53_flash").is_dir() else None


def ledger_path(path: str | Path | None = None) -> Path:
    """`path` when given, else $GLM53_LEDGER, else results/ledger.jsonl of the checkout (or of the
    current directory outside a checkout)."""
    if path is not None:
        return Path(path)
    if os.environ.get(LEDGER_ENV):
        return Path(os.environ[LEDGER_ENV])
    return (repository_root() or Path.cwd()) / LEDGER_RELATIVE


def is_sealed(split: str) -> bool:
    return split in SEALED_SPLITS


# --------------------------------------------------------------------------- reading


def read_ledger(path: str | Path | None = None) -> list[dict]:
    """Every line of the ledger, oldest first ([] when there is none yet). A line that is not a JSON
    object with the ledger's fields is an error naming its number: the ledger is never skimmed."""
    where = ledger_path(path)
    try:
        text = where.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    lines = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except json.JSONDecodeError as reason:
            raise ValueError(f"ledger {where} line {number} is not valid JSON ({reason})") from None
        if not isinstance(line, dict) or not set(LINE_FIELDS) <= set(line):
            missing = sorted(set(LINE_FIELDS) - set(line)) if isinstance(line, dict) else list(LINE_FIELDS)
            raise ValueError(f"ledger {where} line {number} lacks {', '.join(missing)}")
        lines.append(line)
    return lines


def ledger_lines(split: str | None = None, path: str | Path | None = None) -> list[dict]:
    """The ledger's lines, only those of `split` when given (what every report shows for its split)."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    return [line for line in read_ledger(path) if split is None or line["split"] == split]


def report_rows(lines: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(columns, rows) of a table of ledger lines for a report: one row per receipt written."""
    columns = ["opened (UTC)", "split", "commit", "purpose", "reopen reason", "receipt", "receipt sha256"]
    rows = [[line["utc"], line["split"], (line["commit"] or "unknown")[:12], line["purpose"], line["reopen"] or "",
             line["receipt"], line["receipt_sha256"][:16]] for line in lines]
    return columns, rows


def format_lines(lines: list[dict]) -> str:
    """The ledger as plain text (what `glm53 ledger` prints)."""
    if not lines:
        return "(no sealed split has been opened)"
    out = []
    for line in lines:
        out.append(f"{line['utc']}  {line['split']:<8} {(line['commit'] or 'unknown')[:12]:<12}  "
                   f"{line['receipt_sha256'][:12]}  {line['receipt']}")
        out.append(f"    purpose: {line['purpose']}")
        if line["reopen"]:
            out.append(f"    reopened: {line['reopen']}")
        out.append(f"    command: {' '.join(line['command'])}")
    return "\n".join(out)


def first_lines(lines: list[dict]) -> list[dict]:
    """The first of `lines` of each opening, in the ledger's order (oldest first): one per opening."""
    seen: dict[str, dict] = {}
    for line in lines:
        seen.setdefault(line["opening_id"], line)
    return list(seen.values())


def plan_openings(split: str, plan_sha256: str, path: str | Path | None = None) -> list[dict]:
    """The first line of every earlier opening of `split` for this plan, oldest first."""
    return first_lines([line for line in ledger_lines(split, path) if line["plan_sha256"] == plan_sha256])


# --------------------------------------------------------------------------- opening


@dataclass(frozen=True)
class Opening:
    """Permission to evaluate one sealed split, granted by `require_open`. Every receipt written from
    it is recorded with `record` (or written and recorded with `write_receipt`)."""

    split: str
    purpose: str
    opening_id: str
    granted_utc: str
    command: tuple[str, ...]
    plan_sha256: str | None
    reopen: str | None
    ledger: Path
    recorded: list = field(default_factory=list, compare=False, repr=False)

    def close(self) -> None:
        """Stop being the opening that evaluations of this split use by default in this process (its
        recorded lines stay; a later require_open with the same arguments grants a new opening)."""
        key = (str(self.ledger), self.split)
        if _ACTIVE.get(key) is self:
            del _ACTIVE[key]
        for granted_key, granted in list(_GRANTED.items()):
            if granted is self:
                del _GRANTED[granted_key]

    def __enter__(self) -> "Opening":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def to_dict(self) -> dict:
        """What a receipt carries about the opening it was evaluated under (`sealed_opening`)."""
        return {"split": self.split, "purpose": self.purpose, "opening_id": self.opening_id,
                "granted_utc": self.granted_utc, "plan_sha256": self.plan_sha256, "reopen": self.reopen,
                "ledger": str(self.ledger)}

    def record(self, receipt: str | Path) -> dict:
        """Append the ledger line of a receipt written from this opening; returns the line."""
        from glm53_flash.core.receipts import git_commit, sha256_file, utc_now

        receipt = Path(receipt)
        if not receipt.is_file():
            raise ValueError(f"receipt {receipt} does not exist; write it before recording it in the ledger")
        line = {
            "split": self.split, "utc": utc_now(), "commit": git_commit(), "command": list(self.command),
            "purpose": self.purpose, "receipt": _display_path(receipt), "receipt_sha256": sha256_file(receipt),
            "opening_id": self.opening_id, "plan_sha256": self.plan_sha256, "reopen": self.reopen,
        }
        _append_line(self.ledger, line)
        self.recorded.append(line)
        return line

    def write_receipt(self, path: str | Path, receipt: dict) -> dict:
        """Write an evaluation receipt of this split atomically, then record it; returns the ledger line."""
        from glm53_flash.core.receipts import write_json

        opened = (receipt.get("sealed_opening") or {}).get("opening_id")
        if receipt.get("split") != self.split or opened != self.opening_id:
            raise SealedSplitError(f"this receipt was not evaluated under the opening of {self.split} "
                                   f"{self.opening_id}; evaluate with opening= that opening")
        write_json(path, receipt)
        return self.record(path)


record_opening = Opening.record  # the function form: record_opening(opening, receipt_path)

# Openings granted in this process, by (ledger, split, plan, purpose, reopen); the newest per (ledger,
# split) is the one evaluation uses when a caller passes none.
_GRANTED: dict[tuple, Opening] = {}
_ACTIVE: dict[tuple[str, str], Opening] = {}


def committed_ledger() -> Path | None:
    """results/ledger.jsonl of the checkout that holds this package (None outside a checkout): the one
    ledger whose lines the committed reports trust."""
    root = repository_root()
    return root / "results" / "ledger.jsonl" if root is not None else None


def unvouched_receipts(directory: str | Path, ledger: str | Path | None = None) -> list[Path]:
    """The sealed-split receipts under `directory` whose sha256 the ledger (default: the committed one)
    does not hold: opened under another ledger, changed since, or never recorded."""
    import hashlib

    where = Path(ledger) if ledger is not None else committed_ledger()
    held = {line.get("receipt_sha256") for line in read_ledger(where)} if where is not None and where.is_file() else set()
    found = []
    for path in sorted(Path(directory).rglob("*.json")):
        data = path.read_bytes()
        if b'"sealed_opening"' not in data:
            continue
        try:
            receipt = json.loads(data)
        except ValueError:
            continue
        if isinstance(receipt, dict) and receipt.get("sealed_opening") and \
                hashlib.sha256(data).hexdigest() not in held:
            found.append(path)
    return found


def check_opening_request(split: str, open_sealed: str | None, reopen: str | None) -> None:
    """The sealed-split rules of a command that evaluates (`glm53 eval`), checked before anything is
    loaded or written: a sealed split needs a stated purpose (--open-sealed), and --open-sealed and
    --reopen mean nothing on a split that is not sealed."""
    sealed = is_sealed(split)
    if sealed and open_sealed is None:
        raise SealedSplitError(f"split {split} is sealed: pass --open-sealed \"<purpose>\" to evaluate on it "
                               f"(the opening is recorded in {ledger_path()})")
    if not sealed and (open_sealed is not None or reopen is not None):
        raise ValueError(f"--open-sealed and --reopen apply only to the sealed splits ({', '.join(SEALED_SPLITS)})")


def evaluation_plan_sha256(*, checkpoint_sha256: str | None, split: str, task_ids: list[str], samples: int,
                           seed: int, temperature: float | None, top_k: int | None, top_p: float | None,
                           max_new_tokens: int, stop: str, precision: str | None = None) -> str:
    """The identity of one `glm53 eval` on a sealed split: the weights and every setting that decides its
    result. Evaluating the same again on the same sealed split is a reopening (it needs a reason).
    `precision`: a resolved Precision's `setting` (None: the default, which earlier plans left out)."""
    from glm53_flash.core.receipts import sha256_json

    plan = {"command": "glm53 eval", "checkpoint_sha256": checkpoint_sha256, "split": split,
            "task_ids": list(task_ids), "samples": samples, "seed": seed, "temperature": temperature,
            "top_k": top_k, "top_p": top_p, "max_new_tokens": max_new_tokens, "stop": stop}
    if precision is not None:
        plan["precision"] = precision
    return sha256_json(plan)


def require_open(split: str, purpose: str, *, plan_sha256: str | None = None, reopen: str | None = None,
                 argv: list[str] | None = None, ledger: str | Path | None = None) -> Opening:
    """Grant an opening of sealed `split` for a stated purpose, or raise SealedSplitError.

    With `plan_sha256`, an earlier opening of this split for the same plan (in the ledger) is refused
    unless `reopen` gives the reason. Writes nothing: lines are appended as receipts are recorded.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    if not is_sealed(split):
        raise ValueError(f"split {split!r} is not sealed; only {', '.join(SEALED_SPLITS)} are opened through "
                         f"the ledger")
    purpose = _one_line_text(purpose, "the purpose of opening a sealed split")
    reopen = None if reopen is None else _one_line_text(reopen, "the reason to reopen")
    if plan_sha256 is not None and (not isinstance(plan_sha256, str) or not plan_sha256):
        raise ValueError(f"plan_sha256 must be a non-empty string, got {plan_sha256!r}")
    where = ledger_path(ledger).resolve()
    key = (str(where), split, plan_sha256, purpose, reopen)
    if key in _GRANTED:
        _ACTIVE[(str(where), split)] = _GRANTED[key]
        return _GRANTED[key]
    if plan_sha256 is not None and reopen is None:
        earlier = plan_openings(split, plan_sha256, where)
        if earlier:
            first = earlier[0]
            raise SealedSplitError(
                f"split {split} was already opened for this plan ({plan_sha256[:12]}) {len(earlier)} time(s), "
                f"first at {first['utc']} ({first['purpose']!r}); pass --reopen \"<reason>\" (reopen=) to "
                f"open it again")
    from glm53_flash.core.receipts import utc_now

    opening = Opening(split=split, purpose=purpose, opening_id=uuid.uuid4().hex, granted_utc=utc_now(),
                      command=tuple(sys.argv if argv is None else argv), plan_sha256=plan_sha256,
                      reopen=reopen, ledger=where)
    _GRANTED[key] = opening
    _ACTIVE[(str(where), split)] = opening
    return opening


def opening_for(split: str, opening: Opening | None = None) -> Opening | None:
    """The opening an evaluation of `split` runs under: None for a split that is not sealed; for a
    sealed one, `opening` (which must be of that split) or the newest granted in this process for the
    current ledger and not closed. Raises SealedSplitError when there is none."""
    if not is_sealed(split):
        if opening is not None:
            raise ValueError(f"an opening of {opening.split} was given, but split {split} is not sealed")
        return None
    if opening is None:
        opening = _ACTIVE.get((str(ledger_path().resolve()), split))
    if opening is None:
        raise SealedSplitError(f"split {split} is sealed: open it first with --open-sealed \"<purpose>\" "
                               f"(glm53 eval; ledger.require_open in Python); every opening is recorded in "
                               f"{ledger_path()}")
    if not isinstance(opening, Opening) or opening.split != split:
        raise SealedSplitError(f"the opening given is for {getattr(opening, 'split', opening)!r}, not {split}")
    return opening


# --------------------------------------------------------------------------- helpers


def _one_line_text(text, what: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{what} must be a non-empty text")
    text = text.strip()
    if "\n" in text or "\r" in text:
        raise ValueError(f"{what} must be one line")
    if len(text) > TEXT_MAX_CHARS:
        raise ValueError(f"{what} must be at most {TEXT_MAX_CHARS} characters, got {len(text)}")
    return text


def _display_path(path: Path) -> str:
    """The receipt's path relative to the checkout when it lies inside it, else absolute."""
    resolved = path.resolve()
    root = repository_root()
    if root is not None and resolved.is_relative_to(root):
        return str(resolved.relative_to(root))
    return str(resolved)


def _append_line(path: Path, line: dict) -> None:
    """Append one line under an exclusive lock and fsync it: concurrent writers never interleave, and a
    line is on disk before the call returns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(line, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)  # closing releases the lock


__all__ = [
    "LEDGER_ENV",
    "LINE_FIELDS",
    "Opening",
    "SealedSplitError",
    "check_opening_request",
    "committed_ledger",
    "unvouched_receipts",
    "evaluation_plan_sha256",
    "first_lines",
    "format_lines",
    "is_sealed",
    "ledger_lines",
    "ledger_path",
    "opening_for",
    "plan_openings",
    "read_ledger",
    "record_opening",
    "report_rows",
    "repository_root",
    "require_open",
]
