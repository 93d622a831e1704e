"""edgeinfer.quants against ggml on real weights: the packaged Gemma 3 270M Q4_K_M file.

Every tensor of the file is dequantized by both and compared bit for bit; a slice of each
weight matrix is then quantized again to every type, with and without an importance matrix.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer import quants
from edgeinfer.converters import quantizers
from edgeinfer.gguf import GGMLType, GGUFFile
from tests.formats.test_ggml_parity import (
    ALL_TYPES,
    WEIGHTED_TYPES,
    assert_same_bytes,
    assert_same_floats,
    make_weights,
)

pytestmark = pytest.mark.slow

ROWS_PER_CHECK = 16384  # bounds the memory of the 262144 x 640 embedding comparison


@pytest.fixture(scope="module")
def gemma_file(gemma_path):
    with GGUFFile(gemma_path) as f:
        yield f


def _numpy_shape(info) -> tuple[int, ...]:
    return tuple(reversed(info.shape))


def test_every_tensor_dequantizes_like_ggml(ggml, gemma_file):
    seen = set()
    for name, info in gemma_file.tensors.items():
        raw = gemma_file.tensor_data(name)
        shape = _numpy_shape(info)
        rows, row_len = int(np.prod(shape[:-1])), shape[-1]
        row_bytes = quants.row_nbytes(info.ggml_type, row_len)
        for start in range(0, rows, ROWS_PER_CHECK):
            stop = min(rows, start + ROWS_PER_CHECK)
            part = raw[start * row_bytes : stop * row_bytes]
            ours = quants.dequantize(part, info.ggml_type, (stop - start, row_len))
            ref = ggml.dequantize(part, info.ggml_type, (stop - start) * row_len)
            assert_same_floats(ours, ref.reshape(ours.shape))
        seen.add(info.ggml_type)
    assert {GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K} <= seen


def _weight_samples(gemma_file):
    """The first 16 rows of one matrix per stored type, as float32 rows of 1024 values (a
    length every block size divides)."""
    samples = {}
    for name, info in gemma_file.tensors.items():
        if len(info.shape) == 2 and info.ggml_type not in samples:
            shape = _numpy_shape(info)
            row_bytes = quants.row_nbytes(info.ggml_type, shape[-1])
            raw = gemma_file.tensor_data(name)[: 16 * row_bytes]
            x = quants.dequantize(raw, info.ggml_type, (16, shape[-1])).reshape(-1)
            samples[info.ggml_type] = x[: x.size // 1024 * 1024].reshape(-1, 1024)
    assert {GGMLType.Q8_0, GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q6_K} <= samples.keys()
    return samples


@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=lambda t: t.name)
def test_real_weights_quantize_like_ggml(ggml, gemma_file, ggml_type):
    for x in _weight_samples(gemma_file).values():
        assert_same_bytes(quantizers.quantize(x, ggml_type), ggml.quantize(x, ggml_type), ggml_type)
        if ggml_type in WEIGHTED_TYPES:
            w = make_weights(x.shape[1], seed=7)
            ours = quantizers.quantize(x, ggml_type, weights=w)
            assert_same_bytes(ours, ggml.quantize(x, ggml_type, imatrix=w), ggml_type)
