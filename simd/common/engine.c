/* The native forward pass: one call per batch of tokens (prompt chunk, one decoded token,
 * or tokens of several sequences), all threads running it together between barriers.
 *
 * Buffers carry their shapes in comments; "n" is the number of tokens in the step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_softmax.h"
#include "ei_internal.h"
#include "key_shifts.h"
#include "kivi.h"
#include "kv_pool.h"
#include "profile.h"
#include "repack.h"
#include "step_threads.h"
#include "threadpool.h"
#include "../gpu_vulkan/offload.h"

#define MAX_BASES 4     /* distinct rope bases among the layers */
#define ROW_BLOCK 16    /* weight rows one thread takes at a time (kept in L1 across tokens) */
/* the most row blocks a prompt's piece of a product takes (yet 4 pieces a thread): a tile of
 * activations is read once for all of them, and AVX-512 prepares it once for them
 * (gemm_x16_span). The 1.1B Q4_0 model's pp512 on the AVX-512 EPYC (bench --profile): Q4_0
 * products 558 GFLOP/s with pieces of 1, 612 with 4 and the activations prepared per block,
 * 790 / 856 / 880 with pieces of 4 / 8 / 16 prepared once a piece */
#define PROMPT_PIECE 16
static_assert(ROW_BLOCK % EI_X16 == 0, "row blocks hold whole interleaved groups");
#define MAX_BATCH EI_MAX_BATCH  /* tokens per internal step */
#define MAX_JOBS 4      /* products in one group (matmul_group) */
static_assert(MAX_JOBS <= EI_PROF_MAX_JOBS && EI_PROF_MAX_JOBS <= EI_PROF_STRIDE,
              "the profile keeps each thread's time in every product of a group");

struct ei_engine {
    ei_model_desc m;
    ei_layer_desc *layers;
    ei_engine_params p;
    int isa;
    const ei_kernels *k;
    ei_pool *pool;
    ei_step_threads step_threads; /* how many of the pool's threads a small step runs on */
    int embd_from_copy; /* the tied token embedding's rows come from the output's copy */
    uint8_t *embd_rows; /* (n_threads, a token embedding row as stored) for them */
    /* cache strides in bytes, all from ei_row_size of the cache types (p.kv_type_k, _v) */
    size_t k_head_bytes, v_head_bytes;   /* one head of one position: head_dim(_v) values */
    size_t k_row_bytes, v_row_bytes;     /* one position: n_head_kv heads */
    ei_kv_pool *kv;     /* every sequence's cache: tables of blocks from one pool (kv_pool.h) */
    /* EI_KV_KIVI (edgeinfer.h): pool layer il holds layer il's quantized groups, pool layer
     * n_layer + il its f16 residual (k_row_bytes and v_row_bytes above are the residual's) */
    int kivi;
    size_t kivi_k_block, kivi_v_row; /* one KV head's key group, and value row */
    int32_t *kivi_done;  /* (3, n_seq_max) the groups of each sequence quantized and valid; then
                          * kivi_plan's scratch */
    int32_t *kivi_jobs;  /* (2 * max jobs) the (sequence, group) pairs the step quantizes */
    int n_kivi_jobs, max_kivi_jobs;
    ei_attn_run *runs;  /* (n_threads, max runs) the runs of rows one query reads */
    ei_attn_run *room;  /* (n_threads, max runs) attn_block's slices of them */
    int max_runs;
    /* a prompt's attention blocks (attn_block): tokens [blocks[b], blocks[b + 1]) of one
     * sequence at consecutive positions, block_tokens at most; (n_batch + 1) */
    int32_t *blocks;
    int n_blocks, block_tokens;
    size_t scratch_doubles; /* of each thread's scratch */
    /* a q8_0 / q4_0 key cache keeps its keys as first rotated when positions are dropped
     * (key_shifts.h); a query's runs from the pool are then split where the shift changes */
    ei_key_shifts ks;
    /* a q8_0 / q4_0 cache stores its rows Walsh-Hadamard rotated (the table's hadamard), as
     * llama.cpp does: keys and queries in blocks of hadamard_k values, values of hadamard_v,
     * and the attention output rotated back by hadamard_v; 0 for none */
    int hadamard_k, hadamard_v;
    ei_attn_run *pool_runs; /* (n_threads, max_pool_runs) the pool's runs before the split */
    int max_pool_runs;
    int q_dim, kv_dim, v_dim, att_dim, max_cols;
    float *x;        /* (n_batch, n_embd) residual stream */
    float *h;        /* (n_batch, max(n_embd, n_ff)) normalised input of a matmul group */
    float *q, *kk, *vv; /* (n_batch, q_dim), (n_batch, kv_dim), (n_batch, v_dim) */
    float *att;      /* (n_batch, att_dim) attention output per head */
    float *t;        /* (n_batch, n_embd) output of wo and ffn_down */
    float *gate, *up; /* (n_batch, n_ff) */
    uint8_t *act[EI_TYPE_COUNT]; /* (n_batch, row bytes of max_cols) activations per partner type */
    size_t act_row[EI_TYPE_COUNT];
    double *scratch; /* (n_threads, group, 2 * n_ctx) attention weights and scores */
    int64_t *scores; /* (n_seq_max, n_ctx) with track_attention: attention each position received */
    int group;       /* query heads per KV head */
    float *rope;     /* (MAX_BASES, n_batch, n_rot) cos/sin pairs per token */
    float bases[MAX_BASES], scales[MAX_BASES]; /* distinct (rope base, rope scale) pairs */
    int n_bases, *layer_base; /* (n_layer) index into bases */
    float *freq_factors; /* (n_rot / 2) or NULL */
    ei_f16 *gelu;    /* (65536) GELU of every fp16 value, as fp16 */
    ei_repack repack; /* interleaved copies of weights (repack.c) */
    ei_profile prof;  /* the per-op profile (ei_engine_profile); prof.on: recording */
    size_t bytes;
    size_t failed_bytes;   /* the size of the allocation that failed last, for the message */
    /* layer offload (n_gpu_layers): layers [first_gpu, n_layer) and the output on the device;
     * per group of cache blocks, each token's row and runs for it (offload.h) */
    ei_vk_offload *gpu;
    int first_gpu;
    uint32_t *gpu_rows, *gpu_runs; /* (4, n_batch), (4, n_batch, 1 + 2 * max_pool_runs) */
    uint32_t *gpu_track;           /* track_attention: (4, n_batch, 2) each token's first counter, keys */
    int32_t *gpu_out;              /* (n_batch) output rows as the device sees them */
    int32_t *gpu_run_set;          /* (n_layer) each device layer's set of runs (offload.h) */
    ei_gpu_plan gpu_plan;          /* what went to the device, and why (ei_engine_gpu_plan) */
    int32_t *gpu_moves;            /* (n_ctx, 3) an eviction's row moves in one device layer */
    float *gpu_angles;             /* (EI_VK_MAX_ANGLES, n_rot) their rotations */
};

/* ---- allocation ------------------------------------------------------------------------ */

static void *alloc(ei_engine *e, size_t n) {
    void *ptr = calloc(1, n ? n : 1);
    if (ptr) e->bytes += n;
    else e->failed_bytes = n;
    return ptr;
}

void ei_gelu_table(ei_f16 *tab) {
    /* GGML's table: float32 arithmetic with the inner multiply-add fused, a correctly
     * rounded tanh, the result rounded to fp16 (the numpy engine builds the same table) */
    for (int i = 0; i < 65536; i++) {
        const float x = ei_fp16_to_fp32((ei_f16)i);
        const float inner = fmaf(0.044715f * x, x, 1.0f);
        const float arg = (0.7978845608028654f * x) * inner;
        const float t = (float)tanh((double)arg);
        tab[i] = ei_fp32_to_fp16((0.5f * x) * (1.0f + t));
    }
}

static int tensor_ok(const ei_tensor *t, int64_t ne0, int64_t ne1, const ei_kernels *k, int matmul) {
    if (!t->data || t->ne0 != ne0 || t->ne1 != ne1 || t->layout != 0) return 0;
    if (t->type < 0 || t->type >= EI_TYPE_COUNT || ei_block_size(t->type) == 0) return 0;
    if (ne0 % ei_block_size(t->type)) return 0;
    if (matmul) return k->vec_dot[t->type] != NULL;
    return k->to_float[t->type] != NULL;
}

static int vector_ok(const ei_tensor *t, int64_t n) {
    return t->data && t->type == EI_TYPE_F32 && t->ne0 == n && t->ne1 == 1;
}

/* the dimensions the shapes of EI_LAYER_TENSORS are written in */
typedef struct { int64_t n_embd, q_dim, kv_dim, v_dim, att_dim, head_dim, n_ff, one; } layer_dims;

/* whether a layer tensor is as EI_LAYER_TENSORS describes it */
static int layer_tensor_ok(const ei_tensor *t, int matrix, int required, int64_t ne0, int64_t ne1,
                           const ei_kernels *k) {
    if (!t->data) return !required;
    return matrix ? tensor_ok(t, ne0, ne1, k, 1) : vector_ok(t, ne0) && ne1 == 1;
}

