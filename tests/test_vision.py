"""The miniature vision path: shapes, id order, scatter, patch/merge ordering, labels, gradients,
overfitting, parameter counts, digits, the CLI (smoke train, report, predict) and bad input."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from glm53_flash.cli import main
from glm53_flash.model.config import ModelConfig
from glm53_flash.model import GLM53Flash
from glm53_flash.data.tokenizer import ByteTokenizer
from glm53_flash.vision.baseline import DirectPatchVisionLanguageModel
from glm53_flash.vision.config import (
    IMAGE_TOKENS,
    MINIATURE_LM,
    MINIATURE_VISION,
    PILOT_MAX_SEQUENCE_LENGTH,
    PILOT_VISION,
    VisionConfig,
)
from glm53_flash.vision.digits import (
    DIGIT_SEGMENTS,
    DIGIT_TOKEN_IDS,
    PROMPT_LENGTH,
    SEGMENT_BOXES,
    digit_token_ids,
    render_digits,
)
from glm53_flash.vision.encoder import MiniGLMVisionEncoder
from glm53_flash.vision.evaluation import summarise_predictions
from glm53_flash.vision.language import VisionLanguageModel
from glm53_flash.vision.merger import SpatialMerger2x2
from glm53_flash.vision.models import (
    build_vision_model,
    meta_parameter_counts,
    parameter_count,
)
from glm53_flash.vision.pilot import extend_language_model, set_pilot_trainable
from glm53_flash.vision.predict import load_image, predict_digit, save_image
from glm53_flash.vision.run_config import VisionTrainCommandConfig, VisionTrainConfig
from glm53_flash.vision.sequence import (
    IGNORE_INDEX,
    answer_only_labels,
    build_multimodal_input_ids,
)
from glm53_flash.vision.weights import load_vision_model

TINY_LM = ModelConfig(vocab_size=263, dim=16, layers=1, heads=2, expert_hidden=24, experts=2, top_k=1, streams=2,
                      sparse_window=8, sparse_stride=8, max_sequence_length=64)
TINY_VISION = VisionConfig(image_size=16, patch_size=4, hidden_size=8, depth=2, heads=2, intermediate_size=16,
                           projection_intermediate_size=24)


def tiny_model(seed: int = 0) -> VisionLanguageModel:
    torch.manual_seed(seed)
    return VisionLanguageModel(GLM53Flash(TINY_LM), TINY_VISION)


def test_encoder_shapes(one_thread):
    torch.manual_seed(0)
    encoder = MiniGLMVisionEncoder(TINY_VISION, lm_dim=16)
    images = torch.rand(3, 3, 16, 16)
    tokens, grid = encoder.patch_embed(images)
    assert tokens.shape == (3, 16, 8) and grid == (4, 4)
    for block in encoder.blocks:
        assert block(tokens).shape == tokens.shape
    merged = encoder.merger(encoder.post_norm(tokens), grid)
    assert merged.shape == (3, 4, 16)
    assert encoder.projector(merged).shape == (3, 4, 16)
    assert encoder(images).shape == (3, 4, 16)
    assert MiniGLMVisionEncoder(MINIATURE_VISION, 32)(torch.rand(2, 3, 32, 32)).shape == (2, 16, 32)


def test_multimodal_id_order_and_placement():
    ids = build_multimodal_input_ids(torch.tensor([[1, 10, 11]]), 4)
    assert ids.tolist() == [[1, 260, 261, 261, 261, 261, 262, 10, 11]]
    # no BOS in any row: the span goes first
    assert build_multimodal_input_ids(torch.tensor([[10, 11]]), 2).tolist() == [[260, 261, 261, 262, 10, 11]]
    with pytest.raises(ValueError, match="mixes rows"):
        build_multimodal_input_ids(torch.tensor([[1, 10], [10, 11]]), 2)


def test_placeholder_rows_equal_encoder_output(one_thread):
    model = tiny_model().eval()
    images = torch.rand(2, 3, 16, 16)
    text = torch.tensor([[1, 10, 11], [1, 12, 13]])
    embedded = model.embed_multimodal(images, text)
    visual = model.vision(images)
    n = model.visual_token_count
    assert embedded.shape == (2, 3 + n + 2, 16)
    torch.testing.assert_close(embedded[:, 2:2 + n], visual)
    table = model.language_model.embedding.weight
    torch.testing.assert_close(embedded[:, 0], table[1].expand(2, -1))  # BOS
    torch.testing.assert_close(embedded[:, 1], table[IMAGE_TOKENS.start].expand(2, -1))
    torch.testing.assert_close(embedded[:, 2 + n], table[IMAGE_TOKENS.end].expand(2, -1))
    torch.testing.assert_close(embedded[:, -2:], table[text[:, 1:]])


def test_baseline_prepends_sixteen_vectors_before_bos(one_thread):
    torch.manual_seed(0)
    model = DirectPatchVisionLanguageModel(GLM53Flash(TINY_LM), patch_size=4, image_size=16)
    images, text = torch.rand(2, 3, 16, 16), torch.tensor([[1, 10], [1, 11]])
    embedded = model.embed_multimodal(images, text)
    assert model.boundary_token_count == 0 and model.inserted_token_count == 16 and not model.glm_faithful
    torch.testing.assert_close(embedded[:, :16], model.vision(images))
    torch.testing.assert_close(embedded[:, 16], model.language_model.embedding.weight[1].expand(2, -1))


def test_patch_tokens_are_row_major_patches(one_thread):
    torch.manual_seed(0)
    encoder = MiniGLMVisionEncoder(TINY_VISION, lm_dim=16)
    embed = encoder.patch_embed
    images = torch.rand(2, 3, 16, 16)
    tokens, (h, w) = embed(images)
    weight = embed.proj.weight.reshape(8, -1)  # [C, 3*4*4]
    for r in range(h):
        for c in range(w):
            patch = images[:, :, 4 * r:4 * r + 4, 4 * c:4 * c + 4].reshape(2, -1)
            expected = patch @ weight.T + embed.proj.bias + embed.position[0, r * w + c]
            torch.testing.assert_close(tokens[:, r * w + c], expected)


def test_merge_groups_2x2_squares_not_raster_runs(one_thread):
    torch.manual_seed(0)
    merger = SpatialMerger2x2(in_dim=3, out_dim=5)
    h = w = 4
    tokens = torch.randn(2, h * w, 3)
    out = merger(tokens, (h, w))
    # explicit reference: block (i, j) takes patches (2i+dy, 2j+dx), features in (channel, dy, dx) order
    for i in range(h // 2):
        for j in range(w // 2):
            quad = torch.stack([tokens[:, (2 * i + dy) * w + 2 * j + dx] for dy in (0, 1) for dx in (0, 1)], dim=-1)
            features = quad.reshape(2, -1)  # [B, C * 4] in (C, dy, dx) order
            torch.testing.assert_close(out[:, i * (w // 2) + j], merger.proj(features))
    # and it is a stride-2 convolution over the token grid
    grid = tokens.transpose(1, 2).reshape(2, 3, h, w)
    conv = F.conv2d(grid, merger.proj.weight.reshape(5, 3, 2, 2), merger.proj.bias, stride=2)
    torch.testing.assert_close(out, conv.flatten(2).transpose(1, 2))
    # the raster mistake (four consecutive tokens of one row) gives a different answer
    raster = merger.proj(tokens.reshape(2, h * w // 4, 4, 3).transpose(2, 3).reshape(2, -1, 12))
    assert not torch.allclose(raster, out, atol=1e-4)


def test_answer_only_labels():
    tokens = torch.tensor([ByteTokenizer().encode("Digit: 7", bos=True)])
    labels = answer_only_labels(tokens, PROMPT_LENGTH, 16, 2)
    assert labels.shape == (1, 18 + 8)
    supervised = (labels != IGNORE_INDEX).nonzero().tolist()
    assert supervised == [[0, 18 + PROMPT_LENGTH - 1]] and labels[0, -1] == ord("7") + 4
    base = answer_only_labels(tokens, PROMPT_LENGTH, 16, 0)
    assert base.shape == (1, 24) and (base != IGNORE_INDEX).nonzero().tolist() == [[0, 23]]
    for bad in (0, 9):
        with pytest.raises(ValueError, match="prompt_length"):
            answer_only_labels(tokens, bad, 16)


def test_forward_labels_and_gradient_reach_every_vision_part(one_thread):
    model = tiny_model()
    tokens = torch.tensor([ByteTokenizer().encode("Digit: 7", bos=True)])
    out = model(torch.rand(1, 3, 16, 16), tokens[:, :-1])
    inserted = model.inserted_token_count
    assert out.logits.shape == (1, inserted + tokens.shape[1] - 1, 263)
    assert out.usage.shape == (1, 2)
    labels = answer_only_labels(tokens, PROMPT_LENGTH, model.visual_token_count)
    loss = F.cross_entropy(out.logits.reshape(-1, 263), labels.reshape(-1), ignore_index=IGNORE_INDEX)
    loss.backward()
    for name, p in model.vision.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


@pytest.mark.slow
def test_two_image_overfit(one_thread):
    model = tiny_model(seed=1)
    images = torch.zeros(2, 3, 16, 16)
    images[0, 0, :, 6:10] = 1.0  # red vertical bar -> "0"
    images[1, 1, 6:10, :] = 1.0  # green horizontal bar -> "1"
    tokens = digit_token_ids([0, 1])
    labels = answer_only_labels(tokens, PROMPT_LENGTH, model.visual_token_count)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(100):
        logits = model(images, tokens[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, 263), labels.reshape(-1), ignore_index=IGNORE_INDEX)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.25 * losses[0]
    with torch.no_grad():
        predicted = model(images, tokens[:, :-1]).logits[:, -1].argmax(-1)
    assert predicted.tolist() == [DIGIT_TOKEN_IDS[0], DIGIT_TOKEN_IDS[1]]


def test_parameter_counts_match_the_original():
    torch.manual_seed(0)
    faithful, baseline = build_vision_model("faithful"), build_vision_model("baseline")
    assert parameter_count(faithful) == 60_924 and parameter_count(faithful.vision) == 25_144
    assert parameter_count(baseline) == 42_500 and parameter_count(baseline.vision) == 6_720
    assert parameter_count(faithful.language_model) == parameter_count(baseline.language_model) == 35_780
    # the pilot, on the meta device (real modules, no memory)
    with torch.device("meta"):
        pilot = VisionLanguageModel(extend_language_model(None), PILOT_VISION)
    set_pilot_trainable(pilot)
    assert parameter_count(pilot) == 25_875_576
    assert parameter_count(pilot, trainable_only=True) == 2_335_136
    assert parameter_count(pilot.vision) == 144_408
    assert parameter_count(pilot.language_model) == 25_731_168
    assert pilot.language_model.config.max_sequence_length == PILOT_MAX_SEQUENCE_LENGTH
    frozen = [n for n, p in pilot.named_parameters() if not p.requires_grad]
    assert frozen and all(n.startswith("language_model.blocks.") and not n.startswith("language_model.blocks.11.")
                          for n in frozen)
    assert meta_parameter_counts("faithful", MINIATURE_LM, MINIATURE_VISION)["parameter_count"] == 60_924


def test_pilot_extension_copies_the_checkpoint_rows(one_thread):
    torch.manual_seed(0)
    source = GLM53Flash(TINY_LM.replace(vocab_size=260))
    torch.manual_seed(1)
    lm = extend_language_model(source)
    assert lm.config.vocab_size == 263
    torch.testing.assert_close(lm.embedding.weight[:260], source.embedding.weight)
    assert not torch.allclose(lm.embedding.weight[260:], torch.zeros(3, 16))
    for name, tensor in source.state_dict().items():
        if name != "embedding.weight":
            torch.testing.assert_close(lm.state_dict()[name], tensor)
    with pytest.raises(ValueError, match="vocab_size 260"):
        extend_language_model(GLM53Flash(TINY_LM))


def test_digit_generator_constants_and_determinism():
    a, b = render_digits([3, 8], seed=5), render_digits([3, 8], seed=5)
    assert a.shape == (2, 3, 32, 32) and torch.equal(a, b)
    assert a.min() >= 0 and a.max() <= 1
    assert not torch.equal(a, render_digits([3, 8], seed=6))
    # without noise, the lit pixels are exactly the digit's shifted segment boxes, drawn in the documented order
    clean = render_digits(list(range(10)), seed=11, noise=0.0)
    generator = torch.Generator().manual_seed(11)
    for digit in range(10):
        dy = int(torch.randint(-2, 3, (1,), generator=generator))
        dx = int(torch.randint(-2, 3, (1,), generator=generator))
        colour = 0.55 + 0.45 * torch.rand(3, generator=generator)
        intensity = 0.8 + 0.2 * torch.rand(1, generator=generator)
        mask = torch.zeros(32, 32, dtype=torch.bool)
        for segment in DIGIT_SEGMENTS[digit]:
            y0, y1, x0, x1 = SEGMENT_BOXES[segment]
            mask[max(0, y0 + dy):min(32, y1 + dy), max(0, x0 + dx):min(32, x1 + dx)] = True
        assert torch.equal(clean[digit].sum(0) > 0, mask), digit
        torch.testing.assert_close(clean[digit][:, mask], (colour * intensity)[:, None].expand(3, int(mask.sum())))
    with pytest.raises(ValueError, match="0..9"):
        render_digits([10], seed=0)


def test_image_ids_decode_and_evaluate_without_error():
    tokenizer = ByteTokenizer()
    assert tokenizer.decode([260, 261, 262]) == ""
    assert tokenizer.decode([ord("7") + 4, 261, 999, -3]) == "7"
    logits = torch.zeros(4, 263)
    for row, token in enumerate((260, 261, 262, DIGIT_TOKEN_IDS[3])):
        logits[row, token] = 5.0
    record = summarise_predictions(logits, torch.tensor([0, 1, 2, 3]), render_seed=0)
    assert record["correct"] == 1 and record["prediction_ids"] == [260, 261, 262, DIGIT_TOKEN_IDS[3]]
    assert [s["prediction"] for s in record["samples"]] == ["", "", "", "3"]
    assert [row[10] for row in record["confusion"]["matrix"][:3]] == [1, 1, 1]  # the "other" column


def test_grey_16_bit_and_transparent_images_read_like_the_digits(tmp_path):
    from PIL import Image

    ramp = torch.arange(64 * 64, dtype=torch.int32).view(64, 64) % 1000  # 16-bit values far above 255
    Image.fromarray(ramp.numpy().astype("uint16")).save(tmp_path / "grey16.png")
    grey = load_image(tmp_path / "grey16.png", 32)
    assert 0.0 <= float(grey.min()) < 0.1 and 0.85 < float(grey.max()) <= 1.0  # scaled, not clipped to white
    clear = Image.new("RGBA", (40, 40), (255, 255, 255, 0))  # fully transparent white
    clear.save(tmp_path / "clear.png")
    assert float(load_image(tmp_path / "clear.png", 32).max()) == 0.0  # composited onto the black background
    (tmp_path / "bomb.txt").write_text("not an image")
    with pytest.raises(ValueError, match="not a readable image"):
        load_image(tmp_path / "bomb.txt", 32)


def test_image_file_round_trip_and_resize(tmp_path):
    image = render_digits([4], seed=2)[0]
    save_image(image, tmp_path / "four.png")
    loaded = load_image(tmp_path / "four.png", 32)
    assert loaded.shape == (1, 3, 32, 32)
    assert (loaded[0] - image).abs().max() <= 0.5 / 255 + 1e-6
    save_image(torch.nn.functional.interpolate(image[None], size=64)[0], tmp_path / "big.png")
    assert load_image(tmp_path / "big.png", 32).shape == (1, 3, 32, 32)
    (tmp_path / "junk.png").write_text("not an image")
    with pytest.raises(ValueError, match="not a readable image"):
        load_image(tmp_path / "junk.png", 32)


def test_bad_inputs_raise_clear_errors(one_thread):
    with pytest.raises(ValueError, match="in_channels must be 3"):
        VisionConfig(in_channels=1)
    with pytest.raises(ValueError, match="multiple of patch_size"):
        VisionConfig(image_size=30)
    with pytest.raises(ValueError, match="multiple of heads"):
        VisionConfig(hidden_size=10, heads=4)
    model = tiny_model()
    text = torch.tensor([[1, 10]])
    with pytest.raises(ValueError, match=r"images must have shape \[batch, 3, 16, 16\]"):
        model(torch.rand(1, 3, 32, 32), text)
    with pytest.raises(ValueError, match="2 images for 1 text rows"):
        model(torch.rand(2, 3, 16, 16), text)
    with pytest.raises(ValueError, match=r"text_ids must lie in \[0, 263\)"):
        model(torch.rand(1, 3, 16, 16), torch.tensor([[1, 300]]))
    with pytest.raises(ValueError, match="exactly 4 placeholder"):
        model(torch.rand(1, 3, 16, 16), torch.tensor([[1, 261]]))
    with pytest.raises(ValueError, match="no room for the image ids"):
        VisionLanguageModel(GLM53Flash(TINY_LM.replace(vocab_size=260)), TINY_VISION)
    with pytest.raises(ValueError, match="unknown architecture"):
        build_vision_model("resnet")


@pytest.mark.slow
def test_cli_smoke_train_report_and_predict(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["vision", "train", "--smoke-test", "--steps", "12", "--seeds", "1,2", "--eval-examples", "20",
                 "--output", str(out), "--save-weights", "--no-progress"])
    assert code == 0
    receipt = json.loads((out / "receipt.json").read_text())
    assert receipt["config"]["smoke_test"] and receipt["config"]["steps"] == 12
    assert receipt["config"]["batch_size"] == 20  # the smoke cap
    assert [(r["seed"], r["architecture"]) for r in receipt["results"]] == [
        (1, "faithful"), (1, "baseline"), (2, "faithful"), (2, "baseline")]
    assert {r["parameter_count"] for r in receipt["results"]} == {60_924, 42_500}
    assert receipt["command"][:3] == ["glm53", "vision", "train"] and "--smoke-test" in receipt["command"]
    run_config = receipt["run_config"]  # every field of the run's configs, as given (before the smoke caps)
    assert set(run_config) == {f.name for f in dataclasses.fields(VisionTrainConfig)} | {
        f.name for f in dataclasses.fields(VisionTrainCommandConfig)}
    assert run_config["seeds"] == [1, 2] and run_config["steps"] == 12 and run_config["architecture"] == "both"
    assert len(receipt["comparison"]["per_seed"]) == 2
    # the two arms of a seed saw the same held-out images
    assert receipt["results"][0]["after"]["targets"] == receipt["results"][1]["after"]["targets"]

    report = tmp_path / "report"
    assert main(["vision", "report", "--train", str(out / "receipt.json"), "--output", str(report)]) == 0
    summary = json.loads((report / "summary.json").read_text())
    table = summary["headline_table"]
    assert len(table["rows"]) == 2 and all(len(row) == len(table["columns"]) for row in table["rows"])
    assert summary["answers"] and all(isinstance(a, str) for a in summary["answers"])
    assert (report / "REPORT.md").read_text().startswith("# Vision")
    assert (report / "vision-comparison.png").stat().st_size > 1000
    assert main(["vision", "report", "--train", str(out / "receipt.json"), "--output", str(report)]) == 2

    png = tmp_path / "seven.png"
    assert main(["vision", "render", "7", str(png), "--seed", "3"]) == 0
    capsys.readouterr()
    weights = out / "weights" / "faithful-seed1"
    assert main(["vision", "predict", "--weights", str(weights), str(png), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    model, config = load_vision_model(weights)
    assert config["architecture"] == "faithful"
    assert printed == predict_digit(model, load_image(png, 32))


def test_vision_training_in_each_precision(monkeypatch):
    """--precision: fp32 is the default and what runs did before the choice (the same losses, bit for bit,
    as a run that does not name it); bf16 runs the language model's products in bf16 (the rows rule lowered
    so the miniature's few rows take it), changes the losses a little, and the receipt says which ran."""
    from glm53_flash.model import precision as precision_module
    from glm53_flash.vision.training import run_vision_training

    def run(**precision):
        cfg = VisionTrainConfig(architectures=("faithful",), steps=3, batch_size=10, eval_examples=10,
                                progress=False, **precision)
        receipt = run_vision_training(cfg)
        return receipt["precision"], receipt["results"][0]["training_loss_curve"]

    (default, default_curve), (fp32, fp32_curve) = run(), run(precision="fp32")
    assert default["name"] == fp32["name"] == "fp32" and default_curve == fp32_curve
    monkeypatch.setattr(precision_module, "BF16_MIN_ROWS", 1)
    bf16, bf16_curve = run(precision="bf16")
    assert bf16["name"] == "bf16" and bf16["requested"] == "bf16"
    assert bf16_curve != fp32_curve and max(abs(a - b) / b for a, b in zip(bf16_curve, fp32_curve)) < 0.05


