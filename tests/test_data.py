"""Data: sources, validation splits, the token-id cache, batches, and one-line errors."""

import dataclasses
import json
import time

import datasets
import numpy as np
import pytest
import torch
from _support import assert_one_line

from lm.config.errors import ConfigError, DataError
from lm.config.sections import DataConfig
from lm.data.batches import PaddedCollator, TrainBatches, eval_batches
from lm.data.sources import TokenizedSplit, prepare_data
from lm.data.tasks import repeats
from lm.data.tokenizer import TextTokenizer


def quiet(message):
    pass


def prepare(**data):
    return prepare_data(DataConfig(**data), log=quiet)


def documents(split, tokenizer):
    """The text of every document of a split; each must end with <eod>."""
    texts = []
    for a, b in zip(split.offsets[:-1], split.offsets[1:], strict=True):
        assert split.tokens[b - 1] == tokenizer.eod_id
        texts.append(tokenizer.decode(split.tokens[a : b - 1]))
    return texts


def write_lines(path, lines):
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# PaddedCollator


def test_collator_right_padding_by_hand():
    batch = PaddedCollator(pad_id=0)([[1, 2, 3, 4], np.array([5, 6])])
    assert batch["input_ids"].tolist() == [[1, 2, 3], [5, 0, 0]]
    assert batch["targets"].tolist() == [[2, 3, 4], [6, 0, 0]]
    assert batch["key_mask"].tolist() == [[True, True, True], [True, False, False]]
    assert batch["loss_mask"].tolist() == batch["key_mask"].tolist()
    assert int(batch["loss_mask"].sum()) == 3 + 1
    assert batch["input_ids"].dtype == torch.int64 and batch["loss_mask"].dtype == torch.bool


def test_collator_left_padding_by_hand():
    batch = PaddedCollator(pad_id=9, padding_side="left")([[1, 2, 3, 4], [5, 6]])
    assert batch["input_ids"].tolist() == [[1, 2, 3], [9, 9, 5]]
    assert batch["targets"].tolist() == [[2, 3, 4], [9, 9, 6]]
    assert batch["key_mask"].tolist() == [[True, True, True], [False, False, True]]
    assert int(batch["loss_mask"].sum()) == 4


def test_collator_pad_to_multiple_of():
    batch = PaddedCollator(pad_id=0, pad_to_multiple_of=4)([[1, 2, 3], [4, 5]])
    assert batch["input_ids"].tolist() == [[1, 2, 0, 0], [4, 0, 0, 0]]
    assert int(batch["loss_mask"].sum()) == 3
    assert PaddedCollator(0, pad_to_multiple_of=4)([[1, 2, 3, 4, 5]])["input_ids"].shape == (1, 4)


def test_collator_max_length_truncates_and_caps_rounding():
    right = PaddedCollator(pad_id=0, max_length=2)([[1, 2, 3, 4], [5, 6]])
    assert right["input_ids"].tolist() == [[1, 2], [5, 0]]
    assert right["targets"].tolist() == [[2, 3], [6, 0]]
    # Left padding serves generation: a long prompt keeps its end.
    left = PaddedCollator(pad_id=0, padding_side="left", max_length=2)([[1, 2, 3, 4], [5, 6]])
    assert left["input_ids"].tolist() == [[2, 3], [0, 5]]
    assert left["targets"].tolist() == [[3, 4], [0, 6]]
    capped = PaddedCollator(pad_id=0, pad_to_multiple_of=8, max_length=5)([[1, 2, 3]])
    assert capped["input_ids"].shape == (1, 5)


def test_collator_rejects_sequences_with_nothing_to_predict():
    with pytest.raises(ValueError, match="sequence 1"):
        PaddedCollator(pad_id=0)([[1, 2], [3]])


# ---------------------------------------------------------------------------------------------
# Sources


def test_builtin_python_docs_loads_offline():
    from pydoc_data.topics import topics

    data = prepare(source="builtin:python-docs", tokenizer="byte")
    texts = documents(data.train, data.tokenizer) + documents(data.val, data.tokenizer)
    assert texts == [topics[k] for k in sorted(topics)]
    assert data.val.n_docs == len(topics) - int(len(topics) * 0.9)


