"""Subword tokenizer: byte-pair encoding over SentencePiece-style "▁"-marked words, with the
special tokens of `qkv.data.special` first; encoding adds none (batching adds BOS, EOS, CLS).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import chain
from pathlib import Path

import numpy as np
from tokenizers import Encoding, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HfTokenizer

from qkv.data.readers import lone_surrogate
from qkv.data.special import SPECIAL_TOKENS, UNK
from qkv.errors import CheckpointError, ConfigError
from qkv.training.checkpoint import atomic_write_text

WORD_MARKER = "▁"  # U+2581: replaces the space before each word, as in SentencePiece
ALPHABET_LIMIT = 1000  # the alphabet keeps this many commonest characters (or half the
# vocabulary, where that is more: Chinese needs thousands); rarer ones become <unk>
LEARN_CHARS = 20_000  # BPE is learnt from each text's first characters: its time grows with
# the square of a word's length, and one long enough (a line of 10**6 "x") takes hours


def check_vocabulary(vocab_size: int, min_frequency: int) -> None:
    """Raises ConfigError unless the BPE settings can make a vocabulary."""
    if vocab_size <= len(SPECIAL_TOKENS):
        specials = len(SPECIAL_TOKENS)
        raise ConfigError(
            f"vocab_size must be more than the {specials} special tokens, got {vocab_size}"
        )
    if min_frequency < 0:
        raise ConfigError(f"min_frequency must be 0 or more, got {min_frequency}")


def size_note(tokenizer: Tokenizer, vocab_size: int) -> str | None:
    """What to tell the user when a trained vocabulary is not the size asked for, else None."""
    size = tokenizer.vocab_size
    if size == vocab_size:
        return None
    why = "the data holds no more merges"
    if size > vocab_size:
        why = "the special tokens and the alphabet alone take more"
    return f"the vocabulary has {size} tokens, not {vocab_size}: {why}"


class Tokenizer:
    """A trained BPE tokenizer (a Hugging Face one) whose first ids are PAD, BOS, EOS, UNK
    and CLS."""

    def __init__(self, hf_tokenizer: HfTokenizer) -> None:
        self._hf = hf_tokenizer
        # Text containing "</s>" is encoded as characters, never as EOS.
        self._hf.encode_special_tokens = True

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int = 8000,
        min_frequency: int = 2,
        lowercase: bool = False,
    ) -> Tokenizer:
        """Learns a BPE vocabulary of `vocab_size` ids (special tokens and alphabet included)
        from texts, read once, lazily; pairs seen fewer than `min_frequency` times are never
        merged, and `lowercase` applies to every later encoding too. Only the first
        `LEARN_CHARS` characters of a text are learnt from."""
        check_vocabulary(vocab_size, min_frequency)
        steps = [normalizers.NFC()] + ([normalizers.Lowercase()] if lowercase else [])
        hf = HfTokenizer(models.BPE(unk_token=UNK))
        hf.normalizer = normalizers.Sequence(steps)
        hf.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=WORD_MARKER, prepend_scheme="always"
        )
        hf.decoder = decoders.Metaspace(replacement=WORD_MARKER, prepend_scheme="always")
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS),
            limit_alphabet=max(ALPHABET_LIMIT, vocab_size // 2),
            show_progress=False,
        )
        cut = (text[:LEARN_CHARS] for text in texts)
        hf.train_from_iterator(cut, trainer=trainer)  # read in batches, in order
        return cls(hf)

    def save(self, path: str | Path) -> None:
        """Writes the tokenizer as JSON, atomically: a crash leaves the old file or the new."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Reads a tokenizer written by `save`; a CheckpointError if the file is missing,
        unreadable, not a BPE tokenizer, or its special ids are not `qkv.data.special`'s."""
        path = Path(path)
        try:
            hf = HfTokenizer.from_str(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CheckpointError(f"{path}: tokenizer file not found") from None
        except (OSError, UnicodeDecodeError) as error:
            raise CheckpointError(f"{path}: cannot read tokenizer file ({error})") from None
        except Exception as error:  # the Rust side raises a bare Exception
            first_line = str(error).splitlines()[0] if str(error) else "unknown error"
            raise CheckpointError(f"{path}: not a valid tokenizer file ({first_line})") from None
        if not isinstance(hf.model, models.BPE):
            raise CheckpointError(f"{path}: expected a BPE tokenizer")
        for expected_id, token in enumerate(SPECIAL_TOKENS):
            if (actual_id := hf.token_to_id(token)) != expected_id:
                raise CheckpointError(
                    f"{path}: special token {token} has id {actual_id}, expected {expected_id}"
                )
        return cls(hf)

    def to_json(self) -> str:
        return self._hf.to_str()

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        return self._hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of one text, without BOS, EOS or CLS."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of many texts, encoded in parallel; the same as `encode` on each. A text
        holding a lone surrogate (from an undecodable byte, say) is a ValueError."""
        return [encoding.ids for encoding in self._encodings(texts)]

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """`encode_batch` as arrays: every text's ids one after the other, (N,) int32, and
        each text's length, (n,) int64. The encoding runs in the tokenizers' own threads,
        without the GIL (other Python threads run meanwhile)."""
        rows = self.encode_batch(texts)
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))  # (n,)
        total = int(lengths.sum())
        return np.fromiter(chain.from_iterable(rows), dtype=np.int32, count=total), lengths

    def _encodings(self, texts: Sequence[str]) -> list[Encoding]:
        texts = list(texts)  # a generator is read once
        try:
            with _interrupts_kept():
                return self._hf.encode_batch_fast(texts, add_special_tokens=False)
        except TypeError:
            for number, text in enumerate(texts, start=1):
                if not isinstance(text, str):
                    raise TypeError(
                        f"text {number} is {type(text).__name__}, not a string"
                    ) from None
                if (code := lone_surrogate(text)) is not None:
                    raise ValueError(
                        f"text {number} is not valid text: it holds {code}, half of a "
                        "surrogate pair (an undecodable byte?)"
                    ) from None
            raise

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenized text of ids, skipping special tokens and ids outside the vocabulary.
        It does not stop at EOS: callers cut the sequence there first."""
        return self._hf.decode(self._valid(ids), skip_special_tokens=True)

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        """`decode` for many id sequences at once."""
        return self._hf.decode_batch([self._valid(ids) for ids in batch], skip_special_tokens=True)

    def tokens_from_ids(self, ids: Sequence[int]) -> list[str]:
        """Display labels of ids, e.g. for attention plots: "▁Zwei", "▁Männ", "er" read
        "Zwei", "Männ", "er"; a bare "▁" stays "▁", and special tokens show their names."""
        return [self.id_to_token(i).removeprefix(WORD_MARKER) or WORD_MARKER for i in ids]

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary entry of an id, marker included ("▁Zwei"); IndexError outside it."""
        token = self._hf.id_to_token(token_id) if token_id >= 0 else None
        if token is None:
            raise IndexError(f"token id {token_id} outside the vocabulary of {self.vocab_size}")
        return token

    def _valid(self, ids: Sequence[int]) -> list[int]:
        size = self.vocab_size
        return [int(i) for i in ids if 0 <= i < size]


@contextmanager
def _interrupts_kept() -> Iterator[None]:
    """Holds Ctrl-C back while the tokenizers' Rust code runs (which can swallow the
    KeyboardInterrupt) and delivers it on return; unguarded outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught and callable(previous):
        previous(signal.SIGINT, None)  # Python's own handler raises KeyboardInterrupt
    elif caught and previous == signal.SIG_DFL:
        raise KeyboardInterrupt
