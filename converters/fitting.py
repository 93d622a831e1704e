"""Mixed precision under a memory budget: measure each tensor's error in each candidate type,
then give the bytes to the tensors where they remove the most error.

Error of a tensor W in a type: the relative output error of the layer it belongs to,
``sum((W - Q(W))^2 * s) / sum(W^2 * s)`` over its rows, where ``s`` is the mean square of
the activations entering each column (from ``--calib``; 1 without). It is measured by
quantizing a sample of whole rows (rows are quantized independently, so a sample is exact
for the rows it holds). A tensor used twice (tied embedding and output) counts twice.

Choosing types is a multiple-choice knapsack; it is solved greedily on each tensor's lower
convex hull of (bytes, error): start every tensor at its cheapest type, then repeatedly take
the upgrade with the largest error reduction per byte that still fits. The result always
fits, since no step is taken that would not.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgeinfer import quants
from edgeinfer.converters import errors
from edgeinfer.converters.architectures.base import SourceTensor
from edgeinfer.converters.quantizers import quantize
from edgeinfer.converters.recipes import FLOAT_TYPES, fallback
from edgeinfer.gguf.constants import BLOCK_LAYOUTS, GGMLType

SAMPLE_ROWS = 256  # rows per tensor quantized to measure errors
ALIGNMENT = 32


def padded_nbytes(ggml_type: GGMLType, n_elements: int) -> int:
    """Bytes a tensor takes in a GGUF file, alignment padding included."""
    layout = BLOCK_LAYOUTS[ggml_type]
    n = n_elements // layout.block_size * layout.type_size
    return n + -n % ALIGNMENT


def sample_rows(t: SourceTensor, max_rows: int = SAMPLE_ROWS) -> np.ndarray:
    """Up to ``max_rows`` rows spread evenly over the tensor, read in whole row groups."""
    group = t.row_group
    n_groups = t.n_rows // group
    want = max(1, min(n_groups, -(-max_rows // group)))
    picks = np.unique(np.linspace(0, n_groups - 1, want).round().astype(int))
    return np.concatenate([t.rows(int(g) * group, group) for g in picks])


def quantization_error(
    rows: np.ndarray, ggml_type: GGMLType, importance: np.ndarray | None = None
) -> float:
    """Relative squared error of ``rows`` (n, row_length) after a round trip through
    ``ggml_type``, each column weighted by ``importance`` (mean square activation)."""
    if ggml_type == GGMLType.F32:
        return 0.0
    weights = importance if importance is not None and ggml_type not in FLOAT_TYPES else None
    raw = quantize(rows, ggml_type, weights=weights)
    back = quants.dequantize(raw.reshape(-1), ggml_type, rows.shape)
    s = np.ones(rows.shape[1]) if importance is None else importance.astype(np.float64)
    diff = (back.astype(np.float64) - rows) ** 2 @ s
    total = (rows.astype(np.float64) ** 2) @ s
    denom = float(total.sum())
    return float(diff.sum()) / denom if denom > 0 else 0.0


@dataclass(frozen=True)
class Option:
    ggml_type: GGMLType
    nbytes: int
    error: float


def options_for(
    t: SourceTensor,
    types: Sequence[GGMLType],
    importance: np.ndarray | None = None,
    max_rows: int = SAMPLE_ROWS,
    weight: float = 1.0,
) -> list[Option]:
    """The candidate types of one matrix (after row-length fallbacks), with bytes and error."""
    chosen = sorted(
        {fallback(ty, t.row_length) for ty in types}, key=lambda ty: padded_nbytes(ty, t.n_elements)
    )
    rows = sample_rows(t, max_rows)
    return [
        Option(
            ty, padded_nbytes(ty, t.n_elements), weight * quantization_error(rows, ty, importance)
        )
        for ty in chosen
    ]


def _hull(options: list[Option]) -> list[Option]:
    """The lower convex hull of (bytes, error), from the cheapest option up: the options a
    greedy upgrade sequence can usefully pass through."""
    pts: list[Option] = []
    for o in sorted(options, key=lambda o: (o.nbytes, o.error)):
        if pts and o.error >= pts[-1].error:
            continue  # costs more, no better
        if pts and o.nbytes == pts[-1].nbytes:
            pts.pop()
        while len(pts) >= 2:
            a, b = pts[-2], pts[-1]
            # drop b when the slope a->o is at least as steep as a->b
            if (a.error - o.error) * (b.nbytes - a.nbytes) >= (a.error - b.error) * (
                o.nbytes - a.nbytes
            ):
                pts.pop()
            else:
                break
        pts.append(o)
    return pts


def fit(options: dict[str, list[Option]], fixed_bytes: int, budget: int) -> dict[str, Option]:
    """One option per tensor, minimising total error with ``fixed_bytes`` + the tensors'
    bytes <= ``budget``. BudgetError (with the shortfall) when even the cheapest do not fit."""
    hulls = {name: _hull(opts) for name, opts in options.items()}
    step = {name: 0 for name in hulls}
    total = fixed_bytes + sum(h[0].nbytes for h in hulls.values())
    if total > budget:
        raise errors.BudgetError(
            f"nothing fits: the smallest plan needs {format_bytes(total)}, the budget is "
            f"{format_bytes(budget)} (short by {format_bytes(total - budget)})",
            needed=total, budget=budget,
        )  # fmt: skip
    heap: list[tuple[float, str]] = []

    def push(name: str) -> None:
        h, i = hulls[name], step[name]
        if i + 1 < len(h):
            gain = (h[i].error - h[i + 1].error) / (h[i + 1].nbytes - h[i].nbytes)
            heapq.heappush(heap, (-gain, name))

    for name in hulls:
        push(name)
    while heap:
        _, name = heapq.heappop(heap)
        h, i = hulls[name], step[name]
        extra = h[i + 1].nbytes - h[i].nbytes
        if total + extra > budget:
            continue  # this tensor's later steps cost even more: it stays where it is
        total += extra
        step[name] = i + 1
        push(name)
    return {name: hulls[name][step[name]] for name in hulls}


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"
