/* The thread pool (simd/common/threadpool.c) on a changing number of threads, and the policy
 * that picks that number for small steps (simd/common/step_threads.c) on made-up timings.
 * Built by tests/simd/test_threads.py, also under ThreadSanitizer; prints "N passed, M
 * failed" and exits non-zero on any failure. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../../simd/common/step_threads.h"
#include "../../simd/common/threadpool.h"

static int passed, failed;

static void check(const char *what, int ok) {
    if (ok) { passed++; return; }
    failed++;
    printf("FAIL %s\n", what);
}

/* ---- the pool --------------------------------------------------------------------------- */

#define MAX_T 8
#define PHASES 24
#define PIECES 37

typedef struct {
    ei_pool *pool;
    atomic_int ran[MAX_T];     /* tasks each thread ran */
    int seen_nth[MAX_T];       /* nth each thread was given */
    int out[PHASES][PIECES];   /* phase p, piece c: written by whichever thread took it */
    atomic_int order_errors;   /* a phase that saw its previous phase's pieces unfinished */
} task_state;

/* pieces of each phase taken with ei_pool_next, each reading the previous phase's result:
 * a barrier that let a thread through early shows as a wrong value */
static void task(void *raw, int ith, int nth) {
    task_state *t = raw;
    atomic_fetch_add(&t->ran[ith], 1);
    t->seen_nth[ith] = nth;
    for (int p = 0; p < PHASES; p++) {
        for (int c; (c = ei_pool_next(t->pool)) < PIECES;) {
            const int before = p ? t->out[p - 1][(c + 1) % PIECES] : 0;
            if (p && before != (p - 1) * 1000 + (c + 1) % PIECES + 1) atomic_fetch_add(&t->order_errors, 1);
            t->out[p][c] = p * 1000 + c + 1;
        }
        ei_pool_barrier(t->pool);
    }
}

static void check_pool(int n) {
    static task_state t;
    memset(&t, 0, sizeof(t));
    t.pool = ei_pool_create(n);
    check("pool created", t.pool != NULL);
    if (!t.pool) return;
    /* counts that change every task, up and down, past both ends (clamped to 1 .. n) */
    const int counts[] = {n, 1, n, 2, 0, n + 3, 1, 1, n, 3, 2, n, -1, n};
    int expect[MAX_T] = {0};
    char what[96];
    for (int rep = 0; rep < 25; rep++)
        for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
            const int k = counts[i] < 1 ? 1 : counts[i] > n ? n : counts[i];
            memset(t.out, 0, sizeof(t.out));
            memset(t.seen_nth, 0, sizeof(t.seen_nth));
            ei_pool_run_on(t.pool, task, &t, counts[i]);
            for (int j = 0; j < k; j++) expect[j]++;
            int ok = 1;
            for (int p = 0; p < PHASES; p++)
                for (int c = 0; c < PIECES; c++) ok &= t.out[p][c] == p * 1000 + c + 1;
            for (int j = 0; j < k; j++) ok &= t.seen_nth[j] == k;
            if (!ok || rep == 0) {
                snprintf(what, sizeof(what), "pool of %d on %d threads: every piece once, every thread told %d", n, counts[i], k);
                check(what, ok);
            }
        }
    int ran_ok = 1;
    for (int j = 0; j < n; j++) ran_ok &= atomic_load(&t.ran[j]) == expect[j];
    snprintf(what, sizeof(what), "pool of %d: each thread ran exactly the tasks that included it", n);
    check(what, ran_ok);
    snprintf(what, sizeof(what), "pool of %d: no phase began before the last ended", n);
    check(what, atomic_load(&t.order_errors) == 0);
    /* the calling thread waits at barriers only when it arrives before another thread */
    const int64_t before = ei_pool_waited_ns();
    ei_pool_run_on(t.pool, task, &t, 1);
    snprintf(what, sizeof(what), "pool of %d: a task on one thread never waits", n);
    check(what, ei_pool_waited_ns() == before);
    ei_pool_free(t.pool);
}

