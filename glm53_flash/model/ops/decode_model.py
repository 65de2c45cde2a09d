"""GLM53Flash's cached decode step in one C call (`decode_step`): every block's decode step by
ops.DecodeStack (decode_block.py), and for up to library.MAX_ROWS rows the final norm and the tied head
too, where it serves; the model's blocks one by one are its reference (tests/test_kernels.py compares).

The stack's operands are the weights, checked once and held as pointers, so they are kept per model and
product dtype and made again when the model is no longer what they were built from: a weight changed in
place (bf16 copies only: float32 operands are the weights themselves), a parameter or module set anew, a
setting the call was built with. Inside compute_in(bf16) the weight products' weights are bf16 copies (half
the bytes of a step that is bound by reading them; the arithmetic stays float32, the router and norms
float32).

The step takes the attention kinds it has a C step for (`KINDS`); a model with any other kind, the
"sinkhorn" streams, more experts or a larger top-k than kernels.c holds, or an expert width that is not a
multiple of 8, decodes block by block. This module reads the model's modules, so it sits above them:
lm.py imports it directly (ops/__init__ does not).
"""

from __future__ import annotations

import operator
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from glm53_flash.model.linear_attention import DENOMINATOR_FLOOR, LinearAttention, LinearState
from glm53_flash.model.norm import RMSNorm
from glm53_flash.model.ops import library
from glm53_flash.model.ops.decode_block import (HEAD_MAX_STREAMS, PRODUCT_WEIGHTS, DecodeStack, decode_stack_serves,
                                                decode_tensors_serve)
from glm53_flash.model.precision import product_dtype
from glm53_flash.model.sparse_attention import SparseAttention, SparseKV


# ------------------------------------------------------------------------ the attention kinds it takes


def _linear_weights(attention: LinearAttention) -> dict:
    return {"sparse": False, "rotate": attention.rope_before_feature, "qkv_weight": attention.qkv.weight,
            "out_weight": attention.out.weight}


def _linear_state(attention: LinearAttention, state, position: int):
    """(kv, z), updated in place by the step, and the state after it (the same tensors)."""
    if not (isinstance(state, LinearState) and decode_tensors_serve(state.kv, state.z)):
        return None
    return (state.kv, state.z), state


def _sparse_weights(attention: SparseAttention) -> dict:
    return {"sparse": True, "rotate": False, "qkv_weight": attention.qkv.weight, "out_weight": attention.out.weight}


def _sparse_state(attention: SparseAttention, state, position: int):
    """(keys, values, kept, slot) and the state after the step: the buffers have room for one more key
    (grown by half when full); the step stores the new key at `slot` (the layer's own bookkeeping)."""
    if not isinstance(state, SparseKV) or len(state.positions) > library.MAX_SPARSE_KEYS:
        return None
    keys, values = state.with_room()
    if not decode_tensors_serve(keys, values):
        return None
    slot, positions = attention.slot_for(position, state.positions)
    return (keys, values, len(state.positions), slot), SparseKV.in_buffers(keys, values, positions)


@dataclass(frozen=True)
class Kind:
    weights: object  # attention -> its part of DecodeStack's layer dict (sparse, rotate, qkv_weight, out_weight)
    settings: tuple  # the attention's attributes the call is built with
    state: object  # (attention, state, position) -> (the step's operands, the state after it), or None


KINDS = {LinearAttention: Kind(_linear_weights, ("rope_before_feature",), _linear_state),
         SparseAttention: Kind(_sparse_weights, (), _sparse_state)}


# -------------------------------------------------------------------------------------------- blocks


def block_weights(block: nn.Module) -> dict | None:
    """A hybrid block's operands of the one-call step (DecodeStack's layer dict), or None where the step
    cannot serve it (an attention kind without a C step, the "sinkhorn" streams, more experts or a larger
    top-k than kernels.c holds, an expert width that is not a multiple of 8)."""
    connection, moe, kind = block.connection, block.moe, KINDS.get(type(block.attention))
    if (kind is None or connection.mode == "sinkhorn" or moe.experts > library.LIMITS["experts"]
            or moe.top_k > min(library.LIMITS["top_k"], moe.experts) or moe.expert_down.shape[1] % 8):
        return None
    return {**kind.weights(block.attention), "input_logits": connection.input_logits,
            "attn_norm": block.attn_norm.weight, "output_logits": connection.output_logits,
            "moe_norm": block.moe_norm.weight, "router": moe.router.weight, "gate_up": moe.expert_gate_up,
            "down": moe.expert_down, "shared_up": moe.shared.up.weight, "shared_down": moe.shared.down.weight}


