"""GGUF and GGML constants: metadata value types and tensor block layouts.

Block layouts are written as arithmetic so that each one documents itself; the native kernels
static_assert the same sizes, and a test compares the two.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
QK_K = 256  # values in one K-quant super-block
K_SCALE_SIZE = 12  # packed 6-bit scales and mins of Q4_K / Q5_K


class ValueType(enum.IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# struct format and numpy dtype of each fixed-size scalar value type
SCALAR_FORMATS = {
    ValueType.UINT8: ("<B", "<u1"),
    ValueType.INT8: ("<b", "<i1"),
    ValueType.UINT16: ("<H", "<u2"),
    ValueType.INT16: ("<h", "<i2"),
    ValueType.UINT32: ("<I", "<u4"),
    ValueType.INT32: ("<i", "<i4"),
    ValueType.FLOAT32: ("<f", "<f4"),
    ValueType.BOOL: ("<?", "<u1"),
    ValueType.UINT64: ("<Q", "<u8"),
    ValueType.INT64: ("<q", "<i8"),
    ValueType.FLOAT64: ("<d", "<f8"),
}


class GGMLType(enum.IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39


@dataclass(frozen=True)
class BlockLayout:
    """``block_size`` values are stored in ``type_size`` bytes."""

    block_size: int
    type_size: int


# fmt: off
BLOCK_LAYOUTS: dict[GGMLType, BlockLayout] = {
    GGMLType.F32:  BlockLayout(1, 4),
    GGMLType.F16:  BlockLayout(1, 2),
    GGMLType.BF16: BlockLayout(1, 2),
    GGMLType.F64:  BlockLayout(1, 8),
    GGMLType.I8:   BlockLayout(1, 1),
    GGMLType.I16:  BlockLayout(1, 2),
    GGMLType.I32:  BlockLayout(1, 4),
    GGMLType.I64:  BlockLayout(1, 8),
    # d (f16) + 32 x 4-bit
    GGMLType.Q4_0: BlockLayout(32, 2 + 32 // 2),
    # d, m (f16) + 32 x 4-bit
    GGMLType.Q4_1: BlockLayout(32, 2 + 2 + 32 // 2),
    # d (f16) + 32 high bits + 32 x 4-bit
    GGMLType.Q5_0: BlockLayout(32, 2 + 4 + 32 // 2),
    # d, m (f16) + 32 high bits + 32 x 4-bit
    GGMLType.Q5_1: BlockLayout(32, 2 + 2 + 4 + 32 // 2),
    # d (f16) + 32 x int8
    GGMLType.Q8_0: BlockLayout(32, 2 + 32),
    # d, s (f16) + 32 x int8
    GGMLType.Q8_1: BlockLayout(32, 2 + 2 + 32),
    # 16 x (4-bit scale, 4-bit min) + 256 x 2-bit + d, dmin (f16)
    GGMLType.Q2_K: BlockLayout(QK_K, QK_K // 16 + QK_K // 4 + 2 + 2),
    # 256 high bits + 256 x 2-bit + 16 x 6-bit scales + d (f16)
    GGMLType.Q3_K: BlockLayout(QK_K, QK_K // 8 + QK_K // 4 + 12 + 2),
    # d, dmin (f16) + 8 x (6-bit scale, 6-bit min) + 256 x 4-bit
    GGMLType.Q4_K: BlockLayout(QK_K, 2 + 2 + K_SCALE_SIZE + QK_K // 2),
    # d, dmin (f16) + 8 x (6-bit scale, 6-bit min) + 256 high bits + 256 x 4-bit
    GGMLType.Q5_K: BlockLayout(QK_K, 2 + 2 + K_SCALE_SIZE + QK_K // 8 + QK_K // 2),
    # 256 x low 4 bits + 256 x high 2 bits + 16 x int8 scales + d (f16)
    GGMLType.Q6_K: BlockLayout(QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
    # d (f32) + 256 x int8 + 16 x int16 block sums
    GGMLType.Q8_K: BlockLayout(QK_K, 4 + QK_K + QK_K // 16 * 2),
    GGMLType.IQ2_XXS: BlockLayout(QK_K, 2 + QK_K // 8 * 2),
    GGMLType.IQ2_XS:  BlockLayout(QK_K, 2 + QK_K // 8 * 2 + QK_K // 32),
    GGMLType.IQ3_XXS: BlockLayout(QK_K, 2 + QK_K // 4 + QK_K // 8),
    GGMLType.IQ1_S:   BlockLayout(QK_K, 2 + QK_K // 8 + QK_K // 16),
    GGMLType.IQ4_NL:  BlockLayout(32, 2 + 32 // 2),
    GGMLType.IQ3_S:   BlockLayout(QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    GGMLType.IQ2_S:   BlockLayout(QK_K, 2 + QK_K // 4 + QK_K // 16),
    GGMLType.IQ4_XS:  BlockLayout(QK_K, 2 + 2 + QK_K // 2 + QK_K // 64),
    GGMLType.IQ1_M:   BlockLayout(QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    GGMLType.TQ1_0:   BlockLayout(QK_K, 2 + 4 * 13),
    GGMLType.TQ2_0:   BlockLayout(QK_K, 2 + 64),
    GGMLType.MXFP4:   BlockLayout(32, 1 + 16),
}
# fmt: on

# the weight types the engines compute with; the others are parsed but refused at load
COMPUTE_TYPES = frozenset(
    {
        GGMLType.F32, GGMLType.F16, GGMLType.BF16,
        GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
        GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
    }
)  # fmt: skip
