/* avx512 KIVI cache kernels, bit for bit the reference's (common/kivi.h states the roundings).
 *
 * As the AVX2 variant, with 16 lanes: key dots one lane per token, each adding u[d] * code
 * in the reference's order of d; the key quantizer one lane per channel over the G rows in
 * order; a value group's extremes are order-free. Codes come out of their words by variable
 * shifts and go back in by shifts and ORs. */
#include <math.h>

#include "../common/kivi.h"
#include "blocks.h"

EI_INLINE uint32_t load_u32(const uint8_t *p) { uint32_t w; memcpy(&w, p, 4); return w; }

/* lane i: the bit where code i of 16 starts in the word spread16 gives it */
EI_INLINE __m512i shifts16(int bits) {
    return bits == 2 ? _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
                     : _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
}

/* lane i: the 32-bit word holding code i of the 16 codes at p */
EI_INLINE __m512i spread16(const uint8_t *p, int bits) {
    if (bits == 2) return _mm512_set1_epi32((int)load_u32(p));
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32((int)load_u32(p))),
                              _mm256_set1_epi32((int)load_u32(p + 4)), 1);
}

/* the 16 codes at p as floats */
EI_INLINE __m512 codes16(const uint8_t *p, __m512i shifts, int bits) {
    const __m512i mask = _mm512_set1_epi32((1 << bits) - 1);
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(spread16(p, bits), shifts), mask));
}

EI_INLINE __mmask16 usable_lanes(__m512 s) {
    return _mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_GT_OQ) &
           _mm512_cmp_ps_mask(s, _mm512_set1_ps(INFINITY), _CMP_LT_OQ);
}

/* the reference's clamp(rint((x - z) / s), 0, qmax), NaN to 0 (max_ps returns its second
 * operand on NaN), 0 outside the usable lanes */
EI_INLINE __m512i codes_of(__m512 x, __m512 z, __m512 s, __mmask16 usable, int bits) {
    const __m512 r = _mm512_roundscale_ps(_mm512_div_ps(_mm512_sub_ps(x, z), s),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 c = _mm512_min_ps(_mm512_max_ps(r, _mm512_setzero_ps()), _mm512_set1_ps((float)((1 << bits) - 1)));
    return _mm512_maskz_mov_epi32(usable, _mm512_cvtps_epi32(c)); /* c is whole: exact */
}

/* the OR of 8 lanes */
EI_INLINE uint32_t or_lanes8(__m256i v) {
    __m128i s = _mm_or_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_or_si128(s, _mm_unpackhi_epi64(s, s));
    s = _mm_or_si128(s, _mm_shuffle_epi32(s, 0xb1));
    return (uint32_t)_mm_cvtsi128_si32(s);
}

/* ---- keys -------------------------------------------------------------------------------- */

/* channels d0..d0+15 of a K block, one lane each */
static void quantize_k_tile(int bits, int group, int hd, const ei_f16 *rows, size_t row_bytes, int d0,
                            uint8_t *block) {
    const uint8_t *base = (const uint8_t *)rows + 2 * (size_t)d0;
    __m512 mn = _mm512_set1_ps(INFINITY), mx = _mm512_set1_ps(-INFINITY);
    for (int t = 0; t < group; t++) {
        const __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(base + (size_t)t * row_bytes)));
        mn = _mm512_min_ps(x, mn);
        mx = _mm512_max_ps(x, mx);
    }
    float lo[16], hi[16];
    _mm512_storeu_ps(lo, mn);
    _mm512_storeu_ps(hi, mx);
    for (int i = 0; i < 16; i++) {
        ei_f16 sh, zh;
        ei_kivi_params(lo[i], hi[i], bits, &sh, &zh);
        ei_kivi_put_f16(block + 2 * (size_t)(d0 + i), sh);
        ei_kivi_put_f16(block + 2 * ((size_t)hd + d0 + i), zh);
    }
    const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(block + 2 * (size_t)d0)));
    const __m512 z = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(block + 2 * ((size_t)hd + d0))));
    const __mmask16 usable = usable_lanes(s);
    const size_t cb = ei_kivi_k_channel_bytes(bits, group);
    uint8_t *codes = block + 4 * (size_t)hd + (size_t)d0 * cb;
    __m512i word = _mm512_setzero_si512(); /* lane i: the next 32 bits of channel d0 + i */
    for (int t = 0; t < group; t++) {
        const __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(base + (size_t)t * row_bytes)));
        const __m512i c = codes_of(x, z, s, usable, bits);
        word = _mm512_or_si512(word, _mm512_sllv_epi32(c, _mm512_set1_epi32(t * bits % 32)));
        if ((t + 1) * bits % 32 == 0) {
            uint32_t w[16];
            _mm512_storeu_si512(w, word);
            for (int i = 0; i < 16; i++) memcpy(codes + (size_t)i * cb + (size_t)(t * bits / 32) * 4, &w[i], 4);
            word = _mm512_setzero_si512();
        }
    }
}

