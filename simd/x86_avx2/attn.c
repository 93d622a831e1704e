/* AVX2 attention of one query head over its KV head, rounded as the reference (ref/attn.c).
 *
 * Scores: each product of the cache-rounded query and a key is exact (in float for an fp16
 * cache, in double for f32), but their sum in double is not, so every key's sum runs in
 * the reference's order: one lane per key, the products transposed into key lanes.
 * Softmax: common/ei_exp.h's exp, four keys a vector, the sum in the reference's 8 partials
 * (two vectors). Output: one lane per dimension, each adding
 * p[t] * v[t] in the order of t as the reference does, the products exact in double. */
#include <math.h>

#include "../common/attn_softmax.h"
#include "simd.h"

/* adds the four lanes of terms to *sum in lane order */
EI_AVX2_INLINE void add_in_order(double *sum, __m256d terms) {
    double t[4];
    _mm256_storeu_pd(t, terms);
    *sum += t[0]; *sum += t[1]; *sum += t[2]; *sum += t[3];
}

/* acc[key] += qr[d] * k_key[d] for d in [d0, d0 + 8) in order, four keys; each product is exact
 * in float */
EI_AVX2_INLINE __m256d dot4x8_f16(__m256d acc, __m256 qv, const uint8_t *k, size_t row_bytes) {
    __m256 p[4];
    EI_UNROLL
    for (int r = 0; r < 4; r++)
        p[r] = _mm256_mul_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + (size_t)r * row_bytes))));
    /* columns d (low halves) and d + 4 (high halves) of the 4 x 8 products */
    const __m256 a = _mm256_unpacklo_ps(p[0], p[1]), b = _mm256_unpacklo_ps(p[2], p[3]);
    const __m256 c = _mm256_unpackhi_ps(p[0], p[1]), e = _mm256_unpackhi_ps(p[2], p[3]);
    const __m256 col[4] = {_mm256_shuffle_ps(a, b, 0x44), _mm256_shuffle_ps(a, b, 0xee),
                           _mm256_shuffle_ps(c, e, 0x44), _mm256_shuffle_ps(c, e, 0xee)};
    EI_UNROLL
    for (int j = 0; j < 4; j++) acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(col[j])));
    EI_UNROLL
    for (int j = 0; j < 4; j++) acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(col[j], 1)));
    return acc;
}

/* dots of the fp16-rounded query with keys k[0..m) (m <= 8, row_bytes apart), each summed in
 * order */
static void dots_f16(const float *qr, const uint8_t *k, size_t row_bytes, int hd, int m, double *out) {
    int done = 0;
    if (m == 8) { /* two independent groups of four keys keep two addition chains in flight */
        __m256d a0 = _mm256_setzero_pd(), a1 = a0;
        int d = 0;
        for (; d + 8 <= hd; d += 8) {
            const __m256 qv = _mm256_loadu_ps(qr + d);
            a0 = dot4x8_f16(a0, qv, k + 2 * (size_t)d, row_bytes);
            a1 = dot4x8_f16(a1, qv, k + 4 * row_bytes + 2 * (size_t)d, row_bytes);
        }
        _mm256_storeu_pd(out, a0);
        _mm256_storeu_pd(out + 4, a1);
        done = d;
    } else {
        for (int t = 0; t < m; t++) out[t] = 0.0;
    }
    for (int t = 0; t < m; t++) {
        const ei_f16 *kr = (const ei_f16 *)(k + (size_t)t * row_bytes);
        double sum = out[t];
        int d = done;
        for (; d + 8 <= hd; d += 8) {
            const __m256 pr = _mm256_mul_ps(_mm256_loadu_ps(qr + d), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kr + d))));
            add_in_order(&sum, _mm256_cvtps_pd(_mm256_castps256_ps128(pr)));
            add_in_order(&sum, _mm256_cvtps_pd(_mm256_extractf128_ps(pr, 1)));
        }
        for (; d < hd; d++) sum += (double)qr[d] * ei_fp16_to_fp32(kr[d]);
        out[t] = sum;
    }
}

static double dot_f32_key(const float *q, const float *k, int hd) {
    double sum = 0.0;
    int d = 0;
    for (; d + 4 <= hd; d += 4)
        add_in_order(&sum, _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(q + d)), _mm256_cvtps_pd(_mm_loadu_ps(k + d))));
    for (; d < hd; d++) sum += (double)q[d] * k[d];
    return sum;
}

/* acc[d] += p[t] * v[t][d] for t in order, d in [0, hv); p already rounded as the value type;
 * rows row_bytes apart */
