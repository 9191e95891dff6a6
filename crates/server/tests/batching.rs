//! The scheduler keeps sequences independent: with any number of slots, any batching
//! and any prompt chunking, every request gets exactly what the model gives for it
//! decoded alone. Jobs are queued before the engine thread starts, so which requests
//! share a batch is deterministic.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use common::*;
use lamina_sample::SamplingParams;
use lamina_server::fake::{FakeEngine, FakeStats};
use lamina_server::metrics::Metrics;
use lamina_server::scheduler::{Command, Event, GenParams, Job, Prompt, Scheduler, StopType};
use serde_json::json;
use tokio::sync::mpsc;

struct Outcome {
    text: String,
    completion_tokens: usize,
    stop: StopType,
}

/// Runs `jobs` through a scheduler with `n_slots` slots; all are queued before the
/// engine thread starts.
fn run_jobs(
    n_slots: u32,
    n_ctx: u32,
    n_batch: u32,
    jobs: Vec<(Prompt, GenParams)>,
) -> (Vec<Outcome>, Arc<FakeStats>) {
    let engine = FakeEngine::new(n_ctx, n_slots);
    let stats = engine.stats();
    let sched = Scheduler::new(Box::new(engine), n_batch, Arc::new(Metrics::default()));
    let (tx, rx) = std::sync::mpsc::channel();
    let mut receivers = Vec::new();
    for (prompt, params) in jobs {
        let (etx, erx) = mpsc::unbounded_channel();
        tx.send(Command::Generate(vec![Job {
            prompt,
            params,
            events: etx,
        }]))
        .unwrap();
        receivers.push(erx);
    }
    drop(tx);
    let thread = std::thread::spawn(move || sched.run(rx));
    let outcomes = receivers.into_iter().map(outcome).collect();
    thread.join().unwrap();
    (outcomes, stats)
}

/// Waits for a job's events to end.
fn outcome(mut rx: mpsc::UnboundedReceiver<Event>) -> Outcome {
    let mut text = String::new();
    loop {
        match rx.blocking_recv().expect("event") {
            Event::Accepted { .. } | Event::Progress(_) => {}
            Event::Delta(d) => text.push_str(&d.text),
            Event::Done(d) => {
                return Outcome {
                    text,
                    completion_tokens: d.completion_tokens,
                    stop: d.stop_type,
                };
            }
            Event::Error(e) => panic!("{e}"),
        }
    }
}

/// The prompts of one request reach a running engine as one command and start in the
/// same step: every batch holds both, so identical prompts are computed alike.
#[test]
fn the_prompts_of_one_request_share_every_batch() {
    let engine = FakeEngine::new(2048, 2);
    let stats = engine.stats();
    let sched = Scheduler::new(Box::new(engine), 512, Arc::new(Metrics::default()));
    let (tx, rx) = std::sync::mpsc::channel();
    // Running (and waiting for work) before the request comes.
    let thread = std::thread::spawn(move || sched.run(rx));
    let mut jobs = Vec::new();
    let mut receivers = Vec::new();
    for _ in 0..2 {
        let (etx, erx) = mpsc::unbounded_channel();
        jobs.push(Job {
            prompt: Prompt::Text {
                text: "I believe the meaning of life is".into(),
                add_special: true,
            },
            params: params(SamplingParams::greedy(), 24),
            events: etx,
        });
        receivers.push(erx);
    }
    tx.send(Command::Generate(jobs)).unwrap();
    let outcomes: Vec<Outcome> = receivers.into_iter().map(outcome).collect();
    drop(tx);
    thread.join().unwrap();
    assert_eq!(outcomes[0].text, outcomes[1].text);
    let seqs = stats.seqs_per_batch.lock().unwrap();
    assert!(!seqs.is_empty() && seqs.iter().all(|&n| n == 2), "{seqs:?}");
}

fn prompts() -> Vec<String> {
    (0..12)
        .map(|i| format!("prompt number {i}: {}", "abc ".repeat(i)))
        .collect()
}

fn params(sampling: SamplingParams, max_tokens: u32) -> GenParams {
    GenParams {
        sampling,
        max_tokens: Some(max_tokens),
        ..GenParams::default()
    }
}

fn sampled() -> SamplingParams {
    serde_json::from_value(
        json!({"temperature": 1.2, "top_k": 0, "min_p": 0.0, "seed": 7,
        "repeat_penalty": 1.1, "presence_penalty": 0.3}),
    )
    .unwrap()
}

#[test]
fn one_slot_and_four_slots_give_identical_outputs() {
    for sampling in [SamplingParams::greedy(), sampled()] {
        let jobs: Vec<(Prompt, GenParams)> = prompts()
            .into_iter()
            .map(|p| {
                (
                    Prompt::Text {
                        text: p,
                        add_special: true,
                    },
                    params(sampling.clone(), 48),
                )
            })
            .collect();
        let (one, stats1) = run_jobs(1, 4096, 512, jobs.clone());
        let (four, stats4) = run_jobs(4, 4 * 4096, 512, jobs);
        assert_eq!(stats1.max_seqs_per_batch.load(Ordering::Relaxed), 1);
        assert_eq!(stats4.max_seqs_per_batch.load(Ordering::Relaxed), 4);
        assert!(
            stats4.decode_calls.load(Ordering::Relaxed)
                < stats1.decode_calls.load(Ordering::Relaxed)
        );
        for (i, p) in prompts().iter().enumerate() {
            let (want, n, finish) = reference(&text_prompt(p), &sampling, Some(48), 4096, None);
            for out in [&one[i], &four[i]] {
                assert_eq!(out.text, want, "prompt {i}");
                assert_eq!(out.completion_tokens, n);
                assert_eq!(out.stop.finish_reason(), finish);
            }
        }
    }
}

