//! The engine thread: owns the [`Engine`], the slots and the wait queue, and runs
//! continuous batching. Each step it drops requests whose client went away or whose
//! deadline passed, admits queued requests into free slots, builds one batch holding
//! every generating slot's next token plus chunks of prompts being processed (up to
//! `n_batch` tokens), decodes it, samples per slot and pushes text deltas to each
//! request's channel. HTTP handlers talk to it only through [`Command`]s.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use lamina_grammar::{Grammar, MatchError, Matcher, TokenIndex};
use lamina_sample::{
    ReasoningBudget, SampleError, SamplerChain, SamplingParams, token_prob, top_probs,
};
use tokio::sync::{mpsc, oneshot};

use crate::engine::{Batch, ChatMessage, Engine, EngineError, Pos, Token};
use crate::error::ApiError;
use crate::metrics::Metrics;

/// What to generate from.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Text tokenized with control tokens parsed; `add_special` adds BOS as the model says.
    Text { text: String, add_special: bool },
    /// Already tokenized; ids are checked against the vocabulary.
    Tokens(Vec<Token>),
    /// Token ids and texts in one sequence; the first text, if it comes first, gets
    /// BOS as the model says (llama-server's mixed prompts).
    Mixed(Vec<MixedPart>),
    /// A conversation rendered with the model's chat template.
    Chat(ChatPrompt),
    /// Fill-in-the-middle (`/infill`), framed with the vocabulary's FIM tokens.
    Infill(InfillPrompt),
}

/// llama-server's `/infill` request.
#[derive(Clone, Debug, Default)]
pub struct InfillPrompt {
    pub prefix: String,
    pub suffix: String,
    /// Other files: (filename, text).
    pub extra: Vec<(String, String)>,
    /// Text the answer starts with, after the middle token.
    pub prompt: String,
}

#[derive(Clone, Debug)]
pub enum MixedPart {
    Text(String),
    Token(Token),
}

/// A conversation to render with the chat template, as llama-server prepares it.
#[derive(Clone, Debug, Default)]
pub struct ChatPrompt {
    pub messages: Vec<ChatMessage>,
    /// The request's OpenAI `tools`, given to the template.
    pub tools: Option<serde_json::Value>,
    pub add_generation_prompt: bool,
    /// Template variables: `chat_template_kwargs`, `enable_thinking`, `reasoning_effort`.
    pub kwargs: serde_json::Map<String, serde_json::Value>,
    /// Thinking is off: a reasoning block the generation prompt opens is closed at once.
    pub close_thinking: bool,
    /// Continue this final assistant text (assistant prefill): the conversation before
    /// it is rendered with its generation prompt, then this is appended.
    pub continuation: Option<String>,
}

impl ChatPrompt {
    /// The prompt text, rendered by `engine`'s template.
    pub fn render(&self, engine: &dyn Engine) -> Result<String, crate::EngineError> {
        let add_generation_prompt = self.add_generation_prompt || self.continuation.is_some();
        let mut text = engine.apply_chat_template_with(
            &self.messages,
            self.tools.as_ref(),
            add_generation_prompt,
            &self.kwargs,
        )?;
        if self.close_thinking && add_generation_prompt {
            lamina_chat::close_thinking(&mut text, &engine.chat_template_source());
        }
        if let Some(c) = &self.continuation {
            text.push_str(c);
        }
        Ok(text)
    }

