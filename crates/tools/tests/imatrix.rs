//! The imatrix files llama.cpp's llama-imatrix wrote (tests/data/smollm2-imatrix-c128.{gguf,dat},
//! made by scripts/imatrix-reference/make.sh): read in both formats, consistent with each other,
//! and written back byte for byte.

use std::path::{Path, PathBuf};

use lamina_tools::imatrix::Imatrix;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

#[test]
fn reads_llama_imatrix_gguf_and_writes_it_back_byte_for_byte() {
    let path = data("smollm2-imatrix-c128.gguf");
    let m = Imatrix::load(&path).unwrap();
    assert!(!m.is_legacy);
    assert_eq!(m.chunk_count, 2);
    assert_eq!(m.chunk_size, 128);
    assert_eq!(
        m.datasets,
        vec!["../shared/reference/areopagitica-short.txt".to_string()]
    );
    // SmolLM2-135M: 30 blocks of q, k, v, output, gate, up, down.
    assert_eq!(m.entries.len(), 30 * 7);
    let q = &m.entries["blk.0.attn_q.weight"];
    assert_eq!(q.sums.len(), 576);
    assert_eq!(q.counts, vec![256.0]);
    assert_eq!(m.entries["blk.29.ffn_down.weight"].sums.len(), 1536);
    assert!(
        m.entries
            .values()
            .all(|e| e.sums.iter().all(|v| v.is_finite() && *v >= 0.0))
    );

    let original = std::fs::read(&path).unwrap();
    assert_same_bytes(&m.to_gguf_bytes().unwrap(), &original);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("copy.gguf");
    m.save(&out).unwrap();
    assert_same_bytes(&std::fs::read(&out).unwrap(), &original);
    assert_eq!(Imatrix::load(&out).unwrap(), m);
}

#[test]
fn reads_llama_imatrix_legacy_dat_consistent_with_its_gguf() {
    let g = Imatrix::load(&data("smollm2-imatrix-c128.gguf")).unwrap();
    let d = Imatrix::load(&data("smollm2-imatrix-c128.dat")).unwrap();
    assert!(d.is_legacy);
    assert_eq!(d.chunk_count, 2);
    assert_eq!(d.chunk_size, 0);
    assert_eq!(d.datasets, g.datasets);
    assert_eq!(
        d.entries.keys().collect::<Vec<_>>(),
        g.entries.keys().collect::<Vec<_>>()
    );
    let (gw, dw) = (g.quant_weights(), d.quant_weights());
    for (name, ge) in &g.entries {
        let de = &d.entries[name];
        // save_imatrix_legacy: ncall = ceil(max count / chunk size), value = sum / count * ncall.
        let count = ge.counts[0];
        let ncall = ((count as i64 + 127) / 128) as f32;
        assert_eq!(de.counts, vec![ncall], "{name}");
        for (j, (&s, &l)) in ge.sums.iter().zip(&de.sums).enumerate() {
            assert_eq!((s / count) * ncall, l, "{name}[{j}]");
        }
        // quantize's weights from the two files: sum / count versus (sum / count * n) / n.
        for (&a, &b) in gw[name].iter().zip(&dw[name]) {
            assert!((a - b).abs() <= a.abs() * 2.5e-7, "{name}: {a} vs {b}");
        }
    }
}

#[test]
fn truncated_reference_files_are_errors() {
    for name in ["smollm2-imatrix-c128.gguf", "smollm2-imatrix-c128.dat"] {
        let bytes = std::fs::read(data(name)).unwrap();
        for cut in [0, 3, 4, 100, 5000, bytes.len() / 2, bytes.len() - 100] {
            assert!(
                Imatrix::from_bytes(&bytes[..cut], Path::new(name)).is_err(),
                "{name} cut at {cut}"
            );
        }
    }
}

/// Equal bytes, or a panic naming the first differing offset (not a dump of both files).
fn assert_same_bytes(a: &[u8], b: &[u8]) {
    if a != b {
        let at = a
            .iter()
            .zip(b)
            .position(|(x, y)| x != y)
            .unwrap_or(a.len().min(b.len()));
        let ctx = |v: &[u8]| v[at.saturating_sub(16)..(at + 16).min(v.len())].to_vec();
        panic!(
            "bytes differ at offset {at} (lengths {} and {}): {:?} vs {:?}",
            a.len(),
            b.len(),
            ctx(a),
            ctx(b)
        );
    }
}
