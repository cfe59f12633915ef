"""The token cache: a corpus's tokenizer and token ids, kept on disk and read back.

A trained tokenizer is kept in ``tokenizers/`` and the token ids of both splits in ``data/``
under lm's cache folder (``$LM_CACHE``, else ``$XDG_CACHE_HOME/lm``, else ``~/.cache/lm``, or
``data.cache_dir``), each keyed by a hash of what made it (the source, the split settings, the
tokenizer), so a second run reads them back and never reads the source. A folder of token ids
appears atomically (written beside, then renamed into place). An entry that cannot be read
whole counts as absent and is made anew; a cache that cannot be written costs the next run its
tokenizing, not this run its training (:func:`unwritable`).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lm.config.errors import DataError
from lm.config.names import BUILTIN_TOKENIZERS, task_of
from lm.config.sections import DataConfig
from lm.data.tasks import TaskSettings, alphabet
from lm.data.tokenizer import TextTokenizer, train_tokenizer

if TYPE_CHECKING:
    import datasets

CACHE_FORMAT = 1
# Below this much text one process tokenizes faster than a pool of workers starts up.
SMALL_CORPUS_CHARS = 2_000_000


@dataclass(frozen=True)
class TokenizedSplit:
    tokens: np.ndarray
    """All documents' ids concatenated, each ending with <eod> (a read-only memmap)."""
    offsets: np.ndarray
    """int64 [n_docs + 1]: document i is tokens[offsets[i]:offsets[i + 1]]."""
    answers: np.ndarray | None = None
    """int64 [n_docs]: where each document's answer starts, in tokens from its first (a task's
    prompt is not trained on); None: every token is."""

    @property
    def n_docs(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class PreparedData:
    tokenizer: TextTokenizer
    train: TokenizedSplit
    val: TokenizedSplit
    cache_path: Path
    """The folder holding train.bin/.idx, val.bin/.idx and meta.json."""


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """datasets' own progress bars and notices would interleave with lm's lines (which say what
    is being read and cached): off while lm calls it, restored after."""
    import datasets

    was_enabled = datasets.is_progress_bar_enabled()
    verbosity = datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if was_enabled:
            datasets.enable_progress_bars()


Splits = Callable[[], "tuple[datasets.Dataset, datasets.Dataset, int]"]
Places = tuple[Path, Callable[[], Path]]
"""The cache read (its root), and where what it lacks is written (``into()``)."""


def token_ids(
    cfg: DataConfig,
    tokenizer: TextTokenizer,
    corpus_key: dict[str, Any],
    places: Places,
    splits: Splits,
    log: Callable[[str], None],
) -> PreparedData:
    """The token ids of both splits: the cache's, else tokenized anew (a damaged entry, one
    that cannot be read whole, counts as absent and is replaced)."""
    root, into = places
    key = key_hash({"format": CACHE_FORMAT, "corpus": corpus_key, "tokenizer": tokenizer.to_json()})
    folder = root / "data" / key
    read, damaged = _read_cache(folder)
    if read is not None:
        log(f"data: cached token ids in {folder}")
        return PreparedData(tokenizer, *read, folder)
    if damaged:
        log(f"lm: warning: damaged cached token ids in {folder} ({damaged}); tokenizing anew")
        shutil.rmtree(folder, ignore_errors=True)
    folder = into() / "data" / key
    if folder.exists():
        raise DataError(f"{folder}: damaged cached token ids that cannot be removed; remove it")
    train, val, n_chars = splits()
    num_proc = cfg.num_proc or (1 if n_chars < SMALL_CORPUS_CHARS else min(8, os.cpu_count() or 1))
    with quiet_datasets():
        _write_cache(folder, {"train": train, "val": val}, tokenizer, num_proc, corpus_key, log)
    read, damaged = _read_cache(folder)
    if read is None:
        raise DataError(f"{folder}: the token ids just written cannot be read ({damaged})")
    return PreparedData(tokenizer, *read, folder)


def unwritable(folder: Path) -> str:
    """Why nothing can be written in ``folder`` (made where missing), or '' where it can: a
    folder under a file, read-only, or immutable (which refuses even root, whom permission
    bits do not stop)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".lm-probe-")
        os.close(handle)
        os.unlink(probe)
    except OSError as e:
        return e.strerror or str(e)
    return ""


def key_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:20]


def tokenizer_for(
    cfg: DataConfig,
    tokenizer_path: str | Path | None,
    corpus_key: dict[str, Any],
    places: Places,
    splits: Splits,
    log: Callable[[str], None],
) -> TextTokenizer:
    """The tokenizer to use: loaded from a file, built (byte), or trained on the training split;
    a trained one is cached so that runs on the same corpus (``lm compare``) share it, and a
    cached one that cannot be read counts as absent."""
    if tokenizer_path is not None or cfg.tokenizer not in BUILTIN_TOKENIZERS:
        return TextTokenizer.load(tokenizer_path or cfg.tokenizer)
    if cfg.tokenizer == "byte":
        return train_tokenizer("byte", ())
    root, into = places
    vocab_size = cfg.vocab_size if cfg.tokenizer == "bpe" else None
    key = key_hash({"corpus": corpus_key, "kind": cfg.tokenizer, "vocab_size": vocab_size})
    name = f"{cfg.tokenizer}-{key}.json"
    if (root / "tokenizers" / name).exists():
        try:
            return TextTokenizer.load(root / "tokenizers" / name)
        except DataError as e:
            log(f"lm: warning: the cached tokenizer {e}; training it again")
    docs = splits()[0]
    log(f"tokenizer: training {cfg.tokenizer} on the training split")
    texts = (text for batch in docs.iter(batch_size=1000) for text in batch["text"])
    task = task_of(cfg.source)
    if task is not None:  # every character the task can write, seen in training or not
        texts = itertools.chain(texts, [alphabet(task, TaskSettings.of(cfg))])
    tokenizer = train_tokenizer(cfg.tokenizer, texts, vocab_size)
    log(f"tokenizer: {cfg.tokenizer}, {tokenizer.vocab_size} tokens")
    path = into() / "tokenizers" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(path)
    return tokenizer


def _write_cache(
    folder: Path,
    splits: dict[str, datasets.Dataset],
    tokenizer: TextTokenizer,
    num_proc: int,
    corpus_key: dict[str, Any],
    log: Callable[[str], None],
) -> None:
    """Tokenize every split into a temporary folder, then rename it into place: the cache
    folder either exists complete or not at all."""
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32
    if num_proc > 1:
        # The workers are forked; tokenizers would disable its own threads there anyway, with
        # a warning per worker.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    meta: dict[str, Any] = {"format": CACHE_FORMAT, "corpus": corpus_key, "dtype": dtype.__name__}
    try:
        for name, docs in splits.items():
            log(f"data: tokenizing {len(docs):,} {name} documents with {num_proc} process(es)")
            ids = _tokenize(docs, tokenizer, num_proc, tmp / f"{name}.arrow", name)
            meta[name] = _write_split(ids, tmp, name, dtype)
            del ids
        for arrow in tmp.glob("*.arrow"):  # datasets' intermediate output, now in the .bin files
            arrow.unlink()
        meta["vocab_size"] = tokenizer.vocab_size
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
        tmp.rename(folder)
    except OSError:
        # Another process may have finished the same cache first; theirs is identical.
        if not (folder / "meta.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _tokenize(
    docs: datasets.Dataset, tokenizer: TextTokenizer, num_proc: int, arrow: Path, name: str
) -> datasets.Dataset:
    """A dataset with one ``ids`` list per document, ``<eod>`` appended (batched, in parallel);
    a task's prompt and answer are encoded apart, with ``answer`` where the answer starts."""
    eod = tokenizer.eod_id

    def encode(batch: dict[str, list[str]]) -> dict[str, list]:
        if "answer" not in batch:
            return {"ids": [[*ids, eod] for ids in tokenizer.encode_batch(batch["text"])]}
        prompts, answers = (tokenizer.encode_batch(batch[k]) for k in ("prompt", "answer"))
        return {
            "ids": [[*p, *a, eod] for p, a in zip(prompts, answers, strict=True)],
            "answer": [len(p) for p in prompts],
        }

    return docs.map(
        encode,
        batched=True,
        batch_size=1000,
        num_proc=num_proc if num_proc > 1 else None,
        remove_columns=docs.column_names,
        cache_file_name=str(arrow),
        desc=f"tokenizing {name}",
    )


def _write_split(ids: datasets.Dataset, folder: Path, name: str, dtype: type) -> dict[str, int]:
    import pyarrow.compute as pc

    column = ids.data.column("ids")  # a fresh map output: no index mapping to honour
    offsets = np.zeros(len(column) + 1, np.int64)
    np.cumsum(pc.list_value_length(column).to_numpy(), out=offsets[1:])
    tokens = np.memmap(folder / f"{name}.bin", dtype=dtype, mode="w+", shape=(int(offsets[-1]),))
    position = 0
    for chunk in column.chunks:  # one arrow chunk at a time: memory stays bounded
        flat = chunk.flatten().to_numpy()
        tokens[position : position + len(flat)] = flat
        position += len(flat)
    tokens.flush()
    del tokens
    offsets.tofile(folder / f"{name}.idx")
    if "answer" in ids.column_names:
        ids.data.column("answer").to_numpy().astype(np.int64).tofile(folder / f"{name}.ans")
    return {"documents": len(column), "tokens": int(offsets[-1])}


def _read_cache(folder: Path) -> tuple[tuple[TokenizedSplit, TokenizedSplit] | None, str]:
    """Both splits' token ids kept in ``folder``, or None and why not ('' where there are
    none): a folder that cannot be read whole, or whose parts disagree, is damaged."""
    if not folder.exists():
        return None, ""
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        dtype = np.dtype(meta["dtype"])
        return (_read_split(folder, "train", dtype), _read_split(folder, "val", dtype)), ""
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        return None, (getattr(e, "strerror", None) or str(e) or type(e).__name__)


def _read_split(folder: Path, name: str, dtype: np.dtype) -> TokenizedSplit:
    tokens = np.memmap(folder / f"{name}.bin", dtype=dtype, mode="r")
    offsets = np.fromfile(folder / f"{name}.idx", dtype=np.int64)
    answers = folder / f"{name}.ans"
    split = TokenizedSplit(
        tokens, offsets, np.fromfile(answers, dtype=np.int64) if answers.is_file() else None
    )
    if not len(offsets) or offsets[-1] != len(tokens):
        raise ValueError(f"{name}.bin holds {len(tokens)} token ids, not what {name}.idx says")
    if split.answers is not None and len(split.answers) != split.n_docs:
        raise ValueError(f"{name}.ans does not hold one answer per document")
    return split
