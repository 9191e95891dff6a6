//! A persistent worker pool with a spin-then-yield barrier, owned by one device's queue thread.
//!
//! `run` hands every worker (and the calling thread, as worker 0) the same task and returns
//! when all have finished it; inside the task, [`Barrier::wait`] separates graph nodes. Nothing
//! is allocated per task or per barrier. Idle workers spin briefly on an atomic epoch before
//! sleeping on a condvar, so back-to-back `run`s (one graph after another) skip the wake-up
//! syscalls; `run` signals the condvar only when a worker actually sleeps.

use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// `spin_loop` iterations before a waiting thread starts yielding (about 50 µs on Zen 2).
const SPINS: u32 = 2000;

/// `spin_loop` iterations an idle worker polls for the next task before sleeping (about 12 µs
/// on Zen 2): enough for back-to-back `run`s, short enough not to starve other processes.
const IDLE_SPINS: u32 = SPINS / 4;

/// Keeps a hot atomic on its own cache line (128 bytes: x86's adjacent-line prefetcher pairs
/// lines, and some aarch64 cores have 128-byte lines), as ggml does for its barrier counters.
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// A reusable barrier for the `n` threads of one task.
pub struct Barrier {
    n: usize,
    poisoned: AtomicBool,
    /// Arrivals in the current phase (written by every arriving thread).
    count: Padded<AtomicUsize>,
    /// Completed phases (spun on by the waiters; on its own line so arrivals don't disturb it).
    generation: Padded<AtomicUsize>,
}

impl Barrier {
    fn new(n: usize) -> Barrier {
        Barrier {
            n,
            poisoned: AtomicBool::new(false),
            count: Padded(AtomicUsize::new(0)),
            generation: Padded(AtomicUsize::new(0)),
        }
    }

    /// Blocks until all `n` threads called `wait` (returns at once once poisoned, so a
    /// panicking worker cannot hang the others).
    pub fn wait(&self) {
        if self.n == 1 || self.poisoned.load(Ordering::Acquire) {
            return;
        }
        let generation = self.generation.load(Ordering::Acquire);
        if self.count.fetch_add(1, Ordering::AcqRel) == self.n - 1 {
            self.count.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            if self.poisoned.load(Ordering::Acquire) {
                return;
            }
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
    }
}

/// What a worker sees while running a task.
pub struct WorkerCtx<'a> {
    /// This worker's index, `0..nth`.
    pub ith: usize,
    pub nth: usize,
    pub barrier: &'a Barrier,
    /// The kernels of the tier this pool runs (chosen once, when it was made).
    pub kernels: &'static crate::kernels::KernelTable,
}

