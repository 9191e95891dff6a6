//! The individual samplers, each a port of its `llama_sampler_*_apply` in llama.cpp's
//! `src/llama-sampler.cpp`. Where llama.cpp would assert, read out of bounds or produce
//! NaN, the deviation is noted at the spot.

use std::collections::VecDeque;

use crate::candidates::{Candidates, TokenData, by_logit_desc};
use crate::rng::{Mt19937, resolve_seed};

/// Above this many unsorted candidates, top-p first tries the best 256 only.
const TOP_P_SORT_ALL_MAX: usize = 1024;
const TOP_P_FIRST_K: usize = 256;

/// One stage of a sampler chain.
#[derive(Clone, Debug)]
pub enum Sampler {
    /// Selects the highest logit (first on ties).
    Greedy,
    /// Selects from the softmax distribution with a seeded Mersenne Twister.
    Dist(Dist),
    /// Divides logits by `temp`; `temp <= 0` keeps only the best token.
    Temp {
        temp: f32,
    },
    /// Dynamic temperature in `[temp - delta, temp + delta]` by normalized entropy.
    TempExt {
        temp: f32,
        delta: f32,
        exponent: f32,
    },
    TopK {
        k: i32,
    },
    TopP {
        p: f32,
        min_keep: usize,
    },
    MinP {
        p: f32,
        min_keep: usize,
    },
    Typical {
        p: f32,
        min_keep: usize,
    },
    TopNSigma {
        n: f32,
    },
    Xtc(Xtc),
    Penalties(Penalties),
    LogitBias(LogitBias),
}

impl Sampler {
    pub fn dist(seed: u32) -> Self {
        Sampler::Dist(Dist::new(seed))
    }

    /// llama.cpp's sampler name (as `common_sampler_print` shows it).
    pub fn name(&self) -> &'static str {
        match self {
            Sampler::Greedy => "greedy",
            Sampler::Dist(_) => "dist",
            Sampler::Temp { .. } => "temp",
            Sampler::TempExt { .. } => "temp-ext",
            Sampler::TopK { .. } => "top-k",
            Sampler::TopP { .. } => "top-p",
            Sampler::MinP { .. } => "min-p",
            Sampler::Typical { .. } => "typical",
            Sampler::TopNSigma { .. } => "top-n-sigma",
            Sampler::Xtc(_) => "xtc",
            Sampler::Penalties(_) => "penalties",
            Sampler::LogitBias(_) => "logit-bias",
        }
    }

    pub fn apply(&mut self, cur: &mut Candidates) {
        match self {
            Sampler::Greedy => greedy(cur),
            Sampler::Dist(d) => d.apply(cur),
            Sampler::Temp { temp } => temp_impl(cur, *temp),
            Sampler::TempExt {
                temp,
                delta,
                exponent,
            } => temp_ext(cur, *temp, *delta, *exponent),
            Sampler::TopK { k } => top_k(cur, *k),
            Sampler::TopP { p, min_keep } => top_p(cur, *p, *min_keep),
            Sampler::MinP { p, min_keep } => min_p(cur, *p, *min_keep),
            Sampler::Typical { p, min_keep } => typical(cur, *p, *min_keep),
            Sampler::TopNSigma { n } => top_n_sigma(cur, *n),
            Sampler::Xtc(x) => x.apply(cur),
            Sampler::Penalties(pen) => pen.apply(cur),
            Sampler::LogitBias(lb) => lb.apply(cur),
        }
    }

    /// Tells a stateful sampler the token that was finally chosen.
    pub fn accept(&mut self, token: u32) {
        if let Sampler::Penalties(p) = self {
            p.accept(token);
        }
    }

    /// Back to the state right after construction (history cleared, RNG reseeded).
    pub fn reset(&mut self) {
        match self {
            Sampler::Dist(d) => d.reset(),
            Sampler::Xtc(x) => x.reset(),
            Sampler::Penalties(p) => p.reset(),
            _ => {}
        }
    }
}

