"""Text sources -> token ids cached on disk.

:func:`prepare_data` turns a ``DataConfig`` into token ids, in four stages:

1. **Documents**, all through Hugging Face ``datasets``: local ``.txt`` (one document per file,
   line or paragraph), ``.jsonl``/``.json`` and ``.parquet`` files, a folder or glob of them; a
   Hub dataset id; ``builtin:python-docs`` (the help topics shipped with CPython, so the
   trainer works offline on any machine); or ``builtin:repeats`` (random sequences each written
   twice: :func:`lm.data.tasks.repeats`). Empty documents are skipped: they hold nothing to
   predict. A generated task (``builtin:copy``, ``counting``, ``mqar``...: :mod:`lm.data.tasks`)
   gives one document per example, with where its answer starts.
2. **Validation split**: the source's own if it has one (Hub only), else a held-out fraction,
   either the tail of the source or documents drawn with a seed. A single document is split by
   characters, as nanoGPT splits Tiny Shakespeare (train = the first 90%).
3. **Tokenizer**: trained on the training split only (and cached), or loaded from a file.
4. **Token ids**: each document + ``<eod>``, all concatenated into ``train.bin``/``val.bin``,
   with document offsets in ``.idx`` (and, for a task, each answer's first token in ``.ans``:
   the loss is on the answers only). The folder is keyed by a hash of the source, the split
   settings and the tokenizer, and appears atomically, so a second run reads it back
   (:mod:`lm.data.cache`, which keeps the tokenizer and the token ids).

``lm.data.batches`` turns the token ids into training and evaluation batches.
"""

from __future__ import annotations

import codecs
import functools
import glob
import os
import platform
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import numpy as np

from lm.config.errors import DataError
from lm.config.names import BUILTIN_TOKENIZERS, REPEATS, TASKS, task_of
from lm.config.sections import DataConfig
from lm.config.tasks import TASK_OWN_KEYS
from lm.data.cache import PreparedData, quiet_datasets, token_ids, tokenizer_for, unwritable
from lm.data.cache import TokenizedSplit as TokenizedSplit  # where the pipeline's users find it
from lm.data.tasks import TaskSettings, repeats, training_examples
from lm.runtime.choices import cache_dir

if TYPE_CHECKING:
    # Imported where documents are read or tokenized: a run whose token ids are cached never
    # loads datasets and pyarrow (about a second of every start-up).
    import datasets

LOADERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
SAMPLE_BY = {"file": "document", "line": "line", "paragraph": "paragraph"}
HUB_VAL_SPLITS = ("validation", "valid", "test")
DATA_DEFAULTS = DataConfig.__dataclass_fields__


def print_to_stderr(message: str) -> None:
    print(message, file=sys.stderr)


def prepare_data(
    cfg: DataConfig,
    tokenizer_path: str | Path | None = None,
    log: Callable[[str], None] | None = print_to_stderr,
) -> PreparedData:
    """Token ids of the training and validation splits, from the cache when it has them.

    ``tokenizer_path`` (for example a run's own tokenizer.json on resume) replaces
    ``cfg.tokenizer``. The source is read only when the cache misses. ``log=None`` is silent:
    no notes and no progress bars.
    """
    return _prepare_data(cfg, tokenizer_path, log or _silent)


def ignored_settings(cfg: DataConfig) -> list[str]:
    """Settings of ``cfg`` that have no effect on this source and tokenizer, as notes (they are
    accepted, so a config can be shared between sources; a combination that cannot work, such
    as document_mask with padded, is an error instead)."""
    notes = []
    if cfg.vocab_size is not None and cfg.tokenizer in ("char", "byte"):
        notes.append(
            f"data.vocab_size is ignored with tokenizer: {cfg.tokenizer} (its vocabulary "
            "comes from the text)"
        )
    source = cfg.source.strip()
    if source.startswith("builtin:") or _looks_local(source):
        hub_only = {"split": "train", "config_name": None, "streaming": False}
        for key, default in hub_only.items():
            if getattr(cfg, key) != default:
                notes.append(f"data.{key} applies to Hub datasets only; {source} is read whole")
    return notes


