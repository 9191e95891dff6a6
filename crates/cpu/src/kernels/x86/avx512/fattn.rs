//! AVX-512 versions of flash attention's tile product (`kernels/fattn.rs`), with the AVX2 bits.

use std::arch::x86_64::*;

/// [`crate::kernels::fattn::avx2::gemm_acc`] with 16-lane registers: rows in pairs, columns in blocks of
/// 64; the same FMA chain per output.
#[target_feature(enable = "avx2,fma,avx512f")]
pub unsafe fn gemm_acc(c: &mut [f32], a: &[f32], b: &[f32], m: usize, k: usize, n: usize) {
    let n64 = n / 64 * 64;
    // SAFETY: every load and store is inside `c` (m×n), `a` (m×k) and `b` (k×n): rows
    // `i, i + 1 < m`, columns `j..j + 64 <= n64 <= n`, `kk < k`.
    unsafe {
        let (cp, ap, bp) = (c.as_mut_ptr(), a.as_ptr(), b.as_ptr());
        let mut i = 0;
        while i < m {
            let two = i + 1 < m;
            let i1 = i + usize::from(two);
            for j in (0..n64).step_by(64) {
                let (c0, c1) = (cp.add(i * n + j), cp.add(i1 * n + j));
                let mut x0 = [_mm512_setzero_ps(); 4];
                let mut x1 = [_mm512_setzero_ps(); 4];
                for r in 0..4 {
                    x0[r] = _mm512_loadu_ps(c0.add(16 * r));
                    x1[r] = _mm512_loadu_ps(c1.add(16 * r));
                }
                let (a0p, a1p) = (ap.add(i * k), ap.add(i1 * k));
                for kk in 0..k {
                    let a0 = _mm512_set1_ps(*a0p.add(kk));
                    let a1 = _mm512_set1_ps(*a1p.add(kk));
                    let brow = bp.add(kk * n + j);
                    for r in 0..4 {
                        let bv = _mm512_loadu_ps(brow.add(16 * r));
                        x0[r] = _mm512_fmadd_ps(a0, bv, x0[r]);
                        x1[r] = _mm512_fmadd_ps(a1, bv, x1[r]);
                    }
                }
                for r in 0..4 {
                    _mm512_storeu_ps(c0.add(16 * r), x0[r]);
                    if two {
                        _mm512_storeu_ps(c1.add(16 * r), x1[r]);
                    }
                }
            }
            i += 2;
        }
    }
    if n64 < n {
        // The remaining columns (fewer than 64) through the AVX2 kernel, column by column
        // block: each output's chain is the same whoever computes it.
        for i in 0..m {
            for kk in 0..k {
                let av = a[i * k + kk];
                for j in n64..n {
                    c[i * n + j] = av.mul_add(b[kk * n + j], c[i * n + j]);
                }
            }
        }
    }
}
