//! JSON Schema to GBNF, ported from llama.cpp's `common/json-schema.cpp` (the schema
//! model) and `common/json-schema-to-grammar.cpp` (the converter).
//!
//! It owns two stages, as llama.cpp splits them: [`SchemaDocument::parse`] turns a JSON
//! schema into a small typed tree (the subset llama.cpp understands, `$ref`s resolved
//! inside the document), and the converter walks that tree into GBNF rules, emitted
//! sorted by name exactly as llama.cpp's `std::map` prints them. The output is meant to
//! be byte-identical to llama.cpp's (`json_schema_to_grammar(schema, force_gbnf=true)`),
//! so that constrained decoding accepts the same language; the `%llguidance` path is not
//! ported.
//!
//! Unlike llama.cpp, hostile input cannot exhaust the stack or memory: nesting depth,
//! the number of schema nodes and rules, the repetition counts that the GBNF parser
//! would later expand (`minItems`, `{m,n}`, ...) and the grammar's size are bounded by
//! [`SchemaOptions`], and exceeding any of them is a [`SchemaError`]. Things llama.cpp
//! only warns about (an unsupported `pattern`) stay warnings, returned in
//! [`Conversion::warnings`].
//!
//! Where the output differs from llama.cpp's, llama.cpp misbehaves:
//! - it loops forever (stack overflow) on an `allOf` through a `$ref` cycle: here
//!   [`SchemaError::TooDeep`];
//! - it splits a multi-byte character before a `pattern` quantifier (`^é?$`) into
//!   invalid UTF-8: here the character is kept whole (`"é"?`);
//! - it truncates counts outside a C `int` (`maxLength: 2^32+1` is 1) and wraps
//!   integer bounds outside `i64`: here counts are errors and bounds saturate.
//!
//! `const`/`enum` numbers are printed as nlohmann's `dump()` does (its Grisu2 digits,
//! which are not always the shortest). They come out byte-identical only if the
//! `Value` holds the same `f64` that llama.cpp's parser reads; serde_json guarantees
//! that only with its `float_roundtrip` feature.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;

use serde_json::Value;

/// Limits and the one behavioural option of the conversion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaOptions {
    /// llama.cpp's `dotall`: a `.` in a `pattern` also matches `\n` and `\r`.
    /// (llama.cpp's `json_schema_to_grammar` always uses `false`, the default.)
    pub dotall: bool,
    /// Deepest nesting of schema objects visited, `$ref` hops included (also bounds
    /// the nesting of `const`/`enum` values).
    pub max_depth: usize,
    /// Most rules the grammar may have.
    pub max_rules: usize,
    /// Largest `minItems`/`maxItems`/`minLength`/`maxLength` and `pattern` `{m,n}`
    /// count: the GBNF parser expands `x{m,n}` into about `n` rules.
    pub max_repetition: usize,
    /// Most schema nodes the parsed document may have (a `"type"` array copies the
    /// schema once per type, which nests exponentially).
    pub max_nodes: usize,
    /// Most bytes of grammar text (rule names plus bodies).
    pub max_grammar_bytes: usize,
}

impl Default for SchemaOptions {
    fn default() -> Self {
        Self {
            dotall: false,
            max_depth: 64,
            max_rules: 10_000,
            max_repetition: 10_000,
            max_nodes: 100_000,
            max_grammar_bytes: 32 << 20,
        }
    }
}

/// Why a schema could not be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// The schema falls outside the supported subset (llama.cpp's
    /// `common_chat_schema_from_json` error).
    #[error("JSON schema conversion failed:\nJSON schema error at {path}: {message}")]
    Invalid { path: String, message: String },
    /// The errors llama.cpp's converter collects (invalid `pattern`, ...).
    #[error("JSON schema conversion failed:\n{}", .0.join("\n"))]
    Conversion(Vec<String>),
    #[error("JSON schema nesting exceeds the limit of {limit} levels")]
    TooDeep { limit: usize },
    #[error("JSON schema expands to more than {limit} schema nodes")]
    TooManyNodes { limit: usize },
    #[error("grammar would have more than {limit} rules")]
    TooManyRules { limit: usize },
    #[error("grammar would exceed {limit} bytes")]
    GrammarTooLarge { limit: usize },
    #[error("{keyword} {value} exceeds the repetition limit of {limit}")]
    RepetitionTooLarge {
        keyword: &'static str,
        value: u64,
        limit: usize,
    },
    /// An integer bound llama.cpp cannot negate (its conversion would overflow).
    #[error("JSON schema conversion failed:\ninteger bound {value} is out of range")]
    BoundOutOfRange { value: i64 },
    /// A [`NodeId`] that does not belong to the document it was used with.
    #[error("schema node {0} is not in this document")]
    UnknownNode(usize),
}

/// A converted grammar and the warnings llama.cpp would print to stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversion {
    pub grammar: String,
    pub warnings: Vec<String>,
}

/// Converts a JSON schema to GBNF text, as llama.cpp's `json_schema_to_grammar`.
/// Warnings are dropped; use [`convert`] to get them.
pub fn json_schema_to_grammar(schema: &Value, opts: &SchemaOptions) -> Result<String, SchemaError> {
    convert(schema, opts).map(|c| c.grammar)
}

/// Converts a JSON schema to GBNF text, returning the warnings too.
pub fn convert(schema: &Value, opts: &SchemaOptions) -> Result<Conversion, SchemaError> {
    let doc = SchemaDocument::parse(schema, opts)?;
    document_to_grammar(&doc, opts)
}

/// Converts an already parsed document (llama.cpp's overload taking a
/// `common_chat_schema_document`).
pub fn document_to_grammar(
    doc: &SchemaDocument,
    opts: &SchemaOptions,
) -> Result<Conversion, SchemaError> {
    build_grammar(opts, |b| b.add_schema("", doc, doc.root()).map(|_| ()))
}

/// llama.cpp's `build_grammar`: `f` adds rules and schemas to one grammar.
pub fn build_grammar<F>(opts: &SchemaOptions, f: F) -> Result<Conversion, SchemaError>
where
    F: FnOnce(&mut GrammarBuilder<'_>) -> Result<(), SchemaError>,
{
    let mut builder = GrammarBuilder {
        conv: Converter::new(opts),
    };
    f(&mut builder)?;
    builder.conv.finish()
}

/// llama.cpp's `common_grammar_builder`.
pub struct GrammarBuilder<'o> {
    conv: Converter<'o>,
}

impl GrammarBuilder<'_> {
    /// Adds `name ::= rule` (renamed `name0`, `name1`, ... on a clash) and returns the
    /// name it got.
    pub fn add_rule(&mut self, name: &str, rule: &str) -> Result<String, SchemaError> {
        self.conv.add_rule(name, rule)
    }

    /// Adds the rules of `node` under `name` (`"root"` or `""` for the root rule) and
    /// returns the rule that matches it.
    pub fn add_schema(
        &mut self,
        name: &str,
        doc: &SchemaDocument,
        node: NodeId,
    ) -> Result<String, SchemaError> {
        let name = if name == "root" { "" } else { name };
        self.conv.visit(doc, node, name)
    }
}

/// llama.cpp's `gbnf_format_literal`: a GBNF string literal for `literal`.
pub fn format_literal(literal: &str) -> String {
    let mut out = String::with_capacity(literal.len() + 2);
    out.push('"');
    for c in literal.chars() {
        match c {
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            _ => out.push(c),
        }
    }
    out.push('"');
    out
}

// ---------------------------------------------------------------------------------
// The schema model (llama.cpp's common_chat_schema)
// ---------------------------------------------------------------------------------

/// Index of a node in a [`SchemaDocument`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub usize);

