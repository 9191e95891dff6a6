//! The full chain against token sequences from a C++ re-statement of llama.cpp's
//! penalties → top-k → top-p → min-p → temp → dist path, built with g++ 12 / libstdc++
//! (real `std::mt19937`, `std::uniform_real_distribution<double>`, `std::partial_sort`,
//! `expf`). Logits come from a 32-bit LCG both sides reproduce exactly; each chosen
//! token is accepted before the next step. Plus edge cases and the serde surface.

use lamina_sample::{
    SampleError, SamplerChain, SamplerType, SamplingParams, token_prob, top_probs,
};

struct Lcg(u32);

impl Lcg {
    fn new(seed: u32) -> Self {
        Lcg(seed.wrapping_mul(7).wrapping_add(1))
    }
    fn logit(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(1664525).wrapping_add(1013904223);
        (self.0 >> 9) as f32 / 524288.0 - 8.0
    }
}

#[allow(clippy::too_many_arguments)]
fn run_chain(
    n_vocab: usize,
    seed: u32,
    top_k: i32,
    top_p: f32,
    min_p: f32,
    temp: f32,
    last_n: i32,
    (repeat, freq, present): (f32, f32, f32),
    steps: usize,
) -> Vec<u32> {
    let params = SamplingParams {
        seed,
        top_k,
        top_p,
        min_p,
        temp,
        penalty_last_n: last_n,
        penalty_repeat: repeat,
        penalty_freq: freq,
        penalty_present: present,
        ..SamplingParams::default()
    };
    let mut chain = SamplerChain::new(&params, n_vocab).unwrap();
    let mut lcg = Lcg::new(seed);
    let mut logits = vec![0.0f32; n_vocab];
    let mut out = Vec::with_capacity(steps);
    for _ in 0..steps {
        logits.iter_mut().for_each(|l| *l = lcg.logit());
        let tok = chain.sample(&logits).unwrap();
        chain.accept(tok).unwrap();
        out.push(tok);
    }
    out
}

const NO_PEN: (f32, f32, f32) = (1.0, 0.0, 0.0);

#[test]
fn default_chain_matches_llama_cpp() {
    let expected = [
        49, 973, 425, 335, 276, 125, 949, 322, 902, 597, 929, 595, 795, 71, 858, 906, 816, 365,
        606, 873, 978, 965, 859, 924, 519, 160, 841, 799, 305, 54, 788, 997, 123, 20, 926, 625,
        709, 757, 960, 270, 504, 165, 15, 237, 532, 307, 912, 424, 848, 124, 982, 541, 130, 89,
        694, 448, 605, 320, 56, 206, 167, 514, 438, 19,
    ];
    assert_eq!(
        run_chain(1000, 42, 40, 0.95, 0.05, 0.8, 64, NO_PEN, 64),
        expected
    );
}

#[test]
fn large_unsorted_top_p_matches_llama_cpp() {
    // top-k off and 5000 candidates: top-p's "best 256 first" path, then sorted min-p.
    let expected = [
        308, 2168, 833, 4116, 1155, 3458, 2756, 4730, 4323, 356, 2697, 189, 4965, 240, 521, 420,
        1111, 2324, 323, 559, 842, 4919, 1102, 1345, 3518, 251, 415, 4210, 193, 2288, 2134, 1098,
        1949, 3830, 3240, 2266, 1890, 2814, 3729, 3062, 1709, 3471, 646, 3064, 3990, 3804, 1224,
        3093,
    ];
    assert_eq!(
        run_chain(5000, 1234, 0, 0.95, 0.05, 0.8, 64, NO_PEN, 48),
        expected
    );
}

#[test]
fn unsorted_min_p_matches_llama_cpp() {
    // Only min-p active: candidates stay in token order and dist walks them that way.
    let expected = [
        566, 1037, 2936, 1305, 936, 779, 286, 1336, 29, 1542, 2627, 1037, 1164, 2011, 2155, 2072,
        1060, 2838, 616, 2299, 730, 2496, 534, 2403, 2837, 1304, 1069, 1030, 578, 255, 1476, 1798,
        2835, 989, 681, 1350, 2922, 635, 439, 320, 1543, 1010, 850, 2747, 1268, 1193, 2955, 2372,
    ];
    assert_eq!(
        run_chain(3000, 7, 0, 1.0, 0.05, 1.0, 64, NO_PEN, 48),
        expected
    );
}

