/* Shared by the NEON kernels: level checks, per-level symbol names and small inline helpers.
 *
 * The sources of this folder are compiled three times (setup.py): EI_NEON_LEVEL 0 is the
 * AArch64 baseline, 1 adds the dot-product instructions (sdot), 2 adds the int8 matrix
 * multiply (smmla). Each compilation defines one init function; every other external
 * symbol goes through EI_NEON_FN so the three object sets link into one library.
 *
 * Exactness: every block's integer dot product is computed exactly; its scale product is
 * formed with the reference's float/double operations, and each output adds its block
 * terms in double in block order, as the reference does. So every variant returns the
 * reference's float bit for bit, whatever the tile shape. */
#ifndef EI_NEON_H
#define EI_NEON_H

#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "../common/ei_kernels.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* gcc: -ffp-contract=off from setup.py (and -std=c11) */
#endif

#if !defined(EI_NEON_LEVEL)
#error "compile simd/arm_neon with -DEI_NEON_LEVEL=0, 1 or 2 (see setup.py)"
#endif
#if EI_NEON_LEVEL >= 1 && !defined(__ARM_FEATURE_DOTPROD)
#error "EI_NEON_LEVEL >= 1 needs the dot-product extension: -march=armv8.2-a+dotprod"
#endif
#if EI_NEON_LEVEL >= 2 && !defined(__ARM_FEATURE_MATMUL_INT8)
#error "EI_NEON_LEVEL 2 needs the int8 matrix multiply: -march=armv8.2-a+dotprod+i8mm"
#endif

#if EI_NEON_LEVEL == 0
#define EI_NEON_FN(name) name##_neon
#elif EI_NEON_LEVEL == 1
#define EI_NEON_FN(name) name##_neon_dotprod
#else
#define EI_NEON_FN(name) name##_neon_i8mm
#endif

/* what each file adds to the table */
void EI_NEON_FN(ei_neon_quantize)(ei_kernels *k);
void EI_NEON_FN(ei_neon_vec_dots)(ei_kernels *k);
void EI_NEON_FN(ei_neon_gemms)(ei_kernels *k);
void EI_NEON_FN(ei_neon_ops)(ei_kernels *k);
void EI_NEON_FN(ei_neon_attn)(ei_kernels *k);

#define EI_INLINE static inline __attribute__((always_inline))
#define EI_UNROLL _Pragma("GCC unroll 16")
#define EI_NO_UNROLL _Pragma("GCC unroll 1") /* bodies too large to repeat */

/* ---- fp16 (exact conversions; the hardware rounds float -> half to nearest even) ------- */

EI_INLINE float h2f(ei_f16 h) {
    __fp16 v;
    memcpy(&v, &h, 2);
    return (float)v;
}

EI_INLINE ei_f16 f2h(float f) {
    const __fp16 v = (__fp16)f;
    ei_f16 h;
    memcpy(&h, &v, 2);
    return h;
}

EI_INLINE float h2f_at(const uint8_t *p) {
    ei_f16 h;
    memcpy(&h, p, 2);
    return h2f(h);
}

/* the fp16 values at p0..p3 (any alignment), as floats */
EI_INLINE float32x4_t h2f_x4(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3) {
    uint16x4_t h = vdup_n_u16(0);
    h = vld1_lane_u16((const uint16_t *)(const void *)p0, h, 0);
    h = vld1_lane_u16((const uint16_t *)(const void *)p1, h, 1);
    h = vld1_lane_u16((const uint16_t *)(const void *)p2, h, 2);
    h = vld1_lane_u16((const uint16_t *)(const void *)p3, h, 3);
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

/* ---- integer dot products ------------------------------------------------------------- */

/* Activations come from the quantizers, so they lie in [-127, 127]; weights are any int8.
 * Which lane holds which partial sum differs by level: only lane totals are used. */

/* acc += a . b over 16 pairs */
EI_INLINE int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if EI_NEON_LEVEL >= 1
    return vdotq_s32(acc, a, b);
#else
    int16x8_t p = vmull_s8(vget_low_s8(a), vget_low_s8(b)); /* two products per lane: < 2^15 */
    p = vmlal_high_s8(p, a, b);
    return vpadalq_s16(acc, p);
#endif
}

