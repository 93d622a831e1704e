/* avx2 variant: starts from the scalar reference; kernels are overridden as they land. */
#include "../common/ei_kernels.h"

void ei_kernels_init_avx2(ei_kernels *k) {
    ei_kernels_init_ref(k);
    k->name = "avx2";
}
