//! Half-precision conversions rounding exactly as ggml does (`ggml-impl.h`).

use half::{bf16, f16};

/// f32 → f16, round-to-nearest-even; NaN becomes the quiet NaN 0x7E00 (sign kept), as in ggml's
/// portable `ggml_compute_fp32_to_fp16`.
#[inline]
pub fn f32_to_f16(f: f32) -> f16 {
    // Scaling by 2^112 then 2^-110 rounds the mantissa in the FPU; the bias trick adds the
    // implicit exponent so the f32 addition does the rounding to 10 mantissa bits.
    let scale_to_inf = f32::from_bits(0x7780_0000); // 0x1.0p+112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 0x1.0p-110
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;

    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let mut bias = shl1_w & 0xFF00_0000;
    if bias < 0x7100_0000 {
        bias = 0x7100_0000;
    }
    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x0000_7C00;
    let mantissa_bits = bits & 0x0000_0FFF;
    let nonsign = exp_bits + mantissa_bits;
    let h = (sign >> 16)
        | if shl1_w > 0xFF00_0000 {
            0x7E00
        } else {
            nonsign
        };
    f16::from_bits(h as u16)
}

/// f16 → f32 (exact).
#[inline]
pub fn f16_to_f32(h: f16) -> f32 {
    h.to_f32()
}

/// f32 → bf16, round-to-nearest-even; NaN stays NaN with the quiet bit forced, as in ggml's
/// `ggml_compute_fp32_to_bf16`.
#[inline]
pub fn f32_to_bf16(f: f32) -> bf16 {
    let u = f.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return bf16::from_bits(((u >> 16) | 64) as u16);
    }
    bf16::from_bits((u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16)
}

/// bf16 → f32 (exact).
#[inline]
pub fn bf16_to_f32(h: bf16) -> f32 {
    f32::from_bits((h.to_bits() as u32) << 16)
}

/// Converts `src` to f16 element by element; the shorter of the two slices sets the length.
pub fn f32_to_f16_row(src: &[f32], dst: &mut [f16]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32_to_f16(s);
    }
}

/// Converts `src` to f32 element by element; the shorter of the two slices sets the length.
pub fn f16_to_f32_row(src: &[f16], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f16_to_f32(s);
    }
}

/// Converts `src` to bf16 element by element; the shorter of the two slices sets the length.
pub fn f32_to_bf16_row(src: &[f32], dst: &mut [bf16]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32_to_bf16(s);
    }
}

/// Converts `src` to f32 element by element; the shorter of the two slices sets the length.
pub fn bf16_to_f32_row(src: &[bf16], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = bf16_to_f32(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rounding_matches_half_for_non_nan() {
        // Every f16 value, its neighbours' midpoints and a spread of f32s round the same way as
        // `half` (which also rounds to nearest even); only NaN payloads differ by design.
        let mut x = 1.0e-9f32;
        while x < 1.0e6 {
            for v in [x, -x, x * 1.000_001, x * 0.999_999] {
                assert_eq!(f32_to_f16(v), f16::from_f32(v), "{v:e}");
            }
            x *= 1.0123;
        }
        for bits in 0..=u16::MAX {
            let h = f16::from_bits(bits);
            if h.is_nan() {
                continue;
            }
            let f = h.to_f32();
            assert_eq!(f32_to_f16(f).to_bits(), bits);
            let next = f16::from_bits(bits.wrapping_add(1));
            if !next.is_nan() && next.is_finite() && h.is_finite() && bits & 0x7fff != 0x7fff {
                let mid = (f as f64 + next.to_f32() as f64) / 2.0;
                let mid = mid as f32;
                assert_eq!(f32_to_f16(mid), f16::from_f32(mid), "{mid:e}");
            }
        }
        assert_eq!(f32_to_f16(f32::INFINITY), f16::INFINITY);
        assert_eq!(f32_to_f16(1.0e9), f16::INFINITY);
        assert_eq!(f32_to_f16(f32::NAN).to_bits() & 0x7fff, 0x7E00);
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_nan_quiet() {
        assert_eq!(f32_to_bf16(1.0).to_bits(), 0x3f80);
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)).to_bits(), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)).to_bits(), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)).to_bits(), 0x3f81);
        // Signalling NaN whose payload lives only in the low half stays a NaN.
        let snan = f32::from_bits(0x7f80_0001);
        assert!(bf16_to_f32(f32_to_bf16(snan)).is_nan());
        assert_eq!(f32_to_bf16(snan).to_bits(), 0x7fc0);
        assert_eq!(bf16_to_f32(bf16::from_bits(0xc040)), -3.0);
    }
}
