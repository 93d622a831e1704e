/* edgeinfer native core: the C API that edgeinfer/_native.py binds (and nothing else does).
 *
 * Every function returns a status; none aborts the process. On failure, ei_last_error()
 * describes the problem in one line. Weights are read in place through the pointers in the
 * model description, which must stay valid (memory-mapped) for the engine's lifetime. */
#ifndef EDGEINFER_H
#define EDGEINFER_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define EI_EXPORT __declspec(dllexport)
#else
#define EI_EXPORT __attribute__((visibility("default")))
#endif

#define EI_API_VERSION 16

/* limits of ei_engine_params (edgeinfer/engines/base.py checks the same before calling) */
#define EI_MAX_THREADS 512
#define EI_MAX_BATCH 4096

typedef enum {
    EI_OK = 0,
    EI_ERR_INVALID = 1,     /* an argument or the model description is inconsistent */
    EI_ERR_NOMEM = 2,       /* an allocation failed */
    EI_ERR_UNSUPPORTED = 3, /* a type or feature this build cannot compute */
    EI_ERR_CONTEXT = 4,     /* a position lies outside the context */
    EI_ERR_ISA = 5,         /* the instruction set is not available here */
    EI_ERR_DEVICE = 6       /* the GPU failed: a Vulkan call other than an allocation returned an error */
} ei_status;

/* instruction-set variants, in the order ei_isa_name() reports them */
enum { EI_ISA_SCALAR = 0, EI_ISA_AVX2, EI_ISA_AVX512, EI_ISA_NEON, EI_ISA_NEON_DOTPROD, EI_ISA_NEON_I8MM, EI_ISA_COUNT };

/* a weight tensor: ne0 values per row, ne1 rows; data == NULL means absent */
typedef struct {
    const void *data;
    int32_t type;
    int32_t layout;  /* 0: rows as stored in the file (the engine keeps its own interleaved copies) */
    int64_t ne0, ne1;
} ei_tensor;

/* The tensors of one decoder layer, written once: the layer struct's fields, the engine's
 * shape checks and the list of matrices (partner types, interleaved copies) all expand it, and
 * ei_layer_tensor_name() reports it to Python, which checks it against its own LayerTensors.
 * X(name, kind, presence, ne0, ne1): kind EI_MATRIX is the weight of a matrix product (any
 * supported type), EI_VECTOR an f32 vector (ne1 == 1); presence EI_REQUIRED or EI_OPTIONAL;
 * the shape in the names n_embd, q_dim (n_head * head_dim), kv_dim (n_head_kv * head_dim),
 * v_dim (n_head_kv * head_dim_v), att_dim (n_head * head_dim_v), head_dim, n_ff and one (1).
 * The order is the layer struct's, and LayerTensors' (edgeinfer/models/base.py). */
#define EI_LAYER_TENSORS(X)                                   \
    X(attn_norm, EI_VECTOR, EI_REQUIRED, n_embd, one)         \
    X(wq, EI_MATRIX, EI_REQUIRED, n_embd, q_dim)              \
    X(wk, EI_MATRIX, EI_REQUIRED, n_embd, kv_dim)             \
    X(wv, EI_MATRIX, EI_REQUIRED, n_embd, v_dim)              \
    X(wo, EI_MATRIX, EI_REQUIRED, att_dim, n_embd)            \
    X(ffn_norm, EI_VECTOR, EI_REQUIRED, n_embd, one)          \
    X(ffn_gate, EI_MATRIX, EI_REQUIRED, n_embd, n_ff)         \
    X(ffn_up, EI_MATRIX, EI_REQUIRED, n_embd, n_ff)           \
    X(ffn_down, EI_MATRIX, EI_REQUIRED, n_ff, n_embd)         \
    X(bq, EI_VECTOR, EI_OPTIONAL, q_dim, one)                 \
    X(bk, EI_VECTOR, EI_OPTIONAL, kv_dim, one)                \
    X(bv, EI_VECTOR, EI_OPTIONAL, v_dim, one)                 \
    X(q_norm, EI_VECTOR, EI_OPTIONAL, head_dim, one)          \
    X(k_norm, EI_VECTOR, EI_OPTIONAL, head_dim, one)          \
    X(attn_post_norm, EI_VECTOR, EI_OPTIONAL, n_embd, one)    \
    X(ffn_post_norm, EI_VECTOR, EI_OPTIONAL, n_embd, one)

