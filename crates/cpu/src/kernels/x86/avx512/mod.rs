//! The AVX-512 tier (AVX-512 F/BW/VL and VNNI on top of AVX2): the AVX2 tier's table, with
//! the Q0/Q1 offset tiles on `vpdpbusd` (EVEX form) and the AVX-512 kernels where they cover
//! the shape (IQ4_NL, the repacked Q0 chains).

pub mod fattn;
pub mod tile;

use crate::kernels::table::{Kernel, KernelTable, TileFn};
use crate::kernels::tile::{TileKind, x86_tiles};
use lamina_core::DType;

macro_rules! tiles {
    ($kind:expr) => {
        Some(
            (|k, w, a, out| {
                x86_tiles::<true, { crate::kernels::x86::avx2::tile::DOT_VNNI_EVEX }>(
                    $kind, k, w, a, out,
                )
            }) as TileFn,
        )
    };
}

/// The AVX-512 tier's table.
pub(crate) fn table() -> KernelTable {
    let mut t = super::avx2::table();
    t.set_packed16(crate::kernels::table::PackedTile {
        tile: tile::packed16_tile,
        max_blocks: tile::ROWS16_MAX_BLOCKS,
    });
    let retile = |k: &mut Option<Kernel>, tile: Option<TileFn>| {
        if let Some(k) = k {
            k.tile = tile;
        }
    };
    retile(&mut t.of_mut(DType::Q4_0).vec_dot, tiles!(TileKind::Q0(0)));
    retile(&mut t.of_mut(DType::Q5_0).vec_dot, tiles!(TileKind::Q0(1)));
    retile(&mut t.of_mut(DType::Q8_0).vec_dot, tiles!(TileKind::Q0(2)));
    retile(
        &mut t.of_mut(DType::Q4_1).vec_dot,
        tiles!(TileKind::Q1(false)),
    );
    retile(
        &mut t.of_mut(DType::Q5_1).vec_dot,
        tiles!(TileKind::Q1(true)),
    );
    retile(
        &mut t.of_mut(DType::IQ4_NL).tinyblas,
        tiles!(TileKind::Q0(3)),
    );
    retile(
        &mut t.of_mut(DType::Q4_0).repacked,
        tiles!(TileKind::Q0Chain(0)),
    );
    retile(
        &mut t.of_mut(DType::IQ4_NL).repacked,
        tiles!(TileKind::Q0Chain(3)),
    );
    retile(
        &mut t.of_mut(DType::MXFP4).repacked,
        tiles!(TileKind::Q0Chain(4)),
    );
    retile(
        &mut t.of_mut(DType::F16).tinyblas,
        tiles!(TileKind::F16Tiny),
    );
    retile(
        &mut t.of_mut(DType::F32).tinyblas,
        tiles!(TileKind::F32Tiny),
    );
    t.set_isa(crate::kernels::Isa::Avx512);
    t
}
