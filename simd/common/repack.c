/* Weights the instruction set has an interleaved kernel for are copied into that layout (the
 * product then needs no horizontal sums) by the first product that uses them, so loading
 * reads no tensor data: the copies cost the tensors' sizes (reserved at load, resident once
 * written), and the file's pages are released (where the caller says they are a read-only file
 * mapping) unless another tensor (a tied embedding) still reads them.
 *
 * The copies share one arena of 2 MiB pages where the system gives them (Linux: transparent
 * huge pages asked for with madvise). Decoding streams every copy once a token, and on 4 KiB
 * pages the TLB misses cost more than the interleaving saves: on the AVX2 EPYC a Q8_0 copy
 * decoded 10-25 % slower than the rows read in place from the file, whose page cache the
 * kernel keeps in large folios. */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE /* madvise under -std=c11 */
#endif
#include <stdlib.h>
#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "repack.h"

struct ei_repack_item {
    ei_tensor *t;  /* the engine's own, writable description of the weight */
    uint8_t *copy; /* its interleaved rows (ei_x16_size per group of EI_X16) in the arena */
    size_t at;     /* their offset in the arena */
    int release;   /* whether the file's pages may be dropped once copied */
};

#define HUGE_PAGE ((size_t)2 << 20)
#define COPY_ALIGN 64

/* an arena of n bytes (rounded up to 2 MiB pages), NULL when out of memory */
static void *arena_alloc(size_t n, size_t *mapped) {
#if defined(__unix__) || defined(__APPLE__)
    const size_t size = (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    /* one page more, so that the arena can start on a 2 MiB boundary */
    uint8_t *raw = mmap(NULL, size + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uint8_t *base = (uint8_t *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (base > raw) munmap(raw, (size_t)(base - raw));
    if (raw + HUGE_PAGE > base) munmap(base + size, (size_t)(raw + HUGE_PAGE - base));
#if defined(MADV_HUGEPAGE)
    madvise(base, size, MADV_HUGEPAGE); /* a hint: without huge pages the arena works as well */
#endif
    *mapped = size;
    return base;
#else
    *mapped = n;
    return malloc(n ? n : 1);
#endif
}

static void arena_free(void *base, size_t mapped) {
    if (!base) return;
#if defined(__unix__) || defined(__APPLE__)
    munmap(base, mapped);
#else
    (void)mapped;
    free(base);
#endif
}

/* drops the resident pages of a weight the engine has copied: the mapping stays valid (a
 * later read faults them in again from the file), but they no longer count in memory use */
static void release_pages(const void *data, size_t n) {
#if defined(__unix__) || defined(__APPLE__)
    const long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) return;
    const uintptr_t lo = ((uintptr_t)data + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1);
    const uintptr_t hi = ((uintptr_t)data + n) & ~(uintptr_t)(page - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
#else
    (void)data; (void)n;
#endif
}

int ei_repack_reserve(ei_repack *r, int capacity) {
    r->items = calloc((size_t)capacity, sizeof(ei_repack_item));
    r->capacity = r->items ? capacity : 0;
    return r->items != NULL;
}

int ei_repack_plan(ei_repack *r, const ei_kernels *k, ei_tensor *t, const void *shared, int release) {
    if (!k->gemm_x16[t->type] || t->ne1 % EI_X16) return 1;
    if (r->n == r->capacity) return 0;
    const size_t size = ei_x16_size(t->type, t->ne0) * (size_t)(t->ne1 / EI_X16);
    if (!size) return 1;
    ei_repack_item *it = &r->items[r->n];
    it->at = r->bytes;
    it->t = t;
    it->release = release && t->data != shared;
    r->n++;
    r->bytes += (size + COPY_ALIGN - 1) / COPY_ALIGN * COPY_ALIGN;
    t->layout = EI_LAYOUT_PENDING;
    return 1;
}

int ei_repack_commit(ei_repack *r) {
    if (!r->n) return 1;
    if (!(r->arena = arena_alloc(r->bytes, &r->mapped))) return 0;
    for (int i = 0; i < r->n; i++) r->items[i].copy = (uint8_t *)r->arena + r->items[i].at;
    return 1;
}

/* the planned copy of t (which must have one) */
static const ei_repack_item *copy_of(const ei_repack *r, const ei_tensor *t) {
    const ei_repack_item *it = r->items;
    while (it->t != t) it++;
    return it;
}

/* the share's groups copied; the file's pages of them released as the copy goes, a few MiB at
 * a time, so that they and the copies are never resident together for more than that (only
 * pages wholly inside a stretch: a page across two stretches stays) */
#define RELEASE_STRETCH ((size_t)4 << 20)
void ei_repack_share(const ei_repack *r, const ei_tensor *t, int ith, int nth) {
    const ei_repack_item *it = copy_of(r, t);
    const size_t row = ei_row_size(t->type, t->ne0), packed = ei_x16_size(t->type, t->ne0);
    const size_t group_bytes = (size_t)EI_X16 * row;
    const int64_t groups = t->ne1 / EI_X16, g0 = groups * ith / nth, g1 = groups * (ith + 1) / nth;
    const int64_t per = RELEASE_STRETCH / group_bytes > 0 ? (int64_t)(RELEASE_STRETCH / group_bytes) : 1;
    for (int64_t s = g0; s < g1; s += per) {
        const int64_t e = s + per < g1 ? s + per : g1;
        for (int64_t g = s; g < e; g++)
            ei_pack_x16(t->type, (const uint8_t *)t->data + (size_t)g * group_bytes, row, t->ne0,
                        it->copy + (size_t)g * packed);
        if (it->release) release_pages((const uint8_t *)t->data + (size_t)s * group_bytes, (size_t)(e - s) * group_bytes);
    }
}

void ei_repack_finish(const ei_repack *r, const ei_tensor *t) {
    const ei_repack_item *it = copy_of(r, t);
    it->t->data = it->copy;
    it->t->layout = EI_LAYOUT_X16;
}

void ei_repack_release(ei_repack *r) {
    arena_free(r->arena, r->mapped);
    free(r->items);
    *r = (ei_repack){0};
}
