/* avx512 tiles of a matrix product: 4 weight rows against 4 activation rows at once.
 *
 * The 16 (row, column) pairs each get one vector of 32-bit lane sums per block (vpdpbusd, or
 * vpmaddubsw + vpdpwssd for K blocks); a transposing reduction turns the 16 vectors into one
 * whose lane 4r + c holds the exact isum of pair (r, c). The block terms are then formed
 * and added in double, lane by lane, in block order: each output is the reference's
 * vec_dot bit for bit. Smaller tiles repeat row 0 / column 0 and store only their part.
 * A single activation row (decoding) is memory-bound: legacy types read 4 weight rows per
 * pass with the rows' sums in 4 lanes; K types go through vec_dot row by row. Q4_0, Q4_1,
 * Q5_0 and Q8_0 matrices mostly arrive as the engine's interleaved copies instead (gemm_x16,
 * below), as do Q4_K and Q6_K. */
#include <stddef.h>
#include <string.h>

#include "blocks.h"

/* how many interleaved blocks ahead a decoding step prefetches, into L2 (prefetcht1): on the
 * Sapphire Rapids Xeon (2 threads, tg64, alternating builds) the random 3B Q4_0 model went
 * 12.5-13.0 tok/s with prefetcht0 48 blocks ahead -> 13.5-14.5 with prefetcht1 at 12, 24, 48
 * or 96, the 1.1B Q4_0 34-36 -> 39-40, Gemma 89-90 -> 95-101 (prefetchnta: 7.7). The AVX-512
 * EPYC's rows in the README were measured with prefetcht0 48 ahead. */
#define EI_X16_PREFETCH 24



/* ---- shared steps ------------------------------------------------------------------------ */

/* touches the part [lo, hi) of the span of the next rows (from x + span on) that the
 * current position corresponds to: decoding reads several interleaved row streams, which the
 * hardware prefetchers follow poorly */
EI_INLINE void prefetch_span(const uint8_t *x, size_t span, size_t lo, size_t hi) {
    for (size_t off = lo & ~(size_t)63; off < hi; off += 64) _mm_prefetch((const char *)x + span + off, _MM_HINT_T0);
}

/* per 128-bit lane k: the sums of lane k of v[0..3], c = 0..3 in dwords 0..3. With packed,
 * for lane values below 2^14 in magnitude: two vpackssdw / vpmaddwd rounds, exact (nothing
 * saturates) and cheaper than unpacking */
EI_INLINE __m512i row_sums(const __m512i v[4], int packed) {
    if (packed) {
        const __m512i ones = _mm512_set1_epi16(1);
        const __m512i m0 = _mm512_madd_epi16(_mm512_packs_epi32(v[0], v[1]), ones);
        const __m512i m1 = _mm512_madd_epi16(_mm512_packs_epi32(v[2], v[3]), ones);
        return _mm512_madd_epi16(_mm512_packs_epi32(m0, m1), ones);
    }
    const __m512i x0 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
    const __m512i x1 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(x0, x1), _mm512_unpackhi_epi64(x0, x1));
}

/* y[r] = row_sums(p[r]) for r = 0..3 -> two vectors, lane
 * 4r + c the sum over lanes 0, 1 (first) and over lanes 2, 3 (second): for p[r][c] holding
 * blocks A and B in its halves, the isums of A and B of every pair */
