"""Precision as one choice (model/precision.py): how fp32 | bf16 | auto resolve, that fp32 changes nothing,
that bf16 products really run in bf16, and that the bf16 model follows the float32 one within stated
tolerances (forward, gradients, a short training run, cached decoding)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from glm53_flash.data.batches import IGNORE_INDEX
from glm53_flash.model import GLM53Flash, ops
from glm53_flash.model.ops import experts as experts_ops
from glm53_flash.model import precision as precision_module
from glm53_flash.model.config import PRESETS
from glm53_flash.model.moe import MixtureOfExperts, dense_moe_reference, route_tokens
from glm53_flash.model.ops.experts import blocked_dtype, padded_positions
from glm53_flash.model.precision import (Precision, compute_in, cpu_bf16_flags, mixed_linear,
                                         product_dtype, resolve_precision)
from glm53_flash.train.engine import PRETRAINING, make_optimizer
from glm53_flash.train.objective import language_model_update

BF16 = Precision("bf16", "bf16", "test")
FP32 = Precision("fp32", "fp32", "test")
# bf16 keeps 8 bits of mantissa (relative rounding 2^-9 per operand): a product over a few hundred terms
# differs from float32 by about 1e-2 of its scale. The tolerances below are stated against that.
LOGIT_TOLERANCE = 0.05   # of the largest logit magnitude
LOSS_TOLERANCE = 0.01    # relative, cross-entropy of a tiny model on random bytes
CURVE_TOLERANCE = 0.02   # relative, per step of a 20-step tiny training run
GRADIENT_COSINE = 0.99   # least cosine between a bf16 and the float32 gradient of the same objective

AMX_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_tile amx_bf16\n"
PLAIN_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n"


# The tiny models and batches here have fewer rows than bf16 pays for on the CPU (precision.BF16_MIN_ROWS,
# ops.experts.BLOCKED_MIN_SLOTS); every test but the one that checks those rules runs every product in bf16, so the
# arithmetic is what it tests.
MIN_ROWS, MIN_SLOTS = precision_module.BF16_MIN_ROWS, experts_ops.BLOCKED_MIN_SLOTS


@pytest.fixture(autouse=True)
def every_product_in_bf16(monkeypatch):
    monkeypatch.setattr(precision_module, "BF16_MIN_ROWS", 1)
    monkeypatch.setattr(experts_ops, "BLOCKED_MIN_SLOTS", 1)


def small_model(seed: int = 0, context: int = 64) -> GLM53Flash:
    torch.manual_seed(seed)
    # dims that are multiples of 16, so the grouped expert path serves as it does on the flash preset
    cfg = dataclasses.replace(PRESETS["tiny"], dim=64, heads=4, expert_hidden=64, max_sequence_length=context,
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
        assert cosine > GRADIENT_COSINE, float(cosine)


def test_padded_positions_place_each_experts_rows_at_its_padded_start():
    counts = torch.tensor([2, 0, 3])
    assert padded_positions(counts, torch.tensor([0, 4, 8])).tolist() == [0, 1, 8, 9, 10]


def test_blocked_experts_serve_only_bf16_products_on_aligned_dims():
    rows = torch.randn(6, 32)
    assert blocked_dtype(rows, MixtureOfExperts(32, 32, 4, 2).expert_down) is None  # outside compute_in
    with compute_in(BF16, "cpu"):
        assert blocked_dtype(rows, MixtureOfExperts(32, 32, 4, 2).expert_down) == torch.bfloat16
        assert blocked_dtype(torch.randn(6, 36), MixtureOfExperts(36, 36, 4, 2).expert_down) is None  # bf16 rows not 16-byte


def test_blocked_bf16_experts_equal_the_chunk_loop_at_the_same_rounding_points(monkeypatch):
    # The chunk loop (grouped kernel off) rounds at the same points (rows, weights, activations to bf16)
    # without padding: padded rows that leaked into an output or a gradient would show here.
    torch.manual_seed(4)
    moe = MixtureOfExperts(32, 32, 4, 2)
    x = torch.randn(50, 32)
    results = {}
    for grouped in (True, False):
        monkeypatch.setattr(experts_ops, "GROUPED_MM_ENABLED", grouped)
        moe.zero_grad()
        xi = x.clone().requires_grad_()
        with compute_in(BF16, "cpu"):
            out, _, _ = moe(xi, with_balance=False)
        (out * torch.linspace(-1, 1, 32)).sum().backward()
        results[grouped] = [out.detach(), moe.expert_gate_up.grad.clone(), moe.expert_down.grad.clone(), xi.grad]
    for blocked, loop in zip(results[True], results[False]):
        torch.testing.assert_close(blocked, loop, rtol=2e-2, atol=2e-2 * float(loop.abs().max()))


@pytest.mark.skipif(not ops.available(), reason="the C kernels did not build")
def test_bf16_activations_between_products_give_the_cast_paths_bits(monkeypatch):
    """Inside bf16 products the experts' and the shared expert's SwiGLU take the bf16 product output and
    hand the next product bf16 (the bf16 kernel). The path it replaced widened the output to float32, ran
    the float32 kernel and rounded back: a whole training step (loss and every gradient) must be the same,
    bit for bit. The replaced path is taken by hiding the bf16 kernel."""
    from glm53_flash.model.ops import swiglu as swiglu_ops

    results, served, call = {}, swiglu_ops.swiglu_serves, swiglu_ops.library.call
    for bf16_kernel in (True, False):
        if not bf16_kernel:
            monkeypatch.setattr(swiglu_ops, "swiglu_serves", lambda h: h.dtype == torch.float32 and served(h))
        calls = []
        monkeypatch.setattr(swiglu_ops.library, "call", lambda op, *a, calls=calls: calls.append(op) or call(op, *a))
        model = small_model(seed=6).train()
        ids = random_ids(4, 33, seed=7)
        with compute_in(BF16, "cpu"):
            out = model(ids[:, :-1])
            loss = F.cross_entropy(out.logits.flatten(0, 1), ids[:, 1:].flatten()) + 0.01 * out.aux_loss
            loss.backward()
        assert ("swiglu_forward_bf16" in calls) is bf16_kernel and ("swiglu_backward_bf16" in calls) is bf16_kernel
        results[bf16_kernel] = [loss.detach()] + [p.grad for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(results[True], results[False]))


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
    monkeypatch.setattr(ops.library, "ENABLED", False)
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


def _weight_products(model):
    for block in model.blocks:
        yield from (block.attention.qkv.weight, block.attention.out.weight, block.moe.expert_gate_up,
                    block.moe.expert_down, block.moe.shared.up.weight, block.moe.shared.down.weight)


def _decode(model, prompt, precision, steps=6):
    """Greedy logits of `steps` cached decode steps after a float32 prefill (the steps alone in `precision`)."""
    with torch.no_grad():
        cache = model.new_cache(prompt.shape[0])
        logits = model(prompt, cache=cache).logits[:, -1]
        out = []
        for _ in range(steps):
            with compute_in(precision, "cpu"):
                logits = model(logits.argmax(-1, keepdim=True), cache=cache).logits[:, -1]
            out.append(logits)
    return torch.stack(out)


@pytest.mark.skipif(not ops.available(), reason="no C kernels on this machine")
def test_cached_decoding_in_bf16_reads_bf16_weights_and_follows_their_updates(monkeypatch):
    """With the C kernels, a bf16 decode step runs each block on bf16 copies of its weight products'
    weights (half the bytes; float32 arithmetic): on weights that bf16 holds exactly it equals the
    float32 step bit for bit, so nothing but the weights' rounding differs. The copies follow an
    in-place change of the weights (an optimiser step), and on weights bf16 cannot hold the steps differ."""
    monkeypatch.setattr(precision_module, "BF16_MIN_ROWS", 256)  # the real rule: two rows' head stays float32
    monkeypatch.setattr(experts_ops, "BLOCKED_MIN_SLOTS", 1024)
    model = small_model(seed=7).eval()
    with torch.no_grad():
        for weight in _weight_products(model):
            weight.copy_(weight.bfloat16().float())
    prompt = random_ids(2, 8, seed=8)
    dtypes = []
    original = ops.DecodeStack._step  # both step and step_with_head
    monkeypatch.setattr(ops.DecodeStack, "_step", lambda stack, *a: dtypes.append(
        torch.bfloat16 if stack.bf16 else torch.float32) or original(stack, *a))
    fast = _decode(model, prompt, BF16)
    assert set(dtypes) == {torch.bfloat16} and len(dtypes) == 6  # every step, all blocks in one call
    dtypes.clear()
    assert torch.equal(fast, _decode(model, prompt, None)) and set(dtypes) == {torch.float32}
    with torch.no_grad():  # an update in place, as AdamW makes it: the next bf16 step must read it
        model.blocks[0].moe.expert_down.mul_(-2.0)
        model.blocks[-1].attention.qkv.weight.mul_(0.5)
    updated = _decode(model, prompt, BF16)
    assert torch.equal(updated, _decode(model, prompt, None)) and not torch.equal(updated, fast)
    # a parameter set anew (not changed in place): the next bf16 step reads the new one
    replaced = model.blocks[1].attention.out.weight.detach().flip(0).clone()
    model.blocks[1].attention.out.weight = torch.nn.Parameter(replaced)
    swapped = _decode(model, prompt, BF16)
    assert torch.equal(swapped, _decode(model, prompt, None)) and not torch.equal(swapped, updated)
    with torch.no_grad():
        for weight in _weight_products(model):
            weight.add_(1e-3 * torch.randn_like(weight))
    assert not torch.equal(_decode(model, prompt, BF16), _decode(model, prompt, None))


def test_labels_with_padding_still_count_only_targets():
    model = small_model(seed=9).train()
    ids = random_ids(2, 17)
    labels = ids[:, 1:].clone()
    labels[:, -4:] = IGNORE_INDEX
    result = language_model_update(model, make_optimizer(model, PRETRAINING), ids[:, :-1], labels, PRETRAINING,
                                   precision=BF16)
    assert result.tokens == 2 * 12


# ---------------------------------------------------------------------------- RL, evaluation, generation


def _spy_products(model, seen: list) -> None:
    """Record the product dtype every call of the first attention's input projection runs under."""
    original = model.blocks[0].attention.qkv.forward

    def spy(x):
        seen.append(product_dtype())
        return original(x)

    model.blocks[0].attention.qkv.forward = spy


