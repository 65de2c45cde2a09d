"""`glm53 bench model` on the tiny preset: the receipt has every figure and they are consistent."""

import json

import pytest

from glm53_flash.cli import main

from glm53_flash.benchmarks.model import run
from glm53_flash.model import ops


def test_bench_model_receipt_on_tiny_preset(tmp_path, capsys):
    output = tmp_path / "model.json"
    run(preset="tiny", device="cpu", batch_size=2, sequence_length=64, steps=1, warmup=1, decode_batch=2,
        prompt_length=4, decode_length=12, reforward_every=3, output=str(output), precision_rounds=2,
        peak_sizes=(64, 128), precisions="fp32,bf16")  # the default sizes take minutes where bf16 is emulated
    receipt = json.loads(output.read_text())
    training, decode = receipt["training"], receipt["decode"]
    assert training["tokens_per_second"] > 0 and 0 < training["fraction_of_matmul_peak"]
    assert training["flops_per_second"] == training["flops_per_token"] * training["tokens_per_second"]
    assert decode["new_tokens_per_row"] == 8 and decode["reforward_lengths_timed"] == 4  # 4, 7, 10, 11
    assert decode["cached_seconds"] == min(decode["cached_seconds_all_repeats"]) and decode["repeats"] == 2
    peak = receipt["matmul_peak"]
    assert peak["flops_per_second"] == max(peak["before_training"], peak["after_training"])
    assert 0 < decode["prefill_seconds"] < decode["cached_seconds"]
    assert abs(decode["speedup"] - decode["reforward_seconds"] / decode["cached_seconds"]) < 1e-9
    floors = decode["floors"]
    params = sum(p["total"] for p in [receipt["parameter_counts"]])
    assert floors["weight_bytes"] == 4 * params  # fp32, tied head counted once
    assert floors["weight_read_seconds"] > 0 and floors["matrix_products_seconds"] > 0
    steps = decode["new_tokens_per_row"] - 1
    expected = decode["reforward_seconds"] / (decode["prefill_seconds"] + steps * floors["matrix_products_seconds"])
    assert abs(floors["speedup_ceiling_at_matrix_products"] - expected) < 1e-9
    assert decode["step_over_weight_read"] == decode["cached_step_seconds_mean"] / floors["weight_read_seconds"]
    eager = training["eager_comparison"]
    if ops.available():  # the training step with and without the C kernels, alternating
        assert eager["rounds"] == 1 and eager["speedup_of_min"] == eager["eager_step_seconds_min"] / eager[
            "kernels_step_seconds_min"]
        assert ops.library.ENABLED  # switched back on after the comparison
    else:
        assert eager is None
    compared = training["precision_comparison"]  # both precisions' steps and peaks, interleaved
    assert compared["rounds"] == 2 and len(compared["fp32"]["step_seconds"]) == 2
    assert compared["bf16_speedup_of_min"] == compared["fp32"]["step_seconds_min"] / compared["bf16"]["step_seconds_min"]
    assert compared["precisions"]["bf16"]["name"] == "bf16" and compared["precisions"]["fp32"]["name"] == "fp32"
    for name in ("fp32", "bf16"):
        own = compared[name]
        assert own["fraction_of_own_peak"] == own["training_flops_per_second"] / own["matmul_peak_flops_per_second"]
    printed = capsys.readouterr()
    assert "training, bf16 vs fp32" in printed.out and "GEMM peaks, bf16 / fp32" in printed.out
    assert "decode speedup" in printed.out and "step floor: GEMMs only" in printed.out
    assert ("training, kernels vs eager" in printed.out) is ops.available()
    assert "[bench model" in printed.err and "decode step floors" in printed.err


def test_bench_model_bad_lengths_are_clear_errors():
    import pytest

    with pytest.raises(ValueError, match="--sequence-length 200 exceeds"):
        run(preset="tiny", sequence_length=200)  # the tiny preset's context is 192
    with pytest.raises(ValueError, match="--prompt-length"):
        run(preset="tiny", sequence_length=64, prompt_length=192)


# `glm53 bench scaling`: hybrid vs every layer dense softmax attention.

import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from glm53_flash.benchmarks import scaling  # noqa: E402
from glm53_flash.model.config import ModelConfig  # noqa: E402
from glm53_flash.model.sparse_attention import SparseAttention  # noqa: E402


