#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cmath>
#include <cstring>
#include <cuda_runtime.h>
typedef unsigned short u16;
#define E(n) extern "C" __global__ void n(const u16*, const u16*, float*, int, int, int, int);
E(gemm_pipe_bf16_sm_90a) E(gemm_pipe_bf16_sm_90a__n256) E(gemm_pipe_bf16_sm_90a__w8) E(gemm_pipe_bf16_sm_90a__wg) E(gemm_pipe_bf16_sm_90a__wg256)
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)
typedef void (*Fn)(const u16*, const u16*, float*, int, int, int, int);
struct K { const char* name; Fn fn; int bm, bn, threads, smem; };
__global__ void fillb(u16* p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 15; h *= 0x2c1b3c6du; h ^= h >> 12;
        float f = ((h & 0xffff) / 65536.f - 0.5f);
        unsigned b = __float_as_uint(f); p[i] = (u16)((b + 0x8000u) >> 16);
    }
}
int main(int argc, char** argv) {
    K ks[] = {{"w4 128x128", gemm_pipe_bf16_sm_90a, 128, 128, 128, 4 * 256 * 64},
              {"n256 128x256", gemm_pipe_bf16_sm_90a__n256, 128, 256, 256, 4 * 384 * 64},
              {"w8 128x128", gemm_pipe_bf16_sm_90a__w8, 128, 128, 256, 4 * 256 * 64},
              {"wg 128x128", gemm_pipe_bf16_sm_90a__wg, 128, 128, 256, 4 * 256 * 128 + 1024},
              {"wg256 128x256", gemm_pipe_bf16_sm_90a__wg256, 128, 256, 256, 4 * 384 * 128 + 1024}};
    for (auto& k : ks) CK(cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem));
    struct S { int m, n, k; } shapes[] = {{77, 200, 136}, {130, 264, 4096}, {512, 6144, 4096}, {512, 4096, 4096}, {512, 24576, 4096}, {512, 4096, 12288},
        {512, 30720, 3840}, {512, 3840, 15360}, {4096, 6144, 4096}, {4096, 24576, 4096}, {4096, 4096, 12288}};
    for (auto& s : shapes) {
        u16 *a, *w; float *c, *c0;
        CK(cudaMalloc(&a, (size_t)s.m * s.k * 2)); CK(cudaMalloc(&w, (size_t)s.n * s.k * 2));
        CK(cudaMalloc(&c, (size_t)s.m * s.n * 4)); CK(cudaMalloc(&c0, (size_t)s.m * s.n * 4));
        fillb<<<512, 256>>>(a, (size_t)s.m * s.k, 1); fillb<<<512, 256>>>(w, (size_t)s.n * s.k, 2);
        std::vector<float> ref((size_t)s.m * s.n), got((size_t)s.m * s.n);
        printf("M=%d N=%d K=%d (%.1f GFLOP)\n", s.m, s.n, s.k, 2.0 * s.m * s.n * s.k / 1e9);
        for (int ki = 0; ki < 5; ++ki) {
            auto& k = ks[ki];
            dim3 grid((s.m + k.bm - 1) / k.bm, (s.n + k.bn - 1) / k.bn);
            CK(cudaMemset(c, 0xff, (size_t)s.m * s.n * 4));
            k.fn<<<grid, k.threads, k.smem>>>(a, w, c, s.m, s.n, s.k, s.n);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(ki == 0 ? ref.data() : got.data(), c, (size_t)s.m * s.n * 4, cudaMemcpyDeviceToHost));
            double err = 0, mx = 0; long bad = 0;
            if (ki > 0) for (size_t i = 0; i < got.size(); ++i) { double d = fabs(got[i] - ref[i]); if (!(d <= 1e-3 * (1 + fabs(ref[i])))) ++bad; err = fmax(err, d); mx = fmax(mx, fabs(ref[i])); }
            cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
            int it = s.m * (long)s.n * s.k > 1e10 ? 20 : 100;
            for (int i = 0; i < 3; ++i) k.fn<<<grid, k.threads, k.smem>>>(a, w, c, s.m, s.n, s.k, s.n);
            cudaEventRecord(e0);
            for (int i = 0; i < it; ++i) k.fn<<<grid, k.threads, k.smem>>>(a, w, c, s.m, s.n, s.k, s.n);
            cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
            float ms; cudaEventElapsedTime(&ms, e0, e1);
            double us = ms * 1000 / it;
            printf("  %-14s %9.1f us %6.1f TFLOPS  maxerr %.2e (max %.1f) bad %ld\n", k.name, us, 2.0 * s.m * s.n * s.k / us / 1e6, err, mx, bad);
        }
        cudaFree(a); cudaFree(w); cudaFree(c); cudaFree(c0);
    }
}
