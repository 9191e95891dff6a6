//! The NEON tier: NEON versions of the quantized dot kernels (`ggml_vec_dot_*`), the scalar
//! tier's kernels for everything else (all with the same bits).

pub(crate) mod dot;
mod iq;

use lamina_core::DType;

use crate::kernels::table::{Kernel, KernelTable};
use crate::kernels::{generic, quantize};

/// The NEON tier's table.
pub(crate) fn table() -> KernelTable {
    let mut t = KernelTable::new(
        crate::kernels::Isa::Neon,
        quantize::quantize_row_q8_0_scalar,
        quantize::quantize_row_q8_1_scalar,
        quantize::quantize_row_q8_k_scalar,
        generic::q8_k_4x8,
    );
    for dtype in DType::ALL {
        if let Some(f) = dot::dot_fn(dtype) {
            t.of_mut(dtype).vec_dot = Some(Kernel::dot(f));
        }
    }
    t.fill_from(&generic::table());
    t
}
