"""Tokenizers: exact round trips, save/load as a plain tokenizer.json, one-line errors."""

import json

import pytest
import tokenizers
from _support import assert_one_line
from hypothesis import given, settings
from hypothesis import strategies as st

from lm.config.errors import DataError
from lm.data.tokenizer import EOD, PAD, UNK, TextTokenizer, train_tokenizer

CORPUS = [
    "The quick brown fox\njumps over the lazy dog.\n\n",
    "  indented\tline with tabs\r\nand CRLF; ünïcödé, 日本語, emoji 😀\n",
    "def f(x):\n    return x ** 2  # <eod> and <pad> are plain text here\n",
]
TEXT = "".join(CORPUS)


@pytest.fixture(scope="module", params=["char", "byte", "bpe"])
def tok(request):
    return train_tokenizer(request.param, CORPUS, vocab_size=300)


def test_round_trip_is_exact(tok):
    for text in [*CORPUS, TEXT, "", " ", "\n\n", "x <eod> y"]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text


def test_specials_are_ids_never_text(tok):
    ids = tok.encode(f"a{EOD}b{PAD}")
    assert tok.eod_id not in ids and tok.pad_id not in ids
    assert tok.decode([tok.pad_id, *tok.encode("ab"), tok.pad_id]) == "ab"
    assert tok.decode([*tok.encode("ab"), tok.eod_id]) == "ab" + EOD
    assert len({tok.pad_id, tok.eod_id}) == 2


def test_encode_batch_matches_encode(tok):
    assert tok.encode_batch(CORPUS) == [tok.encode(t) for t in CORPUS]


def test_save_load_and_plain_tokenizers_agree(tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    loaded = TextTokenizer.load(path)
    assert loaded.to_json() == tok.to_json()
    assert (loaded.vocab_size, loaded.pad_id, loaded.eod_id, loaded.unk_id) == (
        tok.vocab_size,
        tok.pad_id,
        tok.eod_id,
        tok.unk_id,
    )
    assert loaded.encode(TEXT) == tok.encode(TEXT)
    plain = tokenizers.Tokenizer.from_file(str(path))
    # Other tools match "<eod>" typed in text as the special token, so compare on text without.
    text = CORPUS[0] + CORPUS[1]
    assert plain.encode(text, add_special_tokens=False).ids == tok.encode(text)
    assert plain.token_to_id(PAD) == tok.pad_id and plain.token_to_id(EOD) == tok.eod_id


def test_char_vocabulary_is_the_training_characters():
    tok = train_tokenizer("char", CORPUS)
    assert tok.vocab_size == len(set(TEXT)) + 3
    assert tok.unk_id is not None
    assert len(tok.encode("日本語")) == 3
    assert tok.count_unknown(TEXT) == 0
    ids = tok.encode("fox€€ox")  # € never occurs in the corpus
    assert ids.count(tok.unk_id) == 2
    assert tok.count_unknown("fox€€ox") == 2
    assert tok.decode(ids) == f"fox{UNK}{UNK}ox"


def test_byte_tokenizer_has_every_byte_and_no_unknown():
    tok = train_tokenizer("byte", [])
    assert tok.vocab_size == 256 + 2
    assert tok.unk_id is None
    assert tok.count_unknown("anything €") == 0
    assert len(tok.encode("é")) == 2  # two UTF-8 bytes


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_byte_round_trips_any_string(text):
    assert BYTE.decode(BYTE.encode(text)) == text


@settings(max_examples=100, deadline=None)
@given(st.text())
def test_bpe_round_trips_any_string(text):
    assert BPE.decode(BPE.encode(text)) == text


BYTE = train_tokenizer("byte", [])
BPE = train_tokenizer("bpe", CORPUS * 20, vocab_size=300)


def test_bpe_learns_merges_up_to_vocab_size():
    assert 258 < BPE.vocab_size <= 300
    assert len(BPE.encode(TEXT)) < len(BYTE.encode(TEXT))


def test_bpe_vocab_too_small_for_bytes_and_specials():
    with pytest.raises(DataError) as e:
        train_tokenizer("bpe", CORPUS, vocab_size=100)
    assert_one_line(e, "data.vocab_size", "100", "258")


def test_load_missing_file(tmp_path):
    with pytest.raises(DataError) as e:
        TextTokenizer.load(tmp_path / "nope.json")
    assert_one_line(e, "nope.json", "no such")


@pytest.mark.parametrize("content", ["not json at all", "{}", json.dumps({"model": 3})])
def test_load_file_that_is_not_a_tokenizer(tmp_path, content):
    path = tmp_path / "tokenizer.json"
    path.write_text(content)
    with pytest.raises(DataError) as e:
        TextTokenizer.load(path)
    assert_one_line(e, str(path), "not a tokenizer.json")


def test_load_tokenizer_without_our_specials(tmp_path):
    plain = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "?": 1}, unk_token="?"))
    path = tmp_path / "tokenizer.json"
    plain.save(str(path))
    with pytest.raises(DataError) as e:
        TextTokenizer.load(path)
    assert_one_line(e, str(path), PAD, EOD)


def test_training_on_dataset_rows_instead_of_text_is_refused():
    with pytest.raises(TypeError, match="str"):
        train_tokenizer("char", [{"text": "rows of a dataset are dicts"}])