def test_bench_scaling_receipt_on_tiny_preset(tmp_path, capsys):
    output = tmp_path / "scaling.json"
    result = scaling.run(preset="tiny", sequence_lengths="16,32", positions=(4, 40), repeats=1, warmup=1,
                         decode_repeats=2, prefill_chunk=16, output=str(output))
    receipt = json.loads(output.read_text())
    assert receipt == json.loads(json.dumps(result))
    assert (tmp_path / "scaling.png").stat().st_size > 0
    assert [row["sequence_length"] for row in receipt["training"]] == [16, 32] == receipt["sequence_lengths"]
    assert [row["position"] for row in receipt["decode"]] == [4, 40] == receipt["positions"]
    layers = ModelConfig.preset("tiny").layers
    for row in receipt["training"] + receipt["decode"]:
        for name in scaling.VARIANTS:
            assert 0 < row[name]["seconds_min"] <= row[name]["seconds_median"]
            assert row[name]["seconds_min"] == min(row[name]["seconds_all"])
    # The dense variant was measured on a model whose every layer is softmax over every earlier key ...
    dense, hybrid = receipt["variants"]["dense"], receipt["variants"]["hybrid"]
    assert dense["attention_pattern"] == ["sparse"] * layers and dense["config"]["sparse_every"] == 1
    assert all(layer == {"kind": "softmax", "keys_at_last_position": 41} for layer in dense["layers_at_max_length"])
    for row in receipt["training"]:
        assert row["dense"]["softmax_keys_at_last_position"] == [row["sequence_length"]] * layers
    for row in receipt["decode"]:  # ... read from the cache each timed step left behind
        assert row["dense"]["cache_keys_per_softmax_layer"] == [row["position"] + 1] * layers
    # ... and the hybrid on the preset's own pattern, whose sparse decode keeps fewer keys at position 40.
    assert hybrid["attention_pattern"] == ModelConfig.preset("tiny").attention_pattern
    assert hybrid["attention_pattern"].count("sparse") == len(receipt["decode"][1]["hybrid"]["cache_keys_per_softmax_layer"])
    assert max(receipt["decode"][1]["hybrid"]["cache_keys_per_softmax_layer"]) < 41
    for key, x_name in (("training", "sequence_length"), ("decode", "position")):
        rows = receipt[key]
        assert receipt["crossover"][key] == scaling.crossover(
            [r[x_name] for r in rows], [r["hybrid"]["seconds_min"] for r in rows], [r["dense"]["seconds_min"] for r in rows])
    assert len(receipt["load_average_before"]) == 3 and receipt["provenance"]
    assert "crossover (decode)" in capsys.readouterr().out


def test_dense_variant_is_full_causal_softmax_attention():
    torch.manual_seed(0)
    configs = scaling.variant_configs("tiny", 64)
    hybrid_cfg, dense_cfg = configs["hybrid"], configs["dense"]
    assert all(dense_cfg.is_sparse_layer(i) for i in range(dense_cfg.layers))
    model = scaling.GLM53Flash(dense_cfg)
    hybrid_layer = SparseAttention(hybrid_cfg.dim, hybrid_cfg.heads, hybrid_cfg.sparse_window, hybrid_cfg.sparse_stride)
    x = torch.randn(2, 64, dense_cfg.dim)
    for block in model.blocks:
        layer = block.attention
        assert isinstance(layer, SparseAttention)
        out, _ = layer(x, model.rope)
        # Reference: plain causal softmax attention with the layer's own projections and RoPE.
        q, k, v = layer.qkv(x).view(2, 64, 3, dense_cfg.heads, -1).permute(2, 0, 3, 1, 4)
        q, k = model.rope(q), model.rope(k)
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        ref = layer.out(ref.transpose(1, 2).reshape(2, 64, dense_cfg.dim))
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        # Position 1 is neither an anchor nor inside the hybrid's window of the last query: changing
        # it moves the dense layer's last output but not the hybrid layer's (same weights).
        hybrid_layer.load_state_dict(layer.state_dict())
        changed = x.clone()
        changed[:, 1] += 1.0
        assert not torch.allclose(layer(changed, model.rope)[0][:, -1], out[:, -1], atol=1e-4)
        torch.testing.assert_close(hybrid_layer(changed, model.rope)[0][:, -1], hybrid_layer(x, model.rope)[0][:, -1])
    # The whole dense model: its last logits depend on the first token.
    ids = torch.randint(4, 260, (1, 64))
    other = ids.clone()
    other[0, 0] = 4 if ids[0, 0] != 4 else 5
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits[0, -1], model(other).logits[0, -1])


