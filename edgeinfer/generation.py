"""Generation as a generator: prefill, then one decode step per token.

``prefill`` and ``decode`` are kept apart (as gpt-fast does) and the loop takes its sampler
as an argument (as mlx-lm's generate_step does). Cancellation is checked between prompt
chunks as well as between tokens. Text concerns (detokenizing, stop strings) live in
:mod:`edgeinfer.api`; this module deals in token ids only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from edgeinfer import errors
from edgeinfer.engines.base import Engine


class Cancelled(errors.EdgeInferError):
    """Raised inside generation when cancel() was called; callers turn it into a finish reason."""


@dataclass
class GenerationStats:
    prompt_tokens: int = 0  # tokens in the prompt
    cached_tokens: int = 0  # of which were reused from the KV cache
    generated_tokens: int = 0
    prompt_s: float = 0.0  # time to evaluate the prompt
    ttft_s: float = 0.0  # from the request to the first generated token
    decode_s: float = 0.0  # from the first generated token to the last
    finish_reason: str = ""  # "stop", "length", "cancelled"
    started: float = field(default_factory=time.perf_counter, repr=False)

    @property
    def prompt_tok_s(self) -> float:
        n = self.prompt_tokens - self.cached_tokens
        return n / self.prompt_s if self.prompt_s > 0 else 0.0

    @property
    def gen_tok_s(self) -> float:
        n = self.generated_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "generated_tokens": self.generated_tokens,
            "prompt_tok_s": round(self.prompt_tok_s, 2),
            "gen_tok_s": round(self.gen_tok_s, 2),
            "ttft_s": round(self.ttft_s, 4),
            "finish_reason": self.finish_reason,
        }


class KVSession:
    """An engine plus the token ids its cache holds, so that a new prompt that shares a prefix
    with the last one (the next turn of a chat) only evaluates what is new."""

    def __init__(self, engine: Engine, n_batch: int = 512) -> None:
        self.engine = engine
        self.n_batch = n_batch
        self.tokens: list[int] = []

    def reset(self) -> None:
        self.engine.truncate(0)
        self.tokens = []

    def prefill(
        self, prompt: list[int], cancel: threading.Event | None = None
    ) -> tuple[np.ndarray, int]:
        """Evaluates what of ``prompt`` is not cached; returns the last logits and the reuse."""
        if not prompt:
            raise errors.InvalidOptionError("the prompt is empty (no tokens to evaluate)")
        if len(prompt) >= self.engine.n_ctx:
            raise errors.ContextOverflowError(
                f"the prompt has {len(prompt)} tokens; the context holds {self.engine.n_ctx} "
                "(room is needed for at least one generated token)"
            )
        n_common = 0
        for a, b in zip(self.tokens, prompt, strict=False):
            if a != b:
                break
            n_common += 1
        n_common = min(n_common, len(prompt) - 1)  # evaluate one token at least, for logits
        self.engine.truncate(n_common)
        self.tokens = self.tokens[:n_common]
        logits = None
        for start in range(n_common, len(prompt), self.n_batch):
            if cancel is not None and cancel.is_set():
                raise Cancelled("cancelled during the prompt")
            chunk = prompt[start : start + self.n_batch]
            logits = self.engine.forward(chunk)
            self.tokens.extend(chunk)
        assert logits is not None
        return logits, n_common

    def decode(self, token: int) -> np.ndarray:
        logits = self.engine.forward([token])
        self.tokens.append(token)
        return logits


def generate_tokens(
    session: KVSession,
    prompt: list[int],
    sampler: Callable[[np.ndarray, list[int]], int],
    *,
    max_tokens: int,
    is_eog: Callable[[int], bool],
    stats: GenerationStats,
    cancel: threading.Event | None = None,
) -> Iterator[int]:
    """Yields generated token ids; sets ``stats.finish_reason`` when it stops."""
    stats.prompt_tokens = len(prompt)
    t0 = time.perf_counter()
    try:
        logits, stats.cached_tokens = session.prefill(prompt, cancel)
    except Cancelled:
        stats.finish_reason = "cancelled"
        return
    t1 = time.perf_counter()
    stats.prompt_s = t1 - t0
    history = list(prompt)
    while True:
        if cancel is not None and cancel.is_set():
            stats.finish_reason = "cancelled"
            return
        if stats.generated_tokens >= max_tokens:
            stats.finish_reason = "length"
            return
        token = sampler(logits, history)
        now = time.perf_counter()
        if stats.generated_tokens == 0:
            stats.ttft_s = now - stats.started
            first = now
        if is_eog(token):
            stats.finish_reason = "stop"
            stats.decode_s = now - first
            return
        stats.generated_tokens += 1
        history.append(token)
        yield token
        stats.decode_s = time.perf_counter() - first
        if session.engine.n_past + 1 > session.engine.n_ctx:
            stats.finish_reason = "length"  # the context is full
            return
        logits = session.decode(token)
