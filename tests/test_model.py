import dataclasses

import pytest
import torch

import glm53_flash as g
from glm53_flash.model import ops
from glm53_flash.model.ops import experts as experts_ops
from glm53_flash.model.linear_attention import LinearState, causal_linear_attention, recurrent_linear_attention
from glm53_flash.model.moe import MixtureOfExperts, dense_moe_reference
from glm53_flash.model.ops.linear_attention import feature_map, reference_feature_map
from glm53_flash.model.ops.swiglu import _SwiGLUActivation
from glm53_flash.model.sparse_attention import SparseAttention, sparse_mask
from glm53_flash.model.streams import sinkhorn

TINY = g.ModelConfig.preset("tiny")


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return g.GLM53Flash(TINY.replace(**overrides)).eval()


def test_parameter_counts():
    assert g.GLM53Flash(g.ModelConfig()).parameter_counts() == {"total": 25_730_592, "active": 9_805_344}
    assert g.GLM53Flash(g.ModelConfig.preset("research-mini")).parameter_counts()["total"] == 248_412
    assert g.GLM53Flash(g.ModelConfig.preset("study")).parameter_counts()["total"] == 2_167_040  # the studies' model
    assert g.ModelConfig() == g.ModelConfig.preset("flash")


def test_layer_pattern():
    model = g.GLM53Flash(g.ModelConfig())
    sparse = [i for i, b in enumerate(model.blocks) if isinstance(b.attention, SparseAttention)]
    assert sparse == [3, 7, 11]
    assert g.ModelConfig().attention_pattern.count("linear") == 9


def test_config_validation_and_round_trip():
    with pytest.raises(ValueError, match="multiple of heads"):
        g.ModelConfig(dim=100, heads=6)
    with pytest.raises(ValueError, match="unknown preset"):
        g.ModelConfig.preset("huge")
    cfg = g.ModelConfig.preset("research-mini")
    assert g.ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.dim = 3


def test_research_mini_sees_the_order_of_its_prefix():
    # research-mini has no sparse layer, so RoPE in its linear layers is its only positional signal:
    # with it, shuffling the prefix changes the last position's logits (a plain linear-attention layer
    # sums over its prefix and could not tell).
    cfg = g.ModelConfig.preset("research-mini", layers=1)
    assert cfg.linear_rope == "rope-before-feature-map" and cfg.attention_pattern == ["linear"]
    torch.manual_seed(0)
    ids = torch.randint(4, 260, (1, 24))
    shuffled = ids.clone()
    shuffled[0, :-1] = ids[0, :-1][torch.randperm(23)]
    assert not torch.equal(shuffled, ids) and torch.equal(shuffled[0, -1], ids[0, -1])
    for linear_rope, order_matters in (("rope-before-feature-map", True), ("none", False)):
        torch.manual_seed(1)
        model = g.GLM53Flash(cfg.replace(linear_rope=linear_rope)).eval()
        with torch.no_grad():
            a, b = model(ids).logits[0, -1], model(shuffled).logits[0, -1]
        assert (not torch.allclose(a, b, atol=1e-4, rtol=0)) == order_matters, linear_rope


@pytest.mark.parametrize("mode", ["delta", "double-residual", "sinkhorn"])
def test_causality(mode):
    model = tiny_model(stream_mode=mode)
    ids = torch.randint(4, 260, (2, 40))
    changed = ids.clone()
    changed[:, 25:] = torch.randint(4, 260, (2, 15))
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    assert a.shape == (2, 40, 260)
    torch.testing.assert_close(a[:, :25], b[:, :25], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a[:, 25:], b[:, 25:])


