"""Byte-level tokenizer: one token per UTF-8 byte plus four specials.

Mirrors the role of GLM-5.3-Flash's tokenizer, but instead of a learned byte-level BPE vocabulary
(154,880 entries) it maps every UTF-8 byte b to id b + 4, so any text round-trips exactly and the
embedding table stays tiny (260 rows). Compatible with the original miniature's tokenizer.
"""

from __future__ import annotations

from typing import Iterable


class ByteTokenizer:
    """UTF-8 bytes shifted by four; ids 0..3 are PAD, BOS, EOS, SEP.

    ``decode`` never raises on any integer id: it stops at the first EOS, drops PAD/BOS/SEP,
    and decodes every id outside the byte range (negative ids, the image ids 260-262 that the
    vision path adds, or anything larger) to nothing. Invalid UTF-8 becomes U+FFFD.
    """

    pad_id = 0
    bos_id = 1
    eos_id = 2
    sep_id = 3
    byte_offset = 4
    vocab_size = 260

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"ByteTokenizer.encode expects str, got {type(text).__name__}")
        ids = [b + self.byte_offset for b in text.encode("utf-8")]
        if bos:
            ids.insert(0, self.bos_id)
        if eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        data = bytearray()
        for raw in ids:
            i = int(raw)
            if i == self.eos_id:
                break
            if self.byte_offset <= i < self.vocab_size:
                data.append(i - self.byte_offset)
        return data.decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------------- prompts

MAX_PROMPT_CHARS = 1_000


class PromptError(ValueError):
    """A prompt refused before generating; `status` is the HTTP status a server answers with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def check_prompt(prompt) -> str:
    """The prompt rules shared by `glm53 generate --prompt` and the playground's `/api/generate`:
    a non-empty string of at most MAX_PROMPT_CHARS characters that encodes as UTF-8 (the tokenizer
    turns it into one id per byte). Returns the prompt; PromptError (a ValueError, status 400)
    names the broken rule otherwise."""
    if not isinstance(prompt, str):
        raise PromptError(f"prompt must be a string, got {type(prompt).__name__}")
    if not prompt:
        raise PromptError("prompt is empty: give at least one character for the model to continue")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise PromptError(f"prompt has {len(prompt):,} characters; at most {MAX_PROMPT_CHARS:,} are allowed")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PromptError(f"prompt is not valid UTF-8 text: character {error.start + 1} "
                              f"({ascii(prompt[error.start])}) has no UTF-8 encoding") from None
    return prompt
