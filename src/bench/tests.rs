//! CPU tests of the bench: the synthesiser round-trips through our GGUF reader, tiny shapes load
//! and run on the CPU backend, llama-quantize's type rules, the roofline arithmetic.

use std::sync::Arc;

use super::measure::{self, CpuProbe, Plan};
use super::presets::{self, Fill};
use super::roofline::{decode_bytes, roofline, KvLayer};
use super::synth::{self, declare, matrix_type, use_more_bits, FileQuant};
use crate::backend::cpu::CpuBackend;
use crate::gguf::{GgufFile, GgufValue};
use crate::model::registry::{load_model, LoadOptions};
use crate::quant::{dequantize, GgmlType};
use crate::weights::Checkpoint;

const QUANTS: [FileQuant; 3] = [FileQuant::Q4_0, FileQuant::Q4KM, FileQuant::Q8_0];

fn write_tiny(dir: &std::path::Path, key: &str, q: FileQuant) -> std::path::PathBuf {
    let p = presets::find(key).unwrap();
    let out = dir.join(format!("{key}-{}.gguf", q.name()));
    synth::write(p, q, None, &out, 7).unwrap();
    out
}

#[test]
fn synth_round_trips_through_the_reader() {
    let dir = tempfile::tempdir().unwrap();
    for key in ["tiny-qwen3", "tiny-qwen3moe", "tiny-gemma4"] {
        for q in QUANTS {
            let p = presets::find(key).unwrap();
            let path = write_tiny(dir.path(), key, q);
            let g = GgufFile::open(&path).unwrap();
            assert_eq!(g.version(), 3);
            assert_eq!(g.architecture(), Some(p.arch));
            assert_eq!(g.get_u64("general.file_type"), Some(q.ftype() as u64));
            let a = p.arch;
            assert_eq!(
                g.get_u64(&format!("{a}.block_count")),
                Some(p.n_layer as u64)
            );
            assert_eq!(
                g.get_u64(&format!("{a}.embedding_length")),
                Some(p.n_embd as u64)
            );
            assert_eq!(
                g.get_u64(&format!("{a}.feed_forward_length")),
                Some(p.n_ff as u64)
            );
            assert_eq!(
                g.get_u64(&format!("{a}.attention.head_count")),
                Some(p.n_head as u64)
            );
            let n_vocab = g.get_array("tokenizer.ggml.tokens").unwrap().len();
            assert_eq!(n_vocab, p.default_vocab);
            let decl = declare(p, q, n_vocab);
            assert_eq!(g.tensor_infos().len(), decl.len());
            for ((spec, d), info) in decl.iter().zip(g.tensor_infos()) {
                assert_eq!(info.name, d.name, "order");
                assert_eq!(info.shape(), d.shape, "{}", d.name);
                assert_eq!(info.ty, d.ty, "{}", d.name);
                let t = g.tensor(&d.name).unwrap();
                let mut vals = vec![0f32; d.elements()];
                dequantize(d.ty, t.data, &mut vals).unwrap();
                match spec.fill {
                    Fill::Const(c) => assert!(vals.iter().all(|&v| v == c), "{}", d.name),
                    Fill::RopeFreqs(n) => {
                        assert!(vals[..n].iter().all(|&v| v == 1.0));
                        assert!(vals[n..].iter().all(|&v| v == 1e30));
                    }
                    Fill::Matrix | Fill::RandomF32 => {
                        let rms =
                            (vals.iter().map(|v| v * v).sum::<f32>() / vals.len() as f32).sqrt();
                        assert!(vals.iter().all(|v| v.is_finite()), "{}", d.name);
                        assert!((0.002..0.2).contains(&rms), "{}: rms {rms}", d.name);
                    }
                }
            }
            if p.family == presets::Family::Gemma4 {
                let pat: Vec<bool> = g
                    .get_array("gemma4.attention.sliding_window_pattern")
                    .unwrap()
                    .iter()
                    .map(|v| v.as_bool().unwrap())
                    .collect();
                assert_eq!(pat, vec![true, true, true, true, true, false]);
                assert_eq!(
                    g.get_u64_array("gemma4.attention.head_count_kv").unwrap(),
                    vec![2, 2, 2, 2, 2, 1]
                );
                assert!(
                    g.tensor_info("blk.5.attn_v.weight").is_none(),
                    "K=V global layer"
                );
                assert_eq!(
                    g.tensor_info("blk.5.attn_k.weight").unwrap().shape(),
                    vec![512, 256]
                );
                assert_eq!(g.get_f32("gemma4.final_logit_softcapping"), Some(30.0));
            }
        }
    }
}

