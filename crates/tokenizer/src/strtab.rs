//! Compact storage for the vocabulary's strings: token texts (and BPE merge pieces) end to end
//! in one buffer with a hash index of ids, and rendered pieces end to end in another. A
//! 262,144-token vocabulary then takes its bytes plus a few bytes a token, where a `String` per
//! token (and a second copy as a hash-map key) took a header and a heap block per copy.

use std::hash::Hasher;

use lamina_gguf::StrArray;

use crate::hash::FxHasher;

#[inline]
fn hash_bytes(s: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    h.write(s);
    // Terminated as `Hash for str` does, so that the length is mixed in.
    h.write_u8(0xff);
    h.finish()
}

/// Why a string could not be added to a [`StrTable`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum InsertError {
    /// The table holds this string already, under this id.
    Duplicate(u32),
    /// The strings would total more than 4 GiB, or there would be more than 2^30 of them.
    Full,
}

/// Why a [`StrTable`] could not be built over a [`StrArray`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BuildError {
    /// Strings `first` and `second` are equal.
    Duplicate { first: u32, second: u32 },
    /// The strings total more than 4 GiB, or there are more than 2^30 of them.
    Full,
}

/// Strings numbered 0, 1, ... in order, stored end to end in a [`StrArray`] (which may be the
/// GGUF metadata's own array, shared rather than copied). The index keeps only the ids: a
/// lookup hashes the query and compares it with the stored text of each candidate.
pub(crate) struct StrTable {
    /// Always has 32-bit ends (checked when the table is made and on every insert).
    strings: StrArray,
    index: Index,
}

impl Default for StrTable {
    fn default() -> StrTable {
        StrTable {
            strings: StrArray::default(),
            index: Index::with_capacity(0),
        }
    }
}

/// The bytes of string `k - 1` (the index stores ids plus one).
#[inline]
fn bytes_of<'a>(text: &'a [u8], ends: &[u32], k: usize) -> &'a [u8] {
    let start = if k == 1 { 0 } else { ends[k - 2] as usize };
    &text[start..ends[k - 1] as usize]
}

impl StrTable {
    /// A table over `strings`, string `i` under id `i`. The strings are shared, not copied.
    pub fn from_strings(strings: StrArray) -> Result<StrTable, BuildError> {
        let n = strings.len();
        if strings.ends_u32().is_none() || n > MAX_ENTRIES {
            return Err(BuildError::Full);
        }
        let mut index = Index::with_capacity(n);
        let ends = strings.ends_u32().unwrap_or(&[]);
        let text = strings.text().as_bytes();
        for k in 1..=n {
            let s = bytes_of(text, ends, k);
            if let Err(first) = index.insert(hash_bytes(s), s, k, text, ends) {
                return Err(BuildError::Duplicate {
                    first,
                    second: (k - 1) as u32,
                });
            }
        }
        Ok(StrTable { strings, index })
    }

    /// An empty table with room for `n` strings of `bytes` bytes in total.
    #[cfg(test)]
    pub fn with_capacity(n: usize, bytes: usize) -> StrTable {
        StrTable {
            strings: StrArray::with_capacity(n, bytes),
            index: Index::with_capacity(n),
        }
    }

    #[inline]
    fn parts(&self) -> (&[u8], &[u32]) {
        (
            self.strings.text().as_bytes(),
            self.strings.ends_u32().unwrap_or(&[]),
        )
    }

    pub fn len(&self) -> usize {
        self.strings.len()
    }

    /// Total bytes of all the strings.
    pub fn text_len(&self) -> usize {
        self.strings.text_len()
    }

    /// String `id`; `id` must be below [`len`](Self::len).
    #[inline]
    pub fn text(&self, id: u32) -> &str {
        let ends = self.strings.ends_u32().unwrap_or(&[]);
        let i = id as usize;
        let start = if i == 0 { 0 } else { ends[i - 1] as usize };
        &self.strings.text()[start..ends[i] as usize]
    }

    pub fn get(&self, id: u32) -> Option<&str> {
        ((id as usize) < self.len()).then(|| self.text(id))
    }

    /// The id of `s`.
    #[inline]
    pub fn find(&self, s: &str) -> Option<u32> {
        let s = s.as_bytes();
        let (text, ends) = self.parts();
        self.index.find(hash_bytes(s), s, text, ends)
    }

