"""The onnxruntime backend: an exported ONNX folder (``edgeinfer convert --format onnx``, or
any folder whose decoder has onnxruntime-genai's input and output names) run by
``onnxruntime.InferenceSession``.

:class:`OnnxFolder` opens the folder the way :class:`edgeinfer.gguf.GGUFFile` opens a file:
it offers ``metadata`` (GGUF-style keys: the tokenizer's ``tokenizer.ggml.*`` values and the
chat template) and a ``config``. The vocabulary is rebuilt from tokenizer.json (or
tokenizer.model) by the same code that writes GGUF files (``edgeinfer.converters.vocab``), so
token ids are those llama.cpp gives for the converted GGUF of the same source.

:class:`OnnxEngine` implements the engine protocol (:mod:`edgeinfer.engines`) with the KV
cache held between calls: ``truncate`` drops positions from its end, which is all that reusing
a prompt prefix needs. A float cache is one buffer of the whole context per tensor that
onnxruntime updates in place; a quantized one grows by copies.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer import errors
from edgeinfer.engines import ENGINES
from edgeinfer.engines.base import Batch, EngineOptions, SequenceEngine
from edgeinfer.models import ONNX_MODEL_TYPES

GENAI_CONFIG = "genai_config.json"
_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
                "tensor(int8)": np.int8, "tensor(uint8)": np.uint8}  # fmt: skip


@dataclass(frozen=True)
class OnnxConfig:
    """What :class:`edgeinfer.api.Model` reads of a model's configuration."""

    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    model_file: str


