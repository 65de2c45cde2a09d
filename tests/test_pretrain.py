import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from glm53_flash.train.checkpoint import (
    CheckpointError, load_checkpoint, read_metadata, save_checkpoint,
)
from glm53_flash.train.pretrain import PretrainConfig, TrainingDiverged, learning_rate_at, parameter_groups, pretrain

VENV_BIN = Path(sys.executable).parent


def tiny_cfg(output, **kw):
    base = dict(output=str(output), preset="tiny", steps=6, checkpoints=(3,), batch_size=4,
                sequence_length=128, device="cpu", quiet=True)
    base.update(kw)
    return PretrainConfig(**base)


def curve(run_dir):
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r["aux_loss"], r["grad_norm"]) for r in rows]


def cli(*args):
    return [str(VENV_BIN / "glm53"), *args]


def test_receipt_fields_and_checkpoints(tmp_path):
    receipt = pretrain(tiny_cfg(tmp_path / "run"))
    for key in ("schema_version", "status", "stage", "config", "parameter_counts", "seed", "steps", "batch_size",
                "sequence_length", "learning_rate", "tokens_seen", "elapsed_seconds", "device", "peak_vram_gib",
                "checkpoints", "training_curve", "provenance", "data", "peak_rss_bytes", "timing"):
        assert key in receipt, key
    assert receipt["status"] == "complete" and receipt["stage"] == "coding_pretraining"
    assert [c["step"] for c in receipt["checkpoints"]] == [0, 3, 6]
    assert receipt["tokens_seen"] == sum(r["tokens"] for r in receipt["training_curve"])
    assert receipt["provenance"]["argv"] and "torch" in receipt["provenance"]["versions"]
    assert len(receipt["data"]["sha256"]) == 64
    meta = read_metadata(tmp_path / "run" / "checkpoint-0006")
    assert meta["step"] == 6 and meta["weights_sha256"] == receipt["checkpoints"][-1]["weights_sha256"]
    model, _ = load_checkpoint(tmp_path / "run" / "checkpoint-0006")
    assert model.parameter_counts() == receipt["parameter_counts"]
    # tied weights are stored once
    from safetensors.torch import load_file
    assert not any("head" in k for k in load_file(str(tmp_path / "run/checkpoint-0006/model.safetensors")))


