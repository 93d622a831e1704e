"""One module per architecture; each turns a GGUF file into a DecoderConfig and describes
itself in one :class:`Architecture` entry of :data:`ARCHITECTURES`."""

from __future__ import annotations

import re

from edgeinfer import errors
from edgeinfer.gguf import GGUFFile
from edgeinfer.models import gemma3, llama, qwen2, qwen3
from edgeinfer.models.base import Architecture, DecoderConfig, LayerTensors, check_tensors

# GGUF general.architecture -> its entry; the converters keep a registry of the same names
ARCHITECTURES: dict[str, Architecture] = {
    m.ARCHITECTURE.name: m.ARCHITECTURE for m in (llama, qwen2, qwen3, gemma3)
}
# onnxruntime-genai model.type -> the architecture such a folder runs as
ONNX_MODEL_TYPES: dict[str, str] = {
    model_type: arch.name for arch in ARCHITECTURES.values() for model_type in arch.onnx_model_types
}


def architecture(name: str, where: object = "") -> Architecture:
    """The entry of architecture ``name``; UnknownArchitectureError naming the supported ones."""
    found = ARCHITECTURES.get(name)
    if found is None:
        prefix = f"{where}: " if where else ""
        raise errors.UnknownArchitectureError(
            f"{prefix}architecture {name!r} is not supported "
            f"(supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    return found


def config_from_gguf(gguf: GGUFFile) -> DecoderConfig:
    """Builds and checks the config of a parsed GGUF file, raising typed errors."""
    arch = gguf.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise errors.MissingKeyError(f"{gguf.path}: required key 'general.architecture' is missing")
    cfg = architecture(arch, gguf.path).config_from_gguf(gguf)
    check_tensors(gguf, cfg)
    check_no_unused_layers(gguf, cfg)
    return cfg


_LAYER_TENSOR = re.compile(r"blk\.([0-9]+)\.", re.ASCII)


def check_no_unused_layers(gguf: GGUFFile, cfg: DecoderConfig) -> None:
    """A ``blk.N.*`` tensor with N >= block_count would be ignored; llama.cpp refuses such a
    file ("wrong number of tensors"), since it means the key or the tensors are wrong."""
    for name in gguf.tensors:
        match = _LAYER_TENSOR.match(name)
        # more than 9 digits is past any block_count (and int() refuses 4,300 digits)
        if match and (len(match.group(1)) > 9 or int(match.group(1)) >= cfg.n_layer):
            raise errors.UnusedTensorError(
                f"{gguf.path}: tensor {name!r} belongs to layer {match.group(1)}, but "
                f"{cfg.arch}.block_count is {cfg.n_layer}: the file has more layers than it says"
            )


__all__ = [
    "ARCHITECTURES",
    "ONNX_MODEL_TYPES",
    "Architecture",
    "DecoderConfig",
    "LayerTensors",
    "architecture",
    "check_no_unused_layers",
    "config_from_gguf",
]
