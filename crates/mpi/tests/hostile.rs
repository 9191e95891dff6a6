//! A rank's device server under arbitrary messages (the fuzz target `mpi_message` does the
//! same without end): valid requests of every kind, then the same bytes mutated, sent raw to
//! a serving rank. It must never panic and must keep answering: after every batch a `Hello`
//! is answered, and a `Shutdown` ends it cleanly. (Its own test binary: the wait bound that
//! ends the waits some requests start is process-wide.)

use std::time::Duration;

use lamina_core::DType;
use lamina_core::graph::Graph;
use lamina_mpi::wire::{Message, Reply, Request, SliceRef, WireTensor};

mod common;
use common::cpu;

fn slice(buffer: u64, offset: usize, len: usize) -> SliceRef {
    SliceRef {
        buffer,
        offset,
        len,
    }
}

/// `c = a + b` over 4 f32s, the three bound to buffer 1 at 0, 16 and 32.
fn small_graph() -> Vec<WireTensor> {
    let mut g = Graph::new();
    let a = g.new_tensor(DType::F32, &[4]).unwrap();
    let b = g.new_tensor(DType::F32, &[4]).unwrap();
    let c = g.add(a, b).unwrap();
    [a, b, c]
        .iter()
        .zip([0, 16, 32])
        .map(|(&id, at)| WireTensor::from_tensor(g.tensor(id), Some((1, at))))
        .collect()
}

