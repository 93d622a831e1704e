"""Llama 2/3, Mistral, SmolLM and other files of GGUF architecture ``llama``.

The converter permutes the query and key rows, so rotary embedding pairs adjacent values
(GGML's "normal" mode). Llama 3.1+ files carry per-dimension frequency factors.

A file with ``llama.attention.sliding_window`` (Mistral 7B v0.1's 4096, written by edgeinfer's
converter) attends through that window on every layer, as the checkpoint was trained; the
layers keep the file's rope base and scaling. llama.cpp's ``llama`` architecture reads no
window and attends to the whole context, so the two agree up to the window's length.
"""

from __future__ import annotations

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

ARCH = "llama"


def sliding_window(gguf: GGUFFile, n_layer: int, n_ctx_train: int) -> int:
    """The window every layer attends through (tokens, the current one included); 0: full
    attention, as for a file without the key, a window of 0 (GGUF's "none") or one at least as
    long as the context the model was trained for (nothing there is that far back)."""
    window = Metadata(gguf, ARCH).int("attention.sliding_window", 0, lo=0, hi=1 << 24)
    if window >= n_ctx_train:
        return 0
    key = f"{ARCH}.attention.sliding_window_pattern"
    pattern = gguf.metadata.get(key)
    # every layer slides here: a pattern that says otherwise is refused, not run wrongly
    if window and pattern is not None and not (
        isinstance(pattern, np.ndarray) and pattern.dtype == bool
        and len(pattern) == n_layer and pattern.all()
    ):  # fmt: skip
        raise errors.UnsupportedModelError(
            f"{gguf.path}: {key} other than every layer is not supported for {ARCH}"
        )
    return window


def config_from_gguf(gguf: GGUFFile) -> DecoderConfig:
    hp = common_hparams(gguf, ARCH)
    window = sliding_window(gguf, hp["n_layer"], hp["n_ctx_train"])
    return DecoderConfig(
        **hp,
        rope_neox=False,
        rope_base_swa=hp["rope_base"],
        rope_freq_scale_swa=hp["rope_freq_scale"],
        sliding_window=window,
        swa_layers=(True,) * hp["n_layer"] if window else (),
        activation="silu",
        rope_freqs_tensor="rope_freqs.weight" if "rope_freqs.weight" in gguf.tensors else None,
        layers=standard_layers(hp["n_layer"]),
    )


ARCHITECTURE = Architecture(
    name=ARCH,
    config_from_gguf=config_from_gguf,
    chat_template="llama2",
    onnx_model_types=("llama", "mistral"),
)
