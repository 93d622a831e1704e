/* Workers spin briefly on a task counter after each task (token-by-token decoding
 * calls back within microseconds) and then sleep on a condition variable. */
#include "threadpool.h"

#include "ei_kernels.h"
#include "profile.h"

#include <stdatomic.h>
#include <stdlib.h>

#if defined(_WIN32)
#include <windows.h>
typedef HANDLE ei_thread;
typedef SRWLOCK ei_mutex;
typedef CONDITION_VARIABLE ei_cond;
#define mutex_init(m) InitializeSRWLock(m)
#define mutex_lock(m) AcquireSRWLockExclusive(m)
#define mutex_unlock(m) ReleaseSRWLockExclusive(m)
#define mutex_destroy(m) ((void)0)
#define cond_init(c) InitializeConditionVariable(c)
#define cond_wait(c, m) SleepConditionVariableSRW(c, m, INFINITE, 0)
#define cond_broadcast(c) WakeAllConditionVariable(c)
#define cond_destroy(c) ((void)0)
#define cpu_relax() YieldProcessor()
#define yield_thread() SwitchToThread()
#else
#include <pthread.h>
#include <sched.h>
#define yield_thread() sched_yield()
typedef pthread_t ei_thread;
typedef pthread_mutex_t ei_mutex;
typedef pthread_cond_t ei_cond;
#define mutex_init(m) pthread_mutex_init(m, NULL)
#define mutex_lock(m) pthread_mutex_lock(m)
#define mutex_unlock(m) pthread_mutex_unlock(m)
#define mutex_destroy(m) pthread_mutex_destroy(m)
#define cond_init(c) pthread_cond_init(c, NULL)
#define cond_wait(c, m) pthread_cond_wait(c, m)
#define cond_broadcast(c) pthread_cond_broadcast(c)
#define cond_destroy(c) pthread_cond_destroy(c)
#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ volatile("yield")
#else
#define cpu_relax() ((void)0)
#endif
#endif

#define SPIN_ROUNDS 200000 /* about a millisecond of polling before an idle worker sleeps */
#define ACTIVE_BITS 12     /* up to 4095 threads */
#define PAUSE_ROUNDS 256   /* inside a task, pause this often before yielding the core: when
                              the machine is busy, the thread we wait for may need it */

/* the time the calling thread has spent at barriers waiting for the others */
static EI_THREAD_LOCAL int64_t waited_ns;

static inline void backoff(int *spins) {
    if (++*spins < PAUSE_ROUNDS) cpu_relax();
    else { *spins = 0; yield_thread(); }
}

struct ei_pool {
    int n;
    ei_thread *threads;
    ei_mutex lock;
    ei_cond wake;
    /* (task number << ACTIVE_BITS) | the threads the task runs on, in one word, so that a
     * worker that reads the task also reads its own count, not a later task's */
    atomic_uint task;
    int active;          /* the current task's threads (the caller's copy) */
    atomic_int finished; /* workers done with the current task */
    atomic_int *asleep;  /* (n) 1 while worker i sleeps: a task wakes the pool only if it
                          * needs a sleeping worker */
    atomic_int quit;
    ei_task_fn fn;
    void *ctx;
    /* sense-reversing barrier */
    atomic_int barrier_count;
    atomic_int barrier_sense;
    /* Work taken piece by piece (ei_pool_next): the phase after the b-th barrier counts its
     * pieces in work[b & 1]. The barrier that ends phase b - 1 zeroes the other counter, which
     * no thread can still be using (they have all finished phase b - 1), for phase b + 1. */
    atomic_uint passed; /* barriers completed (wrapping) */
    atomic_int work[2];
    int timed;            /* ei_pool_time_barriers */
    int64_t released_ns;  /* the last barrier's release, written before it (with timed) */
};

typedef struct {
    ei_pool *pool;
    int ith;
} worker_arg;

static int task_threads(unsigned task) { return (int)(task & ((1u << ACTIVE_BITS) - 1u)); }

/* the next task after seen; a worker the last task left out (spin == 0) sleeps at once rather
 * than polling a core that another program, or the pool's own threads, may want */
static unsigned wait_for_task(ei_pool *p, unsigned seen, int ith, int spin) {
    unsigned t;
    for (int i = 0; spin && i < SPIN_ROUNDS; i++) {
        if ((t = atomic_load_explicit(&p->task, memory_order_acquire)) != seen || atomic_load(&p->quit)) return t;
        cpu_relax();
    }
    mutex_lock(&p->lock);
    atomic_store(&p->asleep[ith], 1); /* before the task is read again (ei_pool_run_on) */
    while ((t = atomic_load(&p->task)) == seen && !atomic_load(&p->quit)) cond_wait(&p->wake, &p->lock);
    atomic_store(&p->asleep[ith], 0);
    mutex_unlock(&p->lock);
    return t;
}

