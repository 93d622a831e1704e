/* Weight blocks of every quantized type as unsigned bytes plus integer scales, the common
 * shape that the avx512 dot products and matrix tiles consume.
 *
 * A weight value w is stored as the unsigned byte u = w + offset, so that vpdpbusd (u8 x s8)
 * or vpmaddubsw can multiply it with the signed activations; the offset comes back as
 * offset * (sum of the activations), which every block of the partner type carries or costs
 * one more dot product. Every integer is exact: these are the isum and imin of
 * simd/ref/quants.c, computed in another order. */
#ifndef EI_AVX512_BLOCKS_H
#define EI_AVX512_BLOCKS_H

#include "../common/ei_kernels.h"
#include "simd.h"

/* The loops over tile rows, columns and vector quarters must unroll and the helpers inline:
 * their arrays of vectors live in registers only then (-O2 does not unroll on its own).
 * Under SIMDe, where every intrinsic is a function, both would only make compiling slow. */
#if (defined(__clang__) || defined(__GNUC__)) && !defined(EI_USE_SIMDE)
#define EI_INLINE static inline __attribute__((always_inline))
#define EI_UNROLL _Pragma("GCC unroll 16")
#else
#define EI_INLINE static inline
#define EI_UNROLL
#endif

EI_INLINE float f16_to_f32(ei_f16 h) { return _cvtsh_ss(h); }

/* acc + sum of four u8 x s8 products per 32-bit lane (vpdpbusd, or the same sums without it) */
EI_INLINE __m512i dot_u8s8(__m512i acc, __m512i u, __m512i s, int vnni) {
    if (vnni) return _mm512_dpbusd_epi32(acc, u, s);
    /* widened to 16 bits, exact for every input; lane i sums bytes 4i..4i+3 as vpdpbusd does */
    const __m512i lo = _mm512_madd_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(u)),
                                         _mm512_cvtepi8_epi16(_mm512_castsi512_si256(s)));
    const __m512i hi = _mm512_madd_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(u, 1)),
                                         _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(s, 1)));
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    return _mm512_add_epi32(acc, _mm512_add_epi32(_mm512_permutex2var_epi32(lo, even, hi),
                                                  _mm512_permutex2var_epi32(lo, odd, hi)));
}

/* acc + sum of two s16 x s16 products per 32-bit lane (vpdpwssd, or vpmaddwd and an add) */
EI_INLINE __m512i dot_s16(__m512i acc, __m512i a, __m512i b, int vnni) {
    if (vnni) return _mm512_dpwssd_epi32(acc, a, b);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
}

/* ---- legacy blocks (32 values): two consecutive blocks as 64 unsigned bytes ------------- */

/* bytes 0..15 of a and of b spread into [a lo nibbles, a hi nibbles, b lo, b hi] */
EI_INLINE __m512i nibbles2(const uint8_t *a, const uint8_t *b) {
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)a));
    v = _mm512_mask_broadcast_i32x4(v, 0xff00, _mm_loadu_si128((const __m128i *)b));
    v = _mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
}

EI_INLINE uint64_t qh64(const uint8_t *a, const uint8_t *b) {
    uint32_t x, y;
    memcpy(&x, a, 4);
    memcpy(&y, b, 4);
    return (uint64_t)x | (uint64_t)y << 32;
}

/* the fifth bit of q5 values: +16 where the bit of qh is set */
EI_INLINE __m512i add_bit4(__m512i lo, uint64_t qh) {
    return _mm512_mask_add_epi8(lo, (__mmask64)qh, lo, _mm512_set1_epi8(16));
}

