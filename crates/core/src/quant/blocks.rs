//! Byte layouts of ggml's quantized blocks (`ggml-common.h`), field for field.
//!
//! Every block is `#[repr(C)]`, has no padding and accepts any bit pattern, so a row of blocks can
//! be viewed straight from file bytes with [`bytemuck`] (see [`super::blocks_from_bytes`]).

use bytemuck::{Pod, Zeroable};
use half::f16;

/// Elements per block of the legacy formats (Q4_0 … Q8_1, IQ4_NL).
pub const QK4_0: usize = 32;
/// Elements per Q4_1 block.
pub const QK4_1: usize = 32;
/// Elements per Q5_0 block.
pub const QK5_0: usize = 32;
/// Elements per Q5_1 block.
pub const QK5_1: usize = 32;
/// Elements per Q8_0 block.
pub const QK8_0: usize = 32;
/// Elements per Q8_1 block.
pub const QK8_1: usize = 32;
/// Elements per IQ4_NL block.
pub const QK4_NL: usize = 32;
/// Elements per MXFP4 block.
pub const QK_MXFP4: usize = 32;
/// Elements per K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in Q4_K / Q5_K (and of Q3_K's scales).
pub const K_SCALE_SIZE: usize = 12;

/// The 16 levels of IQ4_NL / IQ4_XS (`kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The 16 levels of MXFP4 (`kvalues_mxfp4`: the E2M1 values, doubled).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// A row-level view of a block type: how many elements one block holds.
pub trait Block: Pod {
    /// Elements per block.
    const ELEMS: usize;
}