EI_INLINE void lanes_to_pairs(const __m512i y[4], __m512i *va, __m512i *vb) {
    const __m512i a01 = _mm512_shuffle_i64x2(y[0], y[1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i a23 = _mm512_shuffle_i64x2(y[2], y[3], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i b01 = _mm512_shuffle_i64x2(y[0], y[1], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i b23 = _mm512_shuffle_i64x2(y[2], y[3], _MM_SHUFFLE(3, 2, 3, 2));
    *va = _mm512_add_epi32(_mm512_shuffle_i64x2(a01, a23, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_i64x2(a01, a23, _MM_SHUFFLE(3, 1, 3, 1)));
    *vb = _mm512_add_epi32(_mm512_shuffle_i64x2(b01, b23, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_i64x2(b01, b23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* p[r][c] -> one vector, lane 4r + c the sum of all 16 lanes of p[r][c] */
EI_INLINE __m512i reduce_pairs(const __m512i p[4][4]) {
    __m512i y[4], va, vb;
    EI_UNROLL for (int r = 0; r < 4; r++) y[r] = row_sums(p[r], 0);
    lanes_to_pairs(y, &va, &vb);
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

/* ---- legacy blocks ----------------------------------------------------------------------- */

/* offset * (sum of each block of a[0..3]), blocks A and B in the halves of a[j]: lanes 0..3
 * hold block A's four sums, lanes 8..11 block B's */
EI_INLINE __m512i offset_sums(const __m512i a[4], int offset, int packed, int vnni) {
    __m512i s[4];
    EI_UNROLL for (int j = 0; j < 4; j++) s[j] = dot_u8s8(_mm512_setzero_si512(), _mm512_set1_epi8((char)offset), a[j], vnni);
    const __m512i y = row_sums(s, packed);
    return _mm512_add_epi32(y, _mm512_shuffle_i64x2(y, y, _MM_SHUFFLE(2, 3, 0, 1)));
}

/* the fp16 fields at base + off[j], j < 8, as doubles */
EI_INLINE __m512d f16_gather8(const uint8_t *base, __m256i off) {
    const __m256i g = _mm256_i32gather_epi32((const int *)base, off, 1);
    return _mm512_cvtps_pd(_mm256_cvtph_ps(_mm256_cvtepi32_epi16(g)));
}

/* lanes (b, i) = b * block + i * stride for 2 blocks and 4 rows */
EI_INLINE __m256i offsets2x4(size_t block, const int stride[4]) {
    const __m256i i4 = _mm256_setr_epi32(stride[0], stride[1], stride[2], stride[3], stride[0], stride[1], stride[2], stride[3]);
    return _mm256_add_epi32(i4, _mm256_setr_epi32(0, 0, 0, 0, (int)block, (int)block, (int)block, (int)block));
}

/* pair products of 8 row values w (lanes (b, r)) and 8 column values x (lanes (b, c)) for
 * block b, lane 4r + c, rows 0, 1 (lo) and 2, 3 (hi) */
EI_INLINE void block_products(__m512d w, __m512d x, int b, __m512d *lo, __m512d *hi) {
    const __m512d xb = _mm512_permutexvar_pd(_mm512_add_epi64(_mm512_setr_epi64(0, 1, 2, 3, 0, 1, 2, 3), _mm512_set1_epi64(4 * b)), x);
    *lo = _mm512_mul_pd(_mm512_permutexvar_pd(_mm512_add_epi64(_mm512_set1_epi64(4 * b), _mm512_setr_epi64(0, 0, 0, 0, 1, 1, 1, 1)), w), xb);
    *hi = _mm512_mul_pd(_mm512_permutexvar_pd(_mm512_add_epi64(_mm512_set1_epi64(4 * b), _mm512_setr_epi64(2, 2, 2, 2, 3, 3, 3, 3)), w), xb);
}

/* 16 fp16 fields at base + off[j] as doubles, lanes 0..7 and 8..15 */
EI_INLINE void f16_gather16(const uint8_t *base, __m512i off, __m512d out[2]) {
    const __m512 f = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(off, (const void *)base, 1)));
    out[0] = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
    out[1] = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
}

/* Tiles and 4-row decoding for one legacy type. BT/AT: weight and activation block types;
 * OFFSET: of the unsigned weight bytes; PACKED: lane sums fit the packed reduction (all but
 * Q8_0); MINF/SUMF: the _1 types' minimum and activation-sum fields. */
#define LEGACY(T, BT, AT, UNPACK, OFFSET, PACKED, HAS_MIN, MINF, SUMF)                                    \
    /* two blocks (A at x + xo[r], B right after) of 4 rows x 4 columns, added to acc */                  \
    EI_INLINE void T##_tile2(const uint8_t *x, const int xo[4], const uint8_t *y, const int yo[4], int vnni, \
                             __m512d *acc_lo, __m512d *acc_hi) {                                          \
        __m512i u[4], a[4], p[4][4], col[4];                                                              \
        EI_UNROLL for (int r = 0; r < 4; r++) u[r] = UNPACK((const BT *)(x + xo[r]));                      \
        EI_UNROLL for (int c = 0; c < 4; c++) {                                                           \
            const AT *yb = (const AT *)(y + yo[c]);                                                       \
            a[c] = bytes2(yb[0].qs, yb[1].qs);                                                            \
        }                                                                                                 \
        EI_UNROLL for (int r = 0; r < 4; r++)                                                             \
            EI_UNROLL for (int c = 0; c < 4; c++) p[r][c] = dot_u8s8(_mm512_setzero_si512(), u[r], a[c], vnni); \
        EI_UNROLL for (int r = 0; r < 4; r++) col[r] = row_sums(p[r], PACKED);                            \
        __m512i v[2];                                                                                     \
        lanes_to_pairs(col, &v[0], &v[1]);                                                                \
        if (OFFSET) { /* the weights' offset times each column's block sums, out of every row */         \
            const __m512i o = offset_sums(a, OFFSET, PACKED, vnni);                                       \
            v[0] = _mm512_sub_epi32(v[0], _mm512_shuffle_i64x2(o, o, _MM_SHUFFLE(0, 0, 0, 0)));           \
            v[1] = _mm512_sub_epi32(v[1], _mm512_shuffle_i64x2(o, o, _MM_SHUFFLE(2, 2, 2, 2)));           \
        }                                                                                                 \
        const __m256i xoff = offsets2x4(sizeof(BT), xo), yoff = offsets2x4(sizeof(AT), yo);              \
        const __m512d dw = f16_gather8(x + offsetof(BT, d), xoff), dx = f16_gather8(y + offsetof(AT, d), yoff); \
        __m512d mw = dw, sx = dx;                                                                         \
        if (HAS_MIN) { mw = f16_gather8(x + offsetof(BT, MINF), xoff); sx = f16_gather8(y + offsetof(AT, SUMF), yoff); } \
        EI_UNROLL for (int b = 0; b < 2; b++) {                                                           \
            __m512d s_lo, s_hi;                                                                           \
            block_products(dw, dx, b, &s_lo, &s_hi);                                                      \
            if (HAS_MIN) { /* d_w d_x isum + m s, rounded once, then added */                             \
                __m512d m_lo, m_hi;                                                                       \
                block_products(mw, sx, b, &m_lo, &m_hi);                                                  \
                *acc_lo = _mm512_add_pd(*acc_lo, _mm512_fmadd_pd(cvt_lo(v[b]), s_lo, m_lo));             \
                *acc_hi = _mm512_add_pd(*acc_hi, _mm512_fmadd_pd(cvt_hi(v[b]), s_hi, m_hi));             \
            } else { /* (d_w d_x) isum is exact: one rounding, where the reference adds */               \
                *acc_lo = _mm512_fmadd_pd(cvt_lo(v[b]), s_lo, *acc_lo);                                   \
                *acc_hi = _mm512_fmadd_pd(cvt_hi(v[b]), s_hi, *acc_hi);                                   \
            }                                                                                             \
        }                                                                                                 \
    }                                                                                                     \
    EI_INLINE void tile_##T##_impl(int n, int nr, int nc, float *s, size_t ss, const void *vx, size_t xs,  \
                                   const void *vy, size_t ys, int vnni) {                                 \
        const int nb = n / 32;                                                                            \
        const uint8_t *x = vx, *y = vy;                                                                   \
        int xo[4], yo[4];                                                                                 \
        EI_UNROLL for (int i = 0; i < 4; i++) {                                                           \
            xo[i] = (int)((size_t)(i < nr ? i : 0) * xs);                                                 \
            yo[i] = (int)((size_t)(i < nc ? i : 0) * ys);                                                 \
        }                                                                                                 \
        __m512d acc_lo = _mm512_setzero_pd(), acc_hi = _mm512_setzero_pd();                               \
        int i = 0;                                                                                        \
        for (; i + 2 <= nb; i += 2) T##_tile2(x + i * sizeof(BT), xo, y + i * sizeof(AT), yo, vnni, &acc_lo, &acc_hi); \
        if (i < nb) { /* the last block, paired with zero blocks that add exact zeros */                  \
            BT xp[4][2]; AT yp[4][2];                                                                     \
            memset(xp, 0, sizeof(xp)); memset(yp, 0, sizeof(yp));                                         \
            int po[4], qo[4];                                                                             \
            EI_UNROLL for (int r = 0; r < 4; r++) {                                                       \
                memcpy(&xp[r][0], x + xo[r] + i * sizeof(BT), sizeof(BT));                                 \
                memcpy(&yp[r][0], y + yo[r] + i * sizeof(AT), sizeof(AT));                                 \
                po[r] = (int)(r * sizeof(xp[0])); qo[r] = (int)(r * sizeof(yp[0]));                         \
            }                                                                                             \
            T##_tile2((const uint8_t *)xp, po, (const uint8_t *)yp, qo, vnni, &acc_lo, &acc_hi);          \
        }                                                                                                 \
        store_tile(s, ss, nr, nc, acc_lo, acc_hi);                                                        \
    }                                                                                                     \
    /* one activation row, 4 weight rows: 8 blocks at a time, the rows' sums in 4 lanes */                \
    EI_INLINE void rows4_##T##_impl(int n, int nr, float *s, const void *vx, size_t xs, const void *vy, int vnni) { \
        const int nb = n / 32;                                                                            \
        const uint8_t *x = vx;                                                                            \
        const AT *y = vy;                                                                                 \
        int xo[4];                                                                                        \
        EI_UNROLL for (int r = 0; r < 4; r++) xo[r] = (int)((size_t)(r < nr ? r : 0) * xs);               \
        __m256d acc = _mm256_setzero_pd();                                                                \
        for (int i = 0; i < nb; i += 8) {                                                                 \
            const int cnt = nb - i < 8 ? nb - i : 8;                                                      \
            prefetch_span(x, 4 * xs, 4 * xs * (size_t)i / (size_t)nb, 4 * xs * (size_t)(i + cnt) / (size_t)nb); \
            BT xp[4][2]; AT yp[2];                                                                        \
            __m512i a[4], p[4][4], col[4];                                                                \
            const AT *yb = y + i;                                                                         \
            const uint8_t *xb[4];                                                                         \
            EI_UNROLL for (int k = 0; k < 4; k++) {                                                       \
                /* pair k: blocks 2k, 2k + 1; a lone last block gets a zero partner; pairs past the   \
                 * end repeat the pair before (nothing past the row is read) and are not added */     \
                if (2 * k < cnt) {                                                                        \
                    yb = y + i + 2 * k;                                                                   \
                    EI_UNROLL for (int r = 0; r < 4; r++) xb[r] = x + xo[r] + (size_t)(i + 2 * k) * sizeof(BT); \
                    if (2 * k + 1 == cnt) {                                                               \
                        memset(xp, 0, sizeof(xp)); memset(yp, 0, sizeof(yp));                             \
                        yp[0] = yb[0];                                                                    \
                        EI_UNROLL for (int r = 0; r < 4; r++) { memcpy(&xp[r][0], xb[r], sizeof(BT)); xb[r] = (const uint8_t *)xp[r]; } \
                        yb = yp;                                                                          \
                    }                                                                                     \
                }                                                                                         \
                a[k] = bytes2(yb[0].qs, yb[1].qs);                                                        \
                /* p[k][r]: the reduction's "rows" are pairs of blocks, its "columns" weight rows */   \
                EI_UNROLL for (int r = 0; r < 4; r++) p[k][r] = dot_u8s8(_mm512_setzero_si512(), UNPACK((const BT *)xb[r]), a[k], vnni); \
            }                                                                                             \
            EI_UNROLL for (int k = 0; k < 4; k++) col[k] = row_sums(p[k], PACKED);                        \
            __m512i va, vb; /* lane 4k + r: block 2k (va) or 2k + 1 (vb) of row r */                      \
            lanes_to_pairs(col, &va, &vb);                                                                \
            if (OFFSET) { /* the offset times the sums of block 2k (lane k) and 2k + 1 (lane 8 + k) */   \
                const __m512i o = offset_sums(a, OFFSET, PACKED, vnni);                                   \
                va = _mm512_sub_epi32(va, _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), o)); \
                vb = _mm512_sub_epi32(vb, _mm512_permutexvar_epi32(_mm512_setr_epi32(8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11), o)); \
            }                                                                                             \
            /* blocks in order, four rows each: 0..3 in z[0], 4..7 in z[1] */                            \
            const __m512i z[2] = {                                                                        \
                _mm512_permutex2var_epi32(va, _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23), vb), \
                _mm512_permutex2var_epi32(va, _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31), vb)}; \
            EI_UNROLL for (int h = 0; h < 2; h++) {                                                       \
                /* lanes (b, r): blocks 4h..4h+3 (clamped to the row), rows 0..3 */                        \
                const __m512i blk = _mm512_add_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), _mm512_set1_epi32(4 * h)); \
                const __m512i bo = _mm512_add_epi32(_mm512_min_epi32(blk, _mm512_set1_epi32(cnt - 1)), _mm512_set1_epi32(i)); \
                const __m512i xoff = _mm512_add_epi32(_mm512_mullo_epi32(bo, _mm512_set1_epi32((int)sizeof(BT))), \
                                                      _mm512_setr_epi32(xo[0], xo[1], xo[2], xo[3], xo[0], xo[1], xo[2], xo[3], \
                                                                        xo[0], xo[1], xo[2], xo[3], xo[0], xo[1], xo[2], xo[3])); \
                const __m512i yoff = _mm512_mullo_epi32(bo, _mm512_set1_epi32((int)sizeof(AT)));           \
                __m512d w2[2], x2[2], m2[2], s2[2];                                                       \
                f16_gather16(x + offsetof(BT, d), xoff, w2);                                              \
                f16_gather16((const uint8_t *)y + offsetof(AT, d), yoff, x2);                             \
                if (HAS_MIN) {                                                                            \
                    f16_gather16(x + offsetof(BT, MINF), xoff, m2);                                       \
                    f16_gather16((const uint8_t *)y + offsetof(AT, SUMF), yoff, s2);                      \
                }                                                                                         \
                EI_UNROLL for (int q = 0; q < 2; q++) {                                                   \
                    const __m512d isum = q ? cvt_hi(z[h]) : cvt_lo(z[h]);                                 \
                    const __m512d scale = _mm512_mul_pd(w2[q], x2[q]);                                    \
                    const __m512d term = HAS_MIN ? _mm512_fmadd_pd(isum, scale, _mm512_mul_pd(m2[q], s2[q])) \
                                                 : _mm512_mul_pd(isum, scale);                            \
                    const int b0 = 4 * h + 2 * q; /* the two blocks of this half, in order */             \
                    if (b0 < cnt) acc = _mm256_add_pd(acc, _mm512_castpd512_pd256(term));                 \
                    if (b0 + 1 < cnt) acc = _mm256_add_pd(acc, _mm512_extractf64x4_pd(term, 1));          \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
        float t[4];                                                                                       \
        _mm_storeu_ps(t, _mm256_cvtpd_ps(acc));                                                           \
        for (int r = 0; r < nr; r++) s[r] = t[r];                                                         \
    }

LEGACY(q4_0, block_q4_0, block_q8_0, unpack2_q4_0, OFFSET_Q4_0, 1, 0, d, d)
LEGACY(q5_0, block_q5_0, block_q8_0, unpack2_q5_0, OFFSET_Q5_0, 1, 0, d, d)
LEGACY(q8_0, block_q8_0, block_q8_0, unpack2_q8_0, OFFSET_Q8_0, 0, 0, d, d)
LEGACY(q4_1, block_q4_1, block_q8_1, unpack2_q4_1, 0, 1, 1, m, s)
LEGACY(q5_1, block_q5_1, block_q8_1, unpack2_q5_1, 0, 1, 1, m, s)

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

/* ---- Q4_0, Q4_1, Q5_0 and Q8_0 rows interleaved by 16 (the engine's copies) ---------------- */

/* Activation rows an interleaved product takes at once: 8 columns' accumulators (16 zmm) and
 * a block's 8 weight vectors fit the 32 registers, and a block is unpacked once for all 8 */
#define X16_TILE 8
static_assert(X16_TILE <= EI_X16_TILE_MAX, "the x16 tile fits the engine's");

#define X16_CASES(KERNEL, ...) EI_X16_CASES(X16_TILE, KERNEL, __VA_ARGS__)

/* acc + the sums of four u8 x s8 products per lane, for u below 32 (no 16-bit sum saturates,
 * so vpmaddubsw + vpmaddwd is exact where there is no VNNI) */
EI_INLINE __m512i dot_nibbles(__m512i acc, __m512i u, __m512i s, int vnni) {
    if (vnni) return _mm512_dpbusd_epi32(acc, u, s);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
}

EI_INLINE __m512i bcast4(const void *p) {
    int32_t a;
    memcpy(&a, p, 4);
    return _mm512_set1_epi32(a);
}

/* the sum of the 32 int8 values of a block */
EI_INLINE int block_sum_q8(const int8_t *qs) {
    const __m256i biased = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)qs), _mm256_set1_epi8((char)0x80));
    const __m256i sad = _mm256_sad_epu8(biased, _mm256_setzero_si256()); /* 4 sums of (q + 128) */
    __m128i t = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
    t = _mm_add_epi64(t, _mm_unpackhi_epi64(t, t));
    return _mm_cvtsi128_si32(t) - 32 * 128;
}

