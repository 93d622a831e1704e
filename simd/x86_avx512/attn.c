/* avx512 attention, rounded as the reference (ref/attn.c): every reduction adds in the
 * reference's order (one lane per key for the scores, one lane per dimension for the
 * output), so the results are the reference's bit for bit, whether or not the double sums
 * are exact. */
#include <math.h>
#include <string.h>

#include "../common/attn_softmax.h"
#include "blocks.h"

/* 16 fp16 values (dims of 16 keys, or 16 dims of one key) as two vectors of doubles */
EI_INLINE void f16x16_pd(__m256i h, __m512d *lo, __m512d *hi) {
    const __m512 f = _mm512_cvtph_ps(h);
    *lo = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
    *hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
}

/* dims d..d+15 of 16 fp16 keys, transposed: x[e] holds dim d + e of the 16 keys in its low half
 * and dim d + e + 8 in its high half, the even keys in each half's first 128 bits */
EI_INLINE void keys16_transposed(const ei_f16 *const row[16], int d, __m512i x[8]) {
    /* x[i]: keys 2i (128-bit lanes 0, 1) and 2i + 1 (lanes 2, 3), dims d..d+15 */
    __m512i t[8], s[8];
    EI_UNROLL for (int i = 0; i < 8; i++)
        x[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(row[2 * i] + d))),
                                  _mm256_loadu_si256((const __m256i *)(row[2 * i + 1] + d)), 1);
    /* an 8x8 transpose of 16-bit values in each 128-bit lane: afterwards x[e] holds dim e
     * (lanes 0, 2) and dim e + 8 (lanes 1, 3) of the even (lanes 0, 1) and odd keys */
    EI_UNROLL for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm512_unpacklo_epi16(x[2 * i], x[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi16(x[2 * i], x[2 * i + 1]);
    }
    EI_UNROLL for (int g = 0; g < 2; g++) {
        s[4 * g + 0] = _mm512_unpacklo_epi32(t[4 * g + 0], t[4 * g + 2]);
        s[4 * g + 1] = _mm512_unpackhi_epi32(t[4 * g + 0], t[4 * g + 2]);
        s[4 * g + 2] = _mm512_unpacklo_epi32(t[4 * g + 1], t[4 * g + 3]);
        s[4 * g + 3] = _mm512_unpackhi_epi32(t[4 * g + 1], t[4 * g + 3]);
    }
    EI_UNROLL for (int e = 0; e < 4; e++) {
        x[2 * e] = _mm512_shuffle_i64x2(_mm512_unpacklo_epi64(s[e], s[4 + e]), _mm512_unpacklo_epi64(s[e], s[4 + e]), _MM_SHUFFLE(3, 1, 2, 0));
        x[2 * e + 1] = _mm512_shuffle_i64x2(_mm512_unpackhi_epi64(s[e], s[4 + e]), _mm512_unpackhi_epi64(s[e], s[4 + e]), _MM_SHUFFLE(3, 1, 2, 0));
    }
}

/* out[j] = sum over d in order of qd[d] * k_j[d] for 16 fp16 keys k_j at k + j * row_bytes
 * (j >= m repeats key 0, not stored), one double lane per key; every product is exact */
static void key_dots16_f16(const double *qd, const uint8_t *k, size_t row_bytes, int hd, int m, double *out) {
    const ei_f16 *row[16];
    for (int j = 0; j < 16; j++) row[j] = (const ei_f16 *)(k + (size_t)(j < m ? j : 0) * row_bytes);
    __m512d even = _mm512_setzero_pd(), odd = _mm512_setzero_pd(); /* keys 0, 2, .. 14 and 1, 3, .. 15 */
    int d = 0;
    for (; d + 16 <= hd; d += 16) {
        __m512i x[8];
        keys16_transposed(row, d, x);
        EI_UNROLL for (int h = 0; h < 2; h++)
            EI_UNROLL for (int e = 0; e < 8; e++) {
                __m512d lo, hi;
                f16x16_pd(h ? _mm512_extracti64x4_epi64(x[e], 1) : _mm512_castsi512_si256(x[e]), &lo, &hi);
                const __m512d q = _mm512_set1_pd(qd[d + 8 * h + e]);
                even = _mm512_fmadd_pd(lo, q, even); /* the product is exact: one rounding, the add */
                odd = _mm512_fmadd_pd(hi, q, odd);
            }
    }
    double ev[8], ov[8];
    _mm512_storeu_pd(ev, even);
    _mm512_storeu_pd(ov, odd);
    for (int j = 0; j < m; j++) {
        double sum = j % 2 ? ov[j / 2] : ev[j / 2];
        for (int dd = d; dd < hd; dd++) sum += qd[dd] * ei_fp16_to_fp32(row[j][dd]);
        out[j] = sum;
    }
}