#[test]
fn penalties_match_llama_cpp() {
    let expected = [
        142, 190, 164, 154, 55, 195, 106, 120, 185, 80, 60, 133, 124, 69, 122, 68, 63, 115, 101,
        40, 91, 151, 139, 92, 178, 99, 126, 24, 116, 50, 13, 132, 5, 167, 44, 18, 21, 29, 136, 76,
        67, 40, 193, 115, 123, 71, 186, 188, 34, 150, 5, 101, 198, 92, 182, 40, 40, 73, 38, 88, 42,
        91, 194, 34,
    ];
    assert_eq!(
        run_chain(200, 99, 0, 1.0, 0.0, 1.0, 8, (1.3, 0.5, 0.4), 64),
        expected
    );
}

#[test]
fn temp_zero_matches_llama_cpp() {
    let expected = [
        629, 244, 973, 406, 270, 758, 60, 655, 712, 311, 585, 299, 122, 499, 749, 200,
    ];
    assert_eq!(
        run_chain(1000, 5, 40, 0.95, 0.05, 0.0, 64, NO_PEN, 16),
        expected
    );
}

#[test]
fn big_top_k_matches_llama_cpp() {
    // k > 128 takes llama.cpp's bucket sort; with a repeat penalty over 64 tokens.
    let expected = [
        29496, 7926, 30959, 3561, 18041, 29084, 3128, 6942, 26914, 11762, 6352, 1683, 798, 3906,
        248, 24170, 13236, 26606, 15255, 23591, 18980, 9228, 30178, 7775,
    ];
    assert_eq!(
        run_chain(32000, 2024, 200, 0.9, 0.0, 1.5, 64, (1.1, 0.0, 0.0), 24),
        expected
    );
}

#[test]
fn top_p_only_large_vocab_matches_llama_cpp() {
    let expected = [
        22149, 16219, 23120, 48633, 19267, 36954, 34528, 25346, 37831, 31505, 9558, 28190, 23538,
        43750, 47833, 8267, 13843, 40501, 1925, 47493, 47863, 14414, 28487, 35703,
    ];
    assert_eq!(
        run_chain(50000, 31337, 0, 0.5, 0.0, 0.7, 0, NO_PEN, 24),
        expected
    );
}

#[test]
fn seeded_runs_repeat_and_reset_replays() {
    let params = SamplingParams {
        seed: 123,
        ..SamplingParams::default()
    };
    let mut lcg = Lcg::new(1);
    let steps: Vec<Vec<f32>> = (0..32)
        .map(|_| (0..500).map(|_| lcg.logit()).collect())
        .collect();
    let mut a = SamplerChain::new(&params, 500).unwrap();
    let mut b = SamplerChain::new(&params, 500).unwrap();
    let run = |c: &mut SamplerChain| -> Vec<u32> {
        steps
            .iter()
            .map(|l| {
                let t = c.sample(l).unwrap();
                c.accept(t).unwrap();
                t
            })
            .collect()
    };
    let ra = run(&mut a);
    assert_eq!(ra, run(&mut b));
    a.reset();
    assert_eq!(ra, run(&mut a));
    assert_eq!(a.seed(), Some(123));
}

#[test]
fn default_seed_is_random_but_reported() {
    let chain = SamplerChain::new(&SamplingParams::default(), 10).unwrap();
    let seed = chain.seed().unwrap();
    assert_ne!(seed, lamina_sample::rng::DEFAULT_SEED);
    // The reported seed reproduces the run.
    let logits: Vec<f32> = (0..10).map(|i| i as f32 * 0.1).collect();
    let mut a = SamplerChain::new(&SamplingParams::default(), 10).unwrap();
    let mut b = SamplerChain::new(
        &SamplingParams {
            seed: a.seed().unwrap(),
            ..Default::default()
        },
        10,
    )
    .unwrap();
    for _ in 0..20 {
        assert_eq!(a.sample(&logits).unwrap(), b.sample(&logits).unwrap());
    }
}

#[test]
fn greedy_picks_first_max() {
    let mut g = SamplerChain::greedy(5).unwrap();
    assert_eq!(g.sample(&[0.0, 3.0, 1.0, 3.0, -1.0]).unwrap(), 1);
    let mut t0 = SamplerChain::new(&SamplingParams::greedy(), 5).unwrap();
    assert_eq!(t0.sample(&[0.0, 3.0, 1.0, 2.0, -1.0]).unwrap(), 1);
}