def block_settings(block: nn.Module) -> tuple:
    """(object, attribute) for every setting a block's operands are built with, so a change to one of
    them makes the step build its operands again."""
    attention = block.attention
    return ((block.moe, "top_k"), (block.moe, "experts"), (block.connection, "mode"), (block.attn_norm, "eps"),
            (block.moe_norm, "eps"), *((attention, name) for name in KINDS[type(attention)].settings))


# ---------------------------------------------------------------------------------- operands, kept


@dataclass
class _Operands:
    """A model's DecodeStack for one product dtype, and how to tell it is still the model's: each source
    tensor's place in the model (every link of module names from the model down to its module, and its
    parameter name there) with the tensor it named, its storage (held, so a freed address cannot come back
    under another tensor), shape and strides, and for bf16 copies the version they were copied at; and
    every setting the call was built with. A step checks all of it: each distinct link once, each kind of
    check as one pass over parallel tuples (map over the modules' own dictionaries and the tensors'
    accessors), about half the time of a walk per weight."""

    stack: DecodeStack
    checks: tuple | None  # the parallel tuples `holds` compares; None: rebuild every step
    settings: tuple  # ((owner, ...), (attribute, ...), (value, ...))
    storages: tuple = ()  # held: a freed storage's address cannot return under another tensor

    @classmethod
    def of(cls, model: nn.Module, sources: list, settings: tuple, stack: DecodeStack, bf16: bool) -> "_Operands":
        paths = {id(parameter): tuple(name.split(".")) for name, parameter in model.named_parameters()}
        checks = None
        # every source a parameter, and bf16 copies only of tensors that count their changes (an inference
        # tensor keeps no version: its copies are made again each step)
        if all(id(tensor) in paths and not (bf16 and tensor.is_inference()) for tensor in sources):
            # The links from the model down: (parent, name, child), the model itself as None (the table is
            # keyed by the model and must not hold it), each link once, parents before their children.
            links: dict[tuple[str, ...], tuple] = {}
            owners = []
            for tensor in sources:
                module, path = model, paths[id(tensor)]
                for depth, name in enumerate(path[:-1]):
                    child = module._modules[name]
                    links.setdefault(path[: depth + 1], (None if module is model else module, name, child))
                    module = child
                owners.append(None if module is model else module)
            parents, names, children = zip(*links.values()) if links else ((), (), ())
            tensors = tuple(sources)
            checks = (parents, names, children, tuple(owners), tuple(paths[id(t)][-1] for t in tensors),
                      tensors, [t.data_ptr() for t in tensors], [t.shape for t in tensors],
                      [t.stride() for t in tensors], [t._version for t in tensors] if bf16 else None)
        owners, names, values = (zip(*((o, n, getattr(o, n)) for o, n in settings)) if settings
                                 else ((), (), ()))
        return cls(stack, checks, (tuple(owners), tuple(names), tuple(values)),
                   tuple(t.detach() for t in sources) if checks is not None else ())

    def holds(self, model: nn.Module) -> bool:
        if self.checks is None:
            return False
        parents, names, children, owners, parameter_names, tensors, pointers, shapes, strides, versions = self.checks
        parents, owners = _rooted(parents, model), _rooted(owners, model)
        same = operator.is_
        if not (all(map(same, map(dict.get, map(_MODULES, parents), names), children))
                and all(map(same, map(dict.get, map(_PARAMETERS, owners), parameter_names), tensors))
                and list(map(torch.Tensor.data_ptr, tensors)) == pointers
                and list(map(_SHAPE, tensors)) == shapes
                and list(map(torch.Tensor.stride, tensors)) == strides
                and (versions is None or list(map(_VERSION, tensors)) == versions)):
            return False
        owners, attributes, values = self.settings
        return all(map(operator.eq, map(getattr, owners, attributes), values))


def _rooted(modules: tuple, model: nn.Module) -> tuple:
    """`modules` with the model in place of None (the table keeps no reference to its own key)."""
    return tuple(model if module is None else module for module in modules) if None in modules else modules


_MODULES, _PARAMETERS = operator.attrgetter("_modules"), operator.attrgetter("_parameters")
_SHAPE, _VERSION = operator.attrgetter("shape"), operator.attrgetter("_version")

# Each model's _Operands per product dtype ({False: float32, True: bf16}), outside the model: a deep copy or
# a pickle of a model does not carry a table of pointers into the original's weights, the entry goes with
# its model, and switching precision does not copy the bf16 weights again.
_KEPT: "weakref.WeakKeyDictionary[nn.Module, dict[bool, _Operands]]" = weakref.WeakKeyDictionary()


