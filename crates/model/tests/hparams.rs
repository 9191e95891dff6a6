//! Hyperparameters of both test models, as llama.cpp prints them when it loads them.

use lamina_gguf::GgufFile;
use lamina_gguf::pull::model_for_test;
use lamina_model::{HParams, RopeType};

#[test]
fn smollm2_hparams() {
    let Some(path) = model_for_test("smollm2-135m") else {
        return;
    };
    let hp = HParams::from_gguf(&GgufFile::open(path).unwrap()).unwrap();
    assert_eq!(hp.arch, "llama");
    assert_eq!(
        (hp.n_vocab, hp.n_embd, hp.n_layer, hp.n_ctx_train),
        (49152, 576, 30, 8192)
    );
    assert_eq!((hp.n_head[0], hp.n_head_kv[0], hp.n_ff[0]), (9, 3, 1536));
    assert_eq!((hp.n_embd_head_k, hp.n_embd_head_v, hp.n_rot), (64, 64, 64));
    assert_eq!(hp.rope_type, RopeType::Normal);
    assert_eq!(hp.rope_freq(0), (100000.0, 1.0));
    assert_eq!(hp.n_swa, 0);
}

#[test]
fn gemma3_hparams() {
    let Some(path) = model_for_test("gemma3-270m") else {
        return;
    };
    let hp = HParams::from_gguf(&GgufFile::open(path).unwrap()).unwrap();
    assert_eq!(hp.arch, "gemma3");
    assert_eq!((hp.n_vocab, hp.n_embd, hp.n_layer), (262144, 640, 18));
    assert_eq!((hp.n_head[0], hp.n_head_kv[0], hp.n_ff[0]), (4, 1, 2048));
    assert_eq!((hp.n_embd_head_k, hp.n_rot), (256, 256));
    assert_eq!(hp.rope_type, RopeType::Neox);
    assert_eq!(hp.n_swa, 512);
    // Every sixth layer is global, with the file's rope base; the others slide with base 10000.
    let global: Vec<usize> = (0..18).filter(|&il| !hp.swa_layers[il]).collect();
    assert_eq!(global, vec![5, 11, 17]);
    assert_eq!(hp.rope_freq(0), (10000.0, 1.0));
    assert_eq!(hp.rope_freq(5), (1000000.0, 1.0));
}

#[test]
fn unknown_architecture_is_named() {
    let vocab = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/vocab/ggml-vocab-gemma-4.gguf"
    );
    if !std::path::Path::new(vocab).exists() {
        eprintln!("skipping: ../shared/vocab is absent");
        return;
    }
    let err = HParams::from_gguf(&GgufFile::open(vocab).unwrap()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("unknown model architecture \"gemma4\" (supported: llama, gemma3, "),
        "{text}"
    );
    for arch in lamina_model::arch::ARCHITECTURES {
        assert!(text.contains(arch.name), "{text}");
    }
}
