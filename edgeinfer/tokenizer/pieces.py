"""Token ids back to bytes: llama.cpp's ``token_to_piece`` and ``detokenize`` rules."""

from __future__ import annotations

from edgeinfer.errors import TokenizerError
from edgeinfer.tokenizer.pretokenizer import CHAR_BYTES
from edgeinfer.tokenizer.vocab import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
)

SPACE_MARK = "\u2581"  # "▁", SentencePiece's visible space
MAX_CODEPOINT = 0x10FFFF

_HEX = frozenset("0123456789abcdefABCDEF")

# continuation bytes a UTF-8 lead byte announces, by its top five bits; -1: not a lead byte
_CONTINUATIONS = [0] * 16 + [-1] * 8 + [1] * 4 + [2] * 2 + [3] + [-1]


def raw_bytes(text: str) -> bytes:
    """The token's bytes as stored in the file (the reader keeps invalid UTF-8 as escapes)."""
    return text.encode("utf-8", "surrogateescape")


def byte_value(text: str) -> int:
    """The byte a ``<0xXX>`` token stands for: ``strtol(text[3:5], 16)`` as llama.cpp reads it."""
    digits = raw_bytes(text)[3:5].decode("latin-1")
    value = 0
    for ch in digits:
        if ch not in _HEX:
            break
        value = value * 16 + int(ch, 16)
    return value & 0xFF


def _codepoints(raw: bytes) -> list[int]:
    """UTF-8 to code points the lenient way llama.cpp does: one U+FFFD per bad lead byte."""
    out: list[int] = []
    i, n = 0, len(raw)
    while i < n:
        b = raw[i]
        need = _CONTINUATIONS[b >> 3]
        if need == 0:
            out.append(b)
            i += 1
            continue
        tail = raw[i + 1 : i + 1 + need] if need > 0 else b""
        if need < 0 or len(tail) < need or any(c >> 6 != 2 for c in tail):
            out.append(0xFFFD)
            i += 1
            continue
        cp = b & (0x7F >> (need + 1))
        for c in tail:
            cp = (cp << 6) | (c & 0x3F)
        out.append(cp)
        i += 1 + need
    return out


def gpt2_decode(text: str) -> bytes:
    """Undo GPT-2's byte-to-character mapping (llama.cpp's ``llama_decode_text``)."""
    try:
        return bytes(CHAR_BYTES[c] for c in text)
    except KeyError:
        pass
    raw = raw_bytes(text)
    out = bytearray()
    for cp in _codepoints(raw):
        if cp > MAX_CODEPOINT:
            # F4 90.. to F7 BF BF BF: llama.cpp's unicode_cpt_to_utf8 throws on these while it
            # loads the vocabulary; the token cannot be rendered
            raise TokenizerError(
                f"token text {text!r} holds the byte sequence of U+{cp:X}, past U+10FFFF"
            )
        ch = chr(cp)
        if ch in CHAR_BYTES:
            out.append(CHAR_BYTES[ch])
        else:
            # llama.cpp's marker for a character outside the byte alphabet, text included
            utf8 = ch.encode("utf-8", "surrogatepass")
            out += b"[UNK_BYTE_0x" + utf8.hex().encode() + raw + b"]"
    return bytes(out)


def piece(text: str, attr: int, spm: bool) -> bytes:
    """What a token renders as when special tokens are shown (llama.cpp's piece cache)."""
    if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED):
        return raw_bytes(text)
    if attr & ATTR_NORMAL:
        if spm:
            return raw_bytes(text.replace(SPACE_MARK, " "))
        return gpt2_decode(text)
    if attr & ATTR_BYTE:
        return bytes([byte_value(text)])
    return b""  # unused and undefined tokens render as nothing


def clean_up_spaces(text: bytes) -> bytes:
    """llama.cpp's ``clean_up_tokenization_spaces``: three in-place passes over the bytes.

    Ported literally (including writing a NUL over a skipped space) so that odd inputs come
    out exactly as llama.cpp leaves them.
    """
    buf = bytearray(text)
    total = _drop_space_before_punct(buf, len(buf))
    total = _drop_spaces_around_quote(buf, total)
    total = _join_contractions(buf, total)
    return bytes(buf[:total])


def _drop_space_before_punct(buf: bytearray, size: int) -> int:
    total = 1 if size else 0
    for i in range(1, size):
        x = buf[i]
        if buf[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        buf[total] = x
        total += 1
    return total


def _drop_spaces_around_quote(buf: bytearray, size: int) -> int:
    total = 1 if size else 0
    i = 1
    while i < size:
        x = buf[i]
        if x == 0x27 and i + 1 < size and buf[i - 1] == 0x20 and buf[i + 1] == 0x20:
            total -= 1
            i += 1
            buf[i] = 0
        buf[total] = x
        total += 1
        i += 1
    return total


def _join_contractions(buf: bytearray, size: int) -> int:
    total = 1 if size else 0
    for i in range(1, size):
        x = buf[i]
        if buf[i - 1] == 0x20 and x == 0x27 and i + 1 < size:
            x1 = buf[i + 1]
            if x1 in b"sm":  # " 's", " 'm"
                total -= 1
            elif x1 not in b"td" and i + 2 < size:
                x2 = buf[i + 2]
                if (x1, x2) in ((0x72, 0x65), (0x76, 0x65)):  # " 're", " 've"
                    total -= 1
        buf[total] = x
        total += 1
    return total