/// `llama_sampler_greedy_apply`.
pub fn greedy(cur: &mut Candidates) {
    if cur.data.is_empty() {
        cur.selected = None;
        return;
    }
    let mut sel = 0;
    for i in 1..cur.data.len() {
        if cur.data[i].logit > cur.data[sel].logit {
            sel = i;
        }
    }
    cur.selected = Some(sel);
}

/// `llama_sampler_temp_impl`. A NaN `temp` counts as `<= 0` (llama.cpp would turn
/// every logit into NaN).
pub fn temp_impl(cur: &mut Candidates, temp: f32) {
    if cur.data.is_empty() {
        return;
    }
    if temp <= 0.0 || temp.is_nan() {
        let mut max_i = 0;
        let mut max_l = cur.data[0].logit;
        for i in 1..cur.data.len() {
            if cur.data[i].logit > max_l {
                cur.data[max_i].logit = f32::NEG_INFINITY;
                max_i = i;
                max_l = cur.data[i].logit;
            } else {
                cur.data[i].logit = f32::NEG_INFINITY;
            }
        }
        return;
    }
    for t in &mut cur.data {
        t.logit /= temp;
    }
}

/// `llama_sampler_temp_ext_apply` (dynamic temperature; plain temperature when
/// `delta <= 0`).
pub fn temp_ext(cur: &mut Candidates, temp: f32, delta: f32, exponent: f32) {
    if delta <= 0.0 || delta.is_nan() {
        temp_impl(cur, temp);
        return;
    }
    let min_temp = (temp - delta).max(0.0);
    let max_temp = temp + delta;
    if cur.data.len() <= 1 {
        return;
    }
    let max_entropy = -(1.0f32 / cur.data.len() as f32).ln();
    cur.softmax(true);
    let mut entropy = 0.0f32;
    for t in &cur.data {
        if t.p > 0.0 {
            entropy -= t.p * t.p.ln();
        }
    }
    let normalized_entropy = entropy / max_entropy;
    let dyn_temp = min_temp + (max_temp - min_temp) * normalized_entropy.powf(exponent);
    temp_impl(cur, dyn_temp);
    // llama.cpp re-normalizes in double here.
    let max_l = f64::from(cur.data[0].logit);
    let mut cum_sum = 0.0f64;
    for t in &mut cur.data {
        let p = (f64::from(t.logit) - max_l).exp();
        t.p = p as f32;
        cum_sum += p;
    }
    for t in &mut cur.data {
        t.p = (f64::from(t.p) / cum_sum) as f32;
    }
}

/// `llama_sampler_top_k_impl`: `k <= 0` is a no-op; otherwise the array ends up sorted
/// and cut to `min(k, len)` (even when `k >= len`, as in llama.cpp).
pub fn top_k(cur: &mut Candidates, k: i32) {
    if k <= 0 || cur.data.is_empty() {
        return;
    }
    let k = (k as usize).min(cur.data.len());
    if !cur.sorted {
        cur.partial_sort_truncate(k);
    }
    cur.data.truncate(k);
}

/// `llama_sampler_top_p_apply`: softmax in the incoming order, then keep the shortest
/// descending prefix whose cumulative probability reaches `p` (and `min_keep`).
pub fn top_p(cur: &mut Candidates, p: f32, min_keep: usize) {
    if p >= 1.0 || cur.data.is_empty() {
        return;
    }
    cur.softmax(false);
    let len = cur.data.len();
    // Unsorted and large: sort only the best 256 first, the rest if the mass isn't
    // reached within them. The prefix equals a full sort's, as in llama.cpp.
    let mut k = len;
    let mut tail_sorted = cur.sorted;
    if !cur.sorted {
        if len > TOP_P_SORT_ALL_MAX {
            k = TOP_P_FIRST_K.min(len);
            cur.data.select_nth_unstable_by(k - 1, by_logit_desc);
            cur.data[..k].sort_unstable_by(by_logit_desc);
        } else {
            cur.data.sort_unstable_by(by_logit_desc);
            tail_sorted = true;
        }
    }
    let mut cum_sum = 0.0f32;
    let mut last_idx = len;
    for i in 0..len {
        cum_sum += cur.data[i].p;
        if cum_sum >= p && i + 1 >= min_keep {
            last_idx = i + 1;
            break;
        }
        if !tail_sorted && i + 1 == k {
            cur.data[k..].sort_unstable_by(by_logit_desc);
            tail_sorted = true;
        }
    }
    cur.data.truncate(last_idx);
    cur.sorted = true;
}

