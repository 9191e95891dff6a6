//! An in-order command queue, the building block of host-memory device streams.
//!
//! A threaded queue owns a thread that owns the device's execution state `S` (worker pool,
//! scratch memory); the host enqueues boxed commands and returns at once. An inline queue runs
//! each command on the caller's thread (a synchronous device). Either way commands complete in
//! submission order, and the first error is kept (sticky) until the next `synchronize`
//! reports it; later commands still run, so event signals are never lost.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::error::BackendError;

/// A unit of queued work.
pub type Command<S> = Box<dyn FnOnce(&mut S) -> Result<(), BackendError> + Send>;

#[derive(Default)]
struct Progress {
    submitted: u64,
    completed: u64,
    error: Option<BackendError>,
}

struct Shared {
    name: String,
    progress: Mutex<Progress>,
    cv: Condvar,
}

impl Shared {
    fn progress(&self) -> MutexGuard<'_, Progress> {
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
        self.cv.notify_all();
    }

    fn run<S>(&self, state: &mut S, cmd: Command<S>) {
        let result = catch_unwind(AssertUnwindSafe(|| cmd(state))).unwrap_or_else(|_| {
            Err(BackendError::Device {
                device: self.name.clone(),
                message: "a queued command panicked".into(),
            })
        });
        self.finish(result);
    }
}

enum Mode<S> {
    Threaded {
        tx: Option<mpsc::Sender<Command<S>>>,
        thread: Option<JoinHandle<()>>,
    },
    Inline(Mutex<S>),
}

/// An in-order queue of commands over execution state `S`.
pub struct CommandQueue<S: Send + 'static> {
    shared: Arc<Shared>,
    mode: Mode<S>,
}

impl<S: Send + 'static> CommandQueue<S> {
    /// A queue with its own thread; `init` builds the state on that thread.
    pub fn threaded(
        name: &str,
        init: impl FnOnce() -> S + Send + 'static,
    ) -> Result<CommandQueue<S>, BackendError> {
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            progress: Mutex::new(Progress::default()),
            cv: Condvar::new(),
        });
        let (tx, rx) = mpsc::channel::<Command<S>>();
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("lamina-{name}-queue"))
            .spawn(move || {
                let mut state = init();
                // Ends when every sender is gone, after draining what was queued.
                while let Ok(cmd) = rx.recv() {
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
                tx: Some(tx),
                thread: Some(thread),
            },
        })
    }

    /// A queue that runs commands on the submitting thread.
    pub fn inline(name: &str, state: S) -> CommandQueue<S> {
        CommandQueue {
            shared: Arc::new(Shared {
                name: name.to_owned(),
                progress: Mutex::new(Progress::default()),
                cv: Condvar::new(),
            }),
            mode: Mode::Inline(Mutex::new(state)),
        }
    }

    /// Whether `submit` returns before the command has run.
    pub fn is_async(&self) -> bool {
        matches!(self.mode, Mode::Threaded { .. })
    }

    /// Enqueues `cmd` behind everything submitted before.
    pub fn submit(
        &self,
        cmd: impl FnOnce(&mut S) -> Result<(), BackendError> + Send + 'static,
    ) -> Result<(), BackendError> {
        match &self.mode {
            Mode::Threaded { tx, .. } => {
                let mut p = self.shared.progress();
                let tx = tx
                    .as_ref()
                    .ok_or_else(|| BackendError::QueueClosed(self.shared.name.clone()))?;
                tx.send(Box::new(cmd))
                    .map_err(|_| BackendError::QueueClosed(self.shared.name.clone()))?;
                p.submitted += 1;
                Ok(())
            }
            Mode::Inline(state) => {
                self.shared.progress().submitted += 1;
                let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                self.shared.run(&mut *s, Box::new(cmd));
                Ok(())
            }
        }
    }

    /// Blocks until everything submitted so far has run; returns (and clears) the first error
    /// since the last synchronize.
    pub fn synchronize(&self) -> Result<(), BackendError> {
        let mut p = self.shared.progress();
        let target = p.submitted;
        while p.completed < target {
            p = self.shared.cv.wait(p).unwrap_or_else(|e| e.into_inner());
        }
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

impl<S: Send + 'static> Drop for CommandQueue<S> {
    fn drop(&mut self) {
        if let Mode::Threaded { tx, thread } = &mut self.mode {
            tx.take();
            if let Some(t) = thread.take() {
                let _ = t.join();
            }
        }
    }
}
