"""Feature-map linear attention's fast paths, in C and in torch, each beside its plain reference.

- `linear_attention_layer`: a layer's C paths on its qkv product, linear_attention.py's entry point: one
  decode step on the cached state (`linear_attention_step`: kv, z updated in place; where
  `linear_attention_serves`: at most MAX_GROUPED_ROWS rows), or a whole sequence longer than the layer's
  chunk, from no state, forward and backward (`linear_attention_scan_forward` / `_backward` as one autograd
  op: the recurrence position by position with each head's state in L1; where `scan_serves_call`). Both take
  the qkv product's output, apply the feature map themselves and rotate q and k first when given the rotary
  tables (the original's order). Heads of at most LIMITS["head_dim"] floats, a multiple of 8.
- `feature_map`: phi(u) = ELU(u) + 1 with a hand-written backward: its derivative is min(phi, 1), so it saves
  phi and the backward needs no exponentials.
- `masked_block`: the causal quadratic form inside a block of positions, its two products in bf16 where
  `block_dtype` says the batch repays the casts (inside bf16 weight products, model/precision.py).
References: `reference_linear_attention_step`, `reference_linear_attention_scan`, `reference_feature_map`; the
layer's own chunked form and recurrence (linear_attention.py) for the layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glm53_flash.model.ops import library
from glm53_flash.model.precision import product_dtype_for

# False: sequences longer than the chunk take the torch chunks even where the C scan serves (a switch for
# tests and benchmarks, named in model/ops/dispatch.py and recorded in receipts).
SCAN_ENABLED = True


def linear_attention_serves(qkv: torch.Tensor, kv: torch.Tensor, z: torch.Tensor, head_dim: int) -> bool:
    """Whether `linear_attention_step` serves one decode step: qkv [B, 1, 3D], the state [B, H, d, d]."""
    return (library.serves(qkv, kv, qkv.shape[0], library.MAX_GROUPED_ROWS) and library.head_dim_serves(head_dim)
            and qkv.is_contiguous() and z.is_contiguous() and z.dtype == torch.float32)

def linear_attention_step(qkv: torch.Tensor, kv: torch.Tensor, z: torch.Tensor, cos: torch.Tensor | None,
                          sin: torch.Tensor | None, floor: float) -> torch.Tensor:
    """One token of feature-map linear attention on the cached state (kv [B, H, d, d], z [B, H, d],
    updated in place): qkv [B, 1, 3D] -> out [B, 1, D]; cos/sin [d] rotate q and k first when given."""
    op = "linear_attention_step"
    if not (isinstance(z, torch.Tensor) and z.dim() == 3):
        library.fail(op, "z must be [B, H, d]")
    batch, heads, d = z.shape
    if not (d <= library.LIMITS["head_dim"]):
        library.fail(op, f"head size {d}; the kernel holds at most {library.LIMITS['head_dim']}")
    library.check_vector_size(op, "the head size", d)
    library.check_tensor(op, "z", z)
    library.check_tensor(op, "kv", kv, (batch, heads, d, d))
    library.check_tensor(op, "qkv", qkv, (batch, 1, 3 * heads * d))
    if not ((cos is None) == (sin is None)):
        library.fail(op, "cos and sin come together or not at all")
    if cos is not None:
        library.check_tensor(op, "cos", cos, (d,))
        library.check_tensor(op, "sin", sin, (d,))
    out = torch.empty(batch, 1, heads * d, dtype=qkv.dtype)
    rotate = cos is not None
    library.call(op, qkv.data_ptr(), kv.data_ptr(), z.data_ptr(), out.data_ptr(), batch, heads, d,
          cos.data_ptr() if rotate else None, sin.data_ptr() if rotate else None, floor)
    return out

def reference_feature_map(u: torch.Tensor) -> torch.Tensor:
    return F.elu(u) + 1.0

def reference_linear_attention_step(qkv, kv, z, cos, sin, floor):
    """-> (out [B, 1, D], the new kv, the new z)."""
    batch, heads, d = z.shape
    q, k, v = qkv.view(batch, 3, heads, d).unbind(1)
    if cos is not None:
        q, k = library.rotate_pairs(q, cos, sin), library.rotate_pairs(k, cos, sin)
    pq, pk = reference_feature_map(q), reference_feature_map(k)
    kv = kv + pk.unsqueeze(-1) * v.unsqueeze(-2)
    z = z + pk
    numerator = (pq.unsqueeze(-1) * kv).sum(-2)
    denominator = (pq * z).sum(-1, keepdim=True).clamp_min(floor)
    return (numerator / denominator).reshape(batch, 1, heads * d), kv, z


def linear_attention_scan_serves(qkv: torch.Tensor, head_dim: int) -> bool:
    """Whether the sequence kernels serve qkv [B, T, 3D] (float32 on the CPU, outside autocast and compile,
    heads the C code holds); gradients on or off (the backward is `linear_attention_scan_backward`)."""
    return (library.ENABLED and qkv.is_cpu and qkv.dtype == torch.float32 and qkv.dim() == 3 and qkv.numel() > 0
            and library.head_dim_serves(head_dim) and library.path_open())

def _check_scan(op: str, qkv: torch.Tensor, heads: int, cos, sin) -> tuple[int, int, int]:
    if not (isinstance(qkv, torch.Tensor) and qkv.dim() == 3):
        library.fail(op, "qkv must be [B, T, 3 * H * d]")
    batch, steps, width = qkv.shape
    if not (isinstance(heads, int) and heads >= 1 and width % (3 * heads) == 0):
        library.fail(op, f"qkv's last size {width} must be 3 x heads ({heads}) x the head size")
    d = width // (3 * heads)
    if not (d <= library.LIMITS["head_dim"]):
        library.fail(op, f"head size {d}; the kernel holds at most {library.LIMITS['head_dim']}")
    library.check_vector_size(op, "the head size", d)
    library.check_tensor(op, "qkv", qkv)
    if not ((cos is None) == (sin is None)):
        library.fail(op, "cos and sin come together or not at all")
    if cos is not None:
        library.check_tensor(op, "cos", cos, (steps, d))
        library.check_tensor(op, "sin", sin, (steps, d))
    return batch, steps, d

def scan_row(d: int) -> int:
    """The scan's padded head row (kernels.c's scan rows: whole vectors of up to 16 floats)."""
    return -(-d // 16) * 16

def _tables(cos, sin):
    return (cos.data_ptr(), sin.data_ptr()) if cos is not None else (None, None)

def linear_attention_scan_forward(qkv: torch.Tensor, heads: int, cos: torch.Tensor | None, sin: torch.Tensor | None,
                                  floor: float) -> tuple[torch.Tensor, ...]:
    """qkv [B, T, 3D] -> (out [B, T, D], den [B, H, T] (phi(q) . z before the floor), the final state kv
    [B, H, d, d] and z [B, H, d]); cos/sin [T, d] rotate q and k first when given."""
    op = "linear_attention_scan_forward"
    batch, steps, d = _check_scan(op, qkv, heads, cos, sin)
    out = torch.empty(batch, steps, heads * d)
    den = torch.empty(batch, heads, steps)
    kv = torch.empty(batch, heads, d, d)
    z = torch.empty(batch, heads, d)
    work = torch.empty(batch, heads, d + 1, scan_row(d))
    library.call(op, qkv.data_ptr(), out.data_ptr(), den.data_ptr(), kv.data_ptr(), z.data_ptr(), work.data_ptr(),
                 batch, steps, heads, d, *_tables(cos, sin), floor)
    return out, den, kv, z

def linear_attention_scan_backward(qkv: torch.Tensor, out: torch.Tensor, den: torch.Tensor, grad_out: torch.Tensor,
                                   heads: int, cos: torch.Tensor | None, sin: torch.Tensor | None,
                                   floor: float) -> torch.Tensor:
    """The gradient with respect to qkv [B, T, 3D] of linear_attention_scan_forward's out, given grad_out
    [B, T, D] and the forward's out and den."""
    op = "linear_attention_scan_backward"
    grad_out = grad_out.contiguous() if isinstance(grad_out, torch.Tensor) else grad_out  # held: read below
    batch, steps, d = _check_scan(op, qkv, heads, cos, sin)
    library.check_tensor(op, "out", out, (batch, steps, heads * d))
    library.check_tensor(op, "den", den, (batch, heads, steps))
    library.check_tensor(op, "grad_out", grad_out, (batch, steps, heads * d))
    grad = torch.empty_like(qkv)
    state = torch.empty(batch, heads, d + 1, scan_row(d))
    scratch = torch.empty(batch, heads, steps, scan_row(d) + 1)
    library.call(op, qkv.data_ptr(), out.data_ptr(), den.data_ptr(), grad_out.data_ptr(), grad.data_ptr(),
                 state.data_ptr(), scratch.data_ptr(), batch, steps, heads, d, *_tables(cos, sin), floor)
    return grad

