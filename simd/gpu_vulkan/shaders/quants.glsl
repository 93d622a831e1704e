// Weight decoders. For a block type, unpack32(row, s, q, k) gives sub-block s (values 32s ..
// 32s+31) of the row that starts at byte row of W as integers q and their scales k, as
// simd/ref/quants.c unpacks them; dequant32(row, s, w) the same values as floats, computed in
// the order of its row decoders (and 'precise', so no contraction changes a rounding):
// decoding is exact against the scalar reference. The blocks are GGUF's, as uploaded; W is
// read as 32-bit words so that no 8- or 16-bit storage feature is needed.
// The includer declares W (uint[]) and defines one of the TYPE_* macros.

uint u8_at(uint o) { return (W[o >> 2] >> ((o & 3u) * 8u)) & 0xFFu; }
uint u16_at(uint o) { return (W[o >> 2] >> ((o & 2u) * 8u)) & 0xFFFFu; } // o even
float f16_at(uint o) { return unpackHalf2x16(u16_at(o)).x; }
uint u32_at(uint o) { // o even
    const uint w = W[o >> 2];
    return (o & 2u) == 0u ? w : (w >> 16) | (W[(o >> 2) + 1u] << 16);
}

// the scales of an unpacked sub-block: legacy blocks value = d * q (+ m); K blocks value =
// (d * sc[h]) * q - dmin * mn[h], for the half h (16 values) the value lies in
struct scales32 {
    float d, m;   // legacy: d and the _1 types' m; K: the super-block's d and dmin
    ivec2 sc, mn; // K: each half's integer scale and minimum (legacy: 1 and 0)
};

