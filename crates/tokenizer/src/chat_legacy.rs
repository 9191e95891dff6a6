//! llama.cpp's legacy (non-Jinja) chat templates: `src/llama-chat.cpp` at llama.cpp 0c1e570.
//!
//! This is what llama-server uses with `--no-jinja`: a fixed set of hand-written formats,
//! picked either by a built-in name (`--chat-template chatml`) or by recognising marker strings
//! in the model's Jinja source. The source is never executed. Every format is ported branch for
//! branch, whitespace included; where llama.cpp's output looks odd (Orion never adds a
//! generation prompt, RWKV adds one only after a trailing user message, …) the oddity is kept.
//!
//! llama.cpp passes roles, contents and the template as C strings, so each of them ends at its
//! first NUL byte; [`LegacyTemplate::apply`] and [`LegacyTemplate::resolve`] do the same.

/// Why a legacy template could not be applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LegacyTemplateError {
    /// `llama_chat_apply_template` returned -1: neither a built-in name nor a recognised source.
    #[error("this custom template is not supported, try using --jinja")]
    Unsupported,
    /// llama.cpp reports the prompt length as an `int32_t`, so it cannot return a longer one.
    #[error("the formatted chat is {0} bytes, more than llama.cpp can return (i32::MAX)")]
    TooLong(usize),
}

/// One of llama.cpp's built-in chat formats (`llm_chat_template`), in llama.cpp's enum order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LegacyTemplate {
    ChatMl,
    Llama2,
    Llama2Sys,
    Llama2SysBos,
    Llama2SysStrip,
    MistralV1,
    MistralV3,
    MistralV3Tekken,
    MistralV7,
    MistralV7Tekken,
    Phi3,
    Phi4,
    Falcon3,
    Zephyr,
    Monarch,
    Gemma,
    Orion,
    OpenChat,
    Vicuna,
    VicunaOrca,
    DeepSeek,
    DeepSeek2,
    DeepSeek3,
    DeepSeekOcr,
    CommandR,
    Llama3,
    ChatGlm3,
    ChatGlm4,
    GlmEdge,
    MiniCpm,
    Exaone3,
    Exaone4,
    ExaoneMoe,
    RwkvWorld,
    Granite3x,
    Granite40,
    Granite41,
    GigaChat,
    Megrez,
    Yandex,
    Bailing,
    BailingThink,
    Bailing2,
    Llama4,
    SmolVlm,
    /// dots.llm1: llama.cpp gives it no built-in name; it is only reached by detection.
    Dots1,
    HunyuanMoe,
    /// gpt-oss (Harmony).
    OpenAiMoe,
    HunyuanDense,
    HunyuanVl,
    KimiK2,
    SeedOss,
    Grok2,
    PanguEmbed,
    SolarOpen,
}

use LegacyTemplate as T;

/// Every template, in `llm_chat_template` order.
const ALL: [LegacyTemplate; 55] = [
    T::ChatMl,
    T::Llama2,
    T::Llama2Sys,
    T::Llama2SysBos,
    T::Llama2SysStrip,
    T::MistralV1,
    T::MistralV3,
    T::MistralV3Tekken,
    T::MistralV7,
    T::MistralV7Tekken,
    T::Phi3,
    T::Phi4,
    T::Falcon3,
    T::Zephyr,
    T::Monarch,
    T::Gemma,
    T::Orion,
    T::OpenChat,
    T::Vicuna,
    T::VicunaOrca,
    T::DeepSeek,
    T::DeepSeek2,
    T::DeepSeek3,
    T::DeepSeekOcr,
    T::CommandR,
    T::Llama3,
    T::ChatGlm3,
    T::ChatGlm4,
    T::GlmEdge,
    T::MiniCpm,
    T::Exaone3,
    T::Exaone4,
    T::ExaoneMoe,
    T::RwkvWorld,
    T::Granite3x,
    T::Granite40,
    T::Granite41,
    T::GigaChat,
    T::Megrez,
    T::Yandex,
    T::Bailing,
    T::BailingThink,
    T::Bailing2,
    T::Llama4,
    T::SmolVlm,
    T::Dots1,
    T::HunyuanMoe,
    T::OpenAiMoe,
    T::HunyuanDense,
    T::HunyuanVl,
    T::KimiK2,
    T::SeedOss,
    T::Grok2,
    T::PanguEmbed,
    T::SolarOpen,
];

