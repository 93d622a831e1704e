#version 450
// An eviction's row moves in one device layer's cache (simd/common/engine.c: evict_layer and
// evict_window, whose move_key this follows): phase 0 gathers each move's source key row,
// decoded and each head rotated by the move's (cos, sin) pairs (the positions it moves down),
// and its value row as stored, into T; phase 1 writes them to the destination rows, the keys
// encoded to the cache type (F32, or F16 as ei_fp32_to_fp16 rounds); q8_0 / q4_0 keys, kept
// as first rotated (key_shifts.h), move as they are (k_mode 2). All reads of a dispatch
// come before its writes, and the engine gives moves in the order it makes them (ascending
// sources, each destination below its source), so this equals moving them one by one.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;

layout(std430, binding = 0) buffer Keys { uint K[]; };
layout(std430, binding = 1) buffer Values { uint V[]; };
layout(std430, binding = 2) buffer Temp { uint T[]; };               // (n, kv_dim + v_words)
layout(std430, binding = 3) readonly buffer Moves { int mv[]; };     // (n, 3): source row, destination row, angles
layout(std430, binding = 4) readonly buffer Angles { float cs[]; };  // (angles, n_rot): cos, sin

layout(push_constant) uniform Push {
    uint n, kv_dim, k_words, v_words, n_head_kv, head_dim, n_rot, neox, k_mode, phase; // k_mode: 0 f32, 1 f16, 2 as stored
} p;

#include "half.glsl"

#define MAX_KV_DIM 4096u
shared float row[MAX_KV_DIM];

void main() {
    const uint m = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    if (m >= p.n) return;
    const uint src = uint(mv[3u * m]), dst = uint(mv[3u * m + 1u]), tb = m * (p.kv_dim + p.v_words);
    const int a = mv[3u * m + 2u];
    if (p.k_mode == 2u) { // keys moved as they are, with their values
        for (uint w = tid; w < p.k_words + p.v_words; w += 64u) {
            const bool key = w < p.k_words;
            if (p.phase == 0u) T[tb + w] = key ? K[src * p.k_words + w] : V[src * p.v_words + w - p.k_words];
            else if (key) K[dst * p.k_words + w] = T[tb + w];
            else V[dst * p.v_words + w - p.k_words] = T[tb + w];
        }
        return;
    }
    if (p.phase == 0u) {
        for (uint i = tid; i < p.kv_dim; i += 64u)
            row[i] = p.k_mode == 1u ? unpackHalf2x16(K[src * p.k_words + i / 2u] >> (16u * (i & 1u))).x : uintBitsToFloat(K[src * p.k_words + i]);
        barrier();
        const uint half_ = p.n_rot / 2u;
        for (uint k = tid; a >= 0 && k < p.n_head_kv * half_; k += 64u) {
            const uint h = k / half_, j = k % half_, base = h * p.head_dim;
            const uint ia = base + (p.neox != 0u ? j : 2u * j), ib = base + (p.neox != 0u ? j + half_ : 2u * j + 1u);
            const float c = cs[uint(a) * p.n_rot + 2u * j], s = cs[uint(a) * p.n_rot + 2u * j + 1u];
            const float x0 = row[ia], x1 = row[ib];
            precise float r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
            row[ia] = r0;
            row[ib] = r1;
        }
        barrier();
        for (uint i = tid; i < p.kv_dim; i += 64u) T[tb + i] = floatBitsToUint(row[i]);
        for (uint w = tid; w < p.v_words; w += 64u) T[tb + p.kv_dim + w] = V[src * p.v_words + w];
    } else {
        if (p.k_mode == 1u) {
            for (uint w = tid; w < p.kv_dim / 2u; w += 64u)
                K[dst * p.k_words + w] = half_bits(uintBitsToFloat(T[tb + 2u * w])) | (half_bits(uintBitsToFloat(T[tb + 2u * w + 1u])) << 16);
        } else {
            for (uint i = tid; i < p.kv_dim; i += 64u) K[dst * p.k_words + i] = T[tb + i];
        }
        for (uint w = tid; w < p.v_words; w += 64u) V[dst * p.v_words + w] = T[tb + p.kv_dim + w];
    }
}
