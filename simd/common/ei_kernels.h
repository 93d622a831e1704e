/* The kernel table: every operation of a decoder step that has an instruction-set variant.
 *
 * Each instruction set fills one table (ref/, x86_avx2/, x86_avx512/, arm_neon/); a variant
 * starts from the scalar reference table and overrides what it implements, so a missing
 * kernel falls back to the reference rather than to nothing. Every variant of a kernel
 * computes the same function: integer results bit for bit, floating point within a stated
 * tolerance (tests/simd).
 *
 * Every instruction-set folder uses the same file names for the same jobs, so a reader who
 * knows one knows them all and a missing variant shows as a missing file:
 *   quants.c   activation quantizers and row decoders (from_float, to_float) and the dot
 *              product of one weight row with one activation row (vec_dot)
 *   gemm.c     tiles of a matrix product (gemm) and products of interleaved rows (gemm_x16)
 *   ops.c      rms_norm, rope, geglu / swiglu, add, scale
 *   attn.c     attention (attn, attn_group, attn_block) and its softmax (attn_softmax, with
 *              common/ei_exp.h's exp); its scalar middle is common/attn_softmax.h
 *   kivi.c     KIVI cache quantization: quantizers, key dots, value decoders (common/kivi.h)
 *   kernels.c  the folder's table: ei_kernels_init_<isa>
 *   simd.h     the folder's private header: intrinsics, inline helpers, its files' entry points
 *   blocks.h   weight blocks unpacked for the integer products, shared by quants.c and gemm.c
 * ref/ has no private headers; its gemm.c holds the references of the interleaved products
 * only (ei_ref_gemm_x16), and a NULL gemm loops vec_dot. */
#ifndef EI_KERNELS_H
#define EI_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ei_blocks.h"

/* s[0] = dot(n values of weight row x, n activations y in the weight type's partner type) */
typedef void (*ei_vec_dot_fn)(int n, float *s, const void *x, const void *y);
/* s[c * s_stride + r] = dot(row r of x, activation row c of y) for r < nr, c < nc, with
 * nr, nc <= EI_TILE: one tile of a matrix product, each dot exactly as vec_dot computes it */
typedef void (*ei_gemm_fn)(int n, int nr, int nc, float *s, size_t s_stride, const void *x, size_t x_stride,
                           const void *y, size_t y_stride);
#define EI_TILE 4
/* EI_X16 weight rows in an interleaved layout (ei_pack_x16) against nc <= the table's x16_tile
 * activation rows: s[c * s_stride + r] = dot(row r, activation row c) for r < EI_X16, each
 * exactly as vec_dot computes it on the rows as stored in the file */
#define EI_X16_TILE_MAX 8
typedef void (*ei_gemm_x16_fn)(int n, int nc, float *s, size_t s_stride, const void *x, const void *y,
                               size_t y_stride);
/* gemm_x16 over ng consecutive groups of one interleaved tensor (group g at x + g *
 * ei_x16_size(type, n), its outputs at s + g * EI_X16), for a table that shares work between
 * the groups of a span (AVX-512's activations prepared once) */
typedef void (*ei_gemm_x16_span_fn)(int n, int ng, int nc, float *s, size_t s_stride, const void *x, const void *y,
                                    size_t y_stride);
/* inside an ei_gemm_x16_fn (n, nc, s, ss, x, y, ys): KERNEL(..., n, nc, ...) with the column count
 * a constant in each inlined copy, so that a tile's accumulators stay in registers */
