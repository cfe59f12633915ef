"""Text <-> token ids: character, byte and byte-level BPE tokenizers on Hugging Face ``tokenizers``.

Every tokenizer is a plain ``tokenizers.Tokenizer`` saved as ``tokenizer.json``, so other
Hugging Face tools can load it. Each has two special tokens: ``<pad>`` fills the unused slots
of a padded batch and ``<eod>`` ends every document; the char tokenizer adds ``<unk>``.

- ``char``: one token per character (Unicode code point) seen in the training text. A
  character that is not in the vocabulary encodes to ``<unk>``, so text outside the training
  alphabet does not round-trip; :meth:`TextTokenizer.count_unknown` says how much of a text
  is affected.
- ``byte``: the 256 byte values, so any string round-trips exactly and nothing is unknown.
- ``bpe``: byte-level BPE (GPT-2's scheme, without its space prefix) merged up to
  ``vocab_size`` on the training text; exact round trip as for ``byte``.

The specials are matched only as ids, never in text: a corpus that contains the characters
``<eod>`` encodes them as ordinary characters, so documents cannot be split by their content.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from lm.config.errors import DataError
from lm.config.names import BUILTIN_TOKENIZERS

PAD = "<pad>"
EOD = "<eod>"
UNK = "<unk>"
SPECIALS = (PAD, EOD)
N_BYTES = 256


class TextTokenizer:
    """A ``tokenizers.Tokenizer`` with the ids of its specials and a no-surprises interface.

    ``encode`` never adds special tokens; the data pipeline appends ``<eod>`` itself.
    """

    def __init__(self, tokenizer: Tokenizer, name: str = "tokenizer") -> None:
        missing = [t for t in SPECIALS if tokenizer.token_to_id(t) is None]
        if missing:
            raise DataError(
                f"{name}: has no {' or '.join(missing)} token (lm needs both {PAD} and {EOD})"
            )
        # Not stored in tokenizer.json, so set on every construction: "<eod>" typed in the
        # text stays text instead of becoming a document boundary.
        tokenizer.encode_special_tokens = True
        self.tokenizer = tokenizer
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self.pad_id: int = tokenizer.token_to_id(PAD)
        self.eod_id: int = tokenizer.token_to_id(EOD)
        self.unk_id: int | None = tokenizer.token_to_id(UNK)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # The fast variant skips computing character offsets, which nothing here uses.
        encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return [e.ids for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``; ``<pad>`` is dropped, ``<eod>`` and ``<unk>`` show as themselves."""
        kept = [int(i) for i in ids if i != self.pad_id]
        return self.tokenizer.decode(kept, skip_special_tokens=False)

    def count_unknown(self, text: str) -> int:
        """How many tokens of ``text`` would be ``<unk>`` (characters, for ``char``; else 0)."""
        if self.unk_id is None:
            return 0
        return self.encode(text).count(self.unk_id)

    def to_json(self) -> str:
        """The canonical tokenizer.json content (what caches are keyed on)."""
        return self.tokenizer.to_str()

    def save(self, path: str | Path) -> None:
        """Write ``tokenizer.json`` atomically, so a crash never leaves half a file; a place
        that cannot be written is an ``OSError`` (``tokenizers``' own save raises a bare
        ``Exception``)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(self.tokenizer.to_str(pretty=True), encoding="utf-8")
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | Path) -> TextTokenizer:
        path = Path(path)
        if not path.is_file():
            raise DataError(f"{path}: no such tokenizer file")
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception for any parse failure
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise DataError(f"{path}: not a tokenizer.json file ({reason})") from None
        return cls(tokenizer, name=str(path))


def train_tokenizer(
    kind: str, texts: Iterable[str], vocab_size: int | None = None
) -> TextTokenizer:
    """A new ``kind`` tokenizer (char | byte | bpe) fitted to ``texts``, one document each
    (a dataset's text column, not the dataset: its rows are dicts).

    ``byte`` reads nothing; ``bpe`` needs ``vocab_size`` (specials included).
    """
    texts = _strings(texts)
    if kind == "char":
        return TextTokenizer(_char_tokenizer(texts))
    if kind == "byte":
        return TextTokenizer(_byte_level_bpe((), N_BYTES + len(SPECIALS)))
    if kind == "bpe":
        smallest = N_BYTES + len(SPECIALS)
        if vocab_size is None or vocab_size < smallest:
            raise DataError(
                f"data.vocab_size: {vocab_size} is too small for a byte-level BPE: it needs at "
                f"least {smallest} ({N_BYTES} bytes + {len(SPECIALS)} specials)"
            )
        return TextTokenizer(_byte_level_bpe(texts, vocab_size))
    raise DataError(f"data.tokenizer: {kind!r} is not one of {', '.join(BUILTIN_TOKENIZERS)}")


def _strings(texts: Iterable[str]) -> Iterator[str]:
    # A dict (a dataset row) would pass for text here: char would learn its keys.
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(
                f"train_tokenizer: expected documents as str, got {type(text).__name__}"
            )
        yield text


def _char_tokenizer(texts: Iterable[str]) -> Tokenizer:
    chars: set[str] = set()
    for text in texts:
        chars.update(text)
    # Specials first, then characters in code-point order: the same text gives the same ids.
    vocab = {token: i for i, token in enumerate((PAD, EOD, UNK, *sorted(chars)))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    # Every code point, newlines and spaces included, is its own "word".
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([PAD, EOD, UNK])
    return tokenizer


def _byte_level_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE; at ``vocab_size`` = 256 + specials it has no merges: the byte tokenizer."""
    tokenizer = Tokenizer(models.BPE())
    # No space prefix: GPT-2 adds one to the first word, which would break the exact round trip.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer
