"""Receipts: provenance for every run (git commit, argv, versions, machine, the math environment), and
the one way commands write and read files that may be hostile: writes go to a new temporary file
(O_CREAT | O_EXCL | O_NOFOLLOW) in the target's directory and are renamed over it, never through a
symbolic link and, given `within`, never outside that directory; reads are capped by READ_LIMITS
and take regular files only."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from glm53_flash.core import __version__


# The code a `glm53` command runs is the checkout as it was when the command started: Python loaded
# it then. The CLI pins that commit here, so that receipts written hours later by a long run do not
# name commits made in the meantime.
_launch_commit: dict = {}


def pin_launch_commit() -> None:
    """Record the package checkout's commit now; git_commit() returns it for the rest of the process."""
    _launch_commit.clear()
    _launch_commit["commit"] = git_commit()


def git_commit(cwd: str | Path | None = None) -> str | None:
    """The checkout's HEAD commit (with '+dirty' when the tree has changes), or None outside git; for
    the package's own checkout, the commit pinned when the command started, if one was."""
    if cwd is None and "commit" in _launch_commit:
        return _launch_commit["commit"]
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


# CPU features that decide which math kernels run (oneDNN, MKL and ATen dispatch on them).
MATH_CPU_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512dq", "avx512bw",
                  "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
                  "asimd", "sve")
# Environment variables that change which kernels run or how many threads they use.
MATH_ENVIRONMENT = ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                    "DNNL_MAX_CPU_ISA", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG")
_TORCH_CONFIG_LINES = {"Math Kernel Library": "mkl", "MKL-DNN": "onednn", "OpenMP": "openmp"}


@functools.lru_cache(maxsize=1)
def cpu_description() -> dict:
    """The processor: model name, vendor, family and model numbers and the math-relevant instruction-set
    flags it reports (Linux /proc/cpuinfo; elsewhere only what `platform` knows). Read once per process."""
    model = vendor = family = number = None
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "model name" and model is None:
                    model = value
                elif key == "vendor_id" and vendor is None:
                    vendor = value
                elif key == "cpu family" and family is None:
                    family = value
                elif key == "model" and number is None:
                    number = value
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
                if model and vendor and flags and family and number:
                    break
    except OSError:
        pass
    return {"model": model or platform.processor() or None, "vendor": vendor, "family": family,
            "model_number": number, "machine": platform.machine(), "math_flags": [flag for flag in MATH_CPU_FLAGS if flag in flags]}


@functools.lru_cache(maxsize=1)
def _torch_build() -> dict:
    import torch

    build: dict = {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
                   "mkl_available": torch.backends.mkl.is_available(),
                   "onednn_available": torch.backends.mkldnn.is_available(),
                   "blas": None, "lapack": None}
    for line in torch.__config__.show().splitlines():
        text = line.strip().lstrip("- ").strip()
        for marker, key in _TORCH_CONFIG_LINES.items():
            if marker in text and key not in build:
                build[key] = text
        if text.startswith("Build settings:"):
            text = text.partition(":")[2]
        for field in text.split(","):
            name, _, value = field.strip().partition("=")
            if name in ("BLAS_INFO", "LAPACK_INFO"):
                build[name.split("_")[0].lower()] = value
    return build


def math_environment() -> dict:
    """What decides the floating-point results of the CPU math: the processor and its flags, the math
    environment variables that are set (MKL_CBWR, ATEN_CPU_CAPABILITY, thread counts...), and, when
    torch is already imported, its kernel dispatch (get_cpu_capability), MKL and oneDNN versions and
    thread counts. Cheap: the static parts are read once per process; torch is never imported here."""
    record = {"cpu": cpu_description(),
              "environment": {name: os.environ[name] for name in MATH_ENVIRONMENT if name in os.environ},
              "torch": None}
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        record["torch"] = dict(_torch_build(), threads=torch.get_num_threads(),
                               interop_threads=torch.get_num_interop_threads(),
                               float32_matmul_precision=torch.get_float32_matmul_precision(),
                               deterministic_algorithms=torch.are_deterministic_algorithms_enabled())
    return record


