//! The AVX2 tile kernels: register-blocked tiles of a product, each output with its
//! single-output kernel's operations (see `kernels/tile.rs`).

use crate::kernels::tile::TileKind;
use crate::kernels::x86::{
    bytes_from_bits_32, bytes_from_nibbles_32, hsum_float_8, q6k_scale_shuffle,
};
use std::arch::x86_64::*;

/// Calls `$kern::<$t, RM, RN>` over the whole `w × a` product in tiles of at most
/// `tm × tn` (4×1 for a single activation row, else 2×4).
macro_rules! run_tiles {
    ($kern:ident, $t:expr, $nb:expr, $w:expr, $a:expr, $out:expr) => {{
        let (w, a, out): (&[&[u8]], &[&[u8]], &mut [f32]) = ($w, $a, $out);
        let na = a.len();
        let (tm, tn) = if na == 1 { (4, 1) } else { (2, 4) };
        let mut i0 = 0;
        while i0 < w.len() {
            let rm = (w.len() - i0).min(tm);
            let mut j0 = 0;
            while j0 < na {
                let rn = (na - j0).min(tn);
                match (rm, rn) {
                    (1, 1) => call!($kern, $t, 1, 1, $nb, w, a, out, i0, j0, na),
                    (2, 1) => call!($kern, $t, 2, 1, $nb, w, a, out, i0, j0, na),
                    (3, 1) => call!($kern, $t, 3, 1, $nb, w, a, out, i0, j0, na),
                    (4, 1) => call!($kern, $t, 4, 1, $nb, w, a, out, i0, j0, na),
                    (1, 2) => call!($kern, $t, 1, 2, $nb, w, a, out, i0, j0, na),
                    (2, 2) => call!($kern, $t, 2, 2, $nb, w, a, out, i0, j0, na),
                    (1, 3) => call!($kern, $t, 1, 3, $nb, w, a, out, i0, j0, na),
                    (2, 3) => call!($kern, $t, 2, 3, $nb, w, a, out, i0, j0, na),
                    (1, 4) => call!($kern, $t, 1, 4, $nb, w, a, out, i0, j0, na),
                    _ => call!($kern, $t, 2, 4, $nb, w, a, out, i0, j0, na),
                }
                j0 += rn;
            }
            i0 += rm;
        }
    }};
}

macro_rules! call {
    ($kern:ident, $t:expr, $rm:literal, $rn:literal, $nb:expr, $w:ident, $a:ident, $out:ident,
     $i0:ident, $j0:ident, $na:ident) => {{
        let wp: [*const u8; $rm] = crate::kernels::tile::row_ptrs($w, $i0);
        let ap: [*const u8; $rn] = crate::kernels::tile::row_ptrs($a, $j0);
        // SAFETY: rows hold `nb` blocks (checked by `tile`); AVX2/FMA/F16C present.
        let r = unsafe { $kern::<{ $t }, $rm, $rn>($nb, wp, ap) };
        for i in 0..$rm {
            for j in 0..$rn {
                $out[($j0 + j) * $w.len() + $i0 + i] = r[i][j];
            }
        }
    }};
}

/// Runs `$kern::<$t, 2>` / `$kern::<$t, 1>` (4 weight rows × 2 or 1 activation rows) over
/// the whole product, as tinyBLAS_Q0_AVX's `gemm4xN` on AVX2; `w.len()` is a multiple of 4.
macro_rules! run_4x2 {
    ($kern:ident, $t:expr, $nb:expr, $w:expr, $a:expr, $out:expr) => {{
        let (nb, w, a, out): (usize, &[&[u8]], &[&[u8]], &mut [f32]) = ($nb, $w, $a, $out);
        let na = a.len();
        let mut i0 = 0;
        while i0 + 4 <= w.len() {
            let wp = [
                w[i0].as_ptr(),
                w[i0 + 1].as_ptr(),
                w[i0 + 2].as_ptr(),
                w[i0 + 3].as_ptr(),
            ];
            let mut j0 = 0;
            while j0 < na {
                if j0 + 2 <= na {
                    let ap = [a[j0].as_ptr(), a[j0 + 1].as_ptr()];
                    // SAFETY: rows hold `nb` blocks (checked by `tile`).
                    let r = unsafe { $kern::<{ $t }, 2>(nb, wp, ap) };
                    for i in 0..4 {
                        out[j0 * w.len() + i0 + i] = r[i][0];
                        out[(j0 + 1) * w.len() + i0 + i] = r[i][1];
                    }
                    j0 += 2;
                } else {
                    // SAFETY: as above.
                    let r = unsafe { $kern::<{ $t }, 1>(nb, wp, [a[j0].as_ptr()]) };
                    for i in 0..4 {
                        out[j0 * w.len() + i0 + i] = r[i][0];
                    }
                    j0 += 1;
                }
            }
            i0 += 4;
        }
    }};
}

/// # Safety
/// AVX2/FMA/F16C present; every row holds `nb` blocks of `kind`.
pub unsafe fn run(kind: TileKind, nb: usize, w: &[&[u8]], a: &[&[u8]], out: &mut [f32]) {
    match kind {
        // Q4_0/Q5_0: unsigned weight bytes and per-call scale tables (see `offset_q0`).
        TileKind::Q0(t @ (0 | 1)) if a.len() > 1 && w.len().is_multiple_of(4) => {
            // SAFETY (all): by this function's contract; the table limits hold (checked).
            match (t, table_size(nb, a.len())) {
                (0, Some(false)) => unsafe {
                    offset_q0::<0, MAX_BLOCKS, { MAX_A / 4 }, DOT_AVX2>(nb, w, a, out)
                },
                (0, Some(true)) => unsafe {
                    offset_q0::<0, WIDE_BLOCKS, { WIDE_A / 4 }, DOT_AVX2>(nb, w, a, out)
                },
                (_, Some(false)) => unsafe {
                    offset_q0::<1, MAX_BLOCKS, { MAX_A / 4 }, DOT_AVX2>(nb, w, a, out)
                },
                (_, Some(true)) => unsafe {
                    offset_q0::<1, WIDE_BLOCKS, { WIDE_A / 4 }, DOT_AVX2>(nb, w, a, out)
                },
                (0, None) => run_4x2!(q0_4xn, 0, nb, w, a, out),
                (_, None) => run_4x2!(q0_4xn, 1, nb, w, a, out),
            }
        }
        // SAFETY: by this function's contract; the table limits hold (checked).
        TileKind::Q0(2)
            if a.len() > 1
                && w.len().is_multiple_of(2)
                && nb <= WIDE_BLOCKS
                && a.len() <= MAX_A =>
        unsafe { offset_q8(nb, w, a, out) },
        // Several activation rows and weight rows in fours: tinyBLAS's 4×2 shape.
        TileKind::Q0(t) if a.len() > 1 && w.len().is_multiple_of(4) => match t {
            0 => run_4x2!(q0_4xn, 0, nb, w, a, out),
            1 => run_4x2!(q0_4xn, 1, nb, w, a, out),
            2 => run_4x2!(q0_4xn, 2, nb, w, a, out),
            _ => run_4x2!(q0_4xn, 3, nb, w, a, out),
        },
        TileKind::Q1(q5)
            if a.len() > 1 && w.len().is_multiple_of(2) && table_size(nb, a.len()).is_some() =>
        {
            // SAFETY (all): by this function's contract; the table limits hold (checked).
            match (q5, table_size(nb, a.len()) == Some(true)) {
                (false, false) => unsafe {
                    offset_q1::<0, MAX_BLOCKS, { MAX_A / 4 }, DOT_AVX2>(nb, w, a, out)
                },
                (false, true) => unsafe {
                    offset_q1::<0, WIDE_BLOCKS, { WIDE_A / 4 }, DOT_AVX2>(nb, w, a, out)
                },
                (true, false) => unsafe {
                    offset_q1::<1, MAX_BLOCKS, { MAX_A / 4 }, DOT_AVX2>(nb, w, a, out)
                },
                (true, true) => unsafe {
                    offset_q1::<1, WIDE_BLOCKS, { WIDE_A / 4 }, DOT_AVX2>(nb, w, a, out)
                },
            }
        }
        TileKind::Q1(q5) if a.len() > 1 && w.len().is_multiple_of(4) => {
            if q5 {
                run_4x2!(q1_4xn, 1, nb, w, a, out)
            } else {
                run_4x2!(q1_4xn, 0, nb, w, a, out)
            }
        }
        TileKind::Q0(0) => run_tiles!(q0, 0, nb, w, a, out),
        TileKind::Q0(1) => run_tiles!(q0, 1, nb, w, a, out),
        TileKind::Q0(2) => run_tiles!(q0, 2, nb, w, a, out),
        TileKind::Q0(_) => run_tiles!(q0, 3, nb, w, a, out),
        // SAFETY (all three): by this function's contract; `w.len()` is a multiple of 8.
        TileKind::Q0Chain(t) if w.len().is_multiple_of(8) => unsafe {
            match t {
                0 => q0_chain8::<0>(nb, w, a, out),
                4 => q0_chain8::<4>(nb, w, a, out),
                _ => q0_chain8::<3>(nb, w, a, out),
            }
        },
        TileKind::Q0Chain(0) => run_tiles!(q0_chain, 0, nb, w, a, out),
        TileKind::Q0Chain(4) => run_tiles!(q0_chain, 4, nb, w, a, out),
        TileKind::Q0Chain(_) => run_tiles!(q0_chain, 3, nb, w, a, out),
        // SAFETY (both): by this function's contract.
        TileKind::Iq4XsTiled => unsafe { iq_tiled::<0>(lamina_core::DType::IQ4_XS, nb, w, a, out) },
        TileKind::IqGridTiled(t) => unsafe { iq_tiled::<1>(t, nb, w, a, out) },
        TileKind::Q2KTiled => unsafe { iq_tiled::<2>(lamina_core::DType::Q2_K, nb, w, a, out) },
        TileKind::Q45KTiled(false) => unsafe {
            iq_tiled::<3>(lamina_core::DType::Q4_K, nb, w, a, out)
        },
        TileKind::Q3KTiled => unsafe { iq_tiled::<5>(lamina_core::DType::Q3_K, nb, w, a, out) },
        TileKind::Q45KTiled(true) => unsafe {
            iq_tiled::<4>(lamina_core::DType::Q5_K, nb, w, a, out)
        },
        TileKind::Q1(false) => run_tiles!(q1, 0, nb, w, a, out),
        TileKind::Q1(true) => run_tiles!(q1, 1, nb, w, a, out),
        // SAFETY (both): by this function's contract; the table limit holds.
        TileKind::Q4KGemv if q4k_pairs_cover(nb, w.len(), a.len()) => unsafe {
            q4k_pairs::<0>(nb, w, a, out)
        },
        TileKind::Q4KGemm if w.len().is_multiple_of(8) && a.len() > 1 => unsafe {
            q4k_chain8(nb, w, a, out)
        },
        TileKind::Q4KGemm if q4k_pairs_cover(nb, w.len(), a.len()) => unsafe {
            q4k_pairs::<1>(nb, w, a, out)
        },
        TileKind::Q4KGemv => run_tiles!(q4k, 0, nb, w, a, out),
        TileKind::Q4KGemm => run_tiles!(q4k, 1, nb, w, a, out),
        // SAFETY: by this function's contract; `w.len()` is a multiple of 8.
        TileKind::Q6KTiled if w.len().is_multiple_of(8) && a.len() > 1 => unsafe {
            q6k_chain8(nb, w, a, out)
        },
        TileKind::Q6KTiled => run_tiles!(q6k, 0, nb, w, a, out),
        TileKind::F16Tiny => run_tiles!(ftiny, 0, nb, w, a, out),
        TileKind::F32Tiny => run_tiles!(ftiny, 1, nb, w, a, out),
    }
}

/// The offset tiles with `vpdpbusd` (`V`: [`DOT_VNNI_EVEX`] or [`DOT_VNNI_VEX`]) for the
/// products they cover: Q4_0, Q5_0, Q4_1, Q5_1 as at the AVX2 tier, and Q8_0 through
/// [`offset_q0`] too (its unsigned-by-signed products would saturate `maddubs`, not
/// `vpdpbusd`); `false` (with `out` untouched) for any other product. Same bits as [`run`].
///
/// # Safety
/// AVX2/FMA/F16C and the `V` form of `vpdpbusd` present; every row holds `nb` blocks of
/// `kind`.
pub unsafe fn run_vnni<const V: u8>(
    kind: TileKind,
    nb: usize,
    w: &[&[u8]],
    a: &[&[u8]],
    out: &mut [f32],
) -> bool {
    if a.len() < 2 || !w.len().is_multiple_of(2) {
        return false;
    }
    let Some(wide) = table_size(nb, a.len()) else {
        return false;
    };
    macro_rules! sized {
        ($f:ident, $t:literal) => {
            // SAFETY: by this function's contract; the table limits hold (`table_size`).
            unsafe {
                if wide {
                    $f::<$t, WIDE_BLOCKS, { WIDE_A / 4 }, V>(nb, w, a, out)
                } else {
                    $f::<$t, MAX_BLOCKS, { MAX_A / 4 }, V>(nb, w, a, out)
                }
            }
        };
    }
    match kind {
        TileKind::Q0(0) => sized!(offset_q0, 0),
        TileKind::Q0(1) => sized!(offset_q0, 1),
        TileKind::Q0(2) => sized!(offset_q0, 2),
        TileKind::Q1(false) => sized!(offset_q1, 0),
        TileKind::Q1(true) => sized!(offset_q1, 1),
        _ => return false,
    }
    true
}

/// The f16 scales at `p[0] + off`, …, `p[3] + off` (rows past `N` read as zero) as 4 f32.
#[inline(always)]
pub(crate) unsafe fn scales4<const N: usize>(p: [*const u8; N], off: usize) -> __m128 {
    // SAFETY: 2 readable bytes at each `p[i] + off` (the caller's contract); F16C enabled by
    // the caller.
    unsafe {
        let mut bits = 0u64;
        for (i, pi) in p.iter().enumerate().take(4) {
            bits |= u64::from(pi.add(off).cast::<u16>().read_unaligned()) << (16 * i);
        }
        _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64))
    }
}

/// Blocks per row that the per-call scale tables hold (k up to 16384; they live on the
/// stack).
pub(crate) const MAX_BLOCKS: usize = 512;
/// Rows per side of one call the scale tables hold (`ops::mul_mat` passes 8 × 16; the
/// Q4_0/Q5_0/Q4_1/Q5_1 drivers build their weight tables per row pair and take any number
/// of weight rows).
pub(crate) const MAX_W: usize = 8;
pub(crate) const MAX_A: usize = 16;

/// The per-call tables of a wide call (`MatMul::wide_tiles`: up to 128 activation rows), for
/// rows of up to 64 blocks (k up to 2048): each weight row is decoded once for all of them.
pub(crate) const WIDE_BLOCKS: usize = 64;
pub(crate) const WIDE_A: usize = 128;

/// Which tables fit a call of `nb` blocks and `na` activation rows: `Some(false)` the
/// usual ones, `Some(true)` the wide ones, `None` neither.
fn table_size(nb: usize, na: usize) -> Option<bool> {
    if nb <= MAX_BLOCKS && na <= MAX_A {
        Some(false)
    } else if nb <= WIDE_BLOCKS && na <= WIDE_A {
        Some(true)
    } else {
        None
    }
}

/// `1.5·2^23` as f32 bits: `MAGIC + n` is the bit pattern of the f32 `1.5·2^23 + n` for
/// |n| < 2^22, so [`magic_f32!`] turns such a sum back into `n` exactly.
const MAGIC: i32 = 0x4B40_0000;

