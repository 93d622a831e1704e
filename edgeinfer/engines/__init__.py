"""Compute engines: one protocol (:class:`Engine`), one registry (:data:`ENGINES`).

``load()``, the CLI's ``--engine`` choices, ``doctor`` and ``bench`` all read the registry; no
caller asks which engine it has. ``auto`` picks, for the model's format, the first engine in
:data:`AUTO_ORDER` that can run here; when that means falling back from the native engine to
the numpy reference, it warns once (:class:`EngineFallbackWarning`, on stderr) naming the
reason and the file it looked for.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from edgeinfer import errors
from edgeinfer.engines.base import Batch, Engine, EngineOptions, EngineSpec, SequenceEngine


def _probe_native() -> tuple[bool, str]:
    from edgeinfer import _native

    return _native.available()


def _probe_reference() -> tuple[bool, str]:
    import numpy

    return True, f"numpy {numpy.__version__}"


def _probe_onnxruntime() -> tuple[bool, str]:
    try:
        import onnxruntime
    except ImportError:
        return False, "onnxruntime is not installed (pip install 'edgeinfer[onnx]')"
    return True, f"onnxruntime {onnxruntime.__version__}"


ENGINES: dict[str, EngineSpec] = {
    spec.name: spec
    for spec in (
        EngineSpec(
            "native", "SIMD kernels picked for this CPU (simd/)", ("gguf",),
            ("f16", "f32", "q8_0", "q4_0", "kivi4", "kivi2"),
            max_sequences=64, module="edgeinfer.engines.native", probe=_probe_native,
        ),
        EngineSpec(
            "reference", "the numpy forward pass every engine is tested against", ("gguf",),
            ("f16", "f32", "q8_0", "q4_0", "kivi4", "kivi2"), max_sequences=1,
            module="edgeinfer.engines.reference", probe=_probe_reference,
        ),
        EngineSpec(
            "onnxruntime", "an exported ONNX folder on onnxruntime", ("onnx",), (),
            max_sequences=1, module="edgeinfer.engines.onnxruntime", probe=_probe_onnxruntime,
        ),
    )
}  # fmt: skip
AUTO_ORDER = ("native", "reference", "onnxruntime")
ENGINE_CHOICES = ("auto", *ENGINES)  # what --engine and load(engine=...) accept


class EngineFallbackWarning(UserWarning):
    """engine="auto" runs the numpy reference because the native engine cannot be used."""


_warned_fallback = False


def probe(name: str) -> tuple[bool, str]:
    """Whether engine ``name`` can run here, and a one-line reason or description."""
    spec = ENGINES.get(name) if isinstance(name, str) else None
    if spec is None:
        raise errors.InvalidOptionError(_unknown(name))
    return spec.probe()


def _unknown(name: object) -> str:
    return f"unknown engine {name!r} (one of {', '.join(ENGINE_CHOICES)})"


def select(name: str, model_format: str) -> EngineSpec:
    """The engine to run a ``model_format`` model with, for ``engine=name``."""
    if name == "auto":
        return _auto(model_format)
    spec = ENGINES.get(name) if isinstance(name, str) else None
    if spec is None:
        raise errors.InvalidOptionError(_unknown(name))
    if model_format not in spec.formats:
        runs = ", ".join(s.name for s in ENGINES.values() if model_format in s.formats)
        raise errors.InvalidOptionError(
            f"engine {name!r} runs {' and '.join(spec.formats)} models; "
            f"a {model_format} model runs on {runs} (or auto)"
        )
    ok, why = probe(name)
    if not ok:
        raise errors.BackendError(f"{name} engine unavailable: {why}")
    return spec


def _auto(model_format: str) -> EngineSpec:
    global _warned_fallback
    skipped: list[tuple[str, str]] = []
    for name in AUTO_ORDER:
        spec = ENGINES[name]
        if model_format not in spec.formats:
            continue
        ok, why = probe(name)
        if ok:
            if skipped and name == "reference" and not _warned_fallback:
                _warned_fallback = True
                reasons = "; ".join(f"{n}: {w}" for n, w in skipped)
                warnings.warn(
                    f"edgeinfer runs the numpy reference engine, about 20x slower, because the "
                    f"native engine cannot be used ({reasons})",
                    EngineFallbackWarning,
                    stacklevel=4,
                )
            return spec
        skipped.append((name, why))
    reasons = "; ".join(f"{n}: {w}" for n, w in skipped) or "none is registered"
    raise errors.BackendError(f"no engine can run a {model_format} model here ({reasons})")


def create(spec: EngineSpec, source: Any, config: Any, options: EngineOptions) -> Engine:
    """An engine of ``spec`` for an opened model (a GGUFFile or an OnnxFolder) and its config."""
    wanted = {"cache_type_k": options.cache_type_k, "cache_type_v": options.cache_type_v}
    for what, kind in wanted.items():
        if kind not in spec.kv_types and spec.kv_types:
            raise errors.InvalidOptionError(
                f"the {spec.name} engine keeps {what} {', '.join(spec.kv_types)}, not {kind!r}"
            )
    module = importlib.import_module(spec.module)
    engine: Engine = module.open_engine(source, config, options)
    return engine


def report() -> list[dict[str, Any]]:
    """Every registered engine: whether it runs here, why (not), and what it supports."""
    out = []
    for spec in ENGINES.values():
        ok, why = probe(spec.name)
        out.append({
            "name": spec.name, "available": ok, "detail": why, "formats": list(spec.formats),
            "kv_types": list(spec.kv_types), "max_sequences": spec.max_sequences,
        })  # fmt: skip
    return out


__all__ = [
    "AUTO_ORDER",
    "ENGINES",
    "ENGINE_CHOICES",
    "Batch",
    "Engine",
    "EngineFallbackWarning",
    "EngineOptions",
    "EngineSpec",
    "SequenceEngine",
    "create",
    "probe",
    "report",
    "select",
]
