/* The offloaded part of the forward pass (offload.h): one command buffer a step, recording for
 * each device layer the steps engine.c runs on the CPU (norms, the products, biases, q/k norms,
 * rope, the cache writes, attention, the residual adds, the gated FFN), then the output norm
 * and the output product for the rows whose logits are wanted, in parts that fit a binding. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload.h"
#include "vk_internal.h"

#define MAX_GROUPS 4
#define LOGITS_BYTES (64ull << 20) /* one part of the output product's results */
#define MOVE_CHUNK 1024 /* an eviction's row moves a dispatch */
#define SCRATCH_BYTES (32ull << 20) /* attention's scores between its passes: tokens beyond go in further dispatches */

typedef struct {
    ei_vk_weights wq, wk, wv, wo, gate, up, down;
    ei_vk_buffer attn_norm, ffn_norm, q_norm, k_norm, attn_post_norm, ffn_post_norm, bq, bk, bv;
    ei_vk_buffer k, v; /* (group rows, k_row_bytes), (group rows, v_row_bytes): the layer's cache */
    int group, runs; /* its group of cache blocks, and its set of runs (the group's, its window's) */
} dev_layer;

struct ei_vk_offload {
    ei_vk_context *ctx;
    ei_vk_offload_params p;
    int n_dev;
    dev_layer *layers; /* (n_dev) layers first_layer .. n_layer - 1 */
    ei_vk_weights output;
    ei_vk_buffer output_norm;
    /* (n_batch, width) activations, as the engine's buffers of the same names */
    ei_vk_buffer x, h, q, kk, vv, att, t, gate, up, xo, logits, rope, gelu, scratch;
    ei_vk_act act; /* the products' inputs quantized as the CPU quantizes them */
    /* an eviction's row moves: (MOVE_CHUNK, 3) moves and (EI_VK_MAX_ANGLES, n_rot) angles, host
     * visible; (MOVE_CHUNK, kv_dim floats + v_row_bytes) the rows between the two passes */
    ei_vk_buffer moves, angles, move_rows;
    ei_vk_buffer rows[MAX_GROUPS], runs[MAX_GROUPS];
    /* key_shifts: (group rows) each row's shift, host visible, and (n_bases, n_ctx, n_rot) the
     * rotations of the shifts */
    ei_vk_buffer shifts[MAX_GROUPS], shift_angles;
    /* track: (n_batch, 2) per set of runs, each token's first counter and keys; (n_seq *
     * n_ctx, 2) the counters (lo, hi words); host visible */
    ei_vk_buffer track_tokens[MAX_GROUPS], counters;
    int shifted; /* the step's */
    uint32_t track_c0[MAX_GROUPS], track_n[MAX_GROUPS]; /* the step's counters per set of runs */
    int used[MAX_GROUPS], used_runs[MAX_GROUPS];
    int64_t logit_rows; /* output rows a part */
    int32_t *tables;    /* the parameters' arrays, copied: (n_layer) groups, (n_layer) bases, (MAX_GROUPS) rows */
    int q_dim, kv_dim, v_dim, att_dim;
    int hadamard_k, hadamard_v; /* a quantized cache's rotation blocks (ei_hadamard_block), 0: none */
};


static ei_status upload_vector(ei_vk_context *ctx, const ei_tensor *t, ei_vk_buffer *b) {
    if (!t->data) return EI_OK;
    if (t->type != EI_TYPE_F32) return ei_fail(EI_ERR_UNSUPPORTED, "Vulkan offload: a vector of type %d", t->type);
    ei_status st = ei_vk_buffer_alloc(ctx, (uint64_t)t->ne0 * 4, 0, b);
    return st == EI_OK ? ei_vk_buffer_write(ctx, b, 0, t->data, (uint64_t)t->ne0 * 4) : st;
}

static ei_status upload_matrix(ei_vk_context *ctx, const ei_tensor *t, ei_vk_weights *w) {
    return ei_vk_weights_upload(ctx, t->type, t->data, t->ne1, t->ne0, w);
}

/* a layer's weights, then its KV cache; what each took is added to parts (weights, cache) */
static ei_status upload_layer(ei_vk_offload *o, int il, dev_layer *d, uint64_t *parts) {
    const ei_layer_desc *l = &o->p.m->layers[il];
    ei_vk_context *ctx = o->ctx;
    const uint64_t before = ei_vk_held_bytes(ctx);
    ei_status st = upload_matrix(ctx, &l->wq, &d->wq);
    if (st == EI_OK) st = upload_matrix(ctx, &l->wk, &d->wk);
    if (st == EI_OK) st = upload_matrix(ctx, &l->wv, &d->wv);
    if (st == EI_OK) st = upload_matrix(ctx, &l->wo, &d->wo);
    if (st == EI_OK) st = upload_matrix(ctx, &l->ffn_gate, &d->gate);
    if (st == EI_OK) st = upload_matrix(ctx, &l->ffn_up, &d->up);
    if (st == EI_OK) st = upload_matrix(ctx, &l->ffn_down, &d->down);
    const ei_tensor *v[9] = {&l->attn_norm, &l->ffn_norm, &l->q_norm, &l->k_norm, &l->attn_post_norm, &l->ffn_post_norm, &l->bq, &l->bk, &l->bv};
    ei_vk_buffer *b[9] = {&d->attn_norm, &d->ffn_norm, &d->q_norm, &d->k_norm, &d->attn_post_norm, &d->ffn_post_norm, &d->bq, &d->bk, &d->bv};
    for (int i = 0; i < 9 && st == EI_OK; i++) st = upload_vector(ctx, v[i], b[i]);
    const uint64_t weights = ei_vk_held_bytes(ctx);
    parts[0] += weights - before;
    d->group = o->p.layer_group[il];
    d->runs = o->p.layer_runs[il];
    const uint64_t rows = (uint64_t)o->p.group_rows[d->group];
    if (st == EI_OK) st = ei_vk_buffer_alloc(ctx, rows * (uint64_t)o->p.k_row_bytes + 4, 0, &d->k);
    if (st == EI_OK) st = ei_vk_buffer_alloc(ctx, rows * (uint64_t)o->p.v_row_bytes + 4, 0, &d->v);
    parts[1] += ei_vk_held_bytes(ctx) - weights;
    if (st == EI_OK && (d->k.bytes > ctx->max_binding_bytes || d->v.bytes > ctx->max_binding_bytes))
        st = ei_fail(EI_ERR_NOMEM, "Vulkan offload: layer %d's KV cache (%llu bytes of keys) is over %s's binding limit of %llu bytes; "
                     "use a smaller context, fewer sequences or a smaller kv_budget", il, (unsigned long long)d->k.bytes, ctx->info.name,
                     (unsigned long long)ctx->max_binding_bytes);
    return st;
}

