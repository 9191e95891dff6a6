//! Mistral 3 / Ministral, after llama.cpp's `llama_model_mistral3`: the llama graph (see
//! [`super::llama`]), with Q multiplied by a per-position attention temperature when the file
//! sets `attention.temperature_scale`.

use lamina_gguf::Gguf;

use super::Architecture;
use crate::ModelError;
use crate::hparams::MetaReader;

pub(super) fn load(gguf: &Gguf) -> Result<Box<dyn Architecture>, ModelError> {
    let r = MetaReader::new(gguf, "mistral3");
    let mut model = super::llama::load_as(&r, gguf)?;
    let hp = model.hparams_mut();
    hp.yarn_beta_fast = r.f32("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0);
    hp.yarn_beta_slow = r.f32("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0);
    hp.yarn_log_mul = r.f32("rope.scaling.yarn_log_multiplier")?.unwrap_or(0.0);
    let scale = r.f32("attention.temperature_scale")?.unwrap_or(0.0);
    if scale != 0.0 {
        let floor_scale = model.hparams().n_ctx_orig;
        if floor_scale == 0 {
            return Err(r.bad(
                "rope.scaling.original_context_length",
                "attention temperature scaling needs a positive original context".into(),
            ));
        }
        model.attn_temperature = Some((scale, floor_scale));
    }
    Ok(Box::new(model))
}
