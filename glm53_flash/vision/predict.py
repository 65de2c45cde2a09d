"""Reading any RGB image file into the model's input and naming the digit in it.

Pillow reads the file (PNG, JPEG, ...), converts it to RGB (see `to_rgb` for 16-bit grey and
transparency) and resizes it to the model's square size (32x32) with bilinear filtering; pixel
values become floats in [0, 1].
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from glm53_flash.data.tokenizer import ByteTokenizer
from glm53_flash.vision.digits import id_to_digit
from glm53_flash.vision.evaluation import predict_ids


def to_rgb(image):
    """Any Pillow image -> 8-bit RGB as the digits are drawn: EXIF rotation applied, 16-bit and float
    grey scaled to 0-255 (not clipped), transparency composited onto black (the digits' background)."""
    from PIL import Image, ImageOps

    image = ImageOps.exif_transpose(image)
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        grey = image.convert("F")
        low, high = grey.getextrema()
        scale = 255.0 / (high - low) if high > low else 0.0
        image = grey.point(lambda value: (value - low) * scale).convert("L")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (0, 0, 0, 255))
        image = Image.alpha_composite(background, rgba)
    return image.convert("RGB")


def load_image(path: str | Path, size: int) -> torch.Tensor:
    """An image file -> [1, 3, size, size] in [0, 1]."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image {path} does not exist")
    try:
        with Image.open(path) as image:
            rgb = to_rgb(image).resize((size, size), Image.Resampling.BILINEAR)
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as error:
        raise ValueError(f"{path} is not a readable image ({error})") from None
    data = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8).view(size, size, 3)
    return data.permute(2, 0, 1).float().div(255.0).unsqueeze(0)


def save_image(image: torch.Tensor, path: str | Path) -> Path:
    """[3, H, W] in [0, 1] -> an 8-bit RGB PNG (or any format Pillow infers from the suffix)."""
    from PIL import Image

    if image.dim() != 3 or image.shape[0] != 3:
        raise ValueError(f"image must have shape [3, height, width], got {tuple(image.shape)}")
    pixels = (image.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.numpy()).save(path)  # uint8 [H, W, 3] is RGB
    return path


def predict_digit(model: nn.Module, image: torch.Tensor) -> dict:
    """image [1, 3, S, S] -> {digit (or None), text, token_id, probability, top: 3 most likely ids}."""
    logits = predict_ids(model, image)[0]
    probs = torch.softmax(logits, dim=-1)
    top = probs.topk(3)
    tokenizer = ByteTokenizer()
    token_id = int(top.indices[0])
    return {
        "digit": id_to_digit(token_id),
        "text": tokenizer.decode([token_id]),
        "token_id": token_id,
        "probability": round(float(top.values[0]), 6),
        "top": [{"token_id": int(i), "text": tokenizer.decode([int(i)]), "probability": round(float(p), 6)}
                for p, i in zip(top.values, top.indices)],
    }
