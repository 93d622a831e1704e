"""Qwen3ForCausalLM (dense) -> GGUF ``qwen3``: no projection biases, an RMS norm on each query
and key head, and a head size set on its own (it need not be hidden_size / heads)."""

from __future__ import annotations

from typing import ClassVar

from edgeinfer.converters.architectures.base import (
    ArchConverter,
    ConfigReader,
    HParams,
    MetadataItem,
    check_activation,
    check_rope,
    common_metadata,
    refuse,
    rope_parameters,
)
from edgeinfer.converters.hf_folder import HFCheckpoint
from edgeinfer.models import qwen3 as runtime

ARCH = runtime.ARCH

DEFAULTS = {
    "rms_norm_eps": 1e-6, "max_position_embeddings": 40960, "tie_word_embeddings": False,
    "hidden_act": "silu",
}  # fmt: skip


class Qwen3Converter(ArchConverter):
    hf_architectures = ("Qwen3ForCausalLM",)
    gguf_arch = ARCH
    genai_type = "qwen3"
    LAYER_NAMES: ClassVar[dict[str, str]] = {
        **ArchConverter.LAYER_NAMES,
        "attn_q_norm.weight": "self_attn.q_norm.weight",
        "attn_k_norm.weight": "self_attn.k_norm.weight",
    }

    def __init__(self, ckpt: HFCheckpoint) -> None:
        super().__init__(ckpt)
        cfg = ConfigReader(ckpt.config, self.where, DEFAULTS)
        self.hp = HParams.read(cfg, rope_parameters(ckpt.config, self.where, 1000000.0))
        check_activation(self.hp, self.where, ("silu",))
        check_rope(self.hp, self.where, ("default", "linear"))
        for key in ("attention_bias", "use_sliding_window"):
            if cfg.get(key, False):
                raise refuse(self.where, f"{key} = true is not supported for qwen3")

    def metadata(self) -> list[MetadataItem]:
        return common_metadata(self.gguf_arch, self.hp, head_dims=True)

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        hd = self.hp.head_dim
        return {
            **self.hp.standard_shapes(),
            "attn_q_norm.weight": (hd,),
            "attn_k_norm.weight": (hd,),
        }


CONVERTERS: tuple[type[ArchConverter], ...] = (Qwen3Converter,)
