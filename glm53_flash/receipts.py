"""Receipts: provenance for every run (git commit, argv, versions, machine) and atomic JSON writing."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from . import __version__


def git_commit(cwd: str | Path | None = None) -> str | None:
    """The checkout's HEAD commit (with '+dirty' when the tree has changes), or None outside git."""
    where = Path(cwd) if cwd else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"glm53_flash": __version__, "python": platform.python_version()}
    for name in ("torch", "numpy", "safetensors"):
        module = sys.modules.get(name)
        versions[name] = getattr(module, "__version__", None) if module else None
    return versions


def utc_now() -> str:
    """The current time as an ISO 8601 UTC string to the second (every receipt's timestamp format)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def provenance(argv: list[str] | None = None, device: str | None = None) -> dict:
    return {
        "created_utc": utc_now(),
        "git_commit": git_commit(),
        "argv": list(sys.argv if argv is None else argv),
        "versions": package_versions(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "device": device,
        # the verifier sandbox's isolation, as reached by the weakest worker this process started
        # (None when no program was judged here)
        "verifier_isolation": _verifier_isolation(),
    }


def _verifier_isolation() -> dict | None:
    from .verifier.sandbox import observed_isolation

    return observed_isolation()


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports KiB, macOS bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def read_json(path: str | Path, error: type[Exception] = ValueError, corrupt: str = "{path} is not valid JSON"):
    """The JSON value in the file at `path`; `error(corrupt.format(path=path) + " (reason)")` when it
    does not parse. (A missing file is the caller's message to give.)"""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as reason:
        raise error(f"{corrupt.format(path=path)} ({reason})") from None


def sha256_json(payload) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def write_text(path: str | Path, text: str) -> Path:
    """Write text atomically: a temporary file in the same directory, then rename (readers never see
    half a file, and an interrupted write leaves the old one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; receipts and reports are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def atomic_directory(directory: str | Path, what: str = "directory"):
    """Build a directory atomically: yields a temporary sibling to fill, renamed to `directory` when
    the block ends (after an fsync), deleted if it raises. Refuses to replace an existing directory,
    so an interrupted writer leaves either nothing or a complete directory."""
    directory = Path(directory)
    if directory.exists():
        raise FileExistsError(f"{what} {directory} already exists")
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".tmp", dir=directory.parent))
    try:
        yield tmp
        _fsync_dir(tmp)
        os.rename(tmp, directory)
        _fsync_dir(directory.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json(path: str | Path, payload, indent: int = 2) -> Path:
    """Write JSON atomically (see write_text), keys sorted."""
    return write_text(path, json.dumps(payload, indent=indent, sort_keys=True) + "\n")
