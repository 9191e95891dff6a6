//! The three tokenizer algorithms, ported from llama.cpp's `llm_tokenizer_*_session`s.
//! Merge loops work on byte ranges and integer ids; the order of merges (priority, then
//! leftmost) is llama.cpp's exactly.

use std::collections::BinaryHeap;

use crate::TokenId;
use crate::unicode;
use crate::vocab::Vocab;

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    n: usize,
    prev: isize,
    next: isize,
    /// Interned merge piece (BPE only); u32::MAX when the text is not a merge piece.
    piece: u32,
}

#[inline]
fn utf8_len(first: u8) -> usize {
    const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LOOKUP[(first >> 4) as usize]
}

/// Splits `text` into one symbol per UTF-8 character, linked as a list.
fn symbols_of(text: &[u8], syms: &mut Vec<Symbol>) {
    syms.clear();
    let mut offs = 0;
    while offs < text.len() {
        let n = utf8_len(text[offs]).min(text.len() - offs);
        let idx = syms.len() as isize;
        syms.push(Symbol {
            start: offs,
            n,
            prev: idx - 1,
            next: if offs + n == text.len() { -1 } else { idx + 1 },
            piece: u32::MAX,
        });
        offs += n;
    }
}

/// A candidate SPM merge, packed into 16 bytes so the (large) heap stays cache-friendly.
/// `key` orders like llama.cpp's comparator: higher score first, then the leftmost pair.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct SpmBigram {
    key: u64,
    /// right index (high 32 bits) and merged byte size (low 32 bits).
    right_size: u64,
}

impl SpmBigram {
    fn new(score: f32, left: usize, right: usize, size: usize) -> SpmBigram {
        // Map the float to an unsigned integer with the same total order.
        let bits = score.to_bits();
        let ordered = if bits & 0x8000_0000 != 0 {
            !bits
        } else {
            bits | 0x8000_0000
        };
        let key = (u64::from(ordered) << 32) | u64::from(!(left as u32));
        SpmBigram {
            key,
            right_size: ((right as u64) << 32) | size as u64,
        }
    }
    fn left(&self) -> usize {
        !(self.key as u32) as usize
    }
    fn right(&self) -> usize {
        (self.right_size >> 32) as usize
    }
    fn size(&self) -> usize {
        (self.right_size & 0xFFFF_FFFF) as usize
    }
}

/// SentencePiece BPE (`llm_tokenizer_spm_session`): merge the best-scoring adjacent pair that
/// forms a token until none is left; characters that are not tokens fall back to byte tokens.
pub(crate) fn spm(v: &Vocab, text: &str, out: &mut Vec<TokenId>) {
    // Merges never cross a point "X▁" where no token contains "X▁", so the text is cut there
    // and each piece merged on its own: the same result as one pass over the whole text (the
    // merge order inside a piece is unchanged), with a small, cache-resident heap.
    let mut syms = Vec::new();
    let mut queue = BinaryHeap::new();
    let mut seg_start = 0;
    let mut prev: Option<char> = None;
    for (i, c) in text.char_indices() {
        if c == '\u{2581}' && i > seg_start && prev.is_some_and(|p| !v.spm_joins_space.contains(&p))
        {
            spm_segment(v, &text[seg_start..i], out, &mut syms, &mut queue);
            seg_start = i;
        }
        prev = Some(c);
    }
    spm_segment(v, &text[seg_start..], out, &mut syms, &mut queue);
}

fn spm_segment(
    v: &Vocab,
    text: &str,
    out: &mut Vec<TokenId>,
    syms: &mut Vec<Symbol>,
    queue: &mut BinaryHeap<SpmBigram>,
) {
    // Symbol indices and sizes are packed as u32; a (> 2 GiB) segment is split at a char
    // boundary, where llama.cpp would tokenize it whole.
    const MAX: usize = 1 << 31;
    if text.len() > MAX {
        let mut cut = MAX;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        spm_segment(v, &text[..cut], out, syms, queue);
        spm_segment(v, &text[cut..], out, syms, queue);
        return;
    }
    let bytes = text.as_bytes();
    symbols_of(bytes, syms);
    queue.clear();
    let try_add =
        |syms: &[Symbol], queue: &mut BinaryHeap<SpmBigram>, left: isize, right: isize| {
            if left < 0 || right < 0 {
                return;
            }
            let (l, r) = (&syms[left as usize], &syms[right as usize]);
            let piece = &text[l.start..l.start + l.n + r.n];
            if let Some(id) = v.texts.find(piece) {
                let score = v.score(id);
                queue.push(SpmBigram::new(
                    score,
                    left as usize,
                    right as usize,
                    piece.len(),
                ));
            }
        };
    for i in 1..syms.len() {
        try_add(syms, queue, i as isize - 1, i as isize);
    }
    while let Some(b) = queue.pop() {
        let (left, right) = (b.left(), b.right());
        let (ln, rn) = (syms[left].n, syms[right].n);
        if ln == 0 || rn == 0 || ln + rn != b.size() {
            continue;
        }
        syms[left].n += rn;
        syms[right].n = 0;
        let next = syms[right].next;
        syms[left].next = next;
        if next >= 0 {
            syms[next as usize].prev = left as isize;
        }
        let prev = syms[left].prev;
        try_add(syms, queue, prev, left as isize);
        try_add(syms, queue, left as isize, next);
    }
    let mut i = if syms.is_empty() { -1 } else { 0 };
    while i >= 0 {
        let s = syms[i as usize];
        let piece = &text[s.start..s.start + s.n];
        match v.texts.find(piece) {
            Some(id) => out.push(id),
            None => byte_fallback(v, piece.as_bytes(), out),
        }
        i = s.next;
    }
}

