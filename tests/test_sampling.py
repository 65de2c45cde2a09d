"""Batched cached generation against a plain reference (one prompt, full re-forward per token)."""

from __future__ import annotations

import math

import pytest
import torch

from glm53_flash import ByteTokenizer

from glm53_flash import GLM53Flash

from glm53_flash import ModelConfig
from glm53_flash.model import ModelCache, ModelOutput
from glm53_flash.evaluation.sampling import (
    Completion,
    SamplingSettings,
    generate,
    gumbel_noise,
    sampling_logits,
    stream_generate,
    stream_seed,
)
from glm53_flash.evaluation.evaluate import generate_for_tasks
from glm53_flash.evaluation.stop import ParseStop
from glm53_flash.tasks import frozen_tasks
from glm53_flash.verifier import completion_is_parseable

TOK = ByteTokenizer()
EOS = ByteTokenizer.eos_id


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(7)
    # A larger init than the default makes the random model's distributions less flat, so greedy
    # choices have clear margins and sampled rows sometimes emit EOS.
    return GLM53Flash(ModelConfig.preset("tiny", init_std=0.08)).eval()


PROMPTS = ["def f(x):", "# Return x plus one.\ndef g(x):", "ab", "def long_name_here(values):"]


# --------------------------------------------------------------------------- the plain reference


def _reference_scores(logits: torch.Tensor, temperature: float, top_k, top_p, stop: str) -> torch.Tensor:
    """Sampling-distribution logits [V] written out plainly, in float64."""
    z = logits.double().clone()
    banned = [0, 1, 3] + ([EOS] if stop == "none" else [])
    z[banned] = -math.inf
    if temperature == 0:
        return z
    z = z / temperature
    if top_k is not None:
        ranked = sorted(range(len(z)), key=lambda i: -z[i].item())
        threshold = z[ranked[top_k - 1]].item()
        z = torch.where(z < threshold, torch.tensor(-math.inf, dtype=z.dtype), z)
    if top_p is not None:
        probs = torch.softmax(z, -1)
        ranked = sorted(range(len(z)), key=lambda i: -probs[i].item())
        keep, mass = [], 0.0
        for i in ranked:
            if mass >= top_p:
                break
            keep.append(i)
            mass += probs[i].item()
        kept = torch.full_like(z, -math.inf)
        kept[keep] = z[keep]
        z = kept
    return z


def reference_generate(model, prompt, *, max_new_tokens, temperature=0.0, top_k=None, top_p=None, seed=0,
                       key=None, sample=0, stop="eos", task=None):
    """The original's loop for one row: full forward over the whole sequence for every new token,
    the parse rule checked after every token; sampling by Gumbel-max with the row's own stream."""
    ids = TOK.encode(prompt, bos=True)
    noise = None
    if temperature > 0:
        noise = gumbel_noise(seed, prompt if key is None else key, sample, max_new_tokens,
                             model.config.vocab_size).double()
    tokens, logprobs = [], []
    with torch.no_grad():
        for step in range(max_new_tokens):
            logits = model(torch.tensor([ids + tokens])).logits[0, -1]
            scores = _reference_scores(logits, temperature, top_k, top_p, stop)
            choice = int((scores + noise[step]).argmax() if noise is not None else scores.argmax())
            tokens.append(choice)
            logprobs.append(float(torch.log_softmax(scores, -1)[choice]))
            if choice == EOS and stop != "none":
                break
            if stop == "parse" and completion_is_parseable(task, TOK.decode(tokens)):
                break
    return tokens, logprobs


def _assert_same(completion: Completion, tokens, logprobs, max_new_tokens):
    assert list(completion.token_ids) == tokens
    assert completion.logprobs == pytest.approx(logprobs, abs=1e-4)
    assert completion.text == TOK.decode(tokens)
    assert completion.hit_cap == (len(tokens) == max_new_tokens and tokens[-1] != EOS)


# --------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize("batch_rows", [512, 2])
def test_greedy_cached_equals_full_reforward_token_for_token(model, batch_rows):
    out = generate(model, PROMPTS, SamplingSettings(max_new_tokens=20, batch_rows=batch_rows))
    for prompt, (completion,) in zip(PROMPTS, out):
        tokens, logprobs = reference_generate(model, prompt, max_new_tokens=20)
        _assert_same(completion, tokens, logprobs, 20)


@pytest.mark.slow
def test_sampled_cached_equals_reference_including_finished_rows(model):
    samples, max_new = 5, 24
    out = generate(model, PROMPTS, SamplingSettings(samples=samples, max_new_tokens=max_new, temperature=1.3, seed=11))
    reasons = [c.finish_reason for row in out for c in row]
    # The comparison must cover rows that left the batch early (EOS) and rows that ran to the cap.
    assert "eos" in reasons and "cap" in reasons
    for prompt, row in zip(PROMPTS, out):
        for i, completion in enumerate(row):
            tokens, logprobs = reference_generate(model, prompt, max_new_tokens=max_new, temperature=1.3, seed=11,
                                                  sample=i)
            _assert_same(completion, tokens, logprobs, max_new)
            assert completion.finish_reason == ("eos" if tokens[-1] == EOS else "cap")


