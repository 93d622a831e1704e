#version 450
// Writes n rows of width floats into the cache buffer C at the row indices given (row r at
// byte r * row_bytes), converted to the cache type: F32; F16 rounded to nearest even as the
// CPU's ei_fp32_to_fp16 rounds (the NaN and overflow cases included); Q8_0 or Q4_0 blocks as
// simd/ref/quants.c's from_float makes them (its divisions rounded to nearest through
// exact.glsl). The new keys and values of a step, into the blocks the pool gave their
// positions. F32 / F16: one invocation a word; Q8_0 / Q4_0: one workgroup a row, its blocks
// assembled in shared memory (34 or 18 bytes: not word-aligned) and then written whole.
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"
layout(local_size_x = 64) in;

layout(std430, binding = 0) buffer Cache { uint C[]; };
layout(std430, binding = 1) readonly buffer Input { float x[]; };    // (n, x_stride)
layout(std430, binding = 2) readonly buffer Rows { uint rows[]; };   // (n,)

layout(push_constant) uniform Push {
    uint n;
    uint width;      // values per row (even for F16)
    uint x_stride;
    uint row_bytes;  // multiple of 4
} p;

#include "half.glsl"

#if defined(OUT_Q8_0) || defined(OUT_Q4_0)
#define MAX_WORDS 2048u
shared uint words[MAX_WORDS]; // (row bytes / 4) the row being assembled

void put_byte(uint at, uint b) { atomicOr(words[at >> 2], (b & 0xFFu) << ((at & 3u) * 8u)); }

int q4_0_level(float v) { // simd/ref/quants.c's: NaN stores level 0
    precise float f = v + 8.5;
    if (!(f >= 0.0)) return 0;
    return f >= 15.0 ? 15 : int(f);
}

void quantize_block(uint xo, uint b) {
#if defined(OUT_Q8_0)
    float amax = 0.0;
    for (uint j = 0u; j < 32u; j++) amax = max(amax, abs(x[xo + j]));
    const float d = exact_div(amax, 127.0), id = amax != 0.0 ? exact_div(127.0, amax) : 0.0;
    const uint at = 34u * b, h = half_bits(d);
    put_byte(at, h);
    put_byte(at + 1u, h >> 8);
    for (uint j = 0u; j < 32u; j++) {
        precise float v = x[xo + j] * id;
        put_byte(at + 2u + j, uint(int(roundEven(v))));
    }
#else
    float amax = 0.0, m = 0.0; // the first value of largest magnitude, with its sign
    for (uint j = 0u; j < 32u; j++)
        if (amax < abs(x[xo + j])) { amax = abs(x[xo + j]); m = x[xo + j]; }
    const float d = exact_div(m, -8.0), id = d != 0.0 ? exact_div(1.0, d) : 0.0;
    const uint at = 18u * b, h = half_bits(d);
    put_byte(at, h);
    put_byte(at + 1u, h >> 8);
    for (uint j = 0u; j < 16u; j++) {
        precise float lo = x[xo + j] * id, hi = x[xo + 16u + j] * id;
        put_byte(at + 2u + j, uint(q4_0_level(lo) | (q4_0_level(hi) << 4)));
    }
#endif
}
#endif

void main() {
    const uint i = gl_WorkGroupID.y, j = gl_WorkGroupID.x * 64u + gl_LocalInvocationID.x;
    if (i >= p.n) return;
    const uint base = rows[i] * (p.row_bytes >> 2), xo = i * p.x_stride;
#if defined(OUT_Q8_0) || defined(OUT_Q4_0)
    const uint tid = gl_LocalInvocationID.x, blocks = p.width / 32u;
#if defined(OUT_Q8_0)
    const uint n_words = (34u * blocks + 3u) / 4u;
#else
    const uint n_words = (18u * blocks + 3u) / 4u;
#endif
    for (uint w = tid; w < n_words; w += 64u) words[w] = 0u;
    barrier();
    for (uint b = tid; b < blocks; b += 64u) quantize_block(xo + 32u * b, b);
    barrier();
    for (uint w = tid; w < n_words; w += 64u) C[base + w] = words[w];
#elif defined(OUT_F16)
    if (2u * j >= p.width) return;
    const uint lo = half_bits(x[xo + 2u * j]), hi = half_bits(x[xo + 2u * j + 1u]);
    C[base + j] = lo | (hi << 16);
#else
    if (j >= p.width) return;
    C[base + j] = floatBitsToUint(x[xo + j]);
#endif
}
