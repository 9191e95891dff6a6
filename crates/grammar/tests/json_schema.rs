//! JSON Schema to GBNF against llama.cpp's own test vectors
//! (tests/test-json-schema-to-grammar.cpp, extracted by
//! scripts/grammar/extract_schema_cases.py), plus the limits that keep hostile schemas
//! from exhausting the stack or memory.

use lamina_grammar::json_schema::{
    GrammarBuilder, SchemaDocument, SchemaError, SchemaNode, SchemaOptions, build_grammar, convert,
    document_to_grammar, json_schema_to_grammar,
};
use serde_json::{Value, json};

const CASES: &str = include_str!("data/json_schema_cases.json");

fn opts() -> SchemaOptions {
    SchemaOptions::default()
}

#[test]
fn llama_cpp_cases() {
    let cases: Vec<Value> = serde_json::from_str(CASES).expect("cases parse");
    assert!(cases.len() >= 80, "only {} cases", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let schema: Value = serde_json::from_str(case["schema"].as_str().unwrap()).expect(name);
        let result = json_schema_to_grammar(&schema, &opts());
        match (case["status"].as_str().unwrap(), result) {
            ("success", Ok(grammar)) => {
                // the vectors are the C++ test's trim()med expectations: the converter's
                // output is those lines, each ended by '\n'
                let want = format!("{}\n", case["grammar"].as_str().unwrap());
                if grammar != want {
                    failures.push(format!(
                        "{name}:\n--- expected\n{want}--- actual\n{grammar}"
                    ));
                }
            }
            ("success", Err(e)) => failures.push(format!("{name}: unexpected error {e}")),
            ("failure", Ok(grammar)) => {
                failures.push(format!("{name}: expected an error, got\n{grammar}"))
            }
            ("failure", Err(_)) => {}
            (status, _) => panic!("bad status {status}"),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn failure_messages_match_llama_cpp() {
    let err = json_schema_to_grammar(&json!({"type": "kaboom"}), &opts()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "JSON schema conversion failed:\nJSON schema error at #: unrecognized type kaboom"
    );
    let err =
        json_schema_to_grammar(&json!({"type": "string", "pattern": "^(a$"}), &opts()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "JSON schema conversion failed:\nInvalid pattern ^(a$: unbalanced parentheses"
    );
    assert!(matches!(err, SchemaError::Conversion(ref msgs) if msgs.len() == 1));
}

#[test]
fn unsupported_pattern_is_a_warning() {
    let c = convert(
        &json!({"type": "string", "pattern": "^[0-9]{3}\\w$"}),
        &opts(),
    )
    .unwrap();
    assert_eq!(
        c.warnings,
        vec![
            "pattern ^[0-9]{3}\\w$ is not supported (unsupported escape: \\w), accepting any string"
        ]
    );
    assert!(
        !c.grammar.contains("root-1"),
        "partial rules leaked:\n{}",
        c.grammar
    );
}

#[test]
fn remote_ref_is_an_error() {
    let err = json_schema_to_grammar(&json!({"$ref": "https://example.com/schema.json"}), &opts())
        .unwrap_err();
    assert!(matches!(err, SchemaError::Invalid { .. }), "{err}");
    let err = json_schema_to_grammar(&json!({"$ref": "#/$defs/missing"}), &opts()).unwrap_err();
    assert!(
        err.to_string()
            .contains("cannot resolve $ref #/$defs/missing"),
        "{err}"
    );
}

#[test]
fn dotall_changes_the_dot_rule() {
    let schema = json!({"type": "string", "pattern": "^a.$"});
    let plain = json_schema_to_grammar(&schema, &opts()).unwrap();
    assert!(plain.contains("dot ::= [^\\x0A\\x0D]\n"), "{plain}");
    let dotall = json_schema_to_grammar(
        &schema,
        &SchemaOptions {
            dotall: true,
            ..opts()
        },
    )
    .unwrap();
    assert!(
        dotall.contains("dot ::= [\\U00000000-\\U0010FFFF]\n"),
        "{dotall}"
    );
}

// The C++ test's "parsed document": a document parsed up front gives the same grammar
// as the JSON, recursion included.
#[test]
fn parsed_document_matches_direct_conversion() {
    let schema = json!({
        "$ref": "#/$defs/node",
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"next": {"$ref": "#/$defs/node"}, "leaf": {}},
                "additionalProperties": false
            }
        }
    });
    let doc = SchemaDocument::parse(&schema, &opts()).unwrap();
    let from_doc = document_to_grammar(&doc, &opts()).unwrap().grammar;
    assert_eq!(from_doc, json_schema_to_grammar(&schema, &opts()).unwrap());
    // the recursion goes through the rule the $ref property gets
    assert!(
        from_doc.contains("ref-defs-node-next ::= ref-defs-node\n"),
        "{from_doc}"
    );
    assert!(from_doc.contains("root ::= ref-defs-node\n"), "{from_doc}");
}

