/* Weight blocks of every type as NEON registers, shared by the dot products (quants.c) and
 * the tiles (gemm.c): unpacking into int8 values, exact integer block sums and block terms.
 *
 * Legacy blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) against q8_0 / q8_1 activations: per block, the
 * exact integer dot isum; the term (double)(d_w * d_x) * isum (d_w * d_x is exact in float:
 * two halves), plus (double)(m_w * s_x) for the _1 types.
 *
 * K-quants (Q2_K .. Q6_K) against q8_K: per 256-value block, the exact integers
 * isum = sum_j sc_j * dot_j and, for the types with minimums, imin = sum_j mn_j * bsum_j;
 * then, in double as the reference writes it, (y.d * d) * isum - (y.d * dmin) * imin.
 *
 * Float rows (F32, F16, BF16): every product is exact (two halves multiply exactly in float,
 * floats and bfloat16s in double, where fused and unfused multiply-add round alike).
 *
 * Each output adds its terms in block (or element) order, so results equal the reference bit
 * for bit. */
#ifndef EI_NEON_BLOCKS_H
#define EI_NEON_BLOCKS_H

#include <stddef.h>

#include "simd.h"

/* ---- legacy blocks ------------------------------------------------------------------------ */

/* one weight block as 32 int8 values: v[0] holds values 0..15, v[1] values 16..31 */
typedef void (*unpack32_fn)(const uint8_t *block, int8x16_t v[2]);

static inline void unpack_q4_0(const uint8_t *b, int8x16_t v[2]) {
    const uint8x16_t q = vld1q_u8(b + offsetof(block_q4_0, qs));
    v[0] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f))), vdupq_n_s8(8));
    v[1] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
}

static inline void unpack_q4_1(const uint8_t *b, int8x16_t v[2]) {
    const uint8x16_t q = vld1q_u8(b + offsetof(block_q4_1, qs));
    v[0] = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f)));
    v[1] = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
}

/* bit j of the little-endian 32-bit field qh as 0x10 in byte j (h[0]: j < 16, h[1]: j >= 16) */
static inline void q5_high(const uint8_t *qh, uint8x16_t h[2]) {
    static const uint8_t sel[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint32_t w;
    memcpy(&w, qh, 4);
    const uint8x16_t bytes = vreinterpretq_u8_u32(vdupq_n_u32(w)), m = vld1q_u8(bit);
    h[0] = vandq_u8(vtstq_u8(vqtbl1q_u8(bytes, vld1q_u8(sel)), m), vdupq_n_u8(0x10));
    h[1] = vandq_u8(vtstq_u8(vqtbl1q_u8(bytes, vld1q_u8(sel + 16)), m), vdupq_n_u8(0x10));
}

static inline void unpack_q5_0(const uint8_t *b, int8x16_t v[2]) {
    const uint8x16_t q = vld1q_u8(b + offsetof(block_q5_0, qs));
    uint8x16_t h[2];
    q5_high(b + offsetof(block_q5_0, qh), h);
    v[0] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0f)), h[0])), vdupq_n_s8(16));
    v[1] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(q, 4), h[1])), vdupq_n_s8(16));
}

static inline void unpack_q5_1(const uint8_t *b, int8x16_t v[2]) {
    const uint8x16_t q = vld1q_u8(b + offsetof(block_q5_1, qs));
    uint8x16_t h[2];
    q5_high(b + offsetof(block_q5_1, qh), h);
    v[0] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0f)), h[0]));
    v[1] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(q, 4), h[1]));
}

static inline void unpack_q8_0(const uint8_t *b, int8x16_t v[2]) {
    v[0] = vld1q_s8((const int8_t *)b + offsetof(block_q8_0, qs));
    v[1] = vld1q_s8((const int8_t *)b + offsetof(block_q8_0, qs) + 16);
}

/* the 32 products of weight block w with activations y, in the lanes (small: |w| <= 64) */
EI_INLINE int32x4_t block_dot(const int8x16_t w[2], const uint8_t *y, int small) {
    const int8x16_t y0 = vld1q_s8((const int8_t *)y), y1 = vld1q_s8((const int8_t *)y + 16);
    const int32x4_t z = vdupq_n_s32(0);
    return small ? dot32s(z, w[0], w[1], y0, y1) : dot16(dot16(z, w[0], y0), w[1], y1);
}

/* t = four block terms: d * isum, plus the minimum terms ms when there are any */
EI_INLINE void block_terms(float64x2_t t[2], float32x4_t d, int32x4_t isum, int has_min, float32x4_t ms) {
    const float32x4_t f = vcvtq_f32_s32(isum); /* exact: |isum| <= 32 * 128 * 127 < 2^24 */
    t[0] = vmulq_f64(vcvt_f64_f32(vget_low_f32(d)), vcvt_f64_f32(vget_low_f32(f)));
    t[1] = vmulq_f64(vcvt_high_f64_f32(d), vcvt_high_f64_f32(f));
    if (has_min) {
        t[0] = vaddq_f64(t[0], vcvt_f64_f32(vget_low_f32(ms)));
        t[1] = vaddq_f64(t[1], vcvt_high_f64_f32(ms));
    }
}

