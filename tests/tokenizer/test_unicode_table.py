"""The code point classes agree with Unicode 15.1 and with llama.cpp's splitter."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest

from edgeinfer.gguf.reader import GGUFFile
from edgeinfer.tokenizer import Tokenizer, unicode_classes
from edgeinfer.tokenizer.pretokenizer import collapse
from tests.fixtures.vocab import BYTE_CHARS, TOKEN_NORMAL, VocabSpec, write_vocab_only_gguf
from tests.tokenizer.unicode_table import WHITE_SPACE, class_ranges, render_module


def _ranges() -> list[tuple[int, str]]:
    encoded = "".join(unicode_classes.RANGES)
    return [(int(encoded[i : i + 6], 16), encoded[i + 6]) for i in range(0, len(encoded), 7)]


def test_table_is_well_formed() -> None:
    ranges = _ranges()
    assert ranges[0][0] == 0
    assert all(a[0] < b[0] and a[1] != b[1] for a, b in zip(ranges, ranges[1:], strict=False))
    assert {c for _, c in ranges} == set("WLNPMSO")
    assert ranges[-1][0] < 0x110000


@pytest.mark.skipif(
    unicodedata.unidata_version != unicode_classes.UNICODE_VERSION,
    reason=f"this Python has Unicode {unicodedata.unidata_version}, the table "
    f"{unicode_classes.UNICODE_VERSION} (CPython 3.13 regenerates it)",
)
def test_table_matches_unicode_database() -> None:
    assert class_ranges() == _ranges()
    source = Path(unicode_classes.__file__).read_text(encoding="utf-8")
    assert source == render_module()


def test_collapse_marks_white_space_property() -> None:
    for cp in WHITE_SPACE:
        want = chr(cp) if cp < 128 else "\x0b"
        assert collapse(chr(cp) + "é") == want + "\xd2"
    assert collapse("\x1c\x85\u200b") == "\x1c\x0b\xd0"


def _samples() -> list[int]:
    """First, middle and last code point of every range; no surrogates (not encodable)."""
    ranges = _ranges() + [(0x110000, "")]
    out = []
    for (start, _), (end, _) in zip(ranges, ranges[1:], strict=False):
        out += [start, (start + end - 1) // 2, end - 1]
    return [cp for cp in dict.fromkeys(out) if not 0xD800 <= cp <= 0xDFFF and cp != 0]


def probe_vocab(pre: str) -> VocabSpec:
    """A vocabulary whose merges reveal word boundaries next to any character.

    Every byte merges with a preceding "a" or space and with a following "b", "1" or ".",
    but merges never cross words: a boundary shows up as a merge that did not happen.
    """
    chars = sorted(BYTE_CHARS, key=ord)
    merges = [
        f"{left} {right}"
        for x in chars
        for left, right in (("a", x), (x, "b"), ("Ġ", x), (x, "1"), (x, "."))
    ]
    tokens = chars + list(
        dict.fromkeys(m.replace(" ", "") for m in merges if m.replace(" ", "") not in chars)
    )
    return VocabSpec(
        model="gpt2",
        pre=pre,
        tokens=tokens,
        token_types=[TOKEN_NORMAL] * len(tokens),
        merges=merges,
        special_ids={"bos": 0, "eos": 0},
        add_bos=False,
    )


@pytest.mark.parametrize("pre", ["qwen35", "default", "llama-bpe"])
def test_every_range_splits_like_llama_cpp(tmp_path: Path, pre: str) -> None:
    """qwen35 tells letters, marks, numbers and spaces apart; default adds punctuation."""
    llama_cpp = pytest.importorskip("llama_cpp")
    spec = probe_vocab(pre)
    path = write_vocab_only_gguf(tmp_path / f"{pre}.gguf", spec)
    ref = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_metadata(GGUFFile(path).metadata)
    samples = _samples()
    assert len(samples) > 5000
    bad = []
    for i in range(0, len(samples), 16):
        text = "".join(f"a{c}b {c}{c}1{c}.{c}\n" for c in map(chr, samples[i : i + 16]))
        if ours.tokenize(text, add_special=False) != ref.tokenize(text.encode(), add_bos=False):
            bad.append(f"U+{samples[i]:04X}..")
    assert not bad, f"{len(bad)} groups split differently: {bad[:10]}"