/// `format` values llama.cpp turns into dedicated rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StringFormat {
    None,
    /// `uuid`, `uuid1` .. `uuid5`
    Uuid,
    Date,
    Time,
    DateTime,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StringSchema {
    /// Empty when absent (llama.cpp treats an empty pattern as none).
    pub pattern: String,
    pub format: StringFormat,
    pub min_length: usize,
    pub max_length: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Property {
    pub name: String,
    pub schema: NodeId,
    pub required: bool,
}

/// One node of the schema tree, the subset of JSON Schema llama.cpp converts.
#[derive(Debug, Clone, PartialEq)]
pub enum SchemaNode {
    Any,
    /// `{"$ref": "#/..."}`; its target is [`SchemaDocument::ref_target`].
    Ref(String),
    /// `oneOf`/`anyOf`, or a `"type"` array (one alternative per type).
    AnyOf(Vec<NodeId>),
    AllOf(Vec<NodeId>),
    // Shared so that the copies a "type" array makes do not copy the value.
    Const(Arc<Value>),
    /// Never empty.
    Enum(Arc<[Value]>),
    Null,
    Boolean,
    Number,
    /// Inclusive bounds, `i64::MIN`/`i64::MAX` for unbounded; exclusive bounds folded in.
    Integer {
        minimum: i64,
        maximum: i64,
    },
    String(StringSchema),
    Array {
        items: NodeId,
        min_items: usize,
        max_items: Option<usize>,
    },
    Tuple(Vec<NodeId>),
    /// `additional_properties` is `None` when none are allowed.
    Object {
        properties: Vec<Property>,
        additional_properties: Option<NodeId>,
    },
}

/// A parsed schema: an arena of nodes, its root and the `$ref` targets.
#[derive(Debug, Clone)]
pub struct SchemaDocument {
    nodes: Vec<SchemaNode>,
    root: NodeId,
    refs: BTreeMap<String, NodeId>,
}

impl SchemaDocument {
    /// llama.cpp's `common_chat_schema_from_json`.
    pub fn parse(schema: &Value, opts: &SchemaOptions) -> Result<Self, SchemaError> {
        let mut b = DocBuilder {
            root: schema,
            opts,
            nodes: Vec::new(),
            refs: BTreeMap::new(),
            depth: 0,
            consts: HashMap::new(),
            enums: HashMap::new(),
        };
        let root = b.build_node(schema, None, "#")?;
        // every reserved entry was filled, or building failed
        let refs = b
            .refs
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        Ok(Self {
            nodes: b.nodes,
            root,
            refs,
        })
    }

    pub fn root(&self) -> NodeId {
        self.root
    }

    pub fn node(&self, id: NodeId) -> Option<&SchemaNode> {
        self.nodes.get(id.0)
    }

    pub fn ref_target(&self, reference: &str) -> Option<NodeId> {
        self.refs.get(reference).copied()
    }

    fn get(&self, id: NodeId) -> Result<&SchemaNode, SchemaError> {
        self.nodes.get(id.0).ok_or(SchemaError::UnknownNode(id.0))
    }
}

struct DocBuilder<'a, 'o> {
    root: &'a Value,
    opts: &'o SchemaOptions,
    nodes: Vec<SchemaNode>,
    // reserved (None) before the target is built, so that a cycle stops at the $ref
    refs: BTreeMap<String, Option<NodeId>>,
    depth: usize,
    // by address of the input value, so that each const/enum is copied once
    consts: HashMap<usize, Arc<Value>>,
    enums: HashMap<usize, Arc<[Value]>>,
}

fn fail<T>(path: &str, message: impl Into<String>) -> Result<T, SchemaError> {
    Err(SchemaError::Invalid {
        path: path.to_string(),
        message: message.into(),
    })
}

fn contains(schema: &Value, key: &str) -> bool {
    schema.as_object().is_some_and(|o| o.contains_key(key))
}

fn is_integer(v: &Value) -> bool {
    v.is_i64() || v.is_u64()
}

/// `std::stoull` as the C++ uses it to index arrays: leading blanks, a sign, digits,
/// anything after ignored; `None` where it throws.
fn c_stoull(s: &str) -> Option<u64> {
    let s = s.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (neg, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let digits = s.bytes().take_while(u8::is_ascii_digit);
    let mut v: u64 = 0;
    let mut any = false;
    for d in digits {
        any = true;
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    any.then(|| if neg { v.wrapping_neg() } else { v })
}

/// `std::stoi`: as [`c_stoull`], `None` outside `int`.
fn c_stoi(s: &str) -> Option<i32> {
    let s = s.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (neg, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let mut v: i64 = 0;
    let mut any = false;
    for d in s.bytes().take_while(u8::is_ascii_digit) {
        any = true;
        v = v * 10 + i64::from(d - b'0');
        if v > i64::from(i32::MAX) + 1 {
            return None;
        }
    }
    if !any {
        return None;
    }
    i32::try_from(if neg { -v } else { v }).ok()
}

impl<'a> DocBuilder<'a, '_> {
    fn push(&mut self, node: SchemaNode) -> NodeId {
        self.nodes.push(node);
        NodeId(self.nodes.len() - 1)
    }

    fn get_count(
        &self,
        schema: &Value,
        key: &'static str,
        path: &str,
    ) -> Result<Option<usize>, SchemaError> {
        let Some(value) = schema.get(key) else {
            return Ok(None);
        };
        let Some(v) = value.as_u64().filter(|_| is_integer(value)) else {
            return fail(path, format!("{key} must be a non-negative integer"));
        };
        // llama.cpp reads an int; past the limit the GBNF expansion would not fit anyway
        let limit = self.opts.max_repetition.min(i32::MAX as usize);
        if v > limit as u64 {
            return Err(SchemaError::RepetitionTooLarge {
                keyword: key,
                value: v,
                limit,
            });
        }
        Ok(Some(v as usize))
    }

    /// A fractional bound is rounded inwards, towards the integers it still admits.
    /// Out-of-range values saturate (llama.cpp's casts are undefined there).
    fn get_bound(
        schema: &Value,
        key: &str,
        path: &str,
        round_up: bool,
    ) -> Result<i64, SchemaError> {
        let value = &schema[key];
        if let Some(i) = value.as_i64() {
            return Ok(i);
        }
        if value.is_u64() {
            return Ok(i64::MAX);
        }
        let Some(d) = value.as_f64() else {
            return fail(path, format!("{key} must be a number"));
        };
        Ok((if round_up { d.ceil() } else { d.floor() }) as i64)
    }

    fn get_format(schema: &Value, path: &str) -> Result<StringFormat, SchemaError> {
        let Some(value) = schema.get("format") else {
            return Ok(StringFormat::None);
        };
        let Some(format) = value.as_str() else {
            return fail(path, "format must be a string");
        };
        Ok(match format {
            "date" => StringFormat::Date,
            "time" => StringFormat::Time,
            "date-time" => StringFormat::DateTime,
            "uuid" => StringFormat::Uuid,
            f if f.len() == 5
                && f.starts_with("uuid")
                && (b'1'..=b'5').contains(&f.as_bytes()[4]) =>
            {
                StringFormat::Uuid
            }
            _ => StringFormat::None,
        })
    }

    /// Follows `#/a/b/0`: object keys and array indices, no JSON-pointer unescaping
    /// (as llama.cpp).
    fn resolve_ref(&self, reference: &str, path: &str) -> Result<&'a Value, SchemaError> {
        let mut target = self.root;
        for sel in reference[1..].split('/').skip(1) {
            if let Some(next) = target.as_object().and_then(|o| o.get(sel)) {
                target = next;
            } else if let Some(arr) = target.as_array() {
                let idx = c_stoull(sel).unwrap_or(arr.len() as u64);
                match usize::try_from(idx).ok().and_then(|i| arr.get(i)) {
                    Some(next) => target = next,
                    None => {
                        return fail(
                            path,
                            format!("cannot resolve $ref {reference}, {sel} is out of range"),
                        );
                    }
                }
            } else {
                return fail(
                    path,
                    format!("cannot resolve $ref {reference}, {sel} not found"),
                );
            }
        }
        Ok(target)
    }

    fn build_ref(&mut self, value: &Value, path: &str) -> Result<NodeId, SchemaError> {
        let Some(reference) = value.as_str() else {
            return fail(path, "$ref must be a string");
        };
        if !reference.starts_with("#/") {
            // remote references are never fetched
            return fail(
                path,
                format!(
                    "unsupported $ref {reference}, only references into the same document are supported"
                ),
            );
        }
        if !self.refs.contains_key(reference) {
            self.refs.insert(reference.to_string(), None);
            let target = self.resolve_ref(reference, path)?;
            let id = self.build_node(target, None, reference)?;
            self.refs.insert(reference.to_string(), Some(id));
        }
        Ok(self.push(SchemaNode::Ref(reference.to_string())))
    }

    fn build_alternatives(
        &mut self,
        alts: &'a Value,
        path: &str,
        all_of: bool,
    ) -> Result<NodeId, SchemaError> {
        let Some(alts) = alts.as_array() else {
            return fail(path, "must be an array of schemas");
        };
        if alts.is_empty() {
            return fail(path, "must not be empty");
        }
        let mut children = Vec::with_capacity(alts.len().min(1024));
        for (i, alt) in alts.iter().enumerate() {
            children.push(self.build_node(alt, None, &format!("{path}/{i}"))?);
        }
        Ok(self.push(if all_of {
            SchemaNode::AllOf(children)
        } else {
            SchemaNode::AnyOf(children)
        }))
    }

    fn build_object(&mut self, schema: &'a Value, path: &str) -> Result<NodeId, SchemaError> {
        let required: HashSet<&str> = match schema.get("required").and_then(Value::as_array) {
            Some(names) => names.iter().filter_map(Value::as_str).collect(),
            None => HashSet::new(),
        };
        let mut properties = Vec::new();
        if let Some(props) = schema.get("properties") {
            let Some(props) = props.as_object() else {
                return fail(path, "properties must be an object");
            };
            for (name, prop) in props {
                let id = self.build_node(prop, None, &format!("{path}/properties/{name}"))?;
                properties.push(Property {
                    name: name.clone(),
                    schema: id,
                    required: required.contains(name.as_str()),
                });
            }
        }
        let additional_properties = match schema.get("additionalProperties") {
            Some(Value::Bool(true)) => Some(self.push(SchemaNode::Any)),
            Some(Value::Bool(false)) => None,
            Some(additional @ Value::Object(_)) => {
                Some(self.build_node(additional, None, &format!("{path}/additionalProperties"))?)
            }
            Some(_) => return fail(path, "additionalProperties must be a boolean or a schema"),
            // {"type": "object"} on its own accepts any object
            None if !contains(schema, "properties") => Some(self.push(SchemaNode::Any)),
            None => None,
        };
        Ok(self.push(SchemaNode::Object {
            properties,
            additional_properties,
        }))
    }

    fn build_array(&mut self, schema: &'a Value, path: &str) -> Result<NodeId, SchemaError> {
        let items = if contains(schema, "items") || contains(schema, "prefixItems") {
            // "items" wins when both are present; a schema instead of an array is the item schema
            let key = if contains(schema, "items") {
                "items"
            } else {
                "prefixItems"
            };
            let items = &schema[key];
            if let Some(arr) = items.as_array() {
                let mut tuple = Vec::with_capacity(arr.len().min(1024));
                for (i, item) in arr.iter().enumerate() {
                    tuple.push(self.build_node(item, None, &format!("{path}/{key}/{i}"))?);
                }
                return Ok(self.push(SchemaNode::Tuple(tuple)));
            }
            self.build_node(items, None, &format!("{path}/{key}"))?
        } else {
            self.push(SchemaNode::Any)
        };
        let min_items = self.get_count(schema, "minItems", path)?.unwrap_or(0);
        let max_items = self.get_count(schema, "maxItems", path)?;
        Ok(self.push(SchemaNode::Array {
            items,
            min_items,
            max_items,
        }))
    }

    fn build_string(&mut self, schema: &Value, path: &str) -> Result<NodeId, SchemaError> {
        let pattern = match schema.get("pattern") {
            Some(Value::String(p)) => p.clone(),
            Some(_) => return fail(path, "pattern must be a string"),
            None => String::new(),
        };
        let format = Self::get_format(schema, path)?;
        let min_length = self.get_count(schema, "minLength", path)?.unwrap_or(0);
        let max_length = self.get_count(schema, "maxLength", path)?;
        Ok(self.push(SchemaNode::String(StringSchema {
            pattern,
            format,
            min_length,
            max_length,
        })))
    }

    fn build_integer(&mut self, schema: &Value, path: &str) -> Result<NodeId, SchemaError> {
        let mut minimum = i64::MIN;
        let mut maximum = i64::MAX;
        if contains(schema, "minimum") {
            minimum = Self::get_bound(schema, "minimum", path, true)?;
        } else if contains(schema, "exclusiveMinimum") {
            minimum = Self::get_bound(schema, "exclusiveMinimum", path, false)?.saturating_add(1);
        }
        if contains(schema, "maximum") {
            maximum = Self::get_bound(schema, "maximum", path, false)?;
        } else if contains(schema, "exclusiveMaximum") {
            maximum = Self::get_bound(schema, "exclusiveMaximum", path, true)?.saturating_sub(1);
        }
        // An empty range has no grammar: llama.cpp's digit ranges would come out inverted
        // (`[5-3]`, or `[1-,]` beside others, which then admits numbers outside the bounds).
        if minimum > maximum {
            return fail(
                path,
                format!("no integer lies in the bounds (minimum {minimum} > maximum {maximum})"),
            );
        }
        Ok(self.push(SchemaNode::Integer { minimum, maximum }))
    }

    /// `type_override` stands for llama.cpp's copy of the schema with `"type"` replaced,
    /// which it makes for each entry of a `"type"` array.
    fn build_node(
        &mut self,
        schema: &'a Value,
        type_override: Option<&'a Value>,
        path: &str,
    ) -> Result<NodeId, SchemaError> {
        if self.depth >= self.opts.max_depth {
            return Err(SchemaError::TooDeep {
                limit: self.opts.max_depth,
            });
        }
        if self.nodes.len() >= self.opts.max_nodes {
            return Err(SchemaError::TooManyNodes {
                limit: self.opts.max_nodes,
            });
        }
        self.depth += 1;
        let r = self.build_node_inner(schema, type_override, path);
        self.depth -= 1;
        r
    }

    fn build_node_inner(
        &mut self,
        schema: &'a Value,
        type_override: Option<&'a Value>,
        path: &str,
    ) -> Result<NodeId, SchemaError> {
        let Some(obj) = schema.as_object() else {
            return fail(path, "schema must be an object");
        };
        if let Some(r) = obj.get("$ref") {
            return self.build_ref(r, path);
        }
        if obj.contains_key("oneOf") || obj.contains_key("anyOf") {
            let key = if obj.contains_key("oneOf") {
                "oneOf"
            } else {
                "anyOf"
            };
            return self.build_alternatives(&obj[key], &format!("{path}/{key}"), false);
        }

        let ty = type_override
            .or_else(|| obj.get("type"))
            .unwrap_or(&Value::Null);
        if let Some(types) = ty.as_array() {
            // {"type": ["a", "b"], ...} is {"anyOf": [{"type": "a", ...}, {"type": "b", ...}]}
            if types.is_empty() {
                return fail(path, "type must not be empty");
            }
            let mut children = Vec::with_capacity(types.len().min(1024));
            for (i, t) in types.iter().enumerate() {
                children.push(self.build_node(schema, Some(t), &format!("{path}/type/{i}"))?);
            }
            return Ok(self.push(SchemaNode::AnyOf(children)));
        }
        if let Some(value) = obj.get("const") {
            let key = value as *const Value as usize;
            let shared = self
                .consts
                .entry(key)
                .or_insert_with(|| Arc::new(value.clone()))
                .clone();
            return Ok(self.push(SchemaNode::Const(shared)));
        }
        if let Some(values) = obj.get("enum") {
            let Some(arr) = values.as_array().filter(|a| !a.is_empty()) else {
                return fail(path, "enum must be a non-empty array");
            };
            let key = values as *const Value as usize;
            let shared = self
                .enums
                .entry(key)
                .or_insert_with(|| arr.as_slice().into())
                .clone();
            return Ok(self.push(SchemaNode::Enum(shared)));
        }
        if !ty.is_null() && !ty.is_string() {
            return fail(path, "type must be a string or an array of strings");
        }

        let type_name = ty.as_str().unwrap_or("");
        let has_properties = obj.contains_key("properties")
            || obj
                .get("additionalProperties")
                .is_some_and(|a| *a != Value::Bool(true));

        match type_name {
            "" => {
                // without a type the structural keywords decide, in the same order as llama.cpp
                if has_properties {
                    self.build_object(schema, path)
                } else if let Some(all_of) = obj.get("allOf") {
                    self.build_alternatives(all_of, &format!("{path}/allOf"), true)
                } else if obj.contains_key("items") || obj.contains_key("prefixItems") {
                    self.build_array(schema, path)
                } else if obj.contains_key("pattern")
                    || obj.contains_key("minLength")
                    || obj.contains_key("maxLength")
                    || Self::get_format(schema, path)? != StringFormat::None
                {
                    self.build_string(schema, path)
                } else {
                    Ok(self.push(SchemaNode::Any))
                }
            }
            "object" => match obj.get("allOf") {
                Some(all_of) if !has_properties => {
                    self.build_alternatives(all_of, &format!("{path}/allOf"), true)
                }
                _ => self.build_object(schema, path),
            },
            "string" => match obj.get("allOf") {
                Some(all_of) => self.build_alternatives(all_of, &format!("{path}/allOf"), true),
                None => self.build_string(schema, path),
            },
            "array" => self.build_array(schema, path),
            "integer" => self.build_integer(schema, path),
            "number" => Ok(self.push(SchemaNode::Number)),
            "boolean" => Ok(self.push(SchemaNode::Boolean)),
            "null" => Ok(self.push(SchemaNode::Null)),
            other => fail(path, format!("unrecognized type {other}")),
        }
    }
}

// ---------------------------------------------------------------------------------
// JSON dump, as nlohmann::json::dump() (compact, UTF-8 kept, lowercase \u00xx)
// ---------------------------------------------------------------------------------

fn dump_json(
    v: &Value,
    out: &mut String,
    depth: usize,
    max_depth: usize,
) -> Result<(), SchemaError> {
    if depth > max_depth {
        return Err(SchemaError::TooDeep { limit: max_depth });
    }
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                let _ = write!(out, "{u}");
            } else if let Some(i) = n.as_i64() {
                let _ = write!(out, "{i}");
            } else {
                dump_double(n.as_f64().unwrap_or(f64::NAN), out);
            }
        }
        Value::String(s) => dump_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                dump_json(item, out, depth + 1, max_depth)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                dump_string(k, out);
                out.push(':');
                dump_json(item, out, depth + 1, max_depth)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

fn dump_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// nlohmann's `to_chars`: Grisu2 digits (round-trip exact, but not always the shortest,
/// so Rust's own float formatting would differ), fixed notation for decimal exponents
/// in (-4, 15], always with a `.0` or fraction, else `d.ddde+XX`.
fn dump_double(d: f64, out: &mut String) {
    if !d.is_finite() {
        out.push_str("null");
        return;
    }
    if d.is_sign_negative() {
        out.push('-');
    }
    if d == 0.0 {
        out.push_str("0.0");
        return;
    }
    let (digits, decimal_exponent) = grisu2::grisu2(d.abs());
    let digits: String = digits.into_iter().map(char::from).collect();
    let exp = decimal_exponent + digits.len() as i32 - 1;
    let k = digits.len() as i32;
    let n = exp + 1; // position of the decimal point relative to the digits
    const MIN_EXP: i32 = -4;
    const MAX_EXP: i32 = 15;
    if k <= n && n <= MAX_EXP {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
        out.push_str(".0");
    } else if 0 < n && n <= MAX_EXP {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if MIN_EXP < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(&digits);
    } else {
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = n - 1;
        let _ = write!(out, "e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
    }
}

/// nlohmann::json's `dtoa_impl::grisu2`, ported operation for operation (its unsigned
/// arithmetic wraps, so the port uses wrapping operations where the C++ relies on it).
mod grisu2 {
    #[derive(Clone, Copy)]
    struct DiyFp {
        f: u64,
        e: i32,
    }

    impl DiyFp {
        fn sub(x: DiyFp, y: DiyFp) -> DiyFp {
            DiyFp {
                f: x.f.wrapping_sub(y.f),
                e: x.e,
            }
        }

        fn mul(x: DiyFp, y: DiyFp) -> DiyFp {
            let (u_lo, u_hi) = (x.f & 0xFFFF_FFFF, x.f >> 32);
            let (v_lo, v_hi) = (y.f & 0xFFFF_FFFF, y.f >> 32);
            let p0 = u_lo * v_lo;
            let p1 = u_lo * v_hi;
            let p2 = u_hi * v_lo;
            let p3 = u_hi * v_hi;
            let mut q = (p0 >> 32) + (p1 & 0xFFFF_FFFF) + (p2 & 0xFFFF_FFFF);
            q += 1 << 31; // round, ties up
            let h = p3 + (p2 >> 32) + (p1 >> 32) + (q >> 32);
            DiyFp {
                f: h,
                e: x.e + y.e + 64,
            }
        }

        fn normalize(mut x: DiyFp) -> DiyFp {
            while x.f >> 63 == 0 {
                x.f <<= 1;
                x.e -= 1;
            }
            x
        }

        fn normalize_to(x: DiyFp, target_exponent: i32) -> DiyFp {
            DiyFp {
                f: x.f << (x.e - target_exponent),
                e: target_exponent,
            }
        }
    }

    const K_ALPHA: i32 = -60;

    #[rustfmt::skip]
    const CACHED_POWERS: [(u64, i32, i32); 79] = [
        (0xAB70FE17C79AC6CA, -1060, -300), (0xFF77B1FCBEBCDC4F, -1034, -292), (0xBE5691EF416BD60C, -1007, -284),
        (0x8DD01FAD907FFC3C, -980, -276), (0xD3515C2831559A83, -954, -268), (0x9D71AC8FADA6C9B5, -927, -260),
        (0xEA9C227723EE8BCB, -901, -252), (0xAECC49914078536D, -874, -244), (0x823C12795DB6CE57, -847, -236),
        (0xC21094364DFB5637, -821, -228), (0x9096EA6F3848984F, -794, -220), (0xD77485CB25823AC7, -768, -212),
        (0xA086CFCD97BF97F4, -741, -204), (0xEF340A98172AACE5, -715, -196), (0xB23867FB2A35B28E, -688, -188),
        (0x84C8D4DFD2C63F3B, -661, -180), (0xC5DD44271AD3CDBA, -635, -172), (0x936B9FCEBB25C996, -608, -164),
        (0xDBAC6C247D62A584, -582, -156), (0xA3AB66580D5FDAF6, -555, -148), (0xF3E2F893DEC3F126, -529, -140),
        (0xB5B5ADA8AAFF80B8, -502, -132), (0x87625F056C7C4A8B, -475, -124), (0xC9BCFF6034C13053, -449, -116),
        (0x964E858C91BA2655, -422, -108), (0xDFF9772470297EBD, -396, -100), (0xA6DFBD9FB8E5B88F, -369, -92),
        (0xF8A95FCF88747D94, -343, -84), (0xB94470938FA89BCF, -316, -76), (0x8A08F0F8BF0F156B, -289, -68),
        (0xCDB02555653131B6, -263, -60), (0x993FE2C6D07B7FAC, -236, -52), (0xE45C10C42A2B3B06, -210, -44),
        (0xAA242499697392D3, -183, -36), (0xFD87B5F28300CA0E, -157, -28), (0xBCE5086492111AEB, -130, -20),
        (0x8CBCCC096F5088CC, -103, -12), (0xD1B71758E219652C, -77, -4), (0x9C40000000000000, -50, 4),
        (0xE8D4A51000000000, -24, 12), (0xAD78EBC5AC620000, 3, 20), (0x813F3978F8940984, 30, 28),
        (0xC097CE7BC90715B3, 56, 36), (0x8F7E32CE7BEA5C70, 83, 44), (0xD5D238A4ABE98068, 109, 52),
        (0x9F4F2726179A2245, 136, 60), (0xED63A231D4C4FB27, 162, 68), (0xB0DE65388CC8ADA8, 189, 76),
        (0x83C7088E1AAB65DB, 216, 84), (0xC45D1DF942711D9A, 242, 92), (0x924D692CA61BE758, 269, 100),
        (0xDA01EE641A708DEA, 295, 108), (0xA26DA3999AEF774A, 322, 116), (0xF209787BB47D6B85, 348, 124),
        (0xB454E4A179DD1877, 375, 132), (0x865B86925B9BC5C2, 402, 140), (0xC83553C5C8965D3D, 428, 148),
        (0x952AB45CFA97A0B3, 455, 156), (0xDE469FBD99A05FE3, 481, 164), (0xA59BC234DB398C25, 508, 172),
        (0xF6C69A72A3989F5C, 534, 180), (0xB7DCBF5354E9BECE, 561, 188), (0x88FCF317F22241E2, 588, 196),
        (0xCC20CE9BD35C78A5, 614, 204), (0x98165AF37B2153DF, 641, 212), (0xE2A0B5DC971F303A, 667, 220),
        (0xA8D9D1535CE3B396, 694, 228), (0xFB9B7CD9A4A7443C, 720, 236), (0xBB764C4CA7A44410, 747, 244),
        (0x8BAB8EEFB6409C1A, 774, 252), (0xD01FEF10A657842C, 800, 260), (0x9B10A4E5E9913129, 827, 268),
        (0xE7109BFBA19C0C9D, 853, 276), (0xAC2820D9623BF429, 880, 284), (0x80444B5E7AA7CF85, 907, 292),
        (0xBF21E44003ACDD2D, 933, 300), (0x8E679C2F5E44FF8F, 960, 308), (0xD433179D9C8CB841, 986, 316),
        (0x9E19DB92B4E31BA9, 1013, 324),
    ];

    fn cached_power_for_binary_exponent(e: i32) -> (u64, i32, i32) {
        const MIN_DEC_EXP: i32 = -300;
        const DEC_STEP: i32 = 8;
        let f = K_ALPHA - e - 1;
        let k = (f * 78913) / (1 << 18) + i32::from(f > 0);
        let index = (-MIN_DEC_EXP + k + (DEC_STEP - 1)) / DEC_STEP;
        CACHED_POWERS[index.clamp(0, CACHED_POWERS.len() as i32 - 1) as usize]
    }

    fn find_largest_pow10(n: u32) -> (i32, u32) {
        let mut pow10 = 1_000_000_000u32;
        let mut k = 10;
        while k > 1 && n < pow10 {
            pow10 /= 10;
            k -= 1;
        }
        (k, pow10)
    }

    fn round(buf: &mut [u8], dist: u64, delta: u64, mut rest: u64, ten_k: u64) {
        while rest < dist
            && delta.wrapping_sub(rest) >= ten_k
            && (rest.wrapping_add(ten_k) < dist
                || dist.wrapping_sub(rest) > rest.wrapping_add(ten_k).wrapping_sub(dist))
        {
            if let Some(last) = buf.last_mut() {
                *last = last.wrapping_sub(1);
            }
            rest = rest.wrapping_add(ten_k);
        }
    }

    fn digit_gen(m_minus: DiyFp, w: DiyFp, m_plus: DiyFp) -> (Vec<u8>, i32) {
        let mut buffer = Vec::with_capacity(17);
        let mut decimal_exponent = 0;
        let mut delta = DiyFp::sub(m_plus, m_minus).f;
        let mut dist = DiyFp::sub(m_plus, w).f;
        let shift = -m_plus.e; // in [32, 60]
        let one_f = 1u64 << shift;
        let mut p1 = (m_plus.f >> shift) as u32;
        let mut p2 = m_plus.f & (one_f - 1);

        let (k, mut pow10) = find_largest_pow10(p1);
        let mut n = k;
        while n > 0 {
            let d = p1 / pow10;
            let r = p1 % pow10;
            buffer.push(b'0' + d as u8);
            p1 = r;
            n -= 1;
            let rest = (u64::from(p1) << shift).wrapping_add(p2);
            if rest <= delta {
                decimal_exponent += n;
                let ten_n = u64::from(pow10) << shift;
                round(&mut buffer, dist, delta, rest, ten_n);
                return (buffer, decimal_exponent);
            }
            pow10 /= 10;
        }

        let mut m = 0;
        loop {
            p2 = p2.wrapping_mul(10);
            let d = p2 >> shift;
            let r = p2 & (one_f - 1);
            buffer.push(b'0' + d as u8);
            p2 = r;
            m += 1;
            delta = delta.wrapping_mul(10);
            dist = dist.wrapping_mul(10);
            // nlohmann's invariants end this within 17 digits; the bound only guards
            // against an arithmetic slip turning into a hang
            if p2 <= delta || buffer.len() >= 40 {
                break;
            }
        }
        decimal_exponent -= m;
        round(&mut buffer, dist, delta, p2, one_f);
        (buffer, decimal_exponent)
    }

    /// The digits and decimal exponent of a finite, positive `value`:
    /// `value ~= digits * 10^exponent`.
    pub(super) fn grisu2(value: f64) -> (Vec<u8>, i32) {
        // compute_boundaries
        const PRECISION: i32 = 53;
        const BIAS: i32 = 1023 + (PRECISION - 1);
        const MIN_EXP: i32 = 1 - BIAS;
        const HIDDEN_BIT: u64 = 1 << (PRECISION - 1);
        let bits = value.to_bits();
        let e_bits = bits >> (PRECISION - 1);
        let f_bits = bits & (HIDDEN_BIT - 1);
        let v = if e_bits == 0 {
            DiyFp {
                f: f_bits,
                e: MIN_EXP,
            }
        } else {
            DiyFp {
                f: f_bits + HIDDEN_BIT,
                e: e_bits as i32 - BIAS,
            }
        };
        let lower_boundary_is_closer = f_bits == 0 && e_bits > 1;
        let m_plus = DiyFp {
            f: 2 * v.f + 1,
            e: v.e - 1,
        };
        let m_minus = if lower_boundary_is_closer {
            DiyFp {
                f: 4 * v.f - 1,
                e: v.e - 2,
            }
        } else {
            DiyFp {
                f: 2 * v.f - 1,
                e: v.e - 1,
            }
        };
        let w_plus = DiyFp::normalize(m_plus);
        let w_minus = DiyFp::normalize_to(m_minus, w_plus.e);
        let w = DiyFp::normalize(v);

        let (cf, ce, ck) = cached_power_for_binary_exponent(w_plus.e);
        let c_minus_k = DiyFp { f: cf, e: ce };
        let w = DiyFp::mul(w, c_minus_k);
        let w_minus = DiyFp::mul(w_minus, c_minus_k);
        let w_plus = DiyFp::mul(w_plus, c_minus_k);
        let m_minus = DiyFp {
            f: w_minus.f.wrapping_add(1),
            e: w_minus.e,
        };
        let m_plus = DiyFp {
            f: w_plus.f.wrapping_sub(1),
            e: w_plus.e,
        };
        let (digits, exp) = digit_gen(m_minus, w, m_plus);
        (digits, exp - ck)
    }
}

// ---------------------------------------------------------------------------------
// The converter (llama.cpp's common_chat_schema_converter)
// ---------------------------------------------------------------------------------

const SPACE_RULE: &str = r#"| " " | "\n"{1,2} [ \t]{0,20}"#;

struct BuiltinRule {
    content: &'static str,
    deps: &'static [&'static str],
}

fn primitive_rule(name: &str) -> Option<&'static BuiltinRule> {
    static BOOLEAN: BuiltinRule = BuiltinRule {
        content: r#"("true" | "false")"#,
        deps: &[],
    };
    static DECIMAL_PART: BuiltinRule = BuiltinRule {
        content: "[0-9]{1,16}",
        deps: &[],
    };
    static INTEGRAL_PART: BuiltinRule = BuiltinRule {
        content: "[0] | [1-9] [0-9]{0,15}",
        deps: &[],
    };
    static NUMBER: BuiltinRule = BuiltinRule {
        content: r#"("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?"#,
        deps: &["integral-part", "decimal-part"],
    };
    static INTEGER: BuiltinRule = BuiltinRule {
        content: r#"("-"? integral-part)"#,
        deps: &["integral-part"],
    };
    static VALUE: BuiltinRule = BuiltinRule {
        content: "object | array | string | number | boolean | null",
        deps: &["object", "array", "string", "number", "boolean", "null"],
    };
    static OBJECT: BuiltinRule = BuiltinRule {
        content: r#""{" space ( string ":" space value ("," space string ":" space value)* )? space "}""#,
        deps: &["string", "value"],
    };
    static ARRAY: BuiltinRule = BuiltinRule {
        content: r#""[" space ( value ("," space value)* )? space "]""#,
        deps: &["value"],
    };
    static UUID: BuiltinRule = BuiltinRule {
        content: r#""\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"""#,
        deps: &[],
    };
    static CHAR: BuiltinRule = BuiltinRule {
        content: r#"[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})"#,
        deps: &[],
    };
    static STRING: BuiltinRule = BuiltinRule {
        content: r#""\"" char* "\"""#,
        deps: &["char"],
    };
    static NULL: BuiltinRule = BuiltinRule {
        content: r#""null""#,
        deps: &[],
    };
    Some(match name {
        "boolean" => &BOOLEAN,
        "decimal-part" => &DECIMAL_PART,
        "integral-part" => &INTEGRAL_PART,
        "number" => &NUMBER,
        "integer" => &INTEGER,
        "value" => &VALUE,
        "object" => &OBJECT,
        "array" => &ARRAY,
        "uuid" => &UUID,
        "char" => &CHAR,
        "string" => &STRING,
        "null" => &NULL,
        _ => return None,
    })
}

