// Weight decoders: dequant32(row_byte_offset, s, w) writes sub-block s (values 32s .. 32s+31)
// of the row that starts at row_byte_offset of W, as floats computed in the order of
// simd/ref/quants.c's row decoders (and 'precise', so no contraction changes a rounding):
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

#if defined(TYPE_F32)
void dequant32(uint row, uint s, inout float w[32]) {
    const uint o = (row >> 2) + s * 32u;
    for (uint i = 0u; i < 32u; i++) w[i] = uintBitsToFloat(W[o + i]);
}
#elif defined(TYPE_F16) || defined(TYPE_BF16)
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
void dequant32(uint row, uint s, inout float w[32]) {
    const uint b = row + s * 34u;
    const float d = f16_at(b);
    for (uint k = 0u; k < 8u; k++) {
        const uint q = u32_at(b + 2u + 4u * k);
        for (uint i = 0u; i < 4u; i++) {
            precise float v = d * float(bitfieldExtract(int(q), int(8u * i), 8));
            w[4u * k + i] = v;
        }
    }
}
#elif defined(TYPE_Q4_0) || defined(TYPE_Q4_1) || defined(TYPE_Q5_0) || defined(TYPE_Q5_1)
// Q4_0 d, qs[16] (18 bytes); Q4_1 d, m, qs[16] (20); Q5_0 d, qh[4], qs[16] (22); Q5_1 d, m, qh[4], qs[16] (24)
#if defined(TYPE_Q4_0)
#define BLOCK 18u
#define QS 2u
#elif defined(TYPE_Q4_1)
#define BLOCK 20u
#define QS 4u
#elif defined(TYPE_Q5_0)
#define BLOCK 22u
#define QS 6u
#define QH 2u
#else
#define BLOCK 24u
#define QS 8u
#define QH 4u
#endif
void dequant32(uint row, uint s, inout float w[32]) {
    const uint b = row + s * BLOCK;
    const float d = f16_at(b);
#if defined(QH)
    const uint qh = u32_at(b + QH);
#endif
    for (uint k = 0u; k < 4u; k++) {
        const uint q = u32_at(b + QS + 4u * k);
        for (uint i = 0u; i < 4u; i++) {
            const uint j = 4u * k + i;
            int lo = int((q >> (8u * i)) & 0xFu), hi = int((q >> (8u * i + 4u)) & 0xFu);
#if defined(QH)
            lo |= int((qh >> j) & 1u) << 4;
            hi |= int((qh >> (j + 16u)) & 1u) << 4;
#endif
#if defined(TYPE_Q4_0)
            lo -= 8; hi -= 8;
#elif defined(TYPE_Q5_0)
            lo -= 16; hi -= 16;
#endif
#if defined(TYPE_Q4_1) || defined(TYPE_Q5_1)
            const float m = f16_at(b + 2u);
            precise float a = d * float(lo) + m, c = d * float(hi) + m;
#else
            precise float a = d * float(lo), c = d * float(hi);
#endif
            w[j] = a;
            w[j + 16u] = c;
        }
    }
}
#elif defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
// d, dmin, scales[12], (Q5_K: qh[32],) qs[128]: 144 / 176 bytes for 256 values in 8 sub-blocks
#if defined(TYPE_Q4_K)
#define BLOCK 144u
#define QS 16u
#else
#define BLOCK 176u
#define QS 48u
#define QH 16u
#endif
void dequant32(uint row, uint s, inout float w[32]) {
    const uint b = row + (s >> 3) * BLOCK, j = s & 7u;
    const float d = f16_at(b), dmin = f16_at(b + 2u);
    uint sc, mn;
    if (j < 4u) {
        sc = u8_at(b + 4u + j) & 63u;
        mn = u8_at(b + 8u + j) & 63u;
    } else {
        sc = (u8_at(b + 8u + j) & 0xFu) | ((u8_at(b + j) >> 6) << 4);
        mn = (u8_at(b + 8u + j) >> 4) | ((u8_at(b + 4u + j) >> 6) << 4);
    }
    precise float ds = d * float(sc), dm = dmin * float(mn);
    const uint qs = b + QS + 32u * (j >> 1), shift = 4u * (j & 1u);
    for (uint k = 0u; k < 8u; k++) {
        const uint q = u32_at(qs + 4u * k);
#if defined(QH)
        const uint h = u32_at(b + QH + 4u * k);
#endif
        for (uint i = 0u; i < 4u; i++) {
            uint v = (q >> (8u * i + shift)) & 0xFu;
#if defined(QH)
            v |= ((h >> (8u * i + j)) & 1u) << 4;
#endif
            precise float x = ds * float(v) - dm;
            w[4u * k + i] = x;
        }
    }
}
#elif defined(TYPE_Q6_K)
// ql[128], qh[64], scales[16] (int8), d: 210 bytes for 256 values
void dequant32(uint row, uint s, inout float w[32]) {
    const uint b = row + (s >> 3) * 210u, j = s & 7u, half_ = j >> 2, c = j & 3u;
    const float d = f16_at(b + 208u);
    const uint ql = b + 64u * half_ + 32u * (c & 1u), lshift = 4u * (c >> 1);
    const uint qh = b + 128u + 32u * half_, hshift = 2u * c;
    const uint so = b + 192u + 8u * half_ + 2u * c;
    precise float d0 = d * float(bitfieldExtract(int(u8_at(so)), 0, 8));
    precise float d1 = d * float(bitfieldExtract(int(u8_at(so + 1u)), 0, 8));
    for (uint k = 0u; k < 8u; k++) {
        const uint lo = u32_at(ql + 4u * k), hi = u32_at(qh + 4u * k);
        for (uint i = 0u; i < 4u; i++) {
            const int q = int(((lo >> (8u * i + lshift)) & 0xFu) | (((hi >> (8u * i + hshift)) & 3u) << 4)) - 32;
            precise float x = (k < 4u ? d0 : d1) * float(q);
            w[4u * k + i] = x;
        }
    }
}
#else
#error "quants.glsl: no TYPE_* defined"
#endif
