"""What the ONNX decoder computes, read from an architecture converter.

The architecture converters (``converters/architectures``) already read and check every
config.json value and name every tensor in GGUF terms; the ONNX graph is built from those
tensors and from :class:`DecoderSpec`. What differs between the families is small and
listed once in :data:`FAMILIES`; which optional tensors a layer has (biases, query/key norms,
Gemma's post-norms) follows from the tensor list itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgeinfer.converters import errors
from edgeinfer.converters.architectures import ArchConverter
from edgeinfer.converters.architectures.base import Rope, llama3_rope_factors
from edgeinfer.converters.architectures.gemma3 import Gemma3Converter
from edgeinfer.converters.architectures.llama import LlamaConverter
from edgeinfer.converters.architectures.mistral import MistralConverter
from edgeinfer.converters.architectures.qwen2 import Qwen2Converter
from edgeinfer.converters.architectures.qwen3 import Qwen3Converter

# Hugging Face activation -> the graph's (ONNX has no fused SiLU; FastGelu is the tanh form)
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


@dataclass(frozen=True)
class Family:
    """What one architecture family does that the tensors do not say."""

    genai_type: str  # onnxruntime-genai's model.type
    embed_scale: bool = False  # token embeddings are multiplied by sqrt(hidden_size)


FAMILIES: dict[type[ArchConverter], Family] = {
    LlamaConverter: Family("llama"),
    MistralConverter: Family("mistral"),
    Qwen2Converter: Family("qwen2"),
    Qwen3Converter: Family("qwen3"),
    Gemma3Converter: Family("gemma3_text", embed_scale=True),
}


@dataclass(frozen=True)
class DecoderSpec:
    """The decoder's hyper-parameters as the graph uses them."""

    genai_type: str
    n_vocab: int
    hidden_size: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    norm_eps: float
    activation: str  # "silu" or "gelu_tanh"
    context_length: int  # rows of the rotary tables: the longest sequence the graph runs
    inv_freq: np.ndarray  # (head_dim / 2,) float64, scaling applied
    inv_freq_swa: np.ndarray | None = None  # of the sliding-window layers, when they differ
    embed_scale: float = 1.0
    attn_scale: float = 0.0  # 0: 1 / sqrt(head_dim)
    sliding_window: int = 0
    swa_layers: tuple[bool, ...] = ()
    final_logit_softcap: float = 0.0

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim

    def uses_window(self, layer: int) -> bool:
        return bool(self.sliding_window) and bool(self.swa_layers) and self.swa_layers[layer]

    @classmethod
    def from_converter(
        cls, arch: ArchConverter, n_vocab: int, context_length: int | None = None
    ) -> DecoderSpec:
        family = FAMILIES.get(type(arch))
        if family is None:
            raise errors.UnsupportedArchitectureError(
                f"{arch.ckpt.folder}: {arch.hf_architectures[0]} has no ONNX export"
            )
        hp = arch.hp
        activation = ACTIVATIONS.get(hp.activation)
        if activation is None:
            raise errors.UnsupportedFeatureError(
                f"{arch.where}: activation {hp.activation!r} has no ONNX export"
            )
        window = getattr(hp, "sliding_window", 0)
        rope_swa: Rope | None = getattr(hp, "rope_swa", None) if window else None
        scalar = arch.ckpt.config.get("query_pre_attn_scalar")  # Gemma scales queries by it
        return cls(
            genai_type=family.genai_type,
            n_vocab=n_vocab,
            hidden_size=hp.hidden_size,
            n_layer=hp.n_layer,
            n_head=hp.n_head,
            n_head_kv=hp.n_head_kv,
            head_dim=hp.head_dim,
            norm_eps=hp.rms_norm_eps,
            activation=activation,
            context_length=context_length or hp.context_length,
            inv_freq=inverse_frequencies(hp.rope, hp.head_dim),
            inv_freq_swa=inverse_frequencies(rope_swa, hp.head_dim) if rope_swa else None,
            embed_scale=math.sqrt(hp.hidden_size) if family.embed_scale else 1.0,
            attn_scale=1.0 / math.sqrt(scalar) if isinstance(scalar, (int, float)) else 0.0,
            sliding_window=window,
            swa_layers=tuple(getattr(hp, "swa_layers", ())),
            final_logit_softcap=getattr(hp, "final_logit_softcapping", 0.0),
        )


def inverse_frequencies(rope: Rope, head_dim: int) -> np.ndarray:
    """Rotary frequencies of each dimension pair, with linear or Llama 3 scaling applied."""
    freqs = 1.0 / rope.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if rope.kind == "linear":
        freqs = freqs / rope.factor
    elif rope.kind == "llama3":
        freqs = freqs / llama3_rope_factors(rope, head_dim).astype(np.float64)
    elif rope.kind != "default":
        raise errors.UnsupportedFeatureError(f"rope scaling {rope.kind!r} has no ONNX export")
    return freqs


def rotary_tables(inv_freq: np.ndarray, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of every position's angles: two (n_positions, head_dim / 2) float32 tables,
    as GroupQueryAttention's ``cos_cache`` and ``sin_cache`` take them."""
    angles = np.arange(n_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
