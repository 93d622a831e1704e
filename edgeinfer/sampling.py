"""Token samplers: the llama.cpp chain (penalties, top-k, top-p, min-p, temperature, draw).

A :class:`Sampler` is a callable ``(logits, history) -> token id``; generation takes it as an
argument, so callers may pass their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgeinfer import errors


@dataclass(frozen=True)
class SamplingParams:
    """Defaults are llama.cpp's. ``temperature == 0`` means greedy decoding."""

    temperature: float = 0.8
    top_k: int = 40  # 0: off
    top_p: float = 0.95  # 1.0: off
    min_p: float = 0.05  # 0.0: off
    repeat_penalty: float = 1.0  # 1.0: off
    repeat_last_n: int = 64  # how many recent tokens the penalties look at; -1: all
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None  # None: a fresh random seed

    def __post_init__(self) -> None:
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(
                value, (int, float, np.integer, np.floating)
            ):
                raise errors.InvalidOptionError(f"{name} must be a number, got {value!r}")
            object.__setattr__(self, name, float(value))
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if value is None and name == "seed":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise errors.InvalidOptionError(f"{name} must be an integer, got {value!r}")
            object.__setattr__(self, name, int(value))
        checks = (
            (
                math.isfinite(self.temperature) and self.temperature >= 0,
                "temperature must be a finite number >= 0 (0: greedy)",
            ),
            (self.top_k >= 0, "top_k must be >= 0 (0 turns it off)"),
            (0.0 < self.top_p <= 1.0, "top_p must lie in (0, 1]"),
            (0.0 <= self.min_p <= 1.0, "min_p must lie in [0, 1]"),
            (
                self.repeat_penalty > 0 and math.isfinite(self.repeat_penalty),
                "repeat_penalty must be > 0",
            ),
            (self.repeat_last_n >= -1, "repeat_last_n must be >= -1"),
            (math.isfinite(self.presence_penalty), "presence_penalty must be finite"),
            (math.isfinite(self.frequency_penalty), "frequency_penalty must be finite"),
            (self.seed is None or 0 <= self.seed < 2**64, "seed must lie in [0, 2**64)"),
        )
        for ok, message in checks:
            if not ok:
                raise errors.InvalidOptionError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
)
_INT_FIELDS = ("top_k", "repeat_last_n", "seed")


class Sampler:
    """Samples one token from a row of logits; the same seed gives the same choices."""

    def __init__(self, params: SamplingParams | None = None) -> None:
        self.params = params or SamplingParams()
        self.rng = np.random.default_rng(self.params.seed)

    def __call__(self, logits: np.ndarray, history: list[int]) -> int:
        ids, probs = self.distribution(logits, history)
        if self.params.greedy:
            return int(ids[0])
        return int(ids[self.rng.choice(len(ids), p=probs)])

    def distribution(self, logits: np.ndarray, history: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The tokens the chain keeps, by descending logit, and the probabilities it draws
        them with: what llama.cpp's penalties, top-k, top-p, min-p and temp leave.

        No finite option can turn the draw into NaN (penalized values stay finite);
        non-finite logits themselves are refused."""
        p = self.params
        logits = np.asarray(logits, dtype=np.float32)
        if not np.isfinite(logits).all():
            raise errors.NonFiniteLogitsError("the logits to sample from contain inf or NaN")
        logits = self._penalize(logits, history)
        if p.greedy:
            return np.array([int(np.argmax(logits))]), np.array([1.0])
        ids, values = self._top_k(logits, p.top_k)  # candidates sorted by logit, descending
        probs = _softmax(values)
        keep = len(ids)
        if p.top_p < 1.0:
            # smallest prefix whose mass reaches top_p (at least one token)
            keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1)
        if p.min_p > 0.0:
            keep = min(keep, max(1, int(np.sum(probs[:keep] >= p.min_p * probs[0]))))
        ids, values = ids[:keep], values[:keep]
        # in float64 and relative to the best: a tiny temperature must not overflow to inf
        with np.errstate(over="ignore"):  # -inf, where the scaled gap overflows: probability 0
            scaled = (values.astype(np.float64) - np.float64(values[0])) / p.temperature
        probs = np.exp(scaled)
        return ids, probs / probs.sum()

    def _penalize(self, logits: np.ndarray, history: list[int]) -> np.ndarray:
        p = self.params
        if not history or (
            p.repeat_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
        ):
            return logits
        recent = (
            history
            if p.repeat_last_n == -1
            else history[-p.repeat_last_n :]
            if p.repeat_last_n
            else []
        )
        if not recent:
            return logits
        ids, counts = np.unique(np.asarray(recent, dtype=np.int64), return_counts=True)
        ids_ok = (ids >= 0) & (ids < len(logits))
        ids, counts = ids[ids_ok], counts[ids_ok]
        logits = logits.copy()
        v = logits[ids]
        # in float32, as llama.cpp; a value that overflows is held at the largest finite one,
        # so that extreme (finite) penalties rank tokens without turning the draw into NaN
        big = np.finfo(np.float32).max
        with np.errstate(over="ignore"):
            v = np.clip(np.where(v > 0, v / p.repeat_penalty, v * p.repeat_penalty), -big, big)
            v -= np.clip(counts * p.frequency_penalty + p.presence_penalty, -big, big)
        logits[ids] = np.clip(v, -big, big)
        return logits

    @staticmethod
    def _top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        ids = np.argpartition(-logits, k - 1)[:k] if 0 < k < len(logits) else np.arange(len(logits))
        order = np.argsort(-logits[ids], kind="stable")
        ids = ids[order]
        return ids, logits[ids]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp((x - x.max()).astype(np.float64))
    return e / e.sum()
