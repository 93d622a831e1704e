/* NEON dot products of the K-quant types (Q2_K .. Q6_K) with q8_K activations: single dots
 * and tiles of up to 4 weight rows x 4 activations.
 *
 * Per 256-value block: the exact integers isum = sum_j sc_j * dot_j and, for the types with
 * minimums, imin = sum_j mn_j * bsum_j; then, in double as the reference writes it,
 * (y.d * d) * isum - (y.d * dmin) * imin. Each output adds its block terms in block order. */
#include <stddef.h>

#include "neon.h"

/* group g (0..7) of a block as 32 int8 values: v[0] = values 32g..32g+15, v[1] the next 16 */
typedef void (*kunpack_fn)(const uint8_t *block, int g, int8x16_t v[2]);
/* the block's integer scales and minimums per sub-block (16 of 16 values, or 8 of 32) */
typedef void (*kscales_fn)(const uint8_t *block, int8_t sc[16], int8_t mn[16]);

/* v << left (a negative count shifts right): the shifts depend on g, which need not be constant */
static inline uint8x16_t shl(uint8x16_t v, int left) { return vshlq_u8(v, vdupq_n_s8((int8_t)left)); }

static inline void unpack_q2_K(const uint8_t *b, int g, int8x16_t v[2]) {
    const uint8_t *qs = b + offsetof(block_q2_K, qs) + 32 * (g >> 2);
    EI_UNROLL for (int h = 0; h < 2; h++) v[h] = vreinterpretq_s8_u8(vandq_u8(shl(vld1q_u8(qs + 16 * h), -2 * (g & 3)), vdupq_n_u8(3)));
}

static inline void unpack_q3_K(const uint8_t *b, int g, int8x16_t v[2]) {
    const uint8_t *qs = b + offsetof(block_q3_K, qs) + 32 * (g >> 2), *hm = b + offsetof(block_q3_K, hmask);
    const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << g));
    EI_UNROLL for (int h = 0; h < 2; h++) {
        const uint8x16_t low = vandq_u8(shl(vld1q_u8(qs + 16 * h), -2 * (g & 3)), vdupq_n_u8(3));
        const uint8x16_t four = vbicq_u8(vdupq_n_u8(4), vtstq_u8(vld1q_u8(hm + 16 * h), bit)); /* 4 where the bit is clear */
        v[h] = vreinterpretq_s8_u8(vsubq_u8(low, four));
    }
}

static inline void unpack_q4_K(const uint8_t *b, int g, int8x16_t v[2]) {
    const uint8_t *qs = b + offsetof(block_q4_K, qs) + 32 * (g >> 1);
    EI_UNROLL for (int h = 0; h < 2; h++) v[h] = vreinterpretq_s8_u8(vandq_u8(shl(vld1q_u8(qs + 16 * h), -4 * (g & 1)), vdupq_n_u8(0x0f)));
}

static inline void unpack_q5_K(const uint8_t *b, int g, int8x16_t v[2]) {
    const uint8_t *qs = b + offsetof(block_q5_K, qs) + 32 * (g >> 1), *qh = b + offsetof(block_q5_K, qh);
    EI_UNROLL for (int h = 0; h < 2; h++) {
        const uint8x16_t low = vandq_u8(shl(vld1q_u8(qs + 16 * h), -4 * (g & 1)), vdupq_n_u8(0x0f));
        const uint8x16_t high = vandq_u8(shl(vld1q_u8(qh + 16 * h), 4 - g), vdupq_n_u8(0x10)); /* bit g */
        v[h] = vreinterpretq_s8_u8(vorrq_u8(low, high));
    }
}

static inline void unpack_q6_K(const uint8_t *b, int g, int8x16_t v[2]) {
    const int half = g >> 2, s = g & 3;
    const uint8_t *ql = b + offsetof(block_q6_K, ql) + 64 * half + 32 * (s & 1), *qh = b + offsetof(block_q6_K, qh) + 32 * half;
    EI_UNROLL for (int h = 0; h < 2; h++) {
        const uint8x16_t low = vandq_u8(shl(vld1q_u8(ql + 16 * h), -4 * (s >> 1)), vdupq_n_u8(0x0f));
        const uint8x16_t high = vandq_u8(shl(vld1q_u8(qh + 16 * h), 4 - 2 * s), vdupq_n_u8(0x30)); /* bits 2s, 2s+1 */
        v[h] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low, high)), vdupq_n_s8(32));
    }
}

