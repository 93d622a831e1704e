"""The native engine's registry entry. The engine itself, like everything that touches the
native library, lives in :mod:`edgeinfer._native`, the one place where Python meets C."""

from __future__ import annotations

from edgeinfer._native import NativeEngine
from edgeinfer.engines.base import EngineOptions
from edgeinfer.gguf import GGUFFile
from edgeinfer.models.base import DecoderConfig


def open_engine(gguf: GGUFFile, cfg: DecoderConfig, options: EngineOptions) -> NativeEngine:
    return NativeEngine(
        gguf, cfg, options.n_ctx, n_threads=options.n_threads,
        cache_type_k=options.cache_type_k, cache_type_v=options.cache_type_v, isa=options.isa,
        n_batch=options.n_batch, n_seq_max=options.n_seq_max, swa_full=options.swa_full,
        kv_budget=options.kv_budget, track_attention=options.track_attention,
        kivi_group=options.kivi_group, kivi_residual=options.kivi_residual,
        fixed_threads=options.fixed_threads, n_gpu_layers=options.n_gpu_layers,
        gpu_device=options.gpu_device,
    )  # fmt: skip


__all__ = ["NativeEngine", "open_engine"]
