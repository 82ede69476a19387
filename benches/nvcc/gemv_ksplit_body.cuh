// split-K variant: KS warps of a block share each row group, warp ks taking chunks ks, ks+KS, ...;
// partial sums meet in shared memory (fixed order) behind a named barrier per row-group slot.
template <int NST, int KS>
__device__ __forceinline__ void gemv_blocks_ks(u8* __restrict__ stage, const u8* __restrict__ w,
                                               const i8* __restrict__ xq, const float2* __restrict__ xds,
                                               float* __restrict__ y, int n, int k) {
    __shared__ float red[2][WARPS][R];
    const int lane = threadIdx.x & 31;
    const int wi = threadIdx.x >> 5;
    const int ks = wi % KS;
    constexpr int SLOTS = WARPS / KS;
    const int slot = wi / KS;
    const int gslot = blockIdx.x * SLOTS + slot;
    const int nslots = gridDim.x * SLOTS;
    const int nb = k / BE;
    const long long row_bytes = (long long)nb * BB;
    const long long total = row_bytes * n;
    const int nchunks = (nb + CB - 1) / CB;
    const int cpw = (nchunks + KS - 1) / KS;  // chunk steps per group for every warp of the slot
    const int ngroups = (n + R - 1) / R;
    const int my_groups = gslot < ngroups ? (ngroups - gslot + nslots - 1) / nslots : 0;
    const int T = my_groups * cpw;
    if (T == 0) return;
    auto issue = [&](int t) {
        const int g = gslot + (t / cpw) * nslots;
        const int c = ks + KS * (t % cpw);
        if (c >= nchunks) return;
        const int b0 = c * CB;
        const int nblk = min(CB, nb - b0);
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
            const int r = g * R + rr;
            if (r >= n) break;
            const long long start = (long long)r * row_bytes + (long long)b0 * BB;
            const long long a0 = start & ~15ll;
            const int nunits = (int)((start + (long long)nblk * BB - a0 + 15) >> 4);
            u8* dst = stage + ((wi * NST + t % NST) * R + rr) * SBYTES;
            for (int u = lane; u < nunits; u += 32) {
                const long long addr = a0 + 16ll * u;
                const long long left = total - addr;
                cp_async16(dst + 16 * u, w + addr, left < 16 ? (int)left : 16);
            }
        }
    };
    float acc[R * NB];
#pragma unroll
    for (int b = 0; b < R * NB; ++b) acc[b] = 0.f;
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#pragma unroll
    for (int s = 0; s < NST; ++s) {
        if (s < T) issue(s);
        cp_async_commit();
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    for (int t = 0; t < T; ++t) {
        cp_async_wait<NST - 1>();
        __syncwarp();
        const int gi = t / cpw;
        const int g = gslot + gi * nslots;
        const int c = ks + KS * (t % cpw);
        if (c < nchunks) {
            const int b0 = c * CB;
            const int nblk = min(CB, nb - b0);
            int off[R];
#pragma unroll
            for (int rr = 0; rr < R; ++rr)
                off[rr] = (int)(((long long)(g * R + rr) * row_bytes + (long long)b0 * BB) & 15ll);
            QDOT<NB, R>(stage + (wi * NST + t % NST) * R * SBYTES, SBYTES, off, nblk, b0, xq, xds, k, lane, acc);
        }
        __syncwarp();
        if (t + NST < T) issue(t + NST);
        cp_async_commit();
        if (t % cpw == cpw - 1) {
            float* rp = red[gi & 1][wi];
#pragma unroll
            for (int rr = 0; rr < R; ++rr) {
                const float s = warp_sum(acc[rr]);
                if (lane == 0) rp[rr] = s;
                acc[rr] = 0.f;
            }
            asm volatile("bar.sync %0, %1;" ::"r"(1 + slot), "r"(KS * 32) : "memory");
            if (ks == 0 && lane < R && g * R + lane < n) {
                float s = red[gi & 1][wi][lane];
#pragma unroll
                for (int j = 1; j < KS; ++j) s += red[gi & 1][wi + j][lane];
                y[g * R + lane] = s;
            }
        }
    }
}
