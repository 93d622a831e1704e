/* NEON dot products of the 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) with their
 * q8_0 / q8_1 activations: single dots and tiles of up to 4 weight rows x 4 activations.
 *
 * Per block: the exact integer dot isum; the term (double)(d_w * d_x) * isum (d_w * d_x is
 * exact in float: two halves), plus (double)(m_w * s_x) for the _1 types; each output adds
 * its terms in block order, so results equal the reference bit for bit. */
#include <stddef.h>

#include "neon.h"

/* one weight block as 32 int8 values: v[0] holds values 0..15, v[1] values 16..31 */
typedef void (*unpack32_fn)(const uint8_t *block, int8x16_t v[2]);

static inline void unpack_q4_0(const uint8_t *b, int8x16_t v[2]) {
    const uint8x16_t q = vld1q_u8(b + offsetof(block_q4_0, qs));
    v[0] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f))), vdupq_n_s8(8));
    v[1] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
}

static inline void unpack_q4_1(const uint8_t *b, int8x16_t v[2]) {
    const uint8x16_t q = vld1q_u8(b + offsetof(block_q4_1, qs));
    v[0] = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f)));
    v[1] = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
}

/* bit j of the little-endian 32-bit field qh as 0x10 in byte j (h[0]: j < 16, h[1]: j >= 16) */
static inline void q5_high(const uint8_t *qh, uint8x16_t h[2]) {
    static const uint8_t sel[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint32_t w;
    memcpy(&w, qh, 4);
    const uint8x16_t bytes = vreinterpretq_u8_u32(vdupq_n_u32(w)), m = vld1q_u8(bit);
    h[0] = vandq_u8(vtstq_u8(vqtbl1q_u8(bytes, vld1q_u8(sel)), m), vdupq_n_u8(0x10));
    h[1] = vandq_u8(vtstq_u8(vqtbl1q_u8(bytes, vld1q_u8(sel + 16)), m), vdupq_n_u8(0x10));
}

static inline void unpack_q5_0(const uint8_t *b, int8x16_t v[2]) {
    const uint8x16_t q = vld1q_u8(b + offsetof(block_q5_0, qs));
    uint8x16_t h[2];
    q5_high(b + offsetof(block_q5_0, qh), h);
    v[0] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0f)), h[0])), vdupq_n_s8(16));
    v[1] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(q, 4), h[1])), vdupq_n_s8(16));
}

static inline void unpack_q5_1(const uint8_t *b, int8x16_t v[2]) {
    const uint8x16_t q = vld1q_u8(b + offsetof(block_q5_1, qs));
    uint8x16_t h[2];
    q5_high(b + offsetof(block_q5_1, qh), h);
    v[0] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0f)), h[0]));
    v[1] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(q, 4), h[1]));
}

static inline void unpack_q8_0(const uint8_t *b, int8x16_t v[2]) {
    v[0] = vld1q_s8((const int8_t *)b + offsetof(block_q8_0, qs));
    v[1] = vld1q_s8((const int8_t *)b + offsetof(block_q8_0, qs) + 16);
}

/* the 32 products of weight block w with activations y, in the lanes (small: |w| <= 64) */
EI_INLINE int32x4_t block_dot(const int8x16_t w[2], const uint8_t *y, int small) {
    const int8x16_t y0 = vld1q_s8((const int8_t *)y), y1 = vld1q_s8((const int8_t *)y + 16);
    const int32x4_t z = vdupq_n_s32(0);
    return small ? dot32s(z, w[0], w[1], y0, y1) : dot16(dot16(z, w[0], y0), w[1], y1);
}

/* t = four block terms: d * isum, plus the minimum terms ms when there are any */
EI_INLINE void block_terms(float64x2_t t[2], float32x4_t d, int32x4_t isum, int has_min, float32x4_t ms) {
    const float32x4_t f = vcvtq_f32_s32(isum); /* exact: |isum| <= 32 * 128 * 127 < 2^24 */
    t[0] = vmulq_f64(vcvt_f64_f32(vget_low_f32(d)), vcvt_f64_f32(vget_low_f32(f)));
    t[1] = vmulq_f64(vcvt_high_f64_f32(d), vcvt_high_f64_f32(f));
    if (has_min) {
        t[0] = vaddq_f64(t[0], vcvt_f64_f32(vget_low_f32(ms)));
        t[1] = vaddq_f64(t[1], vcvt_high_f64_f32(ms));
    }
}

