"""`glm53 bench linear-attention`: a linear-attention layer's forward and backward over a whole sequence
longer than its chunk, by the C scan (ops.linear_attention_scan_*, what training takes on the CPU) against
the torch form it replaced (chunks, exclusive prefix sums of per-chunk states; what CUDA and a CPU without
the kernels take), alternating round by round in one process, at the shapes a run trains: the study
model's (4 heads of 24 at 192 positions) and the flash model's (6 heads of 32) by default.

Both compute the same layer on the same qkv product: the feature map, the optional rotation, the
attention and the backward to qkv (the products around it are the same for both and left out). The
receipt also holds the largest gap between the two outputs and gradients, relative to their size.
With `--step`, each preset's whole pretraining step (the model's forward, backward and AdamW at that
length, in the precision `auto` resolves to) is also timed with the scan and with the chunks
(`ops.linear_attention.SCAN_ENABLED`), one step each per round.
"""

from __future__ import annotations

import statistics
import time

import torch

from glm53_flash.benchmarks.common import print_table
from glm53_flash.core.receipts import provenance, write_json
from glm53_flash.model import ops
from glm53_flash.model.config import PRESETS, ModelConfig
from glm53_flash.model.linear_attention import DENOMINATOR_FLOOR, causal_linear_attention
from glm53_flash.model.ops import linear_attention as linear_attention_ops
from glm53_flash.model.rope import RotaryEmbedding

DEFAULT_PRESETS = ("study", "flash")


def _torch_form(qkv: torch.Tensor, heads: int, chunk: int, rope: RotaryEmbedding | None) -> torch.Tensor:
    batch, steps, width = qkv.shape
    d = width // (3 * heads)
    q, k, v = qkv.view(batch, steps, 3, heads, d).permute(2, 0, 3, 1, 4)
    if rope is not None:
        q, k = rope(q), rope(k)
    out, _ = causal_linear_attention(ops.feature_map(q), ops.feature_map(k), v, None, chunk)
    return out.transpose(1, 2).reshape(batch, steps, heads * d)


def _scan(qkv: torch.Tensor, heads: int, rope: RotaryEmbedding | None) -> torch.Tensor:
    steps = qkv.shape[1]
    tables = (rope.cos[:steps].contiguous(), rope.sin[:steps].contiguous()) if rope is not None else (None, None)
    return ops.scan_linear_attention(qkv, heads, *tables, False, DENOMINATOR_FLOOR)[0]


def _timed(form, qkv: torch.Tensor, grad_out: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor]:
    leaf = qkv.detach().clone().requires_grad_()
    start = time.perf_counter()
    out = form(leaf)
    out.backward(grad_out)
    seconds = time.perf_counter() - start
    return seconds, out.detach(), leaf.grad


STEP_WARMUP = 3  # untimed steps first: oneDNN builds a kernel per new bf16 product shape


def whole_step(preset: str, batch: int, steps: int, rounds: int) -> dict:
    """One pretraining step of `preset` at `steps` positions with the scan and with the torch chunks,
    alternating one step each per round (the steps train the model in turn)."""
    from glm53_flash.benchmarks.model import _training_batch
    from glm53_flash.model import GLM53Flash
    from glm53_flash.model.precision import resolve_precision
    from glm53_flash.train.engine import PRETRAINING, make_optimizer
    from glm53_flash.train.objective import language_model_update

    torch.manual_seed(0)
    model = GLM53Flash(ModelConfig.preset(preset)).train()
    optimizer = make_optimizer(model, PRETRAINING)
    inputs, labels = _training_batch(batch, steps)[0]
    precision = resolve_precision("auto", "cpu")

    def step(scan: bool) -> float:
        saved = linear_attention_ops.SCAN_ENABLED
        linear_attention_ops.SCAN_ENABLED = scan
        try:
            start = time.perf_counter()
            language_model_update(model, optimizer, inputs, labels, PRETRAINING, precision=precision)
            return time.perf_counter() - start
        finally:
            linear_attention_ops.SCAN_ENABLED = saved

    for _ in range(STEP_WARMUP):
        step(True), step(False)
    times = {"scan": [], "torch": []}
    for _ in range(rounds):
        for name in ("torch", "scan"):
            times[name].append(step(name == "scan"))
    median = {name: statistics.median(values) for name, values in times.items()}
    return {"precision": precision.record(), "batch": batch, "steps": steps, "warmup_steps": STEP_WARMUP,
            "order": "per round: one step with the torch chunks, one with the scan",
            "seconds": {name: {"median": median[name], "min": min(v), "max": max(v), "all": v} for name, v in times.items()},
            "scan_speedup": median["torch"] / median["scan"],
            "scan_speedup_per_round": [t / s for s, t in zip(times["scan"], times["torch"])]}


