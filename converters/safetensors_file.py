"""Safetensors files read in place, row ranges at a time, treating every file as hostile.

Only the JSON header is parsed up front; tensor data is read with positioned reads of the
rows asked for, so that converting a tensor needs memory for one chunk of rows, not for the
tensor or the file (a memory map would also do, but its pages count against the process until
the kernel drops them). The header is checked as the safetensors library checks it: a size
cap, known dtypes, shapes that match their byte ranges, and ranges that tile the data section
exactly, without gaps or overlaps.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeinfer.converters import errors

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own cap
# a tensor with values has every dimension within the file's size; only an empty one could
# claim more, and numpy cannot shape even an empty array of, say, [0, 2**62]
MAX_DIM = 1 << 40

# safetensors dtype -> (numpy dtype of the stored bits, bytes per value)
DTYPES: dict[str, tuple[str, int]] = {
    "F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2), "F64": ("<f8", 8),
}  # fmt: skip
OTHER_DTYPES = {"I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64", "BOOL", "F8_E4M3", "F8_E5M2",
                "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64"}  # fmt: skip


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file; ``shape`` in numpy order (rows first)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute position of the data in the file
    nbytes: int
    path: Path

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def row_length(self) -> int:
        return self.shape[-1] if self.shape else 1

    @property
    def n_rows(self) -> int:
        return self.n_elements // self.row_length if self.row_length else 0


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


class SafetensorsFile:
    """The header of one ``.safetensors`` file and positioned reads of its tensors."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            info = self.path.stat()
            # opening a FIFO or a device would block or read without end: refused unopened
            if stat.S_ISDIR(info.st_mode):
                raise errors.CorruptSafetensorsError(f"{self.path}: is a directory")
            if not stat.S_ISREG(info.st_mode):
                raise errors.CorruptSafetensorsError(f"{self.path}: is not a regular file")
            self.size = info.st_size
            with open(self.path, "rb") as f:
                prefix = f.read(8)
                if len(prefix) < 8:
                    raise self._corrupt(f"{self.size} bytes is too short for a header")
                (n,) = struct.unpack("<Q", prefix)
                if n > MAX_HEADER_BYTES or n > self.size - 8:
                    raise self._corrupt(
                        f"header length {n} is impossible for a {self.size}-byte file"
                    )
                raw = f.read(n)
        except FileNotFoundError:
            raise errors.MissingSourceFileError(f"{self.path}: no such file") from None
        except OSError as e:
            raise errors.SourceError(f"{self.path}: cannot read ({e.strerror})") from None
        except ValueError:  # a NUL in the path (a shard name from an index file)
            raise errors.SourceError(f"{self.path!r}: not a usable file name") from None
        self.data_start = 8 + n
        self.metadata: dict[str, str] = {}
        self.tensors: dict[str, TensorEntry] = self._parse(raw)

    def _corrupt(self, why: str) -> errors.CorruptSafetensorsError:
        return errors.CorruptSafetensorsError(f"{self.path}: corrupt safetensors file: {why}")

    def _parse(self, raw: bytes) -> dict[str, TensorEntry]:
        if not raw.startswith(b"{"):
            raise self._corrupt("the header is not a JSON object")
        try:
            header = json.loads(raw.decode("utf-8"), object_pairs_hook=self._no_duplicates)
        except (ValueError, RecursionError) as e:
            # ValueError: bad UTF-8, bad JSON, or an integer of more digits than Python reads;
            # RecursionError: arrays or objects nested deeper than the decoder goes
            raise self._corrupt(f"the header is not valid JSON ({str(e)[:200]})") from None
        if not isinstance(header, dict):
            raise self._corrupt("the header is not a JSON object")
        meta = header.pop("__metadata__", {})
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise self._corrupt("__metadata__ must map strings to strings")
        self.metadata = meta
        entries = [self._entry(name, spec) for name, spec in header.items()]
        data_size = self.size - self.data_start
        pos = 0
        for entry in sorted(entries, key=lambda e: (e.start, e.nbytes)):
            if entry.start - self.data_start != pos:
                what = (
                    "overlaps the previous one"
                    if entry.start - self.data_start < pos
                    else "leaves a gap"
                )
                raise self._corrupt(f"tensor {entry.name!r} {what}")
            pos += entry.nbytes
        if pos != data_size:
            raise self._corrupt(f"the tensors cover {pos} bytes, the data section has {data_size}")
        return {e.name: e for e in entries}

    def _no_duplicates(self, pairs: list[tuple[str, object]]) -> dict[str, object]:
        out: dict[str, object] = {}
        for key, value in pairs:
            if key in out:
                raise self._corrupt(f"key {key!r} appears twice")
            out[key] = value
        return out

    def _entry(self, name: str, spec: object) -> TensorEntry:
        if not isinstance(spec, dict):
            raise self._corrupt(f"tensor {name!r} has no description")
        dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
        if not isinstance(dtype, str):
            raise self._corrupt(f"tensor {name!r} has a dtype that is not a name: {dtype!r}")
        if dtype not in DTYPES:
            if dtype in OTHER_DTYPES:
                raise errors.UnsupportedFeatureError(
                    f"{self.path}: tensor {name!r} is stored as {dtype}; only F32, F16, BF16 and "
                    "F64 checkpoints can be converted (dequantize it first)"
                )
            raise self._corrupt(f"tensor {name!r} has unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIM for d in shape
        ):
            raise self._corrupt(f"tensor {name!r} has a bad shape {shape!r}")
        if (
            not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):  # fmt: skip
            raise self._corrupt(f"tensor {name!r} has bad data_offsets {offsets!r}")
        nbytes = math.prod(shape) * DTYPES[dtype][1]
        if offsets[1] - offsets[0] != nbytes:
            raise self._corrupt(
                f"tensor {name!r} of shape {shape} and dtype {dtype} needs {nbytes} bytes, "
                f"its offsets span {offsets[1] - offsets[0]}"
            )
        if self.data_start + offsets[1] > self.size:
            raise self._corrupt(f"tensor {name!r} lies beyond the end of the file")
        return TensorEntry(
            name, dtype, tuple(shape), self.data_start + offsets[0], nbytes, self.path
        )


def read_rows(entry: TensorEntry, first: int, count: int) -> np.ndarray:
    """Rows [first, first+count) of ``entry`` as float32, shape (count, row_length)."""
    # within the tensor's rows, so that the buffer is bounded by the bytes the file holds
    # (an empty tensor of shape [0, 2**60] has no row to read)
    if not 0 <= first <= first + count <= entry.n_rows:
        raise errors.ShapeMismatchError(
            f"{entry.path}: rows {first}..{first + count} of {entry.name!r}"
        )
    dtype, size = DTYPES[entry.dtype]
    row_bytes = entry.row_length * size
    n = count * row_bytes
    buf = bytearray(n)
    with open(entry.path, "rb", buffering=0) as f:
        f.seek(entry.start + first * row_bytes)
        got = f.readinto(buf)
    if got != n:
        raise errors.CorruptSafetensorsError(
            f"{entry.path}: file ends inside tensor {entry.name!r}"
        )
    raw = np.frombuffer(buf, dtype=dtype).reshape(count, entry.row_length)
    if entry.dtype == "BF16":
        return bf16_to_f32(raw)
    if entry.dtype == "F32":
        return raw
    with np.errstate(over="ignore"):  # an F64 beyond float32's range is inf, as torch casts it
        return raw.astype(np.float32)