def test_crossover_on_synthetic_costs():
    # The ratio hybrid / dense falls from 2 to 1/2 between 2 and 4: log-log midpoint sqrt(8).
    cross = scaling.crossover([1, 2, 4, 8], [4, 4, 4, 4], [1, 2, 8, 16])
    assert cross["status"] == "crossed" and cross["between"] == [2, 4]
    assert math.isclose(cross["at"], math.sqrt(8))
    # Cheaper, dearer, cheaper again: the crossover is where it becomes cheaper for good.
    cross = scaling.crossover([1, 2, 4, 8], [1, 1, 3, 1], [2, 2, 2, 2])
    assert cross["between"] == [4, 8]
    assert math.isclose(cross["at"], math.exp(math.log(4) + math.log(1.5) / math.log(3) * math.log(2)))
    assert scaling.crossover([1, 2], [2, 1], [2, 2])["at"] == 1  # equal cost is not cheaper
    assert scaling.crossover([1, 2, 4], [1, 1, 1], [2, 2, 2]) == {
        "status": "hybrid-cheaper-throughout", "at": None, "between": None}
    assert scaling.crossover([1, 2, 4], [1, 1, 3], [2, 2, 2])["status"] == "none"
    with pytest.raises(ValueError, match="equally long"):
        scaling.crossover([1, 2], [1], [1, 2])
    with pytest.raises(ValueError, match="positive"):
        scaling.crossover([1, 2], [0, 1], [1, 2])


def test_scaling_chart_marks_the_crossover_and_keeps_text_readable():
    from glm53_flash.report.figures import pyplot, smallest_text_pt

    panel = {"x": [1, 2, 4, 8], "x_label": "x", "title": "t", "hybrid": [4, 4, 4, 4], "dense": [1, 2, 8, 16]}
    data = {"preset": "tiny",
            "training": dict(panel, crossover=scaling.crossover(panel["x"], panel["hybrid"], panel["dense"])),
            "decode": dict(panel, crossover={"status": "none", "at": None, "between": None})}
    fig = scaling.draw_scaling(data)
    left, right = fig.axes
    assert left.get_xscale() == "log" and left.get_yscale() == "log"
    assert any(text.get_text() == "hybrid cheaper from ~3" for text in left.get_legend().get_texts())
    assert right.get_legend().get_title().get_text() == "hybrid not cheaper in range"
    assert smallest_text_pt(fig) >= 10
    pyplot().close(fig)


def test_bench_scaling_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="--positions must be comma-separated integers"):
        scaling.run(preset="tiny", positions="8,x", output=None)
    with pytest.raises(ValueError, match="--sequence-lengths must be strictly increasing"):
        scaling.run(preset="tiny", sequence_lengths=(32, 16), output=None)
    with pytest.raises(ValueError, match="--decode-repeats must be at least 1"):
        scaling.run(preset="tiny", decode_repeats=0, output=None)


def test_bench_contention_compares_spin_counts_in_children_with_the_same_weights(tmp_path):
    """--spin-counts: one child per count with GOMP_SPINCOUNT set (each child's receipt says its count was
    kept), and every child's fixed-thread training steps end on the same weights: how long idle threads spin
    changes when they sleep, never what they compute."""
    from glm53_flash.benchmarks.contention import compare_spin_counts

    receipt = compare_spin_counts([300000, 0], rounds=1, output=str(tmp_path / "spin.json"), quiet=True,
                                  preset="tiny", batch_size=2, sequence_length=32, steps=1, decode_batch=2,
                                  decode_tokens=2)
    assert receipt["same_weights_every_child"] is True
    hashes = [child["weights_sha256_after_quiet_fixed"] for runs in receipt["children"].values() for child in runs]
    assert len(hashes) == 2 and len(hashes[0]) == 64
    assert receipt["per_count"]["0"]["spin_waits"] == ["left alone (GOMP_SPINCOUNT=0 set before glm53 started)"]
    ratios = receipt["per_count"]["0"]["ratios"]
    assert ratios["train_quiet_over_spin_300000"]["rounds"][0] > 0
    assert receipt["per_count"]["300000"]["ratios"]["train_quiet_over_spin_300000"]["median"] == 1.0
    assert json.loads((tmp_path / "spin.json").read_text())["kind"] == "bench-contention-spin-counts"