@pytest.mark.parametrize("t,chunk", [(1, 4), (7, 16), (16, 16), (37, 8), (64, 16)])
def test_linear_attention_forms_equal_recurrence(t, chunk):
    torch.manual_seed(t)
    q, k, v = (torch.randn(2, 3, t, 8, dtype=torch.float64) for _ in range(3))
    q, k = feature_map(q), feature_map(k)
    expected, expected_state = recurrent_linear_attention(q, k, v)
    out, state = causal_linear_attention(q, k, v, chunk=chunk, return_state=True)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(state.kv, expected_state.kv)
    torch.testing.assert_close(state.z, expected_state.z)
    # continuing from a state equals running the recurrence from that state
    q2, k2, v2 = (feature_map(torch.randn(2, 3, 5, 8, dtype=torch.float64)) for _ in range(3))
    cont, _ = causal_linear_attention(q2, k2, v2, state=state, chunk=chunk)
    torch.testing.assert_close(cont, recurrent_linear_attention(q2, k2, v2, expected_state)[0])


@pytest.mark.parametrize("grad", [False, True])
def test_linear_attention_decode_step_equals_recurrence(grad):
    """One token on a cached state: without gradients the state is updated in place, with them a new
    one is made (the old state stays as it was); both equal the recurrence."""
    torch.manual_seed(4)
    q, k, v = (torch.randn(2, 3, 6, 8, dtype=torch.float64) for _ in range(3))
    q, k = feature_map(q), feature_map(k)
    _, state = causal_linear_attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], return_state=True)
    before = (state.kv.clone(), state.z.clone())
    expected, expected_state = recurrent_linear_attention(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:],
                                                          LinearState(*before))
    with torch.set_grad_enabled(grad):
        out, new_state = causal_linear_attention(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], state=state,
                                                 return_state=True)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(new_state.kv, expected_state.kv)
    torch.testing.assert_close(new_state.z, expected_state.z)
    assert (new_state.kv is state.kv) is not grad
    if grad:
        torch.testing.assert_close(state.kv, before[0])


def gathered_sparse_reference(q, k, v, window, stride):
    """The original's formulation: per query, gather anchors + window keys, softmax over them."""
    b, h, t, d = q.shape
    out = torch.zeros_like(q)
    for i in range(t):
        keys = sorted(set(range(0, i + 1, stride)) | set(range(max(0, i - window + 1), i + 1)))
        scores = torch.einsum("bhd,bhnd->bhn", q[:, :, i], k[:, :, keys]) * d ** -0.5
        out[:, :, i] = torch.einsum("bhn,bhnd->bhd", scores.softmax(-1), v[:, :, keys])
    return out


def test_sparse_mask_matches_gathered_reference():
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 2, 50, 8, dtype=torch.float64) for _ in range(3))
    mask = sparse_mask(range(50), range(50), 8, 8)
    fast = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(fast, gathered_sparse_reference(q, k, v, 8, 8))
    # row widths as in the original: 35 keys at T=128 and 37 at T=192 with window = stride = 32
    assert int(sparse_mask(range(128), range(128), 32, 32).sum(1).max()) == 35
    assert int(sparse_mask(range(192), range(192), 32, 32).sum(1).max()) == 37


def test_sparse_mask_is_cached_per_length():
    layer = SparseAttention(16, 2, 4, 4)
    rope = g.GLM53Flash(TINY).rope
    layer(torch.randn(1, 10, 16), rope)
    mask = next(iter(layer._masks.values()))
    layer(torch.randn(3, 10, 16), rope)
    assert len(layer._masks) == 1 and next(iter(layer._masks.values())) is mask


def test_sparse_caches_are_bounded_and_kept_per_inference_mode(monkeypatch):
    """A mask made under inference_mode (the sampler's) is not reused in a forward that autograd records
    (it could not be saved for the backward), and the caches never hold more than CACHED_SHAPES shapes."""
    from glm53_flash.model import sparse_attention

    layer = SparseAttention(16, 2, 4, 4)
    rope = g.GLM53Flash(TINY).rope
    x = torch.randn(2, 6, 16, requires_grad=True)
    with torch.inference_mode():
        layer(x.detach(), rope)
    out, _ = layer(x, rope)
    out.sum().backward()  # would raise if the inference-mode mask had been reused
    assert len(layer._masks) == 2 and x.grad is not None
    monkeypatch.setattr(sparse_attention, "CACHED_SHAPES", 3)
    with torch.no_grad():
        for length in range(1, 9):
            layer(torch.randn(1, length, 16), rope)
            assert len(layer._masks) <= 3
    assert (0, 8, 8, torch.device("cpu"), False) in layer._masks  # the newest shape is kept


