/* The AVX2+FMA+F16C variant: the scalar reference table with every kernel overridden by
 * this folder's versions (converters, dot products, tiles, float operations, attention,
 * KIVI cache kernels). */
#include "simd.h"

void ei_avx2_kivi_kernels(ei_kernels *k); /* kivi.c */

void ei_kernels_init_avx2(ei_kernels *k) {
    ei_kernels_init_ref(k);
    k->name = "avx2";
    ei_avx2_convert_kernels(k);
    ei_avx2_dot_kernels(k);
    ei_avx2_gemm_kernels(k);
    ei_avx2_op_kernels(k);
    ei_avx2_attn_kernels(k);
    ei_avx2_kivi_kernels(k);
}
