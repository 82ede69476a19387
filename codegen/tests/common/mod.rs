//! Shared helpers for codegen's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

pub fn templates_dir() -> PathBuf {
    codegen::default_templates_dir()
}

/// NVRTC present? With `FUCINA_REQUIRE_NVRTC=1` (scripts/test.sh, CI) a missing NVRTC is a test
/// failure; otherwise the caller skips with a printed reason.
pub fn nvrtc_or_skip(test: &str) -> bool {
    if codegen::ptx::nvrtc_available() {
        return true;
    }
    let required = std::env::var("FUCINA_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "{test}: FUCINA_REQUIRE_NVRTC=1 but libnvrtc.so.13 cannot be loaded: {}",
        codegen::ptx::PtxError::NvrtcMissing
    );
    eprintln!("SKIP {test}: NVRTC not loadable (set LD_LIBRARY_PATH, see scripts/test.sh)");
    false
}
