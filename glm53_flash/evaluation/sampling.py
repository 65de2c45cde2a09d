"""Batched, cached generation: many prompts x many samples in one decode loop.

Replaces the original's `generate_group` (one task at a time, a full re-forward per token, the global
RNG reseeded per call). Prompts of different lengths share one cache without padding, every
(seed, key, sample) has its own random stream, and finished rows leave the batch.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from glm53_flash.data.tokenizer import ByteTokenizer
from glm53_flash.model.precision import compute_in

GENERIC_STOPS = ("eos", "none")  # or a stop predicate: see `SamplingSettings`
FINISH_REASONS = ("eos", "cap")  # or the name of the stop predicate that ended the row
DEFAULT_BATCH_ROWS = 512

_TOKENIZER = ByteTokenizer()
# Never sampled: they mark structure, not content (as in the original).
BANNED_IDS = (ByteTokenizer.pad_id, ByteTokenizer.bos_id, ByteTokenizer.sep_id)
NEWLINE_ID = ord("\n") + ByteTokenizer.byte_offset

# Dropping finished rows copies the cache of every row that stays (about 0.4 MB per row for the
# flash model), so finished rows are removed in bulk once they are at least this fraction of the
# batch (and whenever the batch is re-indexed anyway). Until then they are fed EOS and ignored,
# which costs at most a few steps of their compute.
_COMPACT_FRACTION = 1 / 8


@dataclass(frozen=True)
class Completion:
    """One generated continuation.

    token_ids include EOS when EOS ended the row (as the original); text never does. logprobs[i] is
    log p(token_ids[i]) under the distribution the token was drawn from (temperature, masks, top-k
    and top-p applied; for greedy the untempered masked distribution). hit_cap is the original's
    rule: len(token_ids) == max_new_tokens and the last id is not EOS.
    """

    text: str
    token_ids: tuple[int, ...]
    hit_cap: bool
    logprobs: tuple[float, ...]
    finish_reason: str  # "eos" | "parse" | "cap"

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": list(self.token_ids), "hit_cap": self.hit_cap,
                "logprobs": list(self.logprobs), "finish_reason": self.finish_reason}


# --------------------------------------------------------------------------- random streams


def stream_seed(seed: int, key: str, sample: int) -> int:
    """The 63-bit generator seed of one (call seed, prompt key, sample index) stream.

    A hash, not an arithmetic formula, so that streams of different keys never collide or overlap,
    and a task's samples depend on its id rather than its position in a (filtered) list.
    """
    digest = hashlib.sha256(f"{int(seed)}\x1f{key}\x1f{int(sample)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def gumbel_noise(seed: int, key: str, sample: int, steps: int, vocab_size: int) -> torch.Tensor:
    """Gumbel(0, 1) noise [steps, vocab] for one stream; argmax(z + noise[t]) samples softmax(z).

    Drawn in float64 so a uniform of exactly 0 (probability 2^-24 per float32 draw, i.e. likely
    somewhere in a large batch) cannot occur in practice; returned as float32 on the CPU.
    """
    generator = torch.Generator(device="cpu").manual_seed(stream_seed(seed, key, sample))
    uniform = torch.rand(steps, vocab_size, generator=generator, dtype=torch.float64)
    return (-torch.log(-torch.log(uniform))).float()


# --------------------------------------------------------------------------- logits processing


def mask_logits(logits: torch.Tensor, stop: str = "eos") -> torch.Tensor:
    """float32 logits [R, V] with PAD/BOS/SEP (and EOS when stop='none') set to -inf."""
    masked = logits.float().clone()
    masked[:, list(BANNED_IDS)] = float("-inf")
    if stop == "none":  # rows must run to the cap, so EOS is not a possible outcome
        masked[:, ByteTokenizer.eos_id] = float("-inf")
    return masked


def sampling_logits(masked: torch.Tensor, temperature: float, top_k: int | None = None,
                    top_p: float | None = None) -> torch.Tensor:
    """Tempered logits of the sampling distribution: divide by T, then keep the top-k, then the
    smallest set of most likely tokens whose probability reaches top_p (at least one token)."""
    z = masked / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        ordered, order = torch.sort(z, dim=-1, descending=True, stable=True)
        probs = torch.softmax(ordered, dim=-1)
        before = probs.cumsum(-1) - probs  # mass of the strictly more likely tokens
        ordered = ordered.masked_fill(before >= top_p, float("-inf"))
        z = torch.full_like(z, float("-inf")).scatter(-1, order, ordered)
    return z


# --------------------------------------------------------------------------- generation


@dataclass
class _Row:
    """One row of the running batch: still reading its prompt (slot None) or sampling into `slot`."""

    unit: int
    slot: int | None = None
    finished: bool = False


@dataclass(frozen=True)
class SamplingSettings:
    """What `generate` draws, checked when built (one clear line for a bad value).

    samples per prompt; max_new_tokens, the cap; temperature 0 is greedy (then samples must be 1 and
    top_k / top_p unset), otherwise sample i of a prompt uses the random stream (seed, key, i), where
    `keys` holds one key per prompt (None: the prompt text); stop: 'eos' (EOS or the cap), 'none'
    (EOS masked, every row runs to the cap) or a stop predicate: a callable `stop(prompt_index,
    completion_text)` with a `name` (the finish reason it reports), optionally `trigger_ids` (asked
    only after one of these tokens; None or absent: after every token) and `validate(prompts)`; the
    coding tasks' rule is `evaluation.stop.ParseStop`. batch_rows: the most rows in one forward (not
    a result: the completions do not depend on it). precision: a model/precision.Precision the forwards
    run in (None: the device's default).
    """

    samples: int = 1
    max_new_tokens: int = 48
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    keys: tuple[str, ...] | None = None
    stop: object = "eos"
    batch_rows: int = DEFAULT_BATCH_ROWS
    precision: object = None

    def __post_init__(self) -> None:
        for name in ("samples", "max_new_tokens", "batch_rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        temperature, top_k, top_p = self.temperature, self.top_k, self.top_p
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
                0.0 <= float(temperature) < float("inf")):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
        if temperature == 0:
            if self.samples != 1:
                raise ValueError(f"greedy decoding (temperature 0) gives identical samples; use samples=1, "
                                 f"got samples={self.samples}")
            if top_k is not None or top_p is not None:
                raise ValueError("top_k and top_p apply only to sampling (temperature > 0)")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
        if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))
                                  or not 0.0 < float(top_p) <= 1.0):
            raise ValueError(f"top_p must be a number in (0, 1] or None, got {top_p!r}")
        if isinstance(self.stop, str):
            if self.stop not in GENERIC_STOPS:
                raise ValueError(f"stop must be one of {', '.join(GENERIC_STOPS)} or a stop predicate, "
                                 f"got {self.stop!r}")
        elif not (callable(self.stop) and isinstance(getattr(self.stop, "name", None), str)):
            raise ValueError(f"stop must be one of {', '.join(GENERIC_STOPS)} or a callable with a `name`, "
                             f"got {self.stop!r}")
        if self.keys is not None:
            if isinstance(self.keys, str) or not isinstance(self.keys, Sequence):
                raise ValueError("keys must be a list with one string per prompt")
            for i, key in enumerate(self.keys):
                if not isinstance(key, str):
                    raise ValueError(f"keys[{i}] must be a string, got {type(key).__name__}")
            object.__setattr__(self, "keys", tuple(self.keys))
        object.__setattr__(self, "temperature", float(temperature))
        object.__setattr__(self, "seed", int(self.seed))

    def replace(self, **changes) -> "SamplingSettings":
        return dataclasses.replace(self, **changes)

    @property
    def stop_name(self) -> str:
        """'eos', 'none', or the stop predicate's name (the finish reason it reports)."""
        return self.stop if isinstance(self.stop, str) else self.stop.name

    @property
    def predicate(self) -> Callable[[int, str], bool] | None:
        return None if isinstance(self.stop, str) else self.stop

    @functools.cached_property
    def trigger_ids(self) -> frozenset | None:
        triggers = getattr(self.stop, "trigger_ids", None)
        return None if triggers is None else frozenset(triggers)

    def check(self, prompts: Sequence[str], vocab_size: int) -> None:
        """What depends on the call: the prompts, one key per prompt, top_k within the vocabulary, and
        the stop predicate's own check of the prompts."""
        if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not prompts:
            raise ValueError("prompts must be a non-empty list of strings")
        for i, prompt in enumerate(prompts):
            if not isinstance(prompt, str):
                raise ValueError(f"prompts[{i}] must be a string, got {type(prompt).__name__}")
        if self.keys is not None and len(self.keys) != len(prompts):
            raise ValueError(f"keys must be a list with one string per prompt ({len(prompts)})")
        if self.top_k is not None and self.top_k > vocab_size:
            raise ValueError(f"top_k must be an integer in [1, {vocab_size}] or None, got {self.top_k!r}")
        validate = getattr(self.stop, "validate", None)
        if validate is not None:
            validate(prompts)


def generate(model, prompts: Sequence[str], settings: SamplingSettings = SamplingSettings(), *,
             progress: Callable[[int], None] | None = None, governor=None) -> list[list[Completion]]:
    """Continue every prompt `settings.samples` times; returns completions[prompt][sample].

    Each prompt is encoded with BOS; rows end at EOS, the cap or the stop predicate (`SamplingSettings`),
    and the results do not depend on which other prompts share the call. `progress(n)` is called as n
    rows finish. `governor` (a core/shared_machine.ThreadGovernor) sets the thread count after every decode
    step, so a busy core elsewhere slows decoding by its share instead of stalling every parallel region.
    """
    cfg = model.config
    settings.check(prompts, cfg.vocab_size)
    keys = list(prompts) if settings.keys is None else list(settings.keys)
    encoded = [_TOKENIZER.encode(prompt, bos=True) for prompt in prompts]
    max_new_tokens, samples = settings.max_new_tokens, settings.samples
    limit = cfg.max_sequence_length
    for i, ids in enumerate(encoded):
        if len(ids) + max_new_tokens > limit:
            raise ValueError(f"prompt {i} is {len(ids)} tokens (with BOS); plus max_new_tokens={max_new_tokens} "
                             f"that exceeds max_sequence_length {limit}")

    device = next(model.parameters()).device
    if device.type == "cpu" and encoded:  # before any forward: the largest chunk's memory against what is free
        from glm53_flash.core.runtime import check_fits

        total = len(prompts) * samples
        rows = min(settings.batch_rows, total)
        kept = total * (16 * max_new_tokens + 512)  # every completion is kept to the end: ids, text, record
        check_fits(cfg.decode_bytes(rows, max(map(len, encoded)) + max_new_tokens) + kept,
                   f"generating {total} completions, {rows} rows at a time,", "lower --batch-rows or the samples")
    results: list[list[Completion | None]] = [[None] * samples for _ in prompts]
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), compute_in(settings.precision, device):
            for chunk in _plan_chunks(encoded, samples, max_new_tokens, settings.batch_rows):
                _generate_chunk(model, device, chunk, encoded, keys, settings, results, progress, governor)
    finally:
        model.train(was_training)
    return results  # type: ignore[return-value]


