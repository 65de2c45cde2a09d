"""Hugging Face Transformers interop (glm53_flash/hf.py): a checkpoint directory loads through
AutoConfig, AutoModel(ForCausalLM) and AutoTokenizer; generate() equals `glm53 generate` token for
token, greedy and sampled; config.json carries the conventional key names and older files still load.
Skipped where the optional `hf` extra (transformers) is not installed; .ci/run installs it."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the optional hf extra is not installed "
                                                          "(pip install 'glm53_flash[hf]')")

import glm53_flash.hf as hf  # noqa: E402 - registers the Auto classes
from glm53_flash import GLM53Flash, ModelConfig  # noqa: E402
from glm53_flash.data.tokenizer import ByteTokenizer  # noqa: E402
from glm53_flash.evaluation.sampling import generate  # noqa: E402
from glm53_flash.model.pretrained import CONVENTIONAL_KEYS, load_config, save_pretrained  # noqa: E402

PROMPTS = ["def f(x):", "# Return x plus one.\ndef g(x):", "é ü"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(7)
    model = GLM53Flash(ModelConfig.preset("tiny", init_std=0.08)).eval()
    with torch.no_grad():  # a larger EOS row of the tied head: some greedy rows stop at EOS, some at the cap
        model.embedding.weight[ByteTokenizer().eos_id] *= 3
    directory = tmp_path_factory.mktemp("hf") / "checkpoint-0001"
    save_pretrained(model, directory, {"stage": "test"})
    return directory, model


def test_the_auto_classes_load_a_checkpoint_directory(checkpoint):
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    directory, model = checkpoint
    document = json.loads((directory / "config.json").read_text())
    assert document["model_type"] == "glm53_flash" and document["torch_dtype"] == "float32"
    assert (document["hidden_size"], document["num_hidden_layers"], document["num_attention_heads"],
            document["max_position_embeddings"]) == (model.config.dim, model.config.layers, model.config.heads,
                                                     model.config.max_sequence_length)
    assert (document["bos_token_id"], document["eos_token_id"], document["pad_token_id"]) == (1, 2, 0)
    config = AutoConfig.from_pretrained(directory)
    assert isinstance(config, hf.GLM53FlashConfig) and config.model_config() == model.config
    assert config.hidden_size == model.config.dim and config.num_experts_per_tok == model.config.top_k
    for auto in (AutoModelForCausalLM, AutoModel):
        loaded = auto.from_pretrained(directory)
        assert isinstance(loaded, hf.GLM53FlashForCausalLM) and not loaded.training
        for (name, a), b in zip(loaded.model.state_dict().items(), model.state_dict().values()):
            assert torch.equal(a, b), name
    assert isinstance(AutoTokenizer.from_pretrained(directory), hf.GLM53FlashTokenizer)


def test_greedy_and_sampled_generate_equal_glm53_generate(checkpoint):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, model = checkpoint
    loaded = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    stopped = 0
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        assert ids[0].tolist() == ByteTokenizer().encode(prompt, bos=True)
        new = loaded.generate(ids, max_new_tokens=16)[0, ids.shape[1]:].tolist()
        ours = generate(model, [prompt], samples=1, max_new_tokens=16, temperature=0.0, stop="eos")[0][0]
        stopped += ours.finish_reason == "eos"
        assert new == list(ours.token_ids), prompt  # EOS included where the row stopped at it
        for seed in (0, 3):
            sampled = loaded.generate(ids, do_sample=True, max_new_tokens=16, temperature=0.9, seed=seed)
            ours = generate(model, [prompt], samples=1, max_new_tokens=16, temperature=0.9, seed=seed, stop="eos")[0][0]
            assert sampled[0, ids.shape[1]:ids.shape[1] + len(ours.token_ids)].tolist() == list(ours.token_ids)
    assert 0 < stopped < len(PROMPTS)  # both ways a row ends were compared
    assert tokenizer.decode(tokenizer("é ü").input_ids, skip_special_tokens=True) == "é ü"


def test_the_forward_takes_labels_and_refuses_padding(checkpoint):
    from transformers import AutoModelForCausalLM

    directory, model = checkpoint
    loaded = AutoModelForCausalLM.from_pretrained(directory)
    ids = torch.tensor([ByteTokenizer().encode("def f(x):\n    return x", bos=True)])
    out = loaded(ids, labels=ids)
    logits = model(ids).logits
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    assert torch.allclose(out.loss, expected) and torch.equal(out.logits, logits)
    with pytest.raises(ValueError, match="takes no attention mask"):
        loaded(ids, attention_mask=torch.tensor([[0] + [1] * (ids.shape[1] - 1)]))


def test_configs_without_the_conventional_keys_and_configs_written_by_transformers_load(checkpoint, tmp_path):
    directory, model = checkpoint
    own_names = model.config.to_dict()  # a config.json written before the conventional keys existed
    assert hf.GLM53FlashConfig(**own_names).model_config() == model.config
    written = tmp_path / "by-transformers"
    hf.GLM53FlashConfig(**own_names).save_pretrained(written)  # Transformers' own writer: conventional names only
    document = json.loads((written / "config.json").read_text())
    assert all(ours not in document for ours in CONVENTIONAL_KEYS) and "top_k" not in document
    assert load_config(written) == model.config
    clash = dict(json.loads((directory / "config.json").read_text()), hidden_size=model.config.dim + 8)
    (tmp_path / "clash").mkdir()
    (tmp_path / "clash" / "config.json").write_text(json.dumps(clash))
    with pytest.raises(ValueError, match="two values for one size: hidden_size"):
        load_config(tmp_path / "clash")



def test_from_pretrained_places_and_casts_as_transformers_users_ask(checkpoint):
    from transformers import AutoModelForCausalLM

    directory, _ = checkpoint
    loaded = AutoModelForCausalLM.from_pretrained(directory, device_map="auto", dtype=torch.bfloat16)
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16} and not loaded.training
    with pytest.raises(ValueError, match="loads onto one device"):
        AutoModelForCausalLM.from_pretrained(directory, device_map={"": "cpu", "model.blocks.0": "cpu"})