fn string_format_rule(name: &str) -> Option<&'static BuiltinRule> {
    static DATE: BuiltinRule = BuiltinRule {
        content: r#"[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )"#,
        deps: &[],
    };
    static TIME: BuiltinRule = BuiltinRule {
        content: r#"([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )"#,
        deps: &[],
    };
    static DATE_TIME: BuiltinRule = BuiltinRule {
        content: r#"date "T" time"#,
        deps: &["date", "time"],
    };
    static DATE_STRING: BuiltinRule = BuiltinRule {
        content: r#""\"" date "\"""#,
        deps: &["date"],
    };
    static TIME_STRING: BuiltinRule = BuiltinRule {
        content: r#""\"" time "\"""#,
        deps: &["time"],
    };
    static DATE_TIME_STRING: BuiltinRule = BuiltinRule {
        content: r#""\"" date-time "\"""#,
        deps: &["date-time"],
    };
    Some(match name {
        "date" => &DATE,
        "time" => &TIME,
        "date-time" => &DATE_TIME,
        "date-string" => &DATE_STRING,
        "time-string" => &TIME_STRING,
        "date-time-string" => &DATE_TIME_STRING,
        _ => return None,
    })
}

fn is_reserved_name(name: &str) -> bool {
    name == "root" || primitive_rule(name).is_some() || string_format_rule(name).is_some()
}