def provenance(argv: list[str] | None = None, device: str | None = None) -> dict:
    return {
        "created_utc": utc_now(),
        "git_commit": git_commit(),
        "argv": list(sys.argv if argv is None else argv),
        "versions": package_versions(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "math": math_environment(),
        "device": device,
        # what the higher layers report of this process (see OBSERVED): the verifier sandbox's isolation,
        # whether the CPU kernels served and the switches that steer them; None where that layer was
        # never loaded (no program judged, no kernel needed)
        **{field: _observed(field) for field in OBSERVED},
        # whether glibc keeps freed memory for reuse (runtime.retain_freed_memory; None: not asked)
        "malloc_tuning": _malloc_tuning(),
        # how long the math library's idle threads spin before they sleep (shared_machine.short_spin_waits)
        "spin_waits": _spin_waits(),
    }


def _spin_waits() -> str | None:
    from glm53_flash.core.shared_machine import spin_waits

    return spin_waits()


def _malloc_tuning() -> str | None:
    from glm53_flash.core.runtime import malloc_tuning

    return malloc_tuning()


# Provenance fields that a higher layer fills in: each registers its function with `observe` when it is
# imported (the model's kernels, the verifier's sandbox), so this module imports nothing above it.
OBSERVED = ("verifier_isolation", "decode_kernels", "kernel_switches")
_OBSERVERS: dict = {}


def observe(field: str, function) -> None:
    """Register `function() -> JSON value` as the source of provenance field `field` (one of OBSERVED)."""
    if field not in OBSERVED:
        raise ValueError(f"{field!r} is not an observed provenance field ({', '.join(OBSERVED)})")
    _OBSERVERS[field] = function


def _observed(field: str):
    function = _OBSERVERS.get(field)
    return function() if function is not None else None


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


# The most bytes a command reads from one file, by kind; a larger file is refused before any is read.
# Receipts, summaries and plans are JSON; metrics, rollouts and note histories are JSON lines, read one
# line at a time; text is markdown and HTML.
READ_LIMITS = {"json": 256 * 2**20, "jsonl": 2**30, "text": 16 * 2**20}


class UnsafeFileError(ValueError):
    """A file a command refuses to write or read: a symbolic link, not a regular file, outside the
    directory it must stay in, or larger than its cap."""


def _size(count: int) -> str:
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"


def _open_for_reading(path: Path, kind: str) -> tuple[int, int]:
    """(fd, cap): `path` opened for reading once it is known to be a regular file within its cap."""
    cap = READ_LIMITS[kind]
    # O_NONBLOCK: opening a FIFO does not wait for a writer (it is then refused as not a regular file)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFileError(f"{path} is not a regular file; only regular files are read")
        if info.st_size > cap:
            raise UnsafeFileError(f"{path} is {_size(info.st_size)}; a {kind} input is read up to {_size(cap)}")
    except BaseException:
        os.close(fd)
        raise
    return fd, cap


def read_bytes(path: str | Path, kind: str = "text") -> bytes:
    """The bytes of the regular file at `path`, at most READ_LIMITS[kind] of them (a larger file, or one
    that grows past the cap while it is read, raises UnsafeFileError)."""
    path = Path(path)
    fd, cap = _open_for_reading(path, kind)
    chunks, total = [], 0
    try:
        while chunk := os.read(fd, min(1 << 20, cap + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > cap:
                raise UnsafeFileError(f"{path} grew past {_size(cap)} while it was read; a {kind} input is read "
                                      f"up to {_size(cap)}")
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_text(path: str | Path, kind: str = "text") -> str:
    """The UTF-8 text of the file at `path`, within READ_LIMITS[kind] (see read_bytes)."""
    return read_bytes(path, kind).decode("utf-8")


def read_json(path: str | Path, error: type[Exception] = ValueError, corrupt: str = "{path} is not valid JSON"):
    """The JSON value in the file at `path`, within READ_LIMITS["json"]; `error(corrupt.format(path=path) +
    " (reason)")` when it does not parse. (A missing file is the caller's message to give.)"""
    path = Path(path)
    try:
        return json.loads(read_bytes(path, "json"))
    except (json.JSONDecodeError, UnicodeDecodeError) as reason:
        raise error(f"{corrupt.format(path=path)} ({reason})") from None


def read_jsonl(path: str | Path) -> list:
    """The JSON value of every non-blank line of the file at `path`, read one line at a time, within
    READ_LIMITS["jsonl"]. A line that does not parse raises ValueError naming the file and the line."""
    path = Path(path)
    fd, cap = _open_for_reading(path, "jsonl")
    rows, total = [], 0
    with os.fdopen(fd, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            total += len(line)
            if total > cap:
                raise UnsafeFileError(f"{path} grew past {_size(cap)} while it was read; a jsonl input is read "
                                      f"up to {_size(cap)}")
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except (json.JSONDecodeError, UnicodeDecodeError) as reason:
                    raise ValueError(f"{path} line {number} is not valid JSON ({reason})") from None
    return rows


def sha256_json(payload) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _output_directory(directory: Path, within: str | Path | None) -> int:
    """An open descriptor of `directory`, created if missing. Given `within`, the directory must lie
    inside it (lexically: no `..` out of it) and is reached from it one component at a time without
    following a symbolic link, so no link inside `within` can send a write elsewhere."""
    if within is None:
        directory.mkdir(parents=True, exist_ok=True)
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    root = Path(within)
    relative = os.path.relpath(os.path.abspath(directory), os.path.abspath(root))
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        raise UnsafeFileError(f"{directory} is outside {root}; a command writes only inside its output directory")
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    reached = root
    for part in () if relative == os.curdir else Path(relative).parts:
        reached = reached / part
        try:
            os.mkdir(part, dir_fd=fd)
        except FileExistsError:
            pass
        try:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError:
            os.close(fd)
            raise UnsafeFileError(f"{reached} is a symbolic link or not a directory; a command writes only into "
                                  f"real directories inside {root}") from None
        os.close(fd)
        fd = inner
    return fd


def _target(path: Path, within: str | Path | None) -> tuple[int, str]:
    """(directory fd, file name) of an output path whose name, if it exists, is a regular file."""
    if path.name in ("", os.curdir, os.pardir):
        raise UnsafeFileError(f"{path} names no file")
    directory = _output_directory(path.parent, within)
    try:
        info = os.lstat(path.name, dir_fd=directory)
    except FileNotFoundError:
        return directory, path.name
    except BaseException:
        os.close(directory)
        raise
    if not stat.S_ISREG(info.st_mode):
        os.close(directory)
        what = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
        raise UnsafeFileError(f"{path} is {what}; refusing to write through it (only a regular file or a new name is "
                              "written)")
    return directory, path.name


def write_bytes(path: str | Path, data: bytes, *, within: str | Path | None = None) -> Path:
    """Write bytes atomically without following links: a new temporary file (O_CREAT | O_EXCL |
    O_NOFOLLOW, mode 0644) in the target's directory, renamed over the target, so readers never see half
    a file and an interrupted write leaves the old one. Refuses (UnsafeFileError) a target that is a
    symbolic link or not a regular file and, given `within`, a target outside that directory or
    reached through a symbolic link below it."""
    path = Path(path)
    directory, name = _target(path, within)
    try:
        temporary = f".{name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                     dir_fd=directory)
        try:
            with os.fdopen(fd, "wb") as handle:
                os.fchmod(handle.fileno(), 0o644)  # not the umask's: receipts and reports are meant to be shared
                handle.write(data)
            os.replace(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=directory)
            raise
    finally:
        os.close(directory)
    return path


def write_text(path: str | Path, text: str, *, within: str | Path | None = None) -> Path:
    """Write UTF-8 text atomically (see write_bytes)."""
    return write_bytes(path, text.encode("utf-8"), within=within)


def append_text(path: str | Path, text: str, *, within: str | Path | None = None, sync: bool = False) -> Path:
    """Append UTF-8 text to a regular file (created if missing) without following a link (O_NOFOLLOW;
    the same refusals as write_bytes); `sync` flushes it to disk before returning."""
    path = Path(path)
    directory, name = _target(path, within)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644,
                     dir_fd=directory)
    finally:
        os.close(directory)
    with os.fdopen(fd, "ab") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise UnsafeFileError(f"{path} is not a regular file; refusing to append to it")
        handle.write(text.encode("utf-8"))
        if sync:
            handle.flush()
            os.fsync(handle.fileno())
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


def write_json(path: str | Path, payload, indent: int = 2, *, within: str | Path | None = None) -> Path:
    """Write JSON atomically (see write_bytes), keys sorted."""
    return write_text(path, json.dumps(payload, indent=indent, sort_keys=True) + "\n", within=within)
