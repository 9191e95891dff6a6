//! What the hostile-message property test and the `mpi_message` fuzz target share: a serving
//! rank fed raw messages must not panic and must keep answering.

use std::sync::Arc;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use lamina_backend::Device;

use crate::transport::{LocalTransport, Transport};
use crate::wire::{Message, Reply, Request};

/// The sequence number of the liveness probe (raw messages do not use it in practice).
const PROBE: u64 = u64::MAX - 7;

/// The fuzz target's framing: messages as a u16 length and that many bytes (a short last one
/// takes what is left), at most 64 of them.
pub fn framed_batch(mut data: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while data.len() >= 2 && out.len() < 64 {
        let n = (u16::from_le_bytes([data[0], data[1]]) as usize).min(data.len() - 2);
        out.push(data[2..2 + n].to_vec());
        data = &data[2 + n..];
    }
    out
}

/// Serves `devices` on rank 1 of a fresh in-process pair and sends it `batch` raw; then it must
/// answer `Hello` (unless the batch told it to stop) and stop on `Shutdown`, without panicking.
pub fn serving_rank_survives(
    batch: &[Vec<u8>],
    devices: Vec<Arc<dyn Device>>,
) -> Result<(), String> {
    let n_devices = devices.len();
    let mut ranks = LocalTransport::network(2).into_iter();
    let (Some(front), Some(rank1)) = (ranks.next(), ranks.next()) else {
        return Err("no ranks".into());
    };
    let server = std::thread::spawn(move || crate::serve(rank1, devices));
    // The front's end is raw too: whatever rank 1 sends back (replies to the batch's requests,
    // copy data) is read here, and only the probe's reply counts.
    let (tx, rx) = channel();
    front.start(Box::new(move |_, bytes| {
        let _ = tx.send(bytes);
    }));
    let mut stopped = false;
    for m in batch {
        let _ = front.send(1, m.clone());
        stopped |= matches!(
            Message::decode(m),
            Ok(Message::Request {
                request: Request::Shutdown,
                ..
            })
        );
    }
    let request = |request| Message::Request {
        seq: PROBE,
        request,
    };
    let mut result = Ok(());
    if !stopped {
        let _ = front.send(1, request(Request::Hello).encode());
        let deadline = Instant::now() + Duration::from_secs(30);
        result = Err("no answer to Hello".to_string());
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let Ok(bytes) = rx.recv_timeout(left) else {
                break;
            };
            if let Ok(Message::Reply { seq: PROBE, reply }) = Message::decode(&bytes) {
                result = match reply {
                    Ok(Reply::Devices(d)) if d.len() == n_devices => Ok(()),
                    other => Err(format!("Hello answered {other:?}")),
                };
                break;
            }
        }
        let _ = front.send(1, request(Request::Shutdown).encode());
    }
    if server.join().is_err() {
        result = Err("the server panicked".into());
    }
    front.stop();
    result
}
