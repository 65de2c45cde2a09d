"""Hugging Face Transformers interop (the optional `hf` extra: `pip install 'glm53_flash[hf]'`).

Importing this module registers the model with the Auto classes, so a checkpoint directory any run
wrote loads the way Transformers users expect:

    import glm53_flash.hf  # registers "glm53_flash" with AutoConfig / AutoModel(ForCausalLM) / AutoTokenizer
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("runs/rl/checkpoint-0096")   # eval mode, weights hash-checked
    tokenizer = AutoTokenizer.from_pretrained("runs/rl/checkpoint-0096")
    ids = tokenizer("def f(x):", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=24)                                  # greedy

Registered classes, not `auto_map` with code shipped in each checkpoint: a checkpoint stays data
(config, weights, metadata, card) and no `trust_remote_code` is needed; the cost is the import above.

- `GLM53FlashConfig` reads config.json's own field names (`dim`, `layers`, ...) and the conventional
  ones config.json also carries (`hidden_size`, `num_hidden_layers`, ...: model/pretrained.py), so old
  checkpoints load too; `model_config()` is the ModelConfig.
- `GLM53FlashForCausalLM.from_pretrained` loads through the project's own loader (every file checked
  against metadata.json, older expert layouts converted) and returns the model in eval mode.
- `generate`: greedy is Transformers' own loop over our forward with PAD, BOS and SEP suppressed (the
  sampler's mask), stopping at EOS; it equals `glm53 generate --stop eos` token for token (tested).
  Sampling (`do_sample=True`) goes to the project's sampler instead, because its random stream is keyed
  by (seed, prompt, sample) so a run's samples are reproducible whatever else is batched with them;
  Transformers' sampler draws from the global generator and could not give the same tokens. Without
  `seed=`, one is drawn from torch's global generator (so `torch.manual_seed` makes a call repeatable
  and successive calls differ); copies of one prompt in a call are that prompt's samples 0, 1, ...
- Padding: `attention_mask` may mark padding before a row's tokens (left, as batched generation and
  TRL pad prompts) and after them (right, as TRL pads completions). Each row is computed from its own
  tokens alone (rows starting at the same column share a forward; the model is causal, so tokens
  after a row's end change nothing before it), so a padded batch gives every row exactly what it
  gives alone; padded positions get zeros. Padding inside a row is refused in one line.
- TRL: `base_model` is the backbone (its `last_hidden_state` is the final norm's output) and
  `get_output_embeddings()` the tied head, which is what TRL's fused log-probability head looks up;
  tests/test_hf.py runs one GRPOTrainer step on a tiny checkpoint with `VerifierReward`.
- `GLM53FlashTokenizer` is the byte tokenizer (bytes 0-255 at ids 4-259; PAD 0, BOS 1, EOS 2, SEP 3).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import (
    AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer, GenerationMixin, PretrainedConfig, PreTrainedModel,
    PreTrainedTokenizer,
)
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput

from glm53_flash.data.tokenizer import ByteTokenizer
from glm53_flash.model.config import ModelConfig
from glm53_flash.model.pretrained import CONVENTIONAL_KEYS, MODEL_TYPE

_TOKENIZER = ByteTokenizer()
_FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig))


class GLM53FlashConfig(PretrainedConfig):
    """The model's config under Transformers: the sizes by their conventional names (`hidden_size`,
    `num_hidden_layers`, `num_attention_heads`, `max_position_embeddings`, `num_local_experts`,
    `num_experts_per_tok`, `moe_intermediate_size`), every other ModelConfig field by its own; either
    spelling is read. (`top_k` would be taken for a sampling setting by Transformers' generate.)"""

    model_type = MODEL_TYPE

    def __init__(self, **kwargs) -> None:
        defaults = ModelConfig().to_dict()
        for ours, conventional in CONVENTIONAL_KEYS.items():
            value = kwargs.pop(ours, None)
            if conventional not in kwargs:
                kwargs[conventional] = defaults[ours] if value is None else value
        own = {name: kwargs.pop(name, defaults[name]) for name in _FIELDS if name not in CONVENTIONAL_KEYS}
        kwargs.pop("tokenizer", None)  # the description config.json carries; the tokenizer is fixed
        for key, value in (("bos_token_id", _TOKENIZER.bos_id), ("eos_token_id", _TOKENIZER.eos_id),
                           ("pad_token_id", _TOKENIZER.pad_id), ("tie_word_embeddings", True)):
            kwargs.setdefault(key, value)
        super().__init__(**kwargs)
        for name, value in own.items():
            setattr(self, name, list(value) if isinstance(value, tuple) else value)
        self.model_config()  # a config that cannot build the model is refused here, in one line

    def model_config(self) -> ModelConfig:
        values = {name: getattr(self, CONVENTIONAL_KEYS.get(name, name)) for name in _FIELDS}
        return ModelConfig(**values)


def row_spans(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(start, length) of each row's tokens in a [B, T] mask of ones with zeros before and/or after
    them; padding inside a row is refused."""
    mask = attention_mask.bool()
    if mask.dim() != 2:
        raise ValueError(f"attention_mask must be [batch, time], got {tuple(mask.shape)}")
    lengths = mask.sum(dim=1)
    starts = torch.where(lengths > 0, mask.int().argmax(dim=1), torch.zeros_like(lengths))
    columns = torch.arange(mask.shape[1], device=mask.device)
    if not torch.equal(mask, (columns >= starts[:, None]) & (columns < (starts + lengths)[:, None])):
        raise ValueError("glm53_flash takes padding before or after a row's tokens, not inside a row")
    return starts, lengths


class _Backbone:
    """The model without its head, as Transformers' tools call a backbone: `last_hidden_state` [B, T, D]."""

    _tp_plan = _pp_plan = None  # no tensor or pipeline parallel plan (what Transformers asks a backbone)

    def __init__(self, lm: GLM53FlashForCausalLM) -> None:
        self._lm = lm

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, use_cache=None,
                 return_dict=None, **unknown) -> BaseModelOutput:
        if unknown:
            raise TypeError(f"glm53_flash's backbone takes input_ids and attention_mask, not {', '.join(unknown)}")
        return BaseModelOutput(last_hidden_state=self._lm.run(input_ids, attention_mask)[1])


class _TiedHead:
    """The tied head as Transformers' tools expect an output embedding: weight [vocab, dim], no bias."""

    bias = None

    def __init__(self, embedding: torch.nn.Embedding) -> None:
        self._embedding = embedding

    @property
    def weight(self) -> torch.nn.Parameter:
        return self._embedding.weight

    @weight.setter
    def weight(self, value) -> None:  # tying it to the input embedding is what it already is
        if value is not self._embedding.weight:
            raise ValueError("glm53_flash's head is tied to its embedding; it takes no other weight")

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight)


