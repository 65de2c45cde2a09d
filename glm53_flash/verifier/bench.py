"""`glm53 bench verify`: isolated verifier throughput on a realistic candidate mix, against the
unsafe in-process evaluator, written as a JSON receipt.

The mix imitates RL rollouts of a small model: mostly passing or failing one-line bodies, a quarter
rejected by the policy or the compiler, and a few memory blow-ups that the sandbox stops in
milliseconds. Candidates that run into the CPU limit cost that limit each, so they are timed apart.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter

from glm53_flash.core.receipts import provenance, write_json
from glm53_flash.tasks import frozen_tasks
from glm53_flash.verifier.reference import evaluate_in_process
from glm53_flash.verifier.sandbox import Verifier

# Kind -> share of the mix.
MIX_SHARES = {"passing": 0.45, "failing": 0.30, "invalid": 0.24, "limit": 0.01}

PASSING_BODIES = {
    "increment": ["return x + 1", "return 1 + x", "return x - -1"],
    "double": ["return x * 2", "return x + x", "return 2 * x"],
    "square": ["return x * x", "return x ** 2", "return abs(x) * abs(x)"],
    "absolute": ["return -x if x < 0 else x", "return abs(x)", "return max(x, -x)"],
    "nonnegative": ["return x if x > 0 else 0", "return max(x, 0)", "return max(0, x)"],
    "even": ["return x % 2 == 0", "return not x % 2", "return bool(x % 2 == 0)"],
    "reverse": ["return text[::-1]", "return str(text[::-1])", "return text[len(text)::-1]"],
    "list_sum": ["return sum(values)", "return sum(values, 0)", "return sum([v for v in values])"],
}
# Wrong in every family: other families' bodies are added per task (NameError or wrong values).
FAILING_BODIES = ["return None", "pass", "return 0", "return x * 2.0", "return values", "return 1"]
INVALID_BODIES = [
    "return x +", "return (x", "retrun x", "return x.real", "import os", "print(x)",
    "while True:\n        pass", "for item in x:\n        pass", "return lambda: x", "return open('f')",
]
LIMIT_BODIES = ["return [0] * 10 ** 10", "return 'a' * 10 ** 10", "return str(10 ** 100) * 10 ** 12"]
TIME_LIMIT_BODY = "return len([a for a in str(10 ** 4000) for b in str(10 ** 4000) for c in str(10 ** 4000)])"


def candidate_mix(count: int, seed: int = 0) -> list[tuple]:
    """`count` (task, source, kind) triples drawn with a seeded RNG from the rl and dev tasks."""
    rng = random.Random(seed)
    tasks = frozen_tasks("rl", per_family=4) + frozen_tasks("dev", per_family=4)
    other_bodies = [body for bodies in PASSING_BODIES.values() for body in bodies]
    kinds = list(MIX_SHARES)
    weights = [MIX_SHARES[kind] for kind in kinds]
    mix = []
    for _ in range(count):
        task = rng.choice(tasks)
        kind = rng.choices(kinds, weights)[0]
        if kind == "passing":
            body = rng.choice(PASSING_BODIES[task.family])
        elif kind == "failing":
            wrong = [b for b in other_bodies if b not in PASSING_BODIES[task.family]]
            body = rng.choice(wrong + FAILING_BODIES)
        elif kind == "invalid":
            body = rng.choice(INVALID_BODIES)
        else:
            body = rng.choice(LIMIT_BODIES)
        mix.append((task, f"{task.prompt}\n    {body}\n", kind))
    return mix


def run(output: str, count: int = 3000, workers: int = 2, seed: int = 0, time_limit_cases: int = 4,
        repeats: int = 3, cpu_seconds: float = 1.0, wall_seconds: float = 2.0, memory_mb: int = 256) -> dict:
    """`glm53 bench verify`: the counts checked, `run_verify_benchmark`, its table printed and its receipt
    written to `output`."""
    for flag, value, least in (("--count", count, 1), ("--workers", workers, 1), ("--repeats", repeats, 1),
                               ("--time-limit-cases", time_limit_cases, 0)):
        if value < least:
            raise ValueError(f"{flag} must be >= {least}, got {value}")
    receipt = run_verify_benchmark(count=count, workers=workers, seed=seed, time_limit_cases=time_limit_cases,
                                   cpu_seconds=cpu_seconds, wall_seconds=wall_seconds, memory_mb=memory_mb,
                                   repeats=repeats)
    print(format_table(receipt))
    write_json(output, receipt)
    print(f"receipt: {output}")
    return receipt


def run_verify_benchmark(count: int = 3000, workers: int = 2, seed: int = 0, time_limit_cases: int = 4,
                         cpu_seconds: float = 1.0, wall_seconds: float = 2.0, memory_mb: int = 256,
                         repeats: int = 3) -> dict:
    """Time the isolated Verifier and the in-process evaluator on the same mix; return the receipt.

    Both are timed `repeats` times, interleaved; the headline is the best run of each, since on a
    shared machine other load only ever slows a run down. Every run is kept in the receipt.
    """
    mix = candidate_mix(count, seed)
    composition = Counter(kind for _, _, kind in mix)
    pairs = [(task, source) for task, source, _ in mix]
    # The unsafe baseline cannot survive the limit cases (that is the point), so it runs the rest.
    safe_subset = [(task, source) for task, source, kind in mix if kind != "limit"]
    isolated_seconds, in_process_seconds = [], []
    with Verifier(workers=workers, cpu_seconds=cpu_seconds, wall_seconds=wall_seconds,
                  memory_mb=memory_mb) as verifier:
        verifier.evaluate_many(pairs[:100])  # warm the pool
        for _ in range(repeats):
            start = time.perf_counter()
            in_process = [evaluate_in_process(task, source) for task, source in safe_subset]
            in_process_seconds.append(time.perf_counter() - start)
            start = time.perf_counter()
            isolated = verifier.evaluate_many(pairs)
            isolated_seconds.append(time.perf_counter() - start)
        time_limit_pairs = [(task, f"{task.prompt}\n    {TIME_LIMIT_BODY}\n") for task, _ in pairs[:time_limit_cases]]
        start = time.perf_counter()
        time_limited = verifier.evaluate_many(time_limit_pairs)
        time_limit_seconds = time.perf_counter() - start
        isolation = dict(verifier.isolation or {})

    isolated_safe = [result for result, (_, _, kind) in zip(isolated, mix) if kind != "limit"]
    mismatches = sum(
        (a.status, a.tests_passed) != (b.status, b.tests_passed) for a, b in zip(isolated_safe, in_process)
    )
    isolated_rate = len(mix) / min(isolated_seconds)
    in_process_rate = len(safe_subset) / min(in_process_seconds)
    return {
        "benchmark": "verify",
        "provenance": provenance(),
        "load_average_1min_after": os.getloadavg()[0],
        "workers": workers,
        "isolation": isolation,
        "seed": seed,
        "repeats": repeats,
        "limits": {"cpu_seconds": cpu_seconds, "wall_seconds": wall_seconds, "memory_mb": memory_mb},
        "mix": {"total": len(mix), **{kind: composition.get(kind, 0) for kind in MIX_SHARES}},
        "isolated": {
            "candidates": len(mix),
            "seconds_per_run": isolated_seconds,
            "candidates_per_second": isolated_rate,
            "statuses": dict(Counter(result.status for result in isolated)),
        },
        "in_process": {
            "candidates": len(safe_subset),
            "seconds_per_run": in_process_seconds,
            "candidates_per_second": in_process_rate,
            "statuses": dict(Counter(result.status for result in in_process)),
            "note": "UNSAFE baseline; limit candidates excluded because they would hang or exhaust memory",
        },
        "ratio_isolated_to_in_process": isolated_rate / in_process_rate,
        "status_mismatches_vs_in_process": mismatches,
        "time_limit_candidates": {
            "candidates": len(time_limit_pairs),
            "seconds": time_limit_seconds,
            "statuses": dict(Counter(result.status for result in time_limited)),
            "note": "each burns its CPU limit by design; timed apart from the mix",
        },
    }


def format_table(receipt: dict) -> str:
    iso, inp = receipt["isolated"], receipt["in_process"]
    mix = receipt["mix"]
    tl = receipt["time_limit_candidates"]
    rows = [
        ("sandbox isolation", _isolation_line(receipt.get("isolation") or {})),
        ("mix", ", ".join(f"{kind} {mix[kind]}" for kind in MIX_SHARES) + f" (total {mix['total']})"),
        (f"isolated, {receipt['workers']} workers", f"{iso['candidates_per_second']:,.0f} candidates/s "
                                                     f"(best of {_runs(iso)})"),
        ("in-process (unsafe)", f"{inp['candidates_per_second']:,.0f} candidates/s (best of {_runs(inp)})"),
        ("ratio isolated / in-process", f"{receipt['ratio_isolated_to_in_process']:.3f}"),
        ("status mismatches", str(receipt["status_mismatches_vs_in_process"])),
        ("CPU-limit candidates", f"{tl['candidates']} in {tl['seconds']:.2f} s, statuses {tl['statuses']}"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _isolation_line(isolation: dict) -> str:
    level = isolation.get("level", "unknown")
    missing = isolation.get("missing") or []
    return level + (f" (missing: {', '.join(missing)})" if missing else "")


def _runs(timing: dict) -> str:
    return ", ".join(f"{timing['candidates'] / seconds:,.0f}" for seconds in timing["seconds_per_run"])
