/* NEON tiles of a matrix product: up to 4 weight rows x 4 activation rows, for the legacy
 * blocks, the K-quants and the float rows (blocks.h states each type's terms). Each output
 * adds its terms in the order the reference's dot product does, so every tile entry is
 * vec_dot's value bit for bit. */
#include "blocks.h"

/* ---- legacy blocks ------------------------------------------------------------------------ */

/* rows in lanes: acc[c] holds the four rows' sums for activation c (NC of them) */
EI_INLINE void legacy_tile_rows(int nb, int nr, int nc, int NC, float *s, size_t ss, const uint8_t *xr[4],
                                const uint8_t *yc[4], size_t xb, unpack32_fn unpack, int small, int has_min) {
    const size_t yb = ACT_BYTES(has_min), yq = ACT_QS(has_min);
    float64x2_t acc[4][2];
    EI_UNROLL for (int c = 0; c < NC; c++) acc[c][0] = acc[c][1] = vdupq_n_f64(0.0);
    for (int i = 0; i < nb; i++) {
        const size_t xo = (size_t)i * xb, yo = (size_t)i * yb;
        int8x16_t w[4][2];
        EI_UNROLL for (int r = 0; r < 4; r++) unpack(xr[r] + xo, w[r]);
        const float32x4_t dw = h2f_x4(xr[0] + xo, xr[1] + xo, xr[2] + xo, xr[3] + xo);
        float32x4_t mw = dw;
        if (has_min) mw = h2f_x4(xr[0] + xo + M_OFF, xr[1] + xo + M_OFF, xr[2] + xo + M_OFF, xr[3] + xo + M_OFF);
        EI_UNROLL for (int c = 0; c < NC; c++) {
            const uint8_t *yi = yc[c] + yo;
            int32x4_t p[4];
            EI_UNROLL for (int r = 0; r < 4; r++) p[r] = block_dot(w[r], yi + yq, small);
            float64x2_t t[2];
            block_terms(t, vmulq_n_f32(dw, h2f_at(yi)), hsum4(p[0], p[1], p[2], p[3]), has_min,
                        vmulq_n_f32(mw, h2f_at(yi + M_OFF)));
            acc[c][0] = vaddq_f64(acc[c][0], t[0]);
            acc[c][1] = vaddq_f64(acc[c][1], t[1]);
        }
    }
    for (int c = 0; c < nc; c++) store_lanes(s + (size_t)c * ss, 1, nr, acc[c]);
}

#if EI_NEON_LEVEL >= 2
/* smmla: 2 rows x 2 activations per instruction, results in pair layout (see store_pairs) */
EI_INLINE void legacy_tile_pairs(int nb, int nr, int nc, float *s, size_t ss, const uint8_t *xr[4],
                                 const uint8_t *yc[4], size_t xb, unpack32_fn unpack, int has_min) {
    const size_t yb = ACT_BYTES(has_min), yq = ACT_QS(has_min);
    float64x2_t acc[2][2][2];
    EI_UNROLL for (int i = 0; i < 8; i++) (&acc[0][0][0])[i] = vdupq_n_f64(0.0);
    for (int i = 0; i < nb; i++) {
        const size_t xo = (size_t)i * xb, yo = (size_t)i * yb;
        int8x16_t w[4][2];
        EI_UNROLL for (int r = 0; r < 4; r++) unpack(xr[r] + xo, w[r]);
        const float32x4_t dw = h2f_x4(xr[0] + xo, xr[1] + xo, xr[2] + xo, xr[3] + xo);
        const float32x4_t dy = h2f_x4(yc[0] + yo, yc[1] + yo, yc[2] + yo, yc[3] + yo);
        float32x4_t mw = dw, sy = dy;
        if (has_min) {
            mw = h2f_x4(xr[0] + xo + M_OFF, xr[1] + xo + M_OFF, xr[2] + xo + M_OFF, xr[3] + xo + M_OFF);
            sy = h2f_x4(yc[0] + yo + M_OFF, yc[1] + yo + M_OFF, yc[2] + yo + M_OFF, yc[3] + yo + M_OFF);
        }
        EI_UNROLL for (int cp = 0; cp < 2; cp++) {
            const int8_t *ya = (const int8_t *)(yc[2 * cp] + yo + yq), *yb_ = (const int8_t *)(yc[2 * cp + 1] + yo + yq);
            const int8x16_t a0 = vld1q_s8(ya), a1 = vld1q_s8(ya + 16), b0 = vld1q_s8(yb_), b1 = vld1q_s8(yb_ + 16);
            /* [c0, c1, c0, c1] of this column pair against [r0, r0, r1, r1] of a row pair */
            const float32x2_t dyh = cp ? vget_high_f32(dy) : vget_low_f32(dy), syh = cp ? vget_high_f32(sy) : vget_low_f32(sy);
            EI_UNROLL for (int rp = 0; rp < 2; rp++) {
                int32x4_t m = mmla16(vdupq_n_s32(0), w[2 * rp][0], w[2 * rp + 1][0], a0, b0);
                m = mmla16(m, w[2 * rp][1], w[2 * rp + 1][1], a1, b1);
                const float32x4_t dwz = rp ? vzip2q_f32(dw, dw) : vzip1q_f32(dw, dw);
                const float32x4_t mwz = rp ? vzip2q_f32(mw, mw) : vzip1q_f32(mw, mw);
                float64x2_t t[2];
                block_terms(t, vmulq_f32(dwz, vcombine_f32(dyh, dyh)), m, has_min, vmulq_f32(mwz, vcombine_f32(syh, syh)));
                acc[rp][cp][0] = vaddq_f64(acc[rp][cp][0], t[0]);
                acc[rp][cp][1] = vaddq_f64(acc[rp][cp][1], t[1]);
            }
        }
    }
    store_pairs(s, ss, nr, nc, acc);
}
#endif

