"""`glm53 bench model`: training throughput vs the measured matmul peak, cached decode vs re-forward,
and the peak memory of a training step, for one preset on this machine in one process."""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

from glm53_flash.model.config import ModelConfig
from glm53_flash.data.batches import pretraining_batch
from glm53_flash.model import GLM53Flash, ops
from glm53_flash.core.receipts import peak_rss_bytes, provenance, write_json
from glm53_flash.core.runtime import resolve_device
from glm53_flash.model.precision import compute_in, resolve_precision
from glm53_flash.train.engine import PRETRAINING, make_optimizer
from glm53_flash.train.objective import language_model_update
from glm53_flash.benchmarks.common import (
    PEAK_SIZES, bench_precisions, measure_matmul_peak, print_table, synchronize, timed_runs,
)


def training_flops_per_token(model: GLM53Flash, seq_len: int) -> float:
    """6 x active parameters (forward + backward) plus attention: 12 x layers x dim x T, the count of
    the full T x T score and value products that the kernels compute (PaLM's convention)."""
    cfg = model.config
    return 6 * model.parameter_counts()["active"] + 12 * cfg.layers * cfg.dim * seq_len


def compares_eager(device) -> bool:
    """Whether the training bench also times the step without the C kernels (where they serve)."""
    return device.type == "cpu" and ops.available()


