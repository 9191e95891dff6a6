//! A deterministic stand-in model for tests, examples and the load test.
//!
//! Byte-level vocabulary (ids 0..256 are bytes) plus four control tokens. Each
//! sequence's KV cache holds its tokens with their positions and a rolling hash over them;
//! the logits at a position are a pure function of that hash. So a sequence's outputs depend
//! only on its own tokens, never on which other sequences share the batch, and any scheduler
//! slip (wrong position, wrong sequence id, stale cells after `seq_rm`) changes them. Moving
//! cached tokens ([`Engine::seq_add`]) is exact: the hashes are recomputed as if the tokens had
//! been evaluated at their new positions, as a real model's K-shift intends.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lamina_tokenizer::{CHATML_TEMPLATE, ChatTemplate};

use crate::engine::{Batch, ChatMessage, Engine, EngineError, Pos, SeqId, Token};

pub const BOS: Token = 256;
pub const EOS: Token = 257;
pub const IM_START: Token = 258;
pub const IM_END: Token = 259;
pub const N_VOCAB: usize = 260;
pub const N_EMBD: usize = 16;

const SPECIALS: [(&str, Token); 4] = [
    ("<s>", BOS),
    ("</s>", EOS),
    ("<|im_start|>", IM_START),
    ("<|im_end|>", IM_END),
];

/// Bytes the fake "prefers" to emit: text-like output with an occasional `é` (two bytes,
/// so streaming must hold back half a character).
const ALPHABET: &[u8] = b"etaoinshrdlu etaoinsh ,.\xC3";

/// What the fake engine has done, shared with tests.
#[derive(Debug, Default)]
pub struct FakeStats {
    pub decode_calls: AtomicU64,
    pub tokens_decoded: AtomicU64,
    /// Largest number of distinct sequences seen in one batch.
    pub max_seqs_per_batch: AtomicU64,
    /// The number of distinct sequences in each batch, in order.
    pub seqs_per_batch: std::sync::Mutex<Vec<u64>>,
}

/// The fake model; see the module doc.
pub struct FakeEngine {
    n_ctx: u32,
    n_seq: u32,
    /// Per sequence, its cached tokens in position order.
    kv: Vec<FakeSeq>,
    logits: Vec<f32>,
    template: ChatTemplate,
    decode_base: Duration,
    decode_per_token: Duration,
    stats: Arc<FakeStats>,
    /// Fill-in-the-middle tokens (prefix, suffix, middle), if the fake has them.
    fim: Option<(Token, Token, Token)>,
    rerank_template: Option<String>,
}

impl FakeEngine {
    /// The same engine with fill-in-the-middle tokens (`/infill`).
    pub fn with_fim(mut self, pre: Token, suf: Token, mid: Token) -> FakeEngine {
        self.fim = Some((pre, suf, mid));
        self
    }

    /// The same engine with a rerank prompt template (`{query}`, `{document}`).
    pub fn with_rerank_template(mut self, template: &str) -> FakeEngine {
        self.rerank_template = Some(template.to_string());
        self
    }

    /// The same engine with another chat template (Jinja source), for tests of
    /// template-specific behaviour such as tool-call formats.
    pub fn with_chat_template(mut self, source: &str) -> Result<FakeEngine, String> {
        self.template = ChatTemplate::new(source, "<s>", "</s>").map_err(|e| e.to_string())?;
        Ok(self)
    }

    /// `n_ctx` KV cells in all, split evenly over `n_seq` sequences.
    pub fn new(n_ctx: u32, n_seq: u32) -> FakeEngine {
        let n_seq = n_seq.max(1);
        FakeEngine {
            n_ctx,
            n_seq,
            kv: (0..n_seq).map(|_| FakeSeq::default()).collect(),
            logits: Vec::new(),
            template: ChatTemplate::new(CHATML_TEMPLATE, "<s>", "</s>")
                .expect("the built-in ChatML template compiles"),
            decode_base: Duration::ZERO,
            decode_per_token: Duration::ZERO,
            stats: Arc::default(),
            fim: None,
            rerank_template: None,
        }
    }

    /// Makes each `decode` take `base + per_token * batch_len` of wall time, to imitate a
    /// real model's cost profile (a fixed per-pass cost that batching amortizes).
    pub fn with_decode_cost(mut self, base: Duration, per_token: Duration) -> FakeEngine {
        self.decode_base = base;
        self.decode_per_token = per_token;
        self
    }

    pub fn stats(&self) -> Arc<FakeStats> {
        self.stats.clone()
    }

    /// Occupied cells of `seq_id` (for tests).
    pub fn seq_len(&self, seq_id: SeqId) -> usize {
        self.kv.get(seq_id as usize).map_or(0, |s| s.cells.len())
    }