    /// Appends `s` under the next id.
    pub fn insert(&mut self, s: &str) -> Result<u32, InsertError> {
        let hash = hash_bytes(s.as_bytes());
        let (text, ends) = self.parts();
        if let Some(id) = self.index.find(hash, s.as_bytes(), text, ends) {
            return Err(InsertError::Duplicate(id));
        }
        let n = self.len();
        if n >= MAX_ENTRIES || u32::try_from(self.text_len() + s.len()).is_err() {
            return Err(InsertError::Full);
        }
        self.strings.push(s);
        let (text, ends) = (self.strings.text().as_bytes(), self.strings.ends_u32());
        let ends = ends.unwrap_or(&[]);
        // Not a duplicate (checked above), so this only places the new id.
        let _ = self.index.insert(hash, s.as_bytes(), n + 1, text, ends);
        Ok(n as u32)
    }

    /// Frees spare capacity (after the table is built).
    pub fn shrink_to_fit(&mut self) {
        self.strings.shrink_to_fit();
        let (text, ends) = (self.strings.text().as_bytes(), self.strings.ends_u32());
        self.index.shrink_to_fit(text, ends.unwrap_or(&[]));
    }
}

/// Most strings a [`StrTable`] holds, so that an id plus one and at least one tag bit fit in a
/// slot (a vocabulary is limited to `i32::MAX` tokens anyway).
const MAX_ENTRIES: usize = 1 << 30;

/// Open addressing with linear probing over one `u32` per slot: 0 for an empty slot, else the
/// id plus one in the low `id_bits` bits and some bits of the hash (a tag) above them, so that
/// most probes of other strings are told apart without reading their text. At most 80% of the
/// slots are used, and about 70% after building or shrinking: a 262,144-token vocabulary takes
/// 1.5 MB, against 2.6 MB for a `hashbrown` table of `u32` (power-of-two buckets plus a control
/// byte each).
struct Index {
    slots: Vec<u32>,
    /// Bits of a slot that hold the id plus one; the rest hold the tag.
    id_mask: u32,
    len: usize,
}

impl Index {
    /// Slots for `n` entries at about 70% load.
    fn slots_for(n: usize) -> usize {
        (n + n * 3 / 7 + 1).max(8)
    }

    fn with_capacity(n: usize) -> Index {
        Index::with_slots(Index::slots_for(n.min(MAX_ENTRIES)))
    }

    fn with_slots(cap: usize) -> Index {
        // Ids plus one stay below the 80% limit of `cap`, so `cap` itself always fits.
        let id_bits = u32::BITS - (cap as u32).leading_zeros();
        Index {
            slots: vec![0; cap],
            id_mask: if id_bits >= 32 {
                u32::MAX
            } else {
                (1 << id_bits) - 1
            },
            len: 0,
        }
    }

    #[inline]
    fn start(&self, hash: u64) -> usize {
        ((u128::from(hash) * self.slots.len() as u128) >> 64) as usize
    }

    /// Tag bits, from the middle of the hash (the slot position comes from its top bits).
    #[inline]
    fn tag(&self, hash: u64) -> u32 {
        ((hash >> 20) as u32) & !self.id_mask
    }

    #[inline]
    fn find(&self, hash: u64, s: &[u8], text: &[u8], ends: &[u32]) -> Option<u32> {
        let tag = self.tag(hash);
        let mut i = self.start(hash);
        loop {
            let slot = self.slots[i];
            if slot == 0 {
                return None;
            }
            if slot & !self.id_mask == tag {
                let k = (slot & self.id_mask) as usize;
                if bytes_of(text, ends, k) == s {
                    return Some(k as u32 - 1);
                }
            }
            i += 1;
            if i == self.slots.len() {
                i = 0;
            }
        }
    }