@pytest.mark.slow
def test_resume_after_sigkill_is_bit_identical(tmp_path):
    args = ["pretrain", "--preset", "tiny", "--steps", "150", "--checkpoints", "40,80,120", "--batch-size", "4",
            "--device", "cpu", "--no-progress"]
    subprocess.run(cli(*args, "--output", str(tmp_path / "full")), check=True, capture_output=True)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(cli(*args, "--output", str(killed)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = killed / "metrics.jsonl"
    deadline = time.time() + 900  # a generous bound on a busy machine: the test waits for rows, not for speed
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 50:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    rows_at_kill = len(metrics.read_text().splitlines())
    assert 50 <= rows_at_kill < 150, "the run must be killed midway"
    assert not (killed / "checkpoint-0120").exists()
    subprocess.run(cli(*args, "--output", str(killed), "--resume"), check=True, capture_output=True)
    assert curve(killed) == curve(tmp_path / "full")
    assert json.loads((killed / "training-receipt.json").read_text())["status"] == "complete"


@pytest.mark.slow
def test_ddp_two_processes_match_one_process(tmp_path):
    args = ["--preset", "tiny", "--steps", "4", "--checkpoints", "4", "--batch-size", "8", "--device", "cpu",
            "--no-progress"]
    subprocess.run(cli("pretrain", *args, "--output", str(tmp_path / "one")), check=True, capture_output=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([str(VENV_BIN / "torchrun"), "--standalone", "--nproc_per_node=2", "-m", "glm53_flash.cli",
                           "pretrain", *args, "--output", str(tmp_path / "two")], env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    one, two = curve(tmp_path / "one"), curve(tmp_path / "two")
    assert len(one) == len(two) == 4
    for a, b in zip(one, two):
        assert a[0] == b[0]
        assert abs(a[1] - b[1]) <= 1e-5 and abs(a[2] - b[2]) <= 1e-5
    receipt = json.loads((tmp_path / "two" / "training-receipt.json").read_text())
    assert receipt["world_size"] == 2


def test_interrupted_checkpoint_write_leaves_previous_loadable(tmp_path, monkeypatch):
    from glm53_flash import GLM53Flash
    from glm53_flash import ModelConfig
    import glm53_flash.train.checkpoint as ckpt

    model = GLM53Flash(ModelConfig.preset("tiny"))
    save_checkpoint(tmp_path / "checkpoint-0001", model, {"step": 1})

    def explode(*a, **k):
        raise KeyboardInterrupt("killed midway")

    monkeypatch.setattr(ckpt.torch, "save", explode)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path / "checkpoint-0002", model, {"step": 2}, trainer_state={"x": 1})
    assert not (tmp_path / "checkpoint-0002").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp leftovers
    loaded, meta = load_checkpoint(tmp_path / "checkpoint-0001")
    assert meta["step"] == 1


def test_corrupt_or_missing_files_are_clear_errors(tmp_path):
    from glm53_flash import GLM53Flash
    from glm53_flash import ModelConfig

    model = GLM53Flash(ModelConfig.preset("tiny"))
    good = tmp_path / "c"
    save_checkpoint(good, model, {"step": 0})
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    with open(bad / "model.safetensors", "r+b") as handle:
        handle.seek(200)
        handle.write(b"\x00\x01\x02\x03")
    with pytest.raises(CheckpointError, match="model.safetensors is corrupt"):
        load_checkpoint(bad)
    (bad / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors is missing"):
        load_checkpoint(bad)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")
    with pytest.raises(FileExistsError):
        save_checkpoint(good, model, {})
    run = tmp_path / "run"  # a run directory given where a checkpoint belongs: its checkpoints are named
    save_checkpoint(run / "checkpoint-0000", model, {"step": 0})
    save_checkpoint(run / "checkpoint-0002", model, {"step": 2})
    with pytest.raises(CheckpointError, match=r"is a run directory, not a checkpoint: give one of its checkpoints "
                                              r"\(checkpoint-0000, checkpoint-0002\), e.g. .*checkpoint-0002"):
        load_checkpoint(run)


def test_bad_inputs_are_one_line_errors(tmp_path):
    out = tmp_path / "run"
    pretrain(tiny_cfg(out, steps=2, checkpoints=(2,)))
    before = sorted(p.name for p in out.iterdir())
    result = subprocess.run(cli("pretrain", "--preset", "tiny", "--steps", "2", "--output", str(out)),
                            capture_output=True, text=True)
    assert result.returncode == 2 and "already exists; pass --resume" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == before
    with pytest.raises(ValueError, match="outside 1..5"):
        pretrain(tiny_cfg(tmp_path / "x", steps=5, checkpoints=(6,)))
    with pytest.raises(ValueError, match="does not divide across 3 ranks"):
        tiny_cfg(tmp_path / "y", batch_size=4).validate(world_size=3)
    with pytest.raises(ValueError, match=r"different learning_rate \(--learning-rate 0.0003 there, --learning-rate 0.001"):
        pretrain(tiny_cfg(out, steps=2, checkpoints=(2,), resume=True, learning_rate=1e-3))


def test_sizes_are_checked_against_the_context_and_the_memory_before_anything_is_written(tmp_path, capsys):
    """A length past the model's context and a step larger than the free memory are one-line errors with
    no run directory left behind (a length of 100,000 once ran until the kernel killed it at 24 GB)."""
    from glm53_flash.cli import main

    for length, words in (("100000", "exceeds the tiny model's context (192 tokens)"),
                          ("193", "exceeds the tiny model's context")):
        out = tmp_path / f"run-{length}"
        assert main(["pretrain", "--preset", "tiny", "--steps", "2", "--sequence-length", length,
                     "--output", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1 and not out.exists()
    cfg = tiny_cfg(tmp_path / "big", batch_size=4096)
    with pytest.raises(ValueError, match="needs about .* GiB, more than the 1.0 GiB this machine has free"):
        cfg.check_sizes(available=2**30)
    tiny_cfg(tmp_path / "small").check_sizes(available=2**30)  # the tests' own size fits a gigabyte
    longer = tiny_cfg(tmp_path / "longer", sequence_length=256, model_overrides={"max_sequence_length": 256})
    longer.check_sizes()  # a longer context asked for on purpose
    with pytest.raises(ValueError, match="--compile is for CUDA"):
        pretrain(tiny_cfg(tmp_path / "compiled", compile=True))
    assert not (tmp_path / "compiled").exists()


def test_divergence_stops_and_names_last_good_checkpoint(tmp_path):
    with pytest.raises(TrainingDiverged, match=r"diverged at step \d+.*Last good checkpoint: .*checkpoint-"):
        pretrain(tiny_cfg(tmp_path / "run", steps=40, checkpoints=(1,), learning_rate=1e20))
    load_checkpoint(tmp_path / "run" / "checkpoint-0001")


def test_schedule_and_weight_decay_groups():
    cfg = PretrainConfig(output="x", steps=100, warmup=10, schedule="cosine", learning_rate=1.0)
    assert learning_rate_at(0, cfg) == pytest.approx(0.1)
    assert learning_rate_at(9, cfg) == pytest.approx(1.0)
    assert learning_rate_at(99, cfg) == pytest.approx(0.1, abs=1e-3)
    from glm53_flash import GLM53Flash
    from glm53_flash import ModelConfig

    model = GLM53Flash(ModelConfig.preset("tiny"))
    decay, no_decay = parameter_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.ndim >= 2 for p in decay["params"])
    assert {names[id(p)].split(".")[-1] for p in no_decay["params"]} == {"weight", "input_logits", "output_logits"}
    assert all(p.ndim == 1 for p in no_decay["params"])


def test_checkpoint_with_the_earlier_expert_layout_loads_and_its_optimizer_state_is_refused(tmp_path):
    import torch
    from safetensors.torch import save_file

    from glm53_flash import GLM53Flash

    from glm53_flash import ModelConfig
    from glm53_flash.train.checkpoint import PARAMETER_LAYOUT, load_optimizer_state

    torch.manual_seed(0)
    model = GLM53Flash(ModelConfig.preset("tiny")).eval()
    directory = tmp_path / "old"
    save_checkpoint(directory, model, {"step": 0})
    # Rewrite the weights as the earlier layout stored them: expert_up [E, D, 2H].
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    for key in [k for k in state if k.endswith("expert_gate_up")]:
        state[key.replace("expert_gate_up", "expert_up")] = state.pop(key).transpose(1, 2).contiguous()
    save_file(state, str(directory / "model.safetensors"))
    meta = json.loads((directory / "metadata.json").read_text())
    from glm53_flash.core.receipts import sha256_file
    meta["files"]["model.safetensors"] = sha256_file(directory / "model.safetensors")
    (directory / "metadata.json").write_text(json.dumps(meta))
    loaded, _ = load_checkpoint(directory)
    ids = torch.randint(4, 260, (2, 30))
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(ids).logits, model(ids).logits)

    optimizer = torch.optim.AdamW(model.parameters())
    model(ids).logits.sum().backward()
    optimizer.step()
    current = {"optimizer": optimizer.state_dict(), "parameter_layout": PARAMETER_LAYOUT}
    fused = torch.optim.AdamW(loaded.parameters(), fused=True)
    load_optimizer_state(fused, current, directory)  # same layout: loads, and keeps its own kernel choice
    assert all(group["fused"] for group in fused.param_groups)
    with pytest.raises(CheckpointError, match="older parameter layout"):  # written before the layout tag
        load_optimizer_state(torch.optim.AdamW(loaded.parameters()), {"optimizer": current["optimizer"]}, directory)
    # no moments yet (a step-0 checkpoint): nothing to misread, so it loads
    load_optimizer_state(torch.optim.AdamW(loaded.parameters()),
                         {"optimizer": torch.optim.AdamW(model.parameters()).state_dict()}, directory)
    index = next(i for i, (name, _) in enumerate(model.named_parameters()) if name.endswith("expert_gate_up"))
    saved = current["optimizer"]
    saved["state"][index]["exp_avg"] = saved["state"][index]["exp_avg"].transpose(1, 2).contiguous()
    with pytest.raises(CheckpointError, match="cannot be resumed"):
        load_optimizer_state(torch.optim.AdamW(loaded.parameters()), current, directory)


# ------------------------------------------------------------------------------ run directories


def test_a_second_writer_is_refused_and_a_dead_holders_lock_is_taken_over(tmp_path, capsys):
    from glm53_flash.cli import main

    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from glm53_flash.train.rundir import RunLock; "
         "RunLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(120)", str(out)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main(["pretrain", "--preset", "tiny", "--steps", "2", "--batch-size", "2", "--device", "cpu",
                     "--quiet", "--output", str(out)]) == 2
        error = capsys.readouterr().err.strip()
        assert len(error.splitlines()) == 1 and f"in use by another run (pid {holder.pid})" in error
        assert not (out / "run.json").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (out / ".lock").read_text().strip() == str(holder.pid)  # stale: its holder is dead
    receipt = pretrain(tiny_cfg(out, steps=2, checkpoints=()))
    assert receipt["status"] == "complete"
    assert not (out / ".lock").exists()  # released when the run ended


def test_ctrl_c_marks_the_run_interrupted_and_the_printed_command_resumes_it(tmp_path, capsys, monkeypatch):
    import shlex

    from glm53_flash.cli import main
    from glm53_flash.train import pretrain as pretrain_module

    full = pretrain(tiny_cfg(tmp_path / "full", steps=6, checkpoints=(3,), learning_rate=5e-4))
    real_step = pretrain_module.Pretrainer.train_step

    def interrupted_at_step_5(self, step):
        if step == 4:
            raise KeyboardInterrupt
        return real_step(self, step)

    monkeypatch.setattr(pretrain_module.Pretrainer, "train_step", interrupted_at_step_5)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        pretrain(tiny_cfg(out, steps=6, checkpoints=(3,), learning_rate=5e-4))
    receipt = json.loads((out / "training-receipt.json").read_text())
    assert receipt["status"] == "interrupted" and receipt["resumes_from_step"] == 3
    printed = capsys.readouterr().err
    command, note = printed.split("interrupted; resume with: ", 1)[1].strip().splitlines()
    assert command == receipt["resume_command"] and command.endswith("--resume")
    # steps 1-4 finished, the checkpoint is at 3: the resumed run trains step 4 again, and says so
    assert note == "(the last checkpoint is at step 3: the resumed run trains step 4 again)"
    words = shlex.split(command)
    assert words[:2] == ["glm53", "pretrain"] and "--learning-rate" in words
    monkeypatch.setattr(pretrain_module.Pretrainer, "train_step", real_step)
    assert main(words[1:]) == 0
    assert curve(out) == curve(tmp_path / "full")
    assert json.loads((out / "training-receipt.json").read_text())["status"] == "complete"
    assert full["checkpoints"][-1]["weights_sha256"] == json.loads(
        (out / "training-receipt.json").read_text())["checkpoints"][-1]["weights_sha256"]


@pytest.mark.slow
def test_sigterm_marks_the_run_interrupted(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(cli("pretrain", "--preset", "tiny", "--steps", "5000", "--checkpoints", "2",
                                "--batch-size", "2", "--device", "cpu", "--output", str(out)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "checkpoint-0002").exists():
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    receipt = json.loads((out / "training-receipt.json").read_text())
    assert receipt["status"] == "interrupted" and receipt["resumes_from_step"] >= 2
    assert f"interrupted; resume with: glm53 pretrain --output {out}" in stderr and "--resume" in stderr
    assert "\r" not in stderr  # no progress bar when stderr is not a terminal


def test_resume_with_more_steps_extends_a_constant_schedule_or_refuses(tmp_path):
    short = tmp_path / "short"
    pretrain(tiny_cfg(short, steps=4, checkpoints=(2,)))
    pretrain(tiny_cfg(tmp_path / "long", steps=7, checkpoints=(2,)))
    extended = pretrain(tiny_cfg(short, steps=7, checkpoints=(2,), resume=True))
    assert curve(short) == curve(tmp_path / "long")  # the same as having asked for 7 steps at first
    assert [c["step"] for c in extended["checkpoints"]] == [0, 2, 4, 7]
    assert extended["length_changes"] == [{"from_steps": 4, "to_steps": 7, "at_step": 4}]
    assert json.loads((short / "run.json").read_text())["steps"] == 7
    with pytest.raises(ValueError, match="at least that"):
        pretrain(tiny_cfg(short, steps=5, checkpoints=(2,), resume=True))
    cosine = tmp_path / "cosine"
    pretrain(tiny_cfg(cosine, steps=3, checkpoints=(), schedule="cosine"))
    with pytest.raises(ValueError, match="cosine schedule sets every step's learning rate from --steps") as error:
        pretrain(tiny_cfg(cosine, steps=6, checkpoints=(), schedule="cosine", resume=True))
    assert "\n" not in str(error.value)
    assert json.loads((cosine / "run.json").read_text())["steps"] == 3


@pytest.mark.slow
def test_resume_with_only_the_output_continues_with_the_runs_own_settings(tmp_path, capsys):
    """`glm53 pretrain --output DIR --resume` takes the run's recorded settings, as nanoGPT's
    init_from='resume' does (it was refused for the defaults it did not give); a flag given that differs
    is refused naming it and both values; --steps alone extends the run with its own settings."""
    from glm53_flash.cli import main

    out = tmp_path / "run"
    started = ["pretrain", "--preset", "tiny", "--steps", "2", "--checkpoints", "1", "--batch-size", "4",
               "--sequence-length", "128", "--learning-rate", "1e-3", "--stream-mode", "delta", "--output", str(out),
               "--quiet"]
    assert main(started) == 0
    capsys.readouterr()
    assert main(["pretrain", "--output", str(out), "--resume", "--quiet"]) == 0  # nothing left: the receipt as it was
    assert main(["pretrain", "--output", str(out), "--resume", "--steps", "3", "--quiet"]) == 0
    receipt = json.loads((out / "training-receipt.json").read_text())
    assert (receipt["steps"], receipt["preset"], receipt["batch_size"], receipt["learning_rate"]) == (3, "tiny", 4, 1e-3)
    assert receipt["config"]["stream_mode"] == "delta" and [c["step"] for c in receipt["checkpoints"]] == [0, 1, 2, 3]
    capsys.readouterr()
    assert main(["pretrain", "--output", str(out), "--resume", "--batch-size", "8", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "different batch_size (--batch-size 4 there, --batch-size 8 here)" in err
    assert main(["pretrain", "--output", str(out), "--resume", "--stream-mode", "sinkhorn", "--quiet"]) == 2
    assert "different model_overrides" in capsys.readouterr().err


def test_a_checkpoint_path_without_its_zero_padding_names_the_one_that_exists(tmp_path, capsys):
    from glm53_flash import GLM53Flash, ModelConfig
    from glm53_flash.cli import main

    GLM53Flash(ModelConfig.preset("tiny")).save_pretrained(tmp_path / "checkpoint-0300")
    for path in (tmp_path / "checkpoint-300", tmp_path / "checkpoint-00300"):
        with pytest.raises(CheckpointError, match=rf"{path} does not exist; did you mean {tmp_path / 'checkpoint-0300'}\?"):
            load_checkpoint(path)
    assert main(["generate", "--checkpoint", str(tmp_path / "checkpoint-300"), "--prompt", "def f(x):"]) == 2
    assert "did you mean" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match=r"checkpoint-301 does not exist$"):
        load_checkpoint(tmp_path / "checkpoint-301")


def test_resuming_a_finished_run_leaves_its_receipt_as_the_training_process_wrote_it(tmp_path):
    """A resume with nothing left to train (what `glm53 reproduce` does for every finished stage) returns
    the receipt unchanged: its provenance and peak memory stay those of the process that trained."""
    out = tmp_path / "run"
    first = pretrain(tiny_cfg(out, steps=2, checkpoints=()))
    path = out / "training-receipt.json"
    written, stamp = path.read_bytes(), path.stat().st_mtime_ns
    metrics = (out / "metrics.jsonl").read_bytes()
    assert pretrain(tiny_cfg(out, steps=2, checkpoints=(), resume=True)) == first
    assert path.read_bytes() == written and path.stat().st_mtime_ns == stamp  # not even rewritten
    assert (out / "metrics.jsonl").read_bytes() == metrics
    # a receipt that does not record this run finished is written anew: not `complete` (marked
    # interrupted after the last step), another length (left from before an extension whose process
    # died after saving the new last checkpoint), or a last checkpoint with other weights
    for field, value in (("status", "interrupted"), ("steps", 1), ("checkpoints", [{"step": 2, "weights_sha256": "0" * 64}])):
        stale = {**json.loads(written), field: value}
        path.write_text(json.dumps(stale))
        again = pretrain(tiny_cfg(out, steps=2, checkpoints=(), resume=True))
        assert again["status"] == "complete" and again["steps"] == 2, field
        assert again["checkpoints"][-1]["weights_sha256"] == first["checkpoints"][-1]["weights_sha256"]


def test_live_logging_to_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    pretrain(tiny_cfg(out, steps=3, checkpoints=(), tensorboard=str(tmp_path / "tb")))
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    logged = [(e.step, e.value) for e in events.Scalars("loss")]
    assert [(s, pytest.approx(v, rel=1e-6)) for s, v in logged] == [(s, l) for s, l, _, _ in curve(out)]


def test_missing_live_logger_packages_are_one_line_errors(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("tensorboard", "wandb")
                        else real(name, *a))
    with pytest.raises(ValueError, match=r"--tensorboard needs the tensorboard package"):
        pretrain(tiny_cfg(tmp_path / "a", tensorboard=str(tmp_path / "tb")))
    with pytest.raises(ValueError, match=r"--wandb needs the wandb package"):
        pretrain(tiny_cfg(tmp_path / "b", wandb="project"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_progress_in_a_log_is_a_line_per_tenth_with_the_steps_metrics():
    import io

    from glm53_flash.core.progress import ProgressLines

    stream = io.StringIO()
    lines = ProgressLines(20, desc="pretrain", stream=stream)
    for step in range(20):
        lines.update(1)
        lines.set_postfix(loss=float(step))
    lines.close()
    out = stream.getvalue().splitlines()
    assert len(out) == 10 and "\r" not in stream.getvalue()
    assert out[0].startswith("pretrain: 2/20 step (10%)") and out[0].endswith("loss 1")  # this step's loss
    assert out[-1].startswith("pretrain: 20/20 step (100%)") and "left" not in out[-1]
    resumed = io.StringIO()
    later = ProgressLines(20, initial=15, stream=resumed)  # a resumed run counts from where it is
    later.update(5)
    later.close()
    assert resumed.getvalue().startswith("progress: 20/20 step (100%)")


def test_validation_every_n_steps_and_namespaced_live_tags(tmp_path):
    """--eval-every N adds val_loss to every N-th row of metrics.jsonl, leaves the training numbers as
    they are, and the live loggers get namespaced tags (train/loss, val/loss; step is the x axis)."""
    from glm53_flash.train.engine import MetricsSink

    plain = pretrain(tiny_cfg(tmp_path / "plain", steps=4, checkpoints=(4,)))
    checked = pretrain(tiny_cfg(tmp_path / "checked", steps=4, checkpoints=(4,), eval_every=2, eval_batches=1))
    rows = [json.loads(line) for line in (tmp_path / "checked" / "metrics.jsonl").read_text().splitlines()]
    assert ["val_loss" in r for r in rows] == [False, True, False, True]
    assert all(4.0 < r["val_loss"] < 7.0 for r in rows if "val_loss" in r)
    assert curve(tmp_path / "plain") == curve(tmp_path / "checked")
    assert plain["checkpoints"][-1]["weights_sha256"] == checked["checkpoints"][-1]["weights_sha256"]

    class Writer:
        def __init__(self):
            self.scalars = []

        def add_scalar(self, tag, value, step):
            self.scalars.append((tag, step))

    sink = MetricsSink()
    sink.writer = Writer()
    sink.write(rows[1], rows[1]["step"])
    tags = {tag for tag, _ in sink.writer.scalars}
    assert {"train/loss", "train/grad_norm", "val/loss"} <= tags and not any(t.endswith("/step") for t in tags)
    rl = MetricsSink(namespace="rl")
    rl.writer = Writer()
    rl.write({"first_group": 1, "last_group": 1, "mean_reward": 0.5}, 1)
    assert rl.writer.scalars == [("rl/mean_reward", 1)]


def test_adapt_threads_records_the_count_each_step_ran_with(tmp_path):
    pretrain(tiny_cfg(tmp_path / "run", steps=2, checkpoints=(2,), adapt_threads=True))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(isinstance(r["threads"], int) and r["threads"] >= 1 for r in rows)
    pretrain(tiny_cfg(tmp_path / "plain", steps=2, checkpoints=(2,)))
    assert "threads" not in (tmp_path / "plain" / "metrics.jsonl").read_text()  # off by default



def test_an_interrupt_between_a_checkpoint_and_its_hash_still_names_it_saved(tmp_path):
    """SIGTERM can land after a checkpoint's directory is renamed into place and before the run has
    recorded its hash: the interrupted receipt takes the hash from the directory and resumes from it."""
    from glm53_flash.train.pretrain import Pretrainer

    out = tmp_path / "run"
    trainer = Pretrainer(tiny_cfg(out, steps=4, checkpoints=(2, 4)))
    trainer.run()
    trainer.checkpoints[-1]["weights_sha256"] = None  # as if interrupted right after the rename
    trainer.trained_this_session = True
    trainer.mark_interrupted()
    receipt = json.loads((out / "training-receipt.json").read_text())
    assert receipt["status"] == "interrupted" and receipt["resumes_from_step"] == 4
    assert receipt["checkpoints"][-1]["weights_sha256"] == json.loads(
        (out / "checkpoint-0004" / "metadata.json").read_text())["weights_sha256"]


# A driver for the restart test: the machine reads quiet as the command starts and busy after every step
# (the load is scripted; tests/test_cli.py measures real busy processes), and the restart's estimates are
# set so that any remaining step pays for it.
RESTART_DRIVER = """
import sys
from glm53_flash.core import shared_machine
shared_machine.busy_cores_elsewhere = lambda *args, **kwargs: 0.0
shared_machine.LoadWatch.others = lambda self: 1.0
shared_machine.RESTART_SECONDS = shared_machine.SHORT_SPIN_BUSY_SLOWDOWN = shared_machine.RESTART_MIN_SAVING = 0
from glm53_flash.cli import main
sys.argv = ["glm53", *sys.argv[1:]]
sys.exit(main())
"""


def test_a_run_that_finds_the_machine_busy_restarts_with_short_spins_and_ends_on_the_same_weights(tmp_path):
    """Started quiet (libgomp's default spins), two busy steps in a row end the run as Ctrl-C would; the
    command executes itself again with GOMP_SPINCOUNT=1000 and --resume, redoes the step since its last
    checkpoint, and ends on the weights of a run that was never stopped; the new process's receipt says
    why its spins are short, and restarts happen once."""
    args = ["pretrain", "--preset", "tiny", "--steps", "6", "--checkpoints", "1,4,6", "--batch-size", "2",
            "--sequence-length", "128", "--device", "cpu", "--no-progress"]
    env = {key: value for key, value in os.environ.items() if key not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    subprocess.run(cli(*args, "--output", str(tmp_path / "straight")), check=True, capture_output=True,
                   env=dict(env, GOMP_SPINCOUNT="1000"))
    done = subprocess.run([sys.executable, "-c", RESTART_DRIVER, *args, "--output", str(tmp_path / "restarted")],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("starting again with short spin waits (GOMP_SPINCOUNT=1000) from the checkpoint at 1") == 1
    assert "interrupted; resume with" not in done.stderr
    receipt = json.loads((tmp_path / "restarted" / "training-receipt.json").read_text())
    straight = json.loads((tmp_path / "straight" / "training-receipt.json").read_text())
    assert receipt["status"] == "complete"
    assert receipt["provenance"]["spin_waits"] == ("on (GOMP_SPINCOUNT=1000: restarted when other processes used "
                                                   "1.0 cores at position 2)")
    assert [c["weights_sha256"] for c in receipt["checkpoints"]] == [c["weights_sha256"] for c in straight["checkpoints"]]
    assert [c["step"] for c in receipt["checkpoints"]] == [0, 1, 4, 6]
    assert curve(tmp_path / "restarted") == curve(tmp_path / "straight")
