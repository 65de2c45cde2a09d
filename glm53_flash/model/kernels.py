"""Skinny matrix products for cached decoding on the CPU (skinny.c), built on first use.

A decode step multiplies a handful of rows (one per sequence) by every weight matrix once. BLAS
tunes for large M: at 16 rows MKL's fp32 GEMM streams the flash model's weights at ~4 GB/s, a fifth
of this machine's memory bandwidth, and the step's matrix products took most of its time. The C
loops in skinny.c hold a few weight rows in registers and run every input row past them, so each
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

SOURCE = Path(__file__).with_name("skinny.c")
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
    target = cache_directory() / f"skinny-{isa}-{key}.so"
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
    signatures = {
        "skinny_linear": [pointer] * 3 + [size] * 3,
        "skinny_grouped_linear": [pointer] * 4 + [size] * 3,
        "skinny_grouped_matmul": [pointer] * 4 + [size] * 3,
        "skinny_moe_dispatch": [pointer] * 2 + [size] * 4 + [pointer] * 5,
        "skinny_moe_combine": [pointer] * 5 + [size] * 3,
        "skinny_linear_attention_step": [pointer] * 4 + [size] * 3 + [pointer] * 2 + [ctypes.c_float],
        "skinny_swiglu_forward": [pointer] * 2 + [size] * 2,
        "skinny_rms_norm_forward": [pointer] * 4 + [size] * 2 + [ctypes.c_float],
        "skinny_rms_norm_backward": [pointer] * 7 + [size] * 2,
        "skinny_swiglu_backward": [pointer] * 3 + [size] * 2,
        "skinny_sparse_attention_step": [pointer] * 3 + [size] * 6 + [pointer] * 3,
    }
    for name, arguments in signatures.items():
        function = getattr(library, name)
        function.restype = None
        function.argtypes = arguments
    # The two that allocate their scratch memory return 0, or 1 when malloc failed.
    library.skinny_decode_attention_in.restype = ctypes.c_int
    library.skinny_decode_attention_in.argtypes = [pointer] + [size] * 4 + [pointer] * 2 + [ctypes.c_float] \
        + [pointer] * 3
    library.skinny_decode_moe_out.restype = ctypes.c_int
    library.skinny_decode_moe_out.argtypes = ([pointer] + [size] * 4 + [pointer, size] + [pointer] * 4
                                              + [ctypes.c_float, pointer, size, size] + [pointer] * 2 + [size]
                                              + [pointer] * 4)
    library.skinny_lanes.restype, library.skinny_lanes.argtypes = ctypes.c_int64, []
    return library, f"loaded ({isa}, {library.skinny_lanes()} float lanes)", target


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
        raise RuntimeError(f"the skinny kernels are not available: {_state['reason']}")
    return library


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
    """F.linear(x, weight) without bias; by the kernel where it serves."""
    if not ENABLED or torch.is_grad_enabled():  # training: straight to torch
        return F.linear(x, weight)
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    if not _serves(x, weight, rows, MAX_ROWS) or weight.shape[1] != k:
        return F.linear(x, weight)
    x = x.contiguous()  # held here: the library reads it below (a no-op for the usual contiguous x)
    out = torch.empty((*x.shape[:-1], weight.shape[0]), dtype=x.dtype)
    _state["library"].skinny_linear(x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, weight.shape[0], k)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """RMSNorm over the last dimension by the kernel where it serves (a few rows); None elsewhere, for
    the caller's own path."""
    if not ENABLED or torch.is_grad_enabled():
        return None
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    if not _serves(x, weight, rows, MAX_ROWS) or weight.shape != (dim,):
        return None
    x = x.contiguous()  # held here: the library reads it below
    out = torch.empty_like(x)
    _state["library"].skinny_rms_norm_forward(x.data_ptr(), weight.data_ptr(), out.data_ptr(), None, rows, dim, eps)
    return out


def head_dim_serves(head_dim: int) -> bool:
    """Whether the attention steps in C take heads of this size (their per-head buffers hold 256 floats)."""
    return head_dim % 8 == 0 and head_dim <= 256


def linear_attention_serves(qkv: torch.Tensor, kv: torch.Tensor, z: torch.Tensor, head_dim: int) -> bool:
    """Whether `linear_attention_step` serves one decode step: qkv [B, 1, 3D], the state [B, H, d, d]."""
    return (_serves(qkv, kv, qkv.shape[0], MAX_GROUPED_ROWS) and head_dim_serves(head_dim)
            and qkv.is_contiguous() and z.is_contiguous() and z.dtype == torch.float32)


