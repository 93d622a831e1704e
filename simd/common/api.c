/* Exported helpers: error messages, type tables, and single-kernel entry points for tests. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ei_internal.h"
#include "kivi.h"

static EI_THREAD_LOCAL char g_error[256];

int ei_api_version(void) { return EI_API_VERSION; }
const char *ei_last_error(void) { return g_error; }

size_t ei_struct_size(int which) {
    switch (which) {
    case EI_STRUCT_TENSOR: return sizeof(ei_tensor);
    case EI_STRUCT_LAYER_DESC: return sizeof(ei_layer_desc);
    case EI_STRUCT_MODEL_DESC: return sizeof(ei_model_desc);
    case EI_STRUCT_ENGINE_PARAMS: return sizeof(ei_engine_params);
    case EI_STRUCT_PROFILE_ENTRY: return sizeof(ei_profile_entry);
    case EI_STRUCT_VK_DEVICE: return sizeof(ei_vk_device);
    case EI_STRUCT_GPU_PLAN: return sizeof(ei_gpu_plan);
    default: return 0;
    }
}

#define EI_LAYER_NAME_(name, kind, presence, ne0, ne1) #name,
static const char *const g_layer_tensor_names[] = {EI_LAYER_TENSORS(EI_LAYER_NAME_)};

const char *ei_layer_tensor_name(int i) {
    const int n = (int)(sizeof(g_layer_tensor_names) / sizeof(g_layer_tensor_names[0]));
    return i >= 0 && i < n ? g_layer_tensor_names[i] : NULL;
}

#define EI_PROFILE_NAME_(name) #name,
static const char *const g_profile_kind_names[] = {EI_PROFILE_KINDS(EI_PROFILE_NAME_)};

const char *ei_profile_kind_name(int kind) {
    return kind >= 0 && kind < EI_PROF_KIND_COUNT ? g_profile_kind_names[kind] : NULL;
}

ei_status ei_fail(ei_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_error, sizeof(g_error), fmt, ap);
    va_end(ap);
    return status;
}

int ei_partner_type_of(int t) { return ei_partner_type(t); }

static const ei_kernels *kernels(int isa, ei_status *st) {
    const ei_kernels *k = ei_kernels_for(isa);
    *st = k ? EI_OK : ei_fail(EI_ERR_ISA, "instruction set %s is not available: %s", ei_isa_name(isa), ei_isa_reason(isa));
    return k;
}

ei_status ei_kernel_from_float(int isa, int pt, const float *x, void *y, int64_t n) {
    ei_status st;
    const ei_kernels *k = kernels(isa, &st);
    if (!k) return st;
    if (pt < 0 || pt >= EI_TYPE_COUNT || !k->from_float[pt] || !ei_row_size(pt, n))
        return ei_fail(EI_ERR_UNSUPPORTED, "no quantizer to type %d for %lld values", pt, (long long)n);
    k->from_float[pt](x, y, n);
    return EI_OK;
}

ei_status ei_kernel_to_float(int isa, int t, const void *x, float *y, int64_t n) {
    ei_status st;
    const ei_kernels *k = kernels(isa, &st);
    if (!k) return st;
    if (t < 0 || t >= EI_TYPE_COUNT || !k->to_float[t] || !ei_row_size(t, n))
        return ei_fail(EI_ERR_UNSUPPORTED, "no decoder for type %d and %lld values", t, (long long)n);
    k->to_float[t](x, y, n);
    return EI_OK;
}

ei_status ei_kernel_vec_dot(int isa, int t, int n, const void *x, const void *y, float *s) {
    ei_status st;
    const ei_kernels *k = kernels(isa, &st);
    if (!k) return st;
    if (t < 0 || t >= EI_TYPE_COUNT || !k->vec_dot[t] || !ei_row_size(t, n))
        return ei_fail(EI_ERR_UNSUPPORTED, "no dot product for type %d and %d values", t, n);
    k->vec_dot[t](n, s, x, y);
    return EI_OK;
}

ei_status ei_kernel_rms_norm(int isa, int n, float *y, const float *x, const float *w, float eps) {
    ei_status st;
    const ei_kernels *k = kernels(isa, &st);
    if (!k) return st;
    k->rms_norm(n, y, x, w, eps);
    return EI_OK;
}

ei_status ei_kernel_rope(int isa, int n_rot, float *x, const float *cs, int neox) {
    ei_status st;
    const ei_kernels *k = kernels(isa, &st);
    if (!k) return st;
    if (n_rot <= 0 || n_rot % 2) return ei_fail(EI_ERR_INVALID, "n_rot must be positive and even");
    k->rope(n_rot, x, cs, neox);
    return EI_OK;
}

static ei_f16 *g_gelu_table;

ei_status ei_kernel_glu(int isa, int gelu, int n, float *y, const float *g, const float *u) {
    ei_status st;
    const ei_kernels *k = kernels(isa, &st);
    if (!k) return st;
    if (gelu) {
        if (!g_gelu_table) {
            ei_f16 *tab = malloc(65536 * sizeof(ei_f16));
            if (!tab) return ei_fail(EI_ERR_NOMEM, "out of memory");
            ei_gelu_table(tab);
            g_gelu_table = tab;
        }
        k->geglu(n, y, g, u, g_gelu_table);
    } else {
        k->swiglu(n, y, g, u);
    }
    return EI_OK;
}

ei_status ei_kernel_softmax(int isa, int n, const float *scores, double *w, double *sum) {
    ei_status st;
    const ei_kernels *k = kernels(isa, &st);
    if (!k) return st;
    if (n < 0 || (n && (!scores || !w)) || !sum) return ei_fail(EI_ERR_INVALID, "bad softmax arguments");
    *sum = k->attn_softmax(scores, n, w);
    return EI_OK;
}

ei_status ei_kernel_attn(int isa, int head_dim, int head_dim_v, int n_runs, const int32_t *runs, int k_type,
                         int v_type, size_t k_row_bytes, size_t v_row_bytes, float scale, float softcap,
                         const float *q, const void *kc, const void *vc, float *out) {
    ei_status st;
    const ei_kernels *k = kernels(isa, &st);
    if (!k) return st;
    if (head_dim <= 0 || head_dim > EI_MAX_HEAD_DIM || head_dim_v <= 0 || head_dim_v > EI_MAX_HEAD_DIM ||
        n_runs <= 0 || n_runs > EI_ATTN_MAX_RUNS || !runs)
        return ei_fail(EI_ERR_INVALID, "bad attention shape");
    if (!ei_attn_reads(k, k_type) || !ei_attn_reads(k, v_type))
        return ei_fail(EI_ERR_UNSUPPORTED, "%s attention reads no cache of types %d (K) and %d (V)",
                       k->name, k_type, v_type);
    if (!ei_row_size(k_type, head_dim) || !ei_row_size(v_type, head_dim_v))
        return ei_fail(EI_ERR_INVALID, "a head of %d (K) or %d (V) values is not a whole number of blocks",
                       head_dim, head_dim_v);
    if (k_row_bytes < ei_row_size(k_type, head_dim) || v_row_bytes < ei_row_size(v_type, head_dim_v))
        return ei_fail(EI_ERR_INVALID, "cache rows overlap: their strides are shorter than a head");
    ei_attn_run r[EI_ATTN_MAX_RUNS];
    int64_t n = 0;
    for (int i = 0; i < n_runs; i++) {
        if (runs[2 * i] < 0 || runs[2 * i + 1] <= 0) return ei_fail(EI_ERR_INVALID, "run %d is empty or starts before row 0", i);
        r[i] = (ei_attn_run){(const uint8_t *)kc + (size_t)runs[2 * i] * k_row_bytes,
                             (const uint8_t *)vc + (size_t)runs[2 * i] * v_row_bytes, runs[2 * i + 1]};
        n += runs[2 * i + 1];
    }
    if (n > INT32_MAX / 2) return ei_fail(EI_ERR_INVALID, "too many keys");
    double *scratch = malloc(sizeof(double) * 2 * (size_t)n);
    if (!scratch) return ei_fail(EI_ERR_NOMEM, "out of memory");
    const ei_attn_params p = {head_dim, head_dim_v, n_runs, r, k_type, v_type, k_row_bytes, v_row_bytes,
                              scale, softcap, k};
    k->attn(&p, q, out, scratch);
    free(scratch);
    return EI_OK;
}

/* ---- KIVI cache kernels (common/kivi.h) ---------------------------------------------------- */

