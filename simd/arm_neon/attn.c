/* NEON attention of one query head over its KV cache, rounding as the reference does.
 *
 * Scores: the reference sums each key's dot over d in order, so the lanes here are keys
 * (4 or 8 side by side), each still summed over d in order. Every product is exact (two
 * halves in float; floats in double, where a fused multiply-add rounds as mul then add).
 * Output: the lanes are dimensions, each summed over keys in order. tanh is libm's, in
 * double, one key at a time; the softmax's exp is common/ei_exp.h's, two keys a vector. */
#include "../common/attn_softmax.h"
#include "blocks.h"
#include "simd.h"

/* elements d..d+3 of a cache row as floats */
EI_INLINE float32x4_t kv4(const uint8_t *row, int d, int f32) {
    if (f32) return vld1q_f32((const float *)(const void *)row + d);
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(const void *)row + d)));
}

EI_INLINE float kv1(const uint8_t *row, int d, int f32) {
    return f32 ? ((const float *)(const void *)row)[d] : h2f(((const ei_f16 *)(const void *)row)[d]);
}

/* acc += the exact products of four keys' values v (lanes) with the query value q */
EI_INLINE void acc_keys(float64x2_t acc[2], float32x4_t v, float q, int f32) {
    if (f32) {
        acc[0] = vfmaq_n_f64(acc[0], vcvt_f64_f32(vget_low_f32(v)), q);
        acc[1] = vfmaq_n_f64(acc[1], vcvt_high_f64_f32(v), q);
    } else {
        const float32x4_t p = vmulq_n_f32(v, q);
        acc[0] = vaddq_f64(acc[0], vcvt_f64_f32(vget_low_f32(p)));
        acc[1] = vaddq_f64(acc[1], vcvt_high_f64_f32(p));
    }
}

/* dimensions d..d+3 of four keys (rows kr) against the query */
EI_INLINE void keys_step(float64x2_t acc[2], const uint8_t *kr[4], int d, const float *q, int f32) {
    const float32x4_t r0 = kv4(kr[0], d, f32), r1 = kv4(kr[1], d, f32), r2 = kv4(kr[2], d, f32), r3 = kv4(kr[3], d, f32);
    const float64x2_t t0 = vreinterpretq_f64_f32(vtrn1q_f32(r0, r1)), t1 = vreinterpretq_f64_f32(vtrn2q_f32(r0, r1));
    const float64x2_t t2 = vreinterpretq_f64_f32(vtrn1q_f32(r2, r3)), t3 = vreinterpretq_f64_f32(vtrn2q_f32(r2, r3));
    acc_keys(acc, vreinterpretq_f32_f64(vzip1q_f64(t0, t2)), q[d], f32);
    acc_keys(acc, vreinterpretq_f32_f64(vzip1q_f64(t1, t3)), q[d + 1], f32);
    acc_keys(acc, vreinterpretq_f32_f64(vzip2q_f64(t0, t2)), q[d + 2], f32);
    acc_keys(acc, vreinterpretq_f32_f64(vzip2q_f64(t1, t3)), q[d + 3], f32);
}

EI_INLINE void keys_tail(float64x2_t acc[2], const uint8_t *kr[4], int d, const float *q, int f32) {
    const float v[4] = {kv1(kr[0], d, f32), kv1(kr[1], d, f32), kv1(kr[2], d, f32), kv1(kr[3], d, f32)};
    acc_keys(acc, vld1q_f32(v), q[d], f32);
}

EI_INLINE float32x4_t to_f32(const float64x2_t acc[2]) { return vcvt_high_f32_f64(vcvt_f32_f64(acc[0]), acc[1]); }

/* raw dots (rounded to float) of keys kr[0..G*4) with q; G = 1 or 2 groups of four */
EI_INLINE void key_dots(float *out, const uint8_t *kr[8], int G, const float *q, int hd, int f32) {
    float64x2_t a[2][2];
    EI_UNROLL for (int j = 0; j < 4; j++) (&a[0][0])[j] = vdupq_n_f64(0.0);
    int d = 0;
    for (; d + 4 <= hd; d += 4)
        EI_UNROLL for (int g = 0; g < G; g++) keys_step(a[g], kr + 4 * g, d, q, f32);
    for (; d < hd; d++)
        EI_UNROLL for (int g = 0; g < G; g++) keys_tail(a[g], kr + 4 * g, d, q, f32);
    EI_UNROLL for (int g = 0; g < G; g++) vst1q_f32(out + 4 * g, to_f32(a[g]));
}

