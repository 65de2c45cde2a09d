"""Pretraining-data study: does diversity, ordering or a curriculum of expression structures help?

Compatible with the original miniature study (seed-research §2-3): the 120 op-triple structures
shuffled with Random(1701), 88 train / 32 held out, the same rendering RNG and phrase templates,
the `research-mini` preset, AdamW 8e-4 (betas 0.9/0.95, wd 0.1 on every parameter), batch 24,
200 updates, loss over the whole sequence + 0.01 x balance, clip 1.0. Differences: one run per
(condition, seed) evaluated at several steps (the original re-ran prefixes), and two metrics that
execute nothing unsafe but score the *generated* expression: free-running exact match and
execution accuracy (value equality at several x, computed by a tiny arithmetic interpreter).

The analysis: each comparison paired by seed at the primary update (paired.py), Holm across the
comparisons per metric. `PretrainingData` at the end declares the study (study.Study).
"""

from __future__ import annotations

import ast
import itertools
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from glm53_flash.core.argtypes import comma_ints
from glm53_flash.core.options import option
from glm53_flash.data.tokenizer import ByteTokenizer
from glm53_flash.experiments.config import StudyConfig, parse_name_list, parse_seed_range
from glm53_flash.experiments.study import DeckEntry, Study, after_holm_sentence, level_power
from glm53_flash.train.config import STUDY_LEARNING_RATE

OPS = ("add", "sub", "mul", "neg", "abs")
PHRASES = {
    "add": ("Add {c}.", "Increase it by {c}."),
    "sub": ("Subtract {c}.", "Decrease it by {c}."),
    "mul": ("Multiply by {c}.", "Scale it by {c}."),
    "neg": ("Negate it.", "Flip its sign."),
    "abs": ("Take its absolute value.", "Make the result nonnegative."),
}
STRUCTURE_SHUFFLE_SEED = 1701
TRAIN_POOL_SIZE = 88
REPEATED_SUBSET = 8
EVAL_INDEX_OFFSET = 100_000
EVAL_SEED_OFFSET = 999
# x values at which a generated expression must agree with the true one (execution accuracy)
EXECUTION_POINTS = (-7, -2, 0, 1, 3, 11)
CONDITIONS = ("repeated-8", "diverse-88", "diverse-blocked", "curriculum-8-to-88")

_TOK = ByteTokenizer()

Structure = tuple[str, str, str]


# --------------------------------------------------------------------------- the synthetic task


def all_structures() -> list[Structure]:
    """The 120 ordered op triples with at least two distinct ops, in the original's shuffled order."""
    structures = [s for s in itertools.product(OPS, repeat=3) if len(set(s)) >= 2]
    random.Random(STRUCTURE_SHUFFLE_SEED).shuffle(structures)
    return structures


def split_structures() -> tuple[list[Structure], list[Structure]]:
    """(train pool of 88, held-out 32)."""
    structures = all_structures()
    return structures[:TRAIN_POOL_SIZE], structures[TRAIN_POOL_SIZE:]


@dataclass(frozen=True)
class Example:
    structure: Structure
    prompt: str       # "Task: ...\nPython: "
    expression: str   # the target, without the trailing newline
    constants: tuple[int, ...]

    @property
    def text(self) -> str:
        return self.prompt + self.expression + "\n"

    @property
    def prompt_tokens(self) -> int:
        """Prompt length in tokens including BOS (the first target is predicted from this many)."""
        return len(self.prompt.encode()) + 1


def render_example(structure: Structure, index: int, seed: int) -> Example:
    """The original's renderer: same RNG key and draw order (constants, an unused start value, phrases)."""
    key = sum((p + 1) * (OPS.index(op) + 1) * 101 for p, op in enumerate(structure))
    rng = random.Random(seed * 1_000_003 + index * 9176 + key)
    constants = tuple(rng.choice((2, 3, 4, 5)) for _ in structure)
    rng.randint(-5, 5)  # the original draws a start value it never uses; kept so the stream matches
    phrases = [rng.choice(PHRASES[op]).format(c=c) for op, c in zip(structure, constants)]
    expression = "x"
    for op, c in zip(structure, constants):
        expression = {"add": f"({expression} + {c})", "sub": f"({expression} - {c})",
                      "mul": f"({expression} * {c})", "neg": f"(-{expression})",
                      "abs": f"abs({expression})"}[op]
    prompt = "Task: start with x. " + " ".join(phrases) + "\nPython: "
    return Example(structure, prompt, expression, constants)


def held_out_examples(seed: int) -> list[Example]:
    """One render per held-out structure; shared by every condition (and step) at this seed."""
    _, held_out = split_structures()
    return [render_example(s, EVAL_INDEX_OFFSET + i, seed + EVAL_SEED_OFFSET) for i, s in enumerate(held_out)]


def condition_schedule(condition: str, steps: int, batch_size: int) -> list[tuple[Structure, int]]:
    """(structure, example index) for every training example, in the order the run sees them."""
    pool, _ = split_structures()
    total = steps * batch_size
    if condition == "repeated-8":
        return [(pool[:REPEATED_SUBSET][i % REPEATED_SUBSET], i) for i in range(total)]
    if condition == "diverse-88":
        return [(pool[i % len(pool)], i) for i in range(total)]
    if condition == "diverse-blocked":
        rank = {s: r for r, s in enumerate(pool)}
        return sorted(((pool[i % len(pool)], i) for i in range(total)), key=lambda item: (rank[item[0]], item[1]))
    if condition == "curriculum-8-to-88":
        switch = (steps // 2) * batch_size
        return [((pool[:REPEATED_SUBSET][i % REPEATED_SUBSET] if i < switch else pool[i % len(pool)]), i)
                for i in range(total)]
    raise ValueError(f"unknown condition {condition!r}; allowed: {', '.join(CONDITIONS)}")


# --------------------------------------------------------------------------- scoring generated text


_ALLOWED_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}
_MAX_EXPRESSION_CHARS = 256