size_t ei_kivi_k_block_size(int bits, int group, int head_dim) { return ei_kivi_k_block_bytes(bits, group, head_dim); }
size_t ei_kivi_v_row_size(int bits, int group, int head_dim_v) { return ei_kivi_v_row_bytes(bits, group, head_dim_v); }

/* the kernels of isa, when bits and group name a KIVI format */
static const ei_kernels *kivi_kernels(int isa, int bits, int group, ei_status *st) {
    if (!ei_kivi_bits_ok(bits) || !ei_kivi_group_ok(group)) {
        *st = ei_fail(EI_ERR_INVALID, "KIVI has %d-bit codes in groups of %d tokens: bits must be 2 or 4, "
                      "the group 32, 64 or 128", bits, group);
        return NULL;
    }
    return kernels(isa, st);
}

static ei_status kivi_k_shape(int bits, int group, int head_dim) {
    if (!ei_kivi_k_block_bytes(bits, group, head_dim))
        return ei_fail(EI_ERR_INVALID, "a KIVI key head has 1 to %d channels, not %d", EI_MAX_HEAD_DIM, head_dim);
    return EI_OK;
}

static ei_status kivi_v_shape(int bits, int group, int head_dim_v) {
    if (!ei_kivi_v_group(bits, group, head_dim_v))
        return ei_fail(EI_ERR_INVALID, "a KIVI value head of %d channels does not split into groups of "
                       "min(%d, %d) channels of whole bytes of %d-bit codes (at most %d channels)",
                       head_dim_v, group, head_dim_v, bits, EI_MAX_HEAD_DIM);
    return EI_OK;
}