static inline void scales_q2_K(const uint8_t *b, int8_t sc[16], int8_t mn[16]) {
    const uint8x16_t s = vld1q_u8(b + offsetof(block_q2_K, scales));
    vst1q_s8(sc, vreinterpretq_s8_u8(vandq_u8(s, vdupq_n_u8(0x0f))));
    vst1q_s8(mn, vreinterpretq_s8_u8(vshrq_n_u8(s, 4)));
}

/* 16 scales of 6 bits: low nibbles in bytes 0..7 (two per byte), high pairs in bytes 8..11 */
static inline void scales_q3_K(const uint8_t *b, int8_t sc[16], int8_t mn[16]) {
    uint32_t a[3];
    memcpy(a, b + offsetof(block_q3_K, scales), 12);
    const uint32_t nib = 0x0f0f0f0f, two = 0x03030303;
    const uint32_t w[4] = {(a[0] & nib) | ((a[2] & two) << 4), (a[1] & nib) | (((a[2] >> 2) & two) << 4),
                           ((a[0] >> 4) & nib) | (((a[2] >> 4) & two) << 4), ((a[1] >> 4) & nib) | (((a[2] >> 6) & two) << 4)};
    vst1q_s8(sc, vsubq_s8(vreinterpretq_s8_u32(vld1q_u32(w)), vdupq_n_s8(32)));
    (void)mn;
}

/* 8 x (6-bit scale, 6-bit minimum) in 12 bytes */
static inline void scales_k4(const uint8_t *s, int8_t sc[16], int8_t mn[16]) {
    uint32_t a[3];
    memcpy(a, s, 12);
    const uint32_t six = 0x3f3f3f3f, nib = 0x0f0f0f0f, two = 0x03030303;
    const uint32_t w[4] = {a[0] & six, (a[2] & nib) | (((a[0] >> 6) & two) << 4),
                           a[1] & six, ((a[2] >> 4) & nib) | (((a[1] >> 6) & two) << 4)};
    memcpy(sc, w, 8);
    memcpy(mn, w + 2, 8);
    memset(sc + 8, 0, 8); /* eight sub-blocks: the rest stays defined for whole-vector loads */
    memset(mn + 8, 0, 8);
}

static inline void scales_q4_K(const uint8_t *b, int8_t sc[16], int8_t mn[16]) { scales_k4(b + offsetof(block_q4_K, scales), sc, mn); }
static inline void scales_q5_K(const uint8_t *b, int8_t sc[16], int8_t mn[16]) { scales_k4(b + offsetof(block_q5_K, scales), sc, mn); }

static inline void scales_q6_K(const uint8_t *b, int8_t sc[16], int8_t mn[16]) {
    memcpy(sc, b + offsetof(block_q6_K, scales), 16);
    (void)mn;
}

/* lanes summing to imin = sum_j mn_j * bsum_j (bsum_j over the sub-block's 16 or 32 values) */
EI_INLINE int32x4_t min_dot(const int8_t *mn, const int16_t *bsums, int sub) {
    const int16x8_t b0 = vld1q_s16(bsums), b1 = vld1q_s16(bsums + 8);
    if (sub == 32) {
        const int16x8_t bs = vpaddq_s16(b0, b1), m = vmovl_s8(vld1_s8(mn));
        return vmlal_high_s16(vmull_s16(vget_low_s16(m), vget_low_s16(bs)), m, bs);
    }
    const int8x16_t m8 = vld1q_s8(mn);
    const int16x8_t m0 = vmovl_s8(vget_low_s8(m8)), m1 = vmovl_high_s8(m8);
    int32x4_t p = vmull_s16(vget_low_s16(m0), vget_low_s16(b0));
    p = vmlal_high_s16(p, m0, b0);
    p = vmlal_s16(p, vget_low_s16(m1), vget_low_s16(b1));
    return vmlal_high_s16(p, m1, b1);
}

