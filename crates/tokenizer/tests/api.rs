//! Behaviour of the public API on llama.cpp's vocab-only files: special-token parsing, BOS/EOS,
//! detokenization options, end-of-generation sets; and refusal of hostile vocabularies.

use std::path::PathBuf;

use lamina_tokenizer::{Tokenizer, TokenizerError};

fn vocab(name: &str) -> Option<Tokenizer> {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/vocab"
    ))
    .join(format!("ggml-vocab-{name}.gguf"));
    if !p.is_file() {
        eprintln!("skipping: {} is absent", p.display());
        return None;
    }
    Some(Tokenizer::from_file(&p).unwrap())
}

#[test]
fn spm_special_parsing_and_bos() {
    let Some(t) = vocab("llama-spm") else { return };
    assert_eq!(
        (t.bos(), t.eos(), t.add_bos(), t.add_space_prefix()),
        (Some(1), Some(2), true, true)
    );
    assert_eq!(t.tokenize("Hello world", true, false), [1, 15043, 3186]);
    // parse_special turns "</s>" into EOS; without it the text is tokenized as text.
    let parsed = t.tokenize("Hello</s>", false, true);
    assert_eq!(parsed.last(), Some(&2));
    assert!(!t.tokenize("Hello</s>", false, false).contains(&2));
    // Detokenize as llama.cpp: the space prefix is stripped from the first token only when no
    // BOS was removed; control tokens render only on request.
    let ids = t.tokenize("Hello world", true, false);
    assert_eq!(t.detokenize(&ids[1..], false, false), "Hello world");
    assert_eq!(t.detokenize(&ids, true, false), " Hello world");
    assert_eq!(t.detokenize(&ids, false, true), "<s> Hello world");
    assert_eq!(t.detokenize(&ids, false, false), " Hello world");
    assert_eq!(t.token_to_piece(1, false), b"");
    assert_eq!(t.token_to_piece(1, true), b"<s>");
    // Byte fallback tokens reassemble multi-byte characters.
    let ids = t.tokenize("🦙", false, false);
    assert_eq!(t.detokenize(&ids, false, false), "🦙");
    assert!(t.is_eog(2) && !t.is_eog(1));
    assert_eq!(t.tokenize("", true, true), [1]);
    assert!(t.tokenize("", false, true).is_empty());
}

#[test]
fn bpe_special_parsing() {
    let Some(t) = vocab("qwen2") else { return };
    let im_start = t.text_to_token("<|im_start|>").unwrap();
    let im_end = t.text_to_token("<|im_end|>").unwrap();
    let ids = t.tokenize("<|im_start|>user\nhi<|im_end|>", false, true);
    assert_eq!(ids.first(), Some(&im_start));
    assert_eq!(ids.last(), Some(&im_end));
    assert!(t.is_eog(im_end));
    assert_eq!(
        t.detokenize(&ids, false, true),
        "<|im_start|>user\nhi<|im_end|>"
    );
    assert_eq!(t.detokenize(&ids, false, false), "user\nhi");
    assert!(!t.tokenize("<|im_start|>", false, false).contains(&im_start));
}

#[test]
fn phi3_strips_space_after_special_tokens() {
    let Some(t) = vocab("phi-3") else { return };
    let end = t.text_to_token("<|end|>").unwrap();
    // RSTRIP (llama.cpp sets it for Phi-3): the newline after <|end|> is dropped.
    let a = t.tokenize("<|end|>\nHi", false, true);
    let b = t.tokenize("<|end|>Hi", false, true);
    assert_eq!(a, b);
    assert_eq!(a[0], end);
}

#[test]
fn wordpiece_adds_cls_and_sep() {
    let Some(t) = vocab("bert-bge") else { return };
    assert_eq!(
        t.tokenize("Hello world", true, false),
        [101, 7592, 2088, 102]
    );
}

#[test]
fn gemma4_end_of_generation_set() {
    let Some(t) = vocab("gemma-4") else { return };
    assert!(t.add_bos(), "llama.cpp forces add_bos for Gemma 4");
    let eos = t.eos().unwrap();
    assert!(t.is_eog(eos));
    if let Some(s) = t.text_to_token("</s>")
        && t.text_to_token("<|tool_response>").is_some()
    {
        assert!(!t.is_eog(s));
    }
}

// --- hostile vocabularies -------------------------------------------------------------------

