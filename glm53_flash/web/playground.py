"""The live playground: a checkpoint completes a prompt token by token, then the sandboxed verifier
runs the task's hidden tests, one verdict for the program and one per case.

Nothing here is scripted: the tokens come from `sampling.stream_generate` on the loaded
checkpoint and the verdicts from `verifier.Verifier`. Generation is limited to one at a time and a
fixed number per minute, so a page left open cannot keep the machine busy.
"""

from __future__ import annotations

import codecs
import dataclasses
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import ast
import re

from glm53_flash.core.receipts import read_json
from glm53_flash.data.tokenizer import MAX_PROMPT_CHARS, PromptError, check_prompt  # noqa: F401 - the shared rules
from glm53_flash.tasks import frozen_tasks, task_by_id
from glm53_flash.verifier.evaluation import short_repr

MAX_NEW_TOKENS = 96
PLAYGROUND_SPLIT = "dev"  # tasks offered by the picker: the dev split, never the confirm split
PLAYGROUND_PER_FAMILY = 4  # the whole dev split as checkpoint selection reads it (`glm53 select` default)
MAX_TEST_ROWS = 20  # a learner's own tests: rows per request
MAX_ROW_CHARS = 400
MAX_SOURCE_CHARS = 4000  # a learner's own function, judged without the model
NO_CHECKPOINT_HELP = ("no checkpoint to load: `make demo` (glm53 reproduce --preset headline --output runs/demo) "
                      "makes one, or start the server with --checkpoint DIR")


class PlaygroundError(PromptError):
    """A request the playground refuses before generating; `status` is the HTTP status to answer."""


def default_checkpoint(demo_dir: str | Path = "runs/demo") -> Path | None:
    """The demo run's selected checkpoint: among the RL seeds, the one whose dev-selected checkpoint
    scored highest on dev (ties to the plan's seed order); the dev-selected pretraining checkpoint
    when no RL run has finished; None when neither exists. Chosen from dev receipts only. In a
    two-arm directory (`glm53 reproduce` today) the run is its `ours` arm, DIR/ours."""
    demo = Path(demo_dir)
    if (demo / "ours" / "plan.json").exists():
        demo = demo / "ours"
    best, best_score = None, None
    plan_path = demo / "plan.json"
    seeds = read_json(plan_path)["plan"]["rl_seeds"] if plan_path.exists() else []
    for seed in seeds:
        selection = demo / f"rl-{seed}" / "selection-dev.json"
        if selection.exists():
            chosen = read_json(selection)["selected"]
            if best_score is None or tuple(chosen["score"]) > best_score:
                best, best_score = chosen["checkpoint"], tuple(chosen["score"])
    if best is None:
        selection = demo / "pretrain" / "selection-dev.json"
        if selection.exists():
            best = read_json(selection)["selected"]["checkpoint"]
    if best is None:
        return None
    path = Path(best)
    return path if path.is_dir() else None