/// `llama_sampler_min_p_apply`: keep tokens with `p >= p_min * p_max`, i.e. logits at
/// least `max + ln(p_min)`. Unsorted input keeps its order.
pub fn min_p(cur: &mut Candidates, p: f32, min_keep: usize) {
    if p <= 0.0 || cur.data.is_empty() {
        return;
    }
    let mut applied = false;
    if !cur.sorted {
        let mut max_logit = -f32::MAX;
        for t in &cur.data {
            if max_logit < t.logit {
                max_logit = t.logit;
            }
        }
        let min_logit = max_logit + p.ln();
        cur.buf.clear();
        cur.buf
            .extend(cur.data.iter().filter(|t| t.logit >= min_logit).copied());
        if !cur.buf.is_empty() && cur.buf.len() >= min_keep {
            // Copy back rather than swap, so `data` keeps its full-vocabulary capacity.
            cur.data.clear();
            cur.data.extend_from_slice(&cur.buf);
            applied = true;
        }
    }
    if !applied {
        if !cur.sorted {
            let n = cur.data.len();
            cur.partial_sort_truncate(n);
        }
        let min_logit = cur.data[0].logit + p.ln();
        let mut i = 1;
        while i < cur.data.len() {
            if cur.data[i].logit < min_logit && i >= min_keep {
                break;
            }
            i += 1;
        }
        cur.data.truncate(i);
    }
}

/// `llama_sampler_typical_apply` (locally typical sampling). Zero-probability tokens
/// are left out of the entropy (llama.cpp would compute `0 * -inf = NaN` there).
pub fn typical(cur: &mut Candidates, p: f32, min_keep: usize) {
    if p >= 1.0 || cur.data.is_empty() {
        return;
    }
    cur.softmax(true);
    let mut entropy = 0.0f32;
    for t in &cur.data {
        if t.p > 0.0 {
            entropy += -t.p * t.p.ln();
        }
    }
    cur.scores.clear();
    cur.scores
        .extend(cur.data.iter().map(|t| (-t.p.ln() - entropy).abs()));
    cur.order.clear();
    cur.order.extend(0..cur.data.len() as u32);
    let scores = &cur.scores;
    // Ties keep their index order (std::sort leaves them unspecified).
    cur.order.sort_unstable_by(|&a, &b| {
        scores[a as usize]
            .total_cmp(&scores[b as usize])
            .then(a.cmp(&b))
    });
    let mut cum_sum = 0.0f32;
    let mut last_idx = cur.order.len();
    for (i, &idx) in cur.order.iter().enumerate() {
        cum_sum += cur.data[idx as usize].p;
        if cum_sum > p && (min_keep == 0 || i + 1 >= min_keep) {
            last_idx = i + 1;
            break;
        }
    }
    cur.buf.clear();
    cur.buf
        .extend(cur.order[..last_idx].iter().map(|&i| cur.data[i as usize]));
    cur.data.clear();
    cur.data.extend_from_slice(&cur.buf);
    cur.sorted = false;
}

/// `llama_sampler_top_n_sigma_apply`: mask logits below `max - n * stddev` to -inf.
pub fn top_n_sigma(cur: &mut Candidates, n: f32) {
    if n <= 0.0 || cur.data.len() <= 1 {
        return;
    }
    let mut max = cur.data[0].logit;
    let mut logits_sum = 0.0f32;
    let mut valid = 0usize;
    for t in &cur.data {
        if t.logit != f32::NEG_INFINITY {
            if max < t.logit {
                max = t.logit;
            }
            logits_sum += t.logit;
            valid += 1;
        }
    }
    let mean = if valid > 0 {
        logits_sum / valid as f32
    } else {
        0.0
    };
    let mut acc = 0.0f32;
    for t in &cur.data {
        if t.logit != f32::NEG_INFINITY {
            // pow(float, 2) runs in double in C++.
            acc = (f64::from(acc) + f64::from(t.logit - mean).powi(2)) as f32;
        }
    }
    let std = if valid > 0 {
        (acc / valid as f32).sqrt()
    } else {
        0.0
    };
    let cutoff = max - n * std;
    for t in &mut cur.data {
        if t.logit < cutoff {
            t.logit = f32::NEG_INFINITY;
        }
    }
    cur.softmax(true);
}

