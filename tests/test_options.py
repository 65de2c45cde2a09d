"""Run configs declared once: every field of the training, evaluation, study, vision and bench configs is a
CLI flag whose help shows its default, and every field is recorded in the run's receipt."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json

import pytest

from glm53_flash.benchmarks.config import ArchitectureBench, LinearAttentionBench, ScalingBench, VerifyBench
from glm53_flash.cli import build_parser
from glm53_flash.commands.bench import BENCHES, library_function
from glm53_flash.evaluation.config import EvalConfig
from glm53_flash.experiments.pretraining_data import PretrainingDataStudyConfig
from glm53_flash.experiments.rl_choices import RLChoicesStudyConfig
from glm53_flash.core.options import cli_fields, config_record, from_arguments
from glm53_flash.commands.train import MODEL_OVERRIDE_FIELDS
from glm53_flash.train.config import PretrainConfig, RLConfig, SelectConfig
from glm53_flash.train.pretrain import pretrain
from glm53_flash.vision.run_config import PilotCommandConfig, PilotConfig, VisionTrainCommandConfig, VisionTrainConfig


def subcommand(*path: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


# The only fields without a flag of their own: what stands for each on the command line (None: fixed
# by the recipe). A new field without a flag fails the test until it is listed here.
WITHOUT_FLAG = {
    PretrainConfig: {"model_overrides": MODEL_OVERRIDE_FIELDS},  # one flag per overridable ModelConfig field
    VisionTrainConfig: {"architectures": ("architecture",), "progress": ("quiet",), "weight_decay": None,
                        "grad_clip": None},
    PilotConfig: {"progress": ("quiet",), "weight_decay": None, "grad_clip": None},
}


@pytest.mark.parametrize("command, config_type", [
    (("pretrain",), PretrainConfig), (("rl",), RLConfig), (("select",), SelectConfig), (("eval",), EvalConfig),
    (("experiment", "pretraining-data"), PretrainingDataStudyConfig),
    (("experiment", "rl-choices"), RLChoicesStudyConfig),
    (("vision", "train"), VisionTrainConfig), (("vision", "train"), VisionTrainCommandConfig),
    (("vision", "pilot"), PilotConfig), (("vision", "pilot"), PilotCommandConfig),
    *((("bench", bench.name), bench.config) for bench in BENCHES),
])
def test_every_config_field_is_a_flag_whose_help_shows_its_default(command, config_type):
    actions = {action.dest: action for action in subcommand(*command)._actions}
    without_flag = WITHOUT_FLAG.get(config_type, {})
    flagged = {field.name for field in cli_fields(config_type)}
    assert {f.name for f in dataclasses.fields(config_type)} - flagged == set(without_flag)
    for field in dataclasses.fields(config_type):
        if field.name in without_flag:
            assert field.name not in actions, f"--{field.name} exists: declare it as a flag instead"
            assert set(without_flag[field.name] or ()) <= set(actions)
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
    assert from_arguments(RLConfig, args) == RLConfig(initial_checkpoint="c", output="o")
    args = subcommand("pretrain").parse_args(["--output", "o", "--steps", "150", "--no-progress"])
    built = from_arguments(PretrainConfig, args, model_overrides={})
    assert built == PretrainConfig(output="o", steps=150, quiet=True)
    assert built.checkpoints == (100, 150) or built.checkpoints == (100,)  # 100,200,400 within --steps


def test_study_flags_build_the_dataclass_defaults_and_parse_their_own_forms():
    args = subcommand("experiment", "pretraining-data").parse_args(["--output", "o"])
    built = from_arguments(PretrainingDataStudyConfig, args)
    assert built == PretrainingDataStudyConfig(output="o")
    assert built.eval_at == (0, 50, 100, 150, 200) and built.shard == (0, 1) and len(built.seeds) == 20
    args = subcommand("experiment", "pretraining-data").parse_args(
        ["--output", "o", "--steps", "8", "--seeds", "11:3:11", "--shard", "1/2", "--conditions", "diverse-88"])
    built = from_arguments(PretrainingDataStudyConfig, args)
    assert (built.seeds, built.shard, built.conditions, built.eval_at) == ((11, 22, 33), (1, 2), ("diverse-88",),
                                                                            (0, 2, 4, 6, 8))
    assert config_record(built)["seeds"] == [11, 22, 33]
    args = subcommand("experiment", "rl-choices").parse_args(["--output", "o", "--checkpoint", "c"])
    built = from_arguments(RLChoicesStudyConfig, args)
    assert built == RLChoicesStudyConfig(output="o", checkpoint="c")
    assert built.confirm_seeds == tuple(range(1001, 1011)) and "baseline" in built.arms
    for bad in (["--shard", "2/2"], ["--seeds", "1:0:1"], ["--arms", ","]):
        with pytest.raises(SystemExit):
            subcommand("experiment", "rl-choices").parse_args(["--output", "o", "--checkpoint", "c", *bad])


def test_vision_flags_build_the_dataclass_defaults():
    args = subcommand("vision", "train").parse_args([])
    command = from_arguments(VisionTrainCommandConfig, args)
    built = from_arguments(VisionTrainConfig, args, architectures=command.architectures(), progress=not command.quiet)
    assert built == VisionTrainConfig() and command == VisionTrainCommandConfig()
    args = subcommand("vision", "train").parse_args(["--architecture", "baseline", "--seeds", "1,2", "--no-progress"])
    command = from_arguments(VisionTrainCommandConfig, args)
    assert command.architectures() == ("baseline",) and command.quiet
    assert from_arguments(VisionTrainConfig, args, architectures=("baseline",), progress=False).seeds == (1, 2)
    args = subcommand("vision", "pilot").parse_args(["--output", "o"])
    assert from_arguments(PilotConfig, args) == PilotConfig()
    assert from_arguments(PilotCommandConfig, args) == PilotCommandConfig(output="o")


@pytest.mark.parametrize("bench", BENCHES, ids=lambda bench: bench.name)
def test_every_bench_setting_is_a_keyword_of_its_library_function(bench):
    """`glm53 bench NAME` calls its function with its config's fields as keywords (commands/bench.py)."""
    parameters = inspect.signature(library_function(bench)).parameters
    assert {field.name for field in dataclasses.fields(bench.config)} <= set(parameters)