def run(presets=DEFAULT_PRESETS, batch: int = 32, steps: int = 192, rounds: int = 7, threads: int | None = None,
        rope: bool = False, step: bool = False, output: str | None = None) -> dict:
    unknown = [preset for preset in presets if preset not in PRESETS]
    if not presets or unknown:
        raise ValueError(f"--presets must name presets among {', '.join(sorted(PRESETS))}; "
                         f"got {','.join(presets)!r}")
    for name, value in (("--batch", batch), ("--steps", steps), ("--rounds", rounds)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if not ops.available():
        raise RuntimeError("the C kernels are not available here (glm53 info says why): the scan is theirs")
    if threads is not None:
        torch.set_num_threads(threads)
    shapes = {}
    for preset in presets:
        cfg = ModelConfig.preset(preset)
        if steps <= cfg.linear_chunk:
            raise ValueError(f"--steps {steps} is within the {preset} preset's chunk of {cfg.linear_chunk}: its layers "
                             "take the one quadratic block there, not the scan")
        if steps > cfg.max_sequence_length:
            raise ValueError(f"--steps {steps} exceeds the {preset} preset's context of {cfg.max_sequence_length}")
        heads, d = cfg.heads, cfg.dim // cfg.heads
        generator = torch.Generator().manual_seed(0)
        qkv = torch.randn(batch, steps, 3 * cfg.dim, generator=generator)
        grad_out = torch.randn(batch, steps, cfg.dim, generator=generator)
        table = RotaryEmbedding(d, cfg.max_sequence_length) if rope else None
        forms = {"scan": lambda x: _scan(x, heads, table),
                 "torch": lambda x: _torch_form(x, heads, cfg.linear_chunk, table)}
        for form in forms.values():  # warm-up: the library's build, the allocator
            _timed(form, qkv, grad_out)
        samples = {name: [] for name in forms}
        results = {}
        for _ in range(rounds):  # interleaved, so a burst of load lands on both
            for name, form in forms.items():
                seconds, out, grad = _timed(form, qkv, grad_out)
                samples[name].append(seconds)
                results[name] = (out, grad)
        median = {name: statistics.median(values) for name, values in samples.items()}
        (out_s, grad_s), (out_t, grad_t) = results["scan"], results["torch"]
        shapes[preset] = {
            "batch": batch, "steps": steps, "heads": heads, "head_dim": d, "chunk": cfg.linear_chunk,
            "seconds": {name: {"median": median[name], "min": min(values), "max": max(values), "all": values}
                        for name, values in samples.items()},
            "scan_speedup": median["torch"] / median["scan"],
            "scan_speedup_per_round": [t / s for s, t in zip(samples["scan"], samples["torch"])],
            "largest_difference_relative": {
                "out": float((out_s - out_t).abs().max() / out_t.abs().max()),
                "grad_qkv": float((grad_s - grad_t).abs().max() / grad_t.abs().max())},
        }
        if step:
            shapes[preset]["whole_step"] = whole_step(preset, batch, steps, rounds)
    result = {"benchmark": "linear-attention", "presets": list(presets), "rounds": rounds, "rope": rope,
              "threads": torch.get_num_threads(), "shapes": shapes, "kernels": ops.status(),
              "provenance": provenance(device="cpu")}
    rows = []
    for preset, s in shapes.items():
        rows.append((f"{preset}: {s['heads']} heads of {s['head_dim']}, {s['batch']} x {s['steps']}",
                     f"scan {1e3 * s['seconds']['scan']['median']:.1f} ms, torch chunks "
                     f"{1e3 * s['seconds']['torch']['median']:.1f} ms: {s['scan_speedup']:.2f}x (rounds "
                     f"{min(s['scan_speedup_per_round']):.2f}-{max(s['scan_speedup_per_round']):.2f})"))
        if "whole_step" in s:
            w = s["whole_step"]
            rows.append((f"{preset}: a whole training step ({w['precision']['name']})",
                         f"scan {w['seconds']['scan']['median']:.3f} s, torch chunks {w['seconds']['torch']['median']:.3f} s: "
                         f"{w['scan_speedup']:.2f}x"))
    print_table(rows, title=f"linear attention, forward + backward, {rounds} rounds, {torch.get_num_threads()} thread(s)")
    if output:
        write_json(output, result)
    return result
