//! The sampler chain the generation loop and server drive (llama.cpp's
//! `common_sampler` built by `common_sampler_init`).

use crate::SampleError;
use crate::candidates::Candidates;
use crate::params::{SamplerType, SamplingParams};
use crate::samplers::{LogitBias, Penalties, Sampler, Xtc};
use lamina_grammar::Matcher;
use std::time::Instant;

/// Logit bias, the configured stages in order, then `dist`.
///
/// Per token: [`SamplerChain::sample`] with that position's logits, then
/// [`SamplerChain::accept`] with the token actually emitted (the chosen one, or a
/// forced/draft token). `sample` does not accept by itself, like `common_sampler_sample`.
#[derive(Clone, Debug)]
pub struct SamplerChain {
    samplers: Vec<Sampler>,
    cur: Candidates,
    n_vocab: usize,
    grammar: Option<Constraint>,
}

/// A grammar with its mask buffer and the cost it has had.
#[derive(Clone, Debug)]
struct Constraint {
    matcher: Matcher,
    mask: Vec<u64>,
    stats: GrammarStats,
    /// A lazy grammar waits for one of these words in the output before it constrains
    /// anything (llama.cpp's lazy grammar with trigger words); `None` once triggered.
    awaiting: Option<Awaiting>,
    triggers: Vec<String>,
}

#[derive(Clone, Debug)]
struct Awaiting {
    triggers: Vec<String>,
    /// The output so far, searched for a trigger.
    text: Vec<u8>,
}

/// What constraining a generation cost: the sampled token was checked `checks` times
/// and the full mask computed `masks` times (when the check failed), taking
/// `mask_nanos` in all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrammarStats {
    pub checks: u64,
    pub masks: u64,
    pub check_nanos: u64,
    pub mask_nanos: u64,
}

impl SamplerChain {
    /// Builds the chain exactly as `common_sampler_init` orders it. Errors for an empty
    /// vocabulary and for samplers Lamina does not implement (active DRY, mirostat).
    pub fn new(params: &SamplingParams, n_vocab: usize) -> Result<Self, SampleError> {
        if n_vocab == 0 {
            return Err(SampleError::EmptyVocab);
        }
        if params.mirostat != 0 {
            return Err(SampleError::Unsupported("mirostat"));
        }
        let min_keep = params.min_keep as usize;
        let mut samplers = Vec::with_capacity(params.samplers.len() + 2);
        if !params.logit_bias.is_empty() {
            samplers.push(Sampler::LogitBias(LogitBias::new(&params.logit_bias)));
        }
        for ty in &params.samplers {
            match ty {
                SamplerType::Penalties => samplers.push(Sampler::Penalties(Penalties::new(
                    n_vocab,
                    params.penalty_last_n,
                    params.penalty_repeat,
                    params.penalty_freq,
                    params.penalty_present,
                ))),
                SamplerType::Dry => {
                    // Same inactivity test as llama.cpp's DRY sampler.
                    let active = params.dry_multiplier != 0.0
                        && params.dry_base >= 1.0
                        && params.dry_penalty_last_n != 0;
                    if active {
                        return Err(SampleError::Unsupported("dry"));
                    }
                }
                SamplerType::TopNSigma => samplers.push(Sampler::TopNSigma {
                    n: params.top_n_sigma,
                }),
                SamplerType::TopK => samplers.push(Sampler::TopK { k: params.top_k }),
                SamplerType::TypicalP => samplers.push(Sampler::Typical {
                    p: params.typ_p,
                    min_keep,
                }),
                SamplerType::TopP => samplers.push(Sampler::TopP {
                    p: params.top_p,
                    min_keep,
                }),
                SamplerType::MinP => samplers.push(Sampler::MinP {
                    p: params.min_p,
                    min_keep,
                }),
                SamplerType::Xtc => samplers.push(Sampler::Xtc(Xtc::new(
                    params.xtc_probability,
                    params.xtc_threshold,
                    min_keep,
                    params.seed,
                ))),
                SamplerType::Temperature => samplers.push(Sampler::TempExt {
                    temp: params.temp,
                    delta: params.dynatemp_range,
                    exponent: params.dynatemp_exponent,
                }),
            }
        }
        samplers.push(Sampler::dist(params.seed));
        Self::from_samplers(samplers, n_vocab)
    }

