"""`glm53 bench scaling`: how cost grows with work, for the hybrid model and for the same model with
every layer dense softmax attention.

Two measurements, both variants with the same weights (their parameter shapes are identical: every
attention layer has one qkv and one output projection). Each is taken in rounds that visit every
(length, variant) point once, and each point keeps its minimum over the rounds, so a burst of load on
a shared machine cannot settle on one point or one variant:

- training: one forward + backward (no optimizer step, whose cost does not depend on the length)
  of a batch of uniform random bytes, against the sequence length;
- decode: one cached single-token step at position P (the cache holds P tokens), against P. The
  cache is filled by a chunked prefill, and each timed step starts from the same cache, so the
  layers' mask and index tables for that position are warm, as in repeated generation.

The dense variant is the preset with `sparse_every=1` (every layer local + strided softmax) and
`sparse_window = sparse_stride = max_sequence_length`: the window then covers every earlier
position, so the mask is the plain causal one and decoding keeps every key.
"""

from __future__ import annotations

import math
import os
import sys
import time

import torch
import torch.nn.functional as F

from glm53_flash.model.config import ModelConfig
from glm53_flash.model import GLM53Flash
from glm53_flash.model.lm import ModelCache
from glm53_flash.model.sparse_attention import SparseAttention, SparseKV, sparse_mask
from glm53_flash.core.argtypes import parse_int_list
from glm53_flash.core.receipts import provenance, write_json
from glm53_flash.core.runtime import resolve_device
from glm53_flash.model.precision import compute_in
from glm53_flash.benchmarks.common import print_table, synchronize, timed_runs

VARIANTS = ("hybrid", "dense")
DEFAULT_SEQUENCE_LENGTHS = (128, 256, 512, 1024)
DEFAULT_POSITIONS = (64, 256, 1024, 2048, 4096)
MODEL_SEED = 0
DATA_SEED = 1


def dense_config(cfg: ModelConfig) -> ModelConfig:
    """The same model with every layer causal softmax attention over all earlier positions."""
    length = cfg.max_sequence_length
    return cfg.replace(sparse_every=1, sparse_window=length, sparse_stride=length)


def variant_configs(preset: str, max_sequence_length: int) -> dict[str, ModelConfig]:
    hybrid = ModelConfig.preset(preset, max_sequence_length=max_sequence_length)
    return {"hybrid": hybrid, "dense": dense_config(hybrid)}


def attention_layout(model: GLM53Flash, length: int) -> list[dict]:
    """Per layer, read from the model's own modules: the kind of attention and how many keys the
    query at position length - 1 attends to (linear attention folds in every earlier key)."""
    layers = []
    for block in model.blocks:
        attention = block.attention
        if isinstance(attention, SparseAttention):
            row = sparse_mask([length - 1], range(length), attention.window, attention.stride)
            layers.append({"kind": "softmax", "keys_at_last_position": int(row.sum())})
        else:
            layers.append({"kind": "linear", "keys_at_last_position": length})
    return layers


def crossover(xs, hybrid, dense) -> dict:
    """Where the hybrid becomes cheaper than dense and stays so up to the largest x measured.

    status "crossed": `at` interpolates the ratio hybrid / dense linearly in log-log between the last
    x where the hybrid cost at least as much and the next one; "hybrid-cheaper-throughout": cheaper at
    every x measured (the crossover lies below the range); "none": not cheaper at the largest x.
    """
    if not (len(xs) == len(hybrid) == len(dense)) or not xs:
        raise ValueError("crossover needs equally long, non-empty lists of lengths and costs")
    if any(v <= 0 for v in list(xs) + list(hybrid) + list(dense)):
        raise ValueError("crossover needs positive lengths and costs")
    cheaper = [h < d for h, d in zip(hybrid, dense)]
    if not cheaper[-1]:
        return {"status": "none", "at": None, "between": None}
    first = len(cheaper)
    while first > 0 and cheaper[first - 1]:
        first -= 1
    if first == 0:
        return {"status": "hybrid-cheaper-throughout", "at": None, "between": None}
    lo, hi = first - 1, first
    r_lo = math.log(hybrid[lo] / dense[lo])  # >= 0
    r_hi = math.log(hybrid[hi] / dense[hi])  # < 0
    w = r_lo / (r_lo - r_hi)
    at = math.exp(math.log(xs[lo]) + w * (math.log(xs[hi]) - math.log(xs[lo])))
    return {"status": "crossed", "at": at, "between": [xs[lo], xs[hi]]}


