"""The CPU kernels (glm53_flash/model/ops/, kernels.c) against torch's products, their dispatch rules,
and the fallback when they cannot be built. The kernel tests skip on a machine that cannot build
them (no AVX2/FMA or no C compiler); the dispatch and fallback tests run everywhere."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import glm53_flash as g
from glm53_flash.model import ops
from glm53_flash.model.moe import MixtureOfExperts, dense_moe_reference
from glm53_flash.model.sparse_attention import SparseKV

needs_kernels = pytest.mark.skipif(not ops.available(), reason=f"kernels: {ops.status()['reason']}")


@pytest.fixture(scope="module", autouse=True, params=ops.supported_isas() or ["none"])
def isa(request):
    """The whole module runs once against each build this CPU can run (16 and 8 float lanes on an
    AVX-512 CPU); a process uses the widest unless GLM53_KERNEL_ISA says otherwise."""
    saved = dict(ops.library._state)
    if request.param != "none":
        library, reason, path = ops.library._build(request.param)
        assert library is not None, reason
        ops.library._state.clear()
        ops.library._state.update(library=library, reason=reason, path=path)
        assert request.param in ops.status()["reason"]
    yield request.param
    ops.library._state.clear()
    ops.library._state.update(saved)


@needs_kernels
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, ops.MAX_ROWS // 2), outputs=st.integers(1, 70), inner=st.sampled_from([8, 16, 24, 48, 192]),
       lead=st.sampled_from([(), (1,), (2,)]))
def test_kernel_linear_equals_f_linear(rows, outputs, inner, lead):
    """Any row count up to the limit, output sizes with and without a tail of 1-3 rows past the
    blocks of four, leading batch dimensions."""
    generator = torch.Generator().manual_seed(rows * 1000 + outputs)
    x = torch.randn(*lead, rows, inner, generator=generator)
    weight = torch.randn(outputs, inner, generator=generator)
    with torch.inference_mode():
        assert ops.library.serves(x, weight, x.numel() // inner, ops.MAX_ROWS)
        out = ops.linear(x, weight)
    assert out.shape == F.linear(x, weight).shape
    # Both sum `inner` products of unit-scale floats in different orders (16-lane partial sums here,
    # MKL's blocking there): their rounding differs by about inner * 2^-24 * |x||w|, which at 192
    # reaches 1e-5 on an output near zero, so the absolute tolerance grows with the inner size.
    torch.testing.assert_close(out, F.linear(x, weight), atol=1e-6 * inner, rtol=1e-5)


@needs_kernels
@pytest.mark.parametrize("dim", [16, 24])
@pytest.mark.parametrize("counts", [[4, 4, 4, 4], [0, 7, 0, 1], [0, 0, 13, 0], [1, 0, 0, 0], [100, 30, 0, 126]])
def test_grouped_kernels_equal_each_expert_alone(counts, dim):
    """Rows sorted by expert, idle experts, every row on one expert, a single row, hundreds of rows;
    inner sizes a multiple of 16 and one that ends in a half (masked) step of a 16-lane build."""
    torch.manual_seed(7)
    experts, hidden = 4, 24
    gate_up, down = torch.randn(experts, 2 * hidden, dim), torch.randn(experts, hidden, 16)
    counts = torch.tensor(counts)
    rows = torch.randn(int(counts.sum()), dim)
    offsets = counts.cumsum(0)
    with torch.inference_mode():
        hidden_out = ops.grouped_linear(rows, gate_up, offsets)
        down_in = torch.randn(rows.shape[0], hidden)
        down_out = ops.grouped_matmul(down_in, down, offsets)
    start = 0
    for e, count in enumerate(counts.tolist()):
        part = slice(start, start + count)
        torch.testing.assert_close(hidden_out[part], rows[part] @ gate_up[e].T, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(down_out[part], down_in[part] @ down[e], atol=1e-5, rtol=1e-5)
        start += count


@needs_kernels
@pytest.mark.parametrize("experts,top_k,tokens", [(4, 2, 16), (8, 2, 16), (8, 2, 1), (4, 1, 7), (8, 2, 256)])
def test_moe_takes_the_kernels_when_decoding_and_equals_torch_and_the_dense_reference(monkeypatch, experts,
                                                                                       top_k, tokens):
    """Routing, sort, row copies and the gate-weighted sum in C: the same output and slot counts as
    the torch path and the dense oracle, with an idle expert (the last one never wins)."""
    torch.manual_seed(8)
    moe = MixtureOfExperts(16, 24, experts=experts, top_k=top_k)
    with torch.no_grad():
        moe.router.weight[-1] = -10.0
    x = torch.rand(tokens, 16) + 0.1
    taken = []
    original = ops.experts.moe_dispatch
    monkeypatch.setattr(ops.experts, "moe_dispatch", lambda *a: taken.append(1) or original(*a))
    with torch.inference_mode():
        out, counts, _ = moe(x, with_balance=False)
        reference = dense_moe_reference(moe, x)
        monkeypatch.setattr(ops.library, "ENABLED", False)
        torch_out, torch_counts, _ = moe(x, with_balance=False)
    assert taken == [1]
    assert counts.tolist() == torch_counts.tolist() and counts[-1] == 0 and counts.sum() == tokens * top_k
    torch.testing.assert_close(out, torch_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(ops.library, "ENABLED", True)
    taken.clear()
    moe(x, with_balance=False)  # gradients on: the C layer declines; the grouped kernel or the chunk loop
    assert not taken


@needs_kernels
def test_moe_dispatch_sorts_slots_stably_by_expert():
    torch.manual_seed(10)
    x, router = torch.randn(9, 16), torch.randn(4, 16)
    with torch.inference_mode():
        rows, counts, offsets, position, gates = ops.moe_dispatch(x, router, 2)
        expected_gates, expected_index = torch.topk(x @ router.T, 2)
    torch.testing.assert_close(gates, torch.softmax(expected_gates, -1))
    flat = expected_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    assert counts.tolist() == torch.bincount(flat, minlength=4).tolist()
    assert offsets.tolist() == counts.cumsum(0).tolist()
    assert position[order].tolist() == list(range(18))
    torch.testing.assert_close(rows, x[order // 2])


@needs_kernels
def test_cached_decode_with_kernels_equals_without_and_the_full_forward(monkeypatch):
    """The flash shapes (dim 192, 8 experts) at batch 16: the decode steps run through the kernels;
    logits equal the eager path's and the full forward's to 1e-4."""
    cfg = g.ModelConfig(layers=4)
    torch.manual_seed(9)
    model = g.GLM53Flash(cfg).eval()
    ids = torch.randint(4, 260, (16, 24))

    def decode():
        cache = model.new_cache(16)
        parts = [model(ids[:, :16], cache=cache).logits]
        parts += [model(ids[:, t:t + 1], cache=cache).logits for t in range(16, 24)]
        return torch.cat(parts, 1)

    calls = []
    original = ops.linear
    monkeypatch.setattr(ops, "linear", lambda *a: calls.append(1) or original(*a))
    with torch.inference_mode():
        fast = decode()
        assert calls  # the head goes through ops.linear
        monkeypatch.setattr(ops.library, "ENABLED", False)
        eager = decode()
        full = model(ids).logits
    assert (fast - eager).abs().max().item() <= 1e-4
    assert (fast - full).abs().max().item() <= 1e-4


def test_kernels_serve_only_what_they_were_written_for():
    x, weight = torch.randn(4, 16), torch.randn(8, 16)
    with torch.inference_mode():
        served = ops.library.serves(x, weight, 4, ops.MAX_ROWS)
        assert served is ops.available()
        assert not ops.library.serves(x, weight, ops.MAX_ROWS + 1, ops.MAX_ROWS)
        assert not ops.library.serves(x.double(), weight.double(), 4, ops.MAX_ROWS)
        assert not ops.library.serves(torch.randn(4, 12), torch.randn(8, 12), 4, ops.MAX_ROWS)  # K % 8
        assert not ops.library.serves(x, weight.T.contiguous().T, 4, ops.MAX_ROWS)  # strided weight
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not ops.library.serves(x, weight, 4, ops.MAX_ROWS)
    assert not ops.library.serves(x, weight, 4, ops.MAX_ROWS)  # gradients on (training)


def test_failed_build_falls_back_to_torch_and_says_why(monkeypatch, tmp_path):
    """No usable compiler: nothing raises, status() names the reason, every product is torch's."""
    monkeypatch.setattr(ops.library, "_state", {})
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("GLM53_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(ops.library, "SOURCE", tmp_path / "kernels.c")
    (tmp_path / "kernels.c").write_text("this is not C\n")
    status = ops.status()
    assert status["available"] is False and status["library"] is None and status["reason"]
    x, weight = torch.randn(4, 16), torch.randn(8, 16)
    with torch.inference_mode():
        torch.testing.assert_close(ops.linear(x, weight), F.linear(x, weight))
    with pytest.raises(RuntimeError, match="not available"):
        ops.grouped_linear(x, weight.view(1, 8, 16), torch.tensor([4]))


def test_a_broken_source_is_reported_not_loaded(monkeypatch, tmp_path):
    if not ops.supported_isas() or not (ops.library.shutil.which("cc") or ops.library.shutil.which("gcc")):
        pytest.skip("this machine cannot build the kernels at all")
    monkeypatch.setattr(ops.library, "_state", {})
    monkeypatch.setenv("GLM53_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(ops.library, "SOURCE", tmp_path / "kernels.c")
    (tmp_path / "kernels.c").write_text("this is not C\n")
    status = ops.status()
    assert not status["available"] and "failed" in status["reason"]
    assert not list((tmp_path / "cache").glob("*.so"))  # nothing half-built left to load later


def test_isa_chosen_by_the_environment(monkeypatch):
    """GLM53_KERNEL_ISA picks a build the CPU runs; a name it does not know or a build the CPU cannot
    run is refused with the reason, and the process falls back to torch."""
    monkeypatch.setattr(ops.library, "_cpu_flags", lambda: ["fma", "avx2"])
    monkeypatch.setenv("GLM53_KERNEL_ISA", "avx2")
    assert ops.library._choose_isa() == ("avx2", "")
    monkeypatch.setenv("GLM53_KERNEL_ISA", "avx512")
    assert ops.library._choose_isa() == (None, "GLM53_KERNEL_ISA=avx512 asks for what this CPU lacks")
    monkeypatch.setenv("GLM53_KERNEL_ISA", "neon")
    assert ops.library._choose_isa()[0] is None and "not one of avx512, avx2" in ops.library._choose_isa()[1]
    monkeypatch.delenv("GLM53_KERNEL_ISA")
    assert ops.library._choose_isa() == ("avx2", "")
    monkeypatch.setattr(ops.library, "_cpu_flags", lambda: ["fma", "avx2", "avx512f"])
    assert ops.library._choose_isa() == ("avx512", "")
    monkeypatch.setattr(ops.library, "_cpu_flags", lambda: ["sse4_2", "avx"])
    assert ops.library._choose_isa() == (None, "the CPU lacks avx2, fma")


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setattr(ops.library, "ENABLED", False)
    assert ops.status() == {"available": False, "library": None,
                                "reason": "disabled by GLM53_KERNELS=0 or ops.library.ENABLED"}
    assert not ops.available()


@needs_kernels
@pytest.mark.parametrize("shape", [(1, 8), (16, 1, 192), (3, 5, 32), (32, 48), (2, 24)])
def test_rms_norm_kernel_equals_the_formula(shape):
    from glm53_flash.model.norm import RMSNorm, rms_norm_reference

    torch.manual_seed(11)
    norm = RMSNorm(shape[-1])
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(*shape) * 3
    with torch.inference_mode():
        out = ops.rms_norm(x, norm.weight, norm.eps)
        assert out is not None and out.shape == x.shape
        torch.testing.assert_close(out, rms_norm_reference(x, norm.weight, norm.eps), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(norm(x), out)
        assert ops.rms_norm(torch.randn(ops.MAX_ROWS + 1, 8), torch.ones(8), 1e-6) is None
    assert ops.rms_norm(x, norm.weight, norm.eps) is None  # gradients on: the formula


@needs_kernels
@pytest.mark.parametrize("rope_before_feature", [False, True])
@pytest.mark.parametrize("head_dim", [16, 24])
def test_linear_attention_step_kernel_equals_the_torch_step(monkeypatch, rope_before_feature, head_dim):
    """A prefilled layer then three decode steps, with and without the original's rotation before the
    feature map: the C step's outputs and in-place states equal the torch path's."""
    from glm53_flash.model.linear_attention import LinearAttention
    from glm53_flash.model.rope import RotaryEmbedding

    torch.manual_seed(12)
    layer = LinearAttention(head_dim * 4, 4, chunk=16, rope_before_feature=rope_before_feature)
    rope = RotaryEmbedding(head_dim, 64)
    x = torch.randn(5, 12, head_dim * 4)
    results = []
    for enabled in (True, False):
        monkeypatch.setattr(ops.library, "ENABLED", enabled)
        with torch.inference_mode():
            _, state = layer(x[:, :9], rope, 0, None, True)
            outs = []
            for t in range(9, 12):
                if enabled:
                    assert ops.linear_attention_serves(layer.qkv(x[:, t:t + 1]), state.kv, state.z, head_dim)
                out, new_state = layer(x[:, t:t + 1], rope, t, state, True)
                assert (new_state.kv is state.kv) and (new_state.z is state.z)  # updated in place
                outs.append(out)
        results.append((torch.cat(outs, 1), state.kv, state.z))
    for fast, eager in zip(*results):
        torch.testing.assert_close(fast, eager, atol=1e-5, rtol=1e-5)


def _scan_counted_layer(monkeypatch, seed: int, batch: int, head_dim: int, rope_before_feature: bool):
    """A four-head linear-attention layer with a 16-position chunk, its rotation, a 40-position input, and
    the list every call of the C scan's forward appends its input's shape to."""
    from glm53_flash.model.linear_attention import LinearAttention
    from glm53_flash.model.rope import RotaryEmbedding

    torch.manual_seed(seed)
    layer = LinearAttention(head_dim * 4, 4, chunk=16, rope_before_feature=rope_before_feature)
    rope = RotaryEmbedding(head_dim, 64)
    x = torch.randn(batch, 40, head_dim * 4)
    calls = []
    original = ops.linear_attention_scan_forward
    monkeypatch.setattr(ops.linear_attention, "linear_attention_scan_forward",
                        lambda *a: calls.append(a[0].shape) or original(*a))
    return layer, rope, x, calls


@needs_kernels
@pytest.mark.parametrize("rope_before_feature", [False, True])
def test_sequences_longer_than_the_chunk_take_the_scan_kernel_and_equal_the_chunked_torch_form(
        monkeypatch, rope_before_feature):
    """A layer's output and the gradients of its input and weights on a sequence longer than its chunk:
    the C scan (taken only there) equals the torch form's chunks; a prefill's state from the scan then
    decodes as the torch prefill's does; a sequence of at most the chunk keeps the torch form."""
    layer, rope, x, calls = _scan_counted_layer(monkeypatch, 13, 3, 24, rope_before_feature)
    results = []
    for enabled in (True, False):
        monkeypatch.setattr(ops.library, "ENABLED", enabled)
        layer.zero_grad()
        leaf = x.clone().requires_grad_()
        out, _ = layer(leaf, rope, 0)
        out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
        with torch.inference_mode():
            _, state = layer(x[:, :30], rope, 0, None, True)
            step, _ = layer(x[:, 30:31], rope, 30, state, True)
            short, _ = layer(x[:, :16], rope, 0)
        results.append((out.detach(), leaf.grad, layer.qkv.weight.grad.clone(), layer.out.weight.grad.clone(),
                        state.kv, state.z, step, short))
    assert calls == [(3, 40, 3 * 96), (3, 30, 3 * 96)]  # the training forward and the long prefill, not the short
    monkeypatch.setattr(ops.library, "ENABLED", True)
    monkeypatch.setattr(ops.linear_attention, "SCAN_ENABLED", False)  # the switch alone sends it to the chunks
    layer(x, rope, 0)
    assert len(calls) == 2
    for fast, eager in zip(*results):
        torch.testing.assert_close(fast, eager, atol=1e-5, rtol=1e-4)
    assert torch.equal(results[0][-1], results[1][-1])  # at most the chunk: the very same arithmetic


def test_a_prefill_that_trains_through_its_state_keeps_the_state_gradient(monkeypatch):
    """RL's shared-prompt update runs the prompt once with a cache and its completions from that state:
    the completions' loss reaches the prompt's keys and values through the state. The C scan's state has
    no gradient, so such a prefill (longer than the chunk, gradients on) takes the torch form, and the
    gradients equal the whole sequence's; the scan itself refuses to return a state to train through."""

    layer, rope, x, calls = _scan_counted_layer(monkeypatch, 5, 2, 16, True)
    weight = torch.linspace(-1, 1, 2 * 10 * 64).view(2, 10, 64)

    layer.zero_grad()
    leaf = x.clone().requires_grad_()
    _, state = layer(leaf[:, :30], rope, 0, None, True)  # the prompt, 30 > chunk positions, with gradients
    rest, _ = layer(leaf[:, 30:], rope, 30, state, True)  # the completions read the prompt's state
    (rest * weight).sum().backward()
    split = (leaf.grad.clone(), layer.qkv.weight.grad.clone())
    assert calls == []  # the training prefill did not take the scan
    assert split[0][:, :30].abs().sum() > 0  # the loss reached the prompt only through the state

    layer.zero_grad()
    whole_leaf = x.clone().requires_grad_()
    monkeypatch.setattr(ops.linear_attention, "SCAN_ENABLED", False)
    whole, _ = layer(whole_leaf, rope, 0)
    (whole[:, 30:] * weight).sum().backward()
    torch.testing.assert_close(split[0], whole_leaf.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(split[1], layer.qkv.weight.grad, atol=1e-5, rtol=1e-4)

    qkv = torch.randn(1, 20, 3 * 64, requires_grad=True)
    with pytest.raises(ValueError, match="no gradient"):
        ops.scan_linear_attention(qkv, 4, None, None, True, 1e-6)


def _activation_and_gradient(h: torch.Tensor, grad_out: torch.Tensor):
    from glm53_flash.model.ops.swiglu import _SwiGLUActivation

    leaf = h.detach().clone().requires_grad_()
    out = _SwiGLUActivation.apply(leaf)
    out.backward(grad_out)
    return out.detach(), leaf.grad


@needs_kernels
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 300), hidden=st.sampled_from([8, 16, 24, 40, 192, 384]),
       lead=st.sampled_from([(), (3,)]), scale=st.sampled_from([1.0, 12.0]), seed=st.integers(0, 2**16))
def test_fused_swiglu_equals_the_eager_activation_and_its_gradient(rows, hidden, lead, scale, seed):
    """Forward and backward of the fused activation against the eager autograd.Function (kernels off)
    and against float64 formulas, for hidden sizes with and without a half-vector tail."""
    generator = torch.Generator().manual_seed(seed)
    h = torch.randn(*lead, rows, 2 * hidden, generator=generator) * scale
    grad_out = torch.randn(*lead, rows, hidden, generator=generator)
    calls = []
    original = ops.swiglu_backward
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ops.swiglu, "swiglu_backward", lambda *a: calls.append(1) or original(*a))
        fast, fast_grad = _activation_and_gradient(h, grad_out)
        assert calls  # the fused backward ran
        patch.setattr(ops.library, "ENABLED", False)
        eager, eager_grad = _activation_and_gradient(h, grad_out)
        exact, exact_grad = _activation_and_gradient(h.double(), grad_out.double())
    for value in (eager, exact.float()):
        torch.testing.assert_close(fast, value, atol=1e-6, rtol=1e-5)
    for value in (eager_grad, exact_grad.float()):
        torch.testing.assert_close(fast_grad, value, atol=1e-6, rtol=1e-5)


@needs_kernels
def test_fused_swiglu_at_the_edges_of_the_exponential():
    """Gates past exp's float range, tiny and huge, NaN and infinities: what torch's silu and
    silu_backward give (exp is clamped and rebuilt from its exponent field in the kernel)."""
    edges = torch.tensor([-1e30, -100.0, -88.5, -88.0, -87.5, -50.0, -1e-3, 0.0, 1e-3, 20.0, 88.5, 89.0, 100.0,
                          1e30, float("nan"), float("inf"), float("-inf")])
    gate = torch.cat([edges, torch.linspace(-30, 30, 15)])  # 32 gates: two whole 16-float vectors
    h = torch.cat([gate, torch.full_like(gate, 1.5)])[None]
    grad_out = torch.full_like(gate, 0.75)[None]
    fast = ops.swiglu_forward(h)
    fast_grad = ops.swiglu_backward(h, grad_out)
    torch.testing.assert_close(fast, F.silu(gate)[None] * 1.5, atol=1e-6, rtol=1e-6, equal_nan=True)
    eager_gate = torch.ops.aten.silu_backward(grad_out * 1.5, gate[None])
    torch.testing.assert_close(fast_grad[:, :32], eager_gate, atol=1e-6, rtol=1e-6, equal_nan=True)
    torch.testing.assert_close(fast_grad[:, 32:], grad_out * F.silu(gate)[None], atol=1e-6, rtol=1e-6,
                               equal_nan=True)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


@needs_kernels
@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 200), hidden=st.sampled_from([8, 24, 40, 384]), scale=st.sampled_from([1.0, 30.0]),
       seed=st.integers(0, 2**16))
