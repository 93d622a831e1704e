"""Gemma 3 (text).

Differences from the Llama block: embeddings scaled by sqrt(n_embd); RMS norms after the
attention and the FFN as well as before (GGUF norm weights already include Gemma's +1);
per-head query/key norms; GELU (tanh form) gating; NeoX rotary embedding; and five of every
six layers attend through a sliding window with their own rope base (10,000 unless the file
says otherwise), while every sixth layer is global.
"""

from __future__ import annotations

import math

import numpy as np

from edgeinfer import errors
from edgeinfer.gguf import GGUFFile
from edgeinfer.models.base import (
    Architecture,
    DecoderConfig,
    Metadata,
    common_hparams,
    standard_layers,
)

ARCH = "gemma3"
SWA_PATTERN = 6  # every sixth layer is global


def query_pre_attn_scalar(n_layer: int, n_embd: int, n_head: int, head_dim: int) -> float:
    """The number whose inverse square root scales Gemma 3's queries (config.json's
    ``query_pre_attn_scalar``). GGUF files do not store it, so it is derived as GGML does: the
    hidden size per head on the 62-layer 27B model, the head size on every other size. The
    converters refuse a checkpoint whose value differs, so files and runtime agree."""
    return n_embd / n_head if n_layer == 62 else float(head_dim)


def query_scale(n_layer: int, n_embd: int, n_head: int, head_dim: int) -> float:
    """The factor Gemma 3's queries are multiplied by before attention (every engine and the
    ONNX export use this one rule)."""
    return 1.0 / math.sqrt(query_pre_attn_scalar(n_layer, n_embd, n_head, head_dim))


def _swa_layers(gguf: GGUFFile, md: Metadata, n_layer: int) -> tuple[bool, ...]:
    pattern = gguf.metadata.get(f"{ARCH}.attention.sliding_window_pattern")
    if isinstance(pattern, np.ndarray):
        if len(pattern) != n_layer:
            raise errors.AbsurdValueError(
                f"{gguf.path}: sliding_window_pattern has {len(pattern)} entries "
                f"for {n_layer} layers"
            )
        return tuple(bool(x) for x in pattern)
    n = md.int("attention.sliding_window_pattern", SWA_PATTERN, lo=0)
    return tuple(n == 0 or il % n < n - 1 for il in range(n_layer))


def config_from_gguf(gguf: GGUFFile) -> DecoderConfig:
    hp = common_hparams(gguf, ARCH)
    md = Metadata(gguf, ARCH)
    n_layer = hp["n_layer"]
    window = md.int("attention.sliding_window", 0, lo=0, hi=1 << 24)
    return DecoderConfig(
        **hp,
        rope_neox=True,
        rope_base_swa=md.float("rope.freq_base_swa", 10000.0),
        sliding_window=window,
        swa_layers=_swa_layers(gguf, md, n_layer) if window else (),
        embed_scale=math.sqrt(hp["n_embd"]),
        attn_scale=query_scale(n_layer, hp["n_embd"], hp["n_head"], hp["head_dim"]),
        scale_q=True,
        activation="gelu",
        final_logit_softcap=md.float("final_logit_softcapping", 0.0),
        layers=standard_layers(n_layer, qk_norm=True, post_norms=True),
    )


ARCHITECTURE = Architecture(
    name=ARCH,
    config_from_gguf=config_from_gguf,
    chat_template="gemma",
    onnx_model_types=("gemma3_text", "gemma3"),
)
