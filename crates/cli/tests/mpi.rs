//! `lamina` under `mpirun` (feature `mpi`), as a user runs it across machines, here with every
//! rank on this machine (`--oversubscribe`): the other ranks' devices are listed; a model split
//! over 2 and 3 ranks, evenly and not, prints the same text, logits and perplexity as one
//! process, bit for bit; a rank that is killed or hung ends the job with an error naming it,
//! within the wait bound, not a hang.
#![cfg(feature = "mpi")]

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use lamina_gguf::pull::model_for_test;

const LAMINA: &str = env!("CARGO_BIN_EXE_lamina");
const TEXT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/reference/areopagitica-short.txt"
);

fn mpirun(ranks: usize, args: &[&str]) -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--oversubscribe", "--bind-to", "none", "-np"])
        .arg(ranks.to_string())
        // Containers often forbid the cross-process reads of OpenMPI's shared-memory copies.
        .args(["--mca", "btl_vader_single_copy_mechanism", "none"])
        .arg(LAMINA)
        .args(args)
        // CI runs as root; mpirun refuses that unless told it is meant.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    c
}

fn output(mut c: Command) -> Output {
    let o = c.output().expect("start (is OpenMPI's mpirun installed?)");
    assert!(
        o.status.success(),
        "{c:?}: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Stdout of `lamina args` in one process (ranks 1) or under `mpirun -np ranks`.
fn stdout(ranks: usize, args: &[&str]) -> String {
    let c = if ranks == 1 {
        let mut c = Command::new(LAMINA);
        c.args(args);
        c
    } else {
        mpirun(ranks, args)
    };
    String::from_utf8_lossy(&output(c).stdout).into_owned()
}

#[test]
fn devices_lists_every_rank() {
    let out = stdout(3, &["devices"]);
    for name in ["CPU", "CPU@1", "CPU@2"] {
        assert!(
            out.lines()
                .any(|l| l.trim_start().starts_with(&format!("{name}: "))),
            "{name}: {out}"
        );
    }
    assert!(out.contains("(rank 2)"), "{out}");
}

/// For each model: greedy text (prompt pipelined in micro-batches), every position's logits and
/// the perplexity of the shared text, one process against 2 and 3 ranks with even and uneven
/// layer splits.
fn same_as_one_process(model: &str) {
    let Some(path) = model_for_test(model) else {
        return;
    };
    let m = path.to_str().unwrap();
    let prompt = "Areopagitica is a prose polemic by John Milton. It argues that";
    let run = [
        "run", "-m", m, "-p", prompt, "-n", "16", "--temp", "0", "-t", "1", "-ub", "8",
    ];
    let logits = [
        "logits", "-m", m, "-p", prompt, "--all", "--json", "-c", "64", "-t", "1",
    ];
    let ppl = [
        "perplexity",
        "-m",
        m,
        "-f",
        TEXT,
        "-c",
        "128",
        "--chunks",
        "2",
        "-t",
        "1",
    ];
    let uneven2 = ["--split-mode", "layer", "--tensor-split", "3,1"];
    let uneven3 = [
        "--split-mode",
        "layer",
        "--device",
        "CPU,CPU@1,CPU@2",
        "--tensor-split",
        "1,2,1",
    ];
    let with = |base: &[&str], extra: &[&str]| -> Vec<String> {
        base.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let check = |what: &str, base: &[&str]| {
        let one = stdout(1, base);
        assert!(!one.trim().is_empty(), "{what}: no output");
        for (ranks, extra) in [(2, &[][..]), (2, &uneven2[..]), (3, &uneven3[..])] {
            let args = with(base, extra);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let got = stdout(ranks, &args);
            assert!(
                got == one,
                "{model} {what} on {ranks} ranks {extra:?} differs from one process:\n{got}\n---\n{one}"
            );
        }
    };
    check("run", &run);
    check("logits", &logits);
    // The perplexity text is shared data beside the checkout; without it this part is skipped.
    if !std::path::Path::new(TEXT).exists() {
        eprintln!("skipping the perplexity part: {TEXT} is absent (no ../shared)");
        return;
    }
    // Perplexity prints its figures on stderr; the final estimate is the figure to compare.
    let estimate = |ranks: usize, extra: &[&str]| {
        let args = with(&ppl, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let c = if ranks == 1 {
            let mut c = Command::new(LAMINA);
            c.args(&args);
            c
        } else {
            mpirun(ranks, &args)
        };
        let o = output(c);
        let all =
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
        all.lines()
            .find(|l| l.contains("Final estimate"))
            .unwrap_or_else(|| panic!("no final estimate: {all}"))
            .trim()
            .to_string()
    };
    let one = estimate(1, &[]);
    assert_eq!(estimate(2, &uneven2), one, "{model} perplexity on 2 ranks");
    assert_eq!(estimate(3, &[]), one, "{model} perplexity on 3 ranks");
}

#[test]
fn smollm2_over_ranks_is_bit_identical_to_one_process() {
    same_as_one_process("smollm2-135m");
}

#[test]
fn gemma3_over_ranks_is_bit_identical_to_one_process() {
    same_as_one_process("gemma3-270m");
}

/// The pid of rank `rank` among `mpirun`'s children.
fn rank_pid(mpirun: u32, rank: usize) -> Option<u32> {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // "pid (comm) state ppid ...": comm may hold spaces, so count from the last ')'.
        let ppid: u32 = stat
            .rsplit(')')
            .next()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let has = env.split(|&b| b == 0).any(|v| v == want.as_bytes());
        (ppid == mpirun && has).then_some(pid)
    })
}

/// A job under `mpirun` whose stderr is collected as it comes (`lines` sees each line too).
struct Job {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    stderr: std::thread::JoinHandle<String>,
}

fn start(mut c: Command, timeout_s: &str) -> Job {
    c.env("LAMINA_DEVICE_TIMEOUT", timeout_s)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("start mpirun");
    let err = child.stderr.take().unwrap();
    let (tx, lines) = mpsc::channel();
    let stderr = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufRead::lines(std::io::BufReader::new(err)).map_while(Result::ok) {
            let _ = tx.send(line.clone());
            all += &line;
            all.push('\n');
        }
        all
    });
    Job {
        child,
        lines,
        stderr,
    }
}

