//! Loading a vocabulary from GGUF metadata, as llama.cpp's `llama_vocab::impl::load` does:
//! tokens, scores, types, merges, special ids, flags, the end-of-generation set, and the
//! pre-tokenizer. Hostile input is refused with a [`TokenizerError`].

use std::collections::BTreeSet;

use lamina_gguf::{Array, Gguf, Metadata, Value};

use crate::hash::FxHashMap;
use crate::strtab::{BuildError, InsertError, PieceTable, StrTable};
use crate::unicode::Splitter;
use crate::{TokenId, TokenizerError};

/// Token attributes (llama.cpp's `llama_token_attr` bits).
pub mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const NORMALIZED: u16 = 1 << 6;
    pub const LSTRIP: u16 = 1 << 7;
    pub const RSTRIP: u16 = 1 << 8;
    pub const SINGLE_WORD: u16 = 1 << 9;
}

/// The tokenizer algorithm family (`tokenizer.ggml.model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// SentencePiece BPE with byte fallback (`llama`: Llama 1/2, Gemma 1-3, Phi-3, ...).
    Spm,
    /// Byte-level BPE with a regex pre-tokenizer (`gpt2`), or SentencePiece-style BPE (`gemma4`).
    Bpe,
    /// WordPiece (`bert`).
    Wpm,
}

/// BPE merges, interned: every merge side and every merge result gets a piece id, so the merge
/// loop compares integers, never strings. A piece that is a token has the token's id as piece
/// id; the others are numbered from `n_tokens` up.
#[derive(Default)]
pub(crate) struct Merges {
    /// Pieces that are not tokens (piece id = `n_tokens` + index).
    pub extra: StrTable,
    /// (left piece, right piece) -> (rank, merged piece).
    pub ranks: FxHashMap<(u32, u32), (u32, u32)>,
}

