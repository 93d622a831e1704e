"""KIVI cache quantization (Liu et al., 2024, arXiv 2402.02750) in numpy: the formats and
every rounding of simd/common/kivi.h, bit for bit, the oracle of the native kernels.

Keys are quantized per channel over a group of ``group`` (G) consecutive tokens, values per
token over groups of ``gv = min(G, head_dim_v)`` channels; both asymmetrically, with an fp16
scale and zero point and ``bits`` (2 or 4) per code.

- K group block (one KV head, G tokens, ``hd`` channels): ``f16 scale[hd]``, ``f16 zero[hd]``,
  then each channel's G codes packed LSB-first (token t at bits ``[t*b, t*b + b)``).
- V row (one token, one KV head): per group ``f16 scale``, ``f16 zero``, ``gv*b/8`` bytes of
  codes LSB-first in channel order.

Quantizing values x (f16): ``mn``, ``mx`` their extremes ignoring NaN (a zero extreme is +0);
``s = (mx - mn) / (2**b - 1)`` in float32; stored ``fp16(s)`` (NaN as 0x7E00) and ``fp16(mn)``;
``code = clamp(rint((x - z') / s'), 0, 2**b - 1)``, NaN to 0, and every code 0 unless ``s'`` is
finite and positive. Decoding: ``s' * code + z'`` in float32. The key dots of a query q:
``u = q * s'``; ``zsum`` the sum over d in order of ``q[d] * z'[d]`` in double, rounded once;
``acc = acc + u[d] * code[d]`` over d in order; ``dot = acc + zsum``.
"""

from __future__ import annotations

import numpy as np

from edgeinfer import errors
from edgeinfer.quants import fp32_to_fp16_bits

__all__ = [
    "BITS",
    "GROUPS",
    "pack",
    "unpack",
    "k_block_bytes",
    "v_group",
    "v_row_bytes",
    "bits_per_value_k",
    "bits_per_value_v",
    "quantize_k",
    "split_k",
    "decode_k",
    "k_dots",
    "quantize_v",
    "split_v",
    "decode_v",
]

BITS = (2, 4)
GROUPS = (32, 64, 128)
MAX_HEAD_DIM = 512  # EI_MAX_HEAD_DIM
NAN_SCALE = np.uint16(0x7E00)  # the stored scale of a NaN range (equal infinities)

_F32 = np.float32


def _check_format(bits: int, group: int) -> None:
    if bits not in BITS or group not in GROUPS:
        raise errors.InvalidOptionError(
            f"KIVI has {bits}-bit codes in groups of {group} tokens: bits must be one of {BITS}, "
            f"the group one of {GROUPS}"
        )


