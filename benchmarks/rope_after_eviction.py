"""Keys after an eviction: how edgeinfer moves the cached keys (an f16 or f32 key rotated
back and encoded again; a q8_0 or q4_0 key moved as it is, the query rotated as far ahead as
the key is: simd/common/key_shifts.h) against caching keys before RoPE, measured for
accuracy and speed on the native engine.

    python benchmarks/rope_after_eviction.py [MODEL.gguf] [-t 2] [--json OUT] [--quick]

MODEL defaults to the packaged Gemma 3 270M Q4_K_M. Three parts:

a. accuracy: a text streamed through a small context (--acc-ctx) under the streaming and the
   shift policies, for each K cache type (V f16). Every eviction moves the keys above the
   dropped run down: for f16 and f32 the engine decodes each one, rotates it back and encodes
   it again; q8_0 and q4_0 keys keep their bytes and their shift (the positions they are
   ahead of their own), so attention meets them rotated back by it. Layer
   0's keys depend only on the token and its position (its input is the token embedding), so
   the held tokens evaluated afresh at their current positions with an f32 K cache give the
   exact keys. Against them: the keys as attention meets them (each held key decoded and, by
   its shift, rotated back in float64; the scores of a query rotated ahead are the same up to
   float rounding), and the keys a cache of the
   same type filled before RoPE would hand attention (emulated: the exact key rotated back to
   position 0 in float64, quantized once with the numpy quantizers the reference engine
   uses, decoded, rotated to its position in float64). Relative RMS error
   ||k - exact|| / ||exact|| by the number of times a key was moved, and the same for the
   scores q.k (times the attention scale) of layer 0's real queries, computed with the numpy
   reference engine's layer-0 projection, causal pairs only.
b. speed: a context of --speed-ctx under streaming (an eighth dropped at a time), for each K
   type: the time of each eviction call, amortized over the tokens generated until the next
   one, next to the decode time per token at that context, both measured in the run. Then
   what caching keys before RoPE would add to every decode step: a rotation of every key that
   attention reads (all held positions of a global layer, the window of a sliding one), timed
   as one pass of the native rope kernel over that many values with a cos/sin table of the
   same size (one thread), and for a quantized K the decoding of those keys to f32 (native
   to_float kernel), which attention on pre-RoPE quantized keys needs before it can rotate.
c. perplexity past the context (--past-ctx, a text of 8 contexts, fed as generation does):
   streaming with each K type (V f16), against windowed recomputation with the same K type
   (the last n_ctx - stride tokens evaluated afresh every stride tokens: one quantization per
   key, never moved), so that what moving quantized keys costs shows end to end.

Prints markdown tables; --json writes every figure.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from kv_cache import machine, model_and_text  # the sibling benchmark's setup

if TYPE_CHECKING:  # edgeinfer is imported once model_and_text put the checkout on the path
    from edgeinfer.models.base import DecoderConfig

K_TYPES = ["f32", "f16", "q8_0", "q4_0"]  # f32: the control (rotation rounding only)
N_BATCH = 512
N_SINK = 4


# --- rotation in float64 ------------------------------------------------------------------


def rotate(x: np.ndarray, pos: np.ndarray, n_rot: int, base: float, scale: float,
           neox: bool) -> np.ndarray:  # fmt: skip
    """x (n, heads, head_dim) rotated by RoPE to positions ``pos`` (n,), in float64 (a negative
    position rotates back)."""
    half = n_rot // 2
    freqs = base ** (-2.0 * np.arange(half, dtype=np.float64) / n_rot)
    theta = scale * pos.astype(np.float64)[:, None] * freqs[None, :]  # (n, half)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    out = x.astype(np.float64)  # a copy
    if neox:
        x0, x1 = out[..., :half].copy(), out[..., half:n_rot].copy()
        out[..., :half], out[..., half:n_rot] = x0 * c - x1 * s, x0 * s + x1 * c
    else:
        x0, x1 = out[..., 0:n_rot:2].copy(), out[..., 1:n_rot:2].copy()
        out[..., 0:n_rot:2], out[..., 1:n_rot:2] = x0 * c - x1 * s, x0 * s + x1 * c
    return out


def cache_store(k_type: str) -> Callable[[np.ndarray], np.ndarray]:
    """float32 values -> the values a cache of ``k_type`` holds for them (GGML's quantizers,
    as the numpy reference engine applies them)."""
    from edgeinfer.engines.reference import act_q8_0, q4_0_values

    stores: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "f32": lambda x: x,
        "f16": lambda x: x.astype(np.float16).astype(np.float32),
        "q8_0": lambda x: act_q8_0(x).astype(np.float32),
        "q4_0": q4_0_values,
    }
    return stores[k_type]


# --- a. accuracy ----------------------------------------------------------------------------


def layer0_keys(eng: Any, k_type: str, shape: tuple[int, int]) -> np.ndarray:
    """Layer 0's cached keys of every held position, decoded: (n_past, n_head_kv, head_dim)."""
    from edgeinfer import quants
    from edgeinfer.engines.reference import hadamard
    from edgeinfer.kv_cache import cache_type

    n_past = eng.seq_length(0)
    lo = max(0, n_past - eng.layer_rows(0))
    if lo:
        raise RuntimeError(f"layer 0 holds positions from {lo} only: use a smaller context")
    k, _ = eng.read_rows(0, 0, n_past)
    raw = np.frombuffer(k, np.uint8)
    keys = quants.dequantize(raw, cache_type(k_type).ggml_type, (n_past, *shape))
    block = cache_type(k_type).hadamard_block(shape[-1], keys=True)
    return hadamard(keys, block) if block else keys  # a q8_0 / q4_0 cache's rotation undone