#define EI_MATRIX 1
#define EI_VECTOR 0
#define EI_REQUIRED 1
#define EI_OPTIONAL 0
#define CHECK_LAYER_TENSOR_(name, kind, presence, ne0, ne1)                                    \
    if (!layer_tensor_ok(&l->name, kind, presence, d.ne0, d.ne1, k))                           \
        return ei_fail(EI_ERR_UNSUPPORTED, "layer %d: %s has a bad shape or an unsupported type", \
                       il, #name);

static ei_status check_layer(const ei_layer_desc *l, int il, layer_dims d, const ei_kernels *k) {
    EI_LAYER_TENSORS(CHECK_LAYER_TENSOR_)
    if (l->window < 0 || !(l->rope_base > 0) || !(l->rope_scale > 0))
        return ei_fail(EI_ERR_UNSUPPORTED, "layer %d: negative window or non-positive rope base/scale", il);
    return EI_OK;
}

static ei_status check_model(const ei_model_desc *m, const ei_kernels *k) {
    if (m->n_embd <= 0 || m->n_layer <= 0 || m->n_head <= 0 || m->n_head_kv <= 0 || m->n_vocab <= 0 ||
        m->n_head % m->n_head_kv || m->head_dim <= 0 || m->head_dim > EI_MAX_HEAD_DIM ||
        m->head_dim_v <= 0 || m->head_dim_v > EI_MAX_HEAD_DIM || m->n_rot <= 0 ||
        m->n_rot > m->head_dim || m->n_rot % 2 || m->n_ff <= 0 || !m->layers)
        return ei_fail(EI_ERR_INVALID, "inconsistent hyper-parameters");
    const int64_t e = m->n_embd;
    const layer_dims d = {e, (int64_t)m->n_head * m->head_dim, (int64_t)m->n_head_kv * m->head_dim,
                          (int64_t)m->n_head_kv * m->head_dim_v, (int64_t)m->n_head * m->head_dim_v,
                          m->head_dim, m->n_ff, 1};
    if (!tensor_ok(&m->tok_embd, e, m->n_vocab, k, 0)) return ei_fail(EI_ERR_UNSUPPORTED, "token_embd: bad shape or type");
    if (!tensor_ok(&m->output, e, m->n_vocab, k, 1)) return ei_fail(EI_ERR_UNSUPPORTED, "output: bad shape or type");
    if (!vector_ok(&m->output_norm, e)) return ei_fail(EI_ERR_UNSUPPORTED, "output_norm: bad shape or type");
    if (m->rope_freqs.data && !vector_ok(&m->rope_freqs, m->n_rot / 2)) return ei_fail(EI_ERR_UNSUPPORTED, "rope_freqs: bad shape");
    for (int il = 0; il < m->n_layer; il++) {
        const ei_status st = check_layer(&m->layers[il], il, d, k);
        if (st != EI_OK) return st;
    }
    return EI_OK;
}

/* the matrices of a layer (the EI_MATRIX entries of EI_LAYER_TENSORS), in that order */
#define COUNT_MATRIX_(name, kind, presence, ne0, ne1) +(kind == EI_MATRIX)
enum { EI_LAYER_MATRICES = 0 EI_LAYER_TENSORS(COUNT_MATRIX_) };
#define LIST_MATRIX_(name, kind, presence, ne0, ne1) if (kind == EI_MATRIX) out[n++] = &l->name;

static int layer_matrices(ei_layer_desc *l, ei_tensor *out[EI_LAYER_MATRICES]) {
    int n = 0;
    EI_LAYER_TENSORS(LIST_MATRIX_)
    return n;
}

/* copies planned for the layers' matrices and the output; 0: out of memory */
static int plan_packs(ei_engine *e) {
    if (!ei_repack_reserve(&e->repack, e->m.n_layer * EI_LAYER_MATRICES + 1)) return 0;
    for (int il = 0; il < e->m.n_layer; il++) {
        ei_tensor *w[EI_LAYER_MATRICES];
        const int n = layer_matrices(&e->layers[il], w);
        for (int j = 0; j < n; j++)
            if (w[j]->data && !ei_repack_plan(&e->repack, e->k, w[j], NULL, e->p.release_weights)) return 0;
    }
    /* a tied token embedding reads its rows back from the output matrix's copy where the
     * layout allows it, so the file's pages go; else they stay for it */
    const int tied = e->m.output.data == e->m.tok_embd.data;
    e->embd_from_copy = tied && e->m.output.type == e->m.tok_embd.type && ei_x16_unpacks(e->m.output.type);
    const void *shared = e->embd_from_copy ? NULL : e->m.tok_embd.data;
    if (!ei_repack_plan(&e->repack, e->k, &e->m.output, shared, e->p.release_weights)) return 0;
    if (!ei_repack_commit(&e->repack)) return 0;
    e->bytes += e->repack.bytes;
    return 1;
}

static void note_partner(ei_engine *e, const ei_tensor *t) {
    const int pt = ei_partner_type(t->type);
    e->act_row[pt] = ei_row_size(pt, e->max_cols);
}

/* the cache types and layout of the parameters: rows this build can write and read */
static ei_status check_kivi(const ei_engine_params *p, const ei_model_desc *m) {
    if (!ei_kivi_group_ok(p->kivi_group))
        return ei_fail(EI_ERR_INVALID, "kivi_group must be 32, 64 or 128, got %d", p->kivi_group);
    if (p->kivi_residual < 0) /* one of n_ctx or more reads every position in f16 */
        return ei_fail(EI_ERR_INVALID, "kivi_residual must be >= 0, got %d", p->kivi_residual);
    if (!ei_kivi_k_block_bytes(p->kv_type_k, p->kivi_group, m->head_dim))
        return ei_fail(EI_ERR_UNSUPPORTED, "KIVI keys have 2 or 4 bits and at most %d channels, not %d bits and %d",
                       EI_MAX_HEAD_DIM, p->kv_type_k, m->head_dim);
    if (!ei_kivi_v_group(p->kv_type_v, p->kivi_group, m->head_dim_v))
        return ei_fail(EI_ERR_UNSUPPORTED, "KIVI values of %d bits cannot group %d channels by %d", p->kv_type_v,
                       m->head_dim_v, p->kivi_group);
    return EI_OK;
}

static ei_status check_cache(const ei_engine_params *p, const ei_model_desc *m, const ei_kernels *k) {
    if (p->kv_layout == EI_KV_KIVI) return check_kivi(p, m);
    if (p->kv_layout != EI_KV_ROWS) return ei_fail(EI_ERR_UNSUPPORTED, "KV cache layout %d is not supported", p->kv_layout);
    const int types[2] = {p->kv_type_k, p->kv_type_v}, dims[2] = {m->head_dim, m->head_dim_v};
    for (int i = 0; i < 2; i++) {
        const int t = types[i];
        const int writable = t == EI_TYPE_F32 || (t >= 0 && t < EI_TYPE_COUNT && k->from_float[t]);
        if (!writable || !ei_attn_reads(k, t) || !ei_row_size(t, dims[i]))
            return ei_fail(EI_ERR_UNSUPPORTED, "%s: the %s attention cannot use a %s cache of type %d",
                           i ? "values" : "keys", k->name, i ? "value" : "key", t);
    }
    return EI_OK;
}

/* the block pool: layers grouped by window (none where the parameters keep every layer whole) */
static ei_status create_kivi_pool(ei_engine *e) {
    const int L = e->m.n_layer, G = e->p.kivi_group, nh = e->m.n_head_kv;
    size_t *blocks = malloc(4 * sizeof(size_t) * (size_t)L); /* (2 L) key bytes, (2 L) value bytes */
    int32_t *windows = malloc(2 * sizeof(int32_t) * (size_t)L);
    int8_t *grouped = malloc(2 * (size_t)L);
    if (!blocks || !windows || !grouped) {
        free(blocks); free(windows); free(grouped);
        return ei_fail(EI_ERR_NOMEM, "out of memory");
    }
    size_t *k_blocks = blocks, *v_blocks = blocks + 2 * L;
    for (int il = 0; il < L; il++) {
        windows[il] = e->p.ring ? e->layers[il].window : 0;
        k_blocks[il] = (size_t)nh * e->kivi_k_block;
        v_blocks[il] = (size_t)G * nh * e->kivi_v_row;
        grouped[il] = 1;
        /* the residual: what queries read in f16 (all of the context for a long one) */
        windows[L + il] = e->p.kivi_residual < e->p.n_ctx ? e->p.kivi_residual + G : 0;
        k_blocks[L + il] = (size_t)G * e->k_row_bytes;
        v_blocks[L + il] = (size_t)G * e->v_row_bytes;
        grouped[L + il] = 0;
    }
    const ei_kv_pool_params kp = {2 * L, e->p.n_seq_max, e->p.n_ctx, e->p.n_batch, windows, 0, 0,
                                  (size_t)e->p.kv_budget, G, k_blocks, v_blocks, grouped};
    ei_status st;
    e->kv = ei_kv_pool_create(&kp, &st);
    free(blocks); free(windows); free(grouped);
    return st;
}

static ei_status create_pool(ei_engine *e) {
    if (e->kivi) return create_kivi_pool(e);
    int32_t *windows = alloc(e, sizeof(int32_t) * (size_t)e->m.n_layer);
    if (!windows) return ei_fail(EI_ERR_NOMEM, "out of memory");
    for (int il = 0; il < e->m.n_layer; il++) windows[il] = e->p.ring ? e->layers[il].window : 0;
    ei_kv_pool_params kp = {e->m.n_layer, e->p.n_seq_max, e->p.n_ctx, e->p.n_batch, windows,
                            e->k_row_bytes, e->v_row_bytes, (size_t)e->p.kv_budget};
    int8_t *device = e->p.n_gpu_layers ? calloc((size_t)e->m.n_layer, 1) : NULL;
    for (int il = e->first_gpu; device && il < e->m.n_layer; il++) device[il] = 1;
    kp.on_device = device;
    ei_status st;
    e->kv = ei_kv_pool_create(&kp, &st);
    free(windows);
    free(device);
    e->bytes -= sizeof(int32_t) * (size_t)e->m.n_layer;
    return st;
}

static void rope_row(const ei_engine *e, int bi, int pos, float *cs);

/* the offload's parameters for layers [first_gpu, n_layer) as the pool places them, into ints
 * ((3 n_layer + 4): groups, bases, runs, rows) */
static ei_status offload_params(const ei_engine *e, int32_t *ints, ei_vk_offload_params *op) {
    const int L = e->m.n_layer, B = ei_kv_pool_block_size(e->kv);
    int32_t *groups = ints, *bases = ints + L, *runs = ints + 2 * L, *group_rows = ints + 3 * L;
    for (int il = 0; il < L; il++) {
        groups[il] = ei_kv_pool_layer_group(e->kv, il);
        bases[il] = e->layer_base[il];
        group_rows[groups[il]] = ei_kv_pool_group_blocks(e->kv, il) * B;
        runs[il] = 0;
    }
    /* a set of runs for each (group, window) among the device layers: a group can hold layers
     * of several windows (the pool keeps a window whole where the context is short) */
    int set_group[4], set_window[4], n_sets = 0;
    for (int il = e->first_gpu; il < L; il++) {
        int s = 0;
        while (s < n_sets && (set_group[s] != groups[il] || set_window[s] != e->layers[il].window)) s++;
        if (s == n_sets) {
            if (n_sets == 4) return ei_fail(EI_ERR_UNSUPPORTED, "layer offload: more than 4 attention windows");
            set_group[n_sets] = groups[il];
            set_window[n_sets++] = e->layers[il].window;
        }
        runs[il] = s;
    }
    const ei_vk_offload_params p = {&e->m, e->first_gpu, e->p.gpu_device, e->p.n_batch, e->p.n_ctx, e->p.kv_type_k,
                                    e->p.kv_type_v, (int64_t)e->k_row_bytes, (int64_t)e->v_row_bytes, groups, runs, group_rows,
                                    e->max_pool_runs, bases, e->n_bases, e->gelu, e->ks.shift != NULL, NULL,
                                    e->scores != NULL, e->p.n_seq_max};
    *op = p;
    return EI_OK;
}

static double mib(uint64_t bytes) { return (double)bytes / (1 << 20); }

/* what layers [first, n_layer) and the output take on the device: parts (weights, cache,
 * buffers) and each layer's weights and cache (layer_bytes: (n_layer)) */
static ei_status measure_from(ei_engine *e, int first, int32_t *ints, uint64_t parts[3], uint64_t *layer_bytes) {
    const int keep = e->first_gpu;
    e->first_gpu = first;
    ei_vk_offload_params op;
    ei_status st = offload_params(e, ints, &op);
    if (st == EI_OK) st = ei_vk_offload_measure(e->gpu, &op, parts, layer_bytes);
    e->first_gpu = keep;
    return st;
}

/* the most of the output and the last layers that fit in avail bytes (layer_bytes and parts
 * measured with every layer on the device), and their total */
static int most_that_fit(const ei_engine *e, const uint64_t *layer_bytes, const uint64_t parts[3], uint64_t avail, uint64_t *total) {
    uint64_t t = parts[0] + parts[1] + parts[2];
    for (int il = 0; il < e->m.n_layer; il++) t -= layer_bytes[il]; /* the output and the buffers */
    if (t > avail) {
        *total = t;
        return 0;
    }
    int n = 1;
    for (int il = e->m.n_layer - 1; il >= 0 && t + layer_bytes[il] <= avail; il--, n++) t += layer_bytes[il];
    *total = t;
    return n;
}

/* the layers offloaded after all: the pool made again with on_device for them (or none) */
static ei_status settle_layers(ei_engine *e, int n) {
    const int L = e->m.n_layer;
    e->p.n_gpu_layers = n;
    e->gpu_plan.n_gpu_layers = n;
    e->first_gpu = n ? L + 1 - n : L;
    if (!n) {
        ei_vk_offload_free(e->gpu);
        e->gpu = NULL;
        e->gpu_plan.device = -1;
    }
    if (e->kivi) return EI_OK; /* its pool keeps no device layers */
    ei_kv_pool_free(e->kv);
    e->kv = NULL;
    return create_pool(e);
}

/* n_gpu_layers = EI_GPU_AUTO: as many as fit in the free memory less a margin */
static ei_status fit_auto(ei_engine *e, int32_t *ints) {
    const int L = e->m.n_layer;
    ei_gpu_plan *plan = &e->gpu_plan;
    uint64_t parts[3], *layer_bytes = calloc((size_t)L, sizeof(uint64_t));
    if (!layer_bytes) return ei_fail(EI_ERR_NOMEM, "out of memory");
    ei_status st = measure_from(e, 0, ints, parts, layer_bytes);
    /* this model or cache cannot go, or a layer's cache is over the device's binding limit (a
     * dry run allocates nothing else): the CPU runs it all, and the plan says why */
    if (st == EI_ERR_UNSUPPORTED || st == EI_ERR_NOMEM) {
        snprintf(plan->reason, sizeof plan->reason, "%s", ei_last_error());
        free(layer_bytes);
        return settle_layers(e, 0);
    }
    if (st != EI_OK) {
        free(layer_bytes);
        return st;
    }
    const uint64_t cap = 512ull << 20; /* a tenth of the free memory, at most 512 MiB: the driver's and other programs' */
    plan->margin_bytes = plan->free_bytes / 10 < cap ? plan->free_bytes / 10 : cap;
    uint64_t total;
    const int n = most_that_fit(e, layer_bytes, parts, plan->free_bytes - plan->margin_bytes, &total);
    free(layer_bytes);
    if (n == 0)
        snprintf(plan->reason, sizeof plan->reason, "the output and the buffers alone need %.1f MiB, over the %.1f MiB free less a %.1f MiB margin",
                 mib(total), mib(plan->free_bytes), mib(plan->margin_bytes));
    else if (n < L + 1)
        snprintf(plan->reason, sizeof plan->reason, "%d of %d layers beside the output fit in the %.1f MiB free less a %.1f MiB margin",
                 n - 1, L, mib(plan->free_bytes), mib(plan->margin_bytes));
    if (n < L + 1) return settle_layers(e, n);
    e->p.n_gpu_layers = n; /* all of them: the pool already has every layer on the device */
    return EI_OK;
}

/* an explicit n_gpu_layers over the free memory: the numbers, and the most that fits */
static ei_status over_budget(ei_engine *e, int32_t *ints, uint64_t total) {
    const ei_gpu_plan *plan = &e->gpu_plan;
    const int L = e->m.n_layer;
    uint64_t parts[3], fit_total = 0, *layer_bytes = calloc((size_t)L, sizeof(uint64_t));
    int most = -1;
    if (layer_bytes && measure_from(e, 0, ints, parts, layer_bytes) == EI_OK)
        most = most_that_fit(e, layer_bytes, parts, plan->free_bytes, &fit_total);
    free(layer_bytes);
    static const char *source[] = {"", "VK_EXT_memory_budget", "the device-local heap's size", "EDGEINFER_VULKAN_BUDGET"};
    char hint[96] = "";
    if (most >= 0) snprintf(hint, sizeof hint, "; the most that fits is n_gpu_layers %d, or use 'auto'", most);
    return ei_fail(EI_ERR_NOMEM,
                   "n_gpu_layers %d needs %.1f MiB on %s (weights %.1f MiB, KV cache %.1f MiB for %d positions, buffers %.1f MiB) "
                   "but %.1f MiB is free (%s)%s",
                   e->p.n_gpu_layers, mib(total), plan->device_name, mib(plan->weights_bytes), mib(plan->cache_bytes), e->p.n_ctx,
                   mib(plan->buffer_bytes), mib(plan->free_bytes), source[plan->budget_source], hint);
}

/* the device part (n_gpu_layers): its weights, caches and buffers, fitted to the device's free
 * memory, and the host's tables of each step's cache rows and runs */
static ei_status create_offload(ei_engine *e) {
    const int L = e->m.n_layer, automatic = e->p.n_gpu_layers == EI_GPU_AUTO;
    ei_gpu_plan *plan = &e->gpu_plan;
    plan->device = -1;
    if (automatic && e->kivi) {
        snprintf(plan->reason, sizeof plan->reason, "%s", "the KIVI cache layout runs on the CPU only");
        return settle_layers(e, 0);
    }
    ei_status st = ei_vk_offload_open(e->p.gpu_device, &e->gpu);
    if (st == EI_ERR_UNSUPPORTED && !automatic) { /* never a silent fall back to the CPU */
        char why[256];
        snprintf(why, sizeof why, "%s", ei_last_error());
        return ei_fail(EI_ERR_DEVICE, "n_gpu_layers %d asks for a GPU, and there is none to use (%s)", e->p.n_gpu_layers, why);
    }
    if (st != EI_OK) {
        if (st != EI_ERR_UNSUPPORTED) return st;
        snprintf(plan->reason, sizeof plan->reason, "%s", ei_last_error()); /* no GPU */
        return settle_layers(e, 0);
    }
    snprintf(plan->device_name, sizeof plan->device_name, "%s", ei_vk_offload_device(e->gpu, &plan->device)->name);
    if ((st = ei_vk_offload_budget(e->gpu, &plan->free_bytes, &plan->budget_source)) != EI_OK) return st;
    int32_t *ints = calloc((size_t)(3 * L + 4), sizeof(int32_t));
    if (!ints) return ei_fail(EI_ERR_NOMEM, "out of memory");
    if (automatic) st = fit_auto(e, ints);
    uint64_t parts[3] = {0, 0, 0};
    ei_vk_offload_params op;
    if (st == EI_OK && e->gpu) st = offload_params(e, ints, &op);
    if (st == EI_OK && e->gpu) st = ei_vk_offload_measure(e->gpu, &op, parts, NULL);
    plan->n_gpu_layers = e->gpu ? e->p.n_gpu_layers : 0;
    plan->weights_bytes = parts[0];
    plan->cache_bytes = parts[1];
    plan->buffer_bytes = parts[2];
    const uint64_t total = parts[0] + parts[1] + parts[2];
    if (st == EI_OK && e->gpu && !automatic && total > plan->free_bytes) st = over_budget(e, ints, total);
    if (st != EI_OK || !e->gpu) {
        free(ints);
        return st;
    }
    const size_t nb = (size_t)e->p.n_batch;
    e->gpu_rows = alloc(e, 4 * nb * sizeof(uint32_t));
    e->gpu_runs = alloc(e, 4 * nb * (size_t)(1 + 2 * e->max_pool_runs) * sizeof(uint32_t));
    e->gpu_out = alloc(e, nb * sizeof(int32_t));
    if (e->scores && !(e->gpu_track = alloc(e, 4 * nb * 2 * sizeof(uint32_t)))) st = ei_fail(EI_ERR_NOMEM, "out of memory");
    e->gpu_run_set = alloc(e, sizeof(int32_t) * (size_t)L);
    e->gpu_moves = alloc(e, 3 * sizeof(int32_t) * (size_t)e->p.n_ctx);
    e->gpu_angles = alloc(e, sizeof(float) * EI_VK_MAX_ANGLES * (size_t)(e->m.n_rot > 0 ? e->m.n_rot : 2));
    if (e->gpu_run_set) memcpy(e->gpu_run_set, ints + 2 * L, sizeof(int32_t) * (size_t)L);
    if (st == EI_OK)
        st = e->gpu_rows && e->gpu_runs && e->gpu_out && e->gpu_run_set && e->gpu_moves && e->gpu_angles
                 ? EI_OK
                 : ei_fail(EI_ERR_NOMEM, "out of memory");
    float *angles = NULL; /* (n_bases, n_ctx, n_rot) the rotations of key shifts (offload.h) */
    if (st == EI_OK && op.key_shifts) {
        angles = malloc(sizeof(float) * (size_t)e->n_bases * (size_t)e->p.n_ctx * (size_t)e->m.n_rot);
        if (!angles) st = ei_fail(EI_ERR_NOMEM, "out of memory");
        for (int b = 0; angles && b < e->n_bases; b++)
            for (int d = 0; d < e->p.n_ctx; d++) rope_row(e, b, d, angles + ((size_t)b * e->p.n_ctx + d) * e->m.n_rot);
        op.shift_angles = angles;
    }
    if (st == EI_OK && (st = ei_vk_offload_load(e->gpu, &op)) == EI_ERR_NOMEM) { /* the plan fitted, the driver said no */
        char why[512];
        snprintf(why, sizeof why, "%s", ei_last_error());
        st = ei_fail(EI_ERR_NOMEM, "%s (loading n_gpu_layers %d: %.1f MiB planned, %.1f MiB free)", why, e->p.n_gpu_layers,
                     mib(total), mib(plan->free_bytes));
    }
    free(angles);
    free(ints);
    return st;
}

ei_status ei_engine_gpu_plan(const ei_engine *e, ei_gpu_plan *out) {
    if (!e || !out) return ei_fail(EI_ERR_INVALID, "ei_engine_gpu_plan: no engine or output");
    *out = e->gpu_plan;
    if (!e->gpu) out->device = -1;
    out->held_bytes = e->gpu ? ei_vk_offload_held(e->gpu) : 0;
    return EI_OK;
}

ei_status ei_engine_create(const ei_model_desc *m, const ei_engine_params *params, ei_engine **out) {
    *out = NULL;
    if (!m || !params) return ei_fail(EI_ERR_INVALID, "no model or parameters");
    ei_engine_params p = *params;
    if (p.n_ctx <= 0) return ei_fail(EI_ERR_INVALID, "n_ctx must be >= 1, got %d", p.n_ctx);
    if (p.n_threads <= 0 || p.n_threads > EI_MAX_THREADS)
        return ei_fail(EI_ERR_INVALID, "n_threads must lie in [1, %d], got %d", EI_MAX_THREADS, p.n_threads);
    if (p.n_seq_max <= 0) return ei_fail(EI_ERR_INVALID, "n_seq_max must be >= 1, got %d", p.n_seq_max);
    if (p.fixed_threads != 0 && p.fixed_threads != 1)
        return ei_fail(EI_ERR_INVALID, "fixed_threads must be 0 or 1, got %d", p.fixed_threads);
    if (p.kv_budget < 0) return ei_fail(EI_ERR_INVALID, "kv_budget must be >= 0, got %lld", (long long)p.kv_budget);
    if (p.n_batch <= 0 || p.n_batch > MAX_BATCH)
        return ei_fail(EI_ERR_INVALID, "n_batch must lie in [1, %d], got %d", MAX_BATCH, p.n_batch);
    if (p.n_gpu_layers < EI_GPU_AUTO || p.n_gpu_layers > m->n_layer + 1)
        return ei_fail(EI_ERR_INVALID, "n_gpu_layers must lie in [0, %d] (the layers and the output) or be EI_GPU_AUTO, got %d",
                       m->n_layer + 1, p.n_gpu_layers);
    if (p.n_gpu_layers > 0 && p.kv_layout != EI_KV_ROWS)
        return ei_fail(EI_ERR_UNSUPPORTED, "layer offload keeps the KV cache as rows: the KIVI layout runs on the CPU only");
    const int isa = p.isa < 0 ? ei_isa_best() : p.isa;
    const ei_kernels *k = ei_kernels_for(isa);
    if (!k) return ei_fail(EI_ERR_ISA, "instruction set %s is not available: %s", ei_isa_name(isa), ei_isa_reason(isa));
    ei_status st = check_model(m, k);
    if (st == EI_OK) st = check_cache(&p, m, k);
    if (st != EI_OK) return st;

    ei_engine *e = calloc(1, sizeof(*e));
    if (!e) return ei_fail(EI_ERR_NOMEM, "out of memory");
    e->m = *m;
    e->p = p;
    e->isa = isa;
    e->k = k;
    e->layers = alloc(e, sizeof(ei_layer_desc) * (size_t)m->n_layer);
    if (!e->layers) goto nomem;
    memcpy(e->layers, m->layers, sizeof(ei_layer_desc) * (size_t)m->n_layer);
    e->m.layers = e->layers;

    e->q_dim = m->n_head * m->head_dim;
    e->kv_dim = m->n_head_kv * m->head_dim;
    e->v_dim = m->n_head_kv * m->head_dim_v;
    e->att_dim = m->n_head * m->head_dim_v;
    e->max_cols = m->n_embd;
    if (m->n_ff > e->max_cols) e->max_cols = m->n_ff;
    if (e->att_dim > e->max_cols) e->max_cols = e->att_dim;
    e->kivi = p.kv_layout == EI_KV_KIVI;
    e->first_gpu = p.n_gpu_layers == EI_GPU_AUTO ? 0 : p.n_gpu_layers ? m->n_layer + 1 - p.n_gpu_layers : m->n_layer;
    e->k_head_bytes = e->kivi ? 2 * (size_t)m->head_dim : ei_row_size(p.kv_type_k, m->head_dim);
    e->v_head_bytes = e->kivi ? 2 * (size_t)m->head_dim_v : ei_row_size(p.kv_type_v, m->head_dim_v);
    if (e->kivi) {
        e->kivi_k_block = ei_kivi_k_block_bytes(p.kv_type_k, p.kivi_group, m->head_dim);
        e->kivi_v_row = ei_kivi_v_row_bytes(p.kv_type_v, p.kivi_group, m->head_dim_v);
        e->max_kivi_jobs = p.n_seq_max * ((p.n_ctx + p.kivi_group - 1) / p.kivi_group);
        e->kivi_done = alloc(e, 3 * sizeof(int32_t) * (size_t)p.n_seq_max);
        e->kivi_jobs = alloc(e, 2 * sizeof(int32_t) * (size_t)e->max_kivi_jobs);
        if (!e->kivi_done || !e->kivi_jobs) goto nomem;
        memset(e->kivi_done, 0, sizeof(int32_t) * (size_t)p.n_seq_max);
    }
    e->k_row_bytes = e->k_head_bytes * (size_t)m->n_head_kv;
    e->v_row_bytes = e->v_head_bytes * (size_t)m->n_head_kv;

    const size_t nb = (size_t)p.n_batch;
    e->x = alloc(e, nb * m->n_embd * 4);
    e->h = alloc(e, nb * e->max_cols * 4);
    e->q = alloc(e, nb * e->q_dim * 4);
    e->kk = alloc(e, nb * e->kv_dim * 4);
    e->vv = alloc(e, nb * e->v_dim * 4);
    e->att = alloc(e, nb * e->att_dim * 4);
    e->t = alloc(e, nb * m->n_embd * 4);
    e->gate = alloc(e, nb * m->n_ff * 4);
    e->up = alloc(e, nb * m->n_ff * 4);
    e->group = m->n_head / m->n_head_kv;
    /* attention's weights and scores: 1.5 doubles a key for each query of a group, or of a block */
    e->block_tokens = EI_ATTN_BLOCK_QUERIES / e->group;
    e->scratch_doubles = 2 * (size_t)(e->block_tokens ? EI_ATTN_BLOCK_QUERIES : e->group) * (size_t)p.n_ctx;
    e->scratch = alloc(e, (size_t)p.n_threads * e->scratch_doubles * sizeof(double));
    e->blocks = alloc(e, sizeof(int32_t) * (nb + 1));
    e->embd_rows = alloc(e, (size_t)p.n_threads * ei_row_size(m->tok_embd.type, m->n_embd));
    e->rope = alloc(e, MAX_BASES * nb * m->n_rot * 4);
    if (p.track_attention && !(e->scores = alloc(e, sizeof(int64_t) * (size_t)p.n_seq_max * (size_t)p.n_ctx)))
        goto nomem;
    e->gelu = alloc(e, 65536 * sizeof(ei_f16));
    e->layer_base = alloc(e, sizeof(int) * (size_t)m->n_layer);
    if (!e->x || !e->h || !e->q || !e->kk || !e->vv || !e->att || !e->t || !e->gate || !e->up ||
        !e->scratch || !e->blocks || !e->embd_rows || !e->rope || !e->gelu || !e->layer_base)
        goto nomem;
    st = create_pool(e);
    if (st != EI_OK) {
        ei_engine_free(e);
        return st;
    }
    e->max_runs = e->max_pool_runs = ei_kv_pool_max_runs(e->kv);
    const int kept_rotated = !e->kivi && ei_attn_quantized(p.kv_type_k);
    e->hadamard_k = e->kivi ? 0 : ei_hadamard_block(p.kv_type_k, m->head_dim, 1);
    e->hadamard_v = e->kivi ? 0 : ei_hadamard_block(p.kv_type_v, m->head_dim_v, 0);
    if (kept_rotated) { /* a split run holds one position at least */
        e->max_runs += p.n_ctx;
        if (!(e->pool_runs = alloc(e, sizeof(ei_attn_run) * (size_t)e->max_pool_runs * (size_t)p.n_threads)))
            goto nomem;
    }
    if (!(e->runs = alloc(e, sizeof(ei_attn_run) * (size_t)e->max_runs * (size_t)p.n_threads))) goto nomem;
    if (!(e->room = alloc(e, sizeof(ei_attn_run) * (size_t)e->max_runs * (size_t)p.n_threads))) goto nomem;
    ei_gelu_table(e->gelu);

    for (int il = 0; il < m->n_layer; il++) {
        const ei_layer_desc *l = &e->layers[il];
        int b = 0;
        while (b < e->n_bases && (e->bases[b] != l->rope_base || e->scales[b] != l->rope_scale)) b++;
        if (b == e->n_bases) {
            if (e->n_bases == MAX_BASES) { ei_engine_free(e); return ei_fail(EI_ERR_UNSUPPORTED, "more than %d rope bases", MAX_BASES); }
            e->bases[e->n_bases] = l->rope_base;
            e->scales[e->n_bases++] = l->rope_scale;
        }
        e->layer_base[il] = b;
        ei_tensor *w[EI_LAYER_MATRICES];
        const int n_mat = layer_matrices(&e->layers[il], w);
        for (int j = 0; j < n_mat; j++)
            if (w[j]->data) note_partner(e, w[j]);
    }
    note_partner(e, &m->output);
    for (int t = 0; t < EI_TYPE_COUNT; t++) {
        if (e->act_row[t] && !(e->act[t] = alloc(e, nb * e->act_row[t]))) goto nomem;
    }
    if (m->rope_freqs.data) e->freq_factors = (float *)m->rope_freqs.data;
    if (kept_rotated && (st = ei_key_shifts_init(&e->ks, p.n_seq_max, p.n_ctx, e->n_bases, m->n_rot)) != EI_OK) {
        ei_engine_free(e);
        return st;
    }

    e->pool = ei_pool_create(p.n_threads);
    ei_step_threads_init(&e->step_threads, p.n_threads, p.fixed_threads);
    if (!e->pool) {
        ei_engine_free(e);
        return ei_fail(EI_ERR_NOMEM, "out of memory: could not start %d threads", p.n_threads);
    }
    if (!plan_packs(e)) goto nomem;
    if (p.n_gpu_layers && (st = create_offload(e)) != EI_OK) {
        ei_engine_free(e);
        return st;
    }
    *out = e;
    return EI_OK;
nomem: {
    const size_t wanted = e->failed_bytes, held = e->bytes;
    ei_engine_free(e);
    return ei_fail(EI_ERR_NOMEM, "out of memory: %zu bytes wanted for the engine's buffers (%zu held)",
                   wanted, held);
}
}

/* a KIVI sequence's blocks from its first unquantized group on lose the keys given for them:
 * released with one, a block whose group is not quantized would serve a later prefix its
 * unwritten codes */
static void kivi_unkey_stale(ei_engine *e, int s) {
    if (!e->kivi) return;
    const int B = ei_kv_pool_block_size(e->kv);
    for (int i = e->kivi_done[s]; (int64_t)i * B < e->p.n_ctx; i++) ei_kv_pool_set_key(e->kv, s, i, 0);
}

ei_status ei_engine_seq_clear(ei_engine *e, int32_t seq) {
    if (!e || seq < 0 || seq >= e->p.n_seq_max) return ei_fail(EI_ERR_INVALID, "no sequence %d", seq);
    kivi_unkey_stale(e, seq);
    if (e->kivi) e->kivi_done[seq] = 0;
    ei_kv_pool_clear(e->kv, seq); /* its blocks go back to the pool (keyed ones stay cached) */
    ei_key_shifts_reset(&e->ks, seq);
    return EI_OK;
}

int ei_engine_isa(const ei_engine *e) { return e ? e->isa : -1; }

int32_t ei_engine_threads(const ei_engine *e, int32_t n_tokens) {
    return e ? ei_step_threads_current(&e->step_threads, n_tokens) : 0;
}
size_t ei_engine_memory(const ei_engine *e) {
    return e ? e->bytes + ei_kv_pool_bytes(e->kv) + ei_key_shifts_bytes(&e->ks) : 0;
}
size_t ei_engine_weight_copies(const ei_engine *e) { return e ? e->repack.bytes : 0; }

void ei_engine_free(ei_engine *e) {
    if (!e) return;
    ei_vk_offload_free(e->gpu);
    free(e->gpu_rows); free(e->gpu_runs); free(e->gpu_track); free(e->gpu_out); free(e->gpu_run_set); free(e->gpu_moves); free(e->gpu_angles);
    ei_pool_free(e->pool);
    ei_kv_pool_free(e->kv);
    free(e->runs);
    free(e->room);
    free(e->blocks);
    free(e->embd_rows);
    free(e->pool_runs);
    ei_key_shifts_free(&e->ks);
    for (int t = 0; t < EI_TYPE_COUNT; t++) free(e->act[t]);
    free(e->x); free(e->h); free(e->q); free(e->kk); free(e->vv); free(e->att); free(e->t);
    free(e->gate); free(e->up); free(e->scratch); free(e->scores); free(e->rope); free(e->gelu);
    free(e->layer_base); free(e->layers);
    ei_repack_release(&e->repack);
    ei_profile_free(&e->prof);
    free(e);
}

/* ---- the forward task ------------------------------------------------------------------ */

typedef struct {
    ei_engine *e;
    int n;                     /* tokens in this step */
    const int32_t *tok, *pos, *seq;
    int n_out;                 /* tokens whose logits are wanted */
    const int32_t *out_rows;   /* (n_out) their indices in the step */
    float *logits;             /* (n_out, n_vocab) */
} step;

static void split(int n, int ith, int nth, int *a, int *b) {
    *a = (int)((int64_t)n * ith / nth);
    *b = (int)((int64_t)n * (ith + 1) / nth);
}

typedef struct mm_job {
    const ei_tensor *w;
    float *out;       /* (n, out_stride) */
    int out_stride;
} mm_job;

/* ---- the per-op profile (profile.h) ------------------------------------------------------ */

/* thread 0, after the barrier that closes a phase: the time from the last boundary to that
 * barrier's release is kind's. Off, this is the one check a phase costs. */
static void mark(ei_engine *e, int ith, int kind, int64_t flops, int64_t bytes) {
    if (e->prof.on && ith == 0) ei_profile_mark(&e->prof, kind, ei_pool_released_ns(e->pool), 1, flops, bytes);
}

/* the caller, between the pool's tasks: the time until now is kind's */
static void mark_caller(ei_engine *e, int kind, int64_t calls) {
    if (e->prof.on) ei_profile_mark(&e->prof, kind, ei_clock_ns(), calls, 0, 0);
}

/* thread 0, after the barrier that closes a group's products: the time since the last
 * boundary, split between the products by the threads' time in each (the last one takes the
 * rounding, so that the parts still add up) */
static void mark_products(ei_engine *e, const mm_job *jobs, int n_jobs, int n) {
    ei_profile *p = &e->prof;
    const int64_t now = ei_pool_released_ns(e->pool), wall = now - p->last;
    int64_t spent[EI_PROF_MAX_JOBS] = {0}, total = 0, given = 0;
    for (int t = 0; t < p->n_threads; t++)
        for (int j = 0; j < n_jobs; j++) {
            spent[j] += p->job_ns[(size_t)t * EI_PROF_STRIDE + j];
            p->job_ns[(size_t)t * EI_PROF_STRIDE + j] = 0;
        }
    for (int j = 0; j < n_jobs; j++) total += spent[j];
    for (int j = 0; j < n_jobs; j++) {
        const ei_tensor *w = jobs[j].w;
        const int64_t ns = j == n_jobs - 1 ? wall - given
                           : total > 0    ? (int64_t)((double)wall * (double)spent[j] / (double)total)
                                          : wall / n_jobs;
        given += ns;
        ei_profile_add(p, EI_PROF_matmul, w->type, w->ne1, w->ne0, 1, ns, 2 * w->ne0 * w->ne1 * n,
                       w->ne1 * (int64_t)ei_row_size(w->type, w->ne0));
    }
    p->last = now;
}

/* the pending copies of a group of products, made by every thread together */
static void pack_pending(ei_engine *e, const mm_job *jobs, int n_jobs, int ith, int nth) {
    int pending = 0;
    for (int j = 0; j < n_jobs; j++) pending |= jobs[j].w->layout == EI_LAYOUT_PENDING;
    if (!pending) return;
    int64_t bytes = 0; /* of the weights copied */
    for (int j = 0; j < n_jobs; j++) {
        const ei_tensor *w = jobs[j].w;
        if (w->layout != EI_LAYOUT_PENDING) continue;
        ei_repack_share(&e->repack, w, ith, nth);
        bytes += w->ne1 * (int64_t)ei_row_size(w->type, w->ne0);
    }
    ei_pool_barrier(e->pool); /* every share written, every thread past its layout reads */
    if (ith == 0)
        for (int j = 0; j < n_jobs; j++)
            if (jobs[j].w->layout == EI_LAYOUT_PENDING) ei_repack_finish(&e->repack, jobs[j].w);
    ei_pool_barrier(e->pool);
    mark(e, ith, EI_PROF_repack, 0, bytes);
}

/* rows [r0, r1) of job j's product for every token */
static void matmul_rows(const ei_engine *e, const mm_job *job, int r0, int r1, int n) {
    const ei_tensor *w = job->w;
    const int cols = (int)w->ne0, pt = ei_partner_type(w->type);
    const size_t wrow = ei_row_size(w->type, cols), arow = e->act_row[pt];
    const ei_vec_dot_fn dot = e->k->vec_dot[w->type];
    const ei_gemm_fn gemm = e->k->gemm[w->type];
    const ei_gemm_x16_fn gemm_x16 = w->layout == EI_LAYOUT_X16 ? e->k->gemm_x16[w->type] : NULL;
    const ei_gemm_x16_span_fn span = gemm_x16 ? e->k->gemm_x16_span[w->type] : NULL;
    const size_t group = gemm_x16 ? ei_x16_size(w->type, cols) : 0; /* bytes of EI_X16 packed rows */
    float *out = job->out;
    const size_t os = (size_t)job->out_stride;
    const int tile = gemm_x16 && e->k->x16_tile ? e->k->x16_tile : EI_TILE; /* tokens at a time */
    for (int t0 = 0; t0 < n; t0 += tile) {
        const int nc = n - t0 < tile ? n - t0 : tile;
        const uint8_t *act = e->act[pt] + (size_t)t0 * arow;
        if (gemm_x16) { /* whole groups: packed tensors have a multiple of EI_X16 rows */
            const uint8_t *x = (const uint8_t *)w->data + (size_t)(r0 / EI_X16) * group;
            if (span) span(cols, (r1 - r0) / EI_X16, nc, out + (size_t)t0 * os + r0, os, x, act, arow);
            else
                for (int r = r0; r < r1; r += EI_X16)
                    gemm_x16(cols, nc, out + (size_t)t0 * os + r, os, x + (size_t)(r - r0) / EI_X16 * group, act, arow);
            continue;
        }
        for (int r = r0; r < r1; r += EI_TILE) {
            const int nr = r1 - r < EI_TILE ? r1 - r : EI_TILE;
            const uint8_t *wr = (const uint8_t *)w->data + (size_t)r * wrow;
            float *s = out + (size_t)t0 * os + r;
            if (gemm) {
                gemm(cols, nr, nc, s, os, wr, wrow, act, arow);
                continue;
            }
            for (int c = 0; c < nc; c++)
                for (int i = 0; i < nr; i++) dot(cols, &s[c * os + i], wr + i * wrow, act + c * arow);
        }
    }
}

/* out_j[t, r] = dot(row r of w_j, in[t]) for every job j: all jobs read the same input;
 * its activations are quantized once per partner type, then the rows of all jobs are
 * taken by the threads in pieces of whole row blocks (ei_pool_next): 16 blocks of contiguous
 * rows for a step of one token, PROMPT_PIECE row blocks for every token of a step of more (a
 * prompt, whose tiles of tokens meet them all while in L1, or a batch of decoding sequences:
 * Gemma 3's output product with 8 of them, 18.8 -> 13.5 ms on the AVX-512 EPYC, from pieces
 * of 2 blocks, each preparing its activations, to pieces of 16). */
static void matmul_group(ei_engine *e, const mm_job *jobs, int n_jobs, const float *in, int in_stride,
                         int n, int ith, int nth) {
    const int cols = (int)jobs[0].w->ne0;
    pack_pending(e, jobs, n_jobs, ith, nth);
    int done[EI_TYPE_COUNT] = {0}, n_types = 0;
    for (int j = 0; j < n_jobs; j++) {
        const int pt = ei_partner_type(jobs[j].w->type);
        if (done[pt]) continue;
        done[pt] = 1;
        n_types++;
        int a, b;
        split(n, ith, nth, &a, &b);
        for (int t = a; t < b; t++)
            e->k->from_float[pt](in + (size_t)t * in_stride, e->act[pt] + (size_t)t * e->act_row[pt], cols);
    }
    ei_pool_barrier(e->pool);
    mark(e, ith, EI_PROF_act_quant, 0, (int64_t)n * cols * 4 * n_types); /* floats read */

    int piece = n >= 2 ? PROMPT_PIECE : 16; /* row blocks */
    for (int j = 0; j < n_jobs && n >= 2; j++) { /* yet 4 pieces a thread of the smallest job */
        const int most = (int)((jobs[j].w->ne1 + ROW_BLOCK - 1) / ROW_BLOCK) / (4 * nth);
        if (piece > most) piece = most > 1 ? most : 1;
    }
    int pieces[MAX_JOBS], total = 0; /* the pieces of each job, which never span two jobs */
    for (int j = 0; j < n_jobs; j++) {
        const int blocks = (int)((jobs[j].w->ne1 + ROW_BLOCK - 1) / ROW_BLOCK);
        pieces[j] = (blocks + piece - 1) / piece;
        total += pieces[j];
    }
    int64_t *spent = e->prof.on ? e->prof.job_ns + (size_t)ith * EI_PROF_STRIDE : NULL; /* (n_jobs) */
    for (int c; (c = ei_pool_next(e->pool)) < total;) {
        int j = 0;
        while (c >= pieces[j]) c -= pieces[j++];
        const int rows = (int)jobs[j].w->ne1, r0 = c * piece * ROW_BLOCK;
        const int r1 = r0 + piece * ROW_BLOCK < rows ? r0 + piece * ROW_BLOCK : rows;
        const int64_t t0 = spent ? ei_clock_ns() : 0;
        matmul_rows(e, &jobs[j], r0, r1, n);
        if (spent) spent[j] += ei_clock_ns() - t0;
    }
    ei_pool_barrier(e->pool);
    if (spent && ith == 0) mark_products(e, jobs, n_jobs, n);
}

static void add_bias(const ei_tensor *b, float *x, int n) {
    if (!b->data) return;
    const float *v = b->data;
    for (int i = 0; i < n; i++) x[i] += v[i];
}

/* the key (or value) row of position pos of layer il of sequence s */
static uint8_t *k_row(const ei_engine *e, int s, int il, int pos) { return ei_kv_pool_k(e->kv, s, il, pos); }
static uint8_t *v_row(const ei_engine *e, int s, int il, int pos) { return ei_kv_pool_v(e->kv, s, il, pos); }

/* n floats encoded as a cache row of the given type (check_cache made sure it has an encoder) */
static void store_kv(ei_engine *e, int type, void *dst, const float *src, int n) {
    if (type == EI_TYPE_F32) memcpy(dst, src, (size_t)n * 4);
    else e->k->from_float[type](src, dst, n);
}

/* token-wise work after the QKV products: biases, q/k norms, rope, cache writes */
static void qkv_post(ei_engine *e, const step *st, int il, int ith, int nth) {
    const ei_model_desc *m = &e->m;
    const ei_layer_desc *l = &e->layers[il];
    int a, b;
    split(st->n, ith, nth, &a, &b);
    const float *rope = e->rope + (size_t)e->layer_base[il] * e->p.n_batch * m->n_rot;
    for (int i = a; i < b; i++) {
        float *q = e->q + (size_t)i * e->q_dim, *k = e->kk + (size_t)i * e->kv_dim, *v = e->vv + (size_t)i * e->v_dim;
        add_bias(&l->bq, q, e->q_dim);
        add_bias(&l->bk, k, e->kv_dim);
        add_bias(&l->bv, v, e->v_dim);
        const float *cs = rope + (size_t)i * m->n_rot;
        for (int h = 0; h < m->n_head; h++) {
            float *qh = q + (size_t)h * m->head_dim;
            if (l->q_norm.data) e->k->rms_norm(m->head_dim, qh, qh, l->q_norm.data, m->norm_eps);
            e->k->rope(m->n_rot, qh, cs, m->rope_neox);
            if (m->scale_q) e->k->scale(m->head_dim, qh, m->kq_scale);
        }
        for (int h = 0; h < m->n_head_kv; h++) {
            float *kh = k + (size_t)h * m->head_dim;
            if (l->k_norm.data) e->k->rms_norm(m->head_dim, kh, kh, l->k_norm.data, m->norm_eps);
            e->k->rope(m->n_rot, kh, cs, m->rope_neox);
        }
        if (e->hadamard_k) e->k->hadamard(k, e->kv_dim, e->hadamard_k);
        if (e->hadamard_v) e->k->hadamard(v, e->v_dim, e->hadamard_v);
        const int cl = e->kivi ? e->m.n_layer + il : il; /* KIVI: every row enters the residual */
        store_kv(e, e->kivi ? EI_TYPE_F16 : e->p.kv_type_k, k_row(e, st->seq[i], cl, st->pos[i]), k, e->kv_dim);
        store_kv(e, e->kivi ? EI_TYPE_F16 : e->p.kv_type_v, v_row(e, st->seq[i], cl, st->pos[i]), v, e->v_dim);
    }
    ei_pool_barrier(e->pool);
}

/* ---- KIVI (edgeinfer.h: EI_KV_KIVI) ------------------------------------------------------ */

/* the positions below which a query at pos reads quantized groups */
static int kivi_quantized_below(const ei_engine *e, int pos) {
    const int n = pos + 1 - e->p.kivi_residual;
    return n > 0 ? n / e->p.kivi_group * e->p.kivi_group : 0;
}

/* whether any query reads layer il quantized: not a window no longer than the residual */
static int kivi_layer_quantized(const ei_engine *e, int il) {
    const int w = e->layers[il].window;
    return !w || w > e->p.kivi_residual;
}

/* KV head h of the group at position p0 of layer il of s quantized from G f16 rows of keys
 * and of values (that head's, k_row_bytes and v_row_bytes apart) */
static void kivi_quantize_head(ei_engine *e, int s, int il, int p0, int h, const uint8_t *keys,
                               const uint8_t *values) {
    const int G = e->p.kivi_group;
    e->k->kivi_quantize_k(e->p.kv_type_k, G, e->m.head_dim, (const ei_f16 *)keys, e->k_row_bytes,
                          k_row(e, s, il, p0) + (size_t)h * e->kivi_k_block);
    for (int t = 0; t < G; t++)
        e->k->kivi_quantize_v(e->p.kv_type_v, G, e->m.head_dim_v, (const ei_f16 *)(values + (size_t)t * e->v_row_bytes),
                              v_row(e, s, il, p0 + t) + (size_t)h * e->kivi_v_row);
}

/* the step's groups of layer il quantized from their f16 residual rows (a group's rows lie in
 * one block, consecutive); one unit per (job, head) */
static void kivi_quantize(ei_engine *e, int il, int ith, int nth) {
    const int G = e->p.kivi_group, L = e->m.n_layer, nh = e->m.n_head_kv;
    int a, b;
    split(kivi_layer_quantized(e, il) ? e->n_kivi_jobs * nh : 0, ith, nth, &a, &b);
    for (int w = a; w < b; w++) {
        const int s = e->kivi_jobs[2 * (w / nh)], p0 = e->kivi_jobs[2 * (w / nh) + 1] * G, h = w % nh;
        kivi_quantize_head(e, s, il, p0, h, k_row(e, s, L + il, p0) + (size_t)h * e->k_head_bytes,
                           v_row(e, s, L + il, p0) + (size_t)h * e->v_head_bytes);
    }
    ei_pool_barrier(e->pool);
}

/* the first position the query of token i sees in layer il (its window's start) */
static int window_start(const ei_engine *e, const step *st, int il, int i) {
    const int window = e->layers[il].window, pos = st->pos[i];
    return window && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

/* the quantized groups the query of token i reads for KV head g, then its f16 residual rows */
static int kivi_query_runs(const ei_engine *e, const step *st, int il, int i, int g, ei_attn_run *runs,
                           ei_attn_params *ap) {
    const int pos = st->pos[i], s = st->seq[i], t0 = window_start(e, st, il, i);
    const int below = kivi_quantized_below(e, pos), split_at = below > t0 ? below : t0;
    if (e->scores) ap->track = e->scores + (size_t)s * e->p.n_ctx + t0;
    ap->n_kivi_runs = ei_kv_pool_runs(e->kv, s, il, t0, split_at, (size_t)g * e->kivi_k_block,
                                      (size_t)g * e->kivi_v_row, runs);
    return ap->n_kivi_runs + ei_kv_pool_runs(e->kv, s, e->m.n_layer + il, split_at, pos + 1,
                                             (size_t)g * e->k_head_bytes, (size_t)g * e->v_head_bytes,
                                             runs + ap->n_kivi_runs);
}

/* a step's attention units: (token, KV head, part of the KV head's query heads), in the fewest
 * parts that give every thread a unit; the heads of one unit read each cache row once */
typedef struct { int n, parts, per; } head_units;

static head_units split_heads(const ei_engine *e, const step *st, int nth) {
    int parts = 1;
    while (parts < e->group && (int64_t)st->n * e->m.n_head_kv * parts < nth) parts++;
    const int per = (e->group + parts - 1) / parts;
    parts = (e->group + per - 1) / per; /* no empty part */
    return (head_units){st->n * e->m.n_head_kv * parts, parts, per};
}

/* unit w: token i, KV head g, its query heads [h0, h0 + nq) within the group */
static void unit_heads(const ei_engine *e, head_units u, int w, int *i, int *g, int *h0, int *nq) {
    *i = w / (e->m.n_head_kv * u.parts);
    *g = w / u.parts % e->m.n_head_kv;
    *h0 = w % u.parts * u.per;
    *nq = e->group - *h0 < u.per ? e->group - *h0 : u.per;
}

static void kivi_attention(ei_engine *e, const step *st, int il, ei_attn_params *ap, double *scratch, int ith,
                           int nth) {
    const ei_model_desc *m = &e->m;
    const int group = m->n_head / m->n_head_kv;
    ap->kivi_bits_k = e->p.kv_type_k;
    ap->kivi_bits_v = e->p.kv_type_v;
    ap->kivi_group = e->p.kivi_group;
    ap->kivi_v_row_bytes = e->kivi_v_row * (size_t)m->n_head_kv;
    ap->k_type = ap->v_type = EI_TYPE_F16;
    const head_units u = split_heads(e, st, nth);
    (void)ith; (void)nth;
    for (int w; (w = ei_pool_next(e->pool)) < u.n;) {
        int i, g, h0, nq;
        unit_heads(e, u, w, &i, &g, &h0, &nq);
        ap->n_runs = kivi_query_runs(e, st, il, i, g, (ei_attn_run *)ap->runs, ap);
        const int h = g * group + h0;
        ei_kivi_attn_group(ap, nq, e->q + (size_t)i * e->q_dim + (size_t)h * m->head_dim, (size_t)m->head_dim,
                           e->att + (size_t)i * e->att_dim + (size_t)h * m->head_dim_v, (size_t)m->head_dim_v, scratch);
    }
    ei_pool_barrier(e->pool);
}

/* the step's KIVI work, planned before it runs: a token at a position of a quantized group
 * makes that group stale; each sequence then quantizes the groups its last query reads so
 * that are not yet. The residual must still hold their rows (a rewind deeper than the slack
 * is refused, as for a sliding window). */
static ei_status kivi_plan(ei_engine *e, const step *st) {
    const int G = e->p.kivi_group, L = e->m.n_layer;
    const int n_seq = e->p.n_seq_max;
    int32_t *done = e->kivi_done + n_seq, *ends = e->kivi_done + 2 * n_seq; /* the plan's */
    for (int s = 0; s < n_seq; s++) done[s] = e->kivi_done[s], ends[s] = -1;
    for (int i = 0; i < st->n; i++) {
        const int s = st->seq[i];
        if (st->pos[i] / G < done[s]) done[s] = st->pos[i] / G;
        if (st->pos[i] + 1 > ends[s]) ends[s] = st->pos[i] + 1;
    }
    int n_jobs = 0;
    for (int s = 0; s < n_seq; s++) {
        if (ends[s] < 0) continue;
        const int upto = kivi_quantized_below(e, ends[s] - 1) / G;
        if (upto > done[s] && done[s] * G < ei_kv_pool_oldest(e->kv, s, L))
            return ei_fail(EI_ERR_INVALID, "sequence %d needs the f16 rows of position %d to quantize them, which its "
                           "KIVI residual no longer holds (it rewound too far)", s, done[s] * G);
        for (int g = done[s]; g < upto; g++) {
            for (int il = 0; il < L; il++) {
                const ei_status w = ei_kv_pool_write_layer(e->kv, s, il, g * G, (g + 1) * G);
                if (w != EI_OK) return w;
            }
            e->kivi_jobs[2 * n_jobs] = s;
            e->kivi_jobs[2 * n_jobs++ + 1] = g;
        }
        if (upto > done[s]) done[s] = upto;
    }
    for (int s = 0; s < n_seq; s++) e->kivi_done[s] = done[s];
    e->n_kivi_jobs = n_jobs;
    return EI_OK;
}

/* the runs of cache rows the query of token i sees for KV head g, one per block of its window
 * (split where the keys' shift changes, key_shifts.h); with track_attention, ap->track goes to
 * the scores of the first of them. pool_runs: the thread's room for the pool's runs. */
static int range_runs(const ei_engine *e, int s, int il, int t0, int t1, int g, ei_attn_run *runs,
                      ei_attn_params *ap, ei_attn_run *pool_runs) {
    if (e->scores) ap->track = e->scores + (size_t)s * e->p.n_ctx + t0;
    const size_t k_off = (size_t)g * e->k_head_bytes, v_off = (size_t)g * e->v_head_bytes;
    if (!e->ks.shift || !e->ks.any[s]) return ei_kv_pool_runs(e->kv, s, il, t0, t1, k_off, v_off, runs);
    const int n = ei_kv_pool_runs(e->kv, s, il, t0, t1, k_off, v_off, pool_runs);
    return ei_key_shifts_split(&e->ks, s, e->layer_base[il], t0, pool_runs, n, e->k_row_bytes, e->v_row_bytes, runs);
}

static int query_runs(const ei_engine *e, const step *st, int il, int i, int g, ei_attn_run *runs,
                      ei_attn_params *ap, ei_attn_run *pool_runs) {
    return range_runs(e, st->seq[i], il, window_start(e, st, il, i), st->pos[i] + 1, g, runs, ap, pool_runs);
}

/* unit w of a prompt's attention blocks: block w / n_head_kv, KV head w % n_head_kv, every
 * query head of the group for each token of the block, against each cache tile once */
static void attention_block_unit(ei_engine *e, const step *st, int il, int w, ei_attn_params *ap, ei_attn_run *runs,
                                 ei_attn_run *pool_runs, ei_attn_run *room, double *scratch) {
    const ei_model_desc *m = &e->m;
    const int b = w / m->n_head_kv, g = w % m->n_head_kv;
    const int i0 = e->blocks[b], i1 = e->blocks[b + 1];
    const int t0 = window_start(e, st, il, i0);
    ap->n_runs = range_runs(e, st->seq[i0], il, t0, st->pos[i1 - 1] + 1, g, runs, ap, pool_runs);
    const float *q[EI_ATTN_BLOCK_QUERIES];
    float *out[EI_ATTN_BLOCK_QUERIES];
    int32_t first[EI_ATTN_BLOCK_QUERIES], end[EI_ATTN_BLOCK_QUERIES];
    int nq = 0;
    for (int i = i0; i < i1; i++)
        for (int h = g * e->group; h < (g + 1) * e->group; h++, nq++) {
            q[nq] = e->q + (size_t)i * e->q_dim + (size_t)h * m->head_dim;
            out[nq] = e->att + (size_t)i * e->att_dim + (size_t)h * m->head_dim_v;
            first[nq] = window_start(e, st, il, i) - t0;
            end[nq] = st->pos[i] + 1 - t0;
        }
    e->k->attn_block(ap, nq, q, first, end, out, room, scratch);
    if (e->hadamard_v)
        for (int j = 0; j < nq; j++) e->k->hadamard(out[j], m->head_dim_v, e->hadamard_v);
}

static void attention(ei_engine *e, const step *st, int il, int ith, int nth) {
    const ei_model_desc *m = &e->m;
    const int group = m->n_head / m->n_head_kv;
    double *scratch = e->scratch + (size_t)ith * e->scratch_doubles;
    ei_attn_run *runs = e->runs + (size_t)ith * e->max_runs;
    ei_attn_run *pool_runs = e->pool_runs ? e->pool_runs + (size_t)ith * e->max_pool_runs : NULL;
    ei_attn_params ap = {0};
    ap.head_dim = m->head_dim;
    ap.head_dim_v = m->head_dim_v;
    ap.runs = runs;
    ap.k_type = e->p.kv_type_k;
    ap.v_type = e->p.kv_type_v;
    ap.k_row_bytes = e->k_row_bytes;
    ap.v_row_bytes = e->v_row_bytes;
    ap.scale = m->scale_q ? 1.0f : m->kq_scale;
    ap.kt = e->k;
    ap.n_rot = m->n_rot;
    ap.rope_neox = m->rope_neox;
    ap.hadamard_k = e->hadamard_k;
    if (e->kivi) {
        kivi_attention(e, st, il, &ap, scratch, ith, nth);
        return;
    }
    if (e->n_blocks) {
        ei_attn_run *room = e->room + (size_t)ith * e->max_runs;
        for (int w; (w = ei_pool_next(e->pool)) < e->n_blocks * m->n_head_kv;)
            attention_block_unit(e, st, il, w, &ap, runs, pool_runs, room, scratch);
        ei_pool_barrier(e->pool);
        return;
    }
    if (e->k->attn_group && group > 1) {
        const head_units u = split_heads(e, st, nth);
        for (int w; (w = ei_pool_next(e->pool)) < u.n;) {
            int i, g, h0, nq;
            unit_heads(e, u, w, &i, &g, &h0, &nq);
            ap.n_runs = query_runs(e, st, il, i, g, runs, &ap, pool_runs);
            const int h = g * group + h0;
            const float *q = e->q + (size_t)i * e->q_dim + (size_t)h * m->head_dim;
            float *out = e->att + (size_t)i * e->att_dim + (size_t)h * m->head_dim_v;
            if (nq > 1) e->k->attn_group(&ap, nq, q, (size_t)m->head_dim, out, (size_t)m->head_dim_v, scratch);
            else e->k->attn(&ap, q, out, scratch);
            if (e->hadamard_v) e->k->hadamard(out, nq * m->head_dim_v, e->hadamard_v);
        }
        ei_pool_barrier(e->pool);
        return;
    }
    for (int w; (w = ei_pool_next(e->pool)) < st->n * m->n_head;) {
        const int i = w / m->n_head, h = w % m->n_head;
        ap.n_runs = query_runs(e, st, il, i, h / group, runs, &ap, pool_runs);
        float *out = e->att + (size_t)i * e->att_dim + (size_t)h * m->head_dim_v;
        e->k->attn(&ap, e->q + (size_t)i * e->q_dim + (size_t)h * m->head_dim, out, scratch);
        if (e->hadamard_v) e->k->hadamard(out, m->head_dim_v, e->hadamard_v); /* rotated back */
    }
    ei_pool_barrier(e->pool);
}

static void norm_rows(ei_engine *e, float *dst, int dst_stride, const float *src, int src_stride,
                      const ei_tensor *w, int n, int ith, int nth) {
    int a, b;
    split(n, ith, nth, &a, &b);
    for (int i = a; i < b; i++)
        e->k->rms_norm(e->m.n_embd, dst + (size_t)i * dst_stride, src + (size_t)i * src_stride, w->data, e->m.norm_eps);
}

/* the (cos, sin) pairs of rope base bi at position pos (negative: a rotation backwards) */
static void rope_row(const ei_engine *e, int bi, int pos, float *cs) {
    const int half = e->m.n_rot / 2;
    /* powf(base, -2/n_rot), correctly rounded (the numpy engine computes the same) */
    const float theta_scale = (float)pow((double)e->bases[bi], (double)(-2.0f / (float)e->m.n_rot));
    float theta = (float)pos; /* GGML's float recurrence: p, p*s, (p*s)*s, ... */
    for (int j = 0; j < half; j++) {
        float th = theta;
        if (e->freq_factors) th = th / e->freq_factors[j];
        th = e->scales[bi] * th;
        cs[2 * j] = (float)cos((double)th);
        cs[2 * j + 1] = (float)sin((double)th);
        theta *= theta_scale;
    }
}

/* rope_row for key_shifts.c's tables */
static void shift_rotation(const void *e, int base, int pos, float *cs) { rope_row(e, base, pos, cs); }

static void rope_tables(ei_engine *e, const step *st, int ith, int nth) {
    int a, b;
    split(st->n * e->n_bases, ith, nth, &a, &b);
    for (int w = a; w < b; w++) {
        const int bi = w / st->n, i = w % st->n;
        rope_row(e, bi, st->pos[i], e->rope + ((size_t)bi * e->p.n_batch + i) * e->m.n_rot);
    }
}

/* the last layer needs only the tokens whose logits are wanted once attention (which reads
 * every token's keys and values) is done: move their rows to the front */
static int keep_output_rows(ei_engine *e, step *st, int ith) {
    if (ith == 0) {
        for (int j = 0; j < st->n_out; j++) { /* out_rows ascend, so no row is overwritten early */
            const int i = st->out_rows[j];
            memmove(e->att + (size_t)j * e->att_dim, e->att + (size_t)i * e->att_dim, (size_t)e->att_dim * 4);
            memmove(e->x + (size_t)j * e->m.n_embd, e->x + (size_t)i * e->m.n_embd, (size_t)e->m.n_embd * 4);
        }
    }
    ei_pool_barrier(e->pool);
    return st->n_out;
}

/* thread 0, after attention's barrier: its flops (a query head's dot with each key it sees,
 * and the weighted sum of their values) and the cache rows its queries read */
static void mark_attention(ei_engine *e, const step *st, int il) {
    const ei_model_desc *m = &e->m;
    int64_t keys = 0;
    for (int i = 0; i < st->n; i++) keys += st->pos[i] + 1 - window_start(e, st, il, i);
    const int64_t flops = keys * m->n_head * 2 * (int64_t)(m->head_dim + m->head_dim_v);
    const int64_t bytes = e->kivi ? 0 : keys * (int64_t)(e->k_row_bytes + e->v_row_bytes);
    ei_profile_mark(&e->prof, EI_PROF_attention, ei_pool_released_ns(e->pool), 1, flops, bytes);
}

/* the embeddings of the step's tokens into the residual stream, and the rope tables */
static void embed(ei_engine *e, const step *st, int ith, int nth) {
    const ei_model_desc *m = &e->m;
    const int E = m->n_embd;
    int a, b;
    split(st->n, ith, nth, &a, &b);
    const size_t erow = ei_row_size(m->tok_embd.type, E);
    const int from_copy = e->embd_from_copy && m->output.layout == EI_LAYOUT_X16;
    uint8_t *unpacked = e->embd_rows + (size_t)ith * erow; /* (erow) */
    const size_t group = from_copy ? ei_x16_size(m->output.type, E) : 0; /* bytes of EI_X16 rows */
    for (int i = a; i < b; i++) {
        float *x = e->x + (size_t)i * E;
        const int tok = st->tok[i];
        const uint8_t *row = (const uint8_t *)m->tok_embd.data + (size_t)tok * erow;
        if (from_copy) { /* row tok % EI_X16 of interleaved group tok / EI_X16 */
            ei_unpack_x16_row(m->output.type, (const uint8_t *)m->output.data + (size_t)(tok / EI_X16) * group,
                              tok % EI_X16, E, unpacked);
            row = unpacked;
        }
        e->k->to_float[m->tok_embd.type](row, x, E);
        if (m->embed_scale != 1.0f) e->k->scale(E, x, m->embed_scale);
    }
    if (e->prof.on) { /* profiled, the embeddings are a phase of their own */
        ei_pool_barrier(e->pool);
        mark(e, ith, EI_PROF_embed, 0, (int64_t)st->n * (int64_t)erow);
    }
    rope_tables(e, st, ith, nth);
    ei_pool_barrier(e->pool);
    mark(e, ith, EI_PROF_rope_tables, 0, 0);
}

/* layer il's attention block, the residual added and the FFN's input normalised; returns the
 * tokens carried on (the last layer keeps those whose logits are wanted) */
static int attention_block(ei_engine *e, step *st, int il, int n, int ith, int nth) {
    const ei_model_desc *m = &e->m;
    const ei_layer_desc *l = &e->layers[il];
    const int E = m->n_embd;
    norm_rows(e, e->h, E, e->x, E, &l->attn_norm, n, ith, nth);
    ei_pool_barrier(e->pool);
    mark(e, ith, EI_PROF_norm, 0, 0);
    const mm_job qkv[3] = {{&l->wq, e->q, e->q_dim}, {&l->wk, e->kk, e->kv_dim}, {&l->wv, e->vv, e->v_dim}};
    matmul_group(e, qkv, 3, e->h, E, n, ith, nth);
    qkv_post(e, st, il, ith, nth);
    mark(e, ith, EI_PROF_qkv_post, 0, 0);
    if (e->kivi) {
        kivi_quantize(e, il, ith, nth);
        mark(e, ith, EI_PROF_kivi_quant, 0, 0);
    }
    attention(e, st, il, ith, nth);
    if (e->prof.on && ith == 0) mark_attention(e, st, il);
    if (il == m->n_layer - 1 && st->n_out < n) {
        n = keep_output_rows(e, st, ith);
        mark(e, ith, EI_PROF_output_rows, 0, 0);
    }
    const mm_job wo = {&l->wo, e->t, E};
    matmul_group(e, &wo, 1, e->att, e->att_dim, n, ith, nth);

    int a, b;
    split(n, ith, nth, &a, &b);
    for (int i = a; i < b; i++) {
        float *t = e->t + (size_t)i * E, *x = e->x + (size_t)i * E;
        if (l->attn_post_norm.data) e->k->rms_norm(E, t, t, l->attn_post_norm.data, m->norm_eps);
        e->k->add(E, x, t);
        e->k->rms_norm(E, e->h + (size_t)i * E, x, l->ffn_norm.data, m->norm_eps);
    }
    ei_pool_barrier(e->pool);
    mark(e, ith, EI_PROF_norm, 0, 0);
    return n;
}

/* gate = act(gate) * up, element by element: the (n, n_ff) values are split between the threads
 * as one range (a decoding step's single row too), in whole cache lines */
static void glu(ei_engine *e, int n, int ith, int nth) {
    const int64_t total = (int64_t)n * e->m.n_ff;
    const int64_t a = total * ith / nth / 16 * 16, b = ith == nth - 1 ? total : total * (ith + 1) / nth / 16 * 16;
    if (b <= a) return;
    float *g = e->gate + a;
    const float *u = e->up + a;
    if (e->m.act_gelu) e->k->geglu((int)(b - a), g, g, u, e->gelu);
    else e->k->swiglu((int)(b - a), g, g, u);
}

/* layer il's FFN on the normalised rows in h, its output added to the residual stream */
static void ffn_block(ei_engine *e, int il, int n, int ith, int nth) {
    const ei_model_desc *m = &e->m;
    const ei_layer_desc *l = &e->layers[il];
    const int E = m->n_embd;
    int a, b;
    split(n, ith, nth, &a, &b);
    const mm_job gu[2] = {{&l->ffn_gate, e->gate, m->n_ff}, {&l->ffn_up, e->up, m->n_ff}};
    matmul_group(e, gu, 2, e->h, E, n, ith, nth);
    glu(e, n, ith, nth);
    ei_pool_barrier(e->pool);
    mark(e, ith, EI_PROF_glu, 0, 0);
    const mm_job down = {&l->ffn_down, e->t, E};
    matmul_group(e, &down, 1, e->gate, m->n_ff, n, ith, nth);
    for (int i = a; i < b; i++) {
        float *t = e->t + (size_t)i * E;
        if (l->ffn_post_norm.data) e->k->rms_norm(E, t, t, l->ffn_post_norm.data, m->norm_eps);
        e->k->add(E, e->x + (size_t)i * E, t);
    }
    ei_pool_barrier(e->pool);
    mark(e, ith, EI_PROF_norm, 0, 0);
}

static void forward_task(void *raw, int ith, int nth) {
    step *st = raw;
    ei_engine *e = st->e;
    const ei_model_desc *m = &e->m;
    const int E = m->n_embd;
    int n = st->n, a, b;

    if (e->prof.on) { /* profiled, the threads' start is a phase of its own */
        ei_pool_barrier(e->pool);
        mark(e, ith, EI_PROF_threads, 0, 0);
    }
    embed(e, st, ith, nth);
    for (int il = 0; il < e->first_gpu; il++) {
        n = attention_block(e, st, il, n, ith, nth);
        ffn_block(e, il, n, ith, nth);
    }

    if (st->n_out == 0 || e->gpu) return; /* offloaded: the device takes the output */
    const int compacted = n == st->n_out; /* output rows are at the front (or every row is one) */
    split(st->n_out, ith, nth, &a, &b);
    for (int j = a; j < b; j++) {
        const float *x = e->x + (size_t)(compacted ? j : st->out_rows[j]) * E;
        e->k->rms_norm(E, e->h + (size_t)j * E, x, m->output_norm.data, m->norm_eps);
    }
    ei_pool_barrier(e->pool);
    mark(e, ith, EI_PROF_norm, 0, 0);
    const mm_job out = {&m->output, st->logits, m->n_vocab};
    matmul_group(e, &out, 1, e->h, E, st->n_out, ith, nth);
    if (m->final_softcap != 0.0f) {
        const float cap = m->final_softcap;
        split(st->n_out, ith, nth, &a, &b);
        for (int j = a; j < b; j++) {
            float *row = st->logits + (size_t)j * m->n_vocab;
            for (int v = 0; v < m->n_vocab; v++) row[v] = (float)tanh((double)(row[v] / cap)) * cap;
        }
        if (e->prof.on) { /* profiled, a barrier ends it, so that the threads' join is apart */
            ei_pool_barrier(e->pool);
            mark(e, ith, EI_PROF_softcap, 0, 0);
        }
    }
}

/* the blocks a step writes, taken or copied; refuses a token whose window the pool no longer
 * holds (a sequence rewound past what its sliding-window layers keep) */
/* a prompt step's attention blocks (e->blocks): runs of tokens of one sequence at consecutive
 * positions, block_tokens at most (one, for a group of 8 heads, still reads each key once for
 * all 8); none (n_blocks 0: query by query) for a single token, a KIVI cache, a group of more
 * heads than EI_ATTN_BLOCK_QUERIES, or a table without attn_block */
static void plan_blocks(ei_engine *e, const step *st) {
    e->n_blocks = 0;
    if (st->n < 2 || e->kivi || !e->k->attn_block || e->block_tokens < 1) return;
    e->blocks[0] = 0;
    for (int i = 1; i <= st->n; i++) {
        const int start = e->blocks[e->n_blocks];
        if (i == st->n || i - start == e->block_tokens || st->seq[i] != st->seq[i - 1] || st->pos[i] != st->pos[i - 1] + 1)
            e->blocks[++e->n_blocks] = i;
    }
}

static ei_status prepare_step(ei_engine *e, const step *st) {
    for (int i = 0; i < st->n; i++) /* first, so that no write lands below what is held */
        for (int il = 0; il < e->m.n_layer; il++) {
            const int w = e->layers[il].window, t0 = w && st->pos[i] - w + 1 > 0 ? st->pos[i] - w + 1 : 0;
            const int below = e->kivi ? kivi_quantized_below(e, st->pos[i]) : 0;
            const int f16_from = below > t0 ? below : t0, cl = e->m.n_layer + il;
            if (t0 < ei_kv_pool_oldest(e->kv, st->seq[i], il) ||
                (e->kivi && f16_from < ei_kv_pool_oldest(e->kv, st->seq[i], cl)))
                return ei_fail(EI_ERR_INVALID, "sequence %d at position %d needs keys of layer %d from position %d, "
                               "which its sliding-window cache no longer holds (it rewound too far)",
                               st->seq[i], st->pos[i], il, t0);
        }
    for (int i = 0; i < st->n; i++) {
        const ei_status s = ei_kv_pool_write(e->kv, st->seq[i], st->pos[i], st->pos[i] + 1);
        if (s != EI_OK) return s;
        if (e->scores) e->scores[(size_t)st->seq[i] * e->p.n_ctx + st->pos[i]] = 0; /* a new row */
        if (e->ks.shift) e->ks.shift[(size_t)st->seq[i] * e->p.n_ctx + st->pos[i]] = 0; /* rotated where it is */
    }
    plan_blocks(e, st);
    return e->kivi ? kivi_plan(e, st) : EI_OK;
}

/* the device's part of a step (n_gpu_layers): each token's cache row and runs in each group of
 * the device layers, the block copies the pool made, then its layers and the output */
static ei_status offload_step(ei_engine *e, const step *st) {
    const int L = e->m.n_layer, R = 1 + 2 * e->max_pool_runs, nb = e->p.n_batch;
    ei_vk_offload_step s = {0};
    s.n = st->n;
    s.x = e->x;
    s.rope = e->rope;
    s.block = ei_kv_pool_block_size(e->kv);
    for (int i = 0; e->ks.shift && i < st->n; i++) s.shifted |= e->ks.any[st->seq[i]];
    int rows_done[4] = {0, 0, 0, 0}, runs_done[4] = {0, 0, 0, 0};
    for (int il = e->first_gpu; il < L; il++) {
        const int g = ei_kv_pool_layer_group(e->kv, il), rs = e->gpu_run_set[il];
        if (!rows_done[g]++) { /* the row each token writes: the group's */
            uint32_t *rows = e->gpu_rows + (size_t)g * nb;
            for (int i = 0; i < st->n; i++) rows[i] = (uint32_t)ei_kv_pool_row_index(e->kv, st->seq[i], il, st->pos[i]);
            s.rows[g] = rows;
        }
        if (!runs_done[rs]++) { /* the rows it reads: its window's in the group */
            uint32_t *runs = e->gpu_runs + (size_t)rs * nb * R;
            uint32_t *track = e->gpu_track ? e->gpu_track + (size_t)rs * nb * 2 : NULL;
            for (int i = 0; i < st->n; i++) {
                uint32_t *r = runs + (size_t)i * R;
                const int t0 = window_start(e, st, il, i);
                r[0] = (uint32_t)ei_kv_pool_row_runs(e->kv, st->seq[i], il, t0, st->pos[i] + 1, r + 1);
                if (track) {
                    track[2 * i] = (uint32_t)((int64_t)st->seq[i] * e->p.n_ctx + t0);
                    track[2 * i + 1] = (uint32_t)(st->pos[i] + 1 - t0);
                }
            }
            s.runs[rs] = runs;
            s.track[rs] = track;
        }
    }
    s.n_copies = ei_kv_pool_device_copies(e->kv, &s.copies);
    s.n_out = st->n_out;
    /* the last layer on the CPU moved the output rows to the front */
    for (int j = 0; j < st->n_out; j++) e->gpu_out[j] = e->first_gpu == L ? j : st->out_rows[j];
    s.out_rows = e->gpu_out;
    s.logits = st->logits;
    const int64_t t0 = e->prof.on ? ei_clock_ns() : 0;
    ei_status status = ei_vk_offload_run(e->gpu, &s);
    if (e->prof.on) ei_profile_add(&e->prof, EI_PROF_gpu, -1, 0, 0, 1, ei_clock_ns() - t0, 0, 0);
    if (status == EI_OK && e->scores) status = ei_vk_offload_take_track(e->gpu, &s, e->scores); /* the device layers' attention */
    return status;
}

ei_status ei_engine_decode(ei_engine *e, int32_t n, const int32_t *tokens, const int32_t *pos,
                           const int32_t *seq, const int8_t *out_mask, float *logits) {
    if (!e || n < 0 || (n && (!tokens || !pos || !seq))) return ei_fail(EI_ERR_INVALID, "bad arguments");
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= e->m.n_vocab) return ei_fail(EI_ERR_INVALID, "token id %d is out of range", tokens[i]);
        if (seq[i] < 0 || seq[i] >= e->p.n_seq_max) return ei_fail(EI_ERR_INVALID, "sequence %d is out of range", seq[i]);
        if (pos[i] < 0 || pos[i] >= e->p.n_ctx) return ei_fail(EI_ERR_CONTEXT, "position %d is outside the context of %d", pos[i], e->p.n_ctx);
    }
    int32_t rows[MAX_BATCH];
    float *out = logits;
    const int64_t began = e->prof.on ? ei_clock_ns() : 0;
    if (e->prof.on) e->prof.last = began;
    for (int start = 0; start < n; start += e->p.n_batch) {
        const int len = n - start < e->p.n_batch ? n - start : e->p.n_batch;
        step st = {e, len, tokens + start, pos + start, seq + start, 0, rows, out};
        for (int i = 0; i < len; i++)
            if (out_mask && out_mask[start + i]) rows[st.n_out++] = i;
        if (st.n_out > 0 && !logits) return ei_fail(EI_ERR_INVALID, "logits requested without an output buffer");
        const ei_status ready = prepare_step(e, &st);
        if (ready != EI_OK) return ready;
        mark_caller(e, EI_PROF_cache_blocks, 1);
        const int k = ei_step_threads_pick(&e->step_threads, len);
        const int64_t t0 = ei_clock_ns(), w0 = ei_pool_waited_ns();
        ei_pool_run_on(e->pool, forward_task, &st, k);
        ei_step_threads_took(&e->step_threads, len, k, ei_clock_ns() - t0, ei_pool_waited_ns() - w0);
        mark_caller(e, EI_PROF_threads, 0); /* the join ends the phase its start began */
        if (e->gpu) {
            const ei_status done = offload_step(e, &st);
            if (done != EI_OK) return done;
        }
        for (int i = 0; i < len; i++) ei_kv_pool_trim(e->kv, st.seq[i], st.pos[i] + 1);
        out += (size_t)st.n_out * e->m.n_vocab;
    }
    if (e->prof.on) { /* the last trim is the cache's, no phase of its own; then the call's total */
        mark_caller(e, EI_PROF_cache_blocks, 0);
        ei_profile_add(&e->prof, EI_PROF_call, -1, 0, 0, 1, ei_clock_ns() - began, 0, 0);
    }
    return EI_OK;
}