def expression_value(text: str, x: int) -> int | None:
    """Value of an arithmetic expression in x (ints, + - *, unary -, abs); None if it is anything else.

    A small interpreter over the parsed tree instead of eval: generated text is untrusted, and the
    grammar the task needs is tiny.
    """
    if len(text) > _MAX_EXPRESSION_CHARS:
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None

    def value(node) -> int:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Name) and node.id == "x":
            return x
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _ALLOWED_BINOPS:
            return _ALLOWED_BINOPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            operand = value(node.operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "abs"
                and len(node.args) == 1 and not node.keywords):
            return abs(value(node.args[0]))
        raise ValueError("unsupported")

    try:
        return value(tree)
    except (ValueError, RecursionError):
        return None


def executes_correctly(generated: str, expression: str) -> bool:
    """True when `generated` parses and equals the true expression at every EXECUTION_POINTS x."""
    for x in EXECUTION_POINTS:
        got = expression_value(generated, x)
        if got is None or got != expression_value(expression, x):
            return False
    return True


# --------------------------------------------------------------------------- training and evaluation


@dataclass(frozen=True)
class RunConfig:
    condition: str
    seed: int
    steps: int = 200
    batch_size: int = 24
    learning_rate: float = STUDY_LEARNING_RATE
    sequence_length: int = 128
    eval_at: tuple[int, ...] = (0, 50, 100, 150, 200)
    generation_tokens: int = 32
    threads: int = 1
    curve_every: int = 10
    device: str = "cpu"
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        if self.condition not in CONDITIONS:
            raise ValueError(f"unknown condition {self.condition!r}; allowed: {', '.join(CONDITIONS)}")
        for name in ("steps", "batch_size", "sequence_length", "generation_tokens", "threads", "curve_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning-rate must be > 0, got {self.learning_rate}")
        bad = [s for s in self.eval_at if not 0 <= s <= self.steps]
        if bad:
            raise ValueError(f"eval-at steps {bad} outside 0..{self.steps}")


def encode_examples(examples: list[Example], sequence_length: int):
    """BOS + bytes + EOS, right-padded to sequence_length + 1; inputs ids[:-1], labels ids[1:] (PAD ->
    IGNORE_INDEX, the padding label every loss here skips)."""
    import torch

    from glm53_flash.data.batches import IGNORE_INDEX

    rows = []
    for example in examples:
        ids = _TOK.encode(example.text, bos=True, eos=True)
        if len(ids) > sequence_length + 1:
            raise ValueError(f"example of {len(ids)} tokens exceeds sequence length {sequence_length} + 1")
        rows.append(ids + [_TOK.pad_id] * (sequence_length + 1 - len(ids)))
    ids = torch.tensor(rows, dtype=torch.long)
    labels = ids[:, 1:].clone()
    labels[labels == _TOK.pad_id] = IGNORE_INDEX
    return ids[:, :-1], labels


def weights_sha256(model) -> str:
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def evaluate_held_out(model, examples: list[Example], sequence_length: int, generation_tokens: int) -> dict:
    """Teacher-forced target metrics (the original's) plus free-running exact match and execution accuracy."""
    import torch
    import torch.nn.functional as F

    from glm53_flash.evaluation.sampling import SamplingSettings, generate

    was_training = model.training
    model.eval()
    rows = []
    try:
        with torch.inference_mode():
            inputs, _ = encode_examples(examples, sequence_length)
            length = max(len(e.text.encode()) + 2 for e in examples) - 1
            device = next(model.parameters()).device
            # one batched forward: right padding cannot reach earlier positions (causal, per-token routing)
            logits = model(inputs[:, :length].to(device)).logits.float().cpu()
            # the longest target is 21 tokens; never ask for more room than the context has left
            cap = min(generation_tokens, sequence_length - max(e.prompt_tokens for e in examples))
            completions = generate(model, [e.prompt for e in examples],
                                   SamplingSettings(max_new_tokens=cap, temperature=0.0, stop="eos"))
        for i, example in enumerate(examples):
            ids = _TOK.encode(example.text, bos=True, eos=True)
            start = example.prompt_tokens
            targets = torch.tensor(ids[start:])
            predicted = logits[i, start - 1: len(ids) - 1]
            argmax = predicted.argmax(-1)
            correct = int((argmax == targets).sum())
            loss_sum = float(F.cross_entropy(predicted, targets, reduction="sum"))
            generated = completions[i][0].text.split("\n", 1)[0]
            rows.append({
                "structure": "-".join(example.structure), "target": example.expression,
                "target_tokens": len(targets), "correct_tokens": correct, "loss_sum": round(loss_sum, 6),
                "teacher_forced_exact": correct == len(targets),
                "teacher_forced_argmax": _TOK.decode(argmax.tolist()),
                "generated": generated, "free_run_exact": generated == example.expression,
                "execution_correct": executes_correctly(generated, example.expression),
            })
    finally:
        model.train(was_training)
    tokens = sum(r["target_tokens"] for r in rows)
    n = len(rows)
    summary = {
        "target_byte_accuracy": sum(r["correct_tokens"] for r in rows) / tokens,
        "target_loss": sum(r["loss_sum"] for r in rows) / tokens,
        "teacher_forced_exact": sum(r["teacher_forced_exact"] for r in rows) / n,
        "free_run_exact": sum(r["free_run_exact"] for r in rows) / n,
        "execution_accuracy": sum(r["execution_correct"] for r in rows) / n,
        "target_tokens": tokens, "examples": n,
    }
    return {"summary": summary, "examples": rows}


