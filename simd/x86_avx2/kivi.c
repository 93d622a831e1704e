/* AVX2 KIVI cache kernels, bit for bit the reference's (common/kivi.h states the roundings).
 *
 * Key dots run one lane per token: a channel's codes are contiguous across tokens, so one
 * 32-bit word of them becomes 8 codes by variable shifts, and every lane adds u[d] * code
 * in the reference's order of d (a float product, then a float sum). The key quantizer runs
 * one lane per channel over the G rows in order, as the reference does; a value group's
 * extremes do not depend on the order they are found in. Codes are packed by shifts. */
#include "../common/kivi.h"
#include "simd.h"

EI_AVX2_INLINE uint32_t load_u32(const uint8_t *p) { uint32_t w; memcpy(&w, p, 4); return w; }
EI_AVX2_INLINE uint32_t load_u16(const uint8_t *p) { uint16_t w; memcpy(&w, p, 2); return w; }

/* lane i: base + bits * i, the bit where the i-th code of 8 starts */
EI_AVX2_INLINE __m256i shifts8(int base, int bits) {
    return _mm256_setr_epi32(base, base + bits, base + 2 * bits, base + 3 * bits, base + 4 * bits,
                             base + 5 * bits, base + 6 * bits, base + 7 * bits);
}

/* the 8 codes of w at bits shifts[i] as floats */
EI_AVX2_INLINE __m256 codes8(uint32_t w, __m256i shifts, int bits) {
    const __m256i mask = _mm256_set1_epi32((1 << bits) - 1);
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), shifts), mask));
}

/* the OR of the 8 lanes */
EI_AVX2_INLINE uint32_t or_lanes(__m256i v) {
    __m128i s = _mm_or_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_or_si128(s, _mm_unpackhi_epi64(s, s));
    s = _mm_or_si128(s, _mm_shuffle_epi32(s, 0xb1));
    return (uint32_t)_mm_cvtsi128_si32(s);
}

/* codes of x under zero z and scale s (usable lanes set in `usable`): the reference's
 * clamp(rint((x - z) / s), 0, qmax), NaN to 0 (max_ps returns its second operand on NaN) */
EI_AVX2_INLINE __m256i codes_of(__m256 x, __m256 z, __m256 s, __m256 usable, int bits) {
    const __m256 r = _mm256_round_ps(_mm256_div_ps(_mm256_sub_ps(x, z), s),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 c = _mm256_min_ps(_mm256_max_ps(r, _mm256_setzero_ps()), _mm256_set1_ps((float)((1 << bits) - 1)));
    return _mm256_cvttps_epi32(_mm256_and_ps(c, usable));
}

EI_AVX2_INLINE __m256 usable_lanes(__m256 s) {
    return _mm256_and_ps(_mm256_cmp_ps(s, _mm256_setzero_ps(), _CMP_GT_OQ),
                         _mm256_cmp_ps(s, _mm256_set1_ps(INFINITY), _CMP_LT_OQ));
}

/* ---- keys -------------------------------------------------------------------------------- */

/* channels d0..d0+7 of a K block, one lane each */
static void quantize_k_tile(int bits, int group, int hd, const ei_f16 *rows, size_t row_bytes, int d0,
                            uint8_t *block) {
    const uint8_t *base = (const uint8_t *)rows + 2 * (size_t)d0;
    __m256 mn = _mm256_set1_ps(INFINITY), mx = _mm256_set1_ps(-INFINITY);
    for (int t = 0; t < group; t++) {
        const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(base + (size_t)t * row_bytes)));
        mn = _mm256_min_ps(x, mn);
        mx = _mm256_max_ps(x, mx);
    }
    float lo[8], hi[8];
    _mm256_storeu_ps(lo, mn);
    _mm256_storeu_ps(hi, mx);
    for (int i = 0; i < 8; i++) {
        ei_f16 sh, zh;
        ei_kivi_params(lo[i], hi[i], bits, &sh, &zh);
        ei_kivi_put_f16(block + 2 * (size_t)(d0 + i), sh);
        ei_kivi_put_f16(block + 2 * ((size_t)hd + d0 + i), zh);
    }
    const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(block + 2 * (size_t)d0)));
    const __m256 z = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(block + 2 * ((size_t)hd + d0))));
    const __m256 usable = usable_lanes(s);
    const size_t cb = ei_kivi_k_channel_bytes(bits, group);
    uint8_t *codes = block + 4 * (size_t)hd + (size_t)d0 * cb;
    __m256i word = _mm256_setzero_si256(); /* lane i: the next 32 bits of channel d0 + i */
    for (int t = 0; t < group; t++) {
        const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(base + (size_t)t * row_bytes)));
        const __m256i c = codes_of(x, z, s, usable, bits);
        word = _mm256_or_si256(word, _mm256_sllv_epi32(c, _mm256_set1_epi32(t * bits % 32)));
        if ((t + 1) * bits % 32 == 0) {
            uint32_t w[8];
            _mm256_storeu_si256((__m256i *)w, word);
            for (int i = 0; i < 8; i++) memcpy(codes + (size_t)i * cb + (size_t)(t * bits / 32) * 4, &w[i], 4);
            word = _mm256_setzero_si256();
        }
    }
}

