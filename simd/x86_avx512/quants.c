/* avx512: activation quantizers, row decoders and dot products of one weight row.
 *
 * Dot products compute each block's exact integers (isum, imin) with vector instructions and
 * then add the block terms in double in the reference's order, so every result equals
 * simd/ref/quants.c bit for bit. Decoding a token's activations and reading one weight row
 * are memory-bound; the matrix tiles (gemm.c) carry the arithmetic of prompt processing. */
#include <math.h>
#include <string.h>

#include "blocks.h"

EI_INLINE ei_f16 f32_to_f16(float f) {
    return (ei_f16)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 0);
}

EI_INLINE __m512 abs_ps(__m512 x) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
}

/* max |x| of 32 floats, NaN ignored as fmaxf does (vmaxps returns its second operand on NaN) */
EI_INLINE float amax32(__m512 a, __m512 b) {
    const __m512 m = _mm512_max_ps(abs_ps(a), _mm512_max_ps(abs_ps(b), _mm512_setzero_ps()));
    return _mm512_reduce_max_ps(m);
}

/* rintf(x * id) for 16 values, as bytes (the products are within +-127.5) */
EI_INLINE __m512i round_mul(__m512 x, float id) { return _mm512_cvtps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(id))); }

/* ---- activation quantizers --------------------------------------------------------------- */

static void from_float_q8_0(const float *x, void *vy, int64_t n) {
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
        const float amax = amax32(a, b);
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = f32_to_f16(amax / 127.0f);
        _mm_storeu_si128((__m128i *)y[i].qs, _mm512_cvtsepi32_epi8(round_mul(a, id)));
        _mm_storeu_si128((__m128i *)(y[i].qs + 16), _mm512_cvtsepi32_epi8(round_mul(b, id)));
    }
}

static void from_float_q8_1(const float *x, void *vy, int64_t n) {
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / QK8_1; i++, x += QK8_1) {
        const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
        const float amax = amax32(a, b);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const __m512i qa = round_mul(a, id), qb = round_mul(b, id);
        _mm_storeu_si128((__m128i *)y[i].qs, _mm512_cvtsepi32_epi8(qa));
        _mm_storeu_si128((__m128i *)(y[i].qs + 16), _mm512_cvtsepi32_epi8(qb));
        const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
        y[i].d = f32_to_f16(d);
        y[i].s = f32_to_f16(d * (float)sum);
    }
}

static void from_float_q8_K(const float *x, void *vy, int64_t n) {
    block_q8_K *y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        __m512 m = _mm512_setzero_ps();
        EI_UNROLL for (int k = 0; k < 16; k++) m = _mm512_max_ps(abs_ps(_mm512_loadu_ps(x + 16 * k)), m);
        const float amax = _mm512_reduce_max_ps(m);
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        /* the first value of largest magnitude, with its sign */
        float max = 0.0f;
        EI_UNROLL for (int k = 0; k < 16; k++) {
            const __mmask16 at = _mm512_cmp_ps_mask(abs_ps(_mm512_loadu_ps(x + 16 * k)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
            if (at) {
                int j = 0;
                while (!((at >> j) & 1)) j++;
                max = x[16 * k + j];
                break;
            }
        }
        const float iscale = -127.0f / max;
        EI_UNROLL for (int k = 0; k < 16; k++) {
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_set1_ps(iscale), _mm512_loadu_ps(x + 16 * k)));
            q = _mm512_min_epi32(q, _mm512_set1_epi32(127));
            _mm_storeu_si128((__m128i *)(y[i].qs + 16 * k), _mm512_cvtsepi32_epi8(q));
            y[i].bsums[k] = (int16_t)_mm512_reduce_add_epi32(q);
        }
        y[i].d = 1.0f / iscale;
    }
}

static void from_float_f16(const float *x, void *vy, int64_t n) {
    ei_f16 *y = vy;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) y[i] = ei_fp32_to_fp16(x[i]);
}