/* one f32 key: the exact products added in order */
static double key_dot_f32(const float *q, const float *k, int hd) {
    double sum = 0.0;
    int d = 0;
    for (; d + 8 <= hd; d += 8) {
        double t[8];
        _mm512_storeu_pd(t, _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(q + d)), _mm512_cvtps_pd(_mm256_loadu_ps(k + d))));
        EI_UNROLL for (int j = 0; j < 8; j++) sum += t[j];
    }
    for (; d < hd; d++) sum += (double)q[d] * k[d];
    return sum;
}

/* 16 values of a cache row from dimension d0 as doubles */
EI_INLINE void v_row16(const uint8_t *row, int f32, int d0, __m512d *lo, __m512d *hi) {
    if (f32) {
        *lo = _mm512_cvtps_pd(_mm256_loadu_ps((const float *)row + d0));
        *hi = _mm512_cvtps_pd(_mm256_loadu_ps((const float *)row + d0 + 8));
    } else {
        f16x16_pd(_mm256_loadu_si256((const __m256i *)((const ei_f16 *)row + d0)), lo, hi);
    }
}

/* acc[d0 + j] += sum over t in order of p[t] * v_t[d0 + j] for j < 16 * G, one double lane per
 * dimension; every product is exact */
#define WEIGHTED_SUM(G)                                                                              \
    static void weighted_sum##G(const double *p, const uint8_t *v, int f32, size_t row_bytes, int n, int d0, double *acc) { \
        __m512d a[2 * G];                                                                            \
        EI_UNROLL for (int i = 0; i < 2 * G; i++) a[i] = _mm512_loadu_pd(acc + d0 + 8 * i);           \
        for (int t = 0; t < n; t++) {                                                                \
            const __m512d pt = _mm512_set1_pd(p[t]);                                                 \
            EI_UNROLL for (int i = 0; i < G; i++) {                                                  \
                __m512d lo, hi;                                                                      \
                v_row16(v + (size_t)t * row_bytes, f32, d0 + 16 * i, &lo, &hi);                      \
                a[2 * i] = _mm512_fmadd_pd(lo, pt, a[2 * i]);                                        \
                a[2 * i + 1] = _mm512_fmadd_pd(hi, pt, a[2 * i + 1]);                                \
            }                                                                                        \
        }                                                                                            \
        EI_UNROLL for (int i = 0; i < 2 * G; i++) _mm512_storeu_pd(acc + d0 + 8 * i, a[i]);           \
    }
WEIGHTED_SUM(8)
WEIGHTED_SUM(1)

/* rows row_bytes apart, of f32 or fp16 values */
static void weighted_sum(const double *p, const uint8_t *v, int f32, size_t row_bytes, int n, int hv, double *acc) {
    int d = 0;
    for (; d + 128 <= hv; d += 128) weighted_sum8(p, v, f32, row_bytes, n, d, acc);
    for (; d + 16 <= hv; d += 16) weighted_sum1(p, v, f32, row_bytes, n, d, acc);
    for (; d < hv; d++) {
        double s = acc[d];
        for (int t = 0; t < n; t++) {
            const uint8_t *row = v + (size_t)t * row_bytes;
            s += p[t] * (f32 ? ((const float *)row)[d] : ei_fp16_to_fp32(((const ei_f16 *)row)[d]));
        }
        acc[d] = s;
    }
}

/* scores[t] for the keys of every run */
static void scores_of(const ei_attn_params *p, const float *q, float *scores) {
    if (ei_attn_quantized(p->k_type)) {
        ei_attn_quant_scores(p, q, scores);
        return;
    }
    const int hd = p->head_dim, k_f32 = p->k_type == EI_TYPE_F32;
    float qr[EI_MAX_HEAD_DIM];  /* the query as the key type sees it */
    double qd[EI_MAX_HEAD_DIM]; /* the same, in double */
    int d = 0;
    for (; d + 16 <= hd; d += 16) {
        __m512 x = _mm512_loadu_ps(q + d);
        if (!k_f32) x = _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm512_storeu_ps(qr + d, x);
    }
    for (; d < hd; d++) qr[d] = ei_attn_round_to(q[d], p->k_type);
    for (d = 0; d < hd; d++) qd[d] = qr[d];
    for (int r = 0; r < p->n_runs; r++) {
        const int n = p->runs[r].n;
        const uint8_t *kbase = (const uint8_t *)p->runs[r].k;
        for (int t = 0; t < n; t += 16) {
            const int m = n - t < 16 ? n - t : 16;
            const uint8_t *rows = kbase + (size_t)t * p->k_row_bytes;
            double dot[16];
            if (k_f32)
                for (int j = 0; j < m; j++) dot[j] = key_dot_f32(qr, (const float *)(rows + (size_t)j * p->k_row_bytes), hd);
            else
                key_dots16_f16(qd, rows, p->k_row_bytes, hd, m, dot);
            for (int j = 0; j < m; j++) scores[t + j] = ei_attn_score((float)dot[j], p);
        }
        scores += n;
    }
}

