"""A corpus of corrupt and hostile inputs: each ends in one line on stderr, a non-zero exit and
nothing written, within seconds (no unbounded allocation)."""

import json
import os
import shutil
import time

import pytest
import torch

from glm53_flash import GLM53Flash

from glm53_flash import ModelConfig
from glm53_flash.cli import main
from glm53_flash.core.receipts import sha256_file


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("model") / "saved"
    torch.manual_seed(0)
    GLM53Flash(ModelConfig.preset("tiny")).save_pretrained(directory)
    return directory


def _rehash(directory, name):
    """Keep metadata.json's hashes consistent with an edited file: only the content is wrong."""
    meta = json.loads((directory / "metadata.json").read_text())
    meta["files"][name] = sha256_file(directory / name)
    (directory / "metadata.json").write_text(json.dumps(meta))


def _edit_config(directory, **changes):
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))
    _rehash(directory, "config.json")


def _swap_weights(directory, config: ModelConfig):
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in GLM53Flash(config).state_dict().items()}
    save_file(state, str(directory / "model.safetensors"))
    _rehash(directory, "model.safetensors")


CORRUPTIONS = {
    "metadata is a list": lambda d: (d / "metadata.json").write_text("[]"),
    "metadata files is a string": lambda d: (d / "metadata.json").write_text('{"files": "x"}'),
    "config is a list": lambda d: ((d / "config.json").write_text("[1]"), _rehash(d, "config.json")),
    "config is not utf-8": lambda d: ((d / "config.json").write_bytes(b"\xff\xfe{"), _rehash(d, "config.json")),
    "layers = 10**7": lambda d: _edit_config(d, layers=10**7),
    "vocab_size = 10**12": lambda d: _edit_config(d, vocab_size=10**12),
    "dim is a string": lambda d: _edit_config(d, dim="32"),
    "a huge product of sizes": lambda d: _edit_config(d, dim=8192, heads=8, layers=1000),
    "unknown field": lambda d: _edit_config(d, surprise=1),
    "other model_type": lambda d: _edit_config(d, model_type="llama"),
    "wrong tensor shapes, consistent hashes": lambda d: _swap_weights(d, ModelConfig.preset("tiny", dim=64)),
    "truncated weights, consistent hashes": lambda d: (
        (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:100]),
        _rehash(d, "model.safetensors")),
    "edited weights": lambda d: (d / "model.safetensors").write_bytes(b"x"),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_a_corrupt_checkpoint_is_one_line(name, saved, tmp_path, capsys):
    directory = tmp_path / "ckpt"
    shutil.copytree(saved, directory)
    CORRUPTIONS[name](directory)
    out = tmp_path / "receipt.json"
    start = time.perf_counter()
    code = main(["eval", "--checkpoint", str(directory), "--split", "dev", "--output", str(out), "--per-family", "1",
                 "--families", "double"])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and err.startswith("glm53 eval: error:"), err
    assert not out.exists() and time.perf_counter() - start < 30


def test_the_corpus_covers_a_good_checkpoint_that_loads(saved):
    model = GLM53Flash.from_pretrained(saved)  # the fixture itself is fine: every failure above is the edit's
    assert model.config == ModelConfig.preset("tiny")


@pytest.mark.parametrize("content", ["[]", "{}", '{"episodes": "x"}', "not json", '{"episodes": []}'])
def test_corrupt_receipts_for_compare(content, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    out = tmp_path / "comparison.json"
    code = main(["compare", str(bad), str(bad), "--output", str(out)])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and "glm53 compare: error:" in err and not out.exists()


@pytest.mark.parametrize("content", ["[]", "{}", "nonsense", '{"preset": "x", "plan": [], "seeds": {}, '
                                     '"trained_families": [], "untrained_families": [], "pretrain_selection": {}, '
                                     '"stage_seconds": {}}', '{"arms": []}', '{"arms": {}, "comparison": {}}'])
def test_a_corrupt_headline_summary_for_the_deck(content, tmp_path, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "summary.json").write_text(content)
    out = tmp_path / "deck.html"
    code = main(["slides", "build", "--runs", str(runs), "--output", str(out)])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and "glm53 slides: error:" in err and not out.exists(), err


@pytest.mark.parametrize("content", ["[]", '{"preset": "quick"}', '{"preset": "quick", "plan": []}',
                                     '{"preset": "quick", "plan": {"pretrain": {"steps": "x"}}}'])
def test_a_corrupt_plan_is_refused_before_anything_runs(content, tmp_path, capsys):
    out = tmp_path / "demo"
    (out / "ours").mkdir(parents=True)
    (out / "ours" / "plan.json").write_text(content)
    code = main(["reproduce", "--preset", "quick", "--output", str(out), "--arms", "ours", "--quiet"])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and "glm53 reproduce: error:" in err, err
    assert sorted(p.name for p in (out / "ours").iterdir()) == ["plan.json"]  # nothing written


# --------------------------------------------------------------------------- hostile files: writes and reads


def test_every_write_refuses_a_link_and_leaves_no_half_file(tmp_path):
    """write_text / write_json / write_bytes, which every command writes through: a target that is a
    symbolic link (or not a regular file) is refused in one line and what it points to is untouched; a
    write that fails leaves the old file and no temporary one."""
    from glm53_flash.core.receipts import UnsafeFileError, write_bytes, write_json, write_text

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "receipt.json").symlink_to(victim)
    (tmp_path / "a-directory").mkdir()
    for write, name in ((write_json, "receipt.json"), (write_text, "a-directory")):
        with pytest.raises(UnsafeFileError, match="symbolic link|not a regular file") as refused:
            write(tmp_path / name, {"x": 1} if write is write_json else "x")
        assert str(tmp_path / name) in str(refused.value) and "\n" not in str(refused.value)
    assert victim.read_text() == "keep me"
    target = write_text(tmp_path / "report.md", "old")
    with pytest.raises(TypeError):
        write_bytes(target, "not bytes")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == [
        "a-directory", "receipt.json", "report.md", "victim.txt"]


