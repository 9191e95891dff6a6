//! Perplexity chunking, statistics, the `--kl-divergence-base` file format and KLD statistics,
//! checked against llama.cpp's own base file for SmolLM2 (see shared/reference/README.md).

use std::io::{self, Cursor, Read, Seek, SeekFrom};

use lamina_model::perplexity::{
    BaseChunk, CompressedRow, KldAccumulator, LogitsFileError, LogitsFileReader, LogitsFileWriter,
    PerplexityError, PerplexityPlan, PerplexityStats, compress_log_probs, compressed_row_len,
    token_nll,
};

const KLD_FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/reference/smollm2-135m-areopagitica-short-c128.kld"
);

fn reference_bytes() -> Option<Vec<u8>> {
    match std::fs::read(KLD_FILE) {
        Ok(b) => Some(b),
        Err(e) => {
            println!("skipping: {KLD_FILE} not readable ({e})");
            None
        }
    }
}

/// Deterministic pseudo-random numbers (xorshift64*), enough for synthetic logits.
struct Rng(u64);
impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn logits(&mut self, n: usize, spread: f32) -> Vec<f32> {
        (0..n).map(|_| (self.unit() - 0.5) * spread).collect()
    }
}

fn exact_log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let lse = logits
        .iter()
        .map(|&v| (f64::from(v) - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    logits.iter().map(|&v| f64::from(v) - lse).collect()
}

// ------------------------------------------------------------------------------------------
// Chunking plan
// ------------------------------------------------------------------------------------------

#[test]
fn plan_chunks_like_llama_perplexity() {
    let tokens: Vec<u32> = (0..1000).map(|i| 1000 + i).collect();
    let plan = PerplexityPlan::new(&tokens, 128, 2048, None).unwrap();
    assert_eq!(plan.n_chunk(), 7); // 1000 / 128
    assert_eq!(plan.n_seq(), 16); // 2048 / 128 chunks per pass
    assert_eq!(plan.n_batch(), 2048);
    assert_eq!(plan.first(), 64);
    assert_eq!(plan.scored_per_chunk(), 63);
    assert_eq!(plan.scored_total(), 7 * 63);
    assert_eq!(plan.tokens(), &tokens[..896]);
    assert_eq!(plan.chunk_groups().collect::<Vec<_>>(), vec![0..7]);
    for (i, c) in plan.chunks().enumerate() {
        assert_eq!(c.index, i);
        assert_eq!(c.start, i * 128);
        assert_eq!(c.input, &tokens[i * 128..(i + 1) * 128]);
        assert_eq!(c.batches, vec![0..128]);
        assert_eq!(c.first, 64);
        assert_eq!(c.scored_positions(), 64..127);
        // The logits at position p predict the token at p + 1 of the chunk.
        assert_eq!(c.targets, &tokens[i * 128 + 65..(i + 1) * 128]);
        assert!(!c.needs_logits(63) && c.needs_logits(64) && c.needs_logits(127));
    }
    assert!(plan.chunk(7).is_none());

    // Small batches: several decodes per chunk, one sequence at a time.
    let plan = PerplexityPlan::new(&tokens, 128, 50, Some(1)).unwrap();
    assert_eq!((plan.n_seq(), plan.n_batch()), (1, 50));
    let c = plan.chunk(2).unwrap();
    assert_eq!(c.batches, vec![0..50, 50..100, 100..128]);
    // BOS replaces the first token fed, never a target or the stored tokens.
    assert_eq!(c.input[0], 1);
    assert_eq!(&c.input[1..], &tokens[257..384]);
    assert_eq!(plan.tokens()[256], tokens[256]);
    assert_eq!(c.targets, &tokens[256 + 65..384]);

    // n_batch between n_ctx multiples: llama-perplexity rounds it down to n_seq * n_ctx.
    let plan = PerplexityPlan::new(&tokens, 128, 300, None).unwrap();
    assert_eq!((plan.n_seq(), plan.n_batch()), (2, 256));
    assert_eq!(
        plan.chunk_groups().collect::<Vec<_>>(),
        vec![0..2, 2..4, 4..6, 6..7]
    );

    // --chunks
    let plan = plan.with_max_chunks(3).unwrap();
    assert_eq!(plan.n_chunk(), 3);
    assert_eq!(plan.tokens().len(), 384);
    assert_eq!(plan.clone().with_max_chunks(100).unwrap().n_chunk(), 3);
    assert_eq!(
        plan.with_max_chunks(0).unwrap_err(),
        PerplexityError::ZeroChunks
    );

    // Odd n_ctx: first = n_ctx/2, scored n_ctx - 1 - first.
    let plan = PerplexityPlan::new(&tokens, 7, 4, None).unwrap();
    assert_eq!(
        (plan.first(), plan.scored_per_chunk(), plan.n_chunk()),
        (3, 3, 142)
    );
    assert_eq!(plan.chunk(0).unwrap().targets, &tokens[4..7]);
}

#[test]
fn plan_rejects_what_llama_perplexity_rejects() {
    let tokens: Vec<u32> = (0..255).collect();
    let err = PerplexityPlan::new(&tokens, 128, 512, None).unwrap_err();
    assert_eq!(
        err,
        PerplexityError::TooFewTokens {
            needed: 256,
            n_ctx: 128,
            have: 255
        }
    );
    assert_eq!(
        err.to_string(),
        "you need at least 256 tokens to evaluate perplexity with a context of 128; \
         the data file you provided tokenizes to only 255 tokens"
    );
    let tokens: Vec<u32> = (0..256).collect();
    assert_eq!(
        PerplexityPlan::new(&tokens, 128, 512, None)
            .unwrap()
            .n_chunk(),
        2
    );
    assert_eq!(
        PerplexityPlan::new(&tokens, 2, 512, None).unwrap_err(),
        PerplexityError::ContextTooSmall { n_ctx: 2 }
    );
    assert_eq!(
        PerplexityPlan::new(&tokens, 64, 0, None).unwrap_err(),
        PerplexityError::ZeroBatch
    );
    // KLD mode takes the file's n_chunk * n_ctx tokens, even a single chunk.
    let plan = PerplexityPlan::for_kl_divergence(&tokens[..128], 128, 2048, Some(0)).unwrap();
    assert_eq!((plan.n_chunk(), plan.n_seq(), plan.n_batch()), (1, 1, 128));
    assert!(PerplexityPlan::for_kl_divergence(&tokens[..100], 128, 64, None).is_err());
}

// ------------------------------------------------------------------------------------------
// Statistics
// ------------------------------------------------------------------------------------------

#[test]
fn token_nll_is_the_log_softmax() {
    let mut rng = Rng(7);
    for spread in [0.5f32, 10.0, 60.0] {
        let logits = rng.logits(1000, spread);
        let exact = exact_log_softmax(&logits);
        for t in [0u32, 17, 999] {
            let nll = token_nll(&logits, t).unwrap();
            assert!(
                (nll + exact[t as usize]).abs() < 1e-5,
                "{nll} vs {}",
                -exact[t as usize]
            );
        }
    }
    assert_eq!(
        token_nll(&[1.0, 2.0], 2).unwrap_err(),
        PerplexityError::TargetOutOfRange {
            token: 2,
            n_vocab: 2
        }
    );
    assert_eq!(token_nll(&[], 0).unwrap_err(), PerplexityError::EmptyRow);
    // Uniform over 4: nll = ln 4 exactly as llama.cpp computes it.
    assert_eq!(token_nll(&[3.0; 4], 1).unwrap(), 4f64.ln());
}

#[test]
fn perplexity_lines_in_llama_format() {
    let mut stats = PerplexityStats::new();
    let nlls = [4.0, 3.0, 5.0, 4.5, 3.5, 4.2];
    for &v in &nlls[..3] {
        stats.add_nll(v);
    }
    // exp(4) = 54.59815...
    assert_eq!(stats.chunk_entry(0), "[1]54.5982,");
    for &v in &nlls[3..] {
        stats.add_nll(v);
    }
    let n = nlls.len() as f64;
    let mean = nlls.iter().sum::<f64>() / n;
    let var = nlls.iter().map(|v| v * v).sum::<f64>() / n - mean * mean;
    let err = (var / (n - 1.0)).sqrt() * mean.exp();
    let e = stats.estimate().unwrap();
    assert!((e.ppl - mean.exp()).abs() < 1e-12 && (e.error - err).abs() < 1e-12);
    assert_eq!(stats.chunk_entry(1), format!("[2]{:.4},", mean.exp()));
    assert_eq!(
        stats.final_line(),
        format!("Final estimate: PPL = {:.4} +/- {:.5}", mean.exp(), err)
    );
    assert_eq!(stats.count(), 6);
    assert!(stats.chunk_line_detailed(128).starts_with("     128  "));

    // All tokens equally likely: no spread, llama.cpp's error line.
    let mut flat = PerplexityStats::new();
    flat.add_nll(2.0);
    flat.add_nll(2.0);
    assert!(flat.estimate().is_none());
    assert_eq!(
        flat.final_line(),
        "Unexpected negative standard deviation of log(prob)"
    );
}

#[test]
fn compressed_row_keeps_log_probs_to_a_half_step() {
    let mut rng = Rng(11);
    for (n_vocab, spread) in [(1001usize, 40.0f32), (1000, 8.0), (7, 1.0)] {
        let logits = rng.logits(n_vocab, spread);
        let exact = exact_log_softmax(&logits);
        let mut raw = vec![0xffffu16; compressed_row_len(n_vocab)];
        let nll = compress_log_probs(&logits, 3, &mut raw).unwrap();
        assert!((nll + exact[3]).abs() < 1e-4);
        let row = CompressedRow::from_raw(&raw, n_vocab).unwrap();
        let max_lp = exact.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let clamp = max_lp - 16.0;
        assert!(f64::from(row.scale) <= 16.0 / 65535.0 * 1.0001);
        for (i, &lp) in exact.iter().enumerate() {
            let got = f64::from(row.log_prob(i).unwrap());
            if lp > clamp + 1e-3 {
                assert!(
                    (got - lp).abs() <= f64::from(row.scale) * 0.5 + 1e-4,
                    "vocab {n_vocab} entry {i}: {got} vs {lp}"
                );
            } else {
                // Below max - 16: stored at the floor.
                assert!(row.q[i] == 0 || lp > clamp - 1e-3);
            }
        }
        // The padding slot of an odd vocabulary is zeroed.
        if n_vocab % 2 == 1 {
            assert_eq!(*raw.last().unwrap(), 0);
        }
        // The maximum is stored at the top of the range.
        let imax = (0..n_vocab)
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
            .unwrap();
        assert_eq!(row.q[imax], 65535);
    }
    // A flat row has scale 0 and all-zero codes.
    let mut raw = vec![1u16; compressed_row_len(4)];
    compress_log_probs(&[2.0; 4], 0, &mut raw).unwrap();
    let row = CompressedRow::from_raw(&raw, 4).unwrap();
    assert_eq!(row.scale, 0.0);
    assert!((row.min_log_prob + 4f32.ln()).abs() < 1e-6);
    assert_eq!(row.q, &[0; 4]);
}

// ------------------------------------------------------------------------------------------
// llama.cpp's base file for SmolLM2 at -c 128
// ------------------------------------------------------------------------------------------

#[test]
fn reference_file_header_and_tokens() {
    let Some(bytes) = reference_bytes() else {
        return;
    };
    let mut reader = LogitsFileReader::new(Cursor::new(&bytes[..])).unwrap();
    let h = *reader.header();
    assert_eq!((h.n_ctx, h.n_vocab, h.n_chunk), (128, 49152, 5));
    assert_eq!(h.rows_per_chunk(), 63);
    assert_eq!(h.row_len(), 49156);
    assert_eq!(h.file_len(), Some(bytes.len() as u64));
    let tokens = reader.tokens().to_vec();
    assert_eq!(tokens.len(), 640);
    // SmolLM2 adds no BOS: the text starts with "AREOPAGITICA" (split as A-RE-OP-...).
    assert_ne!(tokens[0], 1);
    assert!(tokens.iter().all(|&t| (t as usize) < h.n_vocab));

    // The plan built from the file's own tokens: 5 chunks of 63 scored tokens, like the file.
    let plan = PerplexityPlan::new(&tokens, 128, 2048, None).unwrap();
    let kld_plan = PerplexityPlan::for_kl_divergence(&tokens, 128, 2048, None).unwrap();
    assert_eq!(plan.n_chunk(), h.n_chunk);
    assert_eq!(plan.tokens(), &tokens[..]);
    assert_eq!(kld_plan.n_chunk(), h.n_chunk);
    assert_eq!(plan.scored_per_chunk(), h.rows_per_chunk());
    for (a, b) in plan.chunks().zip(kld_plan.chunks()) {
        assert_eq!(a.targets, b.targets);
        assert_eq!(a.scored_positions(), b.scored_positions());
    }

    let mut n = 0;
    while let Some(chunk) = reader.next_chunk().unwrap() {
        assert_eq!(chunk.index, n);
        assert_eq!(chunk.n_rows(), 63);
        for row in chunk.rows() {
            // Every row is a compressed log-softmax: scale at most 16/65535, and the most
            // likely token sits at log-prob min + 65535*scale <= 0.
            assert!(row.scale > 0.0 && row.scale <= 16.0 / 65535.0 * 1.0001);
            let top = row.q.iter().copied().max().unwrap();
            assert_eq!(top, 65535);
            let top_lp = row.scale * 65535.0 + row.min_log_prob;
            assert!(top_lp <= 1e-4, "{top_lp}");
            assert!(row.min_log_prob < 0.0);
        }
        n += 1;
    }
    assert_eq!(n, 5);
    assert!(reader.next_chunk().unwrap().is_none());
}

/// GPT-2 byte-level BPE: the printable character each byte is spelled with in the vocabulary.
fn byte_for_char(c: char) -> Option<u8> {
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let mut n = 0;
    for b in 0..256u32 {
        let spelled = if printable(b) {
            b
        } else {
            n += 1;
            255 + n
        };
        if spelled == c as u32 {
            return Some(b as u8);
        }
    }
    None
}

#[test]
fn reference_file_tokens_spell_the_text() {
    let Some(bytes) = reference_bytes() else {
        return;
    };
    let text_path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/reference/areopagitica-short.txt"
    );
    let Ok(text) = std::fs::read(text_path) else {
        println!("skipping: {text_path} not readable");
        return;
    };
    let Some(model) = lamina_gguf::pull::model_for_test("smollm2-135m") else {
        return;
    };
    let gguf = lamina_gguf::GgufFile::open(&model).unwrap();
    let meta = &gguf.gguf().metadata;
    let Some(lamina_gguf::Value::Array(lamina_gguf::Array::String(vocab))) =
        meta.get("tokenizer.ggml.tokens")
    else {
        panic!("no vocabulary in {}", model.display());
    };
    // SmolLM2 adds no BOS, so the file's tokens are the text's from its first byte.
    assert_eq!(
        meta.get_bool("tokenizer.ggml.add_bos_token").unwrap(),
        Some(false)
    );

    let reader = LogitsFileReader::new(Cursor::new(&bytes[..])).unwrap();
    assert_eq!(reader.header().n_vocab, vocab.len());
    let mut spelled = Vec::new();
    for &t in reader.tokens() {
        for c in vocab[t as usize].chars() {
            spelled.push(byte_for_char(c).expect("byte-level token"));
        }
    }
    println!(
        "{} tokens spell {} bytes of the text",
        reader.tokens().len(),
        spelled.len()
    );
    // 640 tokens = the first five chunks of the text's tokens; a strict prefix of the text.
    assert!(
        spelled.len() > 2000 && spelled.len() < text.len(),
        "{}",
        spelled.len()
    );
    assert_eq!(
        String::from_utf8_lossy(&spelled),
        String::from_utf8_lossy(&text[..spelled.len()])
    );
}

