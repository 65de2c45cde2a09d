"""`glm53 ledger verify`: check a ledger's chain and what it vouches for.

1. The chain: every line with a `kind` carries the sha256 of every byte before it; a legacy line (from
   before the chain began) may not follow a chained one.
2. Append only: where git tracks the ledger, every committed version begins with the one before it and
   the file begins with the last.
3. Openings: each id opens once; every receipt line follows its opening's "opened" line; an opening's
   code commit exists in the repository; an unvouched opening (uncommitted code) is named.
4. Receipts: every sealed receipt under the results directory (`*.json`, `*.json.gz`) has its sha256 in
   a receipt line, and, for a chained opening, comes from a vouched one whose dev decision files were
   committed (the same content, in any file under results/) no later than the opening.

Legacy lines are counted and listed as notes: their order cannot be proven.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
from pathlib import Path

from glm53_flash.evaluation.ledger import (
    _parse, _read_bytes, ledger_path, parse_utc, repository_root,
)

RECEIPT_MAX_BYTES = 256 * 1024 * 1024


def _git(root: Path, *args: str, text: bool = True, check: bool = True):
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=text, timeout=120, check=check)


def _read_receipt_bytes(path: Path) -> bytes | None:
    """A receipt's JSON bytes (.json.gz decompressed, capped), or None when it is not a regular file."""
    if path.is_symlink() or not path.is_file() or path.stat().st_size > RECEIPT_MAX_BYTES:
        return None
    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as handle:
            data = handle.read(RECEIPT_MAX_BYTES + 1)
        return None if len(data) > RECEIPT_MAX_BYTES else data
    return path.read_bytes()


def sealed_receipts(directory: str | Path) -> dict[Path, str]:
    """Every sealed-split receipt under `directory` (a JSON object with a `sealed_opening`), by path, with
    the sha256 of its JSON bytes."""
    found = {}
    for path in sorted(Path(directory).rglob("*")):
        if not (path.name.endswith(".json") or path.name.endswith(".json.gz")):
            continue
        data = _read_receipt_bytes(path)
        if data is None or b'"sealed_opening"' not in data:
            continue
        try:
            receipt = json.loads(data)
        except ValueError:
            continue
        if isinstance(receipt, dict) and receipt.get("sealed_opening"):
            found[path] = hashlib.sha256(data).hexdigest()
    return found


def unvouched_receipts(directory: str | Path, ledger: str | Path | None = None) -> list[Path]:
    """The sealed-split receipts under `directory` whose sha256 no receipt line of the ledger (default: the
    committed one) holds: opened under another ledger, changed since, or never recorded."""
    from glm53_flash.evaluation.ledger import committed_ledger, read_ledger, receipt_lines

    where = Path(ledger) if ledger is not None else committed_ledger()
    held = ({line["receipt_sha256"] for line in receipt_lines(read_ledger(where))}
            if where is not None and where.is_file() else set())
    return [path for path, digest in sealed_receipts(directory).items() if digest not in held]


def _committed_versions(root: Path, relative: str) -> list[bytes]:
    """The file's content at every commit that changed it, oldest first."""
    log = _git(root, "log", "--format=%H", "--reverse", "--", relative).stdout.split()
    versions = []
    for commit in log:
        shown = _git(root, "show", f"{commit}:{relative}", text=False, check=False)
        if shown.returncode == 0:
            versions.append(shown.stdout)
    return versions


def _committed_contents(root: Path, names: set[str]) -> dict[str, str]:
    """sha256 of content -> the earliest committer time (ISO) at which a file under results/ named one of
    `names` held that content."""
    if not names:
        return {}
    listed = _git(root, "ls-tree", "-r", "--name-only", "HEAD", "--", "results").stdout.splitlines()
    earliest: dict[str, str] = {}
    for relative in listed:
        if os.path.basename(relative) not in names:
            continue
        for line in _git(root, "log", "--format=%H %cI", "--", relative).stdout.splitlines():
            commit, when = line.split(" ", 1)
            shown = _git(root, "show", f"{commit}:{relative}", text=False, check=False)
            if shown.returncode != 0:
                continue
            digest = hashlib.sha256(shown.stdout).hexdigest()
            if digest not in earliest or parse_utc(when) < parse_utc(earliest[digest]):
                earliest[digest] = when
    return earliest


