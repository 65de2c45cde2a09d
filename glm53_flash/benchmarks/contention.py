"""`glm53 bench contention`: the training step and the cached decode step, quiet and beside one CPU-bound
process this benchmark starts itself (in its own session, ending by itself after a bounded time, and
killed when the measurement ends), with the thread count fixed and with the ThreadGovernor
(`--adapt-threads`), all in one process so the ratios share the machine's state.

With `--spin-counts` (compare_spin_counts) it runs that measurement once per OpenMP spin count in a child
process (GOMP_SPINCOUNT is read when libgomp loads, so one process cannot hold two), round after round in
alternating order, and pairs each round's figures with the first count's. With `--mid-run` (busy_mid_run)
it times whole pretraining runs instead, the busy process starting mid-run. `measure` is the command."""

from __future__ import annotations

import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

from glm53_flash.core.receipts import provenance, read_json, write_json
from glm53_flash.core.shared_machine import ThreadGovernor
from glm53_flash.model import GLM53Flash
from glm53_flash.model.config import ModelConfig
from glm53_flash.train.engine import PRETRAINING, make_optimizer
from glm53_flash.train.objective import language_model_update


@contextmanager
def competitor(seconds: float):
    """One CPU-bound Python process in a new session that stops itself after `seconds`."""
    process = subprocess.Popen([sys.executable, "-c", f"import time\nend = time.monotonic() + {seconds}\n"
                                "while time.monotonic() < end:\n    pass\n"], start_new_session=True)
    time.sleep(0.3)  # it is running before the first timed step
    try:
        yield process
    finally:
        process.kill()
        process.wait()


FP32_WARMUP = 3  # untimed float32 training steps before the first condition


def _timed(fn, count: int, governor: ThreadGovernor | None = None) -> tuple[list[float], list[int]]:
    seconds, threads = [], []
    for _ in range(count):
        threads.append(torch.get_num_threads())
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
        if governor is not None:
            governor.after_step()
    return seconds, threads


def _median(values: list[float]) -> float:
    return statistics.median(values)


def run(preset: str = "flash", batch_size: int = 32, sequence_length: int = 128, steps: int = 3,
        decode_batch: int = 16, decode_tokens: int = 16, output: str | None = None, quiet: bool = False,
        precision: str | None = None) -> dict:
    """`precision` (fp32, bf16, auto; None: the default, float32 on the CPU) is what both steps run in;
    bf16 warms up PRECISION_WARMUP training steps first (its kernels compile per shape)."""
    from glm53_flash.benchmarks.model import PRECISION_WARMUP
    from glm53_flash.model.precision import compute_in, resolve_precision

    resolved = resolve_precision(precision, "cpu")
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    config = ModelConfig.preset(preset)
    model = GLM53Flash(config)
    optimizer = make_optimizer(model, PRETRAINING)
    ids = torch.randint(4, 260, (batch_size, sequence_length + 1), generator=torch.Generator().manual_seed(0))
    inputs, labels = ids[:, :-1], ids[:, 1:]

    def train_step():
        language_model_update(model, optimizer, inputs, labels, PRETRAINING, precision=resolved)

    prompt = torch.randint(4, 260, (decode_batch, 8), generator=torch.Generator().manual_seed(1))

    def decode_steps():
        with torch.inference_mode(), compute_in(resolved, "cpu"):
            cache = model.new_cache(decode_batch)
            out = model(prompt, cache=cache)
            token = out.logits[:, -1:].argmax(-1)
            for _ in range(decode_tokens):
                token = model(token, cache=cache).logits[:, -1:].argmax(-1)

    def say(text: str) -> None:
        if not quiet:
            print(f"[bench contention] {text}", flush=True)

    rows = {}
    # warm: the first steps allocate and fault in their pages (a fresh process's first few fp32 flash steps
    # ran up to 1.5x the later ones on a 2-core EPYC; bf16 also compiles its kernels per shape)
    for _ in range(PRECISION_WARMUP if resolved.name == "bf16" else FP32_WARMUP):
        train_step()
    for _ in range(2):
        decode_steps()

    def measure(name: str, governed: bool) -> None:
        torch.set_num_threads(threads)
        governor = ThreadGovernor(threads) if governed else None
        # the governed runs take one extra step: the first one is what it learns from
        count = steps + 1 if governed else steps
        train, train_threads = _timed(train_step, count, governor)
        decode, _ = _timed(decode_steps, count, governor)
        kept = slice(1, None) if governed else slice(None)
        rows[name] = {"train_step_seconds": train, "train_threads": train_threads,
                      "train_step_median": _median(train[kept]), "decode_seconds": decode,
                      "decode_median": _median(decode[kept]), "decode_tokens": decode_tokens}
        say(f"{name}: training step {rows[name]['train_step_median']:.2f} s (threads {train_threads}), "
            f"{decode_tokens} decode steps {rows[name]['decode_median']:.2f} s")

    measure("quiet_fixed", False)
    # what the fixed-thread steps so far computed: a run under another spin count must match it bit for bit
    weights = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    measure("quiet_adaptive", True)
    budget = 60.0 * (4 * steps + 4) * max(1.0, rows["quiet_fixed"]["train_step_median"])
    with competitor(budget):
        measure("busy_fixed", False)
        measure("busy_adaptive", True)
    torch.set_num_threads(threads)
    base = rows["quiet_fixed"]
    ratios = {
        "train_busy_fixed_over_quiet": rows["busy_fixed"]["train_step_median"] / base["train_step_median"],
        "train_busy_adaptive_over_quiet": rows["busy_adaptive"]["train_step_median"] / base["train_step_median"],
        "train_quiet_adaptive_over_quiet": rows["quiet_adaptive"]["train_step_median"] / base["train_step_median"],
        "decode_busy_fixed_over_quiet": rows["busy_fixed"]["decode_median"] / base["decode_median"],
        "decode_busy_adaptive_over_quiet": rows["busy_adaptive"]["decode_median"] / base["decode_median"],
        "decode_quiet_adaptive_over_quiet": rows["quiet_adaptive"]["decode_median"] / base["decode_median"],
    }
    receipt = {"schema_version": "1.0", "kind": "bench-contention", "preset": preset, "batch_size": batch_size,
               "sequence_length": sequence_length, "steps": steps, "decode_batch": decode_batch, "threads": threads,
               "precision": resolved.record(),
               "competitor": "one CPU-bound python process in its own session, bounded in time, killed after",
               "runs": rows, "ratios": ratios, "weights_sha256_after_quiet_fixed": weights,
               "provenance": provenance(device="cpu")}
    for name, value in ratios.items():
        say(f"{name}: {value:.2f}x")
    return _written(receipt, output, quiet)


