/* The block pool of the KV cache (kv_pool.h says what it is). Lookups scan the blocks: a pool
 * has thousands of them and is asked once per block of a prompt, so a scan costs microseconds
 * and needs no index to keep consistent. */
#include "kv_pool.h"

#include <stdlib.h>
#include <string.h>

#include "ei_internal.h"

typedef struct {
    int window;          /* 0: full attention */
    int n_layers;
    size_t block_bytes;  /* its layers' keys and values of one block, layer after layer (host) */
    size_t device_bytes; /* those of its layers on a device, which the host does not hold */
    int n_blocks;
    uint8_t **slabs;     /* (n_blocks / EI_KV_SLAB, rounded up), allocated on first use */
    int32_t *ref;        /* (n_blocks) sequences holding each block */
    uint64_t *key;       /* (n_blocks) a full block's key; 0: none */
    uint64_t *used;      /* (n_blocks) when it was last released or taken, for the LRU order */
    int32_t *table;      /* (n_seq_max, max_blocks) block of each index, -1: none */
    int32_t *lo;         /* (n_seq_max) the lowest index a sequence may hold (sliding windows) */
} kv_group;

struct ei_kv_pool {
    int n_layer, n_seq_max, n_ctx, max_blocks, n_groups;
    int block; /* positions per block */
    int *layer_group;              /* (n_layer) */
    size_t *k_bytes, *v_bytes;     /* (n_layer) one layer's keys (values) of one block */
    size_t *layer_off;             /* (n_layer) where a layer's keys start in its group's blocks */
    int8_t *k_grouped;             /* (n_layer) 1: a block's keys are one group (kv_pool.h) */
    int8_t *on_device;             /* (n_layer) 1: its rows live on a device (kv_pool.h) */
    int32_t *copies;               /* (3 * max_copies) blocks copied for device layers */
    int n_copies, max_copies;
    kv_group g[EI_KV_MAX_GROUPS];
    /* (n_seq_max, max_blocks) the key each full block of a sequence has, given by the caller
     * before the step that fills it: a block gets it when the sequence lets it go (a sliding
     * window moved past it, the sequence was cleared) or is published */
    uint64_t *seq_keys;
    uint64_t clock;
    int64_t lookups, hits; /* blocks asked for by ei_kv_pool_reuse, and found */
    size_t bytes;
};

static int32_t *slot_of(const ei_kv_pool *p, const kv_group *g, int s, int index) {
    return &g->table[(size_t)s * p->max_blocks + index];
}

static uint8_t *block_base(const kv_group *g, int b) {
    return g->slabs[b / EI_KV_SLAB] + (size_t)(b % EI_KV_SLAB) * g->block_bytes;
}

static int params_block(const ei_kv_pool_params *p) { return p->block > 0 ? p->block : EI_KV_BLOCK; }

/* blocks one sequence of a group needs at most: all of n_ctx, or a window's worth */
static int blocks_per_seq(const ei_kv_pool_params *p, int window, int max_blocks) {
    if (!window) return max_blocks;
    const int B = params_block(p);
    const int64_t live = (int64_t)window + EI_KV_SLACK + p->n_batch;
    const int64_t n = (live + B - 1) / B + 2;
    return n < max_blocks ? (int)n : max_blocks;
}

/* layer il's window as its group has it: 0 where it would never release a block */
static int layer_window(const ei_kv_pool_params *p, int il) {
    const int w = p->windows ? p->windows[il] : 0;
    return w < 0 || (int64_t)w + EI_KV_SLACK + p->n_batch >= p->n_ctx ? 0 : w;
}

/* the distinct windows of the layers, in order of first appearance */
static int group_windows(const ei_kv_pool_params *p, int windows[EI_KV_MAX_GROUPS], int *layer_group) {
    int n = 0;
    for (int il = 0; il < p->n_layer; il++) {
        const int w = layer_window(p, il);
        int g = 0;
        while (g < n && windows[g] != w) g++;
        if (g == n) {
            if (n == EI_KV_MAX_GROUPS) return -1;
            windows[n++] = w;
        }
        if (layer_group) layer_group[il] = g;
    }
    return n;
}