fn byte_fallback(v: &Vocab, bytes: &[u8], out: &mut Vec<TokenId>) {
    for &b in bytes {
        // llama.cpp throws when a byte has no token; we emit <unk> instead (if there is one).
        if let Some(id) = v.byte_to_token(b).or(v.ids.unk) {
            out.push(id);
        }
    }
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct BpeBigram {
    /// Reversed so that BinaryHeap (a max-heap) pops the lowest rank, then the leftmost.
    key: std::cmp::Reverse<(u32, usize)>,
    right: usize,
    size: usize,
    merged: u32,
}

/// Reusable buffers for BPE.
#[derive(Default)]
pub(crate) struct BpeScratch {
    syms: Vec<Symbol>,
    queue: BinaryHeap<BpeBigram>,
    word: String,
    cpts: Vec<u32>,
}

/// Byte-level BPE (`llm_tokenizer_bpe_session`): pre-tokenize with the splitters, byte-encode
/// each word (GPT-2 style) unless the vocabulary uses raw UTF-8, then merge by rank.
pub(crate) fn bpe(v: &Vocab, text: &str, out: &mut Vec<TokenId>, s: &mut BpeScratch) {
    s.cpts.clear();
    s.cpts.extend(text.chars().map(|c| c as u32));
    let lens = unicode::regex_split(&s.cpts, &v.splitters);
    let map = unicode::byte_to_unicode();
    let mut byte_pos = 0;
    let mut char_pos = 0;
    for len in lens {
        let wlen: usize = s.cpts[char_pos..char_pos + len]
            .iter()
            .map(|&c| char_len(c))
            .sum();
        let raw = &text[byte_pos..byte_pos + wlen];
        byte_pos += wlen;
        char_pos += len;
        s.word.clear();
        if v.byte_encode {
            for &b in raw.as_bytes() {
                s.word.push(map[b as usize]);
            }
        } else {
            s.word.push_str(raw);
        }
        let word = std::mem::take(&mut s.word);
        bpe_word(v, &word, out, s);
        s.word = word;
    }
}

#[inline]
fn char_len(c: u32) -> usize {
    match c {
        0..=0x7F => 1,
        0x80..=0x7FF => 2,
        0x800..=0xFFFF => 3,
        _ => 4,
    }
}

fn bpe_word(v: &Vocab, word: &str, out: &mut Vec<TokenId>, s: &mut BpeScratch) {
    if word.is_empty() {
        return;
    }
    let whole = || v.texts.find(word);
    if v.ignore_merges
        && let Some(id) = whole()
    {
        out.push(id);
        return;
    }
    if v.is_gemma4_pre
        && word.bytes().all(|b| b == b'\n')
        && let Some(id) = whole()
    {
        out.push(id);
        return;
    }
    let m = &v.merges;
    let n_tokens = v.texts.len() as u32;
    symbols_of(word.as_bytes(), &mut s.syms);
    for sym in s.syms.iter_mut() {
        let text = &word[sym.start..sym.start + sym.n];
        sym.piece = v
            .texts
            .find(text)
            .or_else(|| m.extra.find(text).map(|i| n_tokens + i))
            .unwrap_or(u32::MAX);
    }
    s.queue.clear();
    let add = |syms: &[Symbol], queue: &mut BinaryHeap<BpeBigram>, left: isize, right: isize| {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (&syms[left as usize], &syms[right as usize]);
        if l.piece == u32::MAX || r.piece == u32::MAX {
            return;
        }
        if let Some(&(rank, merged)) = m.ranks.get(&(l.piece, r.piece)) {
            queue.push(BpeBigram {
                key: std::cmp::Reverse((rank, left as usize)),
                right: right as usize,
                size: l.n + r.n,
                merged,
            });
        }
    };
    for i in 1..s.syms.len() {
        add(&s.syms, &mut s.queue, i as isize - 1, i as isize);
    }
    while let Some(b) = s.queue.pop() {
        let left = b.key.0.1;
        let (ln, rn) = (s.syms[left].n, s.syms[b.right].n);
        if ln == 0 || rn == 0 || ln + rn != b.size {
            continue;
        }
        let syms = &mut s.syms;
        syms[left].n += rn;
        syms[left].piece = b.merged;
        syms[b.right].n = 0;
        let next = syms[b.right].next;
        syms[left].next = next;
        if next >= 0 {
            syms[next as usize].prev = left as isize;
        }
        let prev = syms[left].prev;
        add(&s.syms, &mut s.queue, prev, left as isize);
        add(&s.syms, &mut s.queue, left as isize, next);
    }
    let mut i: isize = 0;
    while i >= 0 {
        let sym = s.syms[i as usize];
        i = sym.next;
        if sym.n == 0 {
            continue;
        }
        let text = &word[sym.start..sym.start + sym.n];
        let tok = if sym.piece != u32::MAX {
            (sym.piece < n_tokens).then_some(sym.piece)
        } else {
            v.texts.find(text)
        };
        match tok {
            Some(id) => out.push(id),
            None => {
                for &b in text.as_bytes() {
                    let id = if v.byte_encode {
                        std::str::from_utf8(&[b]).ok().and_then(|c| v.texts.find(c))
                    } else {
                        v.texts.find(&format!("<0x{b:02X}>"))
                    };
                    if let Some(id) = id {
                        out.push(id);
                    }
                }
            }
        }
    }
}

/// WordPiece (`llm_tokenizer_wpm_session`): BERT normalization, then greedy longest match
/// within each word, `<unk>` for words that cannot be matched.
pub(crate) fn wpm(v: &Vocab, text: &str, out: &mut Vec<TokenId>) {
    let mut word1 = String::new();
    wpm_preprocess(v, text, |word| wpm_word(v, word, out, &mut word1));
}

fn wpm_word(v: &Vocab, word: &str, out: &mut Vec<TokenId>, word1: &mut String) {
    if word.is_empty() {
        return;
    }
    word1.clear();
    word1.push('\u{2581}');
    word1.push_str(word);
    let n = word1.len();
    let current = out.len();
    let mut i = 0;
    while i < n {
        let mut matched = false;
        let mut j = n.min(i + v.max_token_len + 1);
        while j > i {
            // A slice ending inside a character cannot be a token.
            let id = if word1.is_char_boundary(j) {
                v.texts.find(&word1[i..j])
            } else {
                None
            };
            if let Some(id) = id {
                out.push(id);
                matched = true;
                i = j - 1;
                break;
            }
            j -= 1;
        }
        if !matched {
            out.truncate(current);
            break;
        }
        i += 1;
    }
    if out.len() == current
        && let Some(unk) = v.ids.unk
    {
        out.push(unk);
    }
}

fn is_chinese_char(c: u32) -> bool {
    (0x4E00..=0x9FFF).contains(&c)
        || (0x3400..=0x4DBF).contains(&c)
        || (0x20000..=0x2A6DF).contains(&c)
        || (0x2A700..=0x2B73F).contains(&c)
        || (0x2B740..=0x2B81F).contains(&c)
        || (0x2B920..=0x2CEAF).contains(&c)
        || (0xF900..=0xFAFF).contains(&c)
        || (0x2F800..=0x2FA1F).contains(&c)
}

/// BERT normalization and splitting (`llm_tokenizer_wpm_session::preprocess`), streaming each
/// word to `emit` instead of collecting them.
fn wpm_preprocess(v: &Vocab, text: &str, mut emit: impl FnMut(&str)) {
    let mut word = String::new();
    for c in text.chars() {
        let mut cpt = c as u32;
        if v.strip_accents {
            cpt = unicode::nfd_first(cpt);
        }
        let f = unicode::flags(cpt);
        if f & unicode::WHITESPACE != 0 {
            if !word.is_empty() {
                emit(&word);
                word.clear();
            }
            continue;
        }
        if cpt == 0 || cpt == 0xFFFD || f & unicode::CONTROL != 0 {
            continue;
        }
        if v.strip_accents && f & unicode::ACCENT_MARK != 0 {
            continue;
        }
        let out_cpt = if v.lowercase {
            unicode::to_lower(cpt)
        } else {
            cpt
        };
        let ch = char::from_u32(out_cpt).unwrap_or('\u{FFFD}');
        if f & unicode::PUNCTUATION != 0
            || (cpt < 0x7F && f & unicode::SYMBOL != 0)
            || is_chinese_char(cpt)
        {
            if !word.is_empty() {
                emit(&word);
                word.clear();
            }
            emit(ch.encode_utf8(&mut [0; 4]));
        } else {
            word.push(ch);
        }
    }
    if !word.is_empty() {
        emit(&word);
    }
}
