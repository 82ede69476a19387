#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cmath>
#include <cuda_runtime.h>

typedef unsigned short u16; typedef unsigned char u8;
extern "C" __global__ void gemm_pipe_bf16_sm_90a__wg(const u16*, const u16*, float*, int, int, int, int);
extern "C" __global__ void gemm_pipe_bf16_sm_90a__wg256(const u16*, const u16*, float*, int, int, int, int);
extern "C" __global__ void q4wg(const u16*, const u8*, float*, int, int, int, int);
extern "C" __global__ void q4wg256(const u16*, const u8*, float*, int, int, int, int);
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)
__global__ void fillb(u16* p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 15; h *= 0x2c1b3c6du; h ^= h >> 12;
        float f = ((h & 0xffff) / 65536.f - 0.5f); unsigned b = __float_as_uint(f); p[i] = (u16)((b + 0x8000u) >> 16);
    }
}
__global__ void fillq(u8* p, size_t nblocks, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nblocks; i += (size_t)gridDim.x * blockDim.x) {
        u8* b = p + i * 18;
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        for (int j = 0; j < 18; ++j) { h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15; b[j] = (u8)h; }
        u16 d = (u16)(0x2000 | (h & 0x3ff)); b[0] = d & 0xff; b[1] = d >> 8;
    }
}
__global__ void deq(const u8* w, u16* y, size_t nblocks) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nblocks; i += (size_t)gridDim.x * blockDim.x) {
        const u8* b = w + i * 18; float d; { unsigned short hb = (u16)(b[0] | (b[1] << 8)); asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(d) : "h"(hb)); }
        for (int j = 0; j < 32; ++j) {
            int q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
            float v = __fmul_rn(d, (float)(q - 8));
            unsigned u = __float_as_uint(v); u = u + 0x7fffu + ((u >> 16) & 1u); y[i * 32 + j] = (u16)(u >> 16);
        }
    }
}
int main() {
    cudaFuncSetAttribute(gemm_pipe_bf16_sm_90a__wg, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 256 * 128 + 1024);
    cudaFuncSetAttribute(gemm_pipe_bf16_sm_90a__wg256, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 384 * 128 + 1024);
    cudaFuncSetAttribute(q4wg, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 256 * 128 + 1024);
    cudaFuncSetAttribute(q4wg256, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 384 * 128 + 1024);
    struct S { int m, n, k; } shapes[] = {{77, 200, 128}, {130, 264, 4096}, {512, 6144, 4096}, {512, 4096, 4096}, {512, 24576, 4096}, {512, 4096, 12288},
        {512, 30720, 3840}, {512, 3840, 15360}, {4096, 6144, 4096}, {4096, 24576, 4096}};
    for (auto& s : shapes) {
        u16 *a, *w16; u8* wq; float* c;
        size_t nb = (size_t)s.n * s.k / 32;
        CK(cudaMalloc(&a, (size_t)s.m * s.k * 2)); CK(cudaMalloc(&w16, (size_t)s.n * s.k * 2)); CK(cudaMalloc(&wq, nb * 18));
        CK(cudaMalloc(&c, (size_t)s.m * s.n * 4));
        fillb<<<512, 256>>>(a, (size_t)s.m * s.k, 1); fillq<<<512, 256>>>(wq, nb, 5); deq<<<512, 256>>>(wq, w16, nb);
        CK(cudaDeviceSynchronize());
        std::vector<float> ref((size_t)s.m * s.n), got((size_t)s.m * s.n);
        printf("M=%d N=%d K=%d\n", s.m, s.n, s.k);
        for (int v = 0; v < 4; ++v) {
            int bn = (v & 1) ? 256 : 128;
            int smem = 4 * (128 + bn) * 128 + 1024;
            dim3 grid((s.m + 127) / 128, (s.n + bn - 1) / bn);
            auto launch = [&]() {
                if (v == 0) gemm_pipe_bf16_sm_90a__wg<<<grid, 256, smem>>>(a, w16, c, s.m, s.n, s.k, s.n);
                else if (v == 1) gemm_pipe_bf16_sm_90a__wg256<<<grid, 256, smem>>>(a, w16, c, s.m, s.n, s.k, s.n);
                else if (v == 2) q4wg<<<grid, 256, smem>>>(a, wq, c, s.m, s.n, s.k, s.n);
                else q4wg256<<<grid, 256, smem>>>(a, wq, c, s.m, s.n, s.k, s.n);
            };
            CK(cudaMemset(c, 0xff, (size_t)s.m * s.n * 4));
            launch(); CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(v == 0 ? ref.data() : got.data(), c, (size_t)s.m * s.n * 4, cudaMemcpyDeviceToHost));
            long bad = 0; double err = 0;
            if (v > 0) for (size_t i = 0; i < got.size(); ++i) { if (got[i] != ref[i]) ++bad; double d = fabs(got[i] - ref[i]); if (!(d <= err)) err = d; }
            cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
            int it = 20;
            launch(); cudaEventRecord(e0);
            for (int i = 0; i < it; ++i) launch();
            cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
            float ms; cudaEventElapsedTime(&ms, e0, e1);
            const char* nm[] = {"bf16 wg", "bf16 wg256", "q4 wg", "q4 wg256"};
            printf("  %-11s %8.1f us %6.1f TFLOPS  mismatches %ld maxdiff %.3g\n", nm[v], ms * 1000 / it, 2.0 * s.m * s.n * s.k / (ms * 1000 / it) / 1e6, bad, err);
        }
        cudaFree(a); cudaFree(w16); cudaFree(wq); cudaFree(c);
    }
}