def train_condition(cfg: RunConfig, sink=None) -> dict:
    """Train one (condition, seed) run from the seed's initial weights; evaluate at cfg.eval_at.

    The loop is the engine's StepLoop (train/engine.py) with the study's recipe (`STUDY`: weight
    decay on every parameter, torch's default AdamW kernel, fp32, no stop on divergence), which
    reproduces the original miniature study's optimiser. `sink` (a MetricsSink) receives every
    step's training loss."""
    import torch

    from glm53_flash.model.config import ModelConfig
    from glm53_flash.model import GLM53Flash
    from glm53_flash.train.engine import STUDY, StepLoop, make_optimizer
    from glm53_flash.train.objective import language_model_update

    cfg.validate()
    torch.set_num_threads(cfg.threads)
    schedule = condition_schedule(cfg.condition, cfg.steps, cfg.batch_size)
    held_out = held_out_examples(cfg.seed)
    # identical initial weights for every condition at a seed: this is the pairing
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model = GLM53Flash(ModelConfig.preset("research-mini", max_sequence_length=cfg.sequence_length)).to(cfg.device)
    initial_sha = weights_sha256(model)
    recipe = replace(STUDY, learning_rate=cfg.learning_rate)
    optimizer = make_optimizer(model, recipe)
    evaluations, curve = [], []
    tokens_seen = 0
    started = time.perf_counter()
    eval_seconds = 0.0

    def evaluate_at(step: int) -> None:
        nonlocal eval_seconds
        t0 = time.perf_counter()
        result = evaluate_held_out(model, held_out, cfg.sequence_length, cfg.generation_tokens)
        eval_seconds += time.perf_counter() - t0
        evaluations.append({"step": step, "tokens_seen": tokens_seen, **result})

    rows: list[dict] = []

    def train_step(step: int) -> dict:
        nonlocal tokens_seen
        items = schedule[step * cfg.batch_size:(step + 1) * cfg.batch_size]
        inputs, labels = encode_examples([render_example(s, i, cfg.seed) for s, i in items], cfg.sequence_length)
        result = language_model_update(model, optimizer, inputs.to(cfg.device), labels.to(cfg.device), recipe)
        tokens_seen += result.tokens
        rows.append({"step": step + 1, "training_loss": round(float(result.cross_entropy), 6),
                     "tokens_seen": tokens_seen})
        return rows[-1]

    if 0 in cfg.eval_at:
        evaluate_at(0)
    model.train()
    curve_steps = {s for s in range(1, cfg.steps + 1) if s == 1 or s % cfg.curve_every == 0}
    StepLoop(0, cfg.steps, train_step, sink=sink,
             at_steps=[(curve_steps, lambda step: curve.append(rows[-1])), (set(cfg.eval_at), evaluate_at)]).run()
    elapsed = time.perf_counter() - started
    return {
        "condition": cfg.condition, "seed": cfg.seed, "config": asdict(cfg) | {"eval_at": list(cfg.eval_at)},
        "initial_weights_sha256": initial_sha, "final_weights_sha256": weights_sha256(model),
        "parameter_counts": model.parameter_counts(), "tokens_seen": tokens_seen,
        "distinct_structures_seen": len({s for s, _ in schedule}),
        "elapsed_seconds": round(elapsed, 3), "evaluation_seconds": round(eval_seconds, 3),
        "training_curve": curve, "evaluations": evaluations,
    }


# --------------------------------------------------------------------------- the study (plan + units)

STUDY = "pretraining-data"
DEFAULT_SEEDS = tuple(range(11, 231, 11))  # the original's 11, 22, ..., 110 extended to 20 paired seeds
COMPARISONS = (
    # name, left, right, the question (difference = right - left, paired by seed)
    ("diversity", "repeated-8", "diverse-88", "Does training on 88 structures instead of 8 help on unseen ones?"),
    ("order", "diverse-blocked", "diverse-88", "Does interleaving beat one contiguous block per structure?"),
    ("curriculum", "diverse-88", "curriculum-8-to-88", "Does starting with 8 structures, then all 88, beat 88 throughout?"),
    ("curriculum-vs-repeated", "repeated-8", "curriculum-8-to-88", "Does adding the 88 halfway beat staying with 8?"),
)
METRICS = ("target_byte_accuracy", "target_loss", "execution_accuracy", "free_run_exact", "teacher_forced_exact")
# Design input, not a result: the SD of the original's 10 per-seed blocked-vs-interleaved differences
# (seed-research §4.3: +14.9 +3.8 +9.7 +12.1 +10.3 +7.5 +6.0 +9.7 +14.4 +8.2 points) is 3.5 points.
REFERENCE_SD_POINTS = 3.5