    /// A custom chain; it must end in a selecting sampler (`Dist` or `Greedy`) for
    /// `sample` to succeed.
    pub fn from_samplers(samplers: Vec<Sampler>, n_vocab: usize) -> Result<Self, SampleError> {
        if n_vocab == 0 {
            return Err(SampleError::EmptyVocab);
        }
        Ok(SamplerChain {
            samplers,
            cur: Candidates::with_capacity(n_vocab),
            n_vocab,
            grammar: None,
        })
    }

    /// Plain argmax.
    pub fn greedy(n_vocab: usize) -> Result<Self, SampleError> {
        Self::from_samplers(vec![Sampler::Greedy], n_vocab)
    }

    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Constrains every later `sample` by a grammar (`None` removes it). The matcher's
    /// vocabulary must be this chain's.
    pub fn set_grammar(&mut self, matcher: Option<Matcher>) {
        self.set_lazy_grammar(matcher, Vec::new());
    }

    /// A grammar that applies only from the first occurrence of one of `triggers` in
    /// the output on (the text from the trigger's start is fed to it then); before
    /// that the output is free. A trigger `^WORD` counts only at the start of the
    /// output (after whitespace). No triggers: it applies from the start.
    pub fn set_lazy_grammar(&mut self, matcher: Option<Matcher>, triggers: Vec<String>) {
        self.grammar = matcher.map(|matcher| Constraint {
            mask: vec![0; self.n_vocab.div_ceil(64)],
            matcher,
            stats: GrammarStats::default(),
            awaiting: (!triggers.is_empty()).then(|| Awaiting {
                triggers: triggers.clone(),
                text: Vec::new(),
            }),
            triggers,
        });
    }

    pub fn grammar(&self) -> Option<&Matcher> {
        self.grammar.as_ref().map(|g| &g.matcher)
    }

    /// The cost of the grammar so far (zero without one).
    pub fn grammar_stats(&self) -> GrammarStats {
        self.grammar.as_ref().map(|g| g.stats).unwrap_or_default()
    }

    /// Runs the chain over `logits` (one per vocabulary entry) and returns the chosen
    /// token. NaN logits count as -inf. Does not accept the token.
    ///
    /// With a grammar this is `common_sampler_sample` with `grammar_first = false`:
    /// the chain picks a token; if the grammar rejects it, the logits are masked by the
    /// grammar and the whole chain runs again (drawing again from the RNG, as
    /// llama.cpp's does).
    /// The candidates the last [`SamplerChain::sample`] left, with the probabilities it
    /// sampled from (llama.cpp's `common_sampler_get_candidates`, for
    /// `post_sampling_probs`).
    pub fn candidates(&self) -> &Candidates {
        &self.cur
    }

    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SampleError> {
        if logits.len() != self.n_vocab {
            return Err(SampleError::LogitsLen {
                got: logits.len(),
                expected: self.n_vocab,
            });
        }
        self.cur.fill_from_logits(logits);
        for s in &mut self.samplers {
            s.apply(&mut self.cur);
        }
        let id = self.cur.selected_token().ok_or(SampleError::NoSelection)?;
        let Some(g) = self.grammar.as_mut().filter(|g| g.awaiting.is_none()) else {
            return Ok(id);
        };
        let t0 = Instant::now();
        let ok = g.matcher.is_allowed(id);
        g.stats.checks += 1;
        g.stats.check_nanos += t0.elapsed().as_nanos() as u64;
        if ok {
            return Ok(id);
        }
        let t0 = Instant::now();
        let filled = g.matcher.fill_mask(&mut g.mask);
        g.stats.masks += 1;
        g.stats.mask_nanos += t0.elapsed().as_nanos() as u64;
        // A grammar too ambiguous to follow here is an error, not a dead end.
        filled?;
        if g.mask.iter().all(|&w| w == 0) {
            return Err(SampleError::GrammarDeadEnd);
        }
        self.cur.fill_from_logits(logits);
        for d in &mut self.cur.data {
            if g.mask[d.id as usize / 64] >> (d.id % 64) & 1 == 0 {
                d.logit = f32::NEG_INFINITY;
            }
        }
        for s in &mut self.samplers {
            s.apply(&mut self.cur);
        }
        self.cur.selected_token().ok_or(SampleError::NoSelection)
    }

