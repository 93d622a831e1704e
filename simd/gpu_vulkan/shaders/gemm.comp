#version 450
// y = W x for up to TOKENS tokens per workgroup: one workgroup per weight row, its invocations
// taking the row's 32-value sub-blocks in turn, each decoded once and used for every token of
// the tile. Products are exact in float for f16 and bf16 rows (whose activations are rounded
// to the same type), split (exact.glsl) for f32 ones, and summed as float pairs in a fixed
// order, rounded once, as the CPU sums exact products in double: a token's result does not
// depend on the other tokens.
// Rows beyond the first EI_VK_MAX_GROUPS go in gl_WorkGroupID.y, token tiles in .z.
#extension GL_GOOGLE_include_directive : require
#if defined(SUBGROUPS)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif

#define THREADS 64u
#define TOKENS 8u
layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Weights { uint W[]; };       // (rows, row_bytes / 4)
layout(std430, binding = 1) readonly buffer Input { float x[]; };        // (n_tokens, x_stride)
layout(std430, binding = 2) writeonly buffer Output { float y[]; };      // (n_tokens, y_stride)

layout(push_constant) uniform Push {
    uint cols;      // values per row, a multiple of 32
    uint rows;      // rows of W (this part of the weight)
    uint row_bytes;
    uint n_tokens;
    uint x_stride;  // floats from one token's input to the next
    uint y_stride;
    uint y_first;   // the output index of W's first row
    uint x_first;   // where token 0's input starts in x
} p;

#include "quants.glsl"

#include "exact.glsl"
shared float part_hi[THREADS * TOKENS], part_lo[THREADS * TOKENS];
#include "reduce.glsl"

void main() {
    const uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (row >= p.rows) return; // the whole workgroup: no barrier is left waiting
    const uint t0 = gl_WorkGroupID.z * TOKENS, nt = min(TOKENS, p.n_tokens - t0);
    const uint tid = gl_LocalInvocationID.x;
    float hi[TOKENS], lo[TOKENS];
    for (uint t = 0u; t < TOKENS; t++) hi[t] = lo[t] = 0.0;
    float w[32];
    for (uint s = tid; s < p.cols / 32u; s += THREADS) {
        dequant32(row * p.row_bytes, s, w);
        for (uint t = 0u; t < nt; t++) {
            const uint o = p.x_first + (t0 + t) * p.x_stride + 32u * s;
            for (uint i = 0u; i < 32u; i++) {
#if defined(TYPE_F32)
                float pp, pe;
                two_prod(w[i], x[o + i], pp, pe);
                ff_add2(hi[t], lo[t], pp, pe);
#else
                precise float pp = w[i] * x[o + i]; // 11 or 8 bits times as many: exact
                ff_add(hi[t], lo[t], pp);
#endif
            }
        }
    }
    reduce_and_store(hi, lo, row, t0, nt);
}