/* the 32 values of a q8_0 or q4_0 block as to_float decodes them (scale times integer, exact) */
EI_INLINE void quant_block32(int q4, const uint8_t *blk, __m512 v[2]) {
    ei_f16 h;
    memcpy(&h, blk, 2);
    const __m512 d = _mm512_set1_ps(f16_to_f32(h));
    __m128i a, b;
    if (q4) {
        const __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2)), m = _mm_set1_epi8(15), o = _mm_set1_epi8(8);
        a = _mm_sub_epi8(_mm_and_si128(q, m), o);
        b = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m), o);
    } else {
        a = _mm_loadu_si128((const __m128i *)(blk + 2));
        b = _mm_loadu_si128((const __m128i *)(blk + 18));
    }
    v[0] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(a)));
    v[1] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)));
}

/* acc[32 b0 + c] += sum over t in order of p[t] * v_t, c < 32 G: G blocks of each row */
#define WEIGHTED_SUM_Q(G)                                                                            \
    static void weighted_sum_q##G(int q4, const double *p, const uint8_t *v, size_t row_bytes, int n, int b0, \
                                  double *acc) {                                                     \
        const size_t bb = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0);                              \
        __m512d a[4 * G];                                                                            \
        EI_UNROLL for (int i = 0; i < 4 * G; i++) a[i] = _mm512_loadu_pd(acc + 32 * b0 + 8 * i);      \
        const uint8_t *row = v + (size_t)b0 * bb;                                                    \
        for (int t = 0; t < n; t++, row += row_bytes) {                                              \
            const __m512d w = _mm512_set1_pd(p[t]);                                                  \
            EI_UNROLL for (int g = 0; g < G; g++) {                                                  \
                __m512 x[2];                                                                         \
                quant_block32(q4, row + (size_t)g * bb, x);                                          \
                EI_UNROLL for (int h = 0; h < 2; h++) {                                              \
                    a[4 * g + 2 * h] = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x[h])), w, a[4 * g + 2 * h]); \
                    a[4 * g + 2 * h + 1] = _mm512_fmadd_pd(                                          \
                        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x[h]), 1))), w, \
                        a[4 * g + 2 * h + 1]);                                                       \
                }                                                                                    \
            }                                                                                        \
        }                                                                                            \
        EI_UNROLL for (int i = 0; i < 4 * G; i++) _mm512_storeu_pd(acc + 32 * b0 + 8 * i, a[i]);      \
    }
WEIGHTED_SUM_Q(2)
WEIGHTED_SUM_Q(1)

/* value rows of a q8_0 / q4_0 cache: two blocks (eight accumulators) at a time */
static void weighted_sum_q(int v_type, const double *p, const uint8_t *v, size_t row_bytes, int n, int hv, double *acc) {
    const int q4 = v_type == EI_TYPE_Q4_0, nb = hv / 32;
    int b = 0;
    for (; b + 2 <= nb; b += 2) weighted_sum_q2(q4, p, v, row_bytes, n, b, acc);
    for (; b < nb; b++) weighted_sum_q1(q4, p, v, row_bytes, n, b, acc);
}

/* acc += the weighted values of one run (weights w, already rounded as the value type) */
static void accumulate(const ei_attn_params *p, const ei_attn_run *run, const double *w, double *acc) {
    if (ei_attn_quantized(p->v_type))
        weighted_sum_q(p->v_type, w, run->v, p->v_row_bytes, run->n, p->head_dim_v, acc);
    else
        weighted_sum(w, run->v, p->v_type == EI_TYPE_F32, p->v_row_bytes, run->n, p->head_dim_v, acc);
}

