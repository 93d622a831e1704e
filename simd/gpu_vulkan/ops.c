/* The non-matmul steps of a layer on the GPU (shaders norm.comp, rope.comp, glu.comp and
 * ops.comp), recorded into the context like gemm; and their ei_vk_kernel_* entry points from
 * host arrays, which the tests hold against the scalar reference's ops (simd/ref/ops.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

static void groups_for(uint64_t n, uint32_t per_group, uint32_t *gx, uint32_t *gy) {
    const uint64_t groups = (n + per_group - 1) / per_group;
    *gx = groups < EI_VK_MAX_GROUPS ? (uint32_t)(groups ? groups : 1) : EI_VK_MAX_GROUPS;
    *gy = (uint32_t)((groups + *gx - 1) / *gx);
}

static ei_status shader(const char *name, int *index) { return ei_vk_shader_index(name, index); }

ei_status ei_vk_rms_norm(ei_vk_context *ctx, ei_vk_buffer *x, ei_vk_buffer *w, ei_vk_buffer *y, int64_t n, int64_t rows,
                         int64_t x_stride, int64_t y_stride, float eps) {
    if (n <= 0 || rows <= 0 || x_stride < n || y_stride < n || (w && w->bytes / 4 < (uint64_t)n) ||
        (uint64_t)(rows - 1) * (uint64_t)x_stride + (uint64_t)n > x->bytes / 4 ||
        (uint64_t)(rows - 1) * (uint64_t)y_stride + (uint64_t)n > y->bytes / 4)
        return ei_fail(EI_ERR_INVALID, "ei_vk_rms_norm: shapes do not fit the buffers");
    struct {
        uint32_t n, rows, x_stride, y_stride, has_weight;
        float eps;
    } push = {(uint32_t)n, (uint32_t)rows, (uint32_t)x_stride, (uint32_t)y_stride, w != NULL, eps};
    int s;
    ei_status st = shader("rms_norm", &s);
    uint32_t gx, gy;
    groups_for((uint64_t)rows, 1, &gx, &gy);
    ei_vk_buffer *bind[EI_VK_BINDINGS] = {x, w ? w : x, y, NULL};
    return st != EI_OK ? st : ei_vk_dispatch(ctx, s, bind, &push, sizeof push, gx, gy, 1);
}

ei_status ei_vk_rope(ei_vk_context *ctx, ei_vk_buffer *x, ei_vk_buffer *cs, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                     int64_t n_rot, int64_t token_stride, int neox) {
    return ei_vk_rope_at(ctx, x, cs, 0, n_tokens, n_heads, head_dim, n_rot, token_stride, neox);
}

ei_status ei_vk_rope_at(ei_vk_context *ctx, ei_vk_buffer *x, ei_vk_buffer *cs, int64_t cs_first, int64_t n_tokens, int64_t n_heads,
                        int64_t head_dim, int64_t n_rot, int64_t token_stride, int neox) {
    if (n_tokens <= 0 || n_tokens > (int64_t)EI_VK_MAX_GROUPS || n_heads <= 0 || n_rot <= 0 || n_rot % 2 || n_rot > head_dim ||
        cs_first < 0 || token_stride < n_heads * head_dim || (uint64_t)(cs_first + n_tokens * n_rot) > cs->bytes / 4 ||
        (uint64_t)((n_tokens - 1) * token_stride + n_heads * head_dim) > x->bytes / 4)
        return ei_fail(EI_ERR_INVALID, "ei_vk_rope: shapes do not fit the buffers (%lld tokens, %lld heads of %lld, n_rot %lld, stride %lld, table from %lld of %llu, %llu values)", (long long)n_tokens, (long long)n_heads, (long long)head_dim, (long long)n_rot, (long long)token_stride, (long long)cs_first, (unsigned long long)cs->bytes / 4, (unsigned long long)x->bytes / 4);
    struct {
        uint32_t n_tokens, n_heads, head_dim, n_rot, token_stride, neox, cs_first;
    } push = {(uint32_t)n_tokens, (uint32_t)n_heads, (uint32_t)head_dim, (uint32_t)n_rot, (uint32_t)token_stride, neox != 0,
              (uint32_t)cs_first};
    int s;
    ei_status st = shader("rope", &s);
    const uint32_t gx = (uint32_t)((n_heads * n_rot / 2 + 63) / 64);
    ei_vk_buffer *bind[EI_VK_BINDINGS] = {x, cs, NULL, NULL};
    return st != EI_OK ? st : ei_vk_dispatch(ctx, s, bind, &push, sizeof push, gx, (uint32_t)n_tokens, 1);
}

ei_status ei_vk_glu(ei_vk_context *ctx, ei_vk_buffer *g, ei_vk_buffer *u, ei_vk_buffer *gelu_table, int64_t n, int gelu) {
    if (n <= 0 || (uint64_t)n > g->bytes / 4 || (uint64_t)n > u->bytes / 4 || (gelu && (!gelu_table || gelu_table->bytes < 131072)))
        return ei_fail(EI_ERR_INVALID, "ei_vk_glu: shapes do not fit the buffers");
    struct {
        uint32_t n, gelu;
    } push = {(uint32_t)n, gelu != 0};
    int s;
    ei_status st = shader("glu", &s);
    uint32_t gx, gy;
    groups_for((uint64_t)n, 64, &gx, &gy);
    ei_vk_buffer *bind[EI_VK_BINDINGS] = {g, u, gelu_table ? gelu_table : g, NULL};
    return st != EI_OK ? st : ei_vk_dispatch(ctx, s, bind, &push, sizeof push, gx, gy, 1);
}

static const char *const op_names[] = {"op_add", "op_scale", "op_softcap", "op_add_row"};

ei_status ei_vk_op(ei_vk_context *ctx, int op, ei_vk_buffer *y, ei_vk_buffer *x, int64_t n, float s) {
    return ei_vk_op_rows(ctx, op, y, x, n, s, n);
}

ei_status ei_vk_op_rows(ei_vk_context *ctx, int op, ei_vk_buffer *y, ei_vk_buffer *x, int64_t n, float s, int64_t period) {
    if (op < 0 || op > EI_VK_OP_ADD_ROW || n <= 0 || period <= 0 || (uint64_t)n > y->bytes / 4 ||
        (op == EI_VK_OP_ADD && (!x || (uint64_t)n > x->bytes / 4)) || (op == EI_VK_OP_ADD_ROW && (!x || (uint64_t)period > x->bytes / 4)) ||
        (op == EI_VK_OP_SOFTCAP && s == 0.0f))
        return ei_fail(EI_ERR_INVALID, "ei_vk_op: bad arguments");
    struct {
        uint32_t n;
        float s;
        uint32_t period;
    } push = {(uint32_t)n, s, (uint32_t)period};
    int index;
    ei_status st = shader(op_names[op], &index);
    uint32_t gx, gy;
    groups_for((uint64_t)n, 64, &gx, &gy);
    ei_vk_buffer *bind[EI_VK_BINDINGS] = {y, x ? x : y, NULL, NULL};
    return st != EI_OK ? st : ei_vk_dispatch(ctx, index, bind, &push, sizeof push, gx, gy, 1);
}

#define SET_ROWS_MAX_WORDS 2048 /* set_rows.comp's shared row for Q8_0 / Q4_0 */