// The C++ test's "sub-schema $ref": a property node carries its $ref target, so its
// grammar names the ref rule.
#[test]
fn sub_schema_ref_through_builder() {
    let parameters = json!({
        "type": "object",
        "properties": {"item": {"$ref": "#/$defs/item"}},
        "$defs": {
            "item": {
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "required": ["a"],
                "additionalProperties": false
            }
        }
    });
    let doc = SchemaDocument::parse(&parameters, &opts()).unwrap();
    let Some(SchemaNode::Object { properties, .. }) = doc.node(doc.root()) else {
        panic!("root is not an object");
    };
    let item = properties[0].schema;
    let grammar = build_grammar(&opts(), |b: &mut GrammarBuilder<'_>| {
        b.add_schema("root", &doc, item).map(|_| ())
    })
    .unwrap()
    .grammar;
    let want = r#"char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})
ref-defs-item ::= "{" space ref-defs-item-a-kv space "}"
ref-defs-item-a-kv ::= "\"a\"" space ":" space string
root ::= ref-defs-item
space ::= | " " | "\n"{1,2} [ \t]{0,20}
string ::= "\"" char* "\""
"#;
    assert_eq!(grammar, want);
}

#[test]
fn builder_add_rule_renames_on_clash() {
    let g = build_grammar(&opts(), |b| {
        assert_eq!(b.add_rule("x", "\"a\"")?, "x");
        assert_eq!(b.add_rule("x", "\"a\"")?, "x");
        assert_eq!(b.add_rule("x", "\"b\"")?, "x0");
        assert_eq!(b.add_rule("x y", "\"c\"")?, "x-y");
        Ok(())
    })
    .unwrap()
    .grammar;
    assert_eq!(
        g,
        "space ::= | \" \" | \"\\n\"{1,2} [ \\t]{0,20}\nx ::= \"a\"\nx-y ::= \"c\"\nx0 ::= \"b\"\n"
    );
}

#[test]
fn const_and_enum_dump_like_nlohmann() {
    let g = json_schema_to_grammar(
        &json!({"enum": [1.5, -0.25, 1e100, 10, {"a": [true, null]}, "\u{1}é"]}),
        &opts(),
    )
    .unwrap();
    let root = g.lines().find(|l| l.starts_with("root ::= ")).unwrap();
    assert_eq!(
        root,
        r#"root ::= ("1.5" | "-0.25" | "1e+100" | "10" | "{\"a\":[true,null]}" | "\"\\u0001é\"")"#
    );
}

#[test]
fn integer_bounds_edge_cases_do_not_panic() {
    for schema in [
        json!({"type": "integer", "minimum": i64::MIN}),
        json!({"type": "integer", "maximum": i64::MIN}),
        json!({"type": "integer", "minimum": -i64::MAX}),
        json!({"type": "integer", "maximum": i64::MAX}),
        json!({"type": "integer", "exclusiveMaximum": i64::MIN}),
        json!({"type": "integer", "exclusiveMinimum": i64::MAX}),
        json!({"type": "integer", "minimum": 1e300, "maximum": -1e300}),
        json!({"type": "integer", "minimum": u64::MAX}),
        json!({"type": "integer", "minimum": 5, "maximum": -3}),
        json!({"type": "integer", "minimum": 100, "maximum": 5}),
        json!({"type": "integer", "minimum": 1.5, "exclusiveMaximum": 9.5}),
    ] {
        let _ = json_schema_to_grammar(&schema, &opts());
    }
    // fractional bounds are rounded inwards
    let g = json_schema_to_grammar(
        &json!({"type": "integer", "minimum": 0.5, "maximum": 3.7}),
        &opts(),
    )
    .unwrap();
    assert!(g.starts_with("root ::= ([1-3])\n"), "{g}");
}

