/* The per-op profile's table and clock (profile.h). */
#if !defined(_WIN32)
#define _POSIX_C_SOURCE 199309L /* clock_gettime under -std=c11 */
#endif

#include "profile.h"

#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#include <windows.h>

int64_t ei_clock_ns(void) {
    static LARGE_INTEGER freq;
    LARGE_INTEGER now;
    if (!freq.QuadPart) QueryPerformanceFrequency(&freq);
    QueryPerformanceCounter(&now);
    /* split so that the product cannot overflow: ticks / freq seconds, then the rest */
    return (int64_t)(now.QuadPart / freq.QuadPart) * 1000000000 +
           (int64_t)(now.QuadPart % freq.QuadPart) * 1000000000 / freq.QuadPart;
}
#else
#include <time.h>

int64_t ei_clock_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
#endif

int ei_profile_start(ei_profile *p, int cap, int n_threads) {
    if (!p->entries) {
        p->entries = calloc((size_t)cap, sizeof(ei_profile_entry));
        p->job_ns = calloc((size_t)n_threads * EI_PROF_STRIDE, sizeof(int64_t));
        if (!p->entries || !p->job_ns) {
            ei_profile_free(p);
            return 0;
        }
        p->cap = cap;
        p->n_threads = n_threads;
    }
    p->n = 0;
    memset(p->job_ns, 0, sizeof(int64_t) * (size_t)p->n_threads * EI_PROF_STRIDE);
    p->last = ei_clock_ns();
    p->on = 1;
    return 1;
}

void ei_profile_free(ei_profile *p) {
    free(p->entries);
    free(p->job_ns);
    memset(p, 0, sizeof(*p));
}

void ei_profile_add(ei_profile *p, int kind, int type, int64_t rows, int64_t cols, int64_t calls,
                    int64_t ns, int64_t flops, int64_t bytes) {
    int i = 0;
    while (i < p->n && (p->entries[i].kind != kind || p->entries[i].type != type ||
                        p->entries[i].rows != rows || p->entries[i].cols != cols))
        i++;
    if (i == p->n) {
        if (p->n == p->cap) return;
        p->entries[p->n++] = (ei_profile_entry){kind, type, rows, cols, 0, 0, 0, 0};
    }
    ei_profile_entry *r = &p->entries[i];
    r->calls += calls;
    r->ns += ns;
    r->flops += flops;
    r->bytes += bytes;
}

void ei_profile_mark(ei_profile *p, int kind, int64_t now, int64_t calls, int64_t flops, int64_t bytes) {
    ei_profile_add(p, kind, -1, 0, 0, calls, now - p->last, flops, bytes);
    p->last = now;
}