def _prepare_data(
    cfg: DataConfig, tokenizer_path: str | Path | None, log: Callable[[str], None]
) -> PreparedData:
    for note in ignored_settings(cfg):
        log(f"lm: note: {note}")
    root = cache_root(cfg)
    source = _resolve_source(cfg)
    corpus_key = {
        "source": source.fingerprint,
        "max_documents": cfg.max_documents,
        "val_split": cfg.val_split,
        "val_fraction": cfg.val_fraction,
        "seed": cfg.seed if cfg.val_split == "random" else None,
    }
    scratch: list[Path] = []

    @functools.cache
    def into() -> Path:
        """Where what the cache lacks is written: the cache, else (said once) a temporary
        folder, removed once the token ids are read: a cache that cannot be written costs the
        next run its tokenizing, not this run its training."""
        if not (why := unwritable(root)):
            return root
        scratch.append(Path(tempfile.mkdtemp(prefix="lm-data-")))
        log(
            f"lm: warning: the cache {root} cannot be written ({why}); tokenizing into "
            f"{scratch[0]} for this run only, so the next run tokenizes again"
        )
        return scratch[0]

    @functools.cache
    def splits() -> tuple[datasets.Dataset, datasets.Dataset, int]:
        log(f"data: reading {cfg.source}")
        with quiet_datasets():
            train, own_val, n_chars = _load_documents(cfg, source, into() / "hf")
            train, val, how = _split(cfg, train, own_val)
        log(f"data: {len(train)} training and {len(val)} validation documents ({how})")
        return train, val, n_chars

    try:
        tokenizer = tokenizer_for(cfg, tokenizer_path, corpus_key, (root, into), splits, log)
        data = token_ids(cfg, tokenizer, corpus_key, (root, into), splits, log)
    finally:
        for folder in scratch:  # the token ids stay mapped; their names go
            shutil.rmtree(folder, ignore_errors=True)
    for name, split in (("train", data.train), ("val", data.val)):
        log(f"data: {name} {split.n_tokens:,} tokens in {split.n_docs:,} documents")
    given = tokenizer_path or (cfg.tokenizer if cfg.tokenizer not in BUILTIN_TOKENIZERS else None)
    if tokenizer.unk_id is not None and given is not None:  # not trained on this text
        _refuse_mostly_unknown(data, given)
    if tokenizer.unk_id is not None:
        unknown = int(np.count_nonzero(data.val.tokens == tokenizer.unk_id))
        if unknown:
            log(f"data: {unknown:,} validation characters are not in the vocabulary (now <unk>)")
    return data


MOSTLY_UNKNOWN = 0.5
"""The share of a training split's characters outside a given vocabulary above which a run on
it would train on little but ``<unk>``, and is refused."""


def _refuse_mostly_unknown(data: PreparedData, tokenizer_path: str | Path) -> None:
    """A tokenizer not trained on this text (``--init-from`` another task's run, or
    ``data.tokenizer`` a file) that knows too few of its characters is refused in one line."""
    tokens = data.train.tokens
    if not len(tokens):
        return
    share = int(np.count_nonzero(tokens == data.tokenizer.unk_id)) / len(tokens)
    if share > MOSTLY_UNKNOWN:
        raise DataError(
            f"data: {share:.0%} of the training split's characters are not in the vocabulary of "
            f"{tokenizer_path} and would all train as <unk>: its weights and tokenizer know "
            "other symbols (start this data from a run trained on text like it)"
        )


def _silent(message: str) -> None:
    pass


def cache_root(cfg: DataConfig) -> Path:
    return Path(cfg.cache_dir).expanduser() if cfg.cache_dir else cache_dir()


# ---------------------------------------------------------------------------------------------
# Sources


@dataclass(frozen=True)
class _Source:
    """Where the documents come from, found without reading them (so a cache hit reads nothing)."""

    kind: str  # builtin | repeats | task | files | hub
    fingerprint: dict[str, Any]
    files: tuple[Path, ...] = ()