#[test]
fn an_empty_integer_range_is_an_error() {
    // Found by reading the fuzzer's grammars: bounds of -0.5 round inwards to 0 ≥ n ≥ -1,
    // for which the digit ranges came out inverted (`[1-,]`) and the grammar admitted 0..9.
    for (schema, bounds) in [
        (
            json!({"type": "integer", "minimum": -0.5, "maximum": -0.5}),
            "0 > maximum -1",
        ),
        (
            json!({"type": "integer", "minimum": 5, "maximum": 3}),
            "5 > maximum 3",
        ),
        (
            json!({"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 4}),
            "4 > maximum 3",
        ),
        (
            json!({"type": "integer", "minimum": 1e300, "maximum": -1e300}),
            "> maximum",
        ),
    ] {
        let err = json_schema_to_grammar(&schema, &opts())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no integer lies in the bounds"),
            "{schema}: {err}"
        );
        assert!(err.contains(bounds), "{schema}: {err}");
    }
    // One integer is a range.
    let g = json_schema_to_grammar(
        &json!({"type": "integer", "minimum": -1, "maximum": -1}),
        &opts(),
    )
    .unwrap();
    assert!(g.starts_with("root ::= (\"-\" (\"1\"))\n"), "{g}");
}

// ---- limits ----------------------------------------------------------------------

#[test]
fn deep_nesting_is_an_error() {
    let mut schema = json!({"type": "string"});
    for _ in 0..100 {
        schema = json!({"type": "object", "properties": {"a": schema}});
    }
    let err = json_schema_to_grammar(&schema, &opts()).unwrap_err();
    assert!(matches!(err, SchemaError::TooDeep { limit: 64 }), "{err}");

    // the same depth fits under a larger limit
    let g = json_schema_to_grammar(
        &schema,
        &SchemaOptions {
            max_depth: 256,
            ..opts()
        },
    )
    .unwrap();
    assert!(g.contains("root ::= "));
}

#[test]
fn deep_anyof_and_array_nesting_is_an_error() {
    let mut schema = json!({});
    for i in 0..1000 {
        schema = if i % 2 == 0 {
            json!({"anyOf": [schema]})
        } else {
            json!({"items": schema})
        };
    }
    // serde_json's own parser stops at 128 levels; a Value built in code can go deeper
    let err = json_schema_to_grammar(&schema, &opts()).unwrap_err();
    assert!(matches!(err, SchemaError::TooDeep { .. }), "{err}");
}

#[test]
fn deep_const_value_is_an_error() {
    let mut value = json!(1);
    for _ in 0..1000 {
        value = json!([value]);
    }
    let err = json_schema_to_grammar(&json!({"const": value}), &opts()).unwrap_err();
    assert!(matches!(err, SchemaError::TooDeep { .. }), "{err}");
}

#[test]
fn huge_repetition_counts_are_errors() {
    for schema in [
        json!({"type": "array", "minItems": 1_000_000_000u64}),
        json!({"type": "array", "items": {"type": "string"}, "maxItems": 10_001}),
        json!({"type": "string", "minLength": u64::MAX}),
        json!({"type": "string", "maxLength": 4_294_967_297u64}),
        json!({"type": "string", "pattern": "^a{100000}$"}),
        json!({"type": "string", "pattern": "^(ab){1,1000000}$"}),
    ] {
        let err = json_schema_to_grammar(&schema, &opts()).unwrap_err();
        assert!(
            matches!(err, SchemaError::RepetitionTooLarge { .. }),
            "{schema}: {err}"
        );
    }
    // at the limit it is fine
    let g =
        json_schema_to_grammar(&json!({"type": "string", "maxLength": 10_000}), &opts()).unwrap();
    assert!(
        g.contains("root ::= \"\\\"\" char{0,10000} \"\\\"\"\n"),
        "{g}"
    );
}

#[test]
fn recursive_refs_terminate() {
    // a self-recursive object
    let schema = json!({
        "$ref": "#/$defs/tree",
        "$defs": {"tree": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}}}}}
    });
    let g = json_schema_to_grammar(&schema, &opts()).unwrap();
    assert!(
        g.contains("ref-defs-tree-kids-item ::= ref-defs-tree\n"),
        "{g}"
    );
    assert!(g.contains("root ::= ref-defs-tree\n"), "{g}");

    // a $ref to itself, two refs pointing at each other, a recursive anyOf
    for schema in [
        json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}),
        json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}),
        json!({"$ref": "#/$defs/l", "$defs": {"l": {"anyOf": [{"$ref": "#/$defs/l"}, {"type": "null"}]}}}),
    ] {
        json_schema_to_grammar(&schema, &opts()).unwrap();
    }
    // llama.cpp only follows "#/..." references, so the document root cannot be named
    assert!(
        json_schema_to_grammar(
            &json!({"anyOf": [{"$ref": "#"}, {"type": "null"}]}),
            &opts()
        )
        .is_err()
    );

    // allOf through a $ref cycle loops forever in llama.cpp; here it is bounded
    let schema = json!({"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"$ref": "#/$defs/a"}}});
    let err = json_schema_to_grammar(&schema, &opts()).unwrap_err();
    assert!(matches!(err, SchemaError::TooDeep { .. }), "{err}");
}

#[test]
fn exponential_type_arrays_are_bounded() {
    // each level's "type" array copies the level below twice: 2^40 nodes unbounded
    let mut schema = json!({"type": "string"});
    for _ in 0..40 {
        schema = json!({"type": ["object", "object"], "properties": {"a": schema}});
    }
    let err = json_schema_to_grammar(
        &schema,
        &SchemaOptions {
            max_depth: 1000,
            ..opts()
        },
    )
    .unwrap_err();
    assert!(matches!(err, SchemaError::TooManyNodes { .. }), "{err}");
}

#[test]
fn many_rules_and_big_grammars_are_errors() {
    let props: serde_json::Map<String, Value> = (0..20_000)
        .map(|i| (format!("p{i}"), json!({"type": "integer", "minimum": i})))
        .collect();
    let err = json_schema_to_grammar(&json!({"type": "object", "properties": props}), &opts())
        .unwrap_err();
    assert!(
        matches!(err, SchemaError::TooManyRules { limit: 10_000 }),
        "{err}"
    );

    let big = "x".repeat(1 << 20);
    let types: Vec<&str> = vec!["string"; 100];
    let err = json_schema_to_grammar(&json!({"type": types, "const": big}), &opts()).unwrap_err();
    assert!(matches!(err, SchemaError::GrammarTooLarge { .. }), "{err}");
}

#[test]
fn many_optional_properties_are_linear() {
    // llama.cpp rebuilds the "-rest" chain for each optional property (quadratic);
    // the port computes each once
    let props: serde_json::Map<String, Value> =
        (0..3000).map(|i| (format!("p{i}"), json!({}))).collect();
    let g = json_schema_to_grammar(&json!({"properties": props}), &opts()).unwrap();
    assert!(g.contains("p2998-rest ::= ( \",\" space p2999-kv )?\n"));
    assert!(g.contains("p0-rest ::= ( \",\" space p1-kv )? p1-rest\n"));
}

#[test]
fn long_property_name_with_additional_properties() {
    // the key-exclusion trie is walked without recursion
    let name = "k".repeat(200_000);
    let schema = json!({"properties": {name: {}}, "additionalProperties": {"type": "integer"}});
    let g = json_schema_to_grammar(&schema, &opts()).unwrap();
    assert!(g.contains("additional-k ::= [\"] ( [k] ([k] ("));
}

#[test]
fn hostile_patterns_do_not_panic() {
    for p in [
        "^$",
        "^",
        "$",
        "^(((((((((((a)))))))))))$",
        "^a{$",
        "^a{1,2,3}$",
        "^{2}$",
        "^*$",
        "^a\\$",
        "^[abc$",
        "^\\x4$",
        "^é*ü+$",
        "^a{-1}$",
        "^a{,}$",
        "^a{ 3}$",
        "^]$",
        "^a)$",
        "^(?<n>a)$",
    ] {
        let _ = convert(&json!({"type": "string", "pattern": p}), &opts());
    }
    let deep = format!("^{}a{}$", "(".repeat(5000), ")".repeat(5000));
    let c = convert(&json!({"type": "string", "pattern": deep}), &opts()).unwrap();
    assert!(c.warnings[0].contains("pattern nesting too deep"));
}

#[test]
fn names_that_sanitize_alike_are_numbered() {
    let schema = json!({"type": "object", "properties": {
        "a b": {"type": "integer", "minimum": 1},
        "a.b": {"type": "integer", "minimum": 2},
        "a_b": {"type": "integer", "minimum": 1}
    }, "required": ["a b", "a.b", "a_b"]});
    let g = json_schema_to_grammar(&schema, &opts()).unwrap();
    // the third has the first one's body, so it reuses that rule
    assert!(
        g.contains(
            "root ::= \"{\" space a-b-kv \",\" space a-b-kv0 \",\" space a-b-kv1 space \"}\"\n"
        ),
        "{g}"
    );
    assert!(
        g.contains("a-b-kv1 ::= \"\\\"a_b\\\"\" space \":\" space a-b\n"),
        "{g}"
    );

    // thousands of clashing names hit the rule limit quickly (the rename search is
    // indexed, not llama.cpp's linear scan)
    let props: serde_json::Map<String, Value> = (0..4900u32)
        .map(|i| {
            (
                format!("a{}b", char::from_u32(0x4e00 + i).unwrap()),
                json!({"type": "integer", "minimum": i}),
            )
        })
        .collect();
    let err = json_schema_to_grammar(&json!({"type": "object", "properties": props}), &opts())
        .unwrap_err();
    assert!(matches!(err, SchemaError::TooManyRules { .. }), "{err}");
}
