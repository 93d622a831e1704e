"""GGUF ``llama``: LlamaForCausalLM (Llama 2, Llama 3.x, SmolLM and other Llama-shaped
models) and MistralForCausalLM, the same block under another name.

GGML's ``llama`` graph uses "normal" rotary embedding (adjacent values form a pair), while
Hugging Face pairs the two halves of each head: the query and key rows are permuted back.
Llama 3.1's rotary scaling becomes the ``rope_freqs.weight`` tensor of per-frequency divisors.

Mistral 7B v0.1 declares a sliding window of 4096: it is written as
``llama.attention.sliding_window`` (GGUF's window key, in tokens with the current one, as
Hugging Face counts them), and edgeinfer's runtime and ONNX export (GroupQueryAttention's
``local_window_size``) attend through it on every layer. llama.cpp writes no window for this
class and its ``llama`` loader reads none, so there the file attends to the whole context:
the same results up to the window's length.
"""

from __future__ import annotations

from typing import Any, ClassVar

from edgeinfer.converters.architectures.base import (
    ArchConverter,
    ConfigReader,
    HParams,
    MetadataItem,
    OnnxFamily,
    SourceTensor,
    check_activation,
    check_rope,
    common_metadata,
    kv,
    llama3_rope_factors,
    refuse,
    rope_parameters,
)
from edgeinfer.converters.hf_folder import HFCheckpoint
from edgeinfer.gguf.constants import ValueType
from edgeinfer.models import llama as runtime

ARCH = runtime.ARCH

DEFAULTS = {
    "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "tie_word_embeddings": False,
    "hidden_act": "silu",
}  # fmt: skip


class LlamaConverter(ArchConverter):
    hf_architectures = ("LlamaForCausalLM",)
    gguf_arch = ARCH
    genai_type = "llama"
    defaults: ClassVar[dict[str, Any]] = DEFAULTS

    def __init__(self, ckpt: HFCheckpoint) -> None:
        super().__init__(ckpt)
        cfg = ConfigReader(ckpt.config, self.where, self.defaults)
        self.hp = HParams.read(cfg, rope_parameters(ckpt.config, self.where, 10000.0))
        check_activation(self.hp, self.where, ("silu",))
        check_rope(self.hp, self.where, ("default", "linear", "llama3"))
        for key in ("attention_bias", "mlp_bias"):
            if cfg.get(key, False):
                raise refuse(self.where, f"{key} = true is not supported for {self.gguf_arch}")

    def metadata(self) -> list[MetadataItem]:
        hp, arch = self.hp, self.gguf_arch
        return common_metadata(arch, hp, head_dims=hp.head_dim_explicit) + [
            kv(f"{arch}.rope.dimension_count", ValueType.UINT32, hp.head_dim),
            kv(f"{arch}.vocab_size", ValueType.UINT32, hp.vocab_size),
        ]

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        return self.hp.standard_shapes()

    def rotary_heads(self, suffix: str) -> int:
        if suffix == "attn_q.weight":
            return self.hp.n_head
        if suffix == "attn_k.weight":
            return self.hp.n_head_kv
        return 0

    def extra_tensors(self) -> list[SourceTensor]:
        if self.hp.rope.kind != "llama3":
            return []
        factors = llama3_rope_factors(self.hp.rope, self.hp.head_dim)
        return [SourceTensor("rope_freqs.weight", factors.shape, values=factors)]


class MistralConverter(LlamaConverter):
    hf_architectures = ("MistralForCausalLM",)
    genai_type = "mistral"
    defaults: ClassVar[dict[str, Any]] = {**DEFAULTS, "max_position_embeddings": 32768}

    def __init__(self, ckpt: HFCheckpoint) -> None:
        super().__init__(ckpt)
        self.sliding_window = self._sliding_window(ckpt)
        if self.sliding_window:
            self.notes.append(
                f"sliding_window {self.sliding_window} is kept as {ARCH}.attention.sliding_window;"
                " llama.cpp reads no window for this architecture and attends to the whole "
                "context, so its results match up to that many tokens"
            )

    def _sliding_window(self, ckpt: HFCheckpoint) -> int:
        """Every layer's window; 0 when there is none (null) or it masks nothing (at least the
        context length)."""
        if ckpt.config.get("sliding_window") is None:
            return 0
        # a window of 0 would let a token attend to nothing, not even itself
        window = ConfigReader(ckpt.config, self.where, self.defaults).int("sliding_window", lo=1)
        return window if window < self.hp.context_length else 0

    def metadata(self) -> list[MetadataItem]:
        items = super().metadata()
        if self.sliding_window:
            key = f"{self.gguf_arch}.attention.sliding_window"
            items.append(kv(key, ValueType.UINT32, self.sliding_window))
        return items

    def layer_windows(self) -> tuple[int, ...]:
        return (self.sliding_window,) * self.hp.n_layer if self.sliding_window else ()

    def onnx_family(self) -> OnnxFamily:
        window = self.sliding_window
        every_layer = (True,) * self.hp.n_layer if window else ()
        return OnnxFamily(self.genai_type, sliding_window=window, swa_layers=every_layer)


# the Hugging Face classes written as GGUF ``llama``
CONVERTERS: tuple[type[ArchConverter], ...] = (LlamaConverter, MistralConverter)
