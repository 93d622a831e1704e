"""What the ONNX decoder computes, read from an architecture converter.

The architecture converters (``converters/architectures``) already read and check every
config.json value and name every tensor in GGUF terms; the ONNX graph is built from those
tensors and from :class:`DecoderSpec`. What differs between the families is small and each
architecture's module says it in its converter's ``onnx_family()``; which optional tensors a
layer has (biases, query/key norms, Gemma's post-norms) follows from the tensor list itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeinfer.converters import errors
from edgeinfer.converters.architectures import ARCHITECTURES, ArchConverter
from edgeinfer.converters.architectures.base import Rope, llama3_rope_factors

# Hugging Face activation -> the graph's (ONNX has no fused SiLU; FastGelu is the tanh form)
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def onnx_architectures() -> set[str]:
    """The runtime architectures the export writes: those with a converter that has a family."""
    return {arch for arch, classes in ARCHITECTURES.items() for cls in classes if cls.genai_type}


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
        family = arch.onnx_family()
        if family is None:
            raise errors.UnsupportedArchitectureError(
                f"{arch.ckpt.folder}: {arch.hf_architectures[0]} has no ONNX export "
                f"(exported: {', '.join(sorted(onnx_architectures()))})"
            )
        hp = arch.hp
        activation = ACTIVATIONS.get(hp.activation)
        if activation is None:
            raise errors.UnsupportedFeatureError(
                f"{arch.where}: activation {hp.activation!r} has no ONNX export"
            )
        rope_swa = family.rope_swa
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
            embed_scale=family.embed_scale,
            attn_scale=family.attn_scale,
            sliding_window=family.sliding_window,
            swa_layers=family.swa_layers,
            final_logit_softcap=family.final_logit_softcap,
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
