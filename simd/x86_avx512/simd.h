/* The intrinsics of the avx512 variant: the compiler's own, or SIMDe's emulation of them.
 *
 * With EI_USE_SIMDE defined (tests/simd builds the kernel check so on CPUs without AVX-512)
 * the same kernel source compiles against SIMDe with its native aliases. SIMDe releases lack
 * some AVX-512 intrinsics (Debian 12's 0.7.4 has no 512-bit conversions, gathers or masked
 * loads); each missing one is defined below, exactly, from narrower SIMDe intrinsics or a
 * scalar loop, and only when SIMDe does not define it itself. */
#ifndef EI_AVX512_INTRINSICS_H
#define EI_AVX512_INTRINSICS_H

#include <stdint.h>
#include <string.h>

#include "../common/ei_kernels.h"

#ifndef EI_USE_SIMDE
#include <immintrin.h>
#else
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <math.h>
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#include <simde/x86/fma.h>

/* SIMDe 0.7.4 aliases neither the mask types nor some constants, and aliases
 * _mm512_madd_epi16 with the argument list of its masked form */
#define __mmask8 simde__mmask8
#define __mmask16 simde__mmask16
#define __mmask32 simde__mmask32
#define __mmask64 simde__mmask64
#ifndef _MM_FROUND_NO_EXC
#define _MM_FROUND_NO_EXC SIMDE_MM_FROUND_NO_EXC
#endif
#undef _mm512_madd_epi16
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)

/* lane-wise fallbacks: spill to arrays, compute in scalar C, reload */
#define EI_LANES(T, name, v) T name[sizeof(v) / sizeof(T)]; memcpy(name, &(v), sizeof(v))

#ifndef _mm512_cvtph_ps
static inline __m512 ei_simde_cvtph_ps(__m256i a) {
    EI_LANES(uint16_t, h, a); float r[16];
    for (int i = 0; i < 16; i++) r[i] = ei_fp16_to_fp32(h[i]);
    return _mm512_loadu_ps(r);
}
#define _mm512_cvtph_ps(a) ei_simde_cvtph_ps(a)
#endif

#ifndef _mm512_cvtps_ph /* round to nearest even only, the mode every caller uses */
static inline __m256i ei_simde_cvtps_ph(__m512 a) {
    EI_LANES(float, f, a); uint16_t r[16];
    for (int i = 0; i < 16; i++) r[i] = ei_fp32_to_fp16(f[i]);
    return _mm256_loadu_si256((const __m256i *)r);
}
#define _mm512_cvtps_ph(a, rounding) ei_simde_cvtps_ph(a)
#endif

#ifndef _cvtsh_ss
#define _cvtsh_ss(h) ei_fp16_to_fp32(h)
#endif

#ifndef _mm512_cvtepi32_pd
static inline __m512d ei_simde_cvtepi32_pd(__m256i a) {
    return _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_cvtepi32_pd(_mm256_castsi256_si128(a))),
                              _mm256_cvtepi32_pd(_mm256_extracti128_si256(a, 1)), 1);
}
#define _mm512_cvtepi32_pd(a) ei_simde_cvtepi32_pd(a)
#endif

#ifndef _mm512_cvtps_pd
static inline __m512d ei_simde_cvtps_pd(__m256 a) {
    return _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_cvtps_pd(_mm256_castps256_ps128(a))),
                              _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)), 1);
}
#define _mm512_cvtps_pd(a) ei_simde_cvtps_pd(a)
#endif

#ifndef _mm512_cvtpd_ps
static inline __m256 ei_simde_cvtpd_ps(__m512d a) {
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm256_cvtpd_ps(_mm512_castpd512_pd256(a))),
                                _mm256_cvtpd_ps(_mm512_extractf64x4_pd(a, 1)), 1);
}
#define _mm512_cvtpd_ps(a) ei_simde_cvtpd_ps(a)
#endif

#ifndef _mm512_cvtps_epi32 /* the current rounding mode, as the instruction */
static inline __m512i ei_simde_cvtps_epi32(__m512 a) {
    EI_LANES(float, f, a); int32_t r[16];
    for (int i = 0; i < 16; i++) r[i] = (f[i] >= -2147483648.0f && f[i] < 2147483648.0f) ? (int32_t)nearbyintf(f[i]) : INT32_MIN;
    return _mm512_loadu_si512(r);
}
#define _mm512_cvtps_epi32(a) ei_simde_cvtps_epi32(a)
#endif

