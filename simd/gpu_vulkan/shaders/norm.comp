#version 450
// RMSNorm of rows of n values: y = x / sqrt(mean(x^2) + eps) (* w), one workgroup per row, the
// squares summed in a fixed order (the CPU sums them in double; float32 here, which the tests
// bound). Rows are row_stride apart in x and y (in place is allowed); w (n values) is shared
// by every row: the whole embedding, or one head (q_norm / k_norm over rows of heads).
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

shared float partial[64];

void main() {
    const uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (row >= p.rows) return;
    const uint tid = gl_LocalInvocationID.x, xo = row * p.x_stride, yo = row * p.y_stride;
    float sum = 0.0;
    for (uint i = tid; i < p.n; i += 64u) sum += x[xo + i] * x[xo + i];
    partial[tid] = sum;
    barrier();
    for (uint half_ = 32u; half_ > 0u; half_ >>= 1) {
        if (tid < half_) partial[tid] += partial[tid + half_];
        barrier();
    }
    const float mean = partial[0] / float(p.n);
    const float scale = 1.0 / sqrt(mean + p.eps);
    for (uint i = tid; i < p.n; i += 64u) {
        const float v = x[xo + i] * scale;
        y[yo + i] = p.has_weight != 0u ? v * w[i] : v;
    }
}
