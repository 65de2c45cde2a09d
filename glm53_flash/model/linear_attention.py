"""Feature-map linear attention: the miniature's stand-in for GLM-5.3-Flash's linear layers.

o_t = phi(q_t)^T S_t / max(phi(q_t) . z_t, 1e-6), with S_t = sum_{s<=t} phi(k_s) v_s^T and
z_t = sum_{s<=t} phi(k_s), phi(u) = ELU(u) + 1. Unlike the original, which materialised S_t for
every position ([B, T, H, d, d]), training uses the causal quadratic form inside chunks and carries
only one [d, d] state per head between chunks; decoding keeps that state and costs O(1) per token.
No decay or gating (GLM's KDA has both): this is the original miniature's mechanism, made fast.
A decode step on the CPU runs in one C call where the kernels serve (model/ops/), and so does a
sequence longer than the layer's chunk (`_LinearAttentionScan`: the recurrence itself, forward and
backward, each head's state kept in L1), which the torch form would have to split into chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from glm53_flash.model import ops
from glm53_flash.model.ops import Linear
from glm53_flash.model.precision import product_dtype_for
from glm53_flash.model.rope import RotaryEmbedding

DENOMINATOR_FLOOR = 1e-6

# False: sequences longer than the chunk take the torch chunks even where the C scan serves (a switch for
# tests and benchmarks, named in model/dispatch.py and recorded in receipts).
SCAN_ENABLED = True


@dataclass
class LinearState:
    """Running prefix sums of one linear-attention layer: kv [B, H, d, d] and z [B, H, d]."""

    kv: torch.Tensor
    z: torch.Tensor


def feature_map_reference(u: torch.Tensor) -> torch.Tensor:
    return F.elu(u) + 1.0


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
    if not torch.is_grad_enabled() or not u.requires_grad:
        return F.elu(u).add_(1.0)
    return _FeatureMap.apply(u)


def block_dtype(q: torch.Tensor) -> torch.dtype | None:
    """The dtype of the masked blocks' two products for feature-mapped q [B, H, T, d] inside compute_in:
    bf16 where the weight products take it and the batch holds at least BF16_MIN_ROWS positions (B x T,
    the rows of the layer's weight products; the block with its backward in bf16 over float32, casts
    included, on the flash heads: 0.76x at 64 positions, 1.0x at 256, 1.3x at 512-2048, 1.6x at 4096;
    measured on a 2-core EPYC with AVX512-BF16), None: float32."""
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


def causal_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: LinearState | None = None,
    chunk: int = 64,
    return_state: bool = False,
) -> tuple[torch.Tensor, LinearState | None]:
    """Causal linear attention over feature-mapped q, k [B, H, T, d] and v [B, H, T, d].

    `state` holds the sums over earlier positions (cached decoding). Sequences of at most `chunk`
    steps use one masked quadratic block; longer ones are split into chunks whose cross-chunk
    contribution comes from exclusive prefix sums of per-chunk states. Both equal the recurrence.
    """
    b, h, t, d = q.shape
    if t == 1 and state is not None:
        # One decode step: fold the new key into the state first, then read it (O(d^2) per head).
        # Without gradients the cache's own state is updated in place (no new [B, H, d, d] tensor
        # per layer per token); with them, or a state that is not one block of memory, a new one.
        key_t, value = k.flatten(0, 1).transpose(1, 2), v.flatten(0, 1)
        if not torch.is_grad_enabled() and state.kv.is_contiguous() and state.z.is_contiguous():
            kv, z = state.kv, state.z
            kv.view(-1, d, d).baddbmm_(key_t, value)
            z.add_(k[:, :, 0])
        else:
            kv = torch.baddbmm(state.kv.flatten(0, 1), key_t, value).view_as(state.kv)
            z = state.z + k[:, :, 0]
        numerator = torch.matmul(q, kv)
        denominator = torch.matmul(q, z.unsqueeze(-1)).squeeze(-1)
        out = numerator / denominator.clamp_min(DENOMINATOR_FLOOR).unsqueeze(-1)
        return out, (LinearState(kv, z) if return_state else None)
    dtype = block_dtype(q)
    if t <= chunk:
        numerator, denominator = masked_block(q, k, v, dtype)  # [B, H, T, d], [B, H, T]
        if state is not None:
            numerator = numerator + torch.matmul(q, state.kv)
            denominator = denominator + torch.matmul(q, state.z.unsqueeze(-1)).squeeze(-1)
    else:
        n = -(-t // chunk)
        pad = n * chunk - t
        if pad:  # padded keys are zero, so they add nothing to any state
            q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        qc, kc, vc = (x.view(b, h, n, chunk, d) for x in (q, k, v))
        numerator, denominator = masked_block(qc, kc, vc, dtype)  # [B, H, N, C, d], [B, H, N, C]
        chunk_kv = torch.matmul(kc.transpose(-1, -2), vc)  # [B, H, N, d, d]
        chunk_z = kc.sum(-2)  # [B, H, N, d]
        prior_kv = chunk_kv.cumsum(2) - chunk_kv  # exclusive prefix over chunks
        prior_z = chunk_z.cumsum(2) - chunk_z
        if state is not None:
            prior_kv = prior_kv + state.kv.unsqueeze(2)
            prior_z = prior_z + state.z.unsqueeze(2)
        numerator = numerator + torch.matmul(qc, prior_kv)
        denominator = denominator + torch.matmul(qc, prior_z.unsqueeze(-1)).squeeze(-1)
        numerator = numerator.reshape(b, h, n * chunk, d)[:, :, :t]
        denominator = denominator.reshape(b, h, n * chunk)[:, :, :t]
        k, v = k[:, :, :t], v[:, :, :t]
    out = numerator / denominator.clamp_min(DENOMINATOR_FLOOR).unsqueeze(-1)
    new_state = None
    if return_state:
        kv = torch.matmul(k.transpose(-1, -2), v)
        z = k.sum(-2)
        if state is not None:
            kv, z = kv + state.kv, z + state.z
        new_state = LinearState(kv, z)
    return out, new_state


def recurrent_linear_attention(q, k, v, state: LinearState | None = None):
    """The plain recurrence, one position at a time: the test oracle for the fast forms."""
    b, h, t, d = q.shape
    kv = q.new_zeros(b, h, d, d) if state is None else state.kv.clone()
    z = q.new_zeros(b, h, d) if state is None else state.z.clone()
    outs = []
    for i in range(t):
        kv = kv + k[:, :, i, :, None] * v[:, :, i, None, :]
        z = z + k[:, :, i]
        num = torch.einsum("bhd,bhde->bhe", q[:, :, i], kv)
        den = torch.einsum("bhd,bhd->bh", q[:, :, i], z).clamp_min(DENOMINATOR_FLOOR)
        outs.append(num / den[..., None])
    return torch.stack(outs, dim=2), LinearState(kv, z)


class _LinearAttentionScan(torch.autograd.Function):
    """The C sequence kernels (ops.linear_attention_scan_forward / _backward) as one differentiable op:
    qkv [B, T, 3D] -> out [B, T, D], the feature map and the optional rotation inside; saves qkv, out and
    each position's denominator, and recomputes the states in the backward."""

    @staticmethod
    def forward(ctx, qkv, heads, cos, sin):
        out, den, _, _ = ops.linear_attention_scan_forward(qkv, heads, cos, sin, DENOMINATOR_FLOOR)
        ctx.save_for_backward(qkv, out, den)
        ctx.heads, ctx.tables = heads, (cos, sin)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        qkv, out, den = ctx.saved_tensors
        cos, sin = ctx.tables
        grad = ops.linear_attention_scan_backward(qkv, out, den, grad_out, ctx.heads, cos, sin, DENOMINATOR_FLOOR)
        return grad, None, None, None


