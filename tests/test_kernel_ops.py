"""Each CPU kernel as an op: random legal shapes against its plain reference beside it (ops/*.py's
`reference_*`), every public wrapper refusing what it cannot take with a clear error, and the C entry
points refusing the same sizes on their own (the second line, tested with the first bypassed), with
their output buffers untouched."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glm53_flash.model import ops

pytestmark = pytest.mark.skipif(not ops.available(), reason=f"kernels: {ops.status()['reason']}")

LEGAL = settings(max_examples=25, deadline=None)


def _close(actual, expected, inner=64):
    torch.testing.assert_close(actual, expected, atol=2e-6 * inner, rtol=2e-5)


def test_the_limits_python_checks_are_the_ones_c_holds():
    assert ops.c_limits() == ops.LIMITS
    assert ops.MAX_SPARSE_KEYS == ops.LIMITS["keys"] - 1


# ----------------------------------------------------------------------------------- random legal shapes


def _offsets(counts):
    return torch.tensor(counts, dtype=torch.int64).cumsum(0)


@LEGAL
@given(counts=st.lists(st.integers(0, 9), min_size=1, max_size=6), inner=st.sampled_from([8, 16, 40]),
       outputs=st.sampled_from([4, 12, 32]), seed=st.integers(0, 99))
def test_grouped_linear_equals_its_reference(counts, inner, outputs, seed):
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(sum(counts), inner, generator=generator)
    weight = torch.randn(len(counts), outputs, inner, generator=generator)
    offsets = _offsets(counts)
    with torch.inference_mode():
        _close(ops.grouped_linear(rows, weight, offsets), ops.reference_grouped_linear(rows, weight, offsets))


@LEGAL
@given(counts=st.lists(st.integers(0, 9), min_size=1, max_size=6), inner=st.integers(1, 40),
       outputs=st.sampled_from([16, 48, 80]), seed=st.integers(0, 99))
def test_grouped_matmul_equals_its_reference(counts, inner, outputs, seed):
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(sum(counts), inner, generator=generator)
    weight = torch.randn(len(counts), inner, outputs, generator=generator)
    offsets = _offsets(counts)
    with torch.inference_mode():
        _close(ops.grouped_matmul(rows, weight, offsets), ops.reference_grouped_matmul(rows, weight, offsets))


@LEGAL
@given(tokens=st.integers(0, 40), dim=st.sampled_from([8, 24]), experts=st.integers(1, 12), data=st.data())
def test_moe_dispatch_and_combine_equal_their_references(tokens, dim, experts, data):
    top_k = data.draw(st.integers(1, min(8, experts)))
    generator = torch.Generator().manual_seed(tokens * 100 + experts)
    x, router = torch.randn(tokens, dim, generator=generator), torch.randn(experts, dim, generator=generator)
    with torch.inference_mode():
        got = ops.moe_dispatch(x, router, top_k)
        want = ops.reference_moe_dispatch(x, router, top_k)
        for name, a, b in zip(("rows", "counts", "offsets", "position"), got[:4], want[:4]):
            assert torch.equal(a, b), name
        _close(got[4], want[4])
        expert_out = torch.randn(tokens * top_k, dim, generator=generator)
        shared = torch.randn(tokens, dim, generator=generator)
        _close(ops.moe_combine(expert_out, got[3], got[4], shared),
               ops.reference_moe_combine(expert_out, want[3], want[4], shared))


@LEGAL
@given(tokens=st.integers(0, 40), dim=st.sampled_from([8, 24, 192]), top_k=st.integers(1, 8), spare=st.integers(0, 9),
       seed=st.integers(0, 99))
def test_combine_rows_equals_its_reference_forward_and_backward(tokens, dim, top_k, spare, seed):
    generator = torch.Generator().manual_seed(seed)
    padded = tokens * top_k + spare  # rows no slot reads, as the experts' padding
    out = torch.randn(padded, dim, generator=generator).bfloat16()
    rows = torch.randperm(padded, generator=generator)[:tokens * top_k]
    gates, grad = torch.rand(tokens, top_k, generator=generator), torch.randn(tokens, dim, generator=generator)
    # the same products, rounded, then added: bit for bit up to two slots (one order of adding them), within
    # float32 rounding beyond (torch's sum over k may order its terms otherwise)
    combined, reference = ops.combine_rows_bf16(out, rows, gates), ops.reference_combine_rows(out, rows, gates)
    if top_k <= 2:
        assert torch.equal(combined, reference)
    else:
        _close(combined, reference, inner=top_k)
    grad_out, grad_gates = ops.combine_rows_bf16_backward(out, rows, gates, grad)
    leaf_out, leaf_gates = out.clone().requires_grad_(), gates.clone().requires_grad_()
    ops.reference_combine_rows(leaf_out, rows, leaf_gates).backward(grad)
    expected_out = leaf_out.grad if leaf_out.grad is not None else torch.zeros_like(out)
    assert torch.equal(grad_out, expected_out)  # the read rows' gradients, and zeros elsewhere
    if tokens:
        _close(grad_gates, leaf_gates.grad, inner=dim)  # sums over D, in another order


@LEGAL
@given(batch=st.integers(0, 5), heads=st.integers(1, 4), d=st.sampled_from([8, 16, 24]), rotate=st.booleans(),
       seed=st.integers(0, 99))
def test_linear_attention_step_equals_its_reference(batch, heads, d, rotate, seed):
    generator = torch.Generator().manual_seed(seed)
    qkv = torch.randn(batch, 1, 3 * heads * d, generator=generator)
    kv = torch.rand(batch, heads, d, d, generator=generator)
    z = torch.rand(batch, heads, d, generator=generator)
    cos, sin = (torch.randn(d, generator=generator), torch.randn(d, generator=generator)) if rotate else (None, None)
    out, new_kv, new_z = ops.reference_linear_attention_step(qkv, kv, z, cos, sin, 1e-6)
    with torch.inference_mode():
        got = ops.linear_attention_step(qkv, kv, z, cos, sin, 1e-6)  # kv and z updated in place
    _close(got, out, d)
    _close(kv, new_kv, d)
    _close(z, new_z, d)


@LEGAL
@given(batch=st.integers(0, 3), steps=st.integers(1, 40), heads=st.integers(1, 3), d=st.sampled_from([8, 24, 40]),
       rotate=st.booleans(), seed=st.integers(0, 99))
def test_linear_attention_scan_equals_its_reference_forward_and_backward(batch, steps, heads, d, rotate, seed):
    """The sequence kernels against the plain recurrence in float64: the output, each position's
    denominator, the final state, and the gradient of qkv (autograd through the reference)."""
    generator = torch.Generator().manual_seed(seed)
    qkv = torch.randn(batch, steps, 3 * heads * d, generator=generator)
    grad_out = torch.randn(batch, steps, heads * d, generator=generator)
    cos, sin = ((torch.randn(steps, d, generator=generator), torch.randn(steps, d, generator=generator)) if rotate
                else (None, None))
    wide = qkv.double().requires_grad_(True)
    out, den, kv, z = ops.reference_linear_attention_scan(wide, heads, *(None if t is None else t.double()
                                                                         for t in (cos, sin)), 1e-6)
    (grad,) = torch.autograd.grad((out * grad_out.double()).sum(), wide) if batch else (torch.zeros_like(wide),)
    got = ops.linear_attention_scan_forward(qkv, heads, cos, sin, 1e-6)
    for name, a, b in zip(("out", "den", "kv", "z"), got, (out, den, kv, z)):
        _close(a, b.float(), steps * d)
    got_grad = ops.linear_attention_scan_backward(qkv, got[0], got[1], grad_out, heads, cos, sin, 1e-6)
    _close(got_grad, grad.float(), steps * d)


def test_linear_attention_scan_is_the_same_at_any_thread_count():
    """One thread per (row, head), positions in order: the bits do not depend on the threads."""
    generator = torch.Generator().manual_seed(3)
    qkv, grad_out = torch.randn(3, 50, 3 * 4 * 24, generator=generator), torch.randn(3, 50, 4 * 24, generator=generator)
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out, den, kv, z = ops.linear_attention_scan_forward(qkv, 4, None, None, 1e-6)
            results.append((out, den, kv, z, ops.linear_attention_scan_backward(qkv, out, den, grad_out, 4, None,
                                                                                None, 1e-6)))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_linear_attention_scan_floor_stops_the_denominators_gradient():
    """Where phi(q) . z is below the floor the output is divided by the floor, a constant: the gradient
    through the denominator is zero there, as torch's clamp_min gives (q of -40 makes phi(q) ~ 4e-18)."""
    generator = torch.Generator().manual_seed(5)
    qkv = torch.randn(2, 6, 3 * 8, generator=generator)
    qkv[:, :, :8] = -40.0
    grad_out = torch.randn(2, 6, 8, generator=generator)
    wide = qkv.double().requires_grad_(True)
    out, den, _, _ = ops.reference_linear_attention_scan(wide, 1, None, None, 1e-6)
    assert bool((den < 1e-6).all())
    (want,) = torch.autograd.grad((out * grad_out.double()).sum(), wide)
    got = ops.linear_attention_scan_forward(qkv, 1, None, None, 1e-6)
    torch.testing.assert_close(ops.linear_attention_scan_backward(qkv, got[0], got[1], grad_out, 1, None, None, 1e-6),
                               want.float(), atol=1e-6, rtol=1e-4)


