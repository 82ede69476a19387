//! L1 (libnvrtc only, no GPU): every manifest instance compiles for its arch (so every
//! sm_121a instance is checked in CI), every lib macro compiles on every arch, the PTX of the
//! representative set (`ptx_snapshot = true`) for sm_90a and sm_121a is an insta snapshot with
//! NVRTC's version lines removed (`snapshots/ptx/<name>.snap`), and every instance's PTX hash
//! is in one lock (`snapshots/ptx/ptx_lock.snap`): any drift fails, naming the instance.

mod common;

use codegen::ptx::{self, CacheConfig, Job, PtxCache};
use codegen::SmArch;

fn test_cache() -> PtxCache {
    // Under target/: re-runs hit the cache, and the key includes the source hash.
    let root = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ptx-cache");
    PtxCache::new(CacheConfig {
        root,
        strict: false,
    })
}

#[test]
fn every_instance_compiles_and_representative_ptx_matches_snapshots() {
    if !common::nvrtc_or_skip("ptx snapshots") {
        return;
    }
    let rendered = codegen::render_all(&common::templates_dir()).unwrap();
    let names: Vec<String> = rendered.iter().map(|(i, _)| i.name()).collect();
    let jobs: Vec<Job<'_>> = rendered
        .iter()
        .zip(&names)
        .map(|((i, src), name)| Job {
            name,
            source: src,
            arch: i.key.arch,
        })
        .collect();
    let cache = test_cache();
    let ptxs = ptx::compile_many(&cache, &jobs, false).unwrap_or_else(|e| panic!("{e}"));
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("snapshots/ptx");
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    let mut snapped = 0;
    settings.bind(|| {
        for (((inst, _), name), p) in rendered.iter().zip(&names).zip(&ptxs) {
            assert!(
                p.contains(&format!(".entry {name}(")),
                "{name}: entry missing in PTX"
            );
            assert!(
                p.contains(&format!(".target {}", inst.key.arch)),
                "{name}: wrong target"
            );
            if codegen::snapshots::ptx_snapshotted(inst) {
                insta::assert_snapshot!(name.as_str(), ptx::normalize_ptx(p));
                snapped += 1;
            }
        }
        let lock = codegen::snapshots::ptx_lock(
            names.iter().cloned().zip(ptxs.iter().map(String::as_str)),
        );
        insta::assert_snapshot!("ptx_lock", lock);
    });
    assert!(
        snapped > 0,
        "no representative PTX set (ptx_snapshot = true) for sm_90a/sm_121a"
    );
}

/// Every lib macro, instantiated once in a dummy kernel that calls its functions, compiles for
/// every arch (lib code no instance uses yet would otherwise go unchecked).
#[test]
fn lib_macros_compile_on_every_arch() {
    if !common::nvrtc_or_skip("lib macros") {
        return;
    }
    let mut templates = codegen::render::read_templates(&common::templates_dir()).unwrap();
    templates.push(("ops/libcheck.cu.tera".into(), LIBCHECK.into()));
    let r = codegen::Renderer::from_templates(templates).unwrap();
    for &arch in SmArch::ALL {
        let m = codegen::Manifest::parse(&format!(
            "[[instance]]\nop=\"softmax\"\nquant=\"f32\"\narches=[\"{arch}\"]\ntemplate=\"ops/libcheck.cu.tera\"\nreason=\"lib check\"\n"
        ))
        .unwrap();
        let src = r.render(&m.instances[0]).unwrap();
        let name = m.instances[0].name();
        let p = ptx::compile(&name, &src, arch).unwrap_or_else(|e| panic!("{e}"));
        assert!(p.contains(".entry"));
        assert_eq!(
            p.contains("wgmma.mma_async"),
            arch.has_wgmma(),
            "{arch}: wgmma"
        );
        assert_eq!(
            p.contains("kind::mxf4nvf4"),
            arch.has_fp4_mma(),
            "{arch}: fp4 mma"
        );
        assert_eq!(
            p.contains("cvt.rn.f16x2.e4m3x2"),
            arch.has_fp8_mma(),
            "{arch}: fp8 cvt"
        );
    }
}