def measure_seconds_per_step(probe_steps: int = 10) -> float:
    """Time training steps of the research miniature (one thread) to size the study: the difference
    between a 1-step and a (1 + probe_steps)-step run, so model building does not count. An untimed
    run first pays the process's one-time costs (imports, first kernels), which would otherwise
    land in the 1-step run and make the difference come out at zero or below. Should the
    difference still not be positive, the longer run's mean step (an upper bound) is used."""
    import torch

    before = torch.get_num_threads()
    try:
        train_condition(RunConfig("diverse-88", 0, steps=1, eval_at=()))
        timings = []
        for steps in (1, 1 + probe_steps):
            started = time.perf_counter()
            train_condition(RunConfig("diverse-88", 0, steps=steps, eval_at=()))
            timings.append(time.perf_counter() - started)
        difference = (timings[1] - timings[0]) / probe_steps
        return difference if difference > 0 else timings[1] / (1 + probe_steps)
    finally:
        torch.set_num_threads(before)


def build_plan(conditions, seeds, steps: int, batch_size: int, learning_rate: float, sequence_length: int,
               eval_at, workers: int, seconds_per_step: float | None) -> dict:
    from glm53_flash.model.config import ModelConfig
    from glm53_flash.core.stats import minimum_detectable_effect

    conditions, seeds, eval_at = list(conditions), list(seeds), sorted(set(eval_at) | {steps})
    for condition in conditions:
        if condition not in CONDITIONS:
            raise ValueError(f"unknown condition {condition!r}; allowed: {', '.join(CONDITIONS)}")
    if len(set(conditions)) != len(conditions) or len(set(seeds)) != len(seeds):
        raise ValueError("conditions and seeds must not repeat")
    if not seeds:
        raise ValueError("at least one seed is needed")
    RunConfig(conditions[0], seeds[0], steps, batch_size, learning_rate, sequence_length, tuple(eval_at)).validate()
    comparisons = [{"name": n, "left": a, "right": b, "question": q} for n, a, b, q in COMPARISONS
                   if a in conditions and b in conditions]
    units = [{"key": f"{c}-seed-{s}", "condition": c, "seed": s} for s in seeds for c in conditions]
    plan = {
        "study": STUDY,
        "design": {
            "conditions": conditions, "seeds": seeds, "steps": steps, "batch_size": batch_size,
            "learning_rate": learning_rate, "sequence_length": sequence_length, "eval_at": eval_at,
            "preset": "research-mini", "optimizer": "AdamW betas (0.9, 0.95), weight decay 0.1, constant LR, clip 1.0",
            # the model itself, so a change of the preset (RoPE in its linear layers) is a new plan
            "model": ModelConfig.preset("research-mini", max_sequence_length=sequence_length).to_dict(),
            "structure_shuffle_seed": STRUCTURE_SHUFFLE_SEED, "train_pool": TRAIN_POOL_SIZE,
            "held_out_structures": ["-".join(s) for s in split_structures()[1]],
            "execution_points": list(EXECUTION_POINTS), "pairing": "same initial weights per seed in every condition",
        },
        "units": units,
        "analysis": {
            "primary_metric": "target_byte_accuracy", "primary_step": steps, "metrics": list(METRICS),
            "comparisons": comparisons, "unit_of_analysis": "seed (paired differences, right - left)",
            "test": "exact two-sided sign-flip permutation over seeds",
            "multiplicity": "Holm across the comparisons, separately for each metric",
            "pooled_item_test": "sign-flip over (seed, held-out item) pairs for the pass/fail metrics",
            "bootstrap": {"resamples": 20000, "seed": 20261130, "level": 0.95}, "alpha": 0.05,
        },
        # stated before the first run, outside the hashed design (as the estimate)
        "power": {"comparison over seeds": level_power(len(seeds), "sign-flip"),
                  "pooled over (seed, held-out item)": level_power(len(seeds) * len(split_structures()[1]), "t")},
        "estimate": {
            "workers": workers, "seconds_per_step": seconds_per_step,
            "expected_minutes": None if seconds_per_step is None else round(
                seconds_per_step * steps * len(units) / max(1, workers) / 60 * 1.15, 1),  # +15% for evaluations
            "reference_sd_points": REFERENCE_SD_POINTS,
            "mde_points_at_alpha_0.05_power_0.8": round(
                minimum_detectable_effect(len(seeds), REFERENCE_SD_POINTS), 2),
        },
    }
    return plan


def run_unit(unit: dict) -> dict:
    """Worker entry point: one (condition, seed) run of the plan carried in the unit."""
    design = unit["design"]
    cfg = RunConfig(unit["condition"], unit["seed"], design["steps"], design["batch_size"], design["learning_rate"],
                    design["sequence_length"], tuple(design["eval_at"]), device=unit.get("device", "cpu"))
    logging = unit.get("logging") or {}
    if not (logging.get("tensorboard") or logging.get("wandb")):
        return train_condition(cfg)
    from glm53_flash.train.engine import MetricsSink

    tensorboard = str(Path(logging["tensorboard"]) / unit["key"]) if logging.get("tensorboard") else None
    with MetricsSink(tensorboard=tensorboard, wandb=logging.get("wandb"), run_name=unit["key"],
                     config={"study": STUDY, **asdict(cfg)}) as sink:
        return train_condition(cfg, sink)


# --------------------------------------------------------------------------- analysis


