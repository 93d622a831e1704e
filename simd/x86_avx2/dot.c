/* AVX2 dot products of one weight row with one activation row.
 *
 * Legacy blocks: four blocks at a time, one block per lane of the integer sums; each
 * block's term is the reference's exact double, and the terms are added to the running
 * sum in block order, as the reference adds them. K blocks: one super-block at a time,
 * the integer scales applied in the integer domain (madd), one term per super-block. */
#include "kblock.h"
#include "legacy.h"

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
}