#define EI_LAYER_FIELD_(name, kind, presence, ne0, ne1) ei_tensor name;
typedef struct {
    EI_LAYER_TENSORS(EI_LAYER_FIELD_)
    int32_t window;  /* keys within this many positions are seen; 0: all */
    float rope_base;  /* rotary frequency base of this layer */
    float rope_scale; /* its position scale (1 / linear scaling factor) */
} ei_layer_desc;

typedef struct {
    int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, head_dim_v, n_ff, n_rot;
    int32_t rope_neox; /* rotate (x[i], x[i + n_rot/2]) instead of (x[2i], x[2i+1]) */
    int32_t act_gelu;  /* gated FFN activation: 1 GELU (tanh form), 0 SiLU */
    int32_t scale_q;   /* multiply queries by kq_scale (else the scores) */
    float norm_eps, embed_scale, kq_scale, final_softcap;
    ei_tensor tok_embd, output_norm, output, rope_freqs;
    const ei_layer_desc *layers; /* n_layer of them */
} ei_model_desc;

typedef struct {
    int32_t n_ctx;     /* positions per sequence */
    int32_t n_threads; /* worker threads including the caller's */
    int32_t n_seq_max; /* sequences that may hold cache at once */
    int32_t n_batch;   /* most tokens per internal step; longer calls are split */
    int32_t kv_type_k; /* GGML type of a key cache element (F16, F32, Q8_0, Q4_0); under
                        * EI_KV_KIVI the bits of a key code (2 or 4) */
    int32_t kv_type_v; /* of a value cache element. A Q8_0 / Q4_0 cache stores each head's
                        * rows Walsh-Hadamard rotated, as llama.cpp does (a head of a multiple
                        * of 64 values: keys, and the queries meeting them, in blocks of the
                        * largest power of two dividing it, values in blocks of 64, the
                        * attention output rotated back), which spreads outliers over a block */
    int32_t kv_layout; /* EI_KV_ROWS: one row per (position, KV head); EI_KV_KIVI: KIVI */
    int32_t isa;       /* EI_ISA_* to use, or -1 for the best supported */
    int32_t ring;      /* 1: a sliding-window layer releases the blocks behind its window (it
                        * keeps window + EI_KV_SLACK positions and the step's), so a sequence
                        * rewinds by at most ei_engine_block_size() positions (further, it is
                        * cleared and evaluated again); 0: every layer keeps n_ctx */
    int32_t track_attention; /* 1: each sequence sums the attention its positions receive
                              * (ei_engine_attention_scores), the H2O policy's heavy hitters */
    int64_t kv_budget; /* bytes for the KV cache's block pool; 0: n_seq_max sequences of n_ctx */
    int32_t kivi_group;    /* EI_KV_KIVI: tokens per key group G (32, 64, 128), the block size */
    int32_t kivi_residual; /* EI_KV_KIVI: the newest positions R read in f16 (>= 0) */
    int32_t release_weights; /* 1: the weights lie in a read-only file mapping, whose pages of a
                              * matrix the engine copies into an interleaved layout are dropped
                              * once copied (madvise: a later read faults them in again from the
                              * file); 0: left alone, as any other memory must be (dropping the
                              * pages of anonymous memory zeroes them) */
    int32_t fixed_threads; /* 1: every step runs on n_threads; 0: a step of a few tokens (a
                            * decoding step) may run on fewer, when timing shows fewer are
                            * faster (another program holds a core: simd/common/step_threads.h).
                            * Results are the same on any count */
    int32_t n_gpu_layers;  /* on a Vulkan device, as llama.cpp counts: 0 none; N the output and
                            * the last N - 1 layers; n_layer + 1 all; EI_GPU_AUTO what fits.
                            * Their weights, and the KV rows of those layers, live on the
                            * device (f32, f16, q8_0 or q4_0 caches, EI_KV_ROWS); the residual
                            * stream crosses once a step */
    int32_t gpu_device;    /* the Vulkan device index; -1: the first discrete GPU, else integrated, else the first */
} ei_engine_params;