static void weighted_sum_f16(const double *p, const uint8_t *v, size_t row_bytes, int n, int hv, double *acc) {
    int d = 0;
    for (; d + 16 <= hv; d += 16) {
        __m256d a0 = _mm256_loadu_pd(acc + d), a1 = _mm256_loadu_pd(acc + d + 4);
        __m256d a2 = _mm256_loadu_pd(acc + d + 8), a3 = _mm256_loadu_pd(acc + d + 12);
        const uint8_t *row = v + 2 * (size_t)d;
        for (int t = 0; t < n; t++, row += row_bytes) {
            const __m256d w = _mm256_set1_pd(p[t]);
            const __m256 v0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)row));
            const __m256 v1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 16))); /* 8 fp16 further */
            a0 = _mm256_fmadd_pd(w, _mm256_cvtps_pd(_mm256_castps256_ps128(v0)), a0);
            a1 = _mm256_fmadd_pd(w, _mm256_cvtps_pd(_mm256_extractf128_ps(v0, 1)), a1);
            a2 = _mm256_fmadd_pd(w, _mm256_cvtps_pd(_mm256_castps256_ps128(v1)), a2);
            a3 = _mm256_fmadd_pd(w, _mm256_cvtps_pd(_mm256_extractf128_ps(v1, 1)), a3);
        }
        _mm256_storeu_pd(acc + d, a0); _mm256_storeu_pd(acc + d + 4, a1);
        _mm256_storeu_pd(acc + d + 8, a2); _mm256_storeu_pd(acc + d + 12, a3);
    }
    for (; d < hv; d++) {
        double a = acc[d];
        for (int t = 0; t < n; t++) a += p[t] * ei_fp16_to_fp32(((const ei_f16 *)(v + (size_t)t * row_bytes))[d]);
        acc[d] = a;
    }
}

static void weighted_sum_f32(const double *p, const uint8_t *v, size_t row_bytes, int n, int hv, double *acc) {
    int d = 0;
    for (; d + 16 <= hv; d += 16) {
        __m256d a0 = _mm256_loadu_pd(acc + d), a1 = _mm256_loadu_pd(acc + d + 4);
        __m256d a2 = _mm256_loadu_pd(acc + d + 8), a3 = _mm256_loadu_pd(acc + d + 12);
        const uint8_t *row = v + 4 * (size_t)d;
        for (int t = 0; t < n; t++, row += row_bytes) {
            const __m256d w = _mm256_set1_pd(p[t]);
            const float *r = (const float *)row;
            a0 = _mm256_fmadd_pd(w, _mm256_cvtps_pd(_mm_loadu_ps(r)), a0);
            a1 = _mm256_fmadd_pd(w, _mm256_cvtps_pd(_mm_loadu_ps(r + 4)), a1);
            a2 = _mm256_fmadd_pd(w, _mm256_cvtps_pd(_mm_loadu_ps(r + 8)), a2);
            a3 = _mm256_fmadd_pd(w, _mm256_cvtps_pd(_mm_loadu_ps(r + 12)), a3);
        }
        _mm256_storeu_pd(acc + d, a0); _mm256_storeu_pd(acc + d + 4, a1);
        _mm256_storeu_pd(acc + d + 8, a2); _mm256_storeu_pd(acc + d + 12, a3);
    }
    for (; d < hv; d++) {
        double a = acc[d];
        for (int t = 0; t < n; t++) a += p[t] * ((const float *)(v + (size_t)t * row_bytes))[d];
        acc[d] = a;
    }
}

/* scores[t] for the keys of every run */
static void avx2_scores(const ei_attn_params *p, const float *q, float *scores) {
    if (ei_attn_quantized(p->k_type)) {
        ei_attn_quant_scores(p, q, scores);
        return;
    }
    const int hd = p->head_dim, k_f32 = p->k_type == EI_TYPE_F32;
    float qr[EI_MAX_HEAD_DIM]; /* the query as the key type sees it */
    int d = 0;
    if (!k_f32)
        for (; d + 8 <= hd; d += 8)
            _mm256_storeu_ps(qr + d, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(q + d), _MM_FROUND_TO_NEAREST_INT)));
    for (; d < hd; d++) qr[d] = ei_attn_round_to(q[d], p->k_type);
    for (int r = 0; r < p->n_runs; r++) {
        const int n = p->runs[r].n;
        const uint8_t *kbase = (const uint8_t *)p->runs[r].k;
        for (int t = 0; t < n; t += 8) {
            const int m = n - t < 8 ? n - t : 8;
            const uint8_t *rows = kbase + (size_t)t * p->k_row_bytes;
            double dot[8];
            if (k_f32)
                for (int j = 0; j < m; j++)
                    dot[j] = dot_f32_key(qr, (const float *)(rows + (size_t)j * p->k_row_bytes), hd);
            else
                dots_f16(qr, rows, p->k_row_bytes, hd, m, dot);
            for (int j = 0; j < m; j++) scores[t + j] = ei_attn_score((float)dot[j], p);
        }
        scores += n;
    }
}

