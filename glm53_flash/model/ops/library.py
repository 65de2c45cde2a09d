"""The CPU kernels' library (ops/kernels.c), built on first use, and what every op shares: the switches
that steer dispatch, the sizes the C code's fixed buffers hold (`LIMITS`, checked here and asserted in
C), the argument checks that raise `KernelArgumentError`, and the common part of every dispatch rule
(`serves`: CPU float32, no gradients, no autocast, no compile tracing, a library that built).

The library is compiled with the system's C compiler (seconds) into a per-user cache the
first time a process needs it, keyed by a hash of the source, compiler and flags, for the widest
vectors the CPU has: 16 float lanes on AVX-512 (`cc -O3 -mavx512f -mavx2 -mfma -fopenmp`), else 8
(`-mavx2 -mfma`); `GLM53_KERNEL_ISA=avx2` asks for the 8-lane build on an AVX-512 CPU. A CPU without
AVX2 and FMA, no compiler, a failed build, or `GLM53_KERNELS=0` in the environment leaves every op on
its torch path; `status()` says which and why. The C entry points check the same sizes as the
wrappers and refuse (status OUT_OF_RANGE) without touching memory, so a caller that bypasses a
wrapper gets an error too, never an overflowed buffer.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import torch

from glm53_flash.core import receipts

SOURCE = Path(__file__).with_name("kernels.c")

FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC")

# The instruction sets a build can target, widest first, with the CPU flags each needs.
ISAS = {"avx512": (("avx512f", "avx2", "fma"), ("-mavx512f", "-mavx2", "-mfma")),
        "avx2": (("avx2", "fma"), ("-mavx2", "-mfma"))}

# The kernels serve decode-sized products (weights cold in cache, few rows), where they beat MKL's
# F.linear and torch's grouped products; `glm53 bench decode-weights` measures it (docs/BENCHMARKS.md).
MAX_ROWS = 32

MAX_GROUPED_ROWS = 512

# The switches that steer dispatch (named in ops/dispatch.py, which records them in receipts). False
# forces the eager torch path everywhere.
ENABLED = os.environ.get("GLM53_KERNELS", "1") != "0"

# Cached decoding of every hybrid block in one call (ops/decode_block.py, DecodeStack). False keeps the
# per-operation kernels (a switch for tests and benchmarks, like ENABLED).
FUSED_DECODE = True

_lock = threading.Lock()

_state: dict = {}

def cache_directory() -> Path:
    if os.environ.get("GLM53_KERNEL_CACHE"):
        return Path(os.environ["GLM53_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "glm53_flash" / "kernels"

def _cpu_flags() -> list[str] | str:
    """The CPU's feature flags, or why they cannot be read."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the kernels need x86-64 with AVX2 and FMA; this CPU is {platform.machine()}"
    try:
        return next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")), [])
    except OSError:
        return "cannot read /proc/cpuinfo to check for AVX2 and FMA"

def supported_isas(flags: list[str] | str | None = None) -> list[str]:
    """The builds this CPU (or these flags) can run, widest first (empty when none)."""
    flags = _cpu_flags() if flags is None else flags
    if isinstance(flags, str):
        return []
    return [isa for isa, (needs, _) in ISAS.items() if all(flag in flags for flag in needs)]

def _choose_isa() -> tuple[str | None, str]:
    """(the build to use, "") or (None, why none)."""
    flags = _cpu_flags()
    if isinstance(flags, str):
        return None, flags
    supported = supported_isas(flags)
    if not supported:
        missing = [flag for flag in ISAS["avx2"][0] if flag not in flags]
        return None, f"the CPU lacks {', '.join(missing)}"
    wanted = os.environ.get("GLM53_KERNEL_ISA")
    if wanted:
        if wanted not in ISAS:
            return None, f"GLM53_KERNEL_ISA={wanted!r} is not one of {', '.join(ISAS)}"
        if wanted not in supported:
            return None, f"GLM53_KERNEL_ISA={wanted} asks for what this CPU lacks"
        return wanted, ""
    return supported[0], ""

