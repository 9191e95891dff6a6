//! The writer: read → write → read, byte for byte, for hand-made files, every vocab file and the
//! test models; and what the writer refuses.

mod common;

use std::io::{self, Write};
use std::path::Path;

use common::{sample_file, test_model, vocab_files};
use lamina_core::DType;
use lamina_gguf::{
    Array, Gguf, GgufError, GgufFile, GgufStreamWriter, GgufWriter, MAX_ARRAY_NESTING, Metadata,
    TensorHeader, TensorToWrite, Value, write_gguf,
};
use sha2::{Digest, Sha256};

/// Hashes what is written and compares it, as it streams, with the original file, so neither
/// copy is ever held in memory and a mismatch reports its first offset.
struct CompareWriter<'a> {
    expected: &'a [u8],
    hasher: Sha256,
    pos: usize,
    first_mismatch: Option<usize>,
}

impl Write for CompareWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.hasher.update(buf);
        if self.first_mismatch.is_none() {
            let end = (self.pos + buf.len()).min(self.expected.len());
            let same = &self.expected[self.pos.min(end)..end];
            if let Some(i) = same.iter().zip(buf).position(|(a, b)| a != b) {
                self.first_mismatch = Some(self.pos + i);
            } else if same.len() < buf.len() {
                self.first_mismatch = Some(self.expected.len());
            }
        }
        self.pos += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Opens `path`, writes it back through [`GgufWriter`], and checks the stream is the file.
fn assert_round_trips(path: &Path) {
    let file = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = CompareWriter {
        expected: file.bytes(),
        hasher: Sha256::new(),
        pos: 0,
        first_mismatch: None,
    };
    let written = GgufWriter::from_file(&file).write_to(&mut out).unwrap();
    let name = path.display();
    check_stream(&file, &out, written);
    assert_eq!(written, out.pos as u64);
    assert_eq!(out.first_mismatch, None, "{name}: first differing byte");
    assert_eq!(written, file.bytes().len() as u64, "{name}: length");
    let file_hash = Sha256::digest(file.bytes());
    assert_eq!(
        out.hasher.finalize(),
        file_hash,
        "{name}: sha256 of the written stream"
    );
}

/// The same file through [`GgufStreamWriter`], one tensor at a time, gives the same stream.
fn check_stream(file: &GgufFile, whole: &CompareWriter<'_>, written: u64) {
    let g = file.gguf();
    let table: Vec<TensorHeader> = g
        .tensors
        .iter()
        .map(|t| TensorHeader {
            name: t.name.clone(),
            dtype: t.dtype,
            dims: t.dims().to_vec(),
        })
        .collect();
    let mut out = CompareWriter {
        expected: file.bytes(),
        hasher: Sha256::new(),
        pos: 0,
        first_mismatch: None,
    };
    if g.version != 3 {
        return; // the stream writer writes v3 only
    }
    let mut stream = GgufStreamWriter::new(&mut out, &g.metadata, &table).unwrap();
    for t in &g.tensors {
        stream.write_tensor(file.tensor_data(t)).unwrap();
    }
    let streamed = stream.finish().unwrap();
    assert_eq!(streamed, written, "{}", file.path().display());
    assert_eq!(out.first_mismatch, whole.first_mismatch);
}

#[test]
fn stream_writer_checks_what_it_is_given() {
    let m = Metadata::default();
    let table = [TensorHeader {
        name: "w".into(),
        dtype: DType::F32,
        dims: vec![4],
    }];
    let mut out = Vec::new();
    let mut s = GgufStreamWriter::new(&mut out, &m, &table).unwrap();
    assert!(matches!(
        s.write_tensor(&[0u8; 8]),
        Err(GgufError::TensorDataSize {
            expected: 16,
            actual: 8,
            ..
        })
    ));
    s.write_tensor(&[0u8; 16]).unwrap();
    assert!(matches!(
        s.write_tensor(&[0u8; 16]),
        Err(GgufError::TensorCount {
            expected: 1,
            written: 2
        })
    ));
    s.finish().unwrap();
    let g = Gguf::parse(&out).unwrap();
    assert_eq!(g.tensors[0].dims(), &[4]);

    let mut out = Vec::new();
    let s = GgufStreamWriter::new(&mut out, &m, &table).unwrap();
    assert!(matches!(
        s.finish(),
        Err(GgufError::TensorCount {
            expected: 1,
            written: 0
        })
    ));
    let twice = [table[0].clone(), table[0].clone()];
    assert!(matches!(
        GgufStreamWriter::new(Vec::new(), &m, &twice),
        Err(GgufError::DuplicateTensor(_))
    ));
    let bad = [TensorHeader {
        name: "q".into(),
        dtype: DType::Q4_0,
        dims: vec![31],
    }];
    assert!(matches!(
        GgufStreamWriter::new(Vec::new(), &m, &bad),
        Err(GgufError::RowNotBlockMultiple { .. })
    ));
}