impl Merges {
    fn intern(&mut self, s: &str, texts: &StrTable) -> Result<u32, TokenizerError> {
        if let Some(id) = texts.find(s) {
            return Ok(id);
        }
        let n = texts.len() as u32;
        let id = match self.extra.insert(s) {
            Ok(i) | Err(InsertError::Duplicate(i)) => n.checked_add(i),
            Err(InsertError::Full) => None,
        };
        // u32::MAX marks "no piece" in the merge loop.
        id.filter(|&id| id != u32::MAX)
            .ok_or_else(|| bad("tokenizer.ggml.merges", "too many merge pieces"))
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct SpecialIds {
    pub bos: Option<TokenId>,
    pub eos: Option<TokenId>,
    pub eot: Option<TokenId>,
    pub eom: Option<TokenId>,
    pub unk: Option<TokenId>,
    pub sep: Option<TokenId>,
    pub pad: Option<TokenId>,
    pub mask: Option<TokenId>,
    pub fim_pre: Option<TokenId>,
    pub fim_suf: Option<TokenId>,
    pub fim_mid: Option<TokenId>,
    pub fim_pad: Option<TokenId>,
    pub fim_rep: Option<TokenId>,
    pub fim_sep: Option<TokenId>,
}

/// Everything read from the file, plus the derived caches.
pub(crate) struct Vocab {
    pub kind: VocabKind,
    pub model_name: String,
    pub pre_name: String,
    /// Token texts, by id and by text.
    pub texts: StrTable,
    /// Empty when the file has no scores (all 0).
    pub scores: Vec<f32>,
    /// [`attr`] bits per token.
    pub attrs: Vec<u16>,
    pub merges: Merges,
    /// SPM: characters that some token has right before a `▁` (merges may join across such a
    /// pair; the tokenizer cuts the text before every other `▁`).
    pub spm_joins_space: std::collections::HashSet<char>,
    pub splitters: Vec<Splitter>,
    pub byte_encode: bool,
    pub is_gemma4_pre: bool,
    pub ids: SpecialIds,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_sep: bool,
    pub add_space_prefix: bool,
    pub ignore_merges: bool,
    pub clean_spaces: bool,
    pub escape_whitespaces: bool,
    pub lowercase: bool,
    pub strip_accents: bool,
    pub max_token_len: usize,
    pub eog: BTreeSet<TokenId>,
    /// Control, user-defined and unknown tokens, longest text first.
    pub special_cache: Vec<TokenId>,
    /// `token_to_piece(id, special = true)` for every token.
    pub piece_cache: PieceTable,
    pub chat_template: Option<String>,
    pub chat_template_tool_use: Option<String>,
    /// `tokenizer.chat_template.rerank`: a reranker's prompt with `{query}` and `{document}`.
    pub chat_template_rerank: Option<String>,
}

fn bad(key: &str, message: impl Into<String>) -> TokenizerError {
    TokenizerError::BadMetadata {
        key: key.to_string(),
        message: message.into(),
    }
}

fn opt_bool(md: &Metadata, key: &str) -> Result<Option<bool>, TokenizerError> {
    Ok(md.get_bool(key)?)
}

/// The pre-tokenizer regexes llama.cpp uses for `pre`, or None when we do not know `pre`.
/// Also returns whether the words are GPT-2 byte-encoded.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn pre_tokenizer(pre: &str) -> Option<(Vec<&'static str>, bool)> {
    const DEEPSEEK_LETTERS: &str = "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+";
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "dbrx" | "smaug-bpe" | "glm4" | "glm5" | "chatglm-bpe" => (vec![LLAMA3], true),
        "deepseek-llm" => (
            vec![
                "[\r\n]",
                DEEPSEEK_LETTERS,
                "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
                "\\s+$",
                "[一-龥ࠀ-一가-퟿]+",
                r"\p{N}+",
            ],
            true,
        ),
        "deepseek-coder" => (
            vec![
                "[\r\n]",
                r"\s?\p{L}+",
                r"\s?\p{P}+",
                "[一-龥ࠀ-一가-퟿]+",
                r"\p{N}",
            ],
            true,
        ),
        "falcon" => (
            vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"],
            true,
        ),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b"
        | "mellum2" => (vec![r"\p{N}", GPT2], true),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo" | "jais" | "trillion"
        | "granite-docling" | "exaone4" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => {
            (vec![GPT2], true)
        }
        "stablelm2" | "qwen2" | "deepseek-r1-qwen" | "hunyuan" | "megrez" | "solar-open"
        | "grok-2" => (vec![QWEN2], true),
        "viking" => (vec![" ?[^(\\s|.,!?…。，、।۔،)]+", r"\p{N}"], true),
        "poro-chat" | "bloom" | "gpt3-finnish" => (vec![" ?[^(\\s|.,!?…。，、।۔،)]+"], true),
        "gemma4" | "granite-embed-multi-311m" | "sarvam-moe" => (vec!["[^\\n]+|[\\n]+"], false),
        "kormo" | "f2llmv2" => (vec![QWEN2], true),
        "qwen35" => (vec![QWEN35], true),
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => (
            vec![
                r"\p{N}{1,3}",
                "[一-龥぀-ゟ゠-ヿ]+",
                r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
            ],
            true,
        ),
        "tekken" => (
            vec![
                r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            ],
            true,
        ),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => (
            vec![
                r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            ],
            true,
        ),
        "seed-coder" => (
            vec![
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
            ],
            true,
        ),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => (
            vec![
                r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
            ],
            true,
        ),
        "laguna" => (vec!["[^\\n]+|[\\n]+", QWEN2], true),
        "ufakzeka" => (
            vec![
                r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            ],
            true,
        ),
        "minicpm5" => (
            vec![
                r"\p{N}{1,3}",
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            ],
            true,
        ),
        "default" => (
            vec![r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
            true,
        ),
        _ => return None,
    })
}

fn splitter_for(expr: &str) -> Result<Splitter, TokenizerError> {
    // llama.cpp replaces these two patterns with hand-written splitters.
    if expr == GPT2 {
        return Ok(Splitter::Gpt2);
    }
    if expr == LLAMA3 {
        return Ok(Splitter::Llama3 {
            max_digits: 3,
            marks: false,
        });
    }
    if expr == QWEN2 {
        return Ok(Splitter::Llama3 {
            max_digits: 1,
            marks: false,
        });
    }
    if expr == QWEN35 {
        return Ok(Splitter::Llama3 {
            max_digits: 1,
            marks: true,
        });
    }
    if expr == "[^\\n]+|[\\n]+" {
        return Ok(Splitter::Newlines);
    }
    Splitter::regex(expr).map_err(|e| TokenizerError::Regex(format!("{expr}: {e}")))
}