#define EI_X16_CASES(TILE, KERNEL, ...)                                 \
    switch (nc) {                                                       \
    case 1: KERNEL(__VA_ARGS__ n, 1, s, ss, x, y, ys); break;           \
    case 2: KERNEL(__VA_ARGS__ n, 2, s, ss, x, y, ys); break;           \
    case 3: KERNEL(__VA_ARGS__ n, 3, s, ss, x, y, ys); break;           \
    case 4: KERNEL(__VA_ARGS__ n, 4, s, ss, x, y, ys); break;           \
    case 5: KERNEL(__VA_ARGS__ n, 5, s, ss, x, y, ys); break;           \
    case 6: KERNEL(__VA_ARGS__ n, 6, s, ss, x, y, ys); break;           \
    case 7: KERNEL(__VA_ARGS__ n, 7, s, ss, x, y, ys); break;           \
    default: KERNEL(__VA_ARGS__ n, TILE, s, ss, x, y, ys); break;       \
    }

/* y = n activations x converted to a partner type (q8_0, q8_1, q8_K, f16, bf16 blocks), or
 * keys and values to a cache type (q4_0 is one only for the cache) */
typedef void (*ei_from_float_fn)(const float *x, void *y, int64_t n);
/* y = n floats decoded from a row of blocks x */
typedef void (*ei_to_float_fn)(const void *x, float *y, int64_t n);

#define EI_MAX_HEAD_DIM 512

#if defined(_MSC_VER)
#define EI_THREAD_LOCAL __declspec(thread)
#else
#define EI_THREAD_LOCAL _Thread_local
#endif

/* One query head against the cache of one KV head, as llama.cpp's unfused attention rounds:
 * the query is rounded to the key type (float16 for an f16 cache, q8_0 blocks for the
 * quantized ones, as GGML quantizes activations for a product with q8_0 or q4_0 weights);
 * scores[t] = dot(q, k[t]) over the keys this query sees (in double, rounded to float; for a
 * quantized cache exactly as vec_dot computes a weight row's dot), times scale, optionally
 * soft-capped; softmax weights exp(s - max) / sum in double, rounded to float and then to the
 * value type (f16 only); out = sum_t p[t] * v[t] in double, rounded to float, a quantized
 * value row entering decoded (exactly, by to_float).
 *
 * The keys seen are runs of consecutive cache rows, oldest first: one run for a plain cache,
 * two where a ring buffer wraps, one per block of a paged cache. Row t of a run starts at
 * k + t * k_row_bytes bytes (v + t * v_row_bytes). scratch holds 1.5 * n doubles, n the
 * number of keys of all runs together. */
typedef struct {
    const void *k, *v; /* the run's first key row and value row */
    int n;             /* its rows */
    int t0;            /* its first row's place in its block (a KIVI key group: k is the group's) */
    const float *cs;   /* NULL, or (n_rot / 2 cos, sin pairs) the rotation its keys are ahead of
                        * their positions (keys kept as first rotated: common/key_shifts.h); a
                        * quantized key cache's query is rotated by it for this run */
} ei_attn_run;

#define EI_ATTN_MAX_RUNS 64 /* runs of one query: ring wraps and paged blocks stay far below */

typedef struct ei_kernels ei_kernels;

typedef struct {
    int head_dim, head_dim_v;
    int n_runs;
    const ei_attn_run *runs;         /* the keys this query sees, in position order */
    int k_type, v_type;              /* cache element types (GGML types; see attn_types) */
    size_t k_row_bytes, v_row_bytes; /* bytes between consecutive positions of a run */
    float scale;                     /* applied to the scores (1 when the queries are pre-scaled) */
    float softcap;                   /* 0: none; else scores = softcap * tanh(scores / softcap) */
    const ei_kernels *kt;            /* the attention's own table: the quantizer, dots and
                                        decoders a quantized cache is read with */
    int64_t *track;                  /* NULL, or per key t of all runs: track[t] += its
                                        probability in units of 2^-32 (ei_attn_track) */
    /* a KIVI cache (ei_kivi_attn_group): runs [0, n_kivi_runs) are quantized key groups (k the group
     * block of the run's KV head, t0 its first token in it) with KIVI value rows
     * kivi_v_row_bytes apart; the runs after them f16 rows (the residual) */
    int kivi_bits_k, kivi_bits_v, kivi_group, n_kivi_runs;
    size_t kivi_v_row_bytes;
    int n_rot, rope_neox; /* how the query is rotated for a run with cs */
    int hadamard_k;       /* 0, or the block the keys are stored rotated by (hadamard): the
                           * query meets them rotated so, after any rotation by a run's cs */
} ei_attn_params;

