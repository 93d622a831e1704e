/* Edge cases of one instruction-set variant against the scalar reference, exactly: the
 * shapes check_kernels.c leaves out (odd lengths and block counts, vector tails,
 * tile strides, odd head dimensions, soft-capping, NaN and infinity in conversions, ties in
 * rounding). Built like check_kernels.c, with -DEI_CHECK_INIT=<the variant's init>; prints
 * "N passed, M failed" and exits non-zero on any failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_RNG_SEED 0x243f6a8885a308d3ull
#include "check_common.h"
#include "../../simd/common/kivi.h"

#ifndef EI_CHECK_INIT
#error "define EI_CHECK_INIT as the variant's init function"
#endif
void EI_CHECK_INIT(ei_kernels *k);

static int passed, failed;

static void check(const char *what, int ok) {
    if (ok) { passed++; return; }
    failed++;
    printf("FAIL %s\n", what);
}

static int same_floats(const float *a, const float *b, int n) {
    for (int i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4) != 0 && !(isnan(a[i]) && isnan(b[i]))) return 0;
    return 1;
}

static int same_doubles(const double *a, const double *b, int n) {
    for (int i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 8) != 0 && !(isnan(a[i]) && isnan(b[i]))) return 0;
    return 1;
}

static const int TYPES[] = {EI_TYPE_F32, EI_TYPE_F16, EI_TYPE_BF16, EI_TYPE_Q4_0, EI_TYPE_Q4_1, EI_TYPE_Q5_0,
                            EI_TYPE_Q5_1, EI_TYPE_Q8_0, EI_TYPE_Q2_K, EI_TYPE_Q3_K, EI_TYPE_Q4_K, EI_TYPE_Q5_K,
                            EI_TYPE_Q6_K};
#define N_TYPES (int)(sizeof(TYPES) / sizeof(TYPES[0]))

/* random bytes, then every fp16 scale field replaced by a small float (as check_kernels.c) */
static void random_row(int type, uint8_t *w, int n) {
    const size_t bytes = ei_row_size(type, n);
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)next_u32();
    if (type == EI_TYPE_F32) {
        for (int i = 0; i < n; i++) ((float *)w)[i] = uniform() * 3.0f;
        return;
    }
    if (type == EI_TYPE_F16 || type == EI_TYPE_BF16) {
        for (int i = 0; i < n; i++)
            ((ei_f16 *)w)[i] = type == EI_TYPE_F16 ? ei_fp32_to_fp16(uniform() * 3.0f) : ei_fp32_to_bf16(uniform() * 3.0f);
        return;
    }
    set_small_scales(type, w, bytes, 0.02f);
}

enum { MAXN = 2304, ROWS = 4, COLS = 4 };
static uint8_t wbuf[ROWS][MAXN * 4 + 64], abuf[COLS][MAXN * 4 + 64];
static float xbuf[COLS][MAXN];

/* dots and tiles over block counts 1..9 (K-quants 1..9 blocks of 256), with padded strides */
static void check_dots(const ei_kernels *ref, const ei_kernels *var) {
    char what[128];
    for (int t = 0; t < N_TYPES; t++) {
        const int type = TYPES[t], pt = ei_partner_type(type), bs = ei_block_size(type);
        for (int nblk = 1; nblk <= 9; nblk++) {
            const int n = bs == 1 ? 4 * nblk + nblk % 4 : bs * nblk; /* float rows: odd lengths too */
            if (n > MAXN) break;
            const size_t xs = sizeof(wbuf[0]), ys = sizeof(abuf[0]);
            for (int r = 0; r < ROWS; r++) random_row(type, wbuf[r], n);
            for (int c = 0; c < COLS; c++) {
                for (int i = 0; i < n; i++) xbuf[c][i] = uniform() * (i % 29 == 0 ? 50.0f : 1.0f);
                ref->from_float[pt](xbuf[c], abuf[c], n);
            }
            float a, b;
            ref->vec_dot[type](n, &a, wbuf[0], abuf[0]);
            var->vec_dot[type](n, &b, wbuf[0], abuf[0]);
            snprintf(what, sizeof(what), "vec_dot type %d n %d", type, n);
            check(what, same_floats(&a, &b, 1));
            if (!var->gemm[type]) continue;
            for (int nr = 1; nr <= ROWS; nr++)
                for (int nc = 1; nc <= COLS; nc++) {
                    enum { SS = 7 }; /* an output stride that is not the tile width */
                    float sa[COLS * SS], sb[COLS * SS];
                    for (int i = 0; i < COLS * SS; i++) sa[i] = sb[i] = -1.0f;
                    var->gemm[type](n, nr, nc, sb, SS, wbuf[0], xs, abuf[0], ys);
                    for (int c = 0; c < nc; c++)
                        for (int r = 0; r < nr; r++) ref->vec_dot[type](n, &sa[c * SS + r], wbuf[r], abuf[c]);
                    snprintf(what, sizeof(what), "gemm type %d n %d tile %dx%d", type, n, nr, nc);
                    check(what, same_floats(sa, sb, COLS * SS));
                }
        }
    }
}

