"""Single blocks built by hand from the format descriptions, with values worked out by hand.

Every block is written byte by byte (struct fields in ggml-common.h order); the expected
values follow from the format's formula, evaluated element by element in plain Python, and a
few positions are spelled out as literals. No test here needs ggml.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from edgeinfer import quants
from edgeinfer.converters import quantizers
from edgeinfer.gguf.constants import BLOCK_LAYOUTS, GGMLType

HALF = {0.125: 0x3000, 0.25: 0x3400, 0.5: 0x3800, 1.0: 0x3C00, 2.0: 0x4000, -1.0: 0xBC00}


def h(v: float) -> bytes:
    """A half-precision scale, from a table of exactly representable values."""
    return struct.pack("<H", HALF[v])


def decode(ggml_type: GGMLType, block: bytes) -> np.ndarray:
    layout = BLOCK_LAYOUTS[ggml_type]
    assert len(block) == layout.type_size, len(block)
    raw = np.frombuffer(block, dtype=np.uint8)
    via_class = quants.QUANT_TYPES[ggml_type].dequantize_blocks(raw.reshape(1, -1))[0]
    via_module = quants.dequantize(raw, ggml_type, (layout.block_size,))
    np.testing.assert_array_equal(via_class, via_module)
    return via_module


def check(got: np.ndarray, expected: list[float]) -> None:
    np.testing.assert_array_equal(got, np.array(expected, dtype=np.float32))


# --- floats ---


def test_f32():
    check(decode(GGMLType.F32, struct.pack("<f", -1.25)), [-1.25])


@pytest.mark.parametrize(
    "bits, value",
    [(0x3C00, 1.0), (0xC000, -2.0), (0x0001, 2.0**-24), (0x7BFF, 65504.0), (0xFC00, -np.inf)],
)
def test_f16(bits, value):
    check(decode(GGMLType.F16, struct.pack("<H", bits)), [value])


@pytest.mark.parametrize("bits, value", [(0x3F80, 1.0), (0xC0A0, -5.0), (0x0001, 2.0**-133)])
def test_bf16(bits, value):
    check(decode(GGMLType.BF16, struct.pack("<H", bits)), [value])


# --- 32-value blocks ---


def test_q4_0():
    # d = 0.5; byte j holds value j (low nibble j) and value j + 16 (high nibble 15 - j)
    block = h(0.5) + bytes(j | (15 - j) << 4 for j in range(16))
    got = decode(GGMLType.Q4_0, block)
    check(got, [(j - 8) * 0.5 for j in range(16)] + [(7 - j) * 0.5 for j in range(16)])
    assert got[0] == -4.0 and got[15] == 3.5 and got[16] == 3.5 and got[31] == -4.0


def test_q4_1():
    # d = 0.25, m = -1: x = 0.25 q - 1 with q = j in both nibbles of byte j
    block = h(0.25) + h(-1.0) + bytes(j | j << 4 for j in range(16))
    got = decode(GGMLType.Q4_1, block)
    check(got, [j * 0.25 - 1 for j in range(16)] * 2)
    assert got[0] == -1.0 and got[31] == 2.75


def test_q5_0():
    # d = 1; qh = 0xFFFF0000: the fifth bit is set for values 16..31 only
    block = h(1.0) + struct.pack("<I", 0xFFFF0000) + bytes(j | j << 4 for j in range(16))
    got = decode(GGMLType.Q5_0, block)
    check(got, [j - 16 for j in range(16)] + [j for j in range(16)])
    assert got[0] == -16.0 and got[16] == 0.0 and got[31] == 15.0


def test_q5_1():
    # d = 2, m = 0.5; low nibbles 15, high nibbles 0; fifth bit set for values 0..15
    block = h(2.0) + h(0.5) + struct.pack("<I", 0x0000FFFF) + bytes([0x0F] * 16)
    check(decode(GGMLType.Q5_1, block), [31 * 2 + 0.5] * 16 + [0.5] * 16)


def test_q8_0():
    qs = [-128, -1, 0, 1, 127] + list(range(-13, 14))
    block = h(0.125) + struct.pack("<32b", *qs)
    got = decode(GGMLType.Q8_0, block)
    check(got, [q * 0.125 for q in qs])
    assert list(got[:5]) == [-16.0, -0.125, 0.0, 0.125, 15.875]


def test_q8_1_ignores_the_sum():
    qs = list(range(-16, 16))
    block = h(2.0) + h(-1.0) + struct.pack("<32b", *qs)
    check(decode(GGMLType.Q8_1, block), [2.0 * q for q in qs])


# --- K-quants: one 256-value super-block each ---


def test_q2_k():
    # 16 groups of 16. scale byte s: low nibble s (scale), high nibble 15 - s (min).
    # every qs byte is 0b11_10_01_00, so value e gets q = (e % 128) // 32.
    scales = bytes(s | (15 - s) << 4 for s in range(16))
    block = scales + bytes([0xE4] * 64) + h(1.0) + h(0.5)
    got = decode(GGMLType.Q2_K, block)
    check(got, [1.0 * (e // 16) * ((e % 128) // 32) - 0.5 * (15 - e // 16) for e in range(256)])
    assert got[0] == -7.5 and got[40] == -4.5 and got[130] == -3.5 and got[255] == 45.0


def test_q3_k():
    # 6-bit scales l_s = 4 s + 1, stored as l - 32, so group s has scale 4 s - 31.
    # low nibbles of l_j / l_(j+8) share byte j; bits 4-5 of l_j sit in byte 8 + j % 4 at
    # bit 2 (j // 4): every l_(4a+k) >> 4 equals a, so bytes 8..11 are 0b11_10_01_00.
    scales = bytes([0x11, 0x55, 0x99, 0xDD] * 2 + [0xE4] * 4)
    # hmask byte m, bit k: high bit of value 32 k + m. All set except byte 0.
    hmask = bytes([0x00] + [0xFF] * 31)
    block = hmask + bytes([0xE4] * 64) + scales + h(0.5)

    def value(e):
        q = (e % 128) // 32 - (4 if e % 32 == 0 else 0)
        return 0.5 * (4 * (e // 16) - 31) * q

    got = decode(GGMLType.Q3_K, block)
    check(got, [value(e) for e in range(256)])
    assert got[0] == 62.0 and got[1] == 0.0 and got[255] == 43.5


K4_SCALES = bytes(
    # sub-block s: scale sc = s + 1 except sc_5 = 37 (0b100101); min m = 2 s.
    # bytes 0..3: sc_0..3 | (sc_4..7 >> 4) << 6  -> 1, 2 | 2 << 6, 3, 4
    # bytes 4..7: m_0..3 | (m_4..7 >> 4) << 6    -> 0, 2, 4, 6
    # bytes 8..11: (sc_4..7 & 15) | (m_4..7 & 15) << 4
    [0x01, 0x82, 0x03, 0x04, 0x00, 0x02, 0x04, 0x06, 0x85, 0xA5, 0xC7, 0xE8]
)
K4_SC = [1, 2, 3, 4, 5, 37, 7, 8]


def test_q4_k():
    # d = 0.5, dmin = 0.25; qs bytes 0x73: even sub-blocks read the low nibble 3, odd the high 7
    block = h(0.5) + h(0.25) + K4_SCALES + bytes([0x73] * 128)
    got = decode(GGMLType.Q4_K, block)
    per_group = [0.5 * K4_SC[s] * (3 if s % 2 == 0 else 7) - 0.25 * 2 * s for s in range(8)]
    check(got, [per_group[e // 32] for e in range(256)])
    assert per_group == [1.5, 6.5, 3.5, 12.5, 5.5, 127.0, 7.5, 24.5]


def test_q5_k():
    # as Q4_K, plus qh[0] = 0xFF: value 0 of every sub-block gets its fifth bit (+16)
    block = h(0.5) + h(0.25) + K4_SCALES + bytes([0xFF] + [0] * 31) + bytes([0x73] * 128)

    def value(e):
        s = e // 32
        q = (3 if s % 2 == 0 else 7) + (16 if e % 32 == 0 else 0)
        return 0.5 * K4_SC[s] * q - 0.25 * 2 * s

    got = decode(GGMLType.Q5_K, block)
    check(got, [value(e) for e in range(256)])
    assert got[0] == 9.5 and got[1] == 1.5 and got[32] == 22.5


def test_q6_k():
    # d = 0.25, int8 scales s - 8. ql bytes 0x21 (nibbles 1 and 2), qh bytes 0b11_10_01_00.
    # In each 128-half, quarter k (values 32 k + l) takes the low nibble of ql[l] (k = 0),
    # of ql[l + 32] (k = 1), the high nibbles (k = 2, 3), and bits 2k..2k+1 of qh[l] = k.
    block = bytes([0x21] * 128) + bytes([0xE4] * 64) + struct.pack("<16b", *range(-8, 8)) + h(0.25)

    def value(e):
        k = (e % 128) // 32
        q = ((1 if k < 2 else 2) | k << 4) - 32
        return 0.25 * (e // 16 - 8) * q

    got = decode(GGMLType.Q6_K, block)
    check(got, [value(e) for e in range(256)])
    assert got[0] == 62.0 and got[100] == -9.0


def test_q8_k():
    block = struct.pack("<f", -0.5) + struct.pack("<256b", *range(-128, 128)) + bytes(32)
    check(decode(GGMLType.Q8_K, block), [-0.5 * q for q in range(-128, 128)])


# --- quantizing blocks whose result is known ---


def quantize_one(ggml_type: GGMLType, values) -> np.ndarray:
    x = np.asarray(values, dtype=np.float32)
    return quantizers.quantize(x[None], ggml_type)[0].view(quants.QUANT_TYPES[ggml_type].layout)[0]


def test_quantize_q4_0_integers():
    # the first value of largest magnitude is -8, so d = -8 / -8 = 1 and q = x + 8
    x = [-8, 8] + list(range(-7, 8)) + list(range(7, -8, -1))
    b = quantize_one(GGMLType.Q4_0, x)
    assert b["d"] == 0x3C00
    q = [v + 8 for v in x]
    q[1] = 15  # 8 + 8 = 16 is clamped
    assert list(b["qs"]) == [q[j] | q[j + 16] << 4 for j in range(16)]


def test_quantize_q4_1_ramp():
    b = quantize_one(GGMLType.Q4_1, [j % 16 for j in range(32)])
    assert (b["d"], b["m"]) == (0x3C00, 0)
    assert list(b["qs"]) == [j | j << 4 for j in range(16)]


def test_quantize_q5_0_and_q5_1():
    b = quantize_one(GGMLType.Q5_0, list(range(-16, 16)))  # max -16: d = 1, q = x + 16
    assert b["d"] == 0x3C00 and bytes(b["qh"]) == struct.pack("<I", 0xFFFF0000)
    assert list(b["qs"]) == [j | j << 4 for j in range(16)]
    b = quantize_one(GGMLType.Q5_1, list(range(32)))  # min 0, max 31: d = 1, m = 0, q = x
    assert (b["d"], b["m"]) == (0x3C00, 0) and bytes(b["qh"]) == struct.pack("<I", 0xFFFF0000)


def test_quantize_q8_0_and_q8_1():
    x = [127, -127] + list(range(-60, 60, 4))
    b = quantize_one(GGMLType.Q8_0, x)
    assert b["d"] == 0x3C00 and list(b["qs"]) == x
    b = quantize_one(GGMLType.Q8_1, x)
    assert b["d"] == 0x3C00 and b["s"] == quants.fp32_to_fp16_bits(np.float32(sum(x)))


def test_quantize_q8_0_rounds_half_away_from_zero():
    # d = 127 / 127 = 1 exactly, so q = roundf(x): 2.5 -> 3 and -2.5 -> -3 (not 2, -2)
    b = quantize_one(GGMLType.Q8_0, [127, 2.5, -2.5, 0.5, -0.5, 1.5] + [0] * 26)
    assert list(b["qs"][:6]) == [127, 3, -3, 1, -1, 2]


def test_quantize_q8_k_keeps_the_sign_of_the_largest_value():
    # iscale = -127 / max: with max = +127 the scale is d = -1 and the quants are -x
    x = np.array([127] + list(range(-127, 128))[:255], dtype=np.float32)
    b = quantize_one(GGMLType.Q8_K, x)
    assert b["d"] == -1.0
    np.testing.assert_array_equal(b["qs"], -x.astype(np.int8))
    np.testing.assert_array_equal(b["bsums"], (-x).reshape(16, 16).sum(axis=1))


@pytest.mark.parametrize(
    "ggml_type",
    [GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q8_K],
)
def test_quantize_all_zero_super_block_is_zero_bytes(ggml_type):
    b = quantizers.quantize(np.zeros((1, 256), np.float32), ggml_type)
    assert not b.any()
    np.testing.assert_array_equal(quants.dequantize(b, ggml_type, (256,)), np.zeros(256))