/* the fifth bits of 16 rows' 4 bytes (block_q5_0x16's, block_q5_Kx16's qh) under the nibbles
 * of w (w[k]: values 4k..4k+3, w[4 + k]: 16 + 4k..): bit k of each byte to bit 4 of w[k],
 * bit 4 + k to that of w[4 + k]; the 16-bit shifts move no other byte's bit to bit 4 */
EI_INLINE void or_fifth_bits(__m512i qh, __m512i *w) {
    const __m512i bit4 = _mm512_set1_epi8(0x10);
    EI_UNROLL for (int k = 0; k < 4; k++) {
        w[k] = _mm512_or_si512(w[k], _mm512_and_si512(_mm512_slli_epi16(qh, 4 - k), bit4));
        w[4 + k] = _mm512_or_si512(w[4 + k], _mm512_and_si512(_mm512_srli_epi16(qh, k), bit4));
    }
}

/* A product reads its weights from memory, once, in decoding steps of one sequence or of a
 * batch of a few, and in a prompt's first tile of columns: every x16 kernel asks for them a
 * few blocks ahead, whatever its column count (a later tile's lines are in L2 already, and
 * asking costs nothing measurable there: pp512 unchanged). Gemma 3's output product
 * (262144 x 640 Q8_0, bench of 8 decoding sequences on the AVX-512 EPYC): 12.7 -> 7.2 ms
 * with 8 columns, 4.5 -> 4.3 with 2. */