/* ---- the per-op profile's API ----------------------------------------------------------- */

ei_status ei_engine_profile(ei_engine *e, int32_t enable) {
    if (!e) return ei_fail(EI_ERR_INVALID, "no engine");
    if (!enable) {
        e->prof.on = 0;
        ei_pool_time_barriers(e->pool, 0);
        return EI_OK;
    }
    /* a row per matrix (every layer's and the output) at most, and one per other kind */
    const int cap = e->m.n_layer * EI_LAYER_MATRICES + 1 + EI_PROF_KIND_COUNT;
    if (!ei_profile_start(&e->prof, cap, e->p.n_threads))
        return ei_fail(EI_ERR_NOMEM, "out of memory for a profile of %d rows", cap);
    ei_pool_time_barriers(e->pool, 1);
    return EI_OK;
}

ei_status ei_engine_profile_read(const ei_engine *e, ei_profile_entry *out, int32_t cap, int32_t *n) {
    if (!e || !n) return ei_fail(EI_ERR_INVALID, "bad arguments");
    if (!e->prof.entries) return ei_fail(EI_ERR_INVALID, "the engine was never profiled (ei_engine_profile)");
    *n = e->prof.n;
    if (!out) return EI_OK;
    if (cap < e->prof.n)
        return ei_fail(EI_ERR_INVALID, "the profile has %d rows, the buffer room for %d", e->prof.n, cap);
    memcpy(out, e->prof.entries, sizeof(ei_profile_entry) * (size_t)e->prof.n);
    return EI_OK;
}

