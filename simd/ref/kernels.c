/* The scalar reference table: every kernel, in portable C. Every other instruction set's
 * table starts from this one and overrides what it does better. */
#include <string.h>

#include "../common/ei_kernels.h"

void ei_ref_quant_kernels(ei_kernels *k);
void ei_ref_op_kernels(ei_kernels *k);
void ei_ref_attn_kernels(ei_kernels *k);
void ei_ref_kivi_kernels(ei_kernels *k);

void ei_kernels_init_ref(ei_kernels *k) {
    memset(k, 0, sizeof(*k));
    k->name = "scalar";
    ei_ref_quant_kernels(k);
    ei_ref_op_kernels(k);
    ei_ref_attn_kernels(k);
    ei_ref_kivi_kernels(k);
}
