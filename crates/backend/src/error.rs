//! Typed errors of the device layer.

use lamina_core::graph::GraphError;

/// Everything that can go wrong in the device layer. Cloneable so a queue can keep a sticky
/// error and report it at the next synchronization.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    #[error("access of {len} bytes at offset {offset} is outside buffer {buffer} of {size} bytes")]
    OutOfBounds {
        buffer: String,
        offset: usize,
        len: usize,
        size: usize,
    },
    #[error("size mismatch in {what}: {expected} bytes expected, {actual} given")]
    SizeMismatch {
        what: &'static str,
        expected: usize,
        actual: usize,
    },
    #[error("buffer {buffer} (buffer type {buffer_type}) cannot be used by device {device}")]
    ForeignBuffer {
        buffer: String,
        buffer_type: String,
        device: String,
    },
    #[error(
        "event of device {event_device} cannot be recorded on a stream of device {stream_device}"
    )]
    ForeignEvent {
        event_device: String,
        stream_device: String,
    },
    #[error("buffer {0} is read-only")]
    ReadOnly(String),
    #[error("cannot allocate {size} bytes with buffer type {buffer_type}")]
    AllocFailed { buffer_type: String, size: usize },
    #[error("tensor {0} has no memory")]
    Unbound(String),
    #[error("{device} does not support {what}")]
    Unsupported { device: String, what: String },
    #[error("device {device}: {message}")]
    Device { device: String, message: String },
    #[error("the queue of device {0} has stopped")]
    QueueClosed(String),
    /// A wait of the device layer outlived its bound ([`crate::wait_bound`]).
    #[error(
        "timed out after {} s waiting for {what} (the device seems hung; LAMINA_DEVICE_TIMEOUT \
         sets the bound)",
        waited.as_secs_f64()
    )]
    Timeout {
        what: String,
        waited: std::time::Duration,
    },
    #[error(transparent)]
    Graph(#[from] GraphError),
}