/// Per-chunk targets of the plan against the file's rows.
fn reference_ppl(bytes: &[u8], shift: usize) -> (PerplexityStats, Vec<String>) {
    let mut reader = LogitsFileReader::new(Cursor::new(bytes)).unwrap();
    let tokens = reader.tokens().to_vec();
    let plan = PerplexityPlan::new(&tokens, 128, 2048, None).unwrap();
    let mut stats = PerplexityStats::new();
    let mut entries = Vec::new();
    for chunk in plan.chunks() {
        let base = reader.next_chunk().unwrap().unwrap();
        for (k, row) in base.rows().enumerate() {
            let target = tokens[chunk.start + chunk.first + 1 + k - shift];
            stats.add_nll(f64::from(row.nll(target).unwrap()));
            if shift == 0 {
                assert_eq!(target, chunk.targets[k]);
            }
        }
        entries.push(stats.chunk_entry(chunk.index));
    }
    (stats, entries)
}

#[test]
fn reference_file_reproduces_llama_perplexity() {
    let Some(bytes) = reference_bytes() else {
        return;
    };
    let (stats, entries) = reference_ppl(&bytes, 0);
    assert_eq!(stats.count(), 315);
    let e = stats.estimate().unwrap();
    println!("{}", entries.concat());
    println!("{}", stats.final_line());
    // llama.cpp: PPL = 59.9963 +/- 11.04844; the file keeps log-probs to 16/65535/2.
    assert!((e.ppl - 59.9963).abs() < 0.002, "PPL {}", e.ppl);
    assert!((e.error - 11.04844).abs() < 0.0005, "error {}", e.error);
    assert_eq!(entries.len(), 5);
    assert_eq!(entries[4], format!("[5]{:.4},", e.ppl));

    // Scoring the wrong positions (each token against its own logits row) lands nowhere near.
    let (shifted, _) = reference_ppl(&bytes, 1);
    assert!(shifted.estimate().unwrap().ppl > 2.0 * 59.9963);
}

