"""What every decoder architecture shares: its registry entry, the config every engine reads,
and key lookup.

Each architecture module turns a GGUF file into a :class:`DecoderConfig` and describes itself
in one :class:`Architecture` entry. The config says what the forward pass does in explicit
fields (which norms exist, which activation, which layers use a sliding window), so that the
engines need no ``if arch == ...`` branches.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeinfer import errors
from edgeinfer.gguf import COMPUTE_TYPES, GGUFFile, ValueType

_INT_TYPES = {
    ValueType.UINT8, ValueType.INT8, ValueType.UINT16, ValueType.INT16,
    ValueType.UINT32, ValueType.INT32, ValueType.UINT64, ValueType.INT64,
}  # fmt: skip
_FLOAT_TYPES = {ValueType.FLOAT32, ValueType.FLOAT64}
MAX_DIM = 1 << 20  # larger than any real hidden size, head count or layer count


@dataclass(frozen=True)
class LayerTensors:
    """GGUF tensor names of one decoder layer; ``None`` where the architecture has none."""

    attn_norm: str
    wq: str
    wk: str
    wv: str
    wo: str
    ffn_norm: str
    ffn_gate: str
    ffn_up: str
    ffn_down: str
    bq: str | None = None
    bk: str | None = None
    bv: str | None = None
    q_norm: str | None = None
    k_norm: str | None = None
    attn_post_norm: str | None = None
    ffn_post_norm: str | None = None


@dataclass(frozen=True)
class DecoderConfig:
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int  # per-head size of queries and keys
    head_dim_v: int  # per-head size of values
    n_ff: int
    norm_eps: float
    rope_neox: bool  # rotate (x[i], x[i + n_rot/2]) rather than (x[2i], x[2i+1])
    n_rot: int
    rope_base: float
    rope_freq_scale: float = 1.0
    rope_base_swa: float = 10000.0  # rope base of the sliding-window layers
    # rope scaling of the sliding-window layers: none by default, as llama.cpp reads Gemma 3
    # (the file's scaling is for its global layers)
    rope_freq_scale_swa: float = 1.0
    sliding_window: int = 0  # 0: no sliding-window layers
    swa_layers: tuple[bool, ...] = ()  # per layer: uses the sliding window
    embed_scale: float = 1.0  # token embeddings are multiplied by this
    attn_scale: float = 0.0  # 0: 1/sqrt(head_dim)
    scale_q: bool = False  # apply attn_scale to the queries (Gemma) rather than to the scores
    activation: str = "silu"  # gate activation of the gated FFN: "silu" or "gelu"
    final_logit_softcap: float = 0.0
    output_tensor: str = "output.weight"  # "token_embd.weight" when tied
    rope_freqs_tensor: str | None = None  # llama3-style per-dimension frequency factors
    layers: tuple[LayerTensors, ...] = field(default=(), repr=False)

    @property
    def kq_scale(self) -> float:
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)

    def is_swa(self, il: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[il]

    def layer_rope_base(self, il: int) -> float:
        return self.rope_base_swa if self.is_swa(il) else self.rope_base

    def layer_rope_scale(self, il: int) -> float:
        return self.rope_freq_scale_swa if self.is_swa(il) else self.rope_freq_scale

    def layer_window(self, il: int) -> int:
        return self.sliding_window if self.is_swa(il) else 0

    def n_params(self, gguf: GGUFFile) -> int:
        return sum(t.n_elements for t in gguf.tensors.values())


@dataclass(frozen=True)
class Architecture:
    """One runtime architecture: everything the runtime knows about it by name.

    The converters (``converters/architectures``) keep an entry of the same ``name`` with the
    Hugging Face side; a test checks that both registries list the same architectures.
    """

    name: str  # GGUF ``general.architecture``
    config_from_gguf: Callable[[GGUFFile], DecoderConfig]
    # the built-in chat template (edgeinfer.chat) used when the vocabulary names none
    chat_template: str
    # onnxruntime-genai ``model.type`` values of folders that run as this architecture
    onnx_model_types: tuple[str, ...]


class Metadata:
    """Typed access to an architecture's GGUF keys, with errors that name the key."""

    def __init__(self, gguf: GGUFFile, arch: str) -> None:
        self.gguf, self.arch = gguf, arch

    def _get(self, key: str, kinds: set[ValueType], what: str, default: Any) -> Any:
        md = self.gguf.metadata
        if key not in md:
            if default is _REQUIRED:
                raise errors.MissingKeyError(f"{self.gguf.path}: required key {key!r} is missing")
            return default
        if self.gguf.metadata_types[key] not in kinds:
            raise errors.MissingKeyError(
                f"{self.gguf.path}: key {key!r} should be {what}, "
                f"not {self.gguf.metadata_types[key].name.lower()}"
            )
        return md[key]

    def int(self, name: str, default: Any = None, lo: int = 1, hi: int = MAX_DIM) -> int:
        key = f"{self.arch}.{name}"
        v = self._get(key, _INT_TYPES, "an integer", _REQUIRED if default is None else default)
        if not lo <= v <= hi:
            raise errors.AbsurdValueError(f"{self.gguf.path}: {key} = {v} is out of range")
        return int(v)

    def float(self, name: str, default: Any = None) -> float:
        key = f"{self.arch}.{name}"
        v = self._get(key, _FLOAT_TYPES, "a float", _REQUIRED if default is None else default)
        if not math.isfinite(v):
            raise errors.AbsurdValueError(f"{self.gguf.path}: {key} = {v} is not finite")
        return float(v)

    def str(self, name: str, default: Any = None) -> str:
        key = f"{self.arch}.{name}"
        return self._get(
            key, {ValueType.STRING}, "a string", _REQUIRED if default is None else default
        )

    def int_or_array(self, name: builtins.str, n: builtins.int) -> builtins.int | None:
        """A key that llama.cpp allows to be one integer or one per layer (e.g. head_count_kv)."""
        key = f"{self.arch}.{name}"
        v = self.gguf.metadata.get(key)
        if not isinstance(v, np.ndarray):
            return None if v is None else self.int(name)
        if v.dtype.kind not in "iu":  # a float array would give NaN or 2.5 to int()
            raise errors.MissingKeyError(
                f"{self.gguf.path}: key {key!r} should be integers, not {v.dtype.name}"
            )
        if len(v) != n or len(set(v.tolist())) != 1:
            raise errors.UnsupportedModelError(
                f"{self.gguf.path}: per-layer {key} values that differ are not supported"
            )
        if not 1 <= int(v[0]) <= MAX_DIM:
            raise errors.AbsurdValueError(f"{self.gguf.path}: {key} = {v[0]} is out of range")
        return int(v[0])

    def rope_scaling(self) -> builtins.float:
        kind = self._get(f"{self.arch}.rope.scaling.type", {ValueType.STRING}, "a string", "none")
        if kind == "none":
            return 1.0
        if kind != "linear":
            raise errors.UnsupportedModelError(
                f"{self.gguf.path}: rope scaling {kind!r} is not supported (none, linear)"
            )
        factor = self.float("rope.scaling.factor", 1.0)
        # 1/factor must be a finite float32 too (a subnormal factor made it inf)
        if not 1e-30 <= factor <= 1e30:
            raise errors.AbsurdValueError(f"{self.gguf.path}: rope scaling factor {factor}")
        return 1.0 / factor