/* the bytes of layer il's keys and values in one block */
static size_t layer_k_bytes(const ei_kv_pool_params *p, int il) {
    return p->k_blocks ? p->k_blocks[il] : (size_t)params_block(p) * p->k_row_bytes;
}
static size_t layer_v_bytes(const ei_kv_pool_params *p, int il) {
    return p->v_blocks ? p->v_blocks[il] : (size_t)params_block(p) * p->v_row_bytes;
}

size_t ei_kv_pool_budget_default(const ei_kv_pool_params *p) {
    int windows[EI_KV_MAX_GROUPS];
    const int n = group_windows(p, windows, NULL), B = params_block(p);
    const int max_blocks = (p->n_ctx + B - 1) / B;
    size_t total = 0;
    for (int gi = 0; gi < n; gi++) {
        size_t block = 0;
        for (int il = 0; il < p->n_layer; il++)
            if (layer_window(p, il) == windows[gi]) block += layer_k_bytes(p, il) + layer_v_bytes(p, il);
        total += (size_t)p->n_seq_max * (size_t)blocks_per_seq(p, windows[gi], max_blocks) * block;
    }
    return total;
}

/* the layers' places in their groups' blocks */
static void place_layers(ei_kv_pool *pool, const ei_kv_pool_params *p) {
    for (int il = 0; il < p->n_layer; il++) {
        kv_group *g = &pool->g[pool->layer_group[il]];
        pool->k_bytes[il] = layer_k_bytes(p, il);
        pool->v_bytes[il] = layer_v_bytes(p, il);
        pool->k_grouped[il] = p->k_grouped ? p->k_grouped[il] : 0;
        pool->on_device[il] = p->on_device ? p->on_device[il] : 0;
        g->n_layers++;
        if (pool->on_device[il]) {
            g->device_bytes += pool->k_bytes[il] + pool->v_bytes[il];
            continue;
        }
        pool->layer_off[il] = g->block_bytes;
        g->block_bytes += pool->k_bytes[il] + pool->v_bytes[il];
    }
}

/* the tables of group gi, its share of the budget in blocks; EI_OK or the failure */
static ei_status create_group(ei_kv_pool *pool, const ei_kv_pool_params *p, int gi, int window, size_t budget,
                              size_t wanted) {
    kv_group *g = &pool->g[gi];
    g->window = window;
    /* the budget shared in proportion to what n_seq_max sequences of n_ctx need */
    const double need = (double)p->n_seq_max * blocks_per_seq(p, g->window, pool->max_blocks);
    const double blocks = need * ((double)budget / (double)wanted);
    if (blocks > (double)INT32_MAX)
        return ei_fail(EI_ERR_NOMEM, "out of memory: a KV budget of %zu bytes wants %.0f blocks", budget, blocks);
    g->n_blocks = (int)blocks;
    if (g->n_blocks < 1)
        return ei_fail(EI_ERR_INVALID, "a KV budget of %zu bytes holds no block of %zu bytes", budget,
                       g->block_bytes + g->device_bytes);
    const size_t nb = (size_t)g->n_blocks, n_slabs = (nb + EI_KV_SLAB - 1) / EI_KV_SLAB;
    const size_t table = (size_t)p->n_seq_max * (size_t)pool->max_blocks;
    g->slabs = calloc(n_slabs, sizeof(uint8_t *));
    g->ref = calloc(nb, sizeof(int32_t));
    g->key = calloc(nb, sizeof(uint64_t));
    g->used = calloc(nb, sizeof(uint64_t));
    g->table = malloc(sizeof(int32_t) * table);
    g->lo = calloc((size_t)p->n_seq_max, sizeof(int32_t));
    if (!g->slabs || !g->ref || !g->key || !g->used || !g->table || !g->lo)
        return ei_fail(EI_ERR_NOMEM, "out of memory: %zu bytes wanted for the KV block pool's tables",
                       n_slabs * sizeof(uint8_t *) + nb * 20 + sizeof(int32_t) * table);
    memset(g->table, 0xff, sizeof(int32_t) * table);
    pool->bytes += n_slabs * sizeof(uint8_t *) + nb * 20 + sizeof(int32_t) * (size_t)p->n_seq_max * (pool->max_blocks + 1);
    return EI_OK;
}

