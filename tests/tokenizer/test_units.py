"""Small cases worked out by hand: merges, byte fallback, splitting, clean-up, pieces."""

from __future__ import annotations

import pytest

from edgeinfer.tokenizer import Tokenizer
from edgeinfer.tokenizer.pieces import clean_up_spaces, gpt2_decode
from edgeinfer.tokenizer.pretokenizer import byte_encode, pre_tokenizer
from tests.fixtures.vocab import write_vocab_only_gguf
from tests.tokenizer.tiny_vocabs import (
    as_spec,
    bpe_id,
    bpe_metadata,
    spm_id,
    spm_metadata,
    with_exotic_tokens,
)

BYTE0 = 3  # <0x00> in the tiny SentencePiece vocabulary


@pytest.fixture
def spm() -> Tokenizer:
    return Tokenizer.from_metadata(spm_metadata())


@pytest.fixture
def bpe() -> Tokenizer:
    return Tokenizer.from_metadata(bpe_metadata())


def test_spm_merges_highest_score_first(spm: Tokenizer) -> None:
    # "▁abc": ▁a (-1.5) beats bc (-2.5); then ▁a+bc is "▁abc", a token: one piece
    assert spm.tokenize("abc") == [1, spm_id("▁abc")]
    # "▁ab": ▁a merges, "▁ab" is no token, so b stays alone
    assert spm.tokenize("ab", add_special=False) == [spm_id("▁a"), spm_id("b")]
    # no space prefix after a text fragment: "bc" merges
    assert spm.tokenize("bc", add_special=False) == [spm_id("▁"), spm_id("bc")]


def test_spm_byte_fallback_and_spaces(spm: Tokenizer) -> None:
    e_acute = [BYTE0 + 0xC3, BYTE0 + 0xA9]
    assert spm.tokenize("é", add_special=False) == [spm_id("▁")] + e_acute
    assert spm.tokenize("a a", add_special=False) == [spm_id("▁a"), spm_id("▁a")]


def test_spm_space_prefix_after_special_tokens(spm: Tokenizer) -> None:
    # <user> is user-defined: always split out; the text after it gets a new "▁" prefix
    assert spm.tokenize("a<user>a", add_special=False) == [
        spm_id("▁a"),
        spm_id("<user>"),
        spm_id("▁a"),
    ]
    # <s> is a control token: only parsed on request
    assert spm.tokenize("<s>a", add_special=False, parse_special=True) == [1, spm_id("▁a")]
    assert spm.tokenize("<s>", add_special=False)[:1] == [spm_id("▁")]


def test_spm_detokenize(spm: Tokenizer) -> None:
    ids = [1, spm_id("▁a"), spm_id("b"), BYTE0 + 0xC3, BYTE0 + 0xA9, 2]
    assert spm.detokenize(ids) == " abé"  # BOS renders empty, so the first space stays
    assert spm.detokenize(ids, remove_special=True) == " abé"
    assert spm.detokenize(ids[1:]) == "abé"  # the prefix space of the first piece goes
    assert spm.detokenize(ids, unparse_special=True) == "<s> abé</s>"
    assert spm.token_to_piece(BYTE0 + 0x41) == b"A"
    assert spm.token_to_piece(0) == b"" and spm.token_to_piece(0, special=True) == b"<unk>"


def test_bpe_ranks_and_words(bpe: Tokenizer) -> None:
    assert bpe.tokenize("abc ab abd") == [bpe_id("abc"), bpe_id("Ġab"), bpe_id("Ġab"), bpe_id("d")]
    assert bpe.tokenize("ba") == [bpe_id("b"), bpe_id("a")]
    assert bpe.tokenize("é") == [bpe_id("Ã"), bpe_id("©")]
    assert bpe.tokenize("<|end|>", parse_special=True) == [bpe_id("<|end|>")]
    assert bpe.detokenize([bpe_id("Ġab"), bpe_id("Ã"), bpe_id("©")]) == " abé"


def test_bpe_first_duplicate_merge_keeps_its_rank() -> None:
    md = bpe_metadata()
    md["tokenizer.ggml.merges"] = ["b c", "a b", "ab c", "b c"]
    tok = Tokenizer.from_metadata(md)
    # "b c" has rank 0, so "abc" becomes a + bc; "bc" is not a token: bytes b, c
    assert tok.tokenize("abc") == [bpe_id("a"), bpe_id("b"), bpe_id("c")]