#[test]
fn tiny_shapes_load_and_run_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    for key in ["tiny-qwen3", "tiny-qwen3moe", "tiny-gemma4"] {
        for q in QUANTS {
            let path = write_tiny(dir.path(), key, q);
            let ckpt = Checkpoint::open(&path).unwrap();
            let m = load_model(
                &ckpt,
                Arc::new(CpuBackend::new()),
                &LoadOptions {
                    max_context: 64,
                    ..Default::default()
                },
            )
            .unwrap_or_else(|e| panic!("{key} {}: {e}", q.name()));
            assert_eq!(m.info().vocab_size, 512);
            let mut s = m.clone().new_session();
            let l = s.forward(&[1, 2, 3, 300, 5, 6, 7, 8], true).unwrap();
            assert_eq!((l.rows, l.vocab), (8, 512));
            assert!(l.data.iter().all(|v| v.is_finite()), "{key} {}", q.name());
            let spread = l.last().iter().fold(0f32, |a, v| a.max(v.abs()));
            assert!(spread > 0.0, "{key} {}: logits all zero", q.name());
        }
    }
}

#[test]
fn llama_quantize_type_rules() {
    let p = presets::find("qwen3-8b").unwrap();
    let q = FileQuant::Q4KM;
    assert_eq!(
        matrix_type(q, p, "output.weight", 4096, 0, 36),
        GgmlType::Q6K
    );
    assert_eq!(
        matrix_type(q, p, "token_embd.weight", 4096, 0, 36),
        GgmlType::Q4K
    );
    assert_eq!(
        matrix_type(q, p, "blk.0.attn_v.weight", 4096, 0, 36),
        GgmlType::Q6K
    );
    assert_eq!(
        matrix_type(q, p, "blk.5.attn_v.weight", 4096, 5, 36),
        GgmlType::Q4K
    );
    assert_eq!(
        matrix_type(q, p, "blk.6.ffn_down.weight", 12288, 0, 36),
        GgmlType::Q6K
    );
    assert_eq!(
        matrix_type(q, p, "blk.7.ffn_down.weight", 12288, 0, 36),
        GgmlType::Q4K
    );
    assert_eq!(
        matrix_type(q, p, "blk.3.attn_q.weight", 4096, 0, 36),
        GgmlType::Q4K
    );
    // use_more_bits(i, 36): i < 4, i >= 31, (i - 4) % 3 == 2
    let more: Vec<usize> = (0..36).filter(|&i| use_more_bits(i, 36)).collect();
    assert_eq!(
        more,
        vec![0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 31, 32, 33, 34, 35]
    );
    let g = presets::find("gemma4-12b").unwrap();
    assert_eq!(
        matrix_type(FileQuant::Q4_0, g, "token_embd.weight", 3840, 0, 40),
        GgmlType::Q6K
    );
    assert_eq!(
        matrix_type(FileQuant::Q4_0, g, "blk.0.attn_q.weight", 3840, 0, 40),
        GgmlType::Q4_0
    );
    assert_eq!(
        matrix_type(FileQuant::Q8_0, g, "token_embd.weight", 3840, 0, 40),
        GgmlType::Q8_0
    );
    // rows that are not whole K-blocks fall back
    assert_eq!(
        matrix_type(q, p, "blk.3.attn_q.weight", 4000, 0, 36),
        GgmlType::Q5_0
    );
}

#[test]
fn real_shapes_have_the_real_sizes() {
    // parameter counts of the real checkpoints: Qwen3-8B 8.19B, Qwen3-30B-A3B 30.5B, Gemma 4
    // 12B text tower ~11.8B (+ vocab)
    let count = |key: &str, vocab: usize| -> f64 {
        let p = presets::find(key).unwrap();
        p.tensors(vocab)
            .iter()
            .map(|s| s.shape.iter().product::<usize>() as f64)
            .sum::<f64>()
            / 1e9
    };
    let q8 = count("qwen3-8b", 151936);
    assert!((8.1..8.3).contains(&q8), "{q8}");
    let q30 = count("qwen3-30b-a3b", 151936);
    assert!((30.3..30.7).contains(&q30), "{q30}");
    let g = presets::find("gemma4-12b").unwrap();
    let swa = g.swa_layers();
    assert_eq!(swa.iter().filter(|&&s| !s).count(), 8);
    assert!(!swa[5] && !swa[47] && swa[0] && swa[6]);
    let specs = g.tensors(262144);
    let rf = specs
        .iter()
        .find(|s| s.name == "rope_freqs.weight")
        .unwrap();
    assert_eq!(
        (rf.shape.clone(), rf.fill),
        (vec![256], Fill::RopeFreqs(64))
    );
    let q5 = specs
        .iter()
        .find(|s| s.name == "blk.5.attn_q.weight")
        .unwrap();
    assert_eq!(q5.shape, vec![16 * 512, 3840]);
    assert!(!specs.iter().any(|s| s.name == "output.weight"), "tied");
}