/// Logits whose softmax is the base row's distribution: entries above the row's floor keep their
/// stored log-probs; the file does not hold the tail below the floor, so the missing mass
/// (1 - the kept mass) is spread evenly over the floored entries.
fn logits_from_row(row: &CompressedRow<'_>) -> Vec<f32> {
    let kept: f64 = (0..row.n_vocab())
        .filter(|&i| row.q[i] > 0)
        .map(|i| f64::from(row.log_prob(i).unwrap()).exp())
        .sum();
    let n_floor = row.q.iter().filter(|&&q| q == 0).count();
    let tail = if n_floor > 0 && kept < 1.0 {
        ((1.0 - kept) / n_floor as f64).ln() as f32
    } else {
        row.min_log_prob - 20.0
    };
    (0..row.n_vocab())
        .map(|i| {
            if row.q[i] == 0 {
                tail
            } else {
                row.log_prob(i).unwrap()
            }
        })
        .collect()
}

#[test]
fn reference_file_against_itself_has_zero_kld() {
    let Some(bytes) = reference_bytes() else {
        return;
    };
    let mut reader = LogitsFileReader::new(Cursor::new(&bytes[..])).unwrap();
    let h = *reader.header();
    let plan = PerplexityPlan::for_kl_divergence(reader.tokens(), h.n_ctx, 512, None).unwrap();
    let mut acc = KldAccumulator::new();
    let mut table = String::new();
    let mut max_abs = 0f64;
    for chunk in plan.chunks() {
        let base = reader.next_chunk().unwrap().unwrap();
        for (row, &target) in base.rows().zip(chunk.targets) {
            let logits = logits_from_row(&row);
            let t = acc.add_token(&row, &logits, target).unwrap();
            max_abs = max_abs.max(t.kld.abs());
            assert!(t.p_diff.abs() < 1e-3, "{t:?}");
        }
        table.push_str(&acc.chunk_report(chunk.index));
    }
    println!("max |kld| {max_abs}, mean {}", acc.summary().kld.0);
    assert_eq!(acc.count(), 315);
    assert_eq!(acc.n_same_top(), 315);
    let s = acc.summary();
    assert!(s.kld.0.abs() < 1e-6, "mean KLD {}", s.kld.0);
    assert!(max_abs < 1e-5, "max |KLD| {max_abs}");
    assert!((s.ppl.0 - s.ppl_base.0).abs() / s.ppl_base.0 < 1e-3);
    assert!((s.ppl_base.0 - 59.9963).abs() < 0.002);
    assert!(s.log_ppl_correlation > 0.9999);
    let report = acc.report().unwrap();
    println!("{table}\n{report}");
    assert!(table.contains("   5      59.99"));
    assert!(report.contains("Same top p: 100.000 ± 0.000 %"));
    assert!(table.contains("100.000 ±  0.000 %\n"));
    assert!(report.contains("Mean PPL(base)                :  59.99"));
    assert!(report.contains("Cor(ln(PPL(Q)), ln(PPL(base))): 100.00%"));
    assert!(report.contains("Mean    KLD:   0.000"));
}

