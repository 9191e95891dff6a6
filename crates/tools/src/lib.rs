//! `lamina-tools` owns the tools that turn one model file into another rather than run it:
//! [`quantize`] (llama-quantize: its file types, its per-tensor type rules and its exact output
//! bytes). The row-level quantizers themselves live in `lamina-core`; this crate decides which
//! tensor gets which type, streams the tensors through them, and writes the GGUF file the way
//! llama.cpp writes it, atomically (a temporary file renamed into place).

pub mod imatrix;
pub mod quantize;

use std::path::Path;

/// A temporary file beside `path`, to be renamed onto it once whole. Made with mode 0666 less
/// the umask, as `fopen` makes llama.cpp's outputs, not tempfile's owner-only 0600: the renamed
/// file is an ordinary output.
pub(crate) fn temp_output_for(path: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let prefix = format!(".{file_name}.");
    let mut b = tempfile::Builder::new();
    b.prefix(&prefix).suffix(".part");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        b.permissions(std::fs::Permissions::from_mode(0o666));
    }
    b.tempfile_in(dir)
}
