//! `lamina pull NAME`: fetch a known model into the cache.

use anyhow::bail;
use clap::Args;
use lamina_gguf::pull::{self as hub, KNOWN_MODELS, PullConfig};

use super::BarProgress;

#[derive(Args, Debug)]
pub struct PullArgs {
    /// Known model names to fetch (see --list).
    #[arg(required_unless_present = "list")]
    pub names: Vec<String>,
    /// List the known models and whether each is cached.
    #[arg(long)]
    pub list: bool,
}

pub fn run(args: &PullArgs) -> anyhow::Result<()> {
    let config = PullConfig::from_env();
    if args.list {
        super::emit(&list_text(&config))?;
        return Ok(());
    }
    // Check every name before fetching anything.
    let models = args
        .names
        .iter()
        .map(|n| hub::find_known(n))
        .collect::<Result<Vec<_>, _>>()?;
    for model in models {
        let mut progress = BarProgress::new();
        let result = hub::pull(&config, model, &mut progress);
        progress.finish();
        match result {
            Ok(path) => super::emit(&format!("{}: {}\n", model.name, path.display()))?,
            Err(e) => bail!("cannot pull {}: {e}", model.name),
        }
    }
    Ok(())
}

fn list_text(config: &PullConfig) -> String {
    let mut out = format!("models (cache: {})\n", config.cache_dir.display());
    for m in KNOWN_MODELS {
        let state = if config.cached_path(m.name).is_some() {
            "cached"
        } else {
            "not pulled"
        };
        let default = if m.name == hub::DEFAULT_MODEL {
            " (default)"
        } else {
            ""
        };
        out += &format!(
            "  {:<14} {:>7.1} MiB  {:<10}  {}{}\n",
            m.name,
            m.size as f64 / (1024.0 * 1024.0),
            state,
            m.description,
            default
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_names_every_known_model() {
        let dir = tempfile::tempdir().unwrap();
        let config = PullConfig {
            cache_dir: dir.path().to_path_buf(),
            pip: vec![],
        };
        let text = list_text(&config);
        assert!(
            text.contains("smollm2-135m") && text.contains("(default)"),
            "{text}"
        );
        assert!(
            text.contains("gemma3-270m") && text.contains("not pulled"),
            "{text}"
        );
    }
}