def _resolve_source(cfg: DataConfig) -> _Source:
    source = cfg.source.strip()
    if source.startswith("builtin:"):
        name = source.removeprefix("builtin:")
        if name in TASKS:
            settings = {"lengths": cfg.task_lengths, "examples": cfg.task_examples}
            if name == "flipflop":
                settings["ignore"] = cfg.flipflop_ignore
            # A task's own settings, named only when they are not the defaults: the examples
            # (and so the cache) of a task written before they existed stay the same.
            own = {k: getattr(cfg, k) for k in TASK_OWN_KEYS if k != "flipflop_ignore"}
            settings.update({k: v for k, v in own.items() if v != DATA_DEFAULTS[k].default})
            return _Source("task", {"task": name, **settings, "seed": cfg.seed, "version": 1})
        if name == REPEATS:
            settings = {"lengths": cfg.task_lengths, "examples": cfg.task_examples}
            if not cfg.repeats_distinct:  # named only when set: earlier runs' cache stays theirs
                settings["distinct"] = False
            return _Source("repeats", {"builtin": name, **settings, "seed": cfg.seed})
        # The help topics change with the Python release that ships them.
        return _Source("builtin", {"builtin": name, "python": platform.python_version()})
    if not _looks_local(source):
        return _Source("hub", {"hub": source, "config": cfg.config_name, "split": cfg.split})
    files = _local_files(source)
    stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    fingerprint = {"files": stats, "split_by": cfg.split_by, "text_field": cfg.text_field}
    return _Source("files", fingerprint, files)


def _looks_local(source: str) -> bool:
    """A Hub id is ``name`` or ``owner/name``; anything else path-like is a path, so a
    mistyped file name is reported as missing instead of being looked up on the Hub."""
    if Path(source).expanduser().exists() or any(c in source for c in "*?["):
        return True
    return (
        Path(source).suffix in LOADERS
        or source.startswith((".", "/", "~"))
        or source.count("/") > 1
    )


def _local_files(source: str) -> tuple[Path, ...]:
    path = Path(source).expanduser()
    if any(c in source for c in "*?["):
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
        if not files:
            raise DataError(f"data.source: no files match {source}")
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in LOADERS)
        if not files:
            raise DataError(f"data.source: {source}: no {', '.join(LOADERS)} files in the folder")
    elif path.is_file():
        files = [path]
    else:
        raise DataError(f"data.source: {source}: no such file or folder")
    suffixes = sorted({f.suffix for f in files})
    unknown = [s for s in suffixes if s not in LOADERS]
    if unknown:
        raise DataError(
            f"data.source: {source}: cannot read {unknown[0] or 'extension-less'} files "
            f"(use {', '.join(LOADERS)})"
        )
    if len({LOADERS[s] for s in suffixes}) > 1:
        raise DataError(
            f"data.source: {source}: mixes {' and '.join(suffixes)} files; use one kind"
        )
    return tuple(f.resolve() for f in files)


def _load_documents(
    cfg: DataConfig, source: _Source, hf_cache: Path
) -> tuple[datasets.Dataset, datasets.Dataset | None, int]:
    """The training documents, the source's own validation documents (or None), and the
    number of characters in both; each dataset has a single ``text`` column."""
    import datasets

    if source.kind == "task":
        task = task_of(cfg.source)
        pairs = training_examples(
            task, cfg.task_ranges()[0], cfg.task_examples, cfg.seed, TaskSettings.of(cfg)
        )
        pairs = pairs[: cfg.max_documents]
        prompts, answers = [p for p, _ in pairs], [a for _, a in pairs]
        text = [p + a for p, a in pairs]
        docs = datasets.Dataset.from_dict({"text": text, "prompt": prompts, "answer": answers})
        return docs, None, sum(map(len, text))
    if source.kind == "repeats":
        lengths, examples = cfg.task_ranges()[0], cfg.task_examples
        text = repeats(lengths, examples, cfg.seed, cfg.repeats_distinct)[: cfg.max_documents]
        return datasets.Dataset.from_dict({"text": text}), None, sum(map(len, text))
    if source.kind == "builtin":
        from pydoc_data.topics import topics

        docs = datasets.Dataset.from_dict({"text": [topics[k] for k in sorted(topics)]})
        docs, n_chars = _clean(docs, "text", cfg.source, cfg.max_documents)
        return docs, None, n_chars
    if source.kind == "files":
        docs = _load_files(cfg, source.files, hf_cache)
        docs, n_chars = _clean(docs, cfg.text_field, _where(cfg, source), cfg.max_documents)
        return docs, None, n_chars
    train, val = _load_hub(cfg, hf_cache)
    train, n_chars = _clean(train, cfg.text_field, f"{cfg.source} [{cfg.split}]", cfg.max_documents)
    if val is not None:
        val, n_val = _clean(val, cfg.text_field, f"{cfg.source} [validation]", cfg.max_documents)
        n_chars += n_val
    return train, val, n_chars


