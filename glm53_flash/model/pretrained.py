"""Saved models beside the model: config.json, model.safetensors and metadata.json in one directory.

`GLM53Flash.save_pretrained(directory)` and `GLM53Flash.from_pretrained(directory)` use this file, and
so do training checkpoints (train/checkpoint.py adds the trainer state), so any checkpoint a run
wrote loads with `from_pretrained`. config.json follows the Hugging Face convention: the model's
fields plus `model_type`, `architectures`, `torch_dtype`, the special token ids, the tied head, the
conventional names of the sizes (`hidden_size`, `num_hidden_layers`, ...: glm53_flash/hf.py reads them) and a
description of the tokenizer; configs written before those keys existed still load. Directories are written atomically (a temporary sibling, then one
rename), and metadata.json records the sha256 of every other file, checked on load.

Loading is bounded: every size is checked before anything is read, hashed or allocated
(`MAX_FILE_BYTES` and `file_cap`; the config's sizes against ModelConfig's bounds and the memory the
machine has free; the weights' header, every tensor's name, shape and extent, against the model the
config describes, built on the meta device) and only then is the model built and its weights read.
"""

from __future__ import annotations

import json
from pathlib import Path

from glm53_flash.model.config import ModelConfig
from glm53_flash.core.receipts import atomic_directory, read_json, sha256_file, write_json
from glm53_flash.data.tokenizer import ByteTokenizer

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
METADATA_FILE = "metadata.json"
CARD_FILE = "README.md"  # the model card
MODEL_TYPE = "glm53_flash"
ARCHITECTURE = "GLM53Flash"
# The conventional (Hugging Face) names of ModelConfig fields, which config.json carries too.
CONVENTIONAL_KEYS = {"dim": "hidden_size", "layers": "num_hidden_layers", "heads": "num_attention_heads",
                     "max_sequence_length": "max_position_embeddings", "experts": "num_local_experts",
                     "top_k": "num_experts_per_tok", "expert_hidden": "moe_intermediate_size"}
# Keys config.json carries besides the ModelConfig fields (written from them; older files lack them).
TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
DESCRIPTIVE_KEYS = ("model_type", "architectures", "tokenizer", "torch_dtype", "dtype", "tie_word_embeddings",
                    "transformers_version", *TOKEN_KEYS,
                    *CONVENTIONAL_KEYS.values())
# The most bytes each file of a saved model may have, checked before it is read or hashed; the weights'
# and any other listed file's bound follows from the config (`file_cap`).
MAX_FILE_BYTES = {CONFIG_FILE: 1 << 16, METADATA_FILE: 1 << 20, CARD_FILE: 1 << 16}
MAX_CONFIG_BYTES = MAX_FILE_BYTES[CONFIG_FILE]
MAX_WEIGHTS_HEADER_BYTES = 1 << 24  # safetensors' JSON header (about 20 KB for the flash model)
# safetensors dtypes a saved model's tensors may have, with their sizes in bytes.
WEIGHT_DTYPES = {"F32": 4, "BF16": 2, "F16": 2}
# Older names of tensors, with how the current tensor's shape reads in them (moe.py converts them on load):
# routed experts' up-projection was expert_up [E, D, 2H], now expert_gate_up [E, 2H, D].
OLDER_TENSOR_NAMES = {"expert_gate_up": ("expert_up", lambda shape: (shape[0], shape[2], shape[1]))}


class CheckpointError(ValueError):
    """A checkpoint directory is missing, incomplete, corrupt or larger than its config allows."""


def tokenizer_description() -> dict:
    tokenizer = ByteTokenizer()
    return {"type": "bytes", "byte_offset": tokenizer.byte_offset, "vocab_size": tokenizer.vocab_size,
            "special_ids": {"pad": tokenizer.pad_id, "bos": tokenizer.bos_id, "eos": tokenizer.eos_id,
                            "sep": tokenizer.sep_id}}


def config_document(config: ModelConfig) -> dict:
    """config.json's content: the Hugging Face keys (model type, architecture, dtype, special token ids,
    tied head, and the conventional names of the sizes), then every ModelConfig field by its own name."""
    tokenizer = ByteTokenizer()
    fields = config.to_dict()
    return {"model_type": MODEL_TYPE, "architectures": [ARCHITECTURE], "tokenizer": tokenizer_description(),
            "torch_dtype": "float32", "tie_word_embeddings": True, "bos_token_id": tokenizer.bos_id,
            "eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.pad_id,
            **{conventional: fields[ours] for ours, conventional in CONVENTIONAL_KEYS.items()}, **fields}


