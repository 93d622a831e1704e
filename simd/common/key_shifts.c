/* Keys kept as first rotated (key_shifts.h). */
#include "key_shifts.h"

#include <stdlib.h>
#include <string.h>

ei_status ei_key_shifts_init(ei_key_shifts *ks, int n_seq, int n_ctx, int n_bases, int n_rot) {
    memset(ks, 0, sizeof(*ks));
    ks->n_seq = n_seq;
    ks->n_ctx = n_ctx;
    ks->n_bases = n_bases;
    ks->n_rot = n_rot;
    ks->shift = calloc((size_t)n_seq * (size_t)n_ctx, sizeof(int32_t));
    ks->any = calloc((size_t)n_seq, 1);
    ks->n_values = calloc((size_t)n_seq, sizeof(int));
    ks->values = calloc((size_t)n_seq, sizeof(int32_t *));
    ks->cs = calloc((size_t)n_seq, sizeof(float *));
    if (ks->shift && ks->any && ks->n_values && ks->values && ks->cs) return EI_OK;
    ei_key_shifts_free(ks);
    return ei_fail(EI_ERR_NOMEM, "out of memory for the key shifts of %d sequences of %d positions", n_seq, n_ctx);
}

void ei_key_shifts_free(ei_key_shifts *ks) {
    for (int s = 0; ks->values && s < ks->n_seq; s++) free(ks->values[s]);
    for (int s = 0; ks->cs && s < ks->n_seq; s++) free(ks->cs[s]);
    free(ks->shift); free(ks->any); free(ks->n_values); free(ks->values); free(ks->cs);
    memset(ks, 0, sizeof(*ks));
}

size_t ei_key_shifts_bytes(const ei_key_shifts *ks) {
    return ks->shift ? (size_t)ks->n_seq * ((size_t)ks->n_ctx * 4 + 1) + ks->table_bytes : 0;
}

static size_t table_entry_floats(const ei_key_shifts *ks) { return (size_t)ks->n_bases * (size_t)ks->n_rot; }

