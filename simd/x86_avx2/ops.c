/* AVX2 float operations of a decoder step: the reference's float32 operations in the same
 * order, eight lanes at a time and never fused; reductions add in the reference's order. */
#include <math.h>

#include "../common/silu.h"
#include "simd.h"

static void avx2_rms_norm(int n, float *y, const float *x, const float *w, float eps) {
    /* squares rounded to float, summed in double in index order: the sum is not exact in
     * general, so it keeps the reference's order */
    double sum = 0.0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        double t[8];
        const __m256 sq = _mm256_mul_ps(v, v);
        _mm256_storeu_pd(t, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        _mm256_storeu_pd(t + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
        for (int j = 0; j < 8; j++) sum += t[j];
    }
    for (; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    const __m256 vs = _mm256_set1_ps(scale);
    i = 0;
    if (w) {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), _mm256_loadu_ps(w + i)));
        for (; i < n; i++) y[i] = x[i] * scale * w[i];
    } else {
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
        for (; i < n; i++) y[i] = x[i] * scale;
    }
}

static void avx2_rope(int n_rot, float *x, const float *cs, int neox) {
    const int half = n_rot / 2;
    int i = 0;
    if (!neox) {
        /* pairs (x0, x1) side by side: x0*c - x1*s in even lanes, x0*s + x1*c in odd lanes */
        for (; i + 4 <= half; i += 4) {
            const __m256 v = _mm256_loadu_ps(x + 2 * i), t = _mm256_loadu_ps(cs + 2 * i); /* (c, s) pairs */
            const __m256 a = _mm256_mul_ps(_mm256_moveldup_ps(v), t);                      /* x0*c, x0*s */
            const __m256 b = _mm256_mul_ps(_mm256_movehdup_ps(v), _mm256_permute_ps(t, 0xb1)); /* x1*s, x1*c */
            _mm256_storeu_ps(x + 2 * i, _mm256_addsub_ps(a, b));
        }
    } else {
        for (; i + 8 <= half; i += 8) {
            const __m256 t0 = _mm256_loadu_ps(cs + 2 * i), t1 = _mm256_loadu_ps(cs + 2 * i + 8);
            /* de-interleave the (c, s) pairs; shuffle_ps leaves the 64-bit quarters in 0, 2, 1, 3 order */
            const __m256 c = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(t0, t1, 0x88)), 0xd8));
            const __m256 s = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(t0, t1, 0xdd)), 0xd8));
            const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + half);
            _mm256_storeu_ps(x + i, _mm256_sub_ps(_mm256_mul_ps(x0, c), _mm256_mul_ps(x1, s)));
            _mm256_storeu_ps(x + i + half, _mm256_add_ps(_mm256_mul_ps(x0, s), _mm256_mul_ps(x1, c)));
        }
    }
    for (; i < half; i++) {
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

static void avx2_geglu(int n, float *y, const float *g, const float *u, const ei_f16 *tab) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        uint16_t idx[8], val[8];
        _mm_storeu_si128((__m128i *)idx, _mm256_cvtps_ph(gv, _MM_FROUND_TO_NEAREST_INT));
        for (int j = 0; j < 8; j++) val[j] = tab[idx[j]];
        __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)val));
        v = _mm256_blendv_ps(v, gv, _mm256_cmp_ps(gv, _mm256_set1_ps(10.0f), _CMP_GE_OQ));
        v = _mm256_blendv_ps(v, _mm256_setzero_ps(), _mm256_cmp_ps(gv, _mm256_set1_ps(-10.0f), _CMP_LE_OQ));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(v, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) {
        float v;
        if (g[i] <= -10.0f) v = 0.0f;
        else if (g[i] >= 10.0f) v = g[i];
        else v = ei_fp16_to_fp32(tab[ei_fp32_to_fp16(g[i])]);
        y[i] = v * u[i];
    }
}

/* exp(x) for |x| <= 80, in double, to a relative 1e-14: x = n ln2 + r with |r| <= ln2 / 2, the
 * Taylor series of exp(r) to r^11 (the next term is below 7e-15) in Estrin's order (a chain of
 * 4 products, not 11), times 2^n through the exponent bits */
EI_AVX2_INLINE __m256d avx2_exp_pd(__m256d x) {
    const __m256d magic = _mm256_set1_pd(0x1.8p52); /* adding it rounds to an integer, held in the low bits */
    const __m256d nd = _mm256_add_pd(_mm256_mul_pd(x, _mm256_set1_pd(0x1.71547652b82fep0)), magic);
    const __m256d n = _mm256_sub_pd(nd, magic);
    __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(0x1.62e42fefa39efp-1), x);
    r = _mm256_fnmadd_pd(n, _mm256_set1_pd(0x1.abc9e3b39803fp-56), r);
#define C(k, f) const __m256d k = _mm256_set1_pd(1.0 / (f))
    C(c2, 2); C(c3, 6); C(c4, 24); C(c5, 120); C(c6, 720); C(c7, 5040);
    C(c8, 40320); C(c9, 362880); C(c10, 3628800); C(c11, 39916800);
