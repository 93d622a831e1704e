"""llama.cpp (through llama-cpp-python) measured the way `edgeinfer bench` measures edgeinfer:
load, the first prompt after it (cold), pp (one batch of random prompt tokens), tg (one token
per step from an empty context), peak RSS. Run as a script; prints one JSON object."""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time

import numpy as np


def _cpu_features(llama_cpp) -> str:
    """The instruction sets this llama.cpp build's CPU backend was compiled for ("AVX2 AVX512
    ..."), from its system info, whose "NAME = 1" entries they are."""
    info = llama_cpp.llama_print_system_info()
    text = info.decode() if isinstance(info, bytes) else str(info)
    names = []
    for part in text.replace("|", "\n").splitlines():
        name, _, value = part.partition("=")
        name = name.rpartition(":")[2]  # "CPU : SSE3 = 1": the backend's name goes
        if value.strip() == "1" and name.strip() and name.strip() not in names:
            names.append(name.strip())
    return " ".join(names)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", type=int, required=True)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    args = ap.parse_args()
    import llama_cpp

    t0 = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=args.model, n_ctx=args.n_prompt + args.n_gen, n_batch=min(512, args.n_prompt),
        n_ubatch=min(512, args.n_prompt), n_threads=args.threads, n_threads_batch=args.threads,
        verbose=False,
    )  # fmt: skip
    load_s = time.perf_counter() - t0
    n_vocab = llm.n_vocab()

    def last_argmax() -> int:
        # the logits of the batch's last token, from the context: llama-cpp-python 0.3.36
        # keeps no scores without logits_all (llm.scores is left unwritten, n_batch rows)
        logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(logits, shape=(n_vocab,))))

    rng = np.random.default_rng(0)
    prompt = rng.integers(min(1000, n_vocab // 2), n_vocab, size=args.n_prompt).tolist()
    llm.reset()  # cold: the first prompt after loading (also the warm-up, as edgeinfer's)
    t = time.perf_counter()
    llm.eval(prompt)
    last_argmax()
    ttft_cold = time.perf_counter() - t
    pp, tg, ttft = [], [], []
    for _ in range(args.repetitions):
        llm.reset()
        t = time.perf_counter()
        llm.eval(prompt)
        token = last_argmax()
        dt = time.perf_counter() - t
        pp.append(args.n_prompt / dt)
        ttft.append(dt)
        llm.reset()
        t = time.perf_counter()
        for _ in range(args.n_gen):
            llm.eval([token])
            token = last_argmax()
        tg.append(args.n_gen / (time.perf_counter() - t))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({
        "engine": "llama.cpp", "version": llama_cpp.__version__, "threads": args.threads,
        "features": _cpu_features(llama_cpp),
        "n_prompt": args.n_prompt, "n_gen": args.n_gen, "repetitions": args.repetitions,
        "pp_tok_s": statistics.mean(pp), "pp_tok_s_sd": statistics.pstdev(pp),
        "tg_tok_s": statistics.mean(tg), "tg_tok_s_sd": statistics.pstdev(tg),
        "ttft_s": statistics.mean(ttft), "ttft_cold_s": ttft_cold, "load_s": load_s,
        "peak_rss_mb": rss / (1 << 20) if sys.platform == "darwin" else rss / 1024,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