#ifndef _mm512_cvtepi8_epi32
static inline __m512i ei_simde_cvtepi8_epi32(__m128i a) {
    EI_LANES(int8_t, b, a); int32_t r[16];
    for (int i = 0; i < 16; i++) r[i] = b[i];
    return _mm512_loadu_si512(r);
}
#define _mm512_cvtepi8_epi32(a) ei_simde_cvtepi8_epi32(a)
#endif

#ifndef _mm512_cvtepu8_epi32
static inline __m512i ei_simde_cvtepu8_epi32(__m128i a) {
    EI_LANES(uint8_t, b, a); int32_t r[16];
    for (int i = 0; i < 16; i++) r[i] = b[i];
    return _mm512_loadu_si512(r);
}
#define _mm512_cvtepu8_epi32(a) ei_simde_cvtepu8_epi32(a)
#endif

#ifndef _mm512_cvtepi16_epi32
static inline __m512i ei_simde_cvtepi16_epi32(__m256i a) {
    EI_LANES(int16_t, w, a); int32_t r[16];
    for (int i = 0; i < 16; i++) r[i] = w[i];
    return _mm512_loadu_si512(r);
}
#define _mm512_cvtepi16_epi32(a) ei_simde_cvtepi16_epi32(a)
#endif

#ifndef _mm512_cvtepi32_epi16
static inline __m256i ei_simde_cvtepi32_epi16(__m512i a) {
    EI_LANES(int32_t, d, a); int16_t r[16];
    for (int i = 0; i < 16; i++) r[i] = (int16_t)d[i];
    return _mm256_loadu_si256((const __m256i *)r);
}
#define _mm512_cvtepi32_epi16(a) ei_simde_cvtepi32_epi16(a)
#endif

#ifndef _mm256_cvtepi32_epi16
static inline __m128i ei_simde_cvtepi32_epi16_256(__m256i a) {
    EI_LANES(int32_t, d, a); int16_t r[8];
    for (int i = 0; i < 8; i++) r[i] = (int16_t)d[i];
    return _mm_loadu_si128((const __m128i *)r);
}
#define _mm256_cvtepi32_epi16(a) ei_simde_cvtepi32_epi16_256(a)
#endif

#ifndef _mm512_cvtepu16_epi32
static inline __m512i ei_simde_cvtepu16_epi32(__m256i a) {
    EI_LANES(uint16_t, w, a); int32_t r[16];
    for (int i = 0; i < 16; i++) r[i] = w[i];
    return _mm512_loadu_si512(r);
}
#define _mm512_cvtepu16_epi32(a) ei_simde_cvtepu16_epi32(a)
#endif

#ifndef _mm512_reduce_add_epi32
static inline int ei_simde_reduce_add_epi32(__m512i a) {
    EI_LANES(int32_t, d, a); uint32_t s = 0;
    for (int i = 0; i < 16; i++) s += (uint32_t)d[i];
    return (int)s;
}
#define _mm512_reduce_add_epi32(a) ei_simde_reduce_add_epi32(a)
#endif

#ifndef _mm512_maskz_loadu_epi8
static inline __m512i ei_simde_maskz_loadu_epi8(__mmask64 k, const void *p) {
    uint8_t r[64];
    for (int i = 0; i < 64; i++) r[i] = (k >> i) & 1 ? ((const uint8_t *)p)[i] : 0;
    return _mm512_loadu_si512(r);
}
#define _mm512_maskz_loadu_epi8(k, p) ei_simde_maskz_loadu_epi8(k, p)
#endif

#ifndef _mm512_maskz_loadu_ps
static inline __m512 ei_simde_maskz_loadu_ps(__mmask16 k, const void *p) {
    float r[16];
    for (int i = 0; i < 16; i++) r[i] = (k >> i) & 1 ? ((const float *)p)[i] : 0.0f;
    return _mm512_loadu_ps(r);
}
#define _mm512_maskz_loadu_ps(k, p) ei_simde_maskz_loadu_ps(k, p)
#endif

#ifndef _mm512_mask_storeu_ps
static inline void ei_simde_mask_storeu_ps(void *p, __mmask16 k, __m512 a) {
    EI_LANES(float, f, a);
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1) ((float *)p)[i] = f[i];
}
#define _mm512_mask_storeu_ps(p, k, a) ei_simde_mask_storeu_ps(p, k, a)
#endif

#ifndef _mm256_mask_storeu_epi16
static inline void ei_simde_mask_storeu_epi16(void *p, __mmask16 k, __m256i a) {
    EI_LANES(uint16_t, w, a);
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1) ((uint16_t *)p)[i] = w[i];
}
#define _mm256_mask_storeu_epi16(p, k, a) ei_simde_mask_storeu_epi16(p, k, a)
#endif

