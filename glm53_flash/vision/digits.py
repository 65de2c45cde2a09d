"""Seven-segment RGB digits: the generated image task of the vision path (nothing is downloaded).

Same constants and draw order as the original miniature: per image a shift (y, then x) in {-2..2},
an RGB colour 0.55 + 0.45 * U^3, an intensity 0.8 + 0.2 * U; lit segments painted as colour x
intensity; then non-negative noise 0.06 * U for the whole batch at once and a clamp to [0, 1].
"""

from __future__ import annotations

import torch

from glm53_flash.data.tokenizer import ByteTokenizer

IMAGE_SIZE = 32
NOISE = 0.06
# Segment boxes (y0, y1, x0, x1), end-exclusive, on the 32x32 canvas before the shift.
SEGMENT_BOXES = {
    "a": (4, 7, 8, 24), "g": (14, 17, 8, 24), "d": (25, 28, 8, 24),
    "f": (6, 15, 5, 8), "b": (6, 15, 24, 27), "e": (16, 26, 5, 8), "c": (16, 26, 24, 27),
}
DIGIT_SEGMENTS = ("abcdef", "bc", "abged", "abgcd", "fgbc", "afgcd", "afgecd", "abc", "abcdefg", "abfgcd")

PROMPT = "Digit: "
TOKENIZER = ByteTokenizer()
PROMPT_LENGTH = len(TOKENIZER.encode(PROMPT, bos=True))  # 8: BOS + 7 bytes


def render_digits(labels, seed: int, noise: float = NOISE) -> torch.Tensor:
    """labels (N digits 0-9) -> images [N, 3, 32, 32] in [0, 1], fully determined by `seed`."""
    labels = [int(v) for v in (labels.tolist() if isinstance(labels, torch.Tensor) else labels)]
    bad = [v for v in labels if not 0 <= v <= 9]
    if bad:
        raise ValueError(f"digit labels must be in 0..9, got {bad[:5]}")
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    images = torch.zeros(len(labels), 3, IMAGE_SIZE, IMAGE_SIZE)
    for i, digit in enumerate(labels):
        shift_y = int(torch.randint(-2, 3, (1,), generator=generator))
        shift_x = int(torch.randint(-2, 3, (1,), generator=generator))
        colour = 0.55 + 0.45 * torch.rand(3, generator=generator)
        intensity = 0.8 + 0.2 * torch.rand(1, generator=generator)
        paint = (colour * intensity).view(3, 1, 1)
        for segment in DIGIT_SEGMENTS[digit]:
            y0, y1, x0, x1 = SEGMENT_BOXES[segment]
            y0, y1 = _clip(y0 + shift_y), _clip(y1 + shift_y)
            x0, x1 = _clip(x0 + shift_x), _clip(x1 + shift_x)
            images[i, :, y0:y1, x0:x1] = paint
    if noise:
        images = images + noise * torch.rand(images.shape, generator=generator)
    return images.clamp(0.0, 1.0)


def _clip(value: int) -> int:
    return max(0, min(IMAGE_SIZE, value))


def digit_token_ids(labels) -> torch.Tensor:
    """labels [N] -> ids [N, 9]: BOS + "Digit: " + the digit's byte (no EOS)."""
    rows = [TOKENIZER.encode(f"{PROMPT}{int(d)}", bos=True) for d in labels]
    return torch.tensor(rows, dtype=torch.long)


def prompt_ids(count: int) -> torch.Tensor:
    """[count, 8]: the prompt alone, which evaluation and prediction feed."""
    return torch.tensor([TOKENIZER.encode(PROMPT, bos=True)] * count, dtype=torch.long)


DIGIT_TOKEN_IDS = tuple(TOKENIZER.encode(str(d))[0] for d in range(10))  # ids of "0".."9"


def id_to_digit(token_id: int) -> int | None:
    """The digit an id stands for, or None for any other id (including image ids 260-262)."""
    try:
        return DIGIT_TOKEN_IDS.index(int(token_id))
    except ValueError:
        return None