/* eight values of a q8_0 / q4_0 block (8 signed bytes) times its scale, as to_float decodes them */
EI_AVX2_INLINE __m256 quant8(__m128i q8, __m256 d) { return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8))); }

/* acc[32 b + c] += sum over t in order of p[t] * v_t[32 b + c], c < 32, for value rows of a q8_0 /
 * q4_0 cache: one block column at a time, its 32 dimensions in eight accumulators, each value
 * decoded in registers (exact in float) and each product exact in double */
static void avx2_weighted_sum_q(int v_type, const double *p, const uint8_t *v, size_t row_bytes, int n, int hv,
                                double *acc) {
    const int q4 = v_type == EI_TYPE_Q4_0;
    const size_t bb = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);
    for (int b = 0; b < hv / 32; b++) {
        __m256d a[8];
        EI_UNROLL for (int i = 0; i < 8; i++) a[i] = _mm256_loadu_pd(acc + 32 * b + 4 * i);
        const uint8_t *blk = v + (size_t)b * bb;
        for (int t = 0; t < n; t++, blk += row_bytes) {
            ei_f16 h;
            memcpy(&h, blk, 2);
            const __m256 d = _mm256_set1_ps(avx2_f16(h));
            const __m256i q = q4 ? avx2_q4_0((const block_q4_0 *)blk) : avx2_q8_0((const block_q8_0 *)blk);
            const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1); /* values 0..15, 16..31 */
            const __m256 x[4] = {quant8(lo, d), quant8(_mm_unpackhi_epi64(lo, lo), d), quant8(hi, d),
                                 quant8(_mm_unpackhi_epi64(hi, hi), d)};
            const __m256d w = _mm256_set1_pd(p[t]);
            EI_UNROLL for (int i = 0; i < 4; i++) {
                a[2 * i] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x[i])), w, a[2 * i]);
                a[2 * i + 1] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x[i], 1)), w, a[2 * i + 1]);
            }
        }
        EI_UNROLL for (int i = 0; i < 8; i++) _mm256_storeu_pd(acc + 32 * b + 4 * i, a[i]);
    }
}

/* acc += the weighted values of one run (weights p, already rounded as the value type) */
static void avx2_accumulate(const ei_attn_params *p, const ei_attn_run *run, const double *w, double *acc) {
    const int hv = p->head_dim_v;
    if (p->v_type == EI_TYPE_F32) weighted_sum_f32(w, run->v, p->v_row_bytes, run->n, hv, acc);
    else if (p->v_type == EI_TYPE_F16) weighted_sum_f16(w, run->v, p->v_row_bytes, run->n, hv, acc);
    else avx2_weighted_sum_q(p->v_type, w, run->v, p->v_row_bytes, run->n, hv, acc);
}

/* ei_exp (common/ei_exp.h) of 4 doubles: its operations lane by lane */
EI_AVX2_INLINE __m256d exp4(__m256d x) {
    const __m256d shifter = _mm256_set1_pd(EI_EXP_SHIFTER);
    const __m256d nd = _mm256_add_pd(_mm256_mul_pd(x, _mm256_set1_pd(EI_EXP_LOG2E)), shifter);
    const __m256d n = _mm256_sub_pd(nd, shifter);
    const __m256d r = _mm256_sub_pd(_mm256_sub_pd(x, _mm256_mul_pd(n, _mm256_set1_pd(EI_EXP_LN2_HI))),
                                    _mm256_mul_pd(n, _mm256_set1_pd(EI_EXP_LN2_LO)));
    __m256d p = _mm256_set1_pd(ei_exp_coef[EI_EXP_DEGREE]);
    EI_UNROLL for (int k = EI_EXP_DEGREE - 1; k >= 0; k--) p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(ei_exp_coef[k]));
    const __m256i ni = _mm256_sub_epi64(_mm256_castpd_si256(nd), _mm256_castpd_si256(shifter));
    const __m256i n1 = _mm256_sub_epi64(_mm256_srli_epi64(_mm256_add_epi64(ni, _mm256_set1_epi64x(2048)), 1), _mm256_set1_epi64x(1024));
    const __m256i bias = _mm256_set1_epi64x(1023);
    const __m256d s1 = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(n1, bias), 52));
    const __m256d s2 = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(_mm256_sub_epi64(ni, n1), bias), 52));
    __m256d y = _mm256_mul_pd(_mm256_mul_pd(p, s1), s2);
    y = _mm256_andnot_pd(_mm256_cmp_pd(x, _mm256_set1_pd(EI_EXP_MIN), _CMP_NGE_UQ), y);
    y = _mm256_blendv_pd(y, x, _mm256_cmp_pd(x, x, _CMP_UNORD_Q));
    return _mm256_blendv_pd(y, _mm256_set1_pd((double)INFINITY), _mm256_cmp_pd(x, _mm256_set1_pd(EI_EXP_MAX), _CMP_GT_OQ));
}

