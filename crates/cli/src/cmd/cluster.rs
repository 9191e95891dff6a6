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

/// Whether the ranks open their GPUs too: `--device` names a WGPU device (`WGPU0@1`),
/// `LAMINA_WGPU_DEVICES` is set, or the command lists devices.
pub fn wants_gpu(args: &[OsString]) -> bool {
    std::env::var_os(lamina_wgpu::DEVICES_ENV).is_some()
        || args.get(1).is_some_and(|a| a == "devices")
        || args
            .iter()
            .any(|a| a.to_string_lossy().to_ascii_lowercase().contains("wgpu"))
}

/// `Ok(None)`: go on with the command (a single process, or rank 0 now connected);
/// `Ok(Some(code))`: a serving rank that is done.
pub fn start(threads: Option<usize>, gpu: bool) -> anyhow::Result<Option<ExitCode>> {
    let mut config = lamina_cpu::CpuConfig::from_env()?;
    if let Some(t) = threads.filter(|&t| t > 0) {
        config = config.with_threads(t);
    }
    match lamina_mpi::launch().map_err(anyhow::Error::msg)? {
        lamina_mpi::Launch::Single => Ok(None),
        lamina_mpi::Launch::Front(transport) => {
            // Which ops the other ranks' devices support, answered here by their backend's
            // rule, without asking them.
            let cpu: Arc<dyn Device> =
                lamina_cpu::CpuBackendReg::new(config.with_threads(1))?.cpu_devices()[0].clone();
            let cpu = lamina_mpi::supports_like(cpu);
            let gpu: lamina_mpi::OpSupport = Arc::new(lamina_wgpu::supports_op);
            let supports = |info: &lamina_mpi::DeviceInfo| {
                if info.name.starts_with("WGPU") {
                    gpu.clone()
                } else {
                    cpu.clone()
                }
            };
            let cluster = lamina_mpi::Cluster::connect_with(transport, &supports)
                .context("connecting to the other MPI ranks")?;
            let _ = lamina_mpi::set_cluster(cluster);
            Ok(None)
        }
        lamina_mpi::Launch::Worker(transport) => {
            let reg = lamina_cpu::CpuBackendReg::new(config)?;
            let mut devices: Vec<Arc<dyn Device>> = reg
                .cpu_devices()
                .iter()
                .map(|d| d.clone() as Arc<dyn Device>)
                .collect();
            let gpus = if gpu {
                Some(lamina_wgpu::WgpuBackendReg::from_env()?)
            } else {
                None
            };
            if let Some(gpus) = &gpus {
                for p in gpus.problems() {
                    eprintln!(
                        "warning: this rank's GPU adapter {} could not be opened: {}",
                        p.name, p.message
                    );
                }
                devices.extend(
                    gpus.wgpu_devices()
                        .iter()
                        .map(|d| d.clone() as Arc<dyn Device>),
                );
            }
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
