/* Weights on the device and the products with them: a weight matrix is uploaded as its GGUF
 * blocks, in parts of whole rows that each fit one storage binding (llvmpipe allows 128 MiB,
 * so a 262144-row embedding goes in several), and gemm / get_rows record one dispatch per
 * part. The ei_vk_kernel_* entry points run one such product from host arrays: they are what
 * the tests hold against the scalar reference. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

static const char *shader_type(int type) {
    switch (type) {
    case EI_TYPE_F32: return "f32";
    case EI_TYPE_F16: return "f16";
    case EI_TYPE_BF16: return "bf16";
    case EI_TYPE_Q4_0: return "q4_0";
    case EI_TYPE_Q4_1: return "q4_1";
    case EI_TYPE_Q5_0: return "q5_0";
    case EI_TYPE_Q5_1: return "q5_1";
    case EI_TYPE_Q8_0: return "q8_0";
    case EI_TYPE_Q2_K: return "q2_k";
    case EI_TYPE_Q3_K: return "q3_k";
    case EI_TYPE_Q4_K: return "q4_k";
    case EI_TYPE_Q5_K: return "q5_k";
    case EI_TYPE_Q6_K: return "q6_k";
    default: return NULL;
    }
}


void ei_vk_weights_free(ei_vk_context *ctx, ei_vk_weights *w) {
    for (int i = 0; w->parts && i < w->n_parts; i++) ei_vk_buffer_free(ctx, &w->parts[i]);
    free(w->parts);
    memset(w, 0, sizeof *w);
}

ei_status ei_vk_weights_upload(ei_vk_context *ctx, int type, const void *data, int64_t rows, int64_t cols, ei_vk_weights *w) {
    memset(w, 0, sizeof *w);
    const char *name = shader_type(type);
    const size_t row_bytes = ei_row_size(type, cols);
    if (!name || rows <= 0 || cols <= 0 || cols % 32 || !row_bytes)
        return ei_fail(EI_ERR_UNSUPPORTED, "Vulkan: no kernel for type %d with %lld columns", type, (long long)cols);
    const uint64_t cap = ctx->weight_part_bytes > 4 ? ctx->weight_part_bytes - 4 : 0; /* 4: the padding word */
    const int64_t per_part = (int64_t)(cap / row_bytes);
    if (per_part < 1)
        return ei_fail(EI_ERR_UNSUPPORTED, "Vulkan: a row of %zu bytes is over %s's storage binding limit (%llu bytes)", row_bytes,
                       ctx->info.name, (unsigned long long)ctx->weight_part_bytes);
    w->type = type;
    w->partner = ei_partner_type(type);
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = row_bytes;
    w->rows_per_part = per_part;
    w->n_parts = (int)((rows + per_part - 1) / per_part);
    w->parts = calloc((size_t)w->n_parts, sizeof *w->parts);
    if (!w->parts) return ei_fail(EI_ERR_NOMEM, "Vulkan: out of memory for weight parts");
    const int float_rows = type == EI_TYPE_F32 || type == EI_TYPE_F16 || type == EI_TYPE_BF16;
    ei_status st = ei_vk_shader_index_for(name, "gemm", ctx->subgroups | (ctx->int_dot && !float_rows ? EI_VK_INT_DOT : 0),
                                          &w->gemm_shader);
    if (st == EI_OK) st = ei_vk_shader_index_for(name, "get_rows", 0, &w->rows_shader);
    for (int i = 0; st == EI_OK && i < w->n_parts; i++) {
        const int64_t r0 = (int64_t)i * per_part, n = rows - r0 < per_part ? rows - r0 : per_part;
        const uint64_t bytes = (uint64_t)n * row_bytes;
        /* 4 more bytes (kept zero): the decoders read 32-bit words at 2-byte-aligned offsets */
        st = ei_vk_buffer_alloc(ctx, bytes + 4, 0, &w->parts[i]);
        if (st == EI_OK) st = ei_vk_buffer_write(ctx, &w->parts[i], 0, (const char *)data + (uint64_t)r0 * row_bytes, bytes);
        if (st == EI_OK) st = ei_vk_buffer_write(ctx, &w->parts[i], bytes, "\0\0\0\0", 4);
    }
    if (st != EI_OK) ei_vk_weights_free(ctx, w);
    return st;
}

ei_status ei_vk_shader_index_for(const char *type, const char *kernel, int variant, int *index) {
    char name[64];
    snprintf(name, sizeof name, "%s_%s%s%s", kernel, type, variant & EI_VK_SUBGROUPS ? "_sg" : "", variant & EI_VK_INT_DOT ? "_dot" : "");
    return ei_vk_shader_index(name, index);
}

typedef struct {
    uint32_t cols, rows, row_bytes, n_tokens, x_stride, y_stride, y_first, x_first;
} gemm_push;

