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
    const int gv = ei_kivi_v_group(bits, group, hdv);
    const size_t gb = ei_kivi_v_group_bytes(bits, gv);
    for (int g = 0; g < hdv / gv; g++) ei_kivi_quantize_v_group(bits, gv, x + (size_t)g * gv, row + g * gb);
}

static void ref_kivi_decode_v(int bits, int group, int hdv, const uint8_t *rows, size_t row_bytes, int m,
                              float *out) {
    const int gv = ei_kivi_v_group(bits, group, hdv);
    const size_t gb = ei_kivi_v_group_bytes(bits, gv);
    for (int j = 0; j < m; j++)
        for (int g = 0; g < hdv / gv; g++)
            ei_kivi_decode_v_tail(bits, gv, rows + (size_t)j * row_bytes + g * gb, 0,
                                  out + (size_t)j * hdv + (size_t)g * gv);
}

void ei_ref_kivi_kernels(ei_kernels *k) {
    k->kivi_quantize_k = ref_kivi_quantize_k;
    k->kivi_k_dots = ref_kivi_k_dots;
    k->kivi_quantize_v = ref_kivi_quantize_v;
    k->kivi_decode_v = ref_kivi_decode_v;
}
