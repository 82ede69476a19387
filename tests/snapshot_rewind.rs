//! Rewinds of a recurrent model (Qwen3.5's Gated DeltaNet layers) through the session's
//! snapshots of its recurrent state: a session goes back to a position it kept a snapshot of
//! (the end of a prompt) and then computes exactly what a fresh session fed the same tokens
//! computes; a rewind to a position without one is refused, `rewind_near` goes back to the
//! newest snapshot at or before it. Golden tiny checkpoints (dense and MoE), CPU.

mod common;

use std::sync::Arc;

use fucina::model::{CausalLm, Session};
use fucina::sampling::argmax;

fn prompt(model: &Arc<dyn CausalLm>, n: usize) -> Vec<u32> {
    let vocab = model.info().vocab_size as u32;
    (0..n as u32).map(|i| (i * 7 + 3) % vocab).collect()
}

/// `n` greedy tokens after `logits`, fed to `s`; returns them and the logits of each.
fn greedy(s: &mut dyn Session, mut logits: Vec<f32>, n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let (mut toks, mut all) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = argmax(&logits);
        logits = s.forward(&[t], false).unwrap().last().to_vec();
        toks.push(t);
        all.push(logits.clone());
    }
    (toks, all)
}

fn rewinds_through_snapshots(case: &str) {
    let model = common::cpu_model(&format!("golden/models/{case}/hf"));
    let p = prompt(&model, 24);
    let mut s = model.clone().new_session();
    let first = s.forward(&p, false).unwrap().last().to_vec();
    let (gen, _) = greedy(&mut *s, first, 6);
    assert_eq!(s.len(), 30);

    // no snapshot at 27: refused, and the session is left as it was
    let e = s.rewind(27).unwrap_err().to_string();
    assert!(e.contains("cannot rewind to 27"), "{e}");
    assert_eq!(s.len(), 30);

    // the newest snapshot at or before 27 is the end of the prompt
    assert_eq!(s.rewind_near(27).unwrap(), 24);
    assert_eq!(s.len(), 24);
    // on from there == a fresh session fed the same tokens
    let mut cont = gen[..3].to_vec();
    cont.push((gen[3] + 1) % model.info().vocab_size as u32);
    let got = s.forward(&cont, false).unwrap().last().to_vec();
    let (got_gen, got_all) = greedy(&mut *s, got.clone(), 4);

    let mut fresh = model.clone().new_session();
    fresh.forward(&p, false).unwrap();
    let want = fresh.forward(&cont, false).unwrap().last().to_vec();
    let (want_gen, want_all) = greedy(&mut *fresh, want.clone(), 4);
    assert_eq!(got, want, "{case}: logits after the rewind");
    assert_eq!(got_gen, want_gen);
    assert_eq!(got_all, want_all);

    // the prompt of that pass (4 tokens) left a snapshot at 28: an exact rewind there works,
    // and the end of the first prompt is still kept
    assert_eq!(s.rewind_near(28).unwrap(), 28);
    s.rewind(24).unwrap();
    assert_eq!(s.len(), 24);
    // before every snapshot: from the start
    assert_eq!(s.rewind_near(10).unwrap(), 0);
    assert_eq!(s.len(), 0);
    let again = s.forward(&p, false).unwrap().last().to_vec();
    let mut fresh = model.clone().new_session();
    assert_eq!(again, fresh.forward(&p, false).unwrap().last().to_vec());
}

#[test]
fn qwen35_rewinds_to_its_snapshots() {
    rewinds_through_snapshots("qwen35");
}

#[test]
fn qwen35moe_rewinds_to_its_snapshots() {
    rewinds_through_snapshots("qwen35moe");
}

/// Attention-only models rewind anywhere, `rewind_near` included.
#[test]
fn attention_models_rewind_exactly() {
    let model = common::cpu_model("golden/models/qwen3/hf");
    let p = prompt(&model, 20);
    let mut s = model.clone().new_session();
    s.forward(&p, false).unwrap();
    assert_eq!(s.rewind_near(13).unwrap(), 13);
    assert_eq!(s.len(), 13);
}

/// The engine's prefix reuse on a recurrent model: a second request whose prompt extends the
/// first's (its prompt, its answer, more) reuses the kept session from its snapshot at the end
/// of the first prompt (a hit in the metrics) and gets the tokens a fresh session gets.
#[test]
fn the_engine_reuses_a_recurrent_prefix() {
    use fucina::engine::scheduler::{self, SchedulerConfig};
    use fucina::engine::{Event, GenerateRequest, SamplingParams, StopParams};

    let model = common::cpu_model("golden/models/qwen35/hf");
    let e = scheduler::spawn(
        model.clone(),
        Arc::new(common::byte_tokenizer()),
        SchedulerConfig::default(),
    );
    let run = |prompt: Vec<u32>| -> Vec<u32> {
        let req = GenerateRequest {
            request_id: "r".into(),
            prompt,
            sampling: SamplingParams {
                temperature: 0.0,
                ..Default::default()
            },
            stop: StopParams {
                max_tokens: 5,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut s = e.submit(req).unwrap();
        let mut ids = Vec::new();
        loop {
            match s.next_blocking().expect("a terminal event") {
                Event::Token { id, .. } => ids.push(id),
                Event::Finished { .. } => return ids,
                Event::Error(err) => panic!("{err}"),
            }
        }
    };
    let p1 = prompt(&model, 30);
    let a1 = run(p1.clone());
    assert_eq!(e.metrics().snapshot().prefix_hit_rate(), 0.0);
    let mut p2 = p1.clone();
    p2.extend(&a1);
    p2.extend([5, 6, 7]);
    let a2 = run(p2.clone());
    assert!(e.metrics().snapshot().prefix_hit_rate() > 0.0);
    // what a fresh session computes: the greedy tokens after p2
    let mut s = model.clone().new_session();
    let l = s.forward(&p2, false).unwrap().last().to_vec();
    let (want, _) = greedy(&mut *s, l, 5);
    assert_eq!(a2, want);
}
