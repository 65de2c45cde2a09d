"""Evaluation receipts: original-compatible keys, exact summaries, unbiased pass@k, seeding, the CLI."""

from __future__ import annotations

import itertools
import json
import random

import pytest
import torch

from glm53_flash import ByteTokenizer

from glm53_flash import GLM53Flash

from glm53_flash import ModelConfig
from glm53_flash.cli import main
from glm53_flash.evaluation.ledger import SealedSplitError, ledger_lines, read_ledger, require_open
from glm53_flash.core.receipts import sha256_file
from glm53_flash.evaluation.evaluate import (
    evaluate_greedy,
    evaluate_sampled,
    format_summary,
    greedy_receipt,
    sampled_receipt,
    task_batches,
    unbiased_pass_at_k,
)
from glm53_flash.model import ModelCache, ModelOutput
from glm53_flash.model.linear_attention import LinearState
from glm53_flash.evaluation.sampling import Completion
from glm53_flash.tasks import strong_task
from glm53_flash.tasks.families import _frozen_tasks as frozen_tasks  # the generator itself: sealed splits without an opening, for tests of the verifier and suites
from glm53_flash.train.checkpoint import save_checkpoint
from glm53_flash.verifier import Evaluation, Verifier

TOK = ByteTokenizer()

# Key lists of the original's receipts (seed-core 7.3 and 7.4); ours may add keys, never drop one.
GREEDY_TOP = {"schema_version", "status", "split", "checkpoint", "checkpoint_sha256", "inference", "summary",
              "by_family", "elapsed_seconds", "peak_vram_gib", "episodes"}
GREEDY_INFERENCE = {"greedy", "max_new_tokens", "seed", "families"}
GREEDY_SUMMARY = {"tasks_solved", "tasks_total", "pass_at_1", "tests_passed", "tests_total", "test_accuracy",
                  "valid_programs", "token_cap_hits"}
GREEDY_FAMILY = {"solved", "tasks", "tests_passed", "tests_total"}
GREEDY_EPISODE = {"task_id", "family", "prompt", "reference_completion", "generated_completion", "generated_tokens",
                  "hit_token_cap", "evaluation"}
EVALUATION = {"status", "passed", "tests_passed", "tests_total", "pass_fraction", "message"}
SAMPLED_INFERENCE = {"samples_per_task", "temperature", "max_new_tokens", "seed", "families"}
SAMPLED_SUMMARY = {"tasks_solved_at_k", "tasks_total", "pass_at_k", "exact_rollouts", "rollouts_total",
                   "exact_rollout_rate", "tests_passed", "tests_total", "test_accuracy", "valid_rollouts",
                   "token_cap_hits"}
SAMPLED_FAMILY = {"tasks_solved_at_k", "tasks", "exact_rollouts", "rollouts", "valid_rollouts"}
SAMPLED_EPISODE = {"task_id", "family", "prompt", "reference_completion", "solved_at_k", "samples"}
SAMPLE = {"sample", "completion", "token_ids", "tokens", "hit_token_cap", "evaluation"}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def verifier():
    with Verifier(workers=2) as v:
        yield v


@pytest.fixture(scope="module")
def tiny_model():
    # The tiny architecture with room for a task prompt (about 90 tokens) plus the completion.
    torch.manual_seed(3)
    return GLM53Flash(ModelConfig.preset("tiny", max_sequence_length=160)).eval()


