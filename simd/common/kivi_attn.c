/* Attention over a KIVI cache (EI_KV_KIVI): the query heads of one KV head against quantized
 * key groups and value rows, then the f16 residual of the newest positions, read in place. The quantized
 * parts go through the kernel table's KIVI kernels (each instruction set's kivi.c, which are
 * bit-identical), so this middle is written once for all of them, as attn_softmax.h is for
 * the row caches. The numpy reference engine computes the same values:
 *
 * scores: a quantized key's dot is kivi_k_dots' (common/kivi.h), a residual key's
 * sum_d (double)q[d] * k[d] rounded once to float (the query is not rounded: KIVI's queries
 * meet both parts in full precision); each times scale, optionally soft-capped. Softmax as
 * attn_softmax.h, probabilities (float)(w / sum), not rounded further. out = sum_t p[t] v[t]
 * in double, in order of t, a quantized value row entering decoded (kivi_decode_v), rounded
 * once to float. */
#include "attn_softmax.h"
#include "kivi.h"

#define KIVI_CHUNK 16 /* value rows decoded at a time: 16 KiB of floats at most, in L1 */

/* the scores of every run's keys; dots (n doubles) is scratch for the residual's */
static void kivi_scores(const ei_attn_params *p, const float *q, float *scores, double *dots) {
    const int hd = p->head_dim;
    double qd[EI_MAX_HEAD_DIM];
    for (int d = 0; d < hd; d++) qd[d] = q[d];
    int at = 0;
    for (int r = 0; r < p->n_runs; r++) {
        const ei_attn_run *run = &p->runs[r];
        if (r < p->n_kivi_runs) {
            p->kt->kivi_k_dots(p->kivi_bits_k, p->kivi_group, hd, run->k, run->t0, run->n, q, scores + at);
            for (int t = 0; t < run->n; t++) scores[at + t] = ei_attn_score(scores[at + t], p);
            at += run->n;
            continue;
        }
        p->kt->attn_dots_f16(qd, (const uint8_t *)run->k, p->k_row_bytes, hd, run->n, dots + at);
        for (int t = 0; t < run->n; t++, at++) scores[at] = ei_attn_score((float)dots[at], p);
    }
}

/* acc[j][d] += pr_j[t] * v[t][d] over one run's rows for each of nq queries, in order of t
 * (the table's weighted sum), pr_j = pr + j * stride; a quantized row is decoded once for all */
static void kivi_accumulate(const ei_attn_params *p, const ei_attn_run *run, int quantized, int nq,
                            const double *pr, size_t stride, double (*acc)[EI_MAX_HEAD_DIM]) {
    const int hv = p->head_dim_v;
    if (!quantized) {
        for (int j = 0; j < nq; j++)
            p->kt->attn_weighted_sum(pr + j * stride, run->v, 0, p->v_row_bytes, run->n, hv, acc[j]);
        return;
    }
    float buf[KIVI_CHUNK * EI_MAX_HEAD_DIM];
    for (int t0 = 0; t0 < run->n; t0 += KIVI_CHUNK) {
        const int m = run->n - t0 < KIVI_CHUNK ? run->n - t0 : KIVI_CHUNK;
        p->kt->kivi_decode_v(p->kivi_bits_v, p->kivi_group, hv, (const uint8_t *)run->v + (size_t)t0 * p->kivi_v_row_bytes,
                             p->kivi_v_row_bytes, m, buf);
        for (int j = 0; j < nq; j++)
            p->kt->attn_weighted_sum(pr + j * stride + t0, (const uint8_t *)buf, 1, (size_t)hv * 4, m, hv, acc[j]);
    }
}

/* up to KIVI_QUERIES queries at a time: their sums (KIVI_QUERIES x EI_MAX_HEAD_DIM doubles)
 * live on the stack */
#define KIVI_QUERIES 8

void ei_kivi_attn_group(const ei_attn_params *p, int nq, const float *q, size_t qs, float *out, size_t os,
                        double *scratch) {
    const int n = ei_attn_keys(p);
    const size_t stride = 2 * (size_t)n; /* per query: (n) double weights, then (n) float scores */
    for (int j0 = 0; j0 < nq; j0 += KIVI_QUERIES) {
        const int nj = nq - j0 < KIVI_QUERIES ? nq - j0 : KIVI_QUERIES;
        for (int j = 0; j < nj; j++) {
            double *w = scratch + j * stride;
            float *scores = (float *)(w + n);
            kivi_scores(p, q + (size_t)(j0 + j) * qs, scores, w); /* w: free until the softmax */
            const double sum = p->kt->attn_softmax(scores, n, w);
            for (int t = 0; t < n; t++) w[t] = ei_attn_prob(w[t], sum, EI_TYPE_F32);
            ei_attn_track_weights(p, w, n);
        }
        double acc[KIVI_QUERIES][EI_MAX_HEAD_DIM];
        for (int j = 0; j < nj; j++)
            for (int d = 0; d < p->head_dim_v; d++) acc[j][d] = 0.0;
        int at = 0;
        for (int r = 0; r < p->n_runs; r++) {
            kivi_accumulate(p, &p->runs[r], r < p->n_kivi_runs, nj, scratch + at, stride, acc);
            at += p->runs[r].n;
        }
        for (int j = 0; j < nj; j++)
            for (int d = 0; d < p->head_dim_v; d++) out[(size_t)(j0 + j) * os + d] = (float)acc[j][d];
    }
}
