/* avx512 float operations of a decoder step: the reference's (ref/ops.c) float32 operations
 * in the same order, sixteen lanes at a time and never fused; every reduction adds in the
 * reference's order (rms_norm's squares one by one), so the results are the reference's bit
 * for bit, whether or not the double sums are exact. */
#include <math.h>

#include "../common/silu.h"
#include "blocks.h"

/* ---- elementwise ------------------------------------------------------------------------- */

static void rms_norm(int n, float *y, const float *x, const float *w, float eps) {
    double sum = 0.0; /* squares rounded to float, added in double in index order */
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i), sq = _mm512_mul_ps(v, v);
        double t[16];
        _mm512_storeu_pd(t, _mm512_cvtps_pd(_mm512_castps512_ps256(sq)));
        _mm512_storeu_pd(t + 8, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sq), 1))));
        EI_UNROLL for (int j = 0; j < 16; j++) sum += t[j];
    }
    for (; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    const __m512 vs = _mm512_set1_ps(scale);
    i = 0;
    if (w) {
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vs), _mm512_loadu_ps(w + i)));
        for (; i < n; i++) y[i] = x[i] * scale * w[i];
    } else {
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), vs));
        for (; i < n; i++) y[i] = x[i] * scale;
    }
}

static void rope(int n_rot, float *x, const float *cs, int neox) {
    const int half = n_rot / 2;
    int i = 0;
    if (neox) {
        /* (c, s) pairs split into c and s vectors; x0 = x[i], x1 = x[i + half] */
        const __m512i ci = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        const __m512i si = _mm512_add_epi32(ci, _mm512_set1_epi32(1));
        for (; i + 16 <= half; i += 16) {
            const __m512 t0 = _mm512_loadu_ps(cs + 2 * i), t1 = _mm512_loadu_ps(cs + 2 * i + 16);
            const __m512 c = _mm512_permutex2var_ps(t0, ci, t1), s = _mm512_permutex2var_ps(t0, si, t1);
            const __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + half);
            _mm512_storeu_ps(x + i, _mm512_sub_ps(_mm512_mul_ps(x0, c), _mm512_mul_ps(x1, s)));
            _mm512_storeu_ps(x + i + half, _mm512_add_ps(_mm512_mul_ps(x0, s), _mm512_mul_ps(x1, c)));
        }
    } else {
        /* pairs side by side: even lanes x0*c - x1*s, odd lanes x0*s + x1*c */
        const __m512i dup0 = _mm512_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14);
        const __m512i dup1 = _mm512_add_epi32(dup0, _mm512_set1_epi32(1));
        const __m512i swap = _mm512_setr_epi32(1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
        for (; i + 8 <= half; i += 8) {
            const __m512 v = _mm512_loadu_ps(x + 2 * i), t = _mm512_loadu_ps(cs + 2 * i);
            const __m512 a = _mm512_mul_ps(_mm512_permutexvar_ps(dup0, v), t);                           /* x0*c, x0*s */
            const __m512 b = _mm512_mul_ps(_mm512_permutexvar_ps(dup1, v), _mm512_permutexvar_ps(swap, t)); /* x1*s, x1*c */
            _mm512_storeu_ps(x + 2 * i, _mm512_mask_add_ps(_mm512_sub_ps(a, b), 0xaaaa, a, b));
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

static void geglu(int n, float *y, const float *g, const float *u, const ei_f16 *tab) {
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 gv = _mm512_loadu_ps(g + i);
        /* the table entry of fp16(g): gather the aligned pair of entries that holds it, so
         * the last entry is read without reading past the table */
        const __m512i h = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(gv, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m512i pair = _mm512_i32gather_epi32(_mm512_srli_epi32(h, 1), (const void *)tab, 4);
        const __m512i odd = _mm512_slli_epi32(_mm512_and_si512(h, _mm512_set1_epi32(1)), 4);
        const __m512i e = _mm512_and_si512(_mm512_srlv_epi32(pair, odd), _mm512_set1_epi32(0xffff));
        __m512 v = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(e));
        v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(gv, _mm512_set1_ps(10.0f), _CMP_GE_OQ), gv);
        v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(gv, _mm512_set1_ps(-10.0f), _CMP_LE_OQ), _mm512_setzero_ps());
        _mm512_storeu_ps(y + i, _mm512_mul_ps(v, _mm512_loadu_ps(u + i)));
    }
    for (; i < n; i++) {
        float v;
        if (g[i] <= -10.0f) v = 0.0f;
        else if (g[i] >= 10.0f) v = g[i];
        else v = ei_fp16_to_fp32(tab[ei_fp32_to_fp16(g[i])]);
        y[i] = v * u[i];
    }
}