def stream_generate(model, prompt: str, settings: SamplingSettings = SamplingSettings()
                    ) -> Iterator[tuple[int, Completion | None]]:
    """One prompt, one sample, one token at a time: yields (token_id, None) for every token chosen,
    and (token_id, Completion) for the last one.

    The same decision rule as `generate(model, [prompt], settings)` (same masks, the same Gumbel stream
    for (seed, key, sample 0), the same stop rules), so the tokens and the final Completion equal that
    call's; it exists so a caller (the playground) can show each token as it is decided. A stop
    predicate is asked with prompt index 0.
    """
    cfg = model.config
    if settings.samples != 1:
        raise ValueError(f"stream_generate draws one sample, got samples={settings.samples}")
    settings.check([prompt], cfg.vocab_size)
    max_new_tokens = settings.max_new_tokens
    encoded = _TOKENIZER.encode(prompt, bos=True)
    if len(encoded) + max_new_tokens > cfg.max_sequence_length:
        raise ValueError(f"prompt is {len(encoded)} tokens (with BOS); plus max_new_tokens={max_new_tokens} "
                         f"that exceeds max_sequence_length {cfg.max_sequence_length}")
    device = next(model.parameters()).device
    noise = None
    if settings.temperature > 0:
        key = prompt if settings.keys is None else settings.keys[0]
        noise = gumbel_noise(settings.seed, key, 0, max_new_tokens, cfg.vocab_size).to(device)

    tokens: list[int] = []
    logprobs: list[float] = []
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), compute_in(settings.precision, device):
            cache = model.new_cache(1)
            logits = model(torch.tensor([encoded], dtype=torch.long, device=device), cache=cache).logits[:, -1]
            while True:
                choice, logprob = _choose_tokens(logits.float(), settings,
                                                 None if noise is None else noise[len(tokens)][None])
                token = int(choice.item())
                tokens.append(token)
                logprobs.append(float(logprob.item()))
                reason = _finish_reason(tokens, settings, 0)
                if reason is not None:
                    yield token, _completion(tokens, logprobs, settings, reason)
                    return
                yield token, None
                logits = model(torch.tensor([[token]], dtype=torch.long, device=device), cache=cache).logits[:, -1]
    finally:
        model.train(was_training)


