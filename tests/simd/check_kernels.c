/* Standalone kernel check: one instruction-set variant against the scalar reference.
 *
 * Built by tests/simd for targets Python cannot load directly: cross-compiled for aarch64
 * and run under qemu, or built against SIMDe to run AVX-512 code on CPUs without it.
 * Compile with the variant's sources and -DEI_CHECK_INIT=<its init function>. Prints one
 * line per failing case and "N passed, M failed"; exits non-zero on any failure.
 *
 * Every kernel must equal the reference exactly: integer results by construction, float
 * results because both round the same exact (double) value once. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_common.h"
#include "../../simd/common/attn_softmax.h"
#include "../../simd/common/kivi.h"

#ifndef EI_CHECK_INIT
#error "define EI_CHECK_INIT as the variant's init function, e.g. ei_kernels_init_neon"
#endif
void EI_CHECK_INIT(ei_kernels *k);

static int passed, failed;

/* inputs of several shapes: plain, with an outlier, tiny, constant, all zero */
static void fill(float *x, int n, int kind) {
    for (int i = 0; i < n; i++) {
        switch (kind) {
        case 0: x[i] = gaussian(); break;
        case 1: x[i] = gaussian() * (i % 37 == 0 ? 40.0f : 1.0f); break;
        case 2: x[i] = gaussian() * 1e-6f; break;
        case 3: x[i] = 0.5f; break;
        default: x[i] = 0.0f; break;
        }
    }
}

static void check_bytes(const char *what, const void *a, const void *b, size_t n) {
    if (memcmp(a, b, n) == 0) { passed++; return; }
    failed++;
    printf("FAIL %s: bytes differ\n", what);
}

static void check_floats(const char *what, const float *a, const float *b, int n) {
    for (int i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], 4) != 0 && !(isnan(a[i]) && isnan(b[i]))) {
            failed++;
            printf("FAIL %s: [%d] variant %.9g reference %.9g\n", what, i, a[i], b[i]);
            return;
        }
    }
    passed++;
}

static const int WEIGHT_TYPES[] = {EI_TYPE_F32, EI_TYPE_F16, EI_TYPE_BF16, EI_TYPE_Q4_0, EI_TYPE_Q4_1,
                                   EI_TYPE_Q5_0, EI_TYPE_Q5_1, EI_TYPE_Q8_0, EI_TYPE_Q2_K, EI_TYPE_Q3_K,
                                   EI_TYPE_Q4_K, EI_TYPE_Q5_K, EI_TYPE_Q6_K};

/* random weight bytes with sane scales: a block's fp16 fields are drawn as small floats */
static void random_weights(int type, uint8_t *w, size_t bytes) {
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)next_u32();
    if (type == EI_TYPE_F32) {
        float *f = (float *)w;
        for (size_t i = 0; i < bytes / 4; i++) f[i] = gaussian();
        return;
    }
    if (type == EI_TYPE_F16 || type == EI_TYPE_BF16) {
        ei_f16 *h = (ei_f16 *)w;
        for (size_t i = 0; i < bytes / 2; i++)
            h[i] = type == EI_TYPE_F16 ? ei_fp32_to_fp16(gaussian()) : ei_fp32_to_bf16(gaussian());
        return;
    }
    set_small_scales(type, w, bytes, 0.01f);
}

/* attn_block (and its scalar reference) against attn over each query's slice of the keys: up to
 * EI_ATTN_BLOCK_QUERIES queries of up to three tokens whose ranges start and end apart (a
 * sliding window's and a causal prompt's), some across the two runs of a ring */