# The original's recorded 200-update differences in points (seed-research §4.3, 10 paired seeds),
# shown beside ours for comparison; they are inputs, not results of this code.
ORIGINAL_DELTAS = {"diversity": 3.2, "order": 9.7, "curriculum": -0.6, "curriculum-vs-repeated": 2.6}

PERCENT_METRICS = {"target_byte_accuracy", "execution_accuracy", "free_run_exact", "teacher_forced_exact"}


def _evaluation_at(receipt: dict, step: int) -> dict | None:
    for evaluation in receipt["evaluations"]:
        if evaluation["step"] == step:
            return evaluation
    return None


def compute(plan: dict, receipts: list[dict]) -> dict:
    """Every number of the pretraining-data study (no text): curves, comparisons, trajectories."""
    import numpy as np

    from glm53_flash.core import stats
    from glm53_flash.experiments.paired import (
        MIN_SEEDS_FOR_CI, apply_holm, paired_comparison, pooled_pair_test, wall_minutes,
    )

    design, analysis = plan["design"], plan["analysis"]
    boot = analysis["bootstrap"]
    step, primary = analysis["primary_step"], analysis["primary_metric"]
    by_condition: dict[str, dict[int, dict]] = {}
    for receipt in receipts:
        by_condition.setdefault(receipt["condition"], {})[receipt["seed"]] = receipt

    # pairing check: every condition at a seed started from the same weights
    initial = {}
    unpaired = []
    for condition, runs in by_condition.items():
        for seed, receipt in runs.items():
            if initial.setdefault(seed, receipt["initial_weights_sha256"]) != receipt["initial_weights_sha256"]:
                unpaired.append(f"{condition}-seed-{seed}")

    def values(condition: str, metric: str, at: int) -> dict[int, float]:
        result = {}
        for seed, receipt in by_condition.get(condition, {}).items():
            evaluation = _evaluation_at(receipt, at)
            if evaluation is not None:
                result[seed] = evaluation["summary"][metric]
        return result

    conditions = [c for c in design["conditions"] if c in by_condition]
    curves = {}
    for metric in analysis["metrics"]:
        scale = 100.0 if metric in PERCENT_METRICS else 1.0
        curves[metric] = {}
        for condition in conditions:
            points = []
            for at in design["eval_at"]:
                vals = values(condition, metric, at)
                if not vals:
                    continue
                data = [scale * v for v in vals.values()]
                ci = (stats.bootstrap_ci(data, resamples=boot["resamples"], seed=boot["seed"])
                      if len(data) >= MIN_SEEDS_FOR_CI else None)
                points.append({"step": at, "n": len(data), "mean": float(np.mean(data)),
                               "ci95": list(ci) if ci else None})
            curves[metric][condition] = points

    comparisons = {}
    for metric in analysis["metrics"]:
        scale = 100.0 if metric in PERCENT_METRICS else 1.0
        rows = []
        for index, spec in enumerate(analysis["comparisons"]):
            row = dict(spec) | paired_comparison(values(spec["left"], metric, step), values(spec["right"], metric, step),
                                                 resamples=boot["resamples"], seed=boot["seed"] + index, scale=scale,
                                                 family_size=len(analysis["comparisons"]))
            if metric in PERCENT_METRICS - {"target_byte_accuracy"}:
                key = {"execution_accuracy": "execution_correct", "free_run_exact": "free_run_exact",
                       "teacher_forced_exact": "teacher_forced_exact"}[metric]
                pairs = []
                for seed in row["seeds"]:
                    left = _evaluation_at(by_condition[spec["left"]][seed], step)["examples"]
                    right = _evaluation_at(by_condition[spec["right"]][seed], step)["examples"]
                    pairs += [(float(a[key]), float(b[key])) for a, b in zip(left, right)]
                row["pooled_items"] = pooled_pair_test(pairs, seed=boot["seed"] + index)
            rows.append(row)
        apply_holm(rows)
        comparisons[metric] = rows

    # each comparison's difference at every evaluated step (descriptive, uncorrected)
    trajectory = {}
    for index, spec in enumerate(analysis["comparisons"]):
        points = []
        for at in design["eval_at"]:
            row = paired_comparison(values(spec["left"], primary, at), values(spec["right"], primary, at),
                                    resamples=boot["resamples"], seed=boot["seed"] + index, scale=100.0)
            if row["n"]:
                points.append({"step": at, "mean": row["mean"], "ci95": row["ci95"], "sign_flip_p": row["sign_flip_p"]})
        trajectory[spec["name"]] = points

    # per held-out structure, primary metric at the primary step (mean over seeds)
    per_structure: dict[str, dict[str, float]] = {}
    for condition in conditions:
        totals: dict[str, list[int]] = {}
        for receipt in by_condition[condition].values():
            evaluation = _evaluation_at(receipt, step)
            if evaluation is None:
                continue
            for example in evaluation["examples"]:
                entry = totals.setdefault(example["structure"], [0, 0])
                entry[0] += example["correct_tokens"]
                entry[1] += example["target_tokens"]
        for structure, (correct, total) in totals.items():
            per_structure.setdefault(structure, {})[condition] = 100.0 * correct / total

    final = [_evaluation_at(r, step) for r in receipts if _evaluation_at(r, step) is not None]
    correct_programs = sum(bool(x["execution_correct"]) for e in final for x in e["examples"])
    exact_programs = sum(bool(x["free_run_exact"]) for e in final for x in e["examples"])
    seeds_done = sorted({r["seed"] for r in receipts})
    summary = {
        "study": plan["study"], "plan_sha256": plan["plan_sha256"], "primary_metric": primary, "primary_step": step,
        "runs": len(receipts), "runs_planned": len(plan["units"]), "seeds_completed": seeds_done,
        "pairing_verified": not unpaired, "unpaired_runs": unpaired,
        "generations_at_primary_step": sum(len(e["examples"]) for e in final),
        "correct_generations_at_primary_step": int(correct_programs),
        "exact_generations_at_primary_step": int(exact_programs),
        "examples": _examples(by_condition, step),
        "untrained_byte_accuracy": sorted({round(_evaluation_at(r, 0)["summary"]["target_byte_accuracy"], 6)
                                          for r in receipts if _evaluation_at(r, 0)}),
        "seconds_per_run": float(np.mean([r["elapsed_seconds"] for r in receipts])) if receipts else None,
        "wall_minutes": wall_minutes(receipts),
        "curves": curves, "comparisons": comparisons, "trajectory": trajectory, "per_structure": per_structure,
    }
    return summary


