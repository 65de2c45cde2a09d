"""Pretraining-data study: does diversity, ordering or a curriculum of expression structures help?

Compatible with the original miniature study (seed-research §2-3): the 120 op-triple structures
shuffled with Random(1701), 88 train / 32 held out, the same rendering RNG and phrase templates,
the `research-mini` preset, AdamW 8e-4 (betas 0.9/0.95, wd 0.1 on every parameter), batch 24,
200 updates, loss over the whole sequence + 0.01 x balance, clip 1.0. Differences: one run per
(condition, seed) evaluated at several steps (the original re-ran prefixes), and two metrics that
execute nothing unsafe but score the *generated* expression: free-running exact match and
execution accuracy (value equality at several x, computed by a tiny arithmetic interpreter).
"""

from __future__ import annotations

import ast
import itertools
import random
import time
from dataclasses import asdict, dataclass, field, replace

from glm53_flash.data.tokenizer import ByteTokenizer
from glm53_flash.experiments.study import level_power
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
    from pathlib import Path

    from glm53_flash.train.engine import MetricsSink

    tensorboard = str(Path(logging["tensorboard"]) / unit["key"]) if logging.get("tensorboard") else None
    with MetricsSink(tensorboard=tensorboard, wandb=logging.get("wandb"), run_name=unit["key"],
                     config={"study": STUDY, **asdict(cfg)}) as sink:
        return train_condition(cfg, sink)


__all__ = [
    "COMPARISONS",
    "CONDITIONS",
    "DEFAULT_SEEDS",
    "EXECUTION_POINTS",
    "METRICS",
    "OPS",
    "STUDY",
    "Example",
    "RunConfig",
    "all_structures",
    "build_plan",
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
