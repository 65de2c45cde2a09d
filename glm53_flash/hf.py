"""Hugging Face Transformers interop (the optional `hf` extra: `pip install 'glm53_flash[hf]'`).

Every checkpoint directory is a Transformers model directory in the remote-code layout (written by
model/pretrained.py): config.json's `auto_map` names three modules in the directory, each of which
imports its class from this module of the installed package, so any Python with glm53_flash loads
it the way Hugging Face tools do, without importing anything first:

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("runs/rl/checkpoint-0096", trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained("runs/rl/checkpoint-0096", trust_remote_code=True)
    ids = tokenizer(["def f(x):", "def g(y, z):"], return_tensors="pt", padding=True)
    out = model.generate(**ids, max_new_tokens=24)                     # greedy, cached, left-padded batch

A Python without the package gets one ImportError line naming it. Importing this module also
registers the classes with the Auto classes, so after `import glm53_flash.hf` the flag is not needed.

- `GLM53FlashConfig` reads config.json's own field names (`dim`, `layers`, ...) and the conventional
  ones config.json also carries (`hidden_size`, `num_hidden_layers`, ...), so old checkpoints load too;
  `model_config()` is the ModelConfig.
- `GLM53FlashForCausalLM.from_pretrained` loads through the project's own loader (sizes, shapes and
  hashes checked before anything is built) and returns the model in eval mode; `device_map` may name
  one device in any of Transformers' forms ("cpu", "auto", {"": "cpu"}, a map whose every entry is one
  device). `save_pretrained` writes the project's format (into an existing directory too, as trainers
  save), so a directory TRL's trainers write loads again everywhere.
- The forward takes `attention_mask` with padding before a row's tokens (left, as batched generation
  pads prompts) and/or after them (right, as TRL pads completions): each row is computed from its own
  tokens alone, so a padded batch gives every row what it gives alone; padded positions get zeros.
- Cache: `use_cache=True` returns `GLM53FlashCache`, the model's own decode state behind Transformers'
  `Cache` API (`out.cache`; the forward reads it back from `cache=`). Rows whose tokens start at the
  same column share one decode state; a cached forward takes left padding only. Beam search and
  `num_return_sequences` reorder and repeat its rows; it cannot be cropped (its linear-attention
  state is a running sum), so assisted and prompt-lookup decoding are refused in one line.
- `generate` is Transformers' own loop (logits processors, stopping criteria, streamers,
  GenerationConfig, `num_return_sequences`, beam search), with PAD, BOS and SEP suppressed (the
  sampler's mask: generation_config.json says so too) and the cache on by default. Greedy equals
  `glm53 generate --stop eos` token for token, cached or not. Sampling draws from torch's global
  generator as Transformers does (`torch.manual_seed` / `transformers.set_seed` make a call
  repeatable); the project's keyed streams (the same samples whatever else shares the batch) are
  `glm53_flash.evaluation.sampling.generate`, and generate() refuses a `seed=` in one line.
- TRL: `base_model` is the backbone (its `last_hidden_state` is the final norm's output) and
  `get_output_embeddings()` the tied head, which TRL's fused log-probability head looks up.
- `GLM53FlashTokenizer` is the byte tokenizer (bytes 0-255 at ids 4-259; PAD 0, BOS 1, EOS 2, SEP 3,
  which decode to `<pad>`, `<bos>`, `<eos>`, `<sep>`); it adds BOS (`add_bos_token`), pads on the
  left by default, honours tokenizer_config.json and from_pretrained's keyword arguments
  (`padding_side=...`), and encodes any text as its bytes (text that spells `<eos>` is five bytes).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import (
    AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, GenerationMixin, PretrainedConfig,
    PreTrainedModel, PreTrainedTokenizer,
)
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutputWithPast

from glm53_flash.data.tokenizer import ByteTokenizer
from glm53_flash.model.config import ModelConfig
from glm53_flash.model.pretrained import (
    CONVENTIONAL_KEYS, GENERATION_CONFIG_FILE, MODEL_TYPE, SPECIAL_TOKENS, TOKENIZER_CONFIG_FILE,
    generation_document, save_into,
)

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


class GLM53FlashCache(Cache):
    """The model's decode state (ModelCache) behind Transformers' Cache API. Rows whose tokens start at
    the same column (left padding) share one ModelCache, since a ModelCache has one position for all
    its rows; `starts[r]` is row r's first column, and `get_seq_length()` counts the columns consumed,
    padding included (what Transformers' generate compares with the mask's width). Rows are reordered
    and repeated by index (beam search, num_return_sequences); the state cannot be cropped."""

    def __init__(self) -> None:
        super().__init__(layers=[])
        self.columns = 0
        self.starts: list[int] = []
        self.groups: list[tuple[list[int], object]] = []  # (rows, ModelCache), rows in the ModelCache's order

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_croppable(self) -> bool:
        return False

    @property
    def is_initialized(self) -> bool:
        return bool(self.groups)

    @property
    def batch_size(self) -> int:
        return len(self.starts) if self.groups else -1

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.columns

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    def reset(self) -> None:
        self.__init__()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            raise ValueError("glm53_flash's cache holds running linear-attention sums and cannot be cropped: "
                             "assisted, prompt-lookup and speculative decoding are not supported")

    def select_rows(self, index) -> None:
        """Keep rows `index` (new row i is old row index[i]; rows may repeat)."""
        index = [int(i) for i in torch.as_tensor(index).flatten().tolist()]
        where = {}
        for g, (rows, _) in enumerate(self.groups):
            for place, row in enumerate(rows):
                where[row] = (g, place)
        groups = []
        for g, (_, state) in enumerate(self.groups):
            taken = [(new, where[old][1]) for new, old in enumerate(index) if where[old][0] == g]
            if taken:
                state.keep_rows(torch.tensor([place for _, place in taken]))
                groups.append(([new for new, _ in taken], state))
        self.groups = groups
        self.starts = [self.starts[old] for old in index]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.select_rows(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.select_rows(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.select_rows(torch.arange(len(self.starts)).repeat_interleave(repeats))


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


# from_pretrained's keyword arguments that ask for nothing here when they have these values (where to
# download from, what Transformers' own loader should do); any other value is refused in one line.
_NEUTRAL_LOADING = {"revision": (None, "main"), "subfolder": (None, ""), "gguf_file": (None,),
                    "quantization_config": (None,), "attn_implementation": (None, "eager", "sdpa"),
                    "use_safetensors": (None, True), "variant": (None,), "tp_plan": (None,), "adapter_kwargs": (None,)}
_IGNORED_LOADING = {"trust_remote_code", "cache_dir", "force_download", "proxies", "token", "local_files_only",
                    "code_revision", "_from_auto", "_from_pipeline", "_commit_hash", "low_cpu_mem_usage",
                    "resume_download", "user_agent", "offload_folder", "offload_state_dict", "max_memory"}


def one_device(device_map) -> torch.device | str:
    """The device a `device` / `device_map` value places the whole model on: a device (name, torch.device
    or CUDA index), "auto", or a map whose every entry names the same device."""
    if isinstance(device_map, dict):
        devices = {str(torch.device(f"cuda:{d}" if isinstance(d, int) else d)) for d in device_map.values()}
        if len(devices) != 1:
            raise ValueError(f"glm53_flash loads onto one device; device_map places parts on {sorted(devices)}")
        device_map = devices.pop()
    if device_map in (None, "auto"):
        from glm53_flash.core.runtime import resolve_device

        return resolve_device("auto") if device_map == "auto" else "cpu"
    if isinstance(device_map, int) and not isinstance(device_map, bool):
        return torch.device("cuda", device_map)
    if isinstance(device_map, (str, torch.device)):
        return torch.device(device_map)
    raise ValueError(f"glm53_flash loads onto one device: device_map {device_map!r:.60} is not a device or a map")


class GLM53FlashForCausalLM(PreTrainedModel, GenerationMixin):
    """The project's GLM53Flash (as `.model`) behind Transformers' model API."""

    config_class = GLM53FlashConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"

    def __init__(self, config: GLM53FlashConfig, model=None) -> None:
        super().__init__(config)
        from glm53_flash.model import GLM53Flash

        self.model = model if model is not None else GLM53Flash(config.model_config())
        self.generation_config = GenerationConfig(**generation_document())
        self.post_init()
        self.loaded_from: dict = {}

    def _init_weights(self, module) -> None:  # GLM53Flash initialises its own weights when it is built
        pass

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:  # the forward makes its own cache (GLM53FlashCache)
        return False

    # -- embeddings ----------------------------------------------------------------------------
    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embedding

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        """A new embedding (and so a new tied head): the vocabulary becomes its number of rows."""
        if not isinstance(value, nn.Embedding) or value.embedding_dim != self.model.config.dim:
            raise ValueError(f"glm53_flash takes an nn.Embedding of dimension {self.model.config.dim}, got {value!r:.80}")
        self.model.config = self.model.config.replace(vocab_size=value.num_embeddings)
        self.model.embedding = value
        self.config.vocab_size = value.num_embeddings

    def get_output_embeddings(self) -> _TiedHead:
        return _TiedHead(self.model.embedding)

    def set_output_embeddings(self, value) -> None:
        _TiedHead(self.model.embedding).weight = getattr(value, "weight", value)

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        """Transformers' resizing of the embedding; the tied head follows it (there is no other head)."""
        old = self.get_input_embeddings()
        trainable = old.weight.requires_grad
        new = self._get_resized_embeddings(old, new_num_tokens, pad_to_multiple_of, mean_resizing)  # may be `old`
        self.set_input_embeddings(new.requires_grad_(trainable))
        return self.get_input_embeddings()

    @property
    def base_model(self) -> _Backbone:
        return _Backbone(self)

    # -- forward -------------------------------------------------------------------------------
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

    def run_cached(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, cache: GLM53FlashCache
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, hidden) of `input_ids` continuing `cache` (empty: the prompts, left-padded), which advances."""
        b, t = input_ids.shape
        if not cache.groups:  # the prompts: rows grouped by the column their tokens start at
            if attention_mask is None:
                starts = [0] * b
            else:
                begin, lengths = row_spans(attention_mask.to(input_ids.device))
                if bool((lengths == 0).any()) or bool((begin + lengths != attention_mask.shape[1]).any()):
                    raise ValueError("a cached forward takes padding before a row's tokens only (left padding: "
                                     "padding_side='left'), and every row needs at least one token")
                starts = begin.tolist()
            cache.starts = starts
            cache.groups = [([r for r in range(b) if starts[r] == s], self.model.new_cache(starts.count(s)))
                            for s in sorted(set(starts))]
        elif len(cache.starts) != b:
            raise ValueError(f"the cache holds {len(cache.starts)} rows, the input has {b}")
        elif attention_mask is not None and (attention_mask.shape[1] != cache.columns + t
                                             or not bool(attention_mask[:, -t:].all())):
            raise ValueError(f"a cached forward continues every row: attention_mask must be the {cache.columns} "
                             f"columns the cache holds followed by {t} ones")
        logits = hidden = None
        for rows, state in cache.groups:
            start = max(cache.starts[rows[0]] - cache.columns, 0)
            out = self.model(input_ids[rows, start:], cache=state)
            if logits is None:
                logits = out.logits.new_zeros(b, t, out.logits.shape[-1])
                hidden = out.hidden.new_zeros(b, t, out.hidden.shape[-1])
            logits[rows, start:] = out.logits
            hidden[rows, start:] = out.hidden
        cache.columns += t
        return logits, hidden

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, cache: GLM53FlashCache | None = None, use_cache: bool | None = None,
                logits_to_keep: int | torch.Tensor = 0, return_dict: bool | None = None,
                output_hidden_states: bool | None = None, output_attentions: bool | None = None,
                inputs_embeds: torch.Tensor | None = None, past_key_values: GLM53FlashCache | None = None,
                **unknown) -> CausalLMOutputWithPast:
        """Logits [B, T, V] (the last `logits_to_keep` positions when it is set) of token ids; `labels` (the
        inputs, Transformers' convention) give the mean next-token loss; `use_cache=True` or a `cache`
        (`past_key_values`, the older name) runs cached and returns the advanced cache as `cache`."""
        if unknown:
            raise TypeError(f"glm53_flash's forward does not take {', '.join(sorted(unknown))}")
        if inputs_embeds is not None or input_ids is None:
            raise ValueError("glm53_flash's forward takes input_ids (it has no inputs_embeds path)")
        if output_attentions:
            raise ValueError("glm53_flash does not return attention weights (its linear attention has none)")
        if output_hidden_states:
            raise ValueError("glm53_flash returns no per-layer hidden states; base_model(...).last_hidden_state "
                             "is the final norm's output")
        cache = cache if cache is not None else past_key_values
        if cache is not None and not isinstance(cache, GLM53FlashCache):
            raise TypeError(f"glm53_flash reads its own cache (GLM53FlashCache, what use_cache=True returns), "
                            f"not {type(cache).__name__}")
        if cache is not None or use_cache:
            cache = GLM53FlashCache() if cache is None else cache
            logits, _ = self.run_cached(input_ids, attention_mask, cache)
        else:
            logits, _ = self.run(input_ids, attention_mask)
        loss = None
        if labels is not None:  # Transformers' convention: labels are the inputs, shifted here
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        if isinstance(logits_to_keep, int):
            logits = logits[:, -logits_to_keep:] if logits_to_keep else logits
        else:
            logits = logits[:, logits_to_keep]
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)

    # -- generation ----------------------------------------------------------------------------
    def generate(self, inputs: torch.Tensor | None = None, generation_config: GenerationConfig | None = None,
                 **kwargs):
        """Transformers' generate (see the module's note), after refusing in one line what this model cannot
        do: a `seed=` (sampling draws from torch's global generator), and decoding that rolls the cache back
        (an assistant model, prompt lookup)."""
        if "seed" in kwargs:
            raise TypeError("generate() takes no seed: sampling draws from torch's global generator (torch.manual_seed "
                            "or transformers.set_seed); glm53_flash.evaluation.sampling.generate keys each sample's stream")
        settings = generation_config or self.generation_config
        if kwargs.get("assistant_model") is not None or (kwargs.get("prompt_lookup_num_tokens")
                                                          or getattr(settings, "prompt_lookup_num_tokens", None)):
            raise ValueError("glm53_flash's cache cannot be rolled back: assisted and prompt-lookup decoding are not "
                             "supported")
        return super().generate(inputs, generation_config, **kwargs)

    # -- saving and loading ----------------------------------------------------------------------
    def save_pretrained(self, save_directory, is_main_process: bool = True, state_dict: dict | None = None,
                        safe_serialization: bool = True, push_to_hub: bool = False, **unknown) -> None:
        """The project's saved-model files (model/pretrained.py `save_into`) into `save_directory`, which may
        exist (a trainer makes its checkpoint directory first): from_pretrained, ours and the Auto classes',
        loads it. `state_dict` (the wrapper's names, as trainers pass it) replaces the model's weights."""
        if unknown:
            raise TypeError(f"glm53_flash's save_pretrained does not take {', '.join(sorted(unknown))}")
        if not safe_serialization or push_to_hub:
            raise ValueError("glm53_flash saves safetensors locally (safe_serialization=True, push_to_hub=False); "
                             "push the directory with huggingface_hub's upload_folder")
        if not is_main_process:
            return
        state = None
        if state_dict is not None:
            prefix = self.base_model_prefix + "."
            state = {key.removeprefix(prefix): value for key, value in state_dict.items()}
            if set(state) != set(self.model.state_dict()):
                raise ValueError("state_dict does not hold this model's tensors (model.<name> for every weight)")
        save_into(self.model, save_directory, {"stage": "saved_by_transformers", **self.loaded_from}, state)

    @classmethod
    def from_pretrained(cls, path, *args, config: GLM53FlashConfig | None = None, **kwargs) -> GLM53FlashForCausalLM:
        """A checkpoint directory through the project's loader (sizes, shapes and hashes checked before
        anything is built); `device` / `device_map` place it on one device and `dtype` / `torch_dtype` cast
        it ("auto": the dtype config.json records); the model comes back in eval mode. Hub and loader
        settings that ask for nothing here are accepted; any other is refused in one line."""
        from glm53_flash.model.lm import load_pretrained

        if args:
            raise TypeError("glm53_flash's from_pretrained takes the directory and keyword arguments only")
        device = one_device(kwargs.pop("device", None) or kwargs.pop("device_map", None))
        kwargs.pop("device_map", None)
        dtype = kwargs.pop("dtype", None) or kwargs.pop("torch_dtype", None)
        kwargs.pop("torch_dtype", None)
        for key, allowed in _NEUTRAL_LOADING.items():
            if key in kwargs and kwargs.pop(key) not in allowed:
                raise ValueError(f"glm53_flash's from_pretrained does not take {key}=... (allowed: {allowed})")
        unknown = sorted(set(kwargs) - _IGNORED_LOADING)
        if unknown:
            raise TypeError(f"glm53_flash's from_pretrained does not take {', '.join(unknown)}")
        directory = Path(path)
        model, metadata = load_pretrained(directory, device)
        if config is not None and config.model_config() != model.config:
            raise ValueError(f"the config given to from_pretrained describes another model than {directory}'s")
        loaded = GLM53FlashConfig(**{**model.config.to_dict(), "name_or_path": str(path)})
        wrapper = cls(loaded, model=model)
        wrapper.loaded_from = {"loaded_from": str(path), "loaded_sha256": metadata.get("weights_sha256")}
        if (directory / GENERATION_CONFIG_FILE).is_file():
            wrapper.generation_config = GenerationConfig.from_pretrained(directory)
        if dtype == "auto":
            dtype = getattr(GLM53FlashConfig.from_pretrained(directory), "dtype", None) or torch.float32
        if dtype is not None:
            wrapper = wrapper.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
        return wrapper.eval()


class GLM53FlashTokenizer(PreTrainedTokenizer):
    """The byte tokenizer as a Transformers tokenizer: a BOS first (`add_bos_token`), bytes at ids 4-259,
    the special ids by name; tokenizer_config.json and keyword arguments set it as Transformers' own do."""

    model_input_names = ["input_ids", "attention_mask"]
    vocab_files_names: dict = {}
    padding_side = "left"
    truncation_side = "left"

    def __init__(self, add_bos_token: bool = True, **kwargs) -> None:
        self._specials = {name: token_id for name, token_id in SPECIAL_TOKENS.values()}
        for key, (name, _) in SPECIAL_TOKENS.items():
            kwargs.setdefault(key, name)
        kwargs.setdefault("padding_side", "left")
        kwargs.setdefault("truncation_side", "left")
        kwargs.setdefault("split_special_tokens", True)  # text is its bytes, whatever it spells
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        self.add_bos_token = add_bos_token
        super().__init__(**kwargs)

    @property
    def vocab_size(self) -> int:
        return _TOKENIZER.vocab_size

    def get_vocab(self) -> dict[str, int]:
        vocab = {self._byte_token(b): b + _TOKENIZER.byte_offset for b in range(256)}
        return {**vocab, **self._specials}

    @staticmethod
    def _byte_token(b: int) -> str:
        return chr(b) if 32 < b < 127 else f"<0x{b:02X}>"

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return [self._byte_token(b) for b in text.encode("utf-8")]

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
        return self._byte_token(index - _TOKENIZER.byte_offset)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        """Bytes decode as UTF-8 (invalid sequences as U+FFFD); a special token is its name."""
        text, run = [], bytearray()
        for token in tokens:
            if token in self._specials:
                text.append(run.decode("utf-8", errors="replace") + token)
                run = bytearray()
            else:
                run.append(self._convert_token_to_id(token) - _TOKENIZER.byte_offset)
        return "".join(text) + run.decode("utf-8", errors="replace")

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        ids = ([_TOKENIZER.bos_id] if self.add_bos_token else []) + list(token_ids_0)
        return ids if token_ids_1 is None else ids + [_TOKENIZER.sep_id] + list(token_ids_1)

    def get_special_tokens_mask(self, token_ids_0, token_ids_1=None, already_has_special_tokens: bool = False):
        if already_has_special_tokens:
            return [int(t in self._specials.values()) for t in list(token_ids_0) + list(token_ids_1 or [])]
        mask = ([1] if self.add_bos_token else []) + [0] * len(token_ids_0)
        return mask if token_ids_1 is None else mask + [1] + [0] * len(token_ids_1)

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple:
        return ()  # the vocabulary is the 256 bytes and four specials: nothing to write

    @classmethod
    def from_pretrained(cls, path, *args, **kwargs) -> GLM53FlashTokenizer:
        """Transformers' loading of tokenizer_config.json with the keyword arguments over it; a checkpoint
        written before the tokenizer's files gets the defaults and the keyword arguments."""
        directory = Path(path)
        if directory.is_dir() and not (directory / TOKENIZER_CONFIG_FILE).is_file():
            settings = {k: v for k, v in kwargs.items() if k not in _IGNORED_LOADING | set(_NEUTRAL_LOADING)
                        | {"use_fast", "_from_auto"}}
            return cls(name_or_path=str(path), **settings)
        return super().from_pretrained(path, *args, **kwargs)


AutoConfig.register(MODEL_TYPE, GLM53FlashConfig, exist_ok=True)
AutoModel.register(GLM53FlashConfig, GLM53FlashForCausalLM, exist_ok=True)
AutoModelForCausalLM.register(GLM53FlashConfig, GLM53FlashForCausalLM, exist_ok=True)
AutoTokenizer.register(GLM53FlashConfig, slow_tokenizer_class=GLM53FlashTokenizer, exist_ok=True)

__all__ = ["GLM53FlashCache", "GLM53FlashConfig", "GLM53FlashForCausalLM", "GLM53FlashTokenizer"]
