/* avx512 tiles of a matrix product: 4 weight rows against 4 activation rows at once.
 *
 * The 16 (row, column) pairs each get one vector of 32-bit lane sums per block (vpdpbusd, or
 * vpmaddubsw + vpdpwssd for K blocks); a transposing reduction turns the 16 vectors into one
 * whose lane 4r + c holds the exact isum of pair (r, c). The block terms are then formed
 * and added in double, lane by lane, in block order: each output is the reference's
 * vec_dot bit for bit. Smaller tiles repeat row 0 / column 0 and store only their part;
 * a single activation row (decoding) goes through vec_dot, which is memory-bound. */
#include <stddef.h>
#include <string.h>

#include "blocks.h"

/* ---- shared steps ------------------------------------------------------------------------ */

/* p[r][c] (16 lanes each) -> two vectors, lane 4r + c the sum of lanes 0..7 (first) and of
 * lanes 8..15 (second) of p[r][c]: the isums of blocks A and B of every pair */
EI_INLINE void reduce_pairs2(const __m512i p[4][4], __m512i *va, __m512i *vb) {
    __m512i y[4];
    EI_UNROLL for (int r = 0; r < 4; r++) {
        const __m512i x0 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[r][0], p[r][1]), _mm512_unpackhi_epi32(p[r][0], p[r][1]));
        const __m512i x1 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[r][2], p[r][3]), _mm512_unpackhi_epi32(p[r][2], p[r][3]));
        /* per 128-bit lane: the four columns' sums of that lane */
        y[r] = _mm512_add_epi32(_mm512_unpacklo_epi64(x0, x1), _mm512_unpackhi_epi64(x0, x1));
    }
    const __m512i a01 = _mm512_shuffle_i64x2(y[0], y[1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i a23 = _mm512_shuffle_i64x2(y[2], y[3], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i b01 = _mm512_shuffle_i64x2(y[0], y[1], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i b23 = _mm512_shuffle_i64x2(y[2], y[3], _MM_SHUFFLE(3, 2, 3, 2));
    *va = _mm512_add_epi32(_mm512_shuffle_i64x2(a01, a23, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_i64x2(a01, a23, _MM_SHUFFLE(3, 1, 3, 1)));
    *vb = _mm512_add_epi32(_mm512_shuffle_i64x2(b01, b23, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_i64x2(b01, b23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* p[r][c] -> one vector, lane 4r + c the sum of all 16 lanes of p[r][c] */
EI_INLINE __m512i reduce_pairs(const __m512i p[4][4]) {
    __m512i va, vb;
    reduce_pairs2(p, &va, &vb);
    return _mm512_add_epi32(va, vb);
}

/* m[r][h]: lanes 0..7 belong to column 2h, lanes 8..15 to column 2h + 1 -> lane 4r + c the
 * sum of the eight lanes of pair (r, c) */
EI_INLINE __m512i reduce_pairs_half(const __m512i m[4][2]) {
    __m512i u[4];
    EI_UNROLL for (int r = 0; r < 4; r++) u[r] = _mm512_add_epi32(_mm512_unpacklo_epi32(m[r][0], m[r][1]), _mm512_unpackhi_epi32(m[r][0], m[r][1]));
    const __m512i v01 = _mm512_add_epi32(_mm512_unpacklo_epi64(u[0], u[1]), _mm512_unpackhi_epi64(u[0], u[1]));
    const __m512i v23 = _mm512_add_epi32(_mm512_unpacklo_epi64(u[2], u[3]), _mm512_unpackhi_epi64(u[2], u[3]));
    const __m512i w = _mm512_add_epi32(_mm512_shuffle_i64x2(v01, v23, _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i64x2(v01, v23, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15), w);
}

/* the 16 pair products a[r] * b[c] of 4 row values and 4 column values, lane 4r + c, in two
 * halves (rows 0, 1 and rows 2, 3) */
EI_INLINE void pair_products(__m256d a, __m256d b, __m512d *lo, __m512d *hi) {
    const __m512d aa = _mm512_castpd256_pd512(a), bb = _mm512_broadcast_f64x4(b);
    *lo = _mm512_mul_pd(_mm512_permutexvar_pd(_mm512_setr_epi64(0, 0, 0, 0, 1, 1, 1, 1), aa), bb);
    *hi = _mm512_mul_pd(_mm512_permutexvar_pd(_mm512_setr_epi64(2, 2, 2, 2, 3, 3, 3, 3), aa), bb);
}

EI_INLINE __m512d cvt_lo(__m512i v) { return _mm512_cvtepi32_pd(_mm512_castsi512_si256(v)); }
EI_INLINE __m512d cvt_hi(__m512i v) { return _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(v, 1)); }

/* lane 4r + c of the two halves to s[c * ss + r], r < nr, c < nc */
EI_INLINE void store_tile(float *s, size_t ss, int nr, int nc, __m512d lo, __m512d hi) {
    float t[16];
    _mm256_storeu_ps(t, _mm512_cvtpd_ps(lo));
    _mm256_storeu_ps(t + 8, _mm512_cvtpd_ps(hi));
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < nr; r++) s[(size_t)c * ss + r] = t[4 * r + c];
}

/* 4 fp16 fields, one in each of 4 blocks, as doubles */
EI_INLINE __m256d f16x4(const uint8_t *const p[4], size_t off) {
    ei_f16 h[4];
    EI_UNROLL for (int i = 0; i < 4; i++) memcpy(&h[i], p[i] + off, 2);
    return _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)h)));
}

/* ---- legacy blocks ----------------------------------------------------------------------- */

/* one tile over all blocks; BT/AT the weight and activation block types. Blocks go in pairs
 * (A, B); an odd count ends with a pair padded by zero blocks, which add exact zeros. */
#define TILE_LEGACY(NAME, BT, AT, UNPACK, OFFSET, HAS_MIN, MINF, SUMF)                                  \
    EI_INLINE void NAME##_pair(const uint8_t *const xr[4], const uint8_t *const ya[4], int vnni,        \
                               __m512d *acc_lo, __m512d *acc_hi) {                                       \
        __m512i u[4], a[4], corr[4], p[4][4];                                                           \
        EI_UNROLL for (int r = 0; r < 4; r++) u[r] = UNPACK((const BT *)xr[r]);                                   \
        EI_UNROLL for (int c = 0; c < 4; c++) {                                                                   \
            const AT *yb = (const AT *)ya[c];                                                           \
            a[c] = bytes2(yb[0].qs, yb[1].qs);                                                          \
            corr[c] = _mm512_setzero_si512();                                                           \
            if (OFFSET) /* -offset * sum(a), lane by lane: the offsets of u come back out */            \
                corr[c] = _mm512_sub_epi32(_mm512_setzero_si512(),                                      \
                                           dot_u8s8(_mm512_setzero_si512(), _mm512_set1_epi8((char)(OFFSET)), a[c], vnni)); \
        }                                                                                               \
        EI_UNROLL for (int r = 0; r < 4; r++)                                                                     \
            EI_UNROLL for (int c = 0; c < 4; c++) p[r][c] = dot_u8s8(corr[c], u[r], a[c], vnni);                  \
        __m512i v[2];                                                                                   \
        reduce_pairs2(p, &v[0], &v[1]);                                                                 \
        EI_UNROLL for (int b = 0; b < 2; b++) {                                                                   \
            const size_t ox = (size_t)b * sizeof(BT), oy = (size_t)b * sizeof(AT);                      \
            const uint8_t *const xo[4] = {xr[0] + ox, xr[1] + ox, xr[2] + ox, xr[3] + ox};              \
            const uint8_t *const yo[4] = {ya[0] + oy, ya[1] + oy, ya[2] + oy, ya[3] + oy};              \
            __m512d s_lo, s_hi;                                                                         \
            pair_products(f16x4(xo, offsetof(BT, d)), f16x4(yo, offsetof(AT, d)), &s_lo, &s_hi);        \
            if (HAS_MIN) { /* d_w d_x isum + m s, rounded once, then added */                           \
                __m512d m_lo, m_hi;                                                                     \
                pair_products(f16x4(xo, offsetof(BT, MINF)), f16x4(yo, offsetof(AT, SUMF)), &m_lo, &m_hi); \
                *acc_lo = _mm512_add_pd(*acc_lo, _mm512_fmadd_pd(cvt_lo(v[b]), s_lo, m_lo));           \
                *acc_hi = _mm512_add_pd(*acc_hi, _mm512_fmadd_pd(cvt_hi(v[b]), s_hi, m_hi));           \
            } else { /* (d_w d_x) isum is exact: one rounding, where the reference adds */             \
                *acc_lo = _mm512_fmadd_pd(cvt_lo(v[b]), s_lo, *acc_lo);                                 \
                *acc_hi = _mm512_fmadd_pd(cvt_hi(v[b]), s_hi, *acc_hi);                                 \
            }                                                                                           \
        }                                                                                               \
    }                                                                                                   \
    EI_INLINE void NAME##_impl(int n, int nr, int nc, float *s, size_t ss, const void *vx, size_t xs,   \
                               const void *vy, size_t ys, int vnni) {                                   \
        const int nb = n / 32;                                                                          \
        __m512d acc_lo = _mm512_setzero_pd(), acc_hi = _mm512_setzero_pd();                             \
        const uint8_t *xr[4], *ya[4];                                                                   \
        EI_UNROLL for (int i = 0; i < 4; i++) {                                                                   \
            xr[i] = (const uint8_t *)vx + (size_t)(i < nr ? i : 0) * xs;                                \
            ya[i] = (const uint8_t *)vy + (size_t)(i < nc ? i : 0) * ys;                                \
        }                                                                                               \
        int i = 0;                                                                                      \
        for (; i + 2 <= nb; i += 2) {                                                                   \
            const uint8_t *const xi[4] = {xr[0] + i * sizeof(BT), xr[1] + i * sizeof(BT),              \
                                          xr[2] + i * sizeof(BT), xr[3] + i * sizeof(BT)};              \
            const uint8_t *const yi[4] = {ya[0] + i * sizeof(AT), ya[1] + i * sizeof(AT),              \
                                          ya[2] + i * sizeof(AT), ya[3] + i * sizeof(AT)};              \
            NAME##_pair(xi, yi, vnni, &acc_lo, &acc_hi);                                                \
        }                                                                                               \
        if (i < nb) {                                                                                   \
            BT xp[4][2]; AT yp[4][2];                                                                   \
            memset(xp, 0, sizeof(xp)); memset(yp, 0, sizeof(yp));                                       \
            EI_UNROLL for (int r = 0; r < 4; r++) {                                                               \
                memcpy(&xp[r][0], xr[r] + i * sizeof(BT), sizeof(BT));                                  \
                memcpy(&yp[r][0], ya[r] + i * sizeof(AT), sizeof(AT));                                  \
            }                                                                                           \
            const uint8_t *const xi[4] = {(uint8_t *)xp[0], (uint8_t *)xp[1], (uint8_t *)xp[2], (uint8_t *)xp[3]}; \
            const uint8_t *const yi[4] = {(uint8_t *)yp[0], (uint8_t *)yp[1], (uint8_t *)yp[2], (uint8_t *)yp[3]}; \
            NAME##_pair(xi, yi, vnni, &acc_lo, &acc_hi);                                                \
        }                                                                                               \
        store_tile(s, ss, nr, nc, acc_lo, acc_hi);                                                      \
    }

TILE_LEGACY(tile_q4_0, block_q4_0, block_q8_0, unpack2_q4_0, OFFSET_Q4_0, 0, d, d)
TILE_LEGACY(tile_q5_0, block_q5_0, block_q8_0, unpack2_q5_0, OFFSET_Q5_0, 0, d, d)
TILE_LEGACY(tile_q8_0, block_q8_0, block_q8_0, unpack2_q8_0, OFFSET_Q8_0, 0, d, d)
TILE_LEGACY(tile_q4_1, block_q4_1, block_q8_1, unpack2_q4_1, 0, 1, m, s)
TILE_LEGACY(tile_q5_1, block_q5_1, block_q8_1, unpack2_q5_1, 0, 1, m, s)

/* ---- K blocks ---------------------------------------------------------------------------- */

#define TILE_K(NAME, BT, UNPACK, MIN_SCALED)                                                             \
    EI_INLINE void NAME##_impl(int n, int nr, int nc, float *s, size_t ss, const void *vx, size_t xs,   \
                               const void *vy, size_t ys, int vnni) {                                   \
        __m512d acc_lo = _mm512_setzero_pd(), acc_hi = _mm512_setzero_pd();                             \
        const BT *xr[4]; const block_q8_K *ya[4];                                                       \
        EI_UNROLL for (int i = 0; i < 4; i++) {                                                                   \
            xr[i] = (const BT *)((const uint8_t *)vx + (size_t)(i < nr ? i : 0) * xs);                  \
            ya[i] = (const block_q8_K *)((const uint8_t *)vy + (size_t)(i < nc ? i : 0) * ys);          \
        }                                                                                               \
        for (int i = 0; i < n / QK_K; i++) {                                                            \
            kblock w[4];                                                                                \
            EI_UNROLL for (int r = 0; r < 4; r++) UNPACK(&w[r], &xr[r][i]);                                       \
            __m512i p[4][4];                                                                            \
            EI_UNROLL for (int r = 0; r < 4; r++)                                                                 \
                EI_UNROLL for (int c = 0; c < 4; c++) p[r][c] = _mm512_setzero_si512();                           \
            EI_UNROLL for (int q = 0; q < 4; q++) {                                                               \
                __m512i a[4];                                                                           \
                EI_UNROLL for (int c = 0; c < 4; c++) a[c] = _mm512_loadu_si512((const void *)(ya[c][i].qs + 64 * q)); \
                EI_UNROLL for (int r = 0; r < 4; r++)                                                             \
                    EI_UNROLL for (int c = 0; c < 4; c++)                                                         \
                        p[r][c] = dot_s16(p[r][c], _mm512_maddubs_epi16(w[r].u[q], a[c]), w[r].sw[q], vnni); \
            }                                                                                           \
            __m512i m[4][2];                                                                            \
            EI_UNROLL for (int h = 0; h < 2; h++) {                                                               \
                const __m512i bs = _mm512_inserti64x4(                                                  \
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)ya[2 * h][i].bsums)),    \
                    _mm256_loadu_si256((const __m256i *)ya[2 * h + 1][i].bsums), 1);                    \
                EI_UNROLL for (int r = 0; r < 4; r++)                                                             \
                    m[r][h] = _mm512_madd_epi16(bs, _mm512_broadcast_i64x4(w[r].coef));                 \
            }                                                                                           \
            __m512i isum = reduce_pairs(p);                                                             \
            const __m512i icorr = reduce_pairs_half(m);                                                 \
            if (!MIN_SCALED) isum = _mm512_sub_epi32(isum, icorr);                                      \
            const __m256d dw = _mm256_cvtps_pd(_mm_setr_ps(w[0].d, w[1].d, w[2].d, w[3].d));            \
            const __m256d dy = _mm256_cvtps_pd(_mm_setr_ps(ya[0][i].d, ya[1][i].d, ya[2][i].d, ya[3][i].d)); \
            __m512d s_lo, s_hi;                                                                         \
            pair_products(dw, dy, &s_lo, &s_hi); /* (double)d_x * d_w: exact */                          \
            __m512d t_lo = _mm512_mul_pd(s_lo, cvt_lo(isum)), t_hi = _mm512_mul_pd(s_hi, cvt_hi(isum));  \
            if (MIN_SCALED) {                                                                           \
                const __m256d dm = _mm256_cvtps_pd(_mm_setr_ps(w[0].dmin, w[1].dmin, w[2].dmin, w[3].dmin)); \
                __m512d m_lo, m_hi;                                                                     \
                pair_products(dm, dy, &m_lo, &m_hi);                                                    \
                t_lo = _mm512_sub_pd(t_lo, _mm512_mul_pd(m_lo, cvt_lo(icorr)));                         \
                t_hi = _mm512_sub_pd(t_hi, _mm512_mul_pd(m_hi, cvt_hi(icorr)));                         \
            }                                                                                           \
            acc_lo = _mm512_add_pd(acc_lo, t_lo);                                                       \
            acc_hi = _mm512_add_pd(acc_hi, t_hi);                                                       \
        }                                                                                               \
        store_tile(s, ss, nr, nc, acc_lo, acc_hi);                                                      \
    }

