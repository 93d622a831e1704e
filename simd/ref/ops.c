/* Scalar reference of the float operations of a decoder step (attention: attn.c).
 *
 * Elementwise steps are float32 operations in a fixed order, never fused; reductions (sums
 * of squares) and transcendental functions are computed in double and rounded once. The
 * numpy reference engine computes the same values. */
#include <math.h>
#include <string.h>

#include "../common/ei_kernels.h"
#include "../common/silu.h"

static void ref_rms_norm(int n, float *y, const float *x, const float *w, float eps) {
    double sum = 0.0; /* squares rounded to float, summed in double */
    for (int i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    if (w) {
        for (int i = 0; i < n; i++) y[i] = x[i] * scale * w[i];
    } else {
        for (int i = 0; i < n; i++) y[i] = x[i] * scale;
    }
}

static void ref_rope(int n_rot, float *x, const float *cs, int neox) {
    const int half = n_rot / 2;
    for (int i = 0; i < half; i++) {
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

static void ref_geglu(int n, float *y, const float *g, const float *u, const ei_f16 *tab) {
    for (int i = 0; i < n; i++) {
        float v;
        if (g[i] <= -10.0f) v = 0.0f;
        else if (g[i] >= 10.0f) v = g[i];
        else v = ei_fp16_to_fp32(tab[ei_fp32_to_fp16(g[i])]);
        y[i] = v * u[i];
    }
}

static void ref_swiglu(int n, float *y, const float *g, const float *u) {
    for (int i = 0; i < n; i++) y[i] = ei_silu(g[i]) * u[i];
}

static void ref_add(int n, float *y, const float *x) {
    for (int i = 0; i < n; i++) y[i] += x[i];
}

static void ref_scale(int n, float *y, float s) {
    for (int i = 0; i < n; i++) y[i] *= s;
}

static void ref_hadamard(float *x, int n, int block) {
    const float scale = 1.0f / sqrtf((float)block);
    for (int i = 0; i < n; i++) x[i] *= scale;
    for (int b = 0; b < n; b += block) {
        float *y = x + b;
        for (int len = 1; len < block; len <<= 1)
            for (int i = 0; i < block; i += 2 * len)
                for (int j = i; j < i + len; j++) {
                    const float u = y[j], v = y[j + len];
                    y[j] = u + v;
                    y[j + len] = u - v;
                }
    }
}

void ei_ref_op_kernels(ei_kernels *k) {
    k->rms_norm = ref_rms_norm;
    k->rope = ref_rope;
    k->geglu = ref_geglu;
    k->swiglu = ref_swiglu;
    k->add = ref_add;
    k->scale = ref_scale;
    k->hadamard = ref_hadamard;
}