def stream(path: Path, tokens: list[int], policy: str, k_type: str, args: argparse.Namespace
           ) -> tuple[np.ndarray, list[int], np.ndarray, int, np.ndarray]:  # fmt: skip
    """Streams ``tokens`` through the context under ``policy``: (layer 0's cached keys, the
    held tokens, how many times each held key was moved, evictions, each key's shift)."""
    import edgeinfer
    from edgeinfer.context_policy import make_room

    params: dict[str, Any] = {"n_keep": 1} if policy == "shift" else {"n_sink": N_SINK}
    with edgeinfer.load(path, n_ctx=args.acc_ctx, n_threads=args.threads, engine="native",
                        cache_type_k=k_type, cache_type_v="f16", context_policy=policy,
                        **params) as model:  # fmt: skip
        eng, cfg = model.backend, model.config
        held = np.zeros(0, dtype=np.int64)  # the token at each cached position
        moves = np.zeros(0, dtype=np.int64)  # the times its key was moved
        evictions = 0
        for start in range(0, len(tokens), args.chunk):
            piece = tokens[start : start + args.chunk]
            runs = make_room(eng, model.context_policy, len(piece))
            if runs:  # runs in positions before the drop
                keep = np.ones(len(held), dtype=bool)
                for run_start, count in runs:
                    keep[run_start : run_start + count] = False
                moved = np.flatnonzero(keep) != np.arange(keep.sum())
                held, moves = held[keep], moves[keep] + moved
                evictions += 1
            eng.forward(piece)
            held = np.concatenate([held, piece])
            moves = np.concatenate([moves, np.zeros(len(piece), dtype=np.int64)])
        keys = layer0_keys(eng, k_type, (cfg.n_head_kv, cfg.head_dim))
        shifts = eng.key_shifts()
    return keys, held.tolist(), moves, evictions, shifts


def fresh_keys(path: Path, held: list[int], args: argparse.Namespace) -> np.ndarray:
    """Layer 0's keys of ``held`` evaluated afresh at positions 0.. with an f32 K cache."""
    import edgeinfer

    with edgeinfer.load(path, n_ctx=args.acc_ctx, n_threads=args.threads, engine="native",
                        cache_type_k="f32", cache_type_v="f16") as model:  # fmt: skip
        eng, cfg = model.backend, model.config
        for start in range(0, len(held), N_BATCH):
            eng.forward(held[start : start + N_BATCH])
        return layer0_keys(eng, "f32", (cfg.n_head_kv, cfg.head_dim))