EI_INLINE __m512i bytes2(const int8_t *a, const int8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

/* offsets of the unsigned weight bytes: u = w + offset */
#define OFFSET_Q4_0 8
#define OFFSET_Q5_0 16
#define OFFSET_Q8_0 128

EI_INLINE __m512i unpack2_q4_0(const block_q4_0 *x) { return nibbles2(x[0].qs, x[1].qs); }
EI_INLINE __m512i unpack2_q4_1(const block_q4_1 *x) { return nibbles2(x[0].qs, x[1].qs); }
EI_INLINE __m512i unpack2_q5_0(const block_q5_0 *x) { return add_bit4(nibbles2(x[0].qs, x[1].qs), qh64(x[0].qh, x[1].qh)); }
EI_INLINE __m512i unpack2_q5_1(const block_q5_1 *x) { return add_bit4(nibbles2(x[0].qs, x[1].qs), qh64(x[0].qh, x[1].qh)); }
EI_INLINE __m512i unpack2_q8_0(const block_q8_0 *x) {
    return _mm512_xor_si512(bytes2(x[0].qs, x[1].qs), _mm512_set1_epi8((char)0x80));
}

/* ---- K blocks (256 values) --------------------------------------------------------------- *
 * u[c]: values 64c..64c+63 as unsigned bytes; sw[c]: the integer scale of each 16-bit lane of
 * vpmaddubsw(u[c], activations), as s16; coef: 16 s16 multipliers of the activation block's
 * bsums. A block's dot is isum = sum_c (maddubs(u[c], y) . sw[c]) - coef . bsums when
 * min_scaled == 0 (offsets folded back), else isum = the first term and imin = coef . bsums
 * goes with dmin. */
typedef struct {
    __m512i u[4], sw[4];
    __m256i coef;
    float d, dmin;
} kblock;

/* 8 6-bit scales (bytes 0..7) and 8 6-bit minimums (bytes 8..15) of a Q4_K / Q5_K block */
EI_INLINE void k4_scales(const uint8_t *s, uint8_t *sc, uint8_t *mn) {
    uint32_t a, b, c;
    memcpy(&a, s, 4);
    memcpy(&b, s + 4, 4);
    memcpy(&c, s + 8, 4);
    const uint32_t lo6 = 0x3f3f3f3fu, lo4 = 0x0f0f0f0fu, lo2 = 0x03030303u;
    const uint32_t sc0 = a & lo6, mn0 = b & lo6;
    const uint32_t sc1 = (c & lo4) | ((a >> 6) & lo2) << 4;
    const uint32_t mn1 = ((c >> 4) & lo4) | ((b >> 6) & lo2) << 4;
    memcpy(sc, &sc0, 4); memcpy(sc + 4, &sc1, 4);
    memcpy(mn, &mn0, 4); memcpy(mn + 4, &mn1, 4);
}

/* scale words for scales of 32 values (Q4_K, Q5_K): zmm c covers sub-blocks 2c, 2c+1 */
EI_INLINE void sw_per32(kblock *k, const uint8_t *sc8) {
    const __m512i s = _mm512_cvtepu8_epi16(_mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)sc8)));
    EI_UNROLL for (int c = 0; c < 4; c++) {
        const __m512i idx = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * c)), _mm256_set1_epi16((short)(2 * c + 1)), 1);
        k->sw[c] = _mm512_permutexvar_epi16(idx, s);
    }
}

/* scale words for scales of 16 values (Q2_K, Q3_K, Q6_K), given as 16 s16 words */
EI_INLINE void sw_per16(kblock *k, __m256i s16) {
    const __m512i s = _mm512_castsi256_si512(s16);
    /* word w of zmm c covers values 64c + 2w and 64c + 2w + 1: scale 4c + w / 8 */
    const __m512i step = _mm512_setr_epi64(0, 0, 0x0001000100010001ll, 0x0001000100010001ll, 0x0002000200020002ll,
                                           0x0002000200020002ll, 0x0003000300030003ll, 0x0003000300030003ll);
    EI_UNROLL for (int c = 0; c < 4; c++)
        k->sw[c] = _mm512_permutexvar_epi16(_mm512_add_epi16(_mm512_set1_epi16((short)(4 * c)), step), s);
}

EI_INLINE void unpack_q4_K(kblock *k, const block_q4_K *b) {
    uint8_t sc[8], mn[8];
    k4_scales(b->scales, sc, mn);
    EI_UNROLL for (int c = 0; c < 4; c++) {
        const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qs + 32 * c)));
        k->u[c] = _mm512_and_si512(_mm512_srlv_epi64(q, _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4)), _mm512_set1_epi8(0x0f));
    }
    sw_per32(k, sc);
    /* each minimum covers two bsums of 16 */
    const __m128i m = _mm_loadl_epi64((const __m128i *)mn);
    k->coef = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
    k->d = f16_to_f32(b->d);
    k->dmin = f16_to_f32(b->dmin);
}

