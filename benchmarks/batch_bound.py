"""What batched generation can reach on this machine, in process (no HTTP): the bound behind
serve_load's "share of the all-logits ceiling".

    python benchmarks/batch_bound.py MODEL.gguf [-t 2] [--clients 8] [-n 128]

It measures, on edgeinfer's engine with ``-t`` threads:
- the all-logits ceiling (a 512-token batch with logits at every position: serve_load's);
- pp512 (a 512-token prompt batch, logits at its last position only);
- one decoding step of ``--clients`` sequences at contexts of 150 (its best of 20);
- the burst serve_load sends (the same prompts, ``-n`` greedy tokens each), through the
  batcher in process.

A workload of P prompt tokens and G generated ones cannot finish faster than an engine that
runs every prompt token at the pp512 rate and every generated one at the ceiling, so its
aggregate generation is at most G / (P / pp512 + G / ceiling): the workload bound. The burst's
aggregate is reported against the ceiling and against that bound.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    args = ap.parse_args()

    import numpy as np

    import edgeinfer
    from edgeinfer.engines.base import Batch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from serve_load import ceiling, prompt_set

    n = args.clients
    with edgeinfer.load(args.model, n_threads=args.threads, n_parallel=n, n_ctx=1024) as m:
        engine = m.backend
        ceil = ceiling(m)
        tokens = np.random.default_rng(0).integers(0, m.n_vocab, 512)
        pp = 0.0
        for _ in range(3):
            engine.seq_clear(0)
            t0 = time.perf_counter()
            engine.decode(Batch.sequence(tokens, 0, 0))
            pp = max(pp, 512 / (time.perf_counter() - t0))
        engine.seq_clear(0)
        for s in range(1, n + 1):
            engine.decode(Batch.sequence(tokens[:150], 0, s))
        step = float("inf")
        for k in range(20):
            batch = Batch(
                np.full(n, 7, np.int32), np.full(n, 150 + k, np.int32),
                np.arange(1, n + 1, dtype=np.int32), np.ones(n, bool),
            )  # fmt: skip
            t0 = time.perf_counter()
            engine.decode(batch)
            step = min(step, time.perf_counter() - t0)
        for s in range(1, n + 1):
            engine.seq_clear(s)
        prompts = prompt_set(m, n)
        n_prompt = sum(len(m.tokenize(p)) for p in prompts)
        for r in [m.submit(p, max_tokens=4, temperature=0) for p in prompt_set(m, 2, 99)]:
            r.result()  # warm: the weights' interleaved copies are made
        t0 = time.perf_counter()
        requests = [m.submit(p, max_tokens=args.n_gen, temperature=0) for p in prompts]
        for r in requests:
            r.result()
        wall = time.perf_counter() - t0
    n_gen = sum(len(r.tokens) for r in requests)
    agg = n_gen / wall
    bound = n_gen / (n_prompt / pp + n_gen / ceil)
    print(f"{Path(args.model).name}, {args.threads} threads")
    print(f"all-logits ceiling      {ceil:8.1f} tok/s")
    print(f"pp512                   {pp:8.1f} tok/s")
    print(f"decoding step of {n:<2}     {step * 1e3:8.2f} ms: {n / step:.1f} tok/s, "
          f"{n / step / ceil:.0%} of the ceiling")  # fmt: skip
    print(f"burst of {n}: {n_prompt} prompt tokens, {n_gen} generated, {agg:.1f} tok/s: "
          f"{agg / ceil:.0%} of the ceiling")  # fmt: skip
    print(f"workload bound          {bound:8.1f} tok/s: {bound / ceil:.0%} of the ceiling; "
          f"the burst reached {agg / bound:.0%} of it")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
