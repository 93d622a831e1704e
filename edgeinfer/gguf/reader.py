"""Memory-mapped GGUF reader that treats every file as hostile input.

Only the header, the metadata and the tensor table are parsed; tensor data stays in the map
and is handed out as zero-copy numpy views. Every count and length is checked against the
bytes left in the file before anything is allocated, and every metadata value against a cap
of its own key (a vocabulary, a string, another array) and against a budget for all metadata,
so a corrupt or hostile file fails fast with a typed error and bounded memory. The path is
opened without blocking and refused unless it is a regular file (a FIFO would hang the open).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeinfer import errors
from edgeinfer.gguf.constants import (
    BLOCK_LAYOUTS,
    DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    SCALAR_FORMATS,
    SUPPORTED_VERSIONS,
    GGMLType,
    ValueType,
)

MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_KEY_LENGTH = 65535
MAX_ARRAY_DEPTH = 4
MAX_ELEMENTS = 1 << 50  # no real tensor comes near; stops products from overflowing int64
MAX_METADATA_ENTRIES = 1 << 16  # real files hold about 40 keys
MAX_TENSORS = 1 << 16  # the largest real models hold a few thousand tensors

# Per-key caps on metadata values, checked before anything is copied: a name, a license or
# a chat template of hundreds of MiB is hostile even when its bytes are really in the file.
MAX_VOCAB = 1 << 21  # tokens; the largest real vocabularies hold about 262,144
VOCAB_KEYS = frozenset({
    "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.added_tokens",
})  # fmt: skip
MAX_STRING_BYTES = 4 << 20  # chat templates, the largest real strings, stay below 100 KiB
LARGE_STRING_KEYS = {"tokenizer.huggingface.json": 64 << 20}  # a whole tokenizer.json
MAX_ARRAY_ELEMENTS = 1 << 16  # per-layer values, tags, languages
LARGE_ARRAY_KEYS = {"tokenizer.ggml.precompiled_charsmap": 16 << 20}  # T5's normalizer bytes
# all metadata values together, in file bytes; Gemma 3's 262,144-token vocabulary takes 6 MiB
MAX_METADATA_BYTES = 256 << 20


def string_cap(key: str) -> int:
    """The longest string value (in bytes) metadata ``key`` may hold."""
    return LARGE_STRING_KEYS.get(key, MAX_STRING_BYTES)


def array_cap(key: str) -> int:
    """The most elements an array value of metadata ``key`` may hold."""
    if key in VOCAB_KEYS:
        return MAX_VOCAB
    return LARGE_ARRAY_KEYS.get(key, MAX_ARRAY_ELEMENTS)


def model_path(path: object) -> str:
    """``path`` (str, bytes or os.PathLike) as a str; InvalidOptionError for anything else."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise errors.InvalidOptionError(
            f"a model path must be str, bytes or os.PathLike, not {type(path).__name__}"
        )
    name = os.fspath(path)
    if isinstance(name, bytes):
        name = os.fsdecode(name)  # undecodable bytes become surrogate escapes, as os does
    if not isinstance(name, str):
        raise errors.InvalidOptionError(
            f"a model path's __fspath__ must return str or bytes, not {type(name).__name__}"
        )
    if "\0" in name:
        raise errors.InvalidOptionError(f"a model path cannot contain a NUL character: {name!r}")
    return name


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table. ``shape`` is in GGML order: ``shape[0]`` is the row."""

    name: str
    shape: tuple[int, ...]
    ggml_type: GGMLType
    offset: int  # absolute position of the data in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class _Cursor:
    """Reads little-endian values from a buffer, raising TruncatedFileError at the end."""

    __slots__ = ("buf", "pos", "size", "path", "budget_end")

    def __init__(self, buf: Any, pos: int, size: int, path: str) -> None:
        self.buf, self.pos, self.size, self.path = buf, pos, size, path
        self.budget_end = size  # where the bytes that values may copy end (see budget())

    def remaining(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise errors.TruncatedFileError(
                f"{self.path}: file ends inside {what} at byte {self.pos} "
                f"(needs {n} bytes, {self.size - self.pos} left)"
            )

    def scalar(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def u32(self, what: str) -> int:
        return self.scalar("<I", what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", what)

    def length(self, what: str) -> int:
        """A u64 length; one larger than the whole file is absurd rather than truncated."""
        n = self.u64(f"the length of {what}")
        if n > self.size:
            raise errors.AbsurdValueError(
                f"{self.path}: {what} claims a length of {n}, more than the whole file"
            )
        return n

    def cap(self, n: int, cap: int, what: str, unit: str) -> None:
        """AbsurdValueError unless ``n`` is within ``cap`` and the metadata byte budget."""
        if n > cap:
            raise errors.AbsurdValueError(
                f"{self.path}: {what} claims a length of {n} {unit} (limit {cap})"
            )
        if self.pos + n > self.budget_end:
            raise errors.AbsurdValueError(
                f"{self.path}: {what} of {n} {unit} at byte {self.pos} takes the metadata "
                f"past its limit of {MAX_METADATA_BYTES} bytes"
            )

    def raw_string(self, what: str, max_len: int | None = None) -> bytes:
        n = self.length(what)
        if max_len is not None:
            self.cap(n, max_len, what, "bytes")
        self.need(n, what)
        s = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return s

    def string(self, what: str, max_len: int | None = None) -> str:
        return self.raw_string(what, max_len).decode("utf-8", errors="surrogateescape")


class GGUFFile:
    """A parsed GGUF file whose tensor data stays memory-mapped.

    ``metadata`` maps keys to Python values (numeric arrays as numpy arrays, string arrays
    as lists of str). ``tensors`` maps names to :class:`TensorInfo`, in file order.
    """

    def __init__(self, path: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> None:
        self.path = model_path(path)
        fd = self._open()
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise errors.NotARegularFileError(f"{self.path}: is a directory, not a GGUF file")
            if not stat.S_ISREG(st.st_mode):
                raise errors.NotARegularFileError(
                    f"{self.path}: is not a regular file (a FIFO, device or socket)"
                )
            self.file_size = st.st_size
            if self.file_size < 4:
                raise errors.TruncatedFileError(
                    f"{self.path}: {self.file_size} bytes is too short to be a GGUF file"
                )
            self._map: mmap.mmap | None = self._mmap(fd)
        finally:
            os.close(fd)
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    def _mmap(self, fd: int) -> mmap.mmap:
        try:
            return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except OSError as e:
            if e.errno == errno.ENOMEM:  # under an address-space limit (ulimit -v)
                raise errors.OutOfMemoryError(
                    f"{self.path}: cannot map the file's {self.file_size} bytes into memory"
                ) from None
            raise errors.ModelFileError(f"{self.path}: cannot map ({e.strerror})") from None

    def _open(self) -> int:
        # O_NONBLOCK: opening a FIFO with no writer (or some devices) would block forever;
        # the fstat that follows refuses whatever is not a regular file
        flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)
        flags |= getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
        try:
            return os.open(self.path, flags)
        except FileNotFoundError:
            raise errors.ModelFileError(f"{self.path}: no such file") from None
        except IsADirectoryError:
            raise errors.NotARegularFileError(
                f"{self.path}: is a directory, not a GGUF file"
            ) from None
        except OSError as e:
            raise errors.ModelFileError(f"{self.path}: cannot open ({e.strerror})") from None

    # --- parsing -------------------------------------------------------------------------

    def _parse(self) -> None:
        assert self._map is not None
        cur = _Cursor(self._map, 0, self.file_size, self.path)
        magic = bytes(self._map[:4])
        if magic != GGUF_MAGIC:
            raise errors.BadMagicError(
                f"{self.path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})"
            )
        cur.pos = 4
        self.version = cur.u32("the version")
        if self.version not in SUPPORTED_VERSIONS:
            swapped = int.from_bytes(self.version.to_bytes(4, "little"), "big")
            hint = " (a big-endian file?)" if swapped in SUPPORTED_VERSIONS else ""
            raise errors.UnsupportedVersionError(
                f"{self.path}: GGUF version {self.version} is not supported{hint}; "
                f"edgeinfer reads versions {', '.join(map(str, SUPPORTED_VERSIONS))}"
            )
        n_tensors = cur.u64("the tensor count")
        n_kv = cur.u64("the metadata count")
        # the smallest metadata entry is 8 (key length) + 4 (type) + 1 bytes; the smallest
        # tensor entry 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes
        if n_kv * 13 > cur.remaining():
            raise errors.AbsurdValueError(
                f"{self.path}: metadata count {n_kv} cannot fit in a {self.file_size}-byte file"
            )
        if n_kv > MAX_METADATA_ENTRIES:
            raise errors.AbsurdValueError(
                f"{self.path}: metadata count {n_kv} (limit {MAX_METADATA_ENTRIES})"
            )
        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, ValueType] = {}
        cur.budget_end = cur.pos + MAX_METADATA_BYTES
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}", MAX_KEY_LENGTH)
            if key in self.metadata:
                raise errors.DuplicateNameError(f"{self.path}: metadata key {key!r} appears twice")
            vtype = self._value_type(cur.u32(f"the type of {key!r}"), key)
            self.metadata[key] = self._value(cur, vtype, key, 0)
            self.metadata_types[key] = vtype
        cur.budget_end = self.file_size
        if n_tensors * 24 > cur.remaining():
            raise errors.AbsurdValueError(
                f"{self.path}: tensor count {n_tensors} cannot fit in a {self.file_size}-byte file"
            )
        if n_tensors > MAX_TENSORS:
            raise errors.AbsurdValueError(
                f"{self.path}: tensor count {n_tensors} (limit {MAX_TENSORS})"
            )
        self.alignment = self._alignment()
        infos = [self._tensor_entry(cur, i) for i in range(n_tensors)]
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, gtype, rel in infos:
            self.tensors[name] = self._place_tensor(name, shape, gtype, rel)

    def _value_type(self, code: int, key: str) -> ValueType:
        try:
            return ValueType(code)
        except ValueError:
            raise errors.UnknownValueTypeError(
                f"{self.path}: metadata {key!r} has unknown value type {code}"
            ) from None

    def _value(self, cur: _Cursor, vtype: ValueType, key: str, depth: int) -> Any:
        if vtype == ValueType.STRING:
            return cur.string(f"the value of {key!r}", string_cap(key))
        if vtype != ValueType.ARRAY:
            v = cur.scalar(SCALAR_FORMATS[vtype][0], f"the value of {key!r}")
            return bool(v) if vtype == ValueType.BOOL else v
        if depth >= MAX_ARRAY_DEPTH:
            raise errors.AbsurdValueError(f"{self.path}: metadata {key!r} nests arrays too deeply")
        etype = self._value_type(cur.u32(f"the element type of {key!r}"), key)
        n = cur.length(f"array {key!r}")
        if n > array_cap(key):
            raise errors.AbsurdValueError(
                f"{self.path}: array {key!r} claims {n} elements (limit {array_cap(key)})"
            )
        if etype == ValueType.STRING:
            return self._string_array(cur, n, key)
        if etype == ValueType.ARRAY:
            if n * 12 > cur.remaining():
                raise errors.AbsurdValueError(f"{self.path}: array {key!r} claims {n} elements")
            return [self._value(cur, ValueType.ARRAY, key, depth + 1) for _ in range(n)]
        fmt, dtype = SCALAR_FORMATS[etype]
        size = struct.calcsize(fmt)
        if n * size > cur.remaining():
            raise errors.AbsurdValueError(
                f"{self.path}: array {key!r} claims {n} elements, more than the file holds"
            )
        cur.cap(n * size, MAX_METADATA_BYTES, f"array {key!r}", "bytes")
        arr = np.frombuffer(cur.buf, dtype=dtype, count=n, offset=cur.pos).copy()
        cur.pos += n * size
        return arr.astype(bool) if etype == ValueType.BOOL else arr

    def _string_array(self, cur: _Cursor, n: int, key: str) -> list[str]:
        if n * 8 > cur.remaining():
            raise errors.AbsurdValueError(
                f"{self.path}: string array {key!r} claims {n} elements, more than the file holds"
            )
        buf, pos, end, budget_end = cur.buf, cur.pos, cur.size, cur.budget_end
        cap = string_cap(key)
        unpack = struct.Struct("<Q").unpack_from
        out: list[str] = []
        append = out.append
        for _ in range(n):
            if pos + 8 > end:
                cur.pos = pos
                cur.need(8, f"a string of {key!r}")
            (ln,) = unpack(buf, pos)
            pos += 8
            if ln > end:
                raise errors.AbsurdValueError(
                    f"{self.path}: a string of {key!r} claims a length of {ln}, "
                    "more than the whole file"
                )
            if ln > cap or ln > budget_end - pos:
                cur.pos = pos
                cur.cap(ln, cap, f"a string of {key!r}", "bytes")
            if ln > end - pos:
                cur.pos = pos
                cur.need(ln, f"a string of {key!r}")
            append(buf[pos : pos + ln].decode("utf-8", "surrogateescape"))
            pos += ln
        cur.pos = pos
        return out

    def _alignment(self) -> int:
        if "general.alignment" not in self.metadata:
            return DEFAULT_ALIGNMENT
        a = self.metadata["general.alignment"]
        if self.metadata_types["general.alignment"] != ValueType.UINT32 or a == 0 or a & (a - 1):
            raise errors.AbsurdValueError(
                f"{self.path}: general.alignment must be a power of two (u32), got {a!r}"
            )
        return int(a)

    def _tensor_entry(self, cur: _Cursor, i: int) -> tuple[str, tuple[int, ...], GGMLType, int]:
        name = cur.string(f"the name of tensor #{i}", MAX_KEY_LENGTH)
        n_dims = cur.u32(f"the rank of tensor {name!r}")
        if n_dims < 1 or n_dims > MAX_DIMS:
            raise errors.AbsurdValueError(
                f"{self.path}: tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"
            )
        shape = tuple(cur.u64(f"the shape of tensor {name!r}") for _ in range(n_dims))
        n = 1
        for d in shape:
            n *= d
            if n > MAX_ELEMENTS:
                raise errors.AbsurdValueError(f"{self.path}: tensor {name!r} has shape {shape}")
        code = cur.u32(f"the type of tensor {name!r}")
        try:
            gtype = GGMLType(code)
        except ValueError:
            raise errors.UnknownTensorTypeError(
                f"{self.path}: tensor {name!r} has unknown type code {code}"
            ) from None
        rel = cur.u64(f"the offset of tensor {name!r}")
        return name, shape, gtype, rel

    def _place_tensor(
        self, name: str, shape: tuple[int, ...], gtype: GGMLType, rel: int
    ) -> TensorInfo:
        if name in self.tensors:
            raise errors.DuplicateNameError(f"{self.path}: tensor {name!r} appears twice")
        layout = BLOCK_LAYOUTS[gtype]
        if shape[0] % layout.block_size:
            raise errors.AbsurdValueError(
                f"{self.path}: tensor {name!r} rows of {shape[0]} values do not split into "
                f"{gtype.name} blocks of {layout.block_size}"
            )
        if rel % self.alignment:
            raise errors.MisalignedTensorError(
                f"{self.path}: tensor {name!r} data offset {rel} is not a multiple of "
                f"the alignment {self.alignment}"
            )
        n = 1
        for d in shape:
            n *= d
        nbytes = n // layout.block_size * layout.type_size
        start = self.data_offset + rel
        if start + nbytes > self.file_size:
            raise errors.TensorOutOfBoundsError(
                f"{self.path}: tensor {name!r} data [{start}, {start + nbytes}) lies beyond "
                f"the end of the file ({self.file_size} bytes)"
            )
        return TensorInfo(name, shape, gtype, start, nbytes)

    # --- access --------------------------------------------------------------------------

    def tensor_data(self, name: str) -> np.ndarray:
        """The raw bytes of tensor ``name`` as a read-only uint8 view into the map."""
        if self._map is None:
            raise errors.ModelClosedError(f"{self.path}: file is closed")
        info = self.tensors[name]
        return np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=info.offset)

    def buffer(self) -> mmap.mmap:
        """The whole file's map, for native code that reads tensors in place."""
        if self._map is None:
            raise errors.ModelClosedError(f"{self.path}: file is closed")
        return self._map

    def close(self) -> None:
        """Unmaps the file once no view into it remains; views keep it alive until then."""
        m, self._map = self._map, None
        if m is not None:
            # BufferError: numpy views still point into the map; it is unmapped when they go
            with contextlib.suppress(BufferError):
                m.close()

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
