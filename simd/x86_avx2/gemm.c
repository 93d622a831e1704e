/* AVX2 tiles of a matrix product: up to 4 weight rows against up to 4 activation rows.
 *
 * Each weight block is unpacked once per tile and used for every activation row. The four
 * rows' integer sums of one block land in the four lanes of one vector, and each lane adds
 * its row's block terms in block order: every output is the reference's vec_dot, bit for
 * bit. Missing rows (nr < 4) repeat row 0 and are not stored. */
#include "blocks.h"

/* four lanes of acc as floats: s[r] for r < nr */
EI_AVX2_INLINE void store_rows(float *s, __m256d acc, int nr) {
    const __m128 v = _mm256_cvtpd_ps(acc);
    if (nr == 4) {
        _mm_storeu_ps(s, v);
        return;
    }
    float t[4];
    _mm_storeu_ps(t, v);
    for (int r = 0; r < nr; r++) s[r] = t[r];
}

/* Decoding tiles (one column) read 4 interleaved row streams, which the hardware prefetchers
 * follow poorly: each block of the tile touches its share of the next 4 rows (the next tile
 * when rows are contiguous, as in a weight matrix). */
typedef struct { const char *next; size_t done, step; } row_prefetch;

EI_AVX2_INLINE row_prefetch prefetch_start(const uint8_t *x, size_t xs, int nb) {
    return (row_prefetch){(const char *)x + 4 * xs, 0, 4 * xs / (size_t)(nb > 0 ? nb : 1) + 1};
}

EI_AVX2_INLINE void prefetch_block(row_prefetch *p) {
    const size_t end = p->done + p->step;
    for (size_t off = p->done & ~(size_t)63; off < end; off += 64) _mm_prefetch(p->next + off, _MM_HINT_T0);
    p->done = end;
}

/* pointers to the m rows of a tile, rows past the first 'used' repeating row 0 */
EI_AVX2_INLINE void tile_rows(const uint8_t *x, size_t xs, int used, int m, const uint8_t **row) {
    EI_UNROLL
    for (int r = 0; r < m; r++) row[r] = x + (size_t)(r < used ? r : 0) * xs;
}

/* the fp16 fields at byte offset off of 4 rows, as doubles */
EI_AVX2_INLINE __m256d f16x4_at(const uint8_t *const *p, size_t off) {
    return _mm256_cvtps_pd(avx2_f16x4(p[0] + off, p[1] + off, p[2] + off, p[3] + off));
}

/* ---- legacy blocks ----------------------------------------------------------------- */

/* lane c of v in every lane */
EI_AVX2_INLINE __m256d lane_pd(__m256d v, int c) {
    const __m256i idx = _mm256_setr_epi32(2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1, 2 * c, 2 * c + 1);
    return _mm256_castps_pd(_mm256_permutevar8x32_ps(_mm256_castpd_ps(v), idx));
}

EI_AVX2_INLINE void tile_legacy(const int type, const int nc, int n, int nr, float *s, size_t ss,
                                const uint8_t *x, size_t xs, const uint8_t *y, size_t ys) {
    const legacy_info L = legacy_of(type);
    const uint8_t *row[4], *col[EI_TILE];
    tile_rows(x, xs, nr, 4, row);
    tile_rows(y, ys, nc, EI_TILE, col);
    __m256d acc[EI_TILE];
    EI_UNROLL
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_pd();
    row_prefetch pf = prefetch_start(x, xs, n / 32);
    for (int i = 0; i < n / 32; i++) {
        const size_t ox = (size_t)i * L.xb, oy = (size_t)i * L.yb;
        if (nc == 1) prefetch_block(&pf);
        __m256i w[4], aw[4];
        EI_UNROLL
        for (int r = 0; r < 4; r++) {
            w[r] = unpack_legacy(type, row[r] + ox);
            aw[r] = L.offset < 0 ? _mm256_abs_epi8(w[r]) : w[r];
        }
        /* the fp16 scales (and minimum terms) of the 4 weight rows (x) and of the columns (y),
         * four columns to a vector */
        const __m256d dx = f16x4_at(row, ox), mx = L.with_min ? f16x4_at(row, ox + 2) : _mm256_setzero_pd();
        __m256d dy[EI_TILE / 4], sy[EI_TILE / 4];
        EI_UNROLL
        for (int g = 0; g < (nc + 3) / 4; g++) {
            dy[g] = f16x4_at(col + 4 * g, oy);
            sy[g] = L.with_min ? f16x4_at(col + 4 * g, oy + 2) : _mm256_setzero_pd();
        }
        EI_UNROLL
        for (int c = 0; c < nc; c++) {
            const __m256i yv = _mm256_loadu_si256((const __m256i *)(col[c] + oy + L.yqs));
            const __m256i yoff = offset_pairs(&L, yv);
            __m256i p[4];
            EI_UNROLL
            for (int r = 0; r < 4; r++) p[r] = pair_products(&L, w[r], aw[r], yv, yoff);
            const __m256d isum = _mm256_cvtepi32_pd(block_sums4(p[0], p[1], p[2], p[3], L.wide));
            /* with fp16 scales, isum * d_y and d_x * (isum * d_y) are exact (at most 31 and 42 bits):
             * the one rounding is where the reference adds the term */
            const __m256d prod = _mm256_mul_pd(isum, nc == 1 ? dy[0] : lane_pd(dy[c / 4], c % 4));
            if (L.with_min) {
                const __m256d term = _mm256_fmadd_pd(dx, prod, _mm256_mul_pd(mx, nc == 1 ? sy[0] : lane_pd(sy[c / 4], c % 4)));
                acc[c] = _mm256_add_pd(acc[c], term);
            } else {
                acc[c] = _mm256_fmadd_pd(dx, prod, acc[c]);
            }
        }
    }
    EI_UNROLL
    for (int c = 0; c < nc; c++) store_rows(s + (size_t)c * ss, acc[c], nr);
}

/* ---- K blocks ---------------------------------------------------------------------- */