static void from_float_bf16(const float *x, void *vy, int64_t n) {
    ei_bf16 *y = vy;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i u = _mm512_loadu_si512((const void *)(x + i));
        /* round to nearest even; a NaN stays a quiet NaN */
        const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
        r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(64)));
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtepi32_epi16(r));
    }
    for (; i < n; i++) y[i] = ei_fp32_to_bf16(x[i]);
}

/* ---- row decoders ------------------------------------------------------------------------ */

/* 64 signed values (two blocks) as floats: q * d (+ m), the first 32 with block 0's scale */
EI_INLINE void store_scaled(float *y, __m512i q, const float d[2], const float m[2], int with_min, int count) {
    const __m128i quarter[4] = {_mm512_castsi512_si128(q), _mm512_extracti32x4_epi32(q, 1),
                                _mm512_extracti32x4_epi32(q, 2), _mm512_extracti32x4_epi32(q, 3)};
    EI_UNROLL for (int h = 0; h < 2 * count; h++) {
        __m512 v = _mm512_mul_ps(_mm512_set1_ps(d[h / 2]), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(quarter[h])));
        if (with_min) v = _mm512_add_ps(v, _mm512_set1_ps(m[h / 2]));
        _mm512_storeu_ps(y + 16 * h, v);
    }
}

/* two blocks at a time; an odd last block goes through a copy padded with a zero block */
#define DECODE_LEGACY(T, BT, UNPACK, OFFSET, MIN)                                                     \
    static void to_float_##T(const void *vx, float *y, int64_t n) {                                   \
        const BT *x = vx;                                                                            \
        const int64_t nb = n / 32;                                                                   \
        for (int64_t i = 0; i < nb; i += 2, y += 64) {                                               \
            BT pad[2];                                                                               \
            const BT *b = x + i;                                                                     \
            const int count = nb - i < 2 ? 1 : 2;                                                    \
            if (count == 1) { memset(pad, 0, sizeof(pad)); pad[0] = x[i]; b = pad; }                 \
            const __m512i q = _mm512_sub_epi8(UNPACK(b), _mm512_set1_epi8((char)(OFFSET)));          \
            const float d[2] = {f16_to_f32(b[0].d), f16_to_f32(b[1].d)};                             \
            const float m[2] = {MIN(b[0]), MIN(b[1])};                                               \
            store_scaled(y, q, d, m, OFFSET == 0, count);                                            \
        }                                                                                            \
    }
#define NO_MIN(b) 0.0f
#define HALF_MIN(b) f16_to_f32((b).m)
DECODE_LEGACY(q4_0, block_q4_0, unpack2_q4_0, OFFSET_Q4_0, NO_MIN)
DECODE_LEGACY(q4_1, block_q4_1, unpack2_q4_1, 0, HALF_MIN)
DECODE_LEGACY(q5_0, block_q5_0, unpack2_q5_0, OFFSET_Q5_0, NO_MIN)
DECODE_LEGACY(q5_1, block_q5_1, unpack2_q5_1, 0, HALF_MIN)
DECODE_LEGACY(q8_0, block_q8_0, unpack2_q8_0, OFFSET_Q8_0, NO_MIN)

static void to_float_f16(const void *vx, float *y, int64_t n) {
    const ei_f16 *x = vx;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))));
    for (; i < n; i++) y[i] = ei_fp16_to_fp32(x[i]);
}

static void to_float_bf16(const void *vx, float *y, int64_t n) {
    const ei_bf16 *x = vx;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_si512((void *)(y + i), _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + i))), 16));
    for (; i < n; i++) y[i] = ei_bf16_to_fp32(x[i]);
}

/* ---- dot products of legacy blocks ------------------------------------------------------- */

/* exact integer dot of two blocks of unsigned weights (offset o) with their activations, in
 * 8 lanes per block */
