//! Compact storage for the vocabulary's strings: token texts (and BPE merge pieces) end to end
//! in one buffer with a hash index of ids, and rendered pieces end to end in another. A
//! 262,144-token vocabulary then takes its bytes plus a few bytes a token, where a `String` per
//! token (and a second copy as a hash-map key) took a header and a heap block per copy.

use std::hash::Hasher;

use hashbrown::HashTable;

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
    /// The strings would total more than 4 GiB, or there would be more than `u32::MAX` of them.
    Full,
}

/// Strings numbered 0, 1, ... in insertion order, stored end to end. The index keeps only the
/// ids: a lookup hashes the query and compares it with the stored text of each candidate.
pub(crate) struct StrTable {
    text: String,
    /// String `i` is `text[bounds[i]..bounds[i + 1]]`.
    bounds: Vec<u32>,
    index: HashTable<u32>,
}

impl Default for StrTable {
    fn default() -> StrTable {
        StrTable::with_capacity(0, 0)
    }
}

/// The bytes of string `id` of a table's `text` and `bounds` (separate so that the index can
/// borrow them while it changes).
#[inline]
fn bytes_of<'a>(text: &'a str, bounds: &[u32], id: u32) -> &'a [u8] {
    let i = id as usize;
    &text.as_bytes()[bounds[i] as usize..bounds[i + 1] as usize]
}

impl StrTable {
    /// An empty table with room for `n` strings of `bytes` bytes in total.
    pub fn with_capacity(n: usize, bytes: usize) -> StrTable {
        let mut bounds = Vec::with_capacity(n + 1);
        bounds.push(0);
        StrTable {
            text: String::with_capacity(bytes),
            bounds,
            index: HashTable::with_capacity(n),
        }
    }

    pub fn len(&self) -> usize {
        self.bounds.len() - 1
    }

    /// Total bytes of all the strings.
    pub fn text_len(&self) -> usize {
        self.text.len()
    }

    /// String `id`; `id` must be below [`len`](Self::len).
    #[inline]
    pub fn text(&self, id: u32) -> &str {
        let i = id as usize;
        &self.text[self.bounds[i] as usize..self.bounds[i + 1] as usize]
    }

    pub fn get(&self, id: u32) -> Option<&str> {
        ((id as usize) < self.len()).then(|| self.text(id))
    }

    /// The id of `s`.
    #[inline]
    pub fn find(&self, s: &str) -> Option<u32> {
        let s = s.as_bytes();
        self.find_hashed(hash_bytes(s), s)
    }

    #[inline]
    fn find_hashed(&self, hash: u64, s: &[u8]) -> Option<u32> {
        self.index
            .find(hash, |&id| bytes_of(&self.text, &self.bounds, id) == s)
            .copied()
    }

    /// Appends `s` under the next id.
    pub fn insert(&mut self, s: &str) -> Result<u32, InsertError> {
        let hash = hash_bytes(s.as_bytes());
        if let Some(id) = self.find_hashed(hash, s.as_bytes()) {
            return Err(InsertError::Duplicate(id));
        }
        let id = u32::try_from(self.len()).map_err(|_| InsertError::Full)?;
        let end = u32::try_from(self.text.len() + s.len()).map_err(|_| InsertError::Full)?;
        self.text.push_str(s);
        self.bounds.push(end);
        let (text, bounds) = (&self.text, &self.bounds);
        self.index
            .insert_unique(hash, id, |&id| hash_bytes(bytes_of(text, bounds, id)));
        Ok(id)
    }

    /// Frees spare capacity (after the table is built).
    pub fn shrink_to_fit(&mut self) {
        self.text.shrink_to_fit();
        self.bounds.shrink_to_fit();
        let (text, bounds) = (&self.text, &self.bounds);
        self.index
            .shrink_to_fit(|&id| hash_bytes(bytes_of(text, bounds, id)));
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
