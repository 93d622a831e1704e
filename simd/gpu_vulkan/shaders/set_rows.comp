#version 450
// Writes n rows of width floats into the cache buffer C at the row indices given (row r at
// byte r * row_bytes), converted to the cache type: F32, or F16 rounded to nearest even as the
// CPU's ei_fp32_to_fp16 rounds (the NaN and overflow cases included). The new keys and values
// of a step, into the blocks the pool gave their positions.
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

#if defined(OUT_F16)
uint half_bits(float v) {
    const uint b = floatBitsToUint(v), sign = (b >> 16) & 0x8000u, a = b & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return sign | 0x7E00u | ((a >> 13) & 0x3FFu); // NaN stays NaN
    if (a >= 0x477FF000u) return sign | 0x7C00u;                        // rounds past 65504: inf
    if (a >= 0x38800000u) {
        const uint r = a - 0x38000000u, rem = r & 0x1FFFu;
        uint h = r >> 13;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) h += 1u;
        return sign | h;
    }
    return sign | uint(roundEven(uintBitsToFloat(a) * 16777216.0));
}
#endif

void main() {
    const uint i = gl_WorkGroupID.y, j = gl_WorkGroupID.x * 64u + gl_LocalInvocationID.x;
    if (i >= p.n) return;
    const uint base = rows[i] * (p.row_bytes >> 2), xo = i * p.x_stride;
#if defined(OUT_F16)
    if (2u * j >= p.width) return;
    const uint lo = half_bits(x[xo + 2u * j]), hi = half_bits(x[xo + 2u * j + 1u]);
    C[base + j] = lo | (hi << 16);
#else
    if (j >= p.width) return;
    C[base + j] = floatBitsToUint(x[xo + j]);
#endif
}