class GLM53FlashForCausalLM(PreTrainedModel, GenerationMixin):
    """The project's GLM53Flash (as `.model`) behind Transformers' model API."""

    config_class = GLM53FlashConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _supports_cache_class = False

    def __init__(self, config: GLM53FlashConfig, model=None) -> None:
        super().__init__(config)
        from glm53_flash.model import GLM53Flash

        self.model = model if model is not None else GLM53Flash(config.model_config())
        self.generation_config.suppress_tokens = [_TOKENIZER.pad_id, _TOKENIZER.bos_id, _TOKENIZER.sep_id]
        self.generation_config.use_cache = False
        self.post_init()

    def _init_weights(self, module) -> None:  # GLM53Flash initialises its own weights when it is built
        pass

    def get_input_embeddings(self):
        return self.model.embedding

    def get_output_embeddings(self) -> _TiedHead:
        return _TiedHead(self.model.embedding)

    @property
    def base_model(self) -> _Backbone:
        return _Backbone(self)

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, T, V], hidden [B, T, D]), each row computed from its own tokens alone (see the
        module's note on padding); padded positions are zeros."""
        if attention_mask is None or bool(attention_mask.all()):
            out = self.model(input_ids)
            return out.logits, out.hidden
        starts, lengths = row_spans(attention_mask.to(input_ids.device))
        if not bool((lengths > 0).any()):
            raise ValueError("every row of attention_mask is padding: there is nothing to compute")
        b, t = input_ids.shape
        logits = hidden = None
        for start in sorted(set(starts[lengths > 0].tolist())):
            rows = ((starts == start) & (lengths > 0)).nonzero().flatten()
            out = self.model(input_ids[rows, start:])
            if logits is None:
                logits = out.logits.new_zeros(b, t, out.logits.shape[-1])
                hidden = out.hidden.new_zeros(b, t, out.hidden.shape[-1])
            logits[rows, start:] = out.logits  # in place: autograd carries the rows' gradients back
            hidden[rows, start:] = out.hidden
        return logits, hidden

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, **kwargs) -> CausalLMOutput:
        logits, _ = self.run(input_ids, attention_mask)
        loss = None
        if labels is not None:  # Transformers' convention: labels are the inputs, shifted here
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    @classmethod
    def from_pretrained(cls, path, *args, **kwargs) -> GLM53FlashForCausalLM:
        """A checkpoint directory through the project's loader (files checked against metadata.json);
        `device` / `device_map` (a device name, or "auto") place it and `dtype` / `torch_dtype` cast it (the
        weights are float32); the model comes back in eval mode."""
        from glm53_flash.core.runtime import resolve_device
        from glm53_flash.model.lm import load_pretrained

        device = kwargs.get("device") or kwargs.get("device_map") or "cpu"
        if not isinstance(device, (str, torch.device)):
            raise ValueError("glm53_flash loads onto one device: give device= or device_map= a device name or 'auto'")
        model, _ = load_pretrained(Path(path), resolve_device(device) if device == "auto" else device)
        wrapper = cls(GLM53FlashConfig(**model.config.to_dict()), model=model)
        dtype = kwargs.get("dtype") or kwargs.get("torch_dtype")
        if dtype not in (None, "auto"):
            wrapper = wrapper.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
        return wrapper.eval()

    def generate(self, input_ids: torch.Tensor | None = None, generation_config=None, attention_mask=None,
                 seed: int | None = None, **kwargs) -> torch.Tensor:
        """Greedy: Transformers' generate over this forward (PAD/BOS/SEP suppressed, stopping at EOS).
        Sampled (`do_sample`, given or from `generation_config`): the project's keyed sampler (see the
        module's note); `seed` keys its stream. Returns each row's prompt ids as given (padding too)
        followed by the generated ones, rows padded on the right with PAD."""
        if input_ids is None:
            input_ids = kwargs.pop("inputs", None)  # Transformers' own name for the first argument
        if input_ids is None:
            raise ValueError("give input_ids (AutoTokenizer's output)")

        def setting(name, default):
            if name in kwargs:
                return kwargs[name]
            value = getattr(generation_config, name, None) if generation_config is not None else None
            return default if value is None else value

        if not setting("do_sample", False):
            if "max_new_tokens" not in kwargs and getattr(generation_config, "max_new_tokens", None) is None:
                kwargs["max_new_tokens"] = 48
            return super().generate(input_ids, generation_config=generation_config, attention_mask=attention_mask,
                                    **kwargs)
        from glm53_flash.evaluation.sampling import generate as sample

        unknown = set(kwargs) - {"do_sample", "max_new_tokens", "temperature", "top_k", "top_p"}
        if unknown:
            raise TypeError(f"sampled generate takes do_sample, max_new_tokens, temperature, top_k, top_p and seed, "
                            f"not {', '.join(sorted(unknown))}")
        if seed is None:  # like Transformers' sampling: torch's global generator decides, and moves on
            seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
        if attention_mask is None:
            real = [row.tolist() for row in input_ids]
        else:
            starts, lengths = row_spans(attention_mask.to(input_ids.device))
            real = [row[s:s + n].tolist() for row, s, n in zip(input_ids, starts.tolist(), lengths.tolist())]
        prompts = [_TOKENIZER.decode(ids) for ids in real]
        for ids, prompt in zip(real, prompts):
            if ids != _TOKENIZER.encode(prompt, bos=True):
                raise ValueError("sampled generate encodes each prompt as BOS + its bytes (the tokenizer's output); "
                                 f"a row reads {ids[:8]}...")
        distinct = list(dict.fromkeys(prompts))  # copies of one prompt are its samples 0, 1, ...
        copies = {p: prompts.count(p) for p in distinct}
        top_k, top_p = setting("top_k", None), setting("top_p", None)
        groups = sample(self.model, distinct, samples=max(copies.values()),
                        max_new_tokens=setting("max_new_tokens", 48), temperature=setting("temperature", 1.0),
                        top_k=top_k or None, top_p=None if top_p in (None, 1.0) else top_p, seed=seed, stop="eos")
        taken = {p: iter(group) for p, group in zip(distinct, groups)}
        rows = [list(row.tolist()) + list(next(taken[p]).token_ids) for row, p in zip(input_ids, prompts)]
        width = max(map(len, rows))
        return torch.tensor([r + [_TOKENIZER.pad_id] * (width - len(r)) for r in rows], device=input_ids.device)


