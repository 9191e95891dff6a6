//! Which tensor gets which type: a port of llama.cpp's `src/llama-quant.cpp` rules
//! (`tensor_allows_quantization`, `llama_tensor_get_type_impl`, `tensor_type_fallback`,
//! `tensor_requires_imatrix`), kept in its order and shape so the two can be read side by side.
//! The outcome decides the output bytes, so every branch matters, including the odd ones.

use lamina_core::DType;
use regex::Regex;

use super::QuantizeError;
use super::ftype::FileType;

/// Broad tensor categories (`tensor_category`): what the rules key on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    TokenEmbd,
    AttentionQ,
    AttentionV,
    AttentionK,
    AttentionQkv,
    AttentionKvB,
    AttentionOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

impl Category {
    pub fn of(name: &str) -> Category {
        use Category::*;
        if name == "output.weight" {
            return Output;
        }
        if is_token_embd(name) {
            return TokenEmbd;
        }
        for (pat, cat) in [
            ("attn_qkv.weight", AttentionQkv),
            ("attn_kv_b.weight", AttentionKvB),
            ("attn_v.weight", AttentionV),
            ("attn_k.weight", AttentionK),
            ("attn_q.weight", AttentionQ),
            ("attn_output.weight", AttentionOutput),
            ("ffn_up", FfnUp),
            ("ffn_gate", FfnGate),
            ("ffn_down", FfnDown),
        ] {
            if name.contains(pat) {
                return cat;
            }
        }
        Other
    }

    /// Attention-V-like tensors, more sensitive to quantization.
    fn is_attn_v(self) -> bool {
        matches!(
            self,
            Category::AttentionV | Category::AttentionQkv | Category::AttentionKvB
        )
    }
}

pub(crate) fn is_token_embd(name: &str) -> bool {
    name == "token_embd.weight" || name == "per_layer_token_embd.weight"
}

/// The model facts the rules look at (`llama_hparams` and the architecture).
#[derive(Clone, Debug)]
pub struct ModelFacts {
    pub arch: String,
    pub n_layer: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub n_expert: u32,
    /// llama.cpp's `LLM_TYPE_70B`: a llama model with 80 layers and grouped-query attention.
    pub is_70b: bool,
}

impl ModelFacts {
    fn n_gqa(&self) -> u32 {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }
}

/// What the type choice depends on besides the tensor (`llama_model_quantize_params`).
#[derive(Clone, Debug, Default)]
pub struct TypeOptions {
    pub output_tensor_type: Option<DType>,
    pub token_embedding_type: Option<DType>,
    pub quantize_output_tensor: bool,
    pub only_copy: bool,
    pub pure: bool,
    /// `--tensor-type` patterns, searched in order (`std::regex_search`).
    pub tensor_types: Vec<(Regex, DType)>,
}

/// The shape facts of one tensor the rules need.
#[derive(Clone, Copy, Debug)]
pub struct TensorShape {
    pub dtype: DType,
    /// ggml's `ne`, unused dimensions 1.
    pub ne: [u64; 4],
}

impl TensorShape {
    /// `ggml_n_dims`: dimensions up to the last one that is not 1 (at least 1).
    pub fn n_dims(&self) -> usize {
        (1..4).rev().find(|&i| self.ne[i] > 1).map_or(1, |i| i + 1)
    }
}

/// The running state of one quantization (`quantize_state_impl`): counters the rules advance
/// as they see tensors, in file order.
#[derive(Clone, Debug)]
pub struct TypeChooser<'a> {
    facts: &'a ModelFacts,
    opts: &'a TypeOptions,
    pub has_imatrix: bool,
    has_tied_embeddings: bool,
    n_attention_wv: i64,
    n_ffn_down: i64,
    n_ffn_gate: i64,
    n_ffn_up: i64,
    i_attention_wv: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
    /// How many tensors fell back to another type because of their row length.
    pub n_fallback: usize,
    /// The warnings llama.cpp logs while choosing (one line each).
    pub warnings: Vec<String>,
}

