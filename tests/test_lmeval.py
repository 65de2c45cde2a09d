"""lm-evaluation-harness as a real client: `lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True
--include_path <our task dir> --tasks glm53_dev_loglikelihood,glm53_dev_generate` runs offline on a fresh
checkpoint, and its numbers are ours: every request's log-likelihood equals our forward's (atol 1e-4) with
the same is-greedy verdict, every generation equals `glm53 generate --stop eos` for the same prompt, and so
the aggregate scores are the ones we compute. Skipped where the optional `lmeval` extra is not installed;
.ci/run installs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("lm_eval", reason="the optional lmeval extra is not installed (pip install 'glm53_flash[lmeval]')")

from glm53_flash import GLM53Flash, ModelConfig  # noqa: E402
from glm53_flash.data.tokenizer import ByteTokenizer  # noqa: E402
from glm53_flash.evaluation.lmeval_tasks import MAX_GENERATED_TOKENS, TASK_DIRECTORY, TASKS  # noqa: E402
from glm53_flash.evaluation.lmeval_tasks.dev_split import dev_documents  # noqa: E402
from glm53_flash.evaluation.sampling import SamplingSettings, generate  # noqa: E402

LIMIT = 8  # documents per task (lm-eval's --limit: the first ones)


def our_loglikelihood(model, context: str, continuation: str) -> tuple[float, bool]:
    """log p(continuation's bytes | BOS + context's bytes) by one forward, and whether greedy decoding
    would give every one of those bytes."""
    ids = ByteTokenizer().encode(context + continuation, bos=True)
    start = len(ByteTokenizer().encode(context, bos=True))
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    targets = torch.tensor(ids[start:])
    scored = logprobs[start - 1:-1]
    return float(scored.gather(1, targets[:, None]).sum()), bool(torch.equal(scored.argmax(-1), targets))


def test_the_task_documents_are_the_dev_split():
    from glm53_flash.tasks import frozen_tasks

    documents = dev_documents()
    assert [d["task_id"] for d in documents] == [t.task_id for t in frozen_tasks("dev")] and len(documents) == 32
    assert all(d["prompt"] + d["reference_completion"] == t.prompt + t.reference_completion
               for d, t in zip(documents, frozen_tasks("dev")))
    assert {p.stem for p in TASK_DIRECTORY.glob("*.yaml")} == set(TASKS)


@pytest.mark.slow
def test_lm_eval_runs_our_tasks_offline_and_its_numbers_are_ours(tmp_path):
    torch.manual_seed(2)
    model = GLM53Flash(ModelConfig.preset("tiny", init_std=0.3)).eval()
    with torch.no_grad():  # some generations stop at EOS (after 3 to 36 tokens), some at the cap
        model.embedding.weight[ByteTokenizer().eos_id] *= 2
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    command = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
               f"pretrained={checkpoint},trust_remote_code=True", "--include_path", str(TASK_DIRECTORY),
               "--tasks", ",".join(TASKS), "--device", "cpu", "--limit", str(LIMIT), "--log_samples",
               "--output_path", str(tmp_path / "out")]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    samples = {task: [json.loads(line) for path in (tmp_path / "out").rglob(f"samples_{task}_*.jsonl")
                      for line in path.read_text().splitlines()] for task in TASKS}
    documents = dev_documents()[:LIMIT]

    scored = sorted(samples["glm53_dev_loglikelihood"], key=lambda s: s["doc_id"])
    assert [s["doc"]["task_id"] for s in scored] == [d["task_id"] for d in documents]
    greedy = []
    for sample, document in zip(scored, documents):
        theirs, their_greedy = sample["resps"][0][0]
        ours, our_greedy = our_loglikelihood(model, document["prompt"], document["reference_completion"])
        assert abs(float(theirs) - ours) <= 1e-4, (document["task_id"], theirs, ours)
        assert (their_greedy == "True") == our_greedy
        greedy.append(our_greedy)

    generated = sorted(samples["glm53_dev_generate"], key=lambda s: s["doc_id"])
    ours = generate(model, [d["prompt"] for d in documents],
                    SamplingSettings(max_new_tokens=MAX_GENERATED_TOKENS, temperature=0.0, stop="eos"))
    assert [s["resps"][0][0] for s in generated] == [completions[0].text for completions in ours]
    assert {c[0].finish_reason for c in ours} == {"eos", "cap"}  # both ways a generation ends were compared

    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())["results"]
    assert results["glm53_dev_loglikelihood"]["acc,none"] == sum(greedy) / LIMIT
    assert results["glm53_dev_generate"]["exact_match,none"] == sum(
        c[0].text == d["reference_completion"] for c, d in zip(ours, documents)) / LIMIT
