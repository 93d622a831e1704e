"""KV cache types: what a cache element is, how many bytes a cache takes, and which exist.

A :class:`CacheType` describes how one tensor of the cache (the keys or the values of one
layer) is laid out in memory. Today every type stores *rows*: one row of ``head_dim`` values
per (position, KV head), encoded as a GGML type, so every size and stride follows from that
type's row size (``BLOCK_LAYOUTS``). The keys and the values choose their types separately
(llama.cpp's ``-ctk`` / ``-ctv``): ``f32``, ``f16`` and GGML's ``q8_0`` and ``q4_0`` blocks
along the head dimension, which the attention kernels read in place.

The native engine keeps the cache in a pool of blocks of BLOCK_SIZE positions (kv_pool.h). A
sliding-window layer gives its blocks back once they lie WINDOW_SLACK positions behind its
window, so it holds its window, the slack and one step rather than the whole context: the
cache grows with the context only in the global layers.

``kivi4`` and ``kivi2`` (KIVI, arXiv 2402.02750; formats in simd/common/kivi.h) are not rows:
keys are quantized per channel over groups of ``kivi_group`` (G) positions, values per
position over groups of channels, to 4 or 2 bits with an f16 scale and zero point. Every
position enters an f16 residual first; a query at position p reads the groups that end at or
before ``p + 1 - kivi_residual`` (R) quantized and the rest in f16, so that what it sees
depends on its position alone. The residual keeps R + G positions (and the slack and a step),
and the pool's blocks hold G positions. Keys and values are both KIVI or both rows.

The engines, ``edgeinfer info`` and the converters' memory fitting all size the cache with
:func:`cache_bytes`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgeinfer import errors, kivi
from edgeinfer.gguf.constants import BLOCK_LAYOUTS, GGMLType


class CacheLayout(enum.IntEnum):
    """How a cache tensor's elements are grouped. Values are those of the C ``EI_KV_*``."""

    ROWS = 0  # one row per (position, KV head), encoded as ``ggml_type``
    KIVI = 1  # KIVI groups of ``bits``-bit codes and an f16 residual (EI_KV_KIVI)


@dataclass(frozen=True)
class CacheType:
    """The element of one cache tensor (keys or values)."""

    name: str
    ggml_type: GGMLType  # a row type's encoding; a KIVI type's residual (f16)
    layout: CacheLayout = CacheLayout.ROWS
    bits: int = 0  # a KIVI type's code bits

    def row_bytes(self, n_values: int) -> int:
        """Bytes of one row of ``n_values`` values (one head of one position; KIVI: of the
        f16 residual)."""
        block = BLOCK_LAYOUTS[self.ggml_type]
        if n_values % block.block_size:
            raise errors.InvalidOptionError(
                f"kv_type {self.name} stores blocks of {block.block_size} values; "
                f"a head of {n_values} values does not divide into them"
            )
        return n_values // block.block_size * block.type_size

    def tensor_bytes(self, n_positions: int, n_heads: int, head_dim: int) -> int:
        """Bytes of one layer's cache tensor holding ``n_positions`` positions."""
        return n_positions * n_heads * self.row_bytes(head_dim)

    def group_bytes(self, n_values: int, group: int, keys: bool) -> int:
        """Bytes of ``group`` positions of one head of ``n_values`` values as a quantized KIVI
        group: one key group block, or ``group`` value rows."""
        if keys:
            return kivi.k_block_bytes(self.bits, group, n_values)
        return group * kivi.v_row_bytes(self.bits, group, n_values)

    def hadamard_block(self, head_dim: int, keys: bool) -> int:
        """The block of values a q8_0 / q4_0 cache rotates each head's rows by before it
        quantizes them (the orthonormal Walsh-Hadamard matrix, as llama.cpp does; simd's
        ei_hadamard_block): keys by the largest power of two dividing the head, values by 64;
        0 for no rotation (another type, or a head that is not a multiple of 64)."""
        quantized = self.layout == CacheLayout.ROWS and self.ggml_type in (
            GGMLType.Q8_0, GGMLType.Q4_0,
        )  # fmt: skip
        if not quantized or head_dim <= 0 or head_dim % 64:
            return 0
        block = 64
        while keys and head_dim % (2 * block) == 0:
            block *= 2
        return block

    def bits_per_value(self, n_values: int = 256, group: int = 32, keys: bool = True) -> float:
        """Bits one cached value costs, its scales and zero points counted (q8_0 8.5, q4_0
        4.5; kivi4 keys in groups of 32 positions 5). KIVI's depend on the group and, for the
        values, on the head's channels (``n_values``); the residual is not counted here
        (:func:`cache_summary` counts it)."""
        if self.layout == CacheLayout.KIVI:
            return 8 * self.group_bytes(n_values, group, keys) / (group * n_values)
        block = BLOCK_LAYOUTS[self.ggml_type]
        return 8 * block.type_size / block.block_size