/// `f32(t - MAGIC)` of each lane (|t - MAGIC| < 2^22), exactly, as `cvtdq2ps` would give
/// it: the f32 with bits `t`, less `1.5·2^23` (same binade, so the subtraction is exact).
/// An integer add (any vector port) and an f32 subtract in place of the conversion: the
/// add can take the lanes' offset along (Q4_0/Q5_0's `128·Σx`), and on Golden Cove and
/// later cores the subtract runs on port 5's adder, beside the two multiply ports that the
/// `maddubs`/`madd`/FMA of every output keep busy.
macro_rules! magic_f32 {
    ($t:expr) => {{
        let t: __m256 = _mm256_castsi256_ps($t);
        let q: __m256;
        // Used inside the kernels' `unsafe` blocks (AVX enabled). Sound: reads the 32 bytes
        // of `MAGIC_F32`, a static. A memory operand rather than a broadcast register: the
        // 2 × 4 tiles use all 16 registers, and the compiler reloaded the constant with a
        // broadcast before each subtract.
        std::arch::asm!(
            "vsubps {q}, {t}, ymmword ptr [rip + {m}]",
            q = lateout(ymm_reg) q,
            t = in(ymm_reg) t,
            m = sym MAGIC_F32,
            options(pure, readonly, nostack, preserves_flags),
        );
        q
    }};
}

/// `1.5·2^23` in every lane, read by [`magic_f32!`] as a memory operand.
#[repr(align(32))]
// The field is read, by the asm through the static's symbol.
#[allow(dead_code)]
struct Lanes8([f32; 8]);
static MAGIC_F32: Lanes8 = Lanes8([12_582_912.0; 8]);

/// How the offset tiles ([`offset_q0`], [`offset_q1`]) form a lane's exact sum of 4 products
/// of unsigned by signed bytes: AVX2's `maddubs` + `madd` + add, or one `vpdpbusd`.
pub(crate) const DOT_AVX2: u8 = 0;
/// `vpdpbusd` in its EVEX form (AVX-512 VNNI + VL), on 256-bit registers.
pub(crate) const DOT_VNNI_EVEX: u8 = 1;
/// `vpdpbusd` in its VEX form (AVX-VNNI: Alder Lake and later client cores, Zen 5).
pub(crate) const DOT_VNNI_VEX: u8 = 2;

/// `acc + Σ u·s` per i32 lane: the 4 unsigned bytes of `u` times the 4 signed bytes of `s`,
/// exactly, where no pair sum of `maddubs` saturates (true of every caller's operands: see
/// each kernel), so every form gives the same integers. The VNNI forms are written as
/// assembly so that the kernels keep the AVX2 tier's target features (and the one build runs
/// everywhere): the caller only takes `V != DOT_AVX2` where the CPU has that instruction.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn lane_dot<const V: u8>(acc: __m256i, u: __m256i, s: __m256i, ones: __m256i) -> __m256i {
    // SAFETY: register-only; AVX2 enabled by the caller, and with `V != DOT_AVX2` the form of
    // `vpdpbusd` it names is present (the caller's contract).
    unsafe {
        let mut acc = acc;
        macro_rules! dpbusd {
            ($template:literal) => {
                std::arch::asm!(
                    $template,
                    a = inout(ymm_reg) acc,
                    u = in(ymm_reg) u,
                    s = in(ymm_reg) s,
                    options(pure, nomem, nostack, preserves_flags),
                )
            };
        }
        match V {
            DOT_VNNI_EVEX => dpbusd!("vpdpbusd {a}, {u}, {s}"),
            DOT_VNNI_VEX => dpbusd!("{{vex}} vpdpbusd {a}, {u}, {s}"),
            _ => acc = _mm256_add_epi32(acc, _mm256_madd_epi16(ones, _mm256_maddubs_epi16(u, s))),
        }
        acc
    }
}

/// Activation blocks (rows × blocks) that [`offset_q0`] offsets to unsigned once per call
/// (a 64 KiB table on the stack).
const BIAS_BLOCKS: usize = 2048;

/// Blocks whose scale products a kernel computes ahead, in one pass, before it reads them
/// back by broadcast loads (right after their store they would wait on it).
const CHUNK: usize = 32;

/// Runs a 2 × `$rn` tile (`$rn` in 1..=4): `$call` sees `$apn`, the first `$rn` pointers of
/// `$ap` as an array of that length (so the kernel's row count is inferred from it), and its
/// `[[f32; rn]; rows]` result goes to `$out[($j0 + j) * $nw + $col + i]`.
macro_rules! tile_rows {
    ($rn:expr, $ap:expr, |$apn:ident| $call:expr, $out:expr, $nw:expr, $j0:expr, $col:expr) => {
        match $rn {
            1 => tile_rows!(@n 1, $ap, $apn, $call, $out, $nw, $j0, $col),
            2 => tile_rows!(@n 2, $ap, $apn, $call, $out, $nw, $j0, $col),
            3 => tile_rows!(@n 3, $ap, $apn, $call, $out, $nw, $j0, $col),
            _ => tile_rows!(@n 4, $ap, $apn, $call, $out, $nw, $j0, $col),
        }
    };
    (@n $n:literal, $ap:expr, $apn:ident, $call:expr, $out:expr, $nw:expr, $j0:expr, $col:expr) => {{
        let mut $apn = [std::ptr::null(); $n];
        $apn.copy_from_slice(&$ap[..$n]);
        let r = $call;
        for (i, ri) in r.iter().enumerate() {
            for (j, &v) in ri.iter().enumerate() {
                $out[($j0 + j) * $nw + $col + i] = v;
            }
        }
    }};
}

/// Q4_0 (`T == 0`) / Q5_0 (`T == 1`) over the whole product, in tiles of 2 weight rows ×
/// up to 4 activation rows ([`q0u`]); also Q8_0 (`T == 2`) with `vpdpbusd` (`V`, see
/// [`lane_dot`]). Once per call, not once per tile: the block scales are converted to f32
/// tables, and each weight row is decoded to its signed values. About 1.15× the 4×2
/// sign-trick tiles on Gemma 3's prompt at this tier.
///
/// # Safety
/// AVX2/FMA/F16C present, and the `V` form of `vpdpbusd`; `T != 2` unless `V != DOT_AVX2`
/// (Q8_0's products would saturate `maddubs`); every row holds `nb <= NB` blocks; `w.len()`
/// is even (any number of row pairs: their scale table is built per pair); `a.len() <= 4 *
/// NG`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn offset_q0<const T: u8, const NB: usize, const NG: usize, const V: u8>(
    nb: usize,
    w: &[&[u8]],
    a: &[&[u8]],
    out: &mut [f32],
) {
    const RM: usize = 2;
    let bx = q0_bytes(T);
    let na = a.len();
    // Tables, uninitialised until written (only `nb` entries of a row or group are
    // written and read): the weight scales of a group of `RM` rows (as 4 lanes), the
    // activation scale of a row, per block.
    let mut tw = std::mem::MaybeUninit::<[__m128; NB]>::uninit();
    let tw = tw.as_mut_ptr().cast::<__m128>();
    let mut ta: [std::mem::MaybeUninit<[__m128; NB]>; NG] =
        [const { std::mem::MaybeUninit::uninit() }; NG];
    // SAFETY: the caller's contract; entries 0..nb of a table are written before they are
    // read.
    unsafe {
        for (g, t) in ta.iter_mut().enumerate().take(na.div_ceil(4)) {
            let rows: [*const u8; 4] = crate::kernels::tile::row_ptrs(a, 4 * g);
            let t = t.as_mut_ptr().cast::<__m128>();
            for b in 0..nb {
                t.add(b).write(scales4(rows, b * 34));
            }
        }
        // The group's weight blocks as unsigned bytes, decoded once for all the call's
        // activation rows.
        // Per row and block: the signed values, then `128·Σ` of each lane's 4 values.
        let mut dec: std::mem::MaybeUninit<[[[__m256i; 2]; NB]; RM]> =
            std::mem::MaybeUninit::uninit();
        let dec = dec.as_mut_ptr().cast::<[__m256i; 2]>();
        let ov = _mm256_set1_epi8(if T == 0 { 8 } else { 16 });
        let bias = _mm256_set1_epi8(-128);
        let ones = _mm256_set1_epi16(1);
        // The activation blocks offset to unsigned (`y + 128`) once per call, not once per
        // weight-row group, in chunks of rows that fit the table (a multiple of 4); with
        // fewer than 16 rows a chunk, each group offsets them as it reads them instead.
        let per_chunk = (BIAS_BLOCKS / nb) / 4 * 4;
        let chunk = if nb * na <= BIAS_BLOCKS {
            na
        } else if per_chunk >= 16 {
            per_chunk
        } else {
            0
        };
        let mut yb = std::mem::MaybeUninit::<[__m256i; BIAS_BLOCKS]>::uninit();
        let yb = yb.as_mut_ptr().cast::<__m256i>();
        let mut c0 = 0;
        while c0 < na {
            let c1 = if chunk == 0 { na } else { na.min(c0 + chunk) };
            if chunk > 0 {
                for j in c0..c1 {
                    for b in 0..nb {
                        let y = _mm256_xor_si256(loadu(a[j].as_ptr().add(b * 34 + 2)), bias);
                        yb.add((j - c0) * nb + b).write(y);
                    }
                }
            }
            for g in 0..w.len() / RM {
                crate::kernels::prefetch_rows(&w[RM * g..RM * g + RM]);
                let rows: [*const u8; RM] = crate::kernels::tile::row_ptrs(w, RM * g);
                for b in 0..nb {
                    tw.add(b).write(scales4(rows, b * bx));
                }
                for (i, row) in rows.iter().enumerate() {
                    for b in 0..nb {
                        let x = if T == 2 {
                            loadu(row.add(b * bx + 2))
                        } else {
                            _mm256_sub_epi8(q0_unsigned::<T>(row.add(b * bx)), ov)
                        };
                        let corr = _mm256_madd_epi16(_mm256_maddubs_epi16(bias, x), ones);
                        let magic_corr = _mm256_sub_epi32(_mm256_set1_epi32(MAGIC), corr);
                        dec.add(i * NB + b).write([x, magic_corr]);
                    }
                }
                let mut wp = [std::ptr::null::<[__m256i; 2]>(); RM];
                for (i, p) in wp.iter_mut().enumerate() {
                    *p = dec.add(i * NB).cast_const();
                }
                let sw = std::slice::from_raw_parts(tw.cast_const(), nb);
                let mut j0 = c0;
                while j0 < c1 {
                    let rn = (c1 - j0).min(4);
                    // Plain loops, not `from_fn` closures: those would be calls here (a
                    // closure does not inherit the target features).
                    let mut ap = [std::ptr::null::<u8>(); 4];
                    for j in 0..rn {
                        ap[j] = if chunk > 0 {
                            yb.add((j0 + j - c0) * nb).cast::<u8>().cast_const()
                        } else {
                            a[j0 + j].as_ptr()
                        };
                    }
                    let sa = std::slice::from_raw_parts(ta[j0 / 4].as_ptr().cast::<__m128>(), nb);
                    tile_rows!(
                        rn,
                        ap,
                        |apn| if chunk > 0 {
                            q0u::<T, true, V, _>(nb, wp, apn, sw, sa)
                        } else {
                            q0u::<T, false, V, _>(nb, wp, apn, sw, sa)
                        },
                        out,
                        w.len(),
                        j0,
                        RM * g
                    );
                    j0 += rn;
                }
            }
            c0 = c1;
        }
    }
}

/// Superblocks per row (k up to 8192) for which [`q4k_pairs`] decodes a pair of weight
/// rows once per call, into a table on the stack.
pub(crate) const Q4K_MAX_BLOCKS: usize = 32;

fn q4k_pairs_cover(nb: usize, nw: usize, na: usize) -> bool {
    nb <= Q4K_MAX_BLOCKS && nw.is_multiple_of(2) && na > 1
}

/// One Q4_K superblock of a weight row, decoded once per call for the tiles.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Q4kDecoded {
    /// Sub-block `s`'s 32 values (sub-blocks `2k`, `2k + 1`: the low and high nibbles of
    /// the k-th 32 bytes, so `q[2k..2k + 2]` is one 512-bit pair).
    pub q: [__m256i; 8],
    /// Sub-block `s`'s scale in all 16 i16 lanes.
    pub scl: [__m256i; 8],
    /// The 8 mins as i16.
    pub mins: __m128i,
    pub d: f32,
    pub dmin: f32,
}

/// Decodes the Q4_K superblock at `xb`.
///
/// # Safety
/// 144 readable bytes at `xb`; AVX2/F16C enabled by the caller.
#[inline(always)]
pub(crate) unsafe fn decode_q4k(xb: *const u8) -> Q4kDecoded {
    // SAFETY: by the caller's contract.
    unsafe {
        let m4 = _mm256_set1_epi8(0xF);
        let (sc, mn) =
            crate::kernels::dot::q4k_scales_mins_pub(std::slice::from_raw_parts(xb.add(4), 12));
        let mut q = [_mm256_setzero_si256(); 8];
        let mut scl = [_mm256_setzero_si256(); 8];
        for k in 0..4 {
            let bits = loadu(xb.add(16 + 32 * k));
            q[2 * k] = _mm256_and_si256(bits, m4);
            q[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        }
        for (v, &c) in scl.iter_mut().zip(&sc) {
            *v = _mm256_set1_epi16(i16::from(c));
        }
        Q4kDecoded {
            q,
            scl,
            mins: _mm_cvtepu8_epi16(_mm_loadl_epi64(mn.as_ptr() as *const __m128i)),
            d: ld_f16_last(xb),
            dmin: ld_f16_last(xb.add(2)),
        }
    }
}

/// A Q8_K activation superblock as the repacked-Q4_K kernels read it: `d`, the sums of
/// pairs of 16-value bsums (wrapping i16), and the quants.
///
/// # Safety
/// 292 readable bytes at `yb`; AVX2 enabled by the caller.
#[inline(always)]
pub(crate) unsafe fn q8k_act(yb: *const u8) -> (f32, __m128i, *const u8) {
    // SAFETY: by the caller's contract.
    unsafe {
        let q8s = _mm_hadd_epi16(
            _mm_loadu_si128(yb.add(260) as *const __m128i),
            _mm_loadu_si128(yb.add(276) as *const __m128i),
        );
        (ld_f32(yb), q8s, yb.add(4))
    }
}

/// The repacked-Q4_K kernels over the whole product in tiles of 2 weight rows × up to 4
/// activation rows ([`q4k2`]); each pair of weight rows is decoded once per call (values,
/// scales, mins), not once per tile.
///
/// # Safety
/// As [`run`]; `q4k_pairs_cover` holds.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_pairs<const G: u8>(nb: usize, w: &[&[u8]], a: &[&[u8]], out: &mut [f32]) {
    let na = a.len();
    let mut dec: std::mem::MaybeUninit<[[Q4kDecoded; Q4K_MAX_BLOCKS]; 2]> =
        std::mem::MaybeUninit::uninit();
    let dec = dec.as_mut_ptr().cast::<Q4kDecoded>();
    // SAFETY: the caller's contract; entries 0..nb of a row's table are written before they
    // are read.
    unsafe {
        let dp = [dec.cast_const(), dec.add(Q4K_MAX_BLOCKS).cast_const()];
        for i0 in (0..w.len()).step_by(2) {
            for i in 0..2 {
                let row = w[i0 + i].as_ptr();
                for b in 0..nb {
                    dec.add(i * Q4K_MAX_BLOCKS + b)
                        .write(decode_q4k(row.add(b * 144)));
                }
            }
            let mut j0 = 0;
            while j0 < na {
                let rn = (na - j0).min(4);
                macro_rules! k {
                    ($n:literal) => {{
                        let r = q4k2::<G, $n>(nb, dp, crate::kernels::tile::row_ptrs(a, j0));
                        for i in 0..2 {
                            for j in 0..$n {
                                out[(j0 + j) * w.len() + i0 + i] = r[i][j];
                            }
                        }
                    }};
                }
                match rn {
                    1 => k!(1),
                    2 => k!(2),
                    3 => k!(3),
                    _ => k!(4),
                }
                j0 += rn;
            }
        }
    }
}