#[test]
fn roofline_arithmetic() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny(dir.path(), "tiny-qwen3moe", FileQuant::Q8_0);
    let g = GgufFile::open(&path).unwrap();
    let db = decode_bytes(&g);
    // by hand: Q8_0 is 34 bytes per 32 values
    let q8 = |n: usize| (n / 32 * 34) as u64;
    let (e, v, x, f) = (256, 512, 8, 256);
    let per_layer = q8(256 * e) // q
        + 2 * q8(128 * e) // k, v
        + q8(e * 256) // o
        + 4 * (e + 64 + 64 + e) as u64 // norms (f32)
        + 4 * (x * e) as u64 // router
        + 3 * q8(f * e) * 2; // 2 of 8 experts, gate/up/down
    let want = q8(e) + 2 * per_layer + 4 * e as u64 + q8(v * e);
    assert_eq!(db.weights, want);
    assert_eq!(
        db.layers,
        vec![
            KvLayer {
                kv_dim: 128,
                window: None
            };
            2
        ]
    );
    // 10 positions seen at pos 9: K and V, 2 layers, 128 dims, 1 byte
    assert_eq!(db.kv_bytes(9, 1.0), 2 * 2 * 128 * 10);
    let r = roofline(1_000_000, 100.0, 50_000.0);
    assert!((r.roofline_tok_s - 100_000.0).abs() < 1e-6);
    assert!((r.percent - 50.0).abs() < 1e-9);
    // sliding windows cap the KV a token reads; a tied head is read in full
    let path = write_tiny(dir.path(), "tiny-gemma4", FileQuant::Q8_0);
    let g = GgufFile::open(&path).unwrap();
    let db = decode_bytes(&g);
    assert_eq!(
        db.layers[0],
        KvLayer {
            kv_dim: 256,
            window: Some(16)
        }
    );
    assert_eq!(
        db.layers[5],
        KvLayer {
            kv_dim: 512,
            window: None
        }
    );
    assert_eq!(db.kv_bytes(99, 2.0), (5 * 2 * 256 * 16 + 2 * 512 * 100) * 2);
    let emb = g.tensor_info("token_embd.weight").unwrap().n_bytes;
    let rest: u64 = g
        .tensor_infos()
        .iter()
        .filter(|t| t.name != "token_embd.weight")
        .map(|t| t.n_bytes)
        .sum();
    assert_eq!(db.weights, rest + emb + emb / 512);
}

#[test]
fn donor_tokenizer_is_copied_and_padded() {
    let dir = tempfile::tempdir().unwrap();
    let donor = write_tiny(dir.path(), "tiny-qwen3", FileQuant::Q8_0);
    let mut p = presets::find("tiny-qwen3").unwrap().clone();
    p.n_vocab = Some(600);
    let (kv, n) = synth::tokenizer_keys(&p, Some(&donor)).unwrap();
    assert_eq!(n, 600);
    let get = |k: &str| {
        kv.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    let GgufValue::Array(toks) = get("tokenizer.ggml.tokens") else {
        panic!()
    };
    assert_eq!(toks.len(), 600);
    assert_eq!(toks[599], GgufValue::String("[PAD599]".into()));
    let GgufValue::Array(types) = get("tokenizer.ggml.token_type") else {
        panic!()
    };
    assert_eq!((types.len(), &types[599]), (600, &GgufValue::I32(5)));
    assert!(kv.iter().all(|(k, _)| k.starts_with("tokenizer.")));
}

/// `measure::run` of `path` on the CPU backend: (prompt lengths, decode tokens, depths).
fn run_cpu(
    path: &std::path::Path,
    probe: &dyn measure::Probe,
    (prompt_lens, decode_tokens, depths): (Vec<usize>, usize, Vec<usize>),
    bw_bytes: usize,
    seed: u64,
) -> measure::Report {
    let plan = Plan {
        prompt_lens,
        decode_tokens,
        depths,
        bw_bytes,
        seed,
        pause_ms: 0,
        step_times: false,
        batch: vec![1, 3],
        batch_prompt: 5,
    };
    measure::run(path, Arc::new(CpuBackend::new()), probe, &plan, &mut |_| {}).unwrap()
}

#[test]
fn bench_runs_end_to_end_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny(dir.path(), "tiny-gemma4", FileQuant::Q4_0);
    let r = run_cpu(&path, &CpuProbe, (vec![8, 24], 4, vec![0, 20]), 8 << 20, 1);
    assert_eq!(r.prefill.len(), 2);
    assert_eq!(r.decode.len(), 2);
    assert!(r.bandwidth_gbs > 0.0);
    assert!(r
        .decode
        .iter()
        .all(|d| d.tok_s > 0.0 && d.roofline.percent > 0.0));
    assert!(r.decode[1].roofline.bytes_per_token > r.decode[0].roofline.bytes_per_token);
    let t = super::table(&r);
    assert!(t.contains("decode tg4 @ depth 20"), "{t}");
    // --batch 1,3: three sequences of 5 prompt tokens decoded together
    assert_eq!(r.batched.len(), 2);
    assert!(r.batched.iter().all(|b| b.tok_s > 0.0 && b.tokens == 4));
    assert!(t.contains("decode B=3 (pp5 + tg4 each) | 12 |"), "{t}");
    let j = serde_json::to_value(&r).unwrap();
    assert_eq!(j["prefill"][1]["tokens"], 24);
}

