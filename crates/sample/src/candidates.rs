//! The candidate array the samplers work on (llama.cpp's `llama_token_data_array`).

use std::cmp::Ordering;

/// One candidate token: id, (possibly transformed) logit, and probability once a
/// sampler has computed one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenData {
    pub id: u32,
    pub logit: f32,
    pub p: f32,
}

/// Candidates plus scratch buffers reused across tokens, so steady-state sampling does
/// not allocate.
///
/// `sorted` means `data` is in descending logit order; `selected` is the index into
/// `data` a selecting sampler (dist, greedy) picked.
#[derive(Clone, Debug, Default)]
pub struct Candidates {
    pub data: Vec<TokenData>,
    pub sorted: bool,
    pub selected: Option<usize>,
    pub(crate) buf: Vec<TokenData>,
    pub(crate) scores: Vec<f32>,
    pub(crate) order: Vec<u32>,
}

/// Descending by logit. `total_cmp` is a total order, so sorting can never panic; NaN
/// logits are replaced on load, so it agrees with `a.logit > b.logit` except that it
/// orders -0.0 after +0.0 (a tie in C++, whose sorts leave tie order unspecified anyway).
#[inline]
pub(crate) fn by_logit_desc(a: &TokenData, b: &TokenData) -> Ordering {
    b.logit.total_cmp(&a.logit)
}

impl Candidates {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacity(n: usize) -> Self {
        Candidates {
            data: Vec::with_capacity(n),
            buf: Vec::with_capacity(n),
            ..Self::default()
        }
    }

    /// Candidates `0..logits.len()` with the given logits, unsorted, nothing selected.
    pub fn from_logits(logits: &[f32]) -> Self {
        let mut c = Self::with_capacity(logits.len());
        c.fill_from_logits(logits);
        c
    }

    /// Candidates built like llama.cpp's test harness: `logit = ln(p)`, `p = p`.
    pub fn from_probs(probs: &[f32]) -> Self {
        let mut c = Self::with_capacity(probs.len());
        c.data
            .extend(probs.iter().enumerate().map(|(i, &p)| TokenData {
                id: i as u32,
                logit: p.ln(),
                p,
            }));
        c
    }

    /// Refills in place (no allocation once capacity suffices). NaN logits become
    /// -inf: a NaN token is never chosen and sorting stays well defined.
    pub fn fill_from_logits(&mut self, logits: &[f32]) {
        self.data.clear();
        self.data
            .extend(logits.iter().enumerate().map(|(i, &l)| TokenData {
                id: i as u32,
                logit: if l.is_nan() { f32::NEG_INFINITY } else { l },
                p: 0.0,
            }));
        self.sorted = false;
        self.selected = None;
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The token a selecting sampler picked, if any.
    pub fn selected_token(&self) -> Option<u32> {
        self.selected.and_then(|i| self.data.get(i)).map(|t| t.id)
    }

    /// Keeps the `n` highest logits, sorted descending (llama.cpp's
    /// `llama_token_data_array_partial_sort_inplace`).
    pub(crate) fn partial_sort_truncate(&mut self, n: usize) {
        let n = n.min(self.data.len());
        if n == 0 {
            self.data.clear();
        } else {
            if n < self.data.len() {
                self.data.select_nth_unstable_by(n - 1, by_logit_desc);
                self.data.truncate(n);
            }
            self.data.sort_unstable_by(by_logit_desc);
        }
        self.sorted = true;
    }

    /// llama.cpp's `llama_sampler_softmax_impl`: f32 accumulation, in the current order.
    pub(crate) fn softmax(&mut self, do_sort: bool) {
        if self.data.is_empty() {
            return;
        }
        if do_sort && !self.sorted {
            let n = self.data.len();
            self.partial_sort_truncate(n);
        }
        let mut max_l = self.data[0].logit;
        if !self.sorted {
            for t in &self.data[1..] {
                // std::max(a, b) keeps `a` unless a < b.
                if max_l < t.logit {
                    max_l = t.logit;
                }
            }
        }
        let mut cum_sum = 0.0f32;
        for t in &mut self.data {
            let p = (t.logit - max_l).exp();
            t.p = p;
            cum_sum += p;
        }
        for t in &mut self.data {
            t.p /= cum_sum;
        }
    }
}
