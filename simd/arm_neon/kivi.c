/* NEON KIVI cache kernels, bit for bit the reference's (common/kivi.h states the roundings).
 *
 * As the x86 variants, with 4 lanes: key dots one lane per token, each adding u[d] * code in
 * the reference's order of d (vmulq then vaddq, never fused); the key quantizer one lane per
 * channel over the G rows in order; a value group's extremes are order-free. The running
 * extremes and the clamp choose by compare and select, exactly as the reference's
 * conditionals do (NaN compares false). Codes leave their words by variable shifts. */
#include "../common/kivi.h"
#include "simd.h"

EI_INLINE uint32_t load_u32(const uint8_t *p) { uint32_t w; memcpy(&w, p, 4); return w; }
EI_INLINE uint32_t load_u16(const uint8_t *p) { uint16_t w; memcpy(&w, p, 2); return w; }

/* lane i: minus the bit where code i of 4 starts (a negative vshlq count shifts right) */
EI_INLINE int32x4_t rshifts4(int base, int bits) {
    const int32_t s[4] = {-base, -(base + bits), -(base + 2 * bits), -(base + 3 * bits)};
    return vld1q_s32(s);
}

/* the 4 codes of w at the bits -shifts[i], as floats */
EI_INLINE float32x4_t codes4(uint32_t w, int32x4_t shifts, int bits) {
    const uint32x4_t mask = vdupq_n_u32((1u << bits) - 1u);
    return vcvtq_f32_u32(vandq_u32(vshlq_u32(vdupq_n_u32(w), shifts), mask));
}

/* 4 fp16 values at p (any alignment) as floats */
EI_INLINE float32x4_t f16x4(const uint8_t *p) {
    uint64_t h;
    memcpy(&h, p, 8);
    return vcvt_f32_f16(vreinterpret_f16_u64(vcreate_u64(h)));
}

EI_INLINE uint32x4_t usable_lanes(float32x4_t s) {
    return vandq_u32(vcgtq_f32(s, vdupq_n_f32(0.0f)), vcltq_f32(s, vdupq_n_f32(INFINITY)));
}

/* the reference's clamp(rint((x - z) / s), 0, qmax): r > 0 ? (r < qmax ? r : qmax) : 0, so
 * NaN gives 0; 0 outside the usable lanes */
EI_INLINE uint32x4_t codes_of(float32x4_t x, float32x4_t z, float32x4_t s, uint32x4_t usable, int bits) {
    const float32x4_t zero = vdupq_n_f32(0.0f), qmax = vdupq_n_f32((float)((1 << bits) - 1));
    const float32x4_t r = vrndnq_f32(vdivq_f32(vsubq_f32(x, z), s));
    const float32x4_t pos = vbslq_f32(vcgtq_f32(r, zero), r, zero);
    const float32x4_t c = vbslq_f32(vcltq_f32(pos, qmax), pos, qmax);
    return vandq_u32(vcvtq_u32_f32(c), usable); /* c is whole: exact */
}

/* ---- keys -------------------------------------------------------------------------------- */

/* channels d0..d0+3 of a K block, one lane each */
static void quantize_k_tile(int bits, int group, int hd, const ei_f16 *rows, size_t row_bytes, int d0,
                            uint8_t *block) {
    const uint8_t *base = (const uint8_t *)rows + 2 * (size_t)d0;
    float32x4_t mn = vdupq_n_f32(INFINITY), mx = vdupq_n_f32(-INFINITY);
    for (int t = 0; t < group; t++) {
        const float32x4_t x = f16x4(base + (size_t)t * row_bytes);
        mn = vbslq_f32(vcltq_f32(x, mn), x, mn);
        mx = vbslq_f32(vcgtq_f32(x, mx), x, mx);
    }
    float lo[4], hi[4];
    vst1q_f32(lo, mn);
    vst1q_f32(hi, mx);
    for (int i = 0; i < 4; i++) {
        ei_f16 sh, zh;
        ei_kivi_params(lo[i], hi[i], bits, &sh, &zh);
        ei_kivi_put_f16(block + 2 * (size_t)(d0 + i), sh);
        ei_kivi_put_f16(block + 2 * ((size_t)hd + d0 + i), zh);
    }
    const float32x4_t s = f16x4(block + 2 * (size_t)d0), z = f16x4(block + 2 * ((size_t)hd + d0));
    const uint32x4_t usable = usable_lanes(s);
    const size_t cb = ei_kivi_k_channel_bytes(bits, group);
    uint8_t *codes = block + 4 * (size_t)hd + (size_t)d0 * cb;
    uint32x4_t word = vdupq_n_u32(0); /* lane i: the next 32 bits of channel d0 + i */
    for (int t = 0; t < group; t++) {
        const uint32x4_t c = codes_of(f16x4(base + (size_t)t * row_bytes), z, s, usable, bits);
        word = vorrq_u32(word, vshlq_u32(c, vdupq_n_s32(t * bits % 32)));
        if ((t + 1) * bits % 32 == 0) {
            uint32_t w[4];
            vst1q_u32(w, word);
            for (int i = 0; i < 4; i++) memcpy(codes + (size_t)i * cb + (size_t)(t * bits / 32) * 4, &w[i], 4);
            word = vdupq_n_u32(0);
        }
    }
}