EI_INLINE __m512i isum2(__m512i u, __m512i a, int offset, int vnni) {
    __m512i p = dot_u8s8(_mm512_setzero_si512(), u, a, vnni);
    if (offset) p = _mm512_sub_epi32(p, dot_u8s8(_mm512_setzero_si512(), _mm512_set1_epi8((char)offset), a, vnni));
    return p;
}

/* the eight block sums of p[k] (blocks 2k, 2k + 1 in its halves), in block order */
EI_INLINE __m256i block_sums8(const __m512i p[4]) {
    const __m512i a = _mm512_add_epi32(_mm512_shuffle_i64x2(p[0], p[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i64x2(p[0], p[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i b = _mm512_add_epi32(_mm512_shuffle_i64x2(p[2], p[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i64x2(p[2], p[3], _MM_SHUFFLE(3, 1, 3, 1)));
    /* 128-bit lane k of a: block k, of b: block k + 4, four partial sums each */
    const __m512i c = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    const __m512i d = _mm512_add_epi32(c, _mm512_unpackhi_epi64(c, c));
    return _mm512_castsi512_si256(_mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), d));
}

/* the fp16 fields at base + j * stride, j < 8, as doubles */
EI_INLINE __m512d f16_fields8(const void *base, int stride) {
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(stride));
    const __m256i g = _mm256_i32gather_epi32((const int *)base, idx, 1);
    return _mm512_cvtps_pd(_mm256_cvtph_ps(_mm256_cvtepi32_epi16(g)));
}

/* sum over blocks of d_w * d_x * isum (+ m * s for the _1 types), in block order, as the
 * reference adds them; eight blocks at a time, the last group padded with zero blocks */
#define DOT_LEGACY(NAME, BT, AT, UNPACK, OFFSET, HAS_MIN, MINF, SUMF)                                  \
    EI_INLINE void NAME##_impl(int n, float *s, const void *vx, const void *vy, int vnni) {           \
        const BT *x = vx; const AT *y = vy;                                                          \
        const int nb = n / 32;                                                                       \
        double sum = 0.0;                                                                            \
        for (int i = 0; i < nb; i += 8) {                                                            \
            BT xp[8]; AT yp[8];                                                                      \
            const BT *xb = x + i; const AT *yb = y + i;                                              \
            const int cnt = nb - i < 8 ? nb - i : 8;                                                 \
            if (cnt < 8) { /* zero blocks add exact zeros, and are not added anyway */              \
                memset(xp, 0, sizeof(xp)); memset(yp, 0, sizeof(yp));                               \
                memcpy(xp, xb, cnt * sizeof(BT)); memcpy(yp, yb, cnt * sizeof(AT));                  \
                xb = xp; yb = yp;                                                                    \
            }                                                                                        \
            __m512i p[4];                                                                            \
            EI_UNROLL for (int k = 0; k < 4; k++)                                                    \
                p[k] = isum2(UNPACK(xb + 2 * k), bytes2(yb[2 * k].qs, yb[2 * k + 1].qs), OFFSET, vnni); \
            const __m512d isum = _mm512_cvtepi32_pd(block_sums8(p));                                 \
            const __m512d scale = _mm512_mul_pd(f16_fields8(&xb->d, sizeof(BT)), f16_fields8(&yb->d, sizeof(AT))); \
            __m512d term; /* exact, or A + B rounded once as the reference's term */                 \
            if (HAS_MIN)                                                                             \
                term = _mm512_fmadd_pd(isum, scale, _mm512_mul_pd(f16_fields8(&xb->MINF, sizeof(BT)), \
                                                                  f16_fields8(&yb->SUMF, sizeof(AT)))); \
            else                                                                                     \
                term = _mm512_mul_pd(isum, scale);                                                   \
            double t[8];                                                                             \
            _mm512_storeu_pd(t, term);                                                               \
            for (int j = 0; j < cnt; j++) sum += t[j];                                               \
        }                                                                                            \
        *s = (float)sum;                                                                             \
    }                                                                                                \
    static void NAME##_vnni(int n, float *s, const void *x, const void *y) { NAME##_impl(n, s, x, y, 1); } \
    static void NAME(int n, float *s, const void *x, const void *y) { NAME##_impl(n, s, x, y, 0); }

DOT_LEGACY(dot_q4_0, block_q4_0, block_q8_0, unpack2_q4_0, OFFSET_Q4_0, 0, d, d)
DOT_LEGACY(dot_q5_0, block_q5_0, block_q8_0, unpack2_q5_0, OFFSET_Q5_0, 0, d, d)
DOT_LEGACY(dot_q8_0, block_q8_0, block_q8_0, unpack2_q8_0, OFFSET_Q8_0, 0, d, d)
DOT_LEGACY(dot_q4_1, block_q4_1, block_q8_1, unpack2_q4_1, 0, 1, m, s)
DOT_LEGACY(dot_q5_1, block_q5_1, block_q8_1, unpack2_q5_1, 0, 1, m, s)

/* ---- dot products of K blocks ------------------------------------------------------------ */

EI_INLINE int hsum_epi32_256(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* isum (scaled sub-block dots, offsets folded back unless min_scaled) and imin of one block */
EI_INLINE void kdot(const kblock *k, const block_q8_K *y, int min_scaled, int vnni, int *isum, int *imin) {
    __m512i acc = _mm512_setzero_si512();
    EI_UNROLL for (int c = 0; c < 4; c++) {
        const __m512i a = _mm512_loadu_si512((const void *)(y->qs + 64 * c));
        acc = dot_s16(acc, _mm512_maddubs_epi16(k->u[c], a), k->sw[c], vnni);
    }
    const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), k->coef);
    const int c = hsum_epi32_256(corr);
    const int raw = _mm512_reduce_add_epi32(acc);
    if (min_scaled) { *isum = raw; *imin = c; }
    else { *isum = raw - c; *imin = 0; }
}

#define DOT_K(NAME, BT, UNPACK, MIN_SCALED)                                                           \
    EI_INLINE void NAME##_impl(int n, float *s, const void *vx, const void *vy, int vnni) {           \
        const BT *x = vx; const block_q8_K *y = vy;                                                  \
        double sum = 0.0;                                                                            \
        for (int i = 0; i < n / QK_K; i++) {                                                         \
            kblock k;                                                                                \
            UNPACK(&k, &x[i]);                                                                       \
            int isum, imin;                                                                          \
            kdot(&k, &y[i], MIN_SCALED, vnni, &isum, &imin);                                         \
            if (MIN_SCALED)                                                                          \
                sum += (double)y[i].d * k.d * isum - (double)y[i].d * k.dmin * imin;                 \
            else                                                                                     \
                sum += (double)y[i].d * k.d * isum;                                                  \
        }                                                                                            \
        *s = (float)sum;                                                                             \
    }                                                                                                \
    static void NAME##_vnni(int n, float *s, const void *x, const void *y) { NAME##_impl(n, s, x, y, 1); } \
    static void NAME(int n, float *s, const void *x, const void *y) { NAME##_impl(n, s, x, y, 0); }

DOT_K(dot_q2_K, block_q2_K, unpack_q2_K, 1)
DOT_K(dot_q3_K, block_q3_K, unpack_q3_K, 0)
DOT_K(dot_q4_K, block_q4_K, unpack_q4_K, 1)
DOT_K(dot_q5_K, block_q5_K, unpack_q5_K, 1)
DOT_K(dot_q6_K, block_q6_K, unpack_q6_K, 0)

/* ---- float rows -------------------------------------------------------------------------- *
 * Every product is exact in double, but their sum need not be: the products are formed 16 at
 * a time and added in index order, as the reference adds them. */

EI_INLINE void add_products16(double *sum, __m512 x, __m512 y) {
    double t[16];
    _mm512_storeu_pd(t, _mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), _mm512_cvtps_pd(_mm512_castps512_ps256(y))));
    _mm512_storeu_pd(t + 8, _mm512_mul_pd(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))),
                                          _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1)))));
    double s = *sum;
    EI_UNROLL for (int j = 0; j < 16; j++) s += t[j];
    *sum = s;
}

