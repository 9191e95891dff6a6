//! llama.cpp's own grammar test vectors, run against lamina-grammar.
//!
//! The data files under `tests/data/` are written by
//! `scripts/grammar/extract_grammar_cases.py` from llama.cpp's
//! `tests/test-grammar-integration.cpp` and `tests/test-grammar-parser.cpp`:
//!
//! * `grammar_integration_cases.json`: every `test_grammar` call (a grammar, strings it
//!   must match and strings it must not), and the build-failure tests (a grammar and a
//!   root that must or must not build).
//! * `schema_integration_cases.json`: every `test_schema` call (the same, from a JSON
//!   Schema converted to GBNF first).
//! * `grammar_parser_cases.json`: every `verify_parsing` (the symbol ids and rule
//!   elements a grammar parses to) and `verify_failure` (a grammar that must not parse).
//!
//! A string is matched as `match_string` in test-grammar-integration does it: each
//! text code point is fed as token 0 with that code point as its piece, each spliced
//! `token(id)` as token `id` with piece `<[id]>`, and the string matches when no step
//! empties the stacks and some stack is empty at the end. That is run three ways, all
//! of which must give llama.cpp's answer: the fast [`Matcher`] fed tokens, the fast
//! matcher fed the text with `accept_str` (text-only strings of token-free grammars,
//! where the two are the same), and the slow literal port of llama.cpp's engine in
//! `tests/common`.
//!
//! llama.cpp reports an undefined rule with a different message than Lamina does;
//! build and parse failures are compared as success or failure only.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::Reference;
use lamina_grammar::json_schema::{SchemaOptions, json_schema_to_grammar};
use lamina_grammar::{Element, Grammar, Matcher, TokenIndex};
use serde_json::Value;

const INTEGRATION: &str = include_str!("data/grammar_integration_cases.json");
const SCHEMA: &str = include_str!("data/schema_integration_cases.json");
const PARSER: &str = include_str!("data/grammar_parser_cases.json");

/// Where one way of matching knowingly gives a different answer than llama.cpp's test
/// expects: (case name, the string as JSON, the way, why). A listed entry that starts
/// agreeing again fails the test, so the list stays current.
const KNOWN_FAILURES: &[(&str, &str, &str, &str)] = &[];

/// One piece of a test string: text, or a special token spliced in with `token(id)`.
#[derive(Clone, Debug)]
enum Part {
    Text(String),
    Token(u32),
}

fn parts_of(v: &Value) -> Vec<Part> {
    match v {
        Value::String(s) => vec![Part::Text(s.clone())],
        Value::Array(items) => items
            .iter()
            .map(|p| match p {
                Value::String(s) => Part::Text(s.clone()),
                Value::Number(n) => Part::Token(n.as_u64().expect("token id") as u32),
                other => panic!("bad part of a test string: {other}"),
            })
            .collect(),
        other => panic!("bad test string: {other}"),
    }
}

/// The text of a string with no spliced tokens.
fn plain_text(parts: &[Part]) -> Option<String> {
    let mut out = String::new();
    for p in parts {
        match p {
            Part::Text(s) => out.push_str(s),
            Part::Token(_) => return None,
        }
    }
    Some(out)
}

/// `parse_tokens` of test-grammar-integration: (token id, piece) per step.
fn llama_tokens(parts: &[Part]) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for p in parts {
        match p {
            Part::Text(s) => out.extend(s.chars().map(|c| (0, c.to_string()))),
            Part::Token(id) => out.push((*id, format!("<[{id}]>"))),
        }
    }
    out
}

fn token_refs(g: &Grammar) -> Vec<u32> {
    g.rules
        .iter()
        .flatten()
        .filter_map(|e| match *e {
            Element::Token(t) | Element::TokenNot(t) => Some(t),
            _ => None,
        })
        .collect()
}