/* ei_attn_softmax: the max of 8 lanes (a NaN score loses every vmaxps), the 8 partial sums in
 * two vectors: keys 8i .. 8i + 3 in the first, 8i + 4 .. 8i + 7 in the second */
static double softmax(const float *sc, int n, double *w) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int t = 0;
    for (; t + 8 <= n; t += 8) m = _mm256_max_ps(_mm256_loadu_ps(sc + t), m);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float max = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    for (; t < n; t++)
        if (sc[t] > max) max = sc[t];
    const __m128 mx = _mm_set1_ps(max);
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    for (t = 0; t < n; t += 8) {
        float tail[8] = {0};
        const float *x = sc + t;
        const int m8 = n - t < 8 ? n - t : 8;
        if (m8 < 8) x = memcpy(tail, sc + t, sizeof(float) * (size_t)m8);
        __m256d e0 = exp4(_mm256_cvtps_pd(_mm_sub_ps(_mm_loadu_ps(x), mx)));
        __m256d e1 = exp4(_mm256_cvtps_pd(_mm_sub_ps(_mm_loadu_ps(x + 4), mx)));
        if (m8 < 8) { /* lanes past n add 0.0: the partials unchanged */
            const __m256i idx = _mm256_set_epi64x(3, 2, 1, 0);
            e0 = _mm256_and_pd(e0, _mm256_castsi256_pd(_mm256_cmpgt_epi64(_mm256_set1_epi64x(m8), idx)));
            e1 = _mm256_and_pd(e1, _mm256_castsi256_pd(_mm256_cmpgt_epi64(_mm256_set1_epi64x(m8 - 4), idx)));
            double tw[8];
            _mm256_storeu_pd(tw, e0);
            _mm256_storeu_pd(tw + 4, e1);
            memcpy(w + t, tw, sizeof(double) * (size_t)m8);
        } else {
            _mm256_storeu_pd(w + t, e0);
            _mm256_storeu_pd(w + t + 4, e1);
        }
        lo = _mm256_add_pd(lo, e0);
        hi = _mm256_add_pd(hi, e1);
    }
    const __m256d h = _mm256_add_pd(lo, hi);
    const __m128d q = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));
    return _mm_cvtsd_f64(_mm_add_sd(q, _mm_unpackhi_pd(q, q)));
}

/* the weights as the value type rounds them, in place: (float)(e / sum), then fp16 */
static void round_weights(double *w, int n, double sum, int v_type) {
    const int v_f16 = v_type == EI_TYPE_F16;
    int t = 0;
    const __m256d vsum = _mm256_set1_pd(sum);
    for (; t + 4 <= n; t += 4) {
        __m128 pr = _mm256_cvtpd_ps(_mm256_div_pd(_mm256_loadu_pd(w + t), vsum));
        if (v_f16) pr = _mm_cvtph_ps(_mm_cvtps_ph(pr, _MM_FROUND_TO_NEAREST_INT));
        _mm256_storeu_pd(w + t, _mm256_cvtps_pd(pr));
    }
    for (; t < n; t++) w[t] = ei_attn_prob(w[t], sum, v_type);
}

static void avx2_attn(const ei_attn_params *p, const float *q, float *out, double *scratch) {
    const int n = ei_attn_keys(p), hv = p->head_dim_v;
    float *scores = (float *)(scratch + n); /* (n) float scores after the (n) double weights */
    avx2_scores(p, q, scores);
    round_weights(scratch, n, softmax(scores, n, scratch), p->v_type);
    ei_attn_track_weights(p, scratch, n);
    double acc[EI_MAX_HEAD_DIM];
    for (int d = 0; d < hv; d++) acc[d] = 0.0;
    for (int r = 0, at = 0; r < p->n_runs; at += p->runs[r++].n) avx2_accumulate(p, &p->runs[r], scratch + at, acc);
    int d = 0;
    for (; d + 4 <= hv; d += 4) _mm_storeu_ps(out + d, _mm256_cvtpd_ps(_mm256_loadu_pd(acc + d)));
    for (; d < hv; d++) out[d] = (float)acc[d];
}

