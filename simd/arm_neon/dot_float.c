/* NEON dot products of float rows (F32, F16, BF16 weights with activations of the same type).
 *
 * Every product is exact: two halves multiply exactly in float, floats and bfloat16s in
 * double (where fused and unfused multiply-add round alike). The reference adds them in
 * element order, so a single dot does too; a tile puts four weight rows in the lanes and
 * keeps each row's order while the rows run side by side. */
#include "neon.h"

enum { ROW_F32, ROW_F16, ROW_BF16 };

/* elements e..e+3 of a row as floats */
EI_INLINE float32x4_t load4(const void *row, int e, int kind) {
    if (kind == ROW_F32) return vld1q_f32((const float *)row + e);
    const uint16x4_t h = vld1_u16((const uint16_t *)row + e);
    if (kind == ROW_F16) return vcvt_f32_f16(vreinterpret_f16_u16(h));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

EI_INLINE float load1(const void *row, int e, int kind) {
    if (kind == ROW_F32) return ((const float *)row)[e];
    const uint16_t h = ((const uint16_t *)row)[e];
    return kind == ROW_F16 ? h2f(h) : ei_bf16_to_fp32(h);
}

/* the exact products of the lanes of v with a, in double */
EI_INLINE void products(float64x2_t p[2], float32x4_t v, float a, int kind) {
    if (kind == ROW_F16) {
        const float32x4_t f = vmulq_n_f32(v, a);
        p[0] = vcvt_f64_f32(vget_low_f32(f));
        p[1] = vcvt_high_f64_f32(f);
    } else {
        p[0] = vmulq_n_f64(vcvt_f64_f32(vget_low_f32(v)), a);
        p[1] = vmulq_n_f64(vcvt_high_f64_f32(v), a);
    }
}

EI_INLINE void float_dot(int n, float *s, const void *x, const void *y, int kind) {
    double sum = 0.0;
    int e = 0;
    for (; e + 4 <= n; e += 4) {
        const float32x4_t a = load4(x, e, kind), b = load4(y, e, kind);
        float64x2_t p[2];
        if (kind == ROW_F16) {
            const float32x4_t f = vmulq_f32(a, b);
            p[0] = vcvt_f64_f32(vget_low_f32(f)), p[1] = vcvt_high_f64_f32(f);
        } else {
            p[0] = vmulq_f64(vcvt_f64_f32(vget_low_f32(a)), vcvt_f64_f32(vget_low_f32(b)));
            p[1] = vmulq_f64(vcvt_high_f64_f32(a), vcvt_high_f64_f32(b));
        }
        sum += vgetq_lane_f64(p[0], 0);
        sum += vgetq_lane_f64(p[0], 1);
        sum += vgetq_lane_f64(p[1], 0);
        sum += vgetq_lane_f64(p[1], 1);
    }
    for (; e < n; e++) sum += (double)load1(x, e, kind) * load1(y, e, kind);
    *s = (float)sum;
}

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

#define FLOAT_KERNELS(T, KIND)                                                                              \
    static void neon_dot_##T(int n, float *s, const void *x, const void *y) { float_dot(n, s, x, y, KIND); } \
    static void neon_gemm_##T(int n, int nr, int nc, float *s, size_t ss, const void *x, size_t xs,         \
                              const void *y, size_t ys) {                                                    \
        float_gemm(n, nr, nc, s, ss, x, xs, y, ys, KIND);                                                    \
    }

FLOAT_KERNELS(f32, ROW_F32)
FLOAT_KERNELS(f16, ROW_F16)
FLOAT_KERNELS(bf16, ROW_BF16)

void EI_NEON_FN(ei_neon_dot_float)(ei_kernels *k) {
    k->vec_dot[EI_TYPE_F32] = neon_dot_f32;
    k->vec_dot[EI_TYPE_F16] = neon_dot_f16;
    k->vec_dot[EI_TYPE_BF16] = neon_dot_bf16;
    k->gemm[EI_TYPE_F32] = neon_gemm_f32;
    k->gemm[EI_TYPE_F16] = neon_gemm_f16;
    k->gemm[EI_TYPE_BF16] = neon_gemm_bf16;
}
