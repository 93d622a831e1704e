/* AVX2 float operations of a decoder step: the reference's float32 operations in the same
 * order, eight lanes at a time and never fused; reductions add in the reference's order. */
#include <math.h>

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

/* libm's exp in double, as the reference: nothing to vectorize without changing the result */
static void avx2_swiglu(int n, float *y, const float *g, const float *u) {
    for (int i = 0; i < n; i++) y[i] = (float)(g[i] / (1.0 + exp(-(double)g[i]))) * u[i];
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