# name -> type; the order is the one options and errors list them in
CACHE_TYPES: dict[str, CacheType] = {
    t.name: t
    for t in (
        CacheType("f16", GGMLType.F16), CacheType("f32", GGMLType.F32),
        CacheType("q8_0", GGMLType.Q8_0), CacheType("q4_0", GGMLType.Q4_0),
        CacheType("kivi4", GGMLType.F16, CacheLayout.KIVI, 4),
        CacheType("kivi2", GGMLType.F16, CacheLayout.KIVI, 2),
    )
}  # fmt: skip
DEFAULT_CACHE_TYPE = "f16"


def cache_type(name: str | CacheType, what: str = "kv_type") -> CacheType:
    """The cache type called ``name`` (a :class:`CacheType` is returned as it is); ``what``
    names the option in the error."""
    if isinstance(name, CacheType):
        return name
    found = CACHE_TYPES.get(name) if isinstance(name, str) else None
    if found is None:
        raise errors.InvalidOptionError(
            f"unknown {what} {name!r} (one of {', '.join(CACHE_TYPES)})"
        )
    return found


# the native engine's block pool (simd/common/kv_pool.h: EI_KV_BLOCK, EI_KV_SLACK)
BLOCK_SIZE = 32  # positions per block (a KIVI cache's blocks hold kivi_group)
WINDOW_SLACK = 32  # positions a sliding-window layer keeps behind its window
KIVI_GROUP = 32  # KIVI's defaults: positions per key group, and the f16 residual
KIVI_RESIDUAL = 128


