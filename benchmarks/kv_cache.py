"""KV cache types and context policies, edgeinfer side by side with llama.cpp in one run.

    python benchmarks/kv_cache.py [MODEL.gguf] [-t 2] [--windows 8] [--json OUT] [--quick]

MODEL defaults to the packaged Gemma 3 270M Q4_K_M. Four measurements, each engine's
configurations interleaved (ours, then llama.cpp with the same types, ...) so that the load of a
shared machine falls on both alike:

a. quality: perplexity at -c 2048 over pydoc's help topics (llama-perplexity's method: windows of
   n_ctx from an empty cache, BOS first, the second half scored), and each K/V pair's mean KL
   and top-1 agreement against the same engine's f16/f16 run on the same windows; also
   llama.cpp f16 against ours f16. Streamed window by window: one window's reference
   log-probabilities are held per engine, nothing more.
b. memory: the cache at 4k and 32k context, with and without the sliding-window rings, ours
   as the native engine's block pool holds it (every block of every group: what one sequence
   of n_ctx can use, allocated in slabs as the context fills) and as kv_cache.cache_bytes
   computes it, llama.cpp's as it logs its KV buffers at context creation.
c. decode speed: a prompt of 4000 tokens evaluated first, then the text's next tokens fed one
   at a time (the same tokens for every configuration), timed.
d. going past the context (ours): a text of 8 windows fed one token at a time as generation
   sees it, each next token scored, under context_policy shift, streaming and h2o, against windowed
   recomputation (the StreamingLLM paper's baseline: the last n_ctx - stride tokens evaluated
   afresh every stride tokens) and dense attention over the whole text.

llama.cpp runs with flash attention on (it needs it for a quantized V). Prints markdown tables,
and with --json writes every figure there.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import math
import os
import platform
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# a KIVI type's name may carry its group: kivi4@64 (the default R = 128 throughout)
PAIRS = [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "q4_0"),
         ("kivi4", "kivi4"), ("kivi4@64", "kivi4@64"), ("kivi2", "kivi2")]  # fmt: skip
LLAMA_PAIRS = [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0")]
N_BATCH = 512
ROWS = 32  # logits rows turned into log-probabilities at a time (32 MiB with Gemma's vocabulary)
TARGETS = {"q8_0/q8_0": "<= +0.5 % perplexity",
           "kivi4/kivi4": "KL <= 1/2 llama.cpp q4_0/q4_0",
           "kivi4@64/kivi4@64": "KL < llama.cpp q4_0/q4_0"}  # fmt: skip


def pair_name(pair: tuple[str, str]) -> str:
    return f"{pair[0]}/{pair[1]}"


def cache_options(pair: tuple[str, str]) -> dict:
    """load()'s cache options for a pair (kivi4@64: kivi4 with kivi_group 64)."""
    (k, _, gk), (v, _, _) = (name.partition("@") for name in pair)
    out: dict = {"cache_type_k": k, "cache_type_v": v}
    if gk:
        out["kivi_group"] = int(gk)
    return out


# --- the two engines behind one interface --------------------------------------------------


class Ours:
    """edgeinfer's native engine: tokens appended in chunks, logits of the last or of all."""

    engine = "edgeinfer"

    def __init__(self, path: Path, pair: tuple[str, str], n_ctx: int, threads: int,
                 ring: bool = True, **options) -> None:  # fmt: skip
        import edgeinfer

        self.model = edgeinfer.load(
            path, n_threads=threads, n_ctx=n_ctx, engine="native", n_batch=N_BATCH,
            swa_full=not ring, **cache_options(pair), **options,
        )  # fmt: skip
        self.backend = self.model.backend
        self.n_vocab = self.model.n_vocab

    def reset(self, n_keep: int = 0) -> None:
        self.backend.truncate(n_keep)

    def eval(self, tokens: list[int], all_logits: bool = False) -> np.ndarray:
        return self.backend.forward(tokens, all_logits=all_logits)

    def close(self) -> None:
        self.model.close()