typedef void (*ei_attn_fn)(const ei_attn_params *p, const float *q, float *out, double *scratch);
/* nq query heads of one KV head that see the same keys (a grouped-query group at one
 * position): query i at q + i * q_stride, its output at out + i * out_stride, each exactly as
 * attn computes it. scratch holds nq * 1.5 * n doubles (n keys in all). */
typedef void (*ei_attn_group_fn)(const ei_attn_params *p, int nq, const float *q, size_t q_stride, float *out,
                                 size_t out_stride, double *scratch);
/* a prompt's block of queries against each tile of the cache: nq <= EI_ATTN_BLOCK_QUERIES query
 * heads of one KV head (the group's heads of several consecutive tokens), query i at q[i]
 * seeing keys [first[i], end[i]) of the runs taken together (0 <= first < end <= their keys),
 * its output at out[i], each exactly as attn computes it over those keys. Each key row is read
 * (and converted) once for all the queries. room has space for p->n_runs runs (a query's
 * slice of them); scratch holds 1.5 * sum(end - first) doubles. */
#define EI_ATTN_BLOCK_QUERIES 8
typedef void (*ei_attn_block_fn)(const ei_attn_params *p, int nq, const float *const *q, const int32_t *first,
                                 const int32_t *end, float *const *out, ei_attn_run *room, double *scratch);
/* attn_block's scalar reference (ref/attn.c): attn over each query's keys */
void ei_ref_attn_block(const ei_attn_params *p, int nq, const float *const *q, const int32_t *first,
                       const int32_t *end, float *const *out, ei_attn_run *room, double *scratch);

struct ei_kernels {
    const char *name;
    ei_from_float_fn from_float[EI_TYPE_COUNT]; /* indexed by partner or cache type */
    ei_vec_dot_fn vec_dot[EI_TYPE_COUNT];       /* indexed by weight type */
    ei_gemm_fn gemm[EI_TYPE_COUNT];             /* indexed by weight type; NULL: loop vec_dot */
    ei_gemm_x16_fn gemm_x16[EI_TYPE_COUNT];     /* by weight type; NULL: rows used as stored */
    ei_gemm_x16_span_fn gemm_x16_span[EI_TYPE_COUNT]; /* NULL: gemm_x16 group by group */
    int x16_tile; /* the most activation rows gemm_x16 takes (<= EI_X16_TILE_MAX; 0: EI_TILE): the
                   * more, the more tokens share each unpacked weight block */
    ei_to_float_fn to_float[EI_TYPE_COUNT];     /* indexed by storage type */

