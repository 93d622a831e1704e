/* AVX2 activation quantizers, row decoders (below) and dot products of one weight row (at the
 * end). Quantizers and decoders: the reference's float operations, eight
 * lanes at a time (products and differences in the same order, never fused). */
#include <math.h>

#include "blocks.h"

/* ---- activation quantizers --------------------------------------------------------- */

EI_AVX2_INLINE __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

EI_AVX2_INLINE float hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* rintf of x * s, as int32 (round half to even whatever the rounding mode) */
EI_AVX2_INLINE __m256i rint_mul(__m256 x, __m256 s) {
    return _mm256_cvttps_epi32(_mm256_round_ps(_mm256_mul_ps(x, s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* four vectors of 8 int32 in [-128, 127] -> 32 int8 in order */
EI_AVX2_INLINE __m256i pack_i8(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* one block of 32 as the q8_0 / q8_1 quantizers round it; returns the block's amax */
EI_AVX2_INLINE float quantize32(const float *x, int8_t *qs, __m256i *sum) {
    __m256 v[4], amax = _mm256_setzero_ps();
    EI_UNROLL
    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_loadu_ps(x + 8 * j);
        amax = _mm256_max_ps(abs_ps(v[j]), amax); /* a NaN lane keeps amax, as fmaxf does */
    }
    const float m = hmax_ps(amax);
    const __m256 id = _mm256_set1_ps(m != 0.0f ? 127.0f / m : 0.0f);
    __m256i q[4];
    EI_UNROLL
    for (int j = 0; j < 4; j++) q[j] = rint_mul(v[j], id);
    _mm256_storeu_si256((__m256i *)qs, pack_i8(q[0], q[1], q[2], q[3]));
    *sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    return m;
}

static void avx2_from_float_q8_0(const float *x, void *vy, int64_t n) {
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        __m256i sum;
        const float amax = quantize32(x, y[i].qs, &sum);
        y[i].d = ei_fp32_to_fp16(amax / 127.0f);
    }
}

static void avx2_from_float_q8_1(const float *x, void *vy, int64_t n) {
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / QK8_1; i++, x += QK8_1) {
        __m256i sum;
        const float d = quantize32(x, y[i].qs, &sum) / 127.0f;
        y[i].d = ei_fp32_to_fp16(d);
        y[i].s = ei_fp32_to_fp16(d * (float)avx2_hsum_i32(sum));
    }
}

static void avx2_from_float_q8_K(const float *x, void *vy, int64_t n) {
    block_q8_K *y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        __m256 amaxv = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8) amaxv = _mm256_max_ps(abs_ps(_mm256_loadu_ps(x + j)), amaxv);
        const float amax = hmax_ps(amaxv);
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        int first = 0; /* the first value of largest magnitude keeps its sign */
        for (int j = 0; j < QK_K; j += 8) {
            int hit = _mm256_movemask_ps(_mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + j)), _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (hit) {
                for (first = j; !(hit & 1); hit >>= 1) first++;
                break;
            }
        }
        const float iscale = -127.0f / x[first];
        const __m256 is = _mm256_set1_ps(iscale);
        const __m256i top = _mm256_set1_epi32(127);
        for (int j = 0; j < QK_K; j += 32) {
            __m256i q[4];
            EI_UNROLL
            for (int k = 0; k < 4; k++) q[k] = _mm256_min_epi32(rint_mul(_mm256_loadu_ps(x + j + 8 * k), is), top);
            const __m256i packed = pack_i8(q[0], q[1], q[2], q[3]);
            _mm256_storeu_si256((__m256i *)(y[i].qs + j), packed);
            /* the sums of the two groups of 16: pairs, then quads, then halves of the lanes */
            const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), packed), _mm256_set1_epi16(1));
            const __m256i s2 = _mm256_hadd_epi32(s32, s32); /* per half: [a01 a23 a01 a23] */
            const __m256i s4 = _mm256_hadd_epi32(s2, s2);
            y[i].bsums[j / 16] = (int16_t)_mm256_extract_epi32(s4, 0);
            y[i].bsums[j / 16 + 1] = (int16_t)_mm256_extract_epi32(s4, 4);
        }
        y[i].d = 1.0f / iscale;
    }
}

