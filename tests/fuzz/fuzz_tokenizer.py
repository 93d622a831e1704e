"""Fuzz target: tokenize and detokenize with the real Gemma 3 vocabulary (SentencePiece) and
the trained byte-level BPE vocabularies of the test fixtures (llama3 and qwen2 styles).

The first byte of an input chooses what is done with the rest (at most ``MAX_PAYLOAD``
bytes): which vocabulary, the special-token flags, how the bytes become text (UTF-8 with
surrogates passed or escaped, UTF-16 with surrogates passed, Latin-1, each with "replace"
where that cannot decode) or whether they are read as token ids (int32, mostly taken modulo
a little more than the vocabulary, so that some fall outside it).

Beyond "typed errors only", the results are checked: ids in range, ids from ``tokenize``
accepted by ``detokenize``, and text that survives the round trip exactly where the
vocabulary is lossless (byte-level BPE without space clean-up).

    python -m tests.fuzz.fuzz_tokenizer --runs 1000000 --corpus DIR --artifacts DIR
"""

from __future__ import annotations

import functools
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import atheris

from tests.fuzz import harness

with atheris.instrument_imports(include=["edgeinfer"]):
    from edgeinfer import errors
    from edgeinfer.gguf import GGUFFile
    from edgeinfer.tokenizer import Tokenizer

MAX_PAYLOAD = 4096  # bytes of text or ids per input, so that a run makes many execs
VOCABS = ("gemma", "llama3", "qwen2")
DECODINGS = ("utf-8", "utf-8-escape", "utf-16-le", "latin-1")
OPERATIONS = ("tokenize", "tokenize", "detokenize", "stream")


@functools.cache
def tokenizers() -> tuple[Tokenizer, ...]:
    """Built once per process: the real Gemma 3 vocabulary and the two trained BPE ones."""
    from tests.conftest import packaged_gemma_path
    from tests.fixtures.vocab import bpe_vocab

    with GGUFFile(packaged_gemma_path()) as f:
        gemma = Tokenizer.from_metadata(f.metadata)
    bpe = [Tokenizer.from_metadata(bpe_vocab(style).metadata()) for style in VOCABS[1:]]
    return (gemma, *bpe)


def as_text(payload: bytes, decoding: str) -> str:
    """``payload`` as text; lone surrogates and every code point can come out."""
    if decoding == "latin-1":
        return payload.decode("latin-1")
    if decoding == "utf-8-escape":
        return payload.decode("utf-8", "surrogateescape")
    try:
        return payload.decode(decoding, "surrogatepass")
    except UnicodeDecodeError:
        return payload.decode(decoding, "replace")


