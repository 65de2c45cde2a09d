"""Receipts: provenance for every run (git commit, argv, versions, machine, the math environment) and
atomic JSON writing."""

from __future__ import annotations

import contextlib
import functools
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
        # how long the math library's idle threads spin before they sleep (runtime.short_spin_waits)
        "spin_waits": _spin_waits(),
    }


def _spin_waits() -> str | None:
    from glm53_flash.core.runtime import spin_waits

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