/* one weight type as the generic kernels see it */
typedef struct {
    size_t bytes;
    int d_off, dmin_off; /* dmin_off < 0: no minimums */
    int sub;             /* values per scale: 16 or 32 */
} ktype;

EI_INLINE void kq_dot(int n, float *s, const uint8_t *x, const block_q8_K *y, ktype t, kunpack_fn unpack,
                      kscales_fn scales) {
    double sum = 0.0;
    for (int i = 0; i < n / QK_K; i++) {
        const uint8_t *b = x + (size_t)i * t.bytes;
        int8_t sc[16], mn[16];
        scales(b, sc, mn);
        int32x4_t acc = vdupq_n_s32(0);
        const int32x4_t z = vdupq_n_s32(0);
        EI_UNROLL for (int g = 0; g < 8; g++) {
            int8x16_t w[2];
            unpack(b, g, w);
            const int8x16_t y0 = vld1q_s8(y[i].qs + 32 * g), y1 = vld1q_s8(y[i].qs + 32 * g + 16);
            if (t.sub == 32) {
                acc = vmlaq_n_s32(acc, dot32s(z, w[0], w[1], y0, y1), sc[g]);
            } else {
                acc = vmlaq_n_s32(acc, dot16(z, w[0], y0), sc[2 * g]);
                acc = vmlaq_n_s32(acc, dot16(z, w[1], y1), sc[2 * g + 1]);
            }
        }
        const double yd = y[i].d, a = yd * h2f_at(b + t.d_off) * (double)vaddvq_s32(acc);
        if (t.dmin_off < 0) sum += a;
        else sum += a - yd * h2f_at(b + t.dmin_off) * (double)vaddvq_s32(min_dot(mn, y[i].bsums, t.sub));
    }
    *s = (float)sum;
}

/* scv[j] = scale j of the four rows, as int32 lanes (count: 8 or 16 scales) */
EI_INLINE void transpose_scales(int8_t sc[4][16], int32x4_t scv[16], int count) {
    const int8x16_t r0 = vld1q_s8(sc[0]), r1 = vld1q_s8(sc[1]), r2 = vld1q_s8(sc[2]), r3 = vld1q_s8(sc[3]);
    const int16x8_t ab_lo = vreinterpretq_s16_s8(vzip1q_s8(r0, r1)), ab_hi = vreinterpretq_s16_s8(vzip2q_s8(r0, r1));
    const int16x8_t cd_lo = vreinterpretq_s16_s8(vzip1q_s8(r2, r3)), cd_hi = vreinterpretq_s16_s8(vzip2q_s8(r2, r3));
    const int16x8_t q[4] = {vzip1q_s16(ab_lo, cd_lo), vzip2q_s16(ab_lo, cd_lo), vzip1q_s16(ab_hi, cd_hi),
                            vzip2q_s16(ab_hi, cd_hi)}; /* scales 4i..4i+3, four rows each */
    EI_UNROLL for (int i = 0; i < count / 4; i++) {
        const int8x16_t v = vreinterpretq_s8_s16(q[i]);
        const int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_high_s8(v);
        scv[4 * i] = vmovl_s16(vget_low_s16(lo));
        scv[4 * i + 1] = vmovl_high_s16(lo);
        scv[4 * i + 2] = vmovl_s16(vget_low_s16(hi));
        scv[4 * i + 3] = vmovl_high_s16(hi);
    }
}

/* the scales and minimums of block i of the four rows */
EI_INLINE void tile_scales(const uint8_t *xr[4], size_t xo, ktype t, kscales_fn scales, int32x4_t scv[16],
                           int8_t mn[4][16]) {
    int8_t sc[4][16];
    EI_UNROLL for (int r = 0; r < 4; r++) scales(xr[r] + xo, sc[r], mn[r]);
    transpose_scales(sc, scv, t.sub == 32 ? 8 : 16);
}

