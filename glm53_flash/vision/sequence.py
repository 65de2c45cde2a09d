"""Multimodal id sequences and answer-only labels.

The image span `[start] [placeholder] x n [end]` goes right after BOS, the way GLM-5.3-Flash wraps an
image in begin/end-of-image tokens inside the text; the placeholders are later overwritten by the
encoder's visual vectors.
"""

from __future__ import annotations

import torch

from glm53_flash.vision.config import IMAGE_TOKENS, ImageTokenIds

IGNORE_INDEX = -100


def check_text_ids(text_ids, vocab_size: int) -> None:
    """A clear error for anything that is not a [B, T] integer tensor of ids below vocab_size."""
    if not isinstance(text_ids, torch.Tensor) or text_ids.dim() != 2 or text_ids.shape[1] < 1:
        shape = tuple(text_ids.shape) if isinstance(text_ids, torch.Tensor) else type(text_ids).__name__
        raise ValueError(f"text_ids must be a [batch, time] tensor with time >= 1, got {shape}")
    if text_ids.is_floating_point() or text_ids.is_complex() or text_ids.dtype == torch.bool:
        raise ValueError(f"text_ids must have an integer dtype, got {text_ids.dtype}")
    if int(text_ids.min()) < 0 or int(text_ids.max()) >= vocab_size:
        raise ValueError(f"text_ids must lie in [0, {vocab_size}), got values in "
                         f"[{int(text_ids.min())}, {int(text_ids.max())}]")


def build_multimodal_input_ids(text_ids: torch.Tensor, visual_token_count: int,
                               token_ids: ImageTokenIds = IMAGE_TOKENS) -> torch.Tensor:
    """text_ids [B, T] -> [B, T + n + 2]: after BOS when every row starts with BOS, else at the front."""
    check_text_ids(text_ids, max(token_ids.start, token_ids.placeholder, token_ids.end) + 1)
    if visual_token_count < 1:
        raise ValueError(f"visual_token_count must be >= 1, got {visual_token_count}")
    b = text_ids.shape[0]
    span = torch.tensor([token_ids.start] + [token_ids.placeholder] * visual_token_count + [token_ids.end],
                        dtype=text_ids.dtype, device=text_ids.device).expand(b, -1)
    starts_with_bos = text_ids[:, 0] == token_ids.bos
    if bool(starts_with_bos.all()):
        return torch.cat((text_ids[:, :1], span, text_ids[:, 1:]), dim=1)
    if not bool(starts_with_bos.any()):
        return torch.cat((span, text_ids), dim=1)
    raise ValueError("text_ids mixes rows that start with BOS and rows that do not; the image span "
                     "position would differ between rows")


def answer_only_labels(token_ids: torch.Tensor, prompt_length: int, visual_token_count: int,
                       boundary_token_count: int = 2) -> torch.Tensor:
    """Labels [B, inserted + T - 1] for the input token_ids[:, :-1] with the image span inserted.

    Every position is IGNORE_INDEX except those whose next token is an answer token: the answer
    token_ids[:, prompt_length:] is predicted from positions inserted + prompt_length - 1 onward.
    """
    if token_ids.dim() != 2:
        raise ValueError(f"token_ids must have shape [batch, time], got {tuple(token_ids.shape)}")
    b, t = token_ids.shape
    if not 1 <= prompt_length < t:
        raise ValueError(f"prompt_length must be in [1, {t}) for {t} tokens, got {prompt_length}")
    if visual_token_count < 0 or boundary_token_count < 0:
        raise ValueError("visual_token_count and boundary_token_count must be >= 0")
    inserted = visual_token_count + boundary_token_count
    labels = torch.full((b, inserted + t - 1), IGNORE_INDEX, dtype=torch.long, device=token_ids.device)
    first = inserted + prompt_length - 1
    labels[:, first:] = token_ids[:, prompt_length:].long()
    return labels
