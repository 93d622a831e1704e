/* Scalar reference: activation quantizers, row decoders and dot products for every type.
 *
 * A dot product is the exact value of its terms, rounded once to float:
 *   sum over blocks of  d_w * d_x * isum  (+ the block's minimum terms)
 * with isum the exact integer dot product of the block and the sum kept in double, where
 * every such term is exact (or within 2^-53). Every variant computes the same integers and
 * adds them in double, in any order: the rounded result is the same float on every
 * instruction set and for every batch size. The numpy reference engine computes the same
 * value as a float64 matrix product of the exactly dequantized operands. */
#include <math.h>
#include <string.h>

#include "../common/ei_kernels.h"

#define F16(h) ei_fp16_to_fp32(h)

/* ---- activation quantizers (GGML's CPU versions: scale 127/amax, round half to even) ---- */

static void ref_from_float_q8_0(const float *x, void *vy, int64_t n) {
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = ei_fp32_to_fp16(amax / 127.0f);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)rintf(x[j] * id);
    }
}

/* GGML's q4_0 quantizer (quantize_row_q4_0_ref, which its CPU backend uses too): the signed
 * extreme maps to -8; a value that is not a number stores level 0 rather than reaching an
 * undefined conversion */
static int q4_0_level(float x) {
    const float f = x + 8.5f;
    if (!(f >= 0.0f)) return 0;
    return f >= 15.0f ? 15 : (int)f;
}

static void ref_from_float_q4_0(const float *x, void *vy, int64_t n) {
    block_q4_0 *y = vy;
    for (int64_t i = 0; i < n / QK4_0; i++, x += QK4_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; j++)
            if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = ei_fp32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; j++)
            y[i].qs[j] = (uint8_t)(q4_0_level(x[j] * id) | q4_0_level(x[QK4_0 / 2 + j] * id) << 4);
    }
}

static void ref_from_float_q8_1(const float *x, void *vy, int64_t n) {
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / QK8_1; i++, x += QK8_1) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_1; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) {
            y[i].qs[j] = (int8_t)rintf(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].d = ei_fp32_to_fp16(d);
        y[i].s = ei_fp32_to_fp16(d * (float)sum);
    }
}

static void ref_from_float_q8_K(const float *x, void *vy, int64_t n) {
    block_q8_K *y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float amax = 0.0f, max = 0.0f; /* the first value of largest magnitude, with its sign */
        for (int j = 0; j < QK_K; j++) {
            if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); max = x[j]; }
        }
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) {
            const int v = (int)rintf(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)s;
        }
        y[i].d = 1.0f / iscale;
    }
}

static void ref_from_float_f16(const float *x, void *vy, int64_t n) {
    ei_f16 *y = vy;
    for (int64_t i = 0; i < n; i++) y[i] = ei_fp32_to_fp16(x[i]);
}

static void ref_from_float_bf16(const float *x, void *vy, int64_t n) {
    ei_bf16 *y = vy;
    for (int64_t i = 0; i < n; i++) y[i] = ei_fp32_to_bf16(x[i]);
}

static void ref_from_float_f32(const float *x, void *vy, int64_t n) { memcpy(vy, x, (size_t)n * 4); }

/* ---- unpacking: each weight block as small integers and integer scales ---------------- */

/* legacy blocks: 32 signed values (offset removed for the _0 types) */
static void unpack_q4_0(const block_q4_0 *b, int8_t *q) {
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)((b->qs[j] & 0x0f) - 8);
        q[j + 16] = (int8_t)((b->qs[j] >> 4) - 8);
    }
}

static void unpack_q4_1(const block_q4_1 *b, int8_t *q) {
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(b->qs[j] & 0x0f);
        q[j + 16] = (int8_t)(b->qs[j] >> 4);
    }
}

static uint32_t qh32(const uint8_t *qh) { uint32_t v; memcpy(&v, qh, 4); return v; }

