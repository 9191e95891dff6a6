//! AVX-512 (F/BW/VL + VNNI) tiles of 4 weight rows × up to 4 activation rows for the Q0
//! types (Q4_0, Q5_0, Q8_0, IQ4_NL under tinyBLAS) and Q4_1/Q5_1, and the repacked Q0 chains,
//! bit-identical to the AVX2 tiles. Since the AVX2 offset tiles took `vpdpbusd` (`lane_dot`),
//! these 4×4 tiles run only what those do not take: IQ4_NL, and calls past their tables (more
//! than 64 blocks a row with more than 16 activation rows). Only the exact integer part
//! changes: each weight block is decoded to *unsigned*
//! bytes `u = x + o` (a constant offset `o` per type), `vpdpbusd` forms the four-byte lane sums
//! `Σ u·y` in one instruction, and the lane's `o·Σ y` (computed once per activation block and
//! shared by the four weight rows) is taken off first. The lane sums are the same integers as
//! AVX2's `madd(1, maddubs(|x|, sign(y, x)))`, so converting them and the FMA chain that
//! follows (same scales, same order) give the same bits. The 32 vector registers hold a 4×4
//! tile's 16 accumulators without spilling, and the 16 scale products `dx·dy` are formed as
//! one 16-lane multiply and read back as embedded broadcasts. Also tinyBLAS f16/f32 tiles:
//! two outputs' 8-lane chains per 16-lane register ([`ftiny_tiles`]), or, on cores that
//! split 512-bit operations in two ([`crate::kernels::splits_512`]: Zen 4), 8-lane
//! registers in 4 × 6 tiles that the 32 registers hold ([`ftiny_ymm_tiles`]).

use crate::kernels::x86::avx2::tile::{
    KVALUES_IQ4NL, MAX_A, MAX_BLOCKS, MAX_W, e8m0_half, ld_f16, q0_bytes, q0_values, scales4,
};
use crate::kernels::x86::{bytes_from_nibbles_32, hsum_float_8};
use std::arch::x86_64::*;

/// `match $kind` with an arm per Q0/Q1 kind calling `$f::<T, Q1>$args` (Q0 type `T` with
/// `Q1 == false`; Q4_1 `T == 0` or Q5_1 `T == 1` with `Q1`), then the arms given.
macro_rules! q_kinds {
    ($kind:expr, $f:ident, $args:tt; $($arms:tt)*) => {
        match $kind {
            crate::kernels::tile::TileKind::Q0(0) => unsafe { $f::<0, false> $args },
            crate::kernels::tile::TileKind::Q0(1) => unsafe { $f::<1, false> $args },
            crate::kernels::tile::TileKind::Q0(2) => unsafe { $f::<2, false> $args },
            crate::kernels::tile::TileKind::Q0(_) => unsafe { $f::<3, false> $args },
            crate::kernels::tile::TileKind::Q1(false) => unsafe { $f::<0, true> $args },
            crate::kernels::tile::TileKind::Q1(true) => unsafe { $f::<1, true> $args },
            $($arms)*
        }
    };
}

/// Whether [`run`] has a kernel for this product.
pub(crate) fn covers(
    kind: crate::kernels::tile::TileKind,
    nb: usize,
    nw: usize,
    na: usize,
) -> bool {
    if let crate::kernels::tile::TileKind::Q0Chain(_) = kind {
        // One activation row is the AVX2 kernel's (same bits): there the transposed VNNI
        // lanes lose to it (SmolLM2 MXFP4 tg128, one thread on a Xeon: 58.8 against 67.9 t/s).
        return nw.is_multiple_of(8) && na > 1;
    }
    if matches!(
        kind,
        crate::kernels::tile::TileKind::Q0(_) | crate::kernels::tile::TileKind::Q1(_)
    ) && (nb > MAX_BLOCKS || nw > MAX_W || na > MAX_A)
    {
        return false;
    }
    if matches!(
        kind,
        crate::kernels::tile::TileKind::F16Tiny | crate::kernels::tile::TileKind::F32Tiny
    ) {
        return na > 1;
    }
    matches!(
        kind,
        crate::kernels::tile::TileKind::Q0(_) | crate::kernels::tile::TileKind::Q1(_)
    ) && na > 1
        && nw.is_multiple_of(4)
}

/// Runs the 4×4 tiles over the whole product.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C present; every row holds `nb` blocks of `kind`;
/// [`covers`] is true. (The kernels use plain loops, no closures: a closure would not
/// inherit the target features.)
pub(crate) unsafe fn run(
    kind: crate::kernels::tile::TileKind,
    nb: usize,
    w: &[&[u8]],
    a: &[&[u8]],
    out: &mut [f32],
) {
    // SAFETY (all arms): by this function's contract.
    q_kinds!(kind, scaled, (nb, w, a, out);
        crate::kernels::tile::TileKind::Q0Chain(0) => unsafe { q0_chain8::<0>(nb, w, a, out) },
        crate::kernels::tile::TileKind::Q0Chain(4) => unsafe { q0_chain8::<4>(nb, w, a, out) },
        crate::kernels::tile::TileKind::Q0Chain(_) => unsafe { q0_chain8::<3>(nb, w, a, out) },
        crate::kernels::tile::TileKind::F16Tiny if crate::kernels::splits_512() => unsafe {
            ftiny_ymm_tiles::<0>(nb, w, a, out)
        },
        crate::kernels::tile::TileKind::F32Tiny if crate::kernels::splits_512() => unsafe {
            ftiny_ymm_tiles::<1>(nb, w, a, out)
        },
        crate::kernels::tile::TileKind::F16Tiny => unsafe { ftiny_tiles::<0>(nb, w, a, out) },
        crate::kernels::tile::TileKind::F32Tiny => unsafe { ftiny_tiles::<1>(nb, w, a, out) },
        _ => unreachable!("avx512::run called without a kernel"),
    )
}

/// The Q0 (`Q1 == false`) or Q1 tiles over the whole product. Each row group's block scales
/// are converted once per call (f16 to f32, as `[d0 d1 d2 d3]` or `[d0 m0 … d3 m3]` per block)
/// and shared by every tile of the group, instead of once per tile.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn scaled<const T: u8, const Q1: bool>(
    nb: usize,
    w: &[&[u8]],
    a: &[&[u8]],
    out: &mut [f32],
) {
    let (bx, by) = if Q1 {
        (if T == 0 { 20 } else { 24 }, 36)
    } else {
        (q0_bytes(T), 34)
    };
    let na = a.len();
    // One table per group of 4 rows, uninitialised until written (only `nb` entries of a
    // group are written and read).
    let mut tw: [std::mem::MaybeUninit<[__m256; MAX_BLOCKS]>; MAX_W / 4] =
        [const { std::mem::MaybeUninit::uninit() }; MAX_W / 4];
    let mut ta: [std::mem::MaybeUninit<[__m256; MAX_BLOCKS]>; MAX_A / 4] =
        [const { std::mem::MaybeUninit::uninit() }; MAX_A / 4];
    // SAFETY: rows hold `nb <= MAX_BLOCKS` blocks and there are at most `MAX_W`/`MAX_A` rows
    // (`covers`); entries 0..nb of a table are written before they are read.
    unsafe {
        let ngw = w.len() / 4;
        let nga = na.div_ceil(4);
        for g in 0..ngw {
            scale_table::<Q1>(
                nb,
                crate::kernels::tile::row_ptrs(w, 4 * g),
                bx,
                tw[g].as_mut_ptr().cast::<__m256>(),
            );
        }
        for g in 0..nga {
            scale_table::<Q1>(
                nb,
                crate::kernels::tile::row_ptrs(a, 4 * g),
                by,
                ta[g].as_mut_ptr().cast::<__m256>(),
            );
        }
        // Q0: the group's weight blocks as unsigned bytes, two blocks per vector (the last of
        // an odd count alone in the low half), decoded once for all the call's activation rows.
        let mut dec: std::mem::MaybeUninit<[[__m512i; MAX_BLOCKS / 2]; 4]> =
            std::mem::MaybeUninit::uninit();
        let dec = dec.as_mut_ptr().cast::<__m512i>();
        let mut up = [std::ptr::null::<__m512i>(); 4];
        for (i, p) in up.iter_mut().enumerate() {
            *p = dec.add(i * (MAX_BLOCKS / 2)).cast_const();
        }
        for g in 0..ngw {
            let wp: [*const u8; 4] = crate::kernels::tile::row_ptrs(w, 4 * g);
            if !Q1 {
                for (i, row) in wp.iter().enumerate() {
                    let d = dec.add(i * (MAX_BLOCKS / 2));
                    for e in 0..nb / 2 {
                        let x = row.add(2 * e * bx);
                        d.add(e).write(q0_unsigned2::<T>(x, x.add(bx)));
                    }
                    if nb % 2 == 1 {
                        let x = q0_unsigned::<T>(row.add((nb - 1) * bx));
                        d.add(nb / 2).write(_mm512_castsi256_si512(x));
                    }
                }
            }
            let sw = std::slice::from_raw_parts(tw[g].as_ptr().cast::<__m256>(), nb);
            for h in 0..nga {
                let ap: [*const u8; 4] = crate::kernels::tile::row_ptrs(a, 4 * h);
                let sa = std::slice::from_raw_parts(ta[h].as_ptr().cast::<__m256>(), nb);
                let rn = (na - 4 * h).min(4);
                macro_rules! k {
                    ($n:literal, $p:expr) => {
                        if Q1 {
                            spread(q1::<T, $n>(nb, wp, $p, sw, sa))
                        } else {
                            spread(q0::<T, $n>(nb, up, $p, sw, sa))
                        }
                    };
                }
                let r = match rn {
                    1 => k!(1, [ap[0]]),
                    2 => k!(2, [ap[0], ap[1]]),
                    3 => k!(3, [ap[0], ap[1], ap[2]]),
                    _ => k!(4, ap),
                };
                for i in 0..4 {
                    for j in 0..rn {
                        out[(4 * h + j) * w.len() + 4 * g + i] = r[i][j];
                    }
                }
            }
        }
    }
}