def _spread(values: list[float]) -> dict:
    return {"median": _median(values), "min": min(values), "max": max(values), "rounds": values}


def _written(receipt: dict, output: str | None, quiet: bool) -> dict:
    """The receipt, written to `output` first when one is given (saying so unless `quiet`)."""
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        write_json(output, receipt)
        if not quiet:
            print(f"[bench contention] wrote {output}")
    return receipt


def compare_spin_counts(spin_counts: list[int], rounds: int = 2, output: str | None = None, quiet: bool = False,
                        **settings) -> dict:
    """`run(**settings)` in a child process per spin count (GOMP_SPINCOUNT), `rounds` times, the order
    reversed every other round. Per count: each condition's median over rounds, and the ratios paired
    within a round: busy over quiet (fixed threads), and quiet against the first count's quiet."""
    if len(spin_counts) < 2 or any(count < 0 for count in spin_counts) or len(set(spin_counts)) != len(spin_counts):
        raise ValueError(f"--spin-counts needs at least two distinct counts >= 0, got {spin_counts}")
    if rounds < 1:
        raise ValueError("--rounds must be at least 1")
    flags = []
    for name, value in settings.items():
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    children: dict[int, list[dict]] = {count: [] for count in spin_counts}
    with tempfile.TemporaryDirectory() as scratch:
        for index in range(rounds):
            order = spin_counts if index % 2 == 0 else spin_counts[::-1]
            for count in order:
                path = Path(scratch) / f"round{index}-spin{count}.json"
                env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
                env["GOMP_SPINCOUNT"] = str(count)
                if not quiet:
                    print(f"[bench contention] round {index + 1}/{rounds}, GOMP_SPINCOUNT={count}", flush=True)
                done = subprocess.run([sys.executable, "-m", "glm53_flash.cli", "bench", "contention", *flags,
                                       "--output", str(path)], env=env, capture_output=quiet, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"the child with GOMP_SPINCOUNT={count} failed ({done.returncode})"
                                       + (f": {done.stderr.strip()[-800:]}" if quiet else ""))
                children[count].append(read_json(path))
    reference = spin_counts[0]
    per_count = {}
    for count in spin_counts:
        runs = children[count]
        medians = {f"{condition}_{what}": _spread([r["runs"][condition][f"{what}_median"] for r in runs])
                   for condition in ("quiet_fixed", "busy_fixed", "quiet_adaptive", "busy_adaptive")
                   for what in ("train_step", "decode")}
        ratios = {name: _spread([r["ratios"][name] for r in runs])
                  for name in ("train_busy_fixed_over_quiet", "decode_busy_fixed_over_quiet",
                               "train_busy_adaptive_over_quiet", "decode_busy_adaptive_over_quiet")}
        for what, key in (("train", "train_step_median"), ("decode", "decode_median")):
            ratios[f"{what}_quiet_over_spin_{reference}"] = _spread(
                [mine["runs"]["quiet_fixed"][key] / theirs["runs"]["quiet_fixed"][key]
                 for mine, theirs in zip(runs, children[reference])])
        per_count[str(count)] = {"medians": medians, "ratios": ratios,
                                 "spin_waits": [r["provenance"].get("spin_waits") for r in runs]}
    hashes = {r["weights_sha256_after_quiet_fixed"] for runs in children.values() for r in runs}
    receipt = {"schema_version": "1.0", "kind": "bench-contention-spin-counts", "spin_counts": spin_counts,
               "reference": reference, "rounds": rounds, "settings": settings, "per_count": per_count,
               "same_weights_every_child": len(hashes) == 1, "children": children,
               "provenance": provenance(device="cpu")}
    if not quiet:
        for count in spin_counts:
            r = per_count[str(count)]["ratios"]
            print(f"[bench contention] GOMP_SPINCOUNT={count}: busy/quiet (fixed threads) training "
                  f"{r['train_busy_fixed_over_quiet']['median']:.2f}x, decode "
                  f"{r['decode_busy_fixed_over_quiet']['median']:.2f}x; quiet against {reference}: training "
                  f"{r[f'train_quiet_over_spin_{reference}']['median']:.3f}x, decode "
                  f"{r[f'decode_quiet_over_spin_{reference}']['median']:.3f}x", flush=True)
        print(f"[bench contention] the same weights in every child: {receipt['same_weights_every_child']}")
    return _written(receipt, output, quiet)


