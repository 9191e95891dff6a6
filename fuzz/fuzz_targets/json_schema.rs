//! Fuzzes the JSON-schema converter on arbitrary JSON: converting never panics, stays inside
//! its limits, and what it produces is GBNF that parses.

#![no_main]

use lamina_grammar::Grammar;
use lamina_grammar::json_schema::{SchemaOptions, json_schema_to_grammar};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(schema) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let opts = SchemaOptions::default();
    if let Ok(gbnf) = json_schema_to_grammar(&schema, &opts) {
        assert!(gbnf.len() <= opts.max_grammar_bytes + 4096);
        Grammar::parse(&gbnf, "root", None).expect("the converter's grammar parses");
    }
});