/// One Q4_K superblock of 8 weight rows, transposed for [`q4k_chain8`]: lane `r` (32 bits)
/// of a vector is weight row `r`.
#[repr(C, align(32))]
struct Q4kBlock8 {
    /// `q[s][t]`: values `4t..4t + 4` of sub-block `s` of each row (bytes 0..15).
    q: [[__m256i; 8]; 8],
    /// Sub-block `s`'s scale of row `r` in i16 lanes `2r` and `2r + 1`.
    scl: [__m256i; 8],
    /// Sub-blocks `2k`, `2k + 1`: the mins of row `r` in i16 lanes `2r`, `2r + 1`.
    mins: [__m256i; 4],
    d: __m256,
    dmin: __m256,
}

/// `v[r]` lane `t` → `out[t]` lane `r` (an 8×8 transpose of 32-bit lanes).
#[inline(always)]
pub(crate) unsafe fn transpose_8x8_epi32(v: [__m256i; 8]) -> [__m256i; 8] {
    // SAFETY: register-only intrinsics; AVX2 enabled by the caller.
    unsafe {
        let t0 = _mm256_unpacklo_epi32(v[0], v[1]);
        let t1 = _mm256_unpackhi_epi32(v[0], v[1]);
        let t2 = _mm256_unpacklo_epi32(v[2], v[3]);
        let t3 = _mm256_unpackhi_epi32(v[2], v[3]);
        let t4 = _mm256_unpacklo_epi32(v[4], v[5]);
        let t5 = _mm256_unpackhi_epi32(v[4], v[5]);
        let t6 = _mm256_unpacklo_epi32(v[6], v[7]);
        let t7 = _mm256_unpackhi_epi32(v[6], v[7]);
        let u0 = _mm256_unpacklo_epi64(t0, t2);
        let u1 = _mm256_unpackhi_epi64(t0, t2);
        let u2 = _mm256_unpacklo_epi64(t1, t3);
        let u3 = _mm256_unpackhi_epi64(t1, t3);
        let u4 = _mm256_unpacklo_epi64(t4, t6);
        let u5 = _mm256_unpackhi_epi64(t4, t6);
        let u6 = _mm256_unpacklo_epi64(t5, t7);
        let u7 = _mm256_unpackhi_epi64(t5, t7);
        [
            _mm256_permute2x128_si256(u0, u4, 0x20),
            _mm256_permute2x128_si256(u1, u5, 0x20),
            _mm256_permute2x128_si256(u2, u6, 0x20),
            _mm256_permute2x128_si256(u3, u7, 0x20),
            _mm256_permute2x128_si256(u0, u4, 0x31),
            _mm256_permute2x128_si256(u1, u5, 0x31),
            _mm256_permute2x128_si256(u2, u6, 0x31),
            _mm256_permute2x128_si256(u3, u7, 0x31),
        ]
    }
}

/// Decodes superblock `b` of the 8 weight rows `w` into `out`.
#[inline(always)]
unsafe fn decode_q4k8(w: [*const u8; 8], b: usize, out: &mut Q4kBlock8) {
    // SAFETY: each row holds block `b` (the caller's contract); AVX2/F16C enabled by the
    // caller.
    unsafe {
        let m4 = _mm256_set1_epi8(0xF);
        let xb: [*const u8; 8] = std::array::from_fn(|r| w[r].add(b * 144));
        for k in 0..4 {
            // Row r's 32 bytes of sub-blocks 2k (low nibbles) and 2k + 1 (high), as 8 words.
            let mut v = [_mm256_setzero_si256(); 8];
            for r in 0..8 {
                v[r] = loadu(xb[r].add(16 + 32 * k));
            }
            let t = transpose_8x8_epi32(v);
            for (u, tu) in t.iter().enumerate() {
                out.q[2 * k][u] = _mm256_and_si256(*tu, m4);
                out.q[2 * k + 1][u] = _mm256_and_si256(_mm256_srli_epi16(*tu, 4), m4);
            }
        }
        let mut sc = [[0i32; 8]; 8];
        let mut mn = [[0i32; 8]; 4];
        let mut d = [0u16; 8];
        let mut dmin = [0u16; 8];
        for r in 0..8 {
            let (scr, mnr) = crate::kernels::dot::q4k_scales_mins_pub(std::slice::from_raw_parts(
                xb[r].add(4),
                12,
            ));
            for s in 0..8 {
                sc[s][r] = i32::from(scr[s]) * 0x1_0001;
            }
            for k in 0..4 {
                mn[k][r] = i32::from(mnr[2 * k]) | i32::from(mnr[2 * k + 1]) << 16;
            }
            d[r] = xb[r].cast::<u16>().read_unaligned();
            dmin[r] = xb[r].add(2).cast::<u16>().read_unaligned();
        }
        for s in 0..8 {
            out.scl[s] = _mm256_loadu_si256(sc[s].as_ptr().cast());
        }
        for k in 0..4 {
            out.mins[k] = _mm256_loadu_si256(mn[k].as_ptr().cast());
        }
        out.d = _mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr().cast()));
        out.dmin = _mm256_cvtph_ps(_mm_loadu_si128(dmin.as_ptr().cast()));
    }
}

/// The repacked Q4_K gemm in groups of 8 weight rows with the rows in lanes (as llama.cpp's
/// `ggml_gemm_q4_K_8x8_q8_K`): a broadcast 4-value slice of an activation row meets the 8
/// rows' values in one `maddubs`, the 8 slices of a sub-block add up in i16 (|sum| ≤ 8 · 2
/// · 15 · 128 < 2^15) and meet the rows' scales in one `madd`: no horizontal sums. Each lane
/// then takes [`q4k2`]'s float steps (per sub-block pair: `fma(sum, d·yd)`, the mins
/// likewise), so every output has the same bits. A block of the 8 rows is decoded once per
/// call.
///
/// # Safety
/// As [`run`]; `w.len()` is a multiple of 8.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_chain8(nb: usize, w: &[&[u8]], a: &[&[u8]], out: &mut [f32]) {
    const RN: usize = 4;
    const JC: usize = 16;
    let na = a.len();
    let nw = w.len();
    // SAFETY: the caller's contract (rows hold `nb` blocks).
    unsafe {
        let mut dec = std::mem::MaybeUninit::<Q4kBlock8>::uninit();
        let dec = &mut *dec.as_mut_ptr();
        for g in (0..nw).step_by(8) {
            let wp: [*const u8; 8] = crate::kernels::tile::row_ptrs(w, g);
            crate::kernels::prefetch_rows(&w[g..(g + 8).min(nw)]);
            for j0 in (0..na).step_by(JC) {
                let jn = (na - j0).min(JC);
                let mut acc = [[_mm256_setzero_ps(); 2]; JC];
                for b in 0..nb {
                    decode_q4k8(wp, b, dec);
                    let mut j = 0;
                    while j < jn {
                        let rn = (jn - j).min(RN);
                        let ap: [*const u8; RN] =
                            std::array::from_fn(|q| a[j0 + j + q.min(rn - 1)].as_ptr());
                        let mut t = [acc[j], acc[j + 1], acc[j + 2], acc[j + 3]];
                        match rn {
                            1 => q4k8_block::<1>(dec, b, &ap, &mut t),
                            2 => q4k8_block::<2>(dec, b, &ap, &mut t),
                            3 => q4k8_block::<3>(dec, b, &ap, &mut t),
                            _ => q4k8_block::<4>(dec, b, &ap, &mut t),
                        }
                        acc[j..j + rn].copy_from_slice(&t[..rn]);
                        j += rn;
                    }
                }
                for (j, aj) in acc.iter().enumerate().take(jn) {
                    let o = out.as_mut_ptr().add((j0 + j) * nw + g);
                    _mm256_storeu_ps(o, _mm256_sub_ps(aj[0], aj[1]));
                }
            }
        }
    }
}

/// One superblock of [`q4k_chain8`] for `N` activation rows: `acc[j] = [sum, min sum]`.
#[inline(always)]
unsafe fn q4k8_block<const N: usize>(
    dec: &Q4kBlock8,
    b: usize,
    a: &[*const u8; 4],
    acc: &mut [[__m256; 2]; 4],
) {
    // SAFETY: activation rows hold block `b` (the caller's contract); AVX2/FMA enabled by
    // the caller.
    unsafe {
        let mut yq = [std::ptr::null::<u8>(); N];
        let mut dd = [_mm256_setzero_ps(); N];
        let mut ddm = [_mm256_setzero_ps(); N];
        let mut q8s = [[0i32; 4]; N];
        for j in 0..N {
            let (yd, s, q) = q8k_act(a[j].add(b * 292));
            yq[j] = q;
            let ydv = _mm256_set1_ps(yd);
            dd[j] = _mm256_mul_ps(dec.d, ydv);
            ddm[j] = _mm256_mul_ps(dec.dmin, ydv);
            _mm_storeu_si128(q8s[j].as_mut_ptr().cast(), s);
        }
        for k in 0..4 {
            let mut si = [_mm256_setzero_si256(); N];
            for s in 2 * k..2 * k + 2 {
                let mut h = [_mm256_setzero_si256(); N];
                for t in 0..8 {
                    let wv = dec.q[s][t];
                    for j in 0..N {
                        let y = _mm256_set1_epi32(
                            yq[j].add(32 * s + 4 * t).cast::<i32>().read_unaligned(),
                        );
                        h[j] = _mm256_add_epi16(h[j], _mm256_maddubs_epi16(wv, y));
                    }
                }
                for j in 0..N {
                    si[j] = _mm256_add_epi32(si[j], _mm256_madd_epi16(h[j], dec.scl[s]));
                }
            }
            for j in 0..N {
                acc[j][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si[j]), dd[j], acc[j][0]);
                let m = _mm256_madd_epi16(dec.mins[k], _mm256_set1_epi32(q8s[j][k]));
                acc[j][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), ddm[j], acc[j][1]);
            }
        }
    }
}

/// One Q6_K superblock of 8 weight rows, transposed for [`q6k_chain8`]: lane `r` (32 bits)
/// of a vector is weight row `r`.
#[repr(C, align(32))]
struct Q6kBlock8 {
    /// `q[c][t]`: values `32c + 4t..32c + 4t + 4` of each row, unsigned (0..63).
    q: [[__m256i; 8]; 8],
    /// Sub-block `s`'s scale of row `r` in i16 lanes `2r` and `2r + 1`.
    scl: [__m256i; 16],
    /// Sub-blocks `2p`, `2p + 1`: row `r`'s scales in i16 lanes `2r`, `2r + 1`.
    pairs: [__m256i; 8],
    d: __m256,
}

/// Decodes superblock `b` of the 8 weight rows `w` into `out`.
#[inline(always)]
unsafe fn decode_q6k8(w: [*const u8; 8], b: usize, out: &mut Q6kBlock8) {
    // SAFETY: each row holds block `b` (the caller's contract); AVX2/F16C enabled by the
    // caller.
    unsafe {
        let m3 = _mm256_set1_epi8(3);
        let m15 = _mm256_set1_epi8(15);
        let xb: [*const u8; 8] = std::array::from_fn(|r| w[r].add(b * 210));
        // Row r's values 32c.. (c = 4h + k) as `q6k` decodes them.
        let mut rows = [[_mm256_setzero_si256(); 8]; 8];
        for r in 0..8 {
            for h in 0..2 {
                let q4bits1 = loadu(xb[r].add(64 * h));
                let q4bits2 = loadu(xb[r].add(64 * h + 32));
                let q4bits_h = loadu(xb[r].add(128 + 32 * h));
                let q4h_0 = _mm256_slli_epi16(_mm256_and_si256(q4bits_h, m3), 4);
                let q4h_1 = _mm256_slli_epi16(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(12)), 2);
                let q4h_2 = _mm256_and_si256(q4bits_h, _mm256_set1_epi8(48));
                let q4h_3 = _mm256_srli_epi16(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(-64)), 2);
                rows[r][4 * h] = _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0);
                rows[r][4 * h + 1] = _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1);
                rows[r][4 * h + 2] =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits1, 4), m15), q4h_2);
                rows[r][4 * h + 3] =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits2, 4), m15), q4h_3);
            }
        }
        for c in 0..8 {
            out.q[c] = transpose_8x8_epi32(std::array::from_fn(|r| rows[r][c]));
        }
        let mut sc = [[0i32; 8]; 16];
        let mut pr = [[0i32; 8]; 8];
        let mut d = [0u16; 8];
        for r in 0..8 {
            let scales = xb[r].add(192).cast::<i8>();
            for s in 0..16 {
                let v = i32::from(*scales.add(s)) & 0xFFFF;
                sc[s][r] = v | v << 16;
            }
            for p in 0..8 {
                pr[p][r] = (i32::from(*scales.add(2 * p)) & 0xFFFF)
                    | i32::from(*scales.add(2 * p + 1)) << 16;
            }
            d[r] = xb[r].add(208).cast::<u16>().read_unaligned();
        }
        for s in 0..16 {
            out.scl[s] = _mm256_loadu_si256(sc[s].as_ptr().cast());
        }
        for p in 0..8 {
            out.pairs[p] = _mm256_loadu_si256(pr[p].as_ptr().cast());
        }
        out.d = _mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr().cast()));
    }
}

/// The tiled Q6_K product in groups of 8 weight rows with the rows in lanes, like
/// [`q4k_chain8`]: a broadcast 4-value slice meets the 8 rows' unsigned values (0..63) in one
/// `maddubs`, two slices add up in i16 (|sum| ≤ 2 · 2 · 63 · 128 < 2^15) and meet the
/// rows' scales in a `madd`; the 32 · scale · bsum offset comes out once per block. Each lane
/// then takes [`q6k`]'s float steps (`acc = fma(d · sum, yd, acc)`), so every output has
/// the same bits. A block of the 8 rows is decoded once per call.
///
/// # Safety
/// As [`run`]; `w.len()` is a multiple of 8.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_chain8(nb: usize, w: &[&[u8]], a: &[&[u8]], out: &mut [f32]) {
    const RN: usize = 4;
    const JC: usize = 128;
    let na = a.len();
    let nw = w.len();
    // SAFETY: the caller's contract (rows hold `nb` blocks).
    unsafe {
        let mut dec = std::mem::MaybeUninit::<Q6kBlock8>::uninit();
        let dec = &mut *dec.as_mut_ptr();
        let mut acc = [_mm256_setzero_ps(); JC];
        for g in (0..nw).step_by(8) {
            let wp: [*const u8; 8] = crate::kernels::tile::row_ptrs(w, g);
            crate::kernels::prefetch_rows(&w[g..(g + 8).min(nw)]);
            for j0 in (0..na).step_by(JC) {
                let jn = (na - j0).min(JC);
                acc[..jn].fill(_mm256_setzero_ps());
                for b in 0..nb {
                    decode_q6k8(wp, b, dec);
                    let mut j = 0;
                    while j < jn {
                        let rn = (jn - j).min(RN);
                        let ap: [*const u8; RN] =
                            std::array::from_fn(|q| a[j0 + j + q.min(rn - 1)].as_ptr());
                        let mut t = [acc[j], acc[j + 1], acc[j + 2], acc[j + 3]];
                        match rn {
                            1 => q6k8_block::<1>(dec, b, &ap, &mut t),
                            2 => q6k8_block::<2>(dec, b, &ap, &mut t),
                            3 => q6k8_block::<3>(dec, b, &ap, &mut t),
                            _ => q6k8_block::<4>(dec, b, &ap, &mut t),
                        }
                        acc[j..j + rn].copy_from_slice(&t[..rn]);
                        j += rn;
                    }
                }
                for (j, aj) in acc.iter().enumerate().take(jn) {
                    _mm256_storeu_ps(out.as_mut_ptr().add((j0 + j) * nw + g), *aj);
                }
            }
        }
    }
}