// ------------------------------------------------------------------------------------------
// Round trip and corrupt files
// ------------------------------------------------------------------------------------------

struct Synthetic {
    bytes: Vec<u8>,
    tokens: Vec<u32>,
    rows: Vec<Vec<u16>>,
    nlls: Vec<f64>,
}

fn synthetic_file(n_ctx: usize, n_vocab: usize, n_chunk: usize, seed: u64) -> Synthetic {
    let mut rng = Rng(seed);
    let tokens: Vec<u32> = (0..n_ctx * n_chunk)
        .map(|_| (rng.next_u64() % n_vocab as u64) as u32)
        .collect();
    let plan = PerplexityPlan::for_kl_divergence(&tokens, n_ctx, n_ctx, None).unwrap();
    let mut w = LogitsFileWriter::new(Vec::new(), n_ctx, n_vocab, plan.tokens()).unwrap();
    let (mut rows, mut nlls) = (Vec::new(), Vec::new());
    for chunk in plan.chunks() {
        for &target in chunk.targets {
            let logits = rng.logits(n_vocab, 30.0);
            let mut raw = vec![0; compressed_row_len(n_vocab)];
            compress_log_probs(&logits, target, &mut raw).unwrap();
            nlls.push(w.write_row(&logits, target).unwrap());
            rows.push(raw);
        }
    }
    let bytes = w.finish().unwrap();
    Synthetic {
        bytes,
        tokens,
        rows,
        nlls,
    }
}