/* n_gpu_layers = EI_GPU_AUTO: as many layers as fit in the device's free memory less a margin,
 * after the output, their KV cache for n_ctx and the compute buffers (ei_engine_gpu_plan says
 * what was chosen and why); no layer where there is no GPU. An explicit number must fit the
 * free memory, or ei_engine_create fails with EI_ERR_NOMEM giving the numbers. */
#define EI_GPU_AUTO (-1)
/* where the free device memory an offload was fitted to came from */
enum { EI_GPU_BUDGET_NONE = 0,     /* no device */
       EI_GPU_BUDGET_MEASURED = 1, /* VK_EXT_memory_budget: the heaps' budget less their usage */
       EI_GPU_BUDGET_HEAP = 2,     /* the device-local heaps' size (no VK_EXT_memory_budget) */
       EI_GPU_BUDGET_FORCED = 3 }; /* EDGEINFER_VULKAN_BUDGET (bytes, or with K, M or G) */

/* what layer offload placed on the device; sizes as the device's memory requirements give them */
typedef struct {
    int32_t n_gpu_layers;     /* on the device, as n_gpu_layers counts (what EI_GPU_AUTO chose) */
    int32_t device;           /* the Vulkan device's index; -1: none */
    int32_t budget_source;    /* EI_GPU_BUDGET_* */
    int32_t pad;
    uint64_t free_bytes;      /* the free device memory it was fitted to */
    uint64_t margin_bytes;    /* what EI_GPU_AUTO left free of it (0 for an explicit number) */
    uint64_t weights_bytes;   /* the device layers' and the output's weights */
    uint64_t cache_bytes;     /* the device layers' KV cache, for every block of the pool */
    uint64_t buffer_bytes;    /* activations, scratch, logits and the staging buffer */
    uint64_t held_bytes;      /* the device memory its buffers hold now */
    char device_name[256];
    char reason[256];         /* EI_GPU_AUTO: why fewer than every layer went, "" when all did */
} ei_gpu_plan;

/* how a cache tensor's elements are grouped (edgeinfer/kv_cache.py: CacheLayout).
 * EI_KV_KIVI (arXiv 2402.02750, formats in simd/common/kivi.h): keys quantized per channel
 * over groups of G positions, values per position, both to kv_type_k / kv_type_v bits. Every
 * position is first stored in f16 (the residual); a query at position p reads the groups that
 * end at or before p + 1 - R quantized and every later position in f16, so that what a query
 * sees depends on its position alone, never on how the tokens were batched. A group is
 * quantized in the step in which a query first reads it so, and its f16 rows are let go once
 * no query needs them (the residual is a window of R + G positions). */
enum { EI_KV_ROWS = 0, EI_KV_KIVI = 1 };

typedef struct ei_engine ei_engine;

EI_EXPORT int ei_api_version(void);
EI_EXPORT const char *ei_last_error(void);

/* the structs Python mirrors, for ei_struct_size(): a mismatch means the library is not used */
enum { EI_STRUCT_TENSOR = 0, EI_STRUCT_LAYER_DESC, EI_STRUCT_MODEL_DESC, EI_STRUCT_ENGINE_PARAMS,
       EI_STRUCT_PROFILE_ENTRY, EI_STRUCT_VK_DEVICE, EI_STRUCT_GPU_PLAN, EI_STRUCT_COUNT };
EI_EXPORT size_t ei_struct_size(int which); /* sizeof of an EI_STRUCT_*, 0 for another number */
/* the name of layer tensor i in EI_LAYER_TENSORS order, NULL past the last */
EI_EXPORT const char *ei_layer_tensor_name(int i);

