//! The imatrix files llama.cpp's llama-imatrix wrote (tests/data/smollm2-imatrix-c128.{gguf,dat},
//! made by scripts/imatrix-reference/make.sh): read in both formats, consistent with each other,
//! and written back byte for byte.

use std::path::{Path, PathBuf};

use lamina_tools::imatrix::{Collector, CollectorParams, Imatrix};

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

fn collector(out: &Path) -> Collector {
    Collector::new(CollectorParams {
        chunk_size: 128,
        process_output: false,
        output_frequency: 10,
        save_frequency: 0,
        out_file: out.to_path_buf(),
        prompt_file: None,
        legacy_format: false,
    })
}

#[test]
fn collector_adds_earlier_files_as_llama_imatrix_does() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = data("smollm2-imatrix-c128.gguf");
    let reference = Imatrix::load(&gguf).unwrap();
    let mut c = collector(&dir.path().join("out.gguf"));
    c.load(&gguf).unwrap();
    assert_eq!(c.last_chunk(), 2);
    assert_eq!(c.to_imatrix(), reference);
    c.load(&gguf).unwrap();
    assert_eq!(c.last_chunk(), 4);
    let twice = c.to_imatrix();
    let (a, b) = (
        &twice.entries["blk.3.ffn_up.weight"],
        &reference.entries["blk.3.ffn_up.weight"],
    );
    assert_eq!(a.counts, vec![512.0]);
    assert!(a.sums.iter().zip(&b.sums).all(|(x, y)| *x == y + y));

    // A legacy file: its pre-normalized values times the chunk size, ncall chunks of rows.
    let mut c = collector(&dir.path().join("out.gguf"));
    c.load(&data("smollm2-imatrix-c128.dat")).unwrap();
    assert_eq!(c.last_chunk(), 2);
    let legacy = Imatrix::load(&data("smollm2-imatrix-c128.dat")).unwrap();
    let s = &c.stats()["blk.0.attn_q.weight"];
    assert_eq!(s.counts, vec![256]);
    let l = &legacy.entries["blk.0.attn_q.weight"];
    assert!(s.values.iter().zip(&l.sums).all(|(v, x)| *v == x * 128.0));
    let path = c.save(None).unwrap();
    assert_eq!(Imatrix::load(&path).unwrap().chunk_count, 2);
}

#[test]
fn collector_sums_squares_per_expert_and_saves_at_chunk_boundaries() {
    use lamina_model::observe::{MatmulInfo, MatmulKind};
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("im.gguf");
    let mut c = Collector::new(CollectorParams {
        chunk_size: 2,
        process_output: false,
        output_frequency: 1,
        save_frequency: 1,
        out_file: out.clone(),
        prompt_file: Some("t.txt".into()),
        legacy_format: false,
    });
    // 3 experts of [2 -> 5]; 2 tokens, each routed to 2 experts; input shared by both (ne1 1).
    let info = MatmulInfo {
        weight: "blk.0.ffn_up_exps.weight".into(),
        kind: MatmulKind::MulMatId,
        weight_ne: [2, 5, 3, 1],
        input_ne: [2, 1, 2, 1],
        input_dtype: lamina_core::DType::F32,
        ids_ne: Some([2, 2, 1, 1]),
    };
    assert!(c.wants(&info));
    c.collect(&info, &[1.0, 2.0, 3.0, 4.0], Some(&[0, 2, 2, 1]));
    assert_eq!(c.error(), None);
    let s = &c.stats()["blk.0.ffn_up_exps.weight"];
    assert_eq!(s.counts, vec![1, 1, 2]);
    assert_eq!(s.values, vec![1.0, 4.0, 9.0, 16.0, 10.0, 20.0]);
    // Expert 2 reached 2 rows = 1 chunk: the file and its .at_1 copy were saved.
    assert_eq!(c.last_chunk(), 1);
    let at1 = dir.path().join("im.gguf.at_1");
    assert_eq!(c.saved(), &[out.clone(), at1.clone()]);
    let m = Imatrix::load(&at1).unwrap();
    assert_eq!(m.datasets, vec!["t.txt".to_string()]);
    assert_eq!(
        m.entries["blk.0.ffn_up_exps.weight"].counts,
        vec![1.0, 1.0, 2.0]
    );
    assert_eq!(
        m.quant_weights()["blk.0.ffn_up_exps.weight"],
        vec![1.0, 4.0, 9.0, 16.0, 5.0, 10.0]
    );

    // Small products and non-block weights are not asked for; output.weight only with
    // --process-output.
    let dense = |name: &str, rows: usize| MatmulInfo {
        weight: name.into(),
        kind: MatmulKind::MulMat,
        weight_ne: [2, 5, 1, 1],
        input_ne: [2, rows, 1, 1],
        input_dtype: lamina_core::DType::F32,
        ids_ne: None,
    };
    assert!(c.wants(&dense("blk.1.attn_q.weight", 16)));
    assert!(!c.wants(&dense("blk.1.attn_q.weight", 15)));
    assert!(!c.wants(&dense("output.weight", 64)));
    assert!(!c.wants(&dense("token_embd.weight", 64)));
    // A product whose size changed is an error (llama.cpp exits).
    c.collect(&dense("blk.0.ffn_up_exps.weight", 16), &[0.0; 32], None);
    assert!(c.error().unwrap().contains("inconsistent size"));
}

#[test]
fn collector_writes_llama_imatrix_legacy_dat_byte_for_byte() {
    // The .dat llama-imatrix wrote for the same run as the GGUF: the GGUF's raw data, loaded,
    // written in the legacy format with the same dataset, must be it.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("im.dat");
    let mut c = Collector::new(CollectorParams {
        chunk_size: 128,
        process_output: false,
        output_frequency: 10,
        save_frequency: 0,
        out_file: out.clone(),
        prompt_file: Some("../shared/reference/areopagitica-short.txt".into()),
        legacy_format: true,
    });
    c.load(&data("smollm2-imatrix-c128.gguf")).unwrap();
    c.save(None).unwrap();
    assert_same_bytes(
        &std::fs::read(&out).unwrap(),
        &std::fs::read(data("smollm2-imatrix-c128.dat")).unwrap(),
    );
}