/* acc += a . b over 32 pairs, for weights with |a| <= 64 (four products per int16 lane) */
EI_INLINE int32x4_t dot32s(int32x4_t acc, int8x16_t a0, int8x16_t a1, int8x16_t b0, int8x16_t b1) {
#if EI_NEON_LEVEL >= 1
    return vdotq_s32(vdotq_s32(acc, a0, b0), a1, b1);
#else
    int16x8_t p = vmull_s8(vget_low_s8(a0), vget_low_s8(b0));
    p = vmlal_high_s8(p, a0, b0);
    p = vmlal_s8(p, vget_low_s8(a1), vget_low_s8(b1));
    p = vmlal_high_s8(p, a1, b1);
    return vpadalq_s16(acc, p);
#endif
}

/* lane totals of a, b, c, d */
EI_INLINE int32x4_t hsum4(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d) {
    return vpaddq_s32(vpaddq_s32(a, b), vpaddq_s32(c, d));
}

#if EI_NEON_LEVEL >= 2
/* the 64-bit halves of two rows side by side, as smmla wants its 2x8 operands */
EI_INLINE int8x16_t zip_lo(int8x16_t a, int8x16_t b) {
    return vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)));
}
EI_INLINE int8x16_t zip_hi(int8x16_t a, int8x16_t b) {
    return vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)));
}
/* acc += [a0.b0, a0.b1, a1.b0, a1.b1] over 16 values of rows a0, a1 and columns b0, b1 */
EI_INLINE int32x4_t mmla16(int32x4_t acc, int8x16_t a0, int8x16_t a1, int8x16_t b0, int8x16_t b1) {
    acc = vmmlaq_s32(acc, zip_lo(a0, a1), zip_lo(b0, b1));
    return vmmlaq_s32(acc, zip_hi(a0, a1), zip_hi(b0, b1));
}
#endif

/* ---- double accumulation --------------------------------------------------------------- */

EI_INLINE float64x2_t f64_lo(int32x4_t v) { return vcvtq_f64_s64(vmovl_s32(vget_low_s32(v))); }
EI_INLINE float64x2_t f64_hi(int32x4_t v) { return vcvtq_f64_s64(vmovl_high_s32(v)); }

/* acc[0..1] += d * isum lane by lane: d exact float products, isum exact integers */
EI_INLINE void acc_terms(float64x2_t acc[2], float32x4_t d, int32x4_t isum) {
    acc[0] = vaddq_f64(acc[0], vmulq_f64(vcvt_f64_f32(vget_low_f32(d)), f64_lo(isum)));
    acc[1] = vaddq_f64(acc[1], vmulq_f64(vcvt_high_f64_f32(d), f64_hi(isum)));
}

/* the four lanes of acc[0..1] as floats to s[0], s[step], ... (only the first n) */
EI_INLINE void store_lanes(float *s, size_t step, int n, const float64x2_t acc[2]) {
    double t[4];
    vst1q_f64(t, acc[0]);
    vst1q_f64(t + 2, acc[1]);
    for (int i = 0; i < n; i++) s[i * step] = (float)t[i];
}

/* ---- tiles ----------------------------------------------------------------------------- */

/* four row pointers for an nr-row tile; missing rows repeat the last (computed, not stored) */
EI_INLINE void tile_rows(const uint8_t *p[4], const void *base, size_t stride, int n) {
    for (int i = 0; i < 4; i++) p[i] = (const uint8_t *)base + (size_t)(i < n ? i : n - 1) * stride;
}

/* tile results in pair layout (the smmla order): acc[rp][cp][h] holds rows 2rp + h and
 * columns 2cp, 2cp + 1 */
EI_INLINE void store_pairs(float *s, size_t ss, int nr, int nc, float64x2_t acc[2][2][2]) {
    for (int rp = 0; rp < 2; rp++)
        for (int cp = 0; cp < 2; cp++)
            for (int h = 0; h < 2; h++) {
                double t[2];
                vst1q_f64(t, acc[rp][cp][h]);
                const int r = 2 * rp + h;
                for (int j = 0; j < 2; j++)
                    if (r < nr && 2 * cp + j < nc) s[(size_t)(2 * cp + j) * ss + r] = (float)t[j];
            }
}

#endif