def test_bf16_swiglu_is_the_float32_kernel_on_widened_inputs_rounded_once(rows, hidden, scale, seed):
    """bf16 in and out: the float32 kernel on the widened h and grad_out with its results rounded to bf16 by
    torch, bit for bit (forward and backward; hidden sizes with a half-vector tail take the masked store)."""
    generator = torch.Generator().manual_seed(seed)
    h = (torch.randn(rows, 2 * hidden, generator=generator) * scale).bfloat16()
    grad_out = torch.randn(rows, hidden, generator=generator).bfloat16()
    out = ops.swiglu_forward(h)
    grad = ops.swiglu_backward(h, grad_out)
    assert out.dtype == grad.dtype == torch.bfloat16 and grad.shape == h.shape
    assert torch.equal(_bits(out), _bits(ops.swiglu_forward(h.float()).bfloat16()))
    assert torch.equal(_bits(grad), _bits(ops.swiglu_backward(h.float(), grad_out.float()).bfloat16()))


@needs_kernels
def test_bf16_swiglu_rounds_ties_to_even_and_keeps_the_edges():
    """The store's rounding where it is easiest to get wrong. For a gate of 32 or more silu(gate) is the gate
    itself in float32, so the forward's output is gate * value, the exact product of two bf16 numbers (up to
    16 significant bits), which bf16 must round: among all 128 x 128 mantissa pairs the test takes 128 that
    fall exactly between two bf16 numbers (ties go to the even one) and 128 that do not, then the edges:
    overflow to inf, infinities, zeros, a subnormal, NaN. torch's rounding of the exact products is the oracle."""
    mantissas = 1.0 + torch.arange(128) / 128.0
    gates, values = (32.0 * mantissas)[:, None].expand(128, 128).flatten(), mantissas.repeat(128)
    exact = gates * values  # exact in float32: 8 x 8 significant bits
    tie = (exact.view(torch.int32) & 0xFFFF) == 0x8000
    chosen = torch.cat([tie.nonzero()[:128, 0], (~tie).nonzero()[::97][:128, 0]])
    assert int(tie[chosen].sum()) == 128
    edge_values = torch.tensor([3.38e38, -3.38e38, float("inf"), float("-inf"), 0.0, -0.0, 2.0 ** -130, float("nan")])
    gate = torch.cat([gates[chosen], torch.full((8,), 32.0)]).bfloat16()  # 264 = 16 x 16 + 8: the masked tail too
    value = torch.cat([-values[chosen[:64]], values[chosen[64:]], edge_values]).bfloat16()
    assert torch.equal(ops.swiglu_forward(torch.cat([gate, torch.ones_like(gate)]).float()[None])[0], gate.float())
    out = ops.swiglu_forward(torch.cat([gate, value])[None])[0]
    want = (gate.float() * value.float()).bfloat16()
    nan = torch.isnan(want.float())
    assert torch.equal(torch.isnan(out.float()), nan)
    assert torch.equal(_bits(out)[~nan], _bits(want)[~nan])
    assert _bits(out)[nan].tolist() == [0x7FC0]


