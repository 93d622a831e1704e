/* GGML block layouts, byte for byte, with their sizes checked at compile time.
 * edgeinfer/gguf/constants.py states the same sizes; tests compare the two. */
#ifndef EI_BLOCKS_H
#define EI_BLOCKS_H

#include <assert.h>
#include <stdint.h>

typedef uint16_t ei_f16;  /* IEEE half, stored as bits */
typedef uint16_t ei_bf16; /* bfloat16, stored as bits */

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef struct { ei_f16 d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
static_assert(sizeof(block_q4_0) == 2 + QK4_0 / 2, "block_q4_0 size");

/* Q4_0 rows interleaved by EI_X16, an engine-internal layout (the engine's own copy, made by
 * the first product using the weight where an instruction set has a kernel for it): block i of 16 consecutive rows holds
 * their 16 scales, then for k = 0..3 the bytes qs[4k..4k+3] of row 0, row 1, ... row 15, so
 * that one 64-byte load holds four bytes (8 weights) of every row, lane r = row r */
#define EI_X16 16
typedef struct { ei_f16 d[EI_X16]; uint8_t qs[EI_X16 * QK4_0 / 2]; } block_q4_0x16;
static_assert(sizeof(block_q4_0x16) == EI_X16 * sizeof(block_q4_0), "block_q4_0x16 size");

typedef struct { ei_f16 d, m; uint8_t qs[QK4_1 / 2]; } block_q4_1;
static_assert(sizeof(block_q4_1) == 2 + 2 + QK4_1 / 2, "block_q4_1 size");
/* Q4_1 rows interleaved likewise: the 16 scales, the 16 minimums, then qs as block_q4_0x16's */
typedef struct { ei_f16 d[EI_X16], m[EI_X16]; uint8_t qs[EI_X16 * QK4_1 / 2]; } block_q4_1x16;
static_assert(sizeof(block_q4_1x16) == EI_X16 * sizeof(block_q4_1), "block_q4_1x16 size");

typedef struct { ei_f16 d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;
static_assert(sizeof(block_q5_0) == 2 + 4 + QK5_0 / 2, "block_q5_0 size");
/* Q5_0 rows interleaved likewise; qh[r][b], bit k: the high bit of value 4 k + b (k < 4) or
 * 16 + 4 (k - 4) + b (k >= 4) of row r, so one shift and mask moves it under the nibble */
typedef struct { ei_f16 d[EI_X16]; uint8_t qh[EI_X16][4]; uint8_t qs[EI_X16 * QK5_0 / 2]; } block_q5_0x16;
static_assert(sizeof(block_q5_0x16) == EI_X16 * sizeof(block_q5_0), "block_q5_0x16 size");

typedef struct { ei_f16 d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
static_assert(sizeof(block_q5_1) == 2 + 2 + 4 + QK5_1 / 2, "block_q5_1 size");

typedef struct { ei_f16 d; int8_t qs[QK8_0]; } block_q8_0;
static_assert(sizeof(block_q8_0) == 2 + QK8_0, "block_q8_0 size");
/* Q8_0 rows interleaved likewise: the 16 scales, then for k = 0..7 the values qs[4k..4k+3]
 * of row 0, row 1, ... row 15 (byte 64 k + 4 r + b: value 4 k + b of row r) */
typedef struct { ei_f16 d[EI_X16]; int8_t qs[EI_X16 * QK8_0]; } block_q8_0x16;
static_assert(sizeof(block_q8_0x16) == EI_X16 * sizeof(block_q8_0), "block_q8_0x16 size");

/* s = d * sum(qs): lets q4_1/q5_1 dots fold in their minimum */
typedef struct { ei_f16 d, s; int8_t qs[QK8_1]; } block_q8_1;
static_assert(sizeof(block_q8_1) == 2 + 2 + QK8_1, "block_q8_1 size");

typedef struct {
    uint8_t scales[QK_K / 16]; /* 4-bit scale, 4-bit min per 16 values */
    uint8_t qs[QK_K / 4];      /* 2-bit quants */
    ei_f16 d, dmin;
} block_q2_K;
static_assert(sizeof(block_q2_K) == QK_K / 16 + QK_K / 4 + 2 + 2, "block_q2_K size");

typedef struct {
    uint8_t hmask[QK_K / 8]; /* high bit */
    uint8_t qs[QK_K / 4];    /* low 2 bits */
    uint8_t scales[12];      /* 16 x 6-bit scales */
    ei_f16 d;
} block_q3_K;
static_assert(sizeof(block_q3_K) == QK_K / 8 + QK_K / 4 + 12 + 2, "block_q3_K size");

typedef struct {
    ei_f16 d, dmin;
    uint8_t scales[K_SCALE_SIZE]; /* 8 x (6-bit scale, 6-bit min) */
    uint8_t qs[QK_K / 2];
} block_q4_K;
static_assert(sizeof(block_q4_K) == 2 + 2 + K_SCALE_SIZE + QK_K / 2, "block_q4_K size");

typedef struct {
    ei_f16 d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;
static_assert(sizeof(block_q5_K) == 2 + 2 + K_SCALE_SIZE + QK_K / 8 + QK_K / 2, "block_q5_K size");

typedef struct {
    uint8_t ql[QK_K / 2];     /* low 4 bits */
    uint8_t qh[QK_K / 4];     /* high 2 bits */
    int8_t scales[QK_K / 16]; /* 8-bit scales */
    ei_f16 d;
} block_q6_K;
static_assert(sizeof(block_q6_K) == QK_K / 2 + QK_K / 4 + QK_K / 16 + 2, "block_q6_K size");

/* the 6-bit scale and minimum of sub-block j (0..7) of Q4_K / Q5_K */
static inline void ei_k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* K super-blocks of EI_X16 rows interleaved (the engine's copies, like block_q4_0x16): the
 * values of each 32-value unit u of the super-block as nibbles laid out as a block_q4_0x16's
 * qs, so that byte 64 k + 4 r + b of the unit holds value 4 k + b of row r in its low nibble
 * and value 16 + 4 k + b in its high one (k < 4, b < 4), and the rows' scales unpacked, row
 * by row within each sub-block. Q4_K keeps 8 scales and mins of 6 bits as bytes (64 bytes
 * more than 16 rows as stored); Q6_K keeps the high two bits of its 6-bit values in qh, for
 * each unit and m < 2 byte 64 m + 4 r + b: bits 0-1 those of value 8 m + b, 2-3 of 16 + 8 m
 * + b, 4-5 of 8 m + 4 + b, 6-7 of 16 + 8 m + 4 + b (the same size as the rows). */
typedef struct {
    ei_f16 d[EI_X16], dmin[EI_X16];
    uint8_t sc[QK_K / 32][EI_X16], mn[QK_K / 32][EI_X16];
    uint8_t qs[QK_K / 32][EI_X16 * 16];
} block_q4_Kx16;
static_assert(sizeof(block_q4_Kx16) == EI_X16 * (2 + 2 + 8 + 8 + QK_K / 2), "block_q4_Kx16 size");

typedef struct {
    ei_f16 d[EI_X16];
    int8_t sc[QK_K / 16][EI_X16];
    uint8_t ql[QK_K / 32][EI_X16 * 16];
    uint8_t qh[QK_K / 32][EI_X16 * 8];
} block_q6_Kx16;
static_assert(sizeof(block_q6_Kx16) == EI_X16 * sizeof(block_q6_K), "block_q6_Kx16 size");

/* Q5_K: its low four bits as a block_q4_Kx16, the fifth bits of each unit as block_q5_0x16
 * keeps them (byte 4 r + b, bit k: value 4 k + b (k < 4) or 16 + 4 (k - 4) + b of row r),
 * so that one shift and mask moves a bit under its nibble (the same size as Q4_K's copy
 * plus the rows' qh) */
typedef struct {
    block_q4_Kx16 q4;
    uint8_t qh[QK_K / 32][EI_X16 * 4];
} block_q5_Kx16;
static_assert(sizeof(block_q5_Kx16) == EI_X16 * (2 + 2 + 8 + 8 + QK_K / 2 + QK_K / 8), "block_q5_Kx16 size");

/* F16 or BF16 rows interleaved by EI_X16 (their block is one value): element d of a row
 * group holds value d of row 0, row 1, ... row 15, so that one 8-byte load holds value d of
 * four rows, lane r = row r (the same size as the rows) */
typedef struct { uint16_t v[EI_X16]; } block_f16x16;
static_assert(sizeof(block_f16x16) == EI_X16 * sizeof(ei_f16), "block_f16x16 size");

/* activations for K-quant dots: float scale, int8 values, sums of each 16 */
typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} block_q8_K;
static_assert(sizeof(block_q8_K) == 4 + QK_K + QK_K / 16 * 2, "block_q8_K size");

/* GGML type codes (the GGUF tensor type field) */
enum ei_type {
    EI_TYPE_F32 = 0, EI_TYPE_F16 = 1, EI_TYPE_Q4_0 = 2, EI_TYPE_Q4_1 = 3,
    EI_TYPE_Q5_0 = 6, EI_TYPE_Q5_1 = 7, EI_TYPE_Q8_0 = 8, EI_TYPE_Q8_1 = 9,
    EI_TYPE_Q2_K = 10, EI_TYPE_Q3_K = 11, EI_TYPE_Q4_K = 12, EI_TYPE_Q5_K = 13,
    EI_TYPE_Q6_K = 14, EI_TYPE_Q8_K = 15, EI_TYPE_BF16 = 30, EI_TYPE_COUNT = 31
};

#endif
