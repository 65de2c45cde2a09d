"""Cached decoding of the whole stack of hybrid blocks in one C call (`DecodeStack`, what GLM53Flash's
decode step runs: `decode_stack_serves` is the rule), built from three pieces per layer, each an op of
its own here and tested alone against its reference: `decode_attention_in` (the streams' read, norm and
qkv product), the attention step (linear_attention_step or sparse_attention_step), `decode_moe_out` (the
output product, the MoE and the streams' write). The Python between layers cost a flash decode step
about as much as its arithmetic did; in one call it is gone, and the arithmetic is the pieces' own,
so the stack equals them called layer by layer bit for bit. With a head (the model's final norm and tied
head) the same call also computes the logits, by the functions ops.rms_norm and ops.linear call, so they
equal those ops after the call bit for bit, and the Python between the stack and the logits goes.
References: `reference_decode_attention_in`, `reference_decode_moe_out`, and for the stack the model's
operations one by one.
"""

from __future__ import annotations

import ctypes

import torch

from glm53_flash.model.ops import library
from glm53_flash.model.ops.grouped import reference_grouped_linear, reference_grouped_matmul
from glm53_flash.model.ops.moe_routing import reference_moe_combine, reference_moe_dispatch
from glm53_flash.model.ops.rmsnorm import reference_rms_norm
from glm53_flash.model.ops.swiglu import reference_swiglu



def weight_type(op: str, weights: dict[str, torch.Tensor]) -> int:
    """1 when the weight products' weights are bf16, 0 when float32 (all of one type, or refused)."""
    kinds = {w.dtype if isinstance(w, torch.Tensor) else None for w in weights.values()}
    if kinds == {torch.bfloat16}:
        return 1
    if kinds != {torch.float32}:
        library.fail(op, f"the weights ({', '.join(weights)}) must all be float32 or all bf16")
    return 0


def decode_stack_serves(streams: torch.Tensor) -> bool:
    """Whether the one-call decode step can serve streams [S, B, 1, D] (one token per row, the first
    stream a block of memory, the others B * D floats on or all the same) here: the kernels on and
    `library.FUSED_DECODE`, no gradients, at most `MAX_FUSED_ROWS` rows, CPU float32 (the weights and
    states are checked by `DecodeStack`)."""
    if not (library.FUSED_DECODE and library.ENABLED) or torch.is_grad_enabled() or streams.dim() != 4 or streams.shape[2] != 1:
        return False
    n_streams, batch, _, dim = streams.shape
    return (n_streams <= library.LIMITS["streams"] and 0 < batch <= library.MAX_FUSED_ROWS and dim % 16 == 0
            and streams[0].is_contiguous() and streams.stride(0) in (0, batch * dim) and library.cpu_float32(streams)
            and library.path_open())

def decode_tensors_serve(*tensors: torch.Tensor) -> bool:
    """Whether weights or cached states can go to `DecodeStack` as they are: contiguous CPU float32 tensors."""
    return all(isinstance(t, torch.Tensor) and t.is_cpu and t.dtype == torch.float32 and t.is_contiguous()
               for t in tensors)