def _where(cfg: DataConfig, source: _Source) -> str:
    return str(source.files[0]) if len(source.files) == 1 else cfg.source


def _load_files(cfg: DataConfig, files: tuple[Path, ...], hf_cache: Path) -> datasets.Dataset:
    loader = LOADERS[files[0].suffix]
    options = {"sample_by": SAMPLE_BY[cfg.split_by]} if loader == "text" else {}
    try:
        docs = _load(loader, files, hf_cache, options)
    except Exception as e:  # datasets wraps every reader failure; reduce it to one line
        raise _read_error(e, files, loader, cfg.source) from None
    field = cfg.text_field
    if field in docs.column_names and docs.data.column(field).null_count:
        raise _missing_field(files, loader, hf_cache, field)
    return docs


def _load(loader: str, files: Sequence[Path], hf_cache: Path, options: dict) -> datasets.Dataset:
    import datasets

    return datasets.load_dataset(
        loader,
        data_files=[str(f) for f in files],
        split="train",
        cache_dir=str(hf_cache),
        **options,
    )


def _read_error(error: Exception, files: Sequence[Path], loader: str, source: str) -> DataError:
    import datasets

    causes = []
    while error is not None:
        causes.append(error)
        error = error.__cause__ or error.__context__
    if any(isinstance(e, UnicodeDecodeError) for e in causes):
        for file in files:
            reason = _utf8_error(file)
            if reason:
                return DataError(f"{file}: not UTF-8 text ({reason}); convert it to UTF-8")
    # The first cause that is not datasets' generic wrapper says what went wrong.
    useful = [e for e in causes if not isinstance(e, datasets.exceptions.DatasetGenerationError)]
    first = (useful or causes)[0]
    reason = (str(first).strip().splitlines() or [type(first).__name__])[0]
    return DataError(f"data.source: {source}: cannot be read as {loader} ({reason})")


def _utf8_error(file: Path) -> str | None:
    """Why ``file`` is not UTF-8, or None; read in blocks, so a large file costs no memory."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    position = 0
    with open(file, "rb") as f:
        try:
            while block := f.read(1 << 20):
                decoder.decode(block)
                position += len(block)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as e:
            return f"{e.reason} near byte {position + e.start}"
    return None


def _missing_field(files: Sequence[Path], loader: str, hf_cache: Path, field: str) -> DataError:
    """Name the file and record that lack ``field`` (an error path: reading each file is fine)."""
    import pyarrow.compute as pc

    for file in files:
        column = _load(loader, [file], hf_cache, {}).data.column(field)
        if column.null_count:
            record = pc.index(pc.is_null(column), True).as_py() + 1
            return DataError(f"{file}: record {record} has no {field!r} field (data.text_field)")
    return DataError(f"data.text_field: some records have no {field!r} field")


def _load_hub(cfg: DataConfig, hf_cache: Path) -> tuple[Any, Any]:
    """The Hub dataset's training split and its own validation split (or None)."""
    import datasets

    offline = datasets.config.HF_HUB_OFFLINE
    if not offline:
        reason = _hub_unreachable()
        if reason:
            raise DataError(
                f"data.source: {cfg.source!r} is not a local path and the Hugging Face Hub could "
                f"not be reached ({reason}); check the network, or set HF_HUB_OFFLINE=1 to use "
                "a cached copy"
            )
    try:
        found = datasets.load_dataset(
            cfg.source, cfg.config_name, streaming=cfg.streaming, cache_dir=str(hf_cache)
        )
    except ConnectionError:
        mode = "offline mode is on (HF_HUB_OFFLINE)" if offline else "no network"
        raise DataError(
            f"data.source: {cfg.source!r} is not a local path, not in the cache, and the Hugging "
            f"Face Hub could not be reached ({mode})"
        ) from None
    except datasets.exceptions.DatasetNotFoundError:
        raise DataError(
            f"data.source: {cfg.source!r} is neither a local path nor a dataset on the Hugging "
            "Face Hub (or it is private)"
        ) from None
    except ValueError as e:  # for example an unknown or missing configuration name
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DataError(
            f"data.source: {cfg.source!r} (data.config_name={cfg.config_name!r}): {reason}"
        ) from None
    if cfg.split not in found:
        splits = ", ".join(found)
        raise DataError(f"data.split: {cfg.split!r} is not a split of {cfg.source} ({splits})")
    val_name = next((s for s in HUB_VAL_SPLITS if s in found and s != cfg.split), None)
    train, val = found[cfg.split], found[val_name] if val_name else None
    if cfg.streaming:
        train, val = (_take(s, cfg.text_field, cfg.max_documents) for s in (train, val))
    return train, val