#[test]
fn all_neg_inf_picks_lowest_id() {
    let logits = [f32::NEG_INFINITY; 8];
    let mut c = SamplerChain::new(
        &SamplingParams {
            seed: 1,
            ..Default::default()
        },
        8,
    )
    .unwrap();
    assert_eq!(c.sample(&logits).unwrap(), 0);
    let p: f32 = c.last_candidates().data.iter().map(|t| t.p).sum();
    assert_eq!(p, 1.0);
    let mut g = SamplerChain::greedy(8).unwrap();
    assert_eq!(g.sample(&logits).unwrap(), 0);
}

#[test]
fn nan_logits_are_never_chosen() {
    let logits = [f32::NAN, 1.0, f32::NAN, 0.5, f32::NAN];
    for seed in 0..200 {
        let p = SamplingParams {
            seed,
            temp: 5.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        };
        let tok = SamplerChain::new(&p, 5).unwrap().sample(&logits).unwrap();
        assert!(tok == 1 || tok == 3, "seed {seed} chose {tok}");
    }
    assert_eq!(SamplerChain::greedy(5).unwrap().sample(&logits).unwrap(), 1);
    let all_nan = [f32::NAN; 4];
    assert_eq!(
        SamplerChain::new(&SamplingParams::default(), 4)
            .unwrap()
            .sample(&all_nan)
            .unwrap(),
        0
    );
}

#[test]
fn pos_inf_logit_wins() {
    let logits = [0.0, f32::INFINITY, 1.0, f32::INFINITY];
    for seed in 0..20 {
        let p = SamplingParams {
            seed,
            ..Default::default()
        };
        assert_eq!(
            SamplerChain::new(&p, 4).unwrap().sample(&logits).unwrap(),
            1
        );
    }
}

#[test]
fn bad_sizes_are_errors() {
    assert_eq!(
        SamplerChain::new(&SamplingParams::default(), 0).unwrap_err(),
        SampleError::EmptyVocab
    );
    let mut c = SamplerChain::new(&SamplingParams::default(), 4).unwrap();
    assert_eq!(
        c.sample(&[0.0; 3]).unwrap_err(),
        SampleError::LogitsLen {
            got: 3,
            expected: 4
        }
    );
    let mut no_select =
        SamplerChain::from_samplers(vec![lamina_sample::Sampler::TopK { k: 2 }], 4).unwrap();
    assert_eq!(
        no_select.sample(&[0.0; 4]).unwrap_err(),
        SampleError::NoSelection
    );
}

#[test]
fn k_larger_than_vocab_and_one_candidate() {
    let p = SamplingParams {
        top_k: 1000,
        seed: 3,
        ..Default::default()
    };
    let mut c = SamplerChain::new(&p, 3).unwrap();
    let t = c.sample(&[0.0, 10.0, 0.0]).unwrap();
    assert_eq!(t, 1);
    assert_eq!(c.last_candidates().len(), 1); // min-p 0.05 leaves only the dominant token
    let mut one = SamplerChain::new(&SamplingParams::default(), 1).unwrap();
    assert_eq!(one.sample(&[-3.0]).unwrap(), 0);
}

#[test]
fn unsupported_samplers_are_rejected() {
    let dry = SamplingParams {
        dry_multiplier: 0.8,
        ..Default::default()
    };
    assert_eq!(
        SamplerChain::new(&dry, 10).unwrap_err(),
        SampleError::Unsupported("dry")
    );
    let miro = SamplingParams {
        mirostat: 2,
        ..Default::default()
    };
    assert_eq!(
        SamplerChain::new(&miro, 10).unwrap_err(),
        SampleError::Unsupported("mirostat")
    );
    // DRY listed but inactive (the default) is fine.
    assert!(SamplerChain::new(&SamplingParams::default(), 10).is_ok());
}

#[test]
fn logit_bias_applies_first() {
    let p = SamplingParams {
        logit_bias: vec![(2, 100.0), (0, f32::NEG_INFINITY)],
        seed: 9,
        ..Default::default()
    };
    let mut c = SamplerChain::new(&p, 4).unwrap();
    assert_eq!(c.sample(&[5.0, 1.0, 0.0, 1.0]).unwrap(), 2);
    assert!(
        c.describe()
            .starts_with("logits -> logit-bias -> penalties")
    );
}