    /// Records the emitted token in the grammar and in every stateful stage (penalty
    /// history). Errors only when a grammar rejects the token (one the chain did not
    /// sample, such as a forced one); the chain's state is then unchanged.
    pub fn accept(&mut self, token: u32) -> Result<(), SampleError> {
        if let Some(g) = self.grammar.as_mut() {
            match g.awaiting.as_mut() {
                None => g.matcher.accept(token)?,
                Some(a) => {
                    let seen = a.text.len();
                    a.text.extend_from_slice(g.matcher.vocab().piece(token));
                    let found = a
                        .triggers
                        .iter()
                        .filter_map(|t| find_trigger(&a.text, seen, t))
                        .min();
                    if let Some(at) = found {
                        let text = std::mem::take(&mut a.text);
                        g.awaiting = None;
                        g.matcher.accept_bytes(&text[at..])?;
                    }
                }
            }
        }
        for s in &mut self.samplers {
            s.accept(token);
        }
        Ok(())
    }

    /// Puts the grammar back at its start (a new answer under the same grammar, as each
    /// reply of a chat), leaving the other stages' history alone.
    pub fn reset_grammar(&mut self) {
        if let Some(g) = self.grammar.as_mut() {
            g.matcher.reset();
            g.awaiting = (!g.triggers.is_empty()).then(|| Awaiting {
                triggers: g.triggers.clone(),
                text: Vec::new(),
            });
        }
    }

    /// Records a token the model was given rather than generated (the prompt) in the
    /// stateful stages only, as `common_sampler_accept(.., is_generated = false)`: the
    /// grammar constrains only what is generated.
    pub fn accept_prompt(&mut self, token: u32) {
        for s in &mut self.samplers {
            s.accept(token);
        }
    }

    /// Forgets the history and reseeds (a fresh random seed if the seed was the default).
    pub fn reset(&mut self) {
        for s in &mut self.samplers {
            s.reset();
        }
        if let Some(g) = self.grammar.as_mut() {
            g.matcher.reset();
            g.awaiting = (!g.triggers.is_empty()).then(|| Awaiting {
                triggers: g.triggers.clone(),
                text: Vec::new(),
            });
        }
    }

    /// The candidates as the last `sample` left them: what survived the filters, with
    /// the final probabilities `dist` computed and `selected` set
    /// (llama.cpp's `common_sampler_get_candidates`, used for post-sampling probs).
    pub fn last_candidates(&self) -> &Candidates {
        &self.cur
    }

    /// The seed `dist` is using (the resolved random one when the default was given).
    pub fn seed(&self) -> Option<u32> {
        self.samplers.iter().rev().find_map(|s| match s {
            Sampler::Dist(d) => Some(d.seed()),
            _ => None,
        })
    }

    pub fn samplers(&self) -> &[Sampler] {
        &self.samplers
    }

    /// `logits -> logit-bias -> penalties -> ... -> dist`, like `common_sampler_print`.
    pub fn describe(&self) -> String {
        let mut s = String::from("logits ");
        for smpl in &self.samplers {
            s.push_str("-> ");
            s.push_str(smpl.name());
            s.push(' ');
        }
        s
    }
}

/// Where `trigger` occurs in `text`: anywhere, or, for a trigger written `^WORD`, only
/// at the start of the output (after whitespace), as llama.cpp's anchored trigger
/// patterns. `text[..seen]` was searched before without a match, so only occurrences
/// reaching past it are looked for (no rescan of the whole output per token).
fn find_trigger(text: &[u8], seen: usize, trigger: &str) -> Option<usize> {
    match trigger.strip_prefix('^') {
        Some(word) => {
            let start = text.iter().position(|b| !b.is_ascii_whitespace())?;
            text[start..].starts_with(word.as_bytes()).then_some(start)
        }
        None => {
            let from = seen.saturating_sub(trigger.len().saturating_sub(1));
            find(&text[from..], trigger.as_bytes()).map(|at| from + at)
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}
