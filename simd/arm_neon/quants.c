/* NEON activation quantizers: the reference's float operations, lane by lane.
 *
 * fmaxf ignores NaN as vmaxnm does; rintf and vcvtnq both round half to even; the
 * hardware float -> half conversion rounds to nearest even like ei_fp32_to_fp16. */
#include "blocks.h"

/* the 8 vectors of a 32-value block and max |x| over them */
static inline float load_amax32(const float *x, float32x4_t v[8]) {
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int j = 0; j < 8; j++) {
        v[j] = vld1q_f32(x + 4 * j);
        m = vmaxnmq_f32(m, vabsq_f32(v[j]));
    }
    return vmaxnmvq_f32(m);
}

/* round x * s to integers (half to even) and narrow 16 of them to int8 */
static inline int8x16_t round16(const float32x4_t v[4], float s) {
    const int32x4_t a = vcvtnq_s32_f32(vmulq_n_f32(v[0], s)), b = vcvtnq_s32_f32(vmulq_n_f32(v[1], s));
    const int32x4_t c = vcvtnq_s32_f32(vmulq_n_f32(v[2], s)), d = vcvtnq_s32_f32(vmulq_n_f32(v[3], s));
    const int16x8_t ab = vuzp1q_s16(vreinterpretq_s16_s32(a), vreinterpretq_s16_s32(b));
    const int16x8_t cd = vuzp1q_s16(vreinterpretq_s16_s32(c), vreinterpretq_s16_s32(d));
    return vuzp1q_s8(vreinterpretq_s8_s16(ab), vreinterpretq_s8_s16(cd));
}

static void neon_from_float_q8_0(const float *x, void *vy, int64_t n) {
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        float32x4_t v[8];
        const float amax = load_amax32(x, v);
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = f2h(amax / 127.0f);
        vst1q_s8(y[i].qs, round16(v, id));
        vst1q_s8(y[i].qs + 16, round16(v + 4, id));
    }
}

static void neon_from_float_q8_1(const float *x, void *vy, int64_t n) {
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / QK8_1; i++, x += QK8_1) {
        float32x4_t v[8];
        const float amax = load_amax32(x, v);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const int8x16_t q0 = round16(v, id), q1 = round16(v + 4, id);
        vst1q_s8(y[i].qs, q0);
        vst1q_s8(y[i].qs + 16, q1);
        const int sum = vaddlvq_s8(q0) + vaddlvq_s8(q1);
        y[i].d = f2h(d);
        y[i].s = f2h(d * (float)sum);
    }
}

/* the first value of largest magnitude, with its sign (amax > 0 is that magnitude) */
static float first_of_magnitude(const float *x, float amax) {
    const float32x4_t m = vdupq_n_f32(amax);
    int j = 0;
    while (j < QK_K && !vmaxvq_u32(vceqq_f32(vabsq_f32(vld1q_f32(x + j)), m))) j += 4;
    for (;; j++)
        if (fabsf(x[j]) == amax) return x[j];
}

static void neon_from_float_q8_K(const float *x, void *vy, int64_t n) {
    block_q8_K *y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float32x4_t m = vdupq_n_f32(0.0f);
        for (int j = 0; j < QK_K; j += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + j)));
        const float amax = vmaxnmvq_f32(m);
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        const float iscale = -127.0f / first_of_magnitude(x, amax);
        const int32x4_t top = vdupq_n_s32(127);
        for (int j = 0; j < QK_K; j += 16) {
            int32x4_t q[4];
            for (int l = 0; l < 4; l++) q[l] = vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + j + 4 * l), iscale)), top);
            const int16x8_t ab = vuzp1q_s16(vreinterpretq_s16_s32(q[0]), vreinterpretq_s16_s32(q[1]));
            const int16x8_t cd = vuzp1q_s16(vreinterpretq_s16_s32(q[2]), vreinterpretq_s16_s32(q[3]));
            const int8x16_t q8 = vuzp1q_s8(vreinterpretq_s8_s16(ab), vreinterpretq_s8_s16(cd));
            vst1q_s8(y[i].qs + j, q8);
            y[i].bsums[j / 16] = vaddlvq_s8(q8);
        }
        y[i].d = 1.0f / iscale;
    }
}

static void neon_from_float_f16(const float *x, void *vy, int64_t n) {
    ei_f16 *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float16x8_t h = vcvt_high_f16_f32(vcvt_f16_f32(vld1q_f32(x + i)), vld1q_f32(x + i + 4));
        vst1q_u16(y + i, vreinterpretq_u16_f16(h));
    }
    for (; i < n; i++) y[i] = f2h(x[i]);
}

/* ei_fp32_to_bf16 on four lanes: round to nearest even, NaN kept quiet */
static inline uint16x4_t bf16_x4(float32x4_t f) {
    const uint32x4_t u = vreinterpretq_u32_f32(f);
    const uint32x4_t bias = vaddq_u32(vdupq_n_u32(0x7fff), vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1)));
    const uint32x4_t rounded = vshrq_n_u32(vaddq_u32(u, bias), 16);
    const uint32x4_t quiet = vorrq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(64));
    const uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000));
    return vmovn_u32(vbslq_u32(nan, quiet, rounded));
}

static void neon_from_float_bf16(const float *x, void *vy, int64_t n) {
    ei_bf16 *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) vst1q_u16(y + i, vcombine_u16(bf16_x4(vld1q_f32(x + i)), bf16_x4(vld1q_f32(x + i + 4))));
    for (; i < n; i++) y[i] = ei_fp32_to_bf16(x[i]);
}