static void check_attn_block(const ei_kernels *ref, const ei_kernels *var, ei_attn_params *ap, const float *q9, int sp) {
    enum { HD = 256 };
    static float got[EI_ATTN_BLOCK_QUERIES * HD], want[HD];
    static double scratch[EI_ATTN_BLOCK_QUERIES * 2 * 64];
    ei_attn_run room[2];
    char what[160];
    const int n = ei_attn_keys(ap);
    for (int nq = 1; nq <= EI_ATTN_BLOCK_QUERIES; nq++)
        for (int shape = 0; shape < 3; shape++) {
            const float *q[EI_ATTN_BLOCK_QUERIES];
            float *out[EI_ATTN_BLOCK_QUERIES];
            int32_t first[EI_ATTN_BLOCK_QUERIES], end[EI_ATTN_BLOCK_QUERIES];
            const int per = shape == 0 ? nq : shape == 1 ? 4 : 1; /* queries of one token */
            const int n_tok = (nq + per - 1) / per;
            for (int i = 0; i < nq; i++) {
                const int tok = i / per;
                q[i] = q9 + i * HD;
                out[i] = got + i * HD;
                end[i] = n - (n_tok - 1 - tok) - (shape == 1 ? 1 : 0); /* a key more each token */
                first[i] = shape == 2 ? tok * 3 % (end[i] - 1) : 0;     /* windows moving on */
            }
            for (int which = 0; which < 2; which++) { /* the reference, then the variant's */
                const ei_attn_block_fn block = which ? var->attn_block : ei_ref_attn_block;
                if (!block) continue;
                ap->kt = which ? var : ref;
                block(ap, nq, q, first, end, out, room, scratch);
                ap->kt = ref;
                for (int i = 0; i < nq; i++) {
                    ei_attn_params sub;
                    ei_attn_slice(ap, first[i], end[i], room, &sub);
                    ref->attn(&sub, q[i], want, scratch);
                    snprintf(what, sizeof(what), "%s nq %d shape %d query %d [%d, %d) k type %d v type %d span %d",
                             which ? "attn_block" : "ref attn_block", nq, shape, i, first[i], end[i], ap->k_type,
                             ap->v_type, sp);
                    check_floats(what, out[i], want, ap->head_dim_v);
                }
            }
        }
}

/* attention over every pair of cache types, a window, and a ring's two runs */
/* attention over head dims of hd (<= 256): queries and outputs 256 floats apart */
static void check_attention(const ei_kernels *ref, const ei_kernels *var, const float *q1, const float *q9, int hd) {
    enum { T = 64, HD = 256 };
    static const int types[4] = {EI_TYPE_F32, EI_TYPE_F16, EI_TYPE_Q8_0, EI_TYPE_Q4_0};
    static uint8_t kc[4][T * HD * 4], vc[4][T * HD * 4];
    static float k32[T * HD], v32[T * HD], ya[HD], yb[HD], gout[9 * HD];
    static double scratch[2 * T], gscratch[9 * 2 * T];
    char what[160];
    for (int i = 0; i < T * HD; i++) { k32[i] = gaussian(); v32[i] = gaussian(); }
    for (int ti = 0; ti < 4; ti++) /* each type's rows, encoded as the engine stores them */
        for (int t = 0; t < T; t++) {
            const size_t rb = ei_row_size(types[ti], hd);
            ref->from_float[types[ti]](k32 + t * HD, kc[ti] + t * rb, hd);
            ref->from_float[types[ti]](v32 + t * HD, vc[ti] + t * rb, hd);
        }
    const int spans[3][4] = {{0, T, 0, 0}, {19, T - 19, 0, 0}, {40, 24, 0, 30}}; /* (start, n) pairs */
    for (int kv = 0; kv < 16; kv++)
        for (int sp = 0; sp < 3; sp++) {
            const int kt = types[kv % 4], vt = types[kv / 4];
            const size_t kr = ei_row_size(kt, hd), vr = ei_row_size(vt, hd);
            ei_attn_run runs[2];
            const int n_runs = spans[sp][3] ? 2 : 1;
            for (int r = 0; r < n_runs; r++)
                runs[r] = (ei_attn_run){kc[kv % 4] + (size_t)spans[sp][2 * r] * kr,
                                        vc[kv / 4] + (size_t)spans[sp][2 * r] * vr, spans[sp][2 * r + 1]};
            ei_attn_params ap = {hd, hd, n_runs, runs, kt, vt, kr, vr, 0.0625f, 0.0f, ref};
            ref->attn(&ap, q1, ya, scratch);
            ap.kt = var;
            var->attn(&ap, q1, yb, scratch);
            snprintf(what, sizeof(what), "attn hd %d k type %d v type %d span %d", hd, kt, vt, sp);
            check_floats(what, yb, ya, hd);
            check_attn_block(ref, var, &ap, q9, sp);
            if (!var->attn_group) continue;
            /* a grouped-query group: up to 9 query heads (more than one pass of 8) */
            for (int nq = 1; nq <= 9; nq++) {
                ap.kt = var;
                var->attn_group(&ap, nq, q9, HD, gout, HD, gscratch);
                ap.kt = ref;
                for (int i = 0; i < nq; i++) {
                    ref->attn(&ap, q9 + i * HD, ya, scratch);
                    snprintf(what, sizeof(what), "attn_group hd %d nq %d query %d k type %d v type %d span %d", hd,
                             nq, i, kt, vt, sp);
                    check_floats(what, gout + i * HD, ya, hd);
                }
            }
        }
}

