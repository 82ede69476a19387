#include "emu.h"
#include <random>
#include "dense.inc"
// the GPU-verified bf16 gemm through the emulator: checks the emulated ldmatrix / mma layouts
int main() {
    std::mt19937 r(1);
    int M = 70, N = 100, K = 96;
    std::vector<u16> A(M * K), W(N * K);
    for (auto& v : A) v = f32_to_bf16_host((r() % 2000) / 1000.0f - 1);
    for (auto& v : W) v = f32_to_bf16_host((r() % 2000) / 1000.0f - 1);
    std::vector<float> C(M * N, NAN);
    launch((N + 63) / 64, (M + 63) / 64, 128, [&] { kdense((const u8*)A.data(), (const u8*)W.data(), C.data(), M, N, K, nullptr, nullptr, 0); });
    double worst = 0;
    for (int m = 0; m < M; ++m) for (int n = 0; n < N; ++n) { double s = 0; for (int k = 0; k < K; ++k) s += (double)bf16f(A[m*K+k]) * bf16f(W[n*K+k]); worst = std::max(worst, std::fabs(s - C[m*N+n])); }
    printf("gemm bf16 (GPU-verified kernel) through the emulator: max abs err %.3e\n", worst);
    return worst < 1e-4 ? 0 : 1;
}
