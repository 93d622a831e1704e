/* The per-op profile of the forward pass (ei_engine_profile in edgeinfer.h): the wall time,
 * calls and work of each kind of phase. A phase ends when the barrier that closes it is
 * released (its slowest thread's arrival, ei_pool_released_ns), which thread 0 records after
 * it, so a phase's time includes the wait for its slowest thread and the phases of a call add
 * up to the call. The products of a group share one barrier: its time is split between them by
 * the time the threads spent in each. */
#ifndef EI_PROFILE_H
#define EI_PROFILE_H

#include <stdint.h>

#include "../include/edgeinfer.h"

#define EI_PROF_MAX_JOBS 4 /* products in one group (matmul_group's jobs) */
#define EI_PROF_STRIDE 8   /* int64 per thread in job_ns: a cache line each, none shared */

typedef struct {
    int on;                    /* 0: off or paused; the forward pass checks only this */
    int n, cap;                /* rows used, rows allocated (0: never enabled) */
    ei_profile_entry *entries; /* (cap) */
    int64_t last;              /* the clock at the last phase boundary (thread 0) */
    int64_t *job_ns;           /* (n_threads, EI_PROF_STRIDE) each thread's time per product */
    int n_threads;
} ei_profile;

int64_t ei_clock_ns(void); /* a monotonic clock, in nanoseconds */

/* allocates (once) room for cap rows and n_threads threads, then zeroes every counter;
 * 0: out of memory */
int ei_profile_start(ei_profile *p, int cap, int n_threads);
void ei_profile_free(ei_profile *p);

/* adds calls, ns and work to the row of (kind, type, rows, cols), made if new; a full table
 * (never, at the capacity the engine asks for) drops the row */
void ei_profile_add(ei_profile *p, int kind, int type, int64_t rows, int64_t cols, int64_t calls,
                    int64_t ns, int64_t flops, int64_t bytes);

/* the time from the last boundary to `now` goes to `kind` (type -1, no shape) as `calls`
 * phases (0: the end of one already counted); now is the boundary */
void ei_profile_mark(ei_profile *p, int kind, int64_t now, int64_t calls, int64_t flops, int64_t bytes);

#endif
