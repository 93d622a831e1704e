/* Which instruction-set variant to run: each scores zero unless both the CPU and the OS
 * support it (CPUID + XGETBV on x86, HWCAP on Linux/Android, sysctl on macOS), and the
 * highest score wins. The reason for each verdict is kept for `edgeinfer doctor`. */
#include <stdio.h>
#include <string.h>

#include "ei_internal.h"

#if defined(__x86_64__) || defined(_M_X64)
#define EI_X86 1
#if defined(_MSC_VER)
#include <intrin.h>
static void cpuid(int leaf, int sub, unsigned r[4]) { int v[4]; __cpuidex(v, leaf, sub); memcpy(r, v, 16); }
static unsigned long long xgetbv0(void) { return _xgetbv(0); }
#else
#include <cpuid.h>
static void cpuid(int leaf, int sub, unsigned r[4]) { __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]); }
static unsigned long long xgetbv0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif
#endif

#if defined(__aarch64__) || defined(_M_ARM64)
#define EI_ARM64 1
#if defined(__linux__) || defined(__ANDROID__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif
#elif defined(__APPLE__)
#include <sys/sysctl.h>
static int sysctl_flag(const char *name) {
    int v = 0; size_t n = sizeof(v);
    return sysctlbyname(name, &v, &n, NULL, 0) == 0 && v;
}
#elif defined(_WIN32)
#include <windows.h>
#endif
#endif

typedef struct {
    int built, supported;
    char reason[160];
} isa_state;

static isa_state g_isa[EI_ISA_COUNT];
static char g_features[256];
static int g_probed;

static void note(int isa, int built, int supported, const char *reason) {
    g_isa[isa].built = built;
    g_isa[isa].supported = built && supported;
    snprintf(g_isa[isa].reason, sizeof(g_isa[isa].reason), "%s", reason);
}

static void add_feature(const char *name) {
    size_t len = strlen(g_features);
    snprintf(g_features + len, sizeof(g_features) - len, "%s%s", len ? " " : "", name);
}

static void probe(void) {
    for (int i = 0; i < EI_ISA_COUNT; i++) note(i, 0, 0, "not built for this architecture");
    note(EI_ISA_SCALAR, 1, 1, "portable C, always available");
#if EI_X86
    unsigned r1[4], r7[4] = {0}, r0[4];
    cpuid(0, 0, r0);
    cpuid(1, 0, r1);
    if (r0[0] >= 7) cpuid(7, 0, r7);
    const int osxsave = (r1[2] >> 27) & 1;
    const unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
    const int os_avx = (xcr0 & 0x6) == 0x6, os_avx512 = (xcr0 & 0xe6) == 0xe6;
    const int avx = (r1[2] >> 28) & 1, fma = (r1[2] >> 12) & 1, f16c = (r1[2] >> 29) & 1;
    const int avx2 = (r7[1] >> 5) & 1;
    const int avx512f = (r7[1] >> 16) & 1, avx512dq = (r7[1] >> 17) & 1;
    const int avx512bw = (r7[1] >> 30) & 1, avx512vl = (r7[1] >> 31) & 1;
    const int vnni = (r7[2] >> 11) & 1;
    if (avx) add_feature("avx");
    if (avx2) add_feature("avx2");
    if (fma) add_feature("fma");
    if (f16c) add_feature("f16c");
    if (avx512f) add_feature("avx512f");
    if (avx512bw) add_feature("avx512bw");
    if (avx512vl) add_feature("avx512vl");
    if (avx512dq) add_feature("avx512dq");
    if (vnni) add_feature("avx512vnni");
    if (osxsave) add_feature(os_avx512 ? "os:avx512-state" : os_avx ? "os:avx-state" : "os:sse-state");
#ifdef EI_HAVE_AVX2
    if (!(avx2 && fma && f16c)) note(EI_ISA_AVX2, 1, 0, "CPU lacks AVX2, FMA or F16C");
    else if (!os_avx) note(EI_ISA_AVX2, 1, 0, "OS does not save AVX registers (XCR0)");
    else note(EI_ISA_AVX2, 1, 1, "CPU has AVX2+FMA+F16C, OS saves YMM state");
#endif
#ifdef EI_HAVE_AVX512
    if (!(avx512f && avx512bw && avx512vl && avx512dq && fma && f16c))
        note(EI_ISA_AVX512, 1, 0, "CPU lacks AVX-512 F/BW/VL/DQ");
    else if (!os_avx512) note(EI_ISA_AVX512, 1, 0, "OS does not save AVX-512 registers (XCR0)");
    else note(EI_ISA_AVX512, 1, 1, vnni ? "CPU has AVX-512 F/BW/VL/DQ + VNNI, OS saves ZMM state"
                                        : "CPU has AVX-512 F/BW/VL/DQ, OS saves ZMM state");
#endif
#endif
#if EI_ARM64
    int dotprod = 0, i8mm = 0;
#if defined(__linux__) || defined(__ANDROID__)
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    dotprod = (hw & HWCAP_ASIMDDP) != 0;
    i8mm = (hw2 & HWCAP2_I8MM) != 0;
#elif defined(__APPLE__)
    dotprod = sysctl_flag("hw.optional.arm.FEAT_DotProd");
    i8mm = sysctl_flag("hw.optional.arm.FEAT_I8MM");
#elif defined(_WIN32)
    dotprod = IsProcessorFeaturePresent(43 /* PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE */);
#endif
    add_feature("asimd");
    if (dotprod) add_feature("dotprod");
    if (i8mm) add_feature("i8mm");
#ifdef EI_HAVE_NEON
    note(EI_ISA_NEON, 1, 1, "AArch64 baseline Advanced SIMD");
#endif
#ifdef EI_HAVE_NEON_DOTPROD
    note(EI_ISA_NEON_DOTPROD, 1, dotprod, dotprod ? "CPU has the dot-product extension" : "CPU lacks the dot-product extension");
#else
    note(EI_ISA_NEON_DOTPROD, 0, 0, "not built: the compiler lacks +dotprod");
#endif
#ifdef EI_HAVE_NEON_I8MM
    note(EI_ISA_NEON_I8MM, 1, dotprod && i8mm, dotprod && i8mm ? "CPU has dot-product and int8 matrix multiply" : "CPU lacks int8 matrix multiply (i8mm)");
#else
    note(EI_ISA_NEON_I8MM, 0, 0, "not built: the compiler lacks +i8mm");
#endif
#endif
    g_probed = 1;
}

