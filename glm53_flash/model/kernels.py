"""The CPU kernels (kernels.c), built on first use: matrix products for cached decoding, a block's decode
step in three calls, and the SwiGLU and RMSNorm pairs that training uses too.

A decode step multiplies a handful of rows (one per sequence) by every weight matrix once. BLAS
tunes for large M: at 16 rows MKL's fp32 GEMM streams the flash model's weights at ~4 GB/s, a fifth
of this machine's memory bandwidth, and the step's matrix products took most of its time. The C
loops in kernels.c hold a few weight rows in registers and run every input row past them, so each
weight byte is loaded once per call. On top of them, a hybrid block's whole decode step runs in three
calls (`decode_attention_in`, the attention step, `decode_moe_out`), since ~25 Python-level operations
per layer cost a decode step of the flash model more than its arithmetic did.

The library is compiled with the system's C compiler (about half a second) into a per-user cache the
first time a process needs it, keyed by a hash of the source, compiler and flags, for the widest
vectors the CPU has: 16 float lanes on AVX-512 (`cc -O3 -mavx512f -mavx2 -mfma -fopenmp`), else 8
(`-mavx2 -mfma`); `GLM53_KERNEL_ISA=avx2` asks for the 8-lane build on an AVX-512 CPU. It serves only
what it was written for: float32 on the CPU, no gradients, no autocast, at most `MAX_ROWS` rows
(`MAX_GROUPED_ROWS` routed slots), inner sizes that are multiples of 8. Two pairs serve training
too, any row count, one pass over memory each way: the SwiGLU activation (`swiglu_forward`/
`swiglu_backward`, called by moe.py's autograd.Function) and RMSNorm (`rms_norm_forward`/
`rms_norm_backward`, called by norm.py's). Anything else, a CPU without
AVX2 and FMA, no compiler, a failed build, or `GLM53_KERNELS=0` in the environment, takes the eager
torch path, which is also the test oracle; `status()` says which and why.

Each wrapper checks what it is given before it calls C (CPU float32 tensors of the shapes its
docstring states, laid out as the loop reads them, sizes within `LIMITS`, the numbers kernels.c's
fixed buffers hold) and raises `KernelArgumentError` naming the op and the rule that failed; the C
entry points check the same sizes again and refuse (status OUT_OF_RANGE) without touching memory,
so a caller that bypasses the wrapper gets an error too, never an overflowed buffer. The `*_serves`
functions are the dispatch rules: where one says no, the model takes its torch path instead.
The switches that steer dispatch are named in model/dispatch.py, which records them in receipts.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from glm53_flash.model.precision import mixed_linear
from glm53_flash.core import receipts

SOURCE = Path(__file__).with_name("kernels.c")
FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC")
# The instruction sets a build can target, widest first, with the CPU flags each needs.
ISAS = {"avx512": (("avx512f", "avx2", "fma"), ("-mavx512f", "-mavx2", "-mfma")),
        "avx2": (("avx2", "fma"), ("-mavx2", "-mfma"))}
# Measured on the flash shapes, 2 cores of an AVX2 host (AMD EPYC), weights cold in cache as in a
# decode step: the dense kernel ran 1.8-2.2x faster than MKL's F.linear from 1 to 32 rows and tied
# it from 48; the grouped expert kernels 1.3-2.8x faster than torch's grouped_mm and the padded
# batched matmuls for 16 to 512 routed slots. On an AVX-512 host with every weight in its L3, the
# 16-lane build ties torch on the step's products (docs/BENCHMARKS-HISTORY.md) and wins on the rest of it.
MAX_ROWS = 32
MAX_GROUPED_ROWS = 512
# A switch for tests and benchmarks, like moe.GROUPED_MM_ENABLED: False forces the eager path.
ENABLED = os.environ.get("GLM53_KERNELS", "1") != "0"

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
        "linear_attention_step": [pointer] * 4 + [size] * 3 + [pointer] * 2 + [real],
        "swiglu_forward": [pointer] * 2 + [size] * 2,
        "swiglu_backward": [pointer] * 3 + [size] * 2,
        "rms_norm_forward": [pointer] * 4 + [size] * 2 + [real],
        "rms_norm_backward": [pointer] * 7 + [size] * 2,
        "decode_attention_in": [pointer] + [size] * 4 + [pointer] * 2 + [real] + [pointer] * 3,
        "sparse_attention_step": [pointer] * 3 + [size] * 6 + [pointer] * 3,
        "decode_moe_out": ([pointer] + [size] * 4 + [pointer, size] + [pointer] * 4 + [real, pointer, size, size]
                           + [pointer] * 2 + [size] + [pointer] * 4),
    }


# The sizes kernels.c's fixed buffers hold (its LIMIT_* numbers, in the order glm53_limits reports them).
LIMITS = {"experts": 64, "top_k": 8, "head_dim": 256, "keys": 4096, "streams": 64, "slots": 4096}
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
    library.glm53_limits.restype, library.glm53_limits.argtypes = None, [pointer]
    return library, f"loaded ({isa}, {library.glm53_lanes()} float lanes)", target


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


def _call(op: str, *arguments) -> None:
    """Call kernels.c's glm53_<op> and turn its status into an exception."""
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


