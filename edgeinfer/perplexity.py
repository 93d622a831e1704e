"""Perplexity of a text, computed the way llama.cpp's llama-perplexity does: the tokens are
cut into windows of n_ctx, each window is evaluated from an empty cache (starting with BOS
when the model adds one), and only the second half of every window is scored, so that each
scored token sees at least n_ctx/2 tokens of context."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgeinfer import errors


@dataclass
class PerplexityResult:
    perplexity: float
    nll: float  # mean negative log-likelihood per scored token (nats)
    scored_tokens: int
    windows: int

    def as_dict(self) -> dict[str, float | int]:
        return {"perplexity": self.perplexity, "nll": self.nll, "scored_tokens": self.scored_tokens,
                "windows": self.windows}  # fmt: skip


def perplexity(
    model, text: str, n_ctx: int = 512, max_windows: int | None = None
) -> PerplexityResult:
    """Scores ``text`` with ``model`` (an edgeinfer Model) in windows of ``n_ctx`` tokens."""
    if n_ctx < 4 or n_ctx > model.n_ctx:
        raise errors.InvalidOptionError(
            f"the window must lie in [4, {model.n_ctx}] tokens, not {n_ctx}"
        )
    tokens = model.tokenize(text, add_special=False)
    bos = model.tokenizer.bos_id if model.tokenizer.add_bos else None
    n_windows = len(tokens) // n_ctx
    if max_windows is not None:
        n_windows = min(n_windows, max_windows)
    if n_windows < 1:
        raise errors.InvalidOptionError(
            f"the text has {len(tokens)} tokens, fewer than one window of {n_ctx}"
        )
    first = n_ctx // 2
    total, count = 0.0, 0
    for w in range(n_windows):
        window = list(tokens[w * n_ctx : (w + 1) * n_ctx])
        if bos is not None:
            window[0] = bos  # as llama-perplexity: the window's first token becomes BOS
        logits = model.logits(window).astype(np.float64)  # (n_ctx, n_vocab)
        pred = logits[first - 1 : n_ctx - 1]
        target = np.asarray(window[first:n_ctx])
        log_z = np.log(np.exp(pred - pred.max(axis=1, keepdims=True)).sum(axis=1)) + pred.max(
            axis=1
        )
        total += float(np.sum(log_z - pred[np.arange(len(target)), target]))
        count += len(target)
    nll = total / count
    return PerplexityResult(math.exp(nll), nll, count, n_windows)
