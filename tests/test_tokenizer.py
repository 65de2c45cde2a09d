import pytest
from hypothesis import given, strategies as st

from glm53_flash import ByteTokenizer

tok = ByteTokenizer()


@given(st.text())
def test_round_trip_arbitrary_text(text):
    assert tok.decode(tok.encode(text, bos=True, eos=True)) == text


def test_known_ids_and_specials():
    ids = tok.encode("def f(x):\n    return x + 1\n", bos=True, eos=True)
    assert ids[0] == tok.bos_id == 1 and ids[-1] == tok.eos_id == 2
    assert tok.encode("\n +*2r") == [14, 36, 47, 46, 54, 118]
    assert tok.encode("é") == [0xC3 + 4, 0xA9 + 4]
    assert (tok.pad_id, tok.sep_id, tok.vocab_size) == (0, 3, 260)


@given(st.lists(st.integers(min_value=-10**6, max_value=10**6), max_size=200))
def test_decode_never_raises(ids):
    assert isinstance(tok.decode(ids), str)


def test_decode_rules():
    # stops at EOS, drops PAD/BOS/SEP and out-of-range ids (image ids 260-262 included)
    assert tok.decode([1, 0, 3, 104 + 4, 260, 261, 262, -5, 999, 105 + 4, 2, 120]) == "hi"
    # invalid UTF-8 becomes the replacement character
    assert tok.decode([0xFF + 4, ord("a") + 4]) == "\ufffda"


def test_encode_rejects_non_str():
    for bad in (b"bytes", 3, None, ["a"]):
        with pytest.raises(TypeError, match="expects str"):
            tok.encode(bad)