#[test]
fn metadata_remove_and_set_last_keep_order() {
    let mut m = Metadata::default();
    for (i, k) in ["a", "b", "c", "d"].iter().enumerate() {
        m.set(k, Value::U32(i as u32));
    }
    assert_eq!(m.remove("b"), Some(Value::U32(1)));
    assert_eq!(m.remove("b"), None);
    m.set_last("a", Value::U32(9));
    let keys: Vec<&str> = m.entries().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["c", "d", "a"]);
    assert_eq!(m.get("d"), Some(&Value::U32(3)));
    assert_eq!(m.get("a"), Some(&Value::U32(9)));
}

#[test]
fn sample_file_round_trips_byte_for_byte() {
    let bytes = sample_file();
    let g = Gguf::parse(&bytes).unwrap();
    let mut out = Vec::new();
    let n = GgufWriter::from_parts(&g, &bytes)
        .unwrap()
        .write_to(&mut out)
        .unwrap();
    assert_eq!(n, out.len() as u64);
    assert_eq!(out, bytes);
}

#[test]
fn vocab_files_round_trip_byte_for_byte() {
    let files = vocab_files();
    for path in &files {
        assert_round_trips(path);
    }
    eprintln!("{} vocab files round-tripped", files.len());
}

#[test]
fn smollm2_round_trips_byte_for_byte() {
    if let Some(path) = test_model("smollm2-135m") {
        assert_round_trips(&path);
    }
}

#[test]
fn gemma3_round_trips_byte_for_byte() {
    if let Some(path) = test_model("gemma3-270m") {
        assert_round_trips(&path);
    }
}

#[test]
fn written_from_scratch_reads_back() {
    let mut m = Metadata::default();
    m.set("general.architecture", Value::String("test".into()));
    m.set("general.alignment", Value::U32(16));
    m.set("u8", Value::U8(1));
    m.set("i8", Value::I8(-1));
    m.set("u16", Value::U16(2));
    m.set("i16", Value::I16(-2));
    m.set("u32", Value::U32(3));
    m.set("i32", Value::I32(-3));
    m.set("f32", Value::F32(f32::NAN));
    m.set("bool", Value::Bool(true));
    m.set("u64", Value::U64(u64::MAX));
    m.set("i64", Value::I64(-4));
    m.set("f64", Value::F64(1e300));
    m.set(
        "strings",
        Value::Array(Array::String(["a", "", "ü"].into_iter().collect())),
    );
    for (k, a) in [
        ("a.u8", Array::U8(vec![1, 2])),
        ("a.i8", Array::I8(vec![-1])),
        ("a.u16", Array::U16(vec![7])),
        ("a.i16", Array::I16(vec![-7])),
        ("a.u32", Array::U32(vec![8])),
        ("a.i32", Array::I32(vec![-8, 9])),
        ("a.f32", Array::F32(vec![0.5])),
        ("a.bool", Array::Bool(vec![false, true])),
        ("a.u64", Array::U64(vec![10])),
        ("a.i64", Array::I64(vec![-10])),
        ("a.f64", Array::F64(vec![0.125])),
        (
            "a.nested",
            Array::Array(vec![
                Array::U8(vec![]),
                Array::Array(vec![Array::String(["deep"].into_iter().collect())]),
            ]),
        ),
    ] {
        m.set(k, Value::Array(a));
    }
    let f32_data: Vec<u8> = (0..24).collect();
    let q_data = vec![7u8; 18 * 2];
    let tensors = vec![
        TensorToWrite {
            name: "f".into(),
            dtype: DType::F32,
            dims: vec![3, 2],
            data: &f32_data,
        },
        TensorToWrite {
            name: "q".into(),
            dtype: DType::Q4_0,
            dims: vec![32, 1, 2, 1],
            data: &q_data,
        },
        TensorToWrite {
            name: "e".into(),
            dtype: DType::F16,
            dims: vec![0],
            data: &[],
        },
    ];
    let mut out = Vec::new();
    write_gguf(&mut out, m.clone(), tensors).unwrap();

    let g = Gguf::parse(&out).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 16);
    assert_eq!(g.metadata.len(), m.len());
    for ((k1, v1), (k2, v2)) in g.metadata.entries().iter().zip(m.entries()) {
        assert_eq!(k1, k2);
        if let (Value::F32(a), Value::F32(b)) = (v1, v2) {
            assert_eq!(a.to_bits(), b.to_bits());
        } else {
            assert_eq!(v1, v2, "{k1}");
        }
    }
    let offsets: Vec<u64> = g.tensors.iter().map(|t| t.offset).collect();
    assert_eq!(offsets, [0, 32, 80]);
    assert_eq!(g.tensors[1].dims(), &[32, 1, 2, 1]);
    assert_eq!(g.data_offset % 16, 0);
    let d = |i: usize| {
        let t = &g.tensors[i];
        &out[(g.data_offset + t.offset) as usize..][..t.size as usize]
    };
    assert_eq!(d(0), &f32_data[..]);
    assert_eq!(d(1), &q_data[..]);
    // Zero padding between and after tensors; file ends on the alignment.
    assert!(
        out[(g.data_offset + 24) as usize..(g.data_offset + 32) as usize]
            .iter()
            .all(|&b| b == 0)
    );
    assert_eq!(out.len() as u64, g.data_offset + 80);

    // v2 as well.
    let mut v2 = Vec::new();
    GgufWriter::new(Metadata::default())
        .with_version(2)
        .unwrap()
        .write_to(&mut v2)
        .unwrap();
    assert_eq!(Gguf::parse(&v2).unwrap().version, 2);
    assert_eq!(
        v2.len(),
        24,
        "no tensors: no padding, as the vocab-only converter writes"
    );
}