def linear_attention_step(qkv: torch.Tensor, kv: torch.Tensor, z: torch.Tensor, cos: torch.Tensor | None,
                          sin: torch.Tensor | None, floor: float) -> torch.Tensor:
    """One token of feature-map linear attention on the cached state (kv [B, H, d, d], z [B, H, d],
    updated in place): qkv [B, 1, 3D] -> out [B, 1, D]; cos/sin [d] rotate q and k first when given."""
    batch, heads, d = z.shape
    out = torch.empty(batch, 1, heads * d, dtype=qkv.dtype)
    rotate = cos is not None
    _state["library"].skinny_linear_attention_step(
        qkv.data_ptr(), kv.data_ptr(), z.data_ptr(), out.data_ptr(), batch, heads, d,
        cos.data_ptr() if rotate else None, sin.data_ptr() if rotate else None, floor)
    return out


def grouped_serves(rows: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> bool:
    """Whether `grouped_swiglu_products` serves these rows: gate_up [E, 2H, D], down [E, H, D]."""
    return (_serves(rows, gate_up, rows.shape[0], MAX_GROUPED_ROWS) and down.dtype == torch.float32
            and down.is_contiguous() and gate_up.shape[1] % 8 == 0 and down.shape[2] % 16 == 0
            and rows.is_contiguous())


def grouped_linear(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """rows [M, K] sorted by expert, weight [E, N, K], offsets [E] int64 (cumulative counts) -> [M, N]."""
    experts, n, k = weight.shape
    out = torch.empty(rows.shape[0], n, dtype=rows.dtype)
    _required().skinny_grouped_linear(rows.data_ptr(), weight.data_ptr(), offsets.data_ptr(),
                                            out.data_ptr(), experts, n, k)
    return out


def grouped_matmul(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """rows [M, K] sorted by expert, weight [E, K, N], offsets [E] int64 -> [M, N]."""
    experts, k, n = weight.shape
    rows = rows.contiguous()  # held here: the library reads it after this line
    out = torch.empty(rows.shape[0], n, dtype=rows.dtype)
    _required().skinny_grouped_matmul(rows.data_ptr(), weight.data_ptr(),
                                            offsets.data_ptr(), out.data_ptr(), experts, n, k)
    return out


def moe_serves(x: torch.Tensor, router: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
               top_k: int) -> bool:
    """Whether `moe_dispatch` / `moe_combine` and the grouped kernels serve a MoE layer on x [N, D]."""
    return (x.dim() == 2 and x.is_contiguous() and router.is_contiguous() and router.dtype == torch.float32
            and router.shape[0] <= 64 and top_k <= min(8, router.shape[0])
            and grouped_serves(x, gate_up, down) and x.shape[0] * top_k <= MAX_GROUPED_ROWS)


def moe_dispatch(x: torch.Tensor, router: torch.Tensor, top_k: int):
    """Route x [N, D] with router [E, D]: rows [N*k, D] sorted by expert, counts [E], offsets [E]
    (cumulative counts), position [N*k] (where token t's j-th slot landed), gates [N, k]."""
    tokens, dim = x.shape
    experts = router.shape[0]
    rows = torch.empty(tokens * top_k, dim, dtype=x.dtype)
    counts = torch.empty(experts, dtype=torch.int64)
    offsets = torch.empty(experts, dtype=torch.int64)
    position = torch.empty(tokens * top_k, dtype=torch.int64)
    gates = torch.empty(tokens, top_k, dtype=x.dtype)
    _required().skinny_moe_dispatch(x.data_ptr(), router.data_ptr(), tokens, dim, experts, top_k, rows.data_ptr(),
                                    counts.data_ptr(), offsets.data_ptr(), position.data_ptr(), gates.data_ptr())
    return rows, counts, offsets, position, gates


def moe_combine(expert_out: torch.Tensor, position: torch.Tensor, gates: torch.Tensor,
                shared: torch.Tensor) -> torch.Tensor:
    """shared [N, D] + each token's gate-weighted expert outputs (rows of expert_out [N*k, D])."""
    tokens, top_k = gates.shape
    shared = shared.contiguous()  # held here: the library reads it below
    out = torch.empty_like(shared)
    _required().skinny_moe_combine(expert_out.data_ptr(), position.data_ptr(), gates.data_ptr(), shared.data_ptr(),
                                   out.data_ptr(), tokens, shared.shape[1], top_k)
    return out


def swiglu_serves(h: torch.Tensor) -> bool:
    """Whether the fused SwiGLU activation serves h [..., 2H] (float32 on the CPU, H % 8 == 0, outside
    autocast and compile). Unlike the products above it serves training too: it has a backward."""
    return ENABLED and _cpu_float32(h) and h.dim() > 0 and h.shape[-1] % 16 == 0 and h.numel() > 0 and _path_open()


def swiglu_forward(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * value for h = [gate | value] [..., 2H] -> [..., H] in one pass (see swiglu_serves)."""
    h = h.contiguous()  # held here: the library reads it below
    hidden = h.shape[-1] // 2
    out = torch.empty((*h.shape[:-1], hidden), dtype=h.dtype, device=h.device)
    _required().skinny_swiglu_forward(h.data_ptr(), out.data_ptr(), h.numel() // h.shape[-1], hidden)
    return out


def swiglu_backward(h: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """The gradient with respect to h of swiglu_forward(h), given grad_out [..., H], in one pass."""
    h, grad_out = h.contiguous(), grad_out.contiguous()  # held here: the library reads them below
    grad = torch.empty_like(h)
    _required().skinny_swiglu_backward(h.data_ptr(), grad_out.data_ptr(), grad.data_ptr(),
                                       h.numel() // h.shape[-1], h.shape[-1] // 2)
    return grad


# Cached decoding of a whole hybrid block in three calls (lm.HybridBlock's decode step): the streams'
# read, norm and qkv product; the attention step (linear_attention_step or sparse_attention_step); the
# output product, the MoE and the streams' write. A switch for tests and benchmarks, like ENABLED:
# False keeps the per-operation kernels above.
FUSED_DECODE = True
# Rows the fused step serves: its dense products run in the skinny kernel at any row count, and the
# step still ran ~1.6-2x faster than the operations one by one (torch's GEMMs for the dense products
# above MAX_ROWS) from 64 to 512 rows (flash model, 2-core AMD EPYC, measured while building); 512 is
# the sampler's default batch.
MAX_FUSED_ROWS = 512
MAX_SPARSE_KEYS = 4095  # kept keys a sparse decode step attends over (skinny.c's score buffer)


def decode_block_serves(streams: torch.Tensor, *tensors: torch.Tensor) -> bool:
    """Whether the fused block step serves streams [S, B, 1, D] (one token per row; the first stream a
    block of memory, the others B * D floats on or all the same) with these weights and states."""
    if not (FUSED_DECODE and ENABLED) or torch.is_grad_enabled() or streams.dim() != 4 or streams.shape[2] != 1:
        return False
    n_streams, batch, _, dim = streams.shape
    if not (n_streams <= 64 and 0 < batch <= MAX_FUSED_ROWS and dim % 16 == 0 and streams[0].is_contiguous()
            and streams.stride(0) in (0, batch * dim) and _cpu_float32(streams)):
        return False
    return _cpu_float32(*tensors) and all(t.is_contiguous() for t in tensors) and _path_open()


def _checked(code: int, what: str) -> None:
    if code:
        raise MemoryError(f"the {what} kernel could not allocate its scratch memory")


def decode_attention_in(streams: torch.Tensor, input_logits: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                        qkv_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """streams [S, B, 1, D] -> (mixed [B, 1, D], the softmax(input_logits)-weighted mix of the streams;
    qkv [B, 1, 3D] = rms_norm(mixed) @ qkv_weight^T)."""
    n_streams, batch, _, dim = streams.shape
    mixed = torch.empty(batch, 1, dim, dtype=torch.float32)
    qkv = torch.empty(batch, 1, qkv_weight.shape[0], dtype=torch.float32)
    _checked(_required().skinny_decode_attention_in(
        streams.data_ptr(), streams.stride(0), n_streams, batch, dim, input_logits.data_ptr(), norm_weight.data_ptr(),
        eps, qkv_weight.data_ptr(), mixed.data_ptr(), qkv.data_ptr()), "decode_attention_in")
    return mixed, qkv


def sparse_attention_step(qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, kept: int, slot: int,
                          cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """One token of the sparse layer: q and k of qkv [B, 1, 3D] rotated by cos/sin [d], attention over
    the first `kept` keys/values of the buffers [B, H, capacity, d] and its own key, then its key and
    value stored at `slot` (-1: not stored). -> out [B, 1, D] (before the output product)."""
    batch, heads, capacity, d = keys.shape
    out = torch.empty(batch, 1, heads * d, dtype=torch.float32)
    _required().skinny_sparse_attention_step(qkv.data_ptr(), keys.data_ptr(), values.data_ptr(), capacity, kept,
                                             slot, batch, heads, d, cos.data_ptr(), sin.data_ptr(), out.data_ptr())
    return out


def decode_moe_out(streams: torch.Tensor, output_logits: torch.Tensor, double_residual: bool, attn: torch.Tensor,
                   out_weight: torch.Tensor, mixed: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                   router: torch.Tensor, top_k: int, gate_up: torch.Tensor, down: torch.Tensor,
                   shared_up: torch.Tensor, shared_down: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rest of a block's decode step after attention (attn [B, 1, D] before its output product):
    -> (the new streams [S, B, 1, D], routed slots per expert [E])."""
    n_streams, batch, _, dim = streams.shape
    experts, hidden = down.shape[0], down.shape[1]
    new_streams = torch.empty(n_streams, batch, 1, dim, dtype=torch.float32)
    counts = torch.empty(experts, dtype=torch.int64)
    _checked(_required().skinny_decode_moe_out(
        streams.data_ptr(), streams.stride(0), n_streams, batch, dim, output_logits.data_ptr(), int(double_residual),
        attn.data_ptr(), out_weight.data_ptr(), mixed.data_ptr(), norm_weight.data_ptr(), eps, router.data_ptr(),
        experts, top_k, gate_up.data_ptr(), down.data_ptr(), hidden, shared_up.data_ptr(), shared_down.data_ptr(),
        counts.data_ptr(), new_streams.data_ptr()), "decode_moe_out")
    return new_streams, counts


RMS_BLOCK = 256  # rows per partial sum of the RMSNorm weight's gradient (skinny.c's RMS_BLOCK)


def rms_norm_training_serves(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the RMSNorm forward/backward pair serves x [..., D] (float32 on the CPU, D % 8 == 0,
    outside autocast and compile); gradients on or off."""
    return (ENABLED and _cpu_float32(x, weight) and x.dim() > 0 and x.numel() > 0 and x.shape[-1] % 8 == 0
            and weight.shape == x.shape[-1:] and weight.is_contiguous() and _path_open())


def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of x [..., D] -> (out, rstd [rows]) for the backward."""
    x = x.contiguous()  # held here: the library reads it below
    dim = x.shape[-1]
    out = torch.empty_like(x)
    rstd = torch.empty(x.numel() // dim, dtype=x.dtype, device=x.device)
    _required().skinny_rms_norm_forward(x.data_ptr(), weight.data_ptr(), out.data_ptr(), rstd.data_ptr(),
                                        rstd.numel(), dim, eps)
    return out, rstd


def rms_norm_backward(x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
                      grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x, grad_weight) of rms_norm_forward, in one pass over x and grad_out."""
    x, grad_out = x.contiguous(), grad_out.contiguous()  # held here: the library reads them below
    rows, dim = rstd.numel(), x.shape[-1]
    grad_x = torch.empty_like(x)
    grad_w = torch.empty_like(weight)
    partial = torch.empty((rows + RMS_BLOCK - 1) // RMS_BLOCK, dim, dtype=x.dtype, device=x.device)
    _required().skinny_rms_norm_backward(x.data_ptr(), weight.data_ptr(), rstd.data_ptr(), grad_out.data_ptr(),
                                         grad_x.data_ptr(), grad_w.data_ptr(), partial.data_ptr(), rows, dim)
    return grad_x, grad_w


class Linear(nn.Linear):
    """nn.Linear without bias (same parameters and state-dict keys) whose forward takes the skinny
    kernel where it serves (decoding a few rows) and F.linear everywhere else."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight)


__all__ = ["FUSED_DECODE", "Linear", "MAX_FUSED_ROWS", "MAX_GROUPED_ROWS", "MAX_ROWS", "MAX_SPARSE_KEYS", "RMS_BLOCK",
           "available", "decode_attention_in", "decode_block_serves", "decode_moe_out", "grouped_linear",
           "grouped_matmul", "grouped_serves", "head_dim_serves", "linear", "linear_attention_serves",
           "linear_attention_step", "moe_combine", "moe_dispatch", "moe_serves", "observed", "rms_norm",
           "rms_norm_backward", "rms_norm_forward", "rms_norm_training_serves", "sparse_attention_step", "status",
           "swiglu_backward", "swiglu_forward", "swiglu_serves"]
