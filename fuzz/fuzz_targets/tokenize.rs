//! Fuzzes the tokenizers: arbitrary bytes (as text, lossily) through every vocabulary of
//! `$LAMINA_FUZZ_VOCABS` (default `../../shared/vocab`), with and without special tokens.
//! Tokenizing never panics, gives ids inside the vocabulary, and detokenizing them never
//! panics; byte-level BPE vocabularies' pieces give the text back.

#![no_main]

use std::sync::OnceLock;

use lamina_tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fn tokenizers() -> &'static [(String, Tokenizer)] {
    static T: OnceLock<Vec<(String, Tokenizer)>> = OnceLock::new();
    T.get_or_init(|| {
        let dir =
            std::env::var("LAMINA_FUZZ_VOCABS").unwrap_or_else(|_| "../../shared/vocab".into());
        let mut out = Vec::new();
        let mut paths: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot read {dir}: {e} (set LAMINA_FUZZ_VOCABS)"))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
            .collect();
        paths.sort();
        for p in paths {
            let bytes = std::fs::read(&p).unwrap();
            let gguf = lamina_gguf::Gguf::parse(&bytes).unwrap();
            if let Ok(t) = Tokenizer::from_gguf(&gguf) {
                out.push((p.file_name().unwrap().to_string_lossy().into_owned(), t));
            }
        }
        out
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for (name, tok) in tokenizers() {
        let lossless = ["gpt-2", "llama-bpe", "qwen2", "deepseek-llm"]
            .iter()
            .any(|n| name.contains(n));
        for (add_special, parse_special) in [(false, false), (true, true)] {
            let ids = tok.tokenize(&text, add_special, parse_special);
            assert!(ids.iter().all(|&t| (t as usize) < tok.n_vocab()), "{name}");
            let _ = tok.detokenize(&ids, add_special, parse_special);
            if lossless && !add_special {
                let raw: Vec<u8> = ids
                    .iter()
                    .flat_map(|&t| tok.token_to_piece(t, false))
                    .collect();
                assert_eq!(String::from_utf8_lossy(&raw), text, "{name}");
            }
        }
    }
});