static void avx2_from_float_f16(const float *x, void *vy, int64_t n) {
    ei_f16 *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = ei_fp32_to_fp16(x[i]);
}

static void avx2_from_float_bf16(const float *x, void *vy, int64_t n) {
    ei_bf16 *y = vy;
    int64_t i = 0;
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    for (; i + 16 <= n; i += 16) {
        __m256i r[2];
        EI_UNROLL
        for (int h = 0; h < 2; h++) {
            const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i + 8 * h));
            const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
            const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
            const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
            const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
            r[h] = _mm256_blendv_epi8(rounded, quiet, nan);
        }
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xd8);
        _mm256_storeu_si256((__m256i *)(y + i), packed);
    }
    for (; i < n; i++) y[i] = ei_fp32_to_bf16(x[i]);
}

/* ---- row decoders ------------------------------------------------------------------- */

/* 32 int8 -> 32 floats: q * d (+ m) */
EI_AVX2_INLINE void store_scaled(float *y, __m256i q, float d, int with_min, float m) {
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i parts[4] = {lo, _mm_unpackhi_epi64(lo, lo), hi, _mm_unpackhi_epi64(hi, hi)};
    EI_UNROLL
    for (int k = 0; k < 4; k++) {
        __m256 v = _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])));
        if (with_min) v = _mm256_add_ps(v, vm);
        _mm256_storeu_ps(y + 8 * k, v);
    }
}

#define DECODE_LEGACY(T, BT, UNPACK, WITH_MIN, MIN)                              \
    static void avx2_to_float_##T(const void *vx, float *y, int64_t n) {         \
        const BT *x = vx;                                                        \
        for (int64_t i = 0; i < n / 32; i++)                                     \
            store_scaled(y + 32 * i, UNPACK(&x[i]), avx2_f16(x[i].d), WITH_MIN, MIN); \
    }
DECODE_LEGACY(q4_0, block_q4_0, avx2_q4_0, 0, 0.0f)
DECODE_LEGACY(q4_1, block_q4_1, avx2_q4_1, 1, avx2_f16(x[i].m))
DECODE_LEGACY(q5_0, block_q5_0, avx2_q5_0, 0, 0.0f)
DECODE_LEGACY(q5_1, block_q5_1, avx2_q5_1, 1, avx2_f16(x[i].m))
DECODE_LEGACY(q8_0, block_q8_0, avx2_q8_0, 0, 0.0f)

/* 16 values of q (int8, shifted down by 'offset') -> (d * sc) * q - m * mn, as the reference */
EI_AVX2_INLINE void decode16(float *y, __m128i q, int offset, float dsc, float mmn) {
    q = _mm_sub_epi8(q, _mm_set1_epi8((char)offset));
    const __m256 vd = _mm256_set1_ps(dsc), vm = _mm256_set1_ps(mmn);
    const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
    const __m256 b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(q, q)));
    _mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(vd, a), vm));
    _mm256_storeu_ps(y + 8, _mm256_sub_ps(_mm256_mul_ps(vd, b), vm));
}

static void avx2_to_float_q2_K(const void *vx, float *y, int64_t n) {
    const block_q2_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        __m256i q[8];
        avx2_q2_K_values(&x[i], q);
        const float d = avx2_f16(x[i].d), m = avx2_f16(x[i].dmin);
        for (int j = 0; j < 16; j++) {
            const __m256i v = q[j / 2];
            const __m128i h = j % 2 ? _mm256_extracti128_si256(v, 1) : _mm256_castsi256_si128(v);
            decode16(y + 16 * j, h, 0, d * (x[i].scales[j] & 0xf), m * (x[i].scales[j] >> 4));
        }
    }
}