def bench_training(model, device, batch_size, seq_len, steps, warmup):
    # The step pretraining takes: the engine's PRETRAINING recipe (decay on matrices only, the fused
    # AdamW kernel where torch has one, bf16 autocast on CUDA, clipping) through language_model_update.
    optimizer = make_optimizer(model, PRETRAINING)
    batch, data = _training_batch(batch_size, seq_len)
    inputs, labels = (t.to(device) for t in batch)
    model.train()

    def step():
        language_model_update(model, optimizer, inputs, labels, PRETRAINING)

    rss_before = peak_rss_bytes()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = timed_runs(step, device, warmup, steps)
    tokens = batch_size * seq_len
    best = min(times)
    peak_memory = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else peak_rss_bytes()
    eager = eager_comparison(step, device, steps) if compares_eager(device) else None
    return {
        "eager_comparison": eager,
        "batch_size": batch_size, "sequence_length": seq_len, "steps_timed": steps, "data": data,
        "step_seconds_min": best, "step_seconds_median": sorted(times)[len(times) // 2],
        "tokens_per_second": tokens / best,
        "peak_memory_bytes": peak_memory,  # of the timed steps above, before the eager comparison
        "peak_memory_kind": "cuda_max_allocated" if device.type == "cuda" else "process_peak_rss",
        "rss_before_training_bytes": rss_before if device.type != "cuda" else None,
    }


def eager_comparison(step, device, rounds: int) -> dict:
    """The training step with the C kernels (SwiGLU and RMSNorm forward/backward) and without them
    (the eager formulas), alternating step by step in this process so that both see the same load:
    on a shared host the step time drifts by more than the kernels save, and separate runs cannot
    tell the two apart."""
    times = {True: [], False: []}
    saved = ops.library.ENABLED
    try:
        for _ in range(rounds):
            for enabled in (False, True):
                ops.library.ENABLED = enabled
                times[enabled] += timed_runs(step, device, 0, 1)
    finally:
        ops.library.ENABLED = saved
    fused, eager = min(times[True]), min(times[False])
    return {"rounds": rounds, "order": "eager then kernels, one step each per round",
            "kernels_step_seconds_min": fused, "kernels_step_seconds_median": sorted(times[True])[rounds // 2],
            "eager_step_seconds_min": eager, "eager_step_seconds_median": sorted(times[False])[rounds // 2],
            "speedup_of_min": eager / fused}


PRECISION_WARMUP = 12  # bf16 steps before timing: oneDNN compiles a kernel per new product shape (model/moe.py)


def precision_comparison(model, device, batch_size, seq_len, rounds: int, warmup: int = PRECISION_WARMUP,
                         peak_sizes=PEAK_SIZES) -> dict:
    """The same training step in fp32 and in bf16 (model/precision.py), with the fp32 and bf16 GEMM peaks,
    interleaved round by round in this process (peak fp32, peak bf16, one fp32 step, one bf16 step), so
    that every ratio comes from one run under one load. The steps train the bench's model in turn."""
    optimizer = make_optimizer(model, PRETRAINING)
    inputs, labels = (t.to(device) for t in _training_batch(batch_size, seq_len)[0])
    model.train()
    precisions = {name: resolve_precision(name, device) for name in ("fp32", "bf16")}

    def step(name):
        return lambda: language_model_update(model, optimizer, inputs, labels, PRETRAINING,
                                             precision=precisions[name])

    timed_runs(step("bf16"), device, warmup, 0)
    times = {"fp32": [], "bf16": []}
    peaks = {"fp32": [], "bf16": []}
    for _ in range(rounds):
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            peaks[name].append(measure_matmul_peak(device, peak_sizes, repeats=3, dtype=dtype)["flops_per_second"])
        for name in ("fp32", "bf16"):
            times[name] += timed_runs(step(name), device, 0, 1)
    flops_per_token = training_flops_per_token(model, seq_len)
    tokens = batch_size * seq_len
    record = {"rounds": rounds, "bf16_warmup_steps": warmup,
              "order": "per round: fp32 peak, bf16 peak, one fp32 step, one bf16 step",
              "precisions": {name: p.record() for name, p in precisions.items()}}
    for name in ("fp32", "bf16"):
        best = min(times[name])
        record[name] = {"step_seconds_min": best, "step_seconds_median": sorted(times[name])[rounds // 2],
                        "step_seconds": times[name], "matmul_peak_flops_per_second": max(peaks[name]),
                        "training_flops_per_second": flops_per_token * tokens / best}
        record[name]["fraction_of_own_peak"] = (record[name]["training_flops_per_second"]
                                                / record[name]["matmul_peak_flops_per_second"])
    record["bf16_speedup_of_min"] = record["fp32"]["step_seconds_min"] / record["bf16"]["step_seconds_min"]
    record["bf16_speedup_of_median"] = record["fp32"]["step_seconds_median"] / record["bf16"]["step_seconds_median"]
    record["peak_ratio_bf16_to_fp32"] = (record["bf16"]["matmul_peak_flops_per_second"]
                                         / record["fp32"]["matmul_peak_flops_per_second"])
    record["bf16_fraction_of_bf16_peak"] = record["bf16"]["fraction_of_own_peak"]
    return record


def _training_batch(batch_size, seq_len):
    try:
        return pretraining_batch(0, batch_size, seq_len), "task stream, batch 0"
    except ValueError:  # a sequence shorter than the task examples (tiny presets): throughput is the same
        tokens = torch.randint(4, 260, (batch_size, seq_len + 1), generator=torch.Generator().manual_seed(0))
        return (tokens[:, :-1], tokens[:, 1:]), "uniform random bytes (task examples do not fit)"


@torch.inference_mode()
def bench_decode(model, device, batch_size, prompt_len, total_len, reforward_every, repeats: int = 2):
    """Greedy decode from a random prompt with the cache vs re-running the full forward each token.

    The re-forward cost is timed at every `reforward_every`-th length and summed over all lengths
    by linear interpolation (its cost grows smoothly with length); reforward_every=1 times them all.
    Both sides are measured `repeats` times, interleaved, and each keeps its best time (the cached
    run as a whole, the re-forward per length), so a burst of load on a shared machine during one
    pass does not decide the ratio. Keeping the best re-forward per length can only lower the
    re-forward total, so the asymmetry understates the speedup, never overstates it.
    """
    model.eval()
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(4, 260, (batch_size, prompt_len), generator=generator).to(device)
    new_tokens = total_len - prompt_len
    lengths = list(range(prompt_len, total_len, reforward_every))
    if lengths[-1] != total_len - 1:
        lengths.append(total_len - 1)

    def cached_pass():
        synchronize(device)
        start = time.perf_counter()
        cache = model.new_cache(batch_size)
        logits = model(prompt, cache=cache).logits[:, -1]
        synchronize(device)
        prefill = time.perf_counter() - start
        ids = [prompt]
        for _ in range(new_tokens - 1):
            nxt = logits.argmax(-1, keepdim=True)
            ids.append(nxt)
            logits = model(nxt, cache=cache).logits[:, -1]
        ids.append(logits.argmax(-1, keepdim=True))
        synchronize(device)
        return time.perf_counter() - start, prefill, torch.cat(ids, 1)

    cached_runs, measured = [], {length: float("inf") for length in lengths}
    with compute_in(None, device):
        model(prompt[:, :8])  # warm-up
        for _ in range(repeats):
            total, prefill, cached_ids = cached_pass()
            cached_runs.append((total, prefill))
            for length in lengths:
                synchronize(device)
                start = time.perf_counter()
                model(cached_ids[:, :length]).logits[:, -1].argmax(-1)
                synchronize(device)
                measured[length] = min(measured[length], time.perf_counter() - start)
    cached_seconds, prefill_seconds = min(cached_runs)
    reforward_seconds = 0.0
    for length in range(prompt_len, total_len):
        lo = max(x for x in lengths if x <= length)
        hi = min(x for x in lengths if x >= length)
        w = 0.0 if hi == lo else (length - lo) / (hi - lo)
        reforward_seconds += (1 - w) * measured[lo] + w * measured[hi]
    generated = batch_size * new_tokens
    return {
        "batch_size": batch_size, "prompt_length": prompt_len, "total_length": total_len,
        "new_tokens_per_row": new_tokens, "repeats": repeats,
        "cached_seconds": cached_seconds, "cached_tokens_per_second": generated / cached_seconds,
        "cached_seconds_all_repeats": [run[0] for run in cached_runs],
        "prefill_seconds": prefill_seconds,
        "cached_step_seconds_mean": (cached_seconds - prefill_seconds) / max(1, new_tokens - 1),
        "reforward_seconds": reforward_seconds, "reforward_tokens_per_second": generated / reforward_seconds,
        "reforward_lengths_timed": len(lengths),
        "speedup": reforward_seconds / cached_seconds,
    }


@torch.inference_mode()
def decode_floors(model, device, batch_size, repeats: int = 20) -> dict:
    """Two lower bounds on one cached decode step of `batch_size` rows, measured in this process.

    - weight read: every parameter read once (a sum over each tensor), i.e. the step at this
      machine's memory bandwidth with no other cost; a step of B >= E / top_k rows touches nearly
      every expert, so it must read nearly every weight.
    - matrix products only: the step's GEMMs on the model's own weights with the shapes a decode
      step has (qkv, output, router, the experts with the slots split evenly, shared expert, head),
      each layer once. Every product runs through the kernel the step uses (the skinny C kernels
      where they serve, else torch's: the padded batched matmuls or the grouped kernel for the
      experts), the shared expert through its module, so their SwiGLU activation (two elementwise
      ops on [slots, H]) and the padded path's row copies are included; none of the step's other
      operations are. Under the device's autocast, like the decode it bounds. Where the C kernels
      serve, the same products are timed again with torch alone (`matrix_products_torch_only_seconds`).
    """
    cfg = model.config
    params = list(model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    x = torch.randn(batch_size, cfg.dim, device=device)
    slots = batch_size * cfg.top_k
    rows = torch.randn(slots, cfg.dim, device=device)
    counts = torch.bincount(torch.arange(slots, device=device) % cfg.experts, minlength=cfg.experts)

    def read_weights():
        for p in params:
            p.sum()

    def products():
        for block in model.blocks:
            block.attention.qkv(x)
            block.attention.out(x)
            block.moe.router(x)
            moe = block.moe
            if ops.sorted_experts(rows, counts, moe.expert_gate_up, moe.expert_down) is None:
                moe.run_each_expert(rows, counts)
            block.moe.shared(x)
        F.linear(x, model.embedding.weight)

    def best(fn):
        return min(timed_runs(fn, device, warmup=3, repeats=repeats))

    with compute_in(None, device):
        read_seconds = best(read_weights)
        products_seconds = best(products)
        torch_products_seconds = products_seconds
        if ops.available() and device.type == "cpu":  # the same products without the C kernels
            ops.library.ENABLED = False
            try:
                torch_products_seconds = best(products)
            finally:
                ops.library.ENABLED = True
    return {"weight_bytes": weight_bytes, "weight_read_seconds": read_seconds,
            "weight_read_bytes_per_second": weight_bytes / read_seconds,
            "matrix_products_seconds": products_seconds,
            "matrix_products_torch_only_seconds": torch_products_seconds}


def stage(what: str) -> None:
    """One progress line per stage on stderr (the whole benchmark takes minutes on a CPU)."""
    print(f"[bench model {time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def run(preset: str = "flash", device: str = "auto", batch_size: int = 32, sequence_length: int = 128,
        steps: int = 5, warmup: int = 2, decode_batch: int = 16, prompt_length: int = 64,
        decode_length: int | None = None, reforward_every: int = 1, output: str | None = None,
        precision_rounds: int = 5, peak_sizes=PEAK_SIZES, precisions: str = "auto") -> dict:
    device = resolve_device(device)
    chosen = bench_precisions(precisions, device)  # a bad list is refused before anything is timed
    torch.manual_seed(0)
    cfg = ModelConfig.preset(preset)
    decode_length = cfg.max_sequence_length if decode_length is None else decode_length
    for name, value in (("--batch-size", batch_size), ("--steps", steps), ("--decode-batch", decode_batch),
                        ("--reforward-every", reforward_every)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    for name, value in (("--sequence-length", sequence_length), ("--decode-length", decode_length)):
        if value > cfg.max_sequence_length:
            raise ValueError(f"{name} {value} exceeds the {preset} preset's max_sequence_length "
                             f"{cfg.max_sequence_length}")
    if not 1 <= prompt_length < decode_length:
        raise ValueError(f"--prompt-length must lie in [1, --decode-length), got {prompt_length} and {decode_length}")
    model = GLM53Flash(cfg).to(device)
    # The peak is measured before and after the training steps and the higher rate is the
    # denominator: on a shared machine one low measurement would otherwise flatter the fraction.
    stage("fp32 matmul peak")
    peak_before = measure_matmul_peak(device, peak_sizes)
    stage(f"training: {warmup} warm-up + {steps} timed steps of batch {batch_size} x {sequence_length}"
          + (f", then {steps} rounds of one eager and one kernel step" if compares_eager(device) else ""))
    training = bench_training(model, device, batch_size, sequence_length, steps, warmup)
    stage("fp32 matmul peak again")
    peak_after = measure_matmul_peak(device, peak_sizes)
    peak = max(peak_before, peak_after, key=lambda p: p["flops_per_second"])
    peak = dict(peak, before_training=peak_before["flops_per_second"], after_training=peak_after["flops_per_second"])
    flops_per_token = training_flops_per_token(model, sequence_length)
    training["flops_per_token"] = flops_per_token
    training["flops_per_second"] = flops_per_token * training["tokens_per_second"]
    training["fraction_of_matmul_peak"] = training["flops_per_second"] / peak["flops_per_second"]
    if precision_rounds and device.type in ("cpu", "cuda"):
        if chosen["names"] == ["fp32", "bf16"]:
            stage(f"precision: {PRECISION_WARMUP} bf16 warm-up steps, then {precision_rounds} rounds of both "
                  "peaks and one fp32 and one bf16 step")
            training["precision_comparison"] = precision_comparison(model, device, batch_size, sequence_length,
                                                                    precision_rounds, peak_sizes=peak_sizes)
        else:
            training["precision_comparison"] = {"skipped": chosen["reason"] if precisions == "auto" else
                                                f"--precisions {precisions}: the comparison times fp32 against bf16"}
    stage(f"decode: cached vs re-forward, batch {decode_batch}, {prompt_length} -> {decode_length} tokens, twice")
    decode = bench_decode(model, device, decode_batch, prompt_length, decode_length, reforward_every)
    stage("decode step floors")
    floors = decode_floors(model, device, decode_batch)
    steps_after_prefill = decode["new_tokens_per_row"] - 1
    for name, step_seconds in (("weight_read", floors["weight_read_seconds"]),
                               ("matrix_products", floors["matrix_products_seconds"])):
        # The largest speedup a decode step costing only this much could show against the same re-forward.
        floors[f"speedup_ceiling_at_{name}"] = decode["reforward_seconds"] / (
            decode["prefill_seconds"] + steps_after_prefill * step_seconds)
    decode["floors"] = floors
    # The decode goal's measure: one cached step against one read of every weight (1.0 = the bandwidth floor).
    decode["step_over_weight_read"] = decode["cached_step_seconds_mean"] / floors["weight_read_seconds"]
    decode["kernels"] = ops.status()  # also in provenance; here for the table below
    result = {
        "benchmark": "model", "preset": preset, "config": cfg.to_dict(),
        "parameter_counts": model.parameter_counts(), "device": str(device),
        "matmul_peak": peak, "training": training, "decode": decode,
        "provenance": provenance(device=str(device)),
    }
    gib = 2**30
    print_table([
        ("device", f"{device} ({torch.get_num_threads()} threads)"),
        ("fp32 matmul peak", f"{peak['flops_per_second'] / 1e9:.1f} GFLOP/s (higher of "
                             f"{peak['before_training'] / 1e9:.1f} before, "
                             f"{peak['after_training'] / 1e9:.1f} after training)"),
        ("training tokens/s", f"{training['tokens_per_second']:.0f}  (batch {batch_size} x {sequence_length}, "
                              f"min of {steps} steps)"),
        ("training FLOP/s", f"{training['flops_per_second'] / 1e9:.1f} GFLOP/s "
                            f"= {100 * training['fraction_of_matmul_peak']:.1f}% of peak"),
        *([("training, kernels vs eager", f"{e['kernels_step_seconds_min']:.3f} s vs {e['eager_step_seconds_min']:.3f} s "
                                            f"per step ({e['speedup_of_min']:.2f}x, min of {e['rounds']} alternating)")]
          if (e := training.get("eager_comparison")) else []),
        *([("training, bf16 vs fp32", f"{c['bf16']['step_seconds_min']:.3f} s vs {c['fp32']['step_seconds_min']:.3f} s "
                                        f"per step ({c['bf16_speedup_of_min']:.2f}x, min of {c['rounds']} alternating)"),
           ("GEMM peaks, bf16 / fp32", f"{c['bf16']['matmul_peak_flops_per_second'] / 1e9:.0f} / "
                                      f"{c['fp32']['matmul_peak_flops_per_second'] / 1e9:.0f} GFLOP/s "
                                      f"({c['peak_ratio_bf16_to_fp32']:.1f}x)"),
           ("training FLOP/s / own peak", f"bf16 {100 * c['bf16']['fraction_of_own_peak']:.1f}%, "
                                         f"fp32 {100 * c['fp32']['fraction_of_own_peak']:.1f}%")]
          if (c := training.get("precision_comparison")) and "skipped" not in c else
          [("training, bf16 vs fp32", f"not timed: {c['skipped']}")] if c else []),
        ("training peak memory", f"{training['peak_memory_bytes'] / gib:.2f} GiB ({training['peak_memory_kind']})"),
        ("decode, cached", f"{decode['cached_tokens_per_second']:.0f} tokens/s "
                           f"(batch {decode_batch}, {prompt_length} -> {decode['total_length']}, best of "
                           f"{decode['repeats']})"),
        ("decode, re-forward", f"{decode['reforward_tokens_per_second']:.1f} tokens/s"),
        ("decode speedup", f"{decode['speedup']:.1f}x"),
        ("decode kernels", "skinny C kernels" if decode["kernels"]["available"]
         else f"torch only ({decode['kernels']['reason']})"),
        ("decode step, measured", f"{1e3 * decode['cached_step_seconds_mean']:.1f} ms (mean after a "
                                  f"{1e3 * decode['prefill_seconds']:.0f} ms prefill)"),
        ("step floor: GEMMs only", f"{1e3 * floors['matrix_products_seconds']:.1f} ms -> speedup ceiling "
                                   f"{floors['speedup_ceiling_at_matrix_products']:.1f}x"),
        ("the same GEMMs, torch only", f"{1e3 * floors['matrix_products_torch_only_seconds']:.1f} ms"),
        ("step floor: weight read", f"{1e3 * floors['weight_read_seconds']:.1f} ms "
                                    f"({floors['weight_bytes'] / 1e6:.0f} MB at "
                                    f"{floors['weight_read_bytes_per_second'] / 1e9:.1f} GB/s) -> ceiling "
                                    f"{floors['speedup_ceiling_at_weight_read']:.1f}x"),
        ("decode step / weight read", f"{decode['step_over_weight_read']:.2f}x"),
    ], title=f"glm53 bench model  preset={preset}  params={model.parameter_counts()['total']:,}")
    if output:
        write_json(output, result)
        print(f"wrote {output}")
    return result
