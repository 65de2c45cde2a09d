"""The routed experts' fast paths: each token's gate-weighted sum of its k experts, as moe.py's loop over
experts computes it, by whichever path serves, chosen by one rule (`expert_path`):

| path | what runs | served where |
|---|---|---|
| skinny | the C grouped kernels (ops/grouped.py), each expert's weights read once | no gradients, CPU float32, at most MAX_GROUPED_ROWS slots |
| blocked | torch's grouped kernel in bf16, every expert's rows padded to PRODUCT_BLOCK; the gathers and the combine fused (`routed_blocked`) | inside bf16 weight products (model/precision.py), at least BLOCKED_MIN_SLOTS slots |
| padded | two batched matmuls over the rows padded to the busiest expert | no gradients on the CPU, while the padding stays small (`padding_pays`) |
| grouped_mm | torch's grouped kernel, one per projection, no host sync | CPU float32 outside autocast and compile tracing, dims multiples of 4 |

Elsewhere (CUDA, MPS, other dtypes, compile tracing) `routed_experts` says None and the layer runs its own
loop, the reference every path is tested against. `moe_layer_in_c` is a whole layer without balance
statistics in C (routing, products, combine; cached decoding on the CPU). The switches GROUPED_MM_ENABLED and
PADDED_ENABLED (dispatch.py names every switch) turn the torch paths off for tests and benchmarks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glm53_flash.model.ops.grouped import grouped_linear, grouped_matmul, grouped_serves
from glm53_flash.model.ops.moe_routing import (combine_rows_bf16, combine_rows_bf16_backward, combine_rows_serves,
                                               moe_combine, moe_dispatch, moe_serves, reference_combine_rows)
from glm53_flash.model.ops.swiglu import swiglu_activation, swiglu_rounded
from glm53_flash.model.precision import product_dtype

# A switch for tests and benchmarks: False leaves the grouped_mm path's calls to the layer's loop.
GROUPED_MM_ENABLED = hasattr(F, "grouped_mm")

# Few routed slots without gradients (cached decoding, small prefills) on the CPU: each expert's rows
# are padded to the busiest expert's count C and both projections run as one batched matmul each.
# With a handful of rows per expert, the grouped kernel's per-expert GEMMs run far below the memory
# bandwidth; the batched form reads each expert's weights at close to it. The padding costs E * C
# rows of work for the M routed slots, so the batched form is taken only while E * C stays small and
# close to M: it wins when the slots spread over the experts and loses when identical rows (one
# prompt's samples before they diverge) all pick the same experts (`glm53 bench decode-weights`).
# A switch for tests and benchmarks, like GROUPED_MM_ENABLED.
PADDED_MAX_ROWS = 512
PADDED_ENABLED = True
PRODUCT_BLOCK = 128  # the blocked path rounds each expert's row count up to a multiple of this
# Fewer routed slots (tokens x top_k) than this take the float32 paths even inside bf16 products: their
# padding to PRODUCT_BLOCK rows per expert and the weights' casts cost more than bf16 saves. Measured on
# the flash MoE layer (forward and backward, shared expert included, bf16 over float32): 0.5x at 96 slots,
# 0.9x at 512, 1.15x at 1024, 1.9x at 8192.
BLOCKED_MIN_SLOTS = 1024


# ------------------------------------------------------------------------------------------ the rule


def expert_path(x: torch.Tensor, counts: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                slots: int | None = None) -> tuple[str, int] | None:
    """The path that runs the routed experts on `slots` rows gathered from x [*, D] (None: x's own rows,
    already sorted by expert), counts [E] per expert, gate_up [E, 2H, D], down [E, H, D]: ("skinny",
    "blocked", "padded" or "grouped_mm", the padded path's rows per expert C, else 0), or None: the layer's
    own loop."""
    if grouped_serves(x, gate_up, down, slots=slots):
        return "skinny", 0
    if blocked_dtype(x, down, slots) is not None:
        return "blocked", 0
    rows = x.shape[0] if slots is None else slots
    capacity = int(counts.max()) if padded_usable(x, rows) else 0  # CPU: no device sync
    if capacity and padding_pays(gate_up.shape[0], capacity, rows):
        return "padded", capacity
    if grouped_mm_usable(x, gate_up, down):
        return "grouped_mm", 0
    return None


def grouped_mm_usable(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> bool:
    """Whether torch's grouped kernel serves: CPU float32 outside autocast, with 16-byte-aligned row
    strides (every dim a multiple of 4). On CUDA it wants bf16 on recent GPUs; the loop is the portable
    path there. Under CPU autocast the loop's F.linear would run in bf16 while the grouped kernel stays
    fp32, so the loop is taken there too, to keep the two paths equal. Under torch.compile the loop is
    taken as well: the grouped kernel's fake-tensor rule (what compile traces with) accepts only bf16."""
    aligned = gate_up.shape[2] % 4 == 0 and down.shape[1] % 4 == 0
    return (GROUPED_MM_ENABLED and aligned and x.device.type == "cpu" and x.dtype == torch.float32
            and gate_up.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
            and not torch.compiler.is_compiling())


def padded_usable(x: torch.Tensor, slots: int) -> bool:
    """Whether the batched form may serve `slots` routed slots of x (before their spread is known)."""
    return (PADDED_ENABLED and slots <= PADDED_MAX_ROWS and x.device.type == "cpu"
            and not torch.is_grad_enabled() and not torch.compiler.is_compiling())


def padding_pays(experts: int, capacity: int, slots: int) -> bool:
    """E * C padded rows against M slots: small in absolute terms and at most ~1.5x the slots."""
    padded = experts * capacity
    return padded <= PADDED_MAX_ROWS and 2 * padded <= 3 * slots + 8 * experts


def blocked_dtype(rows: torch.Tensor, down: torch.Tensor, slots: int | None = None) -> torch.dtype | None:
    """The product dtype the blocked path runs in for these rows, or None where it does not serve: it serves
    float32 CPU rows inside bf16 products (model/precision.py) with the grouped kernel present and 16-byte
    row strides in bf16 (dims multiples of 8), at least BLOCKED_MIN_SLOTS of them (`slots`: the routed
    slots the rows make, where the caller knows them; else one per row)."""
    dtype = product_dtype()
    slots = rows.shape[0] if slots is None else slots
    if (dtype is None or not GROUPED_MM_ENABLED or rows.dtype != torch.float32 or not rows.is_cpu
            or slots < BLOCKED_MIN_SLOTS or rows.shape[1] % 8 or down.shape[1] % 8):
        return None
    return dtype


# ------------------------------------------------------------------------------------ the entry points


def routed_experts(x: torch.Tensor, order: torch.Tensor, counts: torch.Tensor, gates: torch.Tensor,
                   gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor | None:
    """Tokens x [N, D] whose N k slots `order` sorts by expert (slot i belongs to token i // k), counts [E],
    gates [N, k] -> each token's gate-weighted sum of its experts [N, D], or None where the layer's loop
    runs (see the table above)."""
    n, dim = x.shape
    top_k = gates.shape[1]
    path = expert_path(x, counts, gate_up, down, slots=n * top_k)
    if path is None:
        return None
    if path[0] == "blocked":
        return routed_blocked(x, order, counts, gates, gate_up, down, product_dtype())
    expert_out = run_sorted(path, x.index_select(0, order // top_k), counts, gate_up, down)
    # Undo the sort: the slots are a permutation, so a plain scatter is deterministic.
    slot_out = torch.empty_like(expert_out).index_copy_(0, order, expert_out)
    return (slot_out.view(n, top_k, dim) * gates.unsqueeze(-1)).sum(1)


def sorted_experts(rows: torch.Tensor, counts: torch.Tensor, gate_up: torch.Tensor,
                   down: torch.Tensor) -> torch.Tensor | None:
    """rows [M, D] sorted by expert, counts [E] -> each row through its expert [M, D], or None where the
    layer's loop runs."""
    path = expert_path(rows, counts, gate_up, down)
    if path is None:
        return None
    if path[0] == "blocked":
        return run_blocked(rows, counts, gate_up, down, product_dtype())
    return run_sorted(path, rows, counts, gate_up, down)


def moe_layer_in_c(x: torch.Tensor, router: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_k: int,
                   shared) -> tuple[torch.Tensor, torch.Tensor, None] | None:
    """A MoE layer without balance statistics on x [N, D] by the C kernels, where moe_serves: routing, the
    sort by expert and the row copies in one call, each projection in one, the gate-weighted sum with the
    shared expert's output (`shared(x)`) in one; only the SwiGLU activations stay in torch. -> (output
    [N, D], routed slots per expert [E], None), as MixtureOfExperts.forward returns them; None elsewhere."""
    if not moe_serves(x, router, gate_up, down, top_k):
        return None
    rows, counts, offsets, position, gates = moe_dispatch(x, router, top_k)
    hidden = grouped_linear(rows, gate_up, offsets)
    expert_out = grouped_matmul(swiglu_activation(hidden), down, offsets)
    return moe_combine(expert_out, position, gates, shared(x)), counts, None


# ----------------------------------------------------------------------------------------- the paths


def run_sorted(path: tuple[str, int], rows: torch.Tensor, counts: torch.Tensor, gate_up: torch.Tensor,
               down: torch.Tensor) -> torch.Tensor:
    """rows [M, D] sorted by expert through their experts by `path` (expert_path's, not "blocked")."""
    name, capacity = path
    if name == "skinny":
        return run_skinny(rows, counts, gate_up, down)
    if name == "padded":
        return run_padded(rows, counts, gate_up, down, capacity)
    return run_grouped(rows, counts, gate_up, down)


def run_skinny(rows: torch.Tensor, counts: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """Each row through its expert by the skinny C kernels: one call per projection, each expert's weights
    read once, no padding. No gradients (see grouped_serves)."""
    offsets = counts.cumsum(0)
    hidden = grouped_linear(rows, gate_up, offsets)
    return grouped_matmul(swiglu_activation(hidden), down, offsets)


def run_grouped(rows: torch.Tensor, counts: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """Each row through its expert by torch's grouped kernel, no host sync. (Its backward needs a gradient
    with real strides; the layer always hands it one. A caller that back-propagates a broadcast gradient,
    e.g. from `.sum()`, should multiply by a ones tensor or call `.contiguous()` on it first.)"""
    offsets = counts.cumsum(0).to(torch.int32)
    hidden = F.grouped_mm(rows, gate_up.transpose(1, 2), offs=offsets)
    return F.grouped_mm(swiglu_activation(hidden), down, offs=offsets)


def run_padded(rows: torch.Tensor, counts: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
               capacity: int) -> torch.Tensor:
    """Each row through its expert as two batched matmuls over [E, C, D], C = `capacity` >= every count.
    Padding rows are zeros and are never read back. No gradients (see padded_usable)."""
    experts = gate_up.shape[0]
    m, dim = rows.shape
    starts = torch.arange(experts, device=rows.device) * capacity
    flat = padded_positions(counts, starts)
    padded = rows.new_zeros(experts * capacity, dim).index_copy_(0, flat, rows)
    hidden = torch.bmm(padded.view(experts, capacity, dim), gate_up.transpose(1, 2))
    out = torch.bmm(swiglu_activation(hidden), down)
    return out.view(experts * capacity, dim).index_select(0, flat)


def padded_positions(counts: torch.Tensor, padded_starts: torch.Tensor) -> torch.Tensor:
    """Where each of the M = counts.sum() rows sorted by expert lands when expert e's rows start at
    padded_starts[e] instead of right after the previous expert's: [M] row indices."""
    packed_starts = counts.cumsum(0) - counts
    rows = torch.arange(int(counts.sum()), device=counts.device)
    return (padded_starts - packed_starts).repeat_interleave(counts) + rows


def blocked_layout(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """counts [E] rows per expert -> (where each expert's block ends when its rows are padded to a multiple
    of PRODUCT_BLOCK [E], where each of the sorted rows lands [M])."""
    padded_counts = (counts + (PRODUCT_BLOCK - 1)) // PRODUCT_BLOCK * PRODUCT_BLOCK
    ends = padded_counts.cumsum(0)
    return ends, padded_positions(counts, ends - padded_counts)


def blocked_products(padded: torch.Tensor, ends: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                     dtype: torch.dtype) -> torch.Tensor:
    """The two grouped products with the SwiGLU between them on rows already padded per expert
    (expert e's block ends at ends[e]): [P, D] in `dtype` -> [P, D] in `dtype`."""
    offsets = ends.to(torch.int32)
    hidden = F.grouped_mm(padded, gate_up.to(dtype).transpose(1, 2), offs=offsets)
    return F.grouped_mm(swiglu_rounded(hidden), down.to(dtype), offs=offsets)


def run_blocked(rows: torch.Tensor, counts: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                dtype: torch.dtype) -> torch.Tensor:
    """Each row (sorted by expert) through its expert by the grouped kernel in `dtype` (bf16 products on the
    CPU), with every expert's rows padded to a multiple of PRODUCT_BLOCK. oneDNN compiles a bf16 kernel for
    every new matrix shape, so grouped products whose row counts follow the routing cost more than they
    save; rounded counts take a few dozen
    shapes, compiled once, and the padded buffer a few sizes, which the allocator reuses. Padding rows are
    zeros, give zeros through SwiGLU, are never read back, and so add nothing to any gradient. The layer
    takes routed_blocked (these products with its gathers and combine fused); this form serves rows already
    sorted and is routed_blocked's oracle in the tests."""
    dim = rows.shape[1]
    ends, flat = blocked_layout(counts)
    padded = rows.new_zeros(int(ends[-1]), dim, dtype=dtype).index_copy(0, flat, rows.to(dtype))
    return blocked_products(padded, ends, gate_up, down, dtype).index_select(0, flat).float()


def routed_blocked(x: torch.Tensor, order: torch.Tensor, counts: torch.Tensor, gates: torch.Tensor,
                   gate_up: torch.Tensor, down: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The routed experts' gate-weighted sum for tokens x [N, D] by run_blocked's products, with the sort,
    the padding and the unsort each one gather: every padded row reads its token's row (padding rows read
    an appended zero row), every slot reads its padded output row. It computes what run_blocked between
    the layer's gather and scatter computes (forward and the rows' gradients bit for bit; the gates'
    gradients are sums over D in another order), without the float32 [N k, D] copy of the sorted rows,
    the scatter back to token order and the zero fill; the combine is one C kernel each way
    (combine_rows) where it serves."""
    n, dim = x.shape
    top_k = gates.shape[1]
    ends, flat = blocked_layout(counts)
    source = torch.full((int(ends[-1]),), n, dtype=torch.long, device=x.device).index_copy_(
        0, flat, order // top_k)  # the token each padded row reads; n: the zero row
    padded = torch.cat((x, x.new_zeros(1, dim))).index_select(0, source).to(dtype)
    out = blocked_products(padded, ends, gate_up, down, dtype)
    slot_rows = torch.empty_like(flat).index_copy_(0, order, flat)  # each slot's padded row, token order
    return combine_rows(out, slot_rows, gates)


class _CombineRows(torch.autograd.Function):
    """combine_rows_bf16 as one differentiable op: bf16 expert rows out [P, D], the slots' rows [N k] and the
    gates [N, k] -> the gate-weighted sums [N, D] float32; the backward by its kernel (bf16 rows, gates)."""

    @staticmethod
    def forward(ctx, out, rows, gates):
        ctx.save_for_backward(out, rows, gates)
        return combine_rows_bf16(out, rows, gates)

    @staticmethod
    def backward(ctx, grad):
        out, rows, gates = ctx.saved_tensors
        grad_out, grad_gates = combine_rows_bf16_backward(out, rows, gates, grad)
        return grad_out, None, grad_gates


def combine_rows(out: torch.Tensor, rows: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
    """sum_j gates[t, j] * out[rows[t k + j]] as float32 [N, D]: the C kernel where it serves (bf16 rows on the
    CPU), else the gather, the widening and the weighted sum in torch (reference_combine_rows)."""
    if combine_rows_serves(out, gates):
        return _CombineRows.apply(out, rows, gates)
    return reference_combine_rows(out, rows, gates)



# The switches and thresholds stay out of __all__: set them here (ops.experts.X), where the code reads them.
__all__ = ["blocked_dtype", "blocked_layout", "combine_rows", "expert_path", "grouped_mm_usable", "moe_layer_in_c",
           "padded_positions", "padded_usable", "padding_pays", "routed_blocked", "routed_experts", "run_blocked",
           "run_grouped", "run_padded", "run_skinny", "run_sorted", "sorted_experts"]
