/* Rows that end right before an inaccessible page: the last row of the last tensor of a
 * mapped file is followed by nothing, so no kernel may read past a row's end, however many
 * blocks the row has and whatever the tile shape; nor may gemm_x16 read past the engine's
 * interleaved copy or the activations. Every result is compared with the reference's vec_dot. */
#define _DEFAULT_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../simd/common/ei_kernels.h"

void EI_CHECK_INIT(ei_kernels *k);

static int passed, failed;
static uint32_t rng = 12345;
static uint32_t next(void) { rng = rng * 1664525u + 1013904223u; return rng >> 8; }

/* n bytes ending at a PROT_NONE page */
static uint8_t *guarded(size_t n) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), span = (n + page - 1) / page * page;
    uint8_t *m = mmap(NULL, span + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    mprotect(m + span, page, PROT_NONE);
    return m + span - n;
}

static void check(const char *what, int ok) {
    if (ok) { passed++; return; }
    failed++;
    printf("FAIL %s\n", what);
}

int main(void) {
    ei_kernels ref, var;
    ei_kernels_init_ref(&ref);
    EI_CHECK_INIT(&var);
    printf("guard pages for %s against %s\n", var.name, ref.name);
    static const int types[] = {EI_TYPE_Q4_0, EI_TYPE_Q4_1, EI_TYPE_Q5_0, EI_TYPE_Q5_1, EI_TYPE_Q8_0, EI_TYPE_Q2_K,
                                EI_TYPE_Q3_K, EI_TYPE_Q4_K, EI_TYPE_Q5_K, EI_TYPE_Q6_K, EI_TYPE_F16, EI_TYPE_BF16, EI_TYPE_F32};
    static const int counts[] = {1, 2, 3, 5, 7, 8, 9, 17};
    char what[128];
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
        for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
            const int type = types[ti], pt = ei_partner_type(type);
            const int n = counts[ci] * (ei_block_size(type) == 1 ? 16 : ei_block_size(type));
            const size_t wrow = ei_row_size(type, n), arow = ei_row_size(pt, n);
            uint8_t *w = guarded(4 * wrow), *a = guarded(4 * arow);
            float *x = (float *)guarded(4 * sizeof(float) * (size_t)n), *back = (float *)guarded(sizeof(float) * (size_t)n);
            for (size_t i = 0; i < 4 * wrow; i++) w[i] = (uint8_t)next();
            for (int i = 0; i < 4 * n; i++) x[i] = (float)((int)(next() % 2001) - 1000) / 300.0f;
            /* sane scales: decode each row and quantize it back as its own type where possible */
            for (int r = 0; r < 4; r++) {
                if (!ref.from_float[type]) { /* a quantized type: small fp16 scales in every block */
                    const int bs = (int)ei_row_size(type, ei_block_size(type));
                    for (int b = 0; b < counts[ci]; b++) {
                        uint8_t *blk = w + (size_t)r * wrow + (size_t)b * bs;
                        const ei_f16 h = ei_fp32_to_fp16(0.01f);
                        if (type == EI_TYPE_Q2_K) { memcpy(blk + 80, &h, 2); memcpy(blk + 82, &h, 2); }
                        else if (type == EI_TYPE_Q3_K) memcpy(blk + 108, &h, 2);
                        else if (type == EI_TYPE_Q6_K) memcpy(blk + 208, &h, 2);
                        else {
                            memcpy(blk, &h, 2);
                            if (type == EI_TYPE_Q4_1 || type == EI_TYPE_Q5_1 || type == EI_TYPE_Q4_K || type == EI_TYPE_Q5_K) memcpy(blk + 2, &h, 2);
                        }
                    }
                } else {
                    ref.from_float[type](x + (size_t)r * n, w + (size_t)r * wrow, n);
                }
                var.from_float[pt](x + (size_t)r * n, a + (size_t)r * arow, n);
            }
            float *decoded = (float *)guarded(sizeof(float) * (size_t)n);
            var.to_float[type](w + 3 * wrow, back, n);
            ref.to_float[type](w + 3 * wrow, decoded, n);
            snprintf(what, sizeof(what), "to_float type %d n %d", type, n);
            check(what, memcmp(back, decoded, sizeof(float) * (size_t)n) == 0);
            float want[16];
            for (int r = 0; r < 4; r++)
                for (int c = 0; c < 4; c++) ref.vec_dot[type](n, &want[4 * c + r], w + (size_t)r * wrow, a + (size_t)c * arow);
            for (int r0 = 0; r0 < 4; r0++) {
                float got;
                var.vec_dot[type](n, &got, w + (size_t)r0 * wrow, a + 3 * arow);
                snprintf(what, sizeof(what), "vec_dot type %d n %d row %d", type, n, r0);
                check(what, memcmp(&got, &want[12 + r0], 4) == 0);
            }
            if (!var.gemm[type]) continue;
            for (int nr = 1; nr <= 4; nr++)
                for (int nc = 1; nc <= 4; nc++) { /* the tile's last row and column end at the guard */
                    float s[16];
                    var.gemm[type](n, nr, nc, s, 4, w + (size_t)(4 - nr) * wrow, wrow, a + (size_t)(4 - nc) * arow, arow);
                    int ok = 1;
                    for (int c = 0; c < nc; c++)
                        for (int r = 0; r < nr; r++) ok &= memcmp(&s[4 * c + r], &want[4 * (4 - nc + c) + 4 - nr + r], 4) == 0;
                    snprintf(what, sizeof(what), "gemm type %d n %d tile %dx%d", type, n, nr, nc);
                    check(what, ok);
                }
            if (!var.gemm_x16[type] || !ei_x16_size(type, n)) continue;
            /* rows 0..3 four times over, interleaved into a copy that ends at a guard, against
             * activations whose last row ends at theirs */
            uint8_t *rows16 = guarded(EI_X16 * wrow), *packed = guarded(ei_x16_size(type, n));
            for (int r = 0; r < EI_X16; r++) memcpy(rows16 + (size_t)r * wrow, w + (size_t)(r % 4) * wrow, wrow);
            ei_pack_x16(type, rows16, wrow, n, packed);
            const int T = var.x16_tile ? var.x16_tile : EI_TILE; /* the most columns the variant takes */
            uint8_t *a8 = guarded(T * arow); /* activation rows 0..3 over and over, the last at the guard */
            for (int c = 0; c < T; c++) memcpy(a8 + (size_t)c * arow, a + (size_t)(c % 4) * arow, arow);
            for (int nc = 1; nc <= T; nc++) {
                float s[EI_X16_TILE_MAX * EI_X16];
                var.gemm_x16[type](n, nc, s, EI_X16, packed, a8 + (size_t)(T - nc) * arow, arow);
                int ok = 1;
                for (int c = 0; c < nc; c++)
                    for (int r = 0; r < EI_X16; r++) ok &= memcmp(&s[EI_X16 * c + r], &want[4 * ((T - nc + c) % 4) + r % 4], 4) == 0;
                snprintf(what, sizeof(what), "gemm_x16 type %d n %d columns %d", type, n, nc);
                check(what, ok);
            }
        }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