const LIBCHECK: &str = r#"{% import "lib/prelude.cuh.tera" as prelude -%}
{% import "lib/reduce.cuh.tera" as reduce -%}
{% import "lib/convert.cuh.tera" as convert -%}
{% import "lib/tile.cuh.tera" as tile -%}
{% import "lib/wgmma.cuh.tera" as wgmma -%}
{% import "lib/mma_fp4.cuh.tera" as mma_fp4 -%}
{% import "lib/q8.cuh.tera" as q8 -%}
{% import "lib/rmsnorm.cuh.tera" as rmsnorm -%}
{% import "lib/rope.cuh.tera" as rope -%}
{{ prelude::types() }}
{{ reduce::warp() }}
{{ reduce::block() }}
{{ q8::group() }}
{{ rmsnorm::group() }}
{{ rope::head() }}
{{ convert::f16() }}
{{ convert::bf16() }}
{{ convert::fp8(sm=sm) }}
{{ convert::fp4() }}
{{ tile::tile() }}
{% if has_wgmma %}{{ wgmma::common() }}
{{ wgmma::bf16(n=64) }}
{{ wgmma::e4m3(n=128) }}{% endif %}
{% if has_fp4_mma %}{{ mma_fp4::nvfp4() }}
{{ mma_fp4::mxfp4() }}{% endif %}
extern "C" __global__ void {{ entry }}(const float* x, float* y, const uint8_t* q) {
    __shared__ float scratch[32];
    __shared__ __align__(16) float t[4 * 8];
    tile_load_async_f32<4, 8>(t, 8, x, 8);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float v = t[threadIdx.x % 32];
    tile_copy<float, 4, 8>(y + 64, 8, t, 8);
    v = block_sum(v, scratch) + block_max(v, scratch);
    rms_norm_group(x, x + 32, y + 128, x + 64, y + 160, 32, 0, 1e-6f, scratch,
                   (signed char*)(y + 256), (float2*)(y + 272));
    rope_head(y + 160, y + 192, 5.0, nullptr, 32, 32, 32, 0, 1e4f);
    q8_group(v, (signed char*)(y + 288), (float2*)(y + 296));
    v += f16_to_f32(f32_to_f16(v)) + bf16_to_f32(f32_to_bf16(v));
    v += fp8_e4m3_to_f32(f32_to_fp8_e4m3(v)) + fp4_e2m1_to_f32(f32_to_fp4_e2m1(v));
    float lo, hi;
    fp4x2_e2m1_to_f32x2(q[threadIdx.x], &lo, &hi);
{% if sm >= 89 %}    v += (float)fp8x2_e4m3_to_f16x2((uint16_t)q[threadIdx.x]);
{% endif %}{% if has_wgmma %}    {
        __shared__ __align__(128) uint16_t sa[64 * 16], sb[128 * 32];
        float acc[64];
        const uint64_t da = wgmma_desc(sa, 128, 256, 0), db = wgmma_desc(sb, 128, 256, 0);
        wgmma_fence();
        wgmma_m64n128k32_e4m3(acc, da, db, 0);
        float acc2[32];
        wgmma_m64n64k16_bf16(acc2, da, db, 0);
        wgmma_commit();
        wgmma_wait<0>();
        v += acc[threadIdx.x % 64] + acc2[threadIdx.x % 32];
    }
{% endif %}{% if has_fp4_mma %}    {
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        const uint32_t* w = (const uint32_t*)q;
        mma_nvfp4_m16n8k64<0, 0>(d, w, w + 4, w[6], w[7]);
        mma_mxfp4_m16n8k64<0, 1, 2, 0>(d, w, w + 4, w[6], w[7]);
        v += d[0] + d[1] + d[2] + d[3];
    }
{% endif %}    y[threadIdx.x] = v + lo + hi;
}
"#;
