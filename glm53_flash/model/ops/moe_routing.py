"""A MoE layer's routing for decoding: `moe_dispatch` (top-k of the router's logits, gates the softmax of
the chosen ones, slots sorted stably by expert) and `moe_combine` (the shared expert's output plus
each token's gate-weighted expert outputs). `moe_serves` is the rule for the whole layer (these two
and the grouped products). References: `reference_moe_dispatch`, `reference_moe_combine`.
"""

from __future__ import annotations

import torch

from glm53_flash.model.ops import library
from glm53_flash.model.ops.grouped import grouped_serves


def moe_serves(x: torch.Tensor, router: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
               top_k: int) -> bool:
    """Whether `moe_dispatch` / `moe_combine` and the grouped kernels serve a MoE layer on x [N, D]."""
    return (x.dim() == 2 and x.is_contiguous() and router.is_contiguous() and router.dtype == torch.float32
            and router.shape[0] <= library.LIMITS["experts"] and 1 <= top_k <= min(library.LIMITS["top_k"], router.shape[0])
            and grouped_serves(x, gate_up, down) and x.shape[0] * top_k <= library.MAX_GROUPED_ROWS)

def moe_dispatch(x: torch.Tensor, router: torch.Tensor, top_k: int):
    """Route x [N, D] with router [E, D]: rows [N*k, D] sorted by expert, counts [E], offsets [E]
    (cumulative counts), position [N*k] (where token t's j-th slot landed), gates [N, k]."""
    op = "moe_dispatch"
    if not (isinstance(x, torch.Tensor) and x.dim() == 2):
        library.fail(op, "x must be [N, D]")
    tokens, dim = x.shape
    library.check_tensor(op, "x", x)
    library.check_vector_size(op, "D", dim)
    if not (isinstance(router, torch.Tensor) and router.dim() == 2):
        library.fail(op, "router must be [E, D]")
    experts = router.shape[0]
    library.check_tensor(op, "router", router, (experts, dim))
    library.check_routing(op, experts, top_k, tokens)
    rows = torch.empty(tokens * top_k, dim, dtype=x.dtype)
    counts = torch.empty(experts, dtype=torch.int64)
    offsets = torch.empty(experts, dtype=torch.int64)
    position = torch.empty(tokens * top_k, dtype=torch.int64)
    gates = torch.empty(tokens, top_k, dtype=x.dtype)
    library.call(op, x.data_ptr(), router.data_ptr(), tokens, dim, experts, top_k, rows.data_ptr(),
          counts.data_ptr(), offsets.data_ptr(), position.data_ptr(), gates.data_ptr())
    return rows, counts, offsets, position, gates

def moe_combine(expert_out: torch.Tensor, position: torch.Tensor, gates: torch.Tensor,
                shared: torch.Tensor) -> torch.Tensor:
    """shared [N, D] + each token's gate-weighted expert outputs (rows of expert_out [N*k, D])."""
    op = "moe_combine"
    if not (isinstance(gates, torch.Tensor) and gates.dim() == 2):
        library.fail(op, "gates must be [N, k]")
    tokens, top_k = gates.shape
    if not (1 <= top_k <= library.LIMITS["top_k"]):
        library.fail(op, f"top_k = {top_k}; the kernel takes 1 to {library.LIMITS['top_k']}")
    shared = shared.contiguous() if isinstance(shared, torch.Tensor) else shared  # held: the library reads it
    if not (isinstance(shared, torch.Tensor) and shared.dim() == 2 and shared.shape[0] == tokens):
        library.fail(op, "shared must be [N, D]")
    dim = shared.shape[1]
    if not (dim > 0):
        library.fail(op, "D must be positive")
    library.check_tensor(op, "gates", gates)
    library.check_tensor(op, "shared", shared)
    library.check_tensor(op, "expert_out", expert_out, (tokens * top_k, dim))
    library.check_tensor(op, "position", position, (tokens * top_k,), dtype=torch.int64)
    out = torch.empty_like(shared)
    library.call(op, expert_out.data_ptr(), position.data_ptr(), gates.data_ptr(), shared.data_ptr(), out.data_ptr(),
          tokens, dim, top_k)
    return out

