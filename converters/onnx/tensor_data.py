"""Initializers streamed into one external data file, next to a small ``model.onnx``.

ONNX keeps large tensors outside the protobuf (which cannot exceed 2 GiB): each initializer
names a file, an offset and a length. Writing the bytes as each tensor is produced, rather than
building every array and then calling ``onnx.save``, keeps the converter's memory near one
tensor. Offsets are aligned to pages so that onnxruntime can map the file; tensors of a few
values (norm weights, shape constants) stay inside the protobuf.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import numpy.typing as npt
from onnx import TensorProto, numpy_helper

ALIGNMENT = 4096
INLINE_BYTES = 1024  # smaller tensors are stored inside model.onnx

ONNX_TYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
}


class TensorData:
    """The external data file of one model; ``add`` returns the initializer to put in the graph."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file = open(self.path, "wb")  # noqa: SIM115 (closed by close() or the with block)
        self.size = 0

    def add(self, name: str, array: np.ndarray) -> TensorProto:
        """``array`` as an initializer: inline when small, else appended to the file."""
        array = np.ascontiguousarray(array)
        if array.nbytes <= INLINE_BYTES:
            return numpy_helper.from_array(array, name)
        return self.add_chunks(name, array.dtype, array.shape, [array])

    def add_chunks(
        self, name: str, dtype: npt.DTypeLike, shape: tuple[int, ...], chunks: Iterable[np.ndarray]
    ) -> TensorProto:
        """An initializer whose row-major bytes are the concatenated ``chunks``."""
        dtype = np.dtype(dtype)
        self._pad()
        offset = self.size
        for chunk in chunks:
            data = np.ascontiguousarray(chunk, dtype=dtype).tobytes()
            self._file.write(data)
            self.size += len(data)
        length = self.size - offset
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if length != expected:
            raise AssertionError(f"{name}: wrote {length} bytes for shape {shape} ({expected})")
        proto = TensorProto()
        proto.name = name
        proto.data_type = ONNX_TYPES[dtype]
        proto.dims.extend(shape)
        proto.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", offset), ("length", length)):
            entry = proto.external_data.add()
            entry.key, entry.value = key, str(value)
        return proto

    def _pad(self) -> None:
        gap = -self.size % ALIGNMENT
        if gap:
            self._file.write(b"\0" * gap)
            self.size += gap

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()

    def __enter__(self) -> TensorData:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