def test_a_write_stays_inside_its_output_directory(tmp_path):
    """An output directory whose path runs through a link inside the directory it must stay in is refused
    (core.receipts.write_bytes with `within`), and so is a path that leaves it."""
    from glm53_flash.core.receipts import UnsafeFileError, write_text

    outside = tmp_path / "outside"
    outside.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "charts").symlink_to(outside)
    for path in (run / "charts" / "x.png", run / ".." / "outside" / "x.png"):
        with pytest.raises(UnsafeFileError):
            write_text(path, "x", within=run)
    assert list(outside.iterdir()) == []
    assert write_text(run / "new" / "x.md", "x", within=run).read_text() == "x"


def test_inputs_are_regular_files_within_their_caps(tmp_path, monkeypatch):
    import os

    from glm53_flash.core import receipts

    fifo = tmp_path / "receipt.json"
    os.mkfifo(fifo)
    with pytest.raises(receipts.UnsafeFileError, match="not a regular file"):
        receipts.read_json(fifo)  # refused, not waited on
    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 600 + "0]")
    monkeypatch.setitem(receipts.READ_LIMITS, "json", 1000)
    with pytest.raises(receipts.UnsafeFileError, match="read up to"):
        receipts.read_json(big)
    link = tmp_path / "rows.jsonl"
    victim = tmp_path / "victim.jsonl"
    victim.write_text("")
    link.symlink_to(victim)
    with pytest.raises(receipts.UnsafeFileError, match="symbolic link"):
        receipts.append_text(link, "{}\n")
    assert victim.read_text() == ""


def test_a_run_lock_is_never_taken_through_a_link(tmp_path):
    from glm53_flash.core.receipts import UnsafeFileError
    from glm53_flash.train.rundir import LOCK_FILE, RunLock

    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (run / LOCK_FILE).symlink_to(victim)
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        RunLock(run).acquire()
    assert victim.read_text() == "keep me"


# ----------------------------------------------------------------------------------- bounded loaders
# Each attacker test reproduces one way a small hostile checkpoint made the loaders allocate, read or hash
# without bound before refusing; a guard makes the unbounded step fail the test at once (instead of
# allocating gigabytes or hashing a terabyte on the test machine).


def _refuse_real_builds(monkeypatch):
    """GLM53Flash may be built on the meta device only (what a bounded loader does before the checks pass)."""
    original = GLM53Flash.__init__

    def guarded(self, *args, **kwargs):
        assert torch.get_default_device().type == "meta", "the model was built before its checkpoint was checked"
        original(self, *args, **kwargs)

    monkeypatch.setattr(GLM53Flash, "__init__", guarded)


def _hostile_checkpoint(directory, weights: bytes = b"x" * 64, **config):
    """A checkpoint of about a kilobyte: `config` over the tiny preset's config.json, `weights` as
    model.safetensors, metadata.json listing both with their true hashes."""
    from glm53_flash.model.pretrained import config_document

    directory.mkdir()
    document = dict(config_document(ModelConfig.preset("tiny")), **config)
    for ours, conventional in (("dim", "hidden_size"), ("layers", "num_hidden_layers"), ("heads", "num_attention_heads"),
                               ("max_sequence_length", "max_position_embeddings"), ("experts", "num_local_experts"),
                               ("top_k", "num_experts_per_tok"), ("expert_hidden", "moe_intermediate_size")):
        document[conventional] = document[ours]
    (directory / "config.json").write_text(json.dumps(document))
    (directory / "model.safetensors").write_bytes(weights)
    files = {name: sha256_file(directory / name) for name in ("config.json", "model.safetensors")}
    (directory / "metadata.json").write_text(json.dumps({"files": files, "weights_sha256": files["model.safetensors"]}))
    return directory


