"""GLM53Flash: embedding -> residual streams -> 12 hybrid blocks -> RMSNorm -> tied head.

Each block is pre-norm attention (linear or local+strided sparse) followed by a mixture of experts,
in GLM-5.3-Flash's linear, linear, linear, sparse rhythm. `forward(ids, cache=...)` serves both
training (full sequences) and cached decoding (prefill, then any number of tokens at a time).
"""

from __future__ import annotations

import operator
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

from glm53_flash.model.config import ModelConfig
from glm53_flash.model import dispatch, ops  # noqa: F401 - dispatch: its switches go into receipts
from glm53_flash.model.linear_attention import DENOMINATOR_FLOOR, LinearAttention, LinearState
from glm53_flash.model.moe import MixtureOfExperts, original_balance_metric
from glm53_flash.model.norm import RMSNorm
from glm53_flash.model.precision import product_dtype
from glm53_flash.model.pretrained import load_model, save_pretrained
from glm53_flash.model.rope import RotaryEmbedding
from glm53_flash.model.sparse_attention import SparseAttention, SparseKV
from glm53_flash.model.streams import StreamConnection


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [B, T, V]
    aux_loss: torch.Tensor  # router balance loss (scalar)
    usage: torch.Tensor  # [layers, experts] routed-slot fractions (no gradient)
    hidden: torch.Tensor | None = None  # [B, T, D] the final norm's output, which the tied head multiplies


@dataclass
class ModelCache:
    """Decode state for every layer; `position` is the number of tokens already consumed."""

    batch_size: int
    max_length: int
    position: int = 0
    layers: list = field(default_factory=list)  # LinearState | SparseKV | None per layer

    def tokens_left(self) -> int:
        return self.max_length - self.position

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only the given batch rows (e.g. drop finished sequences so they cost nothing more)."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        for i, state in enumerate(self.layers):
            if isinstance(state, LinearState):
                index = rows.to(state.kv.device)
                self.layers[i] = LinearState(state.kv.index_select(0, index), state.z.index_select(0, index))
            elif isinstance(state, SparseKV):
                index = rows.to(state.k.device)
                self.layers[i] = SparseKV(state.k.index_select(0, index), state.v.index_select(0, index),
                                          state.positions)
        self.batch_size = int(rows.numel())


class HybridBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int) -> None:
        super().__init__()
        self.sparse = cfg.is_sparse_layer(index)
        self.attn_norm = RMSNorm(cfg.dim)
        if self.sparse:
            self.attention = SparseAttention(cfg.dim, cfg.heads, cfg.sparse_window, cfg.sparse_stride)
        else:
            self.attention = LinearAttention(cfg.dim, cfg.heads, cfg.linear_chunk,
                                             rope_before_feature=cfg.linear_rope == "rope-before-feature-map")
        self.moe_norm = RMSNorm(cfg.dim)
        self.moe = MixtureOfExperts(cfg.dim, cfg.expert_hidden, cfg.experts, cfg.top_k, cfg.init_std)
        self.connection = StreamConnection(cfg.streams, cfg.stream_mode)

    def forward(self, streams, rope, position, state, return_state, token_mask, balance_reduce=None):
        mixed = self.connection.read(streams)
        b, t, d = mixed.shape
        attn_out, new_state = self.attention(self.attn_norm(mixed), rope, position, state, return_state)
        hidden = mixed + attn_out
        moe_out, used, balance = self.moe(self.moe_norm(hidden).reshape(b * t, d), token_mask,
                                          with_balance=not return_state, balance_reduce=balance_reduce)
        update = attn_out + moe_out.view(b, t, d)
        return self.connection.write(streams, mixed, update), new_state, used, balance

    def decode_weights(self) -> dict | None:
        """This block's operands of the one-call decode step (ops.DecodeStack: its weights, whether it
        is the sparse layer and whether a linear layer rotates first), or None where that step cannot
        serve it (the "sinkhorn" streams, more than 64 experts, top-k beyond 8, an expert width that is not a
        multiple of 8)."""
        connection, attention, moe = self.connection, self.attention, self.moe
        if (connection.mode == "sinkhorn" or moe.experts > ops.LIMITS["experts"]
                or moe.top_k > min(ops.LIMITS["top_k"], moe.experts) or moe.expert_down.shape[1] % 8):
            return None
        return {"sparse": self.sparse, "rotate": not self.sparse and attention.rope_before_feature,
                "input_logits": connection.input_logits, "attn_norm": self.attn_norm.weight,
                "qkv_weight": attention.qkv.weight, "output_logits": connection.output_logits,
                "out_weight": attention.out.weight, "moe_norm": self.moe_norm.weight, "router": moe.router.weight,
                "gate_up": moe.expert_gate_up, "down": moe.expert_down, "shared_up": moe.shared.up.weight,
                "shared_down": moe.shared.down.weight}

    def decode_settings(self) -> tuple:
        """(object, attribute) for every setting decode_weights' caller builds the one-call step with, so
        a change to one of them makes it build the step again."""
        settings = ((self, "sparse"), (self.moe, "top_k"), (self.moe, "experts"), (self.connection, "mode"),
                    (self.attn_norm, "eps"), (self.moe_norm, "eps"))
        return settings if self.sparse else settings + ((self.attention, "rope_before_feature"),)