def answers_and_table(plan: dict, summary: dict) -> tuple[list[str], dict]:
    """The study's answers (sentences) and its headline table, formatted from the computed numbers."""
    from glm53_flash.experiments.paired import verdict
    from glm53_flash.report.format import format_interval, format_p, format_signed

    analysis = plan["analysis"]
    alpha, step, primary = analysis["alpha"], summary["primary_step"], summary["primary_metric"]
    comparisons = summary["comparisons"]
    primary_rows = comparisons[primary]
    unit = "points"
    answers = []
    loss_rows = comparisons.get("target_loss", [])
    for index, row in enumerate(primary_rows):
        text = f"{row['question']} {verdict(row, alpha, unit, what='teacher-forced byte accuracy')}."
        if index < len(loss_rows) and loss_rows[index]["n"]:
            loss = loss_rows[index]
            text += (f" Target loss (lower is better): {format_signed(loss['mean'], 2)} nats, Holm p "
                     f"{format_p(loss.get('holm_p'))}.")
        answers.append(text)
    execution_rows = comparisons.get("execution_accuracy", [])
    if summary["generations_at_primary_step"] and summary["correct_generations_at_primary_step"] == 0:
        answers.append(f"Does any condition teach the model to write the held-out expressions? No: none of the "
                       f"{summary['generations_at_primary_step']} greedy generations at update {step} "
                       f"(every condition and seed) computes the right values, so the byte-accuracy gains are "
                       f"gains in predicting the expression's form, not in solving the task.")
    else:
        for row in execution_rows:
            answers.append(f"Execution accuracy, {row['name']}: {format_signed(row['mean'])} points "
                           f"(Holm p {format_p(row.get('holm_p'))}; {row['right']} {row['right_mean']:.1f}% vs "
                           f"{row['left']} {row['left_mean']:.1f}%)." if row["n"] else
                           f"Execution accuracy, {row['name']}: no paired seeds.")
    columns = ["Comparison", "Left", "Right", "Left %", "Right %", "Δ points", "95% CI", "sign-flip p",
               "Holm p", "wins/ties/losses", "exec Δ points", "original Δ (10 seeds)"]
    table_rows = []
    for row, execution in zip(primary_rows, execution_rows or [None] * len(primary_rows)):
        if not row["n"]:
            continue
        table_rows.append([
            row["name"], row["left"], row["right"], f"{row['left_mean']:.1f}", f"{row['right_mean']:.1f}",
            format_signed(row["mean"]), format_interval(row["ci95"]), format_p(row["sign_flip_p"]), format_p(row.get("holm_p")),
            f"{row['wins']}/{row['ties']}/{row['losses']}",
            format_signed(execution["mean"]) if execution and execution["n"] else "n/a",
            format_signed(ORIGINAL_DELTAS.get(row["name"])),
        ])
    return answers, {"columns": columns, "rows": table_rows}


def analyze(out: Path, plan: dict, receipts: list[dict]) -> tuple[dict, list[str], dict]:
    summary = compute(plan, receipts)
    answers, table = answers_and_table(plan, summary)
    summary["headline_table"], summary["answers"] = table, answers
    charts = _charts(out, summary, plan["design"])
    return summary, report_lines(plan, summary, charts), charts


def _code(text: str) -> str:
    """Model output as inline code in a table cell: newlines and pipes shown, not obeyed."""
    return "`" + text.replace("\n", "\\n").replace("|", "\\|").replace("`", "'") + "`"


def _examples(by_condition: dict, step: int, count: int = 4) -> list[dict]:
    """The first held-out examples of the lowest seed at the primary step, for each condition."""
    rows = []
    for condition, runs in by_condition.items():
        evaluation = _evaluation_at(runs[min(runs)], step)
        for example in (evaluation["examples"] if evaluation else [])[:count]:
            rows.append({"condition": condition, "seed": min(runs), "target": example["target"],
                         "teacher_forced_argmax": example["teacher_forced_argmax"],
                         "generated": example["generated"], "execution_correct": example["execution_correct"]})
    return rows


def _charts(out: Path, summary: dict, design: dict) -> dict[str, str]:
    from glm53_flash.report import study_charts

    return study_charts.save_charts(out, [
        ("learning_curves", "learning-curves.png", study_charts.draw_learning_curves(summary)),
        ("paired_differences", "paired-differences.png", study_charts.draw_paired_differences(summary))])


