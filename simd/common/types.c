/* The weight and activation types the kernels know: block sizes and dot-product partners. */
#include <string.h>

#include "ei_kernels.h"

typedef struct { int block, bytes, partner; } type_info;

static type_info info_of(int type) {
    switch (type) {
    case EI_TYPE_F32: return (type_info){1, 4, EI_TYPE_F32};
    case EI_TYPE_F16: return (type_info){1, 2, EI_TYPE_F16};
    case EI_TYPE_BF16: return (type_info){1, 2, EI_TYPE_BF16};
    case EI_TYPE_Q4_0: return (type_info){QK4_0, sizeof(block_q4_0), EI_TYPE_Q8_0};
    case EI_TYPE_Q4_1: return (type_info){QK4_1, sizeof(block_q4_1), EI_TYPE_Q8_1};
    case EI_TYPE_Q5_0: return (type_info){QK5_0, sizeof(block_q5_0), EI_TYPE_Q8_0};
    case EI_TYPE_Q5_1: return (type_info){QK5_1, sizeof(block_q5_1), EI_TYPE_Q8_1};
    case EI_TYPE_Q8_0: return (type_info){QK8_0, sizeof(block_q8_0), EI_TYPE_Q8_0};
    case EI_TYPE_Q8_1: return (type_info){QK8_1, sizeof(block_q8_1), -1};
    case EI_TYPE_Q2_K: return (type_info){QK_K, sizeof(block_q2_K), EI_TYPE_Q8_K};
    case EI_TYPE_Q3_K: return (type_info){QK_K, sizeof(block_q3_K), EI_TYPE_Q8_K};
    case EI_TYPE_Q4_K: return (type_info){QK_K, sizeof(block_q4_K), EI_TYPE_Q8_K};
    case EI_TYPE_Q5_K: return (type_info){QK_K, sizeof(block_q5_K), EI_TYPE_Q8_K};
    case EI_TYPE_Q6_K: return (type_info){QK_K, sizeof(block_q6_K), EI_TYPE_Q8_K};
    case EI_TYPE_Q8_K: return (type_info){QK_K, sizeof(block_q8_K), -1};
    default: return (type_info){0, 0, -1};
    }
}

int ei_partner_type(int t) { return info_of(t).partner; }
int ei_block_size(int t) { return info_of(t).block; }

size_t ei_row_size(int t, int64_t n) {
    const type_info ti = info_of(t);
    if (!ti.block || n < 0 || n % ti.block) return 0;
    return (size_t)(n / ti.block) * (size_t)ti.bytes;
}

size_t ei_x16_size(int type, int64_t n) {
    switch (type) {
    case EI_TYPE_Q4_0: case EI_TYPE_Q4_1: case EI_TYPE_Q5_0: case EI_TYPE_Q8_0: case EI_TYPE_F16: case EI_TYPE_BF16:
        return EI_X16 * ei_row_size(type, n);
    case EI_TYPE_Q4_K: return n % QK_K ? 0 : (size_t)(n / QK_K) * sizeof(block_q4_Kx16);
    case EI_TYPE_Q5_K: return n % QK_K ? 0 : (size_t)(n / QK_K) * sizeof(block_q5_Kx16);
    case EI_TYPE_Q6_K: return n % QK_K ? 0 : (size_t)(n / QK_K) * sizeof(block_q6_Kx16);
    default: return 0;
    }
}

/* the 256 values of a Q4_K super-block (0..15), or of a Q5_K one (0..31: qh not NULL), and
 * its 8 scales and mins */
static void k4_values(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh, uint8_t *u, uint8_t *sc,
                      uint8_t *mn) {
    for (int j = 0; j < 8; j++) {
        int s, m;
        ei_k4_scale_min(scales, j, &s, &m);
        sc[j] = (uint8_t)s, mn[j] = (uint8_t)m;
    }
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            u[64 * c + l] = qs[32 * c + l] & 0xf;
            u[64 * c + 32 + l] = qs[32 * c + l] >> 4;
            if (qh) {
                u[64 * c + l] |= (uint8_t)(((qh[l] >> (2 * c)) & 1) << 4);
                u[64 * c + 32 + l] |= (uint8_t)(((qh[l] >> (2 * c + 1)) & 1) << 4);
            }
        }
}