#define TOKENS_PER_GROUP 8u /* gemm.comp's TOKENS */

/* rows of groups in x (and y beyond EI_VK_MAX_GROUPS): the shaders take row = y * nx + x */
static void row_groups(int64_t rows, uint32_t *gx, uint32_t *gy) {
    *gx = rows < (int64_t)EI_VK_MAX_GROUPS ? (uint32_t)rows : EI_VK_MAX_GROUPS;
    *gy = (uint32_t)((rows + *gx - 1) / *gx);
}

ei_status ei_vk_gemm_at(ei_vk_context *ctx, const ei_vk_weights *w, ei_vk_buffer *x, int64_t x_first, int64_t n_tokens,
                        int64_t x_stride, ei_vk_buffer *y, int64_t y_stride) {
    if (w->partner != EI_TYPE_F32 && w->partner != EI_TYPE_F16 && w->partner != EI_TYPE_BF16)
        return ei_fail(EI_ERR_INVALID, "ei_vk_gemm: a block type's product takes quantized activations (ei_vk_products)");
    if (n_tokens <= 0 || x_first < 0 || x_stride < w->cols || y_stride < w->rows || (uint64_t)n_tokens > (uint64_t)EI_VK_MAX_GROUPS * TOKENS_PER_GROUP ||
        (uint64_t)x_first + (uint64_t)(n_tokens - 1) * (uint64_t)x_stride + (uint64_t)w->cols > x->bytes / 4 ||
        (uint64_t)(n_tokens - 1) * (uint64_t)y_stride + (uint64_t)w->rows > y->bytes / 4)
        return ei_fail(EI_ERR_INVALID, "ei_vk_gemm: shapes do not fit the buffers");
    for (int i = 0; i < w->n_parts; i++) {
        const int64_t r0 = (int64_t)i * w->rows_per_part;
        const int64_t n = w->rows - r0 < w->rows_per_part ? w->rows - r0 : w->rows_per_part;
        const gemm_push push = {(uint32_t)w->cols, (uint32_t)n, (uint32_t)w->row_bytes, (uint32_t)n_tokens,
                                (uint32_t)x_stride, (uint32_t)y_stride, (uint32_t)r0, (uint32_t)x_first};
        ei_vk_buffer *bind[EI_VK_BINDINGS] = {&w->parts[i], x, y, NULL};
        uint32_t gx, gy;
        row_groups(n, &gx, &gy);
        const uint32_t gz = (uint32_t)((n_tokens + TOKENS_PER_GROUP - 1) / TOKENS_PER_GROUP);
        const ei_status st = ei_vk_dispatch(ctx, w->gemm_shader, bind, &push, sizeof push, gx, gy, gz);
        if (st != EI_OK) return st;
    }
    return EI_OK;
}

typedef struct {
    uint32_t cols, rows, row_bytes, n, y_stride, id_first;
} rows_push;

ei_status ei_vk_get_rows(ei_vk_context *ctx, const ei_vk_weights *w, ei_vk_buffer *ids, int64_t n, ei_vk_buffer *y, int64_t y_stride) {
    if (n <= 0 || n > (int64_t)EI_VK_MAX_GROUPS || y_stride < w->cols || (uint64_t)n > ids->bytes / 4 ||
        (uint64_t)(n - 1) * (uint64_t)y_stride + (uint64_t)w->cols > y->bytes / 4)
        return ei_fail(EI_ERR_INVALID, "ei_vk_get_rows: shapes do not fit the buffers");
    for (int i = 0; i < w->n_parts; i++) {
        const int64_t r0 = (int64_t)i * w->rows_per_part;
        const int64_t rows = w->rows - r0 < w->rows_per_part ? w->rows - r0 : w->rows_per_part;
        const rows_push push = {(uint32_t)w->cols, (uint32_t)rows, (uint32_t)w->row_bytes, (uint32_t)n, (uint32_t)y_stride, (uint32_t)r0};
        ei_vk_buffer *bind[EI_VK_BINDINGS] = {&w->parts[i], ids, y, NULL};
        const uint32_t gx = (uint32_t)((w->cols / 32 + 63) / 64);
        const ei_status st = ei_vk_dispatch(ctx, w->rows_shader, bind, &push, sizeof push, gx, (uint32_t)n, 1);
        if (st != EI_OK) return st;
    }
    return EI_OK;
}

/* ---- activations quantized as the CPU quantizes them ------------------------------------ */

static int64_t scale_stride(int64_t cols) { return cols / 32 + cols / 16; }