_REQUIRED = object()


def n_vocab_of(gguf: GGUFFile, arch: str) -> int:
    tokens = gguf.metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise errors.MissingKeyError(
            f"{gguf.path}: the vocabulary 'tokenizer.ggml.tokens' is missing"
        )
    return len(tokens)


def check_tensors(gguf: GGUFFile, cfg: DecoderConfig) -> None:
    """Every tensor the config names must exist with the shape the config implies."""
    e, v = cfg.n_embd, cfg.n_vocab
    q_dim, kv_dim, v_dim = (
        cfg.n_head * cfg.head_dim,
        cfg.n_head_kv * cfg.head_dim,
        cfg.n_head_kv * cfg.head_dim_v,
    )
    want: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (e, v),
        "output_norm.weight": (e,),
        cfg.output_tensor: (e, v),
    }
    if cfg.rope_freqs_tensor:
        want[cfg.rope_freqs_tensor] = (cfg.n_rot // 2,)
    for lt in cfg.layers:
        want.update({
            lt.attn_norm: (e,), lt.wq: (e, q_dim), lt.wk: (e, kv_dim), lt.wv: (e, v_dim),
            lt.wo: (cfg.n_head * cfg.head_dim_v, e), lt.ffn_norm: (e,),
            lt.ffn_gate: (e, cfg.n_ff), lt.ffn_up: (e, cfg.n_ff), lt.ffn_down: (cfg.n_ff, e),
        })  # fmt: skip
        shape: tuple[int, ...]
        for name, shape in (
            (lt.bq, (q_dim,)), (lt.bk, (kv_dim,)), (lt.bv, (v_dim,)),
            (lt.q_norm, (cfg.head_dim,)), (lt.k_norm, (cfg.head_dim,)),
            (lt.attn_post_norm, (e,)), (lt.ffn_post_norm, (e,)),
        ):  # fmt: skip
            if name:
                want[name] = shape
    for name, shape in want.items():
        info = gguf.tensors.get(name)
        if info is None:
            raise errors.MissingTensorError(f"{gguf.path}: required tensor {name!r} is missing")
        if info.shape != shape:
            raise errors.MissingTensorError(
                f"{gguf.path}: tensor {name!r} has shape {list(info.shape)}, expected {list(shape)}"
            )
        if info.ggml_type not in COMPUTE_TYPES:
            raise errors.UnknownTensorTypeError(
                f"{gguf.path}: tensor {name!r} has type {info.ggml_type.name}, "
                "which edgeinfer cannot compute with yet"
            )


def standard_layers(
    n_layer: int, *, bias: bool = False, qk_norm: bool = False, post_norms: bool = False
) -> tuple[LayerTensors, ...]:
    """GGUF names of the usual decoder layer, with the optional parts each family adds."""

    def one(i: int) -> LayerTensors:
        p = f"blk.{i}."
        return LayerTensors(
            attn_norm=p + "attn_norm.weight",
            wq=p + "attn_q.weight", wk=p + "attn_k.weight", wv=p + "attn_v.weight",
            wo=p + "attn_output.weight",
            ffn_norm=p + "ffn_norm.weight",
            ffn_gate=p + "ffn_gate.weight", ffn_up=p + "ffn_up.weight",
            ffn_down=p + "ffn_down.weight",
            bq=p + "attn_q.bias" if bias else None,
            bk=p + "attn_k.bias" if bias else None,
            bv=p + "attn_v.bias" if bias else None,
            q_norm=p + "attn_q_norm.weight" if qk_norm else None,
            k_norm=p + "attn_k_norm.weight" if qk_norm else None,
            attn_post_norm=p + "post_attention_norm.weight" if post_norms else None,
            ffn_post_norm=p + "post_ffw_norm.weight" if post_norms else None,
        )  # fmt: skip

    return tuple(one(i) for i in range(n_layer))


def common_hparams(gguf: GGUFFile, arch: str) -> dict[str, Any]:
    """The hyper-parameters that every supported family stores under the same keys."""
    md = Metadata(gguf, arch)
    n_embd = md.int("embedding_length")
    n_head = md.int("attention.head_count")
    n_layer = md.int("block_count", hi=4096)
    n_head_kv = md.int_or_array("attention.head_count_kv", n_layer) or n_head
    if n_head % n_head_kv:
        raise errors.AbsurdValueError(
            f"{gguf.path}: {n_head} query heads do not split into {n_head_kv} KV groups"
        )
    head_dim = md.int("attention.key_length", n_embd // n_head)
    head_dim_v = md.int("attention.value_length", head_dim)
    n_rot = md.int("rope.dimension_count", head_dim)
    if n_rot > head_dim or n_rot % 2:
        raise errors.AbsurdValueError(
            f"{gguf.path}: rope dimension {n_rot} for heads of {head_dim}"
        )
    n_ff = md.int_or_array("feed_forward_length", n_layer)
    if n_ff is None:
        raise errors.MissingKeyError(
            f"{gguf.path}: required key '{arch}.feed_forward_length' is missing"
        )
    n_vocab = n_vocab_of(gguf, arch)
    output = "output.weight" if "output.weight" in gguf.tensors else "token_embd.weight"
    return dict(
        arch=arch, n_vocab=n_vocab,
        n_ctx_train=md.int("context_length", hi=1 << 24),
        n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim, head_dim_v=head_dim_v, n_ff=n_ff,
        norm_eps=md.float("attention.layer_norm_rms_epsilon"),
        n_rot=n_rot, rope_base=md.float("rope.freq_base", 10000.0),
        rope_freq_scale=md.rope_scaling(), output_tensor=output,
    )  # fmt: skip