/// Counts `Probe::idle` calls, otherwise the CPU's probe.
struct IdleCounter(std::cell::Cell<usize>);

impl measure::Probe for IdleCounter {
    fn read_bandwidth(&self, bytes: usize) -> anyhow::Result<f64> {
        measure::Probe::read_bandwidth(&CpuProbe, bytes)
    }
    fn memory(&self) -> Option<(u64, u64, u64)> {
        None
    }
    fn kv_elem_bytes(&self) -> f64 {
        4.0
    }
    fn idle(&self) -> anyhow::Result<()> {
        self.0.set(self.0.get() + 1);
        Ok(())
    }
}

/// Every prefill and every decode measurement starts from an idle device (a pipelined session
/// leaves its next step queued when it ends).
#[test]
fn bench_waits_for_an_idle_device_before_each_measurement() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny(dir.path(), "tiny-qwen3", FileQuant::Q8_0);
    let probe = IdleCounter(std::cell::Cell::new(0));
    let r = run_cpu(&path, &probe, (vec![8, 16], 2, vec![0, 10, 12]), 1 << 20, 3);
    assert_eq!((r.prefill.len(), r.decode.len()), (2, 3));
    // two prompts, three depths, two batch rows
    assert_eq!(probe.0.get(), 7);
}

#[test]
fn cli_parses_bench_and_refuses_bad_input() {
    use crate::backend::Device;
    use clap::Parser;
    /// The subcommand's flags as `fucina bench` takes them.
    #[derive(Parser)]
    struct Bench {
        #[command(flatten)]
        args: super::BenchArgs,
    }
    let c = Bench::try_parse_from([
        "bench",
        "--synth",
        "qwen3-8b",
        "--quant",
        "q4_k_m",
        "--prompt-lens",
        "512,4096",
        "--depths",
        "0,4096",
        "--decode-tokens",
        "128",
        "--json",
        "o.json",
    ])
    .unwrap();
    let b = c.args;
    assert_eq!(b.prompt_lens, vec![512, 4096]);
    assert_eq!(b.depths, vec![0, 4096]);
    assert_eq!((b.decode_tokens, b.device), (128, Device::Auto));
    let dir = tempfile::tempdir().unwrap();
    let mut a = b.clone();
    a.synth = Some("nope".into());
    let e = super::model_path(&a, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("known: qwen3-8b"), "{e}");
    a.synth = Some("tiny-qwen3".into());
    a.quant = "q3_k".into();
    let e = super::model_path(&a, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("q4_0, q4_k_m or q8_0"), "{e}");
    a.quant = "q8_0".into();
    a.synth_out = Some(dir.path().join("t.gguf"));
    let p = super::model_path(&a, &mut |_| {}).unwrap();
    let len = std::fs::metadata(&p).unwrap().len();
    // reused, not rewritten, when present
    let mut logs = Vec::new();
    let p2 = super::model_path(&a, &mut |s| logs.push(s.to_string())).unwrap();
    assert_eq!((p2, std::fs::metadata(&p).unwrap().len()), (p, len));
    assert!(logs[0].starts_with("reusing"), "{logs:?}");
}

/// A synthesised file without a donor carries a tokenizer the engine loads (so the file can be
/// served, not only benchmarked): byte tokens round-trip any text.
#[test]
fn made_up_tokenizer_loads_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny(dir.path(), "tiny-qwen3", QUANTS[0]);
    let g = GgufFile::open(&path).unwrap();
    let tok = crate::tokenizer::Tokenizer::from_gguf(&g).unwrap();
    for text in ["Name three colours.", "naïve café, 42 ✓\n\tend"] {
        let ids = tok.encode(text, false).unwrap();
        assert!(ids.iter().all(|&i| i < 256), "{ids:?}");
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
    }
}
