//! Sampling parameters with llama.cpp's defaults (`common_params_sampling` in
//! `common/common.h`), deserializable from llama-server style JSON.

use serde::{Deserialize, Deserializer};

use crate::rng::DEFAULT_SEED;

/// A stage of the configurable part of the chain (llama.cpp's `common_sampler_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SamplerType {
    Penalties,
    Dry,
    TopNSigma,
    TopK,
    TypicalP,
    TopP,
    MinP,
    Xtc,
    Temperature,
}

impl SamplerType {
    /// llama.cpp's default order: `penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature`.
    pub const DEFAULT_ORDER: [SamplerType; 9] = [
        SamplerType::Penalties,
        SamplerType::Dry,
        SamplerType::TopNSigma,
        SamplerType::TopK,
        SamplerType::TypicalP,
        SamplerType::TopP,
        SamplerType::MinP,
        SamplerType::Xtc,
        SamplerType::Temperature,
    ];

    /// Canonical names (`top_k`, ...) and, with `allow_alt`, llama.cpp's alternative
    /// spellings (`top-k`, `nucleus`, `temp`, ...).
    pub fn from_name(name: &str, allow_alt: bool) -> Option<Self> {
        let canonical = match name {
            "penalties" => Some(SamplerType::Penalties),
            "dry" => Some(SamplerType::Dry),
            "top_n_sigma" => Some(SamplerType::TopNSigma),
            "top_k" => Some(SamplerType::TopK),
            "typ_p" => Some(SamplerType::TypicalP),
            "top_p" => Some(SamplerType::TopP),
            "min_p" => Some(SamplerType::MinP),
            "xtc" => Some(SamplerType::Xtc),
            "temperature" => Some(SamplerType::Temperature),
            _ => None,
        };
        if canonical.is_some() || !allow_alt {
            return canonical;
        }
        match name {
            "top-k" => Some(SamplerType::TopK),
            "top-p" | "nucleus" => Some(SamplerType::TopP),
            "top-n-sigma" => Some(SamplerType::TopNSigma),
            "typical-p" | "typical" | "typ-p" | "typ" => Some(SamplerType::TypicalP),
            "min-p" => Some(SamplerType::MinP),
            "temp" => Some(SamplerType::Temperature),
            _ => None,
        }
    }

    /// llama.cpp's one-letter codes (`--sampling-seq edskypmxt`); unknown letters are
    /// skipped, as llama.cpp does (it logs a warning).
    pub fn from_chars(chars: &str) -> Vec<Self> {
        chars
            .chars()
            .filter_map(|c| match c {
                'e' => Some(SamplerType::Penalties),
                'd' => Some(SamplerType::Dry),
                's' => Some(SamplerType::TopNSigma),
                'k' => Some(SamplerType::TopK),
                'y' => Some(SamplerType::TypicalP),
                'p' => Some(SamplerType::TopP),
                'm' => Some(SamplerType::MinP),
                'x' => Some(SamplerType::Xtc),
                't' => Some(SamplerType::Temperature),
                _ => None,
            })
            .collect()
    }
}

/// Everything that configures a [`crate::SamplerChain`]. Field names follow llama.cpp's
/// `common_params_sampling`; serde also accepts llama-server's request names
/// (`temperature`, `typical_p`, `repeat_last_n`, `repeat_penalty`, `frequency_penalty`,
/// `presence_penalty`). Missing fields take llama.cpp's defaults.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// `0xFFFF_FFFF` (or any negative number in JSON) means a random seed.
    #[serde(deserialize_with = "de_seed")]
    pub seed: u32,
    /// How many top probabilities the server reports per token (0 = none).
    pub n_probs: u32,
    /// Samplers keep at least this many candidates (0 = no minimum).
    pub min_keep: u32,
    /// `<= 0` disables.
    pub top_k: i32,
    /// `1.0` disables.
    pub top_p: f32,
    /// `0.0` disables.
    pub min_p: f32,
    /// `0.0` disables.
    pub xtc_probability: f32,
    /// `> 0.5` disables.
    pub xtc_threshold: f32,
    /// `1.0` disables.
    #[serde(alias = "typical_p")]
    pub typ_p: f32,
    /// `<= 0` samples greedily.
    #[serde(alias = "temperature")]
    pub temp: f32,
    /// `0.0` disables dynamic temperature.
    pub dynatemp_range: f32,
    pub dynatemp_exponent: f32,
    /// Window of past tokens the penalties look at; 0 disables, -1 means the context
    /// size (resolve it with [`SamplingParams::with_n_ctx`]).
    #[serde(alias = "repeat_last_n")]
    pub penalty_last_n: i32,
    /// `1.0` disables.
    #[serde(alias = "repeat_penalty")]
    pub penalty_repeat: f32,
    #[serde(alias = "frequency_penalty")]
    pub penalty_freq: f32,
    #[serde(alias = "presence_penalty")]
    pub penalty_present: f32,
    /// DRY is not implemented: a non-zero multiplier is rejected by the chain.
    pub dry_multiplier: f32,
    pub dry_base: f32,
    pub dry_allowed_length: i32,
    pub dry_penalty_last_n: i32,
    /// Mirostat is not implemented: non-zero is rejected by the chain.
    pub mirostat: i32,
    pub mirostat_tau: f32,
    pub mirostat_eta: f32,
    /// `<= 0` disables.
    pub top_n_sigma: f32,
    /// Order of the configurable stages; `dist` always follows. JSON: an array of names
    /// or a string of one-letter codes.
    #[serde(deserialize_with = "de_samplers")]
    pub samplers: Vec<SamplerType>,
    /// `(token, bias)` pairs added to the logits before anything else.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            seed: DEFAULT_SEED,
            n_probs: 0,
            min_keep: 0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            xtc_probability: 0.0,
            xtc_threshold: 0.10,
            typ_p: 1.0,
            temp: 0.80,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
            penalty_last_n: 64,
            penalty_repeat: 1.0,
            penalty_freq: 0.0,
            penalty_present: 0.0,
            dry_multiplier: 0.0,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: -1,
            mirostat: 0,
            mirostat_tau: 5.0,
            mirostat_eta: 0.1,
            top_n_sigma: -1.0,
            samplers: SamplerType::DEFAULT_ORDER.to_vec(),
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding (llama.cpp's `--temp 0`), everything else default.
    pub fn greedy() -> Self {
        SamplingParams {
            temp: 0.0,
            ..Self::default()
        }
    }

    /// Resolves `-1 = context size` in the penalty windows, as llama.cpp does once the
    /// context is known.
    pub fn with_n_ctx(mut self, n_ctx: u32) -> Self {
        let n_ctx = i32::try_from(n_ctx).unwrap_or(i32::MAX);
        if self.penalty_last_n == -1 {
            self.penalty_last_n = n_ctx;
        }
        if self.dry_penalty_last_n == -1 {
            self.dry_penalty_last_n = n_ctx;
        }
        self
    }
}

fn de_seed<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let v = i64::deserialize(d)?;
    if v < 0 {
        return Ok(DEFAULT_SEED);
    }
    u32::try_from(v).map_err(|_| serde::de::Error::custom(format!("seed {v} exceeds u32")))
}

fn de_samplers<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<SamplerType>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Names(Vec<String>),
        Chars(String),
    }
    Ok(match Repr::deserialize(d)? {
        Repr::Names(names) => names
            .iter()
            .filter_map(|n| SamplerType::from_name(n, true))
            .collect(),
        Repr::Chars(chars) => SamplerType::from_chars(&chars),
    })
}