/* ei_exp (common/ei_exp.h) of 8 doubles: its operations lane by lane */
EI_INLINE __m512d exp8(__m512d x) {
    const __m512d shifter = _mm512_set1_pd(EI_EXP_SHIFTER);
    const __m512d nd = _mm512_add_pd(_mm512_mul_pd(x, _mm512_set1_pd(EI_EXP_LOG2E)), shifter);
    const __m512d n = _mm512_sub_pd(nd, shifter);
    const __m512d r = _mm512_sub_pd(_mm512_sub_pd(x, _mm512_mul_pd(n, _mm512_set1_pd(EI_EXP_LN2_HI))),
                                    _mm512_mul_pd(n, _mm512_set1_pd(EI_EXP_LN2_LO)));
    __m512d p = _mm512_set1_pd(ei_exp_coef[EI_EXP_DEGREE]);
    EI_UNROLL for (int k = EI_EXP_DEGREE - 1; k >= 0; k--) p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(ei_exp_coef[k]));
    const __m512i ni = _mm512_sub_epi64(_mm512_castpd_si512(nd), _mm512_castpd_si512(shifter));
    const __m512i n1 = _mm512_sub_epi64(_mm512_srli_epi64(_mm512_add_epi64(ni, _mm512_set1_epi64(2048)), 1), _mm512_set1_epi64(1024));
    const __m512i bias = _mm512_set1_epi64(1023);
    const __m512d s1 = _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_add_epi64(n1, bias), 52));
    const __m512d s2 = _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_add_epi64(_mm512_sub_epi64(ni, n1), bias), 52));
    __m512d y = _mm512_mul_pd(_mm512_mul_pd(p, s1), s2);
    y = _mm512_mask_mov_pd(y, _mm512_cmp_pd_mask(x, _mm512_set1_pd(EI_EXP_MIN), _CMP_NGE_UQ), _mm512_setzero_pd());
    y = _mm512_mask_mov_pd(y, _mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q), x);
    return _mm512_mask_mov_pd(y, _mm512_cmp_pd_mask(x, _mm512_set1_pd(EI_EXP_MAX), _CMP_GT_OQ), _mm512_set1_pd((double)INFINITY));
}

/* ei_attn_softmax: the max of 16 lanes (a NaN score loses every vmaxps), each lane of
 * partial sums one of its 8 partials */
static double softmax(const float *sc, int n, double *w) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int t = 0;
    for (; t + 16 <= n; t += 16) m = _mm512_max_ps(_mm512_loadu_ps(sc + t), m);
    if (t < n) {
        const __mmask16 tail = (__mmask16)((1u << (n - t)) - 1);
        m = _mm512_max_ps(_mm512_mask_mov_ps(m, tail, _mm512_maskz_loadu_ps(tail, sc + t)), m);
    }
    const __m256 max = _mm256_set1_ps(_mm512_reduce_max_ps(m));
    __m512d sum = _mm512_setzero_pd();
    for (t = 0; t + 8 <= n; t += 8) {
        const __m512d e = exp8(_mm512_cvtps_pd(_mm256_sub_ps(_mm256_loadu_ps(sc + t), max)));
        _mm512_storeu_pd(w + t, e);
        sum = _mm512_add_pd(sum, e);
    }
    if (t < n) {
        const __mmask8 tail = (__mmask8)((1u << (n - t)) - 1);
        const __m256 x = _mm512_castps512_ps256(_mm512_maskz_loadu_ps((__mmask16)tail, sc + t));
        const __m512d e = exp8(_mm512_cvtps_pd(_mm256_sub_ps(x, max)));
        double tw[8];
        _mm512_storeu_pd(tw, e);
        memcpy(w + t, tw, sizeof(double) * (size_t)(n - t));
        sum = _mm512_add_pd(sum, _mm512_maskz_mov_pd(tail, e)); /* + 0.0: the partials unchanged */
    }
    const __m256d h = _mm256_add_pd(_mm512_castpd512_pd256(sum), _mm512_extractf64x4_pd(sum, 1));
    const __m128d q = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));
    return _mm_cvtsd_f64(_mm_add_sd(q, _mm_unpackhi_pd(q, q)));
}

