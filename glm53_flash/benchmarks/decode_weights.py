"""`glm53 bench decode-weights`: a cached decode step reading float32 weights against the same step
reading bf16 copies of the weight products' weights (`--precision bf16` on the CPU), each against one
read of the weights it reads, interleaved in one process.

A decode step of a few rows is bound by reading the weights: each weight byte is used once per row.
In bf16 the one-call decode step (ops.DecodeStack; model/ops/kernels.c, `wload`) read bf16 copies of every block's qkv,
output, expert and shared-expert matrices and widen them to float32 in registers; the router, the norms,
the stream logits and the tied head stay float32. So "one read of the weights in the precision used" is
the bf16 copies plus the float32 rest. Each read floor is timed as a float32 sum over the same bytes (a
bf16 buffer viewed as float32), so both floors run one kernel at the memory's pace.
"""

from __future__ import annotations

import statistics
import time

import torch

from glm53_flash.benchmarks.common import print_table
from glm53_flash.core.receipts import provenance, write_json
from glm53_flash.model import GLM53Flash, ops
from glm53_flash.model.ops import library
from glm53_flash.model.ops.decode_model import block_weights
from glm53_flash.model.config import ModelConfig
from glm53_flash.model.precision import compute_in, cpu_bf16_flags, resolve_precision


def weight_products(model: GLM53Flash) -> list[torch.Tensor]:
    """The weights a decode step reads in bf16 under compute_in(bf16): each block's ops.PRODUCT_WEIGHTS
    (ops/decode_model.py makes their bf16 copies)."""
    return [layer[name] for layer in map(block_weights, model.blocks) for name in ops.PRODUCT_WEIGHTS]