@dataclass
class _DecodeOperands:
    """GLM53Flash's cached ops.DecodeStack for one product dtype, and how to tell it is still the model's:
    each source tensor's place in the model (every link of module names from the model down to its
    module, and its parameter name there) with the tensor it named, its storage (held, so a freed
    address cannot come back under another tensor), shape and strides, and for bf16 copies the version
    they were copied at (float32 operands point at the weights themselves, so a change in place needs
    nothing); and every setting the call was built with (top-k, the streams' mode, the norms' eps, which
    layers are sparse or rotate). A step checks all of it: each distinct link once, each kind of check
    as one pass over parallel tuples (map over the modules' own dictionaries and the tensors' accessors):
    for the ~130 weights of a flash step about half the time of a walk per weight (84 against 154 µs on a
    2-core AVX2 EPYC, measured while building; more between decode steps, whose weight reads evict it)."""

    stack: object
    checks: tuple | None  # the parallel tuples `holds` compares; None: rebuild every step
    settings: tuple  # ((owner, ...), (attribute, ...), (value, ...))
    storages: tuple = ()  # held: a freed storage's address cannot return under another tensor

    @classmethod
    def of(cls, model: nn.Module, sources: list, settings: tuple, stack, bf16: bool) -> "_DecodeOperands":
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


def _runs_as_defined(module: nn.Module) -> bool:
    """Whether calling `module` would run its class's forward and nothing else: no hooks of its own or
    global ones, no forward set on the instance (the one-call step's head then stands in for the final
    norm; otherwise the norm runs as called, after the step)."""
    hooks = torch.nn.modules.module
    return not (module._forward_hooks or module._forward_pre_hooks or "forward" in module.__dict__
                or getattr(hooks, "_global_forward_hooks", None) or getattr(hooks, "_global_forward_pre_hooks", None))


# Each model's _DecodeOperands per product dtype ({False: float32, True: bf16}), outside the model: a
# deep copy or a pickle of a model does not carry a table of pointers into the original's weights, the
# entry goes with its model, and switching precision does not copy the bf16 weights again.
_DECODE_OPERANDS: "weakref.WeakKeyDictionary[nn.Module, dict[bool, _DecodeOperands]]" = weakref.WeakKeyDictionary()


