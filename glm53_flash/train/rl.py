"""RLOO post-training whose only reward is running hidden unit tests.

Per prompt, G completions are sampled with the cached batched sampler and judged by the sandboxed
verifier; each completion's advantage is its reward minus the mean of the other G - 1. Compatible
with the original's flags, defaults and task schedule; its flaws are fixed behind switches that
restore the original for ablation:
- log-probabilities for the gradient come from the distribution that sampled (temperature, masks)
  (`logprob_source="untempered"`: untempered, unmasked);
- loss normalisation `constant` (sum over tokens / (G x max_new_tokens)); `sequence-mean` is the
  original's per-sequence mean, `token-sum` the plain sum;
- completions stopped by the parse rule are trained with an EOS appended, so valid code learns to
  stop (`eos_handling="omit"`: no EOS, as the original); one that ends exactly at the context's end
  gets none (there is no position left for it).
Extras: several groups per optimizer step, a KL penalty to the frozen initial policy, LR warmup.

Under torchrun (`torchrun --nproc_per_node=N -m glm53_flash.cli rl ...`) the ranks split each update's
work by whole groups: of the update's `prompts_per_update` groups, rank r takes a contiguous share
(`DistributedContext.share`), samples them, judges them with its own verifier and computes their
leave-one-out advantages and objectives. A group never spans ranks, so the RLOO baseline needs no
communication and every sample is drawn exactly as in one process (its random stream is keyed by
seed, group, task and sample index, not by rank or batch). The objective stays the single-process
one: each group's term is divided by the number of reward-bearing groups of the whole update and the
KL and entropy by its whole token count (both summed across ranks first); the ranks' gradients are
then summed (`all_sum_gradients`), so every rank clips the same global gradient and takes the same
AdamW step. Results equal one process's up to floating-point summation order. Splitting a group's
samples across ranks would need per-sample offsets in the sampler and a reward exchange inside the
group for no gain in identity, so the command instead refuses `--prompts-per-update` below the
number of ranks (a rank without a group would only wait). The ranks' group records are gathered to
rank 0, which alone writes (lock, checkpoints, rollouts, metrics, receipts); resume loads the last
checkpoint on every rank and works with any number of ranks.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import random
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from glm53_flash.core.options import summary_record
from glm53_flash.core.receipts import append_text, read_json, read_jsonl, write_json, write_text
from glm53_flash.core.runtime import resolve_device
from glm53_flash.evaluation.sampling import SamplingSettings, generate, mask_logits
from glm53_flash.evaluation.stop import coding_stop
from glm53_flash.model.precision import compute_in, resolve_precision
from glm53_flash.tasks import RL_SPLITS, parse_families, split_tasks, strong_task, task_strong_cases
from glm53_flash.data.tokenizer import ByteTokenizer
from glm53_flash.train.config import (  # noqa: F401 - re-exported: the config and its choices lived here
    EOS_HANDLING,
    LOGPROB_SOURCES,
    LOSS_NORMALIZATIONS,
    REWARD_MODES,
    RL_STOPS,
    reward_case_count,
    TRAIN_SCOPES,
    RLConfig,
)
from glm53_flash.train.checkpoint import (
    list_checkpoints, load_checkpoint, load_optimizer_state, load_trainer_state, prepare_run_directory,
)
from glm53_flash.train.distributed import DistributedContext, setup_distributed
from glm53_flash.train.engine import RL as RL_RECIPE
from glm53_flash.train.engine import Schedule, Trainer, check_live_logging, make_optimizer, optimizer_step, set_learning_rate
from glm53_flash.train.rundir import check_resume_config, config_defaults, resume_command

RUN_FILE = "run.json"
ROLLOUTS_FILE = "rollouts.jsonl"
METRICS_FILE = "metrics.jsonl"
SCHEDULE_FILE = "schedule.json"
RECEIPT_FILE = "training-receipt.json"
_TOK = ByteTokenizer()


# ----------------------------------------------------------------------------------- pure pieces


def check_preset(config, preset: str, checkpoint) -> None:
    """The checkpoint's architecture must be the named preset (the context length may differ)."""
    from glm53_flash.model.config import ModelConfig

    expected = ModelConfig.preset(preset).replace(max_sequence_length=config.max_sequence_length)
    if config != expected:
        differing = sorted(k for k, v in expected.to_dict().items() if config.to_dict()[k] != v)
        raise ValueError(f"checkpoint {checkpoint} is not a {preset!r} model (differs in {', '.join(differing)})")


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