/* quantizers: odd lengths for the element types, ties and signed maxima for the blocks */
static void check_quantizers(const ei_kernels *ref, const ei_kernels *var) {
    char what[128];
    static uint8_t qa[MAXN * 4], qb[MAXN * 4];
    const int parts[] = {EI_TYPE_Q8_0, EI_TYPE_Q8_1, EI_TYPE_Q8_K, EI_TYPE_F16, EI_TYPE_BF16};
    for (int kind = 0; kind < 6; kind++) {
        const int n = 512;
        float *x = xbuf[0];
        for (int i = 0; i < n; i++) {
            switch (kind) {
            case 0: x[i] = (float)((int)(uniform() * 254.0f)) * 0.5f; break;     /* many halves: ties */
            case 1: x[i] = (i % 2 ? -1.0f : 1.0f) * (float)(i % 7); break;      /* equal magnitudes */
            case 2: x[i] = uniform() * 1e-30f; break;                             /* tiny, subnormal halves */
            case 3: x[i] = uniform() * 70000.0f; break;                           /* beyond the half range */
            case 4: x[i] = (i % 64 == 5) ? -3.0f : (i % 64 == 9 ? 3.0f : uniform()); break; /* sign of the max */
            default: x[i] = uniform(); break;
            }
        }
        for (size_t p = 0; p < sizeof(parts) / sizeof(parts[0]); p++) {
            const size_t bytes = ei_row_size(parts[p], n);
            memset(qa, 0x5a, bytes); memset(qb, 0x5a, bytes);
            ref->from_float[parts[p]](x, qa, n);
            var->from_float[parts[p]](x, qb, n);
            snprintf(what, sizeof(what), "from_float type %d inputs %d", parts[p], kind);
            check(what, memcmp(qa, qb, bytes) == 0);
        }
    }
    const float special[] = {NAN, -NAN, INFINITY, -INFINITY, 65504.0f, 65520.0f, -65519.0f, 6e-8f, -3e-8f,
                             1e-40f, 0.0f, -0.0f, 3.4e38f, 1.00390625f, 1.01171875f};
    const int ns = (int)(sizeof(special) / sizeof(special[0]));
    for (int len = 1; len <= 19; len++) {
        for (int i = 0; i < len; i++) xbuf[0][i] = i < ns ? special[(i + len) % ns] : uniform();
        for (int p = 3; p < 5; p++) {
            ref->from_float[parts[p]](xbuf[0], qa, len);
            var->from_float[parts[p]](xbuf[0], qb, len);
            snprintf(what, sizeof(what), "from_float type %d special len %d", parts[p], len);
            check(what, memcmp(qa, qb, (size_t)len * 2) == 0);
        }
    }
}

