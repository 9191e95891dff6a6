//! The fast matcher against a literal port of llama.cpp's grammar engine: the same
//! mask at every step of random walks through several grammars, over a vocabulary with
//! multi-character, Unicode, partial-UTF-8, invalid and end-of-generation tokens.

mod common;

use std::sync::Arc;

use common::Reference;
use lamina_grammar::{Grammar, Matcher, TokenIndex};

const EOS: u32 = 0;

fn vocab() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = vec![b"</s>".to_vec()];
    for c in 0x20u8..0x7f {
        v.push(vec![c]);
    }
    for s in [
        "\n",
        "\t",
        "\"",
        "{\"",
        "\":",
        "\": ",
        ", ",
        ",\"",
        "}",
        "true",
        "false",
        "null",
        "12",
        "3.",
        "-1",
        "e+",
        "ab",
        "abc",
        "aaa",
        "ba",
        "  ",
        "\n  ",
        "hello",
        " world",
        "\\n",
        "\\\"",
        "\\u00",
        "é",
        "€",
        "日本",
        "x€y",
        "[",
        "]",
        "],",
        "0",
        "00",
        "1",
        "<think>",
        "</think>",
        "\u{1F600}",
        "a\u{1F600}",
        "yes",
        "no",
        "\"}",
        "\"]",
        "()",
        "((",
        "))",
    ] {
        v.push(s.as_bytes().to_vec());
    }
    // Partial and invalid UTF-8: the first bytes of "€" and "😀", a lone continuation
    // byte, a continuation tail, NUL, empty.
    for b in [
        &[0xe2u8][..],
        &[0xe2, 0x82],
        &[0x82, 0xac],
        &[0xac],
        &[0xf0, 0x9f],
        &[0x98, 0x80],
        &[b'a', 0xe2],
        &[0xc3],
        &[0xa9],
        &[0],
        &[],
        &[0xff],
    ] {
        v.push(b.to_vec());
    }
    v
}

const GRAMMARS: &[&str] = &[
    // JSON-like, as llama.cpp's json.gbnf.
    r#"root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-7]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
"#,
    // Alternatives and repetition bounds.
    "root ::= (\"a\" | \"ab\" | \"b\"){2,5} \"c\"?\n",
    // Negated classes, ranges, any-char, Unicode.
    "root ::= [^a-z\\n]* \".\" . [é€-€日-本]+ | \"x\" [\\u00e9-\\u20ac]? \"y\"\n",
    // Token references.
    "root ::= <[40]> ( !<[41]> )* <[41]> \"done\"\n",
    // Empty alternatives, nested groups, an optional end.
    "root ::= item*\nitem ::= ( \"yes\" | \"no\" ) (\", \" | ) | \"(\" item* \")\"\n",
    // Emoji and partial sequences.
    "root ::= (\"a\" | [\\U0001F600-\\U0001F64F] | \"€\")+\n",
    // Anything.
    "root ::= .*\n",
];

#[test]
fn masks_equal_llama_cpp_on_random_walks() {
    let pieces = vocab();
    // Token ids 40/41 are "<think>"-like stand-ins for the token-reference grammar.
    let is_eog = |id: u32| id == EOS;
    let index = Arc::new(TokenIndex::new(pieces.clone(), is_eog));
    let n = pieces.len();
    let mut rng: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |m: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % m as u64) as usize
    };
    let mut steps = 0;
    for src in GRAMMARS {
        let g = Grammar::parse(src, "root", None).unwrap();
        for walk in 0..12 {
            let mut fast = Matcher::new(&g, Arc::clone(&index));
            // Masks over truncated stacks must not depend on where they are cut.
            fast.set_trunc_depth([1, 2, 3, 8][walk % 4]);
            let mut slow = Reference::new(&g);
            for _ in 0..40 {
                let want = slow.allowed(&pieces, &is_eog);
                let mut mask = vec![0u64; n.div_ceil(64)];
                fast.fill_mask(&mut mask).unwrap();
                for id in 0..n {
                    let got = mask[id / 64] >> (id % 64) & 1 == 1;
                    assert_eq!(
                        got,
                        want[id],
                        "grammar {src:?}, token {id} {:?}: mask",
                        String::from_utf8_lossy(&pieces[id])
                    );
                    assert_eq!(fast.is_allowed(id as u32), want[id], "is_allowed {id}");
                }
                steps += 1;
                let allowed: Vec<usize> = (0..n).filter(|&i| want[i]).collect();
                if allowed.is_empty() {
                    break;
                }
                let t = allowed[next(allowed.len())] as u32;
                if t == EOS {
                    assert!(fast.is_accepting());
                    fast.accept(t).unwrap();
                    break;
                }
                assert!(slow.accept(t, &pieces[t as usize]));
                fast.accept(t).unwrap();
            }
        }
    }
    assert!(steps > 300, "{steps}");
}

#[test]
fn rejected_tokens_do_not_change_state() {
    let pieces = vocab();
    let index = Arc::new(TokenIndex::new(pieces.clone(), |id| id == EOS));
    let g = Grammar::parse("root ::= \"ab\" \"c\"\n", "root", None).unwrap();
    let mut m = Matcher::new(&g, index);
    let b = pieces.iter().position(|p| p == b"b").unwrap() as u32;
    let ab = pieces.iter().position(|p| p == b"ab").unwrap() as u32;
    let c = pieces.iter().position(|p| p == b"c").unwrap() as u32;
    assert!(m.accept(b).is_err());
    assert!(m.accept(EOS).is_err());
    m.accept(ab).unwrap();
    assert!(!m.is_accepting());
    m.accept(c).unwrap();
    assert!(m.is_finished());
    m.accept(EOS).unwrap();
}