/* ---- discarding positions (context shift, attention sinks) ----------------------------- */

/* the key row src, of position p, stored at dst as the key of position p + delta: decoded,
 * each head rotated by delta (cs), encoded again; a key kept as first rotated (key_shifts.h)
 * moves as it is, ei_key_shifts_drop recording how far ahead it now is */
static void move_key(ei_engine *e, uint8_t *dst, const uint8_t *src, const float *cs, float *buf) {
    const ei_model_desc *m = &e->m;
    if (e->ks.shift) {
        memcpy(dst, src, e->k_row_bytes);
        return;
    }
    if (e->p.kv_type_k == EI_TYPE_F32) memcpy(buf, src, (size_t)e->kv_dim * 4);
    else e->k->to_float[e->p.kv_type_k](src, buf, e->kv_dim);
    for (int h = 0; h < m->n_head_kv; h++) e->k->rope(m->n_rot, buf + (size_t)h * m->head_dim, cs, m->rope_neox);
    store_kv(e, e->p.kv_type_k, dst, buf, e->kv_dim);
}

/* whether layer il's rows live on the device (n_gpu_layers) */
static int on_gpu(const ei_engine *e, int il) { return e->gpu && il >= e->first_gpu; }

/* move i of an eviction on a device layer: the row of position src to that of position dst */
static void add_move(ei_engine *e, int i, int s, int il, int src, int dst, int angles) {
    int32_t *m = e->gpu_moves + 3 * (size_t)i;
    m[0] = (int32_t)ei_kv_pool_row_index(e->kv, s, il, src);
    m[1] = (int32_t)ei_kv_pool_row_index(e->kv, s, il, dst);
    m[2] = angles;
}

