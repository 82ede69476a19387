// kernel_trace.c: a CUDA injection library that records when every kernel ran, CUDA graph
// nodes included, through CUPTI's activity API (nsys is not installed on the GPU machine).
//
// Build (here, with the CUPTI and CUDA runtime wheels unzipped into N; see README.md):
//   gcc -O2 -shared -fPIC -IN/nvidia/cu13/include benches/nvcc/kernel_trace.c (continued:)
//       -o kernel_trace.so -LN/nvidia/cu13/lib -l:libcupti.so.13
// Run (there):
//   LD_LIBRARY_PATH=/usr/local/cuda/extras/CUPTI/lib64:$LD_LIBRARY_PATH (and:)
//   CUDA_INJECTION64_PATH=$PWD/kernel_trace.so KERNEL_TRACE_OUT=trace.csv fucina bench ...
// Output: one line per kernel, `start_ns,end_ns,graph_id,graph_node_id,grid_x,grid_y,
// grid_z,block_x,registers,name`, in the order CUPTI delivers its buffers (sort by start).
// KERNEL_TRACE_SKIP=N drops the first N kernels (warm-up, prefill) to keep the file small.
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF_BYTES (16u << 20)

static FILE *out;
// KERNEL_TRACE_API_OUT=PATH: also every driver API call of at least KERNEL_TRACE_API_MIN_NS
// (default 20000) as `start_ns,end_ns,name` (which call stalls the host between two steps).
static FILE *api_out;
static unsigned long long api_min_ns = 20000;
static unsigned long long seen, skip;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = (uint8_t *)aligned_alloc(8, BUF_BYTES);
    *size = *buffer ? BUF_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *r = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_DRIVER && api_out) {
            const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)r;
            if (a->end - a->start >= api_min_ns) {
                const char *name = NULL;
                cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, &name);
                fprintf(api_out, "%llu,%llu,%s\n", (unsigned long long)a->start,
                        (unsigned long long)a->end, name ? name : "?");
            }
            continue;
        }
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        if (seen++ < skip || !out) continue;
        fprintf(out, "%llu,%llu,%u,%llu,%d,%d,%d,%d,%u,%s\n", (unsigned long long)k->start,
                (unsigned long long)k->end, k->graphId, (unsigned long long)k->graphNodeId, k->gridX,
                k->gridY, k->gridZ, k->blockX, (unsigned)k->registersPerThread,
                k->name ? k->name : "?");
    }
    free(buffer);
}

static void flush_at_exit(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (out) fclose(out);
    out = NULL;
    if (api_out) fclose(api_out);
    api_out = NULL;
}

// Called by the CUDA driver when CUDA_INJECTION64_PATH names this library.
int InitializeInjection(void) {
    const char *path = getenv("KERNEL_TRACE_OUT");
    const char *s = getenv("KERNEL_TRACE_SKIP");
    skip = s ? strtoull(s, NULL, 10) : 0;
    out = fopen(path ? path : "kernel_trace.csv", "w");
    if (!out) return 0;
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) return 0;
    if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) return 0;
    const char *api = getenv("KERNEL_TRACE_API_OUT");
    if (api && (api_out = fopen(api, "w"))) {
        const char *m = getenv("KERNEL_TRACE_API_MIN_NS");
        if (m) api_min_ns = strtoull(m, NULL, 10);
        if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER) != CUPTI_SUCCESS) return 0;
    }
    atexit(flush_at_exit);
    return 1;
}
