/* KIVI cache quantization (Liu et al., 2024, arXiv 2402.02750): keys quantized per channel
 * over groups of G tokens, values per token over groups of channels, both asymmetrically
 * (a scale and a zero point, b = 2 or 4 bits per code). The formats and the roundings are
 * defined here once; ref/kivi.c loops over the scalar pieces below, and every instruction
 * set's kivi.c computes the same bits (edgeinfer/kivi.py is the numpy oracle).
 *
 * K group block: one KV head, G consecutive tokens (G = 32, 64 or 128), hd channels:
 *   f16 scale[hd], f16 zero[hd], then for each channel d in order the G codes of that
 *   channel packed LSB-first: token t's code sits at bits [t*b, t*b + b) of the channel's
 *   little-endian bit string (b = 4: byte j holds token 2j in its low nibble, 2j + 1 in its
 *   high one; b = 2: byte j holds tokens 4j..4j+3 from the low bits up). One channel's codes
 *   are contiguous across tokens, so that the dots run one vector lane per token.
 *   Bytes: 4 hd + hd G b / 8.
 * V row: one token, one KV head, hdv channels in groups of gv = min(G, hdv) channels (gv must
 *   divide hdv, and gv b must be a multiple of 8): per group f16 scale, f16 zero, then
 *   gv b / 8 bytes of codes LSB-first in channel order. Bytes: (hdv / gv)(4 + gv b / 8).
 * Bits per value: K b + 32 / G, V b + 32 / gv (4-bit keys with G = 32: 5 bits).
 *
 * Quantizing a set of f16 values (a key channel over its G tokens, or one value group):
 *   mn, mx = their minimum and maximum, NaN ignored, a zero extreme taken as +0 (so that the
 *   order in which a variant compares cannot change a bit); s = (mx - mn) / (2^b - 1) in
 *   float; stored scale fp16(s) (a NaN s, from equal infinities, stored as the quiet NaN
 *   0x7e00), stored zero fp16(mn); s', z' = those two as floats. code = clamp(rint((x - z') /
 *   s'), 0, 2^b - 1), ties to even, a NaN x giving 0; every code is 0 unless s' is finite and
 *   positive (all values equal, a range below fp16's smallest step, an infinity or no value).
 * Decoding: x' = s' * code + z' (a float product, then a float sum; never fused).
 * K dots, one f32 query q against a group: u[d] = q[d] * s'[d]; zsum = sum over d in order
 *   of (double)q[d] * z'[d], rounded once to float; acc[t] = 0, then for d in order
 *   acc[t] = acc[t] + u[d] * code[d][t]; dot[t] = acc[t] + zsum. Vector variants run one lane
 *   per token, which keeps this order. */
#ifndef EI_KIVI_H
#define EI_KIVI_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ei_kernels.h"

#define EI_KIVI_MAX_GROUP 128
#define EI_KIVI_NAN_SCALE 0x7e00 /* the stored scale of a NaN range */

static inline int ei_kivi_bits_ok(int bits) { return bits == 2 || bits == 4; }
static inline int ei_kivi_group_ok(int group) { return group == 32 || group == 64 || group == 128; }

/* bytes of one channel's codes in a K block */
static inline size_t ei_kivi_k_channel_bytes(int bits, int group) { return (size_t)group * bits / 8; }

/* bytes of a K group block; 0 for a shape the format has not */
static inline size_t ei_kivi_k_block_bytes(int bits, int group, int hd) {
    if (!ei_kivi_bits_ok(bits) || !ei_kivi_group_ok(group) || hd <= 0 || hd > EI_MAX_HEAD_DIM) return 0;
    return (size_t)hd * (4 + ei_kivi_k_channel_bytes(bits, group));
}

/* the channels of one V group, gv = min(G, hdv); 0 when hdv does not split into such groups
 * of whole bytes */
static inline int ei_kivi_v_group(int bits, int group, int hdv) {
    if (!ei_kivi_bits_ok(bits) || !ei_kivi_group_ok(group) || hdv <= 0 || hdv > EI_MAX_HEAD_DIM) return 0;
    const int gv = group < hdv ? group : hdv;
    return hdv % gv == 0 && gv * bits % 8 == 0 ? gv : 0;
}

/* bytes of one V group (scale, zero, codes) and of a V row; 0 for a shape the format has not */
static inline size_t ei_kivi_v_group_bytes(int bits, int gv) { return 4 + (size_t)gv * bits / 8; }
static inline size_t ei_kivi_v_row_bytes(int bits, int group, int hdv) {
    const int gv = ei_kivi_v_group(bits, group, hdv);
    return gv ? (size_t)(hdv / gv) * ei_kivi_v_group_bytes(bits, gv) : 0;
}

