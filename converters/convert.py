"""Hugging Face folder -> GGUF file: plan the types, then stream every tensor through its
quantizer into the writer.

The steps are separate so that the ONNX export can reuse the first two: a
:class:`Conversion` opens and checks the source (config, tokenizer, tensor headers: no
weights read), :meth:`Conversion.plan` decides each tensor's type (a ``--type`` recipe, or
fitting to a memory budget), and :meth:`Conversion.write_gguf` produces the file. Every
failure before the header is written leaves nothing behind; every failure after it removes
the temporary file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgeinfer.converters import errors
from edgeinfer.converters.architectures import ArchConverter, SourceTensor, converter_for
from edgeinfer.converters.architectures.base import RING_BATCH, MetadataItem, kv
from edgeinfer.converters.cache_settings import CacheSettings, cache_settings, recommended_metadata
from edgeinfer.converters.calibration import ActivationStats
from edgeinfer.converters.fitting import (
    SAMPLE_ROWS,
    Option,
    fit,
    format_bytes,
    options_for,
    padded_nbytes,
    quantization_error,
    sample_rows,
)
from edgeinfer.converters.hf_folder import HFCheckpoint
from edgeinfer.converters.profiles import Profile, load_profile, parse_size
from edgeinfer.converters.quantizers import quantize
from edgeinfer.converters.recipes import FILE_TYPES, Model, recipe
from edgeinfer.converters.vocab import Vocabulary, convert_vocabulary
from edgeinfer.gguf.constants import GGMLType, ValueType
from edgeinfer.gguf.writer import GGUFWriter
from edgeinfer.kv_cache import BLOCK_SIZE, DEFAULT_CACHE_TYPE, layer_positions

if TYPE_CHECKING:  # the ONNX export imports onnx, which GGUF conversions do not need
    from edgeinfer.converters.onnx.export import OnnxExport

QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION
DEFAULT_FIT_TYPES = (
    GGMLType.Q4_0,
    GGMLType.Q4_K,
    GGMLType.Q5_K,
    GGMLType.Q6_K,
    GGMLType.Q8_0,
    GGMLType.F16,
)
DEFAULT_TYPE = "f16"

# (stage, done, total): "measure" and "write" count tensors, "calibrate" tokens
Progress = Callable[[str, int, int], None]


def _no_progress(stage: str, done: int, total: int) -> None:
    pass


@dataclass(frozen=True)
class ConvertOptions:
    """What ``edgeinfer convert`` asks for. ``max_memory`` is bytes or a size ("4GiB")."""

    type: str | None = None
    pure: bool = False
    target: str | None = None
    max_memory: int | str | None = None
    n_ctx: int | None = None
    calib: str | os.PathLike[str] | None = None
    calib_tokens: int = 4096
    format: str | None = None
    measure: bool = False  # measure every tensor's error even without a budget (dry runs)
    sample_rows: int = SAMPLE_ROWS
    # the KV cache's types, each output format its own names (converters/cache_settings.py):
    # counted in a GGUF fit and recommended by the file; kv_type sets both
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    kv_type: str | None = None
    # ONNX output only (converters/onnx): MatMulNBits block size, zero points
    block_size: int = 32
    zero_points: bool = False


@dataclass
class TensorChoice:
    source: SourceTensor
    ggml_type: GGMLType
    nbytes: int  # in the file, alignment padding included
    error: float | None = None

    @property
    def name(self) -> str:
        return self.source.name


@dataclass
class Plan:
    """Every tensor's type and size, and what the file plus KV cache take."""

    arch: str
    source_arch: str
    recipe: str  # a --type name, or "fitted"
    file_type: int
    tensors: list[TensorChoice]
    file_size: int = 0
    n_ctx: int | None = None
    cache: CacheSettings = CacheSettings(DEFAULT_CACHE_TYPE, DEFAULT_CACHE_TYPE)
    kv_bytes: int = 0
    kv_bytes_per_token: int = 0  # one position in every layer
    kv_rings: str = ""  # which layers keep a ring rather than n_ctx positions, for the reader
    budget: int | None = None
    profile: Profile | None = None
    notes: list[str] = field(default_factory=list)
    # quantize with ggml's weighted searches even without statistics (equal weights): fitted
    # plans owe no bytes to llama-quantize, recipes stay its byte-for-byte equal
    flat_importance: bool = False

    @property
    def total_bytes(self) -> int:
        return self.file_size + self.kv_bytes

    def type_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.ggml_type.name] = out.get(t.ggml_type.name, 0) + 1
        return out


