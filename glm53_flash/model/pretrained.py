"""Saved models beside the model: config.json, model.safetensors, metadata.json and the files that let
any Hugging Face tool load the directory, written and read here.

`GLM53Flash.save_pretrained(directory)` and `GLM53Flash.from_pretrained(directory)` use this file, and
so do training checkpoints (train/checkpoint.py adds the trainer state), so any checkpoint a run
wrote loads with `from_pretrained`. config.json follows the Hugging Face convention: the model's
fields plus `model_type`, `architectures`, `auto_map`, `torch_dtype`, the special token ids, the tied
head, the conventional names of the sizes (`hidden_size`, `num_hidden_layers`, ...: glm53_flash/hf.py
reads them) and a description of the tokenizer; configs written before those keys existed still load.
Beside it: the remote-code modules `auto_map` names (each a few lines that import the installed
glm53_flash package, so `trust_remote_code=True` works in a Python that never imported it, and a
Python without the package gets one line saying what to install), tokenizer_config.json and
special_tokens_map.json, generation_config.json and the model card (README.md, with the Hub's
metadata header). Directories are written atomically (a temporary sibling, then one rename), or file
by file into a directory that exists (Transformers' trainers make theirs first), metadata.json last.

metadata.json records the sha256 of the files loading reads (config, weights, code; a training
checkpoint's trainer state), checked on load; the card and the tokenizer's files are not hashed,
since other tools rewrite them by convention (a trainer saves its tokenizer there, push_to_hub writes
a card). Loading is bounded: every size is checked before anything is read, hashed or allocated
(`MAX_FILE_BYTES` and `file_cap`; the config's sizes against ModelConfig's bounds and the memory the
machine has free; the weights' header, every tensor's name, shape and extent, against the model the
config describes, built on the meta device) and only then is the model built and its weights read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from glm53_flash.core.receipts import atomic_directory, read_json, sha256_file, write_json, write_text
from glm53_flash.data.tokenizer import ByteTokenizer
from glm53_flash.model.config import ModelConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
METADATA_FILE = "metadata.json"
CARD_FILE = "README.md"  # the model card
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
MODEL_TYPE = "glm53_flash"
ARCHITECTURE = "GLM53FlashForCausalLM"  # the Transformers class (glm53_flash/hf.py)
# The remote-code layout: module file -> the glm53_flash.hf class it serves; config.json's auto_map names them.
CODE_FILES = {"configuration_glm53_flash.py": "GLM53FlashConfig", "modeling_glm53_flash.py": "GLM53FlashForCausalLM",
              "tokenization_glm53_flash.py": "GLM53FlashTokenizer"}
AUTO_MAP = {"AutoConfig": "configuration_glm53_flash.GLM53FlashConfig",
            "AutoModel": "modeling_glm53_flash.GLM53FlashForCausalLM",
            "AutoModelForCausalLM": "modeling_glm53_flash.GLM53FlashForCausalLM",
            "AutoTokenizer": ["tokenization_glm53_flash.GLM53FlashTokenizer", None]}
# The special tokens' names (what a Transformers tokenizer decodes them to), by ByteTokenizer id.
SPECIAL_TOKENS = {"pad_token": ("<pad>", ByteTokenizer.pad_id), "bos_token": ("<bos>", ByteTokenizer.bos_id),
                  "eos_token": ("<eos>", ByteTokenizer.eos_id), "sep_token": ("<sep>", ByteTokenizer.sep_id)}
# Ids generation never picks: they mark structure, not content (the sampler's mask).
SUPPRESSED_IDS = (ByteTokenizer.pad_id, ByteTokenizer.bos_id, ByteTokenizer.sep_id)
# The conventional (Hugging Face) names of ModelConfig fields, which config.json carries too.
CONVENTIONAL_KEYS = {"dim": "hidden_size", "layers": "num_hidden_layers", "heads": "num_attention_heads",
                     "max_sequence_length": "max_position_embeddings", "experts": "num_local_experts",
                     "top_k": "num_experts_per_tok", "expert_hidden": "moe_intermediate_size"}
# Keys config.json carries besides the ModelConfig fields (written from them; older files lack them).
TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
DESCRIPTIVE_KEYS = ("model_type", "architectures", "auto_map", "tokenizer", "torch_dtype", "dtype",
                    "tie_word_embeddings", "transformers_version", "_name_or_path", *TOKEN_KEYS,
                    *CONVENTIONAL_KEYS.values())
# The most bytes each file of a saved model may have, checked before it is read or hashed; the weights'
# and any other listed file's bound follows from the config (`file_cap`).
MAX_FILE_BYTES = {CONFIG_FILE: 1 << 16, METADATA_FILE: 1 << 20, CARD_FILE: 1 << 16, GENERATION_CONFIG_FILE: 1 << 16,
                  TOKENIZER_CONFIG_FILE: 1 << 16, SPECIAL_TOKENS_FILE: 1 << 16, **{name: 1 << 16 for name in CODE_FILES}}
MAX_CONFIG_BYTES = MAX_FILE_BYTES[CONFIG_FILE]
MAX_WEIGHTS_HEADER_BYTES = 1 << 24  # safetensors' JSON header (about 20 KB for the flash model)
# safetensors dtypes a saved model's tensors may have, with their sizes in bytes.
WEIGHT_DTYPES = {"F32": 4, "BF16": 2, "F16": 2}
# Older names of tensors, with how the current tensor's shape reads in them (moe.py converts them on load):
# routed experts' up-projection was expert_up [E, D, 2H], now expert_gate_up [E, 2H, D].
OLDER_TENSOR_NAMES = {"expert_gate_up": ("expert_up", lambda shape: (shape[0], shape[2], shape[1]))}


class CheckpointError(ValueError):
    """A checkpoint directory is missing, incomplete, corrupt or larger than its config allows."""


# ----------------------------------------------------------------------------------- documents


def tokenizer_description() -> dict:
    tokenizer = ByteTokenizer()
    return {"type": "bytes", "byte_offset": tokenizer.byte_offset, "vocab_size": tokenizer.vocab_size,
            "special_ids": {"pad": tokenizer.pad_id, "bos": tokenizer.bos_id, "eos": tokenizer.eos_id,
                            "sep": tokenizer.sep_id}}


def config_document(config: ModelConfig, dtype: str = "float32") -> dict:
    """config.json's content: the Hugging Face keys (model type, architecture, auto_map, dtype, special
    token ids, tied head, and the conventional names of the sizes), then every ModelConfig field by its
    own name."""
    tokenizer = ByteTokenizer()
    fields = config.to_dict()
    return {"model_type": MODEL_TYPE, "architectures": [ARCHITECTURE], "auto_map": AUTO_MAP,
            "tokenizer": tokenizer_description(), "torch_dtype": dtype, "tie_word_embeddings": True,
            "bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.pad_id,
            **{conventional: fields[ours] for ours, conventional in CONVENTIONAL_KEYS.items()}, **fields}


def tokenizer_documents(config: ModelConfig) -> dict[str, dict]:
    """tokenizer_config.json and special_tokens_map.json: the byte tokenizer by its Transformers class,
    its special tokens' names, left padding (what batched generation needs) and the model's context."""
    names = {key: name for key, (name, _) in SPECIAL_TOKENS.items()}
    settings = {"tokenizer_class": CODE_FILES["tokenization_glm53_flash.py"],
                "auto_map": {"AutoTokenizer": AUTO_MAP["AutoTokenizer"]}, **names, "padding_side": "left",
                "truncation_side": "left", "model_max_length": config.max_sequence_length, "add_bos_token": True,
                "clean_up_tokenization_spaces": False, "model_input_names": ["input_ids", "attention_mask"]}
    return {TOKENIZER_CONFIG_FILE: settings, SPECIAL_TOKENS_FILE: names}


def generation_document() -> dict:
    """generation_config.json: the special ids, and PAD/BOS/SEP never generated (the sampler's mask)."""
    return {"bos_token_id": ByteTokenizer.bos_id, "eos_token_id": ByteTokenizer.eos_id,
            "pad_token_id": ByteTokenizer.pad_id, "suppress_tokens": list(SUPPRESSED_IDS), "use_cache": True}


def code_module(class_name: str) -> str:
    """A remote-code module: `class_name` from the installed glm53_flash package, or one ImportError line
    naming what to install."""
    return (f'"""{class_name} for Transformers\' trust_remote_code=True: the code of this checkpoint is the\n'
            'installed glm53_flash package (pip install \'glm53_flash[hf]\'); this module only imports it."""\n\n'
            'try:\n'
            f'    from glm53_flash.hf import {class_name}  # noqa: F401\n'
            'except ImportError as error:\n'
            '    raise ImportError(f"this checkpoint\'s code is the glm53_flash package with its hf extra, which this "\n'
            '                      f"Python cannot import ({error}); install it: pip install \'glm53_flash[hf]\'") from None\n')


STAGES = {
    "random_initialization": "not trained: the random initialisation a pretraining run starts from",
    "coding_pretraining": "pretrained from random weights on the generated stream of tiny Python functions "
                          "(`glm53 pretrain`)",
    "pre_rl": "the checkpoint an RL run starts from, before any update",
    "executable_reward_rl": "post-trained with RLOO whose only reward is running hidden unit tests (`glm53 rl`)",
    "saved_by_transformers": "saved through Transformers' `save_pretrained` (for example by a TRL trainer's "
                             "checkpoint) after whatever training that code ran",
}
CARD_HEADER = ("---", "license: mit", "library_name: transformers", "pipeline_tag: text-generation", "tags:",
               "- glm53_flash", "- custom_code", "- byte-level", "---", "")


def model_card(config: ModelConfig, metadata: dict, counts: dict) -> str:
    """README.md of a saved model: the Hub's metadata header, what it is, what it was trained on and how
    far, the figures its run recorded at this checkpoint, and its limits, from its config and metadata alone."""
    stage = metadata.get("stage")
    figures = [(label, metadata[key]) for key, label in (
        ("step", "pretraining step"), ("group", "RL groups trained"), ("seed", "seed"),
        ("tokens_seen", "training tokens seen"), ("training_loss", "training loss at this step"),
        ("mean_reward", "mean reward of the last update"), ("source_checkpoint", "RL started from"),
        ("source_sha256", "its weights' sha256"), ("loaded_from", "loaded from"),
        ("loaded_sha256", "the loaded weights' sha256")) if metadata.get(key) is not None]
    lines = [
        *CARD_HEADER,
        f"# glm53_flash model ({stage or 'saved model'})", "",
        f"A {counts['total']:,}-parameter byte-level language model ({counts['active']:,} active per token): "
        f"{config.layers} layers ({', '.join(sorted(set(config.attention_pattern)))} attention), "
        f"{config.experts} routed experts top-{config.top_k} plus a shared one, {config.streams} residual streams, "
        f"a tied head over {config.vocab_size} tokens (bytes and four specials), context {config.max_sequence_length}.",
        "", f"Trained: {STAGES.get(stage, 'see metadata.json')}.", "",
        *(["| figure | value |", "|---|---|", *[f"| {label} | {value} |" for label, value in figures], ""]
          if figures else []),
        "Load it with `glm53_flash.GLM53Flash.from_pretrained(DIR)`, or with Transformers: "
        "`AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)` and `AutoTokenizer` the same way "
        "(the code is the glm53_flash package: `pip install 'glm53_flash[hf]'`; after `import glm53_flash.hf` "
        "the flag is not needed). The run's training receipt (training-receipt.json beside its checkpoints) "
        "holds the whole curve.", "",
        "Limits: a miniature trained on generated tasks (tiny Python functions of a fixed grammar); it is not a "
        "general code model, and its results describe that benchmark only. Its outputs are programs to run in "
        "the project's sandboxed verifier, never in-process.", "",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- writing


def write_model_files(directory: Path, model, state: dict | None = None) -> dict[str, str]:
    """Every file of a saved model but the card and metadata.json into an (already temporary) directory:
    config.json, model.safetensors (`state`, or the model's own state dict), the remote-code modules,
    the tokenizer's files and generation_config.json. Returns the sha256 of those loading reads."""
    from safetensors.torch import save_file

    state = model.state_dict() if state is None else state
    tensors = {key: value.detach().contiguous().cpu() for key, value in state.items()}
    dtypes = {str(t.dtype).removeprefix("torch.") for t in tensors.values() if t.is_floating_point()}
    write_json(directory / CONFIG_FILE, config_document(model.config, dtypes.pop() if len(dtypes) == 1 else "float32"))
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    for name, class_name in CODE_FILES.items():
        write_text(directory / name, code_module(class_name))
    for name, document in tokenizer_documents(model.config).items():
        write_json(directory / name, document)
    write_json(directory / GENERATION_CONFIG_FILE, generation_document())
    return {name: sha256_file(directory / name) for name in (CONFIG_FILE, WEIGHTS_FILE, *CODE_FILES)}


def write_card(directory: Path, model, metadata: dict) -> str:
    """README.md (the model card) into an (already temporary) directory; its hash."""
    write_text(directory / CARD_FILE, model_card(model.config, metadata, model.parameter_counts()))
    return sha256_file(directory / CARD_FILE)


def _metadata(model, metadata: dict | None, files: dict[str, str]) -> dict:
    meta = dict(metadata or {})
    meta.update(weights_sha256=files[WEIGHTS_FILE], files=files, parameter_counts=model.parameter_counts())
    return meta


def save_pretrained(model, directory: str | Path, metadata: dict | None = None) -> Path:
    """Write `model` to a new directory; refuses to replace an existing one."""
    directory = Path(directory)
    with atomic_directory(directory, "model") as tmp:
        files = write_model_files(tmp, model)
        write_card(tmp, model, dict(metadata or {}))
        write_json(tmp / METADATA_FILE, _metadata(model, metadata, files))
    return directory


def save_into(model, directory: str | Path, metadata: dict | None = None, state: dict | None = None) -> Path:
    """Write `model` into `directory`, made if missing, as Transformers' `save_pretrained` does (a trainer
    makes its checkpoint directory, then saves the model, the tokenizer and its own state there): every
    file is written to a temporary directory inside it and renamed into place, metadata.json last, so a
    reader sees the old metadata (whose hashes then refuse the new files) or the new, never half a file.
    `state` replaces the model's state dict (same names and shapes). A card already there (another
    tool's) is kept."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".save.", suffix=".tmp", dir=directory))
    try:
        files = write_model_files(tmp, model, state)
        if not (directory / CARD_FILE).exists():
            write_card(tmp, model, dict(metadata or {}))
        write_json(tmp / METADATA_FILE, _metadata(model, metadata, files))
        for path in sorted(tmp.iterdir(), key=lambda p: p.name == METADATA_FILE):
            os.replace(path, directory / path.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


# ----------------------------------------------------------------------------------- reading


def _missing(directory: Path) -> CheckpointError:
    """'does not exist', naming a sibling whose trailing number is the same (checkpoint-300 for checkpoint-0300)."""
    message = f"checkpoint directory {directory} does not exist"
    match = re.fullmatch(r"(.*?)(\d+)", directory.name)
    if match and directory.parent.is_dir():
        prefix, number = match.group(1), int(match.group(2))
        same = sorted(p for p in directory.parent.iterdir()
                      if p.is_dir() and p.name.startswith(prefix) and p.name[len(prefix):].isdigit()
                      and int(p.name[len(prefix):]) == number and p.name != directory.name)
        if same:
            message += f"; did you mean {same[0]}?"
    return CheckpointError(message)


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
        raise _missing(directory)
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
        raise _missing(directory)
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