/// Writes `t[b]` for the `nb` blocks of 4 rows (`stride` bytes per block): the rows' f16
/// scales `[d0 d1 d2 d3]` (Q0), or their `[d0 m0 … d3 m3]` pairs (Q1), as f32.
///
/// # Safety
/// Each row holds `nb` blocks; `t` has room for `nb` entries; F16C enabled by the caller.
#[inline(always)]
unsafe fn scale_table<const Q1: bool>(
    nb: usize,
    rows: [*const u8; 4],
    stride: usize,
    t: *mut __m256,
) {
    // SAFETY: by the caller's contract.
    unsafe {
        for b in 0..nb {
            let v = if Q1 {
                pairs4(rows, b * stride)
            } else {
                _mm256_castps128_ps256(scales4(rows, b * stride))
            };
            t.add(b).write(v);
        }
    }
}

/// A `[[f32; RN]; 4]` result widened to 4 columns (the extra ones zero).
#[inline(always)]
fn spread<const RN: usize>(r: [[f32; RN]; 4]) -> [[f32; 4]; 4] {
    let mut out = [[0f32; 4]; 4];
    for i in 0..4 {
        out[i][..RN].copy_from_slice(&r[i]);
    }
    out
}

/// The two f16 values at `p[i] + off` (a block's `d` and `m`, or `d` and `s`) of 4 rows
/// (rows past `N` read as zero), as `[d0 m0 d1 m1 d2 m2 d3 m3]` f32: four 32-bit inserts
/// and one conversion.
#[inline(always)]
unsafe fn pairs4<const N: usize>(p: [*const u8; N], off: usize) -> __m256 {
    // SAFETY: 4 readable bytes at each `p[i] + off` (the caller's contract); F16C enabled by
    // the caller.
    unsafe {
        let mut v = [0i32; 4];
        for (i, pi) in p.iter().enumerate().take(4) {
            v[i] = pi.add(off).cast::<i32>().read_unaligned();
        }
        _mm256_cvtph_ps(_mm_set_epi32(v[3], v[2], v[1], v[0]))
    }
}

/// Blocks whose scale products a kernel computes ahead, in one pass, before it uses them:
/// read back by broadcast loads right after a 64-byte store, they would wait for the store
/// to leave the store queue (store-to-load forwarding does not serve them), which stalled
/// every block.
const CHUNK: usize = 32;

/// `dds[c]` = the 16 scale products ([`outer4`]) of the next `CHUNK` blocks (fewer at the end).
#[inline(always)]
unsafe fn fill_products(sw: &[__m256], sa: &[__m256], dds: &mut [[f32; 16]; CHUNK]) {
    // SAFETY: register-only intrinsics and local stores; AVX-512F enabled by the caller.
    unsafe {
        for c in 0..CHUNK.min(sw.len()) {
            outer4(
                _mm256_castps256_ps128(sw[c]),
                _mm256_castps256_ps128(sa[c]),
                &mut dds[c],
            );
        }
    }
}

/// `dd[4 * i + j] = dx[i] * dy[j]`: each one f32 product, as the AVX2 tiles round it.
#[inline(always)]
unsafe fn outer4(dx: __m128, dy: __m128, dd: &mut [f32; 16]) {
    // SAFETY: register-only intrinsics and a store to a local; AVX-512F enabled by the caller.
    unsafe {
        let rows = _mm512_permutexvar_ps(
            _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
            _mm512_castps128_ps512(dx),
        );
        let cols = _mm512_broadcast_f32x4(dy);
        _mm512_storeu_ps(dd.as_mut_ptr(), _mm512_mul_ps(rows, cols));
    }
}

/// `$acc = fma($q, broadcast(*$s), $acc)` (`$s: &f32`) with the broadcast done by the load
/// unit (an embedded `{1to8}` memory operand): the same single rounding as
/// `_mm256_fmadd_ps(q, _mm256_set1_ps(*s), acc)`. Left to itself, LLVM keeps the 16 scale
/// products in registers and spends one or two shuffles on every broadcast, about a fifth of
/// a 4×4 tile's work. A macro, so that the register classes see the caller's AVX-512.
macro_rules! fmadd_bcast {
    ($acc:expr, $q:expr, $s:expr) => {{
        let s: &f32 = $s;
        // Used inside the kernels' `unsafe` blocks. Sound: reads the 4 bytes of `*s` only;
        // AVX-512F/VL are enabled in the calling kernel.
        std::arch::asm!(
            "vfmadd231ps {acc:y}, {q:y}, dword ptr [{s}]{{1to8}}",
            acc = inout(zmm_reg) $acc,
            q = in(zmm_reg) $q,
            s = in(reg) s as *const f32,
            options(pure, readonly, nostack, preserves_flags),
        );
    }};
}

/// The 32 values of a Q4_0 (0), Q5_0 (1), Q8_0 (2) or IQ4_NL (3) block plus the type's
/// offset, as unsigned bytes.
#[inline(always)]
unsafe fn q0_unsigned<const T: u8>(xb: *const u8) -> __m256i {
    // SAFETY: `xb` points at a whole block; AVX-512 BW/VL enabled by the caller.
    unsafe {
        match T {
            // nibble - 8, offset 8.
            0 => bytes_from_nibbles_32(xb.add(2)),
            // (nibble | bit << 4) - 16, offset 16.
            1 => nibbles_bit5(xb.add(6), xb.add(2)),
            // signed byte, offset 128.
            2 => _mm256_xor_si256(
                _mm256_loadu_si256(xb.add(2) as *const __m256i),
                _mm256_set1_epi8(0x80u8 as i8),
            ),
            // table value, offset 128.
            _ => {
                let t = _mm_xor_si128(
                    _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i),
                    _mm_set1_epi8(0x80u8 as i8),
                );
                let table = _mm256_broadcastsi128_si256(t);
                _mm256_shuffle_epi8(table, bytes_from_nibbles_32(xb.add(2)))
            }
        }
    }
}

/// `ggml_vec_dot_<t>_q8_0` / tinyBLAS_Q0 per output, 4 weight rows × `RN` activation rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q0<const T: u8, const RN: usize>(
    nb: usize,
    w: [*const __m512i; 4],
    a: [*const u8; RN],
    sw: &[__m256],
    sa: &[__m256],
) -> [[f32; RN]; 4] {
    let offset = match T {
        0 => 8u8,
        1 => 16,
        _ => 128,
    };
    let mut acc = [[_mm256_setzero_ps(); RN]; 4];
    // SAFETY: rows hold `nb` blocks (the caller's contract).
    unsafe {
        let ov = _mm512_set1_epi8(offset as i8);
        let mut dds = [[0f32; 16]; CHUNK];
        // Two blocks per 512-bit vector: the integer work (lane sums, conversion) is done
        // once for both; the FMAs stay one per block, in block order.
        let mut ib = 0;
        while ib + 2 <= nb {
            if ib % CHUNK == 0 {
                fill_products(&sw[ib..nb], &sa[ib..nb], &mut dds);
            }
            let (dd0, dd1) = (&dds[ib % CHUNK], &dds[(ib + 1) % CHUNK]);
            let mut u = [_mm512_setzero_si512(); 4];
            for i in 0..4 {
                u[i] = _mm512_load_si512(w[i].add(ib / 2));
            }
            for j in 0..RN {
                let y = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256(
                        a[j].add(ib * 34 + 2) as *const __m256i
                    )),
                    _mm256_loadu_si256(a[j].add(ib * 34 + 36) as *const __m256i),
                    1,
                );
                // -o·Σy per lane, the start of every weight row's lane sums.
                let corr = _mm512_sub_epi32(
                    _mm512_setzero_si512(),
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), ov, y),
                );
                for i in 0..4 {
                    let q = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(corr, u[i], y));
                    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(q), 1));
                    fmadd_bcast!(acc[i][j], _mm512_castps512_ps256(q), &dd0[4 * i + j]);
                    fmadd_bcast!(acc[i][j], hi, &dd1[4 * i + j]);
                }
            }
            ib += 2;
        }
        if ib < nb {
            // The last block of an odd count.
            if ib % CHUNK == 0 {
                fill_products(&sw[ib..nb], &sa[ib..nb], &mut dds);
            }
            let dd = &dds[ib % CHUNK];
            let mut u = [_mm256_setzero_si256(); 4];
            for i in 0..4 {
                u[i] = _mm256_load_si256(w[i].add(ib / 2).cast::<__m256i>());
            }
            let ov = _mm256_set1_epi8(offset as i8);
            for j in 0..RN {
                let y = _mm256_loadu_si256(a[j].add(ib * 34 + 2) as *const __m256i);
                let corr = _mm256_sub_epi32(
                    _mm256_setzero_si256(),
                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), ov, y),
                );
                for i in 0..4 {
                    let q = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(corr, u[i], y));
                    fmadd_bcast!(acc[i][j], q, &dd[4 * i + j]);
                }
            }
        }
        let mut out = [[0f32; RN]; 4];
        for i in 0..4 {
            for j in 0..RN {
                out[i][j] = hsum_float_8(acc[i][j]);
            }
        }
        out
    }
}

/// [`q0_unsigned`] of two blocks, `xb0`'s in the low half. Q5_0 (the common case) is unpacked
/// for both blocks at once.
#[inline(always)]
unsafe fn q0_unsigned2<const T: u8>(xb0: *const u8, xb1: *const u8) -> __m512i {
    // SAFETY: both point at whole blocks; AVX-512 F/BW enabled by the caller.
    unsafe {
        if T == 1 {
            let qs = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128(xb0.add(6) as *const __m128i)),
                _mm_loadu_si128(xb1.add(6) as *const __m128i),
                1,
            );
            let m4 = _mm256_set1_epi8(0xF);
            let lo = _mm256_and_si256(qs, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4);
            // [lo0 lo1 hi0 hi1] (16 bytes each) to [lo0 hi0 lo1 hi1].
            let z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            let z = _mm512_shuffle_i64x2(z, z, 0b11_01_10_00);
            let qh = u64::from(xb0.add(2).cast::<u32>().read_unaligned())
                | u64::from(xb1.add(2).cast::<u32>().read_unaligned()) << 32;
            _mm512_mask_add_epi8(z, qh, z, _mm512_set1_epi8(16))
        } else {
            _mm512_inserti64x4(
                _mm512_castsi256_si512(q0_unsigned::<T>(xb0)),
                q0_unsigned::<T>(xb1),
                1,
            )
        }
    }
}

