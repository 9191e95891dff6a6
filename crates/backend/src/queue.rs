//! An in-order command queue, the building block of host-memory device streams.
//!
//! A threaded queue owns a thread that owns the device's execution state `S` (worker pool,
//! scratch memory); the host enqueues commands and returns at once. An inline queue runs each
//! command on the caller's thread (a synchronous device). Either way commands complete in
//! submission order, and the first error is kept (sticky) until the next `synchronize`
//! reports it; later commands still run, so event signals are never lost.
//!
//! Commands are held by value in a ring that keeps its allocation, so a device whose command
//! type is a plain enum (the CPU's) submits work without allocating; [`Command`], a boxed
//! closure, is the general (one allocation per command) choice.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::error::BackendError;

/// Work a [`CommandQueue`] runs on its state `S`.
pub trait QueuedCommand<S>: Send + 'static {
    fn run(self, state: &mut S) -> Result<(), BackendError>;
}

/// A unit of queued work as a boxed closure.
pub type Command<S> = Box<dyn FnOnce(&mut S) -> Result<(), BackendError> + Send>;

impl<S: 'static> QueuedCommand<S> for Command<S> {
    fn run(self, state: &mut S) -> Result<(), BackendError> {
        self(state)
    }
}

/// Commands the ring has room for from the start.
const QUEUE_RESERVE: usize = 64;

struct Progress<C> {
    submitted: u64,
    completed: u64,
    error: Option<BackendError>,
    /// Commands not yet taken by the queue thread.
    pending: VecDeque<C>,
    /// Set when the queue is dropped: the thread drains `pending`, then ends.
    closed: bool,
}

struct Shared<C> {
    name: String,
    progress: Mutex<Progress<C>>,
    /// Signalled when a command finishes.
    done_cv: Condvar,
    /// Signalled when a command is queued or the queue closes.
    work_cv: Condvar,
}

impl<C> Shared<C> {
    fn new(name: &str) -> Shared<C> {
        Shared {
            name: name.to_owned(),
            progress: Mutex::new(Progress {
                submitted: 0,
                completed: 0,
                error: None,
                // Room for a token's worth of commands and more, so that the ring reaches its
                // size while a context warms up rather than at some later, busier moment.
                pending: VecDeque::with_capacity(QUEUE_RESERVE),
                closed: false,
            }),
            done_cv: Condvar::new(),
            work_cv: Condvar::new(),
        }
    }

    fn progress(&self) -> MutexGuard<'_, Progress<C>> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn finish(&self, result: Result<(), BackendError>) {
        let mut p = self.progress();
        p.completed += 1;
        if let Err(e) = result
            && p.error.is_none()
        {
            p.error = Some(e);
        }
        drop(p);
        self.done_cv.notify_all();
    }

    fn run<S>(&self, state: &mut S, cmd: C)
    where
        C: QueuedCommand<S>,
    {
        let result = catch_unwind(AssertUnwindSafe(|| cmd.run(state))).unwrap_or_else(|_| {
            Err(BackendError::Device {
                device: self.name.clone(),
                message: "a queued command panicked".into(),
            })
        });
        self.finish(result);
    }

    /// The queue thread: the next command, or `None` once closed and drained.
    fn next(&self) -> Option<C> {
        let mut p = self.progress();
        loop {
            if let Some(cmd) = p.pending.pop_front() {
                return Some(cmd);
            }
            if p.closed {
                return None;
            }
            p = self.work_cv.wait(p).unwrap_or_else(|e| e.into_inner());
        }
    }
}

enum Mode<S> {
    Threaded { thread: Option<JoinHandle<()>> },
    Inline(Mutex<S>),
}

/// An in-order queue of commands `C` over execution state `S`.
pub struct CommandQueue<S: Send + 'static, C: QueuedCommand<S> = Command<S>> {
    shared: Arc<Shared<C>>,
    mode: Mode<S>,
}

impl<S: Send + 'static, C: QueuedCommand<S>> CommandQueue<S, C> {
    /// A queue with its own thread; `init` builds the state on that thread.
    pub fn threaded(
        name: &str,
        init: impl FnOnce() -> S + Send + 'static,
    ) -> Result<CommandQueue<S, C>, BackendError> {
        let shared = Arc::new(Shared::new(name));
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("lamina-{name}-queue"))
            .spawn(move || {
                let mut state = init();
                while let Some(cmd) = worker.next() {
                    worker.run(&mut state, cmd);
                }
            })
            .map_err(|e| BackendError::Device {
                device: name.to_owned(),
                message: e.to_string(),
            })?;
        Ok(CommandQueue {
            shared,
            mode: Mode::Threaded {
                thread: Some(thread),
            },
        })
    }

    /// A queue that runs commands on the submitting thread.
    pub fn inline(name: &str, state: S) -> CommandQueue<S, C> {
        CommandQueue {
            shared: Arc::new(Shared::new(name)),
            mode: Mode::Inline(Mutex::new(state)),
        }
    }

    /// Whether `submit` returns before the command has run.
    pub fn is_async(&self) -> bool {
        matches!(self.mode, Mode::Threaded { .. })
    }

    /// Enqueues `cmd` behind everything submitted before.
    pub fn submit(&self, cmd: C) -> Result<(), BackendError> {
        match &self.mode {
            Mode::Threaded { .. } => {
                let mut p = self.shared.progress();
                if p.closed {
                    return Err(BackendError::QueueClosed(self.shared.name.clone()));
                }
                p.pending.push_back(cmd);
                p.submitted += 1;
                drop(p);
                self.shared.work_cv.notify_one();
                Ok(())
            }
            Mode::Inline(state) => {
                self.shared.progress().submitted += 1;
                let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                self.shared.run(&mut *s, cmd);
                Ok(())
            }
        }
    }

    /// Runs `f` on the calling thread now if the queue is idle (nothing submitted is still
    /// pending), with submissions held off until it returns; `None` (and `f` not run) when
    /// work is queued. For transfers that may skip the queue when nothing could be ordered
    /// before them.
    pub fn run_if_idle<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        let p = self.shared.progress();
        if p.completed < p.submitted {
            return None;
        }
        let r = f();
        drop(p);
        Some(r)
    }

    /// Blocks until everything submitted so far has run; returns (and clears) the first error
    /// since the last synchronize.
    /// Each finished command restarts the wait bound ([`crate::wait_bound`]): only a
    /// queue that stops making progress times out.
    pub fn synchronize(&self) -> Result<(), BackendError> {
        let p = self.shared.progress();
        let target = p.submitted;
        let mut p = crate::wait::wait_until(
            &self.shared.done_cv,
            p,
            |p| p.completed >= target,
            |p| p.completed,
            || format!("the queue of {} to finish", self.shared.name),
        )?;
        match p.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Commands submitted and not yet finished.
    pub fn pending(&self) -> u64 {
        let p = self.shared.progress();
        p.submitted - p.completed
    }
}

impl<S: Send + 'static, C: QueuedCommand<S>> Drop for CommandQueue<S, C> {
    fn drop(&mut self) {
        if let Mode::Threaded { thread } = &mut self.mode {
            self.shared.progress().closed = true;
            self.shared.work_cv.notify_all();
            if let Some(t) = thread.take() {
                let _ = t.join();
            }
        }
    }
}
