"""Saved vision models: a directory with config.json (architecture + configs) and model.safetensors.

Written atomically (a temporary sibling directory, then one rename); `glm53 vision predict` loads it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from glm53_flash.model.config import ModelConfig
from glm53_flash.model import GLM53Flash
from glm53_flash.core.receipts import atomic_directory, read_json, sha256_file, write_json
from glm53_flash.vision.baseline import DirectPatchVisionLanguageModel
from glm53_flash.vision.config import VisionConfig
from glm53_flash.vision.language import VisionLanguageModel
from glm53_flash.vision.models import check_architecture

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT = "glm53-vision-model/1"


def vision_model_config(model: nn.Module) -> dict:
    config = {"format": FORMAT, "architecture": model.architecture, "glm_faithful": model.glm_faithful,
              "language_model": model.language_model.config.to_dict()}
    if isinstance(model, VisionLanguageModel):
        config["vision_model"] = model.vision_config.to_dict()
        config["image_size"] = model.vision_config.image_size
    else:
        config["vision_model"] = {"patch_size": model.vision.patch_size, "image_size": model.vision.image_size}
        config["image_size"] = model.vision.image_size
    return config


def save_vision_model(directory: str | Path, model: nn.Module, metadata: dict | None = None) -> dict:
    """Write the model; refuses to replace an existing directory. Returns {path, weights_sha256}."""
    with atomic_directory(directory, "weights directory") as tmp:
        config = vision_model_config(model)
        config["metadata"] = metadata or {}
        write_json(tmp / CONFIG_FILE, config)
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        save_file(state, str(tmp / WEIGHTS_FILE))
        digest = sha256_file(tmp / WEIGHTS_FILE)
    return {"path": str(directory), "weights_sha256": digest}


def load_vision_model(directory: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, dict]:
    """(model in eval mode, config dict) from a directory written by save_vision_model."""
    directory = Path(directory)
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    if not directory.is_dir():
        raise ValueError(f"weights directory {directory} does not exist")
    for path in (config_path, weights_path):
        if not path.is_file():
            raise ValueError(f"weights directory {directory} is incomplete: {path.name} is missing")
    config = read_json(config_path)
    if config.get("format") != FORMAT:
        raise ValueError(f"{config_path} is not a saved vision model (format {config.get('format')!r}, "
                         f"expected {FORMAT!r})")
    try:
        architecture = check_architecture(config["architecture"])
        with torch.device("meta"):  # the weights come from the file; skip the random initialisation
            lm = GLM53Flash(ModelConfig.from_dict(config["language_model"]))
            if architecture == "faithful":
                model = VisionLanguageModel(lm, VisionConfig.from_dict(config["vision_model"]))
            else:
                vision = config["vision_model"]
                model = DirectPatchVisionLanguageModel(lm, vision["patch_size"], vision["image_size"])
    except (KeyError, TypeError) as error:
        raise ValueError(f"{config_path} lacks a field a saved vision model needs ({error})") from None
    try:
        state = load_file(str(weights_path), device="cpu")
    except Exception as error:  # noqa: BLE001 - safetensors raises its own error types for damaged files
        raise ValueError(f"{weights_path} cannot be read ({error})") from None
    try:
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as error:  # a tensor whose shape differs from the config's
        raise ValueError(f"{weights_path} does not match its config ({str(error).splitlines()[0]})") from None
    if missing or unexpected:
        raise ValueError(f"{weights_path} does not match its config (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]})")
    # Non-persistent buffers (the RoPE tables) were never materialised on meta: rebuild them.
    model.language_model.rope = type(model.language_model.rope)(
        lm.config.head_dim, lm.config.max_sequence_length, lm.config.rope_base)
    return model.to(device).eval(), config
