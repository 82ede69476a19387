//! The on-disk PTX cache: a second start compiles nothing (proved with strict mode, which makes
//! any compile an error), a changed source misses, and NVRTC errors carry the instance name and
//! the compiler log.

mod common;

use codegen::ptx::{CacheConfig, PtxCache, PtxError};
use codegen::SmArch;

fn fresh_root(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("fucina-ptx-cache-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn second_start_compiles_nothing() {
    if !common::nvrtc_or_skip("ptx cache") {
        return;
    }
    let root = fresh_root("second");
    let rendered = codegen::render_all(&common::templates_dir()).unwrap();
    let set: Vec<_> = rendered
        .iter()
        .filter(|(i, _)| i.key.arch == SmArch::Sm90a)
        .collect();
    assert!(!set.is_empty());

    let first = PtxCache::new(CacheConfig {
        root: root.clone(),
        strict: false,
    });
    let mut ptx1 = Vec::new();
    for (inst, src) in &set {
        ptx1.push(
            first
                .get_or_compile(&inst.name(), src, inst.key.arch)
                .unwrap(),
        );
    }
    assert_eq!(first.compiles(), set.len());

    // "Second start": a new cache object over the same directory, in strict mode.
    let second = PtxCache::new(CacheConfig {
        root: root.clone(),
        strict: true,
    });
    for ((inst, src), p1) in set.iter().zip(&ptx1) {
        let p2 = second
            .get_or_compile(&inst.name(), src, inst.key.arch)
            .unwrap();
        assert_eq!(&p2, p1);
    }
    assert_eq!(second.compiles(), 0);
    assert_eq!(second.hits(), set.len());

    // A changed source is a miss: strict mode refuses to compile it.
    let (inst, src) = set[0];
    let edited = format!("{src}\n// edited\n");
    match second.get_or_compile(&inst.name(), &edited, inst.key.arch) {
        Err(PtxError::StrictMiss { name, .. }) => assert_eq!(name, inst.name()),
        other => panic!("expected StrictMiss, got {other:?}"),
    }
    // Entries sit under the NVRTC version; without NVRTC the newest version's entry is used.
    let (maj, min) = codegen::ptx::nvrtc_version().unwrap();
    let p = second.path_for(&inst.name(), src, inst.key.arch, (maj, min));
    assert!(p.is_file(), "{}", p.display());
    assert!(p.parent().unwrap().ends_with(format!("nvrtc-{maj}.{min}")));
    assert_eq!(
        second.find_any_version(&inst.name(), src, inst.key.arch),
        Some(p.clone())
    );
    let newer = second.path_for(&inst.name(), src, inst.key.arch, (maj + 86, 0));
    std::fs::create_dir_all(newer.parent().unwrap()).unwrap();
    std::fs::write(&newer, "// newer").unwrap();
    assert_eq!(
        second.find_any_version(&inst.name(), src, inst.key.arch),
        Some(newer)
    );
    assert_eq!(
        second.find_any_version(&inst.name(), &edited, inst.key.arch),
        None
    );

    // The arch is part of the key.
    assert!(second
        .get_or_compile(&inst.name(), src, SmArch::Sm121a)
        .is_err());
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn compile_error_names_instance_and_carries_log() {
    if !common::nvrtc_or_skip("ptx compile error") {
        return;
    }
    let src =
        "extern \"C\" __global__ void broken_f32_sm_90a(float* y) { y[0] = undeclared_thing; }";
    let e = codegen::ptx::compile("broken_f32_sm_90a", src, SmArch::Sm90a).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, PtxError::Compile { .. }), "{msg}");
    assert!(msg.contains("broken_f32_sm_90a"), "{msg}");
    assert!(msg.contains("undeclared_thing"), "{msg}");
    assert!(msg.contains("sm_90a"), "{msg}");
}

#[test]
fn cache_dir_from_env() {
    // Only the parsing; does not touch the process env of other tests.
    let cfg = CacheConfig {
        root: "/tmp/x".into(),
        strict: false,
    };
    let c = PtxCache::new(cfg);
    assert!(c.arch_dir(SmArch::Sm121a).ends_with("ptx/sm_121a"));
}

/// On a machine without NVRTC (this test only runs there: plain `cargo test` without the
/// NVRTC library path), a cache shipped from elsewhere is used and a miss is a typed error.
#[test]
fn without_nvrtc_a_shipped_cache_is_used() {
    if codegen::ptx::nvrtc_available() {
        eprintln!("SKIP without_nvrtc_a_shipped_cache_is_used: NVRTC is present");
        return;
    }
    let root = fresh_root("shipped");
    let cache = PtxCache::new(CacheConfig {
        root: root.clone(),
        strict: false,
    });
    let src = "extern \"C\" __global__ void k_f32_sm_90a() {}";
    let p = cache.path_for("k_f32_sm_90a", src, SmArch::Sm90a, (13, 0));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, "// shipped ptx").unwrap();
    assert_eq!(
        cache
            .get_or_compile("k_f32_sm_90a", src, SmArch::Sm90a)
            .unwrap(),
        "// shipped ptx"
    );
    assert_eq!(cache.compiles(), 0);
    let miss = cache.get_or_compile("k_f32_sm_90a", "// other", SmArch::Sm90a);
    assert!(matches!(miss, Err(PtxError::NvrtcMissing)), "{miss:?}");
    let strict = PtxCache::new(CacheConfig {
        root: root.clone(),
        strict: true,
    });
    assert!(matches!(
        strict.get_or_compile("k_f32_sm_90a", "// other", SmArch::Sm90a),
        Err(PtxError::StrictMiss { .. })
    ));
    let _ = std::fs::remove_dir_all(&root);
}