def leave_one_out_advantages(rewards: list[float]) -> list[float]:
    """A_i = r_i - mean of the other G - 1 rewards."""
    total, g = sum(rewards), len(rewards)
    return [r - (total - r) / (g - 1) for r in rewards]


def has_signal(rewards: list[float]) -> bool:
    return max(rewards) - min(rewards) > 1e-8


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


def sequence_logprobs(model, sequences: list[tuple[list[int], list[int]]], temperature: float,
                      source: str, device, share_prompts: bool = True,
                      precision=None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per sequence: log-probs of its completion tokens (with grad) and the entropy at each position.

    `sequences` holds (prompt ids with BOS, completion ids). With source 'sampler' the distribution is
    the sampler's (PAD/BOS/SEP masked, divided by the temperature); 'untempered' is the untempered,
    unmasked softmax the original used.

    A group's G sequences share one prompt, and under causal attention the prompt's activations do not
    depend on what follows it. So by default (`share_prompts`) each distinct prompt runs once, batch
    1, into a cache; the cache is copied to its sequences' rows (a differentiable index_select, whose
    backward sums the rows' gradients into the one prompt pass) and their completions run on it. A
    group of 16 then computes about 45 + 16 x 30 positions instead of 16 x 75. `share_prompts=False`
    runs every sequence whole in one padded batch: the plain formulation, and the test oracle.
    The forwards run in `precision` (a model/precision.Precision; None: the device's default); the
    log-softmax and everything after it in float32.
    """
    rows_by_sequence = (_completion_logits_shared(model, sequences, device, precision) if share_prompts
                        else _completion_logits_whole(model, sequences, device, precision))
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


def _completion_logits_whole(model, sequences, device, precision=None) -> list[torch.Tensor]:
    """Per sequence, the float32 logits [len(completion), V] that predict its completion: every sequence
    whole (prompt + completion) in one batch padded at the end."""
    length = max(len(p) + len(c) for p, c in sequences)
    batch = torch.zeros(len(sequences), length, dtype=torch.long)
    for i, (prompt, completion) in enumerate(sequences):
        ids = prompt + completion
        batch[i, : len(ids)] = torch.tensor(ids)
    with compute_in(precision, device):
        logits = model(batch.to(device)).logits.float()
    # logits at position t predict token t + 1
    return [logits[i, len(p) - 1 : len(p) - 1 + len(c)] for i, (p, c) in enumerate(sequences)]


def _prompt_members(sequences) -> dict[tuple[int, ...], list[int]]:
    """Each distinct prompt -> the indices of its sequences, in order of first appearance."""
    members: dict[tuple[int, ...], list[int]] = {}
    for i, (prompt, _) in enumerate(sequences):
        members.setdefault(tuple(prompt), []).append(i)
    return members


def forward_positions(sequences: list[tuple[list[int], list[int]]], share_prompts: bool = True) -> dict[str, int]:
    """The positions sequence_logprobs' forward computes for `sequences` (the backward goes through the
    same ones): `positions` in all, and `padding` of them, which hold no token of their row (a batch is
    padded at the end to its longest row, and what a padding position computes is never read). With
    `share_prompts` each distinct prompt runs once, then its completions but their last token (nothing
    follows it to predict) in one batch; else every sequence whole in one batch."""
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


def _completion_logits_shared(model, sequences, device, precision=None) -> list[torch.Tensor]:
    """The same logits, each distinct prompt run once (see sequence_logprobs)."""
    members = _prompt_members(sequences)
    out: list[torch.Tensor | None] = [None] * len(sequences)
    for prompt, indices in members.items():
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


# ----------------------------------------------------------------------------------- the trainer


# Fields of RLConfig that do not change what a run computes (free to differ on --resume).
NOT_RECORDED = ("resume", "quiet", "tensorboard", "wandb", "verifier_workers", "device", "output")


def check_world_size(cfg: RLConfig, world_size: int) -> None:
    """Under torchrun every rank trains whole groups (see the module's note): each update needs at
    least one group per rank."""
    if world_size > 1 and cfg.prompts_per_update < world_size:
        raise ValueError(f"under torchrun each rank trains whole groups: --prompts-per-update "
                         f"({cfg.prompts_per_update}) must be at least the number of ranks ({world_size})")


class RLTrainer(Trainer):
    """RL as the engine's plugin: its step is one update (the rollouts of `prompts_per_update` groups,
    judged, then the RLOO step), so a step advances the run by that many groups; it saves the model
    and the optimizer, and its rows are per update (metrics.jsonl) and per group (rollouts.jsonl)."""

    command = "rl"
    stage = "executable_reward_rl"
    unit = "group"
    length_field = "groups"
    namespace = "rl"
    desc = "rl"

    def __init__(self, cfg: RLConfig) -> None:
        super().__init__()
        world = int(os.environ.get("WORLD_SIZE", "1"))
        self.adapted = cfg.prompts_per_update is None  # the default: one group per rank (a resume keeps the run's)
        cfg.resolve_prompts_per_update(world)
        cfg.validate()
        self.cfg = cfg
        self.out = Path(cfg.output)
        self.device = resolve_device(cfg.device)
        self.precision = resolve_precision(cfg.precision, self.device)
        check_world_size(cfg, world)
        self.ctx: DistributedContext = setup_distributed(self.device.type)
        if self.ctx.enabled and self.device.type == "cuda":
            self.device = torch.device("cuda", self.ctx.local_rank)
            torch.cuda.set_device(self.device)
        if self.ctx.is_main:
            check_live_logging(cfg.tensorboard, cfg.wandb)
        families = parse_families(cfg.families, cfg.tasks)
        self.tasks = split_tasks(RL_SPLITS[cfg.tasks], cfg.tasks_per_family, families=families)
        self.family_label = "all" if not cfg.families else sorted(families)
        self.schedule = task_schedule(self.tasks, cfg.groups, cfg.seed)
        self.schedule_sha256 = hashlib.sha256(json.dumps([t.task_id for t in self.schedule]).encode()).hexdigest()
        self.learning_rates = Schedule(cfg.learning_rate, cfg.warmup)  # by update
        self.exact_last = 0  # passing rollouts of the last update (the progress bar's)

    def run_record(self) -> dict:
        record = asdict(self.cfg)
        for key in NOT_RECORDED:
            record.pop(key)
        record["checkpoints"] = list(self.cfg.checkpoints)
        return record

    def resume_hint(self) -> str:
        return resume_command("rl", self.cfg, extra=["--resume"])

    def verifier_workers(self) -> int | None:
        """--verifier-workers, or by default the CPUs shared out among the ranks of one machine."""
        if self.cfg.verifier_workers is not None or not self.ctx.enabled:
            return self.cfg.verifier_workers
        return max(1, (os.cpu_count() or 1) // self.ctx.world_size)

    def session(self):
        from glm53_flash.verifier import Verifier

        self.verifier = Verifier(workers=self.verifier_workers())
        return self.verifier

    def check_sizes(self, available: int | None = None) -> None:
        """Before the run directory is touched: the longest prompt plus --max-new-tokens fits the
        checkpoint's context, and an update's sequences (group size x prompts per update, each at most
        the context) fit the machine's free memory (ModelConfig.training_bytes)."""
        from glm53_flash.train.checkpoint import load_config
        from glm53_flash.core.runtime import available_memory_bytes

        cfg = self.cfg
        model_cfg = load_config(cfg.initial_checkpoint)
        longest = max(len(_TOK.encode(t.prompt, bos=True)) for t in self.tasks)
        if longest + cfg.max_new_tokens > model_cfg.max_sequence_length:
            raise ValueError(f"the longest training prompt is {longest} tokens; with --max-new-tokens "
                             f"{cfg.max_new_tokens} it exceeds the checkpoint's context "
                             f"({model_cfg.max_sequence_length} tokens)")
        rows = cfg.group_size * -(-cfg.prompts_per_update // self.ctx.world_size)
        needed = model_cfg.training_bytes(rows, longest + cfg.max_new_tokens)
        available = available_memory_bytes() if available is None else available
        if available is not None and needed > available:
            raise ValueError(f"an update of {rows} sequences needs about {needed / 2**30:.1f} GiB, more than the "
                             f"{available / 2**30:.1f} GiB this machine has free; lower --group-size or "
                             f"--prompts-per-update")

    def prepare(self) -> None:
        cfg = self.cfg
        self.check_sizes()
        exists = prepare_run_directory(self.out, cfg.resume)
        self.model, meta = load_checkpoint(cfg.initial_checkpoint, self.device)
        if cfg.preset is not None:
            check_preset(self.model.config, cfg.preset, cfg.initial_checkpoint)
        self.initial_sha256 = meta["weights_sha256"]
        self.trainable = set_train_scope(self.model, cfg.train_scope)
        self.recipe = replace(RL_RECIPE, learning_rate=cfg.learning_rate, grad_clip=cfg.grad_clip)
        self.optimizer = make_optimizer(self.model, self.recipe)
        self.reference = None
        if cfg.kl_coef > 0:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        saved = list_checkpoints(self.out) if exists else []
        self.ctx.barrier()  # every rank has looked at the directory before rank 0 writes into it
        if saved:
            self._resume(saved)
        elif self.ctx.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            write_json(self.out / RUN_FILE, self.run_record())
            write_json(self.out / SCHEDULE_FILE, [t.task_id for t in self.schedule])
            for name in (ROLLOUTS_FILE, METRICS_FILE):
                write_text(self.out / name, "", within=self.out)
            self.save_checkpoint_at(0, 0.0)
        self.ctx.barrier()

    def _resume(self, saved) -> None:
        recorded = read_json(self.out / RUN_FILE)
        if self.adapted and isinstance(recorded.get("prompts_per_update"), int):
            # left at its default: the run's own groups per update, whatever the number of ranks now
            self.cfg.prompts_per_update = recorded["prompts_per_update"]
            check_world_size(self.cfg, self.ctx.world_size)
        check_resume_config(self.out, recorded, self.run_record(), config_defaults(RLConfig))
        group, path = saved[-1]
        model, _ = load_checkpoint(path, self.device)
        self.model.load_state_dict(model.state_dict())
        state = load_trainer_state(path)
        load_optimizer_state(self.optimizer, state, path)
        self.position = int(state["group"])
        self.elapsed_before = float(state["elapsed_seconds"])
        self.restore_checkpoints(state["checkpoints"])
        if self.ctx.is_main:
            self.cut_jsonl(ROLLOUTS_FILE, "group")
            self.metrics_rows = self.cut_jsonl(METRICS_FILE, "last_group")

    def checkpoint_positions(self) -> set[int]:
        return set(self.cfg.checkpoints) | {self.cfg.groups}

    def checkpoint_contents(self, group: int, elapsed: float):
        stage = "pre_rl" if group == 0 else "executable_reward_rl"
        meta = {"stage": stage, "group": group, "seed": self.cfg.seed,
                "source_checkpoint": str(self.cfg.initial_checkpoint), "source_sha256": self.initial_sha256}
        if self.metrics_rows:
            meta["mean_reward"] = round(self.metrics_rows[-1]["mean_reward"], 4)
        state = {"optimizer": self.optimizer.state_dict(), "group": group, "elapsed_seconds": elapsed,
                 "checkpoints": self.checkpoints}
        return self.model, meta, state

    def receipt_fields(self) -> dict:
        """The config's summary fields (option(summary=True) in train/config.py), then what the run
        found or computed."""
        rows = read_jsonl(self.out / ROLLOUTS_FILE)
        return {
            **summary_record(self.cfg), "algorithm": "RLOO", "initial_checkpoint_sha256": self.initial_sha256,
            "trainable_parameters": self.trainable, "families": self.family_label,
            "schedule_sha256": self.schedule_sha256, "updated_groups": sum(r["updated"] for r in rows),
            "exact_training_rollouts": sum(r["exact_rollouts"] for r in rows), "reward_hacking": reward_hacking(rows),
            "groups_detail_file": ROLLOUTS_FILE, "metrics_file": METRICS_FILE,
        }

    # -- one update --------------------------------------------------------------------------
    def rollouts(self, first_group: int, tasks: list, verifier) -> list[dict]:
        cfg = self.cfg
        # One batched call for the whole update; each group's random stream is keyed by (seed, group,
        # task), so it does not depend on which other groups share the batch (and resumes exactly).
        settings = SamplingSettings(
            samples=cfg.group_size, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, seed=cfg.seed,
            stop=coding_stop(tasks, cfg.stop), keys=tuple(f"group-{first_group + i}/{t.task_id}" for i, t in enumerate(tasks)),
            precision=self.precision)
        completions = generate(self.model, [t.prompt for t in tasks], settings, governor=self.governor)
        judged = [reward_task(task, cfg.reward_cases, cfg.seed, first_group + i) for i, task in enumerate(tasks)]
        pairs = [(task, task.prompt + c.text) for task, group in zip(judged, completions) for c in group]
        evaluations, verifier_failed = _evaluate_safely(verifier, pairs)
        strong = self.strong_verdicts(tasks, pairs, evaluations, verifier, verifier_failed)
        groups = []
        for offset, (task, samples) in enumerate(zip(tasks, completions)):
            window = slice(offset * cfg.group_size, (offset + 1) * cfg.group_size)
            evals = evaluations[window]
            if verifier_failed:  # no trustworthy reward: identical rewards, so no update from this group
                rewards = [0.0] * cfg.group_size
            else:
                rewards = [reward_for(e, cfg.reward_mode, cfg.invalid_penalty, cfg.exact_bonus) for e in evals]
            groups.append({"group": first_group + offset, "task": task, "completions": samples,
                           "evaluations": evals, "rewards": rewards, "strong_passed": strong[window],
                           "reward_cases": len(judged[offset].cases)})
        return groups

    def strong_verdicts(self, tasks, pairs, evaluations, verifier, verifier_failed) -> list[bool | None]:
        """Per rollout: whether a program that passed its reward cases also passes its task's strong set
        (None for one that did not pass them: it earned no pass to check). With the strong set as the
        reward the two verdicts are one. The strong verdict never changes a reward."""
        cfg = self.cfg
        verdicts: list[bool | None] = [None] * len(pairs)
        if verifier_failed:
            return verdicts
        if cfg.reward_cases == "strong":
            return [e.passed if e.passed else None for e in evaluations]
        passing = [i for i, e in enumerate(evaluations) if e.passed]
        if passing:
            checks, failed = _evaluate_safely(
                verifier, [(strong_task(tasks[i // cfg.group_size]), pairs[i][1]) for i in passing])
            for i, check in zip(passing, checks):
                verdicts[i] = None if failed else bool(check.passed)
        return verdicts

    def training_sequences(self, task, completions) -> list[tuple[list[int], list[int]]]:
        prompt = _TOK.encode(task.prompt, bos=True)
        sequences = []
        for c in completions:
            ids = list(c.token_ids)
            # Teach valid code to stop by itself, where the context has room for the EOS: a completion
            # that the parse rule stopped exactly at the context's end is trained as it was sampled.
            if self.cfg.eos_handling == "append" and c.finish_reason == "parse" \
                    and len(prompt) + len(ids) < self.model.config.max_sequence_length:
                ids.append(_TOK.eos_id)
            sequences.append((prompt, ids))
        return sequences

    def update(self, groups: list[dict], lr: float) -> dict:
        """One AdamW step on this rank's `groups` (all of the update's in one process; under torchrun
        this rank's share, the objective scaled to the whole update's: see the module's note)."""
        cfg, ctx = self.cfg, self.ctx
        distributed = ctx.enabled
        set_learning_rate(self.optimizer, lr)
        learning = [g for g in groups if has_signal(g["rewards"])]
        stats = {"loss": None, "grad_norm": None, "entropy": None, "kl": None, "forward_seconds": 0.0,
                 "step_seconds": 0.0, "positions": 0, "padding_positions": 0}
        for g in groups:
            g["advantages"] = leave_one_out_advantages(g["rewards"])
            g["policy_loss"] = None
        sequences, owners = [], []
        for g in learning:
            for s in self.training_sequences(g["task"], g["completions"]):
                sequences.append(s)
                owners.append(g)
        learning_groups, tokens = len(learning), sum(len(c) for _, c in sequences)
        computed = forward_positions(sequences)
        passes = 1 if self.reference is None else 2  # the reference's forward computes the same positions again
        positions, padding = passes * computed["positions"], passes * computed["padding"]
        if distributed:  # the whole update's counts: every rank scales its terms by them
            counts = ctx.all_sum(torch.tensor([float(learning_groups), float(tokens), float(positions),
                                               float(padding)], device=self.device))
            learning_groups, tokens, positions, padding = (int(c) for c in counts)
        stats.update(positions=positions, padding_positions=padding)
        if not learning_groups:
            return stats
        self.model.train()
        total = torch.zeros((), device=self.device)
        kl = entropy_sum = torch.zeros((), device=self.device)
        started = time.perf_counter()
        if learning:
            logprobs, entropies = sequence_logprobs(self.model, sequences, cfg.temperature, cfg.logprob_source,
                                                    self.device, precision=self.precision)
            for g in learning:
                idx = [i for i, o in enumerate(owners) if o is g]
                objective = policy_objective([logprobs[i] for i in idx], g["advantages"], cfg.loss_normalization,
                                             cfg.max_new_tokens)
                g["policy_loss"] = float(objective.detach())
                total = total + objective / learning_groups
            entropy_sum = torch.cat(entropies).sum()
            if self.reference is not None:
                with torch.no_grad():
                    ref_logprobs, _ = sequence_logprobs(self.reference, sequences, cfg.temperature,
                                                        cfg.logprob_source, self.device, precision=self.precision)
                # k3 estimator of KL(policy || reference) on the sampled tokens.
                log_ratio = torch.cat(ref_logprobs) - torch.cat(logprobs)
                terms = log_ratio.exp() - log_ratio - 1
                kl = terms.sum() / tokens if distributed else terms.mean()
                total = total + cfg.kl_coef * kl
        stats["forward_seconds"] = time.perf_counter() - started
        if distributed:
            summed = ctx.all_sum(torch.stack([total.detach(), kl.detach(), entropy_sum.detach()]))
            loss, kl_value, entropy = float(summed[0]), float(summed[1]), float(summed[2]) / tokens
        else:
            loss, kl_value = float(total.detach()), float(kl.detach())
            entropy = float(torch.cat(entropies).mean())
        if self.reference is not None:
            stats["kl"] = kl_value
        if not torch.isfinite(torch.tensor(loss)):
            raise FloatingPointError(f"non-finite RL objective at group {groups[-1]['group'] if groups else '?'}")
        params = [p for p in self.model.parameters() if p.requires_grad]
        started = time.perf_counter()
        grad_norm = optimizer_step(self.optimizer, params, total if learning else None, grad_clip=cfg.grad_clip,
                                   reduce_gradients=ctx.all_sum_gradients)
        stats["step_seconds"] = time.perf_counter() - started
        stats.update(loss=loss, grad_norm=grad_norm, entropy=entropy)
        for g in learning:
            g["gradient_norm"] = grad_norm
        return stats

    def advance(self, position: int) -> int:
        return min(self.cfg.groups, position + self.cfg.prompts_per_update)

    def step(self, position: int) -> dict | None:
        """One update: groups position + 1 .. advance(position), this rank's share rolled out and
        judged, then the RLOO step; rank 0 logs every group and returns the update's metrics row."""
        cfg, ctx = self.cfg, self.ctx
        first, last = position + 1, self.advance(position)
        lr = self.learning_rates.at((first - 1) // cfg.prompts_per_update)
        start = time.perf_counter()
        lo, hi = ctx.share(last - first + 1)  # this rank's groups: first + lo .. first + hi - 1
        mine = (self.rollouts(first + lo, self.schedule[first - 1 + lo : first - 1 + hi], self.verifier)
                if hi > lo else [])
        rollout_seconds = time.perf_counter() - start
        stats = self.update(mine, lr)
        groups = [g for part in ctx.all_gather_objects(mine) for g in part]
        seconds = time.perf_counter() - start
        if not ctx.is_main:
            return None
        self.exact_last = sum(r == 1.0 for g in groups for r in g["rewards"])
        return self._log(groups, stats, lr, rollout_seconds, seconds)

    def postfix(self, row: dict) -> dict:
        return {"reward": f"{row['mean_reward']:.3f}", "exact": self.exact_last}

    def _log(self, groups, stats, lr, rollout_seconds, seconds) -> dict:
        lengths, caps, lines = [], 0, []
        for g in groups:
            evals = g["evaluations"]
            row = {
                "group": g["group"], "task_id": g["task"].task_id, "family": g["task"].family,
                "rewards": g["rewards"], "advantages": g["advantages"],
                "reward_spread": max(g["rewards"]) - min(g["rewards"]),
                "updated": g["policy_loss"] is not None, "policy_loss": g["policy_loss"],
                "gradient_norm": g.get("gradient_norm"),
                "exact_rollouts": sum(e.passed for e in evals),
                "reward_cases": g["reward_cases"],
                "reward_hacks": sum(v is False for v in g["strong_passed"]),
                "valid_rollouts": sum(e.status in ("passed", "failed") for e in evals),
                "token_cap_hits": sum(c.hit_cap for c in g["completions"]),
                "seconds": seconds / len(groups),
                "samples": [{"completion": c.text, "token_ids": list(c.token_ids), "tokens": len(c.token_ids),
                             "hit_token_cap": c.hit_cap, "finish_reason": c.finish_reason, "reward": r,
                             "evaluation": e.to_dict(), "strong_passed": strong}
                            for c, e, r, strong in zip(g["completions"], evals, g["rewards"], g["strong_passed"])],
            }
            lines.append(json.dumps(row, sort_keys=True) + "\n")
            lengths.extend(len(c.token_ids) for c in g["completions"])
            caps += row["token_cap_hits"]
        append_text(self.out / ROLLOUTS_FILE, "".join(lines), within=self.out)
        rewards = [r for g in groups for r in g["rewards"]]
        metrics = {
            "update": len(self.metrics_rows) + 1, "first_group": groups[0]["group"], "last_group": groups[-1]["group"],
            "mean_reward": sum(rewards) / len(rewards),
            "zero_variance_fraction": sum(not has_signal(g["rewards"]) for g in groups) / len(groups),
            "mean_completion_length": sum(lengths) / len(lengths), "truncation_rate": caps / len(lengths),
            "reward_hacks": sum(v is False for g in groups for v in g["strong_passed"]),
            "entropy": stats["entropy"], "kl": stats["kl"], "loss": stats["loss"], "grad_norm": stats["grad_norm"],
            "lr": lr, "rollout_seconds": rollout_seconds, "seconds": seconds,
            # Of the update (seconds - rollout_seconds), this process's log-prob forwards (the objective's
            # terms with them) and its backward with the AdamW step; the positions the forwards computed
            # in the whole update and how many of them were padding (forward_positions).
            "update_forward_seconds": stats["forward_seconds"], "update_step_seconds": stats["step_seconds"],
            "update_positions": stats["positions"], "update_padding_positions": stats["padding_positions"],
        }
        self.metrics_rows.append(metrics)
        return metrics


def reward_hacking(rows: list[dict]) -> dict:
    """The training rollouts that passed their reward cases but fail their task's strong set: per group
    and in all (rows of rollouts.jsonl; rows written before this was recorded count as unknown)."""
    by_group, passed, hacks, unknown = [], 0, 0, 0
    for row in rows:
        verdicts = [sample.get("strong_passed") for sample in row["samples"]]
        passing = sum(bool(sample["evaluation"]["passed"]) for sample in row["samples"])
        checked = sum(v is not None for v in verdicts)
        group_hacks = sum(v is False for v in verdicts)
        unknown += passing - checked
        passed += passing
        hacks += group_hacks
        by_group.append({"group": row["group"], "task_id": row["task_id"], "passed_reward_cases": passing,
                         "failed_strong": group_hacks})
    return {"rollouts_passing_reward_cases": passed, "failing_strong_set": hacks, "unchecked": unknown,
            "rate": hacks / passed if passed else 0.0, "by_group": by_group,
            "rule": "a rollout that passes the cases its reward is judged on and fails the task's strong set"}


def _evaluate_safely(verifier, pairs):
    """A verifier failure never kills the run: retry once, then report the batch as unjudged."""
    from glm53_flash.verifier import Evaluation

    for _ in range(2):
        try:
            return verifier.evaluate_many(pairs), False
        except Exception as error:  # the pool replaces dead workers; a second failure is reported
            last = error
    message = f"verifier failure: {last}"
    return [Evaluation.limit(message, len(task.cases)) for task, _ in pairs], True


def train_rl(cfg: RLConfig) -> dict:
    """Run (or resume) an RL run; returns the final receipt (under torchrun on rank 0, {} elsewhere)."""
    return RLTrainer(cfg).run()


__all__ = ["RLConfig", "train_rl", "task_schedule", "reward_for", "reward_task", "reward_hacking",
           "leave_one_out_advantages", "has_signal", "set_train_scope", "sequence_logprobs", "policy_objective"]