/// `ggml_vec_dot_q4_1_q8_1` (`T == 0`) / `ggml_vec_dot_q5_1_q8_1` (`T == 1`) per output, 4
/// weight rows × `RN` activation rows. The weight values are unsigned already; the `m·s`
/// sums are 16 lanes of one vector, each its own FMA chain as in the AVX2 tile.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q1<const T: u8, const RN: usize>(
    nb: usize,
    w: [*const u8; 4],
    a: [*const u8; RN],
    sw: &[__m256],
    sa: &[__m256],
) -> [[f32; RN]; 4] {
    let bx = if T == 0 { 20 } else { 24 };
    let mut acc = [[_mm256_setzero_ps(); RN]; 4];
    // SAFETY: rows hold `nb` blocks (the caller's contract).
    unsafe {
        let mut summs = _mm512_setzero_ps();
        // Lane 4i + j of a 16-lane vector takes row i's pair value (d: 2i, m: 2i + 1) or
        // column j's (d: 2j, s: 2j + 1).
        let d_of_row = _mm512_set_epi32(6, 6, 6, 6, 4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0);
        let m_of_row = _mm512_set_epi32(7, 7, 7, 7, 5, 5, 5, 5, 3, 3, 3, 3, 1, 1, 1, 1);
        let d_of_col = _mm512_set_epi32(6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0);
        let s_of_col = _mm512_set_epi32(7, 5, 3, 1, 7, 5, 3, 1, 7, 5, 3, 1, 7, 5, 3, 1);
        let mut dds = [[0f32; 16]; CHUNK];
        for ib in 0..nb {
            let off = ib * bx;
            if ib % CHUNK == 0 {
                for c in 0..CHUNK.min(nb - ib) {
                    let pw = _mm512_castps256_ps512(sw[ib + c]);
                    let pa = _mm512_castps256_ps512(sa[ib + c]);
                    // dd[4i + j] = d_i * d_j, one rounding each.
                    _mm512_storeu_ps(
                        dds[c].as_mut_ptr(),
                        _mm512_mul_ps(
                            _mm512_permutexvar_ps(d_of_row, pw),
                            _mm512_permutexvar_ps(d_of_col, pa),
                        ),
                    );
                    // summs[4i + j] = fma(m_i, s_j, summs[4i + j]), block after block.
                    summs = _mm512_fmadd_ps(
                        _mm512_permutexvar_ps(m_of_row, pw),
                        _mm512_permutexvar_ps(s_of_col, pa),
                        summs,
                    );
                }
            }
            let dd = &dds[ib % CHUNK];
            let mut u = [_mm256_setzero_si256(); 4];
            for i in 0..4 {
                let xb = w[i].add(off);
                u[i] = q1_unsigned::<T>(xb);
            }
            for j in 0..RN {
                let y = _mm256_loadu_si256(a[j].add(ib * 36 + 4) as *const __m256i);
                for i in 0..4 {
                    let q =
                        _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u[i], y));
                    fmadd_bcast!(acc[i][j], q, &dd[4 * i + j]);
                }
            }
        }
        let mut sm = [0f32; 16];
        _mm512_storeu_ps(sm.as_mut_ptr(), summs);
        let mut out = [[0f32; RN]; 4];
        for i in 0..4 {
            for j in 0..RN {
                out[i][j] = hsum_float_8(acc[i][j]) + sm[4 * i + j];
            }
        }
        out
    }
}

/// Blocks per row (k up to 1024) for which [`q0_rows16`] decodes every group of weight rows
/// once per call; its per-call tables live on the stack, sized for this many blocks per
/// weight-row group ([`ROWS16_W`] / 16 groups) and per activation row ([`ROWS16_A`] rows).
pub(crate) const ROWS16_BLOCKS: usize = 32;
/// Longest rows (k up to 2048) [`q0_rows16`] takes (`ffn_down`, k = 1536 for SmolLM2): each
/// group decoded into one table slot right before its products, again for every chunk of
/// activation rows (k = 1536, 128 rows, one Zen 4 core: 86 against the offset tiles' 60
/// GMAC/s).
pub(crate) const ROWS16_MAX_BLOCKS: usize = 64;
/// Weight rows per [`q0_rows16`] call (`ops::mul_mat`'s wide calls carry 64).
pub(crate) const ROWS16_W: usize = 64;
/// Activation rows below which [`q0_rows16`] is left to the offset tiles. With 2 to 4 rows (a
/// decode step of a few slots) the decode of each block of 16 rows — loads as 4-byte words
/// transposed in registers ([`decode16_nibbles`]) — is shared by few products, but the
/// products in lanes still win (Q5_0 k = 640, one Zen 4 core: 4 rows in cache 58 against 40
/// GMAC/s; weights from memory, prefetched ahead into L2, 4 rows 7.0 against 5.0 GiB/s and
/// 2 rows 8.0 against 6.5); with one row they lose (Q5_0 from memory: 7.0 against 9.4 GiB/s).
const ROWS16_MIN_A: usize = 2;
/// Activation rows up to which [`q0_rows16`] on packed weights decodes in each tile
/// ([`rows16_tile_packed`]) rather than once into tables; half as many for the Q5 types,
/// whose fifth bits cost a tile as much again (one Zen 4 core, 8 rows, `stream` bench from
/// memory: Q4_1 5.5 fused against 5.3 GiB/s through the tables, Q8_0 8.6 against 7.1, Q5_0
/// 5.4 against 5.8).
const ROWS16_FUSED_A: usize = 8;
/// Activation rows whose tables [`q0_rows16`] builds at a time (for rows of
/// [`ROWS16_BLOCKS`] blocks; proportionally fewer for longer rows).
const ROWS16_A: usize = 32;
/// How many groups of 16 weight rows ahead [`decode16`] asks for the rows it will decode
/// (into L2: into L1, or with the next group only, the 16 rows' interleaved reads still
/// waited on memory).
const ROWS16_PREFETCH: usize = 2;

/// Activation rows per chunk of [`q0_rows16`]'s tables for rows of `nb` blocks.
fn rows16_chunk(nb: usize) -> usize {
    ROWS16_A * ROWS16_BLOCKS / nb.max(1)
}

/// Whether [`q0_rows16`] takes this product: a Q0 type under `ggml_vec_dot_*`/tinyBLAS_Q0
/// (Q4_0, Q5_0, Q8_0, IQ4_NL) or Q4_1/Q5_1, whole groups of 8 weight rows, at least
/// [`ROWS16_MIN_A`] activation rows, rows of up to [`ROWS16_MAX_BLOCKS`] blocks.
pub(crate) fn rows16_covers(
    kind: crate::kernels::tile::TileKind,
    nb: usize,
    nw: usize,
    na: usize,
) -> bool {
    matches!(
        kind,
        crate::kernels::tile::TileKind::Q0(_) | crate::kernels::tile::TileKind::Q1(_)
    ) && nb <= ROWS16_MAX_BLOCKS
        && nw.is_multiple_of(8)
        && nw <= ROWS16_W
        && na >= ROWS16_MIN_A
}

/// Runs [`q0_rows16`] for `kind`.
///
/// # Safety
/// As [`run`], with [`rows16_covers`] true.
pub(crate) unsafe fn rows16(
    kind: crate::kernels::tile::TileKind,
    nb: usize,
    w: &[&[u8]],
    a: &[&[u8]],
    out: &mut [f32],
) {
    // SAFETY (all arms): by this function's contract.
    q_kinds!(kind, q0_rows16, (nb, Rows16Src::Rows(w), a, out);
        _ => unreachable!("avx512::rows16 called without a kernel"),
    )
}

/// [`rows16_packed`] behind the checks that make it safe: the AVX-512 table's
/// [`crate::kernels::table::PackedTileFn`].
pub(crate) fn packed16_tile(
    p: &crate::kernels::pack16::Packed16,
    i0: usize,
    rows: usize,
    a: &[&[u8]],
    out: &mut [f32],
) {
    let nb = p.blocks();
    let groups = p.groups(i0, rows);
    let (_, by, _) = crate::kernels::table::geometry(p.dtype()).expect("a quantized type");
    assert!(
        rows <= ROWS16_W
            && nb <= ROWS16_MAX_BLOCKS
            && out.len() >= rows * a.len()
            && a.iter().all(|r| r.len() >= nb * by),
        "packed tile out of bounds"
    );
    // SAFETY: this function is reached only through the AVX-512 table, which exists only
    // where that tier (AVX-512 F/BW/VL/VNNI with AVX2, FMA, F16C) is detected; `groups` holds
    // whole packed groups of `nb` blocks of the packed type; the activation rows and `out`
    // are long enough (checked above).
    unsafe { rows16_packed(p.dtype(), nb, groups, a, out) }
}

/// Where [`q0_rows16`] reads its weight rows.
#[derive(Clone, Copy)]
enum Rows16Src<'a> {
    /// The file's rows.
    Rows(&'a [&'a [u8]]),
    /// Whole groups of rows packed by [`crate::kernels::pack16`] (`rows` rows from `base`,
    /// `stride` bytes a group).
    Packed {
        base: *const u8,
        stride: usize,
        rows: usize,
    },
}

