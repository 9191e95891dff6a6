//! llama.cpp's grammar-side UTF-8 decoding (`decode_utf8` with a partial sequence
//! carried between tokens), byte for byte, lenient where it is lenient.

/// An incomplete UTF-8 sequence at the end of the text seen so far
/// (`llama_partial_utf8`): the bits so far and how many bytes are missing; -1 marks
/// an invalid sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Partial {
    pub value: u32,
    pub n_remain: i32,
}

impl Partial {
    pub const NONE: Partial = Partial {
        value: 0,
        n_remain: 0,
    };
}

/// Decodes `src` continuing `start`, into `out` (cleared first); returns the partial
/// sequence left at the end. An invalid sequence leaves `out` empty and `n_remain < 0`,
/// as llama.cpp's does.
pub fn decode_utf8(src: &[u8], start: Partial, out: &mut Vec<u32>) -> Partial {
    const LOOKUP: [i32; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4];
    out.clear();
    let mut pos = 0;
    let mut value = start.value;
    let mut n_remain = start.n_remain;
    while pos < src.len() && n_remain > 0 {
        let b = src[pos];
        if b >> 6 != 2 {
            return Partial {
                value: 0,
                n_remain: -1,
            };
        }
        value = (value << 6) + u32::from(b & 0x3f);
        pos += 1;
        n_remain -= 1;
    }
    if start.n_remain > 0 && n_remain == 0 {
        out.push(value);
    }
    while pos < src.len() {
        let first = src[pos];
        n_remain = LOOKUP[usize::from(first >> 4)] - 1;
        if n_remain < 0 {
            out.clear();
            return Partial { value: 0, n_remain };
        }
        let mask = (1u32 << (7 - n_remain)) - 1;
        value = u32::from(first) & mask;
        pos += 1;
        while pos < src.len() && n_remain > 0 {
            value = (value << 6) + u32::from(src[pos] & 0x3f);
            pos += 1;
            n_remain -= 1;
        }
        if n_remain == 0 {
            out.push(value);
        }
    }
    Partial { value, n_remain }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_and_carries_partials() {
        let mut out = Vec::new();
        let p = decode_utf8("aé".as_bytes(), Partial::NONE, &mut out);
        assert_eq!(out, ['a' as u32, 'é' as u32]);
        assert_eq!(p.n_remain, 0);
        let bytes = "€".as_bytes();
        let p = decode_utf8(&bytes[..2], Partial::NONE, &mut out);
        assert!(out.is_empty());
        assert_eq!(p.n_remain, 1);
        let p = decode_utf8(&bytes[2..], p, &mut out);
        assert_eq!(out, ['€' as u32]);
        assert_eq!(p.n_remain, 0);
        let p = decode_utf8(&[0x80], Partial::NONE, &mut out);
        assert!(p.n_remain < 0 && out.is_empty());
    }
}
