#version 450
// The Walsh-Hadamard rotation of a quantized cache (simd/ref/ops.c's hadamard, which the CPU
// engine applies to keys and queries in blocks of a key block, to values and the attention
// output in blocks of 64): each block of `block` values scaled by 1 / sqrt(block), then
// log2(block) stages of butterflies (u + v, u - v), bit for bit the reference's. One
// workgroup per (block, row) of n rows of width values, stride apart, in place.
layout(local_size_x = 64) in;

layout(std430, binding = 0) buffer Values { float x[]; };

layout(push_constant) uniform Push {
    uint n;
    uint width;   // a multiple of block
    uint stride;
    uint block;   // a power of two, at most 512
    float scale;  // 1.0f / sqrtf(block), as the host computes it
} p;

shared float v[512];

void main() {
    const uint b = gl_WorkGroupID.x, r = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    if (r >= p.n || (b + 1u) * p.block > p.width) return;
    const uint o = r * p.stride + b * p.block;
    for (uint i = tid; i < p.block; i += 64u) {
        precise float s = x[o + i] * p.scale;
        v[i] = s;
    }
    barrier();
    for (uint len = 1u; len < p.block; len <<= 1) {
        for (uint k = tid; k < p.block / 2u; k += 64u) { // pair k: (i, i + len)
            const uint i = (k / len) * 2u * len + k % len;
            const float a = v[i], c = v[i + len];
            precise float s = a + c, d = a - c;
            v[i] = s;
            v[i + len] = d;
        }
        barrier();
    }
    for (uint i = tid; i < p.block; i += 64u) x[o + i] = v[i];
}
