"""What every architecture converter shares: typed config reading, rotary parameters, the
decoder-layer name map from Hugging Face to GGUF, and what the ONNX export needs to know.

A converter turns a checkpoint into GGUF metadata (architecture keys only; the vocabulary is
converted elsewhere), a list of :class:`SourceTensor` s (GGUF name, final shape, and how to
read its rows from the checkpoint) and an :class:`OnnxFamily`. Nothing here reads tensor data.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np

from edgeinfer.converters import errors
from edgeinfer.converters.hf_folder import HFCheckpoint
from edgeinfer.converters.safetensors_file import TensorEntry, read_rows
from edgeinfer.gguf.constants import ValueType
from edgeinfer.kv_cache import DEFAULT_CACHE_TYPE, cache_bytes

FLOAT32_MAX = 3.4028234663852886e38  # every float read from config.json is written as float32
READ_CHUNK_VALUES = 1 << 22  # values read from the checkpoint at a time (16 MiB as float32)
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)  # buffers some old checkpoints saved
# a sliding-window layer's ring holds window + n_batch positions; a fit counts load()'s
# default batch (a larger n_batch at load time grows the rings by the difference)
RING_BATCH = 512


@dataclass(frozen=True)
class SourceTensor:
    """One GGUF tensor and how to produce its float32 rows.

    ``shape`` is in numpy order, rows first: a (n_out, n_in) matrix is stored as GGUF
    shape (n_in, n_out). ``rotary_heads`` > 0 undoes Hugging Face's rotary layout on the rows
    (Llama: GGML's "normal" rope pairs adjacent values, HF pairs the two halves of each head).
    """

    name: str
    shape: tuple[int, ...]
    entry: TensorEntry | None = None
    layer: int | None = None
    rotary_heads: int = 0
    shift: float = 0.0  # added to every value (Gemma's norms compute x * (1 + w))
    values: np.ndarray | None = field(default=None, compare=False, repr=False)  # generated

    @property
    def row_length(self) -> int:
        return self.shape[-1]

    @property
    def n_rows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def is_matrix(self) -> bool:
        return len(self.shape) == 2

    @property
    def row_group(self) -> int:
        """Chunks of rows must be multiples of this (whole heads when rows are permuted)."""
        return self.n_rows // self.rotary_heads if self.rotary_heads else 1

    def rows(self, first: int, count: int) -> np.ndarray:
        """Rows [first, first + count) as a float32 (count, row_length) array."""
        if self.values is not None:
            x = np.asarray(self.values, dtype=np.float32).reshape(self.n_rows, self.row_length)
            x = x[first : first + count]
        else:
            assert self.entry is not None
            x = read_rows(self.entry, first, count)
        if self.rotary_heads:
            x = unpermute_rotary(x, self.row_group)
        if self.shift:
            x = x + np.float32(self.shift)
        return x

    def chunks(self, max_values: int = READ_CHUNK_VALUES) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, rows) over the whole tensor, each chunk near ``max_values`` values."""
        group = self.row_group
        step = max(group, max_values // max(self.row_length, 1) // group * group)
        for first in range(0, self.n_rows, step):
            yield first, self.rows(first, min(step, self.n_rows - first))


def unpermute_rotary(x: np.ndarray, head_size: int) -> np.ndarray:
    """Rows of whole heads from HF's half-split rotary layout to GGML's interleaved one:
    output row 2i + j of a head is input row j * head_size/2 + i."""
    rows, cols = x.shape
    half = head_size // 2
    return x.reshape(rows // head_size, 2, half, cols).swapaxes(1, 2).reshape(rows, cols)


# --- configuration ---------------------------------------------------------------------------


class ConfigReader:
    """Typed access to config.json values, with errors that name the key and the file."""

    def __init__(self, config: dict[str, Any], where: str, defaults: dict[str, Any]) -> None:
        self.config, self.where, self.defaults = config, where, defaults

    def _raw(self, key: str, default: Any) -> Any:
        value = self.config.get(key)
        if value is None:
            value = self.defaults.get(key, default)
        if value is None:
            raise errors.BadConfigError(f"{self.where}: required value {key!r} is missing")
        return value

    def int(self, key: str, default: Any = None, lo: int = 1, hi: int = 1 << 24) -> int:
        v = self._raw(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise errors.BadConfigError(
                f"{self.where}: {key} = {v!r} is not an integer in [{lo}, {hi}]"
            )
        return v

    def float(self, key: str, default: Any = None) -> float:
        v = self._raw(key, default)
        if not _is_float32(v):
            raise errors.BadConfigError(f"{self.where}: {key} = {v!r} is not a float32 number")
        return float(v)

    def bool(self, key: str, default: Any = None) -> bool:
        v = self._raw(key, default)
        if not isinstance(v, bool):
            raise errors.BadConfigError(f"{self.where}: {key} = {v!r} is not true or false")
        return v

    def str(self, key: str, default: Any = None) -> str:
        v = self._raw(key, default)
        if not isinstance(v, str):
            raise errors.BadConfigError(f"{self.where}: {key} = {v!r} is not a string")
        return v

    def get(self, key: builtins.str, default: Any = None) -> Any:
        v = self.config.get(key)
        return self.defaults.get(key, default) if v is None else v


def _is_float32(v: Any) -> bool:
    """A number that float32 holds (finite, in range): bools and other types are not."""
    return (
        not isinstance(v, bool) and isinstance(v, (int, float))
        and math.isfinite(v) and abs(v) <= FLOAT32_MAX
    )  # fmt: skip


@dataclass(frozen=True)
class Rope:
    """Rotary parameters of one kind of layer: base, and scaling by type ("default" = none)."""

    theta: float
    kind: str = "default"
    params: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def factor(self) -> float:
        return float(self.params.get("factor", 1.0))


def rope_parameters(config: dict[str, Any], where: str, default_theta: float) -> dict[str, Rope]:
    """Rotary parameters by layer type ("full_attention", "sliding_attention"), from either
    the transformers 5 ``rope_parameters`` or the older ``rope_theta``/``rope_scaling`` keys."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and params:
        nested = {k: v for k, v in params.items() if isinstance(v, dict)}
        if nested:
            if "full_attention" not in nested:
                raise errors.BadConfigError(
                    f"{where}: rope_parameters by layer type lacks 'full_attention'"
                )
            return {k: _rope(v, where, default_theta) for k, v in nested.items()}
        return {"full_attention": _rope(params, where, default_theta)}
    theta = config.get("rope_theta") or default_theta
    scaling = config.get("rope_scaling") or {}
    if not isinstance(scaling, dict):
        raise errors.BadConfigError(f"{where}: rope_scaling = {scaling!r} is not an object")
    out = {"full_attention": _rope({**scaling, "rope_theta": theta}, where, default_theta)}
    if config.get("rope_local_base_freq") is not None:  # Gemma 3's sliding layers, older files
        out["sliding_attention"] = _rope(
            {"rope_theta": config["rope_local_base_freq"]}, where, default_theta
        )
    return out


def _rope(spec: dict[str, Any], where: str, default_theta: float) -> Rope:
    theta = spec.get("rope_theta", default_theta)
    kind = spec.get("rope_type") or spec.get("type") or "default"
    if not _is_float32(theta) or not theta > 0:
        raise errors.BadConfigError(f"{where}: rope_theta = {theta!r} is not a positive number")
    if not isinstance(kind, str):
        raise errors.BadConfigError(f"{where}: rope type {kind!r} is not a string")
    params = {k: v for k, v in spec.items() if k not in ("rope_theta", "rope_type", "type")}
    if kind == "linear":
        factor = params.get("factor")
        if factor is None or not _is_float32(factor) or not factor > 0:
            raise errors.BadConfigError(f"{where}: linear rope scaling needs a positive factor")
    if kind == "llama3":  # what llama3_rope_factors() divides by
        for key in _LLAMA3_ROPE_KEYS:
            value = params.get(key, 1.0)
            if not _is_float32(value) or not value > 0:
                raise errors.BadConfigError(
                    f"{where}: llama3 rope scaling {key} = {value!r} is not a positive number"
                )
    return Rope(float(theta), kind, params)


_LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                     "original_max_position_embeddings")  # fmt: skip


def llama3_rope_factors(rope: Rope, head_dim: int) -> np.ndarray:
    """Per-frequency divisors of Llama 3.1's rotary scaling, as GGUF's rope_freqs.weight
    holds them: 1 for high frequencies, ``factor`` for low ones, a smooth ramp between."""
    p = rope.params
    factor = float(p.get("factor", 8.0))
    low, high = float(p.get("low_freq_factor", 1.0)), float(p.get("high_freq_factor", 4.0))
    old_ctx = float(p.get("original_max_position_embeddings", 8192))
    freqs = 1.0 / rope.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / freqs
    smooth = (old_ctx / wavelen - low) / (high - low) if high != low else np.zeros_like(wavelen)
    ramp = 1.0 / ((1.0 - smooth) / factor + smooth)
    out = np.where(wavelen < old_ctx / high, 1.0, np.where(wavelen > old_ctx / low, factor, ramp))
    return out.astype(np.float32)


# --- the converter base class ---------------------------------------------------------------

MetadataItem = tuple[str, ValueType, Any, ValueType | None]  # key, type, value, element type


def kv(
    key: str, vtype: ValueType, value: Any, element_type: ValueType | None = None
) -> MetadataItem:
    return (key, vtype, value, element_type)


@dataclass(frozen=True)
class OnnxFamily:
    """What an architecture's ONNX decoder does that neither the Llama block nor its tensors
    say (``converters/onnx/spec.py`` reads it; which optional tensors a layer has follows from
    the tensor list)."""

    genai_type: str  # onnxruntime-genai's model.type
    embed_scale: float = 1.0  # token embeddings are multiplied by this
    attn_scale: float = 0.0  # 0: 1 / sqrt(head_dim)
    sliding_window: int = 0
    swa_layers: tuple[bool, ...] = ()  # per layer: attends through the sliding window
    rope_swa: Rope | None = None  # rotary parameters of the sliding layers, when they differ
    final_logit_softcap: float = 0.0


class ArchConverter:
    """Base of the per-architecture converters. Subclasses set the class variables, build
    ``self.hp`` in ``__init__`` and implement :meth:`metadata` and :meth:`layer_shapes`."""

    hp: HParams  # set by each subclass's __init__
    hf_architectures: ClassVar[tuple[str, ...]]  # the Hugging Face classes it reads
    gguf_arch: ClassVar[str]  # the runtime architecture it writes (edgeinfer.models)
    genai_type: ClassVar[str | None] = None  # onnxruntime-genai's model.type; None: no ONNX
    # True: the embedding keeps the tokenizer's rows only; False: the vocabulary is padded
    # with unused tokens up to the embedding's rows (llama.cpp does each for some families)
    crop_vocab: ClassVar[bool] = False
    # GGUF name suffix in a layer -> HF name suffix in "model.layers.N."
    LAYER_NAMES: ClassVar[dict[str, str]] = {
        "attn_norm.weight": "input_layernorm.weight",
        "attn_q.weight": "self_attn.q_proj.weight",
        "attn_k.weight": "self_attn.k_proj.weight",
        "attn_v.weight": "self_attn.v_proj.weight",
        "attn_output.weight": "self_attn.o_proj.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight",
        "ffn_gate.weight": "mlp.gate_proj.weight",
        "ffn_up.weight": "mlp.up_proj.weight",
        "ffn_down.weight": "mlp.down_proj.weight",
    }

    def __init__(self, ckpt: HFCheckpoint) -> None:
        self.ckpt = ckpt
        self.where = str(ckpt.folder / "config.json")
        self.notes: list[str] = []  # what the conversion changes or leaves out, for the user

    # --- to implement ---

    def metadata(self) -> list[MetadataItem]:
        raise NotImplementedError

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """GGUF suffix -> numpy shape of each tensor in one layer."""
        raise NotImplementedError

    # --- shared ---

    @property
    def n_layer(self) -> int:
        return self.hp.n_layer

    def layer_windows(self) -> tuple[int, ...]:
        """Each layer's sliding window as the file tells the runtime (0: the layer attends to
        the whole context); empty when no layer has one."""
        return ()

    def kv_cache_bytes(
        self, n_ctx: int, k_type: str = DEFAULT_CACHE_TYPE, v_type: str | None = None
    ) -> int:
        """The runtime's KV cache for ``n_ctx`` positions with keys of ``k_type`` and values of
        ``v_type`` (default: ``k_type``), sized as the engine sizes it: sliding-window layers
        keep rings of window + RING_BATCH positions. Values are heads of ``head_dim`` too:
        every family here writes that length."""
        hp = self.hp
        return cache_bytes(
            n_layer=hp.n_layer, n_head_kv=hp.n_head_kv, head_dim=hp.head_dim,
            head_dim_v=hp.head_dim, n_ctx=n_ctx, k_type=k_type, v_type=v_type,
            windows=self.layer_windows(), n_batch=RING_BATCH,
        )  # fmt: skip

    def onnx_family(self) -> OnnxFamily | None:
        """What the ONNX export needs beyond the shared hyper-parameters; None: no export."""
        return OnnxFamily(self.genai_type) if self.genai_type else None

    def rotary_heads(self, suffix: str) -> int:
        """Heads whose rows need unpermuting in tensor ``suffix`` (0: none)."""
        return 0

    def norm_shift(self, suffix: str) -> float:
        return 0.0

    def tensors(self, n_vocab: int) -> list[SourceTensor]:
        """Every GGUF tensor, in file order; ``n_vocab`` rows are kept of the embedding."""
        hp = self.hp
        used: set[str] = set()
        out = [self._take("token_embd.weight", "model.embed_tokens.weight",
                          (hp.vocab_size, hp.hidden_size), used, keep_rows=n_vocab)]  # fmt: skip
        out += self.extra_tensors()
        shapes = self.layer_shapes()
        for il in range(hp.n_layer):
            for suffix, hf_suffix in self.LAYER_NAMES.items():
                if suffix in shapes:
                    out.append(self._take(f"blk.{il}.{suffix}", f"model.layers.{il}.{hf_suffix}",
                                          shapes[suffix], used, layer=il))  # fmt: skip
        out.append(self._take("output_norm.weight", "model.norm.weight", (hp.hidden_size,), used))
        if hp.tie_word_embeddings:
            used.add("lm_head.weight")  # some tied checkpoints store the copy too
        else:
            shape = (hp.vocab_size, hp.hidden_size)
            out.append(self._take("output.weight", "lm_head.weight", shape, used,
                                  keep_rows=n_vocab))  # fmt: skip
        unused = [
            n for n in self.ckpt.tensors if n not in used and not n.endswith(IGNORED_SUFFIXES)
        ]
        if unused:
            raise errors.UnexpectedTensorError(
                f"{self.ckpt.folder}: {len(unused)} tensor(s) that {self.hf_architectures[0]} "
                f"does not have, e.g. {unused[0]!r}"
            )
        return out

    def extra_tensors(self) -> list[SourceTensor]:
        """Tensors computed from the config rather than read (Llama 3's rope factors)."""
        return []

    def _take(
        self, name: str, hf_name: str, shape: tuple[int, ...], used: set[str],
        layer: int | None = None, keep_rows: int | None = None,
    ) -> SourceTensor:  # fmt: skip
        entry = self.ckpt.tensors.get(hf_name)
        if entry is None:
            raise errors.UnexpectedTensorError(f"{self.ckpt.folder}: tensor {hf_name!r} is missing")
        if entry.shape != tuple(shape):
            raise errors.ShapeMismatchError(
                f"{entry.path}: tensor {hf_name!r} has shape {list(entry.shape)}, "
                f"config.json implies {list(shape)}"
            )
        used.add(hf_name)
        if keep_rows is not None and keep_rows != shape[0]:
            shape = (keep_rows, *shape[1:])
        suffix = name.split(".", 2)[-1] if layer is not None else name
        return SourceTensor(
            name, tuple(shape), entry, layer=layer,
            rotary_heads=self.rotary_heads(suffix), shift=self.norm_shift(suffix),
        )  # fmt: skip


def common_metadata(arch: str, hp: Any, *, head_dims: bool) -> list[MetadataItem]:
    """The hyper-parameters every family stores under the same keys."""
    items = [
        kv(f"{arch}.context_length", ValueType.UINT32, hp.context_length),
        kv(f"{arch}.embedding_length", ValueType.UINT32, hp.hidden_size),
        kv(f"{arch}.block_count", ValueType.UINT32, hp.n_layer),
        kv(f"{arch}.feed_forward_length", ValueType.UINT32, hp.intermediate_size),
        kv(f"{arch}.attention.head_count", ValueType.UINT32, hp.n_head),
        kv(f"{arch}.attention.head_count_kv", ValueType.UINT32, hp.n_head_kv),
        kv(f"{arch}.attention.layer_norm_rms_epsilon", ValueType.FLOAT32, hp.rms_norm_eps),
        kv(f"{arch}.rope.freq_base", ValueType.FLOAT32, hp.rope.theta),
    ]
    if head_dims:
        items += [
            kv(f"{arch}.attention.key_length", ValueType.UINT32, hp.head_dim),
            kv(f"{arch}.attention.value_length", ValueType.UINT32, hp.head_dim),
        ]
    if hp.rope.kind == "linear":
        items += [
            kv(f"{arch}.rope.scaling.type", ValueType.STRING, "linear"),
            kv(f"{arch}.rope.scaling.factor", ValueType.FLOAT32, hp.rope.factor),
        ]
    return items


_HParamsT = TypeVar("_HParamsT", bound="HParams")


@dataclass(frozen=True)
class HParams:
    """The decoder hyper-parameters of config.json that every family shares."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    head_dim_explicit: bool  # config.json sets head_dim (it may differ from hidden / heads)
    rms_norm_eps: float
    context_length: int
    tie_word_embeddings: bool
    rope: Rope
    activation: str

    @classmethod
    def read(
        cls: type[_HParamsT],
        cfg: ConfigReader,
        ropes: dict[str, Rope],
        activation_key: str = "hidden_act",
        **extra: Any,
    ) -> _HParamsT:
        hidden = cfg.int("hidden_size")
        n_head = cfg.int("num_attention_heads")
        n_head_kv = cfg.int("num_key_value_heads", n_head)
        if n_head % n_head_kv:
            raise errors.BadConfigError(
                f"{cfg.where}: {n_head} attention heads do not split into {n_head_kv} KV groups"
            )
        explicit = cfg.config.get("head_dim") is not None
        head_dim = cfg.int("head_dim") if explicit else hidden // n_head
        if not explicit and hidden % n_head:
            raise errors.BadConfigError(
                f"{cfg.where}: hidden_size {hidden} is not a multiple of {n_head} heads"
            )
        if head_dim % 2:
            raise errors.BadConfigError(
                f"{cfg.where}: head_dim {head_dim} must be even for rotary embedding"
            )
        return cls(
            vocab_size=cfg.int("vocab_size"),
            hidden_size=hidden,
            intermediate_size=cfg.int("intermediate_size"),
            n_layer=cfg.int("num_hidden_layers", hi=4096),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            head_dim_explicit=explicit,
            rms_norm_eps=cfg.float("rms_norm_eps"),
            context_length=cfg.int("max_position_embeddings"),
            tie_word_embeddings=cfg.bool("tie_word_embeddings"),
            rope=ropes["full_attention"],
            activation=cfg.str(activation_key),
            **extra,
        )

    def standard_shapes(self) -> dict[str, tuple[int, ...]]:
        e, ff = self.hidden_size, self.intermediate_size
        q, kv_ = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        return {
            "attn_norm.weight": (e,),
            "attn_q.weight": (q, e), "attn_k.weight": (kv_, e), "attn_v.weight": (kv_, e),
            "attn_output.weight": (e, q),
            "ffn_norm.weight": (e,),
            "ffn_gate.weight": (ff, e), "ffn_up.weight": (ff, e), "ffn_down.weight": (e, ff),
        }  # fmt: skip


def refuse(where: str, what: str) -> errors.UnsupportedFeatureError:
    return errors.UnsupportedFeatureError(f"{where}: {what}")


def check_activation(hp: HParams, where: str, allowed: tuple[str, ...]) -> None:
    if hp.activation not in allowed:
        raise refuse(where, f"activation {hp.activation!r} is not supported ({', '.join(allowed)})")


def check_rope(hp: HParams, where: str, kinds: tuple[str, ...]) -> None:
    if hp.rope.kind not in kinds:
        raise refuse(
            where, f"rope scaling {hp.rope.kind!r} is not supported (supported: {', '.join(kinds)})"
        )
