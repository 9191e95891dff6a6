//! Helpers shared by the CPU backend's integration tests.
#![allow(dead_code)] // Each test binary uses its own subset.

pub mod conf;

/// A small xorshift generator: the same values on every run and machine.
pub struct Rng(pub u64);

impl Rng {
    /// A generator from any seed (mixed, and never zero).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next raw 64-bit state.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// The next value in [-1, 1).
    pub fn next(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` values in [-scale, scale).
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

/// f32 values as little-endian bytes.
pub fn bytes_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Allocates `g` in `dev`'s memory (inputs and outputs stay live for the whole graph, so each
/// keeps its own), writes `inputs`, computes on the device's stream and returns each of
/// `outputs` as f32 values.
pub fn run_graph(
    dev: &dyn lamina_backend::Device,
    mut g: lamina_core::graph::Graph,
    inputs: Vec<(lamina_core::graph::TensorId, Vec<u8>)>,
    outputs: &[lamina_core::graph::TensorId],
) -> Vec<Vec<f32>> {
    use lamina_backend::{BufferSlice, GraphAllocator};
    GraphAllocator::new(dev.buffer_type())
        .allocate(&mut g)
        .unwrap();
    let g = std::sync::Arc::new(g);
    let stream = dev.stream();
    for (id, data) in inputs {
        stream
            .set_async(&BufferSlice::of_tensor(&g, id).unwrap(), data)
            .unwrap();
    }
    stream.compute_async(g.clone()).unwrap();
    let reads: Vec<_> = outputs
        .iter()
        .map(|&id| {
            stream
                .get_async(&BufferSlice::of_tensor(&g, id).unwrap())
                .unwrap()
        })
        .collect();
    stream.synchronize().unwrap();
    reads.iter().map(|r| r.wait_f32().unwrap()).collect()
}

/// One record of a vector file the C harnesses write (`LXV1`: per record a name and arrays,
/// each length-prefixed with a little-endian u32).
pub struct Record<'a> {
    pub name: &'a str,
    pub arrays: Vec<&'a [u8]>,
}

/// The records of a vector file.
pub fn records(bytes: &[u8]) -> Vec<Record<'_>> {
    assert_eq!(&bytes[..4], b"LXV1");
    let mut p = 4;
    let u32_at = |p: &mut usize| {
        let v = u32::from_le_bytes(bytes[*p..*p + 4].try_into().unwrap()) as usize;
        *p += 4;
        v
    };
    let mut out = Vec::new();
    while p < bytes.len() {
        let l = u32_at(&mut p);
        let name = std::str::from_utf8(&bytes[p..p + l]).unwrap();
        p += l;
        let n = u32_at(&mut p);
        let mut arrays = Vec::new();
        for _ in 0..n {
            let l = u32_at(&mut p);
            arrays.push(&bytes[p..p + l]);
            p += l;
        }
        out.push(Record { name, arrays });
    }
    out
}
