//! MXFP4 (the OCP microscaling 4-bit float, gpt-oss's expert weights): ggml's
//! `quantize_row_mxfp4_ref`, `dequantize_row_mxfp4` and `ggml_e8m0_to_fp32_half`.

use super::blocks::{BlockMXFP4, KVALUES_MXFP4, QK_MXFP4};

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
