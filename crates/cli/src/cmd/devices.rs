//! `lamina devices` (alias `--list-devices`): lists the compute devices with their type,
//! description and memory, like llama.cpp's `--list-devices`.

use anyhow::Context;
use clap::Args;

use lamina_backend::Registry;
use lamina_cpu::{CpuConfig, parse_device_count, registry, registry_with};

/// Arguments of `lamina devices`.
#[derive(Args, Debug, Clone, Default)]
pub struct DevicesArgs {
    /// Expose the CPU as N virtual devices CPU0…CPU{N-1} (default: $LAMINA_CPU_DEVICES or 1).
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub cpu_devices: Option<usize>,
}

fn parse_count(s: &str) -> Result<usize, String> {
    parse_device_count(s).map_err(|e| e.to_string())
}

const MIB: u64 = 1024 * 1024;

/// Prints every device of the registry.
pub fn run(args: DevicesArgs) -> anyhow::Result<()> {
    let owned;
    let reg: &Registry = match args.cpu_devices {
        Some(n) => {
            owned = registry_with(CpuConfig::from_env()?.with_devices(n))?;
            &owned
        }
        None => registry().context("initializing devices")?,
    };
    let mut out = format_devices(reg);
    // Under mpirun: every other rank's devices.
    for d in lamina_mpi::remote_devices() {
        out.push_str(&device_line(&*d));
    }
    // GPU adapters through wgpu: each device with its adapter's driver and backend.
    match lamina_wgpu::WgpuBackendReg::from_env() {
        Ok(gpus) => {
            for d in gpus.wgpu_devices() {
                use lamina_backend::Device;
                let m = d.memory();
                out.push_str(&format!(
                    "  {}: {} ({}, {}, {} MiB largest buffer)\n",
                    d.name(),
                    d.description(),
                    d.device_type(),
                    d.driver(),
                    m.total / MIB
                ));
            }
            for p in gpus.problems() {
                out.push_str(&format!(
                    "  (GPU adapter {} not usable: {})\n",
                    p.name, p.message
                ));
            }
        }
        Err(e) => out.push_str(&format!("  (GPU backend: {e})\n")),
    }
    super::emit(&out)?;
    Ok(())
}

/// The device list as printed.
pub fn format_devices(reg: &Registry) -> String {
    let mut out = String::from("Available devices:\n");
    for d in reg.devices() {
        out.push_str(&device_line(&**d));
    }
    out
}

fn device_line(d: &dyn lamina_backend::Device) -> String {
    let m = d.memory();
    format!(
        "  {}: {} ({}, {} MiB, {} MiB free)\n",
        d.name(),
        d.description(),
        d.device_type(),
        m.total / MIB,
        m.free / MIB
    )
}