/* KIVI: key blocks from strided rows, their dots (whole groups and slices), value rows and
 * their decoding, for every bit width and group and heads with and without vector tails */
static void check_kivi(const ei_kernels *ref, const ei_kernels *var) {
    enum { G = EI_KIVI_MAX_GROUP, STRIDE = 264, M = 3, HD = EI_MAX_HEAD_DIM };
    static ei_f16 rows[G * STRIDE];
    static uint8_t ka[HD * (4 + G / 2)], kb[HD * (4 + G / 2)], va[M * HD], vb[M * HD];
    static float q[HD], da[G], db[G], oa[M * HD], ob[M * HD];
    char what[128];
    for (int i = 0; i < G * STRIDE; i++) rows[i] = ei_fp32_to_fp16(gaussian() * (i % 53 == 0 ? 20.0f : 1.0f));
    for (int i = 0; i < HD; i++) q[i] = gaussian();
    const int hds[] = {16, 64, 72, 256};
    for (int bits = 2; bits <= 4; bits += 2)
        for (int group = 32; group <= G; group *= 2) {
            for (size_t h = 0; h < sizeof(hds) / sizeof(hds[0]); h++) {
                const int hd = hds[h];
                const size_t kbytes = ei_kivi_k_block_bytes(bits, group, hd);
                memset(ka, 0x5a, sizeof(ka));
                memset(kb, 0xa5, sizeof(kb));
                ref->kivi_quantize_k(bits, group, hd, rows, 2 * STRIDE, ka);
                var->kivi_quantize_k(bits, group, hd, rows, 2 * STRIDE, kb);
                snprintf(what, sizeof(what), "kivi_quantize_k bits %d group %d hd %d", bits, group, hd);
                check_bytes(what, kb, ka, kbytes);
                const int slices[][2] = {{0, group}, {5, group - 9}, {31, 2}, {group - 1, 1}, {group / 2, group / 2}};
                for (int sl = 0; sl < 5; sl++) {
                    const int t0 = slices[sl][0], n = slices[sl][1];
                    ref->kivi_k_dots(bits, group, hd, ka, t0, n, q, da);
                    var->kivi_k_dots(bits, group, hd, ka, t0, n, q, db);
                    snprintf(what, sizeof(what), "kivi_k_dots bits %d group %d hd %d tokens %d+%d", bits, group,
                             hd, t0, n);
                    check_floats(what, db, da, n);
                }
            }
            for (int hdv = 16; hdv <= 256; hdv *= 2) {
                const size_t rb = ei_kivi_v_row_bytes(bits, group, hdv);
                for (int j = 0; j < M; j++) {
                    ref->kivi_quantize_v(bits, group, hdv, rows + (size_t)j * STRIDE, va + j * rb);
                    var->kivi_quantize_v(bits, group, hdv, rows + (size_t)j * STRIDE, vb + j * rb);
                }
                snprintf(what, sizeof(what), "kivi_quantize_v bits %d group %d hdv %d", bits, group, hdv);
                check_bytes(what, vb, va, M * rb);
                ref->kivi_decode_v(bits, group, hdv, va, rb, M, oa);
                var->kivi_decode_v(bits, group, hdv, va, rb, M, ob);
                snprintf(what, sizeof(what), "kivi_decode_v bits %d group %d hdv %d", bits, group, hdv);
                check_floats(what, ob, oa, M * hdv);
            }
        }
}

