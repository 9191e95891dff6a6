//! Hostile and random input never panics: random GBNF-like text through the parser and,
//! when it parses, through the matcher; random JSON schemas through the converter,
//! whose output must always be valid GBNF (or a grammar that can never end, for
//! unsatisfiable schemas). Deterministic (a fixed xorshift seed).

use std::sync::Arc;

use lamina_grammar::json_schema::{SchemaOptions, json_schema_to_grammar};
use lamina_grammar::{Grammar, GrammarError, MatchError, Matcher, TokenIndex};
use serde_json::{Value, json};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

fn vocab() -> Arc<TokenIndex> {
    let mut pieces: Vec<Vec<u8>> = (0x20u8..0x7f).map(|c| vec![c]).collect();
    for s in ["ab", "\n", "é", "€", "{\"", "\":", "12", "true"] {
        pieces.push(s.as_bytes().to_vec());
    }
    pieces.push(vec![0xe2]);
    pieces.push(vec![0x82, 0xac]);
    pieces.push(b"</s>".to_vec());
    let eos = pieces.len() as u32 - 1;
    Arc::new(TokenIndex::new(pieces, move |t| t == eos))
}

#[test]
fn random_gbnf_never_panics() {
    let atoms: [&str; 45] = [
        "root",
        " ::= ",
        "::=",
        "a",
        "b-c",
        "x",
        "\"",
        "\"a\"",
        "\"\\n\"",
        "\"\\x41\"",
        "\"\\u00e9\"",
        "\"\\U0001F600\"",
        "\"\\q\"",
        "[",
        "]",
        "[a-z]",
        "[^\"\\\\]",
        "[\\]-]",
        "(",
        ")",
        "|",
        "*",
        "+",
        "?",
        "{",
        "}",
        "{2}",
        "{1,3}",
        "{,}",
        "{3,1}",
        "{2001}",
        ".",
        "<[1]>",
        "!<[2]>",
        "<[99999999999]>",
        "<x>",
        "#c\n",
        "\n",
        "\r\n",
        " ",
        "\t",
        "é",
        "\u{0}",
        "0",
        "9",
    ];
    let vocab = vocab();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (mut parsed, mut masks) = (0, 0);
    for _ in 0..20_000 {
        let n = 1 + rng.below(24);
        let mut src = String::from(if rng.below(4) == 0 { "" } else { "root ::= " });
        for _ in 0..n {
            src.push_str(rng.pick::<&str>(&atoms));
        }
        let Ok(g) = Grammar::parse(&src, "root", None) else {
            continue;
        };
        parsed += 1;
        let mut m = Matcher::new(&g, Arc::clone(&vocab));
        let mut mask = vec![0u64; vocab.n_vocab().div_ceil(64)];
        for _ in 0..6 {
            match m.fill_mask(&mut mask) {
                Ok(()) => {}
                // Bounded: a grammar too ambiguous to follow is refused, not run.
                Err(MatchError::TooManyStacks(_) | MatchError::TooMuchWork(_)) => break,
                Err(e) => panic!("{src:?}: {e}"),
            }
            masks += 1;
            let allowed: Vec<u32> = (0..vocab.n_vocab() as u32)
                .filter(|&t| mask[t as usize / 64] >> (t % 64) & 1 == 1)
                .collect();
            if allowed.is_empty() {
                break;
            }
            let t = *rng.pick(&allowed);
            assert!(m.is_allowed(t), "{src:?}: mask and check disagree on {t}");
            m.accept(t).unwrap();
        }
    }
    assert!(
        parsed > 500 && masks > 3000,
        "{parsed} parsed, {masks} masks"
    );
}

fn random_schema(rng: &mut Rng, depth: usize) -> Value {
    let leaf = [
        json!({"type": "string"}),
        json!({"type": "integer", "minimum": -3, "maximum": 1000}),
        json!({"type": "integer", "minimum": 9, "maximum": 2}),
        json!({"type": "number"}),
        json!({"type": "boolean"}),
        json!({"type": "null"}),
        json!({"enum": ["a", 1, null, 2.5, {"k": [1]}]}),
        json!({"const": "x\"y\\z"}),
        json!({"type": "string", "pattern": "^[a-c]{2,4}(x|y)?$"}),
        json!({"type": "string", "pattern": "^(((("}),
        json!({"type": "string", "format": "date-time"}),
        json!({"type": "string", "minLength": 3, "maxLength": 1}),
        json!({"$ref": "#/$defs/nope"}),
        json!({"type": ["string", "integer"]}),
        json!({}),
        json!(true),
        json!(7),
    ];
    if depth == 0 || rng.below(3) == 0 {
        return rng.pick(&leaf).clone();
    }
    let child = |rng: &mut Rng| random_schema(rng, depth - 1);
    match rng.below(6) {
        0 => {
            json!({"type": "array", "items": child(rng), "minItems": rng.below(3), "maxItems": rng.below(5)})
        }
        1 => json!({"type": "object", "properties": {"a": child(rng), "b-c": child(rng)},
                    "required": if rng.below(2) == 0 { json!(["a"]) } else { json!(["z"]) },
                    "additionalProperties": if rng.below(2) == 0 { json!(false) } else { child(rng) }}),
        2 => json!({"anyOf": [child(rng), child(rng)]}),
        3 => json!({"allOf": [child(rng), child(rng)]}),
        4 => json!({"$defs": {"d": child(rng)}, "$ref": "#/$defs/d"}),
        _ => json!({"type": "array", "prefixItems": [child(rng), child(rng)]}),
    }
}

#[test]
fn random_schemas_give_valid_grammars() {
    let opts = SchemaOptions::default();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut converted = 0;
    for _ in 0..4_000 {
        let schema = random_schema(&mut rng, 4);
        let Ok(gbnf) = json_schema_to_grammar(&schema, &opts) else {
            continue;
        };
        converted += 1;
        match Grammar::parse(&gbnf, "root", None) {
            // A schema that refers to itself without progress (`d` is `d`) cannot be run.
            Ok(_) | Err(GrammarError::NeverEnds(_) | GrammarError::LeftRecursion(_)) => {}
            // `minLength` above `maxLength` gives `{3,1}`: refused, as unsatisfiable.
            Err(GrammarError::Syntax { message, .. }) if message.contains("max < min") => {}
            Err(e) => panic!("{schema} gave an invalid grammar ({e}):\n{gbnf}"),
        }
    }
    assert!(converted > 1000, "{converted}");
    // A self-referential schema terminates with an answer.
    let recursive = json!({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}},
                           "$ref": "#/$defs/n"});
    let _ = json_schema_to_grammar(&recursive, &opts);
}
