//! Long prompts prefill in chunks (`FUCINA_PREFILL_CHUNK`, default 8192): the logits of the last
//! token equal those of one unchunked pass (the `all = true` path never chunks), and decoding
//! continues from the chunked cache as from the unchunked one. Tiny golden models on the CPU,
//! with chunks of 5 tokens.

use std::path::Path;
use std::sync::Arc;

use fucina::backend::cpu::CpuBackend;
use fucina::model::registry::{load_model, LoadOptions};
use fucina::model::CausalLm;
use fucina::weights::Checkpoint;

fn golden(case: &str, file: &str) -> Arc<dyn CausalLm> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden/models")
        .join(case)
        .join(file);
    let ckpt = Checkpoint::open(&p).unwrap();
    load_model(
        &ckpt,
        Arc::new(CpuBackend::new()),
        &LoadOptions {
            max_context: 256,
            ..Default::default()
        },
    )
    .unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn chunked_prefill_matches_one_pass() {
    // set before any model runs in this process (the chunk size is read once)
    std::env::set_var("FUCINA_PREFILL_CHUNK", "5");
    assert_eq!(fucina::model::common::prefill_chunk(), 5);
    for (case, file) in [
        ("qwen3", "hf"),
        ("gemma3_gguf", "model.gguf"),
        ("gemma4", "hf"),
    ] {
        let lm = golden(case, file);
        let vocab = lm.info().vocab_size as u32;
        let prompt: Vec<u32> = (0..23u32).map(|i| (i * 37 + 11) % vocab).collect();
        let mut whole = lm.clone().new_session();
        let mut chunked = lm.clone().new_session();
        let a = whole.forward(&prompt, true).unwrap();
        let b = chunked.forward(&prompt, false).unwrap();
        assert_eq!(chunked.len(), prompt.len());
        let d = max_diff(a.last(), b.last());
        assert!(d < 1e-4, "{case}: chunked prefill differs by {d}");
        let next = [7u32 % vocab];
        let a = whole.forward(&next, false).unwrap();
        let b = chunked.forward(&next, false).unwrap();
        let d = max_diff(a.last(), b.last());
        assert!(
            d < 1e-4,
            "{case}: decode after a chunked prefill differs by {d}"
        );
    }
}
