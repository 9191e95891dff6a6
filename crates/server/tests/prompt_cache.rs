//! The host-memory prompt cache (`--cache-ram`) and slot files (`--slot-save-path`): a
//! prompt that left its slot is found again by a later one that starts the same way, and a
//! saved slot restores into another slot with the same answer.

mod common;

use common::{get, post};
use lamina_server::ServerConfig;
use serde_json::{Value, json};

const LONG: &str = "Once upon a time in a land far away there lived a brave knight who \
                    traveled across mountains and rivers to find the golden sword.";

fn completion(prompt: &str, slot: Option<u32>) -> Value {
    let mut v = json!({"prompt": prompt, "n_predict": 4, "temperature": 0, "cache_prompt": true});
    if let Some(s) = slot {
        v["id_slot"] = json!(s);
    }
    v
}

#[tokio::test]
async fn idle_slots_go_to_the_prompt_cache_and_come_back() {
    let config = ServerConfig {
        cache_ram_mib: 16,
        ..ServerConfig::default()
    };
    let addr = common::start(4096, 2, config).await;
    let first = post(addr, "/completion", completion(LONG, Some(0)))
        .await
        .json();
    let n_prompt = first["timings"]["prompt_n"].as_u64().unwrap();
    // Slot 1 starts: idle slot 0 goes to the prompt cache.
    post(
        addr,
        "/completion",
        completion("The quick brown fox", Some(1)),
    )
    .await;
    // Slot 0 is given something else: its old prompt is only in the cache now.
    post(
        addr,
        "/completion",
        completion("Completely unrelated words", Some(0)),
    )
    .await;
    // The long prompt again, on any slot: brought back from the cache, not recomputed.
    let again = post(addr, "/completion", completion(LONG, None))
        .await
        .json();
    assert!(again["timings"]["cache_n"].as_u64().unwrap() > 0, "{again}");
    assert!(
        again["timings"]["prompt_n"].as_u64().unwrap() < n_prompt,
        "{again}"
    );
    assert_eq!(again["content"], first["content"]);
}

#[tokio::test]
async fn slots_save_and_restore_through_files() {
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        slot_save_path: Some(dir.path().to_path_buf()),
        ..ServerConfig::default()
    };
    let addr = common::start(4096, 2, config).await;
    let first = post(addr, "/completion", completion(LONG, Some(1)))
        .await
        .json();
    let saved = post(addr, "/slots/1?action=save", json!({"filename": "s1.bin"}))
        .await
        .json();
    let n = saved["n_saved"].as_u64().unwrap();
    assert!(n > 0, "{saved}");
    let restored = post(
        addr,
        "/slots/0?action=restore",
        json!({"filename": "s1.bin"}),
    )
    .await;
    assert_eq!(restored.json()["n_restored"].as_u64(), Some(n));
    let again = post(addr, "/completion", completion(LONG, Some(0)))
        .await
        .json();
    assert!(again["timings"]["cache_n"].as_u64().unwrap() > 0, "{again}");
    assert_eq!(again["content"], first["content"]);
    let erased = post(addr, "/slots/0?action=erase", json!({})).await.json();
    assert!(erased["n_erased"].as_u64().unwrap() > 0);
    // Names that leave the folder, unknown actions, missing files: 400s.
    for (path, body) in [
        ("/slots/0?action=save", json!({"filename": "../x"})),
        ("/slots/0?action=save", json!({"filename": "a/b"})),
        ("/slots/0?action=jump", json!({"filename": "x"})),
        (
            "/slots/0?action=restore",
            json!({"filename": "missing.bin"}),
        ),
        ("/slots/9?action=save", json!({"filename": "x"})),
    ] {
        let r = post(addr, path, body).await;
        assert_eq!(r.status, 400, "{path}: {}", r.text());
    }
    // Not a slot file.
    std::fs::write(dir.path().join("junk.bin"), b"junk").unwrap();
    let r = post(
        addr,
        "/slots/0?action=restore",
        json!({"filename": "junk.bin"}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    let _ = get(addr, "/health").await;
}

#[tokio::test]
async fn slot_actions_need_a_save_path() {
    let addr = common::start_default().await;
    let r = post(addr, "/slots/0?action=save", json!({"filename": "x"})).await;
    assert_eq!(r.status, 501);
}

#[tokio::test]
async fn infill_frames_the_prompt_with_fim_tokens() {
    use lamina_server::fake::FakeEngine;
    // Without FIM tokens, llama-server's 501.
    let plain = common::start_default().await;
    let r = post(
        plain,
        "/infill",
        json!({"input_prefix": "a", "input_suffix": "b"}),
    )
    .await;
    assert_eq!(r.status, 501, "{}", r.text());

    let engine = FakeEngine::new(4096, 1).with_fim(3, 4, 5);
    let addr = lamina_server::spawn_local(Box::new(engine), ServerConfig::default())
        .await
        .unwrap();
    let r = post(
        addr,
        "/infill",
        json!({"input_prefix": "def f(", "input_suffix": "):", "n_predict": 3,
               "temperature": 0, "ignore_eos": true,
               "input_extra": [{"filename": "x.py", "text": "y = 1"}], "return_tokens": true}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    // [FIM_PRE] 6 bytes [FIM_SUF] 2 bytes [FIM_MID], the extra file as a snippet before it.
    let snippet = "\n\n--- snippet ---\n\n".len() + "y = 1".len();
    assert_eq!(v["tokens_evaluated"], 3 + 6 + 2 + snippet);
    assert_eq!(v["tokens"].as_array().unwrap().len(), 3);
    for bad in [
        json!({"input_suffix": "b"}),
        json!({"input_prefix": 1, "input_suffix": "b"}),
        json!({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "x"}]}),
        json!({"input_prefix": "a", "input_suffix": "b", "input_extra": "x"}),
    ] {
        let r = post(addr, "/infill", bad.clone()).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
    }
}

/// `--spm-infill` puts the suffix before the prefix, as llama-server's.
#[tokio::test]
async fn spm_infill_puts_the_suffix_first() {
    use lamina_server::fake::FakeEngine;
    for (spm, want) in [
        (false, "\u{3}def f(\u{4}):\u{5}"),
        (true, "\u{4}):\u{3}def f(\u{5}"),
    ] {
        let engine = FakeEngine::new(4096, 1).with_fim(3, 4, 5);
        let config = ServerConfig {
            spm_infill: spm,
            ..ServerConfig::default()
        };
        let addr = lamina_server::spawn_local(Box::new(engine), config)
            .await
            .unwrap();
        let v = post(
            addr,
            "/infill",
            json!({"input_prefix": "def f(", "input_suffix": "):", "n_predict": 1}),
        )
        .await
        .json();
        assert_eq!(v["prompt"], want, "spm {spm}");
    }
}