/// One superblock of [`q6k_chain8`] for `N` activation rows.
#[inline(always)]
unsafe fn q6k8_block<const N: usize>(
    dec: &Q6kBlock8,
    b: usize,
    a: &[*const u8; 4],
    acc: &mut [__m256; 4],
) {
    // SAFETY: activation rows hold block `b` (the caller's contract); AVX2/FMA enabled by
    // the caller.
    unsafe {
        let mut yb = [std::ptr::null::<u8>(); N];
        let mut si = [_mm256_setzero_si256(); N];
        let mut corr = [_mm256_setzero_si256(); N];
        for j in 0..N {
            yb[j] = a[j].add(b * 292);
        }
        let y = |j: usize, i: usize| {
            _mm256_set1_epi32(yb[j].add(4 + 4 * i).cast::<i32>().read_unaligned())
        };
        for c in 0..8 {
            for half in 0..4 {
                // Slices 2·half, 2·half + 1 of chunk c: sub-block 2c + half / 2.
                let w0 = dec.q[c][2 * half];
                let w1 = dec.q[c][2 * half + 1];
                let scl = dec.scl[2 * c + half / 2];
                for j in 0..N {
                    let h = _mm256_add_epi16(
                        _mm256_maddubs_epi16(w0, y(j, 8 * c + 2 * half)),
                        _mm256_maddubs_epi16(w1, y(j, 8 * c + 2 * half + 1)),
                    );
                    si[j] = _mm256_add_epi32(si[j], _mm256_madd_epi16(h, scl));
                }
            }
        }
        for p in 0..8 {
            for j in 0..N {
                let bs = _mm256_set1_epi32(yb[j].add(260 + 4 * p).cast::<i32>().read_unaligned());
                corr[j] = _mm256_add_epi32(corr[j], _mm256_madd_epi16(dec.pairs[p], bs));
            }
        }
        for j in 0..N {
            let s = _mm256_sub_epi32(si[j], _mm256_slli_epi32(corr[j], 5));
            let res = _mm256_mul_ps(dec.d, _mm256_cvtepi32_ps(s));
            acc[j] = _mm256_fmadd_ps(res, _mm256_set1_ps(ld_f32(yb[j])), acc[j]);
        }
    }
}

/// [`q4k`] for 2 decoded weight rows × `RN` activation rows, with the float steps on
/// 8-lane vectors: the per-pair sums are transposed into lanes (output `(i, j)` in lane
/// `4(j % 2) + 2(j / 2) + i`), and each lane takes the scalar kernel's FMAs in order.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k2<const G: u8, const RN: usize>(
    nb: usize,
    dp: [*const Q4kDecoded; 2],
    a: [*const u8; RN],
) -> [[f32; RN]; 2] {
    // SAFETY: the tables and rows hold `nb` blocks (the caller's contract).
    unsafe {
        let mut acc = _mm256_setzero_ps();
        let mut acc_min = _mm256_setzero_ps();
        let row_of = _mm256_setr_epi32(0, 1, 0, 1, 0, 1, 0, 1);
        let col_of = _mm256_setr_epi32(0, 0, 2, 2, 1, 1, 3, 3);
        for ib in 0..nb {
            let mut yd = [0f32; 4];
            let mut q8s = [_mm_setzero_si128(); RN];
            let mut yq = [std::ptr::null::<u8>(); RN];
            for j in 0..RN {
                (yd[j], q8s[j], yq[j]) = q8k_act(a[j].add(ib * 292));
            }
            // s[i][j]: the 4 sub-block-pair sums; m[i][j]: the 4 min sums.
            let mut s = [[_mm_setzero_si128(); 4]; 2];
            let mut m = [[_mm_setzero_si128(); 4]; 2];
            let mut dx = [0f32; 2];
            let mut dm = [0f32; 2];
            for i in 0..2 {
                let ds = &*dp[i].add(ib);
                dx[i] = ds.d;
                dm[i] = ds.dmin;
                for j in 0..RN {
                    m[i][j] = _mm_madd_epi16(ds.mins, q8s[j]);
                    let mut p = [_mm256_setzero_si256(); 4];
                    for (k, pk) in p.iter_mut().enumerate() {
                        let q8l = loadu(yq[j].add(64 * k));
                        let q8h = loadu(yq[j].add(64 * k + 32));
                        let pl = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(ds.q[2 * k], q8l),
                            ds.scl[2 * k],
                        );
                        let ph = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(ds.q[2 * k + 1], q8h),
                            ds.scl[2 * k + 1],
                        );
                        *pk = _mm256_add_epi32(pl, ph);
                    }
                    let h01 = _mm256_hadd_epi32(p[0], p[1]);
                    let h23 = _mm256_hadd_epi32(p[2], p[3]);
                    let h = _mm256_hadd_epi32(h01, h23);
                    s[i][j] =
                        _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
                }
            }
            let r = transpose_2x4(s);
            let rm = transpose_2x4(m);
            let ydv =
                _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(yd.as_ptr())), col_of);
            let dxv = _mm256_permutevar8x32_ps(
                _mm256_castps128_ps256(_mm_setr_ps(dx[0], dx[1], 0.0, 0.0)),
                row_of,
            );
            let dmv = _mm256_permutevar8x32_ps(
                _mm256_castps128_ps256(_mm_setr_ps(dm[0], dm[1], 0.0, 0.0)),
                row_of,
            );
            // d·yd and dmin·yd per lane, one rounding each.
            let dd = _mm256_mul_ps(dxv, ydv);
            let ddm = _mm256_mul_ps(dmv, ydv);
            if G == 0 {
                let sum =
                    _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
                let smin = _mm256_add_epi32(
                    _mm256_add_epi32(rm[0], rm[1]),
                    _mm256_add_epi32(rm[2], rm[3]),
                );
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), dd, acc);
                acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(smin), ddm, acc_min);
            } else {
                for k in 0..4 {
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(r[k]), dd, acc);
                    acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(rm[k]), ddm, acc_min);
                }
            }
        }
        let mut va = [0f32; 8];
        let mut vm = [0f32; 8];
        _mm256_storeu_ps(va.as_mut_ptr(), acc);
        _mm256_storeu_ps(vm.as_mut_ptr(), acc_min);
        let mut out = [[0f32; RN]; 2];
        for i in 0..2 {
            for j in 0..RN {
                let l = 4 * (j % 2) + 2 * (j / 2) + i;
                out[i][j] = va[l] - vm[l];
            }
        }
        out
    }
}

/// `v[i][j]` (4 lanes, k) to `out[k]` lane `4(j % 2) + 2(j / 2) + i`: a 4×4 transpose
/// inside each 128-bit half of `[v[0][0] | v[0][1]]`, `[v[1][0] | v[1][1]]`,
/// `[v[0][2] | v[0][3]]`, `[v[1][2] | v[1][3]]`.
#[inline(always)]
unsafe fn transpose_2x4(v: [[__m128i; 4]; 2]) -> [__m256i; 4] {
    // SAFETY: register-only intrinsics; AVX2 enabled by the caller.
    unsafe {
        let a = _mm256_set_m128i(v[0][1], v[0][0]);
        let b = _mm256_set_m128i(v[1][1], v[1][0]);
        let c = _mm256_set_m128i(v[0][3], v[0][2]);
        let d = _mm256_set_m128i(v[1][3], v[1][2]);
        let t0 = _mm256_unpacklo_epi32(a, b);
        let t1 = _mm256_unpackhi_epi32(a, b);
        let t2 = _mm256_unpacklo_epi32(c, d);
        let t3 = _mm256_unpackhi_epi32(c, d);
        [
            _mm256_unpacklo_epi64(t0, t2),
            _mm256_unpackhi_epi64(t0, t2),
            _mm256_unpacklo_epi64(t1, t3),
            _mm256_unpackhi_epi64(t1, t3),
        ]
    }
}

/// The 32 values of a Q4_0 (`T == 0`) or Q5_0 block plus 8 or 16: unsigned bytes.
#[inline(always)]
unsafe fn q0_unsigned<const T: u8>(xb: *const u8) -> __m256i {
    // SAFETY: `xb` points at a whole block; AVX2 enabled by the caller.
    unsafe {
        if T == 0 {
            bytes_from_nibbles_32(xb.add(2))
        } else {
            let qh = xb.add(2).cast::<u32>().read_unaligned();
            let hi = _mm256_and_si256(bytes_from_bits_32(qh), _mm256_set1_epi8(16));
            _mm256_or_si256(bytes_from_nibbles_32(xb.add(6)), hi)
        }
    }
}

/// `$acc = fma(broadcast(f32 at byte $off past $base), $q, $acc)`, one rounding, the
/// broadcast done by the load unit. Left to itself LLVM keeps the scale products in
/// registers and spends a shuffle or two on every broadcast; and the offset (a literal) goes
/// into the load's addressing, where a computed address would cost an ALU µop per output
/// and block (an `lea`, often on a vector port). A macro, so that the register class sees
/// the calling kernel's AVX.
macro_rules! fmadd_bcast_at {
    ($acc:expr, $q:expr, $base:expr, $off:literal) => {{
        let base: *const f32 = $base;
        let d: __m256;
        // Used inside the kernels' `unsafe` blocks. Sound: reads 4 bytes at `base + $off`,
        // which the caller's table holds.
        std::arch::asm!(
            concat!("vbroadcastss {d}, dword ptr [{s} + ", stringify!($off), "]"),
            d = out(ymm_reg) d,
            s = in(reg) base,
            options(pure, readonly, nostack, preserves_flags),
        );
        $acc = _mm256_fmadd_ps(d, $q, $acc);
    }};
}

/// `dds[c][2j + i] = dx_i · dy_j` for the blocks of `sw` (`[dx0, dx1, ·, ·]`) and `sa`
/// (`[dy0..dy3]`): lane `2j + i` pairs weight row `i` with activation row `j`. Computed a
/// chunk ahead of the products that read them back by broadcast loads (right after its
/// store a load would wait on it).
///
/// # Safety
/// `dds` holds `sw.len() <= sa.len()` entries; AVX2 enabled by the caller.
#[inline(always)]
unsafe fn scale_products(sw: &[__m128], sa: &[__m128], dds: *mut [f32; 8]) {
    // SAFETY: by the caller's contract.
    unsafe {
        let wsel = _mm256_setr_epi32(0, 1, 0, 1, 0, 1, 0, 1);
        let asel = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
        for (c, (&w, &a)) in sw.iter().zip(sa).enumerate() {
            let dw = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(w), wsel);
            let da = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(a), asel);
            _mm256_storeu_ps((*dds.add(c)).as_mut_ptr(), _mm256_mul_ps(dw, da));
        }
    }
}

/// `$row!(j, offset of dx_0·dy_j, offset of dx_1·dy_j)` for the 4 activation rows of a
/// 2 × 4 tile (byte offsets into a block's 8 scale products).
macro_rules! each_act_row {
    ($row:ident) => {
        $row!(0, 0, 4);
        $row!(1, 8, 12);
        $row!(2, 16, 20);
        $row!(3, 24, 28);
    };
}

/// 2 weight rows × `RN` activation rows of Q4_0/Q5_0, bit-identical to [`q0_4xn`], on
/// weight blocks decoded once per call to their signed values `x` and, per lane,
/// `MAGIC - 128·Σx` (`w` points at the pairs): the activation bytes offset to unsigned,
/// `y + 128`, meet the values in one `maddubs` with no sign fix-up, and one integer add takes
/// the offset's part (which depends on the weights alone) off and readies the lane for
/// [`magic_f32!`] (with VNNI, one `vpdpbusd` does all three). The lane sums are the same exact
/// integers (no pair sum saturates: `255·16·2 < 2^15`; Q8_0's `255·128·2` would, so it is
/// taken only with VNNI), so the FMA chain, with the same products `dx·dy` (from the scale
/// tables, lane `2j + i` for rows `i`, `j`), gives the same bits. With `PRE`, `a` points at
/// activation blocks already offset (32 bytes each, from `offset_q0`'s table).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q0u<const T: u8, const PRE: bool, const V: u8, const RN: usize>(
    nb: usize,
    w: [*const [__m256i; 2]; 2],
    a: [*const u8; RN],
    sw: &[__m128],
    sa: &[__m128],
) -> [[f32; RN]; 2] {
    const RM: usize = 2;
    let mut acc = [[_mm256_setzero_ps(); RN]; RM];
    // SAFETY: rows hold `nb` blocks and the tables `nb` entries (the caller's contract).
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let bias = _mm256_set1_epi8(-128);
        let mut dds = std::mem::MaybeUninit::<[[f32; 8]; CHUNK]>::uninit();
        let dds = dds.as_mut_ptr().cast::<[f32; 8]>();
        for c0 in (0..nb).step_by(CHUNK) {
            let n = CHUNK.min(nb - c0);
            scale_products(&sw[c0..c0 + n], &sa[c0..c0 + n], dds);
            for c in 0..n {
                let ib = c0 + c;
                let dd = dds.add(c).cast::<f32>().cast_const();
                let x = [*w[0].add(ib), *w[1].add(ib)];
                // Activation row j against both weight rows; `dd` at byte 8j and 8j + 4.
                macro_rules! row {
                    ($j:literal, $o0:literal, $o1:literal) => {
                        if $j < RN {
                            let y = if PRE {
                                loadu(a[$j].add(ib * 32))
                            } else {
                                _mm256_xor_si256(loadu(a[$j].add(ib * 34 + 2)), bias)
                            };
                            let q = magic_f32!(lane_dot::<V>(x[0][1], y, x[0][0], ones));
                            fmadd_bcast_at!(acc[0][$j], q, dd, $o0);
                            let q = magic_f32!(lane_dot::<V>(x[1][1], y, x[1][0], ones));
                            fmadd_bcast_at!(acc[1][$j], q, dd, $o1);
                        }
                    };
                }
                each_act_row!(row);
            }
        }
        hsum_all(acc)
    }
}