impl<'a> TypeChooser<'a> {
    /// `init_quantize_state_counters` over every tensor name, in the order they will be seen.
    pub fn new<'n>(
        facts: &'a ModelFacts,
        opts: &'a TypeOptions,
        has_imatrix: bool,
        names: impl IntoIterator<Item = &'n str>,
    ) -> TypeChooser<'a> {
        let mut n_attention_wv = 0;
        let mut has_tied_embeddings = true;
        for name in names {
            let cat = Category::of(name);
            if cat.is_attn_v() {
                n_attention_wv += 1;
            }
            if cat == Category::Output {
                has_tied_embeddings = false;
            }
        }
        let n_layer = i64::from(facts.n_layer);
        TypeChooser {
            facts,
            opts,
            has_imatrix,
            has_tied_embeddings,
            n_attention_wv,
            n_ffn_down: n_layer,
            n_ffn_gate: n_layer,
            n_ffn_up: n_layer,
            i_attention_wv: 0,
            i_ffn_down: 0,
            i_ffn_gate: 0,
            i_ffn_up: 0,
            n_fallback: 0,
            warnings: Vec::new(),
        }
    }

    /// `tensor_allows_quantization`.
    pub fn allows_quantization(&self, name: &str, shape: &TensorShape) -> bool {
        if self.opts.only_copy || shape.n_dims() < 2 {
            return false;
        }
        let mut q = name.ends_with("weight");
        q &= !name.contains("_norm.weight");
        q &= self.opts.quantize_output_tensor || name != "output.weight";
        for never in [
            "ffn_gate_inp.weight",
            "ffn_gate_tid2eid.weight",
            "altup",
            "laurel",
            "per_layer_model_proj",
        ] {
            q &= !name.contains(never);
        }
        q &= name != "position_embd.weight";
        q &= name != "token_types.weight";
        for never in [
            "ssm_conv1d",
            "shortconv.conv.weight",
            "indexer.k_proj.weight",
            "indexer.q_proj.weight",
        ] {
            q &= !name.contains(never);
        }
        if self.facts.arch == "glm5-next" {
            for never in [
                "hc_",
                "indexer.attn_q_b",
                "indexer.attn_k",
                "indexer.proj",
                "indexer_compressor_gate",
                "indexer_compressor_ape",
                "ssm_f_a.weight",
                "ssm_f_b.weight",
                "ssm_g_a.weight",
                "ssm_g_b.weight",
                "ssm_beta.weight",
                "attn_kv_a_mqa.weight",
                "attn_k_b.weight",
                "attn_v_b.weight",
            ] {
                q &= !name.contains(never);
            }
        }
        for never in [
            "time_mix_first.weight",
            "time_mix_w0.weight",
            "time_mix_w1.weight",
            "time_mix_w2.weight",
            "time_mix_v0.weight",
            "time_mix_v1.weight",
            "time_mix_v2.weight",
            "time_mix_a0.weight",
            "time_mix_a1.weight",
            "time_mix_a2.weight",
            "time_mix_g1.weight",
            "time_mix_g2.weight",
            "time_mix_decay_w1.weight",
            "time_mix_decay_w2.weight",
            "time_mix_lerp_fused.weight",
            "attn_rel_b.weight",
            ".position_embd",
            "sam.pos_embd",
            "sam.neck.",
            "sam.net_",
            ".rel_pos",
            ".patch_embd",
            ".patch_merger",
            "a.rvq.codebook",
            "mm.a.code_embd",
        ] {
            q &= !name.contains(never);
        }
        q
    }

    /// `llama_tensor_get_type`: the type tensor `name` is written as.
    pub fn choose(
        &mut self,
        name: &str,
        shape: &TensorShape,
        ftype: FileType,
        default_type: DType,
    ) -> Result<DType, QuantizeError> {
        if !self.allows_quantization(name, shape) {
            return Ok(shape.dtype);
        }
        let category = Category::of(name);
        if let Some(t) = self.opts.token_embedding_type
            && category == Category::TokenEmbd
        {
            // per_layer_token_embd follows --token-embedding-type unless a --tensor-type names it.
            let named = name == "per_layer_token_embd.weight"
                && self
                    .opts
                    .tensor_types
                    .iter()
                    .any(|(re, _)| re.is_match(name));
            if !named {
                return Ok(t);
            }
        }
        if let Some(t) = self.opts.output_tensor_type
            && category == Category::Output
        {
            return Ok(t);
        }
        let mut new_type = default_type;
        if default_type.is_quantized() {
            let mut manual = false;
            if let Some((_, t)) = self
                .opts
                .tensor_types
                .iter()
                .find(|(re, _)| re.is_match(name))
            {
                if *t != new_type {
                    self.warnings.push(format!(
                        "{name:<36} - applying manual override: {} -> {}",
                        new_type.name(),
                        t.name()
                    ));
                    new_type = *t;
                }
                manual = true;
            }
            if !manual && !self.opts.pure {
                new_type = self.standard_type(new_type, name, shape, ftype, category)?;
            }
            new_type = self.fallback(name, shape, new_type)?;
        }
        Ok(new_type)
    }

    /// `tensor_type_fallback`: a type whose block does not divide the row falls back.
    fn fallback(
        &mut self,
        name: &str,
        shape: &TensorShape,
        target: DType,
    ) -> Result<DType, QuantizeError> {
        let ncols = shape.ne[0];
        let qk = target.block_size();
        if ncols.is_multiple_of(qk) {
            return Ok(target);
        }
        self.n_fallback += 1;
        use DType::*;
        let mut out = match target {
            IQ1_S | IQ1_M | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_XS => IQ4_NL,
            Q2_0 | Q2_K | Q3_K | TQ1_0 | TQ2_0 => Q4_0,
            Q4_K => Q5_0,
            Q5_K => Q5_1,
            Q6_K => Q8_0,
            t if qk <= 32 => t,
            t => return Err(QuantizeError::NoFallback(t)),
        };
        let mut line = format!(
            "{name:<36} - ncols {ncols:>6} not divisible by {qk:>3} (required for type {:>7}) ",
            target.name()
        );
        if !ncols.is_multiple_of(out.block_size()) {
            line.push_str("(WARNING: must use F16 due to unusual shape) ");
            out = F16;
        }
        line.push_str(&format!("-> falling back to {:>7}", out.name()));
        self.warnings.push(line);
        Ok(out)
    }

    /// The layer of an expert tensor from its name (`blk.N.`), as llama.cpp finds it for MoE
    /// models; otherwise the running counter.
    fn layer_info(&self, counter: i64, n_layer: i64, name: &str) -> Result<i64, QuantizeError> {
        if self.facts.n_expert.max(1) > 1 {
            let layer = block_index(name).ok_or_else(|| QuantizeError::NoLayer(name.into()))?;
            if layer < 0 || layer >= n_layer {
                return Err(QuantizeError::BadLayer {
                    tensor: name.into(),
                    layer,
                    n_layer,
                });
            }
            return Ok(layer);
        }
        Ok(counter)
    }

    /// `llama_tensor_get_type_impl`: the mixture rules of each file type.
    // Branch for branch as llama.cpp's chain, some with the same outcome, so the two compare.
    #[allow(clippy::if_same_then_else)]
    fn standard_type(
        &mut self,
        mut new_type: DType,
        name: &str,
        shape: &TensorShape,
        ftype: FileType,
        category: Category,
    ) -> Result<DType, QuantizeError> {
        use Category as C;
        use DType as T;
        use FileType as F;
        let arch = self.facts.arch.as_str();
        let falcon = arch == "falcon";
        let n_expert = self.facts.n_expert;
        let n_gqa = self.facts.n_gqa();
        let use_more_bits = |i: i64, n: i64| i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
        let is = |set: &[F]| set.contains(&ftype);

        if arch == "glm5-next"
            && (name.contains("attn_q_a")
                || name.contains("attn_q_b")
                || name.contains("nextn.eh_proj"))
            && !matches!(new_type, T::F32 | T::BF16 | T::F16)
        {
            return Ok(T::Q8_0);
        }

        let low_bit = [
            F::IQ2_XXS,
            F::IQ2_XS,
            F::IQ1_S,
            F::IQ2_S,
            F::IQ2_M,
            F::IQ1_M,
        ];
        if category == C::Output || (self.has_tied_embeddings && category == C::TokenEmbd) {
            if let Some(t) = self.opts.output_tensor_type {
                new_type = t;
            } else {
                let nx = shape.ne[0];
                let qk = new_type.block_size();
                if ftype == F::MXFP4_MOE || falcon || !nx.is_multiple_of(qk) {
                    new_type = T::Q8_0;
                } else if is(&[
                    F::IQ2_XXS,
                    F::IQ2_XS,
                    F::IQ3_XXS,
                    F::IQ1_S,
                    F::IQ2_S,
                    F::IQ2_M,
                    F::IQ1_M,
                ]) {
                    new_type = T::Q5_K;
                } else if new_type != T::Q8_0 {
                    new_type = T::Q6_K;
                }
            }
        } else if ftype == F::MXFP4_MOE {
            let bailing_expert =
                arch == "bailingmoe3" && matches!(category, C::FfnUp | C::FfnGate | C::FfnDown);
            new_type = if shape.ne[2] > 1 && (arch != "bailingmoe3" || bailing_expert) {
                T::MXFP4
            } else {
                T::Q8_0
            };
        } else if category == C::TokenEmbd {
            if let Some(t) = self.opts.token_embedding_type {
                new_type = t;
            } else if is(&[F::IQ2_XXS, F::IQ2_XS, F::IQ1_S, F::IQ1_M]) {
                new_type = T::Q2_K;
            } else if is(&[F::IQ2_S, F::IQ2_M, F::IQ3_XXS]) {
                new_type = T::IQ3_S;
            } else if is(&[F::TQ1_0, F::TQ2_0, F::Q2_0]) {
                new_type = T::Q4_K;
            }
        } else if is(&low_bit) {
            let s_or_m = is(&[F::IQ2_S, F::IQ2_M]);
            if category.is_attn_v() {
                new_type = if n_gqa >= 4 || n_expert >= 4 {
                    T::Q4_K
                } else if s_or_m {
                    T::IQ3_S
                } else {
                    T::Q2_K
                };
                self.i_attention_wv += 1;
            } else if n_expert == 8 && category == C::AttentionK {
                new_type = T::Q4_K;
            } else if category == C::FfnDown {
                if self.i_ffn_down < self.n_ffn_down / 8 {
                    new_type = if s_or_m { T::IQ3_S } else { T::Q2_K };
                }
                self.i_ffn_down += 1;
            } else if category == C::AttentionOutput {
                if n_expert == 8 {
                    new_type = T::Q5_K;
                } else if is(&[F::IQ1_S, F::IQ1_M]) {
                    new_type = T::IQ2_XXS;
                } else if s_or_m {
                    new_type = T::IQ3_S;
                }
            }
        } else if category.is_attn_v() {
            if ftype == F::Q2_K {
                new_type = if n_gqa >= 4 { T::Q4_K } else { T::Q3_K };
            } else if ftype == F::Q2_K_S && n_gqa >= 4 {
                new_type = T::Q4_K;
            } else if ftype == F::IQ3_XXS {
                new_type = if n_gqa >= 4 {
                    T::Q4_K
                } else if !self.has_imatrix {
                    T::IQ3_S
                } else {
                    T::IQ3_XXS
                };
            } else if is(&[F::IQ3_XS, F::IQ3_S]) && n_gqa >= 4 {
                new_type = T::Q4_K;
            } else if ftype == F::IQ3_M {
                new_type = T::Q4_K;
            } else if ftype == F::Q3_K_M {
                new_type = if self.i_attention_wv < 2 {
                    T::Q5_K
                } else {
                    T::Q4_K
                };
            } else if ftype == F::Q3_K_L {
                new_type = T::Q5_K;
            } else if is(&[F::IQ4_NL, F::IQ4_XS]) && n_gqa >= 4 {
                new_type = T::Q5_K;
            } else if is(&[F::Q4_K_M, F::Q5_K_M])
                && use_more_bits(self.i_attention_wv, self.n_attention_wv)
            {
                new_type = T::Q6_K;
            } else if ftype == F::Q4_K_S && self.i_attention_wv < 4 {
                new_type = T::Q5_K;
            }
            if self.facts.is_70b && matches!(new_type, T::Q3_K | T::Q4_K) {
                new_type = T::Q5_K;
            }
            if n_expert == 8 {
                new_type = T::Q8_0;
            }
            self.i_attention_wv += 1;
        } else if category == C::AttentionK {
            if n_expert == 8 {
                new_type = T::Q8_0;
            } else if ftype == F::IQ3_XS {
                new_type = T::IQ3_XXS;
            } else if ftype == F::IQ3_XXS {
                new_type = T::IQ2_S;
            }
        } else if category == C::AttentionQ {
            if ftype == F::IQ3_XS {
                new_type = T::IQ3_XXS;
            } else if ftype == F::IQ3_XXS {
                new_type = T::IQ2_S;
            }
        } else if category == C::FfnDown {
            let i_layer = self.layer_info(self.i_ffn_down, self.n_ffn_down, name)?;
            let n_layer = self.n_ffn_down;
            if ftype == F::Q2_K {
                new_type = T::Q3_K;
            } else if ftype == F::Q2_K_S {
                if i_layer < n_layer / 8 {
                    new_type = T::Q4_K;
                }
            } else if ftype == F::IQ3_XXS && !self.has_imatrix {
                new_type = if i_layer < n_layer / 8 {
                    T::Q4_K
                } else {
                    T::Q3_K
                };
            } else if ftype == F::Q3_K_M {
                new_type = if i_layer < n_layer / 16 {
                    T::Q5_K
                } else if !falcon || use_more_bits(i_layer, n_layer) {
                    T::Q4_K
                } else {
                    T::Q3_K
                };
            } else if ftype == F::IQ3_M
                && (i_layer < n_layer / 8 || (n_expert == 8 && use_more_bits(i_layer, n_layer)))
            {
                new_type = T::Q4_K;
            } else if ftype == F::Q3_K_L {
                new_type = if falcon { T::Q4_K } else { T::Q5_K };
            } else if ftype == F::Q4_K_M {
                if falcon {
                    new_type = if i_layer < n_layer / 16 {
                        T::Q6_K
                    } else if use_more_bits(i_layer, n_layer) {
                        T::Q5_K
                    } else {
                        T::Q4_K
                    };
                } else if use_more_bits(i_layer, n_layer) {
                    new_type = T::Q6_K;
                }
            } else if i_layer < n_layer / 8 && is(&[F::IQ4_NL, F::IQ4_XS]) && !self.has_imatrix {
                new_type = T::Q5_K;
            } else if ftype == F::Q5_K_M && use_more_bits(i_layer, n_layer) {
                new_type = T::Q6_K;
            } else if ftype == F::Q4_K_S && !falcon && i_layer < n_layer / 8 {
                new_type = T::Q5_K;
            } else if is(&[F::Q4_0, F::Q5_0]) && self.has_imatrix && i_layer < n_layer / 8 {
                new_type = if ftype == F::Q4_0 { T::Q4_1 } else { T::Q5_1 };
            }
            self.i_ffn_down += 1;
        } else if category == C::AttentionOutput {
            if !falcon {
                if n_expert == 8 {
                    if is(&[
                        F::Q2_K,
                        F::IQ3_XS,
                        F::IQ3_XXS,
                        F::Q3_K_S,
                        F::Q3_K_M,
                        F::IQ4_NL,
                        F::Q4_K_S,
                        F::Q4_K_M,
                        F::IQ3_S,
                        F::IQ3_M,
                        F::IQ4_XS,
                    ]) {
                        new_type = T::Q5_K;
                    }
                } else if ftype == F::Q2_K {
                    new_type = T::Q3_K;
                } else if ftype == F::IQ3_XXS {
                    new_type = T::IQ3_S;
                } else if ftype == F::Q3_K_M {
                    new_type = T::Q4_K;
                } else if ftype == F::Q3_K_L {
                    new_type = T::Q5_K;
                } else if ftype == F::IQ3_M {
                    new_type = T::Q4_K;
                }
            } else if ftype == F::Q3_K_L {
                new_type = T::Q4_K;
            }
        } else if category == C::AttentionQkv {
            if is(&[F::Q3_K_M, F::Q3_K_L, F::IQ3_M]) {
                new_type = T::Q4_K;
            } else if ftype == F::Q4_K_M {
                new_type = T::Q5_K;
            } else if ftype == F::Q5_K_M {
                new_type = T::Q6_K;
            }
        } else if category == C::FfnGate || category == C::FfnUp {
            let up = category == C::FfnUp;
            let (counter, n) = if up {
                (self.i_ffn_up, self.n_ffn_up)
            } else {
                (self.i_ffn_gate, self.n_ffn_gate)
            };
            let i_layer = self.layer_info(counter, n, name)?;
            if ftype == F::IQ3_XS && i_layer >= n / 8 && i_layer < 7 * n / 8 {
                new_type = T::IQ3_XXS;
            }
            if up {
                self.i_ffn_up += 1;
            } else {
                self.i_ffn_gate += 1;
            }
        }
        Ok(new_type)
    }
}