/* the softmax weights as the value type rounds them, in place: (float)(w / sum), then fp16 */
static void round_weights(double *w, int n, double sum, int v_type) {
    int t = 0;
    for (; t + 8 <= n; t += 8) {
        __m256 pr = _mm512_cvtpd_ps(_mm512_div_pd(_mm512_loadu_pd(w + t), _mm512_set1_pd(sum)));
        if (v_type == EI_TYPE_F16) pr = _mm256_cvtph_ps(_mm256_cvtps_ph(pr, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm512_storeu_pd(w + t, _mm512_cvtps_pd(pr));
    }
    for (; t < n; t++) w[t] = ei_attn_prob(w[t], sum, v_type);
}

static void attn(const ei_attn_params *p, const float *q, float *out, double *scratch) {
    const int n = ei_attn_keys(p), hv = p->head_dim_v;
    float *scores = (float *)(scratch + n); /* (n) float scores after the (n) double weights */
    scores_of(p, q, scores);
    round_weights(scratch, n, softmax(scores, n, scratch), p->v_type);
    ei_attn_track_weights(p, scratch, n);
    double acc[EI_MAX_HEAD_DIM];
    for (int d = 0; d < hv; d++) acc[d] = 0.0;
    for (int r = 0, at = 0; r < p->n_runs; at += p->runs[r++].n) accumulate(p, &p->runs[r], scratch + at, acc);
    int d = 0;
    for (; d + 8 <= hv; d += 8) _mm256_storeu_ps(out + d, _mm512_cvtpd_ps(_mm512_loadu_pd(acc + d)));
    for (; d < hv; d++) out[d] = (float)acc[d];
}

/* ---- attention of a group of query heads ------------------------------------------------- */

/* scores[i][j] = sum over d in order of qT[d][i] * k_j[d] for 8 fp16 keys (j >= m repeats
 * key 0), one double lane per query: each key row is converted once for all the queries */
static void group_scores8(const double (*qT)[8], const uint8_t *k, size_t row_bytes, int hd, int m, double out[8][8]) {
    const ei_f16 *row[8];
    for (int j = 0; j < 8; j++) row[j] = (const ei_f16 *)(k + (size_t)(j < m ? j : 0) * row_bytes);
    __m512d acc[8];
    EI_UNROLL for (int j = 0; j < 8; j++) acc[j] = _mm512_setzero_pd();
    for (int d = 0; d < hd; d += 16) {
        double kd[8][16];
        EI_UNROLL for (int j = 0; j < 8; j++) {
            __m512d lo, hi;
            f16x16_pd(_mm256_loadu_si256((const __m256i *)(row[j] + d)), &lo, &hi);
            _mm512_storeu_pd(kd[j], lo);
            _mm512_storeu_pd(kd[j] + 8, hi);
        }
        /* the broadcasts below read memory (a load port) rather than permute registers */
        __asm__ volatile("" ::: "memory");
        EI_UNROLL for (int e = 0; e < 16; e++) {
            const __m512d qv = _mm512_loadu_pd(qT[d + e]);
            EI_UNROLL for (int j = 0; j < 8; j++) acc[j] = _mm512_fmadd_pd(qv, _mm512_set1_pd(kd[j][e]), acc[j]);
        }
    }
    EI_UNROLL for (int j = 0; j < 8; j++) _mm512_storeu_pd(out[j], acc[j]);
}

/* out[i][j] = sum over d in order of qT[d][i] * k_j[d] for NQ queries and 16 fp16 keys (j >= m
 * repeats key 0), hd a multiple of 16: one double lane per key, as key_dots16_f16, each
 * transposed key vector serving every query (a group of 2 or 4 heads fills no query lanes
 * it does not use) */
#define GROUP_DOTS16(NQ)                                                                              \
    static void group_dots16_##NQ(const double (*qT)[8], const uint8_t *k, size_t row_bytes, int hd, int m,   \
                                  double out[][16]) {                                                 \
        const ei_f16 *row[16];                                                                        \
        for (int j = 0; j < 16; j++) row[j] = (const ei_f16 *)(k + (size_t)(j < m ? j : 0) * row_bytes); \
        __m512d even[NQ], odd[NQ];                                                                    \
        EI_UNROLL for (int i = 0; i < NQ; i++) even[i] = odd[i] = _mm512_setzero_pd();                 \
        for (int d = 0; d < hd; d += 16) {                                                            \
            __m512i x[8];                                                                             \
            keys16_transposed(row, d, x);                                                             \
            EI_UNROLL for (int h = 0; h < 2; h++)                                                     \
                EI_UNROLL for (int e = 0; e < 8; e++) {                                               \
                    __m512d lo, hi;                                                                   \
                    f16x16_pd(h ? _mm512_extracti64x4_epi64(x[e], 1) : _mm512_castsi512_si256(x[e]), &lo, &hi); \
                    EI_UNROLL for (int i = 0; i < NQ; i++) {                                          \
                        const __m512d q = _mm512_set1_pd(qT[d + 8 * h + e][i]);                       \
                        even[i] = _mm512_fmadd_pd(lo, q, even[i]);                                    \
                        odd[i] = _mm512_fmadd_pd(hi, q, odd[i]);                                      \
                    }                                                                                 \
                }                                                                                     \
        }                                                                                             \
        EI_UNROLL for (int i = 0; i < NQ; i++) {                                                      \
            double ev[8], ov[8];                                                                      \
            _mm512_storeu_pd(ev, even[i]);                                                            \
            _mm512_storeu_pd(ov, odd[i]);                                                             \
            for (int j = 0; j < 16; j++) out[i][j] = j % 2 ? ov[j / 2] : ev[j / 2];                   \
        }                                                                                             \
    }
GROUP_DOTS16(1)
GROUP_DOTS16(2)
GROUP_DOTS16(4)

/* out[i][d0 + c] += sum over t in order of w[i][t] * v_t[d0 + c], c < 16 G, for NQ queries
 * whose weights are n_w apart */
#define GROUP_SUM(NQ, G)                                                                             \
    static void group_sum_##NQ##_##G(const double *w, int n, size_t n_w, const uint8_t *v, size_t row_bytes, int d0, \
                                     double *out, size_t os) {                                       \
        __m512d acc[NQ][2 * G];                                                                      \
        EI_UNROLL for (int i = 0; i < NQ; i++)                                                       \
            EI_UNROLL for (int c = 0; c < 2 * G; c++) acc[i][c] = _mm512_loadu_pd(out + i * os + d0 + 8 * c); \
        for (int t = 0; t < n; t++) {                                                                \
            __m512d vd[2 * G];                                                                       \
            EI_UNROLL for (int c = 0; c < G; c++)                                                    \
                f16x16_pd(_mm256_loadu_si256((const __m256i *)((const ei_f16 *)(v + (size_t)t * row_bytes) + d0 + 16 * c)), &vd[2 * c], &vd[2 * c + 1]); \
            EI_UNROLL for (int i = 0; i < NQ; i++) {                                                 \
                const __m512d wt = _mm512_set1_pd(w[(size_t)i * n_w + t]);                           \
                EI_UNROLL for (int c = 0; c < 2 * G; c++) acc[i][c] = _mm512_fmadd_pd(vd[c], wt, acc[i][c]); \
            }                                                                                        \
        }                                                                                            \
        EI_UNROLL for (int i = 0; i < NQ; i++)                                                       \
            EI_UNROLL for (int c = 0; c < 2 * G; c++) _mm512_storeu_pd(out + i * os + d0 + 8 * c, acc[i][c]); \
    }
