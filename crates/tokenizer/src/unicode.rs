//! Codepoint classification and the pre-tokenizer splitters, ported from llama.cpp's
//! `unicode.cpp`: the hand-written GPT-2 and Llama-3 splitters, and the general regex path that
//! matches on a "collapsed" copy of the text (each non-ASCII codepoint replaced by a stand-in
//! for its category) exactly as llama.cpp does, so category tables and `\s` agree with it.

use std::sync::OnceLock;

use crate::hash::FxHashMap;
use crate::unicode_data as data;

pub use data::{ACCENT_MARK, CONTROL, LETTER, NUMBER, PUNCTUATION, SYMBOL};

/// Bit set in [`flags`] for whitespace (`\s`).
pub const WHITESPACE: u8 = 128;
const MAX_CODEPOINTS: usize = 0x110000;

/// Codepoints per block of [`FlagTable`].
const BLOCK: usize = 256;

/// The flags of every codepoint, in two levels: the codepoints in blocks of [`BLOCK`], and each
/// distinct block's flags stored once, however many blocks share them (most of the 4,352
/// blocks are all one category or unassigned). About 100 KB, where one byte per codepoint
/// took 1.1 MB.
struct FlagTable {
    /// Which stored block holds the flags of codepoints `BLOCK * b ..`.
    block: Box<[u16]>,
    /// The distinct blocks, end to end.
    flags: Box<[u8]>,
}

fn table() -> &'static FlagTable {
    static TABLE: OnceLock<FlagTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let ranges = data::FLAG_RANGES;
        let n_blocks = MAX_CODEPOINTS / BLOCK;
        let mut block = Vec::with_capacity(n_blocks);
        let mut flags = Vec::new();
        let mut seen: FxHashMap<[u8; BLOCK], u16> = FxHashMap::default();
        // Index of the range that holds the codepoint being filled in (ranges are sorted).
        let mut r = 0;
        for b in 0..n_blocks {
            let base = b * BLOCK;
            let mut buf = [0u8; BLOCK];
            for (j, slot) in buf.iter_mut().enumerate() {
                let cp = base + j;
                while r + 1 < ranges.len() && ranges[r + 1].0 as usize <= cp {
                    r += 1;
                }
                if ranges
                    .get(r)
                    .is_some_and(|&(start, _)| start as usize <= cp)
                {
                    *slot = ranges[r].1;
                }
            }
            for &cp in data::WHITESPACE {
                if cp as usize / BLOCK == b {
                    buf[cp as usize % BLOCK] |= WHITESPACE;
                }
            }
            let id = *seen.entry(buf).or_insert_with(|| {
                let id = (flags.len() / BLOCK) as u16;
                flags.extend_from_slice(&buf);
                id
            });
            block.push(id);
        }
        FlagTable {
            block: block.into_boxed_slice(),
            flags: flags.into_boxed_slice(),
        }
    })
}

/// Category flags of a codepoint (0 = undefined, as for codepoints past U+10FFFF).
#[inline]
pub fn flags(cp: u32) -> u8 {
    let t = table();
    match t.block.get(cp as usize / BLOCK) {
        Some(&b) => t.flags[b as usize * BLOCK + cp as usize % BLOCK],
        None => 0,
    }
}

#[cfg(test)]
pub fn is_whitespace(cp: u32) -> bool {
    flags(cp) & WHITESPACE != 0
}

/// `unicode_tolower`: the first codepoint of Python's `str.lower()`.
pub fn to_lower(cp: u32) -> u32 {
    if cp < 128 {
        return (cp as u8).to_ascii_lowercase() as u32;
    }
    match data::LOWERCASE.binary_search_by_key(&cp, |p| p.0) {
        Ok(i) => data::LOWERCASE[i].1,
        Err(_) => cp,
    }
}

/// `unicode_cpts_normalize_nfd` for one codepoint: the first codepoint of its NFD.
pub fn nfd_first(cp: u32) -> u32 {
    if cp < 0xC0 {
        return cp; // nothing below U+00C0 decomposes canonically
    }
    let i = data::NFD_RANGES.partition_point(|r| r.0 <= cp);
    if i > 0 {
        let (first, last, nfd) = data::NFD_RANGES[i - 1];
        if first <= cp && cp <= last {
            return nfd;
        }
    }
    cp
}

