"""Checks of caller-given options, shared by the API's entry points: a wrong type or a
value out of range is an InvalidOptionError naming the option, never a silent conversion."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeinfer import errors


def int_option(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    """``value`` as an int in [lo, hi]; bools, floats and strings are refused, not converted."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise errors.InvalidOptionError(f"{name} must be an integer, got {value!r}")
    if hi is not None and not lo <= value <= hi:
        raise errors.InvalidOptionError(f"{name} must lie in [{lo}, {hi}], got {value}")
    if value < lo:
        raise errors.InvalidOptionError(f"{name} must be >= {lo}, got {value}")
    return int(value)


def max_tokens_option(value: Any, unbounded: int) -> int:
    """A generation's ``max_tokens``: >= 0, or -1 for ``unbounded`` (until the context is
    full, or without end where a context policy makes room)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value < 0:
        if value != -1:
            raise errors.InvalidOptionError(f"max_tokens must be >= 0 or -1, got {value}")
        return unbounded
    return int_option("max_tokens", value, 0)


def flags(**given: Any) -> None:
    """Refuses a flag that is not a bool (a string "no" would count as true)."""
    for name, value in given.items():
        if not isinstance(value, (bool, np.bool_)):
            raise errors.InvalidOptionError(f"{name} must be True or False, got {value!r}")
