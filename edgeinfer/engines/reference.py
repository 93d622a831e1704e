"""The numpy reference engine: the forward pass written once, plainly.

It is the oracle that every faster engine is tested against, and the portable fallback where
no native engine runs. It defines the numbers edgeinfer computes:

* it rounds where llama.cpp's CPU backend rounds: activations are quantized to each weight
  type's dot-product partner (int8 blocks for the quantized types, float16 or bfloat16 for
  the half types) before every matrix product; queries and attention probabilities are
  rounded to the KV cache's type before they meet it; GELU reads a float16 table;
* every reduction (matrix products, sums of squares, softmax sums) and every transcendental
  function is computed in float64 from exact operands and rounded once to float32;
  elementwise steps are single float32 operations in a fixed order.

So a token's result does not depend on the batch it came in, nor on summation order, and
the native engine (simd/) computes the same floats on every instruction set. Weights are
dequantized exactly (float64) the first time a layer needs them and kept; the output
projection, the largest matrix, is kept as float32 where that is exact.
"""

from __future__ import annotations

import numpy as np

from edgeinfer import errors, kivi, quants
from edgeinfer.engines import ENGINES
from edgeinfer.engines.base import Batch, EngineOptions, SequenceEngine
from edgeinfer.gguf import GGMLType, GGUFFile
from edgeinfer.kv_cache import (
    KIVI_GROUP,
    KIVI_RESIDUAL,
    CacheType,
    cache_type,
    check_kivi_options,
)
from edgeinfer.models.base import DecoderConfig

F32, F64 = np.float32, np.float64
SQRT_2_OVER_PI = F32(0.7978845608028654)
GELU_COEF_A = F32(0.044715)
# cache element -> the numpy dtype holding it (a quantized type holds its exact values)
KV_DTYPES = {
    GGMLType.F16: np.float16, GGMLType.F32: np.float32,
    GGMLType.Q8_0: np.float32, GGMLType.Q4_0: np.float32,
}  # fmt: skip
OUTPUT_CHUNK = 16384  # rows of the output matrix converted to float64 at a time

# weight types whose dequantized value is a sum of two terms (scale x quant, block minimum):
# byte offsets of the scale and of the minimum field in one block
_TWO_TERM = {
    GGMLType.Q4_1: (0, 2), GGMLType.Q5_1: (0, 2),
    GGMLType.Q2_K: (80, 82), GGMLType.Q4_K: (0, 2), GGMLType.Q5_K: (0, 2),
}  # fmt: skip


def _round_f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(F32)