def _runs_as_defined(module: nn.Module) -> bool:
    """Whether calling `module` would run its class's forward and nothing else: no hooks of its own or
    global ones, no forward set on the instance (the one-call step's head then stands in for the final
    norm; otherwise the norm runs as called, after the step)."""
    hooks = torch.nn.modules.module
    return not (module._forward_hooks or module._forward_pre_hooks or "forward" in module.__dict__
                or getattr(hooks, "_global_forward_hooks", None) or getattr(hooks, "_global_forward_pre_hooks", None))


def model_stack(model: nn.Module) -> DecodeStack | None:
    """The model's DecodeStack for the product dtype in force, made once per weight version; None where a
    block cannot take the one-call step."""
    bf16 = product_dtype() is torch.bfloat16
    kept = _KEPT.get(model)
    cached = kept.get(bf16) if kept is not None else None
    if cached is not None and cached.holds(model):
        return cached.stack
    layers = [block_weights(block) for block in model.blocks]
    if any(layer is None for layer in layers):
        return None
    sources = [tensor for layer in layers for tensor in layer.values() if isinstance(tensor, torch.Tensor)]
    first = model.blocks[0]
    shared = {(block.moe.top_k, block.connection.mode, block.attn_norm.eps, block.moe_norm.eps)
              for block in model.blocks}
    # one top-k, streams' mode and eps for every block, and the weights as the C call reads them
    if len(shared) != 1 or first.attn_norm.eps != first.moe_norm.eps or not decode_tensors_serve(*sources):
        return None
    if bf16:
        with torch.no_grad():
            layers = [{name: value.detach().to(torch.bfloat16).contiguous() if name in PRODUCT_WEIGHTS
                       else value for name, value in layer.items()} for layer in layers]
    settings = tuple(setting for block in model.blocks for setting in block_settings(block))
    # The final norm and the tied head join the call where they are what the step after it would run
    # (this RMSNorm and a float32 head, both read as they are): the model then takes the hidden state and
    # logits from the call for as many rows as ops.rms_norm and ops.linear serve.
    head = None
    norm, table = model.norm, model.embedding.weight
    if (type(norm) is RMSNorm and decode_tensors_serve(norm.weight, table) and table.dim() == 2
            and norm.weight.shape == (model.config.dim,) and table.shape[1] == model.config.dim
            and first.connection.streams <= HEAD_MAX_STREAMS):
        head = {"norm": norm.weight, "eps": norm.eps, "weight": table}
        sources = sources + [norm.weight, table]
        settings = settings + ((norm, "eps"),)
    stack = DecodeStack(layers, heads=model.config.heads, top_k=first.moe.top_k,
                        double_residual=first.connection.mode == "double-residual",
                        eps=first.attn_norm.eps, floor=DENOMINATOR_FLOOR, head=head)
    _KEPT.setdefault(model, {})[bf16] = _Operands.of(model, sources, settings, stack, bf16)
    return stack


# ------------------------------------------------------------------------------------------ the step


def decode_step(model: nn.Module, streams: torch.Tensor, position: int, cache):
    """One cached token per row through every block of `model` in one C call where it serves: the CPU in
    float32 without gradients, up to library.MAX_FUSED_ROWS rows, the "double-residual" or "delta"
    streams. streams [S, B, 1, D] -> (the new streams, routed slots [layers, E], the final norm of the
    streams' mean [B, 1, D] and its logits [B, 1, V] where the call computed them too, else None and
    None) with the cache's states advanced, or None: the blocks then run one by one, nothing changed."""
    if not decode_stack_serves(streams) or not library.head_dim_serves(model.config.head_dim):
        return None
    stack = model_stack(model)
    if stack is None:
        return None
    states, after = [], []
    for block, state in zip(model.blocks, cache.layers):
        operands = KINDS[type(block.attention)].state(block.attention, state, position)
        if operands is None:
            return None
        states.append(operands[0])
        after.append(operands[1])
    cos, sin = model.rope.cos[position], model.rope.sin[position]
    if stack.head_serves(streams.shape[1]) and _runs_as_defined(model.norm):
        stepped = stack.step_with_head(streams, states, cos, sin)
    else:
        stepped = (*stack.step(streams, states, cos, sin), None, None)
    cache.layers[:] = after
    return stepped


__all__ = ["KINDS", "block_settings", "block_weights", "decode_step", "model_stack"]
