// The end of gemm.comp and gemm_q.comp: each token's partial sums of the workgroup's THREADS
// invocations reduced in a fixed order (subgroupAdd, then the subgroups in index order; or a
// shared-memory tree) and written to y. The includer declares partial (THREADS * TOKENS).
void reduce_and_store(float acc[TOKENS], uint row, uint t0, uint nt) {
    const uint tid = gl_LocalInvocationID.x;
#if defined(SUBGROUPS)
    for (uint t = 0u; t < nt; t++) {
        const float v = subgroupAdd(acc[t]);
        if (subgroupElect()) partial[t * THREADS + gl_SubgroupID] = v;
    }
    barrier();
    if (tid < nt) {
        float sum = 0.0;
        for (uint g = 0u; g < gl_NumSubgroups; g++) sum += partial[tid * THREADS + g];
        y[(t0 + tid) * p.y_stride + p.y_first + row] = sum;
    }
#else
    for (uint t = 0u; t < nt; t++) partial[t * THREADS + tid] = acc[t];
    barrier();
    for (uint half_ = THREADS / 2u; half_ > 0u; half_ >>= 1) {
        if (tid < half_)
            for (uint t = 0u; t < nt; t++) partial[t * THREADS + tid] += partial[t * THREADS + tid + half_];
        barrier();
    }
    if (tid < nt) y[(t0 + tid) * p.y_stride + p.y_first + row] = partial[tid * THREADS];
#endif
}
