//! Hostile and malformed GGUF files: each must give a typed error naming what is wrong, never a
//! panic. Every file here is built by hand, byte by byte.

mod common;

use common::{Bytes, enc_str, sample_file, tt, ty};
use lamina_core::DType;
use lamina_gguf::{
    Array, Gguf, GgufError, GgufFile, MAX_ARRAY_NESTING, MetadataError, StrArray, Value,
};

fn parse_err(bytes: &[u8]) -> GgufError {
    match Gguf::parse(bytes) {
        Ok(g) => panic!("expected an error, parsed {g:?}"),
        Err(e) => {
            // Every error must render a message (and rendering must not panic either).
            assert!(!e.to_string().is_empty());
            e
        }
    }
}

/// A header plus one tensor-table entry, then padding and `data_len` bytes of data.
fn one_tensor(name: &str, dims: &[u64], type_id: u32, offset: u64, data_len: usize) -> Vec<u8> {
    let mut b = Bytes::header(3, 1, 0);
    b.tensor(name, dims, type_id, offset)
        .pad(32)
        .zeros(data_len);
    b.bytes()
}

#[test]
fn sample_file_parses() {
    let bytes = sample_file();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 64);
    assert_eq!(g.metadata.len(), 7);
    assert_eq!(g.tensors.len(), 3);
    assert_eq!(g.tensors[1].dtype, DType::Q4_0);
    assert_eq!(g.tensors[1].size, 36);
    assert_eq!(g.tensors[1].offset, 64);
    assert_eq!(g.data_offset % 64, 0);
    assert_eq!(g.data_offset + 128, bytes.len() as u64);
}

#[test]
fn bad_magic() {
    let mut bytes = sample_file();
    bytes[..4].copy_from_slice(b"GGML");
    assert!(matches!(parse_err(&bytes), GgufError::BadMagic { found } if &found == b"GGML"));
    let e = parse_err(b"\x00\x01\x02\x03rest of a file that is not gguf");
    assert!(e.to_string().contains("not a GGUF file"), "{e}");
}

#[test]
fn unsupported_versions() {
    for version in [0u32, 1, 4, 0xFFFF_FFFF] {
        let bytes = Bytes::header(version, 0, 0).bytes();
        match parse_err(&bytes) {
            GgufError::UnsupportedVersion(v) => assert_eq!(v, version),
            GgufError::BigEndian(_) if version == 0 => {}
            e => panic!("version {version}: unexpected {e:?}"),
        }
    }
}

#[test]
fn big_endian_file() {
    // A big-endian writer stores every field big-endian, the version included.
    let mut b = Bytes::default();
    b.raw(b"GGUF")
        .raw(&3u32.to_be_bytes())
        .raw(&0u64.to_be_bytes())
        .raw(&0u64.to_be_bytes());
    let e = parse_err(&b.bytes());
    assert!(matches!(e, GgufError::BigEndian(0x0300_0000)), "{e:?}");
    assert!(e.to_string().contains("big-endian"));
}

#[test]
fn truncated_at_every_offset() {
    let bytes = sample_file();
    for cut in 0..bytes.len() {
        let e = parse_err(&bytes[..cut]);
        assert!(
            matches!(
                e,
                GgufError::Truncated { .. }
                    | GgufError::CountTooLarge { .. }
                    | GgufError::TensorOutOfBounds { .. }
            ),
            "cut at {cut}: unexpected {e:?}"
        );
    }
    // And through the file API, on disk.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.gguf");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert!(GgufFile::open(&path).is_err());
}

