"""Word splitting for byte-level BPE, reproducing llama.cpp's splitter byte for byte.

llama.cpp does not run the Hugging Face regexes as written. Its custom splitters (GPT-2,
Llama 3, Qwen 2) are hand-written scanners over its own Unicode 15.1 category table, and
every other pattern runs through ``std::regex`` on a *collapsed* copy of the text in which
each non-ASCII code point is replaced by one byte naming its class (``\\x0b`` for any white
space, ``\\xd1`` number, ``\\xd2`` letter, ...). Both agree on quirks that a real Unicode regex
engine would not: ``\\s`` is exactly the White_Space property (so U+001C..U+001F are not
space, U+0085 is), ``[\\r\\n]`` means only those two ASCII characters, and a code point's
class comes from the 15.1 table whatever the running Python knows.

We do the same: collapse once with ``str.translate``, then run stdlib ``re`` patterns whose
classes name the collapsed bytes. The custom scanners are equivalent to ordinary
leftmost-first alternations over that alphabet, which keeps the work in C.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from edgeinfer.tokenizer import unicode_classes

# Collapsed byte of each class, as llama.cpp's unicode_regex_split writes them.
_COLLAPSED = {
    "W": "\x0b",
    "N": "\xd1",
    "L": "\xd2",
    "P": "\xd3",
    "M": "\xd4",
    "S": "\xd5",
    "O": "\xd0",
}


class _CollapseTable(dict):
    """``str.translate`` table: ASCII stays, other code points become their class byte.

    Filled on demand, so only code points that actually occur are ever looked up.
    """

    def __init__(self) -> None:
        super().__init__((cp, cp) for cp in range(128))
        encoded = "".join(unicode_classes.RANGES)
        self._starts = [int(encoded[i : i + 6], 16) for i in range(0, len(encoded), 7)]
        self._classes = [encoded[i + 6] for i in range(0, len(encoded), 7)]

    def __missing__(self, cp: int) -> str:
        cls = self._classes[bisect.bisect_right(self._starts, cp) - 1]
        out = self[cp] = _COLLAPSED[cls]
        return out


_collapse_table: _CollapseTable | None = None


def collapse(text: str) -> str:
    """One character per code point: ASCII as is, anything else its class byte."""
    global _collapse_table
    if text.isascii():
        return text
    if _collapse_table is None:
        _collapse_table = _CollapseTable()
    return text.translate(_collapse_table)


# Character classes over the collapsed alphabet. ASCII members are spelled out because the
# collapsed text keeps ASCII verbatim; the White_Space members of ASCII are \t..\r and space.
_W = r"\t\n\x0b\x0c\r "
_L = r"A-Za-z\xd2"
_N = r"0-9\xd1"
_P = r"!-#%-*,-/:;?@\[-\]_{}\xd3"  # llama.cpp's ASCII list for \p{P}
_S = r"$+<->\^`|~\xd5"  # and for \p{S}
_M = r"\xd4"

_CONTRACTIONS_CASED = r"'s|'t|'re|'ve|'m|'ll|'d"
_CONTRACTIONS_ANYCASE = r"'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"

# llama.cpp's hand-written scanners, each an exact alternation over the collapsed alphabet.
GPT2 = re.compile(
    rf"{_CONTRACTIONS_CASED}| ?[{_L}]+| ?[{_N}]+| ?[^{_W}{_L}{_N}]+|[{_W}]+(?![^{_W}])|[{_W}]+"
)
LLAMA3 = re.compile(
    rf"{_CONTRACTIONS_ANYCASE}|[^\r\n{_L}{_N}]?[{_L}]+|[{_N}]{{1,3}}"
    rf"| ?[^{_W}{_L}{_N}]+[\r\n]*|[{_W}]*[\r\n]+|[{_W}]+(?![^{_W}])|[{_W}]+"
)
QWEN2 = re.compile(
    rf"{_CONTRACTIONS_ANYCASE}|[^\r\n{_L}{_N}]?[{_L}]+|[{_N}]"
    rf"| ?[^{_W}{_L}{_N}]+[\r\n]*|[{_W}]*[\r\n]+|[{_W}]+(?![^{_W}])|[{_W}]+"
)
QWEN35 = re.compile(
    rf"{_CONTRACTIONS_ANYCASE}|[^\r\n{_L}{_N}]?[{_L}{_M}]+|[{_N}]"
    rf"| ?[^{_W}{_L}{_M}{_N}]+[\r\n]*|[{_W}]*[\r\n]+|[{_W}]+(?![^{_W}])|[{_W}]+"
)

# Patterns llama.cpp runs through std::regex on the collapsed text.
PUNCT_RUNS = re.compile(rf"[{_P}\$\+<=>\^~\|]+")
PUNCT_RUNS_FALCON = re.compile(rf"[{_P}\$\+<=>\^~\|`]+")
NUMBER_RUNS = re.compile(rf"[{_N}]+")
ONE_NUMBER = re.compile(rf"[{_N}]")
THREE_DIGITS = re.compile(r"[0-9][0-9][0-9]")


@dataclass(frozen=True)
class PreTokenizer:
    """A named sequence of split steps; each step refines the previous step's pieces."""

    name: str
    steps: tuple[re.Pattern[str], ...]

    def split(self, text: str) -> list[str]:
        """The words of ``text``, in order; their concatenation is ``text``."""
        collapsed = collapse(text)
        pieces = [(0, len(text))]
        for pattern in self.steps:
            pieces = _refine(pattern, collapsed, pieces)
        return [text[a:b] for a, b in pieces]