/// GPT-2's byte-to-unicode table: each byte maps to a printable codepoint.
pub fn byte_to_unicode() -> &'static [char; 256] {
    static MAP: OnceLock<[char; 256]> = OnceLock::new();
    MAP.get_or_init(|| {
        let mut map = ['\0'; 256];
        let mut assigned = [false; 256];
        for b in (0x21..=0x7E).chain(0xA1..=0xAC).chain(0xAE..=0xFF) {
            map[b] = char::from_u32(b as u32).expect("latin-1");
            assigned[b] = true;
        }
        let mut n = 0;
        for b in 0..256 {
            if !assigned[b] {
                map[b] = char::from_u32(256 + n).expect("valid");
                n += 1;
            }
        }
        map
    })
}

/// The inverse of [`byte_to_unicode`], `None` for codepoints outside its image.
pub fn unicode_to_byte(c: char) -> Option<u8> {
    static INV: OnceLock<Vec<i16>> = OnceLock::new();
    let inv = INV.get_or_init(|| {
        let mut inv = vec![-1i16; 512];
        for (b, &c) in byte_to_unicode().iter().enumerate() {
            inv[c as usize] = b as i16;
        }
        inv
    });
    inv.get(c as usize).and_then(|&b| u8::try_from(b).ok())
}

/// One step of a pre-tokenizer: a splitter applied to every piece the previous steps made.
#[derive(Debug)]
pub enum Splitter {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
    /// The Llama-3 pattern (case-insensitive contractions, `\p{N}{1,3}`, newline runs); with
    /// `max_digits == 1`, the Qwen2 pattern (`\p{N}`); with `marks`, Qwen3.5's (`[\p{L}\p{M}]+`).
    Llama3 { max_digits: usize, marks: bool },
    /// `[^\n]+|[\n]+`: runs of newlines and runs of everything else.
    Newlines,
    /// A regex. `collapsed`: matched against the category-collapsed text (the pattern used
    /// `\p{..}`); otherwise against the text with non-ASCII whitespace replaced by U+000B.
    Regex { re: Matcher, collapsed: bool },
}

/// A compiled pattern: the `regex` crate when it can (faster), `fancy-regex` for lookaround.
#[derive(Debug)]
pub enum Matcher {
    Plain(regex::Regex),
    Fancy(fancy_regex::Regex),
}

impl Matcher {
    fn new(pattern: &str) -> Result<Matcher, String> {
        match regex::Regex::new(pattern) {
            Ok(re) => Ok(Matcher::Plain(re)),
            Err(_) => fancy_regex::Regex::new(pattern)
                .map(Matcher::Fancy)
                .map_err(|e| e.to_string()),
        }
    }

    /// The first match at or after byte `pos`, as a byte range.
    fn find_at(&self, text: &str, pos: usize) -> Option<(usize, usize)> {
        match self {
            Matcher::Plain(re) => re.find_at(text, pos).map(|m| (m.start(), m.end())),
            Matcher::Fancy(re) => re
                .find_from_pos(text, pos)
                .ok()
                .flatten()
                .map(|m| (m.start(), m.end())),
        }
    }
}

/// Private-use stand-ins for the categories in collapsed text (llama.cpp uses bytes 0xD0-0xD5).
const COLLAPSED_OTHER: char = '\u{F0D0}';
fn collapsed_char(f: u8) -> char {
    let cat = f & !WHITESPACE;
    match cat {
        NUMBER => '\u{F0D1}',
        LETTER => '\u{F0D2}',
        PUNCTUATION => '\u{F0D3}',
        ACCENT_MARK => '\u{F0D4}',
        SYMBOL => '\u{F0D5}',
        _ => COLLAPSED_OTHER,
    }
}

/// The ASCII members of each category, as llama.cpp's `k_ucat_map` lists them.
fn category_class(name: &str) -> Option<&'static str> {
    Some(match name {
        "N" => r"\x{F0D1}0-9",
        "L" | "Lu" | "Ll" | "Lt" | "Lm" | "Lo" => r"\x{F0D2}A-Za-z",
        "P" => r"\x{F0D3}!-#%-*,-/:-;?-@\[-\]_\{\}",
        "M" => r"\x{F0D4}",
        "S" => r"\x{F0D5}\$\+<->\^`\|\~",
        _ => return None,
    })
}

impl Splitter {
    /// Builds a splitter from a pattern in llama.cpp's (ECMAScript) spelling. Patterns using
    /// `\p{..}` are rewritten to match collapsed text, as llama.cpp does.
    pub fn regex(pattern: &str) -> Result<Splitter, String> {
        let uses_categories = ["N", "L", "P", "M", "S", "Lu", "Ll", "Lt", "Lm", "Lo"]
            .iter()
            .any(|c| pattern.contains(&format!("\\p{{{c}}}")));
        let rewritten = if uses_categories {
            collapse_pattern(pattern)
        } else {
            pattern.to_string()
        };
        Ok(Splitter::Regex {
            re: Matcher::new(&rewritten)?,
            collapsed: uses_categories,
        })
    }
}