/// [`q0_rows16`] on packed weights: `out[j * rows + i]` = row `i` of `groups` (whole packed
/// groups of [`crate::kernels::pack16::Packed16`], rows of `nb` blocks of `dtype`) times
/// activation row `a[j]`, at most [`ROWS16_W`] rows. The same bits as from the file's rows.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C present; `groups` holds whole groups of `nb`
/// blocks packed for `dtype` (Q4_1, Q5_0, Q5_1 or Q8_0); each activation row holds `nb` blocks
/// of its type; `nb <= ROWS16_MAX_BLOCKS`; `out` holds `rows * a.len()` outputs.
pub(crate) unsafe fn rows16_packed(
    dtype: lamina_core::DType,
    nb: usize,
    groups: &[u8],
    a: &[&[u8]],
    out: &mut [f32],
) {
    use crate::kernels::pack16::{GROUP, PackLayout};
    let stride = PackLayout::of(dtype)
        .expect("a packed type")
        .group_bytes(nb);
    let rows = groups.len() / stride * GROUP;
    debug_assert!(rows <= ROWS16_W && nb <= ROWS16_MAX_BLOCKS);
    let src = Rows16Src::Packed {
        base: groups.as_ptr(),
        stride,
        rows,
    };
    // SAFETY (all arms): by this function's contract.
    unsafe {
        match dtype {
            lamina_core::DType::Q4_1 => q0_rows16::<0, true>(nb, src, a, out),
            lamina_core::DType::Q5_1 => q0_rows16::<1, true>(nb, src, a, out),
            lamina_core::DType::Q5_0 => q0_rows16::<1, false>(nb, src, a, out),
            lamina_core::DType::Q8_0 => q0_rows16::<2, false>(nb, src, a, out),
            _ => unreachable!("avx512::rows16_packed called for {dtype}"),
        }
    }
}