# Each entry point's arguments (the pointers, sizes and floats kernels.c's glm53_* functions take).
def _SIGNATURES(pointer, size, real) -> dict:
    return {
        "linear": [pointer] * 3 + [size] * 3,
        "grouped_linear": [pointer] * 4 + [size] * 4,
        "grouped_matmul": [pointer] * 4 + [size] * 4,
        "moe_dispatch": [pointer] * 2 + [size] * 4 + [pointer] * 5,
        "moe_combine": [pointer] * 5 + [size] * 3,
        "moe_combine_rows_bf16": [pointer] * 4 + [size] * 4,
        "moe_combine_rows_bf16_backward": [pointer] * 6 + [size] * 4,
        "linear_attention_step": [pointer] * 4 + [size] * 3 + [pointer] * 2 + [real],
        "linear_attention_scan_forward": [pointer] * 6 + [size] * 4 + [pointer] * 2 + [real],
        "linear_attention_scan_backward": [pointer] * 7 + [size] * 4 + [pointer] * 2 + [real],
        "swiglu_forward": [pointer] * 2 + [size] * 2,
        "swiglu_backward": [pointer] * 3 + [size] * 2,
        "swiglu_forward_bf16": [pointer] * 2 + [size] * 2,
        "swiglu_backward_bf16": [pointer] * 3 + [size] * 2,
        "rms_norm_forward": [pointer] * 4 + [size] * 2 + [real],
        "rms_norm_backward": [pointer] * 7 + [size] * 2,
        "decode_attention_in": [pointer] + [size] * 4 + [pointer] * 2 + [real, pointer, size] + [pointer] * 2,
        "sparse_attention_step": [pointer] * 3 + [size] * 6 + [pointer] * 3,
        "decode_moe_out": ([pointer] + [size] * 4 + [pointer, size] + [pointer] * 4 + [real, pointer, size, size]
                           + [pointer] * 2 + [size] + [pointer] * 2 + [size] + [pointer] * 2),
        "decode_stack": ([pointer, size, pointer] + [size] * 10 + [real, real] + [pointer] * 5 + [real, pointer, size]
                         + [pointer] * 2),
    }

# The sizes kernels.c's fixed buffers hold (its LIMIT_* numbers, in the order glm53_limits reports them).
LIMITS = {"experts": 64, "top_k": 8, "head_dim": 256, "keys": 4096, "streams": 64, "slots": 4096}

# Rows the fused step serves: its dense products run in the C kernel at any row count, and the
# step beats the operations one by one (torch's GEMMs for the dense products above library.MAX_ROWS)
# up to this many rows; 512 is the sampler's default batch.
MAX_FUSED_ROWS = 512
MAX_SPARSE_KEYS = LIMITS["keys"] - 1  # kept keys a sparse decode step attends over (with the query's own)
# C's status codes.
OK, NO_MEMORY, OUT_OF_RANGE = 0, 1, 2

class KernelArgumentError(ValueError):
    """A kernel wrapper was given tensors it cannot take (the message names the op and the rule)."""

def _build(isa: str | None = None) -> tuple[ctypes.CDLL | None, str, Path | None]:
    """Build (or find in the cache) and load the library for `isa` (default: the CPU's widest)."""
    if isa is None:
        isa, reason = _choose_isa()
        if isa is None:
            return None, reason, None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return None, "no C compiler (cc or gcc) on PATH", None
    flags = FLAGS + ISAS[isa][1]
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join((compiler,) + flags).encode()).hexdigest()[:16]
    target = cache_directory() / f"kernels-{isa}-{key}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            # Build beside the target and rename: a concurrent process sees a whole library or none.
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                built = Path(tmp) / target.name
                result = subprocess.run([compiler, *flags, str(SOURCE), "-o", str(built), "-lm"],
                                        capture_output=True, text=True, timeout=120)
                if result.returncode != 0:
                    return None, f"{compiler} failed: {result.stderr.strip()[-500:]}", None
                os.replace(built, target)
        except (OSError, subprocess.SubprocessError) as error:
            return None, f"could not build the kernels: {error}", None
    try:
        library = ctypes.CDLL(str(target))
    except OSError as error:
        return None, f"could not load {target}: {error}", None
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    for name, arguments in _SIGNATURES(pointer, size, ctypes.c_float).items():
        function = getattr(library, "glm53_" + name)
        function.restype = ctypes.c_int
        function.argtypes = arguments
    library.glm53_lanes.restype, library.glm53_lanes.argtypes = ctypes.c_int64, []
    library.glm53_layer_fields.restype, library.glm53_layer_fields.argtypes = ctypes.c_int64, []
    library.glm53_limits.restype, library.glm53_limits.argtypes = None, [pointer]
    return library, f"loaded ({isa}, {library.glm53_lanes()} float lanes)", target

