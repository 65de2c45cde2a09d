"""The ledger of sealed-split openings: a write-ahead, hash-chained record of who opened a sealed split,
when, from which committed code, after which dev decision, and which receipts came of it.

The sealed splits (`tasks.SEALED_SPLITS`) are evaluated only through an `Opening`:

    opening = ledger.require_open("confirm", "headline confirmation", plan_sha256=plan_sha,
                                  decision=[run / "selection-dev.json"])   # checks the rules, writes nothing
    opening.activate()           # appends and fsyncs the "opened" line; only now can its tasks be built
    receipt = evaluate_greedy(model, split_tasks("confirm", opening=opening), opening=opening, ...)
    opening.write_receipt(path, receipt)   # the receipt, then its "receipt" line
    opening.close()

Guarantees (each checked by a test that breaks the layer before it):
- **Write-ahead.** An "opened" line (purpose, plan sha256, the dev decision files' sha256, the code's
  commit and whether it was clean, the command) is on disk before any sealed task exists: the tasks
  layer (tasks/seal.py) builds a sealed task only for an opening this module granted in this process
  *and* whose line it reads back from the file. A failed write means nothing was built.
- **Chained.** Every line carries `prev_sha256`, the sha256 of every byte of the file before it, so a
  changed, removed or reordered earlier line breaks every later one (`glm53 ledger verify`). Lines from
  before the chain began (no `kind`) are legacy: read, reported, never written again.
- **Append only.** A ledger tracked by git must extend its committed version: an emptied or rewritten
  ledger is refused before anything opens (so an emptied ledger cannot reopen a plan without a reason).
- **One opening per plan.** A second opening of a split for the same plan needs a reason (`reopen=`,
  `--reopen`), which its line records.
- **Committed code.** In a git checkout whose code (glm53_flash/, pyproject.toml) has uncommitted
  changes, an opening is refused unless `allow_dirty=True` (`--allow-dirty`); such an opening is marked
  unvouched.
- **Explicit place.** The ledger is the path given (`ledger=`, `--ledger`, recorded in each receipt) or
  results/ledger.jsonl of the checkout that holds this package (of the current directory outside one).
  No environment variable moves it. It must be a regular file (no symlink, no device).

Nothing here imports torch.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import os
import stat
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from glm53_flash.tasks import SEALED_SPLITS, SPLITS
from glm53_flash.tasks import seal
# One error for every refusal of a sealed split (its tasks built, or evaluated, without an opening; a plan
# opening it again without a reason): the tasks layer's, which the CLI prints as one line.
from glm53_flash.tasks.seal import SealedSplitError

LEDGER_RELATIVE = Path("results") / "ledger.jsonl"
TEXT_MAX_CHARS = 500
# A receipt line (and every legacy line) has these fields.
LINE_FIELDS = ("split", "utc", "commit", "command", "purpose", "receipt", "receipt_sha256", "opening_id",
               "plan_sha256", "reopen")
OPENED_FIELDS = ("kind", "split", "utc", "commit", "code_clean", "vouched", "command", "purpose", "plan_sha256",
                 "decision", "opening_id", "reopen", "ledger", "prev_sha256")
# The code whose changes make an opening unvouched (paths of the checkout).
CODE_PATHS = ("glm53_flash", "pyproject.toml")
DECISION_MAX_BYTES = 64 * 1024 * 1024
LEDGER_MAX_BYTES = seal.LEDGER_MAX_BYTES

# Where the default ledger is, when a caller names none: None means results/ledger.jsonl of the checkout.
# The test suite points it at a temporary file (tests/conftest.py); nothing else sets it.
_DEFAULT_OVERRIDE: Path | None = None


# --------------------------------------------------------------------------- where the ledger is


def repository_root() -> Path | None:
    """The checkout that holds this package (pyproject.toml beside glm53_flash/), or None when the
    package is installed elsewhere."""
    root = Path(__file__).resolve().parents[2]  # glm53_flash/evaluation/ledger.py -> the checkout
    return root if (root / "pyproject.toml").is_file() and (root / "glm53_flash").is_dir() else None


def ledger_path(path: str | Path | None = None) -> Path:
    """`path` when given, else results/ledger.jsonl of the checkout (or of the current directory outside
    a checkout). Absolute, with symlinks left as they are (a symlinked ledger is refused, not followed)."""
    if path is None:
        path = _DEFAULT_OVERRIDE if _DEFAULT_OVERRIDE is not None else (repository_root() or Path.cwd()) / LEDGER_RELATIVE
    return Path(os.path.abspath(path))


def committed_ledger() -> Path | None:
    """results/ledger.jsonl of the checkout that holds this package (None outside a checkout): the one
    ledger whose lines the committed reports trust."""
    root = repository_root()
    return root / LEDGER_RELATIVE if root is not None else None


def is_sealed(split: str) -> bool:
    return split in SEALED_SPLITS


# --------------------------------------------------------------------------- reading


def _read_bytes(where: Path) -> bytes:
    """The ledger's bytes (b"" when there is none), refusing what is not a regular file or is too big."""
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return b""
    except OSError as error:
        raise ValueError(f"ledger {where} cannot be read ({error.strerror}; a ledger is a regular file, not a "
                         f"symlink)") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"ledger {where} is not a regular file")
        if info.st_size > LEDGER_MAX_BYTES:
            raise ValueError(f"ledger {where} is larger than {LEDGER_MAX_BYTES} bytes")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _parse(where: Path, data: bytes) -> list[dict]:
    lines = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as reason:
            raise ValueError(f"ledger {where} line {number} is not valid JSON ({reason})") from None
        if not isinstance(line, dict):
            raise ValueError(f"ledger {where} line {number} lacks {', '.join(LINE_FIELDS)}")
        wanted = OPENED_FIELDS if line.get("kind") == "opened" else LINE_FIELDS
        missing = [name for name in wanted if name not in line]
        if missing:
            raise ValueError(f"ledger {where} line {number} lacks {', '.join(missing)}")
        if line.get("kind") not in (None, "opened", "receipt"):
            raise ValueError(f"ledger {where} line {number} has an unknown kind {line.get('kind')!r}")
        lines.append(line)
    return lines