/// The final, selecting stage: llama.cpp's `dist` sampler.
#[derive(Clone, Debug)]
pub struct Dist {
    /// As given; `DEFAULT_SEED` re-resolves to a fresh random seed on reset.
    seed_arg: u32,
    /// The seed in use.
    seed: u32,
    rng: Mt19937,
}

impl Dist {
    /// `seed == rng::DEFAULT_SEED` picks a random seed (see [`Dist::seed`]).
    pub fn new(seed: u32) -> Self {
        let seed_cur = resolve_seed(seed);
        Dist {
            seed_arg: seed,
            seed: seed_cur,
            rng: Mt19937::new(seed_cur),
        }
    }

    /// The seed actually in use (the random one if constructed with the default).
    pub fn seed(&self) -> u32 {
        self.seed
    }

    pub fn reset(&mut self) {
        self.seed = resolve_seed(self.seed_arg);
        self.rng.seed(self.seed);
    }

    /// `llama_sampler_dist_apply`: softmax with a double sum, one
    /// `uniform_real_distribution<double>` draw, and a running double sum in the
    /// current candidate order until it reaches `sum * rnd`.
    ///
    /// If the distribution is degenerate (every logit -inf, or a +inf logit, so the sum
    /// is 0/NaN/inf) it selects the highest logit, lowest id on ties, and makes `p`
    /// one-hot. llama.cpp would select the last candidate there.
    pub fn apply(&mut self, cur: &mut Candidates) {
        if cur.data.is_empty() {
            cur.selected = None;
            return;
        }
        cur.selected = Some(0);
        if cur.data.len() == 1 {
            // llama.cpp draws here too, keeping the random sequence the same whatever
            // the truncation left (its backend sampling draws once per output).
            self.rng.uniform_f64();
            cur.data[0].p = 1.0;
            return;
        }
        let mut max_l = cur.data[0].logit;
        if !cur.sorted {
            for t in &cur.data[1..] {
                if max_l < t.logit {
                    max_l = t.logit;
                }
            }
        }
        let mut sum_cum = 0.0f64;
        for t in &mut cur.data {
            let p = (t.logit - max_l).exp();
            t.p = p;
            sum_cum += f64::from(p);
        }
        let rnd = self.rng.uniform_f64();
        if !(sum_cum.is_finite() && sum_cum > 0.0) {
            degenerate_pick(cur);
            return;
        }
        let sum_tgt = sum_cum * rnd;
        let mut sum_run = 0.0f64;
        let mut found = None;
        for (i, t) in cur.data.iter_mut().enumerate() {
            if found.is_none() {
                sum_run += f64::from(t.p);
                if sum_run >= sum_tgt {
                    found = Some(i);
                }
            }
            t.p = (f64::from(t.p) / sum_cum) as f32;
        }
        cur.selected = Some(found.unwrap_or(cur.data.len() - 1));
    }
}

fn degenerate_pick(cur: &mut Candidates) {
    let mut best = 0;
    for (i, t) in cur.data.iter().enumerate() {
        let b = &cur.data[best];
        let better = match t.logit.total_cmp(&b.logit) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Equal => t.id < b.id,
            std::cmp::Ordering::Less => false,
        };
        if better {
            best = i;
        }
    }
    for (i, t) in cur.data.iter_mut().enumerate() {
        t.p = if i == best { 1.0 } else { 0.0 };
    }
    cur.selected = Some(best);
}

/// XTC ("exclude top choices"), `llama_sample_xtc_apply`.
#[derive(Clone, Debug)]
pub struct Xtc {
    probability: f32,
    threshold: f32,
    min_keep: usize,
    seed: u32,
    rng: Mt19937,
}