static void check_float_ops(const ei_kernels *ref, const ei_kernels *var) {
    char what[128];
    static float ya[MAXN], yb[MAXN], w[MAXN], cs[MAXN];
    static ei_f16 table[65536];
    for (int i = 0; i < 65536; i++) table[i] = ei_fp32_to_fp16(ei_fp16_to_fp32((ei_f16)i) * 0.75f);
    for (int i = 0; i < MAXN; i++) {
        xbuf[0][i] = uniform() * 4.0f;
        xbuf[1][i] = uniform() * 30.0f; /* beyond the GELU table's +-10 */
        w[i] = uniform();
        cs[i] = cosf(0.1f * i);
    }
    for (int i = 0; i < MAXN / 2; i++) cs[2 * i + 1] = sinf(0.1f * i);
    for (int n = 1; n <= 37; n++) {
        for (int withw = 0; withw < 2; withw++) {
            ref->rms_norm(n, ya, xbuf[0], withw ? w : NULL, 1e-5f);
            var->rms_norm(n, yb, xbuf[0], withw ? w : NULL, 1e-5f);
            snprintf(what, sizeof(what), "rms_norm n %d weights %d", n, withw);
            check(what, same_floats(ya, yb, n));
        }
        ref->geglu(n, ya, xbuf[1], xbuf[0], table);
        var->geglu(n, yb, xbuf[1], xbuf[0], table);
        snprintf(what, sizeof(what), "geglu n %d", n);
        check(what, same_floats(ya, yb, n));
        ref->swiglu(n, ya, xbuf[1], xbuf[0]);
        var->swiglu(n, yb, xbuf[1], xbuf[0]);
        snprintf(what, sizeof(what), "swiglu n %d", n);
        check(what, same_floats(ya, yb, n));
        memcpy(ya, xbuf[0], sizeof(float) * n); memcpy(yb, xbuf[0], sizeof(float) * n);
        ref->add(n, ya, xbuf[1]); var->add(n, yb, xbuf[1]);
        ref->scale(n, ya, -0.37f); var->scale(n, yb, -0.37f);
        snprintf(what, sizeof(what), "add, scale n %d", n);
        check(what, same_floats(ya, yb, n));
        for (int neox = 0; neox < 2; neox++) {
            const int n_rot = 2 * n; /* odd halves leave vector tails */
            memcpy(ya, xbuf[0], sizeof(float) * (n_rot + 8)); memcpy(yb, xbuf[0], sizeof(float) * (n_rot + 8));
            ref->rope(n_rot, ya, cs, neox);
            var->rope(n_rot, yb, cs, neox);
            snprintf(what, sizeof(what), "rope n_rot %d neox %d", n_rot, neox);
            check(what, same_floats(ya, yb, n_rot + 8));
        }
    }
}

/* odd head dimensions, a different value dimension, strided rows, windows, soft-capping, and
 * the same span cut into two runs */
static void check_attn(const ei_kernels *ref, const ei_kernels *var) {
    char what[160];
    enum { T = 40, STRIDE = 140 };
    static ei_f16 k16[T * STRIDE], v16[T * STRIDE];
    static float k32[T * STRIDE], v32[T * STRIDE], q[STRIDE], oa[STRIDE], ob[STRIDE];
    static double scratch[2 * T];
    for (int i = 0; i < T * STRIDE; i++) {
        k32[i] = uniform() * 2.0f; v32[i] = uniform();
        k16[i] = ei_fp32_to_fp16(k32[i]); v16[i] = ei_fp32_to_fp16(v32[i]);
    }
    for (int i = 0; i < STRIDE; i++) q[i] = uniform() * 3.0f;
    const int dims[][2] = {{1, 1}, {3, 5}, {4, 4}, {7, 9}, {64, 64}, {72, 40}, {130, 131}};
    for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++)
        for (int kv = 0; kv < 4; kv++) /* every pair of key and value types */
            for (int t0 = 0; t0 <= 6; t0 += 3)
                for (int t1 = t0 + 1; t1 <= T; t1 += 1 + t1 / 4)
                    for (int cap = 0; cap < 4; cap++) {
                        const int k_f32 = kv & 1, v_f32 = kv >> 1, cut = cap >> 1;
                        const int kt = k_f32 ? EI_TYPE_F32 : EI_TYPE_F16, vt = v_f32 ? EI_TYPE_F32 : EI_TYPE_F16;
                        const size_t kr = ei_row_size(kt, STRIDE), vr = ei_row_size(vt, STRIDE);
                        const uint8_t *k = k_f32 ? (const uint8_t *)k32 : (const uint8_t *)k16;
                        const uint8_t *v = v_f32 ? (const uint8_t *)v32 : (const uint8_t *)v16;
                        const int mid = cut && t1 - t0 > 1 ? t0 + (t1 - t0) / 3 + 1 : t1;
                        const ei_attn_run runs[2] = {{k + t0 * kr, v + t0 * vr, mid - t0},
                                                     {k + mid * kr, v + mid * vr, t1 - mid}};
                        ei_attn_params p = {dims[di][0], dims[di][1], mid < t1 ? 2 : 1, runs, kt, vt, kr, vr,
                                            0.125f, cap & 1 ? 5.0f : 0.0f, ref};
                        ref->attn(&p, q, oa, scratch);
                        p.kt = var;
                        var->attn(&p, q, ob, scratch);
                        snprintf(what, sizeof(what), "attn hd %d hdv %d k_f32 %d v_f32 %d t %d..%d softcap %d runs %d",
                                 dims[di][0], dims[di][1], k_f32, v_f32, t0, t1, cap & 1, p.n_runs);
                        check(what, same_floats(oa, ob, dims[di][1]));
                    }
}

