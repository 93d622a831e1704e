#version 450
// out[i] = row ids[i] of W, decoded to floats: token embeddings, and the exact check of every
// decoder against the scalar reference. One workgroup per (row, 32-value sub-block group).
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Weights { uint W[]; };   // (rows, row_bytes / 4)
layout(std430, binding = 1) readonly buffer Ids { uint ids[]; };     // (n,)
layout(std430, binding = 2) writeonly buffer Output { float y[]; };  // (n, y_stride)

layout(push_constant) uniform Push {
    uint cols;  // values per row, a multiple of 32
    uint rows;
    uint row_bytes;
    uint n;
    uint y_stride;
    uint id_first;  // W's first row: ids outside [id_first, id_first + rows) are another part's
} p;

#include "quants.glsl"

void main() {
    const uint i = gl_WorkGroupID.y, s = gl_WorkGroupID.x * 64u + gl_LocalInvocationID.x;
    if (i >= p.n || s >= p.cols / 32u) return;
    const uint id = ids[i];
    if (id < p.id_first || id - p.id_first >= p.rows) return;
    float w[32];
    dequant32((id - p.id_first) * p.row_bytes, s, w);
    for (uint k = 0u; k < 32u; k++) y[i * p.y_stride + 32u * s + k] = w[k];
}