def verify_ledger(path: str | Path | None = None, results: str | Path | None = None,
                  root: str | Path | None = None) -> dict:
    """Check the ledger at `path` (default: the committed one) and the sealed receipts under `results`
    (default: results/ of the checkout; None outside one). Returns {"problems": [...], "notes": [...],
    "counts": {...}}; any problem means the ledger does not vouch for what it should."""
    where = ledger_path(path)
    root = Path(root) if root is not None else repository_root()
    if root is not None and _git(root, "rev-parse", "--show-toplevel", check=False).returncode != 0:
        root = None  # not a git checkout: nothing to check against git
    if results is None and root is not None:
        results = root / "results"
    results = None if results is None else Path(results)
    problems: list[str] = []
    notes: list[str] = []
    data = _read_bytes(where)
    lines = _parse(where, data)

    # 1. the chain
    digest = hashlib.sha256()
    chained = legacy = 0
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            line = json.loads(raw)
            if "kind" in line:
                chained += 1
                if line.get("prev_sha256") != digest.hexdigest():
                    problems.append(f"line {number}: the chain breaks (prev_sha256 does not match the bytes before it)")
            else:
                legacy += 1
                if chained:
                    problems.append(f"line {number}: a legacy (unchained) line after the chain began")
        digest.update(raw + b"\n")

    # 2. append only, against git
    if root is not None:
        try:
            relative = os.path.relpath(where, os.path.realpath(_git(root, "rev-parse", "--show-toplevel").stdout.strip()))
            versions = _committed_versions(root, relative) if not relative.startswith("..") else []
        except (OSError, subprocess.SubprocessError):
            versions = []
        for older, newer in zip(versions, versions[1:] + [data]):
            if not newer.startswith(older):
                problems.append(f"{relative}: a committed version does not begin with the one before it "
                                f"(the ledger was rewritten)")
                break

    # 3. openings
    opened = {}
    for line in lines:
        if line.get("kind") == "opened":
            if line["opening_id"] in opened:
                problems.append(f"opening {line['opening_id']} is opened twice")
            opened[line["opening_id"]] = line
        elif line.get("kind") == "receipt":
            first = opened.get(line["opening_id"])
            if first is None or first["split"] != line["split"]:
                problems.append(f"receipt {line['receipt']}: its opening {str(line['opening_id'])[:12]} has no earlier "
                                f"opened line of {line['split']}")
    known_commits: dict[str, bool] = {}
    for line in opened.values():
        commit = line["commit"]
        if root is not None and commit:
            if commit not in known_commits:
                known_commits[commit] = _git(root, "cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode == 0
            if not known_commits[commit]:
                problems.append(f"opening {line['opening_id'][:12]} ({line['split']}, {line['utc']}): its commit "
                                f"{commit[:12]} is not in the repository")
        if not line["vouched"]:
            notes.append(f"opening {line['opening_id'][:12]} ({line['split']}, {line['utc']}) is unvouched: its "
                         f"code had uncommitted changes")

    # 4. the receipts under results/
    by_sha = {}
    for line in lines:
        if line.get("kind") != "opened":
            by_sha.setdefault(line["receipt_sha256"], line)
    receipts = sealed_receipts(results) if results is not None and Path(results).is_dir() else {}
    needed = {}
    for receipt, sha in receipts.items():
        line = by_sha.get(sha)
        shown = os.path.relpath(receipt, root) if root is not None else str(receipt)
        if line is None:
            problems.append(f"{shown}: a sealed receipt no receipt line vouches for")
            continue
        if line.get("kind") is None:
            continue  # legacy: counted below
        first = opened.get(line["opening_id"])
        if first is None:
            continue  # named under 3
        if not first["vouched"]:
            problems.append(f"{shown}: comes from an unvouched opening (uncommitted code)")
        if not first["decision"]:
            problems.append(f"{shown}: its opening names no dev decision")
        needed[first["opening_id"]] = first
    if needed and root is not None:
        names = {os.path.basename(d["path"]) for line in needed.values() for d in line["decision"]}
        committed = _committed_contents(root, names)
        for line in needed.values():
            for decision in line["decision"]:
                when = committed.get(decision["sha256"])
                if when is None or parse_utc(when) > parse_utc(line["utc"]):
                    problems.append(f"opening {line['opening_id'][:12]} ({line['split']}, {line['utc']}): its decision "
                                    f"{decision['path']} was not committed under results/ before it "
                                    f"({'first committed ' + when if when else 'never committed'})")
    legacy_receipts = sum(1 for sha in receipts.values() if sha in by_sha and by_sha[sha].get("kind") is None)
    if legacy:
        notes.append(f"{legacy} legacy line(s) from before the write-ahead chain: their receipts are vouched by "
                     f"sha256, but the order of decision and opening cannot be proven for them "
                     f"({legacy_receipts} receipt(s) under results/)")
    return {"ledger": str(where), "problems": problems, "notes": notes,
            "counts": {"lines": len(lines), "chained": chained, "legacy": legacy, "openings": len(opened),
                       "receipts_checked": len(receipts)}}


__all__ = ["sealed_receipts", "unvouched_receipts", "verify_ledger"]
