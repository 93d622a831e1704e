"""The parts of a SentencePiece ``tokenizer.model`` (a ModelProto protobuf) that GGUF needs,
parsed without the sentencepiece or protobuf packages.

Field numbers are those of sentencepiece_model.proto: ModelProto.pieces = 1 (piece = 1,
score = 2, type = 3), trainer_spec = 2 (model_type = 3, byte_fallback = 35, unk_piece = 45,
bos_piece = 46, eos_piece = 47, pad_piece = 48), normalizer_spec = 3 (add_dummy_prefix = 3).
Unknown fields are skipped, as protobuf readers do. As in the sentencepiece library, the
special ids are those of the pieces the trainer spec names (-1 where there is none).
"""

from __future__ import annotations

import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from edgeinfer.converters import errors

MAX_MODEL_BYTES = 64 * 1024 * 1024

# SentencePiece.Type; llama.cpp's token types use the same numbers
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


@dataclass
class SentencePieceModel:
    pieces: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    types: list[int] = field(default_factory=list)
    model_type: str = "unigram"
    byte_fallback: bool = False
    special_pieces: dict[str, str] = field(
        default_factory=lambda: {"unk": "<unk>", "bos": "<s>", "eos": "</s>", "pad": "<pad>"}
    )
    add_dummy_prefix: bool = True

    def special_id(self, role: str) -> int:
        """The id of the piece the trainer named for ``role`` ("bos", ...), or -1."""
        try:
            return self.pieces.index(self.special_pieces[role])
        except ValueError:
            return -1


class _Reader:
    def __init__(self, buf: bytes, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def fail(self, why: str) -> errors.TokenizerConversionError:
        return errors.TokenizerConversionError(f"{self.path}: not a SentencePiece model ({why})")

    def varint(self) -> int:
        out, shift = 0, 0
        while True:
            if self.pos >= len(self.buf):
                raise self.fail("truncated varint")
            b = self.buf[self.pos]
            self.pos += 1
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 63:
                raise self.fail("varint longer than 10 bytes")

    def fields(self, end: int):
        while self.pos < end:
            key = self.varint()
            number, wire = key >> 3, key & 7
            if number == 0:
                raise self.fail("field number 0")
            if wire == 0:
                yield number, wire, self.varint()
            elif wire == 1:
                yield number, wire, self.take(8, end)
            elif wire == 2:
                n = self.varint()
                yield number, wire, self.take(n, end)
            elif wire == 5:
                yield number, wire, self.take(4, end)
            else:
                raise self.fail(f"wire type {wire}")
        if self.pos != end:
            raise self.fail("a field runs past its message")

    def take(self, n: int, end: int) -> bytes:
        if n > end - self.pos:
            raise self.fail("truncated field")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out


def parse_sentencepiece(path: Path) -> SentencePieceModel:
    try:
        info = path.stat()
        # a FIFO or a device would block or read without end: refused before it is opened
        if not stat.S_ISREG(info.st_mode):
            raise errors.TokenizerConversionError(f"{path}: is not a regular file")
        size = info.st_size
        if size > MAX_MODEL_BYTES:
            raise errors.TokenizerConversionError(
                f"{path}: {size} bytes is too large for a tokenizer"
            )
        buf = path.read_bytes()
    except FileNotFoundError:
        raise errors.MissingSourceFileError(f"{path}: no such file") from None
    except OSError as e:
        raise errors.SourceError(f"{path}: cannot read ({e.strerror})") from None
    model = SentencePieceModel()
    top = _Reader(buf, path)
    for number, wire, value in top.fields(len(buf)):
        if number == 1 and wire == 2:
            _piece(model, _Reader(value, path))
        elif number == 2 and wire == 2:
            _trainer_spec(model, _Reader(value, path))
        elif number == 3 and wire == 2:
            _normalizer_spec(model, _Reader(value, path))
    if not model.pieces:
        raise top.fail("no pieces")
    return model


def _piece(model: SentencePieceModel, r: _Reader) -> None:
    piece, score, kind = None, 0.0, NORMAL
    for number, wire, value in r.fields(len(r.buf)):
        if number == 1 and wire == 2:
            try:
                piece = value.decode("utf-8")
            except UnicodeDecodeError:
                raise r.fail(f"piece #{len(model.pieces)} is not UTF-8") from None
        elif number == 2 and wire == 5:
            (score,) = struct.unpack("<f", value)
        elif number == 3 and wire == 0:
            kind = value
    if piece is None:
        raise r.fail(f"piece #{len(model.pieces)} has no text")
    if kind not in (NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE):
        raise r.fail(f"piece {piece!r} has unknown type {kind}")
    model.pieces.append(piece)
    model.scores.append(float(score))
    model.types.append(kind)


_PIECE_FIELDS = {45: "unk", 46: "bos", 47: "eos", 48: "pad"}


def _trainer_spec(model: SentencePieceModel, r: _Reader) -> None:
    for number, wire, value in r.fields(len(r.buf)):
        if number == 3 and wire == 0:
            model.model_type = MODEL_TYPES.get(value, f"type {value}")
        elif number == 35 and wire == 0:
            model.byte_fallback = bool(value)
        elif number in _PIECE_FIELDS and wire == 2:
            try:
                model.special_pieces[_PIECE_FIELDS[number]] = value.decode("utf-8")
            except UnicodeDecodeError:
                raise r.fail("a special piece name is not UTF-8") from None


def _normalizer_spec(model: SentencePieceModel, r: _Reader) -> None:
    for number, wire, value in r.fields(len(r.buf)):
        if number == 3 and wire == 0:
            model.add_dummy_prefix = bool(value)
