"""The MatMulNBits block quantizer against onnxruntime's own (MLAS, through the functions
onnxruntime.quantization's MatMulNBitsQuantizer calls), byte for byte on random weights:
symmetric and with zero points, 4 and 8 bits, every block size, rows that end in a partial
block, blocks of zeros and values on exact rounding ties."""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer.converters.onnx.blockwise import BlockLayout, dequantize, quantize

pybind = pytest.importorskip("onnxruntime.capi._pybind_state")


def ort_quantize(w: np.ndarray, layout: BlockLayout) -> dict[str, np.ndarray]:
    """onnxruntime's quantization of the (N, K) weight ``w`` (it takes K-major input, padded)."""
    fn = {4: pybind.quantize_matmul_4bits, 8: pybind.quantize_matmul_8bits}[layout.bits]
    padded = np.zeros((layout.padded_k, layout.n), dtype=np.float32)  # (K, N)
    padded[: layout.k] = w.T
    shapes = layout.shapes()
    packed = np.zeros(shapes["B"], dtype=np.uint8)
    scales = np.zeros(shapes["scales"], dtype=np.float32)
    zp = np.zeros((layout.n, layout.zero_point_bytes), dtype=np.uint8)
    fn(packed, padded, scales, zp, layout.block_size, layout.n, layout.padded_k, layout.symmetric)
    return {"B": packed, "scales": scales, "zero_points": zp}


def random_weight(rng: np.random.Generator, n: int, k: int, case: str) -> np.ndarray:
    w = rng.standard_normal((n, k)).astype(np.float32) * np.float32(rng.choice([1e-3, 1.0, 50.0]))
    if case == "ties":  # multiples of 1/2 land exactly between codes for many scales
        w = np.round(w * 2) / 2
    elif case == "zeros":
        w[:, : k // 2] = 0
    return w


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block_size", [16, 32, 64, 128])
def test_bit_exact_with_onnxruntime(bits, symmetric, block_size):
    rng = np.random.default_rng(bits * 1000 + block_size + symmetric)
    for case in ("normal", "ties", "zeros"):
        for _ in range(4):
            n = int(rng.integers(1, 9))
            k = int(rng.integers(1, 5)) * block_size - 2 * int(rng.integers(0, block_size // 2))
            layout = BlockLayout(n, k, bits, block_size, symmetric)
            w = random_weight(rng, n, k, case)
            ours, theirs = quantize(w, layout), ort_quantize(w, layout)
            assert ours["B"].shape == layout.shapes()["B"]
            assert (ours["B"] == theirs["B"]).all(), (case, n, k)
            # equal as numbers: a block of signed zeros may differ in the sign of its scale
            assert (ours["scales"] == theirs["scales"]).all(), (case, n, k)
            if not symmetric:
                assert (ours["zero_points"] == theirs["zero_points"]).all(), (case, n, k)


@pytest.mark.parametrize("bits", [4, 8])
def test_dequantize_error_is_within_a_step(bits):
    """Half a step, except at the end a symmetric block cannot reach (codes -8..7 for a
    scale that maps the peak onto -8: the opposite extreme is clamped by up to one step)."""
    rng = np.random.default_rng(bits)
    for symmetric in (True, False):
        layout = BlockLayout(16, 200, bits, 32, symmetric)  # 200 = 6 blocks + 8 values
        w = rng.standard_normal((16, 200)).astype(np.float32)
        q = quantize(w, layout)
        back = dequantize(q, layout)
        step = np.repeat(np.abs(q["scales"]), 32, axis=1)[:, :200]
        assert back.shape == w.shape
        bound = step * (1.0 if symmetric else 0.5) * (1 + 1e-6)
        assert (np.abs(back - w) <= bound).all()


def test_layout_sizes_are_arithmetic():
    # INT4, block 32: 16 bytes of codes and a float32 scale per block (+ a nibble of zero point)
    layout = BlockLayout(n=10, k=100, bits=4, block_size=32)
    assert (layout.n_blocks, layout.blob_size, layout.padded_k) == (4, 16, 128)
    assert layout.nbytes() == 10 * 4 * (16 + 4)
    assert BlockLayout(10, 100, 4, 32, symmetric=False).nbytes() == 10 * 4 * 20 + 10 * 2
    assert BlockLayout(10, 100, 8, 64).shapes() == {"B": (10, 2, 64), "scales": (10, 2)}
    with pytest.raises(ValueError):
        BlockLayout(10, 100, 3, 32)