class GLM53FlashTokenizer(PreTrainedTokenizer):
    """The byte tokenizer as a Transformers tokenizer: a BOS first (add_special_tokens), bytes at ids 4-259."""

    model_input_names = ["input_ids", "attention_mask"]
    vocab_files_names: dict = {}

    def __init__(self, **kwargs) -> None:
        self._specials = {"<pad>": _TOKENIZER.pad_id, "<bos>": _TOKENIZER.bos_id, "<eos>": _TOKENIZER.eos_id,
                          "<sep>": _TOKENIZER.sep_id}
        for key, token in (("pad_token", "<pad>"), ("bos_token", "<bos>"), ("eos_token", "<eos>"),
                           ("sep_token", "<sep>")):
            kwargs.setdefault(key, token)
        super().__init__(**kwargs)

    @property
    def vocab_size(self) -> int:
        return _TOKENIZER.vocab_size

    def get_vocab(self) -> dict[str, int]:
        vocab = {chr(b) if 32 < b < 127 else f"<0x{b:02X}>": b + _TOKENIZER.byte_offset for b in range(256)}
        return {**vocab, **self._specials}

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return [chr(b) if 32 < b < 127 else f"<0x{b:02X}>" for b in text.encode("utf-8")]

    def _convert_token_to_id(self, token: str) -> int:
        if token in self._specials:
            return self._specials[token]
        if len(token) == 1:
            return ord(token) + _TOKENIZER.byte_offset
        return int(token[3:-1], 16) + _TOKENIZER.byte_offset

    def _convert_id_to_token(self, index: int) -> str:
        for token, special in self._specials.items():
            if index == special:
                return token
        b = index - _TOKENIZER.byte_offset
        return chr(b) if 32 < b < 127 else f"<0x{b:02X}>"

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        ids = [self._convert_token_to_id(t) for t in tokens if t not in self._specials]
        return _TOKENIZER.decode(ids)

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        ids = [_TOKENIZER.bos_id] + list(token_ids_0)
        return ids if token_ids_1 is None else ids + [_TOKENIZER.sep_id] + list(token_ids_1)

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple:
        return ()  # the vocabulary is the 256 bytes and four specials: nothing to write

    @classmethod
    def from_pretrained(cls, *args, **kwargs) -> GLM53FlashTokenizer:
        return cls()


AutoConfig.register(MODEL_TYPE, GLM53FlashConfig, exist_ok=True)
AutoModel.register(GLM53FlashConfig, GLM53FlashForCausalLM, exist_ok=True)
AutoModelForCausalLM.register(GLM53FlashConfig, GLM53FlashForCausalLM, exist_ok=True)
AutoTokenizer.register(GLM53FlashConfig, slow_tokenizer_class=GLM53FlashTokenizer, exist_ok=True)

__all__ = ["GLM53FlashConfig", "GLM53FlashForCausalLM", "GLM53FlashTokenizer"]