ei_status ei_kernel_kivi_quantize_k(int isa, int bits, int group, int head_dim, const void *rows, size_t row_bytes,
                                    void *block) {
    ei_status st;
    const ei_kernels *k = kivi_kernels(isa, bits, group, &st);
    if (!k) return st;
    if ((st = kivi_k_shape(bits, group, head_dim)) != EI_OK) return st;
    if (!rows || !block || row_bytes < 2 * (size_t)head_dim)
        return ei_fail(EI_ERR_INVALID, "key rows overlap (%zu bytes apart for %d f16 values) or are missing",
                       row_bytes, head_dim);
    k->kivi_quantize_k(bits, group, head_dim, rows, row_bytes, block);
    return EI_OK;
}

ei_status ei_kernel_kivi_k_dots(int isa, int bits, int group, int head_dim, const void *block, int t0, int n,
                                const float *q, float *dots) {
    ei_status st;
    const ei_kernels *k = kivi_kernels(isa, bits, group, &st);
    if (!k) return st;
    if ((st = kivi_k_shape(bits, group, head_dim)) != EI_OK) return st;
    if (t0 < 0 || n < 0 || t0 > group - n)
        return ei_fail(EI_ERR_INVALID, "tokens [%d, %d + %d) are not in a group of %d", t0, t0, n, group);
    if (!block || !q || !dots) return ei_fail(EI_ERR_INVALID, "a KIVI key block, query or output is missing");
    k->kivi_k_dots(bits, group, head_dim, block, t0, n, q, dots);
    return EI_OK;
}

ei_status ei_kernel_kivi_quantize_v(int isa, int bits, int group, int head_dim_v, const void *x, void *row) {
    ei_status st;
    const ei_kernels *k = kivi_kernels(isa, bits, group, &st);
    if (!k) return st;
    if ((st = kivi_v_shape(bits, group, head_dim_v)) != EI_OK) return st;
    if (!x || !row) return ei_fail(EI_ERR_INVALID, "KIVI values or their row are missing");
    k->kivi_quantize_v(bits, group, head_dim_v, x, row);
    return EI_OK;
}

ei_status ei_kernel_kivi_decode_v(int isa, int bits, int group, int head_dim_v, const void *rows, size_t row_bytes,
                                  int m, float *out) {
    ei_status st;
    const ei_kernels *k = kivi_kernels(isa, bits, group, &st);
    if (!k) return st;
    if ((st = kivi_v_shape(bits, group, head_dim_v)) != EI_OK) return st;
    if (m < 0 || (m > 0 && (!rows || !out || row_bytes < ei_kivi_v_row_bytes(bits, group, head_dim_v))))
        return ei_fail(EI_ERR_INVALID, "%d KIVI value rows %zu bytes apart overlap or are missing", m, row_bytes);
    k->kivi_decode_v(bits, group, head_dim_v, rows, row_bytes, m, out);
    return EI_OK;
}

/* setuptools builds this library as an extension module; it is loaded with ctypes, never
 * imported, but Windows links an export of this name */
EI_EXPORT void *PyInit__edgeinfer_native(void) { return NULL; }