def reference_linear_attention_scan(qkv, heads, cos, sin, floor):
    """The recurrence in plain torch: -> (out [B, T, D], den [B, H, T], kv [B, H, d, d], z [B, H, d])."""
    batch, steps, width = qkv.shape
    d = width // (3 * heads)
    q, k, v = qkv.view(batch, steps, 3, heads, d).permute(2, 0, 3, 1, 4)
    if cos is not None:
        q, k = library.rotate_pairs(q, cos, sin), library.rotate_pairs(k, cos, sin)
    pq, pk = reference_feature_map(q), reference_feature_map(k)
    kv = qkv.new_zeros(batch, heads, d, d)
    z = qkv.new_zeros(batch, heads, d)
    outs, dens = [], []
    for t in range(steps):
        kv = kv + pk[:, :, t, :, None] * v[:, :, t, None, :]
        z = z + pk[:, :, t]
        den = (pq[:, :, t] * z).sum(-1)
        outs.append((pq[:, :, t, :, None] * kv).sum(-2) / den.clamp_min(floor)[..., None])
        dens.append(den)
    out = torch.stack(outs, dim=2).transpose(1, 2).reshape(batch, steps, heads * d)
    return out, torch.stack(dens, dim=-1), kv, z


class _FeatureMap(torch.autograd.Function):
    """phi(u) = ELU(u) + 1, whose derivative is min(phi(u), 1): 1 where u > 0 (phi = u + 1 > 1),
    exp(u) = phi(u) where u <= 0. Saving phi instead of u makes the backward two cheap passes
    instead of ELU's exp-based backward, and the forward adds 1 in place."""

    @staticmethod
    def forward(ctx, u: torch.Tensor) -> torch.Tensor:
        phi = F.elu(u).add_(1.0)
        ctx.save_for_backward(phi)
        return phi

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> torch.Tensor:
        (phi,) = ctx.saved_tensors
        return grad_out * phi.clamp(max=1.0)