#if defined(_WIN32)
static DWORD WINAPI worker_main(LPVOID raw)
#else
static void *worker_main(void *raw)
#endif
{
    worker_arg *arg = raw;
    ei_pool *p = arg->pool;
    const int ith = arg->ith;
    free(arg);
    unsigned seen = 0;
    int spin = 1;
    for (;;) {
        const unsigned t = wait_for_task(p, seen, ith, spin);
        if (atomic_load(&p->quit)) break;
        seen = t;
        const int active = task_threads(t);
        spin = ith < active;
        if (!spin) continue; /* left out: the task never waits for this thread */
        p->fn(p->ctx, ith, active);
        atomic_fetch_add_explicit(&p->finished, 1, memory_order_release);
    }
    return 0;
}

ei_pool *ei_pool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    ei_pool *p = calloc(1, sizeof(*p));
    if (!p) return NULL;
    p->n = n_threads;
    p->threads = calloc((size_t)n_threads, sizeof(ei_thread));
    p->asleep = calloc((size_t)n_threads, sizeof(atomic_int));
    if (!p->threads || !p->asleep || n_threads >= (1 << ACTIVE_BITS)) {
        free(p->threads);
        free((void *)p->asleep);
        free(p);
        return NULL;
    }
    p->active = n_threads;
    mutex_init(&p->lock);
    cond_init(&p->wake);
    for (int i = 1; i < n_threads; i++) {
        worker_arg *arg = malloc(sizeof(*arg));
        int ok = arg != NULL;
        if (ok) {
            arg->pool = p;
            arg->ith = i;
#if defined(_WIN32)
            p->threads[i] = CreateThread(NULL, 0, worker_main, arg, 0, NULL);
            ok = p->threads[i] != NULL;
#else
            ok = pthread_create(&p->threads[i], NULL, worker_main, arg) == 0;
#endif
        }
        if (!ok) {
            free(arg);
            p->n = i; /* the threads started so far */
            ei_pool_free(p);
            return NULL;
        }
    }
    return p;
}

int ei_pool_size(const ei_pool *p) { return p->n; }

void ei_pool_run(ei_pool *p, ei_task_fn fn, void *ctx) { ei_pool_run_on(p, fn, ctx, p->n); }

void ei_pool_run_on(ei_pool *p, ei_task_fn fn, void *ctx, int n_active) {
    const int active = n_active < 1 ? 1 : n_active > p->n ? p->n : n_active;
    p->active = active; /* read by the barriers, which only the task's threads reach */
    atomic_store(&p->work[atomic_load(&p->passed) & 1], 0); /* the task's first phase */
    if (active == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->finished, 0);
    const unsigned next = ((atomic_load(&p->task) >> ACTIVE_BITS) + 1u) << ACTIVE_BITS;
    atomic_store(&p->task, next | (unsigned)active); /* sequentially consistent: then asleep[] is read */
    for (int i = 1; i < active; i++)
        if (atomic_load(&p->asleep[i])) {
            mutex_lock(&p->lock);
            cond_broadcast(&p->wake);
            mutex_unlock(&p->lock);
            break;
        }
    fn(ctx, 0, active);
    int spins = 0;
    while (atomic_load_explicit(&p->finished, memory_order_acquire) != active - 1) backoff(&spins);
}

/* the last thread to reach a barrier, before it releases the others */
static void end_phase(ei_pool *p) {
    const unsigned b = atomic_load_explicit(&p->passed, memory_order_relaxed) + 1u;
    atomic_store_explicit(&p->work[(b + 1u) & 1u], 0, memory_order_relaxed);
    atomic_store_explicit(&p->passed, b, memory_order_relaxed);
    if (p->timed) p->released_ns = ei_clock_ns();
}

void ei_pool_time_barriers(ei_pool *p, int on) { p->timed = on; }
int64_t ei_pool_released_ns(const ei_pool *p) { return p->released_ns; }

void ei_pool_barrier(ei_pool *p) {
    if (p->active == 1) {
        end_phase(p);
        return;
    }
    const int sense = atomic_load_explicit(&p->barrier_sense, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&p->barrier_count, 1, memory_order_acq_rel) == p->active - 1) {
        end_phase(p);
        atomic_store_explicit(&p->barrier_count, 0, memory_order_relaxed);
        atomic_store_explicit(&p->barrier_sense, !sense, memory_order_release);
    } else {
        const int64_t t0 = ei_clock_ns();
        int spins = 0;
        while (atomic_load_explicit(&p->barrier_sense, memory_order_acquire) == sense) backoff(&spins);
        waited_ns += ei_clock_ns() - t0;
    }
}

int64_t ei_pool_waited_ns(void) { return waited_ns; }

int ei_pool_next(ei_pool *p) {
    const unsigned b = atomic_load_explicit(&p->passed, memory_order_relaxed);
    return atomic_fetch_add_explicit(&p->work[b & 1u], 1, memory_order_relaxed);
}

void ei_pool_free(ei_pool *p) {
    if (!p) return;
    mutex_lock(&p->lock);
    atomic_store(&p->quit, 1);
    cond_broadcast(&p->wake);
    mutex_unlock(&p->lock);
    for (int i = 1; i < p->n; i++) {
#if defined(_WIN32)
        WaitForSingleObject(p->threads[i], INFINITE);
        CloseHandle(p->threads[i]);
#else
        pthread_join(p->threads[i], NULL);
#endif
    }
    cond_destroy(&p->wake);
    mutex_destroy(&p->lock);
    free(p->threads);
    free((void *)p->asleep);
    free(p);
}
