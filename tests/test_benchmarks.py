"""`glm53 bench model` on the tiny preset: the receipt has every figure and they are consistent."""

import json

from glm53_flash.benchmarks.model import run


def test_bench_model_receipt_on_tiny_preset(tmp_path, capsys):
    output = tmp_path / "model.json"
    run(preset="tiny", device_name="cpu", batch_size=2, seq_len=64, steps=1, warmup=1, decode_batch=2,
        prompt_len=4, decode_total=12, reforward_every=3, output=str(output))
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
    printed = capsys.readouterr()
    assert "decode speedup" in printed.out and "step floor: GEMMs only" in printed.out
    assert "[bench model" in printed.err and "decode step floors" in printed.err


def test_bench_model_bad_lengths_are_clear_errors():
    import pytest

    with pytest.raises(ValueError, match="--sequence-length 100 exceeds"):
        run(preset="tiny", seq_len=100)
    with pytest.raises(ValueError, match="--prompt-length"):
        run(preset="tiny", seq_len=64, prompt_len=64)