/* exp(x) for |x| <= 80, in double, to a relative 1e-14, as x86_avx2/ops.c's avx2_exp_pd:
 * x = n ln2 + r, the Taylor series of exp(r) to r^11 in Estrin's order, times 2^n through the
 * exponent bits */
EI_INLINE __m512d exp_pd(__m512d x) {
    const __m512d magic = _mm512_set1_pd(0x1.8p52); /* adding it rounds to an integer, held in the low bits */
    const __m512d nd = _mm512_add_pd(_mm512_mul_pd(x, _mm512_set1_pd(0x1.71547652b82fep0)), magic);
    const __m512d n = _mm512_sub_pd(nd, magic);
    __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(0x1.62e42fefa39efp-1), x);
    r = _mm512_fnmadd_pd(n, _mm512_set1_pd(0x1.abc9e3b39803fp-56), r);
#define C(k, f) const __m512d k = _mm512_set1_pd(1.0 / (f))
    C(c2, 2); C(c3, 6); C(c4, 24); C(c5, 120); C(c6, 720); C(c7, 5040);
    C(c8, 40320); C(c9, 362880); C(c10, 3628800); C(c11, 39916800);
#undef C
    const __m512d r2 = _mm512_mul_pd(r, r), r4 = _mm512_mul_pd(r2, r2), r8 = _mm512_mul_pd(r4, r4);
    const __m512d one = _mm512_set1_pd(1.0);
    const __m512d a0 = _mm512_fmadd_pd(one, r, one), a1 = _mm512_fmadd_pd(c3, r, c2);
    const __m512d a2 = _mm512_fmadd_pd(c5, r, c4), a3 = _mm512_fmadd_pd(c7, r, c6);
    const __m512d a4 = _mm512_fmadd_pd(c9, r, c8), a5 = _mm512_fmadd_pd(c11, r, c10);
    const __m512d b0 = _mm512_fmadd_pd(a1, r2, a0), b1 = _mm512_fmadd_pd(a3, r2, a2), b2 = _mm512_fmadd_pd(a5, r2, a4);
    const __m512d p = _mm512_fmadd_pd(b2, r8, _mm512_fmadd_pd(b1, r4, b0));
    const __m512i shift = _mm512_slli_epi64(_mm512_sub_epi64(_mm512_castpd_si512(nd), _mm512_castpd_si512(magic)), 52);
    return _mm512_castsi512_pd(_mm512_add_epi64(_mm512_castpd_si512(p), shift));
}

/* g / (1 + exp(-g)), with the lanes whose rounding to float may differ from libm's in *unsure:
 * within EI_SILU_MARGIN of a midpoint of two floats, |g| > 80 or below the floats' normal range
 * (why these, in x86_avx2/ops.c) */
