"""Gemma3ForCausalLM (text only) -> GGUF ``gemma3``.

GGUF differs from the checkpoint in three ways: norm weights carry Gemma's +1 (HF computes
``x * (1 + w)``), the embedding keeps only the rows the tokenizer has, and which layers slide
is written per layer. Rotary embedding is NeoX-style, so no rows are permuted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from edgeinfer.converters.architectures.base import (
    ArchConverter,
    ConfigReader,
    HParams,
    MetadataItem,
    OnnxFamily,
    Rope,
    check_activation,
    check_rope,
    common_metadata,
    kv,
    refuse,
    rope_parameters,
)
from edgeinfer.converters.hf_folder import HFCheckpoint
from edgeinfer.gguf.constants import ValueType
from edgeinfer.models import gemma3 as runtime

ARCH = runtime.ARCH

DEFAULTS = {
    "rms_norm_eps": 1e-6, "max_position_embeddings": 131072, "tie_word_embeddings": True,
    "hidden_activation": "gelu_pytorch_tanh", "head_dim": 256, "num_attention_heads": 8,
    "num_key_value_heads": 4, "query_pre_attn_scalar": 256,
}  # fmt: skip
SLIDING_WINDOW_PATTERN = 6  # older configs: every sixth layer is global
SWA_THETA = 10000.0


@dataclass(frozen=True)
class Gemma3HParams(HParams):
    sliding_window: int = 0
    swa_layers: tuple[bool, ...] = ()
    rope_swa: Rope = field(default_factory=lambda: Rope(SWA_THETA))
    final_logit_softcapping: float = 0.0


class Gemma3Converter(ArchConverter):
    hf_architectures = ("Gemma3ForCausalLM",)
    gguf_arch = ARCH
    hp: Gemma3HParams
    genai_type: ClassVar[str] = "gemma3_text"
    crop_vocab = True  # llama.cpp's files keep only the tokenizer's rows of the embedding
    LAYER_NAMES: ClassVar[dict[str, str]] = {
        "attn_norm.weight": "input_layernorm.weight",
        "attn_q.weight": "self_attn.q_proj.weight",
        "attn_k.weight": "self_attn.k_proj.weight",
        "attn_v.weight": "self_attn.v_proj.weight",
        "attn_output.weight": "self_attn.o_proj.weight",
        "attn_q_norm.weight": "self_attn.q_norm.weight",
        "attn_k_norm.weight": "self_attn.k_norm.weight",
        "post_attention_norm.weight": "post_attention_layernorm.weight",
        "ffn_norm.weight": "pre_feedforward_layernorm.weight",
        "ffn_gate.weight": "mlp.gate_proj.weight",
        "ffn_up.weight": "mlp.up_proj.weight",
        "ffn_down.weight": "mlp.down_proj.weight",
        "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    }

    def __init__(self, ckpt: HFCheckpoint) -> None:
        super().__init__(ckpt)
        config = ckpt.config
        cfg = ConfigReader(config, self.where, DEFAULTS)
        ropes = rope_parameters(config, self.where, 1000000.0)
        n_layer = cfg.int("num_hidden_layers", hi=4096)
        window = cfg.int("sliding_window", 0, lo=0) if config.get("sliding_window") else 0
        swa_layers = self._swa_layers(cfg, n_layer) if window else ()
        if window and not any(swa_layers):
            window = 0
        softcap = cfg.float("final_logit_softcapping", 0.0)
        self.hp = Gemma3HParams.read(
            cfg, ropes, activation_key="hidden_activation",
            sliding_window=window, swa_layers=swa_layers if window else (),
            rope_swa=ropes.get("sliding_attention", Rope(SWA_THETA)),
            final_logit_softcapping=softcap,
        )  # fmt: skip
        check_activation(self.hp, self.where, ("gelu_pytorch_tanh",))
        check_rope(self.hp, self.where, ("default", "linear"))
        if self.hp.rope.kind == "linear":
            self.notes.append(
                f"rope scaling x{self.hp.rope.factor:g} is meant for the global layers only; "
                "llama.cpp applies it so, edgeinfer's runtime to every layer"
            )
        if self.hp.rope_swa.kind != "default":
            raise refuse(self.where, "rope scaling on the sliding-window layers is not supported")
        for key in ("attn_logit_softcapping", "use_bidirectional_attention", "attention_bias"):
            if config.get(key):
                raise refuse(self.where, f"{key} = {config[key]!r} is not supported for gemma3")
        # GGUF files do not store the scalar: the runtime derives it, and a file must agree
        hp = self.hp
        expected = runtime.query_pre_attn_scalar(hp.n_layer, hp.hidden_size, hp.n_head, hp.head_dim)
        scalar = cfg.float("query_pre_attn_scalar")
        if scalar != expected:
            raise refuse(
                self.where,
                f"query_pre_attn_scalar = {scalar:g}, but GGUF gemma3 files scale by {expected:g}",
            )

    def _swa_layers(self, cfg: ConfigReader, n_layer: int) -> tuple[bool, ...]:
        types = cfg.config.get("layer_types")
        if types is not None:
            if (
                not isinstance(types, list) or len(types) != n_layer
                or not all(isinstance(t, str) for t in types)
            ):  # fmt: skip
                raise refuse(self.where, f"layer_types must list {n_layer} layer types")
            unknown = set(types) - {"sliding_attention", "full_attention"}
            if unknown:
                raise refuse(self.where, f"unknown layer type {min(unknown)!r}")
            return tuple(t == "sliding_attention" for t in types)
        n = cfg.int("sliding_window_pattern", SLIDING_WINDOW_PATTERN, lo=1)
        return tuple(il % n < n - 1 for il in range(n_layer))

    def metadata(self) -> list[MetadataItem]:
        hp, arch = self.hp, self.gguf_arch
        items = common_metadata(arch, hp, head_dims=True)
        if hp.sliding_window:
            items += [
                kv(f"{arch}.attention.sliding_window", ValueType.UINT32, hp.sliding_window),
                kv(f"{arch}.attention.sliding_window_pattern", ValueType.ARRAY,
                   list(hp.swa_layers), ValueType.BOOL),
                kv(f"{arch}.rope.freq_base_swa", ValueType.FLOAT32, hp.rope_swa.theta),
            ]  # fmt: skip
        if hp.final_logit_softcapping:
            items.append(
                kv(f"{arch}.final_logit_softcapping", ValueType.FLOAT32, hp.final_logit_softcapping)
            )
        return items

    def layer_windows(self) -> tuple[int, ...]:
        hp = self.hp
        return tuple(hp.sliding_window if swa else 0 for swa in hp.swa_layers)

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        hp = self.hp
        e, hd = hp.hidden_size, hp.head_dim
        return {
            **hp.standard_shapes(),
            "attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,),
            "post_attention_norm.weight": (e,), "post_ffw_norm.weight": (e,),
        }  # fmt: skip

    def norm_shift(self, suffix: str) -> float:
        return 1.0 if suffix.endswith("norm.weight") else 0.0

    def onnx_family(self) -> OnnxFamily:
        hp = self.hp
        return OnnxFamily(
            self.genai_type,
            embed_scale=math.sqrt(hp.hidden_size),
            attn_scale=runtime.query_scale(hp.n_layer, hp.hidden_size, hp.n_head, hp.head_dim),
            sliding_window=hp.sliding_window,
            swa_layers=hp.swa_layers,
            rope_swa=hp.rope_swa if hp.sliding_window else None,
            final_logit_softcap=hp.final_logit_softcapping,
        )


CONVERTERS: tuple[type[ArchConverter], ...] = (Gemma3Converter,)
