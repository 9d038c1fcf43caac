"""The tokenizer round-trips ordinary sentences, keeps special ids fixed and survives a reload."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from qkv.data.special import BOS_ID, CLS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID
from qkv.data.tokenizer import LEARN_CHARS, Tokenizer
from qkv.errors import CheckpointError, ConfigError

SENTENCE_TEXT = (
    "Zwei junge Männer stehen draußen . Ein Hund läuft über die grüne Wiese , "
    "während ein Mädchen Fußball spielt . Two young men stand outside . A dog runs across "
    "the green meadow , while a girl plays football ."
)
WORDS = SENTENCE_TEXT.split(" ")

SENTENCES = [
    "Zwei junge Männer stehen draußen.",
    "Ein Hund läuft über die grüne Wiese.",
    "A dog runs across the green meadow, while a girl plays football.",
    "Two young men stand outside.",
]


def corpus(n: int = 500, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    sentences = [" ".join(rng.choices(WORDS, k=rng.randint(3, 14))) for _ in range(n)]
    return [s.replace(" .", ".").replace(" ,", ",") for s in sentences] + SENTENCES


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.train(iter(corpus()), vocab_size=300)


def test_special_tokens_have_fixed_ids(tokenizer: Tokenizer) -> None:
    ids = [tokenizer.id_to_token(i) for i in (PAD_ID, BOS_ID, EOS_ID, UNK_ID, CLS_ID)]
    assert tuple(ids) == SPECIAL_TOKENS


@pytest.mark.parametrize("sentence", SENTENCES)
def test_round_trip(tokenizer: Tokenizer, sentence: str) -> None:
    ids = tokenizer.encode(sentence)
    assert all(i >= len(SPECIAL_TOKENS) for i in ids)
    assert tokenizer.decode(ids) == sentence


def test_encode_batch_matches_encode(tokenizer: Tokenizer) -> None:
    assert tokenizer.encode_batch(SENTENCES) == [tokenizer.encode(s) for s in SENTENCES]
    assert tokenizer.decode_batch(tokenizer.encode_batch(SENTENCES)) == SENTENCES


def test_decode_skips_special_and_out_of_range_ids(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(SENTENCES[0])
    noisy = [BOS_ID, *ids, EOS_ID, PAD_ID, -1, tokenizer.vocab_size + 5]
    assert tokenizer.decode(noisy) == SENTENCES[0]


def test_special_token_text_is_not_a_special_id(tokenizer: Tokenizer) -> None:
    assert EOS_ID not in tokenizer.encode("ein </s> Hund")


def test_unknown_characters_become_unk(tokenizer: Tokenizer) -> None:
    assert UNK_ID in tokenizer.encode("Hund ☃")


def test_text_with_half_a_surrogate_pair_is_named(tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match=r"text 2 is not valid text: it holds U\+DCFF"):
        tokenizer.encode_batch(["ein hund", "ein \udcff hund"])
    with pytest.raises(ValueError, match="U\\+D800"):
        tokenizer.encode("\ud800")


def test_ctrl_c_while_encoding_is_delivered_even_if_the_rust_code_drops_it(
    tokenizer: Tokenizer,
) -> None:
    class Dropping:  # as the Rust code may: it sees the signal and swallows its exception
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def encode_batch_fast(self, texts: list[str], add_special_tokens: bool) -> Any:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
            except KeyboardInterrupt:
                pass
            return self.inner.encode_batch_fast(texts, add_special_tokens=add_special_tokens)

    interrupted = Tokenizer(tokenizer._hf)
    interrupted._hf = Dropping(tokenizer._hf)  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        interrupted.encode_batch(["ein hund"])
    assert tokenizer.encode_batch(["ein hund"])  # and no handler is left behind


def test_texts_that_are_not_strings_are_named(tokenizer: Tokenizer) -> None:
    with pytest.raises(TypeError, match="text 2 is NoneType, not a string"):
        tokenizer.encode_batch(["ein hund", None])  # type: ignore[list-item]
    assert tokenizer.encode_batch(t for t in ["ein hund"]) == [tokenizer.encode("ein hund")]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("settings", "message"),
    [({"vocab_size": 3}, "vocab_size must be more than"), ({"min_frequency": -1}, "min_frequency")],
)
def test_training_settings_out_of_range(settings: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Tokenizer.train(["ein hund"], **settings)


def test_lowercase_option() -> None:
    lower = Tokenizer.train(corpus(100), vocab_size=200, lowercase=True)
    assert lower.decode(lower.encode("Zwei Männer")) == "zwei männer"


def test_tokens_for_display(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("Zwei Männer")
    pieces = tokenizer.tokens_from_ids(ids)
    assert "".join(pieces) == "ZweiMänner"
    assert not any(piece.startswith("▁") for piece in pieces)
    assert tokenizer.tokens_from_ids([BOS_ID, *ids, EOS_ID]) == ["<s>", *pieces, "</s>"]


def test_id_to_token_out_of_range(tokenizer: Tokenizer) -> None:
    with pytest.raises(IndexError):
        tokenizer.id_to_token(tokenizer.vocab_size)


def test_save_load_equality(tokenizer: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "run" / "tokenizer.json"
    tokenizer.save(path)
    loaded = Tokenizer.load(path)
    assert loaded.vocab_size == tokenizer.vocab_size
    assert loaded.to_json() == tokenizer.to_json()
    assert loaded.encode_batch(SENTENCES) == tokenizer.encode_batch(SENTENCES)
    assert loaded.encode("a </s>") == tokenizer.encode("a </s>")
    assert [p.name for p in path.parent.iterdir()] == ["tokenizer.json"]


def test_save_overwrites(tokenizer: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text("old")
    tokenizer.save(path)
    assert Tokenizer.load(path).vocab_size == tokenizer.vocab_size


def test_load_missing(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        Tokenizer.load(tmp_path / "tokenizer.json")


@pytest.mark.parametrize(
    "content",
    [b"{ this is not json", b"\xff\xfe", b'{"hello": "world"}', b""],
    ids=["broken-json", "binary", "not-a-tokenizer", "empty"],
)
def test_load_corrupt(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=r"tokenizer\.json"):
        Tokenizer.load(path)


def test_load_truncated(tokenizer: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    text = tokenizer.to_json()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(CheckpointError, match="not a valid tokenizer"):
        Tokenizer.load(path)


def test_load_wrong_special_ids(tokenizer: Tokenizer, tmp_path: Path) -> None:
    data = json.loads(tokenizer.to_json())
    vocab = data["model"]["vocab"]
    vocab["<s>"], vocab["</s>"] = vocab["</s>"], vocab["<s>"]
    for added in data["added_tokens"]:
        added["id"] = {BOS_ID: EOS_ID, EOS_ID: BOS_ID}.get(added["id"], added["id"])
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="special token"):
        Tokenizer.load(path)


def test_a_very_long_word_is_learnt_from_its_first_characters_only() -> None:
    """BPE's time grows with the square of a word's length: a line of 10**6 "x" took hours."""
    tokenizer = Tokenizer.train(["a b c"] * 10 + ["x" * 100_000], vocab_size=100)
    longest = max(len(token) for token in tokenizer._hf.get_vocab())
    assert 2**12 < longest <= LEARN_CHARS  # merged up to within the cut, not past it


def test_an_alphabet_of_thousands_of_characters_is_kept_whole() -> None:
    """Chinese, say: 1,500 characters, each seen twice, and a vocabulary room for them."""
    characters = [chr(0x4E00 + i) for i in range(1500)]
    texts = [" ".join(characters[i : i + 10]) for i in range(0, 1500, 10)] * 2
    tokenizer = Tokenizer.train(texts, vocab_size=4000, min_frequency=2)
    ids = [i for row in tokenizer.encode_batch(texts) for i in row]
    assert UNK_ID not in ids