class GLM53Flash(nn.Module):
    def __init__(self, config: ModelConfig | None = None) -> None:
        super().__init__()
        self.config = cfg = config or ModelConfig()
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(HybridBlock(cfg, i) for i in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.max_sequence_length, cfg.rope_base)
        self._init_weights()

    def _init_weights(self) -> None:
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std)

    # -- bookkeeping ---------------------------------------------------------------------------
    def save_pretrained(self, directory, metadata: dict | None = None):
        """Write config.json (Hugging Face style, with `model_type`), model.safetensors and
        metadata.json (their sha256) to a new directory, atomically. Returns the directory."""
        return save_pretrained(self, directory, metadata)

    @classmethod
    def from_pretrained(cls, directory, device="cpu", verify: bool = True) -> "GLM53Flash":
        """Load a directory written by `save_pretrained` or any training checkpoint (hashes checked;
        older config.json files without `model_type` and the older expert layout load too)."""
        model, _ = load_pretrained(directory, device=device, verify=verify)
        return model

    def parameter_counts(self) -> dict[str, int]:
        """Total parameters (tied head counted once) and the per-token active estimate."""
        total = sum(p.numel() for p in self.parameters())
        routed = sum(block.moe.routed_parameter_count() for block in self.blocks)
        active = total - routed + routed * self.config.top_k // self.config.experts
        return {"total": total, "active": active}

    def new_cache(self, batch_size: int) -> ModelCache:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        return ModelCache(batch_size, self.config.max_sequence_length, 0, [None] * self.config.layers)

    # -- cached decoding in one call ---------------------------------------------------------------
    def _decode_operands(self) -> "ops.DecodeStack | None":
        """The blocks' decode-step operands (ops.DecodeStack), made once per weight version and product
        dtype: an optimiser step or a load bumps a parameter's version, and a parameter or module set anew
        changes what its path names, so the next step reads the new weights. Inside compute_in(bf16) the
        weight products' weights are bf16 copies (half the bytes of a step that is bound by reading them;
        the arithmetic stays float32, the router and norms float32). None where a block cannot take the
        one-call step."""
        bf16 = product_dtype() is torch.bfloat16
        kept = _DECODE_OPERANDS.get(self)
        cached = kept.get(bf16) if kept is not None else None
        if cached is not None and cached.holds(self):
            return cached.stack
        layers = [block.decode_weights() for block in self.blocks]
        if any(layer is None for layer in layers):
            return None
        sources = [tensor for layer in layers for tensor in layer.values() if isinstance(tensor, torch.Tensor)]
        first = self.blocks[0]
        shared = {(block.moe.top_k, block.connection.mode, block.attn_norm.eps, block.moe_norm.eps)
                  for block in self.blocks}
        # one top-k, streams' mode and eps for every block, and the weights as the C call reads them
        if (len(shared) != 1 or first.attn_norm.eps != first.moe_norm.eps
                or not ops.decode_tensors_serve(*sources)):
            return None
        if bf16:
            with torch.no_grad():
                layers = [{name: value.detach().to(torch.bfloat16).contiguous() if name in ops.PRODUCT_WEIGHTS
                           else value for name, value in layer.items()} for layer in layers]
        settings = tuple(setting for block in self.blocks for setting in block.decode_settings())
        # The final norm and the tied head join the call where they are what the step after it would run
        # (this RMSNorm and a float32 head, both read as they are): forward_embeddings then takes the
        # hidden state and logits from the call for as many rows as ops.rms_norm and ops.linear serve.
        head = None
        norm, table = self.norm, self.embedding.weight
        if (type(norm) is RMSNorm and ops.decode_tensors_serve(norm.weight, table) and table.dim() == 2
                and norm.weight.shape == (self.config.dim,) and table.shape[1] == self.config.dim
                and first.connection.streams <= ops.HEAD_MAX_STREAMS):
            head = {"norm": norm.weight, "eps": norm.eps, "weight": table}
            sources = sources + [norm.weight, table]
            settings = settings + ((norm, "eps"),)
        stack = ops.DecodeStack(layers, heads=self.config.heads, top_k=first.moe.top_k,
                                double_residual=first.connection.mode == "double-residual",
                                eps=first.attn_norm.eps, floor=DENOMINATOR_FLOOR, head=head)
        _DECODE_OPERANDS.setdefault(self, {})[bf16] = _DecodeOperands.of(self, sources, settings, stack, bf16)
        return stack

    def _decode_stack(self, streams: torch.Tensor, position: int, cache: ModelCache):
        """One cached token per row through every block in one C call (ops.DecodeStack) where it serves:
        the CPU in float32 without gradients, up to 512 rows, the "double-residual" or "delta" streams.
        -> (the new streams, routed slots [layers, E], the final norm of the streams' mean [B, 1, D] and its
        logits [B, 1, V] where the call computed them too, else None and None) with the cache's states
        advanced, or None: the blocks then run one by one (the test oracle), nothing changed."""
        if not ops.decode_stack_serves(streams) or not ops.head_dim_serves(self.config.head_dim):
            return None
        stack = self._decode_operands()
        if stack is None:
            return None
        states, after = [], []
        for block, state in zip(self.blocks, cache.layers):
            operands = block.attention.decode_operands(state, position)
            if operands is None:
                return None
            states.append(operands[0])
            after.append(operands[1])
        cos, sin = self.rope.cos[position], self.rope.sin[position]
        if stack.head_serves(streams.shape[1]) and _runs_as_defined(self.norm):
            stepped = stack.step_with_head(streams, states, cos, sin)
        else:
            stepped = (*stack.step(streams, states, cos, sin), None, None)
        cache.layers[:] = after
        return stepped

    # -- forward -------------------------------------------------------------------------------
    def _check_ids(self, ids) -> None:
        if not isinstance(ids, torch.Tensor):
            raise ValueError(f"ids must be a torch.Tensor, got {type(ids).__name__}")
        if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
            raise ValueError(f"ids must have an integer dtype, got {ids.dtype}")
        if ids.dim() != 2:
            raise ValueError(f"ids must have shape [batch, time], got rank {ids.dim()} shape {tuple(ids.shape)}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            raise ValueError(
                f"ids must lie in [0, {self.config.vocab_size}), got values in [{int(ids.min())}, {int(ids.max())}]")

    def _check_length(self, batch: int, length: int, cache: ModelCache | None) -> int:
        if length < 1:
            raise ValueError("sequence must have at least one position")
        position = 0 if cache is None else cache.position
        limit = self.config.max_sequence_length
        if position + length > limit:
            where = f" (cache already holds {position})" if cache is not None else ""
            raise ValueError(f"sequence of {length} tokens{where} exceeds max_sequence_length {limit}")
        if cache is not None and cache.batch_size != batch:
            raise ValueError(f"cache was made for batch size {cache.batch_size}, got a batch of {batch}")
        return position

    def forward(self, ids: torch.Tensor, cache: ModelCache | None = None, balance_reduce=None) -> ModelOutput:
        """ids [B, T] -> logits [B, T, V]; with `cache`, ids continue the cached sequence.

        `balance_reduce` (data-parallel training only) sums balance statistics across ranks.
        """
        self._check_ids(ids)
        ids = ids.long()
        # PAD (id 0) tokens do not count towards the balance statistics.
        token_mask = ids != 0 if self.config.balance_loss == "differentiable" else None
        return self.forward_embeddings(self.embedding(ids), cache=cache, token_mask=token_mask,
                                       balance_reduce=balance_reduce)

    def forward_embeddings(
        self, embedded: torch.Tensor, cache: ModelCache | None = None, token_mask: torch.Tensor | None = None,
        balance_reduce=None,
    ) -> ModelOutput:
        """The body on embeddings [B, T, D] (the vision path enters here)."""
        cfg = self.config
        if embedded.dim() != 3 or embedded.shape[-1] != cfg.dim:
            raise ValueError(f"embeddings must have shape [batch, time, {cfg.dim}], got {tuple(embedded.shape)}")
        b, t, _ = embedded.shape
        position = self._check_length(b, t, cache)
        streams = embedded.unsqueeze(0).expand(cfg.streams, b, t, cfg.dim)  # [S, B, T, D]
        usage, balances = [], []
        stepped = self._decode_stack(streams, position, cache) if cache is not None and t == 1 else None
        hidden = logits = None
        if stepped is not None:  # one cached token per row, every layer in one C call
            streams, usage, hidden, logits = stepped  # routed slots [layers, E]; the head's, where it ran there
        else:
            for i, block in enumerate(self.blocks):
                state = cache.layers[i] if cache is not None else None
                streams, new_state, used, balance = block(
                    streams, self.rope, position, state, cache is not None, token_mask, balance_reduce)
                if cache is not None:
                    cache.layers[i] = new_state
                usage.append(used)
                balances.append(balance)
        if cache is not None:
            cache.position = position + t
        if logits is None:
            hidden = self.norm(streams.mean(dim=0))
            logits = ops.linear(hidden, self.embedding.weight)
        usage_by_layer = (usage if stepped is not None else torch.stack(usage)).float()
        usage_by_layer = usage_by_layer / usage_by_layer.sum(-1, keepdim=True).clamp_min(1.0)
        if cache is not None:  # decoding: no balance statistics
            aux = logits.new_zeros(())
        elif cfg.balance_loss == "hard-count":
            aux = original_balance_metric(usage_by_layer)
        else:
            aux = torch.stack(balances).mean()
        return ModelOutput(logits=logits, aux_loss=aux, usage=usage_by_layer, hidden=hidden)


__all__ = ["GLM53Flash", "ModelOutput", "ModelCache", "HybridBlock", "LinearState", "SparseKV"]


def load_pretrained(directory, device="cpu", verify: bool = True) -> tuple[GLM53Flash, dict]:
    """(model, metadata) from a saved model or a training checkpoint, hashes verified; model/pretrained.py
    checks every size, hash and tensor shape before the model is built."""
    return load_model(GLM53Flash, directory, device=device, verify=verify)