TILE_K(tile_q2_K, block_q2_K, unpack_q2_K, 1)
TILE_K(tile_q3_K, block_q3_K, unpack_q3_K, 0)
TILE_K(tile_q4_K, block_q4_K, unpack_q4_K, 1)
TILE_K(tile_q5_K, block_q5_K, unpack_q5_K, 1)
TILE_K(tile_q6_K, block_q6_K, unpack_q6_K, 0)

/* ---- the table --------------------------------------------------------------------------- */

/* one activation row (decoding): the weight rows one by one through vec_dot */
EI_INLINE void rows_by_dot(int type, int vnni, int n, int nr, float *s, const void *x, size_t xs, const void *y) {
    const ei_vec_dot_fn dot = ei_avx512_vec_dot(type, vnni);
    for (int r = 0; r < nr; r++) dot(n, &s[r], (const uint8_t *)x + (size_t)r * xs, y);
}

#define GEMM(T, TYPE)                                                                                    \
    static void gemm_##T##_vnni(int n, int nr, int nc, float *s, size_t ss, const void *x, size_t xs,    \
                                const void *y, size_t ys) {                                              \
        if (nc == 1) rows_by_dot(TYPE, 1, n, nr, s, x, xs, y);                               \
        else tile_##T##_impl(n, nr, nc, s, ss, x, xs, y, ys, 1);                                         \
    }                                                                                                    \
    static void gemm_##T(int n, int nr, int nc, float *s, size_t ss, const void *x, size_t xs,           \
                         const void *y, size_t ys) {                                                     \
        if (nc == 1) rows_by_dot(TYPE, 0, n, nr, s, x, xs, y);                               \
        else tile_##T##_impl(n, nr, nc, s, ss, x, xs, y, ys, 0);                                         \
    }
