//! `lamina tokenize -m MODEL (-p TEXT | -f FILE)`: print a text's tokens, like llama.cpp's
//! `llama-tokenize`. Default output is one `id -> 'piece'` line per token; `--ids` prints
//! `[id, id, ...]` exactly as `llama-tokenize --ids` does. Vocab-only GGUF files work.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use lamina_tokenizer::{TokenId, Tokenizer};

#[derive(Args, Debug, Default)]
pub struct TokenizeArgs {
    /// The text to tokenize.
    #[arg(
        short = 'p',
        long = "prompt",
        conflicts_with = "file",
        required_unless_present = "file"
    )]
    pub prompt: Option<String>,
    /// Read the text to tokenize from this file.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Print only the ids, as a list: [1, 2, 3].
    #[arg(long)]
    pub ids: bool,
    /// Do not add BOS/EOS (or other special tokens the model adds).
    #[arg(long)]
    pub no_bos: bool,
    /// Treat the text of control tokens (e.g. "<|im_start|>") as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
    /// With --ids, also print the pieces as a JSON array of strings on a second line.
    #[arg(long)]
    pub show_pieces: bool,
}

pub fn run(args: &TokenizeArgs, model_path: &Path) -> anyhow::Result<()> {
    let text = match (&args.prompt, &args.file) {
        (Some(p), None) => p.clone(),
        (None, Some(f)) => {
            let bytes = std::fs::read(f).with_context(|| format!("cannot read {}", f.display()))?;
            String::from_utf8(bytes)
                .with_context(|| format!("{} is not valid UTF-8", f.display()))?
        }
        _ => bail!("give exactly one of -p TEXT or -f FILE"),
    };
    let tok = Tokenizer::from_file(model_path)
        .with_context(|| format!("cannot load the vocabulary of {}", model_path.display()))?;
    let ids = tok.tokenize(&text, !args.no_bos, !args.no_parse_special);
    super::emit(&format_output(&tok, &ids, args.ids, args.show_pieces))?;
    Ok(())
}

/// The whole output for `ids`.
pub fn format_output(
    tok: &Tokenizer,
    ids: &[TokenId],
    ids_only: bool,
    show_pieces: bool,
) -> String {
    if ids_only {
        let mut out = format_ids(ids);
        out.push('\n');
        if show_pieces {
            let pieces: Vec<String> = ids
                .iter()
                .map(|&id| String::from_utf8_lossy(&tok.token_to_piece(id, true)).into_owned())
                .collect();
            out.push_str(&serde_json::to_string(&pieces).unwrap_or_default());
            out.push('\n');
        }
        return out;
    }
    let mut out = String::new();
    for &id in ids {
        out.push_str(&format_token_line(id, &tok.token_to_piece(id, true)));
        out.push('\n');
    }
    out
}

/// `llama-tokenize --ids`: `[1, 2, 3]`.
pub fn format_ids(ids: &[TokenId]) -> String {
    let mut s = String::from("[");
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let _ = write!(s, "{id}");
    }
    s.push(']');
    s
}

/// `llama-tokenize`'s per-token line: `%6d -> '%s'`. A piece that is not valid UTF-8 (part of
/// a multi-byte character) is shown as its bytes, `<0xE6>`, as llama-tokenize does for invalid
/// sequences.
pub fn format_token_line(id: TokenId, piece: &[u8]) -> String {
    let mut shown = String::new();
    let mut rest = piece;
    while !rest.is_empty() {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                shown.push_str(s);
                break;
            }
            Err(e) => {
                let good = e.valid_up_to();
                shown.push_str(std::str::from_utf8(&rest[..good]).expect("valid prefix"));
                let bad = e.error_len().unwrap_or(rest.len() - good);
                for b in &rest[good..good + bad] {
                    let _ = write!(shown, "<0x{b:02X}>");
                }
                rest = &rest[good + bad..];
            }
        }
    }
    format!("{id:6} -> '{shown}'")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_form_matches_llama_tokenize() {
        assert_eq!(format_ids(&[1, 22, 333]), "[1, 22, 333]");
        assert_eq!(format_ids(&[]), "[]");
    }

    #[test]
    fn token_lines() {
        assert_eq!(format_token_line(15043, b" Hello"), " 15043 -> ' Hello'");
        assert_eq!(format_token_line(7, &[0xE6, b'a']), "     7 -> '<0xE6>a'");
        assert_eq!(format_token_line(1234567, "é".as_bytes()), "1234567 -> 'é'");
    }

    #[test]
    fn args_need_exactly_one_input() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: TokenizeArgs,
        }
        assert!(Cli::try_parse_from(["t"]).is_err());
        assert!(Cli::try_parse_from(["t", "-p", "x", "-f", "y"]).is_err());
        let cli = Cli::try_parse_from(["t", "-p", "hi", "--ids", "--no-bos", "--no-parse-special"])
            .unwrap();
        assert!(
            cli.args.ids && cli.args.no_bos && cli.args.no_parse_special && !cli.args.show_pieces
        );
        assert_eq!(cli.args.prompt.as_deref(), Some("hi"));
    }

    #[test]
    fn vocab_only_file_end_to_end() {
        let path = PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/vocab/ggml-vocab-llama-spm.gguf"
        ));
        if !path.is_file() {
            eprintln!("skipping: {} is absent", path.display());
            return;
        }
        let tok = Tokenizer::from_file(&path).unwrap();
        let ids = tok.tokenize("Hello world", true, true);
        assert_eq!(format_output(&tok, &ids, true, false), "[1, 15043, 3186]\n");
        assert_eq!(
            format_output(&tok, &ids, true, true),
            "[1, 15043, 3186]\n[\"<s>\",\" Hello\",\" world\"]\n"
        );
        assert_eq!(
            format_output(&tok, &ids, false, false),
            "     1 -> '<s>'\n 15043 -> ' Hello'\n  3186 -> ' world'\n"
        );
    }
}