/* instruction sets: built into this library, supported by this CPU and OS, and why (not) */
EI_EXPORT const char *ei_isa_name(int isa);
EI_EXPORT int ei_isa_supported(int isa);
EI_EXPORT const char *ei_isa_reason(int isa);
EI_EXPORT int ei_isa_best(void);
EI_EXPORT const char *ei_cpu_features(void); /* space-separated feature names found */

/* The per-op profile (ei_engine_profile): the kinds of phase a forward pass is cut into,
 * written once; ei_profile_kind_name() reports them to Python, which labels them.
 * call: a whole ei_engine_decode call (not a part: the total the parts add up to);
 * cache_blocks: blocks taken, copied and trimmed around each step, the KIVI plan; threads: the
 * pool's threads woken for a step and joined after it (a busy machine's waits for a thread
 * that lost its core land here, or in the phase they delay); embed: the
 * token embeddings; rope_tables: the (cos, sin) pairs of the step's positions; norm: RMS
 * norms with the residual adds; act_quant: activations quantized for a group of products;
 * repack: interleaved copies of weights made on first use; matmul: the products of one weight
 * type and shape (type, rows, cols); qkv_post: biases, q/k norms, RoPE and cache writes;
 * kivi_quant: KIVI groups quantized; attention; output_rows: the last layer's rows gathered;
 * glu: the gated activation; softcap: the final logit softcap; gpu: the offloaded layers and the
 * output on the Vulkan device (n_gpu_layers), uploads and the logits' download included. */
#define EI_PROFILE_KINDS(X) \
    X(call) X(cache_blocks) X(threads) X(embed) X(rope_tables) X(norm) X(act_quant) X(repack) X(matmul) \
    X(qkv_post) X(kivi_quant) X(attention) X(output_rows) X(glu) X(softcap) X(gpu)
#define EI_PROFILE_KIND_(name) EI_PROF_##name,
enum { EI_PROFILE_KINDS(EI_PROFILE_KIND_) EI_PROF_KIND_COUNT };

/* one row of the profile: the wall time of every phase of a kind (and for matmul, of one
 * weight type and shape) since profiling was enabled, summed over the calls */
typedef struct {
    int32_t kind;       /* EI_PROF_* */
    int32_t type;       /* matmul: the weight's GGML type; -1 otherwise */
    int64_t rows, cols; /* matmul: the weight's shape (rows of cols values); 0 otherwise */
    int64_t calls;      /* phases recorded */
    int64_t ns;         /* their wall time, each from one barrier's release to the next's */
    int64_t flops;      /* floating-point operations done (a multiply-add counts 2); 0: none counted */
    int64_t bytes;      /* bytes read (matmul: the weights; attention: the cache rows each
                         * query reads); 0: none counted */
} ei_profile_entry;

EI_EXPORT const char *ei_profile_kind_name(int kind); /* NULL past the last */

EI_EXPORT ei_status ei_engine_create(const ei_model_desc *model, const ei_engine_params *params,
                                     ei_engine **out);
/* Runs n tokens (token id, position and sequence of each) through the model, appending
 * their keys and values to the sequences' caches. For every token with out_mask[i] != 0,
 * one row of n_vocab logits is written to logits, in token order. Thread-safe per engine
 * only when calls do not overlap. */
EI_EXPORT ei_status ei_engine_decode(ei_engine *e, int32_t n, const int32_t *tokens, const int32_t *pos,
                                     const int32_t *seq, const int8_t *out_mask, float *logits);
/* forgets sequence seq: its blocks go back to the pool (keyed ones stay as cached prefixes),
 * so its next token starts an empty context */
EI_EXPORT ei_status ei_engine_seq_clear(ei_engine *e, int32_t seq);
/* The cache is a pool of blocks of ei_engine_block_size() positions (simd/common/kv_pool.h).
 * fork: dst (cleared first) shares the blocks of src's first n positions, copied on write.
 * set_key: block `block` of seq will have this key once full (a hash of its tokens and all
 * before them; 0: none), given before the step that fills it; the block keeps it when seq lets
 * it go (a cached prefix, for reuse), or from publish on, which a successful step's caller
 * calls for the blocks it filled (others may then share them while seq holds them). reuse: seq (cleared first) takes the cached
 * blocks of keys[0..n) that every layer group has; *positions = the positions it holds then.
 * pool_stats: out[0] layer groups, out[1] block lookups, out[2] hits, then per group window,
 * blocks, used, cached, free, bytes per block; returns the values written (at most n). */
