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


def test_the_forward_takes_labels(checkpoint):
    from transformers import AutoModelForCausalLM

    directory, model = checkpoint
    loaded = AutoModelForCausalLM.from_pretrained(directory)
    ids = torch.tensor([ByteTokenizer().encode("def f(x):\n    return x", bos=True)])
    out = loaded(ids, labels=ids)
    logits = model(ids).logits
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    assert torch.allclose(out.loss, expected) and torch.equal(out.logits, logits)


def padded_batch(texts: list[str], left: list[int], right: list[int]) -> tuple[torch.Tensor, torch.Tensor, list]:
    """Rows of BOS + bytes with the given padding before and after them, all one width."""
    encoded = [ByteTokenizer().encode(text, bos=True) for text in texts]
    width = max(a + len(e) + b for a, e, b in zip(left, encoded, right))
    ids, mask = [], []
    for a, e, b in zip(left, encoded, right):
        tail = width - a - len(e)
        ids.append([0] * a + e + [0] * tail)
        mask.append([0] * a + [1] * len(e) + [0] * tail)
    return torch.tensor(ids), torch.tensor(mask), encoded


def test_a_padded_batch_gives_every_row_what_it_gives_alone(checkpoint):
    """Left padding (batched prompts) and right padding (completions), as TRL pads them: each row's
    logits at its own positions equal that row run alone (to float32 rounding: a batch of other shapes
    sums in another order); padded positions are zeros; padding inside a row and an all-padding batch
    are refused."""
    from transformers import AutoModelForCausalLM

    directory, model = checkpoint
    loaded = AutoModelForCausalLM.from_pretrained(directory)
    texts = ["def f(x):", "# Return x plus one.\ndef g(x):", "x", "def h(x):"]
    ids, mask, encoded = padded_batch(texts, left=[5, 0, 12, 5], right=[0, 3, 1, 2])
    logits = loaded(ids, attention_mask=mask).logits
    for row, (text_ids, m) in enumerate(zip(encoded, mask)):
        alone = model(torch.tensor([text_ids])).logits[0]
        where = m.bool()
        start = int(where.int().argmax())
        assert torch.allclose(logits[row, where], alone, rtol=1e-5, atol=1e-5), texts[row]
        assert not logits[row, :start].any()  # the left padding itself
    # without the mask the padding would be read as tokens: the mask is what makes the rows agree
    unmasked = loaded(ids).logits
    assert not torch.allclose(unmasked[0, 5:5 + len(encoded[0])], logits[0, 5:5 + len(encoded[0])], atol=1e-3)
    with pytest.raises(ValueError, match="not inside a row"):
        loaded(ids, attention_mask=torch.tensor([[1, 0] + [1] * (ids.shape[1] - 2)] * ids.shape[0]))
    with pytest.raises(ValueError, match="nothing to compute"):
        loaded(ids, attention_mask=torch.zeros_like(ids))


def test_greedy_generate_of_a_left_padded_batch_equals_each_prompt_alone(checkpoint):
    from transformers import AutoModelForCausalLM

    directory, model = checkpoint
    loaded = AutoModelForCausalLM.from_pretrained(directory)
    ids, mask, encoded = padded_batch(PROMPTS, left=[0, 0, 0], right=[0, 0, 0])
    widths = [len(e) for e in encoded]  # left-pad to one width, as a batched generate is given them
    ids = torch.tensor([[0] * (max(widths) - len(e)) + e for e in encoded])
    mask = torch.tensor([[0] * (max(widths) - len(e)) + [1] * len(e) for e in encoded])
    batched = loaded.generate(inputs=ids, attention_mask=mask, max_new_tokens=12)  # Transformers' own keyword
    for row, prompt in enumerate(PROMPTS):
        ours = generate(model, [prompt], samples=1, max_new_tokens=12, temperature=0.0, stop="eos")[0][0]
        new = batched[row, ids.shape[1]:].tolist()
        assert new[:len(ours.token_ids)] == list(ours.token_ids), prompt
        assert all(t == 0 for t in new[len(ours.token_ids):])  # a row that stopped is padded after its EOS