def test_top_k_top_p_sampling_equals_reference(model):
    out = generate(model, PROMPTS[:2], SamplingSettings(samples=3, max_new_tokens=12, temperature=0.8, top_k=40, top_p=0.6,
                                                  seed=3, keys=["a", "b"]))
    for prompt, key, row in zip(PROMPTS, ["a", "b"], out):
        for i, completion in enumerate(row):
            tokens, logprobs = reference_generate(model, prompt, max_new_tokens=12, temperature=0.8, top_k=40,
                                                  top_p=0.6, seed=3, key=key, sample=i)
            _assert_same(completion, tokens, logprobs, 12)


def test_stop_none_masks_eos_and_runs_every_row_to_the_cap(model):
    out = generate(model, PROMPTS, SamplingSettings(samples=4, max_new_tokens=24, temperature=1.3, seed=11, stop="none"))
    for prompt, row in zip(PROMPTS, out):
        for i, completion in enumerate(row):
            assert len(completion.token_ids) == 24 and EOS not in completion.token_ids
            assert completion.hit_cap and completion.finish_reason == "cap"
        tokens, logprobs = reference_generate(model, prompt, max_new_tokens=24, temperature=1.3, seed=11,
                                              sample=3, stop="none")
        _assert_same(row[3], tokens, logprobs, 24)


# --------------------------------------------------------------------------- seeding


def test_samples_do_not_depend_on_batch_composition(model):
    settings = SamplingSettings(samples=4, max_new_tokens=16, temperature=1.0, seed=5)
    alone = generate(model, [PROMPTS[1]], settings)[0]
    crowded = generate(model, [PROMPTS[0], PROMPTS[2], PROMPTS[1], PROMPTS[3]], settings)[2]
    split = generate(model, PROMPTS, settings.replace(batch_rows=3))[1]
    for a, b, c in zip(alone, crowded, split):
        assert a.token_ids == b.token_ids == c.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_samples_follow_the_key_not_the_position(model):
    settings = SamplingSettings(samples=2, max_new_tokens=8, temperature=1.0, seed=1)
    first = generate(model, ["xy"], settings.replace(keys=["task-a"]))[0]
    again = generate(model, ["ab", "xy"], settings.replace(keys=["task-b", "task-a"]))[1]
    other_key = generate(model, ["xy"], settings.replace(keys=["task-b"]))[0]
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert [c.token_ids for c in first] != [c.token_ids for c in other_key]


def test_reproducible_per_call_and_global_rng_untouched(model):
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = generate(model, PROMPTS, SamplingSettings(samples=3, max_new_tokens=10, temperature=1.0, seed=9))
    assert torch.equal(torch.get_rng_state(), state)  # no reseeding or drawing from the global RNG
    torch.manual_seed(456)
    second = generate(model, PROMPTS, SamplingSettings(samples=3, max_new_tokens=10, temperature=1.0, seed=9))
    other = generate(model, PROMPTS, SamplingSettings(samples=3, max_new_tokens=10, temperature=1.0, seed=10))
    ids = lambda out: [[c.token_ids for c in row] for row in out]  # noqa: E731
    assert ids(first) == ids(second)
    assert ids(first) != ids(other)
    # Samples of one prompt differ from each other (distinct streams).
    assert len({c.token_ids for c in first[0]}) == 3


def test_stream_seed_is_stable_and_distinct():
    assert stream_seed(0, "dev-double-000", 0) == stream_seed(0, "dev-double-000", 0)
    seeds = {stream_seed(s, k, i) for s in (0, 1) for k in ("a", "b") for i in range(4)}
    assert len(seeds) == 16
    assert all(0 <= s < 2**63 for s in seeds)


def test_gumbel_max_samples_the_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]])
    temperature = 0.7
    probs = torch.softmax(logits[0] / temperature, -1)
    counts = torch.zeros(5)
    draws = 6000
    for i in range(draws):
        z = sampling_logits(logits, temperature)
        counts[int((z[0] + gumbel_noise(1, "k", i, 1, 5)[0]).argmax())] += 1
    # 6000 draws: the standard error of each frequency is below 0.0065, so 0.025 is ~4 sigma.
    assert (counts / draws - probs).abs().max() < 0.025


