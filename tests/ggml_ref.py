"""ctypes binding to ggml's reference quantizers, the oracle for ``edgeinfer.quants``.

The library is the ``libggml-base`` that llama-cpp-python ships (``llama_cpp/lib/``); the
environment variable ``EDGEINFER_GGML_LIB`` names another copy (for instance one built from the
same vendored source). ggml-base holds the scalar ``quantize_row_*_ref`` / ``dequantize_row_*``
code, compiled without ``-march``, so its float arithmetic is plain IEEE single precision.

Only this module touches ctypes; every foreign signature is declared in ``_SIGNATURES``. The
public methods take and return numpy arrays and never hand out pointers.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path

import numpy as np

from edgeinfer.gguf.constants import BLOCK_LAYOUTS, GGMLType

_c_float_p = ctypes.POINTER(ctypes.c_float)

# name: (restype, argtypes)
_SIGNATURES = {
    # type, src, dst, start, nrows, n_per_row, imatrix
    "ggml_quantize_chunk": (
        ctypes.c_size_t,
        [ctypes.c_int, _c_float_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
         ctypes.c_int64, _c_float_p],
    ),
    "ggml_quantize_init": (None, [ctypes.c_int]),
    "ggml_row_size": (ctypes.c_size_t, [ctypes.c_int, ctypes.c_int64]),
    "ggml_type_size": (ctypes.c_size_t, [ctypes.c_int]),
    "ggml_blck_size": (ctypes.c_int64, [ctypes.c_int]),
    "ggml_get_type_traits": (ctypes.c_void_p, [ctypes.c_int]),
    # activation quantizers that ggml_quantize_chunk does not dispatch: src, dst, k
    "quantize_row_q8_K_ref": (None, [_c_float_p, ctypes.c_void_p, ctypes.c_int64]),
    "quantize_row_q8_1_ref": (None, [_c_float_p, ctypes.c_void_p, ctypes.c_int64]),
    # Q8_K has no to_float in ggml-base's type traits: src, dst, k
    "dequantize_row_q8_K": (None, [ctypes.c_void_p, _c_float_p, ctypes.c_int64]),
}  # fmt: skip

# void (*)(const void * x, float * y, int64_t k)
_ToFloat = ctypes.CFUNCTYPE(None, ctypes.c_void_p, _c_float_p, ctypes.c_int64)


class _TypeTraits(ctypes.Structure):
    """``struct ggml_type_traits`` from ggml.h."""

    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


def find_library() -> Path | None:
    """The libggml-base to test against, or None when there is none on this machine."""
    override = os.environ.get("EDGEINFER_GGML_LIB")
    if override:
        return Path(override)
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    lib_dir = Path(spec.origin).parent / "lib"
    candidates = sorted(lib_dir.glob("libggml-base.so*"))
    candidates += sorted(lib_dir.glob("libggml-base*.dylib"))
    return candidates[0] if candidates else None


class GGMLReference:
    """ggml's own (de)quantizers over numpy arrays."""

    def __init__(self, path: Path):
        self.path = path
        self._lib = ctypes.CDLL(str(path))
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(self._lib, name)
            fn.restype = restype
            fn.argtypes = argtypes

    # --- sizes ---------------------------------------------------------------------------

    def type_size(self, ggml_type: GGMLType) -> int:
        return self._lib.ggml_type_size(int(ggml_type))

    def blck_size(self, ggml_type: GGMLType) -> int:
        return self._lib.ggml_blck_size(int(ggml_type))

    def row_size(self, ggml_type: GGMLType, n: int) -> int:
        return self._lib.ggml_row_size(int(ggml_type), n)

    def traits(self, ggml_type: GGMLType) -> _TypeTraits:
        return _TypeTraits.from_address(self._lib.ggml_get_type_traits(int(ggml_type)))

    # --- quantize ------------------------------------------------------------------------

    def quantize(
        self, values: np.ndarray, ggml_type: GGMLType, imatrix: np.ndarray | None = None
    ) -> np.ndarray:
        """``(rows, n_per_row)`` float32 -> ``(rows, row_bytes)`` uint8.

        Q8_K and Q8_1 go through their ``quantize_row_*_ref`` (ggml_quantize_chunk does not
        dispatch them); every other type through ``ggml_quantize_chunk``.
        """
        src = np.ascontiguousarray(values, dtype=np.float32)
        rows, n_per_row = src.shape
        dst = np.zeros((rows, self.row_size(ggml_type, n_per_row)), dtype=np.uint8)
        src_p = src.ctypes.data_as(_c_float_p)
        if ggml_type in (GGMLType.Q8_K, GGMLType.Q8_1):
            if imatrix is not None:
                raise ValueError(f"{ggml_type.name} takes no importance matrix")
            name = (
                "quantize_row_q8_K_ref" if ggml_type == GGMLType.Q8_K else "quantize_row_q8_1_ref"
            )
            getattr(self._lib, name)(src_p, dst.ctypes.data, src.size)
            return dst
        imatrix_p = None
        if imatrix is not None:
            imatrix = np.ascontiguousarray(imatrix, dtype=np.float32)
            if imatrix.shape != (n_per_row,):
                raise ValueError(f"imatrix must have shape ({n_per_row},), not {imatrix.shape}")
            imatrix_p = imatrix.ctypes.data_as(_c_float_p)
        written = self._lib.ggml_quantize_chunk(
            int(ggml_type), src_p, dst.ctypes.data, 0, rows, n_per_row, imatrix_p
        )
        assert written == dst.size, (written, dst.size)
        return dst

    # --- dequantize ----------------------------------------------------------------------

    def dequantize(self, raw: np.ndarray, ggml_type: GGMLType, n: int) -> np.ndarray:
        """The first ``n`` values stored in the bytes ``raw``, as float32."""
        raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
        layout = BLOCK_LAYOUTS[ggml_type]
        if raw.size < n // layout.block_size * layout.type_size:
            raise ValueError("raw is shorter than n values")
        out = np.empty(n, dtype=np.float32)
        out_p = out.ctypes.data_as(_c_float_p)
        if ggml_type == GGMLType.F32:
            out[:] = raw[: 4 * n].view(np.float32)
        elif ggml_type == GGMLType.Q8_K:
            self._lib.dequantize_row_q8_K(raw.ctypes.data, out_p, n)
        else:
            to_float = self.traits(ggml_type).to_float
            if not to_float:
                raise ValueError(f"ggml has no dequantizer for {ggml_type.name}")
            _ToFloat(to_float)(raw.ctypes.data, out_p, n)
        return out


_loaded: GGMLReference | None = None


def load() -> GGMLReference | None:
    """The process-wide reference, or None when no libggml-base is installed."""
    global _loaded
    if _loaded is None:
        path = find_library()
        if path is None or not path.exists():
            return None
        _loaded = GGMLReference(path)
    return _loaded