#ifndef _mm512_i32gather_epi32 /* scale is a byte multiplier of the indices */
static inline __m512i ei_simde_i32gather_epi32(__m512i idx, const void *base, int scale) {
    EI_LANES(int32_t, ix, idx); int32_t r[16];
    for (int i = 0; i < 16; i++) memcpy(&r[i], (const uint8_t *)base + (ptrdiff_t)ix[i] * scale, 4);
    return _mm512_loadu_si512(r);
}
#define _mm512_i32gather_epi32(idx, base, scale) ei_simde_i32gather_epi32(idx, base, scale)
#endif

#ifndef _mm512_reduce_max_ps
static inline float ei_simde_reduce_max_ps(__m512 a) {
    EI_LANES(float, f, a); float m = f[0];
    for (int i = 1; i < 16; i++) m = f[i] > m ? f[i] : m;
    return m;
}
#define _mm512_reduce_max_ps(a) ei_simde_reduce_max_ps(a)
#endif

#ifndef _mm512_reduce_add_pd /* the instruction sequence's order: halves, then quarters, then pairs */
static inline double ei_simde_reduce_add_pd(__m512d a) {
    EI_LANES(double, f, a); double h[4], q[2];
    for (int i = 0; i < 4; i++) h[i] = f[i] + f[i + 4];
    for (int i = 0; i < 2; i++) q[i] = h[i] + h[i + 2];
    return q[0] + q[1];
}
#define _mm512_reduce_add_pd(a) ei_simde_reduce_add_pd(a)
#endif

#ifndef _mm512_cmpgt_epu32_mask
static inline __mmask16 ei_simde_cmpgt_epu32_mask(__m512i a, __m512i b) {
    EI_LANES(uint32_t, x, a); EI_LANES(uint32_t, y, b); unsigned k = 0;
    for (int i = 0; i < 16; i++) k |= (unsigned)(x[i] > y[i]) << i;
    return (__mmask16)k;
}
#define _mm512_cmpgt_epu32_mask(a, b) ei_simde_cmpgt_epu32_mask(a, b)
#endif

#ifndef _mm512_cvtepi32_ps
static inline __m512 ei_simde_cvtepi32_ps(__m512i a) {
    EI_LANES(int32_t, d, a); float r[16];
    for (int i = 0; i < 16; i++) r[i] = (float)d[i];
    return _mm512_loadu_ps(r);
}
#define _mm512_cvtepi32_ps(a) ei_simde_cvtepi32_ps(a)
#endif

#ifndef _mm512_cvtepu8_epi16
static inline __m512i ei_simde_cvtepu8_epi16(__m256i a) {
    EI_LANES(uint8_t, b, a); int16_t r[32];
    for (int i = 0; i < 32; i++) r[i] = b[i];
    return _mm512_loadu_si512(r);
}
#define _mm512_cvtepu8_epi16(a) ei_simde_cvtepu8_epi16(a)
#endif

#ifndef _mm512_shuffle_i64x2
static inline __m512i ei_simde_shuffle_i64x2(__m512i a, __m512i b, int imm) {
    EI_LANES(uint64_t, x, a); EI_LANES(uint64_t, y, b); uint64_t r[8];
    for (int l = 0; l < 4; l++) {
        const uint64_t *src = l < 2 ? x : y;
        const int sel = (imm >> (2 * l)) & 3;
        r[2 * l] = src[2 * sel];
        r[2 * l + 1] = src[2 * sel + 1];
    }
    return _mm512_loadu_si512(r);
}
#define _mm512_shuffle_i64x2(a, b, imm) ei_simde_shuffle_i64x2(a, b, imm)
#endif

#ifndef _mm512_shuffle_epi32
#ifndef _MM_PERM_BADC
#define _MM_PERM_BADC 0x4e
#define _MM_PERM_CDAB 0xb1
#endif
static inline __m512i ei_simde_shuffle_epi32(__m512i a, int imm) {
    EI_LANES(uint32_t, x, a); uint32_t r[16];
    for (int i = 0; i < 16; i++) r[i] = x[(i & ~3) | ((imm >> (2 * (i & 3))) & 3)];
    return _mm512_loadu_si512(r);
}
#define _mm512_shuffle_epi32(a, imm) ei_simde_shuffle_epi32(a, imm)
#endif

#endif /* EI_USE_SIMDE */

/* the kernel families of this variant */
void ei_avx512_quant_kernels(struct ei_kernels *k, int vnni);
ei_vec_dot_fn ei_avx512_vec_dot(int type, int vnni);
void ei_avx512_gemm_kernels(struct ei_kernels *k, int vnni);
void ei_avx512_op_kernels(struct ei_kernels *k);
void ei_avx512_attn_kernels(struct ei_kernels *k);

#endif
