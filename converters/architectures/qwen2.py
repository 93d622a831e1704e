"""Qwen2ForCausalLM (Qwen 2, 2.5) -> GGUF ``qwen2``: the Llama block with biases on the query,
key and value projections and NeoX rotary embedding (no row permutation)."""

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
from edgeinfer.models import qwen2 as runtime

ARCH = runtime.ARCH

DEFAULTS = {
    "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "tie_word_embeddings": False,
    "hidden_act": "silu",
}  # fmt: skip


class Qwen2Converter(ArchConverter):
    hf_architectures = ("Qwen2ForCausalLM",)
    gguf_arch = ARCH
    genai_type = "qwen2"
    LAYER_NAMES: ClassVar[dict[str, str]] = {
        **ArchConverter.LAYER_NAMES,
        "attn_q.bias": "self_attn.q_proj.bias",
        "attn_k.bias": "self_attn.k_proj.bias",
        "attn_v.bias": "self_attn.v_proj.bias",
    }

    def __init__(self, ckpt: HFCheckpoint) -> None:
        super().__init__(ckpt)
        cfg = ConfigReader(ckpt.config, self.where, DEFAULTS)
        self.hp = HParams.read(cfg, rope_parameters(ckpt.config, self.where, 10000.0))
        check_activation(self.hp, self.where, ("silu",))
        check_rope(self.hp, self.where, ("default", "linear"))
        if cfg.get("use_sliding_window", False):
            raise refuse(self.where, "use_sliding_window = true is not supported for qwen2")

    def metadata(self) -> list[MetadataItem]:
        return common_metadata(self.gguf_arch, self.hp, head_dims=False)

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        hp = self.hp
        q, kv_ = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        return {
            **hp.standard_shapes(),
            "attn_q.bias": (q,),
            "attn_k.bias": (kv_,),
            "attn_v.bias": (kv_,),
        }


CONVERTERS: tuple[type[ArchConverter], ...] = (Qwen2Converter,)