EI_INLINE void x16_prefetch(const uint8_t *x, size_t bytes) {
    for (size_t line = 0; line < bytes; line += 64) _mm_prefetch((const char *)x + EI_X16_PREFETCH * bytes + line, _MM_HINT_T1);
}

/* the 16 rows' fp16 fields h[0..15] as doubles: rows 0..7, rows 8..15 */
EI_INLINE void f16x16_rows(const ei_f16 *h, __m512d out[2]) {
    const __m512 f = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
    out[0] = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
    out[1] = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
}

/* the 8 weight vectors of a block of nibble pairs (Q4_0, Q4_1, Q5_0): w[k] weights 4k..4k+3
 * of every row, w[4 + k] 16 + 4k.., with Q5_0's fifth bits */
EI_INLINE void x16_nibble_weights(int type, const uint8_t *x, __m512i w[8]) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    const uint8_t *qs = type == EI_TYPE_Q4_0 ? ((const block_q4_0x16 *)x)->qs
                      : type == EI_TYPE_Q4_1 ? ((const block_q4_1x16 *)x)->qs : ((const block_q5_0x16 *)x)->qs;
    const __m512i qh = type == EI_TYPE_Q5_0 ? _mm512_loadu_si512((const void *)((const block_q5_0x16 *)x)->qh) : _mm512_setzero_si512();
    EI_UNROLL for (int k = 0; k < 4; k++) {
        const __m512i v = _mm512_loadu_si512((const void *)(qs + 64 * k));
        w[k] = _mm512_and_si512(v, low);
        w[4 + k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
    if (type == EI_TYPE_Q5_0) or_fifth_bits(qh, w);
}

/* 16 interleaved rows of Q4_0, Q4_1 or Q5_0, lane r = row r: per block, 8 products of the
 * rows' bytes with four broadcast activation bytes give every row's isum without a
 * horizontal reduction; the weights' offset (8 or 16) comes out as that times the activation
 * block's sum. The block terms (d_w d_x) isum are exact in double and added in block order;
 * Q4_1's (d_w d_x) isum + m_w s_x is rounded once, by the fma, as the reference rounds it:
 * vec_dot bit for bit. */
EI_INLINE void gemm_x16_impl(int type, int vnni, int n, int nc, float *s, size_t ss, const void *vx, const void *vy,
                             size_t ys) {
    const int q4_1 = type == EI_TYPE_Q4_1, offset = type == EI_TYPE_Q4_0 ? -8 : type == EI_TYPE_Q5_0 ? -16 : 0;
    const size_t bytes = q4_1 ? sizeof(block_q4_1x16) : type == EI_TYPE_Q5_0 ? sizeof(block_q5_0x16) : sizeof(block_q4_0x16);
    const size_t yb = q4_1 ? sizeof(block_q8_1) : sizeof(block_q8_0), yq = q4_1 ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    const uint8_t *x = vx;
    __m512d acc[X16_TILE][2];
    EI_UNROLL for (int c = 0; c < X16_TILE; c++) acc[c][0] = acc[c][1] = _mm512_setzero_pd();
    for (int i = 0; i < n / QK4_0; i++, x += bytes) {
        x16_prefetch(x, bytes);
        __m512d dw[2], mw[2];
        f16x16_rows((const ei_f16 *)x, dw); /* d: the first field */
        if (q4_1) f16x16_rows(((const block_q4_1x16 *)x)->m, mw);
        __m512i w[8];
        x16_nibble_weights(type, x, w);
        EI_UNROLL for (int c = 0; c < X16_TILE; c++) {
            if (c >= nc) break;
            const uint8_t *y = (const uint8_t *)vy + (size_t)c * ys + (size_t)i * yb; /* d, then q8_1's s */
            const int8_t *a = (const int8_t *)(y + yq);
            /* two chains of dots (exact integers, so the sum is the same), as the tiles do */
            __m512i isum = _mm512_set1_epi32(offset ? offset * block_sum_q8(a) : 0), isum2 = _mm512_setzero_si512();
            EI_UNROLL for (int k = 0; k < 8; k += 2) { /* w[k] meets 4k..4k+3 */
                isum = dot_nibbles(isum, w[k], bcast4(a + 4 * k), vnni);
                isum2 = dot_nibbles(isum2, w[k + 1], bcast4(a + 4 * k + 4), vnni);
            }
            isum = _mm512_add_epi32(isum, isum2);
            const __m512d dy = _mm512_set1_pd((double)f16_to_f32(((const ei_f16 *)y)[0]));
            const __m512d is[2] = {cvt_lo(isum), cvt_hi(isum)};
            EI_UNROLL for (int h = 0; h < 2; h++) {
                if (q4_1) {
                    const __m512d sy = _mm512_set1_pd((double)f16_to_f32(((const ei_f16 *)y)[1]));
                    acc[c][h] = _mm512_add_pd(acc[c][h], _mm512_fmadd_pd(is[h], _mm512_mul_pd(dw[h], dy), _mm512_mul_pd(mw[h], sy)));
                } else {
                    acc[c][h] = _mm512_fmadd_pd(is[h], _mm512_mul_pd(dw[h], dy), acc[c][h]);
                }
            }
        }
    }
    for (int c = 0; c < nc; c++) {
        _mm256_storeu_ps(s + (size_t)c * ss, _mm512_cvtpd_ps(acc[c][0]));
        _mm256_storeu_ps(s + (size_t)c * ss + 8, _mm512_cvtpd_ps(acc[c][1]));
    }
}

/* Q8_0's 16 interleaved rows, lane r = row r: with VNNI the weights go in unsigned (w + 128)
 * and 128 times the activation block's sum comes off; without it |w| meets the activation
 * negated where w < 0 (the activations are in [-127, 127], so no negation wraps), and the
 * vpmaddubsw pairs, up to 2 x 128 x 127 = 32512, take a vpmaddwd each. Exact integer dots,
 * block terms added as above. */
EI_INLINE void gemm_x16_q8_impl(int vnni, int n, int nc, float *s, size_t ss, const void *vx, const void *vy, size_t ys) {
    const uint8_t *x = vx;
    const __m512i ones = _mm512_set1_epi16(1);
    __m512d acc[X16_TILE][2];
    EI_UNROLL for (int c = 0; c < X16_TILE; c++) acc[c][0] = acc[c][1] = _mm512_setzero_pd();
    for (int i = 0; i < n / QK8_0; i++, x += sizeof(block_q8_0x16)) {
        x16_prefetch(x, sizeof(block_q8_0x16));
        const block_q8_0x16 *b = (const block_q8_0x16 *)x;
        __m512d dw[2];
        f16x16_rows(b->d, dw);
        __m512i u[8]; /* values 4k..4k+3 of every row: w + 128, or |w| */
        __mmask64 neg[8];
        EI_UNROLL for (int k = 0; k < 8; k++) {
            const __m512i v = _mm512_loadu_si512((const void *)(b->qs + 64 * k));
            u[k] = vnni ? _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)) : _mm512_abs_epi8(v);
            neg[k] = vnni ? 0 : _mm512_movepi8_mask(v);
        }
        EI_UNROLL for (int c = 0; c < X16_TILE; c++) {
            if (c >= nc) break;
            const block_q8_0 *y = (const block_q8_0 *)((const uint8_t *)vy + (size_t)c * ys) + i;
            __m512i isum = _mm512_set1_epi32(vnni ? -128 * block_sum_q8(y->qs) : 0);
            EI_UNROLL for (int k = 0; k < 8; k++) {
                const __m512i a = bcast4(y->qs + 4 * k);
                if (vnni) isum = _mm512_dpbusd_epi32(isum, u[k], a);
                else isum = _mm512_add_epi32(isum, _mm512_madd_epi16(_mm512_maddubs_epi16(u[k], _mm512_mask_sub_epi8(a, neg[k], _mm512_setzero_si512(), a)), ones));
            }
            const __m512d dy = _mm512_set1_pd((double)f16_to_f32(y->d));
            acc[c][0] = _mm512_fmadd_pd(cvt_lo(isum), _mm512_mul_pd(dw[0], dy), acc[c][0]);
            acc[c][1] = _mm512_fmadd_pd(cvt_hi(isum), _mm512_mul_pd(dw[1], dy), acc[c][1]);
        }
    }
    for (int c = 0; c < nc; c++) {
        _mm256_storeu_ps(s + (size_t)c * ss, _mm512_cvtpd_ps(acc[c][0]));
        _mm256_storeu_ps(s + (size_t)c * ss + 8, _mm512_cvtpd_ps(acc[c][1]));
    }
}

