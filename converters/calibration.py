"""Activation statistics for ``--calib``: the mean square of every input column of every
matrix, measured by running a text through edgeinfer's own reference engine.

These are llama.cpp's "importance matrix" values: they weight each column's quantization
error when the fitter compares types, and they steer the quantizers' own searches
(``quantizers.quantize(..., weights=)``), as ``llama-quantize --imatrix`` does. Statistics are
keyed by GGUF tensor name, the names the engine itself uses, so no mapping is needed.

The source is first written as a temporary F16 GGUF (the engine runs GGUF files only), then
run in windows of ``n_ctx`` tokens; the engine keeps one dequantized matrix at a time. Saved
statistics (``.npz``) can be passed to ``--calib`` instead of a text.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.converters import errors

if TYPE_CHECKING:
    from edgeinfer.converters.convert import Conversion, Progress

CALIB_CTX = 512


class ActivationStats:
    """Per tensor: the sum of squares of each input column, and how many rows were seen."""

    def __init__(self) -> None:
        self.sums: dict[str, np.ndarray] = {}  # name -> (n_in,) float64
        self.counts: dict[str, int] = {}

    def add(self, name: str, x: np.ndarray) -> None:
        """``x``: (n_tokens, n_in), the activations entering matrix ``name``."""
        sq = np.square(x.astype(np.float64)).sum(axis=0)
        if name in self.sums:
            self.sums[name] += sq
            self.counts[name] += len(x)
        else:
            self.sums[name], self.counts[name] = sq, len(x)

    def importance(self, name: str, n_in: int) -> np.ndarray | None:
        """Mean square activation of each of the ``n_in`` columns, or None when unseen."""
        if name not in self.sums or not self.counts[name]:
            return None
        values = self.sums[name] / self.counts[name]
        if values.shape != (n_in,):
            raise errors.ConversionError(
                f"calibration statistics of {name!r} have {values.size} columns, the tensor {n_in}"
            )
        return values.astype(np.float32)

    def save(self, path: str | os.PathLike[str]) -> None:
        # Any: numpy types savez's keyword arrays as if one could be its allow_pickle flag
        arrays: dict[str, Any] = {f"sum:{k}": v for k, v in self.sums.items()}
        arrays.update({f"count:{k}": np.array(v) for k, v in self.counts.items()})
        np.savez(path, **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ActivationStats:
        stats = cls()
        try:
            with np.load(path, allow_pickle=False) as data:
                for key in data.files:
                    kind, _, name = key.partition(":")
                    if kind == "sum":
                        stats.sums[name] = data[key].astype(np.float64)
                    elif kind == "count":
                        stats.counts[name] = int(data[key])
        except (OSError, ValueError) as e:
            raise errors.SourceError(f"{path}: not a saved statistics file ({e})") from None
        if set(stats.sums) != set(stats.counts) or not all(
            v.ndim == 1 for v in stats.sums.values()
        ):
            raise errors.SourceError(f"{path}: statistics file is inconsistent")
        return stats


def collect_stats(
    conversion: Conversion,
    text: str,
    max_tokens: int = 4096,
    n_ctx: int = CALIB_CTX,
    workdir: Path | None = None,
    progress: Progress | None = None,
) -> ActivationStats:
    """Runs ``text`` (its first ``max_tokens`` tokens) through the source model."""
    from edgeinfer.converters.convert import ConvertOptions

    with tempfile.TemporaryDirectory(prefix=".edgeinfer-calib-", dir=workdir) as tmp:
        path = Path(tmp) / "source-f16.gguf"
        conversion.write_gguf(conversion.plan(ConvertOptions(type="f16")), path)
        return run_text(path, text, max_tokens, n_ctx, progress)


def run_text(
    gguf_path: Path, text: str, max_tokens: int, n_ctx: int = CALIB_CTX,
    progress: Progress | None = None,
) -> ActivationStats:  # fmt: skip
    """Statistics of the GGUF model at ``gguf_path`` over ``text``, window by window."""
    from edgeinfer.engines.reference import ReferenceEngine
    from edgeinfer.gguf import GGUFFile
    from edgeinfer.models import config_from_gguf
    from edgeinfer.tokenizer import Tokenizer

    class StatsEngine(ReferenceEngine):
        def linear(self, x, name, bias=None):
            stats.add(name, x)
            if name == cfg.output_tensor:
                x = x[-1:]  # the logits themselves are not needed: the last position's only
            return super().linear(x, name, bias)

        def matrix(self, name):
            parts = super().matrix(name)
            self._weights.pop(name, None)  # one dequantized matrix at a time
            return parts

    stats = ActivationStats()
    with GGUFFile(gguf_path) as gguf:
        cfg = config_from_gguf(gguf)
        tokens = Tokenizer.from_metadata(gguf.metadata).tokenize(text)[:max_tokens]
        if len(tokens) < 2:
            raise errors.ConversionError("the calibration text is too short (fewer than 2 tokens)")
        engine = StatsEngine(gguf, cfg, n_ctx, cache_type_k="f32", cache_type_v="f32")
        for start in range(0, len(tokens), n_ctx):
            if progress:
                progress("calibrate", start, len(tokens))
            window = tokens[start : start + n_ctx]
            engine.truncate(0)
            # every position reaches the output matrix, so that its statistics count every
            # token's activations (a 262k vocabulary would otherwise leave one per window)
            engine.forward(window, all_logits=True)
        if progress:
            progress("calibrate", len(tokens), len(tokens))
        del engine
    return stats