class LlamaCpp:
    """llama.cpp through llama-cpp-python's context and batch, so that only the rows wanted
    get logits (its high-level eval() keeps n_ctx rows of them)."""

    engine = "llama.cpp"

    def __init__(self, path: Path, pair: tuple[str, str], n_ctx: int, threads: int,
                 ring: bool = True, verbose: bool = False) -> None:  # fmt: skip
        import llama_cpp

        self.llm = llama_cpp.Llama(
            model_path=str(path), n_ctx=n_ctx, n_batch=N_BATCH, n_ubatch=N_BATCH,
            n_threads=threads, n_threads_batch=threads, flash_attn=True,
            type_k=ggml_type(pair[0]), type_v=ggml_type(pair[1]), swa_full=not ring,
            logits_all=False, verbose=verbose,
        )  # fmt: skip
        self.n_vocab = self.llm.n_vocab()
        self.n_past = 0

    def reset(self, n_keep: int = 0) -> None:
        self.llm._ctx.kv_cache_seq_rm(0, n_keep, -1)
        self.n_past = n_keep

    def eval(self, tokens: list[int], all_logits: bool = False) -> np.ndarray:
        batch = self.llm._batch
        batch.set_batch(tokens, self.n_past, all_logits)
        self.llm._ctx.decode(batch)
        self.n_past += len(tokens)
        rows = len(tokens) if all_logits else 1
        logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(rows, self.n_vocab))
        return logits if all_logits else logits[0]

    def close(self) -> None:
        self.llm.close()


def ggml_type(name: str) -> int:
    """llama-cpp-python's id of a cache type (type_k / type_v take GGML type ids)."""
    import llama_cpp

    return int(getattr(llama_cpp, f"GGML_TYPE_{name.upper()}"))


def make(engine: str, path: Path, pair: tuple[str, str], n_ctx: int, threads: int, **kw):
    return (Ours if engine == "edgeinfer" else LlamaCpp)(path, pair, n_ctx, threads, **kw)


def eval_chunked(runner, tokens: list[int]) -> np.ndarray:
    logits = None
    for start in range(0, len(tokens), N_BATCH):
        logits = runner.eval(tokens[start : start + N_BATCH])
    assert logits is not None
    return logits


# --- a. perplexity, KL and top-1 -----------------------------------------------------------


def scored_rows(runner, window: list[int]):
    """(first row, logits) for the rows predicting the second half of ``window``: the first
    half is evaluated with its last row's logits only."""
    first, last = len(window) // 2 - 1, len(window) - 2  # rows wanted, inclusive
    runner.reset()
    for start in range(0, len(window), N_BATCH):
        chunk = window[start : start + N_BATCH]
        end = start + len(chunk) - 1
        if end < first:
            runner.eval(chunk)
        elif end == first:
            yield first, runner.eval(chunk)[None, :]
        else:
            logits = runner.eval(chunk, all_logits=True)
            lo, hi = max(start, first), min(end, last)
            yield lo, logits[lo - start : hi - start + 1]


class Reference:
    """One window of an f16/f16 run, as the other runs need it: each scored row's
    probabilities (float32), their sum, sum(p * logit) and log Z (float64), and the argmax.

    KL(p || q) = sum p (log p - log q) = (sum p x_p - psum log Z_p) - (sum p x_q - psum log Z_q)
    for logits x, so a compared run needs one pass of p * x_q per row: products in float32
    of logits less their row's maximum, summed in float64 (the terms cancel to ~1e-3)."""

    def __init__(self, n_rows: int, n_vocab: int) -> None:
        self.p = np.empty((n_rows, n_vocab), np.float32)  # (scored rows, n_vocab)
        self.psum, self.px, self.log_z = (np.empty(n_rows) for _ in range(3))
        self.top = np.empty(n_rows, np.int64)

    def store(self, i: int, x: np.ndarray, log_z: np.ndarray) -> None:
        p = self.p[i : i + len(x)]
        np.subtract(x, log_z.astype(np.float32)[:, None], out=p)
        np.exp(p, out=p)
        self.psum[i : i + len(x)] = p.sum(axis=1, dtype=np.float64)
        self.px[i : i + len(x)] = dot_rows(p, x)
        self.log_z[i : i + len(x)] = log_z
        self.top[i : i + len(x)] = x.argmax(axis=1)

    def kl(self, i: int, x: np.ndarray, log_z: np.ndarray) -> np.ndarray:
        """KL(this reference || rows x) for rows i.. of the window."""
        sl = slice(i, i + len(x))
        ref = self.px[sl] - self.psum[sl] * self.log_z[sl]
        return ref - (dot_rows(self.p[sl], x) - self.psum[sl] * log_z)