def _stage(what: str) -> None:
    print(f"[bench scaling {time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def _summary(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"seconds_min": ordered[0], "seconds_median": ordered[len(ordered) // 2], "seconds_all": times}


def _rounds(points, device, warmup, repeats, what) -> dict:
    """Time every (point, variant) callable once per round, `repeats` rounds, after `warmup` untimed
    calls each. A round visits every point, so a burst of load on a shared machine lands on a few
    rounds of many points rather than on every round of one point; the minimum then discards it."""
    for fn in points.values():
        timed_runs(fn, device, warmup=warmup, repeats=0)
    times = {key: [] for key in points}
    for round_index in range(repeats):
        _stage(f"{what}: round {round_index + 1} of {repeats} ({os.getloadavg()[0]:.1f} load)")
        for key, fn in points.items():
            times[key] += timed_runs(fn, device, warmup=0, repeats=1)
    return times


def bench_training(models, device, batch_size, lengths, warmup, repeats) -> list[dict]:
    generator = torch.Generator().manual_seed(DATA_SEED)
    batches = {}
    for length in lengths:
        tokens = torch.randint(4, 260, (batch_size, length + 1), generator=generator).to(device)
        batches[length] = tokens[:, :-1], tokens[:, 1:]

    def step(model, length):
        inputs, labels = batches[length]

        def run():
            with compute_in(None, device):
                out = model(inputs)
                loss = F.cross_entropy(out.logits.float().flatten(0, 1), labels.flatten())
                loss = loss + 0.01 * out.aux_loss
            model.zero_grad(set_to_none=True)
            loss.backward()
        return run

    for model in models.values():
        model.train()
    points = {(length, name): step(model, length) for length in lengths for name, model in models.items()}
    _stage(f"training, batch {batch_size} x {lengths}: {warmup} warm-up step(s) per point")
    times = _rounds(points, device, warmup, repeats, "training")
    for model in models.values():
        model.zero_grad(set_to_none=True)
    rows = []
    for length in lengths:
        row = {"sequence_length": length, "tokens_per_step": batch_size * length}
        for name, model in models.items():
            row[name] = dict(_summary(times[length, name]),
                             tokens_per_second=batch_size * length / min(times[length, name]),
                             softmax_keys_at_last_position=[
                                 layer["keys_at_last_position"] for layer in attention_layout(model, length)
                                 if layer["kind"] == "softmax"])
        rows.append(row)
    return rows


def _copy_cache(cache: ModelCache) -> ModelCache:
    # Layer states are never changed in place (each step makes new tensors), so a shallow copy suffices.
    return ModelCache(cache.batch_size, cache.max_length, cache.position, list(cache.layers))


@torch.inference_mode()
def bench_decode(models, device, batch_size, positions, prefill_chunk, warmup, repeats) -> list[dict]:
    generator = torch.Generator().manual_seed(DATA_SEED + 1)
    prompt = torch.randint(4, 260, (batch_size, positions[-1] + 1), generator=generator).to(device)
    snapshots, prefill_seconds = {}, {}
    with compute_in(None, device):
        for name, model in models.items():
            model.eval()
            cache = model.new_cache(batch_size)
            for position in positions:
                _stage(f"decode, {name}: prefill to position {position} in chunks of {prefill_chunk}")
                start = time.perf_counter()
                while cache.position < position:  # chunked prefill: bounded attention memory
                    end = min(position, cache.position + prefill_chunk)
                    model(prompt[:, cache.position:end], cache=cache)
                synchronize(device)
                prefill_seconds[position, name] = time.perf_counter() - start
                snapshots[position, name] = _copy_cache(cache)
        after = {}

        def step(position, name):
            token = prompt[:, position:position + 1]

            def run():
                after[position, name] = _copy_cache(snapshots[position, name])
                models[name](token, cache=after[position, name])
            return run

        points = {(position, name): step(position, name) for position in positions for name in models}
        times = _rounds(points, device, warmup, repeats, f"decode, batch {batch_size}, positions {positions}")
    rows = []
    for position in positions:
        row = {"position": position}
        for name in models:
            kept = [state.k.shape[2] for state in after[position, name].layers if isinstance(state, SparseKV)]
            row[name] = dict(_summary(times[position, name]),
                             prefill_seconds_from_previous_position=prefill_seconds[position, name],
                             cache_keys_per_softmax_layer=kept)
        rows.append(row)
    return rows


def _parse_lengths(values, flag: str) -> list[int]:
    if isinstance(values, str):
        values = parse_int_list(values, flag)
    values = list(values)
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{flag} must list positive integers, got {values}")
    if values != sorted(set(values)):
        raise ValueError(f"{flag} must be strictly increasing, got {values}")
    return values


def chart_data(receipt: dict) -> dict:
    """The numbers the chart draws, from a receipt: per panel x values and each variant's min seconds."""
    panels = {}
    for key, x_name, label in (("training", "sequence_length", "sequence length (tokens)"),
                               ("decode", "position", "position P (tokens already cached)")):
        rows = receipt[key]
        panels[key] = {
            "x": [row[x_name] for row in rows], "x_label": label,
            **{name: [row[name]["seconds_min"] for row in rows] for name in VARIANTS},
            "crossover": receipt["crossover"][key],
        }
    panels["training"]["title"] = f"training step (fwd + bwd), batch {receipt['training_batch_size']}"
    panels["decode"]["title"] = f"one cached decode step, batch {receipt['decode_batch_size']}"
    panels["preset"] = receipt["preset"]
    return panels


def draw_scaling(data: dict):
    """Two log-log panels: training step time vs length, decode step time vs position."""
    from matplotlib.ticker import NullLocator

    from glm53_flash.report.figures import style

    colours = {"hybrid": "tab:blue", "dense": "tab:orange"}
    labels = {"hybrid": f"hybrid ({data['preset']})", "dense": "every layer dense softmax"}
    with style() as plt:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), constrained_layout=True)
        for ax, key in zip(axes, ("training", "decode")):
            panel = data[key]
            for name in VARIANTS:
                ax.plot(panel["x"], panel[name], marker="o", color=colours[name], label=labels[name])
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(panel["x"], [str(x) for x in panel["x"]])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xlabel(panel["x_label"])
            ax.set_ylabel("seconds (min of repeats)")
            ax.set_title(panel["title"])
            ax.grid(True, which="major", alpha=0.3)
            cross = panel["crossover"]
            title = None
            if cross["status"] == "crossed":
                ax.axvline(cross["at"], color="0.3", linestyle=":", linewidth=1.5,
                           label=f"hybrid cheaper from ~{cross['at']:.0f}")
            else:
                title = ("hybrid cheaper at every point" if cross["status"] == "hybrid-cheaper-throughout"
                         else "hybrid not cheaper in range")
            ax.legend(loc="best", title=title)
        return fig


