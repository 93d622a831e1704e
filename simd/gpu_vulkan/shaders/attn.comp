#version 450
// Attention of each query head of each token over the cache rows its runs name, as the CPU's
// scalar reference computes it (simd/ref/attn.c): the query rounded to the key type (f16), or
// quantized to q8_0 and met with integer dots (q8_0 / q4_0 keys); scaled (and soft-capped)
// scores; the softmax's weights exp(score - max) and their sum; each probability w / sum
// rounded to float, then to the value type (f16); then the weighted sum of the values. Where
// the CPU sums exact products in double, and computes the weights in double, this computes
// them in float pairs (exact.glsl: sums, products, exp and the quotient), so that a score, a
// probability and an output round to the CPU's floats but where the exact value lies within
// about 2^-44 of a rounding boundary.
// The order is fixed, so a query's result does not depend on the batch.
// One workgroup per (head, token); the scores, then the weights (hi and lo halves) and then
// the probabilities wait in a scratch buffer between the passes: 2 * max_keys floats per
// (token, head). K_* and V_* select the cache types (F32, F16, Q8_0, Q4_0). A key row is
// row * k_row_bytes + kv_head * k_head_bytes into K (the same for V).
// Quantized keys are stored Walsh-Hadamard rotated (hadamard: the block, 0 for none) and may
// have been kept as first rotated when positions were dropped (simd/common/key_shifts.h):
// with `shifted`, Shifts holds each row's shift d, and a query meets the keys of shift d
// rotated d positions further itself (Angles: the (cos, sin) pairs of every position at each
// rope base), then Hadamard rotated, then quantized, as ei_attn_quant_scores does per run.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Queries { float q[]; };  // (n_tokens, n_head, hd)
layout(std430, binding = 1) readonly buffer Keys { uint K[]; };
layout(std430, binding = 2) readonly buffer Values { uint V[]; };
// per token, 1 + 2 * max_runs words: the number of runs, then (first row, rows) of each
layout(std430, binding = 3) readonly buffer Runs { uint runs[]; };
layout(std430, binding = 4) writeonly buffer Output { float o[]; };  // (n_tokens, n_head, hv)
layout(std430, binding = 5) buffer Scratch { float sc[]; };          // (n_tokens, n_head, 2, max_keys)
layout(std430, binding = 6) readonly buffer Shifts { uint shift[]; };  // (rows) each key row's shift
layout(std430, binding = 7) readonly buffer Angles { float cs[]; };    // (bases, n_ctx, n_rot)

layout(push_constant) uniform Push {
    uint hd, hv, n_head, n_head_kv, n_tokens;
    uint k_row_bytes, v_row_bytes, k_head_bytes, v_head_bytes;
    uint max_runs, max_keys;
    float scale, softcap;
    uint t0; // the dispatch's first token (the scratch holds its tokens from t0 on)
    uint shifted, n_rot, neox, hadamard;
    float hadamard_scale; // 1.0f / sqrtf(hadamard), as the host computes it
    uint angles_first;    // where the layer's rope base starts in cs
} p;

#define U8(B, o) ((B[(o) >> 2] >> (((o) & 3u) * 8u)) & 0xFFu)
#define U16(B, o) ((B[(o) >> 2] >> (((o) & 2u) * 8u)) & 0xFFFFu)
#define F16(B, o) unpackHalf2x16(U16(B, o)).x
#define I8(B, o) bitfieldExtract(int(U8(B, o)), 0, 8)

// fp32 -> fp16 -> fp32, rounded to nearest even, for |v| < 65504 (as glu.comp's half_bits)
float round_f16(float v) {
    const uint b = floatBitsToUint(v), sign = (b >> 16) & 0x8000u, a = b & 0x7FFFFFFFu;
    uint h;
    if (a >= 0x38800000u) {
        const uint r = a - 0x38000000u, rem = r & 0x1FFFu;
        h = r >> 13;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) h += 1u;
    } else {
        h = uint(roundEven(uintBitsToFloat(a) * 16777216.0));
    }
    return unpackHalf2x16(sign | h).x;
}

// element d of a row of type T starting at byte o of buffer B
#define ELEMENT(B, T, o, d) ELEMENT_##T(B, o, d)
#define ELEMENT_F32(B, o, d) uintBitsToFloat(B[((o) >> 2) + (d)])
#define ELEMENT_F16(B, o, d) F16(B, (o) + 2u * (d))
#define ELEMENT_Q8_0(B, o, d) (F16(B, (o) + 34u * ((d) >> 5)) * float(I8(B, (o) + 34u * ((d) >> 5) + 2u + ((d) & 31u))))
#define Q4_NIBBLE(B, o, j) (((j) < 16u ? U8(B, (o) + 2u + (j)) : U8(B, (o) + 2u + (j) - 16u) >> 4) & 15u)
#define ELEMENT_Q4_0(B, o, d) (F16(B, (o) + 18u * ((d) >> 5)) * float(int(Q4_NIBBLE(B, (o) + 18u * ((d) >> 5), (d) & 31u)) - 8))

