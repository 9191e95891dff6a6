//! The server's [`Engine`] over a real model: a [`Context`] with one KV sequence per slot, the
//! model's tokenizer and its chat template.

use lamina_model::{Batch, Context, ModelError};
use lamina_server::engine::{self as api, ChatMessage, Engine, EngineError, SeqId, Token};
use lamina_tokenizer::{ChatTemplate, Tokenizer};

pub struct ModelEngine {
    ctx: Context,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    name: String,
}

impl ModelEngine {
    pub fn new(ctx: Context, tokenizer: Tokenizer) -> anyhow::Result<ModelEngine> {
        let template = ChatTemplate::from_tokenizer(&tokenizer)?;
        let name = ctx.model().name();
        Ok(ModelEngine {
            ctx,
            tokenizer,
            template,
            name,
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
        self.ctx.n_ctx() as u32
    }
    fn n_ctx_train(&self) -> u32 {
        self.ctx.model().hparams.n_ctx_train
    }
    fn n_vocab(&self) -> usize {
        self.ctx.model().hparams.n_vocab as usize
    }
    fn n_seq_max(&self) -> u32 {
        self.ctx.params().n_seq_max as u32
    }
    fn n_embd(&self) -> usize {
        self.ctx.model().hparams.n_embd as usize
    }
    fn bos(&self) -> Option<Token> {
        self.tokenizer.bos()
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
        self.template
            .render(messages, tools, add_generation_prompt)
            .map_err(|e| EngineError::Template(e.to_string()))
    }
    fn chat_template_source(&self) -> String {
        self.template.source().to_string()
    }
    fn decode(&mut self, batch: &api::Batch) -> Result<(), EngineError> {
        let mut b = Batch::default();
        for e in batch.entries() {
            let pos = i32::try_from(e.pos)
                .map_err(|_| EngineError::InvalidBatch(format!("position {}", e.pos)))?;
            b.push(e.token, pos, e.seq_id as usize, e.want_logits);
        }
        self.ctx.decode(&b).map_err(engine_error)
    }
    fn logits(&self, i: usize) -> &[f32] {
        self.ctx.output_logits(i).unwrap_or(&[])
    }
    fn seq_rm(&mut self, seq_id: SeqId, p0: u32, p1: Option<u32>) {
        let p0 = i32::try_from(p0).unwrap_or(i32::MAX);
        let p1 = p1.map(|p| i32::try_from(p).unwrap_or(i32::MAX));
        self.ctx.seq_rm(Some(seq_id as usize), Some(p0), p1);
    }
    fn embed(&mut self, tokens: &[Token]) -> Result<Vec<f32>, EngineError> {
        self.ctx.embed(tokens).map_err(engine_error)
    }
}
