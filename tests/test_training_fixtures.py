"""Every training loop gives what it gave before the engine was shared (tests/fixtures/training.json,
recorded by tests/training_fixtures.py on the code before the change, and recorded again when the C
linear-attention scan took over sequences longer than a chunk: that changes the order of float sums
only, and the new recording was checked against the old to 1e-5 before it replaced it; the RL rows'
position counts, update_positions and update_padding_positions, were added to it later from a run whose
every other number matched it): the same
per-step losses and gradient norms, the same weights and the same receipts' checkpoints. Bit for bit where the machine
matches the recording one; elsewhere the numbers to 1e-5 (summation orders differ between CPUs and
math libraries, so weights' hashes are compared only on the same machine)."""

import json
import math

import pytest

import training_fixtures

RECORDED = json.loads(training_fixtures.FIXTURE.read_text())


@pytest.fixture(scope="module")
def runs():
    return training_fixtures.record_all()


def _numbers_close(actual, expected, path="") -> list[str]:
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            return [f"{path}: keys {sorted(actual) if isinstance(actual, dict) else actual} != {sorted(expected)}"]
        return [m for k in expected for m in _numbers_close(actual[k], expected[k], f"{path}.{k}")]
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{path}: {actual} != {expected}"]
        return [m for i, (a, e) in enumerate(zip(actual, expected)) for m in _numbers_close(a, e, f"{path}[{i}]")]
    if isinstance(expected, float) and isinstance(actual, (int, float)):
        return [] if math.isclose(actual, expected, rel_tol=1e-5, abs_tol=1e-6) else [f"{path}: {actual} != {expected}"]
    if isinstance(expected, str) and len(expected) == 64:  # a sha256: only comparable on the same machine
        return []
    return [] if actual == expected else [f"{path}: {actual} != {expected}"]


@pytest.mark.parametrize("name", sorted(RECORDED["runs"]))
@pytest.mark.slow
def test_the_loop_gives_what_it_gave_before(runs, name):
    if training_fixtures.machine() == RECORDED["machine"]:
        assert runs[name] == RECORDED["runs"][name]
    else:
        assert _numbers_close(runs[name], RECORDED["runs"][name]) == []


def test_the_fixture_runs_take_optimizer_steps():
    """A fixture that never updated a weight would prove nothing: each run ends on other weights than
    it started from, and RL updated on at least two groups."""
    recorded = RECORDED["runs"]
    for name in ("pretrain_constant", "pretrain_cosine", "rl"):
        first, *_, last = recorded[name]["receipt_checkpoints"]
        assert first != last, name
    assert sum(row["grad_norm"] is not None for row in recorded["rl"]["curve"]) >= 2
    assert recorded["vision_train"]["curves"][0][0] != recorded["vision_train"]["curves"][0][-1]


def test_the_engine_is_the_one_optimizer_step_site():
    """No training code outside train/engine.py builds an AdamW, clips or steps an optimizer; the one
    other backward is the scaling benchmark's, which times forward + backward without an update."""
    import re
    from pathlib import Path

    package = Path(training_fixtures.__file__).resolve().parents[1] / "glm53_flash"
    patterns = {"optimizer step": r"optimizer\.step\(\)", "AdamW": r"optim\.AdamW\(", "clip": r"clip_grad_norm_\(",
                "backward": r"\.backward\(\)"}
    found = sorted(f"{path.relative_to(package)}: {name}" for path in package.rglob("*.py")
                   for name, pattern in patterns.items() if re.search(pattern, path.read_text()))
    assert found == ["benchmarks/scaling.py: backward", "train/engine.py: AdamW", "train/engine.py: backward",
                     "train/engine.py: clip", "train/engine.py: optimizer step"]