#[test]
fn steady_state_does_not_reallocate_candidates() {
    let p = SamplingParams {
        seed: 4,
        penalty_repeat: 1.2,
        ..Default::default()
    };
    let mut c = SamplerChain::new(&p, 4096).unwrap();
    let mut lcg = Lcg::new(8);
    let mut logits = vec![0.0; 4096];
    logits.iter_mut().for_each(|l| *l = lcg.logit());
    let t = c.sample(&logits).unwrap();
    c.accept(t).unwrap();
    let ptr = c.last_candidates().data.as_ptr();
    let cap = c.last_candidates().data.capacity();
    for _ in 0..50 {
        logits.iter_mut().for_each(|l| *l = lcg.logit());
        let t = c.sample(&logits).unwrap();
        c.accept(t).unwrap();
        assert_eq!(c.last_candidates().data.as_ptr(), ptr);
        assert_eq!(c.last_candidates().data.capacity(), cap);
    }
}

#[test]
fn last_candidates_hold_final_distribution() {
    let p = SamplingParams {
        seed: 11,
        ..Default::default()
    };
    let mut c = SamplerChain::new(&p, 6).unwrap();
    let tok = c.sample(&[1.0, 2.0, 3.0, 2.5, -4.0, 0.0]).unwrap();
    let cands = c.last_candidates();
    assert_eq!(cands.selected_token(), Some(tok));
    let sum: f32 = cands.data.iter().map(|t| t.p).sum();
    assert!((sum - 1.0).abs() < 1e-6);
    assert!(cands.sorted);
}

#[test]
fn top_probs_are_full_softmax() {
    let logits = [1.0, 2.0, 3.0, f32::NAN];
    let top = top_probs(&logits, 2);
    let z = 1f32.exp() + 2f32.exp() + 3f32.exp();
    assert_eq!(top.iter().map(|t| t.id).collect::<Vec<_>>(), [2, 1]);
    assert!((top[0].p - 3f32.exp() / z).abs() < 1e-6);
    assert!((top[1].p - 2f32.exp() / z).abs() < 1e-6);
    assert!((top[1].logprob() - (2.0 - z.ln())).abs() < 1e-5);
    assert_eq!(top_probs(&logits, 10).len(), 4);
    assert!(top_probs(&[], 3).is_empty());
    assert_eq!(token_prob(&logits, 3), Some(0.0));
    assert_eq!(token_prob(&logits, 4), None);
}