GEMM(q4_0, EI_TYPE_Q4_0)
GEMM(q4_1, EI_TYPE_Q4_1)
GEMM(q5_0, EI_TYPE_Q5_0)
GEMM(q5_1, EI_TYPE_Q5_1)
GEMM(q8_0, EI_TYPE_Q8_0)
GEMM(q2_K, EI_TYPE_Q2_K)
GEMM(q3_K, EI_TYPE_Q3_K)
GEMM(q4_K, EI_TYPE_Q4_K)
GEMM(q5_K, EI_TYPE_Q5_K)
GEMM(q6_K, EI_TYPE_Q6_K)

void ei_avx512_gemm_kernels(ei_kernels *k, int vnni) {
#define SET(T, TYPE) k->gemm[TYPE] = vnni ? gemm_##T##_vnni : gemm_##T
    SET(q4_0, EI_TYPE_Q4_0);
    SET(q4_1, EI_TYPE_Q4_1);
    SET(q5_0, EI_TYPE_Q5_0);
    SET(q5_1, EI_TYPE_Q5_1);
    SET(q8_0, EI_TYPE_Q8_0);
    SET(q2_K, EI_TYPE_Q2_K);
    SET(q3_K, EI_TYPE_Q3_K);
    SET(q4_K, EI_TYPE_Q4_K);
    SET(q5_K, EI_TYPE_Q5_K);
    SET(q6_K, EI_TYPE_Q6_K);
#undef SET
}