static void avx2_to_float_q3_K(const void *vx, float *y, int64_t n) {
    const block_q3_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        __m256i q[8];
        int8_t sc[16];
        avx2_q3_K_values(&x[i], q);
        _mm_storeu_si128((__m128i *)sc, avx2_q3_scales(x[i].scales));
        const float d = avx2_f16(x[i].d);
        for (int j = 0; j < 16; j++) {
            const __m256i v = q[j / 2];
            const __m128i h = j % 2 ? _mm256_extracti128_si256(v, 1) : _mm256_castsi256_si128(v);
            decode16(y + 16 * j, h, 4, d * sc[j], 0.0f);
        }
    }
}

/* Q4_K and Q5_K share scales and layout; q holds 8 sub-blocks of 32 */
EI_AVX2_INLINE void decode_k4(float *y, const __m256i q[8], const uint8_t *scales, float d, float m) {
    uint8_t sm[16];
    _mm_storeu_si128((__m128i *)sm, avx2_k4_scales(scales));
    EI_UNROLL
    for (int j = 0; j < 8; j++) {
        const float dsc = d * sm[j], mmn = m * sm[8 + j];
        decode16(y + 32 * j, _mm256_castsi256_si128(q[j]), 0, dsc, mmn);
        decode16(y + 32 * j + 16, _mm256_extracti128_si256(q[j], 1), 0, dsc, mmn);
    }
}

static void avx2_to_float_q4_K(const void *vx, float *y, int64_t n) {
    const block_q4_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        __m256i q[8];
        avx2_q4_K_values(&x[i], q);
        decode_k4(y, q, x[i].scales, avx2_f16(x[i].d), avx2_f16(x[i].dmin));
    }
}

static void avx2_to_float_q5_K(const void *vx, float *y, int64_t n) {
    const block_q5_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        __m256i q[8];
        avx2_q5_K_values(&x[i], q);
        decode_k4(y, q, x[i].scales, avx2_f16(x[i].d), avx2_f16(x[i].dmin));
    }
}

static void avx2_to_float_q6_K(const void *vx, float *y, int64_t n) {
    const block_q6_K *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        __m256i q[8];
        avx2_q6_K_values(&x[i], q);
        const float d = avx2_f16(x[i].d);
        for (int j = 0; j < 16; j++) {
            const __m256i v = q[j / 2];
            const __m128i h = j % 2 ? _mm256_extracti128_si256(v, 1) : _mm256_castsi256_si128(v);
            decode16(y + 16 * j, h, 32, d * x[i].scales[j], 0.0f);
        }
    }
}

static void avx2_to_float_f16(const void *vx, float *y, int64_t n) {
    const ei_f16 *x = vx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = ei_fp16_to_fp32(x[i]);
}

static void avx2_to_float_bf16(const void *vx, float *y, int64_t n) {
    const ei_bf16 *x = vx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; i++) y[i] = ei_bf16_to_fp32(x[i]);
}

void ei_avx2_convert_kernels(ei_kernels *k) {
    k->from_float[EI_TYPE_Q8_0] = avx2_from_float_q8_0;
    k->from_float[EI_TYPE_Q8_1] = avx2_from_float_q8_1;
    k->from_float[EI_TYPE_Q8_K] = avx2_from_float_q8_K;
    k->from_float[EI_TYPE_F16] = avx2_from_float_f16;
    k->from_float[EI_TYPE_BF16] = avx2_from_float_bf16;

    k->to_float[EI_TYPE_Q4_0] = avx2_to_float_q4_0;
    k->to_float[EI_TYPE_Q4_1] = avx2_to_float_q4_1;
    k->to_float[EI_TYPE_Q5_0] = avx2_to_float_q5_0;
    k->to_float[EI_TYPE_Q5_1] = avx2_to_float_q5_1;
    k->to_float[EI_TYPE_Q8_0] = avx2_to_float_q8_0;
    k->to_float[EI_TYPE_Q2_K] = avx2_to_float_q2_K;
    k->to_float[EI_TYPE_Q3_K] = avx2_to_float_q3_K;
    k->to_float[EI_TYPE_Q4_K] = avx2_to_float_q4_K;
    k->to_float[EI_TYPE_Q5_K] = avx2_to_float_q5_K;
    k->to_float[EI_TYPE_Q6_K] = avx2_to_float_q6_K;
    k->to_float[EI_TYPE_F16] = avx2_to_float_f16;
    k->to_float[EI_TYPE_BF16] = avx2_to_float_bf16;
}