def output_format(out: str | os.PathLike[str], requested: str | None) -> str:
    """``gguf`` or ``onnx``: as requested, else from OUT (a .gguf file or a folder)."""
    if requested is not None:
        if requested not in ("gguf", "onnx"):
            raise errors.UnknownTypeError(f"unknown format {requested!r} (gguf, onnx)")
        return requested
    return "gguf" if str(out).lower().endswith(".gguf") else "onnx"


class Conversion:
    """An opened, checked source folder and everything derived from it but the weights."""

    def __init__(self, src: str | os.PathLike[str]) -> None:
        self.ckpt = HFCheckpoint(src)
        self.arch: ArchConverter = converter_for(self.ckpt)
        rows = self.arch.hp.vocab_size
        # the tensors' shapes first: the vocabulary is padded up to vocab_size, which only
        # the embedding's real size bounds (a config may claim 16 million rows)
        self.arch.tensors(rows)
        self.vocab: Vocabulary = convert_vocabulary(self.ckpt, max_tokens=rows)
        n_vocab = len(self.vocab.tokens) if self.arch.crop_vocab else rows
        self.vocab.resize(n_vocab, str(self.ckpt.folder))
        self.notes = list(self.arch.notes)
        if n_vocab != rows:
            self.notes.append(f"the embedding keeps the tokenizer's {n_vocab} of its {rows} rows")
        self.tensors: list[SourceTensor] = self.arch.tensors(n_vocab)
        self.model = Model(
            self.arch.n_layer,
            tied_embeddings=not any(t.name == "output.weight" for t in self.tensors),
        )

    # --- metadata ------------------------------------------------------------------------

    def metadata(
        self, file_type: int, recommended: Sequence[MetadataItem] = ()
    ) -> list[MetadataItem]:
        """The file's keys; ``recommended``: the cache settings it records (cache_settings)."""
        name = self.ckpt.folder.resolve().name or self.arch.gguf_arch
        return [
            kv("general.architecture", ValueType.STRING, self.arch.gguf_arch),
            kv("general.name", ValueType.STRING, name),
            kv("general.file_type", ValueType.UINT32, file_type),
            kv("general.quantization_version", ValueType.UINT32, QUANTIZATION_VERSION),
            *self.arch.metadata(),
            *self.vocab.metadata(),
            *recommended,
        ]

    def _layout(self, plan: Plan, path: str | os.PathLike[str] = os.devnull) -> GGUFWriter:
        """A writer for ``path`` holding the plan's metadata and tensor table; nothing is
        written before its ``write_header()``."""
        writer = GGUFWriter(path)
        recommended = recommended_metadata(plan.cache, plan.n_ctx, plan.recipe == "fitted")
        for key, vtype, value, etype in self.metadata(plan.file_type, recommended):
            writer.add(key, vtype, value, etype)
        for c in plan.tensors:
            writer.add_tensor_info(c.name, c.source.shape[::-1], c.ggml_type)
        return writer

    # --- planning ------------------------------------------------------------------------

    def plan(
        self,
        options: ConvertOptions,
        stats: ActivationStats | None = None,
        progress: Progress = _no_progress,
    ) -> Plan:
        profile = load_profile(options.target) if options.target else None
        cache = cache_settings(options, "gguf", profile)
        budget = parse_size(options.max_memory) if options.max_memory is not None else None
        if budget is None and profile is not None:
            budget = profile.budget
        n_ctx = options.n_ctx if options.n_ctx is not None else (profile.ctx if profile else None)
        if n_ctx is not None and n_ctx < 1:
            raise errors.InvalidSizeError(f"--ctx must be positive, not {n_ctx}")
        if budget is not None and n_ctx is None:
            raise errors.InvalidSizeError(
                "--max-memory needs --ctx N (the context the KV cache must hold)"
            )
        if budget is not None and n_ctx is not None and options.type is None:  # fit the budget
            types = profile.types if profile else DEFAULT_FIT_TYPES
            plan = self._fitted_plan(types, budget, n_ctx, cache, options, stats, progress)
        else:
            plan = self._recipe_plan(options.type or DEFAULT_TYPE, options.pure)
            if options.measure:
                self._measure(plan, options, stats, progress)
        plan.profile, plan.budget, plan.n_ctx, plan.notes = profile, budget, n_ctx, list(self.notes)
        self._size_cache(plan, cache)
        plan.file_size = self._layout(plan).file_size()
        if budget is not None and plan.total_bytes > budget:
            raise errors.BudgetError(
                f"{plan.recipe} does not fit: file {format_bytes(plan.file_size)} + KV cache "
                f"({cache.label()}) {format_bytes(plan.kv_bytes)} at {n_ctx} tokens = "
                f"{format_bytes(plan.total_bytes)}, budget {format_bytes(budget)} "
                f"(short by {format_bytes(plan.total_bytes - budget)})",
                needed=plan.total_bytes, budget=budget,
            )  # fmt: skip
        return plan

    def _size_cache(self, plan: Plan, cache: CacheSettings) -> None:
        """The plan's KV cache of ``cache``'s types for its context, rings included."""
        plan.cache = cache
        # a context of one block holds one block of every layer: its bytes per position
        plan.kv_bytes_per_token = (
            self.arch.kv_cache_bytes(BLOCK_SIZE, cache.k, cache.v) // BLOCK_SIZE
        )
        if not plan.n_ctx:
            return
        plan.kv_bytes = self.arch.kv_cache_bytes(plan.n_ctx, cache.k, cache.v)
        full = layer_positions(plan.n_ctx, 0, RING_BATCH)
        kept = [layer_positions(plan.n_ctx, w, RING_BATCH) for w in self.arch.layer_windows()]
        rings = sorted({n for n in kept if n < full})
        if rings:
            n_rings = sum(n < full for n in kept)
            plan.kv_rings = (
                f"{n_rings} of {self.arch.n_layer} layers keep only their window's blocks, "
                f"{', '.join(map(str, rings))} positions"
            )

    def _recipe_plan(self, type_name: str, pure: bool) -> Plan:
        r = recipe(type_name)
        choices = []
        for t in self.tensors:
            ty = r.choose(t, self.model, pure=pure)
            choices.append(TensorChoice(t, ty, padded_nbytes(ty, t.n_elements)))
        return Plan(
            self.arch.gguf_arch,
            self.ckpt.architecture,
            r.name + ("-pure" if pure else ""),
            r.file_type,
            choices,
        )

    def _measure(
        self, plan: Plan, options: ConvertOptions, stats: ActivationStats | None, progress: Progress
    ) -> None:
        for i, c in enumerate(plan.tensors):
            progress("measure", i, len(plan.tensors))
            if c.source.is_matrix:
                rows = sample_rows(c.source, options.sample_rows)
                c.error = self._uses(c.source) * quantization_error(
                    rows, c.ggml_type, self._importance(stats, c.source, plan.flat_importance)
                )
        progress("measure", len(plan.tensors), len(plan.tensors))

    def _uses(self, t: SourceTensor) -> int:
        return 2 if self.model.tied_embeddings and t.name == "token_embd.weight" else 1

    def _importance(
        self, stats: ActivationStats | None, t: SourceTensor, flat: bool = False
    ) -> np.ndarray | None:
        # statistics are those of the products the engine computes: a tied embedding has
        # the output's, an untied one (a lookup) none
        values = None if stats is None else stats.importance(t.name, t.row_length)
        if values is None and flat and t.is_matrix:
            # ggml's plain Q4_0..Q5_1 quantizers take each block's scale from its extreme
            # value; the weighted searches fit it by least squares, with a much smaller error
            values = np.ones(t.row_length, dtype=np.float32)
        return values

    def _fitted_plan(
        self, types: tuple[GGMLType, ...], budget: int, n_ctx: int, cache: CacheSettings,
        options: ConvertOptions, stats: ActivationStats | None, progress: Progress,
    ) -> Plan:  # fmt: skip
        fixed = [
            TensorChoice(t, GGMLType.F32, padded_nbytes(GGMLType.F32, t.n_elements))
            for t in self.tensors
            if not t.is_matrix
        ]
        matrices = [t for t in self.tensors if t.is_matrix]
        options_by_name: dict[str, list[Option]] = {}
        for i, t in enumerate(matrices):
            progress("measure", i, len(matrices))
            options_by_name[t.name] = options_for(
                t, types, self._importance(stats, t, flat=True), options.sample_rows,
                weight=self._uses(t),
            )  # fmt: skip
        progress("measure", len(matrices), len(matrices))
        # the final plan's metadata (the recommended cache and context) on all-F32 tensors
        draft = Plan(self.arch.gguf_arch, self.ckpt.architecture, "fitted", 0, [
            TensorChoice(t, GGMLType.F32, 0) for t in self.tensors
        ], n_ctx=n_ctx, cache=cache)  # fmt: skip
        header = self._layout(draft).file_size() - sum(
            padded_nbytes(GGMLType.F32, t.n_elements) for t in self.tensors
        )
        kv_bytes = self.arch.kv_cache_bytes(n_ctx, cache.k, cache.v)
        fixed_bytes = header + sum(c.nbytes for c in fixed) + kv_bytes
        try:
            chosen = fit(options_by_name, fixed_bytes, budget)
        except errors.BudgetError as e:
            smallest = ", ".join(sorted({o[0].ggml_type.name for o in options_by_name.values()}))
            raise errors.BudgetError(
                f"nothing fits: the smallest plan ({smallest}) needs a "
                f"{format_bytes(e.needed - kv_bytes)} file + {format_bytes(kv_bytes)} of KV cache "
                f"({cache.label()}) at {n_ctx} tokens = {format_bytes(e.needed)}; "
                f"the budget is {format_bytes(budget)}, short by {format_bytes(e.shortfall)}",
                needed=e.needed,
                budget=budget,
            ) from None
        choices = []
        for t in self.tensors:
            o = chosen.get(t.name)
            choices.append(TensorChoice(t, o.ggml_type, o.nbytes, o.error) if o else
                           TensorChoice(t, GGMLType.F32,
                                        padded_nbytes(GGMLType.F32, t.n_elements)))  # fmt: skip
        return Plan(
            self.arch.gguf_arch,
            self.ckpt.architecture,
            "fitted",
            _dominant_file_type(choices),
            choices,
            flat_importance=True,
        )

    # --- writing -------------------------------------------------------------------------

    def write_gguf(
        self, plan: Plan, out: str | os.PathLike[str], stats: ActivationStats | None = None,
        progress: Progress = _no_progress,
    ) -> Path:  # fmt: skip
        out = Path(out)
        if out.is_dir():
            raise errors.ConversionError(f"{out}: is a folder; a GGUF output must be a file path")
        if not out.parent.is_dir():
            raise errors.ConversionError(f"{out.parent}: no such folder")
        with self._layout(plan, out) as writer:
            if writer.file_size() != plan.file_size:
                raise AssertionError("the plan's file size disagrees with the writer's")
            writer.write_header()
            for i, c in enumerate(plan.tensors):
                progress("write", i, len(plan.tensors))
                importance = self._importance(stats, c.source, plan.flat_importance)
                writer.write_tensor_data(c.name, self._encoded(c, importance))
            progress("write", len(plan.tensors), len(plan.tensors))
            return writer.commit()

    @staticmethod
    def _encoded(c: TensorChoice, importance: np.ndarray | None) -> Iterator[np.ndarray]:
        for _, rows in c.source.chunks():
            if c.ggml_type == GGMLType.F32:
                yield rows
            else:
                yield quantize(rows, c.ggml_type, weights=importance)