def available() -> bool:
    return ENABLED and _library() is not None


def status() -> dict:
    """Whether the kernels serve this process, and why not when they do not."""
    if not ENABLED:
        return {"available": False, "reason": "disabled by GLM53_KERNELS=0 or kernels.ENABLED", "library": None}
    library = _library()
    return {"available": library is not None, "reason": _state["reason"],
            "library": str(_state["path"]) if _state["path"] else None}


def observed() -> dict | None:
    """status() if this process has looked for the kernels already, else None (it builds nothing)."""
    return status() if "library" in _state or not ENABLED else None


# ----------------------------------------------------------------------------------- argument checks


def _fail(op: str, rule: str):
    raise KernelArgumentError(f"{op}: {rule}")


def _check_tensor(op: str, name: str, tensor, shape: tuple | None = None, dtype=torch.float32) -> None:
    """tensor is a contiguous CPU tensor of `dtype` (and of `shape` when given). The test that passes
    is one expression (a decode step makes ~40 of these calls per layer); the messages only on failure."""
    if (isinstance(tensor, torch.Tensor) and tensor.dtype == dtype and tensor.is_cpu and tensor.is_contiguous()
            and (shape is None or tensor.shape == shape)):
        return
    if not isinstance(tensor, torch.Tensor):
        _fail(op, f"{name} must be a tensor")
    if not (tensor.is_cpu and tensor.dtype == dtype):
        _fail(op, f"{name} must be {dtype} on the CPU, not {tensor.dtype} on {tensor.device}")
    if not tensor.is_contiguous():
        _fail(op, f"{name} must be contiguous")
    _fail(op, f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")


def _check_vector_size(op: str, name: str, size: int) -> None:
    if not (size > 0 and size % 8 == 0):
        _fail(op, f"{name} = {size} must be a positive multiple of 8")


def _check_routing(op: str, experts: int, top_k: int, tokens: int) -> None:
    if not (1 <= experts <= LIMITS["experts"]):
        _fail(op, f"{experts} experts; the kernel holds 1 to {LIMITS['experts']}")
    if not (1 <= top_k <= min(LIMITS["top_k"], experts)):
        _fail(op, f"top_k = {top_k}; the kernel takes 1 to min({LIMITS['top_k']}, experts = {experts})")
    if not (tokens * top_k <= LIMITS["slots"]):
        _fail(op, f"{tokens} tokens x top_k {top_k} routed slots; the kernel holds {LIMITS['slots']}")


def _check_streams(op: str, streams: torch.Tensor) -> tuple[int, int, int]:
    """streams [S, B, 1, D]: the first stream a block of memory, the others B * D floats on (or all
    the same: stride 0)."""
    if not (isinstance(streams, torch.Tensor) and streams.dim() == 4 and streams.shape[2] == 1):
        _fail(op, "streams must be [S, B, 1, D]")
    n_streams, batch, _, dim = streams.shape
    if not (streams.device.type == "cpu" and streams.dtype == torch.float32):
        _fail(op, "streams must be float32 on the CPU")
    if not (1 <= n_streams <= LIMITS["streams"]):
        _fail(op, f"{n_streams} streams; the kernel holds 1 to {LIMITS['streams']}")
    if not (streams[0].is_contiguous() and streams.stride(0) in (0, batch * dim)):
        _fail(op, "streams must be one block of memory per stream, B * D floats apart (or stride 0)")
    _check_vector_size(op, "D", dim)
    return n_streams, batch, dim


# ----------------------------------------------------------------------------------- dispatch and ops


def _cpu_float32(*tensors: torch.Tensor) -> bool:
    return all(t.is_cpu and t.dtype == torch.float32 for t in tensors)


def _path_open() -> bool:
    """What every kernel needs besides its tensors: no CPU autocast (its products run in bf16), no
    compile tracing, and a library that built."""
    return not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling() and _library() is not None


def _serves(x: torch.Tensor, weight: torch.Tensor, rows: int, limit: int) -> bool:
    # Cheapest and most often false first: a decode step makes ~150 of these calls.
    return (ENABLED and not torch.is_grad_enabled() and 0 < rows <= limit and _cpu_float32(x, weight)
            and weight.is_contiguous() and x.shape[-1] % 8 == 0 and _path_open())


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight) without bias; by the kernel where it serves (its own dispatch: any input)."""
    if not ENABLED or torch.is_grad_enabled():  # training: straight to torch (in the run's product dtype)
        return mixed_linear(x, weight)
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    if not _serves(x, weight, rows, MAX_ROWS) or weight.dim() != 2 or weight.shape[1] != k:
        return mixed_linear(x, weight)
    x = x.contiguous()  # held here: the library reads it below (a no-op for the usual contiguous x)
    out = torch.empty((*x.shape[:-1], weight.shape[0]), dtype=x.dtype)
    _call("linear", x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, weight.shape[0], k)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """RMSNorm over the last dimension by the kernel where it serves (a few rows); None elsewhere, for
    the caller's own path."""
    if not ENABLED or torch.is_grad_enabled():
        return None
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    if not _serves(x, weight, rows, MAX_ROWS) or tuple(weight.shape) != (dim,):
        return None
    x = x.contiguous()  # held here: the library reads it below
    out = torch.empty_like(x)
    _call("rms_norm_forward", x.data_ptr(), weight.data_ptr(), out.data_ptr(), None, rows, dim, eps)
    return out


