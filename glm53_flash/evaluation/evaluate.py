"""Evaluation on frozen tasks: greedy pass@1 and sampled pass@k, written as receipts.

Receipt keys match the original's evaluate / evaluate_passk receipts (seed-core 7.3, 7.4); added:
`pass_at_k` (the unbiased estimator for every k <= samples), `timing`, `provenance`, the strong
tests (every program is also judged on its family's strong test set, `tasks.strong_cases`: per
episode or sample `strong_tests_passed` / `strong_tests_total`; pass rates under the strong set and
the false passes, programs that pass the three cases but not the strong set), on a compositions split
the strict set too (tasks/strict.py: a program that passes the three cases and the strong set is
judged once more on it; `strict_passed`, pass rates and false passes under it beside the strong
ones, `inference.strict_tests`) and `sealed_opening` (the ledger opening a sealed split was evaluated
under, None otherwise). Tasks run in batches through the cached sampler, and each batch is judged by
one sandboxed `evaluate_many` call (the three-case verdicts and the strong ones together; a program's
strong cases run in one execution), then its strong passes on their strict sets.

A sealed split (final, confirm, holdout) is evaluated only under an opening from
`ledger.require_open`: passed as `opening=`, or the one granted last in this process.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from glm53_flash.evaluation import ledger
from glm53_flash.evaluation.config import GREEDY_DEFAULTS, SAMPLED_DEFAULTS, EvalConfig  # noqa: F401 - re-exported
from glm53_flash.evaluation.sampling import DEFAULT_BATCH_ROWS, Completion, SamplingSettings, generate
from glm53_flash.core.stats import pass_at_k
from glm53_flash.evaluation.stop import coding_stop
from glm53_flash.tasks import EVAL_SPLITS, families_of, family_order, strict, strong_cases_record, strong_task, suite_of
from glm53_flash.data.tokenizer import ByteTokenizer

SCHEMA_VERSION = "1.0"
# The training splits (rl, compositions.rl) are never evaluated; the sealed splits need an opening
# (ledger.py). EVAL_SPLITS comes from tasks: dev, final, confirm, holdout and the compositions suite's.
# GREEDY_DEFAULTS and SAMPLED_DEFAULTS are declared (torch-free) with EvalConfig in evaluation/config.py.


def generate_for_tasks(model, tasks, *, stop: str = "parse", progress=None, governor=None,
                       **settings) -> list[list[Completion]]:
    """`sampling.generate` on coding tasks: prompt = task.prompt, random streams keyed by task_id,
    and the coding stop rule ('parse', the default; 'eos' and 'none' as in `generate`); `settings` are
    the other fields of `SamplingSettings`."""
    tasks = list(tasks)
    settings = SamplingSettings(keys=tuple(t.task_id for t in tasks), stop=coding_stop(tasks, stop), **settings)
    return generate(model, [t.prompt for t in tasks], settings, progress=progress, governor=governor)


def split_of(tasks: Sequence) -> str:
    """The one split all tasks come from (task ids are '<split>-<unit>-<NNN>'); refuses the training
    splits."""
    if not tasks:
        raise ValueError("no tasks to evaluate")
    splits = sorted({task.task_id.partition("-")[0] for task in tasks})
    if len(splits) != 1:
        raise ValueError(f"tasks come from several splits ({', '.join(splits)}); evaluate one split at a time")
    split = splits[0]
    if split not in EVAL_SPLITS:
        raise ValueError(f"split {split!r} cannot be evaluated; allowed: {', '.join(EVAL_SPLITS)} "
                         f"(the rl splits are for training)")
    return split


def families_field(tasks: Sequence) -> list[str] | str:
    """The receipt's `inference.families`: "all" or the families present, in canonical order."""
    present = {task.family for task in tasks}
    every = families_of(suite_of(split_of(tasks))) if tasks else ()
    return "all" if present == set(every) else family_order(present)


def _unit_fields(task) -> dict:
    """What an episode records of its task's behaviour: the unit of analysis (tasks that share it are
    one unit), its structure and its kind (seen, new-constants, unseen-structure)."""
    return {"unit": task.unit, "structure": task.structure, "kind": task.kind}


def units_summary(tasks: Sequence) -> dict:
    """The units an evaluation covers: how many (the analysis counts these, not the tasks) and how many
    of each kind."""
    kinds: dict[str, set] = {}
    for task in tasks:
        kinds.setdefault(task.kind, set()).add(task.unit)
    return {"units": len({task.unit for task in tasks}),
            "units_by_kind": {kind: len(units) for kind, units in sorted(kinds.items())}}


