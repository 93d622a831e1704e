/* The KV cache as a pool of blocks: every sequence's cache is a table of blocks of EI_KV_BLOCK
 * positions (ei_kv_pool_params.block) drawn from one pool, so that sequences share the pool without each reserving
 * n_ctx, and share the blocks of a common prefix by reference count.
 *
 * Layers are grouped by their attention window: the full-attention layers form one group, the
 * sliding-window layers of each window another. A block of a group holds, for every layer of
 * the group, EI_KV_BLOCK key rows and then EI_KV_BLOCK value rows. A sliding-window group
 * releases a sequence's blocks once they lie EI_KV_SLACK positions behind the window of its
 * latest query, so its memory does not grow with the context (the slack lets a sequence
 * rewind that far and go on).
 *
 * A full block may carry a key, a hash of its tokens and everything before them (computed by
 * the caller, as vLLM's automatic prefix caching does). A keyed block that no sequence holds
 * stays in the pool as a cached prefix, least recently used first to go, until a block is
 * needed; a sequence starting with the same tokens takes the cached blocks instead of
 * computing them (ei_kv_pool_reuse). A block held by several sequences is copied before one
 * of them writes into it. Memory is allocated in slabs of EI_KV_SLAB blocks on first use, so
 * the pool costs what its sequences hold, up to its budget. */
#ifndef EI_KV_POOL_H
#define EI_KV_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "../include/edgeinfer.h"
#include "ei_kernels.h"

#define EI_KV_BLOCK 32      /* positions per block */
#define EI_KV_SLAB 16       /* blocks allocated together */
#define EI_KV_SLACK 32      /* positions a sliding-window group keeps behind the window */
#define EI_KV_MAX_GROUPS 4  /* distinct windows among the layers, full attention included */

typedef struct ei_kv_pool ei_kv_pool;

typedef struct {
    int32_t n_layer, n_seq_max, n_ctx, n_batch;
    const int32_t *windows; /* (n_layer) each layer's window, 0: full attention */
    size_t k_row_bytes, v_row_bytes; /* one position of one layer */
    size_t budget; /* bytes of blocks in all; 0: what n_seq_max sequences of n_ctx need */
    int32_t block; /* positions per block; 0: EI_KV_BLOCK */
    /* (n_layer) the bytes of each layer's keys (values) in one block, for layers whose blocks
     * are not rows of k_row_bytes (v_row_bytes) per position (KIVI's key groups); NULL: rows */
    const size_t *k_blocks, *v_blocks;
    const int8_t *k_grouped; /* (n_layer) or NULL: 1 where a block's keys are one group, which
                              * every run of the block starts at (ei_attn_run.t0 says where) */
    /* (n_layer) or NULL: 1 where a layer's rows live on a device (the Vulkan offload): they
     * count in the budget and the block numbers but take no host memory; a block copied for a
     * sequence to write into is logged for the device to copy too (ei_kv_pool_device_copies) */
    const int8_t *on_device;
} ei_kv_pool_params;

/* NULL with the reason recorded (ei_fail) when the budget holds too few blocks or memory runs
 * out */
ei_kv_pool *ei_kv_pool_create(const ei_kv_pool_params *p, ei_status *status);
void ei_kv_pool_free(ei_kv_pool *pool);
size_t ei_kv_pool_bytes(const ei_kv_pool *pool); /* slabs allocated and the tables */
size_t ei_kv_pool_budget_default(const ei_kv_pool_params *p);

/* the key (value) row of position pos of layer il in sequence s, whose block the sequence holds
 * (for a layer of k_blocks, the block's keys at its first position) */
uint8_t *ei_kv_pool_k(const ei_kv_pool *pool, int s, int il, int pos);
uint8_t *ei_kv_pool_v(const ei_kv_pool *pool, int s, int il, int pos);

/* makes the blocks of positions [p0, p1) of s writable in every group: taken from the pool
 * where absent, copied where shared, their keys dropped (their contents change) */