/* ---- dot products of one weight row with one activation row ----------------------------
 *
 * Legacy blocks: four blocks at a time, one block per lane of the integer sums; each
 * block's term is the reference's exact double, and the terms are added to the running
 * sum in block order, as the reference adds them. K blocks: one super-block at a time,
 * the integer scales applied in the integer domain (madd), one term per super-block. */

/* ---- legacy blocks ----------------------------------------------------------------- */

EI_AVX2_INLINE float dot_legacy(const int type, int n, const void *vx, const void *vy) {
    const legacy_info L = legacy_of(type);
    const uint8_t *x = vx, *y = vy;
    const int nb = n / 32;
    double sum = 0.0;
    for (int i = 0; i < nb; i += 4) {
        const int m = nb - i < 4 ? nb - i : 4;
        __m256i p[4];
        EI_UNROLL
        for (int j = 0; j < 4; j++) {
            p[j] = _mm256_setzero_si256();
            if (j < m) {
                const uint8_t *xb = x + (size_t)(i + j) * L.xb, *yb = y + (size_t)(i + j) * L.yb;
                const __m256i w = unpack_legacy(type, xb), yv = _mm256_loadu_si256((const __m256i *)(yb + L.yqs));
                p[j] = pair_products(&L, w, _mm256_abs_epi8(w), yv, offset_pairs(&L, yv));
            }
        }
        const __m256d isum = _mm256_cvtepi32_pd(block_sums4(p[0], p[1], p[2], p[3], L.wide));
        double t[4];
        if (m == 4) {
            const uint8_t *xb = x + (size_t)i * L.xb, *yb = y + (size_t)i * L.yb;
            /* d_x * d_y (two fp16) is exact in float, and its product with the block sum in double */
            const __m256d scale = _mm256_mul_pd(f16x4_pd(xb, L.xb, 0), f16x4_pd(yb, L.yb, 0));
            __m256d term = _mm256_mul_pd(scale, isum);
            if (L.with_min) /* the sum of two exact products, rounded once */
                term = _mm256_fmadd_pd(scale, isum, _mm256_mul_pd(f16x4_pd(xb, L.xb, 2), f16x4_pd(yb, L.yb, 2)));
            _mm256_storeu_pd(t, term);
        } else {
            double is[4];
            _mm256_storeu_pd(is, isum);
            for (int j = 0; j < m; j++) {
                const uint8_t *xb = x + (size_t)(i + j) * L.xb, *yb = y + (size_t)(i + j) * L.yb;
                ei_f16 dx, dy;
                memcpy(&dx, xb, 2); memcpy(&dy, yb, 2);
                t[j] = (double)avx2_f16(dx) * avx2_f16(dy) * is[j];
                if (L.with_min) {
                    ei_f16 mx, sy;
                    memcpy(&mx, xb + 2, 2); memcpy(&sy, yb + 2, 2);
                    t[j] += (double)avx2_f16(mx) * avx2_f16(sy);
                }
            }
        }
        for (int j = 0; j < m; j++) sum += t[j];
    }
    return (float)sum;
}