/// `LLM_CHAT_TEMPLATES`, in the order `llama_chat_builtin_templates` lists it: a `std::map`
/// iterates its keys in byte order, so this is sorted, not the source's order.
const BUILTIN: [(&str, LegacyTemplate); 54] = [
    ("bailing", T::Bailing),
    ("bailing-think", T::BailingThink),
    ("bailing2", T::Bailing2),
    ("chatglm3", T::ChatGlm3),
    ("chatglm4", T::ChatGlm4),
    ("chatml", T::ChatMl),
    ("command-r", T::CommandR),
    ("deepseek", T::DeepSeek),
    ("deepseek-ocr", T::DeepSeekOcr),
    ("deepseek2", T::DeepSeek2),
    ("deepseek3", T::DeepSeek3),
    ("exaone-moe", T::ExaoneMoe),
    ("exaone3", T::Exaone3),
    ("exaone4", T::Exaone4),
    ("falcon3", T::Falcon3),
    ("gemma", T::Gemma),
    ("gigachat", T::GigaChat),
    ("glmedge", T::GlmEdge),
    ("gpt-oss", T::OpenAiMoe),
    ("granite", T::Granite3x),
    ("granite-4.0", T::Granite40),
    ("granite-4.1", T::Granite41),
    ("grok-2", T::Grok2),
    ("hunyuan-dense", T::HunyuanDense),
    ("hunyuan-moe", T::HunyuanMoe),
    ("hunyuan-vl", T::HunyuanVl),
    ("kimi-k2", T::KimiK2),
    ("llama2", T::Llama2),
    ("llama2-sys", T::Llama2Sys),
    ("llama2-sys-bos", T::Llama2SysBos),
    ("llama2-sys-strip", T::Llama2SysStrip),
    ("llama3", T::Llama3),
    ("llama4", T::Llama4),
    ("megrez", T::Megrez),
    ("minicpm", T::MiniCpm),
    ("mistral-v1", T::MistralV1),
    ("mistral-v3", T::MistralV3),
    ("mistral-v3-tekken", T::MistralV3Tekken),
    ("mistral-v7", T::MistralV7),
    ("mistral-v7-tekken", T::MistralV7Tekken),
    ("monarch", T::Monarch),
    ("openchat", T::OpenChat),
    ("orion", T::Orion),
    ("pangu-embedded", T::PanguEmbed),
    ("phi3", T::Phi3),
    ("phi4", T::Phi4),
    ("rwkv-world", T::RwkvWorld),
    ("seed_oss", T::SeedOss),
    ("smolvlm", T::SmolVlm),
    ("solar-open", T::SolarOpen),
    ("vicuna", T::Vicuna),
    ("vicuna-orca", T::VicunaOrca),
    ("yandex", T::Yandex),
    ("zephyr", T::Zephyr),
];

/// The longest prompt llama.cpp can report (its length is returned as `int32_t`).
const MAX_OUTPUT: usize = i32::MAX as usize;

impl LegacyTemplate {
    /// `llm_chat_template_from_str`: the built-in names (`LLM_CHAT_TEMPLATES`), matched exactly.
    pub fn from_name(name: &str) -> Option<LegacyTemplate> {
        BUILTIN.iter().find(|(n, _)| *n == name).map(|&(_, t)| t)
    }

