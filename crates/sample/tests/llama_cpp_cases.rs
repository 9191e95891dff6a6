//! The cases of llama.cpp's `tests/test-sampling.cpp`, with its expected probabilities.
//! As there, candidates start as `logit = ln(p)`, the sampler under test runs, then
//! (where the C++ test does) `dist(0)` normalizes, and `p` is compared within 1e-5.

use lamina_sample::{
    Candidates, Dist, Penalties, Xtc, min_p, temp_ext, temp_impl, top_k, top_n_sigma, top_p,
    typical,
};

fn check(cur: &Candidates, expected: &[f32]) {
    let got: Vec<f32> = cur.data.iter().map(|t| t.p).collect();
    assert_eq!(
        got.len(),
        expected.len(),
        "sizes differ: got {got:?}, expected {expected:?}"
    );
    for (g, e) in got.iter().zip(expected) {
        assert!((g - e).abs() < 1e-5, "got {got:?}, expected {expected:?}");
    }
}

fn run(probs: &[f32], expected: &[f32], f: impl FnOnce(&mut Candidates), then_dist: bool) {
    let mut cur = Candidates::from_probs(probs);
    f(&mut cur);
    if then_dist {
        Dist::new(0).apply(&mut cur);
    }
    check(&cur, expected);
}

const P4: [f32; 4] = [0.1, 0.2, 0.3, 0.4];

#[test]
fn temp() {
    run(&P4, &P4, |c| temp_impl(c, 1.0), true);
    run(&P4, &[0.0, 0.0, 0.0, 1.0], |c| temp_impl(c, 0.0), true);
}

#[test]
fn temp_ext_cases() {
    run(&P4, &P4, |c| temp_ext(c, 1.0, 0.0, 1.0), true);
    run(
        &P4,
        &[0.0, 0.0, 0.0, 1.0],
        |c| temp_ext(c, 0.0, 0.0, 1.0),
        true,
    );
}

#[test]
fn top_k_cases() {
    run(&P4, &[1.0], |c| top_k(c, 1), true);
    run(&P4, &[0.44444, 0.33333, 0.22222], |c| top_k(c, 3), true);
    run(&P4, &[0.4, 0.3, 0.2, 0.1], |c| top_k(c, 4), true);
    run(&P4, &P4, |c| top_k(c, 0), true);
}

#[test]
fn top_p_cases() {
    run(&P4, &[1.0], |c| top_p(c, 0.0, 0), true);
    run(&P4, &[0.571429, 0.428571], |c| top_p(c, 0.7, 0), true);
    run(
        &P4,
        &[0.44444, 0.33333, 0.22222],
        |c| top_p(c, 0.8, 0),
        true,
    );
    run(&P4, &P4, |c| top_p(c, 1.0, 0), true);
}

#[test]
fn min_p_cases() {
    let all = [0.1 / 1.0, 0.2 / 1.0, 0.3 / 1.0, 0.4 / 1.0];
    let three = [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9];
    let two = [0.3 / 0.7, 0.4 / 0.7];
    let cases: [(f32, &[f32]); 9] = [
        (0.00, &all),
        (0.24, &all),
        (0.26, &three),
        (0.49, &three),
        (0.51, &two),
        (0.74, &two),
        (0.76, &[1.0]),
        (1.00, &[1.0]),
        (1.05, &[1.0]),
    ];
    for (p, expected) in cases {
        run(&P4, expected, |c| min_p(c, p, 0), true);
    }
}

#[test]
fn xtc_cases() {
    let p = [0.4, 0.3, 0.2, 0.1];
    // "should"
    run(&p, &[0.1], |c| Xtc::new(0.99, 0.09, 0, 0).apply(c), false);
    run(
        &p,
        &[0.2, 0.1],
        |c| Xtc::new(0.99, 0.19, 0, 0).apply(c),
        false,
    );
    run(
        &p,
        &[0.3, 0.2, 0.1],
        |c| Xtc::new(0.99, 0.29, 0, 0).apply(c),
        false,
    );
    // "should not"
    run(
        &p,
        &[0.4, 0.3, 0.2, 0.1],
        |c| Xtc::new(0.99, 0.39, 0, 0).apply(c),
        false,
    );
}