def dot_rows(p: np.ndarray, x: np.ndarray) -> np.ndarray:
    """sum(p * x) per row, accumulated in float64, x taken relative to its row's maximum."""
    top = x.max(axis=1)
    centred = x - top[:, None]
    centred *= p
    return centred.sum(axis=1, dtype=np.float64) + p.sum(axis=1, dtype=np.float64) * top


def log_z_rows(x: np.ndarray) -> np.ndarray:
    top = x.max(axis=1)
    e = np.exp(x - top[:, None])
    return np.log(e.sum(axis=1, dtype=np.float64)) + top


@dataclass
class Tally:
    nll: float = 0.0
    kl: list[np.ndarray] = field(default_factory=list)
    same_top: int = 0
    n: int = 0

    def figures(self, base: Tally | None = None) -> dict[str, float | None]:
        out: dict[str, float | None] = {"tokens": self.n}
        if self.nll:
            out["perplexity"] = math.exp(self.nll / self.n)
        if base is not None:
            out["ppl_change"] = math.exp((self.nll - base.nll) / self.n) - 1
        kl = np.concatenate(self.kl) if self.kl else None
        out["kl_mean"] = None if kl is None else float(kl.mean())
        out["kl_stderr"] = None if kl is None else float(kl.std() / math.sqrt(len(kl)))
        out["top1"] = None if kl is None else self.same_top / self.n
        return out


def score_window(
    runner,
    window: list[int],
    tally: Tally,
    ref: Reference | None,
    keep: Reference | None,
    cross: tuple[Reference, Tally] | None = None,
) -> None:
    """Adds ``window``'s scored tokens to ``tally``: their NLL, and with ``ref`` (the same
    engine's f16 run of this window) KL(ref || this) and top-1 agreement; with ``keep``,
    stores this run there as the reference; ``cross`` compares with another engine's too."""
    first = len(window) // 2 - 1
    for lo, logits in scored_rows(runner, window):
        for r in range(0, len(logits), ROWS):
            x = logits[r : r + ROWS]
            i = lo - first + r  # index among the scored rows
            log_z = log_z_rows(x)
            targets = np.asarray(window[lo + r + 1 : lo + r + 1 + len(x)])
            tally.nll += float(np.sum(log_z - x[np.arange(len(x)), targets]))
            tally.n += len(x)
            for against, into in ((ref, tally), cross or (None, None)):
                if against is not None and into is not None:
                    into.kl.append(against.kl(i, x, log_z))
                    into.same_top += int(np.sum(against.top[i : i + len(x)] == x.argmax(1)))
                    into.n += len(x) if into is not tally else 0
            if keep is not None:
                keep.store(i, x, log_z)


def windows_of(tokens: list[int], bos: int, n_ctx: int, n_windows: int) -> list[list[int]]:
    out = []
    for w in range(n_windows):
        window = list(tokens[w * n_ctx : (w + 1) * n_ctx])
        window[0] = bos
        out.append(window)
    return out