def feature_map(u: torch.Tensor) -> torch.Tensor:
    """phi(u) = ELU(u) + 1, differentiable."""
    if not torch.is_grad_enabled() or not u.requires_grad:
        return F.elu(u).add_(1.0)
    return _FeatureMap.apply(u)


def block_dtype(q: torch.Tensor) -> torch.dtype | None:
    """The dtype of the masked blocks' two products for feature-mapped q [B, H, T, d] inside compute_in:
    bf16 where the weight products take it and the batch holds at least BF16_MIN_ROWS positions (B x T,
    the rows of the layer's weight products: below it the casts cost more than bf16 saves), None: float32."""
    return product_dtype_for(q, rows=q.shape[0] * q.shape[2])


def masked_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype | None):
    """The causal quadratic form inside one block of positions: q, k, v [..., C, d] -> (sum_{s<=t} (q_t . k_s)
    v_s [..., C, d], sum_{s<=t} q_t . k_s [..., C]), both float32. With `dtype` (bf16) the two products run
    in it (accumulating in float32 inside, each result rounded once) and the denominator sums the rounded
    scores the same way (a float32 sum rounded once: widening the [C, C] scores to sum them cost the block
    a tenth of its time); None: float32 throughout, the committed results' arithmetic."""
    if dtype is None:
        # tril_ in place: the matmul's backward needs q and k, not the scores.
        scores = torch.matmul(q, k.transpose(-1, -2)).tril_()
        return torch.matmul(scores, v), scores.sum(-1)
    scores = torch.matmul(q.to(dtype), k.to(dtype).transpose(-1, -2)).tril_()
    return torch.matmul(scores, v.to(dtype)).float(), scores.sum(-1).float()