@pytest.mark.parametrize("counts, message", [("1000", "at least two distinct"), ("1000,1000", "at least two"),
                                             ("1000,-1", "at least two distinct counts >= 0"),
                                             ("1000,lots", "comma-separated whole numbers")])
def test_bench_contention_refuses_bad_spin_counts(tmp_path, capsys, counts, message):
    out = tmp_path / "spin.json"
    assert main(["bench", "contention", "--spin-counts", counts, "--output", str(out)]) == 2
    assert message in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("flags, message", [(["--mid-run", "6", "--busy-after", "6"], "--busy-after must lie in [1, --mid-run)"),
                                            (["--mid-run", "6", "--busy-after", "0"], "--busy-after must lie"),
                                            (["--mid-run", "6", "--checkpoint-every", "0"], "--checkpoint-every must be"),
                                            (["--mid-run", "6", "--spin-counts", "1,2"], "two measurements")])
def test_bench_contention_mid_run_refuses_bad_settings(tmp_path, capsys, flags, message):
    out = tmp_path / "mid.json"
    assert main(["bench", "contention", *flags, "--preset", "tiny", "--output", str(out)]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_bench_contention_receipt_on_the_tiny_preset(tmp_path):
    """Quiet and busy, fixed and adaptive, in one process; its competitor is gone afterwards."""
    from glm53_flash.benchmarks.contention import run

    receipt = run(preset="tiny", batch_size=2, sequence_length=32, steps=1, decode_batch=2, decode_tokens=2,
                  output=str(tmp_path / "contention.json"), quiet=True)
    assert set(receipt["runs"]) == {"quiet_fixed", "quiet_adaptive", "busy_fixed", "busy_adaptive"}
    assert len(receipt["runs"]["busy_adaptive"]["train_step_seconds"]) == 2  # one step to learn from, one timed
    assert all(value > 0 for value in receipt["ratios"].values())
    assert json.loads((tmp_path / "contention.json").read_text())["kind"] == "bench-contention"
    assert receipt["precision"]["requested"] == "default" and receipt["precision"]["name"] == "fp32"
    bf16 = run(preset="tiny", batch_size=2, sequence_length=32, steps=1, decode_batch=2, decode_tokens=2,
               quiet=True, precision="bf16")
    assert bf16["precision"]["name"] == "bf16" and all(value > 0 for value in bf16["ratios"].values())


def test_the_thread_governor_follows_the_free_cores(monkeypatch):
    """Scripted /proc/stat readings: a machine as busy as two cores while this process used one leaves
    one core free (one thread); quiet again, back to the count it started with; never below one."""
    import torch

    from glm53_flash.core import shared_machine

    threads = torch.get_num_threads()
    set_to = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: set_to.append(n))
    governor = shared_machine.ThreadGovernor(most=2)
    governor.load.cores = 2
    # (machine busy, machine total jiffies), this process's CPU seconds, wall seconds
    readings = iter([((200.0, 200.0), 1.0, 1.0),   # both cores busy, one of them ours: one free
                     ((300.0, 400.0), 2.0, 2.0),   # half the machine busy, all of it ours: two free
                     ((500.0, 600.0), 2.0, 3.0)])  # both busy, none ours: still one thread at least
    governor.load._mark = ((0.0, 0.0), 0.0, 0.0)
    monkeypatch.setattr(governor.load, "_sample", lambda: next(readings))
    assert [governor.after_step() for _ in range(3)] == [1, 2, 1]
    assert set_to == [1, 2, 1] and governor.changes == 3
    assert torch.get_num_threads() == threads


