"""The repetition guard: ends a generation that has started to loop, with finish reason
"repetition".

A loop is the newest tokens being one n-gram said over and over: ``repeats`` copies of an
n-gram of ``n`` tokens, back to back, at the end of the reply. Short n-grams must repeat
more often before they count (``min_tokens`` in all), so that "ha ha ha" or a row of dashes
in a table is not a loop, while a sentence said for the third time is. Base models fall into
such loops as soon as they are chatted with (Gemma 3 270M repeated one line for 436 tokens);
an instruction-tuned reply practically never repeats a whole n-gram this many times.

The check is per token and cheap: only the periods ``n`` at which the newest token equals
the token ``n`` back are verified, each by one slice comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgeinfer import errors
from edgeinfer.options import int_option


@dataclass(frozen=True)
class RepetitionGuard:
    """Stops a reply once its last ``max(min_repeats, ceil(min_tokens / n)) * n`` tokens are
    copies of one n-gram of n <= ``max_ngram`` tokens."""

    min_repeats: int = 3
    min_tokens: int = 24
    max_ngram: int = 64

    def __post_init__(self) -> None:
        int_option("min_repeats", self.min_repeats, 2, 1 << 16)
        int_option("min_tokens", self.min_tokens, 2, 1 << 20)
        int_option("max_ngram", self.max_ngram, 1, 1 << 16)

    def repeats_needed(self, n: int) -> int:
        """Copies of an n-gram of ``n`` tokens that make a loop."""
        return max(self.min_repeats, -(-self.min_tokens // n))

    def loops(self, tokens: Sequence[int]) -> bool:
        """Whether ``tokens`` (the reply so far) ends in a loop."""
        size = len(tokens)
        if size < 2:
            return False
        last = tokens[-1]
        for n in range(1, min(self.max_ngram, size // 2) + 1):
            if tokens[-1 - n] != last:
                continue
            span = n * self.repeats_needed(n)
            if span > size:
                continue
            tail = tokens[-span:]
            if tail[n:] == tail[:-n]:  # period n over the whole span
                return True
        return False


def repetition_guard(value: Any) -> RepetitionGuard | None:
    """A generation's ``repetition_guard`` option: False (none), True (the defaults) or a
    :class:`RepetitionGuard`."""
    if isinstance(value, RepetitionGuard):
        return value
    if value is True:
        return RepetitionGuard()
    if value is False or value is None:
        return None
    raise errors.InvalidOptionError(
        f"repetition_guard must be True, False or a RepetitionGuard, got {value!r}"
    )