/// Runs of characters outside `[a-zA-Z0-9-]` become one `-` (llama.cpp's
/// `INVALID_RULE_CHARS_RE` replacement).
fn sanitize_rule_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_run = false;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            out.push(c);
            in_run = false;
        } else if !in_run {
            out.push('-');
            in_run = true;
        }
    }
    out
}

/// llama.cpp's `build_repetition`; `None` is an unbounded max (its `INT_MAX`).
fn build_repetition(
    item_rule: &str,
    min_items: i64,
    max_items: Option<i64>,
    separator_rule: &str,
) -> String {
    if max_items == Some(0) {
        return String::new();
    }
    if min_items == 0 && max_items == Some(1) {
        return format!("{item_rule}?");
    }
    if separator_rule.is_empty() {
        return match (min_items, max_items) {
            (1, None) => format!("{item_rule}+"),
            (0, None) => format!("{item_rule}*"),
            (min, None) => format!("{item_rule}{{{min},}}"),
            (min, Some(max)) => format!("{item_rule}{{{min},{max}}}"),
        };
    }
    let inner = build_repetition(
        &format!("({separator_rule} {item_rule})"),
        if min_items == 0 { 0 } else { min_items - 1 },
        max_items.map(|m| m - 1),
        "",
    );
    let result = format!("{item_rule} {inner}");
    if min_items == 0 {
        format!("({result})?")
    } else {
        result
    }
}

