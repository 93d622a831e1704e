"""Hugging Face checkpoint conversion: to a GGUF file, or to an ONNX folder that
onnxruntime-genai runs (``onnx/``).

>>> from edgeinfer.converters import ConvertOptions, convert
>>> plan = convert("Qwen2.5-0.5B-Instruct/", "qwen.gguf", ConvertOptions(type="q4_k_m"))
>>> convert("Qwen2.5-0.5B-Instruct/", "qwen-onnx/", ConvertOptions(type="int4"))

:class:`~edgeinfer.converters.convert.Conversion` opens and checks a folder without reading
weights; ``plan()`` chooses each tensor's type (a llama.cpp mix, or fitted to a memory
budget); ``write_gguf()`` streams the tensors into the file. An output that does not end in
``.gguf`` (or ``format="onnx"``) is exported by :mod:`.onnx` from the same checked folder.
Every HF name lives in ``architectures/``; everything after that speaks GGUF names, as the
runtime does.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "Conversion": "edgeinfer.converters.convert",
    "ConvertOptions": "edgeinfer.converters.convert",
    "Plan": "edgeinfer.converters.convert",
    "convert": "edgeinfer.converters.convert",
    "plan_conversion": "edgeinfer.converters.convert",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgeinfer.converters' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = ["Conversion", "ConvertOptions", "Plan", "convert", "plan_conversion"]
