"""The converter side of each runtime architecture: one module per architecture, named and
keyed as in ``edgeinfer.models``. Each module lists the converters of the Hugging Face classes
written as its architecture; a class that is only a converter's name (``MistralForCausalLM``)
is mapped to its runtime architecture (``llama``) there and nowhere else. Anything else is
refused by name."""

from __future__ import annotations

from edgeinfer.converters import errors
from edgeinfer.converters.architectures import gemma3, llama, qwen2, qwen3
from edgeinfer.converters.architectures.base import ArchConverter, OnnxFamily, SourceTensor
from edgeinfer.converters.hf_folder import HFCheckpoint

# runtime architecture -> the converters of the Hugging Face classes it is written from
ARCHITECTURES: dict[str, tuple[type[ArchConverter], ...]] = {
    m.ARCH: m.CONVERTERS for m in (llama, qwen2, qwen3, gemma3)
}
# Hugging Face class (config.json "architectures") -> its converter
CONVERTERS: dict[str, type[ArchConverter]] = {
    name: cls
    for classes in ARCHITECTURES.values()
    for cls in classes
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


__all__ = [
    "ARCHITECTURES",
    "CONVERTERS",
    "ArchConverter",
    "OnnxFamily",
    "SourceTensor",
    "converter_for",
]