static void avx2_dot_q4_0(int n, float *s, const void *x, const void *y) { *s = dot_legacy(EI_TYPE_Q4_0, n, x, y); }
static void avx2_dot_q4_1(int n, float *s, const void *x, const void *y) { *s = dot_legacy(EI_TYPE_Q4_1, n, x, y); }
static void avx2_dot_q5_0(int n, float *s, const void *x, const void *y) { *s = dot_legacy(EI_TYPE_Q5_0, n, x, y); }
static void avx2_dot_q5_1(int n, float *s, const void *x, const void *y) { *s = dot_legacy(EI_TYPE_Q5_1, n, x, y); }
static void avx2_dot_q8_0(int n, float *s, const void *x, const void *y) { *s = dot_legacy(EI_TYPE_Q8_0, n, x, y); }

/* the keys of a q8_0 / q4_0 cache against one q8_0 query (attn_dots_q): four keys at a time,
 * block_sums4 giving their exact integer sums of one block, each key's lane adding its terms
 * d_k * d_q * isum in double in block order, as dot_legacy */
static void avx2_attn_dots_q(int k_type, const uint8_t *qq, const uint8_t *k, size_t row_bytes, int hd, int m,
                             float *out) {
    const legacy_info L = legacy_of(k_type == EI_TYPE_Q4_0 ? EI_TYPE_Q4_0 : EI_TYPE_Q8_0);
    const int nb = hd / 32;
    for (int t = 0; t < m; t += 4) {
        const int cnt = m - t < 4 ? m - t : 4;
        const uint8_t *row[4]; /* a tail repeats the first key */
        for (int j = 0; j < 4; j++) row[j] = k + (size_t)(t + (j < cnt ? j : 0)) * row_bytes;
        __m256d acc = _mm256_setzero_pd();
        for (int b = 0; b < nb; b++) {
            const uint8_t *yb = qq + (size_t)b * L.yb;
            const __m256i yv = _mm256_loadu_si256((const __m256i *)(yb + L.yqs)), yoff = offset_pairs(&L, yv);
            __m256i p[4];
            EI_UNROLL
            for (int j = 0; j < 4; j++) {
                const __m256i w = unpack_legacy(k_type, row[j] + (size_t)b * L.xb);
                p[j] = pair_products(&L, w, _mm256_abs_epi8(w), yv, yoff);
            }
            const __m256d isum = _mm256_cvtepi32_pd(block_sums4(p[0], p[1], p[2], p[3], L.wide));
            const size_t o = (size_t)b * L.xb;
            ei_f16 dy;
            memcpy(&dy, yb, 2);
            const __m256d scale = _mm256_mul_pd(_mm256_cvtps_pd(avx2_f16x4(row[0] + o, row[1] + o, row[2] + o, row[3] + o)),
                                                _mm256_set1_pd((double)avx2_f16(dy)));
            acc = _mm256_add_pd(acc, _mm256_mul_pd(scale, isum));
        }
        float o[4];
        _mm_storeu_ps(o, _mm256_cvtpd_ps(acc));
        for (int j = 0; j < cnt; j++) out[t + j] = o[j];
    }
}

/* ---- K blocks ---------------------------------------------------------------------- */

EI_AVX2_INLINE float dot_k(const int type, int n, const void *vx, const void *vy) {
    const size_t xb = avx2_kblock_bytes(type);
    const uint8_t *x = vx;
    const block_q8_K *y = vy;
    double sum = 0.0;
    for (int i = 0; i < n / QK_K; i++) {
        avx2_kblock w;
        double d, dmin;
        avx2_kblock_unpack(type, x + (size_t)i * xb, &w, &d, &dmin);
        __m256i isum, imin;
        avx2_kblock_pair(type, &w, &y[i], &isum, &imin);
        const double yd = y[i].d;
        if (avx2_kblock_has_min(type))
            sum += yd * d * avx2_hsum_i32(isum) - yd * dmin * avx2_hsum_i32(imin);
        else
            sum += yd * d * avx2_hsum_i32(isum);
    }
    return (float)sum;
}

