/* Weight blocks ready for integer products, shared by the dot products (quants.c) and the
 * tiles (gemm.c): first the legacy blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) against their q8_0 /
 * q8_1 partners (sizes, unpacking, exact integer block sums), then the K super-blocks. */
#ifndef EI_AVX2_BLOCKS_H
#define EI_AVX2_BLOCKS_H

#include "simd.h"

/* byte sizes and field offsets of a legacy weight type and its partner; offset is what the
 * unpacked (unsigned) weights carry above their value, or -1 for Q8_0's signed weights */
typedef struct { int xb, yb, yqs, offset, with_min, wide; } legacy_info;

EI_AVX2_INLINE legacy_info legacy_of(int type) {
    switch (type) {
    case EI_TYPE_Q4_0: return (legacy_info){sizeof(block_q4_0), sizeof(block_q8_0), 2, 8, 0, 0};
    case EI_TYPE_Q4_1: return (legacy_info){sizeof(block_q4_1), sizeof(block_q8_1), 4, 0, 1, 0};
    case EI_TYPE_Q5_0: return (legacy_info){sizeof(block_q5_0), sizeof(block_q8_0), 2, 16, 0, 0};
    case EI_TYPE_Q5_1: return (legacy_info){sizeof(block_q5_1), sizeof(block_q8_1), 4, 0, 1, 0};
    default: return (legacy_info){sizeof(block_q8_0), sizeof(block_q8_0), 2, -1, 0, 1};
    }
}

/* one block's 32 weights as the products take them: unsigned (value + offset), or Q8_0's int8 */
EI_AVX2_INLINE __m256i unpack_legacy(int type, const uint8_t *b) {
    switch (type) {
    case EI_TYPE_Q4_0: return avx2_nibbles32(((const block_q4_0 *)b)->qs);
    case EI_TYPE_Q4_1: return avx2_q4_1((const block_q4_1 *)b);
    case EI_TYPE_Q5_0: {
        const block_q5_0 *q = (const block_q5_0 *)b;
        return _mm256_or_si256(avx2_nibbles32(q->qs), _mm256_and_si256(avx2_bits32(q->qh), _mm256_set1_epi8(0x10)));
    }
    case EI_TYPE_Q5_1: return avx2_q5_1((const block_q5_1 *)b);
    default: return avx2_q8_0((const block_q8_0 *)b);
    }
}

/* what one activation block (32 int8 in [-127, 127]) brings to every weight row: the offset
 * times its pair sums, as int16 (unused for Q8_0) */
EI_AVX2_INLINE __m256i offset_pairs(const legacy_info *L, __m256i y) {
    if (L->offset <= 0) return _mm256_setzero_si256();
    return _mm256_maddubs_epi16(_mm256_set1_epi8((char)L->offset), y);
}

/* the value pair products w * y of one block as int16: (w + offset) * y - offset * y for the
 * offset types (exactly the signed products), |w| * (y with w's sign) for Q8_0 (aw = |w|) */
EI_AVX2_INLINE __m256i pair_products(const legacy_info *L, __m256i w, __m256i aw, __m256i y, __m256i yoff) {
    if (L->offset < 0) return _mm256_maddubs_epi16(aw, _mm256_sign_epi8(y, w));
    const __m256i p = _mm256_maddubs_epi16(w, y);
    return L->offset ? _mm256_sub_epi16(p, yoff) : p;
}

/* exact block sums of four blocks' pair products; Q8_0's pairs reach 2^15, the others' 2^13 */
EI_AVX2_INLINE __m128i block_sums4(__m256i p0, __m256i p1, __m256i p2, __m256i p3, int wide) {
    if (!wide) return avx2_sum4_i16(p0, p1, p2, p3);
    const __m256i one = _mm256_set1_epi16(1);
    return avx2_sum4_i32(_mm256_madd_epi16(p0, one), _mm256_madd_epi16(p1, one), _mm256_madd_epi16(p2, one),
                         _mm256_madd_epi16(p3, one));
}

/* fp16 fields at byte offset 'off' of four consecutive blocks of 'size' bytes */
EI_AVX2_INLINE __m256d f16x4_pd(const uint8_t *p, int size, int off) {
    return _mm256_cvtps_pd(avx2_f16x4(p + off, p + size + off, p + 2 * size + off, p + 3 * size + off));
}

/* One K super-block of weights (Q2_K..Q6_K) ready for integer dot products with a q8_K
 * block: its 256 values unsigned, the int16 scale of every value pair, and the int16
 * multipliers of the activation's 16 block sums (the minimums of Q2_K/Q4_K/Q5_K, or
 * offset x scale for Q3_K/Q6_K, whose values are stored shifted up). */



typedef struct {
    __m256i q[8];  /* values 32k .. 32k+31, unsigned */
    __m256i sc[8]; /* int16 scale of each value pair of q[k] */
    __m256i bmul;  /* int16 multiplier of each of the 16 activation block sums */
} avx2_kblock;