/// New prompts join between steps: when a short request ends, the next queued one is
/// decoded in the same batches as the long one still running.
#[test]
fn queued_requests_join_a_running_batch() {
    let long = GenParams {
        ignore_eos: true,
        ..params(SamplingParams::greedy(), 50)
    };
    let short = GenParams {
        ignore_eos: true,
        ..params(SamplingParams::greedy(), 5)
    };
    let text = |s: &str| Prompt::Text {
        text: s.into(),
        add_special: true,
    };
    let (outs, stats) = run_jobs(
        2,
        2 * 1024,
        512,
        vec![
            (text("long one"), long),
            (text("short one"), short.clone()),
            (text("third"), short),
        ],
    );
    // Step 1 evaluates both prompts; the short one ends at step 5; the third is admitted
    // at step 6 next to the long one and ends at step 10; the long one ends at step 50.
    assert_eq!(stats.decode_calls.load(Ordering::Relaxed), 50);
    assert_eq!(stats.max_seqs_per_batch.load(Ordering::Relaxed), 2);
    let expect = [("long one", 50), ("short one", 5), ("third", 5)];
    for (out, (p, n)) in outs.iter().zip(expect) {
        let mut s = SamplingParams::greedy();
        s.logit_bias = vec![
            (lamina_server::fake::EOS, f32::NEG_INFINITY),
            (lamina_server::fake::IM_END, f32::NEG_INFINITY),
        ];
        let (want, _, _) = reference(&text_prompt(p), &s, Some(n), 1024, None);
        assert_eq!(out.text, want);
        assert_eq!(out.completion_tokens, n);
        assert_eq!(out.stop, StopType::Limit);
    }
}

/// Long prompts are processed in chunks of n_batch, mixed with other slots' decode tokens.
#[test]
fn chunked_prompts_mixed_with_decoding() {
    let long_prompt = "a long prompt that takes many chunks ".repeat(8);
    let jobs = vec![
        (
            Prompt::Text {
                text: "short".into(),
                add_special: true,
            },
            params(SamplingParams::greedy(), 40),
        ),
        (
            Prompt::Text {
                text: long_prompt.clone(),
                add_special: true,
            },
            params(SamplingParams::greedy(), 40),
        ),
        (
            Prompt::Tokens(text_prompt("tokens")),
            params(SamplingParams::greedy(), 40),
        ),
    ];
    let (outs, stats) = run_jobs(3, 3 * 1024, 7, jobs);
    assert!(stats.decode_calls.load(Ordering::Relaxed) > 40);
    for (out, p) in outs.iter().zip(["short", long_prompt.as_str(), "tokens"]) {
        let (want, n, _) = reference(
            &text_prompt(p),
            &SamplingParams::greedy(),
            Some(40),
            1024,
            None,
        );
        assert_eq!(out.text, want);
        assert_eq!(out.completion_tokens, n);
    }
}

/// A slot reuses the KV cells of its previous prompt's common prefix; the output is the
/// same as without the cache.
#[test]
fn prompt_cache_reuses_the_common_prefix() {
    let engine = FakeEngine::new(1024, 1);
    let sched = Scheduler::new(Box::new(engine), 512, Arc::new(Metrics::default()));
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || sched.run(rx));
    let ask = |text: &str| {
        let (etx, mut erx) = mpsc::unbounded_channel();
        let job = Job {
            prompt: Prompt::Text {
                text: text.into(),
                add_special: true,
            },
            params: params(SamplingParams::greedy(), 20),
            events: etx,
        };
        tx.send(Command::Generate(vec![job])).unwrap();
        let mut out = String::new();
        loop {
            match erx.blocking_recv().unwrap() {
                Event::Delta(d) => out.push_str(&d.text),
                Event::Done(d) => return (out, d.cached_tokens),
                Event::Error(e) => panic!("{e}"),
                Event::Accepted { .. } | Event::Progress(_) => {}
            }
        }
    };
    let first = "a shared system prompt, then question one";
    let second = "a shared system prompt, then question two";
    let (_, cached) = ask(first);
    assert_eq!(cached, 0);
    let (out, cached) = ask(second);
    let common = text_prompt(first)
        .iter()
        .zip(text_prompt(second))
        .take_while(|(a, b)| **a == *b)
        .count();
    assert_eq!(cached, common);
    let (want, _, _) = reference(
        &text_prompt(second),
        &SamplingParams::greedy(),
        Some(20),
        1024,
        None,
    );
    assert_eq!(out, want);
    // The same prompt again: everything but the last token comes from the cache.
    let (out, cached) = ask(second);
    assert_eq!(cached, text_prompt(second).len() - 1);
    assert_eq!(out, want);
    drop(tx);
    thread.join().unwrap();
}

#[test]
fn outcomes_do_not_depend_on_arrival_order() {
    let jobs: Vec<(Prompt, GenParams)> = prompts()
        .into_iter()
        .map(|p| {
            (
                Prompt::Text {
                    text: p,
                    add_special: true,
                },
                params(sampled(), 32),
            )
        })
        .collect();
    let mut reversed = jobs.clone();
    reversed.reverse();
    let (a, _) = run_jobs(3, 3 * 2048, 16, jobs);
    let (mut b, _) = run_jobs(3, 3 * 2048, 16, reversed);
    b.reverse();
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.text, y.text);
    }
}