/* Prompt products with VNNI (nc > 1) of Q4_0, Q5_0 and Q8_0: the weights go in unsigned
 * (Q4_0's nibbles and Q5_0's 5-bit values as stored, Q8_0's plus 128) against the activations
 * as quantized, so sum u a = sum w a + o sum a for the weights' offset o (8, 16 or 128). Each
 * column's correction -o sum a of a block, and its scale as a double, are prepared once for
 * all the groups of a call's span of rows; a column's dots start from its correction, which a
 * broadcast load brings, and run in two chains (one chain of 8 waited on vpdpbusd's latency).
 * The same exact integer dots, and block terms added as above: vec_dot bit for bit. The 1.1B
 * Q4_0 model's pp512 on the AVX-512 EPYC (bench --profile): 612 -> 734 GFLOP/s from the two
 * chains, 734 -> 880 from preparing the activations once for a span of up to 16 groups
 * (engine.c: PROMPT_PIECE) rather than once a group, and 880 -> 965 from preparing only the
 * corrections and scales, not a biased copy of the activations (which made the weights signed
 * and their correction a per-block sum of all 16 rows' weights, 19 more vector operations a
 * block, and kept one more register live across the columns: three accumulators spilled). */
#define X16_PREPARED_MAX 16384 /* values of a row whose activations a span prepares (longer: per group) */

typedef struct {
    int32_t corr[X16_TILE][X16_PREPARED_MAX / QK8_0]; /* (column, block): -o sum a */
    double dy[X16_TILE][X16_PREPARED_MAX / QK8_0];    /* (column, block): the activations' scale */
} x16_prepared;

static void x16_prepare(int type, int n, int nc, const void *vy, size_t ys, x16_prepared *p) {
    const int offset = type == EI_TYPE_Q4_0 ? 8 : type == EI_TYPE_Q5_0 ? 16 : 128;
    for (int c = 0; c < nc; c++) {
        const block_q8_0 *y = (const block_q8_0 *)((const uint8_t *)vy + (size_t)c * ys);
        for (int b = 0; b < n / QK8_0; b++) {
            p->corr[c][b] = -offset * block_sum_q8(y[b].qs);
            p->dy[c][b] = (double)f16_to_f32(y[b].d);
        }
    }
}

/* one group against the activations vy (rows ys apart) and their prepared corrections p */
EI_INLINE void gemm_x16_prepared(int type, const x16_prepared *p, int n, int nc, float *s, size_t ss, const void *vx,
                                 const void *vy, size_t ys) {
    const size_t bytes = type == EI_TYPE_Q8_0 ? sizeof(block_q8_0x16) : type == EI_TYPE_Q5_0 ? sizeof(block_q5_0x16) : sizeof(block_q4_0x16);
    const uint8_t *x = vx;
    __m512d acc[X16_TILE][2];
    EI_UNROLL for (int c = 0; c < X16_TILE; c++) acc[c][0] = acc[c][1] = _mm512_setzero_pd();
    for (int b = 0; b < n / QK8_0; b++, x += bytes) {
        x16_prefetch(x, bytes);
        __m512d dw[2];
        f16x16_rows((const ei_f16 *)x, dw); /* d: the first field */
        __m512i w[8];
        if (type == EI_TYPE_Q8_0)
            EI_UNROLL for (int k = 0; k < 8; k++)
                w[k] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(((const block_q8_0x16 *)x)->qs + 64 * k)), _mm512_set1_epi8((char)0x80));
        else
            x16_nibble_weights(type, x, w);
        EI_UNROLL for (int c = 0; c < X16_TILE; c++) {
            if (c >= nc) break;
            const int8_t *a = ((const block_q8_0 *)((const uint8_t *)vy + (size_t)c * ys))[b].qs;
            __m512i part[2] = {_mm512_set1_epi32(p->corr[c][b]), _mm512_setzero_si512()}; /* two chains */
            EI_UNROLL for (int k = 0; k < 8; k++) part[k & 1] = _mm512_dpbusd_epi32(part[k & 1], w[k], bcast4(a + 4 * k));
            const __m512i isum = _mm512_add_epi32(part[0], part[1]);
            const __m512d d = _mm512_set1_pd(p->dy[c][b]);
            acc[c][0] = _mm512_fmadd_pd(cvt_lo(isum), _mm512_mul_pd(dw[0], d), acc[c][0]);
            acc[c][1] = _mm512_fmadd_pd(cvt_hi(isum), _mm512_mul_pd(dw[1], d), acc[c][1]);
        }
    }
    for (int c = 0; c < nc; c++) {
        _mm256_storeu_ps(s + (size_t)c * ss, _mm512_cvtpd_ps(acc[c][0]));
        _mm256_storeu_ps(s + (size_t)c * ss + 8, _mm512_cvtpd_ps(acc[c][1]));
    }
}

/* ng groups of TYPE's interleaved rows from vx on (one: a group, for decoding and long rows) */
EI_INLINE void gemm_x16_span_vnni(int type, int n, int ng, int nc, float *s, size_t ss, const void *vx, const void *y,
                                  size_t ys, ei_gemm_x16_fn one) {
    const uint8_t *x = vx;
    const size_t group = ei_x16_size(type, n);
    if (nc == 1 || n > X16_PREPARED_MAX) {
        for (int g = 0; g < ng; g++) one(n, nc, s + (size_t)g * EI_X16, ss, x + (size_t)g * group, y, ys);
        return;
    }
    static EI_THREAD_LOCAL x16_prepared prepared;
    x16_prepare(type, n, nc, y, ys, &prepared);
    for (int g = 0; g < ng; g++, s += EI_X16, x += group) X16_CASES(gemm_x16_prepared, type, &prepared,)
}

