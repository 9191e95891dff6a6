//! The bound on every blocking wait of the device layer (events, queue synchronization,
//! pending reads): a device that never finishes, or an event that is never signalled, becomes
//! [`BackendError::Timeout`] instead of a hang. The bound is generous (one micro-batch of a big
//! model on a slow CPU can take many minutes): `LAMINA_DEVICE_TIMEOUT` seconds, 1800 by
//! default, `0` for none; [`set_wait_bound`] overrides it for the process.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, MutexGuard};
use std::time::{Duration, Instant};

use crate::BackendError;

/// Milliseconds; `u64::MAX`: not read from the environment yet; 0: no bound.
static BOUND_MS: AtomicU64 = AtomicU64::new(u64::MAX);

const DEFAULT_SECS: u64 = 1800;

/// The longest a device-layer wait blocks (`None`: forever).
pub fn wait_bound() -> Option<Duration> {
    let mut ms = BOUND_MS.load(Ordering::Relaxed);
    if ms == u64::MAX {
        let secs = std::env::var("LAMINA_DEVICE_TIMEOUT")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(DEFAULT_SECS);
        ms = secs.saturating_mul(1000).min(u64::MAX - 1);
        BOUND_MS.store(ms, Ordering::Relaxed);
    }
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// Sets the bound for this process (`None`: no bound).
pub fn set_wait_bound(bound: Option<Duration>) {
    let ms = bound.map_or(0, |d| (d.as_millis() as u64).clamp(1, u64::MAX - 1));
    BOUND_MS.store(ms, Ordering::Relaxed);
}

/// Waits on `cv` until `done` holds, at most the bound, restarting the bound whenever
/// `progress` (read under the lock) changes. `what` names the wait in the error.
pub fn wait_until<'a, T>(
    cv: &Condvar,
    mut guard: MutexGuard<'a, T>,
    mut done: impl FnMut(&T) -> bool,
    mut progress: impl FnMut(&T) -> u64,
    what: impl FnOnce() -> String,
) -> Result<MutexGuard<'a, T>, BackendError> {
    let bound = wait_bound();
    let mut seen = progress(&guard);
    let mut deadline = bound.map(|b| Instant::now() + b);
    while !done(&guard) {
        guard = match deadline {
            None => cv.wait(guard).unwrap_or_else(|e| e.into_inner()),
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return Err(BackendError::Timeout {
                        what: what(),
                        waited: bound.unwrap_or_default(),
                    });
                }
                cv.wait_timeout(guard, d - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
        };
        let p = progress(&guard);
        if p != seen {
            seen = p;
            deadline = bound.map(|b| Instant::now() + b);
        }
    }
    Ok(guard)
}
