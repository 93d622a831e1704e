"""Load on `edgeinfer serve` against llama-cpp-python's own server, same file, same threads.

    python benchmarks/serve_load.py MODEL.gguf [-t 2] [-N 1 2 4 8 16] [-n 128]
                                    [--servers edgeinfer llama] [--json OUT]

For each server and each N, N streaming clients send one request each from a fixed prompt
set (prompts of 16 to about 400 tokens cut from text Python ships, 128 generated tokens,
greedy), first all at once (burst), then at Poisson arrival times whose rate keeps the server
about 70 % busy (70 % of the request rate the burst achieved). Reported per run: aggregate
generated tok/s, time to first token P50/P90/P99, inter-token latency P50/P99, end-to-end
P50/P99, failures, and the load generator's CPU time (one thread: asyncio and httpx).

The compute ceiling of batched decoding is measured first, in process: edgeinfer's rate for a
512-token batch that computes logits at every position (pp512 is not it: it computes one
position's logits, and a large vocabulary's output head costs more than the layers).

llama-cpp-python's server runs one request at a time; it is started with
``--interrupt_requests False`` so that a new request waits instead of cutting a running one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

START_TIMEOUT_S = 300


def prompt_set(model, n: int, seed: int = 0) -> list[str]:
    """``n`` prompts of 16 to 384 tokens of ``model`` (an edgeinfer Model, for its
    tokenizer), cut from the docstrings of modules Python ships."""
    import argparse as a
    import collections as c
    import email as e
    import json as j
    import logging as lg
    import subprocess as sp
    import threading as th
    import unittest as ut

    text = " ".join(" ".join((m.__doc__ or "").split()) for m in (a, c, e, j, lg, sp, th, ut))
    ids = model.tokenize(text, add_special=False)
    rng = random.Random(seed)
    lengths = [16, 48, 128, 384]  # tokens
    out = []
    for i in range(n):
        k = lengths[i % len(lengths)]
        start = rng.randrange(0, len(ids) - k)
        out.append(model.detokenize(ids[start : start + k]))
    return out


def ceiling(m) -> float:
    """edgeinfer's tok/s for a 512-token batch with logits at every position."""
    import numpy as np

    from edgeinfer.engines.base import Batch

    tokens = np.random.default_rng(0).integers(0, m.n_vocab, 512)
    best = float("inf")
    for _ in range(3):
        m.backend.seq_clear(0)
        t0 = time.perf_counter()
        m.backend.decode(Batch.sequence(tokens, 0, 0, all_logits=True))
        best = min(best, time.perf_counter() - t0)
    return 512 / best


class ServerProcess:
    def __init__(self, kind: str, model: str, threads: int, parallel: int, n_ctx: int) -> None:
        self.kind = kind
        if kind == "edgeinfer":
            exe = str(Path(sys.executable).with_name("edgeinfer"))  # the console script
            cmd = [
                exe,
                "serve",
                model,
                "--port",
                "0",
                "-t",
                str(threads),
                "--parallel",
                str(parallel),
                "-c",
                str(n_ctx),
            ]
            self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
            line = self.proc.stderr.readline()
            m = re.search(r"(http://\S+)$", line.strip())
            if not m:
                raise SystemExit(f"edgeinfer serve did not start: {line}")
            self.url = m.group(1)
        else:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            cmd = [
                sys.executable,
                "-m",
                "llama_cpp.server",
                "--model",
                model,
                "--port",
                str(port),
                "--n_threads",
                str(threads),
                "--n_threads_batch",
                str(threads),
                "--n_ctx",
                str(n_ctx * parallel),
                "--interrupt_requests",
                "False",
            ]
            self.proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            self.url = f"http://127.0.0.1:{port}"
        import httpx

        deadline = time.monotonic() + START_TIMEOUT_S
        ready = "/health" if kind == "edgeinfer" else "/v1/models"  # the other has no /health
        while True:
            try:
                if httpx.get(self.url + ready, timeout=2).status_code == 200:
                    r = httpx.get(self.url + "/v1/models", timeout=2)
                    self.model_id = r.json()["data"][0]["id"]
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"{kind} server did not come up")
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def one_request(
    client, url: str, model_id: str, prompt: str, n_gen: int, delay: float
) -> dict:
    await asyncio.sleep(delay)
    body = {
        "model": model_id,
        "prompt": prompt,
        "max_tokens": n_gen,
        "temperature": 0,
        "stream": True,
    }
    t0 = time.perf_counter()
    times: list[float] = []
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return {"ok": False, "status": r.status_code, "body": (await r.aread())[:300]}
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    if chunk.get("choices") and chunk["choices"][0].get("finish_reason") is None:
                        times.append(time.perf_counter())
    except Exception as e:
        return {"ok": False, "error": repr(e)}
    end = time.perf_counter()
    if not times:
        return {"ok": False, "error": "no tokens"}
    return {
        "ok": True,
        "ttft": times[0] - t0,
        "itl": [b - a for a, b in zip(times, times[1:], strict=False)],
        "e2e": end - t0,
        "tokens": len(times),
        "start": t0,
        "end": end,
    }


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


