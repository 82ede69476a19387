//! NVRTC compilation (through cudarc, dynamically loaded) and the on-disk PTX cache.
//!
//! Cache layout: `<root>/ptx/<arch>/nvrtc-<major>.<minor>/<name>-<hash>.ptx`, where `<root>` is
//! `$FUCINA_CACHE_DIR` or `<user cache dir>/fucina`, and `<hash>` is sha256 over (source, arch,
//! compile options, codegen version): the key is (source, arch, NVRTC version, options). Without
//! NVRTC, the newest version's entry is used (a cache shipped to a driver-only machine works). A template edit changes the source, hence the key: a
//! stale entry can never be picked up. Strict mode (`FUCINA_STRICT_KERNELS=1`) turns every
//! cache miss into an error, which proves the cache is complete (tinygrad's ASSERT_COMPILE).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use crate::key::SmArch;

/// Environment variable overriding the cache root.
pub const ENV_CACHE_DIR: &str = "FUCINA_CACHE_DIR";
/// Environment variable enabling strict mode (`1`/`true`).
pub const ENV_STRICT: &str = "FUCINA_STRICT_KERNELS";

#[derive(Debug, thiserror::Error)]
pub enum PtxError {
    #[error(
        "NVRTC (libnvrtc.so.13) could not be loaded; install it with `python3 -m pip install \
         --target DIR nvidia-cuda-nvrtc==13.0.88` and put DIR/nvidia/cu13/lib on LD_LIBRARY_PATH"
    )]
    NvrtcMissing,
    #[error("NVRTC failed to compile {name} for {arch} (options: {options}):\n{log}")]
    Compile {
        name: String,
        arch: SmArch,
        options: String,
        log: String,
    },
    #[error("NVRTC error while compiling {name} for {arch}: {detail}")]
    Nvrtc {
        name: String,
        arch: SmArch,
        detail: String,
    },
    #[error(
        "strict kernel mode ({ENV_STRICT}=1): {name} for {arch} is not in the PTX cache {dir}; \
         run `cargo xtask gen-kernels` (or start once without strict mode) to fill it"
    )]
    StrictMiss {
        name: String,
        arch: SmArch,
        dir: PathBuf,
    },
    #[error("PTX cache {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no cache directory: set {ENV_CACHE_DIR}")]
    NoCacheDir,
}

/// Is libnvrtc loadable? Checked once, without letting cudarc panic.
pub fn nvrtc_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    // SAFETY: is_culib_present only tries dlopen on candidate names; it calls no NVRTC symbol.
    *AVAILABLE.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
}

/// NVRTC's (major, minor) version.
pub fn nvrtc_version() -> Result<(i32, i32), PtxError> {
    if !nvrtc_available() {
        return Err(PtxError::NvrtcMissing);
    }
    let (mut major, mut minor) = (0i32, 0i32);
    // SAFETY: the library is present (checked above); both pointers are valid for writes.
    let rc = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(PtxError::Nvrtc {
            name: "nvrtcVersion".into(),
            arch: SmArch::Sm80,
            detail: format!("{rc:?}"),
        });
    }
    Ok((major, minor))
}

/// The fixed NVRTC options for an arch (they are part of the cache key).
pub fn compile_options(arch: SmArch) -> Vec<String> {
    vec![
        format!("--gpu-architecture={}", arch.as_str()),
        "--std=c++17".to_string(),
    ]
}

/// Compile `source` (instance `name`) to PTX for `arch`, uncached.
pub fn compile(name: &str, source: &str, arch: SmArch) -> Result<String, PtxError> {
    use cudarc::nvrtc::{CompileError, CompileOptions};
    if !nvrtc_available() {
        return Err(PtxError::NvrtcMissing);
    }
    let opts = CompileOptions {
        options: compile_options(arch),
        name: Some(format!("{name}.cu")),
        ..Default::default()
    };
    if source.contains('\0') || name.contains('\0') {
        return Err(PtxError::Nvrtc {
            name: name.into(),
            arch,
            detail: "source contains a NUL byte".into(),
        });
    }
    match cudarc::nvrtc::compile_ptx_with_opts(source, opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(CompileError::CompileError { log, options, .. }) => Err(PtxError::Compile {
            name: name.into(),
            arch,
            options: options.join(" "),
            log: log.to_string_lossy().into_owned(),
        }),
        Err(e) => Err(PtxError::Nvrtc {
            name: name.into(),
            arch,
            detail: format!("{e:?}"),
        }),
    }
}