EI_INLINE void legacy_gemm(int n, int nr, int nc, float *s, size_t ss, const void *x, size_t xs, const void *y,
                           size_t ys, size_t xb, unpack32_fn unpack, int small, int has_min) {
    const uint8_t *xr[4], *yc[4];
    tile_rows(xr, x, xs, nr);
    tile_rows(yc, y, ys, nc);
    if (nc == 1) legacy_tile_rows(n / 32, nr, 1, 1, s, ss, xr, yc, xb, unpack, small, has_min);
#if EI_NEON_LEVEL >= 2
    else legacy_tile_pairs(n / 32, nr, nc, s, ss, xr, yc, xb, unpack, has_min);
#else
    else legacy_tile_rows(n / 32, nr, nc, 4, s, ss, xr, yc, xb, unpack, small, has_min);
#endif
}

/* ---- K-quants ----------------------------------------------------------------------------- */

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

/* ---- float rows --------------------------------------------------------------------------- */

/* acc += lanes of v times a (four rows, one activation value) */
EI_INLINE void acc_rows(float64x2_t acc[2], float32x4_t v, float a, int kind) {
    float64x2_t p[2];
    products(p, v, a, kind);
    acc[0] = vaddq_f64(acc[0], p[0]);
    acc[1] = vaddq_f64(acc[1], p[1]);
}

EI_INLINE void float_tile(int n, int nr, int nc, int NC, float *s, size_t ss, const uint8_t *xr[4],
                          const uint8_t *yc[4], int kind) {
    float64x2_t acc[4][2];
    EI_UNROLL for (int c = 0; c < NC; c++) acc[c][0] = acc[c][1] = vdupq_n_f64(0.0);
    int e = 0;
    for (; e + 4 <= n; e += 4) {
        const float32x4_t r0 = load4(xr[0], e, kind), r1 = load4(xr[1], e, kind);
        const float32x4_t r2 = load4(xr[2], e, kind), r3 = load4(xr[3], e, kind);
        const float64x2_t t0 = vreinterpretq_f64_f32(vtrn1q_f32(r0, r1)), t1 = vreinterpretq_f64_f32(vtrn2q_f32(r0, r1));
        const float64x2_t t2 = vreinterpretq_f64_f32(vtrn1q_f32(r2, r3)), t3 = vreinterpretq_f64_f32(vtrn2q_f32(r2, r3));
        /* v[m]: element e + m of the four rows */
        const float32x4_t v[4] = {vreinterpretq_f32_f64(vzip1q_f64(t0, t2)), vreinterpretq_f32_f64(vzip1q_f64(t1, t3)),
                                  vreinterpretq_f32_f64(vzip2q_f64(t0, t2)), vreinterpretq_f32_f64(vzip2q_f64(t1, t3))};
        EI_UNROLL for (int c = 0; c < NC; c++) {
            const float32x4_t a = load4(yc[c], e, kind);
            acc_rows(acc[c], v[0], vgetq_lane_f32(a, 0), kind);
            acc_rows(acc[c], v[1], vgetq_lane_f32(a, 1), kind);
            acc_rows(acc[c], v[2], vgetq_lane_f32(a, 2), kind);
            acc_rows(acc[c], v[3], vgetq_lane_f32(a, 3), kind);
        }
    }
    for (; e < n; e++) {
        const float v[4] = {load1(xr[0], e, kind), load1(xr[1], e, kind), load1(xr[2], e, kind), load1(xr[3], e, kind)};
        EI_UNROLL for (int c = 0; c < NC; c++) acc_rows(acc[c], vld1q_f32(v), load1(yc[c], e, kind), kind);
    }
    for (int c = 0; c < nc; c++) store_lanes(s + (size_t)c * ss, 1, nr, acc[c]);
}

EI_INLINE void float_gemm(int n, int nr, int nc, float *s, size_t ss, const void *x, size_t xs, const void *y,
                          size_t ys, int kind) {
    const uint8_t *xr[4], *yc[4];
    tile_rows(xr, x, xs, nr);
    tile_rows(yc, y, ys, nc);
    if (nc == 1) float_tile(n, nr, 1, 1, s, ss, xr, yc, kind);
    else float_tile(n, nr, nc, 4, s, ss, xr, yc, kind);
}