/// Reads a special-token id: absent is fine, out of range is refused.
fn special_id(
    md: &Metadata,
    key: &str,
    n_tokens: usize,
) -> Result<Option<TokenId>, TokenizerError> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    let id = v.as_i64().ok_or_else(|| {
        bad(
            key,
            format!("should be an integer, found {}", v.type_description()),
        )
    })?;
    if id < 0 || id as u64 >= n_tokens as u64 {
        return Err(TokenizerError::SpecialIdOutOfRange {
            key: key.to_string(),
            id,
            n_vocab: n_tokens,
        });
    }
    Ok(Some(id as TokenId))
}

impl Vocab {
    pub fn load(gguf: &Gguf) -> Result<Vocab, TokenizerError> {
        let md = &gguf.metadata;
        let model = md
            .get_str("tokenizer.ggml.model")?
            .ok_or(TokenizerError::NoVocabulary)?
            .to_string();
        let pre_meta = md.get_str("tokenizer.ggml.pre")?.map(str::to_string);

        let (kind, defaults) = match model.as_str() {
            "no_vocab" | "none" => return Err(TokenizerError::NoVocabulary),
            "llama" => (
                VocabKind::Spm,
                [Some(1), Some(2), Some(0), None, None, None],
            ),
            "bert" => (
                VocabKind::Wpm,
                [Some(101), None, Some(100), Some(102), Some(0), Some(103)],
            ),
            "gpt2" => (VocabKind::Bpe, [Some(11), Some(11), None, None, None, None]),
            "gemma4" => (VocabKind::Bpe, [None; 6]),
            other => return Err(TokenizerError::UnknownModel(other.to_string())),
        };

        // Tokens.
        let tokens_v = md
            .get_str_array("tokenizer.ggml.tokens")?
            .ok_or(TokenizerError::NoVocabulary)?;
        if tokens_v.is_empty() {
            return Err(TokenizerError::EmptyVocabulary);
        }
        if tokens_v.len() > i32::MAX as usize {
            return Err(bad(
                "tokenizer.ggml.tokens",
                "more tokens than i32 ids can address",
            ));
        }
        let n = tokens_v.len();

        let scores: Vec<f32> = match md.get("tokenizer.ggml.scores") {
            None => Vec::new(),
            Some(Value::Array(Array::F32(v))) if v.len() >= n => v[..n].to_vec(),
            Some(Value::Array(Array::I32(v))) if v.len() >= n => {
                v[..n].iter().map(|&x| x as f32).collect()
            }
            Some(v) => {
                return Err(bad(
                    "tokenizer.ggml.scores",
                    format!(
                        "should be an array of at least {n} f32 or i32, found {}",
                        v.type_description()
                    ),
                ));
            }
        };
        let types: Option<&[i32]> = match md.get("tokenizer.ggml.token_type") {
            None => None,
            Some(Value::Array(Array::I32(v))) if v.len() >= n => Some(&v[..n]),
            Some(v) => {
                return Err(bad(
                    "tokenizer.ggml.token_type",
                    format!(
                        "should be an array of at least {n} i32, found {}",
                        v.type_description()
                    ),
                ));
            }
        };

        // The token texts are the metadata's own strings, shared, unless some are empty:
        // llama.cpp renames those `[EMPTY_<id>]`, which takes a copy.
        let strings = if tokens_v.iter().any(str::is_empty) {
            tokens_v
                .iter()
                .enumerate()
                .map(|(i, word)| {
                    if word.is_empty() {
                        format!("[EMPTY_{i}]").into()
                    } else {
                        std::borrow::Cow::Borrowed(word)
                    }
                })
                .collect()
        } else {
            tokens_v.clone()
        };
        // (Cloning a `StrArray` shares its buffers.)
        let texts = match StrTable::from_strings(strings.clone()) {
            Ok(t) => t,
            Err(BuildError::Duplicate { first, second }) => {
                return Err(TokenizerError::DuplicateToken {
                    text: strings[second as usize].to_string(),
                    first,
                    second,
                });
            }
            Err(BuildError::Full) => {
                return Err(bad(
                    "tokenizer.ggml.tokens",
                    "token texts total more than 4 GiB",
                ));
            }
        };
        drop(strings);
        let max_token_len = (0..n as TokenId)
            .map(|id| texts.text(id).len())
            .max()
            .unwrap_or(0);
        let attrs: Vec<u16> = (0..n)
            .map(|i| match types.map(|t| t[i]) {
                None => attr::NORMAL,
                Some(1) => attr::NORMAL,
                Some(2) => attr::UNKNOWN,
                Some(3) => attr::CONTROL,
                Some(4) => attr::USER_DEFINED,
                Some(5) => attr::UNUSED,
                Some(6) => attr::BYTE,
                Some(_) => 0,
            })
            .collect();

        // Flags by algorithm and pre-tokenizer.
        let mut pre_name = pre_meta.clone().unwrap_or_default();
        let mut add_bos = false;
        let mut add_eos = false;
        let mut add_sep = false;
        let mut add_space_prefix = false;
        let mut ignore_merges = false;
        let mut clean_spaces = false;
        let mut escape_whitespaces = true;
        let mut splitters = Vec::new();
        let mut byte_encode = true;
        let mut bos_default_null = false;
        let mut merges = Merges::default();
        match kind {
            VocabKind::Bpe => {
                let merges_v = md.get_str_array("tokenizer.ggml.merges")?.ok_or_else(|| {
                    bad(
                        "tokenizer.ggml.merges",
                        "missing: a BPE vocabulary needs its merges",
                    )
                })?;
                let mut merged = String::new();
                for (rank, m) in merges_v.iter().enumerate() {
                    // llama.cpp splits at the first space after the first byte.
                    let (first, second) = match m
                        .as_bytes()
                        .iter()
                        .skip(1)
                        .position(|&b| b == b' ')
                        .map(|p| p + 1)
                    {
                        Some(p) => (&m[..p], &m[p + 1..]),
                        None => ("", ""),
                    };
                    let l = merges.intern(first, &texts)?;
                    let r = merges.intern(second, &texts)?;
                    merged.clear();
                    merged.push_str(first);
                    merged.push_str(second);
                    let merged = merges.intern(&merged, &texts)?;
                    merges.ranks.entry((l, r)).or_insert((rank as u32, merged));
                }
                merges.extra.shrink_to_fit();
                merges.ranks.shrink_to_fit();
                if model == "gemma4" {
                    pre_name = "gemma4".into();
                }
                add_space_prefix = false;
                escape_whitespaces = false;
                clean_spaces = true;
                if pre_name.is_empty() {
                    pre_name = "default".into();
                }
                match pre_name.as_str() {
                    "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
                    | "midm-2.0" | "lfm2" | "jina-v5-nano" => {
                        ignore_merges = true;
                        add_bos = true;
                    }
                    "tekken" => {
                        ignore_merges = true;
                        add_bos = true;
                        clean_spaces = false;
                    }
                    "minicpm5" => ignore_merges = true,
                    "deepseek-llm" | "deepseek-coder" | "deepseek-v3" | "spark2_5"
                    | "command-r" | "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2"
                    | "qwen35" | "poro-chat" | "viking" | "smollm" | "grok-2" | "solar-open"
                    | "hunyuan" | "hunyuan-dense" | "hy_v4" | "joyai-llm" | "gpt-4o" | "llama4"
                    | "kanana2" | "talkie" | "minimax-m2" | "tiny_aya" | "cohere2moe"
                    | "seed-coder" | "bailingmoe" | "bailingmoe2" | "llada-moe" | "laguna"
                    | "ufakzeka" | "trillion" | "granite-docling" => clean_spaces = false,
                    "gemma4" | "granite-embed-multi-311m" => escape_whitespaces = true,
                    "sarvam-moe" => {
                        escape_whitespaces = true;
                        clean_spaces = false;
                    }
                    "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => add_sep = true,
                    "chatglm-bpe" => bos_default_null = true,
                    "glm4" | "glm5" => {
                        bos_default_null = true;
                        ignore_merges = true;
                    }
                    _ => {}
                }
                let (exprs, enc) = pre_tokenizer(&pre_name)
                    .ok_or_else(|| TokenizerError::UnknownPreTokenizer(pre_name.clone()))?;
                byte_encode = enc;
                for e in exprs {
                    splitters.push(splitter_for(e)?);
                }
            }
            VocabKind::Spm => {
                add_space_prefix = true;
                add_bos = true;
            }
            VocabKind::Wpm => {
                clean_spaces = true;
                add_bos = true;
                add_sep = true;
            }
        }
        if let Some(v) = opt_bool(md, "tokenizer.ggml.add_space_prefix")? {
            add_space_prefix = v;
        }

        // Special ids: defaults (disabled when outside the vocabulary), then the file's values.
        let def = |d: Option<u32>| d.filter(|&id| (id as usize) < n);
        let mut ids = SpecialIds {
            bos: if bos_default_null {
                None
            } else {
                def(defaults[0])
            },
            eos: def(defaults[1]),
            unk: def(defaults[2]),
            sep: def(defaults[3]),
            pad: def(defaults[4]),
            mask: def(defaults[5]),
            ..SpecialIds::default()
        };
        // The deprecated prefix/suffix/middle keys come last and win, as in llama.cpp.
        const KEYS: [&str; 17] = [
            "bos",
            "eos",
            "eot",
            "eom",
            "unknown",
            "seperator",
            "padding",
            "mask",
            "fim_pre",
            "fim_suf",
            "fim_mid",
            "fim_pad",
            "fim_rep",
            "fim_sep",
            "prefix",
            "suffix",
            "middle",
        ];
        for (i, name) in KEYS.iter().enumerate() {
            let key = format!("tokenizer.ggml.{name}_token_id");
            let Some(id) = special_id(md, &key, n)? else {
                continue;
            };
            let slot = match i {
                0 => &mut ids.bos,
                1 => &mut ids.eos,
                2 => &mut ids.eot,
                3 => &mut ids.eom,
                4 => &mut ids.unk,
                5 => &mut ids.sep,
                6 => &mut ids.pad,
                7 => &mut ids.mask,
                8 | 14 => &mut ids.fim_pre,
                9 | 15 => &mut ids.fim_suf,
                10 | 16 => &mut ids.fim_mid,
                11 => &mut ids.fim_pad,
                12 => &mut ids.fim_rep,
                _ => &mut ids.fim_sep,
            };
            *slot = Some(id);
        }
        if let Some(v) = opt_bool(md, "tokenizer.ggml.add_bos_token")? {
            add_bos = v;
        }
        if let Some(v) = opt_bool(md, "tokenizer.ggml.add_eos_token")? {
            add_eos = v;
        }
        if let Some(v) = opt_bool(md, "tokenizer.ggml.add_sep_token")? {
            add_sep = v;
        }
        if pre_name == "gemma4" && kind == VocabKind::Bpe {
            add_bos = true;
        }
        for (flag, id, what) in [
            (add_bos, ids.bos, "add_bos"),
            (add_eos, ids.eos, "add_eos"),
            (add_sep, ids.sep, "add_sep"),
        ] {
            if flag && id.is_none() {
                return Err(bad(
                    &format!("tokenizer.ggml.{what}_token"),
                    "is true but the token id is not set",
                ));
            }
        }
        let lowercase = opt_bool(md, "tokenizer.ggml.normalizer.lowercase")?.unwrap_or(true);
        let strip_accents =
            opt_bool(md, "tokenizer.ggml.normalizer.strip_accents")?.unwrap_or(lowercase);

        let mut v = Vocab {
            kind,
            model_name: model,
            pre_name,
            texts,
            scores,
            attrs,
            merges,
            spm_joins_space: Default::default(),
            splitters,
            byte_encode,
            is_gemma4_pre: false,
            ids,
            add_bos,
            add_eos,
            add_sep,
            add_space_prefix,
            ignore_merges,
            clean_spaces,
            escape_whitespaces,
            lowercase,
            strip_accents,
            max_token_len,
            eog: BTreeSet::new(),
            special_cache: Vec::new(),
            piece_cache: PieceTable::default(),
            chat_template: md.get_str("tokenizer.chat_template")?.map(str::to_string),
            chat_template_tool_use: md
                .get_str("tokenizer.chat_template.tool_use")?
                .map(str::to_string),
            chat_template_rerank: md
                .get_str("tokenizer.chat_template.rerank")?
                .map(str::to_string),
        };
        if v.kind == VocabKind::Spm {
            for id in 0..n as TokenId {
                let mut prev = None;
                for c in v.texts.text(id).chars() {
                    if c == '\u{2581}'
                        && let Some(p) = prev
                    {
                        v.spm_joins_space.insert(p);
                    }
                    prev = Some(c);
                }
            }
        }
        v.is_gemma4_pre = v.kind == VocabKind::Bpe && v.pre_name == "gemma4";
        v.detect_specials();
        v.build_eog();
        v.build_caches()?;
        v.per_model_attrs(md)?;
        Ok(v)
    }

