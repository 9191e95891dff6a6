//! ggml's quantizers for the grid i-quants (`quantize_iq3_s`, `quantize_iq3_xxs`,
//! `quantize_iq2_xxs`, …, llama.cpp 0c1e570 ggml-quants.c) with the search tables of
//! `iq2xs_init_impl` / `iq3xs_init_impl`, built once per grid on first use.
//!
//! Arithmetic follows the C line by line (ggml-base is built without FMA, so nothing is
//! contracted). Where ggml would abort (`GGML_ASSERT` on a grid search that found nothing,
//! which only non-finite intermediate values cause), these pick the first candidate instead.
//! Nothing panics for any input values, finite or not; `qw`, when given, must hold one weight
//! per element of `x` (a shorter slice panics; [`super::quantize_row_iq`] checks it). `x` is
//! quantized in whole blocks of 256, as many as `y` holds.

use std::sync::OnceLock;

use super::blocks::{BlockIQ3S, BlockIQ3XXS, QK_K};
use super::float::f32_to_f16;
use super::iq_kgrids::{KGRID_IQ3_256, KGRID_IQ3_512};
use super::iquants::IQ1S_DELTA;
use super::kquants::nearest_int;

/// ggml's `MAX(a, b)`.
#[inline]
fn c_max(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// A grid's search tables: the grid points (levels `2l + 1`), the map from packed level indices
/// to the grid index (or `-(offset + 1)` into `neighbours` for points off the grid), and the
/// neighbour lists (a count, then grid indices).
pub(crate) struct GridTables<const D: usize> {
    pub(crate) grid: Vec<[i8; D]>,
    pub(crate) map: Vec<i32>,
    pub(crate) neighbours: Vec<u16>,
}

impl<const D: usize> GridTables<D> {
    /// `iq{2,3}xs_init_impl`: `bits` per coordinate in `kgrid`, `kmap_size` map entries, the
    /// `nwant` nearest distinct distances kept as neighbours.
    fn build(kgrid: &[u16], bits: u32, kmap_size: usize, nwant: usize) -> Self {
        let mask = (1u32 << bits) - 1;
        let grid: Vec<[i8; D]> = kgrid
            .iter()
            .map(|&g| {
                std::array::from_fn(|i| {
                    (2 * ((u32::from(g) >> (bits * i as u32)) & mask) + 1) as i8
                })
            })
            .collect();
        let mut map = vec![-1i32; kmap_size];
        for (i, p) in grid.iter().enumerate() {
            let mut index = 0usize;
            for (k, &v) in p.iter().enumerate() {
                index |= (((v - 1) / 2) as usize) << (bits as usize * k);
            }
            map[index] = i as i32;
        }
        let mut neighbours = Vec::new();
        let mut dist = vec![0i32; grid.len()];
        let mut order: Vec<(i32, u16)> = Vec::with_capacity(grid.len());
        for i in 0..kmap_size {
            if map[i] >= 0 {
                continue;
            }
            let pos: [i32; D] =
                std::array::from_fn(|k| 2 * ((i as u32 >> (bits * k as u32)) & mask) as i32 + 1);
            for (d, p) in dist.iter_mut().zip(&grid) {
                let mut d2 = 0;
                for k in 0..D {
                    let t = i32::from(p[k]) - pos[k];
                    d2 += t * t;
                }
                *d = d2;
            }
            // The `nwant` smallest distinct distances, then every grid point at one of them in
            // (distance, index) order: what ggml's qsort by (d2, j) and scan keep.
            let mut levels: Vec<i32> = Vec::with_capacity(nwant);
            for &d in &dist {
                if levels.contains(&d) {
                    continue;
                }
                if levels.len() < nwant {
                    levels.push(d);
                    levels.sort_unstable();
                } else if d < levels[nwant - 1] {
                    levels[nwant - 1] = d;
                    levels.sort_unstable();
                }
            }
            let limit = levels[levels.len() - 1];
            order.clear();
            order.extend(
                dist.iter()
                    .enumerate()
                    .filter(|&(_, &d)| d <= limit)
                    .map(|(j, &d)| (d, j as u16)),
            );
            order.sort_unstable();
            map[i] = -(neighbours.len() as i32 + 1);
            neighbours.push(order.len() as u16);
            neighbours.extend(order.iter().map(|&(_, j)| j));
        }
        GridTables {
            grid,
            map,
            neighbours,
        }
    }

    /// The neighbour list of the off-grid point whose map entry is `m` (< 0).
    #[inline]
    fn neighbours_of(&self, m: i32) -> &[u16] {
        let start = (-m - 1) as usize;
        let n = usize::from(self.neighbours[start]);
        &self.neighbours[start + 1..start + 1 + n]
    }

    /// `iq{2,3}_find_best_neighbour`: the neighbour minimising Σ w (scale·q − x)², its levels
    /// written to `l`.
    fn best_neighbour(
        &self,
        m: i32,
        xval: &[f32],
        weight: &[f32],
        scale: f32,
        l: &mut [i8],
    ) -> usize {
        let cands = self.neighbours_of(m);
        let mut best_d2 = f32::MAX;
        let mut grid_index = usize::from(cands[0]);
        for &j in cands {
            let pg = &self.grid[usize::from(j)];
            let mut d2 = 0.0f32;
            for i in 0..D {
                let q = f32::from(pg[i]);
                let diff = scale * q - xval[i];
                d2 += weight[i] * diff * diff;
            }
            if d2 < best_d2 {
                best_d2 = d2;
                grid_index = usize::from(j);
            }
        }
        let pg = &self.grid[grid_index];
        for i in 0..D {
            l[i] = (pg[i] - 1) / 2;
        }
        grid_index
    }
}

/// The IQ3_XXS (256 points) and IQ3_S (512 points) tables.
fn iq3_tables(grid_size: usize) -> &'static GridTables<4> {
    static T256: OnceLock<GridTables<4>> = OnceLock::new();
    static T512: OnceLock<GridTables<4>> = OnceLock::new();
    if grid_size == 256 {
        T256.get_or_init(|| GridTables::build(&KGRID_IQ3_256, 3, 4096, 2))
    } else {
        T512.get_or_init(|| GridTables::build(&KGRID_IQ3_512, 3, 4096, 3))
    }
}

/// The per-sub-block importance of each element: `qw · sqrt(sigma2 + x²)`, or `x²` without
/// weights.
#[inline]
fn importance(xb: &[f32], qw: Option<&[f32]>, sigma2: f32, weight: &mut [f32]) {
    match qw {
        Some(qw) => {
            for i in 0..xb.len() {
                weight[i] = qw[i] * (sigma2 + xb[i] * xb[i]).sqrt();
            }
        }
        None => {
            for i in 0..xb.len() {
                weight[i] = xb[i] * xb[i];
            }
        }
    }
}

#[inline]
fn sigma2_of(xbl: &[f32]) -> f32 {
    let mut sumx2 = 0.0f32;
    for &v in xbl {
        sumx2 += v * v;
    }
    2.0 * sumx2 / QK_K as f32
}

