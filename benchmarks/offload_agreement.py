"""How closely layer offload (n_gpu_layers, Vulkan) agrees with the CPU engine on the same file:
the mean and largest KL divergence of the next-token distributions over a prompt's positions,
the share of positions whose top token agrees, and the time of each engine.

    python benchmarks/offload_agreement.py MODEL.gguf [MODEL.gguf ...] [--ngl 1 2 all]
                                           [--cache f16] [--tokens 32] [--json]

The prompt is a fixed English text (the same for every run), cut to --tokens tokens. Both
engines take the whole prompt in one step and return every position's logits. Run it from
outside the checkout; the README's Vulkan section quotes its figures, naming the device.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg combined movable metal type, oil-based ink and a wooden screw press. Within "
    "fifty years presses were at work in more than two hundred cities across Europe, and the "
    "price of books fell so far that reading spread from monasteries to merchants and crafts."
)


def kl_rows(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    """KL(p || q) of each row, in float64."""

    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64) - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    a, b = log_softmax(p_logits), log_softmax(q_logits)
    return (np.exp(a) * (a - b)).sum(-1)


def logits(path: str, n_gpu_layers: int | str, tokens: list[int], cache: str):
    import edgeinfer
    from edgeinfer.engines.base import Batch

    with edgeinfer.load(
        path, n_ctx=max(64, len(tokens)), n_gpu_layers=n_gpu_layers, kv_type=cache
    ) as m:
        t = time.perf_counter()
        out = np.asarray(m.backend.decode(Batch.sequence(tokens, 0, all_logits=True)))
        plan = m.gpu_plan
        return out, time.perf_counter() - t, plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--ngl", nargs="+", default=["1", "2", "all"])
    ap.add_argument("--cache", default="f16", help="the KV cache type of both engines")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import edgeinfer

    rows = []
    for path in args.models:
        with edgeinfer.load(path, n_ctx=64) as m:
            text = TEXT * (1 + args.tokens // max(1, len(m.tokenize(TEXT))))
            tokens = m.tokenize(text)[: args.tokens]
        cpu, cpu_s, _ = logits(path, 0, tokens, args.cache)
        for asked in args.ngl:
            ngl = asked if asked in ("all", "auto") else int(asked)
            gpu, gpu_s, plan = logits(path, ngl, tokens, args.cache)
            kl = kl_rows(cpu, gpu)
            row = {
                "model": os.path.basename(path),
                "n_gpu_layers": plan.n_gpu_layers if plan else 0,
                "n_layer": plan.n_layer if plan else None,
                "device": plan.device_name if plan else "",
                "cache": args.cache,
                "tokens": len(tokens),
                "kl_mean": float(kl.mean()),
                "kl_max": float(kl.max()),
                "top1": float((cpu.argmax(-1) == gpu.argmax(-1)).mean()),
                "cpu_s": cpu_s,
                "gpu_s": gpu_s,
            }
            rows.append(row)
            if not args.json:
                print(
                    f"{row['model']:<28} ngl {row['n_gpu_layers']:>3} of {row['n_layer'] + 1}: "
                    f"KL mean {row['kl_mean']:.2e} max {row['kl_max']:.2e}, top-1 "
                    f"{100 * row['top1']:.1f} %, {row['tokens']} tokens; CPU {cpu_s:.2f} s, "
                    f"GPU {gpu_s:.2f} s ({row['device']})",
                    flush=True,
                )
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
