/* Scalar reference of attention: one query head against the cache of one KV head, rounded
 * as ei_attn_params describes (common/ei_kernels.h). Dot products and the weighted sum of the
 * values are computed in double and rounded once; the softmax is common/attn_softmax.h's. The
 * numpy reference engine computes the same values. */

#include "../common/attn_softmax.h"
#include "../common/ei_kernels.h"

/* element i of a cache row of an unquantized type */
static inline float kv_at(const void *row, int type, int i) {
    if (type == EI_TYPE_F32) return ((const float *)row)[i];
    return ei_fp16_to_fp32(((const ei_f16 *)row)[i]);
}

static void ref_scores(const ei_attn_params *p, const float *q, float *scores) {
    if (ei_attn_quantized(p->k_type)) {
        ei_attn_quant_scores(p, q, scores);
        return;
    }
    const int hd = p->head_dim;
    float qr[EI_MAX_HEAD_DIM]; /* the query as the key type sees it */
    for (int d = 0; d < hd; d++) qr[d] = ei_attn_round_to(q[d], p->k_type);
    int at = 0;
    for (int r = 0; r < p->n_runs; r++)
        for (int t = 0; t < p->runs[r].n; t++) {
            const uint8_t *row = (const uint8_t *)p->runs[r].k + (size_t)t * p->k_row_bytes;
            double dot = 0.0;
            for (int d = 0; d < hd; d++) dot += (double)qr[d] * kv_at(row, p->k_type, d);
            scores[at++] = ei_attn_score((float)dot, p);
        }
}

/* value d of a q8_0 or q4_0 row, as to_float decodes it: the block's scale times its integer */
static inline float quant_at(const uint8_t *row, int type, int d) {
    if (type == EI_TYPE_Q8_0) {
        const block_q8_0 *b = (const block_q8_0 *)row + d / 32;
        return ei_fp16_to_fp32(b->d) * b->qs[d % 32];
    }
    const block_q4_0 *b = (const block_q4_0 *)row + d / 32;
    const int j = d % 32, q = j < 16 ? b->qs[j] & 15 : b->qs[j - 16] >> 4;
    return ei_fp16_to_fp32(b->d) * (q - 8);
}

static void ref_weighted_sum_q(int v_type, const double *p, const uint8_t *v, size_t row_bytes, int n, int hv,
                               double *acc) {
    for (int t = 0; t < n; t++)
        for (int d = 0; d < hv; d++) acc[d] += p[t] * quant_at(v + (size_t)t * row_bytes, v_type, d);
}

/* acc[d] += pr[t] * v[t][d] over the rows of one run, in order of t */
static void ref_accumulate(const ei_attn_params *p, const ei_attn_run *run, const double *pr, double *acc) {
    const int hv = p->head_dim_v;
    if (ei_attn_quantized(p->v_type)) {
        ref_weighted_sum_q(p->v_type, pr, run->v, p->v_row_bytes, run->n, hv, acc);
        return;
    }
    for (int t = 0; t < run->n; t++) {
        const uint8_t *row = (const uint8_t *)run->v + (size_t)t * p->v_row_bytes;
        for (int d = 0; d < hv; d++) acc[d] += pr[t] * kv_at(row, p->v_type, d);
    }
}

static void ref_attn(const ei_attn_params *p, const float *q, float *out, double *scratch) {
    const int n = ei_attn_keys(p);
    float *scores = (float *)(scratch + n); /* (n) float scores after the (n) double weights */
    ref_scores(p, q, scores);
    const double sum = ei_attn_softmax(scores, n, scratch);
    for (int t = 0; t < n; t++) scratch[t] = ei_attn_prob(scratch[t], sum, p->v_type);
    ei_attn_track_weights(p, scratch, n);
    double acc[EI_MAX_HEAD_DIM];
    for (int d = 0; d < p->head_dim_v; d++) acc[d] = 0.0;
    int at = 0;
    for (int r = 0; r < p->n_runs; r++) {
        ref_accumulate(p, &p->runs[r], scratch + at, acc);
        at += p->runs[r].n;
    }
    for (int d = 0; d < p->head_dim_v; d++) out[d] = (float)acc[d];
}

static void ref_weighted_sum(const double *p, const uint8_t *v, int f32, size_t row_bytes, int n, int hv,
                             double *acc) {
    for (int t = 0; t < n; t++) {
        const uint8_t *row = v + (size_t)t * row_bytes;
        for (int d = 0; d < hv; d++) acc[d] += p[t] * kv_at(row, f32 ? EI_TYPE_F32 : EI_TYPE_F16, d);
    }
}

static void ref_dots_f16(const double *qd, const uint8_t *k, size_t row_bytes, int hd, int m, double *out) {
    for (int t = 0; t < m; t++) {
        const ei_f16 *row = (const ei_f16 *)(k + (size_t)t * row_bytes);
        double dot = 0.0;
        for (int d = 0; d < hd; d++) dot += qd[d] * ei_fp16_to_fp32(row[d]);
        out[t] = dot;
    }
}

void ei_ref_attn_block(const ei_attn_params *p, int nq, const float *const *q, const int32_t *first,
                       const int32_t *end, float *const *out, ei_attn_run *room, double *scratch) {
    for (int i = 0; i < nq; i++) {
        ei_attn_params sub;
        ei_attn_slice(p, first[i], end[i], room, &sub);
        ref_attn(&sub, q[i], out[i], scratch);
    }
}

void ei_ref_attn_kernels(ei_kernels *k) {
    k->attn = ref_attn;
    k->attn_softmax = ei_attn_softmax;
    k->attn_weighted_sum = ref_weighted_sum;
    k->attn_dots_f16 = ref_dots_f16;
    k->attn_weighted_sum_q = ref_weighted_sum_q;
    k->attn_types = EI_ATTN_ALL;
}
