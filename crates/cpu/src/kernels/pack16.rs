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
//! The copy replaces the mapped weights for the products and `GET_ROWS` ([`Packed16::row_into`]):
//! see `crate::packed` for when it is made and kept.

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
    /// The byte map between a file block and its packed group, the one both directions
    /// use ([`Packed16::pack`], [`Packed16::row_into`]): `part(offset in the block, offset in
    /// the group, length)` for each part of block `b` of the group's row `r`, with `nb` blocks
    /// per row.
    #[inline(always)]
    fn block_map(&self, nb: usize, b: usize, r: usize, mut part: impl FnMut(usize, usize, usize)) {
        let (pl, hd) = (self.payload(), self.header());
        for w in 0..self.words {
            part(self.qs + 4 * w, b * pl + 64 * w + 4 * r, 4);
        }
        let h = nb * pl + b * hd;
        part(0, h + 2 * r, 2);
        if let Some(m) = self.m {
            part(m, h + self.header_m() + 2 * r, 2);
        }
        if let Some(qh) = self.qh {
            part(qh, h + self.header_qh() + 4 * r, 4);
        }
    }

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

/// One weight matrix (`rows` rows of `nb` blocks of `dtype`) in groups of [`GROUP`] rows.
pub struct Packed16 {
    dtype: DType,
    layout: PackLayout,
    rows: usize,
    nb: usize,
    /// The packed groups (page-aligned).
    lines: memmap2::MmapMut,
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
        row: impl Fn(usize) -> &'a [u8] + Sync,
    ) -> Option<Packed16> {
        Self::pack_on(
            dtype,
            rows,
            nb,
            row,
            |part| {
                part(0, 1);
                true
            },
            |_| {},
        )
    }

    /// [`Packed16::pack`] with the groups shared out by `run`, which must call `part(i, n)`
    /// once for each `i` in `0..n` (each call may run on its own thread; call `i` packs the
    /// `i`-th share of the groups) and return whether all of them finished (`None` if not): a
    /// device packs on its worker pool, so that the first product of a large model waits a
    /// fraction as long. `packed(rows)` is called (on the part's thread) as runs of rows are
    /// done with, so that their source can be dropped while the rest is packed.
    pub fn pack_on<'a>(
        dtype: DType,
        rows: usize,
        nb: usize,
        row: impl Fn(usize) -> &'a [u8] + Sync,
        run: impl FnOnce(&(dyn Fn(usize, usize) + Sync)) -> bool,
        packed: impl Fn(std::ops::Range<usize>) + Sync,
    ) -> Option<Packed16> {
        let layout = PackLayout::of(dtype)?;
        if rows == 0 || !rows.is_multiple_of(GROUP) || nb == 0 {
            return None;
        }
        if (0..rows).any(|i| row(i).len() < nb * layout.block) {
            return None;
        }
        let gb = layout.group_bytes(nb);
        let groups = rows / GROUP;
        // Fresh pages from the kernel, zero already, asked to come as huge pages (Linux THP
        // `madvise` mode; a hint): the copy is written once here and streamed at every decode
        // step, and with 4 KiB pages its page faults, not the packing, set the time (Gemma 3's
        // 178 MB output head: 43K faults), and the stream walks a page table entry every
        // 4 KiB. Page-aligned, so every 64-byte line is aligned. No memory, no copy.
        let mut lines = memmap2::MmapMut::map_anon(groups * gb).ok()?;
        #[cfg(unix)]
        let _ = lines.advise(memmap2::Advice::HugePage);
        let out = SharedOut(lines.as_mut_ptr());
        // Groups between two `packed` calls.
        const RUN: usize = 32;
        let part = |i: usize, n: usize| {
            let per = groups.div_ceil(n.max(1));
            let (g0, g1) = ((i * per).min(groups), ((i + 1) * per).min(groups));
            for r0 in (g0..g1).step_by(RUN) {
                let r1 = (r0 + RUN).min(g1);
                for g in r0..r1 {
                    // SAFETY: group `g`'s `gb` bytes lie inside the mapping (zeroed memory);
                    // each group is written by one call only, so no two calls touch the same
                    // bytes, and nothing else does until `run` returns.
                    let group = unsafe { std::slice::from_raw_parts_mut(out.at(g * gb), gb) };
                    pack_group(&layout, nb, group, |r| row(g * GROUP + r));
                }
                packed(r0 * GROUP..r1 * GROUP);
            }
        };
        if !run(&part) {
            return None;
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
        self.lines.len()
    }

    /// Row `i`'s blocks as the file holds them, into `out` (`nb` blocks of the type's size):
    /// the rows of a packed weight without its file's pages.
    pub fn row_into(&self, i: usize, out: &mut [u8]) {
        let (l, nb) = (self.layout, self.nb);
        let group = self.groups(i / GROUP * GROUP, GROUP);
        for (b, blk) in out[..nb * l.block].chunks_exact_mut(l.block).enumerate() {
            l.block_map(nb, b, i % GROUP, |at_blk, at_group, n| {
                blk[at_blk..at_blk + n].copy_from_slice(&group[at_group..at_group + n]);
            });
        }
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
        &self.lines[i0 / GROUP * gb..][..n / GROUP * gb]
    }
}

/// The packed lines' bytes, written by several threads at once, each its own groups.
struct SharedOut(*mut u8);

// SAFETY: only handed to the parts of one `Packed16::pack_on`, which write disjoint groups.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The byte at offset `off`.
    fn at(&self, off: usize) -> *mut u8 {
        self.0.wrapping_add(off)
    }
}

/// Packs one group of [`GROUP`] rows (`row(r)`: at least `nb` blocks each) into `out`.
fn pack_group<'a>(layout: &PackLayout, nb: usize, out: &mut [u8], row: impl Fn(usize) -> &'a [u8]) {
    for r in 0..GROUP {
        let src = row(r);
        for b in 0..nb {
            let blk = &src[b * layout.block..(b + 1) * layout.block];
            layout.block_map(nb, b, r, |at_blk, at_group, n| {
                out[at_group..at_group + n].copy_from_slice(&blk[at_blk..at_blk + n]);
            });
        }
    }
}