#define LEGACY_GEMM(T, SMALL, HAS_MIN)                                                                     \
    static void neon_gemm_##T(int n, int nr, int nc, float *s, size_t ss, const void *x, size_t xs,        \
                              const void *y, size_t ys) {                                                   \
        legacy_gemm(n, nr, nc, s, ss, x, xs, y, ys, sizeof(block_##T), unpack_##T, SMALL, HAS_MIN);         \
    }
LEGACY_GEMM(q4_0, 1, 0)
LEGACY_GEMM(q4_1, 1, 1)
LEGACY_GEMM(q5_0, 1, 0)
LEGACY_GEMM(q5_1, 1, 1)
LEGACY_GEMM(q8_0, 0, 0)

#define KQUANT_GEMM(T, SUB, DMIN_OFF)                                                                      \
    static const ktype type_##T = {sizeof(block_##T), offsetof(block_##T, d), DMIN_OFF, SUB};               \
    static void neon_gemm_##T(int n, int nr, int nc, float *s, size_t ss, const void *x, size_t xs,        \
                              const void *y, size_t ys) {                                                   \
        kq_gemm(n, nr, nc, s, ss, x, xs, y, ys, type_##T, unpack_##T, scales_##T);                          \
    }
KQUANT_GEMM(q2_K, 16, offsetof(block_q2_K, dmin))
KQUANT_GEMM(q3_K, 16, -1)
KQUANT_GEMM(q4_K, 32, offsetof(block_q4_K, dmin))
KQUANT_GEMM(q5_K, 32, offsetof(block_q5_K, dmin))
KQUANT_GEMM(q6_K, 16, -1)

#define FLOAT_GEMM(T, KIND)                                                                                \
    static void neon_gemm_##T(int n, int nr, int nc, float *s, size_t ss, const void *x, size_t xs,        \
                              const void *y, size_t ys) {                                                   \
        float_gemm(n, nr, nc, s, ss, x, xs, y, ys, KIND);                                                    \
    }
FLOAT_GEMM(f32, ROW_F32)
FLOAT_GEMM(f16, ROW_F16)
FLOAT_GEMM(bf16, ROW_BF16)

#if EI_NEON_LEVEL >= 1
/* ---- rows interleaved by 16 (block_q4_0x16, _q4_1x16, _q5_0x16, _q8_0x16, _q4_Kx16, _q5_Kx16,
 * _q6_Kx16) ----
 * A 16-byte load at 64 k + 16 v of a 256-byte unit of nibble pairs holds 4 bytes of each of
 * rows 4v..4v+3, which is sdot's lane layout: with the activation's 4 bytes broadcast by the
 * lane form, lane r of the sum is row 4v + r's (x86_avx2/gemm.c states the layouts' reasons).
 * Unsigned values go in as they are (below 128, sdot's signed bytes read them right), Q8_0's
 * signed ones as stored, and each offset (8, 16, 32) starts the sum at its multiple of the
 * activation's sum. Integer sums are exact, and each output adds its
 * block terms in block order, rounded as the reference rounds them: vec_dot bit for bit. The
 * columns share each block's unpacked weights; rows 4v..4v+3 of a block are done for every
 * column before the next four, so the accumulators of a column are (rows 2q, 2q + 1). */

/* rows 4v..4v+3 of a unit of nibble pairs: w[k] values 4k..4k+3, w[4 + k] values 16 + 4k.. */
EI_INLINE void x16_nibbles(const uint8_t *qs, int v, uint8x16_t w[8]) {
    EI_UNROLL for (int k = 0; k < 4; k++) {
        const uint8x16_t q = vld1q_u8(qs + 64 * k + 16 * v);
        w[k] = vandq_u8(q, vdupq_n_u8(0x0f));
        w[4 + k] = vshrq_n_u8(q, 4);
    }
}

/* acc + the four rows of w[0..3] against 16 activations a (values 4k..4k+3 in lane k) */
EI_INLINE int32x4_t x16_dot16(int32x4_t acc, const uint8x16_t w[4], int8x16_t a) {
    acc = vdotq_laneq_s32(acc, vreinterpretq_s8_u8(w[0]), a, 0);
    acc = vdotq_laneq_s32(acc, vreinterpretq_s8_u8(w[1]), a, 1);
    acc = vdotq_laneq_s32(acc, vreinterpretq_s8_u8(w[2]), a, 2);
    return vdotq_laneq_s32(acc, vreinterpretq_s8_u8(w[3]), a, 3);
}

/* the four rows' fp16 fields at p (4 consecutive), as floats */
EI_INLINE float32x4_t x16_h2f(const ei_f16 *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

/* the lanes of acc[c][0..7] (16 rows) as floats to s + c * ss */
EI_INLINE void x16_store(int nc, float *s, size_t ss, float64x2_t acc[EI_TILE][8]) {
    for (int c = 0; c < nc; c++) {
        EI_UNROLL for (int q = 0; q < 4; q++)
            vst1q_f32(s + (size_t)c * ss + 4 * q, vcvt_high_f32_f64(vcvt_f32_f64(acc[c][2 * q]), acc[c][2 * q + 1]));
    }
}

/* the fifth bits of rows 4v..4v+3 (qh: their 16 bytes of block_q5_0x16's or block_q5_Kx16's
 * qh) under the nibbles: bit k to w[k], bit 4 + k to w[4 + k] */
EI_INLINE void x16_q5_high(const uint8_t *qh, uint8x16_t w[8]) {
    const uint8x16_t h = vld1q_u8(qh), bit4 = vdupq_n_u8(0x10);
    EI_UNROLL for (int k = 0; k < 4; k++) {
        w[k] = vorrq_u8(w[k], vandq_u8(shl(h, 4 - k), bit4));
        w[4 + k] = vorrq_u8(w[4 + k], vandq_u8(shl(h, -k), bit4));
    }
}

/* rows 4v..4v+3 of a legacy block as sdot takes them: w[k] values 4k..4k+3 (k < 8), Q8_0's
 * signed bytes as they are stored, the others' unsigned values (Q5_0's with their fifth bits) */
EI_INLINE void x16_legacy_weights(int type, const uint8_t *x, int v, uint8x16_t w[8]) {
    if (type == EI_TYPE_Q8_0) {
        const int8_t *qs = ((const block_q8_0x16 *)x)->qs;
        EI_UNROLL for (int k = 0; k < 8; k++) w[k] = vreinterpretq_u8_s8(vld1q_s8(qs + 64 * k + 16 * v));
        return;
    }
    x16_nibbles(type == EI_TYPE_Q4_0 ? ((const block_q4_0x16 *)x)->qs
                : type == EI_TYPE_Q4_1 ? ((const block_q4_1x16 *)x)->qs : ((const block_q5_0x16 *)x)->qs, v, w);
    if (type == EI_TYPE_Q5_0) x16_q5_high(((const block_q5_0x16 *)x)->qh[4 * v], w);
}

/* a legacy type's offset (the nibbles' zero) and the bytes of its interleaved block */
#define X16_OFFSET(type) ((type) == EI_TYPE_Q4_0 ? -8 : (type) == EI_TYPE_Q5_0 ? -16 : 0)
#define X16_BYTES(type)                                                                              \
    ((type) == EI_TYPE_Q4_1 ? sizeof(block_q4_1x16) : (type) == EI_TYPE_Q5_0 ? sizeof(block_q5_0x16) \
     : (type) == EI_TYPE_Q8_0 ? sizeof(block_q8_0x16) : sizeof(block_q4_0x16))

/* Q4_0, Q4_1, Q5_0 and Q8_0: the block terms d_w d_x isum (+ m_w s_x for Q4_1, both products
 * exact in float) as block_terms rounds them, that is as the reference does */
EI_INLINE void x16_legacy(int type, int n, int nc, float *s, size_t ss, const void *vx, const void *vy, size_t ys) {
    const int q4_1 = type == EI_TYPE_Q4_1, offset = X16_OFFSET(type);
    const size_t bytes = X16_BYTES(type);
    const size_t yb = ACT_BYTES(q4_1), yq = ACT_QS(q4_1);
    const uint8_t *x = vx;
    float64x2_t acc[EI_TILE][8];
    for (int c = 0; c < nc; c++) {
        EI_UNROLL for (int q = 0; q < 8; q++) acc[c][q] = vdupq_n_f64(0.0);
    }
    for (int i = 0; i < n / QK4_0; i++, x += bytes) {
        const ei_f16 *d = (const ei_f16 *)x, *m = q4_1 ? ((const block_q4_1x16 *)x)->m : d; /* d: the first field */
        int8x16_t a[EI_TILE][2];
        int32x4_t start[EI_TILE]; /* the weights' offset times the activations' sum */
        float dy[EI_TILE], sy[EI_TILE];
        for (int c = 0; c < nc; c++) {
            const uint8_t *y = (const uint8_t *)vy + (size_t)c * ys + (size_t)i * yb; /* d, then q8_1's s */
            a[c][0] = vld1q_s8((const int8_t *)(y + yq)), a[c][1] = vld1q_s8((const int8_t *)(y + yq + 16));
            start[c] = vdupq_n_s32(offset * (vaddlvq_s8(a[c][0]) + vaddlvq_s8(a[c][1])));
            dy[c] = h2f_at(y);
            sy[c] = q4_1 ? h2f_at(y + M_OFF) : 0.0f;
        }
        EI_UNROLL for (int v = 0; v < 4; v++) {
            uint8x16_t w[8];
            x16_legacy_weights(type, x, v, w);
            const float32x4_t dw = x16_h2f(d + 4 * v), mw = x16_h2f(m + 4 * v);
            for (int c = 0; c < nc; c++) {
                const int32x4_t isum = x16_dot16(x16_dot16(start[c], w, a[c][0]), w + 4, a[c][1]);
                float64x2_t t[2];
                block_terms(t, vmulq_n_f32(dw, dy[c]), isum, q4_1, vmulq_n_f32(mw, sy[c]));
                acc[c][2 * v] = vaddq_f64(acc[c][2 * v], t[0]);
                acc[c][2 * v + 1] = vaddq_f64(acc[c][2 * v + 1], t[1]);
            }
        }
    }
    x16_store(nc, s, ss, acc);
}

#if EI_NEON_LEVEL >= 2
/* i8mm: x16_legacy's blocks and terms, the integer sums by smmla. Zipping the 32-bit lanes of
 * w[2j] and w[2j + 1] gives rows 4v, 4v + 1 (zip1) or 4v + 2, 4v + 3 (zip2), values 8j..8j + 7
 * of each: smmla's 2 x 8 operand. A column pair's values 8j..8j + 7 are zipped alike (zip_lo,
 * zip_hi), so four smmla add a block's [r0.c0, r0.c1, r1.c0, r1.c1] (pair layout), each lane
 * started at the offset times its column's sum as sdot's are. The weights go in as they do for
 * sdot, so the sums are the same integers, and each lane takes its own row's and column's
 * d_w d_y (and m_w s_y) through block_terms: the same terms, added in block order, hence vec_dot
 * bit for bit. An odd last column is paired with itself and its copy dropped at the store; a
 * single column takes sdot, which wastes no half of each product. */

/* acc[p][2v + rp][h]: row 4v + 2rp + h, columns 2p, 2p + 1 in the lanes; column c to s + c * ss */
EI_INLINE void x16_store_pairs(int nc, float *s, size_t ss, float64x2_t acc[2][8][2]) {
    for (int c = 0; c < nc; c++) {
        EI_UNROLL for (int v = 0; v < 4; v++) {
            float64x2_t (*a)[2] = acc[c / 2] + 2 * v;
            const float64x2_t lo = c & 1 ? vzip2q_f64(a[0][0], a[0][1]) : vzip1q_f64(a[0][0], a[0][1]);
            const float64x2_t hi = c & 1 ? vzip2q_f64(a[1][0], a[1][1]) : vzip1q_f64(a[1][0], a[1][1]);
            vst1q_f32(s + (size_t)c * ss + 4 * v, vcvt_high_f32_f64(vcvt_f32_f64(lo), hi));
        }
    }
}

EI_INLINE void x16_legacy_mmla(int type, int n, int nc, float *s, size_t ss, const void *vx, const void *vy,
                               size_t ys) {
    if (nc == 1) {
        x16_legacy(type, n, 1, s, ss, vx, vy, ys);
        return;
    }
    const int q4_1 = type == EI_TYPE_Q4_1, offset = X16_OFFSET(type), np = (nc + 1) / 2;
    const size_t bytes = X16_BYTES(type), yb = ACT_BYTES(q4_1), yq = ACT_QS(q4_1);
    const uint8_t *x = vx;
    float64x2_t acc[2][8][2];
    for (int p = 0; p < np; p++) {
        EI_UNROLL for (int q = 0; q < 8; q++) acc[p][q][0] = acc[p][q][1] = vdupq_n_f64(0.0);
    }
    for (int i = 0; i < n / QK4_0; i++, x += bytes) {
        const ei_f16 *d = (const ei_f16 *)x, *m = q4_1 ? ((const block_q4_1x16 *)x)->m : d;
        int8x16_t a[2][4];  /* column pair p's values 8j..8j + 7 in a[p][j] */
        int32x4_t start[2]; /* the offset times the columns' sums, pair layout */
        float32x4_t dy[2], sy[2];
        for (int p = 0; p < np; p++) {
            const uint8_t *y0 = (const uint8_t *)vy + (size_t)(2 * p) * ys + (size_t)i * yb;
            const uint8_t *y1 = (const uint8_t *)vy + (size_t)(2 * p + 1 < nc ? 2 * p + 1 : 2 * p) * ys + (size_t)i * yb;
            const int8x16_t a0 = vld1q_s8((const int8_t *)(y0 + yq)), a1 = vld1q_s8((const int8_t *)(y0 + yq + 16));
            const int8x16_t b0 = vld1q_s8((const int8_t *)(y1 + yq)), b1 = vld1q_s8((const int8_t *)(y1 + yq + 16));
            a[p][0] = zip_lo(a0, b0), a[p][1] = zip_hi(a0, b0), a[p][2] = zip_lo(a1, b1), a[p][3] = zip_hi(a1, b1);
            const int32x2_t sums = {vaddlvq_s8(a0) + vaddlvq_s8(a1), vaddlvq_s8(b0) + vaddlvq_s8(b1)};
            start[p] = vmulq_n_s32(vcombine_s32(sums, sums), offset);
            const float32x2_t d2 = {h2f_at(y0), h2f_at(y1)};
            dy[p] = vcombine_f32(d2, d2);
            const float32x2_t s2 = {q4_1 ? h2f_at(y0 + M_OFF) : 0.0f, q4_1 ? h2f_at(y1 + M_OFF) : 0.0f};
            sy[p] = vcombine_f32(s2, s2);
        }
        EI_UNROLL for (int v = 0; v < 4; v++) {
            uint8x16_t w[8];
            x16_legacy_weights(type, x, v, w);
            int8x16_t wp[2][4]; /* rows 4v + 2rp, 4v + 2rp + 1: values 8j..8j + 7 in wp[rp][j] */
            EI_UNROLL for (int j = 0; j < 4; j++) {
                const int32x4_t u = vreinterpretq_s32_u8(w[2 * j]), t = vreinterpretq_s32_u8(w[2 * j + 1]);
                wp[0][j] = vreinterpretq_s8_s32(vzip1q_s32(u, t));
                wp[1][j] = vreinterpretq_s8_s32(vzip2q_s32(u, t));
            }
            const float32x4_t dw = x16_h2f(d + 4 * v), mw = x16_h2f(m + 4 * v);
            EI_UNROLL for (int rp = 0; rp < 2; rp++) {
                const float32x4_t dwz = rp ? vzip2q_f32(dw, dw) : vzip1q_f32(dw, dw);
                const float32x4_t mwz = rp ? vzip2q_f32(mw, mw) : vzip1q_f32(mw, mw);
                for (int p = 0; p < np; p++) {
                    int32x4_t isum = start[p];
                    EI_UNROLL for (int j = 0; j < 4; j++) isum = vmmlaq_s32(isum, wp[rp][j], a[p][j]);
                    float64x2_t t[2];
                    block_terms(t, vmulq_f32(dwz, dy[p]), isum, q4_1, vmulq_f32(mwz, sy[p]));
                    acc[p][2 * v + rp][0] = vaddq_f64(acc[p][2 * v + rp][0], t[0]);
                    acc[p][2 * v + rp][1] = vaddq_f64(acc[p][2 * v + rp][1], t[1]);
                }
            }
        }
    }
    x16_store_pairs(nc, s, ss, acc);
}
#define X16_LEGACY x16_legacy_mmla
#else
#define X16_LEGACY x16_legacy
#endif

/* 4 bytes at p (the scales or minimums of four rows) as int32 lanes */
EI_INLINE int32x4_t x16_u8x4(const uint8_t *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    return vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(u))))));
}
EI_INLINE int32x4_t x16_s8x4(const int8_t *p) {
    int32_t u;
    memcpy(&u, p, 4);
    return vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(u)))));
}