EI_AVX2_INLINE void tile_k(const int type, const int nc, int n, int nr, float *s, size_t ss,
                           const uint8_t *x, size_t xs, const uint8_t *y, size_t ys) {
    const size_t xb = avx2_kblock_bytes(type);
    const int has_min = avx2_kblock_has_min(type);
    const uint8_t *row[4];
    tile_rows(x, xs, nr, 4, row);
    __m256d acc[EI_TILE];
    EI_UNROLL
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_pd();
    row_prefetch pf = prefetch_start(x, xs, n / QK_K);
    for (int i = 0; i < n / QK_K; i++) {
        if (nc == 1) prefetch_block(&pf);
        avx2_kblock w[4];
        double d[4], dm[4];
        EI_UNROLL
        for (int r = 0; r < 4; r++) avx2_kblock_unpack(type, row[r] + (size_t)i * xb, &w[r], &d[r], &dm[r]);
        const __m256d dx = _mm256_setr_pd(d[0], d[1], d[2], d[3]);
        const __m256d dmx = _mm256_setr_pd(dm[0], dm[1], dm[2], dm[3]);
        EI_UNROLL
        for (int c = 0; c < nc; c++) {
            const block_q8_K *yb = (const block_q8_K *)(y + (size_t)c * ys) + i;
            __m256i is[4], im[4];
            EI_UNROLL
            for (int r = 0; r < 4; r++) avx2_kblock_pair(type, &w[r], yb, &is[r], &im[r]);
            const __m256d yd = _mm256_set1_pd((double)yb->d);
            /* (d_y * d_x) * isum [- (d_y * dmin_x) * imin], each product rounded as the reference */
            __m256d term = _mm256_mul_pd(_mm256_mul_pd(yd, dx), _mm256_cvtepi32_pd(avx2_sum4_i32(is[0], is[1], is[2], is[3])));
            if (has_min)
                term = _mm256_sub_pd(term, _mm256_mul_pd(_mm256_mul_pd(yd, dmx),
                                                         _mm256_cvtepi32_pd(avx2_sum4_i32(im[0], im[1], im[2], im[3]))));
            acc[c] = _mm256_add_pd(acc[c], term);
        }
    }
    EI_UNROLL
    for (int c = 0; c < nc; c++) store_rows(s + (size_t)c * ss, acc[c], nr);
}

/* ---- float rows (F32, F16, BF16) ----------------------------------------------------
 * Every product of two such values is exact in double; each row's lane adds its products
 * in index order, as the reference does: the 4 rows are transposed into lanes, 4 values at
 * a time, and shared by the columns. */

EI_AVX2_INLINE __m128 load4_as_float(int type, const uint8_t *p) {
    if (type == EI_TYPE_F32) return _mm_loadu_ps((const float *)p);
    const __m128i h = _mm_loadl_epi64((const __m128i *)p);
    if (type == EI_TYPE_F16) return _mm_cvtph_ps(h);
    return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16));
}

EI_AVX2_INLINE float scalar_as_float(int type, const uint8_t *p) {
    if (type == EI_TYPE_F32) { float f; memcpy(&f, p, 4); return f; }
    uint16_t h;
    memcpy(&h, p, 2);
    return type == EI_TYPE_F16 ? ei_fp16_to_fp32(h) : ei_bf16_to_fp32(h);
}

EI_AVX2_INLINE void tile_float(const int type, const int nc, int n, int nr, float *s, size_t ss,
                               const uint8_t *x, size_t xs, const uint8_t *y, size_t ys) {
    const size_t es = type == EI_TYPE_F32 ? 4 : 2;
    const uint8_t *row[4], *col[EI_TILE];
    tile_rows(x, xs, nr, 4, row);
    tile_rows(y, ys, nc, EI_TILE, col);
    __m256d acc[EI_TILE];
    EI_UNROLL
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_pd();
    row_prefetch pf = prefetch_start(x, xs, n / 16);
    int d = 0;
    for (; d + 4 <= n; d += 4) {
        if (nc == 1 && d % 16 == 0) prefetch_block(&pf);
        __m128 r0 = load4_as_float(type, row[0] + d * es), r1 = load4_as_float(type, row[1] + d * es);
        __m128 r2 = load4_as_float(type, row[2] + d * es), r3 = load4_as_float(type, row[3] + d * es);
        _MM_TRANSPOSE4_PS(r0, r1, r2, r3); /* r0 = the rows' values at d, r1 at d + 1, ... */
        const __m256d w0 = _mm256_cvtps_pd(r0), w1 = _mm256_cvtps_pd(r1);
        const __m256d w2 = _mm256_cvtps_pd(r2), w3 = _mm256_cvtps_pd(r3);
        EI_UNROLL
        for (int c = 0; c < nc; c++) {
            const __m256d v = _mm256_cvtps_pd(load4_as_float(type, col[c] + d * es));
            acc[c] = _mm256_fmadd_pd(w0, _mm256_permute4x64_pd(v, 0x00), acc[c]);
            acc[c] = _mm256_fmadd_pd(w1, _mm256_permute4x64_pd(v, 0x55), acc[c]);
            acc[c] = _mm256_fmadd_pd(w2, _mm256_permute4x64_pd(v, 0xaa), acc[c]);
            acc[c] = _mm256_fmadd_pd(w3, _mm256_permute4x64_pd(v, 0xff), acc[c]);
        }
    }
    for (; d < n; d++) {
        const __m256d w = _mm256_setr_pd(scalar_as_float(type, row[0] + d * es), scalar_as_float(type, row[1] + d * es),
                                         scalar_as_float(type, row[2] + d * es), scalar_as_float(type, row[3] + d * es));
        EI_UNROLL
        for (int c = 0; c < nc; c++) acc[c] = _mm256_fmadd_pd(w, _mm256_set1_pd(scalar_as_float(type, col[c] + d * es)), acc[c]);
    }
    EI_UNROLL
    for (int c = 0; c < nc; c++) store_rows(s + (size_t)c * ss, acc[c], nr);
}

/* one function per type; the column count is a constant inside each inlined tile */
#if EI_TILE == 4
#define TILE_CASES(TILE, TYPE, ...) \
    case 1: TILE(TYPE, 1, __VA_ARGS__); break; \
    case 2: TILE(TYPE, 2, __VA_ARGS__); break; \
    case 3: TILE(TYPE, 3, __VA_ARGS__); break; \
    default: TILE(TYPE, 4, __VA_ARGS__); break;
#elif EI_TILE == 8
#define TILE_CASES(TILE, TYPE, ...) \
    case 1: TILE(TYPE, 1, __VA_ARGS__); break; \
    case 2: TILE(TYPE, 2, __VA_ARGS__); break; \
    case 3: TILE(TYPE, 3, __VA_ARGS__); break; \
    case 4: TILE(TYPE, 4, __VA_ARGS__); break; \
    case 5: TILE(TYPE, 5, __VA_ARGS__); break; \
    case 6: TILE(TYPE, 6, __VA_ARGS__); break; \
    case 7: TILE(TYPE, 7, __VA_ARGS__); break; \
    default: TILE(TYPE, 8, __VA_ARGS__); break;
