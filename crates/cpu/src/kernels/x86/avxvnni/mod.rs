//! The AVX-VNNI tier (AVX2 with the VEX form of `vpdpbusd`: Alder Lake and later Intel client
//! cores, Zen 5; the AVX-512 cores before them have only its EVEX form, the AVX-512 tier's):
//! the AVX2 tier's table, with the Q4_0/Q5_0/Q8_0/Q4_1/Q5_1 offset tiles forming each lane's
//! exact sum in one `vpdpbusd` instead of `maddubs` + `madd` + add. Same bits.

use crate::kernels::table::{KernelTable, TileFn};
use crate::kernels::tile::{TileKind, x86_tiles};
use crate::kernels::x86::avx2::tile::DOT_VNNI_VEX;
use lamina_core::DType;

macro_rules! tiles {
    ($kind:expr) => {
        Some((|k, w, a, out| x86_tiles::<false, DOT_VNNI_VEX>($kind, k, w, a, out)) as TileFn)
    };
}

/// The AVX-VNNI tier's table.
pub(crate) fn table() -> KernelTable {
    let mut t = super::avx2::table();
    for (dtype, tile) in [
        (DType::Q4_0, tiles!(TileKind::Q0(0))),
        (DType::Q5_0, tiles!(TileKind::Q0(1))),
        (DType::Q8_0, tiles!(TileKind::Q0(2))),
        (DType::Q4_1, tiles!(TileKind::Q1(false))),
        (DType::Q5_1, tiles!(TileKind::Q1(true))),
    ] {
        if let Some(k) = &mut t.of_mut(dtype).vec_dot {
            k.tile = tile;
        }
    }
    t.set_isa(crate::kernels::Isa::AvxVnni);
    t
}
