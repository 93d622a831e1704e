"""Llama 2/3, Mistral, SmolLM and other files of GGUF architecture ``llama``.

The converter permutes the query and key rows, so rotary embedding pairs adjacent values
(GGML's "normal" mode). Llama 3.1+ files carry per-dimension frequency factors.
"""

from __future__ import annotations

from edgeinfer.gguf import GGUFFile
from edgeinfer.models.base import Architecture, DecoderConfig, common_hparams, standard_layers

ARCH = "llama"


def config_from_gguf(gguf: GGUFFile) -> DecoderConfig:
    hp = common_hparams(gguf, ARCH)
    return DecoderConfig(
        **hp,
        rope_neox=False,
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
