"""The numpy reference engine: the forward pass written once, plainly.

It is the oracle that every faster engine is tested against, and the portable fallback where
no native engine runs. Weights are dequantized the first time a layer needs them and kept:
as float64 inside the layers (matrix products summed in float64 and rounded once give every
token the same result whatever batch it came in; BLAS in float32 sums a row differently
for different batch shapes), as float32 for the output projection (the largest matrix,
whose rounding feeds nothing downstream). The KV cache holds float16 like llama.cpp's.

It rounds where llama.cpp's CPU backend rounds, so that both compute the same function:
activations are quantized to each weight type's dot-product partner (int8 blocks for the
quantized types, float16 or bfloat16 for the half types) before every matrix product;
queries and attention probabilities are rounded to float16 before they meet the float16 KV
cache; GELU goes through a float16 table. Only the order of float additions differs.
"""

from __future__ import annotations

import numpy as np

from edgeinfer import errors, quants
from edgeinfer.gguf import GGMLType, GGUFFile
from edgeinfer.models.base import DecoderConfig

SQRT_2_OVER_PI = np.float32(0.7978845608028654)
GELU_COEF_A = np.float32(0.044715)


def _round_f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _round_bf16(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    r = np.where(np.isnan(x), (u.astype(np.uint32) | 0x400000) & 0xFFFF0000, r).astype(np.uint32)
    return r.view(np.float32).reshape(x.shape)


def act_q8_0(x: np.ndarray) -> np.ndarray:
    """Activations through GGML's x86 q8_0 quantizer (scale 127/amax, round half to even)."""
    b = x.reshape(x.shape[:-1] + (-1, 32))
    amax = np.abs(b).max(axis=-1, keepdims=True)
    d = _round_f16(amax / np.float32(127.0))
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    return (np.rint(b * inv) * d).reshape(x.shape)


def act_q8_K(x: np.ndarray) -> np.ndarray:
    """Activations through GGML's q8_K quantizer (signed extreme -> -127, float32 scale)."""
    b = x.reshape(x.shape[:-1] + (-1, 256))
    first = np.argmax(np.abs(b), axis=-1)[..., None]
    extreme = np.take_along_axis(b, first, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(extreme != 0, np.float32(-127.0) / extreme, np.float32(0.0)).astype(np.float32)
        d = np.where(extreme != 0, np.float32(1.0) / iscale, np.float32(0.0)).astype(np.float32)
    q = np.minimum(np.rint(b * iscale), 127.0)
    return (q * d).reshape(x.shape)


def act_q8_1_sums(x: np.ndarray) -> np.ndarray:
    """The ``s`` field of GGML's x86 q8_1 blocks: float16(amax/127 * sum(q)), (..., n_blocks).

    Q4_1 and Q5_1 products add ``min * s`` per block, with this rounding rather than the
    exact sum of the dequantized activations."""
    b = x.reshape(x.shape[:-1] + (-1, 32))
    amax = np.abs(b).max(axis=-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    q_sum = np.rint(b * inv[..., None]).sum(axis=-1)
    return _round_f16((amax / np.float32(127.0)) * q_sum.astype(np.float32))


# what GGML's CPU backend turns activations into before a dot product with each weight type
_VEC_DOT = {
    GGMLType.F32: None,
    GGMLType.F16: _round_f16,
    GGMLType.BF16: _round_bf16,
    GGMLType.Q4_0: act_q8_0, GGMLType.Q5_0: act_q8_0, GGMLType.Q8_0: act_q8_0,
    GGMLType.Q4_1: act_q8_0, GGMLType.Q5_1: act_q8_0,  # q8_1 has q8_0's values (and sums)
    GGMLType.Q2_K: act_q8_K, GGMLType.Q3_K: act_q8_K, GGMLType.Q4_K: act_q8_K,
    GGMLType.Q5_K: act_q8_K, GGMLType.Q6_K: act_q8_K,
}  # fmt: skip


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    # x: (..., n). Squares in float32, summed in float64, the scale in float32: as GGML does
    total = np.sum(np.square(x).astype(np.float64), axis=-1, keepdims=True)
    mean = (total / x.shape[-1]).astype(np.float32)
    return x * (np.float32(1.0) / np.sqrt(mean + np.float32(eps)))


def _gelu_table() -> np.ndarray:
    """GGML's CPU GELU: a table of float16 results indexed by the float16-rounded input.

    Its entries come from float32 arithmetic with the inner multiply-add fused (as compilers
    contract it) and a correctly rounded tanh, which is what GGML builds get from libm.
    """
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        a_x = (GELU_COEF_A * x).astype(np.float64)
        inner = (a_x * x.astype(np.float64) + 1.0).astype(np.float32)  # fma(A*x, x, 1)
        arg = (SQRT_2_OVER_PI * x) * inner
        t = np.tanh(arg.astype(np.float64)).astype(np.float32)
        return ((np.float32(0.5) * x) * (np.float32(1.0) + t)).astype(np.float16).astype(np.float32)


_GELU_F16 = _gelu_table()


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    idx = gate.astype(np.float16).view(np.uint16)
    g = _GELU_F16[idx]
    g = np.where(gate <= -10.0, 0.0, np.where(gate >= 10.0, gate, g)).astype(np.float32)
    return g * up


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return gate / (1.0 + np.exp(-gate)) * up


def rope_cos_sin(
    positions: np.ndarray, n_rot: int, base: float, freq_scale: float, freq_factors: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """(n_tokens, n_rot/2) cosines and sines, with GGML's float32 recurrence for the angles."""
    theta_scale = np.float32(base) ** np.float32(-2.0 / n_rot)
    steps = np.full((len(positions), n_rot // 2), theta_scale, dtype=np.float32)
    steps[:, 0] = positions.astype(np.float32)
    theta = np.cumprod(steps, axis=1, dtype=np.float32)  # p, p*s, (p*s)*s, ...
    if freq_factors is not None:
        theta = theta / freq_factors.astype(np.float32)
    theta = theta * np.float32(freq_scale)
    return np.cos(theta), np.sin(theta)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_rot: int, neox: bool) -> np.ndarray:
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


KV_TYPES = {"f16": np.float16, "f32": np.float32}


class ReferenceEngine:
    """Runs one sequence; ``forward`` appends tokens to the KV cache and returns logits."""

    name = "reference"

    def __init__(self, gguf: GGUFFile, cfg: DecoderConfig, n_ctx: int, kv_type: str = "f16") -> None:
        self.gguf, self.cfg, self.n_ctx = gguf, cfg, n_ctx
        self._weights: dict[str, np.ndarray] = {}
        if kv_type not in KV_TYPES:
            raise errors.InvalidOptionError(f"kv_type must be one of {', '.join(KV_TYPES)}")
        dtype = KV_TYPES[kv_type]
        # queries and probabilities meet the cache in its own precision, as in GGML
        self._to_kv = _round_f16 if dtype == np.float16 else lambda x: x
        kv = (n_ctx, cfg.n_head_kv)
        # (n_layer) x (n_ctx, n_head_kv, head_dim)
        self.k_cache = [np.zeros(kv + (cfg.head_dim,), dtype) for _ in range(cfg.n_layer)]
        self.v_cache = [np.zeros(kv + (cfg.head_dim_v,), dtype) for _ in range(cfg.n_layer)]
        self.n_past = 0
        ff = cfg.rope_freqs_tensor
        self._freq_factors = self.weight(ff) if ff else None

    # --- weights ---------------------------------------------------------------------------

    def weight(self, name: str) -> np.ndarray:
        """Dequantized float32 weight, numpy order (rows = GGUF ne1, columns = ne0)."""
        w = self._weights.get(name)
        if w is None:
            info = self.gguf.tensors[name]
            w = quants.dequantize(self.gguf.tensor_data(name), info.ggml_type, info.shape[::-1])
            if len(info.shape) > 1 and name != self.cfg.output_tensor:
                w = w.astype(np.float64)
            self._weights[name] = w
        return w

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        info = self.gguf.tensors["token_embd.weight"]
        row_bytes = info.nbytes // info.shape[1]
        raw = self.gguf.tensor_data("token_embd.weight").reshape(info.shape[1], row_bytes)
        x = quants.dequantize(raw[tokens], info.ggml_type, (len(tokens), info.shape[0]))
        return x * np.float32(self.cfg.embed_scale) if self.cfg.embed_scale != 1.0 else x

    def linear(self, x: np.ndarray, name: str, bias: str | None = None) -> np.ndarray:
        gtype = self.gguf.tensors[name].ggml_type
        if gtype in (GGMLType.Q4_1, GGMLType.Q5_1):
            return self._linear_with_mins(x, name, bias)
        to_partner = _VEC_DOT[gtype]
        if to_partner is not None:
            x = to_partner(x)
        w = self.weight(name)
        n = len(x)
        if w.dtype == np.float32 and n == 1:
            x = np.vstack([x, x])  # BLAS sums a lone row (gemv) in another order than gemm
        y = (x.astype(w.dtype) @ w.T).astype(np.float32)[:n]
        return y + self.weight(bias) if bias else y

    def _linear_with_mins(self, x: np.ndarray, name: str, bias: str | None) -> np.ndarray:
        """Q4_1/Q5_1: scaled quants against the activations, plus block minimum x block sum."""
        key = name + "#split"
        parts = self._weights.get(key)
        if parts is None:
            info = self.gguf.tensors[name]
            rows, cols = info.shape[1], info.shape[0]
            raw = self.gguf.tensor_data(name).reshape(rows, cols // 32, -1)
            mins = raw[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)  # (rows, nb)
            scaled = self.weight(name) - np.repeat(mins, 32, axis=1)
            parts = self._weights[key] = (scaled, mins)
        scaled, mins = parts
        xq = act_q8_0(x).astype(np.float64)
        y = (xq @ scaled.T + act_q8_1_sums(x).astype(np.float64) @ mins.T).astype(np.float32)
        return y + self.weight(bias) if bias else y

    # --- forward ---------------------------------------------------------------------------

    def truncate(self, n_keep: int) -> None:
        """Forgets every cached position from ``n_keep`` on."""
        self.n_past = min(self.n_past, max(0, n_keep))

    def forward(self, tokens: list[int] | np.ndarray, all_logits: bool = False) -> np.ndarray:
        """Appends ``tokens`` at positions n_past...; returns logits of the last or every token."""
        cfg = self.cfg
        tokens = np.asarray(tokens, dtype=np.int64)
        n = len(tokens)
        if n == 0:
            raise errors.InvalidOptionError("forward needs at least one token")
        if self.n_past + n > self.n_ctx:
            raise errors.ContextOverflowError(
                f"{self.n_past} cached + {n} new tokens exceed the context of {self.n_ctx}"
            )
        if tokens.min() < 0 or tokens.max() >= cfg.n_vocab:
            raise errors.InvalidOptionError(f"token ids must lie in [0, {cfg.n_vocab})")
        pos = np.arange(self.n_past, self.n_past + n)
        x = self.embed(tokens)  # (n, n_embd)
        for il in range(cfg.n_layer):
            x = self._layer(il, x, pos)
        self.n_past += n
        if not all_logits:
            x = x[-1:]
        x = rms_norm(x, cfg.norm_eps) * self.weight("output_norm.weight")
        logits = self.linear(x, cfg.output_tensor)
        if cfg.final_logit_softcap:
            cap = np.float32(cfg.final_logit_softcap)
            logits = np.tanh(logits / cap) * cap
        return logits if all_logits else logits[0]

    def _layer(self, il: int, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        cfg, lt = self.cfg, self.cfg.layers[il]
        h = rms_norm(x, cfg.norm_eps) * self.weight(lt.attn_norm)
        attn = self._attention(il, h, pos)
        if lt.attn_post_norm:
            attn = rms_norm(attn, cfg.norm_eps) * self.weight(lt.attn_post_norm)
        x = x + attn
        h = rms_norm(x, cfg.norm_eps) * self.weight(lt.ffn_norm)
        gate, up = self.linear(h, lt.ffn_gate), self.linear(h, lt.ffn_up)
        ffn = self.linear(geglu(gate, up) if cfg.activation == "gelu" else swiglu(gate, up), lt.ffn_down)
        if lt.ffn_post_norm:
            ffn = rms_norm(ffn, cfg.norm_eps) * self.weight(lt.ffn_post_norm)
        return x + ffn

    def _attention(self, il: int, h: np.ndarray, pos: np.ndarray) -> np.ndarray:
        cfg, lt = self.cfg, self.cfg.layers[il]
        n, hd = len(pos), cfg.head_dim
        q = self.linear(h, lt.wq, lt.bq).reshape(n, cfg.n_head, hd)
        k = self.linear(h, lt.wk, lt.bk).reshape(n, cfg.n_head_kv, hd)
        v = self.linear(h, lt.wv, lt.bv).reshape(n, cfg.n_head_kv, cfg.head_dim_v)
        if lt.q_norm:
            q = rms_norm(q, cfg.norm_eps) * self.weight(lt.q_norm)
            k = rms_norm(k, cfg.norm_eps) * self.weight(lt.k_norm)
        cos, sin = rope_cos_sin(
            pos, cfg.n_rot, cfg.layer_rope_base(il), cfg.rope_freq_scale, self._freq_factors
        )
        q = apply_rope(q, cos, sin, cfg.n_rot, cfg.rope_neox)
        k = apply_rope(k, cos, sin, cfg.n_rot, cfg.rope_neox)
        p0, p1 = pos[0], pos[-1] + 1
        self.k_cache[il][p0:p1] = k
        self.v_cache[il][p0:p1] = v
        keys = self.k_cache[il][:p1].astype(np.float32)  # (T, n_head_kv, hd)
        vals = self.v_cache[il][:p1].astype(np.float32)
        group = cfg.n_head // cfg.n_head_kv
        if cfg.scale_q:
            q = q * np.float32(cfg.kq_scale)
        qg = self._to_kv(q).reshape(n, cfg.n_head_kv, group, hd)
        scores = np.einsum("ngrd,tgd->grnt", qg, keys)
        if not cfg.scale_q:
            scores *= np.float32(cfg.kq_scale)
        kpos = np.arange(p1)
        masked = kpos[None, :] > pos[:, None]  # (n, T): causal
        window = cfg.layer_window(il)
        if window:
            masked |= pos[:, None] - kpos[None, :] >= window
        scores = np.where(masked, -np.inf, scores)
        # softmax and the weighted sum in float64: a query's result must not depend on how
        # many masked keys its batch carries (float32 sums would group the terms differently)
        scores = (scores - scores.max(axis=-1, keepdims=True)).astype(np.float64)
        probs = np.exp(scores)
        probs = (probs / probs.sum(axis=-1, keepdims=True)).astype(np.float32)
        out = np.einsum("grnt,tgd->ngrd", self._to_kv(probs).astype(np.float64), vals)
        out = out.astype(np.float32)  # (n, n_head_kv, group, hd_v)
        return self.linear(out.reshape(n, cfg.n_head * cfg.head_dim_v), lt.wo)