_LABELS = False  # labelled_calls(): each kernel call a named profiler range (glm53 bench profile)
_SPENT: list | None = None  # timed_calls(): the seconds every kernel call took, summed into _SPENT[0]
_WATCHED = False  # either of the two: call() takes its slower path only then


@contextlib.contextmanager
def labelled_calls():
    """Name every kernel call in torch's profiler while the block runs (`glm53 bench profile`); outside it a
    call costs one flag check more."""
    global _LABELS
    before, _LABELS = _LABELS, True
    _watch()
    try:
        yield
    finally:
        _LABELS = before
        _watch()


@contextlib.contextmanager
def timed_calls(spent: list):
    """While the block runs, add the seconds every kernel call takes to spent[0] (`glm53 bench
    decode-weights`: a step's split between the kernels and the Python around them)."""
    global _SPENT
    before, _SPENT = _SPENT, spent
    _watch()
    try:
        yield
    finally:
        _SPENT = before
        _watch()


def _watch() -> None:
    global _WATCHED
    _WATCHED = _LABELS or _SPENT is not None


def _library() -> ctypes.CDLL | None:
    if "library" not in _state:
        with _lock:
            if "library" not in _state:
                library, reason, path = _build()
                _state.update(library=library, reason=reason, path=path)
    return _state["library"]

def _required() -> ctypes.CDLL:
    library = _library()
    if library is None:
        raise RuntimeError(f"the CPU kernels are not available: {_state['reason']}")
    return library

def call(op: str, *arguments) -> None:
    """Call kernels.c's glm53_<op> and turn its status into an exception. Inside `labelled_calls()` each
    call is a profiler range named glm53::<op>, so a profile shows the C kernels' time under their names;
    inside `timed_calls(spent)` its seconds are added to spent[0]."""
    if _WATCHED:
        status = _watched_call(op, arguments)
    else:
        status = getattr(_required(), "glm53_" + op)(*arguments)
    if status == NO_MEMORY:
        raise MemoryError(f"the {op} kernel could not allocate its scratch memory")
    if status != OK:
        raise KernelArgumentError(f"{op}: kernels.c refused sizes outside its limits (status {status})")

def c_limits() -> dict:
    """The limits the built library reports (a test compares them with LIMITS)."""
    values = (ctypes.c_int64 * len(LIMITS))()
    _required().glm53_limits(ctypes.addressof(values))
    return dict(zip(LIMITS, values))

def _watched_call(op: str, arguments: tuple) -> int:
    start = time.perf_counter()
    try:
        if _LABELS:
            with torch.profiler.record_function("glm53::" + op):
                return getattr(_required(), "glm53_" + op)(*arguments)
        return getattr(_required(), "glm53_" + op)(*arguments)
    finally:
        if _SPENT is not None:
            _SPENT[0] += time.perf_counter() - start

def available() -> bool:
    return ENABLED and _library() is not None

def status() -> dict:
    """Whether the kernels serve this process, and why not when they do not."""
    if not ENABLED:
        return {"available": False, "reason": "disabled by GLM53_KERNELS=0 or ops.library.ENABLED", "library": None}
    library = _library()
    return {"available": library is not None, "reason": _state["reason"],
            "library": str(_state["path"]) if _state["path"] else None}

def observed() -> dict | None:
    """status() if this process has looked for the kernels already, else None (it builds nothing)."""
    return status() if "library" in _state or not ENABLED else None

def fail(op: str, rule: str):
    raise KernelArgumentError(f"{op}: {rule}")

