"""The README's Python API runs as written, and saved models load back exactly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from glm53_flash import GLM53Flash

from glm53_flash import ModelConfig
from glm53_flash.model.pretrained import CheckpointError
from glm53_flash.train.checkpoint import save_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def readme_block(name: str) -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- readme-test: {name} -->\s*```python\n(.*?)```", text, re.S)
    assert match, f"README has no block marked {name}"
    return match.group(1)


def test_the_readme_loads_a_trained_checkpoint_tokenizes_and_generates(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = GLM53Flash(ModelConfig.preset("tiny"))
    save_checkpoint(tmp_path / "runs/demo/ours/pretrain/checkpoint-0100", model, {"step": 100}, {"optimizer": {}})
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(readme_block("load-and-generate"), "README.md", "exec"), namespace)  # noqa: S102 - our README
    assert namespace["completion"].finish_reason in ("eos", "cap")
    document = json.loads((tmp_path / "my-model" / "config.json").read_text())
    assert document["model_type"] == "glm53_flash" and document["architectures"] == ["GLM53FlashForCausalLM"]
    assert document["tokenizer"]["vocab_size"] == 260


def test_from_pretrained_of_save_pretrained_gives_identical_logits(tmp_path):
    torch.manual_seed(1)
    model = GLM53Flash(ModelConfig.preset("tiny")).eval()
    model.save_pretrained(tmp_path / "saved")
    loaded = GLM53Flash.from_pretrained(tmp_path / "saved").eval()
    ids = torch.randint(4, 260, (2, 30))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert loaded.config == model.config
    with pytest.raises(FileExistsError):
        model.save_pretrained(tmp_path / "saved")  # never replaces a saved model


def test_configs_written_before_model_type_existed_still_load(tmp_path):
    model = GLM53Flash(ModelConfig.preset("tiny"))
    model.save_pretrained(tmp_path / "saved")
    path = tmp_path / "saved" / "config.json"
    document = json.loads(path.read_text())
    for key in ("model_type", "architectures", "tokenizer"):
        document.pop(key)
    path.write_text(json.dumps(document))
    assert GLM53Flash.from_pretrained(tmp_path / "saved", verify=False).config == model.config
    document["model_type"] = "llama"
    path.write_text(json.dumps(document))
    with pytest.raises(CheckpointError, match="model_type"):
        GLM53Flash.from_pretrained(tmp_path / "saved", verify=False)
