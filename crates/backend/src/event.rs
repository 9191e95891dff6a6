//! Events: ggml-backend's event interface, on a timeline of values (as Vulkan's timeline
//! semaphores and the seed's `MTLSharedEvent`).
//!
//! `record` on a stream reserves the next value ([`Event::record_with`]) and enqueues its
//! signal; `wait` on any stream captures the latest reserved value and enqueues a device-side
//! wait for it; [`Event::synchronize`] blocks the host. An event is recorded only on streams of
//! the device that owns it, and one device has one in-order queue, so signals arrive in value
//! order and "completed ≥ v" means "record v and all earlier ones are done".
//!
//! Backends implement [`EventImpl`]; [`TimelineEvent`] (a counter and a condition variable) is
//! the implementation for devices whose queues signal from host threads, and a backend whose
//! completions must be driven (polled) wraps or replaces it.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::BackendError;
use crate::device::DeviceKey;

/// The device side of an event.
pub trait EventImpl: Send + Sync + fmt::Debug + Any {
    fn device(&self) -> DeviceKey;
    fn device_name(&self) -> &str;
    /// Reserves the next value and calls `enqueue` with it, exactly once, while keeping other
    /// records out, so that concurrent records enqueue their signals in value order. Returns
    /// the value, or `enqueue`'s error.
    fn record_with(
        &self,
        enqueue: &mut dyn FnMut(u64) -> Result<(), BackendError>,
    ) -> Result<u64, BackendError>;
    /// The value a wait enqueued now must wait for (the latest record).
    fn target(&self) -> u64;
    /// Device side: marks value `v` reached and wakes waiters.
    fn signal(&self, v: u64);
    /// Blocks the calling thread until value `v` is reached, at most the device layer's wait
    /// bound ([`crate::wait_bound`]).
    fn wait_for(&self, v: u64) -> Result<(), BackendError>;
    /// Whether the latest record has completed.
    fn is_complete(&self) -> bool;
    fn as_any(&self) -> &dyn Any;
}

#[derive(Debug, Default)]
struct Counters {
    /// Highest value handed out by a record.
    recorded: u64,
    /// Highest value signalled by the device.
    completed: u64,
}

/// An event signalled from host threads (a device's queue thread): a counter with a condition
/// variable, the CPU analogue of `MTLSharedEvent`.
#[derive(Debug)]
pub struct TimelineEvent {
    device: DeviceKey,
    device_name: String,
    counters: Mutex<Counters>,
    cv: Condvar,
}

impl TimelineEvent {
    pub fn new(device: DeviceKey, device_name: &str) -> TimelineEvent {
        TimelineEvent {
            device,
            device_name: device_name.to_owned(),
            counters: Mutex::new(Counters::default()),
            cv: Condvar::new(),
        }
    }

    fn counters(&self) -> MutexGuard<'_, Counters> {
        // A poisoned lock only means another thread panicked mid-update of two integers that
        // are always left consistent; keep going.
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl EventImpl for TimelineEvent {
    fn device(&self) -> DeviceKey {
        self.device
    }
    fn device_name(&self) -> &str {
        &self.device_name
    }
    fn record_with(
        &self,
        enqueue: &mut dyn FnMut(u64) -> Result<(), BackendError>,
    ) -> Result<u64, BackendError> {
        let mut c = self.counters();
        c.recorded += 1;
        let v = c.recorded;
        let r = enqueue(v);
        drop(c);
        r.map(|()| v)
    }
    fn target(&self) -> u64 {
        self.counters().recorded
    }
    fn signal(&self, v: u64) {
        let mut c = self.counters();
        if v > c.completed {
            c.completed = v;
        }
        drop(c);
        self.cv.notify_all();
    }
    fn wait_for(&self, v: u64) -> Result<(), BackendError> {
        let c = self.counters();
        crate::wait::wait_until(
            &self.cv,
            c,
            |c| c.completed >= v,
            |c| c.completed,
            || format!("event of {} to reach {v}", self.device_name),
        )
        .map(drop)
    }
    fn is_complete(&self) -> bool {
        let c = self.counters();
        c.completed >= c.recorded
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A synchronization point between streams, and between a stream and the host. Cheap to clone
/// (clones are the same event).
#[derive(Clone, Debug)]
pub struct Event(Arc<dyn EventImpl>);

impl PartialEq for Event {
    fn eq(&self, other: &Event) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.0), Arc::as_ptr(&other.0))
    }
}
impl Eq for Event {}

impl Event {
    /// A new host-signalled event ([`TimelineEvent`]) owned by `device`. Devices hand them out
    /// through `Device::new_event`.
    pub fn new(device: DeviceKey, device_name: &str) -> Event {
        Event(Arc::new(TimelineEvent::new(device, device_name)))
    }

    /// The handle of a backend's event.
    pub fn from_impl(implementation: Arc<dyn EventImpl>) -> Event {
        Event(implementation)
    }

    /// The backend's implementation (to downcast to its own type).
    pub fn implementation(&self) -> &dyn EventImpl {
        &*self.0
    }

    pub fn device(&self) -> DeviceKey {
        self.0.device()
    }

    pub fn device_name(&self) -> &str {
        self.0.device_name()
    }

    /// Reserves the next value and calls `enqueue` with it, in value order (see
    /// [`EventImpl::record_with`]). For stream implementers.
    pub fn record_with(
        &self,
        mut enqueue: impl FnMut(u64) -> Result<(), BackendError>,
    ) -> Result<u64, BackendError> {
        self.0.record_with(&mut enqueue)
    }

    /// The value a wait enqueued now must wait for (the latest record).
    pub fn target(&self) -> u64 {
        self.0.target()
    }

    /// Device side: marks value `v` reached and wakes waiters.
    pub fn signal(&self, v: u64) {
        self.0.signal(v)
    }

    /// Blocks the calling thread until value `v` is signalled, at most the device layer's
    /// wait bound ([`crate::wait_bound`]; each signal restarts it).
    pub fn wait_for(&self, v: u64) -> Result<(), BackendError> {
        self.0.wait_for(v)
    }

    /// Blocks the host until the latest record has completed (immediately if never recorded).
    pub fn synchronize(&self) -> Result<(), BackendError> {
        let v = self.target();
        self.wait_for(v)
    }

    /// Whether the latest record has completed.
    pub fn is_complete(&self) -> bool {
        self.0.is_complete()
    }
}
