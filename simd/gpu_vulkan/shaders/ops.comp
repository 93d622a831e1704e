#version 450
// Element-wise steps over n values: y += x (the residual adds), y += x[i % period] (a bias on
// every row), y *= s (a scale), y = tanh(y / s) * s (soft-capping); OP selects which.
layout(local_size_x = 64) in;

layout(std430, binding = 0) buffer Values { float y[]; };
layout(std430, binding = 1) readonly buffer Input { float x[]; };

layout(push_constant) uniform Push {
    uint n;
    float s;
    uint period;
} p;

// tanh to a few float ulps (GLSL's tanh may lose its relative precision near zero): a series
// below |t| = 0.1, else 1 - 2 / (exp(2|t|) + 1) with the sign put back
float tanh_accurate(float t) {
    const float a = abs(t);
    if (a < 0.1) {
        const float t2 = t * t;
        return t * (1.0 + t2 * (-1.0 / 3.0 + t2 * (2.0 / 15.0 + t2 * (-17.0 / 315.0))));
    }
    return sign(t) * (1.0 - 2.0 / (exp(2.0 * a) + 1.0));
}

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
    precise float r = tanh_accurate(y[i] / p.s) * p.s;
#else
#error "ops.comp: no OP_* defined"
#endif
    y[i] = r;
}
