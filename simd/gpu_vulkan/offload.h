/* Layer offload (offload.c): the engine's last layers and its output on a Vulkan device. The
 * engine (simd/common/engine.c) runs the first layers on the CPU, hands the residual stream of
 * the step over once, and takes the logits back. The device keeps the weights of its layers
 * and of the output, and the KV rows of its layers, in the blocks the engine's pool gives
 * (kv_pool.h: on_device), so that sequences, forks and cached prefixes work as on the CPU. */
#ifndef EI_VK_OFFLOAD_H
#define EI_VK_OFFLOAD_H

#include <stdint.h>

#include "../common/ei_internal.h"

typedef struct ei_vk_offload ei_vk_offload;

typedef struct {
    const ei_model_desc *m;
    int32_t first_layer;    /* layers [first_layer, n_layer) run on the device, and the output */
    int32_t device;         /* the Vulkan device index; -1: the best */
    int32_t n_batch, n_ctx;
    int32_t kv_type_k, kv_type_v;
    int64_t k_row_bytes, v_row_bytes;
    const int32_t *layer_group; /* (n_layer) each layer's group of cache blocks */
    const int32_t *layer_runs;  /* (n_layer) each device layer's set of runs: one per (group, window) */
    const int32_t *group_rows;  /* (groups) rows a device layer of the group keeps (blocks x block size) */
    int32_t max_runs;           /* (first row, rows) pairs a query needs at most */
    const int32_t *layer_base;  /* (n_layer) each layer's rope table */
    int32_t n_bases;
    const ei_f16 *gelu;         /* (65536) the GELU table */
    /* q8_0 / q4_0 keys are kept as first rotated when positions are dropped (key_shifts.h):
     * each device group's rows then carry their shift (ei_vk_offload_set_shifts), and a query
     * meets keys of shift d rotated by shift_angles' pairs of position d at its layer's base
     * ((n_bases, n_ctx, n_rot), as the engine's rope_row makes them; needed by load only) */
    int32_t key_shifts;
    const float *shift_angles;
    /* attention tracking (the H2O policy): each step adds the probability every key of its
     * device layers received to counters of (n_seq, n_ctx) positions (ei_vk_offload_take_track) */
    int32_t track, n_seq;
} ei_vk_offload_params;

/* what one step gives the device: the tokens' residual stream after the CPU's layers, the rope
 * tables, for each group of cache blocks the row each token writes and the runs it reads, the
 * block copies the pool made, and where the logits of the output rows go */
typedef struct {
    int32_t n;
    const float *x;             /* (n, n_embd) */
    const float *rope;          /* (n_bases, n_batch, n_rot) */
    const uint32_t *rows[4];    /* per group: (n) */
    const uint32_t *runs[4];    /* per set of runs: (n, 1 + 2 * max_runs) */
    const uint32_t *track[4];   /* with track, per set of runs: (n, 2) the counter of the token's
                                 * first key (seq * n_ctx + its position) and its keys */
    int32_t n_copies;
    const int32_t *copies;      /* (n_copies, 3): group, source block, destination block */
    int32_t block;              /* positions per block */
    int32_t shifted;            /* whether a token's keys may have shifts other than 0 */
    int32_t n_out;
    const int32_t *out_rows;    /* (n_out) */
    float *logits;              /* (n_out, n_vocab) */
} ei_vk_offload_step;

/* The offload is made in steps, so that the engine can fit it to the device's memory before
 * anything is allocated: open picks the device and makes its context; budget says how much of
 * its memory is free (EDGEINFER_VULKAN_BUDGET, else VK_EXT_memory_budget's budget less usage,
 * else the device-local heaps' size: edgeinfer.h's EI_GPU_BUDGET_*); measure runs the uploads
 * and allocations as load would, without memory (a dry run: each buffer's size as the device's
 * memory requirements give it), into parts (weights, KV cache, buffers) and per layer
 * (layer_bytes: (n_layer), weights and cache of each device layer; NULL: not wanted); load
 * makes them. */
ei_status ei_vk_offload_open(int32_t device, ei_vk_offload **out);
ei_status ei_vk_offload_budget(const ei_vk_offload *o, uint64_t *free_bytes, int32_t *source);
ei_status ei_vk_offload_measure(ei_vk_offload *o, const ei_vk_offload_params *p, uint64_t parts[3], uint64_t *layer_bytes);
ei_status ei_vk_offload_load(ei_vk_offload *o, const ei_vk_offload_params *p);
const ei_vk_device *ei_vk_offload_device(const ei_vk_offload *o, int32_t *index);
uint64_t ei_vk_offload_held(const ei_vk_offload *o); /* device memory its buffers hold */
/* an eviction's work on the device layers (engine.c), each run at once, in the order the
 * engine makes it: the blocks the pool copied (its device copy log: (n, 3) group, source,
 * destination), then layer il's row moves ((n, 3) source row, destination row, angles index
 * or -1), the keys (f16 or f32) rotated by angles ((n_angles, n_rot) cos, sin pairs); q8_0 /
 * q4_0 keys move as they are (key_shifts) */
#define EI_VK_MAX_ANGLES 1024 /* the angles one ei_vk_offload_move_rows call may take */
ei_status ei_vk_offload_copy_blocks(ei_vk_offload *o, int n, const int32_t *copies, int block);
ei_status ei_vk_offload_move_rows(ei_vk_offload *o, int il, int n, const int32_t *moves, int n_angles, const float *angles);
/* with key_shifts: rows[i] of the group of layer il carries the shift shifts[i] (a step's new
 * rows take 0, and a block the pool copies takes its source's, by themselves) */
ei_status ei_vk_offload_set_shifts(ei_vk_offload *o, int il, int n, const int64_t *rows, const int32_t *shifts);
/* rows of layer il's cache in its own encoding (saved sessions): entry i is row rows[i] (the
 * pool's row index), copied out to k (n, k_row_bytes) and v (n, v_row_bytes), or with write
 * != 0 from them into the cache; either buffer may be NULL */
ei_status ei_vk_offload_rows(ei_vk_offload *o, int il, int n, const int64_t *rows, void *k, void *v, int write);
/* with track, after step s ran: adds the counters its tokens reached to scores ((n_seq,
 * n_ctx) positions, laid out as the counters; in units of 2^-32) and zeroes them */
ei_status ei_vk_offload_take_track(ei_vk_offload *o, const ei_vk_offload_step *s, int64_t *scores);
void ei_vk_offload_free(ei_vk_offload *o);
ei_status ei_vk_offload_run(ei_vk_offload *o, const ei_vk_offload_step *s);

#endif
