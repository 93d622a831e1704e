/* Helpers shared by the C check drivers of tests/simd (check_kernels.c, check_edges.c,
 * engine_parity.c): one random number generator, and where the fp16 scale fields of each
 * block type sit, read from the layouts in simd/common/ei_blocks.h (offsetof) rather than
 * typed out again. Define CHECK_RNG_SEED before including to give a driver its own stream. */
#ifndef EI_CHECK_COMMON_H
#define EI_CHECK_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../../simd/common/ei_kernels.h"

#ifndef CHECK_RNG_SEED
#define CHECK_RNG_SEED 0x9e3779b97f4a7c15ull
#endif

static uint64_t check_rng_state = CHECK_RNG_SEED;

/* xorshift64: the same stream on every compiler and target */
static inline uint32_t next_u32(void) {
    check_rng_state ^= check_rng_state << 13;
    check_rng_state ^= check_rng_state >> 7;
    check_rng_state ^= check_rng_state << 17;
    return (uint32_t)(check_rng_state >> 11);
}

/* uniform in [-1, 1) */
static inline float uniform(void) { return (next_u32() & 0xffffff) / 16777216.0f * 2.0f - 1.0f; }

/* roughly normal: the sum of four uniforms */
static inline float gaussian(void) {
    float s = 0;
    for (int i = 0; i < 4; i++) s += uniform();
    return s;
}

/* byte offsets of a block type's fp16 scale fields (d, then m or dmin): offs[j] = -1 where
 * the type has no such field; returns how many it has (0 for the float types) */
static inline int scale_offsets(int type, int offs[2]) {
    offs[0] = offs[1] = -1;
    switch (type) {
    case EI_TYPE_Q4_0: offs[0] = (int)offsetof(block_q4_0, d); break;
    case EI_TYPE_Q5_0: offs[0] = (int)offsetof(block_q5_0, d); break;
    case EI_TYPE_Q8_0: offs[0] = (int)offsetof(block_q8_0, d); break;
    case EI_TYPE_Q4_1:
        offs[0] = (int)offsetof(block_q4_1, d), offs[1] = (int)offsetof(block_q4_1, m);
        break;
    case EI_TYPE_Q5_1:
        offs[0] = (int)offsetof(block_q5_1, d), offs[1] = (int)offsetof(block_q5_1, m);
        break;
    case EI_TYPE_Q2_K:
        offs[0] = (int)offsetof(block_q2_K, d), offs[1] = (int)offsetof(block_q2_K, dmin);
        break;
    case EI_TYPE_Q4_K:
        offs[0] = (int)offsetof(block_q4_K, d), offs[1] = (int)offsetof(block_q4_K, dmin);
        break;
    case EI_TYPE_Q5_K:
        offs[0] = (int)offsetof(block_q5_K, d), offs[1] = (int)offsetof(block_q5_K, dmin);
        break;
    case EI_TYPE_Q3_K: offs[0] = (int)offsetof(block_q3_K, d); break;
    case EI_TYPE_Q6_K: offs[0] = (int)offsetof(block_q6_K, d); break;
    default: return 0;
    }
    return offs[1] >= 0 ? 2 : 1;
}

/* every fp16 scale field of the blocks in w[0, bytes) set to uniform() * amplitude, so that
 * random bytes decode to values of a sensible size */
static inline void set_small_scales(int type, uint8_t *w, size_t bytes, float amplitude) {
    const size_t block = ei_row_size(type, ei_block_size(type));
    int offs[2];
    scale_offsets(type, offs);
    for (size_t b = 0; b + block <= bytes; b += block)
        for (int j = 0; j < 2; j++)
            if (offs[j] >= 0) {
                const ei_f16 h = ei_fp32_to_fp16(uniform() * amplitude);
                memcpy(w + b + offs[j], &h, 2);
            }
}

#endif