/* activation blocks: q8_1 (d, s, qs) for the _1 types, else q8_0 (d, qs) */
#define ACT_BYTES(has_min) ((has_min) ? sizeof(block_q8_1) : sizeof(block_q8_0))
#define ACT_QS(has_min) ((has_min) ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs))
#define M_OFF 2 /* the _1 types' m and q8_1's s follow d */

EI_INLINE void legacy_dot(int n, float *s, const uint8_t *x, const uint8_t *y, size_t xb, unpack32_fn unpack,
                          int small, int has_min) {
    const size_t yb = ACT_BYTES(has_min), yq = ACT_QS(has_min);
    const int nb = n / 32;
    double sum = 0.0;
    int i = 0;
    for (; i + 4 <= nb; i += 4) { /* four blocks' terms at once, added in block order */
        const uint8_t *xi = x + (size_t)i * xb, *yi = y + (size_t)i * yb;
        int32x4_t p[4];
        EI_UNROLL for (int k = 0; k < 4; k++) {
            int8x16_t w[2];
            unpack(xi + k * xb, w);
            p[k] = block_dot(w, yi + k * yb + yq, small);
        }
        const float32x4_t d = vmulq_f32(h2f_x4(xi, xi + xb, xi + 2 * xb, xi + 3 * xb),
                                        h2f_x4(yi, yi + yb, yi + 2 * yb, yi + 3 * yb));
        float32x4_t ms = d;
        if (has_min) {
            xi += M_OFF, yi += M_OFF;
            ms = vmulq_f32(h2f_x4(xi, xi + xb, xi + 2 * xb, xi + 3 * xb), h2f_x4(yi, yi + yb, yi + 2 * yb, yi + 3 * yb));
        }
        float64x2_t t[2];
        block_terms(t, d, hsum4(p[0], p[1], p[2], p[3]), has_min, ms);
        sum += vgetq_lane_f64(t[0], 0);
        sum += vgetq_lane_f64(t[0], 1);
        sum += vgetq_lane_f64(t[1], 0);
        sum += vgetq_lane_f64(t[1], 1);
    }
    for (; i < nb; i++) {
        const uint8_t *xi = x + (size_t)i * xb, *yi = y + (size_t)i * yb;
        int8x16_t w[2];
        unpack(xi, w);
        double t = (double)(h2f_at(xi) * h2f_at(yi)) * vaddvq_s32(block_dot(w, yi + yq, small));
        if (has_min) t += (double)(h2f_at(xi + M_OFF) * h2f_at(yi + M_OFF));
        sum += t;
    }
    *s = (float)sum;
}

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

#define LEGACY_KERNELS(T, SMALL, HAS_MIN)                                                                  \
    static void neon_dot_##T(int n, float *s, const void *x, const void *y) {                               \
        legacy_dot(n, s, x, y, sizeof(block_##T), unpack_##T, SMALL, HAS_MIN);                              \
    }                                                                                                       \
    static void neon_gemm_##T(int n, int nr, int nc, float *s, size_t ss, const void *x, size_t xs,        \
                              const void *y, size_t ys) {                                                   \
        legacy_gemm(n, nr, nc, s, ss, x, xs, y, ys, sizeof(block_##T), unpack_##T, SMALL, HAS_MIN);         \
    }

LEGACY_KERNELS(q4_0, 1, 0)
LEGACY_KERNELS(q4_1, 1, 1)
LEGACY_KERNELS(q5_0, 1, 0)
LEGACY_KERNELS(q5_1, 1, 1)
LEGACY_KERNELS(q8_0, 0, 0)

void EI_NEON_FN(ei_neon_dot_legacy)(ei_kernels *k) {
    k->vec_dot[EI_TYPE_Q4_0] = neon_dot_q4_0;
    k->vec_dot[EI_TYPE_Q4_1] = neon_dot_q4_1;
    k->vec_dot[EI_TYPE_Q5_0] = neon_dot_q5_0;
    k->vec_dot[EI_TYPE_Q5_1] = neon_dot_q5_1;
    k->vec_dot[EI_TYPE_Q8_0] = neon_dot_q8_0;
    k->gemm[EI_TYPE_Q4_0] = neon_gemm_q4_0;
    k->gemm[EI_TYPE_Q4_1] = neon_gemm_q4_1;
    k->gemm[EI_TYPE_Q5_0] = neon_gemm_q5_0;
    k->gemm[EI_TYPE_Q5_1] = neon_gemm_q5_1;
    k->gemm[EI_TYPE_Q8_0] = neon_gemm_q8_0;
}