    /* y[i] = x[i] * (1/sqrt(mean(x^2) + eps)) * w[i]  (w may be NULL) */
    void (*rms_norm)(int n, float *y, const float *x, const float *w, float eps);
    /* rotary embedding of one head in place; cs holds (cos, sin) pairs, n_rot/2 of them;
     * x0' = x0*c - x1*s, x1' = x0*s + x1*c in float, unfused */
    void (*rope)(int n_rot, float *x, const float *cs, int neox);
    /* y = gelu(g) * u with GGML's fp16 GELU table (gelu_tab has 65536 fp16 entries) */
    void (*geglu)(int n, float *y, const float *g, const float *u, const ei_f16 *gelu_tab);
    /* y = (float)(g / (1 + exp(-g))) * u, the fraction in double */
    void (*swiglu)(int n, float *y, const float *g, const float *u);
    /* y += x */
    void (*add)(int n, float *y, const float *x);
    /* y *= s */
    void (*scale)(int n, float *y, float s);
    /* x[0..n) rotated, each block of `block` values (a power of two, at least 64, dividing n)
     * on its own, by the orthonormal Walsh-Hadamard matrix (Sylvester order; its own inverse):
     * scaled by 1/sqrtf(block) first, then butterflies (u + v, u - v) at strides 1, 2, 4, ...
     * in float, the roundings GGML's fwht makes. A q8_0 / q4_0 cache stores its keys and
     * values so rotated (ei_hadamard_block), as llama.cpp does, which spreads a head's
     * outliers over its block */
    void (*hadamard)(float *x, int n, int block);
    ei_attn_fn attn;
    ei_attn_group_fn attn_group; /* NULL: attn per query */
    ei_attn_block_fn attn_block; /* NULL: attn_group per token (f16 caches without key shifts) */
    uint32_t attn_types;         /* bit t set: attn and attn_group read cache rows of type t */
    /* w[t] = ei_exp(scores[t] - max) for t < n, returning their sum: the softmax every attention
     * variant and KIVI's take, exactly as common/attn_softmax.h's ei_attn_softmax */
    double (*attn_softmax)(const float *scores, int n, double *w);
    /* acc[d] += p[t] * v[t][d] for t in [0, n) in order, d in [0, hv): rows of f32 (f32 = 1)
     * or fp16 values, row_bytes apart; the weights have at most float's bits, so each product
     * is exact in double and a fused add rounds as a separate one (KIVI's attention) */
    void (*attn_weighted_sum)(const double *p, const uint8_t *v, int f32, size_t row_bytes, int n, int hv,
                              double *acc);
    /* out[t] = sum over d in [0, hd) in order of qd[d] * k_t[d], t < m, for fp16 keys k_t at
     * k + t * row_bytes and a query of floats held as doubles: every product is exact in
     * double, so a fused add rounds as a separate one (KIVI's f16 residual, whose queries are
     * not rounded) */
    void (*attn_dots_f16)(const double *qd, const uint8_t *k, size_t row_bytes, int hd, int m, double *out);
    /* out[t] = vec_dot[k_type](hd, k_t, qq) bit for bit, t < m: the key rows k_t at k + t * row_bytes
     * of a q8_0 or q4_0 cache against one query quantized to their q8_0 partner (qq), several
     * keys at a time: a key row of a small head is a block or two, too short for vec_dot */
    void (*attn_dots_q)(int k_type, const uint8_t *qq, const uint8_t *k, size_t row_bytes, int hd, int m,
                        float *out);
    /* acc[d] += p[t] * v_t[d] for t in [0, n) in order, d in [0, hv): value rows of a q8_0 or q4_0
     * cache, row_bytes apart, each value as to_float decodes it (exact in float) and each
     * product exact in double; decoded in registers, never into a buffer */
    void (*attn_weighted_sum_q)(int v_type, const double *p, const uint8_t *v, size_t row_bytes, int n, int hv,
                                double *acc);

    /* KIVI cache quantization (formats and roundings: common/kivi.h): bits 2 or 4, group G
     * 32, 64 or 128; the caller checks the shapes (ei_kivi_k_block_bytes, ei_kivi_v_group) */
    /* block = the K group block of G f16 rows of hd values, row_bytes apart */
    void (*kivi_quantize_k)(int bits, int group, int hd, const ei_f16 *rows, size_t row_bytes, uint8_t *block);
    /* dots[i] = the raw dot of query q (hd floats) with token t0 + i of a K block, i < n
     * (0 <= t0, t0 + n <= G: a window may start inside a group) */
    void (*kivi_k_dots)(int bits, int group, int hd, const uint8_t *block, int t0, int n, const float *q,
                        float *dots);
    /* row = the V row of one token's hdv f16 values */
    void (*kivi_quantize_v)(int bits, int group, int hdv, const ei_f16 *x, uint8_t *row);
    /* out[j * hdv + i] = value i of V row j decoded, j < m (rows row_bytes apart) */
    void (*kivi_decode_v)(int bits, int group, int hdv, const uint8_t *rows, size_t row_bytes, int m, float *out);
};

