// Concurrency probe: wgmma GEMM on one stream, dequant_bf16 Q4_0 of another weight on a second.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
typedef unsigned short u16; typedef unsigned char u8;
extern "C" __global__ void gemm_pipe_bf16_sm_90a__wg(const u16*, const u16*, float*, int, int, int, int);
extern "C" __global__ void gemm_pipe_bf16_sm_90a__wg256(const u16*, const u16*, float*, int, int, int, int);
extern "C" __global__ void dequant_bf16_q4_0_sm_90a(const u8*, u16*, long long);
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)
int main() {
    CK(cudaFuncSetAttribute(gemm_pipe_bf16_sm_90a__wg, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 256 * 128 + 1024));
    CK(cudaFuncSetAttribute(gemm_pipe_bf16_sm_90a__wg256, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 384 * 128 + 1024));
    const int M = 512;
    u16 *a, *w; float* c; u8* wq; u16* scr;
    CK(cudaMalloc(&a, (size_t)M * 12288 * 2)); CK(cudaMalloc(&w, (size_t)24576 * 4096 * 2)); CK(cudaMalloc(&c, (size_t)M * 24576 * 4));
    CK(cudaMalloc(&wq, (size_t)24576 * 4096 / 32 * 18)); CK(cudaMalloc(&scr, (size_t)24576 * 4096 * 2));
    CK(cudaMemset(a, 0, (size_t)M * 12288 * 2)); CK(cudaMemset(w, 0, (size_t)24576 * 4096 * 2)); CK(cudaMemset(wq, 0, (size_t)24576 * 4096 / 32 * 18));
    cudaStream_t s1, s2; cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking); cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    struct P { const char* what; int n, k, big; long long dq_elems; } ps[] = {
        {"GEMM O (4096x4096, wg) || dequant gate/up (24576x4096)", 4096, 4096, 0, 24576LL * 4096},
        {"GEMM QKV (6144x4096, wg256) || dequant O (4096x4096)", 6144, 4096, 1, 4096LL * 4096},
        {"GEMM gate/up (24576x4096, wg256) || dequant down (4096x12288)", 24576, 4096, 1, 4096LL * 12288},
        {"GEMM down (4096x12288, wg) || dequant QKV (6144x4096)", 4096, 12288, 0, 6144LL * 4096},
    };
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    for (auto& p : ps) {
        int bn = p.big ? 256 : 128, smem = 4 * (128 + bn) * 128 + 1024;
        dim3 grid((M + 127) / 128, (p.n + bn - 1) / bn);
        auto gemm = [&](cudaStream_t s) {
            if (p.big) gemm_pipe_bf16_sm_90a__wg256<<<grid, 256, smem, s>>>(a, w, c, M, p.n, p.k, p.n);
            else gemm_pipe_bf16_sm_90a__wg<<<grid, 256, smem, s>>>(a, w, c, M, p.n, p.k, p.n);
        };
        long long groups = p.dq_elems / 8;
        auto deq = [&](cudaStream_t s) { dequant_bf16_q4_0_sm_90a<<<(unsigned)((groups + 255) / 256), 256, 0, s>>>(wq, scr, groups); };
        auto timed = [&](int mode) {
            const int it = 20;
            for (int i = 0; i < 3; ++i) { if (mode != 1) gemm(s1); if (mode != 0) deq(mode == 2 ? s2 : s1); }
            CK(cudaDeviceSynchronize());
            cudaEventRecord(e0, s1); cudaStreamWaitEvent(s2, e0, 0);
            for (int i = 0; i < it; ++i) {
                if (mode != 1) gemm(s1);
                if (mode != 0) deq(mode == 2 ? s2 : s1);
                if (mode == 2) { cudaEvent_t ev; cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); cudaEventRecord(ev, s2); cudaStreamWaitEvent(s1, ev, 0); cudaEventRecord(ev, s1); cudaStreamWaitEvent(s2, ev, 0); cudaEventDestroy(ev); }
            }
            cudaEventRecord(e1, s1); CK(cudaEventSynchronize(e1)); CK(cudaDeviceSynchronize());
            float ms; cudaEventElapsedTime(&ms, e0, e1); return ms * 1000 / it;
        };
        float g = timed(0), d = timed(1), seq = timed(3), con = timed(2);
        printf("%s\n  gemm %.1f us, dequant %.1f us, sequential %.1f us, concurrent %.1f us (saved %.1f of %.1f)\n", p.what, g, d, seq, con, seq - con, d < g ? d : g);
    }
}