    fn set_control(&mut self, id: TokenId) {
        self.attrs[id as usize] |= attr::CONTROL;
    }

    /// Finds EOT/EOM/FIM tokens by their text when the file does not name them, and marks
    /// control tokens whose text says "unused" as unused.
    fn detect_specials(&mut self) {
        const EOT: &[&str] = &[
            "<|eot_id|>",
            "<|im_end|>",
            "<|end|>",
            "<end_of_turn>",
            "<|endoftext|>",
            "<|end_of_text|>",
            "<EOT>",
            "_<EOT>",
            "[EOT]",
            "<｜end▁of▁sentence｜>",
            "<end_of_utterance>",
        ];
        const EOM: &[&str] = &["<|eom_id|>"];
        const FIM_PRE: &[&str] = &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<｜fim▁begin｜>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ];
        const FIM_SUF: &[&str] = &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<｜fim▁hole｜>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ];
        const FIM_MID: &[&str] = &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<｜fim▁end｜>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ];
        const FIM_PAD: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
        const FIM_REP: &[&str] = &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ];
        const FIM_SEP: &[&str] = &["<|file_sep|>"];
        let n = self.texts.len();
        for id in 0..n as TokenId {
            let text = self.texts.text(id);
            let ids = &mut self.ids;
            let mut hit = false;
            for (slot, names) in [
                (&mut ids.eot, EOT),
                (&mut ids.eom, EOM),
                (&mut ids.fim_pre, FIM_PRE),
                (&mut ids.fim_suf, FIM_SUF),
                (&mut ids.fim_mid, FIM_MID),
                (&mut ids.fim_pad, FIM_PAD),
                (&mut ids.fim_rep, FIM_REP),
                (&mut ids.fim_sep, FIM_SEP),
            ] {
                if slot.is_none() && names.contains(&text) {
                    *slot = Some(id);
                    hit = true;
                }
            }
            if hit {
                self.set_control(id);
            }
        }
        for (id, a) in self.attrs.iter_mut().enumerate() {
            if *a & attr::CONTROL != 0
                && *a & attr::UNUSED == 0
                && self.texts.text(id as TokenId).contains("unused")
            {
                *a |= attr::UNUSED;
            }
        }
    }

    fn build_eog(&mut self) {
        const EOG: &[&str] = &[
            "<|eot_id|>",
            "<|im_end|>",
            "<|end|>",
            "<|return|>",
            "<|call|>",
            "<|flush|>",
            "<|calls|>",
            "<end_of_turn>",
            "<|endoftext|>",
            "</s>",
            "<|eom_id|>",
            "<EOT>",
            "_<EOT>",
            "[EOT]",
            "[EOS]",
            "<|end_of_text|>",
            "<end_of_utterance>",
            "<eos>",
            "<turn|>",
            "<|tool_response>",
            "<｜end▁of▁sentence｜>",
            "[e~[",
        ];
        let mut eog = BTreeSet::new();
        for id in [self.ids.fim_pad, self.ids.fim_rep, self.ids.fim_sep]
            .into_iter()
            .flatten()
        {
            eog.insert(id);
        }
        for id in 0..self.texts.len() as TokenId {
            if EOG.contains(&self.texts.text(id)) {
                eog.insert(id);
                self.set_control(id);
            }
        }
        // gpt-oss: these always render.
        for (id, a) in self.attrs.iter_mut().enumerate() {
            if matches!(
                self.texts.text(id as TokenId),
                "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>"
            ) {
                *a = attr::USER_DEFINED;
            }
        }
        for id in [self.ids.eos, self.ids.eot, self.ids.eom]
            .into_iter()
            .flatten()
        {
            eog.insert(id);
        }
        let text_of = |id: TokenId| self.texts.text(id);
        let has = |s: &[&str]| eog.iter().any(|&id| s.contains(&text_of(id)));
        let end_id = eog.iter().copied().find(|&id| text_of(id) == "<|end|>");
        if let Some(end_id) = end_id {
            let (ret, call, flush) = (
                has(&["<|return|>"]),
                has(&["<|call|>", "<|calls|>"]),
                has(&["<|flush|>"]),
            );
            if call && (ret || flush) {
                eog.remove(&end_id);
                self.attrs[end_id as usize] = attr::USER_DEFINED;
            }
        }
        let text_of = |id: TokenId| self.texts.text(id);
        if eog.iter().any(|&id| text_of(id) == "<|tool_response>")
            && let Some(s_id) = eog.iter().copied().find(|&id| text_of(id) == "</s>")
        {
            eog.remove(&s_id);
            self.attrs[s_id as usize] = attr::NORMAL;
        }
        self.eog = eog;
    }

    fn build_caches(&mut self) -> Result<(), TokenizerError> {
        let n = self.texts.len();
        let mut special: Vec<TokenId> = (0..n as TokenId)
            .filter(|&id| {
                self.attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        special.sort_by_key(|&id| std::cmp::Reverse(self.texts.text(id).len()));
        self.special_cache = special;
        // Only the pieces that differ from their token's text are stored; a first pass counts
        // them so that the table is allocated once, at its final size.
        let mut piece = Vec::new();
        let (mut n_stored, mut bytes) = (0usize, 0usize);
        for id in 0..n as TokenId {
            piece.clear();
            self.compute_piece(id, &mut piece);
            if piece != self.texts.text(id).as_bytes() {
                n_stored += 1;
                bytes += piece.len();
            }
        }
        let too_big = || {
            bad(
                "tokenizer.ggml.tokens",
                "token pieces total more than 4 GiB",
            )
        };
        if u32::try_from(bytes).is_err() {
            return Err(too_big());
        }
        let mut pieces = PieceTable::with_capacity(n, n_stored, bytes);
        for id in 0..n as TokenId {
            piece.clear();
            self.compute_piece(id, &mut piece);
            pieces
                .push(self.texts.text(id), &piece)
                .map_err(|_| too_big())?;
        }
        pieces.shrink_to_fit();
        self.piece_cache = pieces;
        Ok(())
    }

    /// Phi-3 strips whitespace after special tokens (llama.cpp keys this on the model name).
    fn per_model_attrs(&mut self, md: &Metadata) -> Result<(), TokenizerError> {
        let name = md.get_str("general.name")?.unwrap_or("").to_lowercase();
        if name.contains("phi-3") || name.contains("phi3") {
            for &id in &self.special_cache {
                self.attrs[id as usize] |= attr::RSTRIP;
            }
            for (t, on) in [
                ("</s>", true),
                ("<unk>", false),
                ("<s>", false),
                ("<|endoftext|>", false),
            ] {
                if let Some(id) = self.texts.find(t) {
                    let a = &mut self.attrs[id as usize];
                    *a = if on {
                        *a | attr::RSTRIP
                    } else {
                        *a & !attr::RSTRIP
                    };
                }
            }
        }
        Ok(())
    }

    /// Appends the token's bytes as `token_to_piece(.., special = true)` renders them.
    fn compute_piece(&self, id: TokenId, out: &mut Vec<u8>) {
        let (text, a) = (self.texts.text(id), self.attrs[id as usize]);
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            out.extend_from_slice(text.as_bytes());
        } else if a & attr::NORMAL != 0 {
            if self.kind != VocabKind::Bpe || self.escape_whitespaces {
                let mut parts = text.split('\u{2581}');
                out.extend_from_slice(parts.next().unwrap_or("").as_bytes());
                for p in parts {
                    out.push(b' ');
                    out.extend_from_slice(p.as_bytes());
                }
            } else {
                decode_byte_level(text, out);
            }
        } else if a & attr::BYTE != 0 {
            out.extend(byte_token_value(text));
        }
    }

    /// The score of token `id` (0 when the file has none).
    #[inline]
    pub fn score(&self, id: TokenId) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }

    /// `token_to_piece(id, special = true)`; `id` must be in the vocabulary.
    #[inline]
    pub fn piece(&self, id: TokenId) -> &[u8] {
        self.piece_cache.get(id as usize, self.texts.text(id))
    }

    pub fn byte_to_token(&self, b: u8) -> Option<TokenId> {
        match self.kind {
            VocabKind::Spm => {
                let hex = format!("<0x{b:02X}>");
                self.texts.find(&hex).or_else(|| {
                    let s = [b];
                    std::str::from_utf8(&s)
                        .ok()
                        .and_then(|s| self.texts.find(s))
                })
            }
            _ => {
                let c = crate::unicode::byte_to_unicode()[b as usize];
                self.texts.find(c.encode_utf8(&mut [0; 4]))
            }
        }
    }
}

