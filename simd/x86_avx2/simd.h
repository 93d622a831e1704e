/* Shared pieces of the AVX2+FMA+F16C variant: block unpacking into vectors of small
 * integers, horizontal integer sums, and the registration functions of each file.
 *
 * Every kernel computes the reference's exact integers (ref/quants.c) and combines them
 * with the block scales by the same double operations; where the reference accumulates in
 * a fixed order, the variant keeps that order in each vector lane (lanes are rows or
 * columns of a tile, never parts of one sum), so results are the reference's bit for bit. */
#ifndef EI_AVX2_H
#define EI_AVX2_H

#include <immintrin.h>
#include <string.h>

#include "../common/ei_kernels.h"

void ei_avx2_convert_kernels(ei_kernels *k);
void ei_avx2_dot_kernels(ei_kernels *k);
void ei_avx2_gemm_kernels(ei_kernels *k);
void ei_avx2_op_kernels(ei_kernels *k);
void ei_avx2_attn_kernels(ei_kernels *k);

#if defined(_MSC_VER) && !defined(__clang__)
#define EI_AVX2_INLINE static __forceinline
#else
#define EI_AVX2_INLINE static inline __attribute__((always_inline))
#endif

/* fully unrolls a loop of constant trip count, so that its arrays of vectors live in registers */
#if defined(__clang__)
#define EI_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define EI_UNROLL _Pragma("GCC unroll 16")
#else
#define EI_UNROLL
#endif

EI_AVX2_INLINE float avx2_f16(ei_f16 h) { return _cvtsh_ss(h); }

/* the fp16 fields at p0..p3 as four floats */
EI_AVX2_INLINE __m128 avx2_f16x4(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3) {
    uint16_t h0, h1, h2, h3;
    memcpy(&h0, p0, 2); memcpy(&h1, p1, 2); memcpy(&h2, p2, 2); memcpy(&h3, p3, 2);
    const uint64_t v = (uint64_t)h0 | (uint64_t)h1 << 16 | (uint64_t)h2 << 32 | (uint64_t)h3 << 48;
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)v));
}

/* 16 bytes of nibbles -> 32 bytes: low nibbles first, then high nibbles (GGML order) */
EI_AVX2_INLINE __m256i avx2_nibbles32(const uint8_t *p) {
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

/* 32 bits (little endian) -> 32 bytes, 0xff where the bit is set */
EI_AVX2_INLINE __m256i avx2_bits32(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    /* byte j of the result looks at byte j/8 of the word and tests bit j%8 */
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)bits),
        _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i select = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
}

/* ---- legacy blocks: 32 values as the dot product sees them --------------------------- */
/* _0 types: signed (offset removed); _1 types: unsigned (the minimum is a separate term) */

EI_AVX2_INLINE __m256i avx2_q4_0(const block_q4_0 *b) {
    return _mm256_sub_epi8(avx2_nibbles32(b->qs), _mm256_set1_epi8(8));
}

EI_AVX2_INLINE __m256i avx2_q4_1(const block_q4_1 *b) { return avx2_nibbles32(b->qs); }

EI_AVX2_INLINE __m256i avx2_q5_0(const block_q5_0 *b) {
    /* value - 16: a clear high bit leaves nibble - 16, which is the nibble with 0xf0 set */
    const __m256i hi = _mm256_andnot_si256(avx2_bits32(b->qh), _mm256_set1_epi8((char)0xf0));
    return _mm256_or_si256(avx2_nibbles32(b->qs), hi);
}

EI_AVX2_INLINE __m256i avx2_q5_1(const block_q5_1 *b) {
    const __m256i hi = _mm256_and_si256(avx2_bits32(b->qh), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(avx2_nibbles32(b->qs), hi);
}

EI_AVX2_INLINE __m256i avx2_q8_0(const block_q8_0 *b) { return _mm256_loadu_si256((const __m256i *)b->qs); }

/* ---- K blocks ------------------------------------------------------------------------ */

/* the 6-bit scales (bytes 0-7) and minimums (bytes 8-15) of the sub-blocks of Q4_K / Q5_K */
EI_AVX2_INLINE __m128i avx2_k4_scales(const uint8_t *s) {
    uint32_t a, b, c;
    memcpy(&a, s, 4); memcpy(&b, s + 4, 4); memcpy(&c, s + 8, 4);
    const uint32_t m6 = 0x3f3f3f3fu, m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    const uint32_t sc_lo = a & m6, mn_lo = b & m6;
    const uint32_t sc_hi = (c & m4) | (((a >> 6) & m2) << 4);
    const uint32_t mn_hi = ((c >> 4) & m4) | (((b >> 6) & m2) << 4);
    return _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)mn_lo, (int)mn_hi);
}