    /// The built-in name. [`LegacyTemplate::Dots1`] has none in llama.cpp; it reports "dots1",
    /// which [`LegacyTemplate::from_name`] rejects as llama.cpp does.
    pub fn name(self) -> &'static str {
        // Dots1 is the one template missing from BUILTIN.
        BUILTIN
            .iter()
            .find(|(_, t)| *t == self)
            .map_or("dots1", |(n, _)| n)
    }

    /// Every built-in name, in llama.cpp's order (`llama_chat_builtin_templates`, the list
    /// `--help` prints): byte order, since llama.cpp keeps them in a `std::map`.
    pub fn names() -> impl Iterator<Item = &'static str> {
        BUILTIN.iter().map(|(n, _)| *n)
    }

    /// Every template, in llama.cpp's `llm_chat_template` order (Dots1 included).
    pub fn all() -> impl Iterator<Item = LegacyTemplate> {
        ALL.into_iter()
    }

    /// The marker half of `llm_chat_detect_template`: recognise a Jinja template source by the
    /// strings it contains. The order of the checks matters and is llama.cpp's.
    pub fn detect(source: &str) -> Option<LegacyTemplate> {
        let has = |needle: &str| source.contains(needle);
        let t = if has("<|im_start|>") {
            if has("<|im_sep|>") {
                T::Phi4
            } else if has("<end_of_utterance>") {
                // SmolVLM uses <|im_start|> as BOS, but it is not ChatML.
                T::SmolVlm
            } else {
                T::ChatMl
            }
        } else if source.starts_with("mistral") || has("[INST]") {
            if has("[SYSTEM_PROMPT]") {
                T::MistralV7
            } else if has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]") {
                // Mistral's official v1, v3 and v3-tekken templates.
                if has(" [INST]") {
                    T::MistralV1
                } else if has("\"[INST]\"") {
                    T::MistralV3Tekken
                } else {
                    T::MistralV3
                }
            } else if has("content.strip()") {
                T::Llama2SysStrip
            } else if has("bos_token + '[INST]") {
                T::Llama2SysBos
            } else if has("<<SYS>>") {
                T::Llama2Sys
            } else {
                T::Llama2
            }
        } else if has("<|assistant|>") && has("<|end|>") {
            T::Phi3
        } else if has("[gMASK]<sop>") {
            T::ChatGlm4
        } else if has("<|assistant|>") && has("<|user|>") {
            if has("<|tool_declare|>") {
                T::ExaoneMoe
            } else if has("</s>") {
                T::Falcon3
            } else {
                T::GlmEdge
            }
        } else if has("<|{{ item['role'] }}|>") && has("<|begin_of_image|>") {
            T::GlmEdge
        } else if has("<|user|>") && has("<|endoftext|>") {
            T::Zephyr
        } else if has("bos_token + message['role']") {
            T::Monarch
        } else if has("<start_of_turn>") {
            T::Gemma
        } else if has("'\\n\\nAssistant: ' + eos_token") {
            T::Orion
        } else if has("GPT4 Correct ") {
            T::OpenChat
        } else if has("USER: ") && has("ASSISTANT: ") {
            if has("SYSTEM: ") {
                T::VicunaOrca
            } else {
                T::Vicuna
            }
        } else if has("### Instruction:") && has("<|EOT|>") {
            T::DeepSeek
        } else if has("<|START_OF_TURN_TOKEN|>") && has("<|USER_TOKEN|>") {
            T::CommandR
        } else if has("<|start_header_id|>") && has("<|end_header_id|>") {
            T::Llama3
        } else if has("[gMASK]sop") {
            T::ChatGlm3
        } else if has("<用户>") {
            T::MiniCpm
        } else if has("'Assistant: ' + message['content'] + eos_token") {
            T::DeepSeek2
        } else if has("<｜Assistant｜>") && has("<｜User｜>") && has("<｜end▁of▁sentence｜>")
        {
            T::DeepSeek3
        } else if has("[|system|]") && has("[|assistant|]") && has("[|endofturn|]") {
            if has("[|tool|]") {
                T::Exaone4
            } else {
                T::Exaone3
            }
        } else if has("rwkv-world") || has("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}")
        {
            T::RwkvWorld
        } else if has("<|start_of_role|>") {
            if has("<tool_call>") || has("<tools>") {
                if has("g4_default_system_message") {
                    T::Granite40
                } else {
                    T::Granite41
                }
            } else {
                T::Granite3x
            }
        } else if has(
            "message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]",
        ) {
            T::GigaChat
        } else if has("<|role_start|>") {
            T::Megrez
        } else if has(" Ассистент:") {
            T::Yandex
        } else if has("<role>ASSISTANT</role>") && has("'HUMAN'") {
            T::Bailing
        } else if has("<role>ASSISTANT</role>") && has("\"HUMAN\"") && has("<think>") {
            T::BailingThink
        } else if has("<role>ASSISTANT</role>") && has("<role>HUMAN</role>") && has("<|role_end|>")
        {
            T::Bailing2
        } else if has("<|header_start|>") && has("<|header_end|>") {
            T::Llama4
        } else if has("<|endofuserprompt|>") {
            T::Dots1
        } else if has("<|extra_0|>") && has("<|extra_4|>") {
            T::HunyuanMoe
        } else if has("<|start|>") && has("<|channel|>") {
            T::OpenAiMoe
        } else if has("<｜hy_Assistant｜>") && has("<｜hy_begin▁of▁sentence｜>") {
            T::HunyuanVl
        } else if has("<｜hy_Assistant｜>") && has("<｜hy_place▁holder▁no▁3｜>") {
            T::HunyuanDense
        } else if has("<|im_assistant|>assistant<|im_middle|>") {
            T::KimiK2
        } else if has("<seed:bos>") {
            T::SeedOss
        } else if has("'Assistant: '  + message['content'] + '<|separator|>") {
            T::Grok2
        } else if has("[unused9]系统：[unused10]") {
            T::PanguEmbed
        } else if has("<|begin|>") && has("<|end|>") && has("<|content|>") {
            T::SolarOpen
        } else {
            return None;
        };
        Some(t)
    }

    /// `llama_chat_apply_template`'s resolution (`llm_chat_detect_template`): a built-in name,
    /// else detection of the source. The input ends at its first NUL, as llama.cpp's C string
    /// does. llama.cpp uses "chatml" when it is given no template at all.
    pub fn resolve(name_or_source: &str) -> Option<LegacyTemplate> {
        let s = c_str(name_or_source);
        LegacyTemplate::from_name(s).or_else(|| LegacyTemplate::detect(s))
    }

    /// `llm_chat_apply_template`: the prompt for `(role, content)` messages, with the opening of
    /// an assistant turn when `add_assistant` is set (ignored by the formats that ignore it in
    /// llama.cpp). Roles and contents end at their first NUL, as llama.cpp's C strings do.
    pub fn apply(
        self,
        messages: &[(&str, &str)],
        add_assistant: bool,
    ) -> Result<String, LegacyTemplateError> {
        let chat: Vec<(&str, &str)> = messages
            .iter()
            .map(|&(role, content)| (c_str(role), c_str(content)))
            .collect();
        let out = render(self, &chat, add_assistant);
        if out.len() > MAX_OUTPUT {
            return Err(LegacyTemplateError::TooLong(out.len()));
        }
        Ok(out)
    }
}