def _read_config(folder: Path) -> OnnxConfig:
    path = folder / GENAI_CONFIG
    if not path.is_file():
        raise errors.ModelFileError(f"{folder}: not an ONNX model folder (no {GENAI_CONFIG})")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        model, decoder = raw["model"], raw["model"]["decoder"]
        values = {
            "n_vocab": model["vocab_size"], "n_ctx_train": model["context_length"],
            "n_embd": decoder["hidden_size"], "n_layer": decoder["num_hidden_layers"],
            "n_head": decoder["num_attention_heads"], "n_head_kv": decoder["num_key_value_heads"],
            "head_dim": decoder["head_size"],
        }  # fmt: skip
        model_type, filename = model["type"], decoder["filename"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise errors.ModelFileError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1 << 31:
            raise errors.AbsurdValueError(f"{path}: {key} = {value!r}")
    arch = ONNX_MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
    if arch is None:
        raise errors.UnknownArchitectureError(
            f"{path}: model type {model_type!r} is not supported "
            f"({', '.join(sorted(ONNX_MODEL_TYPES))})"
        )
    if not isinstance(filename, str) or Path(filename).name != filename:
        raise errors.ModelFileError(f"{path}: bad decoder filename {filename!r}")
    if not (folder / filename).is_file():
        raise errors.ModelFileError(f"{folder}: the decoder file {filename} is missing")
    return OnnxConfig(arch=arch, model_file=filename, **values)


def _tokenizer_metadata(folder: Path, config: OnnxConfig) -> dict[str, Any]:
    """GGUF tokenizer metadata rebuilt from the folder's tokenizer files."""
    from edgeinfer.converters import errors as conversion_errors
    from edgeinfer.converters.hf_folder import HFCheckpoint
    from edgeinfer.converters.vocab import convert_vocabulary

    class TokenizerFiles(HFCheckpoint):
        """The folder's JSON and tokenizer files; its weights are ONNX, not safetensors."""

        def _load_tensors(self) -> dict:
            return {}

    try:
        vocab = convert_vocabulary(TokenizerFiles(folder), max_tokens=config.n_vocab)
        vocab.resize(config.n_vocab, str(folder))
    except conversion_errors.MissingSourceFileError as e:
        raise errors.TokenizerError(str(e)) from None
    metadata = metadata_as_read(vocab.metadata())
    metadata["general.architecture"] = config.arch
    metadata["general.name"] = folder.resolve().name
    return metadata


def metadata_as_read(items: list[tuple[str, Any, Any, Any]]) -> dict[str, Any]:
    """GGUF metadata items (key, type, value, element type) as GGUFFile.metadata holds them:
    numeric arrays as numpy arrays of their element type."""
    from edgeinfer.gguf.constants import SCALAR_FORMATS, ValueType

    out = {}
    for key, vtype, value, etype in items:
        if vtype == ValueType.ARRAY and etype in SCALAR_FORMATS:
            value = np.asarray(
                value, dtype=bool if etype == ValueType.BOOL else SCALAR_FORMATS[etype][1]
            )
        out[key] = value
    return out


class OnnxFolder:
    """An ONNX model folder, opened: configuration and tokenizer metadata, no session yet."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.config = _read_config(self.path)
        self.metadata: dict[str, Any] = _tokenizer_metadata(self.path, self.config)

    def close(self) -> None:
        pass


class OnnxEngine(SequenceEngine):
    """One sequence on an onnxruntime session, its KV cache kept as numpy arrays."""

    spec = ENGINES["onnxruntime"]
    can_discard = False  # the exported graph rotates keys inside; no context policy

    def __init__(self, model_file: Path, config: OnnxConfig, n_ctx: int, n_threads: int) -> None:
        super().__init__(n_ctx, config.n_vocab)
        try:
            import onnxruntime as ort
        except ImportError:
            raise errors.BackendError(
                "ONNX folders run on onnxruntime: pip install 'edgeinfer[onnx]'"
            ) from None
        if n_ctx > config.n_ctx_train:
            raise errors.InvalidOptionError(
                f"n_ctx {n_ctx} exceeds the {config.n_ctx_train} positions the graph was "
                "exported for"
            )
        options = ort.SessionOptions()
        options.intra_op_num_threads = n_threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(
                str(model_file), options, providers=["CPUExecutionProvider"]
            )
        except Exception as e:  # onnxruntime's exceptions derive from Exception only
            reason = " ".join(str(e).split())  # one line
            raise errors.ModelFileError(
                f"{model_file}: onnxruntime cannot load it ({reason})"
            ) from None
        self.config = config
        inputs = {i.name: i for i in self.session.get_inputs()}
        past = [inputs[n] for n in inputs if n.startswith("past_key_values.")]
        if len(past) != 2 * config.n_layer:
            raise errors.ModelFileError(
                f"{model_file}: {len(past)} cache inputs for {config.n_layer} layers"
            )
        self._positions = "position_ids" in inputs
        floats = all(_NUMPY_TYPES.get(p.type) in (np.float32, np.float16) for p in past)
        self._cache = _SharedCache(ort, past, n_ctx) if floats else _GrowingCache(past)

    @property
    def isa(self) -> str:
        return "onnxruntime cpu"

    def _check_open(self) -> None:
        if self.session is None:
            raise errors.ModelClosedError("the engine is closed")

    def _run(self, batch: Batch) -> np.ndarray:
        """One sequence: ``batch`` follows on from n_past (checked by SequenceEngine)."""
        ids = batch.tokens.astype(np.int64).reshape(1, -1)  # (1, n)
        n = ids.shape[1]
        feed = {"input_ids": ids, "attention_mask": np.ones((1, self.n_past + n), dtype=np.int64)}
        if self._positions:
            feed["position_ids"] = batch.positions.astype(np.int64)[None]
        try:
            logits = self._cache.run(self.session, feed)[0]  # (n, n_vocab)
        except Exception as e:  # as above
            raise errors.BackendError(f"onnxruntime failed: {' '.join(str(e).split())}") from None
        return np.asarray(logits, dtype=np.float32)[batch.want]

    def truncate(self, n_keep: int, seq: int = 0) -> None:
        """Keeps the first ``n_keep`` cached positions."""
        self._check_seq(seq)
        if not 0 <= n_keep <= self.n_past:
            raise errors.InvalidOptionError(f"cannot keep {n_keep} of {self.n_past} positions")
        self._cache.truncate(n_keep)
        super().truncate(n_keep, seq)

    def _clear(self, seq: int) -> None:
        self._cache.truncate(0)

    def close(self) -> None:
        self.session = None
        self._cache = None  # type: ignore[assignment]  # closed: nothing reads the cache again


def open_engine(folder: OnnxFolder, config: OnnxConfig, options: EngineOptions) -> OnnxEngine:
    """The registry's factory. The folder's graph fixed the cache type when it was exported,
    and onnxruntime picks its own kernels."""
    if options.isa is not None:
        raise errors.InvalidOptionError(
            "isa selects native kernels; an ONNX folder runs on onnxruntime"
        )
    return OnnxEngine(folder.path / config.model_file, config, options.n_ctx, options.n_threads)


def _cache_shape(spec: Any, length: int) -> tuple[np.dtype, tuple[int, ...]]:
    """dtype and (1, n_head_kv, length, cache_dim) of a past_key_values input."""
    dtype = _NUMPY_TYPES.get(spec.type)
    heads, dim = spec.shape[1], spec.shape[3]
    if dtype is None or not isinstance(heads, int) or not isinstance(dim, int):
        raise errors.ModelFileError(f"cache input {spec.name}: {spec.type} {spec.shape}")
    return np.dtype(dtype), (1, heads, length, dim)


def _present(past_name: str) -> str:
    return past_name.replace("past_key_values.", "present.", 1)


class _GrowingCache:
    """Past and present as separate arrays: each step's present (past + new positions)
    becomes the next step's past. Quantized caches, whose kernels keep them apart, use this."""

    def __init__(self, specs: list[Any]) -> None:
        self.empty = {}
        for spec in specs:
            dtype, shape = _cache_shape(spec, 0)
            self.empty[spec.name] = np.zeros(shape, dtype=dtype)
        self.arrays = dict(self.empty)  # name -> (1, n_head_kv, n_past, cache_dim)

    def run(self, session: Any, feed: dict[str, np.ndarray]) -> np.ndarray:
        names = list(self.arrays)
        outputs = session.run(["logits", *map(_present, names)], {**feed, **self.arrays})
        self.arrays = dict(zip(names, outputs[1:], strict=True))
        return outputs[0]

    def truncate(self, n_keep: int) -> None:
        if n_keep == 0:
            self.arrays = dict(self.empty)
        else:
            self.arrays = {
                k: np.ascontiguousarray(v[:, :, :n_keep]) for k, v in self.arrays.items()
            }


class _SharedCache:
    """One buffer of the whole context per cache tensor, bound as both the past input and the
    present output, so that GroupQueryAttention writes new positions in place (what
    onnxruntime-genai calls past_present_share_buffer). The attention mask's length says how
    many positions are valid; truncating needs no copy."""

    def __init__(self, ort: Any, specs: list[Any], n_ctx: int) -> None:
        self.buffers = {}
        for spec in specs:
            dtype, shape = _cache_shape(spec, n_ctx)
            self.buffers[spec.name] = ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, dtype=dtype))
        self.binding: Any = None

    def run(self, session: Any, feed: dict[str, np.ndarray]) -> np.ndarray:
        if self.binding is None:
            self.binding = session.io_binding()
            self.binding.bind_output("logits")  # first: outputs come back in binding order
            for name, buffer in self.buffers.items():
                self.binding.bind_ortvalue_input(name, buffer)
                self.binding.bind_ortvalue_output(_present(name), buffer)
        for name, value in feed.items():
            self.binding.bind_cpu_input(name, value)
        self.binding.bind_output("logits")  # again: its shape follows the number of tokens
        session.run_with_iobinding(self.binding)
        return np.array(self.binding.get_outputs()[0].numpy())  # a copy: ours to keep

    def truncate(self, n_keep: int) -> None:
        pass
