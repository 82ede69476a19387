// Host check of the grouped MoE kernels: see README.md (build through run.sh).
#include "emu.h"
#include <random>
#include <algorithm>
#include <map>
#include <string>
namespace grp {
#include "group.inc"
}
#include GEMM_INC

static std::mt19937_64 rng(12345);
static double uni(double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng); }

// ---- reference dequantisers (ports of src/quant/ggml.rs) ----
static float h16(const u8* b) { return f16_to_f32((u16)(b[0] | (b[1] << 8))); }
static void kscalemin(const u8* s, int j, u8& sc, u8& m) {
    if (j < 4) { sc = s[j] & 63; m = s[j + 4] & 63; }
    else { sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4); m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4); }
}
static int BE, BB;
static void deq_block(const u8* b, float* o) {
    if (QK == 0) { // q4_0
        float d = h16(b);
        for (int j = 0; j < 16; ++j) { o[j] = d * (float)((int)(b[2 + j] & 15) - 8); o[j + 16] = d * (float)((int)(b[2 + j] >> 4) - 8); }
    } else if (QK == 1) { // q8_0
        float d = h16(b);
        for (int j = 0; j < 32; ++j) o[j] = d * (float)(i8)b[2 + j];
    } else if (QK == 2) { // q4_k
        float d = h16(b), dmin = h16(b + 2);
        const u8* sc = b + 4; const u8* qs = b + 16;
        for (int c = 0; c < 4; ++c) for (int half = 0; half < 2; ++half) {
            u8 s, m; kscalemin(sc, 2 * c + half, s, m);
            float dl = d * (float)s, ml = dmin * (float)m;
            for (int l = 0; l < 32; ++l) { u8 q = qs[c * 32 + l]; u8 v = half ? (q >> 4) : (q & 15); volatile float p = dl * (float)v; o[c * 64 + half * 32 + l] = p - ml; }
        }
    } else { // q6_k
        const u8* ql0 = b; const u8* qh0 = b + 128; const u8* sc = b + 192; float d = h16(b + 208);
        for (int half = 0; half < 2; ++half) {
            const u8* ql = ql0 + half * 64; const u8* qh = qh0 + half * 32;
            for (int l = 0; l < 32; ++l) {
                int q[4] = {((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32, ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32,
                            ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32, ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32};
                for (int k = 0; k < 4; ++k) { int idx = half * 128 + k * 32 + l; volatile float ds = d * (float)(i8)sc[idx / 16]; o[idx] = ds * (float)q[k]; }
            }
        }
    }
}
static size_t row_bytes(int k) { return (size_t)(k / BE) * BB; }
static std::vector<float> deq_rows(const u8* p, int rows, int cols) {
    std::vector<float> o((size_t)rows * cols);
    for (int r = 0; r < rows; ++r) for (int b = 0; b < cols / BE; ++b) deq_block(p + r * row_bytes(cols) + b * BB, &o[(size_t)r * cols + b * BE]);
    return o;
}
static u8* random_bank(int rows, int cols) {
    size_t n = (size_t)rows * row_bytes(cols);
    u8* p; if (posix_memalign((void**)&p, 256, n + 256)) abort();
    for (size_t i = 0; i < n; ++i) p[i] = rng() & 0xff;
    for (size_t b = 0; b < n / BB; ++b) {
        u8* blk = p + b * BB;
        auto pos = [&]() { return (u16)(0x068E + rng() % (0x1419 - 0x068E)); };
        auto put = [&](u8* at, u16 v) { at[0] = v & 0xff; at[1] = v >> 8; };
        if (QK == 2) { put(blk, pos()); put(blk + 2, pos()); }
        else if (QK == 3) put(blk + 208, pos());
        else { u16 v = (u16)(0x068E + rng() % (0x2000 - 0x068E)); put(blk, v | ((rng() & 1) << 15)); }
    }
    return p;
}

struct Metric { double max_rel = 0; long unwritten = 0; long n = 0; };
static Metric compare(const std::vector<float>& got, const std::vector<float>& want) {
    Metric m; m.n = want.size();
    double ss = 0; for (float w : want) ss += (double)w * w;
    double rms = std::max(std::sqrt(ss / std::max<size_t>(1, want.size())), 1e-30);
    for (size_t i = 0; i < want.size(); ++i) {
        if (std::isnan(got[i])) { m.unwritten++; continue; }
        double e = got[i] == want[i] ? 0 : std::fabs((double)got[i] - want[i]) / std::max((double)std::fabs(want[i]), rms);
        m.max_rel = std::max(m.max_rel, e);
    }
    return m;
}

static int fails = 0;
static void expect(bool ok, const std::string& what) { if (!ok) { printf("FAIL: %s\n", what.c_str()); fails++; } }

static long max_tiles_of(long pairs, long e, long bm) { return (pairs + std::min(e, pairs) * (bm - 1)) / bm; }

struct GroupOut { std::vector<int> perm, offs; std::vector<int4> tiles; long max_tiles; };
static GroupOut run_group(const std::vector<int>& ids, int E, int bm) {
    GroupOut g; int pairs = ids.size();
    g.max_tiles = max_tiles_of(pairs, E, bm);
    g.perm.assign(pairs, -7); g.offs.assign(E + 1, -7); g.tiles.assign(g.max_tiles, int4{9, 9, 9, 9});
    launch(1, 1, 1024, [&] { grp::kgroup(ids.data(), g.perm.data(), g.offs.data(), g.tiles.data(), pairs, E, bm, (int)g.max_tiles); });
    // reference
    std::vector<int> cnt(E, 0); for (int id : ids) if (id >= 0 && id < E) cnt[id]++;
    std::vector<int> offs(E + 1, 0); for (int e = 0; e < E; ++e) offs[e + 1] = offs[e] + cnt[e];
    expect(g.offs == offs, "group offs");
    std::vector<int4> tiles;
    for (int e = 0; e < E; ++e) for (int r = offs[e]; r < offs[e + 1]; r += bm) tiles.push_back({e, r, std::min(r + bm, offs[e + 1]), 0});
    expect((long)tiles.size() <= g.max_tiles, "tile bound");
    while ((long)tiles.size() < g.max_tiles) tiles.push_back({-1, 0, 0, 0});
    for (long t = 0; t < g.max_tiles; ++t) expect(!memcmp(&tiles[t], &g.tiles[t], 16), "tile " + std::to_string(t) + " got " + std::to_string(g.tiles[t].x) + "," + std::to_string(g.tiles[t].y) + "," + std::to_string(g.tiles[t].z) + " want " + std::to_string(tiles[t].x) + "," + std::to_string(tiles[t].y) + "," + std::to_string(tiles[t].z));
    std::vector<int> seen(pairs, 0);
    for (int i = 0; i < pairs; ++i) { int p = g.perm[i]; expect(p >= 0 && p < pairs && !seen[p], "perm permutation"); if (p >= 0 && p < pairs) seen[p] = 1;
        int id = ids[p]; int want_e = -1; for (int e = 0; e < E; ++e) if (offs[e] <= i && i < offs[e + 1]) want_e = e;
        int got_e = (id >= 0 && id < E) ? id : -1; expect(got_e == want_e, "perm expert at " + std::to_string(i)); }
    return g;
}

static std::vector<int> ids_with(const std::vector<int>& counts, const std::vector<int>& extra) {
    std::vector<int> ids; for (size_t e = 0; e < counts.size(); ++e) for (int c = 0; c < counts[e]; ++c) ids.push_back(e);
    for (int v : extra) ids.push_back(v);
    std::shuffle(ids.begin(), ids.end(), rng);
    return ids;
}

static float silu(float g) { return g * (1.0f / (1.0f + std::exp(-g))); }
static float gelu(float x) { const float C = 0.7978846f; return 0.5f * x * (1.0f + std::tanh(C * (x + 0.044715f * x * x * x))); }

static void gemm_case(const std::vector<int>& counts, int top_k, int hid, int ff, int out, int act, int sample) {
    int E = counts.size();
    auto ids = ids_with(counts, {});
    int pairs = ids.size(); int n = (pairs + top_k - 1) / top_k;
    auto g = run_group(ids, E, 64);
    u8* gate = random_bank(E * ff, hid); u8* up = random_bank(E * ff, hid); u8* down = random_bank(E * out, ff);
    long long eb = (long long)ff * row_bytes(hid), ebd = (long long)out * row_bytes(ff);
    std::vector<u16> x((size_t)n * hid); for (auto& v : x) v = f32_to_bf16_host((float)uni(-1, 1));
    u16* xa; if (posix_memalign((void**)&xa, 256, x.size() * 2 + 16)) abort(); memcpy(xa, x.data(), x.size() * 2);
    std::vector<u16> H((size_t)pairs * ff, 0xffff); std::vector<float> D((size_t)pairs * out, NAN);
    u16* Hp; if (posix_memalign((void**)&Hp, 256, H.size() * 2 + 16)) abort(); memcpy(Hp, H.data(), H.size() * 2);
    launch(g.max_tiles, ff / 32, 128, [&] { kgemm(xa, g.perm.data(), top_k, g.tiles.data(), gate, up, eb, Hp, ff, hid, act); });
    launch(g.max_tiles, (out + 63) / 64, 128, [&] { kgemm__down(Hp, g.perm.data(), g.tiles.data(), down, ebd, D.data(), out, ff); });
    memcpy(H.data(), Hp, H.size() * 2);
    std::vector<float> hg, hw, dg, dw; long unH = 0, unD = 0;
    for (auto v : H) if (std::isnan(bf16f(v))) unH++;
    for (auto v : D) if (std::isnan(v)) unD++;
    std::map<int, std::vector<float>> cg, cu, cd;
    for (int i = 0; i < pairs; ++i) {
        if (sample && i % sample) continue;
        int p = g.perm[i], e = ids[p], tok = p / top_k;
        if (!cg.count(e)) {
            auto r = [&](u8* b, int rows, int cols, long long ebb) { auto v = deq_rows(b + e * ebb, rows, cols); for (auto& f : v) f = bf16f(f32_to_bf16_host(f)); return v; };
            cg[e] = r(gate, ff, hid, eb); cu[e] = r(up, ff, hid, eb); cd[e] = r(down, out, ff, ebd);
        }
        for (int j = 0; j < ff; ++j) {
            double sg = 0, su = 0;
            for (int k = 0; k < hid; ++k) { double xv = bf16f(x[(size_t)tok * hid + k]); sg += xv * cg[e][(size_t)j * hid + k]; su += xv * cu[e][(size_t)j * hid + k]; }
            float a = act == 0 ? silu((float)sg) : gelu((float)sg);
            hw.push_back(a * (float)su); hg.push_back(bf16f(H[(size_t)i * ff + j]));
        }
        for (int c = 0; c < out; ++c) {
            double s = 0; for (int k = 0; k < ff; ++k) s += (double)bf16f(H[(size_t)i * ff + k]) * cd[e][(size_t)c * ff + k];
            dw.push_back((float)s); dg.push_back(D[(size_t)p * out + c]);
        }
    }
    auto mh = compare(hg, hw), md = compare(dg, dw);
    printf("  case E=%d pairs=%d hid=%d ff=%d out=%d act=%d: h max rel %.3e (unwritten %ld/%ld), d max rel %.3e (unwritten %ld/%ld)\n",
           E, pairs, hid, ff, out, act, mh.max_rel, unH + mh.unwritten, (long)H.size(), md.max_rel, unD + md.unwritten, (long)D.size());
    expect(mh.max_rel < 5e-3 && unH == 0 && mh.unwritten == 0, "h");
    expect(md.max_rel < 1e-4 && unD == 0 && md.unwritten == 0, "d");
}

int main() {
    BE = (QK >= 2) ? 256 : 32; BB = QK == 0 ? 18 : QK == 1 ? 34 : QK == 2 ? 144 : 210;
    printf("moe_gemm %s\n", QK == 0 ? "q4_0" : QK == 1 ? "q8_0" : QK == 2 ? "q4_k" : "q6_k");
    // grouping alone
    run_group(ids_with({0, 1, 77, 5, 64, 15}, {-1, 6, 1000}), 6, 64);
    run_group(ids_with({0, 0, 3, 0, 0, 1, 4}, {}), 256, 64);
    { std::vector<int> c(16); for (int e = 0; e < 16; ++e) c[e] = e == 3 ? 2000 : 125 + 7 * e; run_group(ids_with(c, {}), 16, 64); }
    { std::vector<int> ids(4096); for (auto& v : ids) v = rng() % 128; run_group(ids, 128, 64); }
    bool kq = QK >= 2;
    int hid = kq ? 512 : 96, ff = kq ? 256 : 96, out = kq ? 200 : 100;
    gemm_case({0, 1, 77, 5, 64, 15}, 2, hid, ff, out, 0, 0);
    gemm_case({130, 0, 3, 0, 33, 2}, 2, hid, ff, out, 1, 0);
    gemm_case({3, 40}, 8, kq ? 768 : 160, kq ? 256 : 64, 130, 0, 0);
    gemm_case({16, 32, 48, 17, 31, 49}, 1, hid, ff, out, 0, 0);
    gemm_case({70, 1}, 4, 2048, kq ? 768 : 224, 2048, 1, 7);
    printf("%s (%d failures)\n", fails ? "FAILED" : "ok", fails);
    return fails ? 1 : 0;
}