ei_kv_pool *ei_kv_pool_create(const ei_kv_pool_params *p, ei_status *status) {
    int windows[EI_KV_MAX_GROUPS];
    *status = EI_OK;
    if (group_windows(p, windows, NULL) < 0) {
        *status = ei_fail(EI_ERR_UNSUPPORTED, "more than %d distinct attention windows", EI_KV_MAX_GROUPS);
        return NULL;
    }
    ei_kv_pool *pool = calloc(1, sizeof(*pool));
    if (!pool) goto nomem;
    pool->n_layer = p->n_layer;
    pool->n_seq_max = p->n_seq_max;
    pool->n_ctx = p->n_ctx;
    pool->block = params_block(p);
    pool->max_blocks = (p->n_ctx + pool->block - 1) / pool->block;
    pool->layer_group = calloc((size_t)p->n_layer, sizeof(int));
    pool->k_bytes = calloc((size_t)p->n_layer, sizeof(size_t));
    pool->v_bytes = calloc((size_t)p->n_layer, sizeof(size_t));
    pool->layer_off = calloc((size_t)p->n_layer, sizeof(size_t));
    pool->k_grouped = calloc((size_t)p->n_layer, 1);
    pool->on_device = calloc((size_t)p->n_layer, 1);
    pool->max_copies = EI_KV_MAX_GROUPS * (p->n_batch + 1);
    pool->copies = calloc((size_t)pool->max_copies * 3, sizeof(int32_t));
    pool->seq_keys = calloc((size_t)p->n_seq_max * (size_t)pool->max_blocks, sizeof(uint64_t));
    if (!pool->layer_group || !pool->k_bytes || !pool->v_bytes || !pool->layer_off || !pool->k_grouped ||
        !pool->seq_keys || !pool->on_device || !pool->copies)
        goto nomem;
    pool->n_groups = group_windows(p, windows, pool->layer_group);
    place_layers(pool, p);
    const size_t wanted = ei_kv_pool_budget_default(p), budget = p->budget ? p->budget : wanted;
    for (int gi = 0; gi < pool->n_groups; gi++) {
        const ei_status st = create_group(pool, p, gi, windows[gi], budget, wanted);
        if (st != EI_OK) {
            ei_kv_pool_free(pool);
            *status = st;
            return NULL;
        }
    }
    return pool;
nomem:
    ei_kv_pool_free(pool);
    *status = ei_fail(EI_ERR_NOMEM, "out of memory: the KV block pool's tables");
    return NULL;
}

void ei_kv_pool_free(ei_kv_pool *pool) {
    if (!pool) return;
    for (int gi = 0; gi < pool->n_groups; gi++) {
        kv_group *g = &pool->g[gi];
        if (g->slabs)
            for (int i = 0; i < (g->n_blocks + EI_KV_SLAB - 1) / EI_KV_SLAB; i++) free(g->slabs[i]);
        free(g->slabs); free(g->ref); free(g->key); free(g->used); free(g->table); free(g->lo);
    }
    free(pool->layer_group); free(pool->k_bytes); free(pool->v_bytes); free(pool->layer_off); free(pool->k_grouped);
    free(pool->on_device); free(pool->copies);
    free(pool->seq_keys);
    free(pool);
}

size_t ei_kv_pool_bytes(const ei_kv_pool *pool) { return pool ? pool->bytes : 0; }

