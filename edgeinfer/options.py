"""Checks of caller-given options, shared by the API's entry points: a wrong type or a
value out of range is an InvalidOptionError naming the option, never a silent conversion."""

from __future__ import annotations

import re
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


_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
          "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}  # fmt: skip


def parse_size(
    text: str | int, error: type[errors.InvalidOptionError] = errors.InvalidOptionError
) -> int:
    """Bytes from "8GiB", "1.5 GB", "512M" or a plain number of bytes; ``error`` for a size
    that cannot be read or is not positive."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise error(f"memory size must be positive, not {text}")
        return text
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise error(f"cannot read {text!r} as a memory size (e.g. 4GiB, 1.5GB, 800MB)")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise error(f"memory size {text!r} must be positive")
    return value