def test_bench_decode_weights_receipt_on_the_tiny_preset(tmp_path, capsys):
    """`glm53 bench decode-weights`: both weight types timed round by round, each against a read of the
    bytes it reads (bf16 half of the weight products'), the tokens compared; bad sizes are one line."""
    from glm53_flash.model import ops

    if not ops.available():
        pytest.skip("no C decode kernels here: the bench measures their bf16 weight path")
    out = tmp_path / "decode-weights.json"
    assert main(["bench", "decode-weights", "--preset", "tiny", "--steps", "4", "--rounds", "2",
                 "--prompt-length", "8", "--output", str(out)]) == 0
    receipt = json.loads(out.read_text())
    assert receipt["benchmark"] == "decode-weights" and len(receipt["step_seconds"]["bf16"]["all"]) == 2
    assert receipt["weight_bytes"]["bf16"] < receipt["weight_bytes"]["fp32"]
    assert receipt["precision"]["name"] == "bf16" and receipt["greedy_agreement"] > 0.5
    assert receipt["bf16_speedup"] == pytest.approx(receipt["step_seconds"]["fp32"]["median"]
                                                     / receipt["step_seconds"]["bf16"]["median"])
    for name, split in receipt["split_per_step"].items():  # the step's seconds in the C kernels and outside
        steps = receipt["step_seconds"][name]["all"]
        assert len(split["kernel_seconds_all"]) == 2 and split["other_seconds"] > 0
        assert all(0 < inside < step for inside, step in zip(split["kernel_seconds_all"], steps))
    assert ops.library._SPENT is None and not ops.library._WATCHED  # the kernels' calls are untimed again
    printed = capsys.readouterr().out
    assert "step / weight read" in printed and "in the C kernels / outside" in printed
    assert main(["bench", "decode-weights", "--preset", "tiny", "--steps", "500"]) == 2


def test_bench_linear_attention_receipt_on_the_tiny_preset(tmp_path, capsys):
    """`glm53 bench linear-attention`: the scan and the torch chunks timed round by round on the same qkv,
    their outputs and gradients agreeing; a length within the chunk (no scan there) and unknown presets are
    refused with one line."""
    from glm53_flash.model import ops

    if not ops.available():
        pytest.skip("no C kernels here: the bench measures their scan")
    out = tmp_path / "linear-attention.json"
    assert main(["bench", "linear-attention", "--presets", "tiny", "--batch", "2", "--steps", "40", "--rounds", "2",
                 "--rope", "--step", "--output", str(out)]) == 0
    receipt = json.loads(out.read_text())
    shape = receipt["shapes"]["tiny"]
    assert receipt["benchmark"] == "linear-attention" and receipt["rope"] and len(shape["seconds"]["scan"]["all"]) == 2
    assert shape["scan_speedup"] == pytest.approx(shape["seconds"]["torch"]["median"] / shape["seconds"]["scan"]["median"])
    assert max(shape["largest_difference_relative"].values()) < 1e-4
    step = shape["whole_step"]
    assert len(step["seconds"]["scan"]["all"]) == len(step["seconds"]["torch"]["all"]) == 2
    assert step["scan_speedup"] == pytest.approx(step["seconds"]["torch"]["median"] / step["seconds"]["scan"]["median"])
    from glm53_flash.model.ops import linear_attention

    assert linear_attention.SCAN_ENABLED  # the bench puts the switch back
    assert "a whole training step" in capsys.readouterr().out
    assert main(["bench", "linear-attention", "--presets", "tiny", "--steps", "16"]) == 2  # within the chunk
    assert main(["bench", "linear-attention", "--presets", "huge"]) == 2


def test_bench_precision_receipt_on_tiny_preset(tmp_path, capsys):
    from glm53_flash.benchmarks.precision import run as run_precision

    output = tmp_path / "precision.json"
    result = run_precision(preset="tiny", device="cpu", steps=10, batch_size=2, sequence_length=128, output=str(output))
    receipt = json.loads(output.read_text())
    assert receipt["steps"] == 10 and len(receipt["loss_fp32"]) == len(receipt["loss_bf16"]) == 10
    assert receipt["loss_fp32"] != receipt["loss_bf16"]  # the bf16 products did change the run
    a, b = sum(receipt["loss_fp32"]) / 10, sum(receipt["loss_bf16"]) / 10
    assert abs(receipt["max_relative_difference_of_window_means"] - abs(b - a) / a) < 1e-12
    assert receipt["within_tolerance"] == (receipt["max_relative_difference_of_window_means"] <= receipt["tolerance"])
    assert receipt["precisions"]["bf16"]["name"] == "bf16" and result["bf16_speedup_of_median"] > 0
    # the yardstick: fp32 from another seed, its gap computed the same way, and the verdict beside it
    other = receipt["loss_fp32_other_seed"]
    assert receipt["baseline_seed"] == 43 and len(other) == 10 and other != receipt["loss_fp32"]
    c = sum(other) / 10
    assert abs(receipt["seed_max_relative_difference_of_window_means"] - abs(c - a) / a) < 1e-12
    assert receipt["bf16_within_seed_spread"] == (receipt["max_relative_difference_of_window_means"]
                                                  <= receipt["seed_max_relative_difference_of_window_means"])
    assert "largest difference" in capsys.readouterr().out


