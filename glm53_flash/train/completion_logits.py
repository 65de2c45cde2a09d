"""The logits that predict each completion of a batch of (prompt, completion) sequences, for RL's
log-probabilities (train/rl.py `sequence_logprobs`).

Two forms give the same logits and gradients (tests/test_rl.py): every sequence whole in one batch
padded at the end (the plain form, and the test oracle), or each distinct prompt run once into a cache
that is copied to its completions' rows (the default: under causal attention a prompt's activations do
not depend on what follows it, so a group of G completions pays for its prompt once).
"""

from __future__ import annotations

import torch

from glm53_flash.model.precision import compute_in

Sequences = list[tuple[list[int], list[int]]]  # (prompt ids with BOS, completion ids)


def completion_logits(model, sequences: Sequences, device, precision=None,
                      share_prompts: bool = True) -> list[torch.Tensor]:
    """Per sequence, the float32 logits [len(completion), V] that predict its completion tokens. The
    forwards run in `precision` (a model/precision.Precision; None: the device's default)."""
    if share_prompts:
        return _shared_prompt_logits(model, sequences, device, precision)
    return _whole_sequence_logits(model, sequences, device, precision)


def _whole_sequence_logits(model, sequences: Sequences, device, precision=None) -> list[torch.Tensor]:
    """Every sequence whole (prompt + completion) in one batch padded at the end."""
    length = max(len(p) + len(c) for p, c in sequences)
    batch = torch.zeros(len(sequences), length, dtype=torch.long)
    for i, (prompt, completion) in enumerate(sequences):
        ids = prompt + completion
        batch[i, : len(ids)] = torch.tensor(ids)
    with compute_in(precision, device):
        logits = model(batch.to(device)).logits.float()
    # logits at position t predict token t + 1
    return [logits[i, len(p) - 1 : len(p) - 1 + len(c)] for i, (p, c) in enumerate(sequences)]


def _shared_prompt_logits(model, sequences: Sequences, device, precision=None) -> list[torch.Tensor]:
    """Each distinct prompt once (batch 1) into a cache, copied to its sequences' rows (a differentiable
    index_select, whose backward sums the rows' gradients into the one prompt pass); then their
    completions but the last token (nothing follows it to predict) in one batch padded at the end."""
    out: list[torch.Tensor | None] = [None] * len(sequences)
    for prompt, indices in _prompt_members(sequences).items():
        completions = [sequences[i][1] for i in indices]
        cache = model.new_cache(1)
        with compute_in(precision, device):
            # The prompt's last position predicts every completion's first token.
            first = model(torch.tensor([prompt], device=device), cache=cache).logits[0, -1:].float()
        longest = max(len(c) for c in completions)
        if longest <= 1:  # nothing to feed back: at most the first token to predict
            for i, completion in zip(indices, completions):
                out[i] = first[: len(completion)]
            continue
        cache.keep_rows(torch.zeros(len(indices), dtype=torch.long))
        batch = torch.zeros(len(indices), longest - 1, dtype=torch.long)  # padded at the end
        for row, completion in enumerate(completions):
            if len(completion) > 1:
                batch[row, : len(completion) - 1] = torch.tensor(completion[:-1], dtype=torch.long)
        with compute_in(precision, device):
            rest = model(batch.to(device), cache=cache).logits.float()
        for row, (i, completion) in enumerate(zip(indices, completions)):
            out[i] = torch.cat((first, rest[row, : max(0, len(completion) - 1)]))[: len(completion)]
    return out


def _prompt_members(sequences: Sequences) -> dict[tuple[int, ...], list[int]]:
    """Each distinct prompt -> the indices of its sequences, in order of first appearance."""
    members: dict[tuple[int, ...], list[int]] = {}
    for i, (prompt, _) in enumerate(sequences):
        members.setdefault(tuple(prompt), []).append(i)
    return members


def forward_positions(sequences: Sequences, share_prompts: bool = True) -> dict[str, int]:
    """The positions `completion_logits`' forwards compute for `sequences` (the backward goes through the
    same ones): `positions` in all, and `padding` of them, which hold no token of their row (a batch is
    padded at the end to its longest row, and what a padding position computes is never read)."""
    if not sequences:
        return {"positions": 0, "padding": 0}
    if not share_prompts:
        length = max(len(p) + len(c) for p, c in sequences)
        positions = len(sequences) * length
        return {"positions": positions, "padding": positions - sum(len(p) + len(c) for p, c in sequences)}
    positions = padding = 0
    for prompt, indices in _prompt_members(sequences).items():
        fed = [max(0, len(sequences[i][1]) - 1) for i in indices]  # the completion tokens fed back
        positions += len(prompt) + len(indices) * max(fed)
        padding += len(indices) * max(fed) - sum(fed)
    return {"positions": positions, "padding": padding}


__all__ = ["completion_logits", "forward_positions"]