def layer0_queries(path: Path, held: list[int]) -> np.ndarray:
    """Layer 0's queries of ``held`` at positions 0.., after RoPE, with the numpy reference
    engine's arithmetic: (n, n_head, head_dim) float64."""
    import edgeinfer
    from edgeinfer.engines.reference import ReferenceEngine, apply_rope, rms_norm, rope_cos_sin

    with edgeinfer.load(path, n_ctx=max(len(held), 1), engine="reference") as model:
        eng, cfg = model.backend, decoder_config(model)
        assert isinstance(eng, ReferenceEngine)
        lt = cfg.layers[0]
        n = len(held)
        h = rms_norm(eng.embed(np.asarray(held)), cfg.norm_eps) * eng.vector(lt.attn_norm)
        q = eng.linear(h, lt.wq, lt.bq).reshape(n, cfg.n_head, cfg.head_dim)
        if lt.q_norm:
            q = rms_norm(q, cfg.norm_eps) * eng.vector(lt.q_norm)
        cos, sin = rope_cos_sin(np.arange(n), cfg.n_rot, cfg.layer_rope_base(0),
                                cfg.layer_rope_scale(0), None)  # fmt: skip
        return apply_rope(q, cos, sin, cfg.n_rot, cfg.rope_neox).astype(np.float64)


