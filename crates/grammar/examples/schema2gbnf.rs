//! Prints the GBNF grammar for a JSON schema given as the first argument (or on stdin).
use std::io::Read;

fn main() {
    let text = match std::env::args().nth(1) {
        Some(t) => t,
        None => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).expect("stdin");
            s
        }
    };
    let schema: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("not JSON: {e}");
            std::process::exit(2);
        }
    };
    let opts = lamina_grammar::json_schema::SchemaOptions::default();
    match lamina_grammar::json_schema::json_schema_to_grammar(&schema, &opts) {
        Ok(g) => print!("{g}"),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