#[test]
fn params_deserialize_from_server_json() {
    let p: SamplingParams = serde_json::from_str(
        r#"{"temperature":0.5,"top_k":10,"seed":-1,"samplers":["top_k","temp","bogus"],
            "repeat_penalty":1.1,"repeat_last_n":32,"typical_p":0.9,"logit_bias":[[1,-100.0]]}"#,
    )
    .unwrap();
    assert_eq!(p.temp, 0.5);
    assert_eq!(p.top_k, 10);
    assert_eq!(p.seed, lamina_sample::rng::DEFAULT_SEED);
    assert_eq!(p.samplers, [SamplerType::TopK, SamplerType::Temperature]);
    assert_eq!(p.penalty_repeat, 1.1);
    assert_eq!(p.penalty_last_n, 32);
    assert_eq!(p.typ_p, 0.9);
    assert_eq!(p.logit_bias, [(1, -100.0)]);
    assert_eq!(p.top_p, 0.95); // untouched default
    let chars: SamplingParams = serde_json::from_str(r#"{"samplers":"kpt","seed":42}"#).unwrap();
    assert_eq!(
        chars.samplers,
        [
            SamplerType::TopK,
            SamplerType::TopP,
            SamplerType::Temperature
        ]
    );
    assert_eq!(chars.seed, 42);
    assert!(serde_json::from_str::<SamplingParams>(r#"{"seed":99999999999}"#).is_err());
    assert_eq!(
        serde_json::from_str::<SamplingParams>("{}").unwrap(),
        SamplingParams::default()
    );
}

#[test]
fn n_ctx_resolves_minus_one() {
    let p = SamplingParams {
        penalty_last_n: -1,
        ..Default::default()
    }
    .with_n_ctx(4096);
    assert_eq!(p.penalty_last_n, 4096);
    assert_eq!(p.dry_penalty_last_n, 4096);
}

/// A lazy grammar leaves the output free until a trigger word appears, then constrains
/// it from the trigger's start; a `^` trigger counts only at the start of the output.
#[test]
fn lazy_grammar_waits_for_its_trigger() {
    use lamina_grammar::{Grammar, Matcher, TokenIndex};
    use std::sync::Arc;
    let pieces: Vec<Vec<u8>> = ["a", "b", "{", "x", "<t>", "</s>"]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    let (a, brace, x, t, eos) = (0u32, 2u32, 3u32, 4u32, 5u32);
    let vocab = Arc::new(TokenIndex::new(pieces, |id| id == 5));
    let g = Grammar::parse("root ::= (\"<t>\" | \"{\") \"x\"", "root", None).unwrap();
    // Logits that always prefer "a".
    let logits = [5.0f32, 1.0, 1.0, 1.0, 1.0, 1.0];
    let mut c = SamplerChain::greedy(6).unwrap();
    c.set_lazy_grammar(Some(Matcher::new(&g, vocab.clone())), vec!["<t>".into()]);
    assert_eq!(c.sample(&logits).unwrap(), a, "free before the trigger");
    c.accept(a).unwrap();
    c.accept(t).unwrap();
    assert_eq!(c.sample(&logits).unwrap(), x, "constrained after it");
    c.accept(x).unwrap();
    assert_eq!(c.sample(&logits).unwrap(), eos);

    let mut c = SamplerChain::greedy(6).unwrap();
    c.set_lazy_grammar(Some(Matcher::new(&g, vocab.clone())), vec!["^{".into()]);
    c.accept(a).unwrap();
    c.accept(brace).unwrap();
    assert_eq!(
        c.sample(&logits).unwrap(),
        a,
        "`^{{` after text does not trigger"
    );
    let mut c = SamplerChain::greedy(6).unwrap();
    c.set_lazy_grammar(Some(Matcher::new(&g, vocab)), vec!["^{".into()]);
    c.accept(brace).unwrap();
    assert_eq!(c.sample(&logits).unwrap(), x, "`^{{` at the start triggers");

    // A trigger split over tokens, after some text.
    let pieces: Vec<Vec<u8>> = ["a", "<", "t>", "x", "</s>"]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    let vocab = Arc::new(TokenIndex::new(pieces, |id| id == 4));
    let g = Grammar::parse("root ::= \"<t>\" \"x\"", "root", None).unwrap();
    let logits = [5.0f32, 1.0, 1.0, 1.0, 1.0];
    let mut c = SamplerChain::greedy(5).unwrap();
    c.set_lazy_grammar(Some(Matcher::new(&g, vocab)), vec!["<t>".into()]);
    for t in [0, 0, 1] {
        assert_eq!(c.sample(&logits).unwrap(), 0, "free before the trigger");
        c.accept(t).unwrap();
    }
    c.accept(2).unwrap();
    assert_eq!(
        c.sample(&logits).unwrap(),
        3,
        "constrained once `<` `t>` complete it"
    );
}

/// A grammar too ambiguous to follow (nested `((a)+)+`: exponentially many parses)
/// surfaces as the grammar's typed error from `sample` or `accept`, not as a dead end.
#[test]
fn too_ambiguous_grammar_is_a_typed_error() {
    use lamina_grammar::{Grammar, MatchError, Matcher, TokenIndex};
    use std::sync::Arc;
    let pieces: Vec<Vec<u8>> = ["a", "b", "</s>"]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    let vocab = Arc::new(TokenIndex::new(pieces, |id| id == 2));
    let src = format!("root ::= {}\"a\"{} \"b\"", "(".repeat(15), ")+".repeat(15));
    let g = Grammar::parse(&src, "root", None).unwrap();
    // Logits that prefer "b": the check fails while "a"s are needed, so masks are made.
    let logits = [1.0f32, 5.0, 0.0];
    let mut c = SamplerChain::greedy(3).unwrap();
    c.set_lazy_grammar(Some(Matcher::new(&g, vocab)), Vec::new());
    let mut err = None;
    for _ in 0..64 {
        match c.sample(&logits) {
            Ok(_) => {}
            Err(e) => {
                err = Some(e);
                break;
            }
        }
        if let Err(e) = c.accept(0) {
            err = Some(e);
            break;
        }
    }
    match err {
        Some(SampleError::Grammar(MatchError::TooManyStacks(_) | MatchError::TooMuchWork(_))) => {}
        e => panic!("expected a too-ambiguous grammar error, got {e:?}"),
    }
}
