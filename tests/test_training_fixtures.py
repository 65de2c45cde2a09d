"""Every training loop gives what it gave before the engine was shared (tests/fixtures/training.json,
recorded by tests/training_fixtures.py on the code before the change): the same per-step losses and
gradient norms, the same weights and the same receipts' checkpoints. Bit for bit where the machine
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