GROUP_SUM(4, 2)
GROUP_SUM(2, 4)

/* sc[i * n + t] for the nb queries of qT and the keys of every run: up to four queries in key
 * lanes (group_dots16), more in query lanes (group_scores8) */
static void group_scores(const ei_attn_params *p, const double (*qT)[8], int nb, int n, float *sc) {
    int at = 0;
    for (int r = 0; r < p->n_runs; r++) {
        const int nr = p->runs[r].n;
        const uint8_t *kb = (const uint8_t *)p->runs[r].k;
        for (int t = 0; nb <= 4 && t < nr; t += 16) {
            const int m = nr - t < 16 ? nr - t : 16;
            double dot[4][16];
            const uint8_t *k = kb + (size_t)t * p->k_row_bytes;
            if (nb == 1) group_dots16_1(qT, k, p->k_row_bytes, p->head_dim, m, dot);
            else if (nb == 2) group_dots16_2(qT, k, p->k_row_bytes, p->head_dim, m, dot);
            else group_dots16_4(qT, k, p->k_row_bytes, p->head_dim, m, dot);
            for (int i = 0; i < nb; i++)
                for (int j = 0; j < m; j++) sc[(size_t)i * n + at + t + j] = ei_attn_score((float)dot[i][j], p);
        }
        for (int t = 0; nb > 4 && t < nr; t += 8) {
            const int m = nr - t < 8 ? nr - t : 8;
            double dot[8][8];
            group_scores8(qT, kb + (size_t)t * p->k_row_bytes, p->k_row_bytes, p->head_dim, m, dot);
            for (int j = 0; j < m; j++)
                for (int i = 0; i < nb; i++) sc[(size_t)i * n + at + t + j] = ei_attn_score((float)dot[j][i], p);
        }
        at += nr;
    }
}

/* acc[i] (hv apart) += the weighted values of every run for nb queries whose weights are n apart */
static void group_values(const ei_attn_params *p, const double *w, int nb, int n, double *acc) {
    const int hv = p->head_dim_v;
    for (int x = 0; x < nb * hv; x++) acc[x] = 0.0;
    int at = 0;
    for (int r = 0; r < p->n_runs; r++) {
        const int nr = p->runs[r].n;
        const uint8_t *vb = (const uint8_t *)p->runs[r].v;
        const size_t rb = p->v_row_bytes, hs = (size_t)hv;
        int i = 0;
        for (; i + 4 <= nb; i += 4)
            for (int d = 0; d < hv; d += 32) group_sum_4_2(w + (size_t)i * n + at, nr, (size_t)n, vb, rb, d, acc + i * hs, hs);
        for (; i + 2 <= nb; i += 2)
            for (int d = 0; d < hv; d += 64) group_sum_2_4(w + (size_t)i * n + at, nr, (size_t)n, vb, rb, d, acc + i * hs, hs);
        for (; i < nb; i++) weighted_sum(w + (size_t)i * n + at, vb, 0, rb, nr, hv, acc + i * hs);
        at += nr;
    }
}

