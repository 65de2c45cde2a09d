"""`glm53 bench decode`: rollouts/s of the batched cached sampler against the original's generation,
and the wall time of a sampled evaluation (64 tasks x 8 samples), on the flash model with seeded
random weights. The original generated one task at a time with a full re-forward per token.
"""

from __future__ import annotations

import os
import time

import torch

from glm53_flash.model.config import ModelConfig
from glm53_flash.model import GLM53Flash
from glm53_flash.core.receipts import peak_rss_bytes, provenance, write_json
from glm53_flash.core.runtime import resolve_device
from glm53_flash.model.precision import compute_in
from glm53_flash.evaluation.config import SAMPLED_DEFAULTS
from glm53_flash.evaluation.sampling import BANNED_IDS, SamplingSettings, generate
from glm53_flash.tasks import frozen_tasks
from glm53_flash.data.tokenizer import ByteTokenizer
from glm53_flash.benchmarks.common import print_table, synchronize

MODEL_SEED = 0
SAMPLING_SEED = 8675309


@torch.inference_mode()
def original_generate(model, prompt: str, samples: int, max_new_tokens: int, temperature: float,
                      generator: torch.Generator) -> list[list[int]]:
    """The original's generate_group (seed-core 4.2) for one task, run to the cap.

    `samples` identical rows; every step is a full forward over the whole sequence (no cache), the
    last logits in fp32 are tempered, PAD/BOS/SEP (and here EOS, so that every row generates the same
    number of tokens as the sampler's stop='none') are masked, one multinomial draw per row, and the
    per-row Python bookkeeping. The original's per-token parse check is left out, as on our side.
    """
    device = next(model.parameters()).device
    rows = torch.tensor([ByteTokenizer().encode(prompt, bos=True)] * samples, dtype=torch.long, device=device)
    recorded: list[list[int]] = [[] for _ in range(samples)]
    for _ in range(max_new_tokens):
        with compute_in(None, device):
            logits = model(rows).logits[:, -1].float() / temperature
        logits[:, list(BANNED_IDS) + [ByteTokenizer.eos_id]] = float("-inf")
        chosen = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
        for row, token in zip(recorded, chosen[:, 0].tolist()):
            row.append(token)
        rows = torch.cat([rows, chosen], dim=1)
    return recorded