def test_sampling_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    finite = lambda z: torch.isfinite(z[0]).tolist()  # noqa: E731
    assert finite(sampling_logits(logits, 1.0, top_k=2)) == [True, True, False, False, False]
    assert finite(sampling_logits(logits, 1.0, top_p=0.5)) == [True, False, False, False, False]
    assert finite(sampling_logits(logits, 1.0, top_p=0.7)) == [True, True, False, False, False]
    assert finite(sampling_logits(logits, 1.0, top_p=0.71)) == [True, True, True, False, False]
    assert finite(sampling_logits(logits, 1.0, top_k=3, top_p=1.0)) == [True, True, True, False, False]


# --------------------------------------------------------------------------- stop rules


class BigramModel(torch.nn.Module):
    """A test double with the model's interface whose next token depends only on the last one."""

    def __init__(self, successors: dict[str, str], fallback: str = "#") -> None:
        super().__init__()
        self.config = ModelConfig.preset("tiny", max_sequence_length=192)
        table = torch.full((260, 260), -20.0)
        table[:, TOK.encode(fallback)[0]] = 20.0
        for before, after in successors.items():
            nxt = EOS if after == "<eos>" else TOK.encode(after)[0]
            table[TOK.encode(before)[0]] = -20.0
            table[TOK.encode(before)[0], nxt] = 20.0
        self.table = torch.nn.Parameter(table, requires_grad=False)

    def new_cache(self, batch_size: int) -> ModelCache:
        return ModelCache(batch_size, self.config.max_sequence_length, 0, [])

    def forward(self, ids, cache=None):
        if cache is not None:
            cache.position += ids.shape[1]
        return ModelOutput(self.table[ids], torch.zeros(()), torch.zeros(1))


def test_parse_rule_stops_at_the_first_parseable_newline():
    model = BigramModel({":": "\n", "\n": " ", " ": "1", "1": "\n"})
    tasks = frozen_tasks("dev", 1, ("increment", "double", "reverse"))
    out = generate_for_tasks(model, tasks, max_new_tokens=20)
    for task, (completion,) in zip(tasks, out):
        # "\n" alone does not parse (no body); "\n 1\n" does, and ends with a newline.
        assert completion.text == "\n 1\n"
        assert completion.finish_reason == "parse" and not completion.hit_cap
        tokens, _ = reference_generate(model, task.prompt, max_new_tokens=20, stop="parse", task=task)
        assert list(completion.token_ids) == tokens
    eos_only = generate_for_tasks(model, tasks[:1], max_new_tokens=20, stop="eos")[0][0]
    assert eos_only.text == ("\n 1" * 7)[:20] and eos_only.hit_cap and eos_only.finish_reason == "cap"


def test_eos_ends_a_row_and_is_kept_in_token_ids_only():
    model = BigramModel({":": "\n", "\n": "z", "z": "<eos>"})
    tasks = frozen_tasks("dev", 1, ("increment",))
    completion = generate_for_tasks(model, tasks, max_new_tokens=10)[0][0]
    assert completion.token_ids == (TOK.encode("\n")[0], TOK.encode("z")[0], EOS)
    assert completion.text == "\nz" and completion.finish_reason == "eos" and not completion.hit_cap
    at_cap = generate_for_tasks(model, tasks, max_new_tokens=3)[0][0]
    assert at_cap.token_ids[-1] == EOS and not at_cap.hit_cap  # EOS exactly at the cap is not a cap hit


def test_progress_counts_every_row_once(model):
    seen = []
    generate(model, PROMPTS, SamplingSettings(samples=3, max_new_tokens=10, temperature=1.3, seed=2),
             progress=seen.append)
    assert sum(seen) == len(PROMPTS) * 3


def test_training_mode_is_restored(model):
    model.train()
    try:
        generate(model, ["ab"], SamplingSettings(max_new_tokens=2))
        assert model.training
    finally:
        model.eval()


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, message", [
    ({"prompts": []}, "non-empty list"),
    ({"prompts": "abc"}, "non-empty list"),
    ({"prompts": ["a", 3]}, "prompts[1]"),
    ({"samples": 0}, "samples"),
    ({"samples": 2}, "greedy"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_k": 5}, "only to sampling"),
    ({"temperature": 1.0, "top_k": 0}, "top_k"),
    ({"temperature": 1.0, "top_p": 0.0}, "top_p"),
    ({"stop": "newline"}, "stop must be one of"),
    ({"stop": "parse"}, "stop must be one of"),  # the task rule lives with the tasks (ParseStop)
    ({"keys": ["only-one"], "prompts": ["a", "b"]}, "keys"),
    ({"prompts": ["x" * 188]}, "max_sequence_length 192"),
    ({"batch_rows": 0}, "batch_rows"),
])
def test_bad_arguments_raise_clear_errors(model, kwargs, message):
    options = {"prompts": ["ab"], "max_new_tokens": 4, **kwargs}
    prompts = options.pop("prompts")
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        generate(model, prompts, SamplingSettings(**options))


