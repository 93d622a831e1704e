"""Typed errors raised at every edgeinfer boundary.

Every failure a user can cause (a bad file, an impossible option, a prompt that does not
fit) raises a subclass of :class:`EdgeInferError` with a one-line message naming the problem.
"""

from __future__ import annotations


class EdgeInferError(Exception):
    """Base class of every error edgeinfer raises on purpose."""


# --- model files ---------------------------------------------------------------------------


class ModelFileError(EdgeInferError):
    """The model file cannot be used."""


class BadMagicError(ModelFileError):
    """The file does not start with the GGUF magic."""


class UnsupportedVersionError(ModelFileError):
    """The GGUF version is not one edgeinfer reads (2 and 3)."""


class TruncatedFileError(ModelFileError):
    """The file ends before the structure it announces."""


class AbsurdValueError(ModelFileError):
    """A count, length or dimension is too large to be genuine."""


class DuplicateNameError(ModelFileError):
    """A metadata key or tensor name appears twice."""


class UnknownValueTypeError(ModelFileError):
    """A metadata value has a type code GGUF does not define."""


class UnknownTensorTypeError(ModelFileError):
    """A tensor has a type edgeinfer does not know or cannot compute with."""


class MisalignedTensorError(ModelFileError):
    """A tensor's data offset is not a multiple of the file's alignment."""


class TensorOutOfBoundsError(ModelFileError):
    """A tensor's data lies (partly) outside the file."""


class MissingKeyError(ModelFileError):
    """A metadata key the architecture needs is absent or has the wrong type."""


class MissingTensorError(ModelFileError):
    """A tensor the architecture needs is absent or has the wrong shape."""


class UnknownArchitectureError(ModelFileError):
    """The file's ``general.architecture`` is not one edgeinfer implements."""


class NotARegularFileError(ModelFileError):
    """The path names a FIFO, a device, a socket or a directory rather than a model file."""


class UnusedTensorError(ModelFileError):
    """The file holds a tensor its architecture would ignore (a layer beyond block_count)."""


# --- use of a loaded model -----------------------------------------------------------------


class TokenizerError(EdgeInferError):
    """The vocabulary cannot be used, or text cannot be tokenized with it."""


class ContextOverflowError(EdgeInferError):
    """The tokens to process do not fit in the context window."""


class InvalidOptionError(EdgeInferError, ValueError):
    """An option has an impossible value (negative temperature, top_p above 1, ...)."""


class TemplateError(EdgeInferError):
    """A chat template failed to render or tried something the sandbox forbids."""


class ModelClosedError(EdgeInferError):
    """The model was used after ``close()``."""


class BackendError(EdgeInferError):
    """A compute backend is unavailable or reported a failure."""


class OutOfMemoryError(EdgeInferError, MemoryError):
    """An allocation failed (the KV cache, the compute buffers); the message names the bytes.

    The model stays usable (a smaller request may still fit) or, where it cannot, is closed."""


class InsufficientMemoryError(OutOfMemoryError):
    """load() refused a model whose committed memory (KV cache, buffers, weight copies: what
    cannot page back to the file) exceeds the memory available; the message and the fields
    give the numbers (``load(memory_check=False)`` loads it anyway)."""

    def __init__(self, message: str, committed_bytes: int, available_bytes: int) -> None:
        super().__init__(message)
        self.committed_bytes = committed_bytes
        self.available_bytes = available_bytes


class MemoryPressureWarning(UserWarning):
    """The mapped weights and the committed memory exceed the memory available: the model
    runs, but its weights page from the disk while it generates, many times slower."""


class CancelledError(EdgeInferError):
    """``cancel()`` stopped a call that has no partial result to return (``logits()``), or a
    load's progress callback returned False."""


class BusyError(EdgeInferError):
    """The model was called from inside one of its own steps (a re-entrant call)."""


class QueueFullError(EdgeInferError):
    """A batcher's queue of waiting requests is full: try again later (``retry_after_s``)."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class InputFileError(EdgeInferError):
    """An input other than the model (a text file to score) cannot be read as it must be."""


class StateFileError(InputFileError):
    """A saved session (``Model.load_state``, ``--prompt-cache``) is truncated, corrupt, or
    not a state file of this format."""


class StateMismatchError(StateFileError):
    """A saved session is intact but was written for another model or other cache settings
    (types, context, rows kept, context policy): loading it would give garbage."""


class NonFiniteLogitsError(EdgeInferError):
    """The model produced inf or NaN logits; the message names the step."""


class UnsupportedModelError(ModelFileError):
    """The file uses a feature of its architecture that edgeinfer does not implement."""
