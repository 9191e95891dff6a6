//! The server's [`Engine`] over a real model: a [`Context`] with one KV sequence per slot, the
//! model's tokenizer and its chat template.

use anyhow::Context as _;
use lamina_model::{Batch, Context, ModelError};
use lamina_server::engine::{self as api, ChatMessage, Engine, EngineError, SeqId, Token};
use lamina_tokenizer::chat_legacy::LegacyTemplate;
use lamina_tokenizer::{CHATML_TEMPLATE, ChatTemplate, Tokenizer};

/// How chat conversations become prompts.
enum Template {
    Jinja(Box<ChatTemplate>),
    /// llama.cpp's built-in formats (`--no-jinja`), with the source they were read from.
    Legacy(LegacyTemplate, String),
}

#[derive(Clone, Copy)]
struct Dims {
    n_ctx: u32,
    kv_unified: bool,
    n_ctx_train: u32,
    n_vocab: usize,
    n_seq_max: u32,
    n_embd: usize,
    /// Sliding window of the model's SWA layers (0: none).
    n_swa: u32,
    n_ubatch: u32,
}

/// Which chat template to use: llama-server's `--jinja` / `--no-jinja` and
/// `--chat-template(-file)`.
#[derive(Clone, Debug, Default)]
pub struct TemplateChoice {
    pub legacy: bool,
    /// Replaces the model's template: Jinja source, or a built-in name.
    pub source: Option<String>,
}

impl TemplateChoice {
    /// From `lamina serve`'s flags: `--chat-template-file` (read here) or
    /// `--chat-template`, and `--no-jinja`.
    pub fn from_flags(args: &super::serve::ServeArgs) -> anyhow::Result<TemplateChoice> {
        let source = match (&args.chat_template_file, &args.chat_template) {
            (Some(f), _) => Some(
                std::fs::read_to_string(f)
                    .with_context(|| format!("cannot read --chat-template-file {}", f.display()))?,
            ),
            (None, t) => t.clone(),
        };
        Ok(TemplateChoice {
            legacy: args.no_jinja,
            source,
        })
    }
}

/// Loads the model's context again after the server slept.
pub type Reload = Box<dyn FnMut() -> anyhow::Result<Context> + Send>;

pub struct ModelEngine {
    /// `None` while asleep.
    ctx: Option<Context>,
    /// The context's sizes, kept while asleep.
    dims: Dims,
    reload: Option<Reload>,
    tokenizer: Tokenizer,
    template: Template,
    name: String,
}

impl ModelEngine {
    /// As llama-server resolves templates: with Jinja, the given source (empty or
    /// `chatml`: ChatML) is the template; without, the source must be a built-in name or
    /// a template llama.cpp recognises, else it is refused (a supplied one at start-up).
    pub fn with_template(
        ctx: Context,
        tokenizer: Tokenizer,
        choice: &TemplateChoice,
    ) -> anyhow::Result<ModelEngine> {
        let template = if choice.legacy {
            let source = choice
                .source
                .clone()
                .or_else(|| tokenizer.chat_template().map(str::to_string))
                .or_else(|| tokenizer.chat_template_tool_use().map(str::to_string))
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "chatml".to_string());
            let source = if source == "chatml" {
                CHATML_TEMPLATE.to_string()
            } else {
                source
            };
            let kind = LegacyTemplate::resolve(&source).with_context(|| {
                format!(
                    "the chat template is not supported without --jinja: {}",
                    source.chars().take(200).collect::<String>()
                )
            })?;
            Template::Legacy(kind, source)
        } else {
            Template::Jinja(Box::new(
                ChatTemplate::from_tokenizer_with(&tokenizer, choice.source.as_deref())
                    .context("the chat template is not supported")?,
            ))
        };
        let name = ctx.model().name();
        let hp = &ctx.model().hparams;
        let dims = Dims {
            n_ctx: ctx.n_ctx() as u32,
            kv_unified: ctx.params().kv_unified,
            n_ctx_train: hp.n_ctx_train,
            n_vocab: hp.n_vocab as usize,
            n_seq_max: ctx.params().n_seq_max as u32,
            n_embd: hp.n_embd as usize,
            n_swa: if hp.swa_layers.iter().any(|&s| s) {
                hp.n_swa
            } else {
                0
            },
            n_ubatch: ctx.params().n_ubatch as u32,
        };
        Ok(ModelEngine {
            ctx: Some(ctx),
            dims,
            reload: None,
            tokenizer,
            template,
            name,
        })
    }

    /// How to load the context again after sleeping (without it, the engine never sleeps).
    pub fn with_reload(mut self, reload: Reload) -> ModelEngine {
        self.reload = Some(reload);
        self
    }

    /// The context, unless the server sleeps.
    fn ctx_mut(&mut self) -> Result<&mut Context, EngineError> {
        self.ctx.as_mut().ok_or_else(|| {
            EngineError::Backend("the model is not loaded (the server sleeps)".into())
        })
    }
}

