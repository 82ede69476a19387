//! Random-weight GGUF files at real shapes (`fucina bench --synth NAME --quant Q`).
//!
//! Tensors, names and metadata come from [`presets`](super::presets) (mirroring
//! `synth_gguf.py`); the tokenizer is copied from a donor GGUF (every `tokenizer.*` key, the
//! token list padded with `[PAD<id>]` UNUSED tokens up to the preset's vocabulary), or, without a
//! donor, a byte-level one is made up. Matrix types follow llama-quantize's rules for the file
//! type (Q4_K_M: Q6_K for the output head and for `attn_v` / `ffn_down` on the layers
//! `use_more_bits` picks; Q4_0 and Q8_0: the output head Q6_K / Q8_0). 1-D tensors and the MoE
//! router stay F32.
//!
//! Speed: one pool of random blocks (xorshift) is made per file and tiled over every matrix,
//! each block getting a fresh scale, so generating is a copy plus a scale store per block.

use std::io::Write;
use std::path::Path;

use super::gguf_write::{self, TensorDecl};
use super::presets::{Fill, Preset, Spec};
use crate::gguf::{GgufFile, GgufValue};
use crate::quant::GgmlType;

/// File types the synthesiser writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileQuant {
    Q4_0,
    Q4KM,
    Q8_0,
}