def by_kind(episodes: Sequence[dict]) -> dict:
    """Results per kind of task (what a task's behaviour was to the pretrained model): tasks, units,
    and greedy solved (and under the strong set) or sampled exact rollouts and tasks solved at k."""
    rows: dict[str, dict] = {}
    units: dict[str, set] = {}
    for episode in episodes:
        kind = episode.get("kind") or "seen"
        row = rows.setdefault(kind, {"tasks": 0})
        units.setdefault(kind, set()).add(episode.get("unit"))
        row["tasks"] += 1
        if "samples" in episode:
            row["tasks_solved_at_k"] = row.get("tasks_solved_at_k", 0) + int(episode["solved_at_k"])
            row["exact_rollouts"] = row.get("exact_rollouts", 0) + episode["passed_samples"]
            row["rollouts"] = row.get("rollouts", 0) + len(episode["samples"])
            if "passed_samples_strong" in episode:
                row["exact_rollouts_strong"] = row.get("exact_rollouts_strong", 0) + episode["passed_samples_strong"]
            if "passed_samples_strict" in episode:
                row["exact_rollouts_strict"] = row.get("exact_rollouts_strict", 0) + episode["passed_samples_strict"]
        else:
            row["solved"] = row.get("solved", 0) + int(episode["evaluation"]["passed"])
            if "strong_passed" in episode:
                row["solved_strong"] = row.get("solved_strong", 0) + int(episode["strong_passed"])
            if "strict_passed" in episode:
                row["solved_strict"] = row.get("solved_strict", 0) + int(episode["strict_passed"])
    for kind, row in rows.items():
        row["units"] = len(units[kind])
    return dict(sorted(rows.items()))


def evaluate_greedy(
    model,
    tasks: Sequence,
    *,
    max_new_tokens: int = GREEDY_DEFAULTS["max_new_tokens"],
    stop: str = "parse",
    seed: int = GREEDY_DEFAULTS["seed"],
    verifier=None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    checkpoint: str | None = None,
    checkpoint_sha256: str | None = None,
    progress: bool = False,
    opening: "ledger.Opening | None" = None,
    precision: str | None = None,
    adapt_threads: bool = False,
) -> dict:
    """Greedy pass@1 receipt (the original's evaluate.py). `seed` is recorded only: greedy decoding
    uses no randomness. A Verifier is created (and closed) when none is given. A sealed split needs
    an opening (ledger.require_open). `precision`: fp32, bf16 or auto (model/precision.py; None: the
    device's default, which stays out of the receipt's inference settings so that receipts compare).
    `adapt_threads`: on the CPU, a ThreadGovernor follows the free cores during decoding (the receipt's
    timing says how often it changed the count)."""
    inference = {"greedy": True, "max_new_tokens": max_new_tokens, "seed": seed, "families": families_field(tasks),
                 "stop": stop, "batch_rows": batch_rows, "strong_tests": strong_cases_record(tasks),
                 **_strict_record(tasks)}
    opening = ledger.opening_for(split_of(tasks), opening)  # a sealed split refused before the model is touched
    resolved = _resolve_precision(model, precision, inference)
    completions, evaluations, strong, strict_rows, timing = _run(
        model, tasks, samples=1, temperature=0.0, top_k=None, top_p=None, max_new_tokens=max_new_tokens, stop=stop,
        seed=seed, verifier=verifier, batch_rows=batch_rows, progress=progress, sealed=opening is not None,
        precision=resolved, adapt_threads=adapt_threads)
    receipt = greedy_receipt(tasks, [c[0] for c in completions], [e[0] for e in evaluations], inference,
                             strong_evaluations=[e[0] for e in strong],
                             strict_passed=None if strict_rows is None else [row[0] for row in strict_rows])
    return _finish(receipt, model, checkpoint, checkpoint_sha256, timing, opening, resolved)


