"""Layer offload speed (n_gpu_layers, Vulkan) side by side with the CPU engine on the same file:
pp (a prompt of -p tokens in one step) and tg (-n generated tokens) for each -ngl, every figure
from `edgeinfer bench --json` run one after another on the same machine, with each GPU row's
ratio to the CPU row.

    python benchmarks/offload_speed.py MODEL.gguf [MODEL.gguf ...] [--ngl 0 half all]
                                       [-p 512] [-n 128] [-r 3] [-t THREADS] [--json]
    python benchmarks/offload_speed.py --random-1.1b DIR ...   # also the random 1.1B Q4_0 model

`half` is the output and half the layers (llama.cpp counts the output as one); `all` every
layer and the output. The device is named in each row (`--gpu-device I` picks one). This is
the script for a machine with a real GPU (the issue's speed point): run it from outside the
checkout, then put the table in the README's Vulkan section with the device named. On
lavapipe (software Vulkan) it runs too, and its figures are not a target.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def bench(model: str, ngl: str, args: argparse.Namespace) -> dict:
    """One `edgeinfer bench --json` run; raises with its stderr when it fails."""
    cmd = ["edgeinfer", "bench", model, "-p", str(args.n_prompt), "-n", str(args.n_gen)]
    cmd += ["-r", str(args.repetitions), "-t", str(args.threads), "--json"]
    if ngl != "0":
        cmd += ["-ngl", ngl]
        if args.gpu_device is not None:
            cmd += ["--gpu-device", str(args.gpu_device)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout)


def layers_of(model: str, args: argparse.Namespace) -> int:
    """The model's layers, from the plan of an -ngl all run with no prompt."""
    probe = argparse.Namespace(**{**vars(args), "n_prompt": 1, "n_gen": 1, "repetitions": 1})
    return int(bench(model, "all", probe)["gpu"]["n_layer"])


def rows_for(model: str, args: argparse.Namespace) -> list[dict]:
    n_layer = layers_of(model, args) if "half" in args.ngl else 0
    rows, cpu = [], None
    for ngl in args.ngl:
        value = str(n_layer // 2 + 1) if ngl == "half" else ngl
        r = bench(model, value, args)
        gpu = r.get("gpu") or {}
        row = {
            "model": os.path.basename(model),
            "ngl": ngl if ngl in ("0", "all") else f"{value} ({ngl})",
            "device": gpu.get("device_name") or f"CPU ({r['isa']}, {r['threads']} threads)",
            "pp_tok_s": r["pp_tok_s"],
            "tg_tok_s": r["tg_tok_s"],
            "gpu_mib": (gpu.get("total_bytes") or 0) / 2**20,
        }
        if ngl == "0":
            cpu = row
        if cpu is not None and ngl != "0":
            row["pp_ratio"] = row["pp_tok_s"] / cpu["pp_tok_s"]
            row["tg_ratio"] = row["tg_tok_s"] / cpu["tg_tok_s"]
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    head = ["model", "n_gpu_layers", "device", "pp tok/s", "tg tok/s", "pp vs CPU", "tg vs CPU"]
    out = ["| " + " | ".join([*head, "on the GPU"]) + " |", "|---" * (len(head) + 1) + "|"]
    for r in rows:
        ratios = [f"{r[k]:.2f}x" if k in r else "" for k in ("pp_ratio", "tg_ratio")]
        gib = f"{r['gpu_mib']:.0f} MiB" if r["gpu_mib"] else ""
        out.append(
            f"| {r['model']} | {r['ngl']} | {r['device']} | {r['pp_tok_s']:.1f} | "
            f"{r['tg_tok_s']:.1f} | {ratios[0]} | {ratios[1]} | {gib} |"
        )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--ngl", nargs="+", default=["0", "half", "all"])
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--gpu-device", type=int, default=None)
    ap.add_argument(
        "--random-1.1b", dest="random_dir", metavar="DIR", default=None,
        help="also write (once) and measure the random 1.1B Q4_0 model in DIR",
    )  # fmt: skip
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    models = list(args.models)
    if args.random_dir:
        path = Path(args.random_dir) / "random-llama-1.1b-q4_0.gguf"
        if not path.exists():
            maker = [sys.executable, str(HERE / "make_random_llama.py"), str(path)]
            made = subprocess.run(maker, check=False)
            if made.returncode != 0:
                return made.returncode
        models.append(str(path))
    if not models:
        ap.error("name a model, or --random-1.1b DIR")
    rows = []
    for model in models:
        try:
            rows += rows_for(model, args)
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return 1
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