#[test]
fn typical_cases() {
    run(
        &[0.97, 0.01, 0.01, 0.01],
        &[0.97],
        |c| typical(c, 0.5, 0),
        false,
    );
    run(
        &[0.4, 0.2, 0.2, 0.2],
        &[0.2, 0.2, 0.2],
        |c| typical(c, 0.5, 0),
        false,
    );
}

fn penalties(probs: &[f32], last: &[u32], expected: &[f32], repeat: f32, freq: f32, present: f32) {
    let mut pen = Penalties::new(probs.len(), last.len() as i32, repeat, freq, present);
    for &t in last {
        pen.accept(t);
    }
    run(probs, expected, |c| pen.apply(c), true);
}

#[test]
fn penalties_cases() {
    let p5 = [0.2; 5];
    penalties(&p5, &[0], &[0.0, 0.25, 0.25, 0.25, 0.25], 50.0, 0.0, 0.0);
    penalties(&p5, &[0, 1, 2], &[0.0, 0.0, 0.0, 0.5, 0.5], 50.0, 0.0, 0.0);
    penalties(
        &p5,
        &[0, 1, 2, 0, 0],
        &[0.0, 0.0, 0.0, 0.5, 0.5],
        50.0,
        0.0,
        0.0,
    );

    penalties(
        &p5,
        &[0],
        &[0.000011, 0.249997, 0.249997, 0.249997, 0.249997],
        1.0,
        5.0,
        5.0,
    );
    penalties(
        &p5,
        &[0, 1, 2],
        &[0.000023, 0.000023, 0.000023, 0.499966, 0.499966],
        1.0,
        5.0,
        5.0,
    );
    penalties(
        &p5,
        &[0, 1, 2, 0, 0],
        &[0.000000, 0.000023, 0.000023, 0.499977, 0.499977],
        1.0,
        5.0,
        5.0,
    );
}

#[test]
fn penalty_window_forgets_old_tokens() {
    // last_n = 2: after accepting 0, 1, 2 only {1, 2} are penalized.
    let mut pen = Penalties::new(5, 2, 50.0, 0.0, 0.0);
    for t in [0, 1, 2] {
        pen.accept(t);
    }
    let mut c = Candidates::from_probs(&[0.2; 5]);
    pen.apply(&mut c);
    Dist::new(0).apply(&mut c);
    let p: Vec<f32> = c.data.iter().map(|t| t.p).collect();
    assert!(
        (p[0] - p[3]).abs() < 1e-6 && p[1] < 1e-3 && p[2] < 1e-3,
        "{p:?}"
    );
}

/// Compared by token id: the stored llama.cpp test lists these in token order, while the
/// stored sampler source sorts after masking. The probabilities per token agree either way.
#[test]
fn top_n_sigma_cases() {
    let by_id = |n: f32| {
        let mut c = Candidates::from_probs(&P4);
        top_n_sigma(&mut c, n);
        Dist::new(0).apply(&mut c);
        let mut v = [f32::NAN; 4];
        for t in &c.data {
            v[t.id as usize] = t.p;
        }
        v
    };
    let close = |a: [f32; 4], b: [f32; 4]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5);
    assert!(
        close(by_id(1.0), [0.0, 0.0, 0.428571, 0.571429]),
        "{:?}",
        by_id(1.0)
    );
    assert!(close(by_id(0.0), P4));
    assert!(close(by_id(3.0), P4));
}

