//! A fuzz-style property test for CI (the real fuzzer lives in /fuzz): mutate small valid files
//! thousands of times with a fixed seed. Parsing must never panic; whatever parses must write
//! back, and what is written must parse to a file that writes back to the same bytes.

mod common;

use common::{Rng, sample_file};
use lamina_gguf::{Gguf, GgufWriter};

/// Values that tend to sit on boundaries of counts, lengths, types and offsets.
const INTERESTING: [u64; 12] = [
    0,
    1,
    2,
    4,
    8,
    13,
    32,
    0x7F,
    0xFF,
    1 << 32,
    i64::MAX as u64,
    u64::MAX,
];

fn mutate(rng: &mut Rng, base: &[u8]) -> Vec<u8> {
    let mut bytes = base.to_vec();
    for _ in 0..1 + rng.below(4) {
        if bytes.is_empty() {
            break;
        }
        let at = rng.below(bytes.len());
        match rng.below(6) {
            0 => bytes[at] ^= 1 << rng.below(8),
            1 => bytes[at] = rng.next_u64() as u8,
            2 => {
                // Overwrite a little-endian word with a boundary value.
                let v = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
                let n = [1, 4, 8][rng.below(3)].min(bytes.len() - at);
                bytes[at..at + n].copy_from_slice(&v[..n]);
            }
            3 => bytes.truncate(at),
            4 => {
                let n = rng.below(16);
                bytes.splice(at..at, std::iter::repeat_n(rng.next_u64() as u8, n));
            }
            _ => {
                let end = (at + 1 + rng.below(16)).min(bytes.len());
                bytes.drain(at..end);
            }
        }
    }
    bytes
}

fn check(bytes: &[u8]) -> bool {
    let Ok(g) = Gguf::parse(bytes) else {
        return false;
    };
    let mut first = Vec::new();
    GgufWriter::from_parts(&g, bytes)
        .expect("a parsed file is writable")
        .write_to(&mut first)
        .unwrap();
    let g2 = Gguf::parse(&first).expect("what the writer writes parses");
    assert_eq!(g2.tensors.len(), g.tensors.len());
    assert_eq!(g2.metadata.len(), g.metadata.len());
    let mut second = Vec::new();
    GgufWriter::from_parts(&g2, &first)
        .unwrap()
        .write_to(&mut second)
        .unwrap();
    assert_eq!(first, second, "writing is idempotent");
    true
}

#[test]
fn mutated_files_never_panic() {
    let mut seeds = vec![sample_file()];
    // A vocab file's head (cut, so mostly invalid past it) when shared data is there.
    if let Some(v) = common::vocab_files().first() {
        let bytes = std::fs::read(v).unwrap();
        seeds.push(bytes[..bytes.len().min(4096)].to_vec());
    }
    let mut rng = Rng(0x5EED_1A41_4A00_0001);
    let mut parsed = 0;
    const ITERATIONS: usize = 5000;
    for i in 0..ITERATIONS {
        let base = &seeds[i % seeds.len()];
        let bytes = mutate(&mut rng, base);
        if check(&bytes) {
            parsed += 1;
        }
    }
    eprintln!("{parsed} of {ITERATIONS} mutated files still parsed and round-tripped");
    // Some mutations (e.g. of tensor bytes or string contents) leave a valid file: the writer
    // path must have been exercised, not only the error paths.
    assert!(parsed > 50, "only {parsed} mutants parsed");
}

/// Regenerates the fuzzer's committed seed corpus (`fuzz/seeds/parse`): small hand-made valid
/// files and the heads of the vocab files and test models. No `.gguf` extension, which the
/// repository ignores. Run by hand:
/// `cargo test -p lamina-gguf --test fuzz_property -- --ignored write_fuzz_seeds`.
#[test]
#[ignore = "writes into the source tree; run by hand to refresh the fuzz seeds"]
fn write_fuzz_seeds() {
    use lamina_core::DType;
    use lamina_gguf::{Array, Metadata, Value};

    let dir = std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/seeds/parse"
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let save = |name: &str, bytes: &[u8]| {
        assert!(bytes.len() < 64 * 1024, "{name}: seeds stay small");
        std::fs::write(dir.join(name), bytes).unwrap();
    };
    save("sample", &sample_file());

    let mut v2 = Vec::new();
    GgufWriter::new(Metadata::default())
        .with_version(2)
        .unwrap()
        .write_to(&mut v2)
        .unwrap();
    save("empty-v2", &v2);

    let mut m = Metadata::default();
    m.set("general.architecture", Value::String("llama".into()));
    m.set("general.alignment", Value::U32(8));
    for (k, v) in [
        ("u8", Value::U8(1)),
        ("i8", Value::I8(-1)),
        ("u16", Value::U16(2)),
        ("i16", Value::I16(-2)),
        ("i32", Value::I32(-3)),
        ("f32", Value::F32(0.5)),
        ("bool", Value::Bool(true)),
        ("u64", Value::U64(4)),
        ("i64", Value::I64(-4)),
        ("f64", Value::F64(0.25)),
        (
            "tokens",
            Value::Array(Array::String(["<s>", "a", "é"].into_iter().collect())),
        ),
        ("scores", Value::Array(Array::F32(vec![0.0, -1.0, -2.0]))),
        ("types", Value::Array(Array::I32(vec![3, 1, 1]))),
        (
            "nested",
            Value::Array(Array::Array(vec![
                Array::U16(vec![1, 2]),
                Array::Array(vec![Array::Bool(vec![true])]),
            ])),
        ),
    ] {
        m.set(k, v);
    }
    let f = [0x3Cu8; 16];
    let q = [0x11u8; 144];
    let mut w = GgufWriter::new(m.clone());
    w.add_tensor("token_embd.weight", DType::F16, &[4, 2], &f)
        .unwrap();
    w.add_tensor("blk.0.ffn.weight", DType::Q4_K, &[256], &q)
        .unwrap();
    w.add_tensor("empty", DType::Q8_0, &[32, 0], &[]).unwrap();
    let mut every = Vec::new();
    w.write_to(&mut every).unwrap();
    save("every-type", &every);

    let mut deep = Array::I8(vec![1]);
    for _ in 1..lamina_gguf::MAX_ARRAY_NESTING {
        deep = Array::Array(vec![deep]);
    }
    let mut m = Metadata::default();
    m.set("deep", Value::Array(deep));
    let mut nested = Vec::new();
    GgufWriter::new(m).write_to(&mut nested).unwrap();
    save("deepest-nesting", &nested);

    let head = |path: &std::path::Path, n: usize| {
        let bytes = std::fs::read(path).unwrap();
        bytes[..n.min(bytes.len())].to_vec()
    };
    for v in common::vocab_files().iter().take(3) {
        let name = format!("head-{}", v.file_stem().unwrap().to_string_lossy());
        save(&name, &head(v, 16 * 1024));
    }
    for model in ["smollm2-135m", "gemma3-270m"] {
        if let Some(p) = common::test_model(model) {
            save(&format!("head-{model}"), &head(&p, 32 * 1024));
        }
    }
}