@LEGAL
@given(batch=st.integers(0, 3), heads=st.integers(1, 3), d=st.sampled_from([8, 32]), capacity=st.integers(1, 12),
       data=st.data())
def test_sparse_attention_step_equals_its_reference(batch, heads, d, capacity, data):
    kept = data.draw(st.integers(0, capacity))
    slot = data.draw(st.integers(-1, capacity - 1))
    generator = torch.Generator().manual_seed(capacity * 10 + kept)
    qkv = torch.randn(batch, 1, 3 * heads * d, generator=generator)
    keys = torch.randn(batch, heads, capacity, d, generator=generator)
    values = torch.randn(batch, heads, capacity, d, generator=generator)
    cos, sin = torch.randn(d, generator=generator), torch.randn(d, generator=generator)
    out, new_keys, new_values = ops.reference_sparse_attention_step(qkv, keys, values, kept, slot, cos, sin)
    with torch.inference_mode():
        got = ops.sparse_attention_step(qkv, keys, values, kept, slot, cos, sin)
    _close(got, out, d)
    _close(keys, new_keys, d)
    _close(values, new_values, d)


def _block_weights(generator, streams, dim, hidden, experts):
    def rand(*shape):
        return torch.randn(*shape, generator=generator) / shape[-1] ** 0.5

    return dict(output_logits=torch.randn(streams, generator=generator), out_weight=rand(dim, dim),
                norm_weight=1 + 0.1 * torch.randn(dim, generator=generator), router=rand(experts, dim),
                gate_up=rand(experts, 2 * hidden, dim), down=rand(experts, hidden, dim),
                shared_up=rand(2 * hidden, dim), shared_down=rand(dim, hidden))


@LEGAL
@given(streams=st.integers(1, 4), batch=st.integers(1, 6), dim=st.sampled_from([16, 32]), hidden=st.sampled_from([8, 24]),
       experts=st.integers(1, 6), double_residual=st.booleans(), broadcast=st.booleans(), data=st.data())
def test_block_decode_calls_equal_their_references(streams, batch, dim, hidden, experts, double_residual, broadcast,
                                                   data):
    top_k = data.draw(st.integers(1, min(2, experts)))
    generator = torch.Generator().manual_seed(streams * 1000 + batch * 10 + experts)
    state = (torch.randn(1, batch, 1, dim, generator=generator).expand(streams, -1, -1, -1) if broadcast
             else torch.randn(streams, batch, 1, dim, generator=generator))
    logits, norm, qkv_weight = torch.randn(streams, generator=generator), torch.rand(dim) + 0.5, torch.randn(3 * dim, dim)
    with torch.inference_mode():
        mixed, qkv = ops.decode_attention_in(state, logits, norm, 1e-6, qkv_weight)
    want_mixed, want_qkv = ops.reference_decode_attention_in(state, logits, norm, 1e-6, qkv_weight)
    _close(mixed, want_mixed, dim)
    _close(qkv, want_qkv, dim)
    weights = _block_weights(generator, streams, dim, hidden, experts)
    attn = torch.randn(batch, 1, dim, generator=generator)
    arguments = dict(streams=state, double_residual=double_residual, attn=attn, mixed=want_mixed, eps=1e-6,
                     top_k=top_k, **weights)
    with torch.inference_mode():
        new_streams, counts = ops.decode_moe_out(**arguments)
    want_streams, want_counts = ops.reference_decode_moe_out(**arguments)
    assert torch.equal(counts, want_counts)
    _close(new_streams, want_streams, dim)


