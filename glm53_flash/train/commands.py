"""CLI registration for `glm53 pretrain` (flags map one to one onto PretrainConfig)."""

from __future__ import annotations

import argparse
import sys

from ..config import LINEAR_ROPE_MODES, PRESETS, STREAM_MODES, BALANCE_LOSS_MODES
from ..runtime import DEVICE_CHOICES


def parse_steps(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def register(sub, bench_sub) -> None:
    p = sub.add_parser("pretrain", help="pretrain from random weights on the generated task corpus",
                       description="Pretrain with checkpoints, exact resume and receipts. Multi-process: "
                                   "torchrun --nproc_per_node=N -m glm53_flash.cli pretrain ...")
    p.add_argument("--output", required=True, help="run directory (must not exist unless --resume)")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--checkpoints", type=parse_steps, default=None,
                   help="comma-separated steps to checkpoint at; the last step always is "
                        "(default 100,200,400, those within --steps)")
    p.add_argument("--batch-size", type=int, default=32, help="global batch (split across ranks)")
    p.add_argument("--sequence-length", type=int, default=128)
    p.add_argument("--learning-rate", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=42, help="model initialisation seed")
    p.add_argument("--data-seed", type=int, default=42, help="seed of the pretraining stream (42 = the original's)")
    p.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    p.add_argument("--preset", choices=sorted(PRESETS), default="flash")
    p.add_argument("--warmup", type=int, default=0, help="linear warmup steps")
    p.add_argument("--schedule", choices=("constant", "cosine"), default="constant")
    p.add_argument("--weight-decay", type=float, default=0.1, help="applied to weight matrices only")
    p.add_argument("--resume", action="store_true", help="continue the run in --output from its last checkpoint")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--stream-mode", choices=STREAM_MODES, help="override the preset (ablations)")
    p.add_argument("--linear-rope", choices=LINEAR_ROPE_MODES, help="override the preset (ablations)")
    p.add_argument("--balance-loss", choices=BALANCE_LOSS_MODES, help="override the preset (ablations)")
    p.set_defaults(func=run_pretrain)
    register_rl(sub)
    register_select(sub)


def register_rl(sub) -> None:
    from .rl import EOS_HANDLING, LOGPROB_SOURCES, LOSS_NORMALIZATIONS, REWARD_MODES, STOP_RULES, TRAIN_SCOPES

    p = sub.add_parser("rl", help="RLOO post-training with executable (unit-test) reward",
                       description="RLOO from a pretraining checkpoint; rewards come only from running the "
                                   "hidden tests in the sandboxed verifier.")
    p.add_argument("--initial-checkpoint", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--groups", type=int, default=32, help="prompts (one group of samples each)")
    p.add_argument("--checkpoints", type=parse_steps, default=None,
                   help="groups to checkpoint after (default 8,16,32 within --groups; the last always is)")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--learning-rate", type=float, default=2e-5)
    p.add_argument("--train-scope", choices=TRAIN_SCOPES, default="all")
    p.add_argument("--reward-mode", choices=REWARD_MODES, default="case-fraction")
    p.add_argument("--invalid-penalty", type=float, default=-0.1)
    p.add_argument("--exact-bonus", type=float, default=0.0)
    p.add_argument("--families", default="", help="comma list (default: all eight)")
    p.add_argument("--tasks-per-family", type=int, default=4)
    p.add_argument("--seed", type=int, default=31415)
    p.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="refuse a checkpoint whose model is not this preset")
    p.add_argument("--logprob-source", choices=LOGPROB_SOURCES, default="sampler",
                   help="'untempered' = untempered, unmasked log-probs (the original's mismatch)")
    p.add_argument("--loss-normalization", choices=LOSS_NORMALIZATIONS, default="constant",
                   help="'sequence-mean' is the original's")
    p.add_argument("--eos-handling", choices=EOS_HANDLING, default="append",
                   help="'append': train parse-stopped completions with EOS; 'omit': without (the original)")
    p.add_argument("--stop", choices=STOP_RULES, default="parse", help="rollout stop rule ('parse' = original)")
    p.add_argument("--prompts-per-update", type=int, default=1, help="groups per optimizer step")
    p.add_argument("--kl-coef", type=float, default=0.0, help="KL penalty to the frozen initial policy")
    p.add_argument("--warmup", type=int, default=0, help="linear LR warmup, in updates")
    p.add_argument("--verifier-workers", type=int, default=None)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_rl)


