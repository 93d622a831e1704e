/* How many of the pool's threads a small step (a decoding step of a few tokens) runs on.
 *
 * Every thread of a step meets the others at about 14 barriers a layer. When another program
 * takes a core, the thread that shares it runs in slices, and each barrier waits for it: on
 * the 2-core AVX2 EPYC with one core kept busy, Gemma 3 270M decoded 34.5 tokens/s on two
 * threads and 47.9 on one (82 and 49 with both cores free). So the engine times its small
 * steps and, now and then, runs two of them on a neighbouring count (a probe); a count that
 * is clearly faster takes over. A step that suddenly runs slower than its recent best
 * (another program started) brings the next probe forward. Steps of more tokens (prompts)
 * always run on every thread: their pieces of work already go to whichever thread is free,
 * and they are too long to try out.
 *
 * Results never depend on the count (the engine's reductions are order-independent), so a
 * change is invisible but for speed. */
#ifndef EI_STEP_THREADS_H
#define EI_STEP_THREADS_H

#include <stdint.h>

#define EI_TUNED_MAX_LEN 16 /* steps of up to this many tokens are tuned, each length apart */

typedef struct {
    int k;               /* the count the steps of this length run on */
    int probe, probed;   /* the count being tried (0: none), and its steps timed so far */
    double probe_ns;     /* their time so far */
    int since, interval; /* steps since the last probe; steps between probes */
    int gap;             /* steps after a probe before a slowdown may bring the next forward */
    int down;            /* the next probe tries k - 1 (else k + 1) */
    double ns, base;     /* a step's time at k (moving average) and its recent best */
    double wait_share;   /* the share of a step thread 0 waited at barriers (moving average) */
} ei_tuned_len;

typedef struct {
    int n;     /* the pool's threads */
    int fixed; /* every step on all n */
    ei_tuned_len len[EI_TUNED_MAX_LEN];
} ei_step_threads;

void ei_step_threads_init(ei_step_threads *t, int n_threads, int fixed);
/* the threads the next step of len tokens should run on */
int ei_step_threads_pick(ei_step_threads *t, int len);
/* that step ran on k threads in ns nanoseconds, of which the calling thread (thread 0) waited
 * waited_ns at barriers */
void ei_step_threads_took(ei_step_threads *t, int len, int k, int64_t ns, int64_t waited_ns);
/* the count steps of len tokens run on now (outside probes) */
int ei_step_threads_current(const ei_step_threads *t, int len);

#endif
