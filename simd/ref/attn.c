/* Scalar reference of attention: one query head against the cache of one KV head, rounded
 * as ei_attn_params describes (common/ei_kernels.h). Dot products and the weighted sum of the
 * values are computed in double and rounded once; the softmax is common/attn_softmax.h's. The
 * numpy reference engine computes the same values. */

#include "../common/attn_softmax.h"
#include "../common/ei_kernels.h"

/* element i of a cache row of the given type */
static inline float kv_at(const void *row, int type, int i) {
    if (type == EI_TYPE_F32) return ((const float *)row)[i];
    return ei_fp16_to_fp32(((const ei_f16 *)row)[i]);
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

void ei_ref_attn_kernels(ei_kernels *k) {
    k->attn = ref_attn;
    k->attn_types = EI_ATTN_F16_F32;
}