def write_model_files(directory: Path, model) -> dict[str, str]:
    """config.json and model.safetensors into an (already temporary) directory; their hashes."""
    from safetensors.torch import save_file

    write_json(directory / CONFIG_FILE, config_document(model.config))
    state = {key: value.detach().contiguous().cpu() for key, value in model.state_dict().items()}
    save_file(state, str(directory / WEIGHTS_FILE))
    return {CONFIG_FILE: sha256_file(directory / CONFIG_FILE), WEIGHTS_FILE: sha256_file(directory / WEIGHTS_FILE)}


STAGES = {
    "random_initialization": "not trained: the random initialisation a pretraining run starts from",
    "coding_pretraining": "pretrained from random weights on the generated stream of tiny Python functions "
                          "(`glm53 pretrain`)",
    "pre_rl": "the checkpoint an RL run starts from, before any update",
    "executable_reward_rl": "post-trained with RLOO whose only reward is running hidden unit tests (`glm53 rl`)",
}


def model_card(config: ModelConfig, metadata: dict, counts: dict) -> str:
    """README.md of a saved model: what it is, what it was trained on and how far, the figures its
    run recorded at this checkpoint, and its limits, from its config and metadata alone."""
    stage = metadata.get("stage")
    figures = [(label, metadata[key]) for key, label in (
        ("step", "pretraining step"), ("group", "RL groups trained"), ("seed", "seed"),
        ("tokens_seen", "training tokens seen"), ("training_loss", "training loss at this step"),
        ("mean_reward", "mean reward of the last update"), ("source_checkpoint", "RL started from"),
        ("source_sha256", "its weights' sha256")) if metadata.get(key) is not None]
    lines = [
        f"# glm53_flash model ({stage or 'saved model'})", "",
        f"A {counts['total']:,}-parameter byte-level language model ({counts['active']:,} active per token): "
        f"{config.layers} layers ({', '.join(sorted(set(config.attention_pattern)))} attention), "
        f"{config.experts} routed experts top-{config.top_k} plus a shared one, {config.streams} residual streams, "
        f"a tied head over {config.vocab_size} tokens (bytes and four specials), context {config.max_sequence_length}.",
        "", f"Trained: {STAGES.get(stage, 'see metadata.json')}.", "",
        *(["| figure | value |", "|---|---|", *[f"| {label} | {value} |" for label, value in figures], ""]
          if figures else []),
        "Load it with `glm53_flash.GLM53Flash.from_pretrained(DIR)`, or, with the `hf` extra, "
        "`import glm53_flash.hf` and `transformers.AutoModelForCausalLM.from_pretrained(DIR)`. "
        "The run's training receipt (training-receipt.json beside its checkpoints) holds the whole curve.", "",
        "Limits: a miniature trained on generated tasks (tiny Python functions of a fixed grammar); it is not a "
        "general code model, and its results describe that benchmark only. Its outputs are programs to run in "
        "the project's sandboxed verifier, never in-process.", "",
    ]
    return "\n".join(lines)


def write_card(directory: Path, model, metadata: dict) -> str:
    """README.md (the model card) into an (already temporary) directory; its hash."""
    from glm53_flash.core.receipts import write_text

    write_text(directory / CARD_FILE, model_card(model.config, metadata, model.parameter_counts()))
    return sha256_file(directory / CARD_FILE)


def save_pretrained(model, directory: str | Path, metadata: dict | None = None) -> Path:
    """Write `model` to a new directory; refuses to replace an existing one."""
    directory = Path(directory)
    with atomic_directory(directory, "model") as tmp:
        files = write_model_files(tmp, model)
        files[CARD_FILE] = write_card(tmp, model, dict(metadata or {}))
        meta = dict(metadata or {})
        meta.update(weights_sha256=files[WEIGHTS_FILE], files=files, parameter_counts=model.parameter_counts())
        write_json(tmp / METADATA_FILE, meta)
    return directory


def _size(path: Path, cap: int, directory: Path) -> int:
    size = path.stat().st_size
    if size > cap:
        raise CheckpointError(f"checkpoint {directory}: {path.name} has {size:,} bytes, more than the {cap:,} "
                              "a saved model of its config may have")
    return size


def weights_cap(config: ModelConfig) -> int:
    """The most bytes model.safetensors of `config` may have: its header, and every parameter in float32."""
    return 8 + MAX_WEIGHTS_HEADER_BYTES + 4 * config.approximate_parameters()


def file_cap(name: str, config: ModelConfig) -> int:
    """The most bytes a listed file named `name` of a saved model of `config` may have: MAX_FILE_BYTES's,
    the weights' (`weights_cap`), or for any other file (a trainer state: the weights and two AdamW
    moments, with room for the rest) three times the weights'."""
    if name in MAX_FILE_BYTES:
        return MAX_FILE_BYTES[name]
    return weights_cap(config) if name == WEIGHTS_FILE else 3 * weights_cap(config) + (1 << 20)