def parse_test_rows(text) -> tuple:
    """A learner's tests, one row per line, `ARGUMENTS -> EXPECTED` with Python literals
    (`3, 4 -> 7`, `'abc' -> 'cba'`, `[1, 2] -> 3`), as the verifier's Cases. Blank lines and lines
    starting with # are skipped; anything else that is not a row is a PlaygroundError naming the row."""
    from glm53_flash.tasks import Case

    if not isinstance(text, str):
        raise PlaygroundError("tests must be a string: one `arguments -> expected` row per line")
    rows = [(n, line.strip()) for n, line in enumerate(text.splitlines(), start=1)
            if line.strip() and not line.strip().startswith("#")]
    if not rows:
        raise PlaygroundError("tests: write at least one row, `arguments -> expected` (e.g. `3, 4 -> 7`)")
    if len(rows) > MAX_TEST_ROWS:
        raise PlaygroundError(f"tests: at most {MAX_TEST_ROWS} rows, got {len(rows)}")
    cases = []
    for number, row in rows:
        if len(row) > MAX_ROW_CHARS:
            raise PlaygroundError(f"tests row {number}: longer than {MAX_ROW_CHARS} characters")
        arguments, arrow, expected = row.rpartition("->")
        if not arrow or not arguments.strip() or not expected.strip():
            raise PlaygroundError(f"tests row {number}: write `arguments -> expected`, got {row!r}")
        try:
            values = ast.literal_eval(f"({arguments.strip()},)")
            result = ast.literal_eval(expected.strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise PlaygroundError(f"tests row {number}: arguments and expected must be Python literals "
                                  f"(numbers, strings, lists, tuples, booleans, None), got {row!r}") from None
        cases.append(Case(arguments=tuple(values), expected=result,
                          list_arguments=tuple(isinstance(v, list) for v in values)))
    return tuple(cases)


def entry_point_of(source: str) -> str:
    """The function a learner's program defines last at the top level (`def name(`): the one the tests call."""
    names = re.findall(r"^def ([A-Za-z_][A-Za-z0-9_]*)\s*\(", source, flags=re.M)
    if not names:
        raise PlaygroundError("your tests call a function: the prompt must define one (`def name(...):`)")
    return names[-1]


def own_task(source: str, cases: tuple):
    """A task made of a learner's own tests, judged like any other (same verifier, same policy)."""
    from glm53_flash.tasks import CodingTask

    return CodingTask(task_id="playground-your-tests", family="your tests", entry_point=entry_point_of(source),
                      prompt=source, reference_completion="", cases=cases, split="playground")


class RateLimiter:
    """At most `per_minute` starts in any 60-second window (a sliding log of start times)."""

    def __init__(self, per_minute: int, clock=time.monotonic) -> None:
        if per_minute < 1:
            raise ValueError(f"the generation rate limit must be >= 1 per minute, got {per_minute}")
        self.per_minute = per_minute
        self._clock = clock
        self._starts: deque[float] = deque()
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            now = self._clock()
            while self._starts and now - self._starts[0] >= 60.0:
                self._starts.popleft()
            if len(self._starts) >= self.per_minute:
                return False
            self._starts.append(now)
            return True


class Playground:
    """A loaded checkpoint, a verifier pool and the limits that guard them."""

    def __init__(self, checkpoint: str | Path | None, *, per_minute: int = 12, device: str = "auto",
                 precision: str | None = None) -> None:
        """`precision`: fp32, bf16 or auto (model/precision.py), what every generation runs in; None: the
        device's default."""
        self.checkpoint = Path(checkpoint) if checkpoint is not None else None
        self.precision = None
        self.limiter = RateLimiter(per_minute)
        self._busy = threading.Lock()
        self.model = None
        self.metadata: dict = {}
        self.verifier = None
        if self.checkpoint is not None:
            from glm53_flash.model.lm import load_pretrained
            from glm53_flash.verifier import Verifier

            if not self.checkpoint.is_dir():
                raise FileNotFoundError(f"--checkpoint {self.checkpoint} is not a directory")
            from glm53_flash.core.runtime import resolve_device

            from glm53_flash.model.precision import resolve_precision

            resolved = resolve_device(device)
            self.precision = resolve_precision(precision, resolved)  # a bad choice is refused before the load
            self.model, self.metadata = load_pretrained(self.checkpoint, resolved)
            self.model.eval()
            self.verifier = Verifier(workers=1)

    @property
    def ready(self) -> bool:
        return self.model is not None

    def describe(self) -> dict:
        """What the page shows about the model, and the tasks it offers."""
        tasks = [{"task_id": t.task_id, "family": t.family, "prompt": t.prompt, "entry_point": t.entry_point}
                 for t in frozen_tasks(PLAYGROUND_SPLIT, PLAYGROUND_PER_FAMILY)]
        if not self.ready:
            return {"ready": False, "message": NO_CHECKPOINT_HELP, "tasks": tasks}
        counts = self.metadata.get("parameter_counts") or self.model.parameter_counts()
        return {"ready": True, "checkpoint": str(self.checkpoint), "weights_sha256": self.metadata.get("weights_sha256"),
                "parameters": counts.get("total"), "max_new_tokens": MAX_NEW_TOKENS, "tasks": tasks,
                "precision": self.precision.name, "precision_reason": self.precision.reason}

    def close(self) -> None:
        if self.verifier is not None:
            self.verifier.close()

    # ------------------------------------------------------------------ one request
    def prepare(self, body) -> dict:
        """Validate a generation request; PlaygroundError (with its HTTP status) when refused."""
        if not self.ready:
            raise PlaygroundError(NO_CHECKPOINT_HELP, 503)
        if not isinstance(body, dict):
            raise PlaygroundError("the body must be a JSON object")
        unknown = set(body) - {"task_id", "prompt", "temperature", "max_new_tokens", "seed", "tests"}
        if unknown:
            raise PlaygroundError(f"unknown fields: {', '.join(sorted(unknown))}")
        task = None
        if body.get("task_id") not in (None, ""):
            if not isinstance(body["task_id"], str):
                raise PlaygroundError("task_id must be a string")
            task = task_by_id(body["task_id"])  # ValueError names the bad id
            if task.task_id.split("-", 1)[0] != PLAYGROUND_SPLIT:
                raise PlaygroundError(f"task_id must name a {PLAYGROUND_SPLIT} task (the other splits stay closed), "
                                      f"got {task.task_id!r}")
        if "prompt" not in body and task is None:
            raise PlaygroundError("give a prompt or a task_id")
        try:
            prompt = check_prompt(body.get("prompt", task.prompt if task else None))
        except PromptError as error:
            raise PlaygroundError(str(error)) from None
        temperature = body.get("temperature", 0.0)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
            raise PlaygroundError("temperature must be a number in [0, 2] (0 = greedy)")
        max_new = body.get("max_new_tokens", 48)
        if isinstance(max_new, bool) or not isinstance(max_new, int) or not 1 <= max_new <= MAX_NEW_TOKENS:
            raise PlaygroundError(f"max_new_tokens must be an integer in [1, {MAX_NEW_TOKENS}]")
        seed = body.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
            raise PlaygroundError("seed must be an integer in [0, 2^31)")
        length = len(prompt.encode("utf-8")) + 1
        limit = self.model.config.max_sequence_length
        if length + max_new > limit:
            raise PlaygroundError(f"prompt is {length} tokens (with BOS); plus max_new_tokens={max_new} that exceeds "
                                  f"the model's context of {limit}")
        # The parse stop rule needs the task's own prompt; an edited prompt stops at EOS or the cap.
        stop = "parse" if task is not None and prompt == task.prompt else "eos"
        if body.get("tests") not in (None, ""):
            if task is not None:
                raise PlaygroundError("give either a task_id (its hidden tests) or your own tests, not both")
            task = own_task(prompt, parse_test_rows(body["tests"]))
            stop = "parse"  # the program stops once the prompt plus the completion parses
        return {"task": task, "prompt": prompt, "temperature": float(temperature), "max_new_tokens": max_new,
                "seed": seed, "stop": stop}

    def prepare_judgement(self, body) -> dict:
        """Validate a request to judge a learner's own function against their own tests (no model needed)."""
        if not isinstance(body, dict):
            raise PlaygroundError("the body must be a JSON object")
        unknown = set(body) - {"source", "tests"}
        if unknown:
            raise PlaygroundError(f"unknown fields: {', '.join(sorted(unknown))}")
        source = body.get("source")
        if not isinstance(source, str) or not source.strip():
            raise PlaygroundError("source must be the program to judge (a function definition)")
        if len(source) > MAX_SOURCE_CHARS:
            raise PlaygroundError(f"source: at most {MAX_SOURCE_CHARS} characters, got {len(source)}")
        return {"task": own_task(source, parse_test_rows(body.get("tests"))), "source": source}

    def judge(self, request: dict) -> dict:
        """The verdict of a learner's program on their own tests (each row judged alone too)."""
        if self.verifier is None:
            from glm53_flash.verifier import Verifier

            self.verifier = Verifier(workers=1)
        verdict = self.verdict(request["task"], request["source"])
        verdict["own_tests"] = True
        return verdict

    def acquire(self) -> None:
        """Take the single generation slot, or refuse with 429 (busy or over the per-minute limit)."""
        if not self._busy.acquire(blocking=False):
            raise PlaygroundError("the model is busy with another generation; try again in a moment", 429)
        if not self.limiter.allow():
            self._busy.release()
            raise PlaygroundError(f"rate limit: at most {self.limiter.per_minute} generations per minute", 429)

    def release(self) -> None:
        self._busy.release()

    def run(self, request: dict) -> Iterator[dict]:
        """Events: start, one token event per generated token, done, then verdict (tasks only)."""
        from glm53_flash.evaluation.sampling import SamplingSettings, stream_generate
        from glm53_flash.evaluation.stop import ParseStop
        from glm53_flash.data.tokenizer import ByteTokenizer

        task = request["task"]
        yield {"type": "start", "checkpoint": str(self.checkpoint), "prompt": request["prompt"],
               "task_id": task.task_id if task else None, "stop": request["stop"]}
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        started = time.perf_counter()
        completion = None
        settings = SamplingSettings(max_new_tokens=request["max_new_tokens"], temperature=request["temperature"],
                                    seed=request["seed"], keys=(task.task_id,) if task else None,
                                    stop=ParseStop([task]) if request["stop"] == "parse" else request["stop"],
                                    precision=self.precision)
        for token, finished in stream_generate(self.model, request["prompt"], settings):
            is_byte = ByteTokenizer.byte_offset <= token < ByteTokenizer.vocab_size
            text = decoder.decode(bytes([token - ByteTokenizer.byte_offset])) if is_byte else ""
            yield {"type": "token", "id": token, "text": text}
            completion = finished
        seconds = time.perf_counter() - started
        yield {"type": "done", "completion": completion.text, "finish_reason": completion.finish_reason,
               "tokens": len(completion.token_ids), "seconds": round(seconds, 3)}
        if task is not None:
            verdict = self.verdict(task, request["prompt"] + completion.text)
            # with an edited prompt part of the program is the user's text, not the model's
            verdict["prompt_edited"] = request["prompt"] != task.prompt
            verdict["own_tests"] = task.split == "playground"
            yield verdict

    def verdict(self, task, source: str) -> dict:
        """The program's verdict and one per hidden case (each case judged alone in the sandbox)."""
        singles = [dataclasses.replace(task, cases=(case,)) for case in task.cases]
        results = self.verifier.evaluate_many([(task, source)] + [(single, source) for single in singles])
        overall, per_case = results[0], results[1:]
        cases = [{"number": i, "arguments": ", ".join(short_repr(a) for a in case.arguments),
                  "expected": short_repr(case.expected), "status": r.status, "passed": r.passed,
                  "message": r.message}
                 for i, (case, r) in enumerate(zip(task.cases, per_case), start=1)]
        return {"type": "verdict", "task_id": task.task_id, "entry_point": task.entry_point,
                "evaluation": overall.to_dict(), "cases": cases}