#else
#error "the AVX2 tiles handle EI_TILE 4 or 8"
#endif

/* the tiles take 4 weight rows at a time; EI_TILE may allow more */
#define GEMM(T, TILE, TYPE)                                                                          \
    static void avx2_gemm_##T(int n, int nr, int nc, float *s, size_t ss, const void *x, size_t xs, \
                              const void *y, size_t ys) {                                           \
        for (int r = 0; r < nr; r += 4) {                                                           \
            const int m = nr - r < 4 ? nr - r : 4;                                                  \
            const uint8_t *xr = (const uint8_t *)x + (size_t)r * xs;                                \
            switch (nc) { TILE_CASES(TILE, TYPE, n, m, s + r, ss, xr, xs, y, ys) }                  \
        }                                                                                           \
    }
GEMM(q4_0, tile_legacy, EI_TYPE_Q4_0)
GEMM(q4_1, tile_legacy, EI_TYPE_Q4_1)
GEMM(q5_0, tile_legacy, EI_TYPE_Q5_0)
GEMM(q5_1, tile_legacy, EI_TYPE_Q5_1)
GEMM(q8_0, tile_legacy, EI_TYPE_Q8_0)
GEMM(q2_K, tile_k, EI_TYPE_Q2_K)
GEMM(q3_K, tile_k, EI_TYPE_Q3_K)
GEMM(q4_K, tile_k, EI_TYPE_Q4_K)
GEMM(q5_K, tile_k, EI_TYPE_Q5_K)
GEMM(q6_K, tile_k, EI_TYPE_Q6_K)
GEMM(f32, tile_float, EI_TYPE_F32)
GEMM(f16, tile_float, EI_TYPE_F16)
GEMM(bf16, tile_float, EI_TYPE_BF16)

/* Activation rows an interleaved product takes at once: a weight block is unpacked once for
 * all of them. Gemma 3 270M's prompt of 512 tokens on the AVX2 EPYC (bench --profile): Q5_0
 * products 112 -> 127 GFLOP/s, Q4_K 10 % faster, going from 4 to 8 */
#define AVX2_X16_TILE 8
static_assert(AVX2_X16_TILE <= EI_X16_TILE_MAX, "the x16 tile fits the engine's");

/* ---- legacy rows interleaved by 16 (block_q4_0x16, block_q4_1x16, block_q5_0x16, block_q8_0x16) -- */

/* the sum of the 32 int8 values of a block */
EI_AVX2_INLINE int avx2_block_sum(const int8_t *qs) {
    const __m256i biased = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)qs), _mm256_set1_epi8((char)0x80));
    const __m256i sad = _mm256_sad_epu8(biased, _mm256_setzero_si256()); /* 4 sums of (q + 128) */
    __m128i t = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
    t = _mm_add_epi64(t, _mm_unpackhi_epi64(t, t));
    return _mm_cvtsi128_si32(t) - 32 * 128;
}

/* the fifth bits of 8 rows' 4 bytes (block_q5_0x16's, block_q5_Kx16's qh) under the nibbles
 * of w (w[k]: values 4k..4k+3, w[4 + k]: 16 + 4k..): bit k of each byte to bit 4 of w[k],
 * bit 4 + k to that of w[4 + k]; the 16-bit shifts move no other byte's bit to bit 4 */
EI_AVX2_INLINE void or_fifth_bits(__m256i qh, __m256i *w) {
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    EI_UNROLL
    for (int k = 0; k < 4; k++) {
        w[k] = _mm256_or_si256(w[k], _mm256_and_si256(_mm256_slli_epi16(qh, 4 - k), bit4));
        w[4 + k] = _mm256_or_si256(w[4 + k], _mm256_and_si256(_mm256_srli_epi16(qh, k), bit4));
    }
}

EI_AVX2_INLINE int32_t bcast_bytes(const int8_t *p) {
    int32_t a;
    memcpy(&a, p, 4);
    return a;
}

/* a product streams its weights from memory once in decoding steps (of one sequence or a
 * batch of a few) and in a prompt's first tile: each block asks for the one this many blocks
 * ahead, whatever the column count (see x86_avx512/gemm.c: x16_prefetch) */
#define X16_PREFETCH_BLOCKS 12
EI_AVX2_INLINE void x16_prefetch(const uint8_t *x, size_t bytes) {
    for (size_t line = 0; line < bytes; line += 64) _mm_prefetch((const char *)x + X16_PREFETCH_BLOCKS * bytes + line, _MM_HINT_T0);
}

/* the rows' four fp16 fields h[4q..4q+3] as doubles */
EI_AVX2_INLINE __m256d f16x4_rows(const ei_f16 *h, int q) {
    return _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(h + 4 * q))));
}

/* the 8 weight vectors of rows 8h..8h+7 of a block of nibble pairs (Q4_0, Q4_1, Q5_0): w[k]
 * values 4k..4k+3, w[4 + k] values 16 + 4k.., with Q5_0's fifth bits */
EI_AVX2_INLINE void x16_nibble_weights(int type, const uint8_t *x, int h, __m256i w[8]) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    const uint8_t *qs = type == EI_TYPE_Q4_0 ? ((const block_q4_0x16 *)x)->qs
                      : type == EI_TYPE_Q4_1 ? ((const block_q4_1x16 *)x)->qs : ((const block_q5_0x16 *)x)->qs;
    const __m256i qh = type == EI_TYPE_Q5_0 ? _mm256_loadu_si256((const __m256i *)((const block_q5_0x16 *)x)->qh[8 * h])
                                            : _mm256_setzero_si256();
    EI_UNROLL
    for (int k = 0; k < 4; k++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 64 * k + 32 * h));
        w[k] = _mm256_and_si256(v, low);
        w[4 + k] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
    if (type == EI_TYPE_Q5_0) or_fifth_bits(qh, w);
}

/* the 8 rows' integer dots of one block with the activations a (their unsigned values, the
 * offset not taken off): the 8 products of 4 weight bytes with 4 broadcast activation bytes
 * (vpmaddubsw) add up in 16 bits without saturating (weights below 16: 8 x 3840 at most; below
 * 32, 4 x 7936 before each vpmaddwd) */
