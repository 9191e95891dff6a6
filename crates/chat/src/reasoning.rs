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
    let body = if let Some(rest) = trimmed.strip_prefix(THINK_START) {
        rest
    } else if forced_open {
        text
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
        assert_eq!(
            split_reasoning("<think>x</think>y", ReasoningFormat::None, false, true),
            ("", "<think>x</think>y")
        );
    }
}
