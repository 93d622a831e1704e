#version 450
// The activations of a product as the CPU engine's quantizers make them (simd/ref/quants.c's
// from_float), one workgroup per (block, token): q8_0 (scale amax / 127 rounded to f16, values
// rint(x * 127 / amax)), q8_1 (and the scale times the values' sum, rounded to f16), q8_K
// (scale 1 / (-127 / max) for the first value of largest magnitude, values capped at 127, the
// sums of each 16), or the values rounded to f16 / bf16. The integers go four to a word into
// Q (n, cols / 4); the scales as floats into S (n, s_stride): q8_0 / q8_K's d per block from 0,
// q8_1's sums (and q8_K's 16-value sums) from cols / 32; rounded values into F (n, cols).
// Divisions go through exact.glsl's exact_div: Vulkan's need not be rounded to nearest.
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"
layout(local_size_x = 32) in;

layout(std430, binding = 0) readonly buffer Input { float x[]; };  // (n, x_stride)
layout(std430, binding = 1) writeonly buffer Ints { uint Q[]; };
layout(std430, binding = 2) writeonly buffer Scales { float S[]; };
layout(std430, binding = 3) writeonly buffer Rounded { float F[]; };

layout(push_constant) uniform Push {
    uint n, cols, x_stride, s_stride, x_first;
} p;

#include "half.glsl"
float round_f16(float v) { return unpackHalf2x16(half_bits(v)).x; }

#if defined(ACT_Q8_K)
#define BLOCK 256u
#else
#define BLOCK 32u
#endif

shared float red[32];
shared float redv[32];
shared int qv[BLOCK];

void main() {
    const uint blk = gl_WorkGroupID.x, t = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    if (t >= p.n || blk * BLOCK >= p.cols) return;
    const uint xo = p.x_first + t * p.x_stride + blk * BLOCK;
#if defined(ACT_F16) || defined(ACT_BF16)
    const float v = x[xo + tid];
#if defined(ACT_F16)
    F[t * p.cols + blk * 32u + tid] = round_f16(v);
#else
    const uint u = floatBitsToUint(v);
    const uint r = (u & 0x7FFFFFFFu) > 0x7F800000u ? ((u >> 16) | 64u) : ((u + (0x7FFFu + ((u >> 16) & 1u))) >> 16);
    F[t * p.cols + blk * 32u + tid] = uintBitsToFloat((r & 0xFFFFu) << 16);
#endif
#else
    // the largest magnitude (q8_K: and the first value that has it, with its sign)
    float amax = 0.0, vmax = 0.0;
    for (uint j = tid; j < BLOCK; j += 32u) {
        const float v = x[xo + j];
        if (abs(v) > amax) { amax = abs(v); vmax = v; }
    }
    red[tid] = amax;
    redv[tid] = vmax;
    barrier();
    if (tid == 0u) { // in index order, as the CPU's loop takes them: ties keep the first
        float a = 0.0, m = 0.0;
#if defined(ACT_Q8_K)
        // each invocation's values are j = tid + 32 k: the first of largest magnitude over all j
        for (uint j = 0u; j < BLOCK; j++) {
            const float v = x[xo + j];
            if (abs(v) > a) { a = abs(v); m = v; }
        }
#else
        for (uint i = 0u; i < 32u; i++) a = max(a, red[i]);
#endif
        red[0] = a;
        redv[0] = m;
    }
    barrier();
    amax = red[0];
    const uint so = t * p.s_stride;
#if defined(ACT_Q8_K)
    const float iscale = amax != 0.0 ? exact_div(-127.0, redv[0]) : 0.0;
    for (uint j = tid; j < BLOCK; j += 32u) {
        precise float v = iscale * x[xo + j];
        qv[j] = amax != 0.0 ? min(int(roundEven(v)), 127) : 0;
    }
    barrier();
    if (tid < 16u) {
        int s = 0;
        for (uint l = 0u; l < 16u; l++) s += qv[16u * tid + l];
        S[so + p.cols / 32u + blk * 16u + tid] = float(s);
    }
    if (tid == 0u) S[so + blk] = amax != 0.0 ? exact_div(1.0, iscale) : 0.0;
#else
    const float id = amax != 0.0 ? exact_div(127.0, amax) : 0.0;
    precise float v = x[xo + tid] * id;
    qv[tid] = int(roundEven(v));
    barrier();
    if (tid == 0u) {
        const float d = exact_div(amax, 127.0);
        S[so + blk] = round_f16(d);
#if defined(ACT_Q8_1)
        int s = 0;
        for (uint l = 0u; l < 32u; l++) s += qv[l];
        precise float ds = d * float(s);
        S[so + p.cols / 32u + blk] = round_f16(ds);
#endif
    }
#endif
    barrier();
    for (uint w = tid; w < BLOCK / 4u; w += 32u)
        Q[t * (p.cols / 4u) + blk * (BLOCK / 4u) + w] = (uint(qv[4u * w]) & 0xFFu) | ((uint(qv[4u * w + 1u]) & 0xFFu) << 8) |
                                                       ((uint(qv[4u * w + 2u]) & 0xFFu) << 16) | ((uint(qv[4u * w + 3u]) & 0xFFu) << 24);
#endif
}