static void free_layer(ei_vk_context *ctx, dev_layer *d) {
    ei_vk_weights *w[7] = {&d->wq, &d->wk, &d->wv, &d->wo, &d->gate, &d->up, &d->down};
    for (int i = 0; i < 7; i++) ei_vk_weights_free(ctx, w[i]);
    ei_vk_buffer *b[11] = {&d->attn_norm, &d->ffn_norm, &d->q_norm, &d->k_norm, &d->attn_post_norm, &d->ffn_post_norm, &d->bq, &d->bk, &d->bv, &d->k, &d->v};
    for (int i = 0; i < 11; i++) ei_vk_buffer_free(ctx, b[i]);
}

/* everything but the context: the layers, the output and the buffers */
static void release(ei_vk_offload *o) {
    for (int i = 0; o->layers && i < o->n_dev; i++) free_layer(o->ctx, &o->layers[i]);
    free(o->layers);
    o->layers = NULL;
    ei_vk_weights_free(o->ctx, &o->output);
    ei_vk_buffer *b[] = {&o->output_norm, &o->x, &o->h, &o->q, &o->kk, &o->vv, &o->att, &o->t, &o->gate, &o->up,
                         &o->xo, &o->logits, &o->rope, &o->gelu, &o->scratch, &o->moves, &o->angles, &o->move_rows,
                         &o->shift_angles, &o->counters};
    for (size_t i = 0; i < sizeof b / sizeof *b; i++) ei_vk_buffer_free(o->ctx, b[i]);
    ei_vk_act_free(o->ctx, &o->act);
    for (int g = 0; g < MAX_GROUPS; g++) {
        ei_vk_buffer_free(o->ctx, &o->rows[g]);
        ei_vk_buffer_free(o->ctx, &o->runs[g]);
        ei_vk_buffer_free(o->ctx, &o->shifts[g]);
        ei_vk_buffer_free(o->ctx, &o->track_tokens[g]);
    }
}

void ei_vk_offload_free(ei_vk_offload *o) {
    if (!o) return;
    if (o->ctx) {
        release(o); /* the layers with it: they are made with a context only */
        ei_vk_context_close(o->ctx);
    }
    free(o->tables);
    free(o);
}

