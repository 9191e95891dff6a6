//! Loopback load test: 16 concurrent clients against an in-process server with the fake
//! engine, once per slot count, reporting failures, throughput and resident memory.
//!
//! cargo run --release -p lamina-server --example loadtest -- \
//!     [--secs 60] [--clients 16] [--slots 1,4] [--max-requests 1000000] [--max-tokens 64] \
//!     [--decode-base-us 2000] [--decode-token-us 50]
//!
//! The decode costs make the fake behave like a model whose forward pass has a fixed
//! cost per step plus a cost per token (what batching amortizes); 0 measures the
//! server's own overhead.

use std::time::Duration;

use lamina_server::ServerConfig;
use lamina_server::fake::FakeEngine;
use lamina_server::testing::{rss_kib, run_load};

struct Opts {
    secs: u64,
    clients: usize,
    slots: Vec<u32>,
    max_requests: u64,
    max_tokens: u32,
    decode_base_us: u64,
    decode_token_us: u64,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        secs: 60,
        clients: 16,
        slots: vec![1, 4],
        max_requests: 1_000_000,
        max_tokens: 64,
        decode_base_us: 2000,
        decode_token_us: 50,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let num = || value.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--secs" => o.secs = num()?.min(3600),
            "--clients" => o.clients = num()?.clamp(1, 1024) as usize,
            "--max-requests" => o.max_requests = num()?,
            "--max-tokens" => o.max_tokens = num()?.clamp(1, 4096) as u32,
            "--decode-base-us" => o.decode_base_us = num()?,
            "--decode-token-us" => o.decode_token_us = num()?,
            "--slots" => {
                o.slots = value
                    .split(',')
                    .map(|s| s.trim().parse::<u32>().map_err(|e| format!("--slots: {e}")))
                    .collect::<Result<_, _>>()?;
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(o)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("loadtest: {e}");
            std::process::exit(2);
        }
    };
    let mut any_failed = false;
    for &slots in &o.slots {
        let engine = FakeEngine::new(slots.max(1) * 4096, slots).with_decode_cost(
            Duration::from_micros(o.decode_base_us),
            Duration::from_micros(o.decode_token_us),
        );
        let stats = engine.stats();
        let config = ServerConfig {
            queue_size: o.clients,
            ..ServerConfig::default()
        };
        let addr = lamina_server::spawn_local(Box::new(engine), config)
            .await
            .expect("server starts");
        let rss_start = rss_kib().unwrap_or(0);
        // A short warm-up, so the allocator's steady state is the baseline.
        let warm = run_load(addr, o.clients, Duration::from_secs(2), 2_000, o.max_tokens).await;
        let rss_warm = rss_kib().unwrap_or(0);
        // Resident memory every 10 s of the run: it should level off, not climb.
        let series = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
        let series_w = series.clone();
        let sampler = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                if let Ok(mut s) = series_w.lock() {
                    s.push(rss_kib().unwrap_or(0));
                }
            }
        });
        let r = run_load(
            addr,
            o.clients,
            Duration::from_secs(o.secs),
            o.max_requests,
            o.max_tokens,
        )
        .await;
        sampler.abort();
        let rss_end = rss_kib().unwrap_or(0);
        let decodes = stats
            .decode_calls
            .load(std::sync::atomic::Ordering::Relaxed);
        let tokens = stats
            .tokens_decoded
            .load(std::sync::atomic::Ordering::Relaxed);
        println!(
            "-np {slots}: {} requests in {:.1} s, {} failed (warm-up {} failed), {:.1} req/s, {:.0} generated tok/s, \
             {:.2} tokens per decode step, RSS start {} KiB, after warm-up {} KiB, end {} KiB ({:+} KiB over the run)",
            r.requests,
            r.elapsed.as_secs_f64(),
            r.failures,
            warm.failures,
            r.requests_per_sec(),
            r.tokens_per_sec(),
            tokens as f64 / decodes.max(1) as f64,
            rss_start,
            rss_warm,
            rss_end,
            rss_end as i64 - rss_warm as i64,
        );
        if let Ok(s) = series.lock() {
            println!("  RSS every 10 s (KiB): {s:?}");
        }
        for f in r.failure_samples.iter().chain(&warm.failure_samples) {
            println!("  failure: {f}");
        }
        any_failed |= r.failures + warm.failures > 0;
    }
    if any_failed {
        std::process::exit(1);
    }
}