/* the 256 values of a Q6_K super-block, unsigned (value + 32, 0..63) */
static void q6_K_values(const block_q6_K *b, uint8_t *u) {
    for (int half = 0; half < 2; half++) {
        const uint8_t *ql = b->ql + 64 * half, *qh = b->qh + 32 * half;
        uint8_t *o = u + 128 * half;
        for (int l = 0; l < 32; l++) {
            o[l] = (uint8_t)((ql[l] & 0xf) | ((qh[l] & 3) << 4));
            o[l + 32] = (uint8_t)((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4));
            o[l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            o[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
    }
}

/* unit (32 values u[0..32)) of row r as nibble pairs (ei_blocks.h: block_q4_Kx16) */
static void pack_unit(const uint8_t *u, int r, uint8_t *qs) {
    for (int k = 0; k < 4; k++)
        for (int b = 0; b < 4; b++)
            qs[64 * k + 4 * r + b] = (uint8_t)((u[4 * k + b] & 0xf) | (u[16 + 4 * k + b] & 0xf) << 4);
}

/* the high two bits of the unit's values of row r (block_q6_Kx16's qh) */
static void pack_unit_high(const uint8_t *u, int r, uint8_t *qh) {
    for (int m = 0; m < 2; m++)
        for (int b = 0; b < 4; b++) {
            const int v[4] = {u[8 * m + b], u[16 + 8 * m + b], u[8 * m + 4 + b], u[16 + 8 * m + 4 + b]};
            qh[64 * m + 4 * r + b] = (uint8_t)((v[0] >> 4) | (v[1] >> 4) << 2 | (v[2] >> 4) << 4 | (v[3] >> 4) << 6);
        }
}

/* the fifth bits of the unit's values of row r (block_q5_Kx16's qh) */
static void pack_unit_fifth(const uint8_t *u, int r, uint8_t *qh) {
    for (int b = 0; b < 4; b++) {
        uint8_t bits = 0;
        for (int k = 0; k < 8; k++) bits |= (uint8_t)(((u[k < 4 ? 4 * k + b : 16 + 4 * (k - 4) + b] >> 4) & 1) << k);
        qh[4 * r + b] = bits;
    }
}

/* super-block i of row r: Q4_K, or Q5_K with its fifth bits (q5) */
static void pack_k4_block(int q5, const uint8_t *row, int r, int64_t i, uint8_t *out) {
    const block_q4_K *s4 = (const block_q4_K *)row + i;
    const block_q5_K *s5 = (const block_q5_K *)row + i;
    block_q5_Kx16 *d5 = (block_q5_Kx16 *)out + i;
    block_q4_Kx16 *dst = q5 ? &d5->q4 : (block_q4_Kx16 *)out + i;
    uint8_t u[QK_K], sc[8], mn[8];
    k4_values(q5 ? s5->scales : s4->scales, q5 ? s5->qs : s4->qs, q5 ? s5->qh : NULL, u, sc, mn);
    dst->d[r] = q5 ? s5->d : s4->d, dst->dmin[r] = q5 ? s5->dmin : s4->dmin;
    for (int j = 0; j < 8; j++) {
        dst->sc[j][r] = sc[j], dst->mn[j][r] = mn[j];
        pack_unit(u + 32 * j, r, dst->qs[j]);
        if (q5) pack_unit_fifth(u + 32 * j, r, d5->qh[j]);
    }
}

static void pack_q6_K_block(const uint8_t *row, int r, int64_t i, uint8_t *out) {
    const block_q6_K *src = (const block_q6_K *)row + i;
    block_q6_Kx16 *dst = (block_q6_Kx16 *)out + i;
    uint8_t u[QK_K];
    q6_K_values(src, u);
    dst->d[r] = src->d;
    for (int j = 0; j < 16; j++) dst->sc[j][r] = src->scales[j];
    for (int j = 0; j < 8; j++) {
        pack_unit(u + 32 * j, r, dst->ql[j]);
        pack_unit_high(u + 32 * j, r, dst->qh[j]);
    }
}

static void pack_k_row(int type, const uint8_t *row, int r, int64_t n, uint8_t *out) {
    for (int64_t i = 0; i < n / QK_K; i++) {
        if (type == EI_TYPE_Q6_K) pack_q6_K_block(row, r, i, out);
        else pack_k4_block(type == EI_TYPE_Q5_K, row, r, i, out);
    }
}

/* block i of row r of a legacy type and its lane of the interleaved block (ei_blocks.h:
 * block_q4_0x16, ...), copied one way or the other (to_x16): the fields of the row's lane, and
 * its 4-byte groups of qs at 64 k + 4 r; Q5_0's high bits as block_q5_0x16 keeps them */
static void move_legacy_block(int type, uint8_t *row, int r, int64_t i, uint8_t *x16, int to_x16) {
#define MOVE(a, b) (to_x16 ? memcpy(&(b), &(a), sizeof(a)) : memcpy(&(a), &(b), sizeof(a)))
    uint8_t *qs, *x16_qs;
    int groups = QK4_0 / 8; /* 4-byte groups of qs: 4 of nibble pairs, 8 of Q8_0's bytes */
    if (type == EI_TYPE_Q4_0) {
        block_q4_0 *b = (block_q4_0 *)row + i;
        block_q4_0x16 *x = (block_q4_0x16 *)x16 + i;
        MOVE(b->d, x->d[r]);
        qs = b->qs, x16_qs = x->qs;
    } else if (type == EI_TYPE_Q4_1) {
        block_q4_1 *b = (block_q4_1 *)row + i;
        block_q4_1x16 *x = (block_q4_1x16 *)x16 + i;
        MOVE(b->d, x->d[r]);
        MOVE(b->m, x->m[r]);
        qs = b->qs, x16_qs = x->qs;
    } else if (type == EI_TYPE_Q8_0) {
        block_q8_0 *b = (block_q8_0 *)row + i;
        block_q8_0x16 *x = (block_q8_0x16 *)x16 + i;
        MOVE(b->d, x->d[r]);
        qs = (uint8_t *)b->qs, x16_qs = (uint8_t *)x->qs, groups = QK8_0 / 4;
    } else {
        block_q5_0 *b = (block_q5_0 *)row + i;
        block_q5_0x16 *x = (block_q5_0x16 *)x16 + i;
        MOVE(b->d, x->d[r]);
        uint32_t h = 0; /* bit l: value l's high bit; bit k of x->qh[r][c]: value l(k, c) */
        if (to_x16) memcpy(&h, b->qh, 4);
        for (int c = 0; c < 4; c++) {
            uint8_t bits = 0;
            for (int k = 0; k < 8; k++) {
                const int l = k < 4 ? 4 * k + c : 16 + 4 * (k - 4) + c;
                if (to_x16) bits |= (uint8_t)(((h >> l) & 1) << k);
                else h |= (uint32_t)((x->qh[r][c] >> k) & 1) << l;
            }
            if (to_x16) x->qh[r][c] = bits;
        }
        if (!to_x16) memcpy(b->qh, &h, 4);
        qs = b->qs, x16_qs = x->qs;
    }
    for (int k = 0; k < groups; k++) {
        uint8_t *a = &qs[4 * k], *b = &x16_qs[64 * k + 4 * r];
        memcpy(to_x16 ? b : a, to_x16 ? a : b, 4);
    }
#undef MOVE
}

static int legacy_x16(int type) {
    return type == EI_TYPE_Q4_0 || type == EI_TYPE_Q4_1 || type == EI_TYPE_Q5_0 || type == EI_TYPE_Q8_0;
}

int ei_x16_unpacks(int type) { return legacy_x16(type) || type == EI_TYPE_F16 || type == EI_TYPE_BF16; }

int ei_unpack_x16_row(int type, const void *packed, int r, int64_t n, void *row) {
    if (!ei_x16_unpacks(type) || !ei_x16_size(type, n) || r < 0 || r >= EI_X16) return 0;
    if (type == EI_TYPE_F16 || type == EI_TYPE_BF16) { /* block_f16x16: lane r of each element */
        const block_f16x16 *x = packed;
        for (int64_t d = 0; d < n; d++) memcpy((uint8_t *)row + 2 * (size_t)d, &x[d].v[r], 2);
        return 1;
    }
    for (int64_t i = 0; i < n / QK4_0; i++) move_legacy_block(type, row, r, i, (uint8_t *)packed, 0);
    return 1;
}

/* block_f16x16: value d of row r to element d's lane r */
static void pack_half_rows(const uint8_t *rows, size_t row_stride, int64_t n, block_f16x16 *out) {
    for (int r = 0; r < EI_X16; r++)
        for (int64_t d = 0; d < n; d++) memcpy(&out[d].v[r], rows + (size_t)r * row_stride + 2 * (size_t)d, 2);
}

int ei_pack_x16(int type, const void *rows, size_t row_stride, int64_t n, void *out) {
    if (!ei_x16_size(type, n)) return 0;
    if (type == EI_TYPE_F16 || type == EI_TYPE_BF16) {
        pack_half_rows(rows, row_stride, n, out);
        return 1;
    }
    for (int r = 0; r < EI_X16; r++) {
        const uint8_t *row = (const uint8_t *)rows + (size_t)r * row_stride;
        if (type == EI_TYPE_Q4_K || type == EI_TYPE_Q5_K || type == EI_TYPE_Q6_K) pack_k_row(type, row, r, n, out);
        else
            for (int64_t i = 0; i < n / QK4_0; i++) move_legacy_block(type, (uint8_t *)row, r, i, out, 1);
    }
    return 1;
}
