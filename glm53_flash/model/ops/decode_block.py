"""A hybrid block's whole decode step in three calls (lm.HybridBlock's decode step): `decode_attention_in`
(the streams' read, norm and qkv product), the attention step (linear_attention_step or
sparse_attention_step), `decode_moe_out` (the output product, the MoE and the streams' write). About
25 Python-level operations per layer cost a flash decode step more than its arithmetic did.
`decode_block_serves` is the rule (`library.FUSED_DECODE` and at most `MAX_FUSED_ROWS` rows).
References: `reference_decode_attention_in`, `reference_decode_moe_out`.
"""

from __future__ import annotations

import torch

from glm53_flash.model.ops import library
from glm53_flash.model.ops.grouped import reference_grouped_linear, reference_grouped_matmul
from glm53_flash.model.ops.moe_routing import reference_moe_combine, reference_moe_dispatch
from glm53_flash.model.ops.rmsnorm import reference_rms_norm
from glm53_flash.model.ops.swiglu import reference_swiglu



def weight_type(op: str, weights: dict[str, torch.Tensor]) -> int:
    """1 when the weight products' weights are bf16, 0 when float32 (all of one type, or refused)."""
    kinds = {w.dtype if isinstance(w, torch.Tensor) else None for w in weights.values()}
    if kinds == {torch.bfloat16}:
        return 1
    if kinds != {torch.float32}:
        library.fail(op, f"the weights ({', '.join(weights)}) must all be float32 or all bf16")
    return 0


def decode_block_serves(streams: torch.Tensor, *tensors: torch.Tensor, weights: tuple = ()) -> bool:
    """Whether the fused block step serves streams [S, B, 1, D] (one token per row; the first stream a
    block of memory, the others B * D floats on or all the same) with these float32 tensors (norms,
    logits, router, states) and these weight-product `weights` (all float32 or all bf16: kernels.c's
    wload)."""
    if not (library.FUSED_DECODE and library.ENABLED) or torch.is_grad_enabled() or streams.dim() != 4 or streams.shape[2] != 1:
        return False
    n_streams, batch, _, dim = streams.shape
    if not (n_streams <= library.LIMITS["streams"] and 0 < batch <= library.MAX_FUSED_ROWS and dim % 16 == 0
            and streams[0].is_contiguous() and streams.stride(0) in (0, batch * dim) and library.cpu_float32(streams)):
        return False
    if len({w.dtype for w in weights}) > 1 or any(w.dtype not in (torch.float32, torch.bfloat16) for w in weights):
        return False
    return (library.cpu_float32(*tensors) and all(w.is_cpu for w in weights)
            and all(t.is_contiguous() for t in tensors + tuple(weights)) and library.path_open())