ei_status ei_vk_act_alloc(ei_vk_context *ctx, int64_t tokens, int64_t cols, ei_vk_act *act) {
    memset(act, 0, sizeof *act);
    act->tokens = tokens;
    act->cols = cols;
    ei_status st = ei_vk_buffer_alloc(ctx, (uint64_t)(tokens * cols), 0, &act->q);
    if (st == EI_OK) st = ei_vk_buffer_alloc(ctx, (uint64_t)(tokens * scale_stride(cols)) * 4, 0, &act->s);
    if (st == EI_OK) st = ei_vk_buffer_alloc(ctx, (uint64_t)(tokens * cols) * 4, 0, &act->f);
    if (st != EI_OK) ei_vk_act_free(ctx, act);
    return st;
}

void ei_vk_act_free(ei_vk_context *ctx, ei_vk_act *act) {
    ei_vk_buffer_free(ctx, &act->q);
    ei_vk_buffer_free(ctx, &act->s);
    ei_vk_buffer_free(ctx, &act->f);
}

static const char *act_shader(int partner) {
    switch (partner) {
    case EI_TYPE_Q8_0: return "quantize_q8_0";
    case EI_TYPE_Q8_1: return "quantize_q8_1";
    case EI_TYPE_Q8_K: return "quantize_q8_k";
    case EI_TYPE_F16: return "quantize_f16";
    case EI_TYPE_BF16: return "quantize_bf16";
    default: return NULL;
    }
}

static ei_status quantize(ei_vk_context *ctx, ei_vk_act *act, int partner, ei_vk_buffer *x, int64_t x_first, int64_t n, int64_t cols,
                          int64_t x_stride) {
    const int block = partner == EI_TYPE_Q8_K ? 256 : 32;
    if (n > act->tokens || cols > act->cols || cols % block || n > (int64_t)EI_VK_MAX_GROUPS)
        return ei_fail(EI_ERR_INVALID, "Vulkan: %lld activations of %lld values do not fit the quantization buffers", (long long)n,
                       (long long)cols);
    struct {
        uint32_t n, cols, x_stride, s_stride, x_first;
    } push = {(uint32_t)n, (uint32_t)cols, (uint32_t)x_stride, (uint32_t)scale_stride(cols), (uint32_t)x_first};
    int s;
    ei_status st = ei_vk_shader_index(act_shader(partner), &s);
    ei_vk_buffer *bind[EI_VK_BINDINGS] = {x, &act->q, &act->s, &act->f};
    return st != EI_OK ? st : ei_vk_dispatch(ctx, s, bind, &push, sizeof push, (uint32_t)(cols / block), (uint32_t)n, 1);
}

typedef struct {
    uint32_t cols, rows, row_bytes, n_tokens, s_stride, y_stride, y_first;
} gemm_q_push;

/* W times the activations quantized into act (their partner type) */
static ei_status gemm_q(ei_vk_context *ctx, const ei_vk_weights *w, ei_vk_act *act, int64_t n, ei_vk_buffer *y, int64_t y_stride) {
    if (n <= 0 || y_stride < w->rows || (uint64_t)(n - 1) * (uint64_t)y_stride + (uint64_t)w->rows > y->bytes / 4)
        return ei_fail(EI_ERR_INVALID, "ei_vk_gemm_q: shapes do not fit the buffers");
    for (int i = 0; i < w->n_parts; i++) {
        const int64_t r0 = (int64_t)i * w->rows_per_part;
        const int64_t rows = w->rows - r0 < w->rows_per_part ? w->rows - r0 : w->rows_per_part;
        const gemm_q_push push = {(uint32_t)w->cols, (uint32_t)rows, (uint32_t)w->row_bytes, (uint32_t)n,
                                  (uint32_t)scale_stride(w->cols), (uint32_t)y_stride, (uint32_t)r0};
        ei_vk_buffer *bind[EI_VK_BINDINGS] = {&w->parts[i], &act->q, &act->s, y};
        uint32_t gx, gy;
        row_groups(rows, &gx, &gy);
        const uint32_t gz = (uint32_t)((n + TOKENS_PER_GROUP - 1) / TOKENS_PER_GROUP);
        const ei_status st = ei_vk_dispatch(ctx, w->gemm_shader, bind, &push, sizeof push, gx, gy, gz);
        if (st != EI_OK) return st;
    }
    return EI_OK;
}