static const char *set_rows_shader(int type) {
    switch (type) {
    case EI_TYPE_F32: return "set_rows_f32";
    case EI_TYPE_F16: return "set_rows_f16";
    case EI_TYPE_Q8_0: return "set_rows_q8_0";
    case EI_TYPE_Q4_0: return "set_rows_q4_0";
    default: return NULL;
    }
}

ei_status ei_vk_set_rows(ei_vk_context *ctx, int type, ei_vk_buffer *cache, int64_t row_bytes, ei_vk_buffer *x, int64_t n,
                         int64_t width, int64_t x_stride, ei_vk_buffer *rows) {
    const char *name = set_rows_shader(type);
    const int blocks = type == EI_TYPE_Q8_0 || type == EI_TYPE_Q4_0;
    if (!name || n <= 0 || n > (int64_t)EI_VK_MAX_GROUPS || width <= 0 || row_bytes % 4 || (type == EI_TYPE_F16 && width % 2) ||
        (blocks && (width % 32 || ei_row_size(type, width) > 4 * SET_ROWS_MAX_WORDS)) ||
        (int64_t)ei_row_size(type, width) > row_bytes || (uint64_t)n > rows->bytes / 4)
        return ei_fail(EI_ERR_INVALID, "ei_vk_set_rows: bad arguments");
    struct {
        uint32_t n, width, x_stride, row_bytes;
    } push = {(uint32_t)n, (uint32_t)width, (uint32_t)x_stride, (uint32_t)row_bytes};
    int s;
    ei_status st = shader(name, &s);
    const uint32_t gx = blocks ? 1 : (uint32_t)(((type == EI_TYPE_F16 ? width / 2 : width) + 63) / 64);
    ei_vk_buffer *bind[EI_VK_BINDINGS] = {cache, x, rows, NULL, NULL, NULL};
    return st != EI_OK ? st : ei_vk_dispatch(ctx, s, bind, &push, sizeof push, gx, (uint32_t)n, 1);
}