impl FileQuant {
    pub fn parse(s: &str) -> Option<FileQuant> {
        match s.to_ascii_lowercase().as_str() {
            "q4_0" => Some(FileQuant::Q4_0),
            "q4_k_m" => Some(FileQuant::Q4KM),
            "q8_0" => Some(FileQuant::Q8_0),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            FileQuant::Q4_0 => "q4_0",
            FileQuant::Q4KM => "q4_k_m",
            FileQuant::Q8_0 => "q8_0",
        }
    }
    /// llama.cpp's `general.file_type` (LLAMA_FTYPE_MOSTLY_*).
    pub fn ftype(self) -> u32 {
        match self {
            FileQuant::Q4_0 => 2,
            FileQuant::Q8_0 => 7,
            FileQuant::Q4KM => 15,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("donor tokenizer {path}: {msg}")]
    Donor { path: String, msg: String },
}

/// llama.cpp's `use_more_bits(i, n)`.
pub fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// The type llama-quantize gives matrix `name` (row length `ne0`) in a file of type `q`.
/// `v_index` is this tensor's position among the `attn_v` tensors (of `n_v`).
pub fn matrix_type(
    q: FileQuant,
    p: &Preset,
    name: &str,
    ne0: usize,
    v_index: usize,
    n_v: usize,
) -> GgmlType {
    let base = match q {
        FileQuant::Q4_0 => GgmlType::Q4_0,
        FileQuant::Q8_0 => GgmlType::Q8_0,
        FileQuant::Q4KM => GgmlType::Q4K,
    };
    let is_head = name == "output.weight" || (p.tied && name == "token_embd.weight");
    let mut t = if is_head {
        if ne0 % 256 != 0 {
            GgmlType::Q8_0
        } else if base != GgmlType::Q8_0 {
            GgmlType::Q6K
        } else {
            base
        }
    } else if q == FileQuant::Q4KM
        && ((name.contains("attn_v.weight") && use_more_bits(v_index, n_v))
            || (name.contains("ffn_down")
                && layer_of(name).is_some_and(|i| use_more_bits(i, p.n_layer))))
    {
        GgmlType::Q6K
    } else {
        base
    };
    // llama.cpp's fallback for rows that are not whole K-blocks
    if matches!(t, GgmlType::Q4K | GgmlType::Q6K) && ne0 % 256 != 0 {
        t = if t == GgmlType::Q4K {
            GgmlType::Q5_0
        } else {
            GgmlType::Q8_0
        };
    }
    t
}

/// Every tensor's header entry for preset `p` in file type `q`.
pub fn declare(p: &Preset, q: FileQuant, n_vocab: usize) -> Vec<(Spec, TensorDecl)> {
    let specs = p.tensors(n_vocab);
    let n_v = specs
        .iter()
        .filter(|s| s.name.contains("attn_v.weight"))
        .count();
    let mut v_index = 0;
    specs
        .into_iter()
        .map(|s| {
            let ty = match s.fill {
                Fill::Matrix => {
                    let ne0 = *s.shape.last().unwrap_or(&0);
                    let t = matrix_type(q, p, &s.name, ne0, v_index, n_v);
                    if s.name.contains("attn_v.weight") {
                        v_index += 1;
                    }
                    t
                }
                _ => GgmlType::F32,
            };
            let d = TensorDecl {
                name: s.name.clone(),
                shape: s.shape.clone(),
                ty,
            };
            (s, d)
        })
        .collect()
}

/// The tokenizer keys: a donor's (padded to `pad_to`) or a made-up byte-level one of
/// `default_vocab` tokens. Returns the keys and the vocabulary size.
pub fn tokenizer_keys(
    p: &Preset,
    donor: Option<&Path>,
) -> Result<(Vec<(String, GgufValue)>, usize), SynthError> {
    use GgufValue as V;
    let Some(path) = donor else {
        let n = p.n_vocab.unwrap_or(p.default_vocab);
        let tokens: Vec<V> = (0..n)
            .map(|i| {
                V::String(if i < 256 {
                    byte_token(i as u8)
                } else {
                    format!("[PAD{i}]")
                })
            })
            .collect();
        let types = (0..n)
            .map(|i| V::I32(if i < 256 { 1 } else { 5 }))
            .collect();
        let kv = vec![
            ("tokenizer.ggml.model".into(), V::String("gpt2".into())),
            // byte tokens and no merges split alike under any pre-tokenizer: "gpt-2" is one
            // both fucina and llama.cpp load, so a synthesised file can be served too
            ("tokenizer.ggml.pre".into(), V::String("gpt-2".into())),
            ("tokenizer.ggml.tokens".into(), V::Array(tokens)),
            ("tokenizer.ggml.token_type".into(), V::Array(types)),
            ("tokenizer.ggml.merges".into(), V::Array(Vec::new())),
            ("tokenizer.ggml.bos_token_id".into(), V::U32(0)),
            ("tokenizer.ggml.eos_token_id".into(), V::U32(1)),
        ];
        return Ok((kv, n));
    };
    let err = |msg: String| SynthError::Donor {
        path: path.display().to_string(),
        msg,
    };
    let g = GgufFile::open(path).map_err(|e| err(e.to_string()))?;
    let n_donor = g
        .get_array("tokenizer.ggml.tokens")
        .ok_or_else(|| err("no tokenizer.ggml.tokens".into()))?
        .len();
    let n = n_donor.max(p.n_vocab.unwrap_or(0));
    let mut kv = Vec::new();
    for (k, v) in g.metadata() {
        if !k.starts_with("tokenizer.") {
            continue;
        }
        let mut v = v.clone();
        if let V::Array(a) = &mut v {
            match k.as_str() {
                "tokenizer.ggml.tokens" => {
                    a.extend((n_donor..n).map(|i| V::String(format!("[PAD{i}]"))))
                }
                "tokenizer.ggml.token_type" => a.extend((n_donor..n).map(|_| V::I32(5))),
                "tokenizer.ggml.scores" => a.extend((n_donor..n).map(|_| V::F32(-10000.0))),
                _ => {}
            }
        }
        kv.push((k.clone(), v));
    }
    Ok((kv, n))
}

/// GPT-2's byte-to-unicode mapping of one byte.
fn byte_token(b: u8) -> String {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    if printable(b) {
        return char::from(b).to_string();
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n)
        .map(String::from)
        .unwrap_or_default()
}

/// xorshift64* seeded through splitmix64.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn fill(&mut self, out: &mut [u8]) {
        let mut it = out.chunks_exact_mut(8);
        for c in &mut it {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let r = self.next_u64().to_le_bytes();
        let rem = it.into_remainder();
        let n = rem.len();
        rem.copy_from_slice(&r[..n]);
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

fn f16b(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

/// 256 valid scale encodings per quant type (byte offsets and bytes to store per block), picked
/// so that weights come out ~N(0, 0.02)-sized: finite, small f16 scales.
struct Scales {
    /// (offset in the block, 256 alternatives of the scale bytes)
    at: usize,
    table: Vec<Vec<u8>>,
}

fn scales(ty: GgmlType, rng: &mut Rng) -> Option<Scales> {
    let mut t = Vec::with_capacity(256);
    let at = match ty {
        GgmlType::Q4_0 => {
            (0..256).for_each(|_| t.push(f16b(rng.uniform(0.002, 0.006)).to_vec()));
            0
        }
        GgmlType::Q5_0 => {
            (0..256).for_each(|_| t.push(f16b(rng.uniform(0.001, 0.003)).to_vec()));
            0
        }
        GgmlType::Q8_0 => {
            (0..256).for_each(|_| t.push(f16b(rng.uniform(1.5e-4, 4e-4)).to_vec()));
            0
        }
        GgmlType::Q4K => {
            (0..256).for_each(|_| {
                let d = rng.uniform(4e-5, 1e-4);
                let mut b = f16b(d).to_vec();
                b.extend_from_slice(&f16b(d * rng.uniform(6.0, 9.0)));
                t.push(b)
            });
            0
        }
        GgmlType::Q6K => {
            (0..256).for_each(|_| t.push(f16b(rng.uniform(1e-5, 2e-5)).to_vec()));
            208
        }
        _ => return None,
    };
    Some(Scales { at, table: t })
}

/// Bytes of random blocks in the pool (tiled over every matrix).
const POOL_BYTES: usize = 8 << 20;
/// Bytes generated per write.
const CHUNK_BYTES: usize = 8 << 20;

/// Pools of random blocks per type, made on first use.
struct Pools {
    rng: Rng,
    pools: Vec<(GgmlType, Vec<u8>, Scales)>,
}

impl Pools {
    fn get(&mut self, ty: GgmlType) -> Option<usize> {
        if let Some(i) = self.pools.iter().position(|p| p.0 == ty) {
            return Some(i);
        }
        let sc = scales(ty, &mut self.rng)?;
        let bb = ty.block().1;
        let mut pool = vec![0u8; POOL_BYTES / bb * bb];
        self.rng.fill(&mut pool);
        self.pools.push((ty, pool, sc));
        Some(self.pools.len() - 1)
    }
}

/// Write the data of one matrix: pool blocks from a per-tensor start, each with a fresh scale.
fn write_matrix(
    w: &mut impl Write,
    pools: &mut Pools,
    ty: GgmlType,
    n_bytes: usize,
    buf: &mut Vec<u8>,
) -> std::io::Result<()> {
    let Some(pi) = pools.get(ty) else {
        return Err(std::io::Error::other(format!(
            "no random blocks for {}",
            ty.name()
        )));
    };
    let bb = ty.block().1;
    let start = (pools.rng.next_u64() as usize % (pools.pools[pi].1.len() / bb)) * bb;
    let mut rng = Rng::new(pools.rng.next_u64());
    let (_, pool, sc) = &pools.pools[pi];
    let mut pos = start;
    let mut left = n_bytes;
    while left > 0 {
        let n = left.min(CHUNK_BYTES / bb * bb);
        buf.clear();
        while buf.len() < n {
            let take = (n - buf.len()).min(pool.len() - pos);
            buf.extend_from_slice(&pool[pos..pos + take]);
            pos = (pos + take) % pool.len();
        }
        let k = sc.table[0].len();
        let mut r = 0u64;
        for (j, b) in buf.chunks_exact_mut(bb).enumerate() {
            if j % 8 == 0 {
                r = rng.next_u64();
            }
            let s = &sc.table[((r >> ((j % 8) * 8)) & 0xff) as usize];
            b[sc.at..sc.at + k].copy_from_slice(s);
        }
        w.write_all(buf)?;
        left -= n;
    }
    Ok(())
}

fn write_f32(w: &mut impl Write, spec: &Spec, rng: &mut Rng) -> std::io::Result<()> {
    let n: usize = spec.shape.iter().product();
    let mut out = Vec::with_capacity(n * 4);
    for i in 0..n {
        let v = match spec.fill {
            Fill::Const(c) => c,
            Fill::RopeFreqs(pairs) => {
                if i < pairs {
                    1.0
                } else {
                    1e30
                }
            }
            // ~N(0, 0.02): a sum of four uniforms
            _ => (0..4).map(|_| rng.uniform(-1.0, 1.0)).sum::<f32>() * 0.02 / 1.1547,
        };
        out.extend_from_slice(&v.to_le_bytes());
    }
    w.write_all(&out)
}

/// A `Write` that hands full chunks to the writer thread.
struct ChunkSink {
    tx: std::sync::mpsc::SyncSender<Vec<u8>>,
    buf: Vec<u8>,
}

impl ChunkSink {
    fn send(&mut self) -> std::io::Result<()> {
        let full = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK_BYTES));
        self.tx
            .send(full)
            .map_err(|_| std::io::Error::other("the writer thread stopped"))
    }
}

impl Write for ChunkSink {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.is_empty() && data.len() >= CHUNK_BYTES {
            self.buf.extend_from_slice(data);
            self.send()?;
            return Ok(data.len());
        }
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK_BYTES {
            self.send()?;
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            self.send()?;
        }
        Ok(())
    }
}