static void avx2_weighted_sum(const double *p, const uint8_t *v, int f32, size_t row_bytes, int n, int hv,
                              double *acc) {
    (f32 ? weighted_sum_f32 : weighted_sum_f16)(p, v, row_bytes, n, hv, acc);
}

/* 4 dims from d of 4 fp16 keys (row[0..3]) as doubles, transposed: c[e] = dim d + e of each */
EI_AVX2_INLINE void dims4x4_pd(const ei_f16 *const *row, int d, __m256d c[4]) {
    __m256d r[4];
    EI_UNROLL
    for (int j = 0; j < 4; j++) r[j] = _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(row[j] + d))));
    const __m256d t0 = _mm256_unpacklo_pd(r[0], r[1]), t1 = _mm256_unpackhi_pd(r[0], r[1]);
    const __m256d t2 = _mm256_unpacklo_pd(r[2], r[3]), t3 = _mm256_unpackhi_pd(r[2], r[3]);
    c[0] = _mm256_permute2f128_pd(t0, t2, 0x20);
    c[1] = _mm256_permute2f128_pd(t1, t3, 0x20);
    c[2] = _mm256_permute2f128_pd(t0, t2, 0x31);
    c[3] = _mm256_permute2f128_pd(t1, t3, 0x31);
}

/* out[j] for 16 keys (j >= m repeats key 0, not stored): one double lane per key, four
 * independent chains, each adding its exact products in order of d */
static void dots16_f16_pd(const double *qd, const uint8_t *k, size_t row_bytes, int hd, int m, double *out) {
    const ei_f16 *row[16];
    for (int j = 0; j < 16; j++) row[j] = (const ei_f16 *)(k + (size_t)(j < m ? j : 0) * row_bytes);
    __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    int d = 0;
    for (; d + 4 <= hd; d += 4) {
        EI_UNROLL
        for (int g = 0; g < 4; g++) {
            __m256d c[4];
            dims4x4_pd(row + 4 * g, d, c);
            EI_UNROLL
            for (int e = 0; e < 4; e++) acc[g] = _mm256_fmadd_pd(c[e], _mm256_set1_pd(qd[d + e]), acc[g]);
        }
    }
    double sums[16];
    EI_UNROLL
    for (int g = 0; g < 4; g++) _mm256_storeu_pd(sums + 4 * g, acc[g]);
    for (int j = 0; j < m; j++) {
        double sum = sums[j];
        for (int dd = d; dd < hd; dd++) sum += qd[dd] * ei_fp16_to_fp32(row[j][dd]);
        out[j] = sum;
    }
}

static void avx2_dots_f16(const double *qd, const uint8_t *k, size_t row_bytes, int hd, int m, double *out) {
    for (int t = 0; t < m; t += 16)
        dots16_f16_pd(qd, k + (size_t)t * row_bytes, row_bytes, hd, m - t < 16 ? m - t : 16, out + t);
}

/* ---- attention of a group of query heads (fp16 caches) ----------------------------------- */

/* out[i][j] = sum over d in order of qd[i][d] * k_j[d] for NQ queries (EI_MAX_HEAD_DIM apart,
 * fp16-rounded, as doubles) and 8 fp16 keys (j >= m repeats key 0): key lanes, two chains of
 * four keys per query, each key's dims converted and transposed once for all the queries */
#define GROUP_DOTS8(NQ)                                                                               \
    static void group_dots8_##NQ(const double *qd, const uint8_t *k, size_t row_bytes, int hd, int m,         \
                                 double out[][8]) {                                                   \
        const ei_f16 *row[8];                                                                         \
        for (int j = 0; j < 8; j++) row[j] = (const ei_f16 *)(k + (size_t)(j < m ? j : 0) * row_bytes); \
        __m256d acc[2][NQ];                                                                           \
        EI_UNROLL for (int g = 0; g < 2; g++) EI_UNROLL for (int i = 0; i < NQ; i++) acc[g][i] = _mm256_setzero_pd(); \
        int d = 0;                                                                                    \
        for (; d + 4 <= hd; d += 4)                                                                   \
            EI_UNROLL for (int g = 0; g < 2; g++) {                                                   \
                __m256d c[4];                                                                         \
                dims4x4_pd(row + 4 * g, d, c);                                                        \
                EI_UNROLL for (int e = 0; e < 4; e++)                                                 \
                    EI_UNROLL for (int i = 0; i < NQ; i++)                                            \
                        acc[g][i] = _mm256_fmadd_pd(c[e], _mm256_set1_pd(qd[i * EI_MAX_HEAD_DIM + d + e]), acc[g][i]); \
            }                                                                                         \
        EI_UNROLL for (int i = 0; i < NQ; i++) {                                                      \
            _mm256_storeu_pd(out[i], acc[0][i]);                                                      \
            _mm256_storeu_pd(out[i] + 4, acc[1][i]);                                                  \
            for (int j = 0; j < m; j++)                                                               \
                for (int dd = d; dd < hd; dd++) out[i][j] += qd[i * EI_MAX_HEAD_DIM + dd] * ei_fp16_to_fp32(row[j][dd]); \
        }                                                                                             \
    }
