#version 450
// RMSNorm of rows of n values: y = x / sqrt(mean(x^2) + eps) (* w), one workgroup per row, as
// simd/ref/ops.c computes it: the squares rounded to float and summed exactly enough (float
// pairs, exact.glsl; the CPU sums in double), the mean rounded once, the division and square
// root rounded to nearest (Vulkan's need not be), then x * scale * w. Rows are row_stride
// apart in x and y (in place is allowed); w (n values) is shared by every row: the whole
// embedding, or one head (q_norm / k_norm over rows of heads).
layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Input { float x[]; };
layout(std430, binding = 1) readonly buffer Weight { float w[]; };
layout(std430, binding = 2) buffer Output { float y[]; };

layout(push_constant) uniform Push {
    uint n;
    uint rows;
    uint x_stride;
    uint y_stride;
    uint has_weight;
    float eps;
} p;

#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"

shared float part_hi[64], part_lo[64];
shared float row_scale;

void main() {
    const uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (row >= p.rows) return;
    const uint tid = gl_LocalInvocationID.x, xo = row * p.x_stride, yo = row * p.y_stride;
    float hi = 0.0, lo = 0.0;
    for (uint i = tid; i < p.n; i += 64u) {
        precise float sq = x[xo + i] * x[xo + i];
        ff_add(hi, lo, sq);
    }
    part_hi[tid] = hi;
    part_lo[tid] = lo;
    barrier();
    if (tid == 0u) {
        float h = 0.0, l = 0.0;
        for (uint i = 0u; i < 64u; i++) ff_add2(h, l, part_hi[i], part_lo[i]);
        const float mean = ff_div(h, l, float(p.n));
        precise float m = mean + p.eps;
        row_scale = exact_div(1.0, exact_sqrt(m));
    }
    barrier();
    const float scale = row_scale;
    for (uint i = tid; i < p.n; i += 64u) {
        precise float v = x[xo + i] * scale;
        precise float r = v * w[i];
        y[yo + i] = p.has_weight != 0u ? r : v;
    }
}