def test_rl_log_probs_in_bf16_follow_fp32_on_both_paths():
    from glm53_flash.train.rl import sequence_logprobs

    model = small_model(seed=10).train()
    prompt = [1] + [int(t) for t in random_ids(1, 11, seed=11)[0]]
    sequences = [(prompt, [int(t) for t in random_ids(1, n, seed=20 + n)[0]]) for n in (3, 7, 9)]

    def gradient(logprobs) -> torch.Tensor:
        model.zero_grad()
        (-sum(x.sum() for x in logprobs)).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    fp32, _ = sequence_logprobs(model, sequences, 0.8, "sampler", "cpu", precision=FP32)
    reference = gradient(fp32)
    seen: list = []
    _spy_products(model, seen)
    for share in (True, False):
        bf16, _ = sequence_logprobs(model, sequences, 0.8, "sampler", "cpu", share_prompts=share, precision=BF16)
        for a, b in zip(fp32, bf16):
            assert not torch.equal(a, b)  # bf16 products really ran
            torch.testing.assert_close(b, a, rtol=0.0, atol=LOGIT_TOLERANCE * 2)
        mixed = gradient(bf16)  # the policy gradient through the bf16 products points where float32's does
        assert torch.isfinite(mixed).all() and F.cosine_similarity(mixed, reference, dim=0) > GRADIENT_COSINE
    assert seen and set(seen) == {torch.bfloat16}