GROUP_DOTS8(1)
GROUP_DOTS8(2)
GROUP_DOTS8(4)

/* acc[i][d0 + c] += sum over t in order of w[i][t] * v_t[d0 + c], c < 8, for NQ queries whose
 * weights are n_w apart (acc EI_MAX_HEAD_DIM apart): each value row converted once */
#define GROUP_SUM8(NQ)                                                                                \
    static void group_sum8_##NQ(const double *w, int n, size_t n_w, const uint8_t *v, size_t row_bytes, int d0, \
                                double *acc) {                                                        \
        __m256d a[NQ][2];                                                                             \
        EI_UNROLL for (int i = 0; i < NQ; i++) {                                                      \
            a[i][0] = _mm256_loadu_pd(acc + i * EI_MAX_HEAD_DIM + d0);                                \
            a[i][1] = _mm256_loadu_pd(acc + i * EI_MAX_HEAD_DIM + d0 + 4);                            \
        }                                                                                             \
        const uint8_t *row = v + 2 * (size_t)d0;                                                      \
        for (int t = 0; t < n; t++, row += row_bytes) {                                               \
            const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)row));                  \
            const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)); \
            EI_UNROLL for (int i = 0; i < NQ; i++) {                                                  \
                const __m256d wt = _mm256_set1_pd(w[(size_t)i * n_w + t]);                            \
                a[i][0] = _mm256_fmadd_pd(wt, lo, a[i][0]);                                           \
                a[i][1] = _mm256_fmadd_pd(wt, hi, a[i][1]);                                           \
            }                                                                                         \
        }                                                                                             \
        EI_UNROLL for (int i = 0; i < NQ; i++) {                                                      \
            _mm256_storeu_pd(acc + i * EI_MAX_HEAD_DIM + d0, a[i][0]);                                \
            _mm256_storeu_pd(acc + i * EI_MAX_HEAD_DIM + d0 + 4, a[i][1]);                            \
        }                                                                                             \
    }
GROUP_SUM8(1)
GROUP_SUM8(2)
GROUP_SUM8(4)

/* acc[i] (zeroed, EI_MAX_HEAD_DIM apart) = the weighted values of nb <= 4 queries over the runs
 * of p, query i's weights at w + i * n: each f16 value row converted once for all of them */
static void group_values(const ei_attn_params *p, int nb, const double *w, int n, double *acc) {
    const int hv = p->head_dim_v;
    for (int i = 0; i < nb; i++)
        for (int d = 0; d < hv; d++) acc[i * EI_MAX_HEAD_DIM + d] = 0.0;
    for (int r = 0, at = 0; r < p->n_runs; at += p->runs[r++].n)
        for (int d = 0; d < hv; d += 8) {
            const double *wr = w + at;
            const uint8_t *v = (const uint8_t *)p->runs[r].v;
            const int nr = p->runs[r].n;
            if (nb == 1) group_sum8_1(wr, nr, (size_t)n, v, p->v_row_bytes, d, acc);
            else if (nb == 2) group_sum8_2(wr, nr, (size_t)n, v, p->v_row_bytes, d, acc);
            else if (nb == 4) group_sum8_4(wr, nr, (size_t)n, v, p->v_row_bytes, d, acc);
            else { /* three: two, then one */
                group_sum8_2(wr, nr, (size_t)n, v, p->v_row_bytes, d, acc);
                group_sum8_1(wr + 2 * (size_t)n, nr, (size_t)n, v, p->v_row_bytes, d, acc + 2 * EI_MAX_HEAD_DIM);
            }
        }
}

/* up to four query heads of one KV head over fp16 caches, each exactly as avx2_attn computes it:
 * the keys and values are read and converted once for the group; other types go query by query */