/* isum[c] += group g of block i: the four rows (lanes) against activation c (NC of them) */
EI_INLINE void kq_rows_group(int32x4_t isum[4], int NC, const uint8_t *xr[4], size_t xo, const block_q8_K *yc[4],
                             int i, int g, ktype t, kunpack_fn unpack, const int32x4_t scv[16]) {
    const int32x4_t z = vdupq_n_s32(0);
    int8x16_t w[4][2];
    EI_UNROLL for (int r = 0; r < 4; r++) unpack(xr[r] + xo, g, w[r]);
    EI_UNROLL for (int c = 0; c < NC; c++) {
        const int8x16_t y0 = vld1q_s8(yc[c][i].qs + 32 * g), y1 = vld1q_s8(yc[c][i].qs + 32 * g + 16);
        int32x4_t p[4], q[4];
        if (t.sub == 32) {
            EI_UNROLL for (int r = 0; r < 4; r++) p[r] = dot32s(z, w[r][0], w[r][1], y0, y1);
            isum[c] = vmlaq_s32(isum[c], hsum4(p[0], p[1], p[2], p[3]), scv[g]);
        } else {
            EI_UNROLL for (int r = 0; r < 4; r++) p[r] = dot16(z, w[r][0], y0), q[r] = dot16(z, w[r][1], y1);
            isum[c] = vmlaq_s32(isum[c], hsum4(p[0], p[1], p[2], p[3]), scv[2 * g]);
            isum[c] = vmlaq_s32(isum[c], hsum4(q[0], q[1], q[2], q[3]), scv[2 * g + 1]);
        }
    }
}

/* acc[c] += the terms of block i for activation c, rows in lanes */
EI_INLINE void kq_rows_terms(float64x2_t acc[4][2], int NC, const uint8_t *xr[4], size_t xo, const block_q8_K *yc[4],
                             int i, ktype t, const int32x4_t isum[4], int8_t mn[4][16]) {
    const float32x4_t d = h2f_x4(xr[0] + xo + t.d_off, xr[1] + xo + t.d_off, xr[2] + xo + t.d_off, xr[3] + xo + t.d_off);
    const float64x2_t d01 = vcvt_f64_f32(vget_low_f32(d)), d23 = vcvt_high_f64_f32(d);
    EI_UNROLL for (int c = 0; c < NC; c++) {
        const double yd = yc[c][i].d;
        float64x2_t t0 = vmulq_f64(vmulq_n_f64(d01, yd), f64_lo(isum[c]));
        float64x2_t t1 = vmulq_f64(vmulq_n_f64(d23, yd), f64_hi(isum[c]));
        if (t.dmin_off >= 0) {
            const int o = t.dmin_off;
            const float32x4_t m = h2f_x4(xr[0] + xo + o, xr[1] + xo + o, xr[2] + xo + o, xr[3] + xo + o);
            const int16_t *bs = yc[c][i].bsums;
            const int32x4_t im = hsum4(min_dot(mn[0], bs, t.sub), min_dot(mn[1], bs, t.sub),
                                       min_dot(mn[2], bs, t.sub), min_dot(mn[3], bs, t.sub));
            t0 = vsubq_f64(t0, vmulq_f64(vmulq_n_f64(vcvt_f64_f32(vget_low_f32(m)), yd), f64_lo(im)));
            t1 = vsubq_f64(t1, vmulq_f64(vmulq_n_f64(vcvt_high_f64_f32(m), yd), f64_hi(im)));
        }
        acc[c][0] = vaddq_f64(acc[c][0], t0);
        acc[c][1] = vaddq_f64(acc[c][1], t1);
    }
}

/* rows in lanes: acc[c] holds the four rows' sums for activation c (NC = 1 or 4 of them) */
EI_INLINE void kq_tile_rows(int nb, int nr, int nc, int NC, float *s, size_t ss, const uint8_t *xr[4],
                            const block_q8_K *yc[4], ktype t, kunpack_fn unpack, kscales_fn scales) {
    float64x2_t acc[4][2];
    EI_UNROLL for (int c = 0; c < NC; c++) acc[c][0] = acc[c][1] = vdupq_n_f64(0.0);
    for (int i = 0; i < nb; i++) {
        const size_t xo = (size_t)i * t.bytes;
        int32x4_t scv[16], isum[4];
        int8_t mn[4][16];
        tile_scales(xr, xo, t, scales, scv, mn);
        EI_UNROLL for (int c = 0; c < NC; c++) isum[c] = vdupq_n_s32(0);
        if (NC == 1) { /* one activation: small enough to repeat for each group */
            EI_UNROLL for (int g = 0; g < 8; g++) kq_rows_group(isum, 1, xr, xo, yc, i, g, t, unpack, scv);
        } else {
            EI_NO_UNROLL for (int g = 0; g < 8; g++) kq_rows_group(isum, NC, xr, xo, yc, i, g, t, unpack, scv);
        }
        kq_rows_terms(acc, NC, xr, xo, yc, i, t, isum, mn);
    }
    for (int c = 0; c < nc; c++) store_lanes(s + (size_t)c * ss, 1, nr, acc[c]);
}