def test_rl_runs_in_the_chosen_precision_and_its_receipt_says_so(tmp_path):
    from glm53_flash.evaluation.sampling import SamplingSettings, generate
    from glm53_flash.train.checkpoint import save_checkpoint
    from glm53_flash.train.rl_run import RLConfig, train_rl
    from glm53_flash.train.rl_run import RLTrainer

    start = tmp_path / "checkpoint-0000"
    save_checkpoint(start, small_model(seed=12, context=128), {"stage": "test"})

    def config(name, precision, **kw):
        return RLConfig(initial_checkpoint=str(start), output=str(tmp_path / name), groups=2, checkpoints=(),
                        group_size=4, max_new_tokens=8, temperature=1.0, learning_rate=1e-3, device="cpu",
                        quiet=True, verifier_workers=1, families="increment,double", precision=precision, **kw)

    receipts = {name: train_rl(config(name, name if name != "default" else None)) for name in ("default", "bf16")}
    assert receipts["default"]["precision"]["requested"] == "default"
    assert receipts["default"]["precision"]["name"] == "fp32"
    assert receipts["bf16"]["precision"]["name"] == "bf16" and receipts["bf16"]["run_config"]["precision"] == "bf16"
    # One update on a group with a reward spread (a random model's rollouts earn none), in each precision
    weights = {}
    for name in ("default", "fp32", "bf16"):
        trainer = RLTrainer(config(f"update-{name}", name if name != "default" else None))
        trainer.prepare()
        seen: list = []
        _spy_products(trainer.model, seen)
        task = trainer.tasks[0]
        completions = generate(trainer.model, [task.prompt], SamplingSettings(samples=4, max_new_tokens=8, temperature=1.0,
                                                                              seed=1, precision=trainer.precision))[0]
        group = {"group": 1, "task": task, "completions": completions, "evaluations": [], "rewards": [1, 0, 0, 0]}
        assert trainer.update([group], lr=1e-3)["loss"] is not None
        assert set(seen) == {torch.bfloat16 if name == "bf16" else None}  # rollouts' prefill and the update
        weights[name] = [p.detach().clone() for p in trainer.model.parameters()]
    # fp32 stays bit-reproducible (the explicit choice is the CPU's default); bf16 trained too (its
    # gradient against float32's: test_rl_log_probs_in_bf16_follow_fp32_on_both_paths)
    assert all(torch.equal(a, b) for a, b in zip(weights["default"], weights["fp32"]))
    initial = list(small_model(seed=12, context=128).parameters())
    assert any(not torch.equal(a, b) for a, b in zip(initial, weights["bf16"]))


