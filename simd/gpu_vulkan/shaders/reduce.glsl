// The end of gemm.comp and gemm_q.comp: each token's float-pair sums (exact.glsl) of the
// workgroup's THREADS invocations, added in a fixed order and rounded once into y, as the
// CPU rounds its double sum once. With SUBGROUPS a butterfly of shuffles adds each subgroup's
// pairs (both partners of a step compute the same pair: the additions commute bit for bit),
// and one invocation per token adds the subgroups' in index order; without, it adds all
// THREADS in index order. The includer declares part_hi and part_lo (THREADS * TOKENS).
void reduce_and_store(float hi[TOKENS], float lo[TOKENS], uint row, uint t0, uint nt) {
    const uint tid = gl_LocalInvocationID.x;
#if defined(SUBGROUPS)
    for (uint t = 0u; t < nt; t++) {
        float h = hi[t], l = lo[t];
        for (uint off = gl_SubgroupSize >> 1; off > 0u; off >>= 1) {
            const float oh = subgroupShuffleXor(h, off), ol = subgroupShuffleXor(l, off);
            ff_add2(h, l, oh, ol);
        }
        if (subgroupElect()) {
            part_hi[t * THREADS + gl_SubgroupID] = h;
            part_lo[t * THREADS + gl_SubgroupID] = l;
        }
    }
    const uint n_parts = gl_NumSubgroups;
#else
    for (uint t = 0u; t < nt; t++) {
        part_hi[t * THREADS + tid] = hi[t];
        part_lo[t * THREADS + tid] = lo[t];
    }
    const uint n_parts = THREADS;
#endif
    barrier();
    if (tid < nt) {
        float h = 0.0, l = 0.0;
        for (uint i = 0u; i < n_parts; i++) ff_add2(h, l, part_hi[tid * THREADS + i], part_lo[tid * THREADS + i]);
        y[(t0 + tid) * p.y_stride + p.y_first + row] = ff_round(h, l);
    }
}