EI_AVX2_INLINE __m256i x16_nibble_dots(int type, const __m256i w[8], const int8_t *a) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i p16[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    EI_UNROLL
    for (int k = 0; k < 8; k++) /* w[k] meets activations 4k..4k+3 */
        p16[k / 4] = _mm256_add_epi16(p16[k / 4], _mm256_maddubs_epi16(w[k], _mm256_set1_epi32(bcast_bytes(a + 4 * k))));
    if (type == EI_TYPE_Q5_0) return _mm256_add_epi32(_mm256_madd_epi16(p16[0], ones), _mm256_madd_epi16(p16[1], ones));
    return _mm256_madd_epi16(_mm256_add_epi16(p16[0], p16[1]), ones);
}

/* what each column's block brings besides its values, made once for a span of groups
 * (avx2_gemm_x16_span): the offset times the block's sum, and d (and q8_1's s) as doubles */
#define X16_PREPARED_MAX 16384 /* values of a row whose blocks a span prepares (longer: per group) */
typedef struct {
    int32_t start[AVX2_X16_TILE][X16_PREPARED_MAX / QK8_0];
    double dy[AVX2_X16_TILE][X16_PREPARED_MAX / QK8_0], sy[AVX2_X16_TILE][X16_PREPARED_MAX / QK8_0];
} x16_prepared;

/* an activation block y's terms (d, then q8_1's s, then its values): the offset times its sum,
 * d, and s (d where the type has no minimum) */
EI_AVX2_INLINE void x16_block_terms(int type, const uint8_t *y, int32_t *start, double *dy, double *sy) {
    const int q4_1 = type == EI_TYPE_Q4_1, offset = type == EI_TYPE_Q4_0 ? -8 : type == EI_TYPE_Q5_0 ? -16 : 0;
    const size_t yq = q4_1 ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    *start = offset ? offset * avx2_block_sum((const int8_t *)(y + yq)) : 0;
    *dy = (double)avx2_f16(((const ei_f16 *)y)[0]);
    *sy = q4_1 ? (double)avx2_f16(((const ei_f16 *)y)[1]) : *dy;
}

EI_AVX2_INLINE void x16_prepare(int type, int n, int nc, const void *vy, size_t ys, x16_prepared *p) {
    const size_t yb = type == EI_TYPE_Q4_1 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    for (int c = 0; c < nc; c++)
        for (int i = 0; i < n / QK8_0; i++)
            x16_block_terms(type, (const uint8_t *)vy + (size_t)c * ys + (size_t)i * yb, &p->start[c][i], &p->dy[c][i],
                            &p->sy[c][i]);
}

static EI_THREAD_LOCAL x16_prepared x16_span_prepared; /* each thread's, for the span it is in */

/* Lane r = row r (rows 0..7 in half 0, 8..15 in half 1) of a block of Q4_0, Q4_1 or Q5_0:
 * x16_nibble_dots makes each row's isum, and the weights' offset (8 or 16) comes out as that
 * times the activation block's sum. Block terms (d_w d_x) isum are exact in double and added
 * in block order; Q4_1's (d_w d_x) isum + m_w s_x is rounded once, by the fma, as the
 * reference rounds it: vec_dot bit for bit. */
/* pre: the columns' prepared blocks, or NULL (made here, block by block) */
EI_AVX2_INLINE void avx2_gemm_x16_prep(int type, const x16_prepared *pre, int n, int nc, float *s, size_t ss,
                                       const void *vx, const void *vy, size_t ys) {
    const int q4_1 = type == EI_TYPE_Q4_1;
    const size_t bytes = q4_1 ? sizeof(block_q4_1x16) : type == EI_TYPE_Q5_0 ? sizeof(block_q5_0x16) : sizeof(block_q4_0x16);
    const size_t yb = q4_1 ? sizeof(block_q8_1) : sizeof(block_q8_0), yq = q4_1 ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    const uint8_t *x = vx;
    __m256d acc[AVX2_X16_TILE][4]; /* (column, rows 4q..4q+3) */
    for (int c = 0; c < AVX2_X16_TILE; c++)
        for (int q = 0; q < 4; q++) acc[c][q] = _mm256_setzero_pd();
    for (int i = 0; i < n / QK4_0; i++, x += bytes) {
        x16_prefetch(x, bytes);
        const ei_f16 *d = (const ei_f16 *)x, *m = q4_1 ? ((const block_q4_1x16 *)x)->m : NULL; /* d: the first field */
        const int8_t *a[AVX2_X16_TILE];
        int start[AVX2_X16_TILE];
        __m256d dy[AVX2_X16_TILE], sy[AVX2_X16_TILE];
        for (int c = 0; c < nc; c++) {
            const uint8_t *y = (const uint8_t *)vy + (size_t)c * ys + (size_t)i * yb; /* d, then q8_1's s */
            a[c] = (const int8_t *)(y + yq);
            int32_t bo; /* the block's offset term, d and s */
            double bd, bs;
            if (pre) bo = pre->start[c][i], bd = pre->dy[c][i], bs = pre->sy[c][i];
            else x16_block_terms(type, y, &bo, &bd, &bs);
            start[c] = bo;
            dy[c] = _mm256_set1_pd(bd);
            sy[c] = _mm256_set1_pd(bs);
        }
        EI_UNROLL
        for (int h = 0; h < 2; h++) {
            __m256i w[8];
            x16_nibble_weights(type, x, h, w);
            const __m256d dw[2] = {f16x4_rows(d, 2 * h), f16x4_rows(d, 2 * h + 1)};
            __m256d mw[2] = {dw[0], dw[1]};
            if (q4_1) mw[0] = f16x4_rows(m, 2 * h), mw[1] = f16x4_rows(m, 2 * h + 1);
            for (int c = 0; c < nc; c++) {
                const __m256i isum = _mm256_add_epi32(x16_nibble_dots(type, w, a[c]), _mm256_set1_epi32(start[c]));
                const __m256d is[2] = {_mm256_cvtepi32_pd(_mm256_castsi256_si128(isum)), _mm256_cvtepi32_pd(_mm256_extracti128_si256(isum, 1))};
                EI_UNROLL
                for (int part = 0; part < 2; part++) {
                    __m256d *sum = &acc[c][2 * h + part];
                    if (q4_1) *sum = _mm256_add_pd(*sum, _mm256_fmadd_pd(is[part], _mm256_mul_pd(dw[part], dy[c]), _mm256_mul_pd(mw[part], sy[c])));
                    else *sum = _mm256_fmadd_pd(is[part], _mm256_mul_pd(dw[part], dy[c]), *sum);
                }
            }
        }
    }
    for (int c = 0; c < nc; c++)
        for (int q = 0; q < 4; q++) _mm_storeu_ps(s + (size_t)c * ss + 4 * q, _mm256_cvtpd_ps(acc[c][q]));
}