/// `llama_chat_apply_template`: resolve `name_or_source` (see [`LegacyTemplate::resolve`]) and
/// apply it; a template llama.cpp does not support is [`LegacyTemplateError::Unsupported`].
pub fn apply_template(
    name_or_source: &str,
    messages: &[(&str, &str)],
    add_assistant: bool,
) -> Result<String, LegacyTemplateError> {
    LegacyTemplate::resolve(name_or_source)
        .ok_or(LegacyTemplateError::Unsupported)?
        .apply(messages, add_assistant)
}

/// The part of `s` a C string would see: everything before the first NUL.
fn c_str(s: &str) -> &str {
    s.split('\0').next().unwrap_or_default()
}

/// llama-chat.cpp's `trim`: C `isspace` in the "C" locale, which includes \v and \f.
fn trim(s: &str) -> &str {
    s.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r'))
}

/// Bailing's role: "user" becomes "HUMAN", anything else is upper-cased byte by byte
/// (`::toupper` in the "C" locale touches ASCII only).
fn bailing_role(role: &str) -> String {
    if role == "user" {
        "HUMAN".to_owned()
    } else {
        role.to_ascii_uppercase()
    }
}

fn cat(out: &mut String, parts: &[&str]) {
    for p in parts {
        out.push_str(p);
    }
}

