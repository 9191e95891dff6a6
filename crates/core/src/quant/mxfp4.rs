//! The 4-bit floats: MXFP4 (the OCP microscaling format, gpt-oss's expert weights) and NVFP4
//! (NVIDIA's, with E4M3 scales per 16 values): ggml's `quantize_row_{mxfp4,nvfp4}_ref`, the
//! dequantizers, `ggml_e8m0_to_fp32_half` and the UE4M3 conversions of `ggml-impl.h`.

use super::blocks::{BlockMXFP4, BlockNVFP4, KVALUES_MXFP4, QK_MXFP4, QK_NVFP4_SUB};

/// `ggml_e8m0_to_fp32_half`: `2^(e - 128)` (half the E8M0 value), the subnormals `2^-128` and
/// `2^-127` for `e` 0 and 1.
#[inline]
pub fn e8m0_to_fp32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// `best_index_mxfp4`: the first level nearest to `x` at scale `e`.
fn best_index(x: f32, e: f32) -> u8 {
    let mut best = 0;
    let mut best_err = (f32::from(KVALUES_MXFP4[0]) * e - x).abs();
    for i in 1..16 {
        let err = (f32::from(KVALUES_MXFP4[i]) * e - x).abs();
        if err < best_err {
            best = i;
            best_err = err;
        }
    }
    best as u8
}

/// `quantize_row_mxfp4_ref`.
pub fn quantize_row_mxfp4(x: &[f32], y: &mut [BlockMXFP4]) {
    for (xb, yb) in x.chunks_exact(QK_MXFP4).zip(y.iter_mut()) {
        let mut amax = 0f32;
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
            }
        }
        // `(uint8_t)(floorf(log2f(amax)) - 2 + 127)`: x86 converts through i32, then truncates.
        let e = if amax > 0.0 {
            ((amax.log2().floor() - 2.0 + 127.0) as i32) as u8
        } else {
            0
        };
        let d = e8m0_to_fp32_half(e);
        yb.e = e;
        for j in 0..QK_MXFP4 / 2 {
            let x0 = best_index(xb[j], d);
            let x1 = best_index(xb[QK_MXFP4 / 2 + j], d);
            yb.qs[j] = x0 | (x1 << 4);
        }
    }
}

/// `2^e` for `e` in the normal f32 range (exact).
#[inline]
fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// `ggml_ue4m3_to_fp32`: an unsigned E4M3 byte (bias 7; the top bit ignored) as f32, halved for
/// the doubled E2M1 levels; 0 and 0x7F (NaN in E4M3) give 0.
#[inline]
pub fn ue4m3_to_fp32(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let exp = i32::from((x >> 3) & 0xF);
    let man = f32::from(x & 0x7);
    let raw = if exp == 0 {
        man * pow2(-9)
    } else {
        (1.0 + man / 8.0) * pow2(exp - 7)
    };
    raw * 0.5
}

/// `ggml_fp32_to_ue4m3`: round to nearest (ties up) by the first dropped mantissa bit,
/// saturating at 448 (0x7E); zero, negative and NaN inputs give 0.
#[inline]
pub fn fp32_to_ue4m3(x: f32) -> u8 {
    // `!(x > 0)` also catches NaN.
    if x.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return 0;
    }
    let x = if x > 448.0 { 448.0 } else { x };
    let bits = x.to_bits();
    let fp32_exp = ((bits >> 23) & 0xFF) as i32 - 127;
    let fp32_man = ((bits >> 20) & 0x7) as i32;
    let mut exp = fp32_exp + 7;
    if exp <= 0 {
        // Subnormal: man * 2^-9 with man = (int)(x * 512 + 0.5), at most 7.
        let man = ((x * 512.0 + 0.5) as i32).min(7);
        return if man < 1 { 0 } else { man as u8 };
    }
    if exp >= 15 {
        return 0x7E;
    }
    let mut man = fp32_man + ((bits >> 19) & 1) as i32;
    if man > 7 {
        man = 0;
        exp += 1;
        if exp >= 15 {
            return 0x7E;
        }
    }
    ((exp << 3) | man) as u8
}