static void avx512_kivi_quantize_k(int bits, int group, int hd, const ei_f16 *rows, size_t row_bytes,
                                   uint8_t *block) {
    int d = 0;
    for (; d + 16 <= hd; d += 16) quantize_k_tile(bits, group, hd, rows, row_bytes, d, block);
    for (; d < hd; d++) ei_kivi_quantize_k_channel(bits, group, hd, rows, row_bytes, d, block);
}

/* out[i] = the dot of token tok + i, i < 16 nv (tok a multiple of 32): lane i of vector v is
 * token tok + 16 v + i, whose code starts at byte 2 v bits of the run's codes */
EI_INLINE void k_dots_run(int bits, int nv, int group, int hd, const uint8_t *block, const float *u, float zsum,
                          int tok, float *out) {
    const size_t cb = ei_kivi_k_channel_bytes(bits, group);
    const uint8_t *codes = block + 4 * (size_t)hd + (size_t)tok * bits / 8;
    const __m512i shifts = shifts16(bits);
    __m512 acc[8];
    EI_UNROLL
    for (int v = 0; v < nv; v++) acc[v] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++, codes += cb) {
        const __m512 ud = _mm512_set1_ps(u[d]);
        EI_UNROLL
        for (int v = 0; v < nv; v++)
            acc[v] = _mm512_add_ps(acc[v], _mm512_mul_ps(ud, codes16(codes + 2 * v * bits, shifts, bits)));
    }
    const __m512 z = _mm512_set1_ps(zsum);
    EI_UNROLL
    for (int v = 0; v < nv; v++) _mm512_storeu_ps(out + 16 * v, _mm512_add_ps(acc[v], z));
}

/* 32 << wide tokens from tok (wide 0, 1 or 2), with the bits and the vector count constant */
static void k_dots_chunk(int bits, int wide, int group, int hd, const uint8_t *block, const float *u, float zsum,
                         int tok, float *out) {
    if (bits == 4) {
        if (wide == 2) k_dots_run(4, 8, group, hd, block, u, zsum, tok, out);
        else if (wide == 1) k_dots_run(4, 4, group, hd, block, u, zsum, tok, out);
        else k_dots_run(4, 2, group, hd, block, u, zsum, tok, out);
    } else {
        if (wide == 2) k_dots_run(2, 8, group, hd, block, u, zsum, tok, out);
        else if (wide == 1) k_dots_run(2, 4, group, hd, block, u, zsum, tok, out);
        else k_dots_run(2, 2, group, hd, block, u, zsum, tok, out);
    }
}

static void avx512_kivi_k_dots(int bits, int group, int hd, const uint8_t *block, int t0, int n, const float *q,
                               float *dots) {
    float u[EI_MAX_HEAD_DIM];     /* (hd) q[d] * s'[d] */
    float all[EI_KIVI_MAX_GROUP]; /* (G) the dots of the chunks the slice touches */
    int d = 0;
    for (; d + 16 <= hd; d += 16) {
        const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(block + 2 * (size_t)d)));
        _mm512_storeu_ps(u + d, _mm512_mul_ps(_mm512_loadu_ps(q + d), s));
    }
    ei_kivi_k_query_tail(hd, block, q, d, u);
    const float zsum = ei_kivi_k_zsum(hd, block, q);
    for (int tok = t0 / 32 * 32; tok < t0 + n;) {
        int wide = 0; /* the widest run inside the group that the slice needs more than half of */
        while (wide < 2 && tok + (64 << wide) <= group && tok + (32 << wide) < t0 + n) wide++;
        k_dots_chunk(bits, wide, group, hd, block, u, zsum, tok, all + tok);
        tok += 32 << wide;
    }
    if (n > 0) memcpy(dots, all + t0, sizeof(float) * (size_t)n);
}

