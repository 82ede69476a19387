// Host emulation of the CUDA subset the MoE kernels use: one block at a time, each thread a
// ucontext fiber, barriers (block and warp) by cooperative yielding, warp collectives
// (ldmatrix.x4, mma.sync m16n8k16 bf16, shfl_up) per the PTX ISA fragment layouts.
#pragma once
#include <ucontext.h>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <functional>

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char i8;

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define INFINITY_ (1.0f/0.0f)

struct Dim3 { unsigned x = 0, y = 0, z = 0; };
struct int4 { int x, y, z, w; };
struct uint4 { u32 x, y, z, w; };
struct float2 { float x, y; };
static inline int4 make_int4(int a, int b, int c, int d) { return {a, b, c, d}; }
static inline uint4 make_uint4(u32 a, u32 b, u32 c, u32 d) { return {a, b, c, d}; }

static Dim3 threadIdx, blockIdx, blockDim, gridDim;

// ---- fibers ----
struct Fiber { ucontext_t ctx; bool done = false; char* stack = nullptr; };
static std::vector<Fiber> g_f;
static ucontext_t g_sched;
static int g_cur = 0;
static std::function<void()> g_body;
static void yield_() { swapcontext(&g_f[g_cur].ctx, &g_sched); }
static void fiber_main() {
    g_body();
    g_f[g_cur].done = true;
}
struct Bar { int count = 0; long gen = 0; };
static Bar g_block_bar;
static Bar g_warp_bar[32];
static void barrier(Bar& b, int n) {
    long g = b.gen;
    if (++b.count == n) { b.count = 0; b.gen++; }
    else { while (b.gen == g) yield_(); }
}
static void __syncthreads() { barrier(g_block_bar, blockDim.x); }
static inline int wid() { return threadIdx.x / 32; }
static inline int lid() { return threadIdx.x % 32; }
static void warp_sync() { barrier(g_warp_bar[wid()], 32); }

static const size_t STACK = 64 * 1024;
// run `body` as one block of `threads` threads at block index (bx, by)
static void run_block(unsigned bx, unsigned by, unsigned threads, std::function<void()> body) {
    blockIdx.x = bx; blockIdx.y = by; blockDim.x = threads; blockDim.y = blockDim.z = 1;
    g_block_bar = Bar{};
    for (auto& w : g_warp_bar) w = Bar{};
    static std::vector<char*> stacks;
    while (stacks.size() < threads) stacks.push_back((char*)malloc(STACK));
    g_f.assign(threads, Fiber{});
    g_body = body;
    for (unsigned i = 0; i < threads; ++i) {
        g_f[i].stack = stacks[i];
        getcontext(&g_f[i].ctx);
        g_f[i].ctx.uc_stack.ss_sp = g_f[i].stack;
        g_f[i].ctx.uc_stack.ss_size = STACK;
        g_f[i].ctx.uc_link = &g_sched;
        makecontext(&g_f[i].ctx, fiber_main, 0);
    }
    for (;;) {
        bool any = false;
        for (unsigned i = 0; i < threads; ++i) {
            if (g_f[i].done) continue;
            any = true;
            g_cur = i;
            threadIdx.x = i;
            swapcontext(&g_sched, &g_f[i].ctx);
        }
        if (!any) break;
    }
}
template <class F>
static void launch(unsigned gx, unsigned gy, unsigned threads, F body) {
    gridDim.x = gx; gridDim.y = gy; gridDim.z = 1;
    for (unsigned by = 0; by < gy; ++by)
        for (unsigned bx = 0; bx < gx; ++bx) run_block(bx, by, threads, body);
}