def test_bench_precision_refuses_too_few_steps():
    import pytest
    from glm53_flash.benchmarks.precision import run as run_precision

    with pytest.raises(ValueError, match="at least 10"):
        run_precision(preset="tiny", device="cpu", steps=3)
    with pytest.raises(ValueError, match="must differ from --seed"):
        run_precision(preset="tiny", device="cpu", steps=10, seed=5, baseline_seed=5)


def test_the_thread_governor_hands_its_starting_count_back(monkeypatch):
    """A stage that adapted leaves the next stage of the same process the count it found: restore() and
    the context manager both set it back, and only when it changed."""
    import torch

    from glm53_flash.core import shared_machine

    live = [2]
    set_to = []
    monkeypatch.setattr(torch, "get_num_threads", lambda: live[0])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (set_to.append(n), live.__setitem__(0, n)))
    with shared_machine.ThreadGovernor() as governor:
        governor.load.cores = 2
        governor.load._mark = ((0.0, 0.0), 0.0, 0.0)
        monkeypatch.setattr(governor.load, "_sample", lambda: ((200.0, 200.0), 1.0, 1.0))  # one core taken elsewhere
        assert governor.after_step() == 1 and live == [1]
    assert live == [2] and set_to == [1, 2] and governor.threads == 2
    governor.restore()
    assert set_to == [1, 2]  # nothing to hand back: no call


def test_bench_rl_times_the_headline_rl_stage_in_both_precisions(tmp_path):
    """Two groups of the headline's RL stage from a tiny checkpoint, once per precision: the receipt has
    each run's seconds split into rollouts and updates, the medians, the speed-up, and the stage's config."""
    import pytest
    import torch

    from glm53_flash import GLM53Flash, ModelConfig
    from glm53_flash.benchmarks.rl import run as run_rl
    from glm53_flash.train.checkpoint import save_checkpoint

    torch.manual_seed(0)
    start = tmp_path / "checkpoint-0000"
    save_checkpoint(start, GLM53Flash(ModelConfig.preset("tiny").replace(max_sequence_length=160)), {"stage": "test"})
    output = tmp_path / "rl.json"
    result = run_rl(str(start), rounds=1, groups=2, output=str(output), precisions="bf16,fp32")
    assert json.loads(output.read_text()) == json.loads(json.dumps(result))
    assert result["config"]["groups"] == 2 and result["config"]["group_size"] == 16  # the headline's groups
    for name in ("fp32", "bf16"):
        (one,) = result["runs"][name]
        assert one["precision"]["name"] == name
        assert one["rollout_seconds"] > 0 and one["update_seconds"] >= 0
        assert one["rollout_seconds"] + one["update_seconds"] <= one["wall_seconds"]
        assert 0 <= one["update_forward_seconds"] + one["update_step_seconds"] <= one["update_seconds"]
        assert one["update_positions"] >= 0 and 0 <= one["update_padding_fraction"] < 1
        assert result["median"][name]["wall_seconds"] == one["wall_seconds"]
    assert result["bf16_speedup"]["wall_seconds"] == (result["median"]["fp32"]["wall_seconds"]
                                                      / result["median"]["bf16"]["wall_seconds"])
    only = run_rl(str(start), rounds=1, groups=1, precisions="bf16")  # one precision: no speed-up to report
    assert set(only["runs"]) == {"bf16"} and "bf16_speedup" not in only and only["bf16_repeats_bit_identical"]
    # --busy: the same stage in fp32, quiet and beside the bench's own busy process, fixed and adaptive
    busy = run_rl(str(start), rounds=1, groups=1, busy=True)
    assert set(busy["runs"]) == {"quiet", "busy_fixed", "busy_adaptive"}
    assert busy["conditions"]["busy_adaptive"] == {"precision": "fp32", "beside_a_busy_process": True,
                                                   "adapt_threads": True}
    assert all(r[0]["precision"]["name"] == "fp32" for r in busy["runs"].values())
    assert busy["slowdown"]["busy_fixed"]["wall_seconds"] == (busy["median"]["busy_fixed"]["wall_seconds"]
                                                              / busy["median"]["quiet"]["wall_seconds"])
    assert "bf16_speedup" not in busy
    with pytest.raises(ValueError, match="at least 1"):
        run_rl(str(start), rounds=0)
    with pytest.raises(FileNotFoundError, match="not a checkpoint directory"):
        run_rl(str(tmp_path / "missing"))


