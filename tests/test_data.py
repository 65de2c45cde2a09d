import pytest
import torch

from glm53_flash.data.batches import IGNORE_INDEX, encode_examples, label_tokens, pretraining_batch


def test_compatible_token_counts():
    # step 1 (1-based) = batch index 0 with B=32, seq_len=128
    _, labels = pretraining_batch(0, 32, 128)
    assert label_tokens(labels) == 3360
    assert sum(label_tokens(pretraining_batch(s, 32, 128)[1]) for s in range(100)) == 345_995


def test_batch_layout():
    inputs, labels = pretraining_batch(3, 4, 128)
    assert inputs.shape == labels.shape == (4, 128) and inputs.dtype == torch.long
    assert (inputs[:, 0] == 1).all()  # BOS first
    assert torch.equal(inputs[:, 1:][labels[:, :-1] != IGNORE_INDEX], labels[:, :-1][labels[:, :-1] != IGNORE_INDEX])
    for row in labels:
        real = row[row != IGNORE_INDEX]
        assert real[-1] == 2  # EOS is the last label
        assert (row[len(real):] == IGNORE_INDEX).all()  # padding only at the end


def test_too_long_example_is_a_clear_error():
    with pytest.raises(ValueError, match="does not fit sequence length 10"):
        encode_examples(["x" * 20], 10)