type Task = dyn Fn(&WorkerCtx<'_>) + Sync;

/// Sleep bookkeeping, under `Shared::sleep`.
struct SleepState {
    /// Workers blocked (or about to block) on `Shared::wake`.
    sleepers: usize,
    shutdown: bool,
}

struct Shared {
    n: usize,
    /// The current task with its lifetime erased. Written only by `run` while no worker
    /// reads it (before publishing `epoch`, and after `remaining` reached zero); read by
    /// workers only between seeing a new `epoch` and decrementing `remaining`.
    task: UnsafeCell<Option<*const Task>>,
    /// Number of tasks published so far (Release after `task` is written).
    epoch: Padded<AtomicU64>,
    /// Workers that have not yet finished the current task.
    remaining: Padded<AtomicUsize>,
    sleep: Mutex<SleepState>,
    wake: Condvar,
    barrier: Barrier,
    kernels: &'static crate::kernels::KernelTable,
    panicked: AtomicBool,
}

// SAFETY: `task` is accessed as described on the field: the writer (`run`) and the readers
// (workers) are ordered by `epoch` (Release/Acquire) and `remaining` (AcqRel/Acquire), so they
// never overlap; the pointed-to closure is `Sync` and outlives every read (`run` keeps its
// borrow until `remaining == 0`).
unsafe impl Send for Shared {}
// SAFETY: see above.
unsafe impl Sync for Shared {}

/// `n` threads (the caller plus `n - 1` parked workers) that run tasks together.
pub struct WorkerPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl WorkerPool {
    /// The kernel table the pool's tasks run with.
    pub fn kernels(&self) -> &'static crate::kernels::KernelTable {
        self.shared.kernels
    }

    /// A pool of `n` threads in all (at least 1); `name` labels the spawned threads.
    pub fn new(name: &str, n: usize) -> std::io::Result<WorkerPool> {
        let n = n.max(1);
        let shared = Arc::new(Shared {
            n,
            task: UnsafeCell::new(None),
            epoch: Padded(AtomicU64::new(0)),
            remaining: Padded(AtomicUsize::new(0)),
            sleep: Mutex::new(SleepState {
                sleepers: 0,
                shutdown: false,
            }),
            wake: Condvar::new(),
            barrier: Barrier::new(n),
            kernels: crate::kernels::table(),
            panicked: AtomicBool::new(false),
        });
        let mut pool = WorkerPool {
            shared: shared.clone(),
            threads: Vec::with_capacity(n - 1),
        };
        for ith in 1..n {
            let s = shared.clone();
            // On a spawn error `pool` is dropped, which stops the workers already started.
            pool.threads.push(
                std::thread::Builder::new()
                    .name(format!("lamina-{name}-w{ith}"))
                    .spawn(move || worker(&s, ith))?,
            );
        }
        Ok(pool)
    }

    pub fn threads(&self) -> usize {
        self.shared.n
    }

    /// Runs `task` on every thread; returns false if any thread panicked.
    pub fn run(&mut self, task: &(dyn Fn(&WorkerCtx<'_>) + Sync)) -> bool {
        let s = &*self.shared;
        s.panicked.store(false, Ordering::Relaxed);
        s.barrier.poisoned.store(false, Ordering::Relaxed);
        s.barrier.count.store(0, Ordering::Relaxed);
        if s.n > 1 {
            s.remaining.store(s.n - 1, Ordering::Relaxed);
            // SAFETY: erases the borrow's lifetime; `run` does not return before every worker
            // has finished with the pointer (it waits for `remaining == 0` below) and then
            // clears it. No worker reads `task` now: the previous task's readers all finished
            // (`remaining` reached zero) and the new epoch is not yet published.
            unsafe {
                let erased: *const Task = std::mem::transmute(task as *const _);
                *s.task.get() = Some(erased);
            }
            // Release: publishes `task`, `remaining` and the barrier reset to the workers.
            s.epoch.fetch_add(1, Ordering::Release);
            // A worker registers as a sleeper under this lock and re-checks `epoch` before
            // blocking, so either it sees the new epoch or we see it sleeping and wake it.
            let sleeping = s.sleep.lock().unwrap_or_else(|e| e.into_inner()).sleepers > 0;
            if sleeping {
                s.wake.notify_all();
            }
        }
        let ctx = WorkerCtx {
            ith: 0,
            nth: s.n,
            barrier: &s.barrier,
            kernels: s.kernels,
        };
        if catch_unwind(AssertUnwindSafe(|| task(&ctx))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
            s.barrier.poison();
        }
        if s.n > 1 {
            let mut spins = 0u32;
            while s.remaining.load(Ordering::Acquire) != 0 {
                if spins < SPINS {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            // SAFETY: every worker has finished with the task (`remaining == 0`, Acquire).
            unsafe { *s.task.get() = None };
        }
        !s.panicked.load(Ordering::Relaxed)
    }
}

fn worker(s: &Shared, ith: usize) {
    let mut seen = 0u64;
    loop {
        // Spin briefly for the next task, then sleep until `run` or `drop` wakes us.
        let mut spins = 0u32;
        let mut epoch = s.epoch.load(Ordering::Acquire);
        while epoch == seen && spins < IDLE_SPINS {
            spins += 1;
            std::hint::spin_loop();
            epoch = s.epoch.load(Ordering::Acquire);
        }
        if epoch == seen {
            let mut st = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if st.shutdown {
                    return;
                }
                // Under the lock: `run` reads `sleepers` under it after bumping `epoch`.
                epoch = s.epoch.load(Ordering::Acquire);
                if epoch != seen {
                    break;
                }
                st.sleepers += 1;
                st = s.wake.wait(st).unwrap_or_else(|e| e.into_inner());
                st.sleepers -= 1;
            }
        }
        seen = epoch;
        // SAFETY: `run` wrote the task before publishing this epoch (Acquire above) and keeps
        // it alive and unchanged until `remaining` reaches zero, which happens only after
        // this read and the call below.
        let task = unsafe { *s.task.get() };
        if let Some(task) = task {
            // SAFETY: as above, the closure outlives this call.
            let task = unsafe { &*task };
            let ctx = WorkerCtx {
                ith,
                nth: s.n,
                barrier: &s.barrier,
                kernels: s.kernels,
            };
            if catch_unwind(AssertUnwindSafe(|| task(&ctx))).is_err() {
                s.panicked.store(true, Ordering::Relaxed);
                s.barrier.poison();
            }
        }
        s.remaining.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.shared
            .sleep
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .shutdown = true;
        self.shared.wake.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn barrier_separates_phases() {
        for n in [1, 2, 3, 4] {
            let mut pool = WorkerPool::new("t", n).unwrap();
            for round in 0..if cfg!(miri) { 3 } else { 50u64 } {
                let phase1 = AtomicU64::new(0);
                let seen = AtomicU64::new(0);
                let ok = pool.run(&|ctx| {
                    phase1.fetch_add(round + ctx.ith as u64, Ordering::Relaxed);
                    ctx.barrier.wait();
                    seen.fetch_add(phase1.load(Ordering::Relaxed), Ordering::Relaxed);
                    ctx.barrier.wait();
                });
                assert!(ok);
                let total: u64 = (0..n as u64).map(|i| round + i).sum();
                assert_eq!(seen.load(Ordering::Relaxed), total * n as u64);
            }
        }
    }

    #[test]
    fn every_thread_runs_each_task_whether_workers_spin_or_sleep() {
        for n in [2, 3] {
            let mut pool = WorkerPool::new("s", n).unwrap();
            for round in 0..if cfg!(miri) { 4 } else { 200u64 } {
                // Every few rounds leave the workers idle long enough to go to sleep (the
                // result must not depend on it; this only exercises the wake-up path).
                if round % 8 == 7 && !cfg!(miri) {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                let mask = AtomicU64::new(0);
                assert!(pool.run(&|ctx| {
                    mask.fetch_or(1 << ctx.ith, Ordering::Relaxed);
                }));
                assert_eq!(mask.load(Ordering::Relaxed), (1 << n) - 1, "round {round}");
            }
        }
    }

    #[test]
    fn panic_is_reported_not_hung() {
        let mut pool = WorkerPool::new("p", 3).unwrap();
        let ok = pool.run(&|ctx| {
            if ctx.ith == 1 {
                panic!("boom");
            }
            ctx.barrier.wait();
        });
        assert!(!ok);
        assert!(pool.run(&|ctx| ctx.barrier.wait()));
    }
}
