/* The scalar reference of the products of interleaved rows (gemm_x16): each reads the
 * engine's layout (ei_blocks.h: block_q4_0x16, ...) value by value and computes every row's
 * dot exactly as vec_dot does on the row as stored, so an instruction set's kernel is checked
 * against both. These are not in the reference table: a variant without its own kernel keeps
 * the rows as stored (a scalar product of interleaved rows would only cost a copy). */
#include "../common/ei_kernels.h"

#define F16(h) ei_fp16_to_fp32(h)

/* value 4 k + b (low nibble) or 16 + 4 k + b (high) of row r in a unit of nibble pairs */
static int nibble(const uint8_t *qs, int r, int l) {
    const uint8_t byte = qs[64 * (l % 16 / 4) + 4 * r + l % 4];
    return l < 16 ? byte & 0xf : byte >> 4;
}

/* value l (0..31) of a unit's row r: block_q6_Kx16's high bits (two per value) */
static int high_pair(const uint8_t *qh, int r, int l) {
    const int m = l % 16 / 8, shift = 2 * (l / 16) + 4 * (l % 8 / 4);
    return (qh[64 * m + 4 * r + l % 4] >> shift) & 3;
}

/* the fifth bit of value l (0..31) of row r: 4 bytes a row, as block_q5_0x16 and
 * block_q5_Kx16 keep them */
static int fifth_bit(const uint8_t *qh, int r, int l) {
    return (qh[4 * r + l % 4] >> (l % 16 / 4 + 4 * (l / 16))) & 1;
}

static void ref_x16_legacy(int q5, int n, int nc, float *s, size_t ss, const void *vx, const void *vy, size_t ys) {
    for (int c = 0; c < nc; c++) {
        const block_q8_0 *y = (const block_q8_0 *)((const uint8_t *)vy + (size_t)c * ys);
        for (int r = 0; r < EI_X16; r++) {
            double sum = 0.0;
            for (int i = 0; i < n / QK4_0; i++) {
                const block_q4_0x16 *b4 = (const block_q4_0x16 *)vx + i;
                const block_q5_0x16 *b5 = (const block_q5_0x16 *)vx + i;
                int isum = 0;
                for (int l = 0; l < 32; l++) {
                    int q = nibble(q5 ? b5->qs : b4->qs, r, l) - (q5 ? 16 : 8);
                    if (q5) q += fifth_bit((const uint8_t *)b5->qh, r, l) << 4;
                    isum += q * y[i].qs[l];
                }
                sum += (double)F16(q5 ? b5->d[r] : b4->d[r]) * F16(y[i].d) * isum;
            }
            s[(size_t)c * ss + r] = (float)sum;
        }
    }
}

static void ref_x16_q4_0(int n, int nc, float *s, size_t ss, const void *x, const void *y, size_t ys) {
    ref_x16_legacy(0, n, nc, s, ss, x, y, ys);
}

static void ref_x16_q5_0(int n, int nc, float *s, size_t ss, const void *x, const void *y, size_t ys) {
    ref_x16_legacy(1, n, nc, s, ss, x, y, ys);
}

static void ref_x16_q4_1(int n, int nc, float *s, size_t ss, const void *vx, const void *vy, size_t ys) {
    for (int c = 0; c < nc; c++) {
        const block_q8_1 *y = (const block_q8_1 *)((const uint8_t *)vy + (size_t)c * ys);
        for (int r = 0; r < EI_X16; r++) {
            double sum = 0.0;
            for (int i = 0; i < n / QK4_1; i++) {
                const block_q4_1x16 *b = (const block_q4_1x16 *)vx + i;
                int isum = 0;
                for (int l = 0; l < 32; l++) isum += nibble(b->qs, r, l) * y[i].qs[l];
                sum += (double)F16(b->d[r]) * F16(y[i].d) * isum + (double)F16(b->m[r]) * F16(y[i].s);
            }
            s[(size_t)c * ss + r] = (float)sum;
        }
    }
}

static void ref_x16_q8_0(int n, int nc, float *s, size_t ss, const void *vx, const void *vy, size_t ys) {
    for (int c = 0; c < nc; c++) {
        const block_q8_0 *y = (const block_q8_0 *)((const uint8_t *)vy + (size_t)c * ys);
        for (int r = 0; r < EI_X16; r++) {
            double sum = 0.0;
            for (int i = 0; i < n / QK8_0; i++) {
                const block_q8_0x16 *b = (const block_q8_0x16 *)vx + i;
                int isum = 0; /* value l of row r: byte 64 (l / 4) + 4 r + l % 4 */
                for (int l = 0; l < 32; l++) isum += b->qs[64 * (l / 4) + 4 * r + l % 4] * y[i].qs[l];
                sum += (double)F16(b->d[r]) * F16(y[i].d) * isum;
            }
            s[(size_t)c * ss + r] = (float)sum;
        }
    }
}

