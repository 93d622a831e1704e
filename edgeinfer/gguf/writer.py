"""Streaming GGUF writer: the tensor table is declared up front, then each tensor's data is
written in chunks, so that a converter never holds more than one chunk of one tensor.

The file is written to a hidden temporary file in the output's directory and renamed over
the output only by :meth:`GGUFWriter.commit`. Leaving the ``with`` block by an exception
(a failed conversion, Ctrl-C) deletes the temporary file: a path either holds a complete
file or is left as it was.

Everything the reader checks is refused here before a byte is written: duplicate keys and
names, rows that do not split into blocks, out-of-range integers, data of the wrong size.
"""

from __future__ import annotations

import contextlib
import math
import os
import struct
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from edgeinfer import errors
from edgeinfer.atomic_file import chmod_as_created, fsync_directory
from edgeinfer.gguf.constants import (
    BLOCK_LAYOUTS,
    DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    SCALAR_FORMATS,
    GGMLType,
    ValueType,
)

GGUF_VERSION = 3
MAX_NAME_BYTES = 63  # GGML_MAX_NAME is 64 including the terminating NUL
MAX_DIMS = 4

_INT_RANGES = {
    ValueType.UINT8: (0, 2**8 - 1), ValueType.INT8: (-(2**7), 2**7 - 1),
    ValueType.UINT16: (0, 2**16 - 1), ValueType.INT16: (-(2**15), 2**15 - 1),
    ValueType.UINT32: (0, 2**32 - 1), ValueType.INT32: (-(2**31), 2**31 - 1),
    ValueType.UINT64: (0, 2**64 - 1), ValueType.INT64: (-(2**63), 2**63 - 1),
}  # fmt: skip


@dataclass(frozen=True)
class PlannedTensor:
    """One entry of the tensor table. ``shape`` is in GGML order (``shape[0]`` is the row),
    as in :class:`edgeinfer.gguf.TensorInfo`; ``offset`` is relative to the data section."""

    name: str
    shape: tuple[int, ...]
    ggml_type: GGMLType
    offset: int
    nbytes: int


def _pad(n: int, alignment: int) -> int:
    return -n % alignment


def _string(s: str | bytes, key: str = "") -> bytes:
    if isinstance(s, bytes):
        b = s
    else:
        try:  # escapes of undecodable bytes (as the reader makes them) go back to those bytes
            b = s.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as e:  # a lone surrogate is no text GGUF can hold
            raise errors.InvalidOptionError(
                f"metadata {key!r}: {s[e.start : e.end]!r} at character {e.start} of "
                f"{s[max(0, e.start - 16) : e.end + 16]!r} is a lone surrogate, not UTF-8 text"
            ) from None
    return struct.pack("<Q", len(b)) + b


def _scalar(vtype: ValueType, value: Any, key: str) -> bytes:
    if vtype == ValueType.BOOL:
        if not isinstance(value, (bool, np.bool_)):
            raise errors.InvalidOptionError(f"metadata {key!r}: expected a bool, got {value!r}")
        return struct.pack("<?", bool(value))
    if vtype in (ValueType.FLOAT32, ValueType.FLOAT64):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise errors.InvalidOptionError(f"metadata {key!r}: expected a number, got {value!r}")
        if not math.isfinite(float(value)):
            raise errors.InvalidOptionError(f"metadata {key!r}: {value!r} is not finite")
        return struct.pack(SCALAR_FORMATS[vtype][0], float(value))
    lo, hi = _INT_RANGES[vtype]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise errors.InvalidOptionError(
            f"metadata {key!r}: {value!r} is not a {vtype.name.lower()} value"
        )
    return struct.pack(SCALAR_FORMATS[vtype][0], int(value))


