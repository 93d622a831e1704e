#include "step_threads.h"

#define PROBE_STEPS 2       /* steps a probe times (their mean is its figure) */
#define SWITCH 0.9          /* a probe's count takes over when its steps take < 0.9 of k's */
#define ALPHA 0.25          /* weight of a step in k's moving averages */
#define DRIFT 1.002         /* the recent best rises by this a step (contexts grow) */
#define RISE 1.25           /* a step this much slower than the recent best: load arrived */
#define WAIT_SHARE 0.3      /* thread 0 waiting at barriers for this share of a step: another
                             * program holds a core the step's threads need */
#define FIRST_GAP 4         /* steps between probes that a rise or waiting bring forward */
/* steps between probes on every thread (rare: a probe on fewer costs up to twice a step) and
 * on fewer (more often: the other program may have finished) */
#define ALL_FIRST 128
#define ALL_MAX 1024
#define FEWER_FIRST 16
#define FEWER_MAX 64

static int cap(const ei_step_threads *t, int k) { return k == t->n ? ALL_MAX : FEWER_MAX; }

static void start(ei_tuned_len *L, int k, int n) {
    *L = (ei_tuned_len){0};
    L->k = k;
    L->interval = k == n ? ALL_FIRST : FEWER_FIRST;
    L->gap = FIRST_GAP;
    L->down = 1;
}

void ei_step_threads_init(ei_step_threads *t, int n_threads, int fixed) {
    t->n = n_threads < 1 ? 1 : n_threads;
    t->fixed = fixed;
    for (int i = 0; i < EI_TUNED_MAX_LEN; i++) start(&t->len[i], t->n, t->n);
}

/* steps of len tokens are tuned (else they run on all n) */
static int is_tuned(const ei_step_threads *t, int len) {
    return !t->fixed && t->n > 1 && len >= 1 && len <= EI_TUNED_MAX_LEN;
}

static ei_tuned_len *tuned(ei_step_threads *t, int len) { return is_tuned(t, len) ? &t->len[len - 1] : 0; }

int ei_step_threads_current(const ei_step_threads *t, int len) { return is_tuned(t, len) ? t->len[len - 1].k : t->n; }

int ei_step_threads_pick(ei_step_threads *t, int len) {
    ei_tuned_len *L = tuned(t, len);
    if (!L) return t->n;
    if (L->probe) return L->probe;
    if (L->since < L->interval) return L->k;
    /* a neighbouring count: down from all, up from one, else alternately */
    const int down = L->k == t->n || (L->k > 1 && L->down);
    L->probe = down ? L->k - 1 : L->k + 1;
    L->down = !L->down;
    L->probed = 0;
    L->probe_ns = 0;
    L->since = 0;
    return L->probe;
}

static void probe_done(ei_step_threads *t, ei_tuned_len *L) {
    const double mean = L->probe_ns / L->probed;
    const int tried = L->probe, was = L->k;
    L->probe = 0;
    if (L->ns > 0 && mean < SWITCH * L->ns) {
        start(L, tried, t->n);
        L->ns = L->base = mean;
        L->down = tried < was; /* on the same way: the count it left was just found slower */
        return;
    }
    L->interval = L->interval * 2 < cap(t, L->k) ? L->interval * 2 : cap(t, L->k);
    L->gap = L->gap * 2 < L->interval ? L->gap * 2 : L->interval;
    L->base = L->ns; /* what brought the probe forward is the new normal */
    L->wait_share = 0;
}

void ei_step_threads_took(ei_step_threads *t, int len, int k, int64_t ns, int64_t waited_ns) {
    ei_tuned_len *L = tuned(t, len);
    if (!L || ns <= 0) return;
    if (L->probe && k == L->probe) {
        L->probe_ns += (double)ns;
        if (++L->probed == PROBE_STEPS) probe_done(t, L);
        return;
    }
    if (k != L->k) return;
    const double share = (double)waited_ns / (double)ns;
    L->ns = L->ns > 0 ? L->ns + ALPHA * ((double)ns - L->ns) : (double)ns;
    L->wait_share += ALPHA * (share - L->wait_share);
    L->base = L->base > 0 && L->base * DRIFT < L->ns ? L->base * DRIFT : L->ns;
    L->since++;
    const int held_up = L->ns > RISE * L->base || (k > 1 && L->wait_share > WAIT_SHARE);
    if (held_up && L->since >= L->gap && L->since < L->interval) L->since = L->interval;
}