def test_evaluation_and_generation_take_the_precision_and_record_it():
    from glm53_flash.evaluation import ledger
    from glm53_flash.evaluation.evaluate import evaluate_greedy
    from glm53_flash.evaluation.sampling import SamplingSettings, generate
    from glm53_flash.tasks import frozen_tasks

    model = small_model(seed=13, context=128).eval()
    seen: list = []
    _spy_products(model, seen)
    generate(model, ["def f(x):"], SamplingSettings(max_new_tokens=3, precision=BF16))
    assert seen[0] == torch.bfloat16  # the prefill (decode steps run the C kernels on bf16 weights: DECODE_NOTE)
    tasks = frozen_tasks("dev", 1, ("increment",))
    chosen = evaluate_greedy(model, tasks, max_new_tokens=4, precision="bf16")
    default = evaluate_greedy(model, tasks, max_new_tokens=4)
    assert chosen["inference"]["precision"] == "bf16" and chosen["precision"]["name"] == "bf16"
    assert "precision" not in default["inference"] and default["precision"]["requested"] == "default"
    # a sealed evaluation's identity: unchanged for the default (earlier plans), different for a choice
    common = dict(checkpoint_sha256="w", split="confirm", task_ids=["a"], samples=1, seed=1, temperature=None,
                  top_k=None, top_p=None, max_new_tokens=4, stop="parse")
    from glm53_flash.core.receipts import sha256_json
    assert ledger.evaluation_plan_sha256(**common) == sha256_json({"command": "glm53 eval", **common})
    assert ledger.evaluation_plan_sha256(**common, precision="bf16") != ledger.evaluation_plan_sha256(**common)