EI_EXPORT ei_status ei_engine_seq_fork(ei_engine *e, int32_t src, int32_t dst, int32_t n);
EI_EXPORT ei_status ei_engine_seq_set_key(ei_engine *e, int32_t seq, int32_t block, uint64_t key);
EI_EXPORT ei_status ei_engine_seq_publish(ei_engine *e, int32_t seq, int32_t n_blocks);
EI_EXPORT ei_status ei_engine_seq_reuse(ei_engine *e, int32_t seq, int32_t n, const uint64_t *keys,
                                        int32_t *positions);
EI_EXPORT int32_t ei_engine_block_size(void); /* the least positions a block holds */
/* the positions a block of this engine's pool holds (kivi_group under EI_KV_KIVI) */
EI_EXPORT int32_t ei_engine_block_positions(const ei_engine *e);
EI_EXPORT int32_t ei_engine_pool_stats(const ei_engine *e, int64_t *out, int32_t n);
/* forgets positions [start, start + count) of sequence seq, which holds n_past: the later ones
 * move down by count, their keys rotated back by count so that RoPE sees their new positions
 * (llama.cpp's context shift; StreamingLLM's eviction behind the attention sinks); q8_0 and
 * q4_0 keys move as they are, their shifts growing by count (ei_engine_seq_key_shifts) */
EI_EXPORT ei_status ei_engine_seq_discard(ei_engine *e, int32_t seq, int32_t start, int32_t count,
                                          int32_t n_past);
/* the same for n_runs runs (runs[2i] start, runs[2i + 1] count; in order, apart, none empty):
 * every later position moves down by the positions dropped below it, its keys rotated back by
 * as much (q8_0 / q4_0 keys: moved as they are, their shifts grown by as much), and its
 * attention score (track_attention) with it (H2O's eviction) */
EI_EXPORT ei_status ei_engine_seq_evict(ei_engine *e, int32_t seq, int32_t n_runs, const int32_t *runs,
                                        int32_t n_past);
/* with track_attention: out[p] for p < n, the attention position p of seq received from every
 * query head of every layer since it was written, in units of 2^-32 (summed exactly) */
EI_EXPORT ei_status ei_engine_attention_scores(const ei_engine *e, int32_t seq, int32_t n, int64_t *out);
/* rows of the cache in its own encoding (saved sessions): the bytes of one position's keys
 * and values (n_head_kv heads each), and how many positions layer `layer` keeps per sequence
 * (n_ctx, or a sliding-window layer's ring: only its last that many positions are held;
 * -1 for no such layer). For a KIVI cache these are the f16 rows of its residual. */
EI_EXPORT ei_status ei_engine_row_bytes(const ei_engine *e, size_t *k_bytes, size_t *v_bytes);
EI_EXPORT int32_t ei_engine_layer_rows(const ei_engine *e, int32_t layer);
/* copies the rows of positions [pos0, pos0 + n) of one layer of sequence seq out of the cache
 * into k_rows (n, k_bytes) and v_rows (n, v_bytes), or with write != 0 from them into the
 * cache (reserving it); either buffer may be NULL. Positions older than the layer keeps are
 * the caller's to avoid: a ring holds one row for several of them. */
EI_EXPORT ei_status ei_engine_seq_rows(ei_engine *e, int32_t seq, int32_t layer, int32_t pos0,
                                       int32_t n, void *k_rows, void *v_rows, int32_t write);
/* a KIVI cache's quantized groups (saved sessions): the bytes of one group of a layer (every
 * KV head's key block, then the G value rows of every head), and the positions whose groups
 * layer `layer` keeps per sequence (as ei_engine_layer_rows; 0 for a sliding-window layer no
 * query reads quantized, -1 for no such layer) */