#if defined(K_Q8_0) || defined(K_Q4_0)
#define K_QUANTIZED 1
#endif

shared float qs[512];   // the query as the keys meet it
shared int qq[512];     // quantized keys: the query's q8_0 integers
shared float qd[16];    // and their block scales
shared float red[64], red_lo[64];

#include "exact.glsl"

float reduce_max(float v) {
    const uint tid = gl_LocalInvocationID.x;
    red[tid] = v;
    barrier();
    for (uint h = 32u; h > 0u; h >>= 1) {
        if (tid < h) red[tid] = max(red[tid], red[tid + h]);
        barrier();
    }
    const float r = red[0];
    barrier();
    return r;
}

// the workgroup's float pairs added in a fixed tree order
void reduce_pair(inout float hi, inout float lo) {
    const uint tid = gl_LocalInvocationID.x;
    red[tid] = hi;
    red_lo[tid] = lo;
    barrier();
    for (uint h = 32u; h > 0u; h >>= 1) {
        if (tid < h) {
            float a = red[tid], b = red_lo[tid];
            ff_add2(a, b, red[tid + h], red_lo[tid + h]);
            red[tid] = a;
            red_lo[tid] = b;
        }
        barrier();
    }
    hi = red[0];
    lo = red_lo[0];
    barrier();
}

#if defined(K_QUANTIZED)
// the query of (token, head) at qo as keys of shift d meet it: rotated d positions further
// (rope.comp's arithmetic), Hadamard rotated (hadamard.comp's), then quantized to q8_0 as the
// CPU's quantizer makes it (scale amax / 127, rint) into qq and qd
void prepare_query(uint qo, uint d) {
    const uint tid = gl_LocalInvocationID.x;
    barrier(); // the last keys' dots are done with qq
    for (uint i = tid; i < p.hd; i += 64u) qs[i] = q[qo + i];
    barrier();
    const uint half_ = p.n_rot / 2u;
    for (uint j = tid; d != 0u && j < half_; j += 64u) {
        const uint ia = p.neox != 0u ? j : 2u * j, ib = p.neox != 0u ? j + half_ : 2u * j + 1u;
        const uint at = p.angles_first + d * p.n_rot + 2u * j;
        const float c = cs[at], s = cs[at + 1u], x0 = qs[ia], x1 = qs[ib];
        precise float r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
        qs[ia] = r0;
        qs[ib] = r1;
    }
    barrier();
    if (p.hadamard != 0u) {
        for (uint i = tid; i < p.hd; i += 64u) {
            precise float v = qs[i] * p.hadamard_scale;
            qs[i] = v;
        }
        barrier();
        for (uint len = 1u; len < p.hadamard; len <<= 1) {
            for (uint k = tid; k < p.hd / 2u; k += 64u) { // pair k: (i, i + len) in its block
                const uint b = k / (p.hadamard / 2u), kk = k % (p.hadamard / 2u);
                const uint i = b * p.hadamard + (kk / len) * 2u * len + kk % len;
                const float a = qs[i], c = qs[i + len];
                precise float su = a + c, di = a - c;
                qs[i] = su;
                qs[i + len] = di;
            }
            barrier();
        }
    }
    if (tid < p.hd / 32u) {
        float amax = 0.0;
        for (uint j = 0u; j < 32u; j++) amax = max(amax, abs(qs[32u * tid + j]));
        const float id = amax != 0.0 ? exact_div(127.0, amax) : 0.0;
        qd[tid] = round_f16(exact_div(amax, 127.0));
        for (uint j = 0u; j < 32u; j++) {
            precise float v = qs[32u * tid + j] * id;
            qq[32u * tid + j] = int(roundEven(v));
        }
    }
    barrier();
}
#endif

float key_dot(uint row) {
    float dot = 0.0, lo = 0.0;
#if defined(K_QUANTIZED)
    for (uint b = 0u; b < p.hd / 32u; b++) {
#if defined(K_Q8_0)
        const uint o = row + 34u * b;
        int isum = 0;
        for (uint j = 0u; j < 32u; j++) isum += qq[32u * b + j] * I8(K, o + 2u + j);
#else
        const uint o = row + 18u * b;
        int isum = 0;
        for (uint j = 0u; j < 32u; j++) isum += qq[32u * b + j] * (int(Q4_NIBBLE(K, o, j)) - 8);
#endif
        ff_add_scaled(dot, lo, F16(K, o), qd[b], isum);
    }
#else
    for (uint d = 0u; d < p.hd; d++) {
#if defined(K_F32)
        float pp, pe;
        two_prod(qs[d], ELEMENT(K, F32, row, d), pp, pe);
        ff_add2(dot, lo, pp, pe);
#else
        precise float pp = qs[d] * ELEMENT(K, F16, row, d); // f16 times f16: exact
        ff_add(dot, lo, pp);
#endif
    }
#endif
    return ff_round(dot, lo);
}

