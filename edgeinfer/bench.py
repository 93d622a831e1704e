"""Throughput measurements in llama-bench's terms: pp (prompt tokens per second, one batch),
tg (generated tokens per second, one token per step from an empty context), plus load time,
time to first token and peak resident memory."""

from __future__ import annotations

import resource
import statistics
import sys
import time
from typing import Any

import numpy as np

from edgeinfer import errors


def peak_rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (
        rss / (1 << 20) if sys.platform == "darwin" else rss / 1024
    )  # bytes on macOS, KiB elsewhere


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
        eng.truncate(0)
        eng.forward(
            prompt[: min(16, n_prompt)]
        )  # warm-up: page in the weights, spin up the threads
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
            "n_prompt": n_prompt,
            "n_gen": n_gen,
            "repetitions": repetitions,
            "pp_tok_s": statistics.mean(pp),
            "pp_tok_s_sd": statistics.pstdev(pp),
            "tg_tok_s": statistics.mean(tg),
            "tg_tok_s_sd": statistics.pstdev(tg),
            "ttft_s": statistics.mean(ttft),
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
        }
    finally:
        model.close()