@pytest.mark.parametrize("window,stride,prompt", [(4, 3, 5), (4, 4, 1), (1, 2, 3), (6, 2, 2)])
def test_sparse_decode_step_in_place_equals_the_full_forward_and_the_copying_step(window, stride, prompt):
    """Without gradients a one-token step reuses the cached buffers (keys move into the slot of the key
    that left the window); with gradients each step copies the kept keys. Both equal the full forward,
    step by step, and keep exactly the keys a later query can reach."""
    from glm53_flash.model.sparse_attention import reachable_positions

    torch.manual_seed(21)
    layer = SparseAttention(16, 2, window, stride).double()
    rope = g.GLM53Flash(TINY).rope
    x = torch.randn(2, 24, 16, dtype=torch.float64)
    full, _ = layer(x, rope)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            _, state = layer(x[:, :prompt], rope, 0, None, True)
            for t in range(prompt, x.shape[1]):
                before = state
                out, state = layer(x[:, t:t + 1], rope, t, state, True)
                torch.testing.assert_close(out[:, 0], full[:, t])
                assert (state.room is not None) == (not grad)
                if not grad and before.room is not None and before.room[0].shape[2] > len(before.positions):
                    assert state.room[0] is before.room[0]  # room was left: no copy of the kept keys
                everything = tuple(range(t + 1))
                assert sorted(state.positions) == [everything[i] for i in
                                                   reachable_positions(everything, t + 1, window, stride)]
                order = torch.tensor(state.positions)
                _, reference = layer(x[:, :t + 1], rope, 0, None, True)
                torch.testing.assert_close(state.k, reference.k[:, :, order.argsort().argsort()])


def test_sorted_moe_dispatch_equals_dense_reference():
    torch.manual_seed(2)
    moe = MixtureOfExperts(16, 24, experts=4, top_k=2).double()
    x = torch.randn(50, 16, dtype=torch.float64)
    out, used, _ = moe(x)
    torch.testing.assert_close(out, dense_moe_reference(moe, x))
    assert used.sum() == 100


