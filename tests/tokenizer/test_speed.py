"""Loading stays inside the model-load budget; tokenizing a chat prompt takes milliseconds."""

from __future__ import annotations

import time

from edgeinfer.tokenizer import Tokenizer
from tests.tokenizer.corpus import long_text


def _best_of(n: int, fn) -> float:
    best = float("inf")
    for _ in range(n):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def test_gemma_vocabulary_builds_fast(gemma_metadata: dict) -> None:
    seconds = _best_of(3, lambda: Tokenizer.from_metadata(gemma_metadata))
    assert seconds < 0.3, f"building the 262k-token Gemma tokenizer took {seconds:.3f} s"


def test_long_prompt_tokenizes_fast(tokenizers) -> None:
    text = long_text()
    assert len(text) > 3000
    for name, tok in tokenizers.items():
        tok.tokenize(text)  # first use builds the lazy tables
        seconds = _best_of(3, lambda tok=tok: tok.tokenize(text, parse_special=True))
        assert seconds < 0.25, f"{name}: {len(text)} characters took {seconds:.3f} s"