def test_cli_bad_input_is_a_one_line_error(tmp_path, capsys):
    assert main(["vision", "predict", "--weights", str(tmp_path / "missing"), str(tmp_path / "x.png")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["vision", "train", "--eval-examples", "5", "--no-progress"]) == 2
    assert "eval_examples must be >= 10" in capsys.readouterr().err
    assert main(["vision", "train", "--save-weights", "--no-progress"]) == 2
    assert "--save-weights needs --output" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["vision", "train", "--architecture", "resnet"])


def test_cli_pilot_from_a_checkpoint(tmp_path, capsys, one_thread):
    from glm53_flash.train.checkpoint import save_checkpoint

    torch.manual_seed(0)
    checkpoint = tmp_path / "checkpoint-0001"
    save_checkpoint(checkpoint, GLM53Flash(TINY_LM.replace(vocab_size=260)), {"step": 1})
    out = tmp_path / "pilot"
    code = main(["vision", "pilot", "--checkpoint", str(checkpoint), "--steps", "3", "--eval-examples", "10",
                 "--device", "cpu", "--precision", "auto", "--output", str(out), "--save-weights", "--no-progress"])
    receipt = json.loads((out / "receipt.json").read_text())
    assert receipt["precision"]["requested"] == "auto" and receipt["precision"]["name"] in ("fp32", "bf16")
    assert code == (0 if receipt["learned_at_all"] else 1)
    assert receipt["initialization"]["source"] == "local_pretraining_checkpoint"
    assert receipt["initialization"]["checkpoint_step"] == 1 and receipt["initialization"]["checkpoint_weights_sha256"]
    model_info = receipt["model"]
    parts = model_info["trainable_by_component"]
    assert model_info["trainable_parameters"] == sum(parts.values())
    assert model_info["language_model"]["vocab_size"] == 263
    assert [r["step"] for r in receipt["optimization"]["loss_trace"]] == [1, 3]
    assert receipt["optimization"]["completed_steps"] == 3 and receipt["data"]["held_out_seed"] == 100073
    png = tmp_path / "two.png"
    save_image(render_digits([2], seed=9)[0], png)
    capsys.readouterr()
    assert main(["vision", "predict", "--weights", str(out / "weights"), str(png)]) == 0
    assert capsys.readouterr().out.strip()  # a digit or "no digit (...)", never a crash
    wrong = tmp_path / "checkpoint-0002"
    save_checkpoint(wrong, GLM53Flash(TINY_LM), {"step": 2})
    assert main(["vision", "pilot", "--checkpoint", str(wrong), "--output", str(tmp_path / "p2"), "--device", "cpu",
                 "--no-progress"]) == 2
    assert "vocab_size 260" in capsys.readouterr().err