/// One valid message of every kind, in an order that makes the ids they name exist (buffers
/// 1 and 2, event 3 on the server).
fn valid_messages() -> Vec<Vec<u8>> {
    let s = slice(1, 0, 16);
    let requests = [
        Request::Alloc {
            device: 0,
            size: 64,
        },
        Request::Alloc {
            device: 0,
            size: 64,
        },
        Request::NewEvent { device: 0 },
        Request::Write {
            slice: s,
            data: vec![1; 16],
        },
        Request::Read { slice: s },
        Request::Fill {
            slice: slice(2, 8, 8),
            value: 3,
        },
        Request::Copy {
            src: s,
            dst: slice(2, 16, 16),
        },
        Request::Compute {
            device: 0,
            tensors: small_graph(),
            nodes: (2, 3),
        },
        Request::SetAsync {
            device: 0,
            slice: s,
            data: vec![2; 16],
        },
        Request::GetAsync {
            device: 0,
            slice: s,
        },
        Request::Record {
            device: 0,
            event: 3,
        },
        Request::Wait {
            device: 0,
            event: 3,
        },
        Request::EventWait { event: 3, value: 1 },
        Request::EventQuery { event: 3 },
        Request::Synchronize { device: 0 },
        Request::SendTo {
            device: 0,
            slice: s,
            to: 0,
            tag: 5,
        },
        Request::Expect {
            device: 0,
            slice: slice(2, 0, 4),
            tag: 6,
        },
        Request::WaitSignal { device: 0, tag: 7 },
        Request::SignalWhen {
            event: 3,
            value: 1,
            to: 0,
            tag: 8,
        },
        Request::CopyAsync {
            src_device: 0,
            dst_device: 0,
            src: s,
            dst: slice(2, 32, 16),
            fenced: true,
        },
        Request::MapFile {
            device: 0,
            path: "/nonexistent/model.gguf".into(),
            size: 1 << 20,
            header_sha256: [0; 32],
        },
        Request::OpenFile {
            path: "/nonexistent/model.gguf".into(),
            size: 1 << 20,
            header_sha256: [0; 32],
        },
        Request::WriteFromFile {
            slice: s,
            file: 9,
            offset: 0,
        },
        Request::Free { buffer: 2 },
        Request::FreeEvent { event: 3 },
        Request::Hello,
    ];
    let mut out: Vec<Vec<u8>> = requests
        .into_iter()
        .enumerate()
        .map(|(i, request)| {
            Message::Request {
                seq: i as u64 % 3,
                request,
            }
            .encode()
        })
        .collect();
    // What other ranks send: copy data (the expected one and a stray), a signal, a reply.
    for (tag, bytes) in [(6, Ok(vec![9; 4])), (7, Ok(vec![])), (99, Err("x".into()))] {
        out.push(Message::Data { tag, bytes }.encode());
    }
    out.push(
        Message::Reply {
            seq: 1,
            reply: Ok(Reply::Unit),
        }
        .encode(),
    );
    out
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Flips, overwrites, truncates or inserts a few bytes (postcard's varints turn these into
/// other ids, sizes and variants as often as into undecodable messages).
fn mutated(rng: &mut Rng, message: &[u8]) -> Vec<u8> {
    let mut m = message.to_vec();
    for _ in 0..1 + rng.below(3) {
        let at = rng.below(m.len());
        match rng.below(5) {
            0 if !m.is_empty() => m[at] ^= 1 << rng.below(8),
            1 if !m.is_empty() => m[at] = [0, 1, 0x7F, 0x80, 0xFF][rng.below(5)],
            2 => m.truncate(at),
            3 => m
                .splice(at..at, [0xFF; 4].into_iter().take(1 + rng.below(4)))
                .for_each(drop),
            _ => m.insert(at.min(m.len()), rng.next() as u8),
        }
    }
    m
}

fn survives(batch: &[Vec<u8>]) {
    if let Err(e) = lamina_mpi::testing::serving_rank_survives(batch, vec![cpu(1)]) {
        panic!("{e} after {batch:?}");
    }
}

#[test]
fn a_serving_rank_survives_arbitrary_messages() {
    // The waits that requests start (a signal that never comes, an event never reached) end
    // after this bound, as a hung peer's would.
    lamina_backend::set_wait_bound(Some(Duration::from_millis(100)));
    let valid = valid_messages();
    survives(&valid);
    survives(&fuzz_huge_alloc());
    let mut rng = Rng(0x5EED_0001_0000_0018);
    let (mut sent, mut decodable) = (0, 0);
    for _ in 0..1500 {
        let batch: Vec<Vec<u8>> = (0..1 + rng.below(8))
            .map(|_| {
                let m = &valid[rng.below(valid.len())];
                if rng.below(4) == 0 {
                    m.clone()
                } else {
                    mutated(&mut rng, m)
                }
            })
            .collect();
        sent += batch.len();
        decodable += batch.iter().filter(|m| Message::decode(m).is_ok()).count();
        survives(&batch);
    }
    // Not a test of the decoder alone: many messages reach the server as requests.
    assert!(decodable * 3 > sent, "{decodable} of {sent} decodable");
    lamina_backend::set_wait_bound(None);
}

/// The `mpi_message` fuzzer's input of 2026-12-05 (the target's framing: u16 length, bytes):
/// an `Alloc` of ~3·10^18 bytes. Under AddressSanitizer that aborts (its allocator refuses
/// sizes over 1 TiB by default); in a normal build the allocation fails and the rank answers
/// with an error and keeps serving.
fn fuzz_huge_alloc() -> Vec<Vec<u8>> {
    lamina_mpi::testing::framed_batch(include_bytes!("data/fuzz-huge-alloc.bin"))
}

/// Writes the fuzzer's seed corpus (`fuzz/seeds/mpi_message`): the valid messages as one
/// batch, and each alone, in the target's framing (u16 length, bytes).
#[test]
#[ignore = "writes into the source tree; run by hand to refresh the fuzz seeds"]
fn write_fuzz_seeds() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/seeds/mpi_message");
    std::fs::create_dir_all(dir).unwrap();
    let frame = |ms: &[Vec<u8>]| -> Vec<u8> {
        ms.iter()
            .flat_map(|m| (m.len() as u16).to_le_bytes().into_iter().chain(m.clone()))
            .collect()
    };
    let valid = valid_messages();
    std::fs::write(format!("{dir}/all"), frame(&valid)).unwrap();
    for (i, m) in valid.iter().enumerate() {
        std::fs::write(format!("{dir}/{i:02}"), frame(std::slice::from_ref(m))).unwrap();
    }
}