@pytest.mark.skipif(not ops.available(), reason="no C kernels on this machine")
@pytest.mark.parametrize("batch,dim,hidden,experts", [(1, 16, 8, 1), (5, 32, 24, 4), (16, 48, 40, 6)])
def test_block_decode_calls_on_bf16_weights_equal_float32_on_the_rounded_weights(batch, dim, hidden, experts):
    """The bf16 weight path reads half the bytes and changes nothing else: each call on bf16 weights
    equals, bit for bit, the float32 call on the same weights rounded to bf16 (float32 arithmetic in
    the same order); the router and the norms stay float32. dim 48 also runs the 8-float tail."""
    generator = torch.Generator().manual_seed(batch * 7 + dim)
    streams = torch.randn(4, batch, 1, dim, generator=generator)
    logits, norm = torch.randn(4, generator=generator), torch.rand(dim, generator=generator) + 0.5
    qkv_weight = torch.randn(3 * dim, dim, generator=generator) / dim ** 0.5
    rounded = qkv_weight.bfloat16().float()
    assert not torch.equal(rounded, qkv_weight)  # the rounding changes the weights: the equality below is not trivial
    with torch.inference_mode():
        mixed, qkv = ops.decode_attention_in(streams, logits, norm, 1e-6, qkv_weight.bfloat16())
        want_mixed, want_qkv = ops.decode_attention_in(streams, logits, norm, 1e-6, rounded)
        assert torch.equal(mixed, want_mixed) and torch.equal(qkv, want_qkv)
        weights = _block_weights(generator, 4, dim, hidden, experts)
        products = ("out_weight", "gate_up", "down", "shared_up", "shared_down")
        arguments = dict(streams=streams, double_residual=False, attn=torch.randn(batch, 1, dim, generator=generator),
                         mixed=mixed, eps=1e-6, top_k=min(2, experts), **weights)
        on_bf16 = ops.decode_moe_out(**{**arguments, **{k: weights[k].bfloat16() for k in products}})
        on_rounded = ops.decode_moe_out(**{**arguments, **{k: weights[k].bfloat16().float() for k in products}})
        on_float = ops.decode_moe_out(**arguments)
    assert torch.equal(on_bf16[0], on_rounded[0]) and torch.equal(on_bf16[1], on_rounded[1])
    assert not torch.equal(on_bf16[0], on_float[0])  # and it is not the float32 weights' result
    with pytest.raises(ops.KernelArgumentError, match="must all be float32 or all bf16"):
        ops.decode_moe_out(**{**arguments, "down": weights["down"].bfloat16()})
    with pytest.raises(ops.KernelArgumentError, match="router"):  # the router is not a weight product here
        ops.decode_moe_out(**{**arguments, "router": weights["router"].bfloat16()})


# ----------------------------------------------------------------------------------- refused by the wrappers


def _legal_calls():
    """Each public wrapper with legal arguments (as a dict), to be spoilt one argument at a time."""
    streams, batch, dim, hidden, experts = 2, 3, 16, 8, 4
    generator = torch.Generator().manual_seed(0)
    return {
        "grouped_linear": (ops.grouped_linear, dict(rows=torch.randn(5, 16), weight=torch.randn(2, 8, 16),
                                                       offsets=_offsets([2, 3]))),
        "grouped_matmul": (ops.grouped_matmul, dict(rows=torch.randn(5, 8), weight=torch.randn(2, 8, 16),
                                                       offsets=_offsets([2, 3]))),
        "moe_dispatch": (ops.moe_dispatch, dict(x=torch.randn(5, 16), router=torch.randn(4, 16), top_k=2)),
        "moe_combine": (ops.moe_combine, dict(expert_out=torch.randn(10, 16), position=torch.arange(10),
                                                 gates=torch.rand(5, 2), shared=torch.randn(5, 16))),
        "combine_rows_bf16": (ops.combine_rows_bf16, dict(out=torch.randn(12, 16).bfloat16(), rows=torch.arange(10),
                                                         gates=torch.rand(5, 2))),
        "combine_rows_bf16_backward": (ops.combine_rows_bf16_backward, dict(
            out=torch.randn(12, 16).bfloat16(), rows=torch.arange(10), gates=torch.rand(5, 2), grad=torch.randn(5, 16))),
        "linear_attention_step": (ops.linear_attention_step, dict(
            qkv=torch.randn(2, 1, 48), kv=torch.rand(2, 2, 8, 8), z=torch.rand(2, 2, 8), cos=None, sin=None,
            floor=1e-6)),
        "linear_attention_scan_forward": (ops.linear_attention_scan_forward, dict(
            qkv=torch.randn(2, 5, 48), heads=2, cos=None, sin=None, floor=1e-6)),
        "linear_attention_scan_backward": (ops.linear_attention_scan_backward, dict(
            qkv=torch.randn(2, 5, 48), out=torch.randn(2, 5, 16), den=torch.rand(2, 2, 5), grad_out=torch.randn(2, 5, 16),
            heads=2, cos=torch.randn(5, 8), sin=torch.randn(5, 8), floor=1e-6)),
        "sparse_attention_step": (ops.sparse_attention_step, dict(
            qkv=torch.randn(2, 1, 48), keys=torch.randn(2, 2, 6, 8), values=torch.randn(2, 2, 6, 8), kept=3, slot=3,
            cos=torch.randn(8), sin=torch.randn(8))),
        "swiglu_forward": (ops.swiglu_forward, dict(h=torch.randn(3, 16))),
        "swiglu_backward": (ops.swiglu_backward, dict(h=torch.randn(3, 16), grad_out=torch.randn(3, 8))),
        "rms_norm_forward": (ops.rms_norm_forward, dict(x=torch.randn(3, 16), weight=torch.ones(16), eps=1e-6)),
        "rms_norm_backward": (ops.rms_norm_backward, dict(x=torch.randn(3, 16), weight=torch.ones(16),
                                                             rstd=torch.ones(3), grad_out=torch.randn(3, 16))),
        "decode_attention_in": (ops.decode_attention_in, dict(
            streams=torch.randn(streams, batch, 1, dim), input_logits=torch.randn(streams), norm_weight=torch.ones(dim),
            eps=1e-6, qkv_weight=torch.randn(3 * dim, dim))),
        "decode_moe_out": (ops.decode_moe_out, dict(
            streams=torch.randn(streams, batch, 1, dim), double_residual=True, attn=torch.randn(batch, 1, dim),
            mixed=torch.randn(batch, 1, dim), eps=1e-6, top_k=2, **_block_weights(generator, streams, dim, hidden,
                                                                                   experts))),
    }