impl Job {
    /// Sends rank `rank` the signal `signal` (`-KILL`, `-STOP`).
    fn signal_rank(&self, rank: usize, signal: &str) {
        let pid = rank_pid(self.child.id(), rank).expect("the rank's process");
        let sent = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    }

    /// Waits for the job to end, at most `bound`: its stderr and whether it succeeded.
    fn end_within(mut self, bound: Duration) -> (String, bool) {
        if let Some(mut out) = self.child.stdout.take() {
            std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        }
        let (tx, rx) = mpsc::channel();
        let mut child = self.child;
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        let status = rx
            .recv_timeout(bound)
            .unwrap_or_else(|_| panic!("the job still runs {bound:?} after the fault"))
            .unwrap();
        (self.stderr.join().unwrap(), status.success())
    }
}

/// Starts a long generation over 2 ranks, waits until text comes out (the ranks are at work),
/// sends rank 1 `signal`, and returns the job's stderr and whether it succeeded; the job must
/// end within `bound`.
fn fault(signal: &str, timeout_s: &str, bound: Duration) -> (String, bool) {
    let path = model_for_test("smollm2-135m").unwrap();
    let c = mpirun(
        2,
        &[
            "run",
            "-m",
            path.to_str().unwrap(),
            "-p",
            "Once upon a time",
            "-n",
            "4000",
            "-c",
            "4096",
            "--ignore-eos",
            "--temp",
            "0",
            "-t",
            "1",
        ],
    );
    let mut job = start(c, timeout_s);
    let out = job.child.stdout.as_mut().unwrap();
    // The prompt is echoed first; more than it means tokens are being generated.
    let mut seen = 0;
    let mut buf = [0u8; 256];
    while seen < "Once upon a time".len() + 8 {
        let n = out.read(&mut buf).unwrap();
        assert!(n > 0, "the job ended before generating");
        seen += n;
    }
    job.signal_rank(1, signal);
    job.end_within(bound)
}

#[test]
fn a_killed_rank_ends_the_job_with_an_error_naming_it() {
    if model_for_test("smollm2-135m").is_none() {
        return;
    }
    // mpirun sees the rank die and ends the job, naming the rank.
    let (err, ok) = fault("-KILL", "30", Duration::from_secs(120));
    assert!(!ok, "{err}");
    assert!(err.contains("rank 1"), "{err}");
}

