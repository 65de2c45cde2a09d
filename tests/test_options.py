"""Run configs declared once: every field of the pretraining and RL configs is a CLI flag whose help
shows its default, and every field is recorded in the run's receipt."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from glm53_flash.cli import build_parser
from glm53_flash.evaluate_config import EvalConfig
from glm53_flash.options import config_record
from glm53_flash.commands.train import MODEL_OVERRIDE_FIELDS
from glm53_flash.train.config import PretrainConfig, RLConfig, SelectConfig
from glm53_flash.train.pretrain import pretrain


def subcommand(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


@pytest.mark.parametrize("command, config_type", [("pretrain", PretrainConfig), ("rl", RLConfig),
                                                  ("select", SelectConfig), ("eval", EvalConfig)])
def test_every_config_field_is_a_flag_whose_help_shows_its_default(command, config_type):
    actions = {action.dest: action for action in subcommand(command)._actions}
    for field in dataclasses.fields(config_type):
        if field.name == "model_overrides":  # one flag per overridable ModelConfig field instead
            assert set(MODEL_OVERRIDE_FIELDS) <= set(actions)
            continue
        assert field.name in actions, f"{config_type.__name__}.{field.name} has no flag"
        action = actions[field.name]
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            continue  # a switch: its default is the opposite of the flag
        has_default = field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
        assert action.required == (not has_default)
        if has_default:
            assert "(default: " in action.help, f"--{field.name} help does not show its default"
        for choice in action.choices or ():
            assert "original" not in str(choice), f"--{field.name} has a choice named after history"


def test_flags_build_the_same_config_as_the_dataclass_defaults():
    args = subcommand("rl").parse_args(["--initial-checkpoint", "c", "--output", "o"])
    from glm53_flash.options import from_arguments

    assert from_arguments(RLConfig, args) == RLConfig(initial_checkpoint="c", output="o")
    args = subcommand("pretrain").parse_args(["--output", "o", "--steps", "150", "--no-progress"])
    built = from_arguments(PretrainConfig, args, model_overrides={})
    assert built == PretrainConfig(output="o", steps=150, quiet=True)
    assert built.checkpoints == (100, 150) or built.checkpoints == (100,)  # 100,200,400 within --steps


def test_every_field_is_recorded_in_the_pretraining_receipt(tmp_path):
    cfg = PretrainConfig(output=str(tmp_path / "run"), steps=2, batch_size=2, sequence_length=128, preset="tiny",
                         device="cpu", quiet=True)
    pretrain(cfg)
    receipt = json.loads((tmp_path / "run" / "training-receipt.json").read_text())
    assert set(receipt["run_config"]) == {field.name for field in dataclasses.fields(PretrainConfig)}
    assert receipt["run_config"] == config_record(cfg)


def test_building_the_cli_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys; from glm53_flash.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False", "glm53 --help would import torch"