def head_dim_serves(head_dim: int) -> bool:
    """Whether the attention steps in C take heads of this size (their per-head buffers hold 256 floats)."""
    return head_dim % 8 == 0 and 0 < head_dim <= LIMITS["head_dim"]


def linear_attention_serves(qkv: torch.Tensor, kv: torch.Tensor, z: torch.Tensor, head_dim: int) -> bool:
    """Whether `linear_attention_step` serves one decode step: qkv [B, 1, 3D], the state [B, H, d, d]."""
    return (_serves(qkv, kv, qkv.shape[0], MAX_GROUPED_ROWS) and head_dim_serves(head_dim)
            and qkv.is_contiguous() and z.is_contiguous() and z.dtype == torch.float32)


def linear_attention_step(qkv: torch.Tensor, kv: torch.Tensor, z: torch.Tensor, cos: torch.Tensor | None,
                          sin: torch.Tensor | None, floor: float) -> torch.Tensor:
    """One token of feature-map linear attention on the cached state (kv [B, H, d, d], z [B, H, d],
    updated in place): qkv [B, 1, 3D] -> out [B, 1, D]; cos/sin [d] rotate q and k first when given."""
    op = "linear_attention_step"
    if not (isinstance(z, torch.Tensor) and z.dim() == 3):
        _fail(op, "z must be [B, H, d]")
    batch, heads, d = z.shape
    if not (d <= LIMITS["head_dim"]):
        _fail(op, f"head size {d}; the kernel holds at most {LIMITS['head_dim']}")
    _check_vector_size(op, "the head size", d)
    _check_tensor(op, "z", z)
    _check_tensor(op, "kv", kv, (batch, heads, d, d))
    _check_tensor(op, "qkv", qkv, (batch, 1, 3 * heads * d))
    if not ((cos is None) == (sin is None)):
        _fail(op, "cos and sin come together or not at all")
    if cos is not None:
        _check_tensor(op, "cos", cos, (d,))
        _check_tensor(op, "sin", sin, (d,))
    out = torch.empty(batch, 1, heads * d, dtype=qkv.dtype)
    rotate = cos is not None
    _call(op, qkv.data_ptr(), kv.data_ptr(), z.data_ptr(), out.data_ptr(), batch, heads, d,
          cos.data_ptr() if rotate else None, sin.data_ptr() if rotate else None, floor)
    return out


