"""Tiny runs of every training loop (pretraining, resumed pretraining, the pretraining-data study, RL,
vision train, vision pilot) reduced to what must not change when the loops' code moves: every
step's loss and gradient norm, the final weights' sha256 and the receipts' training fields.

`python tests/training_fixtures.py` records them in tests/fixtures/training.json together with the
machine they were recorded on; tests/test_training_fixtures.py reruns them and compares (bit for bit
on a machine with the same CPU, math library and torch; to 1e-5 elsewhere, where summation orders
may differ)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

FIXTURE = Path(__file__).with_name("fixtures") / "training.json"


def _state_sha256(model) -> str:
    """sha256 of every tensor of the state dict, by name (the study's weights_sha256)."""
    from glm53_flash.experiments.pretraining_data import weights_sha256

    return weights_sha256(model)


TIMING = ("seconds", "time", "per_second", "rss", "elapsed", "utc")


def _rows(path: Path) -> list[dict]:
    """metrics.jsonl's rows without their timings (the numbers a loop computes, not how fast)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if not any(word in k for word in TIMING)} for row in rows]


def machine() -> dict:
    """What decides the last bits of a CPU float result here."""
    import torch

    from glm53_flash.core.receipts import cpu_description
    from glm53_flash.model import ops

    # the fields the recording was made with (family and model numbers came later)
    cpu = {key: value for key, value in cpu_description().items() if key in ("machine", "math_flags", "model", "vendor")}
    return {"cpu": cpu, "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "kernels": ops.status()["reason"].split(" (")[-1] if ops.available() else "none"}


def pretraining(directory: Path) -> dict:
    from glm53_flash.train.pretrain import PretrainConfig, pretrain

    def config(output, steps, **kw):
        return PretrainConfig(output=str(output), preset="tiny", steps=steps, checkpoints=(3, steps), batch_size=4,
                              sequence_length=128, device="cpu", quiet=True, **kw)

    results = {}
    for name, extra in (("constant", {}), ("cosine", {"schedule": "cosine", "warmup": 2})):
        out = directory / f"pretrain-{name}"
        receipt = pretrain(config(out, 6, **extra))
        results[f"pretrain_{name}"] = {
            "curve": _rows(out / "metrics.jsonl"),
            "weights": json.loads((out / "checkpoint-0006" / "metadata.json").read_text())["weights_sha256"],
            "receipt_checkpoints": [c["weights_sha256"] for c in receipt["checkpoints"]],
        }
    out = directory / "pretrain-resumed"
    pretrain(config(out, 3))
    pretrain(config(out, 6, resume=True))
    results["pretrain_resumed"] = {
        "curve": _rows(out / "metrics.jsonl"),
        "weights": json.loads((out / "checkpoint-0006" / "metadata.json").read_text())["weights_sha256"]}
    return results


def study() -> dict:
    from glm53_flash.experiments.pretraining_data import RunConfig, train_condition

    result = train_condition(RunConfig(condition="diverse-88", seed=3, steps=4, batch_size=4, sequence_length=128,
                                       eval_at=(4,), generation_tokens=4, curve_every=1))
    return {"study": {"curve": result["training_curve"], "weights": result["final_weights_sha256"]}}


def rl(directory: Path) -> dict:
    import torch

    from glm53_flash import GLM53Flash, ModelConfig
    from glm53_flash.train.checkpoint import load_checkpoint, save_checkpoint
    from glm53_flash.train.rl_run import RLConfig, train_rl

    torch.manual_seed(0)
    checkpoint = directory / "rl-init" / "checkpoint-0000"
    save_checkpoint(checkpoint, GLM53Flash(ModelConfig.preset("tiny").replace(max_sequence_length=128)),
                    {"stage": "fixture"})
    out = directory / "rl"
    # A random tiny model's programs all fail alike, so every group would be skipped: the reward here is a
    # fixed function of the verdict's message (it differs between completions), so the updates run.
    from glm53_flash.train import rl as rl_module

    original = rl_module.reward_for
    rl_module.reward_for = lambda evaluation, *rest: sum(map(ord, evaluation.message)) % 5 / 4
    try:
        train_rl(RLConfig(initial_checkpoint=str(checkpoint), output=str(out), groups=4, checkpoints=(4,),
                          group_size=4, max_new_tokens=12, temperature=1.0, learning_rate=1e-3, device="cpu", quiet=True,
                          verifier_workers=1, families="increment,double"))
    finally:
        rl_module.reward_for = original
    model, _ = load_checkpoint(out / "checkpoint-0004", "cpu")
    rows = _rows(out / "metrics.jsonl")
    receipt = json.loads((out / "training-receipt.json").read_text())
    return {"rl": {"curve": rows, "weights": _state_sha256(model),
                   "receipt_checkpoints": [c["weights_sha256"] for c in receipt["checkpoints"]]}}


def vision() -> dict:
    import torch

    from glm53_flash.vision.run_config import PilotConfig, VisionTrainConfig
    from glm53_flash.vision.training import run_vision_training

    shas = []
    receipt = run_vision_training(VisionTrainConfig(steps=6, seeds=(1,), eval_examples=10, smoke_test=True,
                                                    progress=False),
                                  on_model=lambda result, model: shas.append(_state_sha256(model)))
    results = {"vision_train": {"curves": [r["training_loss_curve"] for r in receipt["results"]], "weights": shas}}

    from glm53_flash import GLM53Flash
    from glm53_flash.train.checkpoint import save_checkpoint
    from glm53_flash.model.config import ModelConfig
    from glm53_flash.vision.pilot import run_pilot

    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        checkpoint = Path(tmp) / "checkpoint-0001"
        tiny = ModelConfig(vocab_size=260, dim=16, layers=1, heads=2, expert_hidden=24, experts=2, top_k=1, streams=2,
                           sparse_window=8, sparse_stride=8, max_sequence_length=64)
        save_checkpoint(checkpoint, GLM53Flash(tiny), {"step": 1})
        pilot_shas = []
        pilot = run_pilot(PilotConfig(checkpoint=str(checkpoint), steps=5, eval_examples=10, device="cpu",
                                      progress=False), on_model=lambda model: pilot_shas.append(_state_sha256(model)))
    results["vision_pilot"] = {"trace": pilot["optimization"]["loss_trace"], "weights": pilot_shas}
    return results


def record_all() -> dict:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp)
            return {**pretraining(directory), **study(), **rl(directory), **vision()}
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps({"machine": machine(), "runs": record_all()}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}")