static ei_status alloc_activations(ei_vk_offload *o) {
    const ei_model_desc *m = o->p.m;
    ei_vk_context *ctx = o->ctx;
    const uint64_t nb = (uint64_t)o->p.n_batch, E = (uint64_t)m->n_embd;
    o->logit_rows = (int64_t)((ctx->max_binding_bytes < LOGITS_BYTES ? ctx->max_binding_bytes : LOGITS_BYTES) / ((uint64_t)m->n_vocab * 4));
    if (o->logit_rows < 1) return ei_fail(EI_ERR_UNSUPPORTED, "Vulkan offload: one row of %d logits is over the binding limit", m->n_vocab);
    if (o->logit_rows > o->p.n_batch) o->logit_rows = o->p.n_batch;
    const uint64_t one = (uint64_t)m->n_head * (uint64_t)o->p.n_ctx * EI_VK_ATTN_KEY_BYTES; /* one token's scores */
    uint64_t scratch = SCRATCH_BYTES < ctx->max_binding_bytes ? SCRATCH_BYTES : ctx->max_binding_bytes;
    if (scratch > one * nb) scratch = one * nb;
    if (scratch < one) return ei_fail(EI_ERR_UNSUPPORTED, "Vulkan offload: one token's attention scores (%llu bytes) are over the binding limit",
                                      (unsigned long long)one);
    struct {
        ei_vk_buffer *b;
        uint64_t bytes;
        int host;
    } want[] = {
        {&o->x, nb * E * 4, 1}, {&o->h, nb * E * 4, 0}, {&o->q, nb * (uint64_t)o->q_dim * 4, 0},
        {&o->kk, nb * (uint64_t)o->kv_dim * 4, 0}, {&o->vv, nb * (uint64_t)o->v_dim * 4, 0},
        {&o->att, nb * (uint64_t)o->att_dim * 4, 0}, {&o->t, nb * E * 4, 0}, {&o->gate, nb * (uint64_t)m->n_ff * 4, 0},
        {&o->up, nb * (uint64_t)m->n_ff * 4, 0}, {&o->xo, nb * E * 4, 0},
        {&o->logits, (uint64_t)o->logit_rows * (uint64_t)m->n_vocab * 4, 1},
        {&o->rope, (uint64_t)(o->p.n_bases > 0 ? o->p.n_bases : 1) * nb * (uint64_t)m->n_rot * 4, 1},
        {&o->gelu, 65536 * 2, 0}, {&o->scratch, scratch, 0},
        {&o->moves, MOVE_CHUNK * 3 * 4, 1}, {&o->angles, (uint64_t)EI_VK_MAX_ANGLES * (uint64_t)(m->n_rot > 0 ? m->n_rot : 2) * 4, 1},
        {&o->move_rows, MOVE_CHUNK * ((uint64_t)o->kv_dim * 4 + (uint64_t)o->p.v_row_bytes), 0},
    };
    ei_status st = EI_OK;
    for (size_t i = 0; i < sizeof want / sizeof *want && st == EI_OK; i++) st = ei_vk_buffer_alloc(ctx, want[i].bytes, want[i].host, want[i].b);
    for (int g = 0; g < MAX_GROUPS && st == EI_OK; g++) {
        if (o->used[g]) st = ei_vk_buffer_alloc(ctx, nb * 4, 1, &o->rows[g]);
        if (st == EI_OK && o->used_runs[g]) st = ei_vk_buffer_alloc(ctx, nb * (uint64_t)(1 + 2 * o->p.max_runs) * 4, 1, &o->runs[g]);
        if (st == EI_OK && o->used[g] && o->p.key_shifts) {
            st = ei_vk_buffer_alloc(ctx, (uint64_t)o->p.group_rows[g] * 4, 1, &o->shifts[g]);
            if (st == EI_OK && o->shifts[g].mapped) memset(o->shifts[g].mapped, 0, o->shifts[g].bytes); /* no row shifted yet */
        }
    }
    for (int g = 0; g < MAX_GROUPS && st == EI_OK && o->p.track; g++)
        if (o->used_runs[g]) st = ei_vk_buffer_alloc(ctx, nb * 8, 1, &o->track_tokens[g]);
    if (st == EI_OK && o->p.track) {
        st = ei_vk_buffer_alloc(ctx, (uint64_t)o->p.n_seq * (uint64_t)o->p.n_ctx * 8, 1, &o->counters);
        if (st == EI_OK && o->counters.mapped) memset(o->counters.mapped, 0, o->counters.bytes);
        else if (st == EI_OK && !ctx->dry_run) st = ei_fail(EI_ERR_UNSUPPORTED, "Vulkan offload: no mapped memory for attention tracking");
    }
    const uint64_t angles = (uint64_t)o->p.n_bases * (uint64_t)o->p.n_ctx * (uint64_t)m->n_rot * 4;
    if (st == EI_OK && o->p.key_shifts) st = ei_vk_buffer_alloc(ctx, angles, 0, &o->shift_angles);
    /* one binding each: over the device's limit, a typed error now (auto: the CPU, saying why) */
    if (st == EI_OK && o->counters.bytes > ctx->max_binding_bytes)
        st = ei_fail(EI_ERR_NOMEM, "Vulkan offload: attention tracking's counters (%d sequences x %d positions: %llu bytes) are over %s's "
                     "binding limit of %llu bytes; use a smaller context or fewer sequences", o->p.n_seq, o->p.n_ctx,
                     (unsigned long long)o->counters.bytes, ctx->info.name, (unsigned long long)ctx->max_binding_bytes);
    if (st == EI_OK && o->shift_angles.bytes > ctx->max_binding_bytes)
        st = ei_fail(EI_ERR_NOMEM, "Vulkan offload: the rotations of a q8_0 / q4_0 key cache's shifts (%d positions x %d rope bases: %llu "
                     "bytes) are over %s's binding limit of %llu bytes; use a smaller context or an f16 key cache", o->p.n_ctx,
                     o->p.n_bases, (unsigned long long)o->shift_angles.bytes, ctx->info.name, (unsigned long long)ctx->max_binding_bytes);
    if (st == EI_OK && o->p.key_shifts && !ctx->dry_run) {
        st = o->p.shift_angles ? ei_vk_buffer_write(ctx, &o->shift_angles, 0, o->p.shift_angles, angles)
                               : ei_fail(EI_ERR_INVALID, "Vulkan offload: shifted keys without their rotations");
        for (int g = 0; g < MAX_GROUPS && st == EI_OK; g++)
            if (o->shifts[g].buffer && !o->shifts[g].mapped) st = ei_fail(EI_ERR_UNSUPPORTED, "Vulkan offload: no mapped memory for key shifts");
    }
    int64_t cols = m->n_embd > m->n_ff ? m->n_embd : m->n_ff;
    if (o->att_dim > cols) cols = o->att_dim;
    if (st == EI_OK) st = ei_vk_act_alloc(ctx, o->p.n_batch, cols, &o->act);
    if (st == EI_OK) st = ei_vk_buffer_write(ctx, &o->gelu, 0, o->p.gelu, 65536 * 2);
    return st;
}

ei_status ei_vk_offload_open(int32_t device, ei_vk_offload **out) {
    *out = NULL;
    ei_vk_offload *o = calloc(1, sizeof *o);
    if (!o) return ei_fail(EI_ERR_NOMEM, "Vulkan offload: out of memory");
    const ei_status st = ei_vk_context_open(device, &o->ctx);
    if (st != EI_OK) {
        free(o);
        return st;
    }
    *out = o;
    return EI_OK;
}

const ei_vk_device *ei_vk_offload_device(const ei_vk_offload *o, int32_t *index) {
    *index = o->ctx->index;
    return &o->ctx->info;
}
uint64_t ei_vk_offload_held(const ei_vk_offload *o) { return o->ctx->allocated_bytes; }

/* parses EDGEINFER_VULKAN_BUDGET: bytes, or a number with K, M or G (powers of 1024) */
static int parse_size(const char *s, uint64_t *out) {
    char *end = NULL;
    const unsigned long long n = strtoull(s, &end, 10);
    if (end == s || n == 0) return 0;
    uint64_t unit = 1;
    if (*end == 'K' || *end == 'k') unit = 1ull << 10, end++;
    else if (*end == 'M' || *end == 'm') unit = 1ull << 20, end++;
    else if (*end == 'G' || *end == 'g') unit = 1ull << 30, end++;
    if (*end == 'i' && unit > 1) end++;
    if ((*end == 'B' || *end == 'b')) end++;
    if (*end || n > UINT64_MAX / unit) return 0;
    *out = n * unit;
    return 1;
}