def check_tensor(op: str, name: str, tensor, shape: tuple | None = None, dtype=torch.float32) -> None:
    """tensor is a contiguous CPU tensor of `dtype` (and of `shape` when given). The test that passes
    is one expression (a decode step makes ~40 of these calls per layer); the messages only on failure."""
    if (isinstance(tensor, torch.Tensor) and tensor.dtype == dtype and tensor.is_cpu and tensor.is_contiguous()
            and (shape is None or tensor.shape == shape)):
        return
    if not isinstance(tensor, torch.Tensor):
        fail(op, f"{name} must be a tensor")
    if not (tensor.is_cpu and tensor.dtype == dtype):
        fail(op, f"{name} must be {dtype} on the CPU, not {tensor.dtype} on {tensor.device}")
    if not tensor.is_contiguous():
        fail(op, f"{name} must be contiguous")
    fail(op, f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")

def check_vector_size(op: str, name: str, size: int) -> None:
    if not (size > 0 and size % 8 == 0):
        fail(op, f"{name} = {size} must be a positive multiple of 8")

def check_routing(op: str, experts: int, top_k: int, tokens: int) -> None:
    if not (1 <= experts <= LIMITS["experts"]):
        fail(op, f"{experts} experts; the kernel holds 1 to {LIMITS['experts']}")
    if not (1 <= top_k <= min(LIMITS["top_k"], experts)):
        fail(op, f"top_k = {top_k}; the kernel takes 1 to min({LIMITS['top_k']}, experts = {experts})")
    if not (tokens * top_k <= LIMITS["slots"]):
        fail(op, f"{tokens} tokens x top_k {top_k} routed slots; the kernel holds {LIMITS['slots']}")

def check_streams(op: str, streams: torch.Tensor) -> tuple[int, int, int]:
    """streams [S, B, 1, D]: the first stream a block of memory, the others B * D floats on (or all
    the same: stride 0)."""
    if not (isinstance(streams, torch.Tensor) and streams.dim() == 4 and streams.shape[2] == 1):
        fail(op, "streams must be [S, B, 1, D]")
    n_streams, batch, _, dim = streams.shape
    if not (streams.device.type == "cpu" and streams.dtype == torch.float32):
        fail(op, "streams must be float32 on the CPU")
    if not (1 <= n_streams <= LIMITS["streams"]):
        fail(op, f"{n_streams} streams; the kernel holds 1 to {LIMITS['streams']}")
    if not (streams[0].is_contiguous() and streams.stride(0) in (0, batch * dim)):
        fail(op, "streams must be one block of memory per stream, B * D floats apart (or stride 0)")
    check_vector_size(op, "D", dim)
    return n_streams, batch, dim

def cpu_float32(*tensors: torch.Tensor) -> bool:
    return all(t.is_cpu and t.dtype == torch.float32 for t in tensors)

def path_open() -> bool:
    """What every kernel needs besides its tensors: no CPU autocast (its products run in bf16), no
    compile tracing, and a library that built."""
    return not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling() and _library() is not None

def serves(x: torch.Tensor, weight: torch.Tensor, rows: int, limit: int) -> bool:
    # Cheapest and most often false first: a decode step makes ~150 of these calls.
    return (ENABLED and not torch.is_grad_enabled() and 0 < rows <= limit and cpu_float32(x, weight)
            and weight.is_contiguous() and x.shape[-1] % 8 == 0 and path_open())

def head_dim_serves(head_dim: int) -> bool:
    """Whether the attention steps in C take heads of this size (their per-head buffers hold 256 floats)."""
    return head_dim % 8 == 0 and 0 < head_dim <= LIMITS["head_dim"]

def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., d] rotated in interleaved pairs: x * cos + (-x_odd, x_even) * sin."""
    pairs = x.unflatten(-1, (-1, 2))
    swapped = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return x * cos + swapped * sin


receipts.observe("decode_kernels", observed)


__all__ = ["ENABLED", "FUSED_DECODE", "KernelArgumentError", "LIMITS", "MAX_FUSED_ROWS", "MAX_GROUPED_ROWS", "MAX_ROWS",
           "MAX_SPARSE_KEYS", "available",
           "c_limits", "call", "check_routing", "check_streams", "check_tensor", "check_vector_size", "cpu_float32",
           "fail", "head_dim_serves", "observed", "path_open", "rotate_pairs", "serves", "status", "supported_isas"]