// ---- scalar builtins ----
static inline float __uint_as_float(u32 u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline u32 __float_as_uint(float f) { u32 u; memcpy(&u, &f, 4); return u; }
static inline u32 __byte_perm(u32 x, u32 y, u32 s) {
    u64 v = (u64)x | ((u64)y << 32);
    u32 r = 0;
    for (int i = 0; i < 4; ++i) {
        u32 sel = (s >> (4 * i)) & 7;
        r |= (u32)((v >> (8 * sel)) & 0xff) << (8 * i);
    }
    return r;
}
static inline u32 __funnelshift_r(u32 lo, u32 hi, u32 sh) {
    sh &= 31;
    u64 v = (u64)lo | ((u64)hi << 32);
    return (u32)(v >> sh);
}
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline int atomicAdd(int* p, int v) { int o = *p; *p += v; return o; }

static float f16_to_f32(u16 h) {
    u32 s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = std::ldexp((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY_;
    else v = std::ldexp((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}
static u16 f32_to_bf16_host(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}
static inline u32 host_bf16x2(float lo, float hi) {
    return (u32)f32_to_bf16_host(lo) | ((u32)f32_to_bf16_host(hi) << 16);
}
static inline float bf16f(u16 b) { return __uint_as_float((u32)b << 16); }

// ---- lib functions the templates include ----
#define LO4 0x0f0f0f0fu
static void k_scale_min_pair(const u32* sc, int c, float& s0, float& m0, float& s1, float& m1) {
    const bool lo = c < 2;
    const u32 sw = lo ? (sc[0] & 0x3f3f3f3fu) : ((sc[2] & 0x0f0f0f0fu) | ((sc[0] >> 2) & 0x30303030u));
    const u32 mw = lo ? (sc[1] & 0x3f3f3f3fu) : (((sc[2] >> 4) & 0x0f0f0f0fu) | ((sc[1] >> 2) & 0x30303030u));
    const int sh = (c & 1) * 16;
    s0 = (float)((sw >> sh) & 0xffu);
    s1 = (float)((sw >> (sh + 8)) & 0xffu);
    m0 = (float)((mw >> sh) & 0xffu);
    m1 = (float)((mw >> (sh + 8)) & 0xffu);
}
static void cp_async16(void* smem, const void* gmem, int src_bytes) {
    memcpy(smem, gmem, src_bytes);
    memset((u8*)smem + src_bytes, 0, 16 - src_bytes);
}
static void cp_async_commit() {}
template <int N> static void cp_async_wait() {}

// ---- warp collectives ----
struct WarpStage { const void* addr[32]; u32 a[32][4]; u32 b[32][2]; int iv[32]; };
static WarpStage g_ws[32];
static void ldmatrix_x4(u32* r, const void* p) {
    WarpStage& s = g_ws[wid()];
    const int l = lid();
    s.addr[l] = p;
    warp_sync();
    for (int m = 0; m < 4; ++m) {
        const u8* row = (const u8*)s.addr[8 * m + l / 4];
        memcpy(&r[m], row + 4 * (l % 4), 4);
    }
    warp_sync();
}
static float frag_bf16(u32 w, int half) { return bf16f((u16)(half ? (w >> 16) : (w & 0xffff))); }
static void mma_bf16_16816(float* d, const u32* a, const u32* b) {
    WarpStage& s = g_ws[wid()];
    const int l = lid();
    for (int i = 0; i < 4; ++i) s.a[l][i] = a[i];
    for (int i = 0; i < 2; ++i) s.b[l][i] = b[i];
    warp_sync();
    auto A = [&](int r, int k) {
        const int lane = (r % 8) * 4 + (k % 8) / 2;
        const int reg = (r < 8 ? 0 : 1) + (k < 8 ? 0 : 2);
        return frag_bf16(s.a[lane][reg], k % 2);
    };
    auto B = [&](int k, int c) {
        const int lane = c * 4 + (k % 8) / 2;
        return frag_bf16(s.b[lane][k < 8 ? 0 : 1], k % 2);
    };
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i) {
        const int r = g + (i >= 2 ? 8 : 0), c = 2 * t + (i % 2);
        float acc = d[i];
        for (int k = 0; k < 16; ++k) acc += A(r, k) * B(k, c);
        d[i] = acc;
    }
    warp_sync();
}
static int __shfl_up_sync(unsigned, int v, int delta) {
    WarpStage& s = g_ws[wid()];
    const int l = lid();
    s.iv[l] = v;
    warp_sync();
    int r = l >= delta ? s.iv[l - delta] : v;
    warp_sync();
    return r;
}
