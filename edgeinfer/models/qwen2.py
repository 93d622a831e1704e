"""Qwen 2 and 2.5: the Llama block with biases on the query, key and value projections,
and NeoX-style rotary embedding (halves of the head rotate together)."""

from __future__ import annotations

from edgeinfer.gguf import GGUFFile
from edgeinfer.models.base import Architecture, DecoderConfig, common_hparams, standard_layers

ARCH = "qwen2"


def config_from_gguf(gguf: GGUFFile) -> DecoderConfig:
    hp = common_hparams(gguf, ARCH)
    return DecoderConfig(
        **hp,
        rope_neox=True,
        activation="silu",
        layers=standard_layers(hp["n_layer"], bias=True),
    )


ARCHITECTURE = Architecture(
    name=ARCH,
    config_from_gguf=config_from_gguf,
    chat_template="chatml",
    onnx_model_types=("qwen2",),
)