/// `tensor_requires_imatrix`: the very low-bit types are garbage without an importance matrix.
pub fn requires_imatrix(name: &str, dtype: DType, ftype: FileType) -> bool {
    if is_token_embd(name) || name == "output.weight" {
        return false;
    }
    match dtype {
        DType::IQ3_XXS
        | DType::IQ2_XXS
        | DType::IQ2_XS
        | DType::IQ2_S
        | DType::IQ1_M
        | DType::IQ1_S => true,
        DType::Q2_K => ftype == FileType::Q2_K_S,
        _ => false,
    }
}

/// The `N` of a `blk.N.` tensor name, read as C's `sscanf(name, "blk.%d.")` reads it.
pub fn block_index(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?;
    let rest = rest.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (sign, digits) = match rest.as_bytes().first() {
        Some(b'-') => (-1, &rest[1..]),
        Some(b'+') => (1, &rest[1..]),
        _ => (1, rest),
    };
    let end = digits
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    if end == 0 {
        return None;
    }
    // Beyond i32 C's behaviour is undefined; saturate instead.
    let v: i64 = digits[..end].parse().unwrap_or(i64::from(i32::MAX));
    Some((sign * v).clamp(i64::from(i32::MIN), i64::from(i32::MAX)))
}

/// llama.cpp's tensor order (`weight_name_comparer`): by block index (no block first), then
/// by name.
pub fn weight_order(a: &str, b: &str) -> std::cmp::Ordering {
    let la = block_index(a).unwrap_or(-1);
    let lb = block_index(b).unwrap_or(-1);
    la.cmp(&lb).then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_index_reads_like_sscanf() {
        assert_eq!(block_index("blk.12.attn_q.weight"), Some(12));
        assert_eq!(block_index("blk.3"), Some(3));
        assert_eq!(block_index("output.weight"), None);
        assert_eq!(block_index("blk.x.y"), None);
        assert_eq!(block_index("blk.-2.a"), Some(-2));
        let mut names = vec![
            "blk.10.a",
            "blk.2.b",
            "token_embd.weight",
            "blk.2.a",
            "output_norm.weight",
        ];
        names.sort_by(|a, b| weight_order(a, b));
        assert_eq!(
            names,
            [
                "output_norm.weight",
                "token_embd.weight",
                "blk.2.a",
                "blk.2.b",
                "blk.10.a"
            ]
        );
    }

    #[test]
    fn n_dims_trims_trailing_ones() {
        let s = |ne| TensorShape {
            dtype: DType::F32,
            ne,
        };
        assert_eq!(s([576, 1, 1, 1]).n_dims(), 1);
        assert_eq!(s([576, 49152, 1, 1]).n_dims(), 2);
        assert_eq!(s([1, 1, 1, 1]).n_dims(), 1);
        assert_eq!(s([64, 1, 8, 1]).n_dims(), 3);
    }
}