def grouped_serves(rows: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> bool:
    """Whether `grouped_swiglu_products` serves these rows: gate_up [E, 2H, D], down [E, H, D]."""
    return (_serves(rows, gate_up, rows.shape[0], MAX_GROUPED_ROWS) and down.dtype == torch.float32
            and down.is_contiguous() and gate_up.shape[1] % 8 == 0 and down.shape[2] % 16 == 0
            and rows.is_contiguous() and gate_up.shape[0] <= LIMITS["experts"])


def _check_grouped(op: str, rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor, inner: int) -> None:
    _check_tensor(op, "rows", rows)
    _check_tensor(op, "weight", weight)
    if not (rows.dim() == 2 and weight.dim() == 3):
        _fail(op, "rows must be [M, K] and weight [E, ., .]")
    if not (rows.shape[1] == inner):
        _fail(op, f"rows have {rows.shape[1]} columns, the weight takes {inner}")
    _check_tensor(op, "offsets", offsets, (weight.shape[0],), dtype=torch.int64)
    if not (weight.shape[0] >= 1):
        _fail(op, "at least one expert")


def grouped_linear(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """rows [M, K] sorted by expert, weight [E, N, K], offsets [E] int64 (cumulative counts, ending at M)
    -> [M, N]. K % 8 == 0, N % 4 == 0."""
    op = "grouped_linear"
    if not (isinstance(weight, torch.Tensor) and weight.dim() == 3):
        _fail(op, "weight must be [E, N, K]")
    experts, n, k = weight.shape
    _check_grouped(op, rows, weight, offsets, k)
    _check_vector_size(op, "K", k)
    if not (n > 0 and n % 4 == 0):
        _fail(op, f"N = {n} must be a positive multiple of 4")
    out = torch.empty(rows.shape[0], n, dtype=rows.dtype)
    _call(op, rows.data_ptr(), weight.data_ptr(), offsets.data_ptr(), out.data_ptr(), rows.shape[0], experts, n, k)
    return out


def grouped_matmul(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """rows [M, K] sorted by expert, weight [E, K, N], offsets [E] int64 (ending at M) -> [M, N]. N % 16 == 0."""
    op = "grouped_matmul"
    if not (isinstance(weight, torch.Tensor) and weight.dim() == 3):
        _fail(op, "weight must be [E, K, N]")
    experts, k, n = weight.shape
    rows = rows.contiguous() if isinstance(rows, torch.Tensor) else rows  # held here: the library reads it
    _check_grouped(op, rows, weight, offsets, k)
    if not (k > 0):
        _fail(op, "K must be positive")
    if not (n > 0 and n % 16 == 0):
        _fail(op, f"N = {n} must be a positive multiple of 16")
    out = torch.empty(rows.shape[0], n, dtype=rows.dtype)
    _call(op, rows.data_ptr(), weight.data_ptr(), offsets.data_ptr(), out.data_ptr(), rows.shape[0], experts, n, k)
    return out


def moe_serves(x: torch.Tensor, router: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
               top_k: int) -> bool:
    """Whether `moe_dispatch` / `moe_combine` and the grouped kernels serve a MoE layer on x [N, D]."""
    return (x.dim() == 2 and x.is_contiguous() and router.is_contiguous() and router.dtype == torch.float32
            and router.shape[0] <= LIMITS["experts"] and 1 <= top_k <= min(LIMITS["top_k"], router.shape[0])
            and grouped_serves(x, gate_up, down) and x.shape[0] * top_k <= MAX_GROUPED_ROWS)


def moe_dispatch(x: torch.Tensor, router: torch.Tensor, top_k: int):
    """Route x [N, D] with router [E, D]: rows [N*k, D] sorted by expert, counts [E], offsets [E]
    (cumulative counts), position [N*k] (where token t's j-th slot landed), gates [N, k]."""
    op = "moe_dispatch"
    if not (isinstance(x, torch.Tensor) and x.dim() == 2):
        _fail(op, "x must be [N, D]")
    tokens, dim = x.shape
    _check_tensor(op, "x", x)
    _check_vector_size(op, "D", dim)
    if not (isinstance(router, torch.Tensor) and router.dim() == 2):
        _fail(op, "router must be [E, D]")
    experts = router.shape[0]
    _check_tensor(op, "router", router, (experts, dim))
    _check_routing(op, experts, top_k, tokens)
    rows = torch.empty(tokens * top_k, dim, dtype=x.dtype)
    counts = torch.empty(experts, dtype=torch.int64)
    offsets = torch.empty(experts, dtype=torch.int64)
    position = torch.empty(tokens * top_k, dtype=torch.int64)
    gates = torch.empty(tokens, top_k, dtype=x.dtype)
    _call(op, x.data_ptr(), router.data_ptr(), tokens, dim, experts, top_k, rows.data_ptr(),
          counts.data_ptr(), offsets.data_ptr(), position.data_ptr(), gates.data_ptr())
    return rows, counts, offsets, position, gates


def moe_combine(expert_out: torch.Tensor, position: torch.Tensor, gates: torch.Tensor,
                shared: torch.Tensor) -> torch.Tensor:
    """shared [N, D] + each token's gate-weighted expert outputs (rows of expert_out [N*k, D])."""
    op = "moe_combine"
    if not (isinstance(gates, torch.Tensor) and gates.dim() == 2):
        _fail(op, "gates must be [N, k]")
    tokens, top_k = gates.shape
    if not (1 <= top_k <= LIMITS["top_k"]):
        _fail(op, f"top_k = {top_k}; the kernel takes 1 to {LIMITS['top_k']}")
    shared = shared.contiguous() if isinstance(shared, torch.Tensor) else shared  # held: the library reads it
    if not (isinstance(shared, torch.Tensor) and shared.dim() == 2 and shared.shape[0] == tokens):
        _fail(op, "shared must be [N, D]")
    dim = shared.shape[1]
    if not (dim > 0):
        _fail(op, "D must be positive")
    _check_tensor(op, "gates", gates)
    _check_tensor(op, "shared", shared)
    _check_tensor(op, "expert_out", expert_out, (tokens * top_k, dim))
    _check_tensor(op, "position", position, (tokens * top_k,), dtype=torch.int64)
    out = torch.empty_like(shared)
    _call(op, expert_out.data_ptr(), position.data_ptr(), gates.data_ptr(), shared.data_ptr(), out.data_ptr(),
          tokens, dim, top_k)
    return out


def swiglu_serves(h: torch.Tensor) -> bool:
    """Whether the fused SwiGLU activation serves h [..., 2H] (float32 on the CPU, H % 8 == 0, outside
    autocast and compile). Unlike the products above it serves training too: it has a backward."""
    return ENABLED and _cpu_float32(h) and h.dim() > 0 and h.shape[-1] % 16 == 0 and h.numel() > 0 and _path_open()


def _check_swiglu_input(op: str, h: torch.Tensor) -> int:
    if not (isinstance(h, torch.Tensor) and h.dim() > 0):
        _fail(op, "h must be [..., 2H]")
    _check_tensor(op, "h", h)
    if not (h.shape[-1] % 16 == 0 and h.shape[-1] > 0):
        _fail(op, f"2H = {h.shape[-1]} must be a positive multiple of 16")
    return h.shape[-1] // 2


def swiglu_forward(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * value for h = [gate | value] [..., 2H] -> [..., H] in one pass (see swiglu_serves)."""
    h = h.contiguous() if isinstance(h, torch.Tensor) else h  # held here: the library reads it below
    hidden = _check_swiglu_input("swiglu_forward", h)
    out = torch.empty((*h.shape[:-1], hidden), dtype=h.dtype, device=h.device)
    _call("swiglu_forward", h.data_ptr(), out.data_ptr(), h.numel() // h.shape[-1], hidden)
    return out


def swiglu_backward(h: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """The gradient with respect to h of swiglu_forward(h), given grad_out [..., H], in one pass."""
    op = "swiglu_backward"
    h = h.contiguous() if isinstance(h, torch.Tensor) else h  # held here: the library reads them below
    grad_out = grad_out.contiguous() if isinstance(grad_out, torch.Tensor) else grad_out
    hidden = _check_swiglu_input(op, h)
    _check_tensor(op, "grad_out", grad_out, (*h.shape[:-1], hidden))
    grad = torch.empty_like(h)
    _call(op, h.data_ptr(), grad_out.data_ptr(), grad.data_ptr(), h.numel() // h.shape[-1], hidden)
    return grad


# Cached decoding of a whole hybrid block in three calls (lm.HybridBlock's decode step): the streams'
# read, norm and qkv product; the attention step (linear_attention_step or sparse_attention_step); the
# output product, the MoE and the streams' write. A switch for tests and benchmarks, like ENABLED:
# False keeps the per-operation kernels above.
FUSED_DECODE = True
# Rows the fused step serves: its dense products run in the C kernel at any row count, and the
# step still ran ~1.6-2x faster than the operations one by one (torch's GEMMs for the dense products
# above MAX_ROWS) from 64 to 512 rows (flash model, 2-core AMD EPYC, measured while building); 512 is
# the sampler's default batch.
MAX_FUSED_ROWS = 512
MAX_SPARSE_KEYS = LIMITS["keys"] - 1  # kept keys a sparse decode step attends over (with the query's own)


def decode_block_serves(streams: torch.Tensor, *tensors: torch.Tensor) -> bool:
    """Whether the fused block step serves streams [S, B, 1, D] (one token per row; the first stream a
    block of memory, the others B * D floats on or all the same) with these weights and states."""
    if not (FUSED_DECODE and ENABLED) or torch.is_grad_enabled() or streams.dim() != 4 or streams.shape[2] != 1:
        return False
    n_streams, batch, _, dim = streams.shape
    if not (n_streams <= LIMITS["streams"] and 0 < batch <= MAX_FUSED_ROWS and dim % 16 == 0
            and streams[0].is_contiguous() and streams.stride(0) in (0, batch * dim) and _cpu_float32(streams)):
        return False
    return _cpu_float32(*tensors) and all(t.is_contiguous() for t in tensors) and _path_open()


def decode_attention_in(streams: torch.Tensor, input_logits: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                        qkv_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """streams [S, B, 1, D] -> (mixed [B, 1, D], the softmax(input_logits)-weighted mix of the streams;
    qkv [B, 1, 3D] = rms_norm(mixed) @ qkv_weight^T)."""
    op = "decode_attention_in"
    n_streams, batch, dim = _check_streams(op, streams)
    _check_tensor(op, "input_logits", input_logits, (n_streams,))
    _check_tensor(op, "norm_weight", norm_weight, (dim,))
    _check_tensor(op, "qkv_weight", qkv_weight, (3 * dim, dim))
    mixed = torch.empty(batch, 1, dim, dtype=torch.float32)
    qkv = torch.empty(batch, 1, qkv_weight.shape[0], dtype=torch.float32)
    _call(op, streams.data_ptr(), streams.stride(0), n_streams, batch, dim, input_logits.data_ptr(),
          norm_weight.data_ptr(), eps, qkv_weight.data_ptr(), mixed.data_ptr(), qkv.data_ptr())
    return mixed, qkv


def sparse_attention_step(qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, kept: int, slot: int,
                          cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """One token of the sparse layer: q and k of qkv [B, 1, 3D] rotated by cos/sin [d], attention over
    the first `kept` keys/values of the buffers [B, H, capacity, d] and its own key, then its key and
    value stored at `slot` (-1: not stored). -> out [B, 1, D] (before the output product)."""
    op = "sparse_attention_step"
    if not (isinstance(keys, torch.Tensor) and keys.dim() == 4):
        _fail(op, "keys must be [B, H, capacity, d]")
    batch, heads, capacity, d = keys.shape
    if not (d <= LIMITS["head_dim"]):
        _fail(op, f"head size {d}; the kernel holds at most {LIMITS['head_dim']}")
    _check_vector_size(op, "the head size", d)
    if not (0 <= kept <= min(capacity, MAX_SPARSE_KEYS)):
        _fail(op, f"kept = {kept} keys; the kernel takes 0 to min(capacity {capacity}, {MAX_SPARSE_KEYS})")
    if not (-1 <= slot < capacity):
        _fail(op, f"slot = {slot} outside -1 .. capacity - 1 = {capacity - 1}")
    _check_tensor(op, "keys", keys)
    _check_tensor(op, "values", values, tuple(keys.shape))
    _check_tensor(op, "qkv", qkv, (batch, 1, 3 * heads * d))
    _check_tensor(op, "cos", cos, (d,))
    _check_tensor(op, "sin", sin, (d,))
    out = torch.empty(batch, 1, heads * d, dtype=torch.float32)
    _call(op, qkv.data_ptr(), keys.data_ptr(), values.data_ptr(), capacity, kept, slot, batch, heads, d,
          cos.data_ptr(), sin.data_ptr(), out.data_ptr())
    return out


def decode_moe_out(streams: torch.Tensor, output_logits: torch.Tensor, double_residual: bool, attn: torch.Tensor,
                   out_weight: torch.Tensor, mixed: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                   router: torch.Tensor, top_k: int, gate_up: torch.Tensor, down: torch.Tensor,
                   shared_up: torch.Tensor, shared_down: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rest of a block's decode step after attention (attn [B, 1, D] before its output product):
    -> (the new streams [S, B, 1, D], routed slots per expert [E]). router [E, D], gate_up [E, 2H, D],
    down [E, H, D], shared_up [2H, D], shared_down [D, H]; D % 16 == 0, H % 8 == 0."""
    op = "decode_moe_out"
    n_streams, batch, dim = _check_streams(op, streams)
    if not (dim % 16 == 0):
        _fail(op, f"D = {dim} must be a multiple of 16")
    if not (isinstance(down, torch.Tensor) and down.dim() == 3):
        _fail(op, "down must be [E, H, D]")
    experts, hidden = down.shape[0], down.shape[1]
    _check_vector_size(op, "H", hidden)
    _check_routing(op, experts, top_k, batch)
    for name, tensor, shape in (("output_logits", output_logits, (n_streams,)), ("attn", attn, (batch, 1, dim)),
                                ("out_weight", out_weight, (dim, dim)), ("mixed", mixed, (batch, 1, dim)),
                                ("norm_weight", norm_weight, (dim,)), ("router", router, (experts, dim)),
                                ("gate_up", gate_up, (experts, 2 * hidden, dim)), ("down", down, (experts, hidden, dim)),
                                ("shared_up", shared_up, (2 * hidden, dim)), ("shared_down", shared_down, (dim, hidden))):
        _check_tensor(op, name, tensor, shape)
    new_streams = torch.empty(n_streams, batch, 1, dim, dtype=torch.float32)
    counts = torch.empty(experts, dtype=torch.int64)
    _call(op, streams.data_ptr(), streams.stride(0), n_streams, batch, dim, output_logits.data_ptr(),
          int(double_residual), attn.data_ptr(), out_weight.data_ptr(), mixed.data_ptr(), norm_weight.data_ptr(), eps,
          router.data_ptr(), experts, top_k, gate_up.data_ptr(), down.data_ptr(), hidden, shared_up.data_ptr(),
          shared_down.data_ptr(), counts.data_ptr(), new_streams.data_ptr())
    return new_streams, counts


RMS_BLOCK = 256  # rows per partial sum of the RMSNorm weight's gradient (kernels.c's RMS_BLOCK)


def rms_norm_training_serves(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the RMSNorm forward/backward pair serves x [..., D] (float32 on the CPU, D % 8 == 0,
    outside autocast and compile); gradients on or off."""
    return (ENABLED and _cpu_float32(x, weight) and x.dim() > 0 and x.numel() > 0 and x.shape[-1] % 8 == 0
            and weight.shape == x.shape[-1:] and weight.is_contiguous() and _path_open())


def _check_rms_input(op: str, x: torch.Tensor, weight: torch.Tensor) -> int:
    if not (isinstance(x, torch.Tensor) and x.dim() > 0):
        _fail(op, "x must be [..., D]")
    dim = x.shape[-1]
    _check_tensor(op, "x", x)
    _check_vector_size(op, "D", dim)
    _check_tensor(op, "weight", weight, (dim,))
    return dim


def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of x [..., D] -> (out, rstd [rows]) for the backward."""
    x = x.contiguous() if isinstance(x, torch.Tensor) else x  # held here: the library reads it below
    dim = _check_rms_input("rms_norm_forward", x, weight)
    out = torch.empty_like(x)
    rstd = torch.empty(x.numel() // dim, dtype=x.dtype, device=x.device)
    _call("rms_norm_forward", x.data_ptr(), weight.data_ptr(), out.data_ptr(), rstd.data_ptr(), rstd.numel(), dim, eps)
    return out, rstd


def rms_norm_backward(x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
                      grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x, grad_w) of rms_norm_forward, in one pass over x and grad_out."""
    op = "rms_norm_backward"
    x = x.contiguous() if isinstance(x, torch.Tensor) else x  # held here: the library reads them below
    grad_out = grad_out.contiguous() if isinstance(grad_out, torch.Tensor) else grad_out
    dim = _check_rms_input(op, x, weight)
    rows = x.numel() // dim
    _check_tensor(op, "rstd", rstd, (rows,))
    _check_tensor(op, "grad_out", grad_out, tuple(x.shape))
    grad_x = torch.empty_like(x)
    grad_w = torch.empty_like(weight)
    partial = torch.empty((rows + RMS_BLOCK - 1) // RMS_BLOCK, dim, dtype=x.dtype, device=x.device)
    _call(op, x.data_ptr(), weight.data_ptr(), rstd.data_ptr(), grad_out.data_ptr(), grad_x.data_ptr(),
          grad_w.data_ptr(), partial.data_ptr(), rows, dim)
    return grad_x, grad_w


# ----------------------------------------------------------------------------------- references
# The plain formulas each op computes, in torch, beside the ops (tests drive both with random legal
# shapes and compare). They take the op's arguments and return what it returns; the in-place state of
# the attention steps comes back as new tensors instead.


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., d] rotated in interleaved pairs: x * cos + (-x_odd, x_even) * sin."""
    pairs = x.unflatten(-1, (-1, 2))
    swapped = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return x * cos + swapped * sin


def _feature_map(u: torch.Tensor) -> torch.Tensor:
    return F.elu(u) + 1


def reference_rms_norm(x, weight, eps):
    return _rms(x, weight, eps)


def reference_swiglu(h):
    gate, value = h.chunk(2, dim=-1)
    return F.silu(gate) * value


def _expert_slices(offsets: torch.Tensor):
    start = 0
    for expert, end in enumerate(offsets.tolist()):
        yield expert, slice(start, end)
        start = end


def reference_grouped_linear(rows, weight, offsets):
    out = rows.new_zeros(rows.shape[0], weight.shape[1])
    for expert, part in _expert_slices(offsets):
        out[part] = rows[part] @ weight[expert].T
    return out


def reference_grouped_matmul(rows, weight, offsets):
    out = rows.new_zeros(rows.shape[0], weight.shape[2])
    for expert, part in _expert_slices(offsets):
        out[part] = rows[part] @ weight[expert]
    return out


def reference_moe_dispatch(x, router, top_k):
    """Top-k by logit (the lower index on a tie), gates the softmax of the chosen logits, slots sorted
    stably by expert."""
    logits = x @ router.T
    chosen = torch.argsort(-logits, dim=-1, stable=True)[:, :top_k]
    gates = torch.softmax(logits.gather(1, chosen), dim=-1)
    flat = chosen.flatten()
    order = torch.argsort(flat, stable=True)
    position = torch.empty_like(order)
    position[order] = torch.arange(flat.numel())
    rows = x[order // top_k]
    counts = torch.bincount(flat, minlength=router.shape[0])
    return rows, counts, counts.cumsum(0), position, gates


def reference_moe_combine(expert_out, position, gates, shared):
    tokens, top_k = gates.shape
    picked = expert_out[position].view(tokens, top_k, shared.shape[-1])
    return shared + (gates.unsqueeze(-1) * picked).sum(1)


def reference_linear_attention_step(qkv, kv, z, cos, sin, floor):
    """-> (out [B, 1, D], the new kv, the new z)."""
    batch, heads, d = z.shape
    q, k, v = qkv.view(batch, 3, heads, d).unbind(1)
    if cos is not None:
        q, k = _rotate_pairs(q, cos, sin), _rotate_pairs(k, cos, sin)
    pq, pk = _feature_map(q), _feature_map(k)
    kv = kv + pk.unsqueeze(-1) * v.unsqueeze(-2)
    z = z + pk
    numerator = (pq.unsqueeze(-1) * kv).sum(-2)
    denominator = (pq * z).sum(-1, keepdim=True).clamp_min(floor)
    return (numerator / denominator).reshape(batch, 1, heads * d), kv, z


def reference_sparse_attention_step(qkv, keys, values, kept, slot, cos, sin):
    """-> (out [B, 1, D], the new keys, the new values)."""
    batch, heads, capacity, d = keys.shape
    q, k, v = qkv.view(batch, 3, heads, d).unbind(1)
    q, k = _rotate_pairs(q, cos, sin), _rotate_pairs(k, cos, sin)
    all_keys = torch.cat((keys[:, :, :kept], k.unsqueeze(2)), dim=2)
    all_values = torch.cat((values[:, :, :kept], v.unsqueeze(2)), dim=2)
    weights = torch.softmax((all_keys @ q.unsqueeze(-1)).squeeze(-1) / d ** 0.5, dim=-1)
    out = (weights.unsqueeze(-1) * all_values).sum(2).reshape(batch, 1, heads * d)
    keys, values = keys.clone(), values.clone()
    if slot >= 0:
        keys[:, :, slot], values[:, :, slot] = k, v
    return out, keys, values


def _mix(streams: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    weights = torch.softmax(logits, dim=0)
    return (weights.view(-1, 1, 1, 1) * streams).sum(0)


def reference_decode_attention_in(streams, input_logits, norm_weight, eps, qkv_weight):
    mixed = _mix(streams, input_logits)
    return mixed, _rms(mixed, norm_weight, eps) @ qkv_weight.T


def reference_decode_moe_out(streams, output_logits, double_residual, attn, out_weight, mixed, norm_weight, eps,
                             router, top_k, gate_up, down, shared_up, shared_down):
    attn_out = attn @ out_weight.T
    normed = _rms(mixed + attn_out, norm_weight, eps).flatten(0, 1)
    rows, counts, offsets, position, gates = reference_moe_dispatch(normed, router, top_k)
    routed = reference_grouped_matmul(reference_swiglu(reference_grouped_linear(rows, gate_up, offsets)), down,
                                      offsets)
    shared = reference_swiglu(normed @ shared_up.T) @ shared_down.T
    update = attn_out + reference_moe_combine(routed, position, gates, shared).view_as(attn_out)
    weights = torch.softmax(output_logits, dim=0).view(-1, 1, 1, 1)
    if double_residual:
        return streams + weights * (mixed + update), counts
    return streams + streams.shape[0] * weights * update, counts


class Linear(nn.Linear):
    """nn.Linear without bias (same parameters and state-dict keys) whose forward takes the CPU
    kernel where it serves (decoding a few rows) and F.linear everywhere else."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight)


receipts.observe("decode_kernels", observed)


__all__ = ["FUSED_DECODE", "KernelArgumentError", "LIMITS", "Linear", "MAX_FUSED_ROWS", "MAX_GROUPED_ROWS", "MAX_ROWS",
           "MAX_SPARSE_KEYS", "RMS_BLOCK", "available", "c_limits", "decode_attention_in",
           "decode_block_serves", "decode_moe_out", "grouped_linear", "grouped_matmul",
           "grouped_serves", "head_dim_serves", "linear", "linear_attention_serves", "linear_attention_step",
           "moe_combine", "moe_dispatch", "moe_serves", "observed", "rms_norm", "rms_norm_backward", "rms_norm_forward",
           "rms_norm_training_serves", "sparse_attention_step", "status", "swiglu_backward", "swiglu_forward",
           "swiglu_serves"]