def _evenly_spaced(count: int, total: int) -> list[int]:
    return sorted({(i * total) // count for i in range(count)})


def bench_sampling(model, device, tasks, samples, max_new_tokens, temperature, baseline_tasks) -> dict:
    prompts = [t.prompt for t in tasks]
    keys = [t.task_id for t in tasks]
    # Warm-up: first calls pay for allocator growth and kernel selection.
    generate(model, prompts[:2], SamplingSettings(samples=2, max_new_tokens=4, temperature=temperature,
                                                  keys=tuple(keys[:2]), stop="none"))
    synchronize(device)
    start = time.perf_counter()
    ours = generate(model, prompts, SamplingSettings(samples=samples, max_new_tokens=max_new_tokens,
                                                     temperature=temperature, seed=SAMPLING_SEED, keys=tuple(keys),
                                                     stop="none"))
    synchronize(device)
    ours_seconds = time.perf_counter() - start
    rollouts = len(tasks) * samples
    tokens = sum(len(c.token_ids) for row in ours for c in row)

    chosen = _evenly_spaced(min(baseline_tasks, len(tasks)), len(tasks))
    generator = torch.Generator(device=device).manual_seed(SAMPLING_SEED)
    model.eval()
    original_generate(model, prompts[0], 2, 2, temperature, generator)  # warm-up
    synchronize(device)
    start = time.perf_counter()
    baseline_tokens = 0
    for index in chosen:
        out = original_generate(model, prompts[index], samples, max_new_tokens, temperature, generator)
        baseline_tokens += sum(len(row) for row in out)
    synchronize(device)
    baseline_measured = time.perf_counter() - start
    baseline_rollouts = len(chosen) * samples
    baseline_per_second = baseline_rollouts / baseline_measured
    ours_per_second = rollouts / ours_seconds
    return {
        "split": tasks[0].task_id.partition("-")[0] if tasks else None, "tasks": len(tasks),
        "samples_per_task": samples, "max_new_tokens": max_new_tokens,
        "temperature": temperature, "stop": "none (EOS masked on both sides: every row generates the cap)",
        "rollouts": rollouts,
        "batched_cached": {"seconds": ours_seconds, "rollouts_per_second": ours_per_second,
                           "generated_tokens": tokens, "tokens_per_second": tokens / ours_seconds},
        "original_reforward": {
            "tasks_timed": len(chosen), "task_ids_timed": [tasks[i].task_id for i in chosen],
            "rollouts_timed": baseline_rollouts, "seconds_measured": baseline_measured,
            "generated_tokens_timed": baseline_tokens,
            "rollouts_per_second": baseline_per_second,
            "seconds_for_all_tasks": rollouts / baseline_per_second,
            "scaled": len(chosen) < len(tasks),
        },
        "speedup": ours_per_second / baseline_per_second,
    }


def bench_eval(model, per_family: int, samples: int) -> dict:
    """Wall time of evaluate_sampled (the original took 101 s on confirm on an RTX 3080 Ti). It runs on
    dev: confirm is sealed (ledger.py), and a benchmark is no reason to open it."""
    from glm53_flash.evaluation.evaluate import evaluate_sampled
    from glm53_flash.verifier import Verifier

    tasks = frozen_tasks("dev", per_family)
    start = time.perf_counter()
    with Verifier() as verifier:
        receipt = evaluate_sampled(model, tasks, samples=samples, temperature=SAMPLED_DEFAULTS["temperature"],
                                   seed=SAMPLED_DEFAULTS["seed"], verifier=verifier)
    wall = time.perf_counter() - start
    summary = receipt["summary"]
    return {
        "split": "dev", "per_family": per_family, "tasks": len(tasks), "samples_per_task": samples,
        "temperature": SAMPLED_DEFAULTS["temperature"], "stop": "parse",
        "wall_seconds_with_verifier_startup": wall, "timing": receipt["timing"],
        "token_cap_hits": summary["token_cap_hits"], "rollouts": summary["rollouts_total"],
        "exact_rollouts": summary["exact_rollouts"], "valid_rollouts": summary["valid_rollouts"],
        "note": "random weights: most rollouts run to the token cap (token_cap_hits), close to the slowest case",
    }


def run(device: str = "cpu", preset: str = "flash", per_family: int = 3, samples: int = 16,
        max_new_tokens: int = 48, temperature: float = SAMPLED_DEFAULTS["temperature"], baseline_tasks: int | None = None,
        eval_per_family: int = 8, eval_samples: int = 8, threads: int | None = None,
        output: str | None = None) -> dict:
    for name, value in (("per_family", per_family), ("samples", samples), ("max_new_tokens", max_new_tokens)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if baseline_tasks is not None and baseline_tasks < 1:
        raise ValueError(f"baseline_tasks must be >= 1, got {baseline_tasks}")
    if eval_per_family < 0 or eval_samples < 1:
        raise ValueError("eval_per_family must be >= 0 and eval_samples >= 1")
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    device = resolve_device(device)
    torch.manual_seed(MODEL_SEED)
    cfg = ModelConfig.preset(preset)
    model = GLM53Flash(cfg).to(device)
    tasks = frozen_tasks("dev", per_family)  # timing on dev: its prompts are confirm's but for the random function names
    if baseline_tasks is None:
        baseline_tasks = len(tasks) if device.type == "cuda" else 2
    load_before = os.getloadavg()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sampling = bench_sampling(model, device, tasks, samples, max_new_tokens, temperature, baseline_tasks)
    evaluation = bench_eval(model, eval_per_family, eval_samples) if eval_per_family else None
    result = {
        "benchmark": "decode", "preset": preset, "parameter_counts": model.parameter_counts(),
        "weights": f"random (torch.manual_seed({MODEL_SEED}))", "device": str(device),
        "torch_threads": torch.get_num_threads(), "load_average_before": list(load_before),
        "sampling": sampling, "evaluation": evaluation,
        "peak_memory_bytes": (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
                              else peak_rss_bytes()),
        "peak_memory_kind": "cuda_max_allocated" if device.type == "cuda" else "process_peak_rss",
        "provenance": provenance(device=str(device)),
    }
    base = sampling["original_reforward"]
    rows = [
        ("device", f"{device} ({torch.get_num_threads()} threads, load {load_before[0]:.1f})"),
        ("work", f"{sampling['tasks']} dev tasks x {samples} samples x {max_new_tokens} new tokens, "
                 f"T {temperature}"),
        ("batched + cached", f"{sampling['batched_cached']['rollouts_per_second']:.1f} rollouts/s "
                             f"({sampling['batched_cached']['seconds']:.1f} s)"),
        ("original re-forward", f"{base['rollouts_per_second']:.2f} rollouts/s "
                                f"({base['seconds_measured']:.1f} s for {base['tasks_timed']} tasks"
                                + (f", {base['seconds_for_all_tasks']:.0f} s scaled to all" if base["scaled"] else "")
                                + ")"),
        ("speedup", f"{sampling['speedup']:.1f}x"),
    ]
    if evaluation:
        timing = evaluation["timing"]
        rows += [
            (f"eval {evaluation['tasks']}x{eval_samples}",
             f"{timing['total_seconds']:.1f} s (generation {timing['generation_seconds']:.1f} s, "
             f"verification {timing['verification_seconds']:.1f} s), "
             f"{evaluation['token_cap_hits']}/{evaluation['rollouts']} at the token cap"),
        ]
    print_table(rows, title=f"glm53 bench decode  preset={preset}  params={model.parameter_counts()['total']:,}")
    if output:
        write_json(output, result)
        print(f"wrote {output}")
    return result
