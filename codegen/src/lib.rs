//! fucina's kernel generator: a typed instance list (`kernel-templates/manifest.toml`), Tera
//! templates (`kernel-templates/{lib,ops}`) rendered to CUDA C, NVRTC compilation to PTX with an
//! on-disk cache, and the Rust registry table the runtime dispatches through.
//!
//! Used by the root crate's `build.rs` ([`build_all`]: no GPU, no NVRTC), by the runtime
//! (`codegen::ptx` through `fucina::backend::cuda`) and by `cargo xtask gen-kernels`.

pub mod emit_rust;
pub mod entries;
pub mod key;
pub mod legal;
pub mod manifest;
pub mod ptx;
pub mod render;
pub mod snapshots;

use std::path::{Path, PathBuf};

pub use entries::{entries_of, Entry};
pub use key::{entry_name, BatchBucket, HeadDim, KernelKey, KeyParseError, Op, Quant, SmArch};
pub use manifest::{Instance, Manifest, ManifestError};
pub use render::{RenderError, Renderer};

/// Directory (under OUT_DIR) the rendered `.cu` files go to.
pub const SOURCES_SUBDIR: &str = "kernels";

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Render(#[from] RenderError),
    /// A rendered instance defines an entry no [`Entry`] names.
    #[error("{0}")]
    Entry(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> BuildError + '_ {
    move |source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The workspace's `kernel-templates/` directory (compile-time path of this crate's parent).
pub fn default_templates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("kernel-templates")
}

/// Load and validate `<templates>/manifest.toml`.
pub fn load_manifest(templates: &Path) -> Result<Manifest, BuildError> {
    let p = templates.join("manifest.toml");
    let text = std::fs::read_to_string(&p).map_err(io_err(&p))?;
    Ok(Manifest::parse(&text)?)
}

/// Every instance of the manifest with its rendered source, in key order.
pub fn render_all(templates: &Path) -> Result<Vec<(Instance, String)>, BuildError> {
    let manifest = load_manifest(templates)?;
    let renderer = Renderer::from_dir(templates)?;
    let mut out = Vec::with_capacity(manifest.instances.len());
    for inst in manifest.instances {
        let src = renderer.render(&inst)?;
        out.push((inst, src));
    }
    Ok(out)
}

/// Write `contents` to `path` only when it differs (keeps mtimes, and cargo, quiet).
pub fn write_if_changed(path: &Path, contents: &str) -> Result<(), BuildError> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == contents) {
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    std::fs::write(path, contents).map_err(io_err(path))
}

/// What `build.rs` does: render every instance into `<out_dir>/kernels/<name>.cu`, remove stale
/// `.cu` files there, and write `<out_dir>/kernel_registry.rs`. Returns the template files read
/// (for `rerun-if-changed`).
pub fn build_all(templates: &Path, out_dir: &Path) -> Result<Vec<PathBuf>, BuildError> {
    let rendered = render_all(templates)?;
    let src_dir = out_dir.join(SOURCES_SUBDIR);
    std::fs::create_dir_all(&src_dir).map_err(io_err(&src_dir))?;
    let mut keep = std::collections::BTreeSet::new();
    for (inst, src) in &rendered {
        let file = format!("{}.cu", inst.name());
        write_if_changed(&src_dir.join(&file), src)?;
        keep.insert(file);
    }
    for e in std::fs::read_dir(&src_dir).map_err(io_err(&src_dir))? {
        let e = e.map_err(io_err(&src_dir))?;
        let fname = e.file_name().to_string_lossy().into_owned();
        if fname.ends_with(".cu") && !keep.contains(&fname) {
            std::fs::remove_file(e.path()).map_err(io_err(&e.path()))?;
        }
    }
    let mut instances = Vec::with_capacity(rendered.len());
    for (inst, src) in rendered {
        let entries = entries::entries_of(&inst.name(), &src).map_err(BuildError::Entry)?;
        instances.push((inst, entries));
    }
    let reg = emit_rust::registry_source(&instances, SOURCES_SUBDIR);
    write_if_changed(&out_dir.join("kernel_registry.rs"), &reg)?;
    let mut files = vec![templates.join("manifest.toml")];
    for (rel, _) in render::read_templates(templates)? {
        files.push(templates.join(rel));
    }
    Ok(files)
}
