"""GGML block formats in numpy: bit-exact (de)quantizers, the oracle for the native kernels.

One class per GGML type works on whole arrays of blocks: ``dequantize_blocks`` maps
``(n_blocks, type_size)`` uint8 to ``(n_blocks, block_size)`` float32 and ``quantize_blocks``
goes back. The module functions :func:`dequantize`, :func:`quantize` and :func:`row_nbytes` work
on tensors.

Quantizers reproduce ggml's reference quantizers byte for byte, as ``ggml_quantize_chunk``
runs them: ``quantize_row_*_ref`` without an importance matrix, the ``quantize_row_*_impl``
searches with one (``weights=``). That takes more than the same formulas:

* every float operation is float32, in ggml's order. Sums are sequential left-to-right
  (``np.add.accumulate``, never numpy's pairwise ``sum``), ``a*b*c`` is ``(a*b)*c``, and no
  product is fused into an add (ggml-base is built without FMA);
* rounding follows ggml: ``nearest_int`` is its float32 magic-number trick, ``roundf`` rounds
  half away from zero, and a float converted to a small integer type keeps the low byte of
  the x86 truncating conversion (INT_MIN for NaN and out-of-range values; an ARM build of
  ggml saturates instead, which only matters for degenerate scales);
* ties in max/min searches go to the first element, as ggml's strict comparisons do;
* the data-dependent loops (``break`` when nothing changed) run a fixed number of passes:
  a pass that changes nothing leaves the state as it found it, so the extra passes are no-ops.

Searches run vectorized over blocks; the only Python loops are over positions inside a block
and over the fixed candidate scales of each search.

The float conversions (F16, BF16) follow ggml's NaN rules exactly. NaN inputs to the block
quantizers are not covered: ggml's running maxima skip NaNs in ways that depend on position.
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
    "quantize",
    "row_nbytes",
    "fp32_to_fp16_bits",
    "fp16_bits_to_fp32",
    "fp32_to_bf16_bits",
    "bf16_bits_to_fp32",
]

_F32 = np.float32
_GROUP_MAX_EPS = _F32(1e-15)  # below this a group is "all zero" for the K-quant searches
_NEAREST_INT_MAGIC = _F32(12582912.0)  # 1.5 * 2**23
_FLT_MAX = np.finfo(np.float32).max
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


# --- C arithmetic as ggml-base compiles it ---------------------------------------------------


def _nearest_int(x: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: add 1.5 * 2**23 in float32 and read the low mantissa bits (int32)."""
    v = (np.asarray(x, dtype=_F32) + _NEAREST_INT_MAGIC).view(np.int32)
    return (v & np.int32(0x007FFFFF)) - np.int32(0x00400000)


def _trunc_int32(x: np.ndarray) -> np.ndarray:
    """x86 cvttss2si: truncate toward zero; NaN and out-of-range give INT_MIN."""
    ok = np.abs(x) < _F32(2.0**31)
    return np.where(ok, np.where(ok, x, _F32(0)).astype(np.int32), np.int32(-(2**31)))


def _c_to_int8(x: np.ndarray) -> np.ndarray:
    """``(int8_t)x`` for a float x: the low byte of the truncating conversion."""
    return _trunc_int32(x).astype(np.int8)


def _roundf(x: np.ndarray) -> np.ndarray:
    """C roundf: half away from zero (numpy's round is half to even)."""
    t = np.trunc(x)
    with np.errstate(invalid="ignore"):
        away = np.abs(x - t) >= _F32(0.5)
    return np.where(away, t + np.sign(x), t)


def _csum(terms: np.ndarray) -> np.ndarray:
    """``float s = 0; for (i...) s += terms[i];`` over the last axis, in float32."""
    return np.add.accumulate(terms, axis=-1)[..., -1] + _F32(0)