fn read_all<R: Read + Seek>(r: R) -> Result<(Vec<u32>, Vec<BaseChunk>), LogitsFileError> {
    let mut reader = LogitsFileReader::new(r)?;
    let tokens = reader.tokens().to_vec();
    let mut chunks = Vec::new();
    while let Some(c) = reader.next_chunk()? {
        chunks.push(c);
    }
    Ok((tokens, chunks))
}

#[test]
fn write_then_read_round_trip() {
    // Odd vocabulary: each row carries one padding u16.
    let s = synthetic_file(10, 33, 3, 5);
    let (n_ctx, n_vocab, n_chunk) = (10usize, 33usize, 3usize);
    let rows_per_chunk = n_ctx - 1 - n_ctx / 2;
    let expected_len = 20 + 4 * n_ctx * n_chunk + 2 * n_chunk * rows_per_chunk * (4 + 34);
    assert_eq!(s.bytes.len(), expected_len);
    assert_eq!(&s.bytes[..8], b"_logits_");
    assert_eq!(&s.bytes[8..12], &10i32.to_le_bytes());
    assert_eq!(&s.bytes[12..16], &33i32.to_le_bytes());
    assert_eq!(&s.bytes[16..20], &3i32.to_le_bytes());

    let (tokens, chunks) = read_all(Cursor::new(&s.bytes[..])).unwrap();
    assert_eq!(tokens, s.tokens);
    assert_eq!(chunks.len(), n_chunk);
    let mut k = 0;
    for chunk in &chunks {
        assert_eq!(chunk.n_rows(), rows_per_chunk);
        for row in chunk.rows() {
            let want = CompressedRow::from_raw(&s.rows[k], n_vocab).unwrap();
            assert_eq!(row.scale.to_bits(), want.scale.to_bits());
            assert_eq!(row.min_log_prob.to_bits(), want.min_log_prob.to_bits());
            assert_eq!(row.q, want.q);
            k += 1;
        }
    }
    assert_eq!(k, s.rows.len());
    assert!(chunks[0].row(rows_per_chunk).is_none());

    // The nll the writer returns is the target's compressed log-prob, to a half step.
    let plan = PerplexityPlan::for_kl_divergence(&tokens, n_ctx, 4, None).unwrap();
    let targets: Vec<u32> = plan.chunks().flat_map(|c| c.targets.to_vec()).collect();
    for ((raw, &nll), &t) in s.rows.iter().zip(&s.nlls).zip(&targets) {
        let row = CompressedRow::from_raw(raw, n_vocab).unwrap();
        if row.q[t as usize] > 0 {
            let lp = f64::from(row.log_prob(t as usize).unwrap());
            assert!((nll + lp).abs() <= f64::from(row.scale) + 1e-4);
        } else {
            // Below the floor of the row: its stored log-prob is the floor.
            assert!(-nll <= f64::from(row.min_log_prob) + 1e-4);
        }
    }

    // Through a real file on disk too.
    let path =
        std::env::temp_dir().join(format!("lamina-ppl-roundtrip-{}.kld", std::process::id()));
    std::fs::write(&path, &s.bytes).unwrap();
    let mut reader = LogitsFileReader::open(&path).unwrap();
    assert_eq!(reader.tokens(), &s.tokens[..]);
    assert_eq!(
        reader.next_chunk().unwrap().unwrap().n_rows(),
        rows_per_chunk
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn writer_checks_its_input() {
    let tokens = vec![1u32; 20];
    // Token outside the vocabulary.
    let bad = vec![40u32; 20];
    assert!(matches!(
        LogitsFileWriter::new(Vec::new(), 10, 33, &bad),
        Err(LogitsFileError::TokenOutOfRange {
            index: 0,
            token: 40,
            n_vocab: 33
        })
    ));
    // Not a whole number of chunks.
    assert!(matches!(
        LogitsFileWriter::new(Vec::new(), 10, 33, &tokens[..15]),
        Err(LogitsFileError::TokenCount {
            expected: 10,
            got: 15
        })
    ));
    let mut w = LogitsFileWriter::new(Vec::new(), 10, 33, &tokens).unwrap();
    assert!(matches!(
        w.write_row(&[0.0; 32], 0),
        Err(LogitsFileError::Row(PerplexityError::RowLength {
            got: 32,
            expected: 33
        }))
    ));
    assert!(matches!(
        w.write_row(&[0.0; 33], 33),
        Err(LogitsFileError::Row(
            PerplexityError::TargetOutOfRange { .. }
        ))
    ));
    for _ in 0..8 {
        w.write_row(&[0.0; 33], 0).unwrap();
    }
    assert!(matches!(
        LogitsFileWriter::new(Vec::new(), 10, 33, &tokens)
            .unwrap()
            .finish(),
        Err(LogitsFileError::MissingRows {
            written: 0,
            expected: 8
        })
    ));
    assert!(matches!(
        w.write_row(&[0.0; 33], 0),
        Err(LogitsFileError::TooManyRows { n_rows: 8 })
    ));
    let bytes = w.finish().unwrap();
    assert_eq!(read_all(Cursor::new(&bytes[..])).unwrap().1.len(), 2);
}

#[test]
fn truncated_files_give_typed_errors() {
    let s = synthetic_file(8, 17, 2, 9);
    for cut in 0..s.bytes.len() {
        match read_all(Cursor::new(&s.bytes[..cut])) {
            Err(LogitsFileError::Truncated { actual, .. }) => assert_eq!(actual, cut as u64),
            other => panic!("cut at {cut}: {:?}", other.map(|(t, c)| (t.len(), c.len()))),
        }
    }
    // Trailing bytes are refused too.
    let mut long = s.bytes.clone();
    long.push(0);
    assert!(matches!(
        read_all(Cursor::new(&long[..])),
        Err(LogitsFileError::TrailingData { extra: 1, .. })
    ));
}

#[test]
fn truncated_reference_file_gives_typed_errors() {
    let Some(bytes) = reference_bytes() else {
        return;
    };
    let len = bytes.len();
    let mut cuts: Vec<usize> = (0..64).collect();
    cuts.extend([2579, 2580, 2581, len / 3, len / 2, len - 2, len - 1]);
    cuts.extend((1..40).map(|i| i * (len / 40) + i));
    for cut in cuts {
        assert!(
            matches!(
                read_all(Cursor::new(&bytes[..cut])),
                Err(LogitsFileError::Truncated { .. })
            ),
            "cut at {cut}"
        );
    }
}

/// A reader whose size (from seeking to the end) claims more than it can deliver: the file
/// shrank after it was opened.
struct Shrinking<'a> {
    inner: Cursor<&'a [u8]>,
    claimed: u64,
}

impl Read for Shrinking<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

impl Seek for Shrinking<'_> {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        match pos {
            SeekFrom::End(d) => {
                let p = self.claimed.checked_add_signed(d).unwrap();
                self.inner.set_position(p);
                Ok(p)
            }
            other => self.inner.seek(other),
        }
    }
}