def encode_value(
    vtype: ValueType, value: Any, key: str, element_type: ValueType | None = None
) -> bytes:
    """The bytes of one metadata value (without its type code). Arrays take ``element_type``."""
    if vtype == ValueType.STRING:
        if not isinstance(value, (str, bytes)):
            raise errors.InvalidOptionError(f"metadata {key!r}: expected a string, got {value!r}")
        return _string(value, key)
    if vtype != ValueType.ARRAY:
        return _scalar(vtype, value, key)
    if element_type is None or element_type == ValueType.ARRAY:
        raise errors.InvalidOptionError(f"metadata {key!r}: arrays need a scalar element type")
    head = struct.pack("<IQ", int(element_type), len(value))
    if element_type == ValueType.STRING:
        return head + b"".join(_string(v, key) for v in value)
    if element_type == ValueType.BOOL:
        return head + b"".join(_scalar(element_type, v, key) for v in value)
    dtype = np.dtype(SCALAR_FORMATS[element_type][1])
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise errors.InvalidOptionError(f"metadata {key!r}: arrays must be one-dimensional")
    if element_type in _INT_RANGES and len(arr):
        lo, hi = _INT_RANGES[element_type]
        if arr.dtype.kind not in "iu" or int(arr.min()) < lo or int(arr.max()) > hi:
            raise errors.InvalidOptionError(
                f"metadata {key!r}: values do not fit {element_type.name.lower()}"
            )
    elif len(arr) and not np.all(np.isfinite(arr.astype(np.float64))):
        raise errors.InvalidOptionError(f"metadata {key!r}: values are not finite")
    return head + arr.astype(dtype).tobytes()