def _first_abs_max(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``if (fabsf(v) > amax) { amax = fabsf(v); max = v; }`` from zero, over the last axis.

    Returns (amax, max): the first element of largest magnitude and its signed value, or
    (0, 0) when every element is zero. NaNs are skipped, as the strict comparison skips them.
    """
    ax = np.abs(x)
    ax = np.where(np.isnan(ax), _F32(-1), ax)
    idx = np.argmax(ax, axis=-1)[..., None]
    amax = np.take_along_axis(ax, idx, -1)[..., 0]
    vmax = np.take_along_axis(x, idx, -1)[..., 0]
    found = amax > 0
    return np.where(found, amax, _F32(0)), np.where(found, vmax, _F32(0))


def _positive_max(x: np.ndarray) -> np.ndarray:
    """``float m = 0; if (v > m) m = v;`` over the last axis."""
    m = np.fmax.reduce(x, axis=-1)
    return np.where(m > 0, m, _F32(0))


def _c_macro_max(x: np.ndarray, start: float) -> np.ndarray:
    """``m = start; m = MAX(m, v)`` with ggml's ``MAX(a, b) ((a) > (b) ? (a) : (b))``."""
    m = np.full(x.shape[:-1], start, dtype=_F32)
    for i in range(x.shape[-1]):
        m = np.where(m > x[..., i], m, x[..., i])
    return m


def _take_first(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return np.take_along_axis(x, idx[..., None], -1)[..., 0]


# --- ggml's scale searches, vectorized over groups -------------------------------------------
# Every search takes x of shape (n_groups, n) and returns one scale per group and the levels.


def _make_qx_quants(
    x: np.ndarray, nmax: int, weights: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """make_qx_quants with rmse_type 1: symmetric levels, scale by weighted least squares.

    Tries iscale = -(nmax + 0.1 is) / max for is in -9..9 and keeps the best. Returns
    (scale (g,), L (g, n) int32 in 0 .. 2 nmax - 1). Weights default to x * x.
    """
    amax, vmax = _first_abs_max(x)
    w = x * x if weights is None else weights
    wx = w * x

    def levels(iscale):
        return np.clip(_nearest_int(iscale[:, None] * x), -nmax, nmax - 1)

    with np.errstate(all="ignore"):
        iscale = _F32(-nmax) / vmax
        q = levels(iscale)
        qf = q.astype(_F32)
        sumlx = _csum(wx * qf)
        suml2 = _csum(w * qf * qf)
        scale = np.where(suml2 != 0, sumlx / suml2, _F32(0))
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            iscale = -(_F32(nmax) + _F32(0.1) * _F32(step)) / vmax
            cand = levels(iscale)
            cf = cand.astype(_F32)
            sumlx = _csum(wx * cf)
            suml2 = _csum(w * cf * cf)
            better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            q = np.where(better[:, None], cand, q)
            scale = np.where(better, sumlx / suml2, scale)
            best = np.where(better, scale * sumlx, best)
    zero = amax < _GROUP_MAX_EPS
    return np.where(zero, _F32(0), scale), np.where(zero[:, None], 0, q + nmax)


def _make_q3_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """make_q3_quants with do_rmse: start from -nmax / max, then up to 5 coordinate passes.

    Each pass moves one level at a time to the value the others' least-squares scale
    suggests, keeping the move when it improves sumlx^2 / suml2. Returns (scale, L 0..2nmax-1).
    """
    amax, vmax = _first_abs_max(x)
    w = x * x
    wx = w * x
    with np.errstate(all="ignore"):
        iscale = _F32(-nmax) / vmax
        L = np.clip(_nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
        Lf = L.astype(_F32)
        sumlx = _csum(wx * Lf)
        suml2 = _csum(w * Lf * Lf)
        for _ in range(5):
            for i in range(x.shape[1]):
                wi, wxi, li = w[:, i], wx[:, i], L[:, i].astype(_F32)
                slx = sumlx - wxi * li
                sl2 = suml2 - wi * li * li
                new_l = np.clip(_nearest_int(x[:, i] * sl2 / slx), -nmax, nmax - 1)
                nf = new_l.astype(_F32)
                slx_new = slx + wxi * nf
                sl2_new = sl2 + wi * nf * nf
                take = (
                    (slx > 0)
                    & (new_l != L[:, i])
                    & (sl2_new > 0)
                    & (slx_new * slx_new * suml2 > sumlx * sumlx * sl2_new)
                )
                L[:, i] = np.where(take, new_l, L[:, i])
                sumlx = np.where(take, slx_new, sumlx)
                suml2 = np.where(take, sl2_new, suml2)
        scale = np.where(suml2 > 0, sumlx / suml2, _F32(0))
    zero = amax < _GROUP_MAX_EPS
    return np.where(zero, _F32(0), scale), np.where(zero[:, None], 0, L + nmax)


def _make_qkx_quants(
    x: np.ndarray,
    weights: np.ndarray,
    nmax: int,
    rmin: float,
    rdelta: float,
    nstep: int,
    use_mad: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """make_qkx2_quants / make_qkx3_quants: levels 0..nmax with a scale and a min.

    For iscale = (rmin + rdelta is + nmax) / (max - min), is = 0..nstep, fits scale and min by
    weighted least squares and keeps the candidate with the smallest weighted error (absolute
    with use_mad, squared otherwise). Returns (scale, the_min, L); the block decodes as
    scale * L - the_min. The two ggml versions differ only for NaN input.
    """
    vmin = _take_first(x, np.argmin(x, axis=1))
    vmax = _take_first(x, np.argmax(x, axis=1))
    vmin = np.where(vmin > 0, _F32(0), vmin)
    sum_w = np.add.accumulate(weights, axis=1)[:, -1]
    sum_x = np.add.accumulate(weights * x, axis=1)[:, -1]

    def error(scale, the_min, lf):
        diff = scale[:, None] * lf + the_min[:, None] - x
        return _csum(weights * (np.abs(diff) if use_mad else diff * diff))

    with np.errstate(all="ignore"):
        iscale = _F32(nmax) / (vmax - vmin)
        scale = _F32(1) / iscale
        L = np.clip(_nearest_int(iscale[:, None] * (x - vmin[:, None])), 0, nmax)
        best = error(scale, vmin, L.astype(_F32))
        best_min = vmin
        for step in range(nstep + 1):
            # ggml keeps one `min` variable: once a candidate wins, the later candidates are
            # laid out from the winner's min, not from the data's
            iscale = (_F32(rmin) + _F32(rdelta) * _F32(step) + _F32(nmax)) / (vmax - best_min)
            cand = np.clip(_nearest_int(iscale[:, None] * (x - best_min[:, None])), 0, nmax)
            cf = cand.astype(_F32)
            wl = weights * cf
            sum_l = _csum(wl)
            sum_l2 = _csum(wl * cf)
            sum_xl = _csum(wl * x)
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            clamp = this_min > 0
            this_min = np.where(clamp, _F32(0), this_min)
            this_scale = np.where(clamp, sum_xl / sum_l2, this_scale)
            cur = error(this_scale, this_min, cf)
            better = (D > 0) & (cur < best)
            L = np.where(better[:, None], cand, L)
            best = np.where(better, cur, best)
            scale = np.where(better, this_scale, scale)
            best_min = np.where(better, this_min, best_min)
    flat = vmax == vmin
    scale = np.where(flat, _F32(0), scale)
    the_min = -np.where(flat, vmin, best_min)
    return scale, the_min, np.where(flat[:, None], 0, L)


def _make_qp_quants(x: np.ndarray, nmax: int, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """make_qp_quants: levels 0..nmax (no min) for the scales of a K-quant super-block.

    Picks iscale among (nmax + 0.1 is) / max, is = -4..4, by weighted squared error, then
    refines levels one at a time like make_q3_quants. Returns (scale, L uint8).
    """
    vmax = _c_macro_max(x, 0.0)
    with np.errstate(all="ignore"):
        iscale = _F32(nmax) / vmax
        first = _nearest_int(iscale[:, None] * x).astype(np.uint8).astype(_F32)
        diff = x - (_F32(1) / iscale)[:, None] * first
        best = _csum(weights * diff * diff)
        for step in range(-4, 5):
            if step == 0:
                continue
            iscale_is = (_F32(0.1) * _F32(step) + _F32(nmax)) / vmax
            scale_is = _F32(1) / iscale_is
            cand = np.minimum(nmax, _nearest_int(iscale_is[:, None] * x)).astype(_F32)
            diff = x - scale_is[:, None] * cand
            mse = _csum(weights * diff * diff)
            better = mse < best
            best = np.where(better, mse, best)
            iscale = np.where(better, iscale_is, iscale)
        q = np.minimum(nmax, _nearest_int(iscale[:, None] * x))
        qf = q.astype(_F32)
        wx = weights * x
        sumlx = _csum(wx * qf)
        suml2 = _csum(weights * qf * qf)
        L = q.astype(np.uint8)  # ggml keeps the levels in uint8_t from here on
        for _ in range(5):
            for i in range(x.shape[1]):
                wi, wxi, li = weights[:, i], wx[:, i], L[:, i].astype(_F32)
                slx = sumlx - wxi * li
                sl2 = suml2 - wi * li * li
                new_l = np.minimum(nmax, _nearest_int(x[:, i] * sl2 / slx))
                nf = new_l.astype(_F32)
                slx_new = slx + wxi * nf
                sl2_new = sl2 + wi * nf * nf
                take = (
                    (slx > 0)
                    & (sl2 > 0)
                    & (new_l != L[:, i])
                    & (slx_new * slx_new * suml2 > sumlx * sumlx * sl2_new)
                )
                L[:, i] = np.where(take, new_l.astype(np.uint8), L[:, i])
                sumlx = np.where(take, slx_new, sumlx)
                suml2 = np.where(take, sl2_new, suml2)
        scale = np.where(suml2 > 0, sumlx / suml2, _F32(0))
    zero = vmax < _GROUP_MAX_EPS
    return np.where(zero, _F32(0), scale), np.where(zero[:, None], np.uint8(0), L)


# --- bit packing shared by several formats ---------------------------------------------------


def _pack_fields(parts: np.ndarray, width: int, axis: int) -> np.ndarray:
    """Several small fields per byte: OR of parts[.., k, ..] << (width * k) over ``axis``."""
    shape = [1] * parts.ndim
    shape[axis] = parts.shape[axis]
    shifts = (np.arange(parts.shape[axis], dtype=np.uint8) * width).reshape(shape)
    return np.bitwise_or.reduce(parts.astype(np.uint8) << shifts, axis=axis)


def _pack_2bit(L: np.ndarray) -> np.ndarray:
    """Q2_K / Q3_K quants: (n, 256) levels 0..3 -> (n, 64); byte l of each 128-half holds
    L[l], L[l+32], L[l+64], L[l+96] in bits 0-1, 2-3, 4-5, 6-7."""
    return _pack_fields(L.reshape(-1, 2, 4, 32), 2, axis=2).reshape(-1, 64)


def _unpack_2bit(qs: np.ndarray) -> np.ndarray:
    """Inverse of :func:`_pack_2bit`: (n, 64) -> (n, 256) uint8."""
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
    return ((qs.reshape(-1, 2, 1, 32) >> shifts) & 3).reshape(-1, QK_K)


def _pack_nibbles_k(L: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K low nibbles: each 64 values -> 32 bytes, first 32 low, next 32 high."""
    L = L.astype(np.uint8).reshape(-1, 4, 2, 32)
    return ((L[:, :, 0] & 15) | (L[:, :, 1] << 4)).reshape(-1, QK_K // 2)


def _unpack_nibbles_k(qs: np.ndarray) -> np.ndarray:
    q = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([q & 15, q >> 4], axis=2).reshape(-1, QK_K)


def _pack_k4_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K: 8 scales and 8 mins of 6 bits -> 12 bytes (ggml's layout, uint8 wrap)."""
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    out = np.empty((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 15) | (m[:, 4:] << 4)
    return out


def _unpack_k4_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """get_scale_min_k4 for all 8 sub-blocks: (n, 12) -> scales (n, 8), mins (n, 8)."""
    sc = np.empty((b.shape[0], 8), dtype=np.uint8)
    m = np.empty_like(sc)
    sc[:, :4] = b[:, 0:4] & 63
    m[:, :4] = b[:, 4:8] & 63
    sc[:, 4:] = (b[:, 8:12] & 15) | ((b[:, 0:4] >> 6) << 4)
    m[:, 4:] = (b[:, 8:12] >> 4) | ((b[:, 4:8] >> 6) << 4)
    return sc, m


def _pack_q3_scales(sc6: np.ndarray) -> np.ndarray:
    """Q3_K: 16 scales of 6 bits -> 12 bytes. Low nibbles of scales j and j+8 share byte j;
    the high two bits of scale j go to byte 8 + j % 4 at bit 2 (j // 4)."""
    sc6 = sc6.astype(np.uint8)
    out = np.empty((sc6.shape[0], 12), dtype=np.uint8)
    out[:, :8] = (sc6[:, :8] & 15) | ((sc6[:, 8:] & 15) << 4)
    out[:, 8:] = _pack_fields((sc6 >> 4).reshape(-1, 4, 4), 2, axis=1)
    return out


def _unpack_q3_scales(b: np.ndarray) -> np.ndarray:
    """Inverse of :func:`_pack_q3_scales`, minus 32: (n, 12) -> (n, 16) int8 in -32..31."""
    low = np.concatenate([b[:, :8] & 15, b[:, :8] >> 4], axis=1)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
    high = ((b[:, None, 8:] >> shifts) & 3).reshape(-1, 16)
    return ((low | (high << 4)).astype(np.int16) - 32).astype(np.int8)


def _pack_qh32(L: np.ndarray) -> np.ndarray:
    """Q5_0 / Q5_1: bit 4 of each of the 32 levels -> 4 bytes, level j in bit j (LE uint32)."""
    return np.packbits((L.astype(np.uint8) >> 4) & 1, axis=1, bitorder="little")


def _unpack_bits(b: np.ndarray) -> np.ndarray:
    """(n, m) bytes -> (n, 8, m) uint8 0/1: [:, k, j] is bit k of byte j (Q3_K, Q5_K)."""
    return np.unpackbits(b[:, None, :], axis=1, bitorder="little")


def _row_sigma2(x: np.ndarray, blocks_per_row: int) -> np.ndarray:
    """(sum of x^2 over the row) / row length, repeated for each block: (n_blocks,)."""
    rows = x.reshape(-1, blocks_per_row * x.shape[1])
    return np.repeat(_csum(rows * rows) / _F32(rows.shape[1]), blocks_per_row)


def _importance(x: np.ndarray, qw: np.ndarray, sigma2: np.ndarray) -> np.ndarray:
    """ggml's per-value weight with an importance matrix: qw * sqrt(sigma2 + x^2)."""
    return qw * np.sqrt(sigma2[:, None] + x * x)


# --- one class per type ----------------------------------------------------------------------


class BlockQuant:
    """A GGML block format. Subclasses set ``ggml_type`` and ``layout`` (one block as a numpy
    structured dtype whose size is checked against ``BLOCK_LAYOUTS`` at import) and implement
    ``_dequantize`` and ``_quantize`` on arrays of such blocks."""

    ggml_type: ClassVar[GGMLType]
    layout: ClassVar[np.dtype]
    block_size: ClassVar[int]
    type_size: ClassVar[int]
    accepts_weights: ClassVar[bool] = True  # False: refuse weights= (ggml has no such path)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "ggml_type" not in cls.__dict__:  # a shared base such as _Q45K
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
    def quantize_blocks(
        cls,
        values: np.ndarray,
        weights: np.ndarray | None = None,
        blocks_per_row: int | None = None,
    ) -> np.ndarray:
        """(n_blocks, block_size) float32 -> (n_blocks, type_size) uint8.

        ``weights`` (broadcastable to ``values``) selects ggml's importance-weighted search;
        F32, F16, BF16 and Q8_0 have none and ignore them, as ggml does. ``blocks_per_row``
        says how many consecutive blocks make one row (default: all of them); Q4_0, Q4_1, Q5_0
        and Q5_1 weigh values by a per-row statistic on that path.
        """
        values = np.ascontiguousarray(values, dtype=_F32)
        if values.ndim != 2 or values.shape[1] != cls.block_size:
            raise errors.InvalidOptionError(
                f"{cls.ggml_type.name} values must have shape (n, {cls.block_size}), "
                f"not {values.shape}"
            )
        n = values.shape[0]
        if weights is not None:
            if not cls.accepts_weights:
                raise errors.InvalidOptionError(f"{cls.ggml_type.name} takes no weights")
            weights = np.broadcast_to(np.asarray(weights, dtype=_F32), values.shape)
        blocks_per_row = n if blocks_per_row is None else blocks_per_row
        if n and (blocks_per_row <= 0 or n % blocks_per_row):
            raise errors.InvalidOptionError(
                f"{n} blocks do not split into rows of {blocks_per_row} blocks"
            )
        out = np.zeros(n, dtype=cls.layout)
        if n:
            with np.errstate(all="ignore"):
                cls._quantize(values, out, weights, blocks_per_row)
        return out.view(np.uint8).reshape(n, cls.type_size)

    @classmethod
    def _dequantize(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError

    @classmethod
    def _quantize(cls, x, out, weights, blocks_per_row) -> None:
        raise NotImplementedError


# --- plain floats ---


class F32(BlockQuant):
    ggml_type = GGMLType.F32
    layout = np.dtype([("v", "<f4")])  # one float32

    @classmethod
    def _dequantize(cls, blocks, out):
        out[:, 0] = blocks["v"]

    @classmethod
    def _quantize(cls, x, out, weights, blocks_per_row):
        out["v"] = x[:, 0]


class F16(BlockQuant):
    ggml_type = GGMLType.F16
    layout = np.dtype([("v", "<u2")])  # one IEEE half

    @classmethod
    def _dequantize(cls, blocks, out):
        out[:, 0] = fp16_bits_to_fp32(blocks["v"])

    @classmethod
    def _quantize(cls, x, out, weights, blocks_per_row):
        out["v"] = fp32_to_fp16_bits(x[:, 0])


class BF16(BlockQuant):
    ggml_type = GGMLType.BF16
    layout = np.dtype([("v", "<u2")])  # top half of a float32

    @classmethod
    def _dequantize(cls, blocks, out):
        out[:, 0] = bf16_bits_to_fp32(blocks["v"])

    @classmethod
    def _quantize(cls, x, out, weights, blocks_per_row):
        out["v"] = fp32_to_bf16_bits(x[:, 0])


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

    @classmethod
    def _quantize(cls, x, out, weights, blocks_per_row):
        if weights is not None:
            w = _importance(x, weights, _row_sigma2(x, blocks_per_row))
            d, L = _make_qx_quants(x, 8, w)
            out["d"] = fp32_to_fp16_bits(d)
            out["qs"] = (L[:, :16] | (L[:, 16:] << 4)).astype(np.uint8)
            return
        _, vmax = _first_abs_max(x)
        d = vmax / _F32(-8)
        inv = np.where(d != 0, _F32(1) / d, _F32(0))
        q = np.minimum(15, _c_to_int8(x * inv[:, None] + _F32(8.5))).astype(np.uint8)
        out["d"] = fp32_to_fp16_bits(d)
        out["qs"] = q[:, :16] | (q[:, 16:] << 4)


def _min_max_c(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``min = FLT_MAX, max = -FLT_MAX; if (v < min) min = v; if (v > max) max = v;``"""
    vmin = _take_first(x, np.argmin(x, axis=1))
    vmax = _take_first(x, np.argmax(x, axis=1))
    return np.minimum(vmin, _FLT_MAX), np.maximum(vmax, -_FLT_MAX)


class Q4_1(BlockQuant):
    """x = d * q + m, q in 0..15; nibbles as in Q4_0."""

    ggml_type = GGMLType.Q4_1
    layout = np.dtype([("d", "<u2"), ("m", "<u2"), ("qs", "u1", 16)])

    @classmethod
    def _dequantize(cls, blocks, out):
        np.multiply(_nibbles(blocks["qs"]), fp16_bits_to_fp32(blocks["d"])[:, None], out=out)
        out += fp16_bits_to_fp32(blocks["m"])[:, None]

    @classmethod
    def _quantize(cls, x, out, weights, blocks_per_row):
        if weights is not None:
            w = _importance(x, weights, _row_sigma2(x, blocks_per_row))
            d, the_min, L = _make_qkx_quants(x, w, 15, -0.9, 0.05, 36, False)
            out["d"] = fp32_to_fp16_bits(d)
            out["m"] = fp32_to_fp16_bits(-the_min)
            out["qs"] = (L[:, :16] | (L[:, 16:] << 4)).astype(np.uint8)
            return
        vmin, vmax = _min_max_c(x)
        d = (vmax - vmin) / _F32(15)
        inv = np.where(d != 0, _F32(1) / d, _F32(0))
        q = (x - vmin[:, None]) * inv[:, None] + _F32(0.5)
        q = np.minimum(15, _c_to_int8(q)).astype(np.uint8)
        out["d"] = fp32_to_fp16_bits(d)
        out["m"] = fp32_to_fp16_bits(vmin)
        out["qs"] = q[:, :16] | (q[:, 16:] << 4)


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

    @classmethod
    def _quantize(cls, x, out, weights, blocks_per_row):
        if weights is not None:
            w = _importance(x, weights, _row_sigma2(x, blocks_per_row))
            d, q = _make_qx_quants(x, 16, w)
            q = q.astype(np.uint8)
        else:
            _, vmax = _first_abs_max(x)
            d = vmax / _F32(-16)
            inv = np.where(d != 0, _F32(1) / d, _F32(0))
            q = np.minimum(31, _c_to_int8(x * inv[:, None] + _F32(16.5))).astype(np.uint8)
        out["d"] = fp32_to_fp16_bits(d)
        out["qs"] = (q[:, :16] & 15) | (q[:, 16:] << 4)
        out["qh"] = _pack_qh32(q)


class Q5_1(BlockQuant):
    """x = d * q + m, q in 0..31; bits as in Q5_0."""

    ggml_type = GGMLType.Q5_1
    layout = np.dtype([("d", "<u2"), ("m", "<u2"), ("qh", "u1", 4), ("qs", "u1", 16)])

    @classmethod
    def _dequantize(cls, blocks, out):
        np.multiply(_q5_levels(blocks), fp16_bits_to_fp32(blocks["d"])[:, None], out=out)
        out += fp16_bits_to_fp32(blocks["m"])[:, None]

    @classmethod
    def _quantize(cls, x, out, weights, blocks_per_row):
        if weights is not None:
            w = _importance(x, weights, _row_sigma2(x, blocks_per_row))
            d, the_min, q = _make_qkx_quants(x, w, 31, -0.9, 0.05, 36, False)
            m = -the_min
            q = q.astype(np.uint8)
        else:
            m, vmax = _min_max_c(x)
            d = (vmax - m) / _F32(31)
            inv = np.where(d != 0, _F32(1) / d, _F32(0))
            q = _trunc_int32((x - m[:, None]) * inv[:, None] + _F32(0.5)).astype(np.uint8)
        out["d"] = fp32_to_fp16_bits(d)
        out["m"] = fp32_to_fp16_bits(m)
        out["qs"] = (q[:, :16] & 15) | (q[:, 16:] << 4)
        out["qh"] = _pack_qh32(q)


def _quantize_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 / Q8_1: d = max|x| / 127, q = roundf(x / d). Returns (d, q int8)."""
    amax = _c_macro_max(np.abs(x), 0.0)
    d = amax / _F32(127)
    inv = np.where(d != 0, _F32(1) / d, _F32(0))
    return d, _c_to_int8(_roundf(x * inv[:, None]))


class Q8_0(BlockQuant):
    """x = d * q, q int8. ggml ignores weights for this type, and so do we."""

    ggml_type = GGMLType.Q8_0
    layout = np.dtype([("d", "<u2"), ("qs", "i1", 32)])

    @classmethod
    def _dequantize(cls, blocks, out):
        np.multiply(blocks["qs"], fp16_bits_to_fp32(blocks["d"])[:, None], out=out)

    @classmethod
    def _quantize(cls, x, out, weights, blocks_per_row):
        d, q = _quantize_q8(x)
        out["d"] = fp32_to_fp16_bits(d)
        out["qs"] = q


class Q8_1(BlockQuant):
    """Activation format: x = d * q, plus s = d * sum(q) for the dot products."""

    ggml_type = GGMLType.Q8_1
    layout = np.dtype([("d", "<u2"), ("s", "<u2"), ("qs", "i1", 32)])
    accepts_weights = False

    @classmethod
    def _dequantize(cls, blocks, out):
        np.multiply(blocks["qs"], fp16_bits_to_fp32(blocks["d"])[:, None], out=out)

    @classmethod
    def _quantize(cls, x, out, weights, blocks_per_row):
        d, q = _quantize_q8(x)
        total = q.sum(axis=1, dtype=np.int32).astype(_F32)
        out["d"] = fp32_to_fp16_bits(d)
        out["s"] = fp32_to_fp16_bits(total * d)
        out["qs"] = q


# --- 256-value super-blocks ---


def _requantize(x, d, offset, lo, hi):
    """The last pass of every K-quant, once the scales are stored: levels
    nearest_int((x + offset) / d) clamped to lo..hi. x (g, k), d (g,), offset (g,) or None."""
    if offset is not None:
        x = x + offset[:, None]
    return np.clip(_nearest_int(x / d[:, None]), lo, hi)


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

    @classmethod
    def _quantize(cls, x, out, weights, blocks_per_row):
        n = x.shape[0]
        xs = x.reshape(-1, 16)
        if weights is None:
            scales, mins, L = _make_qkx_quants(xs, np.abs(xs), 3, -0.5, 0.1, 15, True)
            scales, mins = scales.reshape(n, 16), mins.reshape(n, 16)
            max_scale, max_min = _positive_max(scales), _positive_max(mins)
            has_s, has_m = max_scale > 0, max_min > 0
            ls = np.where(has_s[:, None], _nearest_int((_F32(15) / max_scale)[:, None] * scales), 0)
            lm = np.where(has_m[:, None], _nearest_int((_F32(15) / max_min)[:, None] * mins), 0)
            d = np.where(has_s, max_scale / _F32(15), _F32(0))
            dmin = np.where(has_m, max_min / _F32(15), _F32(0))
        else:
            sigma2 = _csum(x * x) / _F32(QK_K)
            w = _importance(xs, weights.reshape(-1, 16), np.repeat(sigma2, 16))
            sw = _csum(w).reshape(n, 16)
            scales, mins, L = _make_qkx_quants(xs, w, 3, -0.9, 0.05, 36, False)
            d, ls = _make_qp_quants(scales.reshape(n, 16), 15, sw)
            dmin, lm = _make_qp_quants(mins.reshape(n, 16), 15, sw)
        sc = (ls.astype(np.int32) | (lm.astype(np.int32) << 4)).astype(np.uint8)
        out["d"] = fp32_to_fp16_bits(d)
        out["dmin"] = fp32_to_fp16_bits(dmin)
        out["scales"] = sc
        dl = (fp16_bits_to_fp32(out["d"])[:, None] * (sc & 15)).reshape(-1)
        ml = (fp16_bits_to_fp32(out["dmin"])[:, None] * (sc >> 4)).reshape(-1)
        L = np.where((dl != 0)[:, None], _requantize(xs, dl, ml, 0, 3), L)
        out["qs"] = _pack_2bit(L.reshape(n, QK_K))


class Q3_K(BlockQuant):
    """16 groups of 16: x = d * sc * (q - 4), q in 0..7 (2 low bits + hmask), sc 6-bit - 32."""

    ggml_type = GGMLType.Q3_K
    layout = np.dtype([("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", 12), ("d", "<u2")])

    @classmethod
    def _dequantize(cls, blocks, out):
        d = fp16_bits_to_fp32(blocks["d"])[:, None]
        dl = (d * _unpack_q3_scales(blocks["scales"]))[:, :, None]  # (n, 16, 1)
        low = _unpack_2bit(blocks["qs"]).astype(np.int8)
        high = _unpack_bits(blocks["hmask"]).reshape(-1, QK_K).view(np.int8)
        q = low - ((1 - high) << 2)
        np.multiply(dl, q.reshape(-1, 16, 16), out=out.reshape(-1, 16, 16))

    @classmethod
    def _quantize(cls, x, out, weights, blocks_per_row):
        n = x.shape[0]
        xs = x.reshape(-1, 16)
        if weights is None:
            scales, L = _make_q3_quants(xs, 4)
            scales = scales.reshape(n, 16)
            _, max_scale = _first_abs_max(scales)
            has = max_scale != 0
            iscale = _F32(-32) / max_scale
            sc6 = _nearest_int(iscale[:, None] * scales).astype(np.int8)
            sc6 = np.where(has[:, None], np.clip(sc6, -32, 31) + 32, 0)
            d = np.where(has, _F32(1) / iscale, _F32(0))
        else:
            sigma2 = _F32(2) * _csum(x * x) / _F32(QK_K)
            w = _importance(xs, weights.reshape(-1, 16), np.repeat(sigma2, 16))
            scales, L = _make_qx_quants(xs, 4, w)
            d, sc6 = _make_qx_quants(scales.reshape(n, 16), 32, _csum(w).reshape(n, 16))
        out["scales"] = _pack_q3_scales(sc6)
        out["d"] = fp32_to_fp16_bits(d)
        dl = (fp16_bits_to_fp32(out["d"])[:, None] * _unpack_q3_scales(out["scales"])).reshape(-1)
        L = np.where((dl != 0)[:, None], _requantize(xs, dl, None, -4, 3) + 4, L)
        L = L.reshape(n, QK_K)
        out["hmask"] = _pack_fields((L > 3).reshape(n, 8, 32), 1, axis=1)
        out["qs"] = _pack_2bit(L & 3)


class _Q45K(BlockQuant):
    """Q4_K and Q5_K: 8 groups of 32, x = d * sc * q - dmin * m, sc and m 6-bit."""

    nmax: ClassVar[int]
    ref_search: ClassVar[tuple[float, float, int]]  # rmin, rdelta, nstep without weights

    @classmethod
    def _pack(cls, out, L) -> None:
        """Writes the quants L (n, 256) into out's fields: Q4_K and Q5_K lay the bits out apart."""
        raise NotImplementedError

    @classmethod
    def _scale_min(cls, blocks):
        sc, m = _unpack_k4_scales(blocks["scales"])
        d = fp16_bits_to_fp32(blocks["d"])[:, None]
        dmin = fp16_bits_to_fp32(blocks["dmin"])[:, None]
        return (d * sc)[:, :, None], (dmin * m)[:, :, None]  # (n, 8, 1) each

    @classmethod
    def _quantize(cls, x, out, weights, blocks_per_row):
        n = x.shape[0]
        xs = x.reshape(-1, 32)
        if weights is None:
            av_x = np.sqrt(_csum(xs * xs) / _F32(32))
            w = av_x[:, None] + np.abs(xs)
            rmin, rdelta, nstep = cls.ref_search
            scales, mins, L = _make_qkx_quants(xs, w, cls.nmax, rmin, rdelta, nstep, False)
            scales, mins = scales.reshape(n, 8), mins.reshape(n, 8)
            max_scale, max_min = _positive_max(scales), _positive_max(mins)
            inv_scale = np.where(max_scale > 0, _F32(63) / max_scale, _F32(0))
            inv_min = np.where(max_min > 0, _F32(63) / max_min, _F32(0))
            ls = np.minimum(63, _nearest_int(inv_scale[:, None] * scales).astype(np.uint8))
            lm = np.minimum(63, _nearest_int(inv_min[:, None] * mins).astype(np.uint8))
            d, dmin = max_scale / _F32(63), max_min / _F32(63)
        else:
            sigma2 = _F32(2) * _csum(x * x) / _F32(QK_K)
            w = _importance(xs, weights.reshape(-1, 32), np.repeat(sigma2, 8))
            sw = _csum(w).reshape(n, 8)
            scales, mins, L = _make_qkx_quants(xs, w, cls.nmax, -0.9, 0.05, 36, False)
            d, ls = _make_qp_quants(scales.reshape(n, 8), 63, sw)
            dmin, lm = _make_qp_quants(mins.reshape(n, 8), 63, sw)
            if cls.nmax == 31:  # only ggml's Q5_K clamps here
                ls, lm = np.minimum(63, ls), np.minimum(63, lm)
        out["scales"] = _pack_k4_scales(ls, lm)
        out["d"] = fp32_to_fp16_bits(d)
        out["dmin"] = fp32_to_fp16_bits(dmin)
        dl, ml = cls._scale_min(out)
        dl, ml = dl.reshape(-1), ml.reshape(-1)
        L = np.where((dl != 0)[:, None], _requantize(xs, dl, ml, 0, cls.nmax), L)
        cls._pack(out, L.reshape(n, QK_K).astype(np.uint8))


class Q4_K(_Q45K):
    ggml_type = GGMLType.Q4_K
    layout = np.dtype([("d", "<u2"), ("dmin", "<u2"), ("scales", "u1", 12), ("qs", "u1", 128)])
    nmax = 15
    ref_search = (-1.0, 0.1, 20)

    @classmethod
    def _dequantize(cls, blocks, out):
        dl, ml = cls._scale_min(blocks)
        q = _unpack_nibbles_k(blocks["qs"]).reshape(-1, 8, 32)
        o = out.reshape(-1, 8, 32)
        np.multiply(dl, q, out=o)
        o -= ml

    @classmethod
    def _pack(cls, out, L):
        out["qs"] = _pack_nibbles_k(L)


class Q5_K(_Q45K):
    """As Q4_K with a fifth bit: bit k of qh[l] is bit 4 of value 32 k + l."""

    ggml_type = GGMLType.Q5_K
    layout = np.dtype(
        [("d", "<u2"), ("dmin", "<u2"), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)]
    )
    nmax = 31
    ref_search = (-0.5, 0.1, 15)

    @classmethod
    def _dequantize(cls, blocks, out):
        dl, ml = cls._scale_min(blocks)
        q = _unpack_nibbles_k(blocks["qs"]).reshape(-1, 8, 32) | (_unpack_bits(blocks["qh"]) << 4)
        o = out.reshape(-1, 8, 32)
        np.multiply(dl, q, out=o)
        o -= ml

    @classmethod
    def _pack(cls, out, L):
        out["qs"] = _pack_nibbles_k(L & 15)
        out["qh"] = _pack_fields((L >> 4).reshape(-1, 8, 32), 1, axis=1)


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

    @classmethod
    def _quantize(cls, x, out, weights, blocks_per_row):
        n = x.shape[0]
        xs = x.reshape(-1, 16)
        scales, L = _make_qx_quants(xs, 32, None if weights is None else weights.reshape(-1, 16))
        scales = scales.reshape(n, 16)
        amax, max_scale = _first_abs_max(scales)
        iscale = _F32(-128) / max_scale
        sc = np.minimum(127, _nearest_int(iscale[:, None] * scales)).astype(np.int8)
        out["d"] = fp32_to_fp16_bits(_F32(1) / iscale)
        out["scales"] = sc
        dl = (fp16_bits_to_fp32(out["d"])[:, None] * sc).reshape(-1)
        L = np.where((dl != 0)[:, None], _requantize(xs, dl, None, -32, 31) + 32, L)
        L = L.astype(np.uint8).reshape(n, 2, 4, 32)  # (n, half, quarter, l)
        ql = (L[:, :, :2] & 15) | ((L[:, :, 2:] & 15) << 4)  # (n, half, 2, 32)
        out["ql"] = ql.reshape(n, 128)
        out["qh"] = _pack_fields(L >> 4, 2, axis=2).reshape(n, 64)
        out[amax < _GROUP_MAX_EPS] = np.zeros((), dtype=cls.layout)


class Q8_K(BlockQuant):
    """Activation format: x = d * q with d float32, plus the sum of each 16 quants."""

    ggml_type = GGMLType.Q8_K
    layout = np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])
    accepts_weights = False

    @classmethod
    def _dequantize(cls, blocks, out):
        np.multiply(blocks["d"][:, None], blocks["qs"], out=out)

    @classmethod
    def _quantize(cls, x, out, weights, blocks_per_row):
        amax, vmax = _first_abs_max(x)
        iscale = _F32(-127) / vmax
        q = np.minimum(127, _nearest_int(iscale[:, None] * x)).astype(np.int8)
        live = amax != 0
        q[~live] = 0
        out["qs"] = q
        out["bsums"] = q.reshape(-1, 16, 16).sum(axis=2, dtype=np.int32).astype(np.int16)
        out["d"] = np.where(live, _F32(1) / iscale, _F32(0))


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


def quantize(
    values: np.ndarray, ggml_type: GGMLType | int, weights: np.ndarray | None = None
) -> np.ndarray:
    """float32 (..., row_len) -> (rows, row_bytes) uint8, as ggml_quantize_chunk writes it.

    ``weights`` is ggml's importance matrix: one float per column, shape (row_len,).
    """
    cls = quant_type(ggml_type)
    values = np.asarray(values, dtype=_F32)
    if values.ndim == 0:
        raise errors.InvalidOptionError("cannot quantize a scalar")
    row_len = values.shape[-1]
    nbytes = row_nbytes(cls.ggml_type, row_len)
    rows = values.reshape(-1, row_len)
    blocks_per_row = row_len // cls.block_size
    if weights is not None:
        weights = np.asarray(weights, dtype=_F32)
        if weights.shape != (row_len,):
            raise errors.InvalidOptionError(f"weights must have shape ({row_len},)")
        weights = weights.reshape(blocks_per_row, cls.block_size)
    out = np.empty((rows.shape[0], nbytes), dtype=np.uint8)
    step = max(1, _CHUNK_VALUES // 8 // max(row_len, 1))  # the searches hold ~8 temporaries
    for start in range(0, rows.shape[0], step):
        chunk = rows[start : start + step].reshape(-1, cls.block_size)
        w = None
        if weights is not None:
            w = np.broadcast_to(weights, (chunk.shape[0] // blocks_per_row, *weights.shape))
            w = w.reshape(chunk.shape)
        q = cls.quantize_blocks(chunk, w, blocks_per_row if row_len else None)
        out[start : start + step] = q.reshape(-1, nbytes)
    return out
