"""edgeinfer: run language models on the devices people already own.

>>> import edgeinfer
>>> with edgeinfer.load("model.gguf") as model:
...     for piece in model.stream("Once upon a time", max_tokens=32):
...         print(piece, end="")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgeinfer.errors import (
    ContextOverflowError,
    EdgeInferError,
    InvalidOptionError,
    ModelClosedError,
    ModelFileError,
    TemplateError,
    TokenizerError,
)

if TYPE_CHECKING:
    from edgeinfer.api import Completion, Model, load
    from edgeinfer.generation import GenerationStats
    from edgeinfer.sampling import Sampler, SamplingParams
    from edgeinfer.text_stream import TextStream

__version__ = "0.1.0"

# the API pulls in numpy, jinja2 and the tokenizer: import it on first use, so that
# `import edgeinfer.errors` or the CLI's `doctor` stay quick
_LAZY = {
    "Completion": "edgeinfer.api",
    "Model": "edgeinfer.api",
    "TextStream": "edgeinfer.text_stream",
    "load": "edgeinfer.api",
    "GenerationStats": "edgeinfer.generation",
    "Sampler": "edgeinfer.sampling",
    "SamplingParams": "edgeinfer.sampling",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgeinfer' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Completion",
    "ContextOverflowError",
    "EdgeInferError",
    "GenerationStats",
    "InvalidOptionError",
    "Model",
    "ModelClosedError",
    "ModelFileError",
    "Sampler",
    "SamplingParams",
    "TemplateError",
    "TextStream",
    "TokenizerError",
    "load",
]
