/* Scalar reference of the float operations of a decoder step.
 *
 * Elementwise steps are float32 operations in a fixed order, never fused; reductions (sums
 * of squares, dot products, softmax sums) and transcendental functions are computed in
 * double and rounded once. The numpy reference engine computes the same values. */
#include <math.h>
#include <string.h>

#include "../common/attn_softmax.h"
#include "../common/ei_kernels.h"

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
    for (int i = 0; i < n; i++) y[i] = (float)(g[i] / (1.0 + exp(-(double)g[i]))) * u[i];
}

static void ref_add(int n, float *y, const float *x) {
    for (int i = 0; i < n; i++) y[i] += x[i];
}

static void ref_scale(int n, float *y, float s) {
    for (int i = 0; i < n; i++) y[i] *= s;
}

/* element i of a cache row of the given type */
static inline float kv_at(const void *row, int type, int i) {
    return type == EI_TYPE_F32 ? ((const float *)row)[i] : ei_fp16_to_fp32(((const ei_f16 *)row)[i]);
}

static void ref_attn(const ei_attn_params *p, const float *q, const void *k, const void *v,
                     float *out, double *scratch) {
    const int n = p->t1 - p->t0, hd = p->head_dim;
    float qr[EI_MAX_HEAD_DIM]; /* the query as the key type sees it */
    for (int d = 0; d < hd; d++) qr[d] = ei_attn_round_to(q[d], p->k_type);
    float *scores = (float *)(scratch + n); /* (n) float scores after the (n) double weights */
    for (int t = 0; t < n; t++) {
        const uint8_t *row = (const uint8_t *)k + (size_t)(p->t0 + t) * p->k_row_bytes;
        double dot = 0.0;
        for (int d = 0; d < hd; d++) dot += (double)qr[d] * kv_at(row, p->k_type, d);
        scores[t] = ei_attn_score((float)dot, p);
    }
    const double sum = ei_attn_softmax(scores, n, scratch);
    double acc[EI_MAX_HEAD_DIM];
    for (int d = 0; d < p->head_dim_v; d++) acc[d] = 0.0;
    for (int t = 0; t < n; t++) {
        const float pr = ei_attn_prob(scratch[t], sum, p->v_type);
        const uint8_t *row = (const uint8_t *)v + (size_t)(p->t0 + t) * p->v_row_bytes;
        for (int d = 0; d < p->head_dim_v; d++) acc[d] += (double)pr * kv_at(row, p->v_type, d);
    }
    for (int d = 0; d < p->head_dim_v; d++) out[d] = (float)acc[d];
}

void ei_ref_quant_kernels(ei_kernels *k);

void ei_kernels_init_ref(ei_kernels *k) {
    memset(k, 0, sizeof(*k));
    k->name = "scalar";
    ei_ref_quant_kernels(k);
    k->rms_norm = ref_rms_norm;
    k->rope = ref_rope;
    k->geglu = ref_geglu;
    k->swiglu = ref_swiglu;
    k->add = ref_add;
    k->scale = ref_scale;
    k->attn = ref_attn;
    k->attn_types = EI_ATTN_F16_F32;
}