/* scores[t] = dot(q, key t) * scale, soft-capped, for the n keys of one run */
static void run_scores(const ei_attn_params *p, const float *q, const uint8_t *base, int n, float *scores) {
    const size_t row = p->k_row_bytes;
    const int f32 = p->k_type == EI_TYPE_F32;
    for (int t = 0; t < n; t += 8) {
        const uint8_t *kr[8];
        EI_UNROLL for (int j = 0; j < 8; j++) kr[j] = base + (size_t)(t + j < n ? t + j : n - 1) * row;
        float dots[8];
        if (t + 4 < n) key_dots(dots, kr, 2, q, p->head_dim, f32);
        else key_dots(dots, kr, 1, q, p->head_dim, f32);
        for (int j = 0; j < 8 && t + j < n; j++) scores[t + j] = ei_attn_score(dots[j], p);
    }
}

static void scores_of(const ei_attn_params *p, const float *q, float *scores) {
    if (ei_attn_quantized(p->k_type)) {
        ei_attn_quant_scores(p, q, scores);
        return;
    }
    const int hd = p->head_dim;
    float qr[EI_MAX_HEAD_DIM]; /* the query as the key type sees it */
    int d = 0;
    for (; d + 4 <= hd && p->k_type == EI_TYPE_F16; d += 4)
        vst1q_f32(qr + d, vcvt_f32_f16(vcvt_f16_f32(vld1q_f32(q + d))));
    for (; d < hd; d++) qr[d] = ei_attn_round_to(q[d], p->k_type);
    for (int r = 0; r < p->n_runs; r++) {
        run_scores(p, qr, (const uint8_t *)p->runs[r].k, p->runs[r].n, scores);
        scores += p->runs[r].n;
    }
}

/* acc[d0 .. d0 + 4W) += sum_t pr[t] * v[t][d], t in order; W vectors of four dimensions of n
 * rows row bytes apart, of f32 values or (f32 == 0) fp16 ones */
EI_INLINE void weighted_sum(const float *pr, const uint8_t *r, size_t row, int f32, int n, int d0, int W,
                            double *out) {
    float64x2_t acc[4][2];
    EI_UNROLL for (int w = 0; w < W; w++) {
        acc[w][0] = vld1q_f64(out + d0 + 4 * w);
        acc[w][1] = vld1q_f64(out + d0 + 4 * w + 2);
    }
    for (int t = 0; t < n; t++, r += row)
        EI_UNROLL for (int w = 0; w < W; w++) acc_keys(acc[w], kv4(r, d0 + 4 * w, f32), pr[t], f32);
    EI_UNROLL for (int w = 0; w < W; w++) {
        vst1q_f64(out + d0 + 4 * w, acc[w][0]);
        vst1q_f64(out + d0 + 4 * w + 2, acc[w][1]);
    }
}

static void rows_sum(const float *pr, const uint8_t *v, size_t row, int f32, int n, int hdv, double *acc) {
    int d = 0;
    for (; d + 16 <= hdv; d += 16) weighted_sum(pr, v, row, f32, n, d, 4, acc);
    for (; d + 4 <= hdv; d += 4) weighted_sum(pr, v, row, f32, n, d, 1, acc);
    for (; d < hdv; d++)
        for (int t = 0; t < n; t++) acc[d] += (double)pr[t] * kv1(v + (size_t)t * row, d, f32);
}

/* attn_weighted_sum (KIVI's f16 residual and decoded rows): acc[d] += p[t] * v_t[d] over t in
 * order, four dimensions in two double lanes at a time; the weights have at most float's bits,
 * so each product is exact in double and the fused add rounds as the reference's add */
static void neon_weighted_sum(const double *p, const uint8_t *v, int f32, size_t row_bytes, int n, int hv,
                              double *acc) {
    int d = 0;
    for (; d + 4 <= hv; d += 4) {
        float64x2_t a0 = vld1q_f64(acc + d), a1 = vld1q_f64(acc + d + 2);
        const uint8_t *r = v;
        for (int t = 0; t < n; t++, r += row_bytes) {
            const float32x4_t x = kv4(r, d, f32);
            a0 = vfmaq_n_f64(a0, vcvt_f64_f32(vget_low_f32(x)), p[t]);
            a1 = vfmaq_n_f64(a1, vcvt_high_f64_f32(x), p[t]);
        }
        vst1q_f64(acc + d, a0);
        vst1q_f64(acc + d + 2, a1);
    }
    for (; d < hv; d++)
        for (int t = 0; t < n; t++) acc[d] += p[t] * kv1(v + (size_t)t * row_bytes, d, f32);
}