/// Q4_1 (`T == 0`) / Q5_1 (`T == 1`) over the whole product, in tiles of 2 weight rows ×
/// up to 4 activation rows ([`q1u`]). Once per call the block scales become f32 tables
/// (per weight-row pair and block `[d0, m0, d1, m1]`, per activation row and block
/// `[d, s]`, each from one `vcvtph2ps`), and with more than 4 activation rows each weight
/// row is decoded once to its unsigned values, which `maddubs` takes as they are. The
/// inner loop is then `maddubs`, `madd`, `cvt` and one FMA per (block, weight row,
/// activation row); the 4×2 tiles ([`q1_4xn`]) spent as much again on decoding each block
/// once per 2 activation rows and on converting scales inside the loop.
///
/// # Safety
/// AVX2/FMA/F16C present; every row holds `nb <= NB` blocks; `w.len()` is even (any
/// number of row pairs); `a.len() <= 4 * NG`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn offset_q1<const T: u8, const NB: usize, const NG: usize, const V: u8>(
    nb: usize,
    w: &[&[u8]],
    a: &[&[u8]],
    out: &mut [f32],
) {
    const RM: usize = 2;
    let bx = if T == 0 { 20 } else { 24 };
    let na = a.len();
    // Tables, uninitialised until written (only `nb` entries of a row or group are
    // written and read).
    let mut tw = std::mem::MaybeUninit::<[__m128; NB]>::uninit();
    let tw = tw.as_mut_ptr().cast::<__m128>();
    // Per group of 4 activation rows and block: `[d0, s0, d1, s1, d2, s2, d3, s3]`
    // (a group short of 4 rows repeats its last).
    let mut ta: [std::mem::MaybeUninit<[__m256; NB]>; NG] =
        [const { std::mem::MaybeUninit::uninit() }; NG];
    // SAFETY: the caller's contract; entries 0..nb of a table are written before they are
    // read.
    unsafe {
        for (g, t) in ta.iter_mut().enumerate().take(na.div_ceil(4)) {
            let t = t.as_mut_ptr().cast::<__m256>();
            let rows: [*const u8; 4] = crate::kernels::tile::row_ptrs(a, 4 * g);
            for b in 0..nb {
                let word = |k: usize| rows[k].add(b * 36).cast::<i32>().read_unaligned();
                let v = _mm_set_epi32(word(3), word(2), word(1), word(0));
                t.add(b).write(_mm256_cvtph_ps(v));
            }
        }
        // With more than 4 activation rows the weight blocks are decoded once per call;
        // otherwise `q1u` decodes them as it goes (each block is read once either way).
        let mut dec: std::mem::MaybeUninit<[[__m256i; NB]; RM]> = std::mem::MaybeUninit::uninit();
        let dec = dec.as_mut_ptr().cast::<__m256i>();
        for g in 0..w.len() / RM {
            crate::kernels::prefetch_rows(&w[RM * g..RM * g + RM]);
            let (r0, r1) = (w[RM * g].as_ptr(), w[RM * g + 1].as_ptr());
            for b in 0..nb {
                // The (d, m) words of the two rows' blocks: [d0, m0, d1, m1].
                let lo = r0.add(b * bx).cast::<u32>().read_unaligned();
                let hi = r1.add(b * bx).cast::<u32>().read_unaligned();
                let bits = u64::from(lo) | u64::from(hi) << 32;
                tw.add(b)
                    .write(_mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64)));
            }
            let mut wp = [std::ptr::null::<u8>(); RM];
            for (i, p) in wp.iter_mut().enumerate() {
                let row = w[RM * g + i].as_ptr();
                if na > 4 {
                    for b in 0..nb {
                        dec.add(i * NB + b).write(q1_unsigned::<T>(row.add(b * bx)));
                    }
                    *p = dec.add(i * NB).cast::<u8>().cast_const();
                } else {
                    *p = row;
                }
            }
            let sw = std::slice::from_raw_parts(tw.cast_const(), nb);
            let mut j0 = 0;
            while j0 < na {
                let rn = (na - j0).min(4);
                // Plain loops, not `from_fn` closures (see `offset_q0`).
                let mut ap = [std::ptr::null::<u8>(); 4];
                for j in 0..rn {
                    ap[j] = a[j0 + j].as_ptr();
                }
                let sa = std::slice::from_raw_parts(ta[j0 / 4].as_ptr().cast::<__m256>(), nb);
                tile_rows!(
                    rn,
                    ap,
                    |apn| if na > 4 {
                        q1u::<T, true, V, _>(nb, wp, apn, sw, sa)
                    } else {
                        q1u::<T, false, V, _>(nb, wp, apn, sw, sa)
                    },
                    out,
                    w.len(),
                    j0,
                    RM * g
                );
                j0 += rn;
            }
        }
    }
}

/// The 32 values of a Q4_1 (`T == 0`) or Q5_1 block as unsigned bytes.
#[inline(always)]
unsafe fn q1_unsigned<const T: u8>(xb: *const u8) -> __m256i {
    // SAFETY: `xb` points at a whole block; AVX2 enabled by the caller.
    unsafe {
        if T == 0 {
            bytes_from_nibbles_32(xb.add(4))
        } else {
            let qh = xb.add(4).cast::<u32>().read_unaligned();
            let hi = _mm256_and_si256(bytes_from_bits_32(qh), _mm256_set1_epi8(0x10));
            _mm256_or_si256(bytes_from_nibbles_32(xb.add(8)), hi)
        }
    }
}

/// 2 weight rows × `RN` activation rows of Q4_1/Q5_1, bit-identical to [`q1_4xn`]
/// (llama.cpp's `ggml_vec_dot_q4_1_q8_1`): per output 8 integer lanes and an FMA chain
/// with `dx·dy` per block, beside it the FMA chain of `mx·sy`, and at the end
/// `hsum_float_8(chain) + Σ m·s`. `w` points at the weight rows (`DEC`: at their decoded
/// blocks), `sw`/`sa` at the `[d0, m0, d1, m1]` and `[d, s]` tables.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q1u<const T: u8, const DEC: bool, const V: u8, const RN: usize>(
    nb: usize,
    w: [*const u8; 2],
    a: [*const u8; RN],
    sw: &[__m128],
    sa: &[__m256],
) -> [[f32; RN]; 2] {
    const RM: usize = 2;
    let bx = if T == 0 { 20 } else { 24 };
    let mut acc = [[_mm256_setzero_ps(); RN]; RM];
    // SAFETY: rows hold `nb` blocks and the tables `nb` entries (the caller's contract).
    unsafe {
        // Lane 2j + i pairs weight row i with activation row j: the weights' d (or m) as
        // [d0, d1, d0, d1, …], the activations' d (or s) as [d0, d0, d1, d1, …].
        let wpick = |v: __m128, k: i32| {
            _mm256_permutevar8x32_ps(
                _mm256_castps128_ps256(v),
                _mm256_setr_epi32(k, k + 2, k, k + 2, k, k + 2, k, k + 2),
            )
        };
        let apick = |v: __m256, k: i32| {
            _mm256_permutevar8x32_ps(
                v,
                _mm256_setr_epi32(k, k, k + 2, k + 2, k + 4, k + 4, k + 6, k + 6),
            )
        };
        // The m·s chains, in block order as the reference's scalar loop.
        let mut summs = _mm256_setzero_ps();
        for ib in 0..nb {
            summs = _mm256_fmadd_ps(wpick(sw[ib], 1), apick(sa[ib], 1), summs);
        }

        let ones = _mm256_set1_epi16(1);
        let zero = _mm256_setzero_si256();
        // dds[c][2j + i] = dx_i · dy_j of block `c0 + c`, computed a chunk ahead of the
        // products (right after its store a broadcast load would wait on it).
        let mut dds = std::mem::MaybeUninit::<[[f32; 8]; CHUNK]>::uninit();
        let dds = dds.as_mut_ptr().cast::<[f32; 8]>();
        for c0 in (0..nb).step_by(CHUNK) {
            let n = CHUNK.min(nb - c0);
            for c in 0..n {
                let dd = _mm256_mul_ps(wpick(sw[c0 + c], 0), apick(sa[c0 + c], 0));
                _mm256_storeu_ps((*dds.add(c)).as_mut_ptr(), dd);
            }
            for c in 0..n {
                let ib = c0 + c;
                let dd = dds.add(c).cast::<f32>().cast_const();
                let mut x = [_mm256_setzero_si256(); RM];
                for (i, xi) in x.iter_mut().enumerate() {
                    *xi = if DEC {
                        *w[i].cast::<__m256i>().add(ib)
                    } else {
                        q1_unsigned::<T>(w[i].add(ib * bx))
                    };
                }
                // Activation row j against both weight rows; `dd` at byte 8j and 8j + 4.
                macro_rules! row {
                    ($j:literal, $o0:literal, $o1:literal) => {
                        if $j < RN {
                            let y = loadu(a[$j].add(ib * 36 + 4));
                            let s = lane_dot::<V>(zero, x[0], y, ones);
                            fmadd_bcast_at!(acc[0][$j], _mm256_cvtepi32_ps(s), dd, $o0);
                            let s = lane_dot::<V>(zero, x[1], y, ones);
                            fmadd_bcast_at!(acc[1][$j], _mm256_cvtepi32_ps(s), dd, $o1);
                        }
                    };
                }
                each_act_row!(row);
            }
        }
        let mut out = hsum_all(acc);
        let mut sm = [0f32; 8];
        _mm256_storeu_ps(sm.as_mut_ptr(), summs);
        for j in 0..RN {
            for i in 0..RM {
                out[i][j] += sm[2 * j + i];
            }
        }
        out
    }
}

/// Q8_0 over the whole product, in tiles of 2 weight rows × up to 4 activation rows
/// ([`q8u`]): values widened to i16 and regrouped (`widen_q8`), so that two `pmaddwd` and
/// an add give each of llama.cpp's 8 lanes (4 products) without its sign trick (`psignb`
/// per output and block). Once per call the block scales become f32 tables and the
/// activation blocks are widened; weight blocks are widened as they are read (once per 4
/// activation rows).
///
/// # Safety
/// AVX2/FMA/F16C present; every row holds `nb <= WIDE_BLOCKS` blocks; `w.len()` is even
/// (any number of row pairs); `a.len() <= MAX_A`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn offset_q8(nb: usize, w: &[&[u8]], a: &[&[u8]], out: &mut [f32]) {
    const RM: usize = 2;
    let na = a.len();
    let mut tw = std::mem::MaybeUninit::<[__m128; WIDE_BLOCKS]>::uninit();
    let tw = tw.as_mut_ptr().cast::<__m128>();
    let mut ta: [std::mem::MaybeUninit<[__m128; WIDE_BLOCKS]>; MAX_A / 4] =
        [const { std::mem::MaybeUninit::uninit() }; MAX_A / 4];
    let mut ya: std::mem::MaybeUninit<[[[__m256i; 2]; WIDE_BLOCKS]; MAX_A]> =
        std::mem::MaybeUninit::uninit();
    let ya = ya.as_mut_ptr().cast::<[__m256i; 2]>();
    // SAFETY: the caller's contract; entries 0..nb of a table are written before they are
    // read.
    unsafe {
        for (g, t) in ta.iter_mut().enumerate().take(na.div_ceil(4)) {
            let rows: [*const u8; 4] = crate::kernels::tile::row_ptrs(a, 4 * g);
            let t = t.as_mut_ptr().cast::<__m128>();
            for b in 0..nb {
                t.add(b).write(scales4(rows, b * 34));
            }
        }
        for (j, row) in a.iter().enumerate() {
            for b in 0..nb {
                ya.add(j * WIDE_BLOCKS + b)
                    .write(widen_q8(row.as_ptr().add(b * 34 + 2)));
            }
        }
        for g in 0..w.len() / RM {
            crate::kernels::prefetch_rows(&w[RM * g..RM * g + RM]);
            let wp: [*const u8; RM] = crate::kernels::tile::row_ptrs(w, RM * g);
            for b in 0..nb {
                tw.add(b).write(scales4(wp, b * 34));
            }
            let sw = std::slice::from_raw_parts(tw.cast_const(), nb);
            let mut j0 = 0;
            while j0 < na {
                let rn = (na - j0).min(4);
                let sa = std::slice::from_raw_parts(ta[j0 / 4].as_ptr().cast::<__m128>(), nb);
                let mut ap = [std::ptr::null::<[__m256i; 2]>(); 4];
                for (j, p) in ap.iter_mut().enumerate().take(rn) {
                    *p = ya.add((j0 + j) * WIDE_BLOCKS).cast_const();
                }
                tile_rows!(
                    rn,
                    ap,
                    |apn| q8u(nb, wp, apn, sw, sa),
                    out,
                    w.len(),
                    j0,
                    RM * g
                );
                j0 += rn;
            }
        }
    }
}

/// The 32 signed bytes at `p` as two vectors of i16 arranged for `pmaddwd`: the first holds
/// values `4j, 4j + 1` and the second `4j + 2, 4j + 3` at i32 lane `j`, so that the sum of the
/// two products is lane `j` of `madd(maddubs(·))`: values `4j..4j + 4`. Within 128-bit lanes
/// only (a byte shuffle, then unpacking with the sign bytes): the lane-crossing `vpmovsxbw`
/// is two µops on Zen 3's shuffle pipes, which this kernel keeps busy.
#[inline(always)]
unsafe fn widen_q8(p: *const u8) -> [__m256i; 2] {
    // SAFETY: 32 readable bytes at `p` (the caller's contract); AVX2 enabled by the caller.
    unsafe {
        let v = loadu(p);
        let idx = _mm256_setr_epi8(
            0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3,
            6, 7, 10, 11, 14, 15,
        );
        // Per 128-bit lane: the pairs `4j, 4j + 1` (j = 0..4), then `4j + 2, 4j + 3`.
        let s = _mm256_shuffle_epi8(v, idx);
        let sign = _mm256_cmpgt_epi8(_mm256_setzero_si256(), s);
        [_mm256_unpacklo_epi8(s, sign), _mm256_unpackhi_epi8(s, sign)]
    }
}

/// 2 weight rows × `RN` activation rows of Q8_0, bit-identical to [`q0_4xn`]: per output
/// the same 8 exact lane sums, then `fma(dx·dy, lanes, acc)` per block and `hsum_float_8`.
/// `a` points at the widened activation blocks, `sw`/`sa` at the scale tables (`[d0, d1]`
/// of the weight rows, `[d0..d3]` of the activation group).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8u<const RN: usize>(
    nb: usize,
    w: [*const u8; 2],
    a: [*const [__m256i; 2]; RN],
    sw: &[__m128],
    sa: &[__m128],
) -> [[f32; RN]; 2] {
    const RM: usize = 2;
    let mut acc = [[_mm256_setzero_ps(); RN]; RM];
    // SAFETY: rows hold `nb` blocks and the tables `nb` entries (the caller's contract).
    unsafe {
        let mut dds = std::mem::MaybeUninit::<[[f32; 8]; CHUNK]>::uninit();
        let dds = dds.as_mut_ptr().cast::<[f32; 8]>();
        for c0 in (0..nb).step_by(CHUNK) {
            let n = CHUNK.min(nb - c0);
            scale_products(&sw[c0..c0 + n], &sa[c0..c0 + n], dds);
            for c in 0..n {
                let ib = c0 + c;
                let dd = dds.add(c).cast::<f32>().cast_const();
                let x = [
                    widen_q8(w[0].add(ib * 34 + 2)),
                    widen_q8(w[1].add(ib * 34 + 2)),
                ];
                // Activation row j against both weight rows; `dd` at byte 8j and 8j + 4.
                macro_rules! row {
                    ($j:literal, $o0:literal, $o1:literal) => {
                        if $j < RN {
                            let y = &*a[$j].add(ib);
                            let s = _mm256_add_epi32(
                                _mm256_madd_epi16(x[0][0], y[0]),
                                _mm256_madd_epi16(x[0][1], y[1]),
                            );
                            fmadd_bcast_at!(acc[0][$j], _mm256_cvtepi32_ps(s), dd, $o0);
                            let s = _mm256_add_epi32(
                                _mm256_madd_epi16(x[1][0], y[0]),
                                _mm256_madd_epi16(x[1][1], y[1]),
                            );
                            fmadd_bcast_at!(acc[1][$j], _mm256_cvtepi32_ps(s), dd, $o1);
                        }
                    };
                }
                each_act_row!(row);
            }
        }
        hsum_all(acc)
    }
}

