//! The contract between the server and a model: llama.cpp's `llama_context` /
//! `llama_batch` API reduced to what a serving loop needs. The server drives one
//! engine from one dedicated thread, so implementations need no internal locking.

pub use lamina_tokenizer::ChatMessage;

/// A vocabulary id.
pub type Token = u32;
/// A position within one sequence (KV cell index of that sequence).
pub type Pos = u32;
/// A sequence id; the server uses one per slot, `0..n_seq_max()`.
pub type SeqId = u32;

/// One token of a [`Batch`] (one row of llama.cpp's `llama_batch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchEntry {
    pub token: Token,
    pub pos: Pos,
    pub seq_id: SeqId,
    /// Whether [`Engine::logits`] must hold a row for this entry after `decode`.
    pub want_logits: bool,
}

/// Tokens from any number of sequences evaluated in one forward pass. Entries of one
/// sequence appear in increasing position order.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    entries: Vec<BatchEntry>,
}

impl Batch {
    pub fn with_capacity(n: usize) -> Batch {
        Batch {
            entries: Vec::with_capacity(n),
        }
    }

    pub fn push(&mut self, token: Token, pos: Pos, seq_id: SeqId, want_logits: bool) {
        self.entries.push(BatchEntry {
            token,
            pos,
            seq_id,
            want_logits,
        });
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> &[BatchEntry] {
        &self.entries
    }

    /// How many rows [`Engine::logits`] will have after decoding this batch.
    pub fn n_outputs(&self) -> usize {
        self.entries.iter().filter(|e| e.want_logits).count()
    }
}

/// How an embedding is taken from the hidden states of a text (llama.cpp's `--pooling`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over the tokens.
    #[default]
    Mean,
    /// The first token's state.
    Cls,
    /// The last token's state.
    Last,
    /// Every token's state (no pooling).
    None,
    /// A relevance score (`--reranking`): for a model without a classification head,
    /// as llama.cpp computes it for a causal model, the last token's state, of which the
    /// score is the first value.
    Rank,
}

impl Pooling {
    pub fn parse(s: &str) -> Option<Pooling> {
        match s {
            "mean" => Some(Pooling::Mean),
            "cls" => Some(Pooling::Cls),
            "last" => Some(Pooling::Last),
            "none" => Some(Pooling::None),
            "rank" => Some(Pooling::Rank),
            _ => None,
        }
    }
}

/// The special tokens a prompt is framed with, and which of them the vocabulary adds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub eos: Option<Token>,
    pub sep: Option<Token>,
    /// Fill-in-the-middle tokens (`/infill`).
    pub fim_pre: Option<Token>,
    pub fim_suf: Option<Token>,
    pub fim_mid: Option<Token>,
    pub fim_rep: Option<Token>,
    pub fim_sep: Option<Token>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_sep: bool,
}

/// Why the engine could not do what was asked.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// A sequence has no room left (llama_decode returning 1).
    #[error("no KV cache room for sequence {seq_id} at position {pos}")]
    ContextFull { seq_id: SeqId, pos: Pos },
    /// The batch is malformed (token outside the vocabulary, position gap, bad seq id).
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// The chat template rejected the conversation (raise_exception, bad roles, ...).
    #[error("chat template: {0}")]
    Template(String),
    #[error("{0} is not supported by this model")]
    Unsupported(&'static str),
    /// Anything else: a backend or device failure.
    #[error("engine failure: {0}")]
    Backend(String),
}

