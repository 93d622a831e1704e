/* The NEON kernel tables. This folder is compiled once per EI_NEON_LEVEL (setup.py), and
 * each compilation defines exactly one init function: the level's variant, starting from
 * the scalar reference and overriding what NEON does better. */
#include "simd.h"

void EI_NEON_FN(ei_neon_kivi)(ei_kernels *k); /* kivi.c */

static void init_neon(ei_kernels *k, const char *name) {
    ei_kernels_init_ref(k);
    k->name = name;
    EI_NEON_FN(ei_neon_quantize)(k);
    EI_NEON_FN(ei_neon_vec_dots)(k);
    EI_NEON_FN(ei_neon_gemms)(k);
    EI_NEON_FN(ei_neon_ops)(k);
    EI_NEON_FN(ei_neon_attn)(k);
    EI_NEON_FN(ei_neon_kivi)(k);
}

#if EI_NEON_LEVEL == 0
void ei_kernels_init_neon(ei_kernels *k) { init_neon(k, "neon"); }
#elif EI_NEON_LEVEL == 1
void ei_kernels_init_neon_dotprod(ei_kernels *k) { init_neon(k, "neon-dotprod"); }
#else
void ei_kernels_init_neon_i8mm(ei_kernels *k) { init_neon(k, "neon-i8mm"); }
#endif
