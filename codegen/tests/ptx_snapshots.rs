//! L1 (libnvrtc only, no GPU): every manifest instance compiles for its arch (so every
//! sm_121a instance is checked in CI), every lib macro compiles on every arch, and the PTX of
//! the representative set (`ptx_snapshot = true`) for sm_90a and sm_121a is an insta snapshot
//! with NVRTC's version lines removed (`snapshots/ptx/<name>.snap`).

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
            if inst.ptx_snapshot && matches!(inst.key.arch, SmArch::Sm90a | SmArch::Sm121a) {
                insta::assert_snapshot!(name.as_str(), ptx::normalize_ptx(p));
                snapped += 1;
            }
        }
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
        let p = ptx::compile(&m.instances[0].name(), &src, arch).unwrap_or_else(|e| panic!("{e}"));
        assert!(p.contains(".entry"));
    }
}

const LIBCHECK: &str = r#"{% import "lib/prelude.cuh.tera" as prelude -%}
{% import "lib/reduce.cuh.tera" as reduce -%}
{% import "lib/convert.cuh.tera" as convert -%}
{% import "lib/tile.cuh.tera" as tile -%}
{{ prelude::types() }}
{{ reduce::warp() }}
{{ reduce::block() }}
{{ convert::f16() }}
{{ convert::bf16() }}
{{ convert::fp8(sm=sm) }}
{{ convert::fp4() }}
{{ tile::tile() }}
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
    v += f16_to_f32(f32_to_f16(v)) + bf16_to_f32(f32_to_bf16(v));
    v += fp8_e4m3_to_f32(f32_to_fp8_e4m3(v)) + fp4_e2m1_to_f32(f32_to_fp4_e2m1(v));
    float lo, hi;
    fp4x2_e2m1_to_f32x2(q[threadIdx.x], &lo, &hi);
{% if sm >= 89 %}    v += (float)fp8x2_e4m3_to_f16x2((uint16_t)q[threadIdx.x]);
{% endif %}    y[threadIdx.x] = v + lo + hi;
}
"#;
