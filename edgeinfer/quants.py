"""GGML block formats in numpy: the layouts and bit-exact dequantizers, the oracle for the
native kernels.

One class per GGML type works on whole arrays of blocks: ``dequantize_blocks`` maps
``(n_blocks, type_size)`` uint8 to ``(n_blocks, block_size)`` float32. The module functions
:func:`dequantize` and :func:`row_nbytes` work on tensors. Decoding follows ggml's
``dequantize_row_*`` in float32, so the values are the ones ggml computes, bit for bit.

Writing blocks is converter work: ``edgeinfer.converters.quantizers`` extends each class with
ggml's quantizers (and their scale searches). The runtime only reads.

The float conversions (F16, BF16) follow ggml's NaN rules exactly; both directions are here,
as they define the formats.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from edgeinfer import errors
from edgeinfer.gguf.constants import BLOCK_LAYOUTS, QK_K, GGMLType

__all__ = [
    "QUANT_TYPES",
    "BlockQuant",
    "dequantize",
    "quant_type",
    "row_nbytes",
    "fp32_to_fp16_bits",
    "fp16_bits_to_fp32",
    "fp32_to_bf16_bits",
    "bf16_bits_to_fp32",
]

_F32 = np.float32
_CHUNK_VALUES = 1 << 21  # values per chunk: keeps every temporary of a chunk near 8 MiB


# --- half and bfloat16 ---------------------------------------------------------------------


def fp32_to_fp16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> IEEE half bits, rounding to nearest even; NaN becomes ggml's quiet 0x7E00."""
    x = np.asarray(x, dtype=_F32)
    with np.errstate(over="ignore", invalid="ignore"):
        bits = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        sign = (x.view(np.uint32) >> 16).astype(np.uint16) & np.uint16(0x8000)
        bits = np.where(nan, sign | np.uint16(0x7E00), bits)
    return bits


def _fp16_table() -> np.ndarray:
    """float32 value of every half bit pattern, NaNs made quiet as ggml's conversion does."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    table = bits.view(np.float16).astype(_F32)
    nan = (bits & np.uint16(0x7FFF)) > np.uint16(0x7C00)
    table.view(np.uint32)[nan] |= np.uint32(0x00400000)
    return table


_FP16_TO_FP32 = _fp16_table()  # 256 KiB; a gather beats numpy's half conversion threefold


def fp16_bits_to_fp32(h: np.ndarray) -> np.ndarray:
    """IEEE half bits -> float32 (exact); NaNs come out quiet, as in ggml."""
    return _FP16_TO_FP32[np.asarray(h, dtype=np.uint16)]


def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits: round to nearest even, NaNs made quiet (ggml's rule)."""
    u = np.asarray(x, dtype=_F32).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, (u >> 16) | np.uint32(64), rounded).astype(np.uint16)


def bf16_bits_to_fp32(h: np.ndarray) -> np.ndarray:
    """bfloat16 bits -> float32: the bits are the top half of the float."""
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << 16).view(_F32)


# --- bit fields shared by several formats ----------------------------------------------------


def _unpack_2bit(qs: np.ndarray) -> np.ndarray:
    """Q2_K / Q3_K quants: (n, 64) -> (n, 256) levels 0..3; byte l of each 128-half holds
    values l, l+32, l+64, l+96 in bits 0-1, 2-3, 4-5, 6-7."""
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
    return ((qs.reshape(-1, 2, 1, 32) >> shifts) & 3).reshape(-1, QK_K)