EI_INLINE __m512d silu_pd(__m512d g, __mmask8 *unsure) {
    const __m512d d = _mm512_add_pd(_mm512_set1_pd(1.0), exp_pd(_mm512_xor_pd(g, _mm512_set1_pd(-0.0))));
    const __m512d q = _mm512_div_pd(g, d);
    /* a negative difference wraps to near 2^64: one unsigned compare */
    const __m512i below = _mm512_sub_epi64(_mm512_and_si512(_mm512_castpd_si512(q), _mm512_set1_epi64(0x1FFFFFFF)),
                                           _mm512_set1_epi64(0x10000000 - EI_SILU_MARGIN));
    const __mmask8 near = _mm512_cmple_epu64_mask(below, _mm512_set1_epi64(2 * EI_SILU_MARGIN - 1));
    const __mmask8 ok = _mm512_cmp_pd_mask(_mm512_abs_pd(g), _mm512_set1_pd(80.0), _CMP_LE_OQ) &
                        _mm512_cmp_pd_mask(_mm512_abs_pd(q), _mm512_set1_pd(0x1p-126), _CMP_GE_OQ);
    *unsure = (__mmask8)(near | ~ok);
    return q;
}

static void swiglu(int n, float *y, const float *g, const float *u) {
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __mmask8 lo, hi;
        const __m256 slo = _mm512_cvtpd_ps(silu_pd(_mm512_cvtps_pd(_mm256_loadu_ps(g + i)), &lo));
        const __m256 shi = _mm512_cvtpd_ps(silu_pd(_mm512_cvtps_pd(_mm256_loadu_ps(g + i + 8)), &hi));
        const __m512 silu = _mm512_insertf32x8(_mm512_castps256_ps512(slo), shi, 1);
        const unsigned unsure = lo | (unsigned)hi << 8;
        /* y may be g: the unsure lanes are left out of the store, so they still hold g */
        _mm512_mask_storeu_ps(y + i, (__mmask16)~unsure, _mm512_mul_ps(silu, _mm512_loadu_ps(u + i)));
        for (unsigned m = unsure; m; m &= m - 1) {
            const int j = __builtin_ctz(m);
            y[i + j] = ei_silu(g[i + j]) * u[i + j];
        }
    }
    for (; i < n; i++) y[i] = ei_silu(g[i]) * u[i];
}

static void add(int n, float *y, const float *x) {
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_loadu_ps(x + i)));
    for (; i < n; i++) y[i] += x[i];
}

static void scale(int n, float *y, float s) {
    const __m512 vs = _mm512_set1_ps(s);
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(y + i), vs));
    for (; i < n; i++) y[i] *= s;
}

/* the reference's butterflies: strides 1 to 8 inside a vector (a partner from a permute,
 * v + (+-u) as u + v or u - v, exactly), wider ones between vectors */
static void hadamard(float *x, int n, int block) {
    scale(n, x, 1.0f / sqrtf((float)block));
    /* lane i's partner at strides 1, 2, 4 and 8 (i ^ stride), and +1 where lane i is the
     * first of its pair, else -1 */
    static const int32_t partner[4][16] = {
        {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14},
        {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13},
        {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11},
        {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7},
    };
    static const float sign[4][16] = {
        {1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1},
        {1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1},
        {1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1},
        {1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1},
    };
    for (int b = 0; b < n; b += block) {
        float *y = x + b;
        for (int i = 0; i < block; i += 16) {
            __m512 v = _mm512_loadu_ps(y + i);
            for (int k = 0; k < 4; k++)
                v = _mm512_add_ps(_mm512_permutexvar_ps(_mm512_loadu_si512(partner[k]), v),
                                  _mm512_mul_ps(v, _mm512_loadu_ps(sign[k])));
            _mm512_storeu_ps(y + i, v);
        }
        for (int len = 16; len < block; len <<= 1)
            for (int i = 0; i < block; i += 2 * len)
                for (int j = i; j < i + len; j += 16) {
                    const __m512 u = _mm512_loadu_ps(y + j), w = _mm512_loadu_ps(y + j + len);
                    _mm512_storeu_ps(y + j, _mm512_add_ps(u, w));
                    _mm512_storeu_ps(y + j + len, _mm512_sub_ps(u, w));
                }
    }
}

void ei_avx512_op_kernels(ei_kernels *k) {
    k->rms_norm = rms_norm;
    k->rope = rope;
    k->geglu = geglu;
    k->swiglu = swiglu;
    k->add = add;
    k->scale = scale;
    k->hadamard = hadamard;
}
