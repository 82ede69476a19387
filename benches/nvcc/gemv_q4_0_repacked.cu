// Probe: decode GEMV over Q4_0 repacked apart (all 16-byte quant blocks of a row, then the f16
// scales of all rows), each lane loading whole blocks with coalesced 16-byte loads, no shared
// memory; against the staged GEMV over the GGUF layout (cur_q4_0.cu main entry).
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cmath>
#include <algorithm>
#include <cuda_runtime.h>
typedef unsigned char u8; typedef unsigned short u16; typedef unsigned int u32; typedef signed char i8;
extern "C" __global__ void gemv_q4_0_bs1_sm_90a(const u8*, const float*, const i8*, const float2*, float*, int, int);
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)
__device__ __forceinline__ float h2f(u32 h) { float f; asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"((u16)h)); return f; }
__device__ __forceinline__ uint4 ldq(const uint4* p) { uint4 v; asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p)); return v; }
__device__ __forceinline__ u32 lds16(const u16* p) { u16 v; asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p)); return v; }
struct XB { int4 a, b; float2 ds; };
__device__ __forceinline__ XB ldx(const i8* __restrict__ xq, const float2* __restrict__ xds, int blk) {
    const int4* p = reinterpret_cast<const int4*>(xq + (size_t)blk * 32);
    XB x; x.a = __ldg(p); x.b = __ldg(p + 1); x.ds = __ldg(xds + blk); return x;
}
__device__ __forceinline__ float bdot(uint4 w, u32 db, const XB& x) {
    const u32 q[4] = {w.x, w.y, w.z, w.w};
    int s = 0;
    s = __dp4a((int)(q[0] & 0x0f0f0f0fu), x.a.x, s); s = __dp4a((int)(q[1] & 0x0f0f0f0fu), x.a.y, s);
    s = __dp4a((int)(q[2] & 0x0f0f0f0fu), x.a.z, s); s = __dp4a((int)(q[3] & 0x0f0f0f0fu), x.a.w, s);
    s = __dp4a((int)((q[0] >> 4) & 0x0f0f0f0fu), x.b.x, s); s = __dp4a((int)((q[1] >> 4) & 0x0f0f0f0fu), x.b.y, s);
    s = __dp4a((int)((q[2] >> 4) & 0x0f0f0f0fu), x.b.z, s); s = __dp4a((int)((q[3] >> 4) & 0x0f0f0f0fu), x.b.w, s);
    return h2f(db) * (x.ds.x * (float)s - 8.f * x.ds.y);
}
// R rows per warp step; U blocks per lane per batch of loads; XREG: activations of the whole
// row kept in registers across row groups (needs nb <= 32 * U)
template <int R, int U, int XREG>
__global__ void __launch_bounds__(128) rq4(const uint4* __restrict__ q, const u16* __restrict__ sc, const i8* __restrict__ xq,
                                           const float2* __restrict__ xds, float* __restrict__ y, int n, int k) {
    const int lane = threadIdx.x & 31;
    const int nwarps = gridDim.x * 4;
    const int nb = k >> 5;
    XB xr[XREG ? U : 1];
    if (XREG) {
#pragma unroll
        for (int u = 0; u < U; ++u) { const int b = lane + 32 * u; if (b < nb) xr[u] = ldx(xq, xds, b); }
    }
    for (int g = blockIdx.x * 4 + (threadIdx.x >> 5); g * R < n; g += nwarps) {
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = 0.f;
        for (int b0 = 0; b0 < nb; b0 += 32 * U) {
            uint4 w[U][R];
            u32 d[U][R];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int b = b0 + lane + 32 * u;
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const int row = min(g * R + r, n - 1);
                    if (b < nb) { w[u][r] = ldq(q + (size_t)row * nb + b); d[u][r] = lds16(sc + (size_t)row * nb + b); }
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int b = b0 + lane + 32 * u;
                if (b < nb) {
                    const XB x = XREG ? xr[u] : ldx(xq, xds, b);
#pragma unroll
                    for (int r = 0; r < R; ++r) acc[r] += bdot(w[u][r], d[u][r], x);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float s = acc[r];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (lane == r && g * R + r < n) y[g * R + r] = s;
        }
    }
}
__global__ void fillq(u8* p, size_t nblocks, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nblocks; i += (size_t)gridDim.x * blockDim.x) {
        u8* b = p + i * 18; unsigned h = (unsigned)i * 2654435761u ^ seed;
        for (int j = 0; j < 18; ++j) { h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15; b[j] = (u8)h; }
        u16 d = (u16)(0x2000 | (h & 0x3ff)); b[0] = d & 0xff; b[1] = d >> 8;
    }
}
__global__ void repack(const u8* __restrict__ src, uint4* __restrict__ q, u16* __restrict__ sc, size_t nblocks) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nblocks; i += (size_t)gridDim.x * blockDim.x) {
        const u8* b = src + i * 18;
        sc[i] = (u16)(b[0] | (b[1] << 8));
        u32 w[4];
        for (int j = 0; j < 4; ++j) w[j] = b[2 + 4 * j] | (b[3 + 4 * j] << 8) | (b[4 + 4 * j] << 16) | ((u32)b[5 + 4 * j] << 24);
        q[i] = make_uint4(w[0], w[1], w[2], w[3]);
    }
}
__global__ void fill8(u32* p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 15; h *= 0x2c1b3c6du; h ^= h >> 12; p[i] = h;
    }
}
int main() {
    struct S { int n, k; const char* what; } shapes[] = {{6144, 4096, "qkv8B"}, {4096, 4096, "o8B"}, {24576, 4096, "gateup8B"}, {4096, 12288, "down8B"},
        {30720, 3840, "gateupG4"}, {3840, 15360, "downG4"}, {8192, 3840, "qkvG4"}};
    i8* xq; float2* xds; float *x, *y;
    CK(cudaMalloc(&xq, 32768)); CK(cudaMalloc(&xds, 8192)); CK(cudaMalloc(&x, 65536 * 4)); CK(cudaMalloc(&y, 65536 * 4));
    fill8<<<64, 256>>>((u32*)xq, 8192, 7);
    { std::vector<float2> h(1024); for (int i = 0; i < 1024; ++i) h[i] = make_float2(0.01f + 0.001f * (i % 7), 0.5f * ((i % 13) - 6));
      CK(cudaMemcpy(xds, h.data(), 8192, cudaMemcpyHostToDevice)); }
    int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    for (auto& s : shapes) {
        size_t nb = (size_t)s.n * s.k / 32, bytes = nb * 18;
        int copies = (int)std::max<size_t>(2, (400u << 20) / bytes + 1);
        u8* w; uint4* q; u16* sc;
        CK(cudaMalloc(&w, bytes * copies)); CK(cudaMalloc(&q, nb * 16 * copies)); CK(cudaMalloc(&sc, nb * 2 * copies));
        fillq<<<1024, 256>>>(w, nb * copies, 5);
        for (int c = 0; c < copies; ++c) repack<<<1024, 256>>>(w + c * bytes, q + c * nb, sc + c * nb, nb);
        CK(cudaDeviceSynchronize());
        std::vector<float> ref(s.n), got(s.n);
        auto timeit = [&](auto launch) {
            for (int i = 0; i < 10; ++i) launch(i % copies);
            cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b); cudaEventRecord(a);
            for (int i = 0; i < 200; ++i) launch(i % copies);
            cudaEventRecord(b); CK(cudaEventSynchronize(b)); float ms; cudaEventElapsedTime(&ms, a, b); CK(cudaGetLastError()); return ms * 1000 / 200;
        };
        int gcur = std::min((s.n + 15) / 16, 4 * sms);
        auto cur = [&](int c) { gemv_q4_0_bs1_sm_90a<<<gcur, 128>>>(w + c * bytes, x, xq, xds, y, s.n, s.k); };
        cur(0); CK(cudaDeviceSynchronize()); CK(cudaMemcpy(ref.data(), y, s.n * 4, cudaMemcpyDeviceToHost));
        float tc = timeit(cur);
        printf("%-9s n=%5d k=%5d %5.1f MB  staged GGUF %7.2f us %5.0f GB/s\n", s.what, s.n, s.k, bytes / 1e6, tc, bytes / tc / 1e3);
#define RUN(R, U, XR, CAP) { \
            auto kf = rq4<R, U, XR>; int full = (s.n + 4 * R - 1) / (4 * R); int grid = CAP ? std::min(full, CAP * sms) : full; \
            if (!(XR && s.k / 32 > 32 * U)) { \
            auto l = [&](int c) { kf<<<grid, 128>>>(q + c * nb, sc + c * nb, xq, xds, y, s.n, s.k); }; \
            CK(cudaMemset(y, 0, s.n * 4)); l(0); CK(cudaDeviceSynchronize()); CK(cudaMemcpy(got.data(), y, s.n * 4, cudaMemcpyDeviceToHost)); \
            double e = 0, m = 0; for (int i = 0; i < s.n; ++i) { e = fmax(e, fabs(got[i] - ref[i])); m = fmax(m, fabs(ref[i])); } \
            float t = timeit(l); printf("   rq4 R%d U%d x%d cap%d grid %6d %7.2f us %5.0f GB/s  err %.1e\n", R, U, XR, CAP, grid, t, bytes / t / 1e3, e / m); } }
        RUN(1, 4, 0, 0) RUN(2, 4, 0, 0) RUN(4, 4, 0, 0) RUN(2, 2, 0, 0) RUN(4, 2, 0, 0)
        RUN(1, 4, 1, 8) RUN(2, 4, 1, 8) RUN(4, 4, 1, 4) RUN(2, 4, 1, 4) RUN(1, 4, 1, 16)
        RUN(2, 4, 0, 8) RUN(4, 4, 0, 4) RUN(1, 8, 0, 0) RUN(2, 8, 0, 0)
        cudaFree(w); cudaFree(q); cudaFree(sc);
    }
}
