/* Legacy blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) against their q8_0 / q8_1 partners: sizes,
 * unpacking and exact integer block sums, shared by the dot products and the tiles. */
#ifndef EI_AVX2_LEGACY_H
#define EI_AVX2_LEGACY_H

#include "avx2.h"

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

#endif