    /// Places id `k - 1`, whose string `s` hashes to `hash`, unless an equal string is there
    /// already (its id is the error). `text` and `ends` must hold every id placed so far.
    fn insert(
        &mut self,
        hash: u64,
        s: &[u8],
        k: usize,
        text: &[u8],
        ends: &[u32],
    ) -> Result<(), u32> {
        if (self.len + 1) * 5 > self.slots.len() * 4 {
            self.rebuild(Index::slots_for(2 * (self.len + 1)), text, ends);
        }
        let tag = self.tag(hash);
        let mut i = self.start(hash);
        loop {
            let slot = self.slots[i];
            if slot == 0 {
                self.slots[i] = tag | k as u32;
                self.len += 1;
                return Ok(());
            }
            if slot & !self.id_mask == tag {
                let other = (slot & self.id_mask) as usize;
                if bytes_of(text, ends, other) == s {
                    return Err(other as u32 - 1);
                }
            }
            i += 1;
            if i == self.slots.len() {
                i = 0;
            }
        }
    }

    /// Moves every entry into a table of `cap` slots.
    fn rebuild(&mut self, cap: usize, text: &[u8], ends: &[u32]) {
        let mut new = Index::with_slots(cap);
        for &slot in &self.slots {
            if slot != 0 {
                let k = (slot & self.id_mask) as usize;
                let hash = hash_bytes(bytes_of(text, ends, k));
                let tag = new.tag(hash);
                let mut i = new.start(hash);
                while new.slots[i] != 0 {
                    i += 1;
                    if i == new.slots.len() {
                        i = 0;
                    }
                }
                new.slots[i] = tag | k as u32;
                new.len += 1;
            }
        }
        *self = new;
    }

    fn shrink_to_fit(&mut self, text: &[u8], ends: &[u32]) {
        if self.slots.len() > Index::slots_for(self.len) + self.len / 8 {
            self.rebuild(Index::slots_for(self.len), text, ends);
        }
    }
}

/// Byte strings numbered 0, 1, ... stored end to end (no index).
#[derive(Default)]
pub(crate) struct ByteArena {
    bytes: Vec<u8>,
    /// `ends[i]`: where entry `i` ends in `bytes`.
    ends: Vec<u32>,
}

impl ByteArena {
    pub fn with_capacity(n: usize, bytes: usize) -> ByteArena {
        ByteArena {
            bytes: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(n),
        }
    }

    /// Appends an entry: whatever `fill` appends to the buffer. Refuses (undoing the append)
    /// when the entries would total more than 4 GiB.
    pub fn push_with(&mut self, fill: impl FnOnce(&mut Vec<u8>)) -> Result<(), InsertError> {
        let start = self.bytes.len();
        fill(&mut self.bytes);
        match u32::try_from(self.bytes.len()) {
            Ok(end) => {
                self.ends.push(end);
                Ok(())
            }
            Err(_) => {
                self.bytes.truncate(start);
                Err(InsertError::Full)
            }
        }
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    #[inline]
    pub fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.bytes[start..self.ends[i] as usize]
    }

    pub fn shrink_to_fit(&mut self) {
        self.bytes.shrink_to_fit();
        self.ends.shrink_to_fit();
    }
}

/// One byte string per token (its rendered piece), stored only where it differs from the
/// token's text: a bit per token says which, and a count per 64 tokens finds a stored one.
#[derive(Default)]
pub(crate) struct PieceTable {
    len: usize,
    /// Bit `id % 64` of word `id / 64`: the piece of token `id` is stored (differs from its text).
    differs: Vec<u64>,
    /// `before[w]`: how many pieces are stored for tokens below `64 * w`.
    before: Vec<u32>,
    stored: ByteArena,
}

impl PieceTable {
    /// An empty table with room for `n` tokens, `n_stored` of whose pieces, of `bytes` bytes
    /// in total, differ from their texts.
    pub fn with_capacity(n: usize, n_stored: usize, bytes: usize) -> PieceTable {
        PieceTable {
            len: 0,
            differs: Vec::with_capacity(n.div_ceil(64)),
            before: Vec::with_capacity(n.div_ceil(64)),
            stored: ByteArena::with_capacity(n_stored, bytes),
        }
    }

    /// Adds the next token's piece, `piece`, kept only when it differs from the token's `text`.
    /// Refuses when the kept pieces would total more than 4 GiB.
    pub fn push(&mut self, text: &str, piece: &[u8]) -> Result<(), InsertError> {
        let id = self.len;
        if id.is_multiple_of(64) {
            let before = u32::try_from(self.stored.len()).map_err(|_| InsertError::Full)?;
            self.differs.push(0);
            self.before.push(before);
        }
        if piece != text.as_bytes() {
            self.stored.push_with(|b| b.extend_from_slice(piece))?;
            self.differs[id / 64] |= 1 << (id % 64);
        }
        self.len += 1;
        Ok(())
    }