class ScriptedModel(torch.nn.Module):
    """A test double that writes a fixed completion after each known prompt, then '#' forever.

    It keeps each row's token history in the cache (as a LinearState, so keep_rows carries it along
    when rows are dropped or copied), which lets the sampler's bookkeeping run unchanged.
    """

    def __init__(self, scripts: dict[str, str]) -> None:
        super().__init__()
        self.config = ModelConfig.preset("tiny", max_sequence_length=192)
        self.scripts = scripts
        self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)

    def new_cache(self, batch_size: int) -> ModelCache:
        empty = LinearState(torch.zeros(batch_size, 0), torch.zeros(batch_size, 1))
        return ModelCache(batch_size, self.config.max_sequence_length, 0, [empty])

    def forward(self, ids, cache=None):
        history = torch.cat([cache.layers[0].kv, ids.float()], dim=1)
        cache.layers[0] = LinearState(history, cache.layers[0].z)
        cache.position += ids.shape[1]
        logits = torch.full((ids.shape[0], ids.shape[1], 260), -30.0)
        for row, seen in enumerate(history.long().tolist()):
            text = TOK.decode(seen)
            script = next((p + c for p, c in self.scripts.items() if text.startswith(p)), "")
            nxt = script[len(text)] if len(text) < len(script) else "#"
            logits[row, -1, TOK.encode(nxt)[0]] = 30.0
        return ModelOutput(logits, torch.zeros(()), torch.zeros(1))


@pytest.fixture(scope="module")
def scripted():
    tasks = frozen_tasks("dev", 1, ("increment", "double", "reverse"))
    scripts = {
        tasks[0].prompt: tasks[0].reference_completion,  # "\n    return x + 1\n": solved, 18 tokens
        tasks[1].prompt: "\n    return x * 3\n",  # valid but wrong: 1 of 3 cases (0 -> 0)
        tasks[2].prompt: "\n    return text[::-1\n",  # never parses: runs to the cap, invalid
    }
    return ScriptedModel(scripts), tasks