ei_status ei_vk_offload_budget(const ei_vk_offload *o, uint64_t *free_bytes, int32_t *source) {
    const char *forced = getenv("EDGEINFER_VULKAN_BUDGET");
    if (forced && *forced) {
        if (!parse_size(forced, free_bytes))
            return ei_fail(EI_ERR_INVALID, "EDGEINFER_VULKAN_BUDGET=%s is not a size (bytes, or a number with K, M or G)", forced);
        *source = EI_GPU_BUDGET_FORCED;
    } else if (o->ctx->info.memory_budget) {
        *free_bytes = o->ctx->info.budget_bytes;
        *source = EI_GPU_BUDGET_MEASURED;
    } else {
        *free_bytes = o->ctx->info.device_local_bytes;
        *source = EI_GPU_BUDGET_HEAP;
    }
    return EI_OK;
}

/* takes p (its arrays copied: the engine's model desc outlives the offload, p's arrays need not) */
static ei_status set_params(ei_vk_offload *o, const ei_vk_offload_params *p) {
    const ei_model_desc *m = p->m;
    if (p->first_layer < 0 || p->first_layer > m->n_layer) return ei_fail(EI_ERR_INVALID, "Vulkan offload: first layer %d", p->first_layer);
    const int kt = p->kv_type_k, vt = p->kv_type_v;
    if ((kt != EI_TYPE_F16 && kt != EI_TYPE_F32 && kt != EI_TYPE_Q8_0 && kt != EI_TYPE_Q4_0) ||
        (vt != EI_TYPE_F16 && vt != EI_TYPE_F32 && vt != EI_TYPE_Q8_0 && vt != EI_TYPE_Q4_0))
        return ei_fail(EI_ERR_UNSUPPORTED, "Vulkan offload: cache types %d / %d (f32, f16, q8_0 and q4_0 run on the GPU)", kt, vt);
    if (m->head_dim > 512 || m->n_rot > m->head_dim) return ei_fail(EI_ERR_UNSUPPORTED, "Vulkan offload: heads of %d values", m->head_dim);
    const int L = m->n_layer;
    for (int il = p->first_layer; il < L; il++)
        if (p->layer_group[il] < 0 || p->layer_group[il] >= MAX_GROUPS || p->layer_runs[il] < 0 || p->layer_runs[il] >= MAX_GROUPS)
            return ei_fail(EI_ERR_INVALID, "Vulkan offload: layer %d's cache group", il);
    int32_t *tables = calloc((size_t)(3 * L + MAX_GROUPS), sizeof(int32_t));
    if (!tables) return ei_fail(EI_ERR_NOMEM, "Vulkan offload: out of memory");
    free(o->tables);
    o->tables = tables;
    o->p = *p;
    memcpy(tables, p->layer_group, sizeof(int32_t) * (size_t)L);
    memcpy(tables + L, p->layer_base, sizeof(int32_t) * (size_t)L);
    for (int il = 0; il < L; il++) /* the groups the layers name */
        if (p->layer_group[il] >= 0 && p->layer_group[il] < MAX_GROUPS) tables[2 * L + p->layer_group[il]] = p->group_rows[p->layer_group[il]];
    memcpy(tables + 2 * L + MAX_GROUPS, p->layer_runs, sizeof(int32_t) * (size_t)L);
    o->p.layer_group = tables;
    o->p.layer_base = tables + L;
    o->p.group_rows = tables + 2 * L;
    o->p.layer_runs = tables + 2 * L + MAX_GROUPS;
    o->n_dev = L - p->first_layer;
    o->q_dim = m->n_head * m->head_dim;
    o->kv_dim = m->n_head_kv * m->head_dim;
    o->v_dim = m->n_head_kv * m->head_dim_v;
    o->att_dim = m->n_head * m->head_dim_v;
    o->hadamard_k = ei_hadamard_block(kt, m->head_dim, 1);
    o->hadamard_v = ei_hadamard_block(vt, m->head_dim_v, 0);
    memset(o->used, 0, sizeof o->used);
    memset(o->used_runs, 0, sizeof o->used_runs);
    for (int il = p->first_layer; il < L; il++) {
        o->used[p->layer_group[il]] = 1;
        o->used_runs[p->layer_runs[il]] = 1;
    }
    return EI_OK;
}

/* the device's layers, the output and the buffers; per part (weights, cache, buffers) and per
 * layer (layer_bytes: (n_layer), weights and cache; NULL: not wanted) what each took */
static ei_status build(ei_vk_offload *o, uint64_t *parts, uint64_t *layer_bytes) {
    ei_vk_context *ctx = o->ctx;
    const ei_model_desc *m = o->p.m;
    if (!(o->layers = calloc((size_t)(o->n_dev > 0 ? o->n_dev : 1), sizeof *o->layers)))
        return ei_fail(EI_ERR_NOMEM, "Vulkan offload: out of memory");
    ei_status st = EI_OK;
    for (int i = 0; st == EI_OK && i < o->n_dev; i++) {
        const uint64_t before = parts[0] + parts[1];
        st = upload_layer(o, o->p.first_layer + i, &o->layers[i], parts);
        if (layer_bytes) layer_bytes[o->p.first_layer + i] = parts[0] + parts[1] - before;
    }
    uint64_t held = ei_vk_held_bytes(ctx);
    if (st == EI_OK) st = upload_matrix(ctx, &m->output, &o->output);
    if (st == EI_OK) st = upload_vector(ctx, &m->output_norm, &o->output_norm);
    parts[0] += ei_vk_held_bytes(ctx) - held;
    held = ei_vk_held_bytes(ctx);
    if (st == EI_OK) st = alloc_activations(o);
    parts[2] += ei_vk_held_bytes(ctx) - held;
    return st;
}