def test_rope_tables_count_so_a_kilobyte_checkpoint_cannot_ask_for_gigabytes(tmp_path, monkeypatch, capsys):
    """dim 2048 over one head and a context of 2^20: few parameters, but RoPE tables of 2^20 x 2048 (8 GiB
    of float64 angles alone) that no estimate counted; now the config's memory bound refuses it first."""
    from glm53_flash.model.lm import load_pretrained
    from glm53_flash.model.pretrained import CheckpointError

    _refuse_real_builds(monkeypatch)
    directory = _hostile_checkpoint(tmp_path / "rope", dim=2048, heads=1, layers=1, experts=1, top_k=1,
                                    expert_hidden=8, max_sequence_length=1 << 20, sparse_window=8, sparse_stride=8)
    with pytest.raises(CheckpointError, match=r"RoPE tables.*GiB\), more than this code builds"):
        load_pretrained(directory)
    code = main(["generate", "--checkpoint", str(directory), "--prompt", "def f(x):"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "RoPE tables" in err  # the Auto classes: tests/test_hf.py


def test_a_model_under_the_parameter_cap_is_checked_against_its_weights_and_the_free_memory_before_it_is_built(
        tmp_path, monkeypatch):
    """3.2e9 parameters (under MAX_PARAMETERS, 4e9) in a kilobyte: the weights' header is read and every
    tensor's name and shape held against the config before the model is built, and the memory it needs
    against what the machine has free."""
    import safetensors.torch

    from glm53_flash.core import runtime
    from glm53_flash.model.lm import load_pretrained
    from glm53_flash.model.pretrained import CheckpointError

    _refuse_real_builds(monkeypatch)
    tensors = {"embedding.weight": torch.zeros(4, 8)}
    directory = _hostile_checkpoint(tmp_path / "big", weights=safetensors.torch.save(tensors), dim=16384, heads=128,
                                    layers=3, experts=1, top_k=1, expert_hidden=8, vocab_size=260)
    assert 3e9 < ModelConfig.from_dict({k: v for k, v in json.loads((directory / "config.json").read_text()).items()
                                         if k in ModelConfig.__dataclass_fields__}).approximate_parameters() < 4e9
    monkeypatch.setattr(runtime, "available_memory_bytes", lambda: 1 << 40)  # a machine with a terabyte free
    with pytest.raises(CheckpointError, match=r"weights do not match the config \(missing"):
        load_pretrained(directory)
    monkeypatch.setattr(runtime, "available_memory_bytes", lambda: 1 << 30)
    with pytest.raises(CheckpointError, match=r"needs about 2\d\.\d GiB, more than the 1\.0 GiB this machine has free"):
        load_pretrained(directory)


def test_a_sparse_metadata_json_is_refused_before_it_is_read(saved, tmp_path, monkeypatch):
    """A 16 GiB sparse metadata.json was read whole; now its size is checked first."""
    from pathlib import Path

    from glm53_flash.model.lm import load_pretrained
    from glm53_flash.model.pretrained import CheckpointError

    directory = tmp_path / "ckpt"
    shutil.copytree(saved, directory)
    os.truncate(directory / "metadata.json", 16 << 30)
    read_text = Path.read_text

    def bounded_read(self, *args, **kwargs):
        assert self.stat().st_size < 1 << 27, f"{self.name} ({self.stat().st_size} bytes) was read whole"
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", bounded_read)
    with pytest.raises(CheckpointError, match=r"metadata.json has 17,179,869,184 bytes, more than the 1,048,576"):
        load_pretrained(directory)


@pytest.mark.parametrize("name", ["model.safetensors", "trainer-state.pt"])
def test_a_listed_sparse_terabyte_is_refused_before_it_is_hashed(name, saved, tmp_path, monkeypatch):
    """A listed 1 TiB sparse file was hashed (22 CPU-s and counting); now every listed file's size is held
    against its cap (model/pretrained.py file_cap) before any is hashed."""
    from glm53_flash.model import pretrained
    from glm53_flash.model.lm import load_pretrained

    directory = tmp_path / "ckpt"
    shutil.copytree(saved, directory)
    (directory / name).touch()
    os.truncate(directory / name, 1 << 40)
    meta = json.loads((directory / "metadata.json").read_text())
    meta["files"][name] = "0" * 64
    (directory / "metadata.json").write_text(json.dumps(meta))
    hash_file = pretrained.sha256_file

    def bounded_hash(path, *args, **kwargs):
        assert os.stat(path).st_size < 1 << 30, f"{path} was hashed"
        return hash_file(path, *args, **kwargs)

    monkeypatch.setattr(pretrained, "sha256_file", bounded_hash)
    with pytest.raises(pretrained.CheckpointError, match=rf"{name} has 1,099,511,627,776 bytes, more than the"):
        load_pretrained(directory)