#[test]
fn file_shrinking_while_read_gives_typed_errors() {
    let s = synthetic_file(8, 17, 2, 13);
    let header_and_tokens = 20 + 4 * 16;
    for cut in [
        header_and_tokens - 1,
        header_and_tokens + 5,
        s.bytes.len() - 1,
    ] {
        let r = Shrinking {
            inner: Cursor::new(&s.bytes[..cut]),
            claimed: s.bytes.len() as u64,
        };
        assert!(
            matches!(read_all(r), Err(LogitsFileError::Truncated { .. })),
            "cut at {cut}"
        );
    }
}

fn with_header(n_ctx: i32, n_vocab: i32, n_chunk: i32, tail: &[u8]) -> Vec<u8> {
    let mut b = b"_logits_".to_vec();
    for v in [n_ctx, n_vocab, n_chunk] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(tail);
    b
}

#[test]
fn corrupt_headers_give_typed_errors() {
    let s = synthetic_file(8, 17, 2, 21);
    let tail = &s.bytes[20..];

    // Huge sizes: refused from the file size, nothing allocated.
    for (c, v, k) in [
        (8, i32::MAX, 2),
        (i32::MAX, 17, 2),
        (8, 17, i32::MAX),
        (i32::MAX, i32::MAX, i32::MAX),
    ] {
        let b = with_header(c, v, k, tail);
        match read_all(Cursor::new(&b[..])) {
            Err(LogitsFileError::Truncated { .. } | LogitsFileError::InvalidHeader { .. }) => {}
            other => panic!("({c}, {v}, {k}): {:?}", other.map(|_| ())),
        }
    }
    // Non-positive or too-small values.
    for (c, v, k, field) in [
        (-8, 17, 2, "n_ctx"),
        (2, 17, 2, "n_ctx"),
        (8, 0, 2, "n_vocab"),
        (8, -17, 2, "n_vocab"),
        (8, 17, 0, "n_chunk"),
        (8, 17, -1, "n_chunk"),
    ] {
        let b = with_header(c, v, k, tail);
        match read_all(Cursor::new(&b[..])) {
            Err(LogitsFileError::InvalidHeader { field: f, .. }) => assert_eq!(f, field),
            other => panic!("({c}, {v}, {k}): {:?}", other.map(|_| ())),
        }
    }
    // Smaller vocabulary than the tokens need (same byte size: 17 and 18 both pad to 18).
    let b = with_header(8, 18, 2, tail);
    assert!(read_all(Cursor::new(&b[..])).is_ok());
    let mut b = s.bytes.clone();
    b[20..24].copy_from_slice(&17i32.to_le_bytes());
    assert!(matches!(
        read_all(Cursor::new(&b[..])),
        Err(LogitsFileError::TokenOutOfRange {
            index: 0,
            token: 17,
            n_vocab: 17
        })
    ));
    b[20..24].copy_from_slice(&(-3i32).to_le_bytes());
    assert!(matches!(
        read_all(Cursor::new(&b[..])),
        Err(LogitsFileError::TokenOutOfRange { token: -3, .. })
    ));
    // Wrong magic, including files too short to hold one.
    let mut b = s.bytes.clone();
    b[0] = b'X';
    assert!(matches!(
        read_all(Cursor::new(&b[..])),
        Err(LogitsFileError::BadMagic { .. })
    ));
    assert!(matches!(
        read_all(Cursor::new(&b"GGUF"[..])),
        Err(LogitsFileError::BadMagic { .. })
    ));
    assert!(matches!(
        read_all(Cursor::new(&b"_logi"[..])),
        Err(LogitsFileError::Truncated { .. })
    ));
}