def _unpack_nibbles_k(qs: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K low nibbles: each 32 bytes hold 64 values, the first 32 low, the next high."""
    q = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([q & 15, q >> 4], axis=2).reshape(-1, QK_K)


def _unpack_k4_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """get_scale_min_k4 for all 8 sub-blocks: (n, 12) -> scales (n, 8), mins (n, 8)."""
    sc = np.empty((b.shape[0], 8), dtype=np.uint8)
    m = np.empty_like(sc)
    sc[:, :4] = b[:, 0:4] & 63
    m[:, :4] = b[:, 4:8] & 63
    sc[:, 4:] = (b[:, 8:12] & 15) | ((b[:, 0:4] >> 6) << 4)
    m[:, 4:] = (b[:, 8:12] >> 4) | ((b[:, 4:8] >> 6) << 4)
    return sc, m


def q3_k_scales(b: np.ndarray) -> np.ndarray:
    """Q3_K: 12 bytes -> 16 scales of 6 bits, minus 32: (n, 12) -> (n, 16) int8 in -32..31.
    Low nibbles of scales j and j+8 share byte j; the high two bits of scale j are in byte
    8 + j % 4 at bit 2 (j // 4)."""
    low = np.concatenate([b[:, :8] & 15, b[:, :8] >> 4], axis=1)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
    high = ((b[:, None, 8:] >> shifts) & 3).reshape(-1, 16)
    return ((low | (high << 4)).astype(np.int16) - 32).astype(np.int8)


def _unpack_bits(b: np.ndarray) -> np.ndarray:
    """(n, m) bytes -> (n, 8, m) uint8 0/1: [:, k, j] is bit k of byte j (Q3_K, Q5_K)."""
    return np.unpackbits(b[:, None, :], axis=1, bitorder="little")


# --- one class per type ----------------------------------------------------------------------


class BlockQuant:
    """A GGML block format. Subclasses set ``ggml_type`` and ``layout`` (one block as a numpy
    structured dtype whose size is checked against ``BLOCK_LAYOUTS`` at import) and implement
    ``_dequantize`` on arrays of such blocks. The quantizers that write them are converter
    code: ``edgeinfer.converters.quantizers`` extends each class with ``quantize_blocks``."""

    ggml_type: ClassVar[GGMLType]
    layout: ClassVar[np.dtype]
    block_size: ClassVar[int]
    type_size: ClassVar[int]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "ggml_type" not in cls.__dict__:  # a shared base such as Q45K
            return
        layout = BLOCK_LAYOUTS[cls.ggml_type]
        cls.block_size, cls.type_size = layout.block_size, layout.type_size
        if cls.layout.itemsize != cls.type_size:
            raise AssertionError(f"{cls.__name__}: layout is {cls.layout.itemsize} bytes")

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        """(n_blocks, type_size) uint8 -> (n_blocks, block_size) float32."""
        blocks = np.ascontiguousarray(blocks, dtype=np.uint8)
        if blocks.ndim != 2 or blocks.shape[1] != cls.type_size:
            raise errors.InvalidOptionError(
                f"{cls.ggml_type.name} blocks must have shape (n, {cls.type_size}), "
                f"not {blocks.shape}"
            )
        out = np.empty((blocks.shape[0], cls.block_size), dtype=_F32)
        if blocks.shape[0]:
            with np.errstate(all="ignore"):  # inf and NaN scales decode as in C, silently
                cls._dequantize(blocks.view(cls.layout)[:, 0], out)
        return out

    @classmethod
    def _dequantize(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError


# --- plain floats ---


class F32(BlockQuant):
    ggml_type = GGMLType.F32
    layout = np.dtype([("v", "<f4")])  # one float32

    @classmethod
    def _dequantize(cls, blocks, out):
        out[:, 0] = blocks["v"]


class F16(BlockQuant):
    ggml_type = GGMLType.F16
    layout = np.dtype([("v", "<u2")])  # one IEEE half

    @classmethod
    def _dequantize(cls, blocks, out):
        out[:, 0] = fp16_bits_to_fp32(blocks["v"])


class BF16(BlockQuant):
    ggml_type = GGMLType.BF16
    layout = np.dtype([("v", "<u2")])  # top half of a float32

    @classmethod
    def _dequantize(cls, blocks, out):
        out[:, 0] = bf16_bits_to_fp32(blocks["v"])


# --- 32-value blocks ---


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32) uint8 in value order: the low nibbles, then the high ones."""
    q = np.empty((qs.shape[0], 2, 16), dtype=np.uint8)
    np.bitwise_and(qs, 15, out=q[:, 0])
    np.right_shift(qs, 4, out=q[:, 1])
    return q.reshape(-1, 32)


def _q5_levels(blocks: np.ndarray) -> np.ndarray:
    """Q5_0 / Q5_1 levels 0..31 in value order: (n, 32) uint8."""
    q = _nibbles(blocks["qs"])
    q |= np.unpackbits(blocks["qh"], axis=1, bitorder="little") << 4
    return q


class Q4_0(BlockQuant):
    """x = d * (q - 8), q in 0..15; value j in the low nibble of byte j, j+16 in the high."""

    ggml_type = GGMLType.Q4_0
    layout = np.dtype([("d", "<u2"), ("qs", "u1", 16)])

    @classmethod
    def _dequantize(cls, blocks, out):
        q = _nibbles(blocks["qs"]).view(np.int8)
        q -= np.int8(8)
        np.multiply(q, fp16_bits_to_fp32(blocks["d"])[:, None], out=out)


class Q4_1(BlockQuant):
    """x = d * q + m, q in 0..15; nibbles as in Q4_0."""

    ggml_type = GGMLType.Q4_1
    layout = np.dtype([("d", "<u2"), ("m", "<u2"), ("qs", "u1", 16)])

    @classmethod
    def _dequantize(cls, blocks, out):
        np.multiply(_nibbles(blocks["qs"]), fp16_bits_to_fp32(blocks["d"])[:, None], out=out)
        out += fp16_bits_to_fp32(blocks["m"])[:, None]


class Q5_0(BlockQuant):
    """x = d * (q - 16), q in 0..31; low nibbles as in Q4_0, bit 4 of value j in bit j of qh."""

    ggml_type = GGMLType.Q5_0
    layout = np.dtype([("d", "<u2"), ("qh", "u1", 4), ("qs", "u1", 16)])

    @classmethod
    def _dequantize(cls, blocks, out):
        d = fp16_bits_to_fp32(blocks["d"])[:, None]
        q = _q5_levels(blocks).view(np.int8)
        q -= np.int8(16)
        np.multiply(q, d, out=out)


class Q5_1(BlockQuant):
    """x = d * q + m, q in 0..31; bits as in Q5_0."""

    ggml_type = GGMLType.Q5_1
    layout = np.dtype([("d", "<u2"), ("m", "<u2"), ("qh", "u1", 4), ("qs", "u1", 16)])

    @classmethod
    def _dequantize(cls, blocks, out):
        np.multiply(_q5_levels(blocks), fp16_bits_to_fp32(blocks["d"])[:, None], out=out)
        out += fp16_bits_to_fp32(blocks["m"])[:, None]


class Q8_0(BlockQuant):
    """x = d * q, q int8. ggml ignores weights for this type, and so do we."""

    ggml_type = GGMLType.Q8_0
    layout = np.dtype([("d", "<u2"), ("qs", "i1", 32)])

    @classmethod
    def _dequantize(cls, blocks, out):
        np.multiply(blocks["qs"], fp16_bits_to_fp32(blocks["d"])[:, None], out=out)


class Q8_1(BlockQuant):
    """Activation format: x = d * q, plus s = d * sum(q) for the dot products."""

    ggml_type = GGMLType.Q8_1
    layout = np.dtype([("d", "<u2"), ("s", "<u2"), ("qs", "i1", 32)])

    @classmethod
    def _dequantize(cls, blocks, out):
        np.multiply(blocks["qs"], fp16_bits_to_fp32(blocks["d"])[:, None], out=out)


# --- 256-value super-blocks ---


class Q2_K(BlockQuant):
    """16 groups of 16: x = d * sc * q - dmin * m, q in 0..3, sc and m 4-bit."""

    ggml_type = GGMLType.Q2_K
    layout = np.dtype([("scales", "u1", 16), ("qs", "u1", 64), ("d", "<u2"), ("dmin", "<u2")])

    @classmethod
    def _dequantize(cls, blocks, out):
        d = fp16_bits_to_fp32(blocks["d"])[:, None]
        dmin = fp16_bits_to_fp32(blocks["dmin"])[:, None]
        sc = blocks["scales"]
        dl = (d * (sc & 15))[:, :, None]  # (n, 16, 1)
        ml = (dmin * (sc >> 4))[:, :, None]
        q = _unpack_2bit(blocks["qs"]).reshape(-1, 16, 16)
        o = out.reshape(-1, 16, 16)
        np.multiply(dl, q, out=o)
        o -= ml


class Q3_K(BlockQuant):
    """16 groups of 16: x = d * sc * (q - 4), q in 0..7 (2 low bits + hmask), sc 6-bit - 32."""

    ggml_type = GGMLType.Q3_K
    layout = np.dtype([("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", 12), ("d", "<u2")])

    @classmethod
    def _dequantize(cls, blocks, out):
        d = fp16_bits_to_fp32(blocks["d"])[:, None]
        dl = (d * q3_k_scales(blocks["scales"]))[:, :, None]  # (n, 16, 1)
        low = _unpack_2bit(blocks["qs"]).astype(np.int8)
        high = _unpack_bits(blocks["hmask"]).reshape(-1, QK_K).view(np.int8)
        q = low - ((1 - high) << 2)
        np.multiply(dl, q.reshape(-1, 16, 16), out=out.reshape(-1, 16, 16))


class Q45K(BlockQuant):
    """Q4_K and Q5_K: 8 groups of 32, x = d * sc * q - dmin * m, sc and m 6-bit."""

    @classmethod
    def scales_and_mins(cls, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each sub-block's scale d * sc and offset dmin * m: (n, 8, 1) float32 each."""
        sc, m = _unpack_k4_scales(blocks["scales"])
        d = fp16_bits_to_fp32(blocks["d"])[:, None]
        dmin = fp16_bits_to_fp32(blocks["dmin"])[:, None]
        return (d * sc)[:, :, None], (dmin * m)[:, :, None]


class Q4_K(Q45K):
    ggml_type = GGMLType.Q4_K
    layout = np.dtype([("d", "<u2"), ("dmin", "<u2"), ("scales", "u1", 12), ("qs", "u1", 128)])

    @classmethod
    def _dequantize(cls, blocks, out):
        dl, ml = cls.scales_and_mins(blocks)
        q = _unpack_nibbles_k(blocks["qs"]).reshape(-1, 8, 32)
        o = out.reshape(-1, 8, 32)
        np.multiply(dl, q, out=o)
        o -= ml


class Q5_K(Q45K):
    """As Q4_K with a fifth bit: bit k of qh[l] is bit 4 of value 32 k + l."""

    ggml_type = GGMLType.Q5_K
    layout = np.dtype(
        [("d", "<u2"), ("dmin", "<u2"), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)]
    )

    @classmethod
    def _dequantize(cls, blocks, out):
        dl, ml = cls.scales_and_mins(blocks)
        q = _unpack_nibbles_k(blocks["qs"]).reshape(-1, 8, 32) | (_unpack_bits(blocks["qh"]) << 4)
        o = out.reshape(-1, 8, 32)
        np.multiply(dl, q, out=o)
        o -= ml


class Q6_K(BlockQuant):
    """16 groups of 16: x = d * sc * (q - 32), q 6-bit (4 in ql, 2 in qh), sc int8."""

    ggml_type = GGMLType.Q6_K
    layout = np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<u2")])

    @classmethod
    def _dequantize(cls, blocks, out):
        d = fp16_bits_to_fp32(blocks["d"])[:, None]
        dl = (d * blocks["scales"])[:, :, None]  # (n, 16, 1)
        ql = blocks["ql"].reshape(-1, 2, 2, 32)  # (n, half, low/high 32 bytes, l)
        low = np.stack([ql & 15, ql >> 4], axis=2).reshape(-1, 2, 4, 32)  # quarters 0, 1, 2, 3
        shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
        high = (blocks["qh"].reshape(-1, 2, 1, 32) >> shifts) & 3
        q = (low | (high << 4)).astype(np.int8) - 32
        np.multiply(dl, q.reshape(-1, 16, 16), out=out.reshape(-1, 16, 16))


class Q8_K(BlockQuant):
    """Activation format: x = d * q with d float32, plus the sum of each 16 quants."""

    ggml_type = GGMLType.Q8_K
    layout = np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])

    @classmethod
    def _dequantize(cls, blocks, out):
        np.multiply(blocks["d"][:, None], blocks["qs"], out=out)


