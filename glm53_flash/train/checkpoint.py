"""Training checkpoints: a saved model (model/pretrained.py) plus trainer-state.pt.

Written atomically (a temporary sibling directory, then one rename), so a run killed at any moment
leaves only complete checkpoints. metadata.json records the sha256 of every other file; loading
verifies them and names the missing or corrupt file. Loading a model for use rather than for
training is `GLM53Flash.from_pretrained`; this file adds the optimizer and resume logic.
"""

from __future__ import annotations

from pathlib import Path

import torch

from glm53_flash.model.lm import GLM53Flash, load_pretrained
from glm53_flash.model.pretrained import (  # noqa: F401 - re-exported: training code loads checkpoints from here
    CARD_FILE,
    CONFIG_FILE,
    METADATA_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    load_config,
    read_metadata,
    write_card,
    write_model_files,
)
from glm53_flash.core.receipts import atomic_directory, sha256_file, write_json

TRAINER_FILE = "trainer-state.pt"
# Names the parameter layout a trainer state's optimizer moments follow. Version 2: routed experts'
# up-projection stored as expert_gate_up [E, 2H, D]. Trainer states without it predate that layout.
PARAMETER_LAYOUT = 2


def checkpoint_name(step: int) -> str:
    return f"checkpoint-{step:04d}"


def save_checkpoint(directory: str | Path, model: GLM53Flash, metadata: dict,
                    trainer_state: dict | None = None) -> dict:
    """Write a checkpoint directory atomically (the saved model plus, optionally, the trainer state);
    refuses to replace an existing one. `GLM53Flash.from_pretrained` loads it."""
    with atomic_directory(directory, "checkpoint") as tmp:
        files = write_model_files(tmp, model)
        write_card(tmp, model, metadata)  # not hashed: other tools rewrite a card by convention
        if trainer_state is not None:
            torch.save(dict(trainer_state, parameter_layout=PARAMETER_LAYOUT), tmp / TRAINER_FILE)
            files[TRAINER_FILE] = sha256_file(tmp / TRAINER_FILE)
        meta = dict(metadata)
        meta.update(weights_sha256=files[WEIGHTS_FILE], files=files,
                    parameter_counts=model.parameter_counts())
        write_json(tmp / METADATA_FILE, meta)
    return {"path": str(directory), "weights_sha256": meta["weights_sha256"]}


def load_checkpoint(directory: str | Path, device: str | torch.device = "cpu",
                    verify: bool = True) -> tuple[GLM53Flash, dict]:
    """(model, metadata) from a checkpoint directory, hashes verified."""
    return load_pretrained(directory, device=device, verify=verify)


def load_trainer_state(directory: str | Path) -> dict:
    path = Path(directory) / TRAINER_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint {directory} has no {TRAINER_FILE}; it cannot be resumed from")
    return torch.load(path, map_location="cpu", weights_only=True)


def load_optimizer_state(optimizer: torch.optim.Optimizer, trainer_state: dict, directory: str | Path) -> None:
    """Restore an optimizer from a trainer state written by `save_checkpoint`.

    Refuses moments written for another parameter layout (a trainer state from before the experts'
    layout change: its weights still load, but the run cannot be resumed exactly). The optimizer
    keeps its own kernel choice (`fused`, `foreach`) rather than the saved one, so a resumed run
    computes like a fresh one on this device.
    """
    saved = trainer_state["optimizer"]
    has_moments = any(saved.get("state", {}).values())
    if has_moments and trainer_state.get("parameter_layout") != PARAMETER_LAYOUT:
        raise CheckpointError(
            f"checkpoint {directory}: its optimizer state follows an older parameter layout (layout "
            f"{trainer_state.get('parameter_layout', 1)}, this version uses {PARAMETER_LAYOUT}); the run cannot be "
            "resumed, but its weights load (for example as `glm53 rl --initial-checkpoint`)")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved_params = [i for group in saved.get("param_groups", []) for i in group["params"]]
    for param, index in zip(params, saved_params):
        for name, value in saved.get("state", {}).get(index, {}).items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                raise CheckpointError(
                    f"checkpoint {directory}: optimizer state {name} has shape {tuple(value.shape)} for a "
                    f"parameter of shape {tuple(param.shape)}; the run cannot be resumed")
    groups = [dict(saved_group, **{k: group[k] for k in ("fused", "foreach") if k in group})
              for saved_group, group in zip(saved.get("param_groups", []), optimizer.param_groups)]
    optimizer.load_state_dict(dict(saved, param_groups=groups))


def prepare_run_directory(out: Path, resume: bool) -> bool:
    """True when `out` already holds a run (anything but its lock file); refuses to reuse it without
    --resume."""
    from glm53_flash.train.rundir import holds_a_run

    exists = holds_a_run(out)
    if exists and not resume:
        raise FileExistsError(f"output {out} already exists; pass --resume to continue it or choose a new --output")
    return exists


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, by step (temporary directories are ignored)."""
    found = []
    for path in Path(run_dir).glob("checkpoint-*"):
        suffix = path.name.removeprefix("checkpoint-")
        if path.is_dir() and suffix.isdigit() and (path / METADATA_FILE).is_file():
            found.append((int(suffix), path))
    return sorted(found)