/// `match_string` on the fast matcher, fed tokens. llama.cpp feeds text code points
/// as token 0; a vocabulary entry's piece is fixed, so each distinct code point gets
/// its own id above every id the grammar or the string names, which compares with
/// every `<[id]>` / `!<[id]>` of the grammar exactly as 0 does (the grammar names no
/// token 0; asserted).
fn fast_match_tokens(g: &Grammar, parts: &[Part]) -> bool {
    let refs = token_refs(g);
    assert!(!refs.contains(&0), "the grammar names token 0");
    let steps = llama_tokens(parts);
    let max_id = refs
        .iter()
        .copied()
        .chain(parts.iter().filter_map(|p| match p {
            Part::Token(id) => Some(*id),
            Part::Text(_) => None,
        }))
        .max()
        .unwrap_or(0);
    let mut pieces: Vec<Vec<u8>> = (0..=max_id)
        .map(|id| format!("<[{id}]>").into_bytes())
        .collect();
    let mut text_ids: BTreeMap<String, u32> = BTreeMap::new();
    let ids: Vec<u32> = steps
        .iter()
        .map(|(id, piece)| {
            if *id != 0 {
                return *id;
            }
            *text_ids.entry(piece.clone()).or_insert_with(|| {
                pieces.push(piece.as_bytes().to_vec());
                pieces.len() as u32 - 1
            })
        })
        .collect();
    let mut m = Matcher::new(g, Arc::new(TokenIndex::new(pieces, |_| false)));
    for id in ids {
        if m.accept(id).is_err() {
            return false;
        }
    }
    m.is_accepting()
}

/// `match_string` on the fast matcher, fed the text in one `accept_str`.
fn fast_match_str(g: &Grammar, text: &str) -> bool {
    let mut m = Matcher::new(g, Arc::new(TokenIndex::new(vec![b"x".to_vec()], |_| false)));
    m.accept_str(text).is_ok() && m.is_accepting()
}

/// `match_string` on the literal port of llama.cpp's engine.
fn reference_match(g: &Grammar, parts: &[Part]) -> bool {
    let mut r = Reference::new(g);
    for (id, piece) in llama_tokens(parts) {
        if !r.accept(id, piece.as_bytes()) {
            return false;
        }
    }
    r.stacks.iter().any(|s| s.is_empty())
}

/// Runs every passing and failing string of one case; pushes a line per disagreement.
fn check_strings(name: &str, g: &Grammar, case: &Value, problems: &mut Vec<String>) -> usize {
    let has_tokens = !token_refs(g).is_empty();
    let mut n = 0;
    for (key, want) in [("passing", true), ("failing", false)] {
        for s in case[key].as_array().expect(key) {
            n += 1;
            let parts = parts_of(s);
            let mut got = vec![
                ("matcher (tokens)", fast_match_tokens(g, &parts)),
                ("reference", reference_match(g, &parts)),
            ];
            if let Some(text) = plain_text(&parts) {
                if !has_tokens {
                    got.push(("matcher (accept_str)", fast_match_str(g, &text)));
                }
                got.push(("reference (matches_str)", Reference::matches_str(g, &text)));
            }
            let shown = s.to_string();
            for (how, m) in got {
                let known = KNOWN_FAILURES.iter().find(|(case_name, text, way, _)| {
                    *case_name == name && *text == shown && *way == how
                });
                match (m == want, known) {
                    (true, None) | (false, Some(_)) => {}
                    (true, Some((_, _, _, why))) => problems.push(format!(
                        "{name:?}: {shown} by {how} is listed as a known failure ({why}) \
                         but now agrees with llama.cpp; remove it from KNOWN_FAILURES"
                    )),
                    (false, None) => problems.push(format!(
                        "{name:?}: {shown} should {}match, but {how} says it does{}",
                        if want { "" } else { "not " },
                        if want { " not" } else { "" },
                    )),
                }
            }
        }
    }
    n
}

fn report(problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{} disagreement(s) with llama.cpp:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The name of the first rule defined in `src`.
fn first_rule_name(src: &str) -> &str {
    let head = &src[..src.find("::=").expect("a rule")];
    head.split_whitespace().last().expect("a rule name")
}

#[test]
fn integration_grammars() {
    let cases: Vec<Value> = serde_json::from_str(INTEGRATION).unwrap();
    let mut problems = Vec::new();
    let (mut n_cases, mut n_strings, mut n_builds) = (0, 0, 0);
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let src = case["grammar"].as_str().unwrap();
        let root = case.get("root").and_then(Value::as_str).unwrap_or("root");
        let parsed = Grammar::parse(src, root, None);
        if let Some(build) = case.get("build") {
            n_builds += 1;
            match (build.as_str().unwrap(), &parsed) {
                ("ok", Ok(_)) | ("error", Err(_)) => {}
                ("ok", Err(e)) => problems.push(format!("{name:?}: should build, got {e}")),
                ("error", Ok(_)) => problems.push(format!("{name:?}: should not build")),
                (other, _) => panic!("bad build expectation {other}"),
            }
            // test_failure_missing_root checks the parser's output itself: the rules
            // parse, but there is no "root". Lamina's parse wants a root, so give it
            // the first rule.
            if case.get("rules_nonempty").is_some() || case.get("absent_symbols").is_some() {
                let first = first_rule_name(src);
                match Grammar::parse(src, first, None) {
                    Ok(g) => {
                        if case.get("rules_nonempty").is_some() && g.rules.is_empty() {
                            problems.push(format!("{name:?}: no rules"));
                        }
                        for sym in case["absent_symbols"].as_array().into_iter().flatten() {
                            let sym = sym.as_str().unwrap();
                            if g.symbol_ids.contains_key(sym) {
                                problems.push(format!("{name:?}: has symbol {sym:?}"));
                            }
                        }
                    }
                    Err(e) => problems.push(format!("{name:?}: with root {first:?}: {e}")),
                }
            }
            continue;
        }
        n_cases += 1;
        let g = match parsed {
            Ok(g) => g,
            Err(e) => {
                problems.push(format!("{name:?}: grammar does not parse: {e}"));
                continue;
            }
        };
        n_strings += check_strings(name, &g, case, &mut problems);
    }
    report(&problems);
    assert_eq!((n_cases, n_builds), (14, 9), "cases in the data file");
    assert_eq!(n_strings, 139, "strings in the data file");
}

