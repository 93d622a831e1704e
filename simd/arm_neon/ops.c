/* NEON float operations of a decoder step: the reference's float32 operations lane by lane,
 * in the same order and unfused; sums in double in element order; exp in double lanes where
 * the result rounds as libm's would, else through libm. */
#include "../common/silu.h"
#include "simd.h"

static void neon_rms_norm(int n, float *y, const float *x, const float *w, float eps) {
    double sum = 0.0; /* squares rounded to float, added in element order */
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vld1q_f32(x + i), q = vmulq_f32(v, v);
        const float64x2_t lo = vcvt_f64_f32(vget_low_f32(q)), hi = vcvt_high_f64_f32(q);
        sum += vgetq_lane_f64(lo, 0);
        sum += vgetq_lane_f64(lo, 1);
        sum += vgetq_lane_f64(hi, 0);
        sum += vgetq_lane_f64(hi, 1);
    }
    for (; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (i = 0; i + 4 <= n; i += 4) {
        float32x4_t v = vmulq_n_f32(vld1q_f32(x + i), scale);
        if (w) v = vmulq_f32(v, vld1q_f32(w + i));
        vst1q_f32(y + i, v);
    }
    for (; i < n; i++) y[i] = w ? x[i] * scale * w[i] : x[i] * scale;
}

static void neon_rope(int n_rot, float *x, const float *cs, int neox) {
    const int half = n_rot / 2;
    int i = 0;
    for (; i + 4 <= half; i += 4) {
        const float32x4x2_t r = vld2q_f32(cs + 2 * i); /* cos, sin */
        const float32x4_t c = r.val[0], s = r.val[1];
        if (neox) {
            const float32x4_t x0 = vld1q_f32(x + i), x1 = vld1q_f32(x + i + half);
            vst1q_f32(x + i, vsubq_f32(vmulq_f32(x0, c), vmulq_f32(x1, s)));
            vst1q_f32(x + i + half, vaddq_f32(vmulq_f32(x0, s), vmulq_f32(x1, c)));
        } else {
            const float32x4x2_t v = vld2q_f32(x + 2 * i);
            float32x4x2_t o;
            o.val[0] = vsubq_f32(vmulq_f32(v.val[0], c), vmulq_f32(v.val[1], s));
            o.val[1] = vaddq_f32(vmulq_f32(v.val[0], s), vmulq_f32(v.val[1], c));
            vst2q_f32(x + 2 * i, o);
        }
    }
    for (; i < half; i++) {
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

static inline float gelu_of(float g, const ei_f16 *tab) {
    if (g <= -10.0f) return 0.0f;
    if (g >= 10.0f) return g;
    return h2f(tab[f2h(g)]);
}

static void neon_geglu(int n, float *y, const float *g, const float *u, const ei_f16 *tab) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t gv = vld1q_f32(g + i);
        uint16_t h[4];
        vst1_u16(h, vreinterpret_u16_f16(vcvt_f16_f32(gv)));
        const uint16_t t[4] = {tab[h[0]], tab[h[1]], tab[h[2]], tab[h[3]]};
        float32x4_t v = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(t)));
        v = vbslq_f32(vcgeq_f32(gv, vdupq_n_f32(10.0f)), gv, v);
        v = vbslq_f32(vcleq_f32(gv, vdupq_n_f32(-10.0f)), vdupq_n_f32(0.0f), v);
        vst1q_f32(y + i, vmulq_f32(v, vld1q_f32(u + i)));
    }
    for (; i < n; i++) y[i] = gelu_of(g[i], tab) * u[i];
}

/* exp(x) for |x| <= 80, in double, to a relative 1e-14, as x86_avx2/ops.c's avx2_exp_pd:
 * x = n ln2 + r, the Taylor series of exp(r) to r^11 in Estrin's order, times 2^n through the
 * exponent bits */
EI_INLINE float64x2_t exp_f64(float64x2_t x) {
    const float64x2_t magic = vdupq_n_f64(0x1.8p52); /* adding it rounds to an integer, held in the low bits */
    const float64x2_t nd = vaddq_f64(vmulq_f64(x, vdupq_n_f64(0x1.71547652b82fep0)), magic);
    const float64x2_t n = vsubq_f64(nd, magic);
    float64x2_t r = vfmsq_f64(x, n, vdupq_n_f64(0x1.62e42fefa39efp-1));
    r = vfmsq_f64(r, n, vdupq_n_f64(0x1.abc9e3b39803fp-56));
#define C(k, f) const float64x2_t k = vdupq_n_f64(1.0 / (f))
    C(c2, 2); C(c3, 6); C(c4, 24); C(c5, 120); C(c6, 720); C(c7, 5040);
    C(c8, 40320); C(c9, 362880); C(c10, 3628800); C(c11, 39916800);
#undef C
    const float64x2_t r2 = vmulq_f64(r, r), r4 = vmulq_f64(r2, r2), r8 = vmulq_f64(r4, r4);
    const float64x2_t one = vdupq_n_f64(1.0);
    const float64x2_t a0 = vaddq_f64(one, r), a1 = vfmaq_f64(c2, c3, r), a2 = vfmaq_f64(c4, c5, r);
    const float64x2_t a3 = vfmaq_f64(c6, c7, r), a4 = vfmaq_f64(c8, c9, r), a5 = vfmaq_f64(c10, c11, r);
    const float64x2_t b0 = vfmaq_f64(a0, a1, r2), b1 = vfmaq_f64(a2, a3, r2), b2 = vfmaq_f64(a4, a5, r2);
    const float64x2_t p = vfmaq_f64(vfmaq_f64(b0, b1, r4), b2, r8);
    const int64x2_t shift = vshlq_n_s64(vsubq_s64(vreinterpretq_s64_f64(nd), vreinterpretq_s64_f64(magic)), 52);
    return vreinterpretq_f64_s64(vaddq_s64(vreinterpretq_s64_f64(p), shift));
}

