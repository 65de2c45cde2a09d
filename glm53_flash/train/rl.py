"""RLOO post-training whose only reward is running hidden unit tests.

One update, in the order this file reads: (1) rollout: G completions of each of the update's prompts
from the cached sampler; (2) reward: the sandboxed verifier runs each completion on its task's hidden
cases; (3) advantage: a completion's reward minus the mean of the other G - 1 (a group whose rewards
are all equal teaches nothing); (4) loss: -advantage x the completion's normalised log-probability,
averaged over the update's groups, plus an optional KL penalty; (5) step: one AdamW step (the
engine's). Prompts come in the original's schedule.

Where it deviates from the original miniature, the switch that restores it:
- the gradient's log-probabilities come from the distribution that sampled (temperature, masks)
  (`logprob_source="untempered"`: untempered, unmasked);
- token log-probabilities are summed / (G x max_new_tokens) (`loss_normalization="sequence-mean"`:
  the original's per-sequence mean; "token-sum" the plain sum);
- completions stopped by the parse rule are trained with an EOS appended (`eos_handling="omit"`).
Extras: several groups per update, a KL penalty to the frozen initial policy, LR warmup, other
reward cases (`reward_cases`).

train/rl_run.py runs these pieces per update (`RLTrainer.step`: rollout, judge, with_advantages,
rloo_objective, rloo_step) with everything around them: run directory, resume, receipts, metrics and
torchrun.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from dataclasses import dataclass

import torch

from glm53_flash.data.tokenizer import ByteTokenizer
from glm53_flash.evaluation.sampling import SamplingSettings, generate, mask_logits
from glm53_flash.evaluation.stop import coding_stop
from glm53_flash.tasks import strong_task, task_strong_cases
from glm53_flash.train.completion_logits import completion_logits
from glm53_flash.train.config import (  # noqa: F401 - re-exported: the config and its choices lived here
    EOS_HANDLING, LOGPROB_SOURCES, LOSS_NORMALIZATIONS, REWARD_MODES, RL_STOPS, TRAIN_SCOPES, RLConfig,
    reward_case_count,
)
from glm53_flash.train.engine import optimizer_step

_TOK = ByteTokenizer()


def task_schedule(tasks: list, groups: int, seed: int) -> list:
    """The original's schedule: epoch e is the task list shuffled by Random(seed + 1009 e)."""
    schedule: list = []
    epoch = 0
    while len(schedule) < groups:
        order = list(tasks)
        random.Random(seed + 1009 * epoch).shuffle(order)
        schedule.extend(order)
        epoch += 1
    return schedule[:groups]


# ----------------------------------------------------------------------------------- 1. rollout


def rollout(model, tasks: list, first_group: int, cfg: RLConfig, precision=None, governor=None) -> list[list]:
    """cfg.group_size completions of each task (task i is group first_group + i), in one batched call.
    Each group's random stream is keyed by (seed, group, task), so it does not depend on which other
    groups share the call, and a resumed run draws the same."""
    keys = tuple(f"group-{first_group + i}/{task.task_id}" for i, task in enumerate(tasks))
    settings = SamplingSettings(samples=cfg.group_size, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                seed=cfg.seed, stop=coding_stop(tasks, cfg.stop), keys=keys, precision=precision)
    return generate(model, [t.prompt for t in tasks], settings, governor=governor)


# ----------------------------------------------------------------------------------- 2. reward


def judge(verifier, tasks: list, completions: list[list], first_group: int, cfg: RLConfig) -> list[dict]:
    """One record per group: its completions' verdicts on their reward cases (`reward_task`) and their
    rewards. A verifier that fails twice gives the whole batch identical rewards (0; `verifier_failed`):
    no update from it, and the run goes on."""
    judged = [reward_task(task, cfg.reward_cases, cfg.seed, first_group + i) for i, task in enumerate(tasks)]
    pairs = [(task, task.prompt + c.text) for task, group in zip(judged, completions) for c in group]
    evaluations, verifier_failed = evaluate_safely(verifier, pairs)
    groups = []
    for offset, (task, samples) in enumerate(zip(tasks, completions)):
        window = slice(offset * cfg.group_size, (offset + 1) * cfg.group_size)
        evals = evaluations[window]
        if verifier_failed:
            rewards = [0.0] * cfg.group_size
        else:
            rewards = [reward_for(e, cfg.reward_mode, cfg.invalid_penalty, cfg.exact_bonus) for e in evals]
        groups.append({"group": first_group + offset, "task": task, "completions": samples, "evaluations": evals,
                       "rewards": rewards, "reward_cases": len(judged[offset].cases),
                       "verifier_failed": verifier_failed})
    return groups


