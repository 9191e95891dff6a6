//! Token sampling: turns a position's logits into the next token the way llama.cpp
//! does. It owns the candidate array ([`Candidates`]), each sampler ported from
//! llama.cpp's `src/llama-sampler.cpp` (greedy, dist, temperature and dynamic
//! temperature, top-k, top-p, min-p, typical, top-n-sigma, XTC, repeat/frequency/presence
//! penalties, logit bias), a bit-exact `std::mt19937` with the libstdc++/libc++ uniform
//! draw ([`rng`]), llama.cpp's default parameters and chain order ([`SamplingParams`],
//! [`SamplerChain`]), and the probability helpers the server's `n_probs`/`logprobs` need
//! ([`top_probs`], [`token_prob`], [`SamplerChain::last_candidates`]). Given the same
//! logits and seed it picks the same token as llama.cpp, up to the order of exactly tied
//! logits. A grammar ([`lamina_grammar::Matcher`]) constrains the chain as
//! llama.cpp's `common_sampler` does: the chain samples, and only if the grammar rejects
//! that token are the logits masked and the chain run again. DRY, mirostat and infill
//! are not implemented.

mod candidates;
mod chain;
mod params;
mod reasoning_budget;
pub mod rng;
mod samplers;

pub use candidates::{Candidates, TokenData};
pub use chain::SamplerChain;
pub use params::{SamplerType, SamplingParams};
pub use reasoning_budget::{BudgetState, ReasoningBudget};
pub use samplers::{
    Dist, LogitBias, Penalties, Sampler, Xtc, greedy, min_p, temp_ext, temp_impl, token_prob,
    top_k, top_n_sigma, top_p, top_probs, typical,
};

/// Why a chain could not be built or could not sample.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SampleError {
    #[error("the vocabulary is empty")]
    EmptyVocab,
    #[error("got {got} logits for a vocabulary of {expected}")]
    LogitsLen { got: usize, expected: usize },
    #[error("sampler `{0}` is not implemented in Lamina")]
    Unsupported(&'static str),
    #[error("the sampler chain selected no token (it must end in dist or greedy)")]
    NoSelection,
    /// No token of the vocabulary can continue the grammar here.
    #[error("the grammar allows no token here (dead end)")]
    GrammarDeadEnd,
    #[error(transparent)]
    Grammar(#[from] lamina_grammar::MatchError),
}