/* fp16 fields at any alignment (V groups of odd byte counts leave them unaligned) */
static inline float ei_kivi_f16_at(const uint8_t *p) {
    ei_f16 h;
    memcpy(&h, p, 2);
    return ei_fp16_to_fp32(h);
}
static inline void ei_kivi_put_f16(uint8_t *p, ei_f16 h) { memcpy(p, &h, 2); }

/* the running minimum and maximum: a NaN x leaves them as they are. The vector forms
 * (min_ps(x, mn), max_ps(x, mx)) choose exactly the same way. */
static inline float ei_kivi_lo(float mn, float x) { return x < mn ? x : mn; }
static inline float ei_kivi_hi(float mx, float x) { return x > mx ? x : mx; }

/* the stored scale and zero of values with extremes mn, mx (from ei_kivi_lo / ei_kivi_hi
 * folded from +inf and -inf) */
static inline void ei_kivi_params(float mn, float mx, int bits, ei_f16 *scale, ei_f16 *zero) {
    mn = mn + 0.0f; /* -0 becomes +0; every other value is kept */
    mx = mx + 0.0f;
    const float s = (mx - mn) / (float)((1 << bits) - 1);
    *scale = s != s ? (ei_f16)EI_KIVI_NAN_SCALE : ei_fp32_to_fp16(s);
    *zero = ei_fp32_to_fp16(mn);
}

/* whether a group's codes carry information: s' finite and positive */
static inline int ei_kivi_usable(float s) { return s > 0.0f && s < INFINITY; }

/* the code of x (as a float: x converted from f16) under a usable scale s and zero z */
static inline unsigned ei_kivi_code(float x, float z, float s, int bits) {
    const float qmax = (float)((1 << bits) - 1);
    const float r = rintf((x - z) / s);
    return r > 0.0f ? (unsigned)(r < qmax ? r : qmax) : 0u; /* NaN: 0 */
}

/* code i of a bit string packed LSB-first */
static inline unsigned ei_kivi_code_at(const uint8_t *codes, int i, int bits) {
    const int bit = i * bits;
    return (unsigned)(codes[bit >> 3] >> (bit & 7)) & ((1u << bits) - 1u);
}

/* ---- the scalar pieces every variant is made of (and the tails of the vector ones) ------ */

/* channel d of a K block from G f16 rows row_bytes apart (the block's codes start zeroed) */
static inline void ei_kivi_quantize_k_channel(int bits, int group, int hd, const ei_f16 *rows, size_t row_bytes,
                                              int d, uint8_t *block) {
    const uint8_t *base = (const uint8_t *)rows + 2 * (size_t)d;
    float mn = INFINITY, mx = -INFINITY;
    for (int t = 0; t < group; t++) {
        const float x = ei_kivi_f16_at(base + (size_t)t * row_bytes);
        mn = ei_kivi_lo(mn, x);
        mx = ei_kivi_hi(mx, x);
    }
    ei_f16 sh, zh;
    ei_kivi_params(mn, mx, bits, &sh, &zh);
    ei_kivi_put_f16(block + 2 * (size_t)d, sh);
    ei_kivi_put_f16(block + 2 * ((size_t)hd + d), zh);
    const float s = ei_fp16_to_fp32(sh), z = ei_fp16_to_fp32(zh);
    uint8_t *codes = block + 4 * (size_t)hd + (size_t)d * ei_kivi_k_channel_bytes(bits, group);
    memset(codes, 0, ei_kivi_k_channel_bytes(bits, group));
    if (!ei_kivi_usable(s)) return;
    for (int t = 0; t < group; t++) {
        const unsigned c = ei_kivi_code(ei_kivi_f16_at(base + (size_t)t * row_bytes), z, s, bits);
        codes[t * bits >> 3] |= (uint8_t)(c << (t * bits & 7));
    }
}

/* u[d] = q[d] * s'[d] for d in [d0, hd), and zsum = sum_d (double)q[d] * z'[d] in order */
static inline void ei_kivi_k_query_tail(int hd, const uint8_t *block, const float *q, int d0, float *u) {
    for (int d = d0; d < hd; d++) u[d] = q[d] * ei_kivi_f16_at(block + 2 * (size_t)d);
}
static inline float ei_kivi_k_zsum(int hd, const uint8_t *block, const float *q) {
    double zsum = 0.0;
    for (int d = 0; d < hd; d++) zsum += (double)q[d] * ei_kivi_f16_at(block + 2 * ((size_t)hd + d));
    return (float)zsum;
}