static void unpack_q5_0(const block_q5_0 *b, int8_t *q) {
    const uint32_t qh = qh32(b->qh);
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(((b->qs[j] & 0x0f) | (((qh >> j) & 1) << 4)) - 16);
        q[j + 16] = (int8_t)(((b->qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
    }
}

static void unpack_q5_1(const block_q5_1 *b, int8_t *q) {
    const uint32_t qh = qh32(b->qh);
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)((b->qs[j] & 0x0f) | (((qh >> j) & 1) << 4));
        q[j + 16] = (int8_t)((b->qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
}

/* K blocks: 256 values; sc/mn are per sub-block integer scales and minimums */
static void unpack_q2_K(const block_q2_K *b, int8_t *q, int *sc, int *mn) {
    for (int j = 0; j < 16; j++) { sc[j] = b->scales[j] & 0xf; mn[j] = b->scales[j] >> 4; }
    for (int half = 0; half < 2; half++)
        for (int s = 0; s < 4; s++)
            for (int l = 0; l < 32; l++) q[128 * half + 32 * s + l] = (int8_t)((b->qs[32 * half + l] >> (2 * s)) & 3);
}

static void unpack_q3_K(const block_q3_K *b, int8_t *q, int *sc) {
    /* 16 scales of 6 bits: low 4 bits in scales[0..7] (two per byte), high 2 in scales[8..11] */
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? b->scales[j] & 0xf : b->scales[j - 8] >> 4;
        const int hi = (b->scales[8 + (j % 4)] >> (2 * (j / 4))) & 3;
        sc[j] = (lo | (hi << 4)) - 32;
    }
    for (int half = 0; half < 2; half++)
        for (int s = 0; s < 4; s++)
            for (int l = 0; l < 32; l++) {
                const int idx = 128 * half + 32 * s + l;
                const int low = (b->qs[32 * half + l] >> (2 * s)) & 3;
                const int high = (b->hmask[l] >> (4 * half + s)) & 1;
                q[idx] = (int8_t)(low - (high ? 0 : 4));
            }
}

static void unpack_q4_K(const block_q4_K *b, int8_t *q, int *sc, int *mn) {
    for (int j = 0; j < 8; j++) ei_k4_scale_min(b->scales, j, &sc[j], &mn[j]);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = (int8_t)(b->qs[32 * c + l] & 0xf);
            q[64 * c + 32 + l] = (int8_t)(b->qs[32 * c + l] >> 4);
        }
}

static void unpack_q5_K(const block_q5_K *b, int8_t *q, int *sc, int *mn) {
    for (int j = 0; j < 8; j++) ei_k4_scale_min(b->scales, j, &sc[j], &mn[j]);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = (int8_t)((b->qs[32 * c + l] & 0xf) | (((b->qh[l] >> (2 * c)) & 1) << 4));
            q[64 * c + 32 + l] = (int8_t)((b->qs[32 * c + l] >> 4) | (((b->qh[l] >> (2 * c + 1)) & 1) << 4));
        }
}