ei_status ei_vk_hadamard(ei_vk_context *ctx, ei_vk_buffer *x, int64_t n, int64_t width, int64_t stride, int block) {
    if (n <= 0 || n > (int64_t)EI_VK_MAX_GROUPS || block < 2 || block > 512 || (block & (block - 1)) || width % block ||
        stride < width || (uint64_t)(n - 1) * (uint64_t)stride + (uint64_t)width > x->bytes / 4)
        return ei_fail(EI_ERR_INVALID, "ei_vk_hadamard: bad arguments");
    struct {
        uint32_t n, width, stride, block;
        float scale;
    } push = {(uint32_t)n, (uint32_t)width, (uint32_t)stride, (uint32_t)block, 1.0f / sqrtf((float)block)}; /* ref/ops.c's */
    int s;
    ei_status st = shader("hadamard", &s);
    ei_vk_buffer *bind[EI_VK_BINDINGS] = {x, NULL, NULL, NULL, NULL, NULL};
    return st != EI_OK ? st : ei_vk_dispatch(ctx, s, bind, &push, sizeof push, (uint32_t)(width / block), (uint32_t)n, 1);
}

/* ---- from host arrays ---------------------------------------------------------------------- */

#define HOST_MAX 3

/* buffers holding copies of the host arrays in[i] (bytes[i] each; NULL: uninitialised) */
typedef struct {
    ei_vk_buffer b[HOST_MAX];
    int n;
} host_set;

static ei_status host_upload(ei_vk_context *ctx, host_set *h, int n, const void *const *in, const uint64_t *bytes) {
    memset(h, 0, sizeof *h);
    ei_status st = EI_OK;
    for (int i = 0; i < n && st == EI_OK; i++, h->n++) {
        st = ei_vk_buffer_alloc(ctx, bytes[i], 1, &h->b[i]);
        if (st == EI_OK && in[i]) st = ei_vk_buffer_write(ctx, &h->b[i], 0, in[i], bytes[i]);
    }
    return st;
}

static ei_status host_finish(ei_vk_context *ctx, host_set *h, ei_status st, int out, void *dst, uint64_t bytes) {
    if (st == EI_OK) st = ei_vk_submit(ctx);
    else ei_vk_discard(ctx);
    if (st == EI_OK) st = ei_vk_buffer_read(ctx, &h->b[out], 0, dst, bytes);
    for (int i = 0; i < h->n; i++) ei_vk_buffer_free(ctx, &h->b[i]);
    return st;
}

ei_status ei_vk_kernel_rms_norm(void *ctx, int32_t n, int32_t rows, float *y, const float *x, const float *w, float eps) {
    if (!ctx || n <= 0 || rows <= 0 || !y || !x) return ei_fail(EI_ERR_INVALID, "ei_vk_kernel_rms_norm: bad arguments");
    host_set h;
    const uint64_t bytes = (uint64_t)n * (uint64_t)rows * 4;
    const void *in[2] = {x, w};
    const uint64_t sizes[2] = {bytes, (uint64_t)n * 4};
    ei_status st = host_upload(ctx, &h, w ? 2 : 1, in, sizes);
    if (st == EI_OK) st = ei_vk_rms_norm(ctx, &h.b[0], w ? &h.b[1] : NULL, &h.b[0], n, rows, n, n, eps);
    return host_finish(ctx, &h, st, 0, y, bytes);
}

