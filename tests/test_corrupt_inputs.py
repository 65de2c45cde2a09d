"""A corpus of corrupt and hostile inputs: each ends in one line on stderr, a non-zero exit and
nothing written, within seconds (no unbounded allocation)."""

import json
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