/* quantized caches: heads of whole blocks, rows wider than a head, short and long spans */
static void check_attn_quantized(const ei_kernels *ref, const ei_kernels *var) {
    char what[160];
    enum { T = 40, ROW = 160 };
    static const int types[4] = {EI_TYPE_F32, EI_TYPE_F16, EI_TYPE_Q8_0, EI_TYPE_Q4_0};
    static uint8_t kc[4][T * ROW * 4], vc[4][T * ROW * 4];
    static float x[T * ROW], y[T * ROW], q[ROW], oa[ROW], ob[ROW];
    static double scratch[2 * T];
    for (int i = 0; i < T * ROW; i++) { x[i] = uniform() * 2.0f; y[i] = uniform(); }
    for (int i = 0; i < ROW; i++) q[i] = uniform() * 3.0f;
    for (int ti = 0; ti < 4; ti++)
        for (int t = 0; t < T; t++) {
            const size_t rb = ei_row_size(types[ti], ROW);
            ref->from_float[types[ti]](x + t * ROW, kc[ti] + t * rb, ROW);
            ref->from_float[types[ti]](y + t * ROW, vc[ti] + t * rb, ROW);
        }
    const int dims[][2] = {{32, 32}, {64, 96}, {128, 64}, {160, 160}};
    for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++)
        for (int kv = 0; kv < 16; kv++) {
            if (kv % 4 < 2 && kv / 4 < 2) continue; /* check_attn covers f16 and f32 alone */
            const int kt = types[kv % 4], vt = types[kv / 4];
            const size_t kr = ei_row_size(kt, ROW), vr = ei_row_size(vt, ROW);
            for (int t1 = 1; t1 <= T; t1 += 1 + t1 / 3) {
                const int mid = t1 / 2;
                const ei_attn_run runs[2] = {{kc[kv % 4], vc[kv / 4], mid ? mid : t1},
                                             {kc[kv % 4] + mid * kr, vc[kv / 4] + mid * vr, t1 - mid}};
                ei_attn_params p = {dims[di][0], dims[di][1], mid ? 2 : 1, runs, kt, vt, kr, vr, 0.125f,
                                    t1 % 2 ? 5.0f : 0.0f, ref};
                ref->attn(&p, q, oa, scratch);
                p.kt = var;
                var->attn(&p, q, ob, scratch);
                snprintf(what, sizeof(what), "attn hd %d hdv %d k type %d v type %d keys %d", dims[di][0],
                         dims[di][1], kt, vt, t1);
                check(what, same_floats(oa, ob, dims[di][1]));
            }
        }
}

/* element i of a set of KIVI inputs of one kind: the roundings' corner cases (a constant,
 * a NaN, infinities, a range below fp16's smallest scale, no number at all, equal
 * infinities, signed zeros, ties, a tiny but usable range) or plain values */