static void unpack_q6_K(const block_q6_K *b, int8_t *q, int *sc) {
    for (int j = 0; j < 16; j++) sc[j] = b->scales[j];
    for (int half = 0; half < 2; half++) {
        const uint8_t *ql = b->ql + 64 * half, *qh = b->qh + 32 * half;
        int8_t *o = q + 128 * half;
        for (int l = 0; l < 32; l++) {
            o[l] = (int8_t)(((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32);
            o[l + 32] = (int8_t)(((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32);
            o[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

static int idot(const int8_t *a, const int8_t *b, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ---- dot products ---------------------------------------------------------------------- */

static void ref_dot_q4_0(int n, float *s, const void *vx, const void *vy) {
    const block_q4_0 *x = vx; const block_q8_0 *y = vy;
    int8_t q[32]; double sum = 0.0;
    for (int i = 0; i < n / 32; i++) {
        unpack_q4_0(&x[i], q);
        sum += (double)F16(x[i].d) * F16(y[i].d) * idot(q, y[i].qs, 32);
    }
    *s = (float)sum;
}

static void ref_dot_q4_1(int n, float *s, const void *vx, const void *vy) {
    const block_q4_1 *x = vx; const block_q8_1 *y = vy;
    int8_t q[32]; double sum = 0.0;
    for (int i = 0; i < n / 32; i++) {
        unpack_q4_1(&x[i], q);
        sum += (double)F16(x[i].d) * F16(y[i].d) * idot(q, y[i].qs, 32) + (double)F16(x[i].m) * F16(y[i].s);
    }
    *s = (float)sum;
}

static void ref_dot_q5_0(int n, float *s, const void *vx, const void *vy) {
    const block_q5_0 *x = vx; const block_q8_0 *y = vy;
    int8_t q[32]; double sum = 0.0;
    for (int i = 0; i < n / 32; i++) {
        unpack_q5_0(&x[i], q);
        sum += (double)F16(x[i].d) * F16(y[i].d) * idot(q, y[i].qs, 32);
    }
    *s = (float)sum;
}

static void ref_dot_q5_1(int n, float *s, const void *vx, const void *vy) {
    const block_q5_1 *x = vx; const block_q8_1 *y = vy;
    int8_t q[32]; double sum = 0.0;
    for (int i = 0; i < n / 32; i++) {
        unpack_q5_1(&x[i], q);
        sum += (double)F16(x[i].d) * F16(y[i].d) * idot(q, y[i].qs, 32) + (double)F16(x[i].m) * F16(y[i].s);
    }
    *s = (float)sum;
}

static void ref_dot_q8_0(int n, float *s, const void *vx, const void *vy) {
    const block_q8_0 *x = vx; const block_q8_0 *y = vy;
    double sum = 0.0;
    for (int i = 0; i < n / 32; i++) sum += (double)F16(x[i].d) * F16(y[i].d) * idot(x[i].qs, y[i].qs, 32);
    *s = (float)sum;
}

static void ref_dot_q2_K(int n, float *s, const void *vx, const void *vy) {
    const block_q2_K *x = vx; const block_q8_K *y = vy;
    int8_t q[QK_K]; int sc[16], mn[16]; double sum = 0.0;
    for (int i = 0; i < n / QK_K; i++) {
        unpack_q2_K(&x[i], q, sc, mn);
        int isum = 0, imin = 0;
        for (int j = 0; j < 16; j++) {
            isum += sc[j] * idot(q + 16 * j, y[i].qs + 16 * j, 16);
            imin += mn[j] * y[i].bsums[j];
        }
        sum += (double)y[i].d * F16(x[i].d) * isum - (double)y[i].d * F16(x[i].dmin) * imin;
    }
    *s = (float)sum;
}

static void ref_dot_q3_K(int n, float *s, const void *vx, const void *vy) {
    const block_q3_K *x = vx; const block_q8_K *y = vy;
    int8_t q[QK_K]; int sc[16]; double sum = 0.0;
    for (int i = 0; i < n / QK_K; i++) {
        unpack_q3_K(&x[i], q, sc);
        int isum = 0;
        for (int j = 0; j < 16; j++) isum += sc[j] * idot(q + 16 * j, y[i].qs + 16 * j, 16);
        sum += (double)y[i].d * F16(x[i].d) * isum;
    }
    *s = (float)sum;
}

static void ref_dot_q4_K(int n, float *s, const void *vx, const void *vy) {
    const block_q4_K *x = vx; const block_q8_K *y = vy;
    int8_t q[QK_K]; int sc[8], mn[8]; double sum = 0.0;
    for (int i = 0; i < n / QK_K; i++) {
        unpack_q4_K(&x[i], q, sc, mn);
        int isum = 0, imin = 0;
        for (int j = 0; j < 8; j++) {
            isum += sc[j] * idot(q + 32 * j, y[i].qs + 32 * j, 32);
            imin += mn[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        }
        sum += (double)y[i].d * F16(x[i].d) * isum - (double)y[i].d * F16(x[i].dmin) * imin;
    }
    *s = (float)sum;
}

static void ref_dot_q5_K(int n, float *s, const void *vx, const void *vy) {
    const block_q5_K *x = vx; const block_q8_K *y = vy;
    int8_t q[QK_K]; int sc[8], mn[8]; double sum = 0.0;
    for (int i = 0; i < n / QK_K; i++) {
        unpack_q5_K(&x[i], q, sc, mn);
        int isum = 0, imin = 0;
        for (int j = 0; j < 8; j++) {
            isum += sc[j] * idot(q + 32 * j, y[i].qs + 32 * j, 32);
            imin += mn[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        }
        sum += (double)y[i].d * F16(x[i].d) * isum - (double)y[i].d * F16(x[i].dmin) * imin;
    }
    *s = (float)sum;
}

static void ref_dot_q6_K(int n, float *s, const void *vx, const void *vy) {
    const block_q6_K *x = vx; const block_q8_K *y = vy;
    int8_t q[QK_K]; int sc[16]; double sum = 0.0;
    for (int i = 0; i < n / QK_K; i++) {
        unpack_q6_K(&x[i], q, sc);
        int isum = 0;
        for (int j = 0; j < 16; j++) isum += sc[j] * idot(q + 16 * j, y[i].qs + 16 * j, 16);
        sum += (double)y[i].d * F16(x[i].d) * isum;
    }
    *s = (float)sum;
}

/* float rows: every product is exact in double */
static void ref_dot_f16(int n, float *s, const void *vx, const void *vy) {
    const ei_f16 *x = vx, *y = vy; double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)F16(x[i]) * F16(y[i]);
    *s = (float)sum;
}

static void ref_dot_bf16(int n, float *s, const void *vx, const void *vy) {
    const ei_bf16 *x = vx, *y = vy; double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)ei_bf16_to_fp32(x[i]) * ei_bf16_to_fp32(y[i]);
    *s = (float)sum;
}

static void ref_dot_f32(int n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy; double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)x[i] * y[i];
    *s = (float)sum;
}

/* ---- row decoders ---------------------------------------------------------------------- */

#define DECODE_LEGACY(T, BT, UNPACK, EXPR)                                      \
    static void ref_to_float_##T(const void *vx, float *y, int64_t n) {          \
        const BT *x = vx; int8_t q[32];                                           \
        for (int64_t i = 0; i < n / 32; i++) {                                     \
            UNPACK(&x[i], q);                                                     \
            for (int j = 0; j < 32; j++) y[32 * i + j] = EXPR;                     \
        }                                                                         \
    }
DECODE_LEGACY(q4_0, block_q4_0, unpack_q4_0, F16(x[i].d) * q[j])
DECODE_LEGACY(q4_1, block_q4_1, unpack_q4_1, F16(x[i].d) * q[j] + F16(x[i].m))
DECODE_LEGACY(q5_0, block_q5_0, unpack_q5_0, F16(x[i].d) * q[j])
DECODE_LEGACY(q5_1, block_q5_1, unpack_q5_1, F16(x[i].d) * q[j] + F16(x[i].m))

static void ref_to_float_q8_0(const void *vx, float *y, int64_t n) {
    const block_q8_0 *x = vx;
    for (int64_t i = 0; i < n / 32; i++)
        for (int j = 0; j < 32; j++) y[32 * i + j] = F16(x[i].d) * x[i].qs[j];
}

static void ref_to_float_q2_K(const void *vx, float *y, int64_t n) {
    const block_q2_K *x = vx; int8_t q[QK_K]; int sc[16], mn[16];
    for (int64_t i = 0; i < n / QK_K; i++) {
        unpack_q2_K(&x[i], q, sc, mn);
        const float d = F16(x[i].d), m = F16(x[i].dmin);
        for (int j = 0; j < QK_K; j++) y[QK_K * i + j] = d * sc[j / 16] * q[j] - m * mn[j / 16];
    }
}

static void ref_to_float_q3_K(const void *vx, float *y, int64_t n) {
    const block_q3_K *x = vx; int8_t q[QK_K]; int sc[16];
    for (int64_t i = 0; i < n / QK_K; i++) {
        unpack_q3_K(&x[i], q, sc);
        const float d = F16(x[i].d);
        for (int j = 0; j < QK_K; j++) y[QK_K * i + j] = d * sc[j / 16] * q[j];
    }
}

static void ref_to_float_q4_K(const void *vx, float *y, int64_t n) {
    const block_q4_K *x = vx; int8_t q[QK_K]; int sc[8], mn[8];
    for (int64_t i = 0; i < n / QK_K; i++) {
        unpack_q4_K(&x[i], q, sc, mn);
        const float d = F16(x[i].d), m = F16(x[i].dmin);
        for (int j = 0; j < QK_K; j++) y[QK_K * i + j] = d * sc[j / 32] * q[j] - m * mn[j / 32];
    }
}

static void ref_to_float_q5_K(const void *vx, float *y, int64_t n) {
    const block_q5_K *x = vx; int8_t q[QK_K]; int sc[8], mn[8];
    for (int64_t i = 0; i < n / QK_K; i++) {
        unpack_q5_K(&x[i], q, sc, mn);
        const float d = F16(x[i].d), m = F16(x[i].dmin);
        for (int j = 0; j < QK_K; j++) y[QK_K * i + j] = d * sc[j / 32] * q[j] - m * mn[j / 32];
    }
}

static void ref_to_float_q6_K(const void *vx, float *y, int64_t n) {
    const block_q6_K *x = vx; int8_t q[QK_K]; int sc[16];
    for (int64_t i = 0; i < n / QK_K; i++) {
        unpack_q6_K(&x[i], q, sc);
        const float d = F16(x[i].d);
        for (int j = 0; j < QK_K; j++) y[QK_K * i + j] = d * sc[j / 16] * q[j];
    }
}

static void ref_to_float_f16(const void *vx, float *y, int64_t n) {
    const ei_f16 *x = vx;
    for (int64_t i = 0; i < n; i++) y[i] = F16(x[i]);
}

static void ref_to_float_bf16(const void *vx, float *y, int64_t n) {
    const ei_bf16 *x = vx;
    for (int64_t i = 0; i < n; i++) y[i] = ei_bf16_to_fp32(x[i]);
}

static void ref_to_float_f32(const void *vx, float *y, int64_t n) { memcpy(y, vx, (size_t)n * 4); }

/* the keys of a q8_0 / q4_0 cache against a q8_0 query: vec_dot row by row */
static void ref_attn_dots_q(int k_type, const uint8_t *qq, const uint8_t *k, size_t row_bytes, int hd, int m,
                            float *out) {
    const ei_vec_dot_fn dot = k_type == EI_TYPE_Q4_0 ? ref_dot_q4_0 : ref_dot_q8_0;
    for (int t = 0; t < m; t++) dot(hd, out + t, k + (size_t)t * row_bytes, qq);
}

void ei_ref_quant_kernels(ei_kernels *k) {
    k->from_float[EI_TYPE_Q8_0] = ref_from_float_q8_0;
    k->from_float[EI_TYPE_Q4_0] = ref_from_float_q4_0; /* for the KV cache: no weight's partner */
    k->from_float[EI_TYPE_Q8_1] = ref_from_float_q8_1;
    k->from_float[EI_TYPE_Q8_K] = ref_from_float_q8_K;
    k->from_float[EI_TYPE_F16] = ref_from_float_f16;
    k->from_float[EI_TYPE_BF16] = ref_from_float_bf16;
    k->from_float[EI_TYPE_F32] = ref_from_float_f32;

    k->vec_dot[EI_TYPE_Q4_0] = ref_dot_q4_0;
    k->vec_dot[EI_TYPE_Q4_1] = ref_dot_q4_1;
    k->vec_dot[EI_TYPE_Q5_0] = ref_dot_q5_0;
    k->vec_dot[EI_TYPE_Q5_1] = ref_dot_q5_1;
    k->vec_dot[EI_TYPE_Q8_0] = ref_dot_q8_0;
    k->vec_dot[EI_TYPE_Q2_K] = ref_dot_q2_K;
    k->vec_dot[EI_TYPE_Q3_K] = ref_dot_q3_K;
    k->vec_dot[EI_TYPE_Q4_K] = ref_dot_q4_K;
    k->vec_dot[EI_TYPE_Q5_K] = ref_dot_q5_K;
    k->vec_dot[EI_TYPE_Q6_K] = ref_dot_q6_K;
    k->vec_dot[EI_TYPE_F16] = ref_dot_f16;
    k->vec_dot[EI_TYPE_BF16] = ref_dot_bf16;
    k->vec_dot[EI_TYPE_F32] = ref_dot_f32;
    k->attn_dots_q = ref_attn_dots_q;

    k->to_float[EI_TYPE_Q4_0] = ref_to_float_q4_0;
    k->to_float[EI_TYPE_Q4_1] = ref_to_float_q4_1;
    k->to_float[EI_TYPE_Q5_0] = ref_to_float_q5_0;
    k->to_float[EI_TYPE_Q5_1] = ref_to_float_q5_1;
    k->to_float[EI_TYPE_Q8_0] = ref_to_float_q8_0;
    k->to_float[EI_TYPE_Q2_K] = ref_to_float_q2_K;
    k->to_float[EI_TYPE_Q3_K] = ref_to_float_q3_K;
    k->to_float[EI_TYPE_Q4_K] = ref_to_float_q4_K;
    k->to_float[EI_TYPE_Q5_K] = ref_to_float_q5_K;
    k->to_float[EI_TYPE_Q6_K] = ref_to_float_q6_K;
    k->to_float[EI_TYPE_F16] = ref_to_float_f16;
    k->to_float[EI_TYPE_BF16] = ref_to_float_bf16;
    k->to_float[EI_TYPE_F32] = ref_to_float_f32;
}