#[test]
fn truncation_errors_name_the_section() {
    let bytes = sample_file();
    let e = parse_err(&bytes[..10]);
    assert!(
        matches!(
            e,
            GgufError::Truncated {
                section: "header",
                offset: 8,
                needed: 8,
                available: 2
            }
        ),
        "{e:?}"
    );
    // Too few bytes left for the 7 entries the header announces.
    let e = parse_err(&bytes[..24 + 8 + 5]);
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                what: "metadata key/value",
                count: 7,
                offset: 24,
                ..
            }
        ),
        "{e:?}"
    );
    // Inside the last tensor's offset field.
    let name_at = bytes.windows(5).position(|w| w == b"empty").unwrap();
    let table_end = name_at + 5 + 4 + 2 * 8 + 4 + 8;
    let e = parse_err(&bytes[..table_end - 3]);
    assert!(
        matches!(e, GgufError::Truncated { section: "tensor info", needed: 8, available: 5, offset } if offset as usize == table_end - 8),
        "{e:?}"
    );
    // Inside the data section: the last tensor no longer fits.
    let e = parse_err(&bytes[..bytes.len() - 1]);
    assert!(
        matches!(&e, GgufError::TensorOutOfBounds { tensor, .. } if tensor == "empty"),
        "{e:?}"
    );
    let e = parse_err(&[]);
    assert!(
        matches!(
            e,
            GgufError::Truncated {
                section: "header",
                offset: 0,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn empty_file_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.gguf");
    std::fs::write(&path, b"").unwrap();
    let e = GgufFile::open(&path)
        .err()
        .expect("an empty file is an error");
    assert!(matches!(e, GgufError::Truncated { .. }), "{e:?}");
}

#[test]
fn missing_file_names_the_path() {
    let e = GgufFile::open("/nonexistent/dir/model.gguf").err().unwrap();
    assert!(
        matches!(&e, GgufError::Io { path, .. } if path == "/nonexistent/dir/model.gguf"),
        "{e:?}"
    );
}

#[test]
fn counts_larger_than_the_file() {
    let e = parse_err(&Bytes::header(3, 0, u64::MAX).bytes());
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                what: "metadata key/value",
                count: u64::MAX,
                ..
            }
        ),
        "{e:?}"
    );
    let e = parse_err(&Bytes::header(3, 1 << 40, 0).bytes());
    assert!(
        matches!(e, GgufError::CountTooLarge { what: "tensor", .. }),
        "{e:?}"
    );

    // Tensor count that fits the whole file but not what is left after the metadata.
    let mut b = Bytes::header(3, 3, 1);
    b.kv_str("k", &"x".repeat(80));
    b.tensor("t", &[1], tt::F32, 0);
    let e = parse_err(&b.bytes());
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                what: "tensor",
                count: 3,
                ..
            }
        ),
        "{e:?}"
    );

    // String length.
    let mut b = Bytes::header(3, 0, 1);
    b.str("k").u32(ty::STRING).u64(u64::MAX - 3).raw(b"abc");
    let e = parse_err(&b.bytes());
    assert!(
        matches!(e, GgufError::CountTooLarge { what: "string length", count, .. } if count == u64::MAX - 3),
        "{e:?}"
    );

    // Key length.
    let mut b = Bytes::header(3, 0, 1);
    b.u64(1 << 50).raw(b"key").zeros(16);
    let e = parse_err(&b.bytes());
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                what: "string length",
                ..
            }
        ),
        "{e:?}"
    );

    // Array lengths, for fixed-size, string and array elements.
    for (etype, len) in [
        (ty::U8, 100u64),
        (ty::U64, u64::MAX / 4),
        (ty::STRING, 1 << 61),
        (ty::ARRAY, 1 << 60),
    ] {
        let mut b = Bytes::header(3, 0, 1);
        b.str("arr").u32(ty::ARRAY).u32(etype).u64(len).zeros(16);
        let e = parse_err(&b.bytes());
        assert!(
            matches!(e, GgufError::CountTooLarge { what: "array length", count, .. } if count == len),
            "{e:?}"
        );
    }

    // Tensor name length.
    let mut b = Bytes::header(3, 1, 0);
    b.u64(u64::MAX).zeros(40);
    let e = parse_err(&b.bytes());
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                what: "string length",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn invalid_utf8() {
    let mut b = Bytes::header(3, 0, 1);
    b.str_bytes(b"bad\xFFkey").u32(ty::U8).u8(0);
    let e = parse_err(&b.bytes());
    assert!(
        matches!(
            e,
            GgufError::InvalidUtf8 {
                what: "metadata key",
                offset: 32
            }
        ),
        "{e:?}"
    );

    let mut b = Bytes::header(3, 0, 1);
    b.str("k").u32(ty::STRING).str_bytes(b"\xC3\x28");
    let e = parse_err(&b.bytes());
    assert!(
        matches!(
            e,
            GgufError::InvalidUtf8 {
                what: "metadata string value",
                ..
            }
        ),
        "{e:?}"
    );

    let mut b = Bytes::header(3, 1, 0);
    b.str_bytes(b"\xE2\x82name")
        .u32(1)
        .u64(1)
        .u32(tt::F32)
        .u64(0)
        .pad(32)
        .zeros(4);
    let e = parse_err(&b.bytes());
    assert!(
        matches!(
            e,
            GgufError::InvalidUtf8 {
                what: "tensor name",
                ..
            }
        ),
        "{e:?}"
    );
}