# (op, argument, its spoilt value, words the error must contain)
SPOILT = [
    ("grouped_linear", "weight", torch.randn(2, 6, 16), "multiple of 4"),
    ("grouped_linear", "rows", torch.randn(5, 12), "columns"),
    ("grouped_linear", "offsets", _offsets([2, 2]), "refused"),           # ends short of the rows: C's check
    ("grouped_linear", "offsets", torch.tensor([3, 2]), "refused"),        # decreasing
    ("grouped_linear", "offsets", _offsets([2, 3]).int(), "torch.int64"),
    ("grouped_matmul", "weight", torch.randn(2, 8, 24), "multiple of 16"),
    ("grouped_matmul", "offsets", torch.tensor([-1, 5]), "refused"),
    ("moe_dispatch", "router", torch.randn(65, 16), "experts"),
    ("moe_dispatch", "top_k", 9, "top_k"),
    ("moe_dispatch", "top_k", 5, "top_k"),                                 # more than the 4 experts
    ("moe_dispatch", "top_k", 0, "top_k"),
    ("moe_dispatch", "x", torch.randn(5, 12), "multiple of 8"),
    ("moe_dispatch", "x", torch.randn(2049, 16), "routed slots"),
    ("moe_dispatch", "x", torch.randn(5, 16, dtype=torch.float64), "float32"),
    ("moe_combine", "position", torch.arange(10) + 1, "refused"),          # a slot past the rows
    ("moe_combine", "gates", torch.rand(5, 9), "top_k"),
    ("moe_combine", "expert_out", torch.randn(9, 16), "shape"),
    ("combine_rows_bf16", "rows", torch.arange(10) + 3, "refused"),       # a slot past the rows: C's check
    ("combine_rows_bf16", "rows", torch.arange(9), "shape"),
    ("combine_rows_bf16", "rows", torch.arange(10).int(), "torch.int64"),
    ("combine_rows_bf16", "out", torch.randn(12, 16), "bfloat16"),
    ("combine_rows_bf16", "out", torch.randn(12, 12).bfloat16(), "multiple of 8"),
    ("combine_rows_bf16", "gates", torch.rand(5, 9), "top_k"),
    ("combine_rows_bf16_backward", "rows", torch.arange(10) - 1, "refused"),
    ("combine_rows_bf16_backward", "grad", torch.randn(5, 8), "shape"),
    ("linear_attention_step", "z", torch.rand(2, 2, 264), "head size"),
    ("linear_attention_step", "kv", torch.rand(2, 2, 8, 4), "shape"),
    ("linear_attention_step", "cos", torch.randn(8), "together"),
    ("linear_attention_scan_forward", "qkv", torch.randn(2, 5, 36), "multiple of 8"),
    ("linear_attention_scan_forward", "heads", 5, "3 x heads"),
    ("linear_attention_scan_forward", "qkv", torch.randn(2, 5, 3 * 264), "head size"),
    ("linear_attention_scan_forward", "qkv", torch.randn(2, 5, 96)[:, :, ::2], "contiguous"),
    ("linear_attention_scan_forward", "qkv", torch.randn(2, 5, 48, dtype=torch.float64), "float32"),
    ("linear_attention_scan_forward", "cos", torch.randn(5, 8), "together"),
    ("linear_attention_scan_backward", "cos", torch.randn(4, 8), "shape"),
    ("linear_attention_scan_backward", "den", torch.rand(2, 5, 2), "shape"),
    ("linear_attention_scan_backward", "out", torch.randn(2, 5, 8), "shape"),
    ("linear_attention_scan_backward", "grad_out", torch.randn(2, 4, 16), "shape"),
    ("sparse_attention_step", "kept", 7, "kept"),
    ("sparse_attention_step", "kept", -1, "kept"),
    ("sparse_attention_step", "slot", 6, "slot"),
    ("sparse_attention_step", "slot", -2, "slot"),
    ("sparse_attention_step", "keys", torch.randn(2, 2, 6, 264), "head size"),
    ("sparse_attention_step", "values", torch.randn(2, 2, 5, 8), "shape"),
    ("sparse_attention_step", "qkv", torch.randn(2, 1, 96)[:, :, ::2], "contiguous"),
    ("swiglu_forward", "h", torch.randn(3, 12), "multiple of 16"),
    ("swiglu_backward", "grad_out", torch.randn(3, 4), "shape"),
    ("rms_norm_forward", "weight", torch.ones(8), "shape"),
    ("rms_norm_forward", "x", torch.randn(3, 12), "multiple of 8"),
    ("rms_norm_backward", "rstd", torch.ones(4), "shape"),
    ("decode_attention_in", "streams", torch.randn(65, 3, 1, 16), "streams"),
    ("decode_attention_in", "streams", torch.randn(2, 3, 2, 16), "[S, B, 1, D]"),
    ("decode_attention_in", "qkv_weight", torch.randn(48, 8), "shape"),
    ("decode_moe_out", "top_k", 5, "top_k"),
    ("decode_moe_out", "streams", torch.randn(2, 3, 1, 8), "multiple of 16"),
    ("decode_moe_out", "shared_down", torch.randn(16, 16), "shape"),
    ("decode_moe_out", "router", torch.randn(4, 16, dtype=torch.float64), "float32"),
]


def test_every_public_wrapper_is_spoilt_somewhere():
    assert {op for op, *_ in SPOILT} == set(_legal_calls())