/* cs, the rotation of a shift, as angles entry *n of layer il's moves; when the table is full
 * the *n_moves moves so far run first (in order, as each call completes: the same as moving
 * the rows one by one), and the table starts again */
static ei_status add_angles(ei_engine *e, int il, int *n_moves, int *n, const float *cs) {
    if (*n == EI_VK_MAX_ANGLES) {
        const ei_status st = ei_vk_offload_move_rows(e->gpu, il, *n_moves, e->gpu_moves, *n, e->gpu_angles);
        if (st != EI_OK) return st;
        *n_moves = *n = 0;
    }
    memcpy(e->gpu_angles + (size_t)(*n)++ * e->m.n_rot, cs, sizeof(float) * (size_t)e->m.n_rot);
    return EI_OK;
}

/* keys kept as first rotated (key_shifts.h) on device layers: the rows of positions [0, n)
 * of sequence s, those each group holds, take their shifts (after the shifts changed: a drop,
 * a restored state) */
static ei_status sync_device_shifts(ei_engine *e, int s, int n) {
    if (!e->gpu || !e->ks.shift || e->first_gpu >= e->m.n_layer || n <= 0) return EI_OK;
    int64_t *rows = malloc(sizeof(int64_t) * (size_t)n);
    if (!rows) return ei_fail(EI_ERR_NOMEM, "out of memory for the key shifts of sequence %d", s);
    ei_status st = EI_OK;
    int done[4] = {0, 0, 0, 0}; /* per group: one of its layers names its rows */
    for (int il = e->first_gpu; st == EI_OK && il < e->m.n_layer; il++) {
        const int g = ei_kv_pool_layer_group(e->kv, il), p0 = ei_kv_pool_oldest(e->kv, s, il);
        if (g < 0 || g >= 4 || done[g]++ || p0 >= n) continue;
        for (int p = p0; p < n; p++) rows[p - p0] = ei_kv_pool_row_index(e->kv, s, il, p);
        st = ei_vk_offload_set_shifts(e->gpu, il, n - p0, rows, e->ks.shift + (size_t)s * e->p.n_ctx + p0);
    }
    free(rows);
    return st;
}

