"""Typed errors of the converters, all :class:`edgeinfer.errors.EdgeInferError` subclasses.

A conversion refused for a bad source is a :class:`SourceError` (a ``ModelFileError``); an
impossible option is an ``InvalidOptionError``; a budget nothing fits is a :class:`BudgetError`
that says by how much.
"""

from __future__ import annotations

from edgeinfer import errors


class ConversionError(errors.EdgeInferError):
    """A conversion could not be done."""


class SourceError(ConversionError, errors.ModelFileError):
    """The Hugging Face folder cannot be converted."""


class MissingSourceFileError(SourceError):
    """A file the conversion needs is absent from the folder."""


class BadConfigError(SourceError):
    """config.json (or another JSON file) is unreadable or lacks a value."""


class CorruptSafetensorsError(SourceError):
    """A safetensors file is malformed: header, offsets, dtypes or size."""


class ShapeMismatchError(SourceError):
    """A tensor's shape disagrees with the configuration."""


class UnexpectedTensorError(SourceError):
    """The checkpoint holds a tensor the architecture does not have, or lacks one it needs."""


class UnsupportedArchitectureError(SourceError, errors.UnknownArchitectureError):
    """The checkpoint's architecture has no converter."""


class UnsupportedFeatureError(SourceError, errors.UnsupportedModelError):
    """The checkpoint uses a feature of its architecture that the conversion cannot express."""


class TokenizerConversionError(SourceError, errors.TokenizerError):
    """The tokenizer files cannot be turned into GGUF vocabulary metadata."""


class UnknownTypeError(ConversionError, errors.InvalidOptionError):
    """An unknown ``--type`` (or a type a profile names)."""


class InvalidSizeError(ConversionError, errors.InvalidOptionError):
    """A memory size (``--max-memory``) that cannot be read."""


class ConflictingOptionsError(ConversionError, errors.InvalidOptionError):
    """Two options that set the same thing disagree (``--kv-type`` and ``--cache-type-k``)."""


class ProfileError(ConversionError, errors.InvalidOptionError):
    """A device profile is unknown or malformed."""


class NotAvailableError(ConversionError):
    """What this conversion cannot do here: an option the output format lacks (``--target``,
    ``--max-memory`` or ``--pure`` with ONNX output), or a step whose optional package is not
    installed (onnxruntime, to calibrate a quantized ONNX KV cache)."""


class BudgetError(ConversionError):
    """Nothing fits the memory budget; ``shortfall`` bytes would have to be found."""

    def __init__(self, message: str, *, needed: int, budget: int) -> None:
        super().__init__(message)
        self.needed, self.budget = needed, budget

    @property
    def shortfall(self) -> int:
        return self.needed - self.budget