static int ascending(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* the table of s made again from `shift` (n_ctx values): on failure s keeps its old table */
static ei_status make_table(ei_key_shifts *ks, int s, const int32_t *shift, ei_rope_row_fn rope, const void *ctx) {
    int n = 0;
    int32_t *values = malloc(sizeof(int32_t) * (size_t)ks->n_ctx);
    if (!values) return ei_fail(EI_ERR_NOMEM, "out of memory for the key shifts of sequence %d", s);
    for (int p = 0; p < ks->n_ctx; p++)
        if (shift[p]) values[n++] = shift[p];
    qsort(values, (size_t)n, sizeof(int32_t), ascending);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (!m || values[m - 1] != values[i]) values[m++] = values[i];
    const size_t per = table_entry_floats(ks);
    float *cs = m ? malloc(sizeof(float) * per * (size_t)m) : NULL;
    if (m && !cs) {
        free(values);
        return ei_fail(EI_ERR_NOMEM, "out of memory for the rotations of %d key shifts", m);
    }
    for (int i = 0; i < m; i++)
        for (int b = 0; b < ks->n_bases; b++) rope(ctx, b, values[i], cs + per * (size_t)i + (size_t)b * ks->n_rot);
    ks->table_bytes -= (size_t)ks->n_values[s] * (sizeof(int32_t) + per * sizeof(float));
    ks->table_bytes += (size_t)m * (sizeof(int32_t) + per * sizeof(float));
    free(ks->values[s]);
    free(ks->cs[s]);
    ks->values[s] = values;
    ks->cs[s] = cs;
    ks->n_values[s] = m;
    ks->any[s] = m > 0;
    return EI_OK;
}

/* s takes the shifts `next` (n_ctx, freed here) once their table is made; on failure it keeps
 * its shifts and table */
static ei_status commit(ei_key_shifts *ks, int s, int32_t *next, ei_rope_row_fn rope, const void *ctx) {
    const ei_status st = make_table(ks, s, next, rope, ctx);
    if (st == EI_OK) memcpy(ks->shift + (size_t)s * ks->n_ctx, next, sizeof(int32_t) * (size_t)ks->n_ctx);
    free(next);
    return st;
}

void ei_key_shifts_reset(ei_key_shifts *ks, int s) {
    if (!ks->shift || !ks->any[s]) return;
    memset(ks->shift + (size_t)s * ks->n_ctx, 0, sizeof(int32_t) * (size_t)ks->n_ctx);
    ks->any[s] = 0;
}

ei_status ei_key_shifts_fork(ei_key_shifts *ks, int src, int dst, int n, ei_rope_row_fn rope, const void *ctx) {
    if (!ks->shift) return EI_OK;
    return ei_key_shifts_set(ks, dst, ks->any[src] ? n : 0, ks->shift + (size_t)src * ks->n_ctx, rope, ctx);
}

ei_status ei_key_shifts_set(ei_key_shifts *ks, int s, int n, const int32_t *shifts, ei_rope_row_fn rope,
                            const void *ctx) {
    if (!ks->shift) return EI_OK;
    int32_t *next = calloc((size_t)ks->n_ctx, sizeof(int32_t)); /* (n_ctx) */
    if (!next) return ei_fail(EI_ERR_NOMEM, "out of memory for the key shifts of sequence %d", s);
    if (n > 0) memcpy(next, shifts, sizeof(int32_t) * (size_t)n);
    return commit(ks, s, next, rope, ctx);
}

ei_status ei_key_shifts_drop(ei_key_shifts *ks, int s, int n_runs, const int32_t *runs, int n_past,
                             ei_rope_row_fn rope, const void *ctx) {
    if (!ks->shift || n_runs == 0) return EI_OK;
    int32_t *next = calloc((size_t)ks->n_ctx, sizeof(int32_t)); /* (n_ctx) */
    if (!next) return ei_fail(EI_ERR_NOMEM, "out of memory for the key shifts of sequence %d", s);
    const int32_t *old = ks->shift + (size_t)s * ks->n_ctx;
    memcpy(next, old, sizeof(int32_t) * (size_t)runs[0]); /* below the first run nothing moves */
    int delta = 0; /* the kept positions between run r and the next move down by delta */
    for (int r = 0; r < n_runs; r++) {
        delta += runs[2 * r + 1];
        const int end = r + 1 < n_runs ? runs[2 * r + 2] : n_past;
        for (int p = runs[2 * r] + runs[2 * r + 1]; p < end; p++) next[p - delta] = old[p] + delta;
    }
    return commit(ks, s, next, rope, ctx);
}

/* the (cos, sin) pairs of shift d at rope base `base` for s (NULL for 0, or one not in its table) */
static const float *shift_cs(const ei_key_shifts *ks, int s, int base, int32_t d) {
    int lo = 0, hi = ks->n_values[s];
    const int32_t *v = ks->values[s];
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (v[mid] < d) lo = mid + 1;
        else hi = mid;
    }
    if (!d || lo == ks->n_values[s] || v[lo] != d) return NULL;
    return ks->cs[s] + table_entry_floats(ks) * (size_t)lo + (size_t)base * ks->n_rot;
}

int ei_key_shifts_split(const ei_key_shifts *ks, int s, int base, int p0, const ei_attn_run *in, int n_in,
                        size_t k_row_bytes, size_t v_row_bytes, ei_attn_run *out) {
    const int32_t *shift = ks->shift + (size_t)s * ks->n_ctx;
    int n_out = 0, p = p0;
    for (int r = 0; r < n_in; r++) {
        for (int t = 0; t < in[r].n;) {
            const int32_t d = shift[p + t];
            int m = 1;
            while (t + m < in[r].n && shift[p + t + m] == d) m++;
            out[n_out++] = (ei_attn_run){(const uint8_t *)in[r].k + (size_t)t * k_row_bytes,
                                         (const uint8_t *)in[r].v + (size_t)t * v_row_bytes, m, in[r].t0 + t,
                                         shift_cs(ks, s, base, d)};
            t += m;
        }
        p += in[r].n;
    }
    return n_out;
}
