//! L0 (no CUDA): the rendered CUDA C of EVERY manifest instance is an insta snapshot
//! (`snapshots/render/<name>.snap`; the arches of an instance whose sources differ only in the
//! arch's name share one, `codegen::snapshots::render_snapshots`), and rendering is
//! deterministic.
//! Refresh with `cargo xtask gen-kernels`; `cargo xtask gen-kernels --check` fails when stale.

mod common;

#[test]
fn rendered_sources_match_snapshots() {
    let rendered = codegen::render_all(&common::templates_dir()).expect("render kernel-templates");
    assert!(!rendered.is_empty());
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("snapshots/render");
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.bind(|| {
        for (name, text) in codegen::snapshots::render_snapshots(&rendered) {
            insta::assert_snapshot!(name, text);
        }
    });
}

#[test]
fn build_output_is_byte_identical_run_to_run() {
    let t = common::templates_dir();
    let base = std::env::temp_dir().join(format!("fucina-codegen-det-{}", std::process::id()));
    let (a, b) = (base.join("a"), base.join("b"));
    codegen::build_all(&t, &a).unwrap();
    codegen::build_all(&t, &b).unwrap();
    let list = |d: &std::path::Path| {
        let mut v: Vec<_> = std::fs::read_dir(d.join(codegen::SOURCES_SUBDIR))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    assert_eq!(list(&a), list(&b));
    for f in list(&a) {
        let p = std::path::Path::new(codegen::SOURCES_SUBDIR).join(&f);
        assert_eq!(
            std::fs::read(a.join(&p)).unwrap(),
            std::fs::read(b.join(&p)).unwrap()
        );
    }
    assert_eq!(
        std::fs::read(a.join("kernel_registry.rs")).unwrap(),
        std::fs::read(b.join("kernel_registry.rs")).unwrap()
    );
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn every_source_names_its_template_and_entry() {
    for (inst, src) in codegen::render_all(&common::templates_dir()).unwrap() {
        let first = src.lines().next().unwrap();
        assert!(
            first.contains(&inst.template) && first.contains("do not edit"),
            "{first}"
        );
        assert!(src.contains("__global__"), "{}", inst.name());
        assert!(
            src.contains(&format!(" {}(", inst.name())),
            "{}: no entry point",
            inst.name()
        );
        assert!(
            !src.contains("#include"),
            "{}: NVRTC has no headers here",
            inst.name()
        );
    }
}