static ei_f16 kivi_special(int kind, int i) {
    const float g = gaussian();
    switch (kind) {
    case 0: return ei_fp32_to_fp16(0.75f);
    case 1: return ei_fp32_to_fp16(i == 3 ? NAN : g);
    case 2: return ei_fp32_to_fp16(i == 1 ? INFINITY : g);
    case 3: return ei_fp32_to_fp16(i == 0 ? -INFINITY : g);
    case 4: return (ei_f16)(i % 2 ? 0x0001 : 0x0000); /* range 2^-24: the scale rounds to 0 */
    case 5: return (ei_f16)(0x7e00 | (i & 0xff));      /* NaNs only */
    case 6: return ei_fp32_to_fp16(i % 2 ? INFINITY : -INFINITY);
    case 7: return ei_fp32_to_fp16(INFINITY);
    case 8: return (ei_f16)(i % 3 == 0 ? 0x8000 : i % 3 == 1 ? 0x0000 : 0x3c00); /* -0, +0, 1 */
    case 9: return ei_fp32_to_fp16((float)(i % 31) * 0.5f);                      /* halves: ties */
    case 10: return ei_fp32_to_fp16(1.0f + (float)(i % 5) / 1024.0f);
    default: return ei_fp32_to_fp16(g * 3.0f);
    }
}

/* KIVI kernels on those inputs, with odd head dimensions, every slice start and length of
 * a group, and value groups below a vector (scalar tails) */
static void check_kivi(const ei_kernels *ref, const ei_kernels *var) {
    enum { G = EI_KIVI_MAX_GROUP, W = 41, KINDS = 12, HV = 64 };
    static ei_f16 rows[G * W], vals[KINDS][HV];
    static uint8_t ka[W * (4 + G / 2)], kb[W * (4 + G / 2)], va[KINDS * HV], vb[KINDS * HV];
    static float q[W], da[G], db[G], oa[KINDS * HV], ob[KINDS * HV];
    char what[128];
    for (int t = 0; t < G; t++) /* channel d is of kind d % KINDS */
        for (int d = 0; d < W; d++) rows[t * W + d] = kivi_special(d % KINDS, t);
    for (int k = 0; k < KINDS; k++)
        for (int i = 0; i < HV; i++) vals[k][i] = kivi_special(k, i % 16);
    for (int i = 0; i < W; i++) q[i] = uniform() * 2.0f;
    const int hds[] = {1, 3, 5, 12, 17, 33, 41};
    for (int bits = 2; bits <= 4; bits += 2)
        for (int group = 32; group <= G; group *= 2) {
            for (size_t h = 0; h < sizeof(hds) / sizeof(hds[0]); h++) {
                const int hd = hds[h];
                ref->kivi_quantize_k(bits, group, hd, rows + W - hd, 2 * W, ka);
                var->kivi_quantize_k(bits, group, hd, rows + W - hd, 2 * W, kb);
                snprintf(what, sizeof(what), "kivi_quantize_k bits %d group %d hd %d", bits, group, hd);
                check(what, memcmp(ka, kb, ei_kivi_k_block_bytes(bits, group, hd)) == 0);
                for (int t0 = 0; t0 < group; t0 += 7)
                    for (int n = 0; t0 + n <= group; n += 1 + n / 2) {
                        ref->kivi_k_dots(bits, group, hd, ka, t0, n, q, da);
                        var->kivi_k_dots(bits, group, hd, ka, t0, n, q, db);
                        snprintf(what, sizeof(what), "kivi_k_dots bits %d group %d hd %d tokens %d+%d", bits,
                                 group, hd, t0, n);
                        check(what, same_floats(da, db, n));
                    }
            }
            const int hdvs[] = {2, 4, 6, 8, 12, 20, 24, 28, 32, 48, 64};
            for (size_t h = 0; h < sizeof(hdvs) / sizeof(hdvs[0]); h++) {
                const int hdv = hdvs[h];
                const size_t rb = ei_kivi_v_row_bytes(bits, group, hdv);
                if (!rb) continue; /* no whole bytes (2-bit codes in groups of 2 or 6) or no groups */
                for (int k = 0; k < KINDS; k++) {
                    ref->kivi_quantize_v(bits, group, hdv, vals[k] + HV - hdv, va + k * rb);
                    var->kivi_quantize_v(bits, group, hdv, vals[k] + HV - hdv, vb + k * rb);
                }
                snprintf(what, sizeof(what), "kivi_quantize_v bits %d group %d hdv %d", bits, group, hdv);
                check(what, memcmp(va, vb, KINDS * rb) == 0);
                ref->kivi_decode_v(bits, group, hdv, va, rb, KINDS, oa);
                var->kivi_decode_v(bits, group, hdv, va, rb, KINDS, ob);
                snprintf(what, sizeof(what), "kivi_decode_v bits %d group %d hdv %d", bits, group, hdv);
                check(what, same_floats(oa, ob, KINDS * hdv));
            }
        }
}