/* Q4_K, or Q5_K with its fifth bits qh (block_q5_Kx16's; NULL for Q4_K), rows 4v..4v+3 of
 * super-block b: isum[c] = sum_j sc_j dot_j, imin[c] = sum_j mn_j bsum_j */
EI_INLINE void x16_k4_rows(const block_q4_Kx16 *b, const uint8_t (*qh)[EI_X16 * 4], int v, int nc,
                           const block_q8_K *y[EI_TILE], int32x4_t isum[EI_TILE], int32x4_t imin[EI_TILE]) {
    for (int j = 0; j < QK_K / 32; j++) {
        uint8x16_t w[8];
        x16_nibbles(b->qs[j], v, w);
        if (qh) x16_q5_high(qh[j] + 16 * v, w);
        const int32x4_t sc = x16_u8x4(b->sc[j] + 4 * v), mn = x16_u8x4(b->mn[j] + 4 * v);
        for (int c = 0; c < nc; c++) {
            const int8_t *a = y[c]->qs + 32 * j;
            const int32x4_t dot = x16_dot16(x16_dot16(vdupq_n_s32(0), w, vld1q_s8(a)), w + 4, vld1q_s8(a + 16));
            isum[c] = vmlaq_s32(isum[c], dot, sc);
            imin[c] = vmlaq_n_s32(imin[c], mn, y[c]->bsums[2 * j] + y[c]->bsums[2 * j + 1]);
        }
    }
}