def run(preset: str = "flash", device: str = "cpu", batch_size: int = 4,
        sequence_lengths=DEFAULT_SEQUENCE_LENGTHS, decode_batch: int = 4, positions=DEFAULT_POSITIONS,
        repeats: int = 3, warmup: int = 1, decode_repeats: int = 10, prefill_chunk: int = 512,
        threads: int | None = None, output: str | None = "runs/bench/scaling.json",
        chart: str | None = None) -> dict:
    lengths = _parse_lengths(sequence_lengths, "--sequence-lengths")
    positions = _parse_lengths(positions, "--positions")
    for name, value, least in (("--batch-size", batch_size, 1), ("--decode-batch", decode_batch, 1),
                               ("--repeats", repeats, 1), ("--decode-repeats", decode_repeats, 1),
                               ("--warmup", warmup, 0), ("--prefill-chunk", prefill_chunk, 1)):
        if value < least:
            raise ValueError(f"{name} must be at least {least}, got {value}")
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    device = resolve_device(device)
    max_length = max(lengths[-1], positions[-1] + 1)
    configs = variant_configs(preset, max_length)
    torch.manual_seed(MODEL_SEED)
    models = {"hybrid": GLM53Flash(configs["hybrid"]).to(device)}
    models["dense"] = GLM53Flash(configs["dense"]).to(device)
    models["dense"].load_state_dict(models["hybrid"].state_dict())  # same weights, other attention
    load_before = os.getloadavg()
    started = time.perf_counter()
    training = bench_training(models, device, batch_size, lengths, warmup, repeats)
    decode = bench_decode(models, device, decode_batch, positions, prefill_chunk, warmup, decode_repeats)
    wall = time.perf_counter() - started
    load_after = os.getloadavg()
    cross = {
        "training": crossover(lengths, [r["hybrid"]["seconds_min"] for r in training],
                              [r["dense"]["seconds_min"] for r in training]),
        "decode": crossover(positions, [r["hybrid"]["seconds_min"] for r in decode],
                            [r["dense"]["seconds_min"] for r in decode]),
    }
    result = {
        "benchmark": "scaling", "preset": preset, "device": str(device), "torch_threads": torch.get_num_threads(),
        "weights": f"random (torch.manual_seed({MODEL_SEED})), the same in both variants",
        "parameter_counts": models["hybrid"].parameter_counts(),
        "variants": {
            name: {"config": cfg.to_dict(), "attention_pattern": cfg.attention_pattern,
                   "layers_at_max_length": attention_layout(models[name], max_length)}
            for name, cfg in configs.items()},
        "training_batch_size": batch_size, "sequence_lengths": lengths, "training_warmup": warmup,
        "training_repeats": repeats,
        "training_method": "forward + backward (cross-entropy + 0.01 x balance loss), no optimizer step, "
                           "uniform random bytes; each round times every (length, variant) once; min over rounds",
        "decode_batch_size": decode_batch, "positions": positions, "decode_warmup": warmup,
        "decode_repeats": decode_repeats, "prefill_chunk": prefill_chunk,
        "decode_method": "one single-token step with a cache holding P tokens, each repeat from the same "
                         "cache (mask and index tables warm); each round times every (position, variant) once; "
                         "min over rounds",
        "training": training, "decode": decode, "crossover": cross,
        "load_average_before": list(load_before), "load_average_after": list(load_after),
        "wall_seconds": wall, "provenance": provenance(device=str(device)),
    }
    rows = [("device", f"{device} ({torch.get_num_threads()} threads, load {load_before[0]:.1f} -> "
                       f"{load_after[0]:.1f})")]
    for r in training:
        rows.append((f"train T={r['sequence_length']}",
                     f"hybrid {1e3 * r['hybrid']['seconds_min']:.1f} ms, dense {1e3 * r['dense']['seconds_min']:.1f} ms"))
    for r in decode:
        rows.append((f"decode P={r['position']}",
                     f"hybrid {1e3 * r['hybrid']['seconds_min']:.2f} ms, dense {1e3 * r['dense']['seconds_min']:.2f} ms"))
    for key, c in cross.items():
        rows.append((f"crossover ({key})", c["status"] + (f" at ~{c['at']:.0f}" if c["at"] else "")))
    print_table(rows, title=f"glm53 bench scaling  preset={preset}  batch {batch_size} (training), "
                            f"{decode_batch} (decode)  {wall:.0f} s")
    if output:
        write_json(output, result)
        print(f"wrote {output}")
        chart = chart or os.path.splitext(output)[0] + ".png"
    if chart:
        from glm53_flash.report.figures import save_png

        os.makedirs(os.path.dirname(chart) or ".", exist_ok=True)
        save_png(draw_scaling(chart_data(result)), chart)
        print(f"wrote {chart}")
    return result