class GGUFWriter:
    """Writes ``path`` as GGUF version 3.

    >>> with GGUFWriter(path) as w:
    ...     w.add_string("general.architecture", "llama")
    ...     w.add_tensor_info("token_embd.weight", (n_embd, n_vocab), GGMLType.Q8_0)
    ...     w.write_header()
    ...     w.write_tensor_data("token_embd.weight", chunks)
    ...     w.commit()  # or leave the block without an exception

    Metadata and tensors keep the order in which they were added.
    """

    def __init__(self, path: str | os.PathLike[str], alignment: int = DEFAULT_ALIGNMENT) -> None:
        if alignment <= 0 or alignment & (alignment - 1):
            raise errors.InvalidOptionError(f"alignment must be a power of two, not {alignment}")
        self.path = Path(path)
        self.alignment = alignment
        self._kv: dict[str, bytes] = {}  # key -> type code + value bytes
        self.tensors: dict[str, PlannedTensor] = {}
        self._data_size = 0
        self._file: BinaryIO | None = None
        self._tmp: Path | None = None
        self._next = 0  # index of the next tensor whose data is due
        self._done = False
        if alignment != DEFAULT_ALIGNMENT:
            self.add_uint32("general.alignment", alignment)

    # --- metadata ------------------------------------------------------------------------

    def add(
        self, key: str, vtype: ValueType, value: Any, element_type: ValueType | None = None
    ) -> None:
        self._check_open_for_layout()
        if not isinstance(key, str) or not key or len(key.encode()) > 65535:
            raise errors.InvalidOptionError(f"bad metadata key {key!r}")
        if key in self._kv:
            raise errors.DuplicateNameError(f"metadata key {key!r} added twice")
        body = encode_value(ValueType(vtype), value, key, element_type)
        self._kv[key] = struct.pack("<I", int(vtype)) + body

    def add_string(self, key: str, value: str) -> None:
        self.add(key, ValueType.STRING, value)

    def add_uint32(self, key: str, value: int) -> None:
        self.add(key, ValueType.UINT32, value)

    def add_int32(self, key: str, value: int) -> None:
        self.add(key, ValueType.INT32, value)

    def add_float32(self, key: str, value: float) -> None:
        self.add(key, ValueType.FLOAT32, value)

    def add_bool(self, key: str, value: bool) -> None:
        self.add(key, ValueType.BOOL, value)

    def add_array(
        self, key: str, values: Sequence[Any] | np.ndarray, element_type: ValueType
    ) -> None:
        self.add(key, ValueType.ARRAY, values, element_type)

    def keys(self) -> list[str]:
        return list(self._kv)

    # --- tensor table --------------------------------------------------------------------

    def add_tensor_info(
        self, name: str, shape: Sequence[int], ggml_type: GGMLType | int
    ) -> PlannedTensor:
        """Declares a tensor; ``shape`` in GGML order (row length first)."""
        self._check_open_for_layout()
        ggml_type = GGMLType(ggml_type)
        if name in self.tensors:
            raise errors.DuplicateNameError(f"tensor {name!r} added twice")
        if not name or len(name.encode()) > MAX_NAME_BYTES:
            raise errors.InvalidOptionError(
                f"tensor name {name!r} must be 1 to {MAX_NAME_BYTES} bytes"
            )
        shape = tuple(int(d) for d in shape)
        if not 1 <= len(shape) <= MAX_DIMS or any(d < 1 for d in shape):
            raise errors.InvalidOptionError(f"tensor {name!r}: bad shape {shape}")
        layout = BLOCK_LAYOUTS[ggml_type]
        if shape[0] % layout.block_size:
            raise errors.InvalidOptionError(
                f"tensor {name!r}: rows of {shape[0]} values do not split into "
                f"{ggml_type.name} blocks of {layout.block_size}"
            )
        nbytes = math.prod(shape) // layout.block_size * layout.type_size
        info = PlannedTensor(name, shape, ggml_type, self._data_size, nbytes)
        self.tensors[name] = info
        self._data_size += nbytes + _pad(nbytes, self.alignment)
        return info

    def header(self) -> bytes:
        """Everything before the tensor data, padding included."""
        parts = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(self.tensors), len(self._kv))]
        for key, body in self._kv.items():
            parts += [_string(key), body]
        for t in self.tensors.values():
            parts += [_string(t.name), struct.pack("<I", len(t.shape))]
            parts += [struct.pack(f"<{len(t.shape)}QIQ", *t.shape, int(t.ggml_type), t.offset)]
        head = b"".join(parts)
        return head + b"\0" * _pad(len(head), self.alignment)

    def file_size(self) -> int:
        """The size the finished file will have."""
        return len(self.header()) + self._data_size

    # --- writing -------------------------------------------------------------------------

    def write_header(self) -> None:
        """Creates the temporary file and writes the header; the layout is fixed from here."""
        if self._file is not None or self._done:
            raise errors.InvalidOptionError("the header is already written")
        head = self.header()
        directory = self.path.parent if str(self.path.parent) else Path(".")
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".part", dir=directory)
        except OSError as e:
            raise errors.EdgeInferError(
                f"{self.path}: cannot create a file in {directory} ({e.strerror})"
            ) from None
        self._tmp = Path(tmp)
        chmod_as_created(fd)
        self._file = os.fdopen(fd, "wb")
        self._write(head)

    def write_tensor_data(self, name: str, chunks: Iterable[bytes | np.ndarray]) -> None:
        """Writes the data of the next declared tensor from ``chunks`` (any split)."""
        if self._file is None:
            raise errors.InvalidOptionError("write_header() must come before tensor data")
        order = list(self.tensors)
        if self._next >= len(order) or order[self._next] != name:
            due = order[self._next] if self._next < len(order) else "none"
            raise errors.InvalidOptionError(f"tensor {name!r} written out of order (due: {due})")
        info = self.tensors[name]
        written = 0
        for chunk in chunks:
            data = (
                np.ascontiguousarray(chunk).data.cast("B")
                if isinstance(chunk, np.ndarray)
                else chunk
            )
            written += len(data)
            if written > info.nbytes:
                break
            self._write(data)
        if written != info.nbytes:
            raise errors.InvalidOptionError(
                f"tensor {name!r}: got {'more than ' if written > info.nbytes else ''}{written} "
                f"bytes of data, the table says {info.nbytes}"
            )
        self._write(b"\0" * _pad(info.nbytes, self.alignment))
        self._next += 1

    def commit(self) -> Path:
        """Checks that every tensor was written, then renames the file into place."""
        if self._file is None or self._tmp is None:
            raise errors.InvalidOptionError("nothing to commit: the header was never written")
        if self._next != len(self.tensors):
            missing = list(self.tensors)[self._next]
            raise errors.InvalidOptionError(f"cannot commit: tensor {missing!r} has no data yet")
        f, self._file = self._file, None
        try:
            f.flush()
            os.fsync(f.fileno())
        finally:
            f.close()
        os.replace(self._tmp, self.path)
        self._tmp, self._done = None, True
        fsync_directory(self.path.parent)
        return self.path

    def abort(self) -> None:
        """Deletes the temporary file; the output path is left as it was."""
        f, self._file = self._file, None
        if f is not None:
            f.close()
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def _write(self, data: bytes | memoryview) -> None:
        assert self._file is not None
        try:
            self._file.write(data)
        except OSError as e:
            raise errors.EdgeInferError(f"{self.path}: write failed ({e.strerror})") from None

    def _check_open_for_layout(self) -> None:
        if self._file is not None or self._done:
            raise errors.InvalidOptionError("the header is written: metadata and tensors are fixed")

    def __enter__(self) -> GGUFWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None and not self._done and self._file is not None:
            try:
                self.commit()
            except BaseException:
                self.abort()
                raise
        else:
            self.abort()
