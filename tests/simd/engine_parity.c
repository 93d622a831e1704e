/* The native forward pass with every supported variant against the scalar one, bit for bit:
 * small random models whose layers use every weight type, a prompt (tiles with 4 and with
 * fewer activations), then single tokens (tiles with one), several threads, four cache types,
 * a Llama-like and a Gemma-like configuration. With q4_0 keys, positions are dropped after the
 * prompt: the kept keys move as they are and the queries meet them rotated ahead
 * (common/key_shifts.h). Linked from the library's objects; prints
 * "N passed, M failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../simd/common/ei_internal.h"
#include "check_common.h"

enum { E = 256, FF = 512, HEADS = 4, KV_HEADS = 2, HD = 64, VOCAB = 301, LAYERS = 3, PROMPT = 11, STEPS = 3 };


/* a (rows, cols) weight of the given type: random bits, sane fp16 scales, small floats */
static ei_tensor weight(int type, int cols, int rows, float scale) {
    const size_t row = ei_row_size(type, cols), bytes = row * (size_t)rows;
    uint8_t *w = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)next_u32();
    if (type == EI_TYPE_F32 || type == EI_TYPE_F16 || type == EI_TYPE_BF16) {
        for (size_t i = 0; i < (size_t)cols * rows; i++) {
            const float v = uniform() * scale * 4.0f;
            if (type == EI_TYPE_F32) ((float *)w)[i] = v;
            else ((ei_f16 *)w)[i] = type == EI_TYPE_F16 ? ei_fp32_to_fp16(v) : ei_fp32_to_bf16(v);
        }
    } else {
        const size_t block = ei_row_size(type, ei_block_size(type));
        int offs[2];
        scale_offsets(type, offs);
        for (size_t b = 0; b + block <= bytes; b += block)
            for (int j = 0; j < 2; j++)
                if (offs[j] >= 0) {
                    const ei_f16 h = ei_fp32_to_fp16((j ? 0.5f : 1.0f) * scale * (0.5f + 0.5f * uniform()));
                    memcpy(w + b + offs[j], &h, 2);
                }
    }
    return (ei_tensor){w, type, 0, cols, rows};
}

static ei_tensor vec(int n, float center) {
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++) v[i] = center + 0.1f * uniform();
    return (ei_tensor){v, EI_TYPE_F32, 0, n, 1};
}

/* layer il's types: every weight type appears in some layer */
static const int TYPES[LAYERS][7] = {
    {EI_TYPE_Q4_0, EI_TYPE_Q5_0, EI_TYPE_Q8_0, EI_TYPE_Q4_1, EI_TYPE_Q4_K, EI_TYPE_Q5_K, EI_TYPE_Q6_K},
    {EI_TYPE_Q5_1, EI_TYPE_Q2_K, EI_TYPE_Q3_K, EI_TYPE_F16, EI_TYPE_Q6_K, EI_TYPE_Q4_K, EI_TYPE_Q2_K},
    {EI_TYPE_BF16, EI_TYPE_F32, EI_TYPE_Q4_0, EI_TYPE_Q8_0, EI_TYPE_Q3_K, EI_TYPE_Q5_K, EI_TYPE_Q4_K},
};

static void build(ei_model_desc *m, ei_layer_desc *layers, int gemma) {
    memset(m, 0, sizeof(*m));
    memset(layers, 0, sizeof(ei_layer_desc) * LAYERS);
    *m = (ei_model_desc){.n_vocab = VOCAB, .n_embd = E, .n_layer = LAYERS, .n_head = HEADS, .n_head_kv = KV_HEADS,
                         .head_dim = HD, .head_dim_v = HD, .n_ff = FF, .n_rot = gemma ? HD : HD / 2,
                         .rope_neox = gemma, .act_gelu = gemma, .scale_q = gemma, .norm_eps = 1e-6f,
                         .embed_scale = gemma ? 16.0f : 1.0f, .kq_scale = 0.125f,
                         .final_softcap = gemma ? 30.0f : 0.0f};
    m->tok_embd = weight(EI_TYPE_Q8_0, E, VOCAB, 0.02f);
    m->output = weight(gemma ? EI_TYPE_Q8_0 : EI_TYPE_Q6_K, E, VOCAB, 0.02f);
    m->output_norm = vec(E, 1.0f);
    for (int il = 0; il < LAYERS; il++) {
        ei_layer_desc *l = &layers[il];
        const int *t = TYPES[il];
        l->attn_norm = vec(E, 1.0f);
        l->ffn_norm = vec(E, 1.0f);
        l->wq = weight(t[0], E, HEADS * HD, 0.01f);
        l->wk = weight(t[1], E, KV_HEADS * HD, 0.01f);
        l->wv = weight(t[2], E, KV_HEADS * HD, 0.01f);
        l->wo = weight(t[3], HEADS * HD, E, 0.01f);
        l->ffn_gate = weight(t[4], E, FF, 0.01f);
        l->ffn_up = weight(t[5], E, FF, 0.01f);
        l->ffn_down = weight(t[6], FF, E, 0.01f);
        l->rope_base = il == 1 ? 10000.0f : 1000000.0f;
        l->rope_scale = il == 1 ? 1.0f : 0.5f;
        if (gemma) {
            l->q_norm = vec(HD, 1.0f);
            l->k_norm = vec(HD, 1.0f);
            l->attn_post_norm = vec(E, 1.0f);
            l->ffn_post_norm = vec(E, 1.0f);
            l->window = il == 0 ? 5 : 0; /* a sliding-window layer */
        } else {
            l->bq = vec(HEADS * HD, 0.0f);
        }
    }
    m->layers = layers;
}