def test_sampled_generate_gives_copies_of_a_prompt_distinct_samples(checkpoint):
    """GRPO hands generate() each prompt G times: the copies are the prompt's samples 0..G-1 (ours,
    keyed by seed), and without a seed torch's global generator picks one, so two calls differ."""
    from transformers import AutoModelForCausalLM

    directory, model = checkpoint
    loaded = AutoModelForCausalLM.from_pretrained(directory)
    prompt = PROMPTS[1]
    ids = torch.tensor([ByteTokenizer().encode(prompt, bos=True)] * 4)
    out = loaded.generate(ids, do_sample=True, max_new_tokens=12, temperature=1.0, seed=5)
    ours = generate(model, [prompt], samples=4, max_new_tokens=12, temperature=1.0, seed=5, stop="eos")[0]
    for row, completion in enumerate(ours):
        assert out[row, ids.shape[1]:ids.shape[1] + len(completion.token_ids)].tolist() == list(completion.token_ids)
    assert len({tuple(c.token_ids) for c in ours}) > 1
    torch.manual_seed(1)
    first = loaded.generate(ids[:1], do_sample=True, max_new_tokens=12)
    torch.manual_seed(1)
    assert torch.equal(loaded.generate(ids[:1], do_sample=True, max_new_tokens=12), first)
    assert not torch.equal(loaded.generate(ids[:1], do_sample=True, max_new_tokens=12, seed=2),
                           loaded.generate(ids[:1], do_sample=True, max_new_tokens=12, seed=3))
    with pytest.raises(ValueError, match="BOS"):
        loaded.generate(ids[:, 1:], do_sample=True, max_new_tokens=4, seed=0)  # no BOS: not what we trained on


def need_trl():
    return pytest.importorskip("trl", reason="TRL is not installed (pip install 'glm53_flash[hf]')")


def test_trl_fused_log_probabilities_equal_ours_on_a_padded_batch(checkpoint):
    """TRL scores completions with its fused head over `base_model` and `get_output_embeddings()`:
    on a left- and right-padded batch its per-token log-probabilities equal log_softmax of our logits."""
    need_trl()
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    directory, model = checkpoint
    loaded = AutoModelForCausalLM.from_pretrained(directory)
    add_fused_lm_head(loaded, outputs=("log_probs", "entropy"))
    ids, mask, encoded = padded_batch(PROMPTS, left=[4, 0, 2], right=[0, 3, 1])
    labels = ids.masked_fill(mask == 0, -100)
    labels[torch.arange(len(encoded)), mask.argmax(dim=1)] = -100  # a row's BOS has nothing before it to predict it
    out = loaded(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    for row, text_ids in enumerate(encoded):
        ours = torch.log_softmax(model(torch.tensor([text_ids])).logits[0].float(), dim=-1)
        expected = ours[:-1].gather(1, torch.tensor(text_ids[1:])[:, None])[:, 0]
        scored = out.log_probs[row][labels[row, 1:] != -100]  # position t scores the label at t + 1
        assert torch.allclose(scored, expected, atol=1e-5), PROMPTS[row]


def test_one_grpo_step_with_trl_on_the_verifier_reward(checkpoint, tmp_path):
    """TRL's GRPOTrainer, as its users run it: our checkpoint through AutoModelForCausalLM, our
    tokenizer, our verifier as a reward function beside a second one, one optimiser step."""
    need_trl()
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from glm53_flash.train.trl_reward import VerifierReward, training_dataset

    directory, _ = checkpoint
    policy = AutoModelForCausalLM.from_pretrained(directory).train()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    rows = [row for row in training_dataset() if row["task_id"].startswith("rl-double-")][:2]
    verifier = VerifierReward(mode="binary", workers=1)
    seen = []

    def length_reward(completions, **columns):  # a second signal, so the untrained policy's group varies
        seen.extend(completions)
        return [min(len(c), 12) / 12 for c in completions]

    # the model has no activation checkpointing (Transformers 5 names the switch so; 4.x gradient_...)
    no_checkpointing = ({"activation_checkpointing": False} if "activation_checkpointing" in GRPOConfig.__dataclass_fields__
                        else {"gradient_checkpointing": False})
    config = GRPOConfig(output_dir=str(tmp_path / "grpo"), per_device_train_batch_size=4, num_generations=4,
                        max_steps=1, max_completion_length=12, learning_rate=1e-2, logging_steps=1,
                        save_strategy="no", report_to=[], use_cpu=True, bf16=False, seed=0, beta=0.0,
                        dataloader_num_workers=0, disable_tqdm=True, **no_checkpointing)
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    try:
        trainer = GRPOTrainer(model=policy, reward_funcs=[verifier, length_reward], args=config,
                              train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
        trainer.train()
    finally:
        verifier.close()
    assert trainer.state.global_step == 1
    logged = {k: v for entry in trainer.state.log_history for k, v in entry.items()}
    assert 0.0 <= logged["rewards/glm53_verifier_binary/mean"] <= 1.0  # our reward ran, under its name
    assert len(seen) == 4 and len(set(seen)) > 1  # four sampled completions of one prompt, not four copies
    changed = [name for name, p in policy.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert changed, "the GRPO step changed no weight"


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