/* Q6_K's high two bits of rows 4v..4v+3 of a unit under the nibbles (block_q6_Kx16's qh) */
EI_INLINE void x16_q6_high(const uint8_t *qh, int v, uint8x16_t w[8]) {
    const uint8x16_t two = vdupq_n_u8(0x30);
    EI_UNROLL for (int m = 0; m < 2; m++) {
        const uint8x16_t h = vld1q_u8(qh + 64 * m + 16 * v);
        w[2 * m] = vorrq_u8(w[2 * m], vandq_u8(vshlq_n_u8(h, 4), two));
        w[4 + 2 * m] = vorrq_u8(w[4 + 2 * m], vandq_u8(vshlq_n_u8(h, 2), two));
        w[2 * m + 1] = vorrq_u8(w[2 * m + 1], vandq_u8(h, two));
        w[4 + 2 * m + 1] = vorrq_u8(w[4 + 2 * m + 1], vandq_u8(vshrq_n_u8(h, 2), two));
    }
}

/* Q6_K, rows 4v..4v+3 of super-block b: isum[c] = sum over the 16 sub-blocks s of
 * sc_s (dot_s - 32 bsum_s); unit j's low nibbles are sub-block 2j, its high ones 2j + 1 */
EI_INLINE void x16_q6_K_rows(const block_q6_Kx16 *b, int v, int nc, const block_q8_K *y[EI_TILE],
                             int32x4_t isum[EI_TILE]) {
    for (int j = 0; j < QK_K / 32; j++) {
        uint8x16_t w[8];
        x16_nibbles(b->ql[j], v, w);
        x16_q6_high(b->qh[j], v, w);
        const int32x4_t sc0 = x16_s8x4(b->sc[2 * j] + 4 * v), sc1 = x16_s8x4(b->sc[2 * j + 1] + 4 * v);
        for (int c = 0; c < nc; c++) {
            const int8_t *a = y[c]->qs + 32 * j;
            const int16_t *bs = y[c]->bsums + 2 * j;
            const int32x4_t lo = x16_dot16(vdupq_n_s32(-32 * bs[0]), w, vld1q_s8(a));
            const int32x4_t hi = x16_dot16(vdupq_n_s32(-32 * bs[1]), w + 4, vld1q_s8(a + 16));
            isum[c] = vmlaq_s32(vmlaq_s32(isum[c], lo, sc0), hi, sc1);
        }
    }
}