ei_status ei_vk_offload_measure(ei_vk_offload *o, const ei_vk_offload_params *p, uint64_t parts[3], uint64_t *layer_bytes) {
    memset(parts, 0, 3 * sizeof *parts);
    ei_status st = set_params(o, p);
    if (st != EI_OK) return st;
    ei_vk_context *ctx = o->ctx;
    ctx->dry_run = 1;
    ctx->dry_bytes = 0;
    ctx->dry_staged = 0;
    st = build(o, parts, layer_bytes);
    if (st == EI_OK && ctx->dry_staged && !ctx->staging.buffer) { /* the writes' staging buffer: host-visible, kept */
        ei_vk_buffer staging;
        st = ei_vk_buffer_alloc(ctx, ei_vk_staging_bytes(), 1, &staging);
        parts[2] += ctx->dry_bytes - (parts[0] + parts[1] + parts[2]);
    }
    release(o);
    ctx->dry_run = 0;
    return st;
}

ei_status ei_vk_offload_load(ei_vk_offload *o, const ei_vk_offload_params *p) {
    ei_status st = set_params(o, p);
    uint64_t parts[3] = {0, 0, 0};
    if (st == EI_OK) st = build(o, parts, NULL);
    if (st != EI_OK) release(o);
    return st;
}

/* ---- one step ---------------------------------------------------------------------------- */

#define TRY(call)                             \
    do {                                      \
        const ei_status st_ = (call);         \
        if (st_ != EI_OK) return st_;         \
    } while (0)

static ei_status attention_part(ei_vk_offload *o, const dev_layer *d, int il, int n) {
    const ei_model_desc *m = o->p.m;
    ei_vk_context *ctx = o->ctx;
    const ei_layer_desc *l = &m->layers[il];
    const int64_t E = m->n_embd;
    TRY(ei_vk_rms_norm(ctx, &o->x, (ei_vk_buffer *)&d->attn_norm, &o->h, E, n, E, E, m->norm_eps));
    const ei_vk_product qkv[3] = {{&d->wq, &o->q, o->q_dim}, {&d->wk, &o->kk, o->kv_dim}, {&d->wv, &o->vv, o->v_dim}};
    TRY(ei_vk_products(ctx, &o->act, qkv, 3, &o->h, 0, n, E));
    if (l->bq.data) TRY(ei_vk_op_rows(ctx, EI_VK_OP_ADD_ROW, &o->q, (ei_vk_buffer *)&d->bq, (int64_t)n * o->q_dim, 0, o->q_dim));
    if (l->bk.data) TRY(ei_vk_op_rows(ctx, EI_VK_OP_ADD_ROW, &o->kk, (ei_vk_buffer *)&d->bk, (int64_t)n * o->kv_dim, 0, o->kv_dim));
    if (l->bv.data) TRY(ei_vk_op_rows(ctx, EI_VK_OP_ADD_ROW, &o->vv, (ei_vk_buffer *)&d->bv, (int64_t)n * o->v_dim, 0, o->v_dim));
    const int64_t hd = m->head_dim;
    if (l->q_norm.data) TRY(ei_vk_rms_norm(ctx, &o->q, (ei_vk_buffer *)&d->q_norm, &o->q, hd, (int64_t)n * m->n_head, hd, hd, m->norm_eps));
    if (l->k_norm.data)
        TRY(ei_vk_rms_norm(ctx, &o->kk, (ei_vk_buffer *)&d->k_norm, &o->kk, hd, (int64_t)n * m->n_head_kv, hd, hd, m->norm_eps));
    /* the rope table of the layer's base: (n_batch, n_rot) rows at base * n_batch */
    TRY(ei_vk_rope_at(ctx, &o->q, &o->rope, (int64_t)o->p.layer_base[il] * o->p.n_batch * m->n_rot, n, m->n_head, hd, m->n_rot, o->q_dim,
                      m->rope_neox));
    TRY(ei_vk_rope_at(ctx, &o->kk, &o->rope, (int64_t)o->p.layer_base[il] * o->p.n_batch * m->n_rot, n, m->n_head_kv, hd, m->n_rot,
                      o->kv_dim, m->rope_neox));
    if (m->scale_q) TRY(ei_vk_op(ctx, EI_VK_OP_SCALE, &o->q, NULL, (int64_t)n * o->q_dim, m->kq_scale));
    /* a quantized cache holds its rows rotated, and the queries meet them rotated: the
     * attention rotates each query as it prepares it (after a key shift's rope) */
    if (o->hadamard_k) TRY(ei_vk_hadamard(ctx, &o->kk, n, o->kv_dim, o->kv_dim, o->hadamard_k));
    if (o->hadamard_v) TRY(ei_vk_hadamard(ctx, &o->vv, n, o->v_dim, o->v_dim, o->hadamard_v));
    ei_vk_buffer *rows = &o->rows[d->group];
    TRY(ei_vk_set_rows(ctx, o->p.kv_type_k, (ei_vk_buffer *)&d->k, o->p.k_row_bytes, &o->kk, n, o->kv_dim, o->kv_dim, rows));
    TRY(ei_vk_set_rows(ctx, o->p.kv_type_v, (ei_vk_buffer *)&d->v, o->p.v_row_bytes, &o->vv, n, o->v_dim, o->v_dim, rows));
    const ei_vk_attn_shape a = {m->head_dim, m->head_dim_v, m->n_head, m->n_head_kv, o->p.kv_type_k, o->p.kv_type_v,
                                o->p.k_row_bytes, o->p.v_row_bytes, o->p.max_runs, o->p.n_ctx,
                                m->scale_q ? 1.0f : m->kq_scale, 0.0f, o->hadamard_k, o->shifted, m->n_rot, m->rope_neox,
                                (int64_t)o->p.layer_base[il] * o->p.n_ctx * m->n_rot};
    const ei_vk_track track = {&o->track_tokens[d->runs], &o->counters, o->track_c0[d->runs], o->track_n[d->runs]};
    TRY(ei_vk_attn(ctx, &a, n, &o->q, (ei_vk_buffer *)&d->k, (ei_vk_buffer *)&d->v, &o->runs[d->runs], &o->att, &o->scratch,
                   o->shifted ? &o->shifts[d->group] : NULL, o->shifted ? &o->shift_angles : NULL, o->p.track ? &track : NULL));
    if (o->hadamard_v) TRY(ei_vk_hadamard(ctx, &o->att, n, o->att_dim, o->att_dim, o->hadamard_v)); /* rotated back */
    const ei_vk_product wo = {&d->wo, &o->t, E};
    TRY(ei_vk_products(ctx, &o->act, &wo, 1, &o->att, 0, n, o->att_dim));
    if (l->attn_post_norm.data) TRY(ei_vk_rms_norm(ctx, &o->t, (ei_vk_buffer *)&d->attn_post_norm, &o->t, E, n, E, E, m->norm_eps));
    TRY(ei_vk_op(ctx, EI_VK_OP_ADD, &o->x, &o->t, (int64_t)n * E, 0));
    return EI_OK;
}