static void avx2_kivi_quantize_k(int bits, int group, int hd, const ei_f16 *rows, size_t row_bytes,
                                 uint8_t *block) {
    int d = 0;
    for (; d + 8 <= hd; d += 8) quantize_k_tile(bits, group, hd, rows, row_bytes, d, block);
    for (; d < hd; d++) ei_kivi_quantize_k_channel(bits, group, hd, rows, row_bytes, d, block);
}

/* out[i] = the dot of token tok + i, i < 8 nv (tok a multiple of 32): lane i of vector v is
 * token tok + 8 v + i, whose code starts at bit 8 v bits of the chunk's codes */
EI_AVX2_INLINE void k_dots_run(int bits, int nv, int group, int hd, const uint8_t *block, const float *u,
                               float zsum, int tok, float *out) {
    const size_t cb = ei_kivi_k_channel_bytes(bits, group);
    const uint8_t *codes = block + 4 * (size_t)hd + (size_t)tok * bits / 8;
    const __m256i sh0 = shifts8(0, bits), sh16 = shifts8(16, bits);
    __m256 acc[8];
    EI_UNROLL
    for (int v = 0; v < nv; v++) acc[v] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d++, codes += cb) {
        const __m256 ud = _mm256_set1_ps(u[d]);
        EI_UNROLL
        for (int v = 0; v < nv; v++) {
            const int bit = 8 * v * bits;
            const __m256 c = codes8(load_u32(codes + bit / 32 * 4), bit % 32 ? sh16 : sh0, bits);
            acc[v] = _mm256_add_ps(acc[v], _mm256_mul_ps(ud, c));
        }
    }
    const __m256 z = _mm256_set1_ps(zsum);
    EI_UNROLL
    for (int v = 0; v < nv; v++) _mm256_storeu_ps(out + 8 * v, _mm256_add_ps(acc[v], z));
}

/* 32 or 64 tokens from tok, with the bits and the vector count as constants */
static void k_dots_chunk(int bits, int wide, int group, int hd, const uint8_t *block, const float *u, float zsum,
                         int tok, float *out) {
    if (bits == 4) {
        if (wide) k_dots_run(4, 8, group, hd, block, u, zsum, tok, out);
        else k_dots_run(4, 4, group, hd, block, u, zsum, tok, out);
    } else {
        if (wide) k_dots_run(2, 8, group, hd, block, u, zsum, tok, out);
        else k_dots_run(2, 4, group, hd, block, u, zsum, tok, out);
    }
}