static void attn_group(const ei_attn_params *p, int nq, const float *q, size_t qs, float *out, size_t os,
                       double *scratch) {
    const int n = ei_attn_keys(p), hd = p->head_dim, hv = p->head_dim_v;
    if (p->k_type != EI_TYPE_F16 || p->v_type != EI_TYPE_F16 || hd % 16 || hv % 64) {
        for (int i = 0; i < nq; i++) attn(p, q + (size_t)i * qs, out + (size_t)i * os, scratch);
        return;
    }
    for (int i0 = 0; i0 < nq; i0 += 8) { /* eight queries at a time */
        const int nb = nq - i0 < 8 ? nq - i0 : 8;
        double *w = scratch;                                /* (nb, n) weights */
        float *sc = (float *)(scratch + (size_t)nb * n);    /* (nb, n) scores */
        static EI_THREAD_LOCAL double qT[EI_MAX_HEAD_DIM][8]; /* the queries as fp16 rounds them, transposed */
        for (int i = 0; i < 8; i++) {
            const float *qi = q + (size_t)(i0 + (i < nb ? i : 0)) * qs;
            for (int d = 0; d < hd; d += 16) {
                const __m512 x = _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(qi + d), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
                float f[16];
                _mm512_storeu_ps(f, x);
                for (int e = 0; e < 16; e++) qT[d + e][i] = f[e];
            }
        }
        group_scores(p, (const double (*)[8])qT, nb, n, sc);
        for (int i = 0; i < nb; i++) {
            double *wi = w + (size_t)i * n;
            round_weights(wi, n, softmax(sc + (size_t)i * n, n, wi), EI_TYPE_F16);
            ei_attn_track_weights(p, wi, n);
        }
        static EI_THREAD_LOCAL double acc[8 * EI_MAX_HEAD_DIM]; /* (nb, hv) */
        group_values(p, w, nb, n, acc);
        for (int ii = 0; ii < nb; ii++)
            for (int d = 0; d < hv; d += 8)
                _mm256_storeu_ps(out + (size_t)(i0 + ii) * os + d, _mm512_cvtpd_ps(_mm512_loadu_pd(acc + (size_t)ii * hv + d)));
    }
}

/* ---- a block of queries of several tokens (fp16 caches) --------------------------------------
 * Scores: one lane per query (the block's up to 8 in one vector, their dims transposed once),
 * each key's dims converted to double once and broadcast to every query; every lane adds its
 * exact products in order of d, as attn does. A key tile serves all the block's queries. The
 * values go as in attn_group, the queries of one token (the same keys) together. */

#define BLOCK_KEYS EI_ATTN_BLOCK_KEYS /* keys converted at a time */
static_assert(EI_ATTN_BLOCK_QUERIES == 8, "a block's queries fill one vector of doubles");

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
        for (; d + 16 <= hd; d += 16) {
            __m512d lo, hi;
            f16x16_pd(_mm256_loadu_si256((const __m256i *)(row + d)), &lo, &hi);
            _mm512_storeu_pd(out + d, lo);
            _mm512_storeu_pd(out + d + 8, hi);
        }
        for (; d < hd; d++) out[d] = f16_to_f32(row[d]);
    }
}

/* dots[j][i] = sum over d in order of qt[d][i] * kd[j][d] */
EI_INLINE void block_dots(const double *qt, const double *kd, int hd, double dots[BLOCK_KEYS][8]) {
    __m512d acc[BLOCK_KEYS];
    EI_UNROLL for (int j = 0; j < BLOCK_KEYS; j++) acc[j] = _mm512_setzero_pd();
    for (int d = 0; d < hd; d++) {
        const __m512d qv = _mm512_loadu_pd(qt + (size_t)d * 8);
        EI_UNROLL for (int j = 0; j < BLOCK_KEYS; j++) acc[j] = _mm512_fmadd_pd(qv, _mm512_set1_pd(kd[(size_t)j * hd + d]), acc[j]);
    }
    EI_UNROLL for (int j = 0; j < BLOCK_KEYS; j++) _mm512_storeu_pd(dots[j], acc[j]);
}

/* 128-bit lanes of a and b by imm, as vshuff64x2 (through its integer twin, which SIMDe has) */
#define lanes_pd(a, b, imm) _mm512_castsi512_pd(_mm512_shuffle_i64x2(_mm512_castpd_si512(a), _mm512_castpd_si512(b), imm))

/* r[i][j] <- r[j][i]: pairs of rows interleaved, then 128-bit lanes gathered twice */
EI_INLINE void transpose8_pd(__m512d r[8]) {
    __m512d t[8], u[8];
    EI_UNROLL for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm512_unpacklo_pd(r[2 * i], r[2 * i + 1]);     /* (0 1) of elements 0, 2, 4, 6 */
        t[2 * i + 1] = _mm512_unpackhi_pd(r[2 * i], r[2 * i + 1]); /* elements 1, 3, 5, 7 */
    }
    EI_UNROLL for (int h = 0; h < 2; h++) /* rows 4h .. 4h + 3 */
        EI_UNROLL for (int o = 0; o < 2; o++) {
            u[4 * h + 2 * o] = lanes_pd(t[4 * h + o], t[4 * h + 2 + o], 0x88);     /* elements o, 4 + o */
            u[4 * h + 2 * o + 1] = lanes_pd(t[4 * h + o], t[4 * h + 2 + o], 0xDD); /* 2 + o, 6 + o */
        }
    /* u[2o + k] (k 0, 1) holds elements o + 2k and o + 2k + 4 of rows 0..3, u[4 + ..] of rows 4..7 */
    EI_UNROLL for (int o = 0; o < 2; o++)
        EI_UNROLL for (int k = 0; k < 2; k++) {
            r[o + 2 * k] = lanes_pd(u[2 * o + k], u[4 + 2 * o + k], 0x88);
            r[o + 2 * k + 4] = lanes_pd(u[2 * o + k], u[4 + 2 * o + k], 0xDD);
        }
}