def read_metadata(directory: str | Path, verify: bool = True) -> dict:
    """metadata.json of a saved model, after checking every listed file exists, has no more bytes than
    `file_cap` allows (before it is hashed) and matches its hash."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist")
    meta_path = directory / METADATA_FILE
    if not meta_path.is_file():
        inside = sorted(p.name for p in directory.iterdir() if p.is_dir() and (p / METADATA_FILE).is_file())
        if inside:  # a run directory: name the checkpoints it holds
            listed = ", ".join(inside[:6]) + (", ..." if len(inside) > 6 else "")
            raise CheckpointError(f"{directory} is a run directory, not a checkpoint: give one of its checkpoints "
                                  f"({listed}), e.g. {directory / inside[-1]}")
        raise CheckpointError(f"checkpoint {directory} is incomplete: {METADATA_FILE} is missing")
    _size(meta_path, MAX_FILE_BYTES[METADATA_FILE], directory)
    meta = read_json(meta_path, CheckpointError, f"checkpoint {directory}: {METADATA_FILE} is corrupt")
    files = meta.get("files", {}) if isinstance(meta, dict) else None
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) and "/" not in k
                                               and k not in ("", ".", "..") for k, v in files.items()):
        raise CheckpointError(f"checkpoint {directory}: {METADATA_FILE} is corrupt "
                              "(expected an object whose 'files' maps file names to sha256 digests)")
    if verify:
        for name in files:
            if not (directory / name).is_file():
                raise CheckpointError(f"checkpoint {directory} is incomplete: {name} is missing")
        config = load_config(directory) if set(files) - set(MAX_FILE_BYTES) else None
        for name in files:  # every size first: nothing is hashed before all are known to be bounded
            _size(directory / name, file_cap(name, config) if config is not None else MAX_FILE_BYTES[name], directory)
        for name, digest in files.items():
            if sha256_file(directory / name) != digest:
                raise CheckpointError(f"checkpoint {directory}: {name} is corrupt (sha256 mismatch)")
    return meta


def load_config(directory: str | Path) -> ModelConfig:
    directory = Path(directory)
    path = directory / CONFIG_FILE
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist")
    if not path.is_file() and not (directory / METADATA_FILE).is_file():
        read_metadata(directory, verify=False)  # names the checkpoints of a run directory, or says what is missing
    if not path.is_file():
        raise CheckpointError(f"checkpoint {directory} is incomplete: {CONFIG_FILE} is missing")
    _size(path, MAX_CONFIG_BYTES, directory)
    try:
        document = json.loads(path.read_text())
        if not isinstance(document, dict):
            raise CheckpointError(f"checkpoint {directory}: {CONFIG_FILE} is not a JSON object")
        model_type = document.get("model_type", MODEL_TYPE)
        if model_type != MODEL_TYPE:
            raise CheckpointError(f"checkpoint {directory}: model_type {model_type!r} is not {MODEL_TYPE!r}")
        for ours, conventional in CONVENTIONAL_KEYS.items():  # a config written by Transformers has only these
            if conventional in document and ours not in document:
                document[ours] = document[conventional]
        differing = [f"{conventional} ({document[conventional]}) and {ours} ({document.get(ours)})"
                     for ours, conventional in CONVENTIONAL_KEYS.items()
                     if conventional in document and document[conventional] != document.get(ours)]
        if differing:
            raise CheckpointError(f"checkpoint {directory}: {CONFIG_FILE} gives two values for one size: "
                                  + "; ".join(differing))
        return ModelConfig.from_dict({k: v for k, v in document.items() if k not in DESCRIPTIVE_KEYS})
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError, ValueError) as error:
        if isinstance(error, CheckpointError):
            raise
        raise CheckpointError(f"checkpoint {directory}: {CONFIG_FILE} is corrupt ({error})") from None


def expected_tensors(model_class, config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a saved `model_class(config)` holds, from the model built on the meta
    device (no memory is allocated)."""
    import torch

    with torch.device("meta"):
        return {name: tuple(t.shape) for name, t in model_class(config).state_dict().items()}


