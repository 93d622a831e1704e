#version 450
// y = W x with the activations quantized as the CPU engine quantizes them (quantize.comp: q8_0
// for Q4_0 / Q5_0 / Q8_0, q8_1 for Q4_1 / Q5_1, q8_K for the K types): the same integer dot
// products of each block, scaled as simd/ref/quants.c's vec_dot scales them and summed as
// float pairs (exact.glsl), so that a product rounds to the CPU's float but where the exact
// sum lies within about 2^-47 of a rounding boundary. The tiles, the row order and the
// reduction are gemm.comp's.
#extension GL_GOOGLE_include_directive : require
#if defined(SUBGROUPS)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif

#if defined(INT_DOT) // OpSDot on 4 x int8 packed in a word (SPV_KHR_integer_dot_product), which
// Debian's glslc knows no GLSL name for: declared through GL_EXT_spirv_intrinsics
#extension GL_EXT_spirv_intrinsics : require
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot_4x8(uint a, uint b, spirv_literal int packed_vector_format); // format 0: 4x8 bits packed
#endif

#define THREADS 64u
#define TOKENS 8u
layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Weights { uint W[]; };   // (rows, row_bytes / 4)
layout(std430, binding = 1) readonly buffer Ints { uint Q[]; };      // (n_tokens, cols / 4) int8 x 4
layout(std430, binding = 2) readonly buffer Scales { float S[]; };   // (n_tokens, s_stride)
layout(std430, binding = 3) writeonly buffer Output { float y[]; };  // (n_tokens, y_stride)

layout(push_constant) uniform Push {
    uint cols;      // values per row, a multiple of the block size
    uint rows;      // rows of W (this part of the weight)
    uint row_bytes;
    uint n_tokens;
    uint s_stride;
    uint y_stride;
    uint y_first;   // the output index of W's first row
} p;

#include "quants.glsl"

#include "exact.glsl"
shared float part_hi[THREADS * TOKENS], part_lo[THREADS * TOKENS];
#include "reduce.glsl"

void main() {
    const uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (row >= p.rows) return;
    const uint t0 = gl_WorkGroupID.z * TOKENS, nt = min(TOKENS, p.n_tokens - t0);
    const uint tid = gl_LocalInvocationID.x;
    float hi[TOKENS], lo[TOKENS];
    for (uint t = 0u; t < TOKENS; t++) hi[t] = lo[t] = 0.0;
    int q[32];
    scales32 k;
    for (uint s = tid; s < p.cols / 32u; s += THREADS) {
        unpack32(row * p.row_bytes, s, q, k);
#if defined(INT_DOT)
        uint pw[8]; // the weights' integers, four to a word as the activations are
        for (uint w = 0u; w < 8u; w++)
            pw[w] = (uint(q[4u * w]) & 0xFFu) | ((uint(q[4u * w + 1u]) & 0xFFu) << 8) | ((uint(q[4u * w + 2u]) & 0xFFu) << 16) |
                    ((uint(q[4u * w + 3u]) & 0xFFu) << 24);
#endif
        for (uint t = 0u; t < nt; t++) {
            const uint qo = (t0 + t) * (p.cols / 4u) + 8u * s, so = (t0 + t) * p.s_stride;
            ivec2 isum = ivec2(0);
            for (uint w = 0u; w < 8u; w++) {
#if defined(INT_DOT)
                isum[w >> 2] += sdot_4x8(pw[w], Q[qo + w], 0);
#else
                const int v = int(Q[qo + w]);
                for (uint i = 0u; i < 4u; i++) isum[w >> 2] += q[4u * w + i] * bitfieldExtract(v, int(8u * i), 8);
#endif
            }
#if defined(KQUANT)
            const float xd = S[so + s / 8u];
            const int imin = k.mn.x * int(S[so + p.cols / 32u + 2u * s]) + k.mn.y * int(S[so + p.cols / 32u + 2u * s + 1u]);
            ff_add_scaled(hi[t], lo[t], xd, k.d, k.sc.x * isum.x + k.sc.y * isum.y);
            ff_add_scaled(hi[t], lo[t], xd, -k.m, imin);
#elif defined(MIN)
            ff_add_scaled(hi[t], lo[t], k.d, S[so + s], isum.x + isum.y);
            float mp, me;
            two_prod(k.m, S[so + p.cols / 32u + s], mp, me);
            ff_add2(hi[t], lo[t], mp, me);
#else
            ff_add_scaled(hi[t], lo[t], k.d, S[so + s], isum.x + isum.y);
#endif
        }
    }
    reduce_and_store(hi, lo, row, t0, nt);
}
