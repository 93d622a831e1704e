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

Layouts that are not per-token rows (KIVI's keys,
quantized per channel over groups of ``group`` tokens with a full-precision residual of recent
tokens) describe themselves through the same fields: a new type is added by listing it here,
with its layout, and supplying its kernels, never by editing the call sites.

The engines, ``edgeinfer info`` and the converters' memory fitting all size the cache with
:func:`cache_bytes`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgeinfer import errors
from edgeinfer.gguf.constants import BLOCK_LAYOUTS, GGMLType


class CacheLayout(enum.IntEnum):
    """How a cache tensor's elements are grouped. Values are those of the C ``EI_KV_*``."""

    ROWS = 0  # one row per (position, KV head), encoded as ``ggml_type``


@dataclass(frozen=True)
class CacheType:
    """The element of one cache tensor (keys or values)."""

    name: str
    ggml_type: GGMLType
    layout: CacheLayout = CacheLayout.ROWS

    def row_bytes(self, n_values: int) -> int:
        """Bytes of one row of ``n_values`` values (one head of one position)."""
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

    @property
    def bits_per_value(self) -> float:
        """Bits one cached value costs, its block's scales counted (q8_0 8.5, q4_0 4.5)."""
        block = BLOCK_LAYOUTS[self.ggml_type]
        return 8 * block.type_size / block.block_size


# name -> type; the order is the one options and errors list them in
CACHE_TYPES: dict[str, CacheType] = {
    t.name: t
    for t in (
        CacheType("f16", GGMLType.F16), CacheType("f32", GGMLType.F32),
        CacheType("q8_0", GGMLType.Q8_0), CacheType("q4_0", GGMLType.Q4_0),
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
BLOCK_SIZE = 32  # positions per block
WINDOW_SLACK = 32  # positions a sliding-window layer keeps behind its window


def layer_positions(n_ctx: int, window: int, n_batch: int, ring: bool = True) -> int:
    """Positions the pool reserves for one layer of one sequence (simd/common/kv_pool.c): all
    of ``n_ctx`` in whole blocks, or for a sliding-window layer (``ring``) the blocks of its
    window, the slack and a step of ``n_batch``, where that is less."""
    blocks = -(-n_ctx // BLOCK_SIZE)
    if ring and window > 0 and window + WINDOW_SLACK + n_batch < n_ctx:
        blocks = min(blocks, -(-(window + WINDOW_SLACK + n_batch) // BLOCK_SIZE) + 2)
    return blocks * BLOCK_SIZE


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
) -> int:
    """Bytes of the keys and values of every layer for ``n_ctx`` positions of ``n_seq``
    sequences. ``windows`` holds each layer's sliding window (0: none; empty: no layer has
    one); such a layer keeps a ring (:func:`layer_positions`) unless ``ring`` is false."""
    k = cache_type(k_type)
    v = cache_type(v_type) if v_type is not None else k
    per_position = k.tensor_bytes(1, n_head_kv, head_dim) + v.tensor_bytes(1, n_head_kv, head_dim_v)
    layers = list(windows) or [0] * n_layer
    if len(layers) != n_layer:
        raise errors.InvalidOptionError(f"{len(layers)} windows given for {n_layer} layers")
    positions = sum(layer_positions(n_ctx, w, n_batch, ring) for w in layers)
    return n_seq * positions * per_position


def cache_summary(
    cfg: Any,
    n_ctx: int,
    k_type: str | CacheType = DEFAULT_CACHE_TYPE,
    v_type: str | CacheType | None = None,
    n_batch: int = 512,
    ring: bool = True,
) -> dict[str, Any]:
    """What ``edgeinfer info`` and ``bench`` report about the cache of one sequence of a model
    (a DecoderConfig): its types and their bits per value, the bytes each further token of
    context costs (the layers without a ring), and the total for ``n_ctx``."""
    k = cache_type(k_type, "cache_type_k")
    v = cache_type(v_type, "cache_type_v") if v_type is not None else k
    windows = [cfg.layer_window(il) for il in range(cfg.n_layer)]
    shape = {"n_layer": cfg.n_layer, "n_head_kv": cfg.n_head_kv, "head_dim": cfg.head_dim,
             "head_dim_v": cfg.head_dim_v, "k_type": k, "v_type": v, "n_batch": n_batch,
             "ring": ring, "windows": windows}  # fmt: skip
    full = layer_positions(n_ctx, 0, n_batch)
    growing = sum(1 for w in windows if layer_positions(n_ctx, w, n_batch, ring) == full)
    per_layer = k.tensor_bytes(1, cfg.n_head_kv, cfg.head_dim) + v.tensor_bytes(
        1, cfg.n_head_kv, cfg.head_dim_v
    )
    return {
        "cache_type_k": k.name,
        "cache_type_v": v.name,
        "bits_per_value_k": k.bits_per_value,
        "bits_per_value_v": v.bits_per_value,
        "rings": ring and growing < cfg.n_layer,
        "bytes_per_token": growing * per_layer,
        "context": n_ctx,
        "total_bytes": cache_bytes(n_ctx=n_ctx, **shape),
    }