def run_rl(args: argparse.Namespace) -> int:
    from .rl import RLConfig, train_rl

    checkpoints = args.checkpoints
    if checkpoints is None:
        checkpoints = tuple(c for c in (8, 16, 32) if c <= args.groups)
    cfg = RLConfig(
        initial_checkpoint=args.initial_checkpoint, output=args.output, groups=args.groups,
        checkpoints=checkpoints, group_size=args.group_size, max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, learning_rate=args.learning_rate, train_scope=args.train_scope,
        reward_mode=args.reward_mode, invalid_penalty=args.invalid_penalty, exact_bonus=args.exact_bonus,
        families=args.families, tasks_per_family=args.tasks_per_family, seed=args.seed, device=args.device,
        preset=args.preset, logprob_source=args.logprob_source, loss_normalization=args.loss_normalization,
        eos_handling=args.eos_handling, stop=args.stop, prompts_per_update=args.prompts_per_update,
        kl_coef=args.kl_coef, warmup=args.warmup, verifier_workers=args.verifier_workers, resume=args.resume,
        progress=not args.no_progress)
    receipt = train_rl(cfg)
    print(f"complete: {receipt['groups']} groups, {receipt['updated_groups']} reward-bearing updates, "
          f"{receipt['exact_training_rollouts']} exact rollouts, {receipt['elapsed_seconds']:.1f} s; "
          f"receipt {args.output}/training-receipt.json")
    return 0


def register_select(sub) -> None:
    p = sub.add_parser("select", help="evaluate every checkpoint of a run on dev and name the best",
                       description="Evaluates each checkpoint of a pretraining or RL run on a held-out split "
                                   "and names the best by a stated rule (ties go to the earlier checkpoint).")
    p.add_argument("--run", required=True, help="run directory with checkpoint-NNNN folders")
    p.add_argument("--split", default="dev", help="dev (default), final or confirm; never rl")
    p.add_argument("--samples", type=int, default=8, help="samples per task (1 = greedy)")
    p.add_argument("--per-family", type=int, default=4)
    p.add_argument("--families", default=None, help="comma list (default: the run's families)")
    p.add_argument("--temperature", type=float, default=0.35)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=8675309)
    p.add_argument("--device", choices=DEVICE_CHOICES, default="cpu")
    p.add_argument("--output", default=None, help="selection receipt (default RUN/selection-SPLIT.json)")
    p.add_argument("--force", action="store_true", help="replace an existing selection receipt")
    p.set_defaults(func=run_select)


def run_select(args: argparse.Namespace) -> int:
    from .select import select_checkpoint

    result = select_checkpoint(args.run, split=args.split, samples=args.samples, per_family=args.per_family,
                               families=args.families, temperature=args.temperature,
                               max_new_tokens=args.max_new_tokens, seed=args.seed, device=args.device,
                               output=args.output, force=args.force)
    best = result["selected"]
    print(f"selected {best['checkpoint']} (score {best['score']}; rule: {result['rule']})")
    return 0


def run_pretrain(args: argparse.Namespace) -> int:
    from .pretrain import PretrainConfig, TrainingDiverged, pretrain

    overrides = {k: v for k, v in (("stream_mode", args.stream_mode), ("linear_rope", args.linear_rope),
                                   ("balance_loss", args.balance_loss)) if v is not None}
    checkpoints = args.checkpoints
    if checkpoints is None:
        checkpoints = tuple(c for c in (100, 200, 400) if c <= args.steps)
    cfg = PretrainConfig(
        output=args.output, steps=args.steps, checkpoints=checkpoints, batch_size=args.batch_size,
        sequence_length=args.sequence_length, learning_rate=args.learning_rate, seed=args.seed,
        data_seed=args.data_seed, device=args.device, preset=args.preset, warmup=args.warmup,
        schedule=args.schedule, weight_decay=args.weight_decay, resume=args.resume, compile=args.compile,
        progress=not args.no_progress, model_overrides=overrides)
    try:
        receipt = pretrain(cfg)
    except TrainingDiverged as error:
        print(f"glm53 pretrain: error: {error}", file=sys.stderr)
        return 1
    if receipt:
        last = receipt["training_curve"][-1] if receipt["training_curve"] else {}
        print(f"complete: {receipt['tokens_seen']:,} tokens in {receipt['elapsed_seconds']:.1f} s, "
              f"final loss {last.get('loss', float('nan')):.4f}; receipt {args.output}/training-receipt.json")
    return 0
