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
//!
//! With `--addr 127.0.0.1:PORT [--pid PID]` it drives a running `lamina serve` (a real
//! model) instead, and samples that process's resident memory.

use std::time::Duration;

use lamina_server::ServerConfig;
use lamina_server::fake::FakeEngine;
use lamina_server::testing::{LoadReport, rss_kib, run_load};

struct Opts {
    secs: u64,
    clients: usize,
    slots: Vec<u32>,
    max_requests: u64,
    max_tokens: u32,
    decode_base_us: u64,
    decode_token_us: u64,
    /// A running server to drive instead of the in-process fake.
    addr: Option<std::net::SocketAddr>,
    /// Its process id, for its resident memory.
    pid: Option<u32>,
}

/// Resident memory of process `pid` (this process when `None`), in KiB.
fn rss_of(pid: Option<u32>) -> Option<u64> {
    match pid {
        None => rss_kib(),
        Some(pid) => std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()),
    }
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
        addr: None,
        pid: None,
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
            "--addr" => o.addr = Some(value.parse().map_err(|e| format!("--addr: {e}"))?),
            "--pid" => o.pid = Some(num()? as u32),
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

/// What one load run measured.
struct Measured {
    warm: LoadReport,
    run: LoadReport,
    rss_start: u64,
    rss_warm: u64,
    rss_end: u64,
    series: Vec<u64>,
}

/// A 2 s warm-up, then the run, sampling the server's resident memory every 10 s.
async fn measure(addr: std::net::SocketAddr, o: &Opts) -> Measured {
    let pid = o.pid;
    let rss_start = rss_of(pid).unwrap_or(0);
    // A short warm-up, so the allocator's steady state is the baseline.
    let warm = run_load(addr, o.clients, Duration::from_secs(2), 2_000, o.max_tokens).await;
    let rss_warm = rss_of(pid).unwrap_or(0);
    // Resident memory every 10 s of the run: it should level off, not climb.
    let series = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let series_w = series.clone();
    let sampler = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            if let Ok(mut s) = series_w.lock() {
                s.push(rss_of(pid).unwrap_or(0));
            }
        }
    });
    let run = run_load(
        addr,
        o.clients,
        Duration::from_secs(o.secs),
        o.max_requests,
        o.max_tokens,
    )
    .await;
    sampler.abort();
    let rss_end = rss_of(pid).unwrap_or(0);
    let series = series.lock().map(|s| s.clone()).unwrap_or_default();
    Measured {
        warm,
        run,
        rss_start,
        rss_warm,
        rss_end,
        series,
    }
}

/// Prints a run's figures; returns whether any request failed.
fn report(label: &str, m: &Measured, tokens_per_step: Option<f64>) -> bool {
    let r = &m.run;
    println!(
        "{label}: {} requests in {:.1} s, {} failed (warm-up {} failed), {:.2} req/s, {:.1} generated tok/s, \
         {}RSS start {} KiB, after warm-up {} KiB, end {} KiB ({:+} KiB over the run)",
        r.requests,
        r.elapsed.as_secs_f64(),
        r.failures,
        m.warm.failures,
        r.requests_per_sec(),
        r.tokens_per_sec(),
        tokens_per_step.map_or(String::new(), |t| format!(
            "{t:.2} tokens per decode step, "
        )),
        m.rss_start,
        m.rss_warm,
        m.rss_end,
        m.rss_end as i64 - m.rss_warm as i64,
    );
    println!("  RSS every 10 s (KiB): {:?}", m.series);
    for f in r.failure_samples.iter().chain(&m.warm.failure_samples) {
        println!("  failure: {f}");
    }
    r.failures + m.warm.failures > 0
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
    if let Some(addr) = o.addr {
        let m = measure(addr, &o).await;
        if report(&format!("server at {addr}"), &m, None) {
            std::process::exit(1);
        }
        return;
    }
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
        let m = measure(addr, &o).await;
        let decodes = stats
            .decode_calls
            .load(std::sync::atomic::Ordering::Relaxed);
        let tokens = stats
            .tokens_decoded
            .load(std::sync::atomic::Ordering::Relaxed);
        any_failed |= report(
            &format!("-np {slots}"),
            &m,
            Some(tokens as f64 / decodes.max(1) as f64),
        );
    }
    if any_failed {
        std::process::exit(1);
    }
}
