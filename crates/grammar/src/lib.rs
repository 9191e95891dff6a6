//! Constrained decoding. It owns llama.cpp's GBNF grammar language ([`gbnf`]: the
//! parser, with line/column errors), the pushdown matcher that llama.cpp's grammar
//! sampler runs ([`matcher`]: stacks of grammar positions advanced one code point at a
//! time, partial UTF-8 included), a token-mask engine that walks a trie of the
//! vocabulary once per step and caches what it learns ([`mask`]), and the conversion of
//! JSON Schema into GBNF exactly as llama.cpp's `json-schema-to-grammar` writes it
//! ([`json_schema`]). Accepting the same language as llama.cpp and masking exactly the
//! tokens it masks is what makes greedy output under a grammar equal llama.cpp's.

pub mod gbnf;
pub mod json_schema;
mod matcher;
mod utf8;
mod vocab;

pub use gbnf::{Element, Grammar, GrammarError};
pub use matcher::{MAX_STACKS, MAX_TOTAL_WORK, MAX_WORK, MatchError, Matcher};
pub use utf8::Partial;
pub use vocab::TokenIndex;