fn collapse_pattern(p: &str) -> String {
    let b = p.as_bytes();
    let mut out = String::with_capacity(p.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'[' && (i == 0 || b[i - 1] != b'\\') {
            out.push('[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && b[i] == b']' && b[i - 1] != b'\\' {
            out.push(']');
            inside = false;
            i += 1;
            continue;
        }
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1] == b'p'
            && b[i + 2] == b'{'
            && let Some(close) = p[i + 3..].find('}').map(|c| c + i + 3)
            && let Some(class) = category_class(&p[i + 3..close])
        {
            if !inside {
                out.push('[');
            }
            out.push_str(class);
            if !inside {
                out.push(']');
            }
            i = close + 1;
            continue;
        }
        // Copy one whole character (the pattern may hold non-ASCII literals).
        let ch = p[i..].chars().next().expect("in bounds");
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// Splits `cpts` with each splitter in turn; returns the piece lengths in codepoints.
pub fn regex_split(cpts: &[u32], splitters: &[Splitter]) -> Vec<usize> {
    let mut offsets = vec![cpts.len()];
    for s in splitters {
        offsets = match s {
            Splitter::Gpt2 => split_gpt2(cpts, &offsets),
            Splitter::Llama3 { max_digits, marks } => {
                split_llama3(cpts, &offsets, *max_digits, *marks)
            }
            Splitter::Newlines => split_newlines(cpts, &offsets),
            Splitter::Regex { re, collapsed } => split_regex(cpts, &offsets, re, *collapsed),
        };
    }
    offsets
}

fn split_regex(cpts: &[u32], offsets: &[usize], re: &Matcher, collapsed: bool) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    let mut text = String::new();
    // Byte offset in `text` -> codepoint index, at each char boundary.
    let mut idx: Vec<usize> = Vec::new();
    for &len in offsets {
        let piece = &cpts[start..start + len];
        text.clear();
        idx.clear();
        for (n, &cp) in piece.iter().enumerate() {
            let c = if cp < 128 {
                cp as u8 as char
            } else {
                let f = flags(cp);
                if f & WHITESPACE != 0 {
                    '\u{0B}'
                } else if collapsed {
                    collapsed_char(f)
                } else {
                    char::from_u32(cp).unwrap_or('\u{FFFD}')
                }
            };
            idx.resize(text.len() + c.len_utf8(), n);
            text.push(c);
        }
        idx.push(piece.len());
        let mut prev = 0;
        let mut pos = 0;
        while pos <= text.len() {
            let Some((m_start, m_end)) = re.find_at(&text, pos) else {
                break;
            };
            let (ms, me) = (idx[m_start], idx[m_end]);
            if ms > prev {
                out.push(ms - prev);
            }
            if me > ms {
                out.push(me - ms);
            }
            prev = me;
            pos = if m_end > m_start {
                m_end
            } else {
                // Empty match: step over one character.
                match text[m_end..].chars().next() {
                    Some(c) => m_end + c.len_utf8(),
                    None => break,
                }
            };
        }
        if prev < piece.len() {
            out.push(piece.len() - prev);
        }
        start += len;
    }
    out
}

struct Cursor<'a> {
    cpts: &'a [u32],
    ini: usize,
    end: usize,
}

const OUT_OF_RANGE: u32 = 0xFFFF_FFFF;

impl Cursor<'_> {
    #[inline]
    fn cpt(&self, pos: usize) -> u32 {
        if self.ini <= pos && pos < self.end {
            self.cpts[pos]
        } else {
            OUT_OF_RANGE
        }
    }
    #[inline]
    fn flags(&self, pos: usize) -> u8 {
        if self.ini <= pos && pos < self.end {
            flags(self.cpts[pos])
        } else {
            0
        }
    }
}

#[inline]
fn is_letter(f: u8) -> bool {
    f & LETTER != 0
}
#[inline]
fn is_number(f: u8) -> bool {
    f & NUMBER != 0
}
#[inline]
fn is_ws(f: u8) -> bool {
    f & WHITESPACE != 0
}
/// `[^\s\p{L}\p{N}]` for a defined codepoint.
#[inline]
fn is_other(f: u8) -> bool {
    f & (WHITESPACE | LETTER | NUMBER) == 0 && f != 0
}

