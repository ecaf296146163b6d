//! A small seeded generator (SplitMix64) for the simulated disk and the
//! simulation tests: the same seed gives the same run, on any machine.

#[derive(Debug, Clone)]
pub struct SimRng {
    state: u64,
}

impl SimRng {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "SimRng::below needs a positive bound");
        self.next_u64() % bound
    }

    /// True with probability `numerator / denominator`.
    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.below(denominator) < numerator
    }

    pub fn fill(&mut self, bytes: &mut [u8]) {
        for chunk in bytes.chunks_mut(8) {
            let word = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

/// The seeds a simulation test runs: `NARAD_SIM_SEED` names the first
/// (else the test's own) and `NARAD_SIM_ITERATIONS` how many (else the
/// test's own), so that a failure, printed with its seed, replays alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimSeeds {
    pub first: u64,
    pub iterations: u64,
}

impl SimSeeds {
    /// The run's seeds, from the environment or these defaults.
    pub fn from_env(first: u64, iterations: u64) -> Self {
        let read = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
        Self {
            first: read("NARAD_SIM_SEED").unwrap_or(first),
            iterations: read("NARAD_SIM_ITERATIONS").unwrap_or(iterations),
        }
    }

    /// Runs `run` on `count` seeds from the first. A seed that fails is
    /// printed with the command that replays it (`replay` follows
    /// `NARAD_SIM_SEED=<seed> NARAD_SIM_ITERATIONS=1`), and the failure
    /// goes on.
    pub fn run(&self, count: u64, replay: &str, mut run: impl FnMut(u64)) {
        for seed in self.first..self.first.saturating_add(count) {
            run_seed(seed, replay, &mut run);
        }
    }
}

/// Runs `run` at `seed`; a failure is printed with the command that
/// replays it (see [`SimSeeds::run`]) and goes on.
pub fn run_seed(seed: u64, replay: &str, run: impl FnOnce(u64)) {
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(seed))) {
        eprintln!(
            "simulation failed with seed {seed}; replay with NARAD_SIM_SEED={seed} \
             NARAD_SIM_ITERATIONS=1 {replay}"
        );
        std::panic::resume_unwind(panic);
    }
}
