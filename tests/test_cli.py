"""The `glm53` command line as a user meets it: spelled-out flags, errors with the right usage,
suggestions for typos, and a quiet end when the reader of the output goes away."""

import subprocess
import sys
from pathlib import Path

import pytest

from glm53_flash.cli import main


def _error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err


def test_a_flag_prefix_is_not_taken_for_the_flag(capsys):
    err = _error(["pretrain", "--output", "unused", "--step", "3"], capsys)
    assert err.splitlines() == ["glm53 pretrain: error: unrecognized arguments: --step 3 (did you mean --steps?)",
                                "(`glm53 pretrain --help` lists every flag)"]  # the error first, no usage block


def test_a_typo_in_a_nested_command_shows_that_command_usage(capsys):
    err = _error(["experiment", "rl-choices", "--output", "x", "--checkpoint", "c", "--armz", "a"], capsys)
    assert err.startswith("glm53 experiment rl-choices: error:") and "did you mean --arms?" in err


def test_misspelt_commands_and_choices_get_a_suggestion(capsys):
    assert "did you mean 'eval'?" in _error(["evl"], capsys)
    err = _error(["pretrain", "--output", "x", "--preset", "tny"], capsys)
    assert "did you mean 'tiny'?" in err and err.startswith("glm53 pretrain: error:") and len(err.splitlines()) == 2
    assert "did you mean" not in _error(["zzzzzz"], capsys)  # nothing close: no guess


def _run_with_closed_stdout(code: str) -> tuple[int, str]:
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child.stdout.close()  # the reader is gone before the command writes a byte (`glm53 info | head -0`)
    err = child.stderr.read()
    return child.wait(timeout=120), err


@pytest.mark.slow
def test_a_closed_pipe_ends_quietly():
    rc, err = _run_with_closed_stdout("import sys; from glm53_flash.cli import main; sys.exit(main(['info']))")
    assert rc == 141 and "Traceback" not in err and "BrokenPipe" not in err, err
    # the same command without the handler does fail loudly: the check above can fail
    rc, err = _run_with_closed_stdout("from glm53_flash.cli import _main; _main(['info'])")
    assert rc != 0 and "BrokenPipeError" in err


