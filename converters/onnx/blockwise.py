"""Block-wise weight quantization in the layouts of onnxruntime's ``MatMulNBits`` and
``GatherBlockQuantized`` (com.microsoft), bit-exact with onnxruntime's own quantizer
(MLAS ``MlasQuantizeBlockwise``, as ``matmul_nbits_quantizer`` runs it).

A weight of N output rows and K inputs is cut along K into blocks of ``block_size`` values
(the last block padded with zeros). Each block stores ``bits``-bit codes q with one float32
scale and a zero point z; the value is ``(q - z) * scale``::

    B            uint8 (N, n_blocks, block_size * bits / 8)   codes, low bits first
    scales       float32 (N, n_blocks)
    zero_points  uint8 (N, ceil(n_blocks * bits / 8))         4 bits: two blocks a byte, low
                                                              nibble first (an odd last
                                                              block pads with 8); absent when
                                                              symmetric (z = 2**(bits - 1))

Symmetric blocks take the value of largest magnitude m (the first negative one on a tie, as
MLAS compares) and scale = m / -2**(bits-1), so m itself lands exactly on code 0; asymmetric
blocks stretch [min(x, 0), max(x, 0)] over every code. Codes are ``roundf(x / scale + z)``
(half away from zero, float32), clamped to the code range. (Only the sign of a zero scale
may differ from MLAS's, in a block of signed zeros; the codes are the same.)

The same bytes serve ``GatherBlockQuantized`` (data uint8 (N, n_blocks * block_size * bits /
8), gathered on axis 0, quantized on axis 1), so a tied embedding and output share one copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BITS = (4, 8)
BLOCK_SIZES = (16, 32, 64, 128, 256)
_F32 = np.float32
_CHUNK_VALUES = 1 << 20


@dataclass(frozen=True)
class BlockLayout:
    """The shapes of one quantized (N, K) weight."""

    n: int
    k: int
    bits: int
    block_size: int
    symmetric: bool = True

    def __post_init__(self) -> None:
        if self.bits not in BITS:
            raise ValueError(f"bits must be one of {BITS}, not {self.bits}")
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {BLOCK_SIZES}, not {self.block_size}")

    @property
    def n_blocks(self) -> int:
        return -(-self.k // self.block_size)

    @property
    def blob_size(self) -> int:
        return self.block_size * self.bits // 8  # bytes of codes per block

    @property
    def padded_k(self) -> int:
        return self.n_blocks * self.block_size

    @property
    def zero_point_bytes(self) -> int:  # per row
        return -(-self.n_blocks * self.bits // 8)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        out = {"B": (self.n, self.n_blocks, self.blob_size), "scales": (self.n, self.n_blocks)}
        if not self.symmetric:
            out["zero_points"] = (self.n, self.zero_point_bytes)
        return out

    def nbytes(self) -> int:
        n = self.n * self.n_blocks * (self.blob_size + 4)
        return n if self.symmetric else n + self.n * self.zero_point_bytes


def _roundf(x: np.ndarray) -> np.ndarray:
    """C's roundf: half away from zero."""
    return np.copysign(np.floor(np.abs(x) + _F32(0.5)), x).astype(_F32)


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """(..., m) codes below 2**bits -> (..., m * bits / 8) bytes, low bits first."""
    if bits == 8:
        return codes.astype(np.uint8)
    pairs = codes.astype(np.uint8).reshape(*codes.shape[:-1], -1, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def quantize(rows: np.ndarray, layout: BlockLayout) -> dict[str, np.ndarray]:
    """Quantizes float32 rows (n, K) of the weight into ``B``, ``scales`` and (asymmetric)
    ``zero_points``, shaped as :meth:`BlockLayout.shapes` says for n rows."""
    n, k = rows.shape
    if k != layout.k:
        raise ValueError(f"rows have {k} values, the layout {layout.k}")
    step = max(1, _CHUNK_VALUES // layout.padded_k)  # keeps each float temporary near 4 MiB
    if n > step:
        parts = [_quantize(rows[i : i + step], layout) for i in range(0, n, step)]
        return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    return _quantize(rows, layout)


def _quantize(rows: np.ndarray, layout: BlockLayout) -> dict[str, np.ndarray]:
    n, k = rows.shape
    x = np.zeros((n, layout.padded_k), dtype=_F32)
    x[:, :k] = rows
    blocks = x.reshape(n, layout.n_blocks, layout.block_size)  # (n, n_blocks, block_size)
    top = _F32((1 << layout.bits) - 1)
    if layout.symmetric:
        mid = _F32(1 << (layout.bits - 1))
        hi, lo = blocks.max(axis=-1), blocks.min(axis=-1)
        peak = np.where(np.abs(hi) > np.abs(lo), hi, lo)
        scale = (peak / -mid).astype(_F32)
        zp = np.full(scale.shape, mid, dtype=_F32)
    else:
        lo = np.minimum(blocks.min(axis=-1), _F32(0))
        hi = np.maximum(blocks.max(axis=-1), _F32(0))
        scale = ((hi - lo) / top).astype(_F32)
        with np.errstate(divide="ignore", invalid="ignore"):
            zp_f = np.where(scale != 0, _F32(0) - lo / scale, lo).astype(_F32)
        zp = np.clip(_roundf(zp_f), 0, top)
    with np.errstate(divide="ignore"):
        inv = np.where(scale != 0, _F32(1) / scale, _F32(0)).astype(_F32)
    codes = np.clip(_roundf(blocks * inv[..., None] + zp[..., None]), 0, top)
    out = {"B": _pack(codes, layout.bits), "scales": scale}
    if not layout.symmetric:
        z = zp.astype(np.uint8)
        if layout.bits == 4 and z.shape[1] % 2:
            z = np.concatenate([z, np.full((n, 1), 8, np.uint8)], axis=1)  # as MLAS pads
        out["zero_points"] = _pack(z, layout.bits)
    return out


def dequantize(q: dict[str, np.ndarray], layout: BlockLayout) -> np.ndarray:
    """The float32 (n, K) weight that ``quantize`` encoded: ``(code - z) * scale``."""
    b = q["B"]
    n = b.shape[0]
    if layout.bits == 4:
        codes = np.stack([b & 15, b >> 4], axis=-1).reshape(n, layout.n_blocks, -1)
    else:
        codes = b
    if layout.symmetric:
        zp = np.full((n, layout.n_blocks), 1 << (layout.bits - 1), dtype=_F32)
    elif layout.bits == 4:
        z = q["zero_points"]
        zp = np.stack([z & 15, z >> 4], axis=-1).reshape(n, -1)[:, : layout.n_blocks]
    else:
        zp = q["zero_points"][:, : layout.n_blocks]
    values = (codes.astype(_F32) - zp[..., None].astype(_F32)) * q["scales"][..., None]
    return values.reshape(n, layout.padded_k)[:, : layout.k]