#if defined(TYPE_F32)
#define FLOAT_ROWS 1
void dequant32(uint row, uint s, inout float w[32]) {
    const uint o = (row >> 2) + s * 32u;
    for (uint i = 0u; i < 32u; i++) w[i] = uintBitsToFloat(W[o + i]);
}
#elif defined(TYPE_F16) || defined(TYPE_BF16)
#define FLOAT_ROWS 1
void dequant32(uint row, uint s, inout float w[32]) {
    const uint o = row + s * 64u;
    for (uint i = 0u; i < 16u; i++) {
        const uint v = u32_at(o + 4u * i);
#if defined(TYPE_F16)
        const vec2 h = unpackHalf2x16(v);
        w[2u * i] = h.x;
        w[2u * i + 1u] = h.y;
#else
        w[2u * i] = uintBitsToFloat(v << 16);
        w[2u * i + 1u] = uintBitsToFloat(v & 0xFFFF0000u);
#endif
    }
}
#elif defined(TYPE_Q8_0) // d, qs[32]: 34 bytes
#define LEGACY 1
void unpack32(uint row, uint s, inout int q[32], out scales32 k) {
    const uint b = row + s * 34u;
    k = scales32(f16_at(b), 0.0, ivec2(1), ivec2(0));
    for (uint w = 0u; w < 8u; w++) {
        const uint v = u32_at(b + 2u + 4u * w);
        for (uint i = 0u; i < 4u; i++) q[4u * w + i] = bitfieldExtract(int(v), int(8u * i), 8);
    }
}
#elif defined(TYPE_Q4_0) || defined(TYPE_Q4_1) || defined(TYPE_Q5_0) || defined(TYPE_Q5_1)
// Q4_0 d, qs[16] (18 bytes); Q4_1 d, m, qs[16] (20); Q5_0 d, qh[4], qs[16] (22); Q5_1 d, m, qh[4], qs[16] (24)
#define LEGACY 1
#if defined(TYPE_Q4_0)
#define BLOCK 18u
#define QS 2u
#elif defined(TYPE_Q4_1)
#define BLOCK 20u
#define QS 4u
#define MIN 1
#elif defined(TYPE_Q5_0)
#define BLOCK 22u
#define QS 6u
#define QH 2u
#else
#define BLOCK 24u
#define QS 8u
#define QH 4u
#define MIN 1
#endif
void unpack32(uint row, uint s, inout int q[32], out scales32 k) {
    const uint b = row + s * BLOCK;
#if defined(MIN)
    k = scales32(f16_at(b), f16_at(b + 2u), ivec2(1), ivec2(0));
#else
    k = scales32(f16_at(b), 0.0, ivec2(1), ivec2(0));
#endif
#if defined(QH)
    const uint qh = u32_at(b + QH);
#endif
    for (uint w = 0u; w < 4u; w++) {
        const uint v = u32_at(b + QS + 4u * w);
        for (uint i = 0u; i < 4u; i++) {
            const uint j = 4u * w + i;
            int lo = int((v >> (8u * i)) & 0xFu), hi = int((v >> (8u * i + 4u)) & 0xFu);
#if defined(QH)
            lo |= int((qh >> j) & 1u) << 4;
            hi |= int((qh >> (j + 16u)) & 1u) << 4;
#endif
#if defined(TYPE_Q4_0)
            lo -= 8; hi -= 8;
#elif defined(TYPE_Q5_0)
            lo -= 16; hi -= 16;
#endif
            q[j] = lo;
            q[j + 16u] = hi;
        }
    }
}
#elif defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
// d, dmin, scales[12], (Q5_K: qh[32],) qs[128]: 144 / 176 bytes for 256 values in 8 sub-blocks
#define KQUANT 1
#if defined(TYPE_Q4_K)
#define BLOCK 144u
#define QS 16u
#else
#define BLOCK 176u
#define QS 48u
#define QH 16u
#endif
void unpack32(uint row, uint s, inout int q[32], out scales32 k) {
    const uint b = row + (s >> 3) * BLOCK, j = s & 7u;
    uint sc, mn;
    if (j < 4u) {
        sc = u8_at(b + 4u + j) & 63u;
        mn = u8_at(b + 8u + j) & 63u;
    } else {
        sc = (u8_at(b + 8u + j) & 0xFu) | ((u8_at(b + j) >> 6) << 4);
        mn = (u8_at(b + 8u + j) >> 4) | ((u8_at(b + 4u + j) >> 6) << 4);
    }
    k = scales32(f16_at(b), f16_at(b + 2u), ivec2(int(sc)), ivec2(int(mn)));
    const uint qs = b + QS + 32u * (j >> 1), shift = 4u * (j & 1u);
    for (uint w = 0u; w < 8u; w++) {
        const uint v = u32_at(qs + 4u * w);
#if defined(QH)
        const uint h = u32_at(b + QH + 4u * w);
#endif
        for (uint i = 0u; i < 4u; i++) {
            uint x = (v >> (8u * i + shift)) & 0xFu;
#if defined(QH)
            x |= ((h >> (8u * i + j)) & 1u) << 4;
#endif
            q[4u * w + i] = int(x);
        }
    }
}
#elif defined(TYPE_Q2_K) || defined(TYPE_Q3_K)
// Q2_K scales[16] (4-bit scale, 4-bit min), qs[64], d, dmin: 84 bytes; Q3_K hmask[32], qs[64],
// scales[12] (16 6-bit scales), d: 110 bytes. 2-bit values: q[128 h + 32 s + l] is bits 2s of
// qs[32 h + l]; Q3_K takes 4 away where hmask[l]'s bit 4h + s is clear. Scales per 16 values.
#define KQUANT 1
void unpack32(uint row, uint s, inout int q[32], out scales32 k) {
    const uint j8 = s & 7u, h = j8 >> 2, s2 = j8 & 3u;
#if defined(TYPE_Q2_K)
    const uint b = row + (s >> 3) * 84u, qs = b + 16u;
    k = scales32(f16_at(b + 80u), f16_at(b + 82u), ivec2(0), ivec2(0));
#else
    const uint b = row + (s >> 3) * 110u, qs = b + 32u;
    k = scales32(f16_at(b + 108u), 0.0, ivec2(0), ivec2(0));
#endif
    for (uint half16 = 0u; half16 < 2u; half16++) {
        const uint j = 8u * h + 2u * s2 + half16; // the scale's index: 16 values each
#if defined(TYPE_Q2_K)
        const uint sm = u8_at(b + j);
        k.sc[half16] = int(sm & 0xFu);
        k.mn[half16] = int(sm >> 4);
#else
        const uint lo = j < 8u ? u8_at(b + 96u + j) & 0xFu : u8_at(b + 96u + j - 8u) >> 4;
        const uint hi = (u8_at(b + 104u + (j & 3u)) >> (2u * (j >> 2))) & 3u;
        k.sc[half16] = int(lo | (hi << 4)) - 32;
#endif
        for (uint l = 16u * half16; l < 16u * half16 + 16u; l++) {
            int x = int((u8_at(qs + 32u * h + l) >> (2u * s2)) & 3u);
#if defined(TYPE_Q3_K)
            if (((u8_at(b + l) >> (4u * h + s2)) & 1u) == 0u) x -= 4;
#endif
            q[l] = x;
        }
    }
}
#elif defined(TYPE_Q6_K)
// ql[128], qh[64], scales[16] (int8), d: 210 bytes for 256 values
#define KQUANT 1
void unpack32(uint row, uint s, inout int q[32], out scales32 k) {
    const uint b = row + (s >> 3) * 210u, j = s & 7u, half_ = j >> 2, c = j & 3u;
    const uint ql = b + 64u * half_ + 32u * (c & 1u), lshift = 4u * (c >> 1);
    const uint qh = b + 128u + 32u * half_, hshift = 2u * c;
    const uint so = b + 192u + 8u * half_ + 2u * c;
    k = scales32(f16_at(b + 208u), 0.0, ivec2(bitfieldExtract(int(u8_at(so)), 0, 8), bitfieldExtract(int(u8_at(so + 1u)), 0, 8)),
                 ivec2(0));
    for (uint w = 0u; w < 8u; w++) {
        const uint lo = u32_at(ql + 4u * w), hi = u32_at(qh + 4u * w);
        for (uint i = 0u; i < 4u; i++)
            q[4u * w + i] = int(((lo >> (8u * i + lshift)) & 0xFu) | (((hi >> (8u * i + hshift)) & 3u) << 4)) - 32;
    }
}
#else
#error "quants.glsl: no TYPE_* defined"
#endif

#if !defined(FLOAT_ROWS)
void dequant32(uint row, uint s, inout float w[32]) {
    int q[32];
    scales32 k;
    unpack32(row, s, q, k);
    for (uint i = 0u; i < 32u; i++) {
#if defined(KQUANT)
        const uint h = i >> 4;
        precise float ds = k.d * float(k.sc[h]), dm = k.m * float(k.mn[h]);
        precise float v = ds * float(q[i]) - dm;
#elif defined(MIN)
        precise float v = k.d * float(q[i]) + k.m;
#else
        precise float v = k.d * float(q[i]);
#endif
        w[i] = v;
    }
}
#endif