static void neon_kivi_quantize_k(int bits, int group, int hd, const ei_f16 *rows, size_t row_bytes,
                                 uint8_t *block) {
    int d = 0;
    for (; d + 4 <= hd; d += 4) quantize_k_tile(bits, group, hd, rows, row_bytes, d, block);
    for (; d < hd; d++) ei_kivi_quantize_k_channel(bits, group, hd, rows, row_bytes, d, block);
}

/* out[i] = the dot of token tok + i, i < 4 nv (tok a multiple of 32): lane i of vector v is
 * token tok + 4 v + i, whose code starts at bit 4 v bits of the run's codes */
EI_INLINE void k_dots_run(int bits, int nv, int group, int hd, const uint8_t *block, const float *u, float zsum,
                          int tok, float *out) {
    const size_t cb = ei_kivi_k_channel_bytes(bits, group);
    const uint8_t *codes = block + 4 * (size_t)hd + (size_t)tok * bits / 8;
    const int32x4_t sh[4] = {rshifts4(0, bits), rshifts4(8, bits), rshifts4(16, bits), rshifts4(24, bits)};
    float32x4_t acc[16];
    EI_UNROLL
    for (int v = 0; v < nv; v++) acc[v] = vdupq_n_f32(0.0f);
    for (int d = 0; d < hd; d++, codes += cb) {
        const float32x4_t ud = vdupq_n_f32(u[d]);
        EI_UNROLL
        for (int v = 0; v < nv; v++) {
            const int bit = 4 * v * bits;
            const float32x4_t c = codes4(load_u32(codes + bit / 32 * 4), sh[bit % 32 / 8], bits);
            acc[v] = vaddq_f32(acc[v], vmulq_f32(ud, c));
        }
    }
    const float32x4_t z = vdupq_n_f32(zsum);
    EI_UNROLL
    for (int v = 0; v < nv; v++) vst1q_f32(out + 4 * v, vaddq_f32(acc[v], z));
}

/* 32 or 64 tokens from tok, with the bits and the vector count constant */
static void k_dots_chunk(int bits, int wide, int group, int hd, const uint8_t *block, const float *u, float zsum,
                         int tok, float *out) {
    if (bits == 4) {
        if (wide) k_dots_run(4, 16, group, hd, block, u, zsum, tok, out);
        else k_dots_run(4, 8, group, hd, block, u, zsum, tok, out);
    } else {
        if (wide) k_dots_run(2, 16, group, hd, block, u, zsum, tok, out);
        else k_dots_run(2, 8, group, hd, block, u, zsum, tok, out);
    }
}