static void avx2_dot_q2_K(int n, float *s, const void *x, const void *y) { *s = dot_k(EI_TYPE_Q2_K, n, x, y); }
static void avx2_dot_q3_K(int n, float *s, const void *x, const void *y) { *s = dot_k(EI_TYPE_Q3_K, n, x, y); }
static void avx2_dot_q4_K(int n, float *s, const void *x, const void *y) { *s = dot_k(EI_TYPE_Q4_K, n, x, y); }
static void avx2_dot_q5_K(int n, float *s, const void *x, const void *y) { *s = dot_k(EI_TYPE_Q5_K, n, x, y); }
static void avx2_dot_q6_K(int n, float *s, const void *x, const void *y) { *s = dot_k(EI_TYPE_Q6_K, n, x, y); }

/* ---- float rows ----------------------------------------------------------------------
 * Every product of two fp16, bf16 or f32 values is exact in double; the products are formed
 * in vectors and added to the running sum in index order, as the reference adds them. */

EI_AVX2_INLINE void add_in_order(double *sum, __m256d terms) {
    double t[4];
    _mm256_storeu_pd(t, terms);
    *sum += t[0]; *sum += t[1]; *sum += t[2]; *sum += t[3];
}

static void avx2_dot_f16(int n, float *s, const void *vx, const void *vy) {
    const ei_f16 *x = vx, *y = vy;
    double sum = 0.0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        /* the product of two fp16 values is exact in float */
        const __m256 p = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))),
                                       _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i))));
        add_in_order(&sum, _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
        add_in_order(&sum, _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1)));
    }
    for (; i < n; i++) sum += (double)ei_fp16_to_fp32(x[i]) * ei_fp16_to_fp32(y[i]);
    *s = (float)sum;
}

static void avx2_dot_bf16(int n, float *s, const void *vx, const void *vy) {
    const ei_bf16 *x = vx, *y = vy;
    double sum = 0.0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m128i wx = _mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)(x + i)));
        const __m128i wy = _mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)(y + i)));
        const __m256d a = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(wx, 16)));
        const __m256d b = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(wy, 16)));
        add_in_order(&sum, _mm256_mul_pd(a, b));
    }
    for (; i < n; i++) sum += (double)ei_bf16_to_fp32(x[i]) * ei_bf16_to_fp32(y[i]);
    *s = (float)sum;
}

static void avx2_dot_f32(int n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    double sum = 0.0;
    int i = 0;
    for (; i + 4 <= n; i += 4)
        add_in_order(&sum, _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i)), _mm256_cvtps_pd(_mm_loadu_ps(y + i))));
    for (; i < n; i++) sum += (double)x[i] * y[i];
    *s = (float)sum;
}

void ei_avx2_dot_kernels(ei_kernels *k) {
    k->vec_dot[EI_TYPE_Q4_0] = avx2_dot_q4_0;
    k->vec_dot[EI_TYPE_Q4_1] = avx2_dot_q4_1;
    k->vec_dot[EI_TYPE_Q5_0] = avx2_dot_q5_0;
    k->vec_dot[EI_TYPE_Q5_1] = avx2_dot_q5_1;
    k->vec_dot[EI_TYPE_Q8_0] = avx2_dot_q8_0;
    k->vec_dot[EI_TYPE_Q2_K] = avx2_dot_q2_K;
    k->vec_dot[EI_TYPE_Q3_K] = avx2_dot_q3_K;
    k->vec_dot[EI_TYPE_Q4_K] = avx2_dot_q4_K;
    k->vec_dot[EI_TYPE_Q5_K] = avx2_dot_q5_K;
    k->vec_dot[EI_TYPE_Q6_K] = avx2_dot_q6_K;
    k->vec_dot[EI_TYPE_F16] = avx2_dot_f16;
    k->vec_dot[EI_TYPE_BF16] = avx2_dot_bf16;
    k->vec_dot[EI_TYPE_F32] = avx2_dot_f32;
    k->attn_dots_q = avx2_attn_dots_q;
}
