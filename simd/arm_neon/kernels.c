/* NEON variants (baseline, dotprod, i8mm): start from the scalar reference for now. */
#include "../common/ei_kernels.h"

void ei_kernels_init_neon(ei_kernels *k) { ei_kernels_init_ref(k); k->name = "neon"; }
void ei_kernels_init_neon_dotprod(ei_kernels *k) { ei_kernels_init_ref(k); k->name = "neon-dotprod"; }
void ei_kernels_init_neon_i8mm(ei_kernels *k) { ei_kernels_init_ref(k); k->name = "neon-i8mm"; }
