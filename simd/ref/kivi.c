/* Scalar reference of the KIVI cache kernels: loops over the per-channel and per-group
 * pieces of common/kivi.h, which state the formats and every rounding. */

#include "../common/kivi.h"

static void ref_kivi_quantize_k(int bits, int group, int hd, const ei_f16 *rows, size_t row_bytes,
                                uint8_t *block) {
    for (int d = 0; d < hd; d++) ei_kivi_quantize_k_channel(bits, group, hd, rows, row_bytes, d, block);
}

static void ref_kivi_k_dots(int bits, int group, int hd, const uint8_t *block, int t0, int n, const float *q,
                            float *dots) {
    float u[EI_MAX_HEAD_DIM]; /* (hd) the query times each channel's scale */
    ei_kivi_k_query_tail(hd, block, q, 0, u);
    const float zsum = ei_kivi_k_zsum(hd, block, q);
    for (int i = 0; i < n; i++) dots[i] = ei_kivi_k_dot_token(bits, group, hd, block, u, zsum, t0 + i);
}

static void ref_kivi_quantize_v(int bits, int group, int hdv, const ei_f16 *x, uint8_t *row) {
    ei_kivi_quantize_v_row(bits, group, hdv, x, row, 1, ei_kivi_quantize_v_group);
}

static void ref_kivi_decode_v(int bits, int group, int hdv, const uint8_t *rows, size_t row_bytes, int m,
                              float *out) {
    ei_kivi_decode_v_rows(bits, group, hdv, rows, row_bytes, m, out, ei_kivi_decode_v_group);
}

void ei_ref_kivi_kernels(ei_kernels *k) {
    k->kivi_quantize_k = ref_kivi_quantize_k;
    k->kivi_k_dots = ref_kivi_k_dots;
    k->kivi_quantize_v = ref_kivi_quantize_v;
    k->kivi_decode_v = ref_kivi_decode_v;
}