def reward_for(evaluation, mode: str, invalid_penalty: float, exact_bonus: float) -> float:
    """Binary: 1 pass, penalty if invalid (or killed by a limit), else 0. Case-fraction: the share of
    passed cases, plus the bonus when all pass, plus the penalty when invalid."""
    invalid = evaluation.status in ("invalid", "limit")
    if mode == "binary":
        return 1.0 if evaluation.passed else (invalid_penalty if invalid else 0.0)
    return (evaluation.pass_fraction + (exact_bonus if evaluation.passed else 0.0)
            + (invalid_penalty if invalid else 0.0))


def reward_task(task, reward_cases: str, seed: int, group: int):
    """The task as its rollouts' reward judges it: its three cases ('three', the original's), its whole
    strong set ('strong'), or K cases of the strong set drawn for this group ('sample-K', a draw keyed
    by seed, group and task, so a resumed run draws the same)."""
    if reward_cases == "three":
        return task
    if reward_cases == "strong":
        return strong_task(task)
    count = reward_case_count(reward_cases)
    cases = task_strong_cases(task)
    key = hashlib.sha256(f"{seed}/{group}/{task.task_id}".encode()).digest()
    chosen = sorted(random.Random(int.from_bytes(key[:8], "big")).sample(range(len(cases)), min(count, len(cases))))
    return dataclasses.replace(task, cases=tuple(cases[i] for i in chosen))


def evaluate_safely(verifier, pairs):
    """A verifier failure never kills the run: retry once, then report the batch as unjudged."""
    from glm53_flash.verifier import Evaluation

    for _ in range(2):
        try:
            return verifier.evaluate_many(pairs), False
        except Exception as error:  # the pool replaces dead workers; a second failure is reported
            last = error
    message = f"verifier failure: {last}"
    return [Evaluation.limit(message, len(task.cases)) for task, _ in pairs], True


# ----------------------------------------------------------------------------------- 3. advantage


def leave_one_out_advantages(rewards: list[float]) -> list[float]:
    """A_i = r_i - mean of the other G - 1 rewards."""
    total, g = sum(rewards), len(rewards)
    return [r - (total - r) / (g - 1) for r in rewards]


def has_signal(rewards: list[float]) -> bool:
    return max(rewards) - min(rewards) > 1e-8


def with_advantages(groups: list[dict]) -> list[dict]:
    """Sets each group's `advantages`; returns the groups with a reward spread (the others teach nothing)."""
    for group in groups:
        group["advantages"] = leave_one_out_advantages(group["rewards"])
    return [group for group in groups if has_signal(group["rewards"])]


# ----------------------------------------------------------------------------------- 4. loss


def training_sequences(prompt: str, completions, eos_handling: str, context: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids with BOS, completion ids) of each completion as the loss reads it. With 'append' a
    completion the parse rule stopped gets an EOS, so valid code learns to stop by itself; one that
    ends exactly at the context's end (`context` tokens) gets none: there is no position left for it."""
    prompt_ids = _TOK.encode(prompt, bos=True)
    sequences = []
    for completion in completions:
        ids = list(completion.token_ids)
        if eos_handling == "append" and completion.finish_reason == "parse" and len(prompt_ids) + len(ids) < context:
            ids.append(_TOK.eos_id)
        sequences.append((prompt_ids, ids))
    return sequences