/* the dot of token t of a K block, from u and zsum */
static inline float ei_kivi_k_dot_token(int bits, int group, int hd, const uint8_t *block, const float *u,
                                        float zsum, int t) {
    const uint8_t *codes = block + 4 * (size_t)hd;
    const size_t cb = ei_kivi_k_channel_bytes(bits, group);
    float acc = 0.0f;
    for (int d = 0; d < hd; d++) acc = acc + u[d] * (float)ei_kivi_code_at(codes + (size_t)d * cb, t, bits);
    return acc + zsum;
}

/* one V group of gv f16 values x into grp (scale, zero, codes) */
static inline void ei_kivi_quantize_v_group(int bits, int gv, const ei_f16 *x, uint8_t *grp) {
    float mn = INFINITY, mx = -INFINITY;
    for (int i = 0; i < gv; i++) {
        const float v = ei_fp16_to_fp32(x[i]);
        mn = ei_kivi_lo(mn, v);
        mx = ei_kivi_hi(mx, v);
    }
    ei_f16 sh, zh;
    ei_kivi_params(mn, mx, bits, &sh, &zh);
    ei_kivi_put_f16(grp, sh);
    ei_kivi_put_f16(grp + 2, zh);
    const float s = ei_fp16_to_fp32(sh), z = ei_fp16_to_fp32(zh);
    uint8_t *codes = grp + 4;
    memset(codes, 0, (size_t)gv * bits / 8);
    if (!ei_kivi_usable(s)) return;
    for (int i = 0; i < gv; i++)
        codes[i * bits >> 3] |= (uint8_t)(ei_kivi_code(ei_fp16_to_fp32(x[i]), z, s, bits) << (i * bits & 7));
}

/* channels [i0, gv) of one V group decoded: out[i] = s' * code + z' */
static inline void ei_kivi_decode_v_tail(int bits, int gv, const uint8_t *grp, int i0, float *out) {
    const float s = ei_kivi_f16_at(grp), z = ei_kivi_f16_at(grp + 2);
    for (int i = i0; i < gv; i++) out[i] = s * (float)ei_kivi_code_at(grp + 4, i, bits) + z;
}

/* one V group decoded whole (the reference's group decoder) */
static inline void ei_kivi_decode_v_group(int bits, int gv, const uint8_t *grp, float *out) {
    ei_kivi_decode_v_tail(bits, gv, grp, 0, out);
}

/* the row drivers every variant shares: each V group through the variant's own group kernel
 * (`vec`, for groups a multiple of `lanes` values; the reference's otherwise) */
typedef void (*ei_kivi_quantize_group_fn)(int bits, int gv, const ei_f16 *x, uint8_t *grp);
typedef void (*ei_kivi_decode_group_fn)(int bits, int gv, const uint8_t *grp, float *out);

static inline void ei_kivi_quantize_v_row(int bits, int group, int hdv, const ei_f16 *x, uint8_t *row, int lanes,
                                          ei_kivi_quantize_group_fn vec) {
    const int gv = ei_kivi_v_group(bits, group, hdv);
    const size_t gb = ei_kivi_v_group_bytes(bits, gv);
    const ei_kivi_quantize_group_fn fn = gv % lanes == 0 ? vec : ei_kivi_quantize_v_group;
    for (int g = 0; g < hdv / gv; g++) fn(bits, gv, x + (size_t)g * gv, row + g * gb);
}

/* m V rows (row_bytes apart) decoded to floats, hdv apart */
static inline void ei_kivi_decode_v_rows(int bits, int group, int hdv, const uint8_t *rows, size_t row_bytes, int m,
                                         float *out, ei_kivi_decode_group_fn fn) {
    const int gv = ei_kivi_v_group(bits, group, hdv);
    const size_t gb = ei_kivi_v_group_bytes(bits, gv);
    for (int j = 0; j < m; j++)
        for (int g = 0; g < hdv / gv; g++)
            fn(bits, gv, rows + (size_t)j * row_bytes + g * gb, out + (size_t)j * hdv + (size_t)g * gv);
}

/* nq query heads sharing one KV head (q + j qs, out + j os) against a KIVI cache, each value
 * row decoded once for all of them (common/kivi_attn.c states the rounding); scratch holds
 * 2 n doubles per head */
void ei_kivi_attn_group(const ei_attn_params *p, int nq, const float *q, size_t qs, float *out, size_t os,
                        double *scratch);

#endif
