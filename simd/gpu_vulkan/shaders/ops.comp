#version 450
// Element-wise steps over n values: y += x (the residual adds), y += x[i % period] (a bias on
// every row), y *= s (a scale), y = tanh(y / s) * s (soft-capping, with tanh and the division
// rounded as the CPU rounds them: exact.glsl); OP selects which.
#extension GL_GOOGLE_include_directive : require
#include "exact.glsl"
layout(local_size_x = 64) in;

layout(std430, binding = 0) buffer Values { float y[]; };
layout(std430, binding = 1) readonly buffer Input { float x[]; };

layout(push_constant) uniform Push {
    uint n;
    float s;
    uint period;
} p;

void main() {
    const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64u + gl_LocalInvocationID.x;
    if (i >= p.n) return;
#if defined(OP_ADD)
    precise float r = y[i] + x[i];
#elif defined(OP_ADD_ROW)
    precise float r = y[i] + x[i % p.period];
#elif defined(OP_SCALE)
    precise float r = y[i] * p.s;
#elif defined(OP_SOFTCAP)
    precise float r = exact_tanh(exact_div(y[i], p.s)) * p.s;
#else
#error "ops.comp: no OP_* defined"
#endif
    y[i] = r;
}