/* the bytes of slab i: EI_KV_SLAB blocks, fewer for the last one */
static size_t slab_bytes(const kv_group *g, int i) {
    const int n = g->n_blocks - i * EI_KV_SLAB;
    return (size_t)(n < EI_KV_SLAB ? n : EI_KV_SLAB) * g->block_bytes;
}

/* a block for a new owner: a free one, else the least recently used cached one (its key goes);
 * -1 when every block is held, -2 when its slab cannot be allocated */
static int take_block(ei_kv_pool *pool, kv_group *g) {
    int best = -1;
    for (int b = 0; b < g->n_blocks; b++) {
        if (g->ref[b]) continue;
        if (!g->key[b]) { best = b; break; }
        if (best < 0 || g->used[b] < g->used[best]) best = b;
    }
    if (best < 0) return -1;
    uint8_t **slab = &g->slabs[best / EI_KV_SLAB];
    if (!*slab) {
        const size_t bytes = slab_bytes(g, best / EI_KV_SLAB);
        if (!(*slab = calloc(1, bytes ? bytes : 1))) return -2; /* (0: every layer on a device) */
        pool->bytes += bytes;
    }
    g->key[best] = 0;
    g->ref[best] = 1;
    g->used[best] = ++pool->clock;
    return best;
}

static void drop_block(ei_kv_pool *pool, kv_group *g, int32_t *slot) {
    if (*slot < 0) return;
    g->ref[*slot]--;
    g->used[*slot] = ++pool->clock;
    *slot = -1;
}

static uint64_t *seq_key(const ei_kv_pool *pool, int s, int index) {
    return &pool->seq_keys[(size_t)s * pool->max_blocks + index];
}

/* a sequence lets block `index` go: it keeps the key the sequence gave it (its rows are
 * complete and final then) */
static void release(ei_kv_pool *pool, kv_group *g, int s, int index) {
    int32_t *slot = slot_of(pool, g, s, index);
    if (*slot >= 0 && *seq_key(pool, s, index)) g->key[*slot] = *seq_key(pool, s, index);
    drop_block(pool, g, slot);
}

static ei_status pool_full(const kv_group *g) {
    return ei_fail(EI_ERR_NOMEM, "the KV cache pool is full: all %d blocks of %zu bytes are held (raise kv_budget)",
                   g->n_blocks, g->block_bytes);
}

/* ei_kv_pool_write for one group */
static ei_status write_group(ei_kv_pool *pool, kv_group *g, int s, int p0, int p1) {
    /* a window's blocks are held from lo on: one that holds none starts where it writes */
    if (g->window && *slot_of(pool, g, s, g->lo[s]) < 0) g->lo[s] = p0 / pool->block;
    for (int i = p0 / pool->block; i <= (p1 - 1) / pool->block; i++) {
        int32_t *slot = slot_of(pool, g, s, i);
        if (*slot >= 0 && g->ref[*slot] == 1) {
            g->key[*slot] = 0; /* its rows are about to change */
            continue;
        }
        const int b = take_block(pool, g);
        if (b == -1) return pool_full(g);
        if (b == -2) return ei_fail(EI_ERR_NOMEM, "out of memory: %zu bytes wanted for KV cache blocks",
                                    slab_bytes(g, 0));
        if (*slot >= 0) { /* shared: this sequence writes into its own copy */
            memcpy(block_base(g, b), block_base(g, *slot), g->block_bytes);
            if (g->device_bytes) {
                if (pool->n_copies == pool->max_copies) return ei_fail(EI_ERR_NOMEM, "the KV pool's device copy log is full");
                int32_t *c = &pool->copies[3 * pool->n_copies++];
                c[0] = (int32_t)(g - pool->g), c[1] = *slot, c[2] = b;
            }
            drop_block(pool, g, slot);
        }
        *slot = b;
        if (i < g->lo[s]) g->lo[s] = i; /* callers write below lo only up to held rows */
    }
    return EI_OK;
}