static void ensure_probed(void) {
    if (!g_probed) probe(); /* idempotent: a race only repeats the same writes */
}

const char *ei_isa_name(int isa) {
    static const char *names[EI_ISA_COUNT] = {"scalar", "avx2", "avx512", "neon", "neon-dotprod", "neon-i8mm"};
    return isa >= 0 && isa < EI_ISA_COUNT ? names[isa] : "unknown";
}

int ei_isa_supported(int isa) {
    ensure_probed();
    return isa >= 0 && isa < EI_ISA_COUNT && g_isa[isa].supported;
}

const char *ei_isa_reason(int isa) {
    ensure_probed();
    return isa >= 0 && isa < EI_ISA_COUNT ? g_isa[isa].reason : "unknown instruction set";
}

int ei_isa_best(void) {
    /* the score of a variant is its position in this list, zero when unsupported */
    static const int order[] = {EI_ISA_AVX512, EI_ISA_AVX2, EI_ISA_NEON_I8MM, EI_ISA_NEON_DOTPROD, EI_ISA_NEON};
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++)
        if (ei_isa_supported(order[i])) return order[i];
    return EI_ISA_SCALAR;
}

const char *ei_cpu_features(void) {
    ensure_probed();
    return g_features;
}

/* kernel tables, filled once per instruction set */
static ei_kernels g_tables[EI_ISA_COUNT];
static int g_table_ready[EI_ISA_COUNT];

const ei_kernels *ei_kernels_for(int isa) {
    if (!ei_isa_supported(isa)) return NULL;
    if (!g_table_ready[isa]) {
        ei_kernels k;
        switch (isa) {
#ifdef EI_HAVE_AVX2
        case EI_ISA_AVX2: ei_kernels_init_avx2(&k); break;
#endif
#ifdef EI_HAVE_AVX512
        case EI_ISA_AVX512: ei_kernels_init_avx512(&k); break;
#endif
#ifdef EI_HAVE_NEON
        case EI_ISA_NEON: ei_kernels_init_neon(&k); break;
#endif
#ifdef EI_HAVE_NEON_DOTPROD
        case EI_ISA_NEON_DOTPROD: ei_kernels_init_neon_dotprod(&k); break;
#endif
#ifdef EI_HAVE_NEON_I8MM
        case EI_ISA_NEON_I8MM: ei_kernels_init_neon_i8mm(&k); break;
#endif
        default: ei_kernels_init_ref(&k); break;
        }
        g_tables[isa] = k;
        g_table_ready[isa] = 1;
    }
    return &g_tables[isa];
}