/* swiglu in place (y = g, as the engine calls it) over float bit patterns of every exponent
 * (a prime stride through all 2^32, NaNs left out), the edges of a variant's fast path (|g| near
 * 80, zeros, values below the floats' normal range) and gates whose exact value lies next to the
 * midpoint of two floats, where a variant's own exp must give way to libm's: every float with
 * |g| in [2^-10, 80] whose libm value has its 29 bits below a float's mantissa within 16 of 2^28
 * (a search over all of them), which take libm's path. No input can show that path missing with
 * glibc: the AVX2 fast path alone gave glibc's float for every float in 1e-30 <= |g| <= 80
 * (all were compared); the margin keeps that so for a libm up to 2^-41 away. */
static void check_swiglu_sweep(const ei_kernels *ref, const ei_kernels *var) {
    enum { CHUNK = 4096 };
    static float g[CHUNK], u[CHUNK], ya[CHUNK], yb[CHUNK];
    static const float fixed[] = {
        0.0f, -0.0f, 80.0f, -80.0f, 80.00001f, -80.00001f, 1e-38f, -1e-38f, 1e-45f, -88.0f, -104.0f,
        89.0f, 1e30f, -1e30f, INFINITY, -INFINITY, 1e-7f, -3.5f, /* the fast path's edges */
        0x1.f48512p-10f, -0x1.f48512p-10f, 0x1.4b0b3p-7f, -0x1.4b0b3p-7f, 0x1.7ccc2p-7f,
        -0x1.7ccc2p-7f, 0x1.26e18ep-6f, -0x1.26e18ep-6f, 0x1.3359b4p-6f, -0x1.3359b4p-6f,
        0x1.9d4d6p-2f, -0x1.9d4d6p-2f, -0x1.c1071p-2f, -0x1.a0664p-1f, 0x1.f17634p-1f,
        0x1.f5a86ap-1f, 0x1.252184p+0f, 0x1.5ff36p+1f, -0x1.51f626p+2f, 0x1.4c4efep+3f,
        -0x1.5e7a28p+3f, -0x1.7b532ap+3f, -0x1.dc834p+4f};
    int n = 0, chunks = 0;
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) g[n++] = fixed[i];
    for (uint64_t b = 0; b <= 0xFFFFFFFFu; b += 65521) {
        const uint32_t v = (uint32_t)b;
        if ((v & 0x7F800000) == 0x7F800000 && (v & 0x007FFFFF)) continue; /* NaN */
        memcpy(&g[n++], &v, 4);
        if (n == CHUNK || b + 65521 > 0xFFFFFFFFu) {
            for (int i = 0; i < n; i++) u[i] = 0.25f + (float)(i % 13);
            ref->swiglu(n, ya, g, u);
            memcpy(yb, g, sizeof(float) * (size_t)n);
            var->swiglu(n, yb, yb, u);
            char what[64];
            snprintf(what, sizeof(what), "swiglu in place, sweep chunk %d", chunks++);
            check_floats(what, yb, ya, n);
            n = 0;
        }
    }
}