def sequence_logprobs(model, sequences: list[tuple[list[int], list[int]]], temperature: float,
                      source: str, device, share_prompts: bool = True,
                      precision=None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per sequence: log-probs of its completion tokens (with grad) and the entropy at each position.

    With source 'sampler' the distribution is the sampler's (PAD/BOS/SEP masked, divided by the
    temperature); 'untempered' is the untempered, unmasked softmax the original used. The logits come
    from train/completion_logits.py (each distinct prompt run once unless `share_prompts` is False) in
    `precision`; the log-softmax and everything after it run in float32."""
    rows_by_sequence = completion_logits(model, sequences, device, precision, share_prompts)
    logprobs, entropies = [], []
    for rows, (_, completion) in zip(rows_by_sequence, sequences):
        if source == "sampler":
            rows = mask_logits(rows) / temperature
        logp = torch.log_softmax(rows, dim=-1)
        target = torch.tensor(completion, device=device)
        logprobs.append(logp.gather(-1, target[:, None])[:, 0])
        probs = logp.exp()
        entropies.append(-(probs * torch.where(probs > 0, logp, torch.zeros_like(logp))).sum(-1).detach())
    return logprobs, entropies


def policy_objective(logprobs: list[torch.Tensor], advantages: list[float], normalization: str,
                     max_new_tokens: int) -> torch.Tensor:
    """-mean over samples of A_i x (normalised sum of token log-probs) for one group."""
    g = len(logprobs)
    terms = []
    for logp, advantage in zip(logprobs, advantages):
        if normalization == "sequence-mean":
            value = logp.mean()
        elif normalization == "token-sum":
            value = logp.sum()
        else:
            value = logp.sum() / max_new_tokens
        terms.append(advantage * value)
    return -torch.stack(terms).sum() / g


def kl_penalty(logprobs: list[torch.Tensor], reference_logprobs: list[torch.Tensor],
               tokens: int | None = None) -> torch.Tensor:
    """k3 estimate of KL(policy || reference) per sampled token: the mean over these tokens, or their
    sum / `tokens` when they are part of a larger update."""
    log_ratio = torch.cat(reference_logprobs) - torch.cat(logprobs)
    terms = log_ratio.exp() - log_ratio - 1
    return terms.mean() if tokens is None else terms.sum() / tokens


@dataclass
class Objective:
    """One update's objective on some of its groups."""

    total: torch.Tensor  # what the step differentiates: the policy terms + kl_coef x kl
    kl: torch.Tensor  # per token (0 without a reference)
    entropies: list[torch.Tensor]  # per sequence, at each completion position (no gradient)
    group_losses: list[float]  # each group's policy objective


def rloo_objective(model, groups: list[dict], sequences: list[list], cfg: RLConfig, device, *, precision=None,
                   reference=None, groups_in_update: int | None = None,
                   tokens_in_update: int | None = None) -> Objective:
    """The objective on `groups` (with advantages and a reward spread; `sequences[i]` the training
    sequences of group i): the mean over the update's groups of each group's `policy_objective`, plus
    kl_coef x `kl_penalty` against the frozen `reference` (None: no penalty). `groups_in_update`,
    `tokens_in_update`: the whole update's counts where these groups are only a share of it (None:
    these groups and their tokens)."""
    groups_in_update = groups_in_update or len(groups)
    flat = [s for group in sequences for s in group]
    model.train()
    logprobs, entropies = sequence_logprobs(model, flat, cfg.temperature, cfg.logprob_source, device,
                                            precision=precision)
    total = torch.zeros((), device=device)
    losses, start = [], 0
    for group, own in zip(groups, sequences):
        objective = policy_objective(logprobs[start : start + len(own)], group["advantages"],
                                     cfg.loss_normalization, cfg.max_new_tokens)
        start += len(own)
        losses.append(float(objective.detach()))
        total = total + objective / groups_in_update
    kl = torch.zeros((), device=device)
    if reference is not None:
        with torch.no_grad():
            reference_logprobs, _ = sequence_logprobs(reference, flat, cfg.temperature, cfg.logprob_source, device,
                                                      precision=precision)
        kl = kl_penalty(logprobs, reference_logprobs, tokens_in_update)
        total = total + cfg.kl_coef * kl
    return Objective(total, kl, entropies, losses)


# ----------------------------------------------------------------------------------- 5. step


def set_train_scope(model, scope: str) -> int:
    """Freeze everything outside the scope; returns the number of trainable parameters."""
    if scope not in TRAIN_SCOPES:
        raise ValueError(f"train scope must be one of {', '.join(TRAIN_SCOPES)}, got {scope!r}")
    for param in model.parameters():
        param.requires_grad_(scope == "all")
    if scope != "all":
        for module in (model.blocks[-1], model.norm):
            for param in module.parameters():
                param.requires_grad_(True)
        if scope == "last-block-head":
            model.embedding.weight.requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def rloo_step(model, optimizer, objective: torch.Tensor | None, grad_clip: float, reduce_gradients=None) -> float:
    """One AdamW step of the trained scope on `objective` (the engine's optimizer_step: backward, clip,
    update); None: a process whose groups all lacked signal, which adds zeros to the gradient sum
    (`reduce_gradients`, across processes). Returns the gradient norm before clipping."""
    params = [p for p in model.parameters() if p.requires_grad]
    return optimizer_step(optimizer, params, objective, grad_clip=grad_clip, reduce_gradients=reduce_gradients)



__all__ = ["Objective", "RLConfig", "evaluate_safely", "has_signal", "judge", "kl_penalty", "leave_one_out_advantages",
           "policy_objective", "reward_for", "reward_task", "rloo_objective", "rloo_step", "rollout",
           "sequence_logprobs", "set_train_scope", "task_schedule", "training_sequences", "with_advantages"]
