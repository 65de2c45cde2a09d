"""CLI registration for `glm53 vision train | pilot | predict | render | report`.

Handlers only map flags onto library calls and print; torch is imported inside them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from glm53_flash.core.options import add_arguments, config_record, from_arguments
from glm53_flash.core.runtime import DEFAULT_DEVICE, DEVICE_CHOICES
from glm53_flash.vision.run_config import PilotCommandConfig, PilotConfig, VisionTrainCommandConfig, VisionTrainConfig
from glm53_flash.commands.train import add_no_progress_alias

RECEIPT_FILE = "receipt.json"
WEIGHTS_DIR = "weights"


def register(sub) -> None:
    vision = sub.add_parser("vision", help="the miniature vision path: train, pilot, predict, report",
                            description="A GLM-style vision encoder (and a direct-patch baseline) reading "
                                        "generated seven-segment RGB digits.")
    vision_sub = vision.add_subparsers(dest="vision_command", metavar="ACTION")
    vision.set_defaults(func=lambda args: (vision.print_help(), 2)[1])
    _add_train(vision_sub)
    _add_pilot(vision_sub)
    _add_predict(vision_sub)
    _add_render(vision_sub)
    _add_report(vision_sub)


def _output_dir(path: str | None) -> Path | None:
    if path is None:
        return None
    out = Path(path)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"--output {out} already exists; choose a new directory")
    return out


# --------------------------------------------------------------------------- train


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train the faithful miniature and/or the direct-patch baseline",
                       description="Trains each architecture on generated RGB digits from the same seed reset "
                                   "and batches; with several seeds and both architectures, prints the paired "
                                   "comparison.")
    add_arguments(p, VisionTrainCommandConfig)  # --architecture, --output, --save-weights, --quiet
    add_arguments(p, VisionTrainConfig)
    add_no_progress_alias(p)
    p.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    from glm53_flash.core.receipts import write_json
    from glm53_flash.vision.analysis import compare_architectures
    from glm53_flash.vision.training import run_vision_training

    command_cfg = from_arguments(VisionTrainCommandConfig, args)
    out = _output_dir(command_cfg.output)
    if command_cfg.save_weights and out is None:
        raise ValueError("--save-weights needs --output")
    architectures = command_cfg.architectures()
    cfg = from_arguments(VisionTrainConfig, args, architectures=architectures, progress=not command_cfg.quiet)
    cfg.validate()  # before anything is created on disk
    on_model = None
    if command_cfg.save_weights:
        from glm53_flash.vision.weights import save_vision_model

        def on_model(result, model):
            name = f"{result['architecture']}-seed{result['seed']}"
            return save_vision_model(out / WEIGHTS_DIR / name, model,
                                     {"seed": result["seed"], "held_out_accuracy": result["after"]["accuracy"]})

    command = canonical_command(args, "train", ("architecture", "seeds", "steps", "batch_size", "learning_rate",
                                                "eval_examples", "smoke_test", "device", "threads", "output"))
    receipt = run_vision_training(cfg, None, on_model)
    receipt["command"] = command
    receipt["run_config"] = config_record(cfg) | config_record(command_cfg)
    for r in receipt["results"]:
        print(f"{r['architecture']:>9} seed {r['seed']}: {r['parameter_count']:,} params, held-out "
              f"{r['before']['correct']}/{r['before']['examples']} -> {r['after']['correct']}/{r['after']['examples']}, "
              f"loss {r['before']['loss']:.4f} -> {r['after']['loss']:.4f}, {r['wall_time_seconds']:.2f} s")
    comparison = compare_architectures(receipt) if len(architectures) == 2 else None
    if comparison:
        pooled = comparison["pooled"]
        print(f"faithful - baseline: {100 * comparison['mean_difference']:+.1f} points over "
              f"{len(comparison['seeds'])} seed(s); sign-flip p {comparison['sign_flip_p']:.4g}; pooled only-faithful "
              f"{pooled['only_faithful_correct']} / only-baseline {pooled['only_baseline_correct']} "
              f"(McNemar p {pooled['mcnemar_p']:.4g})")
    if out is not None:
        receipt["comparison"] = comparison
        write_json(out / RECEIPT_FILE, receipt)
        print(f"receipt {out / RECEIPT_FILE} ({receipt['total_wall_time_seconds']:.1f} s)")
    return 0


def canonical_command(args: argparse.Namespace, action: str, flags: tuple[str, ...]) -> list[str]:
    """The command with every run-shaping flag spelled out (what the report prints to reproduce a run)."""
    words = ["glm53", "vision", action]
    for flag in flags:
        value = getattr(args, flag)
        option = "--" + flag.replace("_", "-")
        if isinstance(value, bool):
            words += [option] if value else []
        elif value is not None:
            words += [option, ",".join(map(str, value)) if isinstance(value, tuple) else str(value)]
    return words


# --------------------------------------------------------------------------- pilot


def _add_pilot(sub) -> None:
    p = sub.add_parser("pilot", help="the 25.7M language model from a pretraining checkpoint reads digits",
                       description="Extends the checkpoint's model with the image ids (vocab 263), adds the GLM-style "
                                   "encoder and trains only the encoder, the last block, the final norm and the "
                                   "embedding. Exit code 1 if held-out accuracy did not rise above before and chance.")
    add_arguments(p, PilotConfig)
    add_arguments(p, PilotCommandConfig)  # --output, --save-weights, --quiet
    add_no_progress_alias(p)
    p.set_defaults(func=run_pilot_command)


def run_pilot_command(args: argparse.Namespace) -> int:
    from glm53_flash.core.receipts import write_json
    from glm53_flash.vision.pilot import run_pilot

    command_cfg = from_arguments(PilotCommandConfig, args)
    out = _output_dir(command_cfg.output)
    cfg = from_arguments(PilotConfig, args, progress=not command_cfg.quiet)
    cfg.validate()
    if cfg.checkpoint is not None and not Path(cfg.checkpoint).is_dir():
        raise FileNotFoundError(f"--checkpoint {cfg.checkpoint} is not a directory")
    on_model = None
    if command_cfg.save_weights:
        from glm53_flash.vision.weights import save_vision_model

        def on_model(model):
            return save_vision_model(out / WEIGHTS_DIR, model, {"seed": cfg.seed, "pilot": True})

    command = canonical_command(args, "pilot", ("checkpoint", "steps", "batch_size", "learning_rate",
                                                "eval_examples", "seed", "max_seconds", "device", "output"))
    receipt = run_pilot(cfg, None, on_model)
    receipt["command"] = command
    receipt["run_config"] = config_record(cfg) | config_record(command_cfg)
    write_json(out / RECEIPT_FILE, receipt)
    before, after, opt = receipt["before"], receipt["after"], receipt["optimization"]
    print(f"pilot: {receipt['model']['trainable_parameters']:,} of {receipt['model']['total_multimodal_parameters']:,} "
          f"parameters trained, {opt['completed_steps']} steps ({opt['stop_reason']}), held-out "
          f"{before['correct']}/{before['examples']} -> {after['correct']}/{after['examples']}, "
          f"CE {before['loss']:.4f} -> {after['loss']:.4f}, {opt['train_seconds']:.1f} s; receipt {out / RECEIPT_FILE}")
    if not receipt["learned_at_all"]:
        print("pilot: held-out accuracy did not rise above max(before, chance)")
        return 1
    return 0


# --------------------------------------------------------------------------- predict / render


def _add_predict(sub) -> None:
    p = sub.add_parser("predict", help="name the digit in an image file with a saved vision model",
                       description="Resizes any RGB image to the model's 32x32 input and prints the predicted digit.")
    p.add_argument("--weights", required=True, help="a directory written with --save-weights")
    p.add_argument("image", help="image file (PNG, JPEG, ...)")
    p.add_argument("--device", choices=DEVICE_CHOICES, default=DEFAULT_DEVICE)
    p.add_argument("--json", action="store_true", help="print the prediction and its top-3 ids as JSON")
    p.set_defaults(func=run_predict)


def run_predict(args: argparse.Namespace) -> int:
    from glm53_flash.core.runtime import resolve_device
    from glm53_flash.vision.predict import load_image, predict_digit
    from glm53_flash.vision.weights import load_vision_model

    model, config = load_vision_model(args.weights, resolve_device(args.device))
    result = predict_digit(model, load_image(args.image, config["image_size"]))
    if args.json:
        print(json.dumps(result, sort_keys=True))
    elif result["digit"] is None:
        print(f"no digit (predicted id {result['token_id']}, {result['text']!r}, p={result['probability']:.3f})")
    else:
        print(result["digit"])
    return 0


def _add_render(sub) -> None:
    p = sub.add_parser("render", help="draw one generated seven-segment digit to an image file",
                       description="Draw one generated seven-segment digit (the vision task's images) to an image "
                                   "file, for `glm53 vision predict` or to look at.")
    p.add_argument("digit", type=int, help="0-9")
    p.add_argument("path", help="output image file (.png)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=run_render)


def run_render(args: argparse.Namespace) -> int:
    from glm53_flash.vision.digits import render_digits
    from glm53_flash.vision.predict import save_image

    if Path(args.path).exists() and not args.force:
        raise FileExistsError(f"{args.path} already exists; pass --force to overwrite it")
    save_image(render_digits([args.digit], args.seed)[0], args.path)
    print(args.path)
    return 0


# --------------------------------------------------------------------------- report


def _add_report(sub) -> None:
    p = sub.add_parser("report", help="summary.json, REPORT.md and a chart from vision receipts",
                       description="Build summary.json, REPORT.md and a chart from the receipts of `glm53 vision "
                                   "train` (and optionally `pilot`); every figure comes from them.")
    p.add_argument("--train", required=True, help="receipt.json of `glm53 vision train` (both architectures)")
    p.add_argument("--pilot", help="receipt.json of `glm53 vision pilot`")
    p.add_argument("--output", default="results/vision")
    p.add_argument("--force", action="store_true", help="rebuild an existing report")
    p.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    from glm53_flash.vision.report import build_vision_report

    summary = build_vision_report(args.train, args.pilot, args.output, force=args.force)
    for answer in summary["answers"]:
        print(f"- {answer}")
    print(f"report {args.output}/REPORT.md")
    return 0
