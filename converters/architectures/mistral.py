"""MistralForCausalLM -> GGUF ``llama``: the Llama block under another name.

Mistral 7B v0.1 declares a sliding window of 4096; like llama.cpp's converter, the GGUF
``llama`` architecture has no window, so the file attends to the whole context (identical
results up to the window's length).
"""

from __future__ import annotations

from typing import Any, ClassVar

from edgeinfer.converters.architectures.llama import DEFAULTS, LlamaConverter
from edgeinfer.converters.hf_folder import HFCheckpoint


class MistralConverter(LlamaConverter):
    hf_architectures = ("MistralForCausalLM",)
    defaults: ClassVar[dict[str, Any]] = {**DEFAULTS, "max_position_embeddings": 32768}

    def __init__(self, ckpt: HFCheckpoint) -> None:
        super().__init__(ckpt)
        window = ckpt.config.get("sliding_window")
        if isinstance(window, int) and 0 < window < self.hp.context_length:
            self.notes.append(
                f"sliding_window {window} is not kept: the file attends to the whole context "
                "(as llama.cpp's converter does); results match up to that many tokens"
            )
