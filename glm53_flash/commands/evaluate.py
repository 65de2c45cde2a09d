"""CLI glue for sampling and evaluation: `glm53 generate`, `eval`, `compare` and `bench decode`.

Handlers only read flags, call library functions and print; torch is imported inside them so that
registering these commands keeps `glm53 --help` fast.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from glm53_flash.evaluation.config import (EVAL_STOP_CHOICES, GREEDY_SEED, SAMPLED_SEED, SAMPLING_TEMPERATURE,
                                           EvalConfig)
from glm53_flash.core.options import add_arguments, from_arguments
from glm53_flash.core.runtime import DEFAULT_DEVICE, DEVICE_CHOICES, PRECISION_HELP, PRECISIONS

STOP_CHOICES = EVAL_STOP_CHOICES


def register(sub) -> None:
    """`glm53 generate`, `glm53 eval`, `glm53 compare`."""
    _add_generate(sub)
    _add_eval(sub)
    _add_compare(sub)


# --------------------------------------------------------------------------- shared flags


def _add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=None,
                        help=f"sampling temperature (> 0); default: greedy for one sample, {SAMPLING_TEMPERATURE} for several")
    parser.add_argument("--top-k", type=int, default=None, help="sample only among the k most likely tokens")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus sampling: keep this much probability")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="cap on generated tokens (default 48)")
    parser.add_argument("--batch-rows", type=int, default=512, help="most rows in one forward (default 512)")
    parser.add_argument("--device", choices=DEVICE_CHOICES, default=DEFAULT_DEVICE)
    parser.add_argument("--precision", choices=PRECISIONS, default=None,
                        help=PRECISION_HELP + " (default: fp32 on the CPU, bf16 autocast on CUDA)")


def _refuse_existing(path: str | None, force: bool, flag: str) -> None:
    if path and Path(path).exists() and not force:
        raise FileExistsError(f"{flag} {path} already exists; pass --force to overwrite it")


def _load_model(checkpoint: str, device_name: str):
    from glm53_flash.core.runtime import resolve_device
    from glm53_flash.model.lm import load_pretrained

    device = resolve_device(device_name)
    model, metadata = load_pretrained(checkpoint, device)
    return model, metadata


# --------------------------------------------------------------------------- glm53 generate


def _add_generate(sub) -> None:
    parser = sub.add_parser(
        "generate", help="continue a prompt (or a frozen task) with a checkpoint",
        description="Generate one or more continuations. With --task-id the task's prompt is used and "
                    "generation stops once the program parses (the original's rule); with --prompt it "
                    "stops at EOS.")
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text (use $'...' in bash for newlines)")
    source.add_argument("--prompt-file", metavar="PATH",
                        help="read the prompt from this UTF-8 file, or from standard input with '-' (no shell "
                             "quoting, no argument-length limit)")
    source.add_argument("--task-id", help="a frozen task id, e.g. dev-double-000")
    parser.add_argument("--samples", type=int, default=1, help="continuations to draw (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--stop", choices=STOP_CHOICES, default=None,
                        help="parse (needs --task-id), eos, or none (run to the cap); default parse for a "
                             "task, eos for a prompt")
    _add_sampling_flags(parser)
    parser.add_argument("--json", action="store_true", help="print the completions as JSON")
    parser.set_defaults(func=_run_generate)


def _resolve_temperature(value: float | None, samples: int) -> float:
    from glm53_flash.evaluation.evaluate import SAMPLED_DEFAULTS

    if value is None:
        return 0.0 if samples == 1 else SAMPLED_DEFAULTS["temperature"]
    return value


def _read_prompt_file(path: str) -> str:
    """The prompt of --prompt-file: a UTF-8 file, or standard input for '-', read whole (at most a few
    times the prompt limit, so a wrong file is refused before it fills memory)."""
    import sys

    from glm53_flash.data.tokenizer import MAX_PROMPT_CHARS

    most = 4 * MAX_PROMPT_CHARS + 1
    try:
        if path == "-":
            data = sys.stdin.buffer.read(most)
        else:
            with open(path, "rb") as handle:
                data = handle.read(most)
    except OSError as error:
        raise ValueError(f"--prompt-file {path}: {error.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"--prompt-file {path} is not UTF-8 text (byte {error.start + 1})") from None


def _run_generate(args) -> int:
    from glm53_flash.evaluation.sampling import SamplingSettings, generate
    from glm53_flash.evaluation.stop import coding_stop
    from glm53_flash.tasks import task_by_id

    task = task_by_id(args.task_id) if args.task_id else None
    stop = args.stop or ("parse" if task else "eos")
    if stop == "parse" and task is None:
        raise ValueError("--stop parse needs --task-id (the parse rule checks the task's program)")
    if args.prompt_file is not None:
        args.prompt = _read_prompt_file(args.prompt_file)
    if task is None:
        from glm53_flash.data.tokenizer import check_prompt  # the playground's rules too, so both refuse the same prompts

        check_prompt(args.prompt)
    prompt = task.prompt if task else args.prompt
    from glm53_flash.model.precision import resolve_precision

    model, _ = _load_model(args.checkpoint, args.device)
    precision = resolve_precision(args.precision, next(model.parameters()).device)
    settings = SamplingSettings(samples=args.samples, max_new_tokens=args.max_new_tokens,
                                temperature=_resolve_temperature(args.temperature, args.samples), top_k=args.top_k,
                                top_p=args.top_p, seed=args.seed, keys=(task.task_id,) if task else None,
                                stop=coding_stop([task], stop) if task else stop, batch_rows=args.batch_rows,
                                precision=precision)
    rows = generate(model, [prompt], settings)[0]
    if args.json:
        print(json.dumps([c.to_dict() for c in rows], indent=2))
        return 0
    print(prompt, end="" if prompt.endswith("\n") else "\n")
    for i, completion in enumerate(rows):
        mean = sum(completion.logprobs) / len(completion.logprobs)
        print(f"--- sample {i}: {len(completion.token_ids)} tokens, stopped by {completion.finish_reason}, "
              f"mean log-prob {mean:.3f}")
        print(completion.text)
    return 0


# --------------------------------------------------------------------------- glm53 eval


def _add_eval(sub) -> None:
    parser = sub.add_parser(
        "eval", help="greedy pass@1 or sampled pass@k on a frozen split, written as a receipt",
        description="Evaluate a checkpoint on frozen tasks: greedy when --samples is 1 (defaults: per-family 4, "
                    f"seed {GREEDY_SEED}), sampled otherwise (defaults: per-family 8, temperature {SAMPLING_TEMPERATURE}, seed {SAMPLED_SEED}). "
                    "Every program is also judged on its family's strong test set (pass rates under both and "
                    "the false passes). The rl split is for training and cannot be evaluated; final, confirm "
                    "and holdout are sealed: they need --open-sealed PURPOSE, and each receipt from one is "
                    "recorded in the ledger (glm53 ledger).")
    add_arguments(parser, EvalConfig)
    parser.set_defaults(func=_run_eval)


def _run_eval(args) -> int:
    from glm53_flash.core.options import config_record
    from glm53_flash.core.receipts import write_json
    from glm53_flash.evaluation import ledger
    from glm53_flash.evaluation.evaluate import eval_task_ids, eval_tasks, format_summary, run_eval

    args = from_arguments(EvalConfig, args)  # the same names, now checked against the dataclass
    _refuse_existing(args.output, args.force, "--output")
    ledger.check_opening_request(args.split, args.open_sealed, args.reopen)  # before anything is loaded
    cfg = args.resolved()
    model, metadata = _load_model(cfg.checkpoint, cfg.device)
    opening = None
    if ledger.is_sealed(cfg.split):
        from glm53_flash.model.precision import resolve_precision

        precision = resolve_precision(cfg.precision, next(model.parameters()).device).setting
        plan = ledger.evaluation_plan_sha256(
            checkpoint_sha256=metadata.get("weights_sha256"), split=cfg.split,
            task_ids=eval_task_ids(cfg), samples=cfg.samples, seed=cfg.seed,
            temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
            stop=cfg.stop, precision=precision)
        opening = ledger.require_open(cfg.split, cfg.open_sealed, plan_sha256=plan, reopen=cfg.reopen,
                                      ledger=cfg.ledger, decision=() if cfg.decision is None else (cfg.decision,),
                                      allow_dirty=cfg.allow_dirty)
    tasks = eval_tasks(cfg, opening)  # a sealed split's only now: its opened line is written first
    try:
        receipt = run_eval(cfg, model=model, checkpoint_sha256=metadata.get("weights_sha256"), opening=opening,
                           tasks=tasks)
        receipt["run_config"] = config_record(args)
        if opening is None:
            write_json(cfg.output, receipt)
        else:
            line = opening.write_receipt(cfg.output, receipt)
    finally:
        if opening is not None:
            opening.close()
    print(format_summary(receipt))
    print(f"wrote {cfg.output}")
    if opening is not None:
        print(f"ledger: opening of {cfg.split} recorded in {opening.ledger} (receipt sha256 "
              f"{line['receipt_sha256'][:16]})")
    return 0


# --------------------------------------------------------------------------- glm53 compare


def _add_compare(sub) -> None:
    parser = sub.add_parser(
        "compare", help="paired per-task comparison of two eval receipts on the same tasks",
        description="Gains, losses and exact McNemar p on solved tasks; a task-bootstrap CI of the pass-rate "
                    "difference; per family (Holm-adjusted) and overall. Receipts must cover the same tasks.")
    parser.add_argument("before", help="receipt of the baseline")
    parser.add_argument("after", help="receipt of the candidate")
    parser.add_argument("--families", default="", help="compare only these families (comma list)")
    parser.add_argument("--output", default=None, help="write the comparison as JSON here")
    parser.add_argument("--markdown", default=None, help="write the markdown table here as well")
    parser.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    parser.add_argument("--seed", type=int, default=20260826, help="bootstrap seed (default 20260826)")
    parser.add_argument("--level", type=float, default=0.95, help="confidence level (default 0.95)")
    parser.add_argument("--force", action="store_true", help="overwrite --output / --markdown")
    parser.set_defaults(func=_run_compare)


def _run_compare(args) -> int:
    from glm53_flash.evaluation.compare import compare_receipts, format_markdown, load_receipt
    from glm53_flash.core.receipts import write_text
    from glm53_flash.core.receipts import provenance, write_json
    from glm53_flash.tasks import parse_families

    _refuse_existing(args.output, args.force, "--output")
    _refuse_existing(args.markdown, args.force, "--markdown")
    families = parse_families(args.families) if args.families else None
    result = compare_receipts(load_receipt(args.before), load_receipt(args.after), families=families,
                              level=args.level, resamples=args.resamples, seed=args.seed,
                              labels=(str(args.before), str(args.after)))
    markdown = format_markdown(result)
    print(markdown, end="")
    if args.output:
        result["provenance"] = provenance()
        write_json(args.output, result)
        print(f"wrote {args.output}")
    if args.markdown:
        write_text(args.markdown, markdown)
        print(f"wrote {args.markdown}")
    return 0
