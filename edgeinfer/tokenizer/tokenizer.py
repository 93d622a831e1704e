"""Text to token ids and back, with the exact results of llama.cpp's ``llama_tokenize``."""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from typing import Any

import numpy as np

from edgeinfer.errors import TokenizerError
from edgeinfer.tokenizer.merges import merge_pieces
from edgeinfer.tokenizer.pieces import SPACE_MARK, clean_up_spaces, piece, raw_bytes
from edgeinfer.tokenizer.pretokenizer import PreTokenizer, byte_encode, pre_tokenizer
from edgeinfer.tokenizer.vocab import (
    ATTR_CONTROL,
    ATTR_LSTRIP,
    ATTR_RSTRIP,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
    Vocab,
    load_vocab,
)

_C_SPACE = frozenset(" \t\n\v\f\r")  # isspace() in the C locale
_SPECIAL_ATTRS = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN
_WORD_CACHE_LIMIT = 1 << 16

# A fragment of the text being tokenized: a special token's id, or a (start, end) span.
Fragment = int | tuple[int, int]


class _SpecialToken:
    """A token the partition step matches literally; ``gram`` is its first three characters."""

    __slots__ = ("id", "text", "attr", "gram")

    def __init__(self, token_id: int, text: str, attr: int) -> None:
        self.id, self.text, self.attr = token_id, text, attr
        self.gram = text[:3]