/* Q8_0's signed weights, lane r = row r as above: |w| and the activation with w's sign go into
 * vpmaddubsw (the activations are in [-127, 127], so the sign never meets -128), whose pairs
 * reach 2 x 128 x 127 = 32512 and so take a vpmaddwd each (two would overflow int16); the
 * integer dots are exact and the block terms added as above */
EI_AVX2_INLINE void avx2_gemm_x16_signed(int n, int nc, float *s, size_t ss, const void *vx, const void *vy, size_t ys) {
    const uint8_t *x = vx;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256d acc[AVX2_X16_TILE][4]; /* (column, rows 4q..4q+3) */
    for (int c = 0; c < AVX2_X16_TILE; c++)
        for (int q = 0; q < 4; q++) acc[c][q] = _mm256_setzero_pd();
    for (int i = 0; i < n / QK8_0; i++, x += sizeof(block_q8_0x16)) {
        x16_prefetch(x, sizeof(block_q8_0x16));
        const block_q8_0x16 *b = (const block_q8_0x16 *)x;
        EI_UNROLL
        for (int h = 0; h < 2; h++) {
            __m256i w[8], aw[8]; /* w[k]: values 4k..4k+3 of rows 8h..8h+7 */
            EI_UNROLL
            for (int k = 0; k < 8; k++) {
                w[k] = _mm256_loadu_si256((const __m256i *)(b->qs + 64 * k + 32 * h));
                aw[k] = _mm256_abs_epi8(w[k]);
            }
            const __m256d dw[2] = {f16x4_rows(b->d, 2 * h), f16x4_rows(b->d, 2 * h + 1)};
            for (int c = 0; c < nc; c++) {
                const block_q8_0 *y = (const block_q8_0 *)((const uint8_t *)vy + (size_t)c * ys) + i;
                __m256i isum = _mm256_setzero_si256();
                EI_UNROLL
                for (int k = 0; k < 8; k++) {
                    const __m256i yk = _mm256_sign_epi8(_mm256_set1_epi32(bcast_bytes(y->qs + 4 * k)), w[k]);
                    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(aw[k], yk), ones));
                }
                const __m256d dy = _mm256_set1_pd((double)avx2_f16(y->d));
                acc[c][2 * h] = _mm256_fmadd_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(isum)), _mm256_mul_pd(dw[0], dy), acc[c][2 * h]);
                acc[c][2 * h + 1] = _mm256_fmadd_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(isum, 1)), _mm256_mul_pd(dw[1], dy), acc[c][2 * h + 1]);
            }
        }
    }
    for (int c = 0; c < nc; c++)
        for (int q = 0; q < 4; q++) _mm_storeu_ps(s + (size_t)c * ss + 4 * q, _mm256_cvtpd_ps(acc[c][q]));
}

#define X16_CASES(KERNEL, ...) EI_X16_CASES(AVX2_X16_TILE, KERNEL, __VA_ARGS__)

/* avx2_gemm_x16_T: KERNEL(ARG, ...) for every column count */
#define X16_FN(T, KERNEL, ...)                                                                            \
    static void avx2_gemm_x16_##T(int n, int nc, float *s, size_t ss, const void *x, const void *y, size_t ys) { \
        X16_CASES(KERNEL, __VA_ARGS__,)                                                                   \
    }
/* avx2_gemm_x16_T, and avx2_gemm_x16_span_T: a prompt's span of groups with its columns'
 * blocks prepared once (decoding, one column, group by group). The 1.1B Q4_0 model's pp512
 * (AVX2 kernels on the AVX-512 EPYC, bench --isa avx2 --profile): Q4_0 products 364 -> 384-390
 * GFLOP/s */
#define X16_SPAN_FNS(T, TYPE)                                                                                     \
    X16_FN(T, avx2_gemm_x16_prep, TYPE, NULL)                                                                     \
    static void avx2_gemm_x16_span_##T(int n, int ng, int nc, float *s, size_t ss, const void *x, const void *y,  \
                                       size_t ys) {                                                               \
        const size_t group = ei_x16_size(TYPE, n);                                                                \
        const x16_prepared *pre = nc > 1 && n <= X16_PREPARED_MAX ? &x16_span_prepared : NULL;                   \
        if (pre) x16_prepare(TYPE, n, nc, y, ys, &x16_span_prepared);                                             \
        for (int g = 0; g < ng; g++, s += EI_X16, x = (const uint8_t *)x + group) {                               \
            X16_CASES(avx2_gemm_x16_prep, TYPE, pre,)                                                             \
        }                                                                                                         \
    }
X16_SPAN_FNS(q4_0, EI_TYPE_Q4_0)
X16_SPAN_FNS(q4_1, EI_TYPE_Q4_1)
X16_SPAN_FNS(q5_0, EI_TYPE_Q5_0)
static void avx2_gemm_x16_q8_0(int n, int nc, float *s, size_t ss, const void *x, const void *y, size_t ys) {
    X16_CASES(avx2_gemm_x16_signed, )
}

/* ---- K super-blocks interleaved by 16 (block_q4_Kx16, block_q5_Kx16, block_q6_Kx16) ------- */

/* what every column shares in a super-block: for each half h (rows 8h..8h+7, one per 32-bit
 * lane) the int16 pair (s, s) of each sub-block's scale, and the int16 multipliers of each pair
 * of the activation's block sums; the rows' d (and dmin) as doubles, four rows a vector */
typedef struct {
    __m256i sc[2][16];
    __m256i bmul[2][8];
    __m256d d[4], dmin[4];
} kx16_shared;

/* (lo, hi) int16 pairs of 8 int32 lanes */
EI_AVX2_INLINE __m256i pairs16(__m256i lo, __m256i hi) {
    return _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(hi, 16));
}

/* type: EI_TYPE_Q4_K, Q5_K or Q6_K (a constant in each inlined copy); a block_q5_Kx16 starts
 * with its block_q4_Kx16, which is all the scales there are */
