//! A fuzz-style property test for CI (the real fuzzer is fuzz/fuzz_targets/imatrix_reader.rs):
//! small valid and hostile imatrix files, GGUF and legacy `.dat`, mutated thousands of times
//! with a fixed seed, through the reader `lamina quantize --imatrix` uses. It never panics;
//! what it reads is well-formed, holds no more values than the file has bytes for (every size
//! comes from the file, so a claim larger than the file must be refused before allocating),
//! and writes back as a GGUF imatrix that reads back to the same values.
//!
//! The same seeds are the fuzzer's corpus (fuzz/seeds/imatrix_reader); refresh them with
//! `cargo test -p lamina-tools --test imatrix_fuzz_property -- --ignored write_fuzz_seeds`.

use std::collections::BTreeMap;
use std::path::Path;

use lamina_core::DType;
use lamina_gguf::{GgufWriter, Metadata, Value};
use lamina_tools::imatrix::{Imatrix, ImatrixEntry};

/// xorshift64: deterministic, no dependencies.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

fn entry(sums: &[f32], counts: &[f32]) -> ImatrixEntry {
    ImatrixEntry {
        sums: sums.to_vec(),
        counts: counts.to_vec(),
    }
}

fn gguf(m: &Imatrix) -> Vec<u8> {
    m.to_gguf_bytes().unwrap()
}

/// A legacy `.dat` file: `n_entries`, then per entry `len, name, ncall, nval, values`, then
/// optionally `chunk_count, len, dataset`.
fn legacy(
    n_entries: i32,
    entries: &[(&[u8], i32, &[f32])],
    trailer: Option<(i32, &[u8])>,
) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend(n_entries.to_le_bytes());
    for (name, ncall, vals) in entries {
        b.extend((name.len() as i32).to_le_bytes());
        b.extend(*name);
        b.extend(ncall.to_le_bytes());
        b.extend((vals.len() as i32).to_le_bytes());
        for v in *vals {
            b.extend(v.to_le_bytes());
        }
    }
    if let Some((chunks, dataset)) = trailer {
        b.extend(chunks.to_le_bytes());
        b.extend((dataset.len() as i32).to_le_bytes());
        b.extend(dataset);
    }
    b
}

/// A GGUF file with tensors written as given (names, types and shapes unchecked by us).
fn raw_gguf(metadata: Metadata, tensors: &[(&str, DType, &[u64], Vec<u8>)]) -> Vec<u8> {
    let mut w = GgufWriter::new(metadata);
    for (name, dtype, dims, data) in tensors {
        w.add_tensor(name.to_string(), *dtype, dims, data).unwrap();
    }
    let mut out = Vec::new();
    w.write_to(&mut out).unwrap();
    out
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The first `n` entries of a real llama-imatrix file in tests/data, kept small.
fn real_head(name: &str, n: usize) -> Option<Imatrix> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    let mut m = Imatrix::load(&path).ok()?;
    m.entries = m.entries.into_iter().take(n).collect();
    Some(m)
}

