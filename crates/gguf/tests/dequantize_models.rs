//! Every tensor of both test models dequantizes to finite values with lamina-core's reference
//! routines, and the first tensor of each type matches the `gguf` Python package's
//! dequantization (checksums in model_checksums.txt, made by gen_model_checksums.py).

use lamina_core::quant::{dequantize_row, supports_dequantize};
use lamina_gguf::GgufFile;
use lamina_gguf::pull::model_for_test;

const CHECKSUMS: &str = include_str!("model_checksums.txt");
const HASHED_ELEMENTS: usize = 65536;

fn fnv1a64(h: &mut u64, values: &[f32]) {
    for b in values.iter().flat_map(|v| v.to_le_bytes()) {
        *h = (*h ^ b as u64).wrapping_mul(0x100000001B3);
    }
}

fn check_model(name: &str) {
    let Some(path) = model_for_test(name) else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let expected: Vec<Vec<&str>> = CHECKSUMS
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect())
        .filter(|f: &Vec<&str>| f.len() == 5 && f[0] == name)
        .collect();
    let mut matched = 0;
    let mut values = Vec::new();
    for t in &file.tensors {
        assert!(
            supports_dequantize(t.dtype),
            "{name}: {} has unsupported type {}",
            t.name,
            t.dtype
        );
        let row_len = t.shape[0] as usize;
        let row_bytes = t.dtype.row_size(t.shape[0]).unwrap() as usize;
        values.resize(row_len, 0.0);
        let mut hash = 0xCBF2_9CE4_8422_2325u64;
        let mut hashed = 0;
        for row in file.tensor_data(t).chunks_exact(row_bytes) {
            dequantize_row(t.dtype, row, &mut values)
                .unwrap_or_else(|e| panic!("{name}: {}: {e}", t.name));
            if let Some(bad) = values.iter().position(|v| !v.is_finite()) {
                panic!(
                    "{name}: {} has non-finite value {} at {bad}",
                    t.name, values[bad]
                );
            }
            let take = (HASHED_ELEMENTS - hashed).min(values.len());
            fnv1a64(&mut hash, &values[..take]);
            hashed += take;
        }
        if let Some(f) = expected.iter().find(|f| f[1] == t.name) {
            assert!(
                f[2].eq_ignore_ascii_case(t.dtype.name()),
                "{name}: {}",
                t.name
            );
            assert_eq!(f[3].parse::<usize>().unwrap(), hashed, "{name}: {}", t.name);
            assert_eq!(
                format!("{hash:016x}"),
                f[4],
                "{name}: {} ({}) differs from gguf-py's dequantization",
                t.name,
                t.dtype
            );
            matched += 1;
        }
    }
    assert_eq!(
        matched,
        expected.len(),
        "{name}: every checksum line names a tensor of the model"
    );
}

#[test]
fn smollm2_tensors_dequantize() {
    check_model("smollm2-135m");
}

#[test]
fn gemma3_tensors_dequantize() {
    check_model("gemma3-270m");
}
