/* The scalar middle of attention, shared by every instruction set's attention kernel so that
 * soft-capping, the softmax, the cache-type roundings and the reading of block-quantized
 * caches are written once (ref/attn.c states the rounding every variant follows).
 *
 * A quantized cache is read through the kernel table's own attn_dots_q (a key row is a weight
 * row for vec_dot, the query its q8_0 partner) and attn_weighted_sum_q (value rows decoded in
 * registers, as to_float decodes them, never into a copy of the cache); those kernels are
 * bit-identical across instruction sets, so every attention variant gives the reference's
 * results. */
#ifndef EI_ATTN_SOFTMAX_H
#define EI_ATTN_SOFTMAX_H

#include <math.h>

#include "ei_exp.h"
#include "ei_kernels.h"

/* x as a cache of the given type stores it (the query before its dots with the keys, a
 * weight before its products with the values) */
static inline float ei_attn_round_to(float x, int type) {
    return type == EI_TYPE_F16 ? ei_fp16_to_fp32(ei_fp32_to_fp16(x)) : x;
}

/* a key's score from its dot product (rounded to float): scaled, then optionally soft-capped */
static inline float ei_attn_score(float dot, const ei_attn_params *p) {
    const float s = dot * p->scale;
    return p->softcap != 0.0f ? p->softcap * (float)tanh((double)(s / p->softcap)) : s;
}

/* The softmax's weights, the reference of the kernel table's attn_softmax: w[t] =
 * ei_exp(scores[t] - max) for t < n (the difference in float, as GGML takes it), max passing
 * over NaN scores. Returns their sum in a fixed order that a vector of 8 doubles keeps (and 2
 * of 4, or 4 of 2): 8 partial sums, key t's added to partial t mod 8 in order of t, then
 * ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)). */