def test_bench_flags_parse_their_lists_and_keep_their_defaults():
    args = subcommand("bench", "scaling").parse_args(["--positions", "8,16"])
    assert from_arguments(ScalingBench, args) == ScalingBench(positions=(8, 16))
    assert ScalingBench().sequence_lengths == (128, 256, 512, 1024)
    args = subcommand("bench", "architecture").parse_args(["--seeds", "1,2", "--variants", "default, faithful"])
    assert from_arguments(ArchitectureBench, args) == ArchitectureBench(seeds=(1, 2), variants=("default", "faithful"))
    args = subcommand("bench", "linear-attention").parse_args([])
    assert from_arguments(LinearAttentionBench, args).presets == ("study", "flash")
    args = subcommand("bench", "verify").parse_args(["--memory-mb", "128"])  # the limits `glm53 verify` has too
    assert from_arguments(VerifyBench, args) == VerifyBench(memory_mb=128)
    with pytest.raises(SystemExit):
        subcommand("bench", "scaling").parse_args(["--positions", "8,x"])


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

    # The parser, and the help of every command whose flags come from a run config (the study and
    # vision configs included), without torch.
    commands = [["pretrain"], ["rl"], ["select"], ["eval"], ["experiment", "pretraining-data"],
                ["experiment", "rl-choices"], ["vision", "train"], ["vision", "pilot"],
                *(["bench", bench.name] for bench in BENCHES)]
    code = ("import contextlib, io, sys\n"
            "from glm53_flash.cli import build_parser\n"
            "parser = build_parser()\n"
            f"for command in {commands!r}:\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "        parser.parse_args(command + ['--help'])\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False", "glm53 --help would import torch"
