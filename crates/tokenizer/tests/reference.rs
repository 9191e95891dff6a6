//! llama.cpp's own tokenizations of the two test models (`../shared/reference/outputs.json`,
//! "tokenize" entries): plain (no BOS, no special parsing) and with BOS + special parsing.
//! Also checks what llama.cpp reports for their special tokens and end-of-generation sets.

use std::path::PathBuf;

use lamina_tokenizer::Tokenizer;

/// `$LAMINA_TEST_MODEL_DIR/<name>.gguf`, else the model cache; None (with a message) if absent.
fn model_path(name: &str) -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("LAMINA_TEST_MODEL_DIR") {
        let p = PathBuf::from(dir).join(format!("{name}.gguf"));
        if p.is_file() {
            return Some(p);
        }
    }
    if let Some(p) = lamina_gguf::pull::cached_model_path(name) {
        return Some(p);
    }
    eprintln!(
        "skipping: model {name} not found (set LAMINA_TEST_MODEL_DIR or run `lamina pull {name}`)"
    );
    None
}

fn reference() -> Option<serde_json::Value> {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/reference/outputs.json"
    ));
    match std::fs::read_to_string(&p) {
        Ok(s) => Some(serde_json::from_str(&s).unwrap()),
        Err(_) => {
            eprintln!("skipping: {} is absent", p.display());
            None
        }
    }
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn check(name: &str) -> Option<Tokenizer> {
    let reference = reference()?;
    let path = model_path(name)?;
    let tok = Tokenizer::from_file(&path).unwrap();
    let cases = reference["models"][name]["tokenize"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            tok.tokenize(text, false, false),
            ids(&case["ids_plain"]),
            "{name} plain: {text:?}"
        );
        assert_eq!(
            tok.tokenize(text, true, true),
            ids(&case["ids_with_bos_special"]),
            "{name} special: {text:?}"
        );
    }
    // Prompts are tokenized with add_special and parse_special too.
    for p in reference["models"][name]["prompts"].as_array().unwrap() {
        let text = p["prompt"].as_str().unwrap();
        assert_eq!(
            tok.tokenize(text, true, true),
            ids(&p["tokens"]),
            "{name} prompt: {text:?}"
        );
    }
    Some(tok)
}

#[test]
fn smollm2_matches_llama_cpp() {
    let Some(tok) = check("smollm2-135m") else {
        return;
    };
    assert_eq!(tok.pre_tokenizer(), "smollm");
    assert_eq!(
        (tok.bos(), tok.eos(), tok.add_bos()),
        (Some(1), Some(2), false)
    );
    // <|endoftext|>, <|im_end|>, and <reponame> (llama.cpp's FIM-repo auto-detection).
    assert_eq!(tok.eog_ids().collect::<Vec<_>>(), [0, 2, 4]);
    assert!(tok.chat_template().is_some());
}

#[test]
fn gemma3_matches_llama_cpp() {
    let Some(tok) = check("gemma3-270m") else {
        return;
    };
    assert_eq!(
        (tok.bos(), tok.eos(), tok.add_bos()),
        (Some(2), Some(1), true)
    );
    assert!(tok.is_eog(1) && tok.is_eog(tok.text_to_token("<end_of_turn>").unwrap()));
    assert_eq!(tok.n_vocab(), 262144);
}

#[test]
fn models_chat_templates() {
    use lamina_tokenizer::{CHATML_TEMPLATE, ChatMessage, ChatTemplate};
    let msgs = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
    ];
    if let Some(path) = model_path("smollm2-135m") {
        let tok = Tokenizer::from_file(&path).unwrap();
        let out = ChatTemplate::from_tokenizer(&tok)
            .unwrap()
            .render(&msgs, None, true)
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }
    // Gemma 3's GGUF has no template: llama.cpp falls back to ChatML.
    if let Some(path) = model_path("gemma3-270m") {
        let tok = Tokenizer::from_file(&path).unwrap();
        assert!(tok.chat_template().is_none());
        let t = ChatTemplate::from_tokenizer(&tok).unwrap();
        let chatml = ChatTemplate::new(CHATML_TEMPLATE, "<bos>", "<eos>").unwrap();
        assert_eq!(
            t.render(&msgs, None, true).unwrap(),
            chatml.render(&msgs, None, true).unwrap()
        );
    }
}