/* super-block terms (d_y d) isum [- (d_y dmin) imin] of rows 4v..4v+3, as the reference rounds them */
EI_INLINE void x16_k_terms(float64x2_t acc[2], double yd, float32x4_t d, int32x4_t isum, const float32x4_t *dmin,
                           int32x4_t imin) {
    float64x2_t t0 = vmulq_f64(vmulq_n_f64(vcvt_f64_f32(vget_low_f32(d)), yd), f64_lo(isum));
    float64x2_t t1 = vmulq_f64(vmulq_n_f64(vcvt_high_f64_f32(d), yd), f64_hi(isum));
    if (dmin) {
        t0 = vsubq_f64(t0, vmulq_f64(vmulq_n_f64(vcvt_f64_f32(vget_low_f32(*dmin)), yd), f64_lo(imin)));
        t1 = vsubq_f64(t1, vmulq_f64(vmulq_n_f64(vcvt_high_f64_f32(*dmin), yd), f64_hi(imin)));
    }
    acc[0] = vaddq_f64(acc[0], t0);
    acc[1] = vaddq_f64(acc[1], t1);
}

/* type: EI_TYPE_Q4_K, Q5_K or Q6_K (a constant in each inlined copy); a block_q5_Kx16 starts
 * with its block_q4_Kx16 */