/* the blocks the pool copied for device layers, copied there now (before rows move into them) */
static ei_status flush_device_copies(ei_engine *e) {
    if (!e->gpu) return EI_OK;
    const int32_t *copies;
    const int n = ei_kv_pool_device_copies(e->kv, &copies);
    return ei_vk_offload_copy_blocks(e->gpu, n, copies, ei_kv_pool_block_size(e->kv));
}

/* whether layer il keeps only its window's blocks (kv_pool.h): a ring */
static int ring_layer(const ei_engine *e, int il) {
    return ei_kv_pool_layer_rows(e->kv, il) < e->p.n_ctx;
}

/* the positions the runs drop below position p (runs in order, apart) */
static int dropped_below(int n_runs, const int32_t *runs, int p) {
    int d = 0;
    for (int r = 0; r < n_runs && runs[2 * r] < p; r++)
        d += runs[2 * r] + runs[2 * r + 1] <= p ? runs[2 * r + 1] : p - runs[2 * r];
    return d;
}

/* the position that lands at `at` once the runs are dropped */
static int source_of(int n_runs, const int32_t *runs, int at) {
    int p = at;
    for (int r = 0; r < n_runs && runs[2 * r] <= p; r++) p += runs[2 * r + 1];
    return p;
}

/* the first position from p on that the runs keep */
static int first_kept(int n_runs, const int32_t *runs, int p) {
    for (int r = 0; r < n_runs; r++) /* in order, so that a run right after another is passed too */
        if (runs[2 * r] <= p && p < runs[2 * r] + runs[2 * r + 1]) p = runs[2 * r] + runs[2 * r + 1];
    return p;
}

/* layer il of sequence s: the rows of every kept position p >= from (from >= the first run)
 * to p less the positions dropped below it, in order (each lands below the rows still to be
 * read; ei_kv_pool_write made the destinations private), keys rotated back by as much */
