"""CLI registration for `glm53 pretrain`, `glm53 rl` and `glm53 select`: the first two generate their
flags from PretrainConfig and RLConfig (options.py), so a knob is declared once."""

from __future__ import annotations

import argparse
import sys

from glm53_flash.model.config import BALANCE_LOSS_MODES, LINEAR_ROPE_MODES, STREAM_MODES, ModelConfig
from glm53_flash.core.options import add_arguments, from_arguments, given_options


# The ModelConfig fields `glm53 pretrain` may override (ablations); each is a flag of its own,
# collected into PretrainConfig.model_overrides.
MODEL_OVERRIDE_FIELDS = {
    "stream_mode": ("how block outputs enter the residual streams", STREAM_MODES),
    "linear_rope": ("RoPE in the linear-attention layers", LINEAR_ROPE_MODES),
    "balance_loss": ("form of the expert-balance loss", BALANCE_LOSS_MODES),
    "balance_loss_weight": ("weight of the expert-balance loss in the objective", None),
}


def register(sub) -> None:
    """`glm53 pretrain`, `glm53 rl`, `glm53 select`: each one config dataclass, its flags generated."""
    from glm53_flash.train.config import PretrainConfig, RLConfig, SelectConfig

    pretrain = _add_command(
        sub, "pretrain", PretrainConfig, run_pretrain,
        "pretrain from random weights on the generated task corpus",
        "Pretrain with checkpoints, exact resume and receipts. Multi-process: "
        "torchrun --nproc_per_node=N -m glm53_flash.cli pretrain ...")
    defaults = ModelConfig()
    for name, (text, choices) in MODEL_OVERRIDE_FIELDS.items():
        pretrain.add_argument("--" + name.replace("_", "-"), dest=name, choices=choices,
                              type=type(getattr(defaults, name)),
                              help=f"{text}; overrides the preset (default: the preset's, "
                                   f"{getattr(defaults, name)} for flash)")
    _add_command(sub, "rl", RLConfig, run_rl, "RLOO post-training with executable (unit-test) reward",
                 "RLOO from a pretraining checkpoint; rewards come only from running the hidden tests in the "
                 "sandboxed verifier. Multi-process: torchrun --nproc_per_node=N -m glm53_flash.cli rl ... "
                 "(each rank trains whole groups of every update: --prompts-per-update at least N).")
    _add_command(sub, "select", SelectConfig, run_select,
                 "evaluate every checkpoint of a run on dev and name the best",
                 "Evaluates each checkpoint of a pretraining or RL run on a held-out split and names the best "
                 "by a stated rule (ties go to the earlier checkpoint).")


def _add_command(sub, name: str, config_type, func, help_text: str, description: str) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help_text, description=description)
    add_arguments(parser, config_type)
    add_no_progress_alias(parser)
    parser.set_defaults(func=func)
    return parser


def add_no_progress_alias(parser: argparse.ArgumentParser) -> None:
    """`--no-progress`, the older spelling of `--quiet`, where a command has a quiet field."""
    if any(action.dest == "quiet" for action in parser._actions):
        parser.add_argument("--no-progress", dest="quiet", action="store_true", help="same as --quiet")


def run_rl(args: argparse.Namespace) -> int:
    from glm53_flash.train.rl_run import RLConfig, train_rl

    receipt = train_rl(from_arguments(RLConfig, args))
    if not receipt:  # a rank other than 0 under torchrun: rank 0 reports
        return 0
    print(f"complete: {receipt['groups']} groups, {receipt['updated_groups']} reward-bearing updates, "
          f"{receipt['exact_training_rollouts']} exact rollouts, {receipt['elapsed_seconds']:.1f} s; "
          f"receipt {args.output}/training-receipt.json")
    return 0


def run_select(args: argparse.Namespace) -> int:
    from glm53_flash.train.config import SelectConfig
    from glm53_flash.train.select import format_score
    from glm53_flash.train.select import select_from_config

    result = select_from_config(from_arguments(SelectConfig, args))
    best = result["selected"]
    sampled = result["inference"]["samples"] > 1
    print(f"selected {best['checkpoint']} ({format_score(best['score'], sampled)}; rule: {result['rule']})")
    if result.get("tie_of_zeros"):
        print(f"note: {result['tie_of_zeros']}")
    return 0


def run_pretrain(args: argparse.Namespace) -> int:
    from glm53_flash.train.pretrain import PretrainConfig, TrainingDiverged, pretrain, resumed_config

    overrides = {name: getattr(args, name) for name in MODEL_OVERRIDE_FIELDS if getattr(args, name) is not None}
    cfg = from_arguments(PretrainConfig, args, model_overrides=overrides)
    # --resume continues with the run's own settings: the flags given are those to hold it to
    cfg = resumed_config(cfg, given_options(args) | ({"model_overrides"} if overrides else set()))
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