# name -> (the busy process starts mid-run, the child's GOMP_SPINCOUNT: None leaves it unset, so the command
# chooses; libgomp's own default set explicitly is kept, which leaves the run on the long spins throughout)
MID_RUN_CONDITIONS = {"quiet": (False, None), "busy_going_on": (True, "300000"), "busy_restarting": (True, None)}
COMPETITOR_SECONDS = 3600  # a whole run's busy process's own bound; it is killed when its run ends


def _watched_run(argv: list[str], env: dict, out: Path, busy_after: int | None, log: Path) -> dict:
    """One `glm53 pretrain` child; with `busy_after`, the competitor starts once its metrics hold that many
    steps and runs until the child ends. -> wall seconds, the final weights' sha256, the receipt's spin waits,
    whether it restarted."""
    start = time.perf_counter()
    with open(log, "w") as stderr, ExitStack() as busy:
        child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            metrics = out / "metrics.jsonl"
            while busy_after is not None and child.poll() is None:
                if metrics.exists() and len(metrics.read_text().splitlines()) >= busy_after:
                    busy.enter_context(competitor(COMPETITOR_SECONDS))  # stopped as the child ends
                    break
                time.sleep(0.05)
            code = child.wait()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    seconds = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"the pretraining child failed ({code}): {log.read_text().strip()[-800:]}")
    receipt = read_json(out / "training-receipt.json")
    spin_waits = receipt["provenance"].get("spin_waits") or ""
    return {"wall_seconds": seconds, "final_weights_sha256": receipt["checkpoints"][-1]["weights_sha256"],
            "spin_waits": spin_waits, "restarted": "restarted when" in spin_waits,  # what the last process said
            "elapsed_seconds": receipt["elapsed_seconds"]}


