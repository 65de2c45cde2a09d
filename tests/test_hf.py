"""Hugging Face Transformers interop (glm53_flash/hf.py), tested the way its clients call it: a checkpoint
directory loads through the Auto classes in a clean interpreter with trust_remote_code=True (and after
`import glm53_flash.hf` without it); generate() is Transformers' own loop with a real cache, cached and
uncached greedy equal `glm53 generate` token for token; its options (num_return_sequences, min_p,
repetition penalty, streamers, GenerationConfig, beam search) work and what cannot work is one line;
save_pretrained round-trips through ours and the Auto classes, TRL's checkpoints included. Skipped where
the optional `hf` extra (transformers) is not installed; .ci/run installs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the optional hf extra is not installed "
                                                          "(pip install 'glm53_flash[hf]')")

import glm53_flash.hf as hf  # noqa: E402 - registers the Auto classes
from glm53_flash import GLM53Flash, ModelConfig  # noqa: E402
from glm53_flash.data.tokenizer import ByteTokenizer  # noqa: E402
from glm53_flash.evaluation.sampling import SamplingSettings, generate  # noqa: E402
from glm53_flash.model.pretrained import (  # noqa: E402
    AUTO_MAP, CODE_FILES, CONVENTIONAL_KEYS, code_module, load_config, read_metadata, save_pretrained,
)

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


@pytest.fixture(scope="module")
def loaded(checkpoint):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(checkpoint[0])


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint[0])


def ours_greedy(model, prompt: str, tokens: int) -> list[int]:
    return list(generate(model, [prompt], SamplingSettings(samples=1, max_new_tokens=tokens, temperature=0.0,
                                                     stop="eos"))[0][0].token_ids)


# ----------------------------------------------------------------------------------- loading anywhere


def test_the_registered_auto_classes_load_a_checkpoint_directory(checkpoint):
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
        assert loaded.config._name_or_path == str(directory)
        for (name, a), b in zip(loaded.model.state_dict().items(), model.state_dict().values()):
            assert torch.equal(a, b), name
    assert isinstance(AutoTokenizer.from_pretrained(directory), hf.GLM53FlashTokenizer)


def test_a_checkpoint_carries_the_remote_code_layout_and_the_tokenizer_files(checkpoint):
    directory, model = checkpoint
    document = json.loads((directory / "config.json").read_text())
    assert document["auto_map"] == AUTO_MAP and document["architectures"] == ["GLM53FlashForCausalLM"]
    for name, class_name in CODE_FILES.items():
        assert (directory / name).read_text() == code_module(class_name)
        assert name in read_metadata(directory)["files"]  # the code is hashed like the weights
    tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    assert tokenizer_config["auto_map"] == {"AutoTokenizer": AUTO_MAP["AutoTokenizer"]}
    assert (tokenizer_config["padding_side"], tokenizer_config["model_max_length"]) == (
        "left", model.config.max_sequence_length)
    assert json.loads((directory / "special_tokens_map.json").read_text())["eos_token"] == "<eos>"
    assert json.loads((directory / "generation_config.json").read_text())["suppress_tokens"] == [0, 1, 3]


CLEAN_LOAD = textwrap.dedent("""
    import json, sys
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    path = sys.argv[1]
    refused = ""
    try:
        AutoModelForCausalLM.from_pretrained(path)
    except Exception as error:
        refused = str(error)
    assert "glm53_flash" not in sys.modules  # nothing of ours was imported by hand
    config = AutoConfig.from_pretrained(path, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    ids = tokenizer(["def f(x):", "# a longer prompt"], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**ids).logits
    print(json.dumps({"config": type(config).__name__, "model": type(model).__name__, "tokenizer": type(tokenizer).__name__,
                      "padding_side": tokenizer.padding_side, "ids": ids.input_ids.tolist(),
                      "mask": ids.attention_mask.tolist(), "logits": logits.tolist(), "refused": refused,
                      "specials": tokenizer.decode([1, 2, 3, 0], skip_special_tokens=False),
                      "generated": model.generate(**ids, max_new_tokens=6).tolist()}))
""")


@pytest.mark.slow
def test_a_clean_interpreter_loads_a_fresh_checkpoint_with_trust_remote_code(tmp_path):
    """A Python that never imported glm53_flash: the Auto classes load a fresh checkpoint from the code it
    carries (trust_remote_code=True), logits equal ours bit for bit; without the flag Transformers refuses."""
    torch.manual_seed(3)
    model = GLM53Flash(ModelConfig.preset("tiny")).eval()
    directory = tmp_path / "fresh"
    model.save_pretrained(directory)
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-c", CLEAN_LOAD, str(directory)], capture_output=True, text=True,
                            env=env, cwd=tmp_path, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout[result.stdout.index('{"config"'):])  # after Transformers' [y/N] question
    assert (seen["config"], seen["model"], seen["tokenizer"]) == (
        "GLM53FlashConfig", "GLM53FlashForCausalLM", "GLM53FlashTokenizer")
    assert "trust_remote_code" in seen["refused"] and seen["padding_side"] == "left"
    assert seen["specials"] == "<bos><eos><sep><pad>"
    encoded = [ByteTokenizer().encode(text, bos=True) for text in ("def f(x):", "# a longer prompt")]
    assert seen["ids"][1] == encoded[1] and seen["ids"][0][-len(encoded[0]):] == encoded[0]  # left padding
    with torch.no_grad():
        for row, ids in enumerate(encoded):
            ours = model(torch.tensor([ids])).logits[0]
            theirs = torch.tensor(seen["logits"][row])[-len(ids):]
            assert torch.equal(theirs, ours)
            assert seen["generated"][row][-6:] == ours_greedy(model, ("def f(x):", "# a longer prompt")[row], 6)[:6]


def test_the_remote_code_without_the_package_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "glm53_flash.hf", None)  # what a Python without the package meets
    with pytest.raises(ImportError) as refused:
        exec(compile(code_module("GLM53FlashForCausalLM"), "modeling_glm53_flash.py", "exec"), {})
    message = str(refused.value)
    assert "\n" not in message and "pip install 'glm53_flash[hf]'" in message


def test_the_tokenizer_names_its_special_tokens_pads_left_and_takes_keyword_arguments(checkpoint, tokenizer):
    from transformers import AutoTokenizer

    assert tokenizer.decode([1, 2], skip_special_tokens=False) == "<bos><eos>"
    assert tokenizer.decode([1, 108, 2, 109], skip_special_tokens=False) == "<bos>h<eos>i"
    assert tokenizer.decode([1, 108, 2, 109], skip_special_tokens=True) == "hi"
    for text in (*PROMPTS, "<eos> is text", "\x00\n\t"):  # text is its bytes, whatever it spells
        assert tokenizer(text).input_ids == ByteTokenizer().encode(text, bos=True)
        assert tokenizer.decode(tokenizer(text).input_ids, skip_special_tokens=True) == text
    assert tokenizer.padding_side == "left" and tokenizer.model_max_length == 192
    batch = tokenizer(["ab", "abcd"], padding=True).input_ids
    assert batch == [[0, 0, 1, 101, 102], [1, 101, 102, 103, 104]]
    right = AutoTokenizer.from_pretrained(checkpoint[0], padding_side="right", add_bos_token=False)
    assert right.padding_side == "right" and right(["ab", "abcd"], padding=True).input_ids == [
        [101, 102, 0, 0], [101, 102, 103, 104]]


# ----------------------------------------------------------------------------------- generation


@pytest.mark.slow
def test_cached_and_uncached_greedy_generate_equal_glm53_generate(checkpoint, loaded, tokenizer):
    """One prompt at a time and a left-padded batch, with and without the cache: the tokens of
    `glm53 generate --stop eos` (EOS included where the row stopped, PAD after it in a batch)."""
    _, model = checkpoint
    stopped = 0
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        ours = ours_greedy(model, prompt, 16)
        stopped += ours[-1] == ByteTokenizer.eos_id
        for use_cache in (True, False):
            assert loaded.generate(ids, max_new_tokens=16, use_cache=use_cache)[0, ids.shape[1]:].tolist() == ours
    assert 0 < stopped < len(PROMPTS)  # both ways a row ends were compared
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    cached = loaded.generate(**batch, max_new_tokens=12)
    assert torch.equal(cached, loaded.generate(**batch, max_new_tokens=12, use_cache=False))
    for row, prompt in enumerate(PROMPTS):
        ours = ours_greedy(model, prompt, 12)
        new = cached[row, batch.input_ids.shape[1]:].tolist()
        assert new[:len(ours)] == ours and all(t == 0 for t in new[len(ours):]), prompt


def test_the_forward_returns_a_transformers_cache_that_it_reads_back(checkpoint, loaded):
    from transformers.cache_utils import Cache

    _, model = checkpoint
    ids = torch.tensor([ByteTokenizer().encode("def f(x):\n    return", bos=True)])
    with torch.no_grad():
        first = loaded(ids[:, :-3], use_cache=True)
        assert isinstance(first.cache, hf.GLM53FlashCache) and isinstance(first.cache, Cache)
        assert first.cache.get_seq_length() == ids.shape[1] - 3
        step = loaded(ids[:, -3:], cache=first.cache)
        full = model(ids).logits
    assert step.cache is first.cache and first.cache.get_seq_length() == ids.shape[1]
    torch.testing.assert_close(step.logits[0], full[0, -3:], rtol=1e-5, atol=1e-5)
    assert loaded(ids, logits_to_keep=1).logits.shape == (1, 1, model.config.vocab_size)


def test_transformers_generation_options_work_with_the_cache(loaded, tokenizer):
    from transformers import GenerationConfig
    from transformers.generation.streamers import BaseStreamer

    ids = tokenizer(PROMPTS[1], return_tensors="pt").input_ids
    torch.manual_seed(11)
    sampled = loaded.generate(ids, do_sample=True, num_return_sequences=4, max_new_tokens=10, min_p=0.05,
                              temperature=1.3, top_k=50)
    assert sampled.shape[0] == 4 and len({tuple(row.tolist()) for row in sampled}) > 1
    torch.manual_seed(11)  # torch's global generator decides, as Transformers' sampling always does
    assert torch.equal(loaded.generate(ids, do_sample=True, num_return_sequences=4, max_new_tokens=10, min_p=0.05,
                                       temperature=1.3, top_k=50), sampled)
    drawn = [t for row in sampled[:, ids.shape[1]:].tolist() for t in (row[:row.index(2)] if 2 in row else row)]
    assert not set(drawn) & {0, 1, 3}  # PAD, BOS, SEP never drawn (a row that stopped at EOS is padded after it)
    for options in ({"repetition_penalty": 1.5}, {"num_beams": 3}, {"num_beams": 2, "num_return_sequences": 2},
                    {"no_repeat_ngram_size": 2}):
        cached = loaded.generate(ids, max_new_tokens=10, **options)
        assert torch.equal(cached, loaded.generate(ids, max_new_tokens=10, use_cache=False, **options)), options
    config = GenerationConfig(max_new_tokens=7, do_sample=False, repetition_penalty=1.5, eos_token_id=2,
                              suppress_tokens=[0, 1, 3])
    assert torch.equal(loaded.generate(ids, generation_config=config), loaded.generate(ids, max_new_tokens=7,
                                                                                       repetition_penalty=1.5))

    class Collect(BaseStreamer):
        def __init__(self):
            self.chunks = []

        def put(self, value):
            self.chunks.append(value.flatten().tolist())

        def end(self):
            self.chunks.append("end")

    streamer = Collect()
    out = loaded.generate(ids, max_new_tokens=8, streamer=streamer)
    assert streamer.chunks[0] == ids[0].tolist() and streamer.chunks[-1] == "end"
    assert [t for chunk in streamer.chunks[1:-1] for t in chunk] == out[0, ids.shape[1]:].tolist()


def test_what_the_model_cannot_do_is_one_line(loaded, tokenizer):
    from transformers import DynamicCache

    ids = tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    for options, error, words in (({"seed": 3}, TypeError, "takes no seed"),
                                  ({"prompt_lookup_num_tokens": 2}, ValueError, "cannot be rolled back"),
                                  ({"assistant_model": loaded}, ValueError, "cannot be rolled back")):
        with pytest.raises(error, match=words) as refused:
            loaded.generate(ids, max_new_tokens=4, **options)
        assert "\n" not in str(refused.value)
    with pytest.raises(TypeError, match="reads its own cache"):
        loaded(ids, cache=DynamicCache())
    with pytest.raises(TypeError, match="does not take surprise"):
        loaded(ids, surprise=1)
    right = tokenizer(["a", "abc"], return_tensors="pt", padding=True, padding_side="right")
    with pytest.raises(ValueError, match="left padding"):
        loaded(**right, use_cache=True)
    with pytest.raises(ValueError, match="cannot be cropped"):
        loaded(ids, use_cache=True).cache.crop(1)


# ----------------------------------------------------------------------------------- round trips


def test_save_pretrained_round_trips_through_ours_and_the_auto_classes(checkpoint, loaded, tmp_path):
    from transformers import AutoModelForCausalLM

    _, model = checkpoint
    ids = torch.tensor([ByteTokenizer().encode("def h(y):", bos=True)])
    existing = tmp_path / "trainer-made"
    existing.mkdir()  # a trainer makes its checkpoint directory before it saves into it
    for directory in (tmp_path / "new", existing):
        loaded.save_pretrained(directory)
        meta = read_metadata(directory)
        assert meta["stage"] == "saved_by_transformers" and meta["loaded_sha256"]
        with torch.no_grad():
            for again in (GLM53Flash.from_pretrained(directory), AutoModelForCausalLM.from_pretrained(directory).model,
                          AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True).model):
                assert torch.equal(again(ids).logits, model(ids).logits)
    card = (tmp_path / "new" / "README.md").read_text()
    assert card.startswith("---\nlicense: mit\nlibrary_name: transformers\npipeline_tag: text-generation\n")
    assert "| loaded from |" in card


def test_the_model_card_carries_the_hub_metadata_header(checkpoint):
    header = (checkpoint[0] / "README.md").read_text().split("---\n")[1]
    assert {"license: mit", "library_name: transformers", "pipeline_tag: text-generation"} <= set(header.splitlines())


def test_the_auto_classes_refuse_a_hostile_checkpoint_before_building_anything(checkpoint, tmp_path, monkeypatch):
    """A config.json whose RoPE tables alone would take 36 GiB (a kilobyte checkpoint): AutoConfig and
    AutoModelForCausalLM refuse it in one line, as the project's loader does (tests/test_corrupt_inputs.py),
    before any model is built."""
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = tmp_path / "hostile"
    directory.mkdir()
    document = json.loads((checkpoint[0] / "config.json").read_text())
    document.update(dim=2048, hidden_size=2048, heads=1, num_attention_heads=1, max_sequence_length=1 << 20,
                    max_position_embeddings=1 << 20)
    (directory / "config.json").write_text(json.dumps(document))
    monkeypatch.setattr(GLM53Flash, "__init__", lambda *a, **k: pytest.fail("a model was built"))
    for load in (AutoConfig.from_pretrained, AutoModelForCausalLM.from_pretrained,
                 lambda path: AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)):
        with pytest.raises(ValueError, match="RoPE tables") as refused:
            load(directory)
        assert "\n" not in str(refused.value)


def test_from_pretrained_places_and_casts_as_transformers_users_ask(checkpoint):
    from transformers import AutoModelForCausalLM

    directory, _ = checkpoint
    loaded = AutoModelForCausalLM.from_pretrained(directory, device_map="auto", dtype=torch.bfloat16)
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16} and not loaded.training
    for device_map in ({"": "cpu"}, "cpu", torch.device("cpu"), {"model.embedding": "cpu", "model.blocks": "cpu"}):
        placed = AutoModelForCausalLM.from_pretrained(directory, device_map=device_map, dtype="auto", revision="main")
        assert {p.device.type for p in placed.parameters()} == {"cpu"}
        assert {p.dtype for p in placed.parameters()} == {torch.float32}
    with pytest.raises(ValueError, match="loads onto one device"):
        AutoModelForCausalLM.from_pretrained(directory, device_map={"": "cpu", "model.blocks.0": "cuda:0"})
    with pytest.raises(ValueError, match="revision"):
        AutoModelForCausalLM.from_pretrained(directory, revision="v2")


def test_resize_token_embeddings_grows_the_tied_embedding_and_head(checkpoint):
    from transformers import AutoModelForCausalLM

    directory, model = checkpoint
    resized = AutoModelForCausalLM.from_pretrained(directory)
    embedding = resized.resize_token_embeddings(264)
    assert embedding.num_embeddings == 264 and resized.get_output_embeddings().weight is embedding.weight
    assert resized.config.vocab_size == 264 and resized.model.config.vocab_size == 264
    ids = torch.tensor([[1, 263, 104]])
    with torch.no_grad():
        logits = resized(ids).logits
    assert logits.shape == (1, 3, 264)
    assert torch.equal(embedding.weight[:260], model.embedding.weight)
    resized.set_input_embeddings(torch.nn.Embedding(270, model.config.dim))
    assert resized(ids).logits.shape[-1] == 270
    with pytest.raises(ValueError, match="tied"):
        resized.set_output_embeddings(torch.nn.Linear(model.config.dim, 270, bias=False))


# ----------------------------------------------------------------------------------- forward and TRL


def test_the_forward_takes_labels(checkpoint, loaded):
    _, model = checkpoint
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


def test_a_padded_batch_gives_every_row_what_it_gives_alone(checkpoint, loaded):
    """Left padding (batched prompts) and right padding (completions), as TRL pads them: each row's
    logits at its own positions equal that row run alone (to float32 rounding: a batch of other shapes
    sums in another order); padded positions are zeros; padding inside a row and an all-padding batch
    are refused."""
    _, model = checkpoint
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


def need_trl():
    return pytest.importorskip("trl", reason="TRL is not installed (pip install 'glm53_flash[trl]')")


@pytest.mark.slow
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


@pytest.mark.slow
def test_one_grpo_step_with_trl_on_the_verifier_reward_saves_a_checkpoint_that_loads(checkpoint, tmp_path):
    """TRL's GRPOTrainer, as its users run it: our checkpoint through AutoModelForCausalLM, our
    tokenizer, our verifier as a reward function beside a second one, one optimiser step, and the
    checkpoint-1 it writes loads through ours and the Auto classes with the trained weights."""
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
                        save_strategy="steps", save_steps=1, report_to=[], use_cpu=True, bf16=False, seed=0,
                        beta=0.0, dataloader_num_workers=0, disable_tqdm=True, **no_checkpointing)
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
    saved = tmp_path / "grpo" / "checkpoint-1"
    ids = torch.tensor([ByteTokenizer().encode("def f(x):", bos=True)])
    with torch.no_grad():
        trained = policy.eval()(ids).logits
        for again in (GLM53Flash.from_pretrained(saved), AutoModelForCausalLM.from_pretrained(saved).model,
                      AutoModelForCausalLM.from_pretrained(saved, trust_remote_code=True).model):
            assert torch.equal(again(ids).logits, trained)
    assert AutoTokenizer.from_pretrained(saved, trust_remote_code=True).padding_side == "left"


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
