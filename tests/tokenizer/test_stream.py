"""The streaming decoder never returns part of a character."""

from __future__ import annotations

import pytest

from edgeinfer.tokenizer import Tokenizer
from tests.tokenizer.corpus import CJK, EMOJI, parity_corpus
from tests.tokenizer.tiny_vocabs import spm_metadata

# Characters Gemma has no token for (private use, rare ideographs): byte fallback, one token
# per UTF-8 byte. In the small BPE vocabularies most non-Latin text splits inside characters.
SPLIT_TEXTS = ["\U0010fffd", "a\U000f0000b", "𪚥𠀀", "🫠🧑‍💻", *EMOJI, *CJK]


def _stream(tok: Tokenizer, ids: list[int]) -> list[str]:
    decoder = tok.stream_decoder()
    return [decoder.push(i) for i in ids] + [decoder.flush()]


@pytest.mark.parametrize("name", ["gemma", "llama3", "qwen2"])
def test_stream_never_splits_a_character(tokenizers, name: str) -> None:
    tok = tokenizers[name]
    held_back = 0
    for text in SPLIT_TEXTS + parity_corpus():
        ids = tok.tokenize(text, add_special=False)
        chunks = _stream(tok, ids)
        for chunk in chunks:
            assert "\ufffd" not in chunk or "\ufffd" in text, (text, chunks)
        pieces = b"".join(tok.token_to_piece(i) for i in ids)
        assert "".join(chunks) == pieces.decode("utf-8")
        held_back += sum(
            1 for i, c in zip(ids, chunks, strict=False) if tok.token_to_piece(i) and not c
        )
    # the texts above do split characters across tokens for every vocabulary
    assert held_back > 10


def test_gemma_byte_fallback_is_held_back(tokenizers) -> None:
    tok = tokenizers["gemma"]
    ids = tok.tokenize("\U0010fffd", add_special=False)
    assert len(ids) == 4  # four <0xXX> tokens
    assert _stream(tok, ids) == ["", "", "", "\U0010fffd", ""]


def test_invalid_bytes_become_replacement_characters() -> None:
    tok = Tokenizer.from_metadata(spm_metadata())
    byte = 3  # <0x00>
    decoder = tok.stream_decoder()
    assert decoder.push(byte + 0xF0) == ""  # lead byte of a 4-byte character
    assert decoder.push(byte + 0x41) == "\ufffdA"  # not a continuation: replaced
    assert decoder.push(byte + 0xE6) == ""
    assert decoder.flush() == "\ufffd"  # unfinished at the end
    assert decoder.push(byte + 0x41) == "A"  # usable after a flush


def test_special_tokens_render_on_request(tokenizers) -> None:
    tok = tokenizers["qwen2"]
    ids = tok.tokenize("<|im_start|>hi<|im_end|>", add_special=False, parse_special=True)
    assert "".join(_stream(tok, ids)) == "hi"
    decoder = tok.stream_decoder(special=True)
    assert "".join(decoder.push(i) for i in ids) + decoder.flush() == "<|im_start|>hi<|im_end|>"
