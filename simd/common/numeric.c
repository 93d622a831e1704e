/* Portable scalar numerics shared by every variant: half and bfloat16 conversions, and the
 * block by which a quantized cache rotates its rows. */
#include <math.h>
#include <string.h>

#include "ei_kernels.h"

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

ei_f16 ei_fp32_to_fp16(float f) {
    const uint32_t u = f2u(f);
    const uint32_t sign = (u >> 16) & 0x8000;
    const uint32_t absu = u & 0x7fffffffu;
    if (absu >= 0x7f800000u) /* inf or nan (keep nan quiet and nonzero) */
        return (ei_f16)(sign | 0x7c00 | (absu > 0x7f800000u ? 0x200 | ((absu >> 13) & 0x3ff) : 0));
    if (absu >= 0x477ff000u) return (ei_f16)(sign | 0x7c00); /* rounds to >= 65520: inf */
    if (absu < 0x38800000u) {
        /* subnormal half (or zero): round absu * 2^24 to an integer, ties to even */
        const float v = u2f(absu) * 16777216.0f; /* exact: scales by a power of two */
        const float r = rintf(v);
        return (ei_f16)(sign | (uint32_t)r);
    }
    /* normal: drop 13 mantissa bits with round to nearest even */
    uint32_t m = absu - (112u << 23);
    m += 0xfff + ((m >> 13) & 1);
    return (ei_f16)(sign | (m >> 13));
}

float ei_bf16_to_fp32(ei_bf16 h) { return u2f((uint32_t)h << 16); }

ei_bf16 ei_fp32_to_bf16(float f) {
    const uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ei_bf16)((u >> 16) | 64); /* quiet nan */
    return (ei_bf16)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

int ei_hadamard_block(int type, int hd, int is_key) {
    if ((type != EI_TYPE_Q8_0 && type != EI_TYPE_Q4_0) || hd <= 0 || hd % 64) return 0;
    if (!is_key) return 64;
    int block = 64;
    while (hd % (2 * block) == 0) block *= 2;
    return block;
}