fn engine_error(e: ModelError) -> EngineError {
    match e {
        ModelError::ContextFull { .. } => EngineError::ContextFull { seq_id: 0, pos: 0 },
        ModelError::BadBatch(m) => EngineError::InvalidBatch(m),
        other => EngineError::Backend(other.to_string()),
    }
}

impl Engine for ModelEngine {
    fn model_name(&self) -> String {
        self.name.clone()
    }
    fn n_ctx(&self) -> u32 {
        self.dims.n_ctx
    }
    fn n_ctx_seq(&self) -> u32 {
        // `--kv-unified`: every sequence may use the whole cache; else each has a stream of
        // `n_ctx / n_seq` cells.
        if self.dims.kv_unified {
            self.n_ctx()
        } else {
            self.n_ctx() / self.n_seq_max().max(1)
        }
    }
    fn n_ctx_train(&self) -> u32 {
        self.dims.n_ctx_train
    }
    fn n_vocab(&self) -> usize {
        self.dims.n_vocab
    }
    fn n_seq_max(&self) -> u32 {
        self.dims.n_seq_max
    }
    fn n_embd(&self) -> usize {
        self.dims.n_embd
    }
    fn bos(&self) -> Option<Token> {
        self.tokenizer.bos()
    }
    fn special_tokens(&self) -> api::SpecialTokens {
        let ids = self.tokenizer.special_ids();
        api::SpecialTokens {
            eos: ids.eos,
            sep: ids.sep,
            fim_pre: ids.fim_pre,
            fim_suf: ids.fim_suf,
            fim_mid: ids.fim_mid,
            fim_rep: ids.fim_rep,
            fim_sep: ids.fim_sep,
            add_bos: self.tokenizer.add_bos(),
            add_eos: self.tokenizer.add_eos(),
            add_sep: self.tokenizer.add_sep(),
        }
    }
    fn is_eog(&self, token: Token) -> bool {
        self.tokenizer.is_eog(token)
    }
    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<Token> {
        self.tokenizer.tokenize(text, add_special, parse_special)
    }
    fn token_to_piece(&self, token: Token) -> Vec<u8> {
        self.tokenizer.token_to_piece(token, false)
    }
    fn token_to_piece_special(&self, token: Token) -> Vec<u8> {
        self.tokenizer.token_to_piece(token, true)
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
        self.apply_chat_template_with(
            messages,
            tools,
            add_generation_prompt,
            &serde_json::Map::new(),
        )
    }
    fn apply_chat_template_with(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, EngineError> {
        match &self.template {
            Template::Jinja(t) => t
                .render_with(messages, tools, add_generation_prompt, kwargs)
                .map_err(|e| EngineError::Template(e.to_string())),
            Template::Legacy(kind, _) => {
                let chat: Vec<(&str, &str)> = messages
                    .iter()
                    .map(|m| (m.role.as_str(), m.content.as_str()))
                    .collect();
                kind.apply(&chat, add_generation_prompt)
                    .map_err(|e| EngineError::Template(e.to_string()))
            }
        }
    }
    fn chat_template_source(&self) -> String {
        match &self.template {
            Template::Jinja(t) => t.source().to_string(),
            Template::Legacy(_, source) => source.clone(),
        }
    }
    fn decode(&mut self, batch: &api::Batch) -> Result<(), EngineError> {
        let mut b = Batch::default();
        for e in batch.entries() {
            let pos = i32::try_from(e.pos)
                .map_err(|_| EngineError::InvalidBatch(format!("position {}", e.pos)))?;
            b.push(e.token, pos, e.seq_id as usize, e.want_logits);
        }
        self.ctx_mut()?.decode(&b).map_err(engine_error)
    }
    fn logits(&self, i: usize) -> &[f32] {
        self.ctx
            .as_ref()
            .and_then(|c| c.output_logits(i))
            .unwrap_or(&[])
    }
    fn seq_rm(&mut self, seq_id: SeqId, p0: u32, p1: Option<u32>) {
        let p0 = i32::try_from(p0).unwrap_or(i32::MAX);
        let p1 = p1.map(|p| i32::try_from(p).unwrap_or(i32::MAX));
        if let Some(c) = &mut self.ctx {
            c.seq_rm(Some(seq_id as usize), Some(p0), p1);
        }
    }
    fn can_shift(&self) -> bool {
        true
    }
    fn rerank_template(&self) -> Option<String> {
        self.tokenizer.chat_template_rerank().map(str::to_string)
    }
    fn n_swa(&self) -> u32 {
        self.dims.n_swa
    }
    fn n_ubatch(&self) -> u32 {
        self.dims.n_ubatch
    }
    fn seq_add(
        &mut self,
        seq_id: SeqId,
        p0: u32,
        p1: Option<u32>,
        delta: i32,
    ) -> Result<(), EngineError> {
        let p0 = i32::try_from(p0).unwrap_or(i32::MAX);
        let p1 = p1.map(|p| i32::try_from(p).unwrap_or(i32::MAX));
        self.ctx_mut()?
            .seq_add(seq_id as usize, Some(p0), p1, delta)
            .map_err(engine_error)
    }
    fn seq_state(&mut self, seq: SeqId) -> Result<Vec<u8>, EngineError> {
        self.ctx_mut()?
            .seq_state(seq as usize)
            .map_err(engine_error)
    }
    fn set_seq_state(&mut self, seq: SeqId, data: &[u8]) -> Result<usize, EngineError> {
        self.ctx_mut()?
            .set_seq_state(seq as usize, data)
            .map_err(engine_error)
    }
    fn sleep(&mut self) {
        if self.reload.is_some() {
            // Dropping the context unmaps the weights and frees the KV cache.
            self.ctx = None;
        }
    }
    fn wake(&mut self) -> Result<(), EngineError> {
        if self.ctx.is_none()
            && let Some(reload) = &mut self.reload
        {
            self.ctx = Some(reload().map_err(|e| EngineError::Backend(format!("{e:#}")))?);
        }
        Ok(())
    }
    fn embed_pooled(
        &mut self,
        tokens: &[Token],
        pooling: api::Pooling,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        use api::Pooling;
        if pooling == Pooling::Mean {
            return Ok(vec![self.embed(tokens)?]);
        }
        let mut rows = self.ctx_mut()?.embed_rows(tokens).map_err(engine_error)?;
        Ok(match pooling {
            Pooling::None => rows,
            Pooling::Cls => rows.drain(..1).collect(),
            // A causal model's rank pooling is its last token (llama.cpp's build_inp_cls
            // picks the last position when attention is causal).
            Pooling::Last | Pooling::Rank | Pooling::Mean => rows.split_off(rows.len() - 1),
        })
    }
    fn embed(&mut self, tokens: &[Token]) -> Result<Vec<f32>, EngineError> {
        self.ctx_mut()?.embed(tokens).map_err(engine_error)
    }
}