float value_at(uint row, uint d) {
#if defined(V_F32)
    return ELEMENT(V, F32, row, d);
#elif defined(V_F16)
    return ELEMENT(V, F16, row, d);
#elif defined(V_Q8_0)
    return ELEMENT(V, Q8_0, row, d);
#else
    return ELEMENT(V, Q4_0, row, d);
#endif
}

void main() {
    const uint head = gl_WorkGroupID.x, t = p.t0 + gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    if (head >= p.n_head || t >= p.n_tokens) return;
    const uint kvh = head / (p.n_head / p.n_head_kv);
    const uint qo = (t * p.n_head + head) * p.hd, so = ((t - p.t0) * p.n_head + head) * 2u * p.max_keys;
    const uint lo_at = so + p.max_keys; // the weights' low halves
    const uint ro = t * (1u + 2u * p.max_runs), n_runs = runs[ro];

#if !defined(K_QUANTIZED)
    for (uint d = tid; d < p.hd; d += 64u) {
#if defined(K_F16)
        qs[d] = round_f16(q[qo + d]);
#else
        qs[d] = q[qo + d];
#endif
    }
    barrier();
#endif

    // scores, and their maximum; quantized keys in spans of one shift (the whole run
    // without shifts), the query prepared again where the shift changes
    float m = -1.0 / 0.0;
    uint at = 0u, rotation = 0xFFFFFFFFu; // the shift the query is prepared for
    for (uint r = 0u; r < n_runs; r++) {
        const uint first = runs[ro + 1u + 2u * r], n = runs[ro + 2u + 2u * r];
        for (uint j0 = 0u, j1; j0 < n; j0 = j1) {
#if defined(K_QUANTIZED)
            const uint d = p.shifted != 0u ? shift[first + j0] : 0u;
            j1 = j0 + 1u;
            if (p.shifted != 0u) {
                while (j1 < n && shift[first + j1] == d) j1++;
            } else {
                j1 = n;
            }
            if (d != rotation) prepare_query(qo, d);
            rotation = d;
#else
            j1 = n;
#endif
            for (uint j = j0 + tid; j < j1; j += 64u) {
                precise float s = key_dot((first + j) * p.k_row_bytes + kvh * p.k_head_bytes) * p.scale;
                float score = s;
                if (p.softcap != 0.0) { // ei_attn_score: softcap * (float)tanh((double)(s / softcap))
                    precise float capped = p.softcap * exact_tanh(exact_div(s, p.softcap));
                    score = capped;
                }
                sc[so + at + j] = score;
                if (score > m) m = score;
            }
        }
        at += n;
    }
    const uint n_keys = at;
    memoryBarrierBuffer(); // the scores, for the invocations that take them up next
    m = reduce_max(m);

    // the weights and their sum
    float sum = 0.0, sum_lo = 0.0;
    for (uint k = tid; k < n_keys; k += 64u) {
        precise float x = sc[so + k] - m;
        float wh, wl;
        exp_pair(x, wh, wl);
        sc[so + k] = wh;
        sc[lo_at + k] = wl;
        ff_add2(sum, sum_lo, wh, wl);
    }
    memoryBarrierBuffer();
    reduce_pair(sum, sum_lo); // its barriers: every weight is there after it

    // each key's probability, as the values meet it
    for (uint k = tid; k < n_keys; k += 64u) {
        const float prob = ff_quotient(sc[so + k], sc[lo_at + k], sum, sum_lo);
#if defined(V_F16)
        sc[so + k] = round_f16(prob);
#else
        sc[so + k] = prob;
#endif
    }
    memoryBarrierBuffer();
    barrier();

    // the values: each invocation its output dimensions
    for (uint d = tid; d < p.hv; d += 64u) {
        float acc = 0.0, lo = 0.0;
        at = 0u;
        for (uint r = 0u; r < n_runs; r++) {
            const uint first = runs[ro + 1u + 2u * r], n = runs[ro + 2u + 2u * r];
            for (uint j = 0u; j < n; j++) {
                const float v = value_at((first + j) * p.v_row_bytes + kvh * p.v_head_bytes, d);
#if defined(V_F16)
                precise float pv = sc[so + at + j] * v; // f16 times f16: exact
                ff_add(acc, lo, pv);
#else
                float ph, pl;
                two_prod(sc[so + at + j], v, ph, pl);
                ff_add2(acc, lo, ph, pl);
#endif
            }
            at += n;
        }
        o[(t * p.n_head + head) * p.hv + d] = ff_round(acc, lo);
    }
}