@pytest.mark.parametrize("op", sorted(_legal_calls()))
def test_the_legal_calls_go_through(op):
    function, arguments = _legal_calls()[op]
    with torch.inference_mode():
        function(**arguments)


@pytest.mark.parametrize("op,argument,value,words", SPOILT, ids=[f"{s[0]}-{s[1]}-{i}" for i, s in enumerate(SPOILT)])
def test_wrappers_refuse_what_they_cannot_take(op, argument, value, words):
    function, arguments = _legal_calls()[op]
    arguments[argument] = value
    with torch.inference_mode(), pytest.raises(ops.KernelArgumentError, match=op) as caught:
        function(**arguments)
    assert words in str(caught.value)


# ----------------------------------------------------------------------------------- refused by C alone


def _c(name):
    return getattr(ops.library._required(), "glm53_" + name)


def _p(tensor):
    return tensor.data_ptr()


def test_c_refuses_out_of_range_sizes_without_touching_memory():
    """The entry points called directly, as a caller that skips the Python checks would: each oversized
    or malformed size returns OUT_OF_RANGE, and the output buffer keeps its sentinel."""
    sentinel = 12345.0
    out = torch.full((4096 * 16,), sentinel)
    x, w = torch.randn(4096 * 16), torch.randn(4096 * 16)
    ints = torch.zeros(8192, dtype=torch.int64)
    offsets = torch.tensor([4, 2], dtype=torch.int64)
    refused = {
        "linear k % 8": _c("linear")(_p(x), _p(w), _p(out), 2, 4, 12),
        "grouped_linear offsets decreasing": _c("grouped_linear")(_p(x), _p(w), _p(offsets), _p(out), 2, 2, 4, 8),
        "grouped_matmul n % 16": _c("grouped_matmul")(_p(x), _p(w), _p(ints), _p(out), 0, 1, 8, 8),
        "moe_dispatch 65 experts": _c("moe_dispatch")(_p(x), _p(w), 2, 8, 65, 2, _p(out), _p(ints), _p(ints),
                                                      _p(ints), _p(out)),
        "moe_dispatch top_k 9": _c("moe_dispatch")(_p(x), _p(w), 2, 8, 16, 9, _p(out), _p(ints), _p(ints),
                                                   _p(ints), _p(out)),
        "moe_dispatch 4097 slots": _c("moe_dispatch")(_p(x), _p(w), 4097, 8, 8, 1, _p(out), _p(ints), _p(ints),
                                                      _p(ints), _p(out)),
        "moe_combine position": _c("moe_combine")(_p(x), _p(torch.tensor([0, 7])), _p(x), _p(x), _p(out), 1, 8, 2),
        "combine_rows row past the rows": _c("moe_combine_rows_bf16")(_p(x), _p(torch.tensor([0, 4])), _p(x), _p(out),
                                                                      1, 8, 2, 4),
        "combine_rows backward negative row": _c("moe_combine_rows_bf16_backward")(
            _p(x), _p(torch.tensor([-1, 0])), _p(x), _p(x), _p(out), _p(out), 1, 8, 2, 4),
        "combine_rows dim 12": _c("moe_combine_rows_bf16")(_p(x), _p(torch.tensor([0, 1])), _p(x), _p(out), 1, 12, 2, 4),
        "linear_attention_step d 264": _c("linear_attention_step")(_p(x), _p(w), _p(w), _p(out), 1, 1, 264, None,
                                                                   None, 1e-6),
        "linear_attention_scan_forward d 12": _c("linear_attention_scan_forward")(
            _p(x), _p(out), _p(out), _p(out), _p(out), _p(out), 1, 4, 1, 12, None, None, 1e-6),
        "linear_attention_scan_forward d 264": _c("linear_attention_scan_forward")(
            _p(x), _p(out), _p(out), _p(out), _p(out), _p(out), 1, 4, 1, 264, None, None, 1e-6),
        "linear_attention_scan_forward cos alone": _c("linear_attention_scan_forward")(
            _p(x), _p(out), _p(out), _p(out), _p(out), _p(out), 1, 4, 1, 8, _p(x), None, 1e-6),
        "linear_attention_scan_backward 0 heads": _c("linear_attention_scan_backward")(
            _p(x), _p(x), _p(x), _p(x), _p(out), _p(out), _p(out), 1, 4, 0, 8, None, None, 1e-6),
        "linear_attention_scan_backward steps -1": _c("linear_attention_scan_backward")(
            _p(x), _p(x), _p(x), _p(x), _p(out), _p(out), _p(out), 1, -1, 1, 8, None, None, 1e-6),
        "swiglu hidden % 8": _c("swiglu_forward")(_p(x), _p(out), 2, 4),
        "rms_norm dim 0": _c("rms_norm_forward")(_p(x), _p(w), _p(out), None, 2, 0, 1e-6),
        "sparse 4096 kept keys": _c("sparse_attention_step")(_p(x), _p(w), _p(w), 5000, 4096, -1, 1, 1, 8, _p(x),
                                                             _p(x), _p(out)),
        "sparse slot past capacity": _c("sparse_attention_step")(_p(x), _p(w), _p(w), 4, 2, 4, 1, 1, 8, _p(x),
                                                                 _p(x), _p(out)),
        "decode_attention_in 65 streams": _c("decode_attention_in")(_p(x), 16, 65, 1, 16, _p(x), _p(w), 1e-6, _p(w),
                                                                    0, _p(out), _p(out)),
        "decode_attention_in stride": _c("decode_attention_in")(_p(x), 7, 2, 1, 16, _p(x), _p(w), 1e-6, _p(w),
                                                                0, _p(out), _p(out)),
        "decode_attention_in weight type 2": _c("decode_attention_in")(_p(x), 16, 1, 1, 16, _p(x), _p(w), 1e-6,
                                                                       _p(w), 2, _p(out), _p(out)),
        "decode_moe_out 2048 x 4 slots": _c("decode_moe_out")(
            _p(x), 0, 1, 2048, 16, _p(x), 1, _p(x), _p(w), _p(x), _p(w), 1e-6, _p(w), 8, 4, _p(w), _p(w), 8, _p(w),
            _p(w), 0, _p(ints), _p(out)),
        "decode_moe_out weight type -1": _c("decode_moe_out")(
            _p(x), 0, 1, 2, 16, _p(x), 1, _p(x), _p(w), _p(x), _p(w), 1e-6, _p(w), 8, 2, _p(w), _p(w), 8, _p(w),
            _p(w), -1, _p(ints), _p(out)),
    }
    assert {what: code for what, code in refused.items() if code != ops.library.OUT_OF_RANGE} == {}
    assert bool((out == sentinel).all())


