"""`glm53 bench contention`: the training step and the cached decode step, quiet and beside one CPU-bound
process this benchmark starts itself (in its own session, ending by itself after a bounded time, and
killed when the measurement ends), with the thread count fixed and with the ThreadGovernor
(`--adapt-threads`), all in one process so the ratios share the machine's state."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from glm53_flash.core.receipts import provenance, write_json
from glm53_flash.core.runtime import ThreadGovernor
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
    for _ in range(PRECISION_WARMUP if resolved.name == "bf16" else 1):  # warm: the first step allocates
        train_step()
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
               "runs": rows, "ratios": ratios, "provenance": provenance(device="cpu")}
    for name, value in ratios.items():
        say(f"{name}: {value:.2f}x")
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        write_json(output, receipt)
        say(f"wrote {output}")
    return receipt


__all__ = ["competitor", "run"]