/* acc[16 c0 + e] += sum over t in order of p[t] * v_t[16 c0 + e], e < 16, for value rows of a
 * q8_0 / q4_0 cache (c0 a half block): the values decoded in registers, exact in float, each
 * product exact in double (a fused add rounds as a separate one) */
static void neon_weighted_sum_q(int v_type, const double *p, const uint8_t *v, size_t row_bytes, int n, int hv,
                                double *acc) {
    const int q4 = v_type == EI_TYPE_Q4_0;
    const size_t bb = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    for (int c = 0; c < hv / 16; c++) {
        float64x2_t a[8];
        EI_UNROLL for (int i = 0; i < 8; i++) a[i] = vld1q_f64(acc + 16 * c + 2 * i);
        const uint8_t *blk = v + (size_t)(c / 2) * bb;
        for (int t = 0; t < n; t++, blk += row_bytes) {
            int8x16_t w[2];
            if (q4) unpack_q4_0(blk, w);
            else unpack_q8_0(blk, w);
            const int16x8_t s[2] = {vmovl_s8(vget_low_s8(w[c % 2])), vmovl_s8(vget_high_s8(w[c % 2]))};
            const float d = h2f_at(blk);
            const float64x2_t pt = vdupq_n_f64(p[t]);
            EI_UNROLL for (int i = 0; i < 4; i++) {
                const int32x4_t q = i % 2 ? vmovl_high_s16(s[i / 2]) : vmovl_s16(vget_low_s16(s[i / 2]));
                const float32x4_t x = vmulq_n_f32(vcvtq_f32_s32(q), d);
                a[2 * i] = vfmaq_f64(a[2 * i], vcvt_f64_f32(vget_low_f32(x)), pt);
                a[2 * i + 1] = vfmaq_f64(a[2 * i + 1], vcvt_high_f64_f32(x), pt);
            }
        }
        EI_UNROLL for (int i = 0; i < 8; i++) vst1q_f64(acc + 16 * c + 2 * i, a[i]);
    }
}

/* acc += the weighted values of one run */
static void accumulate(const ei_attn_params *p, const ei_attn_run *run, const float *pr, double *acc) {
    const int hdv = p->head_dim_v;
    if (!ei_attn_quantized(p->v_type)) {
        rows_sum(pr, run->v, p->v_row_bytes, p->v_type == EI_TYPE_F32, run->n, hdv, acc);
        return;
    }
    double w[64]; /* the weights in double (exact), a chunk at a time */
    for (int t = 0; t < run->n; t += 64) {
        const int m = run->n - t < 64 ? run->n - t : 64;
        for (int j = 0; j < m; j++) w[j] = pr[t + j];
        neon_weighted_sum_q(p->v_type, w, (const uint8_t *)run->v + (size_t)t * p->v_row_bytes, p->v_row_bytes, m,
                            hdv, acc);
    }
}

/* ei_exp (common/ei_exp.h) of 2 doubles: its operations lane by lane, no fused ones */
EI_INLINE float64x2_t exp2_pd(float64x2_t x) {
    const float64x2_t shifter = vdupq_n_f64(EI_EXP_SHIFTER);
    const float64x2_t nd = vaddq_f64(vmulq_f64(x, vdupq_n_f64(EI_EXP_LOG2E)), shifter);
    const float64x2_t n = vsubq_f64(nd, shifter);
    const float64x2_t r = vsubq_f64(vsubq_f64(x, vmulq_f64(n, vdupq_n_f64(EI_EXP_LN2_HI))),
                                    vmulq_f64(n, vdupq_n_f64(EI_EXP_LN2_LO)));
    float64x2_t p = vdupq_n_f64(ei_exp_coef[EI_EXP_DEGREE]);
    EI_UNROLL for (int k = EI_EXP_DEGREE - 1; k >= 0; k--) p = vaddq_f64(vmulq_f64(p, r), vdupq_n_f64(ei_exp_coef[k]));
    const int64x2_t ni = vsubq_s64(vreinterpretq_s64_f64(nd), vreinterpretq_s64_f64(shifter));
    const int64x2_t n1 = vsubq_s64(vshrq_n_s64(vaddq_s64(ni, vdupq_n_s64(2048)), 1), vdupq_n_s64(1024));
    const int64x2_t bias = vdupq_n_s64(1023);
    const float64x2_t s1 = vreinterpretq_f64_s64(vshlq_n_s64(vaddq_s64(n1, bias), 52));
    const float64x2_t s2 = vreinterpretq_f64_s64(vshlq_n_s64(vaddq_s64(vsubq_s64(ni, n1), bias), 52));
    float64x2_t y = vmulq_f64(vmulq_f64(p, s1), s2);
    y = vbslq_f64(vcgeq_f64(x, vdupq_n_f64(EI_EXP_MIN)), y, vdupq_n_f64(0.0)); /* below, or NaN: 0 */
    y = vbslq_f64(vceqq_f64(x, x), y, x);                                     /* NaN: itself */
    return vbslq_f64(vcgtq_f64(x, vdupq_n_f64(EI_EXP_MAX)), vdupq_n_f64((double)INFINITY), y);
}

