/* avx512 variant: starts from the scalar reference and overrides every kernel it has.
 *
 * The dispatcher (common/cpu_features.c) picks this variant on AVX-512 F/BW/VL/DQ; VNNI
 * (vpdpbusd, vpdpwssd) is checked here, at run time, and the integer kernels take their
 * VNNI form only where the CPU has it. */
#include "../common/ei_kernels.h"
#include "simd.h"

void ei_avx512_kivi_kernels(ei_kernels *k); /* kivi.c */

#if defined(EI_AVX512_NO_VNNI) /* tests build the fallback this way */
static int cpu_has_vnni(void) { return 0; }
#elif defined(_MSC_VER)
#include <intrin.h>
static int cpu_has_vnni(void) { int r[4]; __cpuidex(r, 7, 0); return (r[2] >> 11) & 1; }
#elif defined(EI_USE_SIMDE)
static int cpu_has_vnni(void) { return 1; } /* SIMDe emulates it everywhere */
#else
#include <cpuid.h>
static int cpu_has_vnni(void) {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, 0) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (c >> 11) & 1;
}
#endif

void ei_kernels_init_avx512(ei_kernels *k) {
    ei_kernels_init_ref(k);
    const int vnni = cpu_has_vnni();
    k->name = vnni ? "avx512-vnni" : "avx512";
    ei_avx512_quant_kernels(k, vnni);
    ei_avx512_gemm_kernels(k, vnni);
    ei_avx512_op_kernels(k);
    ei_avx512_attn_kernels(k);
    ei_avx512_kivi_kernels(k);
}