class _CountingGovernor:
    """Stands in for shared_machine.ThreadGovernor: counts the steps it is told about, drops to one thread at
    the first, and hands the starting count back on restore (what the real one does on a busy machine)."""

    made: list = []

    def __init__(self, most=None):
        import torch

        self.initial = self.threads = torch.get_num_threads()
        self.steps = self.changes = 0
        self.restored = False
        _CountingGovernor.made.append(self)

    def after_step(self):
        import torch

        self.steps += 1
        if self.threads != 1:
            torch.set_num_threads(1)
            self.threads, self.changes = 1, self.changes + 1
        return self.threads

    def restore(self):
        import torch

        torch.set_num_threads(self.initial)
        self.threads, self.restored = self.initial, True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()


def test_rl_and_evaluation_tell_the_governor_every_step_and_hand_the_threads_back(tmp_path, monkeypatch):
    import torch

    from glm53_flash import GLM53Flash, ModelConfig
    from glm53_flash.core import shared_machine
    from glm53_flash.evaluation.evaluate import evaluate_greedy
    from glm53_flash.tasks import frozen_tasks
    from glm53_flash.train.checkpoint import save_checkpoint
    from glm53_flash.train.rl_run import RLConfig, train_rl

    monkeypatch.setattr(shared_machine, "ThreadGovernor", _CountingGovernor)
    _CountingGovernor.made = []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        model = GLM53Flash(ModelConfig.preset("tiny").replace(max_sequence_length=160)).eval()
        receipt = evaluate_greedy(model, frozen_tasks("dev", 1, ("increment",)), max_new_tokens=6, adapt_threads=True)
        (governor,) = _CountingGovernor.made
        assert governor.steps >= 5 and governor.restored and torch.get_num_threads() == 2  # a call per decode step
        assert receipt["timing"]["thread_changes"] == 1 and receipt["timing"]["threads_at_end"] == 1
        start = tmp_path / "checkpoint-0000"
        save_checkpoint(start, model, {"stage": "test"})
        train_rl(RLConfig(initial_checkpoint=str(start), output=str(tmp_path / "rl"), groups=2, checkpoints=(),
                          group_size=2, max_new_tokens=6, device="cpu", quiet=True, verifier_workers=1,
                          families="increment", adapt_threads=True))
        governor = _CountingGovernor.made[-1]
        rows = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
        assert [row["threads"] for row in rows] == [1, 1]  # the count at each update's end
        assert governor.steps >= 2 * 5 + 2 and governor.restored and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_bench_profile_groups_every_operators_time_and_names_the_c_kernels(tmp_path, capsys):
    """The profile's groups add up to the profiled step (what no operator covers is its own row), our C
    kernels show under their own names while it runs, and nothing is labelled outside it."""
    from glm53_flash.benchmarks import profile
    from glm53_flash.model.ops import library

    out = tmp_path / "profile.json"
    assert main(["bench", "profile", "--preset", "tiny", "--batch-size", "4", "--sequence-length", "32",
                 "--steps", "2", "--warmup", "1", "--precisions", "fp32,bf16", "--output", str(out)]) == 0
    receipt = json.loads(out.read_text())
    assert receipt["benchmark"] == "profile" and receipt["steps"] == 2 and not library._LABELS
    assert receipt["precisions"] == {"names": ["fp32", "bf16"], "requested": "fp32,bf16", "reason": "asked for"}
    for name in ("fp32", "bf16"):
        record = receipt[name]
        total = sum(group["seconds_per_step"] for group in record["groups"].values())
        assert total == pytest.approx(record["step_seconds_profiled"], rel=0.02)
        assert record["groups"]["matrix products"]["seconds_per_step"] > 0
        assert len(record["step_seconds_unprofiled"]) == 2 and record["precision"]["requested"] == name
        if ops.status()["available"]:
            assert record["groups"]["our C kernels"]["seconds_per_step"] > 0
            assert any(row["name"].startswith("glm53::") for row in record["top_operators"])
    assert "matrix products" in capsys.readouterr().out


