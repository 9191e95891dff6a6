//! Tensor quantization with and without importance weights (`quantize_row_weighted`), bit-exact
//! with ggml's `quantize_<type>` on the vectors of `data/weighted_vectors.bin` (made by
//! `data/gen_weighted_vectors.py` from llama.cpp 0c1e570's ggml-quants.c).

use lamina_core::DType;
use lamina_core::quant::{QuantError, quantize_row_weighted, row_bytes};

struct Record {
    dtype: DType,
    nrow: usize,
    n: usize,
    x: Vec<f32>,
    w: Option<Vec<f32>>,
    q: Vec<u8>,
}

fn records() -> Vec<Record> {
    let bytes = include_bytes!("data/weighted_vectors.bin");
    assert_eq!(&bytes[..4], b"LQW1");
    let mut pos = 4;
    let u32_at = |pos: &mut usize| {
        let v = u32::from_le_bytes(bytes[*pos..*pos + 4].try_into().unwrap());
        *pos += 4;
        v as usize
    };
    let count = u32_at(&mut pos);
    let f32s = |pos: &mut usize, k: usize| -> Vec<f32> {
        let v = bytes[*pos..*pos + 4 * k]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        *pos += 4 * k;
        v
    };
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let dtype = DType::from_id(u32_at(&mut pos) as u32).unwrap();
        let nrow = u32_at(&mut pos);
        let n = u32_at(&mut pos);
        let has_w = u32_at(&mut pos) != 0;
        let x = f32s(&mut pos, nrow * n);
        let w = has_w.then(|| f32s(&mut pos, n));
        let m = u32_at(&mut pos);
        let q = bytes[pos..pos + m].to_vec();
        pos += m;
        out.push(Record {
            dtype,
            nrow,
            n,
            x,
            w,
            q,
        });
    }
    assert_eq!(pos, bytes.len());
    out
}

#[test]
fn weighted_quantizers_match_ggml() {
    let recs = records();
    let mut failures = Vec::new();
    for r in &recs {
        let row = row_bytes(r.dtype, r.n).unwrap();
        let mut q = vec![0u8; row * r.nrow];
        for (i, (x, y)) in r.x.chunks(r.n).zip(q.chunks_mut(row)).enumerate() {
            quantize_row_weighted(r.dtype, x, y, r.w.as_deref())
                .unwrap_or_else(|e| panic!("{} row {i}: {e}", r.dtype));
        }
        if q != r.q {
            let first = q.iter().zip(&r.q).position(|(a, b)| a != b).unwrap();
            failures.push(format!(
                "{} weights={}: first difference at byte {first} of {}",
                r.dtype,
                r.w.is_some(),
                q.len()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(recs.len(), 66);
}

#[test]
fn weights_of_the_wrong_length_are_refused() {
    let x = [0.5f32; 32];
    let mut q = [0u8; 18];
    assert!(matches!(
        quantize_row_weighted(DType::Q4_0, &x, &mut q, Some(&[1.0; 31])),
        Err(QuantError::LengthMismatch { .. })
    ));
    assert!(matches!(
        quantize_row_weighted(DType::Q4_0, &x, &mut q[..17], Some(&[1.0; 32])),
        Err(QuantError::LengthMismatch { .. })
    ));
}
