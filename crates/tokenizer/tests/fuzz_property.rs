//! A fuzz-style property test for CI (the real fuzzer is `fuzz/`, target `tokenize`): text
//! made of random bytes, Unicode, the vocabularies' own test inputs and special-token texts,
//! mutated with a fixed seed, through every shared vocabulary with and without special
//! tokens. Tokenizing never panics and gives ids inside the vocabulary; detokenizing them never
//! panics; and byte-level BPE vocabularies' pieces give the text back exactly.

use lamina_tokenizer::Tokenizer;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const PIECES: &[&str] = &[
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "\r\n",
    "a",
    "Hello",
    " world",
    "é",
    "ñ",
    "€",
    "𝄞",
    "🦙",
    "中文",
    "日本語",
    "한국어",
    "ا",
    "\u{200b}",
    "\u{feff}",
    "'s",
    "'ll",
    "123",
    "4567",
    "-",
    "...",
    "<s>",
    "</s>",
    "<|endoftext|>",
    "<|im_start|>",
    "<unk>",
    "[CLS]",
    "\u{0}",
    "\u{7f}",
    "\u{fffd}",
];

fn random_text(rng: &mut Rng, inputs: &[String]) -> String {
    let mut s = String::new();
    if !inputs.is_empty() && rng.below(3) == 0 {
        s.push_str(&inputs[rng.below(inputs.len())]);
    }
    for _ in 0..rng.below(12) {
        match rng.below(4) {
            0 => s.push_str(PIECES[rng.below(PIECES.len())]),
            1 => {
                if let Some(c) = char::from_u32(rng.next() as u32 % 0x11_0000) {
                    s.push(c);
                }
            }
            2 => s.push((b' ' + rng.below(95) as u8) as char),
            _ => {
                // Cut or duplicate what is there, at a character boundary.
                let n = s.chars().count();
                if n > 0 {
                    let at = rng.below(n);
                    let cut: String = s.chars().take(at).collect();
                    s = if rng.below(2) == 0 {
                        cut
                    } else {
                        format!("{cut}{s}")
                    };
                }
            }
        }
    }
    s
}

/// The `.inp` test vectors of a vocabulary (llama.cpp's test-tokenizer format).
fn inputs(path: &std::path::Path) -> Vec<String> {
    let inp = path.with_extension("gguf.inp");
    let Ok(text) = std::fs::read_to_string(inp) else {
        return Vec::new();
    };
    text.split("\n__ggml_vocab_test__\n")
        .map(str::to_string)
        .collect()
}

#[test]
fn tokenizing_random_text_never_panics_and_bpe_round_trips() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vocab");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!("skipping: {} is absent", dir.display());
        return;
    };
    let mut files: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    let mut checked = 0;
    for path in files {
        let bytes = std::fs::read(&path).unwrap();
        let gguf = lamina_gguf::Gguf::parse(&bytes).unwrap();
        let Ok(tok) = Tokenizer::from_gguf(&gguf) else {
            continue;
        };
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        // Byte-level BPE loses nothing (GPT-2's byte mapping), so it must give the text back.
        let lossless = ["gpt-2", "llama-bpe", "qwen2", "deepseek-llm"]
            .iter()
            .any(|n| name.contains(n));
        let inputs = inputs(&path);
        let n_vocab = tok.n_vocab();
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ name.len() as u64);
        for _ in 0..300 {
            let text = random_text(&mut rng, &inputs);
            for (add_special, parse_special) in [(false, false), (true, true)] {
                let ids = tok.tokenize(&text, add_special, parse_special);
                assert!(
                    ids.iter().all(|&t| (t as usize) < n_vocab),
                    "{name}: id outside the vocabulary for {text:?}"
                );
                let _ = tok.detokenize(&ids, add_special, parse_special);
                if lossless && !add_special && !parse_special {
                    // The pieces themselves (detokenize also applies the vocabulary's space
                    // clean-up, which is lossy by design).
                    let raw: Vec<u8> = ids
                        .iter()
                        .flat_map(|&t| tok.token_to_piece(t, false))
                        .collect();
                    assert_eq!(
                        String::from_utf8_lossy(&raw),
                        text,
                        "{name}: no round trip for {text:?}"
                    );
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 0);
}

/// Chat templates are programs from model files: random mutations of every shared template
/// (bytes flipped, cut, spliced, Jinja fragments inserted) compile or fail with a typed error,
/// and those that compile render or fail with one, within the sandbox's limits. Never a panic.
#[test]
fn mutated_chat_templates_never_panic() {
    use lamina_tokenizer::{ChatMessage, ChatTemplate, TemplateLimits};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/templates");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!("skipping: {} is absent", dir.display());
        return;
    };
    let mut sources: Vec<String> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .collect();
    sources.sort();
    assert!(!sources.is_empty());
    const FRAGMENTS: &[&str] = &[
        "{{",
        "}}",
        "{%",
        "%}",
        "{% for x in messages %}",
        "{% endfor %}",
        "{% if %}",
        "{% endif %}",
        "{{ raise_exception('x') }}",
        "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",
        "{% for i in range(1000000000) %}x{% endfor %}",
        "{{ messages[99] }}",
        "{{ 1/0 }}",
        "{{ 'a' * 100000000 }}",
        "{{ tools | tojson }}",
        "{% set x = namespace(a=1) %}",
        "\u{0}",
        "{{ messages[0]['content'][::-1] }}",
        "{{ x.y.z }}",
        "{#",
        "#}",
    ];
    let messages = vec![
        ChatMessage::new("system", "S"),
        ChatMessage::new("user", "Hello {{ not a template }}"),
        ChatMessage::new("assistant", "Hi"),
    ];
    let limits = TemplateLimits {
        max_output: 1 << 20,
        fuel: 2_000_000,
        max_recursion: 50,
    };
    let mut rng = Rng(0x51_7cc1_b727_220a);
    let (mut compiled, mut rendered) = (0, 0);
    for round in 0..600 {
        let mut s: Vec<char> = sources[round % sources.len()].chars().collect();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(s.len() + 1);
            match rng.below(4) {
                0 if !s.is_empty() => {
                    let end = (at + 1 + rng.below(40)).min(s.len());
                    s.drain(at.min(end)..end);
                }
                1 => {
                    let f: Vec<char> = FRAGMENTS[rng.below(FRAGMENTS.len())].chars().collect();
                    s.splice(at..at, f);
                }
                2 if at < s.len() => s[at] = char::from(b' ' + rng.below(95) as u8),
                _ => s.truncate(at),
            }
        }
        let source: String = s.into_iter().collect();
        let Ok(t) = ChatTemplate::with_limits(&source, "<s>", "</s>", limits) else {
            continue;
        };
        compiled += 1;
        if t.render(&messages, None, true).is_ok() {
            rendered += 1;
        }
    }
    // The mutations are small: many templates still work.
    assert!(
        compiled > 50 && rendered > 10,
        "{compiled} compiled, {rendered} rendered"
    );
}