def read_weights_header(directory: Path, config: ModelConfig) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name -> (dtype, shape) from model.safetensors' header, read alone (at most MAX_WEIGHTS_HEADER_BYTES),
    after checking that every tensor's bytes lie inside the file and match its dtype and shape."""
    path = directory / WEIGHTS_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint {directory} is incomplete: {WEIGHTS_FILE} is missing")
    size = _size(path, weights_cap(config), directory)
    bad = f"checkpoint {directory}: {WEIGHTS_FILE} cannot be read"
    with open(path, "rb") as handle:
        head = handle.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < length <= min(MAX_WEIGHTS_HEADER_BYTES, size - 8):
            raise CheckpointError(f"{bad} (its header length {length} is not within the file and "
                                  f"{MAX_WEIGHTS_HEADER_BYTES:,} bytes)")
        try:
            header = json.loads(handle.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise CheckpointError(f"{bad} (its header is not JSON: {error})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{bad} (its header is not a JSON object)")
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            ok = (dtype in WEIGHT_DTYPES and all(isinstance(n, int) and n >= 0 for n in shape)
                  and isinstance(start, int) and isinstance(end, int) and 0 <= start <= end <= size - 8 - length)
            count = 1
            for n in shape:
                count *= n
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok or end - start != count * WEIGHT_DTYPES[dtype]:
            raise CheckpointError(f"{bad} (tensor {name!r:.80}: {str(entry):.120} is not a {'/'.join(WEIGHT_DTYPES)} "
                                  "tensor whose bytes lie inside the file)")
        tensors[name] = (dtype, shape)
    return tensors


def check_weights(directory: Path, config: ModelConfig, expected: dict[str, tuple[int, ...]]) -> None:
    """Every tensor of model.safetensors' header against `expected` (name -> shape; older names accepted),
    before the model is built: one CheckpointError line naming what differs."""
    found = read_weights_header(directory, config)
    older = {}
    for name, shape in expected.items():
        prefix, _, leaf = name.rpartition(".")
        if leaf in OLDER_TENSOR_NAMES and name not in found:
            old_leaf, reshape = OLDER_TENSOR_NAMES[leaf]
            older[f"{prefix}.{old_leaf}" if prefix else old_leaf] = (name, reshape(shape))
    wanted = {name: shape for name, shape in expected.items()}
    for old, (name, shape) in older.items():
        if old in found:
            del wanted[name]
            wanted[old] = shape
    missing = sorted(set(wanted) - set(found))
    unexpected = sorted(set(found) - set(wanted))
    shapes = [f"{name} {list(found[name][1])} (the config needs {list(shape)})"
              for name, shape in wanted.items() if name in found and found[name][1] != shape]
    if missing or unexpected or shapes:
        details = "; ".join(filter(None, (f"missing {missing[:3]}" if missing else "",
                                          f"unexpected {[n[:60] for n in unexpected[:3]]}" if unexpected else "",
                                          f"shapes {'; '.join(shapes[:2])}" if shapes else "")))
        raise CheckpointError(f"checkpoint {directory}: weights do not match the config ({details})")


def load_weights(model, directory: str | Path):
    """Load WEIGHTS_FILE of `directory` into `model` (built from the directory's config); each way the
    files and the model can disagree is one CheckpointError line."""
    from safetensors.torch import load_file

    try:
        state = load_file(str(Path(directory) / WEIGHTS_FILE), device="cpu")
    except Exception as error:  # safetensors raises its own error types for truncated files
        raise CheckpointError(f"checkpoint {directory}: {WEIGHTS_FILE} cannot be read ({error})") from None
    try:
        # strict=False: older key layouts are converted by the model's load hooks; what is left over
        # is checked below. Shapes are checked by torch and become one line here.
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as error:
        details = "; ".join(line.strip() for line in str(error).splitlines()[1:4])
        raise CheckpointError(f"checkpoint {directory}: weights do not match the config ({details})") from None
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {directory}: weights do not match the config "
                              f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model


def load_model(model_class, directory: str | Path, device="cpu", verify: bool = True, available: int | None = None):
    """(model, metadata) from a saved model or a training checkpoint, every bound checked before the next
    step reads or allocates: config.json (capped) and its sizes; metadata.json and every listed file's size,
    then their hashes; the memory the model and its weights take against what the machine has free
    (`available` bytes, default /proc/meminfo's MemAvailable); the weights' header against the model the
    config describes; only then the model is built and the weights read."""
    from glm53_flash.core.runtime import check_fits

    directory = Path(directory)
    config = load_config(directory)
    meta = read_metadata(directory, verify=verify)
    try:  # the model, and the weights as read from the file before they are copied into it
        check_fits(config.model_bytes() + weights_cap(config) - MAX_WEIGHTS_HEADER_BYTES,
                   f"checkpoint {directory}: building its model and reading its weights",
                   "load it on a machine with more free memory", available)
    except ValueError as error:
        raise CheckpointError(str(error)) from None
    check_weights(directory, config, expected_tensors(model_class, config))
    model = load_weights(model_class(config), directory)
    return model.to(device), meta