    /// What the generation prompt adds to the conversation (llama.cpp's
    /// `common_chat_template_generation_prompt`): the rendering with it, past where the
    /// rendering without it ends. Empty without a generation prompt.
    pub fn generation_prompt(&self, engine: &dyn Engine) -> Result<String, crate::EngineError> {
        if !self.add_generation_prompt && self.continuation.is_none() {
            return Ok(String::new());
        }
        let with = ChatPrompt {
            add_generation_prompt: true,
            continuation: None,
            ..self.clone()
        }
        .render(engine)?;
        let without = ChatPrompt {
            add_generation_prompt: false,
            continuation: None,
            ..self.clone()
        }
        .render(engine)?;
        let common = with
            .bytes()
            .zip(without.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        // At a character boundary, for slicing.
        let common = (0..=common)
            .rev()
            .find(|&i| with.is_char_boundary(i))
            .unwrap_or(0);
        Ok(with[common..].to_string())
    }
}

/// Everything about one generation besides its prompt.
#[derive(Clone, Debug)]
pub struct GenParams {
    pub sampling: SamplingParams,
    /// `logit_bias` entries keyed by text: the bias goes to each token of the text.
    pub text_bias: Vec<(String, f32)>,
    /// `None`: until end of generation or the context is full.
    pub max_tokens: Option<u32>,
    pub stop: Vec<String>,
    /// Top alternatives reported per token (0: none).
    pub n_probs: u32,
    /// Whether to report the chosen tokens' log-probabilities at all.
    pub want_probs: bool,
    pub ignore_eos: bool,
    /// Reuse the KV cells of a slot's previous prompt when it shares a prefix.
    pub cache_prompt: bool,
    pub deadline: Option<Instant>,
    /// A GBNF grammar the output must follow.
    pub grammar: Option<String>,
    /// With these, the grammar applies only from the first occurrence of one of them
    /// in the output (a lazy grammar: tool calls after free text).
    pub grammar_triggers: Vec<String>,
    /// Render control tokens' text in the output (`<|channel|>`, `[TOOL_CALLS]`): the
    /// answer is parsed by a format that looks for them.
    pub render_special: bool,
    /// Report prompt progress ([`Event::Progress`]).
    pub return_progress: bool,
    /// Report probabilities after the sampler chain (`post_sampling_probs`) rather than
    /// the softmax of the raw logits.
    pub post_sampling_probs: bool,
    /// Each delta carries the timings so far.
    pub timings_per_token: bool,
    /// Run in this slot (`id_slot`), waiting for it if busy.
    pub id_slot: Option<u32>,
    /// Prompt tokens a context shift keeps (`n_keep`; -1: the whole prompt).
    pub n_keep: i32,
    /// Tokens a context shift drops after the kept ones (`n_discard`; 0: half of them).
    pub n_discard: u32,
    /// Smallest chunk of the slot's cached prompt moved into place for a new prompt that has
    /// it further on (`n_cache_reuse`, llama-server's `--cache-reuse`; 0: none).
    pub n_cache_reuse: u32,
    /// Generated tokens allowed inside a reasoning block before its end tag is forced
    /// (`reasoning_budget_tokens`, `--reasoning-budget`; negative: no limit).
    pub reasoning_budget: i32,
    /// Text forced before the end tag when the budget runs out.
    pub reasoning_budget_message: String,
    /// The reasoning block's start tag and end tags when the request names them
    /// (`reasoning_budget_start_tag`, `reasoning_budget_end_tags`); a chat takes its
    /// template's.
    pub reasoning_tags: Option<(String, Vec<String>)>,
}

impl Default for GenParams {
    fn default() -> Self {
        GenParams {
            sampling: SamplingParams::default(),
            text_bias: Vec::new(),
            max_tokens: None,
            stop: Vec::new(),
            n_probs: 0,
            want_probs: false,
            ignore_eos: false,
            cache_prompt: true,
            deadline: None,
            grammar: None,
            grammar_triggers: Vec::new(),
            render_special: false,
            return_progress: false,
            post_sampling_probs: false,
            timings_per_token: false,
            id_slot: None,
            n_keep: 0,
            n_discard: 0,
            n_cache_reuse: 0,
            reasoning_budget: -1,
            reasoning_budget_message: String::new(),
            reasoning_tags: None,
        }
    }
}

/// One generation request.
pub struct Job {
    pub prompt: Prompt,
    pub params: GenParams,
    /// The first event is `Accepted` or `Error`; then `Delta`s and one `Done` (or `Error`).
    pub events: mpsc::UnboundedSender<Event>,
}

/// One alternative at a position: token, its bytes, natural-log probability.
#[derive(Clone, Debug, PartialEq)]
pub struct TopProb {
    pub token: Token,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    /// The probability itself (`logprob` is its log).
    pub prob: f32,
}

/// The chosen token at one position and the top alternatives (pre-sampling softmax, as
/// llama-server reports by default).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenProbs {
    pub chosen: TopProb,
    pub top: Vec<TopProb>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Delta {
    pub text: String,
    pub tokens: Vec<Token>,
    pub probs: Vec<TokenProbs>,
    /// The timings so far (`timings_per_token`).
    pub timings: Option<Done>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopType {
    /// End-of-generation token.
    Eos,
    /// A stop string matched.
    Word,
    /// max_tokens, the context or the deadline.
    Limit,
    /// The grammar allowed no token of the vocabulary.
    GrammarDeadEnd,
}

impl StopType {
    pub fn finish_reason(self) -> &'static str {
        match self {
            StopType::Eos | StopType::Word => "stop",
            StopType::Limit => "length",
            StopType::GrammarDeadEnd => "grammar_dead_end",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            StopType::Eos => "eos",
            StopType::Word => "word",
            StopType::Limit => "limit",
            StopType::GrammarDeadEnd => "grammar",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Done {
    pub stop_type: StopType,
    pub stopping_word: String,
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV cells were reused from the slot's previous request.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub prompt_ms: f64,
    pub predicted_ms: f64,
    pub slot: u32,
    /// The context filled up: generation stopped there, or went on after shifting it.
    pub truncated: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// `thinking_open`: the rendered chat prompt ends inside an opened `<think>` block
    /// (DeepSeek R1's template opens it), so the answer starts with reasoning; it holds
    /// what the prompt wrote after the tag (its line break).
    /// `prompt`: the prompt's tokens as text, control tokens rendered.
    Accepted {
        prompt_tokens: usize,
        thinking_open: Option<String>,
        prompt: String,
    },
    Delta(Delta),
    /// How far the prompt is (`return_progress`): once when it is admitted, then after
    /// each batch that evaluated part of it.
    Progress(Progress),
    Done(Done),
    Error(ApiError),
}

/// llama-server's `prompt_progress`.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    pub total: usize,
    pub cache: usize,
    pub processed: usize,
    pub time_ms: u64,
}

/// What `/slots` shows.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SlotInfo {
    pub id: u32,
    pub n_ctx: u32,
    pub is_processing: bool,
    pub n_past: usize,
    pub n_prompt_tokens: usize,
    pub n_decoded: usize,
}

/// Each input's embedding rows (one, or one per token without pooling; not normalized)
/// and its token count.
pub type Embeddings = Vec<(Vec<Vec<f32>>, usize)>;

/// An embedding input.
#[derive(Clone, Debug)]
pub enum EmbedInput {
    Text(String),
    Tokens(Vec<Token>),
    Mixed(Vec<MixedPart>),
    /// A query and a document, put together as llama-server formats rerank prompts.
    Rerank {
        query: String,
        document: String,
    },
}

// Commands are moved once through the channel; boxing the large variant buys nothing.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// The choices of one request (its prompts times `n`): queued together, so that they
    /// start in the same step and share every batch after it, as llama-server posts a
    /// request's tasks at once. (Queued one by one, the engine could start the first a step
    /// ahead, and identical prompts could then round differently.)
    Generate(Vec<Job>),
    Tokenize {
        text: String,
        add_special: bool,
        parse_special: bool,
        reply: oneshot::Sender<Vec<(Token, Vec<u8>)>>,
    },
    Detokenize {
        tokens: Vec<Token>,
        reply: oneshot::Sender<String>,
    },
    /// Returns each input's embedding and token count.
    Embed {
        inputs: Vec<EmbedInput>,
        pooling: crate::engine::Pooling,
        reply: oneshot::Sender<Result<Embeddings, ApiError>>,
    },
    Slots {
        reply: oneshot::Sender<Vec<SlotInfo>>,
    },
    /// Saves, restores or erases one slot's cache (`POST /slots/{id}?action=...`).
    Slot {
        id: u32,
        action: SlotAction,
        reply: oneshot::Sender<Result<serde_json::Value, ApiError>>,
    },
    /// Renders a conversation with the chat template (`/apply-template`).
    ApplyTemplate {
        chat: ChatPrompt,
        reply: oneshot::Sender<Result<String, ApiError>>,
    },
}

impl Command {
    /// Answers the command with `e` (or the closest thing its reply can carry).
    fn fail(self, e: ApiError) {
        match self {
            Command::Generate(jobs) => {
                for job in jobs {
                    let _ = job.events.send(Event::Error(e.clone()));
                }
            }
            Command::Embed { reply, .. } => {
                let _ = reply.send(Err(e));
            }
            Command::ApplyTemplate { reply, .. } => {
                let _ = reply.send(Err(e));
            }
            Command::Slot { reply, .. } => {
                let _ = reply.send(Err(e));
            }
            // Their replies carry no error: dropping the sender answers "the engine
            // stopped".
            Command::Tokenize { .. } | Command::Detokenize { .. } | Command::Slots { .. } => {}
        }
    }
}

/// What `POST /slots/{id}` does.
#[derive(Clone, Debug)]
pub enum SlotAction {
    /// Writes the slot's tokens and KV cells to this file.
    Save(std::path::PathBuf),
    /// Reads them back from this file.
    Restore(std::path::PathBuf),
    Erase,
}

/// The KV cache's settings (`--cache-ram`, `--cache-idle-slots`, `--context-shift`,
/// `--verbose`).
#[derive(Clone, Copy, Debug, Default)]
pub struct CacheSettings {
    /// 0: no prompt cache.
    pub ram_bytes: usize,
    pub idle_slots: bool,
    /// A generation that fills its slot's context goes on after dropping older tokens
    /// (llama-server's `--context-shift`), where the engine can move cached tokens.
    pub ctx_shift: bool,
    /// `--swa-full`: llama-server then makes no context checkpoints, so it splits no
    /// prompt for them (see [`Scheduler::prompt_breaks`]).
    pub swa_full: bool,
    /// `--spm-infill`: `/infill` prompts put the suffix first.
    pub spm_infill: bool,
    pub verbose: bool,
}

/// The first bytes of a saved slot.
const SLOT_MAGIC: &[u8; 8] = b"LAMSLOT1";

/// Facts about the model the HTTP side needs without asking the thread.
#[derive(Clone, Debug)]
pub struct EngineInfo {
    pub model_name: String,
    pub n_ctx: u32,
    pub n_ctx_seq: u32,
    pub n_ctx_train: u32,
    pub n_vocab: usize,
    pub n_slots: u32,
    pub n_embd: usize,
    /// The chat template's source (tool-call formats are recognised from it).
    pub chat_template_source: String,
    /// The end-of-generation tokens (`ignore_eos` bans them).
    pub eog_tokens: Vec<Token>,
    /// The engine is asleep (`--sleep-idle-seconds`).
    pub sleeping: Arc<std::sync::atomic::AtomicBool>,
}

/// Starts the engine thread. It ends when every `Sender` is dropped and its work is done.
pub fn spawn(
    engine: Box<dyn Engine>,
    n_batch: u32,
    metrics: Arc<Metrics>,
    sleep_after: Option<std::time::Duration>,
    cache: CacheSettings,
) -> std::io::Result<(Sender<Command>, EngineInfo)> {
    let info = EngineInfo {
        model_name: engine.model_name(),
        n_ctx: engine.n_ctx(),
        n_ctx_seq: engine.n_ctx_seq(),
        n_ctx_train: engine.n_ctx_train(),
        n_vocab: engine.n_vocab(),
        n_slots: engine.n_seq_max().max(1),
        n_embd: engine.n_embd(),
        chat_template_source: engine.chat_template_source(),
        eog_tokens: (0..engine.n_vocab() as u32)
            .filter(|&t| engine.is_eog(t))
            .collect(),
        sleeping: Arc::default(),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let mut sched = Scheduler::new(engine, n_batch, metrics);
    sched.sleep_after = sleep_after;
    sched.prompt_cache = (cache.ram_bytes > 0).then(|| PromptCache::new(cache.ram_bytes));
    sched.cache_idle_slots = cache.idle_slots;
    sched.ctx_shift = cache.ctx_shift && sched.engine.can_shift();
    if cache.ctx_shift && !sched.ctx_shift {
        tracing::warn!("context shift is not supported by this engine; it is disabled");
    }
    sched.verbose = cache.verbose;
    sched.spm_infill = cache.spm_infill;
    let n_swa = sched.engine.n_swa();
    sched.prompt_breaks = (n_swa > 0 && !cache.swa_full).then(|| sched.engine.n_ubatch() as usize);
    if sched.cache_idle_slots && sched.prompt_cache.is_some() {
        sched.trace("__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__");
    }
    sched.sleeping = info.sleeping.clone();
    std::thread::Builder::new()
        .name("lamina-engine".into())
        .spawn(move || sched.run(rx))?;
    Ok((tx, info))
}

/// A template that refuses the conversation is the client's mistake; anything else the
/// server's.
fn template_error(e: EngineError) -> ApiError {
    match e {
        EngineError::Template(m) => {
            ApiError::invalid_param("messages", format!("chat template: {m}"))
        }
        other => ApiError::internal(other.to_string()),
    }
}

/// A request in a slot.
struct Active {
    events: mpsc::UnboundedSender<Event>,
    params: GenParams,
    sampler: SamplerChain,
    prompt: Vec<Token>,
    cached_tokens: usize,
    budget: Option<ReasoningBudget>,
    /// Sampled but not yet decoded (fed in the next batch).
    next_token: Option<Token>,
    n_decoded: usize,
    stops: Vec<Vec<u8>>,
    /// Generated text so far (bytes; may end inside a character).
    bytes: Vec<u8>,
    /// Bytes of `bytes` already sent.
    n_sent: usize,
    pending_tokens: Vec<Token>,
    pending_probs: Vec<TokenProbs>,
    t_admit: Instant,
    t_prompt_done: Option<Instant>,
    /// The context filled up (and was shifted, or ended the generation).
    truncated: bool,
}

struct Slot {
    id: u32,
    /// Tokens whose KV cells this slot's sequence holds, in position order.
    cache: Vec<Token>,
    active: Option<Active>,
    /// When a request last started here (slots are reused least recently used first).
    last_used: Instant,
}

/// llama-server's host-memory prompt cache (`--cache-ram`): KV states of prompts that left
/// their slot, found again by a later prompt that starts the same way.
pub struct PromptCache {
    limit_bytes: usize,
    entries: Vec<CachedPrompt>,
}

struct CachedPrompt {
    tokens: Vec<Token>,
    state: Vec<u8>,
    last_used: Instant,
}

impl PromptCache {
    pub fn new(limit_bytes: usize) -> PromptCache {
        PromptCache {
            limit_bytes,
            entries: Vec::new(),
        }
    }

    fn bytes(&self) -> usize {
        self.entries
            .iter()
            .map(|e| e.state.len() + e.tokens.len() * 4)
            .sum()
    }

    /// Keeps `tokens`' state unless it is there already (or cannot fit at all); the least
    /// recently used go when over the limit. Whether it was added.
    fn insert(&mut self, tokens: &[Token], state: Vec<u8>) -> bool {
        if tokens.is_empty()
            || state.len() > self.limit_bytes
            || self.entries.iter().any(|e| e.tokens == tokens)
        {
            return false;
        }
        // A prompt that only extends an older one replaces it.
        self.entries
            .retain(|e| !(e.tokens.len() < tokens.len() && tokens.starts_with(&e.tokens)));
        self.entries.push(CachedPrompt {
            tokens: tokens.to_vec(),
            state,
            last_used: Instant::now(),
        });
        while self.bytes() > self.limit_bytes && self.entries.len() > 1 {
            let oldest = (0..self.entries.len())
                .min_by_key(|&i| self.entries[i].last_used)
                .unwrap_or(0);
            self.entries.remove(oldest);
        }
        true
    }

    /// The entry sharing the longest prefix with `tokens`, and that length.
    fn best(&mut self, tokens: &[Token]) -> Option<(usize, usize)> {
        let common = |a: &[Token]| a.iter().zip(tokens).take_while(|(x, y)| x == y).count();
        let (i, n) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common(&e.tokens)))
            .max_by_key(|&(_, n)| n)?;
        (n > 0).then(|| {
            self.entries[i].last_used = Instant::now();
            (i, n)
        })
    }
}

