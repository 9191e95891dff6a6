//! How bytes move between ranks. [`Transport`] is what the rest of the crate needs: ordered,
//! reliable messages between any two ranks, and a thread that delivers what arrives. The MPI
//! transport (feature `mpi`) is the real one; [`LocalTransport`] connects "ranks" that are
//! threads of one process, so the protocol is tested without `mpirun`.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

/// Called with (source rank, message) for every message that arrives.
pub type Deliver = Box<dyn Fn(usize, Vec<u8>) + Send>;

pub trait Transport: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Sends `bytes` to rank `to`; messages between two ranks arrive in the order sent.
    fn send(&self, to: usize, bytes: Vec<u8>) -> Result<(), String>;
    /// Starts delivering arriving messages to `deliver`, on a thread of the transport's.
    fn start(&self, deliver: Deliver);
    /// Stops delivering (the thread ends once it sees this).
    fn stop(&self);
    /// Ends the transport for the process (MPI_Finalize), after [`Transport::stop`].
    fn finish(&self) {}
    /// Ends every rank's process with exit status `code` (MPI_Abort); for a job whose ranks
    /// cannot all be stopped cleanly. The in-process transport has nothing to end.
    fn abort(&self, _code: i32) {}
}

enum Envelope {
    Message(usize, Vec<u8>),
    Stop,
}

/// Ranks that are threads of one process, connected by channels.
pub struct LocalTransport {
    rank: usize,
    peers: Vec<Sender<Envelope>>,
    inbox: Mutex<Option<Receiver<Envelope>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl LocalTransport {
    /// `n` connected ranks.
    pub fn network(n: usize) -> Vec<Arc<LocalTransport>> {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..n).map(|_| channel()).unzip();
        receivers
            .into_iter()
            .enumerate()
            .map(|(rank, rx)| {
                Arc::new(LocalTransport {
                    rank,
                    peers: senders.clone(),
                    inbox: Mutex::new(Some(rx)),
                    thread: Mutex::new(None),
                })
            })
            .collect()
    }
}

impl Transport for LocalTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.peers.len()
    }
    fn send(&self, to: usize, bytes: Vec<u8>) -> Result<(), String> {
        self.peers
            .get(to)
            .ok_or_else(|| format!("no rank {to}"))?
            .send(Envelope::Message(self.rank, bytes))
            .map_err(|_| format!("rank {to} has stopped"))
    }
    fn start(&self, deliver: Deliver) {
        let Some(rx) = self.inbox.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let thread = std::thread::Builder::new()
            .name(format!("lamina-rank{}-recv", self.rank))
            .spawn(move || {
                while let Ok(Envelope::Message(from, bytes)) = rx.recv() {
                    deliver(from, bytes);
                }
            });
        *self.thread.lock().unwrap_or_else(|e| e.into_inner()) = thread.ok();
    }
    fn stop(&self) {
        let _ = self.peers[self.rank].send(Envelope::Stop);
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}