static ei_status evict_layer(ei_engine *e, int s, int il, int from, int n_runs, const int32_t *runs, int n_past,
                             float *cs, float *buf) {
    const int dev = on_gpu(e, il);
    int delta = 0, n_moves = 0, n_angles = 0;
    for (int r = 0; r < n_runs; r++) {
        delta += runs[2 * r + 1];
        const int end = r + 1 < n_runs ? runs[2 * r + 2] : n_past;
        int p = runs[2 * r] + runs[2 * r + 1];
        if (p < from) p = from;
        if (p >= end) continue;
        rope_row(e, e->layer_base[il], -delta, cs);
        ei_status st;
        if (dev && !e->ks.shift && (st = add_angles(e, il, &n_moves, &n_angles, cs)) != EI_OK) return st;
        for (; p < end; p++) {
            if (dev) { /* keys kept as first rotated move as they are (no angles) */
                add_move(e, n_moves++, s, il, p, p - delta, e->ks.shift ? -1 : n_angles - 1);
                continue;
            }
            move_key(e, k_row(e, s, il, p - delta), k_row(e, s, il, p), cs, buf);
            memcpy(v_row(e, s, il, p - delta), v_row(e, s, il, p), e->v_row_bytes);
        }
    }
    return dev && n_moves ? ei_vk_offload_move_rows(e->gpu, il, n_moves, e->gpu_moves, n_angles, e->gpu_angles) : EI_OK;
}

/* the sliding-window layers of sequence s with the window of layer `first`, the first of
 * them (they share a group): as evict_layer, but a block of
 * destinations at a time, each source block given back once read, so that moving a window
 * down needs at most two blocks beyond those the sequence holds (the pool is sized for a
 * step, not for a second copy of the window) */
static ei_status evict_window(ei_engine *e, int s, int first, int from, int n_runs, const int32_t *runs,
                              int n_past, float *cs, float *buf) {
    const int kept = n_past - dropped_below(n_runs, runs, n_past), B = ei_engine_block_size();
    const int w = e->layers[first].window, p = first_kept(n_runs, runs, from);
    if (p >= n_past) return EI_OK;
    const int lo = p - dropped_below(n_runs, runs, p); /* where the moved rows land first */
    int next = lo / B + 1; /* the lowest block not yet given back above the destinations */
    for (int b0 = lo / B * B; b0 < kept; b0 += B) {
        const int d0 = lo > b0 ? lo : b0, d1 = kept < b0 + B ? kept : b0 + B;
        ei_status st = ei_kv_pool_write_layer(e->kv, s, first, d0, d1);
        if (st == EI_OK) st = flush_device_copies(e);
        if (st != EI_OK) return st;
        for (int il = first; il < e->m.n_layer; il++) {
            if (e->layers[il].window != w) continue;
            const int dev = on_gpu(e, il);
            int delta = 0, n_moves = 0, n_angles = 0;
            for (int d = d0; d < d1; d++) {
                const int src = source_of(n_runs, runs, d);
                if (src == d) continue;
                if (src - d != delta) { /* the first move too: src > d */
                    rope_row(e, e->layer_base[il], -(delta = src - d), cs);
                    if (dev && !e->ks.shift && (st = add_angles(e, il, &n_moves, &n_angles, cs)) != EI_OK) return st;
                }
                if (dev) {
                    add_move(e, n_moves++, s, il, src, d, e->ks.shift ? -1 : n_angles - 1);
                    continue;
                }
                move_key(e, k_row(e, s, il, d), k_row(e, s, il, src), cs, buf);
                memcpy(v_row(e, s, il, d), v_row(e, s, il, src), e->v_row_bytes);
            }
            if (dev && n_moves && (st = ei_vk_offload_move_rows(e->gpu, il, n_moves, e->gpu_moves, n_angles, e->gpu_angles)) != EI_OK)
                return st;
        }
        const int read = source_of(n_runs, runs, d1 - 1); /* every row up to here was read */
        if (next <= b0 / B) next = b0 / B + 1;
        for (; (next + 1) * B - 1 <= read; next++) ei_kv_pool_release_block(e->kv, s, first, next);
    }
    return EI_OK;
}

/* the first position each layer's rows move from: the first run's start, or the oldest row a
 * sliding-window layer still holds; refuses an eviction after which a window would reach rows
 * that layer no longer holds */
static ei_status evict_sources(const ei_engine *e, int seq, int n_runs, const int32_t *runs, int n_past,
                               int *from) {
    const int kept = n_past - dropped_below(n_runs, runs, n_past);
    for (int il = 0; il < e->m.n_layer; il++) {
        const int w = e->layers[il].window, oldest = ei_kv_pool_oldest(e->kv, seq, il);
        const int need = w && kept - w + 1 > 0 ? kept - w + 1 : 0;
        if (need < kept && source_of(n_runs, runs, need) < oldest)
            return ei_fail(EI_ERR_UNSUPPORTED,
                           "layer %d holds positions from %d only: after dropping %d of %d, its window would "
                           "reach position %d (drop fewer, or keep the whole context)",
                           il, oldest, n_past - kept, n_past, source_of(n_runs, runs, need));
        from[il] = runs[0] > oldest ? runs[0] : oldest;
    }
    return EI_OK;
}

static ei_status check_runs(const ei_engine *e, int32_t seq, int32_t n_runs, const int32_t *runs, int32_t n_past) {
    if (!e || seq < 0 || seq >= e->p.n_seq_max) return ei_fail(EI_ERR_INVALID, "no sequence %d", seq);
    if (n_runs < 0 || (n_runs && !runs) || n_past < 0 || n_past > e->p.n_ctx)
        return ei_fail(EI_ERR_INVALID, "bad arguments");
    for (int r = 0, end = 0; r < n_runs; r++) {
        const int32_t start = runs[2 * r], count = runs[2 * r + 1];
        if (start < end || count <= 0 || count > n_past - start)
            return ei_fail(EI_ERR_INVALID, "cannot drop %d positions from %d of the %d held (after %d)", count,
                           start, n_past, end);
        end = start + count;
    }
    return EI_OK;
}

/* the scores of the kept positions of seq moved as their rows, zero from the new length on */
static void evict_scores(ei_engine *e, int seq, int n_runs, const int32_t *runs, int n_past) {
    int64_t *sc = e->scores + (size_t)seq * e->p.n_ctx;
    int delta = 0; /* the kept positions between run r and the next move down by delta */
    for (int r = 0; r < n_runs; r++) {
        delta += runs[2 * r + 1];
        const int end = r + 1 < n_runs ? runs[2 * r + 2] : n_past;
        for (int p = runs[2 * r] + runs[2 * r + 1]; p < end; p++) sc[p - delta] = sc[p];
    }
    for (int at = n_past - delta; at < n_past; at++) sc[at] = 0;
}

/* ---- discarding positions from a KIVI cache ---------------------------------------------
 * Each kept position's key and value as the cache holds them (decoded from its quantized
 * group where that group is quantized, else its f16 residual row), the key rotated back by
 * the positions dropped below it, rounded to f16: these rows are then what the positions
 * hold, the groups a query at the new length reads quantized quantized again from them and
 * the rest written to the residual. Layer by layer, from the group of the first run on (the
 * numpy engine does the same: edgeinfer/engines/reference.py). */

typedef struct {
    int G, kept, done, done_new, g0; /* groups quantized before and after; the first changed */
    int r_lo; /* the first residual row written: every row still held from the first changed
               * group on, so that no stale row is held after the move */
} kivi_move;

/* the first new position layer il needs: the first changed group's, or its window's */
static int kivi_move_lo(const ei_engine *e, const kivi_move *mv, int il) {
    const int w = e->layers[il].window, lo = mv->g0 * mv->G;
    const int win = w && mv->kept - w > 0 ? (mv->kept - w) / mv->G * mv->G : 0;
    return win > lo ? win : lo;
}

/* whether position p of layer il of s is read from its quantized group */
static int kivi_from_group(const ei_engine *e, const kivi_move *mv, int il, int p) {
    return kivi_layer_quantized(e, il) && p < mv->done * mv->G;
}

/* the first new position whose key and value layer il computes: its own first, or the
 * residual's first written row if lower */
static int kivi_move_start(const ei_engine *e, const kivi_move *mv, int il) {
    const int lo = kivi_move_lo(e, mv, il);
    return mv->r_lo < lo ? mv->r_lo : lo;
}

/* the residual rows rewritten: from the first changed group, or from the first row the
 * residual holds after the move's trim, but at least those a query at the new length reads */
static int kivi_residual_from(const ei_engine *e, int s, const kivi_move *mv) {
    const int L = e->m.n_layer, G = mv->G, rows = ei_kv_pool_layer_rows(e->kv, L);
    int held = ei_kv_pool_oldest(e->kv, s, L);
    const int trimmed = rows < e->p.n_ctx && mv->kept - rows > 0 ? (mv->kept - rows) / G * G : 0;
    if (trimmed > held) held = trimmed;
    const int need = held < mv->done_new * G ? held : mv->done_new * G;
    return need > mv->g0 * G ? need : mv->g0 * G;
}

/* refuses a move whose sources the cache no longer holds, then makes every destination
 * private, before anything changes */
static ei_status kivi_move_prepare(ei_engine *e, int s, const kivi_move *mv, int n_runs, const int32_t *runs) {
    const int L = e->m.n_layer, G = mv->G;
    for (int il = 0; il < L; il++)
        for (int i = kivi_move_start(e, mv, il); i < mv->kept; i++) {
            const int p = source_of(n_runs, runs, i), part = kivi_from_group(e, mv, il, p) ? il : L + il;
            if (!ei_kv_pool_holds(e->kv, s, part, p, p + 1))
                return ei_fail(EI_ERR_UNSUPPORTED, "layer %d no longer holds position %d, which the dropping of "
                               "positions would keep (drop fewer, or keep the whole context)", il, p);
        }
    ei_status st = ei_kv_pool_write_layer(e->kv, s, L, mv->r_lo, mv->kept);
    for (int il = 0; st == EI_OK && il < L; il++)
        if (kivi_layer_quantized(e, il) && kivi_move_lo(e, mv, il) < mv->done_new * G)
            st = ei_kv_pool_write_layer(e->kv, s, il, kivi_move_lo(e, mv, il), mv->done_new * G);
    return st;
}

/* the key and value of position p of layer il of s as the cache holds them, as floats */
static void kivi_source(ei_engine *e, int s, int il, const kivi_move *mv, int p, float *k, float *v) {
    const ei_model_desc *m = &e->m;
    const int G = mv->G, bits = e->p.kv_type_k, L = m->n_layer;
    if (!kivi_from_group(e, mv, il, p)) {
        e->k->to_float[EI_TYPE_F16](k_row(e, s, L + il, p), k, e->kv_dim);
        e->k->to_float[EI_TYPE_F16](v_row(e, s, L + il, p), v, e->v_dim);
        return;
    }
    const uint8_t *groups = k_row(e, s, il, p / G * G);
    const size_t cb = ei_kivi_k_channel_bytes(bits, G);
    for (int h = 0; h < m->n_head_kv; h++) {
        const uint8_t *block = groups + (size_t)h * e->kivi_k_block;
        for (int d = 0; d < m->head_dim; d++) {
            const float sc = ei_kivi_f16_at(block + 2 * (size_t)d), z = ei_kivi_f16_at(block + 2 * ((size_t)m->head_dim + d));
            const unsigned code = ei_kivi_code_at(block + 4 * (size_t)m->head_dim + (size_t)d * cb, p % G, bits);
            k[(size_t)h * m->head_dim + d] = sc * (float)code + z;
        }
        e->k->kivi_decode_v(e->p.kv_type_v, G, m->head_dim_v, v_row(e, s, il, p) + (size_t)h * e->kivi_v_row,
                            e->kivi_v_row, 1, v + (size_t)h * m->head_dim_v);
    }
}

/* layer il: its new rows from lo on, in tk / tv (f16, from position g0 * G), then written */
static void kivi_move_layer(ei_engine *e, int s, int il, const kivi_move *mv, int n_runs, const int32_t *runs,
                            ei_f16 *tk, ei_f16 *tv, float *kf, float *vf, float *cs) {
    const ei_model_desc *m = &e->m;
    const int G = mv->G, L = m->n_layer, lo = kivi_move_lo(e, mv, il), base = mv->g0 * G;
    int delta = 0;
    for (int i = kivi_move_start(e, mv, il); i < mv->kept; i++) {
        const int p = source_of(n_runs, runs, i);
        kivi_source(e, s, il, mv, p, kf, vf);
        if (p - i != delta) rope_row(e, e->layer_base[il], -(delta = p - i), cs);
        if (delta)
            for (int h = 0; h < m->n_head_kv; h++) e->k->rope(m->n_rot, kf + (size_t)h * m->head_dim, cs, m->rope_neox);
        e->k->from_float[EI_TYPE_F16](kf, tk + (size_t)(i - base) * e->kv_dim, e->kv_dim);
        e->k->from_float[EI_TYPE_F16](vf, tv + (size_t)(i - base) * e->v_dim, e->v_dim);
    }
    if (kivi_layer_quantized(e, il))
        for (int g = lo / G; g < mv->done_new; g++)
            for (int h = 0; h < m->n_head_kv; h++)
                kivi_quantize_head(e, s, il, g * G, h,
                                   (const uint8_t *)(tk + (size_t)(g * G - base) * e->kv_dim) + (size_t)h * e->k_head_bytes,
                                   (const uint8_t *)(tv + (size_t)(g * G - base) * e->v_dim) + (size_t)h * e->v_head_bytes);
    for (int i = mv->r_lo; i < mv->kept; i++) {
        memcpy(k_row(e, s, L + il, i), tk + (size_t)(i - base) * e->kv_dim, e->k_row_bytes);
        memcpy(v_row(e, s, L + il, i), tv + (size_t)(i - base) * e->v_dim, e->v_row_bytes);
    }
}

static ei_status kivi_evict(ei_engine *e, int s, int n_runs, const int32_t *runs, int n_past) {
    const int G = e->p.kivi_group, held = kivi_quantized_below(e, n_past - 1) / G;
    kivi_move mv = {G, n_past - dropped_below(n_runs, runs, n_past), e->kivi_done[s], 0, runs[0] / G, 0};
    if (mv.done > held) mv.done = held; /* groups past it are stale (a rewind) */
    mv.done_new = mv.kept > 0 ? kivi_quantized_below(e, mv.kept - 1) / G : 0;
    mv.r_lo = kivi_residual_from(e, s, &mv);
    ei_status st = kivi_move_prepare(e, s, &mv, n_runs, runs);
    if (st != EI_OK) return st;
    const size_t rows = (size_t)(mv.kept - mv.g0 * G);
    ei_f16 *tk = malloc(2 * rows * (size_t)e->kv_dim + 1), *tv = malloc(2 * rows * (size_t)e->v_dim + 1);
    float *kf = malloc(sizeof(float) * (size_t)(e->kv_dim + e->v_dim)), *cs = malloc(sizeof(float) * (size_t)e->m.n_rot);
    if (!tk || !tv || !kf || !cs) st = ei_fail(EI_ERR_NOMEM, "out of memory for dropping positions");
    for (int il = 0; st == EI_OK && il < e->m.n_layer; il++)
        kivi_move_layer(e, s, il, &mv, n_runs, runs, tk, tv, kf, kf + e->kv_dim, cs);
    free(tk); free(tv); free(kf); free(cs);
    if (st != EI_OK) return st;
    /* a sliding window's groups from the first changed one up to those moved are stale: let
     * them go, and what lies below them (a later query that would need them is refused as a
     * rewind too deep) */
    for (int il = 0; il < e->m.n_layer; il++)
        if (ring_layer(e, il) && kivi_move_lo(e, &mv, il) > mv.g0 * G)
            ei_kv_pool_release_below(e->kv, s, il, kivi_move_lo(e, &mv, il));
    e->kivi_done[s] = mv.done_new;
    kivi_unkey_stale(e, s);
    if (e->scores) evict_scores(e, s, n_runs, runs, n_past);
    ei_kv_pool_trim(e->kv, s, mv.kept);
    return EI_OK;
}