def _plan_chunks(encoded: list[list[int]], samples: int, max_new_tokens: int, batch_rows: int):
    """Split the work into chunks of units (prompt index, sample indices) that decode together.

    Prompts are taken shortest first. A chunk holds at most `batch_rows` sample rows, and its prompt
    lengths differ by at most max_new_tokens: longer prompts are read one token per step alongside
    the shorter ones' sampling, which beats a separate chunk only while the difference is small.
    """
    units = []
    for p in sorted(range(len(encoded)), key=lambda i: (len(encoded[i]), i)):
        for start in range(0, samples, batch_rows):
            units.append((p, tuple(range(start, min(samples, start + batch_rows)))))
    chunk, rows, shortest = [], 0, 0
    for p, sample_ids in units:
        length = len(encoded[p])
        if chunk and (rows + len(sample_ids) > batch_rows or length - shortest > max_new_tokens):
            yield chunk
            chunk, rows = [], 0
        if not chunk:
            shortest = length
        chunk.append((p, sample_ids))
        rows += len(sample_ids)
    if chunk:
        yield chunk


def _generate_chunk(model, device, units, encoded, keys, settings: SamplingSettings, results,
                    progress, governor=None) -> None:
    """Decode one chunk in lockstep: prefill to the shortest prompt, then one token per step.

    The cache has one shared position, so every row has consumed the same number of its own tokens:
    a row whose prompt is longer is fed its next prompt token (no padding, so its state is exactly
    that of running alone), and when its prompt is consumed it is copied into one row per sample.
    """
    greedy = settings.temperature == 0.0
    eos = ByteTokenizer.eos_id
    lengths = [len(encoded[p]) for p, _ in units]
    slots = [(u, s) for u, (_, sample_ids) in enumerate(units) for s in sample_ids]
    unit_slots: list[list[int]] = [[] for _ in units]
    for slot, (u, _) in enumerate(slots):
        unit_slots[u].append(slot)
    tokens: list[list[int]] = [[] for _ in slots]
    logprobs: list[list[float]] = [[] for _ in slots]
    noise = None
    if not greedy:
        vocab = model.config.vocab_size
        noise = torch.stack([
            gumbel_noise(settings.seed, keys[units[u][0]], s, settings.max_new_tokens, vocab) for u, s in slots
        ]).to(device)  # [slots, max_new_tokens, V]

    start = min(lengths)
    cache = model.new_cache(len(units))
    prefill = torch.tensor([encoded[p][:start] for p, _ in units], dtype=torch.long, device=device)
    logits = model(prefill, cache=cache).logits[:, -1].float()
    rows = [_Row(unit=u) for u in range(len(units))]

    while True:
        position = cache.position
        # 1. Re-index the batch: prompts consumed now become one row per sample; finished rows go
        #    when there are enough of them (or anyway, since the cache is copied in this step).
        expanding = any(r.slot is None and lengths[r.unit] == position for r in rows)
        finished = sum(r.finished for r in rows)
        if expanding or (finished and finished >= _COMPACT_FRACTION * len(rows)):
            index, new_rows = [], []
            for i, row in enumerate(rows):
                if row.slot is None and lengths[row.unit] == position:
                    index.extend([i] * len(unit_slots[row.unit]))
                    new_rows.extend(_Row(row.unit, slot) for slot in unit_slots[row.unit])
                elif not row.finished:
                    index.append(i)
                    new_rows.append(row)
            if not new_rows:
                return
            index_tensor = torch.tensor(index, dtype=torch.long, device=device)
            cache.keep_rows(index_tensor)
            logits = logits.index_select(0, index_tensor)
            rows = new_rows

        # 2. Choose the next token of every sampling row.
        active = [i for i, r in enumerate(rows) if r.slot is not None and not r.finished]
        if active:
            active_index = torch.tensor(active, dtype=torch.long, device=device)
            row_noise = None
            if not greedy:
                slot_index = torch.tensor([rows[i].slot for i in active], dtype=torch.long, device=device)
                step_index = torch.tensor([len(tokens[rows[i].slot]) for i in active], dtype=torch.long,
                                          device=device)
                row_noise = noise[slot_index, step_index]
            choice, chosen_logprob = _choose_tokens(logits.index_select(0, active_index), settings, row_noise)
            done_now = 0
            for i, token, logprob in zip(active, choice.tolist(), chosen_logprob.tolist()):
                row = rows[i]
                slot = row.slot
                tokens[slot].append(token)
                logprobs[slot].append(logprob)
                reason = _finish_reason(tokens[slot], settings, units[row.unit][0])
                if reason is not None:
                    row.finished = True
                    done_now += 1
                    results[units[row.unit][0]][slots[slot][1]] = _completion(tokens[slot], logprobs[slot],
                                                                              settings, reason)
            if done_now and progress is not None:
                progress(done_now)

        # 3. Feed every row its next input: a prompt token, its new token, or EOS if it is finished.
        if all(r.finished for r in rows):
            return
        next_ids = []
        for row in rows:
            if row.slot is None:
                next_ids.append(encoded[units[row.unit][0]][position])
            elif row.finished:
                next_ids.append(eos)
            else:
                next_ids.append(tokens[row.slot][-1])
        step = torch.tensor(next_ids, dtype=torch.long, device=device)[:, None]
        logits = model(step, cache=cache).logits[:, -1].float()
        if governor is not None:
            governor.after_step()