/// The seeds, by name: valid files of both formats, and truncated and hostile-size ones.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut entries = BTreeMap::new();
    entries.insert(
        "blk.0.ffn_up.weight".into(),
        entry(&[1.0, 2.0, 3.0, 4.0], &[2.0]),
    );
    entries.insert(
        "blk.0.ffn_up_exps.weight".into(),
        entry(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[4.0, 0.0, 1.0]),
    );
    let small = Imatrix {
        entries,
        datasets: vec!["a.txt".into(), "b.txt".into()],
        chunk_count: 3,
        chunk_size: 512,
        is_legacy: false,
    };
    let mut s = vec![("gguf-small", gguf(&small))];
    let mut one = Imatrix::default();
    one.entries.insert("w".into(), entry(&[0.5], &[1.0]));
    s.push(("gguf-one", gguf(&one)));
    let mut odd = Imatrix::default();
    odd.entries.insert(
        "nan.weight".into(),
        entry(
            &[f32::NAN, f32::INFINITY, -0.0, f32::MIN],
            &[f32::NAN, -1.0],
        ),
    );
    odd.entries
        .insert("inf.weight".into(), entry(&[1.0, 2.0], &[f32::INFINITY]));
    odd.entries.insert(
        // Cut by ggml's 63-byte names when written: neither tensor keeps its suffix.
        "x".repeat(60),
        entry(&[3.0], &[1e30]),
    );
    s.push(("gguf-nan-inf-longname", gguf(&odd)));
    let bytes = gguf(&small);
    s.push(("gguf-truncated-data", bytes[..bytes.len() - 40].to_vec()));
    s.push(("gguf-truncated-header", bytes[..40].to_vec()));
    // A sums tensor without its counts; counts that do not divide the sums; F16 sums.
    s.push((
        "gguf-unpaired",
        raw_gguf(
            Metadata::default(),
            &[("a.weight.in_sum2", DType::F32, &[2, 1], f32s(&[1.0, 2.0]))],
        ),
    ));
    s.push((
        "gguf-mismatched",
        raw_gguf(
            Metadata::default(),
            &[
                (
                    "a.weight.in_sum2",
                    DType::F32,
                    &[4, 1],
                    f32s(&[1.0, 2.0, 3.0, 4.0]),
                ),
                (
                    "a.weight.counts",
                    DType::F32,
                    &[1, 3],
                    f32s(&[1.0, 1.0, 1.0]),
                ),
            ],
        ),
    ));
    s.push((
        "gguf-f16",
        raw_gguf(
            Metadata::default(),
            &[
                (
                    "a.weight.in_sum2",
                    DType::F16,
                    &[2, 1],
                    vec![0, 0x3c, 0, 0x40],
                ),
                ("a.weight.counts", DType::F32, &[1, 1], f32s(&[1.0])),
            ],
        ),
    ));
    let mut md = Metadata::default();
    md.set("imatrix.chunk_count", Value::String("three".into()));
    md.set("imatrix.datasets", Value::U32(7));
    s.push((
        "gguf-bad-keys",
        raw_gguf(
            md,
            &[
                ("b.in_sum2", DType::F32, &[1], f32s(&[1.0])),
                ("b.counts", DType::F32, &[1], f32s(&[2.0])),
            ],
        ),
    ));
    s.push(("gguf-no-tensors", raw_gguf(Metadata::default(), &[])));
    let legacy_small = legacy(
        2,
        &[(b"x.weight", 3, &[3.0, 6.0]), (b"y", 1, &[1.0])],
        Some((7, b"t.txt")),
    );
    s.push(("dat-small", legacy_small.clone()));
    s.push((
        "dat-no-trailer",
        legacy(
            1,
            &[(b"blk.1.attn_k.weight", 0, &[1.0, -2.0, f32::NAN])],
            None,
        ),
    ));
    s.push((
        "dat-repeated-nul-name",
        legacy(
            3,
            &[
                (b"a\0junk", 2, &[1.0]),
                (b"a", 5, &[2.0, 3.0]),
                (b"", -4, &[9.0]),
            ],
            Some((-1, b"")),
        ),
    ));
    s.push((
        "dat-truncated",
        legacy_small[..legacy_small.len() - 20].to_vec(),
    ));
    // Sizes that claim more than the file: values, entries, a name, a dataset.
    let mut huge_nval = legacy(1, &[(b"x", 1, &[1.0])], None);
    huge_nval[13..17].copy_from_slice(&i32::MAX.to_le_bytes());
    s.push(("dat-huge-nval", huge_nval));
    s.push((
        "dat-huge-entries",
        legacy(i32::MAX, &[(b"x", 1, &[1.0])], None),
    ));
    let mut huge_name = legacy(1, &[(b"x", 1, &[1.0])], None);
    huge_name[4..8].copy_from_slice(&0x7fff_fff0i32.to_le_bytes());
    s.push(("dat-huge-name", huge_name));
    let mut neg = legacy(1, &[(b"x", 1, &[1.0])], None);
    neg[4..8].copy_from_slice(&(-5i32).to_le_bytes());
    s.push(("dat-negative-name", neg));
    s.push((
        "dat-huge-dataset",
        legacy(1, &[(b"x", 1, &[1.0])], Some((1, b"d")))
            .into_iter()
            .take(25)
            .chain(i32::MAX.to_le_bytes())
            .collect(),
    ));
    s.push(("dat-zero-entries", 0i32.to_le_bytes().to_vec()));
    // The first entries of llama-imatrix's own files (real names and values).
    if let Some(m) = real_head("smollm2-imatrix-c128.gguf", 3) {
        s.push(("gguf-real-head", gguf(&m)));
    }
    if let Some(m) = real_head("smollm2-imatrix-c128.dat", 2) {
        let entries: Vec<(Vec<u8>, i32, Vec<f32>)> = m
            .entries
            .iter()
            .map(|(n, e)| (n.as_bytes().to_vec(), e.counts[0] as i32, e.sums.clone()))
            .collect();
        let refs: Vec<(&[u8], i32, &[f32])> = entries
            .iter()
            .map(|(n, c, v)| (&n[..], *c, &v[..]))
            .collect();
        let dataset = m.datasets.first().cloned().unwrap_or_default();
        s.push((
            "dat-real-head",
            legacy(
                refs.len() as i32,
                &refs,
                Some((m.chunk_count as i32, dataset.as_bytes())),
            ),
        ));
    }
    s
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The fuzz target's property; true if the bytes read as an imatrix.
fn check(data: &[u8]) -> bool {
    let Ok(m) = Imatrix::from_bytes(data, Path::new("mutated")) else {
        return false;
    };
    let held: usize = m
        .entries
        .values()
        .map(|e| 4 * (e.sums.len() + e.counts.len()))
        .sum();
    assert!(
        held <= data.len(),
        "{held} bytes of values from {}",
        data.len()
    );
    for (name, e) in &m.entries {
        assert!(!e.counts.is_empty(), "{name}: no counts");
        assert!(e.sums.len().is_multiple_of(e.counts.len()), "{name}");
        if m.is_legacy {
            assert_eq!(e.counts.len(), 1, "{name}");
        }
    }
    let w = m.quant_weights();
    assert_eq!(w.len(), m.entries.len());
    for (name, e) in &m.entries {
        assert_eq!(w[name].len(), e.sums.len(), "{name}");
    }
    let plain = m
        .entries
        .keys()
        .all(|n| !n.is_empty() && n.len() + ".in_sum2".len() < 64);
    let written = m.to_gguf_bytes();
    if !plain {
        return true;
    }
    let bytes = written.expect("an imatrix that was read can be written");
    let kept: Vec<&String> = m
        .entries
        .iter()
        .filter(|(_, e)| !e.sums.is_empty())
        .map(|(n, _)| n)
        .collect();
    if kept.is_empty() {
        return true;
    }
    let back =
        Imatrix::from_bytes(&bytes, Path::new("written")).expect("what is written reads back");
    assert!(!back.is_legacy);
    assert_eq!(back.datasets, m.datasets);
    assert_eq!(
        (back.chunk_count, back.chunk_size),
        (m.chunk_count, m.chunk_size)
    );
    assert_eq!(back.entries.keys().collect::<Vec<_>>(), kept);
    for name in kept {
        let (e, b) = (&m.entries[name], &back.entries[name]);
        assert!(same_bits(&b.sums, &e.sums), "{name}");
        assert!(same_bits(&b.counts, &e.counts), "{name}");
    }
    true
}