static ei_status ffn_part(ei_vk_offload *o, const dev_layer *d, int il, int n) {
    const ei_model_desc *m = o->p.m;
    ei_vk_context *ctx = o->ctx;
    const int64_t E = m->n_embd;
    TRY(ei_vk_rms_norm(ctx, &o->x, (ei_vk_buffer *)&d->ffn_norm, &o->h, E, n, E, E, m->norm_eps));
    const ei_vk_product gu[2] = {{&d->gate, &o->gate, m->n_ff}, {&d->up, &o->up, m->n_ff}};
    TRY(ei_vk_products(ctx, &o->act, gu, 2, &o->h, 0, n, E));
    TRY(ei_vk_glu(ctx, &o->gate, &o->up, &o->gelu, (int64_t)n * m->n_ff, m->act_gelu));
    const ei_vk_product down = {&d->down, &o->t, E};
    TRY(ei_vk_products(ctx, &o->act, &down, 1, &o->gate, 0, n, m->n_ff));
    if (m->layers[il].ffn_post_norm.data)
        TRY(ei_vk_rms_norm(ctx, &o->t, (ei_vk_buffer *)&d->ffn_post_norm, &o->t, E, n, E, E, m->norm_eps));
    return ei_vk_op(ctx, EI_VK_OP_ADD, &o->x, &o->t, (int64_t)n * E, 0);
}

/* the pool's block copies (a sequence writing into a block it shared) in every device layer of
 * the block's group */
static ei_status record_copies(ei_vk_offload *o, int n, const int32_t *copies, int block) {
    for (int c = 0; c < n; c++) {
        const int32_t g = copies[3 * c], src = copies[3 * c + 1], dst = copies[3 * c + 2];
        if (g < 0 || g >= MAX_GROUPS || src < 0 || dst < 0 || (int64_t)(src > dst ? src : dst) * block + block > o->p.group_rows[g])
            return ei_fail(EI_ERR_INVALID, "Vulkan offload: a copy of block %d to %d in group %d", src, dst, g);
        if (o->shifts[g].mapped) { /* the rows' shifts go with them (host memory) */
            uint32_t *sh = o->shifts[g].mapped;
            memcpy(sh + (size_t)dst * (size_t)block, sh + (size_t)src * (size_t)block, sizeof(uint32_t) * (size_t)block);
        }
        for (int i = 0; i < o->n_dev; i++) {
            dev_layer *d = &o->layers[i];
            if (d->group != g) continue;
            const uint64_t kb = (uint64_t)block * (uint64_t)o->p.k_row_bytes, vb = (uint64_t)block * (uint64_t)o->p.v_row_bytes;
            const ei_vk_buffer_copy k = {(uint64_t)src * kb, (uint64_t)dst * kb, kb}, v = {(uint64_t)src * vb, (uint64_t)dst * vb, vb};
            TRY(ei_vk_copy(o->ctx, &d->k, &d->k, 1, &k));
            TRY(ei_vk_copy(o->ctx, &d->v, &d->v, 1, &v));
        }
    }
    return EI_OK;
}

ei_status ei_vk_offload_copy_blocks(ei_vk_offload *o, int n, const int32_t *copies, int block) {
    if (n <= 0) return EI_OK;
    ei_status st = record_copies(o, n, copies, block);
    if (st == EI_OK) st = ei_vk_submit(o->ctx);
    else ei_vk_discard(o->ctx);
    return st;
}