EI_AVX2_INLINE size_t avx2_kblock_bytes(int type) {
    switch (type) {
    case EI_TYPE_Q2_K: return sizeof(block_q2_K);
    case EI_TYPE_Q3_K: return sizeof(block_q3_K);
    case EI_TYPE_Q4_K: return sizeof(block_q4_K);
    case EI_TYPE_Q5_K: return sizeof(block_q5_K);
    default: return sizeof(block_q6_K);
    }
}

/* types whose dot product subtracts dmin * sum(min * bsum) rather than folding it in */
EI_AVX2_INLINE int avx2_kblock_has_min(int type) {
    return type == EI_TYPE_Q2_K || type == EI_TYPE_Q4_K || type == EI_TYPE_Q5_K;
}

/* scale vectors for types with one scale per 16 values: q[k] covers scales 2k (low half) and 2k+1 */
EI_AVX2_INLINE void sc16_vectors(__m128i sc8, __m256i sc[8]) {
    const __m256i t = _mm256_cvtepi8_epi16(sc8);
    const __m256i lo = _mm256_permute2x128_si256(t, t, 0x00), hi = _mm256_permute2x128_si256(t, t, 0x11);
    EI_UNROLL
    for (int k = 0; k < 8; k++) {
        const int b = 4 * (k % 4); /* bytes of int16 lane 2(k%4) of a half */
        const __m256i mask = _mm256_setr_m128i(_mm_set1_epi16((short)(b | (b + 1) << 8)),
                                               _mm_set1_epi16((short)((b + 2) | (b + 3) << 8)));
        sc[k] = _mm256_shuffle_epi8(k < 4 ? lo : hi, mask);
    }
}

EI_AVX2_INLINE void avx2_kblock_unpack(int type, const uint8_t *blk, avx2_kblock *w, double *d, double *dmin) {
    switch (type) {
    case EI_TYPE_Q2_K: {
        const block_q2_K *b = (const block_q2_K *)blk;
        avx2_q2_K_values(b, w->q);
        const __m128i s = _mm_loadu_si128((const __m128i *)b->scales);
        sc16_vectors(_mm_and_si128(s, _mm_set1_epi8(0x0f)), w->sc);
        w->bmul = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(0x0f)));
        *d = avx2_f16(b->d);
        *dmin = avx2_f16(b->dmin);
        break;
    }
    case EI_TYPE_Q3_K: {
        const block_q3_K *b = (const block_q3_K *)blk;
        avx2_q3_K_values(b, w->q);
        const __m128i s = avx2_q3_scales(b->scales);
        sc16_vectors(s, w->sc);
        w->bmul = _mm256_slli_epi16(_mm256_cvtepi8_epi16(s), 2);
        *d = avx2_f16(b->d);
        *dmin = 0.0;
        break;
    }
    case EI_TYPE_Q6_K: {
        const block_q6_K *b = (const block_q6_K *)blk;
        avx2_q6_K_values(b, w->q);
        const __m128i s = _mm_loadu_si128((const __m128i *)b->scales);
        sc16_vectors(s, w->sc);
        w->bmul = _mm256_slli_epi16(_mm256_cvtepi8_epi16(s), 5);
        *d = avx2_f16(b->d);
        *dmin = 0.0;
        break;
    }
    default: { /* Q4_K, Q5_K: one scale and one minimum per 32 values */
        const block_q4_K *b4 = (const block_q4_K *)blk;
        if (type == EI_TYPE_Q4_K) avx2_q4_K_values(b4, w->q);
        else avx2_q5_K_values((const block_q5_K *)blk, w->q);
        const __m128i sm = avx2_k4_scales(b4->scales); /* same header layout in both types */
        const __m256i s16 = _mm256_cvtepu8_epi16(sm);
        const __m256i lo = _mm256_permute2x128_si256(s16, s16, 0x00);
        EI_UNROLL
        for (int k = 0; k < 8; k++) {
            const int b = 2 * k;
            w->sc[k] = _mm256_shuffle_epi8(lo, _mm256_set1_epi16((short)(b | (b + 1) << 8)));
        }
        const __m128i mn = _mm_srli_si128(sm, 8);
        w->bmul = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn));
        *d = avx2_f16(b4->d);
        *dmin = avx2_f16(b4->dmin);
        break;
    }
    }
}

/* integer sums over lanes: sum(isum) = sum_j sc_j * dot_j (less the offset terms), and for
 * types with minimums sum(imin) = sum_j min_j * bsum_j */
EI_AVX2_INLINE void avx2_kblock_pair(int type, const avx2_kblock *w, const block_q8_K *y, __m256i *isum, __m256i *imin) {
    __m256i acc = _mm256_setzero_si256();
    EI_UNROLL
    for (int k = 0; k < 8; k++) {
        const __m256i p = _mm256_maddubs_epi16(w->q[k], _mm256_loadu_si256((const __m256i *)(y->qs + 32 * k)));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, w->sc[k]));
    }
    const __m256i b = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), w->bmul);
    if (avx2_kblock_has_min(type)) {
        *isum = acc;
        *imin = b;
    } else {
        *isum = _mm256_sub_epi32(acc, b);
        *imin = _mm256_setzero_si256();
    }
}

#endif