def _choose_tokens(logits: torch.Tensor, settings: SamplingSettings, noise: torch.Tensor | None):
    """The decision rule shared by batched and streamed generation: mask, then argmax (greedy) or
    argmax of tempered/filtered scores plus the row's Gumbel noise [rows, V]. Returns (token ids [rows],
    their log-probs under the distribution they were drawn from [rows])."""
    masked = mask_logits(logits, settings.stop_name)
    if noise is None:
        scores = masked
        choice = masked.argmax(-1)
    else:
        scores = sampling_logits(masked, settings.temperature, settings.top_k, settings.top_p)
        choice = (scores + noise).argmax(-1)
    return choice, torch.log_softmax(scores, -1).gather(-1, choice[:, None])[:, 0]


def _finish_reason(token_ids: list[int], settings: SamplingSettings, prompt_index: int) -> str | None:
    last = token_ids[-1]
    if last == ByteTokenizer.eos_id and settings.stop_name != "none":
        return "eos"
    # The predicate (possibly costly: the coding rule parses) is asked only after its trigger tokens.
    predicate, triggers = settings.predicate, settings.trigger_ids
    if predicate is not None and (triggers is None or last in triggers) \
            and predicate(prompt_index, _TOKENIZER.decode(token_ids)):
        return settings.stop_name
    if len(token_ids) >= settings.max_new_tokens:
        return "cap"
    return None


def _completion(token_ids: list[int], logprobs: list[float], settings: SamplingSettings, reason: str) -> Completion:
    hit_cap = len(token_ids) == settings.max_new_tokens and token_ids[-1] != ByteTokenizer.eos_id
    return Completion(text=_TOKENIZER.decode(token_ids), token_ids=tuple(token_ids), hit_cap=hit_cap,
                      logprobs=tuple(logprobs), finish_reason=reason)


__all__ = [
    "BANNED_IDS",
    "Completion",
    "DEFAULT_BATCH_ROWS",
    "FINISH_REASONS",
    "GENERIC_STOPS",
    "SamplingSettings",
    "generate",
    "gumbel_noise",
    "mask_logits",
    "sampling_logits",
    "stream_generate",
    "stream_seed",
]