#[test]
fn writer_refuses_what_readers_refuse() {
    let data = [0u8; 64];
    let mut w = GgufWriter::new(Metadata::default());
    w.add_tensor("t", DType::F32, &[4], &data[..16]).unwrap();
    assert!(
        matches!(w.add_tensor("t", DType::F32, &[4], &data[..16]), Err(GgufError::DuplicateTensor(n)) if n == "t")
    );
    assert!(matches!(
        w.add_tensor("s", DType::F32, &[4], &data[..15]),
        Err(GgufError::TensorDataSize {
            expected: 16,
            actual: 15,
            ..
        })
    ));
    assert!(matches!(
        w.add_tensor("d", DType::F32, &[], &[]),
        Err(GgufError::BadDimCount { n_dims: 0, .. })
    ));
    assert!(matches!(
        w.add_tensor("d", DType::F32, &[1; 5], &data[..4]),
        Err(GgufError::BadDimCount { n_dims: 5, .. })
    ));
    assert!(matches!(
        w.add_tensor("b", DType::Q4_0, &[16], &data[..9]),
        Err(GgufError::RowNotBlockMultiple { .. })
    ));
    assert!(matches!(
        w.add_tensor("o", DType::F32, &[1 << 62], &[]),
        Err(GgufError::ShapeOverflow { .. })
    ));
    assert!(matches!(
        w.add_tensor("o", DType::F32, &[1 << 63], &[]),
        Err(GgufError::DimTooLarge { .. })
    ));
    assert!(matches!(
        GgufWriter::new(Metadata::default()).with_version(1),
        Err(GgufError::UnsupportedVersion(1))
    ));

    w.metadata_mut().set("general.alignment", Value::U32(24));
    assert!(matches!(
        w.write_to(io::sink()),
        Err(GgufError::BadAlignment(24))
    ));
    w.metadata_mut().set("general.alignment", Value::U64(32));
    assert!(matches!(
        w.write_to(io::sink()),
        Err(GgufError::BadMetadata { .. })
    ));
    w.metadata_mut().set("general.alignment", Value::U32(32));
    w.write_to(io::sink()).unwrap();

    let mut deep = Array::U8(vec![]);
    for _ in 0..MAX_ARRAY_NESTING {
        deep = Array::Array(vec![deep]);
    }
    w.metadata_mut().set("deep", Value::Array(deep));
    assert!(
        matches!(w.write_to(io::sink()), Err(GgufError::NestingTooDeep { key, .. }) if key == "deep")
    );
}

#[test]
fn write_errors_are_typed() {
    struct Failing;
    impl Write for Failing {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("disk full"))
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::other("disk full"))
        }
    }
    let e = GgufWriter::new(Metadata::default())
        .write_to(Failing)
        .unwrap_err();
    assert!(
        matches!(&e, GgufError::Write(io) if io.to_string() == "disk full"),
        "{e:?}"
    );
}
