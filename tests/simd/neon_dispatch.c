/* Which variant the dispatcher picks on this (emulated) CPU, linked from the library's own
 * objects: prints "best <name>", one line per variant with its verdict, and checks that the
 * picked variant's kernel table is that variant and computes a Q4_0 dot as the reference. */
#include <stdio.h>
#include <string.h>

#include "../../simd/common/ei_internal.h"

int main(void) {
    const int best = ei_isa_best();
    printf("best %s\n", ei_isa_name(best));
    printf("features %s\n", ei_cpu_features());
    for (int i = 0; i < EI_ISA_COUNT; i++)
        printf("isa %s supported %d: %s\n", ei_isa_name(i), ei_isa_supported(i), ei_isa_reason(i));

    const ei_kernels *k = ei_kernels_for(best), *ref = ei_kernels_for(EI_ISA_SCALAR);
    if (!k || !ref || strcmp(k->name, ei_isa_name(best)) != 0) {
        printf("FAIL table of %s is %s\n", ei_isa_name(best), k ? k->name : "missing");
        return 1;
    }
    enum { N = 256 };
    float x[N], a, b;
    block_q8_0 act[N / 32];
    block_q4_0 wq[N / 32];
    for (int i = 0; i < N; i++) x[i] = (float)((i * 37) % 23) - 11.0f;
    ref->from_float[EI_TYPE_Q8_0](x, act, N);
    for (int i = 0; i < N / 32; i++) {
        wq[i].d = ei_fp32_to_fp16(0.01f * (float)(i + 1));
        for (int j = 0; j < 16; j++) wq[i].qs[j] = (uint8_t)(i * 16 + j * 7);
    }
    ref->vec_dot[EI_TYPE_Q4_0](N, &a, wq, act);
    k->vec_dot[EI_TYPE_Q4_0](N, &b, wq, act);
    if (memcmp(&a, &b, 4) != 0) {
        printf("FAIL q4_0 dot: %s %.9g, scalar %.9g\n", k->name, b, a);
        return 1;
    }
    printf("ok\n");
    return 0;
}