ei_status ei_vk_offload_move_rows(ei_vk_offload *o, int il, int n, const int32_t *moves, int n_angles, const float *angles) {
    const ei_model_desc *m = o->p.m;
    const int k_mode = o->p.kv_type_k == EI_TYPE_F32 ? 0 : o->p.kv_type_k == EI_TYPE_F16 ? 1 : 2; /* 2: as they are */
    if (il < o->p.first_layer || il >= m->n_layer || n < 0 || n_angles < 0 || n_angles > EI_VK_MAX_ANGLES || (k_mode < 2 && o->kv_dim > 4096) ||
        (k_mode == 2 && (!o->p.key_shifts || n_angles)) || o->p.k_row_bytes % 4 || o->p.v_row_bytes % 4)
        return ei_fail(EI_ERR_UNSUPPORTED, "Vulkan offload: moving %d rows of layer %d (%d shifts)", n, il, n_angles);
    dev_layer *d = &o->layers[il - o->p.first_layer];
    ei_vk_context *ctx = o->ctx;
    int s;
    ei_status st = ei_vk_shader_index("move_rows", &s);
    if (st == EI_OK && n_angles) st = ei_vk_buffer_write(ctx, &o->angles, 0, angles, (uint64_t)n_angles * (uint64_t)m->n_rot * 4);
    for (int c0 = 0; st == EI_OK && c0 < n; c0 += MOVE_CHUNK) { /* the buffers are rewritten: a submit a chunk */
        const int count = n - c0 < MOVE_CHUNK ? n - c0 : MOVE_CHUNK;
        st = ei_vk_buffer_write(ctx, &o->moves, 0, moves + 3 * (size_t)c0, (uint64_t)count * 12);
        struct {
            uint32_t n, kv_dim, k_words, v_words, n_head_kv, head_dim, n_rot, neox, k_mode, phase;
        } push = {(uint32_t)count, (uint32_t)o->kv_dim, (uint32_t)(o->p.k_row_bytes / 4), (uint32_t)(o->p.v_row_bytes / 4),
                  (uint32_t)m->n_head_kv, (uint32_t)m->head_dim, (uint32_t)m->n_rot, (uint32_t)m->rope_neox, (uint32_t)k_mode, 0};
        ei_vk_buffer *bind[EI_VK_BINDINGS] = {&d->k, &d->v, &o->move_rows, &o->moves, &o->angles, NULL};
        if (st == EI_OK) st = ei_vk_dispatch(ctx, s, bind, &push, sizeof push, (uint32_t)count, 1, 1);
        push.phase = 1;
        if (st == EI_OK) st = ei_vk_dispatch(ctx, s, bind, &push, sizeof push, (uint32_t)count, 1, 1);
        if (st == EI_OK) st = ei_vk_submit(ctx);
        else ei_vk_discard(ctx);
    }
    return st;
}

ei_status ei_vk_offload_set_shifts(ei_vk_offload *o, int il, int n, const int64_t *rows, const int32_t *shifts) {
    if (il < o->p.first_layer || il >= o->p.m->n_layer || n < 0) return ei_fail(EI_ERR_INVALID, "Vulkan offload: shifts of layer %d", il);
    const int g = o->layers[il - o->p.first_layer].group;
    uint32_t *sh = o->shifts[g].mapped; /* (group rows) */
    if (!sh) return ei_fail(EI_ERR_INVALID, "Vulkan offload: this cache keeps no key shifts");
    for (int i = 0; i < n; i++) {
        if (rows[i] < 0 || rows[i] >= (int64_t)o->p.group_rows[g] || shifts[i] < 0 || shifts[i] >= o->p.n_ctx)
            return ei_fail(EI_ERR_INVALID, "Vulkan offload: row %lld cannot hold shift %d", (long long)rows[i], shifts[i]);
        sh[rows[i]] = (uint32_t)shifts[i];
    }
    return EI_OK;
}

/* entries [i, i + n) of the caller's rows (n, bytes) to or from rows [row, row + n) of b */
static ei_status copy_rows(ei_vk_context *ctx, ei_vk_buffer *b, int64_t row, int i, int n, uint64_t bytes, void *rows, int write) {
    if (!rows) return EI_OK;
    char *at = (char *)rows + (uint64_t)i * bytes;
    return write ? ei_vk_buffer_write(ctx, b, (uint64_t)row * bytes, at, (uint64_t)n * bytes)
                 : ei_vk_buffer_read(ctx, b, (uint64_t)row * bytes, at, (uint64_t)n * bytes);
}

ei_status ei_vk_offload_rows(ei_vk_offload *o, int il, int n, const int64_t *rows, void *k, void *v, int write) {
    if (il < o->p.first_layer || il >= o->p.m->n_layer || n < 0) return ei_fail(EI_ERR_INVALID, "Vulkan offload: rows of layer %d", il);
    dev_layer *d = &o->layers[il - o->p.first_layer];
    const int64_t held = (int64_t)o->p.group_rows[d->group];
    for (int i = 0, run; i < n; i += run) { /* consecutive rows in one copy (a block's positions) */
        if (rows[i] < 0 || rows[i] >= held) return ei_fail(EI_ERR_INVALID, "Vulkan offload: layer %d has no row %lld", il, (long long)rows[i]);
        for (run = 1; i + run < n && rows[i + run] == rows[i] + run && rows[i] + run < held;) run++;
        TRY(copy_rows(o->ctx, &d->k, rows[i], i, run, (uint64_t)o->p.k_row_bytes, k, write));
        TRY(copy_rows(o->ctx, &d->v, rows[i], i, run, (uint64_t)o->p.v_row_bytes, v, write));
    }
    return EI_OK;
}

static ei_status output_part(ei_vk_offload *o, const ei_vk_offload_step *s) {
    const ei_model_desc *m = o->p.m;
    ei_vk_context *ctx = o->ctx;
    const int64_t E = m->n_embd;
    ei_vk_buffer_copy regions[64];
    for (int j = 0; j < s->n_out;) { /* the output rows gathered at the front of xo */
        uint32_t k = 0;
        for (; k < 64 && j < s->n_out; k++, j++)
            regions[k] = (ei_vk_buffer_copy){(uint64_t)s->out_rows[j] * (uint64_t)E * 4, (uint64_t)j * (uint64_t)E * 4, (uint64_t)E * 4};
        TRY(ei_vk_copy(ctx, &o->x, &o->xo, k, regions));
    }
    TRY(ei_vk_rms_norm(ctx, &o->xo, &o->output_norm, &o->h, E, s->n_out, E, E, m->norm_eps));
    for (int64_t r0 = 0; r0 < s->n_out; r0 += o->logit_rows) {
        const int64_t n = s->n_out - r0 < o->logit_rows ? s->n_out - r0 : o->logit_rows;
        const ei_vk_product out = {&o->output, &o->logits, m->n_vocab};
        TRY(ei_vk_products(ctx, &o->act, &out, 1, &o->h, r0 * E, n, E));
        if (m->final_softcap != 0.0f) TRY(ei_vk_op(ctx, EI_VK_OP_SOFTCAP, &o->logits, NULL, n * m->n_vocab, m->final_softcap));
        TRY(ei_vk_submit(ctx));
        TRY(ei_vk_buffer_read(ctx, &o->logits, 0, s->logits + r0 * m->n_vocab, (uint64_t)n * (uint64_t)m->n_vocab * 4));
    }
    return EI_OK;
}