/// llama.cpp's `build_min_max_int`: a GBNF body matching the integers in
/// `[min_value, max_value]` (`i64::MIN`/`i64::MAX` for unbounded), at most
/// `decimals_left` digits where unbounded.
fn build_min_max_int(
    mut min_value: i64,
    max_value: i64,
    out: &mut String,
    decimals_left: i64,
    top_level: bool,
) -> Result<(), SchemaError> {
    let has_min = min_value != i64::MIN;
    let has_max = max_value != i64::MAX;
    if has_max && max_value == i64::MIN {
        // llama.cpp negates it, which overflows
        return Err(SchemaError::BoundOutOfRange { value: max_value });
    }

    fn digit_range(out: &mut String, from: u8, to: u8) {
        out.push('[');
        out.push(from as char);
        if from != to {
            out.push('-');
            out.push(to as char);
        }
        out.push(']');
    }
    fn more_digits(out: &mut String, min_digits: i64, max_digits: i64) {
        out.push_str("[0-9]");
        if min_digits == max_digits && min_digits == 1 {
            return;
        }
        let _ = write!(out, "{{{min_digits}");
        if max_digits != min_digits {
            out.push(',');
            if max_digits != i64::from(i32::MAX) {
                let _ = write!(out, "{max_digits}");
            }
        }
        out.push('}');
    }
    fn uniform_range(out: &mut String, from: &[u8], to: &[u8]) {
        let mut i = 0;
        while i < from.len() && i < to.len() && from[i] == to[i] {
            i += 1;
        }
        if i > 0 {
            out.push('"');
            out.push_str(std::str::from_utf8(&from[..i]).unwrap_or(""));
            out.push('"');
        }
        if i < from.len() && i < to.len() {
            if i > 0 {
                out.push(' ');
            }
            let sub_len = from.len() - i - 1;
            if sub_len > 0 {
                let from_sub = &from[i + 1..];
                let to_sub = &to[i + 1..];
                let sub_zeros = vec![b'0'; sub_len];
                let sub_nines = vec![b'9'; sub_len];
                let mut to_reached = false;
                out.push('(');
                if from_sub == sub_zeros.as_slice() {
                    digit_range(out, from[i], to[i].wrapping_sub(1));
                    out.push(' ');
                    more_digits(out, sub_len as i64, sub_len as i64);
                } else {
                    out.push('[');
                    out.push(from[i] as char);
                    out.push_str("] (");
                    uniform_range(out, from_sub, &sub_nines);
                    out.push(')');
                    if i32::from(from[i]) < i32::from(to[i]) - 1 {
                        out.push_str(" | ");
                        if to_sub == sub_nines.as_slice() {
                            digit_range(out, from[i].wrapping_add(1), to[i]);
                            to_reached = true;
                        } else {
                            digit_range(out, from[i].wrapping_add(1), to[i].wrapping_sub(1));
                        }
                        out.push(' ');
                        more_digits(out, sub_len as i64, sub_len as i64);
                    }
                }
                if !to_reached {
                    out.push_str(" | ");
                    digit_range(out, to[i], to[i]);
                    out.push(' ');
                    uniform_range(out, &sub_zeros, to_sub);
                }
                out.push(')');
            } else {
                out.push('[');
                out.push(from[i] as char);
                out.push('-');
                out.push(to[i] as char);
                out.push(']');
            }
        }
    }

    if has_min && has_max {
        if min_value < 0 && max_value < 0 {
            out.push_str("\"-\" (");
            build_min_max_int(-max_value, -min_value, out, decimals_left, true)?;
            out.push(')');
            return Ok(());
        }
        if min_value < 0 {
            out.push_str("\"-\" (");
            build_min_max_int(0, -min_value, out, decimals_left, true)?;
            out.push_str(") | ");
            min_value = 0;
        }
        let mut min_s = min_value.to_string();
        let max_s = max_value.to_string();
        for digits in min_s.len()..max_s.len() {
            uniform_range(out, min_s.as_bytes(), "9".repeat(digits).as_bytes());
            min_s = format!("1{}", "0".repeat(digits));
            out.push_str(" | ");
        }
        uniform_range(out, min_s.as_bytes(), max_s.as_bytes());
        return Ok(());
    }

    let less_decimals = (decimals_left - 1).max(1);

    if has_min {
        if min_value < 0 {
            out.push_str("\"-\" (");
            build_min_max_int(i64::MIN, -min_value, out, decimals_left, false)?;
            out.push_str(") | [0] | [1-9] ");
            more_digits(out, 0, decimals_left - 1);
        } else if min_value == 0 {
            if top_level {
                out.push_str("[0] | [1-9] ");
                more_digits(out, 0, less_decimals);
            } else {
                more_digits(out, 1, decimals_left);
            }
        } else if min_value <= 9 {
            let c = b'0' + min_value as u8;
            let range_start = if top_level { b'1' } else { b'0' };
            if c > range_start {
                digit_range(out, range_start, c - 1);
                out.push(' ');
                more_digits(out, 1, less_decimals);
                out.push_str(" | ");
            }
            digit_range(out, c, b'9');
            out.push(' ');
            more_digits(out, 0, less_decimals);
        } else {
            let min_s = min_value.to_string();
            let len = min_s.len() as i64;
            let c = min_s.as_bytes()[0];
            if c > b'1' {
                digit_range(out, if top_level { b'1' } else { b'0' }, c - 1);
                out.push(' ');
                more_digits(out, len, less_decimals);
                out.push_str(" | ");
            }
            digit_range(out, c, c);
            out.push_str(" (");
            let rest: i64 = min_s[1..].parse().unwrap_or(0);
            build_min_max_int(rest, i64::MAX, out, less_decimals, false)?;
            out.push(')');
            if c < b'9' {
                out.push_str(" | ");
                digit_range(out, c + 1, b'9');
                out.push(' ');
                more_digits(out, len - 1, less_decimals);
            }
        }
        return Ok(());
    }

    if has_max {
        if max_value >= 0 {
            if top_level {
                out.push_str("\"-\" [1-9] ");
                more_digits(out, 0, less_decimals);
                out.push_str(" | ");
            }
            build_min_max_int(0, max_value, out, decimals_left, true)?;
        } else {
            out.push_str("\"-\" (");
            build_min_max_int(-max_value, i64::MAX, out, decimals_left, false)?;
            out.push(')');
        }
        return Ok(());
    }

    // llama.cpp throws this, and reports it as a conversion failure
    Err(SchemaError::Conversion(vec![
        "At least one of min_value or max_value must be set".to_string(),
    ]))
}

/// How a `pattern` conversion stopped: the two C++ exception types, or a limit.
enum PatternFailure {
    /// A valid regex with no grammar equivalent: warn, accept any string.
    Unsupported(String),
    /// Not a valid regex: an error.
    Invalid(String),
    Fatal(SchemaError),
}

impl From<SchemaError> for PatternFailure {
    fn from(e: SchemaError) -> Self {
        PatternFailure::Fatal(e)
    }
}

const MAX_PATTERN_DEPTH: usize = 100;

fn is_non_literal(c: char) -> bool {
    matches!(
        c,
        '|' | '.' | '(' | ')' | '[' | ']' | '{' | '}' | '*' | '+' | '?' | '^' | '$'
    )
}

fn escaped_in_regexps_but_not_in_literals(c: char) -> bool {
    matches!(
        c,
        '^' | '$' | '.' | '[' | ']' | '(' | ')' | '|' | '{' | '}' | '*' | '+' | '?'
    )
}

/// Length of the GBNF escape at `pos` (kept in sync with llama.cpp's `parse_char`), 0
/// when there is none.
fn gbnf_escape_length(pattern: &[char], pos: usize) -> usize {
    if pos + 1 >= pattern.len() || pattern[pos] != '\\' {
        return 0;
    }
    let n_hex = match pattern[pos + 1] {
        'x' => 2,
        'u' => 4,
        'U' => 8,
        't' | 'r' | 'n' | '\\' | '"' | '[' | ']' | '-' => return 2,
        _ => return 0,
    };
    if pos + 2 + n_hex > pattern.len() {
        return 0;
    }
    if pattern[pos + 2..pos + 2 + n_hex]
        .iter()
        .all(char::is_ascii_hexdigit)
    {
        2 + n_hex
    } else {
        0
    }
}

fn to_rule((s, is_literal): &(String, bool)) -> String {
    if *is_literal {
        format!("\"{s}\"")
    } else {
        s.clone()
    }
}

/// The state of llama.cpp's `_pattern_to_rule` lambdas. It walks code points where the
/// C++ walks bytes; the two agree except where the C++ would split a multi-byte
/// character before a quantifier and emit invalid UTF-8.
struct PatternParser<'p> {
    chars: Vec<char>,
    i: usize,
    paren_depth: usize,
    sub_rule_ids: HashMap<String, String>,
    name: &'p str,
}