def k_block_bytes(bits: int, group: int, hd: int) -> int:
    """Bytes of a K group block: ``4 hd + hd G b / 8``."""
    _check_format(bits, group)
    if not 0 < hd <= MAX_HEAD_DIM:
        raise errors.InvalidOptionError(
            f"a KIVI key head has 1 to {MAX_HEAD_DIM} channels, not {hd}"
        )
    return hd * (4 + group * bits // 8)


def v_group(bits: int, group: int, hdv: int) -> int:
    """The channels of one V group, ``min(G, hdv)``, which must divide hdv into whole bytes."""
    _check_format(bits, group)
    gv = min(group, hdv)
    if not 0 < hdv <= MAX_HEAD_DIM or hdv % gv or gv * bits % 8:
        raise errors.InvalidOptionError(
            f"a KIVI value head of {hdv} channels does not split into groups of {gv} channels "
            f"of whole bytes of {bits}-bit codes"
        )
    return gv


def v_row_bytes(bits: int, group: int, hdv: int) -> int:
    """Bytes of a V row: ``(hdv / gv) (4 + gv b / 8)``."""
    gv = v_group(bits, group, hdv)
    return hdv // gv * (4 + gv * bits // 8)


def bits_per_value_k(bits: int, group: int) -> float:
    """Bits a key value takes, its share of the scale and zero counted: ``b + 32 / G``."""
    _check_format(bits, group)
    return bits + 32 / group


def bits_per_value_v(bits: int, group: int, hdv: int) -> float:
    """Bits a value takes, its share of its group's scale and zero counted: ``b + 32 / gv``."""
    return bits + 32 / v_group(bits, group, hdv)


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """(..., n) codes below ``2**bits`` -> (..., n * bits / 8) bytes, LSB-first."""
    per = 8 // bits
    c = np.asarray(codes, dtype=np.uint8).reshape(*codes.shape[:-1], -1, per)
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    return np.bitwise_or.reduce(c << shifts, axis=-1).astype(np.uint8)


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """(..., m) bytes -> (..., m * 8 / bits) codes, LSB-first."""
    per = 8 // bits
    p = np.asarray(packed, dtype=np.uint8)[..., None]
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    codes = (p >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(*p.shape[:-2], -1)


def _f16_to_f32(bits16: np.ndarray) -> np.ndarray:
    return np.asarray(bits16, dtype="<u2").view(np.float16).astype(_F32)


def _params(x: np.ndarray, axis: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The stored scale and zero bits (uint16) of float32 values x reduced along axis."""
    nan = np.isnan(x)
    mn = np.where(nan, _F32(np.inf), x).min(axis=axis) + _F32(0)  # -0 -> +0
    mx = np.where(nan, _F32(-np.inf), x).max(axis=axis) + _F32(0)
    with np.errstate(invalid="ignore", over="ignore"):
        s = (mx - mn) / _F32((1 << bits) - 1)
    scale = np.where(np.isnan(s), NAN_SCALE, fp32_to_fp16_bits(s)).astype("<u2")
    return scale, fp32_to_fp16_bits(mn).astype("<u2")


def _codes(x: np.ndarray, s: np.ndarray, z: np.ndarray, bits: int) -> np.ndarray:
    """clamp(rint((x - z) / s), 0, qmax), NaN to 0; all 0 where s is not finite and positive."""
    qmax = _F32((1 << bits) - 1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        r = np.rint((x - z) / s)
        c = np.where(r > 0, np.minimum(r, qmax), _F32(0))
        usable = (s > 0) & (s < np.inf)
    return np.where(usable, c, 0).astype(np.uint8)


# --- keys ----------------------------------------------------------------------------------


def quantize_k(rows: np.ndarray, bits: int) -> np.ndarray:
    """The K group block of ``rows`` (G, hd) float16: one KV head's keys of G tokens."""
    rows = np.asarray(rows, dtype=np.float16)
    group, hd = rows.shape
    k_block_bytes(bits, group, hd)
    x = rows.astype(_F32)  # (G, hd)
    scale, zero = _params(x, 0, bits)  # (hd,) each
    codes = _codes(x, _f16_to_f32(scale), _f16_to_f32(zero), bits)  # (G, hd)
    packed = pack(np.ascontiguousarray(codes.T), bits)  # (hd, G b / 8)
    return np.concatenate([scale.view(np.uint8), zero.view(np.uint8), packed.reshape(-1)])


def split_k(
    block: np.ndarray, bits: int, group: int, hd: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A K block's scale bits (hd,), zero bits (hd,) and codes (hd, G)."""
    raw = np.asarray(block, dtype=np.uint8)[: k_block_bytes(bits, group, hd)]
    scale = raw[: 2 * hd].copy().view("<u2")
    zero = raw[2 * hd : 4 * hd].copy().view("<u2")
    codes = unpack(raw[4 * hd :].reshape(hd, group * bits // 8), bits)
    return scale, zero, codes


def decode_k(block: np.ndarray, bits: int, group: int, hd: int) -> np.ndarray:
    """(G, hd) float32: each key decoded, ``s' * code + z'``."""
    scale, zero, codes = split_k(block, bits, group, hd)
    with np.errstate(invalid="ignore"):
        x = _f16_to_f32(scale)[:, None] * codes.astype(_F32) + _f16_to_f32(zero)[:, None]
    return np.ascontiguousarray(x.T)


def k_dots(
    block: np.ndarray, bits: int, group: int, hd: int, q: np.ndarray, t0: int = 0,
    n: int | None = None,
) -> np.ndarray:  # fmt: skip
    """The raw dots of query q (hd,) with tokens [t0, t0 + n) of a K block, as the kernels
    round them: the channels' terms added in channel order. Queries (..., hd) give
    (..., n)."""
    scale, zero, codes = split_k(block, bits, group, hd)
    q = np.asarray(q, dtype=_F32)
    n = group - t0 if n is None else n
    with np.errstate(invalid="ignore", over="ignore"):
        u = q * _f16_to_f32(scale)  # (..., hd)
        terms = q.astype(np.float64) * _f16_to_f32(zero).astype(np.float64)
        zsum = np.add.accumulate(terms, axis=-1)[..., -1].astype(_F32)  # in order, not pairwise
        acc = np.zeros(q.shape[:-1] + (group,), dtype=_F32)
        c = codes.astype(_F32)
        for d in range(hd):
            acc = acc + u[..., d, None] * c[d]
        dots = acc + zsum[..., None]
    return dots[..., t0 : t0 + n]


# --- values --------------------------------------------------------------------------------


def quantize_v(x: np.ndarray, bits: int, group: int) -> np.ndarray:
    """The V row of one token's values x (hdv,) float16."""
    x16 = np.asarray(x, dtype=np.float16)
    hdv = x16.size
    gv = v_group(bits, group, hdv)
    v = x16.astype(_F32).reshape(hdv // gv, gv)
    scale, zero = _params(v, 1, bits)  # (groups,)
    codes = _codes(v, _f16_to_f32(scale)[:, None], _f16_to_f32(zero)[:, None], bits)
    out = np.empty((hdv // gv, 4 + gv * bits // 8), dtype=np.uint8)
    out[:, 0:2] = scale.view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = zero.view(np.uint8).reshape(-1, 2)
    out[:, 4:] = pack(codes, bits)
    return out.reshape(-1)


def split_v(
    rows: np.ndarray, bits: int, group: int, hdv: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """V rows (m, >= row bytes) -> scale bits (m, groups), zero bits (m, groups) and codes
    (m, hdv)."""
    gv = v_group(bits, group, hdv)
    raw = np.atleast_2d(np.asarray(rows, dtype=np.uint8))
    m = raw.shape[0]
    grp = raw[:, : v_row_bytes(bits, group, hdv)].reshape(m, hdv // gv, -1)
    scale = np.ascontiguousarray(grp[..., 0:2]).view("<u2")[..., 0]
    zero = np.ascontiguousarray(grp[..., 2:4]).view("<u2")[..., 0]
    return scale, zero, unpack(grp[..., 4:], bits).reshape(m, hdv)


def decode_v(rows: np.ndarray, bits: int, group: int, hdv: int) -> np.ndarray:
    """V rows (m, >= row bytes) -> (m, hdv) float32, ``s' * code + z'`` per group."""
    gv = v_group(bits, group, hdv)
    scale, zero, codes = split_v(rows, bits, group, hdv)
    c = codes.reshape(codes.shape[0], hdv // gv, gv).astype(_F32)
    with np.errstate(invalid="ignore"):
        x = _f16_to_f32(scale)[..., None] * c + _f16_to_f32(zero)[..., None]
    return x.reshape(-1, hdv)
