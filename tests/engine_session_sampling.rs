//! The scheduler's two sampling paths give the same tokens on the CPU backend: session sampling
//! (`Session::forward_sample` with the backend's sampler, taken when a request asks for no
//! logprobs) and the host path (host logits + `engine::Sampler`, taken with logprobs). Greedy and
//! seeded, with penalties, EOS masking (`min_tokens`) and forced thinking-budget tokens, on the
//! tiny golden Qwen3 and Gemma 3 (GGUF) models.

mod common;

use std::path::Path;
use std::sync::Arc;

use fucina::backend::cpu::CpuBackend;
use fucina::engine::scheduler::{self, SchedulerConfig};
use fucina::engine::{
    EngineHandle, Event, GenerateRequest, SamplingParams, StopParams, ThinkBudget,
};
use fucina::model::registry::{load_model, LoadOptions};
use fucina::model::{CausalLm, HostSampler, TokenSampler};
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

fn engine(lm: Arc<dyn CausalLm>) -> EngineHandle {
    scheduler::spawn(
        lm,
        Arc::new(common::byte_tokenizer()),
        SchedulerConfig {
            model_id: "golden".into(),
            skip_special: false,
            prefix_reuse: false,
            prefill_chunk: 8192,
            ..SchedulerConfig::default()
        },
    )
}

fn run(e: &EngineHandle, mut req: GenerateRequest, logprobs: Option<usize>) -> Vec<u32> {
    req.logprobs = logprobs;
    let mut s = e.submit(req).unwrap();
    let mut ids = Vec::new();
    loop {
        match s.next_blocking().expect("a terminal event") {
            Event::Token {
                id, logprobs: lp, ..
            } => {
                // (forced thinking-budget tokens carry no logprobs)
                assert!(lp.is_none() || logprobs.is_some());
                ids.push(id);
            }
            Event::Finished { .. } => return ids,
            Event::Error(err) => panic!("{err}"),
        }
    }
}

fn requests() -> Vec<(&'static str, GenerateRequest)> {
    let prompt = vec![12u32, 200, 37, 5, 91, 144, 3, 77, 250, 18];
    let base = GenerateRequest {
        request_id: "t".into(),
        prompt,
        stop: StopParams {
            max_tokens: 24,
            ..Default::default()
        },
        ..Default::default()
    };
    let greedy = SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    let seeded = SamplingParams {
        temperature: 1.3,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.01,
        seed: Some(42),
        ..Default::default()
    };
    let penalised = SamplingParams {
        repetition_penalty: 1.4,
        presence_penalty: 0.6,
        frequency_penalty: 0.3,
        ..seeded.clone()
    };
    vec![
        (
            "greedy",
            GenerateRequest {
                sampling: greedy.clone(),
                ..base.clone()
            },
        ),
        (
            "greedy + penalties",
            GenerateRequest {
                sampling: SamplingParams {
                    repetition_penalty: 1.5,
                    presence_penalty: 0.4,
                    frequency_penalty: 0.2,
                    ..greedy.clone()
                },
                ..base.clone()
            },
        ),
        (
            "seeded",
            GenerateRequest {
                sampling: seeded.clone(),
                ..base.clone()
            },
        ),
        (
            "seeded + penalties + min_tokens",
            GenerateRequest {
                sampling: penalised.clone(),
                stop: StopParams {
                    max_tokens: 24,
                    stop_token_ids: vec![233, 186, 121],
                    min_tokens: 12,
                    ..Default::default()
                },
                ..base.clone()
            },
        ),
        (
            "seeded + think budget (forced tokens)",
            GenerateRequest {
                sampling: penalised,
                think_budget: Some(ThinkBudget {
                    open_id: 250,
                    starts_open: true,
                    close_id: 251,
                    close_ids: vec![251, 10, 10],
                    budget: 4,
                }),
                ..base
            },
        ),
    ]
}

fn both_paths_agree(lm: Arc<dyn CausalLm>) {
    let e = engine(lm);
    for (what, req) in requests() {
        let on_session = run(&e, req.clone(), None);
        let on_host = run(&e, req.clone(), Some(0));
        assert!(!on_session.is_empty(), "{what}: no tokens");
        assert_eq!(on_session, on_host, "{what}: session vs host sampling");
        // and run to run
        assert_eq!(on_session, run(&e, req.clone(), None), "{what}: rerun");
        if what.contains("think") {
            let w = on_session.windows(3).any(|w| w == [251, 10, 10]);
            assert!(
                w,
                "{what}: the forced close tokens were emitted: {on_session:?}"
            );
        }
        if what.contains("min_tokens") {
            let early = &on_session[..12.min(on_session.len())];
            assert!(
                !early.iter().any(|t| [233, 186, 121].contains(t)),
                "{what}: a stop id before min_tokens: {on_session:?}"
            );
        }
    }
}

#[test]
fn qwen3_session_and_host_sampling_agree() {
    both_paths_agree(golden("qwen3", "hf"));
}

#[test]
fn gemma3_session_and_host_sampling_agree() {
    both_paths_agree(golden("gemma3_gguf", "model.gguf"));
}

/// The backend sampler (CpuBackend::sample via `forward_sample`) against `HostSampler` step by
/// step at the session level, forced tokens included.
#[test]
fn forward_sample_matches_host_sampler_step_by_step() {
    let lm = golden("qwen3", "hf");
    let vocab = lm.info().vocab_size;
    let params = SamplingParams {
        temperature: 0.9,
        top_k: 20,
        repetition_penalty: 1.3,
        frequency_penalty: 0.5,
        seed: Some(3),
        ..Default::default()
    };
    let prompt = [1u32, 2, 3, 4, 5];
    let mut a = lm.clone().new_session();
    let mut b = lm.clone().new_session();
    let mut sa = a.sampler(&params, &prompt, vocab).unwrap();
    let mut sb: Box<dyn TokenSampler> = Box::new(HostSampler(fucina::engine::Sampler::new(
        params.clone(),
        &prompt,
        vocab,
    )));
    let mut ta = a.forward_sample(&prompt, sa.as_mut(), &[]).unwrap();
    let mut tb = b.forward_sample(&prompt, sb.as_mut(), &[]).unwrap();
    for step in 0..16 {
        assert_eq!(ta, tb, "step {step}");
        let (ida, idb) = if step % 5 == 4 {
            // a forced token: recorded, not sampled
            sa.accept(7).unwrap();
            sb.accept(7).unwrap();
            (7, 7)
        } else {
            (ta, tb)
        };
        let banned = [ta];
        ta = a.forward_sample(&[ida], sa.as_mut(), &banned).unwrap();
        tb = b.forward_sample(&[idb], sb.as_mut(), &banned).unwrap();
        assert_ne!(ta, banned[0]);
    }
    assert_eq!(a.len(), b.len());
}