ei_status ei_vk_products(ei_vk_context *ctx, ei_vk_act *act, const ei_vk_product *jobs, int n_jobs, ei_vk_buffer *x,
                         int64_t x_first, int64_t n, int64_t x_stride) {
    for (int j = 0; j < n_jobs; j++) {
        const ei_vk_weights *w = jobs[j].w;
        int first = 1; /* the first job of its partner type quantizes the input for the rest */
        for (int i = 0; i < j; i++) first &= jobs[i].w->partner != w->partner;
        ei_status st = EI_OK;
        if (first && w->partner != EI_TYPE_F32) st = quantize(ctx, act, w->partner, x, x_first, n, w->cols, x_stride);
        if (st != EI_OK) return st;
        if (w->partner == EI_TYPE_F32) st = ei_vk_gemm_at(ctx, w, x, x_first, n, x_stride, jobs[j].y, jobs[j].y_stride);
        else if (w->partner == EI_TYPE_F16 || w->partner == EI_TYPE_BF16) st = ei_vk_gemm_at(ctx, w, &act->f, 0, n, w->cols, jobs[j].y, jobs[j].y_stride);
        else st = gemm_q(ctx, w, act, n, jobs[j].y, jobs[j].y_stride);
        if (st != EI_OK) return st;
    }
    return EI_OK;
}

/* ---- the products from host arrays (tests, and the reference for the offload's parts) ---- */

static ei_status run_from_host(ei_vk_context *ctx, int type, const void *w, int64_t rows, int64_t cols, const void *in,
                               uint64_t in_bytes, float *out, uint64_t out_bytes, int64_t n, int get_rows) {
    ei_vk_weights weights;
    ei_vk_buffer a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    ei_status st = ei_vk_weights_upload(ctx, type, w, rows, cols, &weights);
    if (st != EI_OK) return st;
    st = ei_vk_buffer_alloc(ctx, in_bytes, 1, &a);
    if (st == EI_OK) st = ei_vk_buffer_alloc(ctx, out_bytes, 1, &b);
    if (st == EI_OK) st = ei_vk_buffer_write(ctx, &a, 0, in, in_bytes);
    ei_vk_act act;
    memset(&act, 0, sizeof act);
    if (st == EI_OK && !get_rows) st = ei_vk_act_alloc(ctx, n, cols, &act);
    const ei_vk_product job = {&weights, &b, rows};
    if (st == EI_OK) st = get_rows ? ei_vk_get_rows(ctx, &weights, &a, n, &b, cols) : ei_vk_products(ctx, &act, &job, 1, &a, 0, n, cols);
    if (st == EI_OK) st = ei_vk_submit(ctx);
    else ei_vk_discard(ctx);
    if (st == EI_OK) st = ei_vk_buffer_read(ctx, &b, 0, out, out_bytes);
    ei_vk_act_free(ctx, &act);
    ei_vk_buffer_free(ctx, &b);
    ei_vk_buffer_free(ctx, &a);
    ei_vk_weights_free(ctx, &weights);
    return st;
}

ei_status ei_vk_kernel_gemm(void *ctx, int type, const void *w, int64_t rows, int64_t cols, const float *x, int64_t n, float *y) {
    if (!ctx || !w || !x || !y || rows <= 0 || cols <= 0 || n <= 0) return ei_fail(EI_ERR_INVALID, "ei_vk_kernel_gemm: bad arguments");
    return run_from_host(ctx, type, w, rows, cols, x, (uint64_t)n * (uint64_t)cols * 4, y, (uint64_t)n * (uint64_t)rows * 4, n, 0);
}

ei_status ei_vk_kernel_get_rows(void *ctx, int type, const void *w, int64_t rows, int64_t cols, const int32_t *ids, int64_t n, float *y) {
    if (!ctx || !w || !ids || !y || rows <= 0 || cols <= 0 || n <= 0) return ei_fail(EI_ERR_INVALID, "ei_vk_kernel_get_rows: bad arguments");
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= rows) return ei_fail(EI_ERR_INVALID, "ei_vk_kernel_get_rows: row %d of %lld", (int)ids[i], (long long)rows);
    return run_from_host(ctx, type, w, rows, cols, ids, (uint64_t)n * 4, y, (uint64_t)n * (uint64_t)cols * 4, n, 1);
}

ei_status ei_vk_open(int32_t device, void **ctx) { return ei_vk_context_open(device, (ei_vk_context **)ctx); }

void ei_vk_close(void *ctx) { ei_vk_context_close(ctx); }

ei_status ei_vk_context_info(void *vctx, ei_vk_device *info, int32_t *variants, uint64_t *max_binding_bytes,
                             uint64_t *weight_part_bytes, uint64_t *allocated_bytes) {
    const ei_vk_context *ctx = vctx;
    if (!ctx || !info || !variants || !max_binding_bytes || !weight_part_bytes || !allocated_bytes)
        return ei_fail(EI_ERR_INVALID, "ei_vk_context_info: bad arguments");
    *info = ctx->info;
    *variants = (ctx->subgroups ? EI_VK_SUBGROUPS : 0) | (ctx->int_dot ? EI_VK_INT_DOT : 0);
    *max_binding_bytes = ctx->max_binding_bytes;
    *weight_part_bytes = ctx->weight_part_bytes;
    *allocated_bytes = ctx->allocated_bytes;
    return EI_OK;
}