def test_a_c_refusal_reaches_the_caller_as_an_error(monkeypatch):
    """Where the wrapper's own checks are skipped, C's status still becomes a KernelArgumentError."""
    monkeypatch.setattr(ops.grouped, "_check_grouped", lambda *a: None)
    with pytest.raises(ops.KernelArgumentError, match="kernels.c refused"):
        ops.grouped_linear(torch.randn(5, 16), torch.randn(2, 8, 16), torch.tensor([2, 9]))


def test_dispatch_switches_are_recorded_in_receipts(monkeypatch):
    from glm53_flash.core.receipts import provenance
    from glm53_flash.model.ops import dispatch

    monkeypatch.setattr(ops.experts, "PADDED_ENABLED", False)
    monkeypatch.setattr(ops.linear_attention, "SCAN_ENABLED", False)
    monkeypatch.setenv("GLM53_KERNEL_ISA", "avx2")
    record = provenance()["kernel_switches"]
    assert record == dispatch.dispatch_record()
    assert set(record) == {"enabled", "fused_decode", "grouped_mm", "padded", "linear_scan", "environment"}
    assert record["padded"] is False and record["linear_scan"] is False
    assert record["environment"]["GLM53_KERNEL_ISA"] == "avx2"
    assert set(record["environment"]) == {name for name in dispatch.SWITCHES if name.startswith("GLM53_")}
    assert provenance()["decode_kernels"] == ops.status()  # this module has looked for the library


# ----------------------------------------------------------------------------------- the one-call decode step


def _stack_case(generator, *, streams=3, batch=4, dim=32, heads=4, hidden=24, experts=4, layers=("linear", "rotate",
                                                                                                   "sparse")):
    """A random stack's layers (DecodeStack's dicts) and states: a linear layer, a linear layer that rotates
    first, a sparse layer with kept keys and room for more."""
    def rand(*shape):
        return torch.randn(*shape, generator=generator) / shape[-1] ** 0.5

    d = dim // heads
    stack, states = [], []
    for kind in layers:
        weights = _block_weights(generator, streams, dim, hidden, experts)
        stack.append(dict(sparse=kind == "sparse", rotate=kind == "rotate",
                          input_logits=torch.randn(streams, generator=generator),
                          attn_norm=1 + 0.1 * torch.randn(dim, generator=generator), qkv_weight=rand(3 * dim, dim),
                          output_logits=weights["output_logits"], out_weight=weights["out_weight"],
                          moe_norm=weights["norm_weight"], router=weights["router"], gate_up=weights["gate_up"],
                          down=weights["down"], shared_up=weights["shared_up"], shared_down=weights["shared_down"]))
        if kind == "sparse":
            states.append([torch.randn(batch, heads, 12, d, generator=generator),
                           torch.randn(batch, heads, 12, d, generator=generator), 9, 4])
        else:
            states.append([torch.rand(batch, heads, d, d, generator=generator),
                           torch.rand(batch, heads, d, generator=generator) + 1])
    return stack, states


def _pieces(stack, states, streams, cos, sin, heads, top_k, double_residual, eps, floor):
    """The stack as its three pieces per layer, called one layer at a time (what the model ran before the
    one-call step): the streams and counts, the states updated in place."""
    counts = []
    for layer, state in zip(stack, states):
        mixed, qkv = ops.decode_attention_in(streams, layer["input_logits"], layer["attn_norm"], eps,
                                             layer["qkv_weight"])
        if layer["sparse"]:
            keys, values, kept, slot = state
            attn = ops.sparse_attention_step(qkv, keys, values, kept, slot, cos, sin)
        else:
            rotate = layer["rotate"]
            attn = ops.linear_attention_step(qkv, state[0], state[1], cos if rotate else None,
                                             sin if rotate else None, floor)
        streams, used = ops.decode_moe_out(streams, layer["output_logits"], double_residual, attn, layer["out_weight"],
                                           mixed, layer["moe_norm"], eps, layer["router"], top_k, layer["gate_up"],
                                           layer["down"], layer["shared_up"], layer["shared_down"])
        counts.append(used)
    return streams, torch.stack(counts)


def _copy_states(states):
    return [[part.clone() if isinstance(part, torch.Tensor) else part for part in state] for state in states]


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("double_residual,broadcast,slot", [(True, True, 4), (False, False, 9), (True, False, -1)])
def test_the_one_call_decode_step_equals_its_pieces_layer_by_layer_bit_for_bit(bf16, double_residual, broadcast,
                                                                                slot):
    """DecodeStack runs every layer's decode_attention_in, attention step and decode_moe_out in one C call:
    its streams, routed counts and every state it updates (a linear layer's kv and z in place, a sparse
    layer's key and value stored at `slot`: a reused slot, the end, or nowhere) equal those three ops
    called layer by layer, bit for bit, on float32 weights and on bf16 ones."""
    generator = torch.Generator().manual_seed(11 + slot)
    heads, top_k, eps, floor = 4, 2, 1e-6, 1e-6
    stack, states = _stack_case(generator)
    states[2][3] = slot
    if bf16:
        stack = [{name: value.bfloat16() if name in ops.PRODUCT_WEIGHTS else value for name, value in layer.items()}
                 for layer in stack]
    streams = (torch.randn(1, 4, 1, 32, generator=generator).expand(3, -1, -1, -1) if broadcast
               else torch.randn(3, 4, 1, 32, generator=generator))
    cos, sin = torch.rand(8, generator=generator), torch.rand(8, generator=generator)
    theirs = _copy_states(states)
    with torch.inference_mode():
        decode = ops.DecodeStack(stack, heads=heads, top_k=top_k, double_residual=double_residual, eps=eps, floor=floor)
        assert decode.bf16 == bf16
        weights_table = list(decode.table)
        new_streams, counts = decode.step(streams, states, cos, sin)
        assert list(decode.table) == weights_table  # a step fills a copy: threads can share a stack
        want_streams, want_counts = _pieces(stack, theirs, streams, cos, sin, heads, top_k, double_residual, eps, floor)
    assert torch.equal(new_streams, want_streams) and torch.equal(counts, want_counts)
    for mine, other in zip(states, theirs):
        assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(mine, other))
    assert not torch.equal(new_streams, streams.expand_as(new_streams))  # the layers did something