impl PatternParser<'_> {
    fn substr(&self, from: usize, len: usize) -> String {
        self.chars[from..(from + len).min(self.chars.len())]
            .iter()
            .collect()
    }

    fn transform(&mut self, conv: &mut Converter<'_>) -> Result<(String, bool), PatternFailure> {
        let mut seq: Vec<(String, bool)> = Vec::new();
        let length = self.chars.len();

        // joins the sequence, merging consecutive literals together
        let join_seq = |seq: Vec<(String, bool)>| -> (String, bool) {
            let mut ret: Vec<String> = Vec::new();
            let mut literal = String::new();
            for (s, is_literal) in seq {
                if is_literal {
                    literal.push_str(&s);
                } else {
                    if !literal.is_empty() {
                        ret.push(format!("\"{}\"", std::mem::take(&mut literal)));
                    }
                    ret.push(s);
                }
            }
            if !literal.is_empty() {
                ret.push(format!("\"{literal}\""));
            }
            (ret.join(" "), false)
        };

        while self.i < length {
            let c = self.chars[self.i];
            match c {
                '.' => {
                    let rule = if conv.opts.dotall {
                        r"[\U00000000-\U0010FFFF]"
                    } else {
                        r"[^\x0A\x0D]"
                    };
                    seq.push((conv.add_rule("dot", rule)?, false));
                    self.i += 1;
                }
                '(' => {
                    self.i += 1;
                    if self.i < length && self.chars[self.i] == '?' {
                        if self.i + 1 < length && self.chars[self.i + 1] == ':' {
                            self.i += 2; // a non-capturing group is a regular group
                        } else {
                            // lookaround, named group, inline flags, ...
                            return Err(PatternFailure::Unsupported(
                                "unsupported group syntax".into(),
                            ));
                        }
                    }
                    self.paren_depth += 1;
                    if self.paren_depth > MAX_PATTERN_DEPTH {
                        return Err(PatternFailure::Unsupported(
                            "pattern nesting too deep".into(),
                        ));
                    }
                    let inner = self.transform(conv)?;
                    seq.push((format!("({})", to_rule(&inner)), false));
                }
                ')' => {
                    self.i += 1;
                    if self.paren_depth == 0 {
                        return Err(PatternFailure::Invalid("unbalanced parentheses".into()));
                    }
                    self.paren_depth -= 1;
                    return Ok(join_seq(seq));
                }
                '^' | '$' => {
                    return Err(PatternFailure::Unsupported(
                        "anchor inside the pattern".into(),
                    ));
                }
                '[' => {
                    let mut square_brackets = String::from("[");
                    self.i += 1;
                    while self.i < length && self.chars[self.i] != ']' {
                        if self.chars[self.i] == '\\' {
                            let escape_length = gbnf_escape_length(&self.chars, self.i);
                            if escape_length == 0 {
                                return Err(PatternFailure::Unsupported(format!(
                                    "unsupported escape in character class: {}",
                                    self.substr(self.i, 2)
                                )));
                            }
                            square_brackets.push_str(&self.substr(self.i, escape_length));
                            self.i += escape_length;
                        } else {
                            square_brackets.push(self.chars[self.i]);
                            self.i += 1;
                        }
                    }
                    if self.i >= length {
                        return Err(PatternFailure::Invalid(
                            "unterminated character class".into(),
                        ));
                    }
                    square_brackets.push(']');
                    self.i += 1;
                    seq.push((square_brackets, false));
                }
                '|' => {
                    seq.push(("|".into(), false));
                    self.i += 1;
                }
                '*' | '+' | '?' => {
                    let Some(last) = seq.last_mut() else {
                        return Err(PatternFailure::Invalid("nothing to repeat".into()));
                    };
                    *last = (format!("{}{c}", to_rule(last)), false);
                    self.i += 1;
                }
                '{' => self.curly(conv, &mut seq)?,
                _ => {
                    let mut literal = String::new();
                    while self.i < length {
                        let ch = self.chars[self.i];
                        if ch == '\\' {
                            if self.i == length - 1 {
                                return Err(PatternFailure::Invalid("trailing backslash".into()));
                            }
                            let next = self.chars[self.i + 1];
                            if escaped_in_regexps_but_not_in_literals(next) {
                                literal.push(next);
                                self.i += 2;
                            } else {
                                let escape_length = gbnf_escape_length(&self.chars, self.i);
                                if escape_length == 0 {
                                    return Err(PatternFailure::Unsupported(format!(
                                        "unsupported escape: {}",
                                        self.substr(self.i, 2)
                                    )));
                                }
                                literal.push_str(&self.substr(self.i, escape_length));
                                self.i += escape_length;
                            }
                        } else if ch == '"' {
                            literal.push_str("\\\"");
                            self.i += 1;
                        } else if !is_non_literal(ch)
                            && (self.i == length - 1
                                || literal.is_empty()
                                || self.chars[self.i + 1] == '.'
                                || !is_non_literal(self.chars[self.i + 1]))
                        {
                            literal.push(ch);
                            self.i += 1;
                        } else {
                            break;
                        }
                    }
                    if literal.is_empty() {
                        // nothing was consumed, e.g. a stray ']' or '}'
                        return Err(PatternFailure::Unsupported(format!(
                            "unsupported character: {c}"
                        )));
                    }
                    seq.push((literal, true));
                }
            }
        }
        Ok(join_seq(seq))
    }

    /// `{m}`, `{m,}`, `{,n}`, `{m,n}` applied to the last item.
    fn curly(
        &mut self,
        conv: &mut Converter<'_>,
        seq: &mut [(String, bool)],
    ) -> Result<(), PatternFailure> {
        let length = self.chars.len();
        self.i += 1;
        let start = self.i;
        while self.i < length && self.chars[self.i] != '}' {
            self.i += 1;
        }
        if self.i >= length {
            return Err(PatternFailure::Unsupported(
                "unterminated curly brackets".into(),
            ));
        }
        let inner: String = self.chars[start..self.i].iter().collect();
        self.i += 1;
        let nums: Vec<&str> = inner.split(',').collect();
        if nums.len() != 1 && nums.len() != 2 {
            return Err(PatternFailure::Unsupported(
                "wrong number of values in curly brackets".into(),
            ));
        }
        let invalid = || PatternFailure::Unsupported("invalid number in curly brackets".into());
        let (min_times, max_times) = if nums.len() == 1 {
            let n = c_stoi(nums[0]).ok_or_else(invalid)?;
            (n, n)
        } else {
            let min = if nums[0].is_empty() {
                0
            } else {
                c_stoi(nums[0]).ok_or_else(invalid)?
            };
            let max = if nums[1].is_empty() {
                i32::MAX
            } else {
                c_stoi(nums[1]).ok_or_else(invalid)?
            };
            (min, max)
        };
        let Some(last) = seq.last_mut() else {
            return Err(PatternFailure::Invalid("nothing to repeat".into()));
        };
        // INT_MAX is llama.cpp's "no maximum"
        let max_times = (max_times != i32::MAX).then_some(i64::from(max_times));
        let limit = conv.opts.max_repetition;
        for v in [Some(i64::from(min_times)), max_times]
            .into_iter()
            .flatten()
        {
            if v > 0 && v as u64 > limit as u64 {
                return Err(SchemaError::RepetitionTooLarge {
                    keyword: "pattern repetition",
                    value: v as u64,
                    limit,
                }
                .into());
            }
        }

        let (sub, sub_is_literal) = std::mem::take(last);
        let item = if sub_is_literal {
            format!("\"{sub}\"")
        } else if let Some(id) = self.sub_rule_ids.get(&sub) {
            id.clone()
        } else {
            // numbered by the map's size once the new entry is in, as the C++
            let id = conv.add_rule(
                &format!("{}-{}", self.name, self.sub_rule_ids.len() + 1),
                &sub,
            )?;
            self.sub_rule_ids.insert(sub, id.clone());
            id
        };
        *last = (
            build_repetition(&item, i64::from(min_times), max_times, ""),
            false,
        );
        Ok(())
    }
}

struct TrieNode {
    children: BTreeMap<char, usize>,
    has_pattern: bool,
}

/// Answers llama.cpp's `_add_rule` rename search ("the first `i` such that `name<i>`
/// is free or already holds this rule") without its linear scan, which many names that
/// sanitize alike would make quadratic. The answer is exactly the scan's.
#[derive(Default)]
struct ClashIndex {
    // base -> an index below which every `base<j>` is taken (advanced lazily)
    taken_below: HashMap<String, u64>,
    // (base, hash of a rule) -> the `i` whose `base<i>` holds a rule of that hash
    holding: HashMap<(String, u64), std::collections::BTreeSet<u64>>,
}

impl ClashIndex {
    fn hash(rule: &str) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        rule.hash(&mut h);
        h.finish()
    }

    /// Every way to read `key` as `base` + the decimal of some `i` (`std::to_string`).
    fn splits(key: &str) -> impl Iterator<Item = (&str, u64)> {
        let digits = key.bytes().rev().take_while(u8::is_ascii_digit).count();
        (1..=digits).filter_map(move |t| {
            let (base, num) = key.split_at(key.len() - t);
            if num.len() > 1 && num.starts_with('0') {
                return None;
            }
            num.parse().ok().map(|i| (base, i))
        })
    }

    fn inserted(&mut self, key: &str, rule: &str) {
        let mut h = None;
        for (base, i) in Self::splits(key) {
            let h = *h.get_or_insert_with(|| Self::hash(rule));
            self.holding
                .entry((base.to_string(), h))
                .or_default()
                .insert(i);
        }
    }

    fn removed(&mut self, key: &str, rule: &str) {
        let mut h = None;
        for (base, i) in Self::splits(key) {
            let h = *h.get_or_insert_with(|| Self::hash(rule));
            if let Some(set) = self.holding.get_mut(&(base.to_string(), h)) {
                set.remove(&i);
            }
            if let Some(n) = self.taken_below.get_mut(base)
                && i < *n
            {
                *n = i;
            }
        }
    }

    fn first_free_or_equal(
        &mut self,
        rules: &BTreeMap<String, String>,
        base: &str,
        rule: &str,
    ) -> u64 {
        let n = self.taken_below.entry(base.to_string()).or_insert(0);
        while rules.contains_key(&format!("{base}{n}")) {
            *n += 1;
        }
        // every base<j> below n is taken, and base<n> is free
        let free = *n;
        let equal = self
            .holding
            .get(&(base.to_string(), Self::hash(rule)))
            .and_then(|set| {
                set.range(..free)
                    .copied()
                    .find(|i| rules.get(&format!("{base}{i}")).is_some_and(|r| r == rule))
            });
        equal.unwrap_or(free)
    }
}

struct Converter<'o> {
    opts: &'o SchemaOptions,
    rules: BTreeMap<String, String>,
    rules_bytes: usize,
    refs_being_resolved: HashSet<String>,
    errors: Vec<String>,
    warnings: Vec<String>,
    // names inserted while converting a pattern, removed again if it fails (where the
    // C++ restores a copy of all rules)
    journal: Option<Vec<String>>,
    depth: usize,
    clashes: ClashIndex,
}

impl<'o> Converter<'o> {
    fn new(opts: &'o SchemaOptions) -> Self {
        let mut conv = Self {
            opts,
            rules: BTreeMap::new(),
            rules_bytes: 0,
            refs_being_resolved: HashSet::new(),
            errors: Vec::new(),
            warnings: Vec::new(),
            journal: None,
            depth: 0,
            clashes: ClashIndex::default(),
        };
        conv.rules_bytes = "space".len() + SPACE_RULE.len();
        conv.rules.insert("space".into(), SPACE_RULE.into());
        conv
    }

    fn finish(self) -> Result<Conversion, SchemaError> {
        if !self.errors.is_empty() {
            return Err(SchemaError::Conversion(self.errors));
        }
        let mut grammar = String::with_capacity(self.rules_bytes + 6 * self.rules.len());
        for (name, rule) in &self.rules {
            grammar.push_str(name);
            grammar.push_str(" ::= ");
            grammar.push_str(rule);
            grammar.push('\n');
        }
        Ok(Conversion {
            grammar,
            warnings: self.warnings,
        })
    }

    fn insert_rule(&mut self, key: String, rule: &str) -> Result<String, SchemaError> {
        if !self.rules.contains_key(&key) {
            if self.rules.len() >= self.opts.max_rules {
                return Err(SchemaError::TooManyRules {
                    limit: self.opts.max_rules,
                });
            }
            self.rules_bytes += key.len() + rule.len();
            if self.rules_bytes > self.opts.max_grammar_bytes {
                return Err(SchemaError::GrammarTooLarge {
                    limit: self.opts.max_grammar_bytes,
                });
            }
            if let Some(journal) = &mut self.journal {
                journal.push(key.clone());
            }
            self.clashes.inserted(&key, rule);
            self.rules.insert(key.clone(), rule.to_string());
        }
        Ok(key)
    }

