"""Static scales of a quantized KV cache, measured by running the exported graph.

onnxruntime's GroupQueryAttention quantizes the cache with fixed scales (one per channel
here: ``(n_head_kv * head_dim,)`` per layer, for keys and for values), so they must be known
when the graph is written. They are measured on a text: the graph with a float32 cache runs
it in windows, and each channel's scale maps the largest magnitude seen onto the largest code
(127 for int8, 7 for int4). Keys are measured after rotation, as the cache holds them. Values
beyond what the text produced are clamped at run time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgeinfer.converters import errors
from edgeinfer.converters.onnx.spec import DecoderSpec

WINDOW = 512
QMAX = {8: 127.0, 4: 7.0}
MIN_RANGE = 1e-6  # a channel that never moved still needs a positive scale

# Used when no --calib text is given: ordinary prose, code and numbers, so that every kind of
# token the cache will see has some weight.
DEFAULT_TEXT = """\
The history of computing is a story of machines that became smaller, cheaper and more
personal. Early computers filled rooms and served whole institutions; today a phone in a
pocket runs models that translate speech, summarize documents and answer questions.
Running a language model on such a device means fitting its weights and its memory of the
conversation into a few gigabytes, and computing each new word in a fraction of a second.

def fibonacci(n: int) -> list[int]:
    values = [0, 1]
    while len(values) < n:
        values.append(values[-1] + values[-2])
    return values[:n]

In 2023, 1,024 devices reported an average latency of 37.5 ms (min 12 ms, max 210 ms).
Q: What is the capital of France? A: Paris. Q: How many legs does a spider have? A: Eight.
"""


def kv_scales(
    model_path: Path, spec: DecoderSpec, tokens: list[int], bits: int
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per layer: the (key, value) scales of a ``bits``-bit cache for the graph at
    ``model_path`` (a float32 cache), measured on ``tokens``."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise errors.NotAvailableError(
            "a quantized KV cache is calibrated by running the graph: install onnxruntime "
            "(pip install 'edgeinfer[onnx]')"
        ) from None
    if not tokens:
        raise errors.ConversionError("the calibration text gave no tokens")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    peaks = np.zeros((spec.n_layer, 2, spec.kv_dim), dtype=np.float32)  # (layer, k/v, channel)
    window = min(WINDOW, spec.context_length)
    empty = np.zeros((1, spec.n_head_kv, 0, spec.head_dim), dtype=np.float32)
    names = [f"present.{il}.{part}" for il in range(spec.n_layer) for part in ("key", "value")]
    for start in range(0, len(tokens), window):
        ids = np.array([tokens[start : start + window]], dtype=np.int64)  # (1, n)
        feed: dict[str, np.ndarray] = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        for il in range(spec.n_layer):
            feed[f"past_key_values.{il}.key"] = feed[f"past_key_values.{il}.value"] = empty
        for i, cache in enumerate(session.run(names, feed)):
            peak = np.abs(cache[0]).max(axis=1).reshape(-1)  # (n_head_kv, n, head_dim) -> channels
            np.maximum(peaks[i // 2, i % 2], peak, out=peaks[i // 2, i % 2])
    del session
    scales = np.maximum(peaks, MIN_RANGE) / np.float32(QMAX[bits])
    return {il: (scales[il, 0], scales[il, 1]) for il in range(spec.n_layer)}