EI_AVX2_INLINE void kx16_prepare(int type, const uint8_t *x, kx16_shared *sh) {
    const int q6 = type == EI_TYPE_Q6_K;
    const ei_f16 *d = q6 ? ((const block_q6_Kx16 *)x)->d : ((const block_q4_Kx16 *)x)->d;
    for (int q = 0; q < 4; q++) {
        sh->d[q] = _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(d + 4 * q))));
        if (!q6)
            sh->dmin[q] = _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(((const block_q4_Kx16 *)x)->dmin + 4 * q))));
    }
    for (int h = 0; h < 2; h++) {
        if (q6) {
            const block_q6_Kx16 *b = (const block_q6_Kx16 *)x;
            __m256i v[16];
            for (int j = 0; j < 16; j++) {
                v[j] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b->sc[j] + 8 * h)));
                sh->sc[h][j] = pairs16(v[j], v[j]);
            }
            /* the values are stored 32 up: 32 sc times each block sum comes off */
            for (int m = 0; m < 8; m++) sh->bmul[h][m] = pairs16(_mm256_slli_epi32(v[2 * m], 5), _mm256_slli_epi32(v[2 * m + 1], 5));
        } else {
            const block_q4_Kx16 *b = (const block_q4_Kx16 *)x;
            for (int j = 0; j < 8; j++) {
                const __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b->sc[j] + 8 * h)));
                const __m256i mn = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b->mn[j] + 8 * h)));
                sh->sc[h][j] = pairs16(sc, sc);
                sh->bmul[h][j] = pairs16(mn, mn); /* both block sums of sub-block j */
            }
        }
    }
}

/* the 8 weight vectors of unit j for rows 8h..8h+7: w[k] values 4k..4k+3, w[4 + k] 16 + 4k.. */
EI_AVX2_INLINE void kx16_unit(int type, const uint8_t *x, int j, int h, __m256i *w) {
    const int q6 = type == EI_TYPE_Q6_K;
    const __m256i low = _mm256_set1_epi8(0x0F);
    const uint8_t *qs = q6 ? ((const block_q6_Kx16 *)x)->ql[j] : ((const block_q4_Kx16 *)x)->qs[j];
    EI_UNROLL
    for (int k = 0; k < 4; k++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 64 * k + 32 * h));
        w[k] = _mm256_and_si256(v, low);
        w[4 + k] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
    if (type == EI_TYPE_Q5_K) or_fifth_bits(_mm256_loadu_si256((const __m256i *)(((const block_q5_Kx16 *)x)->qh[j] + 32 * h)), w);
    if (!q6) return;
    const __m256i two = _mm256_set1_epi8(0x30);
    const uint8_t *qh = ((const block_q6_Kx16 *)x)->qh[j];
    EI_UNROLL
    for (int m = 0; m < 2; m++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qh + 64 * m + 32 * h));
        w[2 * m] = _mm256_or_si256(w[2 * m], _mm256_and_si256(_mm256_slli_epi16(v, 4), two));
        w[4 + 2 * m] = _mm256_or_si256(w[4 + 2 * m], _mm256_and_si256(_mm256_slli_epi16(v, 2), two));
        w[2 * m + 1] = _mm256_or_si256(w[2 * m + 1], _mm256_and_si256(v, two));
        w[4 + 2 * m + 1] = _mm256_or_si256(w[4 + 2 * m + 1], _mm256_and_si256(_mm256_srli_epi16(v, 2), two));
    }
}

EI_AVX2_INLINE __m256i bcast4(const int8_t *p) {
    int32_t a;
    memcpy(&a, p, 4);
    return _mm256_set1_epi32(a);
}

/* iacc (rows 8h..8h+7) += the scaled integer dots of unit j with one activation row: Q4_K's
 * unit is one sub-block (8 products of values below 16 add up in int16: 8 x 3840), Q5_K's
 * too, whose values below 32 allow four (4 x 7936 = 31744), Q6_K's two sub-blocks, whose
 * values below 64 allow two */
EI_AVX2_INLINE __m256i kx16_dots(int type, const __m256i *w, const int8_t *y, const __m256i *sc, int j,
                                 __m256i iacc) {
    if (type == EI_TYPE_Q5_K) {
        __m256i p[2];
        EI_UNROLL
        for (int half = 0; half < 2; half++) { /* values 16 half .. 16 half + 15 */
            const __m256i *wh = w + 4 * half;
            const int8_t *yh = y + 16 * half;
            p[half] = _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(wh[0], bcast4(yh)), _mm256_maddubs_epi16(wh[1], bcast4(yh + 4))),
                                       _mm256_add_epi16(_mm256_maddubs_epi16(wh[2], bcast4(yh + 8)), _mm256_maddubs_epi16(wh[3], bcast4(yh + 12))));
        }
        return _mm256_add_epi32(iacc, _mm256_add_epi32(_mm256_madd_epi16(p[0], sc[j]), _mm256_madd_epi16(p[1], sc[j])));
    }
    if (type == EI_TYPE_Q4_K) { /* w[k] meets values 4k..4k+3; two chains of adds */
        __m256i p[2] = {_mm256_maddubs_epi16(w[0], bcast4(y)), _mm256_maddubs_epi16(w[1], bcast4(y + 4))};
        EI_UNROLL
        for (int k = 2; k < 8; k++) p[k & 1] = _mm256_add_epi16(p[k & 1], _mm256_maddubs_epi16(w[k], bcast4(y + 4 * k)));
        return _mm256_add_epi32(iacc, _mm256_madd_epi16(_mm256_add_epi16(p[0], p[1]), sc[j]));
    }
    EI_UNROLL
    for (int half = 0; half < 2; half++) { /* sub-block 2j + half: values 16 half .. 16 half + 15 */
        const __m256i *wh = w + 4 * half;
        const int8_t *yh = y + 16 * half;
        const __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(wh[0], bcast4(yh)), _mm256_maddubs_epi16(wh[1], bcast4(yh + 4)));
        const __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(wh[2], bcast4(yh + 8)), _mm256_maddubs_epi16(wh[3], bcast4(yh + 12)));
        iacc = _mm256_add_epi32(iacc, _mm256_add_epi32(_mm256_madd_epi16(p0, sc[2 * j + half]), _mm256_madd_epi16(p1, sc[2 * j + half])));
    }
    return iacc;
}

