"""`glm53 verify` and `glm53 bench verify`, run through the real `glm53` entry point."""

from __future__ import annotations

import json

import pytest

from glm53_flash.tasks.families import _task_by_id as task_by_id  # the generator itself: sealed splits without an opening, for tests of the verifier and suites
from glm53_flash.cli import main as run

TASK = task_by_id("dev-double-000")


@pytest.mark.parametrize("source, code, status", [
    (TASK.reference_source.encode(), 0, "passed"),
    ((TASK.prompt + "\n    return x * x\n").encode(), 1, "failed"),
    ((TASK.prompt + "\n    return 'a' * 10 ** 10\n").encode(), 1, "limit"),
    (TASK.prompt.encode() + b"\n    return '\xff'\n", 1, "invalid"),  # not UTF-8
])
def test_verify_prints_the_evaluation_as_json(tmp_path, capsys, source, code, status):
    path = tmp_path / "candidate.py"
    path.write_bytes(source)
    assert run(["verify", "--task-id", TASK.task_id, "--source", str(path), "--wall-seconds", "1"]) == code
    printed = json.loads(capsys.readouterr().out)
    assert printed["task_id"] == TASK.task_id and printed["status"] == status
    assert set(printed) == {"task_id", "status", "passed", "tests_passed", "tests_total", "pass_fraction", "message"}


@pytest.mark.parametrize("argv, fragment", [
    (["verify", "--task-id", "dev-nope-000", "--source", "x.py"], "unknown family"),
    (["verify", "--task-id", "dev-double-000", "--source", "/nonexistent/file.py"], "cannot read --source"),
    (["verify", "--task-id", "dev-double-000", "--source", __file__, "--memory-mb", "1"], "memory_bytes"),
    (["bench", "verify", "--count", "0"], "--count"),
    (["bench", "verify", "--workers", "0"], "--workers"),
    (["bench", "verify", "--repeats", "0"], "--repeats"),
    (["verify", "--task-id", "dev-double-000", "--source", __file__, "--cpu-seconds", "inf"], "cpu_seconds"),
    (["verify", "--task-id", "dev-double-000", "--source", __file__, "--wall-seconds", "1e300"], "wall_seconds"),
    (["verify", "--source", __file__], "--task-id and --source are required"),
    (["verify", "--task-id", "confirm-double-000", "--source", __file__], "confirm is a sealed split"),
])
def test_bad_input_is_one_clear_line_and_exit_code_2(capsys, argv, fragment):
    assert run(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("glm53 ") and "error:" in error and fragment in error and error.count("\n") == 1


@pytest.mark.slow
def test_bench_verify_writes_a_receipt(tmp_path, capsys):
    output = tmp_path / "bench" / "verify.json"
    argv = ["bench", "verify", "--count", "80", "--repeats", "2", "--time-limit-cases", "1", "--cpu-seconds", "0.2",
            "--wall-seconds", "1", "--output", str(output)]
    assert run(argv) == 0
    receipt = json.loads(output.read_text())
    assert receipt["mix"]["total"] == 80 and receipt["workers"] == 2
    assert receipt["status_mismatches_vs_in_process"] == 0
    assert receipt["isolated"]["candidates_per_second"] > 0 and receipt["in_process"]["candidates_per_second"] > 0
    assert receipt["ratio_isolated_to_in_process"] == pytest.approx(
        receipt["isolated"]["candidates_per_second"] / receipt["in_process"]["candidates_per_second"])
    assert receipt["time_limit_candidates"]["statuses"] == {"limit": 1}
    assert sum(receipt["isolated"]["statuses"].values()) == 80
    assert not list(output.parent.glob("*.tmp"))
    assert "candidates/s" in capsys.readouterr().out


def test_verify_isolation_reports_every_layer(capsys):
    code = run(["verify", "--isolation"])
    report = json.loads(capsys.readouterr().out)
    assert code == (0 if report["level"] == "full" else 1)
    assert set(report["layers"]) >= {"seccomp", "network_namespace", "user_namespace", "unprivileged_uid"}
    assert report["missing"] == [name for name, value in report["layers"].items() if value is False]


def test_the_receipt_records_the_isolation_reached(tmp_path, capsys):
    output = tmp_path / "verify.json"
    assert run(["bench", "verify", "--count", "20", "--repeats", "1", "--time-limit-cases", "0",
                "--output", str(output)]) == 0
    receipt = json.loads(output.read_text())
    assert receipt["isolation"]["level"] in ("full", "partial")
    assert receipt["provenance"]["verifier_isolation"]["level"] == receipt["isolation"]["level"]


def test_require_isolation_refuses_below_full(monkeypatch, capsys):
    """Simulate a host that refuses the kernel layers: --require-isolation ends in one line, exit 2."""
    from glm53_flash.verifier import sandbox

    original = sandbox.Verifier.__init__

    def without_kernel_layers(self, *args, **kwargs):
        kwargs["kernel_layers"] = False
        original(self, *args, **kwargs)

    monkeypatch.setattr(sandbox.Verifier, "__init__", without_kernel_layers)
    try:
        code = run(["--require-isolation", "verify", "--task-id", TASK.task_id, "--source", __file__])
    finally:
        sandbox.require_full_isolation(False)
    error = capsys.readouterr().err
    assert code == 2 and "full sandbox isolation was required" in error and error.count("\n") == 1