static void dot_f32(int n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    double sum = 0.0;
    int i = 0;
    for (; i + 16 <= n; i += 16) add_products16(&sum, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i));
    for (; i < n; i++) sum += (double)x[i] * y[i];
    *s = (float)sum;
}

static void dot_f16(int n, float *s, const void *vx, const void *vy) {
    const ei_f16 *x = vx, *y = vy;
    double sum = 0.0;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        add_products16(&sum, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))),
                       _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + i))));
    for (; i < n; i++) sum += (double)ei_fp16_to_fp32(x[i]) * ei_fp16_to_fp32(y[i]);
    *s = (float)sum;
}

EI_INLINE __m512 bf16x16(const ei_bf16 *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static void dot_bf16(int n, float *s, const void *vx, const void *vy) {
    const ei_bf16 *x = vx, *y = vy;
    double sum = 0.0;
    int i = 0;
    for (; i + 16 <= n; i += 16) add_products16(&sum, bf16x16(x + i), bf16x16(y + i));
    for (; i < n; i++) sum += (double)ei_bf16_to_fp32(x[i]) * ei_bf16_to_fp32(y[i]);
    *s = (float)sum;
}

/* ---- the keys of a q8_0 / q4_0 cache against one q8_0 query (attn_dots_q) -------------------- *
 * Eight keys at a time, two in each vector (the same block of each, against the query block
 * repeated in both halves): block_sums8 gives the eight keys' exact integer sums of one block,
 * and each key's lane adds its terms d_k * d_q * isum in double in block order, as vec_dot. */
EI_INLINE void attn_dots_q_impl(int k_type, const uint8_t *qq, const uint8_t *k, size_t row_bytes, int hd, int m,
                                float *out, int vnni) {
    const int q4 = k_type == EI_TYPE_Q4_0, nb = hd / 32;
    const size_t kb = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    const block_q8_0 *y = (const block_q8_0 *)qq;
    __m512i yv[EI_MAX_HEAD_DIM / 32], yoff[EI_MAX_HEAD_DIM / 32];
    for (int b = 0; b < nb; b++) { /* the query block in both halves, and what the offset adds */
        yv[b] = bytes2(y[b].qs, y[b].qs);
        yoff[b] = dot_u8s8(_mm512_setzero_si512(), _mm512_set1_epi8((char)(q4 ? OFFSET_Q4_0 : OFFSET_Q8_0)), yv[b], vnni);
    }
    for (int t = 0; t < m; t += 8) {
        const int cnt = m - t < 8 ? m - t : 8;
        const uint8_t *row[8]; /* a tail repeats the first key */
        for (int j = 0; j < 8; j++) row[j] = k + (size_t)(t + (j < cnt ? j : 0)) * row_bytes;
        __m512d acc = _mm512_setzero_pd();
        for (int b = 0; b < nb; b++) {
            __m512i p[4];
            EI_UNROLL for (int i = 0; i < 4; i++) {
                const uint8_t *b0 = row[2 * i] + (size_t)b * kb, *b1 = row[2 * i + 1] + (size_t)b * kb;
                const __m512i u = q4 ? nibbles2(((const block_q4_0 *)b0)->qs, ((const block_q4_0 *)b1)->qs)
                                     : _mm512_xor_si512(bytes2(((const block_q8_0 *)b0)->qs, ((const block_q8_0 *)b1)->qs),
                                                        _mm512_set1_epi8((char)0x80));
                p[i] = _mm512_sub_epi32(dot_u8s8(_mm512_setzero_si512(), u, yv[b], vnni), yoff[b]);
            }
            uint16_t dk[8];
            for (int j = 0; j < 8; j++) memcpy(&dk[j], row[j] + (size_t)b * kb, 2);
            const __m512d scale = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dk))),
                                                _mm512_set1_pd((double)f16_to_f32(y[b].d)));
            acc = _mm512_add_pd(acc, _mm512_mul_pd(_mm512_cvtepi32_pd(block_sums8(p)), scale));
        }
        float o[8];
        _mm256_storeu_ps(o, _mm512_cvtpd_ps(acc));
        for (int j = 0; j < cnt; j++) out[t + j] = o[j];
    }
}
static void attn_dots_q_vnni(int k_type, const uint8_t *qq, const uint8_t *k, size_t row_bytes, int hd, int m,
                             float *out) {
    attn_dots_q_impl(k_type, qq, k, row_bytes, hd, m, out, 1);
}
static void attn_dots_q(int k_type, const uint8_t *qq, const uint8_t *k, size_t row_bytes, int hd, int m,
                        float *out) {
    attn_dots_q_impl(k_type, qq, k, row_bytes, hd, m, out, 0);
}