/// `<0xAB>` -> 0xAB.
fn byte_token_value(text: &str) -> Option<u8> {
    let hex = text.get(3..5)?;
    u8::from_str_radix(hex, 16).ok()
}

/// GPT-2 byte-level decoding (`llama_decode_text`), appended to `out`.
fn decode_byte_level(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match crate::unicode::unicode_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_pre_tokenizer_compiles_and_splits() {
        let names = [
            "default",
            "llama-bpe",
            "deepseek-llm",
            "deepseek-coder",
            "deepseek-v3",
            "falcon",
            "starcoder",
            "smollm",
            "gpt-2",
            "qwen2",
            "qwen35",
            "poro-chat",
            "gemma4",
            "tekken",
            "gpt-4o",
            "seed-coder",
            "bailingmoe",
            "laguna",
            "ufakzeka",
            "minicpm5",
            "kormo",
            "viking",
            "glm4",
            "mellum2",
        ];
        let text = "Hello, y'all! 3333 ﬁ Ünïcödé 😁 ?我想在apple工作\n\n  \t x";
        let cpts: Vec<u32> = text.chars().map(|c| c as u32).collect();
        for name in names {
            let (exprs, _) = pre_tokenizer(name).unwrap_or_else(|| panic!("{name} unknown"));
            let splitters: Vec<Splitter> = exprs
                .iter()
                .map(|e| splitter_for(e).unwrap_or_else(|err| panic!("{name}: {err}")))
                .collect();
            let lens = crate::unicode::regex_split(&cpts, &splitters);
            assert_eq!(lens.iter().sum::<usize>(), cpts.len(), "{name}");
            assert!(lens.iter().all(|&n| n > 0), "{name}");
        }
        assert!(pre_tokenizer("martian").is_none());
    }

    /// llama.cpp's hand-written Qwen2 / Qwen3.5 splitters agree with their regexes.
    #[test]
    fn custom_splitters_match_their_regexes() {
        let text = "Hello, y'all! I'M 1234 ne\u{301}e\u{301} ̀x  \t\n\n  ﬁ Ünïcödé 😁 ?我想在apple工作 :-) \r\n end  ";
        let cpts: Vec<u32> = text.chars().map(|c| c as u32).collect();
        for (expr, marks) in [(QWEN2, false), (QWEN35, true)] {
            let custom = Splitter::Llama3 {
                max_digits: 1,
                marks,
            };
            let regex = Splitter::regex(expr).unwrap();
            assert_eq!(
                crate::unicode::regex_split(&cpts, &[custom]),
                crate::unicode::regex_split(&cpts, &[regex]),
                "{expr}"
            );
        }
    }
}