/// `q0` for 4 weight rows: the four weight scales converted together and multiplied by the
/// activation scale as one vector (the same four f32 products `dx * dy`), each weight block
/// unpacked once for the `RN` activation rows. No closures: they would not inherit the
/// target features.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q0_4xn<const T: u8, const RN: usize>(
    nb: usize,
    w: [*const u8; 4],
    a: [*const u8; RN],
) -> [[f32; RN]; 4] {
    let bx = q0_bytes(T);
    let mut acc = [[_mm256_setzero_ps(); RN]; 4];
    // SAFETY: rows hold `nb` blocks (the caller's contract).
    unsafe {
        for ib in 0..nb {
            let off = ib * bx;
            let bits = u64::from(w[0].add(off).cast::<u16>().read_unaligned())
                | u64::from(w[1].add(off).cast::<u16>().read_unaligned()) << 16
                | u64::from(w[2].add(off).cast::<u16>().read_unaligned()) << 32
                | u64::from(w[3].add(off).cast::<u16>().read_unaligned()) << 48;
            let da = _mm_cvtph_ps(_mm_set_epi64x(0, bits as i64));
            let x0 = q0_values::<T>(w[0].add(off));
            let x1 = q0_values::<T>(w[1].add(off));
            let x2 = q0_values::<T>(w[2].add(off));
            let x3 = q0_values::<T>(w[3].add(off));
            for j in 0..RN {
                let yb = a[j].add(ib * 34);
                let dd = _mm_mul_ps(da, _mm_set1_ps(ld_f16(yb)));
                let dv = _mm256_set_m128(dd, dd);
                let qy = loadu(yb.add(2));
                let q0 = _mm256_cvtepi32_ps(lanes_i8(_mm256_sign_epi8(x0, x0), x0, qy));
                acc[0][j] = _mm256_fmadd_ps(_mm256_shuffle_ps(dv, dv, 0), q0, acc[0][j]);
                let q1 = _mm256_cvtepi32_ps(lanes_i8(_mm256_sign_epi8(x1, x1), x1, qy));
                acc[1][j] = _mm256_fmadd_ps(_mm256_shuffle_ps(dv, dv, 85), q1, acc[1][j]);
                let q2 = _mm256_cvtepi32_ps(lanes_i8(_mm256_sign_epi8(x2, x2), x2, qy));
                acc[2][j] = _mm256_fmadd_ps(_mm256_shuffle_ps(dv, dv, 170), q2, acc[2][j]);
                let q3 = _mm256_cvtepi32_ps(lanes_i8(_mm256_sign_epi8(x3, x3), x3, qy));
                acc[3][j] = _mm256_fmadd_ps(_mm256_shuffle_ps(dv, dv, 255), q3, acc[3][j]);
            }
        }
        let mut r = [[0f32; RN]; 4];
        for i in 0..4 {
            for j in 0..RN {
                r[i][j] = hsum_float_8(acc[i][j]);
            }
        }
        r
    }
}

/// `hsum_float_8` of every accumulator (a plain loop: a closure passed to `map` would not
/// be inlined into the target-feature kernel).
#[inline(always)]
unsafe fn hsum_all<const RM: usize, const RN: usize>(acc: [[__m256; RN]; RM]) -> [[f32; RN]; RM] {
    let mut out = [[0f32; RN]; RM];
    for i in 0..RM {
        for j in 0..RN {
            // SAFETY: register-only; AVX enabled by the caller.
            out[i][j] = unsafe { hsum_float_8(acc[i][j]) };
        }
    }
    out
}

/// f16 at `p` as f32 (F16C; exact). Reads 4 bytes: a 32-bit load becomes a zero-extending
/// `vmovd`, where a 16-bit one would be an insert into some live register and make the
/// conversion wait for that register's last writer (often a loop-carried FMA).
///
/// # Safety
/// 4 readable bytes at `p`; F16C enabled by the caller.
#[inline(always)]
pub(crate) unsafe fn ld_f16(p: *const u8) -> f32 {
    // SAFETY: by the caller's contract.
    unsafe {
        let v = p.cast::<i32>().read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(v)))
    }
}

/// [`ld_f16`] where only the 2 bytes of the f16 are readable (the last field of a block).
#[inline(always)]
pub(crate) unsafe fn ld_f16_last(p: *const u8) -> f32 {
    // SAFETY: 2 readable bytes at `p` by the caller's contract; F16C enabled by the caller.
    unsafe {
        let h = p.cast::<u16>().read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
    }
}

#[inline(always)]
unsafe fn ld_f32(p: *const u8) -> f32 {
    // SAFETY: the caller passes 4 readable bytes.
    unsafe { p.cast::<f32>().read_unaligned() }
}

#[inline(always)]
unsafe fn loadu(p: *const u8) -> __m256i {
    // SAFETY: the caller passes 32 readable bytes.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// Exact sum of the 8 i32 lanes.
#[inline(always)]
pub(crate) unsafe fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: register-only intrinsics; AVX2 enabled by the caller.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        hsum_i32x4(s)
    }
}

#[inline(always)]
unsafe fn hsum_i32x4(s: __m128i) -> i32 {
    // SAFETY: register-only intrinsics; AVX2 enabled by the caller.
    unsafe {
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }
}

/// The float step of the repacked-Q4_K kernels for one output and superblock, from the
/// exact integer sums `p` (per sub-block pair, 8 lanes each) and `imin` (the 4 min sums):
/// `G == 0` (gemv) one FMA per superblock, `G == 1` (gemm) one per pair of sub-blocks;
/// `scales` is `(d, dmin, activation d)`.
#[inline(always)]
pub(crate) unsafe fn q4k_accumulate<const G: u8>(
    p: &[__m256i; 4],
    imin: __m128i,
    (d, dmin, yd): (f32, f32, f32),
    acc: &mut f32,
    acc_min: &mut f32,
) {
    // SAFETY: register-only intrinsics and local stores; AVX2 enabled by the caller.
    unsafe {
        if G == 0 {
            let all = _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3]));
            let sum = hsum_i32(all);
            let smin = hsum_i32x4(imin);
            *acc = (sum as f32).mul_add(d * yd, *acc);
            *acc_min = (smin as f32).mul_add(dmin * yd, *acc_min);
        } else {
            let h01 = _mm256_hadd_epi32(p[0], p[1]);
            let h23 = _mm256_hadd_epi32(p[2], p[3]);
            let h = _mm256_hadd_epi32(h01, h23);
            let s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            let mut iacc = [0f32; 4];
            let mut imf = [0f32; 4];
            _mm_storeu_ps(iacc.as_mut_ptr(), _mm_cvtepi32_ps(s));
            _mm_storeu_ps(imf.as_mut_ptr(), _mm_cvtepi32_ps(imin));
            let (dd, dm) = (d * yd, dmin * yd);
            for sb in 0..4 {
                *acc = iacc[sb].mul_add(dd, *acc);
                *acc_min = imf[sb].mul_add(dm, *acc_min);
            }
        }
    }
}

pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// `ggml_e8m0_to_fp32_half` (exact: a power of two).
#[inline(always)]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// `kvalues_mxfp4` (the FP4 E2M1 values, doubled).
const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// The 32 signed values of a Q4_0 (0), Q5_0 (1), Q8_0 (2), IQ4_NL (3) or MXFP4 (4) block.
#[inline(always)]
pub(crate) unsafe fn q0_values<const T: u8>(xb: *const u8) -> __m256i {
    // SAFETY: `xb` points at a whole block; AVX2 enabled by the caller.
    unsafe {
        match T {
            0 => _mm256_sub_epi8(bytes_from_nibbles_32(xb.add(2)), _mm256_set1_epi8(8)),
            1 => {
                let qx = bytes_from_nibbles_32(xb.add(6));
                let qh = xb.add(2).cast::<u32>().read_unaligned();
                let bxhi =
                    _mm256_andnot_si256(bytes_from_bits_32(qh), _mm256_set1_epi8(0xF0u8 as i8));
                _mm256_or_si256(qx, bxhi)
            }
            2 => loadu(xb.add(2)),
            4 => {
                let t = _mm_loadu_si128(KVALUES_MXFP4.as_ptr() as *const __m128i);
                let table = _mm256_insertf128_si256(_mm256_castsi128_si256(t), t, 1);
                _mm256_shuffle_epi8(table, bytes_from_nibbles_32(xb.add(1)))
            }
            _ => {
                let t = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
                let table = _mm256_insertf128_si256(_mm256_castsi128_si256(t), t, 1);
                _mm256_shuffle_epi8(table, bytes_from_nibbles_32(xb.add(2)))
            }
        }
    }
}

pub(crate) const fn q0_bytes(t: u8) -> usize {
    match t {
        0 | 3 => 18,
        1 => 22,
        4 => 17,
        _ => 34,
    }
}

/// `madd(1, maddubs(|x|, sign(y, x)))`: the 8 exact i32 lane sums of `x·y` (signed bytes).
#[inline(always)]
unsafe fn lanes_i8(ax: __m256i, x: __m256i, y: __m256i) -> __m256i {
    // SAFETY: register-only intrinsics; AVX2 enabled by the caller.
    unsafe {
        let dot = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(y, x));
        _mm256_madd_epi16(_mm256_set1_epi16(1), dot)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q0<const T: u8, const RM: usize, const RN: usize>(
    nb: usize,
    w: [*const u8; RM],
    a: [*const u8; RN],
) -> [[f32; RN]; RM] {
    let bx = q0_bytes(T);
    let mut acc = [[_mm256_setzero_ps(); RN]; RM];
    // SAFETY: rows hold `nb` blocks (the caller's contract).
    unsafe {
        for ib in 0..nb {
            let mut dy = [_mm256_setzero_ps(); RN];
            for j in 0..RN {
                dy[j] = _mm256_set1_ps(ld_f16(a[j].add(ib * 34)));
            }
            for i in 0..RM {
                let xb = w[i].add(ib * bx);
                let dx = _mm256_set1_ps(ld_f16(xb));
                let qx = q0_values::<T>(xb);
                let ax = _mm256_sign_epi8(qx, qx);
                for j in 0..RN {
                    let qy = loadu(a[j].add(ib * 34 + 2));
                    let q = _mm256_cvtepi32_ps(lanes_i8(ax, qx, qy));
                    // dx*dy rounded once, as the scalar `f16(x) * f16(y)`.
                    acc[i][j] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dy[j]), q, acc[i][j]);
                }
            }
        }
        hsum_all(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q0_chain<const T: u8, const RM: usize, const RN: usize>(
    nb: usize,
    w: [*const u8; RM],
    a: [*const u8; RN],
) -> [[f32; RN]; RM] {
    let bx = q0_bytes(T);
    let mut acc = [[0f32; RN]; RM];
    // SAFETY: rows hold `nb` blocks (the caller's contract).
    unsafe {
        for ib in 0..nb {
            let mut qy = [_mm256_setzero_si256(); RN];
            let mut dy = [0f32; RN];
            for j in 0..RN {
                let yb = a[j].add(ib * 34);
                dy[j] = ld_f16(yb);
                qy[j] = loadu(yb.add(2));
            }
            for i in 0..RM {
                let xb = w[i].add(ib * bx);
                let dx = if T == 4 { e8m0_half(*xb) } else { ld_f16(xb) };
                let qx = q0_values::<T>(xb);
                let ax = _mm256_sign_epi8(qx, qx);
                for j in 0..RN {
                    let sumi = hsum_i32(lanes_i8(ax, qx, qy[j]));
                    acc[i][j] = (sumi as f32).mul_add(dx * dy[j], acc[i][j]);
                }
            }
        }
    }
    acc
}

/// [`q0_chain`] for weight rows in groups of 8 and any number of activation rows. Per block
/// the 8 rows' packed values are transposed before they are decoded ([`q0_block8`]): lane
/// `L` of `wt[k]` holds the values `4k..4k + 4` of row `ROWS[L]`. An activation row's 4
/// values `4k..4k + 4`, broadcast, then meet all 8 rows at once (`maddubs(|wt|, sign(y,
/// wt))`), so the 8 exact block sums `Σ q·q8` build up in lanes with no horizontal sums, and
/// the lanes follow the 8 scalar chains `acc = fma((float)sumi, dx*dy, acc)`. Q4_0 and MXFP4
/// sum the i16 pairs before widening (|q| ≤ 12: 8 pairs stay under 2^15), IQ4_NL widens each
/// (|q| ≤ 127).
///
/// # Safety
/// AVX2/FMA/F16C present; every row holds `nb` blocks; `w.len()` is a multiple of 8.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q0_chain8<const T: u8>(nb: usize, w: &[&[u8]], a: &[&[u8]], out: &mut [f32]) {
    const CHUNK: usize = 16;
    // Activation rows that share each load of a transposed weight vector.
    const R: usize = 4;
    let bx = q0_bytes(T);
    let (nw, na) = (w.len(), a.len());
    // SAFETY: rows hold `nb` blocks (the caller's contract); `out` holds `nw * na`
    // outputs (checked by `tile::x86_tiles`).
    unsafe {
        // Output lane `i` is accumulator lane `ROWS_INV[i]`.
        let to_rows = _mm256_loadu_si256(Q0_ROWS_INV.as_ptr().cast());
        for i0 in (0..nw).step_by(8) {
            if na < R {
                // A gemv streams the weights once: ask for the rows ahead.
                crate::kernels::prefetch_rows(&w[i0..i0 + 8]);
            }
            let mut j0 = 0;
            while j0 < na {
                let rn = (na - j0).min(CHUNK);
                let mut acc = [_mm256_setzero_ps(); CHUNK];
                for ib in 0..nb {
                    let mut xb = [std::ptr::null::<u8>(); 8];
                    for (i, p) in xb.iter_mut().enumerate() {
                        *p = w[i0 + i].as_ptr().add(ib * bx);
                    }
                    let (dx, wt) = q0_block8::<T>(xb);
                    let mut aw = [_mm256_setzero_si256(); 8];
                    for k in 0..8 {
                        aw[k] = _mm256_sign_epi8(wt[k], wt[k]);
                    }
                    let mut j = 0;
                    while j < rn {
                        let n = (rn - j).min(R);
                        let mut yb = [std::ptr::null::<u8>(); R];
                        for (r, p) in yb.iter_mut().enumerate() {
                            *p = a[j0 + j + r.min(n - 1)].as_ptr().add(ib * 34);
                        }
                        let mut sums = [_mm256_setzero_si256(); R];
                        if n == R {
                            sums = chain8_sums::<T, R>(yb, &wt, &aw);
                        } else {
                            for r in 0..n {
                                sums[r] = chain8_sums::<T, 1>([yb[r]], &wt, &aw)[0];
                            }
                        }
                        for r in 0..n {
                            let dy = _mm256_set1_ps(ld_f16(yb[r]));
                            // dx*dy rounded once, then one FMA: the scalar chain per lane.
                            let d = _mm256_mul_ps(dx, dy);
                            acc[j + r] =
                                _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), d, acc[j + r]);
                        }
                        j += n;
                    }
                }
                for j in 0..rn {
                    let v = _mm256_permutevar8x32_ps(acc[j], to_rows);
                    _mm256_storeu_ps(out.as_mut_ptr().add((j0 + j) * nw + i0), v);
                }
                j0 += rn;
            }
        }
    }
}