    /// `name ::= rule`, or `name<i>` for the first `i` that is free or already holds
    /// this very rule.
    fn add_rule(&mut self, name: &str, rule: &str) -> Result<String, SchemaError> {
        let esc_name = sanitize_rule_name(name);
        match self.rules.get(&esc_name) {
            Some(existing) if existing != rule => {}
            _ => return self.insert_rule(esc_name, rule),
        }
        let i = self
            .clashes
            .first_free_or_equal(&self.rules, &esc_name, rule);
        self.insert_rule(format!("{esc_name}{i}"), rule)
    }

    fn add_primitive(&mut self, name: &str, rule: &BuiltinRule) -> Result<String, SchemaError> {
        let n = self.add_rule(name, rule.content)?;
        for dep in rule.deps {
            let Some(dep_rule) = primitive_rule(dep).or_else(|| string_format_rule(dep)) else {
                self.errors.push(format!("Rule {dep} not known"));
                continue;
            };
            if !self.rules.contains_key(*dep) {
                self.add_primitive(dep, dep_rule)?;
            }
        }
        Ok(n)
    }

    fn add_named_primitive(&mut self, name: &str) -> Result<String, SchemaError> {
        let rule = primitive_rule(name).or_else(|| string_format_rule(name));
        match rule {
            Some(rule) => self.add_primitive(name, rule),
            None => Err(SchemaError::Conversion(vec![format!(
                "Rule {name} not known"
            )])),
        }
    }

    fn visit_primitive(&mut self, rule_name: &str, ty: &str) -> Result<String, SchemaError> {
        let rule = primitive_rule(ty)
            .ok_or_else(|| SchemaError::Conversion(vec![format!("Rule {ty} not known")]))?;
        self.add_primitive(if rule_name == "root" { "root" } else { ty }, rule)
    }

    fn constant_rule(&self, value: &Value) -> Result<String, SchemaError> {
        let mut dumped = String::new();
        dump_json(value, &mut dumped, 0, self.opts.max_depth)?;
        Ok(format_literal(&dumped))
    }

    fn generate_union_rule(
        &mut self,
        doc: &SchemaDocument,
        name: &str,
        alts: &[NodeId],
    ) -> Result<String, SchemaError> {
        let mut rules = Vec::with_capacity(alts.len());
        for (i, alt) in alts.iter().enumerate() {
            let alt_name = if name.is_empty() {
                format!("alternative-{i}")
            } else {
                format!("{name}-{i}")
            };
            rules.push(self.visit(doc, *alt, &alt_name)?);
        }
        Ok(rules.join(" | "))
    }

    /// Removes the rules a failed pattern added.
    fn revert(&mut self, journal: &[String]) {
        for key in journal {
            if let Some(rule) = self.rules.remove(key) {
                self.rules_bytes -= key.len() + rule.len();
                self.clashes.removed(key, &rule);
            }
        }
    }

    fn visit_pattern(&mut self, pattern: &str, name: &str) -> Result<String, SchemaError> {
        self.journal = Some(Vec::new());
        let result = self.pattern_to_rule(pattern, name);
        let journal = self.journal.take().unwrap_or_default();
        match result {
            Ok(rule) => Ok(rule),
            Err(PatternFailure::Unsupported(what)) => {
                self.revert(&journal);
                self.warnings.push(format!(
                    "pattern {pattern} is not supported ({what}), accepting any string"
                ));
                let string = self.add_named_primitive("string")?;
                self.add_rule(name, &string)
            }
            Err(PatternFailure::Invalid(what)) => {
                self.revert(&journal);
                self.errors
                    .push(format!("Invalid pattern {pattern}: {what}"));
                Ok(String::new())
            }
            Err(PatternFailure::Fatal(e)) => Err(e),
        }
    }

