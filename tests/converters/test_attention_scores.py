"""The attention each cached position received (the h2o policy's scores) against
transformers' own attention probabilities.

The engine sums, for every position, the probability each query head of each layer gave it
since it was evaluated; transformers' eager attention returns those probabilities
(``output_attentions``). With an f32 cache the engine's probabilities are float32 like
transformers', so the sums agree to float rounding: scores that summed the wrong heads, missed
a layer, or counted the masked keys would not.
"""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer
from edgeinfer.gguf import GGUFFile
from tests.converters.conftest import hf_model, prompt_tokens


def _hf_attention_sums(folder, tokens: list[int]) -> np.ndarray:
    """Per key position: the sum of every layer's, head's and query's attention probability."""
    model = hf_model(folder)
    import torch

    with torch.no_grad():
        out = model(torch.tensor([tokens]), output_attentions=True)
    total = np.zeros(len(tokens))
    for layer in out.attentions:  # (1, n_head, queries, keys)
        total += layer[0].double().numpy().sum(axis=(0, 1))
    return total


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_scores_are_the_attention_transformers_gives(checkpoints, converted, arch):
    path = converted(arch, "f32")
    with GGUFFile(path) as f:
        tokens = prompt_tokens(len(f.metadata["tokenizer.ggml.tokens"]), 40)
    expected = _hf_attention_sums(checkpoints[arch], tokens)
    for engine in ("native", "reference"):
        with edgeinfer.load(
            path, engine=engine, n_ctx=64, kv_type="f32", context_policy="h2o"
        ) as m:
            eng = m.backend
            eng.forward(tokens[:17])  # two calls: the second's queries see the first's keys
            eng.forward(tokens[17:])
            scores = eng.attention_scores() / 2.0**32
        np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-5, err_msg=engine)
        # a plain load sums nothing: the scores cost nothing unless h2o asks for them
        with edgeinfer.load(path, engine=engine, n_ctx=64) as m:
            assert not m.backend.tracks_attention
