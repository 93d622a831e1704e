"""Broken vocabularies and bad ids raise TokenizerError naming the problem."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edgeinfer.errors import TokenizerError
from edgeinfer.tokenizer import Tokenizer
from tests.tokenizer.tiny_vocabs import bpe_id, bpe_metadata, spm_metadata


def _without(md: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in md.items() if k != key}


def _with(md: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    return {**md, key: value}


K = "tokenizer.ggml."


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        (_without(spm_metadata(), K + "tokens"), "tokens is missing"),
        (_without(spm_metadata(), K + "model"), "model is missing"),
        (_with(spm_metadata(), K + "model", "sentencepiece"), "unknown vocabulary type"),
        (_with(spm_metadata(), K + "model", "t5"), "UGM"),
        (_with(spm_metadata(), K + "model", "bert"), "WPM"),
        (_with(spm_metadata(), K + "model", "rwkv"), "RWKV"),
        (_with(spm_metadata(), K + "model", 7), "has type int"),
        (_with(spm_metadata(), K + "tokens", []), "empty"),
        (_with(spm_metadata(), K + "tokens", ["a", 3]), "not an array of strings"),
        (_with(spm_metadata(), K + "tokens", "abc"), "not an array of strings"),
        (_with(spm_metadata(), K + "scores", np.zeros(5, np.float32)), "scores has 5 entries"),
        (_with(spm_metadata(), K + "scores", np.zeros(267, np.float64)), "float32 or int32"),
        (_with(spm_metadata(), K + "token_type", np.ones(300, np.int32)), "token_type has 300"),
        (_with(spm_metadata(), K + "token_type", ["x"] * 267), "numeric array"),
        (_with(spm_metadata(), K + "bos_token_id", 267), "outside the vocabulary"),
        (_with(spm_metadata(), K + "eos_token_id", -1), "outside the vocabulary"),
        (_with(spm_metadata(), K + "padding_token_id", 10**6), "outside the vocabulary"),
        (_with(spm_metadata(), K + "bos_token_id", "1"), "has type str"),
        (_with(spm_metadata(), K + "add_bos_token", "yes"), "has type str"),
        (_with(spm_metadata(), K + "tokens", ["<unk>"] * 267), "same token text twice"),
        (_without(bpe_metadata(), K + "merges"), "merges is missing"),
        (_with(bpe_metadata(), K + "merges", [1, 2]), "merges is not an array of strings"),
        (_with(bpe_metadata(), K + "pre", "no-such-pre"), "pre-tokenizer 'no-such-pre'"),
    ],
)
def test_malformed_vocabulary(metadata: dict[str, Any], message: str) -> None:
    with pytest.raises(TokenizerError, match=message):
        Tokenizer.from_metadata(metadata)


def test_byte_token_with_short_text() -> None:
    md = spm_metadata()
    tokens = list(md[K + "tokens"])
    tokens[3 + 0x41] = "<0"
    with pytest.raises(TokenizerError, match="byte token"):
        Tokenizer.from_metadata(_with(md, K + "tokens", tokens))


@pytest.mark.parametrize("bad", [-1, 267, 10**9, "3", 2.0, None])
def test_bad_ids_are_rejected(bad: Any) -> None:
    tok = Tokenizer.from_metadata(spm_metadata())
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.detokenize([5, bad])
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.token_to_piece(bad)
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.token_text(bad)
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.stream_decoder().push(bad)


def test_missing_bos_fails_only_when_needed() -> None:
    md = _with(bpe_metadata(), K + "add_bos_token", True)
    del md[K + "bos_token_id"], md[K + "eos_token_id"]
    md[K + "tokens"] = md[K + "tokens"][:11]  # the BPE default BOS (11) is out of range
    md[K + "token_type"] = md[K + "token_type"][:11]
    tok = Tokenizer.from_metadata(md)
    assert tok.bos_id is None
    assert tok.tokenize("!", add_special=False) == [0]
    with pytest.raises(TokenizerError, match="BOS"):
        tok.tokenize("!")


def test_text_must_be_valid_unicode() -> None:
    tok = Tokenizer.from_metadata(spm_metadata())
    with pytest.raises(TokenizerError, match="surrogates"):
        tok.tokenize("a\ud800b")
    with pytest.raises(TokenizerError, match="takes str"):
        tok.tokenize(b"bytes")  # type: ignore[arg-type]  # the wrong type is the test


@pytest.mark.parametrize("raw", [b"\xf7\xbf\xbf\xbf", b"\xf4\x90\x80\x80", b"a\xf5\x80\x80\x80"])
def test_token_past_the_last_code_point_is_a_tokenizer_error(raw):
    # found while extending fuzz_gguf: a byte-level token whose bytes read as U+110000 or more
    # made detokenizing raise ValueError from chr(); llama.cpp refuses such a vocabulary
    md = bpe_metadata()
    tokens = list(md[K + "tokens"])
    tokens[-2] = raw.decode("utf-8", "surrogateescape")  # "Ġab", a normal token
    tok = Tokenizer.from_metadata(_with(md, K + "tokens", tokens))
    with pytest.raises(TokenizerError, match="past U"):
        tok.detokenize([len(tokens) - 2])
    assert tok.detokenize([bpe_id("ab")]) == "ab"  # the other tokens still render


@pytest.mark.parametrize("key", ["general.name", "general.architecture"])
@pytest.mark.parametrize("value", [np.array([1, 2], dtype=np.uint8), ["a", "b"], 7])
def test_model_name_of_another_type_is_a_tokenizer_error(key, value):
    # an array name made the quirk lookup raise ValueError ("truth value of an array")
    with pytest.raises(TokenizerError, match=f"{key} should be a string"):
        Tokenizer.from_metadata(_with(bpe_metadata(), key, value))
