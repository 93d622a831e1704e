#version 450
// The gated FFN's activation in place: g = act(g) * u over n values. GELU reads the CPU's
// table of GELU at every fp16 value (as GGML does), so both engines take the same values;
// SiLU is g / (1 + exp(-g)) in float pairs (exact.glsl), rounded once to float as the CPU
// rounds it from double.
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"
layout(local_size_x = 64) in;

layout(std430, binding = 0) buffer Gate { float g[]; };
layout(std430, binding = 1) readonly buffer Up { float u[]; };
layout(std430, binding = 2) readonly buffer Table { uint table[]; }; // 65536 fp16, two a word

layout(push_constant) uniform Push {
    uint n;
    uint gelu;
} p;

// fp32 -> fp16 bits rounded to nearest even (packHalf2x16 leaves the rounding to the driver),
// for |v| < 65504: the CPU's ei_fp32_to_fp16 on the values the table is read at
uint half_bits(float v) {
    const uint b = floatBitsToUint(v), sign = (b >> 16) & 0x8000u, a = b & 0x7FFFFFFFu;
    if (a >= 0x38800000u) { // a normal half: rebias the exponent, round the 13 bits let go
        const uint r = a - 0x38000000u, rem = r & 0x1FFFu;
        uint h = r >> 13;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) h += 1u;
        return sign | h;
    }
    return sign | uint(roundEven(uintBitsToFloat(a) * 16777216.0)); // a subnormal half: v / 2^-24
}

void main() {
    const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64u + gl_LocalInvocationID.x;
    if (i >= p.n) return;
    const float v = g[i];
    float a;
    if (p.gelu != 0u) {
        if (v <= -10.0) a = 0.0;
        else if (v >= 10.0) a = v;
        else {
            const uint h = half_bits(v);
            a = unpackHalf2x16(table[h >> 1] >> (16u * (h & 1u))).x;
        }
    } else {
        a = exact_silu(v);
    }
    precise float r = a * u[i];
    g[i] = r;
}