/* g / (1 + exp(-g)), with the lanes whose rounding to float is sure to be libm's in *sure: not
 * within EI_SILU_MARGIN of a midpoint of two floats, |g| <= 80 and in the floats' normal range
 * (why these, in x86_avx2/ops.c) */
EI_INLINE float64x2_t silu_f64(float64x2_t g, uint64x2_t *sure) {
    const float64x2_t q = vdivq_f64(g, vaddq_f64(vdupq_n_f64(1.0), exp_f64(vnegq_f64(g))));
    /* a negative difference wraps to near 2^64: one unsigned compare */
    const uint64x2_t below = vsubq_u64(vandq_u64(vreinterpretq_u64_f64(q), vdupq_n_u64(0x1FFFFFFF)),
                                       vdupq_n_u64(0x10000000 - EI_SILU_MARGIN));
    const uint64x2_t near = vcltq_u64(below, vdupq_n_u64(2 * EI_SILU_MARGIN));
    const uint64x2_t ok = vandq_u64(vcaleq_f64(g, vdupq_n_f64(80.0)), vcageq_f64(q, vdupq_n_f64(0x1p-126)));
    *sure = vbicq_u64(ok, near);
    return q;
}

static void neon_swiglu(int n, float *y, const float *g, const float *u) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t gv = vld1q_f32(g + i);
        uint64x2_t s0, s1;
        const float64x2_t q0 = silu_f64(vcvt_f64_f32(vget_low_f32(gv)), &s0), q1 = silu_f64(vcvt_high_f64_f32(gv), &s1);
        const float32x4_t prod = vmulq_f32(vcvt_high_f32_f64(vcvt_f32_f64(q0), q1), vld1q_f32(u + i));
        const uint32x4_t sure = vcombine_u32(vmovn_u64(s0), vmovn_u64(s1));
        if (vminvq_u32(sure)) {
            vst1q_f32(y + i, prod);
            continue;
        }
        float t[4]; /* y may be g: the unsure lanes read g before the store */
        uint32_t lane_sure[4];
        vst1q_f32(t, prod);
        vst1q_u32(lane_sure, sure);
        for (int j = 0; j < 4; j++)
            if (!lane_sure[j]) t[j] = ei_silu(g[i + j]) * u[i + j];
        vst1q_f32(y + i, vld1q_f32(t));
    }
    for (; i < n; i++) y[i] = ei_silu(g[i]) * u[i];
}

static void neon_add(int n, float *y, const float *x) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vld1q_f32(x + i)));
    for (; i < n; i++) y[i] += x[i];
}

static void neon_scale(int n, float *y, float s) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vmulq_n_f32(vld1q_f32(y + i), s));
    for (; i < n; i++) y[i] *= s;
}

/* the reference's butterflies: strides 1 and 2 inside a vector (a partner from a permute,
 * v + (+-u) as u + v or u - v, exactly), wider ones between vectors */
static void neon_hadamard(float *x, int n, int block) {
    neon_scale(n, x, 1.0f / sqrtf((float)block));
    static const float sign1[4] = {1, -1, 1, -1}, sign2[4] = {1, 1, -1, -1};
    const float32x4_t s1 = vld1q_f32(sign1), s2 = vld1q_f32(sign2);
    for (int b = 0; b < n; b += block) {
        float *y = x + b;
        for (int i = 0; i < block; i += 4) {
            float32x4_t v = vld1q_f32(y + i);
            v = vaddq_f32(vrev64q_f32(v), vmulq_f32(v, s1));
            v = vaddq_f32(vextq_f32(v, v, 2), vmulq_f32(v, s2));
            vst1q_f32(y + i, v);
        }
        for (int len = 4; len < block; len <<= 1)
            for (int i = 0; i < block; i += 2 * len)
                for (int j = i; j < i + len; j += 4) {
                    const float32x4_t u = vld1q_f32(y + j), w = vld1q_f32(y + j + len);
                    vst1q_f32(y + j, vaddq_f32(u, w));
                    vst1q_f32(y + j + len, vsubq_f32(u, w));
                }
    }
}

void EI_NEON_FN(ei_neon_ops)(ei_kernels *k) {
    k->rms_norm = neon_rms_norm;
    k->rope = neon_rope;
    k->geglu = neon_geglu;
    k->swiglu = neon_swiglu;
    k->add = neon_add;
    k->scale = neon_scale;
    k->hadamard = neon_hadamard;
}