/* Decoding streams the weights once, and the hardware prefetchers fall behind on it: each of
 * the 16 units of a super-block asks for a 16th of the bytes KX16_PREFETCH ahead. On the AVX2
 * EPYC a whole super-block asked for at once, 3 ahead, read 6.9 GB/s (Q4_K, 2048 x 8192, one
 * thread), spread over the units 10.5; the random 1.1B Q4_K_M model's Q4_K products with two
 * threads 12.9 -> 17 GB/s (12288 and 16384 bytes ahead measured no better). Prompts stream a
 * matrix once per tile of tokens, and fall behind as well where it is larger than the caches:
 * asking at every tile width took 4 columns of 8192 x 8192 (one thread, best of
 * 5, four runs on the shared EPYC) from 16.0-17.4 ms to 6.4-10.5 for Q5_K, 18.1-19.9 to 7.6-11.6
 * for Q6_K, 7.1-7.2 to 5.6-6.0 for Q4_K, and changed nothing measurable at 2048 x 2048 */
#define KX16_PREFETCH 8192
EI_AVX2_INLINE void kx16_prefetch(const uint8_t *x, size_t bytes, int unit) {
    const size_t lo = (size_t)unit * bytes / 16, hi = (size_t)(unit + 1) * bytes / 16;
    for (size_t off = lo & ~(size_t)63; off < hi; off += 64) _mm_prefetch((const char *)x + KX16_PREFETCH + off, _MM_HINT_T0);
}

/* Lane r of a vector = row r of 8: per super-block and half, the rows' integer sums with
 * every activation row come out of broadcast activation bytes (no horizontal sums), and the
 * super-block's term is rounded as the reference rounds it: (d_y d) isum - (d_y dmin) imin for
 * Q4_K and Q5_K, (d_y d) isum for Q6_K, added in super-block order: vec_dot bit for bit. */
EI_AVX2_INLINE void avx2_gemm_kx16(int type, int n, int nc, float *s, size_t ss, const void *vx, const void *vy,
                                   size_t ys) {
    const int q6 = type == EI_TYPE_Q6_K;
    const size_t bytes = q6 ? sizeof(block_q6_Kx16) : type == EI_TYPE_Q5_K ? sizeof(block_q5_Kx16) : sizeof(block_q4_Kx16);
    const uint8_t *x = vx;
    __m256d acc[AVX2_X16_TILE][4]; /* (column, rows 4q..4q+3) */
    for (int c = 0; c < AVX2_X16_TILE; c++)
        for (int q = 0; q < 4; q++) acc[c][q] = _mm256_setzero_pd();
    kx16_shared sh;
    for (int i = 0; i < n / QK_K; i++, x += bytes) {
        kx16_prepare(type, x, &sh);
        for (int h = 0; h < 2; h++) {
            __m256i iacc[AVX2_X16_TILE];
            for (int c = 0; c < nc; c++) iacc[c] = _mm256_setzero_si256();
            for (int j = 0; j < QK_K / 32; j++) {
                kx16_prefetch(x, bytes, 8 * h + j);
                __m256i w[8];
                kx16_unit(type, x, j, h, w);
                for (int c = 0; c < nc; c++) {
                    const block_q8_K *y = (const block_q8_K *)((const uint8_t *)vy + (size_t)c * ys) + i;
                    iacc[c] = kx16_dots(type, w, y->qs + 32 * j, sh.sc[h], j, iacc[c]);
                }
            }
            for (int c = 0; c < nc; c++) {
                const block_q8_K *y = (const block_q8_K *)((const uint8_t *)vy + (size_t)c * ys) + i;
                __m256i imin = _mm256_setzero_si256();
                EI_UNROLL
                for (int m = 0; m < 8; m++)
                    imin = _mm256_add_epi32(imin, _mm256_madd_epi16(sh.bmul[h][m], bcast4((const int8_t *)(y->bsums + 2 * m))));
                const __m256d yd = _mm256_set1_pd((double)y->d);
                if (q6) iacc[c] = _mm256_sub_epi32(iacc[c], imin);
                EI_UNROLL
                for (int part = 0; part < 2; part++) {
                    const int q = 2 * h + part;
                    const __m128i is = part ? _mm256_extracti128_si256(iacc[c], 1) : _mm256_castsi256_si128(iacc[c]);
                    __m256d term = _mm256_mul_pd(_mm256_mul_pd(yd, sh.d[q]), _mm256_cvtepi32_pd(is));
                    if (!q6) {
                        const __m128i im = part ? _mm256_extracti128_si256(imin, 1) : _mm256_castsi256_si128(imin);
                        term = _mm256_sub_pd(term, _mm256_mul_pd(_mm256_mul_pd(yd, sh.dmin[q]), _mm256_cvtepi32_pd(im)));
                    }
                    acc[c][q] = _mm256_add_pd(acc[c][q], term);
                }
            }
        }
    }
    for (int c = 0; c < nc; c++)
        for (int q = 0; q < 4; q++) _mm_storeu_ps(s + (size_t)c * ss + 4 * q, _mm256_cvtpd_ps(acc[c][q]));
}

X16_FN(q4_K, avx2_gemm_kx16, EI_TYPE_Q4_K)
X16_FN(q5_K, avx2_gemm_kx16, EI_TYPE_Q5_K)
X16_FN(q6_K, avx2_gemm_kx16, EI_TYPE_Q6_K)

/* ---- F16 and BF16 rows interleaved by 16 (block_f16x16) ------------------------------------
 * Lane r = row r: value d of rows 4q..4q+3 is one 8-byte load, converted to doubles once for
 * all columns, and each column's value d is converted once into a chunk of doubles that every
 * row's pass broadcasts from. A product of two such values is exact in double, so a fused add
 * rounds as the reference's add, and each (row, column) lane adds in index order: vec_dot bit
 * for bit. Those sums are serial chains of fused adds (5 cycles each on the EPYC), so a pass
 * takes as many rows as keep up to 8 chains in registers: 16 rows for 1-2 columns, 8 for 3-4,
 * 4 for more. Decoding reads the 16 rows as one run of memory instead of 4 row streams. */
#define HX16_CHUNK 64 /* values a pass covers: (columns, chunk) doubles stay in L1 */
/* Decoding reads the copy once, and the prefetchers fall behind on it (as on kx16's): asking
 * for each line 4096 bytes ahead took 2048 x 2048 F16, one column, one thread on the EPYC from
 * 1.30-1.46 ms to 0.90-0.95 (1024 and 8192 ahead measured no better) */
#define HX16_PREFETCH 4096