// ------------------------------------------------------------------------------------------
// KLD statistics
// ------------------------------------------------------------------------------------------

#[test]
fn kld_matches_the_exact_divergence() {
    let mut rng = Rng(3);
    let n_vocab = 500;
    let mut acc = KldAccumulator::new();
    let mut exact_sum = 0.0;
    let mut same = 0;
    for i in 0..150 {
        // Spread small enough that no base entry falls below the -16 cut-off.
        let base_logits = rng.logits(n_vocab, 6.0);
        let noise = if i % 3 == 0 { 2.0 } else { 0.2 };
        let cur: Vec<f32> = base_logits
            .iter()
            .map(|&l| l + (rng.unit() - 0.5) * noise)
            .collect();
        let target = (rng.next_u64() % n_vocab as u64) as u32;
        let mut raw = vec![0; compressed_row_len(n_vocab)];
        compress_log_probs(&base_logits, target, &mut raw).unwrap();
        let row = CompressedRow::from_raw(&raw, n_vocab).unwrap();
        let t = acc.add_token(&row, &cur, target).unwrap();

        let p = exact_log_softmax(&base_logits);
        let q = exact_log_softmax(&cur);
        let kl: f64 = p.iter().zip(&q).map(|(a, b)| a.exp() * (a - b)).sum();
        assert!((t.kld - kl).abs() < 1e-4 + 1e-3 * kl, "{} vs {kl}", t.kld);
        let dp = q[target as usize].exp() - p[target as usize].exp();
        assert!((f64::from(t.p_diff) - dp).abs() < 1e-4);
        exact_sum += kl;
        let argmax = |v: &[f64]| (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap();
        same += usize::from(argmax(&p) == argmax(&q));
    }
    let s = acc.summary();
    assert_eq!(s.count, 150);
    assert_eq!(acc.n_same_top(), same);
    assert!((s.kld.0 - exact_sum / 150.0).abs() < 1e-4);
    assert!(s.kld.1 > 0.0);
    assert!((s.same_top.0 - same as f64 / 150.0).abs() < 1e-12);

    let mut sorted = acc.kld_values().to_vec();
    sorted.sort_by(f32::total_cmp);
    let report = acc.report().unwrap();
    print!("{}{report}", acc.chunk_report(0));
    let labels = [
        "====== Perplexity statistics ======",
        "Mean PPL(Q)                   : ",
        "Mean PPL(base)                : ",
        "Cor(ln(PPL(Q)), ln(PPL(base))): ",
        "Mean ln(PPL(Q)/PPL(base))     : ",
        "Mean PPL(Q)/PPL(base)         : ",
        "Mean PPL(Q)-PPL(base)         : ",
        "",
        "====== KL divergence statistics ======",
        "Mean    KLD: ",
        "Maximum KLD: ",
        "99.9%   KLD: ",
        "99.0%   KLD: ",
        "95.0%   KLD: ",
        "90.0%   KLD: ",
        "Median  KLD: ",
        "10.0%   KLD: ",
        " 5.0%   KLD: ",
        " 1.0%   KLD: ",
        " 0.1%   KLD: ",
        "Minimum KLD: ",
        "",
        "====== Token probability statistics ======",
        "Mean    Δp: ",
        "Maximum Δp: ",
        "99.9%   Δp: ",
        "99.0%   Δp: ",
        "95.0%   Δp: ",
        "90.0%   Δp: ",
        "75.0%   Δp: ",
        "Median  Δp: ",
        "25.0%   Δp: ",
        "10.0%   Δp: ",
        " 5.0%   Δp: ",
        " 1.0%   Δp: ",
        " 0.1%   Δp: ",
        "Minimum Δp: ",
        "RMS Δp    : ",
        "Same top p: ",
    ];
    let lines: Vec<&str> = report.lines().collect();
    assert_eq!(lines.len(), labels.len());
    for (line, label) in lines.iter().zip(labels) {
        assert!(
            line.starts_with(label),
            "{line:?} should start with {label:?}"
        );
    }
    assert_eq!(lines[10], format!("Maximum KLD: {:10.6}", sorted[149]));
    assert_eq!(lines[20], format!("Minimum KLD: {:10.6}", sorted[0]));
    // Median of an even count: mean of the two middle values, in float.
    assert_eq!(
        lines[15],
        format!("Median  KLD: {:10.6}", 0.5f32 * (sorted[75] + sorted[74]))
    );
    // 90%: p = 0.9 * 149 = 134.1 between sorted[134] and sorted[135].
    let p = 0.9f32 * 149.0 - 134.0;
    let p90 = (1.0 - p) * sorted[134] + p * sorted[135];
    assert_eq!(lines[14], format!("90.0%   KLD: {:10.6}", p90));
    assert_eq!(
        lines[38],
        format!(
            "Same top p: {:6.3} ± {:5.3} %",
            100.0 * s.same_top.0,
            100.0 * (s.same_top.0 * (1.0 - s.same_top.0) / 149.0).sqrt()
        )
    );

    // Below 100 tokens llama.cpp prints no final statistics.
    let mut few = KldAccumulator::new();
    let mut raw = vec![0; compressed_row_len(4)];
    compress_log_probs(&[1.0, 2.0, 3.0, 4.0], 1, &mut raw).unwrap();
    let row = CompressedRow::from_raw(&raw, 4).unwrap();
    few.add_token(&row, &[1.0, 2.0, 3.0, 4.0], 1).unwrap();
    assert!(few.report().is_none());
    assert!(matches!(
        few.add_token(&row, &[1.0, 2.0, 3.0], 1),
        Err(PerplexityError::RowLength {
            got: 3,
            expected: 4
        })
    ));
}

/// A fuzz-style property test of the `--kl-divergence-base` reader: a valid file mutated
/// thousands of times with a fixed seed (bits flipped, words set to boundary values, cut,
/// spliced) is read to the end and every row decoded. Nothing panics; an accepted file has the
/// sizes its header promises and tokens inside its vocabulary.
#[test]
fn mutated_logits_files_never_panic() {
    const INTERESTING: [u32; 9] = [
        0,
        1,
        2,
        255,
        0x7FFF,
        0xFFFF,
        0x7FFF_FFFF,
        0x8000_0000,
        u32::MAX,
    ];
    let base = synthetic_file(10, 33, 3, 11).bytes;
    let mut rng = Rng(0x1234_5678);
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..3000 {
        let mut bytes = base.clone();
        for _ in 0..1 + rng.next_u64() % 3 {
            if bytes.is_empty() {
                break;
            }
            let at = (rng.next_u64() % bytes.len() as u64) as usize;
            match rng.next_u64() % 5 {
                0 => bytes[at] ^= 1 << (rng.next_u64() % 8),
                1 => {
                    // Most of the header is three i32 fields at 8, 12 and 16.
                    let at =
                        [8usize, 12, 16, at][(rng.next_u64() % 4) as usize].min(bytes.len() - 1);
                    let v = INTERESTING[(rng.next_u64() % 9) as usize].to_le_bytes();
                    let n = 4.min(bytes.len() - at);
                    bytes[at..at + n].copy_from_slice(&v[..n]);
                }
                2 => bytes.truncate(at),
                3 => {
                    let n = (rng.next_u64() % 64) as usize;
                    bytes.splice(at..at, std::iter::repeat_n(rng.next_u64() as u8, n));
                }
                _ => {
                    let end = (at + 1 + (rng.next_u64() % 64) as usize).min(bytes.len());
                    bytes.drain(at..end);
                }
            }
        }
        match read_all(Cursor::new(&bytes[..])) {
            Ok((tokens, chunks)) => {
                accepted += 1;
                let reader = LogitsFileReader::new(Cursor::new(&bytes[..])).unwrap();
                let n_vocab = reader.header().n_vocab;
                assert!(tokens.iter().all(|&t| (t as usize) < n_vocab));
                for c in &chunks {
                    for row in c.rows() {
                        // Every value decodes; an out-of-range index or target is an error.
                        assert!((0..row.n_vocab()).all(|i| row.log_prob(i).is_some()));
                        assert!(row.log_prob(row.n_vocab()).is_none());
                        let _ = row.nll(u32::MAX);
                    }
                }
            }
            Err(_) => refused += 1,
        }
    }
    assert!(refused > 1000, "{accepted} accepted, {refused} refused");
}
