//! A rank that never answers is a typed timeout naming it, not a hang. (Its own test binary:
//! the wait bound it shortens is process-wide.)

use std::sync::Arc;
use std::time::Duration;

use lamina_cpu::{CpuBackendReg, CpuConfig};
use lamina_mpi::{Cluster, LocalTransport, Transport};

#[test]
fn a_rank_that_never_answers_is_a_timeout_naming_it() {
    let mut transports = LocalTransport::network(2).into_iter();
    let front = transports.next().unwrap();
    // Rank 1 exists but nobody serves it.
    let _silent = transports.next().unwrap();
    lamina_backend::set_wait_bound(Some(Duration::from_millis(300)));
    let err = Cluster::connect(
        front.clone() as Arc<dyn Transport>,
        CpuBackendReg::new(CpuConfig::default().with_threads(1))
            .unwrap()
            .cpu_devices()[0]
            .clone(),
    )
    .unwrap_err();
    lamina_backend::set_wait_bound(None);
    let msg = err.to_string();
    assert!(msg.contains("rank 1") && msg.contains("timed out"), "{msg}");
}
