"""The run configs of `glm53 vision train` and `glm53 vision pilot`, declared once (options.py).

VisionTrainConfig and PilotConfig are the library's configs (training.py, pilot.py use them); their
flagged fields are the commands' run flags. VisionTrainCommandConfig and PilotCommandConfig add what
only the command has (which architectures, where the receipt goes, saving weights, --quiet). The
receipt records both as `run_config`. No torch here, so building the CLI stays fast.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from glm53_flash.core.argtypes import comma_ints
from glm53_flash.core.options import option
from glm53_flash.core.runtime import DEFAULT_DEVICE, DEVICE_CHOICES, PRECISION_HELP, PRECISIONS
from glm53_flash.train.config import ProgressConfig
from glm53_flash.vision.config import ARCHITECTURES, check_architecture

SMOKE_CAPS = {"steps": 40, "batch_size": 20, "eval_examples": 100}
BOTH = "both"
RECIPE_HELP = "(fixed by the recipe: no flag)"
# fp32 by default on every device: what vision runs did before the choice (they never took CUDA's autocast).
VISION_PRECISION_HELP = PRECISION_HELP + "; the vision tower's products (width 24) stay float32 on the CPU"


def check_budget(steps: int, batch_size: int, eval_examples: int, learning_rate: float) -> None:
    """The checks every vision training run shares (the miniatures' and the pilot's)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if eval_examples < 10:
        raise ValueError(f"eval_examples must be >= 10 (one per digit), got {eval_examples}")
    if not (learning_rate > 0 and math.isfinite(learning_rate)):
        raise ValueError(f"learning_rate must be a positive number, got {learning_rate}")


@dataclass
class VisionTrainConfig:
    """The miniatures' training run (`glm53 vision train`)."""

    architectures: tuple[str, ...] = option(ARCHITECTURES, flag=False,
                                            help="architectures to train, in order (the command's --architecture)")
    seeds: tuple[int, ...] = option((42,), parse=comma_ints, help="comma-separated seeds")
    steps: int = option(120, help="optimizer steps per model")
    batch_size: int = option(40, help="images per step")
    learning_rate: float = option(2e-3, help="AdamW learning rate")
    eval_examples: int = option(200, help="held-out images (>= 10)")
    weight_decay: float = option(0.01, flag=False, help=f"AdamW weight decay {RECIPE_HELP}")
    grad_clip: float = option(1.0, flag=False, help=f"clip the gradient's global norm to this {RECIPE_HELP}")
    smoke_test: bool = option(False, help="cap at 40 steps, batch 20, 100 held-out images")
    device: str = option(DEFAULT_DEVICE, choices=DEVICE_CHOICES,
                         help="where to train: the miniature is too small to gain from an accelerator")
    threads: int | None = option(1, help="CPU threads while training")  # None (library only): torch's own count
    precision: str = option("fp32", choices=PRECISIONS, help=VISION_PRECISION_HELP)
    progress: bool = option(True, flag=False, help="progress bar (the command's --quiet turns it off)")

    def validate(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if not self.architectures:
            raise ValueError("at least one architecture is needed")
        for name in self.architectures:
            check_architecture(name)
        if len(set(self.architectures)) != len(self.architectures):
            raise ValueError(f"architectures repeat: {self.architectures}")
        if not self.seeds:
            raise ValueError("at least one seed is needed")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds repeat: {self.seeds}")
        if any(s < 0 for s in self.seeds):
            raise ValueError(f"seeds must be >= 0, got {self.seeds}")
        check_budget(self.steps, self.batch_size, self.eval_examples, self.learning_rate)

    def effective(self) -> VisionTrainConfig:
        """The smoke test caps steps, batch and evaluation size."""
        if not self.smoke_test:
            return self
        return dataclasses.replace(self, **{k: min(getattr(self, k), v) for k, v in SMOKE_CAPS.items()})


@dataclass(kw_only=True)
class VisionTrainCommandConfig(ProgressConfig):
    """What `glm53 vision train` adds to VisionTrainConfig (plus --quiet)."""

    architecture: str = option(BOTH, choices=(*ARCHITECTURES, BOTH),
                               help=f"which architecture to train; {BOTH} = the paired comparison")
    output: str | None = option(None, help="new directory for receipt.json (and weights/ with --save-weights)",
                                default_text="none: no receipt is written")
    save_weights: bool = option(False, help="save every trained model under OUTPUT/weights/")

    def architectures(self) -> tuple[str, ...]:
        return ARCHITECTURES if self.architecture == BOTH else (self.architecture,)


@dataclass
class PilotConfig:
    """The pilot run (`glm53 vision pilot`)."""

    checkpoint: str | None = option(None, help="pretraining checkpoint directory (flash, vocab 260)",
                                    default_text="none: random weights")
    steps: int = option(40, help="optimizer steps (fewer when --max-seconds runs out)")
    batch_size: int = option(10, help="images per step")
    learning_rate: float = option(1e-3, help="AdamW learning rate")
    eval_examples: int = option(100, help="held-out images (>= 10)")
    seed: int = option(73, help="seed of the initialisation and of the training images")
    max_seconds: float = option(540.0, help="stop training before a step past this")
    weight_decay: float = option(0.01, flag=False, help=f"AdamW weight decay {RECIPE_HELP}")
    grad_clip: float = option(1.0, flag=False, help=f"clip the gradient's global norm to this {RECIPE_HELP}")
    device: str = option(DEFAULT_DEVICE, choices=DEVICE_CHOICES, help="where to train")
    precision: str = option("fp32", choices=PRECISIONS, help=VISION_PRECISION_HELP)
    progress: bool = option(True, flag=False, help="progress bar (the command's --quiet turns it off)")

    def validate(self) -> None:
        check_budget(self.steps, self.batch_size, self.eval_examples, self.learning_rate)
        if not self.max_seconds > 0:
            raise ValueError(f"max_seconds must be > 0, got {self.max_seconds}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")


@dataclass(kw_only=True)
class PilotCommandConfig(ProgressConfig):
    """What `glm53 vision pilot` adds to PilotConfig (plus --quiet)."""

    output: str = option(help="new directory for receipt.json (and weights/)")
    save_weights: bool = option(False, help="save the trained model under OUTPUT/weights/")


__all__ = [
    "SMOKE_CAPS",
    "PilotCommandConfig",
    "PilotConfig",
    "VisionTrainCommandConfig",
    "VisionTrainConfig",
    "check_budget",
]