def scan_linear_attention(qkv: torch.Tensor, heads: int, cos: torch.Tensor | None, sin: torch.Tensor | None,
                          return_state: bool) -> tuple[torch.Tensor, LinearState | None]:
    """A whole sequence from no state by the C kernels (where ops.linear_attention_scan_serves): qkv
    [B, T, 3D] -> (out [B, T, D] before the output product, the final state when asked). The state
    carries no gradient, so a caller that trains through it (a prefill whose state later positions
    read) takes the torch form instead: see scan_serves_call."""
    qkv = qkv.contiguous()
    if return_state:
        if torch.is_grad_enabled() and qkv.requires_grad:
            raise ValueError("scan_linear_attention: the returned state carries no gradient; "
                             "train through a state with causal_linear_attention")
        out, _, kv, z = ops.linear_attention_scan_forward(qkv, heads, cos, sin, DENOMINATOR_FLOOR)
        return out, LinearState(kv, z)
    if not (torch.is_grad_enabled() and qkv.requires_grad):
        return ops.linear_attention_scan_forward(qkv, heads, cos, sin, DENOMINATOR_FLOOR)[0], None
    return _LinearAttentionScan.apply(qkv, heads, cos, sin), None


def scan_serves_call(qkv: torch.Tensor, head_dim: int, t: int, chunk: int, state, return_state: bool) -> bool:
    """Whether a layer call goes to the C sequence kernels: a sequence the torch form would chunk, from
    no state, on a tensor the kernels serve, and not a prefill that trains through the state it returns
    (RL's shared-prompt update: its completions' gradient reaches the prompt's keys and values through
    that state, which the kernels do not differentiate)."""
    trains_through_state = return_state and torch.is_grad_enabled() and qkv.requires_grad
    return (t > chunk and state is None and SCAN_ENABLED and not trains_through_state
            and ops.linear_attention_scan_serves(qkv, head_dim))