def test_products_too_small_to_pay_for_bf16_stay_float32(monkeypatch):
    monkeypatch.setattr(precision_module, "BF16_MIN_ROWS", MIN_ROWS)
    monkeypatch.setattr(experts_ops, "BLOCKED_MIN_SLOTS", MIN_SLOTS)
    weight = torch.randn(24, 16)
    moe = MixtureOfExperts(32, 32, 4, 2)
    with compute_in(BF16, "cpu"):
        for rows in (1, MIN_ROWS - 1):
            x = torch.randn(rows, 16)
            assert torch.equal(mixed_linear(x, weight), F.linear(x, weight))  # float32 itself, bit for bit
        x = torch.randn(2, MIN_ROWS // 2, 16)  # the rows of every leading dim count
        rounded = F.linear(x.bfloat16(), weight.bfloat16()).float()
        assert torch.equal(mixed_linear(x, weight), rounded)
        assert blocked_dtype(torch.randn(MIN_SLOTS - 1, 32), moe.expert_down) is None
        assert blocked_dtype(torch.randn(MIN_SLOTS, 32), moe.expert_down) == torch.bfloat16


def test_linear_attention_blocks_in_bf16_follow_fp32_and_take_bf16_only_with_enough_positions(monkeypatch):
    from glm53_flash.model import linear_attention as la

    monkeypatch.setattr(precision_module, "BF16_MIN_ROWS", MIN_ROWS)
    torch.manual_seed(3)
    q, k, v = (ops.feature_map(torch.randn(2, 3, MIN_ROWS // 2, 16)).requires_grad_() for _ in range(3))
    assert ops.block_dtype(q) is None  # outside compute_in: float32, the committed results' arithmetic
    with compute_in(BF16, "cpu"):
        assert ops.block_dtype(q) == torch.bfloat16  # batch x length = MIN_ROWS positions
        assert ops.block_dtype(q[:1]) is None and ops.block_dtype(q[:, :, :-1]) is None  # heads do not count
    # The bf16 block is its two products and the denominator's sum, each rounded once ...
    numerator, denominator = ops.masked_block(q, k, v, torch.bfloat16)
    scores = torch.matmul(q.bfloat16(), k.bfloat16().transpose(-1, -2)).tril()
    assert numerator.dtype == denominator.dtype == torch.float32
    assert torch.equal(numerator, torch.matmul(scores, v.bfloat16()).float())
    assert torch.equal(denominator, denominator.bfloat16().float())  # rounded to bf16 ...
    torch.testing.assert_close(denominator, scores.float().sum(-1), rtol=2**-8, atol=0)  # ... once, from the sum
    # ... and follows the float32 block (whole sequence and chunked, with a state) within bf16's rounding.
    reference, _ = la.recurrent_linear_attention(q, k, v)
    out_of = {}
    for name, precision in (("fp32", FP32), ("bf16", BF16)):
        with compute_in(precision, "cpu"):
            whole, _ = la.causal_linear_attention(q, k, v, chunk=MIN_ROWS)
            chunked, state = la.causal_linear_attention(q, k, v, chunk=16, return_state=True)
        grads = torch.autograd.grad((whole * reference.detach()).sum() + chunked.square().sum(), (q, k, v))
        out_of[name] = (whole, chunked, grads)
        assert torch.allclose(state.kv, torch.matmul(k.transpose(-1, -2), v), rtol=1e-5, atol=1e-4)  # float32
    for fp32_value, bf16_value in zip(out_of["fp32"][:2], out_of["bf16"][:2]):
        assert torch.allclose(fp32_value, reference, rtol=1e-4, atol=1e-5)
        error = (bf16_value - fp32_value).abs().max() / fp32_value.abs().max()
        assert 0 < error < 0.02  # rounded, and within bf16's 2^-9 per operand summed over 64 positions
    for fp32_grad, bf16_grad in zip(out_of["fp32"][2], out_of["bf16"][2]):
        assert F.cosine_similarity(fp32_grad.flatten(), bf16_grad.flatten(), dim=0) > GRADIENT_COSINE


def test_routed_blocked_gives_the_gather_blocked_scatter_results_forward_and_backward():
    # routed_blocked (one gather in, one gather out) against run_blocked between forward's gather and its
    # scatter back to token order: the same bits, output and every gradient, padding rows included.
    torch.manual_seed(5)
    moe = MixtureOfExperts(32, 32, 4, 2)
    x = torch.randn(70, 32)
    results = []
    for fused in (True, False):
        moe.zero_grad()
        xi = x.clone().requires_grad_()
        with compute_in(BF16, "cpu"):
            gates, top_index = route_tokens(moe.router(xi), moe.top_k)
            flat_expert = top_index.reshape(-1)
            order = torch.argsort(flat_expert, stable=True)
            counts = torch.bincount(flat_expert, minlength=moe.experts)
            if fused:
                routed = experts_ops.routed_blocked(xi, order, counts, gates, moe.expert_gate_up, moe.expert_down,
                                                    torch.bfloat16)
            else:
                expert_out = experts_ops.run_blocked(xi.index_select(0, order // moe.top_k), counts, moe.expert_gate_up,
                                                     moe.expert_down, torch.bfloat16)
                slot_out = torch.empty_like(expert_out).index_copy_(0, order, expert_out)
                routed = (slot_out.view(70, 2, 32) * gates.unsqueeze(-1)).sum(1)
        (routed * torch.linspace(-1, 1, 32)).sum().backward()
        results.append([routed.detach(), xi.grad, moe.router.weight.grad.clone(), moe.expert_gate_up.grad.clone(),
                        moe.expert_down.grad.clone()])
    assert int(counts.min()) > 0 and bool((counts % experts_ops.PRODUCT_BLOCK != 0).all())  # padding rows exist
    fused, plain = results
    # the output and the experts' gradients bit for bit; the gates' gradients (into x and the router) are
    # float32 sums over D in the combine kernel's order, so within float32 rounding
    for index in (0, 3, 4):
        assert torch.equal(fused[index], plain[index])
    for index in (1, 2):
        torch.testing.assert_close(fused[index], plain[index], rtol=1e-5, atol=1e-6 * float(plain[index].abs().max()))
    with compute_in(BF16, "cpu"):  # and the layer takes it
        assert torch.equal(moe(x, with_balance=False)[0], moe.shared(x) + results[0][0])