def test_fused_swiglu_serves_only_what_it_was_written_for():
    h = torch.randn(4, 32)
    assert ops.swiglu_serves(h) is ops.available()  # gradients on or off: it has a backward
    assert ops.swiglu_serves(h.bfloat16()) is ops.available()  # bf16 weight products' activations
    assert not ops.swiglu_serves(h.half())
    assert not ops.swiglu_serves(h.double())
    assert not ops.swiglu_serves(torch.randn(4, 24))  # H = 12 is not a multiple of 8
    assert not ops.swiglu_serves(torch.randn(0, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not ops.swiglu_serves(h)


@needs_kernels
def test_training_step_with_the_fused_swiglu_equals_eager(monkeypatch):
    """Loss and every gradient of a small model's training step (experts and shared expert through
    the fused activation) equal the eager path's."""
    cfg = g.ModelConfig(layers=4, dim=64, heads=4, expert_hidden=32)
    ids = torch.randint(4, 260, (4, 33), generator=torch.Generator().manual_seed(3))
    results = []
    for enabled in (True, False):
        monkeypatch.setattr(ops.library, "ENABLED", enabled)
        torch.manual_seed(10)
        model = g.GLM53Flash(cfg).train()
        out = model(ids[:, :-1])
        loss = F.cross_entropy(out.logits.flatten(0, 1), ids[:, 1:].flatten()) + 0.01 * out.aux_loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (fast_loss, fast_grads), (eager_loss, eager_grads) = results
    torch.testing.assert_close(fast_loss, eager_loss, atol=1e-6, rtol=1e-6)
    assert fast_grads.keys() == eager_grads.keys()
    for name, grad in fast_grads.items():
        torch.testing.assert_close(grad, eager_grads[name], atol=1e-5, rtol=1e-4, msg=name)


@needs_kernels
@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 700), dim=st.sampled_from([8, 16, 24, 192]), lead=st.sampled_from([(), (2,)]),
       seed=st.integers(0, 2**16))