def test_benches_time_bf16_only_where_the_cpu_accelerates_it_unless_asked(tmp_path, monkeypatch):
    """--precisions auto (the default of bench model, profile and rl) leaves bf16 out on a CPU without
    AVX512-BF16 or AMX, where it is emulated and one step takes minutes, and says so in the receipt; a list
    is taken as given (fp32 first); anything else is a clear error."""
    from glm53_flash.benchmarks.common import bench_precisions
    from glm53_flash.benchmarks.model import run as run_model
    from glm53_flash.benchmarks.profile import run as run_profile
    from glm53_flash.model import precision

    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda cpuinfo=None: ["amx_bf16"])
    assert bench_precisions("auto", "cpu") == {"names": ["fp32", "bf16"], "requested": "auto",
                                               "reason": "auto: CPU with amx_bf16"}
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda cpuinfo=None: [])
    emulated = bench_precisions("auto", "cpu")
    assert emulated["names"] == ["fp32"] and "no AVX512-BF16 or AMX" in emulated["reason"]
    assert "bf16 left out" in emulated["reason"]
    assert bench_precisions("bf16,fp32", "cpu")["names"] == ["fp32", "bf16"]
    assert bench_precisions("bf16", "cpu")["names"] == ["bf16"]
    for bad in ("fp16", "fp32,fp32", "", "auto,fp32"):
        with pytest.raises(ValueError, match="--precisions"):
            bench_precisions(bad, "cpu")
    receipt = run_profile(preset="tiny", batch_size=2, sequence_length=16, steps=1, warmup=0)
    assert receipt["precisions"] == emulated and "fp32" in receipt and "bf16" not in receipt
    model = run_model(preset="tiny", device="cpu", batch_size=2, sequence_length=16, steps=1, warmup=0, decode_batch=1,
                      prompt_length=4, decode_length=8, reforward_every=4, precision_rounds=2, peak_sizes=(32,))
    assert model["training"]["precision_comparison"] == {"skipped": emulated["reason"]}
    from glm53_flash.benchmarks.rl import run as run_rl

    with pytest.raises(ValueError, match="--precisions"):  # refused before the model is built or timed
        run_model(preset="tiny", device="cpu", precisions="fp32,bf61")
    with pytest.raises(ValueError, match="--busy times fp32 alone"):
        run_rl(str(tmp_path), busy=True, precisions="fp32")


def test_bench_profile_groups_operators_by_the_first_rule_that_matches():
    from glm53_flash.benchmarks.profile import OTHER, group_of

    assert group_of("aten::mm") == group_of("aten::addmm") == "matrix products"
    assert group_of("aten::mkldnn_rnn") == "matrix products"
    assert group_of("glm53::swiglu_forward") == "our C kernels"
    assert group_of("aten::_to_copy") == group_of("aten::copy_") == "casts and copies"
    assert group_of("aten::_fused_adamw_") == group_of("Optimizer.step#AdamW.step") == "optimizer"
    assert group_of("autograd::engine::evaluate_function: MmBackward0") == "autograd bookkeeping"
    assert group_of("aten::mm_backward_helper") == OTHER  # an exact rule is not a prefix
    assert group_of("aten::add") == OTHER


def test_bench_profile_refuses_bad_input():
    from glm53_flash.benchmarks.profile import run

    with pytest.raises(ValueError, match="--steps"):
        run(preset="tiny", steps=0)
    with pytest.raises(ValueError, match="--sequence-length"):
        run(preset="tiny", sequence_length=100_000)