/// Boundary values for the i32/u32/u64 counts, lengths and offsets of both formats.
const INTERESTING: [u64; 11] = [
    0,
    1,
    2,
    4,
    0x7F,
    0xFF,
    0x7FFF_FFFF,
    0x8000_0000,
    0xFFFF_FFFF,
    1 << 32,
    u64::MAX,
];

fn mutate(rng: &mut Rng, base: &[u8]) -> Vec<u8> {
    let mut bytes = base.to_vec();
    for _ in 0..1 + rng.below(3) {
        if bytes.is_empty() {
            break;
        }
        let at = rng.below(bytes.len());
        match rng.below(6) {
            0 => bytes[at] ^= 1 << rng.below(8),
            1 => bytes[at] = rng.next_u64() as u8,
            2 => {
                // A boundary value over a little-endian word, mostly at a 4-byte boundary
                // (where both formats keep their counts).
                let at = if rng.below(4) == 0 { at } else { at & !3 };
                let v = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
                let n = [4, 8][rng.below(2)].min(bytes.len() - at);
                bytes[at..at + n].copy_from_slice(&v[..n]);
            }
            3 => bytes.truncate(at),
            4 => {
                let n = rng.below(32);
                bytes.splice(at..at, std::iter::repeat_n(rng.next_u64() as u8, n));
            }
            _ => {
                let end = (at + 1 + rng.below(32)).min(bytes.len());
                bytes.drain(at..end);
            }
        }
    }
    bytes
}

#[test]
fn seeds_read_as_expected() {
    let seeds = seeds();
    assert!(seeds.len() >= 20);
    for (name, bytes) in &seeds {
        let ok = check(bytes);
        let valid = [
            "gguf-small",
            "gguf-one",
            "gguf-nan-inf-longname",
            "gguf-real-head",
            "dat-small",
            "dat-no-trailer",
            "dat-repeated-nul-name",
            "dat-huge-dataset",
            "dat-real-head",
        ]
        .contains(name);
        assert_eq!(ok, valid, "{name}");
    }
}

#[test]
fn mutated_imatrix_files_never_panic() {
    let seeds = seeds();
    let mut rng = Rng(0x1a7_41c5_0020);
    let (mut read, mut refused) = (0, 0);
    for i in 0..4000 {
        let (_, base) = &seeds[i % seeds.len()];
        let bytes = mutate(&mut rng, base);
        if check(&bytes) {
            read += 1;
        } else {
            refused += 1;
        }
    }
    // Both outcomes are exercised.
    assert!(
        read > 300 && refused > 300,
        "{read} read, {refused} refused"
    );
}

/// Writes the seeds to fuzz/seeds/imatrix_reader.
#[test]
#[ignore = "writes into the source tree; run by hand to refresh the fuzz seeds"]
fn write_fuzz_seeds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/imatrix_reader");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in seeds() {
        assert!(bytes.len() < 16 * 1024, "{name}: seeds stay small");
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}
