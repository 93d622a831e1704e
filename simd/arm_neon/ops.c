#include "neon.h"
void EI_NEON_FN(ei_neon_ops)(ei_kernels *k) { (void)k; }