EI_INLINE void x16_k(int type, int n, int nc, float *s, size_t ss, const void *vx, const void *vy, size_t ys) {
    const int q5 = type == EI_TYPE_Q5_K;
    const size_t bytes = type == EI_TYPE_Q6_K ? sizeof(block_q6_Kx16) : q5 ? sizeof(block_q5_Kx16) : sizeof(block_q4_Kx16);
    const uint8_t *x = vx;
    float64x2_t acc[EI_TILE][8];
    for (int c = 0; c < nc; c++) {
        EI_UNROLL for (int q = 0; q < 8; q++) acc[c][q] = vdupq_n_f64(0.0);
    }
    for (int i = 0; i < n / QK_K; i++, x += bytes) {
        const block_q8_K *y[EI_TILE];
        for (int c = 0; c < nc; c++) y[c] = (const block_q8_K *)((const uint8_t *)vy + (size_t)c * ys) + i;
        EI_NO_UNROLL for (int v = 0; v < 4; v++) {
            int32x4_t isum[EI_TILE], imin[EI_TILE];
            for (int c = 0; c < nc; c++) isum[c] = imin[c] = vdupq_n_s32(0);
            if (type == EI_TYPE_Q6_K) {
                const block_q6_Kx16 *b = (const block_q6_Kx16 *)x;
                x16_q6_K_rows(b, v, nc, y, isum);
                const float32x4_t d = x16_h2f(b->d + 4 * v);
                for (int c = 0; c < nc; c++) x16_k_terms(acc[c] + 2 * v, y[c]->d, d, isum[c], NULL, imin[c]);
            } else {
                const block_q4_Kx16 *b = (const block_q4_Kx16 *)x;
                x16_k4_rows(b, q5 ? ((const block_q5_Kx16 *)x)->qh : NULL, v, nc, y, isum, imin);
                const float32x4_t d = x16_h2f(b->d + 4 * v), dmin = x16_h2f(b->dmin + 4 * v);
                for (int c = 0; c < nc; c++) x16_k_terms(acc[c] + 2 * v, y[c]->d, d, isum[c], &dmin, imin[c]);
            }
        }
    }
    x16_store(nc, s, ss, acc);
}

/* the column count a constant inside each inlined copy */
#define X16_GEMM(T, KERNEL, ARG)                                                                        \
    static void neon_gemm_x16_##T(int n, int nc, float *s, size_t ss, const void *x, const void *y, size_t ys) { \
        switch (nc) {                                                                                   \
        case 1: KERNEL(ARG, n, 1, s, ss, x, y, ys); break;                                              \
        case 2: KERNEL(ARG, n, 2, s, ss, x, y, ys); break;                                              \
        case 3: KERNEL(ARG, n, 3, s, ss, x, y, ys); break;                                              \
        default: KERNEL(ARG, n, EI_TILE, s, ss, x, y, ys); break;                                       \
        }                                                                                               \
    }
X16_GEMM(q4_0, X16_LEGACY, EI_TYPE_Q4_0)
X16_GEMM(q4_1, X16_LEGACY, EI_TYPE_Q4_1)
X16_GEMM(q5_0, X16_LEGACY, EI_TYPE_Q5_0)
X16_GEMM(q8_0, X16_LEGACY, EI_TYPE_Q8_0)
X16_GEMM(q4_K, x16_k, EI_TYPE_Q4_K)
X16_GEMM(q5_K, x16_k, EI_TYPE_Q5_K)
X16_GEMM(q6_K, x16_k, EI_TYPE_Q6_K)

/* ---- F16 and BF16 rows interleaved by 16 (block_f16x16) ----------------------------------
 * Lanes = rows, two a vector: value d of 4 rows is one 8-byte load converted to doubles once
 * for all columns, and each column's values are converted a chunk at a time into doubles that
 * are broadcast to the rows. A product of two such values is exact in double, so a fused add
 * rounds as the reference's add, and each (row, column) lane adds in index order: vec_dot bit
 * for bit. A pass takes all 16 rows for 1-2 columns, 8 for more: 16 accumulators at most. */
#define HX16_CHUNK 64 /* values converted at a time: (columns, chunk) doubles stay in L1 */

/* 4 consecutive 16-bit values (of 4 rows, or of one row) as floats */
EI_INLINE float32x4_t half4_f32(int bf16, const uint16_t *p) {
    const uint16x4_t h = vld1_u16(p);
    return bf16 ? vreinterpretq_f32_u32(vshll_n_u16(h, 16)) : vcvt_f32_f16(vreinterpret_f16_u16(h));
}

/* a[j] = value j of m values of an activation row, as doubles */
EI_INLINE void half_chunk(int bf16, const uint16_t *y, int m, double *a) {
    int j = 0;
    for (; j + 4 <= m; j += 4) {
        const float32x4_t f = half4_f32(bf16, y + j);
        vst1q_f64(a + j, vcvt_f64_f32(vget_low_f32(f)));
        vst1q_f64(a + j + 2, vcvt_high_f64_f32(f));
    }
    for (; j < m; j++) a[j] = bf16 ? ei_bf16_to_fp32(y[j]) : h2f(y[j]);
}

