/* Attention over a KIVI cache (EI_KV_KIVI): one query head against quantized key groups and
 * value rows, then the f16 residual of the newest positions, read in place. The quantized
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

/* acc[d] += pr[t] * v[t][d] over one run's rows, in order of t (the table's weighted sum) */
static void kivi_accumulate(const ei_attn_params *p, const ei_attn_run *run, int quantized, const double *pr,
                            double *acc) {
    const int hv = p->head_dim_v;
    if (!quantized) {
        p->kt->attn_weighted_sum(pr, run->v, 0, p->v_row_bytes, run->n, hv, acc);
        return;
    }
    float buf[KIVI_CHUNK * EI_MAX_HEAD_DIM];
    for (int t0 = 0; t0 < run->n; t0 += KIVI_CHUNK) {
        const int m = run->n - t0 < KIVI_CHUNK ? run->n - t0 : KIVI_CHUNK;
        p->kt->kivi_decode_v(p->kivi_bits_v, p->kivi_group, hv, (const uint8_t *)run->v + (size_t)t0 * p->kivi_v_row_bytes,
                             p->kivi_v_row_bytes, m, buf);
        p->kt->attn_weighted_sum(pr + t0, (const uint8_t *)buf, 1, (size_t)hv * 4, m, hv, acc);
    }
}

void ei_kivi_attn(const ei_attn_params *p, const float *q, float *out, double *scratch) {
    const int n = ei_attn_keys(p);
    float *scores = (float *)(scratch + n); /* (n) float scores after the (n) double weights */
    kivi_scores(p, q, scores, scratch); /* the weights' place, free until the softmax */
    const double sum = ei_attn_softmax(scores, n, scratch);
    for (int t = 0; t < n; t++) scratch[t] = ei_attn_prob(scratch[t], sum, EI_TYPE_F32);
    ei_attn_track_weights(p, scratch, n);
    double acc[EI_MAX_HEAD_DIM];
    for (int d = 0; d < p->head_dim_v; d++) acc[d] = 0.0;
    int at = 0;
    for (int r = 0; r < p->n_runs; r++) {
        kivi_accumulate(p, &p->runs[r], r < p->n_kivi_runs, scratch + at, acc);
        at += p->runs[r].n;
    }
    for (int d = 0; d < p->head_dim_v; d++) out[d] = (float)acc[d];
}
