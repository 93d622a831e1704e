"""Throughput measurements in llama-bench's terms: pp (prompt tokens per second, one batch),
tg (generated tokens per second, one token per step from an empty context), plus load time,
time to first token and peak resident memory; and :func:`profile`, where that time goes."""

from __future__ import annotations

import dataclasses
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from edgeinfer import errors
from edgeinfer.engines.base import Engine, EngineProfile, OpTime, no_profile
from edgeinfer.gguf.constants import GGMLType
from edgeinfer.gpu_offload import OffloadPlan


def peak_rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (
        rss / (1 << 20) if sys.platform == "darwin" else rss / 1024
    )  # bytes on macOS, KiB elsewhere


def _gpu_plan(plan: OffloadPlan | None) -> dict[str, Any] | None:
    """The offload plan as JSON: every field, and the total."""
    return None if plan is None else {**dataclasses.asdict(plan), "total_bytes": plan.total_bytes}


def run(
    path: str,
    *,
    n_prompt: int = 512,
    n_gen: int = 128,
    n_threads: int | None = None,
    repetitions: int = 3,
    engine: str = "auto",
    isa: str | None = None,
    seed: int = 0,
    n_ctx: int | None = None,
    **cache: Any,
) -> dict[str, Any]:
    """Loads ``path`` and measures it; returns one dict of figures (means over repetitions).
    ``cache`` holds load()'s cache options (types, swa_full, context_policy, n_keep, n_sink);
    with ``n_ctx`` below the prompt and generated tokens, the policy makes room during tg."""
    import edgeinfer
    from edgeinfer.context_policy import ContextPolicy, make_room
    from edgeinfer.kv_cache import cache_summary

    if n_prompt < 1 or n_gen < 1 or repetitions < 1:
        raise errors.InvalidOptionError("prompt, generation and repetition counts must be >= 1")
    n_ctx = n_ctx or n_prompt + n_gen
    if n_prompt > n_ctx:
        raise errors.InvalidOptionError(f"the prompt of {n_prompt} tokens exceeds -c {n_ctx}")
    policy = ContextPolicy(
        cache.get("context_policy", "error"), cache.get("n_keep", 0), cache.get("n_sink", 4)
    )
    if not policy.evicts and n_prompt + n_gen > n_ctx:
        raise errors.InvalidOptionError(
            f"{n_prompt} + {n_gen} tokens exceed -c {n_ctx}: choose a context policy"
        )
    t0 = time.perf_counter()
    n_batch = min(512, n_prompt)
    model = edgeinfer.load(path, n_threads=n_threads, n_ctx=n_ctx, n_batch=n_batch,
                           engine=engine, isa=isa, **cache)  # fmt: skip
    load_s = time.perf_counter() - t0
    try:
        rng = np.random.default_rng(seed)
        # ids away from the specials at the start of every vocabulary
        prompt = rng.integers(min(1000, model.n_vocab // 2), model.n_vocab, size=n_prompt).tolist()
        eng = model.backend  # only the engine protocol (edgeinfer.engines.Engine) from here
        # cold: the first prompt after loading pages in the weights and makes the interleaved
        # copies; it is also the warm-up of the timed (warm) repetitions, as in llama-bench
        eng.truncate(0)
        t = time.perf_counter()
        int(np.argmax(eng.forward(prompt)))
        ttft_cold = time.perf_counter() - t
        pp, tg, ttft = [], [], []
        for _ in range(repetitions):
            eng.truncate(0)
            t = time.perf_counter()
            logits = eng.forward(prompt)
            first = int(np.argmax(logits))
            dt = time.perf_counter() - t
            pp.append(n_prompt / dt)
            ttft.append(dt)
            eng.truncate(0)
            token = first
            dropped = 0
            t = time.perf_counter()
            for _ in range(n_gen):
                dropped += sum(n for _, n in make_room(eng, policy, 1))
                token = int(np.argmax(eng.forward([token])))
            tg.append(n_gen / (time.perf_counter() - t))
        return {
            "model": path,
            "engine": model.engine,
            "isa": eng.isa,
            "threads": model.n_threads,
            "decode_threads": eng.threads(1),  # where the engine runs decoding on fewer now
            "n_prompt": n_prompt,
            "n_gen": n_gen,
            "repetitions": repetitions,
            "pp_tok_s": statistics.mean(pp),
            "pp_tok_s_sd": statistics.pstdev(pp),
            "tg_tok_s": statistics.mean(tg),
            "tg_tok_s_sd": statistics.pstdev(tg),
            "ttft_s": statistics.mean(ttft),
            "ttft_cold_s": ttft_cold,
            "load_s": load_s,
            "peak_rss_mb": peak_rss_mb(),
            "engine_memory_mb": eng.memory_bytes / (1 << 20),
            "weight_copies_mb": eng.weight_copy_bytes / (1 << 20),
            "kv_cache": None
            if eng.cache_type_k is None
            else cache_summary(
                model.config,
                n_ctx,
                eng.cache_type_k,
                eng.cache_type_v,
                n_batch,
                eng.ring_slack is not None,
                *(getattr(eng, "kivi", None) or ()),
            ),
            "policy": policy.name,
            "dropped_tokens": dropped,
            "gpu": _gpu_plan(eng.gpu_plan),
        }
    finally:
        model.close()


# --- the per-op profile ----------------------------------------------------------------------

# how a profile's kinds (edgeinfer.engines.base.PROFILE_KINDS) read in a report
OP_LABELS = {
    "cache_blocks": "KV cache blocks", "threads": "threads woken + joined",
    "embed": "embedding lookup", "rope_tables": "rope tables", "norm": "norms + residual adds",
    "act_quant": "activation quantization", "repack": "weight repacking", "matmul": "matmul",
    "qkv_post": "q/k norm + RoPE + KV store", "kivi_quant": "KIVI quantization",
    "attention": "attention", "output_rows": "output rows gathered", "glu": "GLU activation",
    "softcap": "logit softcap", "gpu": "offloaded layers + output (GPU)",
}  # fmt: skip
PYTHON_OP = "python side"  # the engine call's time outside the engine
SAMPLING_OP = "sampling (argmax)"


@dataclass
class _Clock:
    """Wall time of the measured steps: the engine call, the sampling after it, and both."""

    steps: int = 0
    forward_s: float = 0.0
    sampling_s: float = 0.0
    step_s: float = 0.0


def _timed_step(step: Callable[[], np.ndarray], clock: _Clock) -> int:
    """Runs one step and samples its logits (argmax), each timed; returns the token."""
    t0 = time.perf_counter()
    logits = step()
    t1 = time.perf_counter()
    token = int(np.argmax(logits))
    t2 = time.perf_counter()
    clock.steps += 1
    clock.forward_s += t1 - t0
    clock.sampling_s += t2 - t1
    clock.step_s += t2 - t0
    return token


def op_label(op: OpTime) -> str:
    """``matmul Q4_K 640x2048`` (the weight's type, then columns x rows: inputs x outputs),
    or the kind's label."""
    label = OP_LABELS.get(op.kind, op.kind)
    if op.weight_type is None:
        return label
    try:
        name = GGMLType(op.weight_type).name
    except ValueError:  # a type the engine runs that this table does not name
        name = f"type {op.weight_type}"
    return f"{label} {name} {op.cols}x{op.rows}"


def _row(op: str, calls: float, ns: float, step_ns: float, flops: int = 0, nbytes: int = 0,
         steps: int = 1) -> dict[str, Any]:  # fmt: skip
    """A report row: per step, its share of the step, and GFLOP/s and GB/s where counted."""
    return {
        "op": op, "calls": calls / steps, "ms": ns / steps / 1e6,
        "share": ns / step_ns if step_ns else 0.0,
        "gflops": flops / ns if flops and ns else None,
        "gbps": nbytes / ns if nbytes and ns else None,
    }  # fmt: skip


def _report(prof: EngineProfile, clock: _Clock, tokens: int) -> dict[str, Any]:
    """One phase's table (per step, largest first) with the times it was checked against."""
    steps = max(clock.steps, 1)
    step_ns = clock.step_s * 1e9
    python_ns = max(clock.forward_s * 1e9 - prof.ns, 0.0)
    rows = [
        _row(op_label(op), op.calls, op.ns, step_ns, op.flops, op.bytes, steps) for op in prof.ops
    ]
    rows.append(_row(PYTHON_OP, clock.steps, python_ns, step_ns, steps=steps))
    rows.append(_row(SAMPLING_OP, clock.steps, clock.sampling_s * 1e9, step_ns, steps=steps))
    rows.sort(key=lambda r: -r["ms"])
    return {
        "tokens": tokens, "steps": clock.steps, "step_ms": step_ns / steps / 1e6,
        "engine_ms": prof.ns / steps / 1e6, "python_ms": python_ns / steps / 1e6,
        "sampling_ms": clock.sampling_s * 1e3 / steps, "parts_ms": sum(r["ms"] for r in rows),
        "ops": rows,
    }  # fmt: skip


def profile(
    path: str,
    *,
    n_prompt: int = 512,
    n_gen: int = 32,
    n_threads: int | None = None,
    repetitions: int = 1,
    engine: str = "auto",
    isa: str | None = None,
    seed: int = 0,
    **cache: Any,
) -> dict[str, Any]:
    """Where the time of a prompt step (``n_prompt`` tokens at once) and of decoding (``n_gen``
    steps of one token from an empty context) goes: per op, ms per step, its share, GFLOP/s
    and GB/s, from the engine's own per-op profile (edgeinfer.engines.base.EngineProfile),
    the Python side of each step (its wall time less the engine's) and the sampling. Each
    phase also reports its measured step time, against which its parts can be checked.
    ``cache`` holds load()'s cache options. After a warm-up (so weight repacking, done on
    first use, is not in it); the prompt step is run ``repetitions`` times."""
    import edgeinfer

    if n_prompt < 1 or n_gen < 1 or repetitions < 1:
        raise errors.InvalidOptionError("prompt, generation and repetition counts must be >= 1")
    model = edgeinfer.load(path, n_threads=n_threads, n_ctx=n_prompt + n_gen,
                           n_batch=min(512, n_prompt), engine=engine, isa=isa, **cache)  # fmt: skip
    try:
        eng = model.backend
        if not eng.can_profile:
            raise no_profile(eng.name)
        rng = np.random.default_rng(seed)
        prompt = rng.integers(min(1000, model.n_vocab // 2), model.n_vocab, size=n_prompt).tolist()
        eng.truncate(0)
        eng.forward(prompt[: min(16, n_prompt)])  # warm-up: weights paged in and repacked
        try:
            return {
                "model": path, "engine": model.engine, "isa": eng.isa, "threads": model.n_threads,
                "n_prompt": n_prompt, "n_gen": n_gen, "repetitions": repetitions,
                "prompt": _profile_prompt(eng, prompt, repetitions),
                "decode": _profile_decode(eng, prompt[0], n_gen),
            }  # fmt: skip
        finally:
            eng.set_profiling(False)
    finally:
        model.close()


def _profile_prompt(eng: Engine, prompt: list[int], repetitions: int) -> dict[str, Any]:
    clock = _Clock()
    eng.set_profiling(True)
    for _ in range(repetitions):
        eng.truncate(0)
        _timed_step(partial(eng.forward, prompt), clock)
    return _report(eng.profile(), clock, len(prompt))


def _profile_decode(eng: Engine, first: int, n_gen: int) -> dict[str, Any]:
    clock = _Clock()
    eng.truncate(0)
    eng.set_profiling(True)
    token = first
    for _ in range(n_gen):
        token = _timed_step(partial(eng.forward, [token]), clock)
    return _report(eng.profile(), clock, 1)