def score_errors(q: np.ndarray, keys: np.ndarray, exact: np.ndarray, kq_scale: float
                 ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Per key position t: (sum over causal queries i >= t and heads of (s - s_exact)^2, of
    s_exact^2), s = kq_scale q_i.k_t."""
    n, n_head, hd = q.shape
    group = n_head // keys.shape[1]
    qg = q.reshape(n, keys.shape[1], group, hd)
    causal = np.tril(np.ones((n, n), dtype=bool))  # [i, t]: t <= i
    s_exact = np.einsum("ighd,tgd->ghit", qg, exact.astype(np.float64)) * kq_scale
    diff = np.einsum("ighd,tgd->ghit", qg, (keys - exact).astype(np.float64)) * kq_scale
    sq_err = np.where(causal, diff**2, 0.0).sum(axis=(0, 1, 2))
    sq_ref = np.where(causal, s_exact**2, 0.0).sum(axis=(0, 1, 2))
    return sq_err, sq_ref


# moves grouped for the tables: each of 0..8 alone (streaming moves a key at most about 8
# times), then doubling ranges (h2o keeps heavy hitters through many evictions)
BUCKETS = [(m, m) for m in range(9)] + [(9, 16), (17, 32), (33, 64), (65, 1 << 30)]


def bucket_name(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}+" if hi == 1 << 30 else f"{lo}-{hi}"


def by_moves(moves: np.ndarray, err: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """sqrt(sum err / sum ref) over the keys moved m times, m in each bucket seen."""
    out = {}
    for lo, hi in BUCKETS:
        sel = (moves >= lo) & (moves <= hi)
        if sel.any():
            out[bucket_name(lo, hi)] = math.sqrt(err[sel].sum() / ref[sel].sum())
    return out


def count_by_moves(moves: np.ndarray) -> dict[str, int]:
    out = {}
    for lo, hi in BUCKETS:
        n = int(((moves >= lo) & (moves <= hi)).sum())
        if n:
            out[bucket_name(lo, hi)] = n
    return out


def decoder_config(model: Any) -> DecoderConfig:
    """The model's DecoderConfig (every GGUF model has one)."""
    from edgeinfer.models.base import DecoderConfig

    cfg = model.config
    assert isinstance(cfg, DecoderConfig)
    return cfg


def accuracy(path: Path, tokens: list[int], args: argparse.Namespace) -> dict[str, Any]:
    import edgeinfer

    with edgeinfer.load(path, n_ctx=64, engine="native") as model:
        cfg = decoder_config(model)
    if cfg.rope_freqs_tensor:
        raise RuntimeError("per-dimension rope frequency factors are not emulated here")
    rope = (cfg.n_rot, cfg.layer_rope_base(0), cfg.layer_rope_scale(0), cfg.rope_neox)
    text = tokens[: args.acc_tokens]
    rows = []
    for policy in ("streaming", "shift", "h2o"):
        fresh: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
        for k_type in K_TYPES:
            t = time.perf_counter()
            stored, held, moves, evictions, shifts = stream(path, text, policy, k_type, args)
            keys = rotate(stored, -shifts, *rope)  # as attention meets them
            if tuple(held) not in fresh:  # the same for every type; computed once
                exact = fresh_keys(path, held, args)
                fresh[tuple(held)] = (exact, layer0_queries(path, held))
            exact, q = fresh[tuple(held)]
            pos = np.arange(len(held))
            pre = rotate(exact, -pos, *rope).astype(np.float32)  # the pre-RoPE key, stored
            pre_rope = rotate(cache_store(k_type)(pre), pos, *rope)  # as attention gets it
            # the native store against the numpy quantizer, on keys never moved: both should
            # quantize the same f32 key (the fresh one) the same way
            never = moves == 0
            same = np.abs(stored[never] - cache_store(k_type)(exact[never])).max(initial=0.0)
            ref = (exact.astype(np.float64) ** 2).sum(axis=(1, 2))
            row: dict[str, Any] = {
                "policy": policy, "k": k_type, "n_ctx": args.acc_ctx, "tokens": len(text),
                "evictions": evictions, "held": len(held), "max_moves": int(moves.max()),
                "max_shift": int(shifts.max(initial=0)),
                "keys_by_moves": count_by_moves(moves),
                "unmoved_native_vs_numpy_max_abs": float(same),
            }  # fmt: skip
            for name, k in (("cached", keys), ("pre_rope", pre_rope)):
                err = ((k - exact.astype(np.float64)) ** 2).sum(axis=(1, 2))
                row[f"{name}_key_rel_rms"] = by_moves(moves, err, ref)
                row[f"{name}_key_rel_rms_all"] = math.sqrt(err.sum() / ref.sum())
                s_err, s_ref = score_errors(q, k, exact, cfg.kq_scale)
                row[f"{name}_score_rel_rms"] = by_moves(moves, s_err, s_ref)
                counts = np.arange(len(held), 0, -1) * cfg.n_head  # causal pairs per key
                row[f"{name}_score_abs_rms"] = by_moves(moves, s_err, counts.astype(np.float64))
            rows.append(row)
            print(f"  accuracy: {policy} {k_type} {time.perf_counter() - t:.0f} s",
                  file=sys.stderr)  # fmt: skip
    layer0 = {"window": cfg.layer_window(0), "rope_base": rope[1], "rope_scale": rope[2],
              "neox": rope[3], "n_rot": rope[0], "n_head": cfg.n_head,
              "n_head_kv": cfg.n_head_kv, "head_dim": cfg.head_dim}  # fmt: skip
    return {"rows": rows, "layer0": layer0}


# --- b. speed -------------------------------------------------------------------------------


def keys_read(cfg: Any, n_past: int) -> int:
    """Key values (all layers) attention reads for one new token after ``n_past``."""
    total = 0
    for il in range(cfg.n_layer):
        window = cfg.layer_window(il)
        n = min(n_past + 1, window) if window else n_past + 1
        total += n * cfg.n_head_kv * cfg.head_dim
    return total


def kernel_seconds(isa: str, n_values: int, k_type: str, reps: int) -> dict[str, float]:
    """Median seconds, one thread, of one native rope pass over ``n_values`` floats (NeoX
    pairs, a cos/sin table of as many floats) and of decoding as many K values of
    ``k_type`` to f32."""
    from edgeinfer import quants
    from edgeinfer._native import Kernels
    from edgeinfer.kv_cache import cache_type

    kern = Kernels(isa)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n_values, dtype=np.float32)
    angles = rng.uniform(-np.pi, np.pi, n_values // 2)
    cs = np.stack([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32).reshape(-1)
    ptr = ctypes.c_void_p
    rope_t = []
    for _ in range(reps):
        t = time.perf_counter()
        status = kern.lib.ei_kernel_rope(kern.isa, n_values, x.ctypes.data_as(ptr),
                                         cs.ctypes.data_as(ptr), 1)  # fmt: skip
        rope_t.append(time.perf_counter() - t)
        if status:
            raise RuntimeError(f"ei_kernel_rope failed with status {status}")
    out: dict[str, float] = {"rope_s": float(np.median(rope_t))}
    ggml_type = cache_type(k_type).ggml_type
    if k_type not in ("f32",):
        raw = np.zeros(quants.row_nbytes(ggml_type, n_values), dtype=np.uint8)
        raw[:] = rng.integers(0, 60, raw.size, dtype=np.uint8)  # small scales, no NaN/inf
        dst = np.empty(n_values, dtype=np.float32)
        dec_t = []
        for _ in range(reps):
            t = time.perf_counter()
            status = kern.lib.ei_kernel_to_float(kern.isa, int(ggml_type), raw.ctypes.data_as(ptr),
                                                 dst.ctypes.data_as(ptr), n_values)  # fmt: skip
            dec_t.append(time.perf_counter() - t)
            if status:
                raise RuntimeError(f"ei_kernel_to_float failed with status {status}")
        out["decode_s"] = float(np.median(dec_t))
    return out


def speed(path: Path, tokens: list[int], args: argparse.Namespace) -> dict[str, Any]:
    import edgeinfer
    from edgeinfer.context_policy import make_room

    n_ctx = args.speed_ctx
    rows = []
    for k_type in K_TYPES[1:]:
        with edgeinfer.load(path, n_ctx=n_ctx, n_threads=args.threads, engine="native",
                            cache_type_k=k_type, cache_type_v="f16",
                            context_policy="streaming", n_sink=N_SINK) as model:  # fmt: skip
            eng, cfg, policy = model.backend, model.config, model.context_policy
            text = (tokens * (1 + (n_ctx * 3) // max(len(tokens), 1)))[: n_ctx * 3]
            for start in range(0, n_ctx, N_BATCH):
                eng.forward(text[start : min(start + N_BATCH, n_ctx)])
            fed = n_ctx
            evictions, decode, contexts = [], [], []
            for _ in range(args.evictions):
                t = time.perf_counter()
                runs = make_room(eng, policy, 1)
                evictions.append((time.perf_counter() - t, sum(c for _, c in runs)))
                for _ in range(args.decode_steps):  # generation at this context, timed
                    contexts.append(eng.seq_length(0))
                    t = time.perf_counter()
                    eng.forward([text[fed % len(text)]])
                    decode.append(time.perf_counter() - t)
                    fed += 1
                while eng.seq_length(0) < n_ctx:  # the rest of the room, as one batch
                    n = min(N_BATCH, n_ctx - eng.seq_length(0))
                    eng.forward([text[(fed + i) % len(text)] for i in range(n)])
                    fed += n
            isa = eng.isa
        ev_s = float(np.median([s for s, _ in evictions]))
        dropped = int(np.median([c for _, c in evictions]))
        dec_s = float(np.median(decode))
        n_past = int(np.mean(contexts))
        n_values = keys_read(cfg, n_past)
        kern = kernel_seconds(isa, n_values, k_type, args.kernel_reps)
        rows.append({
            "k": k_type, "n_ctx": n_ctx, "isa": isa, "evictions": len(evictions),
            "eviction_s": [s for s, _ in evictions], "dropped": dropped,
            "eviction_median_s": ev_s, "eviction_per_token_s": ev_s / dropped,
            "decode_s_per_token": dec_s, "decode_context": n_past,
            "key_values_read_per_token": n_values,
            "pre_rope_rope_s_per_token": kern["rope_s"],
            "pre_rope_decode_s_per_token": kern.get("decode_s"),
        })  # fmt: skip
        print(f"  speed: {k_type} done", file=sys.stderr)
    return {"rows": rows}


# --- c. perplexity past the context ---------------------------------------------------------


def nll_of(logits: np.ndarray, target: int) -> float:
    x = logits.astype(np.float64)
    top = x.max()
    return float(np.log(np.exp(x - top).sum()) + top - x[target])


def past_context(path: Path, tokens: list[int], bos: int, args: argparse.Namespace
                 ) -> dict[str, Any]:  # fmt: skip
    import edgeinfer
    from edgeinfer.generation import KVSession

    n_ctx, stride = args.past_ctx, args.stride
    text = [bos] + tokens[: 8 * n_ctx - 1]
    rows = []
    for method in ("streaming", "recompute"):
        for k_type in ("f16", "q8_0", "q4_0"):
            options: dict[str, Any] = (
                {"context_policy": "streaming", "n_sink": N_SINK} if method == "streaming" else {}
            )
            nll = np.zeros(len(text) - 1)
            t = time.perf_counter()
            with edgeinfer.load(path, n_ctx=n_ctx, n_threads=args.threads, engine="native",
                                cache_type_k=k_type, cache_type_v="f16",
                                **options) as model:  # fmt: skip
                eng = model.backend
                if method == "streaming":
                    session = KVSession(eng, 1, model.context_policy)
                    for i in range(len(text) - 1):
                        nll[i] = nll_of(session.decode(text[i]), text[i + 1])
                else:  # full: BOS and the last n_ctx - stride tokens evaluated afresh
                    for i in range(len(text) - 1):
                        if eng.seq_length(0) == n_ctx:
                            eng.truncate(0)
                            logits = eng.forward([bos] + text[i + 2 - (n_ctx - stride) : i + 1])
                        else:
                            logits = eng.forward([text[i]])
                        nll[i] = nll_of(logits, text[i + 1])
            rows.append({
                "method": method, "k": k_type, "n_ctx": n_ctx,
                "stride": stride if method == "recompute" else None,
                "perplexity": math.exp(nll.mean()),
                "perplexity_past_ctx": math.exp(nll[n_ctx:].mean()),
                "seconds": time.perf_counter() - t,
            })  # fmt: skip
            print(f"  past the context: {method} {k_type} done", file=sys.stderr)
    return {"n_ctx": n_ctx, "tokens": len(text), "rows": rows}


# --- the report -----------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{100 * x:.3g} %"


def accuracy_tables(a: dict[str, Any]) -> list[str]:
    lines = []
    for what, title in (
        ("key_rel_rms", "relative RMS error of layer 0's keys, ||k - exact|| / ||exact||"),
        ("score_rel_rms", "relative RMS error of layer 0's causal scores q.k"),
        ("score_abs_rms", "RMS error of layer 0's causal scores q.k (attention logits)"),
    ):
        names = [bucket_name(lo, hi) for lo, hi in BUCKETS]
        seen = [b for b in names if any(b in r[f"cached_{what}"] for r in a["rows"])]
        lines += [f"{title}, by the times a key was moved:", "",
                  "| policy | K | keys | " + " | ".join(f"{b} moves" for b in seen) + " |",
                  "|---|---|---|" + "---|" * len(seen)]  # fmt: skip
        for r in a["rows"]:
            for name, label in (("cached", "cached"), ("pre_rope", "pre-RoPE (emulated)")):
                d = r[f"{name}_{what}"]
                fmt = (lambda x: f"{x:.3g}") if what == "score_abs_rms" else _pct
                cells = [fmt(d[b]) if b in d else "" for b in seen]
                lines.append(f"| {r['policy']} | {r['k']} | {label} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [
        "keys held at the end, by the times moved:",
        "",
        "| policy | evictions | " + " | ".join(seen) + " |",
        "|---|---|" + "---|" * len(seen),
    ]
    for r in a["rows"]:
        if r["k"] == K_TYPES[0]:
            cells = [f"{r['keys_by_moves'].get(b, 0):.0f}" for b in seen]
            lines.append(f"| {r['policy']} | {r['evictions']} | " + " | ".join(cells) + " |")
    return lines + [""]


def speed_table(s: dict[str, Any]) -> list[str]:
    lines = ["| K | n_ctx | dropped per eviction | eviction ms | eviction ms / token | "
             "decode ms / token (at context) | pre-RoPE rope pass ms / token | "
             "pre-RoPE K decode ms / token |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in s["rows"]:
        dec = r["pre_rope_decode_s_per_token"]
        lines.append(
            f"| {r['k']} | {r['n_ctx']} | {r['dropped']} | {1e3 * r['eviction_median_s']:.2f} | "
            f"{1e3 * r['eviction_per_token_s']:.4f} | {1e3 * r['decode_s_per_token']:.2f} "
            f"({r['decode_context']}) | {1e3 * r['pre_rope_rope_s_per_token']:.3f} | "
            f"{'—' if dec is None else f'{1e3 * dec:.3f}'} |"
        )
    return lines


def past_table(p: dict[str, Any]) -> list[str]:
    lines = [f"Perplexity, {p['tokens']} tokens through n_ctx {p['n_ctx']} (V f16):", "",
             "| method | K | perplexity | ppl past n_ctx | s |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in p["rows"]:
        lines.append(f"| {r['method']} | {r['k']} | {r['perplexity']:.4f} | "
                     f"{r['perplexity_past_ctx']:.4f} | {r['seconds']:.0f} |")  # fmt: skip
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=None, help="default: packaged Gemma 3 270M")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--acc-ctx", type=int, default=256, help="context of the accuracy part")
    ap.add_argument("--acc-tokens", type=int, default=2048, help="tokens streamed through it")
    ap.add_argument("--chunk", type=int, default=8, help="tokens evaluated at a time")
    ap.add_argument("--speed-ctx", type=int, default=4096)
    ap.add_argument("--evictions", type=int, default=4, help="evictions timed per K type")
    ap.add_argument("--decode-steps", type=int, default=16, help="decode steps timed per one")
    ap.add_argument("--kernel-reps", type=int, default=20)
    ap.add_argument("--past-ctx", type=int, default=256)
    ap.add_argument("--stride", type=int, default=64, help="windowed recomputation's stride")
    ap.add_argument("--only", nargs="+", choices=["accuracy", "speed", "past"])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="a smoke run of every part, small")
    args = ap.parse_args()
    if args.quick:
        args.acc_ctx, args.acc_tokens, args.speed_ctx, args.evictions = 128, 320, 1024, 2
        args.decode_steps, args.kernel_reps, args.past_ctx, args.stride = 4, 3, 64, 16
    path, tokens, bos = model_and_text(args.model)
    assert bos is not None, "the text is scored after a BOS token"
    parts = args.only or ["accuracy", "speed", "past"]
    report: dict[str, Any] = {"machine": machine(path, args.threads), "command": sys.argv}
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "accuracy": lambda: accuracy(path, tokens, args),
        "speed": lambda: speed(path, tokens, args),
        "past": lambda: past_context(path, tokens, bos, args),
    }
    for part in parts:
        t, load = time.perf_counter(), os.getloadavg()[0]
        report[part] = runs[part]()
        report[f"{part}_s"] = time.perf_counter() - t
        report[f"{part}_load"] = [load, os.getloadavg()[0]]  # other work on the machine
        print(f"{part}: {report[f'{part}_s']:.0f} s", file=sys.stderr)
        if args.json is not None:  # after each part, so that a cut run keeps what it did
            args.json.write_text(json.dumps(report, indent=1))
    m = report["machine"]
    lines = [f"Machine: {m['cpu']} ({m['cpus']} CPUs), {args.threads} threads, {m['date']}; "
             f"edgeinfer kernels {m['edgeinfer_isa']}; {m['model']}", ""]  # fmt: skip
    tables = {"accuracy": accuracy_tables, "speed": speed_table, "past": past_table}
    for part in parts:
        loads = ", ".join(f"{x:.1f}" for x in report[f"{part}_load"])
        lines += [f"### {part}", "", f"({report[f'{part}_s']:.0f} s, load average {loads})", ""]
        lines += tables[part](report[part]) + [""]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
