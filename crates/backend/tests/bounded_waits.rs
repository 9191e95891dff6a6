//! Every blocking wait of the device layer is bounded: behind a gate that never opens (an
//! event recorded and never signalled), a stream's synchronize, the host's wait on an event
//! and a pending read each end with a typed timeout, and the stream keeps working after.
//! (A test binary of its own: the bound is set for the whole process.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use lamina_backend::{BackendError, BufferSlice, Device, set_wait_bound};
use lamina_cpu::{CpuBackendReg, CpuConfig};

#[test]
fn a_gate_that_never_opens_times_out_with_a_typed_error() {
    set_wait_bound(Some(Duration::from_millis(200)));
    let reg = CpuBackendReg::new(CpuConfig::default().with_devices(1)).unwrap();
    let dev: Arc<dyn Device> = reg.cpu_devices()[0].clone();
    let stream = dev.stream();
    // Reserve a value and never signal it: the gate.
    let gate = dev.new_event().unwrap();
    gate.record_with(|_| Ok(())).unwrap();
    let t0 = Instant::now();
    assert!(matches!(
        gate.synchronize(),
        Err(BackendError::Timeout { .. })
    ));
    // The stream waits on the gate; a read queued behind it never arrives in time.
    stream.wait(&gate).unwrap();
    let buf = dev.buffer_type().alloc_buffer(16).unwrap();
    let read = stream.get_async(&BufferSlice::whole(&buf)).unwrap();
    // Two waits end at about the same time: the host's on the queue and the queue's on the
    // gate. Either the host times out first (then the next synchronize reports the queue's
    // failed wait), or the queue's wait fails first and this synchronize reports it.
    let err = stream.synchronize().unwrap_err();
    assert!(matches!(err, BackendError::Timeout { .. }), "{err}");
    assert!(err.to_string().contains("LAMINA_DEVICE_TIMEOUT"), "{err}");
    read.wait().unwrap();
    let next = stream.synchronize();
    if err.to_string().contains("queue of") {
        let e = next.unwrap_err();
        assert!(e.to_string().contains("event of"), "{e}");
    } else {
        assert!(err.to_string().contains("event of"), "{err}");
        next.unwrap();
    }
    // Bounded, not instant and not forever.
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(200), "{waited:?}");
    // The stream still works.
    stream
        .set_async(&BufferSlice::whole(&buf), vec![7; 16])
        .unwrap();
    let read = stream.get_async(&BufferSlice::whole(&buf)).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(read.wait().unwrap(), vec![7; 16]);
    set_wait_bound(None);
}