def test_greedy_receipt_is_compatible_and_exact(scripted, verifier):
    model, tasks = scripted
    receipt = evaluate_greedy(model, tasks, verifier=verifier, checkpoint="ckpt", checkpoint_sha256="abc")
    assert GREEDY_TOP | {"pass_at_k", "timing", "provenance"} <= set(receipt)
    assert GREEDY_INFERENCE <= set(receipt["inference"])
    assert receipt["inference"]["families"] == ["increment", "double", "reverse"]
    assert receipt["status"] == "complete" and receipt["split"] == "dev" and receipt["schema_version"] == "1.0"
    assert receipt["checkpoint"] == "ckpt" and receipt["checkpoint_sha256"] == "abc"
    # strong sets: increment 58 cases (passed), double 59 (x * 3 is right only at 0), reverse 56 (invalid)
    assert receipt["summary"] == {"tasks_solved": 1, "tasks_total": 3, "pass_at_1": 1 / 3, "tests_passed": 4,
                                  "tests_total": 9, "test_accuracy": 4 / 9, "valid_programs": 2, "token_cap_hits": 1,
                                  "tasks_solved_strong": 1, "pass_at_1_strong": 1 / 3, "false_passes": 0,
                                  "strong_tests_passed": 59, "strong_tests_total": 173,
                                  "units": 3, "units_by_kind": {"seen": 3}}
    assert [e["unit"] for e in receipt["episodes"]] == [t.unit for t in tasks]
    assert receipt["by_kind"] == {"seen": {"tasks": 3, "units": 3, "solved": 1, "solved_strong": 1}}
    assert receipt["pass_at_k"] == {"1": 1 / 3} and receipt["pass_at_k_strong"] == {"1": 1 / 3}
    assert receipt["inference"]["strong_tests"]["cases_per_task"] == {"increment": 58, "double": 59, "reverse": 56}
    assert receipt["sealed_opening"] is None
    assert receipt["by_family"]["double"] == {"solved": 0, "tasks": 1, "tests_passed": 1, "tests_total": 3,
                                              "solved_strong": 0, "false_passes": 0}
    assert list(receipt["by_family"]) == ["increment", "double", "reverse"]
    increment, double, reverse = receipt["episodes"]
    for episode in receipt["episodes"]:
        assert GREEDY_EPISODE <= set(episode) and EVALUATION <= set(episode["evaluation"])
    # The original's stop rule: the reference body ends generation after 18 tokens, without EOS.
    assert increment["generated_completion"] == tasks[0].reference_completion
    assert increment["generated_tokens"] == 18 and not increment["hit_token_cap"]
    assert increment["evaluation"]["status"] == "passed"
    assert (increment["strong_tests_passed"], increment["strong_tests_total"], increment["strong_passed"]) == \
        (58, 58, True)
    assert double["evaluation"]["status"] == "failed" and double["evaluation"]["tests_passed"] == 1
    assert (double["strong_tests_passed"], double["strong_tests_total"]) == (1, 59)
    assert double["strong_evaluation"]["status"] == "failed" and "case 1/59" in double["strong_evaluation"]["message"]
    assert reverse["strong_evaluation"]["status"] == "invalid" and reverse["strong_tests_total"] == 56
    assert reverse["hit_token_cap"] and reverse["generated_tokens"] == 48
    assert reverse["evaluation"]["status"] == "invalid"
    assert set(receipt["timing"]) >= {"generation_seconds", "verification_seconds", "total_seconds"}
    math = receipt["provenance"]["math"]  # what decides the CPU's floating-point results
    assert math["cpu"]["machine"] and isinstance(math["cpu"]["math_flags"], list)
    assert math["torch"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert math["torch"]["threads"] == torch.get_num_threads() == 1  # the one_thread fixture, read live
    json.dumps(receipt)  # the receipt is plain JSON


def test_sampled_receipt_is_compatible_and_exact(scripted, verifier):
    model, tasks = scripted
    receipt = evaluate_sampled(model, tasks, samples=4, verifier=verifier)
    assert GREEDY_TOP | {"pass_at_k", "timing", "provenance"} <= set(receipt)
    assert SAMPLED_INFERENCE <= set(receipt["inference"])
    assert SAMPLED_SUMMARY <= set(receipt["summary"])
    summary = receipt["summary"]
    assert (summary["tasks_solved_at_k"], summary["exact_rollouts"], summary["rollouts_total"]) == (1, 4, 12)
    assert (summary["tests_passed"], summary["tests_total"], summary["valid_rollouts"]) == (16, 36, 8)
    assert summary["token_cap_hits"] == 4 and summary["pass_at_k"] == 1 / 3
    assert receipt["pass_at_k"] == {str(k): pytest.approx(1 / 3) for k in range(1, 5)}
    assert (summary["tasks_solved_at_k_strong"], summary["exact_rollouts_strong"], summary["false_pass_rollouts"]) \
        == (1, 4, 0)
    assert (summary["strong_tests_passed"], summary["strong_tests_total"]) == (4 * 59, 4 * 173)
    assert receipt["pass_at_k_strong"] == {str(k): pytest.approx(1 / 3) for k in range(1, 5)}
    assert receipt["by_family"]["increment"]["pass_at_k"] == {str(k): 1.0 for k in range(1, 5)}
    for family in receipt["by_family"].values():
        assert SAMPLED_FAMILY <= set(family)
    for episode in receipt["episodes"]:
        assert SAMPLED_EPISODE <= set(episode)
        assert [s["sample"] for s in episode["samples"]] == [0, 1, 2, 3]
        for sample in episode["samples"]:
            assert SAMPLE <= set(sample) and EVALUATION <= set(sample["evaluation"])
            assert {"strong_tests_passed", "strong_tests_total", "strong_passed", "strong_evaluation"} <= set(sample)


def test_false_passes_are_counted_greedy_and_sampled(verifier):
    # square: right on the three cases (-4, 0, 5) but wrong from 6 on; list_sum: sums only the first three
    tasks = frozen_tasks("dev", 1, ("square", "even", "list_sum"))
    model = ScriptedModel({tasks[0].prompt: "\n    return x * x if x < 6 else 25\n",
                           tasks[1].prompt: tasks[1].reference_completion,
                           tasks[2].prompt: "\n    return sum(values[:3])\n"})
    greedy = evaluate_greedy(model, tasks, verifier=verifier)
    summary = greedy["summary"]
    assert (summary["tasks_solved"], summary["tasks_solved_strong"], summary["false_passes"]) == (3, 1, 2)
    assert greedy["pass_at_k"] == {"1": 1.0} and greedy["pass_at_k_strong"] == {"1": pytest.approx(1 / 3)}
    square, even, list_sum = greedy["episodes"]
    assert square["evaluation"]["passed"] and not square["strong_passed"]
    assert 0 < square["strong_tests_passed"] < square["strong_tests_total"] == 59
    assert list_sum["strong_evaluation"]["status"] == "failed" and even["strong_passed"]
    assert greedy["by_family"]["square"]["false_passes"] == 1 and greedy["by_family"]["even"]["solved_strong"] == 1
    sampled = evaluate_sampled(model, tasks, samples=2, verifier=verifier)
    s = sampled["summary"]
    assert (s["exact_rollouts"], s["exact_rollouts_strong"], s["false_pass_rollouts"]) == (6, 2, 4)
    assert (s["tasks_solved_at_k"], s["tasks_solved_at_k_strong"]) == (3, 1)
    assert sampled["by_family"]["list_sum"]["pass_at_k_strong"] == {"1": 0.0, "2": 0.0}
    assert "false passes 2" in format_summary(greedy) and "false-pass rollouts 4" in format_summary(sampled)


def test_strong_tests_never_change_the_three_case_verdict(verifier):
    # The original verdicts come from their own run on the three cases, whatever the strong run does.
    task = frozen_tasks("dev", 1, ("increment",))[0]
    greedy = task.prompt + "\n    return x + 1 + 0 * len(str(x) * x)\n"  # gigabytes of text for large x
    three, strong = verifier.evaluate_many([(task, greedy), (strong_task(task), greedy)])
    assert three.passed and three.tests_total == 3
    assert strong.status == "limit" and "memory" in strong.message and strong.tests_total == 58


def _fake(passed: bool, status: str | None = None) -> Evaluation:
    status = status or ("passed" if passed else "failed")
    return Evaluation(status, passed, 3 if passed else 0, 3, 1.0 if passed else 0.0)


def test_unbiased_pass_at_k_matches_brute_force_enumeration():
    rng = random.Random(0)
    tasks = frozen_tasks("dev", 2)
    for n in (1, 2, 5):
        outcomes = [[rng.random() < 0.4 for _ in range(n)] for _ in tasks]
        completions = [[Completion("", (4,), False, (0.0,), "eos")] * n for _ in tasks]
        evaluations = [[_fake(p) for p in row] for row in outcomes]
        receipt = sampled_receipt(tasks, completions, evaluations, {})
        for k in range(1, n + 1):
            # pass@k = the chance that a uniformly chosen k-subset of a task's n samples holds a pass
            brute = [sum(any(row[i] for i in subset) for subset in itertools.combinations(range(n), k))
                     / len(list(itertools.combinations(range(n), k))) for row in outcomes]
            assert receipt["pass_at_k"][str(k)] == pytest.approx(sum(brute) / len(brute), abs=1e-12)
        assert set(receipt["pass_at_k"]) == {str(k) for k in range(1, n + 1)}
    assert unbiased_pass_at_k([0, 8, 2], 8)["8"] == pytest.approx(2 / 3)


def test_a_compositions_evaluation_also_counts_false_passes_on_the_strict_set(verifier):
    from glm53_flash.tasks import compositions, strict

    by_unit = {e.unit: e for e in compositions.suite().split(compositions.DEV_SPLIT)}
    right, off_by_one, wrong = (
        compositions.make_task(by_unit[unit], compositions.DEV_SPLIT, random.Random(0),
                               f"{compositions.DEV_SPLIT}-b{by_unit[unit].index:04d}-000")
        for unit in ("int:mul(7)", "str:head(5)>contains('o')", "int:atmost(5)"))
    model = ScriptedModel({right.prompt: right.reference_completion,
                           off_by_one.prompt: '\n    return "o" in text[:6]\n',  # passes the strong set too
                           wrong.prompt: "\n    return x * 5\n"})
    tasks = [right, off_by_one, wrong]
    receipt = evaluate_greedy(model, tasks, verifier=verifier, max_new_tokens=64)
    s = receipt["summary"]
    assert (s["tasks_solved"], s["tasks_solved_strong"], s["false_passes"]) == (2, 2, 0)
    assert (s["tasks_solved_strict"], s["false_passes_strict"], s["pass_at_1_strict"]) == (1, 1, 1 / 3)
    assert [e["strict_passed"] for e in receipt["episodes"]] == [True, False, False]
    assert receipt["pass_at_k_strict"] == {"1": 1 / 3} and "strict tests: pass@1 1/3" in format_summary(receipt)
    assert receipt["inference"]["strict_tests"] == strict.strict_cases_record(tasks)
    assert sum(row["solved_strict"] for row in receipt["by_kind"].values()) == 1
    # sampled: per sample, and the strict rollouts never exceed the strong ones
    three = [[Evaluation.from_cases(3, 3)] * 2, [Evaluation.from_cases(0, 3)] * 2]
    completions = [[Completion("x", (1,), False, (0.0,), "parse")] * 2] * 2
    strong = [[Evaluation.from_cases(60, 60)] * 2, [Evaluation.from_cases(0, 60)] * 2]
    sampled = sampled_receipt(tasks[:2], completions, three, {}, strong_evaluations=strong,
                              strict_passed=[[True, False], [False, False]])
    assert (sampled["summary"]["exact_rollouts_strict"], sampled["summary"]["false_pass_rollouts_strict"]) == (1, 1)
    assert sampled["episodes"][0]["samples"][1]["strict_passed"] is False and sampled["pass_at_k_strict"]["2"] == 0.5
    # the families suite has no strict set: its receipts are as before
    assert "pass_at_k_strict" not in greedy_receipt(tasks[:1], completions[0][:1], three[0][:1], {})


def test_greedy_receipt_counts_limit_as_valid_and_invalid_as_not():
    tasks = frozen_tasks("confirm", 1, ("increment", "double", "square"))
    completions = [Completion("x", (4,), i == 2, (0.0,), "cap" if i == 2 else "parse") for i in range(3)]
    evaluations = [_fake(True), Evaluation.limit("wall clock", 3), Evaluation.invalid("SyntaxError", 3)]
    summary = greedy_receipt(tasks, completions, evaluations, {})["summary"]
    assert summary["valid_programs"] == 2 and summary["token_cap_hits"] == 1 and summary["tasks_solved"] == 1


def test_task_samples_do_not_depend_on_which_families_are_evaluated(tiny_model, verifier):
    # The original seeded each task by its position in the filtered list; here the stream follows task_id.
    alone = evaluate_sampled(tiny_model, frozen_tasks("dev", 2, ("double",)), samples=3, max_new_tokens=8,
                             stop="eos", verifier=verifier)
    mixed = evaluate_sampled(tiny_model, frozen_tasks("dev", 2, ("increment", "double", "reverse")), samples=3,
                             max_new_tokens=8, stop="eos", verifier=verifier, batch_rows=4)
    by_id = {e["task_id"]: e for e in mixed["episodes"]}
    for episode in alone["episodes"]:
        together = by_id[episode["task_id"]]["samples"]
        assert [s["token_ids"] for s in episode["samples"]] == [s["token_ids"] for s in together]


def test_task_batches_sort_by_prompt_length_and_cover_every_task():
    tasks = frozen_tasks("confirm", 3)
    batches = task_batches(tasks, samples=8, batch_rows=40)
    assert all(len(b) <= 5 for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(len(tasks)))
    lengths = [len(tasks[i].prompt) for b in batches for i in b]
    assert lengths == sorted(lengths)


def test_rl_split_and_mixed_splits_are_refused(tiny_model, verifier):
    with pytest.raises(ValueError, match="the rl splits are for training"):
        evaluate_greedy(tiny_model, frozen_tasks("rl", 1), verifier=verifier)
    with pytest.raises(ValueError, match="several splits"):
        evaluate_greedy(tiny_model, frozen_tasks("dev", 1) + frozen_tasks("final", 1), verifier=verifier)
    with pytest.raises(ValueError, match="temperature > 0"):
        evaluate_sampled(tiny_model, frozen_tasks("dev", 1), temperature=0.0, verifier=verifier)


def test_a_sealed_split_is_evaluated_only_under_an_opening(verifier, private_ledger, tmp_path):
    tasks = frozen_tasks("holdout", 1, ("increment",))
    model = ScriptedModel({tasks[0].prompt: tasks[0].reference_completion})
    for evaluate in (evaluate_greedy, lambda *a, **k: evaluate_sampled(*a, samples=2, **k)):
        with pytest.raises(SealedSplitError, match="split holdout is sealed"):
            evaluate(model, tasks, verifier=verifier)
    assert not private_ledger.exists()
    with require_open("holdout", "library test", plan_sha256="a" * 64) as opening:
        with pytest.raises(SealedSplitError, match="not activated"):
            evaluate_greedy(model, tasks, verifier=verifier, opening=opening)
        opening.activate()
        receipt = evaluate_greedy(model, tasks, verifier=verifier, opening=opening)
        assert receipt["sealed_opening"] == opening.to_dict() and receipt["summary"]["pass_at_1_strong"] == 1.0
        assert evaluate_sampled(model, tasks, samples=2, verifier=verifier)["sealed_opening"]["opening_id"] == \
            opening.opening_id  # without opening=: the one granted in this process
        line = opening.write_receipt(tmp_path / "holdout.json", receipt)
        with pytest.raises(SealedSplitError, match="not confirm"):
            evaluate_greedy(model, frozen_tasks("confirm", 1, ("increment",)), verifier=verifier, opening=opening)
    assert line["receipt_sha256"] == sha256_file(tmp_path / "holdout.json") and read_ledger()[1:] == [line]
    assert read_ledger()[0]["kind"] == "opened"


# --------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_model):
    path = tmp_path_factory.mktemp("ckpt") / "checkpoint-0000"
    save_checkpoint(path, tiny_model, {"stage": "random_initialization", "seed": 3})
    return path


def test_cli_eval_greedy_and_sampled_write_receipts(checkpoint, tmp_path, capsys):
    out = tmp_path / "greedy.json"
    args = ["eval", "--checkpoint", str(checkpoint), "--split", "dev", "--per-family", "1", "--families",
            "increment,double", "--max-new-tokens", "6", "--device", "cpu", "--workers", "1", "--quiet"]
    assert main(args + ["--output", str(out)]) == 0
    receipt = json.loads(out.read_text())
    assert receipt["inference"]["greedy"] and receipt["inference"]["seed"] == 2026
    assert [e["task_id"] for e in receipt["episodes"]] == ["dev-increment-000", "dev-double-000"]
    assert len(receipt["checkpoint_sha256"]) == 64
    assert main(args + ["--output", str(out)]) == 2  # never overwrites without --force
    assert "already exists" in capsys.readouterr().err
    assert main(args + ["--output", str(out), "--force"]) == 0

    sampled = tmp_path / "sampled.json"
    assert main(args + ["--samples", "3", "--output", str(sampled)]) == 0
    receipt = json.loads(sampled.read_text())
    assert receipt["inference"]["samples_per_task"] == 3 and receipt["inference"]["temperature"] == 0.35
    assert receipt["inference"]["seed"] == 8675309 and set(receipt["pass_at_k"]) == {"1", "2", "3"}
    assert main(args + ["--temperature", "0.5", "--output", str(tmp_path / "x.json")]) == 2
    assert "only with --samples > 1" in capsys.readouterr().err


def test_cli_eval_refuses_the_rl_split(checkpoint, tmp_path):
    with pytest.raises(SystemExit) as error:
        main(["eval", "--checkpoint", str(checkpoint), "--split", "rl", "--output", str(tmp_path / "r.json")])
    assert error.value.code == 2


def test_cli_eval_reports_a_bad_checkpoint(tmp_path, capsys):
    code = main(["eval", "--checkpoint", str(tmp_path / "missing"), "--split", "dev", "--output",
                 str(tmp_path / "r.json"), "--device", "cpu"])
    assert code == 2 and "does not exist" in capsys.readouterr().err


def test_cli_generate_prints_samples(checkpoint, capsys):
    assert main(["generate", "--checkpoint", str(checkpoint), "--prompt", "def f(x):", "--samples", "2",
                 "--max-new-tokens", "5", "--device", "cpu", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 and all(len(r["token_ids"]) <= 5 for r in rows)
    assert main(["generate", "--checkpoint", str(checkpoint), "--task-id", "dev-double-000", "--max-new-tokens",
                 "5", "--device", "cpu"]) == 0
    assert "--- sample 0:" in capsys.readouterr().out
    assert main(["generate", "--checkpoint", str(checkpoint), "--prompt", "x", "--stop", "parse"]) == 2
    assert "needs --task-id" in capsys.readouterr().err


def test_cli_eval_opens_a_sealed_split_only_with_a_purpose_and_records_it(checkpoint, tmp_path, capsys,
                                                                         private_ledger, monkeypatch):
    out = tmp_path / "holdout.json"
    args = ["eval", "--checkpoint", str(checkpoint), "--split", "holdout", "--per-family", "1", "--families",
            "increment", "--max-new-tokens", "6", "--device", "cpu", "--workers", "1", "--quiet",
            "--output", str(out)]
    # the ledger records the process's command line, as provenance does
    monkeypatch.setattr("sys.argv", ["glm53"] + args + ["--open-sealed", "the CLI's first look"])
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "split holdout is sealed: pass --open-sealed" in err and len(err.strip().splitlines()) == 1
    assert not out.exists() and not private_ledger.exists()  # refused: nothing written

    assert main(args + ["--open-sealed", "the CLI's first look"]) == 0
    assert "ledger: opening of holdout recorded" in capsys.readouterr().out
    receipt = json.loads(out.read_text())
    (line,) = ledger_lines()
    assert line["split"] == "holdout" and line["purpose"] == "the CLI's first look" and line["reopen"] is None
    assert line["receipt_sha256"] == sha256_file(out) and line["command"][-2:] == ["--open-sealed", "the CLI's first look"]
    assert receipt["sealed_opening"]["opening_id"] == line["opening_id"]
    assert receipt["run_config"]["open_sealed"] == "the CLI's first look"
    assert {"pass_at_1_strong", "false_passes"} <= set(receipt["summary"])

    # the same evaluation again is a second opening of the same plan: refused without a reason
    again = args[:-1] + [str(tmp_path / "again.json"), "--open-sealed", "another look"]
    assert main(again) == 2
    assert "already opened for this plan" in capsys.readouterr().err
    assert not (tmp_path / "again.json").exists() and len(ledger_lines()) == 1
    assert main(again + ["--reopen", "checking the receipt reproduces"]) == 0
    assert ledger_lines()[-1]["reopen"] == "checking the receipt reproduces"
    assert json.loads((tmp_path / "again.json").read_text())["episodes"] == receipt["episodes"]
    # other settings are another plan
    assert main(args[:-1] + [str(tmp_path / "other.json"), "--open-sealed", "x", "--max-new-tokens", "5"]) == 0
    assert len(ledger_lines()) == 3

    dev = ["eval", "--checkpoint", str(checkpoint), "--split", "dev", "--output", str(tmp_path / "dev.json")]
    assert main(dev + ["--open-sealed", "why"]) == 2 and "apply only to the sealed splits" in capsys.readouterr().err
    assert main(args[:-1] + [str(tmp_path / "r.json"), "--open-sealed", ""]) == 2
    assert "purpose" in capsys.readouterr().err


def test_run_eval_honours_every_field_of_its_config(checkpoint):
    """top_k, top_p, batch_rows, the families and the tasks per family all reach the receipt (the
    pipeline once dropped top_k, batch_rows and workers on its way to the evaluation functions)."""
    from glm53_flash.evaluation.config import EvalConfig
    from glm53_flash.evaluation.evaluate import run_eval

    cfg = EvalConfig(checkpoint=str(checkpoint), split="dev", output="", samples=2, top_k=3, top_p=0.9,
                     batch_rows=5, per_family=1, families="double,even", max_new_tokens=4, seed=11, workers=1,
                     device="cpu", quiet=True)
    receipt = run_eval(cfg)
    inference = receipt["inference"]
    assert (inference["top_k"], inference["top_p"], inference["batch_rows"], inference["seed"]) == (3, 0.9, 5, 11)
    assert inference["temperature"] == 0.35 and inference["max_new_tokens"] == 4
    assert sorted({e["family"] for e in receipt["episodes"]}) == ["double", "even"] and len(receipt["episodes"]) == 2
    greedy = run_eval(EvalConfig(checkpoint=str(checkpoint), split="dev", output="", per_family=1, families="double",
                                 max_new_tokens=4, workers=1, device="cpu", quiet=True))
    assert greedy["inference"]["greedy"] is True and greedy["inference"]["seed"] == 2026


def test_run_eval_refuses_sampling_settings_on_one_sample(checkpoint):
    from glm53_flash.evaluation.config import EvalConfig
    from glm53_flash.evaluation.evaluate import run_eval

    with pytest.raises(ValueError, match="apply only with --samples > 1"):
        run_eval(EvalConfig(checkpoint=str(checkpoint), split="dev", output="", top_k=3, device="cpu"))


def test_the_pipeline_evaluates_its_sealed_splits_through_run_eval(monkeypatch, checkpoint, tmp_path):
    """reproduce's sealed-split stage hands each plan EvalConfig, whole, to run_eval."""
    from dataclasses import replace

    from glm53_flash.evaluation import evaluate
    from glm53_flash.experiments import reproduce

    seen = []
    monkeypatch.setattr(evaluate, "run_eval", lambda cfg, **kw: seen.append(cfg) or {"summary": {}})

    class Opening:
        def write_receipt(self, path, receipt):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("{}")

    plan = reproduce.PLANS["quick"]
    greedy, sampled = replace(plan.confirm_greedy, batch_rows=7), replace(plan.confirm_sampled, top_k=5, workers=1)
    reproduce._evaluate_sealed(tmp_path, (greedy, sampled), {"rl-1": str(checkpoint)}, Opening(), "cpu", "ours")
    assert [(c.samples, c.batch_rows, c.top_k, c.checkpoint) for c in seen] == [
        (1, 7, None, str(checkpoint)), (sampled.samples, sampled.batch_rows, 5, str(checkpoint))]


def test_cli_generate_reads_the_prompt_from_a_file_or_standard_input(checkpoint, tmp_path, capsys, monkeypatch):
    """--prompt-file PATH and --prompt-file - give the same completions as --prompt with the same text,
    newlines and all; a file that is not UTF-8 is a one-line error."""
    import io
    import sys

    text = "def f(x):\n    y = 'é'\n"
    path = tmp_path / "prompt.txt"
    path.write_text(text, encoding="utf-8")
    common = ["generate", "--checkpoint", str(checkpoint), "--max-new-tokens", "4", "--json", "--device", "cpu"]
    assert main([*common, "--prompt", text]) == 0
    direct = json.loads(capsys.readouterr().out)
    assert main([*common, "--prompt-file", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == direct
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    assert main([*common, "--prompt-file", "-"]) == 0
    assert json.loads(capsys.readouterr().out) == direct
    (tmp_path / "latin1.txt").write_bytes(b"def f(x):\xe9")
    assert main([*common, "--prompt-file", str(tmp_path / "latin1.txt")]) == 2
    assert "is not UTF-8 text" in capsys.readouterr().err