# --------------------------------------------------------------------------- token-by-token streaming


@pytest.mark.parametrize("options", [
    {"temperature": 0.0},
    {"temperature": 0.9, "seed": 3},
    {"temperature": 1.3, "seed": 11, "top_k": 20, "top_p": 0.9, "key": "k"},
    {"temperature": 0.0, "stop": "none"},
])
def test_stream_generate_equals_generate(model, options):
    for prompt in PROMPTS:
        batch_options = {k: v for k, v in options.items() if k != "key"}
        if "key" in options:
            batch_options["keys"] = [options["key"]]
        steps = list(stream_generate(model, prompt, SamplingSettings(max_new_tokens=24, **batch_options)))
        (expected,), = generate(model, [prompt], SamplingSettings(max_new_tokens=24, **batch_options))
        assert [t for t, _ in steps] == list(expected.token_ids)
        assert all(c is None for _, c in steps[:-1])
        final = steps[-1][1]
        assert final == expected


def test_stream_generate_parse_rule_matches_generate_for_tasks():
    model = BigramModel({":": "\n", "\n": " ", " ": "1", "1": "\n"})
    task = frozen_tasks("dev", 1, ("double",))[0]
    steps = list(stream_generate(model, task.prompt, SamplingSettings(max_new_tokens=20, stop=ParseStop([task]),
                                                                      keys=[task.task_id])))
    (expected,), = generate_for_tasks(model, [task], max_new_tokens=20)
    assert steps[-1][1] == expected and expected.finish_reason == "parse"
    assert TOK.decode(t for t, _ in steps) == "\n 1\n"


def test_stream_generate_rejects_bad_arguments(model):
    with pytest.raises(ValueError, match="stop must be one of"):
        next(stream_generate(model, "def f(x):", SamplingSettings(stop="parse")))  # the sampler knows no task rule
    with pytest.raises(ValueError, match="is not the prompt of task"):
        next(stream_generate(model, "def f(x):", SamplingSettings(stop=ParseStop(frozen_tasks("dev", 1)[:1]))))
    with pytest.raises(ValueError, match="exceeds max_sequence_length"):
        next(stream_generate(model, "x" * 188, SamplingSettings(max_new_tokens=10)))


def test_the_sampler_imports_neither_tasks_nor_the_verifier():
    import ast
    from pathlib import Path

    import glm53_flash.evaluation.sampling as sampling

    tree = ast.parse(Path(sampling.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not {name for name in imported if name and ("tasks" in name or "verifier" in name)}, imported


def test_any_stop_predicate_ends_rows_and_names_the_reason(model):
    class TwoLetterA:
        name = "two-a"
        trigger_ids = None

        def __init__(self):
            self.asked = 0

        def __call__(self, prompt_index, text):
            self.asked += 1
            return text.count("a") >= 2

    rule = TwoLetterA()
    free = generate(model, ["hello"], SamplingSettings(max_new_tokens=30, stop="none"))[0][0]
    stopped = generate(model, ["hello"], SamplingSettings(max_new_tokens=30, stop=rule))[0][0]
    cut = next((i for i in range(1, len(free.text) + 1) if free.text[:i].count("a") >= 2), None)
    if cut is None or EOS in stopped.token_ids:
        assert stopped.finish_reason in ("eos", "cap")
    else:
        assert stopped.finish_reason == "two-a" and stopped.text == free.text[:cut]
    assert rule.asked >= 1


def test_generation_that_cannot_fit_in_memory_is_refused_before_any_forward(model, monkeypatch, tmp_path):
    """generate() (and so evaluation and RL rollouts) checks the largest chunk's estimated memory
    (ModelConfig.decode_bytes) plus the completions it keeps against the machine's free memory before
    any forward."""
    from glm53_flash.core import runtime

    cfg = model.config
    need = cfg.decode_bytes(8, len(ByteTokenizer().encode("def f(x):", bos=True)) + 4) + 8 * (16 * 4 + 512)
    assert cfg.decode_bytes(16, 40) > cfg.decode_bytes(8, 40) > cfg.decode_bytes(8, 20) > 4 * cfg.approximate_parameters()
    monkeypatch.setattr(runtime, "available_memory_bytes", lambda: need - 1)
    calls = []
    monkeypatch.setattr(type(model), "forward", lambda *a, **k: calls.append(1))
    with pytest.raises(ValueError, match=r"generating 8 completions, 8 rows at a time, needs about .* GiB, more than "
                                         r"the .* lower --batch-rows or the samples"):
        generate(model, ["def f(x):"], SamplingSettings(samples=8, max_new_tokens=4, temperature=1.0))
    assert calls == []
    monkeypatch.undo()
    assert len(generate(model, ["def f(x):"], SamplingSettings(samples=8, max_new_tokens=4, temperature=1.0))[0]) == 8