/// The weight row behind each lane of [`q0_block8`]'s vectors, and the lane of each row.
const Q0_ROWS: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
const Q0_ROWS_INV: [i32; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// One block of each of 8 rows (`xb[i]`) of Q4_0 (`T == 0`), IQ4_NL (3) or MXFP4 (4): the
/// scales and `wt[k]`, lane `L` holding values `4k..4k + 4` of row `Q0_ROWS[L]`. The packed
/// bytes are transposed first (4 bytes of a row hold values `4m..4m + 4` in their low
/// nibbles and `16 + 4m..` in their high ones), then decoded 8 rows at a time.
#[inline(always)]
unsafe fn q0_block8<const T: u8>(xb: [*const u8; 8]) -> (__m256, [__m256i; 8]) {
    // SAFETY: each `xb[i]` is a whole block (the caller's contract); AVX2/F16C enabled by the
    // caller.
    unsafe {
        let qs = if T == 4 { 1 } else { 2 };
        // The scales in vectors (`e8m0_half` / the f16 widening, lane by lane).
        let r = |l: usize| xb[Q0_ROWS[l]];
        let dx = if T == 4 {
            let e = _mm256_set_epi32(
                i32::from(*r(7)),
                i32::from(*r(6)),
                i32::from(*r(5)),
                i32::from(*r(4)),
                i32::from(*r(3)),
                i32::from(*r(2)),
                i32::from(*r(1)),
                i32::from(*r(0)),
            );
            let small = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
            let big = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
            let is_small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
            _mm256_castsi256_ps(_mm256_blendv_epi8(big, small, is_small))
        } else {
            let h = |l: usize| r(l).cast::<i16>().read_unaligned();
            _mm256_cvtph_ps(_mm_set_epi16(
                h(7),
                h(6),
                h(5),
                h(4),
                h(3),
                h(2),
                h(1),
                h(0),
            ))
        };
        // (No closures here: they would not inherit the caller's target features.)
        let mut v = [_mm256_setzero_si256(); 4];
        for (p, vp) in v.iter_mut().enumerate() {
            *vp = _mm256_loadu2_m128i(
                xb[2 * p + 1].add(qs) as *const __m128i,
                xb[2 * p].add(qs) as *const __m128i,
            );
        }
        let [v01, v23, v45, v67] = v;
        let a = _mm256_unpacklo_epi32(v01, v23);
        let b = _mm256_unpackhi_epi32(v01, v23);
        let c = _mm256_unpacklo_epi32(v45, v67);
        let d = _mm256_unpackhi_epi32(v45, v67);
        // x[m], lane L: row Q0_ROWS[L]'s bytes 4m..4m + 4.
        let x = [
            _mm256_unpacklo_epi64(a, c),
            _mm256_unpackhi_epi64(a, c),
            _mm256_unpacklo_epi64(b, d),
            _mm256_unpackhi_epi64(b, d),
        ];
        let m4 = _mm256_set1_epi8(0x0f);
        let table = match T {
            4 => _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_MXFP4.as_ptr().cast())),
            _ => _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast())),
        };
        let mut wt = [_mm256_setzero_si256(); 8];
        for m in 0..4 {
            wt[m] = _mm256_and_si256(x[m], m4);
            wt[m + 4] = _mm256_and_si256(_mm256_srli_epi16(x[m], 4), m4);
        }
        for n in wt.iter_mut() {
            *n = if T == 0 {
                _mm256_sub_epi8(*n, _mm256_set1_epi8(8))
            } else {
                _mm256_shuffle_epi8(table, *n)
            };
        }
        (dx, wt)
    }
}

/// Per activation block `yb[r]` (Q8_0), lane `i`: the exact `Σ q·q8` of weight row `i`
/// (`wt`, `aw`: the transposed values and their magnitudes, see [`q0_chain8`]).
#[inline(always)]
unsafe fn chain8_sums<const T: u8, const R: usize>(
    yb: [*const u8; R],
    wt: &[__m256i; 8],
    aw: &[__m256i; 8],
) -> [__m256i; R] {
    // SAFETY: each `yb[r]` is a readable Q8_0 block (the caller's contract); AVX2 enabled by
    // the caller.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut s = [_mm256_setzero_si256(); R];
        for k in 0..8 {
            for r in 0..R {
                let y = _mm256_set1_epi32(yb[r].add(2 + 4 * k).cast::<i32>().read_unaligned());
                let p = _mm256_maddubs_epi16(aw[k], _mm256_sign_epi8(y, wt[k]));
                s[r] = if T == 3 {
                    _mm256_add_epi32(s[r], _mm256_madd_epi16(p, ones))
                } else {
                    _mm256_add_epi16(s[r], p)
                };
            }
        }
        if T != 3 {
            for r in 0..R {
                s[r] = _mm256_madd_epi16(s[r], ones);
            }
        }
        s
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q1<const T: u8, const RM: usize, const RN: usize>(
    nb: usize,
    w: [*const u8; RM],
    a: [*const u8; RN],
) -> [[f32; RN]; RM] {
    let bx = if T == 0 { 20 } else { 24 };
    let mut acc = [[_mm256_setzero_ps(); RN]; RM];
    let mut summs = [[0f32; RN]; RM];
    // SAFETY: rows hold `nb` blocks (the caller's contract).
    unsafe {
        let ones = _mm256_set1_epi16(1);
        for ib in 0..nb {
            let mut qy = [_mm256_setzero_si256(); RN];
            let mut dy = [0f32; RN];
            let mut sy = [0f32; RN];
            for j in 0..RN {
                let yb = a[j].add(ib * 36);
                dy[j] = ld_f16(yb);
                sy[j] = ld_f16(yb.add(2));
                qy[j] = loadu(yb.add(4));
            }
            for i in 0..RM {
                let xb = w[i].add(ib * bx);
                let dx = ld_f16(xb);
                let mx = ld_f16(xb.add(2));
                let qx = if T == 0 {
                    bytes_from_nibbles_32(xb.add(4))
                } else {
                    let qh = xb.add(4).cast::<u32>().read_unaligned();
                    let bxhi = _mm256_and_si256(bytes_from_bits_32(qh), _mm256_set1_epi8(0x10));
                    _mm256_or_si256(bytes_from_nibbles_32(xb.add(8)), bxhi)
                };
                for j in 0..RN {
                    summs[i][j] = mx.mul_add(sy[j], summs[i][j]);
                    let dot = _mm256_maddubs_epi16(qx, qy[j]);
                    let q = _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, dot));
                    let d = _mm256_set1_ps(dx * dy[j]);
                    acc[i][j] = if T == 0 {
                        _mm256_fmadd_ps(d, q, acc[i][j])
                    } else {
                        _mm256_fmadd_ps(q, d, acc[i][j])
                    };
                }
            }
        }
        let mut out = [[0f32; RN]; RM];
        for i in 0..RM {
            for j in 0..RN {
                out[i][j] = hsum_float_8(acc[i][j]) + summs[i][j];
            }
        }
        out
    }
}

/// `q1` for 4 weight rows: scales and mins of the four rows converted together, `dx * dy`
/// and the `m·s` sums computed as 4-lane vectors (the same f32 products and fused
/// multiply-adds, lane by lane), each weight block unpacked once for the `RN` rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q1_4xn<const T: u8, const RN: usize>(
    nb: usize,
    w: [*const u8; 4],
    a: [*const u8; RN],
) -> [[f32; RN]; 4] {
    let bx = if T == 0 { 20 } else { 24 };
    let mut acc = [[_mm256_setzero_ps(); RN]; 4];
    let mut summs = [_mm_setzero_ps(); RN];
    // SAFETY: rows hold `nb` blocks (the caller's contract).
    unsafe {
        let ones = _mm256_set1_epi16(1);
        for ib in 0..nb {
            let off = ib * bx;
            // d and m of each row, as one 32-bit pair per row.
            let dm = _mm_set_epi32(
                w[3].add(off).cast::<i32>().read_unaligned(),
                w[2].add(off).cast::<i32>().read_unaligned(),
                w[1].add(off).cast::<i32>().read_unaligned(),
                w[0].add(off).cast::<i32>().read_unaligned(),
            );
            // [d0 m0 d1 m1 d2 m2 d3 m3] as f32; pick the d's and the m's.
            let f = _mm256_cvtph_ps(dm);
            let lo = _mm256_castps256_ps128(f);
            let hi = _mm256_extractf128_ps(f, 1);
            let dx = _mm_shuffle_ps(lo, hi, 0b10_00_10_00);
            let mx = _mm_shuffle_ps(lo, hi, 0b11_01_11_01);
            let mut x = [_mm256_setzero_si256(); 4];
            for (i, xi) in x.iter_mut().enumerate() {
                let xb = w[i].add(off);
                *xi = if T == 0 {
                    bytes_from_nibbles_32(xb.add(4))
                } else {
                    let qh = xb.add(4).cast::<u32>().read_unaligned();
                    let bxhi = _mm256_and_si256(bytes_from_bits_32(qh), _mm256_set1_epi8(0x10));
                    _mm256_or_si256(bytes_from_nibbles_32(xb.add(8)), bxhi)
                };
            }
            for j in 0..RN {
                let yb = a[j].add(ib * 36);
                let dy = ld_f16(yb);
                let sy = ld_f16(yb.add(2));
                let qy = loadu(yb.add(4));
                summs[j] = _mm_fmadd_ps(mx, _mm_set1_ps(sy), summs[j]);
                let dd = _mm_mul_ps(dx, _mm_set1_ps(dy));
                let dv = _mm256_set_m128(dd, dd);
                let q0 =
                    _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, _mm256_maddubs_epi16(x[0], qy)));
                acc[0][j] = _mm256_fmadd_ps(_mm256_shuffle_ps(dv, dv, 0), q0, acc[0][j]);
                let q1 =
                    _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, _mm256_maddubs_epi16(x[1], qy)));
                acc[1][j] = _mm256_fmadd_ps(_mm256_shuffle_ps(dv, dv, 85), q1, acc[1][j]);
                let q2 =
                    _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, _mm256_maddubs_epi16(x[2], qy)));
                acc[2][j] = _mm256_fmadd_ps(_mm256_shuffle_ps(dv, dv, 170), q2, acc[2][j]);
                let q3 =
                    _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, _mm256_maddubs_epi16(x[3], qy)));
                acc[3][j] = _mm256_fmadd_ps(_mm256_shuffle_ps(dv, dv, 255), q3, acc[3][j]);
            }
        }
        let mut out = [[0f32; RN]; 4];
        for j in 0..RN {
            let mut sm = [0f32; 4];
            _mm_storeu_ps(sm.as_mut_ptr(), summs[j]);
            for i in 0..4 {
                out[i][j] = hsum_float_8(acc[i][j]) + sm[i];
            }
        }
        out
    }
}

/// Q4_K repacked: `G == 0` gemv (one FMA per superblock), `G == 1` gemm (one per pair of
/// sub-blocks).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k<const G: u8, const RM: usize, const RN: usize>(
    nb: usize,
    w: [*const u8; RM],
    a: [*const u8; RN],
) -> [[f32; RN]; RM] {
    let mut acc = [[0f32; RN]; RM];
    let mut acc_min = [[0f32; RN]; RM];
    // SAFETY: rows hold `nb` blocks (the caller's contract).
    unsafe {
        let m4 = _mm256_set1_epi8(0xF);
        for ib in 0..nb {
            let mut yd = [0f32; RN];
            let mut q8s = [_mm_setzero_si128(); RN];
            let mut yq = [std::ptr::null::<u8>(); RN];
            for j in 0..RN {
                (yd[j], q8s[j], yq[j]) = q8k_act(a[j].add(ib * 292));
            }
            for i in 0..RM {
                let xb = w[i].add(ib * 144);
                let d = ld_f16(xb);
                let dmin = ld_f16(xb.add(2));
                let (sc, mn) = crate::kernels::dot::q4k_scales_mins_pub(
                    std::slice::from_raw_parts(xb.add(4), 12),
                );
                let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(mn.as_ptr() as *const __m128i));
                let q4 = xb.add(16);
                let mut scl = [_mm256_setzero_si256(); 8];
                for s in 0..8 {
                    scl[s] = _mm256_set1_epi16(i16::from(sc[s]));
                }
                for j in 0..RN {
                    let imin = _mm_madd_epi16(mins, q8s[j]);
                    let mut p = [_mm256_setzero_si256(); 4];
                    for sb in 0..4 {
                        let bits = loadu(q4.add(32 * sb));
                        let lo = _mm256_and_si256(bits, m4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                        let q8l = loadu(yq[j].add(64 * sb));
                        let q8h = loadu(yq[j].add(64 * sb + 32));
                        let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, q8l), scl[2 * sb]);
                        let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, q8h), scl[2 * sb + 1]);
                        p[sb] = _mm256_add_epi32(pl, ph);
                    }
                    q4k_accumulate::<G>(
                        &p,
                        imin,
                        (d, dmin, yd[j]),
                        &mut acc[i][j],
                        &mut acc_min[i][j],
                    );
                }
            }
        }
    }
    let mut out = [[0f32; RN]; RM];
    for i in 0..RM {
        for j in 0..RN {
            out[i][j] = acc[i][j] - acc_min[i][j];
        }
    }
    out
}

/// The tiled Q6_K kernel: per superblock `res = d_w*(float)s1`, `acc = fma(res, d_a, acc)`
/// with `s1 = Σ scale·(q6-32)·q8` exact (as `Σ scale·q6·q8 - 32·Σ scale·bsum`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k<const T: u8, const RM: usize, const RN: usize>(
    nb: usize,
    w: [*const u8; RM],
    a: [*const u8; RN],
) -> [[f32; RN]; RM] {
    let mut acc = [[0f32; RN]; RM];
    // SAFETY: rows hold `nb` blocks (the caller's contract).
    unsafe {
        let m3 = _mm256_set1_epi8(3);
        let m15 = _mm256_set1_epi8(15);
        for ib in 0..nb {
            let mut yd = [0f32; RN];
            let mut q8sums = [_mm256_setzero_si256(); RN];
            let mut yq = [std::ptr::null::<u8>(); RN];
            for j in 0..RN {
                let yb = a[j].add(ib * 292);
                yd[j] = ld_f32(yb);
                yq[j] = yb.add(4);
                q8sums[j] = loadu(yb.add(260));
            }
            for i in 0..RM {
                let xb = w[i].add(ib * 210);
                let dw = ld_f16_last(xb.add(208));
                let scales = _mm_loadu_si128(xb.add(192) as *const __m128i);
                let scales_16 = _mm256_cvtepi8_epi16(scales);
                let mut sumi = [_mm256_setzero_si256(); RN];
                for h in 0..2 {
                    let q4bits1 = loadu(xb.add(64 * h));
                    let q4bits2 = loadu(xb.add(64 * h + 32));
                    let q4bits_h = loadu(xb.add(128 + 32 * h));
                    let q4h_0 = _mm256_slli_epi16(_mm256_and_si256(q4bits_h, m3), 4);
                    let q4h_1 =
                        _mm256_slli_epi16(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(12)), 2);
                    let q4h_2 = _mm256_and_si256(q4bits_h, _mm256_set1_epi8(48));
                    let q4h_3 =
                        _mm256_srli_epi16(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(-64)), 2);
                    let q6 = [
                        _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0),
                        _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(q4bits1, 4), m15),
                            q4h_2,
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(q4bits2, 4), m15),
                            q4h_3,
                        ),
                    ];
                    let mut sh = [_mm256_setzero_si256(); 4];
                    for k in 0..4 {
                        sh[k] = q6k_scale_shuffle(scales, 4 * h + k);
                    }
                    for j in 0..RN {
                        let q8 = yq[j].add(128 * h);
                        for k in 0..4 {
                            let p = _mm256_madd_epi16(
                                sh[k],
                                _mm256_maddubs_epi16(q6[k], loadu(q8.add(32 * k))),
                            );
                            sumi[j] = _mm256_add_epi32(sumi[j], p);
                        }
                    }
                }
                for j in 0..RN {
                    let sub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums[j], scales_16), 5);
                    let s1 = hsum_i32(_mm256_sub_epi32(sumi[j], sub));
                    let res = dw * s1 as f32;
                    acc[i][j] = res.mul_add(yd[j], acc[i][j]);
                }
            }
        }
    }
    acc
}

/// Lane `l`: the sum of the 8 i32 lanes of `v[l]` (integers: any order gives the same sum).
#[inline(always)]
unsafe fn hsum_i32x8(v: &[__m256i]) -> __m256i {
    // SAFETY: register-only intrinsics; AVX2 enabled by the caller; `v` holds 8 vectors.
    unsafe {
        let h01 = _mm256_hadd_epi32(v[0], v[1]);
        let h23 = _mm256_hadd_epi32(v[2], v[3]);
        let h45 = _mm256_hadd_epi32(v[4], v[5]);
        let h67 = _mm256_hadd_epi32(v[6], v[7]);
        let h03 = _mm256_hadd_epi32(h01, h23);
        let h47 = _mm256_hadd_epi32(h45, h67);
        _mm256_add_epi32(
            _mm256_permute2x128_si256(h03, h47, 0x20),
            _mm256_permute2x128_si256(h03, h47, 0x31),
        )
    }
}