#if EI_NEON_LEVEL >= 2
/* [s_r0, s_r0, s_r1, s_r1] of row pair rp from rows-in-lanes scales */
EI_INLINE int32x4_t pair_scale(int32x4_t v, int rp) { return rp ? vzip2q_s32(v, v) : vzip1q_s32(v, v); }

/* the integer sums of a 4 x 4 tile with smmla, in pair layout (see store_pairs) */
EI_INLINE void kq_pairs_isum(const uint8_t *xr[4], size_t xo, const block_q8_K *yc[4], int i, ktype t,
                             kunpack_fn unpack, const int32x4_t scv[16], int32x4_t isum[2][2]) {
    const int32x4_t z = vdupq_n_s32(0);
    EI_UNROLL for (int j = 0; j < 4; j++) (&isum[0][0])[j] = z;
    EI_NO_UNROLL for (int g = 0; g < 8; g++) {
        int8x16_t w[4][2];
        EI_UNROLL for (int r = 0; r < 4; r++) unpack(xr[r] + xo, g, w[r]);
        EI_UNROLL for (int cp = 0; cp < 2; cp++) {
            const int8_t *ya = yc[2 * cp][i].qs + 32 * g, *yb = yc[2 * cp + 1][i].qs + 32 * g;
            const int8x16_t a0 = vld1q_s8(ya), a1 = vld1q_s8(ya + 16), b0 = vld1q_s8(yb), b1 = vld1q_s8(yb + 16);
            EI_UNROLL for (int rp = 0; rp < 2; rp++) {
                const int8x16_t *u = w[2 * rp], *v = w[2 * rp + 1];
                if (t.sub == 32) {
                    const int32x4_t m = mmla16(mmla16(z, u[0], v[0], a0, b0), u[1], v[1], a1, b1);
                    isum[rp][cp] = vmlaq_s32(isum[rp][cp], m, pair_scale(scv[g], rp));
                } else {
                    isum[rp][cp] = vmlaq_s32(isum[rp][cp], mmla16(z, u[0], v[0], a0, b0), pair_scale(scv[2 * g], rp));
                    isum[rp][cp] = vmlaq_s32(isum[rp][cp], mmla16(z, u[1], v[1], a1, b1), pair_scale(scv[2 * g + 1], rp));
                }
            }
        }
    }
}

EI_INLINE void kq_tile_pairs(int nb, int nr, int nc, float *s, size_t ss, const uint8_t *xr[4],
                             const block_q8_K *yc[4], ktype t, kunpack_fn unpack, kscales_fn scales) {
    float64x2_t acc[2][2][2];
    EI_UNROLL for (int j = 0; j < 8; j++) (&acc[0][0][0])[j] = vdupq_n_f64(0.0);
    for (int i = 0; i < nb; i++) {
        const size_t xo = (size_t)i * t.bytes;
        int32x4_t scv[16], isum[2][2];
        int8_t mn[4][16];
        tile_scales(xr, xo, t, scales, scv, mn);
        kq_pairs_isum(xr, xo, yc, i, t, unpack, scv, isum);
        EI_UNROLL for (int cp = 0; cp < 2; cp++) {
            const block_q8_K *ya = &yc[2 * cp][i], *yb = &yc[2 * cp + 1][i];
            const float64x2_t yd = {ya->d, yb->d};
            EI_UNROLL for (int rp = 0; rp < 2; rp++) {
                int32x4_t im = vdupq_n_s32(0);
                if (t.dmin_off >= 0)
                    im = hsum4(min_dot(mn[2 * rp], ya->bsums, t.sub), min_dot(mn[2 * rp], yb->bsums, t.sub),
                               min_dot(mn[2 * rp + 1], ya->bsums, t.sub), min_dot(mn[2 * rp + 1], yb->bsums, t.sub));
                EI_UNROLL for (int h = 0; h < 2; h++) {
                    const uint8_t *b = xr[2 * rp + h] + xo;
                    const int32x4_t is = isum[rp][cp];
                    float64x2_t term = vmulq_f64(vmulq_n_f64(yd, h2f_at(b + t.d_off)), h ? f64_hi(is) : f64_lo(is));
                    if (t.dmin_off >= 0)
                        term = vsubq_f64(term, vmulq_f64(vmulq_n_f64(yd, h2f_at(b + t.dmin_off)), h ? f64_hi(im) : f64_lo(im)));
                    acc[rp][cp][h] = vaddq_f64(acc[rp][cp][h], term);
                }
            }
        }
    }
    store_pairs(s, ss, nr, nc, acc);
}
#endif

