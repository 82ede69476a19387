// What one dependency between two decode kernels costs on the device, by mechanism.
//
// A chain of N kernels (or N phases of one kernel), each reading a value the one before wrote
// and writing the next, replayed as a CUDA graph; time per link. Mechanisms:
//   plain   - ordinary stream order (no programmatic launch)
//   pdl     - programmatic launch, griddepcontrol.wait then launch_dependents at entry (the
//             short decode kernels' order)
//   pdl_tr  - programmatic launch, launch_dependents at entry then the wait (the GEMVs' order)
//   flag    - programmatic launch, launch_dependents at entry, no griddepcontrol.wait: each
//             block spins on the previous kernel's arrival counter (every block of a kernel
//             fences and adds 1 when done), counters zeroed by a memset node per replay
//   persist - one kernel of G blocks, N phases separated by a grid barrier (arrival counter)
// Grid sizes G: 8 (attention-like), 132, 528 (GEMV-like, 4 blocks an SM).
//
// nvcc -O3 -arch=sm_90a -o sync_latency sync_latency.cu && ./sync_latency
#include <cstdio>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
    printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// every block: thread 0 reads buf[i - 1] (written by block 0 of the previous link), block 0
// writes buf[i]
__device__ __forceinline__ void link(int* buf, int i) {
    if (threadIdx.x == 0) {
        const int v = i > 0 ? ((volatile int*)buf)[i - 1] : 0;
        if (blockIdx.x == 0) buf[i] = v + 1;
    }
}

__global__ void k_plain(int* buf, int i) { link(buf, i); }

__global__ void k_pdl(int* buf, int i) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    link(buf, i);
}

__global__ void k_pdl_tr(int* buf, int i) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    link(buf, i);
}

__global__ void k_flag(int* buf, unsigned* cnt, int i, unsigned nprev) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (threadIdx.x == 0) {
        int v = 0;
        if (i > 0) {
            while (ld_acquire(cnt + i - 1) < nprev) {}
            v = ((volatile int*)buf)[i - 1];
        }
        if (blockIdx.x == 0) buf[i] = v + 1;
        __threadfence();
        atomicAdd(cnt + i, 1u);
    }
}

__global__ void k_persist(int* buf, unsigned* bar, int n) {
    const unsigned g = gridDim.x;
    for (int i = 0; i < n; ++i) {
        if (threadIdx.x == 0) {
            const int v = i > 0 ? ((volatile int*)buf)[i - 1] : 0;
            if (blockIdx.x == 0) buf[i] = v + 1;
            __threadfence();
            atomicAdd(bar, 1u);
            const unsigned target = g * (unsigned)(i + 1);
            while (ld_acquire(bar) < target) {}
        }
        __syncthreads();
    }
}

static void launch(const void* fn, int g, void** args, bool pdl, cudaStream_t s) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(g);
    cfg.blockDim = dim3(128);
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelExC(&cfg, fn, args));
}

int main() {
    const int N = 400;
    int* buf;
    unsigned* cnt;
    CK(cudaMalloc(&buf, N * sizeof(int)));
    CK(cudaMalloc(&cnt, (N + 1) * sizeof(unsigned)));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const char* names[] = {"plain", "pdl", "pdl_tr", "flag", "persist"};
    for (int g : {8, 132, 528}) {
        for (int m = 0; m < 5; ++m) {
            if (m == 4 && g > 132 * 4) continue;
            cudaGraph_t graph;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            CK(cudaMemsetAsync(cnt, 0, (N + 1) * sizeof(unsigned), s));
            if (m == 4) {
                int n = N;
                void* args[] = {&buf, &cnt, &n};
                launch((const void*)k_persist, g, args, false, s);
            } else {
                for (int i = 0; i < N; ++i) {
                    unsigned nprev = g;
                    void* a1[] = {&buf, &i};
                    void* a2[] = {&buf, &cnt, &i, &nprev};
                    if (m == 0) launch((const void*)k_plain, g, a1, false, s);
                    if (m == 1) launch((const void*)k_pdl, g, a1, i > 0, s);
                    if (m == 2) launch((const void*)k_pdl_tr, g, a1, i > 0, s);
                    if (m == 3) launch((const void*)k_flag, g, a2, i > 0, s);
                }
            }
            CK(cudaStreamEndCapture(s, &graph));
            cudaGraphExec_t ex;
            CK(cudaGraphInstantiate(&ex, graph, 0));
            for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(ex, s));
            CK(cudaStreamSynchronize(s));
            const int reps = 20;
            CK(cudaEventRecord(e0, s));
            for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(ex, s));
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            int last;
            CK(cudaMemcpy(&last, buf + N - 1, sizeof(int), cudaMemcpyDeviceToHost));
            printf("G %4d %-8s %7.3f us per link (chain value %d, want %d)\n", g, names[m],
                   ms * 1000.f / reps / N, last, N);
            CK(cudaGraphExecDestroy(ex));
            CK(cudaGraphDestroy(graph));
        }
    }
    return 0;
}
