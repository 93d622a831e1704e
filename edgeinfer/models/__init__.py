"""One module per architecture; each turns a GGUF file into a DecoderConfig."""

from __future__ import annotations

from types import ModuleType

from edgeinfer import errors
from edgeinfer.gguf import GGUFFile
from edgeinfer.models import gemma3, llama, qwen2, qwen3
from edgeinfer.models.base import DecoderConfig, LayerTensors, check_tensors

ARCHITECTURES: dict[str, ModuleType] = {m.ARCH: m for m in (llama, qwen2, qwen3, gemma3)}


def config_from_gguf(gguf: GGUFFile) -> DecoderConfig:
    """Builds and checks the config of a parsed GGUF file, raising typed errors."""
    arch = gguf.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise errors.MissingKeyError(f"{gguf.path}: required key 'general.architecture' is missing")
    module = ARCHITECTURES.get(arch)
    if module is None:
        raise errors.UnknownArchitectureError(
            f"{gguf.path}: architecture {arch!r} is not supported "
            f"(supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    cfg = module.config_from_gguf(gguf)
    check_tensors(gguf, cfg)
    return cfg


__all__ = ["ARCHITECTURES", "DecoderConfig", "LayerTensors", "config_from_gguf"]
