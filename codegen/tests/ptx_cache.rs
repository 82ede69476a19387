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