/* ---- values ------------------------------------------------------------------------------ */

/* one V group of gv values, gv a multiple of 16 */
static void quantize_v_group(int bits, int gv, const ei_f16 *x, uint8_t *grp) {
    __m512 mn = _mm512_set1_ps(INFINITY), mx = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < gv; i += 16) {
        const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i)));
        mn = _mm512_min_ps(v, mn);
        mx = _mm512_max_ps(v, mx);
    }
    float lo[16], hi[16], l = INFINITY, h = -INFINITY;
    _mm512_storeu_ps(lo, mn);
    _mm512_storeu_ps(hi, mx);
    for (int i = 0; i < 16; i++) { l = ei_kivi_lo(l, lo[i]); h = ei_kivi_hi(h, hi[i]); }
    ei_f16 sh, zh;
    ei_kivi_params(l, h, bits, &sh, &zh);
    ei_kivi_put_f16(grp, sh);
    ei_kivi_put_f16(grp + 2, zh);
    const __m512 s = _mm512_set1_ps(ei_fp16_to_fp32(sh)), z = _mm512_set1_ps(ei_fp16_to_fp32(zh));
    const __mmask16 usable = usable_lanes(s);
    const __m512i shifts = shifts16(bits);
    for (int i = 0; i < gv; i += 16) {
        const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i)));
        const __m512i packed = _mm512_sllv_epi32(codes_of(v, z, s, usable, bits), shifts);
        const __m256i lo8 = _mm512_castsi512_si256(packed), hi8 = _mm512_extracti64x4_epi64(packed, 1);
        uint8_t *c = grp + 4 + (size_t)i * bits / 8;
        if (bits == 2) {
            const uint32_t w = or_lanes8(_mm256_or_si256(lo8, hi8)); /* 16 codes: one word */
            memcpy(c, &w, 4);
        } else {
            const uint32_t w0 = or_lanes8(lo8), w1 = or_lanes8(hi8);
            memcpy(c, &w0, 4);
            memcpy(c + 4, &w1, 4);
        }
    }
}

static void avx512_kivi_quantize_v(int bits, int group, int hdv, const ei_f16 *x, uint8_t *row) {
    ei_kivi_quantize_v_row(bits, group, hdv, x, row, 16, quantize_v_group);
}

static void decode_v_group(int bits, int gv, const uint8_t *grp, float *out) {
    const __m512 s = _mm512_set1_ps(ei_kivi_f16_at(grp)), z = _mm512_set1_ps(ei_kivi_f16_at(grp + 2));
    const __m512i shifts = shifts16(bits);
    int i = 0;
    for (; i + 16 <= gv; i += 16) {
        const __m512 code = codes16(grp + 4 + (size_t)i * bits / 8, shifts, bits);
        _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_mul_ps(s, code), z));
    }
    ei_kivi_decode_v_tail(bits, gv, grp, i, out);
}

static void avx512_kivi_decode_v(int bits, int group, int hdv, const uint8_t *rows, size_t row_bytes,
                              int m, float *out) {
    ei_kivi_decode_v_rows(bits, group, hdv, rows, row_bytes, m, out, decode_v_group);
}

void ei_avx512_kivi_kernels(ei_kernels *k) {
    k->kivi_quantize_k = avx512_kivi_quantize_k;
    k->kivi_k_dots = avx512_kivi_k_dots;
    k->kivi_quantize_v = avx512_kivi_quantize_v;
    k->kivi_decode_v = avx512_kivi_decode_v;
}