class _LinearAttentionScan(torch.autograd.Function):
    """The C sequence kernels (linear_attention_scan_forward / _backward) as one differentiable op: qkv
    [B, T, 3D] -> out [B, T, D], the feature map and the optional rotation inside; saves qkv, out and each
    position's denominator, and recomputes the states in the backward."""

    @staticmethod
    def forward(ctx, qkv, heads, cos, sin, floor):
        out, den, _, _ = linear_attention_scan_forward(qkv, heads, cos, sin, floor)
        ctx.save_for_backward(qkv, out, den)
        ctx.heads, ctx.tables, ctx.floor = heads, (cos, sin), floor
        return out

    @staticmethod
    def backward(ctx, grad_out):
        qkv, out, den = ctx.saved_tensors
        cos, sin = ctx.tables
        grad = linear_attention_scan_backward(qkv, out, den, grad_out, ctx.heads, cos, sin, ctx.floor)
        return grad, None, None, None, None


def scan_linear_attention(qkv: torch.Tensor, heads: int, cos: torch.Tensor | None, sin: torch.Tensor | None,
                          return_state: bool, floor: float) -> tuple[torch.Tensor, tuple | None]:
    """A whole sequence from no state by the C kernels (where linear_attention_scan_serves): qkv [B, T, 3D]
    -> (out [B, T, D] before the output product, the final state (kv, z) when asked). The state carries no
    gradient, so a caller that trains through it (a prefill whose state later positions read) takes the
    torch form instead: see scan_serves_call."""
    qkv = qkv.contiguous()
    if return_state:
        if torch.is_grad_enabled() and qkv.requires_grad:
            raise ValueError("scan_linear_attention: the returned state carries no gradient; "
                             "train through a state with causal_linear_attention")
        out, _, kv, z = linear_attention_scan_forward(qkv, heads, cos, sin, floor)
        return out, (kv, z)
    if not (torch.is_grad_enabled() and qkv.requires_grad):
        return linear_attention_scan_forward(qkv, heads, cos, sin, floor)[0], None
    return _LinearAttentionScan.apply(qkv, heads, cos, sin, floor), None


def scan_serves_call(qkv: torch.Tensor, head_dim: int, t: int, chunk: int, state, return_state: bool) -> bool:
    """Whether a layer call goes to the C sequence kernels: a sequence the torch form would chunk, from
    no state, on a tensor the kernels serve, and not a prefill that trains through the state it returns
    (RL's shared-prompt update: its completions' gradient reaches the prompt's keys and values through
    that state, which the kernels do not differentiate)."""
    trains_through_state = return_state and torch.is_grad_enabled() and qkv.requires_grad
    return (t > chunk and state is None and SCAN_ENABLED and not trains_through_state
            and linear_attention_scan_serves(qkv, head_dim))


def linear_attention_layer(qkv: torch.Tensor, heads: int, chunk: int, tables: tuple | None, position: int,
                           state: tuple | None, return_state: bool, floor: float):
    """A linear-attention layer's call on its qkv product [B, T, 3D] by the C kernels where they serve:
    `tables` the rotary cos and sin [P, d] when the layer rotates q and k first (else None), `state` its
    cached (kv, z) or None. -> (out [B, T, D] before the output product, in qkv's dtype (float32: the
    kernels serve nothing else), the state (kv, z) after it or None), or None: the layer's torch form. One decode step updates the state in place; a sequence longer than
    `chunk` takes the scan (sequences of at most `chunk` positions keep the layer's one quadratic block,
    whose arithmetic the committed results used)."""
    t = qkv.shape[1]
    head_dim = qkv.shape[-1] // (3 * heads)
    if t == 1 and state is not None and return_state and linear_attention_serves(qkv, *state, head_dim):
        cos, sin = (tables[0][position], tables[1][position]) if tables is not None else (None, None)
        return linear_attention_step(qkv, *state, cos, sin, floor), state
    if scan_serves_call(qkv, head_dim, t, chunk, state, return_state):
        cos, sin = ((tables[0][position : position + t].contiguous(), tables[1][position : position + t].contiguous())
                    if tables is not None else (None, None))
        return scan_linear_attention(qkv, heads, cos, sin, return_state, floor)
    return None


__all__ = ["block_dtype", "feature_map", "linear_attention_layer", "linear_attention_scan_backward",
           "linear_attention_scan_forward", "linear_attention_scan_serves", "linear_attention_serves",
           "linear_attention_step", "masked_block", "reference_feature_map", "reference_linear_attention_scan",
           "reference_linear_attention_step", "scan_linear_attention", "scan_serves_call"]