def test_txt_file_one_document_per_line(tmp_path):
    path = write_lines(tmp_path / "a.txt", ["l1 ü4", "l2", "", "l3", "l4 ü"])
    data = prepare(source=str(path), split_by="line", tokenizer="char", val_fraction=0.25)
    assert documents(data.train, data.tokenizer) == ["l1 ü4", "l2", "l3"]  # blank line skipped
    assert documents(data.val, data.tokenizer) == ["l4 ü"]


def test_char_vocabulary_comes_from_the_training_split(tmp_path):
    path = write_lines(tmp_path / "a.txt", ["abc", "abc", "abc", "abz"])
    messages = []
    data = prepare_data(
        DataConfig(source=str(path), split_by="line", tokenizer="char", val_fraction=0.25),
        log=messages.append,
    )
    assert documents(data.val, data.tokenizer) == ["ab<unk>"]
    assert any("1 validation characters are not in the vocabulary" in m for m in messages)


def test_txt_file_one_document_per_paragraph(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("p1 a\np1 b\n\np2\n\np3\n\np4", encoding="utf-8")
    data = prepare(source=str(path), split_by="paragraph", tokenizer="byte", val_fraction=0.25)
    assert documents(data.train, data.tokenizer) == ["p1 a\np1 b", "p2", "p3"]
    assert documents(data.val, data.tokenizer) == ["p4"]


def test_txt_folder_and_glob_one_document_per_file(tmp_path):
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    texts = {"a.txt": "first\nfile\n", "b.txt": "second", "sub/c.txt": "third\n\n"}
    for name, text in texts.items():
        (folder / name).write_text(text, encoding="utf-8")
    (folder / "notes.md").write_text("not a .txt file")
    for source in (folder, folder / "**" / "*.txt"):
        data = prepare(source=str(source), tokenizer="byte", val_fraction=0.3)
        train, val = documents(data.train, data.tokenizer), documents(data.val, data.tokenizer)
        assert train + val == list(texts.values())
        assert len(val) == 1


def test_jsonl_with_a_named_text_field(tmp_path):
    path = tmp_path / "c.jsonl"
    records = [{"id": i, "body": f"document {i}\nwith two lines"} for i in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    data = prepare(source=str(path), text_field="body", tokenizer="byte")
    texts = documents(data.train, data.tokenizer) + documents(data.val, data.tokenizer)
    assert texts == [r["body"] for r in records]
    assert data.val.n_docs == 1


def test_parquet(tmp_path):
    path = tmp_path / "c.parquet"
    texts = [f"parquet document {i} 😀" for i in range(10)]
    datasets.Dataset.from_dict({"text": texts, "n": list(range(10))}).to_parquet(str(path))
    data = prepare(source=str(path), tokenizer="byte", max_documents=5, val_fraction=0.2)
    assert documents(data.train, data.tokenizer) == texts[:4]
    assert documents(data.val, data.tokenizer) == texts[4:5]


def test_unknown_builtin_lists_the_builtins():
    with pytest.raises(ConfigError) as e:  # at load, before any data is read
        prepare(source="builtin:shakespeare")
    assert_one_line(e, "builtin:shakespeare", "builtin:python-docs", "builtin:copy")


def test_builtin_repeats_writes_each_sequence_of_distinct_letters_twice_from_the_seed():
    data = prepare(source="builtin:repeats", task_lengths="3-9", task_examples=60)
    texts = documents(data.train, data.tokenizer) + documents(data.val, data.tokenizer)
    assert len(texts) == 60 and len(documents(data.val, data.tokenizer)) == 6
    for text in texts:
        n = len(text) // 2
        assert text[:n] == text[n:] and len(set(text[:n])) == n, text  # unique earlier copies
        assert text.isascii() and text.isalpha()
    assert {len(t) // 2 for t in texts} == set(range(3, 10))
    assert texts == repeats(range(3, 10), 60, seed=1337)  # data.seed's default
    assert repeats(range(3, 10), 60, seed=1338) != texts
    every = repeats(range(52, 53), 1, seed=1)[0]
    assert sorted(every[:52]) == sorted("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def test_builtin_repeats_draws_with_replacement_when_not_distinct():
    # Olsson et al.'s random tokens: a letter may recur within a sequence, so a letter already
    # read may be the next one of the first copy (docs/heads.md: what distinct letters teach).
    data = prepare(source="builtin:repeats", task_lengths="20-40", repeats_distinct=False)
    texts = documents(data.train, data.tokenizer) + documents(data.val, data.tokenizer)
    assert texts == repeats(range(20, 41), 20000, seed=1337, distinct=False)
    assert all(t[: len(t) // 2] == t[len(t) // 2 :] for t in texts)
    recurring = [t for t in texts if len(set(t[: len(t) // 2])) < len(t) // 2]
    assert len(recurring) > 0.9 * len(texts)  # 20 of 52 letters repeat one with p = 0.98
    distinct = prepare(source="builtin:repeats", task_lengths="20-40")  # not the same cache
    assert documents(distinct.train, distinct.tokenizer) != documents(data.train, data.tokenizer)
    long = DataConfig(source="builtin:repeats", task_lengths="60", repeats_distinct=False)
    assert len(repeats(long.task_ranges()[0], 1, 1, distinct=False)[0]) == 120  # past 52
    with pytest.raises(ConfigError) as e:
        DataConfig(source="builtin:copy", repeats_distinct=False)
    assert_one_line(e, "data.repeats_distinct", "builtin:repeats only")


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"task_lengths": "1-53"}, ["data.task_lengths", "distinct letters", "at most 52"]),
        ({"task_eval_lengths": "1-10"}, ["data.task_eval_lengths", "repeats reads task_lengths"]),
        ({"task_examples": 1}, ["data.task_examples", "at least 2"]),
    ],
)
def test_builtin_repeats_refuses_what_it_cannot_write_in_one_line(settings, words):
    with pytest.raises(ConfigError) as e:
        DataConfig(source="builtin:repeats", **settings)
    assert_one_line(e, *words)


def test_hub_id_offline_fails_fast_in_one_line():
    start = time.monotonic()
    with pytest.raises(DataError) as e:
        prepare(source="someone/some-dataset", tokenizer="byte")
    assert_one_line(e, "someone/some-dataset", "Hub", "offline")
    assert time.monotonic() - start < 10


def test_hub_unreachable_fails_before_any_retry(monkeypatch):
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("retried the Hub"))
    start = time.monotonic()
    with pytest.raises(DataError) as e:
        prepare(source="someone/some-dataset", tokenizer="byte")
    assert_one_line(e, "someone/some-dataset", "could not be reached", "HF_HUB_OFFLINE")
    assert time.monotonic() - start < 10


# ---------------------------------------------------------------------------------------------
# Validation split


def test_tail_split_of_one_document_is_nanogpts_character_split(tmp_path):
    text = "".join(f"line {i}: to be or not to be\n" for i in range(37))
    path = tmp_path / "input.txt"
    path.write_text(text, encoding="utf-8")
    data = prepare(source=str(path), tokenizer="char")
    n = len(text)
    assert documents(data.train, data.tokenizer) == [text[: int(n * 0.9)]]
    assert documents(data.val, data.tokenizer) == [text[int(n * 0.9) :]]


def test_tail_split_keeps_order_and_never_overlaps(tmp_path):
    lines = [f"doc {i}" for i in range(20)]
    path = write_lines(tmp_path / "a.txt", lines)
    data = prepare(source=str(path), split_by="line", tokenizer="char", val_fraction=0.2)
    assert documents(data.train, data.tokenizer) == lines[:16]
    assert documents(data.val, data.tokenizer) == lines[16:]


def test_random_split_is_seeded_and_disjoint(tmp_path, monkeypatch):
    lines = [f"doc {i}" for i in range(30)]
    path = write_lines(tmp_path / "a.txt", lines)

    def split(seed, cache):
        monkeypatch.setenv("LM_CACHE", str(tmp_path / cache))
        data = prepare(
            source=str(path), split_by="line", tokenizer="char", val_split="random", seed=seed
        )
        return documents(data.train, data.tokenizer), documents(data.val, data.tokenizer)

    train, val = split(1, "one")
    assert split(1, "two") == (train, val)  # a fresh cache draws the same documents
    assert len(val) == 3 and not set(train) & set(val)
    assert sorted(train + val) == sorted(lines)
    assert train == [line for line in lines if line in train]  # source order kept
    assert split(2, "three")[1] != val


def test_random_split_needs_two_documents(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("just one document")
    with pytest.raises(DataError) as e:
        prepare(source=str(path), val_split="random")
    assert_one_line(e, "data.val_split", "only one")


def test_split_leaving_training_empty(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("x")
    with pytest.raises(DataError) as e:
        prepare(source=str(path))
    assert_one_line(e, "data.val_fraction", "training split empty")


# ---------------------------------------------------------------------------------------------
# Cache


def test_second_call_reads_the_cache(tmp_path, monkeypatch):
    path = write_lines(tmp_path / "a.txt", [f"line {i}" for i in range(50)])
    cfg = DataConfig(source=str(path), split_by="line", tokenizer="bpe", vocab_size=280)
    first = prepare_data(cfg, log=quiet)
    files = sorted(first.cache_path.iterdir())
    assert [f.name for f in files] == [
        "meta.json",
        "train.bin",
        "train.idx",
        "val.bin",
        "val.idx",
    ]
    mtimes = [f.stat().st_mtime_ns for f in files]

    def fail(*args, **kwargs):
        pytest.fail("the second call read or tokenized the source again")

    monkeypatch.setattr(datasets, "load_dataset", fail)
    monkeypatch.setattr(datasets.Dataset, "map", fail)
    # A padded run (lm compare) shares the tokenizer and the token ids.
    second = prepare_data(dataclasses.replace(cfg, mode="padded"), log=quiet)
    assert second.cache_path == first.cache_path
    assert [f.stat().st_mtime_ns for f in files] == mtimes
    assert second.tokenizer.to_json() == first.tokenizer.to_json()
    np.testing.assert_array_equal(second.train.tokens, first.train.tokens)

    # A run's own tokenizer.json (resume) finds the same cache.
    first.tokenizer.save(tmp_path / "tokenizer.json")
    resumed = prepare_data(cfg, tokenizer_path=tmp_path / "tokenizer.json", log=quiet)
    assert resumed.cache_path == first.cache_path


def test_changed_source_is_tokenized_again(tmp_path):
    path = write_lines(tmp_path / "a.txt", ["one", "two"])
    first = prepare(source=str(path), split_by="line", tokenizer="byte")
    write_lines(path, ["one", "two", "three"])
    second = prepare(source=str(path), split_by="line", tokenizer="byte")
    assert second.cache_path != first.cache_path
    assert second.train.n_docs == 2 and second.val.n_docs == 1


def test_cache_layout_and_dtype(tmp_path):
    path = write_lines(tmp_path / "a.txt", ["ab", "cd", "ef"])
    data = prepare(source=str(path), split_by="line", tokenizer="char", val_fraction=0.3)
    assert data.train.tokens.dtype == np.uint16 and isinstance(data.train.tokens, np.memmap)
    assert data.train.offsets.dtype == np.int64
    assert data.train.offsets.tolist() == [0, 3, 6] and data.train.n_tokens == 6
    meta = json.loads((data.cache_path / "meta.json").read_text())
    assert meta["vocab_size"] == data.tokenizer.vocab_size
    assert meta["train"] == {"documents": 2, "tokens": 6}


def test_parallel_tokenization_matches_one_process(tmp_path, monkeypatch):
    path = write_lines(tmp_path / "a.txt", [f"line {i} " * (i % 7) for i in range(1, 200)])
    one = prepare(source=str(path), split_by="line", tokenizer="byte", num_proc=1)
    monkeypatch.setenv("LM_CACHE", str(tmp_path / "other"))
    two = prepare(source=str(path), split_by="line", tokenizer="byte", num_proc=2)
    np.testing.assert_array_equal(one.train.tokens, two.train.tokens)
    np.testing.assert_array_equal(one.train.offsets, two.train.offsets)


# ---------------------------------------------------------------------------------------------
# Bad inputs: one line each, naming the problem


def test_missing_path(tmp_path):
    with pytest.raises(DataError) as e:
        prepare(source=str(tmp_path / "nope.txt"))
    assert_one_line(e, "nope.txt", "no such file")


def test_empty_file_and_empty_folder(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError) as e:
        prepare(source=str(tmp_path / "empty.txt"))
    assert_one_line(e, "empty.txt", "no text")
    (tmp_path / "nothing").mkdir()
    with pytest.raises(DataError) as e:
        prepare(source=str(tmp_path / "nothing"))
    assert_one_line(e, "nothing", "no .txt")
    with pytest.raises(DataError) as e:
        prepare(source=str(tmp_path / "nothing" / "*.txt"))
    assert_one_line(e, "no files match")


def test_file_that_is_not_utf8(tmp_path):
    good = write_lines(tmp_path / "a.txt", ["fine"])
    bad = tmp_path / "b.txt"
    bad.write_bytes("caf\u00e9\n".encode("latin-1"))
    with pytest.raises(DataError) as e:
        prepare(source=str(tmp_path / "*.txt"))
    assert_one_line(e, str(bad), "not UTF-8")
    assert str(good) not in str(e.value)


def test_jsonl_record_without_the_text_field(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "a"}\n{"body": "b"}\n{"text": "c"}\n')
    with pytest.raises(DataError) as e:
        prepare(source=str(path))
    assert_one_line(e, str(path), "record 2", "'text'")
    with pytest.raises(DataError) as e:
        prepare(source=str(path), text_field="title")
    assert_one_line(e, str(path), "'title'", "data.text_field")


def test_jsonl_that_is_not_json(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("plain text, not JSON\n")
    with pytest.raises(DataError) as e:
        prepare(source=str(path))
    assert_one_line(e, str(path), "json")


def test_vocab_too_small_for_the_specials(tmp_path):
    path = write_lines(tmp_path / "a.txt", ["some", "text"])
    with pytest.raises(DataError) as e:
        prepare(source=str(path), tokenizer="bpe", vocab_size=200)
    assert_one_line(e, "data.vocab_size", "200")


def test_tokenizer_path_that_is_not_a_tokenizer(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"hello": "world"}')
    with pytest.raises(DataError) as e:
        prepare(tokenizer=str(bad))
    assert_one_line(e, str(bad), "not a tokenizer.json")


# ---------------------------------------------------------------------------------------------
# Training batches


def stream(n_docs=12, eod=0):
    """A TokenizedSplit of documents with ids 1.. and lengths 3..; eod is 0."""
    docs = [np.append(np.arange(1, 3 + i % 9), eod) for i in range(n_docs)]
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    return TokenizedSplit(np.concatenate(docs).astype(np.uint16), offsets)


PACKED = DataConfig(mode="packed")
PACKED_MASKED = DataConfig(mode="packed", document_mask=True)
PADDED = DataConfig(mode="padded")


@pytest.mark.parametrize("cfg", [PACKED, PACKED_MASKED, PADDED], ids=["packed", "mask", "padded"])
def test_step_is_a_function_of_seed_and_step(cfg):
    split = stream(40)
    a = TrainBatches(split, cfg, 8, 8, 2, pad_id=99, seed=3)
    b = TrainBatches(split, cfg, 8, 8, 2, pad_id=99, seed=3)
    for step in (5, 0, 5, 123):
        (ma, na), (mb, nb) = a.step(step), b.step(step)
        assert na == nb and len(ma) == 2
        for x, y in zip(ma, mb, strict=True):
            assert x.keys() == y.keys()
            for key in x:
                assert torch.equal(x[key], y[key])
    assert not torch.equal(a.step(1)[0][0]["input_ids"], a.step(2)[0][0]["input_ids"])


@pytest.mark.parametrize("cfg", [PACKED_MASKED, PADDED], ids=["packed", "padded"])
def test_ranks_and_micro_batches_partition_the_global_batch(cfg):
    split = stream(40)
    ref_micro, ref_count = TrainBatches(split, cfg, 6, 8, 1, 99, seed=1).step(7)
    reference = ref_micro[0]
    for grad_accum, world in ((2, 1), (1, 2), (2, 2), (4, 2)):
        parts = {}
        for rank in range(world):
            batches = TrainBatches(split, cfg, 6, 8, grad_accum, 99, 1, rank, world)
            micro, count = batches.step(7)
            assert count == ref_count
            for m, batch in enumerate(micro):
                parts[m * world + rank] = batch
        for key, value in reference.items():
            # Padded micro-batches are padded to their own longest row: widen them back.
            fill = False if value.dtype == torch.bool else 99
            glued = torch.full_like(value, fill)
            for p in sorted(parts):
                part = parts[p][key]
                glued[p * len(part) : (p + 1) * len(part), : part.shape[1]] = part
            assert torch.equal(glued, value), key


def test_packed_windows_are_slices_of_the_stream():
    split = stream(30)
    micro, count = TrainBatches(split, PACKED, 10, 4, 1, 99, seed=0).step(2)
    batch = micro[0]
    assert count == 4 * 10 and batch["input_ids"].shape == (4, 10)
    assert batch["key_mask"].all() and batch["loss_mask"].all()
    assert torch.equal(batch["input_ids"][:, 1:], batch["targets"][:, :-1])
    tokens = torch.from_numpy(split.tokens.astype(np.int64))
    for row in torch.cat([batch["input_ids"], batch["targets"][:, -1:]], dim=1):
        starts = [s for s in range(len(tokens) - 10) if torch.equal(tokens[s : s + 11], row)]
        assert starts


def test_segment_ids_restart_after_each_eod():
    micro, _ = TrainBatches(stream(30), PACKED_MASKED, 16, 6, 1, 99, seed=5).step(0)
    batch = micro[0]
    seg, ids = batch["segment_ids"], batch["input_ids"]
    assert seg.dtype == torch.int64 and (seg[:, 0] == 0).all()
    new_doc = ids[:, :-1] == 0  # an input after <eod> starts the next document
    assert torch.equal(seg[:, 1:] - seg[:, :-1], new_doc.long())
    assert "segment_ids" not in TrainBatches(stream(30), PACKED, 16, 6, 1, 99, 5).step(0)[0][0]


def test_a_padded_batch_is_as_wide_as_its_longest_row_and_the_mean_width_says_so():
    lengths = [3 + (i * 5) % 11 for i in range(24)]  # 3 to 13 tokens: rows of 2 to 12 targets
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    split = TokenizedSplit(np.arange(offsets[-1], dtype=np.uint16), offsets)
    batches = TrainBatches(split, PADDED, 32, 4, 2, pad_id=9999, seed=2)
    widths = []
    for step in range(batches.batches_per_epoch):
        for b in batches.step(step)[0]:
            longest = int(b["key_mask"].sum(dim=1).max())
            assert b["input_ids"].shape[1] == longest
            widths.append(longest)
    assert batches.mean_width == pytest.approx(np.mean(widths)) and batches.mean_width < 12
    assert TrainBatches(split, PACKED, 16, 4, 1, pad_id=9999, seed=2).mean_width == 16


def test_padded_epoch_uses_each_chunk_at_most_once_and_reports_its_padding():
    # Token ids = positions, so a target identifies its place in the split.
    lengths = [3 + (i * 5) % 11 for i in range(24)]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    split = TokenizedSplit(np.arange(offsets[-1], dtype=np.uint16), offsets)
    batches = TrainBatches(split, PADDED, 4, 4, 2, pad_id=9999, seed=2)
    seen, real, slots = [], 0, 0
    for step in range(batches.batches_per_epoch):
        micro, count = batches.step(step)
        assert count == sum(int(b["loss_mask"].sum()) for b in micro)
        for b in micro:
            assert b["input_ids"].shape[1] <= 4
            real += int(b["loss_mask"].sum())
            slots += b["loss_mask"].numel()
            seen += b["targets"][b["loss_mask"]].tolist()
    assert len(seen) == len(set(seen))
    n_chunks = sum(-(-(n - 1) // 4) for n in lengths)
    assert len(seen) > sum(lengths) - len(lengths) - 4 * 4  # at most one batch waits
    assert batches.batches_per_epoch == n_chunks // 4
    assert batches.padding_fraction == pytest.approx(1 - real / slots)
    # Document 1 (ids 3..10) is cut into pieces sharing one token: 3..7 and 7..10.
    first = next(eval_batches(split, PADDED, 4, 100, pad_id=9999))
    rows = zip(first["input_ids"], first["targets"], first["key_mask"], strict=True)
    pieces = {(tuple(i[m].tolist()), tuple(t[m].tolist())) for i, t, m in rows}
    assert ((3, 4, 5, 6), (4, 5, 6, 7)) in pieces
    assert ((7, 8, 9), (8, 9, 10)) in pieces


def test_packed_stream_too_short(tmp_path):
    with pytest.raises(DataError) as e:
        TrainBatches(stream(1), PACKED, 64, 4, 1, 99, seed=0)
    assert_one_line(e, "has 3 tokens", "context_length=64", "66")


def test_padded_split_smaller_than_one_batch():
    with pytest.raises(DataError) as e:
        TrainBatches(stream(3), PADDED, 64, 4, 1, 99, seed=0)
    assert_one_line(e, "3 padded sequences", "train.batch_size=4")


def test_batch_size_must_split_into_ranks_and_micro_batches():
    with pytest.raises(ConfigError) as e:
        TrainBatches(stream(30), PACKED, 8, 6, 4, 99, seed=0)
    assert_one_line(e, "train.batch_size", "6")


# ---------------------------------------------------------------------------------------------
# Evaluation batches


def targets_seen(batches):
    return [t for b in batches for t in b["targets"][b["loss_mask"]].tolist()]


def test_packed_eval_predicts_every_token_but_the_first_once():
    split = stream(7)
    tokens = split.tokens.astype(np.int64).tolist()
    for T in (4, 5, 1000):  # 1000: longer than the split, and than any trained context
        batches = list(eval_batches(split, PACKED_MASKED, T, 3, pad_id=99))
        assert targets_seen(batches) == tokens[1:]
        for b in batches:
            assert (b["segment_ids"][:, 1:] >= b["segment_ids"][:, :-1]).all()
        ranks = [list(eval_batches(split, PACKED, T, 3, 99, rank=r, world_size=2)) for r in (0, 1)]
        assert sorted(targets_seen(ranks[0] + ranks[1])) == sorted(tokens[1:])


def test_padded_eval_chunks_every_document():
    split = stream(9)
    batches = list(eval_batches(split, PADDED, 3, 4, pad_id=99))
    expected = []
    for a, b in zip(split.offsets[:-1], split.offsets[1:], strict=True):
        expected += split.tokens[a + 1 : b].tolist()
    assert sorted(targets_seen(batches)) == sorted(expected)
    assert all(b["input_ids"].shape[1] <= 3 for b in batches)
    limited = list(eval_batches(split, PADDED, 3, 4, pad_id=99, max_batches=2))
    assert len(limited) == 2


@pytest.fixture(params=["under a file", "immutable"])
def unwritable_cache(request, tmp_path, monkeypatch):
    """LM_CACHE where nothing can be written, even by root (whom permission bits do not stop,
    and the suite runs as root): a folder under a regular file (mkdir: Not a directory), or an
    immutable folder (``chattr +i``: Operation not permitted; skipped where chattr is refused)."""
    import shutil
    import subprocess

    if request.param == "under a file":
        (tmp_path / "file").write_text("not a folder")
        cache = tmp_path / "file" / "lm"
    else:
        cache = tmp_path / "immutable"
        cache.mkdir()
        chattr = shutil.which("chattr")
        if not chattr or subprocess.run([chattr, "+i", str(cache)], capture_output=True).returncode:
            pytest.skip("chattr +i is not available here")
        request.addfinalizer(lambda: subprocess.run([chattr, "-i", str(cache)], check=True))
    monkeypatch.setenv("LM_CACHE", str(cache))
    return cache


def test_a_cache_that_cannot_be_written_tokenizes_into_a_folder_of_its_own(
    unwritable_cache, tmp_path
):
    path = write_lines(tmp_path / "a.txt", [f"line {i}" for i in range(50)])
    cfg = DataConfig(source=str(path), split_by="line", tokenizer="bpe", vocab_size=280)
    said: list[str] = []
    data = prepare_data(cfg, log=said.append)
    warned = [line for line in said if line.startswith("lm: warning: ")]
    assert len(warned) == 1 and f"the cache {unwritable_cache} cannot be written (" in warned[0]
    assert data.train.n_docs == 45 and documents(data.val, data.tokenizer)[0] == "line 45"
    assert not data.cache_path.exists()  # the temporary folder is gone; the ids stay mapped
    assert not unwritable_cache.exists() or not list(unwritable_cache.iterdir())


def test_lm_train_beside_a_cache_that_cannot_be_written_trains_and_says_so(
    unwritable_cache, tmp_path, capsys
):
    from _support import write_config

    from lm.cli import main

    config = write_config(
        tmp_path / "c.yaml",
        data={"max_documents": 20},
        model={"kernel": "auto"},
        train={"dtype": "auto", "max_steps": 2, "eval_every": 0, "checkpoint_every": 0},
    )
    assert main(["train", str(config), "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"the cache {unwritable_cache} cannot be written" in err
    assert (tmp_path / "run" / "metrics.jsonl").read_text()


@pytest.mark.parametrize("damage", ["meta.json", "train.bin", "val.idx"])
def test_damaged_cached_token_ids_count_as_absent_and_are_replaced(tmp_path, damage):
    path = write_lines(tmp_path / "a.txt", [f"line {i}" for i in range(50)])
    cfg = DataConfig(source=str(path), split_by="line", tokenizer="char")
    first = prepare_data(cfg, log=quiet)
    tokens = np.array(first.train.tokens)
    broken = first.cache_path / damage
    broken.write_bytes(broken.read_bytes()[:-3])  # cut short, as by a full disk
    said: list[str] = []
    again = prepare_data(cfg, log=said.append)
    assert any(line.startswith("lm: warning: damaged cached token ids in") for line in said)
    np.testing.assert_array_equal(again.train.tokens, tokens)
    assert "data: cached token ids in" in " ".join(_lines(cfg))  # replaced, read back


def test_a_damaged_cached_tokenizer_counts_as_absent(tmp_path, lm_cache):
    path = write_lines(tmp_path / "a.txt", [f"line {i}" for i in range(50)])
    cfg = DataConfig(source=str(path), split_by="line", tokenizer="bpe", vocab_size=280)
    first = prepare_data(cfg, log=quiet)
    (kept,) = (lm_cache / "tokenizers").iterdir()
    kept.write_text("{", encoding="utf-8")
    said: list[str] = []
    again = prepare_data(cfg, log=said.append)
    assert any("the cached tokenizer" in line and "training it again" in line for line in said)
    assert again.tokenizer.to_json() == first.tokenizer.to_json()
    assert TextTokenizer.load(kept).to_json() == first.tokenizer.to_json()  # rewritten


def _lines(cfg):
    said: list[str] = []
    prepare_data(cfg, log=said.append)
    return said