/// The body of `llm_chat_apply_template`, one branch per format.
fn render(tmpl: LegacyTemplate, chat: &[(&str, &str)], add_ass: bool) -> String {
    let mut ss = String::new();
    let out = &mut ss;
    match tmpl {
        T::ChatMl => {
            for &(role, content) in chat {
                cat(out, &["<|im_start|>", role, "\n", content, "<|im_end|>\n"]);
            }
            if add_ass {
                out.push_str("<|im_start|>assistant\n");
            }
        }
        T::MistralV7 | T::MistralV7Tekken => {
            let sp = if tmpl == T::MistralV7 { " " } else { "" };
            for &(role, content) in chat {
                match role {
                    "system" => cat(out, &["[SYSTEM_PROMPT]", sp, content, "[/SYSTEM_PROMPT]"]),
                    "user" => cat(out, &["[INST]", sp, content, "[/INST]"]),
                    _ => cat(out, &[sp, content, "</s>"]),
                }
            }
        }
        T::MistralV1 | T::MistralV3 | T::MistralV3Tekken => {
            let leading = if tmpl == T::MistralV1 { " " } else { "" };
            let trailing = if tmpl == T::MistralV3Tekken { "" } else { " " };
            let trim_assistant = tmpl == T::MistralV3;
            let mut inside_turn = false;
            for &(role, content) in chat {
                if !inside_turn {
                    cat(out, &[leading, "[INST]", trailing]);
                    inside_turn = true;
                }
                match role {
                    "system" => cat(out, &[content, "\n\n"]),
                    "user" => cat(out, &[content, leading, "[/INST]"]),
                    _ => {
                        let content = if trim_assistant {
                            trim(content)
                        } else {
                            content
                        };
                        cat(out, &[trailing, content, "</s>"]);
                        inside_turn = false;
                    }
                }
            }
        }
        T::Llama2 | T::Llama2Sys | T::Llama2SysBos | T::Llama2SysStrip => {
            let support_system = tmpl != T::Llama2;
            let bos_inside_history = tmpl == T::Llama2SysBos;
            let strip = tmpl == T::Llama2SysStrip;
            // The first turn is opened up front, without a BOS.
            let mut inside_turn = true;
            out.push_str("[INST] ");
            for &(role, content) in chat {
                let content = if strip { trim(content) } else { content };
                if !inside_turn {
                    inside_turn = true;
                    out.push_str(if bos_inside_history {
                        "<s>[INST] "
                    } else {
                        "[INST] "
                    });
                }
                match role {
                    "system" if support_system => {
                        cat(out, &["<<SYS>>\n", content, "\n<</SYS>>\n\n"]);
                    }
                    // Without system support the system text still leads the first message.
                    "system" => cat(out, &[content, "\n"]),
                    "user" => cat(out, &[content, " [/INST]"]),
                    _ => {
                        cat(out, &[content, "</s>"]);
                        inside_turn = false;
                    }
                }
            }
        }
        T::Phi3 => {
            for &(role, content) in chat {
                cat(out, &["<|", role, "|>\n", content, "<|end|>\n"]);
            }
            if add_ass {
                out.push_str("<|assistant|>\n");
            }
        }
        T::Phi4 => {
            for &(role, content) in chat {
                cat(
                    out,
                    &["<|im_start|>", role, "<|im_sep|>", content, "<|im_end|>"],
                );
            }
            if add_ass {
                out.push_str("<|im_start|>assistant<|im_sep|>");
            }
        }
        T::Falcon3 => {
            for &(role, content) in chat {
                cat(out, &["<|", role, "|>\n", content, "\n"]);
            }
            if add_ass {
                out.push_str("<|assistant|>\n");
            }
        }
        T::Zephyr => {
            for &(role, content) in chat {
                cat(out, &["<|", role, "|>\n", content, "<|endoftext|>\n"]);
            }
            if add_ass {
                out.push_str("<|assistant|>\n");
            }
        }
        T::Monarch => {
            // The BOS is part of the history, except before the first message.
            for (i, &(role, content)) in chat.iter().enumerate() {
                let bos = if i == 0 { "" } else { "<s>" };
                cat(out, &[bos, role, "\n", content, "</s>\n"]);
            }
            if add_ass {
                out.push_str("<s>assistant\n");
            }
        }
        T::Gemma => {
            // Gemma has no system role: system text is merged into the next non-model turn.
            let mut system_prompt = String::new();
            for &(role, content) in chat {
                if role == "system" {
                    system_prompt.push_str(trim(content));
                    continue;
                }
                let role = if role == "assistant" { "model" } else { role };
                cat(out, &["<start_of_turn>", role, "\n"]);
                if !system_prompt.is_empty() && role != "model" {
                    cat(out, &[&system_prompt, "\n\n"]);
                    system_prompt.clear();
                }
                cat(out, &[trim(content), "<end_of_turn>\n"]);
            }
            if add_ass {
                out.push_str("<start_of_turn>model\n");
            }
        }
        T::Orion => {
            // No system role either: system text is merged into the next user turn.
            let mut system_prompt = String::new();
            for &(role, content) in chat {
                match role {
                    "system" => system_prompt.push_str(content),
                    "user" => {
                        out.push_str("Human: ");
                        if !system_prompt.is_empty() {
                            cat(out, &[&system_prompt, "\n\n"]);
                            system_prompt.clear();
                        }
                        cat(out, &[content, "\n\nAssistant: </s>"]);
                    }
                    _ => cat(out, &[content, "</s>"]),
                }
            }
        }
        T::OpenChat => {
            for &(role, content) in chat {
                if role == "system" {
                    cat(out, &[content, "<|end_of_turn|>"]);
                } else {
                    // `role[0] = toupper(role[0])`: the first byte, ASCII only.
                    let mut role = role.to_owned();
                    if let Some(first) = role.get_mut(0..1) {
                        first.make_ascii_uppercase();
                    }
                    cat(
                        out,
                        &["GPT4 Correct ", &role, ": ", content, "<|end_of_turn|>"],
                    );
                }
            }
            if add_ass {
                out.push_str("GPT4 Correct Assistant:");
            }
        }
        T::Vicuna | T::VicunaOrca => {
            for &(role, content) in chat {
                match role {
                    "system" if tmpl == T::VicunaOrca => cat(out, &["SYSTEM: ", content, "\n"]),
                    "system" => cat(out, &[content, "\n\n"]),
                    "user" => cat(out, &["USER: ", content, "\n"]),
                    "assistant" => cat(out, &["ASSISTANT: ", content, "</s>\n"]),
                    _ => {}
                }
            }
            if add_ass {
                out.push_str("ASSISTANT:");
            }
        }
        T::DeepSeek => {
            for &(role, content) in chat {
                match role {
                    "system" => out.push_str(content),
                    "user" => cat(out, &["### Instruction:\n", content, "\n"]),
                    "assistant" => cat(out, &["### Response:\n", content, "\n<|EOT|>\n"]),
                    _ => {}
                }
            }
            if add_ass {
                out.push_str("### Response:\n");
            }
        }
        T::CommandR => {
            for &(role, content) in chat {
                let head = match role {
                    "system" => "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>",
                    "user" => "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>",
                    "assistant" => "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
                    _ => continue,
                };
                cat(out, &[head, trim(content), "<|END_OF_TURN_TOKEN|>"]);
            }
            if add_ass {
                out.push_str("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
            }
        }
        T::Llama3 => {
            for &(role, content) in chat {
                cat(
                    out,
                    &[
                        "<|start_header_id|>",
                        role,
                        "<|end_header_id|>\n\n",
                        trim(content),
                        "<|eot_id|>",
                    ],
                );
            }
            if add_ass {
                out.push_str("<|start_header_id|>assistant<|end_header_id|>\n\n");
            }
        }
        T::ChatGlm3 => {
            out.push_str("[gMASK]sop");
            for &(role, content) in chat {
                cat(out, &["<|", role, "|>\n ", content]);
            }
            if add_ass {
                out.push_str("<|assistant|>");
            }
        }
        T::ChatGlm4 => {
            out.push_str("[gMASK]<sop>");
            for &(role, content) in chat {
                cat(out, &["<|", role, "|>\n", content]);
            }
            if add_ass {
                out.push_str("<|assistant|>\n");
            }
        }
        T::GlmEdge => {
            for &(role, content) in chat {
                cat(out, &["<|", role, "|>\n", content]);
            }
            if add_ass {
                out.push_str("<|assistant|>");
            }
        }
        T::MiniCpm => {
            for &(role, content) in chat {
                if role == "user" {
                    cat(out, &["<用户>", trim(content), "<AI>"]);
                } else {
                    out.push_str(trim(content));
                }
            }
        }
        T::DeepSeek2 => {
            for &(role, content) in chat {
                match role {
                    "system" => cat(out, &[content, "\n\n"]),
                    "user" => cat(out, &["User: ", content, "\n\n"]),
                    "assistant" => cat(out, &["Assistant: ", content, "<｜end▁of▁sentence｜>"]),
                    _ => {}
                }
            }
            if add_ass {
                out.push_str("Assistant:");
            }
        }
        T::DeepSeek3 => {
            for &(role, content) in chat {
                match role {
                    "system" => cat(out, &[content, "\n\n"]),
                    "user" => cat(out, &["<｜User｜>", content]),
                    "assistant" => cat(out, &["<｜Assistant｜>", content, "<｜end▁of▁sentence｜>"]),
                    _ => {}
                }
            }
            if add_ass {
                out.push_str("<｜Assistant｜>");
            }
        }
        T::DeepSeekOcr => {
            // No template: the contents, back to back.
            for &(_, content) in chat {
                out.push_str(content);
            }
        }
        T::Exaone3 | T::Exaone4 => {
            for &(role, content) in chat {
                let content = trim(content);
                match role {
                    "system" => cat(out, &["[|system|]", content, "[|endofturn|]\n"]),
                    "user" => cat(out, &["[|user|]", content, "\n"]),
                    "assistant" => cat(out, &["[|assistant|]", content, "[|endofturn|]\n"]),
                    // EXAONE 3 has no tool role.
                    "tool" if tmpl == T::Exaone4 => {
                        cat(out, &["[|tool|]", content, "[|endofturn|]\n"]);
                    }
                    _ => {}
                }
            }
            if add_ass {
                out.push_str("[|assistant|]");
            }
        }
        T::ExaoneMoe => {
            for &(role, content) in chat {
                let head = match role {
                    "system" => "<|system|>\n",
                    "user" => "<|user|>\n",
                    "assistant" => "<|assistant|>\n",
                    "tool" => "<|tool|>\n",
                    _ => continue,
                };
                cat(out, &[head, trim(content), "<|endofturn|>\n"]);
            }
            if add_ass {
                out.push_str("<|assistant|>\n");
            }
        }
        T::RwkvWorld => {
            // "\n\n" is the model's end of turn; the assistant prompt follows a final user
            // message whatever `add_ass` says.
            for (i, &(role, content)) in chat.iter().enumerate() {
                match role {
                    "system" => cat(out, &["System: ", trim(content), "\n\n"]),
                    "user" => {
                        cat(out, &["User: ", trim(content), "\n\n"]);
                        if i + 1 == chat.len() {
                            out.push_str("Assistant:");
                        }
                    }
                    "assistant" => cat(out, &["Assistant: ", trim(content), "\n\n"]),
                    _ => {}
                }
            }
        }
        T::Granite3x => {
            for &(role, content) in chat {
                cat(out, &["<|start_of_role|>", role, "<|end_of_role|>"]);
                if role == "assistant_tool_call" {
                    out.push_str("<|tool_call|>");
                }
                cat(out, &[content, "<|end_of_text|>\n"]);
            }
            if add_ass {
                out.push_str("<|start_of_role|>assistant<|end_of_role|>");
            }
        }
        T::Granite40 | T::Granite41 => {
            // Identical in llama.cpp; a tool call is an assistant turn here.
            for &(role, content) in chat {
                if role == "assistant_tool_call" {
                    out.push_str("<|start_of_role|>assistant<|end_of_role|><|tool_call|>");
                } else {
                    cat(out, &["<|start_of_role|>", role, "<|end_of_role|>"]);
                }
                cat(out, &[content, "<|end_of_text|>\n"]);
            }
            if add_ass {
                out.push_str("<|start_of_role|>assistant<|end_of_role|>");
            }
        }
        T::GigaChat => {
            let system = chat.first().filter(|(role, _)| *role == "system");
            match system {
                Some(&(_, content)) => cat(out, &["<s>", content, "<|message_sep|>"]),
                None => out.push_str("<s>"),
            }
            for &(role, content) in chat.iter().skip(usize::from(system.is_some())) {
                match role {
                    "user" => cat(
                        out,
                        &[
                            "user<|role_sep|>",
                            content,
                            "<|message_sep|>",
                            "available functions<|role_sep|>[]<|message_sep|>",
                        ],
                    ),
                    "assistant" => cat(out, &["assistant<|role_sep|>", content, "<|message_sep|>"]),
                    _ => {}
                }
            }
            if add_ass {
                out.push_str("assistant<|role_sep|>");
            }
        }
        T::Megrez => {
            for &(role, content) in chat {
                cat(
                    out,
                    &[
                        "<|role_start|>",
                        role,
                        "<|role_end|>",
                        content,
                        "<|turn_end|>",
                    ],
                );
            }
            if add_ass {
                out.push_str("<|role_start|>assistant<|role_end|>");
            }
        }
        T::Yandex => {
            // "\n\n" is the model's end of turn; system messages are dropped.
            for &(role, content) in chat {
                match role {
                    "user" => cat(out, &[" Пользователь: ", content, "\n\n"]),
                    "assistant" => cat(out, &[" Ассистент: ", content, "\n\n"]),
                    _ => {}
                }
            }
            if add_ass {
                out.push_str(" Ассистент:[SEP]");
            }
        }
        T::Bailing | T::BailingThink => {
            for &(role, content) in chat {
                cat(out, &["<role>", &bailing_role(role), "</role>", content]);
            }
            if add_ass {
                out.push_str("<role>ASSISTANT</role>");
                if tmpl == T::BailingThink {
                    out.push_str("<think>");
                }
            }
        }
        T::Bailing2 => {
            if chat.first().is_none_or(|(role, _)| *role != "system") {
                out.push_str("<role>SYSTEM</role>detailed thinking off<|role_end|>");
            }
            for &(role, content) in chat {
                cat(
                    out,
                    &[
                        "<role>",
                        &bailing_role(role),
                        "</role>",
                        content,
                        "<|role_end|>",
                    ],
                );
            }
            if add_ass {
                out.push_str("<role>ASSISTANT</role>");
            }
        }
        T::Llama4 => {
            for &(role, content) in chat {
                cat(
                    out,
                    &[
                        "<|header_start|>",
                        role,
                        "<|header_end|>\n\n",
                        trim(content),
                        "<|eot|>",
                    ],
                );
            }
            if add_ass {
                out.push_str("<|header_start|>assistant<|header_end|>\n\n");
            }
        }
        T::SmolVlm => {
            // <|im_start|> is SmolVLM's BOS; the turns themselves are not ChatML.
            out.push_str("<|im_start|>");
            for &(role, content) in chat {
                match role {
                    "system" => cat(out, &[content, "\n\n"]),
                    "user" => cat(out, &["User: ", content, "<end_of_utterance>\n"]),
                    _ => cat(out, &["Assistant: ", content, "<end_of_utterance>\n"]),
                }
            }
            if add_ass {
                out.push_str("Assistant:");
            }
        }
        T::Dots1 => {
            for &(role, content) in chat {
                match role {
                    "system" => cat(out, &["<|system|>", content, "<|endofsystem|>"]),
                    "user" => cat(out, &["<|userprompt|>", content, "<|endofuserprompt|>"]),
                    _ => cat(out, &["<|response|>", content, "<|endofresponse|>"]),
                }
            }
            if add_ass {
                out.push_str("<|response|>");
            }
        }
        T::HunyuanMoe => {
            for &(role, content) in chat {
                match role {
                    "system" => cat(out, &["<|startoftext|>", content, "<|extra_4|>"]),
                    "assistant" => cat(out, &[content, "<|eos|>"]),
                    _ => cat(out, &["<|startoftext|>", content, "<|extra_0|>"]),
                }
            }
        }
        T::OpenAiMoe => {
            for &(role, content) in chat {
                let end = if role == "assistant" {
                    "<|return|>"
                } else {
                    "<|end|>"
                };
                cat(out, &["<|start|>", role, "<|message|>", content, end]);
            }
            if add_ass {
                out.push_str("<|start|>assistant");
            }
        }
        T::HunyuanDense => {
            for (i, &(role, content)) in chat.iter().enumerate() {
                if i == 0 && role == "system" {
                    cat(out, &[content, "<｜hy_place▁holder▁no▁3｜>"]);
                }
                match role {
                    "assistant" => cat(
                        out,
                        &["<｜hy_Assistant｜>", content, "<｜hy_place▁holder▁no▁2｜>"],
                    ),
                    "user" => cat(out, &["<｜hy_User｜>", content, "<｜hy_Assistant｜>"]),
                    _ => {}
                }
            }
        }
        T::HunyuanVl => {
            out.push_str("<｜hy_begin▁of▁sentence｜>");
            for (i, &(role, content)) in chat.iter().enumerate() {
                match role {
                    "system" if i == 0 => cat(out, &[content, "<｜hy_place▁holder▁no▁3｜>"]),
                    "user" => cat(out, &[content, "<｜hy_User｜>"]),
                    "assistant" => cat(out, &[content, "<｜hy_Assistant｜>"]),
                    _ => {}
                }
            }
        }
        T::KimiK2 => {
            // An unknown role gets no header but still its content and end marker.
            for &(role, content) in chat {
                out.push_str(match role {
                    "system" => "<|im_system|>system<|im_middle|>",
                    "user" => "<|im_user|>user<|im_middle|>",
                    "assistant" => "<|im_assistant|>assistant<|im_middle|>",
                    "tool" => "<|im_system|>tool<|im_middle|>",
                    _ => "",
                });
                cat(out, &[content, "<|im_end|>"]);
            }
            if add_ass {
                out.push_str("<|im_assistant|>assistant<|im_middle|>");
            }
        }
        T::SeedOss => {
            for &(role, content) in chat {
                let content = if role == "assistant" {
                    trim(content)
                } else {
                    content
                };
                cat(out, &["<seed:bos>", role, "\n", content, "<seed:eos>"]);
            }
            if add_ass {
                out.push_str("<seed:bos>assistant\n");
            }
        }
        T::Grok2 => {
            for &(role, content) in chat {
                match role {
                    "system" => cat(out, &["System: ", trim(content), "<|separator|>\n\n"]),
                    "user" => cat(out, &["Human: ", trim(content), "<|separator|>\n\n"]),
                    // Assistant content is not trimmed in llama.cpp.
                    "assistant" => cat(out, &["Assistant: ", content, "<|separator|>\n\n"]),
                    _ => {}
                }
            }
            if add_ass {
                out.push_str("Assistant:");
            }
        }
        T::PanguEmbed => {
            for (i, &(role, content)) in chat.iter().enumerate() {
                // An empty system turn is inserted when the chat does not start with one.
                if i == 0 && role != "system" {
                    out.push_str("[unused9]系统：[unused10]");
                }
                let head = match role {
                    "system" => "[unused9]系统：",
                    "user" => "[unused9]用户：",
                    "assistant" => "[unused9]助手：",
                    "tool" => "[unused9]工具：",
                    "function" => "[unused9]方法：",
                    _ => continue,
                };
                cat(out, &[head, content, "[unused10]"]);
            }
            if add_ass {
                out.push_str("[unused9]助手：");
            }
        }
        T::SolarOpen => {
            for &(role, content) in chat {
                cat(out, &["<|begin|>", role, "<|content|>", content, "<|end|>"]);
            }
            if add_ass {
                out.push_str("<|begin|>assistant");
            }
        }
    }
    ss
}