ei_status ei_kv_pool_write(ei_kv_pool *pool, int s, int p0, int p1) {
    for (int gi = 0; gi < pool->n_groups && p1 > p0; gi++) {
        const ei_status st = write_group(pool, &pool->g[gi], s, p0, p1);
        if (st != EI_OK) return st;
    }
    return EI_OK;
}

ei_status ei_kv_pool_write_layer(ei_kv_pool *pool, int s, int il, int p0, int p1) {
    return p1 > p0 ? write_group(pool, &pool->g[pool->layer_group[il]], s, p0, p1) : EI_OK;
}

static uint8_t *row(const ei_kv_pool *pool, int s, int il, int pos, int value) {
    const kv_group *g = &pool->g[pool->layer_group[il]];
    const int B = pool->block, b = *slot_of(pool, g, s, pos / B);
    uint8_t *base = block_base(g, b) + pool->layer_off[il];
    const size_t r = (size_t)(pos % B);
    return value ? base + pool->k_bytes[il] + r * (pool->v_bytes[il] / B) : base + r * (pool->k_bytes[il] / B);
}

uint8_t *ei_kv_pool_k(const ei_kv_pool *pool, int s, int il, int pos) { return row(pool, s, il, pos, 0); }
uint8_t *ei_kv_pool_v(const ei_kv_pool *pool, int s, int il, int pos) { return row(pool, s, il, pos, 1); }

int ei_kv_pool_layer_rows(const ei_kv_pool *pool, int il) {
    const int w = pool->g[pool->layer_group[il]].window;
    return w ? w + EI_KV_SLACK : pool->n_ctx;
}

int ei_kv_pool_holds(const ei_kv_pool *pool, int s, int il, int p0, int p1) {
    const kv_group *g = &pool->g[pool->layer_group[il]];
    for (int i = p0 / pool->block; p1 > p0 && i <= (p1 - 1) / pool->block; i++)
        if (*slot_of(pool, g, s, i) < 0) return 0;
    return 1;
}

int ei_kv_pool_oldest(const ei_kv_pool *pool, int s, int il) {
    return pool->g[pool->layer_group[il]].lo[s] * pool->block;
}

/* releases blocks [lo, below) of s in group g */
static void release_below(ei_kv_pool *pool, kv_group *g, int s, int below) {
    for (int i = g->lo[s]; i < below && i < pool->max_blocks; i++) release(pool, g, s, i);
    if (below > g->lo[s]) g->lo[s] = below;
}

void ei_kv_pool_trim(ei_kv_pool *pool, int s, int pos) {
    for (int gi = 0; gi < pool->n_groups; gi++) {
        kv_group *g = &pool->g[gi];
        if (!g->window) continue;
        const int keep = pos - g->window - EI_KV_SLACK; /* the first position still wanted */
        if (keep > 0) release_below(pool, g, s, keep / pool->block);
    }
}

void ei_kv_pool_release_below(ei_kv_pool *pool, int s, int il, int pos) {
    kv_group *g = &pool->g[pool->layer_group[il]];
    if (g->window && pos > 0) release_below(pool, g, s, pos / pool->block);
}

void ei_kv_pool_release_block(ei_kv_pool *pool, int s, int il, int index) {
    kv_group *g = &pool->g[pool->layer_group[il]];
    if (index >= 0 && index < pool->max_blocks) release(pool, g, s, index);
}

void ei_kv_pool_forget_below(ei_kv_pool *pool, int s, int pos) {
    for (int gi = 0; gi < pool->n_groups; gi++) {
        kv_group *g = &pool->g[gi];
        if (g->window && pos > 0) release_below(pool, g, s, pos / pool->block);
    }
}