static ei_status run_step(ei_vk_offload *o, const ei_vk_offload_step *s);

/* a step's tracking tokens of run set g ((n, 2) first counter, keys) and the counters they reach */
static ei_status track_range(ei_vk_offload *o, int g, const uint32_t *tokens, int n) {
    const uint64_t counters = (uint64_t)o->p.n_seq * (uint64_t)o->p.n_ctx;
    uint64_t lo = counters, hi = 0;
    for (int i = 0; i < n; i++) {
        const uint64_t a = tokens[2 * i], b = a + tokens[2 * i + 1];
        if (b > counters) return ei_fail(EI_ERR_INVALID, "Vulkan offload: token %d's keys reach past the tracking counters", i);
        if (a < lo) lo = a;
        if (b > hi) hi = b;
    }
    o->track_c0[g] = (uint32_t)(hi > lo ? lo : 0);
    o->track_n[g] = (uint32_t)(hi > lo ? hi - lo : 0);
    return ei_vk_buffer_write(o->ctx, &o->track_tokens[g], 0, tokens, (uint64_t)n * 8);
}

/* counters [c0, c1) added to scores (laid out as they are: sequence x position) and zeroed */
static void take_counters(uint32_t *c, uint64_t c0, uint64_t c1, int64_t *scores) {
    for (uint64_t i = c0; i < c1; i++) {
        scores[i] += (int64_t)(((uint64_t)c[2 * i + 1] << 32) | c[2 * i]);
        c[2 * i] = c[2 * i + 1] = 0;
    }
}

ei_status ei_vk_offload_take_track(ei_vk_offload *o, const ei_vk_offload_step *s, int64_t *scores) {
    uint32_t *c = o->counters.mapped; /* (n_seq * n_ctx, 2) */
    if (!c) return ei_fail(EI_ERR_INVALID, "Vulkan offload: no tracking counters");
    for (int g = 0; g < MAX_GROUPS; g++) { /* each token's keys (checked by track_range), touching ranges at once */
        const uint32_t *t = o->used_runs[g] ? s->track[g] : NULL;
        uint64_t lo = 0, hi = 0;
        for (int i = 0; t && i < s->n; i++) {
            const uint64_t a = t[2 * i], b = a + t[2 * i + 1];
            if (a <= hi && b >= lo && hi > lo) {
                lo = a < lo ? a : lo;
                hi = b > hi ? b : hi;
                continue;
            }
            take_counters(c, lo, hi, scores);
            lo = a, hi = b;
        }
        take_counters(c, lo, hi, scores); /* a second run set finds its counters taken: zeros */
    }
    return EI_OK;
}

ei_status ei_vk_offload_run(ei_vk_offload *o, const ei_vk_offload_step *s) {
    const ei_status st = run_step(o, s);
    if (st != EI_OK) {
        ei_vk_discard(o->ctx);
        if (o->counters.mapped) memset(o->counters.mapped, 0, o->counters.bytes); /* no part of a failed step counts */
    }
    return st;
}

static ei_status run_step(ei_vk_offload *o, const ei_vk_offload_step *s) {
    const ei_model_desc *m = o->p.m;
    ei_vk_context *ctx = o->ctx;
    const int n = s->n;
    if (n <= 0 || n > o->p.n_batch || s->n_out < 0 || s->n_out > n) return ei_fail(EI_ERR_INVALID, "Vulkan offload: a step of %d tokens", n);
    TRY(ei_vk_buffer_write(ctx, &o->x, 0, s->x, (uint64_t)n * (uint64_t)m->n_embd * 4));
    const uint64_t base = (uint64_t)o->p.n_batch * (uint64_t)m->n_rot; /* floats of one base's table */
    for (int b = 0; b < o->p.n_bases; b++) /* the step's rows of each: n of n_batch */
        TRY(ei_vk_buffer_write(ctx, &o->rope, (uint64_t)b * base * 4, s->rope + (size_t)b * base, (uint64_t)n * (uint64_t)m->n_rot * 4));
    o->shifted = s->shifted && o->p.key_shifts;
    for (int g = 0; g < MAX_GROUPS; g++) {
        if (o->used[g]) TRY(ei_vk_buffer_write(ctx, &o->rows[g], 0, s->rows[g], (uint64_t)n * 4));
        if (o->used_runs[g]) TRY(ei_vk_buffer_write(ctx, &o->runs[g], 0, s->runs[g], (uint64_t)n * (uint64_t)(1 + 2 * o->p.max_runs) * 4));
        if (o->used_runs[g] && o->p.track) TRY(track_range(o, g, s->track[g], n));
    }
    TRY(record_copies(o, s->n_copies, s->copies, s->block));
    for (int g = 0; g < MAX_GROUPS; g++) /* a new key is rotated where it is (after the copies' shifts) */
        for (int i = 0; o->used[g] && o->shifts[g].mapped && i < n; i++) {
            if (s->rows[g][i] >= (uint32_t)o->p.group_rows[g]) return ei_fail(EI_ERR_INVALID, "Vulkan offload: no cache row %u", s->rows[g][i]);
            ((uint32_t *)o->shifts[g].mapped)[s->rows[g][i]] = 0;
        }
    for (int i = 0; i < o->n_dev; i++) {
        TRY(attention_part(o, &o->layers[i], o->p.first_layer + i, n));
        TRY(ffn_part(o, &o->layers[i], o->p.first_layer + i, n));
    }
    if (s->n_out == 0) return ei_vk_submit(ctx);
    return output_part(o, s);
}