@pytest.mark.parametrize("bf16", [False, True])
def test_the_one_call_decode_steps_head_equals_the_norm_and_head_ops_bit_for_bit(bf16):
    """With a head, the same call also gives the final norm of the streams' mean and its logits: the
    streams and counts are `step`'s, the hidden state is ops.rms_norm of torch's mean over the streams and
    the logits ops.linear of it, bit for bit (the norm's and head's weights float32 in both precisions);
    its wrapper refuses a head it cannot take and more rows than ops.rms_norm and ops.linear serve."""
    generator = torch.Generator().manual_seed(17)
    stack, states = _stack_case(generator)
    if bf16:
        stack = [{name: value.bfloat16() if name in ops.PRODUCT_WEIGHTS else value for name, value in layer.items()}
                 for layer in stack]
    head = {"norm": torch.rand(32, generator=generator) + 0.5, "eps": 1e-5,
            "weight": torch.randn(37, 32, generator=generator)}
    options = dict(heads=4, top_k=2, double_residual=True, eps=1e-6, floor=1e-6)
    streams = torch.randn(3, 4, 1, 32, generator=generator)
    cos, sin = torch.rand(8, generator=generator), torch.rand(8, generator=generator)
    theirs = _copy_states(states)
    with torch.inference_mode():
        plain = ops.DecodeStack(stack, **options)
        headed = ops.DecodeStack(stack, **options, head=head)
        assert not plain.head_serves(4) and headed.head_serves(4) and not headed.head_serves(ops.MAX_ROWS + 1)
        want_streams, want_counts = plain.step(streams, theirs, cos, sin)
        new_streams, counts, hidden, logits = headed.step_with_head(streams, states, cos, sin)
        want_hidden = ops.rms_norm(want_streams.mean(dim=0), head["norm"], head["eps"])
        want_logits = ops.linear(want_hidden, head["weight"])
        with pytest.raises(ops.KernelArgumentError, match="the head serves a stack built with one"):
            plain.step_with_head(streams, _copy_states(theirs), cos, sin)
    assert torch.equal(new_streams, want_streams) and torch.equal(counts, want_counts)
    assert hidden.shape == (4, 1, 32) and logits.shape == (4, 1, 37)
    assert torch.equal(hidden.view(torch.int32), want_hidden.view(torch.int32))
    assert torch.equal(logits.view(torch.int32), want_logits.view(torch.int32))
    for changed, match in (({"weight": head["weight"].t().contiguous()}, "head: weight has shape"),
                           ({"weight": head["weight"].t().contiguous().t()}, "head: weight must be contiguous"),
                           ({"weight": head["weight"][0]}, r"head: weight must be \[V, D\]"),
                           ({"norm": head["norm"].double()}, "head: norm must be torch.float32"),
                           ({"weight": torch.randn(37, 16)}, "head: weight has shape")):
        with pytest.raises(ops.KernelArgumentError, match=match):
            ops.DecodeStack(stack, **options, head={**head, **changed})


def test_the_streams_mean_in_c_is_torchs_bit_for_bit():
    """The head's mean over the streams (kernels.c decode_head: summed in order from zero, then divided) gives
    torch's mean over the first dimension bit for bit, for every stream count up to HEAD_MAX_STREAMS and
    rows up to library.MAX_ROWS (checked through a one-layer stack whose output the test reads back); a
    stack of more streams takes no head."""
    generator = torch.Generator().manual_seed(5)
    head = {"norm": torch.ones(32), "eps": 0.0, "weight": torch.eye(32)}
    for n_streams in range(1, ops.HEAD_MAX_STREAMS + 1):
        for rows in (1, 5, ops.MAX_ROWS):
            stack, _ = _stack_case(generator, streams=n_streams)
            headed = ops.DecodeStack(stack[:1], heads=4, top_k=2, double_residual=True, eps=1e-6, floor=1e-6,
                                     head=head)
            states = [[torch.randn(rows, 4, 8, 8, generator=generator), torch.rand(rows, 4, 8, generator=generator)]]
            streams = torch.randn(n_streams, rows, 1, 32, generator=generator) * 3
            with torch.inference_mode():
                new_streams, _, hidden, logits = headed.step_with_head(streams, states, torch.rand(8), torch.rand(8))
                want = ops.rms_norm(new_streams.mean(dim=0), torch.ones(32), 0.0)
            assert torch.equal(hidden.view(torch.int32), want.view(torch.int32)), (n_streams, rows)
    # more streams than torch sums in order: no head
    stack, _ = _stack_case(generator, streams=ops.HEAD_MAX_STREAMS + 1)
    with pytest.raises(ops.KernelArgumentError, match=f"at most {ops.HEAD_MAX_STREAMS} streams"):
        ops.DecodeStack(stack[:1], heads=4, top_k=2, double_residual=True, eps=1e-6, floor=1e-6, head=head)