/* the attention's table entries for KIVI: dots of unrounded queries with fp16 keys (the
 * residual) and weighted sums of value rows, on keys and values with every kind of corner
 * case, odd dimensions and key counts that leave tails */
static void check_attn_parts(const ei_kernels *ref, const ei_kernels *var) {
    enum { M = 37, D = 70, KINDS = 12 };
    static ei_f16 keys[M * D];
    static float vals[M * D];
    static double qd[D], pw[M], da[M], db[M], sa[D], sb[D];
    char what[128];
    for (int t = 0; t < M; t++)
        for (int d = 0; d < D; d++) {
            keys[t * D + d] = kivi_special((t + d) % KINDS, d);
            vals[t * D + d] = t % 5 == 4 ? ei_fp16_to_fp32(kivi_special(t % KINDS, d)) : gaussian();
        }
    for (int d = 0; d < D; d++) qd[d] = (double)(uniform() * 2.0f - 1.0f);
    for (int t = 0; t < M; t++) pw[t] = (double)uniform();
    const int hds[] = {1, 3, 4, 5, 16, 17, 33, 64, 70};
    for (size_t h = 0; h < sizeof(hds) / sizeof(hds[0]); h++)
        for (int m = 1; m <= M; m += 1 + m / 3) {
            const int hd = hds[h];
            ref->attn_dots_f16(qd, (const uint8_t *)keys, 2 * D, hd, m, da);
            var->attn_dots_f16(qd, (const uint8_t *)keys, 2 * D, hd, m, db);
            snprintf(what, sizeof(what), "attn_dots_f16 hd %d keys %d", hd, m);
            check(what, same_doubles(da, db, m));
            for (int f32 = 0; f32 <= 1; f32++) {
                for (int d = 0; d < hd; d++) sa[d] = sb[d] = 0.25 * d;
                const uint8_t *v = f32 ? (const uint8_t *)vals : (const uint8_t *)keys;
                const size_t row = f32 ? 4 * D : 2 * D;
                ref->attn_weighted_sum(pw, v, f32, row, m, hd, sa);
                var->attn_weighted_sum(pw, v, f32, row, m, hd, sb);
                snprintf(what, sizeof(what), "attn_weighted_sum f32 %d hv %d rows %d", f32, hd, m);
                check(what, same_doubles(sa, sb, hd));
            }
        }
}

/* the keys of a q8_0 / q4_0 cache against a q8_0 query: random key bytes (-128 included), keys
 * a whole multi-head row apart, every head size a block count allows up to EI_MAX_HEAD_DIM,
 * key counts that leave every tail */
