/* A persistent pool of worker threads: the caller runs a task on every thread at once and
 * the threads meet at barriers inside it (one dispatch per forward pass, not per op). */
#ifndef EI_THREADPOOL_H
#define EI_THREADPOOL_H

#include <stdint.h>

typedef struct ei_pool ei_pool;
typedef void (*ei_task_fn)(void *ctx, int ith, int nth);

ei_pool *ei_pool_create(int n_threads); /* n_threads includes the caller; NULL on failure */
void ei_pool_run(ei_pool *pool, ei_task_fn fn, void *ctx);
/* the task on threads 0 .. n_active - 1 only (nth = n_active, clamped to 1 .. size): the
 * others stay asleep, and its barriers wait for those threads alone */
void ei_pool_run_on(ei_pool *pool, ei_task_fn fn, void *ctx, int n_active);
void ei_pool_barrier(ei_pool *pool); /* every thread of the running task must call it */
int ei_pool_size(const ei_pool *pool);
/* 0, 1, 2, ...: the next piece of the work between two barriers (or the start of the task and
 * a barrier), each number given to one thread. Threads that take pieces until the numbers run
 * past the work share it by how fast each runs, so a thread slowed by another program on its
 * core leaves its pieces to the others instead of holding up the barrier. */
int ei_pool_next(ei_pool *pool);
/* on != 0: the last thread to reach each barrier reads the clock (ei_clock_ns) as it releases
 * the others, so that a phase's end is when its slowest thread finished, not when a given
 * thread (perhaps preempted) noticed; set between tasks. Off, a barrier checks one flag. */
void ei_pool_time_barriers(ei_pool *pool, int on);
/* with timed barriers: when the last barrier the calling thread passed was released */
int64_t ei_pool_released_ns(const ei_pool *pool);
/* nanoseconds the calling thread has waited at barriers for the others, in all (a thread that
 * often waits long runs beside threads that lose their core) */
int64_t ei_pool_waited_ns(void);
void ei_pool_free(ei_pool *pool);

#endif