def report_lines(plan: dict, summary: dict, charts: dict) -> list[str]:
    from glm53_flash.experiments.paired import BOOTSTRAP_NOTE
    from glm53_flash.report.format import format_interval, format_p, format_signed
    from glm53_flash.report.tables import markdown_table

    design, analysis = plan["design"], plan["analysis"]
    n = len(summary["seeds_completed"])
    lines = [
        "# Pretraining data: diversity, order and curriculum",
        "",
        (f"Research miniature (`{design['preset']}`), {design['steps']} updates x batch {design['batch_size']}, "
        f"lr {design['learning_rate']}, {len(design['conditions'])} conditions x {n} paired seeds "
        f"({summary['runs']}/{summary['runs_planned']} runs done). Plan `{summary['plan_sha256'][:12]}` "
        f"(plan.json) was written before the first run. Metric: {analysis['primary_metric']} on the 32 held-out "
        f"structures at update {summary['primary_step']}; differences are right - left, paired by seed. "
        f"Wall time {summary['wall_minutes']} min ({summary['seconds_per_run']:.0f} s per run in one thread)."),
        "",
        f"Pairing verified (same initial weights per seed in every condition): {summary['pairing_verified']}.",
        "",
        "## Answers",
        "",
        *[f"- {answer}" for answer in summary["answers"]],
        "",
        "## Held-out target-byte accuracy (primary) and execution accuracy",
        "",
        *markdown_table(summary["headline_table"]["columns"], summary["headline_table"]["rows"]),
        "",
        f"Tests: {analysis['test']}; {analysis['multiplicity']}. {BOOTSTRAP_NOTE}",
        "",
    ]
    for chart in charts.values():
        lines += [f"![{chart}]({chart})", ""]
    lines += ["## Every metric at the final update", ""]
    for metric, rows in summary["comparisons"].items():
        unit = "points" if metric in PERCENT_METRICS else "nats"
        table = [[r["name"], format_signed(r["mean"], 2), format_interval(r["ci95"], 2), format_p(r["sign_flip_p"]),
                  format_p(r.get("holm_p")), f"{r['wins']}/{r['ties']}/{r['losses']}",
                  "n/a" if r["mde"] is None else f"{r['mde']:.2f}",
                  format_p(r["pooled_items"]["p"]) if "pooled_items" in r else "-"] for r in rows if r["n"]]
        lines += [f"### {metric} ({unit})", "",
                  *markdown_table(["Comparison", "Δ", "95% CI", "sign-flip p", "Holm p", "wins/ties/losses",
                           "MDE (80% power)", "pooled item p"], table), ""]
    lines += ["## Per held-out structure (accuracy %, mean over seeds)", ""]
    conditions = [c for c in design["conditions"] if any(c in v for v in summary["per_structure"].values())]
    structure_rows = [[s, *[f"{summary['per_structure'][s].get(c, float('nan')):.1f}" for c in conditions]]
                      for s in sorted(summary["per_structure"])]
    lines += [*markdown_table(["structure", *conditions], structure_rows), ""]
    lines += ["## What the model writes (lowest seed, first held-out structures)", "",
              *markdown_table(["condition", "target", "teacher-forced argmax", "greedy generation", "executes"],
                              [[e["condition"], _code(e["target"]), _code(e["teacher_forced_argmax"]),
                                _code(e["generated"]), "yes" if e["execution_correct"] else "no"]
                               for e in summary["examples"]]), ""]
    lines += ["## Limits", "",
              (f"- The untrained model scores {', '.join(f'{100 * v:.1f}%' for v in summary['untrained_byte_accuracy'])} "
              "byte accuracy: with tied embeddings it copies its input, and repeated characters such as `((` "
              "score. Byte accuracy is dominated by punctuation, which is why execution accuracy is also reported."),
              ("- The 8-structure condition uses one fixed subset (the first 8 of the pool); 'blocked' is the most "
              "extreme ordering; the curriculum has one switch point. One learning rate, one width."),
              "- The miniature has 3 layers, so it contains no sparse-attention layer.",
              *miniature_differences(design),
              ("- The pooled item test treats held-out items as exchangeable within a seed; items share structures "
              "across seeds, so it supports, but does not replace, the seed-level test."), ""]
    return lines


def miniature_differences(design: dict) -> list[str]:
    """What the plan's model shares with the original miniature and where it still differs."""
    from glm53_flash.model.config import ORIGINAL_MODEL_SWITCHES

    model = design.get("model")
    if model is None:
        return ["- Positions: this plan predates the model config in plans, and its runs trained `research-mini` "
                "without RoPE in its linear layers: the model had no positional information at all, unlike the "
                "original miniature (RoPE before the feature map). A rerun with positions is a new plan."]
    lines = []
    if model.get("linear_rope") == ORIGINAL_MODEL_SWITCHES["linear_rope"]:
        lines.append("- Positions: RoPE before the feature map in the three linear layers, as in the original "
                     "miniature; with no sparse layer it is the model's only positional signal. What changed: "
                     "earlier runs of this study (plans without the model config) trained the preset without "
                     "it, so their model saw no positions at all.")
    differing = [f"{key} `{model.get(key)}` (the original: `{value}`)" for key, value in ORIGINAL_MODEL_SWITCHES.items()
                 if model.get(key) != value]
    if differing:
        lines.append("- Differences from the original miniature's model: " + "; ".join(differing) + ". The "
                     "original's hard-count balance term has no gradient, so it balances nothing.")
    lines.append("- Differences in the protocol: every condition is evaluated at several updates of one run "
                 "(the original evaluated before and after training only), 20 paired seeds instead of 10, and "
                 "execution accuracy and free-run exact match beside the original's teacher-forced metrics.")
    return lines