int ei_kv_pool_runs(const ei_kv_pool *pool, int s, int il, int t0, int t1, size_t k_off, size_t v_off,
                    ei_attn_run *runs) {
    const kv_group *g = &pool->g[pool->layer_group[il]];
    const int B = pool->block;
    const size_t k_row = pool->k_grouped[il] ? 0 : pool->k_bytes[il] / B, v_row = pool->v_bytes[il] / B;
    int n = 0;
    for (int t = t0; t < t1;) {
        const int i = t / B, r = t % B;
        const int m = t1 - t < B - r ? t1 - t : B - r;
        const uint8_t *base = block_base(g, *slot_of(pool, g, s, i)) + pool->layer_off[il];
        runs[n++] = (ei_attn_run){base + (size_t)r * k_row + k_off, base + pool->k_bytes[il] + (size_t)r * v_row + v_off,
                                  m, r};
        t += m;
    }
    return n;
}

int ei_kv_pool_max_runs(const ei_kv_pool *pool) { return pool->max_blocks + 1; }

int64_t ei_kv_pool_row_index(const ei_kv_pool *pool, int s, int il, int pos) {
    const kv_group *g = &pool->g[pool->layer_group[il]];
    return (int64_t)*slot_of(pool, g, s, pos / pool->block) * pool->block + pos % pool->block;
}

int ei_kv_pool_row_runs(const ei_kv_pool *pool, int s, int il, int t0, int t1, uint32_t *pairs) {
    const kv_group *g = &pool->g[pool->layer_group[il]];
    const int B = pool->block;
    int n = 0;
    for (int t = t0; t < t1;) {
        const int i = t / B, end = (i + 1) * B < t1 ? (i + 1) * B : t1;
        pairs[2 * n] = (uint32_t)(*slot_of(pool, g, s, i) * B + t % B);
        pairs[2 * n + 1] = (uint32_t)(end - t);
        n++;
        t = end;
    }
    return n;
}

int ei_kv_pool_group_blocks(const ei_kv_pool *pool, int il) { return pool->g[pool->layer_group[il]].n_blocks; }
int ei_kv_pool_layer_group(const ei_kv_pool *pool, int il) { return pool->layer_group[il]; }

int ei_kv_pool_device_copies(ei_kv_pool *pool, const int32_t **out) {
    const int n = pool->n_copies;
    *out = pool->copies;
    pool->n_copies = 0;
    return n;
}
int ei_kv_pool_block_size(const ei_kv_pool *pool) { return pool->block; }

/* gives back the memory of the slabs of g whose blocks are neither held nor cached */
static void free_idle_slabs(ei_kv_pool *pool, kv_group *g) {
    for (int i = 0; i * EI_KV_SLAB < g->n_blocks; i++) {
        if (!g->slabs[i]) continue;
        int idle = 1;
        for (int b = i * EI_KV_SLAB; b < (i + 1) * EI_KV_SLAB && b < g->n_blocks && idle; b++)
            idle = !g->ref[b] && !g->key[b];
        if (!idle) continue;
        free(g->slabs[i]);
        g->slabs[i] = NULL;
        pool->bytes -= slab_bytes(g, i);
    }
}

void ei_kv_pool_clear(ei_kv_pool *pool, int s) {
    for (int gi = 0; gi < pool->n_groups; gi++) {
        kv_group *g = &pool->g[gi];
        for (int i = 0; i < pool->max_blocks; i++) release(pool, g, s, i);
        g->lo[s] = 0;
        free_idle_slabs(pool, g);
    }
    memset(seq_key(pool, s, 0), 0, sizeof(uint64_t) * (size_t)pool->max_blocks);
}

void ei_kv_pool_fork(ei_kv_pool *pool, int src, int dst, int n) {
    ei_kv_pool_clear(pool, dst);
    const int blocks = (n + pool->block - 1) / pool->block;
    for (int gi = 0; gi < pool->n_groups; gi++) {
        kv_group *g = &pool->g[gi];
        for (int i = g->lo[src]; i < blocks; i++) {
            const int32_t b = *slot_of(pool, g, src, i);
            if (b < 0) continue;
            g->ref[b]++;
            *slot_of(pool, g, dst, i) = b;
        }
        g->lo[dst] = g->lo[src];
    }
    for (int i = 0; i < n / pool->block; i++) *seq_key(pool, dst, i) = *seq_key(pool, src, i);
}