    fn pattern_to_rule(&mut self, pattern: &str, name: &str) -> Result<String, PatternFailure> {
        if pattern.len() < 2 || !pattern.starts_with('^') || !pattern.ends_with('$') {
            return Err(PatternFailure::Unsupported(
                "not anchored with '^' and '$'".into(),
            ));
        }
        let mut parser = PatternParser {
            chars: pattern[1..pattern.len() - 1].chars().collect(),
            i: 0,
            paren_depth: 0,
            sub_rule_ids: HashMap::new(),
            name,
        };
        let rule = to_rule(&parser.transform(self)?);
        if parser.paren_depth != 0 {
            return Err(PatternFailure::Invalid("unbalanced parentheses".into()));
        }
        Ok(self.add_rule(name, &format!(r#""\"" ({rule}) "\"""#))?)
    }

    /// A rule matching a JSON string that is none of `strings`, e.g. for `["a"]`:
    /// `["] ( [a] char+ | [^"a] char* )? ["]`. Iterative: a long property name would
    /// otherwise recurse once per character.
    fn not_strings(&mut self, strings: &[&str]) -> Result<String, SchemaError> {
        let mut nodes = vec![TrieNode {
            children: BTreeMap::new(),
            has_pattern: false,
        }];
        for s in strings {
            let mut current = 0;
            for c in s.chars() {
                current = match nodes[current].children.get(&c) {
                    Some(&child) => child,
                    None => {
                        nodes.push(TrieNode {
                            children: BTreeMap::new(),
                            has_pattern: false,
                        });
                        let child = nodes.len() - 1;
                        nodes[current].children.insert(c, child);
                        child
                    }
                };
            }
            nodes[current].has_pattern = true;
        }

        let char_rule = self.add_named_primitive("char")?;
        let mut out = String::from("[\"] ( ");
        struct Frame {
            children: Vec<(char, usize)>,
            pos: usize,
            rejects: String,
        }
        let frame = |n: &TrieNode| Frame {
            children: n.children.iter().map(|(c, i)| (*c, *i)).collect(),
            pos: 0,
            rejects: String::new(),
        };
        let mut stack = vec![frame(&nodes[0])];
        while let Some(top) = stack.last_mut() {
            if top.pos < top.children.len() {
                let (c, child) = top.children[top.pos];
                top.pos += 1;
                top.rejects.push(c);
                if top.pos > 1 {
                    out.push_str(" | ");
                }
                out.push('[');
                out.push(c);
                out.push(']');
                if nodes[child].children.is_empty() {
                    let _ = write!(out, " {char_rule}+");
                } else {
                    out.push_str(" (");
                    stack.push(frame(&nodes[child]));
                }
            } else {
                let done = stack.pop().expect("stack is not empty");
                if !done.children.is_empty() {
                    let _ = write!(out, " | [^\"{}] {char_rule}*", done.rejects);
                }
                if !stack.is_empty() {
                    out.push(')');
                }
            }
        }
        out.push_str(" )");
        if !nodes[0].has_pattern {
            out.push('?');
        }
        out.push_str(" [\"]");
        Ok(out)
    }

    fn resolve_ref(
        &mut self,
        doc: &SchemaDocument,
        reference: &str,
    ) -> Result<String, SchemaError> {
        let fragment = match reference.find('#') {
            Some(p) => &reference[p + 1..],
            None => reference,
        };
        let mut ref_name = format!("ref{}", sanitize_rule_name(fragment));
        if !self.rules.contains_key(&ref_name) && !self.refs_being_resolved.contains(reference) {
            let Some(target) = doc.ref_target(reference) else {
                self.errors.push(format!("Unresolved $ref {reference}"));
                return Ok(String::new());
            };
            self.refs_being_resolved.insert(reference.to_string());
            ref_name = self.visit(doc, target, &ref_name)?;
            self.refs_being_resolved.remove(reference);
        }
        Ok(ref_name)
    }

    fn build_object_rule(
        &mut self,
        doc: &SchemaDocument,
        properties: &[(&str, NodeId)],
        required: &HashSet<&str>,
        name: &str,
        additional_properties: Option<NodeId>,
    ) -> Result<String, SchemaError> {
        let prefix = if name.is_empty() {
            String::new()
        } else {
            format!("{name}-")
        };
        let mut required_props: Vec<&str> = Vec::new();
        let mut optional_props: Vec<&str> = Vec::new();
        let mut prop_kv_rule_names: HashMap<&str, String> = HashMap::new();
        let mut prop_names: Vec<&str> = Vec::new();
        for &(prop_name, prop_schema) in properties {
            let prop_rule_name = self.visit(doc, prop_schema, &format!("{prefix}{prop_name}"))?;
            let mut key = String::new();
            dump_string(prop_name, &mut key);
            let kv = self.add_rule(
                &format!("{prefix}{prop_name}-kv"),
                &format!(
                    "{} space \":\" space {prop_rule_name}",
                    format_literal(&key)
                ),
            )?;
            prop_kv_rule_names.insert(prop_name, kv);
            if required.contains(prop_name) {
                required_props.push(prop_name);
            } else {
                optional_props.push(prop_name);
            }
            prop_names.push(prop_name);
        }
        if let Some(additional) = additional_properties {
            let sub_name = format!("{prefix}additional");
            let value_rule = if *doc.get(additional)? != SchemaNode::Any {
                self.visit(doc, additional, &format!("{sub_name}-value"))?
            } else {
                self.add_named_primitive("value")?
            };
            let key_rule = if prop_names.is_empty() {
                self.add_named_primitive("string")?
            } else {
                let not = self.not_strings(&prop_names)?;
                self.add_rule(&format!("{sub_name}-k"), &not)?
            };
            let kv_rule = self.add_rule(
                &format!("{sub_name}-kv"),
                &format!("{key_rule} \":\" space {value_rule}"),
            )?;
            prop_kv_rule_names.insert("*", kv_rule);
            optional_props.push("*");
        }

        if required_props.is_empty() && optional_props.is_empty() {
            return Ok(r#""{" space "}""#.to_string());
        }

        let kv = |k: &str| prop_kv_rule_names.get(k).cloned().unwrap_or_default();
        let mut rule = String::from("\"{\" space ");
        for (i, k) in required_props.iter().enumerate() {
            if i > 0 {
                rule.push_str(" \",\" space ");
            }
            rule.push_str(&kv(k));
        }

        if !optional_props.is_empty() {
            rule.push_str(" (");
            if !required_props.is_empty() {
                rule.push_str(" \",\" space ( ");
            }
            // llama.cpp's get_recursive_refs, unrolled: rest[j] is the rule
            // "<k_j>-rest" that follows the j-th optional property. It adds them from
            // the last one back, as the C++ recursion does, and recomputing them for
            // each alternative (as the C++ does) only finds the same rules again.
            let n = optional_props.len();
            let mut rest: Vec<String> = vec![String::new(); n];
            for j in (0..n.saturating_sub(1)).rev() {
                let next = optional_props[j + 1];
                let mut content = format!(
                    "( \",\" space {} ){}",
                    kv(next),
                    if next == "*" { "*" } else { "?" }
                );
                if j + 2 < n {
                    content.push(' ');
                    content.push_str(&rest[j + 1]);
                }
                rest[j] =
                    self.add_rule(&format!("{prefix}{}-rest", optional_props[j]), &content)?;
            }
            for (i, k) in optional_props.iter().enumerate() {
                if i > 0 {
                    rule.push_str(" | ");
                }
                let kv_name = kv(k);
                rule.push_str(&kv_name);
                if *k == "*" {
                    let _ = write!(rule, " ( \",\" space {kv_name} )*");
                }
                if i + 1 < n {
                    rule.push(' ');
                    rule.push_str(&rest[i]);
                }
            }
            if !required_props.is_empty() {
                rule.push_str(" )");
            }
            rule.push_str(" )?");
        }

        rule.push_str(" space \"}\"");
        Ok(rule)
    }

    fn visit_all_of(
        &mut self,
        doc: &SchemaDocument,
        children: &[NodeId],
        name: &str,
        rule_name: &str,
    ) -> Result<String, SchemaError> {
        let mut required: HashSet<&str> = HashSet::new();
        let mut properties: Vec<(&str, NodeId)> = Vec::new();
        let mut enum_values: BTreeMap<String, usize> = BTreeMap::new();
        let mut components: Vec<(NodeId, bool)> = Vec::new();
        for &child in children {
            if let SchemaNode::AnyOf(alts) = doc.get(child)? {
                components.extend(alts.iter().map(|a| (*a, false)));
            } else {
                components.push((child, true));
            }
        }
        for (mut comp, is_required) in components {
            // follow $ref chains, bounded: a $ref to itself would loop forever in the C++
            let mut hops = 0;
            while let SchemaNode::Ref(reference) = doc.get(comp)? {
                hops += 1;
                if hops > self.opts.max_depth {
                    return Err(SchemaError::TooDeep {
                        limit: self.opts.max_depth,
                    });
                }
                match doc.ref_target(reference) {
                    Some(target) => comp = target,
                    None => break,
                }
            }
            match doc.get(comp)? {
                SchemaNode::Object {
                    properties: props, ..
                } => {
                    for p in props {
                        properties.push((&p.name, p.schema));
                        if is_required {
                            required.insert(&p.name);
                        }
                    }
                }
                SchemaNode::Enum(values) => {
                    for v in values.iter() {
                        *enum_values.entry(self.constant_rule(v)?).or_insert(0) += 1;
                    }
                }
                _ => {}
            }
        }
        if !enum_values.is_empty() {
            let intersection: Vec<&str> = enum_values
                .iter()
                .filter(|(_, n)| **n == children.len())
                .map(|(k, _)| k.as_str())
                .collect();
            if !intersection.is_empty() {
                return self.add_rule(rule_name, &format!("({})", intersection.join(" | ")));
            }
        }
        let rule = self.build_object_rule(doc, &properties, &required, name, None)?;
        self.add_rule(rule_name, &rule)
    }

    fn visit(
        &mut self,
        doc: &SchemaDocument,
        id: NodeId,
        name: &str,
    ) -> Result<String, SchemaError> {
        if self.depth >= self.opts.max_depth {
            return Err(SchemaError::TooDeep {
                limit: self.opts.max_depth,
            });
        }
        self.depth += 1;
        let r = self.visit_inner(doc, id, name);
        self.depth -= 1;
        r
    }

    fn visit_inner(
        &mut self,
        doc: &SchemaDocument,
        id: NodeId,
        name: &str,
    ) -> Result<String, SchemaError> {
        let rule_name = if is_reserved_name(name) {
            format!("{name}-")
        } else if name.is_empty() {
            "root".to_string()
        } else {
            name.to_string()
        };
        let sub_name = if name.is_empty() {
            String::new()
        } else {
            format!("{name}-")
        };

        match doc.get(id)? {
            SchemaNode::Ref(reference) => {
                let target = self.resolve_ref(doc, reference)?;
                self.add_rule(&rule_name, &target)
            }
            SchemaNode::AnyOf(children) => {
                let union = self.generate_union_rule(doc, name, children)?;
                self.add_rule(&rule_name, &union)
            }
            SchemaNode::AllOf(children) => self.visit_all_of(doc, children, name, &rule_name),
            SchemaNode::Const(value) => {
                let rule = self.constant_rule(value)?;
                self.add_rule(&rule_name, &rule)
            }
            SchemaNode::Enum(values) => {
                let mut rules = Vec::with_capacity(values.len());
                for v in values.iter() {
                    rules.push(self.constant_rule(v)?);
                }
                self.add_rule(&rule_name, &format!("({})", rules.join(" | ")))
            }
            SchemaNode::Object {
                properties,
                additional_properties,
            } => {
                if properties.is_empty()
                    && let Some(additional) = additional_properties
                    && *doc.get(*additional)? == SchemaNode::Any
                {
                    let object = self.add_named_primitive("object")?;
                    return self.add_rule(&rule_name, &object);
                }
                let props: Vec<(&str, NodeId)> = properties
                    .iter()
                    .map(|p| (p.name.as_str(), p.schema))
                    .collect();
                let required: HashSet<&str> = properties
                    .iter()
                    .filter(|p| p.required)
                    .map(|p| p.name.as_str())
                    .collect();
                let rule =
                    self.build_object_rule(doc, &props, &required, name, *additional_properties)?;
                self.add_rule(&rule_name, &rule)
            }
            SchemaNode::Tuple(items) => {
                let mut rule = String::from("\"[\" space ");
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        rule.push_str(" \",\" space ");
                    }
                    rule.push_str(&self.visit(doc, *item, &format!("{sub_name}tuple-{i}"))?);
                }
                rule.push_str(" space \"]\"");
                self.add_rule(&rule_name, &rule)
            }
            SchemaNode::Array {
                items,
                min_items,
                max_items,
            } => {
                if *doc.get(*items)? == SchemaNode::Any && *min_items == 0 && max_items.is_none() {
                    return self.visit_primitive(&rule_name, "array");
                }
                let item_rule_name = self.visit(doc, *items, &format!("{sub_name}item"))?;
                let repetition = build_repetition(
                    &item_rule_name,
                    *min_items as i64,
                    max_items.map(|m| m as i64),
                    "\",\" space",
                );
                self.add_rule(&rule_name, &format!("\"[\" space {repetition} space \"]\""))
            }
            SchemaNode::String(s) => {
                if !s.pattern.is_empty() {
                    return self.visit_pattern(&s.pattern, &rule_name);
                }
                let prim_name = match s.format {
                    StringFormat::Uuid => return self.visit_primitive(&rule_name, "uuid"),
                    StringFormat::Date => "date-string",
                    StringFormat::Time => "time-string",
                    StringFormat::DateTime => "date-time-string",
                    StringFormat::None => "",
                };
                if !prim_name.is_empty() {
                    let prim = self.add_named_primitive(prim_name)?;
                    return self.add_rule(&rule_name, &prim);
                }
                if s.min_length > 0 || s.max_length.is_some() {
                    let char_rule = self.add_named_primitive("char")?;
                    let repetition = build_repetition(
                        &char_rule,
                        s.min_length as i64,
                        s.max_length.map(|m| m as i64),
                        "",
                    );
                    return self.add_rule(&rule_name, &format!(r#""\"" {repetition} "\"""#));
                }
                self.visit_primitive(&rule_name, "string")
            }
            SchemaNode::Integer { minimum, maximum } => {
                if *minimum == i64::MIN && *maximum == i64::MAX {
                    return self.visit_primitive(&rule_name, "integer");
                }
                let mut out = String::from("(");
                build_min_max_int(*minimum, *maximum, &mut out, 16, true)?;
                out.push(')');
                self.add_rule(&rule_name, &out)
            }
            SchemaNode::Number => self.visit_primitive(&rule_name, "number"),
            SchemaNode::Boolean => self.visit_primitive(&rule_name, "boolean"),
            SchemaNode::Null => self.visit_primitive(&rule_name, "null"),
            SchemaNode::Any => {
                let value = self.add_named_primitive("value")?;
                self.add_rule(&rule_name, &value)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_dump_like_nlohmann() {
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (1.5, "1.5"),
            (-2.25, "-2.25"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1e14, "100000000000000.0"),
            (1e15, "1e+15"),
            (1e16, "1e+16"),
            (1.5e300, "1.5e+300"),
            (123456.789, "123456.789"),
            // Grisu2 is not always shortest: Rust would print 4.536523230254616e+17
            (4.536523230254616e+17, "4.5365232302546163e+17"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
            (f64::MIN_POSITIVE, "2.2250738585072014e-308"),
        ];
        for (d, want) in cases {
            let mut s = String::new();
            dump_double(d, &mut s);
            assert_eq!(s, want, "{d}");
        }
    }

    #[test]
    fn strings_dump_like_nlohmann() {
        let mut s = String::new();
        dump_string("a\"\\\u{1}\u{7f}é\n", &mut s);
        assert_eq!(s, "\"a\\\"\\\\\\u0001\u{7f}é\\n\"");
    }

    /// The rename search against llama.cpp's linear scan, with reverts mixed in.
    #[test]
    fn clash_index_matches_linear_scan() {
        let names = ["a", "a0", "a1", "a10", "a00", "b", "a1x", "0", ""];
        let contents = ["x", "y", "z", "w"];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let opts = SchemaOptions::default();
        for _round in 0..50 {
            let mut conv = Converter::new(&opts);
            let mut model: BTreeMap<String, String> = conv.rules.clone();
            let mut journal: Option<Vec<String>> = None;
            for _ in 0..300 {
                match next(20) {
                    0 if journal.is_none() => {
                        journal = Some(Vec::new());
                        conv.journal = Some(Vec::new());
                    }
                    1 if journal.is_some() => {
                        let keys = conv.journal.take().unwrap();
                        conv.revert(&keys);
                        for k in journal.take().unwrap() {
                            model.remove(&k);
                        }
                    }
                    _ => {
                        let name = names[next(names.len())];
                        let rule = contents[next(contents.len())];
                        // llama.cpp's _add_rule, verbatim
                        let want = match model.get(name) {
                            Some(r) if r != rule => {
                                let mut i = 0;
                                while model.get(&format!("{name}{i}")).is_some_and(|r| r != rule) {
                                    i += 1;
                                }
                                format!("{name}{i}")
                            }
                            _ => name.to_string(),
                        };
                        if !model.contains_key(&want) {
                            model.insert(want.clone(), rule.to_string());
                            if let Some(j) = &mut journal {
                                j.push(want.clone());
                            }
                        }
                        assert_eq!(conv.add_rule(name, rule).unwrap(), want);
                    }
                }
                assert_eq!(conv.rules, model);
            }
        }
    }

    #[test]
    fn c_number_parsing() {
        assert_eq!(c_stoi(" 12abc"), Some(12));
        assert_eq!(c_stoi("-3"), Some(-3));
        assert_eq!(c_stoi(""), None);
        assert_eq!(c_stoi("99999999999"), None);
        assert_eq!(c_stoull("-0"), Some(0));
        assert_eq!(c_stoull("x"), None);
    }
}
