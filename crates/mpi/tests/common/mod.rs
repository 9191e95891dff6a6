//! What the in-process cluster tests share.
#![allow(dead_code)] // each test binary uses some of these

use std::sync::Arc;

use lamina_backend::Device;
use lamina_cpu::{CpuBackendReg, CpuConfig};
use lamina_mpi::{Cluster, LocalTransport};

pub fn cpu(threads: usize) -> Arc<dyn Device> {
    let reg = CpuBackendReg::new(CpuConfig::default().with_threads(threads)).unwrap();
    reg.cpu_devices()[0].clone()
}

/// A front and `ranks - 1` serving ranks, each with one CPU device of its own.
pub fn cluster(ranks: usize) -> (Arc<dyn Device>, Cluster) {
    let mut transports = LocalTransport::network(ranks).into_iter();
    let front = transports.next().unwrap();
    for t in transports {
        std::thread::spawn(move || lamina_mpi::serve(t, vec![cpu(1)]));
    }
    let host = cpu(1);
    let cluster = Cluster::connect(front, host.clone()).unwrap();
    (host, cluster)
}