/* gemm_x16_T and gemm_x16_T_vnni: KERNEL(ARG, vnni, ...) for every column count */
#define X16_FNS(T, KERNEL, ...)                                                                                    \
    static void gemm_x16_##T##_vnni(int n, int nc, float *s, size_t ss, const void *x, const void *y, size_t ys) { \
        X16_CASES(KERNEL, __VA_ARGS__ 1,)                                                                          \
    }                                                                                                              \
    static void gemm_x16_##T(int n, int nc, float *s, size_t ss, const void *x, const void *y, size_t ys) {        \
        X16_CASES(KERNEL, __VA_ARGS__ 0,)                                                                          \
    }
X16_FNS(q4_1, gemm_x16_impl, EI_TYPE_Q4_1,)
/* gemm_x16_T (without VNNI), gemm_x16_T_vnni through ONE for decoding (one column), and
 * gemm_x16_span_T_vnni: prompts through gemm_x16_prepared, a span of groups at a time */
#define PREPARED_FNS(T, TYPE, ONE, ...)                                                                            \
    static void gemm_x16_##T##_one(int n, int nc, float *s, size_t ss, const void *x, const void *y, size_t ys) {  \
        X16_CASES(ONE, __VA_ARGS__ 1,)                                                                             \
    }                                                                                                              \
    static void gemm_x16_span_##T##_vnni(int n, int ng, int nc, float *s, size_t ss, const void *x, const void *y, \
                                         size_t ys) {                                                              \
        gemm_x16_span_vnni(TYPE, n, ng, nc, s, ss, x, y, ys, gemm_x16_##T##_one);                                  \
    }                                                                                                              \
    static void gemm_x16_##T##_vnni(int n, int nc, float *s, size_t ss, const void *x, const void *y, size_t ys) { \
        gemm_x16_span_##T##_vnni(n, 1, nc, s, ss, x, y, ys);                                                       \
    }                                                                                                              \
    static void gemm_x16_##T(int n, int nc, float *s, size_t ss, const void *x, const void *y, size_t ys) {        \
        X16_CASES(ONE, __VA_ARGS__ 0,)                                                                             \
    }
PREPARED_FNS(q4_0, EI_TYPE_Q4_0, gemm_x16_impl, EI_TYPE_Q4_0,)
PREPARED_FNS(q5_0, EI_TYPE_Q5_0, gemm_x16_impl, EI_TYPE_Q5_0,)
PREPARED_FNS(q8_0, EI_TYPE_Q8_0, gemm_x16_q8_impl,)

/* ---- K super-blocks interleaved by 16 (block_q4_Kx16, block_q5_Kx16, block_q6_Kx16) ------- */

/* (lo, hi) int16 pairs of 16 int32 lanes */
EI_INLINE __m512i pairs16(__m512i lo, __m512i hi) {
    return _mm512_or_si512(_mm512_and_si512(lo, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(hi, 16));
}

/* what every column shares in a super-block, lane r = row r: the int16 pair (s, s) of each
 * sub-block's scale, the int16 multipliers of each pair of the activation's block sums, and
 * the rows' d (and dmin) as doubles, rows 0..7 and 8..15 */
typedef struct {
    __m512i sc[16], bmul[8];
    __m512i sc32[16]; /* each sub-block's scale as an int32 (the VNNI products) */
    __m512d d[2], dmin[2];
} kx16_shared;

EI_INLINE __m512d f16x8_pd(const ei_f16 *h) { return _mm512_cvtps_pd(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h))); }

/* type: EI_TYPE_Q4_K, Q5_K or Q6_K (a constant in each inlined copy); a block_q5_Kx16 starts
 * with its block_q4_Kx16, which is all the scales there are */
EI_INLINE void kx16_prepare(int type, const uint8_t *x, kx16_shared *sh) {
    if (type == EI_TYPE_Q6_K) {
        const block_q6_Kx16 *b = (const block_q6_Kx16 *)x;
        sh->d[0] = f16x8_pd(b->d), sh->d[1] = f16x8_pd(b->d + 8);
        __m512i v[16];
        EI_UNROLL for (int j = 0; j < 16; j++) {
            sh->sc32[j] = v[j] = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b->sc[j]));
            sh->sc[j] = pairs16(v[j], v[j]);
        }
        /* the values are stored 32 up: 32 sc times each block sum comes off */
        EI_UNROLL for (int m = 0; m < 8; m++) sh->bmul[m] = pairs16(_mm512_slli_epi32(v[2 * m], 5), _mm512_slli_epi32(v[2 * m + 1], 5));
        return;
    }
    const block_q4_Kx16 *b = (const block_q4_Kx16 *)x;
    sh->d[0] = f16x8_pd(b->d), sh->d[1] = f16x8_pd(b->d + 8);
    sh->dmin[0] = f16x8_pd(b->dmin), sh->dmin[1] = f16x8_pd(b->dmin + 8);
    EI_UNROLL for (int j = 0; j < 8; j++) {
        const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b->sc[j]));
        const __m512i mn = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b->mn[j]));
        sh->sc32[j] = sc;
        sh->sc[j] = pairs16(sc, sc);
        sh->bmul[j] = pairs16(mn, mn); /* both block sums of sub-block j */
    }
}

