"""Measures the machine's memory read bandwidth (GB/s) with N threads over a 1 GiB buffer:
the ceiling for token generation, which reads every weight once per token.

    python benchmarks/membw.py [-t THREADS] [--mb 1024]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def measure(threads: int, mb: int = 1024) -> float:
    src = Path(__file__).with_name("membw.c")
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "membw"
        cc = os.environ.get("CC", "cc")
        subprocess.run([cc, "-O3", "-pthread", str(src), "-o", str(exe)], check=True)
        out = subprocess.run(
            [str(exe), str(threads), str(mb)], check=True, capture_output=True, text=True
        )
    return float(out.stdout.strip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--mb", type=int, default=1024)
    args = ap.parse_args()
    print(f"{measure(args.threads, args.mb):.2f} GB/s read with {args.threads} threads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
