"""The tensor-level API of edgeinfer.quants (decoding) and edgeinfer.converters.quantizers
(encoding): shapes, errors, conversions with known results."""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer import errors, quants
from edgeinfer.converters import quantizers
from edgeinfer.gguf.constants import BLOCK_LAYOUTS, GGMLType


def test_every_compute_type_and_activation_type_has_a_codec():
    from edgeinfer.gguf.constants import COMPUTE_TYPES

    assert COMPUTE_TYPES | {GGMLType.Q8_1, GGMLType.Q8_K} == set(quants.QUANT_TYPES)
    for t, cls in quants.QUANT_TYPES.items():
        layout = BLOCK_LAYOUTS[t]
        assert (cls.block_size, cls.type_size, cls.layout.itemsize) == (
            layout.block_size,
            layout.type_size,
            layout.type_size,
        )


def test_row_nbytes():
    assert quants.row_nbytes(GGMLType.Q4_K, 4096) == 16 * 144
    assert quants.row_nbytes(GGMLType.Q8_0, 640) == 20 * 34
    assert quants.row_nbytes(GGMLType.F16, 3) == 6
    with pytest.raises(errors.InvalidOptionError):
        quants.row_nbytes(GGMLType.Q4_K, 640)


@pytest.mark.parametrize("bad", [GGMLType.IQ2_XXS, GGMLType.MXFP4, 999])
def test_types_without_a_codec_are_refused(bad):
    with pytest.raises(errors.UnknownTensorTypeError):
        quants.row_nbytes(bad, 256)
    with pytest.raises(errors.UnknownTensorTypeError):
        quants.dequantize(np.zeros(0, np.uint8), bad, (0, 256))


def test_dequantize_checks_its_input():
    raw = np.zeros(2 * 34, np.uint8)
    assert quants.dequantize(raw, GGMLType.Q8_0, (2, 32)).shape == (2, 32)
    assert quants.dequantize(raw, GGMLType.Q8_0, (64,)).dtype == np.float32
    with pytest.raises(errors.InvalidOptionError):
        quants.dequantize(raw[:-1], GGMLType.Q8_0, (2, 32))  # one byte short
    with pytest.raises(errors.InvalidOptionError):
        quants.dequantize(raw, GGMLType.Q8_0, (4, 16))  # rows split a block
    with pytest.raises(errors.InvalidOptionError):
        quants.dequantize(raw.view(np.int8), GGMLType.Q8_0, (2, 32))
    assert quants.dequantize(np.zeros(0, np.uint8), GGMLType.Q4_K, (0, 256)).shape == (0, 256)


def test_dequantize_reads_a_read_only_map():
    raw = np.frombuffer(bytes(3 * 210), dtype=np.uint8)
    assert not raw.flags.writeable
    np.testing.assert_array_equal(quants.dequantize(raw, GGMLType.Q6_K, (3, 256)), 0)


def test_quantize_shapes_and_errors():
    x = np.random.default_rng(0).standard_normal((2, 3, 64)).astype(np.float32)
    q = quantizers.quantize(x, GGMLType.Q4_0)
    assert q.shape == (6, 2 * 18) and q.dtype == np.uint8
    back = quants.dequantize(q, GGMLType.Q4_0, x.shape)
    assert back.shape == x.shape
    with pytest.raises(errors.InvalidOptionError):
        quantizers.quantize(x[..., :48], GGMLType.Q4_0)
    with pytest.raises(errors.InvalidOptionError):
        quantizers.quantize(x, GGMLType.Q4_0, weights=np.ones(32, np.float32))
    with pytest.raises(errors.InvalidOptionError):
        quantizers.quantize(np.zeros((1, 256), np.float32), GGMLType.Q8_K, weights=np.ones(256))
    with pytest.raises(errors.InvalidOptionError):
        quantizers.quantize(np.float32(1.0), GGMLType.F32)


def test_block_api_checks_shapes():
    with pytest.raises(errors.InvalidOptionError):
        quants.Q4_K.dequantize_blocks(np.zeros((2, 143), np.uint8))
    with pytest.raises(errors.InvalidOptionError):
        quantizers.Q4_K.quantize_blocks(np.zeros((2, 32), np.float32))
    with pytest.raises(errors.InvalidOptionError):
        quantizers.Q4_0.quantize_blocks(
            np.zeros((3, 32), np.float32), np.ones(32), blocks_per_row=2
        )
    assert quantizers.Q4_K.quantize_blocks(np.zeros((0, 256), np.float32)).shape == (0, 144)


