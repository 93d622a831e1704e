/* The scalar middle of attention, shared by every instruction set's attention kernel so that
 * soft-capping, the softmax and the cache-type roundings are written once (ref/attn.c states
 * the rounding every variant follows). */
#ifndef EI_ATTN_SOFTMAX_H
#define EI_ATTN_SOFTMAX_H

#include <math.h>

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

/* w[t] = exp(scores[t] - max) in double for t < n, in order; returns their sum in order */
static inline double ei_attn_softmax(const float *scores, int n, double *w) {
    float max = -INFINITY;
    for (int t = 0; t < n; t++) max = fmaxf(max, scores[t]);
    double sum = 0.0;
    for (int t = 0; t < n; t++) {
        w[t] = exp((double)(scores[t] - max));
        sum += w[t];
    }
    return sum;
}

/* the probability of one key as the value type sees it: (float)(w / sum), then rounded */
static inline float ei_attn_prob(double w, double sum, int v_type) {
    return ei_attn_round_to((float)(w / sum), v_type);
}

#endif
