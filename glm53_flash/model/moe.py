"""Mixture of experts: a router, routed SwiGLU experts (top-k) and one always-on shared expert.

Mirrors GLM-5.3-Flash's MoE layers at small scale (8 routed experts top-2 + 1 shared instead of
288 top-8 + 1). Tokens are grouped by expert with one stable sort (the original looped over experts
with a host sync each). On CPU in float32, with a torch that has `torch.nn.functional.grouped_mm`,
every expert then runs in one grouped matrix multiply per projection with no host sync at all;
elsewhere the experts run in a loop over split chunks with one host sync per layer. Without gradients
and with few slots spread over the experts (cached decoding), the CPU pads each expert's rows to
the busiest one's and runs two batched matmuls instead (`run_padded`). Where the skinny C kernels
serve (model/ops/: no gradients, CPU, float32, a few hundred slots at most) they take the
experts instead, and in cached decoding the whole layer (`forward_skinny`). All equal
`dense_moe_reference`. The balance loss is the Switch-Transformer form E * sum_e f_e * P_e, whose
router probabilities P_e carry gradients; the original's hard-count metric (no gradient) stays
reachable for ablation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from glm53_flash.model import ops
from glm53_flash.model.ops import Linear
from glm53_flash.model.precision import mixed_linear, mixed_matmul, product_dtype, product_dtype_for


class _SwiGLUActivation(torch.autograd.Function):
    """silu(gate) * value for h = [gate | value] [N, 2H].

    Where the fused kernel serves (float32 on the CPU, ops.swiglu_serves) the forward and the
    backward each make one pass over memory and only h is saved: the backward recomputes the
    exponentials, which cost less than reading a saved [N, H] tensor back. Elsewhere, and as the
    kernel's test oracle, the eager formulation: the forward keeps silu(gate) so the backward need not
    recompute its exponentials, and the backward writes both halves of the gradient in place (no
    concatenation) with aten's fused silu_backward for the gate half: three elementwise passes where
    the plain autograd graph takes about nine."""

    @staticmethod
    def forward(ctx, h: torch.Tensor) -> torch.Tensor:
        ctx.fused = ops.swiglu_serves(h)
        if ctx.fused:
            ctx.save_for_backward(h)
            return ops.swiglu_forward(h)
        gate, value = h.chunk(2, dim=-1)
        activated = F.silu(gate)
        ctx.save_for_backward(h, activated)
        return activated * value

    @staticmethod
    @once_differentiable  # the out= writes below are not differentiable again: say so clearly
    def backward(ctx, grad_out: torch.Tensor) -> torch.Tensor:
        if ctx.fused:
            (h,) = ctx.saved_tensors
            return ops.swiglu_backward(h, grad_out.to(h.dtype))
        h, activated = ctx.saved_tensors
        gate, value = h.chunk(2, dim=-1)
        grad = torch.empty_like(h)
        grad_gate, grad_value = grad.chunk(2, dim=-1)
        # d/d gate = grad_out * value * silu'(gate); d/d value = grad_out * silu(gate)
        if h.device.type in ("cpu", "cuda"):  # kernels that write through the strided half directly
            torch.ops.aten.silu_backward.grad_input(grad_out * value, gate, grad_input=grad_gate)
        else:
            grad_gate.copy_(torch.ops.aten.silu_backward(grad_out * value, gate))
        torch.mul(activated, grad_out, out=grad_value)
        return grad


def swiglu_activation(h: torch.Tensor) -> torch.Tensor:
    if not torch.is_grad_enabled():  # inference: skip the autograd.Function's per-call overhead
        if ops.swiglu_serves(h):
            return ops.swiglu_forward(h)
        gate, value = h.chunk(2, dim=-1)
        return F.silu(gate) * value
    return _SwiGLUActivation.apply(h)


def swiglu_rounded(h: torch.Tensor) -> torch.Tensor:
    """The activation of a bf16 product's output h (bf16 weight products on the CPU, model/precision.py)
    as the next product's bf16 input: the fused kernel in bf16 where it serves, else float32 between two
    casts. Both round once, at the end: what the kernel computes equals the float32 kernel on the widened
    h rounded to bf16, bit for bit, and its backward hands the product's backward bf16 as a cast would."""
    if ops.swiglu_serves(h):
        return swiglu_activation(h)
    return swiglu_activation(h.float()).to(h.dtype)