def as_ids(payload: bytes, n_vocab: int) -> list[int]:
    values = struct.unpack(f"<{len(payload) // 4}i", payload[: len(payload) // 4 * 4])
    # most ids valid (so that detokenizing gets somewhere), one in 4,096 raw: negative or huge
    return [v if v & 0xFFF == 0xFFF else v % (n_vocab + 4) for v in values]


def lossless(tok: Tokenizer) -> bool:
    """Whether detokenize(tokenize(text)) must give ``text`` back exactly."""
    vocab = tok.vocab
    return not vocab.is_spm and not vocab.clean_spaces and not tok.add_bos and not tok.add_eos


def check_tokenize(tok: Tokenizer, text: str, add_special: bool, parse_special: bool) -> None:
    ids = tok.tokenize(text, add_special=add_special, parse_special=parse_special)
    assert all(type(i) is int and 0 <= i < tok.n_vocab for i in ids), ids
    try:
        back = tok.detokenize(ids, unparse_special=True)
    except errors.TokenizerError as e:
        raise AssertionError(f"detokenize refused the ids tokenize gave: {e}") from e
    if lossless(tok):
        assert back == text, (text, ids, back)


def check_ids(tok: Tokenizer, ids: list[int], flags: int, stream: bool) -> None:
    remove_special, unparse_special = bool(flags & 1), bool(flags & 2)
    if not stream:
        text = tok.detokenize(ids, remove_special, unparse_special)
        assert isinstance(text, str)
        return
    decoder = tok.stream_decoder(special=unparse_special)
    pieces = [decoder.push(i) for i in ids]
    pieces.append(decoder.flush())
    joined = b"".join(tok.token_to_piece(i, unparse_special) for i in ids)
    assert "".join(pieces) == joined.decode("utf-8", "replace"), ids
    for i in ids[:8]:
        tok.token_text(i)
        tok.is_control(i)
        tok.is_eog(i)


def one_input(data: bytes) -> None:
    if not data:
        return
    control, payload = data[0], data[1 : 1 + MAX_PAYLOAD]
    tok = tokenizers()[(control & 3) % len(VOCABS)]  # 3 is Gemma again
    flags = (control >> 2) & 3
    operation = OPERATIONS[control >> 6]
    if operation == "tokenize":
        text = as_text(payload, DECODINGS[(control >> 4) & 3])
        check_tokenize(tok, text, bool(flags & 1), bool(flags & 2))
    else:
        check_ids(tok, as_ids(payload, tok.n_vocab), flags, operation == "stream")


# --- seeds -------------------------------------------------------------------------------

SLICE = 3000  # characters of each slice of a long text


def _slices(text: str, n: int) -> list[str]:
    step = max(len(text) // n, 1)
    return [text[i * step : i * step + SLICE] for i in range(n)]


def _script_samples() -> list[str]:
    """Words of letters from non-Latin scripts, picked with the Unicode data Python ships."""
    import unicodedata

    starts = {
        "Greek": 0x391, "Cyrillic": 0x410, "Hebrew": 0x5D0, "Arabic": 0x627, "Devanagari": 0x905,
        "Thai": 0xE01, "Georgian": 0x10D0, "Hiragana": 0x3041, "CJK": 0x4E00, "Hangul": 0xAC00,
        "Emoji": 0x1F600, "Math": 0x1D400,
    }  # fmt: skip
    out = []
    for start in starts.values():
        chars = [
            chr(c) for c in range(start, start + 400) if unicodedata.category(chr(c))[0] in "LS"
        ]
        words = ["".join(chars[i : i + 2 + i % 5]) for i in range(0, len(chars), 7)]
        out.append(" ".join(words))
    return out


def seed_texts() -> list[str]:
    """Real text: Python's LICENSE and documentation topics, its code pages' character tables,
    non-Latin scripts, and the hand-written tokenizer test strings."""
    import encodings.cp874
    import encodings.cp1251
    import encodings.cp1253
    import encodings.cp1256
    from pydoc_data import topics

    from tests.tokenizer import corpus

    license_file = (
        Path(sys.base_prefix)
        / "lib"
        / f"python{sys.version_info[0]}.{sys.version_info[1]}"
        / "LICENSE.txt"
    )
    texts = _slices(license_file.read_text(encoding="utf-8"), 3) if license_file.exists() else []
    texts += _slices("\n".join(topics.topics.values()), 4)
    for codec in (encodings.cp874, encodings.cp1251, encodings.cp1253, encodings.cp1256):
        texts.append(codec.decoding_table)
    texts += _script_samples()
    texts.append("\n".join(corpus.hand_written())[:SLICE])
    texts.append("<start_of_turn>user\nHello<end_of_turn>\n<|im_start|>assistant<|im_end|>")
    return texts


def seeds() -> Iterator[bytes]:
    texts = seed_texts()
    for i, text in enumerate(texts):
        vocab = i % len(VOCABS)
        # tokenize as UTF-8 with every flag combination over the texts, and as UTF-16
        yield bytes([vocab | (i % 4) << 2]) + text.encode("utf-8")[:MAX_PAYLOAD]
        if i % 3 == 0:
            raw = text.encode("utf-16-le", "surrogatepass")[:MAX_PAYLOAD]
            yield bytes([vocab | 2 << 4]) + raw
    for vocab, tok in enumerate(tokenizers()):
        ids = tok.tokenize(texts[0])[:256]
        payload = struct.pack(f"<{len(ids)}i", *ids)
        yield bytes([vocab | 3 << 2 | 2 << 6]) + payload  # detokenize
        yield bytes([vocab | 2 << 2 | 3 << 6]) + payload  # stream


if __name__ == "__main__":
    harness.main(one_input, seeds)
