#version 450
// Attention of each query head of each token over the cache rows its runs name, as the CPU's
// scalar reference rounds it (simd/ref/attn.c): the query rounded to the key type (f16), or
// quantized to q8_0 and met with integer dots (q8_0 / q4_0 keys); scaled and soft-capped
// scores; the softmax's weights exp(score - max) and their sum; each probability w / sum
// rounded to the value type (f16); then the weighted sum of the values. Sums run in float32
// in a fixed order, compensated (a float and its error, TwoSum) where the CPU sums exact
// products in double: the dots with f16 keys and the weighted sums of the values, whose
// products are exact in float too; so a query's result does not depend on the batch, and an
// f16 cache's scores match the CPU's to the last bits.
// One workgroup per (head, token); the scores wait in a scratch buffer between the passes.
// K_* and V_* select the cache types (F32, F16, Q8_0, Q4_0). A key row is row * k_row_bytes
// + kv_head * k_head_bytes into K (the same for V).
layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Queries { float q[]; };  // (n_tokens, n_head, hd)
layout(std430, binding = 1) readonly buffer Keys { uint K[]; };
layout(std430, binding = 2) readonly buffer Values { uint V[]; };
// per token, 1 + 2 * max_runs words: the number of runs, then (first row, rows) of each
layout(std430, binding = 3) readonly buffer Runs { uint runs[]; };
layout(std430, binding = 4) writeonly buffer Output { float o[]; };  // (n_tokens, n_head, hv)
layout(std430, binding = 5) buffer Scratch { float sc[]; };          // (n_tokens, n_head, max_keys)

layout(push_constant) uniform Push {
    uint hd, hv, n_head, n_head_kv, n_tokens;
    uint k_row_bytes, v_row_bytes, k_head_bytes, v_head_bytes;
    uint max_runs, max_keys;
    float scale, softcap;
    uint t0; // the dispatch's first token (the scratch holds its tokens from t0 on)
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
shared float red[64];

// hi + lo += x, keeping in lo what the float addition loses (Knuth's TwoSum)
void add2(inout float hi, inout float lo, float x) {
    precise float s = hi + x;
    precise float bp = s - hi;
    precise float err = (hi - (s - bp)) + (x - bp);
    hi = s;
    lo += err;
}

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

float reduce_sum(float v) {
    const uint tid = gl_LocalInvocationID.x;
    red[tid] = v;
    barrier();
    for (uint h = 32u; h > 0u; h >>= 1) {
        if (tid < h) red[tid] += red[tid + h];
        barrier();
    }
    const float r = red[0];
    barrier();
    return r;
}

float key_dot(uint row) {
#if defined(K_QUANTIZED)
    float dot = 0.0, lo = 0.0;
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
        add2(dot, lo, F16(K, o) * qd[b] * float(isum));
    }
    return dot + lo;
#else
    float dot = 0.0, lo = 0.0;
    for (uint d = 0u; d < p.hd; d++) {
#if defined(K_F32)
        add2(dot, lo, qs[d] * ELEMENT(K, F32, row, d));
#else
        add2(dot, lo, qs[d] * ELEMENT(K, F16, row, d)); // exact products: f16 times f16
#endif
    }
    return dot + lo;
#endif
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
    const uint qo = (t * p.n_head + head) * p.hd, so = ((t - p.t0) * p.n_head + head) * p.max_keys;
    const uint ro = t * (1u + 2u * p.max_runs), n_runs = runs[ro];

    for (uint d = tid; d < p.hd; d += 64u) {
#if defined(K_F16)
        qs[d] = round_f16(q[qo + d]);
#else
        qs[d] = q[qo + d];
#endif
    }
    barrier();
#if defined(K_QUANTIZED)
    if (tid < p.hd / 32u) { // q8_0 as the CPU's quantizer makes it: scale amax / 127, rint
        float amax = 0.0;
        for (uint j = 0u; j < 32u; j++) amax = max(amax, abs(qs[32u * tid + j]));
        const float id = amax != 0.0 ? 127.0 / amax : 0.0;
        qd[tid] = round_f16(amax / 127.0);
        for (uint j = 0u; j < 32u; j++) qq[32u * tid + j] = int(roundEven(qs[32u * tid + j] * id));
    }
    barrier();
#endif

    // scores, and their maximum
    float m = -1.0 / 0.0;
    uint at = 0u;
    for (uint r = 0u; r < n_runs; r++) {
        const uint first = runs[ro + 1u + 2u * r], n = runs[ro + 2u + 2u * r];
        for (uint j = tid; j < n; j += 64u) {
            float s = key_dot((first + j) * p.k_row_bytes + kvh * p.k_head_bytes) * p.scale;
            if (p.softcap != 0.0) {
                const float c = s / p.softcap, a = abs(c); // tanh accurate near zero (ops.comp's)
                const float th = a < 0.1 ? c * (1.0 + c * c * (-1.0 / 3.0 + c * c * (2.0 / 15.0 + c * c * (-17.0 / 315.0))))
                                         : sign(c) * (1.0 - 2.0 / (exp(2.0 * a) + 1.0));
                s = p.softcap * th;
            }
            sc[so + at + j] = s;
            if (s > m) m = s;
        }
        at += n;
    }
    const uint n_keys = at;
    memoryBarrierBuffer(); // the scores, for the invocations that take them up next
    m = reduce_max(m);

    // the weights and their sum
    float sum = 0.0;
    for (uint k = tid; k < n_keys; k += 64u) {
        const float w = exp(sc[so + k] - m);
        sc[so + k] = w;
        sum += w;
    }
    memoryBarrierBuffer();
    sum = reduce_sum(sum); // its barriers: every weight is there after it

    // the values: each invocation its output dimensions
    for (uint d = tid; d < p.hv; d += 64u) {
        float acc = 0.0, lo = 0.0;
        at = 0u;
        for (uint r = 0u; r < n_runs; r++) {
            const uint first = runs[ro + 1u + 2u * r], n = runs[ro + 2u + 2u * r];
            for (uint j = 0u; j < n; j++) {
#if defined(V_F16)
                const float prob = round_f16(sc[so + at + j] / sum);
#else
                const float prob = sc[so + at + j] / sum;
#endif
                add2(acc, lo, prob * value_at((first + j) * p.v_row_bytes + kvh * p.v_head_bytes, d));
            }
            at += n;
        }
        o[(t * p.n_head + head) * p.hv + d] = acc + lo;
    }
}