def test_rms_norm_training_pair_equals_the_formula_and_its_gradients(rows, dim, lead, seed):
    """The C forward/backward pair that training takes against the explicit formula's autograd graph
    (the oracle) in float32 and float64, row counts across several of the weight gradient's blocks."""
    from glm53_flash.model.norm import RMSNorm, rms_norm_reference

    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, rows, dim, generator=generator) * 3
    grad_out = torch.randn(*lead, rows, dim, generator=generator)
    norm = RMSNorm(dim)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(dim, generator=generator) + 0.5)
    calls = []
    original = ops.rms_norm_backward
    results = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ops.rmsnorm, "rms_norm_backward", lambda *a: calls.append(1) or original(*a))
        for fn, dtype in ((norm, torch.float32), (rms_norm_reference, torch.float32), (rms_norm_reference, torch.float64)):
            leaf = x.to(dtype).clone().requires_grad_()
            weight = norm.weight.detach().to(dtype).clone().requires_grad_()
            if fn is norm:
                norm.weight.grad = None
                out = norm(leaf)
                out.backward(grad_out)
                results.append((out.detach(), leaf.grad, norm.weight.grad))
            else:
                out = fn(leaf, weight, norm.eps)
                out.backward(grad_out.to(dtype))
                results.append((out.detach().float(), leaf.grad.float(), weight.grad.float()))
    assert calls  # the C backward ran
    fast = results[0]
    summed = x.numel() // dim  # the weight's gradient sums this many rows: float32 rounding grows with it
    for oracle in results[1:]:
        for got, want, atol in zip(fast, oracle, (1e-5, 1e-5, 1e-6 * summed + 1e-5)):
            torch.testing.assert_close(got, want, atol=atol, rtol=1e-5)