static void neon_kivi_k_dots(int bits, int group, int hd, const uint8_t *block, int t0, int n, const float *q,
                             float *dots) {
    float u[EI_MAX_HEAD_DIM];     /* (hd) q[d] * s'[d] */
    float all[EI_KIVI_MAX_GROUP]; /* (G) the dots of the chunks the slice touches */
    int d = 0;
    for (; d + 4 <= hd; d += 4) vst1q_f32(u + d, vmulq_f32(vld1q_f32(q + d), f16x4(block + 2 * (size_t)d)));
    ei_kivi_k_query_tail(hd, block, q, d, u);
    const float zsum = ei_kivi_k_zsum(hd, block, q);
    for (int tok = t0 / 32 * 32; tok < t0 + n;) {
        const int wide = tok + 64 <= group && tok + 32 < t0 + n;
        k_dots_chunk(bits, wide, group, hd, block, u, zsum, tok, all + tok);
        tok += wide ? 64 : 32;
    }
    if (n > 0) memcpy(dots, all + t0, sizeof(float) * (size_t)n);
}

/* ---- values ------------------------------------------------------------------------------ */

/* one V group of gv values, gv a multiple of 4 */
static void quantize_v_group(int bits, int gv, const ei_f16 *x, uint8_t *grp) {
    const uint8_t *xb = (const uint8_t *)x;
    float32x4_t mn = vdupq_n_f32(INFINITY), mx = vdupq_n_f32(-INFINITY);
    for (int i = 0; i < gv; i += 4) {
        const float32x4_t v = f16x4(xb + 2 * (size_t)i);
        mn = vbslq_f32(vcltq_f32(v, mn), v, mn);
        mx = vbslq_f32(vcgtq_f32(v, mx), v, mx);
    }
    float lo[4], hi[4], l = INFINITY, h = -INFINITY;
    vst1q_f32(lo, mn);
    vst1q_f32(hi, mx);
    for (int i = 0; i < 4; i++) { l = ei_kivi_lo(l, lo[i]); h = ei_kivi_hi(h, hi[i]); }
    ei_f16 sh, zh;
    ei_kivi_params(l, h, bits, &sh, &zh);
    ei_kivi_put_f16(grp, sh);
    ei_kivi_put_f16(grp + 2, zh);
    const float32x4_t s = vdupq_n_f32(ei_fp16_to_fp32(sh)), z = vdupq_n_f32(ei_fp16_to_fp32(zh));
    const uint32x4_t usable = usable_lanes(s);
    const int32_t left[4] = {0, bits, 2 * bits, 3 * bits};
    const int32x4_t shifts = vld1q_s32(left);
    for (int i = 0; i < gv; i += 4) {
        const uint32x4_t c = codes_of(f16x4(xb + 2 * (size_t)i), z, s, usable, bits);
        const uint32_t w = vaddvq_u32(vshlq_u32(c, shifts)); /* disjoint bits: the sum is the OR */
        memcpy(grp + 4 + (size_t)i * bits / 8, &w, (size_t)bits / 2); /* 4 codes: bits / 2 bytes */
    }
}

static void neon_kivi_quantize_v(int bits, int group, int hdv, const ei_f16 *x, uint8_t *row) {
    ei_kivi_quantize_v_row(bits, group, hdv, x, row, 4, quantize_v_group);
}

static void decode_v_group(int bits, int gv, const uint8_t *grp, float *out) {
    const float32x4_t s = vdupq_n_f32(ei_kivi_f16_at(grp)), z = vdupq_n_f32(ei_kivi_f16_at(grp + 2));
    const int32x4_t shifts = rshifts4(0, bits);
    int i = 0;
    for (; i + 4 <= gv; i += 4) {
        const uint8_t *c = grp + 4 + (size_t)i * bits / 8;
        const float32x4_t code = codes4(bits == 4 ? load_u16(c) : c[0], shifts, bits);
        vst1q_f32(out + i, vaddq_f32(vmulq_f32(s, code), z));
    }
    ei_kivi_decode_v_tail(bits, gv, grp, i, out);
}

static void neon_kivi_decode_v(int bits, int group, int hdv, const uint8_t *rows, size_t row_bytes,
                            int m, float *out) {
    ei_kivi_decode_v_rows(bits, group, hdv, rows, row_bytes, m, out, decode_v_group);
}

void EI_NEON_FN(ei_neon_kivi)(ei_kernels *k) {
    k->kivi_quantize_k = neon_kivi_quantize_k;
    k->kivi_k_dots = neon_kivi_k_dots;
    k->kivi_quantize_v = neon_kivi_quantize_v;
    k->kivi_decode_v = neon_kivi_decode_v;
}