/* dots[j][i] of the block's queries (block_qt) with m keys from k */
static EI_THREAD_LOCAL double block_qt[EI_MAX_HEAD_DIM * 8]; /* (hd, 8): the queries as fp16 rounds them */
static void block_tile(const ei_attn_params *p, const uint8_t *k, int m, double dots[BLOCK_KEYS][8]) {
    static EI_THREAD_LOCAL double kd[BLOCK_KEYS * EI_MAX_HEAD_DIM];
    const int hd = p->head_dim;
    keys_to_double(k, p->k_row_bytes, hd, m, kd);
    switch (hd) { /* a constant row length: the 8 keys' offsets are immediates */
    case 64: block_dots(block_qt, kd, 64, dots); break;
    case 128: block_dots(block_qt, kd, 128, dots); break;
    case 256: block_dots(block_qt, kd, 256, dots); break;
    default: block_dots(block_qt, kd, hd, dots); break;
    }
}

/* out[i] = the weighted values for nb queries whose weights are n apart */
static void block_values(const ei_attn_params *sub, int nb, const double *w, int n, float *const *out) {
    static EI_THREAD_LOCAL double acc[4 * EI_MAX_HEAD_DIM]; /* (nb, hv) */
    const int hv = sub->head_dim_v;
    group_values(sub, w, nb, n, acc);
    for (int i = 0; i < nb; i++)
        for (int d = 0; d < hv; d += 8) _mm256_storeu_ps(out[i] + d, _mm512_cvtpd_ps(_mm512_loadu_pd(acc + (size_t)i * hv + d)));
}

static void attn_block(const ei_attn_params *p, int nq, const float *const *q, const int32_t *first,
                       const int32_t *end, float *const *out, ei_attn_run *room, double *scratch) {
    const int hd = p->head_dim, hv = p->head_dim_v;
    if (p->k_type != EI_TYPE_F16 || p->v_type != EI_TYPE_F16 || hv % 64 || nq > EI_ATTN_BLOCK_QUERIES) {
        ei_attn_block_by_query(p, nq, q, first, end, out, room, scratch, attn);
        return;
    }
    const float *ql[8];
    for (int l = 0; l < 8; l++) ql[l] = q[l < nq ? l : 0]; /* past nq: query 0 */
    int d = 0;
    for (; d + 8 <= hd; d += 8) { /* dims d .. d + 7 of the 8 queries, transposed */
        __m512d r[8];
        EI_UNROLL for (int l = 0; l < 8; l++)
            r[l] = _mm512_cvtps_pd(_mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(ql[l] + d), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
        transpose8_pd(r);
        EI_UNROLL for (int e = 0; e < 8; e++) _mm512_storeu_pd(block_qt + (size_t)(d + e) * 8, r[e]);
    }
    for (; d < hd; d++)
        for (int l = 0; l < 8; l++) block_qt[(size_t)d * 8 + l] = ei_attn_round_to(ql[l][d], EI_TYPE_F16);
    ei_attn_block_run(p, nq, first, end, out, room, scratch, block_tile, softmax, round_weights, block_values);
}

static void avx512_weighted_sum(const double *p, const uint8_t *v, int f32, size_t row_bytes, int n, int hv,
                                double *acc) {
    weighted_sum(p, v, f32, row_bytes, n, hv, acc);
}

static void avx512_dots_f16(const double *qd, const uint8_t *k, size_t row_bytes, int hd, int m, double *out) {
    for (int t = 0; t < m; t += 16)
        key_dots16_f16(qd, k + (size_t)t * row_bytes, row_bytes, hd, m - t < 16 ? m - t : 16, out + t);
}

void ei_avx512_attn_kernels(ei_kernels *k) {
    k->attn = attn;
    k->attn_softmax = softmax;
    k->attn_weighted_sum = avx512_weighted_sum;
    k->attn_group = attn_group;
    k->attn_block = attn_block;
    k->attn_types = EI_ATTN_ALL;
    k->attn_dots_f16 = avx512_dots_f16;
    k->attn_weighted_sum_q = weighted_sum_q;
}