/// What was written.
#[derive(Debug, Clone)]
pub struct Written {
    pub bytes: u64,
    pub tensors: usize,
    pub n_vocab: usize,
    pub seconds: f64,
}

/// Write preset `p` as file type `q` to `out` (through a temporary file renamed at the end).
pub fn write(
    p: &Preset,
    q: FileQuant,
    donor: Option<&Path>,
    out: &Path,
    seed: u64,
) -> Result<Written, SynthError> {
    let t0 = std::time::Instant::now();
    let (tok, n_vocab) = tokenizer_keys(p, donor)?;
    let mut kv = vec![(
        "general.architecture".to_string(),
        GgufValue::String(p.arch.into()),
    )];
    kv.extend(p.metadata(q.ftype()));
    kv.extend(tok);
    let decl = declare(p, q, n_vocab);
    let tensors: Vec<TensorDecl> = decl.iter().map(|(_, d)| d.clone()).collect();
    let (head, sizes) = gguf_write::header(&kv, &tensors)?;
    let tmp = out.with_extension("gguf.partial");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&head)?;
    // generate here, write on a second thread: the disk and the generator overlap
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(4);
    std::thread::scope(|scope| -> Result<(), SynthError> {
        let writer = scope.spawn(move || -> std::io::Result<()> {
            for chunk in rx {
                f.write_all(&chunk)?;
            }
            f.flush()
        });
        let generated = (|| -> std::io::Result<()> {
            let mut w = ChunkSink {
                tx,
                buf: Vec::with_capacity(CHUNK_BYTES),
            };
            let mut pools = Pools {
                rng: Rng::new(seed),
                pools: Vec::new(),
            };
            let mut rng = Rng::new(seed ^ 0x5151);
            let mut buf = Vec::with_capacity(CHUNK_BYTES);
            for ((spec, d), &n) in decl.iter().zip(&sizes) {
                match (spec.fill, d.ty) {
                    (Fill::Matrix, ty) if ty != GgmlType::F32 => {
                        write_matrix(&mut w, &mut pools, ty, n, &mut buf)?
                    }
                    _ => write_f32(&mut w, spec, &mut rng)?,
                }
                gguf_write::write_padding(&mut w, n)?;
            }
            w.flush()
        })();
        // the sink is dropped: the writer sees the end of the channel
        let written = writer
            .join()
            .map_err(|_| std::io::Error::other("the writer thread panicked"))?;
        generated?;
        written?;
        Ok(())
    })?;
    std::fs::rename(&tmp, out)?;
    Ok(Written {
        bytes: gguf_write::file_size(head.len(), &sizes),
        tensors: tensors.len(),
        n_vocab,
        seconds: t0.elapsed().as_secs_f64(),
    })
}