EI_INLINE void kq_gemm(int n, int nr, int nc, float *s, size_t ss, const void *x, size_t xs, const void *y,
                       size_t ys, ktype t, kunpack_fn unpack, kscales_fn scales) {
    const uint8_t *xr[4], *yp[4];
    tile_rows(xr, x, xs, nr);
    tile_rows(yp, y, ys, nc);
    const block_q8_K *yc[4] = {(const void *)yp[0], (const void *)yp[1], (const void *)yp[2], (const void *)yp[3]};
    if (nc == 1) kq_tile_rows(n / QK_K, nr, 1, 1, s, ss, xr, yc, t, unpack, scales);
#if EI_NEON_LEVEL >= 2
    else kq_tile_pairs(n / QK_K, nr, nc, s, ss, xr, yc, t, unpack, scales);
#else
    else kq_tile_rows(n / QK_K, nr, nc, 4, s, ss, xr, yc, t, unpack, scales);
#endif
}

#define KQUANT_KERNELS(T, SUB, DMIN_OFF)                                                                   \
    static const ktype type_##T = {sizeof(block_##T), offsetof(block_##T, d), DMIN_OFF, SUB};               \
    static void neon_dot_##T(int n, float *s, const void *x, const void *y) {                               \
        kq_dot(n, s, x, y, type_##T, unpack_##T, scales_##T);                                               \
    }                                                                                                       \
    static void neon_gemm_##T(int n, int nr, int nc, float *s, size_t ss, const void *x, size_t xs,        \
                              const void *y, size_t ys) {                                                   \
        kq_gemm(n, nr, nc, s, ss, x, xs, y, ys, type_##T, unpack_##T, scales_##T);                          \
    }

KQUANT_KERNELS(q2_K, 16, offsetof(block_q2_K, dmin))
KQUANT_KERNELS(q3_K, 16, -1)
KQUANT_KERNELS(q4_K, 32, offsetof(block_q4_K, dmin))
KQUANT_KERNELS(q5_K, 32, offsetof(block_q5_K, dmin))
KQUANT_KERNELS(q6_K, 16, -1)

void EI_NEON_FN(ei_neon_dot_kquants)(ei_kernels *k) {
    k->vec_dot[EI_TYPE_Q2_K] = neon_dot_q2_K;
    k->vec_dot[EI_TYPE_Q3_K] = neon_dot_q3_K;
    k->vec_dot[EI_TYPE_Q4_K] = neon_dot_q4_K;
    k->vec_dot[EI_TYPE_Q5_K] = neon_dot_q5_K;
    k->vec_dot[EI_TYPE_Q6_K] = neon_dot_q6_K;
    k->gemm[EI_TYPE_Q2_K] = neon_gemm_q2_K;
    k->gemm[EI_TYPE_Q3_K] = neon_gemm_q3_K;
    k->gemm[EI_TYPE_Q4_K] = neon_gemm_q4_K;
    k->gemm[EI_TYPE_Q5_K] = neon_gemm_q5_K;
    k->gemm[EI_TYPE_Q6_K] = neon_gemm_q6_K;
}
