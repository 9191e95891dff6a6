//! A persistent worker pool with a spin-then-yield barrier, owned by one device's queue thread.
//!
//! `run` hands every worker (and the calling thread, as worker 0) the same task and returns
//! when all have finished it; inside the task, [`Barrier::wait`] separates graph nodes. Nothing
//! is allocated per task or per barrier.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

const SPINS: u32 = 2000;

/// A reusable barrier for the `n` threads of one task.
pub struct Barrier {
    n: usize,
    count: AtomicUsize,
    generation: AtomicUsize,
    poisoned: AtomicBool,
}

impl Barrier {
    fn new(n: usize) -> Barrier {
        Barrier {
            n,
            count: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            poisoned: AtomicBool::new(false),
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
}

type Task = dyn Fn(&WorkerCtx<'_>) + Sync;

struct Slot {
    generation: u64,
    /// The current task with its lifetime erased; valid while `run` is inside its call.
    task: Option<*const Task>,
    shutdown: bool,
}

struct Shared {
    n: usize,
    slot: Mutex<Slot>,
    start: Condvar,
    remaining: AtomicUsize,
    barrier: Barrier,
    panicked: AtomicBool,
}

// SAFETY: the raw task pointer in `slot` is only dereferenced by workers between `run`
// publishing it and `run` observing `remaining == 0`, while `run`'s borrow keeps the closure
// alive; the closure itself is `Sync`.
unsafe impl Send for Shared {}
// SAFETY: see above.
unsafe impl Sync for Shared {}

/// `n` threads (the caller plus `n - 1` parked workers) that run tasks together.
pub struct WorkerPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl WorkerPool {
    /// A pool of `n` threads in all (at least 1); `name` labels the spawned threads.
    pub fn new(name: &str, n: usize) -> std::io::Result<WorkerPool> {
        let n = n.max(1);
        let shared = Arc::new(Shared {
            n,
            slot: Mutex::new(Slot {
                generation: 0,
                task: None,
                shutdown: false,
            }),
            start: Condvar::new(),
            remaining: AtomicUsize::new(0),
            barrier: Barrier::new(n),
            panicked: AtomicBool::new(false),
        });
        let mut threads = Vec::with_capacity(n - 1);
        for ith in 1..n {
            let s = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("lamina-{name}-w{ith}"))
                    .spawn(move || worker(&s, ith))?,
            );
        }
        Ok(WorkerPool { shared, threads })
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
            s.remaining.store(s.n - 1, Ordering::Release);
            let mut slot = s.slot.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: erases the borrow's lifetime; `run` does not return before every worker
            // has finished with the pointer (it waits for `remaining == 0` below) and then
            // clears it.
            let erased: *const Task = unsafe { std::mem::transmute(task as *const _) };
            slot.task = Some(erased);
            slot.generation += 1;
            drop(slot);
            s.start.notify_all();
        }
        let ctx = WorkerCtx {
            ith: 0,
            nth: s.n,
            barrier: &s.barrier,
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
            s.slot.lock().unwrap_or_else(|e| e.into_inner()).task = None;
        }
        !s.panicked.load(Ordering::Relaxed)
    }
}

fn worker(s: &Shared, ith: usize) {
    let mut seen = 0u64;
    loop {
        let task = {
            let mut slot = s.slot.lock().unwrap_or_else(|e| e.into_inner());
            while slot.generation == seen && !slot.shutdown {
                slot = s.start.wait(slot).unwrap_or_else(|e| e.into_inner());
            }
            if slot.shutdown {
                return;
            }
            seen = slot.generation;
            slot.task
        };
        if let Some(task) = task {
            // SAFETY: `run` keeps the task alive until `remaining` reaches zero, which happens
            // only after this call returns.
            let task = unsafe { &*task };
            let ctx = WorkerCtx {
                ith,
                nth: s.n,
                barrier: &s.barrier,
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
            .slot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .shutdown = true;
        self.shared.start.notify_all();
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
