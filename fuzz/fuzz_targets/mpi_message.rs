//! Fuzzes a rank's device server (`lamina_mpi::serve`) with arbitrary messages from another
//! rank: the input is a batch of messages, each a little-endian u16 length and that many bytes,
//! sent raw to a serving rank with one CPU device (in-process ranks, the protocol's own code).
//! The server never panics and keeps answering (`Hello`), then stops on `Shutdown`.
//! Seeds: `seeds/mpi_message` (`cargo test -p lamina-mpi --test hostile -- --ignored
//! write_fuzz_seeds`: every kind of message, valid).

#![no_main]

use std::sync::{Arc, Once};
use std::time::Duration;

use lamina_backend::Device;
use lamina_cpu::{CpuBackendReg, CpuConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    static BOUND: Once = Once::new();
    // Waits a message starts (a signal that never comes) end as a hung peer's would.
    BOUND.call_once(|| lamina_backend::set_wait_bound(Some(Duration::from_millis(50))));
    let reg = CpuBackendReg::new(CpuConfig::default().with_threads(1)).unwrap();
    let device: Arc<dyn Device> = reg.cpu_devices()[0].clone();
    if let Err(e) = lamina_mpi::testing::serving_rank_survives(&lamina_mpi::testing::framed_batch(data), vec![device]) {
        panic!("{e}");
    }
});
