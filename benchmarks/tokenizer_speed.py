"""Tokenizer speed: building a model's tokenizer from its GGUF metadata, and tokenizing a long
mixed prompt (prose, code, CJK, emoji). Speed is measured here, not asserted in unit tests.

    python benchmarks/tokenizer_speed.py MODEL.gguf [-r 5]
"""

from __future__ import annotations

import argparse
import time

from edgeinfer.gguf import GGUFFile
from edgeinfer.tokenizer import Tokenizer

PROMPT = (
    "The quick brown fox jumps over the lazy dog. 敏捷的棕色狐狸跳过了懒狗。 "
    "def tokenize(text: str) -> list[int]:\n    return [ord(c) for c in text]\n"
    "Ünïcödé àccents, emoji 🦊🐕, مرحبا بالعالم, 1234567890 3.14159\n"
) * 40


def best_of(n: int, fn) -> float:
    best = float("inf")
    for _ in range(n):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("-r", "--repetitions", type=int, default=5)
    args = p.parse_args()
    with GGUFFile(args.model) as gguf:
        metadata = dict(gguf.metadata)
    build = best_of(args.repetitions, lambda: Tokenizer.from_metadata(metadata))
    tok = Tokenizer.from_metadata(metadata)
    tok.tokenize(PROMPT)  # the first call builds the lazy tables
    run = best_of(args.repetitions, lambda: tok.tokenize(PROMPT, parse_special=True))
    n = len(tok.tokenize(PROMPT, parse_special=True))
    print(
        f"build {build * 1e3:.1f} ms ({tok.n_vocab} tokens); tokenize {len(PROMPT)} characters "
        f"-> {n} tokens in {run * 1e3:.1f} ms ({n / run:,.0f} tok/s)"
    )


if __name__ == "__main__":
    main()