/* Q4_K, or Q5_K (q5): its low four bits are a block_q4_Kx16 */
static void ref_x16_k4(int q5, int n, int nc, float *s, size_t ss, const void *vx, const void *vy, size_t ys) {
    for (int c = 0; c < nc; c++) {
        const block_q8_K *y = (const block_q8_K *)((const uint8_t *)vy + (size_t)c * ys);
        for (int r = 0; r < EI_X16; r++) {
            double sum = 0.0;
            for (int i = 0; i < n / QK_K; i++) {
                const block_q5_Kx16 *b5 = (const block_q5_Kx16 *)vx + i;
                const block_q4_Kx16 *b = q5 ? &b5->q4 : (const block_q4_Kx16 *)vx + i;
                int isum = 0, imin = 0;
                for (int j = 0; j < 8; j++) {
                    int dot = 0;
                    for (int l = 0; l < 32; l++) {
                        const int q = nibble(b->qs[j], r, l) | (q5 ? fifth_bit(b5->qh[j], r, l) << 4 : 0);
                        dot += q * y[i].qs[32 * j + l];
                    }
                    isum += b->sc[j][r] * dot;
                    imin += b->mn[j][r] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
                }
                sum += (double)y[i].d * F16(b->d[r]) * isum - (double)y[i].d * F16(b->dmin[r]) * imin;
            }
            s[(size_t)c * ss + r] = (float)sum;
        }
    }
}

static void ref_x16_q4_K(int n, int nc, float *s, size_t ss, const void *x, const void *y, size_t ys) {
    ref_x16_k4(0, n, nc, s, ss, x, y, ys);
}

static void ref_x16_q5_K(int n, int nc, float *s, size_t ss, const void *x, const void *y, size_t ys) {
    ref_x16_k4(1, n, nc, s, ss, x, y, ys);
}

static void ref_x16_q6_K(int n, int nc, float *s, size_t ss, const void *vx, const void *vy, size_t ys) {
    for (int c = 0; c < nc; c++) {
        const block_q8_K *y = (const block_q8_K *)((const uint8_t *)vy + (size_t)c * ys);
        for (int r = 0; r < EI_X16; r++) {
            double sum = 0.0;
            for (int i = 0; i < n / QK_K; i++) {
                const block_q6_Kx16 *b = (const block_q6_Kx16 *)vx + i;
                int isum = 0;
                for (int j = 0; j < 16; j++) { /* sub-block j: half of unit j / 2 */
                    int dot = 0;
                    for (int l = 16 * (j % 2); l < 16 * (j % 2) + 16; l++) {
                        const int q = (nibble(b->ql[j / 2], r, l) | high_pair(b->qh[j / 2], r, l) << 4) - 32;
                        dot += q * y[i].qs[32 * (j / 2) + l];
                    }
                    isum += b->sc[j][r] * dot;
                }
                sum += (double)y[i].d * F16(b->d[r]) * isum;
            }
            s[(size_t)c * ss + r] = (float)sum;
        }
    }
}

/* F16 or BF16 (bf16) rows: every product of two values exact in double, added in index
 * order as vec_dot adds them */
static void ref_x16_half(int bf16, int n, int nc, float *s, size_t ss, const void *vx, const void *vy, size_t ys) {
    const block_f16x16 *x = vx;
    for (int c = 0; c < nc; c++) {
        const uint16_t *y = (const uint16_t *)((const uint8_t *)vy + (size_t)c * ys);
        for (int r = 0; r < EI_X16; r++) {
            double sum = 0.0;
            for (int d = 0; d < n; d++)
                sum += bf16 ? (double)ei_bf16_to_fp32(x[d].v[r]) * ei_bf16_to_fp32(y[d]) : (double)F16(x[d].v[r]) * F16(y[d]);
            s[(size_t)c * ss + r] = (float)sum;
        }
    }
}

static void ref_x16_f16(int n, int nc, float *s, size_t ss, const void *x, const void *y, size_t ys) {
    ref_x16_half(0, n, nc, s, ss, x, y, ys);
}

static void ref_x16_bf16(int n, int nc, float *s, size_t ss, const void *x, const void *y, size_t ys) {
    ref_x16_half(1, n, nc, s, ss, x, y, ys);
}

ei_gemm_x16_fn ei_ref_gemm_x16(int type) {
    switch (type) {
    case EI_TYPE_Q4_0: return ref_x16_q4_0;
    case EI_TYPE_Q4_1: return ref_x16_q4_1;
    case EI_TYPE_Q5_0: return ref_x16_q5_0;
    case EI_TYPE_Q8_0: return ref_x16_q8_0;
    case EI_TYPE_Q4_K: return ref_x16_q4_K;
    case EI_TYPE_Q5_K: return ref_x16_q5_K;
    case EI_TYPE_Q6_K: return ref_x16_q6_K;
    case EI_TYPE_F16: return ref_x16_f16;
    case EI_TYPE_BF16: return ref_x16_bf16;
    default: return NULL;
    }
}