def test_the_one_call_decode_step_refuses_what_it_cannot_take():
    """Its wrapper checks each weight once (shapes, one dtype for the products, float32 elsewhere) and every
    step's streams and states, with the op, the layer and the rule in the message; nothing runs on refusal."""
    generator = torch.Generator().manual_seed(3)
    stack, states = _stack_case(generator)
    streams = torch.randn(3, 4, 1, 32, generator=generator)
    cos, sin = torch.rand(8), torch.rand(8)
    options = dict(heads=4, top_k=2, double_residual=True, eps=1e-6, floor=1e-6)

    def refused(match, layers=None, **changed):
        with pytest.raises(ops.KernelArgumentError, match=match):
            ops.DecodeStack(stack if layers is None else layers, **{**options, **changed})

    refused("no layers", layers=[])
    refused("must all be float32 or all bf16", layers=[stack[0], {**stack[1], "down": stack[1]["down"].bfloat16()}])
    refused("layer 1: router", layers=[stack[0], {**stack[1], "router": stack[1]["router"].bfloat16()}])
    refused("layer 2: shared_down has shape", layers=[*stack[:2], {**stack[2], "shared_down": torch.randn(32, 8)}])
    refused("layer 0: qkv_weight must be contiguous", layers=[{**stack[0], "qkv_weight": torch.randn(32, 96).t()}])
    refused("head size", heads=3)
    refused("top_k", top_k=5)
    decode = ops.DecodeStack(stack, **options)
    before = _copy_states(states)

    def step_refused(match, streams=streams, states=states, cos=cos, sin=sin):
        with pytest.raises(ops.KernelArgumentError, match=match):
            with torch.inference_mode():
                decode.step(streams, states, cos, sin)

    step_refused("S = 2, D = 32", streams=streams[:2])
    step_refused("2 layer states for 3 layers", states=states[:2])
    step_refused("layer 0: kv has shape", states=[[states[0][0][:, :, :4].contiguous(), states[0][1]], *states[1:]])
    step_refused("layer 0: kv must be contiguous", states=[[states[0][0].transpose(2, 3), states[0][1]], *states[1:]])
    step_refused("layer 2: kept = 13", states=[*states[:2], [*states[2][:2], 13, 4]])
    step_refused("layer 2: slot = 12", states=[*states[:2], [*states[2][:2], 9, 12]])
    step_refused("layer 2: values", states=[*states[:2], [states[2][0], states[2][1][:, :, :6], 9, 4]])
    step_refused("cos", cos=torch.rand(16))
    assert all(torch.equal(a, b) for mine, old in zip(states, before) for a, b in zip(mine[:2], old[:2]))


def test_the_one_call_decode_steps_c_entry_refuses_on_its_own():
    """glm53_decode_stack checks its sizes and each layer's fields before any layer runs (the wrapper
    bypassed): an unknown layer kind, a missing pointer, a sparse layer's kept keys or slot outside its
    buffer, rotation without the tables, and the number of fields is the one ops.LAYER_FIELDS names."""
    import ctypes

    library = ops.library._required()
    assert library.glm53_layer_fields() == len(ops.LAYER_FIELDS)
    generator = torch.Generator().manual_seed(4)
    stack, states = _stack_case(generator)
    decode = ops.DecodeStack(stack, heads=4, top_k=2, double_residual=True, eps=1e-6, floor=1e-6)
    streams = torch.randn(3, 4, 1, 32, generator=generator)
    cos, sin = torch.rand(8), torch.rand(8)
    fields = {name: index for index, name in enumerate(ops.LAYER_FIELDS)}
    out = torch.full((3, 4, 1, 32), 7.0)
    counts = torch.zeros(3, 4, dtype=torch.int64)
    width = len(ops.LAYER_FIELDS)
    legal = (ctypes.c_int64 * len(decode.table))(*decode.table)  # the weights' fields, then a step's legal states
    for index, (keys_or_kv, values_or_z, *sparse) in enumerate(states):
        legal[index * width + fields["state_a"]], legal[index * width + fields["state_b"]] = (
            keys_or_kv.data_ptr(), values_or_z.data_ptr())
        if sparse:
            legal[index * width + fields["capacity"]] = keys_or_kv.shape[2]
            legal[index * width + fields["kept"]], legal[index * width + fields["slot"]] = sparse
    norm, table_w = torch.rand(32), torch.randn(11, 32)
    hidden, logits = torch.full((4, 32), 7.0), torch.full((4, 11), 7.0)
    no_head = (None, 0.0, None, 0, None, None)
    head = (norm.data_ptr(), 1e-6, table_w.data_ptr(), 11, hidden.data_ptr(), logits.data_ptr())
    for legal_head in (no_head, head):
        assert ops.library._required().glm53_decode_stack(  # legal as it is: the refusals below are the changes'
            ctypes.addressof(legal), 3, streams.data_ptr(), 4 * 32, 3, 4, 32, 4, 4, 2, 24, 1, 0, 1e-6, 1e-6,
            cos.data_ptr(), sin.data_ptr(), counts.data_ptr(), torch.empty(3, 4, 1, 32).data_ptr(),
            *legal_head) == ops.library.OK
    assert bool((hidden != 7.0).all()) and bool((logits != 7.0).all())  # the head wrote both
    hidden.fill_(7.0), logits.fill_(7.0)

    def status(layer=None, field=None, value=None, with_tables=True, layers=3, head=no_head):
        table = (ctypes.c_int64 * len(legal))(*legal)
        if layer is not None:
            table[layer * width + fields[field]] = value
        return ops.library._required().glm53_decode_stack(
            ctypes.addressof(table), layers, streams.data_ptr(), 4 * 32, 3, 4, 32, 4, 4, 2, 24, 1, 0, 1e-6, 1e-6,
            cos.data_ptr() if with_tables else None, sin.data_ptr() if with_tables else None, counts.data_ptr(),
            out.data_ptr(), *head)

    refusals = {
        "layer kind 2": status(0, "sparse", 2),
        "rotate 3": status(1, "rotate", 3),
        "no router": status(1, "router", 0),
        "no keys": status(2, "state_a", 0),
        "kept past capacity": status(2, "kept", 13),
        "kept past the score buffer": status(2, "kept", ops.LIMITS["keys"]),
        "slot past capacity": status(2, "slot", 12),
        "slot -2": status(2, "slot", -2),
        "no tables": status(with_tables=False),
        "no layers": status(layers=0),
        "a head without its norm": status(head=(None, *head[1:])),
        "a head without its hidden state's buffer": status(head=(*head[:4], None, head[5])),
        "a head without its logits' buffer": status(head=(*head[:5], None)),
        "a head of no vocabulary": status(head=(*head[:3], 0, *head[4:])),
        "buffers without a head": status(head=(None, 1e-6, None, 11, hidden.data_ptr(), logits.data_ptr())),
    }
    assert {what: code for what, code in refusals.items() if code != ops.library.OUT_OF_RANGE} == {}
    assert bool((out == 7.0).all()) and bool((hidden == 7.0).all()) and bool((logits == 7.0).all())
