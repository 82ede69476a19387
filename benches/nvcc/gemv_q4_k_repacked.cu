// Probe: batch-1 GEMV over Q4_K repacked (per row: 128-byte nibble bodies, then 16-byte heads;
// src/quant/repack.rs), three ways of feeding a lane its block's head:
//   V1 (the engine's q4_kr since session 7): lane = one 16-byte body word, plus a 16-byte head
//      load per word (8 lanes of a block load the same head);
//   V2: lane = one 32-byte quarter (two body words), one head load per quarter;
//   V3: as V1, but lanes 0..3 of each 8-lane group load one head word each (4 bytes) and the
//      group exchanges them with shuffles.
// Each against a float reference kernel (dequantised weights x dequantised int8 activations).
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cmath>
#include <algorithm>
#include <cuda_runtime.h>
typedef unsigned char u8; typedef unsigned short u16; typedef unsigned int u32; typedef signed char i8;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)
#define LO4 0x0f0f0f0fu
__device__ __forceinline__ float h2f(u32 h) { float f; asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"((u16)h)); return f; }
__device__ __forceinline__ uint4 ldq(const u8* p) { uint4 v; asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p)); return v; }
__device__ __forceinline__ u32 ld4(const u8* p) { u32 v; asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p)); return v; }
__device__ __forceinline__ int dot16(const u32* w, int4 x, int s) {
    s = __dp4a((int)w[0], x.x, s); s = __dp4a((int)w[1], x.y, s); s = __dp4a((int)w[2], x.z, s); return __dp4a((int)w[3], x.w, s);
}
// (scale, min) of sub-blocks 2c and 2c+1 from the 12 scale bytes (three words)
__device__ __forceinline__ void smp(const u32* sc, int c, float& s0, float& m0, float& s1, float& m1) {
    const bool lo = c < 2;
    const u32 sw = lo ? (sc[0] & 0x3f3f3f3fu) : ((sc[2] & 0x0f0f0f0fu) | ((sc[0] >> 2) & 0x30303030u));
    const u32 mw = lo ? (sc[1] & 0x3f3f3f3fu) : (((sc[2] >> 4) & 0x0f0f0f0fu) | ((sc[1] >> 2) & 0x30303030u));
    const int sh = (c & 1) * 16;
    s0 = (float)((sw >> sh) & 0xffu); s1 = (float)((sw >> (sh + 8)) & 0xffu);
    m0 = (float)((mw >> sh) & 0xffu); m1 = (float)((mw >> (sh + 8)) & 0xffu);
}
// half h of quarter c of a block: body word q, head words hw[0..3], activations of sub-blocks sb, sb+1
__device__ __forceinline__ float word_dot(uint4 q, const u32* hw, int c, int h, const i8* xq, const float2* xds, int sb) {
    const u32 qq[4] = {q.x, q.y, q.z, q.w};
    u32 lo[4], hi[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) { lo[t] = qq[t] & LO4; hi[t] = (qq[t] >> 4) & LO4; }
    const int4 x0 = *reinterpret_cast<const int4*>(xq + sb * 32 + 16 * h);
    const int4 x1 = *reinterpret_cast<const int4*>(xq + (sb + 1) * 32 + 16 * h);
    const float2 d0 = xds[sb], d1 = xds[sb + 1];
    const int s0 = dot16(lo, x0, 0), s1 = dot16(hi, x1, 0);
    const u32 sc[3] = {hw[1], hw[2], hw[3]};
    float a0, m0, a1, m1;
    smp(sc, c, a0, m0, a1, m1);
    const float d = h2f(hw[0] & 0xffffu), dmin = h2f(hw[0] >> 16);
    return d * (a0 * d0.x * (float)s0 + a1 * d1.x * (float)s1) - (h ? 0.f : dmin * (m0 * d0.y + m1 * d1.y));
}
__device__ __forceinline__ float wsum(float s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}
// V1 / V3 (HS = 1: heads by shuffle)
template <int R, int U, int HS>
__global__ void __launch_bounds__(128) v1(const u8* __restrict__ w, const i8* __restrict__ xq, const float2* __restrict__ xds, float* __restrict__ y, int n, int k) {
    const int lane = threadIdx.x & 31, nb = k >> 8, nw = nb * 8;
    const long long rb = (long long)nb * 144;
    for (int g = blockIdx.x * 4 + (threadIdx.x >> 5); g * R < n; g += gridDim.x * 4) {
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = 0.f;
        for (int w0 = 0; w0 < nw; w0 += 32 * U) {
            uint4 q[U][R]; u32 hw[U][R][4];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int wi = w0 + lane + 32 * u;
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const u8* rp = w + (long long)min(g * R + r, n - 1) * rb;
                    q[u][r] = wi < nw ? ldq(rp + 16 * wi) : make_uint4(0, 0, 0, 0);
                    const u8* hp = rp + 128 * nb + 16 * (wi >> 3);
                    if (HS) {
                        hw[u][r][0] = wi < nw && (lane & 7) < 4 ? ld4(hp + 4 * (lane & 3)) : 0u;
                    } else {
                        const uint4 h = wi < nw ? ldq(hp) : make_uint4(0, 0, 0, 0);
                        hw[u][r][0] = h.x; hw[u][r][1] = h.y; hw[u][r][2] = h.z; hw[u][r][3] = h.w;
                    }
                }
            }
            if (HS) {
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        const u32 mine = hw[u][r][0];
#pragma unroll
                        for (int t = 0; t < 4; ++t) hw[u][r][t] = __shfl_sync(0xffffffffu, mine, (lane & ~7) + t);
                    }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int wi = w0 + lane + 32 * u;
                if (wi < nw) {
                    const int j = wi & 7, c = j >> 1, h = j & 1, sb = (wi >> 3) * 8 + 2 * c;
#pragma unroll
                    for (int r = 0; r < R; ++r) acc[r] += word_dot(q[u][r], hw[u][r], c, h, xq, xds, sb);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) { const float s = wsum(acc[r]); if (lane == 0 && g * R + r < n) y[g * R + r] = s; }
    }
}
// V2: lane = quarter (two words) + one head
template <int R, int U>
__global__ void __launch_bounds__(128) v2(const u8* __restrict__ w, const i8* __restrict__ xq, const float2* __restrict__ xds, float* __restrict__ y, int n, int k) {
    const int lane = threadIdx.x & 31, nb = k >> 8, nqt = nb * 4;
    const long long rb = (long long)nb * 144;
    for (int g = blockIdx.x * 4 + (threadIdx.x >> 5); g * R < n; g += gridDim.x * 4) {
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = 0.f;
        for (int q0 = 0; q0 < nqt; q0 += 32 * U) {
            uint4 qa[U][R], qb[U][R], hd[U][R];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int qi = q0 + lane + 32 * u;
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const u8* rp = w + (long long)min(g * R + r, n - 1) * rb;
                    qa[u][r] = qi < nqt ? ldq(rp + 32 * qi) : make_uint4(0, 0, 0, 0);
                    qb[u][r] = qi < nqt ? ldq(rp + 32 * qi + 16) : make_uint4(0, 0, 0, 0);
                    hd[u][r] = qi < nqt ? ldq(rp + 128 * nb + 16 * (qi >> 2)) : make_uint4(0, 0, 0, 0);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int qi = q0 + lane + 32 * u;
                if (qi < nqt) {
                    const int c = qi & 3, sb = (qi >> 2) * 8 + 2 * c;
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        const u32 hw[4] = {hd[u][r].x, hd[u][r].y, hd[u][r].z, hd[u][r].w};
                        acc[r] += word_dot(qa[u][r], hw, c, 0, xq, xds, sb) + word_dot(qb[u][r], hw, c, 1, xq, xds, sb);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) { const float s = wsum(acc[r]); if (lane == 0 && g * R + r < n) y[g * R + r] = s; }
    }
}
// reference: one thread per row, float over dequantised values
__global__ void ref(const u8* w, const i8* xq, const float2* xds, float* y, int n, int k) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= n) return;
    const int nb = k >> 8;
    const u8* rp = w + (long long)row * nb * 144;
    double acc = 0;
    for (int b = 0; b < nb; ++b) {
        const u8* body = rp + 128 * b; const u8* hd = rp + 128 * nb + 16 * b;
        const float d = h2f(hd[0] | (hd[1] << 8)), dmin = h2f(hd[2] | (hd[3] << 8));
        const u8* sc = hd + 4;
        for (int s = 0; s < 8; ++s) {
            u32 a, m;
            if (s < 4) { a = sc[s] & 63u; m = sc[s + 4] & 63u; }
            else { a = (sc[s + 4] & 15u) | ((sc[s - 4] >> 6) << 4); m = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4); }
            const int blk = b * 8 + s;
            for (int l = 0; l < 32; ++l) {
                const u8 qb = body[(s >> 1) * 32 + l];
                const u32 q = (s & 1) ? (qb >> 4) : (qb & 15u);
                const float wv = d * a * q - dmin * m;
                acc += (double)wv * xds[blk].x * xq[blk * 32 + l];
            }
        }
    }
    y[row] = (float)acc;
}
__global__ void fill(u8* p, size_t nbytes, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nbytes / 4; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
        reinterpret_cast<u32*>(p)[i] = h;
    }
}
// small finite f16 d / dmin in every head of a repacked matrix
__global__ void fix_heads(u8* w, int n, int nb) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (long long)n * nb; i += (long long)gridDim.x * blockDim.x) {
        const long long row = i / nb, b = i % nb;
        u16* h = reinterpret_cast<u16*>(w + row * nb * 144 + 128 * nb + 16 * b);
        h[0] = (u16)(0x1800 | (h[0] & 0x3ff)); h[1] = (u16)(0x1400 | (h[1] & 0x3ff));
    }
}
int main() {
    struct S { int n, k; const char* what; } shapes[] = {{6144, 4096, "qkv8B"}, {4096, 4096, "o8B"}, {24576, 4096, "gateup8B"}, {4096, 12288, "down8B"}};
    i8* xq; float2* xds; float *y, *yr;
    CK(cudaMalloc(&xq, 16384)); CK(cudaMalloc(&xds, 512 * 8)); CK(cudaMalloc(&y, 65536 * 4)); CK(cudaMalloc(&yr, 65536 * 4));
    std::vector<i8> hq(16384); std::vector<float2> hd(512);
    for (int b = 0; b < 512; ++b) { int s = 0; for (int l = 0; l < 32; ++l) { hq[b * 32 + l] = (i8)((b * 37 + l * 11) % 255 - 127); s += hq[b * 32 + l]; }
        const float d = 0.01f + 0.001f * (b % 7); hd[b] = make_float2(d, d * s); }
    CK(cudaMemcpy(xq, hq.data(), 16384, cudaMemcpyHostToDevice)); CK(cudaMemcpy(xds, hd.data(), 512 * 8, cudaMemcpyHostToDevice));
    for (auto& s : shapes) {
        const int nb = s.k / 256; const size_t bytes = (size_t)s.n * nb * 144;
        const int copies = (int)std::max<size_t>(2, (400u << 20) / bytes + 1);
        u8* w; CK(cudaMalloc(&w, bytes * copies));
        fill<<<1024, 256>>>(w, bytes * copies, 3);
        for (int c = 0; c < copies; ++c) fix_heads<<<1024, 256>>>(w + c * bytes, s.n, nb);
        ref<<<(s.n + 127) / 128, 128>>>(w, xq, xds, yr, s.n, s.k); CK(cudaDeviceSynchronize());
        std::vector<float> want(s.n), got(s.n); CK(cudaMemcpy(want.data(), yr, s.n * 4, cudaMemcpyDeviceToHost));
        auto timeit = [&](auto launch) {
            for (int i = 0; i < 10; ++i) launch(i % copies);
            cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b); cudaEventRecord(a);
            for (int i = 0; i < 200; ++i) launch(i % copies);
            cudaEventRecord(b); CK(cudaEventSynchronize(b)); float ms; cudaEventElapsedTime(&ms, a, b); CK(cudaGetLastError()); return ms * 1000 / 200;
        };
        printf("%-9s n=%5d k=%5d %5.1f MB\n", s.what, s.n, s.k, bytes / 1e6);
#define RUN(NAME, KF, RR) { auto kf = KF; const int grid = (s.n + 4 * RR - 1) / (4 * RR); \
            auto l = [&](int c) { kf<<<grid, 128>>>(w + c * bytes, xq, xds, y, s.n, s.k); }; \
            CK(cudaMemset(y, 0, s.n * 4)); l(0); CK(cudaDeviceSynchronize()); CK(cudaMemcpy(got.data(), y, s.n * 4, cudaMemcpyDeviceToHost)); \
            double e = 0, m = 0; for (int i = 0; i < s.n; ++i) { e = fmax(e, fabs(got[i] - want[i])); m = fmax(m, fabs(want[i])); } \
            const float t = timeit(l); printf("   %-14s %7.2f us %5.0f GB/s  err %.1e\n", NAME, t, bytes / t / 1e3, e / m); }
        RUN("V1 R2 U4", (v1<2, 4, 0>), 2) RUN("V1 R2 U2", (v1<2, 2, 0>), 2)
        RUN("V2 R2 U2", (v2<2, 2>), 2) RUN("V2 R2 U1", (v2<2, 1>), 2) RUN("V2 R1 U2", (v2<1, 2>), 1) RUN("V2 R4 U1", (v2<4, 1>), 4)
        RUN("V3 R2 U4", (v1<2, 4, 1>), 2) RUN("V3 R4 U2", (v1<4, 2, 1>), 4)
        cudaFree(w);
    }
}
