//! Weights repacked in groups of 16 rows for the rows-in-lanes tiles (the AVX-512
//! `q0_rows16`), llama.cpp's `CPU_REPACK` idea applied to the types it leaves in place (Q4_1,
//! Q5_0, Q5_1, Q8_0). Those tiles put weight row `r` of a group in lane `r` of a register and
//! need, per block, word `w` (bytes `4w..4w+3` of the quants) of all 16 rows in one register.
//! From the file's row-major blocks that is a transpose per block and group, redone by every
//! call: at a decode step of 4 slots it took as long as the products. Packed once, a group's
//! block is a few aligned 64-byte loads: per block, the quants' words as lines of 16 rows
//! (word-major), then, after all blocks, each block's header (16 `d`, 16 `m`, 16 `qh`). The
//! values and their order are unchanged, so the tiles give the same bits from either layout.
//!
//! The copy sits beside the mapped weights, which other ops (`GET_ROWS` on a tied embedding) still
//! read: see `crate::packed` for when it is made and kept.

use lamina_core::DType;

/// Rows per packed group.
pub const GROUP: usize = 16;

/// Where one weight type's block keeps its parts, and how a packed block is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackLayout {
    /// Bytes of one block in the file.
    pub block: usize,
    /// Offset of the quants in a block.
    pub qs: usize,
    /// 4-byte words of quants per block (4: 32 nibbles; 8: 32 bytes).
    pub words: usize,
    /// Offset of `m` in a block (Q4_1, Q5_1).
    pub m: Option<usize>,
    /// Offset of the 32 fifth bits `qh` in a block (Q5_0, Q5_1).
    pub qh: Option<usize>,
}

impl PackLayout {
    /// The layout of `dtype`'s blocks; `None` for types that are not packed.
    pub const fn of(dtype: DType) -> Option<PackLayout> {
        Some(match dtype {
            DType::Q4_1 => PackLayout {
                block: 20,
                qs: 4,
                words: 4,
                m: Some(2),
                qh: None,
            },
            DType::Q5_0 => PackLayout {
                block: 22,
                qs: 6,
                words: 4,
                m: None,
                qh: Some(2),
            },
            DType::Q5_1 => PackLayout {
                block: 24,
                qs: 8,
                words: 4,
                m: Some(2),
                qh: Some(4),
            },
            DType::Q8_0 => PackLayout {
                block: 34,
                qs: 2,
                words: 8,
                m: None,
                qh: None,
            },
            _ => return None,
        })
    }

    /// Bytes of one packed block's quants (a 64-byte line per word).
    pub const fn payload(&self) -> usize {
        64 * self.words
    }

    /// Offset of `m` in a packed header.
    pub const fn header_m(&self) -> usize {
        32
    }

    /// Offset of `qh` in a packed header.
    pub const fn header_qh(&self) -> usize {
        if self.m.is_some() { 64 } else { 32 }
    }

    /// Bytes of one packed block's header: 16 `d`, then 16 `m` and 16 `qh` where the type has
    /// them.
    pub const fn header(&self) -> usize {
        32 + if self.m.is_some() { 32 } else { 0 } + if self.qh.is_some() { 64 } else { 0 }
    }

    /// Bytes of one packed group of rows of `nb` blocks (a whole number of 64-byte lines).
    pub const fn group_bytes(&self, nb: usize) -> usize {
        (nb * (self.payload() + self.header())).next_multiple_of(64)
    }
}

/// A 64-byte aligned line of packed weights.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// One weight matrix (`rows` rows of `nb` blocks of `dtype`) in groups of [`GROUP`] rows.
pub struct Packed16 {
    dtype: DType,
    layout: PackLayout,
    rows: usize,
    nb: usize,
    lines: Vec<Line>,
}

impl std::fmt::Debug for Packed16 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packed16")
            .field("dtype", &self.dtype)
            .field("rows", &self.rows)
            .field("nb", &self.nb)
            .finish()
    }
}

impl Packed16 {
    /// Packs `rows` rows of `nb` blocks of `dtype`, row `i` given by `row(i)`. `None` when the
    /// type is not packed, the rows are not whole groups, or a row is shorter than `nb` blocks.
    pub fn pack<'a>(
        dtype: DType,
        rows: usize,
        nb: usize,
        row: impl Fn(usize) -> &'a [u8],
    ) -> Option<Packed16> {
        let layout = PackLayout::of(dtype)?;
        if rows == 0 || !rows.is_multiple_of(GROUP) || nb == 0 {
            return None;
        }
        let gb = layout.group_bytes(nb);
        let mut lines = vec![Line([0; 64]); rows / GROUP * gb / 64];
        // SAFETY: `Line` is 64 plain bytes; the slice covers exactly the vector's lines.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<u8>(), lines.len() * 64)
        };
        let (pl, hd) = (layout.payload(), layout.header());
        for (g, out) in bytes.chunks_exact_mut(gb).enumerate() {
            for r in 0..GROUP {
                let src = row(g * GROUP + r);
                if src.len() < nb * layout.block {
                    return None;
                }
                for b in 0..nb {
                    let blk = &src[b * layout.block..(b + 1) * layout.block];
                    for w in 0..layout.words {
                        let at = b * pl + 64 * w + 4 * r;
                        out[at..at + 4].copy_from_slice(&blk[layout.qs + 4 * w..][..4]);
                    }
                    let h = nb * pl + b * hd;
                    out[h + 2 * r..h + 2 * r + 2].copy_from_slice(&blk[..2]);
                    if let Some(m) = layout.m {
                        let at = h + layout.header_m() + 2 * r;
                        out[at..at + 2].copy_from_slice(&blk[m..m + 2]);
                    }
                    if let Some(qh) = layout.qh {
                        let at = h + layout.header_qh() + 4 * r;
                        out[at..at + 4].copy_from_slice(&blk[qh..qh + 4]);
                    }
                }
            }
        }
        Some(Packed16 {
            dtype,
            layout,
            rows,
            nb,
            lines,
        })
    }

    /// The weight type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The block layout.
    pub fn layout(&self) -> PackLayout {
        self.layout
    }

    /// Rows (a multiple of [`GROUP`]).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.nb
    }

    /// Bytes of one group.
    pub fn group_bytes(&self) -> usize {
        self.layout.group_bytes(self.nb)
    }

    /// Bytes held.
    pub fn size_bytes(&self) -> usize {
        self.lines.len() * 64
    }

    /// The packed bytes of the groups holding rows `i0..i0 + n` (`i0` and `n` whole groups).
    pub fn groups(&self, i0: usize, n: usize) -> &[u8] {
        assert!(
            i0.is_multiple_of(GROUP) && n.is_multiple_of(GROUP) && i0 + n <= self.rows,
            "packed rows {i0}..{} of {}",
            i0 + n,
            self.rows
        );
        let gb = self.group_bytes();
        // SAFETY: `Line` is 64 plain bytes; the range lies within the vector (checked above).
        unsafe {
            std::slice::from_raw_parts(
                self.lines.as_ptr().cast::<u8>().add(i0 / GROUP * gb),
                n / GROUP * gb,
            )
        }
    }
}
