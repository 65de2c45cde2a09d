"""Mixture of experts: a router, routed SwiGLU experts (top-k) and one always-on shared expert.

GLM-5.3-Flash's MoE layers at small scale (8 routed experts top-2 + 1 shared, where the original has
288 top-8 + 1): out(x) = shared(x) + sum_j g_j expert_{i_j}(x), where i_1..i_k are the k largest router
logits and the gates g the softmax over those k alone. The tokens are grouped by expert with one stable
sort and each expert runs once on its rows; faster ways to compute the same sums (C kernels, grouped,
padded and bf16 products) are model/ops/experts.py's. The balance loss is the Switch Transformer's
E * sum_e f_e P_e, whose router probabilities P_e carry gradients; the original's hard-count metric
(no gradient) stays for ablation.
"""

from __future__ import annotations

import torch
from torch import nn

from glm53_flash.model import ops
from glm53_flash.model.ops import Linear
from glm53_flash.model.precision import mixed_linear, mixed_matmul


def route_tokens(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k experts per token and gate weights: softmax over the chosen k logits only."""
    top_logits, top_index = router_logits.topk(top_k, dim=-1)
    gates = torch.softmax(top_logits.float(), dim=-1).to(router_logits.dtype)
    return gates, top_index


def expert(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """One routed expert, SwiGLU: (silu(gate) * value) @ down with [gate | value] = x @ gate_up^T; gate_up
    [2H, D] in nn.Linear's layout, down [H, D] in x @ W layout (products in the run's dtype)."""
    return mixed_matmul(ops.swiglu_activation(mixed_linear(x, gate_up)), down)


class SwiGLU(nn.Module):
    """The shared expert: down(silu(gate) * value) with [gate | value] = up(x)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = Linear(dim, 2 * hidden)
        self.down = Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.swiglu_mlp(x, self.up.weight, self.down.weight)


class MixtureOfExperts(nn.Module):
    def __init__(self, dim: int, hidden: int, experts: int, top_k: int, init_std: float = 0.02) -> None:
        super().__init__()
        self.experts = experts
        self.top_k = top_k
        self.router = Linear(dim, experts)
        # Routed experts stacked: expert_gate_up [E, 2H, D] in nn.Linear's (out, in) layout and expert_down
        # [E, H, D] in x @ W layout, the pair that few rows per expert read fastest. The up draws are made in
        # the [E, D, 2H] shape and transposed, so a seed gives the weights it gave in that layout.
        self.expert_gate_up = nn.Parameter(
            torch.empty(experts, dim, 2 * hidden).normal_(0.0, init_std).transpose(1, 2).contiguous())
        self.expert_down = nn.Parameter(torch.empty(experts, hidden, dim).normal_(0.0, init_std))
        self.shared = SwiGLU(dim, hidden)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Checkpoints written before the layout change hold expert_up [E, D, 2H].
        old, new = prefix + "expert_up", prefix + "expert_gate_up"
        if old in state_dict and new not in state_dict:
            state_dict[new] = state_dict.pop(old).transpose(1, 2).contiguous()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def routed_parameter_count(self) -> int:
        return self.expert_gate_up.numel() + self.expert_down.numel()

    def run_expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return expert(x, self.expert_gate_up[e], self.expert_down[e])

    def run_each_expert(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """rows [M, D] sorted by expert, counts [E] -> each row through its expert, one expert at a time."""
        # split/unbind (rather than slicing in a loop) keep the backward to one cat/stack each. Idle experts
        # still run on their empty chunk: every parameter stays in the graph (with a zero gradient), which
        # data-parallel training needs.
        ups, downs = self.expert_gate_up.unbind(0), self.expert_down.unbind(0)
        chunks = torch.split(rows, counts.tolist())  # the layer's one host sync
        return torch.cat([expert(chunk, ups[e], downs[e]) for e, chunk in enumerate(chunks)])

    def routed_experts(self, x: torch.Tensor, gates: torch.Tensor, flat_expert: torch.Tensor):
        """x [N, D], gates [N, k], each slot's expert [N k] (slot i belongs to token i // k) -> (each token's
        gate-weighted sum of its experts [N, D], routed slots per expert [E]): the slots sorted by expert,
        each expert run on its rows, the outputs put back in slot order and weighted. ops.routed_experts
        computes the same where it serves."""
        n, dim = x.shape
        order = torch.argsort(flat_expert, stable=True)
        counts = torch.bincount(flat_expert, minlength=self.experts)
        routed = ops.routed_experts(x, order, counts, gates, self.expert_gate_up, self.expert_down)
        if routed is None:
            expert_out = self.run_each_expert(x.index_select(0, order // self.top_k), counts)
            # Undo the sort: the slots are a permutation, so a plain scatter is deterministic.
            slot_out = torch.empty_like(expert_out).index_copy_(0, order, expert_out)
            routed = (slot_out.view(n, self.top_k, dim) * gates.unsqueeze(-1)).sum(1)
        return routed, counts

    def forward(self, x: torch.Tensor, token_mask: torch.Tensor | None = None, with_balance: bool = True,
                balance_reduce=None):
        """x [N, D] -> (output [N, D], per-expert slot counts [E], balance loss scalar or None).

        `token_mask` [N] (bool) excludes tokens (padding) from the balance statistics only;
        `with_balance=False` skips the statistics altogether (cached decoding needs none; the whole
        layer then runs in C where ops.moe_layer_in_c serves); `balance_reduce` sums count tensors across
        data-parallel ranks (see balance_loss).
        """
        if not with_balance:
            fast = ops.moe_layer_in_c(x, self.router.weight, self.expert_gate_up, self.expert_down, self.top_k,
                                      self.shared)
            if fast is not None:
                return fast
        n = x.shape[0]
        logits = self.router(x)
        gates, top_index = route_tokens(logits, self.top_k)
        flat_expert = top_index.reshape(-1)  # [N k]: slot i belongs to token i // k
        routed, counts = self.routed_experts(x, gates, flat_expert)
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


__all__ = ["MixtureOfExperts", "SwiGLU", "dense_moe_reference", "expert", "original_balance_metric", "route_tokens"]
