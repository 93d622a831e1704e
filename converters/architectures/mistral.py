"""MistralForCausalLM -> GGUF ``llama``: the Llama block under another name.

Mistral 7B v0.1 declares a sliding window of 4096; like llama.cpp's converter, the GGUF
``llama`` architecture has no window, so the file attends to the whole context (identical
results up to the window's length).
"""

from __future__ import annotations

from edgeinfer.converters.architectures.llama import DEFAULTS, LlamaConverter


class MistralConverter(LlamaConverter):
    hf_architectures = ("MistralForCausalLM",)
    defaults = {**DEFAULTS, "max_position_embeddings": 32768}