EI_EXPORT ei_status ei_engine_group_bytes(const ei_engine *e, size_t *k_bytes, size_t *v_bytes);
EI_EXPORT int32_t ei_engine_layer_groups(const ei_engine *e, int32_t layer);
/* copies groups [g0, g0 + n) of one layer of sequence seq out of the cache into k (n, k_bytes)
 * and v (n, v_bytes), or with write != 0 into it (reserving it) */
EI_EXPORT ei_status ei_engine_seq_groups(ei_engine *e, int32_t seq, int32_t layer, int32_t g0,
                                         int32_t n, void *k, void *v, int32_t write);
/* the groups of sequence seq that are quantized (*n_groups out), or with set != 0 declares
 * the first *n_groups so after their codes were written */
EI_EXPORT ei_status ei_engine_seq_quantized(ei_engine *e, int32_t seq, int32_t *n_groups, int32_t set);
/* a q8_0 / q4_0 key cache keeps its keys as first rotated when positions are dropped (a query
 * meets them rotated as far ahead itself; simd/common/key_shifts.h): the positions each key of
 * positions [0, n) of seq is ahead of its own (shifts out, 0 for other caches), or with
 * set != 0 those of a restored state (0 <= shifts[p] < n_ctx - p; other caches take 0s only),
 * after its rows were written, n covering every position it holds: device layers (n_gpu_layers)
 * keep each row's shift beside it, and set writes those of positions [0, n) */
EI_EXPORT ei_status ei_engine_seq_key_shifts(ei_engine *e, int32_t seq, int32_t n, int32_t *shifts, int32_t set);
/* enable != 0 starts the per-op profile with every counter at zero (the last thread to reach
 * each barrier then reads a monotonic clock as it releases the others, and barriers set apart
 * the threads' start, the embeddings and the softcap); 0 pauses it, keeping the counters.
 * Off, a forward pass checks one flag per phase. Not to be called while ei_engine_decode runs. */
EI_EXPORT ei_status ei_engine_profile(ei_engine *e, int32_t enable);
/* the profile's rows: *n = how many there are; written to out when out != NULL (cap rows
 * fit; fewer is an error). An engine never profiled has no profile to read (an error). */
EI_EXPORT ei_status ei_engine_profile_read(const ei_engine *e, ei_profile_entry *out, int32_t cap,
                                           int32_t *n);
EI_EXPORT int ei_engine_isa(const ei_engine *e);
/* the threads a step of n_tokens tokens runs on now (n_threads, or fewer; see fixed_threads) */
EI_EXPORT int32_t ei_engine_threads(const ei_engine *e, int32_t n_tokens);
EI_EXPORT size_t ei_engine_memory(const ei_engine *e); /* bytes this engine allocated */
EI_EXPORT ei_status ei_engine_gpu_plan(const ei_engine *e, ei_gpu_plan *out); /* n_gpu_layers 0: zeros, device -1 */
/* of those, the interleaved copies of weights (reserved at load, written by the first step
 * using each weight; the file's pages of those weights are then released) */
EI_EXPORT size_t ei_engine_weight_copies(const ei_engine *e);
EI_EXPORT void ei_engine_free(ei_engine *e);

/* kernel entry points for the tests: run one kernel of one instruction set */
EI_EXPORT ei_status ei_kernel_from_float(int isa, int partner_type, const float *x, void *y, int64_t n);
EI_EXPORT ei_status ei_kernel_to_float(int isa, int type, const void *x, float *y, int64_t n);
EI_EXPORT ei_status ei_kernel_vec_dot(int isa, int weight_type, int n, const void *x, const void *y, float *s);
EI_EXPORT ei_status ei_kernel_rms_norm(int isa, int n, float *y, const float *x, const float *w, float eps);
EI_EXPORT ei_status ei_kernel_rope(int isa, int n_rot, float *x, const float *cs, int neox);
EI_EXPORT ei_status ei_kernel_glu(int isa, int gelu, int n, float *y, const float *g, const float *u);
/* w[t] = exp(scores[t] - max) for t < n by the softmax of attention (edgeinfer's own exp,
 * common/ei_exp.h), and their sum in its order */
