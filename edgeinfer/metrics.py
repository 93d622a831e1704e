"""Counters and histograms of a running service (the batcher's traffic), kept without any
dependency and rendered as Prometheus text by whoever serves them (apps/server.py).

A :class:`Histogram` has fixed bucket bounds, as Prometheus histograms do: an observation
adds one to the first bucket whose bound it does not exceed, so that quantiles can be
estimated from the counts, and the exact sum and count are kept beside them.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

# seconds: from a millisecond (one decoding step of a small model) to ten minutes
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
)  # fmt: skip
# tokens one engine step evaluates
STEP_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class Histogram:
    """Observations counted into buckets (cumulative when read, as Prometheus wants)."""

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError("histogram bounds must be distinct and ascending")
        self.bounds = tuple(float(b) for b in bounds)
        self._counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self.count = 0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        if not math.isfinite(value):
            return
        with self._lock:
            self._counts[bisect.bisect_left(self.bounds, value)] += 1
            self.sum += value
            self.count += 1

    def snapshot(self) -> tuple[list[tuple[float, int]], float, int]:
        """At one instant: (upper bound, observations at or below it) for each bucket, +Inf
        last; the sum; the count."""
        with self._lock:
            out, total = [], 0
            for bound, n in zip((*self.bounds, math.inf), self._counts, strict=True):
                total += n
                out.append((bound, total))
            return out, self.sum, self.count


@dataclass
class MetricFamily:
    """One metric for the exposition: its name, help, type and samples (labels, value)."""

    name: str
    help: str
    kind: str  # "counter", "gauge" or "histogram"
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)
    histogram: Histogram | None = None


def _value(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""

    def escape(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    escaped = (f'{k}="{escape(v)}"' for k, v in labels.items())
    return "{" + ",".join(escaped) + "}"


def prometheus_text(families: Sequence[MetricFamily]) -> str:
    """The text exposition format (version 0.0.4) of ``families``."""
    lines: list[str] = []
    for f in families:
        lines.append(f"# HELP {f.name} {f.help}")
        lines.append(f"# TYPE {f.name} {f.kind}")
        if f.histogram is not None:
            buckets, total, count = f.histogram.snapshot()
            for bound, n in buckets:
                lines.append(f'{f.name}_bucket{{le="{_value(bound)}"}} {n}')
            lines.append(f"{f.name}_sum {_value(total)}")
            lines.append(f"{f.name}_count {count}")
            continue
        for labels, value in f.samples:
            lines.append(f"{f.name}{_labels(labels)} {_value(value)}")
    return "\n".join(lines) + "\n"