/// A validated job waiting for a slot.
struct Queued {
    job: Job,
    tokens: Vec<Token>,
    sampler: SamplerChain,
    budget: Option<ReasoningBudget>,
}

/// What [`Scheduler::prepare`] makes of a job: its prompt tokens, sampler, whether the prompt
/// opened a `<think>` block, and its reasoning budget.
type Prepared = (
    Vec<Token>,
    SamplerChain,
    Option<String>,
    Option<ReasoningBudget>,
);

pub struct Scheduler {
    engine: Box<dyn Engine>,
    slots: Vec<Slot>,
    queue: VecDeque<Queued>,
    n_batch: usize,
    n_ctx_seq: usize,
    n_vocab: usize,
    metrics: Arc<Metrics>,
    batch: Batch,
    /// Slot index of each output row of the current batch.
    rows: Vec<usize>,
    /// Every end-of-generation token, for `ignore_eos` (biased to -inf, as llama.cpp does).
    eog_tokens: Vec<Token>,
    /// The vocabulary as grammars see it, built on the first constrained request.
    grammar_vocab: OnceLock<Arc<TokenIndex>>,
    /// Idle this long, the engine sleeps (its memory freed) until the next request.
    sleep_after: Option<std::time::Duration>,
    /// `--cache-ram`: prompts that leave a slot are kept in host memory.
    pub prompt_cache: Option<PromptCache>,
    /// `--cache-idle-slots`: when a request starts, idle slots go to the prompt cache
    /// (and, with a unified KV cache, out of it, freeing room).
    pub cache_idle_slots: bool,
    /// `--verbose`: what the prompt cache does is printed.
    pub verbose: bool,
    /// `--context-shift`, granted by the engine.
    pub ctx_shift: bool,
    /// `--spm-infill`: `/infill` prompts put the suffix before the prefix.
    pub spm_infill: bool,
    /// For a model with sliding-window layers, llama-server evaluates the last `4 + n_ubatch`
    /// and the last 4 tokens of a prompt in batches of their own (to checkpoint the window
    /// before them). The batches decide how sums are grouped, so Lamina splits prompts there
    /// too to compute the same bits: `Some(n_ubatch)` where it does.
    pub prompt_breaks: Option<usize>,
    sleeping: Arc<std::sync::atomic::AtomicBool>,
}

impl Scheduler {
    pub fn new(engine: Box<dyn Engine>, n_batch: u32, metrics: Arc<Metrics>) -> Scheduler {
        let n_slots = engine.n_seq_max().max(1);
        let n_vocab = engine.n_vocab();
        let eog_tokens = (0..n_vocab as u32).filter(|&t| engine.is_eog(t)).collect();
        Scheduler {
            slots: (0..n_slots)
                .map(|id| Slot {
                    id,
                    cache: Vec::new(),
                    active: None,
                    last_used: Instant::now(),
                })
                .collect(),
            queue: VecDeque::new(),
            n_batch: n_batch.max(1) as usize,
            n_ctx_seq: engine.n_ctx_seq() as usize,
            n_vocab,
            metrics,
            batch: Batch::with_capacity(n_batch as usize),
            rows: Vec::new(),
            eog_tokens,
            grammar_vocab: OnceLock::new(),
            sleep_after: None,
            prompt_cache: None,
            cache_idle_slots: false,
            verbose: false,
            ctx_shift: false,
            spm_infill: false,
            prompt_breaks: None,
            sleeping: Arc::default(),
            engine,
        }
    }