class LinearAttention(nn.Module):
    def __init__(self, dim: int, heads: int, chunk: int, rope_before_feature: bool) -> None:
        super().__init__()
        self.heads = heads
        self.chunk = chunk
        self.rope_before_feature = rope_before_feature
        self.qkv = Linear(dim, 3 * dim)
        self.out = Linear(dim, dim)

    def forward(
        self, x: torch.Tensor, rope: RotaryEmbedding, position: int = 0,
        state: LinearState | None = None, return_state: bool = False,
    ) -> tuple[torch.Tensor, LinearState | None]:
        b, t, dim = x.shape
        qkv = self.qkv(x)
        if (t == 1 and state is not None and return_state
                and ops.linear_attention_serves(qkv, state.kv, state.z, dim // self.heads)):
            # One decode step on the CPU: rotation, feature maps, the state update and the read in C.
            out, state = self.decode_step_from_qkv(qkv, rope, position, state)
            return self.out(out), state
        if scan_serves_call(qkv, dim // self.heads, t, self.chunk, state, return_state):
            # A sequence the torch form would chunk: the recurrence in C (sequences of at most `chunk`
            # positions keep the one quadratic block below, whose arithmetic the committed results used).
            tables = ((rope.cos[position : position + t].contiguous(), rope.sin[position : position + t].contiguous())
                      if self.rope_before_feature else (None, None))
            out, new_state = scan_linear_attention(qkv, self.heads, *tables, return_state)
            return self.out(out.to(x.dtype)), new_state
        q, k, v = qkv.view(b, t, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        if self.rope_before_feature:  # the original's order (see docs/ARCHITECTURE.md)
            q, k = rope(q, position), rope(k, position)
        # Prefix sums in float32 even under bf16 autocast: they accumulate over the sequence.
        with torch.autocast(device_type=x.device.type, enabled=False):
            q, k, v = feature_map(q.float()), feature_map(k.float()), v.float()
            out, new_state = causal_linear_attention(q, k, v, state, self.chunk, return_state)
        out = out.to(x.dtype).transpose(1, 2).reshape(b, t, dim)
        return self.out(out), new_state

    def decode_operands(self, state, position: int):
        """This layer's part of the one-call decode step (ops.DecodeStack.step): ((kv, z), the state after
        the step: the same tensors, updated in place), or None where the step cannot serve this state."""
        if not (isinstance(state, LinearState) and ops.decode_tensors_serve(state.kv, state.z)):
            return None
        return (state.kv, state.z), state

    def decode_step_from_qkv(self, qkv: torch.Tensor, rope: RotaryEmbedding, position: int, state: LinearState):
        """One cached token by ops.linear_attention_step: qkv [B, 1, 3D] -> (out [B, 1, D] before
        the output product, the state, updated in place)."""
        cos = rope.cos[position] if self.rope_before_feature else None
        sin = rope.sin[position] if self.rope_before_feature else None
        return ops.linear_attention_step(qkv, state.kv, state.z, cos, sin, DENOMINATOR_FLOOR), state