/// A string array is checked string by string, before its buffers are allocated: the first bad
/// element is reported at its own offset.
#[test]
fn bad_element_of_a_string_array() {
    // Header 24 bytes, key "k" 9, value type 4, element type 4, count 8: elements at 49.
    let mut b = Bytes::header(3, 0, 1);
    b.str("k").u32(ty::ARRAY).u32(ty::STRING).u64(3);
    b.str("ok").str_bytes(b"\xC3\x28").str("never read");
    let e = parse_err(&b.bytes());
    assert!(
        matches!(
            e,
            GgufError::InvalidUtf8 {
                what: "metadata string value",
                offset: 67
            }
        ),
        "{e:?}"
    );

    let mut b = Bytes::header(3, 0, 1);
    b.str("k").u32(ty::ARRAY).u32(ty::STRING).u64(2);
    b.str("ok").u64(1 << 40).raw(b"short");
    let e = parse_err(&b.bytes());
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                what: "string length",
                count: 1099511627776,
                offset: 67,
                remaining: 5
            }
        ),
        "{e:?}"
    );
}

#[test]
fn string_arrays_read_back() {
    let mut b = Bytes::header(3, 0, 1);
    b.str("k").u32(ty::ARRAY).u32(ty::STRING).u64(4);
    b.str("a").str("").str("▁héllo").str("<0x0A>");
    let g = Gguf::parse(&b.bytes()).unwrap();
    let a = g.metadata.get_str_array("k").unwrap().unwrap();
    assert_eq!(a.len(), 4);
    assert_eq!(a.text_len(), 1 + 9 + 6);
    assert_eq!(a.iter().collect::<Vec<_>>(), ["a", "", "▁héllo", "<0x0A>"]);
    assert_eq!(a.iter().len(), 4);
    assert_eq!(
        (a.get(1), a.get(2), a.get(4)),
        (Some(""), Some("▁héllo"), None)
    );
    assert_eq!(&a[3], "<0x0A>");
    assert_eq!(
        a,
        &["a", "", "▁héllo", "<0x0A>"]
            .into_iter()
            .collect::<StrArray>()
    );
    assert_ne!(a, &["a", "", "▁héllo"].into_iter().collect::<StrArray>());
    assert_eq!(format!("{a:?}"), r#"["a", "", "▁héllo", "<0x0A>"]"#);
    assert_eq!(
        g.metadata.get_array("k").unwrap().unwrap().get(2),
        Some(Value::String("▁héllo".into()))
    );
    let empty = StrArray::from(Vec::<String>::new());
    assert!(empty.is_empty() && empty.iter().next().is_none());
}

#[test]
fn duplicate_keys() {
    let mut b = Bytes::header(3, 0, 3);
    b.kv_u32("a", 1).kv_u32("b", 2).kv_str("a", "again");
    assert!(matches!(parse_err(&b.bytes()), GgufError::DuplicateKey(k) if k == "a"));
}

#[test]
fn duplicate_tensor_names() {
    let mut b = Bytes::header(3, 2, 0);
    b.tensor("w", &[8], tt::F32, 0)
        .tensor("w", &[8], tt::F32, 32)
        .pad(32)
        .zeros(64);
    assert!(matches!(parse_err(&b.bytes()), GgufError::DuplicateTensor(n) if n == "w"));
}

#[test]
fn unknown_value_type() {
    let mut b = Bytes::header(3, 0, 1);
    b.kv("strange", 13, &[0; 8]);
    let e = parse_err(&b.bytes());
    assert!(
        matches!(&e, GgufError::UnknownValueType { key, type_id: 13 } if key == "strange"),
        "{e:?}"
    );

    // As an array's element type.
    let mut b = Bytes::header(3, 0, 1);
    b.str("arr").u32(ty::ARRAY).u32(0xFFFF).u64(0);
    let e = parse_err(&b.bytes());
    assert!(
        matches!(&e, GgufError::UnknownValueType { key, type_id: 0xFFFF } if key == "arr"),
        "{e:?}"
    );
}

#[test]
fn bad_dimension_counts() {
    for n_dims in [0u32, 5, u32::MAX] {
        let mut b = Bytes::header(3, 1, 0);
        b.str("t").u32(n_dims).zeros(64);
        let e = parse_err(&b.bytes());
        assert!(
            matches!(&e, GgufError::BadDimCount { tensor, n_dims: n } if tensor == "t" && *n == n_dims),
            "{e:?}"
        );
    }
}

#[test]
fn shape_overflow() {
    // Element count past u64.
    let e = parse_err(&one_tensor("t", &[1 << 32, 1 << 32], tt::F32, 0, 0));
    assert!(
        matches!(&e, GgufError::ShapeOverflow { tensor, shape } if tensor == "t" && shape == &[1 << 32, 1 << 32]),
        "{e:?}"
    );
    // Element count fits, byte size does not.
    let e = parse_err(&one_tensor("t", &[1 << 62], tt::F32, 0, 0));
    assert!(matches!(e, GgufError::ShapeOverflow { .. }), "{e:?}");
    let e = parse_err(&one_tensor("t", &[256, 1 << 62, 4], tt::F16, 0, 0));
    assert!(matches!(e, GgufError::ShapeOverflow { .. }), "{e:?}");
    // A dimension that is negative as ggml's int64_t.
    let e = parse_err(&one_tensor("t", &[4, 1 << 63], tt::F32, 0, 0));
    assert!(
        matches!(e, GgufError::DimTooLarge { dim: 1, value, .. } if value == 1 << 63),
        "{e:?}"
    );
    // Huge but non-overflowing: out of bounds, not an allocation.
    let e = parse_err(&one_tensor(
        "t",
        &[1 << 20, 1 << 20, 1 << 10],
        tt::F32,
        0,
        0,
    ));
    assert!(
        matches!(e, GgufError::TensorOutOfBounds { end, .. } if end == 1 << 52),
        "{e:?}"
    );
}

#[test]
fn zero_dimension_is_an_empty_tensor() {
    let mut b = Bytes::header(3, 2, 0);
    b.tensor("empty", &[4096, 0], tt::Q4_0, 0)
        .tensor("w", &[2], tt::F32, 0)
        .pad(32)
        .raw(&[1, 2, 3, 4, 5, 6, 7, 8]);
    let bytes = b.bytes();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.tensors[0].n_elements(), 0);
    assert_eq!(g.tensors[0].size, 0);
    assert_eq!(g.tensors[0].dims(), &[4096, 0]);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty-tensor.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let (info, data) = f.tensor_by_name("empty").unwrap();
    assert_eq!(info.size, 0);
    assert!(data.is_empty());
    assert_eq!(f.tensor_by_name("w").unwrap().1, &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert!(matches!(f.tensor_by_name("nope"), Err(GgufError::NoSuchTensor(n)) if n == "nope"));
}

#[test]
fn unknown_tensor_type() {
    // 4, 5 and 31..=33, 36..=38 are ids ggml retired; 43 is past the newest (Q2_0).
    for type_id in [4u32, 5, 31, 36, 38, 43, u32::MAX] {
        let e = parse_err(&one_tensor("t", &[32], type_id, 0, 128));
        assert!(
            matches!(&e, GgufError::UnknownTensorType { tensor, type_id: id } if tensor == "t" && *id == type_id),
            "{e:?}"
        );
    }
}

#[test]
fn newest_tensor_types_parse_with_ggml_sizes() {
    // (id, elements, bytes): TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0 as in ggml 0c1e570.
    for (type_id, n, size) in [
        (34u32, 256u64, 54u64),
        (35, 256, 66),
        (39, 64, 34),
        (40, 128, 72),
        (41, 256, 36),
        (42, 128, 36),
    ] {
        let g = Gguf::parse(&one_tensor("t", &[n], type_id, 0, 128)).unwrap();
        assert_eq!(g.tensors[0].dtype.id(), type_id);
        assert_eq!(g.tensors[0].size, size, "type {type_id}");
        // Not a whole number of blocks.
        let e = parse_err(&one_tensor("t", &[n / 2 + 1], type_id, 0, 128));
        assert!(matches!(e, GgufError::RowNotBlockMultiple { .. }), "{e:?}");
    }
}

#[test]
fn row_not_a_block_multiple() {
    let e = parse_err(&one_tensor("q", &[33, 2], tt::Q4_0, 0, 128));
    assert!(
        matches!(&e, GgufError::RowNotBlockMultiple { tensor, dtype: DType::Q4_0, row: 33, block: 32 } if tensor == "q"),
        "{e:?}"
    );
    assert!(e.to_string().contains("block size 32"), "{e}");
}

#[test]
fn bad_alignment() {
    for a in [0u32, 3, 48, 0x8000_0001] {
        let mut b = Bytes::header(3, 0, 1);
        b.kv_u32("general.alignment", a);
        assert!(matches!(parse_err(&b.bytes()), GgufError::BadAlignment(x) if x == u64::from(a)));
    }
    let mut b = Bytes::header(3, 0, 1);
    b.kv("general.alignment", ty::U64, &32u64.to_le_bytes());
    let e = parse_err(&b.bytes());
    assert!(
        matches!(&e, GgufError::BadMetadata { key, .. } if key == "general.alignment"),
        "{e:?}"
    );
}

#[test]
fn custom_alignment_is_honoured() {
    let mut b = Bytes::header(3, 1, 1);
    b.kv_u32("general.alignment", 256)
        .tensor("t", &[4], tt::F32, 0)
        .pad(256)
        .raw(&[9; 16]);
    let bytes = b.bytes();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!((g.alignment, g.data_offset), (256, 256));
}

#[test]
fn misaligned_offset() {
    let e = parse_err(&one_tensor("t", &[4], tt::F32, 16, 64));
    assert!(
        matches!(&e, GgufError::MisalignedOffset { tensor, offset: 16, alignment: 32 } if tensor == "t"),
        "{e:?}"
    );
}

#[test]
fn tensor_outside_the_file() {
    let e = parse_err(&one_tensor("t", &[16], tt::F32, 32, 64));
    assert!(
        matches!(&e, GgufError::TensorOutOfBounds { tensor, start: 32, end: 96, data_len: 64 } if tensor == "t"),
        "{e:?}"
    );
    let e = parse_err(&one_tensor("t", &[4], tt::F32, u64::MAX - 31, 64));
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e:?}");
    // Tensors but no data section at all (the file stops before the padding).
    let mut b = Bytes::header(3, 1, 0);
    b.tensor("t", &[4], tt::F32, 0);
    let e = parse_err(&b.bytes());
    assert!(
        matches!(
            e,
            GgufError::Truncated {
                section: "padding before tensor data",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn overlapping_tensors() {
    let mut b = Bytes::header(3, 2, 0);
    b.tensor("a", &[16], tt::F32, 0)
        .tensor("b", &[8], tt::F32, 32)
        .pad(32)
        .zeros(128);
    let e = parse_err(&b.bytes());
    assert!(
        matches!(&e, GgufError::TensorOverlap { first, second } if first == "a" && second == "b"),
        "{e:?}"
    );
    // Same start.
    let mut b = Bytes::header(3, 2, 0);
    b.tensor("a", &[4], tt::F32, 32)
        .tensor("b", &[4], tt::F32, 32)
        .pad(32)
        .zeros(128);
    assert!(matches!(
        parse_err(&b.bytes()),
        GgufError::TensorOverlap { .. }
    ));
    // Touching is fine; so is an empty tensor anywhere inside another.
    let mut b = Bytes::header(3, 3, 0);
    b.tensor("a", &[8], tt::F32, 0)
        .tensor("b", &[8], tt::F32, 32)
        .tensor("e", &[0], tt::F32, 0)
        .pad(32)
        .zeros(64);
    Gguf::parse(&b.bytes()).unwrap();
}

/// `depth` nested arrays around an empty u8 array, as the value of key "deep".
fn nested(depth: usize) -> Vec<u8> {
    let mut b = Bytes::header(3, 0, 1);
    b.str("deep").u32(ty::ARRAY);
    for _ in 1..depth {
        b.u32(ty::ARRAY).u64(1);
    }
    b.u32(ty::U8).u64(0);
    b.bytes()
}

#[test]
fn array_nesting_bound() {
    let g = Gguf::parse(&nested(MAX_ARRAY_NESTING)).unwrap();
    let mut a = g.metadata.get_array("deep").unwrap().unwrap();
    for _ in 1..MAX_ARRAY_NESTING {
        match a {
            Array::Array(inner) => a = &inner[0],
            other => panic!("expected a nested array, found {other:?}"),
        }
    }
    assert_eq!(a, &Array::U8(vec![]));

    let e = parse_err(&nested(MAX_ARRAY_NESTING + 1));
    assert!(
        matches!(&e, GgufError::NestingTooDeep { key, max } if key == "deep" && *max == MAX_ARRAY_NESTING),
        "{e:?}"
    );
    // Far deeper than the bound: refused at the bound, no deep recursion.
    let e = parse_err(&nested(100_000));
    assert!(matches!(e, GgufError::NestingTooDeep { .. }), "{e:?}");
}

#[test]
fn every_value_type_reads_back() {
    let mut b = Bytes::header(2, 0, 14);
    b.kv("u8", ty::U8, &[200])
        .kv("i8", ty::I8, &[0x80])
        .kv("u16", ty::U16, &60000u16.to_le_bytes())
        .kv("i16", ty::I16, &(-300i16).to_le_bytes())
        .kv("u32", ty::U32, &4_000_000_000u32.to_le_bytes())
        .kv("i32", ty::I32, &(-5i32).to_le_bytes())
        .kv("f32", ty::F32, &0.25f32.to_le_bytes())
        .kv("bool", ty::BOOL, &[0])
        .kv("string", ty::STRING, &enc_str("héllo"))
        .kv("u64", ty::U64, &u64::MAX.to_le_bytes())
        .kv("i64", ty::I64, &i64::MIN.to_le_bytes())
        .kv("f64", ty::F64, &(-2.5f64).to_le_bytes());
    b.str("f32s")
        .u32(ty::ARRAY)
        .u32(ty::F32)
        .u64(2)
        .raw(&1.0f32.to_le_bytes())
        .raw(&2.0f32.to_le_bytes());
    // [[true, false], ["x"], [[1i16]], []] — an array of arrays of differing element types.
    b.str("nested").u32(ty::ARRAY).u32(ty::ARRAY).u64(4);
    b.u32(ty::BOOL).u64(2).u8(1).u8(0);
    b.u32(ty::STRING).u64(1).str("x");
    b.u32(ty::ARRAY)
        .u64(1)
        .u32(ty::I16)
        .u64(1)
        .raw(&1i16.to_le_bytes());
    b.u32(ty::I64).u64(0);
    let g = Gguf::parse(&b.bytes()).unwrap();
    assert_eq!(g.version, 2);
    let m = &g.metadata;
    let expect = [
        ("u8", Value::U8(200)),
        ("i8", Value::I8(-128)),
        ("u16", Value::U16(60000)),
        ("i16", Value::I16(-300)),
        ("u32", Value::U32(4_000_000_000)),
        ("i32", Value::I32(-5)),
        ("f32", Value::F32(0.25)),
        ("bool", Value::Bool(false)),
        ("string", Value::String("héllo".into())),
        ("u64", Value::U64(u64::MAX)),
        ("i64", Value::I64(i64::MIN)),
        ("f64", Value::F64(-2.5)),
        ("f32s", Value::Array(Array::F32(vec![1.0, 2.0]))),
        (
            "nested",
            Value::Array(Array::Array(vec![
                Array::Bool(vec![true, false]),
                Array::String(["x"].into_iter().collect()),
                Array::Array(vec![Array::I16(vec![1])]),
                Array::I64(vec![]),
            ])),
        ),
    ];
    let keys: Vec<&str> = m.entries().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        expect.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        "file order is kept"
    );
    for (key, value) in &expect {
        assert_eq!(m.get(key), Some(value), "{key}");
    }
    assert_eq!(m.get_u32("u32").unwrap(), Some(4_000_000_000));
    assert_eq!(m.get_u32("u8").unwrap(), Some(200));
    assert_eq!(m.get_f32("f32").unwrap(), Some(0.25));
    assert_eq!(m.get_f32_array("f32s").unwrap(), Some(&[1.0f32, 2.0][..]));
    assert_eq!(m.get_bool("bool").unwrap(), Some(false));
    assert_eq!(m.require_str("string").unwrap(), "héllo");
    assert_eq!(m.get_str("absent").unwrap(), None);
}

#[test]
fn typed_accessor_errors_name_key_and_type() {
    let mut b = Bytes::header(3, 0, 3);
    b.kv_str("name", "x")
        .kv("neg", ty::I32, &(-1i32).to_le_bytes())
        .kv_u32("n", 7);
    let g = Gguf::parse(&b.bytes()).unwrap();
    let m = &g.metadata;

    let e = m.get_u32("name").unwrap_err();
    assert_eq!(
        e,
        MetadataError::WrongType {
            key: "name".into(),
            expected: "an integer in u32 range",
            found: "string".into()
        }
    );
    assert_eq!(
        e.to_string(),
        "metadata key \"name\" should be an integer in u32 range, found string"
    );
    assert!(matches!(m.get_u32("neg"), Err(MetadataError::WrongType { key, .. }) if key == "neg"));
    assert!(
        matches!(m.get_str("n"), Err(MetadataError::WrongType { key, expected: "a string", found }) if key == "n" && found == "u32")
    );
    assert!(matches!(
        m.get_str_array("n"),
        Err(MetadataError::WrongType {
            expected: "an array of strings",
            ..
        })
    ));
    assert!(matches!(
        m.get_bool("n"),
        Err(MetadataError::WrongType {
            expected: "a bool",
            ..
        })
    ));
    assert!(matches!(
        m.get_f32_array("n"),
        Err(MetadataError::WrongType {
            expected: "an array of f32",
            ..
        })
    ));
    assert!(matches!(
        m.get_i32_array("n"),
        Err(MetadataError::WrongType {
            expected: "an array of i32",
            ..
        })
    ));
    assert!(matches!(
        m.get_array("n"),
        Err(MetadataError::WrongType {
            expected: "an array",
            ..
        })
    ));
    assert!(matches!(
        m.get_f32("name"),
        Err(MetadataError::WrongType {
            expected: "a number",
            ..
        })
    ));
    assert_eq!(
        m.require_u32("missing").unwrap_err(),
        MetadataError::Missing("missing".into())
    );
    assert_eq!(
        m.require_str("missing").unwrap_err().to_string(),
        "metadata key \"missing\" is missing"
    );
    // Converts into GgufError for `?` in loaders.
    let e: GgufError = m.require_f32("missing").unwrap_err().into();
    assert!(e.to_string().contains("missing"));
}

#[test]
fn v2_file_loads() {
    let mut bytes = sample_file();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.version, 2);
    assert_eq!(g.tensors.len(), 3);
}
