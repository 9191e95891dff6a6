//! `lamina-mpi` puts the devices of other processes into the registry. Under `mpirun -np N
//! lamina …` (feature `mpi`), rank 0 is the front: it runs the command (tokenizer, sampler,
//! CLI or HTTP server) and sees every other rank's devices as devices of its own, named with
//! the rank (`CPU@1`); every other rank runs a device server ([`serve`]) until the front is
//! done. A remote device implements the device layer's interfaces ([`RemoteDevice`]): its
//! buffers live on its rank, compute is the graph nodes sent there, copies between ranks go
//! from rank to rank directly, ordered by the streams on both ends, and each rank maps its own
//! copy of the model file (checked against the front's). The protocol runs over a
//! [`Transport`]: MPI, or threads of one process ([`LocalTransport`]) for tests.

pub mod node;
pub mod remote;
pub mod server;
#[doc(hidden)]
pub mod testing;
pub mod transport;
pub mod wire;

#[cfg(feature = "mpi")]
mod mpi_transport;

use std::sync::{Arc, OnceLock};

use lamina_backend::{BackendError, Device};

pub use node::Node;
pub use remote::{OpSupport, RemoteDevice, supports_like};
pub use server::Server;
pub use transport::{LocalTransport, Transport};

pub use wire::DeviceInfo;
use wire::{Reply, Request};

/// The front's connection to the other ranks and their devices.
pub struct Cluster {
    node: Arc<Node>,
    devices: Vec<Arc<RemoteDevice>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("ranks", &self.node.size())
            .finish()
    }
}

impl Cluster {
    /// Connects the front (rank 0 of `transport`) to the other ranks and lists their devices;
    /// `oracle` (a local CPU device) answers which ops the remote devices support.
    pub fn connect(
        transport: Arc<dyn Transport>,
        oracle: Arc<dyn Device>,
    ) -> Result<Cluster, BackendError> {
        let supports = remote::supports_like(oracle);
        Cluster::connect_with(transport, &|_| supports.clone())
    }

    /// [`Cluster::connect`] for ranks with devices of several backends: `supports` tells, from
    /// what a rank says of a device, which ops it runs.
    pub fn connect_with(
        transport: Arc<dyn Transport>,
        supports: &dyn Fn(&DeviceInfo) -> OpSupport,
    ) -> Result<Cluster, BackendError> {
        let (node, _requests) = Node::start(transport);
        let mut devices = Vec::new();
        for rank in 1..node.size() {
            match node.call(rank, Request::Hello)? {
                Reply::Devices(list) => {
                    for (i, info) in list.into_iter().enumerate() {
                        let supports = supports(&info);
                        devices.push(Arc::new(RemoteDevice::new(
                            node.clone(),
                            rank,
                            i as u32,
                            info,
                            supports,
                        )));
                    }
                }
                other => return Err(node.error(rank, format!("unexpected reply {other:?}"))),
            }
        }
        Ok(Cluster { node, devices })
    }

    pub fn ranks(&self) -> usize {
        self.node.size()
    }

    /// Every other rank's devices, in rank order.
    pub fn devices(&self) -> Vec<Arc<dyn Device>> {
        self.devices
            .iter()
            .map(|d| d.clone() as Arc<dyn Device>)
            .collect()
    }

    /// Bytes the front has sent so far (requests, graphs, copies).
    pub fn bytes_sent(&self) -> u64 {
        self.node.bytes_sent()
    }

    /// Tells every rank to stop serving and waits for each to acknowledge. An error (a rank
    /// that stopped answering, now or before) leaves the transport up for [`Cluster::abort`]:
    /// a clean MPI finish would wait for that rank forever.
    pub fn shutdown(&self) -> Result<(), BackendError> {
        let mut first = Ok(());
        for rank in 1..self.node.size() {
            if let Err(e) = self.node.call(rank, Request::Shutdown) {
                first = first.and(Err(e));
            }
        }
        if first.is_ok() {
            self.node.finish();
        }
        first
    }

    /// The ranks that stopped answering (a wait for them timed out).
    pub fn lost_ranks(&self) -> Vec<usize> {
        self.node.lost_ranks()
    }

    /// Blocks until a rank is lost, and returns the lost ranks: a server waits for this on a
    /// thread of its own and stops, failing the requests that needed them.
    pub fn wait_lost(&self) -> Vec<usize> {
        self.node.wait_lost()
    }

    /// Ends every rank's process with exit status `code` (MPI_Abort under `mpirun`).
    pub fn abort(&self, code: i32) -> ! {
        self.node.abort(code)
    }
}

/// Runs the device server of a rank other than the front until the front shuts it down.
pub fn serve(transport: Arc<dyn Transport>, devices: Vec<Arc<dyn Device>>) {
    let (node, requests) = Node::start(transport);
    Server::new(node.clone(), devices).run(requests);
    node.finish();
}

/// This process's place under `mpirun`.
pub enum Launch {
    /// Not started by `mpirun` (or built without the `mpi` feature): a process of its own.
    Single,
    /// Rank 0: run the command with the other ranks' devices.
    Front(Arc<dyn Transport>),
    /// Another rank: serve this process's devices ([`serve`]), then exit.
    Worker(Arc<dyn Transport>),
}

/// Whether this process was started by `mpirun` (OpenMPI, MPICH or a PMI launcher).
pub fn launched_by_mpirun() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// Initializes MPI when launched by `mpirun` with more than one rank.
pub fn launch() -> Result<Launch, String> {
    if !launched_by_mpirun() {
        return Ok(Launch::Single);
    }
    #[cfg(feature = "mpi")]
    {
        let t = mpi_transport::MpiTransport::init()?;
        if t.size() < 2 {
            return Ok(Launch::Single);
        }
        let t: Arc<dyn Transport> = Arc::new(t);
        Ok(if t.rank() == 0 {
            Launch::Front(t)
        } else {
            Launch::Worker(t)
        })
    }
    #[cfg(not(feature = "mpi"))]
    Err(
        "started by mpirun, but this lamina was built without MPI (cargo build --features mpi)"
            .into(),
    )
}

static FRONT: OnceLock<Cluster> = OnceLock::new();

/// Makes `cluster` the process's (the CLI's device lists then include its devices).
pub fn set_cluster(cluster: Cluster) -> Result<(), Cluster> {
    FRONT.set(cluster)
}

/// The process's cluster, if it is the front of one.
pub fn cluster() -> Option<&'static Cluster> {
    FRONT.get()
}

/// The other ranks' devices when this process is the front of a cluster; none otherwise.
pub fn remote_devices() -> Vec<Arc<dyn Device>> {
    cluster().map(Cluster::devices).unwrap_or_default()
}
