"""What happens when a sequence reaches the end of its context: the policies, one registry.

* ``error``: a typed :class:`~edgeinfer.errors.ContextOverflowError` (the default).
* ``shift``: llama.cpp's context shift. The first ``n_keep`` tokens stay; the oldest half of
  the rest is dropped.
* ``streaming``: StreamingLLM (Xiao et al., 2023). The first ``n_sink`` tokens stay as
  attention sinks, and the most recent ones fill the rest of the context. To keep the cost of
  an eviction (every later key is re-rotated) off each token, it drops an eighth of the
  context at a time, so the recent window holds between 7/8 of the context and all of it.
* ``h2o``: Heavy-Hitter Oracle (Zhang et al., 2023). The first ``n_sink`` tokens stay, and so
  do the most recent ones; among the rest, the tokens that have received the least attention
  go (the same eighth of the context at a time). The attention a token received is summed
  over every query head of every layer since it was evaluated (one score per position, the
  engine's ``attention_scores``; the paper keeps one per head, which a cache shared by the
  heads of a layer cannot drop apart). Of what stays, half is the recent window and half the
  heavy hitters, the paper's even split.

An eviction discards runs of cached positions; the later ones move down, their keys rotated
back (RoPE sees positions within the cache, as the papers do), so nothing is evaluated
again. The session (:class:`edgeinfer.generation.KVSession`) asks the policy for the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from edgeinfer import errors

if TYPE_CHECKING:
    from edgeinfer.engines.base import Engine

DEFAULT_N_SINK = 4
STREAMING_STEP = 8  # streaming drops 1/STREAMING_STEP of the context at a time


@dataclass(frozen=True)
class ContextPolicy:
    """A policy and its parameters (``n_keep`` for shift, ``n_sink`` for streaming)."""

    name: str = "error"
    n_keep: int = 0
    n_sink: int = DEFAULT_N_SINK

    def __post_init__(self) -> None:
        if self.name not in CONTEXT_POLICIES:
            raise errors.InvalidOptionError(
                f"unknown context_policy {self.name!r} (one of {', '.join(CONTEXT_POLICIES)})"
            )
        for field in ("n_keep", "n_sink"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise errors.InvalidOptionError(f"{field} must be an integer >= 0, got {value!r}")

    @property
    def evicts(self) -> bool:
        return self.name != "error"

    @property
    def kept(self) -> int:
        """Tokens at the start of the sequence that are never dropped."""
        return {"shift": self.n_keep, "streaming": self.n_sink, "h2o": self.n_sink}.get(
            self.name, 0
        )

    @property
    def tracks_attention(self) -> bool:
        """Whether the engine must sum the attention each position receives."""
        return self.name == "h2o"

    def check(self, n_ctx: int) -> None:
        """Refuses parameters that leave no room in a context of ``n_ctx``."""
        if self.evicts and self.kept * 2 > n_ctx:
            what = "n_keep" if self.name == "shift" else "n_sink"
            raise errors.InvalidOptionError(
                f"{what} {self.kept} leaves too little room in a context of {n_ctx} "
                f"(at most {n_ctx // 2})"
            )

    def discard(
        self, n_past: int, n_new: int, n_ctx: int, most: int | None = None
    ) -> tuple[int, int]:
        """(start, count): the cached positions to drop so that ``n_new`` more tokens fit
        after ``n_past``. ``most`` caps the count (an engine's ring buffers need the window
        behind the kept tokens); a context too small for the policy is ContextOverflowError."""
        needed = n_past + n_new - n_ctx
        start = min(self.kept, n_past)
        if self.name == "shift":
            count = max((n_past - start) // 2, needed)
        elif self.name == "streaming":
            count = max((n_ctx - start) // STREAMING_STEP, needed)
        else:
            count = needed
        count = min(count, n_past - start, most if most is not None else n_past)
        if not self.evicts or count < needed:
            raise errors.ContextOverflowError(
                f"{n_past} cached + {n_new} new tokens exceed the context of {n_ctx}"
                + ("" if not self.evicts else f" and the {self.name} policy can drop only {count}")
            )
        return start, count

    def heavy_hitter_runs(
        self, scores: np.ndarray, n_new: int, n_ctx: int, recent_min: int = 0
    ) -> list[tuple[int, int]]:
        """h2o: the runs (start, count) of positions to drop so that ``n_new`` more tokens fit
        after the ``len(scores)`` cached ones, ``scores`` the attention each received. The
        recent window (at least ``recent_min`` positions: an engine's ring buffers need theirs)
        and the sinks stay; of the others, the least attended go, the older first on a tie."""
        n_past = len(scores)
        needed = n_past + n_new - n_ctx
        sinks = min(self.kept, n_past)
        count = max(n_ctx // STREAMING_STEP, needed)
        recent = max(recent_min, (n_past - sinks - count) // 2)
        zone = max(n_past - recent - sinks, 0)  # the positions that may go
        count = min(count, zone)
        if count < needed:
            raise errors.ContextOverflowError(
                f"{n_past} cached + {n_new} new tokens exceed the context of {n_ctx} and the "
                f"h2o policy can drop only {count} (it keeps {sinks} sinks and {recent} recent)"
            )
        order = np.argsort(scores[sinks : sinks + zone], kind="stable")[:count]
        return positions_to_runs(np.sort(order) + sinks)


def positions_to_runs(positions: np.ndarray) -> list[tuple[int, int]]:
    """Sorted distinct positions as runs (start, count) of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for p in positions.tolist():
        if runs and runs[-1][0] + runs[-1][1] == p:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((p, 1))
    return runs


CONTEXT_POLICIES = ("error", "shift", "streaming", "h2o")


def make_room(
    engine: Engine, policy: ContextPolicy, n_new: int, seq: int = 0
) -> list[tuple[int, int]]:
    """Drops what ``policy`` says from ``seq`` so that ``n_new`` more tokens fit; returns the
    runs (start, count) it dropped, in cache positions before the drop (none when they fit
    already; one run right after the kept tokens but for h2o)."""
    n_past, n_ctx = engine.seq_length(seq), engine.n_ctx
    if n_past + n_new <= n_ctx:
        return []
    if policy.name == "h2o":
        recent = engine.ring_window - 1 if engine.ring_slack is not None else 0
        runs = policy.heavy_hitter_runs(engine.attention_scores(seq), n_new, n_ctx, recent)
        engine.evict(runs, seq)
        return runs
    start = min(policy.kept, n_past)
    start, count = policy.discard(n_past, n_new, n_ctx, engine.discard_limit(start, seq))
    engine.discard(start, count, seq)
    return [(start, count)]
