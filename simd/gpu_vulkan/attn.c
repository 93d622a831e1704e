/* Attention on the GPU (shaders/attn.comp) over cache rows in device buffers, and its
 * ei_vk_kernel_attn entry point from host arrays, which the tests hold against the scalar
 * reference's attention (simd/ref/attn.c, through ei_kernel_attn). */
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

static ei_status ei_vk_attn_part(ei_vk_context *ctx, const ei_vk_attn_shape *a, int64_t n_tokens, int64_t t0, int64_t count,
                                 ei_vk_buffer **bind);

static const char *cache_type(int type) {
    switch (type) {
    case EI_TYPE_F32: return "f32";
    case EI_TYPE_F16: return "f16";
    case EI_TYPE_Q8_0: return "q8_0";
    case EI_TYPE_Q4_0: return "q4_0";
    default: return NULL;
    }
}

/* the probabilities of tokens [t0, t0 + count), in the scratch, into the tracking counters */
static ei_status track_part(ei_vk_context *ctx, const ei_vk_attn_shape *a, int64_t t0, int64_t count, ei_vk_buffer *scratch,
                            const ei_vk_track *track) {
    if (!track->tokens || !track->counters || (uint64_t)t0 + (uint64_t)count > track->tokens->bytes / 8 ||
        ((uint64_t)track->c0 + track->n) * 8 > track->counters->bytes)
        return ei_fail(EI_ERR_INVALID, "ei_vk_attn: the tracking counters do not fit their buffers");
    int s;
    ei_status st = ei_vk_shader_index("track", &s);
    if (st != EI_OK) return st;
    const struct {
        uint32_t t0, n_tokens, n_head, max_keys, c0, n_counters;
    } push = {(uint32_t)t0, (uint32_t)count, (uint32_t)a->n_head, (uint32_t)a->max_keys, track->c0, track->n};
    ei_vk_buffer *bind[EI_VK_BINDINGS] = {scratch, track->tokens, track->counters};
    const uint32_t groups = (track->n + 63) / 64; /* the shader strides over the rest */
    return ei_vk_dispatch(ctx, s, bind, &push, sizeof push, groups < 4096 ? groups : 4096, 1, 1);
}

ei_status ei_vk_attn(ei_vk_context *ctx, const ei_vk_attn_shape *a, int64_t n_tokens, ei_vk_buffer *q, ei_vk_buffer *k,
                     ei_vk_buffer *v, ei_vk_buffer *runs, ei_vk_buffer *out, ei_vk_buffer *scratch, ei_vk_buffer *shifts,
                     ei_vk_buffer *angles, const ei_vk_track *track) {
    if (a->shifted && (!shifts || !angles)) return ei_fail(EI_ERR_INVALID, "ei_vk_attn: shifted keys without their shifts");
    ei_vk_buffer *bind[EI_VK_BINDINGS] = {q, k, v, runs, out, scratch, shifts, angles};
    /* as many tokens a dispatch as the scratch holds */
    const uint64_t per_token = (uint64_t)(a->n_head > 0 ? a->n_head : 1) * (uint64_t)(a->max_keys > 0 ? a->max_keys : 1) * EI_VK_ATTN_KEY_BYTES;
    const int64_t chunk = (int64_t)(scratch->bytes / per_token);
    if (chunk < 1) return ei_fail(EI_ERR_INVALID, "ei_vk_attn: the scratch holds no token's scores");
    for (int64_t t0 = 0; t0 < n_tokens; t0 += chunk) {
        const int64_t count = n_tokens - t0 < chunk ? n_tokens - t0 : chunk;
        ei_status st = ei_vk_attn_part(ctx, a, n_tokens, t0, count, bind);
        if (st == EI_OK && track) st = track_part(ctx, a, t0, count, scratch, track);
        if (st != EI_OK) return st;
    }
    return EI_OK;
}