/// `test_sampler_queue`: 10000 candidates with logit ln(id) (so token 0 is -inf), the
/// samplers applied in the given order, each followed by dist.
fn sampler_queue(n_vocab: i64, seq: &str, top_k_v: i64, top_p_v: f32, min_p_v: f32) {
    let logits: Vec<f32> = (0..n_vocab).map(|i| (i as f32).ln()).collect();
    let mut cur = Candidates::from_logits(&logits);
    let mut min_token_id: i64 = 0;
    let max_token_id = n_vocab - 1;
    for s in seq.chars() {
        match s {
            'k' => top_k(&mut cur, top_k_v as i32),
            'p' => top_p(&mut cur, top_p_v, 1),
            'm' => min_p(&mut cur, min_p_v, 1),
            _ => unreachable!(),
        }
        Dist::new(0).apply(&mut cur);
        let size = cur.len() as i64;
        let id = |i: i64| i64::from(cur.data[i as usize].id);
        let ctx = format!("seq {seq} at '{s}' k={top_k_v} p={top_p_v} m={min_p_v}");
        match s {
            'k' => {
                let expected_size = size.min(top_k_v);
                min_token_id = min_token_id.max(n_vocab - top_k_v);
                assert_eq!(size, expected_size, "{ctx}");
                assert_eq!(id(0), max_token_id, "{ctx}");
                assert_eq!(id(expected_size - 1), min_token_id, "{ctx}");
            }
            'p' => {
                let divisor = n_vocab * (n_vocab - 1) / 2 - min_token_id * (min_token_id - 1) / 2;
                let target = (top_p_v * divisor as f32).ceil() as i64;
                min_token_id = n_vocab;
                let mut expected_size = 0;
                let mut cumsum = 0;
                loop {
                    min_token_id -= 1;
                    expected_size += 1;
                    cumsum += min_token_id;
                    if cumsum >= target {
                        break;
                    }
                }
                if min_token_id == 1 {
                    min_token_id -= 1;
                    expected_size += 1;
                }
                assert_eq!(size, expected_size, "{ctx}");
                assert!(!cur.sorted || id(0) == max_token_id, "{ctx}");
                assert!(
                    !cur.sorted || id(expected_size - 1) == min_token_id,
                    "{ctx}"
                );
            }
            'm' => {
                let mut expected_size = ((1.0f32 - min_p_v) * n_vocab as f32).ceil() as i64;
                expected_size = expected_size.max(1).min(size);
                min_token_id = (min_p_v * n_vocab as f32).floor() as i64;
                min_token_id = min_token_id.max(1).max(n_vocab - size).min(n_vocab - 1);
                assert_eq!(size, expected_size, "{ctx}");
                assert!(!cur.sorted || id(0) == max_token_id, "{ctx}");
                assert!(
                    !cur.sorted || id(expected_size - 1) == min_token_id,
                    "{ctx}"
                );
            }
            _ => unreachable!(),
        }
    }
}

#[test]
fn sampler_queue_cases() {
    sampler_queue(10000, "k", 10000, 1.0, 1.0);
    sampler_queue(10000, "k", 1, 1.0, 1.0);
    sampler_queue(10000, "p", 10000, 1.0, 1.0);
    sampler_queue(10000, "p", 10000, 0.0, 1.0);
    sampler_queue(10000, "m", 10000, 1.0, 1.0);
    sampler_queue(10000, "m", 10000, 1.0, 1e-12);

    sampler_queue(10000, "k", 100, 1.0000, 1.0);
    sampler_queue(10000, "p", 10000, 0.0003, 1.0);
    sampler_queue(10000, "p", 10000, 0.8000, 1.0);
    sampler_queue(10000, "m", 10000, 1.0000, 9997.9 / 9999.0);
    sampler_queue(10000, "m", 10000, 1.0000, 0.1);

    for seq in ["kp", "km", "pk", "pm", "mk", "mp"] {
        sampler_queue(10000, seq, 100, 0.8, 0.1);
    }
    sampler_queue(10000, "mp", 100, 0.8, 9997.9 / 9999.0);
    for seq in ["kpm", "kmp", "pkm", "pmk", "mkp", "mpk"] {
        sampler_queue(10000, seq, 100, 0.8, 0.1);
    }
}