@pytest.mark.skipif(not hasattr(torch.nn.functional, "grouped_mm"), reason="torch without grouped_mm")
def test_grouped_expert_kernel_equals_chunk_loop_forward_and_backward(monkeypatch):
    torch.manual_seed(3)
    moe = MixtureOfExperts(16, 24, experts=4, top_k=2)
    with torch.no_grad():  # one expert idle: its gradient must be zero on both paths
        moe.router.weight[3] = -10.0
    x = torch.rand(40, 16) + 0.1  # positive inputs: expert 3's logit is the lowest for every token
    results = []
    for grouped in (True, False):
        monkeypatch.setattr(experts_ops, "GROUPED_MM_ENABLED", grouped)
        assert experts_ops.grouped_mm_usable(x, moe.expert_gate_up, moe.expert_down) is grouped
        moe.zero_grad()
        xi = x.clone().requires_grad_()
        out, used, balance = moe(xi)
        (out.pow(2).sum() + balance).backward()
        results.append((out, xi.grad, moe.expert_gate_up.grad.clone(), moe.expert_down.grad.clone()))
    assert results[0][2][3].abs().max() == 0
    for fast, loop in zip(*results):
        torch.testing.assert_close(fast, loop, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(results[0][0], dense_moe_reference(moe, x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tokens", [1, 3, 40, 256, 300])
def test_padded_expert_path_equals_grouped_path_and_dense_reference(monkeypatch, tokens):
    """Without gradients and with few slots spread over the experts, the experts run as two batched
    matmuls over rows padded to the busiest expert; the result equals the grouped kernel (or chunk
    loop) and the dense oracle, with an idle expert, and on both sides of the threshold (300 tokens
    x 2 = 600 slots take the grouped path either way)."""
    torch.manual_seed(5)
    moe = MixtureOfExperts(16, 24, experts=4, top_k=2)
    with torch.no_grad():
        moe.router.weight[3] = -10.0  # expert 3 idle for positive inputs
    x = torch.rand(tokens, 16) + 0.1
    taken = []
    original = experts_ops.run_padded

    def spy(rows, counts, gate_up, down, capacity):
        taken.append(capacity)
        return original(rows, counts, gate_up, down, capacity)

    monkeypatch.setattr(experts_ops, "run_padded", spy)
    monkeypatch.setattr(ops.library, "ENABLED", False)  # the CPU kernels come first where they serve
    outputs = []
    with torch.inference_mode():
        for padded in (True, False):
            monkeypatch.setattr(experts_ops, "PADDED_ENABLED", padded)
            outputs.append(moe(x, with_balance=False)[0])
        reference = dense_moe_reference(moe, x)
        counts = moe(x, with_balance=False)[1]
    expected = 2 * tokens <= experts_ops.PADDED_MAX_ROWS and experts_ops.padding_pays(4, int(counts.max()), 2 * tokens)
    assert bool(taken) is expected and (expected or tokens >= 40)  # the small cases do take it
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outputs[0], reference, atol=1e-5, rtol=1e-5)


def test_padding_is_taken_only_while_it_pays():
    assert experts_ops.padding_pays(8, 4, 32)  # decode: 32 slots spread over 8 experts
    assert experts_ops.padding_pays(8, 9, 32)
    assert not experts_ops.padding_pays(8, 16, 32)  # identical rows: two experts take everything
    assert experts_ops.padding_pays(8, 48, 384) and not experts_ops.padding_pays(8, 65, 512)
    assert not experts_ops.padding_pays(8, 64, 128)


def test_padded_expert_path_with_every_slot_on_one_expert(monkeypatch):
    torch.manual_seed(6)
    moe = MixtureOfExperts(16, 24, experts=4, top_k=1)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[2] = 10.0  # every token picks expert 2: capacity = all rows, others empty
    x = torch.rand(3, 16) + 0.1
    monkeypatch.setattr(ops.library, "ENABLED", False)
    with torch.inference_mode():
        assert experts_ops.padded_usable(x, 3) and experts_ops.padding_pays(4, 3, 3)
        out, counts, _ = moe(x, with_balance=False)
        assert counts.tolist() == [0, 0, 3, 0]
        torch.testing.assert_close(out, dense_moe_reference(moe, x), atol=1e-5, rtol=1e-5)
    assert not experts_ops.padded_usable(x, 3)  # gradients on: the grouped kernel (it has a backward)


@pytest.mark.slow
def test_the_model_traces_under_torch_compile_and_equals_eager():
    """`--compile` works: under compile the experts take the chunk loop (the grouped kernel's tracing
    rule wants bf16), and the traced model's logits and gradients equal eager's. Dynamo's own
    backend keeps the test fast; inductor compiles the same graphs."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = g.GLM53Flash(g.ModelConfig.preset("tiny"))
    ids = torch.randint(0, 256, (2, 40))
    results = []
    for run in (model, torch.compile(model, backend="eager")):
        model.zero_grad()
        logits = run(ids).logits
        logits.pow(2).mean().backward()
        results.append((logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=1e-5)
    assert len(results[0][1]) == len(results[1][1])
    for eager, traced in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(eager, traced, atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()


def test_fused_activation_gradients_equal_formulas():
    torch.manual_seed(4)
    h = torch.randn(9, 12, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_SwiGLUActivation.apply, (h,))
    gate, value = h.chunk(2, dim=-1)
    torch.testing.assert_close(_SwiGLUActivation.apply(h), torch.nn.functional.silu(gate) * value)
    u = torch.randn(200, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(feature_map, (u,))
    grad_fast, = torch.autograd.grad(feature_map(u).pow(2).sum(), u)
    grad_plain, = torch.autograd.grad(reference_feature_map(u).pow(2).sum(), u)
    torch.testing.assert_close(grad_fast, grad_plain)


def test_router_gets_gradients_from_balance_loss():
    model = tiny_model().train()
    out = model(torch.randint(4, 260, (2, 20)))
    out.aux_loss.backward()
    for block in model.blocks:
        grad = block.moe.router.weight.grad
        assert grad is not None and grad.abs().sum() > 0


def test_original_balance_metric_has_no_gradient():
    model = tiny_model(balance_loss="hard-count").train()
    out = model(torch.randint(4, 260, (2, 20)))
    assert not out.aux_loss.requires_grad
    torch.testing.assert_close(out.usage.sum(-1), torch.ones(TINY.layers))


def test_padding_excluded_from_balance_statistics():
    model = tiny_model()
    ids = torch.randint(4, 260, (1, 12))
    padded = torch.cat([ids, torch.zeros(1, 20, dtype=torch.long)], 1)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).usage, model(padded).usage)


def test_sinkhorn_is_doubly_stochastic():
    m = sinkhorn(torch.randn(4, 4) * 3, iterations=50)
    torch.testing.assert_close(m.sum(0), torch.ones(4), atol=1e-4, rtol=0)
    torch.testing.assert_close(m.sum(1), torch.ones(4), atol=1e-4, rtol=0)


def cached_logits(model, ids, splits):
    cache = model.new_cache(ids.shape[0])
    parts, start = [], 0
    for end in splits:
        parts.append(model(ids[:, start:end], cache=cache).logits)
        start = end
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize("mode,rope", [("delta", "none"), ("double-residual", "rope-before-feature-map"), ("sinkhorn", "none")])
@pytest.mark.parametrize("prefill", [1, 20])
def test_cached_decode_equals_full_forward(mode, rope, prefill):
    model = tiny_model(stream_mode=mode, linear_rope=rope)
    length = TINY.max_sequence_length  # beyond window, stride and the linear chunk
    ids = torch.randint(4, 260, (3, length))
    splits = list(range(prefill, length + 1))
    with torch.no_grad():
        full = model(ids).logits
        cached = cached_logits(model, ids, splits)
    assert (full - cached).abs().max().item() <= 1e-4


def test_cached_decode_multi_token_steps_and_rows_independent():
    model = tiny_model()
    ids = torch.randint(4, 260, (4, 50))
    with torch.no_grad():
        full = model(ids).logits
        cached = cached_logits(model, ids, [9, 10, 23, 24, 31, 50])
        single = cached_logits(model, ids[2:3], [9, 10, 23, 24, 31, 50])
    assert (full - cached).abs().max().item() <= 1e-4
    assert (cached[2:3] - single).abs().max().item() <= 1e-4


def test_flash_cached_decode_matches_at_full_length():
    torch.manual_seed(3)
    model = g.GLM53Flash(g.ModelConfig()).eval()
    ids = torch.randint(4, 260, (1, 192))
    with torch.no_grad():
        full = model(ids).logits
        cached = cached_logits(model, ids, [64] + list(range(65, 193)))
    assert (full - cached).abs().max().item() <= 1e-4


def test_bad_inputs():
    model = tiny_model()
    cases = [
        (torch.tensor([[1, 260]]), "ids must lie in \\[0, 260\\)"),
        (torch.tensor([[-1, 5]]), "ids must lie in"),
        (torch.ones(1, 193, dtype=torch.long), "exceeds max_sequence_length 192"),
        (torch.ones(2, 3), "integer dtype"),
        (torch.ones(5, dtype=torch.long), "rank 1"),
        ([[1, 2]], "must be a torch.Tensor"),
        (torch.ones(1, 0, dtype=torch.long), "at least one position"),
    ]
    for ids, message in cases:
        with pytest.raises(ValueError, match=message):
            model(ids)
    cache = model.new_cache(2)
    model(torch.ones(2, 188, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="cache already holds 188"):
        model(torch.ones(2, 5, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="cache was made for batch size 2"):
        model(torch.ones(3, 1, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="batch_size"):
        model.new_cache(0)


def test_cache_keep_rows_drops_finished_sequences():
    model = tiny_model()
    ids = torch.randint(4, 260, (4, 30))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache(4)
        model(ids[:, :20], cache=cache)
        cache.keep_rows(torch.tensor([1, 3]))
        rest = model(ids[[1, 3], 20:], cache=cache).logits
    assert cache.batch_size == 2
    assert (full[[1, 3], 20:] - rest).abs().max().item() <= 1e-4


@dataclasses.dataclass
class _DenseKV:
    k: torch.Tensor
    v: torch.Tensor

    def keep_rows(self, rows):
        return _DenseKV(self.k[rows], self.v[rows])


class _DenseAttention(torch.nn.Module):
    """A kind the package does not have (causal softmax over every earlier key): the attention interface
    and nothing else, as a new kind's file would hold it."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.out = torch.nn.Linear(dim, dim, bias=False)

    @classmethod
    def from_config(cls, cfg):
        return cls(cfg.dim, cfg.heads)

    def forward(self, x, rope, position=0, state=None, return_state=False):
        b, t, dim = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        q, k = rope(q, position), rope(k, position)
        if state is not None:
            k, v = torch.cat((state.k, k), 2), torch.cat((state.v, v), 2)
        mask = torch.ones(t, k.shape[2], dtype=torch.bool).tril(k.shape[2] - t)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(out.transpose(1, 2).reshape(b, t, dim)), (_DenseKV(k, v) if return_state else None)


def test_a_new_attention_kind_is_its_layer_and_one_registry_line(monkeypatch):
    """docs/ARCHITECTURE.md's promise: a kind's layer (from_config, the call, its state's keep_rows) and its
    name in lm.ATTENTION are all a model needs. Blocks, caches and cached decoding take it as they are (the
    one-call C step leaves a model with a kind it has no step for to the blocks)."""
    from glm53_flash.model import lm

    monkeypatch.setitem(lm.ATTENTION, "dense", _DenseAttention.from_config)
    monkeypatch.setattr(g.ModelConfig, "attention_pattern",
                        property(lambda cfg: ["linear", "dense", "linear", "sparse"][: cfg.layers]))
    model = tiny_model(seed=3)
    assert [type(block.attention) for block in model.blocks][:2] == [lm.LinearAttention, _DenseAttention]
    ids = torch.randint(4, 260, (4, 30))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache(4)
        parts = [model(ids[:, :20], cache=cache).logits]
        parts += [model(ids[:, t:t + 1], cache=cache).logits for t in range(20, 24)]
        cache.keep_rows(torch.tensor([1, 3]))
        rest = model(ids[[1, 3], 24:], cache=cache).logits
    assert (torch.cat(parts, 1) - full[:, :24]).abs().max().item() <= 1e-4
    assert (rest - full[[1, 3], 24:]).abs().max().item() <= 1e-4


def test_fused_rms_norm_equals_reference():
    from glm53_flash.model.norm import RMSNorm, rms_norm_reference

    norm = RMSNorm(16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 16) * 7
    with torch.no_grad():  # the fused path
        torch.testing.assert_close(norm(x), rms_norm_reference(x, norm.weight, norm.eps))
    torch.testing.assert_close(norm(x.double()), rms_norm_reference(x.double(), norm.weight, norm.eps))


def test_option_values_are_named_by_behaviour_and_old_spellings_are_refused():
    """The values once spelled "original" are named by what they do; the old spellings were migrated
    out of every committed file and are now refused like any unknown value."""
    import pytest

    from glm53_flash.model.config import BALANCE_LOSS_MODES, LINEAR_ROPE_MODES, STREAM_MODES, ModelConfig
    from glm53_flash.train.rl import EOS_HANDLING, LOGPROB_SOURCES, RLConfig

    for choices in (STREAM_MODES, LINEAR_ROPE_MODES, BALANCE_LOSS_MODES, LOGPROB_SOURCES, EOS_HANDLING):
        assert "original" not in choices
    for name, old in (("stream_mode", "original"), ("linear_rope", "before_feature"), ("balance_loss", "original")):
        with pytest.raises(ValueError, match=name):
            ModelConfig.from_dict(dict(ModelConfig().to_dict(), **{name: old}))
    for name in ("logprob_source", "eos_handling"):
        with pytest.raises(ValueError):
            RLConfig(initial_checkpoint="c", output="o", **{name: "original"}).validate()

def test_stream_write_gradients_equal_addcmul():
    """The streams' write (an autograd.Function with matrix-vector backward) against addcmul's graph,
    also for the broadcast first streams (stride 0 over S), and gradcheck in float64."""
    from glm53_flash.model.ops.streams import _AddOuter

    torch.manual_seed(5)
    for expanded in (False, True):
        base = torch.randn(1 if expanded else 3, 2, 5, 8, dtype=torch.float64, requires_grad=True)
        weights = torch.rand(3, dtype=torch.float64, requires_grad=True)
        update = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
        grad = torch.randn(3, 2, 5, 8, dtype=torch.float64)
        grads = []
        for fn in (_AddOuter.apply, lambda s, w, u: torch.addcmul(s, w.view(-1, 1, 1, 1), u.unsqueeze(0))):
            streams = base.expand(3, 2, 5, 8) if expanded else base
            out = fn(streams, weights, update)
            grads.append((out.detach(), *torch.autograd.grad(out, (base, weights, update), grad)))
        for fast, plain in zip(*grads):
            torch.testing.assert_close(fast, plain)
    # float32 streams with bf16 weights and update (CUDA autocast's mix): addcmul promotes, the
    # backward must too, and each gradient comes back in its input's dtype
    streams = torch.randn(3, 2, 5, 8, requires_grad=True)
    weights16 = torch.rand(3).bfloat16().requires_grad_()
    update16 = torch.randn(2, 5, 8).bfloat16().requires_grad_()
    grads = []
    for fn in (_AddOuter.apply, lambda s, w, u: torch.addcmul(s, w.view(-1, 1, 1, 1), u.unsqueeze(0))):
        out = fn(streams, weights16, update16)
        assert out.dtype == torch.float32
        grads.append(torch.autograd.grad(out, (streams, weights16, update16), torch.ones_like(out)))
    for fast, plain in zip(*grads):
        assert fast.dtype == plain.dtype
        torch.testing.assert_close(fast, plain, atol=0.05, rtol=0.02)
    assert torch.autograd.gradcheck(_AddOuter.apply, (torch.randn(3, 2, 1, 4, dtype=torch.float64, requires_grad=True),
                                                      weights, torch.randn(2, 1, 4, dtype=torch.float64, requires_grad=True)))


def test_every_saved_model_carries_a_model_card(tmp_path):
    """README.md beside the weights opens with the Hub's metadata header and says what the model is, what
    it was trained on and its limits, with the figures its run recorded. It is not hashed: tools rewrite a
    card by convention (push_to_hub), and loading never reads it."""
    from glm53_flash.model.pretrained import CARD_FILE, read_metadata, save_pretrained
    from glm53_flash.train.checkpoint import save_checkpoint

    torch.manual_seed(0)
    model = g.GLM53Flash(g.ModelConfig.preset("tiny"))
    save_pretrained(model, tmp_path / "saved")
    card = (tmp_path / "saved" / CARD_FILE).read_text()
    assert card.startswith("---\nlicense: mit\nlibrary_name: transformers\npipeline_tag: text-generation\n")
    assert f"{model.parameter_counts()['total']:,}-parameter byte-level language model" in card
    assert "Limits:" in card and CARD_FILE not in read_metadata(tmp_path / "saved")["files"]
    saved = tmp_path / "checkpoint-0004"
    save_checkpoint(saved, model, {"stage": "coding_pretraining", "step": 4, "seed": 42, "tokens_seen": 512,
                                   "training_loss": 2.5})
    card = (saved / CARD_FILE).read_text()
    assert "pretrained from random weights" in card and "| training loss at this step | 2.5 |" in card
    (saved / CARD_FILE).write_text("another tool's card\n")
    assert read_metadata(saved)["step"] == 4 and g.GLM53Flash.from_pretrained(saved).config == model.config