class Tokenizer:
    """A llama.cpp-compatible tokenizer for SentencePiece (``llama``) and byte-level BPE
    (``gpt2``) vocabularies.

    Build it with :meth:`from_metadata`. Structures only tokenization needs (merge ranks, the
    special-token list, per-token pieces) are built on first use, so loading stays cheap.
    """

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self._t2i = vocab.token_to_id
        self._attrs = vocab.attrs.tolist()  # (n_vocab,) plain ints: numpy scalars are slow
        self._spm = vocab.is_spm
        self._pre: PreTokenizer | None = None if self._spm else pre_tokenizer(vocab.family or "")
        self._scores: list[float] | None = None
        self._ranks: dict[str, int] | None = None
        self._specials: list[_SpecialToken] | None = None
        self._pieces: dict[int, bytes] = {}
        self._words: dict[str, list[int]] = {}

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> Tokenizer:
        """Build from a GGUF metadata dict (``GGUFFile(path).metadata``)."""
        return cls(load_vocab(metadata))

    # --- properties ---------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    @property
    def bos_id(self) -> int | None:
        return self.vocab.special["bos"]

    @property
    def eos_id(self) -> int | None:
        return self.vocab.special["eos"]

    @property
    def eot_id(self) -> int | None:
        return self.vocab.special["eot"]

    @property
    def add_bos(self) -> bool:
        return self.vocab.add_bos

    @property
    def add_eos(self) -> bool:
        return self.vocab.add_eos

    @property
    def eog_ids(self) -> frozenset[int]:
        return self.vocab.eog_ids

    def token_text(self, token_id: int) -> str:
        """The token's text as stored (``▁`` and ``Ġ`` not undone; invalid UTF-8 in the file
        appears as surrogate escapes, as :class:`GGUFFile` decodes it)."""
        self._check_id(token_id)
        return self.vocab.tokens[token_id]

    def is_eog(self, token_id: int) -> bool:
        """Whether generation stops at this token (llama.cpp's ``llama_vocab_is_eog``)."""
        return token_id in self.vocab.eog_ids

    def is_control(self, token_id: int) -> bool:
        self._check_id(token_id)
        return bool(self._attrs[token_id] & ATTR_CONTROL)

    def _check_id(self, token_id: int) -> None:
        if not (isinstance(token_id, (int, np.integer)) and 0 <= token_id < self.vocab.n_vocab):
            raise TokenizerError(
                f"token id {token_id!r} is outside the vocabulary of {self.n_vocab}"
            )

    # --- text to ids --------------------------------------------------------------------

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = False
    ) -> list[int]:
        """Token ids of ``text``, exactly as ``llama_tokenize(add_special, parse_special)``.

        ``add_special`` adds BOS/EOS as the vocabulary asks. ``parse_special`` lets control
        tokens written in the text (``<start_of_turn>``) become their ids; user-defined tokens
        are matched either way.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"tokenize() takes str, not {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise TokenizerError("text contains lone surrogates; it is not valid Unicode") from None
        fragments = self._partition(text, parse_special) if text else []
        out: list[int] = []
        if add_special and self.vocab.add_bos:
            out.append(self._required("bos"))
        if self._spm:
            self._tokenize_spm(text, fragments, out)
        else:
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    self._tokenize_bpe(text[frag[0] : frag[1]], out)
        if add_special and self.vocab.add_eos:
            out.append(self._required("eos"))
        return out

    def _required(self, role: str) -> int:
        token_id = self.vocab.special[role]
        if token_id is None:
            raise TokenizerError(f"the vocabulary asks for a {role.upper()} token but has none")
        return token_id

    def _special_tokens(self) -> list[_SpecialToken]:
        """Control, user-defined and unknown tokens, longest (in bytes) first."""
        if self._specials is None:
            attrs, tokens = self._attrs, self.vocab.tokens
            ids = np.nonzero(self.vocab.attrs & _SPECIAL_ATTRS)[0].tolist()
            # llama.cpp's std::sort leaves equal lengths in an unspecified order; ties only
            # matter for equal-length tokens that can overlap, which real vocabularies lack
            ids.sort(key=lambda i: -len(raw_bytes(tokens[i])))
            self._specials = [_SpecialToken(i, tokens[i], attrs[i]) for i in ids]
        return self._specials

    def _partition(self, text: str, parse_special: bool) -> list[Fragment]:
        """Split out special tokens the way llama.cpp's ``tokenizer_st_partition`` does.

        Each special token, longest first, cuts every remaining text span at its
        occurrences, left to right. A token can only match if its first three characters
        occur in ``text``, which rules out almost all of them cheaply.
        """
        grams = set(text)
        grams.update(text[i : i + 2] for i in range(len(text) - 1))
        grams.update(text[i : i + 3] for i in range(len(text) - 2))
        skip = 0 if parse_special else ATTR_CONTROL | ATTR_UNKNOWN
        fragments: list[Fragment] = [(0, len(text))]
        for special in self._special_tokens():
            if special.attr & skip or special.gram not in grams or special.text not in text:
                continue
            fragments = _cut(text, fragments, special)
        return fragments

    def _tokenize_spm(self, text: str, fragments: list[Fragment], out: list[int]) -> None:
        prev_special = True
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            chunk = text[frag[0] : frag[1]]
            if self.vocab.add_space_prefix and prev_special:
                chunk = " " + chunk
            self._spm_ids(chunk.replace(" ", SPACE_MARK), out)
            prev_special = False

    def _spm_ids(self, text: str, out: list[int]) -> None:
        t2i = self._t2i
        if self._scores is None:
            self._scores = self.vocab.scores.tolist()
        scores = self._scores

        def priority(left: str, right: str) -> float | None:
            token_id = t2i.get(left + right)
            return None if token_id is None else -scores[token_id]  # best score first

        for part in merge_pieces(text, priority):
            token_id = t2i.get(part)
            if token_id is not None:
                out.append(token_id)
                continue
            for b in part.encode("utf-8"):
                out.append(self._spm_byte_token(b))

    def _spm_byte_token(self, b: int) -> int:
        token_id = self._t2i.get(f"<0x{b:02X}>")
        if token_id is None:
            token_id = self._t2i.get(bytes([b]).decode("utf-8", "surrogateescape"))
        if token_id is None:
            raise TokenizerError(f"the vocabulary has no token for byte 0x{b:02X}")
        return token_id

    def _tokenize_bpe(self, text: str, out: list[int]) -> None:
        words = self._words
        assert self._pre is not None
        for word in self._pre.split(text):
            encoded = byte_encode(word)
            ids = words.get(encoded)
            if ids is None:
                ids = self._bpe_word(encoded)
                if len(words) >= _WORD_CACHE_LIMIT:
                    words.clear()
                words[encoded] = ids
            out.extend(ids)

    def _bpe_word(self, word: str) -> list[int]:
        t2i = self._t2i
        if self.vocab.ignore_merges and word in t2i:
            return [t2i[word]]
        if self._ranks is None:
            merges = self.vocab.merges
            # llama.cpp keeps the first rank of a merge listed twice
            self._ranks = dict(zip(reversed(merges), range(len(merges) - 1, -1, -1), strict=True))
        ranks = self._ranks

        # byte-level words hold no raw spaces, so "left right" splits back unambiguously
        def rank_of(left: str, right: str) -> int | None:
            return ranks.get(left + " " + right)

        ids: list[int] = []
        for part in merge_pieces(word, rank_of):
            token_id = t2i.get(part)
            if token_id is not None:
                ids.append(token_id)
                continue
            # llama.cpp then looks up each UTF-8 byte on its own and drops those it misses
            for b in part.encode("utf-8"):
                token_id = t2i.get(bytes([b]).decode("utf-8", "surrogateescape"))
                if token_id is not None:
                    ids.append(token_id)
        return ids

    # --- ids to text --------------------------------------------------------------------

    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """The bytes of one token (``llama_token_to_piece`` with ``lstrip=0``).

        Control and unknown tokens render as nothing unless ``special`` is true.
        """
        self._check_id(token_id)
        attr = self._attrs[token_id]
        if not special and attr & (ATTR_UNKNOWN | ATTR_CONTROL):
            return b""
        cached = self._pieces.get(token_id)
        if cached is None:
            cached = self._pieces[token_id] = piece(self.vocab.tokens[token_id], attr, self._spm)
        return cached

    def detokenize_bytes(
        self, ids: Iterable[int], remove_special: bool = False, unparse_special: bool = False
    ) -> bytes:
        """``llama_detokenize``: the pieces joined, then llama.cpp's clean-ups.

        ``remove_special`` drops a leading BOS and a trailing EOS the vocabulary would add;
        ``unparse_special`` renders control tokens as their text.
        """
        ids = list(ids)
        for token_id in ids:
            self._check_id(token_id)
        vocab = self.vocab
        strip_space = vocab.add_space_prefix
        if remove_special and vocab.add_bos and ids and ids[0] == vocab.special["bos"]:
            strip_space = False
            ids = ids[1:]
        if remove_special and vocab.add_eos and ids and ids[-1] == vocab.special["eos"]:
            ids = ids[:-1]
        parts = [self.token_to_piece(t, unparse_special) for t in ids]
        if strip_space and parts and parts[0][:1] == b" ":
            parts[0] = parts[0][1:]  # the space SentencePiece put in front of the text
        out = b"".join(parts)
        return clean_up_spaces(out) if vocab.clean_spaces else out

    def detokenize(
        self, ids: Iterable[int], remove_special: bool = False, unparse_special: bool = False
    ) -> str:
        """:meth:`detokenize_bytes` decoded as UTF-8 (broken sequences become U+FFFD)."""
        raw = self.detokenize_bytes(ids, remove_special, unparse_special)
        return raw.decode("utf-8", "replace")

    def stream_decoder(self, special: bool = False) -> StreamDecoder:
        """A decoder for generated tokens that only ever returns whole characters."""
        return StreamDecoder(self, special)


class StreamDecoder:
    """Turns generated token ids into text as they arrive.

    A character split across byte tokens (emoji, CJK under byte fallback) is held back
    until its last byte arrives; bytes that can never form a character come out as U+FFFD.
    """

    def __init__(self, tokenizer: Tokenizer, special: bool = False) -> None:
        self._tokenizer = tokenizer
        self._special = special
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id: int) -> str:
        """The text that ``token_id`` completes; possibly empty."""
        return self._decoder.decode(self._tokenizer.token_to_piece(token_id, self._special))

    def flush(self) -> str:
        """Whatever is still held back, with an unfinished character as U+FFFD."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text


def _cut(text: str, fragments: list[Fragment], special: _SpecialToken) -> list[Fragment]:
    """Cut every text span at the occurrences of one special token."""
    out: list[Fragment] = []
    needle, size, attr = special.text, len(special.text), special.attr
    for frag in fragments:
        if isinstance(frag, int):
            out.append(frag)
            continue
        start, end = frag
        while True:
            at = text.find(needle, start, end)
            if at < 0:
                out.append((start, end))
                break
            left_end = at
            if attr & ATTR_LSTRIP:
                while left_end > start and text[left_end - 1] in _C_SPACE:
                    left_end -= 1
            if left_end > start:
                out.append((start, left_end))
            out.append(special.id)
            start = at + size
            if attr & ATTR_RSTRIP:
                while start < end and text[start] in _C_SPACE:
                    start += 1
            if start >= end:
                break
    return out
