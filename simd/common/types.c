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
    case EI_TYPE_Q4_0: case EI_TYPE_Q5_0: return EI_X16 * ei_row_size(type, n);
    default: return 0;
    }
}

int ei_pack_x16(int type, const void *rows, size_t row_stride, int64_t n, void *out) {
    if ((type != EI_TYPE_Q4_0 && type != EI_TYPE_Q5_0) || n % QK4_0) return 0;
    for (int r = 0; r < EI_X16; r++) {
        const uint8_t *row = (const uint8_t *)rows + (size_t)r * row_stride;
        for (int64_t i = 0; i < n / QK4_0; i++) {
            const uint8_t *qs;
            uint8_t *dst_qs;
            if (type == EI_TYPE_Q4_0) {
                const block_q4_0 *src = (const block_q4_0 *)row + i;
                block_q4_0x16 *dst = (block_q4_0x16 *)out + i;
                dst->d[r] = src->d;
                qs = src->qs, dst_qs = dst->qs;
            } else {
                const block_q5_0 *src = (const block_q5_0 *)row + i;
                block_q5_0x16 *dst = (block_q5_0x16 *)out + i;
                dst->d[r] = src->d;
                memcpy(dst->qh[r], src->qh, 4);
                qs = src->qs, dst_qs = dst->qs;
            }
            for (int k = 0; k < 4; k++) memcpy(&dst_qs[64 * k + 4 * r], &qs[4 * k], 4);
        }
    }
    return 1;
}