/// `ggml_vec_dot_<t>_q8_0` / tinyBLAS_Q0 per output (Q4_0 `T == 0`, Q5_0 1, Q8_0 2, IQ4_NL
/// under tinyBLAS 3) with the weight rows in the lanes: for a group of 16 weight rows, the
/// reference's 8-lane chain of output `r` lives in lane `r` of 8 registers, one per 4-byte
/// position `p` of a block. Each weight block is decoded once per call to unsigned bytes
/// `u = x + o` and transposed (lane `r` of position `p` = row r's bytes 4p..4p+3); per block
/// and activation row, `vpdpbusd` with the activation's 4 bytes at `p` broadcast from memory
/// forms the 16 rows' exact lane sums `Σ u·y` on top of `MAGIC`, and subtracting the f32
/// `1.5·2^23 + o·Σy` (a per-call table) leaves `(float)Σ x·y` exactly, as the reference's
/// conversion gives it (both operands lie in one binade; the difference, an integer below
/// 2^22, is representable). The FMA with `dx·dy` (16 rows' `dx` times a broadcast `dy`, one
/// rounding each) follows in block order, and `hsum_float_8`'s tree
/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))` becomes 7 vector adds for 16 outputs.
/// Against the 2 × 4 offset tiles this drops the per-tile horizontal sums and scale
/// products, the work around their inner loop; 512-bit registers halve the broadcast loads
/// per product, which bound the 8-row (256-bit) form on Zen 4 (Q5_0, 64 × 128 × 640, one
/// Zen 4 core, `tiles` bench: 2 × 4 offset tiles 66.7 GMAC/s, 8 rows in 256-bit lanes 76.8,
/// these 102.9).
///
/// With `Q1`, `ggml_vec_dot_q4_1_q8_1` (`T == 0`) / `ggml_vec_dot_q5_1_q8_1` (`T == 1`):
/// the weight values are unsigned already (no correction: the f32 `1.5·2^23` alone is
/// taken off), and the rows' `m·s` chains (`fma(m, s, summs)` block after block, as the
/// reference's scalar loop compiles) run in 16 more lanes and are added after the tree.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C present; every row holds `nb` blocks;
/// [`rows16_covers`] is true; `out` holds `w.len() * a.len()` outputs.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q0_rows16<const T: u8, const Q1: bool>(
    nb: usize,
    w: Rows16Src<'_>,
    a: &[&[u8]],
    out: &mut [f32],
) {
    const MAGIC_F: f32 = 12_582_912.0;
    // Weight and activation block bytes, and where an activation block's values start.
    let (bx, by, yo) = if Q1 {
        (if T == 0 { 20 } else { 24 }, 36, 4)
    } else {
        (q0_bytes(T), 34, 2)
    };
    let nw = match w {
        Rows16Src::Rows(w) => w.len(),
        Rows16Src::Packed { rows, .. } => rows,
    };
    let na = a.len();
    let ng = nw.div_ceil(16);
    let o: i32 = match T {
        0 => 8,
        1 => 16,
        _ => 128,
    };
    // Per group of 16 weight rows and block: the 8 positions' transposed unsigned bytes, and
    // the rows' `dx` (uninitialised until written; only `nb` blocks of `ng` groups are).
    let mut dec = std::mem::MaybeUninit::<[[__m512i; 8]; ROWS16_BLOCKS * ROWS16_W / 16]>::uninit();
    let dec = dec.as_mut_ptr().cast::<[__m512i; 8]>();
    let mut dxs = std::mem::MaybeUninit::<[__m512; ROWS16_BLOCKS * ROWS16_W / 16]>::uninit();
    let dxs = dxs.as_mut_ptr().cast::<__m512>();
    // Q1: the rows' `m` per group and block.
    let mut mxs = std::mem::MaybeUninit::<[__m512; ROWS16_BLOCKS * ROWS16_W / 16]>::uninit();
    let mxs = mxs.as_mut_ptr().cast::<__m512>();
    // Per activation row (of a chunk) and block: `1.5·2^23 + o·Σy` of each position, and `dy`.
    let mut corr = std::mem::MaybeUninit::<[[f32; 8]; ROWS16_BLOCKS * ROWS16_A]>::uninit();
    let corr = corr.as_mut_ptr().cast::<[f32; 8]>();
    let mut dys = std::mem::MaybeUninit::<[f32; ROWS16_BLOCKS * ROWS16_A]>::uninit();
    let dys = dys.as_mut_ptr().cast::<f32>();
    // Q1: per activation row and block, `s`.
    let mut sys = std::mem::MaybeUninit::<[f32; ROWS16_BLOCKS * ROWS16_A]>::uninit();
    let sys = sys.as_mut_ptr().cast::<f32>();
    // SAFETY: rows hold `nb` blocks, `nw <= ROWS16_W` (the caller's contract); `rows16_covers`
    // keeps `ng * nb` (all groups decoded) or `nb` (one slot) within the weight tables and
    // `chunk * nb` within the activation tables; every entry is written before it is read.
    unsafe {
        // With one chunk of activation rows (or rows too long for the tables to hold every
        // group) each group of weight rows is decoded right before its products, into one
        // table slot that stays in L1; otherwise every group is decoded once for all the
        // chunks.
        // Activation rows a chunk of the tables holds, and the tables' stride per group and
        // per activation row: `nb` entries.
        let chunk = rows16_chunk(nb);
        // Rows longer than the tables hold for all groups: each chunk decodes the groups
        // again (a decode is a few percent of 16+ activation rows' products).
        let single = na <= chunk || nb > ROWS16_BLOCKS;
        // Packed weights and few activation rows (a decode step): each tile decodes its
        // blocks in registers, straight from the packed lines, instead of through the tables.
        let fused = matches!(w, Rows16Src::Packed { .. })
            && na
                <= if T == 1 {
                    ROWS16_FUSED_A / 2
                } else {
                    ROWS16_FUSED_A
                };
        let decode = |g: usize, slot: usize| {
            let at = slot * nb;
            match w {
                Rows16Src::Rows(w) => {
                    // A short last group repeats its last row (those outputs are not stored).
                    let rows: [*const u8; 16] = crate::kernels::tile::row_ptrs(w, 16 * g);
                    decode16::<T, Q1>(rows, nb, bx, dec.add(at), dxs.add(at), mxs.add(at));
                }
                Rows16Src::Packed { base, stride, .. } => decode16_packed::<T, Q1>(
                    base.add(g * stride),
                    nb,
                    dec.add(at),
                    dxs.add(at),
                    mxs.add(at),
                ),
            }
        };
        if !single && !fused {
            for g in 0..ng {
                decode(g, g);
            }
        }
        let ones = _mm256_set1_epi8(1);
        for c0 in (0..na).step_by(chunk) {
            let cn = chunk.min(na - c0);
            for j in 0..cn {
                let row = a[c0 + j].as_ptr();
                for b in 0..nb {
                    let yb = row.add(b * by);
                    *dys.add(j * nb + b) = ld_f16(yb);
                    if Q1 {
                        *sys.add(j * nb + b) = ld_f16(yb.add(2));
                        continue;
                    }
                    let y = _mm256_loadu_si256(yb.add(2).cast());
                    let sum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, y);
                    let c = _mm256_add_ps(
                        _mm256_cvtepi32_ps(_mm256_mullo_epi32(sum, _mm256_set1_epi32(o))),
                        _mm256_set1_ps(MAGIC_F),
                    );
                    _mm256_storeu_ps((*corr.add(j * nb + b)).as_mut_ptr(), c);
                }
            }
            for g in 0..ng {
                // Group `g`'s weights: its packed lines, read by the fused tiles, or its
                // decoded tables.
                let lines = match w {
                    Rows16Src::Packed { base, stride, .. } if fused => {
                        Some((base.add(g * stride), stride))
                    }
                    _ => None,
                };
                let at = if lines.is_some() {
                    0
                } else if single {
                    decode(g, 0);
                    0
                } else {
                    g * nb
                };
                let (wd, wdx, wmx) = (
                    dec.add(at).cast_const(),
                    dxs.add(at).cast_const(),
                    mxs.add(at).cast_const(),
                );
                let valid = (nw - 16 * g).min(16);
                let mut j = 0;
                while j < cn {
                    let rn = (cn - j).min(2);
                    let mut yp = [std::ptr::null::<u8>(); 2];
                    let mut tp = [(std::ptr::null(), std::ptr::null(), std::ptr::null()); 2];
                    for jj in 0..rn {
                        yp[jj] = a[c0 + j + jj].as_ptr().add(yo);
                        let r = (j + jj) * nb;
                        tp[jj] = (
                            dys.add(r).cast_const(),
                            corr.add(r).cast_const(),
                            sys.add(r).cast_const(),
                        );
                    }
                    // (Fused: the first pair of activation rows asks for the groups ahead.)
                    let sums = match (lines, rn) {
                        (Some((l, stride)), 2) => {
                            rows16_tile_packed::<2, T, Q1>(nb, by, l, stride, j == 0, yp, tp)
                        }
                        (Some((l, stride)), _) => {
                            let (y, t) = ([yp[0]], [tp[0]]);
                            let [s0] =
                                rows16_tile_packed::<1, T, Q1>(nb, by, l, stride, j == 0, y, t);
                            [s0, s0]
                        }
                        (None, 2) => rows16_tile::<2, Q1>(nb, by, wd, wdx, wmx, yp, tp),
                        (None, _) => {
                            let [s0] = rows16_tile::<1, Q1>(nb, by, wd, wdx, wmx, [yp[0]], [tp[0]]);
                            [s0, s0]
                        }
                    };
                    for (jj, s) in sums.iter().enumerate().take(rn) {
                        let dst = out.as_mut_ptr().add((c0 + j + jj) * nw + 16 * g);
                        if valid == 16 {
                            _mm512_storeu_ps(dst, *s);
                        } else {
                            _mm512_mask_storeu_ps(dst, (1u16 << valid) - 1, *s);
                        }
                    }
                    j += rn;
                }
            }
        }
    }
}

/// Decodes `nb` blocks of 16 weight rows for [`q0_rows16`]: per block, the 8 positions'
/// transposed unsigned bytes into `dec`, the rows' `dx` into `dxs` and (Q1) `m` into `mxs`.
///
/// # Safety
/// Each row holds `nb` blocks of `bx` bytes; the tables have room for `nb` entries;
/// AVX-512 F/BW/VL, AVX2 and F16C enabled by the caller.
#[inline(always)]
unsafe fn decode16<const T: u8, const Q1: bool>(
    rows: [*const u8; 16],
    nb: usize,
    bx: usize,
    dec: *mut [__m512i; 8],
    dxs: *mut __m512,
    mxs: *mut __m512,
) {
    if T != 2 {
        // SAFETY: as this function's.
        return unsafe { decode16_nibbles::<T, Q1>(rows, nb, bx, dec, dxs, mxs) };
    }
    // Q8_0: the 16 rows' 32 bytes transposed as 4-byte words in registers, offset to
    // unsigned. Level 1 takes rows 4i..4i+3 (two registers of two rows each) to words 0-3
    // and 4-7, one word per 128-bit lane; level 2 gathers lane p of the four row quads.
    // SAFETY: by the caller's contract (34-byte blocks: `d`, then 32 bytes).
    unsafe {
        let lo = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
        let hi = _mm512_setr_epi32(4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31);
        let bias = _mm512_set1_epi8(0x80u8 as i8);
        for b in 0..nb {
            prefetch_group(rows[0], nb, bx, b);
            let off = b * bx;
            let mut y = [_mm512_setzero_si512(); 8];
            for (i, yi) in y.iter_mut().enumerate() {
                let v = _mm512_castsi256_si512(_mm256_loadu_si256(rows[2 * i].add(off + 2).cast()));
                *yi = _mm512_inserti64x4::<1>(
                    v,
                    _mm256_loadu_si256(rows[2 * i + 1].add(off + 2).cast()),
                );
            }
            // Per row quad q: words 0-3 (`l[q]`) and 4-7 (`h[q]`), lane = word.
            let mut l = [_mm512_setzero_si512(); 4];
            let mut h = [_mm512_setzero_si512(); 4];
            for q in 0..4 {
                l[q] = _mm512_permutex2var_epi32(y[2 * q], lo, y[2 * q + 1]);
                h[q] = _mm512_permutex2var_epi32(y[2 * q], hi, y[2 * q + 1]);
            }
            let mut u = [_mm512_setzero_si512(); 8];
            for (half, src) in [l, h].iter().enumerate() {
                // Words 2k, 2k + 1 of quads 0, 1 and of quads 2, 3, then each word's 4 quads.
                for k in 0..2 {
                    let (ab, cd) = if k == 0 {
                        (
                            _mm512_shuffle_i64x2::<0x44>(src[0], src[1]),
                            _mm512_shuffle_i64x2::<0x44>(src[2], src[3]),
                        )
                    } else {
                        (
                            _mm512_shuffle_i64x2::<0xEE>(src[0], src[1]),
                            _mm512_shuffle_i64x2::<0xEE>(src[2], src[3]),
                        )
                    };
                    let p = 4 * half + 2 * k;
                    u[p] = _mm512_xor_si512(_mm512_shuffle_i64x2::<0x88>(ab, cd), bias);
                    u[p + 1] = _mm512_xor_si512(_mm512_shuffle_i64x2::<0xDD>(ab, cd), bias);
                }
            }
            let (w0, _) = headers16(&rows, off);
            dxs.add(b).write(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(w0)));
            dec.add(b).write(u);
        }
    }
}

/// The Q5 fifth-bit table of the 16-row decodes: lane index `t` (4 bits of `qh`) -> `0x10` in
/// byte `b` where bit `b` of `t` is set.
///
/// # Safety
/// AVX-512 F enabled by the caller.
#[inline(always)]
unsafe fn qh_spread() -> __m512i {
    // SAFETY: by the caller's contract.
    unsafe {
        _mm512_setr_epi32(
            0x0000_0000,
            0x0000_0010,
            0x0000_1000,
            0x0000_1010,
            0x0010_0000,
            0x0010_0010,
            0x0010_1000,
            0x0010_1010,
            0x1000_0000,
            0x1000_0010,
            0x1000_1000,
            0x1000_1010,
            0x1010_0000,
            0x1010_0010,
            0x1010_1000,
            0x1010_1010,
        )
    }
}

/// The packed layout ([`crate::kernels::pack16`]) of the type of (`T`, `Q1`): Q4_1, Q5_1,
/// Q5_0 or Q8_0.
#[inline(always)]
fn packed_layout<const T: u8, const Q1: bool>() -> crate::kernels::pack16::PackLayout {
    crate::kernels::pack16::PackLayout::of(match (T, Q1) {
        (0, true) => lamina_core::DType::Q4_1,
        (1, true) => lamina_core::DType::Q5_1,
        (1, false) => lamina_core::DType::Q5_0,
        _ => lamina_core::DType::Q8_0,
    })
    .expect("a packed type")
}

/// [`decode16`] from a packed group ([`crate::kernels::pack16`]): per block, the quants'
/// words are already lines of 16 rows, and the headers 16-lane vectors.
///
/// # Safety
/// `group` holds one packed group of `nb` blocks of the type of (`T`, `Q1`) (Q4_1, Q5_0,
/// Q5_1 or Q8_0); the tables have room for `nb` entries; AVX-512 F/BW/VL, AVX2 and F16C
/// enabled by the caller.
#[inline(always)]
unsafe fn decode16_packed<const T: u8, const Q1: bool>(
    group: *const u8,
    nb: usize,
    dec: *mut [__m512i; 8],
    dxs: *mut __m512,
    mxs: *mut __m512,
) {
    let layout = packed_layout::<T, Q1>();
    let (pl, hd) = (layout.payload(), layout.header());
    let (hm, hq) = (layout.header_m(), layout.header_qh());
    // SAFETY: by the caller's contract: `nb` payloads, then `nb` headers.
    unsafe {
        let m4 = _mm512_set1_epi8(0x0F);
        let bias = _mm512_set1_epi8(0x80u8 as i8);
        let spread = qh_spread();
        let span = layout.group_bytes(nb);
        for b in 0..nb {
            prefetch_span(group, span, nb, b);
            let q = group.add(b * pl);
            let h = group.add(nb * pl + b * hd);
            dxs.add(b)
                .write(_mm512_cvtph_ps(_mm256_loadu_si256(h.cast())));
            if Q1 {
                mxs.add(b)
                    .write(_mm512_cvtph_ps(_mm256_loadu_si256(h.add(hm).cast())));
            }
            let mut u = [_mm512_setzero_si512(); 8];
            if T == 2 {
                for (p, v) in u.iter_mut().enumerate() {
                    *v = _mm512_xor_si512(_mm512_loadu_si512(q.add(64 * p).cast()), bias);
                }
            } else {
                for k in 0..4 {
                    let z = _mm512_loadu_si512(q.add(64 * k).cast());
                    u[k] = _mm512_and_si512(z, m4);
                    u[k + 4] = _mm512_and_si512(_mm512_srli_epi32::<4>(z), m4);
                }
                if T == 1 {
                    let bits5 = _mm512_loadu_si512(h.add(hq).cast());
                    for (p, v) in u.iter_mut().enumerate() {
                        let bits = _mm512_srlv_epi32(bits5, _mm512_set1_epi32(4 * p as i32));
                        *v = _mm512_or_si512(*v, _mm512_permutexvar_epi32(bits, spread));
                    }
                }
            }
            dec.add(b).write(u);
        }
    }
}

/// Words 0 and 1 of block `off` of the 16 `rows` (lane `r`: row `r`'s), from four 128-bit
/// loads per row quad and two `vpermt2d` levels: a block's scales (and Q5 `qh`) without 16
/// scalar loads, stores and a reload.
///
/// # Safety
/// 16 readable bytes at `off` of each row; AVX-512 F enabled by the caller.
#[inline(always)]
unsafe fn headers16(rows: &[*const u8; 16], off: usize) -> (__m512i, __m512i) {
    // SAFETY: by the caller's contract.
    unsafe {
        let lvl1 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
        let mut hd = [_mm512_setzero_si512(); 4];
        for (i, hi) in hd.iter_mut().enumerate() {
            let r = &rows[4 * i..4 * i + 4];
            let v = _mm512_castsi128_si512(_mm_loadu_si128(r[0].add(off).cast()));
            let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(r[1].add(off).cast()));
            let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(r[2].add(off).cast()));
            *hi = _mm512_inserti32x4::<3>(v, _mm_loadu_si128(r[3].add(off).cast()));
        }
        let ha = _mm512_permutex2var_epi32(hd[0], lvl1, hd[1]);
        let hc = _mm512_permutex2var_epi32(hd[2], lvl1, hd[3]);
        (
            _mm512_shuffle_i64x2::<0x44>(ha, hc),
            _mm512_shuffle_i64x2::<0xEE>(ha, hc),
        )
    }
}

/// Asks L2 for part `b` (of `nb`) of the group of 16 weight rows [`ROWS16_PREFETCH`] groups
/// past the one at `first`, in address order (weight rows lie one after another; a hint
/// only, whatever lies there). A decode step reads every weight once, and the 16 rows'
/// interleaved reads left the hardware prefetcher behind.
#[inline(always)]
fn prefetch_group(first: *const u8, nb: usize, bx: usize, b: usize) {
    prefetch_span(first, 16 * nb * bx, nb, b);
}

/// [`prefetch_group`] for groups of `span` bytes (packed groups: their reads are in
/// address order, but a decode step takes each weight from memory once and the tiles wait
/// on it otherwise).
#[inline(always)]
fn prefetch_span(first: *const u8, span: usize, nb: usize, b: usize) {
    let lines = span.div_ceil(64);
    let per = lines.div_ceil(nb);
    let start = first.wrapping_add(ROWS16_PREFETCH * span);
    for l in b * per..((b + 1) * per).min(lines) {
        // SAFETY: a prefetch never faults, whatever the address; SSE is part of x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(start.wrapping_add(64 * l) as *const i8) };
    }
}

/// [`decode16`] for the nibble types (Q4_0, Q5_0, IQ4_NL, Q4_1, Q5_1): the 16 rows' 16
/// bytes of nibbles are transposed as 4-byte words in registers (two `vpermt2d` levels), so
/// that word `k` of every row lands in lane `r` of one register; its low nibbles are then
/// position `k` and its high nibbles position `k + 4` (values `4k..4k+3` and `16+4k..`).
/// A fifth bit (Q5_0, Q5_1) comes from the rows' `qh` words: bits `4p..4p+3`, looked up as
/// one lane index in a table that spreads 4 bits to bit 4 of 4 bytes. Against decoding each
/// row to 32 bytes and transposing those, about a third of the instructions: at 4 activation
/// rows a call the decode was as long as the products.
///
/// # Safety
/// As [`decode16`].
#[inline(always)]
unsafe fn decode16_nibbles<const T: u8, const Q1: bool>(
    rows: [*const u8; 16],
    nb: usize,
    bx: usize,
    dec: *mut [__m512i; 8],
    dxs: *mut __m512,
    mxs: *mut __m512,
) {
    // Where a block's nibbles and (Q5) its `qh` word start.
    let qo = match (Q1, T) {
        (false, 1) => 6,
        (false, _) => 2,
        (true, 0) => 4,
        (true, _) => 8,
    };
    // Q5_0 (`T == 1`) and Q5_1 (`Q1`, `T == 1`) carry a fifth bit.
    let bit5 = T == 1;
    // SAFETY: by the caller's contract: 16 readable bytes at `qo` and 4 at `ho` of each block.
    unsafe {
        // Level 1: from rows 4i..4i+3 (`x[i]`, a row per 128-bit lane) and 4i+4..4i+7, words
        // k and k + 1 of all 8 rows (`[x k, y k, x k+1, y k+1]`, 4 words each).
        let lvl1_01 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
        let lvl1_23 = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
        let m4 = _mm512_set1_epi8(0x0F);
        let spread = qh_spread();
        let iq4 = _mm512_broadcast_i32x4(_mm_xor_si128(
            _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i),
            _mm_set1_epi8(0x80u8 as i8),
        ));
        for b in 0..nb {
            let off = b * bx;
            let mut x = [_mm512_setzero_si512(); 4];
            prefetch_group(rows[0], nb, bx, b);
            for (i, xi) in x.iter_mut().enumerate() {
                let r = &rows[4 * i..4 * i + 4];
                let v = _mm512_castsi128_si512(_mm_loadu_si128(r[0].add(off + qo).cast()));
                let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(r[1].add(off + qo).cast()));
                let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(r[2].add(off + qo).cast()));
                *xi = _mm512_inserti32x4::<3>(v, _mm_loadu_si128(r[3].add(off + qo).cast()));
            }
            // The block headers: words 0 and 1 of the 16 rows.
            let (w0, w1) = headers16(&rows, off);
            dxs.add(b).write(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(w0)));
            if Q1 {
                mxs.add(b)
                    .write(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<
                        16,
                    >(
                        w0
                    ))));
            }
            let h = if bit5 {
                if Q1 {
                    w1
                } else {
                    // Q5_0's `qh` starts at byte 2.
                    _mm512_or_si512(_mm512_srli_epi32::<16>(w0), _mm512_slli_epi32::<16>(w1))
                }
            } else {
                _mm512_setzero_si512()
            };
            // Words k, k+1 of rows 0-7 (`a`) and 8-15 (`c`), then word k of all 16 rows.
            let a01 = _mm512_permutex2var_epi32(x[0], lvl1_01, x[1]);
            let a23 = _mm512_permutex2var_epi32(x[0], lvl1_23, x[1]);
            let c01 = _mm512_permutex2var_epi32(x[2], lvl1_01, x[3]);
            let c23 = _mm512_permutex2var_epi32(x[2], lvl1_23, x[3]);
            let z = [
                _mm512_shuffle_i64x2::<0x44>(a01, c01),
                _mm512_shuffle_i64x2::<0xEE>(a01, c01),
                _mm512_shuffle_i64x2::<0x44>(a23, c23),
                _mm512_shuffle_i64x2::<0xEE>(a23, c23),
            ];
            let mut u = [_mm512_setzero_si512(); 8];
            for k in 0..4 {
                u[k] = _mm512_and_si512(z[k], m4);
                u[k + 4] = _mm512_and_si512(_mm512_srli_epi32::<4>(z[k]), m4);
            }
            if bit5 {
                // Position p: bits 4p..4p+3 of each row's word (vpermd reads 4 index bits).
                for (p, v) in u.iter_mut().enumerate() {
                    let bits = _mm512_srlv_epi32(h, _mm512_set1_epi32(4 * p as i32));
                    *v = _mm512_or_si512(*v, _mm512_permutexvar_epi32(bits, spread));
                }
            }
            if !Q1 && T == 3 {
                for v in u.iter_mut() {
                    *v = _mm512_shuffle_epi8(iq4, *v);
                }
            }
            dec.add(b).write(u);
        }
    }
}

/// The activation-row tables of [`rows16_tile`]: `dy`, the Q0 corrections, the Q1 `s`.
type RowTables = (*const f32, *const [f32; 8], *const f32);

/// 16 weight rows (`wd`, `wdx`, `wmx`: their transposed blocks, `dx` and Q1 `m`) × `RN`
/// activation rows (`yp`: the first block's values, blocks `by` bytes apart; `tp`: the row's
/// tables) of [`q0_rows16`]: per activation row, the 16 outputs.
#[inline(always)]
unsafe fn rows16_tile<const RN: usize, const Q1: bool>(
    nb: usize,
    by: usize,
    wd: *const [__m512i; 8],
    wdx: *const __m512,
    wmx: *const __m512,
    yp: [*const u8; RN],
    tp: [RowTables; RN],
) -> [__m512; RN] {
    // SAFETY: the tables hold `nb` entries and the rows `nb` blocks (the caller's contract);
    // AVX-512 F/VNNI enabled by the caller.
    unsafe {
        // Q1: the `m·s` chains first, in a loop of their own (beside the main loop they
        // would take registers it needs).
        let mut summs = [_mm512_setzero_ps(); RN];
        if Q1 {
            for b in 0..nb {
                let mx = *wmx.add(b);
                for jj in 0..RN {
                    let sy = _mm512_set1_ps(*tp[jj].2.add(b));
                    summs[jj] = _mm512_fmadd_ps(mx, sy, summs[jj]);
                }
            }
        }
        let magic = _mm512_set1_epi32(0x4B40_0000);
        let mut acc = [[_mm512_setzero_ps(); 8]; RN];
        for b in 0..nb {
            let u = &*wd.add(b);
            let dx = *wdx.add(b);
            for jj in 0..RN {
                let yb = yp[jj].add(b * by);
                let dd = _mm512_mul_ps(dx, _mm512_set1_ps(*tp[jj].0.add(b)));
                // (Q1 builds no correction table: read only without `Q1`.)
                let cr = tp[jj].1.add(b).cast::<f32>();
                for p in 0..8 {
                    let y4 = _mm512_set1_epi32(yb.add(4 * p).cast::<i32>().read_unaligned());
                    let t = _mm512_dpbusd_epi32(magic, u[p], y4);
                    let c = if Q1 { 12_582_912.0 } else { *cr.add(p) };
                    let f = _mm512_sub_ps(_mm512_castsi512_ps(t), _mm512_set1_ps(c));
                    acc[jj][p] = _mm512_fmadd_ps(dd, f, acc[jj][p]);
                }
            }
        }
        rows16_sums::<RN, Q1>(&acc, summs)
    }
}

/// The 16 outputs per activation row of [`rows16_tile`]'s chains: `hsum_float_8`'s tree
/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))` as 7 vector adds, then (Q1) the `m·s`
/// sums.
///
/// # Safety
/// AVX-512 F enabled by the caller.
#[inline(always)]
unsafe fn rows16_sums<const RN: usize, const Q1: bool>(
    acc: &[[__m512; 8]; RN],
    summs: [__m512; RN],
) -> [__m512; RN] {
    // SAFETY: register arithmetic; AVX-512 F enabled by the caller.
    unsafe {
        let mut out = [_mm512_setzero_ps(); RN];
        for ((o, l), sm) in out.iter_mut().zip(acc).zip(summs) {
            *o = _mm512_add_ps(
                _mm512_add_ps(_mm512_add_ps(l[0], l[4]), _mm512_add_ps(l[2], l[6])),
                _mm512_add_ps(_mm512_add_ps(l[1], l[5]), _mm512_add_ps(l[3], l[7])),
            );
            if Q1 {
                *o = _mm512_add_ps(*o, sm);
            }
        }
        out
    }
}