void ei_kv_pool_set_key(ei_kv_pool *pool, int s, int index, uint64_t key) {
    if (index >= 0 && index < pool->max_blocks) *seq_key(pool, s, index) = key;
}

void ei_kv_pool_publish(ei_kv_pool *pool, int s, int n) {
    for (int i = 0; i < n && i < pool->max_blocks; i++) {
        const uint64_t key = *seq_key(pool, s, i);
        if (!key) continue;
        for (int gi = 0; gi < pool->n_groups; gi++) {
            kv_group *g = &pool->g[gi];
            const int32_t b = *slot_of(pool, g, s, i);
            if (b >= 0) g->key[b] = key;
        }
    }
}

static int find_key(const kv_group *g, uint64_t key) {
    for (int b = 0; b < g->n_blocks; b++)
        if (g->key[b] == key) return b;
    return -1;
}

/* the first index a sequence at position end needs in group g */
static int first_needed(const ei_kv_pool *pool, const kv_group *g, int end) {
    if (!g->window) return 0;
    const int t = end - g->window + 1;
    return t > 0 ? t / pool->block : 0;
}

/* how many leading blocks of keys[0..m) group g can give a sequence that goes on after them:
 * all of them for full attention; for a window, those behind the end */
static int reusable(const ei_kv_pool *pool, const kv_group *g, const uint64_t *keys, int m) {
    if (!g->window) {
        int i = 0;
        while (i < m && find_key(g, keys[i]) >= 0) i++;
        return i;
    }
    for (int end = m; end > 0; end--) {
        int i = first_needed(pool, g, end * pool->block);
        while (i < end && find_key(g, keys[i]) >= 0) i++;
        if (i == end) return end;
    }
    return 0;
}

int ei_kv_pool_reuse(ei_kv_pool *pool, int s, int n, const uint64_t *keys) {
    ei_kv_pool_clear(pool, s);
    int m = n < pool->max_blocks ? n : pool->max_blocks;
    pool->lookups += m;
    for (int gi = 0; gi < pool->n_groups && m > 0; gi++) {
        const int r = reusable(pool, &pool->g[gi], keys, m);
        if (r < m) m = r;
    }
    for (int gi = 0; gi < pool->n_groups; gi++) {
        kv_group *g = &pool->g[gi];
        const int lo = first_needed(pool, g, m * pool->block);
        for (int i = lo; i < m; i++) {
            const int b = find_key(g, keys[i]);
            g->ref[b]++;
            g->used[b] = ++pool->clock;
            *slot_of(pool, g, s, i) = b;
        }
        g->lo[s] = lo;
    }
    for (int i = 0; i < m; i++) *seq_key(pool, s, i) = keys[i];
    pool->hits += m;
    return m * pool->block;
}

int ei_kv_pool_stats(const ei_kv_pool *pool, int64_t *out, int n) {
    int k = 0;
#define PUT(x) do { if (k < n) out[k] = (int64_t)(x); k++; } while (0)
    PUT(pool->n_groups);
    PUT(pool->lookups);
    PUT(pool->hits);
    for (int gi = 0; gi < pool->n_groups; gi++) {
        const kv_group *g = &pool->g[gi];
        int used = 0, cached = 0;
        for (int b = 0; b < g->n_blocks; b++) {
            used += g->ref[b] > 0;
            cached += !g->ref[b] && g->key[b];
        }
        PUT(g->window);
        PUT(g->n_blocks);
        PUT(used);
        PUT(cached);
        PUT(g->n_blocks - used - cached);
        PUT(g->block_bytes);
    }
#undef PUT
    return k < n ? k : n;
}