# --- tensors ---------------------------------------------------------------------------------

QUANT_TYPES: dict[GGMLType, type[BlockQuant]] = {
    cls.ggml_type: cls
    for cls in (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1,
                Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K)
}  # fmt: skip


def quant_type(ggml_type: GGMLType | int) -> type[BlockQuant]:
    """The block class of a GGML type; UnknownTensorTypeError for types without one."""
    try:
        return QUANT_TYPES[GGMLType(ggml_type)]
    except (KeyError, ValueError):
        name = getattr(ggml_type, "name", ggml_type)
        raise errors.UnknownTensorTypeError(f"no numpy codec for GGML type {name}") from None


def row_nbytes(ggml_type: GGMLType | int, n: int) -> int:
    """Bytes of one row of n values (n a multiple of the block size)."""
    cls = quant_type(ggml_type)
    if n < 0 or n % cls.block_size:
        raise errors.InvalidOptionError(
            f"a {cls.ggml_type.name} row needs a multiple of {cls.block_size} values, not {n}"
        )
    return n // cls.block_size * cls.type_size


def dequantize(raw: np.ndarray, ggml_type: GGMLType | int, shape: tuple[int, ...]) -> np.ndarray:
    """A tensor's bytes -> float32 array of ``shape`` (numpy order, rows last)."""
    cls = quant_type(ggml_type)
    shape = tuple(int(s) for s in shape)
    n_values = int(np.prod(shape, dtype=np.int64))
    if not shape or shape[-1] % cls.block_size:
        raise errors.InvalidOptionError(
            f"{cls.ggml_type.name} rows need a multiple of {cls.block_size} values: {shape}"
        )
    n_blocks = n_values // cls.block_size
    raw = np.asarray(raw)
    if raw.dtype != np.uint8 or raw.size != n_blocks * cls.type_size:
        raise errors.InvalidOptionError(
            f"{shape} {cls.ggml_type.name} takes {n_blocks * cls.type_size} bytes of uint8, "
            f"not {raw.size} of {raw.dtype}"
        )
    blocks = np.ascontiguousarray(raw).reshape(n_blocks, cls.type_size).view(cls.layout)[:, 0]
    out = np.empty((n_blocks, cls.block_size), dtype=_F32)
    step = max(1, _CHUNK_VALUES // cls.block_size)
    with np.errstate(all="ignore"):
        for start in range(0, n_blocks, step):
            cls._dequantize(blocks[start : start + step], out[start : start + step])
    return out.reshape(shape)
