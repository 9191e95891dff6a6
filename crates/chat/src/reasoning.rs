//! `<think>…</think>` reasoning split out of an answer (llama-server's
//! `--reasoning-format`).

/// llama-server's `--reasoning-format`: `none` leaves reasoning in the content;
/// `deepseek` (and `auto`, the default) moves it to `reasoning_content`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReasoningFormat {
    None,
    Deepseek,
    #[default]
    Auto,
}

impl ReasoningFormat {
    pub fn parse(s: &str) -> Option<ReasoningFormat> {
        match s {
            "none" => Some(ReasoningFormat::None),
            "deepseek" => Some(ReasoningFormat::Deepseek),
            "auto" => Some(ReasoningFormat::Auto),
            _ => None,
        }
    }

    pub fn extracts(self) -> bool {
        self != ReasoningFormat::None
    }
}

/// llama-server's `--reasoning on|off|auto` (`-rea`): whether the template is asked to
/// think (`enable_thinking`). `auto` leaves it to the template.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reasoning {
    On,
    Off,
    #[default]
    Auto,
}

impl Reasoning {
    /// llama.cpp's truthy / falsy / auto spellings.
    pub fn parse(s: &str) -> Option<Reasoning> {
        match s.to_ascii_lowercase().as_str() {
            "on" | "enabled" | "true" | "1" => Some(Reasoning::On),
            "off" | "disabled" | "false" | "0" => Some(Reasoning::Off),
            "auto" | "-1" => Some(Reasoning::Auto),
            _ => None,
        }
    }

    /// The template's `enable_thinking`.
    pub fn enable_thinking(self) -> bool {
        self != Reasoning::Off
    }
}

/// The reasoning markers a template writes, found in its source: `<think>` /
/// `</think>` (DeepSeek R1, QwQ, Qwen 3) or Command R7B's thinking tokens.
pub fn template_reasoning_markers(source: &str) -> Option<(&'static str, &'static str)> {
    if source.contains("<|START_THINKING|>") {
        Some(("<|START_THINKING|>", "<|END_THINKING|>"))
    } else if source.contains(THINK_START) {
        Some((THINK_START, THINK_END))
    } else {
        None
    }
}

/// The prompt with thinking turned off (`--reasoning off`), as llama.cpp renders it: a
/// generation prompt that opens a reasoning block gets it closed at once, and Command
/// R7B, whose prompt leaves the block to the model, gets an empty one. A template that
/// closed the block itself (Qwen 3 with `enable_thinking: false`) is left alone.
pub fn close_thinking(prompt: &mut String, source: &str) {
    let Some((start, end)) = template_reasoning_markers(source) else {
        return;
    };
    let tail = prompt.trim_end();
    if tail.ends_with(end) {
        return;
    }
    if tail.ends_with(start) {
        prompt.push_str(end);
    } else if start == "<|START_THINKING|>" && tail.ends_with("<|CHATBOT_TOKEN|>") {
        prompt.push_str(start);
        prompt.push_str(end);
    }
}

pub const THINK_START: &str = "<think>";
pub const THINK_END: &str = "</think>";

/// The longest suffix of `text` that is a proper prefix of `marker`: text that may
/// turn out to be the start of `marker` once more arrives, held back while streaming.
pub fn partial_marker_len(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

/// Splits `text` into (reasoning, rest). Reasoning is a leading `<think>…</think>`
/// block (leading whitespace allowed), or everything up to `</think>` when the prompt
/// already opened the block (`forced_open`). Unfinished (`!is_final`) text holds back
/// what could still become a marker; an unclosed block is all reasoning.
pub fn split_reasoning(
    text: &str,
    format: ReasoningFormat,
    forced_open: bool,
    is_final: bool,
) -> (&str, &str) {
    if !format.extracts() {
        return ("", text);
    }
    let trimmed = text.trim_start();
    if forced_open && !trimmed.starts_with(THINK_START) {
        // The prompt opened the block (and wrote the start tag's line break): as llama.cpp's
        // parser, the reasoning is the text up to the end tag as generated, whitespace kept,
        // unless it is only whitespace.
        let (thought, rest) = match text.find(THINK_END) {
            Some(end) => (&text[..end], text[end + THINK_END.len()..].trim_start()),
            None if is_final => (text, ""),
            None => (
                &text[..text.len() - partial_marker_len(text, THINK_END)],
                "",
            ),
        };
        let thought = if thought.trim().is_empty() {
            ""
        } else {
            thought
        };
        return (thought, rest);
    }
    let body = if let Some(rest) = trimmed.strip_prefix(THINK_START) {
        rest
    } else {
        if !is_final && THINK_START.starts_with(trimmed) && !trimmed.is_empty() {
            // Could still become "<think>".
            return ("", "");
        }
        return ("", text);
    };
    match body.find(THINK_END) {
        Some(end) => (
            body[..end].trim(),
            body[end + THINK_END.len()..].trim_start(),
        ),
        None if is_final => (body.trim(), ""),
        None => {
            let hold = partial_marker_len(body, THINK_END);
            (body[..body.len() - hold].trim_start(), "")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinking_off_closes_the_block() {
        let r1 = "{{'<｜Assistant｜><think>\\n'}}";
        let mut p = "<｜Assistant｜><think>\n".to_string();
        close_thinking(&mut p, r1);
        assert_eq!(p, "<｜Assistant｜><think>\n</think>");
        let mut p = "<|im_start|>assistant\n<think>\n\n</think>\n\n".to_string();
        close_thinking(&mut p, "<think>");
        assert_eq!(p, "<|im_start|>assistant\n<think>\n\n</think>\n\n");
        let r7b = "<|START_THINKING|>";
        let mut p = "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>".to_string();
        close_thinking(&mut p, r7b);
        assert_eq!(
            p,
            "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>"
        );
        let mut p = "<|im_start|>assistant\n".to_string();
        close_thinking(&mut p, "no markers");
        assert_eq!(p, "<|im_start|>assistant\n");
        assert_eq!(Reasoning::parse("OFF"), Some(Reasoning::Off));
        assert_eq!(Reasoning::parse("maybe"), None);
    }

    #[test]
    fn splits_think_blocks() {
        let r = ReasoningFormat::Auto;
        assert_eq!(
            split_reasoning("<think>\nhmm\n</think>\n\nHi", r, false, true),
            ("hmm", "Hi")
        );
        assert_eq!(
            split_reasoning("<think>hm</thi", r, false, false),
            ("hm", "")
        );
        assert_eq!(split_reasoning("<thi", r, false, false), ("", ""));
        assert_eq!(split_reasoning("Hello", r, false, false), ("", "Hello"));
        assert_eq!(split_reasoning("a</think>b", r, true, true), ("a", "b"));
        // Opened by the prompt: whitespace kept, as llama.cpp's parser keeps it.
        assert_eq!(
            split_reasoning("\n\nhmm.</think>\n\nHi", r, true, true),
            ("\n\nhmm.", "Hi")
        );
        assert_eq!(
            split_reasoning("\n \n</think>Hi", r, true, true),
            ("", "Hi")
        );
        assert_eq!(
            split_reasoning("\n\nhm</thi", r, true, false),
            ("\n\nhm", "")
        );
        assert_eq!(
            split_reasoning("<think>x</think>y", ReasoningFormat::None, false, true),
            ("", "<think>x</think>y")
        );
    }
}