/* whether the kernels' attention reads cache rows of a type */
static inline int ei_attn_reads(const ei_kernels *k, int type) {
    return type >= 0 && type < EI_TYPE_COUNT && type < 32 && (k->attn_types >> type & 1u);
}
#define EI_ATTN_F16_F32 ((1u << EI_TYPE_F16) | (1u << EI_TYPE_F32))
/* the block-quantized cache types: read through vec_dot (keys) and to_float (values) */
#define EI_ATTN_QUANT ((1u << EI_TYPE_Q8_0) | (1u << EI_TYPE_Q4_0))
#define EI_ATTN_ALL (EI_ATTN_F16_F32 | EI_ATTN_QUANT)

/* the partner (vec-dot activation) type of each weight type, as in GGML's CPU backend */
int ei_partner_type(int weight_type);
/* bytes of one row of n values of a type; 0 when the type is unknown or n does not fit */
size_t ei_row_size(int type, int64_t n);
int ei_block_size(int type);
/* EI_X16 rows of n values (row_stride bytes apart) rewritten into the interleaved layout of
 * their type (block_q4_0x16, ...: ei_blocks.h), ei_x16_size bytes; 0 when the type has none */
int ei_pack_x16(int type, const void *rows, size_t row_stride, int64_t n, void *out);
/* bytes of EI_X16 rows of n values in the interleaved layout of their type (0: none); some
 * layouts keep scales unpacked and take more than the rows as stored */
size_t ei_x16_size(int type, int64_t n);
/* row r of an interleaved group (ei_pack_x16's) back as stored, n values; 0 where the type
 * cannot (today the K-quants): a tied token embedding reads its rows from the output
 * matrix's copy this way, so the file's pages need not stay */
int ei_unpack_x16_row(int type, const void *packed, int r, int64_t n, void *row);
int ei_x16_unpacks(int type); /* whether ei_unpack_x16_row takes the type */
/* the scalar reference of gemm_x16 for a type's interleaved layout (ref/gemm.c), NULL where
 * it has none; not in any table (the tests check each variant's kernel against it) */
ei_gemm_x16_fn ei_ref_gemm_x16(int type);

void ei_kernels_init_ref(ei_kernels *k);
void ei_kernels_init_avx2(ei_kernels *k);
void ei_kernels_init_avx512(ei_kernels *k);
void ei_kernels_init_neon(ei_kernels *k);
void ei_kernels_init_neon_dotprod(ei_kernels *k);
void ei_kernels_init_neon_i8mm(ei_kernels *k);

/* fp16 <-> fp32, portable and exact (round to nearest even); the widening is inline: scalar
 * loops (KIVI's zero-point sums, the reference kernels) call it once per value */
static inline float ei_fp16_to_fp32(ei_f16 h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits = sign | ((exp + 112) << 23) | (man << 13);
    if (exp == 0x1f) bits = sign | 0x7f800000u | (man << 13); /* inf, nan */
    if (exp == 0) {
        if (man == 0) bits = sign;
        else { /* subnormal: value = man * 2^-24 */
            const float v = (float)man * 5.9604644775390625e-8f;
            return sign ? -v : v;
        }
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
ei_f16 ei_fp32_to_fp16(float f);
float ei_bf16_to_fp32(ei_bf16 h);
ei_bf16 ei_fp32_to_bf16(float f);

/* the block a cache of the given type rotates rows of head size hd by (the kernel table's
 * hadamard): 0 for none (a type that is not q8_0 / q4_0, or hd not a multiple of 64); keys
 * the largest power of two dividing hd, values 64 */
int ei_hadamard_block(int type, int hd, int is_key);

#endif
