//! Renders every kernel instance of `kernel-templates/manifest.toml` into OUT_DIR and writes the
//! registry table (`kernel_registry.rs`). Needs neither a GPU nor NVRTC; output is
//! byte-identical run to run (sorted, no timestamps, no host probing).

use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let templates = root.join("kernel-templates");
    println!("cargo:rerun-if-changed=kernel-templates");
    println!("cargo:rerun-if-changed=build.rs");
    match codegen::build_all(&templates, &out) {
        Ok(files) => {
            for f in files {
                println!("cargo:rerun-if-changed={}", f.display());
            }
        }
        Err(e) => {
            // A build script reports through its exit status; the message names the instance.
            eprintln!("error: kernel generation failed: {e}");
            std::process::exit(1);
        }
    }
}