async def run_load(
    url: str, model_id: str, prompts: list[str], n_gen: int, delays: list[float]
) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=len(prompts) + 4)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        cpu0, t0 = time.process_time(), time.perf_counter()
        results = await asyncio.gather(
            *(
                one_request(client, url, model_id, p, n_gen, d)
                for p, d in zip(prompts, delays, strict=True)
            )
        )
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    ok = [r for r in results if r["ok"]]
    for r in results:
        if not r["ok"]:
            print("failed:", r, file=sys.stderr)
    itl = [x for r in ok for x in r["itl"]]
    tokens = sum(r["tokens"] for r in ok)
    span = (max(r["end"] for r in ok) - min(r["start"] for r in ok)) if ok else float("nan")
    return {
        "requests": len(results),
        "failed": len(results) - len(ok),
        "tokens": tokens,
        "agg_tok_s": tokens / span if ok else 0.0,
        "wall_s": wall,
        "loadgen_cpu_s": cpu,
        "ttft_p50": pct([r["ttft"] for r in ok], 50),
        "ttft_p90": pct([r["ttft"] for r in ok], 90),
        "ttft_p99": pct([r["ttft"] for r in ok], 99),
        "itl_p50": pct(itl, 50),
        "itl_p99": pct(itl, 99),
        "e2e_p50": pct([r["e2e"] for r in ok], 50),
        "e2e_p99": pct([r["e2e"] for r in ok], 99),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-N", "--clients", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument(
        "--servers", nargs="+", default=["edgeinfer", "llama"], choices=["edgeinfer", "llama"]
    )
    ap.add_argument("--parallel", type=int, default=8, help="edgeinfer's --parallel")
    ap.add_argument("--json", default=None, help="write every figure to this file")
    args = ap.parse_args()
    n_ctx = 1024  # per sequence: the longest prompt and its tokens fit
    out: dict = {
        "model": os.path.basename(args.model),
        "threads": args.threads,
        "n_gen": args.n_gen,
        "runs": [],
    }
    import edgeinfer

    with edgeinfer.load(args.model, n_threads=args.threads, n_ctx=1024) as m:
        out["ceiling_tok_s"] = ceiling(m)
        prompts_of = {n: prompt_set(m, n, seed=n) for n in [*args.clients, 99]}
    print(f"ceiling (512 tokens, logits at every position): {out['ceiling_tok_s']:.1f} tok/s")
    for kind in args.servers:
        server = ServerProcess(kind, args.model, args.threads, args.parallel, n_ctx)
        try:
            warm = prompts_of[99][:2]
            asyncio.run(
                run_load(server.url, server.model_id, warm, 8, [0.0, 0.0])
            )  # interleaved copies
            for n in args.clients:
                prompts = prompts_of[n]
                burst = asyncio.run(
                    run_load(server.url, server.model_id, prompts, args.n_gen, [0.0] * n)
                )
                rate = 0.7 * n / burst["wall_s"]  # requests per second at 70 % busy
                rng = random.Random(n)
                arrivals, t = [], 0.0
                for _ in range(n):
                    arrivals.append(t)
                    t += rng.expovariate(rate)
                poisson = asyncio.run(
                    run_load(server.url, server.model_id, prompts, args.n_gen, arrivals)
                )
                for mode, r in (("burst", burst), ("poisson", poisson)):
                    r.update(server=kind, clients=n, mode=mode)
                    out["runs"].append(r)
                    print(
                        f"{kind:9s} N={n:2d} {mode:7s} {r['agg_tok_s']:7.1f} tok/s  "
                        f"ttft p50/p90/p99 {r['ttft_p50']:.2f}/{r['ttft_p90']:.2f}/"
                        f"{r['ttft_p99']:.2f} s  itl p50/p99 {1e3 * r['itl_p50']:.0f}/"
                        f"{1e3 * r['itl_p99']:.0f} ms  e2e p50/p99 {r['e2e_p50']:.1f}/"
                        f"{r['e2e_p99']:.1f} s  failed {r['failed']}  loadgen cpu "
                        f"{r['loadgen_cpu_s']:.2f} s of {r['wall_s']:.1f}",
                        flush=True,
                    )
        finally:
            server.stop()
    _summary(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


def _summary(out: dict) -> None:
    runs = {(r["server"], r["clients"], r["mode"]): r for r in out["runs"]}
    for mode in ("burst", "poisson"):
        ours, theirs = runs.get(("edgeinfer", 8, mode)), runs.get(("llama", 8, mode))
        if ours:
            line = (
                f"N=8 {mode}: edgeinfer {ours['agg_tok_s']:.1f} tok/s = "
                f"{ours['agg_tok_s'] / out['ceiling_tok_s']:.0%} of the ceiling"
            )
            if theirs and theirs["agg_tok_s"]:
                line += f", {ours['agg_tok_s'] / theirs['agg_tok_s']:.2f}x llama-cpp-python"
            line += f"; itl p99/p50 {ours['itl_p99'] / ours['itl_p50']:.2f}"
            print(line)
    print("failed requests:", sum(r["failed"] for r in out["runs"]))


if __name__ == "__main__":
    sys.exit(main())
