"""Hugging Face folder -> ONNX folder that onnxruntime-genai and edgeinfer run as it is::

    OUT/model.onnx              the decoder graph (see decoder.py), a few hundred kB
    OUT/model.onnx.data         every weight, page-aligned
    OUT/genai_config.json       onnxruntime-genai's configuration
    OUT/tokenizer.json, tokenizer_config.json, tokenizer.model, special_tokens_map.json,
    OUT/config.json, generation_config.json, chat_template.jinja   copied when the source has them

The folder is assembled under a temporary name next to OUT and renamed when complete, so a
failed or interrupted export leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from edgeinfer.converters import errors

if TYPE_CHECKING:
    from edgeinfer.converters.convert import Conversion, ConvertOptions, Progress

WEIGHT_TYPES = {"f32": None, "int4": 4, "int8": 8}
KV_TYPES = ("f32", "f16", "int8", "int4")
BLOCK_SIZES = (32, 64, 128)
DEFAULT_TYPE = "int4"
DATA_FILE = "model.onnx.data"
CALIBRATION_FILE = "calibration.onnx"
COPIED_FILES = (
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
    "config.json", "generation_config.json", "chat_template.jinja", "chat_template.json",
)  # fmt: skip


@dataclass
class OnnxExport:
    """What an export wrote (or, before writing, will write)."""

    path: Path
    arch: str
    source_arch: str
    weight_type: str
    block_size: int | None
    zero_points: bool
    kv_type: str
    context_length: int
    file_size: int = 0  # model.onnx + model.onnx.data
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class OnnxTensor:
    """One weight as the graph stores it."""

    name: str
    shape: tuple[int, ...]
    kind: str  # "MatMulNBits int4 b32", "float32", ...
    nbytes: int


def onnx_plan(conversion: Conversion, options: ConvertOptions) -> list[OnnxTensor]:
    """How each tensor will be stored (what --dry-run prints); nothing is read or written."""
    from edgeinfer.converters.onnx.blockwise import BlockLayout

    _, bits = check_options(options)
    out = []
    for t in conversion.tensors:
        if t.name == "rope_freqs.weight":
            continue  # folded into the rotary tables
        if bits and t.is_matrix:
            n, k = t.shape
            layout = BlockLayout(n, k, bits, options.block_size, not options.zero_points)
            op = "GatherBlockQuantized" if t.name == "token_embd.weight" else "MatMulNBits"
            kind = f"{op} int{bits} b{options.block_size}" + (" zp" if options.zero_points else "")
            if t.name == "token_embd.weight" and conversion.model.tied_embeddings:
                kind += " + output"
            out.append(OnnxTensor(t.name, t.shape, kind, layout.nbytes()))
        else:
            out.append(OnnxTensor(t.name, t.shape, "float32", 4 * t.n_elements))
    return out


def check_options(options: ConvertOptions) -> tuple[str, int | None]:
    """The weight type and its bits; typed errors for what the ONNX export cannot do."""
    kv_type(options)
    type_name = (options.type or DEFAULT_TYPE).lower()
    if type_name not in WEIGHT_TYPES:
        raise errors.UnknownTypeError(
            f"--type {options.type!r} is not an ONNX weight type ({', '.join(WEIGHT_TYPES)})"
        )
    if options.block_size not in BLOCK_SIZES:
        raise errors.UnknownTypeError(
            f"--block-size {options.block_size} is not one of {', '.join(map(str, BLOCK_SIZES))}"
        )
    for name, value in (("--target", options.target), ("--max-memory", options.max_memory)):
        if value is not None:
            raise errors.NotAvailableError(f"{name} is not available for ONNX output (GGUF only)")
    if options.pure:
        raise errors.NotAvailableError("--pure is for GGUF mixes; ONNX types are uniform")
    if options.n_ctx is not None and options.n_ctx < 1:
        raise errors.InvalidSizeError(f"--ctx must be positive, not {options.n_ctx}")
    return type_name, WEIGHT_TYPES[type_name]


def kv_type(options: ConvertOptions) -> str:
    """The KV cache's one type (``--kv-type``, or ``--cache-type-k`` / ``-v`` that agree)."""
    from edgeinfer.converters.cache_settings import cache_settings

    return cache_settings(options, "onnx").k