/* the 8 weight vectors of unit j, every row: w[k] values 4k..4k+3, w[4 + k] 16 + 4k.. */
EI_INLINE void kx16_unit(int type, const uint8_t *x, int j, __m512i *w) {
    const int q6 = type == EI_TYPE_Q6_K;
    const __m512i low = _mm512_set1_epi8(0x0F);
    const uint8_t *qs = q6 ? ((const block_q6_Kx16 *)x)->ql[j] : ((const block_q4_Kx16 *)x)->qs[j];
    EI_UNROLL for (int k = 0; k < 4; k++) {
        const __m512i v = _mm512_loadu_si512((const void *)(qs + 64 * k));
        w[k] = _mm512_and_si512(v, low);
        w[4 + k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
    if (type == EI_TYPE_Q5_K) or_fifth_bits(_mm512_loadu_si512((const void *)((const block_q5_Kx16 *)x)->qh[j]), w);
    if (!q6) return;
    const __m512i two = _mm512_set1_epi8(0x30);
    const uint8_t *qh = ((const block_q6_Kx16 *)x)->qh[j];
    EI_UNROLL for (int m = 0; m < 2; m++) {
        const __m512i v = _mm512_loadu_si512((const void *)(qh + 64 * m));
        w[2 * m] = _mm512_or_si512(w[2 * m], _mm512_and_si512(_mm512_slli_epi16(v, 4), two));
        w[4 + 2 * m] = _mm512_or_si512(w[4 + 2 * m], _mm512_and_si512(_mm512_slli_epi16(v, 2), two));
        w[2 * m + 1] = _mm512_or_si512(w[2 * m + 1], _mm512_and_si512(v, two));
        w[4 + 2 * m + 1] = _mm512_or_si512(w[4 + 2 * m + 1], _mm512_and_si512(_mm512_srli_epi16(v, 2), two));
    }
}

/* kx16_dots with VNNI: each sub-block's int32 dots by vpdpbusd (the weights, below 64, go in
 * unsigned) in two chains, times its scale (vpmulld, exact: |dots| < 2^20, scales < 64) into
 * iacc; Q4_K's and Q5_K's unit j is sub-block j (32 values), Q6_K's sub-blocks 2j and 2j + 1
 * (16 values each). The integers are kx16_dots's: 11 vector operations for Q4_K's 512
 * multiply-adds against 16 through vpmaddubsw, int16 sums and vpdpwssd. */
EI_INLINE __m512i kx16_dots_vnni(int type, const __m512i *w, const int8_t *y, const __m512i *sc32, int j, __m512i iacc) {
    if (type != EI_TYPE_Q6_K) {
        __m512i p[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        EI_UNROLL for (int k = 0; k < 8; k++) p[k & 1] = _mm512_dpbusd_epi32(p[k & 1], w[k], bcast4(y + 4 * k));
        return _mm512_add_epi32(iacc, _mm512_mullo_epi32(_mm512_add_epi32(p[0], p[1]), sc32[j]));
    }
    EI_UNROLL for (int half = 0; half < 2; half++) { /* sub-block 2j + half: values 16 half .. */
        __m512i p[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        EI_UNROLL for (int k = 0; k < 4; k++) p[k & 1] = _mm512_dpbusd_epi32(p[k & 1], w[4 * half + k], bcast4(y + 16 * half + 4 * k));
        iacc = _mm512_add_epi32(iacc, _mm512_mullo_epi32(_mm512_add_epi32(p[0], p[1]), sc32[2 * j + half]));
    }
    return iacc;
}

/* iacc += the scaled integer dots of unit j with one activation row: Q4_K's unit is one
 * sub-block (8 products of values below 16 add up in int16: 8 x 3840), Q5_K's too, whose
 * values below 32 allow four (4 x 7936 = 31744), Q6_K's two sub-blocks, whose values below
 * 64 allow two */
EI_INLINE __m512i kx16_dots(int type, const __m512i *w, const int8_t *y, const __m512i *sc, int j, __m512i iacc,
                            int vnni) {
    if (type == EI_TYPE_Q5_K) {
        EI_UNROLL for (int half = 0; half < 2; half++) { /* values 16 half .. 16 half + 15 */
            const __m512i *wh = w + 4 * half;
            const int8_t *yh = y + 16 * half;
            const __m512i p0 = _mm512_add_epi16(_mm512_maddubs_epi16(wh[0], bcast4(yh)), _mm512_maddubs_epi16(wh[1], bcast4(yh + 4)));
            const __m512i p1 = _mm512_add_epi16(_mm512_maddubs_epi16(wh[2], bcast4(yh + 8)), _mm512_maddubs_epi16(wh[3], bcast4(yh + 12)));
            iacc = dot_s16(iacc, _mm512_add_epi16(p0, p1), sc[j], vnni);
        }
        return iacc;
    }
    if (type == EI_TYPE_Q4_K) { /* two chains of adds */
        __m512i p[2] = {_mm512_maddubs_epi16(w[0], bcast4(y)), _mm512_maddubs_epi16(w[1], bcast4(y + 4))};
        EI_UNROLL for (int k = 2; k < 8; k++) p[k & 1] = _mm512_add_epi16(p[k & 1], _mm512_maddubs_epi16(w[k], bcast4(y + 4 * k)));
        return dot_s16(iacc, _mm512_add_epi16(p[0], p[1]), sc[j], vnni);
    }
    EI_UNROLL for (int half = 0; half < 2; half++) { /* sub-block 2j + half */
        const __m512i *wh = w + 4 * half;
        const int8_t *yh = y + 16 * half;
        const __m512i p0 = _mm512_add_epi16(_mm512_maddubs_epi16(wh[0], bcast4(yh)), _mm512_maddubs_epi16(wh[1], bcast4(yh + 4)));
        const __m512i p1 = _mm512_add_epi16(_mm512_maddubs_epi16(wh[2], bcast4(yh + 8)), _mm512_maddubs_epi16(wh[3], bcast4(yh + 12)));
        iacc = dot_s16(dot_s16(iacc, p0, sc[2 * j + half], vnni), p1, sc[2 * j + half], vnni);
    }
    return iacc;
}

/* Lane r = row r: per super-block, every row's integer sums with each activation row come
 * out of broadcast activation bytes (no horizontal sums), and the super-block's term is
 * rounded as the reference rounds it: (d_y d) isum - (d_y dmin) imin for Q4_K and Q5_K,
 * (d_y d) isum for Q6_K, added in super-block order: vec_dot bit for bit. */
EI_INLINE void gemm_kx16_impl(int type, int vnni, int n, int nc, float *s, size_t ss, const void *vx, const void *vy,
                              size_t ys) {
    const int q6 = type == EI_TYPE_Q6_K;
    const size_t bytes = q6 ? sizeof(block_q6_Kx16) : type == EI_TYPE_Q5_K ? sizeof(block_q5_Kx16) : sizeof(block_q4_Kx16);
    const uint8_t *x = vx;
    __m512d acc[X16_TILE][2];
    EI_UNROLL for (int c = 0; c < X16_TILE; c++) acc[c][0] = acc[c][1] = _mm512_setzero_pd();
    kx16_shared sh;
    for (int i = 0; i < n / QK_K; i++, x += bytes) {
        for (size_t line = 0; line < bytes; line += 64) _mm_prefetch((const char *)x + 3 * bytes + line, _MM_HINT_T0);
        kx16_prepare(type, x, &sh);
        __m512i iacc[X16_TILE];
        EI_UNROLL for (int c = 0; c < X16_TILE; c++) iacc[c] = _mm512_setzero_si512();
        for (int j = 0; j < QK_K / 32; j++) {
            __m512i w[8];
            kx16_unit(type, x, j, w);
            EI_UNROLL for (int c = 0; c < X16_TILE; c++) {
                if (c >= nc) break;
                const block_q8_K *y = (const block_q8_K *)((const uint8_t *)vy + (size_t)c * ys) + i;
                iacc[c] = vnni ? kx16_dots_vnni(type, w, y->qs + 32 * j, sh.sc32, j, iacc[c])
                               : kx16_dots(type, w, y->qs + 32 * j, sh.sc, j, iacc[c], vnni);
            }
        }
        EI_UNROLL for (int c = 0; c < X16_TILE; c++) {
            if (c >= nc) break;
            const block_q8_K *y = (const block_q8_K *)((const uint8_t *)vy + (size_t)c * ys) + i;
            __m512i imin = _mm512_setzero_si512();
            EI_UNROLL for (int m = 0; m < 8; m++) imin = dot_s16(imin, sh.bmul[m], bcast4(y->bsums + 2 * m), vnni);
            const __m512d yd = _mm512_set1_pd((double)y->d);
            if (q6) iacc[c] = _mm512_sub_epi32(iacc[c], imin);
            EI_UNROLL for (int part = 0; part < 2; part++) {
                __m512d term = _mm512_mul_pd(_mm512_mul_pd(yd, sh.d[part]), part ? cvt_hi(iacc[c]) : cvt_lo(iacc[c]));
                if (!q6)
                    term = _mm512_sub_pd(term, _mm512_mul_pd(_mm512_mul_pd(yd, sh.dmin[part]), part ? cvt_hi(imin) : cvt_lo(imin)));
                acc[c][part] = _mm512_add_pd(acc[c][part], term);
            }
        }
    }
    for (int c = 0; c < nc; c++) {
        _mm256_storeu_ps(s + (size_t)c * ss, _mm512_cvtpd_ps(acc[c][0]));
        _mm256_storeu_ps(s + (size_t)c * ss + 8, _mm512_cvtpd_ps(acc[c][1]));
    }
}

X16_FNS(q4_K, gemm_kx16_impl, EI_TYPE_Q4_K,)
X16_FNS(q5_K, gemm_kx16_impl, EI_TYPE_Q5_K,)
X16_FNS(q6_K, gemm_kx16_impl, EI_TYPE_Q6_K,)

/* ---- F16 and BF16 rows interleaved by 16 (block_f16x16) ----------------------------------
 * Lane r = row r (rows 0..7 and 8..15, two vectors): value d of the 16 rows is one 32-byte
 * load, converted to doubles once for all columns, and each column's values are converted a
 * chunk at a time into doubles that are broadcast to the rows. A product of two such values is
 * exact in double, so a fused add rounds as the reference's add, and each (row, column) lane
 * adds in index order: vec_dot bit for bit. 4 columns keep 8 chains of fused adds in flight. */
#define HX16_CHUNK 64      /* values converted at a time: (columns, chunk) doubles stay in L1 */
#define HX16_PREFETCH 4096 /* bytes ahead a decoding step asks for (measured on AVX2: x86_avx2/gemm.c) */

/* 8 consecutive 16-bit values (of 8 rows, or of one row) as doubles */
EI_INLINE __m512d half8_pd(int bf16, const uint16_t *p) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm512_cvtps_pd(bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h));
}

/* a[j] = value j of m values of an activation row, as doubles */
EI_INLINE void half_chunk(int bf16, const uint16_t *y, int m, double *a) {
    int j = 0;
    for (; j + 8 <= m; j += 8) _mm512_storeu_pd(a + j, half8_pd(bf16, y + j));
    for (; j < m; j++) a[j] = bf16 ? ei_bf16_to_fp32(y[j]) : f16_to_f32(y[j]);
}

EI_INLINE void gemm_hx16_impl(int bf16, int n, int nc, float *s, size_t ss, const void *vx, const void *vy,
                              size_t ys) {
    const block_f16x16 *x = vx;
    double a[X16_TILE][HX16_CHUNK]; /* (column, chunk) */
    __m512d acc[X16_TILE][2];       /* (column, rows 8h..8h+7) */
    for (int c = 0; c < nc; c++) acc[c][0] = acc[c][1] = _mm512_setzero_pd();
    for (int d0 = 0; d0 < n; d0 += HX16_CHUNK) {
        const int m = n - d0 < HX16_CHUNK ? n - d0 : HX16_CHUNK;
        for (int c = 0; c < nc; c++) half_chunk(bf16, (const uint16_t *)((const uint8_t *)vy + (size_t)c * ys) + d0, m, a[c]);
        for (int j = 0; j < m; j++) {
            const block_f16x16 *b = x + d0 + j;
            if (j % 2 == 0) _mm_prefetch((const char *)b + HX16_PREFETCH, _MM_HINT_T0); /* 2 values a line */
            const __m512d w0 = half8_pd(bf16, b->v), w1 = half8_pd(bf16, b->v + 8);
            EI_UNROLL for (int c = 0; c < X16_TILE; c++) {
                if (c >= nc) break;
                const __m512d v = _mm512_set1_pd(a[c][j]);
                acc[c][0] = _mm512_fmadd_pd(w0, v, acc[c][0]);
                acc[c][1] = _mm512_fmadd_pd(w1, v, acc[c][1]);
            }
        }
    }
    for (int c = 0; c < nc; c++) {
        _mm256_storeu_ps(s + (size_t)c * ss, _mm512_cvtpd_ps(acc[c][0]));
        _mm256_storeu_ps(s + (size_t)c * ss + 8, _mm512_cvtpd_ps(acc[c][1]));
    }
}

static void gemm_x16_f16(int n, int nc, float *s, size_t ss, const void *x, const void *y, size_t ys) {
    X16_CASES(gemm_hx16_impl, 0,)
}
static void gemm_x16_bf16(int n, int nc, float *s, size_t ss, const void *x, const void *y, size_t ys) {
    X16_CASES(gemm_hx16_impl, 1,)
}

/* ---- the table --------------------------------------------------------------------------- */

/* one activation row (decoding): the weight rows one by one through vec_dot */
EI_INLINE void rows_by_dot(int type, int vnni, int n, int nr, float *s, const void *x, size_t xs, const void *y) {
    const ei_vec_dot_fn dot = ei_avx512_vec_dot(type, vnni);
    for (int r = 0; r < nr; r++) {
        prefetch_span((const uint8_t *)x + (size_t)r * xs, 4 * xs, 0, xs); /* the row 4 further on */
        dot(n, &s[r], (const uint8_t *)x + (size_t)r * xs, y);
    }
}

#define GEMM(T, TYPE, ROWS4)                                                                             \
    static void gemm_##T##_vnni(int n, int nr, int nc, float *s, size_t ss, const void *x, size_t xs,    \
                                const void *y, size_t ys) {                                              \
        if (nc == 1) ROWS4(T, TYPE, 1);                                                                  \
        else tile_##T##_impl(n, nr, nc, s, ss, x, xs, y, ys, 1);                                         \
    }                                                                                                    \
    static void gemm_##T(int n, int nr, int nc, float *s, size_t ss, const void *x, size_t xs,           \
                         const void *y, size_t ys) {                                                     \
        if (nc == 1) ROWS4(T, TYPE, 0);                                                                  \
        else tile_##T##_impl(n, nr, nc, s, ss, x, xs, y, ys, 0);                                         \
    }