def read_floor(tensors: list[torch.Tensor]) -> callable:
    """A function reading every byte of `tensors` once (float32 sums; bf16 buffers viewed as float32)."""
    views = [t.reshape(-1).view(torch.float32) if t.dtype == torch.bfloat16 else t.reshape(-1) for t in tensors]

    def read():
        for v in views:
            v.sum()
    return read


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def run(preset: str = "flash", batch: int = 16, prompt_length: int = 64, steps: int = 48, rounds: int = 5,
        output: str | None = None) -> dict:
    for name, value in (("--batch", batch), ("--steps", steps), ("--rounds", rounds),
                        ("--prompt-length", prompt_length)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    cfg = ModelConfig.preset(preset)
    if prompt_length + steps > cfg.max_sequence_length:
        raise ValueError(f"--prompt-length + --steps = {prompt_length + steps} exceeds the {preset} preset's context "
                         f"of {cfg.max_sequence_length}")
    if not ops.available():
        raise RuntimeError("the C decode kernels are not available here (glm53 info says why): the bf16 weight "
                           "path is theirs")
    torch.manual_seed(0)
    model = GLM53Flash(cfg).eval()
    bf16 = resolve_precision("bf16", "cpu")
    prompt = torch.randint(4, 260, (batch, prompt_length), generator=torch.Generator().manual_seed(1))
    products = weight_products(model)
    ids = {id(p) for p in products}
    rest = [p for p in model.parameters() if id(p) not in ids]
    copies = [p.detach().to(torch.bfloat16) for p in products]
    floors = {"fp32": read_floor(products + rest), "bf16": read_floor(copies + rest)}
    weight_bytes = {"fp32": sum(p.numel() * 4 for p in products + rest),
                    "bf16": sum(p.numel() * 2 for p in products) + sum(p.numel() * 4 for p in rest)}

    def decode(precision):
        """Seconds per cached step after a float32 prefill, the steps' logits, and the seconds per step
        spent inside the C kernels' calls (each timed: about a microsecond per call)."""
        with torch.inference_mode():
            cache = model.new_cache(batch)
            logits = model(prompt, cache=cache).logits[:, -1]
            out = []
            spent = [0.0]
            with compute_in(precision, "cpu"), library.timed_calls(spent):
                start = time.perf_counter()
                for _ in range(steps):
                    logits = model(logits.argmax(-1, keepdim=True), cache=cache).logits[:, -1]
                    out.append(logits)
                seconds = (time.perf_counter() - start) / steps
        return seconds, torch.stack(out), spent[0] / steps

    with torch.inference_mode():
        for precision in (None, bf16):  # warm-up: the kernels' first calls and the bf16 copies
            decode(precision)
        samples = {key: [] for key in ("fp32", "bf16", "read_fp32", "read_bf16", "kernels_fp32", "kernels_bf16")}
        last = {}
        for _ in range(rounds):  # interleaved, so a burst of load lands on both sides
            for name, precision in (("fp32", None), ("bf16", bf16)):
                seconds, last[name], inside = decode(precision)
                samples[name].append(seconds)
                samples[f"kernels_{name}"].append(inside)
                samples[f"read_{name}"].append(_best(floors[name], 5))
    median = {name: statistics.median(values) for name, values in samples.items()}
    # the step's seconds in the C kernels (the one-call block step, the head) and outside them, per round
    kernel = {name: {"kernel_seconds": median[f"kernels_{name}"], "kernel_seconds_all": samples[f"kernels_{name}"],
                     "other_seconds": statistics.median(step - inside for step, inside
                                                        in zip(samples[name], samples[f"kernels_{name}"]))}
              for name in ("fp32", "bf16")}
    fp32_logits, bf16_logits = last["fp32"], last["bf16"]
    agreement = float((fp32_logits.argmax(-1) == bf16_logits.argmax(-1)).float().mean())
    scale = float(fp32_logits.abs().max())
    result = {
        "benchmark": "decode-weights", "preset": preset, "batch": batch, "prompt_length": prompt_length,
        "steps": steps, "rounds": rounds, "cpu_bf16_flags": cpu_bf16_flags(), "precision": bf16.record(),
        "weight_bytes": weight_bytes,
        "step_seconds": {name: {"median": median[name], "min": min(samples[name]), "max": max(samples[name]),
                                "all": samples[name]} for name in ("fp32", "bf16")},
        "weight_read_seconds": {name: {"median": median[f"read_{name}"], "all": samples[f"read_{name}"]}
                                for name in ("fp32", "bf16")},
        "step_over_weight_read": {name: median[name] / median[f"read_{name}"] for name in ("fp32", "bf16")},
        "bf16_speedup": median["fp32"] / median["bf16"],
        "bf16_speedup_per_round": [a / b for a, b in zip(samples["fp32"], samples["bf16"])],
        # medians over the rounds: the step's seconds in the C kernels' calls and outside them
        "split_per_step": kernel,
        # the two runs decode greedily from the same prompt: each step's argmax, and the logits' gap
        "greedy_agreement": agreement,
        "largest_logit_difference_relative": float((fp32_logits - bf16_logits).abs().max()) / scale,
        "provenance": provenance(device="cpu"),
    }
    mib = 2**20
    print_table([
        ("weights read per step", f"fp32 {weight_bytes['fp32'] / mib:.1f} MiB, bf16 {weight_bytes['bf16'] / mib:.1f} MiB"),
        ("decode step (median)", f"fp32 {1e3 * median['fp32']:.2f} ms, bf16 {1e3 * median['bf16']:.2f} ms "
                                 f"({result['bf16_speedup']:.2f}x; rounds "
                                 + ", ".join(f"{r:.2f}" for r in result["bf16_speedup_per_round"]) + ")"),
        ("one read of those weights", f"fp32 {1e3 * median['read_fp32']:.2f} ms, bf16 {1e3 * median['read_bf16']:.2f} ms"),
        ("step / weight read", f"fp32 {result['step_over_weight_read']['fp32']:.2f}x, "
                               f"bf16 {result['step_over_weight_read']['bf16']:.2f}x"),
        ("in the C kernels / outside", ", ".join(
            f"{name} {1e3 * kernel[name]['kernel_seconds']:.2f} / {1e3 * kernel[name]['other_seconds']:.2f} ms"
            for name in ("fp32", "bf16"))),
        ("greedy tokens agreeing", f"{100 * agreement:.1f}% of {batch} x {steps}"),
    ], title=f"decode weights, {preset}, batch {batch}, {steps} steps, {rounds} rounds")
    if output:
        write_json(output, result)
    return result