/* the (key, value) cache types run: both f16, both f32, and two mixed pairs */
enum { N_KV = 4, DROP_AT = 2, DROPPED = 3 };
static const int KV_TYPES[N_KV][2] = {{EI_TYPE_F16, EI_TYPE_F16}, {EI_TYPE_F32, EI_TYPE_F32},
                                      {EI_TYPE_F16, EI_TYPE_F32}, {EI_TYPE_Q4_0, EI_TYPE_Q8_0}};

/* logits of a prompt, then of single tokens, as (PROMPT + STEPS, VOCAB) */
static int run(const ei_model_desc *m, int isa, int threads, const int kv[2], float *logits) {
    ei_engine_params p = {64, threads, 1, 16, kv[0], kv[1], EI_KV_ROWS, isa};
    ei_engine *e;
    if (ei_engine_create(m, &p, &e) != EI_OK) {
        printf("FAIL create %s: %s\n", ei_isa_name(isa), ei_last_error());
        return 0;
    }
    int32_t tok[PROMPT], pos[PROMPT], seq[PROMPT];
    int8_t mask[PROMPT];
    for (int i = 0; i < PROMPT; i++) tok[i] = (i * 97 + 13) % VOCAB, pos[i] = i, seq[i] = 0, mask[i] = 1;
    int ok = ei_engine_decode(e, PROMPT, tok, pos, seq, mask, logits) == EI_OK;
    const int drop = kv[0] == EI_TYPE_Q4_0 ? DROPPED : 0; /* keys kept as first rotated */
    if (ok && drop) ok = ei_engine_seq_discard(e, 0, DROP_AT, drop, PROMPT) == EI_OK;
    for (int s = 0; s < STEPS && ok; s++) {
        const int32_t t = (s * 31 + 7) % VOCAB, ps = PROMPT - drop + s, sq = 0;
        const int8_t mk = 1;
        ok = ei_engine_decode(e, 1, &t, &ps, &sq, &mk, logits + (size_t)(PROMPT + s) * VOCAB) == EI_OK;
    }
    if (!ok) printf("FAIL decode %s: %s\n", ei_isa_name(isa), ei_last_error());
    ei_engine_free(e);
    return ok;
}

int main(void) {
    static float ref[(PROMPT + STEPS) * VOCAB], got[(PROMPT + STEPS) * VOCAB];
    static ei_layer_desc layers[LAYERS];
    int passed = 0, failed = 0;
    printf("engine parity, best variant %s\n", ei_isa_name(ei_isa_best()));
    for (int gemma = 0; gemma < 2; gemma++) {
        ei_model_desc m;
        build(&m, layers, gemma);
        for (int c = 0; c < N_KV; c++) {
            const int *kv = KV_TYPES[c];
            if (!run(&m, EI_ISA_SCALAR, 1, kv, ref)) return 1;
            float lo = ref[0], hi = ref[0];
            for (int i = 0; i < (PROMPT + STEPS) * VOCAB; i++) {
                if (!isfinite(ref[i])) lo = -INFINITY;
                lo = fminf(lo, ref[i]), hi = fmaxf(hi, ref[i]);
            }
            if (!(isfinite(lo) && hi - lo > 0.1f)) {
                printf("FAIL scalar logits are degenerate: %g .. %g\n", lo, hi);
                return 1;
            }
            for (int isa = 1; isa < EI_ISA_COUNT; isa++) {
                if (!ei_isa_supported(isa)) continue;
                for (int threads = 1; threads <= 3; threads += 2) {
                    memset(got, 0, sizeof(got));
                    const int same = run(&m, isa, threads, kv, got) && memcmp(ref, got, sizeof(ref)) == 0;
                    if (same) { passed++; continue; }
                    failed++;
                    int at = 0;
                    while (at < (PROMPT + STEPS) * VOCAB && !memcmp(&ref[at], &got[at], 4)) at++;
                    printf("FAIL %s model, cache types %d/%d, %s, %d threads: logit %d: %.9g vs scalar %.9g\n",
                           gemma ? "gemma-like" : "llama-like", kv[0], kv[1], ei_isa_name(isa), threads,
                           at, got[at], ref[at]);
                }
            }
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