/* ei_attn_softmax: the max of 4 lanes (a compare and select passes over NaN, as FMAX would
 * not), the 8 partial sums in four vectors of two */
static double neon_softmax(const float *sc, int n, double *w) {
    float32x4_t m = vdupq_n_f32(-INFINITY);
    int t = 0;
    for (; t + 4 <= n; t += 4) {
        const float32x4_t x = vld1q_f32(sc + t);
        m = vbslq_f32(vcgtq_f32(x, m), x, m);
    }
    float max = vmaxvq_f32(m);
    for (; t < n; t++)
        if (sc[t] > max) max = sc[t];
    const float32x4_t mx = vdupq_n_f32(max);
    float64x2_t s[4] = {vdupq_n_f64(0.0), vdupq_n_f64(0.0), vdupq_n_f64(0.0), vdupq_n_f64(0.0)};
    for (t = 0; t < n; t += 8) {
        float tail[8] = {0};
        const int m8 = n - t < 8 ? n - t : 8;
        const float *x = m8 < 8 ? memcpy(tail, sc + t, sizeof(float) * (size_t)m8) : sc + t;
        double e[8];
        EI_UNROLL for (int h = 0; h < 2; h++) {
            const float32x4_t d = vsubq_f32(vld1q_f32(x + 4 * h), mx);
            vst1q_f64(e + 4 * h, exp2_pd(vcvt_f64_f32(vget_low_f32(d))));
            vst1q_f64(e + 4 * h + 2, exp2_pd(vcvt_high_f64_f32(d)));
        }
        for (int j = m8; j < 8; j++) e[j] = 0.0; /* lanes past n add 0.0: the partials unchanged */
        EI_UNROLL for (int v = 0; v < 4; v++) s[v] = vaddq_f64(s[v], vld1q_f64(e + 2 * v));
        memcpy(w + t, e, sizeof(double) * (size_t)m8);
    }
    /* (s0 + s4, s1 + s5) + (s2 + s6, s3 + s7), then its two lanes */
    const float64x2_t h = vaddq_f64(vaddq_f64(s[0], s[2]), vaddq_f64(s[1], s[3]));
    return vgetq_lane_f64(h, 0) + vgetq_lane_f64(h, 1);
}

static void neon_attn(const ei_attn_params *p, const float *q, float *out, double *scratch) {
    const int n = ei_attn_keys(p), hdv = p->head_dim_v;
    float *scores = (float *)(scratch + n); /* (n) floats after the (n) double weights */
    scores_of(p, q, scores);
    const double sum = neon_softmax(scores, n, scratch);
    float *pr = scores; /* the probabilities replace the scores */
    for (int t = 0; t < n; t++) pr[t] = ei_attn_prob(scratch[t], sum, p->v_type);
    if (p->track)
        for (int t = 0; t < n; t++) ei_attn_track(p, t, pr[t]);
    double acc[EI_MAX_HEAD_DIM];
    for (int d = 0; d < hdv; d++) acc[d] = 0.0;
    for (int r = 0, at = 0; r < p->n_runs; at += p->runs[r++].n) accumulate(p, &p->runs[r], pr + at, acc);
    int d = 0;
    for (; d + 4 <= hdv; d += 4) vst1q_f32(out + d, vcvt_high_f32_f64(vcvt_f32_f64(vld1q_f64(acc + d)), vld1q_f64(acc + d + 2)));
    for (; d < hdv; d++) out[d] = (float)acc[d];
}

/* dimensions d..d+3 of four fp16 keys (rows kr) against a query of floats held as doubles:
 * each product exact in double (KIVI's residual, whose queries are not rounded) */
