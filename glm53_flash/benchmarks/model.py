"""`glm53 bench model`: training throughput vs the measured matmul peak, cached decode vs re-forward,
and the peak memory of a training step, for one preset on this machine in one process."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..data import pretraining_batch
from ..model import GLM53Flash
from ..receipts import peak_rss_bytes, provenance, write_json
from ..runtime import autocast, resolve_device
from .common import measure_matmul_peak, print_table, synchronize


def training_flops_per_token(model: GLM53Flash, seq_len: int) -> float:
    """6 x active parameters (forward + backward) plus attention: 12 x layers x dim x T, the count of
    the full T x T score and value products that the kernels compute (PaLM's convention)."""
    cfg = model.config
    return 6 * model.parameter_counts()["active"] + 12 * cfg.layers * cfg.dim * seq_len


def bench_training(model, device, batch_size, seq_len, steps, warmup):
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    inputs, labels = (t.to(device) for t in pretraining_batch(0, batch_size, seq_len))
    model.train()

    def step():
        with autocast(device):
            out = model(inputs)
            loss = F.cross_entropy(out.logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
            loss = loss + 0.01 * out.aux_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    rss_before = peak_rss_bytes()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(warmup):
        step()
    synchronize(device)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    tokens = batch_size * seq_len
    best = min(times)
    return {
        "batch_size": batch_size, "sequence_length": seq_len, "steps_timed": steps,
        "step_seconds_min": best, "step_seconds_median": sorted(times)[len(times) // 2],
        "tokens_per_second": tokens / best,
        "peak_memory_bytes": (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
                              else peak_rss_bytes()),
        "peak_memory_kind": "cuda_max_allocated" if device.type == "cuda" else "process_peak_rss",
        "rss_before_training_bytes": rss_before if device.type != "cuda" else None,
    }


@torch.inference_mode()
def bench_decode(model, device, batch_size, prompt_len, total_len, reforward_every):
    """Greedy decode from a random prompt with the cache vs re-running the full forward each token.

    The re-forward cost is timed at every `reforward_every`-th length and summed over all lengths
    by linear interpolation (its cost grows smoothly with length); reforward_every=1 times them all.
    """
    model.eval()
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(4, 260, (batch_size, prompt_len), generator=generator).to(device)
    new_tokens = total_len - prompt_len

    with autocast(device):
        model(prompt[:, :8])  # warm-up
        synchronize(device)
        start = time.perf_counter()
        cache = model.new_cache(batch_size)
        logits = model(prompt, cache=cache).logits[:, -1]
        cached_ids = [prompt]
        for _ in range(new_tokens - 1):
            nxt = logits.argmax(-1, keepdim=True)
            cached_ids.append(nxt)
            logits = model(nxt, cache=cache).logits[:, -1]
        cached_ids.append(logits.argmax(-1, keepdim=True))
        synchronize(device)
        cached_seconds = time.perf_counter() - start
        cached_ids = torch.cat(cached_ids, 1)

        lengths = list(range(prompt_len, total_len, reforward_every))
        if lengths[-1] != total_len - 1:
            lengths.append(total_len - 1)
        measured = {}
        for length in lengths:
            synchronize(device)
            start = time.perf_counter()
            model(cached_ids[:, :length]).logits[:, -1].argmax(-1)
            synchronize(device)
            measured[length] = time.perf_counter() - start
    reforward_seconds = 0.0
    for length in range(prompt_len, total_len):
        lo = max(x for x in lengths if x <= length)
        hi = min(x for x in lengths if x >= length)
        w = 0.0 if hi == lo else (length - lo) / (hi - lo)
        reforward_seconds += (1 - w) * measured[lo] + w * measured[hi]
    generated = batch_size * new_tokens
    return {
        "batch_size": batch_size, "prompt_length": prompt_len, "total_length": total_len,
        "new_tokens_per_row": new_tokens,
        "cached_seconds": cached_seconds, "cached_tokens_per_second": generated / cached_seconds,
        "reforward_seconds": reforward_seconds, "reforward_tokens_per_second": generated / reforward_seconds,
        "reforward_lengths_timed": len(lengths),
        "speedup": reforward_seconds / cached_seconds,
    }


def run(preset: str = "flash", device_name: str = "auto", batch_size: int = 32, seq_len: int = 128,
        steps: int = 5, warmup: int = 2, decode_batch: int = 16, prompt_len: int = 64,
        decode_total: int = 192, reforward_every: int = 1, output: str | None = None) -> dict:
    device = resolve_device(device_name)
    torch.manual_seed(0)
    cfg = ModelConfig.preset(preset)
    model = GLM53Flash(cfg).to(device)
    peak = measure_matmul_peak(device)
    training = bench_training(model, device, batch_size, seq_len, steps, warmup)
    flops_per_token = training_flops_per_token(model, seq_len)
    training["flops_per_token"] = flops_per_token
    training["flops_per_second"] = flops_per_token * training["tokens_per_second"]
    training["fraction_of_matmul_peak"] = training["flops_per_second"] / peak["flops_per_second"]
    decode = bench_decode(model, device, decode_batch, prompt_len, min(decode_total, cfg.max_sequence_length),
                          reforward_every)
    result = {
        "benchmark": "model", "preset": preset, "config": cfg.to_dict(),
        "parameter_counts": model.parameter_counts(), "device": str(device),
        "matmul_peak": peak, "training": training, "decode": decode,
        "provenance": provenance(device=str(device)),
    }
    gib = 2**30
    print_table([
        ("device", f"{device} ({torch.get_num_threads()} threads)"),
        ("fp32 matmul peak", f"{peak['flops_per_second'] / 1e9:.1f} GFLOP/s"),
        ("training tokens/s", f"{training['tokens_per_second']:.0f}  (batch {batch_size} x {seq_len}, "
                              f"min of {steps} steps)"),
        ("training FLOP/s", f"{training['flops_per_second'] / 1e9:.1f} GFLOP/s "
                            f"= {100 * training['fraction_of_matmul_peak']:.1f}% of peak"),
        ("training peak memory", f"{training['peak_memory_bytes'] / gib:.2f} GiB ({training['peak_memory_kind']})"),
        ("decode, cached", f"{decode['cached_tokens_per_second']:.0f} tokens/s "
                           f"(batch {decode_batch}, {prompt_len} -> {decode['total_length']})"),
        ("decode, re-forward", f"{decode['reforward_tokens_per_second']:.1f} tokens/s"),
        ("decode speedup", f"{decode['speedup']:.1f}x"),
    ], title=f"glm53 bench model  preset={preset}  params={model.parameter_counts()['total']:,}")
    if output:
        write_json(output, result)
        print(f"wrote {output}")
    return result