_FAULTS_SCRIPT = """
import resource, sys
import torch
from glm53_flash.core.runtime import retain_freed_memory
print(retain_freed_memory())
for _ in range(10):  # warm: the first few blocks extend the heap until freed ones coalesce
    torch.ones(10_000_000)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    torch.ones(10_000_000)  # 40 MB, written once, freed: above glibc's largest self-tuned mmap threshold
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc on Linux")
@pytest.mark.parametrize("tuning", ["1", "0"])
def test_freed_blocks_are_reused_without_new_page_faults(tuning):
    """Every glm53 command keeps freed memory for reuse (runtime.retain_freed_memory): writing a freshly
    allocated 40 MB block 20 times costs ~10,000 page faults each time without it, almost none with."""
    import os
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("the tuning is glibc's")
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if tuning == "0" and thp.exists() and "[always]" in thp.read_text():
        pytest.skip("transparent huge pages for every mapping: a fresh 40 MB block takes ~20 faults")
    env = dict(os.environ, GLM53_MALLOC_TUNING=tuning)
    done = subprocess.run([sys.executable, "-c", _FAULTS_SCRIPT], capture_output=True, text=True, env=env, check=True)
    status, faults = done.stdout.split("\n")[:2]
    if tuning == "1":
        assert status.startswith("on") and int(faults) < 1000
    else:
        assert status.startswith("off") and int(faults) > 20 * 5000


def test_short_spin_waits_only_on_a_busy_machine_and_only_where_it_can_still_act(monkeypatch):
    """shared_machine.short_spin_waits: GOMP_SPINCOUNT=SPIN_COUNT when other processes use BUSY_CORES or more and
    no OpenMP runtime is loaded yet; a quiet machine keeps libgomp's default; the user's count or wait
    policy is kept; after libgomp loaded nothing is set."""
    from glm53_flash.core import shared_machine

    monkeypatch.setattr(shared_machine, "_spin_waits", None)  # this process's record, restored afterwards
    monkeypatch.setattr(shared_machine, "_spin_choice", None)
    monkeypatch.setattr(shared_machine, "_openmp_loaded", lambda: False)
    environ: dict = {}
    assert shared_machine.short_spin_waits(environ, busy=1.0).startswith(f"on (GOMP_SPINCOUNT={shared_machine.SPIN_COUNT}: ")
    assert environ == {"GOMP_SPINCOUNT": str(shared_machine.SPIN_COUNT)} and shared_machine.spin_waits().startswith("on")
    assert shared_machine._spin_choice == "on"
    for quiet in (0.0, shared_machine.BUSY_CORES - 0.01):
        environ = {}
        assert shared_machine.short_spin_waits(environ, busy=quiet).startswith("off (") and environ == {}
        assert shared_machine._spin_choice == "off"
    environ = {}
    assert shared_machine.short_spin_waits(environ, busy=None).startswith("left alone (the machine's load") and not environ
    for mine in ({"GOMP_SPINCOUNT": "300000"}, {"OMP_WAIT_POLICY": "ACTIVE"}):
        environ = dict(mine)
        assert shared_machine.short_spin_waits(environ, busy=2.0).startswith("left alone (" + next(iter(mine)))
        assert environ == mine
    monkeypatch.setattr(shared_machine, "_openmp_loaded", lambda: True)
    environ = {}
    assert shared_machine.short_spin_waits(environ, busy=2.0) == "left alone (an OpenMP runtime was already loaded)"
    assert environ == {} and shared_machine._spin_choice == "kept"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps")
def test_openmp_is_seen_once_torch_loaded_it():
    """The check short_spin_waits relies on, against the real process: this one imported torch (libgomp)."""
    from glm53_flash.core import shared_machine

    assert "torch" in sys.modules and shared_machine._openmp_loaded()
    fresh = subprocess.run([sys.executable, "-c", "from glm53_flash.core.shared_machine import _openmp_loaded\n"
                            "print(_openmp_loaded())"], capture_output=True, text=True, check=True)
    assert fresh.stdout.strip() == "False"


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the machine's load from /proc/stat")
def test_a_command_started_beside_a_busy_process_sets_short_spin_waits_before_torch_loads():
    """A fresh `glm53` process beside one CPU-bound process measures it, sets GOMP_SPINCOUNT before torch
    loads and says so (info; receipts record it as provenance.spin_waits); a count the user set is kept."""
    import os

    from glm53_flash.benchmarks.contention import competitor

    script = "import sys\nfrom glm53_flash.cli import main\nsys.exit(main(['info', '--preset', 'tiny', '--no-generate']))"
    env = {key: value for key, value in os.environ.items() if key not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    with competitor(60):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
        assert "short spin waits: on (GOMP_SPINCOUNT=1000: other processes used" in done.stdout, done.stdout
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              env=dict(env, GOMP_SPINCOUNT="7"), check=True)
        assert "left alone (GOMP_SPINCOUNT=7 set before glm53 started)" in done.stdout


def test_receipts_name_the_commit_the_command_started_with(monkeypatch):
    """A long run writes receipts hours after it loaded its code: every glm53 command pins the
    checkout's commit when it starts (cli -> receipts.pin_launch_commit), and receipts name that one
    even if the checkout moves on."""
    from glm53_flash.core import receipts

    monkeypatch.setattr(receipts, "_launch_commit", {})
    at_start = receipts.git_commit()
    receipts.pin_launch_commit()

    def no_git(*args, **kwargs):
        raise OSError("git is gone")

    monkeypatch.setattr(receipts.subprocess, "run", no_git)
    assert receipts.git_commit() == at_start  # pinned: git is not asked again
    assert receipts.git_commit(cwd=Path(receipts.__file__).parent) is None  # an explicit checkout is


def test_every_command_pins_its_commit(monkeypatch, capsys):
    from glm53_flash.core import receipts

    monkeypatch.setattr(receipts, "_launch_commit", {})
    assert main(["ledger"]) == 0
    capsys.readouterr()
    assert receipts._launch_commit == {"commit": receipts.git_commit()}


def _commands(parser, prefix=()):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from _commands(sub, (*prefix, name))


def test_every_command_has_a_description_and_one_device_default():
    """`glm53 X --help` says what X does, and every --device defaults to the same choice."""
    import argparse

    from glm53_flash.cli import build_parser

    missing, devices = [], {}
    for name, sub in _commands(build_parser()):
        has_commands = any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)
        if not has_commands and not (sub.description or "").strip():
            missing.append(" ".join(name))
        for action in sub._actions:
            if "--device" in action.option_strings:
                devices[" ".join(name)] = action.default
    assert missing == []
    assert set(devices.values()) == {"auto"}, devices


def test_under_torchrun_a_bad_input_is_one_line_from_rank_0(monkeypatch, capsys, tmp_path):
    """Every rank meets the same bad input; only rank 0 prints it (each rank still exits 2)."""
    argv = ["pretrain", "--preset", "tiny", "--output", str(tmp_path / "x"), "--sequence-length", "1000"]
    monkeypatch.setenv("RANK", "1")
    assert main(argv) == 2 and capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    assert main(argv) == 2 and "exceeds the tiny model's context" in capsys.readouterr().err


def test_a_run_that_started_quiet_hints_once_when_the_machine_gets_busy(monkeypatch, capsys):
    """StepLoop with fixed threads, after a command found the machine quiet (spin waits off): two busy steps
    in a row print the hint once per process; a quiet step resets the count; with the governor, with short
    spin waits already on, or in library use (nothing asked) there is no hint."""
    import contextlib

    import torch

    from glm53_flash.core import shared_machine
    from glm53_flash.train.engine import StepLoop

    threads = torch.get_num_threads()
    loads = iter([1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    steps_seen = []
    monkeypatch.setattr(shared_machine.LoadWatch, "others", lambda self: next(loads))
    monkeypatch.setattr(shared_machine, "_spin_choice", "off")
    monkeypatch.setattr(shared_machine, "_busy_hint_given", False)
    StepLoop(0, 6, lambda p: steps_seen.append(p) or {}).run()
    err = capsys.readouterr().err
    assert err.count("other processes are using 1.0 cores") == 1 and "GOMP_SPINCOUNT=1000" in err
    assert steps_seen == list(range(6))
    StepLoop(0, 2, lambda p: {}).run()  # once per process
    assert capsys.readouterr().err == ""
    for choice, governor in (("on", None), ("kept", None), (None, None), ("off", shared_machine.ThreadGovernor())):
        monkeypatch.setattr(shared_machine, "_busy_hint_given", False)
        monkeypatch.setattr(shared_machine, "_spin_choice", choice)
        monkeypatch.setattr(shared_machine.LoadWatch, "others", lambda self: 2.0)
        with governor if governor is not None else contextlib.nullcontext():  # the governor hands its count back
            StepLoop(0, 3, lambda p: {}, governor=governor).run()
        assert "other processes are using" not in capsys.readouterr().err
    assert torch.get_num_threads() == threads


def test_one_busy_step_is_enough_when_it_ran_many_times_as_long(monkeypatch):
    """BusyHint fires on the second busy step in a row, or on the first that StepLoop judged slow: three
    times the median of two or more steps before it (a first step alone warms up and runs long)."""
    from glm53_flash.core import shared_machine
    from glm53_flash.train.engine import _slow

    assert not _slow([1.0, 5.0]) and not _slow([9.0, 1.0, 2.9]) and _slow([9.0, 1.0, 1.0, 3.0])
    monkeypatch.setattr(shared_machine.LoadWatch, "others", lambda self: 1.0)
    monkeypatch.setattr(shared_machine, "_busy_hint_given", False)
    assert shared_machine.BusyHint().after_step(slow=True) is not None
    monkeypatch.setattr(shared_machine, "_busy_hint_given", False)
    hint = shared_machine.BusyHint()
    assert hint.after_step() is None and hint.after_step() is not None and hint.streak == 2
    monkeypatch.setattr(shared_machine.LoadWatch, "others", lambda self: 0.0)
    monkeypatch.setattr(shared_machine, "_busy_hint_given", False)
    assert shared_machine.BusyHint().after_step(slow=True) is None  # slow but quiet: not the load's doing


def test_a_restart_with_short_spins_must_pay_for_itself():
    """shared_machine.restart_pays on the flash figures (a quiet step 2.3 s, 10x beside a busy core): a long rest of
    the run pays for the restart and the steps it redoes; a short rest, a mild slowdown, or a redo as long
    as what it saves does not."""
    from glm53_flash.core.shared_machine import restart_pays

    assert restart_pays(remaining=50, busy_seconds=23.0, quiet_seconds=2.3, redo=10)
    assert restart_pays(remaining=5, busy_seconds=23.0, quiet_seconds=2.3, redo=0)
    assert not restart_pays(remaining=2, busy_seconds=23.0, quiet_seconds=2.3, redo=0)  # saves under a minute
    assert not restart_pays(remaining=50, busy_seconds=4.0, quiet_seconds=2.3, redo=0)  # short spins are no faster
    assert not restart_pays(remaining=10, busy_seconds=23.0, quiet_seconds=2.3, redo=40)  # the redo eats the gain
    assert not restart_pays(remaining=10 ** 6, busy_seconds=0.001, quiet_seconds=0.001, redo=0)  # tiny steps


def test_a_busy_run_restarts_after_its_checkpoint_only_where_allowed_and_paying(monkeypatch, capsys):
    """StepLoop, started quiet with fixed threads: where the command allowed restarts and one pays, the
    second busy step's checkpoint runs, then shared_machine.ShortSpinRestart (a KeyboardInterrupt, so every
    layer ends as on Ctrl-C) names the last checkpoint; not allowed, not paying, or no checkpoint to
    resume from: the hint instead, and the run goes on."""
    from glm53_flash.core import shared_machine
    from glm53_flash.train.engine import StepLoop

    monkeypatch.setattr(shared_machine.LoadWatch, "others", lambda self: 1.0)
    monkeypatch.setattr(shared_machine, "_spin_choice", "off")
    for name in ("RESTART_SECONDS", "SHORT_SPIN_BUSY_SLOWDOWN", "RESTART_MIN_SAVING"):
        monkeypatch.setattr(shared_machine, name, 0)

    def loop(saved):
        steps, checkpoints = [], []

        def checkpoint(done):
            checkpoints.append(done)
            if saved:  # a run with no checkpoint saved has none to resume from
                saved.append(done)

        return StepLoop(0, 8, lambda p: steps.append(p) or {}, at_steps=[({1, 2, 4}, checkpoint)],
                        restart_from=lambda: max(saved, default=None)), steps, checkpoints

    monkeypatch.setattr(shared_machine, "_busy_hint_given", False)
    shared_machine.allow_restart(True)
    try:
        run, steps, checkpoints = loop([0])
        with pytest.raises(shared_machine.ShortSpinRestart) as stopped:
            run.run()
        assert isinstance(stopped.value, KeyboardInterrupt) and stopped.value.resume_from == 2
        assert steps == [0, 1] and checkpoints == [1, 2]
        assert "at position 2" in stopped.value.reason and capsys.readouterr().err == ""
        for allowed, saved, slowdown in ((False, [0], 0), (True, [], 0), (True, [0], 100)):
            shared_machine.allow_restart(allowed)
            monkeypatch.setattr(shared_machine, "SHORT_SPIN_BUSY_SLOWDOWN", slowdown)
            monkeypatch.setattr(shared_machine, "_busy_hint_given", False)
            run, steps, _ = loop(saved)
            assert run.run() == 8 and steps == list(range(8))
            assert "GOMP_SPINCOUNT=1000" in capsys.readouterr().err
    finally:
        shared_machine.allow_restart(False)


def test_only_the_process_own_command_line_may_restart(monkeypatch, capsys):
    """main([...]) from Python (tests, notebooks) never allows a restart: it would replace the caller."""
    from glm53_flash.core import shared_machine

    assert main(["ledger"]) == 0
    capsys.readouterr()
    assert not shared_machine.restart_allowed()


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the machine's load from /proc/stat")
def test_the_busy_hint_sees_a_real_busy_process(monkeypatch):
    import time

    from glm53_flash.benchmarks.contention import competitor
    from glm53_flash.core import shared_machine

    monkeypatch.setattr(shared_machine, "_busy_hint_given", False)
    with competitor(30):
        hint = shared_machine.BusyHint()
        messages = []
        for _ in range(3):
            time.sleep(0.3)
            messages.append(hint.after_step())
    assert messages[0] is None and messages[1] is not None and "GOMP_SPINCOUNT=1000" in messages[1]
    assert messages[2] is None