def quality_runs() -> list[tuple[str, tuple[str, str]]]:
    """llama.cpp f16 first (ours f16 is compared with it as it runs), then ours and theirs
    alternating, type by type."""
    runs = [("llama.cpp", LLAMA_PAIRS[0]), ("edgeinfer", PAIRS[0])]
    for pair in PAIRS[1:]:
        runs.append(("edgeinfer", pair))
        if pair in LLAMA_PAIRS:
            runs.append(("llama.cpp", pair))
    return runs


def bits_per_value(path: Path, pair: tuple[str, str], n_ctx: int) -> float:
    """What a full-attention layer of n_ctx positions costs per value (scales, zero points
    and a KIVI residual counted: edgeinfer.kv_cache.cache_summary)."""
    from edgeinfer.gguf import GGUFFile
    from edgeinfer.kv_cache import cache_summary
    from edgeinfer.models import config_from_gguf

    opts = cache_options(pair)
    with GGUFFile(path) as f:
        cfg = config_from_gguf(f)
    return cache_summary(cfg, n_ctx, opts["cache_type_k"], opts["cache_type_v"],
                         kivi_group=opts.get("kivi_group", 32))["bits_per_value"]  # fmt: skip


def quality(path: Path, tokens: list[int], bos: int, args) -> dict:
    n_ctx = args.ctx
    windows = windows_of(tokens, bos, n_ctx, args.windows)
    runs = quality_runs()
    runners = {run: make(run[0], path, run[1], n_ctx, args.threads) for run in runs}
    tallies = {run: Tally() for run in runs}
    cross = Tally()  # llama.cpp f16 as the reference, ours f16 compared
    n_vocab = runners[runs[0]].n_vocab
    refs = {e: Reference(n_ctx - n_ctx // 2, n_vocab) for e in ("llama.cpp", "edgeinfer")}
    t0 = time.perf_counter()
    for w, window in enumerate(windows):
        for engine, pair in runs:
            run = (engine, pair)
            if pair != ("f16", "f16"):
                score_window(runners[run], window, tallies[run], refs[engine], None)
                continue
            other = (refs["llama.cpp"], cross) if engine == "edgeinfer" else None
            score_window(runners[run], window, tallies[run], None, refs[engine], other)
        print(f"  quality: window {w + 1}/{len(windows)}, {time.perf_counter() - t0:.0f} s",
              file=sys.stderr)  # fmt: skip
    for runner in runners.values():
        runner.close()
    out: dict = {"n_ctx": n_ctx, "windows": len(windows), "runs": []}
    for engine, pair in runs:
        base = tallies[(engine, ("f16", "f16"))]
        out["runs"].append({"engine": engine, "pair": pair_name(pair),
                            "bits": bits_per_value(path, pair, n_ctx),
                            **tallies[(engine, pair)].figures(base)})  # fmt: skip
    out["cross_f16"] = cross.figures()
    return out


# --- b. memory ------------------------------------------------------------------------------

# "llama_kv_cache: size =   12.00 MiB (  4096 cells,   3 layers, ...": one line per cache (an
# interleaved-SWA model has two: global and sliding-window layers)
KV_LINE = re.compile(r"llama_kv_cache\S*: size\s*=\s*([0-9.]+)\s*MiB")


def memory(path: Path, contexts: list[int], threads: int) -> list[dict]:
    from edgeinfer.kv_cache import cache_bytes

    rows = []
    for n_ctx in contexts:
        for ring in (True, False):
            for engine, pairs in (("edgeinfer", PAIRS), ("llama.cpp", LLAMA_PAIRS)):
                for pair in pairs:
                    row = {"engine": engine, "pair": pair_name(pair), "n_ctx": n_ctx,
                           "ring": ring}  # fmt: skip
                    if engine == "edgeinfer":
                        ours = Ours(path, pair, n_ctx, threads, ring=ring)
                        groups = ours.backend.pool_stats()["groups"]
                        row["bytes"] = sum(g["blocks"] * g["block_bytes"] for g in groups)
                        cfg = ours.model.config
                        opts = cache_options(pair)
                        row["computed_bytes"] = cache_bytes(
                            n_layer=cfg.n_layer, n_head_kv=cfg.n_head_kv,
                            head_dim=cfg.head_dim, head_dim_v=cfg.head_dim_v, n_ctx=n_ctx,
                            k_type=opts["cache_type_k"], v_type=opts["cache_type_v"],
                            n_batch=N_BATCH, ring=ring, kivi_group=opts.get("kivi_group", 32),
                            windows=[cfg.layer_window(il) for il in range(cfg.n_layer)],
                        )  # fmt: skip
                        ours.close()
                    else:
                        log = io.StringIO()
                        with contextlib.redirect_stderr(log):
                            theirs = LlamaCpp(path, pair, n_ctx, threads, ring=ring,
                                              verbose=True)  # fmt: skip
                        theirs.close()
                        sizes = [float(m) for m in KV_LINE.findall(log.getvalue())]
                        row["bytes"] = int(sum(sizes) * (1 << 20)) if sizes else None
                        row["log"] = [ln for ln in log.getvalue().splitlines()
                                      if KV_LINE.search(ln)]  # fmt: skip
                    rows.append(row)
    return rows


# --- c. decode speed ------------------------------------------------------------------------


def decode_speed(path: Path, tokens: list[int], bos: int, args) -> list[dict]:
    """Every configuration holds the same prompt; then, round after round, each feeds the
    same next tokens one at a time from the end of the prompt (the best round is kept)."""
    prompt = [bos] + tokens[: args.decode_ctx - 1]
    fed = tokens[args.decode_ctx - 1 : args.decode_ctx - 1 + args.n_gen]
    n_ctx = args.decode_ctx + args.n_gen
    runs = [(e, p) for ours in PAIRS for e, p in (("edgeinfer", ours), ("llama.cpp", ours))
            if e == "edgeinfer" or p in LLAMA_PAIRS]  # fmt: skip
    rows = []
    for engine, pair in runs:
        runner = make(engine, path, pair, n_ctx, args.threads)
        t = time.perf_counter()
        eval_chunked(runner, prompt)
        rows.append({"engine": engine, "pair": pair_name(pair), "context": len(prompt),
                     "prompt_tok_s": len(prompt) / (time.perf_counter() - t),
                     "tg_tok_s_all": [], "runner": runner})  # fmt: skip
    for _ in range(args.decode_reps):
        for row in rows:
            runner = row["runner"]
            runner.reset(len(prompt))
            t = time.perf_counter()
            for token in fed:
                int(np.argmax(runner.eval([token])))
            row["tg_tok_s_all"].append(len(fed) / (time.perf_counter() - t))
    for row in rows:
        row.pop("runner").close()
        row["tg_tok_s"] = max(row["tg_tok_s_all"])
    return rows


# --- d. past the context --------------------------------------------------------------------


def nll_of(logits: np.ndarray, target: int) -> float:
    x = logits.astype(np.float64)
    top = x.max()
    return float(np.log(np.exp(x - top).sum()) + top - x[target])


def past_context(path: Path, tokens: list[int], bos: int, args) -> dict:
    from edgeinfer.context_policy import ContextPolicy
    from edgeinfer.generation import KVSession

    n_ctx, stride = args.past_ctx, args.stride
    text = [bos] + tokens[: 8 * n_ctx - 1]
    rows = []
    methods = [("shift", "f16", {"n_keep": 1}), ("streaming", "f16", {"n_sink": 4}),
               ("streaming", "q8_0", {"n_sink": 4}), ("streaming", "kivi4", {"n_sink": 4}),
               ("h2o", "f16", {"n_sink": 4}), ("h2o", "kivi4", {"n_sink": 4}),
               ("recompute", "f16", {}), ("dense", "f16", {})]  # fmt: skip
    methods = [m for m in methods if (m[1], m[1]) in PAIRS]  # as --pairs chose
    for method, kv, params in methods:
        size = len(text) if method == "dense" else n_ctx
        tracking = {"context_policy": "h2o"} if method == "h2o" else {}  # the engine sums
        ours = Ours(path, (kv, kv), size, args.threads, **tracking)
        nll = np.zeros(len(text) - 1)
        t = time.perf_counter()
        if method == "dense":  # every token sees the whole text before it: the reference
            for start in range(0, len(text) - 1, N_BATCH):
                logits = ours.eval(text[start : start + N_BATCH], all_logits=True)
                for j, row in enumerate(logits):
                    if start + j + 1 < len(text):
                        nll[start + j] = nll_of(row, text[start + j + 1])
        elif method == "recompute":
            for i in range(len(text) - 1):
                if ours.backend.n_past == n_ctx:  # full: BOS and the last tokens afresh
                    ours.reset()
                    logits = eval_chunked(ours, [bos] + text[i + 2 - (n_ctx - stride) : i + 1])
                else:
                    logits = ours.eval([text[i]])
                nll[i] = nll_of(logits, text[i + 1])
        else:
            session = KVSession(ours.backend, 1, ContextPolicy(method, **params))
            for i in range(len(text) - 1):
                nll[i] = nll_of(session.decode(text[i]), text[i + 1])
        seconds = time.perf_counter() - t
        ours.close()
        rows.append({
            "method": method, "kv": f"{kv}/{kv}", "params": params,
            "n_ctx": size, "stride": stride if method == "recompute" else None,
            "perplexity": math.exp(nll.mean()), "perplexity_past_ctx": math.exp(nll[n_ctx:].mean()),
            "tok_s": (len(text) - 1) / seconds,
        })  # fmt: skip
        print(f"  past the context: {method} {kv} done", file=sys.stderr)
    return {"n_ctx": n_ctx, "tokens": len(text), "rows": rows}


# --- the report -----------------------------------------------------------------------------


def model_and_text(model: str | None) -> tuple[Path, list[int], int | None]:
    """The model file (default: the packaged Gemma 3 270M), the text's tokens (pydoc's help
    topics, no BOS) and the model's BOS id. Puts the checkout on sys.path for the tests'
    helpers."""
    sys.path.insert(0, str(ROOT))
    if model is None:
        from tests.conftest import packaged_gemma_path

        model = str(packaged_gemma_path())
    path = Path(model)
    import edgeinfer
    from tests.kv.texts import python_help_text

    with edgeinfer.load(path, n_ctx=64, engine="native") as loaded:
        tokens = loaded.tokenize(python_help_text(), add_special=False)
        bos = loaded.tokenizer.bos_id
    return path, tokens, bos


def machine(path: Path, threads: int) -> dict:
    import llama_cpp

    import edgeinfer

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with edgeinfer.load(path, n_threads=threads, n_ctx=64, engine="native") as model:
        isa = model.backend.isa
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(), "cpu": cpu, "cpus": os.cpu_count(), "threads": threads,
        "edgeinfer_isa": isa,
        "llama_cpp_version": llama_cpp.__version__,
        "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "model": path.name,
    }  # fmt: skip


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def quality_table(q: dict) -> list[str]:
    lines = [f"Perplexity at -c {q['n_ctx']}, {q['windows']} windows "
             f"({q['windows'] * (q['n_ctx'] - q['n_ctx'] // 2)} scored tokens); KL and top-1 "
             "against the same engine's f16/f16:", "",
             "| K/V | engine | bits/value | perplexity | Δ ppl | mean KL | top-1 | target |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in q["runs"]:
        kl = r["kl_mean"]
        kl_s = "—" if kl is None else f"{kl:.5f} ± {r['kl_stderr']:.5f}"
        lines.append(
            f"| {r['pair']} | {r['engine']} | {r.get('bits', 0):g} | {r['perplexity']:.4f} | "
            f"{r['ppl_change']:+.2%} | {kl_s} | {_fmt(r['top1'], '.2%')} | "
            f"{TARGETS.get(r['pair'], '')} |"
        )
    c = q["cross_f16"]
    lines += ["", f"llama.cpp f16/f16 against ours f16/f16: mean KL {c['kl_mean']:.5f} ± "
              f"{c['kl_stderr']:.5f}, top-1 {c['top1']:.2%}."]  # fmt: skip
    ours = {r["pair"]: r for r in q["runs"] if r["engine"] == "edgeinfer"}
    theirs = {r["pair"]: r for r in q["runs"] if r["engine"] == "llama.cpp"}
    ratios = [f"{p} {ours[p]['kl_mean'] / theirs[p]['kl_mean']:.2f}" for p in theirs
              if p in ours and theirs[p]["kl_mean"]]  # fmt: skip
    if ratios:
        lines.append("KL ratio ours / llama.cpp, same types: " + ", ".join(ratios) + ".")
    q4 = theirs.get("q4_0/q4_0", {}).get("kl_mean")
    kivi = [f"{p} {r['kl_mean'] / q4:.3f}" for p, r in ours.items() if p.startswith("kivi") and q4]
    if kivi:
        lines.append("KL ratio ours KIVI / llama.cpp q4_0/q4_0: " + ", ".join(kivi) + ".")
    return lines


def memory_table(rows: list[dict]) -> list[str]:
    lines = ["| n_ctx | rings | K/V | ours (MiB) | ours computed (MiB) | llama.cpp (MiB) "
             "| ours / llama.cpp |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    theirs = {(r["n_ctx"], r["ring"], r["pair"]): r["bytes"] for r in rows
              if r["engine"] == "llama.cpp"}  # fmt: skip
    mib = 1 << 20
    for r in rows:
        if r["engine"] != "edgeinfer":
            continue
        other = theirs.get((r["n_ctx"], r["ring"], r["pair"]))
        ratio = "—" if not other else f"{r['bytes'] / other:.3f}"
        lines.append(
            f"| {r['n_ctx']} | {'yes' if r['ring'] else 'no'} | {r['pair']} | "
            f"{r['bytes'] / mib:.2f} | {r['computed_bytes'] / mib:.2f} | "
            f"{'—' if other is None else f'{other / mib:.2f}'} | {ratio} |"
        )
    return lines


def decode_table(rows: list[dict]) -> list[str]:
    ours = {r["pair"]: r for r in rows if r["engine"] == "edgeinfer"}
    theirs = {r["pair"]: r for r in rows if r["engine"] == "llama.cpp"}
    ctx = rows[0]["context"]
    lines = [f"Decode after a prompt of {ctx} tokens (prompt tok/s in brackets):", "",
             "| K/V | ours tok/s | ours / ours f16 | llama.cpp tok/s | llama.cpp / its f16 "
             "| ours / llama.cpp |", "|---|---|---|---|---|---|"]  # fmt: skip
    for pair, r in ours.items():
        t = theirs.get(pair)
        t_s = "—" if t is None else f"{t['tg_tok_s']:.1f} ({t['prompt_tok_s']:.0f})"
        t_rel = "—" if t is None else f"{t['tg_tok_s'] / theirs['f16/f16']['tg_tok_s']:.2f}"
        ratio = "—" if t is None else f"{r['tg_tok_s'] / t['tg_tok_s']:.2f}"
        lines.append(
            f"| {pair} | {r['tg_tok_s']:.1f} ({r['prompt_tok_s']:.0f}) | "
            f"{r['tg_tok_s'] / ours['f16/f16']['tg_tok_s']:.2f} | {t_s} | {t_rel} | {ratio} |"
        )
    return lines


def past_table(p: dict) -> list[str]:
    lines = [f"{p['tokens']} tokens (8 x n_ctx {p['n_ctx']}) fed one at a time, each next "
             "token scored:", "",
             "| method | K/V | cache | perplexity | ppl past n_ctx | tok/s |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in p["rows"]:
        what = {"shift": f"shift, n_keep {r['params'].get('n_keep')}",
                "streaming": f"streaming, n_sink {r['params'].get('n_sink')}",
                "h2o": f"h2o, n_sink {r['params'].get('n_sink')}",
                "recompute": f"windowed recomputation, every {r['stride']} tokens",
                "dense": "dense (whole text cached, batched)"}[r["method"]]  # fmt: skip
        lines.append(f"| {what} | {r['kv']} | {r['n_ctx']} | {r['perplexity']:.4f} | "
                     f"{r['perplexity_past_ctx']:.4f} | {r['tok_s']:.1f} |")  # fmt: skip
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=None, help="default: packaged Gemma 3 270M")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=2048, help="perplexity window")
    ap.add_argument("--windows", type=int, default=8, help="perplexity windows")
    ap.add_argument("--mem-ctx", type=int, nargs="+", default=[4096, 32768])
    ap.add_argument("--decode-ctx", type=int, default=4000)
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("--decode-reps", type=int, default=2, help="decode timings (best kept)")
    ap.add_argument("--past-ctx", type=int, default=256)
    ap.add_argument("--stride", type=int, default=64, help="windowed recomputation's stride")
    ap.add_argument("--only", nargs="+", choices=["quality", "memory", "decode", "past"])
    ap.add_argument(
        "--pairs",
        nargs="+",
        default=None,
        metavar="K/V",
        help="only these K/V pairs besides f16/f16, e.g. kivi4/kivi4 q4_0/q4_0",
    )
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="a smoke run of every part, small")
    args = ap.parse_args()
    if args.pairs:  # f16/f16 stays: everything is measured against it
        keep = {tuple(p.split("/")) for p in args.pairs}
        PAIRS[:] = [p for p in PAIRS if p == ("f16", "f16") or p in keep]
        LLAMA_PAIRS[:] = [p for p in LLAMA_PAIRS if p == ("f16", "f16") or p in keep]
    if args.quick:
        args.ctx, args.windows, args.mem_ctx = 512, 1, [4096]
        args.decode_ctx, args.n_gen, args.decode_reps, args.past_ctx = 600, 8, 1, 64
        args.stride = 16
    path, tokens, bos = model_and_text(args.model)
    parts = args.only or ["quality", "memory", "decode", "past"]
    report: dict = {"machine": machine(path, args.threads), "command": sys.argv[1:]}
    t0 = time.perf_counter()
    for part, fn in (("quality", lambda: quality(path, tokens, bos, args)),
                     ("memory", lambda: memory(path, args.mem_ctx, args.threads)),
                     ("decode", lambda: decode_speed(path, tokens, bos, args)),
                     ("past", lambda: past_context(path, tokens, bos, args))):  # fmt: skip
        if part in parts:
            t, load = time.perf_counter(), os.getloadavg()[0]
            report[part] = fn()
            report[f"{part}_s"] = time.perf_counter() - t
            # the machine's 1-minute load average before and after: other work on it
            report[f"{part}_load"] = [load, os.getloadavg()[0]]
            print(f"{part}: {report[f'{part}_s']:.0f} s", file=sys.stderr)
            if args.json is not None:  # after each part, so that a cut run keeps what it did
                args.json.write_text(json.dumps(report, indent=1))
    report["total_s"] = time.perf_counter() - t0
    lines = [f"Machine: {report['machine']['cpu']} ({report['machine']['host']}), "
             f"{args.threads} threads, {report['machine']['date']}; edgeinfer kernels "
             f"{report['machine']['edgeinfer_isa']}; llama.cpp "
             f"{report['machine']['llama_cpp_version']}: "
             f"{report['machine']['llama_cpp_system_info']}", ""]  # fmt: skip
    tables = {"quality": quality_table, "memory": memory_table, "decode": decode_table,
              "past": past_table}  # fmt: skip
    for part in parts:
        load = ", ".join(f"{x:.1f}" for x in report[f"{part}_load"])
        lines += [f"### {part}", "", f"({report[f'{part}_s']:.0f} s, load average {load})", ""]
        lines += tables[part](report[part]) + [""]
    print("\n".join(lines))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