fn split_gpt2(cpts: &[u32], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let c = Cursor {
            cpts,
            ini: start,
            end: start + len,
        };
        let end = start + len;
        let mut prev_end = start;
        let mut add = |e: usize, out: &mut Vec<usize>| -> usize {
            let n = e - prev_end;
            if n > 0 {
                out.push(n);
            }
            prev_end = e;
            n
        };
        let mut pos = start;
        while pos < end {
            let cpt = c.cpt(pos);
            let f = c.flags(pos);
            if cpt == '\'' as u32 && pos + 1 < end {
                let next = c.cpt(pos + 1);
                if [b's', b't', b'm', b'd'].iter().any(|&x| next == x as u32) {
                    pos += add(pos + 2, &mut out);
                    continue;
                }
                if pos + 2 < end {
                    let nn = c.cpt(pos + 2);
                    let (a, b) = (next, nn);
                    if ((a == 'r' as u32 || a == 'v' as u32) && b == 'e' as u32)
                        || (a == 'l' as u32 && b == 'l' as u32)
                    {
                        pos += add(pos + 3, &mut out);
                        continue;
                    }
                }
            }
            let space = cpt == ' ' as u32;
            let mut f2 = if space { c.flags(pos + 1) } else { f };
            if is_letter(f2) {
                pos += space as usize;
                while is_letter(f2) {
                    pos += 1;
                    f2 = c.flags(pos);
                }
                add(pos, &mut out);
                continue;
            }
            if is_number(f2) {
                pos += space as usize;
                while is_number(f2) {
                    pos += 1;
                    f2 = c.flags(pos);
                }
                add(pos, &mut out);
                continue;
            }
            if is_other(f2) {
                pos += space as usize;
                while is_other(f2) {
                    pos += 1;
                    f2 = c.flags(pos);
                }
                add(pos, &mut out);
                continue;
            }
            let mut n_ws = 0;
            while is_ws(c.flags(pos + n_ws)) {
                n_ws += 1;
            }
            if n_ws > 1 && c.cpt(pos + n_ws) != OUT_OF_RANGE {
                pos += n_ws - 1;
                add(pos, &mut out);
                continue;
            }
            if n_ws > 0 {
                pos += n_ws;
                add(pos, &mut out);
                continue;
            }
            pos += 1;
            add(pos, &mut out);
        }
        start = end;
    }
    out
}

fn split_newlines(cpts: &[u32], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let end = start + len;
        let mut pos = start;
        while pos < end {
            let nl = cpts[pos] == '\n' as u32;
            let run = pos;
            while pos < end && (cpts[pos] == '\n' as u32) == nl {
                pos += 1;
            }
            out.push(pos - run);
        }
        start = end;
    }
    out
}

