//! The random source llama.cpp samples with: `std::mt19937` plus the libstdc++/libc++
//! `std::generate_canonical` arithmetic behind `std::uniform_real_distribution`.

use std::fmt;

const N: usize = 624;
const M: usize = 397;

/// llama.cpp's `LLAMA_DEFAULT_SEED`: "pick a random seed".
pub const DEFAULT_SEED: u32 = 0xFFFF_FFFF;

/// 32-bit Mersenne Twister, bit-identical to C++ `std::mt19937`.
#[derive(Clone)]
pub struct Mt19937 {
    state: [u32; N],
    index: usize,
}

impl fmt::Debug for Mt19937 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mt19937")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl Mt19937 {
    /// The C++ standard's default seed (`std::mt19937::default_seed`).
    pub const CXX_DEFAULT_SEED: u32 = 5489;

    /// Same state as `std::mt19937 rng(seed)`.
    pub fn new(seed: u32) -> Self {
        let mut rng = Mt19937 {
            state: [0; N],
            index: N,
        };
        rng.seed(seed);
        rng
    }

    /// Same as `rng.seed(seed)`.
    pub fn seed(&mut self, seed: u32) {
        self.state[0] = seed;
        for i in 1..N {
            let prev = self.state[i - 1];
            self.state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        self.index = N;
    }

    fn twist(&mut self) {
        for i in 0..N {
            let y = (self.state[i] & 0x8000_0000) | (self.state[(i + 1) % N] & 0x7fff_ffff);
            let mut v = self.state[(i + M) % N] ^ (y >> 1);
            if y & 1 != 0 {
                v ^= 0x9908_b0df;
            }
            self.state[i] = v;
        }
        self.index = 0;
    }

    /// Next output, as `rng()`.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// `std::uniform_real_distribution<double>(0, 1)(rng)`: two draws combined as
    /// `(g1 + g2 * 2^32) / 2^64` in double (libstdc++ and libc++ agree), clamped below 1
    /// as libstdc++ does.
    pub fn uniform_f64(&mut self) -> f64 {
        let g1 = f64::from(self.next_u32());
        let g2 = f64::from(self.next_u32());
        let sum = g1 + g2 * 4_294_967_296.0;
        let r = sum / 18_446_744_073_709_551_616.0;
        if r >= 1.0 {
            1.0 - f64::EPSILON / 2.0
        } else {
            r
        }
    }

    /// `std::uniform_real_distribution<float>(0, 1)(rng)`: one draw, rounded to float,
    /// divided by 2^32, clamped below 1 (libstdc++).
    pub fn uniform_f32(&mut self) -> f32 {
        let g = self.next_u32() as f32;
        let r = g / 4_294_967_296.0f32;
        if r >= 1.0 {
            1.0 - f32::EPSILON / 2.0
        } else {
            r
        }
    }
}

/// Resolves llama.cpp's seed convention: [`DEFAULT_SEED`] means "random", anything
/// else is used as is.
pub fn resolve_seed(seed: u32) -> u32 {
    if seed != DEFAULT_SEED {
        return seed;
    }
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS once per process and perturbed per instance;
    // mixing in the clock makes consecutive calls differ too.
    let mut h = RandomState::new().build_hasher();
    if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    let v = h.finish();
    let s = (v ^ (v >> 32)) as u32;
    // Never hand back DEFAULT_SEED itself, so a reported seed always reproduces the run.
    if s == DEFAULT_SEED { 0 } else { s }
}