void EI_NEON_FN(ei_neon_quantize)(ei_kernels *k) {
    k->from_float[EI_TYPE_Q8_0] = neon_from_float_q8_0;
    k->from_float[EI_TYPE_Q8_1] = neon_from_float_q8_1;
    k->from_float[EI_TYPE_Q8_K] = neon_from_float_q8_K;
    k->from_float[EI_TYPE_F16] = neon_from_float_f16;
    k->from_float[EI_TYPE_BF16] = neon_from_float_bf16;
}

/* ---- dot products of one weight row with one activation row ------------------------------- */

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

#define LEGACY_DOT(T, SMALL, HAS_MIN)                                                                      \
    static void neon_dot_##T(int n, float *s, const void *x, const void *y) {                               \
        legacy_dot(n, s, x, y, sizeof(block_##T), unpack_##T, SMALL, HAS_MIN);                              \
    }
LEGACY_DOT(q4_0, 1, 0)
LEGACY_DOT(q4_1, 1, 1)
LEGACY_DOT(q5_0, 1, 0)
LEGACY_DOT(q5_1, 1, 1)
LEGACY_DOT(q8_0, 0, 0)

/* the keys of a q8_0 / q4_0 cache against one q8_0 query (attn_dots_q): four keys at a time,
 * each key's lane adding its block terms in double in block order, as legacy_dot */
static void neon_attn_dots_q(int k_type, const uint8_t *qq, const uint8_t *k, size_t row_bytes, int hd, int m,
                             float *out) {
    const int q4 = k_type == EI_TYPE_Q4_0, nb = hd / 32;
    const size_t xb = q4 ? sizeof(block_q4_0) : sizeof(block_q8_0), yb = ACT_BYTES(0), yq = ACT_QS(0);
    const unpack32_fn unpack = q4 ? unpack_q4_0 : unpack_q8_0;
    for (int t = 0; t < m; t += 4) {
        const int cnt = m - t < 4 ? m - t : 4;
        const uint8_t *row[4]; /* a tail repeats the first key */
        for (int j = 0; j < 4; j++) row[j] = k + (size_t)(t + (j < cnt ? j : 0)) * row_bytes;
        float64x2_t acc[2] = {vdupq_n_f64(0.0), vdupq_n_f64(0.0)};
        for (int b = 0; b < nb; b++) {
            const size_t o = (size_t)b * xb;
            const uint8_t *y = qq + (size_t)b * yb;
            int32x4_t p[4];
            EI_UNROLL for (int j = 0; j < 4; j++) {
                int8x16_t w[2];
                unpack(row[j] + o, w);
                p[j] = block_dot(w, y + yq, q4);
            }
            const float32x4_t d = vmulq_f32(h2f_x4(row[0] + o, row[1] + o, row[2] + o, row[3] + o), vdupq_n_f32(h2f_at(y)));
            float64x2_t terms[2];
            block_terms(terms, d, hsum4(p[0], p[1], p[2], p[3]), 0, d);
            acc[0] = vaddq_f64(acc[0], terms[0]);
            acc[1] = vaddq_f64(acc[1], terms[1]);
        }
        const float o[4] = {(float)vgetq_lane_f64(acc[0], 0), (float)vgetq_lane_f64(acc[0], 1),
                            (float)vgetq_lane_f64(acc[1], 0), (float)vgetq_lane_f64(acc[1], 1)};
        for (int j = 0; j < cnt; j++) out[t + j] = o[j];
    }
}

#define KQUANT_DOT(T, SUB, DMIN_OFF)                                                                       \
    static const ktype type_##T = {sizeof(block_##T), offsetof(block_##T, d), DMIN_OFF, SUB};               \
    static void neon_dot_##T(int n, float *s, const void *x, const void *y) {                               \
        kq_dot(n, s, x, y, type_##T, unpack_##T, scales_##T);                                               \
    }
KQUANT_DOT(q2_K, 16, offsetof(block_q2_K, dmin))
KQUANT_DOT(q3_K, 16, -1)
KQUANT_DOT(q4_K, 32, offsetof(block_q4_K, dmin))
KQUANT_DOT(q5_K, 32, offsetof(block_q5_K, dmin))
KQUANT_DOT(q6_K, 16, -1)

#define FLOAT_DOT(T, KIND) \
    static void neon_dot_##T(int n, float *s, const void *x, const void *y) { float_dot(n, s, x, y, KIND); }
FLOAT_DOT(f32, ROW_F32)
FLOAT_DOT(f16, ROW_F16)
FLOAT_DOT(bf16, ROW_BF16)

void EI_NEON_FN(ei_neon_vec_dots)(ei_kernels *k) {
    k->vec_dot[EI_TYPE_Q4_0] = neon_dot_q4_0;
    k->vec_dot[EI_TYPE_Q4_1] = neon_dot_q4_1;
    k->vec_dot[EI_TYPE_Q5_0] = neon_dot_q5_0;
    k->vec_dot[EI_TYPE_Q5_1] = neon_dot_q5_1;
    k->vec_dot[EI_TYPE_Q8_0] = neon_dot_q8_0;
    k->attn_dots_q = neon_attn_dots_q;
    k->vec_dot[EI_TYPE_Q2_K] = neon_dot_q2_K;
    k->vec_dot[EI_TYPE_Q3_K] = neon_dot_q3_K;
    k->vec_dot[EI_TYPE_Q4_K] = neon_dot_q4_K;
    k->vec_dot[EI_TYPE_Q5_K] = neon_dot_q5_K;
    k->vec_dot[EI_TYPE_Q6_K] = neon_dot_q6_K;
    k->vec_dot[EI_TYPE_F32] = neon_dot_f32;
    k->vec_dot[EI_TYPE_F16] = neon_dot_f16;
    k->vec_dot[EI_TYPE_BF16] = neon_dot_bf16;
}
