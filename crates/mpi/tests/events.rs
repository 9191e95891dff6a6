//! Waits across processes: a remote device's queue that waits for an event of the front, or
//! of another rank, is told by the event's owner when it is reached, so the front's host never
//! waits. Here the first event is a gate the test opens only after queuing everything, so any
//! host wait on the way would time out. (Its own test binary: the wait bound is process-wide.)

use std::time::Duration;

use lamina_backend::BufferSlice;

mod common;
use common::cluster;

#[test]
fn a_remote_queue_waits_for_another_process_event_without_the_host_waiting() {
    lamina_backend::set_wait_bound(Some(Duration::from_secs(60)));
    let (host, cluster) = cluster(3);
    let devices = cluster.devices();
    let (d1, d2) = (&devices[0], &devices[1]);
    let (s1, s2) = (d1.stream(), d2.stream());
    let b1 = d1.buffer_type().alloc_buffer(16).unwrap();
    let b2 = d2.buffer_type().alloc_buffer(16).unwrap();
    let (w1, w2) = (BufferSlice::whole(&b1), BufferSlice::whole(&b2));

    // The gate: an event of the front's own device, recorded, signalled only below.
    let gate = host.new_event().unwrap();
    let opened = gate.record_with(|_| Ok(())).unwrap();
    // CPU@1 waits for the front's gate, writes, records `e1`.
    s1.wait(&gate).unwrap();
    s1.set_async(&w1, vec![1; 16]).unwrap();
    let e1 = d1.new_event().unwrap();
    s1.record(&e1).unwrap();
    // CPU@2 waits for CPU@1's event, then writes.
    s2.wait(&e1).unwrap();
    s2.set_async(&w2, vec![2; 16]).unwrap();
    let r1 = s1.get_async(&w1).unwrap();
    let r2 = s2.get_async(&w2).unwrap();
    // Nothing behind the gate can have run: every wait is on the devices' queues.
    assert!(!e1.is_complete());
    assert!(!r1.is_ready() && !r2.is_ready());

    gate.signal(opened);
    assert_eq!(r2.wait().unwrap(), vec![2; 16]);
    assert_eq!(r1.wait().unwrap(), vec![1; 16]);
    assert!(e1.is_complete());
    s1.synchronize().unwrap();
    s2.synchronize().unwrap();
    cluster.shutdown().unwrap();
    lamina_backend::set_wait_bound(None);
}