/* acc[c][4 h0 + k] (rows 2 (4 h0 + k)..) += the chunk's m products with column c, k < 4 nh */
EI_INLINE void hx16_pass(int bf16, int nc, int nh, int h0, int m, const block_f16x16 *x, double (*a)[HX16_CHUNK],
                         float64x2_t (*acc)[8]) {
    const int nv = 4 * nh; /* vectors of the pass a column */
    float64x2_t r[16];     /* (column, vector): nc * nv <= 16 */
    for (int c = 0; c < nc; c++) {
        EI_UNROLL for (int k = 0; k < nv; k++) r[c * nv + k] = acc[c][4 * h0 + k];
    }
    for (int j = 0; j < m; j++) {
        float64x2_t w[8];
        EI_UNROLL for (int k = 0; k < nv / 2; k++) {
            const float32x4_t f = half4_f32(bf16, x[j].v + 8 * h0 + 4 * k);
            w[2 * k] = vcvt_f64_f32(vget_low_f32(f));
            w[2 * k + 1] = vcvt_high_f64_f32(f);
        }
        EI_UNROLL for (int c = 0; c < nc; c++) {
            const float64x2_t v = vld1q_dup_f64(&a[c][j]);
            EI_UNROLL for (int k = 0; k < nv; k++) r[c * nv + k] = vfmaq_f64(r[c * nv + k], w[k], v);
        }
    }
    for (int c = 0; c < nc; c++) {
        EI_UNROLL for (int k = 0; k < nv; k++) acc[c][4 * h0 + k] = r[c * nv + k];
    }
}

EI_INLINE void x16_half(int bf16, int n, int nc, float *s, size_t ss, const void *vx, const void *vy, size_t ys) {
    const int nh = nc <= 2 ? 2 : 1; /* halves (8 rows) a pass */
    const block_f16x16 *x = vx;
    double a[EI_TILE][HX16_CHUNK]; /* (column, chunk) */
    float64x2_t acc[EI_TILE][8];   /* (column, rows 2v, 2v + 1) */
    for (int c = 0; c < nc; c++) {
        EI_UNROLL for (int q = 0; q < 8; q++) acc[c][q] = vdupq_n_f64(0.0);
    }
    for (int d0 = 0; d0 < n; d0 += HX16_CHUNK) {
        const int m = n - d0 < HX16_CHUNK ? n - d0 : HX16_CHUNK;
        for (int c = 0; c < nc; c++) half_chunk(bf16, (const uint16_t *)((const uint8_t *)vy + (size_t)c * ys) + d0, m, a[c]);
        for (int h0 = 0; h0 < 2; h0 += nh) hx16_pass(bf16, nc, nh, h0, m, x + d0, a, acc);
    }
    x16_store(nc, s, ss, acc);
}
X16_GEMM(f16, x16_half, 0)
X16_GEMM(bf16, x16_half, 1)
#endif

void EI_NEON_FN(ei_neon_gemms)(ei_kernels *k) {
#if EI_NEON_LEVEL >= 1
    k->gemm_x16[EI_TYPE_Q4_0] = neon_gemm_x16_q4_0;
    k->gemm_x16[EI_TYPE_Q5_0] = neon_gemm_x16_q5_0;
    k->gemm_x16[EI_TYPE_Q4_1] = neon_gemm_x16_q4_1;
    k->gemm_x16[EI_TYPE_Q8_0] = neon_gemm_x16_q8_0;
    k->gemm_x16[EI_TYPE_Q4_K] = neon_gemm_x16_q4_K;
    k->gemm_x16[EI_TYPE_Q5_K] = neon_gemm_x16_q5_K;
    k->gemm_x16[EI_TYPE_Q6_K] = neon_gemm_x16_q6_K;
    /* F16 and BF16 need no dot products, but stay with the others: a level either copies
     * matrices or keeps them all as stored (tests/e2e: INTERLEAVING_ISAS) */
    k->gemm_x16[EI_TYPE_F16] = neon_gemm_x16_f16;
    k->gemm_x16[EI_TYPE_BF16] = neon_gemm_x16_bf16;
#endif
    k->gemm[EI_TYPE_Q4_0] = neon_gemm_q4_0;
    k->gemm[EI_TYPE_Q4_1] = neon_gemm_q4_1;
    k->gemm[EI_TYPE_Q5_0] = neon_gemm_q5_0;
    k->gemm[EI_TYPE_Q5_1] = neon_gemm_q5_1;
    k->gemm[EI_TYPE_Q8_0] = neon_gemm_q8_0;
    k->gemm[EI_TYPE_Q2_K] = neon_gemm_q2_K;
    k->gemm[EI_TYPE_Q3_K] = neon_gemm_q3_K;
    k->gemm[EI_TYPE_Q4_K] = neon_gemm_q4_K;
    k->gemm[EI_TYPE_Q5_K] = neon_gemm_q5_K;
    k->gemm[EI_TYPE_Q6_K] = neon_gemm_q6_K;
    k->gemm[EI_TYPE_F32] = neon_gemm_f32;
    k->gemm[EI_TYPE_F16] = neon_gemm_f16;
    k->gemm[EI_TYPE_BF16] = neon_gemm_bf16;
}