@pytest.mark.parametrize(
    ("family", "text", "words"),
    [
        (
            "llama3",
            "Hello world123456!!\n\n  x",
            ["Hello", " world", "123", "456", "!!\n\n", " ", " x"],
        ),
        ("llama3", "I'M here", ["I", "'M", " here"]),
        ("gpt2", "I'M here", ["I", "'", "M", " here"]),
        ("gpt2", "I'm  fine", ["I", "'m", " ", " fine"]),
        ("qwen2", "abc123", ["abc", "1", "2", "3"]),
        # U+00A0 is white space to llama.cpp, U+001C is not
        ("llama3", "a\u00a0b", ["a", "\u00a0b"]),
        ("gpt2", "a\x1cb", ["a", "\x1c", "b"]),
        # only an ASCII space may lead a GPT-2 word
        ("gpt2", "a\u3000\u3000b", ["a", "\u3000", "\u3000", "b"]),
        ("default", "$1234.5", ["$", "123", "4", ".", "5"]),
        ("starcoder", " 42x", [" ", "4", "2", "x"]),
        ("qwen35", "e\u0301x1", ["e\u0301x", "1"]),
    ],
)
def test_pre_tokenizer_splits(family: str, text: str, words: list[str]) -> None:
    assert pre_tokenizer(family).split(text) == words


def test_gpt2_byte_mapping_round_trips() -> None:
    every_byte = bytes(range(256))
    text = every_byte.decode("latin-1")
    encoded = byte_encode(text)
    assert len(encoded) == len(text.encode("utf-8"))
    assert " " not in encoded and byte_encode(" ") == "Ġ"
    assert gpt2_decode(byte_encode("héllo 日本")) == "héllo 日本".encode()
    assert gpt2_decode("aé€") == b"a\xe9[UNK_BYTE_0xe282ac" + "aé€".encode() + b"]"


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        (b"Hello , world ! Is it ? Yes .", b"Hello, world! Is it? Yes."),
        (b"a ' b", b"a'b"),
        (b"it 's we 've they 're I 'm", b"it's we've they're I'm"),
        (b"I 'll do 't 'd", b"I 'll do 't 'd"),
        (b" ,", b","),
        (b"", b""),
    ],
)
def test_clean_up_spaces(raw: bytes, clean: bytes) -> None:
    assert clean_up_spaces(raw) == clean


@pytest.mark.parametrize("build", [spm_metadata, bpe_metadata])
def test_hand_built_vocabularies_agree_with_llama_cpp(tmp_path, build) -> None:
    """The expectations above are llama.cpp's, not just ours."""
    llama_cpp = pytest.importorskip("llama_cpp")
    md = build()
    path = write_vocab_only_gguf(tmp_path / "tiny.gguf", as_spec(md))
    ref = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_metadata(md)
    for text in [
        "abc",
        "ab",
        "bc",
        "é",
        "a a",
        "a<user>a",
        "<s>a",
        "<s>",
        "abc ab abd",
        "ba",
        "<|end|>",
        " abc  c\n",
    ]:
        for add_special in (True, False):
            for parse_special in (True, False):
                want = ref.tokenize(text.encode(), add_bos=add_special, special=parse_special)
                assert ours.tokenize(text, add_special, parse_special) == want, text


@pytest.mark.parametrize("build", [spm_metadata, bpe_metadata])
def test_exotic_token_pieces_agree_with_llama_cpp(tmp_path, build) -> None:
    from tests.tokenizer.conftest import Reference

    pytest.importorskip("llama_cpp")
    md = with_exotic_tokens(build())
    ref = Reference(write_vocab_only_gguf(tmp_path / "odd.gguf", as_spec(md)))
    ours = Tokenizer.from_metadata(md)
    for token_id in range(ours.n_vocab):
        for special in (False, True):
            assert ours.token_to_piece(token_id, special) == ref.token_to_piece(token_id, special)
    ids = list(range(ours.n_vocab - 14, ours.n_vocab))
    for remove_special in (False, True):
        for unparse_special in (False, True):
            want = ref.detokenize(ids, remove_special, unparse_special)
            assert ours.detokenize_bytes(ids, remove_special, unparse_special) == want
    for text in ["<user2>x<ctl><unk2>", "a€ spare odd", "A"]:
        for parse_special in (False, True):
            want = ref.tokenize(text, True, parse_special)
            assert ours.tokenize(text, parse_special=parse_special) == want, text