    fn is_sleeping(&self) -> bool {
        self.sleeping.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Idle long enough: free the engine's memory. The slots' caches go with it.
    fn go_to_sleep(&mut self) {
        tracing::info!("idle: the engine goes to sleep");
        self.engine.sleep();
        for s in &mut self.slots {
            s.cache.clear();
        }
        self.sleeping
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// A command that needs the engine arrived while it sleeps.
    fn wake_up(&mut self) -> Result<(), ApiError> {
        if !self.is_sleeping() {
            return Ok(());
        }
        tracing::info!("the engine wakes up");
        self.engine
            .wake()
            .map_err(|e| ApiError::unavailable(format!("the model could not be reloaded: {e}")))?;
        self.sleeping
            .store(false, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn idle(&self) -> bool {
        self.queue.is_empty() && self.slots.iter().all(|s| s.active.is_none())
    }

    /// The thread's main loop: blocks for commands when idle, else drains them between steps.
    pub fn run(mut self, rx: Receiver<Command>) {
        let mut open = true;
        loop {
            if self.idle() {
                if !open {
                    return;
                }
                let next = match self.sleep_after.filter(|_| !self.is_sleeping()) {
                    Some(after) => match rx.recv_timeout(after) {
                        Ok(cmd) => Some(cmd),
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                            self.guarded(Scheduler::go_to_sleep);
                            continue;
                        }
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => None,
                    },
                    None => rx.recv().ok(),
                };
                match next {
                    Some(cmd) => self.guarded(|s| s.handle(cmd)),
                    None => return,
                }
            }
            while open {
                match rx.try_recv() {
                    Ok(cmd) => self.guarded(|s| s.handle(cmd)),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => open = false,
                }
            }
            self.guarded(Scheduler::step);
        }
    }

    /// Runs `f`; if the engine panics, every request in flight fails with a 500 and the
    /// KV cache is cleared, and the server goes on.
    fn guarded(&mut self, f: impl FnOnce(&mut Scheduler)) {
        if catch_unwind(AssertUnwindSafe(|| f(self))).is_err() {
            tracing::error!("the engine panicked; failing the requests in flight");
            let err = ApiError::internal("the engine failed while processing this request");
            for i in 0..self.slots.len() {
                self.fail_slot(i, err.clone());
            }
            for q in self.queue.drain(..) {
                let _ = q.job.events.send(Event::Error(err.clone()));
            }
            self.update_gauges();
        }
    }

    /// Prepares `job` and queues it, or answers it with the error.
    fn queue_job(&mut self, job: Job) {
        match self.prepare(&job) {
            Ok((tokens, sampler, thinking_open, budget)) => {
                if job
                    .events
                    .send(Event::Accepted {
                        prompt_tokens: tokens.len(),
                        thinking_open,
                        prompt: {
                            let mut bytes = Vec::new();
                            for &t in &tokens {
                                bytes.extend(self.engine.token_to_piece_special(t));
                            }
                            String::from_utf8_lossy(&bytes).into_owned()
                        },
                    })
                    .is_ok()
                {
                    Metrics::add(&self.metrics.requests_total, 1);
                    self.queue.push_back(Queued {
                        job,
                        tokens,
                        sampler,
                        budget,
                    });
                }
            }
            Err(e) => {
                let _ = job.events.send(Event::Error(e));
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        if !matches!(cmd, Command::Slots { .. })
            && let Err(e) = self.wake_up()
        {
            cmd.fail(e);
            return;
        }
        match cmd {
            Command::Generate(jobs) => {
                for job in jobs {
                    self.queue_job(job);
                }
            }
            Command::Slot { id, action, reply } => {
                let _ = reply.send(self.slot_action(id, action));
            }

            Command::ApplyTemplate { chat, reply } => {
                let out = chat.render(&self.engine).map_err(template_error);
                let _ = reply.send(out);
            }
            Command::Tokenize {
                text,
                add_special,
                parse_special,
                reply,
            } => {
                let tokens = self.engine.tokenize(&text, add_special, parse_special);
                let out = tokens
                    .into_iter()
                    .map(|t| (t, self.engine.token_to_piece(t)))
                    .collect();
                let _ = reply.send(out);
            }
            Command::Detokenize { tokens, reply } => {
                let _ = reply.send(self.engine.detokenize(&tokens));
            }
            Command::Embed {
                inputs,
                pooling,
                reply,
            } => {
                let _ = reply.send(self.embed(inputs, pooling));
            }
            Command::Slots { reply } => {
                let info = self
                    .slots
                    .iter()
                    .map(|s| SlotInfo {
                        id: s.id,
                        n_ctx: self.n_ctx_seq as u32,
                        is_processing: s.active.is_some(),
                        n_past: s.cache.len(),
                        n_prompt_tokens: s.active.as_ref().map_or(0, |a| a.prompt.len()),
                        n_decoded: s.active.as_ref().map_or(0, |a| a.n_decoded),
                    })
                    .collect();
                let _ = reply.send(info);
            }
        }
        self.update_gauges();
    }

    fn check_tokens(&self, tokens: &[Token], param: &str) -> Result<(), ApiError> {
        match tokens.iter().find(|&&t| t as usize >= self.n_vocab) {
            Some(t) => Err(ApiError::invalid_param(
                param,
                format!(
                    "token id {t} is outside the vocabulary (n_vocab = {})",
                    self.n_vocab
                ),
            )
            .with_code("invalid_token")),
            None => Ok(()),
        }
    }

    /// Tokenizes and validates a job and builds its sampler: every client mistake is
    /// found here, before the request is queued.
    fn prepare(&self, job: &Job) -> Result<Prepared, ApiError> {
        let mut thinking_open = None;
        // The reasoning block's tags, and the generation prompt the budget sees first.
        let mut reasoning = job
            .params
            .reasoning_tags
            .clone()
            .map(|t| (t, String::new()));
        let tokens = match &job.prompt {
            Prompt::Text { text, add_special } => self.engine.tokenize(text, *add_special, true),
            Prompt::Tokens(tokens) => {
                self.check_tokens(tokens, "prompt")?;
                tokens.clone()
            }
            Prompt::Mixed(parts) => {
                let mut tokens = Vec::new();
                for (i, p) in parts.iter().enumerate() {
                    match p {
                        MixedPart::Text(t) => tokens.extend(self.engine.tokenize(t, i == 0, true)),
                        MixedPart::Token(t) => tokens.push(*t),
                    }
                }
                self.check_tokens(&tokens, "prompt")?;
                tokens
            }
            Prompt::Infill(p) => self.infill_prompt(p, job.params.max_tokens)?,
            Prompt::Chat(chat) => {
                let text = chat.render(&self.engine).map_err(template_error)?;
                if text.trim_end().ends_with(lamina_chat::THINK_START)
                    && let Some(at) = text.rfind(lamina_chat::THINK_START)
                {
                    thinking_open = Some(text[at + lamina_chat::THINK_START.len()..].to_string());
                }
                if reasoning.is_none()
                    && job.params.reasoning_budget >= 0
                    && let Some((start, end)) =
                        lamina_chat::template_reasoning_markers(&self.engine.chat_template_source())
                {
                    let gen_prompt = chat
                        .generation_prompt(&self.engine)
                        .map_err(template_error)?;
                    reasoning = Some(((start.to_string(), vec![end.to_string()]), gen_prompt));
                }
                self.engine.tokenize(&text, true, true)
            }
        };
        if tokens.is_empty() {
            return Err(
                ApiError::invalid_param("prompt", "the prompt is empty").with_code("empty_prompt")
            );
        }
        if tokens.len() >= self.n_ctx_seq {
            return Err(ApiError::new(
                axum::http::StatusCode::BAD_REQUEST,
                "exceed_context_size_error",
                format!(
                    "the request exceeds the available context size: the prompt has {} tokens, \
                     the context of a slot holds {}; try increasing it",
                    tokens.len(),
                    self.n_ctx_seq
                ),
            )
            .with_code("context_length_exceeded")
            .with_detail("n_prompt_tokens", tokens.len() as u64)
            .with_detail("n_ctx", u64::from(self.n_ctx_seq as u32)));
        }
        let mut sampling = job
            .params
            .sampling
            .clone()
            .with_n_ctx(self.n_ctx_seq as u32);
        if let Some(bad) = sampling
            .logit_bias
            .iter()
            .find(|(t, _)| *t as usize >= self.n_vocab)
        {
            return Err(ApiError::invalid_param(
                "logit_bias",
                format!("token id {} is outside the vocabulary", bad.0),
            ));
        }
        for (text, bias) in &job.params.text_bias {
            let tokens = self.engine.tokenize(text, false, false);
            sampling
                .logit_bias
                .extend(tokens.into_iter().map(|t| (t, *bias)));
        }
        if job.params.ignore_eos {
            sampling
                .logit_bias
                .extend(self.eog_tokens.iter().map(|&t| (t, f32::NEG_INFINITY)));
        }
        let mut sampler = SamplerChain::new(&sampling, self.n_vocab)
            .map_err(|e| ApiError::bad_request(e.to_string()).with_code("unsupported_sampler"))?;
        if let Some(src) = &job.params.grammar {
            let engine = &self.engine;
            let resolve = |text: &str| {
                let t = engine.tokenize(text, false, true);
                (t.len() == 1).then(|| t[0])
            };
            let grammar = Grammar::parse(src, "root", Some(&resolve)).map_err(|e| {
                ApiError::invalid_param("grammar", e.to_string()).with_code("invalid_grammar")
            })?;
            let n_vocab = self.n_vocab;
            if let Some(bad) = grammar.rules.iter().flatten().find_map(|e| match *e {
                lamina_grammar::Element::Token(t) | lamina_grammar::Element::TokenNot(t)
                    if t as usize >= n_vocab =>
                {
                    Some(t)
                }
                _ => None,
            }) {
                return Err(ApiError::invalid_param(
                    "grammar",
                    format!("token <[{bad}]> is outside the vocabulary (n_vocab = {n_vocab})"),
                )
                .with_code("invalid_grammar"));
            }
            let vocab = self
                .grammar_vocab
                .get_or_init(|| {
                    let pieces = (0..self.n_vocab as Token)
                        .map(|t| engine.token_to_piece_special(t))
                        .collect();
                    Arc::new(TokenIndex::new(pieces, |t| engine.is_eog(t)))
                })
                .clone();
            let matcher = Matcher::try_new(&grammar, vocab).map_err(|e| {
                ApiError::invalid_param("grammar", e.to_string()).with_code("invalid_grammar")
            })?;
            sampler.set_lazy_grammar(Some(matcher), job.params.grammar_triggers.clone());
        }
        // As llama.cpp: a budget sampler only with a limit, for tags that tokenize.
        let budget = reasoning
            .filter(|_| job.params.reasoning_budget >= 0)
            .and_then(|((start, ends), gen_prompt)| {
                let tok = |t: &str| self.engine.tokenize(t, false, true);
                let start = tok(&start);
                let ends: Vec<Vec<Token>> = ends
                    .iter()
                    .filter(|e| !e.is_empty())
                    .map(|e| tok(e))
                    .collect();
                let first_end = ends.first()?.clone();
                if start.is_empty() {
                    return None;
                }
                let mut forced = if job.params.reasoning_budget_message.is_empty() {
                    Vec::new()
                } else {
                    tok(&job.params.reasoning_budget_message)
                };
                forced.extend(first_end);
                let mut b = ReasoningBudget::new(start, &ends, forced, job.params.reasoning_budget);
                // As llama.cpp's sampler init: the generation prompt's tokens, less a space
                // some tokenizers put before its first token.
                for (i, t) in tok(&gen_prompt).into_iter().enumerate() {
                    let piece = self.engine.token_to_piece_special(t);
                    let space = |c: Option<&u8>| c.is_some_and(u8::is_ascii_whitespace);
                    if i == 0 && space(piece.first()) && !space(gen_prompt.as_bytes().first()) {
                        continue;
                    }
                    b.accept(t, &self.engine.token_to_piece(t));
                }
                Some(b)
            });
        Ok((tokens, sampler, thinking_open, budget))
    }

    fn embed(
        &mut self,
        inputs: Vec<EmbedInput>,
        pooling: crate::engine::Pooling,
    ) -> Result<Embeddings, ApiError> {
        let mut out = Vec::with_capacity(inputs.len());
        for (i, input) in inputs.into_iter().enumerate() {
            let tokens = match input {
                EmbedInput::Text(text) => self.engine.tokenize(&text, true, true),
                EmbedInput::Tokens(tokens) => {
                    self.check_tokens(&tokens, &format!("input[{i}]"))?;
                    tokens
                }
                EmbedInput::Rerank { query, document } => self.rerank_prompt(&query, &document),
                EmbedInput::Mixed(parts) => {
                    let mut tokens = Vec::new();
                    for (j, p) in parts.iter().enumerate() {
                        match p {
                            MixedPart::Text(t) => {
                                tokens.extend(self.engine.tokenize(t, j == 0, true))
                            }
                            MixedPart::Token(t) => tokens.push(*t),
                        }
                    }
                    self.check_tokens(&tokens, &format!("input[{i}]"))?;
                    tokens
                }
            };
            if tokens.is_empty() {
                return Err(ApiError::invalid_param(
                    format!("input[{i}]"),
                    "input is empty",
                ));
            }
            if tokens.len() > self.n_ctx_seq {
                return Err(ApiError::invalid_param(
                    format!("input[{i}]"),
                    format!(
                        "input has {} tokens, the context holds {}",
                        tokens.len(),
                        self.n_ctx_seq
                    ),
                )
                .with_code("context_length_exceeded"));
            }
            Metrics::add(&self.metrics.prompt_tokens_total, tokens.len() as u64);
            Metrics::add(&self.metrics.n_decode_total, 1);
            let v = self
                .engine
                .embed_pooled(&tokens, pooling)
                .map_err(|e| match e {
                    EngineError::Unsupported(_) => ApiError::bad_request(e.to_string()),
                    e => ApiError::internal(e.to_string()),
                })?;
            out.push((v, tokens.len()));
        }
        Ok(out)
    }

    /// `POST /slots/{id}?action=save|restore|erase`, on an idle slot.
    fn slot_action(&mut self, id: u32, action: SlotAction) -> Result<serde_json::Value, ApiError> {
        use serde_json::json;
        let Some(i) = self.slots.iter().position(|s| s.id == id) else {
            return Err(ApiError::invalid_param("id_slot", format!("no slot {id}")));
        };
        if self.slots[i].active.is_some() {
            return Err(ApiError::bad_request(format!("slot {id} is busy")).with_code("slot_busy"));
        }
        let t0 = Instant::now();
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        let engine_err = |e: EngineError| match e {
            EngineError::Unsupported(m) => ApiError::new(
                axum::http::StatusCode::NOT_IMPLEMENTED,
                "not_supported_error",
                m,
            ),
            e => ApiError::internal(e.to_string()),
        };
        match action {
            SlotAction::Erase => {
                let n = self.slots[i].cache.len();
                self.engine.seq_rm(id, 0, None);
                self.slots[i].cache.clear();
                Ok(json!({"id_slot": id, "n_erased": n}))
            }
            SlotAction::Save(path) => {
                let state = self.engine.seq_state(id).map_err(engine_err)?;
                let tokens = &self.slots[i].cache;
                let mut out = Vec::with_capacity(16 + tokens.len() * 4 + state.len());
                out.extend_from_slice(SLOT_MAGIC);
                out.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
                for t in tokens {
                    out.extend_from_slice(&t.to_le_bytes());
                }
                out.extend_from_slice(&state);
                // A temporary name, then a rename: no half-written file is left behind.
                let tmp = path.with_extension("part");
                std::fs::write(&tmp, &out)
                    .and_then(|()| std::fs::rename(&tmp, &path))
                    .map_err(|e| {
                        let _ = std::fs::remove_file(&tmp);
                        ApiError::internal(format!("cannot write {}: {e}", path.display()))
                    })?;
                Ok(json!({
                    "id_slot": id,
                    "filename": path.file_name().map(|f| f.to_string_lossy().into_owned()),
                    "n_saved": tokens.len(),
                    "n_written": out.len(),
                    "timings": {"save_ms": ms(t0)},
                }))
            }
            SlotAction::Restore(path) => {
                let data = std::fs::read(&path).map_err(|e| {
                    ApiError::bad_request(format!("cannot read {}: {e}", path.display()))
                        .with_code("slot_file")
                })?;
                let bad = || ApiError::bad_request("the file is not a saved slot of this model");
                let rest = data.strip_prefix(SLOT_MAGIC.as_slice()).ok_or_else(bad)?;
                let n = rest
                    .get(..4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
                    .ok_or_else(bad)?;
                if n > self.n_ctx_seq {
                    return Err(bad());
                }
                let toks = rest.get(4..4 + n * 4).ok_or_else(bad)?;
                let tokens: Vec<Token> = toks
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                self.check_tokens(&tokens, "tokens").map_err(|_| bad())?;
                let n_restored =
                    self.engine
                        .set_seq_state(id, &rest[4 + n * 4..])
                        .map_err(|e| match e {
                            EngineError::InvalidBatch(m) => ApiError::bad_request(m),
                            e => engine_err(e),
                        })?;
                if n_restored != tokens.len() {
                    self.engine.seq_rm(id, 0, None);
                    self.slots[i].cache.clear();
                    return Err(bad());
                }
                self.slots[i].cache = tokens;
                Ok(json!({
                    "id_slot": id,
                    "filename": path.file_name().map(|f| f.to_string_lossy().into_owned()),
                    "n_restored": n_restored,
                    "n_read": data.len(),
                    "timings": {"restore_ms": ms(t0)},
                }))
            }
        }
    }

    /// llama-server's FIM prompt (the repo-level pattern): [FIM_REP]myproject, each extra
    /// file as [FIM_SEP]name + text (or a snippet marker without FIM_SEP), then
    /// [FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID], the prefix and suffix cut to fit a
    /// batch 3:1 and the extra files to the rest of the context.
    fn infill_prompt(
        &self,
        p: &InfillPrompt,
        n_predict: Option<u32>,
    ) -> Result<Vec<Token>, ApiError> {
        let st = self.engine.special_tokens();
        let (Some(pre), Some(suf), Some(mid)) = (st.fim_pre, st.fim_suf, st.fim_mid) else {
            let mut missing = String::new();
            for (t, what) in [
                (st.fim_pre, "prefix"),
                (st.fim_suf, "suffix"),
                (st.fim_mid, "middle"),
            ] {
                if t.is_none() {
                    missing.push_str(&format!("{what} token is missing. "));
                }
            }
            return Err(ApiError::new(
                axum::http::StatusCode::NOT_IMPLEMENTED,
                "not_supported_error",
                format!("Infill is not supported by this model: {missing}"),
            ));
        };
        let tok = |s: &str| self.engine.tokenize(s, false, false);
        let mut extra: Vec<Token> = Vec::new();
        if let Some(rep) = st.fim_rep {
            extra.push(rep);
            extra.extend(tok("myproject\n"));
        }
        for (name, text) in &p.extra {
            match st.fim_sep {
                Some(sep) => {
                    extra.push(sep);
                    extra.extend(tok(&format!("{name}\n")));
                }
                None => extra.extend(tok("\n\n--- snippet ---\n\n")),
            }
            extra.extend(tok(text));
        }
        if let Some(sep) = st.fim_sep {
            extra.push(sep);
            extra.extend(tok("filename\n"));
        }
        let mut prefix = tok(&p.prefix);
        let mut suffix = tok(&p.suffix);
        let prompt = self.engine.tokenize(&p.prompt, false, true);
        let n_batch = self.n_batch as i64;
        let n_prefix = (prefix.len() as i64).min(3 * (n_batch / 4)).max(0) as usize;
        let n_suffix = (suffix.len() as i64)
            .min((n_batch / 4 - (2 + prompt.len() as i64)).max(0))
            .max(0) as usize;
        let n_predict = n_predict.map_or(-1, i64::from);
        let n_extra =
            ((self.n_ctx_seq as i64 - n_batch - 2 * n_predict).max(0) as usize).min(extra.len());
        prefix.drain(..prefix.len() - n_prefix);
        suffix.truncate(n_suffix);
        let mut out = Vec::new();
        out.extend_from_slice(&extra[extra.len() - n_extra..]);
        if st.add_bos
            && let Some(b) = self.engine.bos()
        {
            out.push(b);
        }
        let prefix_part = std::iter::once(pre).chain(prefix).chain(prompt);
        let suffix_part = std::iter::once(suf).chain(suffix);
        // `--spm-infill`: suffix first (the order some models were trained with).
        if self.spm_infill {
            out.extend(suffix_part);
            out.extend(prefix_part);
        } else {
            out.extend(prefix_part);
            out.extend(suffix_part);
        }
        out.push(mid);
        Ok(out)
    }

    /// llama-server's rerank prompt: the model's rerank template with the query and the
    /// document put in (control tokens parsed); without one, [BOS] query [EOS] [SEP]
    /// document [EOS], each special token as the vocabulary asks for it.
    fn rerank_prompt(&self, query: &str, document: &str) -> Vec<Token> {
        if let Some(template) = self.engine.rerank_template() {
            let prompt = template
                .replace("{query}", query)
                .replace("{document}", document);
            return self.engine.tokenize(&prompt, false, true);
        }
        let info = self.engine.special_tokens();
        let mut out = Vec::new();
        if info.add_bos
            && let Some(b) = self.engine.bos()
        {
            out.push(b);
        }
        out.extend(self.engine.tokenize(query, false, false));
        let eos = info.eos.or(info.sep);
        if info.add_eos
            && let Some(e) = eos
        {
            out.push(e);
        }
        if info.add_sep
            && let Some(s) = info.sep
        {
            out.push(s);
        }
        out.extend(self.engine.tokenize(document, false, false));
        if info.add_eos
            && let Some(e) = eos
        {
            out.push(e);
        }
        out
    }

    fn update_gauges(&self) {
        let busy = self.slots.iter().filter(|s| s.active.is_some()).count();
        Metrics::set(&self.metrics.requests_processing, busy as u64);
        Metrics::set(&self.metrics.requests_deferred, self.queue.len() as u64);
    }

    /// One scheduling step: reap, admit, batch, decode, sample.
    fn step(&mut self) {
        self.reap();
        self.admit();
        self.shift_full_slots();
        self.update_gauges();

        self.batch.clear();
        self.rows.clear();
        // Generating slots first, one token each, so that generation never stalls behind
        // a long prompt; then prompt chunks in the remaining room.
        for (i, slot) in self.slots.iter().enumerate() {
            if let Some(tok) = slot.active.as_ref().and_then(|a| a.next_token) {
                self.batch.push(tok, slot.cache.len() as u32, slot.id, true);
                self.rows.push(i);
            }
        }
        for (i, slot) in self.slots.iter().enumerate() {
            let Some(a) = &slot.active else { continue };
            let room = self.n_batch.saturating_sub(self.batch.len());
            let done = slot.cache.len();
            if a.next_token.is_some() || done >= a.prompt.len() || room == 0 {
                continue;
            }
            let mut end = a.prompt.len().min(done + room);
            if let Some(n_ubatch) = self.prompt_breaks {
                let n = a.prompt.len();
                for n_last in [4 + n_ubatch, 4] {
                    let at = n.saturating_sub(n_last.min(self.n_batch));
                    if done < at && at < end {
                        end = at;
                    }
                }
            }
            for (k, &tok) in a.prompt[done..end].iter().enumerate() {
                let pos = done + k;
                let last = pos + 1 == a.prompt.len();
                self.batch.push(tok, pos as u32, slot.id, last);
                if last {
                    self.rows.push(i);
                }
            }
        }
        if self.batch.is_empty() {
            return;
        }

        if let Err(e) = self.engine.decode(&self.batch) {
            tracing::warn!("decode of {} tokens failed: {e}", self.batch.len());
            let unified = self.n_ctx_seq >= self.engine.n_ctx() as usize && self.slots.len() > 1;
            let err = match e {
                // Slots sharing one cache (`--kv-unified`) ran it out together: as
                // llama-server, every request in the batch fails, and says why.
                EngineError::ContextFull { .. } if unified => Some(
                    ApiError::internal("Context size has been exceeded.")
                        .with_code("context_size_exceeded"),
                ),
                EngineError::ContextFull { .. } => None,
                e => Some(ApiError::internal(e.to_string())),
            };
            let in_batch: Vec<usize> = {
                let mut v: Vec<usize> = self
                    .batch
                    .entries()
                    .iter()
                    .filter_map(|e| self.slots.iter().position(|s| s.id == e.seq_id))
                    .collect();
                v.dedup();
                v
            };
            for i in in_batch {
                match &err {
                    Some(err) => self.fail_slot(i, err.clone()),
                    // The cache ran out of room: end as llama-server does, with "length".
                    None => self.finish(i, StopType::Limit, None),
                }
            }
            self.update_gauges();
            return;
        }

        let mut busy = 0u64;
        for e in self.batch.entries() {
            let slot = &mut self.slots[e.seq_id as usize];
            if slot.cache.len() == e.pos as usize {
                slot.cache.push(e.token);
            }
        }
        for slot in &mut self.slots {
            if let Some(a) = &mut slot.active {
                busy += 1;
                a.next_token = None;
            }
        }
        let n_prompt: usize = self
            .batch
            .entries()
            .iter()
            .filter(|e| {
                let s = &self.slots[e.seq_id as usize];
                s.active
                    .as_ref()
                    .is_some_and(|a| (e.pos as usize) < a.prompt.len())
            })
            .count();
        Metrics::add(&self.metrics.n_decode_total, 1);
        Metrics::add(&self.metrics.n_busy_slots_total, busy);
        Metrics::add(&self.metrics.prompt_tokens_total, n_prompt as u64);
        self.metrics.n_tokens_max.fetch_max(
            self.batch.len() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );

        for e in self.batch.entries() {
            let slot = &self.slots[e.seq_id as usize];
            if let Some(a) = &slot.active
                && a.params.return_progress
                && e.pos as usize + 1 == slot.cache.len()
                && (e.pos as usize) < a.prompt.len()
                && slot.cache.len() > a.cached_tokens
            {
                let _ = a.events.send(Event::Progress(Progress {
                    total: a.prompt.len(),
                    cache: a.cached_tokens,
                    processed: slot.cache.len().min(a.prompt.len()),
                    time_ms: a.t_admit.elapsed().as_millis() as u64,
                }));
            }
        }
        let rows = std::mem::take(&mut self.rows);
        for (row, &i) in rows.iter().enumerate() {
            self.sample_slot(i, row);
        }
        self.rows = rows;
        self.update_gauges();
    }

    /// Drops requests whose client is gone and ends those past their deadline.
    fn reap(&mut self) {
        let now = Instant::now();
        let metrics = &self.metrics;
        self.queue.retain(|q| {
            if q.job.events.is_closed() {
                Metrics::add(&metrics.requests_cancelled_total, 1);
                return false;
            }
            if q.job.params.deadline.is_some_and(|d| d <= now) {
                let _ = q.job.events.send(Event::Error(
                    ApiError::unavailable("timed out waiting for a free slot").with_code("timeout"),
                ));
                return false;
            }
            true
        });
        for i in 0..self.slots.len() {
            let Some(a) = &self.slots[i].active else {
                continue;
            };
            if a.events.is_closed() {
                self.cancel_slot(i);
            } else if a.params.deadline.is_some_and(|d| d <= now) {
                self.finish(i, StopType::Limit, None);
            }
        }
    }

    fn admit(&mut self) {
        while !self.queue.is_empty() {
            let free: Vec<usize> = (0..self.slots.len())
                .filter(|&i| self.slots[i].active.is_none())
                .collect();
            if free.is_empty() {
                return;
            }
            let Some(q) = self.queue.pop_front() else {
                return;
            };
            // Prefer the free slot whose cached tokens share the longest prefix with the prompt.
            let common = |cache: &[Token]| {
                cache
                    .iter()
                    .zip(&q.tokens)
                    .take_while(|(a, b)| a == b)
                    .count()
            };
            if let Some(want) = q.job.params.id_slot {
                match self.slots.iter().position(|s| s.id == want) {
                    Some(i) if self.slots[i].active.is_some() => {
                        // The asked-for slot is busy: wait for it, first in line.
                        self.queue.push_front(q);
                        return;
                    }
                    _ => {}
                }
            }
            let chosen = q
                .job
                .params
                .id_slot
                .and_then(|want| self.slots.iter().position(|s| s.id == want));
            let (i, n_common) = if let Some(i) = chosen {
                let n = if q.job.params.cache_prompt {
                    common(&self.slots[i].cache)
                } else {
                    0
                };
                (i, n)
            } else if q.job.params.cache_prompt {
                let best = free
                    .iter()
                    .map(|&i| (i, common(&self.slots[i].cache)))
                    .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)))
                    .unwrap_or((free[0], 0));
                if best.1 > 0 || self.prompt_cache.is_none() {
                    best
                } else {
                    // Nothing to reuse in a slot: the least recently used one, its prompt
                    // kept in the prompt cache, and the best cached prompt brought in.
                    let i = free
                        .iter()
                        .copied()
                        .min_by_key(|&i| self.slots[i].last_used)
                        .unwrap_or(free[0]);
                    self.trace("updating prompt cache");
                    self.save_to_prompt_cache(i);
                    let n = self.load_from_prompt_cache(i, &q.tokens);
                    (i, n)
                }
            } else {
                (free[0], 0)
            };
            let n_reuse = q.job.params.n_cache_reuse as usize;
            let n_common = if n_reuse > 0 && q.job.params.cache_prompt && self.engine.can_shift() {
                self.reuse_cache_chunks(i, &q.tokens, n_reuse)
            } else {
                n_common
            };
            // At least the last prompt token is evaluated again, for its logits.
            let keep = n_common.min(q.tokens.len() - 1);
            let slot = &mut self.slots[i];
            self.engine.seq_rm(slot.id, keep as u32, None);
            slot.cache.truncate(keep);
            let mut sampler = q.sampler;
            // As llama-server does, the penalties see the prompt.
            for &t in &q.tokens {
                sampler.accept_prompt(t);
            }
            let stops = q
                .job
                .params
                .stop
                .iter()
                .filter(|s| !s.is_empty())
                .map(|s| s.as_bytes().to_vec())
                .collect();
            Metrics::add(&self.metrics.prompt_tokens_cached_total, keep as u64);
            if q.job.params.return_progress {
                let _ = q.job.events.send(Event::Progress(Progress {
                    total: q.tokens.len(),
                    cache: keep,
                    processed: keep,
                    time_ms: 0,
                }));
            }
            slot.last_used = Instant::now();
            slot.active = Some(Active {
                events: q.job.events,
                params: q.job.params,
                sampler,
                prompt: q.tokens,
                cached_tokens: keep,
                budget: q.budget,
                next_token: None,
                n_decoded: 0,
                stops,
                bytes: Vec::new(),
                n_sent: 0,
                pending_tokens: Vec::new(),
                pending_probs: Vec::new(),
                t_admit: Instant::now(),
                t_prompt_done: None,
                truncated: false,
            });
            if self.cache_idle_slots && self.prompt_cache.is_some() {
                let unified =
                    self.n_ctx_seq >= self.engine.n_ctx() as usize && self.slots.len() > 1;
                for j in 0..self.slots.len() {
                    if self.slots[j].active.is_some() || self.slots[j].cache.is_empty() {
                        continue;
                    }
                    if self.save_to_prompt_cache(j) {
                        self.trace("__TEST_TAG_CACHE_IDLE_SLOT__");
                    }
                    if unified {
                        // Its cells are worth more free when the slots share them.
                        let id = self.slots[j].id;
                        self.engine.seq_rm(id, 0, None);
                        self.slots[j].cache.clear();
                    }
                }
            }
        }
    }

    /// llama-server's context shift: a generating slot whose next token would fill its
    /// context keeps its first `n_keep` tokens, drops `n_discard` after them (half of the
    /// rest by default) and moves what follows down, then goes on.
    fn shift_full_slots(&mut self) {
        if !self.ctx_shift {
            return;
        }
        let add_bos = self.engine.special_tokens().add_bos;
        for i in 0..self.slots.len() {
            let slot = &self.slots[i];
            let Some(a) = &slot.active else { continue };
            let n_cached = slot.cache.len();
            if a.next_token.is_none() || n_cached + 1 < self.n_ctx_seq {
                continue;
            }
            let mut n_keep = if a.params.n_keep < 0 {
                a.prompt.len()
            } else {
                a.params.n_keep as usize
            };
            if add_bos {
                n_keep += 1;
            }
            let n_keep = n_keep.min(self.n_ctx_seq.saturating_sub(4));
            let n_left = n_cached.saturating_sub(n_keep);
            let n_discard = match a.params.n_discard {
                0 => n_left / 2,
                n => n as usize,
            }
            .min(n_left.saturating_sub(1));
            let id = slot.id;
            self.trace(&format!(
                "slot {id} context shift, n_keep = {n_keep}, n_left = {n_left}, n_discard = {n_discard}"
            ));
            let (keep, end) = (n_keep as Pos, (n_keep + n_discard) as Pos);
            self.engine.seq_rm(id, keep, Some(end));
            if let Err(e) = self
                .engine
                .seq_add(id, end, Some(n_cached as Pos), -(n_discard as i32))
            {
                self.fail_slot(i, ApiError::internal(e.to_string()));
                continue;
            }
            let slot = &mut self.slots[i];
            slot.cache.drain(n_keep..n_keep + n_discard);
            if let Some(a) = &mut slot.active {
                a.truncated = true;
            }
        }
    }

    /// llama-server's `--cache-reuse`: after the common prefix `n_past` of slot `i`'s cache
    /// and `tokens`, chunks of at least `n_reuse` cached tokens that `tokens` has further on
    /// are moved to where it has them; returns the tokens now in place.
    fn reuse_cache_chunks(&mut self, i: usize, tokens: &[Token], n_reuse: usize) -> usize {
        let id = self.slots[i].id;
        let cache = &mut self.slots[i].cache;
        let mut n_past = cache.iter().zip(tokens).take_while(|(a, b)| a == b).count();
        let (mut head_c, mut head_p) = (n_past, n_past);
        while head_c < cache.len() && head_p < tokens.len() {
            let n_match = cache[head_c..]
                .iter()
                .zip(&tokens[head_p..])
                .take_while(|(a, b)| a == b)
                .count();
            if n_match >= n_reuse {
                let shift = head_p as i64 - head_c as i64;
                self.engine.seq_rm(id, head_p as Pos, Some(head_c as Pos));
                if self
                    .engine
                    .seq_add(
                        id,
                        head_c as Pos,
                        Some((head_c + n_match) as Pos),
                        shift as i32,
                    )
                    .is_err()
                {
                    break;
                }
                cache.copy_within(head_c..head_c + n_match, head_p);
                n_past += n_match;
                head_c += n_match;
                head_p += n_match;
            } else {
                head_c += 1;
            }
        }
        // What is past the reused tokens is stale.
        cache.truncate(n_past);
        self.engine.seq_rm(id, n_past as Pos, None);
        n_past
    }

    fn trace(&self, what: &str) {
        if self.verbose {
            eprintln!("lamina serve: {what}");
        }
    }

    /// Puts slot `i`'s prompt into the prompt cache; whether it was added.
    fn save_to_prompt_cache(&mut self, i: usize) -> bool {
        let Some(cache) = &self.prompt_cache else {
            return false;
        };
        let tokens = &self.slots[i].cache;
        if tokens.is_empty() || cache.entries.iter().any(|e| e.tokens == *tokens) {
            return false;
        }
        let state = match self.engine.seq_state(self.slots[i].id) {
            Ok(s) => s,
            Err(_) => return false,
        };
        let tokens = self.slots[i].cache.clone();
        self.prompt_cache
            .as_mut()
            .is_some_and(|c| c.insert(&tokens, state))
    }

    /// Brings the cached prompt that best matches `tokens` into slot `i`; the tokens it
    /// shares with them.
    fn load_from_prompt_cache(&mut self, i: usize, tokens: &[Token]) -> usize {
        let Some((e, n)) = self.prompt_cache.as_mut().and_then(|c| c.best(tokens)) else {
            return 0;
        };
        let id = self.slots[i].id;
        let Some(entry) = self.prompt_cache.as_ref().map(|c| &c.entries[e]) else {
            return 0;
        };
        let (state, cached) = (entry.state.clone(), entry.tokens.clone());
        match self.engine.set_seq_state(id, &state) {
            Ok(k) if k == cached.len() => {
                self.slots[i].cache = cached;
                n
            }
            _ => {
                self.engine.seq_rm(id, 0, None);
                self.slots[i].cache.clear();
                0
            }
        }
    }

    fn sample_slot(&mut self, i: usize, row: usize) {
        match self.sample_into(i, row) {
            After::Continue => {}
            After::Fail(e) => self.fail_slot(i, e),
            After::Finish(stop_type, word) => self.finish(i, stop_type, word),
            After::Cancel => self.cancel_slot(i),
        }
    }

    /// Samples slot `i` from output row `row`, records the token and sends what text can
    /// be sent; says what should happen to the slot next.
    fn sample_into(&mut self, i: usize, row: usize) -> After {
        let Scheduler {
            engine,
            slots,
            metrics,
            n_vocab,
            n_ctx_seq,
            ctx_shift,
            ..
        } = self;
        let n_cached = slots[i].cache.len();
        let Some(a) = slots[i].active.as_mut() else {
            return After::Continue;
        };
        if a.params.max_tokens == Some(0) {
            // n_predict 0: the prompt is evaluated (and cached), nothing is generated.
            a.t_prompt_done = Some(Instant::now());
            return After::Finish(StopType::Limit, None);
        }
        let logits = engine.logits(row);
        if logits.len() != *n_vocab {
            let msg = format!(
                "engine returned {} logits, expected {n_vocab}",
                logits.len()
            );
            return After::Fail(ApiError::internal(msg));
        }
        // A spent reasoning budget forces its end tag: every other token is -inf.
        let forced;
        let logits = match &a.budget {
            Some(b) if b.forced_token().is_some() => {
                let mut l = logits.to_vec();
                b.apply(&mut l);
                forced = l;
                &forced[..]
            }
            _ => logits,
        };
        let tok = match a.sampler.sample(logits) {
            Ok(t) => t,
            Err(SampleError::GrammarDeadEnd) => {
                return After::Finish(StopType::GrammarDeadEnd, None);
            }
            Err(e) => return After::Fail(sample_error(e)),
        };
        if let Err(e) = a.sampler.accept(tok) {
            return After::Fail(sample_error(e));
        }
        if let Some(b) = &mut a.budget {
            b.accept(tok, &engine.token_to_piece(tok));
        }
        if a.t_prompt_done.is_none() {
            a.t_prompt_done = Some(Instant::now());
        }
        if a.params.want_probs {
            let prob = |t: Token, p: f32| TopProb {
                token: t,
                bytes: engine.token_to_piece(t),
                logprob: p.ln(),
                prob: p,
            };
            let n = a.params.n_probs as usize;
            let (p, top) = if a.params.post_sampling_probs {
                // What the sampler chain left, with the probabilities it drew from,
                // best first; a token the chain cut has probability 0.
                let cur = a.sampler.candidates();
                let p = cur.data.iter().find(|d| d.id == tok).map_or(0.0, |d| d.p);
                let mut kept: Vec<_> = cur.data.iter().filter(|d| d.p > 0.0).collect();
                kept.sort_by(|x, y| y.p.total_cmp(&x.p).then(x.id.cmp(&y.id)));
                (p, kept.iter().take(n).map(|d| prob(d.id, d.p)).collect())
            } else {
                let p = token_prob(logits, tok).unwrap_or(0.0);
                let top = if n > 0 {
                    top_probs(logits, n)
                        .into_iter()
                        .map(|d| prob(d.id, d.p))
                        .collect()
                } else {
                    Vec::new()
                };
                (p, top)
            };
            a.pending_probs.push(TokenProbs {
                chosen: prob(tok, p),
                top,
            });
        }
        a.n_decoded += 1;
        Metrics::add(&metrics.tokens_predicted_total, 1);

        if engine.is_eog(tok) {
            return After::Finish(StopType::Eos, None);
        }
        // Tool-call formats need their control tokens' text to be parsed (llama-server
        // renders a format's "preserved" tokens likewise).
        if a.params.render_special {
            a.bytes
                .extend_from_slice(&engine.token_to_piece_special(tok));
        } else {
            a.bytes.extend_from_slice(&engine.token_to_piece(tok));
        }
        a.pending_tokens.push(tok);
        if let Some((at, word)) = find_stop(&a.bytes, a.n_sent, &a.stops) {
            a.bytes.truncate(at);
            return After::Finish(
                StopType::Word,
                Some(String::from_utf8_lossy(&word).into_owned()),
            );
        }
        let limit = a
            .params
            .max_tokens
            .is_some_and(|m| a.n_decoded >= m as usize);
        if limit {
            return After::Finish(StopType::Limit, None);
        }
        // As llama-server: without context shift, a generation ends when the cache would be
        // full with the sampled token (which is returned, not evaluated).
        if !*ctx_shift && n_cached + 1 >= *n_ctx_seq {
            a.truncated = true;
            return After::Finish(StopType::Limit, None);
        }
        a.next_token = Some(tok);
        let end = sendable_end(&a.bytes, a.n_sent, &a.stops);
        if end > a.n_sent {
            let timings = a.params.timings_per_token.then(|| {
                let now = Instant::now();
                let t_prompt = a.t_prompt_done.unwrap_or(now);
                Done {
                    stop_type: StopType::Limit,
                    stopping_word: String::new(),
                    prompt_tokens: a.prompt.len(),
                    cached_tokens: a.cached_tokens,
                    completion_tokens: a.n_decoded,
                    prompt_ms: t_prompt.duration_since(a.t_admit).as_secs_f64() * 1e3,
                    predicted_ms: now.duration_since(t_prompt).as_secs_f64() * 1e3,
                    slot: 0,
                    truncated: a.truncated,
                }
            });
            let delta = Delta {
                text: String::from_utf8_lossy(&a.bytes[a.n_sent..end]).into_owned(),
                tokens: std::mem::take(&mut a.pending_tokens),
                probs: std::mem::take(&mut a.pending_probs),
                timings,
            };
            a.n_sent = end;
            if a.events.send(Event::Delta(delta)).is_err() {
                return After::Cancel;
            }
        }
        After::Continue
    }

    /// Ends a slot's request: flushes the text not yet sent, then `Done`.
    fn finish(&mut self, i: usize, stop_type: StopType, word: Option<String>) {
        let Some(a) = self.slots[i].active.take() else {
            return;
        };
        // Before the client hears it is done, so that /metrics right after agrees.
        self.update_gauges();
        let slot = &self.slots[i];
        let now = Instant::now();
        let t_prompt = a.t_prompt_done.unwrap_or(now);
        let prompt_ms = t_prompt.duration_since(a.t_admit).as_secs_f64() * 1e3;
        let predicted_ms = now.duration_since(t_prompt).as_secs_f64() * 1e3;
        Metrics::add(&self.metrics.prompt_us_total, (prompt_ms * 1e3) as u64);
        Metrics::add(
            &self.metrics.predicted_us_total,
            (predicted_ms * 1e3) as u64,
        );
        let rest = &a.bytes[a.n_sent.min(a.bytes.len())..];
        if !rest.is_empty() || !a.pending_probs.is_empty() || !a.pending_tokens.is_empty() {
            let _ = a.events.send(Event::Delta(Delta {
                text: String::from_utf8_lossy(rest).into_owned(),
                tokens: a.pending_tokens,
                probs: a.pending_probs,
                timings: None,
            }));
        }
        let _ = a.events.send(Event::Done(Done {
            stop_type,
            stopping_word: word.unwrap_or_default(),
            prompt_tokens: a.prompt.len(),
            cached_tokens: a.cached_tokens,
            completion_tokens: a.n_decoded,
            prompt_ms,
            predicted_ms,
            slot: slot.id,
            truncated: a.truncated,
        }));
    }

    /// Frees a slot whose client went away.
    fn cancel_slot(&mut self, i: usize) {
        if self.slots[i].active.take().is_some() {
            Metrics::add(&self.metrics.requests_cancelled_total, 1);
        }
    }

    /// Fails a slot's request and forgets its KV cells (their state is unknown).
    fn fail_slot(&mut self, i: usize, err: ApiError) {
        let slot = &mut self.slots[i];
        if let Some(a) = slot.active.take() {
            let _ = a.events.send(Event::Error(err));
        }
        slot.cache.clear();
        let id = slot.id;
        // The engine itself may be what failed; a panic here must not escape.
        let engine = &mut self.engine;
        let _ = catch_unwind(AssertUnwindSafe(|| engine.seq_rm(id, 0, None)));
    }
}

/// A sampling error as the client sees it: a grammar too ambiguous to follow is the
/// request's fault (400, on `grammar`), anything else the server's.
fn sample_error(e: SampleError) -> ApiError {
    match e {
        SampleError::Grammar(e @ (MatchError::TooManyStacks(_) | MatchError::TooMuchWork(_))) => {
            ApiError::invalid_param("grammar", e.to_string()).with_code("grammar_too_ambiguous")
        }
        e => ApiError::internal(e.to_string()),
    }
}

enum After {
    Continue,
    Fail(ApiError),
    Finish(StopType, Option<String>),
    Cancel,
}

/// The earliest stop string fully present in `bytes` at or after `from`.
fn find_stop(bytes: &[u8], from: usize, stops: &[Vec<u8>]) -> Option<(usize, Vec<u8>)> {
    let mut best: Option<(usize, &Vec<u8>)> = None;
    for stop in stops {
        let start = from.min(bytes.len());
        if let Some(p) = bytes[start..]
            .windows(stop.len())
            .position(|w| w == stop.as_slice())
        {
            let at = start + p;
            if best.is_none_or(|(b, _)| at < b) {
                best = Some((at, stop));
            }
        }
    }
    best.map(|(at, s)| (at, s.clone()))
}

/// How far `bytes` may be sent: not into an unfinished UTF-8 character, and not into a
/// tail that could still become a stop string (llama-server's partial-stop holdback).
fn sendable_end(bytes: &[u8], n_sent: usize, stops: &[Vec<u8>]) -> usize {
    let end = complete_utf8_len(bytes).max(n_sent);
    let unsent = &bytes[n_sent..end];
    let hold = stops
        .iter()
        .map(|s| partial_suffix_len(unsent, s))
        .max()
        .unwrap_or(0);
    end - hold
}

/// Length of the longest proper prefix of `stop` that `text` ends with.
fn partial_suffix_len(text: &[u8], stop: &[u8]) -> usize {
    let max = stop.len().saturating_sub(1).min(text.len());
    (1..=max)
        .rev()
        .find(|&k| text.ends_with(&stop[..k]))
        .unwrap_or(0)
}

/// `bytes.len()` minus a trailing incomplete UTF-8 sequence.
fn complete_utf8_len(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=n.min(4) {
        let b = bytes[n - back];
        if b & 0xC0 == 0x80 {
            continue;
        }
        let need = match b {
            0xF0..=0xFF => 4,
            0xE0..=0xEF => 3,
            0xC0..=0xDF => 2,
            _ => 1,
        };
        return if need > back { n - back } else { n };
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rerank_prompts_follow_the_models_template() {
        let metrics = Arc::new(Metrics::default());
        let plain = Scheduler::new(
            Box::new(crate::fake::FakeEngine::new(64, 1)),
            8,
            metrics.clone(),
        );
        // The fake adds no BOS/EOS/SEP to rerank prompts: the two texts, as bytes.
        assert_eq!(
            plain.rerank_prompt("q", "d"),
            vec![u32::from(b'q'), u32::from(b'd')]
        );
        let engine =
            crate::fake::FakeEngine::new(64, 1).with_rerank_template("<s>Q{query}D{document}");
        let templated = Scheduler::new(Box::new(engine), 8, metrics);
        let want: Vec<u32> = std::iter::once(crate::fake::BOS)
            .chain(b"QxyDz".iter().map(|&b| u32::from(b)))
            .collect();
        assert_eq!(templated.rerank_prompt("xy", "z"), want);
    }

    #[test]
    fn utf8_holdback() {
        assert_eq!(complete_utf8_len(b"abc"), 3);
        assert_eq!(complete_utf8_len(b"ab\xC3"), 2);
        assert_eq!(complete_utf8_len(b"ab\xC3\xA9"), 4);
        assert_eq!(complete_utf8_len(b"\xE2\x82"), 0);
        assert_eq!(complete_utf8_len(b"\xE2\x82\xAC"), 3);
        assert_eq!(complete_utf8_len(b"\xF0\x9F\x98"), 0);
        assert_eq!(complete_utf8_len(b""), 0);
    }

    #[test]
    fn stop_holdback_and_match() {
        let stops = vec![b"END".to_vec(), b"xyz".to_vec()];
        assert_eq!(sendable_end(b"hello E", 0, &stops), 6);
        assert_eq!(sendable_end(b"hello EN", 0, &stops), 6);
        assert_eq!(sendable_end(b"hello ENx", 0, &stops), 8);
        assert_eq!(sendable_end(b"hello x", 3, &stops), 6);
        assert_eq!(
            find_stop(b"hello END more", 0, &stops),
            Some((6, b"END".to_vec()))
        );
        assert_eq!(find_stop(b"axyzEND", 0, &stops), Some((1, b"xyz".to_vec())));
        assert_eq!(find_stop(b"hello", 0, &stops), None);
    }
}