/* value d of 4 rows (or 4 consecutive values of a row) as doubles */
EI_AVX2_INLINE __m256d half4_pd(int bf16, const uint16_t *p) {
    const __m128i h = _mm_loadl_epi64((const __m128i *)p);
    return _mm256_cvtps_pd(bf16 ? _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16)) : _mm_cvtph_ps(h));
}

/* a[j] = value j of m values of an activation row, as doubles */
EI_AVX2_INLINE void half_chunk(int bf16, const uint16_t *y, int m, double *a) {
    int j = 0;
    for (; j + 4 <= m; j += 4) _mm256_storeu_pd(a + j, half4_pd(bf16, y + j));
    for (; j < m; j++) a[j] = bf16 ? ei_bf16_to_fp32(y[j]) : ei_fp16_to_fp32(y[j]);
}

/* acc[c][q0 + k] (rows 4(q0 + k)..) += the chunk's m products with column c, k < nq */
EI_AVX2_INLINE void hx16_pass(int bf16, int nc, int nq, int q0, int m, const block_f16x16 *x,
                              double (*a)[HX16_CHUNK], __m256d (*acc)[4]) {
    __m256d r[8]; /* (column, quarter): nc * nq <= 8 */
    EI_UNROLL
    for (int c = 0; c < nc; c++) {
        EI_UNROLL
        for (int k = 0; k < nq; k++) r[c * nq + k] = acc[c][q0 + k];
    }
    for (int j = 0; j < m; j++) {
        if (q0 == 0 && j % 2 == 0) /* a line holds 2 values of the 16 rows */
            _mm_prefetch((const char *)(x + j) + HX16_PREFETCH, _MM_HINT_T0);
        __m256d w[4];
        EI_UNROLL
        for (int k = 0; k < nq; k++) w[k] = half4_pd(bf16, x[j].v + 4 * (q0 + k));
        EI_UNROLL
        for (int c = 0; c < nc; c++) {
            const __m256d v = _mm256_broadcast_sd(&a[c][j]);
            EI_UNROLL
            for (int k = 0; k < nq; k++) r[c * nq + k] = _mm256_fmadd_pd(w[k], v, r[c * nq + k]);
        }
    }
    EI_UNROLL
    for (int c = 0; c < nc; c++) {
        EI_UNROLL
        for (int k = 0; k < nq; k++) acc[c][q0 + k] = r[c * nq + k];
    }
}

EI_AVX2_INLINE void avx2_gemm_hx16(int bf16, int n, int nc, float *s, size_t ss, const void *vx, const void *vy,
                                   size_t ys) {
    const int nq = nc <= 2 ? 4 : nc <= 4 ? 2 : 1; /* quarters (4 rows) a pass */
    const block_f16x16 *x = vx;
    double a[AVX2_X16_TILE][HX16_CHUNK]; /* (column, chunk) */
    __m256d acc[AVX2_X16_TILE][4];       /* (column, rows 4q..4q+3) */
    for (int c = 0; c < nc; c++)
        for (int q = 0; q < 4; q++) acc[c][q] = _mm256_setzero_pd();
    for (int d0 = 0; d0 < n; d0 += HX16_CHUNK) {
        const int m = n - d0 < HX16_CHUNK ? n - d0 : HX16_CHUNK;
        for (int c = 0; c < nc; c++) half_chunk(bf16, (const uint16_t *)((const uint8_t *)vy + (size_t)c * ys) + d0, m, a[c]);
        for (int q0 = 0; q0 < 4; q0 += nq) hx16_pass(bf16, nc, nq, q0, m, x + d0, a, acc);
    }
    for (int c = 0; c < nc; c++)
        for (int q = 0; q < 4; q++) _mm_storeu_ps(s + (size_t)c * ss + 4 * q, _mm256_cvtpd_ps(acc[c][q]));
}

X16_FN(f16, avx2_gemm_hx16, 0)
X16_FN(bf16, avx2_gemm_hx16, 1)

void ei_avx2_gemm_kernels(ei_kernels *k) {
    k->x16_tile = AVX2_X16_TILE;
    k->gemm_x16[EI_TYPE_Q4_K] = avx2_gemm_x16_q4_K;
    k->gemm_x16[EI_TYPE_Q5_K] = avx2_gemm_x16_q5_K;
    k->gemm_x16[EI_TYPE_Q6_K] = avx2_gemm_x16_q6_K;
    k->gemm_x16[EI_TYPE_Q4_0] = avx2_gemm_x16_q4_0;
    k->gemm_x16_span[EI_TYPE_Q4_0] = avx2_gemm_x16_span_q4_0;
    k->gemm_x16_span[EI_TYPE_Q4_1] = avx2_gemm_x16_span_q4_1;
    k->gemm_x16_span[EI_TYPE_Q5_0] = avx2_gemm_x16_span_q5_0;
    k->gemm_x16[EI_TYPE_Q5_0] = avx2_gemm_x16_q5_0;
    k->gemm_x16[EI_TYPE_Q4_1] = avx2_gemm_x16_q4_1;
    k->gemm_x16[EI_TYPE_Q8_0] = avx2_gemm_x16_q8_0;
    k->gemm_x16[EI_TYPE_F16] = avx2_gemm_x16_f16;
    k->gemm_x16[EI_TYPE_BF16] = avx2_gemm_x16_bf16;
    k->gemm[EI_TYPE_Q4_0] = avx2_gemm_q4_0;
    k->gemm[EI_TYPE_Q4_1] = avx2_gemm_q4_1;
    k->gemm[EI_TYPE_Q5_0] = avx2_gemm_q5_0;
    k->gemm[EI_TYPE_Q5_1] = avx2_gemm_q5_1;
    k->gemm[EI_TYPE_Q8_0] = avx2_gemm_q8_0;
    k->gemm[EI_TYPE_Q2_K] = avx2_gemm_q2_K;
    k->gemm[EI_TYPE_Q3_K] = avx2_gemm_q3_K;
    k->gemm[EI_TYPE_Q4_K] = avx2_gemm_q4_K;
    k->gemm[EI_TYPE_Q5_K] = avx2_gemm_q5_K;
    k->gemm[EI_TYPE_Q6_K] = avx2_gemm_q6_K;
    k->gemm[EI_TYPE_F32] = avx2_gemm_f32;
    k->gemm[EI_TYPE_F16] = avx2_gemm_f16;
    k->gemm[EI_TYPE_BF16] = avx2_gemm_bf16;
}
