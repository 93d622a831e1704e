"""Helpers of the ONNX tests: onnxruntime run on an exported folder directly (no edgeinfer
code in between), and a short text for the real-weights folder of real_gemma.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np

TEXT = (
    "The old lighthouse keeper climbed the spiral stairs every evening at dusk. From the top he "
    "could see the fishing boats returning to the harbour, their lamps flickering on the dark "
    "water. He had kept the light burning for forty years, through storms and quiet summers, "
    "and he knew every rock along the coast by name."
)


def ort_logits(folder: Path, tokens: list[int]) -> np.ndarray:
    """onnxruntime's logits at every position of ``tokens`` (a fresh sequence), shape
    (n_tokens, n_vocab), from the folder's model.onnx as it is."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(
        str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )
    feed: dict[str, np.ndarray] = {
        "input_ids": np.array([tokens], dtype=np.int64),
        "attention_mask": np.ones((1, len(tokens)), dtype=np.int64),
    }
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8,
             "tensor(uint8)": np.uint8}  # fmt: skip
    for i in session.get_inputs():
        if i.name.startswith("past_key_values."):
            feed[i.name] = np.zeros((1, i.shape[1], 0, i.shape[3]), dtype=types[i.type])
    return session.run(["logits"], feed)[0][0]
