//! Starting under `mpirun`: rank 0 connects to the other ranks (their devices join every
//! device list, named `CPU@1`, …); every other rank serves its own devices until rank 0 is
//! done, then exits. Security is that of the MPI launch: lamina opens no sockets of its own.

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use lamina_backend::Device;

/// The `-t` / `--threads` value on the command line, if any (the serving ranks compute with
/// as many threads as the front was asked for).
pub fn threads_flag(args: &[OsString]) -> Option<usize> {
    let args: Vec<&str> = args.iter().filter_map(|a| a.to_str()).collect();
    args.iter().enumerate().find_map(|(i, a)| match *a {
        "-t" | "--threads" => args.get(i + 1)?.parse().ok(),
        _ => a.strip_prefix("--threads=")?.parse().ok(),
    })
}

/// `Ok(None)`: go on with the command (a single process, or rank 0 now connected);
/// `Ok(Some(code))`: a serving rank that is done.
pub fn start(threads: Option<usize>) -> anyhow::Result<Option<ExitCode>> {
    let mut config = lamina_cpu::CpuConfig::from_env()?;
    if let Some(t) = threads.filter(|&t| t > 0) {
        config = config.with_threads(t);
    }
    match lamina_mpi::launch().map_err(anyhow::Error::msg)? {
        lamina_mpi::Launch::Single => Ok(None),
        lamina_mpi::Launch::Front(transport) => {
            // Answers which ops the other ranks' CPUs support, without asking them.
            let oracle: Arc<dyn Device> =
                lamina_cpu::CpuBackendReg::new(config.with_threads(1))?.cpu_devices()[0].clone();
            let cluster = lamina_mpi::Cluster::connect(transport, oracle)
                .context("connecting to the other MPI ranks")?;
            let _ = lamina_mpi::set_cluster(cluster);
            Ok(None)
        }
        lamina_mpi::Launch::Worker(transport) => {
            let reg = lamina_cpu::CpuBackendReg::new(config)?;
            let devices = reg
                .cpu_devices()
                .iter()
                .map(|d| d.clone() as Arc<dyn Device>)
                .collect();
            lamina_mpi::serve(transport, devices);
            Ok(Some(ExitCode::SUCCESS))
        }
    }
}

/// Under `mpirun`, a blocking wait for a rank lost for good, returning the reason: the
/// server stops then (the requests that needed the rank have failed naming it, and every
/// later one would).
pub fn lost_rank() -> Option<Box<dyn FnOnce() -> String + Send>> {
    let cluster = lamina_mpi::cluster()?;
    Some(Box::new(move || {
        let lost: Vec<String> = cluster.wait_lost().iter().map(|r| r.to_string()).collect();
        let s = if lost.len() == 1 { "" } else { "s" };
        format!("rank{s} {} stopped answering", lost.join(", "))
    }))
}