def read_ledger(path: str | Path | None = None) -> list[dict]:
    """Every line of the ledger, oldest first ([] when there is none yet): "opened" lines, receipt lines
    and legacy lines. A line that is not a JSON object with its kind's fields is an error naming its
    number: the ledger is never skimmed."""
    where = ledger_path(path)
    return _parse(where, _read_bytes(where))


def receipt_lines(lines: list[dict]) -> list[dict]:
    """The lines that record a receipt (legacy lines all do)."""
    return [line for line in lines if line.get("kind") != "opened"]


def ledger_lines(split: str | None = None, path: str | Path | None = None) -> list[dict]:
    """The ledger's receipt lines, only those of `split` when given (what every report shows for its split)."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    return [line for line in receipt_lines(read_ledger(path)) if split is None or line["split"] == split]


def opened_lines(split: str | None = None, path: str | Path | None = None) -> list[dict]:
    """The ledger's "opened" lines (write-ahead openings), of `split` when given."""
    return [line for line in read_ledger(path) if line.get("kind") == "opened" and (split is None or line["split"] == split)]


def report_rows(lines: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(columns, rows) of a table of ledger lines for a report: one row per receipt written."""
    columns = ["opened (UTC)", "split", "commit", "purpose", "reopen reason", "receipt", "receipt sha256"]
    rows = [[line["utc"], line["split"], (line["commit"] or "unknown")[:12], line["purpose"], line["reopen"] or "",
             line["receipt"], line["receipt_sha256"][:16]] for line in receipt_lines(lines)]
    return columns, rows


def format_lines(lines: list[dict]) -> str:
    """The ledger as plain text (what `glm53 ledger` prints): an entry per opening and per receipt."""
    if not lines:
        return "(no sealed split has been opened)"
    out = []
    for line in lines:
        if line.get("kind") == "opened":
            vouched = "vouched" if line["vouched"] else "UNVOUCHED (uncommitted code)"
            out.append(f"{line['utc']}  {line['split']:<8} {(line['commit'] or 'unknown')[:12]:<12}  opened, {vouched}")
            decisions = ", ".join(f"{d['path']} ({d['sha256'][:12]})" for d in line["decision"]) or "none named"
            out.append(f"    decision: {decisions}")
        else:
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
    """The first line of every earlier opening of `split` for this plan, oldest first: its "opened" line,
    or for a legacy opening its first receipt line."""
    return first_lines([line for line in read_ledger(path)
                        if line["split"] == split and line["plan_sha256"] == plan_sha256])


# --------------------------------------------------------------------------- the code and the file


def code_state(root: Path | None = None) -> dict:
    """The code an opening runs: {"commit", "clean", "changes"} of the checkout `root` (default: the one
    that holds this package). `clean` is None outside a git checkout; changes are those under CODE_PATHS,
    untracked files included."""
    root = repository_root() if root is None else Path(root)
    if root is None:
        return {"commit": None, "clean": None, "changes": []}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10,
                                check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", *CODE_PATHS],
                                cwd=root, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "clean": None, "changes": []}
    changes = [line[3:] for line in status.splitlines() if line.strip()]
    return {"commit": commit, "clean": not changes, "changes": changes}


def _git_tracked_content(where: Path) -> bytes | None:
    """The ledger's content in HEAD when git tracks it there, else None."""
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=where.parent, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        relative = os.path.relpath(where, os.path.realpath(top))
        shown = subprocess.run(["git", "show", f"HEAD:{relative}"], cwd=top, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return shown.stdout if shown.returncode == 0 else None


def check_append_only(where: Path) -> None:
    """A ledger git tracks must begin with its committed content: refuse an emptied or rewritten one."""
    if not where.parent.is_dir():
        return
    committed = _git_tracked_content(where)
    if committed and not _read_bytes(where).startswith(committed):
        raise SealedSplitError(f"ledger {where} no longer begins with its committed content (emptied or rewritten): "
                               f"a ledger is only appended to; restore it (git checkout -- {where.name}) first")


def _check_ledger_file(where: Path) -> None:
    """The ledger is a regular file (or does not exist yet) in a directory that exists or can be made."""
    try:
        info = os.lstat(where)
    except FileNotFoundError:
        return
    except OSError as error:
        raise SealedSplitError(f"ledger {where} cannot be checked ({error.strerror})") from None
    if stat.S_ISLNK(info.st_mode):
        raise SealedSplitError(f"ledger {where} is a symlink: name the file itself")
    if not stat.S_ISREG(info.st_mode):
        raise SealedSplitError(f"ledger {where} is not a regular file")


def _append_line(where: Path, line: dict) -> str:
    """Append `line` with its `prev_sha256` (the sha256 of every byte before it, set in `line`) under an
    exclusive lock, then fsync; returns the sha256 of the line as written (without its newline). Refuses a
    file whose last line is torn (no final newline), a symlink, or anything but a regular file."""
    where.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(where, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SealedSplitError(f"ledger {where} is not a regular file")
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size > LEDGER_MAX_BYTES:
            raise SealedSplitError(f"ledger {where} is larger than {LEDGER_MAX_BYTES} bytes")
        digest, last = hashlib.sha256(), b"\n"
        offset = 0
        while offset < size:
            chunk = os.pread(fd, min(1 << 20, size - offset), offset)
            if not chunk:
                break
            digest.update(chunk)
            last = chunk[-1:]
            offset += len(chunk)
        if size and last != b"\n":
            raise SealedSplitError(f"ledger {where} ends in a torn line (no newline): repair it before appending")
        line["prev_sha256"] = digest.hexdigest()
        text = json.dumps(line, sort_keys=True, ensure_ascii=False)
        data = (text + "\n").encode("utf-8")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        if os.fstat(fd).st_size < size + len(data):
            raise SealedSplitError(f"ledger {where} did not keep the line written to it")
    finally:
        os.close(fd)  # closing releases the lock
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------- opening


@dataclass(frozen=True)
class Opening:
    """Permission to evaluate one sealed split, from `require_open`. `activate()` writes its "opened" line
    (write-ahead); only then does the tasks layer build its tasks. Every receipt written from it is
    recorded with `record` (or written and recorded with `write_receipt`)."""

    split: str
    purpose: str
    opening_id: str
    granted_utc: str
    command: tuple[str, ...]
    plan_sha256: str | None
    reopen: str | None
    ledger: Path
    decision: tuple[str, ...] = ()
    optional_decision: tuple[str, ...] = ()
    commit: str | None = None
    code_clean: bool | None = None
    recorded: list = field(default_factory=list, compare=False, repr=False)
    _state: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def active(self) -> bool:
        return "line_sha256" in self._state

    @property
    def line_sha256(self) -> str | None:
        """The sha256 of this opening's "opened" line (None before `activate`)."""
        return self._state.get("line_sha256")

    @property
    def vouched(self) -> bool:
        return bool(self.code_clean) and self.commit is not None

    def activate(self) -> "Opening":
        """Append this opening's "opened" line to the ledger and fsync it, then let the tasks layer build its
        split (idempotent). Refused when the plan was opened meanwhile, a decision file is missing, or the
        ledger cannot take the line: then nothing sealed can be built."""
        if self.active:
            return self
        if self._state.get("closed"):
            raise SealedSplitError(f"the opening {self.opening_id} of {self.split} was closed")
        _check_ledger_file(self.ledger)
        check_append_only(self.ledger)
        if self.plan_sha256 is not None and self.reopen is None:
            _refuse_earlier(self.split, self.plan_sha256, self.ledger)
        from glm53_flash.core.receipts import utc_now

        line = {
            "kind": "opened", "split": self.split, "utc": utc_now(), "commit": self.commit,
            "code_clean": self.code_clean, "vouched": self.vouched, "command": list(self.command),
            "purpose": self.purpose, "plan_sha256": self.plan_sha256, "decision": _decision_record(
                self.decision + tuple(p for p in self.optional_decision if Path(p).is_file())),
            "opening_id": self.opening_id, "reopen": self.reopen, "ledger": str(self.ledger),
        }
        self._state["line_sha256"] = _append_line(self.ledger, line)
        self._state["line"] = line
        seal.grant(self)
        return self

    def close(self) -> None:
        """Stop being usable (no more tasks are built from it; its lines stay); a later require_open with
        the same arguments grants a new opening."""
        self._state["closed"] = True
        seal.revoke(self)
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
                "ledger": str(self.ledger), "opened_line_sha256": self.line_sha256, "commit": self.commit,
                "vouched": self.vouched}

    def record(self, receipt: str | Path) -> dict:
        """Append the receipt line of a receipt written from this opening; returns the line."""
        from glm53_flash.core.receipts import sha256_file, utc_now

        if not self.active:
            raise SealedSplitError(f"the opening {self.opening_id} of {self.split} was never activated: no receipt "
                                   f"can come from it")
        receipt = Path(receipt)
        if not receipt.is_file():
            raise ValueError(f"receipt {receipt} does not exist; write it before recording it in the ledger")
        line = {
            "kind": "receipt", "split": self.split, "utc": utc_now(), "commit": self.commit,
            "command": list(self.command), "purpose": self.purpose, "receipt": _display_path(receipt),
            "receipt_sha256": sha256_file(receipt), "opening_id": self.opening_id, "plan_sha256": self.plan_sha256,
            "reopen": self.reopen,
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


def _refuse_earlier(split: str, plan_sha256: str, where: Path) -> None:
    earlier = plan_openings(split, plan_sha256, where)
    if earlier:
        first = earlier[0]
        raise SealedSplitError(
            f"split {split} was already opened for this plan ({plan_sha256[:12]}) {len(earlier)} time(s), "
            f"first at {first['utc']} ({first['purpose']!r}); pass --reopen \"<reason>\" (reopen=) to open it again")


def _decision_record(paths: tuple[str, ...]) -> list[dict]:
    """[{"path", "sha256"}] of the dev decision files an opening follows; each must be a regular file."""
    record = []
    for name in paths:
        path = Path(name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as error:
            raise SealedSplitError(f"the dev decision {path} cannot be read ({error.strerror}): an opening follows "
                                   f"a decision that exists") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > DECISION_MAX_BYTES:
                raise SealedSplitError(f"the dev decision {path} is not a regular file of at most "
                                       f"{DECISION_MAX_BYTES} bytes")
            digest = hashlib.sha256()
            while chunk := os.read(fd, 1 << 20):
                digest.update(chunk)
        finally:
            os.close(fd)
        record.append({"path": _display_path(path), "sha256": digest.hexdigest()})
    return record


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
                 argv: list[str] | None = None, ledger: str | Path | None = None, decision=(),
                 optional_decision=(), allow_dirty: bool = False) -> Opening:
    """An opening of sealed `split` for a stated purpose, or SealedSplitError. Checks every rule now and
    writes nothing: `activate()` appends its "opened" line, right before its tasks are built.

    `decision`: the dev decision files the opening follows (hashed into its line when it activates; each
    must exist then); `optional_decision`: more, hashed when they exist by then (a study whose first sealed
    unit may run before its selection).
    With `plan_sha256`, an earlier opening of this split for the same plan is refused unless `reopen`
    gives the reason. Code with uncommitted changes is refused unless `allow_dirty` (then unvouched).
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
    if isinstance(decision, (str, Path)):
        decision = (decision,)
    decision = tuple(str(Path(d)) for d in decision)
    optional_decision = tuple(str(Path(d)) for d in optional_decision)
    where = ledger_path(ledger)
    key = (str(where), split, plan_sha256, purpose, reopen, decision, optional_decision)
    if key in _GRANTED:
        _ACTIVE[(str(where), split)] = _GRANTED[key]
        return _GRANTED[key]
    _check_ledger_file(where)
    check_append_only(where)
    if plan_sha256 is not None and reopen is None:
        _refuse_earlier(split, plan_sha256, where)
    code = code_state()
    if code["clean"] is False and not allow_dirty:
        shown = ", ".join(code["changes"][:3]) + (" ..." if len(code["changes"]) > 3 else "")
        raise SealedSplitError(f"the code has uncommitted changes ({shown}): commit them before opening {split}, "
                               f"or pass --allow-dirty (allow_dirty=True) to open it unvouched")
    from glm53_flash.core.receipts import utc_now

    opening = Opening(split=split, purpose=purpose, opening_id=uuid.uuid4().hex, granted_utc=utc_now(),
                      command=tuple(sys.argv if argv is None else argv), plan_sha256=plan_sha256, reopen=reopen,
                      ledger=where, decision=decision, optional_decision=optional_decision, commit=code["commit"],
                      code_clean=code["clean"])
    _GRANTED[key] = opening
    _ACTIVE[(str(where), split)] = opening
    return opening


def opening_for(split: str, opening: Opening | None = None) -> Opening | None:
    """The opening an evaluation of `split` runs under: None for a split that is not sealed; for a
    sealed one, `opening` (which must be of that split and activated) or the newest granted in this
    process for the default ledger and not closed. Raises SealedSplitError when there is none."""
    if not is_sealed(split):
        if opening is not None:
            raise ValueError(f"an opening of {opening.split} was given, but split {split} is not sealed")
        return None
    if opening is None:
        opening = _ACTIVE.get((str(ledger_path()), split))
    if opening is None:
        raise SealedSplitError(f"split {split} is sealed: open it first with --open-sealed \"<purpose>\" "
                               f"(glm53 eval; ledger.require_open in Python); every opening is recorded in "
                               f"{ledger_path()}")
    if not isinstance(opening, Opening) or opening.split != split:
        raise SealedSplitError(f"the opening given is for {getattr(opening, 'split', opening)!r}, not {split}")
    if not opening.active:
        raise SealedSplitError(f"the opening {opening.opening_id} of {split} is not activated: its opened line goes "
                               f"into the ledger (opening.activate()) before anything of the split is evaluated")
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
    """The path relative to the checkout when it lies inside it, else absolute."""
    resolved = Path(os.path.abspath(path))
    root = repository_root()
    if root is not None and resolved.is_relative_to(root):
        return str(resolved.relative_to(root))
    return str(resolved)


def parse_utc(text: str) -> _dt.datetime:
    return _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


__all__ = [
    "LINE_FIELDS",
    "OPENED_FIELDS",
    "Opening",
    "SealedSplitError",
    "check_append_only",
    "check_opening_request",
    "code_state",
    "committed_ledger",
    "evaluation_plan_sha256",
    "first_lines",
    "format_lines",
    "is_sealed",
    "ledger_lines",
    "ledger_path",
    "opened_lines",
    "opening_for",
    "plan_openings",
    "read_ledger",
    "receipt_lines",
    "record_opening",
    "report_rows",
    "repository_root",
    "require_open",
]