/// [`rows16_tile`] reading a packed group ([`crate::kernels::pack16`], `nb` blocks of the
/// type of (`T`, `Q1`): Q4_1, Q5_0, Q5_1 or Q8_0) instead of [`decode16_packed`]'s tables:
/// each block's 8 positions are formed in registers from its 64-byte lines right before
/// their products (the same values, so the same bits). The tables cost 10 512-bit stores a
/// block, and Zen 4 retires one such store every two cycles: at 2 to 8 activation rows the
/// stores, not the products, set the pace. With `ahead`, asks for the group
/// [`ROWS16_PREFETCH`] groups on (`stride` bytes a group) as the decode does.
///
/// # Safety
/// As [`rows16_tile`], with `group` one whole packed group of `nb` blocks.
#[inline(always)]
unsafe fn rows16_tile_packed<const RN: usize, const T: u8, const Q1: bool>(
    nb: usize,
    by: usize,
    group: *const u8,
    stride: usize,
    ahead: bool,
    yp: [*const u8; RN],
    tp: [RowTables; RN],
) -> [__m512; RN] {
    let layout = packed_layout::<T, Q1>();
    let (pl, hd) = (layout.payload(), layout.header());
    let (hm, hq) = (layout.header_m(), layout.header_qh());
    // SAFETY: `nb` payloads then `nb` headers at `group`; the tables hold `nb` entries and
    // the rows `nb` blocks (the caller's contract); AVX-512 F/BW/VNNI enabled by the caller.
    unsafe {
        let heads = group.add(nb * pl);
        let mut summs = [_mm512_setzero_ps(); RN];
        if Q1 {
            for b in 0..nb {
                let mx = _mm512_cvtph_ps(_mm256_loadu_si256(heads.add(b * hd + hm).cast()));
                for jj in 0..RN {
                    let sy = _mm512_set1_ps(*tp[jj].2.add(b));
                    summs[jj] = _mm512_fmadd_ps(mx, sy, summs[jj]);
                }
            }
        }
        let magic = _mm512_set1_epi32(0x4B40_0000);
        let m4 = _mm512_set1_epi8(0x0F);
        let bias = _mm512_set1_epi8(0x80u8 as i8);
        let spread = qh_spread();
        let mut acc = [[_mm512_setzero_ps(); 8]; RN];
        for b in 0..nb {
            if ahead {
                prefetch_span(group, stride, nb, b);
            }
            let q = group.add(b * pl);
            let h = heads.add(b * hd);
            let dx = _mm512_cvtph_ps(_mm256_loadu_si256(h.cast()));
            let mut dd = [_mm512_setzero_ps(); RN];
            for jj in 0..RN {
                dd[jj] = _mm512_mul_ps(dx, _mm512_set1_ps(*tp[jj].0.add(b)));
            }
            let bits5 = if T == 1 {
                _mm512_loadu_si512(h.add(hq).cast())
            } else {
                _mm512_setzero_si512()
            };
            // Position `p`'s unsigned bytes of the 16 rows.
            let unsigned = |p: usize| -> __m512i {
                if T == 2 {
                    return _mm512_xor_si512(_mm512_load_si512(q.add(64 * p).cast()), bias);
                }
                let z = _mm512_load_si512(q.add(64 * (p % 4)).cast());
                let z = if p < 4 { z } else { _mm512_srli_epi32::<4>(z) };
                let u = _mm512_and_si512(z, m4);
                if T == 1 {
                    let bits = _mm512_srlv_epi32(bits5, _mm512_set1_epi32(4 * p as i32));
                    _mm512_or_si512(u, _mm512_permutexvar_epi32(bits, spread))
                } else {
                    u
                }
            };
            for p in 0..8 {
                let u = unsigned(p);
                for jj in 0..RN {
                    let yb = yp[jj].add(b * by);
                    let y4 = _mm512_set1_epi32(yb.add(4 * p).cast::<i32>().read_unaligned());
                    let t = _mm512_dpbusd_epi32(magic, u, y4);
                    let c = if Q1 {
                        12_582_912.0
                    } else {
                        *tp[jj].1.add(b).cast::<f32>().add(p)
                    };
                    let f = _mm512_sub_ps(_mm512_castsi512_ps(t), _mm512_set1_ps(c));
                    acc[jj][p] = _mm512_fmadd_ps(dd[jj], f, acc[jj][p]);
                }
            }
        }
        rows16_sums::<RN, Q1>(&acc, summs)
    }
}