#define ROWS4_TILE(T, TYPE, VNNI) rows4_##T##_impl(n, nr, s, x, xs, y, VNNI)
#define ROWS_BY_DOT(T, TYPE, VNNI) rows_by_dot(TYPE, VNNI, n, nr, s, x, xs, y)
GEMM(q4_0, EI_TYPE_Q4_0, ROWS4_TILE)
GEMM(q4_1, EI_TYPE_Q4_1, ROWS4_TILE)
GEMM(q5_0, EI_TYPE_Q5_0, ROWS4_TILE)
GEMM(q5_1, EI_TYPE_Q5_1, ROWS4_TILE)
GEMM(q8_0, EI_TYPE_Q8_0, ROWS4_TILE)
GEMM(q2_K, EI_TYPE_Q2_K, ROWS_BY_DOT)
GEMM(q3_K, EI_TYPE_Q3_K, ROWS_BY_DOT)
GEMM(q4_K, EI_TYPE_Q4_K, ROWS_BY_DOT)
GEMM(q5_K, EI_TYPE_Q5_K, ROWS_BY_DOT)
GEMM(q6_K, EI_TYPE_Q6_K, ROWS_BY_DOT)

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
    k->gemm_x16[EI_TYPE_Q4_0] = vnni ? gemm_x16_q4_0_vnni : gemm_x16_q4_0;
    k->gemm_x16[EI_TYPE_Q5_0] = vnni ? gemm_x16_q5_0_vnni : gemm_x16_q5_0;
    k->gemm_x16[EI_TYPE_Q4_1] = vnni ? gemm_x16_q4_1_vnni : gemm_x16_q4_1;
    k->gemm_x16[EI_TYPE_Q8_0] = vnni ? gemm_x16_q8_0_vnni : gemm_x16_q8_0;
    if (vnni) {
        k->gemm_x16_span[EI_TYPE_Q4_0] = gemm_x16_span_q4_0_vnni;
        k->gemm_x16_span[EI_TYPE_Q5_0] = gemm_x16_span_q5_0_vnni;
        k->gemm_x16_span[EI_TYPE_Q8_0] = gemm_x16_span_q8_0_vnni;
    }
    k->gemm_x16[EI_TYPE_Q4_K] = vnni ? gemm_x16_q4_K_vnni : gemm_x16_q4_K;
    k->gemm_x16[EI_TYPE_Q5_K] = vnni ? gemm_x16_q5_K_vnni : gemm_x16_q5_K;
    k->gemm_x16[EI_TYPE_Q6_K] = vnni ? gemm_x16_q6_K_vnni : gemm_x16_q6_K;
    k->gemm_x16[EI_TYPE_F16] = gemm_x16_f16;
    k->gemm_x16[EI_TYPE_BF16] = gemm_x16_bf16;
    k->x16_tile = X16_TILE;
}