ei_vec_dot_fn ei_avx512_vec_dot(int type, int vnni) {
    switch (type) {
    case EI_TYPE_Q4_0: return vnni ? dot_q4_0_vnni : dot_q4_0;
    case EI_TYPE_Q4_1: return vnni ? dot_q4_1_vnni : dot_q4_1;
    case EI_TYPE_Q5_0: return vnni ? dot_q5_0_vnni : dot_q5_0;
    case EI_TYPE_Q5_1: return vnni ? dot_q5_1_vnni : dot_q5_1;
    case EI_TYPE_Q8_0: return vnni ? dot_q8_0_vnni : dot_q8_0;
    case EI_TYPE_Q2_K: return vnni ? dot_q2_K_vnni : dot_q2_K;
    case EI_TYPE_Q3_K: return vnni ? dot_q3_K_vnni : dot_q3_K;
    case EI_TYPE_Q4_K: return vnni ? dot_q4_K_vnni : dot_q4_K;
    case EI_TYPE_Q5_K: return vnni ? dot_q5_K_vnni : dot_q5_K;
    case EI_TYPE_Q6_K: return vnni ? dot_q6_K_vnni : dot_q6_K;
    case EI_TYPE_F16: return dot_f16;
    case EI_TYPE_BF16: return dot_bf16;
    case EI_TYPE_F32: return dot_f32;
    default: return NULL;
    }
}