EI_EXPORT ei_status ei_kernel_softmax(int isa, int n, const float *scores, double *w, double *sum);
/* K and V are rows of k_type / v_type (GGML types), k_row_bytes / v_row_bytes apart; the query
 * sees n_runs runs of them, oldest first: rows [runs[2i], runs[2i] + runs[2i + 1]) */
EI_EXPORT ei_status ei_kernel_attn(int isa, int head_dim, int head_dim_v, int n_runs, const int32_t *runs,
                                   int k_type, int v_type, size_t k_row_bytes, size_t v_row_bytes,
                                   float scale, float softcap, const float *q, const void *k,
                                   const void *v, float *out);
EI_EXPORT int ei_partner_type_of(int weight_type);
/* KIVI cache kernels (simd/common/kivi.h has the formats): bits 2 or 4, group G 32, 64 or 128.
 * block sizes: a K group block of head_dim channels, a V row of head_dim_v; 0 for no format.
 * quantize_k: the block of G f16 key rows, row_bytes apart; k_dots: dots[i] = the raw dot of
 * the f32 query with token t0 + i of a block, i < n; quantize_v: one token's V row from
 * head_dim_v f16 values; decode_v: m V rows (row_bytes apart) to m * head_dim_v floats. */
EI_EXPORT size_t ei_kivi_k_block_size(int bits, int group, int head_dim);
EI_EXPORT size_t ei_kivi_v_row_size(int bits, int group, int head_dim_v);
EI_EXPORT ei_status ei_kernel_kivi_quantize_k(int isa, int bits, int group, int head_dim, const void *rows,
                                              size_t row_bytes, void *block);
EI_EXPORT ei_status ei_kernel_kivi_k_dots(int isa, int bits, int group, int head_dim, const void *block, int t0,
                                          int n, const float *q, float *dots);
EI_EXPORT ei_status ei_kernel_kivi_quantize_v(int isa, int bits, int group, int head_dim_v, const void *x,
                                              void *row);
EI_EXPORT ei_status ei_kernel_kivi_decode_v(int isa, int bits, int group, int head_dim_v, const void *rows,
                                            size_t row_bytes, int m, float *out);

/* ---- Vulkan devices (simd/gpu_vulkan/): libvulkan is opened at run time, so the library
 * builds and loads without it. One device as Python reports it (edgeinfer doctor). */
typedef struct {
    char name[256];
    char driver_name[256]; /* VK_KHR_driver_properties (Vulkan 1.2); "" before that */
    char driver_info[256];
    int32_t type; /* VkPhysicalDeviceType: 0 other, 1 integrated GPU, 2 discrete GPU, 3 virtual, 4 CPU */
    uint32_t api_version, driver_version, vendor_id, device_id;
    uint32_t subgroup_size, subgroup_ops;  /* VkSubgroupFeatureFlags of compute shaders */
    uint32_t max_storage_buffer_range;     /* the most bytes one storage buffer binding spans */
    uint32_t pad;
    uint64_t max_allocation_bytes;         /* maxMemoryAllocationSize (Vulkan 1.1) */
    uint64_t device_local_bytes;           /* the size of the device-local heaps */
    uint64_t budget_bytes;                 /* their budget less their usage (VK_EXT_memory_budget); 0 without it */
    int32_t memory_budget;                 /* whether budget_bytes was measured */
    int32_t fp16, int8, storage16, integer_dot_product; /* shader features the backend can use */
    int32_t pad2;
} ei_vk_device;

/* The Vulkan devices: up to cap into out, their number in *count. EI_ERR_UNSUPPORTED when no
 * Vulkan loader can be opened or no instance created (ei_last_error says which; that means
 * "no GPU", not a failure of the library). EDGEINFER_VULKAN_LOADER names another loader file. */
EI_EXPORT ei_status ei_vk_devices(ei_vk_device *out, int32_t cap, int32_t *count);