/// Per activation row `yp[t]` (a Q8_K block) the i32 lanes of `Σ_s sc[s]·(v[s]·q8)`, the
/// weight block's values and scales in registers across the rows: `M == 0` unsigned weight
/// values (`maddubs(v, q8)`), `M == 1` the sign trick (`maddubs(|v|, sign(q8, v))`, `av`
/// holding |v|), `M == 2` weights offset to unsigned (`av = v + 64`, exact while `|v| ≤ 64`:
/// no i16 pair saturates) and the offset taken back out through the activation's 16-value
/// sums (`nsc64` holds `-64·scale` of each 16 values). Integers: the same sums.
#[inline(always)]
unsafe fn rows_i32<const M: u8, const N: usize>(
    yp: [*const u8; N],
    blk: &IqBlock,
    live: bool,
) -> [__m256i; N] {
    let (v, av, sc) = (&blk.v, &blk.av, &blk.sc);
    // SAFETY: each `yp[t]` is a readable Q8_K block (the caller's contract); AVX2 enabled by
    // the caller.
    unsafe {
        let mut acc = [_mm256_setzero_si256(); N];
        if !live {
            return acc;
        }
        if M == 2 {
            for t in 0..N {
                acc[t] = _mm256_madd_epi16(blk.nsc64, loadu(yp[t].add(260)));
            }
        }
        for s in 0..8 {
            for t in 0..N {
                let q8 = loadu(yp[t].add(4 + 32 * s));
                let p = match M {
                    0 => _mm256_maddubs_epi16(v[s], q8),
                    1 => _mm256_maddubs_epi16(av[s], _mm256_sign_epi8(q8, v[s])),
                    _ => _mm256_maddubs_epi16(av[s], q8),
                };
                acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(p, sc[s]));
            }
        }
        acc
    }
}

/// One weight block of [`iq_tiled`] decoded: its values `v` (for `M == 1` and `M == 2` also
/// `av`, see [`rows_i32`]), the i16 scale of each 16 values in the two halves of `sc[s]`
/// (`nsc64`: `-64·scale`), the K-quants' mins (`mins`, `dmin`) and `d`.
struct IqBlock {
    v: [__m256i; 8],
    av: [__m256i; 8],
    sc: [__m256i; 8],
    nsc64: __m256i,
    mins: __m256i,
    d: f32,
    dmin: f32,
}

/// Decodes block `xb` of type `t` for [`iq_tiled`]'s kernel `G`.
#[inline(always)]
unsafe fn iq_block<const G: u8>(t: lamina_core::DType, xb: *const u8, bx: usize) -> IqBlock {
    // SAFETY: `xb` holds a block of `t` (`bx` bytes; the caller's contract); AVX2/F16C
    // enabled by the caller.
    unsafe {
        let mut v = [_mm256_setzero_si256(); 8];
        let mut sc = [_mm256_setzero_si256(); 8];
        let mut dmin = 0f32;
        let mut mins = _mm256_setzero_si256();
        // The scale of each 16 values (Q3_K and the grid i-quants).
        let mut ls16 = [0i16; 16];
        let d = if G == 5 {
            // Q3_K: 16 sub-blocks of 16 signed values (2 low bits, a high bit from
            // `hmask`, minus 4), 6-bit scales minus 32; no min.
            let hm = loadu(xb);
            for s in 0..8 {
                let (j, k) = (s / 4, (s % 4) as i32);
                let bits = loadu(xb.add(32 + 32 * j));
                let low = _mm256_and_si256(
                    _mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * k)),
                    _mm256_set1_epi8(3),
                );
                let h = _mm256_and_si256(
                    _mm256_srl_epi16(hm, _mm_cvtsi32_si128(4 * j as i32 + k)),
                    _mm256_set1_epi8(1),
                );
                v[s] = _mm256_sub_epi8(
                    _mm256_add_epi8(low, _mm256_slli_epi16(h, 2)),
                    _mm256_set1_epi8(4),
                );
                let scales = std::slice::from_raw_parts(xb.add(96), 12);
                let q3s = crate::kernels::repack::q3k_scale;
                ls16[2 * s] = q3s(scales, 2 * s) as i16;
                ls16[2 * s + 1] = q3s(scales, 2 * s + 1) as i16;
                sc[s] =
                    _mm256_set_m128i(_mm_set1_epi16(ls16[2 * s + 1]), _mm_set1_epi16(ls16[2 * s]));
            }
            ld_f16(xb.add(108))
        } else if G == 3 || G == 4 {
            // Q4_K (3) / Q5_K (4): 8 sub-blocks of 32 unsigned values, 6-bit
            // scales and mins; each scale covers two 16-value halves, each min two
            // of the activation's 16-value sums.
            let (scales, mn) =
                crate::kernels::dot::q4k_scales_mins(std::slice::from_raw_parts(xb.add(4), 12));
            let m4 = _mm256_set1_epi8(15);
            let qs = xb.add(if G == 4 { 48 } else { 16 });
            for s in 0..8 {
                let bits = loadu(qs.add(32 * (s / 2)));
                let nib = if s % 2 == 0 {
                    _mm256_and_si256(bits, m4)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4)
                };
                v[s] = if G == 4 {
                    // Bit `s` of each of the 32 `qh` bytes is the value's bit 4.
                    let qh = loadu(xb.add(16));
                    let hb = _mm256_and_si256(
                        _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s as i32)),
                        _mm256_set1_epi8(1),
                    );
                    _mm256_or_si256(nib, _mm256_slli_epi16(hb, 4))
                } else {
                    nib
                };
                sc[s] = _mm256_set1_epi16(i16::from(scales[s]));
            }
            let mut m16 = [0i16; 16];
            for h in 0..16 {
                m16[h] = i16::from(mn[h / 2]);
            }
            mins = _mm256_loadu_si256(m16.as_ptr().cast());
            dmin = ld_f16(xb.add(2));
            ld_f16(xb)
        } else if G == 2 {
            let m3 = _mm256_set1_epi8(3);
            for s in 0..8 {
                let (j, k) = (s / 4, (s % 4) as i32);
                let bits = loadu(xb.add(16 + 32 * j));
                let sh = _mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * k));
                v[s] = _mm256_and_si256(sh, m3);
                sc[s] = _mm256_set_m128i(
                    _mm_set1_epi16(i16::from(*xb.add(2 * s + 1) & 15)),
                    _mm_set1_epi16(i16::from(*xb.add(2 * s) & 15)),
                );
            }
            let m = _mm_loadu_si128(xb as *const __m128i);
            mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(m, 4), _mm_set1_epi8(15)));
            dmin = ld_f16_last(xb.add(82));
            ld_f16(xb.add(80))
        } else if G == 0 {
            let table = {
                let t = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
                _mm256_insertf128_si256(_mm256_castsi128_si256(t), t, 1)
            };
            let sh = u32::from(xb.add(2).cast::<u16>().read_unaligned());
            for s in 0..8 {
                let lo = u32::from(*xb.add(4 + s / 2) >> (4 * (s % 2))) & 0xf;
                let ls = (lo | (((sh >> (2 * s)) & 3) << 4)) as i16 - 32;
                sc[s] = _mm256_set1_epi16(ls);
                let nib = bytes_from_nibbles_32(xb.add(8 + 16 * s));
                v[s] = _mm256_shuffle_epi8(table, nib);
            }
            ld_f16(xb)
        } else if t == lamina_core::DType::IQ2_XXS {
            // `iq_grid_tile`'s IQ2_XXS values, decoded in vectors: per 32 values
            // four grid rows, their signs (the 7 bits and their parity), and one
            // scale `2s + 1` for both halves.
            use crate::kernels::x86::avx2::dot::{KEVEN_SIGNS, rd32, set4};
            use lamina_core::quant::IQ2XXS_GRID;
            for s in 0..8 {
                let a0 = rd32(xb.add(2 + 8 * s));
                let a1 = rd32(xb.add(6 + 8 * s));
                let mut g = [0u64; 4];
                let mut sg = [0u64; 4];
                for l in 0..4 {
                    g[l] = IQ2XXS_GRID[((a0 >> (8 * l)) & 0xff) as usize];
                    sg[l] = KEVEN_SIGNS[((a1 >> (7 * l)) & 127) as usize];
                }
                v[s] = _mm256_sign_epi8(set4(g), set4(sg));
                let l = (2 * (a1 >> 28) + 1) as i16;
                (ls16[2 * s], ls16[2 * s + 1]) = (l, l);
                sc[s] = _mm256_set1_epi16(l);
            }
            ld_f16(xb) * 0.125
        } else {
            let blk = std::slice::from_raw_parts(xb, bx);
            let (d, ls, vals) = crate::kernels::repack::iq_grid_tile(t, blk);
            for s in 0..8 {
                v[s] = loadu(vals.as_ptr().add(32 * s).cast::<u8>());
                ls16[2 * s] = ls[2 * s] as i16;
                ls16[2 * s + 1] = ls[2 * s + 1] as i16;
                sc[s] =
                    _mm256_set_m128i(_mm_set1_epi16(ls16[2 * s + 1]), _mm_set1_epi16(ls16[2 * s]));
            }
            d
        };
        // The sign trick's |v| (IQ4_XS), or the values offset by 64 (the grid
        // i-quants and Q3_K, |v| ≤ 64) and `-64·scale` per 16 values.
        let mut av = [_mm256_setzero_si256(); 8];
        let mut nsc64 = _mm256_setzero_si256();
        for s in 0..8 {
            if G == 0 {
                av[s] = _mm256_sign_epi8(v[s], v[s]);
            } else if matches!(G, 1 | 5) {
                av[s] = _mm256_add_epi8(v[s], _mm256_set1_epi8(64));
            }
        }
        if matches!(G, 1 | 5) {
            nsc64 = _mm256_mullo_epi16(
                _mm256_loadu_si256(ls16.as_ptr().cast()),
                _mm256_set1_epi16(-64),
            );
        }
        IqBlock {
            v,
            av,
            sc,
            nsc64,
            mins,
            d,
            dmin,
        }
    }
}

/// Activation rows per pass of [`iq_tiled`]: their blocks stay in L1 (64 Q8_K blocks, 18.7
/// KB) while every weight row of the call meets them.
const IQ_ROWS: usize = 64;

/// The tiled IQ4_XS (`G == 0`), grid i-quant (`G == 1`, type `t`), Q2_K (`G == 2`), Q4_K
/// (`G == 3`), Q5_K (`G == 4`) or Q3_K (`G == 5`) kernel over the whole product, per group of
/// up to 8 weight rows and [`IQ_ROWS`] activation rows: per weight row and superblock the
/// block is decoded once for all those activation rows; per output the exact
/// `s1 = Σ scale·v·q8` (i32 lanes, see [`rows_i32`]), then `res = d_w * (float)s1`, for the
/// K-quants `res = fma(-dmin_w, (float)s2, res)` with `s2 = Σ min·bsum`, and
/// `acc = fma(res, d_a, acc)`, as [`crate::kernels::repack`]'s scalar kernels.
///
/// # Safety
/// AVX2/FMA/F16C present; every row holds `nb` blocks of `t` (weights) or Q8_K.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq_tiled<const G: u8>(
    t: lamina_core::DType,
    nb: usize,
    w: &[&[u8]],
    a: &[&[u8]],
    out: &mut [f32],
) {
    const WC: usize = 8;
    let (nw, na) = (w.len(), a.len());
    let bx = t.type_size() as usize;
    // SAFETY: rows hold `nb` blocks (the caller's contract).
    unsafe {
        let mut i0 = 0;
        while i0 < nw {
            let rm = (nw - i0).min(WC);
            let mut j0 = 0;
            while j0 < na {
                let rn = (na - j0).min(IQ_ROWS);
                // Per weight row, the outputs of activation rows j0.. (`+ 8`: whole groups).
                let mut acc = [[0f32; IQ_ROWS + 8]; WC];
                let mut yds = [0f32; IQ_ROWS + 8];
                for ib in 0..nb {
                    for j in 0..rn {
                        yds[j] = ld_f32(a[j0 + j].as_ptr().add(ib * 292));
                    }
                    for i in 0..rm {
                        let blk = iq_block::<G>(t, w[i0 + i].as_ptr().add(ib * bx), bx);
                        let mut g = 0;
                        while g < rn {
                            let n = (rn - g).min(8);
                            // Rows past `n` repeat the last one (their lanes are not used).
                            let mut yp = [std::ptr::null::<u8>(); 8];
                            for (u, p) in yp.iter_mut().enumerate() {
                                *p = a[j0 + g + u.min(n - 1)].as_ptr().add(ib * 292);
                            }
                            // The i32 lanes of `s1` (and `s2`) per activation row, 4 rows at a
                            // time with the weights in registers; the float steps then run on
                            // 8 rows, lane `l` for row `l` (the scalar steps).
                            let mut r = [_mm256_setzero_si256(); 8];
                            for h in 0..2 {
                                let p4 = [yp[4 * h], yp[4 * h + 1], yp[4 * h + 2], yp[4 * h + 3]];
                                let r4 = match G {
                                    2..=4 => rows_i32::<0, 4>(p4, &blk, 4 * h < n),
                                    0 => rows_i32::<1, 4>(p4, &blk, 4 * h < n),
                                    _ => rows_i32::<2, 4>(p4, &blk, 4 * h < n),
                                };
                                r[4 * h..4 * h + 4].copy_from_slice(&r4);
                            }
                            let s1 = hsum_i32x8(&r);
                            let mut res =
                                _mm256_mul_ps(_mm256_set1_ps(blk.d), _mm256_cvtepi32_ps(s1));
                            if matches!(G, 2..=4) {
                                let mut s2v = [_mm256_setzero_si256(); 8];
                                for u in 0..8 {
                                    s2v[u] = _mm256_madd_epi16(blk.mins, loadu(yp[u].add(260)));
                                }
                                let s2 = hsum_i32x8(&s2v);
                                res = _mm256_fmadd_ps(
                                    _mm256_set1_ps(-blk.dmin),
                                    _mm256_cvtepi32_ps(s2),
                                    res,
                                );
                            }
                            let yd = _mm256_loadu_ps(yds.as_ptr().add(g));
                            let accp = acc[i].as_mut_ptr().add(g);
                            _mm256_storeu_ps(accp, _mm256_fmadd_ps(res, yd, _mm256_loadu_ps(accp)));
                            g += 8;
                        }
                    }
                }
                for i in 0..rm {
                    for j in 0..rn {
                        out[(j0 + j) * nw + i0 + i] = acc[i][j];
                    }
                }
                j0 += rn;
            }
            i0 += rm;
        }
    }
}

/// Group `l` of 8 values at `p`: f16 (`T == 0`) or f32, as f32.
#[inline(always)]
unsafe fn ld_f16_or_f32<const T: u8>(p: *const u8, l: usize) -> __m256 {
    // SAFETY: group `l` is readable (the caller's contract); AVX/F16C enabled by the caller.
    unsafe {
        if T == 0 {
            _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * l) as *const __m128i))
        } else {
            _mm256_loadu_ps(p.add(32 * l) as *const f32)
        }
    }
}

/// tinyBLAS f16 (`T == 0`, 16 bytes per 8 values) or f32 (`T == 1`): one 8-lane FMA chain,
/// then `hsum`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ftiny<const T: u8, const RM: usize, const RN: usize>(
    nb: usize,
    w: [*const u8; RM],
    a: [*const u8; RN],
) -> [[f32; RN]; RM] {
    let mut acc = [[_mm256_setzero_ps(); RN]; RM];
    // SAFETY: rows hold `nb` groups of 8 values (the caller's contract).
    unsafe {
        for l in 0..nb {
            let mut vb = [_mm256_setzero_ps(); RN];
            for j in 0..RN {
                vb[j] = ld_f16_or_f32::<T>(a[j], l);
            }
            for i in 0..RM {
                let va = ld_f16_or_f32::<T>(w[i], l);
                for j in 0..RN {
                    acc[i][j] = _mm256_fmadd_ps(va, vb[j], acc[i][j]);
                }
            }
        }
        hsum_all(acc)
    }
}