void ei_avx512_quant_kernels(ei_kernels *k, int vnni) {
    k->from_float[EI_TYPE_Q8_0] = from_float_q8_0;
    k->from_float[EI_TYPE_Q8_1] = from_float_q8_1;
    k->from_float[EI_TYPE_Q8_K] = from_float_q8_K;
    k->from_float[EI_TYPE_F16] = from_float_f16;
    k->from_float[EI_TYPE_BF16] = from_float_bf16;

    k->to_float[EI_TYPE_Q4_0] = to_float_q4_0;
    k->to_float[EI_TYPE_Q4_1] = to_float_q4_1;
    k->to_float[EI_TYPE_Q5_0] = to_float_q5_0;
    k->to_float[EI_TYPE_Q5_1] = to_float_q5_1;
    k->to_float[EI_TYPE_Q8_0] = to_float_q8_0;
    k->to_float[EI_TYPE_F16] = to_float_f16;
    k->to_float[EI_TYPE_BF16] = to_float_bf16;

    static const int types[] = {EI_TYPE_Q4_0, EI_TYPE_Q4_1, EI_TYPE_Q5_0, EI_TYPE_Q5_1, EI_TYPE_Q8_0,
                                EI_TYPE_Q2_K, EI_TYPE_Q3_K, EI_TYPE_Q4_K, EI_TYPE_Q5_K, EI_TYPE_Q6_K,
                                EI_TYPE_F16, EI_TYPE_BF16, EI_TYPE_F32};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) k->vec_dot[types[i]] = ei_avx512_vec_dot(types[i], vnni);
    k->attn_dots_q = vnni ? attn_dots_q_vnni : attn_dots_q;
}