EI_INLINE void unpack_q5_K(kblock *k, const block_q5_K *b) {
    uint8_t sc[8], mn[8];
    k4_scales(b->scales, sc, mn);
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b->qh));
    EI_UNROLL for (int c = 0; c < 4; c++) {
        const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qs + 32 * c)));
        const __m512i lo = _mm512_and_si512(_mm512_srlv_epi64(q, _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4)), _mm512_set1_epi8(0x0f));
        const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * c))), _mm256_set1_epi8((char)(1 << (2 * c + 1))), 1);
        k->u[c] = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, bit), lo, _mm512_set1_epi8(16));
    }
    sw_per32(k, sc);
    const __m128i m = _mm_loadl_epi64((const __m128i *)mn);
    k->coef = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
    k->d = f16_to_f32(b->d);
    k->dmin = f16_to_f32(b->dmin);
}

/* values 0..63, offset 32, folded back through 32 * scale on each bsum */
EI_INLINE void unpack_q6_K(kblock *k, const block_q6_K *b) {
    EI_UNROLL for (int h = 0; h < 2; h++) {
        const __m512i ql = _mm512_loadu_si512((const void *)(b->ql + 64 * h));
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qh + 32 * h)));
        const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(0x30);
        const __m512i h0 = _mm512_and_si512(_mm512_sllv_epi64(qh, _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2)), m2);
        const __m512i h1 = _mm512_and_si512(_mm512_srlv_epi64(qh, _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2)), m2);
        k->u[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), h0);
        k->u[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), h1);
    }
    const __m256i s = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
    sw_per16(k, s);
    k->coef = _mm256_slli_epi16(s, 5);
    k->d = f16_to_f32(b->d);
    k->dmin = 0.0f;
}

/* values -4..3 as 0..7 (offset 4) */
EI_INLINE void unpack_q3_K(kblock *k, const block_q3_K *b) {
    const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b->hmask));
    EI_UNROLL for (int h = 0; h < 2; h++) {
        const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qs + 32 * h)));
        EI_UNROLL for (int p = 0; p < 2; p++) {
            const int s = 2 * p; /* zmm covers shifts s and s + 1 */
            const __m512i lo = _mm512_and_si512(_mm512_srlv_epi64(q, _mm512_setr_epi64(2 * s, 2 * s, 2 * s, 2 * s, 2 * s + 2, 2 * s + 2, 2 * s + 2, 2 * s + 2)),
                                                _mm512_set1_epi8(3));
            const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (4 * h + s))), _mm256_set1_epi8((char)(1 << (4 * h + s + 1))), 1);
            k->u[2 * h + p] = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(hm, bit), lo, _mm512_set1_epi8(4));
        }
    }
    int16_t sc[16];
    EI_UNROLL for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? b->scales[j] & 0xf : b->scales[j - 8] >> 4;
        const int hi = (b->scales[8 + (j % 4)] >> (2 * (j / 4))) & 3;
        sc[j] = (int16_t)((lo | (hi << 4)) - 32);
    }
    const __m256i s = _mm256_loadu_si256((const __m256i *)sc);
    sw_per16(k, s);
    k->coef = _mm256_slli_epi16(s, 2);
    k->d = f16_to_f32(b->d);
    k->dmin = 0.0f;
}

EI_INLINE void unpack_q2_K(kblock *k, const block_q2_K *b) {
    EI_UNROLL for (int h = 0; h < 2; h++) {
        const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qs + 32 * h)));
        EI_UNROLL for (int p = 0; p < 2; p++) {
            const int s = 2 * p;
            k->u[2 * h + p] = _mm512_and_si512(_mm512_srlv_epi64(q, _mm512_setr_epi64(2 * s, 2 * s, 2 * s, 2 * s, 2 * s + 2, 2 * s + 2, 2 * s + 2, 2 * s + 2)),
                                               _mm512_set1_epi8(3));
        }
    }
    const __m256i s = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
    sw_per16(k, _mm256_and_si256(s, _mm256_set1_epi16(0xf)));
    k->coef = _mm256_srli_epi16(s, 4);
    k->d = f16_to_f32(b->d);
    k->dmin = f16_to_f32(b->dmin);
}

#endif
