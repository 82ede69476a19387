//! A request whose client goes away stops where it is: while queued (never run) and while its
//! prompt runs (at the next prefill chunk), and the engine serves the next request.

mod common;

use std::sync::Arc;
use std::time::Duration;

use fucina::engine::scheduler::{self, SchedulerConfig};
use fucina::engine::{EngineHandle, Event, FinishReason, GenerateRequest, StopParams};

/// The scripted model at `delay` per forward pass, prompts run one token per pass.
fn engine(delay: Duration) -> EngineHandle {
    scheduler::spawn(
        common::ScriptedLm::new(4096, delay),
        Arc::new(common::tokenizer()),
        SchedulerConfig {
            model_id: "scripted".into(),
            skip_special: false,
            prefix_reuse: false,
            prefill_chunk: 1,
            ..SchedulerConfig::default()
        },
    )
}

fn request(prompt_len: usize, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        request_id: "t".into(),
        prompt: vec![b'a' as u32; prompt_len],
        stop: StopParams {
            max_tokens,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn finish(s: &mut fucina::engine::RequestStream) -> FinishReason {
    loop {
        match s.next_blocking().expect("a terminal event") {
            Event::Token { .. } => {}
            Event::Finished { reason, .. } => return reason,
            Event::Error(e) => panic!("{e}"),
        }
    }
}

#[test]
fn a_cancelled_prompt_stops_at_the_next_chunk() {
    // 400 prompt tokens at 5 ms a pass: 2 s of prefill if it ran to the end
    let e = engine(Duration::from_millis(5));
    let mut s = e.submit(request(400, 4)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    s.cancel();
    assert_eq!(finish(&mut s), FinishReason::Cancelled);
    let m = e.metrics().snapshot();
    assert_eq!(m.requests_cancelled, 1);
    assert!(
        m.prefill_tokens < 400,
        "the whole prompt ran: {} tokens",
        m.prefill_tokens
    );
    // the engine goes on with the next request
    let mut s = e.submit(request(3, 2)).unwrap();
    assert_ne!(finish(&mut s), FinishReason::Cancelled);
}

#[test]
fn a_cancelled_queued_request_never_runs() {
    let e = engine(Duration::from_millis(5));
    // the first request holds the engine for 40 passes
    let mut first = e.submit(request(40, 1)).unwrap();
    let queued = e.submit(request(50, 4)).unwrap();
    drop(queued);
    assert_ne!(finish(&mut first), FinishReason::Cancelled);
    let mut last = e.submit(request(2, 1)).unwrap();
    assert_ne!(finish(&mut last), FinishReason::Cancelled);
    let m = e.metrics().snapshot();
    assert_eq!(m.requests_cancelled, 1);
    // only the two requests that ran prefilled: 40 + 2 prompt tokens
    assert_eq!(m.prefill_tokens, 42);
}