def layer_positions(
    n_ctx: int, window: int, n_batch: int, ring: bool = True, block: int = BLOCK_SIZE
) -> int:
    """Positions the pool reserves for one layer of one sequence (simd/common/kv_pool.c): all
    of ``n_ctx`` in whole blocks, or for a sliding-window layer (``ring``) the blocks of its
    window, the slack and a step of ``n_batch``, where that is less."""
    blocks = -(-n_ctx // block)
    if ring and window > 0 and window + WINDOW_SLACK + n_batch < n_ctx:
        blocks = min(blocks, -(-(window + WINDOW_SLACK + n_batch) // block) + 2)
    return blocks * block


def _check_pair(k: CacheType, v: CacheType) -> None:
    if (k.layout == CacheLayout.KIVI) != (v.layout == CacheLayout.KIVI):
        raise errors.InvalidOptionError(
            f"keys and values are both KIVI or neither: cache_type_k {k.name}, "
            f"cache_type_v {v.name}"
        )


def check_kivi_options(
    k: str | CacheType, v: str | CacheType, kivi_group: int, kivi_residual: int
) -> bool:
    """Whether the pair of types is KIVI's, after checking that it is a pair and that the KIVI
    options are ones the format has (typed errors otherwise)."""
    kt, vt = cache_type(k, "cache_type_k"), cache_type(v, "cache_type_v")
    _check_pair(kt, vt)
    if isinstance(kivi_group, bool) or kivi_group not in kivi.GROUPS:
        raise errors.InvalidOptionError(
            f"kivi_group must be one of {', '.join(map(str, kivi.GROUPS))}, not {kivi_group!r}"
        )
    if (
        isinstance(kivi_residual, bool)
        or not isinstance(kivi_residual, int)
        or not (0 <= kivi_residual < 1 << 31)
    ):
        raise errors.InvalidOptionError(
            f"kivi_residual must lie in [0, 2**31), not {kivi_residual!r}"
        )
    return kt.layout == CacheLayout.KIVI


def _kivi_group_bytes(
    k: CacheType, v: CacheType, n_head_kv: int, head_dim: int, head_dim_v: int, group: int
) -> int:
    """One layer's quantized KIVI group of ``group`` positions: each KV head's key block and
    value rows."""
    return n_head_kv * (
        k.group_bytes(head_dim, group, True) + v.group_bytes(head_dim_v, group, False)
    )


def _layer_bytes(
    k: CacheType, v: CacheType, n_head_kv: int, head_dim: int, head_dim_v: int, n_ctx: int,
    window: int, n_batch: int, ring: bool, kivi_group: int, kivi_residual: int,
) -> int:  # fmt: skip
    """One layer's cache bytes for one sequence (what the pool holds at most)."""
    rows = k.tensor_bytes(1, n_head_kv, head_dim) + v.tensor_bytes(1, n_head_kv, head_dim_v)
    if k.layout != CacheLayout.KIVI:
        return layer_positions(n_ctx, window, n_batch, ring) * rows
    g = kivi_group
    groups = layer_positions(n_ctx, window, n_batch, ring, g) // g
    quantized = _kivi_group_bytes(k, v, n_head_kv, head_dim, head_dim_v, g)
    residual = layer_positions(n_ctx, kivi_residual + g, n_batch, True, g)
    return groups * quantized + residual * rows


def cache_bytes(
    *,
    n_layer: int,
    n_head_kv: int,
    head_dim: int,
    head_dim_v: int,
    n_ctx: int,
    k_type: str | CacheType = DEFAULT_CACHE_TYPE,
    v_type: str | CacheType | None = None,
    n_seq: int = 1,
    windows: Sequence[int] = (),
    n_batch: int = 512,
    ring: bool = True,
    kivi_group: int = KIVI_GROUP,
    kivi_residual: int = KIVI_RESIDUAL,
) -> int:
    """Bytes of the keys and values of every layer for ``n_ctx`` positions of ``n_seq``
    sequences. ``windows`` holds each layer's sliding window (0: none; empty: no layer has
    one); such a layer keeps a ring (:func:`layer_positions`) unless ``ring`` is false. A KIVI
    cache counts its quantized groups and its f16 residual."""
    k = cache_type(k_type)
    v = cache_type(v_type) if v_type is not None else k
    _check_pair(k, v)
    layers = list(windows) or [0] * n_layer
    if len(layers) != n_layer:
        raise errors.InvalidOptionError(f"{len(layers)} windows given for {n_layer} layers")
    return n_seq * sum(
        _layer_bytes(k, v, n_head_kv, head_dim, head_dim_v, n_ctx, w, n_batch, ring,
                     kivi_group, kivi_residual)
        for w in layers
    )  # fmt: skip


def cache_summary(
    cfg: Any,
    n_ctx: int,
    k_type: str | CacheType = DEFAULT_CACHE_TYPE,
    v_type: str | CacheType | None = None,
    n_batch: int = 512,
    ring: bool = True,
    kivi_group: int = KIVI_GROUP,
    kivi_residual: int = KIVI_RESIDUAL,
) -> dict[str, Any]:
    """What ``edgeinfer info`` and ``bench`` report about the cache of one sequence of a model
    (a DecoderConfig): its types and their bits per value (the formats', then
    ``bits_per_value``: what a full-attention layer holding ``n_ctx`` positions costs between
    steps, scales, zero points and a KIVI residual counted), the bytes each further token of
    context costs (the layers without a ring), and the total the pool reserves for ``n_ctx``
    (a step of ``n_batch`` included)."""
    k = cache_type(k_type, "cache_type_k")
    v = cache_type(v_type, "cache_type_v") if v_type is not None else k
    _check_pair(k, v)
    windows = [cfg.layer_window(il) for il in range(cfg.n_layer)]
    shape = {"n_layer": cfg.n_layer, "n_head_kv": cfg.n_head_kv, "head_dim": cfg.head_dim,
             "head_dim_v": cfg.head_dim_v, "k_type": k, "v_type": v, "n_batch": n_batch,
             "ring": ring, "windows": windows, "kivi_group": kivi_group,
             "kivi_residual": kivi_residual}  # fmt: skip
    full = layer_positions(n_ctx, 0, n_batch)
    growing = sum(1 for w in windows if layer_positions(n_ctx, w, n_batch, ring) == full)
    kivi_types = k.layout == CacheLayout.KIVI
    rows = k.tensor_bytes(1, cfg.n_head_kv, cfg.head_dim) + v.tensor_bytes(
        1, cfg.n_head_kv, cfg.head_dim_v
    )
    per_layer = rows
    if kivi_types:
        shares = (k, v, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v, kivi_group)
        per_layer = _kivi_group_bytes(*shares) // kivi_group
    total = cache_bytes(n_ctx=n_ctx, **shape)
    quantized = max(0, n_ctx - kivi_residual) // kivi_group * kivi_group if kivi_types else 0
    layer = quantized * per_layer + (n_ctx - quantized) * rows
    out = {
        "cache_type_k": k.name,
        "cache_type_v": v.name,
        "bits_per_value_k": k.bits_per_value(cfg.head_dim, kivi_group, True),
        "bits_per_value_v": v.bits_per_value(cfg.head_dim_v, kivi_group, False),
        "bits_per_value": round(
            8 * layer / (n_ctx * cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v)), 3
        ),
        "rings": ring and growing < cfg.n_layer,
        "bytes_per_token": growing * per_layer,
        "context": n_ctx,
        "total_bytes": total,
    }
    if kivi_types:
        out["kivi_group"], out["kivi_residual"] = kivi_group, kivi_residual
    return out