def combine_rows_serves(out: torch.Tensor, gates: torch.Tensor) -> bool:
    """Whether `combine_rows_bf16` serves a training MoE layer's combine: bf16 expert rows out [P, D] on the
    CPU (D a multiple of 8), float32 gates [N, k], k at most LIMITS["top_k"]; gradients on or off."""
    return (library.ENABLED and out.is_cpu and out.dtype == torch.bfloat16 and out.dim() == 2 and out.shape[1] % 8 == 0
            and out.shape[1] > 0 and gates.dtype == torch.float32 and gates.dim() == 2
            and 1 <= gates.shape[1] <= library.LIMITS["top_k"] and library.path_open())

def _check_combine_rows(op: str, out: torch.Tensor, rows: torch.Tensor, gates: torch.Tensor) -> tuple[int, int, int]:
    if not (isinstance(out, torch.Tensor) and out.dim() == 2 and isinstance(gates, torch.Tensor) and gates.dim() == 2):
        library.fail(op, "out must be [P, D] and gates [N, k]")
    tokens, top_k = gates.shape
    dim = out.shape[1]
    if not (1 <= top_k <= library.LIMITS["top_k"]):
        library.fail(op, f"top_k = {top_k}; the kernel takes 1 to {library.LIMITS['top_k']}")
    library.check_vector_size(op, "D", dim)
    library.check_tensor(op, "out", out, dtype=torch.bfloat16)
    library.check_tensor(op, "gates", gates)
    library.check_tensor(op, "rows", rows, (tokens * top_k,), dtype=torch.int64)
    return tokens, dim, top_k

def combine_rows_bf16(out: torch.Tensor, rows: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
    """routed [N, D] float32: sum_j gates[t, j] * out[rows[t * k + j]] over bf16 rows out [P, D] (each row
    widened, each product rounded, summed in j's order: reference_combine_rows' bits for k <= 2); rows [N * k]
    index out (see combine_rows_serves)."""
    op = "moe_combine_rows_bf16"
    out = out.contiguous() if isinstance(out, torch.Tensor) else out  # held here: the library reads them below
    gates = gates.contiguous() if isinstance(gates, torch.Tensor) else gates
    tokens, dim, top_k = _check_combine_rows(op, out, rows, gates)
    routed = torch.empty(tokens, dim)
    library.call(op, out.data_ptr(), rows.data_ptr(), gates.data_ptr(), routed.data_ptr(), tokens, dim, top_k,
                 out.shape[0])
    return routed

def combine_rows_bf16_backward(out: torch.Tensor, rows: torch.Tensor, gates: torch.Tensor,
                               grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of combine_rows_bf16 given grad [N, D]: (grad_out [P, D] bf16, zero in rows no slot
    reads; each read row grad[t] * gates[t, j] rounded to bf16, grad_gates [N, k] float32). Two slots may
    not read one row (each row's gradient is written, not summed)."""
    op = "moe_combine_rows_bf16_backward"
    out = out.contiguous() if isinstance(out, torch.Tensor) else out  # held here: the library reads them below
    gates = gates.contiguous() if isinstance(gates, torch.Tensor) else gates
    grad = grad.contiguous() if isinstance(grad, torch.Tensor) else grad
    tokens, dim, top_k = _check_combine_rows(op, out, rows, gates)
    library.check_tensor(op, "grad", grad, (tokens, dim))
    grad_out = torch.zeros_like(out)
    grad_gates = torch.empty(tokens, top_k)
    library.call(op, out.data_ptr(), rows.data_ptr(), gates.data_ptr(), grad.data_ptr(), grad_out.data_ptr(),
                 grad_gates.data_ptr(), tokens, dim, top_k, out.shape[0])
    return grad_out, grad_gates

def reference_combine_rows(out, rows, gates):
    """The torch formula: the gathered rows widened, times the gates, summed over k."""
    tokens, top_k = gates.shape
    return (out.index_select(0, rows).float().view(tokens, top_k, out.shape[1]) * gates.unsqueeze(-1)).sum(1)


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


__all__ = ["combine_rows_bf16", "combine_rows_bf16_backward", "combine_rows_serves", "moe_combine", "moe_dispatch",
           "moe_serves", "reference_combine_rows", "reference_moe_combine", "reference_moe_dispatch"]