def _hub_unreachable() -> str | None:
    """Why the Hub cannot be reached, or None. huggingface_hub retries a failed connection for
    about half a minute; one quick connect tells us at once. Behind a proxy only the proxy
    knows, so that case is left to huggingface_hub."""
    import datasets

    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlsplit(datasets.config.HF_ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=5).close()
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__
    return None


def _take(stream: Any, field: str, limit: int | None) -> datasets.Dataset | None:
    """The first ``limit`` records (all, when None) of a streamed split, held in memory."""
    import datasets

    if stream is None:
        return None
    return datasets.Dataset.from_dict({field: [r.get(field) for r in islice(stream, limit)]})


def _clean(
    docs: datasets.Dataset, field: str, where: str, max_documents: int | None
) -> tuple[datasets.Dataset, int]:
    """Only ``field``, renamed ``text``, without empty documents, at most ``max_documents``;
    and the number of characters kept."""
    import pyarrow.compute as pc

    if field not in docs.column_names:
        raise DataError(
            f"{where}: no {field!r} field (fields: {', '.join(docs.column_names)}); "
            "set data.text_field"
        )
    column = docs.data.column(field)
    if column.null_count:
        raise DataError(f"{where}: some records have no {field!r} field (data.text_field)")
    dtype = getattr(docs.features[field], "dtype", type(docs.features[field]).__name__)
    if dtype not in ("string", "large_string"):
        raise DataError(f"{where}: field {field!r} holds {dtype}, not text (data.text_field)")
    lengths = pc.utf8_length(column).to_numpy()
    keep = np.flatnonzero(lengths)[:max_documents]
    if len(keep) == 0:
        raise DataError(f"{where}: no text (every document is empty)")
    docs = docs.select_columns([field])
    if field != "text":
        docs = docs.rename_column(field, "text")
    if len(keep) < len(docs):
        docs = docs.select(keep)
    return docs, int(lengths[keep].sum())


# ---------------------------------------------------------------------------------------------
# Validation split


def _split(
    cfg: DataConfig, docs: datasets.Dataset, own_val: datasets.Dataset | None
) -> tuple[datasets.Dataset, datasets.Dataset, str]:
    """(train, val, a few words saying how val was chosen); never overlapping, never empty."""
    import datasets

    if own_val is not None:
        return docs, own_val, "the source's own validation split"
    f = cfg.val_fraction
    n = len(docs)
    if n == 1:
        if cfg.val_split == "random":
            raise DataError(
                "data.val_split: random holds out whole documents and the source has only one; "
                "use val_split: tail"
            )
        # One document (say, Tiny Shakespeare): hold out the end of its text.
        text = docs[0]["text"]
        cut = _train_size(len(text), f, "characters")
        train = datasets.Dataset.from_dict({"text": [text[:cut]]})
        val = datasets.Dataset.from_dict({"text": [text[cut:]]})
        return train, val, f"the last {f:g} of the text"
    cut = _train_size(n, f, "documents")
    if cfg.val_split == "tail":
        return docs.select(range(cut)), docs.select(range(cut, n)), f"the last {f:g}"
    rng = np.random.default_rng(cfg.seed)
    is_val = np.zeros(n, bool)
    is_val[rng.permutation(n)[cut:]] = True
    how = f"{f:g} drawn with seed {cfg.seed}"
    return docs.select(np.flatnonzero(~is_val)), docs.select(np.flatnonzero(is_val)), how


def _train_size(n: int, fraction: float, units: str) -> int:
    """How many of ``n`` units train: int(n * (1 - fraction)), nanoGPT's rule (train =
    data[:int(n * 0.9)]), keeping at least one unit for validation; training may get none."""
    cut = min(int(n * (1 - fraction)), n - 1)  # 1 - fraction rounds to 1.0 for a tiny fraction
    if cut == 0:
        raise DataError(
            f"data.val_fraction: holding out {fraction:g} of {n} {units} leaves the training "
            "split empty; lower data.val_fraction or add text"
        )
    return cut