def evaluate_sampled(
    model,
    tasks: Sequence,
    *,
    samples: int = SAMPLED_DEFAULTS["samples"],
    temperature: float = SAMPLED_DEFAULTS["temperature"],
    top_k: int | None = None,
    top_p: float | None = None,
    max_new_tokens: int = SAMPLED_DEFAULTS["max_new_tokens"],
    stop: str = "parse",
    seed: int = SAMPLED_DEFAULTS["seed"],
    verifier=None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    checkpoint: str | None = None,
    checkpoint_sha256: str | None = None,
    progress: bool = False,
    opening: "ledger.Opening | None" = None,
    precision: str | None = None,
    adapt_threads: bool = False,
) -> dict:
    """Sampled pass@k receipt (the original's evaluate_passk.py) plus the unbiased pass@k. A sealed
    split needs an opening (ledger.require_open). `precision` and `adapt_threads` as in evaluate_greedy.

    Sample i of a task uses the random stream (seed, task_id, i), so a task's samples do not change
    when other tasks or families are added (the original seeded by position in the filtered list).
    """
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"sampled evaluation needs temperature > 0, got {temperature!r}")
    inference = {"samples_per_task": samples, "temperature": temperature, "max_new_tokens": max_new_tokens,
                 "seed": seed, "families": families_field(tasks), "stop": stop, "top_k": top_k, "top_p": top_p,
                 "batch_rows": batch_rows, "seed_scheme": "sha256(seed, task_id, sample) -> Gumbel-max stream",
                 "strong_tests": strong_cases_record(tasks), **_strict_record(tasks)}
    opening = ledger.opening_for(split_of(tasks), opening)  # a sealed split refused before the model is touched
    resolved = _resolve_precision(model, precision, inference)
    completions, evaluations, strong, strict_rows, timing = _run(
        model, tasks, samples=samples, temperature=temperature, top_k=top_k, top_p=top_p,
        max_new_tokens=max_new_tokens, stop=stop, seed=seed, verifier=verifier, batch_rows=batch_rows,
        progress=progress, sealed=opening is not None, precision=resolved, adapt_threads=adapt_threads)
    receipt = sampled_receipt(tasks, completions, evaluations, inference, strong_evaluations=strong,
                              strict_passed=strict_rows)
    return _finish(receipt, model, checkpoint, checkpoint_sha256, timing, opening, resolved)


def _strict_record(tasks: Sequence) -> dict:
    """The inference settings' `strict_tests` (tasks/strict.py) when every task has a strict set; else none."""
    tasks = list(tasks)
    return {"strict_tests": strict.strict_cases_record(tasks)} if tasks and all(map(strict.applies, tasks)) else {}


def _resolve_precision(model, precision: str | None, inference: dict):
    """`precision` resolved on the model's device; a chosen one joins the inference settings
    (Precision.setting), the default stays out of them, so that receipts without a choice compare."""
    from glm53_flash.model.precision import resolve_precision

    resolved = resolve_precision(precision, next(model.parameters()).device)
    if resolved.setting is not None:
        inference["precision"] = resolved.setting
    return resolved


def run_eval(cfg: EvalConfig, *, model=None, checkpoint_sha256: str | None = None, verifier=None,
             opening: "ledger.Opening | None" = None, progress: bool | None = None,
             tasks: list | None = None) -> dict:
    """The evaluation an EvalConfig describes, every field honoured (split, families, per_family,
    samples, seed, stop, temperature, top_k, top_p, max_new_tokens, batch_rows, workers, device,
    precision): the
    receipt of `evaluate_greedy` (one sample) or `evaluate_sampled`. Loads cfg.checkpoint on cfg.device
    unless `model` is given (then `checkpoint_sha256` names its weights); starts a Verifier with
    cfg.workers unless one is given; progress follows cfg.quiet unless given. A sealed split needs
    `opening` (ledger.require_open). `tasks`: `eval_tasks(cfg)` when the caller has built them already
    (a compositions split takes seconds to build). `glm53 eval` and `glm53 reproduce` both run their
    evaluations here."""
    from glm53_flash.verifier import Verifier

    cfg = cfg.resolved()
    tasks = eval_tasks(cfg, opening) if tasks is None else tasks
    if model is None:
        from glm53_flash.core.runtime import resolve_device
        from glm53_flash.model.lm import load_pretrained

        model, metadata = load_pretrained(cfg.checkpoint, resolve_device(cfg.device))
        checkpoint_sha256 = metadata.get("weights_sha256")
    common = dict(max_new_tokens=cfg.max_new_tokens, stop=cfg.stop, seed=cfg.seed, batch_rows=cfg.batch_rows,
                  checkpoint=str(cfg.checkpoint), checkpoint_sha256=checkpoint_sha256,
                  progress=not cfg.quiet if progress is None else progress, opening=opening, precision=cfg.precision,
                  adapt_threads=cfg.adapt_threads)
    own = verifier is None
    verifier = Verifier(workers=cfg.workers) if own else verifier
    try:
        if cfg.greedy:
            return evaluate_greedy(model, tasks, verifier=verifier, **common)
        return evaluate_sampled(model, tasks, samples=cfg.samples, temperature=cfg.temperature, top_k=cfg.top_k,
                                top_p=cfg.top_p, verifier=verifier, **common)
    finally:
        if own:
            verifier.close()


