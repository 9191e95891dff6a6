//! AVX2 versions of the element-wise kernels of `kernels/act.rs` (softmax, SiLU, GELU, RMS
//! norm, RoPE), with the scalar code's bits.

use std::arch::x86_64::*;

/// [`crate::kernels::act::geglu_row`] 8 values at a time: the same f16 rounding (`vcvtps2ph`, to
/// nearest even), the same table entries and products, the same ±10 cut-offs (NaN takes
/// the table, as in the scalar comparisons). Returns how many values it did (a multiple
/// of 8); the caller does the rest.
///
/// # Safety
/// AVX2/FMA/F16C present; `x`, `g` and `y` hold `n` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn geglu(n: usize, x: &[f32], g: &[f32], y: &mut [f32], t: &[u16]) -> usize {
    let n8 = n / 8 * 8;
    // SAFETY: indices below `n8 <= n`; table indices are u16 and the table has 65536
    // entries.
    unsafe {
        assert!(t.len() == 1 << 16);
        let lo = _mm256_set1_ps(-10.0);
        let hi = _mm256_set1_ps(10.0);
        for i in (0..n8).step_by(8) {
            let v = _mm256_loadu_ps(x.as_ptr().add(i));
            let gv = _mm256_loadu_ps(g.as_ptr().add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            let mut idx = [0u16; 8];
            _mm_storeu_si128(idx.as_mut_ptr() as *mut __m128i, h);
            let mut looked = [0u16; 8];
            for l in 0..8 {
                looked[l] = *t.get_unchecked(usize::from(idx[l]));
            }
            let gl = _mm256_cvtph_ps(_mm_loadu_si128(looked.as_ptr() as *const __m128i));
            let mid = _mm256_mul_ps(gl, gv);
            let big = _mm256_mul_ps(v, gv);
            let r = _mm256_blendv_ps(mid, big, _mm256_cmp_ps::<_CMP_GE_OQ>(v, hi));
            let r = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(v, lo), r);
            _mm256_storeu_ps(y.as_mut_ptr().add(i), r);
        }
    }
    n8
}

/// The AVX2 `ggml_v_expf`.
#[inline(always)]
unsafe fn v_expf(x: __m256) -> __m256 {
    // SAFETY: register-only intrinsics; AVX2/FMA enabled by the caller.
    unsafe {
        let r = _mm256_set1_ps(f32::from_bits(0x4b40_0000));
        let z = _mm256_fmadd_ps(x, _mm256_set1_ps(f32::from_bits(0x3fb8_aa3b)), r);
        let n = _mm256_sub_ps(z, r);
        let b = _mm256_fnmadd_ps(
            n,
            _mm256_set1_ps(f32::from_bits(0x35bf_be8e)),
            _mm256_fnmadd_ps(n, _mm256_set1_ps(f32::from_bits(0x3f31_7200)), x),
        );
        let e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
        let k = _mm256_castsi256_ps(_mm256_add_epi32(
            e,
            _mm256_castps_si256(_mm256_set1_ps(1.0)),
        ));
        let c = _mm256_castps_si256(_mm256_cmp_ps(
            _mm256_andnot_ps(_mm256_set1_ps(-0.0), n),
            _mm256_set1_ps(126.0),
            _CMP_GT_OQ,
        ));
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(
                    _mm256_set1_ps(f32::from_bits(0x3c07_2010)),
                    b,
                    _mm256_set1_ps(f32::from_bits(0x3d2b_9f17)),
                ),
                u,
                _mm256_fmadd_ps(
                    _mm256_set1_ps(f32::from_bits(0x3e2a_af33)),
                    b,
                    _mm256_set1_ps(f32::from_bits(0x3eff_fedb)),
                ),
            ),
            u,
            _mm256_mul_ps(_mm256_set1_ps(f32::from_bits(0x3f7f_fff6)), b),
        );
        if _mm256_movemask_ps(_mm256_castsi256_ps(c)) == 0 {
            return _mm256_fmadd_ps(j, k, k);
        }
        let g = _mm256_and_si256(
            _mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
            _mm256_set1_epi32(0x8200_0000u32 as i32),
        );
        let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
        let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
        let d = _mm256_castps_si256(_mm256_cmp_ps(
            _mm256_andnot_ps(_mm256_set1_ps(-0.0), n),
            _mm256_set1_ps(192.0),
            _CMP_GT_OQ,
        ));
        _mm256_or_ps(
            _mm256_and_ps(_mm256_castsi256_ps(d), _mm256_mul_ps(s1, s1)),
            _mm256_andnot_ps(
                _mm256_castsi256_ps(d),
                _mm256_or_ps(
                    _mm256_and_ps(
                        _mm256_castsi256_ps(c),
                        _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1),
                    ),
                    _mm256_andnot_ps(_mm256_castsi256_ps(c), _mm256_fmadd_ps(k, j, k)),
                ),
            ),
        )
    }
}

/// `ggml_v_silu` over `nv` (a multiple of 8) values, times `g` when given.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn silu(nv: usize, x: &[f32], y: &mut [f32], g: Option<&[f32]>) {
    // SAFETY: the slices hold at least `nv` values (checked by the caller).
    unsafe {
        for i in (0..nv).step_by(8) {
            let xv = _mm256_loadu_ps(x.as_ptr().add(i));
            let e = v_expf(_mm256_sub_ps(_mm256_setzero_ps(), xv));
            let mut s = _mm256_div_ps(xv, _mm256_add_ps(_mm256_set1_ps(1.0), e));
            if let Some(g) = g {
                s = _mm256_mul_ps(s, _mm256_loadu_ps(g.as_ptr().add(i)));
            }
            _mm256_storeu_ps(y.as_mut_ptr().add(i), s);
        }
    }
}

/// The AVX2 loop of `ggml_vec_soft_max_f32` over the first `nv` (a multiple of 8) values,
/// in place.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn soft_max(nv: usize, y: &mut [f32], max: f32) -> f64 {
    // SAFETY: the slice holds at least `nv` values.
    unsafe {
        let mut sum = 0f64;
        let yp = y.as_mut_ptr();
        for i in (0..nv).step_by(8) {
            let val = v_expf(_mm256_sub_ps(
                _mm256_loadu_ps(yp.add(i)),
                _mm256_set1_ps(max),
            ));
            _mm256_storeu_ps(yp.add(i), val);
            let mut v2 = _mm_add_ps(_mm256_extractf128_ps(val, 1), _mm256_castps256_ps128(val));
            v2 = _mm_add_ps(v2, _mm_movehl_ps(v2, v2));
            v2 = _mm_add_ss(v2, _mm_movehdup_ps(v2));
            sum += f64::from(_mm_cvtss_f32(v2));
        }
        sum
    }
}
