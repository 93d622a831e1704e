/* Keys kept as first rotated, for caches whose keys are block-quantized (q8_0, q4_0).
 *
 * A context policy that drops positions moves every later key down. Rotating a quantized key
 * back and encoding it again adds a rounding at every move (README: "RoPE after an
 * eviction"), so these keys move as they are: the cache records, per position, how many
 * positions ahead of its own its key was rotated (its shift d, 0 for a key written where it
 * is). A query meets a run of keys of shift d rotated d positions further itself: RoPE's
 * scores depend only on the difference of the two rotations, so the run scores as keys
 * rotated at their own positions would, each key encoded once. Both engines do the same
 * (edgeinfer/engines/reference.py).
 *
 * The shifts of a sequence are an array over its positions; its distinct nonzero shifts,
 * with their (cos, sin) pairs for every rope base, are a table made again whenever shifts
 * other than 0 enter (a drop, a fork, a restored state). Writes only enter 0s, so a stale
 * table entry is harmless. */
#ifndef EI_KEY_SHIFTS_H
#define EI_KEY_SHIFTS_H

#include <stddef.h>
#include <stdint.h>

#include "ei_internal.h"

typedef struct {
    int n_seq, n_ctx, n_bases, n_rot;
    int32_t *shift;   /* (n_seq, n_ctx) each position's shift; NULL: keys are not kept so */
    uint8_t *any;     /* (n_seq) whether the sequence may hold a shift other than 0 */
    int *n_values;    /* (n_seq) distinct nonzero shifts of its table */
    int32_t **values; /* (n_seq) -> (n_values) those shifts, ascending */
    float **cs;       /* (n_seq) -> (n_values, n_bases, n_rot) their (cos, sin) pairs */
    size_t table_bytes;
} ei_key_shifts;

/* (cos, sin) pairs of rope base `base` at position pos, as the engine rotates (rope_row) */
typedef void (*ei_rope_row_fn)(const void *ctx, int base, int pos, float *cs);

ei_status ei_key_shifts_init(ei_key_shifts *ks, int n_seq, int n_ctx, int n_bases, int n_rot);
void ei_key_shifts_free(ei_key_shifts *ks);
size_t ei_key_shifts_bytes(const ei_key_shifts *ks);

/* sequence s holds no shifted key (cleared, or its prefix taken from cached blocks) */
void ei_key_shifts_reset(ei_key_shifts *ks, int s);
/* positions [0, n) of dst take src's shifts (a fork), the rest 0 */
ei_status ei_key_shifts_fork(ei_key_shifts *ks, int src, int dst, int n, ei_rope_row_fn rope, const void *ctx);
/* the runs (start, count) dropped from n_past positions of s: every kept position's shift
 * grows by the positions dropped below it, as its key moves down by as many unchanged */
ei_status ei_key_shifts_drop(ei_key_shifts *ks, int s, int n_runs, const int32_t *runs, int n_past,
                             ei_rope_row_fn rope, const void *ctx);
/* positions [0, n) of s take shifts[0..n) (a saved state; the caller checked them), the rest 0 */
ei_status ei_key_shifts_set(ei_key_shifts *ks, int s, int n, const int32_t *shifts, ei_rope_row_fn rope,
                            const void *ctx);

/* out = the runs `in` (rows of positions p0 on, in order, consecutive) split where the shift
 * changes, each run's cs the (cos, sin) pairs of its shift at rope base `base` (NULL for 0);
 * returns their number (at most n_in + the positions) */
int ei_key_shifts_split(const ei_key_shifts *ks, int s, int base, int p0, const ei_attn_run *in, int n_in,
                        size_t k_row_bytes, size_t v_row_bytes, ei_attn_run *out);

#endif