/* bind: q, k, v, runs, out, scratch, shifts, angles */
static ei_status ei_vk_attn_part(ei_vk_context *ctx, const ei_vk_attn_shape *a, int64_t n_tokens, int64_t t0, int64_t count,
                                 ei_vk_buffer **bind) {
    ei_vk_buffer *q = bind[0], *runs = bind[3], *out = bind[4], *scratch = bind[5];
    const char *kt = cache_type(a->k_type), *vt = cache_type(a->v_type);
    if (!kt || !vt) return ei_fail(EI_ERR_UNSUPPORTED, "Vulkan attention: no kernel for cache types %d / %d", a->k_type, a->v_type);
    const int quantized = a->k_type == EI_TYPE_Q8_0 || a->k_type == EI_TYPE_Q4_0 || a->v_type == EI_TYPE_Q8_0 || a->v_type == EI_TYPE_Q4_0;
    if (a->hd <= 0 || a->hd > 512 || a->hv <= 0 || a->n_head <= 0 || a->n_head_kv <= 0 || a->n_head % a->n_head_kv ||
        (quantized && (a->hd % 32 || a->hv % 32)) || n_tokens <= 0 || n_tokens > (int64_t)EI_VK_MAX_GROUPS ||
        a->n_head > (int32_t)EI_VK_MAX_GROUPS || a->max_runs <= 0 || a->max_keys <= 0 ||
        (uint64_t)n_tokens * (uint64_t)a->n_head * (uint64_t)a->hd > q->bytes / 4 ||
        (uint64_t)n_tokens * (uint64_t)a->n_head * (uint64_t)a->hv > out->bytes / 4 ||
        (uint64_t)count * (uint64_t)a->n_head * (uint64_t)a->max_keys > scratch->bytes / EI_VK_ATTN_KEY_BYTES ||
        (uint64_t)n_tokens * (uint64_t)(1 + 2 * a->max_runs) > runs->bytes / 4 ||
        (a->hadamard && (!quantized || a->hadamard > a->hd || a->hd % a->hadamard || (a->hadamard & (a->hadamard - 1)))) ||
        (a->shifted && (a->n_rot <= 0 || a->n_rot > a->hd || a->n_rot % 2 || a->angles_first < 0)))
        return ei_fail(EI_ERR_INVALID, "ei_vk_attn: shapes do not fit the buffers");
    char name[48];
    snprintf(name, sizeof name, "attn_%s_%s", kt, vt);
    int s;
    ei_status st = ei_vk_shader_index(name, &s);
    if (st != EI_OK) return st;
    struct {
        uint32_t hd, hv, n_head, n_head_kv, n_tokens, k_row_bytes, v_row_bytes, k_head_bytes, v_head_bytes, max_runs, max_keys;
        float scale, softcap;
        uint32_t t0, shifted, n_rot, neox, hadamard;
        float hadamard_scale;
        uint32_t angles_first;
    } push = {(uint32_t)a->hd, (uint32_t)a->hv, (uint32_t)a->n_head, (uint32_t)a->n_head_kv, (uint32_t)n_tokens,
              (uint32_t)a->k_row_bytes, (uint32_t)a->v_row_bytes, (uint32_t)ei_row_size(a->k_type, a->hd),
              (uint32_t)ei_row_size(a->v_type, a->hv), (uint32_t)a->max_runs, (uint32_t)a->max_keys, a->scale, a->softcap,
              (uint32_t)t0, (uint32_t)a->shifted, (uint32_t)a->n_rot, (uint32_t)a->neox, (uint32_t)a->hadamard,
              a->hadamard ? 1.0f / sqrtf((float)a->hadamard) : 1.0f, (uint32_t)a->angles_first};
    return ei_vk_dispatch(ctx, s, bind, &push, sizeof push, (uint32_t)a->n_head, (uint32_t)count, 1);
}

ei_status ei_vk_kernel_attn(void *vctx, int32_t n_head, int32_t n_head_kv, int32_t hd, int32_t hv, int32_t n_runs,
                            const int32_t *runs, int32_t k_type, int32_t v_type, int64_t k_row_bytes, int64_t v_row_bytes,
                            float scale, float softcap, const float *q, const void *k, int64_t k_rows, const void *v,
                            int64_t v_rows, float *out) {
    ei_vk_context *ctx = vctx;
    if (!ctx || !runs || !q || !k || !v || !out || n_runs <= 0 || k_rows <= 0 || v_rows <= 0 || n_head <= 0 || hd <= 0 || hv <= 0)
        return ei_fail(EI_ERR_INVALID, "ei_vk_kernel_attn: bad arguments");
    uint32_t *table = calloc((size_t)(1 + 2 * n_runs), sizeof *table);
    if (!table) return ei_fail(EI_ERR_NOMEM, "ei_vk_kernel_attn: out of memory");
    int64_t keys = 0;
    table[0] = (uint32_t)n_runs;
    for (int r = 0; r < n_runs; r++) {
        const int32_t first = runs[2 * r], n = runs[2 * r + 1];
        if (first < 0 || n <= 0 || first + (int64_t)n > k_rows || first + (int64_t)n > v_rows) {
            free(table);
            return ei_fail(EI_ERR_INVALID, "ei_vk_kernel_attn: run %d lies outside the rows", r);
        }
        table[1 + 2 * r] = (uint32_t)first;
        table[2 + 2 * r] = (uint32_t)n;
        keys += n;
    }
    const ei_vk_attn_shape shape = {hd, hv, n_head, n_head_kv, k_type, v_type, k_row_bytes, v_row_bytes, n_runs, (int32_t)keys, scale, softcap,
                                    0, 0, 0, 0, 0};
    ei_vk_buffer b[6];
    memset(b, 0, sizeof b);
    const uint64_t sizes[6] = {(uint64_t)n_head * hd * 4, (uint64_t)(k_rows * k_row_bytes), (uint64_t)(v_rows * v_row_bytes),
                               (uint64_t)(1 + 2 * n_runs) * 4, (uint64_t)n_head * hv * 4, (uint64_t)n_head * (uint64_t)keys * EI_VK_ATTN_KEY_BYTES};
    const void *src[6] = {q, k, v, table, NULL, NULL};
    ei_status st = EI_OK;
    for (int i = 0; i < 6 && st == EI_OK; i++) {
        st = ei_vk_buffer_alloc(ctx, sizes[i] + 4, 1, &b[i]); /* + 4: decoders read whole words */
        if (st == EI_OK && src[i]) st = ei_vk_buffer_write(ctx, &b[i], 0, src[i], sizes[i]);
    }
    free(table);
    if (st == EI_OK) st = ei_vk_attn(ctx, &shape, 1, &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], NULL, NULL, NULL);
    if (st == EI_OK) st = ei_vk_submit(ctx);
    else ei_vk_discard(ctx);
    if (st == EI_OK) st = ei_vk_buffer_read(ctx, &b[4], 0, out, sizes[4]);
    for (int i = 0; i < 6; i++) ei_vk_buffer_free(ctx, &b[i]);
    return st;
}