@pytest.mark.parametrize(
    "ggml_type, step, nmax",
    [
        (GGMLType.Q8_0, 0.5, 127),
        (GGMLType.Q5_0, 1.0, 16),
        (GGMLType.Q4_0, 1.0, 8),
        (GGMLType.Q4_1, 0.5, 15),
        (GGMLType.Q5_1, 0.5, 31),
    ],
)
def test_round_trip_error_is_within_the_step(ggml_type, step, nmax):
    """Not a fixed answer: every block decodes to within step * |d| of its input (a whole
    step for Q4_0 / Q5_0, whose top level is clamped), plus what storing d (and m) in half
    precision costs: up to nmax * |d| * 2^-11 (and |m| * 2^-11)."""
    x = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
    q = quantizers.quantize(x, ggml_type)
    back = quants.dequantize(q, ggml_type, x.shape).reshape(-1, 32)
    blocks = q.reshape(-1, BLOCK_LAYOUTS[ggml_type].type_size).view(
        quants.QUANT_TYPES[ggml_type].layout
    )[:, 0]
    d = np.abs(quants.fp16_bits_to_fp32(blocks["d"]))
    m = np.abs(quants.fp16_bits_to_fp32(blocks["m"])) if "m" in blocks.dtype.names else 0
    err = np.abs(back - x.reshape(-1, 32)).max(axis=1)
    assert (err <= (step + nmax * 2.0**-11) * d * 1.001 + m * 2.0**-11).all()


def test_k_quants_round_trip_closely():
    x = np.random.default_rng(2).standard_normal((16, 512)).astype(np.float32)
    rms = {}
    for t in (GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K):
        back = quants.dequantize(quantizers.quantize(x, t), t, x.shape)
        rms[t] = float(np.sqrt(np.mean((back - x) ** 2)))
    # more bits, less error; Q6_K is within a few percent of the data's spread
    assert rms[GGMLType.Q2_K] > rms[GGMLType.Q3_K] > rms[GGMLType.Q4_K] > rms[GGMLType.Q5_K]
    assert rms[GGMLType.Q5_K] > rms[GGMLType.Q6_K] and rms[GGMLType.Q6_K] < 0.03


# --- half and bfloat16 with known results ---


@pytest.mark.parametrize(
    "value, bits",
    [
        (1.0, 0x3C00),
        (-2.0, 0xC000),
        (65504.0, 0x7BFF),
        (65520.0, 0x7C00),  # halfway to the next binade rounds to even: infinity
        (2.0**-24, 0x0001),
        (2.0**-25, 0x0000),  # halfway to the smallest subnormal: even is zero
        (1.0 + 2.0**-11, 0x3C00),  # halfway between 1 and the next half: even
        (1.0 + 3 * 2.0**-11, 0x3C02),
        (float("nan"), 0x7E00),
        (-float("nan"), 0xFE00),
    ],
)
def test_fp32_to_fp16(value, bits):
    assert int(quants.fp32_to_fp16_bits(np.array([value], np.float32))[0]) == bits


def test_fp16_nan_comes_back_quiet():
    out = quants.fp16_bits_to_fp32(np.array([0x7C01, 0xFE00], np.uint16)).view(np.uint32)
    assert list(out) == [0x7FC02000, 0xFFC00000]


@pytest.mark.parametrize(
    "f32_bits, bf16_bits",
    [
        (0x3F800000, 0x3F80),
        (0x3F808000, 0x3F80),  # tie, even stays
        (0x3F818000, 0x3F82),  # tie, odd rounds up
        (0x3F808001, 0x3F81),
        (0x7F7FFFFF, 0x7F80),  # the largest float rounds to infinity
        (0x7F800001, 0x7FC0),  # signalling NaN made quiet
        (0xFF812345, 0xFFC1),
    ],
)
def test_fp32_to_bf16(f32_bits, bf16_bits):
    x = np.array([f32_bits], np.uint32).view(np.float32)
    assert int(quants.fp32_to_bf16_bits(x)[0]) == bf16_bits