#[test]
fn a_hung_rank_is_a_timeout_naming_it_then_the_job_ends() {
    if model_for_test("smollm2-135m").is_none() {
        return;
    }
    // A stopped process looks alive to mpirun: rank 0's bounded waits find it out, name it,
    // and end the job (MPI_Abort), which ends the stopped rank too.
    let (err, ok) = fault("-STOP", "5", Duration::from_secs(120));
    assert!(!ok, "{err}");
    assert!(err.contains("rank 1"), "{err}");
    assert!(
        err.contains("timed out") || err.contains("took no message"),
        "{err}"
    );
}

/// One HTTP/1.1 POST with a JSON body; the whole response.
fn post(addr: &str, path: &str, body: &str) -> String {
    use std::io::Write;
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn serve_fails_the_requests_of_a_hung_rank_with_a_5xx_naming_it_then_stops() {
    let Some(path) = model_for_test("smollm2-135m") else {
        return;
    };
    let c = mpirun(
        2,
        &[
            "serve",
            "-m",
            path.to_str().unwrap(),
            "--port",
            "0",
            "-c",
            "1024",
            "-np",
            "2",
            "-t",
            "1",
        ],
    );
    let job = start(c, "5");
    let addr = loop {
        let line = job.lines.recv().expect("the server ended before listening");
        if let Some(url) = line.split("listening on http://").nth(1) {
            break url.trim().to_string();
        }
    };
    let body = r#"{"prompt": "The capital of France is", "n_predict": 8, "temperature": 0}"#;
    let ok = post(&addr, "/completion", body);
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    job.signal_rank(1, "-STOP");
    let failed = post(&addr, "/completion", body);
    assert!(failed.starts_with("HTTP/1.1 500"), "{failed}");
    assert!(failed.contains("rank 1"), "{failed}");
    // Then the server stops by itself, and the job ends (MPI_Abort ends the stopped rank).
    let (err, ok) = job.end_within(Duration::from_secs(120));
    assert!(!ok, "{err}");
    assert!(err.contains("rank 1 stopped answering"), "{err}");
}

/// A GPU of another rank (`WGPU0@1`, over lavapipe in CI) is one more device: a layer split
/// between rank 0's CPU and it prints what the same split over a local GPU prints, with its
/// weights read from rank 1's own copy of the file.
#[test]
fn a_gpu_of_another_rank_computes_what_a_local_one_computes() {
    let Some(path) = model_for_test("smollm2-135m") else {
        return;
    };
    let listed = Command::new(LAMINA)
        .arg("devices")
        .env("LAMINA_WGPU_DEVICES", "1")
        .output()
        .unwrap();
    if !String::from_utf8_lossy(&listed.stdout).contains("WGPU0: ") {
        assert!(
            std::env::var_os("LAMINA_REQUIRE_WGPU").is_none(),
            "no GPU adapter (is Mesa's lavapipe installed?)"
        );
        eprintln!("skipping: no GPU adapter");
        return;
    }
    let m = path.to_str().unwrap();
    let args = |gpu: &str| -> Vec<String> {
        [
            "run",
            "-m",
            m,
            "-p",
            "The capital of France is",
            "-n",
            "4",
            "--temp",
            "0",
            "-t",
            "1",
            "--split-mode",
            "layer",
            "--device",
            &format!("CPU,{gpu}"),
            "--tensor-split",
            "1,1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let local = args("WGPU0");
    let mut one = Command::new(LAMINA);
    one.args(&local).env("LAMINA_WGPU_DEVICES", "1");
    let one = String::from_utf8_lossy(&output(one).stdout).into_owned();
    let remote = args("WGPU0@1");
    let remote: Vec<&str> = remote.iter().map(String::as_str).collect();
    let mut two = mpirun(2, &remote);
    two.env("LAMINA_WGPU_DEVICES", "1")
        .env("LAMINA_MPI_STATS", "1");
    let o = output(two);
    let two = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(one.len() > "The capital of France is".len(), "{one}");
    assert_eq!(two, one);
    // Rank 0 sent requests, graphs and activations, not the ~45 MB of weights of rank 1's
    // layers.
    let err = String::from_utf8_lossy(&o.stderr);
    let sent: u64 = err
        .lines()
        .find_map(|l| {
            l.split("rank 0 sent ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no figures from rank 0: {err}"));
    let weights = std::fs::metadata(&path).unwrap().len() / 4;
    assert!(sent < weights, "rank 0 sent {sent} bytes");
}
