#version 450
// Rotary embedding in place: each head of each token has its first n_rot values rotated by
// the token's (cos, sin) pairs, computed on the CPU as the CPU engine computes them (so both
// rotate by the same angles); pairs (2i, 2i+1), or (i, i + n_rot/2) in the NeoX order.
layout(local_size_x = 64) in;

layout(std430, binding = 0) buffer Values { float x[]; };       // (n_tokens, token_stride)
layout(std430, binding = 1) readonly buffer Angles { float cs[]; }; // (n_tokens, n_rot): cos, sin

layout(push_constant) uniform Push {
    uint n_tokens;
    uint n_heads;
    uint head_dim;
    uint n_rot;
    uint token_stride;
    uint neox;
    uint cs_first; // where the step's table starts in cs (a layer's rope base)
} p;

void main() {
    const uint half_ = p.n_rot / 2u, i = gl_GlobalInvocationID.x;
    const uint t = gl_WorkGroupID.y;
    if (i >= p.n_heads * half_ || t >= p.n_tokens) return;
    const uint h = i / half_, j = i % half_;
    const uint base = t * p.token_stride + h * p.head_dim;
    const uint a = base + (p.neox != 0u ? j : 2u * j), b = base + (p.neox != 0u ? j + half_ : 2u * j + 1u);
    const float c = cs[p.cs_first + t * p.n_rot + 2u * j], s = cs[p.cs_first + t * p.n_rot + 2u * j + 1u];
    const float x0 = x[a], x1 = x[b];
    precise float r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
    x[a] = r0;
    x[b] = r1;
}