/// `quantize_row_nvfp4_ref`.
pub fn quantize_row_nvfp4(x: &[f32], y: &mut [BlockNVFP4]) {
    for (xb, yb) in x.chunks_exact(4 * QK_NVFP4_SUB).zip(y.iter_mut()) {
        for (s, xs) in xb.chunks_exact(QK_NVFP4_SUB).enumerate() {
            let mut amax = 0f32;
            for &v in xs {
                if amax < v.abs() {
                    amax = v.abs();
                }
            }
            let ue = fp32_to_ue4m3(amax / 6.0);
            yb.d[s] = ue;
            let d = ue4m3_to_fp32(ue);
            for j in 0..QK_NVFP4_SUB / 2 {
                let x0 = best_index(xs[j], d);
                let x1 = best_index(xs[QK_NVFP4_SUB / 2 + j], d);
                yb.qs[s * (QK_NVFP4_SUB / 2) + j] = x0 | (x1 << 4);
            }
        }
    }
}

/// `dequantize_row_nvfp4`.
pub fn dequantize_row_nvfp4(x: &[BlockNVFP4], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(4 * QK_NVFP4_SUB)) {
        for (s, ys) in yb.chunks_exact_mut(QK_NVFP4_SUB).enumerate() {
            let d = ue4m3_to_fp32(xb.d[s]);
            for j in 0..QK_NVFP4_SUB / 2 {
                let q = xb.qs[s * (QK_NVFP4_SUB / 2) + j];
                ys[j] = f32::from(KVALUES_MXFP4[(q & 0x0F) as usize]) * d;
                ys[j + QK_NVFP4_SUB / 2] = f32::from(KVALUES_MXFP4[(q >> 4) as usize]) * d;
            }
        }
    }
}

/// `dequantize_row_mxfp4`.
pub fn dequantize_row_mxfp4(x: &[BlockMXFP4], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_MXFP4)) {
        let d = e8m0_to_fp32_half(xb.e);
        for j in 0..QK_MXFP4 / 2 {
            yb[j] = f32::from(KVALUES_MXFP4[(xb.qs[j] & 0xf) as usize]) * d;
            yb[j + QK_MXFP4 / 2] = f32::from(KVALUES_MXFP4[(xb.qs[j] >> 4) as usize]) * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_halves() {
        assert_eq!(e8m0_to_fp32_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_to_fp32_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_to_fp32_half(127), 0.5);
        assert_eq!(e8m0_to_fp32_half(128), 1.0);
        assert_eq!(e8m0_to_fp32_half(254), 2f32.powi(126));
    }

    #[test]
    fn ue4m3_round_trips() {
        // Exponent 15 is reached only by saturating to 0x7E.
        for b in (1u8..0x78).chain([0x7E]) {
            let v = ue4m3_to_fp32(b);
            assert_eq!(fp32_to_ue4m3(2.0 * v), b, "{b:#x}");
        }
        assert_eq!(ue4m3_to_fp32(0x7E), 224.0);
        assert_eq!(fp32_to_ue4m3(1e9), 0x7E);
        assert_eq!(fp32_to_ue4m3(f32::NAN), 0);
        assert_eq!(fp32_to_ue4m3(-1.0), 0);
    }

    #[test]
    fn round_trip_is_on_the_grid() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) * 0.37).collect();
        let mut q = vec![BlockMXFP4 { e: 0, qs: [0; 16] }; 2];
        quantize_row_mxfp4(&x, &mut q);
        let mut back = vec![0f32; 64];
        dequantize_row_mxfp4(&q, &mut back);
        for (b, v) in back.chunks(32).zip(x.chunks(32)) {
            let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
            for (o, i) in b.iter().zip(v) {
                // levels are at most a factor 1.5 apart above the scale
                assert!((o - i).abs() <= amax / 4.0, "{o} vs {i}");
            }
        }
        // zeros give e = 0 and zero values
        let mut z = vec![BlockMXFP4 { e: 9, qs: [7; 16] }];
        quantize_row_mxfp4(&[0.0; 32], &mut z);
        assert_eq!(z[0].e, 0);
        assert!(z[0].qs.iter().all(|&q| q == 0));
    }
}