/* ---- the policy ------------------------------------------------------------------------- */

/* a step of len tokens on k threads takes cost[k] ms; thread 0 waits wait[k] of it; returns
 * the count the policy settled on after `steps` steps, and how many steps ran on each count */
static int simulate(ei_step_threads *t, int len, const double *cost, const double *wait, int steps, int *used) {
    for (int s = 0; s < steps; s++) {
        const int k = ei_step_threads_pick(t, len);
        if (used) used[k]++;
        ei_step_threads_took(t, len, k, (int64_t)(cost[k] * 1e6), (int64_t)(wait[k] * 1e6));
    }
    return ei_step_threads_current(t, len);
}

static void check_policy(void) {
    ei_step_threads t;
    const double zero[5] = {0};
    int used[5];

    /* free cores: more threads are faster; probes are rare and every count but n is left */
    const double free_cores[5] = {0, 20, 12, 9, 8};
    ei_step_threads_init(&t, 4, 0);
    memset(used, 0, sizeof(used));
    check("free cores: stays on all 4", simulate(&t, 1, free_cores, zero, 2000, used) == 4);
    check("free cores: under 1% of steps probe fewer threads", used[3] * 100 < 2000 && used[1] == 0 && used[2] == 0);

    /* one core taken: 4 threads wait at every barrier for the one that shares it */
    const double busy[5] = {0, 20, 12, 9, 28}, busy_wait[5] = {0, 0, 1, 1, 14};
    ei_step_threads_init(&t, 4, 0);
    memset(used, 0, sizeof(used));
    const int k = simulate(&t, 1, busy, busy_wait, 400, used);
    check("one core taken: settles on 3 of 4", k == 3);
    check("one core taken: leaves 4 within 20 steps (waiting brings the probe forward)", used[4] < 20);
    /* the other program ends: back to 4 (probes from fewer threads are frequent) */
    memset(used, 0, sizeof(used));
    check("core freed: back on 4", simulate(&t, 1, free_cores, zero, 200, used) == 4);
    check("core freed: within 100 steps", used[3] < 100);

    /* a load that makes every count slower alike: no switch, and probes do not repeat */
    const double flat[5] = {0, 30, 30, 30, 30};
    ei_step_threads_init(&t, 4, 0);
    memset(used, 0, sizeof(used));
    check("equal counts: stays on all", simulate(&t, 1, flat, zero, 2000, used) == 4);
    check("equal counts: under 1% probes", used[3] * 100 < 2000);

    /* two threads, the second core busy: one thread is faster */
    const double two[3] = {0, 21, 29}, two_wait[3] = {0, 0, 12};
    ei_step_threads_init(&t, 2, 0);
    memset(used, 0, sizeof(used));
    check("2 threads, one core taken: settles on 1", simulate(&t, 1, two, two_wait, 300, used) == 1);
    check("2 threads: under 3% of steps probe 2 once settled", used[2] < 10 + 300 * 3 / 100);

    /* fixed, too long a step, one thread: never anything but n */
    ei_step_threads_init(&t, 4, 1);
    check("fixed: stays on 4", simulate(&t, 1, busy, busy_wait, 300, NULL) == 4);
    ei_step_threads_init(&t, 4, 0);
    memset(used, 0, sizeof(used));
    simulate(&t, EI_TUNED_MAX_LEN + 1, busy, busy_wait, 300, used);
    check("prompt steps: always every thread", used[4] == 300);
    ei_step_threads_init(&t, 1, 0);
    check("one thread: 1", simulate(&t, 1, busy, busy_wait, 50, NULL) == 1);

    /* lengths are tuned apart */
    ei_step_threads_init(&t, 2, 0);
    simulate(&t, 1, two, two_wait, 300, NULL);
    check("lengths apart: len 1 on 1, len 4 untouched on 2",
          ei_step_threads_current(&t, 1) == 1 && ei_step_threads_current(&t, 4) == 2);
}

int main(void) {
    for (int n = 1; n <= 4; n++) check_pool(n);
    check_pool(MAX_T);
    check_policy();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