/// Where the cache lives and whether misses are allowed.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Root: PTX goes to `<root>/ptx/<arch>/`.
    pub root: PathBuf,
    /// Any compile (cache miss) is an error.
    pub strict: bool,
}

impl CacheConfig {
    /// `$FUCINA_CACHE_DIR` or `<user cache dir>/fucina`; strict from `$FUCINA_STRICT_KERNELS`.
    pub fn from_env() -> Result<CacheConfig, PtxError> {
        let root = match std::env::var_os(ENV_CACHE_DIR) {
            Some(d) if !d.is_empty() => PathBuf::from(d),
            _ => dirs::cache_dir()
                .ok_or(PtxError::NoCacheDir)?
                .join("fucina"),
        };
        let strict = std::env::var(ENV_STRICT)
            .map(|v| matches!(v.trim(), "1" | "true" | "yes" | "on"))
            .unwrap_or(false);
        Ok(CacheConfig { root, strict })
    }
}

/// The on-disk PTX cache. Counts the compiles it had to do (`compiles()`).
#[derive(Debug)]
pub struct PtxCache {
    cfg: CacheConfig,
    compiles: AtomicUsize,
    hits: AtomicUsize,
}

impl PtxCache {
    pub fn new(cfg: CacheConfig) -> PtxCache {
        PtxCache {
            cfg,
            compiles: AtomicUsize::new(0),
            hits: AtomicUsize::new(0),
        }
    }

    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    /// Number of NVRTC compiles this cache performed.
    pub fn compiles(&self) -> usize {
        self.compiles.load(Ordering::Relaxed)
    }

    /// Number of lookups answered from disk.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::Relaxed)
    }

    /// Directory holding one arch's PTX.
    pub fn arch_dir(&self, arch: SmArch) -> PathBuf {
        self.cfg.root.join("ptx").join(arch.as_str())
    }

    /// File name of a (name, source, arch): `<name>-<hash>.ptx`, hash over source, arch,
    /// options and codegen version. The NVRTC version is the directory above it.
    pub fn file_name(name: &str, source: &str, arch: SmArch) -> String {
        let mut h = Sha256::new();
        for part in [
            source,
            arch.as_str(),
            &compile_options(arch).join(" "),
            concat!("codegen ", env!("CARGO_PKG_VERSION")),
        ] {
            h.update(part.as_bytes());
            h.update([0u8]);
        }
        let digest = h.finalize();
        let hex: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
        format!("{name}-{hex}.ptx")
    }

    /// Where NVRTC `version`'s PTX of (name, source, arch) lives:
    /// `<root>/ptx/<arch>/nvrtc-<major>.<minor>/<name>-<hash>.ptx`.
    pub fn path_for(&self, name: &str, source: &str, arch: SmArch, version: (i32, i32)) -> PathBuf {
        self.arch_dir(arch)
            .join(format!("nvrtc-{}.{}", version.0, version.1))
            .join(PtxCache::file_name(name, source, arch))
    }

    /// Without NVRTC: the entry of the newest NVRTC version that has one (PTX JITs forward on
    /// any newer driver, so a shipped cache works on a machine with only the driver).
    pub fn find_any_version(&self, name: &str, source: &str, arch: SmArch) -> Option<PathBuf> {
        let file = PtxCache::file_name(name, source, arch);
        let mut dirs: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir(self.arch_dir(arch))
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter_map(|p| {
                let n = p.file_name()?.to_str()?.strip_prefix("nvrtc-")?.to_string();
                let v: Option<Vec<u32>> = n.split('.').map(|x| x.parse().ok()).collect();
                Some((v?, p))
            })
            .collect();
        dirs.sort();
        dirs.into_iter()
            .rev()
            .map(|(_, d)| d.join(&file))
            .find(|p| p.is_file())
    }

    /// PTX of `source` for `arch`: from disk if cached, else compiled (unless strict) and stored.
    /// Without NVRTC, any cached version is used; a miss is then `NvrtcMissing`.
    pub fn get_or_compile(
        &self,
        name: &str,
        source: &str,
        arch: SmArch,
    ) -> Result<String, PtxError> {
        let path = if nvrtc_available() {
            self.path_for(name, source, arch, nvrtc_version()?)
        } else {
            match self.find_any_version(name, source, arch) {
                Some(p) => p,
                None if self.cfg.strict => {
                    return Err(PtxError::StrictMiss {
                        name: name.into(),
                        arch,
                        dir: self.arch_dir(arch),
                    })
                }
                None => return Err(PtxError::NvrtcMissing),
            }
        };
        if let Ok(ptx) = std::fs::read_to_string(&path) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(ptx);
        }
        if self.cfg.strict {
            return Err(PtxError::StrictMiss {
                name: name.into(),
                arch,
                dir: self.arch_dir(arch),
            });
        }
        let ptx = compile(name, source, arch)?;
        self.compiles.fetch_add(1, Ordering::Relaxed);
        store_atomically(&path, &ptx)?;
        Ok(ptx)
    }
}