/* A compute context on device index (-1: the first discrete GPU, else integrated, else the
 * first), for one thread at a time; EI_ERR_UNSUPPORTED as above when there is none. Its
 * description, the shader variants it runs (bit 0: subgroups, which EDGEINFER_VULKAN_SUBGROUPS=0
 * turns off; bit 1: the integer dot product, which EDGEINFER_VULKAN_INTEGER_DOT=0 turns off), the most bytes one binding spans, the most one part of a weight spans
 * (that, or less with EDGEINFER_VULKAN_MAX_BUFFER: it exercises the splitting of large
 * weights) and the device memory it holds. */
EI_EXPORT ei_status ei_vk_open(int32_t device, void **ctx);
EI_EXPORT void ei_vk_close(void *ctx);
EI_EXPORT ei_status ei_vk_context_info(void *ctx, ei_vk_device *info, int32_t *variants, uint64_t *max_binding_bytes,
                                       uint64_t *weight_part_bytes, uint64_t *allocated_bytes);
/* The GPU kernels from host arrays, each uploading its weight (rows x cols of a GGML type, as
 * GGUF stores it), running and reading back: y (n, rows) = x (n, cols) W^T; y (n, cols) = the
 * rows ids of W, decoded. */
EI_EXPORT ei_status ei_vk_kernel_gemm(void *ctx, int type, const void *w, int64_t rows, int64_t cols, const float *x,
                                      int64_t n, float *y);
EI_EXPORT ei_status ei_vk_kernel_get_rows(void *ctx, int type, const void *w, int64_t rows, int64_t cols,
                                          const int32_t *ids, int64_t n, float *y);
/* and the steps between the products, each the GPU twin of an ei_kernel_* above: rms_norm of
 * rows of n values (w may be NULL); rope in place on (n_tokens, n_heads, head_dim) values with
 * each token's (cos, sin) pairs (n_tokens, n_rot); glu (gelu 1: the fp16 table's GELU, 0:
 * SiLU); op 0 y += x, 1 y *= s, 2 y = tanh(y / s) * s (x unused but by 0; may be NULL then) */
EI_EXPORT ei_status ei_vk_kernel_rms_norm(void *ctx, int32_t n, int32_t rows, float *y, const float *x, const float *w,
                                          float eps);
EI_EXPORT ei_status ei_vk_kernel_rope(void *ctx, int32_t n_tokens, int32_t n_heads, int32_t head_dim, int32_t n_rot,
                                      float *x, const float *cs, int32_t neox);
EI_EXPORT ei_status ei_vk_kernel_glu(void *ctx, int32_t gelu, int32_t n, float *y, const float *g, const float *u);
EI_EXPORT ei_status ei_vk_kernel_op(void *ctx, int32_t op, int32_t n, float *y, const float *x, float s);
/* the quantized cache's rotation in place on n rows of width values, in blocks of block (a
 * power of two up to 512), as the CPU kernels' hadamard (simd/ref/ops.c); and n rows of width values written into the
 * cache rows rows[i] of cache (n_rows rows of row_bytes) as type (F32, F16, Q8_0, Q4_0) stores
 * them, the rest of cache unchanged */
EI_EXPORT ei_status ei_vk_kernel_hadamard(void *ctx, int32_t n, int32_t width, int32_t block, float *x);
EI_EXPORT ei_status ei_vk_kernel_set_rows(void *ctx, int32_t type, int32_t n, int32_t width, const float *x, const int32_t *rows,
                                          int32_t n_rows, int64_t row_bytes, void *cache);
/* attention of one token's n_head query heads q (n_head, hd) over the n_runs runs (first row,
 * rows) of the k_rows key and v_rows value rows k and v (a row holds n_head_kv heads of
 * k_type / v_type: F32, F16, Q8_0, Q4_0), as ei_kernel_attn computes each head; out (n_head, hv) */
EI_EXPORT ei_status ei_vk_kernel_attn(void *ctx, int32_t n_head, int32_t n_head_kv, int32_t hd, int32_t hv, int32_t n_runs,
                                      const int32_t *runs, int32_t k_type, int32_t v_type, int64_t k_row_bytes,
                                      int64_t v_row_bytes, float scale, float softcap, const float *q, const void *k,
                                      int64_t k_rows, const void *v, int64_t v_rows, float *out);

#endif