def decode_attention_in(streams: torch.Tensor, input_logits: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                        qkv_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """streams [S, B, 1, D] -> (mixed [B, 1, D], the softmax(input_logits)-weighted mix of the streams;
    qkv [B, 1, 3D] = rms_norm(mixed) @ qkv_weight^T). qkv_weight float32, or bf16 (read as bf16, the
    arithmetic float32: equal to the float32 call on the same weights rounded to bf16)."""
    op = "decode_attention_in"
    n_streams, batch, dim = library.check_streams(op, streams)
    library.check_tensor(op, "input_logits", input_logits, (n_streams,))
    library.check_tensor(op, "norm_weight", norm_weight, (dim,))
    bf16 = weight_type(op, {"qkv_weight": qkv_weight})
    library.check_tensor(op, "qkv_weight", qkv_weight, (3 * dim, dim), qkv_weight.dtype)
    mixed = torch.empty(batch, 1, dim, dtype=torch.float32)
    qkv = torch.empty(batch, 1, qkv_weight.shape[0], dtype=torch.float32)
    library.call(op, streams.data_ptr(), streams.stride(0), n_streams, batch, dim, input_logits.data_ptr(),
          norm_weight.data_ptr(), eps, qkv_weight.data_ptr(), bf16, mixed.data_ptr(), qkv.data_ptr())
    return mixed, qkv

def decode_moe_out(streams: torch.Tensor, output_logits: torch.Tensor, double_residual: bool, attn: torch.Tensor,
                   out_weight: torch.Tensor, mixed: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                   router: torch.Tensor, top_k: int, gate_up: torch.Tensor, down: torch.Tensor,
                   shared_up: torch.Tensor, shared_down: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rest of a block's decode step after attention (attn [B, 1, D] before its output product):
    -> (the new streams [S, B, 1, D], routed slots per expert [E]). router [E, D], gate_up [E, 2H, D],
    down [E, H, D], shared_up [2H, D], shared_down [D, H]; D % 16 == 0, H % 8 == 0. out_weight, gate_up,
    down, shared_up and shared_down all float32 or all bf16 (as decode_attention_in's weight); the
    router stays float32."""
    op = "decode_moe_out"
    n_streams, batch, dim = library.check_streams(op, streams)
    if not (dim % 16 == 0):
        library.fail(op, f"D = {dim} must be a multiple of 16")
    if not (isinstance(down, torch.Tensor) and down.dim() == 3):
        library.fail(op, "down must be [E, H, D]")
    experts, hidden = down.shape[0], down.shape[1]
    library.check_vector_size(op, "H", hidden)
    library.check_routing(op, experts, top_k, batch)
    weights = {"out_weight": out_weight, "gate_up": gate_up, "down": down, "shared_up": shared_up,
               "shared_down": shared_down}
    bf16 = weight_type(op, weights)
    for name, tensor, shape in (("output_logits", output_logits, (n_streams,)), ("attn", attn, (batch, 1, dim)),
                                ("out_weight", out_weight, (dim, dim)), ("mixed", mixed, (batch, 1, dim)),
                                ("norm_weight", norm_weight, (dim,)), ("router", router, (experts, dim)),
                                ("gate_up", gate_up, (experts, 2 * hidden, dim)), ("down", down, (experts, hidden, dim)),
                                ("shared_up", shared_up, (2 * hidden, dim)), ("shared_down", shared_down, (dim, hidden))):
        library.check_tensor(op, name, tensor, shape, torch.bfloat16 if bf16 and name in weights else torch.float32)
    new_streams = torch.empty(n_streams, batch, 1, dim, dtype=torch.float32)
    counts = torch.empty(experts, dtype=torch.int64)
    library.call(op, streams.data_ptr(), streams.stride(0), n_streams, batch, dim, output_logits.data_ptr(),
          int(double_residual), attn.data_ptr(), out_weight.data_ptr(), mixed.data_ptr(), norm_weight.data_ptr(), eps,
          router.data_ptr(), experts, top_k, gate_up.data_ptr(), down.data_ptr(), hidden, shared_up.data_ptr(),
          shared_down.data_ptr(), bf16, counts.data_ptr(), new_streams.data_ptr())
    return new_streams, counts

def _mix(streams: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    weights = torch.softmax(logits, dim=0)
    return (weights.view(-1, 1, 1, 1) * streams).sum(0)

def reference_decode_attention_in(streams, input_logits, norm_weight, eps, qkv_weight):
    mixed = _mix(streams, input_logits)
    return mixed, reference_rms_norm(mixed, norm_weight, eps) @ qkv_weight.T

def reference_decode_moe_out(streams, output_logits, double_residual, attn, out_weight, mixed, norm_weight, eps,
                             router, top_k, gate_up, down, shared_up, shared_down):
    attn_out = attn @ out_weight.T
    normed = reference_rms_norm(mixed + attn_out, norm_weight, eps).flatten(0, 1)
    rows, counts, offsets, position, gates = reference_moe_dispatch(normed, router, top_k)
    routed = reference_grouped_matmul(reference_swiglu(reference_grouped_linear(rows, gate_up, offsets)), down,
                                      offsets)
    shared = reference_swiglu(normed @ shared_up.T) @ shared_down.T
    update = attn_out + reference_moe_combine(routed, position, gates, shared).view_as(attn_out)
    weights = torch.softmax(output_logits, dim=0).view(-1, 1, 1, 1)
    if double_residual:
        return streams + weights * (mixed + update), counts
    return streams + streams.shape[0] * weights * update, counts


__all__ = ["decode_attention_in", "decode_block_serves", "decode_moe_out", "reference_decode_attention_in",
           "reference_decode_moe_out", "weight_type"]
