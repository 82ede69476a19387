//! The continuous-batching scheduler on the CPU backend with the tiny golden Qwen3: concurrent
//! requests share steps (the batch-size histogram says so) and each gets exactly the tokens it
//! gets alone; a KV pool too small for all of them preempts and recomputes without changing a
//! token; a request the pool cannot hold even alone gets an error while the others go on.

mod common;

use std::sync::Arc;

use fucina::engine::scheduler::{self, SchedulerConfig};
use fucina::engine::{EngineHandle, Event, GenerateRequest, SamplingParams, StopParams};
use fucina::model::CausalLm;
use fucina::sampling::argmax;

fn tiny_qwen3() -> Arc<dyn CausalLm> {
    common::cpu_model("golden/models/qwen3/model.gguf")
}

/// 12 KV blocks of 4 positions.
fn tiny_pool() -> SchedulerConfig {
    SchedulerConfig {
        kv_blocks: Some(12),
        block_size: 4,
        ..SchedulerConfig::default()
    }
}

fn engine(lm: Arc<dyn CausalLm>, cfg: SchedulerConfig) -> EngineHandle {
    scheduler::spawn(lm, Arc::new(common::byte_tokenizer()), cfg)
}

/// The model's own greedy loop, no engine.
fn direct(lm: &Arc<dyn CausalLm>, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = lm.clone().new_session();
    let mut l = s.forward(prompt, false).unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        let id = argmax(l.last());
        out.push(id);
        l = s.forward(&[id], false).unwrap();
    }
    out
}

fn request(prompt: Vec<u32>, n: usize, sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        request_id: "b".into(),
        prompt,
        sampling,
        stop: StopParams {
            max_tokens: n,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..Default::default()
    }
}

/// Submit every request first, then read each stream to its end: ids, or the error text.
fn run_all(e: &EngineHandle, reqs: Vec<GenerateRequest>) -> Vec<Result<Vec<u32>, String>> {
    let mut streams: Vec<_> = reqs.into_iter().map(|r| e.submit(r).unwrap()).collect();
    streams
        .iter_mut()
        .map(|s| {
            let mut ids = Vec::new();
            loop {
                match s.next_blocking().expect("a terminal event") {
                    Event::Token { id, .. } => ids.push(id),
                    Event::Finished { .. } => return Ok(ids),
                    Event::Error(err) => return Err(err.to_string()),
                }
            }
        })
        .collect()
}

fn prompts(n: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            (0..3 + 2 * i)
                .map(|j| ((i * 37 + j * 11) % 250) as u32 + 1)
                .collect()
        })
        .collect()
}

#[test]
fn concurrent_requests_share_steps_and_keep_their_tokens() {
    let lm = tiny_qwen3();
    let e = engine(lm.clone(), SchedulerConfig::default());
    let ps = prompts(10);
    let got = run_all(
        &e,
        ps.iter()
            .map(|p| request(p.clone(), 40, greedy()))
            .collect(),
    );
    for (p, g) in ps.iter().zip(got) {
        assert_eq!(g.unwrap(), direct(&lm, p, 40), "prompt {p:?}");
    }
    let m = e.metrics().snapshot();
    assert!(
        m.batched_steps() > 0,
        "no step ran more than one sequence: {:?}",
        m.batch_steps
    );
    assert_eq!(m.preemptions, 0);
    assert_eq!((m.running, m.waiting), (0, 0));
}

#[test]
fn seeded_sampling_does_not_depend_on_the_batch() {
    let lm = tiny_qwen3();
    let seeded = SamplingParams {
        temperature: 1.0,
        top_k: 50,
        seed: Some(7),
        ..Default::default()
    };
    let p = prompts(4).pop().unwrap();
    let alone = run_all(
        &engine(lm.clone(), SchedulerConfig::default()),
        vec![request(p.clone(), 30, seeded.clone())],
    );
    let mut reqs: Vec<_> = prompts(6)
        .into_iter()
        .map(|q| request(q, 30, greedy()))
        .collect();
    reqs.insert(2, request(p, 30, seeded));
    let e = engine(lm, SchedulerConfig::default());
    let batched = run_all(&e, reqs);
    assert_eq!(batched[2], alone[0]);
    assert!(e.metrics().snapshot().batched_steps() > 0);
}

#[test]
fn a_tiny_pool_preempts_and_recomputes_without_changing_a_token() {
    let lm = tiny_qwen3();
    // each request needs up to 8 + 30 = 38 positions (10 of the 12 blocks)
    let e = engine(lm.clone(), tiny_pool());
    let ps: Vec<Vec<u32>> = (0..4)
        .map(|i| (0..8).map(|j| (i * 50 + j * 7) as u32 % 250 + 1).collect())
        .collect();
    let got = run_all(
        &e,
        ps.iter()
            .map(|p| request(p.clone(), 30, greedy()))
            .collect(),
    );
    for (p, g) in ps.iter().zip(got) {
        assert_eq!(g.unwrap(), direct(&lm, p, 30), "prompt {p:?}");
    }
    let m = e.metrics().snapshot();
    assert!(m.preemptions > 0, "the pool never ran out: {m:?}");
    assert_eq!(m.kv_blocks_used, 0);
    assert_eq!(m.kv_blocks_total, 12);
}

#[test]
fn a_request_the_pool_cannot_hold_fails_alone() {
    let lm = tiny_qwen3();
    let e = engine(lm.clone(), tiny_pool());
    let long: Vec<u32> = (0..60).map(|i| i % 250 + 1).collect();
    let ok = vec![5u32, 6, 7];
    let got = run_all(
        &e,
        vec![request(long, 4, greedy()), request(ok.clone(), 8, greedy())],
    );
    assert!(
        got[0].as_ref().unwrap_err().contains("KV blocks"),
        "{got:?}"
    );
    assert_eq!(got[1].as_ref().unwrap(), &direct(&lm, &ok, 8));
    // a sequence that outgrows the pool while decoding alone ends with an error too
    let grows = run_all(&e, vec![request(vec![1, 2, 3], 60, greedy())]);
    assert!(grows[0]
        .as_ref()
        .unwrap_err()
        .contains("KV cache cannot hold"));
}

#[test]
fn a_client_leaving_mid_decode_frees_its_sequence_and_the_others_go_on() {
    let lm = tiny_qwen3();
    let e = engine(lm.clone(), SchedulerConfig::default());
    let ps = prompts(3);
    let mut streams: Vec<_> = ps
        .iter()
        .map(|p| e.submit(request(p.clone(), 60, greedy())).unwrap())
        .collect();
    // the second client reads three tokens and goes away
    let mut leaving = streams.remove(1);
    for _ in 0..3 {
        assert!(matches!(leaving.next_blocking(), Some(Event::Token { .. })));
    }
    drop(leaving);
    for (p, mut s) in [&ps[0], &ps[2]].into_iter().zip(streams) {
        let mut ids = Vec::new();
        loop {
            match s.next_blocking().expect("a terminal event") {
                Event::Token { id, .. } => ids.push(id),
                Event::Finished { .. } => break,
                Event::Error(err) => panic!("{err}"),
            }
        }
        assert_eq!(ids, direct(&lm, p, 60));
    }
    let m = e.metrics().snapshot();
    assert_eq!(m.requests_cancelled, 1);
    assert_eq!((m.running, m.waiting, m.kv_blocks_used), (0, 0, 0));
}