EI_INLINE void keys_step_pd(float64x2_t acc[2], const uint8_t *kr[4], int d, const double *qd) {
    const float32x4_t r0 = kv4(kr[0], d, 0), r1 = kv4(kr[1], d, 0), r2 = kv4(kr[2], d, 0), r3 = kv4(kr[3], d, 0);
    const float64x2_t t0 = vreinterpretq_f64_f32(vtrn1q_f32(r0, r1)), t1 = vreinterpretq_f64_f32(vtrn2q_f32(r0, r1));
    const float64x2_t t2 = vreinterpretq_f64_f32(vtrn1q_f32(r2, r3)), t3 = vreinterpretq_f64_f32(vtrn2q_f32(r2, r3));
    const float32x4_t c[4] = {vreinterpretq_f32_f64(vzip1q_f64(t0, t2)), vreinterpretq_f32_f64(vzip1q_f64(t1, t3)),
                              vreinterpretq_f32_f64(vzip2q_f64(t0, t2)), vreinterpretq_f32_f64(vzip2q_f64(t1, t3))};
    EI_UNROLL for (int e = 0; e < 4; e++) {
        acc[0] = vfmaq_n_f64(acc[0], vcvt_f64_f32(vget_low_f32(c[e])), qd[d + e]);
        acc[1] = vfmaq_n_f64(acc[1], vcvt_high_f64_f32(c[e]), qd[d + e]);
    }
}

/* out[j] for 8 keys (j >= m repeats key 0, not stored): two groups of four, each key's sum in
 * order of d */
static void dots8_f16_pd(const double *qd, const uint8_t *k, size_t row_bytes, int hd, int m, double *out) {
    const uint8_t *kr[8];
    for (int j = 0; j < 8; j++) kr[j] = k + (size_t)(j < m ? j : 0) * row_bytes;
    float64x2_t a[2][2];
    EI_UNROLL for (int j = 0; j < 4; j++) (&a[0][0])[j] = vdupq_n_f64(0.0);
    int d = 0;
    for (; d + 4 <= hd; d += 4)
        EI_UNROLL for (int g = 0; g < 2; g++) keys_step_pd(a[g], kr + 4 * g, d, qd);
    double sums[8];
    EI_UNROLL for (int g = 0; g < 2; g++) {
        vst1q_f64(sums + 4 * g, a[g][0]);
        vst1q_f64(sums + 4 * g + 2, a[g][1]);
    }
    for (int j = 0; j < m; j++) {
        double sum = sums[j];
        for (int dd = d; dd < hd; dd++) sum += qd[dd] * kv1(kr[j], dd, 0);
        out[j] = sum;
    }
}

static void neon_dots_f16(const double *qd, const uint8_t *k, size_t row_bytes, int hd, int m, double *out) {
    for (int t = 0; t < m; t += 8)
        dots8_f16_pd(qd, k + (size_t)t * row_bytes, row_bytes, hd, m - t < 8 ? m - t : 8, out + t);
}

/* ---- a block of queries of several tokens (fp16 caches) --------------------------------------
 * Scores: one double lane per query (the block's 8 in four vectors, their dims transposed once
 * as fp16 rounds them), each key's dims converted to double once and broadcast to every query;
 * each lane adds its exact products in order of d, as neon_attn does (a fused add rounds as a
 * separate one). The frame, softmax to values, is common/attn_softmax.h's; the values go query
 * by query (neon_weighted_sum). */

#define BLOCK_KEYS EI_ATTN_BLOCK_KEYS
static_assert(EI_ATTN_BLOCK_QUERIES == 8, "a block's queries fill four vectors of doubles");

static EI_THREAD_LOCAL double block_qt[EI_MAX_HEAD_DIM * 8]; /* (hd, 8): the queries as fp16 rounds them */

/* dots[j0 + j][i] = sum over d in order of qt[d][i] * kd[j][d], for 4 keys of kd ((4, hd)) */
EI_INLINE void block_dots4(const double *qt, const double *kd, int hd, int j0, double dots[BLOCK_KEYS][8]) {
    float64x2_t acc[4][4];
    EI_UNROLL for (int j = 0; j < 4; j++) EI_UNROLL for (int v = 0; v < 4; v++) acc[j][v] = vdupq_n_f64(0.0);
    for (int d = 0; d < hd; d++) {
        float64x2_t qv[4];
        EI_UNROLL for (int v = 0; v < 4; v++) qv[v] = vld1q_f64(qt + (size_t)d * 8 + 2 * v);
        EI_UNROLL for (int j = 0; j < 4; j++) {
            const double k = kd[(size_t)j * hd + d];
            EI_UNROLL for (int v = 0; v < 4; v++) acc[j][v] = vfmaq_n_f64(acc[j][v], qv[v], k);
        }
    }
    EI_UNROLL for (int j = 0; j < 4; j++) EI_UNROLL for (int v = 0; v < 4; v++) vst1q_f64(dots[j0 + j] + 2 * v, acc[j][v]);
}