enum Kv<'a> {
    Str(&'a str),
    U32(u32),
    StrArr(&'a [&'a str]),
    F32Arr(&'a [f32]),
    I32Arr(&'a [i32]),
    Bool(bool),
}

fn gguf(kvs: &[(&str, Kv)]) -> Vec<u8> {
    let mut b = Vec::new();
    let s = |b: &mut Vec<u8>, s: &str| {
        b.extend_from_slice(&(s.len() as u64).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
    };
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for (k, v) in kvs {
        s(&mut b, k);
        match v {
            Kv::Str(x) => {
                b.extend_from_slice(&8u32.to_le_bytes());
                s(&mut b, x);
            }
            Kv::U32(x) => {
                b.extend_from_slice(&4u32.to_le_bytes());
                b.extend_from_slice(&x.to_le_bytes());
            }
            Kv::Bool(x) => {
                b.extend_from_slice(&7u32.to_le_bytes());
                b.push(u8::from(*x));
            }
            Kv::StrArr(a) => {
                b.extend_from_slice(&9u32.to_le_bytes());
                b.extend_from_slice(&8u32.to_le_bytes());
                b.extend_from_slice(&(a.len() as u64).to_le_bytes());
                for x in *a {
                    s(&mut b, x);
                }
            }
            Kv::F32Arr(a) => {
                b.extend_from_slice(&9u32.to_le_bytes());
                b.extend_from_slice(&6u32.to_le_bytes());
                b.extend_from_slice(&(a.len() as u64).to_le_bytes());
                for x in *a {
                    b.extend_from_slice(&x.to_le_bytes());
                }
            }
            Kv::I32Arr(a) => {
                b.extend_from_slice(&9u32.to_le_bytes());
                b.extend_from_slice(&5u32.to_le_bytes());
                b.extend_from_slice(&(a.len() as u64).to_le_bytes());
                for x in *a {
                    b.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
    }
    b
}

const TOKENS: &[&str] = &["<unk>", "<s>", "</s>", "a", "b", "ab"];

fn load(kvs: &[(&str, Kv)]) -> Result<Tokenizer, TokenizerError> {
    let g = lamina_gguf::Gguf::parse(&gguf(kvs)).unwrap();
    Tokenizer::from_gguf(&g)
}

#[test]
fn minimal_spm_vocab_loads_and_tokenizes() {
    let t = load(&[
        ("tokenizer.ggml.model", Kv::Str("llama")),
        ("tokenizer.ggml.tokens", Kv::StrArr(TOKENS)),
        (
            "tokenizer.ggml.scores",
            Kv::F32Arr(&[0.0, 0.0, 0.0, -1.0, -1.0, -0.5]),
        ),
        ("tokenizer.ggml.token_type", Kv::I32Arr(&[2, 3, 3, 1, 1, 1])),
        ("tokenizer.ggml.add_space_prefix", Kv::U32(0)),
    ]);
    // add_space_prefix of the wrong type is refused too.
    assert!(matches!(t, Err(TokenizerError::Metadata(_))));
    let t = load(&[
        ("tokenizer.ggml.model", Kv::Str("llama")),
        ("tokenizer.ggml.tokens", Kv::StrArr(TOKENS)),
        (
            "tokenizer.ggml.scores",
            Kv::F32Arr(&[0.0, 0.0, 0.0, -1.0, -1.0, -0.5]),
        ),
        ("tokenizer.ggml.token_type", Kv::I32Arr(&[2, 3, 3, 1, 1, 1])),
        ("tokenizer.ggml.add_space_prefix", Kv::Bool(false)),
    ])
    .unwrap();
    assert_eq!(t.tokenize("abab", true, false), [1, 5, 5]);
    // "c" has neither a token nor a byte token: <unk> (llama.cpp would throw).
    assert_eq!(t.tokenize("c", false, false), [0]);
    assert_eq!(t.detokenize(&[1, 5, 3], true, false), "aba");
}

#[test]
fn special_id_outside_vocab_is_refused() {
    let e = load(&[
        ("tokenizer.ggml.model", Kv::Str("llama")),
        ("tokenizer.ggml.tokens", Kv::StrArr(TOKENS)),
        ("tokenizer.ggml.eos_token_id", Kv::U32(6)),
    ])
    .err()
    .unwrap();
    assert!(
        matches!(
            e,
            TokenizerError::SpecialIdOutOfRange {
                id: 6,
                n_vocab: 6,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("eos_token_id"));
}

#[test]
fn scores_and_types_of_wrong_type_or_count_are_refused() {
    let base = |k: &'static str, v: Kv<'static>| {
        load(&[
            ("tokenizer.ggml.model", Kv::Str("llama")),
            ("tokenizer.ggml.tokens", Kv::StrArr(TOKENS)),
            (k, v),
        ])
    };
    for (k, v) in [
        ("tokenizer.ggml.scores", Kv::F32Arr(&[0.0, 1.0])),
        ("tokenizer.ggml.scores", Kv::StrArr(TOKENS)),
        ("tokenizer.ggml.token_type", Kv::I32Arr(&[1, 1, 1])),
        ("tokenizer.ggml.token_type", Kv::F32Arr(&[1.0; 6])),
    ] {
        let e = base(k, v).err().unwrap();
        assert!(
            matches!(&e, TokenizerError::BadMetadata { key, .. } if key == k),
            "{k}: {e}"
        );
    }
}

#[test]
fn empty_and_missing_vocabularies_are_refused() {
    let e = load(&[
        ("tokenizer.ggml.model", Kv::Str("llama")),
        ("tokenizer.ggml.tokens", Kv::StrArr(&[])),
    ])
    .err()
    .unwrap();
    assert!(matches!(e, TokenizerError::EmptyVocabulary));
    let e = load(&[("tokenizer.ggml.model", Kv::Str("llama"))])
        .err()
        .unwrap();
    assert!(matches!(e, TokenizerError::NoVocabulary));
    let e = load(&[("general.name", Kv::Str("x"))]).err().unwrap();
    assert!(matches!(e, TokenizerError::NoVocabulary));
}

#[test]
fn unknown_pre_tokenizer_is_named() {
    let e = load(&[
        ("tokenizer.ggml.model", Kv::Str("gpt2")),
        ("tokenizer.ggml.pre", Kv::Str("martian-bpe")),
        ("tokenizer.ggml.tokens", Kv::StrArr(&["a", "b", "ab"])),
        ("tokenizer.ggml.merges", Kv::StrArr(&["a b"])),
    ])
    .err()
    .unwrap();
    assert!(matches!(&e, TokenizerError::UnknownPreTokenizer(p) if p == "martian-bpe"));
    assert!(e.to_string().contains("martian-bpe"));
    let e = load(&[
        ("tokenizer.ggml.model", Kv::Str("klingon")),
        ("tokenizer.ggml.tokens", Kv::StrArr(TOKENS)),
    ])
    .err()
    .unwrap();
    assert!(matches!(e, TokenizerError::UnknownModel(_)));
}

#[test]
fn duplicate_tokens_are_refused() {
    let e = load(&[
        ("tokenizer.ggml.model", Kv::Str("llama")),
        ("tokenizer.ggml.tokens", Kv::StrArr(&["a", "b", "a"])),
    ])
    .err()
    .unwrap();
    assert!(matches!(
        e,
        TokenizerError::DuplicateToken {
            first: 0,
            second: 2,
            ..
        }
    ));
}

#[test]
fn empty_tokens_and_merge_pieces_that_are_not_tokens() {
    // "ab" is a merge result but not a token: "abc" still merges through it, "ab" alone falls
    // back to its bytes. The empty token is renamed as llama.cpp does.
    let t = load(&[
        ("tokenizer.ggml.model", Kv::Str("gpt2")),
        ("tokenizer.ggml.pre", Kv::Str("gpt-2")),
        (
            "tokenizer.ggml.tokens",
            Kv::StrArr(&["a", "b", "c", "abc", ""]),
        ),
        ("tokenizer.ggml.merges", Kv::StrArr(&["a b", "ab c"])),
    ])
    .unwrap();
    assert_eq!(t.n_vocab(), 5);
    assert_eq!(t.tokenize("abc", false, false), [3]);
    assert_eq!(t.tokenize("ab", false, false), [0, 1]);
    assert_eq!(t.tokenize("cab", false, false), [2, 0, 1]);
    assert_eq!(t.token_text(4), Some("[EMPTY_4]"));
    assert_eq!(t.text_to_token("[EMPTY_4]"), Some(4));
    assert_eq!(t.text_to_token("ab"), None);
    assert_eq!(t.text_to_token(""), None);
    assert_eq!(t.token_text(5), None);
    assert_eq!(t.token_to_piece(3, true), b"abc");
}

#[test]
fn token_longer_than_the_file_is_refused() {
    // A token whose length prefix claims far more bytes than the file holds.
    let mut bytes = gguf(&[
        ("tokenizer.ggml.model", Kv::Str("llama")),
        ("tokenizer.ggml.tokens", Kv::StrArr(&["a", "b"])),
    ]);
    let at = bytes.len() - 1 - 8 - 1 - 8; // length prefix of the first token
    bytes[at..at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    let path = std::env::temp_dir().join(format!("lamina-tok-hostile-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let e = Tokenizer::from_file(&path).err().unwrap();
    std::fs::remove_file(&path).ok();
    assert!(matches!(e, TokenizerError::Gguf(_)), "{e}");
}

#[test]
fn chat_template_from_vocab_strips_the_bos_the_tokenizer_adds() {
    use lamina_tokenizer::{ChatMessage, ChatTemplate};
    let Some(t) = vocab("phi-3") else { return };
    let src = t.chat_template().unwrap();
    assert!(src.starts_with("{{ bos_token }}"));
    let msgs = [ChatMessage::new("user", "Hi")];
    let raw = ChatTemplate::new(src, "<s>", "<|endoftext|>")
        .unwrap()
        .render(&msgs, None, true)
        .unwrap();
    assert!(raw.starts_with("<s>"));
    // As llama.cpp's common_chat_templates_apply: tokenizing with add_special adds BOS itself.
    let out = ChatTemplate::from_tokenizer(&t)
        .unwrap()
        .render(&msgs, None, true)
        .unwrap();
    assert_eq!(out, raw["<s>".len()..]);
    assert_eq!(
        t.tokenize(&out, true, true)
            .iter()
            .filter(|&&id| id == 1)
            .count(),
        1
    );
}