static inline double ei_attn_sum8(const double s[8]) {
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

static inline double ei_attn_softmax(const float *scores, int n, double *w) {
    float max = -INFINITY;
    for (int t = 0; t < n; t++) /* as fmaxf (a NaN score is passed over) but inlined: libm's is a call */
        if (scores[t] > max) max = scores[t];
    double s[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    for (int t = 0; t < n; t++) {
        w[t] = ei_exp((double)(scores[t] - max));
        s[t & 7] += w[t];
    }
    return ei_attn_sum8(s);
}

/* the probability of one key as the value type sees it: (float)(w / sum), then rounded */
static inline float ei_attn_prob(double w, double sum, int v_type) {
    return ei_attn_round_to((float)(w / sum), v_type);
}

/* adds key t's probability (as the value type rounds it) to the attention it has received, in
 * fixed point so that the sum is exact whatever order the threads add in (H2O's scores) */
static inline void ei_attn_track(const ei_attn_params *p, int t, double prob) {
    if (p->track) __atomic_fetch_add(&p->track[t], (int64_t)floor(prob * 4294967296.0 + 0.5), __ATOMIC_RELAXED);
}

/* the probabilities w[0..n) of all keys of one query, tracked (a no-op without p->track) */
static inline void ei_attn_track_weights(const ei_attn_params *p, const double *w, int n) {
    if (p->track)
        for (int t = 0; t < n; t++) ei_attn_track(p, t, w[t]);
}

/* the number of keys of all runs */
static inline int ei_attn_keys(const ei_attn_params *p) {
    int n = 0;
    for (int r = 0; r < p->n_runs; r++) n += p->runs[r].n;
    return n;
}

/* sub: p seeing only keys [first, end) of its runs taken together (runs: room for p->n_runs) */
static inline void ei_attn_slice(const ei_attn_params *p, int first, int end, ei_attn_run *runs, ei_attn_params *sub) {
    *sub = *p;
    sub->runs = runs;
    sub->n_runs = 0;
    if (p->track) sub->track = p->track + first;
    for (int r = 0, at = 0; r < p->n_runs && at < end; at += p->runs[r++].n) {
        const ei_attn_run *run = &p->runs[r];
        const int a = first > at ? first - at : 0, b = end - at < run->n ? end - at : run->n;
        if (b <= a) continue;
        ei_attn_run *out = &runs[sub->n_runs++];
        *out = *run;
        out->k = (const uint8_t *)run->k + (size_t)a * p->k_row_bytes;
        out->v = (const uint8_t *)run->v + (size_t)a * p->v_row_bytes;
        out->n = b - a;
        out->t0 = run->t0 + a;
    }
}

/* attn_block's scores, the same walk on every ISA: the keys every query of the block sees,
 * EI_ATTN_BLOCK_KEYS at a time, through the ISA's tile(p, k, m, dots), which gives dots[j][i]
 * of query i with key j (m keys from k; rows past m any value); query i's scores of its keys
 * [first[i], end[i]) go to sc + off[i] */
#define EI_ATTN_BLOCK_KEYS 8
typedef void (*ei_block_tile_fn)(const ei_attn_params *p, const uint8_t *k, int m,
                                 double dots[EI_ATTN_BLOCK_KEYS][EI_ATTN_BLOCK_QUERIES]);
static inline void ei_attn_block_scores(const ei_attn_params *p, int nq, const int32_t *first, const int32_t *end,
                                        const int *off, float *sc, ei_block_tile_fn tile) {
    int lo = first[0], hi = end[0];
    for (int i = 1; i < nq; i++) {
        if (first[i] < lo) lo = first[i];
        if (end[i] > hi) hi = end[i];
    }
    for (int r = 0, at = 0; r < p->n_runs && at < hi; at += p->runs[r++].n) {
        const int a = lo > at ? lo - at : 0, b = hi - at < p->runs[r].n ? hi - at : p->runs[r].n;
        for (int t = a; t < b; t += EI_ATTN_BLOCK_KEYS) {
            const int m = b - t < EI_ATTN_BLOCK_KEYS ? b - t : EI_ATTN_BLOCK_KEYS, g = at + t; /* keys g .. g + m */
            double dots[EI_ATTN_BLOCK_KEYS][EI_ATTN_BLOCK_QUERIES];
            tile(p, (const uint8_t *)p->runs[r].k + (size_t)t * p->k_row_bytes, m, dots);
            for (int i = 0; i < nq; i++) { /* keys [ja, jb) of the tile are query i's */
                const int ja = first[i] > g ? first[i] - g : 0, jb = end[i] - g < m ? end[i] - g : m;
                float *o = sc + off[i] + g - first[i];
                if (p->softcap == 0.0f)
                    for (int j = ja; j < jb; j++) o[j] = (float)dots[j][i] * p->scale; /* ei_attn_score uncapped */
                else
                    for (int j = ja; j < jb; j++) o[j] = ei_attn_score((float)dots[j][i], p);
            }
        }
    }
}

/* attn_block's frame, the same on every ISA: each query's weights from its scores (scores
 * and weights of query i at off[i], its keys [first[i], end[i])) through the ISA's softmax and
 * rounding, then the values of the queries that see the same keys (a token's heads),
 * up to 4 together, through the ISA's values(sub, nb, w, n, out) */
typedef double (*ei_softmax_fn)(const float *scores, int n, double *w);
typedef void (*ei_round_weights_fn)(double *w, int n, double sum, int v_type);
typedef void (*ei_block_values_fn)(const ei_attn_params *sub, int nb, const double *w, int n, float *const *out);
static inline void ei_attn_block_finish(const ei_attn_params *p, int nq, const int32_t *first, const int32_t *end,
                                        const int *off, double *w, float *sc, float *const *out, ei_attn_run *room,
                                        ei_softmax_fn softmax, ei_round_weights_fn round_weights,
                                        ei_block_values_fn values) {
    for (int i = 0; i < nq; i++) {
        const int n = end[i] - first[i];
        round_weights(w + off[i], n, softmax(sc + off[i], n, w + off[i]), EI_TYPE_F16);
    }
    ei_attn_params sub;
    for (int i0 = 0; i0 < nq;) {
        int nb = 1;
        while (i0 + nb < nq && nb < 4 && first[i0 + nb] == first[i0] && end[i0 + nb] == end[i0]) nb++;
        const int n = end[i0] - first[i0];
        ei_attn_slice(p, first[i0], end[i0], room, &sub);
        for (int i = 0; i < nb; i++) ei_attn_track_weights(&sub, w + off[i0 + i], n);
        values(&sub, nb, w + off[i0], n, out + i0);
        i0 += nb;
    }
}

/* attn_block after the ISA has laid out its queries for tile: scores, weights and values of
 * the block, scratch holding each query's weights and then its scores (1.5 * sum(end - first)
 * doubles) */
static inline void ei_attn_block_run(const ei_attn_params *p, int nq, const int32_t *first, const int32_t *end,
                                     float *const *out, ei_attn_run *room, double *scratch, ei_block_tile_fn tile,
                                     ei_softmax_fn softmax, ei_round_weights_fn round_weights,
                                     ei_block_values_fn values) {
    int off[EI_ATTN_BLOCK_QUERIES + 1] = {0}; /* where query i's scores and weights start */
    for (int i = 0; i < nq; i++) off[i + 1] = off[i] + end[i] - first[i];
    float *sc = (float *)(scratch + off[nq]);
    ei_attn_block_scores(p, nq, first, end, off, sc, tile);
    ei_attn_block_finish(p, nq, first, end, off, scratch, sc, out, room, softmax, round_weights, values);
}

/* attn_block query by query through the ISA's attn, where its block kernel does not apply */
static inline void ei_attn_block_by_query(const ei_attn_params *p, int nq, const float *const *q, const int32_t *first,
                                          const int32_t *end, float *const *out, ei_attn_run *room, double *scratch,
                                          void (*attn)(const ei_attn_params *, const float *, float *, double *)) {
    ei_attn_params sub;
    for (int i = 0; i < nq; i++) {
        ei_attn_slice(p, first[i], end[i], room, &sub);
        attn(&sub, q[i], out[i], scratch);
    }
}

static inline int ei_attn_quantized(int type) { return type == EI_TYPE_Q8_0 || type == EI_TYPE_Q4_0; }

/* bytes of the query as q8_0 blocks, the partner of both quantized key types */
#define EI_ATTN_QUERY_BYTES (EI_MAX_HEAD_DIM / 32 * 34)

/* scores[t] for the keys of every run of a quantized key cache: the query quantized to the
 * key type's partner, each key's dot as the table's vec_dot computes it (attn_dots_q). A run
 * whose keys were rotated ahead of their positions (cs) meets the query rotated as far ahead
 * (the table's rope); keys stored Walsh-Hadamard rotated meet the query rotated so too, after
 * the rope and before it is quantized. Runs of one rotation share one quantized query. */
static inline void ei_attn_quant_scores(const ei_attn_params *p, const float *q, float *scores) {
    uint8_t qq[EI_ATTN_QUERY_BYTES];
    float qr[EI_MAX_HEAD_DIM]; /* (head_dim) the query as the keys meet it */
    const ei_from_float_fn quantize = p->kt->from_float[ei_partner_type(p->k_type)];
    const float *cs = NULL; /* the rotation qq has */
    for (int r = 0; r < p->n_runs; r++) {
        const int n = p->runs[r].n;
        if (r == 0 || p->runs[r].cs != cs) {
            cs = p->runs[r].cs;
            memcpy(qr, q, sizeof(float) * (size_t)p->head_dim);
            if (cs) p->kt->rope(p->n_rot, qr, cs, p->rope_neox);
            if (p->hadamard_k) p->kt->hadamard(qr, p->head_dim, p->hadamard_k);
            quantize(qr, qq, p->head_dim);
        }
        p->kt->attn_dots_q(p->k_type, qq, (const uint8_t *)p->runs[r].k, p->k_row_bytes, p->head_dim, n, scores);
        for (int t = 0; t < n; t++) scores[t] = ei_attn_score(scores[t], p);
        scores += n;
    }
}

#endif