def decode_attention_in(streams: torch.Tensor, input_logits: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                        qkv_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """streams [S, B, 1, D] -> (mixed [B, 1, D], the softmax(input_logits)-weighted mix of the streams;
    qkv [B, 1, 3D] = rms_norm(mixed) @ qkv_weight^T). qkv_weight float32, or bf16 (read as bf16, the
    arithmetic float32: equal to the float32 call on the same weights rounded to bf16)."""
    op = "decode_attention_in"
    n_streams, batch, dim = library.check_streams(op, streams)
    library.check_tensor(op, "input_logits", input_logits, (n_streams,))
    library.check_tensor(op, "norm_weight", norm_weight, (dim,))
    bf16 = weight_type(op, {"qkv_weight": qkv_weight})
    library.check_tensor(op, "qkv_weight", qkv_weight, (3 * dim, dim), qkv_weight.dtype)
    mixed = torch.empty(batch, 1, dim, dtype=torch.float32)
    qkv = torch.empty(batch, 1, qkv_weight.shape[0], dtype=torch.float32)
    library.call(op, streams.data_ptr(), streams.stride(0), n_streams, batch, dim, input_logits.data_ptr(),
          norm_weight.data_ptr(), eps, qkv_weight.data_ptr(), bf16, mixed.data_ptr(), qkv.data_ptr())
    return mixed, qkv

def decode_moe_out(streams: torch.Tensor, output_logits: torch.Tensor, double_residual: bool, attn: torch.Tensor,
                   out_weight: torch.Tensor, mixed: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                   router: torch.Tensor, top_k: int, gate_up: torch.Tensor, down: torch.Tensor,
                   shared_up: torch.Tensor, shared_down: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rest of a block's decode step after attention (attn [B, 1, D] before its output product):
    -> (the new streams [S, B, 1, D], routed slots per expert [E]). router [E, D], gate_up [E, 2H, D],
    down [E, H, D], shared_up [2H, D], shared_down [D, H]; D % 16 == 0, H % 8 == 0. out_weight, gate_up,
    down, shared_up and shared_down all float32 or all bf16 (as decode_attention_in's weight); the
    router stays float32."""
    op = "decode_moe_out"
    n_streams, batch, dim = library.check_streams(op, streams)
    if not (dim % 16 == 0):
        library.fail(op, f"D = {dim} must be a multiple of 16")
    if not (isinstance(down, torch.Tensor) and down.dim() == 3):
        library.fail(op, "down must be [E, H, D]")
    experts, hidden = down.shape[0], down.shape[1]
    library.check_vector_size(op, "H", hidden)
    library.check_routing(op, experts, top_k, batch)
    weights = {"out_weight": out_weight, "gate_up": gate_up, "down": down, "shared_up": shared_up,
               "shared_down": shared_down}
    bf16 = weight_type(op, weights)
    for name, tensor, shape in (("output_logits", output_logits, (n_streams,)), ("attn", attn, (batch, 1, dim)),
                                ("out_weight", out_weight, (dim, dim)), ("mixed", mixed, (batch, 1, dim)),
                                ("norm_weight", norm_weight, (dim,)), ("router", router, (experts, dim)),
                                ("gate_up", gate_up, (experts, 2 * hidden, dim)), ("down", down, (experts, hidden, dim)),
                                ("shared_up", shared_up, (2 * hidden, dim)), ("shared_down", shared_down, (dim, hidden))):
        library.check_tensor(op, name, tensor, shape, torch.bfloat16 if bf16 and name in weights else torch.float32)
    new_streams = torch.empty(n_streams, batch, 1, dim, dtype=torch.float32)
    counts = torch.empty(experts, dtype=torch.int64)
    library.call(op, streams.data_ptr(), streams.stride(0), n_streams, batch, dim, output_logits.data_ptr(),
          int(double_residual), attn.data_ptr(), out_weight.data_ptr(), mixed.data_ptr(), norm_weight.data_ptr(), eps,
          router.data_ptr(), experts, top_k, gate_up.data_ptr(), down.data_ptr(), hidden, shared_up.data_ptr(),
          shared_down.data_ptr(), bf16, counts.data_ptr(), new_streams.data_ptr())
    return new_streams, counts

# Each layer's fields in the int64 table the stack call reads, in kernels.c's `enum layer_field` order.
LAYER_FIELDS = ("sparse", "input_logits", "attn_norm", "qkv_weight", "state_a", "state_b", "capacity", "kept", "slot",
                "rotate", "output_logits", "out_weight", "moe_norm", "router", "gate_up", "down", "shared_up",
                "shared_down")
_FIELD = {name: index for index, name in enumerate(LAYER_FIELDS)}
_STATE_A, _STATE_B, _CAPACITY, _KEPT, _SLOT = (_FIELD[name] for name in ("state_a", "state_b", "capacity", "kept", "slot"))
# A layer's weights: what DecodeStack takes per layer besides `sparse` and `rotate`.
LAYER_WEIGHTS = ("input_logits", "attn_norm", "qkv_weight", "output_logits", "out_weight", "moe_norm", "router",
                 "gate_up", "down", "shared_up", "shared_down")
PRODUCT_WEIGHTS = ("qkv_weight", "out_weight", "gate_up", "down", "shared_up", "shared_down")
# The head's mean over the streams sums them in order from zero, which is torch's mean over the first
# dimension bit for bit for up to 16 streams (beyond them torch sums in blocks); a stack of more streams
# takes no head, and the model's norm and head run after the call.
HEAD_MAX_STREAMS = 16


class DecodeStack:
    """The operands of a stack of hybrid blocks' decode step that change only with the weights, checked
    once and held (so the pointers in the table stay valid); `step` checks what changes per step (the
    streams, each layer's state and its sparse bookkeeping) and runs every layer in one C call.

    `layers`: one dict per layer with `sparse` (bool: the local + strided layer, else linear attention),
    `rotate` (bool: a linear layer rotates q and k first) and the LAYER_WEIGHTS tensors: input_logits and
    output_logits [S], attn_norm and moe_norm [D], qkv_weight [3D, D], out_weight [D, D], router [E, D],
    gate_up [E, 2H, D], down [E, H, D], shared_up [2H, D], shared_down [D, H]. The PRODUCT_WEIGHTS are all
    float32 or all bf16 (read as bf16, the arithmetic float32); the rest float32. `eps` is every norm's.

    `head` (optional): the model's final norm and tied head after the stack, {"norm": [D], "eps": float,
    "weight": [V, D]}, float32, for at most HEAD_MAX_STREAMS streams. `step_with_head` then also returns
    the streams' mean normed and its logits, computed as torch's mean, ops.rms_norm and ops.linear compute
    them for at most library.MAX_ROWS rows (the same C functions), so the model's one-row-at-a-time path
    gives the same bits either way."""

    def __init__(self, layers: list[dict], heads: int, top_k: int, double_residual: bool, eps: float, floor: float,
                 head: dict | None = None):
        op = "decode_stack"
        if not layers:
            library.fail(op, "no layers")
        first = layers[0]
        for name in ("attn_norm", "router", "down", "input_logits"):
            if not isinstance(first.get(name), torch.Tensor):
                library.fail(op, f"layer 0: {name} must be a tensor")
        if first["down"].dim() != 3 or first["router"].dim() != 2:
            library.fail(op, "down must be [E, H, D] and router [E, D]")
        dim, n_streams = first["attn_norm"].shape[0], first["input_logits"].shape[0]
        experts, hidden = first["down"].shape[0], first["down"].shape[1]
        if not (dim % 16 == 0 and dim > 0):
            library.fail(op, f"D = {dim} must be a multiple of 16")
        library.check_vector_size(op, "H", hidden)
        if not (isinstance(heads, int) and heads >= 1 and dim % heads == 0 and library.head_dim_serves(dim // heads)):
            library.fail(op, f"{heads} heads of D = {dim}: the head size must be a multiple of 8 up to "
                             f"{library.LIMITS['head_dim']}")
        library.check_routing(op, experts, top_k, 1)
        if not (1 <= n_streams <= library.LIMITS["streams"]):
            library.fail(op, f"{n_streams} streams; the kernel holds 1 to {library.LIMITS['streams']}")
        products = {layer[name].dtype if isinstance(layer.get(name), torch.Tensor) else None
                    for layer in layers for name in PRODUCT_WEIGHTS}
        if products not in ({torch.float32}, {torch.bfloat16}):
            library.fail(op, f"the weight products ({', '.join(PRODUCT_WEIGHTS)}) must all be float32 or all bf16")
        self.bf16 = products == {torch.bfloat16}
        shapes = {"input_logits": (n_streams,), "attn_norm": (dim,), "qkv_weight": (3 * dim, dim),
                  "output_logits": (n_streams,), "out_weight": (dim, dim), "moe_norm": (dim,), "router": (experts, dim),
                  "gate_up": (experts, 2 * hidden, dim), "down": (experts, hidden, dim), "shared_up": (2 * hidden, dim),
                  "shared_down": (dim, hidden)}
        self.table = (ctypes.c_int64 * (len(layers) * len(LAYER_FIELDS)))()
        held = []
        for index, layer in enumerate(layers):
            base = index * len(LAYER_FIELDS)
            for name in LAYER_WEIGHTS:
                tensor = layer.get(name)
                dtype = torch.bfloat16 if self.bf16 and name in PRODUCT_WEIGHTS else torch.float32
                library.check_tensor(op, f"layer {index}: {name}", tensor, shapes[name], dtype)
                self.table[base + _FIELD[name]] = tensor.data_ptr()
                held.append(tensor)
            self.table[base + _FIELD["sparse"]] = int(bool(layer["sparse"]))
            self.table[base + _FIELD["rotate"]] = int(bool(layer.get("rotate", False)))
        self.head = None
        if head is not None:
            if n_streams > HEAD_MAX_STREAMS:
                library.fail(op, f"a head takes at most {HEAD_MAX_STREAMS} streams ({n_streams} here): beyond "
                                 "them torch's mean over the streams sums in another order")
            if not (isinstance(head.get("weight"), torch.Tensor) and head["weight"].dim() == 2):
                library.fail(op, "head: weight must be [V, D]")
            library.check_tensor(op, "head: norm", head.get("norm"), (dim,))
            library.check_tensor(op, "head: weight", head["weight"], (head["weight"].shape[0], dim))
            # its pointers and sizes fixed now, as the layers' are in the table
            self.head = (head["norm"].data_ptr(), float(head["eps"]), head["weight"].data_ptr(), head["weight"].shape[0])
            held += [head["norm"], head["weight"]]
        self._held = held  # the table's pointers point into these
        self.sparse = [bool(layer["sparse"]) for layer in layers]
        self.rotates = any(self.sparse) or any(bool(layer.get("rotate", False)) for layer in layers)
        self.dim, self.n_streams, self.heads, self.experts, self.hidden = dim, n_streams, heads, experts, hidden
        self.top_k, self.double_residual, self.eps, self.floor = top_k, bool(double_residual), float(eps), float(floor)

    def step(self, streams: torch.Tensor, states: list[tuple], cos: torch.Tensor | None,
             sin: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """streams [S, B, 1, D] -> (the new streams [S, B, 1, D], routed slots per expert [layers, E]).
        states, one per layer: (kv [B, H, d, d], z [B, H, d]) for a linear layer, updated in place;
        (keys, values [B, H, capacity, d], kept, slot) for a sparse one, whose new key and value are
        stored at `slot` (-1: not stored). cos, sin [d]: the rotary tables' rows at this position."""
        return self._step(streams, states, cos, sin, False)

    def head_serves(self, batch: int) -> bool:
        """Whether step_with_head serves `batch` rows: a stack built with a head, at most library.MAX_ROWS
        rows (beyond them ops.rms_norm and ops.linear leave the rows to torch, whose last bits differ)."""
        return self.head is not None and 0 < batch <= library.MAX_ROWS

    def step_with_head(self, streams: torch.Tensor, states: list[tuple], cos: torch.Tensor | None,
                       sin: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`step`, then the head in the same call -> (the new streams, routed slots, hidden [B, 1, D] = the
        final norm of the streams' mean, logits [B, 1, V]). Where head_serves(B)."""
        return self._step(streams, states, cos, sin, True)

    def _step(self, streams, states, cos, sin, head: bool):
        op = "decode_stack"
        n_streams, batch, dim = library.check_streams(op, streams)
        if head and not self.head_serves(batch):
            library.fail(op, f"the head serves a stack built with one, 1 to {library.MAX_ROWS} rows ({batch} here)")
        if (n_streams, dim) != (self.n_streams, self.dim):
            library.fail(op, f"streams [S, B, 1, D] with S = {n_streams}, D = {dim}; the weights take S = "
                             f"{self.n_streams}, D = {self.dim}")
        library.check_routing(op, self.experts, self.top_k, batch)
        if len(states) != len(self.sparse):
            library.fail(op, f"{len(states)} layer states for {len(self.sparse)} layers")
        d = dim // self.heads
        if self.rotates:
            library.check_tensor(op, "cos", cos, (d,))
            library.check_tensor(op, "sin", sin, (d,))
        # each step fills a copy of the weights' table with its own states, so two threads can step at once
        table, width = type(self.table).from_buffer_copy(self.table), len(LAYER_FIELDS)
        for index, (sparse, state) in enumerate(zip(self.sparse, states)):
            base = index * width
            if sparse:
                keys, values, kept, slot = state
                if not (isinstance(keys, torch.Tensor) and keys.dim() == 4 and keys.shape[:2] == (batch, self.heads)
                        and keys.shape[3] == d):
                    library.fail(op, f"layer {index}: keys must be [B, H, capacity, d] = [{batch}, {self.heads}, ., {d}]")
                capacity = keys.shape[2]
                library.check_tensor(op, f"layer {index}: keys", keys)
                library.check_tensor(op, f"layer {index}: values", values, tuple(keys.shape))
                if not (0 <= kept <= min(capacity, library.MAX_SPARSE_KEYS)):
                    library.fail(op, f"layer {index}: kept = {kept} keys; the kernel takes 0 to min(capacity "
                                     f"{capacity}, {library.MAX_SPARSE_KEYS})")
                if not (-1 <= slot < capacity):
                    library.fail(op, f"layer {index}: slot = {slot} outside -1 .. capacity - 1 = {capacity - 1}")
                table[base + _CAPACITY], table[base + _KEPT], table[base + _SLOT] = capacity, kept, slot
                table[base + _STATE_A], table[base + _STATE_B] = keys.data_ptr(), values.data_ptr()
            else:
                kv, z = state
                library.check_tensor(op, f"layer {index}: kv", kv, (batch, self.heads, d, d))
                library.check_tensor(op, f"layer {index}: z", z, (batch, self.heads, d))
                table[base + _STATE_A], table[base + _STATE_B] = kv.data_ptr(), z.data_ptr()
        new_streams = torch.empty(n_streams, batch, 1, dim, dtype=torch.float32)
        counts = torch.empty(len(states), self.experts, dtype=torch.int64)
        if head:
            norm, head_eps, weight, vocab = self.head
            hidden = torch.empty(batch, 1, dim, dtype=torch.float32)
            logits = torch.empty(batch, 1, vocab, dtype=torch.float32)
            head_args = (norm, head_eps, weight, vocab, hidden.data_ptr(), logits.data_ptr())
        else:
            head_args = (None, 0.0, None, 0, None, None)
        library.call(op, ctypes.addressof(table), len(states), streams.data_ptr(), streams.stride(0), n_streams, batch,
                     dim, self.heads, self.experts, self.top_k, self.hidden, int(self.double_residual), int(self.bf16),
                     self.eps, self.floor, cos.data_ptr() if self.rotates else None,
                     sin.data_ptr() if self.rotates else None, counts.data_ptr(), new_streams.data_ptr(), *head_args)
        return (new_streams, counts, hidden, logits) if head else (new_streams, counts)


def _mix(streams: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    weights = torch.softmax(logits, dim=0)
    return (weights.view(-1, 1, 1, 1) * streams).sum(0)

def reference_decode_attention_in(streams, input_logits, norm_weight, eps, qkv_weight):
    mixed = _mix(streams, input_logits)
    return mixed, reference_rms_norm(mixed, norm_weight, eps) @ qkv_weight.T

def reference_decode_moe_out(streams, output_logits, double_residual, attn, out_weight, mixed, norm_weight, eps,
                             router, top_k, gate_up, down, shared_up, shared_down):
    attn_out = attn @ out_weight.T
    normed = reference_rms_norm(mixed + attn_out, norm_weight, eps).flatten(0, 1)
    rows, counts, offsets, position, gates = reference_moe_dispatch(normed, router, top_k)
    routed = reference_grouped_matmul(reference_swiglu(reference_grouped_linear(rows, gate_up, offsets)), down,
                                      offsets)
    shared = reference_swiglu(normed @ shared_up.T) @ shared_down.T
    update = attn_out + reference_moe_combine(routed, position, gates, shared).view_as(attn_out)
    weights = torch.softmax(output_logits, dim=0).view(-1, 1, 1, 1)
    if double_residual:
        return streams + weights * (mixed + update), counts
    return streams + streams.shape[0] * weights * update, counts


__all__ = ["DecodeStack", "HEAD_MAX_STREAMS", "LAYER_FIELDS", "LAYER_WEIGHTS", "PRODUCT_WEIGHTS", "decode_attention_in", "decode_moe_out", "decode_stack_serves", "decode_tensors_serve", "reference_decode_attention_in",
           "reference_decode_moe_out", "weight_type"]