static void check_attn_dots_q(const ei_kernels *ref, const ei_kernels *var) {
    enum { M = 37, HEADS = 3 };
    static uint8_t keys[M * HEADS * (EI_MAX_HEAD_DIM / 32) * 34], qq[(EI_MAX_HEAD_DIM / 32) * 34];
    static float q[EI_MAX_HEAD_DIM], oa[M], ob[M];
    char what[128];
    const int types[] = {EI_TYPE_Q8_0, EI_TYPE_Q4_0};
    const int hds[] = {32, 64, 96, 128, 256, 288, EI_MAX_HEAD_DIM};
    for (int ti = 0; ti < 2; ti++)
        for (size_t h = 0; h < sizeof(hds) / sizeof(hds[0]); h++) {
            const int type = types[ti], hd = hds[h];
            const size_t row_bytes = HEADS * ei_row_size(type, hd);
            for (int t = 0; t < M * HEADS; t++) random_row(type, keys + (size_t)t * ei_row_size(type, hd), hd);
            for (int d = 0; d < hd; d++) q[d] = d % 64 < 32 && h == 1 ? 0.0f : (uniform() * 2.0f - 1.0f) * 4.0f;
            ref->from_float[EI_TYPE_Q8_0](q, qq, hd);
            for (int m = 1; m <= M; m += 1 + m / 4) {
                ref->attn_dots_q(type, qq, keys, row_bytes, hd, m, oa);
                var->attn_dots_q(type, qq, keys, row_bytes, hd, m, ob);
                snprintf(what, sizeof(what), "attn_dots_q %s hd %d keys %d", type == EI_TYPE_Q4_0 ? "q4_0" : "q8_0", hd, m);
                check(what, same_floats(oa, ob, m));
                for (int t = 0; t < m; t++) var->vec_dot[type](hd, &ob[t], keys + (size_t)t * row_bytes, qq);
                snprintf(what, sizeof(what), "attn_dots_q %s hd %d keys %d against vec_dot", type == EI_TYPE_Q4_0 ? "q4_0" : "q8_0", hd, m);
                check(what, same_floats(oa, ob, m));
            }
        }
}

/* weighted sums of the value rows of a q8_0 / q4_0 cache: random bytes, rows a multi-head row
 * apart, weights of float's bits with zeros and tiny ones, every head size up to
 * EI_MAX_HEAD_DIM, row counts that leave every tail; the sums start from nonzero values */
static void check_attn_weighted_sum_q(const ei_kernels *ref, const ei_kernels *var) {
    enum { M = 37, HEADS = 2 };
    static uint8_t vals[M * HEADS * (EI_MAX_HEAD_DIM / 32) * 34];
    static double w[M], sa[EI_MAX_HEAD_DIM], sb[EI_MAX_HEAD_DIM];
    char what[128];
    const int types[] = {EI_TYPE_Q8_0, EI_TYPE_Q4_0};
    const int hvs[] = {32, 64, 96, 160, 256, EI_MAX_HEAD_DIM};
    for (int t = 0; t < M; t++) w[t] = t % 7 == 3 ? 0.0 : (double)(t % 11 == 5 ? uniform() * 1e-30f : uniform());
    for (int ti = 0; ti < 2; ti++)
        for (size_t h = 0; h < sizeof(hvs) / sizeof(hvs[0]); h++) {
            const int type = types[ti], hv = hvs[h];
            const size_t row_bytes = HEADS * ei_row_size(type, hv);
            for (int t = 0; t < M * HEADS; t++) random_row(type, vals + (size_t)t * ei_row_size(type, hv), hv);
            for (int m = 1; m <= M; m += 1 + m / 4) {
                for (int d = 0; d < hv; d++) sa[d] = sb[d] = 0.125 * (d % 9) - 0.5;
                ref->attn_weighted_sum_q(type, w, vals, row_bytes, m, hv, sa);
                var->attn_weighted_sum_q(type, w, vals, row_bytes, m, hv, sb);
                snprintf(what, sizeof(what), "attn_weighted_sum_q %s hv %d rows %d", type == EI_TYPE_Q4_0 ? "q4_0" : "q8_0", hv, m);
                check(what, same_doubles(sa, sb, hv));
            }
        }
}

int main(void) {
    ei_kernels ref, var;
    ei_kernels_init_ref(&ref);
    EI_CHECK_INIT(&var);
    printf("edge cases of %s against %s\n", var.name, ref.name);
    check_dots(&ref, &var);
    check_quantizers(&ref, &var);
    check_float_ops(&ref, &var);
    check_attn(&ref, &var);
    check_attn_quantized(&ref, &var);
    check_kivi(&ref, &var);
    check_attn_parts(&ref, &var);
    check_attn_dots_q(&ref, &var);
    check_attn_weighted_sum_q(&ref, &var);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
