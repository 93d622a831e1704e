#version 450
// Attention tracking (the H2O policy's scores) for one dispatch of attn.comp: each counter c of
// (sequences, n_ctx) positions adds, for every token of the dispatch whose keys cover it and
// every query head, the probability that key received (attn.comp leaves the probabilities in
// its scratch, as the value type rounds them), in units of 2^-32 rounded half up, as the CPU's
// ei_attn_track adds them. The counters are 64-bit integers as (lo, hi) words: sums of
// integers, exact, so neither the order of the heads nor that of the layers matters, and one
// invocation owns each counter (no atomics).
layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Scratch { float sc[]; };   // (tokens, n_head, 2, max_keys)
layout(std430, binding = 1) readonly buffer Tokens { uint tk[]; };     // (n_batch, 2): first counter, keys
layout(std430, binding = 2) buffer Counters { uint ctr[]; };           // (sequences * n_ctx, 2): lo, hi

layout(push_constant) uniform Push {
    uint t0, n_tokens;  // the dispatch's tokens [t0, t0 + n_tokens) of the step
    uint n_head, max_keys;
    uint c0, n_counters; // the counters the tokens reach
} p;

// floor(prob * 2^32 + 0.5) for 0 <= prob <= 1, exactly: (lo, hi)
uvec2 fixed_point(float prob) {
    const uint b = floatBitsToUint(prob), e = (b >> 23) & 0xFFu;
    if (e == 0u) return uvec2(0u); // zero, or subnormal: far below 2^-33
    const uint m = (b & 0x7FFFFFu) | 0x800000u;  // prob = m * 2^(e - 150)
    const int sh = int(e) - 150 + 32;            // value = m * 2^sh
    if (sh >= 0) // m < 2^24, sh <= 9 (prob <= 1): up to 2^32, past the low word
        return uvec2(m << uint(sh), sh == 0 ? 0u : m >> uint(32 - sh));
    const int s = -sh;
    if (s >= 26) return uvec2(0u);
    return uvec2((m + (1u << uint(s - 1))) >> uint(s), 0u);
}

void main() {
    // every counter of the range, however many workgroups the device allows
    for (uint i = gl_GlobalInvocationID.x; i < p.n_counters; i += gl_NumWorkGroups.x * 64u) {
        const uint c = p.c0 + i;
        uint lo = ctr[2u * c], hi = ctr[2u * c + 1u];
        for (uint j = 0u; j < p.n_tokens; j++) {
            const uint first = tk[2u * (p.t0 + j)], n = tk[2u * (p.t0 + j) + 1u];
            if (c < first || c >= first + n) continue;
            for (uint h = 0u; h < p.n_head; h++) {
                const uvec2 v = fixed_point(sc[(j * p.n_head + h) * 2u * p.max_keys + (c - first)]);
                const uint sum = lo + v.x;
                hi += v.y + (sum < lo ? 1u : 0u);
                lo = sum;
            }
        }
        ctr[2u * c] = lo;
        ctr[2u * c + 1u] = hi;
    }
}
