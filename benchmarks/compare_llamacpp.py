"""edgeinfer against llama.cpp on the same GGUF file with the same threads, in one run.

Each engine runs in its own process (so peak RSS is its own), alternating, `--rounds` times;
every figure is printed with the ratio edgeinfer / llama.cpp (for times and memory,
llama.cpp / edgeinfer: above 1 means edgeinfer is better everywhere). Time to first token is
measured warm, as llama-bench measures, and cold: the first prompt after loading, which pays
for paging the weights in and for edgeinfer's interleaved copies.

    python benchmarks/compare_llamacpp.py MODEL.gguf [-t 2] [-p 512] [-n 128] [--rounds 2]
                                          [--membw] [--busy] [--json]

With --membw it also measures the machine's memory read bandwidth with the same threads
(membw.py) and prints what share of it each engine's generation uses: bytes of weights read
per token (every tensor but a token embedding that is only looked up) x tokens per second.

With --busy another process keeps one core busy (a Python loop) while both engines are
measured, still alternating, so each runs on a loaded machine as on a desktop with other work
(the bandwidth of --membw is measured after, without it); the header says so, and the JSON has
"busy": true.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIGURES = [  # key, label, higher is better
    ("pp_tok_s", "prompt tok/s", True),
    ("tg_tok_s", "generation tok/s", True),
    ("ttft_s", "time to first token (s)", False),
    ("ttft_cold_s", "  the first after loading (s)", False),
    ("load_s", "load (s)", False),
    ("peak_rss_mb", "peak RSS (MB)", False),
]


def _run(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{out.stderr[-2000:]}")
    return json.loads(out.stdout[out.stdout.index("{") :])


@contextlib.contextmanager
def busy_core(enabled: bool = True) -> Iterator[subprocess.Popen | None]:
    """While the body runs, a process that keeps one core busy (None when not ``enabled``);
    stopped when the body ends, however it ends."""
    if not enabled:
        yield None
        return
    loop = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield loop
    finally:
        loop.terminate()
        try:
            loop.wait(timeout=10)
        except subprocess.TimeoutExpired:
            loop.kill()
            loop.wait()


def weight_bytes_per_token(model: str) -> int:
    """Bytes of weights a decoding step reads: all of them, except the rows of a token
    embedding that is not also the output matrix (one row is looked up per token)."""
    from edgeinfer.gguf import GGUFFile

    with GGUFFile(model) as f:
        tied = "output.weight" not in f.tensors
        return sum(
            len(f.tensor_data(name)) for name in f.tensors if tied or name != "token_embd.weight"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=3, help="measurements per process")
    ap.add_argument("--rounds", type=int, default=2, help="alternating process pairs")
    ap.add_argument("--isa", default=None, help="force edgeinfer's instruction-set variant")
    ap.add_argument(
        "--membw", action="store_true", help="measure bandwidth and its use by generation"
    )
    ap.add_argument(
        "--busy", action="store_true", help="keep one core busy while the engines are measured"
    )
    ap.add_argument(
        "--llama-python",
        default=sys.executable,
        help="the Python whose llama-cpp-python is measured (e.g. a venv with a build for "
        'another instruction set: CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF ...")',
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    common = [
        "-t",
        str(args.threads),
        "-p",
        str(args.n_prompt),
        "-n",
        str(args.n_gen),
        "-r",
        str(args.repetitions),
    ]
    ours_cmd = [sys.executable, "-m", "edgeinfer.apps.cli", "bench", args.model, "--json", *common]
    if args.isa:
        ours_cmd += ["--isa", args.isa]
    theirs_cmd = [args.llama_python, str(HERE / "llamacpp_bench.py"), args.model, *common]
    ours, theirs = [], []
    with busy_core(args.busy):
        for _ in range(args.rounds):
            ours.append(_run(ours_cmd))
            theirs.append(_run(theirs_cmd))
    result = {
        "model": args.model, "threads": args.threads, "isa": ours[0]["isa"], "busy": args.busy,
        "llama.cpp_features": theirs[0].get("features", ""),
        "figures": {},
    }  # fmt: skip
    for key, _label, higher_better in FIGURES:
        a = statistics.mean(r[key] for r in ours)
        b = statistics.mean(r[key] for r in theirs)
        ratio = (a / b if higher_better else b / a) if a and b else float("nan")
        result["figures"][key] = {"edgeinfer": a, "llama.cpp": b, "ratio": ratio}
    if args.membw:
        import membw

        per_token = weight_bytes_per_token(args.model)
        gbps = membw.measure(args.threads)
        tg = result["figures"]["tg_tok_s"]
        result["bandwidth"] = {
            "weights_bytes_per_token": per_token, "membw_gb_s": gbps,
            "edgeinfer_use": per_token * tg["edgeinfer"] / 1e9 / gbps,
            "llama.cpp_use": per_token * tg["llama.cpp"] / 1e9 / gbps,
        }  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{Path(args.model).name}: {args.threads} threads, "
          f"edgeinfer {ours[0]['engine']}/{ours[0]['isa']}, llama.cpp {theirs[0]['version']}; "
          f"pp{args.n_prompt} tg{args.n_gen}, {args.rounds} rounds"
          + ("; one core kept busy by another process" if args.busy else ""))  # fmt: skip
    if theirs[0].get("features"):
        print(f"llama.cpp built for: {theirs[0]['features']}")
    print(f"{'':28} {'edgeinfer':>12} {'llama.cpp':>12} {'ratio':>8}")
    for key, label, _ in FIGURES:
        f = result["figures"][key]
        print(f"{label:28} {f['edgeinfer']:12.3f} {f['llama.cpp']:12.3f} {f['ratio']:7.2f}x")
    if args.membw:
        bw = result["bandwidth"]
        print(f"generation reads {bw['weights_bytes_per_token'] / 1e6:.1f} MB of weights a token; "
              f"measured read bandwidth {bw['membw_gb_s']:.1f} GB/s ({args.threads} threads): "
              f"edgeinfer uses {100 * bw['edgeinfer_use']:.0f}%, "
              f"llama.cpp {100 * bw['llama.cpp_use']:.0f}%")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