/// Write via a temp file + rename so a concurrent reader never sees a partial file.
fn store_atomically(path: &Path, contents: &str) -> Result<(), PtxError> {
    let io = |source| PtxError::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    std::fs::write(&tmp, contents).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// One item to compile.
#[derive(Debug, Clone)]
pub struct Job<'a> {
    pub name: &'a str,
    pub source: &'a str,
    pub arch: SmArch,
}

/// Compile (or fetch) many instances on a few threads, with a progress bar on a terminal.
/// Returns the PTX in job order; the first error stops the remaining work.
pub fn compile_many(
    cache: &PtxCache,
    jobs: &[Job<'_>],
    show_progress: bool,
) -> Result<Vec<String>, PtxError> {
    let bar = if show_progress {
        let b = indicatif::ProgressBar::new(jobs.len() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("compiling kernels {bar:40} {pos}/{len} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let next = AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let results: Vec<std::sync::Mutex<Option<Result<String, PtxError>>>> =
        jobs.iter().map(|_| std::sync::Mutex::new(None)).collect();
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8)
        .min(jobs.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs.len() || failed.load(Ordering::Relaxed) {
                    break;
                }
                let j = &jobs[i];
                bar.set_message(j.name.to_string());
                let r = cache.get_or_compile(j.name, j.source, j.arch);
                if r.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                if let Ok(mut slot) = results[i].lock() {
                    *slot = Some(r);
                }
                bar.inc(1);
            });
        }
    });
    bar.finish_and_clear();
    let mut out = Vec::with_capacity(jobs.len());
    for (i, slot) in results.into_iter().enumerate() {
        match slot.into_inner().ok().flatten() {
            Some(Ok(p)) => out.push(p),
            Some(Err(e)) => return Err(e),
            None => {
                // Skipped after another job failed: report that failure instead.
                if failed.load(Ordering::Relaxed) {
                    continue;
                }
                return Err(PtxError::Nvrtc {
                    name: jobs[i].name.into(),
                    arch: jobs[i].arch,
                    detail: "worker did not run".into(),
                });
            }
        }
    }
    Ok(out)
}

/// PTX with NVRTC's version-dependent preamble removed: the leading `//` comment block
/// (compiler build id, release) and the `.version` line. Used for snapshots.
pub fn normalize_ptx(ptx: &str) -> String {
    let mut out = String::with_capacity(ptx.len());
    let mut in_preamble = true;
    for line in ptx.lines() {
        let t = line.trim();
        if in_preamble && (t.is_empty() || t.starts_with("//")) {
            continue;
        }
        in_preamble = false;
        if t.starts_with(".version") {
            continue;
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