/* attn_softmax's weights and sum, bit for bit, on every length to 40 and some longer (every
 * vector tail), with NaN, infinite and underflowing scores */
static void check_softmax(const ei_kernels *ref, const ei_kernels *var) {
    static const float special[] = {0.0f, -0.0f, -700.0f, -708.5f, -720.0f, -745.1f, -745.9f, -746.5f, -1e30f,
                                    NAN, -INFINITY, 1.5f, -0.34657359f, 1e-40f, INFINITY};
    enum { MAX = 513 };
    static float sc[MAX];
    static double wa[MAX], wb[MAX];
    char what[96];
    for (int n = 1; n <= MAX; n = n < 40 ? n + 1 : 2 * n - 1)
        for (int kind = 0; kind < 4; kind++) {
            for (int i = 0; i < n; i++)
                sc[i] = kind == 3 ? special[i % (sizeof(special) / sizeof(special[0]))] : gaussian() * (kind == 0 ? 0.01f : kind == 1 ? 3.0f : 80.0f);
            const double sa = ref->attn_softmax(sc, n, wa), sb = var->attn_softmax(sc, n, wb);
            int same = (memcmp(&sa, &sb, 8) == 0 || (isnan(sa) && isnan(sb)));
            for (int i = 0; i < n; i++) same &= memcmp(&wa[i], &wb[i], 8) == 0 || (isnan(wa[i]) && isnan(wb[i]));
            if (same) { passed++; continue; }
            failed++;
            snprintf(what, sizeof(what), "attn_softmax n %d scores %d", n, kind);
            printf("FAIL %s: sum variant %.17g reference %.17g\n", what, sb, sa);
        }
}

/* argument "quick": one input kind and no sweep, for a run on the oldest CPU model of a level,
 * whose point is that no kernel uses an instruction beyond it (the values are checked on the
 * richest model) */
