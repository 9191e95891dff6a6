//! `Mt19937` against C++ `std::mt19937`, and the uniform draws against libstdc++'s
//! `std::uniform_real_distribution` (values printed by a g++ 12 / libstdc++ program).

use lamina_sample::rng::Mt19937;

#[test]
fn default_seed_outputs_match_cxx() {
    let mut rng = Mt19937::new(Mt19937::CXX_DEFAULT_SEED);
    let first: Vec<u32> = (0..5).map(|_| rng.next_u32()).collect();
    assert_eq!(
        first,
        [3499211612, 581869302, 3890346734, 3586334585, 545404204]
    );
}

#[test]
fn ten_thousandth_output_is_the_standards_value() {
    // [rand.predef]: the 10000th consecutive invocation of a default-constructed
    // std::mt19937 produces 4123659995.
    let mut rng = Mt19937::new(5489);
    let mut v = 0;
    for _ in 0..10000 {
        v = rng.next_u32();
    }
    assert_eq!(v, 4123659995);
}

#[test]
fn seeded_first_outputs() {
    for (seed, first) in [
        (0, 2357136044),
        (42, 1608637542),
        (1234, 822569775),
        (4294967294, 2236247450),
    ] {
        assert_eq!(Mt19937::new(seed).next_u32(), first, "seed {seed}");
    }
}

#[test]
fn reseed_restarts_the_stream() {
    let mut rng = Mt19937::new(7);
    let a: Vec<u32> = (0..700).map(|_| rng.next_u32()).collect();
    rng.seed(7);
    let b: Vec<u32> = (0..700).map(|_| rng.next_u32()).collect();
    assert_eq!(a, b);
}

#[test]
fn uniform_f64_matches_libstdcxx_bits() {
    let cases: [(u32, [u64; 4]); 4] = [
        (
            0,
            [
                0x3fe2f89545f18fe1,
                0x3feb04399816e2d5,
                0x3feb744a5f7349d6,
                0x3feb1cafacf16faf,
            ],
        ),
        (
            42,
            [
                0x3fe97d47b66bfc3c,
                0x3fc77aca8779b102,
                0x3fe8f33a88f76c7f,
                0x3fe3196582932836,
            ],
        ),
        (
            1234,
            [
                0x3fdfd9b8b4cc41db,
                0x3fea2bbb86b3e851,
                0x3fe3966bae8e01de,
                0x3fe8aefaff3921a8,
            ],
        ),
        (
            4294967294,
            [
                0x3fba12c688854a6e,
                0x3fee552d2a10b6f0,
                0x3fea869f5731ae36,
                0x3fd7d43e4ce6e521,
            ],
        ),
    ];
    for (seed, bits) in cases {
        let mut rng = Mt19937::new(seed);
        let got: Vec<u64> = (0..4).map(|_| rng.uniform_f64().to_bits()).collect();
        assert_eq!(got, bits, "seed {seed}");
    }
}

#[test]
fn uniform_f32_matches_libstdcxx_bits() {
    let cases: [(u32, [u32; 4]); 4] = [
        (0, [0x3f0c7f0b, 0x3f17c4aa, 0x3f3716a6, 0x3f5821cd]),
        (42, [0x3ebfc3b9, 0x3f4bea3e, 0x3f736203, 0x3e3bd654]),
        (1234, [0x3e441dad, 0x3efecdc6, 0x3f1f4285, 0x3f515ddc]),
        (4294967294, [0x3f054a6e, 0x3dd09634, 0x3f05b780, 0x3f72a969]),
    ];
    for (seed, bits) in cases {
        let mut rng = Mt19937::new(seed);
        let got: Vec<u32> = (0..4).map(|_| rng.uniform_f32().to_bits()).collect();
        assert_eq!(got, bits, "seed {seed}");
    }
}

#[test]
fn uniform_draws_stay_below_one() {
    let mut rng = Mt19937::new(3);
    for _ in 0..100_000 {
        let d = rng.uniform_f64();
        assert!((0.0..1.0).contains(&d));
        let f = rng.uniform_f32();
        assert!((0.0..1.0).contains(&f));
    }
}