#undef C
    const __m256d r2 = _mm256_mul_pd(r, r), r4 = _mm256_mul_pd(r2, r2), r8 = _mm256_mul_pd(r4, r4);
    const __m256d one = _mm256_set1_pd(1.0);
    const __m256d a0 = _mm256_fmadd_pd(one, r, one), a1 = _mm256_fmadd_pd(c3, r, c2);
    const __m256d a2 = _mm256_fmadd_pd(c5, r, c4), a3 = _mm256_fmadd_pd(c7, r, c6);
    const __m256d a4 = _mm256_fmadd_pd(c9, r, c8), a5 = _mm256_fmadd_pd(c11, r, c10);
    const __m256d b0 = _mm256_fmadd_pd(a1, r2, a0), b1 = _mm256_fmadd_pd(a3, r2, a2), b2 = _mm256_fmadd_pd(a5, r2, a4);
    const __m256d p = _mm256_fmadd_pd(b2, r8, _mm256_fmadd_pd(b1, r4, b0));
    const __m256i shift = _mm256_slli_epi64(_mm256_sub_epi64(_mm256_castpd_si256(nd), _mm256_castpd_si256(magic)), 52);
    return _mm256_castsi256_pd(_mm256_add_epi64(_mm256_castpd_si256(p), shift));
}

/* g / (1 + exp(-g)) rounded to float, as the reference with libm's exp (common/silu.h): both
 * doubles lie within 1e-14 of the exact value, so they round to the same float unless the value
 * is near the midpoint of two floats (its 29 bits below a float's mantissa within EI_SILU_MARGIN
 * of 2^28: 2^-41 relative, one value in 2^17), |g| > 80 or the value is below the floats'
 * normal range. Lanes where the value is not sure come back in the mask. */
EI_AVX2_INLINE __m256d avx2_silu_pd(__m256d g, int *unsure) {
    const __m256d sign = _mm256_set1_pd(-0.0);
    const __m256d d = _mm256_add_pd(_mm256_set1_pd(1.0), avx2_exp_pd(_mm256_xor_pd(g, sign)));
    const __m256d q = _mm256_div_pd(g, d);
    const __m256i below = _mm256_sub_epi64(_mm256_and_si256(_mm256_castpd_si256(q), _mm256_set1_epi64x(0x1FFFFFFF)),
                                           _mm256_set1_epi64x(0x10000000 - EI_SILU_MARGIN));
    const __m256i near = _mm256_andnot_si256(_mm256_cmpgt_epi64(_mm256_setzero_si256(), below),
                                             _mm256_cmpgt_epi64(_mm256_set1_epi64x(2 * EI_SILU_MARGIN), below));
    const __m256d ok = _mm256_and_pd(_mm256_cmp_pd(_mm256_andnot_pd(sign, g), _mm256_set1_pd(80.0), _CMP_LE_OQ),
                                     _mm256_cmp_pd(_mm256_andnot_pd(sign, q), _mm256_set1_pd(0x1p-126), _CMP_GE_OQ));
    *unsure = _mm256_movemask_pd(_mm256_andnot_pd(_mm256_castsi256_pd(near), ok)) ^ 0xF;
    return q;
}

static void avx2_swiglu(int n, float *y, const float *g, const float *u) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g8 = _mm256_loadu_ps(g + i);
        int lo, hi;
        const __m256d qlo = avx2_silu_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(g8)), &lo);
        const __m256d qhi = avx2_silu_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(g8, 1)), &hi);
        const __m256 silu = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm256_cvtpd_ps(qlo)), _mm256_cvtpd_ps(qhi), 1);
        const __m256 prod = _mm256_mul_ps(silu, _mm256_loadu_ps(u + i));
        if (!(lo | hi)) {
            _mm256_storeu_ps(y + i, prod);
            continue;
        }
        float t[8]; /* y may be g: the unsure lanes read g before the store */
        _mm256_storeu_ps(t, prod);
        for (int unsure = lo | hi << 4; unsure; unsure &= unsure - 1) {
            const int j = __builtin_ctz((unsigned)unsure);
            t[j] = ei_silu(g[i + j]) * u[i + j];
        }
        memcpy(y + i, t, sizeof(t));
    }
    for (; i < n; i++) y[i] = ei_silu(g[i]) * u[i];
}

static void avx2_add(int n, float *y, const float *x) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] += x[i];
}

static void avx2_scale(int n, float *y, float s) {
    const __m256 vs = _mm256_set1_ps(s);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), vs));
    for (; i < n; i++) y[i] *= s;
}

/* the reference's butterflies: strides 1, 2 and 4 inside a vector (a partner from a permute,
 * v + (+-u) as u + v or u - v, exactly), wider ones between vectors */
static void avx2_hadamard(float *x, int n, int block) {
    avx2_scale(n, x, 1.0f / sqrtf((float)block));
    const __m256 s1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1), s2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    const __m256 s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
    for (int b = 0; b < n; b += block) {
        float *y = x + b;
        for (int i = 0; i < block; i += 8) {
            __m256 v = _mm256_loadu_ps(y + i);
            v = _mm256_add_ps(_mm256_permute_ps(v, 0xB1), _mm256_mul_ps(v, s1));
            v = _mm256_add_ps(_mm256_permute_ps(v, 0x4E), _mm256_mul_ps(v, s2));
            v = _mm256_add_ps(_mm256_permute2f128_ps(v, v, 1), _mm256_mul_ps(v, s4));
            _mm256_storeu_ps(y + i, v);
        }
        for (int len = 8; len < block; len <<= 1)
            for (int i = 0; i < block; i += 2 * len)
                for (int j = i; j < i + len; j += 8) {
                    const __m256 u = _mm256_loadu_ps(y + j), w = _mm256_loadu_ps(y + j + len);
                    _mm256_storeu_ps(y + j, _mm256_add_ps(u, w));
                    _mm256_storeu_ps(y + j + len, _mm256_sub_ps(u, w));
                }
    }
}

void ei_avx2_op_kernels(ei_kernels *k) {
    k->rms_norm = avx2_rms_norm;
    k->rope = avx2_rope;
    k->geglu = avx2_geglu;
    k->swiglu = avx2_swiglu;
    k->add = avx2_add;
    k->scale = avx2_scale;
    k->hadamard = avx2_hadamard;
}
