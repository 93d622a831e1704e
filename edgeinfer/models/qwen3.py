"""Qwen 3 (dense): no projection biases; each query and key head is RMS-normalised before
rotary embedding, and the head size is set explicitly (it need not be n_embd / n_head)."""

from __future__ import annotations

from edgeinfer.gguf import GGUFFile
from edgeinfer.models.base import Architecture, DecoderConfig, common_hparams, standard_layers

ARCH = "qwen3"


def config_from_gguf(gguf: GGUFFile) -> DecoderConfig:
    hp = common_hparams(gguf, ARCH)
    return DecoderConfig(
        **hp,
        rope_neox=True,
        activation="silu",
        layers=standard_layers(hp["n_layer"], qk_norm=True),
    )


ARCHITECTURE = Architecture(
    name=ARCH,
    config_from_gguf=config_from_gguf,
    chat_template="chatml",
    onnx_model_types=("qwen3",),
)
