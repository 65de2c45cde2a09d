"""Pretraining batches from a task suite's stream (the original's, compatible, by default).

Each example is BOS + text + EOS, right-padded with PAD to seq_len + 1; inputs drop the last
position, labels drop the first, and PAD labels become -100 (ignored by the loss). Batch `step`
(0-based) with batch size B holds stream examples step*B .. step*B + B - 1, as in the original.
"""

from __future__ import annotations

import numpy as np
import torch

from glm53_flash.tasks import PRETRAINING_SEED, compositions, pretraining_text
from glm53_flash.data.tokenizer import ByteTokenizer

IGNORE_INDEX = -100
_TOKENIZER = ByteTokenizer()


def encode_examples(texts: list[str], seq_len: int) -> np.ndarray:
    """Encode texts into a [N, seq_len + 1] int64 array of BOS+bytes+EOS, PAD on the right."""
    rows = np.full((len(texts), seq_len + 1), _TOKENIZER.pad_id, dtype=np.int64)
    for i, text in enumerate(texts):
        ids = _TOKENIZER.encode(text, bos=True, eos=True)
        if len(ids) > seq_len + 1:
            raise ValueError(
                f"example of {len(ids)} tokens (with BOS/EOS) does not fit sequence length {seq_len} "
                f"(at most {seq_len + 1}); raise --sequence-length"
            )
        rows[i, : len(ids)] = ids
    return rows


def rows_to_batch(rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Shift encoded rows into (inputs, labels), PAD labels ignored."""
    tokens = torch.from_numpy(np.ascontiguousarray(rows))
    inputs = tokens[:, :-1].clone()
    labels = tokens[:, 1:].clone()
    labels[labels == _TOKENIZER.pad_id] = IGNORE_INDEX
    return inputs, labels


# The stream of each suite: example index, seed -> text (prompt + reference completion).
STREAMS = {"families": pretraining_text, compositions.SUITE: compositions.pretraining_text}


def pretraining_rows(first_example: int, count: int, seq_len: int, seed: int = PRETRAINING_SEED,
                     tasks: str = "families") -> np.ndarray:
    if tasks not in STREAMS:
        raise ValueError(f"unknown task suite {tasks!r}; allowed: {', '.join(STREAMS)}")
    stream = STREAMS[tasks]
    texts = [stream(first_example + j, seed) for j in range(count)]
    return encode_examples(texts, seq_len)


def pretraining_batch(step: int, batch_size: int, seq_len: int, seed: int = PRETRAINING_SEED,
                      tasks: str = "families"):
    """(inputs, labels) for 0-based `step`: stream examples step*B .. step*B+B-1."""
    if step < 0 or batch_size < 1:
        raise ValueError(f"need step >= 0 and batch_size >= 1, got step={step}, batch_size={batch_size}")
    return rows_to_batch(pretraining_rows(step * batch_size, batch_size, seq_len, seed, tasks))


def label_tokens(labels: torch.Tensor) -> int:
    return int((labels != IGNORE_INDEX).sum())
