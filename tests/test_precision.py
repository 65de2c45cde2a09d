"""Precision as one choice (model/precision.py): how fp32 | bf16 | auto resolve, that fp32 changes nothing,
that bf16 products really run in bf16, and that the bf16 model follows the float32 one within stated
tolerances (forward, gradients, a short training run, cached decoding)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from glm53_flash.data.batches import IGNORE_INDEX
from glm53_flash.model import GLM53Flash, kernels
from glm53_flash.model.config import PRESETS
from glm53_flash.model.moe import MixtureOfExperts, blocked_usable, dense_moe_reference, padded_positions
from glm53_flash.model.precision import (Precision, compute_in, cpu_bf16_flags, mixed_linear,
                                         product_dtype, resolve_precision)
from glm53_flash.train.loop import PRETRAINING, language_model_update, make_optimizer

BF16 = Precision("bf16", "bf16", "test")
FP32 = Precision("fp32", "fp32", "test")
# bf16 keeps 8 bits of mantissa (relative rounding 2^-9 per operand): a product over a few hundred terms
# differs from float32 by about 1e-2 of its scale. The tolerances below are stated against that.
LOGIT_TOLERANCE = 0.05   # of the largest logit magnitude
LOSS_TOLERANCE = 0.01    # relative, cross-entropy of a tiny model on random bytes
CURVE_TOLERANCE = 0.02   # relative, per step of a 20-step tiny training run

AMX_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_tile amx_bf16\n"
PLAIN_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n"


def small_model(seed: int = 0) -> GLM53Flash:
    torch.manual_seed(seed)
    # dims that are multiples of 16, so the grouped expert path serves as it does on the flash preset
    cfg = dataclasses.replace(PRESETS["tiny"], dim=64, heads=4, expert_hidden=64, max_sequence_length=64,
                              linear_chunk=16)
    return GLM53Flash(cfg)


def random_ids(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(4, 260, (batch, length), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------- resolving


def test_cpu_flags_are_read_from_cpuinfo():
    assert cpu_bf16_flags(AMX_CPUINFO) == ["avx512_bf16", "amx_bf16"]
    assert cpu_bf16_flags(PLAIN_CPUINFO) == []
    assert cpu_bf16_flags("") == []


def test_auto_takes_bf16_only_where_the_cpu_accelerates_it():
    fast = resolve_precision("auto", "cpu", cpuinfo=AMX_CPUINFO)
    plain = resolve_precision("auto", "cpu", cpuinfo=PLAIN_CPUINFO)
    assert (fast.name, plain.name) == ("bf16", "fp32")
    assert "avx512_bf16" in fast.reason and "no AVX512-BF16" in plain.reason
    assert fast.dtype == torch.bfloat16 and plain.dtype == torch.float32


def test_explicit_choices_and_the_default():
    assert resolve_precision("fp32", "cpu", cpuinfo=AMX_CPUINFO).name == "fp32"
    emulated = resolve_precision("bf16", "cpu", cpuinfo=PLAIN_CPUINFO)
    assert emulated.name == "bf16" and "emulated" in emulated.reason
    default = resolve_precision(None, "cpu", cpuinfo=AMX_CPUINFO)
    assert default.name == "fp32" and default.requested == "default"
    with pytest.raises(ValueError, match="unknown precision 'half'"):
        resolve_precision("half", "cpu")


def test_the_record_says_what_decoding_does():
    assert resolve_precision("fp32", "cpu").record()["decode"] == "fp32"
    assert "C kernels" in resolve_precision("bf16", "cpu").record()["decode"]


# ---------------------------------------------------------------------------------------- the products


def test_fp32_changes_no_bit():
    model = small_model().eval()
    ids = random_ids(2, 24)
    with torch.no_grad():
        plain = model(ids).logits
        with compute_in(FP32, "cpu"):
            assert product_dtype() is None
            inside = model(ids).logits
    assert torch.equal(plain, inside)


def test_bf16_products_round_both_operands_and_hand_back_float32():
    x, w = torch.randn(33, 48), torch.randn(20, 48)
    with compute_in(BF16, "cpu"):
        assert product_dtype() == torch.bfloat16
        out = mixed_linear(x, w)
    assert product_dtype() is None  # the context is left
    assert out.dtype == torch.float32
    assert torch.equal(out, F.linear(x.bfloat16(), w.bfloat16()).float())
    assert not torch.equal(out, F.linear(x, w))


def test_bf16_experts_equal_the_dense_reference_and_padding_adds_no_gradient():
    torch.manual_seed(3)
    moe = MixtureOfExperts(32, 32, 4, 2)
    x = torch.randn(50, 32)  # 100 slots: every expert's rows are padded up to the block
    reference = dense_moe_reference(moe, x)
    x16 = x.clone().requires_grad_()
    with compute_in(BF16, "cpu"):
        out, counts, _ = moe(x16, with_balance=False)
    assert int(counts.sum()) == 100
    scale = reference.abs().max()
    assert (out - reference).abs().max() <= LOGIT_TOLERANCE * scale
    # gradients: bf16 against float32, the experts' weights and the input
    moe.zero_grad()
    (out * torch.linspace(-1, 1, 32)).sum().backward()
    bf16_grads = [moe.expert_gate_up.grad.clone(), moe.expert_down.grad.clone(), x16.grad.clone()]
    moe.zero_grad()
    x32 = x.clone().requires_grad_()
    out32, _, _ = moe(x32, with_balance=False)
    (out32 * torch.linspace(-1, 1, 32)).sum().backward()
    for got, want in zip(bf16_grads, [moe.expert_gate_up.grad, moe.expert_down.grad, x32.grad]):
        cosine = F.cosine_similarity(got.flatten(), want.flatten(), dim=0)
        assert cosine > 0.99, float(cosine)


def test_padded_positions_place_each_experts_rows_at_its_padded_start():
    counts = torch.tensor([2, 0, 3])
    assert padded_positions(counts, torch.tensor([0, 4, 8])).tolist() == [0, 1, 8, 9, 10]


def test_blocked_experts_serve_only_bf16_products_on_aligned_dims():
    rows = torch.randn(6, 32)
    assert blocked_usable(rows, MixtureOfExperts(32, 32, 4, 2)) is None  # outside compute_in
    with compute_in(BF16, "cpu"):
        assert blocked_usable(rows, MixtureOfExperts(32, 32, 4, 2)) == torch.bfloat16
        assert blocked_usable(torch.randn(6, 36), MixtureOfExperts(36, 36, 4, 2)) is None  # bf16 rows not 16-byte


def test_blocked_bf16_experts_equal_the_chunk_loop_at_the_same_rounding_points(monkeypatch):
    # The chunk loop (grouped kernel off) rounds at the same points (rows, weights, activations to bf16)
    # without padding: padded rows that leaked into an output or a gradient would show here.
    from glm53_flash.model import moe as moe_module

    torch.manual_seed(4)
    moe = MixtureOfExperts(32, 32, 4, 2)
    x = torch.randn(50, 32)
    results = {}
    for grouped in (True, False):
        monkeypatch.setattr(moe_module, "GROUPED_MM_ENABLED", grouped)
        moe.zero_grad()
        xi = x.clone().requires_grad_()
        with compute_in(BF16, "cpu"):
            out, _, _ = moe(xi, with_balance=False)
        (out * torch.linspace(-1, 1, 32)).sum().backward()
        results[grouped] = [out.detach(), moe.expert_gate_up.grad.clone(), moe.expert_down.grad.clone(), xi.grad]
    for blocked, loop in zip(results[True], results[False]):
        torch.testing.assert_close(blocked, loop, rtol=2e-2, atol=2e-2 * float(loop.abs().max()))


# ---------------------------------------------------------------------------------------- the model


def test_bf16_forward_follows_fp32_within_the_stated_tolerance():
    model = small_model().eval()
    ids = random_ids(4, 48)
    with torch.no_grad():
        fp32 = model(ids).logits
        with compute_in(BF16, "cpu"):
            bf16 = model(ids).logits
    assert bf16.dtype == torch.float32
    assert not torch.equal(fp32, bf16)  # the products did change
    assert (bf16 - fp32).abs().max() <= LOGIT_TOLERANCE * fp32.abs().max()
    targets = random_ids(4, 48, seed=2).flatten()
    loss32 = F.cross_entropy(fp32.flatten(0, 1), targets)
    loss16 = F.cross_entropy(bf16.flatten(0, 1), targets)
    assert abs(float(loss16 - loss32)) <= LOSS_TOLERANCE * float(loss32)


def test_twenty_bf16_training_steps_follow_the_fp32_curve():
    curves = {}
    recipe = dataclasses.replace(PRETRAINING, learning_rate=2e-3)
    for precision in (FP32, BF16):
        model = small_model(seed=5).train()
        optimizer = make_optimizer(model, recipe)
        losses = []
        for step in range(20):
            ids = random_ids(8, 33, seed=100 + step) % 40 + 4  # a learnable (narrow) byte distribution
            result = language_model_update(model, optimizer, ids[:, :-1], ids[:, 1:], recipe, precision=precision)
            losses.append(result.loss)
        curves[precision.name] = losses
    assert curves["fp32"][-1] < curves["fp32"][0] - 0.5  # it learns, so the comparison means something
    for a, b in zip(curves["fp32"], curves["bf16"]):
        assert abs(a - b) <= CURVE_TOLERANCE * a, (curves["fp32"], curves["bf16"])


def test_a_recipe_without_mixed_precision_stays_float32():
    model = small_model(seed=6).train()
    recipe = dataclasses.replace(PRETRAINING, mixed_precision=False)
    ids = random_ids(2, 17)
    seen = []
    original = model.blocks[0].attention.qkv.forward

    def spy(x):
        seen.append(product_dtype())
        return original(x)

    model.blocks[0].attention.qkv.forward = spy
    language_model_update(model, make_optimizer(model, recipe), ids[:, :-1], ids[:, 1:], recipe, precision=BF16)
    assert seen == [None]


def test_cached_decoding_in_bf16_gives_the_re_forward_tokens(monkeypatch):
    # The C decode kernels are float32 only; with them off every decode step takes the bf16 products too,
    # which is the path this compares with the full re-forward.
    monkeypatch.setattr(kernels, "ENABLED", False)
    model = small_model(seed=7).eval()
    prompt = random_ids(2, 8, seed=8)
    with torch.no_grad(), compute_in(BF16, "cpu"):
        cache = model.new_cache(2)
        logits = model(prompt, cache=cache).logits[:, -1]
        ids = prompt
        for _ in range(12):
            nxt = logits.argmax(-1, keepdim=True)
            full = model(ids).logits[:, -1]
            torch.testing.assert_close(logits, full, rtol=0.0, atol=LOGIT_TOLERANCE * float(full.abs().max()))
            assert torch.equal(nxt, full.argmax(-1, keepdim=True))
            ids = torch.cat([ids, nxt], 1)
            logits = model(nxt, cache=cache).logits[:, -1]


def test_labels_with_padding_still_count_only_targets():
    model = small_model(seed=9).train()
    ids = random_ids(2, 17)
    labels = ids[:, 1:].clone()
    labels[:, -4:] = IGNORE_INDEX
    result = language_model_update(model, make_optimizer(model, PRETRAINING), ids[:, :-1], labels, PRETRAINING,
                                   precision=BF16)
    assert result.tokens == 2 * 12
