//! The transport over MPI (feature `mpi`): MPI initialized with `MPI_THREAD_MULTIPLE`, sends
//! from whichever thread has something to send, and one thread per rank that probes for
//! arriving messages and delivers them. It probes and sends without blocking and backs off
//! when idle, so a waiting rank does not hold a core (OpenMPI's blocking calls spin) and a
//! send to a hung rank ends after the wait bound.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mpi::Threading;
use mpi::environment::Universe;
use mpi::request::StaticScope;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::transport::{Deliver, Transport};

/// MPI's world communicator, shareable between threads.
struct World(SimpleCommunicator);

// SAFETY: MPI was initialized with MPI_THREAD_MULTIPLE (checked in `init`), under which every
// MPI call may be made from any thread concurrently; the communicator handle is an immutable
// id that MPI itself synchronizes.
unsafe impl Send for World {}
// SAFETY: as above.
unsafe impl Sync for World {}

pub struct MpiTransport {
    world: Arc<World>,
    rank: usize,
    size: usize,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Finalizes MPI when dropped (after the receive thread has ended).
    universe: Mutex<Option<UniverseBox>>,
}

struct UniverseBox(#[allow(dead_code)] Universe);
// SAFETY: the universe is only dropped (MPI_Finalize), once, after the receive thread ended.
unsafe impl Send for UniverseBox {}

impl MpiTransport {
    pub fn init() -> Result<MpiTransport, String> {
        let (universe, level) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or("MPI is already initialized")?;
        if level != Threading::Multiple {
            return Err(format!(
                "the MPI library offers {level:?} threading; lamina needs MPI_THREAD_MULTIPLE"
            ));
        }
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        Ok(MpiTransport {
            world: Arc::new(World(world)),
            rank,
            size,
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
            universe: Mutex::new(Some(UniverseBox(universe))),
        })
    }
}

impl Transport for MpiTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn send(&self, to: usize, bytes: Vec<u8>) -> Result<(), String> {
        if to >= self.size {
            return Err(format!("no rank {to}"));
        }
        // A non-blocking send, tested until done: the peer's receive thread is always
        // probing, so it completes at once, unless the peer is hung, which must be an error
        // after the wait bound, not a hang. MPI needs the buffer until the send completes, and
        // a send that never does keeps it: the buffer is leaked to MPI and taken back after.
        let data: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        let mut request = self
            .world
            .0
            .process_at_rank(to as i32)
            .immediate_send(StaticScope, data);
        let start = Instant::now();
        let bound = lamina_backend::wait_bound();
        loop {
            match request.test() {
                Ok(_) => break,
                Err(pending) => request = pending,
            }
            if bound.is_some_and(|b| start.elapsed() > b) {
                // MPI may still read `data`: it stays leaked, and so does the request.
                std::mem::forget(request);
                return Err(format!(
                    "rank {to} took no message for {} s (LAMINA_DEVICE_TIMEOUT)",
                    start.elapsed().as_secs()
                ));
            }
            backoff(start.elapsed());
        }
        // SAFETY: `data` came from `Box::leak` above and the send that used it has completed,
        // so MPI no longer reads it and no other reference to it remains.
        drop(unsafe { Box::from_raw(data as *const [u8] as *mut [u8]) });
        Ok(())
    }
    fn start(&self, deliver: Deliver) {
        let (world, stop) = (self.world.clone(), self.stop.clone());
        let thread = std::thread::Builder::new()
            .name(format!("lamina-rank{}-recv", self.rank))
            .spawn(move || {
                let mut last = Instant::now();
                while !stop.load(Ordering::Acquire) {
                    match world.0.any_process().immediate_matched_probe() {
                        Some((msg, status)) => {
                            let n = status.count(u8::equivalent_datatype()).max(0) as usize;
                            let mut bytes = vec![0u8; n];
                            msg.matched_receive_into(&mut bytes[..]);
                            deliver(status.source_rank() as usize, bytes);
                            last = Instant::now();
                        }
                        None => {
                            backoff(last.elapsed());
                        }
                    }
                }
            });
        *self.thread.lock().unwrap_or_else(|e| e.into_inner()) = thread.ok();
    }
    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }

    fn abort(&self, code: i32) {
        self.world.0.abort(code)
    }

    fn finish(&self) {
        self.stop();
        // MPI_Finalize, now that no thread of ours calls MPI.
        self.universe
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }
}

/// Waiting for MPI (`idle` since the last message, or since a send began) without holding a
/// core for long: spin (yielding) for the first 20 ms, which is where a reply or the next step
/// of a generation usually is (sleeping there cost 15-20% of the decode speed over 2 ranks),
/// then sleep about 1% of the time idle so far, at most a millisecond.
fn backoff(idle: Duration) {
    const SPIN: Duration = Duration::from_millis(20);
    if idle < SPIN {
        std::thread::yield_now();
    } else {
        std::thread::sleep((idle / 100).min(Duration::from_millis(1)));
    }
}

impl Drop for MpiTransport {
    fn drop(&mut self) {
        self.finish();
    }
}