    /// The piece of token `id` (below the number pushed), whose text is `text`.
    #[inline]
    pub fn get<'a>(&'a self, id: usize, text: &'a str) -> &'a [u8] {
        let (w, bit) = (id / 64, id % 64);
        let word = self.differs[w];
        if word >> bit & 1 == 0 {
            return text.as_bytes();
        }
        let rank = self.before[w] as usize + (word & ((1u64 << bit) - 1)).count_ones() as usize;
        self.stored.get(rank)
    }

    pub fn shrink_to_fit(&mut self) {
        self.differs.shrink_to_fit();
        self.before.shrink_to_fit();
        self.stored.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_found_by_id_and_text() {
        let mut t = StrTable::with_capacity(2, 4);
        assert_eq!(t.insert("ab"), Ok(0));
        assert_eq!(t.insert(""), Ok(1));
        assert_eq!(t.insert("▁x"), Ok(2));
        assert_eq!(t.insert("ab"), Err(InsertError::Duplicate(0)));
        for i in 3..1000u32 {
            assert_eq!(t.insert(&format!("s{i}")), Ok(i));
        }
        t.shrink_to_fit();
        assert_eq!(t.len(), 1000);
        assert_eq!(t.text(0), "ab");
        assert_eq!(t.text(1), "");
        assert_eq!(t.get(2), Some("▁x"));
        assert_eq!(t.get(1000), None);
        for i in 3..1000u32 {
            assert_eq!(t.find(&format!("s{i}")), Some(i));
        }
        assert_eq!(t.find(""), Some(1));
        assert_eq!(t.find("a"), None);
        assert_eq!(t.find("▁"), None);
    }

    #[test]
    fn tables_over_shared_strings() {
        let strings: StrArray = (0..5000).map(|i| format!("w{i}")).collect();
        let t = StrTable::from_strings(strings.clone()).unwrap();
        assert_eq!(t.len(), 5000);
        for i in 0..5000u32 {
            assert_eq!(t.find(&format!("w{i}")), Some(i));
            assert_eq!(t.text(i), format!("w{i}"));
        }
        assert_eq!(t.find("w5000"), None);
        assert_eq!(t.find(""), None);
        // The text is the array's own, not a copy.
        assert!(std::ptr::eq(t.strings.text(), strings.text()));

        let dup: StrArray = ["a", "b", "", "c", "b"].into_iter().collect();
        assert_eq!(
            StrTable::from_strings(dup).err(),
            Some(BuildError::Duplicate {
                first: 1,
                second: 4
            })
        );
        let t = StrTable::from_strings(["", "x"].into_iter().collect()).unwrap();
        assert_eq!(
            (t.find(""), t.find("x"), t.find("y")),
            (Some(0), Some(1), None)
        );
        let t = StrTable::from_strings(StrArray::default()).unwrap();
        assert_eq!((t.len(), t.find("")), (0, None));
    }

    #[test]
    fn pieces_are_stored_only_where_they_differ() {
        let texts: Vec<String> = (0..300).map(|i| format!("▁t{i}")).collect();
        let piece = |i: usize| {
            if i.is_multiple_of(3) {
                texts[i].clone().into_bytes()
            } else {
                texts[i].replace('▁', " ").into_bytes()
            }
        };
        let mut p = PieceTable::with_capacity(300, 200, 300 * 5);
        for (i, text) in texts.iter().enumerate() {
            p.push(text, &piece(i)).unwrap();
        }
        assert_eq!(p.stored.len(), 200);
        for (i, text) in texts.iter().enumerate() {
            assert_eq!(p.get(i, text), piece(i).as_slice(), "{i}");
        }
    }

    #[test]
    fn byte_arena_keeps_entries_apart() {
        let mut a = ByteArena::default();
        a.push_with(|b| b.extend_from_slice(b"xy")).unwrap();
        a.push_with(|_| {}).unwrap();
        a.push_with(|b| b.push(0xff)).unwrap();
        assert_eq!(a.get(0), b"xy");
        assert_eq!(a.get(1), b"");
        assert_eq!(a.get(2), &[0xff]);
    }
}
