/* The engine's interleaved copies of weights (repack.c), apart from the forward pass that
 * uses them (engine.c). Not part of the public API. */
#ifndef EI_REPACK_H
#define EI_REPACK_H

#include "ei_internal.h"

#define EI_LAYOUT_X16 1     /* ei_tensor.layout of the engine's interleaved copies */
#define EI_LAYOUT_PENDING 2 /* a weight whose interleaved copy the first product using it makes */

typedef struct ei_repack_item ei_repack_item;

/* the copies planned for one engine; zero-initialised means none */
typedef struct {
    ei_repack_item *items; /* (capacity) planned copies, n of them used */
    int n, capacity;
    size_t bytes;  /* reserved for the copies */
    void *arena;   /* the copies, one after another (ei_repack_commit) */
    size_t mapped; /* the arena's bytes, rounded up to whole pages */
} ei_repack;

/* room for up to capacity planned copies; 0: out of memory */
int ei_repack_reserve(ei_repack *r, int capacity);
/* plans a copy of t when the kernels have an interleaved product for its type (t->layout then
 * becomes EI_LAYOUT_PENDING and its room is counted, allocated by ei_repack_commit); shared: data of
 * another tensor that still reads t's pages (a tied embedding), so they are not released;
 * release: whether t's pages may be dropped at all (ei_engine_params.release_weights).
 * 0: out of memory or no room left */
int ei_repack_plan(ei_repack *r, const ei_kernels *k, ei_tensor *t, const void *shared, int release);
/* the planned copies' memory, in one arena (huge pages where the system gives them); 0: out
 * of memory */
int ei_repack_commit(ei_repack *r);
/* thread ith of nth writes its share of t's copy (t must be pending) */
void ei_repack_share(const ei_repack *r, const ei_tensor *t, int ith, int nth);
/* once every share is written: t reads its copy (one thread, between barriers) */
void ei_repack_finish(const ei_repack *r, const ei_tensor *t);
/* the copies and the plan freed */
void ei_repack_release(ei_repack *r);

#endif
