/* NEON float operations of a decoder step: the reference's float32 operations lane by lane,
 * in the same order and unfused; sums in double in element order; exp through libm. */
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

/* exp has no vector form that rounds as libm does: four calls, the rest in lanes */
static void neon_swiglu(int n, float *y, const float *g, const float *u) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t gv = vld1q_f32(g + i);
        const float64x2_t g0 = vcvt_f64_f32(vget_low_f32(gv)), g1 = vcvt_high_f64_f32(gv);
        const double e[4] = {exp(-(double)g[i]), exp(-(double)g[i + 1]), exp(-(double)g[i + 2]), exp(-(double)g[i + 3])};
        const float64x2_t one = vdupq_n_f64(1.0);
        const float64x2_t q0 = vdivq_f64(g0, vaddq_f64(one, vld1q_f64(e))), q1 = vdivq_f64(g1, vaddq_f64(one, vld1q_f64(e + 2)));
        vst1q_f32(y + i, vmulq_f32(vcvt_high_f32_f64(vcvt_f32_f64(q0), q1), vld1q_f32(u + i)));
    }
    for (; i < n; i++) y[i] = (float)(g[i] / (1.0 + exp(-(double)g[i]))) * u[i];
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