# --------------------------------------------------------------------------- the study's declaration


@dataclass(kw_only=True)
class PretrainingDataStudyConfig(StudyConfig):
    """Every knob of `glm53 experiment pretraining-data`; the design in plan.json comes from these."""

    conditions: tuple[str, ...] = option(CONDITIONS, parse=parse_name_list,
                                         help=f"comma-separated conditions; {', '.join(CONDITIONS)}",
                                         default_text=f"all {len(CONDITIONS)}")
    seeds: tuple[int, ...] = option(DEFAULT_SEEDS, parse=parse_seed_range,
                                    help="paired seeds: comma-separated or START:COUNT:STEP",
                                    default_text="11:20:11 = 20 paired seeds")
    steps: int = option(200, help="optimizer updates per run")
    batch_size: int = option(24, help="sequences per update")
    learning_rate: float = option(STUDY_LEARNING_RATE, help="AdamW learning rate (constant)")
    sequence_length: int = option(128, help="tokens per training sequence")
    eval_at: tuple[int, ...] | None = option(None, parse=comma_ints, help="comma-separated updates to evaluate at",
                                             default_text="0 and every quarter of --steps")

    def __post_init__(self) -> None:
        if self.eval_at is None:
            self.eval_at = tuple(sorted({0, *(self.steps * q // 4 for q in (1, 2, 3, 4))}))
        self.conditions, self.seeds, self.eval_at = tuple(self.conditions), tuple(self.seeds), tuple(self.eval_at)


def deck_figures(slide_id: str, summary: dict, directory: Path) -> tuple[list, bool]:
    """The REPORT.md's two charts at the deck's sizes, one above the other."""
    from glm53_flash.report import study_charts

    return [(study_charts.draw_learning_curves(summary, size=(14, 4.2)), "pretraining-data-curves",
             "held-out byte accuracy over training per condition, and the paired differences"),
            (study_charts.draw_paired_differences(summary, size=(14, 3.4)), "pretraining-data-differences",
             "per-seed paired differences at the primary update, with their means and intervals")], True


class PretrainingData(Study):
    name = STUDY
    config = PretrainingDataStudyConfig
    help = "diversity / order / curriculum of pretraining structures (research-mini)"
    description = ("The original's miniature study, compatible (120 structures shuffled with seed 1701, 88 train / "
                   "32 held out, research-mini, AdamW 8e-4, batch 24, 200 updates), with every condition paired by "
                   "seed and evaluated at several points of one run. Analyse with `glm53 analyze DIR`.")
    deck = (DeckEntry("research-pretraining-data", "Research study: pretraining data",
                      "glm53 experiment pretraining-data", "pretraining-data/summary.json", deck_figures),)

    def plan(self, cfg: PretrainingDataStudyConfig, speed: float | None) -> dict:
        return build_plan(cfg.conditions, cfg.seeds, cfg.steps, cfg.batch_size, cfg.learning_rate,
                          cfg.sequence_length, cfg.eval_at, cfg.workers, speed)

    def speed(self, cfg: PretrainingDataStudyConfig, draft: dict) -> float:
        return round(measure_seconds_per_step(), 4)

    def run(self, session) -> int:
        return session.run(session.plan["units"], run_unit)

    def analyze(self, out: Path, plan: dict, receipts: list[dict]) -> tuple[dict, list[str], dict]:
        return analyze(out, plan, receipts)

    def answer(self, plan: dict, summary: dict) -> str:
        """Each comparison of the primary metric at the primary update, after Holm over the comparisons at
        the seeds; and whether any generation computes the right values."""
        from glm53_flash.report.format import format_signed

        alpha = plan["analysis"]["alpha"]
        rows = [r for r in summary["comparisons"][summary["primary_metric"]] if r["n"]]
        seeds = max((r["n"] for r in rows), default=0)
        text = after_holm_sentence(
            f"Held-out target-byte accuracy at update {summary['primary_step']} over {seeds} paired seeds (right "
            "minus left)", [(f"{r['name']} {format_signed(r['mean'])} points", r.get("holm_p") is not None
                             and r["holm_p"] <= alpha) for r in rows], len(rows), "seeds")
        if summary["generations_at_primary_step"] and not summary["correct_generations_at_primary_step"]:
            text += (f" None of the {summary['generations_at_primary_step']} greedy generations computes the held-out "
                     "expressions' values.")
        return text


__all__ = [
    "COMPARISONS",
    "CONDITIONS",
    "DEFAULT_SEEDS",
    "EXECUTION_POINTS",
    "METRICS",
    "OPS",
    "STUDY",
    "Example",
    "PretrainingData",
    "PretrainingDataStudyConfig",
    "RunConfig",
    "all_structures",
    "analyze",
    "build_plan",
    "compute",
    "condition_schedule",
    "encode_examples",
    "evaluate_held_out",
    "executes_correctly",
    "expression_value",
    "held_out_examples",
    "render_example",
    "run_unit",
    "split_structures",
    "train_condition",
]