/// The 32 values of a Q4_1 (`T == 0`) or Q5_1 block as unsigned bytes.
#[inline(always)]
unsafe fn q1_unsigned<const T: u8>(xb: *const u8) -> __m256i {
    // SAFETY: `xb` points at a whole block; AVX-512 BW/VL enabled by the caller.
    unsafe {
        match T {
            0 => bytes_from_nibbles_32(xb.add(4)),
            _ => nibbles_bit5(xb.add(8), xb.add(4)),
        }
    }
}

/// The 32 nibbles at `qs` as bytes, plus 16 where bit `i` of the u32 at `qh` is set: the
/// unsigned values of a Q5_0 or Q5_1 block.
#[inline(always)]
unsafe fn nibbles_bit5(qs: *const u8, qh: *const u8) -> __m256i {
    // SAFETY: 16 readable bytes at `qs` and 4 at `qh`; AVX-512 BW/VL enabled by the caller.
    unsafe {
        let nib = bytes_from_nibbles_32(qs);
        let bits = qh.cast::<u32>().read_unaligned();
        _mm256_mask_add_epi8(nib, bits, nib, _mm256_set1_epi8(16))
    }
}

/// The repacked Q0 kernels (Q4_0 `T == 0`, IQ4_NL 3, MXFP4 4; `acc = fma((float)Σq·q8,
/// dx*dy, acc)` per output) for weight rows in groups of 8 and any number of activation rows,
/// bit-identical to the AVX2 `q0_chain8`. Per block the 8 weight rows are decoded once and
/// transposed so that i32 lane `r` holds row `r`'s values (4 bytes per `vpdpbusd` step, as
/// `block_q4_0x8`'s interleaving); each activation row's 4-byte groups are broadcast to the
/// lanes, the signs moved from the weights (`|x|`) onto them, and `vpdpbusd` accumulates the
/// 8 exact block sums in the lanes, with no horizontal sums.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C present; every row holds `nb` blocks;
/// `w.len()` is a multiple of 8; `out` holds `w.len() * a.len()` outputs.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q0_chain8<const T: u8>(nb: usize, w: &[&[u8]], a: &[&[u8]], out: &mut [f32]) {
    const CHUNK: usize = 16;
    let bx = q0_bytes(T);
    let (nw, na) = (w.len(), a.len());
    // SAFETY: by this function's contract.
    unsafe {
        let mut idx = [_mm512_setzero_si512(); 4];
        for (p, ix) in idx.iter_mut().enumerate() {
            *ix = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_set1_epi32(2 * p as i32)),
                _mm256_set1_epi32(2 * p as i32 + 1),
                1,
            );
        }
        let zero = _mm512_setzero_si512();
        for i0 in (0..nw).step_by(8) {
            let mut j0 = 0;
            while j0 < na {
                let rn = (na - j0).min(CHUNK);
                let mut acc = [_mm256_setzero_ps(); CHUNK];
                for ib in 0..nb {
                    let mut v = [_mm256_setzero_si256(); 8];
                    let mut dxs = [0f32; 8];
                    for i in 0..8 {
                        let xb = w[i0 + i].as_ptr().add(ib * bx);
                        dxs[i] = if T == 4 { e8m0_half(*xb) } else { ld_f16(xb) };
                        v[i] = q0_values::<T>(xb);
                    }
                    let dx = _mm256_loadu_ps(dxs.as_ptr());
                    // 8×8 transpose of the rows' 4-byte groups: `t[k]` lane `r` = row r, group k.
                    let mut t = [_mm256_setzero_si256(); 8];
                    for h in 0..2 {
                        let r = 4 * h;
                        let a0 = _mm256_unpacklo_epi32(v[r], v[r + 1]);
                        let a1 = _mm256_unpackhi_epi32(v[r], v[r + 1]);
                        let a2 = _mm256_unpacklo_epi32(v[r + 2], v[r + 3]);
                        let a3 = _mm256_unpackhi_epi32(v[r + 2], v[r + 3]);
                        t[4 * h] = _mm256_unpacklo_epi64(a0, a2);
                        t[4 * h + 1] = _mm256_unpackhi_epi64(a0, a2);
                        t[4 * h + 2] = _mm256_unpacklo_epi64(a1, a3);
                        t[4 * h + 3] = _mm256_unpackhi_epi64(a1, a3);
                    }
                    let mut ax = [zero; 4];
                    let mut neg = [0u64; 4];
                    for p in 0..4 {
                        // Groups 2p (lanes 0-7) and 2p+1 (lanes 8-15): groups k and k+4 sit in
                        // the low and high 128 bits of `t[k]` (rows 0-3) and `t[k + 4]` (4-7).
                        let (c0, c1) = ((2 * p) % 4, (2 * p + 1) % 4);
                        let (g0, g1) = if p < 2 {
                            (
                                _mm256_permute2x128_si256(t[c0], t[c0 + 4], 0x20),
                                _mm256_permute2x128_si256(t[c1], t[c1 + 4], 0x20),
                            )
                        } else {
                            (
                                _mm256_permute2x128_si256(t[c0], t[c0 + 4], 0x31),
                                _mm256_permute2x128_si256(t[c1], t[c1 + 4], 0x31),
                            )
                        };
                        let z = _mm512_inserti64x4(_mm512_castsi256_si512(g0), g1, 1);
                        neg[p] = _mm512_movepi8_mask(z);
                        ax[p] = _mm512_abs_epi8(z);
                    }
                    for j in 0..rn {
                        let yb = a[j0 + j].as_ptr().add(ib * 34);
                        let dy = _mm256_set1_ps(ld_f16(yb));
                        let y = _mm512_castsi256_si512(_mm256_loadu_si256(yb.add(2).cast()));
                        let mut s = zero;
                        for p in 0..4 {
                            let yp = _mm512_permutexvar_epi32(idx[p], y);
                            let ys = _mm512_mask_sub_epi8(yp, neg[p], zero, yp);
                            s = _mm512_dpbusd_epi32(s, ax[p], ys);
                        }
                        let sums = _mm256_add_epi32(
                            _mm512_castsi512_si256(s),
                            _mm512_extracti64x4_epi64(s, 1),
                        );
                        // dx*dy rounded once, then one FMA: the scalar chain per lane.
                        let d = _mm256_mul_ps(dx, dy);
                        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), d, acc[j]);
                    }
                }
                for j in 0..rn {
                    _mm256_storeu_ps(out.as_mut_ptr().add((j0 + j) * nw + i0), acc[j]);
                }
                j0 += rn;
            }
        }
    }
}