ei_status ei_engine_seq_evict(ei_engine *e, int32_t seq, int32_t n_runs, const int32_t *runs, int32_t n_past) {
    ei_status st = check_runs(e, seq, n_runs, runs, n_past);
    if (st == EI_OK && n_runs && e->gpu && e->first_gpu < e->m.n_layer && !e->ks.shift && e->kv_dim > 4096) /* move_rows.comp */
        st = ei_fail(EI_ERR_UNSUPPORTED, "dropping positions on the GPU: keys of %d values a position are over move_rows' 4096",
                     e->kv_dim);
    if (st != EI_OK || n_runs == 0) return st;
    if (e->kivi) return kivi_evict(e, seq, n_runs, runs, n_past);
    int *from = malloc(sizeof(int) * (size_t)e->m.n_layer);
    float *cs = malloc(sizeof(float) * (size_t)e->m.n_rot);
    float *buf = malloc(sizeof(float) * (size_t)e->kv_dim);
    st = !from || !cs || !buf ? ei_fail(EI_ERR_NOMEM, "out of memory for dropping positions")
                              : evict_sources(e, seq, n_runs, runs, n_past, from);
    const int kept = n_past - dropped_below(n_runs, runs, n_past);
    /* a full-attention layer's group holds every destination already (made private here);
     * the sliding-window groups move a block at a time (evict_window) */
    for (int il = 0; st == EI_OK && il < e->m.n_layer; il++) {
        if (ring_layer(e, il)) continue;
        const int p = first_kept(n_runs, runs, from[il]);
        if (p < n_past) st = ei_kv_pool_write_layer(e->kv, seq, il, p - dropped_below(n_runs, runs, p), kept);
    }
    if (st == EI_OK) st = flush_device_copies(e);
    /* the last step that can fail before rows move (keys kept as first rotated: their shifts) */
    if (st == EI_OK) st = ei_key_shifts_drop(&e->ks, seq, n_runs, runs, n_past, shift_rotation, e);
    for (int il = 0; st == EI_OK && il < e->m.n_layer; il++) {
        int seen = 0; /* the group's first layer moves them all */
        for (int j = 0; j < il && !seen; j++) seen = ring_layer(e, j) && e->layers[j].window == e->layers[il].window;
        if (ring_layer(e, il) && !seen) st = evict_window(e, seq, il, from[il], n_runs, runs, n_past, cs, buf);
    }
    for (int il = 0; st == EI_OK && il < e->m.n_layer; il++)
        if (!ring_layer(e, il)) st = evict_layer(e, seq, il, from[il], n_runs, runs, n_past, cs, buf);
    if (st == EI_OK) {
        if (e->scores) evict_scores(e, seq, n_runs, runs, n_past);
        ei_kv_pool_trim(e->kv, seq, kept);
        st = sync_device_shifts(e, seq, kept);
    }
    free(from); free(cs); free(buf);
    return st;
}

ei_status ei_engine_seq_discard(ei_engine *e, int32_t seq, int32_t start, int32_t count, int32_t n_past) {
    if (e && (start < 0 || count < 0 || n_past > e->p.n_ctx || start > n_past - count))
        return ei_fail(EI_ERR_INVALID, "cannot discard %d positions from %d of the %d held", count, start, n_past);
    const int32_t run[2] = {start, count};
    return ei_engine_seq_evict(e, seq, count > 0, run, n_past);
}

ei_status ei_engine_attention_scores(const ei_engine *e, int32_t seq, int32_t n, int64_t *out) {
    if (!e || seq < 0 || seq >= e->p.n_seq_max) return ei_fail(EI_ERR_INVALID, "no sequence %d", seq);
    if (!e->scores) return ei_fail(EI_ERR_INVALID, "the engine tracks no attention (track_attention is 0)");
    if (n < 0 || n > e->p.n_ctx || (n && !out)) return ei_fail(EI_ERR_INVALID, "bad arguments");
    memcpy(out, e->scores + (size_t)seq * e->p.n_ctx, sizeof(int64_t) * (size_t)n);
    return EI_OK;
}

/* ---- sharing blocks between sequences ------------------------------------------------ */

ei_status ei_engine_seq_fork(ei_engine *e, int32_t src, int32_t dst, int32_t n) {
    if (!e || src < 0 || src >= e->p.n_seq_max || dst < 0 || dst >= e->p.n_seq_max || src == dst)
        return ei_fail(EI_ERR_INVALID, "cannot fork sequence %d into %d", src, dst);
    if (n < 0 || n > e->p.n_ctx) return ei_fail(EI_ERR_INVALID, "cannot share %d positions", n);
    const ei_status st = ei_key_shifts_fork(&e->ks, src, dst, n, shift_rotation, e);
    if (st != EI_OK) return st;
    kivi_unkey_stale(e, dst);
    ei_kv_pool_fork(e->kv, src, dst, n);
    if (e->kivi) { /* the groups it shares are quantized as src's are */
        e->kivi_done[dst] = e->kivi_done[src] < n / e->p.kivi_group ? e->kivi_done[src] : n / e->p.kivi_group;
        kivi_unkey_stale(e, dst);
    }
    if (e->scores) /* the shared prefix has received the same attention */
        memcpy(e->scores + (size_t)dst * e->p.n_ctx, e->scores + (size_t)src * e->p.n_ctx, sizeof(int64_t) * (size_t)n);
    return EI_OK;
}

ei_status ei_engine_seq_set_key(ei_engine *e, int32_t seq, int32_t block, uint64_t key) {
    if (!e || seq < 0 || seq >= e->p.n_seq_max) return ei_fail(EI_ERR_INVALID, "no sequence %d", seq);
    if (block < 0 || (int64_t)block * ei_kv_pool_block_size(e->kv) >= e->p.n_ctx)
        return ei_fail(EI_ERR_INVALID, "no block %d to key", block);
    ei_kv_pool_set_key(e->kv, seq, block, key);
    return EI_OK;
}

ei_status ei_engine_seq_publish(ei_engine *e, int32_t seq, int32_t n_blocks) {
    if (!e || seq < 0 || seq >= e->p.n_seq_max) return ei_fail(EI_ERR_INVALID, "no sequence %d", seq);
    /* a KIVI block is final once its group is quantized */
    ei_kv_pool_publish(e->kv, seq, e->kivi && e->kivi_done[seq] < n_blocks ? e->kivi_done[seq] : n_blocks);
    return EI_OK;
}

ei_status ei_engine_seq_reuse(ei_engine *e, int32_t seq, int32_t n, const uint64_t *keys, int32_t *positions) {
    if (!e || seq < 0 || seq >= e->p.n_seq_max || n < 0 || (n && !keys) || !positions)
        return ei_fail(EI_ERR_INVALID, "bad arguments");
    kivi_unkey_stale(e, seq);
    *positions = ei_kv_pool_reuse(e->kv, seq, n, keys);
    ei_key_shifts_reset(&e->ks, seq); /* cached blocks come from sequences that never moved */
    if (e->kivi) e->kivi_done[seq] = *positions / e->p.kivi_group; /* only quantized blocks are cached */
    return sync_device_shifts(e, seq, *positions); /* the device's words say so too */
}

int32_t ei_engine_block_size(void) { return EI_KV_BLOCK; }
int32_t ei_engine_block_positions(const ei_engine *e) { return e ? ei_kv_pool_block_size(e->kv) : -1; }

int32_t ei_engine_pool_stats(const ei_engine *e, int64_t *out, int32_t n) {
    return e && out ? ei_kv_pool_stats(e->kv, out, n) : 0;
}

/* ---- rows of the cache, for saved sessions --------------------------------------------- */

/* entry i of the caller's keys ko (n, kb) and values vo (n, vb), either NULL, to (write) or
 * from the cache's kc and vc */
static void copy_entry(uint8_t *kc, uint8_t *vc, uint8_t *ko, uint8_t *vo, int i, size_t kb, size_t vb, int write) {
    if (ko) write ? memcpy(kc, ko + (size_t)i * kb, kb) : memcpy(ko + (size_t)i * kb, kc, kb);
    if (vo) write ? memcpy(vc, vo + (size_t)i * vb, vb) : memcpy(vo + (size_t)i * vb, vc, vb);
}

/* Copies go through k_row / v_row only, so they stay right however the cache is laid out;
 * a layer's rows are those of its last layer_rows positions (a sliding window's blocks keep
 * at least that many), which the caller (edgeinfer/session_state.py, knowing n_past) asks
 * for. */

/* seq_rows of a device layer: the blocks the pool copied (for this writer, or for a CPU
 * layer's write in the same group) first, then the rows by their pool indices; written key
 * rows carry the shifts the engine holds for their positions (key_shifts.h) */
static ei_status device_rows(ei_engine *e, int seq, int layer, int pos0, int n, void *k_rows, void *v_rows, int write) {
    ei_status st = flush_device_copies(e);
    int64_t *rows = st == EI_OK ? malloc(sizeof(int64_t) * (size_t)n) : NULL;
    if (st == EI_OK && !rows) st = ei_fail(EI_ERR_NOMEM, "out of memory for %d cache rows", n);
    for (int i = 0; st == EI_OK && i < n; i++) rows[i] = ei_kv_pool_row_index(e->kv, seq, layer, pos0 + i);
    if (st == EI_OK) st = ei_vk_offload_rows(e->gpu, layer, n, rows, k_rows, v_rows, write);
    if (st == EI_OK && write && e->ks.shift)
        st = ei_vk_offload_set_shifts(e->gpu, layer, n, rows, e->ks.shift + (size_t)seq * e->p.n_ctx + pos0);
    free(rows);
    return st;
}

ei_status ei_engine_row_bytes(const ei_engine *e, size_t *k_bytes, size_t *v_bytes) {
    if (!e || !k_bytes || !v_bytes) return ei_fail(EI_ERR_INVALID, "bad arguments");
    *k_bytes = e->k_row_bytes;
    *v_bytes = e->v_row_bytes;
    return EI_OK;
}

int32_t ei_engine_layer_rows(const ei_engine *e, int32_t layer) {
    if (!e || layer < 0 || layer >= e->m.n_layer) return -1;
    return ei_kv_pool_layer_rows(e->kv, e->kivi ? e->m.n_layer + layer : layer);
}

ei_status ei_engine_seq_rows(ei_engine *e, int32_t seq, int32_t layer, int32_t pos0, int32_t n,
                             void *k_rows, void *v_rows, int32_t write) {
    if (!e || seq < 0 || seq >= e->p.n_seq_max) return ei_fail(EI_ERR_INVALID, "no sequence %d", seq);
    if (layer < 0 || layer >= e->m.n_layer) return ei_fail(EI_ERR_INVALID, "no layer %d", layer);
    if (e->kivi) layer += e->m.n_layer; /* its residual's rows */
    /* more than a ring's rows at once would name some rows twice */
    const int kept = ei_kv_pool_layer_rows(e->kv, layer);
    if (pos0 < 0 || n < 0 || n > kept || pos0 > e->p.n_ctx - n)
        return ei_fail(EI_ERR_INVALID, "layer %d keeps %d of %d positions: rows [%d, %d + %d) are not held",
                       layer, kept, e->p.n_ctx, pos0, pos0, n);
    if (n == 0) return EI_OK;
    if (write) {
        const ei_status st = ei_kv_pool_write_layer(e->kv, seq, layer, pos0, pos0 + n);
        if (st != EI_OK) return st;
    } else if (!ei_kv_pool_holds(e->kv, seq, layer, pos0, pos0 + n)) {
        return ei_fail(EI_ERR_INVALID, "sequence %d holds no rows [%d, %d) of layer %d", seq, pos0, pos0 + n, layer);
    }
    if (on_gpu(e, layer)) return device_rows(e, seq, layer, pos0, n, k_rows, v_rows, write);
    uint8_t *ko = k_rows, *vo = v_rows; /* (n, k_row_bytes), (n, v_row_bytes); either NULL */
    for (int i = 0; i < n; i++)
        copy_entry(k_row(e, seq, layer, pos0 + i), v_row(e, seq, layer, pos0 + i), ko, vo, i, e->k_row_bytes,
                   e->v_row_bytes, write);
    return EI_OK;
}

/* ---- a KIVI cache's quantized groups, for saved sessions -------------------------------- */

/* A group of layer il is its block: every KV head's key block at the block's first key row,
 * then G value rows of every head (create_kivi_pool). */

ei_status ei_engine_group_bytes(const ei_engine *e, size_t *k_bytes, size_t *v_bytes) {
    if (!e || !k_bytes || !v_bytes) return ei_fail(EI_ERR_INVALID, "bad arguments");
    if (!e->kivi) return ei_fail(EI_ERR_INVALID, "the cache holds rows, not KIVI groups");
    *k_bytes = (size_t)e->m.n_head_kv * e->kivi_k_block;
    *v_bytes = (size_t)e->p.kivi_group * e->m.n_head_kv * e->kivi_v_row;
    return EI_OK;
}

int32_t ei_engine_layer_groups(const ei_engine *e, int32_t layer) {
    if (!e || !e->kivi || layer < 0 || layer >= e->m.n_layer) return -1;
    return kivi_layer_quantized(e, layer) ? ei_kv_pool_layer_rows(e->kv, layer) : 0;
}

ei_status ei_engine_seq_groups(ei_engine *e, int32_t seq, int32_t layer, int32_t g0, int32_t n, void *k, void *v,
                               int32_t write) {
    if (!e || seq < 0 || seq >= e->p.n_seq_max) return ei_fail(EI_ERR_INVALID, "no sequence %d", seq);
    if (!e->kivi) return ei_fail(EI_ERR_INVALID, "the cache holds rows, not KIVI groups");
    if (layer < 0 || layer >= e->m.n_layer) return ei_fail(EI_ERR_INVALID, "no layer %d", layer);
    const int G = e->p.kivi_group, n_max = e->p.n_ctx / G;
    if (!kivi_layer_quantized(e, layer) && n > 0)
        return ei_fail(EI_ERR_INVALID, "layer %d keeps no quantized groups (its window is within the residual)", layer);
    if (g0 < 0 || n < 0 || g0 > n_max - n || (int64_t)n * G > ei_kv_pool_layer_rows(e->kv, layer) + G)
        return ei_fail(EI_ERR_INVALID, "layer %d has no groups [%d, %d + %d)", layer, g0, g0, n);
    if (n == 0) return EI_OK;
    const int p0 = g0 * G, p1 = (g0 + n) * G;
    if (write) {
        const ei_status st = ei_kv_pool_write_layer(e->kv, seq, layer, p0, p1);
        if (st != EI_OK) return st;
    } else if (!ei_kv_pool_holds(e->kv, seq, layer, p0, p1)) {
        return ei_fail(EI_ERR_INVALID, "sequence %d holds no groups [%d, %d) of layer %d", seq, g0, g0 + n, layer);
    }
    size_t kb, vb;
    ei_engine_group_bytes(e, &kb, &vb);
    for (int i = 0; i < n; i++) /* (n, kb), (n, vb); either NULL */
        copy_entry(k_row(e, seq, layer, p0 + i * G), v_row(e, seq, layer, p0 + i * G), k, v, i, kb, vb, write);
    return EI_OK;
}

ei_status ei_engine_seq_quantized(ei_engine *e, int32_t seq, int32_t *n_groups, int32_t set) {
    if (!e || seq < 0 || seq >= e->p.n_seq_max || !n_groups) return ei_fail(EI_ERR_INVALID, "bad arguments");
    if (!e->kivi) return ei_fail(EI_ERR_INVALID, "the cache holds rows, not KIVI groups");
    if (!set) {
        *n_groups = e->kivi_done[seq];
        return EI_OK;
    }
    if (*n_groups < 0 || *n_groups > e->p.n_ctx / e->p.kivi_group)
        return ei_fail(EI_ERR_INVALID, "%d quantized groups do not fit the context", *n_groups);
    kivi_unkey_stale(e, seq);
    e->kivi_done[seq] = *n_groups;
    kivi_unkey_stale(e, seq);
    return EI_OK;
}

/* ---- keys kept as first rotated, for saved sessions (key_shifts.h) ----------------------- */

ei_status ei_engine_seq_key_shifts(ei_engine *e, int32_t seq, int32_t n, int32_t *shifts, int32_t set) {
    if (!e || seq < 0 || seq >= e->p.n_seq_max || n < 0 || n > e->p.n_ctx || (n && !shifts))
        return ei_fail(EI_ERR_INVALID, "bad arguments");
    if (!set) {
        if (e->ks.shift) memcpy(shifts, e->ks.shift + (size_t)seq * e->p.n_ctx, sizeof(int32_t) * (size_t)n);
        else memset(shifts, 0, sizeof(int32_t) * (size_t)n);
        return EI_OK;
    }
    for (int p = 0; p < n; p++) {
        if (shifts[p] && !e->ks.shift)
            return ei_fail(EI_ERR_INVALID, "this key cache rotates its keys where they move (only q8_0 and q4_0 "
                           "keys are kept as first rotated): position %d cannot hold a key rotated %d positions "
                           "ahead", p, shifts[p]);
        if (shifts[p] < 0 || shifts[p] > e->p.n_ctx - 1 - p)
            return ei_fail(EI_ERR_INVALID, "position %d cannot hold a key rotated %d positions ahead of it (the "
                           "context is %d)", p, shifts[p], e->p.n_ctx);
    }
    const ei_status st = ei_key_shifts_set(&e->ks, seq, n, shifts, shift_rotation, e);
    return st == EI_OK ? sync_device_shifts(e, seq, n) : st;
}