def export_onnx(
    conversion: Conversion, out: str | os.PathLike[str], options: ConvertOptions,
    progress: Progress,
) -> OnnxExport:  # fmt: skip
    """Writes the ONNX folder ``out`` (which must not exist yet) from ``conversion``."""
    from edgeinfer.converters.onnx.decoder import DecoderGraph, KVCache, WeightFormat
    from edgeinfer.converters.onnx.spec import DecoderSpec

    type_name, bits = check_options(options)
    cache_type = kv_type(options)
    out = Path(out)
    if out.exists():
        raise errors.ConversionError(f"{out}: already exists; an ONNX output is a new folder")
    if not out.parent.is_dir():
        raise errors.ConversionError(f"{out.parent}: no such folder")
    n_vocab = conversion.tensors[0].shape[0]
    spec = DecoderSpec.from_converter(conversion.arch, n_vocab, options.n_ctx)
    weights = WeightFormat(bits, options.block_size, not options.zero_points)
    result = OnnxExport(
        out, spec.genai_type, conversion.ckpt.architecture, type_name,
        options.block_size if bits else None, bool(bits and options.zero_points), cache_type,
        spec.context_length, notes=list(conversion.notes),
    )  # fmt: skip
    quantized_kv = cache_type in ("int8", "int4")
    tokens = _calibration_tokens(conversion, options) if quantized_kv else []
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent))
    try:
        _usual_mode(tmp)
        from edgeinfer.converters.onnx.tensor_data import TensorData

        with TensorData(tmp / DATA_FILE) as data:
            graph = DecoderGraph(spec, conversion.tensors, weights, data)
            graph.write_weights(progress)
        kv = KVCache(cache_type)
        if quantized_kv:
            kv = KVCache(cache_type, _kv_scales(graph, spec, tmp, tokens, kv_bits(cache_type)))
            result.notes.append(f"KV cache scales measured on {len(tokens)} tokens")
        _write(tmp / "model.onnx", graph.model(kv).SerializeToString())
        _write_side_files(conversion, spec, tmp, share_buffer=not quantized_kv)
        result.file_size = sum((tmp / name).stat().st_size for name in ("model.onnx", DATA_FILE))
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


def _usual_mode(folder: Path) -> None:
    """mkdtemp's folder is private (0700); the output gets what mkdir would give it."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)


def kv_bits(kv_type: str) -> int:
    return {"int8": 8, "int4": 4}[kv_type]


def _kv_scales(graph, spec, folder: Path, tokens: list[int], bits: int):
    from edgeinfer.converters.onnx.decoder import KVCache
    from edgeinfer.converters.onnx.kv_calibration import kv_scales

    path = folder / CALIBRATION_FILE  # the same weights, with a float32 cache
    _write(path, graph.model(KVCache("f32")).SerializeToString())
    try:
        return kv_scales(path, spec, tokens, bits)
    finally:
        path.unlink()


def _calibration_tokens(conversion: Conversion, options: ConvertOptions) -> list[int]:
    """Token ids of the --calib text (or of a built-in sample), at most calib_tokens."""
    from edgeinfer.converters.onnx.kv_calibration import DEFAULT_TEXT
    from edgeinfer.engines.onnxruntime import metadata_as_read
    from edgeinfer.tokenizer import Tokenizer

    text = DEFAULT_TEXT
    if options.calib is not None:
        path = Path(options.calib)
        if not path.is_file():
            raise errors.MissingSourceFileError(f"{path}: calibration file not found")
        if path.suffix == ".npz":
            raise errors.ConversionError(
                f"{path}: the ONNX KV cache is calibrated on a text, not on saved statistics"
            )
        text = path.read_text(encoding="utf-8", errors="replace")
    metadata = metadata_as_read(conversion.vocab.metadata())
    return Tokenizer.from_metadata(metadata).tokenize(text)[: options.calib_tokens]


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_side_files(conversion: Conversion, spec, folder: Path, share_buffer: bool) -> None:
    from edgeinfer.converters.onnx.genai_config import genai_config

    config = genai_config(
        spec, conversion.vocab, conversion.ckpt.generation_config, share_buffer=share_buffer
    )
    _write(folder / "genai_config.json", json.dumps(config, indent=2).encode())
    for name in COPIED_FILES:
        source = conversion.ckpt.file(name)
        if source is not None:
            shutil.copyfile(source, folder / name)