/// tinyBLAS f16 (`T == 0`) / f32 (`T == 1`) over the whole product, bit-identical to the AVX2
/// `ftiny`: each output is the same 8-lane FMA chain over its groups of 8 values, then
/// `hsum_float_8`. A 16-lane register carries two outputs' chains, activation rows `j` and
/// `j + 1` in its halves against the weight row's 8 values in both, so one FMA advances two
/// chains, and a tile of 4 weight rows × 4 such row pairs keeps 16 accumulators (32 outputs)
/// in registers: per group of 8 values 8 conversions feed 16 FMAs, where the AVX2 2 × 4
/// tile has 6 for 8. (Attention's K·Q and KQ·V without flash attention: Gemma 3 pp4096
/// +10 % on a Golden Cove core. Converting the activation pairs once per call instead, into
/// a table, was slower: a call has only 8 weight rows to share them.)
///
/// # Safety
/// As [`run`]: every row holds `nb` groups of 8 values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn ftiny_tiles<const T: u8>(
    nb: usize,
    w: &[&[u8]],
    a: &[&[u8]],
    out: &mut [f32],
) {
    let (nw, na) = (w.len(), a.len());
    let mut i0 = 0;
    while i0 < nw {
        let rm = (nw - i0).min(4);
        let wp: [*const u8; 4] = crate::kernels::tile::row_ptrs(&w[..i0 + rm], i0);
        let mut j0 = 0;
        while j0 < na {
            let rn = (na - j0).min(8);
            // Past the last row, pairs repeat it (their outputs are not stored).
            let ap: [*const u8; 8] = crate::kernels::tile::row_ptrs(&a[..j0 + rn], j0);
            // SAFETY: rows hold `nb` groups (the caller's contract); the pointers above
            // name rows of `w` and `a`.
            let r = unsafe {
                // A short last group of weight rows computes the repeated last row too
                // (weight rows are attention cells or head dimensions: rarely short).
                match rn.div_ceil(2) {
                    4 => widen(ftiny_x2::<T, 4>(nb, wp, ap)),
                    3 => widen(ftiny_x2::<T, 3>(nb, wp, ap)),
                    2 => widen(ftiny_x2::<T, 2>(nb, wp, ap)),
                    _ => widen(ftiny_x2::<T, 1>(nb, wp, ap)),
                }
            };
            for (i, ri) in r.iter().enumerate().take(rm) {
                for (j, &v) in ri.iter().enumerate().take(rn) {
                    out[(j0 + j) * nw + i0 + i] = v;
                }
            }
            j0 += rn;
        }
        i0 += rm;
    }
}

/// `r` as a 4 × 8 array (columns past `2·NP` are zero).
#[inline(always)]
fn widen<const NP: usize>(r: [[[f32; 2]; NP]; 4]) -> [[f32; 8]; 4] {
    let mut o = [[0f32; 8]; 4];
    for (i, ri) in r.iter().enumerate() {
        for (p, v) in ri.iter().enumerate() {
            o[i][2 * p] = v[0];
            o[i][2 * p + 1] = v[1];
        }
    }
    o
}

/// 4 weight rows × `NP` pairs of activation rows (`a[2p]`, `a[2p + 1]`): `[i][p] = [out(i,
/// 2p), out(i, 2p + 1)]`, each the AVX2 `ftiny` chain.
#[inline(always)]
unsafe fn ftiny_x2<const T: u8, const NP: usize>(
    nb: usize,
    w: [*const u8; 4],
    a: [*const u8; 8],
) -> [[[f32; 2]; NP]; 4] {
    const RM: usize = 4;
    // SAFETY: rows hold `nb` groups of 8 values (the caller's contract); AVX-512F enabled
    // by the caller.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NP]; RM];
        for l in 0..nb {
            let mut vb = [_mm512_setzero_ps(); NP];
            for (p, v) in vb.iter_mut().enumerate() {
                *v = if T == 0 {
                    let lo = _mm_loadu_si128(a[2 * p].add(16 * l).cast());
                    let hi = _mm_loadu_si128(a[2 * p + 1].add(16 * l).cast());
                    _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi))
                } else {
                    let lo = _mm256_loadu_ps(a[2 * p].add(32 * l).cast());
                    let hi = _mm256_loadu_ps(a[2 * p + 1].add(32 * l).cast());
                    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                        _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
                        _mm256_castps_pd(hi),
                    ))
                };
            }
            for i in 0..RM {
                let va = if T == 0 {
                    _mm512_cvtph_ps(_mm256_broadcastsi128_si256(_mm_loadu_si128(
                        w[i].add(16 * l).cast(),
                    )))
                } else {
                    let v = _mm256_loadu_ps(w[i].add(32 * l).cast());
                    _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(v)))
                };
                for p in 0..NP {
                    acc[i][p] = _mm512_fmadd_ps(va, vb[p], acc[i][p]);
                }
            }
        }
        let mut out = [[[0f32; 2]; NP]; RM];
        for i in 0..RM {
            for p in 0..NP {
                let lo = _mm512_castps512_ps256(acc[i][p]);
                let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[i][p])));
                out[i][p] = [hsum_float_8(lo), hsum_float_8(hi)];
            }
        }
        out
    }
}

/// tinyBLAS f16 (`T == 0`) / f32 (`T == 1`) in 8-lane registers, as the AVX2 `ftiny`, but in
/// tiles of 4 weight rows × 6 activation rows that the 32 registers of AVX-512 VL hold (24
/// accumulators): per group of 8 values 10 conversions feed 24 FMAs (AVX2's 2 × 4: 6 for 8).
/// Each output is the AVX2 chain, then `hsum_float_8`: the same bits. For cores that split
/// 512-bit operations in two (Zen 4), where [`ftiny_tiles`]' 16-lane registers lose to this.
///
/// # Safety
/// As [`run`]: every row holds `nb` groups of 8 values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn ftiny_ymm_tiles<const T: u8>(
    nb: usize,
    w: &[&[u8]],
    a: &[&[u8]],
    out: &mut [f32],
) {
    const RM: usize = 4;
    const RN: usize = 6;
    let (nw, na) = (w.len(), a.len());
    let mut i0 = 0;
    while i0 < nw {
        let rm = (nw - i0).min(RM);
        // Past the last row, rows repeat it (their outputs are not stored).
        let wp: [*const u8; RM] = crate::kernels::tile::row_ptrs(&w[..i0 + rm], i0);
        let mut j0 = 0;
        while j0 < na {
            let rn = (na - j0).min(RN);
            // A short last group in a narrower tile (a call's 16 rows: 6 + 6 + 4).
            macro_rules! tile {
                ($rn:literal) => {{
                    let ap: [*const u8; $rn] = crate::kernels::tile::row_ptrs(&a[..j0 + rn], j0);
                    // SAFETY: rows hold `nb` groups (the caller's contract).
                    let r = unsafe { ftiny_ymm::<T, RM, $rn>(nb, wp, ap) };
                    for (i, ri) in r.iter().enumerate().take(rm) {
                        for (j, &v) in ri.iter().enumerate().take(rn) {
                            out[(j0 + j) * nw + i0 + i] = v;
                        }
                    }
                }};
            }
            match rn {
                1 | 2 => tile!(2),
                3 | 4 => tile!(4),
                _ => tile!(6),
            }
            j0 += rn;
        }
        i0 += rm;
    }
}

/// `RM` weight rows × `RN` activation rows of [`ftiny_ymm_tiles`].
#[inline(always)]
unsafe fn ftiny_ymm<const T: u8, const RM: usize, const RN: usize>(
    nb: usize,
    w: [*const u8; RM],
    a: [*const u8; RN],
) -> [[f32; RN]; RM] {
    // Group `l` of 8 values at `p` as f32.
    #[inline(always)]
    unsafe fn ld<const T: u8>(p: *const u8, l: usize) -> __m256 {
        // SAFETY: group `l` is readable (the caller's contract); F16C enabled by the caller.
        unsafe {
            if T == 0 {
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * l).cast()))
            } else {
                _mm256_loadu_ps(p.add(32 * l).cast())
            }
        }
    }
    // SAFETY: rows hold `nb` groups of 8 values (the caller's contract).
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); RN]; RM];
        for l in 0..nb {
            let mut va = [_mm256_setzero_ps(); RM];
            for (v, &p) in va.iter_mut().zip(&w) {
                *v = ld::<T>(p, l);
            }
            for j in 0..RN {
                let vb = ld::<T>(a[j], l);
                for i in 0..RM {
                    acc[i][j] = _mm256_fmadd_ps(va[i], vb, acc[i][j]);
                }
            }
        }
        let mut out = [[0f32; RN]; RM];
        for i in 0..RM {
            for j in 0..RN {
                out[i][j] = hsum_float_8(acc[i][j]);
            }
        }
        out
    }
}