/* the 16 signed 6-bit scales of Q3_K, as int8 */
EI_AVX2_INLINE __m128i avx2_q3_scales(const uint8_t *s) {
    uint32_t a, b, c;
    memcpy(&a, s, 4); memcpy(&b, s + 4, 4); memcpy(&c, s + 8, 4);
    const uint32_t m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    const __m128i u = _mm_setr_epi32((int)((a & m4) | ((c & m2) << 4)), (int)((b & m4) | (((c >> 2) & m2) << 4)),
                                     (int)(((a >> 4) & m4) | (((c >> 4) & m2) << 4)),
                                     (int)(((b >> 4) & m4) | (((c >> 6) & m2) << 4)));
    return _mm_sub_epi8(u, _mm_set1_epi8(32));
}

/* 256 values of a K block, unsigned (Q3_K: value + 4, Q6_K: value + 32), in 8 vectors of 32 */
EI_AVX2_INLINE void avx2_q2_K_values(const block_q2_K *b, __m256i q[8]) {
    const __m256i m3 = _mm256_set1_epi8(3);
    EI_UNROLL
    for (int h = 0; h < 2; h++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * h));
        q[4 * h + 0] = _mm256_and_si256(v, m3);
        q[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 2), m3);
        q[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m3);
        q[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16(v, 6), m3);
    }
}

EI_AVX2_INLINE void avx2_q3_K_values(const block_q3_K *b, __m256i q[8]) {
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const __m256i hm = _mm256_loadu_si256((const __m256i *)b->hmask);
    EI_UNROLL
    for (int h = 0; h < 2; h++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * h));
        EI_UNROLL
        for (int s = 0; s < 4; s++) {
            const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + s)));
            const __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), four);
            const __m256i low = s ? _mm256_and_si256(_mm256_srli_epi16(v, 2 * s), m3) : _mm256_and_si256(v, m3);
            q[4 * h + s] = _mm256_or_si256(low, high);
        }
    }
}

EI_AVX2_INLINE void avx2_q4_K_values(const block_q4_K *b, __m256i q[8]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    EI_UNROLL
    for (int c = 0; c < 4; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * c));
        q[2 * c] = _mm256_and_si256(v, m4);
        q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
}

EI_AVX2_INLINE void avx2_q5_K_values(const block_q5_K *b, __m256i q[8]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m16 = _mm256_set1_epi8(0x10);
    const __m256i hb = _mm256_loadu_si256((const __m256i *)b->qh);
    EI_UNROLL
    for (int c = 0; c < 4; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * c));
        const __m256i b0 = _mm256_set1_epi8((char)(1 << (2 * c))), b1 = _mm256_set1_epi8((char)(2 << (2 * c)));
        const __m256i h0 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, b0), b0), m16);
        const __m256i h1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, b1), b1), m16);
        q[2 * c] = _mm256_or_si256(_mm256_and_si256(v, m4), h0);
        q[2 * c + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), h1);
    }
}

EI_AVX2_INLINE void avx2_q6_K_values(const block_q6_K *b, __m256i q[8]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x30);
    EI_UNROLL
    for (int h = 0; h < 2; h++) {
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
        const __m256i hi = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
        /* bits 2k, 2k+1 of each qh byte become bits 4, 5 of value vector k */
        q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hi, 4), m2));
        q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hi, 2), m2));
        q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hi, m2));
        q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(hi, 2), m2));
    }
}

/* ---- horizontal integer sums ----------------------------------------------------------- */

EI_AVX2_INLINE int avx2_hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* the sums of the 8 int32 lanes of a, b, c, d */
EI_AVX2_INLINE __m128i avx2_sum4_i32(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i abcd = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

/* the sums of the 16 int16 lanes of a, b, c, d, when any 4 adjacent lanes sum below 2^15 */
EI_AVX2_INLINE __m128i avx2_sum4_i16(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i abcd = _mm256_hadd_epi16(_mm256_hadd_epi16(a, b), _mm256_hadd_epi16(c, d));
    const __m256i s = _mm256_madd_epi16(abcd, _mm256_set1_epi16(1));
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

#endif