    /// The logits after a sequence whose rolling hash is `h` and whose last token was `last`.
    pub fn logits_for(h: u64, last: Token, out: &mut [f32]) {
        for (i, l) in out.iter_mut().enumerate() {
            *l = unit(mix(h ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))) * 2.0;
        }
        if last == 0xC3 {
            // Complete the two-byte character.
            out[0xA9] += 20.0;
            return;
        }
        let r = mix(h.wrapping_add(0x5151));
        let first = ALPHABET[(r % ALPHABET.len() as u64) as usize];
        let second = ALPHABET[((r >> 16) % ALPHABET.len() as u64) as usize];
        out[first as usize] += 8.0;
        out[second as usize] += 6.5;
        if (r >> 32).is_multiple_of(19) {
            out[IM_END as usize] += 12.0;
        }
    }
}

fn mix(mut x: u64) -> u64 {
    // splitmix64 finalizer.
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn unit(x: u64) -> f32 {
    (x >> 40) as f32 / (1u64 << 24) as f32
}

fn step_hash(prev: u64, token: Token, pos: Pos) -> u64 {
    mix(prev ^ (u64::from(token) << 20) ^ u64::from(pos))
}

const HASH_SEED: u64 = 0x1234_5678_9ABC_DEF0;

/// One sequence's cache: `(token, position, rolling hash through it)` in position order; the
/// hashes from `valid` on are stale (cells were removed or moved) until the next decode.
#[derive(Clone, Debug, Default)]
struct FakeSeq {
    cells: Vec<(Token, Pos, u64)>,
    valid: usize,
}

impl FakeSeq {
    /// Recomputes the stale hashes; the positions must be `0..len` by then.
    fn refresh(&mut self) -> Result<(), EngineError> {
        for i in self.valid..self.cells.len() {
            let (t, p, _) = self.cells[i];
            if p as usize != i {
                return Err(EngineError::InvalidBatch(format!(
                    "the cache has a gap: position {p} in cell {i}"
                )));
            }
            let prev = if i == 0 {
                HASH_SEED
            } else {
                self.cells[i - 1].2
            };
            self.cells[i].2 = step_hash(prev, t, p);
        }
        self.valid = self.cells.len();
        Ok(())
    }

    fn last_hash(&self) -> u64 {
        self.cells.last().map_or(HASH_SEED, |c| c.2)
    }
}

impl Engine for FakeEngine {
    fn model_name(&self) -> String {
        "lamina-fake".to_string()
    }

    fn n_ctx(&self) -> u32 {
        self.n_ctx
    }

    fn n_vocab(&self) -> usize {
        N_VOCAB
    }

    fn n_seq_max(&self) -> u32 {
        self.n_seq
    }

    fn n_embd(&self) -> usize {
        N_EMBD
    }

    fn special_tokens(&self) -> crate::engine::SpecialTokens {
        crate::engine::SpecialTokens {
            fim_pre: self.fim.map(|f| f.0),
            fim_suf: self.fim.map(|f| f.1),
            fim_mid: self.fim.map(|f| f.2),
            ..Default::default()
        }
    }
    fn bos(&self) -> Option<Token> {
        Some(BOS)
    }

    fn is_eog(&self, token: Token) -> bool {
        token == EOS || token == IM_END
    }

    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<Token> {
        let mut out = Vec::with_capacity(text.len() + 1);
        if add_special {
            out.push(BOS);
        }
        let mut rest = text.as_bytes();
        'outer: while let Some((&b, tail)) = rest.split_first() {
            if parse_special && b == b'<' {
                for (s, id) in SPECIALS {
                    if rest.starts_with(s.as_bytes()) {
                        out.push(id);
                        rest = &rest[s.len()..];
                        continue 'outer;
                    }
                }
            }
            out.push(Token::from(b));
            rest = tail;
        }
        out
    }

    fn token_to_piece(&self, token: Token) -> Vec<u8> {
        match token {
            0..=255 => vec![token as u8],
            _ => SPECIALS
                .iter()
                .find(|(_, id)| *id == token)
                .map(|(s, _)| s.as_bytes().to_vec())
                .unwrap_or_default(),
        }
    }

    fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        self.apply_chat_template_with_tools(messages, None, add_generation_prompt)
    }
    fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        self.template
            .render(messages, tools, add_generation_prompt)
            .map_err(|e| EngineError::Template(e.to_string()))
    }
    fn chat_template_source(&self) -> String {
        self.template.source().to_string()
    }
    fn rerank_template(&self) -> Option<String> {
        self.rerank_template.clone()
    }

    fn decode(&mut self, batch: &Batch) -> Result<(), EngineError> {
        // Validate everything first, so a bad batch changes nothing.
        let n_ctx_seq = self.n_ctx_seq();
        for seq in &mut self.kv {
            seq.refresh()?;
        }
        let mut lens: Vec<usize> = self.kv.iter().map(|s| s.cells.len()).collect();
        let mut seqs_seen = vec![false; self.kv.len()];
        for e in batch.entries() {
            if e.token as usize >= N_VOCAB {
                return Err(EngineError::InvalidBatch(format!(
                    "token {} outside the vocabulary",
                    e.token
                )));
            }
            let Some(len) = lens.get_mut(e.seq_id as usize) else {
                return Err(EngineError::InvalidBatch(format!(
                    "sequence {} out of range",
                    e.seq_id
                )));
            };
            if e.pos as usize != *len {
                return Err(EngineError::InvalidBatch(format!(
                    "sequence {} expects position {}, got {}",
                    e.seq_id, len, e.pos
                )));
            }
            if e.pos >= n_ctx_seq {
                return Err(EngineError::ContextFull {
                    seq_id: e.seq_id,
                    pos: e.pos,
                });
            }
            *len += 1;
            seqs_seen[e.seq_id as usize] = true;
        }
        let n_out = batch.n_outputs();
        self.logits.clear();
        self.logits.resize(n_out * N_VOCAB, 0.0);
        let mut row = 0;
        for e in batch.entries() {
            let seq = &mut self.kv[e.seq_id as usize];
            let h = step_hash(seq.last_hash(), e.token, e.pos);
            seq.cells.push((e.token, e.pos, h));
            seq.valid = seq.cells.len();
            if e.want_logits {
                let out = &mut self.logits[row * N_VOCAB..(row + 1) * N_VOCAB];
                FakeEngine::logits_for(h, e.token, out);
                row += 1;
            }
        }
        let n_seqs = seqs_seen.iter().filter(|&&s| s).count() as u64;
        self.stats.decode_calls.fetch_add(1, Ordering::Relaxed);
        self.stats
            .tokens_decoded
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.stats
            .max_seqs_per_batch
            .fetch_max(n_seqs, Ordering::Relaxed);
        if let Ok(mut v) = self.stats.seqs_per_batch.lock() {
            v.push(n_seqs);
        }
        let cost = self.decode_base + self.decode_per_token * batch.len() as u32;
        if !cost.is_zero() {
            std::thread::sleep(cost);
        }
        Ok(())
    }

    fn logits(&self, i: usize) -> &[f32] {
        self.logits
            .get(i * N_VOCAB..(i + 1) * N_VOCAB)
            .unwrap_or(&[])
    }

    fn seq_state(&mut self, seq: SeqId) -> Result<Vec<u8>, EngineError> {
        let cells = self
            .kv
            .get_mut(seq as usize)
            .ok_or_else(|| EngineError::InvalidBatch(format!("no sequence {seq}")))?;
        cells.refresh()?;
        Ok(cells
            .cells
            .iter()
            .flat_map(|&(t, _, h)| t.to_le_bytes().into_iter().chain(h.to_le_bytes()))
            .collect())
    }

    fn set_seq_state(&mut self, seq: SeqId, data: &[u8]) -> Result<usize, EngineError> {
        let n_ctx_seq = self.n_ctx_seq() as usize;
        let cells = self
            .kv
            .get_mut(seq as usize)
            .ok_or_else(|| EngineError::InvalidBatch(format!("no sequence {seq}")))?;
        if !data.len().is_multiple_of(12) || data.len() / 12 > n_ctx_seq {
            return Err(EngineError::InvalidBatch(
                "not a state of this engine".into(),
            ));
        }
        cells.cells = data
            .chunks_exact(12)
            .enumerate()
            .map(|(i, b)| {
                let t = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                let h = u64::from_le_bytes([b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11]]);
                (t, i as Pos, h)
            })
            .collect();
        cells.valid = cells.cells.len();
        Ok(cells.cells.len())
    }

    fn seq_rm(&mut self, seq_id: SeqId, p0: Pos, p1: Option<Pos>) {
        let Some(seq) = self.kv.get_mut(seq_id as usize) else {
            return;
        };
        let p1 = p1.unwrap_or(Pos::MAX);
        let first = seq.cells.iter().position(|c| c.1 >= p0 && c.1 < p1);
        seq.cells.retain(|c| c.1 < p0 || c.1 >= p1);
        if let Some(i) = first {
            seq.valid = seq.valid.min(i);
        }
    }

    fn can_shift(&self) -> bool {
        true
    }

    fn seq_add(
        &mut self,
        seq_id: SeqId,
        p0: Pos,
        p1: Option<Pos>,
        delta: i32,
    ) -> Result<(), EngineError> {
        let seq = self
            .kv
            .get_mut(seq_id as usize)
            .ok_or_else(|| EngineError::InvalidBatch(format!("no sequence {seq_id}")))?;
        let p1 = p1.unwrap_or(Pos::MAX);
        let mut moved = false;
        for c in &mut seq.cells {
            if c.1 >= p0 && c.1 < p1 {
                moved = true;
                // Below 0: dropped (u32::MAX stands for -1).
                c.1 = u32::try_from(i64::from(c.1) + i64::from(delta)).unwrap_or(u32::MAX);
            }
        }
        if moved && delta != 0 {
            seq.cells.retain(|c| c.1 != u32::MAX);
            seq.cells.sort_by_key(|c| c.1);
            seq.valid = 0;
        }
        Ok(())
    }

    fn embed(&mut self, tokens: &[Token]) -> Result<Vec<f32>, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::InvalidBatch("no tokens to embed".into()));
        }
        let mut v = vec![0.0f32; N_EMBD];
        for &t in tokens {
            for (j, x) in v.iter_mut().enumerate() {
                *x += unit(mix((u64::from(t) << 8) ^ j as u64)) - 0.5;
            }
        }
        let n = tokens.len() as f32;
        v.iter_mut().for_each(|x| *x /= n);
        Ok(v)
    }
}