def test_the_engine_owns_every_training_run():
    """The lock, the interrupt handling, finished runs, the metrics sink and the progress of a run
    directory are the engine's (train/engine.py): no other training module calls them, and every
    module that takes optimizer steps in a loop runs them in the engine's StepLoop or is an engine
    Trainer. Benchmarks time single steps and are not training runs."""
    import re
    from pathlib import Path

    package = Path(training_fixtures.__file__).resolve().parents[1] / "glm53_flash"
    lifecycle = r"\b(interruptible|lock_on_main|RunLock|finished_receipt|MetricsSink)\("
    training = [path for folder in ("train", "vision") for path in (package / folder).glob("*.py")]
    training.append(package / "experiments" / "pretraining_data.py")
    owners = {"engine.py", "rundir.py", "distributed.py"}  # the engine, and where its parts are defined
    calls = sorted(f"{path.relative_to(package)}: {m.group(1)}" for path in training if path.name not in owners
                   for m in re.finditer(lifecycle, path.read_text()))
    # the study's runner sends each unit's rows to its own sink (a unit is a StepLoop in memory)
    assert calls == ["experiments/pretraining_data.py: MetricsSink"]
    # objective.py and rl.py define an update (language_model_update, rloo_step) that the loops call
    steppers = [path for path in training if path.name not in {"engine.py", "objective.py", "rl.py"}
                and re.search(r"\b(optimizer_step|language_model_update|rloo_step|optimisation_step)\(",
                              path.read_text())]
    assert {p.name for p in steppers} == {"pretrain.py", "rl_run.py", "training.py", "pilot.py", "pretraining_data.py"}
    for path in steppers:
        text = path.read_text()
        assert "StepLoop(" in text or "(Trainer):" in text, path


def test_the_schedule_warms_up_then_holds_or_decays():
    from glm53_flash.train.engine import Schedule

    constant = Schedule(1.0, warmup=4)
    assert [constant.at(i) for i in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert not constant.depends_on_length
    cosine = Schedule(1.0, warmup=2, shape="cosine", total=12, min_ratio=0.1)
    assert cosine.at(1) == 1.0 and cosine.at(2) == 1.0 and cosine.depends_on_length
    assert cosine.at(7) == pytest.approx(0.55) and cosine.at(12) == pytest.approx(0.1)
    assert cosine.at(100) == pytest.approx(0.1)  # past the end it stays at the floor
    with pytest.raises(ValueError, match="schedule 'linear'"):
        Schedule(1.0, shape="linear")


def test_the_step_loop_advances_fires_actions_and_stops_when_told():
    from glm53_flash.train.engine import StepLoop

    class Bar:
        def __init__(self):
            self.n, self.postfixes = 0, []

        def update(self, k):
            self.n += k

        def set_postfix(self, **kw):
            self.postfixes.append(kw)

    class Sink:
        def __init__(self):
            self.written = []

        def write(self, row, x):
            self.written.append((row["at"], x))

    fired, bar, sink = [], Bar(), Sink()
    loop = StepLoop(0, 10, lambda p: {"at": p}, sink=sink, bar=bar, advance=lambda p: min(10, p + 4),
                    at_steps=[({3, 10}, fired.append)], postfix=lambda row: {"at": row["at"]})
    assert loop.run() == 10 and loop.stopped_by is None
    assert sink.written == [(0, 4), (4, 8), (8, 10)]  # x is the position each step reached
    assert fired == [4, 10]  # 3 lies inside the first step's span (0, 4]
    assert bar.n == 10 and bar.postfixes == [{"at": 0}, {"at": 4}, {"at": 8}]
    rows = []
    loop = StepLoop(2, 9, lambda p: rows.append(p) or None, stop_when=lambda p: "cap" if p >= 5 else None)
    assert loop.run() == 5 and loop.stopped_by == "cap" and rows == [2, 3, 4]  # a None row is written nowhere


def test_rl_warmup_follows_the_engine_schedule(tmp_path):
    """RL's learning rate per update is the engine's Schedule over updates (the pretraining formula)."""
    import json

    import torch

    from glm53_flash import GLM53Flash, ModelConfig
    from glm53_flash.train.checkpoint import save_checkpoint
    from glm53_flash.train.engine import Schedule
    from glm53_flash.train.rl_run import RLConfig, train_rl

    torch.manual_seed(0)
    checkpoint = tmp_path / "init" / "checkpoint-0000"
    save_checkpoint(checkpoint, GLM53Flash(ModelConfig.preset("tiny").replace(max_sequence_length=128)), {"stage": "t"})
    out = tmp_path / "rl"
    train_rl(RLConfig(initial_checkpoint=str(checkpoint), output=str(out), groups=6, checkpoints=(6,), group_size=2,
                      max_new_tokens=4, prompts_per_update=2, warmup=3, learning_rate=3e-4, device="cpu", quiet=True,
                      verifier_workers=1, families="increment"))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in rows] == [Schedule(3e-4, warmup=3).at(u) for u in range(3)]
    assert [(r["first_group"], r["last_group"]) for r in rows] == [(1, 2), (3, 4), (5, 6)]