fn split_llama3(cpts: &[u32], offsets: &[usize], max_digits: usize, marks: bool) -> Vec<usize> {
    // Qwen3.5 counts combining marks as letters.
    let lm = if marks { LETTER | ACCENT_MARK } else { LETTER };
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let c = Cursor {
            cpts,
            ini: start,
            end: start + len,
        };
        let end = start + len;
        let mut prev_end = start;
        let mut add = |e: usize, out: &mut Vec<usize>| -> usize {
            let n = e - prev_end;
            if n > 0 {
                out.push(n);
            }
            prev_end = e;
            n
        };
        let mut pos = start;
        while pos < end {
            let cpt = c.cpt(pos);
            let f = c.flags(pos);
            if cpt == '\'' as u32 && pos + 1 < end {
                let next = to_lower(c.cpt(pos + 1));
                if [b's', b't', b'm', b'd'].iter().any(|&x| next == x as u32) {
                    pos += add(pos + 2, &mut out);
                    continue;
                }
                if pos + 2 < end {
                    let nn = to_lower(c.cpt(pos + 2));
                    let (a, b) = (next, nn);
                    if ((a == 'r' as u32 || a == 'v' as u32) && b == 'e' as u32)
                        || (a == 'l' as u32 && b == 'l' as u32)
                    {
                        pos += add(pos + 3, &mut out);
                        continue;
                    }
                }
            }
            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(cpt == '\r' as u32 || cpt == '\n' as u32 || is_number(f))
                && (f & lm != 0 || c.flags(pos + 1) & lm != 0)
            {
                pos += 1;
                while c.flags(pos) & lm != 0 {
                    pos += 1;
                }
                add(pos, &mut out);
                continue;
            }
            // \p{N}{1,3}
            if is_number(f) {
                let mut ini = pos;
                while is_number(c.flags(pos)) {
                    pos += 1;
                    if pos - ini >= max_digits {
                        add(pos, &mut out);
                        ini = pos;
                    }
                }
                add(pos, &mut out);
                continue;
            }
            // <space>?[^\s\p{L}\p{N}]+[\r\n]*
            let space = cpt == ' ' as u32;
            let mut f2 = if space { c.flags(pos + 1) } else { f };
            if f2 & (WHITESPACE | lm | NUMBER) == 0 && f != 0 {
                pos += space as usize;
                while f2 & (WHITESPACE | lm | NUMBER) == 0 && f2 != 0 {
                    pos += 1;
                    f2 = c.flags(pos);
                }
                let mut c2 = c.cpt(pos);
                while c2 == '\r' as u32 || c2 == '\n' as u32 {
                    pos += 1;
                    c2 = c.cpt(pos);
                }
                add(pos, &mut out);
                continue;
            }
            let mut n_ws = 0;
            let mut last_rn = 0;
            while is_ws(c.flags(pos + n_ws)) {
                let c2 = c.cpt(pos + n_ws);
                if c2 == '\r' as u32 || c2 == '\n' as u32 {
                    last_rn = pos + n_ws + 1;
                }
                n_ws += 1;
            }
            if last_rn > 0 {
                pos = last_rn;
                add(pos, &mut out);
                continue;
            }
            if n_ws > 1 && c.cpt(pos + n_ws) != OUT_OF_RANGE {
                pos += n_ws - 1;
                add(pos, &mut out);
                continue;
            }
            if n_ws > 0 {
                pos += n_ws;
                add(pos, &mut out);
                continue;
            }
            pos += 1;
            add(pos, &mut out);
        }
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two-level table gives every codepoint the flags of the flat table it replaced.
    #[test]
    fn flag_table_matches_the_flat_table() {
        let mut flat = vec![0u8; MAX_CODEPOINTS];
        for (i, &(start, f)) in data::FLAG_RANGES.iter().enumerate() {
            let end = data::FLAG_RANGES
                .get(i + 1)
                .map_or(MAX_CODEPOINTS, |r| r.0 as usize);
            flat[start as usize..end].fill(f);
        }
        for &cp in data::WHITESPACE {
            flat[cp as usize] |= WHITESPACE;
        }
        for (cp, &f) in flat.iter().enumerate() {
            assert_eq!(flags(cp as u32), f, "U+{cp:04X}");
        }
        assert_eq!(flags(MAX_CODEPOINTS as u32), 0);
        assert_eq!(flags(u32::MAX), 0);
        let t = table();
        assert!(t.flags.len() < 200 * 1024, "{} bytes", t.flags.len());
    }

    fn split(text: &str, s: &[Splitter]) -> Vec<String> {
        let cpts: Vec<u32> = text.chars().map(|c| c as u32).collect();
        let mut start = 0;
        regex_split(&cpts, s)
            .into_iter()
            .map(|n| {
                let w: String = cpts[start..start + n]
                    .iter()
                    .map(|&c| char::from_u32(c).unwrap())
                    .collect();
                start += n;
                w
            })
            .collect()
    }

    #[test]
    fn flags_match_categories() {
        assert!(flags('a' as u32) & LETTER != 0);
        assert!(flags('é' as u32) & LETTER != 0);
        assert!(flags('7' as u32) & NUMBER != 0);
        assert!(flags('!' as u32) & PUNCTUATION != 0);
        assert!(is_whitespace(0x3000) && is_whitespace('\n' as u32) && !is_whitespace('x' as u32));
        assert_eq!(to_lower('Ä' as u32), 'ä' as u32);
        assert_eq!(nfd_first('é' as u32), 'e' as u32);
    }

    #[test]
    fn byte_map_roundtrips() {
        let m = byte_to_unicode();
        assert_eq!(m[b' ' as usize], 'Ġ');
        for b in 0..=255u8 {
            assert_eq!(unicode_to_byte(m[b as usize]), Some(b));
        }
    }

    #[test]
    fn gpt2_split() {
        assert_eq!(
            split("Hello world's  end", &[Splitter::Gpt2]),
            ["Hello", " world", "'s", " ", " end"]
        );
    }

    #[test]
    fn llama3_split() {
        assert_eq!(
            split(
                "12345 ab\n\n",
                &[Splitter::Llama3 {
                    max_digits: 3,
                    marks: false
                }]
            ),
            ["123", "45", " ab", "\n\n"]
        );
    }

    #[test]
    fn collapsed_regex_split() {
        let s = Splitter::regex(r"\p{N}").unwrap();
        assert_eq!(split("a12б٣", &[s]), ["a", "1", "2", "б", "٣"]);
    }
}
