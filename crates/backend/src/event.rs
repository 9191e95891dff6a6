//! Events: a monotonic counter with a condition variable, the CPU analogue of `MTLSharedEvent`.
//!
//! `record` on a stream reserves the next value ([`Event::record_with`]) and enqueues its
//! signal; `wait` on any stream captures the latest reserved value and enqueues a device-side
//! wait for it; [`Event::synchronize`] blocks the host. An event is recorded only on streams of
//! the device that owns it, and one device has one in-order queue, so signals arrive in value
//! order and "completed ≥ v" means "record v and all earlier ones are done".

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::BackendError;
use crate::device::DeviceKey;

#[derive(Debug, Default)]
struct Counters {
    /// Highest value handed out by a record.
    recorded: u64,
    /// Highest value signalled by the device.
    completed: u64,
}

#[derive(Debug)]
struct EventShared {
    device: DeviceKey,
    device_name: String,
    counters: Mutex<Counters>,
    cv: Condvar,
}

/// A synchronization point between streams, and between a stream and the host. Cheap to clone
/// (clones are the same event).
#[derive(Clone, Debug)]
pub struct Event(Arc<EventShared>);

impl PartialEq for Event {
    fn eq(&self, other: &Event) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for Event {}

impl Event {
    /// A new event owned by `device`. Devices hand them out through `Device::new_event`.
    pub fn new(device: DeviceKey, device_name: &str) -> Event {
        Event(Arc::new(EventShared {
            device,
            device_name: device_name.to_owned(),
            counters: Mutex::new(Counters::default()),
            cv: Condvar::new(),
        }))
    }

    fn counters(&self) -> MutexGuard<'_, Counters> {
        // A poisoned lock only means another thread panicked mid-update of two integers that
        // are always left consistent; keep going.
        self.0.counters.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn device(&self) -> DeviceKey {
        self.0.device
    }

    pub fn device_name(&self) -> &str {
        &self.0.device_name
    }

    /// Reserves the next value and calls `enqueue` with it while holding the event's lock, so
    /// that concurrent records enqueue their signals in value order. For stream implementers.
    pub fn record_with<T>(&self, enqueue: impl FnOnce(u64) -> T) -> T {
        let mut c = self.counters();
        c.recorded += 1;
        let v = c.recorded;
        let r = enqueue(v);
        drop(c);
        r
    }

    /// The value a wait enqueued now must wait for (the latest record).
    pub fn target(&self) -> u64 {
        self.counters().recorded
    }

    /// Device side: marks value `v` reached and wakes waiters.
    pub fn signal(&self, v: u64) {
        let mut c = self.counters();
        if v > c.completed {
            c.completed = v;
        }
        drop(c);
        self.0.cv.notify_all();
    }

    /// Blocks the calling thread until value `v` is signalled, at most the device layer's
    /// wait bound ([`crate::wait_bound`]; each signal restarts it).
    pub fn wait_for(&self, v: u64) -> Result<(), BackendError> {
        let c = self.counters();
        crate::wait::wait_until(
            &self.0.cv,
            c,
            |c| c.completed >= v,
            |c| c.completed,
            || format!("event of {} to reach {v}", self.0.device_name),
        )
        .map(drop)
    }

    /// Blocks the host until the latest record has completed (immediately if never recorded).
    pub fn synchronize(&self) -> Result<(), BackendError> {
        let v = self.target();
        self.wait_for(v)
    }

    /// Whether the latest record has completed.
    pub fn is_complete(&self) -> bool {
        let c = self.counters();
        c.completed >= c.recorded
    }
}