/* dots[j][i] of the block's queries with m keys from k (keys past m: zero) */
static void block_tile(const ei_attn_params *p, const uint8_t *k, int m, double dots[BLOCK_KEYS][EI_ATTN_BLOCK_QUERIES]) {
    static EI_THREAD_LOCAL double kd[BLOCK_KEYS * EI_MAX_HEAD_DIM];
    const int hd = p->head_dim;
    for (int j = 0; j < BLOCK_KEYS; j++) {
        double *out = kd + (size_t)j * hd;
        const uint8_t *row = k + (size_t)j * p->k_row_bytes;
        int d = 0;
        if (j < m)
            for (; d + 4 <= hd; d += 4) {
                const float32x4_t x = kv4(row, d, 0);
                vst1q_f64(out + d, vcvt_f64_f32(vget_low_f32(x)));
                vst1q_f64(out + d + 2, vcvt_high_f64_f32(x));
            }
        for (; d < hd; d++) out[d] = j < m ? kv1(row, d, 0) : 0.0;
    }
    block_dots4(block_qt, kd, hd, 0, dots);
    block_dots4(block_qt, kd + 4 * (size_t)hd, hd, 4, dots);
}

static void block_round_weights(double *w, int n, double sum, int v_type) {
    for (int t = 0; t < n; t++) w[t] = ei_attn_prob(w[t], sum, v_type);
}

/* out[i] = the weighted values (fp16 rows) for nb queries whose weights are n apart */
static void block_values(const ei_attn_params *sub, int nb, const double *w, int n, float *const *out) {
    const int hv = sub->head_dim_v;
    for (int i = 0; i < nb; i++) {
        double acc[EI_MAX_HEAD_DIM];
        for (int d = 0; d < hv; d++) acc[d] = 0.0;
        for (int r = 0, at = 0; r < sub->n_runs; at += sub->runs[r++].n)
            neon_weighted_sum(w + (size_t)i * n + at, sub->runs[r].v, 0, sub->v_row_bytes, sub->runs[r].n, hv, acc);
        int d = 0;
        for (; d + 4 <= hv; d += 4)
            vst1q_f32(out[i] + d, vcvt_high_f32_f64(vcvt_f32_f64(vld1q_f64(acc + d)), vld1q_f64(acc + d + 2)));
        for (; d < hv; d++) out[i][d] = (float)acc[d];
    }
}

static void neon_attn_block(const ei_attn_params *p, int nq, const float *const *q, const int32_t *first,
                            const int32_t *end, float *const *out, ei_attn_run *room, double *scratch) {
    if (p->k_type != EI_TYPE_F16 || p->v_type != EI_TYPE_F16 || nq > EI_ATTN_BLOCK_QUERIES) {
        ei_attn_block_by_query(p, nq, q, first, end, out, room, scratch, neon_attn);
        return;
    }
    const int hd = p->head_dim;
    for (int l = 0; l < 8; l++) { /* past nq: query 0 */
        const float *ql = q[l < nq ? l : 0];
        int d = 0;
        for (; d + 4 <= hd; d += 4) {
            float f[4];
            vst1q_f32(f, vcvt_f32_f16(vcvt_f16_f32(vld1q_f32(ql + d)))); /* to fp16 and back: nearest, ties even */
            EI_UNROLL for (int e = 0; e < 4; e++) block_qt[(size_t)(d + e) * 8 + l] = f[e];
        }
        for (; d < hd; d++) block_qt[(size_t)d * 8 + l] = ei_attn_round_to(ql[d], EI_TYPE_F16);
    }
    ei_attn_block_run(p, nq, first, end, out, room, scratch, block_tile, neon_softmax, block_round_weights, block_values);
}

void EI_NEON_FN(ei_neon_attn)(ei_kernels *k) {
    k->attn = neon_attn;
    k->attn_softmax = neon_softmax;
    k->attn_block = neon_attn_block;
    k->attn_dots_f16 = neon_dots_f16;
    k->attn_weighted_sum = neon_weighted_sum;
    k->attn_weighted_sum_q = neon_weighted_sum_q;
    k->attn_types = EI_ATTN_ALL;
}