impl Xtc {
    pub fn new(probability: f32, threshold: f32, min_keep: usize, seed: u32) -> Self {
        Xtc {
            probability,
            threshold,
            min_keep,
            seed,
            rng: Mt19937::new(resolve_seed(seed)),
        }
    }

    pub fn reset(&mut self) {
        self.rng.seed(resolve_seed(self.seed));
    }

    pub fn apply(&mut self, cur: &mut Candidates) {
        if self.probability <= 0.0 || self.threshold > 0.5 || cur.data.len() < 2 {
            return;
        }
        let chance = self.rng.uniform_f32();
        if chance > self.probability {
            return;
        }
        cur.softmax(true);
        let mut pos_last = 0;
        for (i, t) in cur.data.iter().enumerate() {
            if t.p >= self.threshold {
                pos_last = i;
            } else {
                break;
            }
        }
        if cur.data.len() - pos_last >= self.min_keep && pos_last > 0 {
            cur.data.drain(..pos_last);
        }
    }
}

/// Repeat / frequency / presence penalties over the last `last_n` accepted tokens
/// (`llama_sampler_penalties_*`).
#[derive(Clone, Debug)]
pub struct Penalties {
    last_n: usize,
    repeat: f32,
    freq: f32,
    present: f32,
    prev: VecDeque<u32>,
    /// Occurrences in `prev`, indexed by token id (ids `>= n_vocab` are never candidates,
    /// so they are kept in `prev` but not counted).
    counts: Vec<u32>,
}

impl Penalties {
    /// `last_n < 0` is treated as 0 (disabled), as `llama_sampler_init_penalties` does;
    /// resolve llama.cpp's `-1 = context size` before (see
    /// [`crate::SamplingParams::with_n_ctx`]).
    pub fn new(n_vocab: usize, last_n: i32, repeat: f32, freq: f32, present: f32) -> Self {
        let last_n = last_n.max(0) as usize;
        let active = last_n > 0 && !(repeat == 1.0 && freq == 0.0 && present == 0.0);
        Penalties {
            last_n,
            repeat,
            freq,
            present,
            // Capacity from a request is only a hint: the window grows as tokens arrive.
            prev: VecDeque::with_capacity(last_n.min(4096)),
            counts: if active { vec![0; n_vocab] } else { Vec::new() },
        }
    }

    fn is_noop(&self) -> bool {
        self.last_n == 0 || (self.repeat == 1.0 && self.freq == 0.0 && self.present == 0.0)
    }

    pub fn accept(&mut self, token: u32) {
        if self.is_noop() {
            return;
        }
        if let Some(c) = self.counts.get_mut(token as usize) {
            *c += 1;
        }
        if self.prev.len() >= self.last_n {
            let old = self.prev.pop_front();
            if let Some(c) = old.and_then(|o| self.counts.get_mut(o as usize)) {
                *c -= 1;
            }
        }
        self.prev.push_back(token);
    }

    pub fn apply(&mut self, cur: &mut Candidates) {
        if self.is_noop() {
            return;
        }
        for t in &mut cur.data {
            let count = self.counts.get(t.id as usize).copied().unwrap_or(0);
            // A token already at -inf (masked by a grammar or a logit bias) stays there: a
            // negative `repeat_penalty` would turn it into +inf (or 0 into NaN) and pick a
            // token the grammar forbids (found by the `server_request` fuzzer as a 500).
            if count == 0 || t.logit == f32::NEG_INFINITY {
                continue;
            }
            // Multiply negative logits, divide positive ones: dividing a negative logit
            // would make the token more likely.
            if t.logit <= 0.0 {
                t.logit *= self.repeat;
            } else {
                t.logit /= self.repeat;
            }
            t.logit -= count as f32 * self.freq + self.present;
        }
        cur.sorted = false;
    }

    pub fn reset(&mut self) {
        self.prev.clear();
        self.counts.iter_mut().for_each(|c| *c = 0);
    }
}

/// Additive per-token logit bias (`llama_sampler_logit_bias_apply`).
#[derive(Clone, Debug, Default)]
pub struct LogitBias {
    bias: Vec<(u32, f32)>,
    to_search: Vec<(u32, f32)>,
}