ei_status ei_vk_kernel_rope(void *ctx, int32_t n_tokens, int32_t n_heads, int32_t head_dim, int32_t n_rot, float *x,
                            const float *cs, int32_t neox) {
    if (!ctx || !x || !cs || n_tokens <= 0 || n_heads <= 0 || head_dim <= 0) return ei_fail(EI_ERR_INVALID, "ei_vk_kernel_rope: bad arguments");
    host_set h;
    const uint64_t bytes = (uint64_t)n_tokens * (uint64_t)n_heads * (uint64_t)head_dim * 4;
    const void *in[2] = {x, cs};
    const uint64_t sizes[2] = {bytes, (uint64_t)n_tokens * (uint64_t)(n_rot > 0 ? n_rot : 1) * 4};
    ei_status st = host_upload(ctx, &h, 2, in, sizes);
    if (st == EI_OK) st = ei_vk_rope(ctx, &h.b[0], &h.b[1], n_tokens, n_heads, head_dim, n_rot, (int64_t)n_heads * head_dim, neox);
    return host_finish(ctx, &h, st, 0, x, bytes);
}

ei_status ei_vk_kernel_glu(void *ctx, int32_t gelu, int32_t n, float *y, const float *g, const float *u) {
    if (!ctx || n <= 0 || !y || !g || !u) return ei_fail(EI_ERR_INVALID, "ei_vk_kernel_glu: bad arguments");
    ei_f16 *table = gelu ? malloc(65536 * sizeof *table) : NULL;
    if (gelu && !table) return ei_fail(EI_ERR_NOMEM, "ei_vk_kernel_glu: out of memory");
    if (table) ei_gelu_table(table);
    host_set h;
    const uint64_t bytes = (uint64_t)n * 4;
    const void *in[3] = {g, u, table};
    const uint64_t sizes[3] = {bytes, bytes, 65536 * sizeof(ei_f16)};
    ei_status st = host_upload(ctx, &h, gelu ? 3 : 2, in, sizes);
    free(table);
    if (st == EI_OK) st = ei_vk_glu(ctx, &h.b[0], &h.b[1], gelu ? &h.b[2] : NULL, n, gelu);
    return host_finish(ctx, &h, st, 0, y, bytes);
}

ei_status ei_vk_kernel_op(void *ctx, int32_t op, int32_t n, float *y, const float *x, float s) {
    if (!ctx || n <= 0 || !y) return ei_fail(EI_ERR_INVALID, "ei_vk_kernel_op: bad arguments");
    host_set h;
    const uint64_t bytes = (uint64_t)n * 4;
    const void *in[2] = {y, x};
    const uint64_t sizes[2] = {bytes, bytes};
    ei_status st = host_upload(ctx, &h, x ? 2 : 1, in, sizes);
    if (st == EI_OK) st = ei_vk_op(ctx, op, &h.b[0], x ? &h.b[1] : NULL, n, s);
    return host_finish(ctx, &h, st, 0, y, bytes);
}

ei_status ei_vk_kernel_hadamard(void *ctx, int32_t n, int32_t width, int32_t block, float *x) {
    if (!ctx || n <= 0 || width <= 0 || !x) return ei_fail(EI_ERR_INVALID, "ei_vk_kernel_hadamard: bad arguments");
    host_set h;
    const uint64_t bytes = (uint64_t)n * (uint64_t)width * 4;
    const void *in[1] = {x};
    ei_status st = host_upload(ctx, &h, 1, in, &bytes);
    if (st == EI_OK) st = ei_vk_hadamard(ctx, &h.b[0], n, width, width, block);
    return host_finish(ctx, &h, st, 0, x, bytes);
}

ei_status ei_vk_kernel_set_rows(void *ctx, int32_t type, int32_t n, int32_t width, const float *x, const int32_t *rows,
                                int32_t n_rows, int64_t row_bytes, void *cache) {
    if (!ctx || n <= 0 || width <= 0 || n_rows <= 0 || !x || !rows || !cache)
        return ei_fail(EI_ERR_INVALID, "ei_vk_kernel_set_rows: bad arguments");
    for (int32_t i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= n_rows) return ei_fail(EI_ERR_INVALID, "ei_vk_kernel_set_rows: row %d outside the cache", rows[i]);
    host_set h;
    const uint64_t cache_bytes = (uint64_t)n_rows * (uint64_t)row_bytes;
    const void *in[3] = {cache, x, rows};
    const uint64_t sizes[3] = {cache_bytes, (uint64_t)n * (uint64_t)width * 4, (uint64_t)n * 4};
    ei_status st = host_upload(ctx, &h, 3, in, sizes);
    if (st == EI_OK) st = ei_vk_set_rows(ctx, type, &h.b[0], row_bytes, &h.b[1], n, width, width, &h.b[2]);
    return host_finish(ctx, &h, st, 0, cache, cache_bytes);
}