def _round_bf16(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=F32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    r = np.where(np.isnan(x), (u.astype(np.uint32) | 0x400000) & 0xFFFF0000, r).astype(np.uint32)
    return r.view(F32).reshape(x.shape)


def _q8_0_quants(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GGML's x86 q8_0 quantizer: (quants, scale as stored, amax), blocks of 32 last."""
    b = x.reshape(x.shape[:-1] + (-1, 32))
    amax = np.abs(b).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, F32(127.0) / amax, F32(0.0)).astype(F32)
    return np.rint(b * inv), _round_f16(amax / F32(127.0)), amax


def hadamard(x: np.ndarray, block: int) -> np.ndarray:
    """x (float32) with each block of ``block`` values along its last axis rotated by the
    orthonormal Walsh-Hadamard matrix, rounding as GGML's fwht (and the kernel table's
    hadamard) does: scaled by 1/sqrtf(block) first, then butterflies at strides 1, 2, 4, ...
    in float32."""
    y = x.astype(F32).reshape(-1, block) * (F32(1.0) / np.sqrt(F32(block)))
    stride = 1
    while stride < block:
        y = y.reshape(-1, block // (2 * stride), 2, stride)
        u, v = y[:, :, 0, :], y[:, :, 1, :]
        y = np.stack([u + v, u - v], axis=2)
        stride *= 2
    return y.reshape(x.shape)


def act_q8_0(x: np.ndarray) -> np.ndarray:
    """Activations as GGML's q8_0 blocks hold them (exact, float64)."""
    q, d, _ = _q8_0_quants(x)
    return (q.astype(F64) * d).reshape(x.shape)


def q4_0_values(x: np.ndarray) -> np.ndarray:
    """x as GGML's q4_0 blocks (quantize_row_q4_0_ref) hold it, float32, blocks of 32 last;
    a value that is not a number stores level 0 (simd/ref/quants.c)."""
    b = x.reshape(x.shape[:-1] + (-1, 32)).astype(F32)
    first = np.argmax(np.abs(b), axis=-1)[..., None]
    d = (np.take_along_axis(b, first, axis=-1) / F32(-8.0)).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.where(d != 0, F32(1.0) / d, F32(0.0)).astype(F32)
        f = (b * inv).astype(F32) + F32(8.5)
        level = np.where(f >= 0, np.minimum(np.trunc(np.where(f >= 0, f, 0)), 15), 0)
    return ((level.astype(F32) - F32(8.0)) * _round_f16(d)).astype(F32).reshape(x.shape)


def act_q8_1_sums(x: np.ndarray) -> np.ndarray:
    """The ``s`` field of GGML's q8_1 blocks: float16(amax/127 * sum(q)), (..., n_blocks)."""
    q, _, amax = _q8_0_quants(x)
    return _round_f16((amax[..., 0] / F32(127.0)) * q.sum(axis=-1).astype(F32)).astype(F64)


def act_q8_K(x: np.ndarray) -> np.ndarray:
    """Activations as GGML's q8_K blocks hold them (signed extreme -> -127, float32 scale)."""
    b = x.reshape(x.shape[:-1] + (-1, 256))
    first = np.argmax(np.abs(b), axis=-1)[..., None]
    extreme = np.take_along_axis(b, first, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(extreme != 0, F32(-127.0) / extreme, F32(0.0)).astype(F32)
        d = np.where(extreme != 0, F32(1.0) / iscale, F32(0.0)).astype(F32)
    q = np.minimum(np.rint(b * iscale), 127.0)
    return (q.astype(F64) * d).reshape(x.shape)


# what GGML's CPU backend turns activations into before a product with each weight type
_PARTNER = {
    GGMLType.F32: lambda x: x.astype(F64),
    GGMLType.F16: lambda x: _round_f16(x).astype(F64),
    GGMLType.BF16: lambda x: _round_bf16(x).astype(F64),
    GGMLType.Q4_0: act_q8_0, GGMLType.Q5_0: act_q8_0, GGMLType.Q8_0: act_q8_0,
    GGMLType.Q4_1: act_q8_0, GGMLType.Q5_1: act_q8_0,  # q8_1 holds q8_0's values, plus sums
    GGMLType.Q2_K: act_q8_K, GGMLType.Q3_K: act_q8_K, GGMLType.Q4_K: act_q8_K,
    GGMLType.Q5_K: act_q8_K, GGMLType.Q6_K: act_q8_K,
}  # fmt: skip


# what a cache of each type stores for float32 keys or values (the engine keeps the values)
_CACHE_STORE = {
    GGMLType.F16: lambda x: x.astype(np.float16), GGMLType.F32: lambda x: x,
    GGMLType.Q8_0: lambda x: act_q8_0(x).astype(F32), GGMLType.Q4_0: q4_0_values,
}  # fmt: skip


def _q8_0_blocks(values: np.ndarray) -> np.ndarray:
    """The q8_0 bytes of values the cache holds (exactly d x q, as ``act_q8_0`` made them):
    the largest magnitude of a block is 127 d, so d and then every q follow exactly."""
    b = values.reshape(-1, 32).astype(F64)
    d = np.abs(b).max(axis=1, keepdims=True) / 127.0
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d > 0, np.rint(b / np.where(d > 0, d, 1.0)), 0.0)
    out = np.zeros(len(b), dtype=quants.Q8_0.layout)
    out["d"] = quants.fp32_to_fp16_bits(d[:, 0].astype(F32))
    out["qs"] = np.nan_to_num(q, nan=0.0).clip(-127, 127).astype(np.int8)
    return out.view(np.uint8).reshape(-1)


def _q4_0_blocks(values: np.ndarray) -> np.ndarray:
    """The q4_0 bytes of values the cache holds (exactly (level - 8) d, as ``q4_0_values``
    made them): only level 0 reaches magnitude 8 |d|, so d (with its sign, also for a block of
    zeros) and then every level follow exactly."""
    b = values.reshape(-1, 32).astype(F64)
    first = np.nan_to_num(np.abs(b), nan=0.0).argmax(axis=1)[:, None]
    extreme = np.take_along_axis(b, first, axis=1)
    d = np.where(extreme != 0, extreme / -8.0, np.copysign(0.0, extreme))
    with np.errstate(divide="ignore", invalid="ignore"):
        level = np.where(d != 0, np.rint(b / np.where(d != 0, d, 1.0)) + 8, 8.0)
    level = np.nan_to_num(level, nan=8.0).clip(0, 15).astype(np.uint8)
    out = np.zeros(len(b), dtype=quants.Q4_0.layout)
    out["d"] = quants.fp32_to_fp16_bits(d[:, 0].astype(F32))
    out["qs"] = level[:, :16] | (level[:, 16:] << 4)
    return out.view(np.uint8).reshape(-1)


# the bytes of a cache row as the native engine stores them, from the values held here
_CACHE_ENCODE = {
    GGMLType.F16: lambda x: x.astype(np.float16).view(np.uint8).reshape(-1),
    GGMLType.F32: lambda x: x.astype(F32).view(np.uint8).reshape(-1),
    GGMLType.Q8_0: _q8_0_blocks, GGMLType.Q4_0: _q4_0_blocks,
}  # fmt: skip


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    # x: (..., n). Squares in float32, summed in float64, the scale in float32: as GGML does
    total = np.sum(np.square(x).astype(F64), axis=-1, keepdims=True)
    mean = (total / x.shape[-1]).astype(F32)
    return x * (F32(1.0) / np.sqrt(mean + F32(eps)))


def _gelu_table() -> np.ndarray:
    """GGML's CPU GELU: a table of float16 results indexed by the float16-rounded input.

    Its entries come from float32 arithmetic with the inner multiply-add fused (as compilers
    contract it) and a correctly rounded tanh, which is what GGML builds get from libm.
    """
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        inner = ((GELU_COEF_A * x).astype(F64) * x.astype(F64) + 1.0).astype(F32)  # fma(A*x, x, 1)
        arg = (SQRT_2_OVER_PI * x) * inner
        t = np.tanh(arg.astype(F64)).astype(F32)
        return ((F32(0.5) * x) * (F32(1.0) + t)).astype(np.float16).astype(F32)


_GELU_F16 = _gelu_table()


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    g = _GELU_F16[gate.astype(np.float16).view(np.uint16)]
    g = np.where(gate <= -10.0, F32(0.0), np.where(gate >= 10.0, gate, g)).astype(F32)
    return g * up


# edgeinfer's exp (simd/common/ei_exp.h): the same IEEE operations in the same order, none
# fused, so these float64 results are the native kernels' bit for bit
_EXP_LOG2E = float.fromhex("0x1.71547652b82fep+0")
_EXP_SHIFTER = float.fromhex("0x1.8p+52")
_EXP_LN2_HI = float.fromhex("0x1.62e42fefa38p-1")
_EXP_LN2_LO = float.fromhex("0x1.ef35793c7673p-45")
_EXP_COEF = [1.0, 1.0, 0.5] + [
    float.fromhex(h)
    for h in (
        "0x1.5555555555555p-3", "0x1.5555555555555p-5", "0x1.1111111111111p-7",
        "0x1.6c16c16c16c17p-10", "0x1.a01a01a01a01ap-13", "0x1.a01a01a01a01ap-16",
        "0x1.71de3a556c734p-19", "0x1.27e4fb7789f5cp-22", "0x1.ae64567f544e4p-26",
        "0x1.1eed8eff8d898p-29", "0x1.6124613a86d09p-33",
    )
]  # fmt: skip


def ei_exp(x: np.ndarray) -> np.ndarray:
    """exp of float64 values as the native softmax computes it (simd/common/ei_exp.h)."""
    x = np.asarray(x, dtype=F64)
    ok = (x >= -746.0) & (x <= 710.0)
    xs = np.where(ok, x, 0.0)
    nd = xs * _EXP_LOG2E + _EXP_SHIFTER
    n = nd - _EXP_SHIFTER
    r = (xs - n * _EXP_LN2_HI) - n * _EXP_LN2_LO
    p = np.full_like(r, _EXP_COEF[-1])
    for c in reversed(_EXP_COEF[:-1]):
        p = p * r + c
    ni = n.astype(np.int64)
    n1 = ((ni + 2048) >> 1) - 1024
    s1 = ((n1 + 1023) << 52).view(F64)
    s2 = ((ni - n1 + 1023) << 52).view(F64)
    with np.errstate(over="ignore", under="ignore"):
        y = (p * s1) * s2
    y = np.where(x > 710.0, np.inf, y)
    return np.where(ok | (x > 710.0), y, np.where(np.isnan(x), x, 0.0))


def softmax_sum(w: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """The native softmax's sum of the weights w over the last axis (simd/common/attn_softmax.h):
    the keys a query sees (seen) in order, the t-th of them added to partial sum t mod 8, the
    partials then added ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)). Keys not seen add nothing."""
    lane = (np.cumsum(seen, axis=-1) - 1) % 8
    parts = [
        np.cumsum(np.where(seen & (lane == j), w, 0.0), axis=-1)[..., -1] for j in range(8)
    ]  # cumsum adds in order: x + 0.0 is x
    return ((parts[0] + parts[4]) + (parts[2] + parts[6])) + (
        (parts[1] + parts[5]) + (parts[3] + parts[7])
    )


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    g = gate.astype(F64)
    return (g / (1.0 + np.exp(-g))).astype(F32) * up


def rope_cos_sin(
    positions: np.ndarray,
    n_rot: int,
    base: float,
    freq_scale: float,
    freq_factors: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """(n_tokens, n_rot/2) cosines and sines, with GGML's float32 recurrence for the angles."""
    theta_scale = F32(np.power(F64(F32(base)), F64(F32(-2.0) / F32(n_rot))))
    steps = np.full((len(positions), n_rot // 2), theta_scale, dtype=F32)
    steps[:, 0] = positions.astype(F32)
    theta: np.ndarray = np.cumprod(steps, axis=1, dtype=F32)  # p, p*s, (p*s)*s, ...
    if freq_factors is not None:
        theta = theta / freq_factors.astype(F32)
    theta = F32(freq_scale) * theta
    t64 = theta.astype(F64)
    return np.cos(t64).astype(F32), np.sin(t64).astype(F32)


def apply_rope(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_rot: int, neox: bool
) -> np.ndarray:
    # x: (n_tokens, n_heads, head_dim); cos, sin: (n_tokens, n_rot/2)
    c, s = cos[:, None, :], sin[:, None, :]
    out = x.copy()
    if neox:
        half = n_rot // 2
        x0, x1 = x[..., :half], x[..., half:n_rot]
        out[..., :half] = x0 * c - x1 * s
        out[..., half:n_rot] = x0 * s + x1 * c
    else:
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = x0 * c - x1 * s
        out[..., 1:n_rot:2] = x0 * s + x1 * c
    return out


class ReferenceEngine(SequenceEngine):
    """Runs one sequence; ``forward`` appends tokens to the KV cache and returns logits."""

    spec = ENGINES["reference"]

    def __init__(
        self, gguf: GGUFFile, cfg: DecoderConfig, n_ctx: int, cache_type_k: str = "f16",
        cache_type_v: str = "f16", track_attention: bool = False, kivi_group: int = KIVI_GROUP,
        kivi_residual: int = KIVI_RESIDUAL,
    ) -> None:  # fmt: skip
        super().__init__(n_ctx, cfg.n_vocab)
        self.gguf, self.cfg = gguf, cfg
        self._weights: dict[str, object] = {}
        kt, vt = (self._cache_type(w, t) for w, t in (("k", cache_type_k), ("v", cache_type_v)))
        self.cache_type_k, self.cache_type_v = kt.name, vt.name
        self._kv_types = (kt.ggml_type, vt.ggml_type)
        # a KIVI cache: (key bits, value bits, G, R); the f16 arrays below are its residual,
        # whole, and each layer's quantized groups are kept once made (simd/common/kivi_attn.c)
        self._kivi: tuple[int, int, int, int] | None = None
        if check_kivi_options(kt, vt, kivi_group, kivi_residual):
            self._kivi = (kt.bits, vt.bits, kivi_group, kivi_residual)
            kivi.k_block_bytes(kt.bits, kivi_group, cfg.head_dim)  # typed errors for shapes
            kivi.v_group(vt.bits, kivi_group, cfg.head_dim_v)  # the format has not
            self.kivi = (kivi_group, kivi_residual)
        # (n_layer) each layer's groups made so far: every KV head's key block, the value rows
        # decoded (G, n_head_kv, hd_v) and encoded (G, n_head_kv, row bytes)
        self._kivi_groups: list[dict[int, tuple[list[np.ndarray], np.ndarray, np.ndarray]]] = [
            {} for _ in range(cfg.n_layer)
        ]
        # (n_layer) the first position whose f16 rows the residual holds: 0, unless a saved
        # state restored the layer's newest rows only (a group below it cannot be made again)
        self._f16_from = [0] * cfg.n_layer
        # queries meet the keys as GGML prepares them for the key type (float16, or q8_0
        # blocks for a quantized type); probabilities meet float16 values as float16
        self._query_as = {GGMLType.F16: _round_f16, GGMLType.F32: lambda x: x}.get(
            kt.ggml_type, act_q8_0
        )
        if self._kivi:  # queries and probabilities meet KIVI's parts unrounded
            self._query_as = lambda x: x
        self._probs_as = (
            _round_f16 if vt.ggml_type == GGMLType.F16 and not self._kivi else (lambda x: x)
        )
        self._store_k, self._store_v = _CACHE_STORE[kt.ggml_type], _CACHE_STORE[vt.ggml_type]
        # a q8_0 / q4_0 cache holds its rows Walsh-Hadamard rotated: keys (and the queries
        # that meet them, after any rope) by the keys' block, values by theirs, the attention
        # output rotated back (simd/common/engine.c: hadamard_k, hadamard_v)
        self._hadamard_v = vt.hadamard_block(cfg.head_dim_v, keys=False)
        self._hadamard_k = hk = kt.hadamard_block(cfg.head_dim, keys=True)
        if hk:
            store_k, query_as = self._store_k, self._query_as
            self._store_k = lambda x: store_k(hadamard(x, hk))
            self._query_as = lambda x: query_as(hadamard(x, hk))
        if self._hadamard_v:
            store_v, hv = self._store_v, self._hadamard_v
            self._store_v = lambda x: store_v(hadamard(x, hv))
        kv = (n_ctx, cfg.n_head_kv)
        # (n_layer) x (n_ctx, n_head_kv, head_dim)
        self.k_cache = [
            np.zeros(kv + (cfg.head_dim,), KV_DTYPES[kt.ggml_type]) for _ in range(cfg.n_layer)
        ]
        self.v_cache = [
            np.zeros(kv + (cfg.head_dim_v,), KV_DTYPES[vt.ggml_type]) for _ in range(cfg.n_layer)
        ]
        ff = cfg.rope_freqs_tensor
        self._freq_factors = self._dequantize(ff) if ff else None
        # the attention each position received, in units of 2**-32 (as the native engine sums)
        self.tracks_attention = track_attention
        self._scores = np.zeros(n_ctx, dtype=np.int64) if track_attention else None
        # q8_0 / q4_0 keys move as they are when positions are dropped: (n_ctx) how many
        # positions ahead of its own each key was rotated (simd/common/key_shifts.h)
        self._k_shift: np.ndarray | None = None
        if not self._kivi and kt.name in self.KEPT_ROTATED:
            self._k_shift = np.zeros(n_ctx, dtype=np.int32)

    def _cache_type(self, which: str, name: str) -> CacheType:
        ct = cache_type(name)
        if ct.name not in self.spec.kv_types:
            raise errors.InvalidOptionError(
                f"cache_type_{which} must be one of {', '.join(self.spec.kv_types)} for the "
                "reference engine"
            )
        return ct

    @property
    def isa(self) -> str:
        return "numpy"

    @property
    def memory_bytes(self) -> int:
        """The KV cache and the dequantized weights kept so far."""
        arrays = [*self.k_cache, *self.v_cache]
        for w in self._weights.values():
            arrays.extend(w if isinstance(w, tuple) else (w,))
        return sum(a.nbytes for a in arrays if isinstance(a, np.ndarray))

    @property
    def committed_bytes(self) -> int:
        """The KV cache, and every weight dequantized to float32 (each is kept once used; a
        tied output head dequantizes the embedding too)."""
        kv = sum(a.nbytes for a in (*self.k_cache, *self.v_cache) if isinstance(a, np.ndarray))
        return kv + sum(4 * t.n_elements for t in self.gguf.tensors.values())

    def close(self) -> None:
        self._weights = {}

    # --- rows of the cache, encoded as the native engine stores them (saved sessions) --------

    can_save_rows = True

    def cache_row_bytes(self) -> tuple[int, int]:
        cfg = self.cfg
        k_type, v_type = self._kv_types
        k, v = quants.row_nbytes(k_type, cfg.head_dim), quants.row_nbytes(v_type, cfg.head_dim_v)
        return k * cfg.n_head_kv, v * cfg.n_head_kv

    def layer_rows(self, layer: int) -> int:
        if not 0 <= layer < self.cfg.n_layer:
            raise errors.InvalidOptionError(f"no layer {layer} in {self.cfg.n_layer}")
        return self.n_ctx  # every layer keeps the whole context (no rings here)

    def _read_rows(self, seq: int, layer: int, pos0: int, n: int) -> tuple[bytes, bytes]:
        k_type, v_type = self._kv_types
        k = self.k_cache[layer][pos0 : pos0 + n]  # (n, n_head_kv, head_dim)
        v = self.v_cache[layer][pos0 : pos0 + n]  # (n, n_head_kv, head_dim_v)
        return _CACHE_ENCODE[k_type](k).tobytes(), _CACHE_ENCODE[v_type](v).tobytes()

    def _write_rows(self, seq: int, layer: int, pos0: int, n: int, k: bytes, v: bytes) -> None:
        cfg = self.cfg
        for cache, ggml_type, raw, dim in (
            (self.k_cache, self._kv_types[0], k, cfg.head_dim),
            (self.v_cache, self._kv_types[1], v, cfg.head_dim_v),
        ):
            shape = (n, cfg.n_head_kv, dim)
            values = quants.dequantize(np.frombuffer(raw, np.uint8), ggml_type, shape)
            cache[layer][pos0 : pos0 + n] = values.astype(cache[layer].dtype)
        if self._kivi:  # a state's residual: the rows below were not restored
            self._f16_from[layer] = pos0

    def _clear(self, seq: int) -> None:
        self._f16_from = [0] * self.cfg.n_layer
        if self._k_shift is not None:
            self._k_shift[:] = 0
        for groups in self._kivi_groups:
            groups.clear()

    # --- a KIVI cache's groups, encoded as the native engine stores them ---------------------

    def _group_bytes(self) -> tuple[int, int]:
        assert self._kivi is not None
        (kbits, vbits, g, _), cfg = self._kivi, self.cfg
        k = kivi.k_block_bytes(kbits, g, cfg.head_dim) * cfg.n_head_kv
        return k, g * kivi.v_row_bytes(vbits, g, cfg.head_dim_v) * cfg.n_head_kv

    def _layer_groups(self, layer: int) -> int:
        assert self._kivi is not None
        window = self.cfg.layer_window(layer)
        return self.n_ctx if not window or window > self._kivi[3] else 0  # as kivi_quantize

    def _quantized_groups(self, seq: int) -> int:
        assert self._kivi is not None  # groups are made when first read: all below can be
        return max(self.seq_length(seq) - self._kivi[3], 0) // self._kivi[2]

    def _read_groups(self, seq: int, layer: int, g0: int, n: int) -> tuple[bytes, bytes]:
        parts = [self._kivi_group(layer, gi) for gi in range(g0, g0 + n)]
        k = b"".join(b"".join(block.tobytes() for block in blocks) for blocks, _, _ in parts)
        return k, b"".join(encoded.tobytes() for _, _, encoded in parts)

    def _write_groups(self, seq: int, layer: int, g0: int, n: int, k: bytes, v: bytes) -> None:
        assert self._kivi is not None
        nkv, g = self.cfg.n_head_kv, self._kivi[2]
        kb, vb = self._group_bytes()
        for i in range(n):
            block = np.frombuffer(k[i * kb : (i + 1) * kb], dtype=np.uint8).reshape(nkv, -1)
            encoded = np.frombuffer(v[i * vb : (i + 1) * vb], dtype=np.uint8).reshape(g, nkv, -1)
            self._kivi_groups[layer][g0 + i] = self._kivi_part(list(block), encoded)

    def _set_quantized_groups(self, seq: int, n: int) -> None:
        """Groups are made when a query first reads them: those restored are kept."""

    # --- weights ---------------------------------------------------------------------------

    def _dequantize(self, name: str, raw: np.ndarray | None = None) -> np.ndarray:
        info = self.gguf.tensors[name]
        data = self.gguf.tensor_data(name) if raw is None else raw
        return quants.dequantize(data, info.ggml_type, info.shape[::-1])

    def vector(self, name: str) -> np.ndarray:
        """A norm weight or bias, float32."""
        w = self._weights.get(name)
        if w is None:
            w = self._weights[name] = self._dequantize(name)
        return w  # type: ignore[return-value]  # a vector's name caches a vector

    def matrix(self, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        """(weights, block minimums) with weights exactly dequantized.

        For the types whose values are scale x quant + minimum, the two terms are rounded
        separately by float32 dequantization, so they are decoded apart (zeroing the other
        field) and added in float64. Q4_1 and Q5_1 keep them apart: GGML multiplies their
        minimums by the activations' own block sums.
        """
        cached = self._weights.get(name)
        if cached is not None:
            return cached  # type: ignore[return-value]  # a matrix's name caches its pair
        info = self.gguf.tensors[name]
        two_term = _TWO_TERM.get(info.ggml_type)
        if two_term is None:
            w = self._dequantize(name)
            big = name == self.cfg.output_tensor
            parts: tuple[np.ndarray, np.ndarray | None] = (w if big else w.astype(F64), None)
        else:
            d_at, m_at = two_term
            block = quants.quant_type(info.ggml_type).type_size
            raw = self.gguf.tensor_data(name).reshape(-1, block)
            no_min, no_scale = raw.copy(), raw.copy()
            no_min[:, m_at : m_at + 2] = 0
            no_scale[:, d_at : d_at + 2] = 0
            scaled = self._dequantize(name, no_min.reshape(-1)).astype(F64)
            mins = self._dequantize(name, no_scale.reshape(-1)).astype(F64)
            if info.ggml_type in (GGMLType.Q4_1, GGMLType.Q5_1):
                parts = (scaled, mins[:, ::32].copy())  # one minimum per block of 32
            else:
                parts = (scaled + mins, None)
        self._weights[name] = parts
        return parts

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        info = self.gguf.tensors["token_embd.weight"]
        row_bytes = info.nbytes // info.shape[1]
        raw = self.gguf.tensor_data("token_embd.weight").reshape(info.shape[1], row_bytes)
        x = quants.dequantize(raw[tokens], info.ggml_type, (len(tokens), info.shape[0]))
        return x * F32(self.cfg.embed_scale) if self.cfg.embed_scale != 1.0 else x

    def linear(self, x: np.ndarray, name: str, bias: str | None = None) -> np.ndarray:
        """x (n, cols) float32 -> (n, rows): exact products of the partner activations."""
        gtype = self.gguf.tensors[name].ggml_type
        xp = _PARTNER[gtype](x)
        w, mins = self.matrix(name)
        if w.dtype == F64:
            y = xp @ w.T
        else:
            y = np.empty((len(x), w.shape[0]), dtype=F64)
            for i in range(0, w.shape[0], OUTPUT_CHUNK):
                y[:, i : i + OUTPUT_CHUNK] = xp @ w[i : i + OUTPUT_CHUNK].astype(F64).T
        if mins is not None:
            y += act_q8_1_sums(x) @ mins.T
        y = y.astype(F32)
        return y + self.vector(bias) if bias else y

    # --- forward ---------------------------------------------------------------------------

    def _run(self, batch: Batch) -> np.ndarray:
        """One sequence (positions follow on from n_past, checked by SequenceEngine)."""
        cfg = self.cfg
        tokens = batch.tokens.astype(np.int64)
        pos = batch.positions.astype(np.int64)
        if self._scores is not None:
            self._scores[pos[0] : pos[-1] + 1] = 0  # new rows have received nothing yet
        x = self.embed(tokens)  # (n, n_embd)
        for il in range(cfg.n_layer):
            x = self._layer(il, x, pos)
        x = x[batch.want]  # only the rows whose logits are wanted
        if not len(x):  # a prompt chunk, or a last token evaluated for the cache only
            return np.empty((0, cfg.n_vocab), dtype=F32)
        x = rms_norm(x, cfg.norm_eps) * self.vector("output_norm.weight")
        logits = self.linear(x, cfg.output_tensor)
        if cfg.final_logit_softcap:
            cap = F32(cfg.final_logit_softcap)
            logits = np.tanh((logits / cap).astype(F64)).astype(F32) * cap
        return logits

    def _layer(self, il: int, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        cfg, lt = self.cfg, self.cfg.layers[il]
        h = rms_norm(x, cfg.norm_eps) * self.vector(lt.attn_norm)
        attn = self._attention(il, h, pos)
        if lt.attn_post_norm:
            attn = rms_norm(attn, cfg.norm_eps) * self.vector(lt.attn_post_norm)
        x = x + attn
        h = rms_norm(x, cfg.norm_eps) * self.vector(lt.ffn_norm)
        gate, up = self.linear(h, lt.ffn_gate), self.linear(h, lt.ffn_up)
        ffn = self.linear(
            geglu(gate, up) if cfg.activation == "gelu" else swiglu(gate, up), lt.ffn_down
        )
        if lt.ffn_post_norm:
            ffn = rms_norm(ffn, cfg.norm_eps) * self.vector(lt.ffn_post_norm)
        return x + ffn

    can_track_attention = True

    def _attention_scores(self, seq: int) -> np.ndarray:
        assert self._scores is not None
        return self._scores[: self.seq_length(seq)].copy()

    def _key_shifts(self, seq: int) -> np.ndarray:
        n = self.seq_length(seq)
        return np.zeros(n, np.int32) if self._k_shift is None else self._k_shift[:n].copy()

    def _set_key_shifts(self, seq: int, shifts: np.ndarray) -> None:
        if self._k_shift is not None:
            self._k_shift[:] = 0
            self._k_shift[: len(shifts)] = shifts

    def _evict(self, seq: int, runs: list[tuple[int, int]], n_past: int) -> None:
        """As the native engine: each later key decoded, rotated back by the positions dropped
        below it, stored again (a q8_0 / q4_0 key moved as it is, its shift grown by as
        much); its value and its score moved with it."""
        cfg = self.cfg
        keep = np.ones(n_past, dtype=bool)
        for start, count in runs:
            keep[start : start + count] = False
        src = np.flatnonzero(keep)
        dst = np.arange(len(src))
        src, dst = src[src != dst], dst[src != dst]
        if self._k_shift is not None:
            self._k_shift[dst] = self._k_shift[src] + (src - dst)
            self._k_shift[int(keep.sum()) :] = 0
            for il in range(cfg.n_layer):
                self.k_cache[il][dst] = self.k_cache[il][src]
                self.v_cache[il][dst] = self.v_cache[il][src]
            self._evict_scores(keep, n_past)
            return
        for il in range(cfg.n_layer):
            cos, sin = rope_cos_sin(
                dst - src, cfg.n_rot, cfg.layer_rope_base(il), cfg.layer_rope_scale(il),
                self._freq_factors,
            )  # fmt: skip
            if self._kivi:  # the rows as the cache holds them, from its groups or its residual
                held_k, held_v = self._kivi_hold(il, n_past, runs[0][0])
                keys, values = held_k[src], held_v[src].astype(np.float16)
            else:
                keys, values = self.k_cache[il][src].astype(F32), self.v_cache[il][src]
            self.k_cache[il][dst] = self._store_k(
                apply_rope(keys, cos, sin, cfg.n_rot, cfg.rope_neox)
            )
            self.v_cache[il][dst] = values
        self._evict_scores(keep, n_past)

    def _evict_scores(self, keep: np.ndarray, n_past: int) -> None:
        if self._scores is not None:
            kept = self._scores[:n_past][keep]
            self._scores[: len(kept)] = kept
            self._scores[len(kept) : n_past] = 0

    def _attention(self, il: int, h: np.ndarray, pos: np.ndarray) -> np.ndarray:
        cfg, lt = self.cfg, self.cfg.layers[il]
        n, hd = len(pos), cfg.head_dim
        q = self.linear(h, lt.wq, lt.bq).reshape(n, cfg.n_head, hd)
        k = self.linear(h, lt.wk, lt.bk).reshape(n, cfg.n_head_kv, hd)
        v = self.linear(h, lt.wv, lt.bv).reshape(n, cfg.n_head_kv, cfg.head_dim_v)
        if lt.q_norm and lt.k_norm:  # set together (standard_layers' qk_norm)
            q = rms_norm(q, cfg.norm_eps) * self.vector(lt.q_norm)
            k = rms_norm(k, cfg.norm_eps) * self.vector(lt.k_norm)
        cos, sin = rope_cos_sin(
            pos, cfg.n_rot, cfg.layer_rope_base(il), cfg.layer_rope_scale(il), self._freq_factors
        )
        q = apply_rope(q, cos, sin, cfg.n_rot, cfg.rope_neox)
        k = apply_rope(k, cos, sin, cfg.n_rot, cfg.rope_neox)
        p0, p1 = pos[0], pos[-1] + 1
        self.k_cache[il][p0:p1] = self._store_k(k)
        self.v_cache[il][p0:p1] = self._store_v(v)
        if self._kivi:  # groups holding rewritten rows are stale
            groups = self._kivi_groups[il]
            for gi in [g for g in groups if (g + 1) * self._kivi[2] > p0]:
                del groups[gi]
        keys = self.k_cache[il][:p1].astype(F64)  # (T, n_head_kv, hd)
        vals = self.v_cache[il][:p1].astype(F64)
        if cfg.scale_q:
            q = q * F32(cfg.kq_scale)
        group = cfg.n_head // cfg.n_head_kv
        qg = self._query_as(q).astype(F64).reshape(n, cfg.n_head_kv, group, hd)
        scores = np.einsum("ngrd,tgd->grnt", qg, keys).astype(F32)
        if self._k_shift is not None:
            self._k_shift[p0:p1] = 0  # rotated where they are
            self._shifted_scores(il, q, keys, scores)
        quantized = None
        if self._kivi:  # (n, T) whether query i reads key t from a quantized group
            quantized = np.arange(p1)[None, :] < self._kivi_below(pos)[:, None]
            kq, vq = self._kivi_parts(il, qg.astype(F32), int(self._kivi_below(pos).max()))
            scores[..., : kq.shape[-1]] = np.where(
                quantized[:, : kq.shape[-1]], kq, scores[..., : kq.shape[-1]]
            )
        if not cfg.scale_q:
            scores *= F32(cfg.kq_scale)
        kpos = np.arange(p1)
        masked = kpos[None, :] > pos[:, None]  # (n, T): causal
        window = cfg.layer_window(il)
        if window:
            masked |= pos[:, None] - kpos[None, :] >= window
        scores = np.where(masked, -np.inf, scores).astype(F32)
        weights = ei_exp((scores - scores.max(axis=-1, keepdims=True)).astype(F64))
        total = softmax_sum(weights, np.broadcast_to(~masked, weights.shape))
        probs = self._probs_as((weights / total[..., None]).astype(F32))
        if self._scores is not None:  # every query head's probabilities, in fixed point
            fixed = np.floor(probs.astype(F64) * 2.0**32 + 0.5).astype(np.int64)
            self._scores[:p1] += fixed.sum(axis=(0, 1, 2))
        if quantized is None:
            out = np.einsum("grnt,tgd->ngrd", probs.astype(F64), vals)
        else:  # the quantized rows' terms, then the residual's, both in float64
            pq = np.where(quantized, probs, F32(0)).astype(F64)
            out = np.einsum("grnt,tgd->ngrd", pq[..., : len(vq)], vq.astype(F64))
            out += np.einsum("grnt,tgd->ngrd", np.where(quantized, F32(0), probs).astype(F64), vals)
        out = out.astype(F32)  # (n, n_head_kv, group, hd_v)
        if self._hadamard_v:  # rotated back
            out = hadamard(out, self._hadamard_v)
        return self.linear(out.reshape(n, cfg.n_head * cfg.head_dim_v), lt.wo)

    def _shifted_scores(self, il: int, q: np.ndarray, keys: np.ndarray, scores: np.ndarray) -> None:
        """The scores of the keys rotated d positions ahead of theirs, for each d: against the
        queries rotated d further, then quantized (as ei_attn_quant_scores)."""
        cfg = self.cfg
        assert self._k_shift is not None
        shifts = self._k_shift[: len(keys)]
        n, group = len(q), cfg.n_head // cfg.n_head_kv
        for d in np.unique(shifts[shifts != 0]).tolist():
            at = np.flatnonzero(shifts == d)
            cos, sin = rope_cos_sin(
                np.array([d]), cfg.n_rot, cfg.layer_rope_base(il), cfg.layer_rope_scale(il),
                self._freq_factors,
            )  # fmt: skip
            qd = apply_rope(q, cos, sin, cfg.n_rot, cfg.rope_neox)
            qg = self._query_as(qd).astype(F64).reshape(n, cfg.n_head_kv, group, cfg.head_dim)
            scores[..., at] = np.einsum("ngrd,tgd->grnt", qg, keys[at]).astype(F32)

    # --- KIVI (simd/include/edgeinfer.h: EI_KV_KIVI) ----------------------------------------

    def _kivi_group(self, il: int, gi: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """Group gi of layer il, quantized once from its f16 rows: each KV head's key block,
        and its values decoded (G, n_head_kv, hd_v) and encoded."""
        assert self._kivi is not None
        (kbits, vbits, g, _), nkv = self._kivi, self.cfg.n_head_kv
        part = self._kivi_groups[il].get(gi)
        if part is None:
            if gi * g < self._f16_from[il]:  # as the native engine's kivi_plan refuses
                raise errors.InvalidOptionError(
                    f"layer {il} needs the f16 rows of position {gi * g} to quantize them, which "
                    "its KIVI residual no longer holds (it rewound too far)"
                )
            rows = slice(gi * g, (gi + 1) * g)
            blocks = [kivi.quantize_k(self.k_cache[il][rows, h], kbits) for h in range(nkv)]
            v16 = self.v_cache[il][rows]  # (G, n_head_kv, hd_v)
            encoded = np.stack([
                np.stack([kivi.quantize_v(v16[t, h], vbits, g) for h in range(nkv)])
                for t in range(g)
            ])  # fmt: skip
            part = self._kivi_groups[il][gi] = self._kivi_part(blocks, encoded)
        return part

    def _kivi_part(
        self, blocks: list[np.ndarray], encoded: np.ndarray
    ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """A group as _kivi_groups keeps it, from its key blocks and encoded value rows."""
        assert self._kivi is not None
        (_, vbits, g, _), nkv, hdv = self._kivi, self.cfg.n_head_kv, self.cfg.head_dim_v
        decoded = kivi.decode_v(encoded.reshape(g * nkv, -1), vbits, g, hdv)
        return blocks, decoded.reshape(g, nkv, hdv), encoded

    def _kivi_hold(self, il: int, n_past: int, first: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer il's keys and values (n_past, n_head_kv, d) float32 as the cache holds them
        before positions from ``first`` on move: decoded from their groups where a query at
        n_past reads them quantized, else the f16 rows. The positions of those groups that stay
        (below ``first``) take them as their f16 rows, and the groups from first's on are made
        again from the moved rows (simd/common/engine.c: kivi_evict)."""
        assert self._kivi is not None
        cfg, (kbits, _, g, residual) = self.cfg, self._kivi
        keys = self.k_cache[il][:n_past].astype(F32)
        values = self.v_cache[il][:n_past].astype(F32)
        if self._layer_groups(il):  # a layer whose groups a query reads
            for gi in range(first // g, max(n_past - residual, 0) // g):
                blocks, decoded, _ = self._kivi_group(il, gi)
                rows = slice(gi * g, (gi + 1) * g)
                keys[rows] = np.stack([kivi.decode_k(b, kbits, g, cfg.head_dim) for b in blocks], 1)
                values[rows] = decoded
        stay = slice(first // g * g, first)
        self.k_cache[il][stay] = keys[stay].astype(np.float16)
        self.v_cache[il][stay] = values[stay].astype(np.float16)
        for gi in [x for x in self._kivi_groups[il] if x >= first // g]:
            del self._kivi_groups[il][gi]
        return keys, values

    def _kivi_below(self, pos: np.ndarray) -> np.ndarray:
        """The positions below which each query reads quantized groups."""
        assert self._kivi is not None
        group, residual = self._kivi[2], self._kivi[3]
        return np.maximum(pos + 1 - residual, 0) // group * group

    def _kivi_parts(self, il: int, q: np.ndarray, below: int) -> tuple[np.ndarray, np.ndarray]:
        """Scores of the queries q (n, n_head_kv, group, hd) against the quantized key groups
        below ``below`` (n_head_kv, group, n, below), and those groups' values decoded
        (below, n_head_kv, hd_v); each group quantized once from the f16 rows."""
        assert self._kivi is not None
        cfg, (kbits, _, g, _) = self.cfg, self._kivi
        n, nkv, group, hd = q.shape
        scores = np.zeros((nkv, group, n, below), dtype=F32)
        values = np.zeros((below, nkv, cfg.head_dim_v), dtype=F32)
        for gi in range(below // g):
            blocks, decoded, _ = self._kivi_group(il, gi)
            for h in range(nkv):
                dots = kivi.k_dots(blocks[h], kbits, g, hd, q[:, h])  # (n, group, G)
                scores[h, :, :, gi * g : (gi + 1) * g] = dots.transpose(1, 0, 2)
            values[gi * g : (gi + 1) * g] = decoded
        return scores, values


def open_engine(gguf: GGUFFile, cfg: DecoderConfig, options: EngineOptions) -> ReferenceEngine:
    """The registry's factory (threads, batch size and instruction set do not apply)."""
    if options.isa not in (None, "numpy"):
        raise errors.InvalidOptionError(
            "isa selects native kernels; the reference engine runs numpy"
        )
    return ReferenceEngine(
        gguf, cfg, options.n_ctx, cache_type_k=options.cache_type_k,
        cache_type_v=options.cache_type_v, track_attention=options.track_attention,
        kivi_group=options.kivi_group, kivi_residual=options.kivi_residual,
    )  # fmt: skip