ei_status ei_kv_pool_write(ei_kv_pool *pool, int s, int p0, int p1);
/* the same for the group of layer il alone */
ei_status ei_kv_pool_write_layer(ei_kv_pool *pool, int s, int il, int p0, int p1);
/* positions of layer il a sequence holds at least behind its latest (n_ctx, or a window's
 * and the slack) */
int ei_kv_pool_layer_rows(const ei_kv_pool *pool, int il);
/* whether s holds the blocks of positions [p0, p1) of layer il */
int ei_kv_pool_holds(const ei_kv_pool *pool, int s, int il, int p0, int p1);
/* the lowest position whose rows sequence s holds for layer il (0 for full attention) */
int ei_kv_pool_oldest(const ei_kv_pool *pool, int s, int il);
/* releases the sliding-window blocks of s that no query from position pos on needs */
void ei_kv_pool_trim(ei_kv_pool *pool, int s, int pos);
/* after positions moved down (a discard), drops what sequence s holds below position pos in
 * the sliding-window groups: those rows are stale */
void ei_kv_pool_forget_below(ei_kv_pool *pool, int s, int pos);
/* releases the blocks of the group of layer il of s that lie wholly below position pos (rows
 * that are stale after positions moved down), raising the lowest position it holds */
void ei_kv_pool_release_below(ei_kv_pool *pool, int s, int il, int pos);
/* lets block `index` of the group of layer il of s go (its rows were read and are not wanted:
 * an eviction moving a window down frees each source block as soon as it is read) */
void ei_kv_pool_release_block(ei_kv_pool *pool, int s, int il, int index);
/* runs[] = the rows [t0, t1) of layer il of s, one per block; k_off, v_off select a head;
 * returns their number */
int ei_kv_pool_runs(const ei_kv_pool *pool, int s, int il, int t0, int t1, size_t k_off, size_t v_off,
                    ei_attn_run *runs);
int ei_kv_pool_max_runs(const ei_kv_pool *pool); /* the most one query can need */
/* layers on a device: the row of position pos of layer il of s counted in its group's blocks
 * (block * block size + pos % block size), and the (first row, rows) pairs of positions
 * [t0, t1) of layer il of s, one per block (returns their number) */
int64_t ei_kv_pool_row_index(const ei_kv_pool *pool, int s, int il, int pos);
int ei_kv_pool_row_runs(const ei_kv_pool *pool, int s, int il, int t0, int t1, uint32_t *pairs);
/* blocks in the group of layer il (the rows a device keeps for one of its layers: that times
 * the block size) */
int ei_kv_pool_group_blocks(const ei_kv_pool *pool, int il);
int ei_kv_pool_layer_group(const ei_kv_pool *pool, int il);
/* the block copies logged since the last call, as (group, source, destination) triples in
 * *out (the pool's own array); returns their number and empties the log */
int ei_kv_pool_device_copies(ei_kv_pool *pool, const int32_t **out);
int ei_kv_pool_block_size(const ei_kv_pool *pool);

void ei_kv_pool_clear(ei_kv_pool *pool, int s);
/* dst (emptied first) shares the blocks of src's first n positions */
void ei_kv_pool_fork(ei_kv_pool *pool, int src, int dst, int n);
/* the key block `index` of s has once full (0: none), given before the step that fills it; the
 * block takes it when s lets it go, or when published */
void ei_kv_pool_set_key(ei_kv_pool *pool, int s, int index, uint64_t key);
/* the blocks [0, n) of s that hold their rows take their keys now (after a successful step),
 * so that other sequences can share them while s still holds them */
void ei_kv_pool_publish(ei_kv_pool *pool, int s, int n);
/* s (emptied first) takes the cached blocks of keys[0..n) that every group has (a sliding-
 * window group: those of the window behind the end); returns the positions taken */
int ei_kv_pool_reuse(ei_kv_pool *pool, int s, int n, const uint64_t *keys);

/* out[0] groups, out[1] block lookups, out[2] hits, then per group: window, blocks, used,
 * cached, free, bytes per block (6 values); returns the values written (at most n) */
int ei_kv_pool_stats(const ei_kv_pool *pool, int64_t *out, int n);

#endif