def _refine(
    pattern: re.Pattern[str], collapsed: str, pieces: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Cut each piece at ``pattern``'s matches; text between matches stays as its own piece.

    Every piece is searched as if it were the whole string (llama.cpp runs a fresh
    ``regex_iterator`` over each), which matters for the ``(?!...)`` lookaheads at its end.
    """
    out: list[tuple[int, int]] = []
    append = out.append
    for start, end in pieces:
        last = start
        for m in pattern.finditer(collapsed, start, end):
            a, b = m.span()
            if a > last:
                append((last, a))
            append((a, b))
            last = b
        if last < end:
            append((last, end))
    return out


_GPT2_STEPS = (GPT2,)
_LLAMA3_STEPS = (LLAMA3,)
_QWEN2_STEPS = (QWEN2,)
_STARCODER_STEPS = (ONE_NUMBER, GPT2)
_DEFAULT_STEPS = (PUNCT_RUNS, GPT2, NUMBER_RUNS, THREE_DIGITS)
_FALCON_STEPS = (PUNCT_RUNS_FALCON, GPT2, THREE_DIGITS)

# llama.cpp's pre-tokenizer families whose patterns we reproduce, by family name.
FAMILIES = {
    "default": _DEFAULT_STEPS,
    "gpt2": _GPT2_STEPS,
    "llama3": _LLAMA3_STEPS,
    "qwen2": _QWEN2_STEPS,
    "qwen35": (QWEN35,),
    "starcoder": _STARCODER_STEPS,
    "falcon": _FALCON_STEPS,
}


def pre_tokenizer(family: str) -> PreTokenizer:
    return PreTokenizer(family, FAMILIES[family])


def _gpt2_byte_chars() -> list[str]:
    """The printable stand-in of every byte in GPT-2's byte-level alphabet."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = [""] * 256
    for b in printable:
        chars[b] = chr(b)
    n = 0
    for b in range(256):
        if not chars[b]:
            chars[b] = chr(256 + n)
            n += 1
    return chars


BYTE_CHARS = _gpt2_byte_chars()
_BYTE_ENCODE = {b: c for b, c in enumerate(BYTE_CHARS)}  # over latin-1 code points
CHAR_BYTES = {c: b for b, c in enumerate(BYTE_CHARS)}


def byte_encode(word: str) -> str:
    """GPT-2's byte-level form of ``word``: each UTF-8 byte as its stand-in character."""
    return word.encode("utf-8").decode("latin-1").translate(_BYTE_ENCODE)