def _dominant_file_type(choices: list[TensorChoice]) -> int:
    weight: dict[GGMLType, int] = {}
    for c in choices:
        if c.source.is_matrix:
            weight[c.ggml_type] = weight.get(c.ggml_type, 0) + c.source.n_elements
    dominant = max(weight, key=weight.__getitem__) if weight else GGMLType.F32
    return FILE_TYPES.get(dominant, FILE_TYPES[GGMLType.F16])


def load_stats(
    conversion: Conversion, options: ConvertOptions, progress: Progress, workdir: Path | None = None
) -> ActivationStats | None:
    """Activation statistics from ``--calib``: an .npz of saved statistics, or a text file run
    through edgeinfer's reference engine on an F16 copy of the source."""
    if options.calib is None:
        return None
    path = Path(options.calib)
    if not path.is_file():
        raise errors.MissingSourceFileError(f"{path}: calibration file not found")
    if path.suffix == ".npz":
        return ActivationStats.load(path)
    from edgeinfer.converters.calibration import collect_stats

    text = path.read_text(encoding="utf-8", errors="replace")
    return collect_stats(
        conversion, text, max_tokens=options.calib_tokens, workdir=workdir, progress=progress
    )


def plan_conversion(
    src: str | os.PathLike[str],
    options: ConvertOptions = ConvertOptions(),
    progress: Progress = _no_progress,
) -> Plan:
    """The plan that :func:`convert` would carry out, without writing anything."""
    conversion = Conversion(src)
    return conversion.plan(options, load_stats(conversion, options, progress), progress)


def convert(
    src: str | os.PathLike[str], out: str | os.PathLike[str],
    options: ConvertOptions = ConvertOptions(), progress: Progress = _no_progress,
) -> Plan | OnnxExport:  # fmt: skip
    """Converts the Hugging Face folder ``src`` into ``out``; returns the plan carried out."""
    fmt = output_format(out, options.format)
    conversion = Conversion(src)
    if fmt == "onnx":
        from edgeinfer.converters.onnx.export import export_onnx

        return export_onnx(conversion, out, options, progress)
    stats = load_stats(conversion, options, progress, Path(out).parent)
    plan = conversion.plan(options, stats, progress)
    conversion.write_gguf(plan, out, stats, progress)
    return plan