static void avx2_attn_group(const ei_attn_params *p, int nq, const float *q, size_t qs, float *out, size_t os,
                            double *scratch) {
    const int n = ei_attn_keys(p), hd = p->head_dim, hv = p->head_dim_v;
    if (p->k_type != EI_TYPE_F16 || p->v_type != EI_TYPE_F16 || hv % 8) {
        for (int i = 0; i < nq; i++) avx2_attn(p, q + (size_t)i * qs, out + (size_t)i * os, scratch);
        return;
    }
    static EI_THREAD_LOCAL double qd[4 * EI_MAX_HEAD_DIM];  /* the queries as fp16 rounds them */
    static EI_THREAD_LOCAL double acc[4 * EI_MAX_HEAD_DIM]; /* their outputs */
    for (int i0 = 0; i0 < nq; i0 += 4) {
        const int nb = nq - i0 < 4 ? nq - i0 : 4, lanes = nb == 1 ? 1 : nb == 2 ? 2 : 4;
        double *w = scratch;                             /* (nb, n) weights */
        float *sc = (float *)(scratch + (size_t)nb * n); /* (nb, n) scores */
        for (int i = 0; i < lanes; i++) {
            const float *qi = q + (size_t)(i0 + (i < nb ? i : 0)) * qs;
            for (int d = 0; d < hd; d++) qd[i * EI_MAX_HEAD_DIM + d] = ei_attn_round_to(qi[d], EI_TYPE_F16);
        }
        for (int r = 0, at = 0; r < p->n_runs; at += p->runs[r++].n) {
            const int nr = p->runs[r].n;
            for (int t = 0; t < nr; t += 8) {
                const int m = nr - t < 8 ? nr - t : 8;
                const uint8_t *k = (const uint8_t *)p->runs[r].k + (size_t)t * p->k_row_bytes;
                double dot[4][8];
                if (lanes == 1) group_dots8_1(qd, k, p->k_row_bytes, hd, m, dot);
                else if (lanes == 2) group_dots8_2(qd, k, p->k_row_bytes, hd, m, dot);
                else group_dots8_4(qd, k, p->k_row_bytes, hd, m, dot);
                for (int i = 0; i < nb; i++)
                    for (int j = 0; j < m; j++) sc[(size_t)i * n + at + t + j] = ei_attn_score((float)dot[i][j], p);
            }
        }
        for (int i = 0; i < nb; i++) {
            double *wi = w + (size_t)i * n;
            round_weights(wi, n, softmax(sc + (size_t)i * n, n, wi), EI_TYPE_F16);
            ei_attn_track_weights(p, wi, n);
        }
        group_values(p, nb, w, n, acc);
        for (int i = 0; i < nb; i++)
            for (int d = 0; d < hv; d += 4)
                _mm_storeu_ps(out + (size_t)(i0 + i) * os + d, _mm256_cvtpd_ps(_mm256_loadu_pd(acc + i * EI_MAX_HEAD_DIM + d)));
    }
}

/* ---- a block of queries of several tokens (fp16 caches) --------------------------------------
 * Scores: one lane per query (four to a vector, their dims transposed once for the block), each
 * key's dims converted to double once and broadcast to every query; every lane adds its exact
 * products in order of d, as attn does. A key tile serves all the block's queries. */

#define BLOCK_KEYS EI_ATTN_BLOCK_KEYS /* keys converted at a time */

/* out[v * BLOCK_KEYS + j] = the dots of query vector v (qt: (NV, hd, 4 lanes)) with key j of kd
 * ((NK, hd)) */
#define BLOCK_DOTS(NV, NK)                                                                            \
    static void block_dots_##NV##_##NK(const double *qt, const double *kd, int hd, __m256d *out) {      \
        __m256d acc[NV][NK];                                                                          \
        EI_UNROLL for (int v = 0; v < NV; v++) EI_UNROLL for (int j = 0; j < NK; j++) acc[v][j] = _mm256_setzero_pd(); \
        for (int d = 0; d < hd; d++) {                                                                \
            EI_UNROLL for (int v = 0; v < NV; v++) {                                                  \
                const __m256d qv = _mm256_loadu_pd(qt + ((size_t)v * hd + d) * 4);                   \
                EI_UNROLL for (int j = 0; j < NK; j++)                                                \
                    acc[v][j] = _mm256_fmadd_pd(qv, _mm256_broadcast_sd(kd + (size_t)j * hd + d), acc[v][j]); \
            }                                                                                         \
        }                                                                                             \
        EI_UNROLL for (int v = 0; v < NV; v++) EI_UNROLL for (int j = 0; j < NK; j++) out[v * BLOCK_KEYS + j] = acc[v][j]; \
    }
BLOCK_DOTS(1, 8)
BLOCK_DOTS(2, 4)