macro_rules! block {
    ($(#[$m:meta])* $name:ident, $elems:expr, $size:expr, { $($(#[$fm:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
        pub struct $name {
            $($(#[$fm])* pub $field: $ty),*
        }
        const _: () = assert!(std::mem::size_of::<$name>() == $size);
        impl Block for $name {
            const ELEMS: usize = $elems;
        }
    };
}

block!(
    /// 4-bit symmetric: value = (q - 8) * d.
    BlockQ4_0, QK4_0, 18, {
        /// Scale.
        d: f16,
        /// Nibbles: element j in the low nibble of `qs[j]`, element j+16 in the high one.
        qs: [u8; QK4_0 / 2],
    }
);

block!(
    /// 4-bit with offset: value = q * d + m.
    BlockQ4_1, QK4_1, 20, {
        /// Scale.
        d: f16,
        /// Minimum.
        m: f16,
        /// Nibbles, as in Q4_0.
        qs: [u8; QK4_1 / 2],
    }
);

block!(
    /// 5-bit symmetric: value = (q - 16) * d.
    BlockQ5_0, QK5_0, 22, {
        /// Scale.
        d: f16,
        /// Fifth bits, little-endian u32: bit j belongs to element j.
        qh: [u8; 4],
        /// Low nibbles, as in Q4_0.
        qs: [u8; QK5_0 / 2],
    }
);

block!(
    /// 5-bit with offset: value = q * d + m.
    BlockQ5_1, QK5_1, 24, {
        /// Scale.
        d: f16,
        /// Minimum.
        m: f16,
        /// Fifth bits, as in Q5_0.
        qh: [u8; 4],
        /// Low nibbles.
        qs: [u8; QK5_1 / 2],
    }
);

block!(
    /// 8-bit symmetric: value = q * d.
    BlockQ8_0, QK8_0, 34, {
        /// Scale.
        d: f16,
        /// Quants.
        qs: [i8; QK8_0],
    }
);

block!(
    /// 8-bit with the block sum: value = q * d; `s` = d * Σq.
    BlockQ8_1, QK8_1, 36, {
        /// Scale.
        d: f16,
        /// d * sum(qs), kept for the Q4_1/Q5_1 dot products.
        s: f16,
        /// Quants.
        qs: [i8; QK8_1],
    }
);

block!(
    /// 2-bit K-quant: 16 sub-blocks of 16, 4-bit scale and min each.
    BlockQ2K, QK_K, 84, {
        /// Low nibble: scale, high nibble: min, per sub-block of 16.
        scales: [u8; QK_K / 16],
        /// 2-bit quants.
        qs: [u8; QK_K / 4],
        /// Super-block scale of the scales.
        d: f16,
        /// Super-block scale of the mins.
        dmin: f16,
    }
);

block!(
    /// 3-bit K-quant: 16 sub-blocks of 16, 6-bit signed scales.
    BlockQ3K, QK_K, 110, {
        /// High bit of each quant.
        hmask: [u8; QK_K / 8],
        /// Low 2 bits of each quant.
        qs: [u8; QK_K / 4],
        /// 16 scales of 6 bits, packed.
        scales: [u8; K_SCALE_SIZE],
        /// Super-block scale.
        d: f16,
    }
);

block!(
    /// 4-bit K-quant: 8 sub-blocks of 32, 6-bit scale and min each.
    BlockQ4K, QK_K, 144, {
        /// Super-block scale of the scales.
        d: f16,
        /// Super-block scale of the mins.
        dmin: f16,
        /// 8 scales and 8 mins of 6 bits, packed.
        scales: [u8; K_SCALE_SIZE],
        /// 4-bit quants.
        qs: [u8; QK_K / 2],
    }
);

block!(
    /// 5-bit K-quant: Q4_K plus a high bit per quant.
    BlockQ5K, QK_K, 176, {
        /// Super-block scale of the scales.
        d: f16,
        /// Super-block scale of the mins.
        dmin: f16,
        /// 8 scales and 8 mins of 6 bits, packed.
        scales: [u8; K_SCALE_SIZE],
        /// High bit of each quant.
        qh: [u8; QK_K / 8],
        /// Low 4 bits of each quant.
        qs: [u8; QK_K / 2],
    }
);

block!(
    /// 6-bit K-quant: 16 sub-blocks of 16, 8-bit signed scales.
    BlockQ6K, QK_K, 210, {
        /// Low 4 bits of each quant.
        ql: [u8; QK_K / 2],
        /// High 2 bits of each quant.
        qh: [u8; QK_K / 4],
        /// Scales, 8 bits each.
        scales: [i8; QK_K / 16],
        /// Super-block scale.
        d: f16,
    }
);

block!(
    /// 8-bit K-quant, the activation type of the K-quant dot products.
    BlockQ8K, QK_K, 292, {
        /// Scale (f32, not f16).
        d: f32,
        /// Quants.
        qs: [i8; QK_K],
        /// Sum of each group of 16 quants.
        bsums: [i16; QK_K / 16],
    }
);

block!(
    /// 4-bit non-linear: value = d * KVALUES_IQ4NL[q].
    BlockIQ4NL, QK4_NL, 18, {
        /// Scale.
        d: f16,
        /// Nibbles, as in Q4_0.
        qs: [u8; QK4_NL / 2],
    }
);

block!(
    /// OCP MXFP4 (gpt-oss): value = KVALUES_MXFP4[q] * 2^(e - 128) (an E8M0 scale, halved
    /// because the levels are doubled).
    BlockMXFP4, QK_MXFP4, 17, {
        /// E8M0 exponent.
        e: u8,
        /// Nibbles, as in Q4_0.
        qs: [u8; QK_MXFP4 / 2],
    }
);

block!(
    /// 4-bit non-linear with 6-bit sub-block scales: 8 sub-blocks of 32.
    BlockIQ4XS, QK_K, 136, {
        /// Super-block scale.
        d: f16,
        /// High 2 bits of each sub-block scale.
        scales_h: u16,
        /// Low 4 bits of each sub-block scale.
        scales_l: [u8; QK_K / 64],
        /// Nibbles, 16 bytes per sub-block as in Q4_0.
        qs: [u8; QK_K / 2],
    }
);

block!(
    /// Ternary, 1.6875 bits per value: values are `(t - 1) * d` with trits `t` in {0, 1, 2},
    /// five to a byte (`qs`, as a base-3 fraction scaled to 256) and four to a byte (`qh`).
    BlockTQ1_0, QK_K, 54, {
        /// Trits 0..240: byte `j + m` of the first 32 holds elements `m + 32n` (n = 0..5) of
        /// the first 160, the next 16 bytes elements `160 + m + 16n` of the next 80.
        qs: [u8; (QK_K - 4 * QK_K / 64) / 5],
        /// Trits 240..256: byte `j` holds elements `240 + j + 4n` (n = 0..4).
        qh: [u8; QK_K / 64],
        /// Scale (the block's absolute maximum).
        d: f16,
    }
);

block!(
    /// Ternary, 2.0625 bits per value: value = ((q & 3) - 1) * d, four 2-bit values per byte.
    BlockTQ2_0, QK_K, 66, {
        /// 2-bit values: byte `j + m` (j = 0, 32) holds elements `4j + m + 32l` at bits `2l`.
        qs: [u8; QK_K / 4],
        /// Scale (the block's absolute maximum).
        d: f16,
    }
);

/// Elements per NVFP4 block, and per sub-block with its own scale.
pub const QK_NVFP4: usize = 64;
/// Elements per NVFP4 sub-block.
pub const QK_NVFP4_SUB: usize = 16;
/// Elements per Q1_0 block.
pub const QK1_0: usize = 128;
/// Elements per Q2_0 block.
pub const QK2_0: usize = 64;

block!(
    /// NVIDIA's NVFP4: four sub-blocks of 16 E2M1 values, each with an unsigned E4M3 scale:
    /// value = KVALUES_MXFP4[q] * ue4m3(d[s]) / 2.
    BlockNVFP4, QK_NVFP4, 36, {
        /// UE4M3 scales, one per sub-block of 16.
        d: [u8; QK_NVFP4 / QK_NVFP4_SUB],
        /// Nibbles: sub-block `s` in bytes `8s..8s + 8`, element `j` in the low nibble of byte
        /// `8s + j`, element `j + 8` in the high one.
        qs: [u8; QK_NVFP4 / 2],
    }
);

block!(
    /// 1-bit: value = d for a set bit, -d for a clear one.
    BlockQ1_0, QK1_0, 18, {
        /// Scale (the mean absolute value).
        d: f16,
        /// Sign bits: element `j` is bit `j % 8` of byte `j / 8`.
        qs: [u8; QK1_0 / 8],
    }
);

block!(
    /// 2-bit: value = (q - 1) * d with q in 0..=3 (levels -d, 0, d, 2d).
    BlockQ2_0, QK2_0, 18, {
        /// Scale (the absolute maximum).
        d: f16,
        /// 2-bit values: element `j` at bits `2 (j % 4)` of byte `j / 4`.
        qs: [u8; QK2_0 / 4],
    }
);

block!(
    /// 2.0625 bits per value: per 32 elements, four 8-bit indices into `iq2xxs_grid` and a
    /// 32-bit word of four 7-bit sign indices (`ksigns_iq2xs`) and a 4-bit scale.
    BlockIQ2XXS, QK_K, 66, {
        /// Super-block scale.
        d: f16,
        /// Four u16 per 32 elements: bytes 0..4 grid indices, bytes 4..8 signs and scale.
        qs: [u16; QK_K / 8],
    }
);

block!(
    /// 2.3125 bits per value: 9-bit grid indices (`iq2xs_grid`) with 7-bit sign indices, and
    /// two 4-bit scales per 32 elements.
    BlockIQ2XS, QK_K, 74, {
        /// Super-block scale.
        d: f16,
        /// One u16 per 8 elements: grid index (low 9 bits), sign index (high 7).
        qs: [u16; QK_K / 8],
        /// Two 4-bit scales per 32 elements.
        scales: [u8; QK_K / 32],
    }
);

block!(
    /// 2.5625 bits per value: 10-bit grid indices (`iq2s_grid`), explicit sign bytes, two 4-bit
    /// scales per 32 elements.
    BlockIQ2S, QK_K, 82, {
        /// Super-block scale.
        d: f16,
        /// Low 8 bits of the grid indices (32 bytes), then 32 sign bytes.
        qs: [u8; QK_K / 4],
        /// High 2 bits of the four grid indices of each 32 elements.
        qh: [u8; QK_K / 32],
        /// Two 4-bit scales per 32 elements.
        scales: [u8; QK_K / 32],
    }
);

block!(
    /// 3.0625 bits per value: 8-bit indices into `iq3xxs_grid` (4 values each) and, per 32
    /// elements, a word of four 7-bit sign indices and a 4-bit scale.
    BlockIQ3XXS, QK_K, 98, {
        /// Super-block scale.
        d: f16,
        /// 64 grid indices, then 8 little-endian u32 of signs and scales.
        qs: [u8; 3 * QK_K / 8],
    }
);

/// Scales per IQ3_S block (one byte, two 4-bit scales, per 64 elements).
pub const IQ3S_N_SCALE: usize = QK_K / 64;

block!(
    /// 3.4375 bits per value: 9-bit indices into `iq3s_grid`, explicit signs, 4-bit scales per
    /// 32 elements.
    BlockIQ3S, QK_K, 110, {
        /// Super-block scale.
        d: f16,
        /// Low 8 bits of the grid indices.
        qs: [u8; QK_K / 4],
        /// The 9th bits of the grid indices, one byte per 32 elements.
        qh: [u8; QK_K / 32],
        /// Sign bits, one per element.
        signs: [u8; QK_K / 8],
        /// Two 4-bit scales per byte.
        scales: [u8; IQ3S_N_SCALE],
    }
);

block!(
    /// 1.5625 bits per value: 11-bit indices into `iq1s_grid` (values -1, 0, 1) plus a shift
    /// of ±1/8, and a 3-bit scale per 32 elements.
    BlockIQ1S, QK_K, 50, {
        /// Super-block scale.
        d: f16,
        /// Low 8 bits of the grid indices.
        qs: [u8; QK_K / 8],
        /// Per 32 elements: high 3 bits of the four indices (bits 0..12), the scale (12..15)
        /// and the shift's sign (bit 15).
        qh: [u16; QK_K / 32],
    }
);

block!(
    /// 1.75 bits per value: as IQ1_S with a shift sign per 8 elements and two 3-bit scales per
    /// 32; the f16 super-block scale is spread over the top nibbles of `scales`.
    BlockIQ1M, QK_K, 56, {
        /// Low 8 bits of the grid indices.
        qs: [u8; QK_K / 8],
        /// Per 8 elements, a nibble: high 3 bits of the index and the shift's sign.
        qh: [u8; QK_K / 16],
        /// Four little-endian u16: 3-bit scales (12 bits each) and the f16 scale's nibbles.
        scales: [u8; QK_K / 32],
    }
);
