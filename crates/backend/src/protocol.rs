//! The seed's protocol for copies between two in-order queues of one backend, shared by the
//! streams built on [`CommandQueue`] (CPU devices, virtual GPU devices):
//!
//! 1. a fence recorded on the destination queue, behind its queued work (readers of `dst`);
//! 2. on the source queue, one command that waits for the fence, copies and signals, so the
//!    signal can never overtake the copy;
//! 3. on the destination queue, a wait for that signal.
//!
//! The copy is ordered after both queues' work and before the destination's later work, and
//! the host never waits. Unfenced, step 1 is left out: the caller has already ordered the copy
//! after the destination's readers with an event.

use crate::buffer::BufferSlice;
use crate::error::BackendError;
use crate::event::Event;
use crate::queue::{CommandQueue, QueuedCommand};

/// The commands a queue needs for the protocol and for events.
pub trait ProtocolCommand<S>: QueuedCommand<S> + Sized {
    /// Marks `event` reached `value`.
    fn signal(event: Event, value: u64) -> Self;
    /// Blocks the queue until `event` reaches `value`.
    fn wait(event: Event, value: u64) -> Self;
    /// Waits for `fence` (if any), copies `src` to `dst`, then signals `done` (if any).
    fn copy(
        src: BufferSlice,
        dst: BufferSlice,
        fence: Option<(Event, u64)>,
        done: Option<(Event, u64)>,
    ) -> Self;
}

/// Runs a [`ProtocolCommand::copy`] (for the queue's `run`): a fence that never came means no
/// copy, but `done` is still signalled, so its waiters get the queue's error, not a hang.
pub fn run_copy(
    src: &BufferSlice,
    dst: &BufferSlice,
    fence: Option<(Event, u64)>,
    done: Option<(Event, u64)>,
) -> Result<(), BackendError> {
    let fenced = fence.map_or(Ok(()), |(ev, v)| ev.wait_for(v));
    let r = fenced.and_then(|()| dst.copy_from(src));
    if let Some((ev, v)) = done {
        ev.signal(v);
    }
    r
}

/// One side of the protocol: a queue and the event it owns for its part (`sync`: the fence
/// when it is the destination; `copied`: the signal when it is the source).
pub struct ProtocolQueue<'a, S: Send + 'static, C: ProtocolCommand<S>> {
    pub queue: &'a CommandQueue<S, C>,
    pub sync: &'a Event,
    pub copied: &'a Event,
}

/// Queues `src → dst` from queue `from` to queue `to` by the protocol (a copy within one queue
/// is a plain queued copy).
pub fn queue_copy<S: Send + 'static, C: ProtocolCommand<S>>(
    from: &ProtocolQueue<'_, S, C>,
    to: &ProtocolQueue<'_, S, C>,
    src: &BufferSlice,
    dst: &BufferSlice,
    fenced: bool,
) -> Result<(), BackendError> {
    let (src, dst) = (src.clone(), dst.clone());
    if std::ptr::eq(from.queue, to.queue) {
        return to.queue.submit(C::copy(src, dst, None, None));
    }
    // (1) The fence: behind the destination's queued work.
    let fence = if fenced {
        let v = to
            .sync
            .record_with(|v| to.queue.submit(C::signal(to.sync.clone(), v)))?;
        Some((to.sync.clone(), v))
    } else {
        None
    };
    // (2) On the source queue: wait for the fence, copy, signal, as one command.
    let mut parts = Some((src, dst, fence));
    let done = from.copied.record_with(|v| {
        // Called exactly once; the `None` arm only satisfies the type.
        let Some((src, dst, fence)) = parts.take() else {
            return Ok(());
        };
        from.queue
            .submit(C::copy(src, dst, fence, Some((from.copied.clone(), v))))
    })?;
    // (3) Later work on the destination waits for the copy.
    to.queue.submit(C::wait(from.copied.clone(), done))
}

/// `Stream::record` for a protocol queue: reserves the event's next value and queues its
/// signal; a value that could not be queued is signalled at once, so waiters never hang.
pub fn queue_record<S: Send + 'static, C: ProtocolCommand<S>>(
    queue: &CommandQueue<S, C>,
    event: &Event,
) -> Result<(), BackendError> {
    event
        .record_with(|v| {
            let r = queue.submit(C::signal(event.clone(), v));
            if r.is_err() {
                event.signal(v);
            }
            r
        })
        .map(drop)
}

/// `Stream::wait` for a protocol queue: waits for the event's latest record.
pub fn queue_wait<S: Send + 'static, C: ProtocolCommand<S>>(
    queue: &CommandQueue<S, C>,
    event: &Event,
) -> Result<(), BackendError> {
    queue.submit(C::wait(event.clone(), event.target()))
}