int main(int argc, char **argv) {
    const int quick = argc > 1 && !strcmp(argv[1], "quick");
    ei_kernels ref, var;
    ei_kernels_init_ref(&ref);
    EI_CHECK_INIT(&var);
    printf("checking %s against %s\n", var.name, ref.name);
    enum { N = 1024, ROWS = 5, COLS = 6 };
    static float x[COLS][N], fa[N], fb[N];
    static uint8_t wa[ROWS][N * 4], acta[COLS][N * 4], actb[COLS][N * 4];
    char what[128];

    for (int kind = 0; kind < (quick ? 1 : 5); kind++) {
        for (int c = 0; c < COLS; c++) fill(x[c], N, kind);
        /* activation quantizers */
        const int partners[] = {EI_TYPE_Q8_0, EI_TYPE_Q8_1, EI_TYPE_Q8_K, EI_TYPE_F16, EI_TYPE_BF16, EI_TYPE_F32};
        for (size_t p = 0; p < sizeof(partners) / sizeof(partners[0]); p++) {
            const int pt = partners[p];
            const size_t bytes = ei_row_size(pt, N);
            ref.from_float[pt](x[0], acta[0], N);
            var.from_float[pt](x[0], actb[0], N);
            snprintf(what, sizeof(what), "from_float type %d input %d", pt, kind);
            check_bytes(what, acta[0], actb[0], bytes);
        }
        /* decoders, dots and tiles */
        for (size_t t = 0; t < sizeof(WEIGHT_TYPES) / sizeof(WEIGHT_TYPES[0]); t++) {
            const int type = WEIGHT_TYPES[t], pt = ei_partner_type(type);
            const size_t wbytes = ei_row_size(type, N), abytes = ei_row_size(pt, N);
            for (int r = 0; r < ROWS; r++) random_weights(type, wa[r], wbytes);
            for (int c = 0; c < COLS; c++) ref.from_float[pt](x[c], acta[c], N);
            ref.to_float[type](wa[0], fa, N);
            var.to_float[type](wa[0], fb, N);
            snprintf(what, sizeof(what), "to_float type %d", type);
            check_floats(what, fb, fa, N);
            for (int len = ei_block_size(type) == 1 ? 7 : ei_block_size(type); len <= N; len *= 2) {
                float sa, sb;
                ref.vec_dot[type](len, &sa, wa[0], acta[0]);
                var.vec_dot[type](len, &sb, wa[0], acta[0]);
                snprintf(what, sizeof(what), "vec_dot type %d n %d input %d", type, len, kind);
                check_floats(what, &sb, &sa, 1);
            }
            if (var.gemm[type]) {
                for (int nr = 1; nr <= EI_TILE && nr <= ROWS; nr++)
                    for (int nc = 1; nc <= EI_TILE && nc <= COLS; nc++) {
                        float sa[EI_TILE * EI_TILE], sb[EI_TILE * EI_TILE];
                        var.gemm[type](N, nr, nc, sb, EI_TILE, wa[0], sizeof(wa[0]), acta[0], sizeof(acta[0]));
                        for (int c = 0; c < nc; c++)
                            for (int r = 0; r < nr; r++) ref.vec_dot[type](N, &sa[c * EI_TILE + r], wa[r], acta[c]);
                        for (int c = 0; c < nc; c++) {
                            snprintf(what, sizeof(what), "gemm type %d tile %dx%d input %d", type, nr, nc, kind);
                            check_floats(what, sb + c * EI_TILE, sa + c * EI_TILE, nr);
                        }
                    }
            }
            (void)abytes;
        }
        /* float operations */
        float w[N], cs[N], ya[N], yb[N];
        fill(w, N, 0);
        for (int i = 0; i < N / 2; i++) { cs[2 * i] = cosf(0.37f * i); cs[2 * i + 1] = sinf(0.37f * i); }
        ref.rms_norm(N, ya, x[0], w, 1e-6f);
        var.rms_norm(N, yb, x[0], w, 1e-6f);
        check_floats("rms_norm", yb, ya, N);
        for (int neox = 0; neox < 2; neox++) {
            memcpy(ya, x[0], sizeof(ya)); memcpy(yb, x[0], sizeof(yb));
            ref.rope(256, ya, cs, neox);
            var.rope(256, yb, cs, neox);
            check_floats(neox ? "rope neox" : "rope", yb, ya, 256);
        }
        for (int block = 64; block <= 256; block *= 2) { /* two blocks, then one */
            memcpy(ya, x[0], sizeof(ya)); memcpy(yb, x[0], sizeof(yb));
            ref.hadamard(ya, 512, block);
            var.hadamard(yb, 512, block);
            snprintf(what, sizeof(what), "hadamard block %d", block);
            check_floats(what, yb, ya, 512);
        }
        static ei_f16 table[65536];
        for (int i = 0; i < 65536; i++) table[i] = ei_fp32_to_fp16(ei_fp16_to_fp32((ei_f16)i) * 0.5f);
        ref.geglu(N, ya, x[0], x[1], table);
        var.geglu(N, yb, x[0], x[1], table);
        check_floats("geglu", yb, ya, N);
        ref.swiglu(N, ya, x[0], x[1]);
        var.swiglu(N, yb, x[0], x[1]);
        check_floats("swiglu", yb, ya, N);
        memcpy(ya, x[0], sizeof(ya)); memcpy(yb, x[0], sizeof(yb));
        ref.add(N, ya, x[1]); var.add(N, yb, x[1]);
        check_floats("add", yb, ya, N);
        ref.scale(N, ya, 0.3f); var.scale(N, yb, 0.3f);
        check_floats("scale", yb, ya, N);
        for (int hd = 64; hd <= 256; hd += 64) check_attention(&ref, &var, x[2], x[3], hd); /* 192: no special case */
    }
    check_kivi(&ref, &var);
    check_softmax(&ref, &var);
    if (!quick) check_swiglu_sweep(&ref, &var);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