def eval_tasks(cfg: EvalConfig, opening: "ledger.Opening | None" = None) -> list:
    """The tasks `run_eval(cfg)` evaluates. A sealed split's only for its opening, which is activated first
    (its "opened" line written to the ledger before any task exists)."""
    from glm53_flash.tasks import parse_families, split_tasks, suite_of

    cfg = cfg.resolved()
    if opening is not None and ledger.is_sealed(cfg.split):
        opening.activate()
    return split_tasks(cfg.split, cfg.per_family, parse_families(cfg.families, suite_of(cfg.split)), opening=opening)


def eval_task_ids(cfg: EvalConfig) -> list[str]:
    """The ids of eval_tasks(cfg), for any split without an opening (a sealed evaluation's plan identity)."""
    from glm53_flash.tasks import parse_families, split_task_ids, suite_of

    cfg = cfg.resolved()
    return split_task_ids(cfg.split, cfg.per_family, parse_families(cfg.families, suite_of(cfg.split)))


# --------------------------------------------------------------------------- running


def task_batches(tasks: Sequence, samples: int, batch_rows: int) -> list[list[int]]:
    """Task indices in batches of about `batch_rows` rollouts, shortest prompts first, so that the
    prompts in a batch have similar lengths (the sampler decodes them in lockstep)."""
    tokenizer = ByteTokenizer()
    order = sorted(range(len(tasks)), key=lambda i: (len(tokenizer.encode(tasks[i].prompt)), i))
    per_batch = max(1, batch_rows // samples)
    return [order[i:i + per_batch] for i in range(0, len(order), per_batch)]


def _run(model, tasks, *, samples, temperature, top_k, top_p, max_new_tokens, stop, seed, verifier, batch_rows,
         progress, sealed, precision=None, adapt_threads=False):
    """Generate and judge every task; returns completions[t][s], evaluations[t][s] (the three cases),
    strong[t][s] (the strong set), strict[t][s] (passed the three cases, the strong set and the strict
    set; None when the tasks have no strict set), timing. On a sealed split the progress bar shows no
    results."""
    import torch

    from glm53_flash.verifier import Verifier

    wall_start = time.perf_counter()
    tasks = list(tasks)
    split_of(tasks)
    ids = [task.task_id for task in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError("tasks must have distinct task_ids")
    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    from glm53_flash.core.shared_machine import governed

    completions: list[list[Completion] | None] = [None] * len(tasks)
    evaluations: list[list | None] = [None] * len(tasks)
    strong: list[list | None] = [None] * len(tasks)
    with_strict = all(map(strict.applies, tasks))
    strict_rows: list[list | None] = [None] * len(tasks)
    generation_seconds = verification_seconds = 0.0
    bar = _progress_bar(len(tasks) * samples, progress)
    own_verifier = verifier is None
    if own_verifier:
        verifier = Verifier()
    with governed(adapt_threads, device) as governor:  # None without --adapt-threads
        try:
            for batch in task_batches(tasks, samples, batch_rows):
                batch_tasks = [tasks[i] for i in batch]
                start = time.perf_counter()
                generated = generate_for_tasks(model, batch_tasks, samples=samples, max_new_tokens=max_new_tokens,
                                               temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop=stop,
                                               batch_rows=batch_rows, progress=bar.update if bar else None,
                                               precision=precision, governor=governor)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                generation_seconds += time.perf_counter() - start
                start = time.perf_counter()
                # One call per batch: the verifier's worker pool judges all of its rollouts in parallel, each
                # program twice: on the three cases (the verdict RL and the original use) and, in a separate
                # execution, on the strong set (so the three-case verdict is exactly the one it always was).
                pairs = [(task, task.prompt + completion.text)
                         for task, rows in zip(batch_tasks, generated) for completion in rows]
                judged = verifier.evaluate_many(pairs + [(strong_task(task), source) for task, source in pairs])
                # a program that passes both on a task with a strict set: once more, on that set
                again = [k for k in range(len(pairs))
                         if with_strict and judged[k].passed and judged[len(pairs) + k].passed]
                strict_judged = dict(zip(again, verifier.evaluate_many(
                    [(strict.strict_task(pairs[k][0]), pairs[k][1]) for k in again]) if again else []))
                verification_seconds += time.perf_counter() - start
                for position, i in enumerate(batch):
                    completions[i] = generated[position]
                    evaluations[i] = judged[position * samples:(position + 1) * samples]
                    strong[i] = judged[len(pairs) + position * samples:len(pairs) + (position + 1) * samples]
                    if with_strict:
                        strict_rows[i] = [k in strict_judged and strict_judged[k].passed
                                          for k in range(position * samples, (position + 1) * samples)]
                if bar and not sealed:
                    solved = sum(any(e.passed for e in row) for row in evaluations if row is not None)
                    bar.set_postfix(solved=f"{solved}/{sum(row is not None for row in evaluations)}")
            threads_at_end = governor.threads if governor is not None else None
        finally:
            if bar:
                bar.close()
            if own_verifier:
                verifier.close()
    timing = {"generation_seconds": generation_seconds, "verification_seconds": verification_seconds,
              "total_seconds": time.perf_counter() - wall_start, "rollouts": len(tasks) * samples,
              "generated_tokens": sum(len(c.token_ids) for rows in completions for c in rows)}
    timing["rollouts_per_second"] = timing["rollouts"] / max(timing["total_seconds"], 1e-9)
    if governor is not None:
        timing["thread_changes"], timing["threads_at_end"] = governor.changes, threads_at_end
    return completions, evaluations, strong, (strict_rows if with_strict else None), timing


def _progress_bar(total: int, enabled: bool):
    from glm53_flash.core.progress import progress_bar

    return progress_bar(total, quiet=not enabled, desc="evaluate", unit="rollout")


def _finish(receipt: dict, model, checkpoint, checkpoint_sha256, timing, opening, precision) -> dict:
    import torch

    from glm53_flash.core.receipts import provenance

    device = next(model.parameters()).device
    receipt.update(
        schema_version=SCHEMA_VERSION, status="complete", checkpoint=checkpoint, checkpoint_sha256=checkpoint_sha256,
        elapsed_seconds=timing["total_seconds"],
        peak_vram_gib=(torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None),
        timing=timing, precision=precision.record(), provenance=provenance(device=str(device)),
        sealed_opening=None if opening is None else opening.to_dict(),
    )
    return receipt


# --------------------------------------------------------------------------- receipts (pure functions)


def _valid(evaluation) -> bool:
    # "valid" = passed the static policy and compiled (the original's meaning); a program killed for
    # time or memory ("limit") was a valid program, so it counts.
    return evaluation.status != "invalid"


def greedy_receipt(tasks: Sequence, completions: Sequence[Completion], evaluations: Sequence,
                   inference: dict, strong_evaluations: Sequence | None = None,
                   strict_passed: Sequence[bool] | None = None) -> dict:
    """summary, by_family, episodes and pass_at_k of a greedy run, in the original's layout; with
    `strong_evaluations` (each program judged on its strong set) also the strong results; with
    `strict_passed` (each program passed its three cases, strong set and strict set) the strict ones."""
    strong = None if strong_evaluations is None else list(strong_evaluations)
    if strong is not None and len(strong) != len(evaluations):
        raise ValueError(f"{len(strong)} strong evaluations for {len(evaluations)} evaluations")
    if strict_passed is not None and len(strict_passed) != len(evaluations):
        raise ValueError(f"{len(strict_passed)} strict verdicts for {len(evaluations)} evaluations")
    episodes, by_family = [], {}
    for i, (task, completion, evaluation) in enumerate(zip(tasks, completions, evaluations, strict=True)):
        episode = {
            "task_id": task.task_id, "family": task.family, **_unit_fields(task), "prompt": task.prompt,
            "reference_completion": task.reference_completion, "generated_completion": completion.text,
            "generated_tokens": len(completion.token_ids), "hit_token_cap": completion.hit_cap,
            "token_ids": list(completion.token_ids), "finish_reason": completion.finish_reason,
            "evaluation": evaluation.to_dict(),
        }
        family = by_family.setdefault(task.family, {"solved": 0, "tasks": 0, "tests_passed": 0, "tests_total": 0})
        family["solved"] += int(evaluation.passed)
        family["tasks"] += 1
        family["tests_passed"] += evaluation.tests_passed
        family["tests_total"] += evaluation.tests_total
        if strong is not None:
            solved_strong = _strong_pass(evaluation, strong[i])
            episode.update(_strong_fields(strong[i]), strong_passed=solved_strong)
            family["solved_strong"] = family.get("solved_strong", 0) + int(solved_strong)
            family["false_passes"] = family.get("false_passes", 0) + int(evaluation.passed and not solved_strong)
        if strict_passed is not None:
            solved_strict = bool(strict_passed[i])
            episode["strict_passed"] = solved_strict
            family["solved_strict"] = family.get("solved_strict", 0) + int(solved_strict)
            false_pass = int(evaluation.passed and not solved_strict)
            family["false_passes_strict"] = family.get("false_passes_strict", 0) + false_pass
        episodes.append(episode)
    solved = sum(e.passed for e in evaluations)
    tests_passed = sum(e.tests_passed for e in evaluations)
    tests_total = sum(e.tests_total for e in evaluations)
    summary = {
        "tasks_solved": solved, "tasks_total": len(episodes), "pass_at_1": solved / len(episodes),
        "tests_passed": tests_passed, "tests_total": tests_total,
        "test_accuracy": tests_passed / tests_total if tests_total else 0.0,
        "valid_programs": sum(_valid(e) for e in evaluations),
        "token_cap_hits": sum(c.hit_cap for c in completions),
        **units_summary(tasks),
    }
    receipt = {"split": split_of(tasks), "inference": inference, "summary": summary,
               "by_family": _canonical_order(by_family), "episodes": episodes,
               "pass_at_k": {"1": summary["pass_at_1"]}}
    if strong is not None:
        solved_strong = sum(e["strong_passed"] for e in episodes)
        summary.update(
            tasks_solved_strong=solved_strong, pass_at_1_strong=solved_strong / len(episodes),
            false_passes=solved - solved_strong,
            strong_tests_passed=sum(e.tests_passed for e in strong),
            strong_tests_total=sum(e.tests_total for e in strong),
        )
        receipt["pass_at_k_strong"] = {"1": summary["pass_at_1_strong"]}
    if strict_passed is not None:
        solved_strict = sum(e["strict_passed"] for e in episodes)
        summary.update(tasks_solved_strict=solved_strict, pass_at_1_strict=solved_strict / len(episodes),
                       false_passes_strict=solved - solved_strict)
        receipt["pass_at_k_strict"] = {"1": summary["pass_at_1_strict"]}
    receipt["by_kind"] = by_kind(episodes)
    return receipt


def sampled_receipt(tasks: Sequence, completions: Sequence[Sequence[Completion]], evaluations: Sequence[Sequence],
                    inference: dict, strong_evaluations: Sequence[Sequence] | None = None,
                    strict_passed: Sequence[Sequence[bool]] | None = None) -> dict:
    """summary, by_family, episodes and the unbiased pass@k of a sampled run (original layout + pass_at_k);
    with `strong_evaluations` also the strong results (pass_at_k_strong, false-pass rollouts); with
    `strict_passed` (per task and sample: passed the three cases, the strong set and the strict set)
    the strict ones."""
    episodes, by_family, passed_counts, strong_counts, strict_counts = [], {}, [], [], []
    samples = len(completions[0]) if completions else 0
    strong_rows = [None] * len(evaluations) if strong_evaluations is None else list(strong_evaluations)
    if len(strong_rows) != len(evaluations):
        raise ValueError(f"{len(strong_rows)} rows of strong evaluations for {len(evaluations)} tasks")
    strict_rows = [None] * len(evaluations) if strict_passed is None else list(strict_passed)
    if len(strict_rows) != len(evaluations):
        raise ValueError(f"{len(strict_rows)} rows of strict verdicts for {len(evaluations)} tasks")
    for task, rows, judged, strong, strict_row in zip(tasks, completions, evaluations, strong_rows, strict_rows,
                                                      strict=True):
        if len(rows) != samples or len(judged) != samples or (strong is not None and len(strong) != samples):
            raise ValueError(f"task {task.task_id} has {len(rows)} completions and {len(judged)} evaluations; "
                             f"expected {samples} of each")
        passed = sum(e.passed for e in judged)
        passed_counts.append(passed)
        sample_rows = [
            {"sample": i, "completion": c.text, "token_ids": list(c.token_ids), "tokens": len(c.token_ids),
             "hit_token_cap": c.hit_cap, "finish_reason": c.finish_reason, "evaluation": e.to_dict()}
            for i, (c, e) in enumerate(zip(rows, judged))
        ]
        episode = {
            "task_id": task.task_id, "family": task.family, **_unit_fields(task), "prompt": task.prompt,
            "reference_completion": task.reference_completion, "solved_at_k": passed > 0, "passed_samples": passed,
            "samples": sample_rows,
        }
        family = by_family.setdefault(task.family, {"tasks_solved_at_k": 0, "tasks": 0, "exact_rollouts": 0,
                                                    "rollouts": 0, "valid_rollouts": 0, "_counts": []})
        family["tasks_solved_at_k"] += int(passed > 0)
        family["tasks"] += 1
        family["exact_rollouts"] += passed
        family["rollouts"] += samples
        family["valid_rollouts"] += sum(_valid(e) for e in judged)
        family["_counts"].append(passed)
        if strong is not None:
            for row, e, s in zip(sample_rows, judged, strong):
                row.update(_strong_fields(s), strong_passed=_strong_pass(e, s))
            passed_strong = sum(row["strong_passed"] for row in sample_rows)
            strong_counts.append(passed_strong)
            episode.update(passed_samples_strong=passed_strong, solved_at_k_strong=passed_strong > 0)
            family["tasks_solved_at_k_strong"] = family.get("tasks_solved_at_k_strong", 0) + int(passed_strong > 0)
            family["exact_rollouts_strong"] = family.get("exact_rollouts_strong", 0) + passed_strong
            family["false_pass_rollouts"] = family.get("false_pass_rollouts", 0) + passed - passed_strong
            family.setdefault("_strong_counts", []).append(passed_strong)
        if strict_row is not None:
            for row, verdict in zip(sample_rows, strict_row, strict=True):
                row["strict_passed"] = bool(verdict)
            passed_strict = sum(row["strict_passed"] for row in sample_rows)
            strict_counts.append(passed_strict)
            episode.update(passed_samples_strict=passed_strict, solved_at_k_strict=passed_strict > 0)
            family["exact_rollouts_strict"] = family.get("exact_rollouts_strict", 0) + passed_strict
            family["false_pass_rollouts_strict"] = family.get("false_pass_rollouts_strict", 0) + passed - passed_strict
        episodes.append(episode)
    for family in by_family.values():
        family["pass_at_k"] = unbiased_pass_at_k(family.pop("_counts"), samples)
        if "_strong_counts" in family:
            family["pass_at_k_strong"] = unbiased_pass_at_k(family.pop("_strong_counts"), samples)
    flat = [e for judged in evaluations for e in judged]
    rollouts = len(flat)
    tests_passed = sum(e.tests_passed for e in flat)
    tests_total = sum(e.tests_total for e in flat)
    solved = sum(count > 0 for count in passed_counts)
    summary = {
        "tasks_solved_at_k": solved, "tasks_total": len(episodes),
        "pass_at_k": solved / len(episodes),  # the original's any-of-k rate; see top-level pass_at_k
        "exact_rollouts": sum(passed_counts), "rollouts_total": rollouts,
        "exact_rollout_rate": sum(passed_counts) / rollouts,
        "tests_passed": tests_passed, "tests_total": tests_total,
        "test_accuracy": tests_passed / tests_total if tests_total else 0.0,
        "valid_rollouts": sum(_valid(e) for e in flat),
        "token_cap_hits": sum(c.hit_cap for rows in completions for c in rows),
        **units_summary(tasks),
    }
    receipt = {"split": split_of(tasks), "inference": inference, "summary": summary,
               "by_family": _canonical_order(by_family), "episodes": episodes,
               "pass_at_k": unbiased_pass_at_k(passed_counts, samples)}
    if strong_evaluations is not None:
        flat_strong = [e for row in strong_rows for e in row]
        summary.update(
            tasks_solved_at_k_strong=sum(count > 0 for count in strong_counts),
            exact_rollouts_strong=sum(strong_counts),
            false_pass_rollouts=sum(passed_counts) - sum(strong_counts),
            strong_tests_passed=sum(e.tests_passed for e in flat_strong),
            strong_tests_total=sum(e.tests_total for e in flat_strong),
        )
        receipt["pass_at_k_strong"] = unbiased_pass_at_k(strong_counts, samples)
    if strict_passed is not None:
        summary.update(tasks_solved_at_k_strict=sum(count > 0 for count in strict_counts),
                       exact_rollouts_strict=sum(strict_counts),
                       false_pass_rollouts_strict=sum(passed_counts) - sum(strict_counts))
        receipt["pass_at_k_strict"] = unbiased_pass_at_k(strict_counts, samples)
    receipt["by_kind"] = by_kind(episodes)
    return receipt


def _strong_pass(evaluation, strong_evaluation) -> bool:
    """Solved under the strong set: the three-case run passed and so did the strong run (which repeats
    the three cases), so the strong rate never exceeds the original one."""
    return bool(evaluation.passed and strong_evaluation.passed)


def _strong_fields(strong_evaluation) -> dict:
    return {"strong_tests_passed": strong_evaluation.tests_passed,
            "strong_tests_total": strong_evaluation.tests_total,
            "strong_evaluation": strong_evaluation.to_dict()}


def unbiased_pass_at_k(passed_counts: Sequence[int], samples: int) -> dict[str, float]:
    """{"k": mean over tasks of 1 - C(n-c, k)/C(n, k)} for k = 1..n, n = samples per task."""
    return {str(k): sum(pass_at_k(samples, c, k) for c in passed_counts) / len(passed_counts)
            for k in range(1, samples + 1)}


def _canonical_order(by_family: dict) -> dict:
    return {name: by_family[name] for name in family_order(by_family)}


def format_summary(receipt: dict) -> str:
    """A few human lines about a receipt (what the CLI prints)."""
    s, timing = receipt["summary"], receipt["timing"]
    if receipt["inference"].get("greedy"):
        head = (f"greedy pass@1 {s['tasks_solved']}/{s['tasks_total']} = {s['pass_at_1']:.3f}  "
                f"tests {s['tests_passed']}/{s['tests_total']}  valid {s['valid_programs']}  "
                f"cap hits {s['token_cap_hits']}")
    else:
        k = receipt["inference"]["samples_per_task"]
        unbiased = "  ".join(f"pass@{key} {value:.3f}" for key, value in receipt["pass_at_k"].items()
                             if key in {"1", str(k)} or int(key) in (2, 4))
        head = (f"solved@{k} {s['tasks_solved_at_k']}/{s['tasks_total']}  exact rollouts "
                f"{s['exact_rollouts']}/{s['rollouts_total']}  valid {s['valid_rollouts']}  cap hits "
                f"{s['token_cap_hits']}\nunbiased: {unbiased}")
    if "pass_at_k_strong" in receipt:
        if receipt["inference"].get("greedy"):
            head += (f"\nstrong tests: pass@1 {s['tasks_solved_strong']}/{s['tasks_total']} = "
                     f"{s['pass_at_1_strong']:.3f}  false passes {s['false_passes']}  "
                     f"tests {s['strong_tests_passed']}/{s['strong_tests_total']}")
        else:
            head += (f"\nstrong tests: pass@1 {receipt['pass_at_k_strong']['1']:.3f}  exact rollouts "
                     f"{s['exact_rollouts_strong']}/{s['rollouts_total']}  false-pass rollouts "
                     f"{s['false_pass_rollouts']}")
    if "pass_at_k_strict" in receipt:
        if receipt["inference"].get("greedy"):
            head += (f"\nstrict tests: pass@1 {s['tasks_solved_strict']}/{s['tasks_total']} = "
                     f"{s['pass_at_1_strict']:.3f}  false passes {s['false_passes_strict']}")
        else:
            head += (f"\nstrict tests: pass@1 {receipt['pass_at_k_strict']['1']:.3f}  exact rollouts "
                     f"{s['exact_rollouts_strict']}/{s['rollouts_total']}  false-pass rollouts "
                     f"{s['false_pass_rollouts_strict']}")
    if "units" in s:
        kinds = receipt.get("by_kind") or {}
        if len(kinds) > 1:
            parts = []
            for kind, row in kinds.items():
                solved = row.get("solved", row.get("tasks_solved_at_k"))
                parts.append(f"{kind} {solved}/{row['tasks']}")
            head += "\nby kind: " + "  ".join(parts)
        head += f"\n{s['units']} units (behaviours) over {s['tasks_total']} tasks"
    return (f"{head}\n{receipt['split']}: {timing['rollouts']} rollouts, generation "
            f"{timing['generation_seconds']:.1f} s, verification {timing['verification_seconds']:.1f} s")


__all__ = [
    "EVAL_SPLITS",
    "GREEDY_DEFAULTS",
    "SAMPLED_DEFAULTS",
    "SCHEMA_VERSION",
    "eval_tasks",
    "evaluate_greedy",
    "evaluate_sampled",
    "families_field",
    "format_summary",
    "run_eval",
    "greedy_receipt",
    "sampled_receipt",
    "split_of",
    "task_batches",
    "unbiased_pass_at_k",
    "units_summary",
]