/* kd[j] = key row j of m (rows past m zero) as doubles */
static void keys_to_double(const uint8_t *k, size_t row_bytes, int hd, int m, double *kd) {
    for (int j = 0; j < BLOCK_KEYS; j++) {
        double *out = kd + (size_t)j * hd;
        if (j >= m) {
            memset(out, 0, sizeof(double) * (size_t)hd);
            continue;
        }
        const ei_f16 *row = (const ei_f16 *)(k + (size_t)j * row_bytes);
        int d = 0;
        for (; d + 8 <= hd; d += 8) {
            const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + d)));
            _mm256_storeu_pd(out + d, _mm256_cvtps_pd(_mm256_castps256_ps128(x)));
            _mm256_storeu_pd(out + d + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
        }
        for (; d < hd; d++) out[d] = ei_fp16_to_fp32(row[d]);
    }
}

/* (nv, hd, 4) the block's queries as fp16 rounds them, lane i % 4 of vector i / 4 */
static EI_THREAD_LOCAL double block_qt[EI_ATTN_BLOCK_QUERIES / 4 * EI_MAX_HEAD_DIM * 4];
static EI_THREAD_LOCAL int block_nv; /* query vectors in block_qt */

/* dots[j][i] of the block's queries with m keys from k */
static void block_tile(const ei_attn_params *p, const uint8_t *k, int m, double dots[BLOCK_KEYS][EI_ATTN_BLOCK_QUERIES]) {
    static EI_THREAD_LOCAL double kd[BLOCK_KEYS * EI_MAX_HEAD_DIM];
    const int hd = p->head_dim;
    keys_to_double(k, p->k_row_bytes, hd, m, kd);
    __m256d v[2 * BLOCK_KEYS]; /* (query vector, key) */
    if (block_nv == 1) block_dots_1_8(block_qt, kd, hd, v);
    else {
        block_dots_2_4(block_qt, kd, hd, v);
        block_dots_2_4(block_qt, kd + 4 * (size_t)hd, hd, v + 4);
    }
    for (int j = 0; j < BLOCK_KEYS; j++)
        for (int i = 0; i < 4 * block_nv; i++) dots[j][i] = ((const double *)&v[i / 4 * BLOCK_KEYS + j])[i % 4];
}

/* out[i] = the weighted values for nb queries whose weights are n apart */
static void block_values(const ei_attn_params *sub, int nb, const double *w, int n, float *const *out) {
    static EI_THREAD_LOCAL double acc[4 * EI_MAX_HEAD_DIM];
    group_values(sub, nb, w, n, acc);
    for (int i = 0; i < nb; i++)
        for (int d = 0; d < sub->head_dim_v; d += 4)
            _mm_storeu_ps(out[i] + d, _mm256_cvtpd_ps(_mm256_loadu_pd(acc + i * EI_MAX_HEAD_DIM + d)));
}

static void avx2_attn_block(const ei_attn_params *p, int nq, const float *const *q, const int32_t *first,
                            const int32_t *end, float *const *out, ei_attn_run *room, double *scratch) {
    const int hd = p->head_dim, hv = p->head_dim_v;
    if (p->k_type != EI_TYPE_F16 || p->v_type != EI_TYPE_F16 || hv % 8 || nq > EI_ATTN_BLOCK_QUERIES) {
        ei_attn_block_by_query(p, nq, q, first, end, out, room, scratch, avx2_attn);
        return;
    }
    block_nv = (nq + 3) / 4;
    for (int v = 0; v < block_nv; v++)
        for (int l = 0; l < 4; l++) { /* past nq: query 0 */
            const float *qi = q[4 * v + l < nq ? 4 * v + l : 0];
            int d = 0;
            for (; d + 8 <= hd; d += 8) {
                float f[8];
                _mm256_storeu_ps(f, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(qi + d), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
                for (int e = 0; e < 8; e++) block_qt[((size_t)v * hd + d + e) * 4 + l] = f[e];
            }
            for (; d < hd; d++) block_qt[((size_t)v * hd + d) * 4 + l] = ei_attn_round_to(qi[d], EI_TYPE_F16);
        }
    ei_attn_block_run(p, nq, first, end, out, room, scratch, block_tile, softmax, round_weights, block_values);
}

void ei_avx2_attn_kernels(ei_kernels *k) {
    k->attn = avx2_attn;
    k->attn_softmax = softmax;
    k->attn_group = avx2_attn_group;
    k->attn_block = avx2_attn_block;
    k->attn_weighted_sum = avx2_weighted_sum;
    k->attn_dots_f16 = avx2_dots_f16;
    k->attn_weighted_sum_q = avx2_weighted_sum_q;
    k->attn_types = EI_ATTN_ALL;
}