#[test]
fn integration_schemas() {
    let cases: Vec<Value> = serde_json::from_str(SCHEMA).unwrap();
    let mut problems = Vec::new();
    let mut n_strings = 0;
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let schema: Value = serde_json::from_str(case["schema"].as_str().unwrap()).unwrap();
        let gbnf = match json_schema_to_grammar(&schema, &SchemaOptions::default()) {
            Ok(s) => s,
            Err(e) => {
                problems.push(format!("{name:?}: schema does not convert: {e:?}"));
                continue;
            }
        };
        let g = match Grammar::parse(&gbnf, "root", None) {
            Ok(g) => g,
            Err(e) => {
                problems.push(format!("{name:?}: grammar does not parse: {e}\n{gbnf}"));
                continue;
            }
        };
        n_strings += check_strings(name, &g, case, &mut problems);
    }
    report(&problems);
    assert_eq!(
        (cases.len(), n_strings),
        (33, 248),
        "cases in the data file"
    );
}

fn element(v: &Value) -> Element {
    let typ = v[0].as_str().unwrap();
    let x = v[1].as_u64().unwrap() as u32;
    match typ {
        "END" => Element::End,
        "ALT" => Element::Alt,
        "RULE_REF" => Element::RuleRef(x),
        "CHAR" => Element::Char(x),
        "CHAR_NOT" => Element::CharNot(x),
        "CHAR_RNG_UPPER" => Element::CharRngUpper(x),
        "CHAR_ALT" => Element::CharAlt(x),
        "CHAR_ANY" => Element::CharAny,
        "TOKEN" => Element::Token(x),
        "TOKEN_NOT" => Element::TokenNot(x),
        other => panic!("unknown element type {other}"),
    }
}

#[test]
fn parser_symbol_ids_and_rules() {
    let data: Value = serde_json::from_str(PARSER).unwrap();
    let cases = data["parse"].as_array().unwrap();
    let mut problems = Vec::new();
    for case in cases {
        let src = case["grammar"].as_str().unwrap();
        let want_ids: BTreeMap<String, u32> = case["symbol_ids"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap() as u32))
            .collect();
        let want_rules: Vec<Vec<Element>> = case["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_array().unwrap().iter().map(element).collect())
            .collect();
        match Grammar::parse(src, "root", None) {
            Ok(g) => {
                if g.symbol_ids != want_ids {
                    problems.push(format!(
                        "{src:?}: symbol ids {:?}, want {want_ids:?}",
                        g.symbol_ids
                    ));
                }
                if g.rules != want_rules {
                    problems.push(format!("{src:?}: rules {:?}, want {want_rules:?}", g.rules));
                }
            }
            Err(e) => problems.push(format!("{src:?}: does not parse: {e}")),
        }
    }
    report(&problems);
    assert_eq!(cases.len(), 17, "cases in the data file");
}

#[test]
fn parser_failures() {
    let data: Value = serde_json::from_str(PARSER).unwrap();
    let cases = data["failure"].as_array().unwrap();
    let mut problems = Vec::new();
    for case in cases {
        let src = case.as_str().unwrap();
        if let Ok(g) = Grammar::parse(src, "root", None) {
            problems.push(format!("{src:?}: should not parse, got\n{g}"));
        }
    }
    report(&problems);
    assert_eq!(cases.len(), 6, "cases in the data file");
}