/* activation blocks: q8_1 (d, s, qs) for the _1 types, else q8_0 (d, qs) */
#define ACT_BYTES(has_min) ((has_min) ? sizeof(block_q8_1) : sizeof(block_q8_0))
#define ACT_QS(has_min) ((has_min) ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs))
#define M_OFF 2 /* the _1 types' m and q8_1's s follow d */

/* ---- K-quants ----------------------------------------------------------------------------- */

/* group g (0..7) of a block as 32 int8 values: v[0] = values 32g..32g+15, v[1] the next 16 */
typedef void (*kunpack_fn)(const uint8_t *block, int g, int8x16_t v[2]);
/* the block's integer scales and minimums per sub-block (16 of 16 values, or 8 of 32) */
typedef void (*kscales_fn)(const uint8_t *block, int8_t sc[16], int8_t mn[16]);

/* v << left (a negative count shifts right): the shifts depend on g, which need not be constant */
static inline uint8x16_t shl(uint8x16_t v, int left) { return vshlq_u8(v, vdupq_n_s8((int8_t)left)); }

static inline void unpack_q2_K(const uint8_t *b, int g, int8x16_t v[2]) {
    const uint8_t *qs = b + offsetof(block_q2_K, qs) + 32 * (g >> 2);
    EI_UNROLL for (int h = 0; h < 2; h++) v[h] = vreinterpretq_s8_u8(vandq_u8(shl(vld1q_u8(qs + 16 * h), -2 * (g & 3)), vdupq_n_u8(3)));
}

static inline void unpack_q3_K(const uint8_t *b, int g, int8x16_t v[2]) {
    const uint8_t *qs = b + offsetof(block_q3_K, qs) + 32 * (g >> 2), *hm = b + offsetof(block_q3_K, hmask);
    const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << g));
    EI_UNROLL for (int h = 0; h < 2; h++) {
        const uint8x16_t low = vandq_u8(shl(vld1q_u8(qs + 16 * h), -2 * (g & 3)), vdupq_n_u8(3));
        const uint8x16_t four = vbicq_u8(vdupq_n_u8(4), vtstq_u8(vld1q_u8(hm + 16 * h), bit)); /* 4 where the bit is clear */
        v[h] = vreinterpretq_s8_u8(vsubq_u8(low, four));
    }
}

static inline void unpack_q4_K(const uint8_t *b, int g, int8x16_t v[2]) {
    const uint8_t *qs = b + offsetof(block_q4_K, qs) + 32 * (g >> 1);
    EI_UNROLL for (int h = 0; h < 2; h++) v[h] = vreinterpretq_s8_u8(vandq_u8(shl(vld1q_u8(qs + 16 * h), -4 * (g & 1)), vdupq_n_u8(0x0f)));
}

static inline void unpack_q5_K(const uint8_t *b, int g, int8x16_t v[2]) {
    const uint8_t *qs = b + offsetof(block_q5_K, qs) + 32 * (g >> 1), *qh = b + offsetof(block_q5_K, qh);
    EI_UNROLL for (int h = 0; h < 2; h++) {
        const uint8x16_t low = vandq_u8(shl(vld1q_u8(qs + 16 * h), -4 * (g & 1)), vdupq_n_u8(0x0f));
        const uint8x16_t high = vandq_u8(shl(vld1q_u8(qh + 16 * h), 4 - g), vdupq_n_u8(0x10)); /* bit g */
        v[h] = vreinterpretq_s8_u8(vorrq_u8(low, high));
    }
}

static inline void unpack_q6_K(const uint8_t *b, int g, int8x16_t v[2]) {
    const int half = g >> 2, s = g & 3;
    const uint8_t *ql = b + offsetof(block_q6_K, ql) + 64 * half + 32 * (s & 1), *qh = b + offsetof(block_q6_K, qh) + 32 * half;
    EI_UNROLL for (int h = 0; h < 2; h++) {
        const uint8x16_t low = vandq_u8(shl(vld1q_u8(ql + 16 * h), -4 * (s >> 1)), vdupq_n_u8(0x0f));
        const uint8x16_t high = vandq_u8(shl(vld1q_u8(qh + 16 * h), 4 - 2 * s), vdupq_n_u8(0x30)); /* bits 2s, 2s+1 */
        v[h] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low, high)), vdupq_n_s8(32));
    }
}

static inline void scales_q2_K(const uint8_t *b, int8_t sc[16], int8_t mn[16]) {
    const uint8x16_t s = vld1q_u8(b + offsetof(block_q2_K, scales));
    vst1q_s8(sc, vreinterpretq_s8_u8(vandq_u8(s, vdupq_n_u8(0x0f))));
    vst1q_s8(mn, vreinterpretq_s8_u8(vshrq_n_u8(s, 4)));
}