def busy_mid_run(preset: str = "flash", batch_size: int = 32, sequence_length: int = 128, steps: int = 12,
                 busy_after: int = 3, checkpoint_every: int = 4, precision: str | None = None,
                 output: str | None = None, quiet: bool = False) -> dict:
    """A pretraining run of `steps` steps (`glm53 pretrain` in a child process, a checkpoint every
    `checkpoint_every`) three times: quiet; with this bench's busy process started after `busy_after`
    steps, the run going on with libgomp's long spins (GOMP_SPINCOUNT=300000 set, which the command keeps);
    and the same with the command's own choice, which restarts with short spins when that pays
    (shared_machine.ShortSpinRestart). Wall times from spawn to exit, and whether all three end on the same
    weights."""
    if not 1 <= busy_after < steps:
        raise ValueError(f"--busy-after must lie in [1, --mid-run) = [1, {steps}), got {busy_after}")
    if checkpoint_every < 1:
        raise ValueError(f"--checkpoint-every must be at least 1, got {checkpoint_every}")
    checkpoints = ",".join(str(p) for p in range(checkpoint_every, steps + 1, checkpoint_every)) or str(steps)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="glm53-bench-mid-run-") as scratch:
        for name, (busy, spin_count) in MID_RUN_CONDITIONS.items():
            out = Path(scratch) / name
            env = {key: value for key, value in os.environ.items() if key not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
            if spin_count is not None:
                env["GOMP_SPINCOUNT"] = spin_count
            argv = [sys.executable, "-m", "glm53_flash.cli", "pretrain", "--preset", preset, "--steps", str(steps),
                    "--checkpoints", checkpoints, "--batch-size", str(batch_size), "--sequence-length",
                    str(sequence_length), "--device", "cpu", "--precision", precision or "fp32", "--no-progress",
                    "--output", str(out)]
            if not quiet:
                print(f"[bench contention {time.strftime('%H:%M:%S')}] mid-run: {name}", flush=True)
            runs[name] = _watched_run(argv, env, out, busy_after if busy else None, Path(scratch) / f"{name}.log")
            if not quiet:
                r = runs[name]
                print(f"[bench contention] {name}: {r['wall_seconds']:.1f} s"
                      + (" (restarted)" if r["restarted"] else ""), flush=True)
    quiet_seconds = runs["quiet"]["wall_seconds"]
    receipt = {"schema_version": "1.0", "kind": "bench-contention-mid-run",
               "settings": {"preset": preset, "batch_size": batch_size, "sequence_length": sequence_length,
                            "steps": steps, "busy_after": busy_after, "checkpoints": checkpoints,
                            "precision": precision or "fp32"},
               "runs": runs,
               "ratios": {f"{name}_over_quiet": runs[name]["wall_seconds"] / quiet_seconds
                          for name in ("busy_going_on", "busy_restarting")},
               "same_weights_every_run": len({r["final_weights_sha256"] for r in runs.values()}) == 1,
               "provenance": provenance(device="cpu")}
    if not quiet:
        ratios = receipt["ratios"]
        print(f"[bench contention] whole run beside a core taken after step {busy_after}, over quiet: going on "
              f"{ratios['busy_going_on_over_quiet']:.2f}x, restarting {ratios['busy_restarting_over_quiet']:.2f}x; "
              f"the same weights in every run: {receipt['same_weights_every_run']}", flush=True)
    return _written(receipt, output, quiet)


def measure(preset: str = "flash", batch_size: int = 32, sequence_length: int = 128, steps: int = 3,
            decode_batch: int = 16, decode_tokens: int = 16, precision: str | None = None,
            spin_counts: str | None = None, rounds: int = 2, mid_run: int | None = None, busy_after: int = 3,
            checkpoint_every: int = 4, output: str | None = None) -> dict:
    """`glm53 bench contention`: the quiet and busy steps (`run`); with `spin_counts` ('300000,1000') the
    same in a child process per OpenMP spin count, `rounds` times (`compare_spin_counts`); or with `mid_run`
    (steps) whole pretraining runs, the busy process starting after `busy_after` steps (`busy_mid_run`)."""
    if mid_run is not None:
        if spin_counts is not None:
            raise ValueError("--mid-run and --spin-counts are two measurements: take one")
        return busy_mid_run(preset=preset, batch_size=batch_size, sequence_length=sequence_length, steps=mid_run,
                            busy_after=busy_after, checkpoint_every=checkpoint_every, precision=precision,
                            output=output)
    step = dict(preset=preset, batch_size=batch_size, sequence_length=sequence_length, steps=steps,
                decode_batch=decode_batch, decode_tokens=decode_tokens, precision=precision)
    if spin_counts is not None:
        try:
            counts = [int(part) for part in spin_counts.split(",")]
        except ValueError:
            raise ValueError(f"--spin-counts takes comma-separated whole numbers, got {spin_counts!r}") from None
        return compare_spin_counts(counts, rounds=rounds, output=output, **step)
    return run(output=output, **step)


__all__ = ["busy_mid_run", "competitor", "compare_spin_counts", "measure", "run"]