impl LogitBias {
    pub fn new(bias: &[(u32, f32)]) -> Self {
        LogitBias {
            bias: bias.to_vec(),
            to_search: Vec::with_capacity(bias.len()),
        }
    }

    pub fn apply(&mut self, cur: &mut Candidates) {
        if self.bias.is_empty() {
            return;
        }
        self.to_search.clear();
        // Fast path: the candidate at index `id` is still token `id` (not reordered yet).
        for &(token, bias) in &self.bias {
            match cur.data.get_mut(token as usize) {
                Some(t) if t.id == token => t.logit += bias,
                _ => self.to_search.push((token, bias)),
            }
        }
        if self.to_search.is_empty() {
            return;
        }
        for t in &mut cur.data {
            if let Some(&(_, bias)) = self.to_search.iter().find(|(tok, _)| *tok == t.id) {
                t.logit += bias;
            }
        }
    }
}

/// Probability of the best `n` tokens under the full-vocabulary softmax of `logits`
/// (what llama-server reports for `n_probs` / `logprobs` before sampling), best first.
/// NaN logits count as -inf. Sums run in f32 like llama.cpp's, but over token order
/// rather than sorted order, so values can differ from llama-server's in the last bit.
pub fn top_probs(logits: &[f32], n: usize) -> Vec<TokenData> {
    let Some((max_l, sum)) = softmax_stats(logits) else {
        return Vec::new();
    };
    let n = n.min(logits.len());
    // One pass keeping the best n in descending order: O(n_vocab) for the small n
    // servers ask for, without copying the vocabulary.
    let mut top: Vec<TokenData> = Vec::with_capacity(n + 1);
    if n == 0 {
        return top;
    }
    for (i, &l) in logits.iter().enumerate() {
        let l = if l.is_nan() { f32::NEG_INFINITY } else { l };
        if top.len() == n && top.last().is_some_and(|t| t.logit >= l) {
            continue;
        }
        // After existing equal logits, so ties keep the lower id first.
        let pos = top.partition_point(|t| t.logit >= l);
        top.insert(
            pos,
            TokenData {
                id: i as u32,
                logit: l,
                p: 0.0,
            },
        );
        top.truncate(n);
    }
    for t in &mut top {
        t.p = (t.logit - max_l).exp() / sum;
    }
    top
}

/// Probability of `token` under the full-vocabulary softmax of `logits`; `None` if the
/// token is out of range.
pub fn token_prob(logits: &[f32], token: u32) -> Option<f32> {
    let l = *logits.get(token as usize)?;
    let (max_l, sum) = softmax_stats(logits)?;
    let l = if l.is_nan() { f32::NEG_INFINITY } else { l };
    Some((l - max_l).exp() / sum)
}

fn softmax_stats(logits: &[f32]) -> Option<(f32, f32)> {
    let clean = |l: f32| if l.is_nan() { f32::NEG_INFINITY } else { l };
    let max_l = logits.iter().copied().map(clean).reduce(f32::max)?;
    let sum: f32 = logits.iter().map(|&l| (clean(l) - max_l).exp()).sum();
    Some((max_l, sum))
}

impl TokenData {
    /// Natural log of `p` (-inf for 0), what OpenAI-style `logprobs` report.
    pub fn logprob(&self) -> f32 {
        self.p.ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lone candidate still takes a draw (llama.cpp 0c1e570's dist sampler), so what
    /// follows is sampled with the same random numbers as llama.cpp's.
    #[test]
    fn dist_draws_for_a_lone_candidate() {
        let mut a = Dist::new(42);
        let mut b = Dist::new(42);
        let mut one = Candidates::from_logits(&[1.0]);
        a.apply(&mut one);
        assert_eq!(one.selected, Some(0));
        b.rng.uniform_f64();
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        for _ in 0..20 {
            let mut x = Candidates::from_logits(&logits);
            let mut y = Candidates::from_logits(&logits);
            a.apply(&mut x);
            b.apply(&mut y);
            assert_eq!(x.selected, y.selected);
        }
    }
}