/// A loaded model with its context: tokenizer, chat template, KV cache for
/// `n_seq_max()` sequences and a forward pass. Modelled on llama.cpp so that a
/// `llama_context`-like type implements it directly.
///
/// Per step the server builds one [`Batch`] holding every active slot's next token (and
/// chunks of newly admitted prompts), calls [`Engine::decode`], then reads
/// [`Engine::logits`] for each entry that asked for them, in batch order.
pub trait Engine: Send + 'static {
    /// Name reported by `/v1/models` and in responses.
    fn model_name(&self) -> String;
    /// Total KV cells of the context (`-c`).
    fn n_ctx(&self) -> u32;
    /// KV cells one sequence may use; llama.cpp's non-unified cache splits `n_ctx` evenly.
    fn n_ctx_seq(&self) -> u32 {
        self.n_ctx() / self.n_seq_max().max(1)
    }
    /// Context length the model was trained with (reported by `/v1/models`).
    fn n_ctx_train(&self) -> u32 {
        self.n_ctx()
    }
    fn n_vocab(&self) -> usize;
    /// The sliding window of the model's sliding-window layers (0: it has none).
    fn n_swa(&self) -> u32 {
        0
    }
    /// Most tokens of one forward pass (`-ub`).
    fn n_ubatch(&self) -> u32 {
        512
    }
    /// Parallel sequences the KV cache holds: the number of server slots (`-np`).
    fn n_seq_max(&self) -> u32;
    /// Width of embedding vectors returned by [`Engine::embed`].
    fn n_embd(&self) -> usize;
    fn bos(&self) -> Option<Token>;
    /// EOS/SEP and the vocabulary's add flags (rerank prompts are framed with them).
    fn special_tokens(&self) -> SpecialTokens {
        SpecialTokens {
            add_bos: self.bos().is_some(),
            ..SpecialTokens::default()
        }
    }
    /// End-of-generation tokens (EOS, EOT, `<|im_end|>`, ...).
    fn is_eog(&self, token: Token) -> bool;
    /// `add_special` adds BOS/EOS as the model's metadata says; `parse_special` lets
    /// control-token text (`<|im_start|>`) in `text` become those tokens.
    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<Token>;
    /// The raw bytes of one token's text: possibly part of a UTF-8 character. Ids outside
    /// the vocabulary give an empty piece.
    fn token_to_piece(&self, token: Token) -> Vec<u8>;
    /// A token's text with control tokens rendered (`<|im_end|>`), as grammars match
    /// it (llama.cpp's `token_to_piece(.., special = true)`).
    fn token_to_piece_special(&self, token: Token) -> Vec<u8> {
        self.token_to_piece(token)
    }
    /// Text of a token sequence (byte pieces joined, then decoded with replacement).
    fn detokenize(&self, tokens: &[Token]) -> String {
        let mut bytes = Vec::new();
        for &t in tokens {
            bytes.extend_from_slice(&self.token_to_piece(t));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
    /// The model's chat template applied to `messages`.
    fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, EngineError>;
    /// The chat template with OpenAI `tools` (an array) given to it as `tools`.
    /// Engines whose template cannot take tools render without them.
    fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        let _ = tools;
        self.apply_chat_template(messages, add_generation_prompt)
    }
    /// [`Engine::apply_chat_template_with_tools`] with extra template variables
    /// (`enable_thinking`, a request's `chat_template_kwargs`); engines whose templates
    /// take no variables ignore them.
    fn apply_chat_template_with(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, EngineError> {
        let _ = kwargs;
        self.apply_chat_template_with_tools(messages, tools, add_generation_prompt)
    }
    /// The chat template's source (empty if unknown): tool-call formats are recognised
    /// from it.
    fn chat_template_source(&self) -> String {
        String::new()
    }
    /// A reranker's prompt template (`tokenizer.chat_template.rerank`), with `{query}` and
    /// `{document}` in it, if the model has one.
    fn rerank_template(&self) -> Option<String> {
        None
    }
    /// Evaluates `batch`, appending its tokens to their sequences' KV cells.
    fn decode(&mut self, batch: &Batch) -> Result<(), EngineError>;
    /// Logits of the `i`-th entry of the last decoded batch that wanted them
    /// (`n_vocab()` values). Only valid until the next `decode`.
    fn logits(&self, i: usize) -> &[f32];
    /// Removes positions `p0..p1` (`p1 = None`: to the end) of `seq_id` from the KV cache.
    fn seq_rm(&mut self, seq_id: SeqId, p0: Pos, p1: Option<Pos>);
    /// Whether cached tokens can be moved to other positions ([`Engine::seq_add`]), which
    /// context shift and cache reuse are made of (llama.cpp's `llama_memory_can_shift`).
    fn can_shift(&self) -> bool {
        false
    }
    /// Moves `seq_id`'s cached tokens at positions `p0..p1` (`None`: to the end) by `delta`
    /// positions, as if they had been evaluated there (llama.cpp's `llama_memory_seq_add`);
    /// tokens moved below 0 are dropped.
    fn seq_add(
        &mut self,
        seq_id: SeqId,
        p0: Pos,
        p1: Option<Pos>,
        delta: i32,
    ) -> Result<(), EngineError> {
        let _ = (seq_id, p0, p1, delta);
        Err(EngineError::Unsupported("moving cached tokens"))
    }
    /// Mean-pooled last hidden state of `tokens`, evaluated on its own, without touching
    /// any sequence's KV cells (the server calls it between decode steps).
    fn embed(&mut self, tokens: &[Token]) -> Result<Vec<f32>, EngineError>;
    /// Sequence `seq`'s KV cells as bytes (slot save).
    fn seq_state(&mut self, seq: SeqId) -> Result<Vec<u8>, EngineError> {
        let _ = seq;
        Err(EngineError::Unsupported(
            "this engine cannot save its KV cache",
        ))
    }
    /// Puts a [`Engine::seq_state`] back as `seq`; returns how many tokens it holds.
    fn set_seq_state(&mut self, seq: SeqId, data: &[u8]) -> Result<usize, EngineError> {
        let _ = (seq, data);
        Err(EngineError::Unsupported(
            "this engine cannot restore a KV cache",
        ))
    }
    /// Frees what the engine can (weights, KV cache) while the server sleeps
    /// (`--sleep-idle-seconds`); every sequence's cache is gone afterwards.
    fn sleep(&mut self) {}
    /// Makes the engine ready again after [`Engine::sleep`].
    fn wake(&mut self) -> Result<(), EngineError> {
        Ok(())
    }
    /// `tokens`' embedding rows under `pooling`: one row, or one per token for
    /// [`Pooling::None`]. Engines that can only mean-pool refuse the others.
    fn embed_pooled(
        &mut self,
        tokens: &[Token],
        pooling: Pooling,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        match pooling {
            Pooling::Mean => Ok(vec![self.embed(tokens)?]),
            _ => Err(EngineError::Unsupported(
                "this engine can only mean-pool embeddings",
            )),
        }
    }
}

impl Engine for Box<dyn Engine> {
    fn model_name(&self) -> String {
        (**self).model_name()
    }
    fn n_ctx(&self) -> u32 {
        (**self).n_ctx()
    }
    fn n_ctx_seq(&self) -> u32 {
        (**self).n_ctx_seq()
    }
    fn n_ctx_train(&self) -> u32 {
        (**self).n_ctx_train()
    }
    fn n_vocab(&self) -> usize {
        (**self).n_vocab()
    }
    fn n_swa(&self) -> u32 {
        (**self).n_swa()
    }
    fn n_ubatch(&self) -> u32 {
        (**self).n_ubatch()
    }
    fn n_seq_max(&self) -> u32 {
        (**self).n_seq_max()
    }
    fn n_embd(&self) -> usize {
        (**self).n_embd()
    }
    fn bos(&self) -> Option<Token> {
        (**self).bos()
    }
    fn is_eog(&self, token: Token) -> bool {
        (**self).is_eog(token)
    }
    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<Token> {
        (**self).tokenize(text, add_special, parse_special)
    }
    fn token_to_piece(&self, token: Token) -> Vec<u8> {
        (**self).token_to_piece(token)
    }
    fn token_to_piece_special(&self, token: Token) -> Vec<u8> {
        (**self).token_to_piece_special(token)
    }
    fn detokenize(&self, tokens: &[Token]) -> String {
        (**self).detokenize(tokens)
    }
    fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        (**self).apply_chat_template(messages, add_generation_prompt)
    }
    fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        (**self).apply_chat_template_with_tools(messages, tools, add_generation_prompt)
    }
    fn apply_chat_template_with(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, EngineError> {
        (**self).apply_chat_template_with(messages, tools, add_generation_prompt, kwargs)
    }
    fn chat_template_source(&self) -> String {
        (**self).chat_template_source()
    }
    fn rerank_template(&self) -> Option<String> {
        (**self).rerank_template()
    }
    fn decode(&mut self, batch: &Batch) -> Result<(), EngineError> {
        (**self).decode(batch)
    }
    fn logits(&self, i: usize) -> &[f32] {
        (**self).logits(i)
    }
    fn seq_rm(&mut self, seq_id: SeqId, p0: Pos, p1: Option<Pos>) {
        (**self).seq_rm(seq_id, p0, p1)
    }
    fn can_shift(&self) -> bool {
        (**self).can_shift()
    }
    fn seq_add(
        &mut self,
        seq_id: SeqId,
        p0: Pos,
        p1: Option<Pos>,
        delta: i32,
    ) -> Result<(), EngineError> {
        (**self).seq_add(seq_id, p0, p1, delta)
    }
    fn embed(&mut self, tokens: &[Token]) -> Result<Vec<f32>, EngineError> {
        (**self).embed(tokens)
    }
    fn embed_pooled(
        &mut self,
        tokens: &[Token],
        pooling: Pooling,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        (**self).embed_pooled(tokens, pooling)
    }
    fn special_tokens(&self) -> SpecialTokens {
        (**self).special_tokens()
    }
    fn sleep(&mut self) {
        (**self).sleep()
    }
    fn seq_state(&mut self, seq: SeqId) -> Result<Vec<u8>, EngineError> {
        (**self).seq_state(seq)
    }
    fn set_seq_state(&mut self, seq: SeqId, data: &[u8]) -> Result<usize, EngineError> {
        (**self).set_seq_state(seq, data)
    }
    fn wake(&mut self) -> Result<(), EngineError> {
        (**self).wake()
    }
}
