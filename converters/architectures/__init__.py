"""One converter per Hugging Face architecture; anything else is refused by name."""

from __future__ import annotations

from edgeinfer.converters import errors
from edgeinfer.converters.architectures.base import ArchConverter, SourceTensor
from edgeinfer.converters.architectures.gemma3 import Gemma3Converter
from edgeinfer.converters.architectures.llama import LlamaConverter
from edgeinfer.converters.architectures.mistral import MistralConverter
from edgeinfer.converters.architectures.qwen2 import Qwen2Converter
from edgeinfer.converters.architectures.qwen3 import Qwen3Converter
from edgeinfer.converters.hf_folder import HFCheckpoint

CONVERTERS: dict[str, type[ArchConverter]] = {
    name: cls
    for cls in (LlamaConverter, MistralConverter, Qwen2Converter, Qwen3Converter, Gemma3Converter)
    for name in cls.hf_architectures
}


def converter_for(ckpt: HFCheckpoint) -> ArchConverter:
    """The converter of the checkpoint's architecture; UnsupportedArchitectureError otherwise."""
    arch = ckpt.architecture
    cls = CONVERTERS.get(arch)
    if cls is None:
        raise errors.UnsupportedArchitectureError(
            f"{ckpt.folder}: architecture {arch!r} cannot be converted "
            f"(supported: {', '.join(sorted(CONVERTERS))})"
        )
    return cls(ckpt)


__all__ = ["CONVERTERS", "ArchConverter", "SourceTensor", "converter_for"]