/// `Σ w·x·q` and `Σ w·q²` with `q = 2l + 1`.
#[inline]
fn sums_odd(weight: &[f32], xval: &[f32], l: &[i8]) -> (f32, f32) {
    let mut sumqx = 0.0f32;
    let mut sumq2 = 0.0f32;
    for i in 0..weight.len() {
        let w = weight[i];
        let q = f32::from(2 * l[i] + 1);
        sumqx += w * xval[i] * q;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// The levels (0..=7) of 4 values at `id`, packed 3 bits each.
#[inline]
fn iq3_levels(id: f32, xval: &[f32], l: &mut [i8]) -> usize {
    let mut u = 0usize;
    for i in 0..4 {
        let v = nearest_int(0.5 * (id * xval[i] - 1.0)).clamp(0, 7);
        l[i] = v as i8;
        u |= (v as usize) << (3 * i);
    }
    u
}

/// One IQ3 sub-block of 32: the search of `quantize_row_iq3_{xxs,s}_impl`. Returns the scale
/// and writes the levels `l` (on the grid); `xval`, `weight`, `waux` are the prepared inputs.
#[allow(clippy::too_many_arguments)]
fn iq3_search(
    t: &GridTables<4>,
    xxs: bool,
    max: f32,
    xval: &[f32; 32],
    weight: &[f32; 32],
    waux: &[f32; 32],
    l: &mut [i8; 32],
) -> f32 {
    let k_max_q = 8;
    let mut best = 0.0f32;
    let mut scale = max / (2 * k_max_q - 1) as f32;
    let mut laux = [0i8; 32];
    let mut on_grid = [xxs; 8];
    let mut on_grid_aux = [true; 8];
    let (lo, hi) = if xxs { (-15, 15) } else { (-9, 9) };
    for is in lo..=hi {
        let id = ((2 * k_max_q - 1) as f32 + is as f32 * 0.2) / max;
        let this_scale = 1.0 / id;
        for k in 0..8 {
            let r = 4 * k..4 * k + 4;
            let u = iq3_levels(id, &xval[r.clone()], &mut laux[r.clone()]);
            let m = t.map[u];
            on_grid_aux[k] = true;
            if m < 0 {
                on_grid_aux[k] = false;
                t.best_neighbour(
                    m,
                    &xval[r.clone()],
                    &waux[r.clone()],
                    this_scale,
                    &mut laux[r],
                );
            }
        }
        let (sumqx, sumq2) = sums_odd(weight, xval, &laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            *l = laux;
            on_grid = on_grid_aux;
        }
    }
    let n_not_ongrid = on_grid.iter().filter(|&&g| !g).count();
    if n_not_ongrid > 0 && scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..8 {
            if xxs && on_grid[k] {
                continue;
            }
            let r = 4 * k..4 * k + 4;
            let mut tmp = [0i8; 4];
            let u = iq3_levels(id, &xval[r.clone()], &mut tmp);
            let m = t.map[u];
            let grid_index = if m < 0 {
                t.best_neighbour(
                    m,
                    &xval[r.clone()],
                    &waux[r.clone()],
                    scale,
                    &mut l[r.clone()],
                )
            } else {
                m as usize
            };
            let pg = &t.grid[grid_index];
            for i in 0..4 {
                l[4 * k + i] = (pg[i] - 1) / 2;
            }
        }
        let (sumqx, sumq2) = sums_odd(weight, xval, l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    scale
}

/// The grid index of 4 levels (which the search leaves on the grid; 0 if not, where ggml aborts).
#[inline]
fn iq3_index(t: &GridTables<4>, l: &[i8]) -> usize {
    let mut u = 0usize;
    for i in 0..4 {
        u |= ((l[i] as u8 & 7) as usize) << (3 * i);
    }
    t.map[u].max(0) as usize
}

/// Splits 32 values into magnitudes and sign bits.
#[inline]
fn iq3_prepare(xb: &[f32], xval: &mut [f32; 32], signs: &mut [u8; 4]) -> u32 {
    let mut nflips = 0;
    for k in 0..4 {
        let mut s = 0u8;
        let mut nflip = 0;
        for i in 0..8 {
            let v = xb[8 * k + i];
            if v >= 0.0 {
                xval[8 * k + i] = v;
            } else {
                xval[8 * k + i] = -v;
                s |= 1 << i;
                nflip += 1;
            }
        }
        signs[k] = s;
        nflips |= (nflip & 1) << k;
    }
    nflips
}

/// `quantize_iq3_s` for one row (`quantize_row_iq3_s_impl` with sub-blocks of 32); `qw`
/// (optional) holds one importance weight per element of `x`.
pub fn quantize_row_iq3_s_weighted(x: &[f32], y: &mut [BlockIQ3S], qw: Option<&[f32]>) {
    let t = iq3_tables(512);
    for (ibl, (xbl, yb)) in x.chunks_exact(QK_K).zip(y.iter_mut()).enumerate() {
        *yb = bytemuck::Zeroable::zeroed();
        let mut scales = [0f32; 8];
        let mut max_scale = 0.0f32;
        let sigma2 = sigma2_of(xbl);
        // ggml advances its qs/signs pointers only past sub-blocks it writes (a zero sub-block
        // `continue`s before the increments), so later sub-blocks move down.
        let mut qs_pos = 0usize;
        let mut signs_pos = 0usize;
        for ib in 0..QK_K / 32 {
            let xb = &xbl[32 * ib..32 * ib + 32];
            let mut weight = [0f32; 32];
            importance(
                xb,
                qw.map(|w| &w[QK_K * ibl + 32 * ib..QK_K * ibl + 32 * ib + 32]),
                sigma2,
                &mut weight,
            );
            let waux: [f32; 32] = std::array::from_fn(|i| weight[i].sqrt());
            let mut xval = [0f32; 32];
            let mut block_signs = [0u8; 4];
            iq3_prepare(xb, &mut xval, &mut block_signs);
            let mut max = xval[0];
            for &v in &xval[1..] {
                max = c_max(max, v);
            }
            let mut l = [0i8; 32];
            if max == 0.0 {
                scales[ib] = 0.0;
                continue;
            }
            let mut scale = iq3_search(t, false, max, &xval, &weight, &waux, &mut l);
            if scale < 0.0 {
                scale = -scale;
                for s in &mut block_signs {
                    *s = !*s;
                }
            }
            for k in 0..8 {
                let grid_index = iq3_index(t, &l[4 * k..4 * k + 4]);
                yb.qs[qs_pos + k] = (grid_index & 255) as u8;
                yb.qh[ib] |= ((grid_index >> 8) << k) as u8;
            }
            qs_pos += 8;
            yb.signs[signs_pos..signs_pos + 4].copy_from_slice(&block_signs);
            signs_pos += 4;
            scales[ib] = scale;
            max_scale = c_max(max_scale, scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 31.0;
        yb.d = f32_to_f16(d * 1.033);
        let id = 1.0 / d;
        for ib in (0..QK_K / 32).step_by(2) {
            let l1 = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15);
            let l2 = nearest_int(0.5 * (id * scales[ib + 1] - 1.0)).clamp(0, 15);
            yb.scales[ib / 2] = (l1 | (l2 << 4)) as u8;
        }
    }
}

/// `quantize_iq3_xxs` for one row (`quantize_row_iq3_xxs_impl(256, ..)`); `qw` (optional)
/// holds one importance weight per element of `x`.
pub fn quantize_row_iq3_xxs_weighted(x: &[f32], y: &mut [BlockIQ3XXS], qw: Option<&[f32]>) {
    const GROUP_MAX_EPS_IQ3_XXS: f32 = 1e-8;
    let t = iq3_tables(256);
    for (ibl, (xbl, yb)) in x.chunks_exact(QK_K).zip(y.iter_mut()).enumerate() {
        let mut q3 = [0u8; 3 * QK_K / 8];
        let mut scales_and_signs = [0u32; 8];
        let mut scales = [0f32; 8];
        let mut max_scale = 0.0f32;
        let sigma2 = sigma2_of(xbl);
        for ib in 0..QK_K / 32 {
            let xb = &xbl[32 * ib..32 * ib + 32];
            let mut weight = [0f32; 32];
            importance(
                xb,
                qw.map(|w| &w[QK_K * ibl + 32 * ib..QK_K * ibl + 32 * ib + 32]),
                sigma2,
                &mut weight,
            );
            let waux: [f32; 32] = std::array::from_fn(|i| weight[i].sqrt());
            let mut xval = [0f32; 32];
            let mut block_signs = [0u8; 4];
            even_signs(xb, &weight, &mut xval, &mut block_signs);
            let mut max = xval[0];
            for &v in &xval[1..] {
                max = c_max(max, v);
            }
            let mut l = [0i8; 32];
            if max < GROUP_MAX_EPS_IQ3_XXS {
                scales[ib] = 0.0;
                continue;
            }
            let mut scale = iq3_search(t, true, max, &xval, &weight, &waux, &mut l);
            if scale < 0.0 {
                scale = -scale;
                for s in &mut block_signs {
                    *s = !*s & 127;
                }
            }
            for k in 0..8 {
                q3[8 * ib + k] = iq3_index(t, &l[4 * k..4 * k + 4]) as u8;
            }
            scales_and_signs[ib] = u32::from(block_signs[0])
                | (u32::from(block_signs[1]) << 7)
                | (u32::from(block_signs[2]) << 14)
                | (u32::from(block_signs[3]) << 21);
            scales[ib] = scale;
            max_scale = c_max(max_scale, scale);
        }
        yb.d = f32_to_f16(0.0);
        if max_scale == 0.0 {
            yb.qs = [0; 3 * QK_K / 8];
            continue;
        }
        let d = max_scale / 31.0;
        yb.d = f32_to_f16(d * 1.0125);
        let id = 1.0 / d;
        for ib in 0..QK_K / 32 {
            let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15);
            scales_and_signs[ib] |= (l as u32) << 28;
        }
        for ib in 0..8 {
            q3[QK_K / 4 + 4 * ib..QK_K / 4 + 4 * ib + 4]
                .copy_from_slice(&scales_and_signs[ib].to_le_bytes());
        }
        yb.qs = q3;
    }
}

/// ggml's `make_qp_quants` (levels `0..=nmax`, importance `qw`): the returned scale only (the
/// IQ2 callers overwrite the levels).
fn make_qp_quants(nmax: i32, x: &[f32], qw: &[f32]) -> f32 {
    let mut l = [0u8; 32];
    super::weighted::make_qp_quants(nmax, x, &mut l[..x.len()], qw)
}

/// The IQ2 and IQ1 search tables (`iq2xs_init_impl` for each type).
fn iq2_tables(dtype: crate::DType) -> &'static GridTables<8> {
    use super::iq_kgrids::{KGRID_IQ1_2048, KGRID_IQ2_256, KGRID_IQ2_512, KGRID_IQ2_1024};
    use crate::DType::*;
    const KMAP_SIZE: usize = 43692;
    static T: [OnceLock<GridTables<8>>; 4] = [
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
    ];
    match dtype {
        IQ2_XXS => T[0].get_or_init(|| GridTables::build(&KGRID_IQ2_256, 2, KMAP_SIZE, 2)),
        IQ2_XS => T[1].get_or_init(|| GridTables::build(&KGRID_IQ2_512, 2, KMAP_SIZE, 2)),
        IQ1_S | IQ1_M => T[2].get_or_init(|| GridTables::build(&KGRID_IQ1_2048, 2, KMAP_SIZE, 3)),
        _ => T[3].get_or_init(|| GridTables::build(&KGRID_IQ2_1024, 2, KMAP_SIZE, 1)),
    }
}

/// The levels (0..=2) of 8 values at `id`, packed 2 bits each.
#[inline]
fn iq2_levels(id: f32, xval: &[f32], l: &mut [i8]) -> usize {
    let mut u = 0usize;
    for i in 0..8 {
        let v = nearest_int(0.5 * (id * xval[i] - 1.0)).clamp(0, 2);
        l[i] = v as i8;
        u |= (v as usize) << (2 * i);
    }
    u
}

/// The grid index of 8 levels (on the grid after the search; 0 if not, where ggml aborts).
#[inline]
fn iq2_index(t: &GridTables<8>, l: &[i8]) -> usize {
    let mut u = 0usize;
    for i in 0..8 {
        u |= ((l[i] as u8 & 3) as usize) << (2 * i);
    }
    t.map.get(u).copied().unwrap_or(-1).max(0) as usize
}

/// Magnitudes and sign bits of 32 values with an even number of negatives per 8 (the sign of
/// the least important element of an odd group is dropped), as the IQ2_XXS/IQ2_XS/IQ3_XXS
/// quantizers do.
#[inline]
fn even_signs(xb: &[f32], weight: &[f32; 32], xval: &mut [f32; 32], signs: &mut [u8; 4]) {
    let odd = iq3_prepare(xb, xval, signs);
    for k in 0..4 {
        if odd & (1 << k) != 0 {
            let o = 8 * k;
            let mut imin = 0;
            let mut min = weight[o] * xb[o] * xb[o];
            for i in 1..8 {
                let ax = weight[o + i] * xb[o + i] * xb[o + i];
                if ax < min {
                    min = ax;
                    imin = i;
                }
            }
            xval[o + imin] = -xval[o + imin];
            signs[k] ^= 1 << imin;
        }
        signs[k] &= 127;
    }
}

/// The IQ2 search over 32 values in groups of 8 (`quantize_row_iq2_{xxs,xs}_impl`): `nis` the
/// range of scale tries; returns the scale, levels in `l`.
#[allow(clippy::too_many_arguments)]
fn iq2_search(
    t: &GridTables<8>,
    xval: &[f32],
    weight: &[f32],
    waux: &[f32],
    l: &mut [i8],
    eff_max: f32,
    mut scale: f32,
    nis: i32,
) -> f32 {
    let k_max_q = 3;
    let groups = xval.len() / 8;
    let mut best = 0.0f32;
    let mut laux = [0i8; 32];
    let laux = &mut laux[..xval.len()];
    for is in -nis..=nis {
        let id = ((2 * k_max_q - 1) as f32 + is as f32 * 0.1) / eff_max;
        let this_scale = 1.0 / id;
        for k in 0..groups {
            let r = 8 * k..8 * k + 8;
            let u = iq2_levels(id, &xval[r.clone()], &mut laux[r.clone()]);
            let m = t.map[u];
            if m < 0 {
                t.best_neighbour(
                    m,
                    &xval[r.clone()],
                    &waux[r.clone()],
                    this_scale,
                    &mut laux[r],
                );
            }
        }
        let (sumqx, sumq2) = sums_odd(weight, xval, laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            l.copy_from_slice(laux);
        }
    }
    if scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..groups {
            let r = 8 * k..8 * k + 8;
            let mut tmp = [0i8; 8];
            let u = iq2_levels(id, &xval[r.clone()], &mut tmp);
            let m = t.map[u];
            let grid_index = if m < 0 {
                t.best_neighbour(
                    m,
                    &xval[r.clone()],
                    &waux[r.clone()],
                    scale,
                    &mut l[r.clone()],
                )
            } else {
                m as usize
            };
            let pg = &t.grid[grid_index];
            for i in 0..8 {
                l[8 * k + i] = (pg[i] - 1) / 2;
            }
        }
        let (sumqx, sumq2) = sums_odd(weight, xval, l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    scale
}

/// `quantize_iq2_xxs` for one row (`quantize_row_iq2_xxs_impl`); `qw` holds one importance
/// weight per element of `x` (ggml requires them; `None` uses 1 for every element).
pub fn quantize_row_iq2_xxs_weighted(
    x: &[f32],
    y: &mut [super::blocks::BlockIQ2XXS],
    qw: Option<&[f32]>,
) {
    const GROUP_MAX_EPS: f32 = 1e-15;
    let t = iq2_tables(crate::DType::IQ2_XXS);
    let ones = [1.0f32; 32];
    for (ibl, (xbl, yb)) in x.chunks_exact(QK_K).zip(y.iter_mut()).enumerate() {
        let mut q2 = [0u32; 2 * QK_K / 32];
        let mut scales = [0f32; 8];
        let mut max_scale = 0.0f32;
        let mut sumx2 = 0.0f32;
        for &v in xbl {
            sumx2 += v * v;
        }
        let sigma2 = sumx2 / QK_K as f32;
        for ib in 0..QK_K / 32 {
            let xb = &xbl[32 * ib..32 * ib + 32];
            let o = QK_K * ibl + 32 * ib;
            let qwb = qw.map_or(&ones[..], |w| &w[o..o + 32]);
            let mut weight = [0f32; 32];
            importance(xb, Some(qwb), sigma2, &mut weight);
            let waux: [f32; 32] = std::array::from_fn(|i| weight[i].sqrt());
            let mut xval = [0f32; 32];
            let mut block_signs = [0u8; 4];
            even_signs(xb, &weight, &mut xval, &mut block_signs);
            let mut max = xval[0];
            for &v in &xval[1..] {
                max = c_max(max, v);
            }
            let mut l = [0i8; 32];
            if max < GROUP_MAX_EPS {
                scales[ib] = 0.0;
                continue;
            }
            let scale = make_qp_quants(4, &xval, &weight);
            let eff_max = scale * 3.0;
            if eff_max <= 0.0 {
                scales[ib] = 0.0;
                continue;
            }
            let mut scale = iq2_search(t, &xval, &weight, &waux, &mut l, eff_max, scale, 6);
            if scale < 0.0 {
                scale = -scale;
                for s in &mut block_signs {
                    *s = !*s & 127;
                }
            }
            for k in 0..4 {
                let grid_index = iq2_index(t, &l[8 * k..8 * k + 8]) as u32;
                q2[2 * ib] |= grid_index << (8 * k);
                q2[2 * ib + 1] |= u32::from(block_signs[k]) << (7 * k);
            }
            scales[ib] = scale;
            max_scale = c_max(max_scale, scale);
        }
        yb.d = f32_to_f16(0.0);
        if max_scale == 0.0 {
            yb.qs = [0; QK_K / 8];
            continue;
        }
        let d = max_scale / 31.0;
        yb.d = f32_to_f16(d);
        let id = 1.0 / d;
        for ib in 0..QK_K / 32 {
            let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15);
            q2[2 * ib + 1] |= (l as u32) << 28;
        }
        for (k, w) in q2.iter().enumerate() {
            yb.qs[2 * k] = *w as u16;
            yb.qs[2 * k + 1] = (*w >> 16) as u16;
        }
    }
}

/// The IQ2_XS / IQ2_S search over 16 values in two groups of 8 (`quantize_row_iq2_{xs,s}_impl`):
/// returns the scale, levels in `l`.
fn iq2_search16(
    t: &GridTables<8>,
    max: f32,
    xval: &[f32; 16],
    weight: &[f32; 16],
    waux: &[f32; 16],
    l: &mut [i8; 16],
) -> f32 {
    let k_max_q = 3;
    let mut best = 0.0f32;
    let mut scale = max / (2 * k_max_q - 1) as f32;
    let mut laux = [0i8; 16];
    let mut on_grid = [true; 2];
    let mut on_grid_aux = [true; 2];
    for is in -9..=9 {
        let id = ((2 * k_max_q - 1) as f32 + is as f32 * 0.1) / max;
        let this_scale = 1.0 / id;
        for k in 0..2 {
            let r = 8 * k..8 * k + 8;
            let u = iq2_levels(id, &xval[r.clone()], &mut laux[r.clone()]);
            let m = t.map[u];
            on_grid_aux[k] = true;
            if m < 0 {
                on_grid_aux[k] = false;
                t.best_neighbour(
                    m,
                    &xval[r.clone()],
                    &waux[r.clone()],
                    this_scale,
                    &mut laux[r],
                );
            }
        }
        let (sumqx, sumq2) = sums_odd(weight, xval, &laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            *l = laux;
            on_grid = on_grid_aux;
        }
    }
    if on_grid.iter().any(|&g| !g) && scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..2 {
            if on_grid[k] {
                continue;
            }
            let r = 8 * k..8 * k + 8;
            let u = iq2_levels(id, &xval[r.clone()], &mut l[r.clone()]);
            let m = t.map[u];
            if m < 0 {
                t.best_neighbour(m, &xval[r.clone()], &waux[r.clone()], scale, &mut l[r]);
            }
        }
        let (sumqx, sumq2) = sums_odd(weight, xval, l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    scale
}

/// The 4-bit sub-block scales of IQ2_XS / IQ2_S, two per byte.
fn iq2_scales16(scales: &[f32; 16], id: f32, out: &mut [u8; QK_K / 32]) {
    for ib in 0..QK_K / 16 {
        let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15) as u8;
        if ib % 2 == 0 {
            out[ib / 2] = l;
        } else {
            out[ib / 2] |= l << 4;
        }
    }
}

/// `quantize_iq2_xs` for one row (`quantize_row_iq2_xs_impl`); `qw` holds one importance weight
/// per element of `x` (ggml requires them; `None` uses 1 for every element).
pub fn quantize_row_iq2_xs_weighted(
    x: &[f32],
    y: &mut [super::blocks::BlockIQ2XS],
    qw: Option<&[f32]>,
) {
    const GROUP_MAX_EPS: f32 = 1e-15;
    let t = iq2_tables(crate::DType::IQ2_XS);
    let ones = [1.0f32; 16];
    for (ibl, (xbl, yb)) in x.chunks_exact(QK_K).zip(y.iter_mut()).enumerate() {
        let mut q2 = [0u16; QK_K / 8];
        yb.scales = [0; QK_K / 32];
        let mut scales = [0f32; 16];
        let mut max_scale = 0.0f32;
        let mut sumx2 = 0.0f32;
        for &v in xbl {
            sumx2 += v * v;
        }
        let sigma2 = sumx2 / QK_K as f32;
        for ib in 0..QK_K / 16 {
            let xb = &xbl[16 * ib..16 * ib + 16];
            let o = QK_K * ibl + 16 * ib;
            let qwb = qw.map_or(&ones[..], |w| &w[o..o + 16]);
            let mut weight = [0f32; 16];
            importance(xb, Some(qwb), sigma2, &mut weight);
            let waux: [f32; 16] = std::array::from_fn(|i| weight[i].sqrt());
            let mut xval = [0f32; 16];
            let mut block_signs = [0u8; 2];
            for k in 0..2 {
                let mut s = 0u8;
                let mut nflip = 0;
                for i in 0..8 {
                    let v = xb[8 * k + i];
                    if v >= 0.0 {
                        xval[8 * k + i] = v;
                    } else {
                        xval[8 * k + i] = -v;
                        nflip += 1;
                        s |= 1 << i;
                    }
                }
                if nflip % 2 == 1 {
                    let o = 8 * k;
                    let mut imin = 0;
                    let mut min = weight[o] * xb[o] * xb[o];
                    for i in 1..8 {
                        let ax = weight[o + i] * xb[o + i] * xb[o + i];
                        if ax < min {
                            min = ax;
                            imin = i;
                        }
                    }
                    xval[o + imin] = -xval[o + imin];
                    s ^= 1 << imin;
                }
                block_signs[k] = s & 127;
            }
            let mut max = xval[0];
            for &v in &xval[1..] {
                max = c_max(max, v);
            }
            let mut l = [0i8; 16];
            if max < GROUP_MAX_EPS {
                scales[ib] = 0.0;
                continue;
            }
            let mut scale = iq2_search16(t, max, &xval, &weight, &waux, &mut l);
            if scale < 0.0 {
                scale = -scale;
                for s in &mut block_signs {
                    *s = !*s & 127;
                }
            }
            for k in 0..2 {
                let grid_index = iq2_index(t, &l[8 * k..8 * k + 8]) as u16;
                q2[2 * ib + k] = grid_index | (u16::from(block_signs[k]) << 9);
            }
            scales[ib] = scale;
            max_scale = c_max(max_scale, scale);
        }
        yb.d = f32_to_f16(0.0);
        if max_scale == 0.0 {
            yb.qs = [0; QK_K / 8];
            continue;
        }
        let d = max_scale / 31.0;
        yb.d = f32_to_f16(d);
        iq2_scales16(&scales, 1.0 / d, &mut yb.scales);
        yb.qs = q2;
    }
}

/// `quantize_iq2_s` for one row (`quantize_row_iq2_s_impl`); `qw` (optional) holds one
/// importance weight per element of `x`.
pub fn quantize_row_iq2_s_weighted(
    x: &[f32],
    y: &mut [super::blocks::BlockIQ2S],
    qw: Option<&[f32]>,
) {
    const GROUP_MAX_EPS_IQ2_S: f32 = 1e-8;
    let t = iq2_tables(crate::DType::IQ2_S);
    for (ibl, (xbl, yb)) in x.chunks_exact(QK_K).zip(y.iter_mut()).enumerate() {
        *yb = bytemuck::Zeroable::zeroed();
        let mut scales = [0f32; 16];
        let mut max_scale = 0.0f32;
        let sigma2 = sigma2_of(xbl);
        for ib in 0..QK_K / 16 {
            let xb = &xbl[16 * ib..16 * ib + 16];
            let mut weight = [0f32; 16];
            match qw {
                Some(w) => {
                    let o = QK_K * ibl + 16 * ib;
                    importance(xb, Some(&w[o..o + 16]), sigma2, &mut weight);
                }
                None => {
                    for i in 0..16 {
                        weight[i] = 0.25 * sigma2 + xb[i] * xb[i];
                    }
                }
            }
            let waux: [f32; 16] = std::array::from_fn(|i| weight[i].sqrt());
            let mut xval = [0f32; 16];
            let mut block_signs = [0u8; 2];
            for k in 0..2 {
                let mut s = 0u8;
                for i in 0..8 {
                    let v = xb[8 * k + i];
                    if v >= 0.0 {
                        xval[8 * k + i] = v;
                    } else {
                        xval[8 * k + i] = -v;
                        s |= 1 << i;
                    }
                }
                block_signs[k] = s;
            }
            let mut max = xval[0];
            for &v in &xval[1..] {
                max = c_max(max, v);
            }
            let mut l = [0i8; 16];
            if max < GROUP_MAX_EPS_IQ2_S {
                scales[ib] = 0.0;
                continue;
            }
            let mut scale = iq2_search16(t, max, &xval, &weight, &waux, &mut l);
            if scale < 0.0 {
                scale = -scale;
                for s in &mut block_signs {
                    *s = !*s;
                }
            }
            for k in 0..2 {
                let grid_index = iq2_index(t, &l[8 * k..8 * k + 8]);
                let i8 = 2 * ib + k;
                yb.qs[i8] = (grid_index & 255) as u8;
                yb.qh[i8 / 4] |= ((grid_index >> 8) << (2 * (i8 % 4))) as u8;
                yb.qs[QK_K / 8 + i8] = block_signs[k];
            }
            scales[ib] = scale;
            max_scale = c_max(max_scale, scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 31.0;
        yb.d = f32_to_f16(d * 0.9875);
        iq2_scales16(&scales, 1.0 / d, &mut yb.scales);
    }
}

/// `iq1_find_best_neighbour2`: the neighbour minimising Σ w (scale·xx[l] − x)², levels to `l`.
/// (ggml's fallback over the whole grid, reached only when every distance is non-finite, reads
/// out of bounds; the first neighbour is taken here.)
fn iq1_best_neighbour2(
    t: &GridTables<8>,
    m: i32,
    xval: &[f32],
    weight: &[f32],
    scale: f32,
    xx: &[f32; 3],
    l: &mut [i8],
) -> usize {
    let cands = t.neighbours_of(m);
    let mut best = f32::MAX;
    let mut grid_index = usize::from(cands[0]);
    for &j in cands {
        let pg = &t.grid[usize::from(j)];
        let mut d2 = 0.0f32;
        for i in 0..8 {
            let q = xx[((pg[i] - 1) / 2) as usize];
            let diff = scale * q - xval[i];
            d2 += weight[i] * diff * diff;
        }
        if d2 < best {
            best = d2;
            grid_index = usize::from(j);
        }
    }
    let pg = &t.grid[grid_index];
    for i in 0..8 {
        l[i] = (pg[i] - 1) / 2;
    }
    grid_index
}

/// The shifted IQ1 levels: `x_p` (shift +1/8) and `x_m` (−1/8).
const IQ1_XP: [f32; 3] = [-1.0 + IQ1S_DELTA, IQ1S_DELTA, 1.0 + IQ1S_DELTA];
const IQ1_XM: [f32; 3] = [-1.0 - IQ1S_DELTA, -IQ1S_DELTA, 1.0 - IQ1S_DELTA];

/// The order of `xb` ascending, as glibc's (stable, merge sort) `qsort` leaves it.
fn iq1_order<const N: usize>(xb: &[f32]) -> [usize; N] {
    let mut idx: [usize; N] = std::array::from_fn(|j| j);
    // ggml's comparator (`<`, `>`, else equal) for finite values; NaNs, which ggml's
    // non-total order leaves wherever the merge puts them, go last here so the order stays
    // total (the sort may panic otherwise).
    idx.sort_by(|&a, &b| {
        let (l, r) = (xb[a], xb[b]);
        l.partial_cmp(&r)
            .unwrap_or_else(|| l.is_nan().cmp(&r.is_nan()))
    });
    idx
}

/// `quantize_iq1_s` for one row (`quantize_row_iq1_s_impl`); `qw` holds one importance weight
/// per element of `x` (ggml requires them; `None` uses 1 for every element).
pub fn quantize_row_iq1_s_weighted(
    x: &[f32],
    y: &mut [super::blocks::BlockIQ1S],
    qw: Option<&[f32]>,
) {
    const GROUP_MAX_EPS_IQ1_S: f32 = 1e-12;
    const BS: usize = 32;
    let t = iq2_tables(crate::DType::IQ1_S);
    let ones = [1.0f32; BS];
    for (ibl, (xbl, yb)) in x.chunks_exact(QK_K).zip(y.iter_mut()).enumerate() {
        yb.d = f32_to_f16(0.0);
        yb.qs = [0; QK_K / 8];
        yb.qh = [0; QK_K / 32];
        let mut scales = [0f32; QK_K / BS];
        let mut shifts = [1i8; QK_K / BS];
        let mut max_scale = 0.0f32;
        let sigma2 = sigma2_of(xbl);
        for ib in 0..QK_K / BS {
            let xb = &xbl[BS * ib..BS * ib + BS];
            let o = QK_K * ibl + BS * ib;
            let qwb = qw.map_or(&ones[..], |w| &w[o..o + BS]);
            let mut weight = [0f32; BS];
            importance(xb, Some(qwb), sigma2, &mut weight);
            let mut max = xb[0].abs();
            for &v in &xb[1..] {
                max = c_max(max, v.abs());
            }
            if max < GROUP_MAX_EPS_IQ1_S {
                scales[ib] = 0.0;
                shifts[ib] = 1;
                continue;
            }
            let idx = iq1_order::<BS>(xb);
            let mut sumx = [0f32; BS + 1];
            let mut sumw = [0f32; BS + 1];
            for j in 0..BS {
                let i = idx[j];
                sumx[j + 1] = sumx[j] + weight[i] * xb[i];
                sumw[j + 1] = sumw[j] + weight[i];
            }
            let mut best_score = -f32::MAX;
            let mut scale = max;
            let (mut besti1, mut besti2, mut best_shift) = (usize::MAX, usize::MAX, 0i8);
            for i1 in 0..=BS {
                for i2 in i1..=BS {
                    for (xs, shift) in [(&IQ1_XP, 1i8), (&IQ1_XM, -1)] {
                        let sumqx = (sumx[i1] - sumx[0]) * xs[0]
                            + (sumx[i2] - sumx[i1]) * xs[1]
                            + (sumx[BS] - sumx[i2]) * xs[2];
                        let sumq2 = (sumw[i1] - sumw[0]) * xs[0] * xs[0]
                            + (sumw[i2] - sumw[i1]) * xs[1] * xs[1]
                            + (sumw[BS] - sumw[i2]) * xs[2] * xs[2];
                        if sumq2 > 0.0 && sumqx * sumqx > best_score * sumq2 {
                            scale = sumqx / sumq2;
                            best_score = scale * sumqx;
                            besti1 = i1;
                            besti2 = i2;
                            best_shift = shift;
                        }
                    }
                }
            }
            if besti1 == usize::MAX || best_shift == 0 {
                scales[ib] = 0.0;
                shifts[ib] = 1;
                continue;
            }
            let mut l = [0i8; BS];
            for (j, &i) in idx.iter().enumerate() {
                l[i] = if j < besti1 {
                    0
                } else if j < besti2 {
                    1
                } else {
                    2
                };
            }
            if scale < 0.0 {
                for v in &mut l {
                    *v = 2 - *v;
                }
                scale = -scale;
                best_shift = -best_shift;
            }
            let xx = if best_shift == 1 { &IQ1_XP } else { &IQ1_XM };
            let mut all_on_grid = true;
            let mut index = [0usize; BS / 8];
            for k in 0..BS / 8 {
                let mut u = 0usize;
                for j in 0..8 {
                    u |= (l[8 * k + j] as usize & 3) << (2 * j);
                }
                let m = t.map[u];
                index[k] = if m < 0 {
                    all_on_grid = false;
                    let r = 8 * k..8 * k + 8;
                    iq1_best_neighbour2(
                        t,
                        m,
                        &xb[r.clone()],
                        &weight[r.clone()],
                        scale,
                        xx,
                        &mut l[r],
                    )
                } else {
                    m as usize
                };
            }
            if !all_on_grid {
                let mut sumqx = 0.0f32;
                let mut sumq2 = 0.0f32;
                for k in 0..BS / 8 {
                    let pg = &t.grid[index[k]];
                    for j in 0..8 {
                        let w = weight[8 * k + j];
                        let q = xx[((pg[j] - 1) / 2) as usize];
                        sumqx += w * q * xb[8 * k + j];
                        sumq2 += w * q * q;
                    }
                }
                if sumqx > 0.0 && sumq2 > 0.0 {
                    scale = sumqx / sumq2;
                }
            }
            let mut h = 0u16;
            for k in 0..BS / 8 {
                yb.qs[(BS / 8) * ib + k] = (index[k] & 255) as u8;
                h |= ((index[k] >> 8) << (3 * k)) as u16;
            }
            yb.qh[ib] = h;
            scales[ib] = scale;
            shifts[ib] = best_shift;
            max_scale = c_max(max_scale, scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 15.0;
        yb.d = f32_to_f16(d * 1.125);
        let id = 1.0 / d;
        for ib in 0..QK_K / BS {
            let mut l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7);
            if shifts[ib] == -1 {
                l |= 8;
            }
            yb.qh[ib] |= (l as u16) << 12;
        }
    }
}

/// `quantize_iq1_m` for one row (`quantize_row_iq1_m_impl`); `qw` (optional) holds one
/// importance weight per element of `x`.
pub fn quantize_row_iq1_m_weighted(
    x: &[f32],
    y: &mut [super::blocks::BlockIQ1M],
    qw: Option<&[f32]>,
) {
    const GROUP_MAX_EPS_IQ1_M: f32 = 1e-7;
    const BS: usize = 16;
    const MASKS: [u8; 4] = [0x00, 0x80, 0x08, 0x88];
    let t = iq2_tables(crate::DType::IQ1_M);
    let (x_p, x_m) = (&IQ1_XP, &IQ1_XM);
    // The levels of group `k` (0, 1) for the shift pattern `best_k`.
    let xx_of = |best_k: usize, k: usize| {
        let plus = if k == 0 {
            best_k < 2
        } else {
            best_k.is_multiple_of(2)
        };
        if plus { x_p } else { x_m }
    };
    let weights_of = |xb: &[f32], o: usize, sigma2: f32, weight: &mut [f32; BS]| match qw {
        Some(w) => importance(xb, Some(&w[o..o + BS]), sigma2, weight),
        None => importance(xb, None, sigma2, weight),
    };
    for (ibl, (xbl, yb)) in x.chunks_exact(QK_K).zip(y.iter_mut()).enumerate() {
        yb.qs = [0; QK_K / 8];
        yb.qh = [0; QK_K / 16];
        yb.scales = [0; QK_K / 32];
        let mut scales = [0f32; QK_K / BS];
        let mut shifts = [0usize; QK_K / BS];
        let mut max_scale = 0.0f32;
        let sigma2 = sigma2_of(xbl);
        for ib in 0..QK_K / BS {
            let xb = &xbl[BS * ib..BS * ib + BS];
            let mut weight = [0f32; BS];
            weights_of(xb, QK_K * ibl + BS * ib, sigma2, &mut weight);
            let mut max = xb[0].abs();
            for &v in &xb[1..] {
                max = c_max(max, v.abs());
            }
            if max < GROUP_MAX_EPS_IQ1_M {
                scales[ib] = 0.0;
                shifts[ib] = 0;
                continue;
            }
            let idx = iq1_order::<BS>(xb);
            let mut best_score = -f32::MAX;
            let mut scale = max;
            let (mut besti1, mut besti2, mut best_k) = (usize::MAX, usize::MAX, usize::MAX);
            let mut px = [[0f32; BS + 1]; 2];
            let mut pw = [[0f32; BS + 1]; 2];
            for j in 0..BS {
                let i = idx[j];
                let h = usize::from(i >= BS / 2);
                px[h][j + 1] = px[h][j] + weight[i] * xb[i];
                px[1 - h][j + 1] = px[1 - h][j];
                pw[h][j + 1] = pw[h][j] + weight[i];
                pw[1 - h][j + 1] = pw[1 - h][j];
            }
            let txs = [px[0][BS], px[1][BS]];
            let tws = [pw[0][BS], pw[1][BS]];
            let (p2, m2) = (x_p[2], x_m[2]);
            let cp1 = x_p[0] * x_p[0] - x_p[1] * x_p[1];
            let cp2 = x_p[1] * x_p[1] - x_p[2] * x_p[2];
            let cm1 = x_m[0] * x_m[0] - x_m[1] * x_m[1];
            let cm2 = x_m[1] * x_m[1] - x_m[2] * x_m[2];
            for i1 in 0..=BS {
                for i2 in i1..=BS {
                    let mut qx_p = [0f32; 2];
                    let mut qx_m = [0f32; 2];
                    let mut q2_p = [0f32; 2];
                    let mut q2_m = [0f32; 2];
                    for h in 0..2 {
                        let sx = px[h][i1] + px[h][i2];
                        qx_p[h] = txs[h] * p2 - sx;
                        qx_m[h] = txs[h] * m2 - sx;
                        q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                        q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
                    }
                    let sumqx = [
                        qx_p[0] + qx_p[1],
                        qx_p[0] + qx_m[1],
                        qx_m[0] + qx_p[1],
                        qx_m[0] + qx_m[1],
                    ];
                    let sumq2 = [
                        q2_p[0] + q2_p[1],
                        q2_p[0] + q2_m[1],
                        q2_m[0] + q2_p[1],
                        q2_m[0] + q2_m[1],
                    ];
                    for k in 0..4 {
                        if sumq2[k] > 0.0 && sumqx[k] * sumqx[k] > best_score * sumq2[k] {
                            scale = sumqx[k] / sumq2[k];
                            best_score = scale * sumqx[k];
                            besti1 = i1;
                            besti2 = i2;
                            best_k = k;
                        }
                    }
                }
            }
            if besti1 == usize::MAX || best_k == usize::MAX {
                scales[ib] = 0.0;
                shifts[ib] = 0;
                continue;
            }
            let mut l = [0i8; BS];
            for (j, &i) in idx.iter().enumerate() {
                l[i] = if j < besti1 {
                    0
                } else if j < besti2 {
                    1
                } else {
                    2
                };
            }
            if scale < 0.0 {
                for v in &mut l {
                    *v = 2 - *v;
                }
                scale = -scale;
                best_k = 3 - best_k;
            }
            let mut all_on_grid = true;
            let mut index = [0usize; BS / 8];
            for k in 0..BS / 8 {
                let xx = xx_of(best_k, k);
                let mut u = 0usize;
                for j in 0..8 {
                    u |= (l[8 * k + j] as usize & 3) << (2 * j);
                }
                let m = t.map[u];
                index[k] = if m < 0 {
                    all_on_grid = false;
                    let r = 8 * k..8 * k + 8;
                    iq1_best_neighbour2(
                        t,
                        m,
                        &xb[r.clone()],
                        &weight[r.clone()],
                        scale,
                        xx,
                        &mut l[r],
                    )
                } else {
                    m as usize
                };
            }
            if !all_on_grid {
                let mut sumqx_f = 0.0f32;
                let mut sumq2_f = 0.0f32;
                for k in 0..BS / 8 {
                    let xx = xx_of(best_k, k);
                    let pg = &t.grid[index[k]];
                    for j in 0..8 {
                        let w = weight[8 * k + j];
                        let q = xx[((pg[j] - 1) / 2) as usize];
                        sumqx_f += w * q * xb[8 * k + j];
                        sumq2_f += w * q * q;
                    }
                }
                if sumqx_f > 0.0 && sumq2_f > 0.0 {
                    scale = sumqx_f / sumq2_f;
                }
            }
            yb.qs[2 * ib] = (index[0] & 255) as u8;
            yb.qs[2 * ib + 1] = (index[1] & 255) as u8;
            yb.qh[ib] = ((index[0] >> 8) | ((index[1] >> 8) << 4)) as u8;
            scales[ib] = scale;
            shifts[ib] = best_k;
            max_scale = c_max(max_scale, scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let mut sc = [0u16; 4];
        let mut d = max_scale / 15.0;
        let id = 1.0 / d;
        let mut sumqx_f = 0.0f32;
        let mut sumq2_f = 0.0f32;
        for ib in 0..QK_K / BS {
            let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7);
            sc[ib / 4] |= (l as u16) << (3 * (ib % 4));
            yb.qh[ib] |= MASKS[shifts[ib]];
            let xb = &xbl[BS * ib..BS * ib + BS];
            let mut weight = [0f32; BS];
            weights_of(xb, QK_K * ibl + BS * ib, sigma2, &mut weight);
            for k in 0..BS / 8 {
                let xx = xx_of(shifts[ib], k);
                let gi = usize::from(yb.qs[2 * ib + k])
                    + ((usize::from(yb.qh[ib]) << (8 - 4 * k)) & 0x700);
                let pg = &t.grid[gi];
                for j in 0..8 {
                    let w = weight[8 * k + j];
                    let q = xx[((pg[j] - 1) / 2) as usize] * (2 * l + 1) as f32;
                    sumqx_f += w * q * xb[8 * k + j];
                    sumq2_f += w * q * q;
                }
            }
        }
        if sumq2_f > 0.0 {
            d = sumqx_f / sumq2_f;
        }
        let s = f32_to_f16(d * 1.1125).to_bits();
        sc[0] |= (s & 0x000f) << 12;
        sc[1] |= (s & 0x00f0) << 8;
        sc[2] |= (s & 0x0f00) << 4;
        sc[3] |= s & 0xf000;
        for (k, w) in sc.iter().enumerate() {
            yb.scales[2 * k..2 * k + 2].copy_from_slice(&w.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{
        BlockIQ2XXS, dequantize_row_iq2_xxs, dequantize_row_iq3_s, dequantize_row_iq3_xxs,
    };

    /// Rows that stress the searches: zeros, tiny and huge finite values, one outlier,
    /// constant runs, and alternating signs.
    fn hostile_rows() -> Vec<Vec<f32>> {
        let mut seed = 0x853C_49E6_748F_EA9Bu64;
        let mut rand = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let n = 2 * QK_K;
        vec![
            vec![0.0; n],
            (0..n).map(|_| rand() * 1e-30).collect(),
            (0..n).map(|_| rand() * 3e38).collect(),
            (0..n)
                .map(|i| if i == 7 { f32::MAX } else { rand() })
                .collect(),
            (0..n)
                .map(|i| if i % 3 == 0 { -f32::MAX } else { 1e-40 })
                .collect(),
            vec![-1.0; n],
            (0..n)
                .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
                .collect(),
            (0..n).map(|i| if i < 40 { 0.0 } else { rand() }).collect(),
        ]
    }

    #[test]
    fn non_finite_inputs_never_panic() {
        let n = 2 * QK_K;
        let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0, -2.0, 0.0];
        let x: Vec<f32> = (0..n)
            .map(|i| specials[(i * 7 + i / 5) % specials.len()])
            .collect();
        let w: Vec<f32> = (0..n)
            .map(|i| specials[(i * 3) % specials.len()].abs())
            .collect();
        for qw in [None, Some(&w[..])] {
            let mut a = vec![bytemuck::Zeroable::zeroed(); n / QK_K];
            quantize_row_iq3_s_weighted(&x, &mut a, qw);
            let mut b = vec![bytemuck::Zeroable::zeroed(); n / QK_K];
            quantize_row_iq3_xxs_weighted(&x, &mut b, qw);
            let mut c: Vec<BlockIQ2XXS> = vec![bytemuck::Zeroable::zeroed(); n / QK_K];
            quantize_row_iq2_xxs_weighted(&x, &mut c, qw);
            let mut d: Vec<super::super::blocks::BlockIQ2XS> =
                vec![bytemuck::Zeroable::zeroed(); n / QK_K];
            quantize_row_iq2_xs_weighted(&x, &mut d, qw);
            let mut e: Vec<super::super::blocks::BlockIQ2S> =
                vec![bytemuck::Zeroable::zeroed(); n / QK_K];
            quantize_row_iq2_s_weighted(&x, &mut e, qw);
            let mut f: Vec<super::super::blocks::BlockIQ1S> =
                vec![bytemuck::Zeroable::zeroed(); n / QK_K];
            quantize_row_iq1_s_weighted(&x, &mut f, qw);
            let mut g: Vec<super::super::blocks::BlockIQ1M> =
                vec![bytemuck::Zeroable::zeroed(); n / QK_K];
            quantize_row_iq1_m_weighted(&x, &mut g, qw);
        }
    }

    #[test]
    fn finite_inputs_never_panic() {
        for x in hostile_rows() {
            let n = x.len();
            let weights = [None, Some(vec![1.0f32; n]), Some(vec![0.0f32; n])];
            for w in &weights {
                let w = w.as_deref();
                let mut a = vec![bytemuck::Zeroable::zeroed(); n / QK_K];
                quantize_row_iq3_s_weighted(&x, &mut a, w);
                let mut b = vec![bytemuck::Zeroable::zeroed(); n / QK_K];
                quantize_row_iq3_xxs_weighted(&x, &mut b, w);
                let mut c: Vec<BlockIQ2XXS> = vec![bytemuck::Zeroable::zeroed(); n / QK_K];
                quantize_row_iq2_xxs_weighted(&x, &mut c, w);
                let mut d: Vec<super::super::blocks::BlockIQ2XS> =
                    vec![bytemuck::Zeroable::zeroed(); n / QK_K];
                quantize_row_iq2_xs_weighted(&x, &mut d, w);
                let mut e: Vec<super::super::blocks::BlockIQ2S> =
                    vec![bytemuck::Zeroable::zeroed(); n / QK_K];
                quantize_row_iq2_s_weighted(&x, &mut e, w);
                let mut f: Vec<super::super::blocks::BlockIQ1S> =
                    vec![bytemuck::Zeroable::zeroed(); n / QK_K];
                quantize_row_iq1_s_weighted(&x, &mut f, w);
                let mut g: Vec<super::super::blocks::BlockIQ1M> =
                    vec![bytemuck::Zeroable::zeroed(); n / QK_K];
                quantize_row_iq1_m_weighted(&x, &mut g, w);
            }
        }
    }

    #[test]
    fn quantizers_round_trip_roughly() {
        let n = 4 * QK_K;
        let x: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.731).sin() * 2.0).collect();
        let rms = |y: &[f32]| {
            let e: f32 = x.iter().zip(y).map(|(a, b)| (a - b) * (a - b)).sum();
            let s: f32 = x.iter().map(|a| a * a).sum();
            (e / s).sqrt()
        };
        let mut y = vec![0f32; n];
        let mut a = vec![bytemuck::Zeroable::zeroed(); n / QK_K];
        quantize_row_iq3_s_weighted(&x, &mut a, None);
        dequantize_row_iq3_s(&a, &mut y);
        assert!(rms(&y) < 0.15, "iq3_s {}", rms(&y));
        let mut b = vec![bytemuck::Zeroable::zeroed(); n / QK_K];
        quantize_row_iq3_xxs_weighted(&x, &mut b, None);
        dequantize_row_iq3_xxs(&b, &mut y);
        assert!(rms(&y) < 0.2, "iq3_xxs {}", rms(&y));
        let mut c = vec![bytemuck::Zeroable::zeroed(); n / QK_K];
        quantize_row_iq2_xxs_weighted(&x, &mut c, Some(&vec![1.0; n]));
        dequantize_row_iq2_xxs(&c, &mut y);
        assert!(rms(&y) < 0.35, "iq2_xxs {}", rms(&y));
    }
}