/* 16 scales of 6 bits: low nibbles in bytes 0..7 (two per byte), high pairs in bytes 8..11 */
static inline void scales_q3_K(const uint8_t *b, int8_t sc[16], int8_t mn[16]) {
    uint32_t a[3];
    memcpy(a, b + offsetof(block_q3_K, scales), 12);
    const uint32_t nib = 0x0f0f0f0f, two = 0x03030303;
    const uint32_t w[4] = {(a[0] & nib) | ((a[2] & two) << 4), (a[1] & nib) | (((a[2] >> 2) & two) << 4),
                           ((a[0] >> 4) & nib) | (((a[2] >> 4) & two) << 4), ((a[1] >> 4) & nib) | (((a[2] >> 6) & two) << 4)};
    vst1q_s8(sc, vsubq_s8(vreinterpretq_s8_u32(vld1q_u32(w)), vdupq_n_s8(32)));
    (void)mn;
}

/* 8 x (6-bit scale, 6-bit minimum) in 12 bytes */
static inline void scales_k4(const uint8_t *s, int8_t sc[16], int8_t mn[16]) {
    uint32_t a[3];
    memcpy(a, s, 12);
    const uint32_t six = 0x3f3f3f3f, nib = 0x0f0f0f0f, two = 0x03030303;
    const uint32_t w[4] = {a[0] & six, (a[2] & nib) | (((a[0] >> 6) & two) << 4),
                           a[1] & six, ((a[2] >> 4) & nib) | (((a[1] >> 6) & two) << 4)};
    memcpy(sc, w, 8);
    memcpy(mn, w + 2, 8);
    memset(sc + 8, 0, 8); /* eight sub-blocks: the rest stays defined for whole-vector loads */
    memset(mn + 8, 0, 8);
}

static inline void scales_q4_K(const uint8_t *b, int8_t sc[16], int8_t mn[16]) { scales_k4(b + offsetof(block_q4_K, scales), sc, mn); }
static inline void scales_q5_K(const uint8_t *b, int8_t sc[16], int8_t mn[16]) { scales_k4(b + offsetof(block_q5_K, scales), sc, mn); }

static inline void scales_q6_K(const uint8_t *b, int8_t sc[16], int8_t mn[16]) {
    memcpy(sc, b + offsetof(block_q6_K, scales), 16);
    (void)mn;
}

/* lanes summing to imin = sum_j mn_j * bsum_j (bsum_j over the sub-block's 16 or 32 values) */
EI_INLINE int32x4_t min_dot(const int8_t *mn, const int16_t *bsums, int sub) {
    const int16x8_t b0 = vld1q_s16(bsums), b1 = vld1q_s16(bsums + 8);
    if (sub == 32) {
        const int16x8_t bs = vpaddq_s16(b0, b1), m = vmovl_s8(vld1_s8(mn));
        return vmlal_high_s16(vmull_s16(vget_low_s16(m), vget_low_s16(bs)), m, bs);
    }
    const int8x16_t m8 = vld1q_s8(mn);
    const int16x8_t m0 = vmovl_s8(vget_low_s8(m8)), m1 = vmovl_high_s8(m8);
    int32x4_t p = vmull_s16(vget_low_s16(m0), vget_low_s16(b0));
    p = vmlal_high_s16(p, m0, b0);
    p = vmlal_s16(p, vget_low_s16(m1), vget_low_s16(b1));
    return vmlal_high_s16(p, m1, b1);
}

/* one weight type as the generic kernels see it */
typedef struct {
    size_t bytes;
    int d_off, dmin_off; /* dmin_off < 0: no minimums */
    int sub;             /* values per scale: 16 or 32 */
} ktype;

/* ---- float rows --------------------------------------------------------------------------- */

enum { ROW_F32, ROW_F16, ROW_BF16 };

/* elements e..e+3 of a row as floats */
EI_INLINE float32x4_t load4(const void *row, int e, int kind) {
    if (kind == ROW_F32) return vld1q_f32((const float *)row + e);
    const uint16x4_t h = vld1_u16((const uint16_t *)row + e);
    if (kind == ROW_F16) return vcvt_f32_f16(vreinterpret_f16_u16(h));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

EI_INLINE float load1(const void *row, int e, int kind) {
    if (kind == ROW_F32) return ((const float *)row)[e];
    const uint16_t h = ((const uint16_t *)row)[e];
    return kind == ROW_F16 ? h2f(h) : ei_bf16_to_fp32(h);
}

/* the exact products of the lanes of v with a, in double */
EI_INLINE void products(float64x2_t p[2], float32x4_t v, float a, int kind) {
    if (kind == ROW_F16) {
        const float32x4_t f = vmulq_n_f32(v, a);
        p[0] = vcvt_f64_f32(vget_low_f32(f));
        p[1] = vcvt_high_f64_f32(f);
    } else {
        p[0] = vmulq_n_f64(vcvt_f64_f32(vget_low_f32(v)), a);
        p[1] = vmulq_n_f64(vcvt_high_f64_f32(v), a);
    }
}

#endif