def swiglu(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """SwiGLU with one routed expert's weights: gate_up [2H, D] (nn.Linear layout), down [H, D] (x @ W)."""
    return mixed_matmul(swiglu_activation(mixed_linear(x, gate_up)), down)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = Linear(dim, 2 * hidden)
        self.down = Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = product_dtype_for(x)
        if dtype is None:
            return self.down(swiglu_activation(self.up(x)))
        # bf16 products: the hidden activations stay bf16 from one product to the next (the same bits as
        # the two mixed_linear calls, which would widen them to float32 and round them back).
        hidden = F.linear(x.to(dtype), self.up.weight.to(dtype))
        return F.linear(swiglu_rounded(hidden), self.down.weight.to(dtype)).float()


class _CombineRows(torch.autograd.Function):
    """ops.combine_rows_bf16 as one differentiable op: bf16 expert rows out [P, D], the slots' rows [N k] and
    the gates [N, k] -> the gate-weighted sums [N, D] float32; the backward by its kernel (bf16 rows, gates)."""

    @staticmethod
    def forward(ctx, out, rows, gates):
        ctx.save_for_backward(out, rows, gates)
        return ops.combine_rows_bf16(out, rows, gates)

    @staticmethod
    def backward(ctx, grad):
        out, rows, gates = ctx.saved_tensors
        grad_out, grad_gates = ops.combine_rows_bf16_backward(out, rows, gates, grad)
        return grad_out, None, grad_gates


def combine_rows(out: torch.Tensor, rows: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
    """sum_j gates[t, j] * out[rows[t k + j]] as float32 [N, D]: the C kernel where it serves (bf16 rows on the
    CPU), else the gather, the widening and the weighted sum in torch (ops.reference_combine_rows)."""
    if ops.combine_rows_serves(out, gates):
        return _CombineRows.apply(out, rows, gates)
    return ops.reference_combine_rows(out, rows, gates)


def grouped_mm_usable(x: torch.Tensor, weight: torch.Tensor, aligned: bool) -> bool:
    """Whether the grouped kernel serves this call: CPU float32 outside autocast, with 16-byte-aligned
    row strides (`aligned`: every dim a multiple of 4, fixed when the layer is built). On CUDA it
    wants bf16 on recent GPUs; the chunk loop is the portable path there. Under CPU autocast the
    loop's F.linear would run in bf16 while the grouped kernel stays fp32, so the loop is taken there
    too, to keep the two paths equal. Under torch.compile the loop is taken as well: the grouped
    kernel's fake-tensor rule (what compile traces with) accepts only bf16, so tracing it fails."""
    return (GROUPED_MM_ENABLED and aligned and x.device.type == "cpu" and x.dtype == torch.float32
            and weight.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
            and not torch.compiler.is_compiling())


# A switch for tests and benchmarks: False forces the portable chunk loop everywhere.
GROUPED_MM_ENABLED = hasattr(F, "grouped_mm")

# Few routed slots without gradients (cached decoding, small prefills) on the CPU: each expert's rows
# are padded to the busiest expert's count C and both projections run as one batched matmul each.
# With a handful of rows per expert, the grouped kernel's per-expert GEMMs run far below the memory
# bandwidth; the batched form reads each expert's weights at close to it. The padding costs E * C
# rows of work for the M routed slots, so the batched form is taken only while E * C stays small and
# close to M (measured on the flash shapes, 2 cores: 1.3-3x faster with the slots spread over the
# experts, up to 5x slower when identical rows, e.g. one prompt's samples before they diverge, all
# pick the same two experts). A switch for tests and benchmarks, like GROUPED_MM_ENABLED.
PADDED_MAX_ROWS = 512
PRODUCT_BLOCK = 128  # run_blocked rounds each expert's row count up to a multiple of this
# Fewer routed slots (tokens x top_k) than this take the float32 paths even inside bf16 products: their
# padding to PRODUCT_BLOCK rows per expert and the weights' casts cost more than bf16 saves. Measured on
# the flash MoE layer (forward and backward, shared expert included, bf16 over float32): 0.5x at 96 slots,
# 0.9x at 512, 1.15x at 1024, 1.9x at 8192.
BLOCKED_MIN_SLOTS = 1024
PADDED_ENABLED = True


def padded_usable(x: torch.Tensor, slots: int) -> bool:
    """Whether the batched form may serve `slots` routed slots of x (before their spread is known)."""
    return (PADDED_ENABLED and slots <= PADDED_MAX_ROWS and x.device.type == "cpu"
            and not torch.is_grad_enabled() and not torch.compiler.is_compiling())


def padding_pays(experts: int, capacity: int, slots: int) -> bool:
    """E * C padded rows against M slots: small in absolute terms and at most ~1.5x the slots."""
    padded = experts * capacity
    return padded <= PADDED_MAX_ROWS and 2 * padded <= 3 * slots + 8 * experts


def padded_positions(counts: torch.Tensor, padded_starts: torch.Tensor) -> torch.Tensor:
    """Where each of the M = counts.sum() rows sorted by expert lands when expert e's rows start at
    padded_starts[e] instead of right after the previous expert's: [M] row indices."""
    packed_starts = counts.cumsum(0) - counts
    rows = torch.arange(int(counts.sum()), device=counts.device)
    return (padded_starts - packed_starts).repeat_interleave(counts) + rows


def blocked_usable(rows: torch.Tensor, moe: "MixtureOfExperts", slots: int | None = None) -> torch.dtype | None:
    """The product dtype `run_blocked` runs in for these rows, or None where it does not serve: it serves
    float32 CPU rows inside bf16 products (model/precision.py) with the grouped kernel present and
    16-byte row strides in bf16 (dims multiples of 8), at least BLOCKED_MIN_SLOTS of them (`slots`: the
    routed slots the rows make, where the caller knows them; else one per row)."""
    dtype = product_dtype()
    slots = rows.shape[0] if slots is None else slots
    if (dtype is None or not GROUPED_MM_ENABLED or rows.dtype != torch.float32 or not rows.is_cpu
            or slots < BLOCKED_MIN_SLOTS or rows.shape[1] % 8 or moe.expert_down.shape[1] % 8):
        return None
    return dtype


def blocked_layout(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """counts [E] rows per expert -> (where each expert's block ends when its rows are padded to a multiple
    of PRODUCT_BLOCK [E], where each of the sorted rows lands [M])."""
    padded_counts = (counts + (PRODUCT_BLOCK - 1)) // PRODUCT_BLOCK * PRODUCT_BLOCK
    ends = padded_counts.cumsum(0)
    return ends, padded_positions(counts, ends - padded_counts)


def route_tokens(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k experts per token and gate weights: softmax over the chosen k logits only."""
    top_logits, top_index = router_logits.topk(top_k, dim=-1)
    gates = torch.softmax(top_logits.float(), dim=-1).to(router_logits.dtype)
    return gates, top_index


class MixtureOfExperts(nn.Module):
    def __init__(self, dim: int, hidden: int, experts: int, top_k: int, init_std: float = 0.02) -> None:
        super().__init__()
        self.experts = experts
        self.top_k = top_k
        self.router = Linear(dim, experts)
        # Routed experts stored stacked: expert_gate_up [E, 2H, D] in nn.Linear's (out, in) layout and
        # expert_down [E, H, D] in x @ W layout. Measured with a few rows per expert (decoding), these
        # two layouts run the grouped GEMMs fastest (the up projection ~1.4x faster than in x @ W
        # layout, the down projection ~1.3x faster than in (out, in)); training speed is the same.
        # The up draws are made in the x @ W shape and transposed, so a seed gives the same model as
        # before the layout change.
        self.expert_gate_up = nn.Parameter(
            torch.empty(experts, dim, 2 * hidden).normal_(0.0, init_std).transpose(1, 2).contiguous())
        self.expert_down = nn.Parameter(torch.empty(experts, hidden, dim).normal_(0.0, init_std))
        self.shared = SwiGLU(dim, hidden)
        self.grouped_aligned = dim % 4 == 0 and hidden % 4 == 0  # grouped_mm's 16-byte stride rule

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Checkpoints written before the layout change hold expert_up [E, D, 2H].
        old, new = prefix + "expert_up", prefix + "expert_gate_up"
        if old in state_dict and new not in state_dict:
            state_dict[new] = state_dict.pop(old).transpose(1, 2).contiguous()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def routed_parameter_count(self) -> int:
        return self.expert_gate_up.numel() + self.expert_down.numel()

    def run_expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, self.expert_gate_up[e], self.expert_down[e])

    def run_sorted(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """rows [M, D] sorted by expert, counts [E] rows per expert -> each row through its expert.

        (The grouped kernel's backward needs a gradient with real strides; inside `forward` it always
        gets one. A caller that back-propagates a broadcast gradient, e.g. from `.sum()`, should
        multiply by a ones tensor or call `.contiguous()` on it first.)"""
        if grouped_mm_usable(rows, self.expert_gate_up, self.grouped_aligned):
            offsets = counts.cumsum(0).to(torch.int32)
            hidden = F.grouped_mm(rows, self.expert_gate_up.transpose(1, 2), offs=offsets)
            return F.grouped_mm(swiglu_activation(hidden), self.expert_down, offs=offsets)
        # split/unbind (rather than slicing in a loop) keep the backward to one cat/stack each.
        sizes = counts.tolist()  # the layer's single host sync
        ups, downs = self.expert_gate_up.unbind(0), self.expert_down.unbind(0)
        # Idle experts still run on their empty chunk: every parameter stays in the graph (with a
        # zero gradient), which data-parallel training needs.
        return torch.cat([swiglu(chunk, ups[e], downs[e]) for e, chunk in enumerate(torch.split(rows, sizes))])

    def run_padded(self, rows: torch.Tensor, counts: torch.Tensor, capacity: int) -> torch.Tensor:
        """rows [M, D] sorted by expert, counts [E] rows per expert -> each row through its expert, as
        two batched matmuls over [E, C, D], C = `capacity` >= every count. Padding rows are zeros and
        are never read back. No gradients (see padded_usable)."""
        m, dim = rows.shape
        experts = torch.arange(self.experts, device=rows.device)
        flat = padded_positions(counts, experts * capacity)
        padded = rows.new_zeros(self.experts * capacity, dim).index_copy_(0, flat, rows)
        hidden = torch.bmm(padded.view(self.experts, capacity, dim), self.expert_gate_up.transpose(1, 2))
        out = torch.bmm(swiglu_activation(hidden), self.expert_down)
        return out.view(self.experts * capacity, dim).index_select(0, flat)

    def run_blocked(self, rows: torch.Tensor, counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """rows [M, D] sorted by expert, counts [E] -> each row through its expert by the grouped kernel in
        `dtype` (bf16 products on the CPU, model/precision.py), with every expert's rows padded to a
        multiple of PRODUCT_BLOCK. oneDNN compiles a bf16 kernel for every new matrix shape (1-2 ms
        each, measured), so grouped products whose row counts follow the routing cost more than they save
        (measured: a flash step slower than float32); rounded counts take a few dozen shapes, compiled
        once, and the padded buffer a few sizes, which the allocator reuses. Padding rows are zeros, give
        zeros through SwiGLU, are never read back, and so add nothing to any gradient. The layer's forward
        takes routed_blocked (these products with its gathers and combine fused); this form serves
        run_experts on rows already sorted and is routed_blocked's oracle in the tests."""
        dim = rows.shape[1]
        ends, flat = blocked_layout(counts)
        padded = rows.new_zeros(int(ends[-1]), dim, dtype=dtype).index_copy(0, flat, rows.to(dtype))
        return self.blocked_products(padded, ends, dtype).index_select(0, flat).float()

    def blocked_products(self, padded: torch.Tensor, ends: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The two grouped products with the SwiGLU between them on rows already padded per expert
        (expert e's block ends at ends[e]): [P, D] in `dtype` -> [P, D] in `dtype`."""
        offsets = ends.to(torch.int32)
        hidden = F.grouped_mm(padded, self.expert_gate_up.to(dtype).transpose(1, 2), offs=offsets)
        return F.grouped_mm(swiglu_rounded(hidden), self.expert_down.to(dtype), offs=offsets)

    def routed_blocked(self, x: torch.Tensor, order: torch.Tensor, counts: torch.Tensor, gates: torch.Tensor,
                       dtype: torch.dtype) -> torch.Tensor:
        """The routed experts' gate-weighted sum for tokens x [N, D] by run_blocked's products, with the
        sort, the padding and the unsort each one gather: every padded row reads its token's row (padding
        rows read an appended zero row), every slot reads its padded output row. It computes what
        run_blocked between forward's gather and scatter computes (forward and the rows' gradients bit for
        bit; the gates' gradients are sums over D in another order), without the float32 [N k, D] copy of
        the sorted rows, the scatter back to token order and the zero fill; the combine is one C kernel
        each way (combine_rows) where it serves."""
        n, dim = x.shape
        ends, flat = blocked_layout(counts)
        source = torch.full((int(ends[-1]),), n, dtype=torch.long, device=x.device).index_copy_(
            0, flat, order // self.top_k)  # the token each padded row reads; n: the zero row
        padded = torch.cat((x, x.new_zeros(1, dim))).index_select(0, source).to(dtype)
        out = self.blocked_products(padded, ends, dtype)
        slot_rows = torch.empty_like(flat).index_copy_(0, order, flat)  # each slot's padded row, token order
        return combine_rows(out, slot_rows, gates)

    def run_skinny(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """rows [M, D] sorted by expert, counts [E] -> each row through its expert, by the skinny C
        kernels (model/ops/): one call per projection, each expert's weights read once, no
        padding. No gradients (see ops.grouped_serves)."""
        offsets = counts.cumsum(0)
        hidden = ops.grouped_linear(rows, self.expert_gate_up, offsets)
        return ops.grouped_matmul(swiglu_activation(hidden), self.expert_down, offsets)

    def run_experts(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """rows [M, D] sorted by expert, counts [E] -> each row through its expert: by the skinny C
        kernels where they serve (few slots, no gradients, CPU, float32), else by the padded batched
        matmuls where they pay (few slots spread over the experts), else by the grouped kernel or the
        chunk loop (run_sorted)."""
        slots = rows.shape[0]
        if ops.grouped_serves(rows, self.expert_gate_up, self.expert_down):
            return self.run_skinny(rows, counts)
        dtype = blocked_usable(rows, self)
        if dtype is not None:
            return self.run_blocked(rows, counts, dtype)
        capacity = int(counts.max()) if padded_usable(rows, slots) else 0  # CPU: no device sync
        if capacity and padding_pays(self.experts, capacity, slots):
            return self.run_padded(rows, counts, capacity)
        return self.run_sorted(rows, counts)

    def forward(self, x: torch.Tensor, token_mask: torch.Tensor | None = None, with_balance: bool = True,
                balance_reduce=None):
        """x [N, D] -> (output [N, D], per-expert slot counts [E], balance loss scalar or None).

        `token_mask` [N] (bool) excludes tokens (padding) from the balance statistics only;
        `with_balance=False` skips the statistics altogether (cached decoding needs none);
        `balance_reduce` sums count tensors across data-parallel ranks (see balance_loss).
        """
        n, dim = x.shape
        if not with_balance and ops.moe_serves(x, self.router.weight, self.expert_gate_up, self.expert_down,
                                                   self.top_k):
            return self.forward_skinny(x)
        logits = self.router(x)
        gates, top_index = route_tokens(logits, self.top_k)
        flat_expert = top_index.reshape(-1)  # [N * k], slot i belongs to token i // k
        order = torch.argsort(flat_expert, stable=True)
        counts = torch.bincount(flat_expert, minlength=self.experts)
        slots = n * self.top_k  # run_experts' choice, made before the gather: the skinny kernels, else ...
        dtype = (None if ops.grouped_serves(x, self.expert_gate_up, self.expert_down, slots=slots)
                 else blocked_usable(x, self, slots=slots))
        if dtype is not None:
            routed = self.routed_blocked(x, order, counts, gates, dtype)
        else:
            expert_out = self.run_experts(x.index_select(0, order // self.top_k), counts)
            # Undo the sort: the slots are a permutation, so a plain scatter is deterministic.
            slot_out = torch.empty_like(expert_out).index_copy_(0, order, expert_out)
            routed = (slot_out.view(n, self.top_k, dim) * gates.unsqueeze(-1)).sum(1)
        if not with_balance:
            return self.shared(x) + routed, counts, None
        if token_mask is None:
            mask = torch.ones(n, 1, dtype=torch.float32, device=x.device)
        else:
            mask = token_mask.reshape(-1, 1).to(torch.float32)
        used = torch.bincount(flat_expert, weights=mask.repeat_interleave(self.top_k),
                              minlength=self.experts).to(torch.float32)
        balance = self.balance_loss(logits, used, mask, balance_reduce)
        return self.shared(x) + routed, used.detach(), balance

    def forward_skinny(self, x: torch.Tensor):
        """forward(x, with_balance=False) by the C kernels (cached decoding on the CPU): routing, the
        sort by expert and the row copies in one call, each projection in one, the gate-weighted sum
        with the shared expert's output in one; only the SwiGLU activations stay in torch."""
        rows, counts, offsets, position, gates = ops.moe_dispatch(x, self.router.weight, self.top_k)
        hidden = ops.grouped_linear(rows, self.expert_gate_up, offsets)
        expert_out = ops.grouped_matmul(swiglu_activation(hidden), self.expert_down, offsets)
        return ops.moe_combine(expert_out, position, gates, self.shared(x)), counts, None

    def balance_loss(self, logits: torch.Tensor, used: torch.Tensor, mask: torch.Tensor, reduce=None):
        """E * sum_e f_e * P_e: f_e = share of routed slots (no gradient), P_e = mean router probability.

        f is fixed, so the loss is a sum over tokens divided by the token count. Under data parallelism
        `reduce` sums the counts over ranks: each rank then holds its exact share of the global loss.
        """
        probs = torch.softmax(logits.float(), dim=-1)
        totals = torch.cat((used, mask.sum().reshape(1)))
        if reduce is not None:
            totals = reduce(totals)
        used_all, tokens_all = totals[:-1], totals[-1].clamp_min(1.0)
        fraction = used_all / used_all.sum().clamp_min(1.0)
        prob_sum = (probs * mask).sum(0)
        return self.experts * (fraction.detach() * prob_sum).sum() / tokens_all


def dense_moe_reference(moe: MixtureOfExperts, x: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, masked by the gates: the plain oracle for the sorted dispatch."""
    gates, top_index = route_tokens(moe.router(x), moe.top_k)
    out = moe.shared(x)
    for e in range(moe.experts):
        weight = (gates * (top_index == e)).sum(-1, keepdim=True)
        out = out + weight * moe.run_expert(e, x)
    return out


def original_balance_metric(usage_by_layer: torch.Tensor) -> torch.Tensor:
    """The original's balance term: E * mean_e((mean-over-layers usage_e - 1/E)^2); no gradient."""
    experts = usage_by_layer.shape[-1]
    mean_usage = usage_by_layer.mean(0)
    return experts * ((mean_usage - 1.0 / experts) ** 2).mean()


__all__ = ["MixtureOfExperts", "SwiGLU", "blocked_usable", "dense_moe_reference", "grouped_mm_usable",
           "original_balance_metric", "padded_positions", "padded_usable", "padding_pays", "route_tokens"]