@needs_kernels
def test_rms_norm_weight_gradient_does_not_depend_on_the_thread_count():
    """The weight's gradient is summed in fixed blocks of rows, so one thread and two give the same
    bits (exact resume across machines with different core counts needs this)."""
    x = torch.randn(5000, 192, generator=torch.Generator().manual_seed(1))
    grad_out = torch.randn(5000, 192, generator=torch.Generator().manual_seed(2))
    weight = torch.rand(192) + 0.5
    out, rstd = ops.rms_norm_forward(x, weight, 1e-6)
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            results.append(ops.rms_norm_backward(x, weight, rstd, grad_out))
    finally:
        torch.set_num_threads(threads)
    for grad_x, grad_w in results[1:]:
        assert torch.equal(grad_x, results[0][0]) and torch.equal(grad_w, results[0][1])


def test_rms_norm_training_pair_serves_only_what_it_was_written_for():
    x, weight = torch.randn(4, 16), torch.ones(16)
    assert ops.rms_norm_training_serves(x, weight) is ops.available()
    assert not ops.rms_norm_training_serves(x.double(), weight.double())
    assert not ops.rms_norm_training_serves(torch.randn(4, 12), torch.ones(12))  # D % 8
    assert not ops.rms_norm_training_serves(x, torch.ones(8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not ops.rms_norm_training_serves(x, weight)


@needs_kernels
def test_training_kernels_take_strided_inputs_and_frozen_weights():
    """Non-contiguous inputs and gradients (views) and a norm weight without gradient, as in RL's
    frozen layers: the same values and input gradients as the formulas."""
    from glm53_flash.model.norm import RMSNorm, rms_norm_reference
    from glm53_flash.model.ops.swiglu import _SwiGLUActivation

    base = torch.randn(32, 6, generator=torch.Generator().manual_seed(7)).T  # [6, 32], stride (1, 6)
    norm = RMSNorm(32).requires_grad_(False)
    results = []
    for fn in (norm, lambda x: rms_norm_reference(x, norm.weight, norm.eps)):
        x = base.detach().clone().requires_grad_()
        x_view = x.T.contiguous().T  # strided like base
        assert not x_view.is_contiguous()
        out = fn(x_view)
        out.backward(torch.ones(32, 6).T)  # a strided gradient too
        results.append((out.detach(), x.grad))
    for fast, plain in zip(*results):
        torch.testing.assert_close(fast, plain, atol=1e-5, rtol=1e-5)
    h = torch.randn(64, 5).T.requires_grad_()  # [5, 64], strided
    fast = _SwiGLUActivation.apply(h)
    grad = torch.randn(32, 5).T
    fast_grad, = torch.autograd.grad(fast, h, grad)
    gate, value = h.chunk(2, dim=-1)
    plain = F.silu(gate) * value
    plain_grad, = torch.autograd.grad(plain, h, grad)
    torch.testing.assert_close(fast, plain, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(fast_grad, plain_grad, atol=1e-6, rtol=1e-5)


def _decode_logits(model, ids, prompt, batch_rows):
    cache = model.new_cache(batch_rows)
    parts = [model(ids[:, :prompt], cache=cache).logits]
    parts += [model(ids[:, t:t + 1], cache=cache).logits for t in range(prompt, ids.shape[1])]
    return torch.cat(parts, 1), cache


@needs_kernels
@pytest.mark.parametrize("stream_mode,linear_rope,window,stride,rows,streams", [
    ("double-residual", "none", 4, 3, 6, 4),
    ("delta", "none", 4, 3, 5, 1),  # one stream
    ("delta", "rope-before-feature-map", 5, 4, 6, 4),
    ("double-residual", "rope-before-feature-map", 1, 3, 6, 4),  # a window of one: the new key is never kept
    ("double-residual", "none", 4, 3, ops.MAX_ROWS + 7, 4),  # one by one, torch's GEMMs take the products
    ("sinkhorn", "none", 4, 3, 6, 4),  # not fused: the block runs operation by operation
])
def test_fused_block_decode_equals_the_operations_one_by_one_and_the_full_forward(
        monkeypatch, stream_mode, linear_rope, window, stride, rows, streams):
    """Every decode step of every layer in one C call (per layer: mix/norm/qkv, the attention step,
    out/MoE/streams' write) equals the kernels one operation at a time, the eager path, and the full
    forward; the sparse layers' kept keys (slots reused as keys leave the window) and positions match too."""
    cfg = g.ModelConfig(dim=32, layers=4, heads=4, expert_hidden=48, experts=4, top_k=2, streams=streams,
                        sparse_window=window, sparse_stride=stride, max_sequence_length=40,
                        stream_mode=stream_mode, linear_rope=linear_rope)
    torch.manual_seed(21)
    model = g.GLM53Flash(cfg).eval()
    with torch.no_grad():  # make the stream weights unequal so a swapped pair would show
        for block in model.blocks:
            block.connection.input_logits.normal_()
            block.connection.output_logits.normal_()
    ids = torch.randint(4, 260, (rows, 30))
    calls = []
    original = ops.DecodeStack._step  # both step and step_with_head
    monkeypatch.setattr(ops.DecodeStack, "_step", lambda *a: calls.append(1) or original(*a))
    results = {}
    with torch.inference_mode():
        for name, fused, enabled in (("fused", True, True), ("one by one", False, True), ("eager", True, False)):
            monkeypatch.setattr(ops.library, "FUSED_DECODE", fused)
            monkeypatch.setattr(ops.library, "ENABLED", enabled)
            calls.clear()
            results[name] = _decode_logits(model, ids, 9, rows)
            if name == "fused":
                assert len(calls) == (0 if stream_mode == "sinkhorn" else 30 - 9)  # one call per step
            else:
                assert not calls
        full = model(ids).logits
    fused, cache = results["fused"]
    for name in ("one by one", "eager"):
        other, other_cache = results[name]
        assert (fused - other).abs().max().item() <= 1e-4, name
        for mine, theirs in zip(cache.layers, other_cache.layers):
            if isinstance(mine, SparseKV):
                assert mine.positions == theirs.positions
                torch.testing.assert_close(mine.k, theirs.k, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(mine.v, theirs.v, atol=1e-5, rtol=1e-5)
            else:
                torch.testing.assert_close(mine.kv, theirs.kv, atol=1e-4, rtol=1e-5)
                torch.testing.assert_close(mine.z, theirs.z, atol=1e-4, rtol=1e-5)
    assert (fused - full).abs().max().item() <= 1e-4


def _decode_outputs(model, ids, prompt, batch_rows):
    """Each cached step's logits and hidden state (ModelOutput.hidden) after a prefill of `prompt` tokens."""
    cache = model.new_cache(batch_rows)
    model(ids[:, :prompt], cache=cache)
    outputs = [model(ids[:, t:t + 1], cache=cache) for t in range(prompt, ids.shape[1])]
    return torch.cat([o.logits for o in outputs], 1), torch.cat([o.hidden for o in outputs], 1)


@needs_kernels
@pytest.mark.parametrize("bf16", [False, True])
def test_the_final_norm_and_head_in_the_one_call_step_give_the_same_bits(monkeypatch, bf16):
    """The one-call step also runs the final norm and the tied head for up to ops.MAX_ROWS rows: every step's
    logits and hidden state equal the same step with the two run after the call in Python, bit for bit, in
    both precisions; past MAX_ROWS rows the call leaves them to Python. A norm weight set anew is read, and a
    final norm with a hook, or of another kind, runs as itself (the call then leaves the head to Python)."""
    from glm53_flash.model.precision import compute_in, resolve_precision

    cfg = g.ModelConfig(dim=32, layers=4, heads=4, expert_hidden=48, experts=4, top_k=2, sparse_window=4,
                        sparse_stride=3, max_sequence_length=40)
    torch.manual_seed(12)
    model = g.GLM53Flash(cfg).eval()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
    precision = resolve_precision("bf16" if bf16 else "fp32", "cpu")
    headed = []
    with_head = ops.DecodeStack.step_with_head
    monkeypatch.setattr(ops.DecodeStack, "step_with_head", lambda *a: headed.append(1) or with_head(*a))
    serves = ops.DecodeStack.head_serves

    def decode(ids, rows, in_the_call=True):
        monkeypatch.setattr(ops.DecodeStack, "head_serves", serves if in_the_call else lambda self, batch: False)
        headed.clear()
        with torch.inference_mode(), compute_in(precision, "cpu"):
            return _decode_outputs(model, ids, 9, rows)

    ids = torch.randint(4, 260, (5, 20))
    (logits, hidden), calls = decode(ids, 5), len(headed)
    assert calls == 20 - 9
    after_logits, after_hidden = decode(ids, 5, in_the_call=False)
    assert not headed
    assert torch.equal(logits.view(torch.int32), after_logits.view(torch.int32))
    assert torch.equal(hidden.view(torch.int32), after_hidden.view(torch.int32))
    many = torch.randint(4, 260, (ops.MAX_ROWS + 3, 12))
    decode(many, ops.MAX_ROWS + 3)
    assert not headed  # more rows than the C head serves: the head ran in Python
    model.norm.weight = torch.nn.Parameter(model.norm.weight.detach() * 2.0)  # set anew
    changed, _ = decode(ids, 5)
    assert len(headed) == calls and torch.equal(changed.view(torch.int32), decode(ids, 5, False)[0].view(torch.int32))
    assert not torch.equal(changed, logits)

    seen = []  # a hook on the final norm: the norm then runs as called, after the step, and the hook sees it
    handle = model.norm.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    hooked, _ = decode(ids, 5)
    handle.remove()
    assert not headed and len(seen) == 20 - 9 + 1 and torch.equal(hooked, changed)

    class Scaled(torch.nn.Module):  # another final norm: its output, not RMSNorm's, feeds the head
        def forward(self, x):
            return 3.0 * x

    model.norm = Scaled()
    other, other_hidden = decode(ids, 5)
    assert not headed
    with torch.inference_mode(), compute_in(precision, "cpu"):
        monkeypatch.setattr(ops.library, "FUSED_DECODE", False)
        eager, eager_hidden = _decode_outputs(model, ids, 9, 5)
    assert (other - eager).abs().max().item() <= 1e-4 and (other_hidden - eager_hidden).abs().max().item() <= 1e-4


@needs_kernels
def test_a_deep_copy_decodes_its_own_weights_and_odd_expert_widths_step_aside(monkeypatch):
    """The one-call step's operands (pointers into the weights, made once per weight version) belong to
    their model: a deep copy made after the original decoded reads its own weights, also after the
    original's change in place; a model the call cannot take (an expert width not a multiple of 8)
    decodes op by op instead of failing."""
    import copy

    from glm53_flash.model.precision import compute_in, resolve_precision

    cfg = g.ModelConfig(dim=32, layers=4, heads=4, expert_hidden=48, experts=4, top_k=2, sparse_window=4,
                        sparse_stride=3, max_sequence_length=32)
    torch.manual_seed(8)
    original = g.GLM53Flash(cfg).eval()
    ids = torch.randint(4, 260, (3, 16))
    with torch.inference_mode():
        before, _ = _decode_logits(original, ids, 6, 3)
        twin = copy.deepcopy(original)
        with torch.no_grad():
            for parameter in original.parameters():
                parameter.mul_(1.5)
        assert torch.equal(_decode_logits(twin, ids, 6, 3)[0], before)
        # the twin's weights are inference tensors (copied in inference mode), which keep no version: its
        # bf16 copies are made again each step, so a change in place is read at once
        with compute_in(resolve_precision("bf16", "cpu"), "cpu"):
            bf16_before, _ = _decode_logits(twin, ids, 6, 3)
            twin.blocks[0].moe.expert_down.mul_(-1.0)
            bf16_after, _ = _decode_logits(twin, ids, 6, 3)
            assert torch.equal(bf16_after, _decode_logits(copy.deepcopy(twin), ids, 6, 3)[0])
        assert not torch.equal(bf16_before, bf16_after)
        changed, _ = _decode_logits(original, ids, 6, 3)
        assert not torch.equal(changed, before)
        monkeypatch.setattr(ops.library, "FUSED_DECODE", False)
        assert (changed - _decode_logits(original, ids, 6, 3)[0]).abs().max().item() <= 1e-4
    odd = g.GLM53Flash(g.ModelConfig(dim=32, layers=4, heads=4, expert_hidden=12, experts=4, top_k=2,
                                     sparse_window=4, sparse_stride=3, max_sequence_length=32)).eval()
    calls = []
    step = ops.DecodeStack._step  # both step and step_with_head
    monkeypatch.setattr(ops.DecodeStack, "_step", lambda *a: calls.append(1) or step(*a))
    monkeypatch.setattr(ops.library, "FUSED_DECODE", True)
    with torch.inference_mode():
        fast, _ = _decode_logits(odd, ids, 6, 3)
        monkeypatch.setattr(ops.library, "ENABLED", False)
        eager, _ = _decode_logits(odd, ids, 6, 3)
    assert not calls and (fast - eager).abs().max().item() <= 1e-4


@needs_kernels
def test_the_one_call_steps_operands_follow_the_model_and_survive_a_change_of_precision(monkeypatch):
    """The operands are built once per product dtype and kept while the model is what they were built
    from: alternating float32 and bf16 decoding builds each once; a setting changed on every block (top-k)
    and a weight the call cannot read (the same storage transposed, not contiguous) are noticed, and the
    step then equals the layers one by one (or is left to them, without an error)."""
    from glm53_flash.model.precision import compute_in, resolve_precision

    cfg = g.ModelConfig(dim=32, layers=4, heads=4, expert_hidden=48, experts=4, top_k=2, sparse_window=4,
                        sparse_stride=3, max_sequence_length=32)
    torch.manual_seed(9)
    model = g.GLM53Flash(cfg).eval()
    ids = torch.randint(4, 260, (3, 14))
    built = []
    init = ops.DecodeStack.__init__
    monkeypatch.setattr(ops.DecodeStack, "__init__", lambda *a, **k: built.append(1) or init(*a, **k))
    bf16 = resolve_precision("bf16", "cpu")

    def decode(precision=None, fused=True):
        monkeypatch.setattr(ops.library, "FUSED_DECODE", fused)
        with torch.inference_mode(), compute_in(precision, "cpu"):
            return _decode_logits(model, ids, 6, 3)[0]

    for _ in range(3):
        decode(bf16)
        decode()
    assert len(built) == 2  # one float32 and one bf16 stack, not one per switch
    for block in model.blocks:
        block.moe.top_k = 1
    assert (decode() - decode(fused=False)).abs().max().item() <= 1e-4 and len(built) == 3
    square = model.blocks[1].attention.out.weight
    square.data = square.data.t()  # the same storage read the other way: not contiguous, so op by op
    assert (decode() - decode(fused=False)).abs().max().item() <= 1e-4 and len(built) == 3
    square.data = square.data.t().clone().t()  # the same values and layout in a storage whose rows run down
    assert (decode() - decode(fused=False)).abs().max().item() <= 1e-4 and len(built) == 3
    square.data = square.data.contiguous()  # readable again: a new stack
    assert (decode() - decode(fused=False)).abs().max().item() <= 1e-4 and len(built) == 4
    # a module set anew deep in the model, and a weight put straight into a module's parameters (as
    # torch.func.functional_call swaps them): each is read by the next step
    before = decode()
    model.blocks[2].moe.shared = type(model.blocks[2].moe.shared)(cfg.dim, cfg.expert_hidden)
    swapped = decode()
    assert len(built) == 5 and not torch.equal(swapped, before)
    assert (swapped - decode(fused=False)).abs().max().item() <= 1e-4
    router = model.blocks[0].moe.router
    router._parameters["weight"] = torch.nn.Parameter(router.weight.detach().flip(0))
    flipped = decode()
    assert len(built) == 6 and not torch.equal(flipped, swapped)
    assert (flipped - decode(fused=False)).abs().max().item() <= 1e-4


@needs_kernels
@pytest.mark.parametrize("kept,slot", [(0, 0), (5, 5), (7, 2), (6, -1), (40, 13)])
def test_sparse_attention_step_kernel_equals_rotation_and_sdpa(kept, slot):
    """The sparse layer's C step: q and k rotated as rope.py does, softmax attention over the kept keys
    and its own, then its key and value stored at `slot` (or nowhere), nothing else touched."""
    from glm53_flash.model.rope import RotaryEmbedding

    torch.manual_seed(kept + 3)
    batch, heads, d, capacity, position = 3, 2, 24, 48, 17
    rope = RotaryEmbedding(d, 64)
    qkv = torch.randn(batch, 1, 3 * heads * d)
    keys, values = torch.randn(batch, heads, capacity, d), torch.randn(batch, heads, capacity, d)
    before_k, before_v = keys.clone(), values.clone()
    out = ops.sparse_attention_step(qkv, keys, values, kept, slot, rope.cos[position], rope.sin[position])
    q, k, v = qkv.view(batch, 1, 3, heads, d).permute(2, 0, 3, 1, 4)
    q, k = rope(q, position), rope(k, position)
    all_k = torch.cat((before_k[:, :, :kept], k), 2)
    all_v = torch.cat((before_v[:, :, :kept], v), 2)
    expected = F.scaled_dot_product_attention(q, all_k, all_v).transpose(1, 2).reshape(batch, 1, heads * d)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    want_k, want_v = before_k.clone(), before_v.clone()
    if slot >= 0:
        want_k[:, :, slot], want_v[:, :, slot] = k[:, :, 0], v[:, :, 0]
    torch.testing.assert_close(keys, want_k, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(values, want_v, atol=0, rtol=0)


def test_one_call_decode_serves_only_what_it_was_written_for(monkeypatch):
    streams = torch.randn(4, 16, 1, 32)
    broadcast = torch.randn(16, 1, 32).unsqueeze(0).expand(4, 16, 1, 32)
    serves = ops.decode_stack_serves
    with torch.inference_mode():
        assert serves(streams) == ops.available()
        assert serves(broadcast) == ops.available()
        assert not serves(torch.randn(4, 16, 2, 32))  # two tokens per row
        assert not serves(torch.randn(4, ops.MAX_FUSED_ROWS + 1, 1, 32))
        assert not serves(torch.randn(4, 16, 1, 24))  # D % 16 != 0
        assert not serves(streams.to(torch.bfloat16))
        assert not serves(torch.randn(16, 4, 1, 32).transpose(0, 1))  # streams interleaved
        assert not serves(torch.randn(ops.LIMITS["streams"] + 1, 2, 1, 32))
    assert not serves(streams)  # gradients on
    monkeypatch.setattr(ops.library, "FUSED_DECODE", False)
    with torch.inference_mode():
        assert not serves(streams)
    kv = torch.randn(2, 4, 8, 8)
    assert ops.decode_tensors_serve(kv, kv[:, :, 0]) is False  # a strided view
    assert ops.decode_tensors_serve(kv, kv.sum(-1)) and not ops.decode_tensors_serve(kv.double())


@needs_kernels
@pytest.mark.parametrize("limit", ["rows", "sparse keys"])
def test_fused_block_decode_steps_aside_past_its_limits(monkeypatch, limit):
    """More rows than MAX_FUSED_ROWS, or more kept keys than MAX_SPARSE_KEYS in a sparse layer: the
    one-call step does not serve, and the logits still equal the eager path's."""
    cfg = g.ModelConfig(dim=32, layers=4, heads=4, expert_hidden=48, experts=4, top_k=2, sparse_window=4,
                        sparse_stride=3, max_sequence_length=32)
    torch.manual_seed(5)
    model = g.GLM53Flash(cfg).eval()
    ids = torch.randint(4, 260, (5, 20))
    monkeypatch.setattr(ops.library, "MAX_FUSED_ROWS" if limit == "rows" else "MAX_SPARSE_KEYS", 4)
    calls = []
    original = ops.DecodeStack._step  # both step and step_with_head
    monkeypatch.setattr(ops.DecodeStack, "_step", lambda *a: calls.append(1) or original(*a))
    with torch.inference_mode():
        fast, _ = _decode_logits(model, ids, 8, 5)
        monkeypatch.setattr(ops.library, "ENABLED", False)
        eager, _ = _decode_logits(model, ids, 8, 5)
    assert not calls
    assert (fast - eager).abs().max().item() <= 1e-4
