/* A persistent pool of worker threads: the caller runs a task on every thread at once and
 * the threads meet at barriers inside it (one dispatch per forward pass, not per op). */
#ifndef EI_THREADPOOL_H
#define EI_THREADPOOL_H

typedef struct ei_pool ei_pool;
typedef void (*ei_task_fn)(void *ctx, int ith, int nth);

ei_pool *ei_pool_create(int n_threads); /* n_threads includes the caller; NULL on failure */
void ei_pool_run(ei_pool *pool, ei_task_fn fn, void *ctx);
void ei_pool_barrier(ei_pool *pool); /* every thread of the running task must call it */
int ei_pool_size(const ei_pool *pool);
void ei_pool_free(ei_pool *pool);

#endif
