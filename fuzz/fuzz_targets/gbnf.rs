//! Fuzzes the GBNF parser on arbitrary text: parsing never panics, and a grammar that parses
//! gives a matcher that accepts or refuses every byte of a small vocabulary without panicking.

#![no_main]

use std::sync::{Arc, OnceLock};

use lamina_grammar::{Grammar, MatchError, Matcher, TokenIndex};
use libfuzzer_sys::fuzz_target;

fn vocab() -> Arc<TokenIndex> {
    static V: OnceLock<Arc<TokenIndex>> = OnceLock::new();
    V.get_or_init(|| {
        let mut pieces: Vec<Vec<u8>> = (0u8..=255).map(|b| vec![b]).collect();
        for s in ["ab", "{\"", "\":", "12", "true", "é", "</s>"] {
            pieces.push(s.as_bytes().to_vec());
        }
        let eos = pieces.len() as u32 - 1;
        Arc::new(TokenIndex::new(pieces, move |t| t == eos))
    })
    .clone()
}

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(grammar) = Grammar::parse(src, "root", None) else {
        return;
    };
    let Ok(mut m) = std::panic::catch_unwind(|| Matcher::new(&grammar, vocab())).map_err(|_| ())
    else {
        panic!("Matcher::new panicked on a parsed grammar");
    };
    let mut mask = vec![0u64; 5];
    for step in 0..16u32 {
        // A grammar too ambiguous to follow stops with a typed error (issue 20).
        if let Err(e) = m.fill_mask(&mut mask) {
            assert!(
                matches!(e, MatchError::TooManyStacks(_) | MatchError::TooMuchWork(_)),
                "{e}"
            );
            break;
        }
        let t =
            (0..263u32).find(|&t| mask[t as usize / 64] >> (t % 64) & 1 == 1 && t % 7 == step % 7);
        match t {
            Some(t) => match m.accept(t) {
                Ok(()) => {}
                Err(MatchError::TooManyStacks(_) | MatchError::TooMuchWork(_)) => break,
                Err(e) => panic!("token {t} was in the mask but is refused: {e}"),
            },
            None => break,
        }
    }
});