static void avx2_kivi_k_dots(int bits, int group, int hd, const uint8_t *block, int t0, int n, const float *q,
                             float *dots) {
    float u[EI_MAX_HEAD_DIM];        /* (hd) q[d] * s'[d] */
    float all[EI_KIVI_MAX_GROUP];    /* (G) the dots of the chunks the slice touches */
    int d = 0;
    for (; d + 8 <= hd; d += 8) {
        const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(block + 2 * (size_t)d)));
        _mm256_storeu_ps(u + d, _mm256_mul_ps(_mm256_loadu_ps(q + d), s));
    }
    ei_kivi_k_query_tail(hd, block, q, d, u);
    const float zsum = ei_kivi_k_zsum(hd, block, q);
    for (int tok = t0 / 32 * 32; tok < t0 + n;) {
        const int wide = tok + 64 <= group && tok + 32 < t0 + n;
        k_dots_chunk(bits, wide, group, hd, block, u, zsum, tok, all + tok);
        tok += wide ? 64 : 32;
    }
    if (n > 0) memcpy(dots, all + t0, sizeof(float) * (size_t)n);
}

/* ---- values ------------------------------------------------------------------------------ */

/* one V group of gv values, gv a multiple of 8 */
static void quantize_v_group(int bits, int gv, const ei_f16 *x, uint8_t *grp) {
    __m256 mn = _mm256_set1_ps(INFINITY), mx = _mm256_set1_ps(-INFINITY);
    for (int i = 0; i < gv; i += 8) {
        const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        mn = _mm256_min_ps(v, mn);
        mx = _mm256_max_ps(v, mx);
    }
    float lo[8], hi[8], l = INFINITY, h = -INFINITY;
    _mm256_storeu_ps(lo, mn);
    _mm256_storeu_ps(hi, mx);
    for (int i = 0; i < 8; i++) { l = ei_kivi_lo(l, lo[i]); h = ei_kivi_hi(h, hi[i]); }
    ei_f16 sh, zh;
    ei_kivi_params(l, h, bits, &sh, &zh);
    ei_kivi_put_f16(grp, sh);
    ei_kivi_put_f16(grp + 2, zh);
    const __m256 s = _mm256_set1_ps(ei_fp16_to_fp32(sh)), z = _mm256_set1_ps(ei_fp16_to_fp32(zh));
    const __m256 usable = usable_lanes(s);
    const __m256i sh0 = shifts8(0, bits);
    for (int i = 0; i < gv; i += 8) {
        const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        const uint32_t w = or_lanes(_mm256_sllv_epi32(codes_of(v, z, s, usable, bits), sh0));
        memcpy(grp + 4 + (size_t)i * bits / 8, &w, (size_t)bits); /* 8 codes: bits bytes */
    }
}

static void avx2_kivi_quantize_v(int bits, int group, int hdv, const ei_f16 *x, uint8_t *row) {
    ei_kivi_quantize_v_row(bits, group, hdv, x, row, 8, quantize_v_group);
}

static void decode_v_group(int bits, int gv, const uint8_t *grp, float *out) {
    const __m256 s = _mm256_set1_ps(ei_kivi_f16_at(grp)), z = _mm256_set1_ps(ei_kivi_f16_at(grp + 2));
    const __m256i sh0 = shifts8(0, bits);
    int i = 0;
    for (; i + 8 <= gv; i += 8) {
        const uint8_t *c = grp + 4 + (size_t)i * bits / 8;
        const __m256 code = codes8(bits == 4 ? load_u32(c) : load_u16(c), sh0, bits);
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_mul_ps(s, code), z));
    }
    ei_kivi_decode_v_tail(bits, gv, grp, i, out);
}

static void avx2_kivi_decode_v(int bits, int group, int hdv, const uint8_t *rows, size_t row_bytes,
                            int m, float *out) {
    ei_kivi_decode_v_rows(bits, group, hdv, rows, row_bytes, m, out, decode_v_group);
}

void ei_avx2_kivi_kernels(ei_kernels *k) {
    k->kivi_quantize_k = avx2_kivi_quantize_k;
    k->kivi_k_dots = avx2_kivi_k_dots;
    k->kivi_quantize_v = avx2_kivi_quantize_v;
    k->kivi_decode_v = avx2_kivi_decode_v;
}
