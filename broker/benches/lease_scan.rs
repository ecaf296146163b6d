//! `cargo bench -p narad-broker --bench lease_scan`: what one consume's search
//! for available offsets (`LeaseTable::available`, `max` = 100) costs on a
//! partition with a 10,000,000-message backlog (high watermark − frontier):
//! - `fresh`: nothing leased or acked above the frontier;
//! - `stranded`: the consumers worked through the backlog past one message
//!   that was leased and never acked, so the frontier is stuck at it with
//!   9,998,999 acked offsets above; the last 1,000 are still to deliver.
//!
//! Beside `available` it times `scan`, the search `available` did before:
//! every offset from the frontier up, one by one, until `max` are found.
//! Prints the median time of one call of each in each case, and the ratios.
//! Pure CPU, in memory: no disk, no node.

use std::hint::black_box;
use std::time::{Duration, Instant};

use narad_broker::leases::LeaseTable;
use narad_storage::consumer::AckSet;

/// The same allocator as `narad`: the returned batch is one allocation.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BACKLOG: u64 = 10_000_000;
const STILL_TO_DELIVER: u64 = 1_000;
const MAX: usize = 100;
const NOW_MS: u64 = 1_000;
const SAMPLES: usize = 31;
/// Each sample repeats the call until it has run at least this long.
const SAMPLE_TIME: Duration = Duration::from_millis(20);

struct Case {
    name: &'static str,
    table: LeaseTable,
    acks: AckSet,
    expected_first: u64,
}

fn fresh() -> Case {
    Case {
        name: "fresh",
        table: LeaseTable::new(),
        acks: AckSet::new(0),
        expected_first: 0,
    }
}

fn stranded() -> Case {
    let mut table = LeaseTable::new();
    let mut acks = AckSet::new(0);
    // Offset 0 was leased for a long time and never acked; every other
    // offset up to the last STILL_TO_DELIVER was delivered and acked.
    table.lease(0, 0, u64::MAX / 2);
    for offset in 1..BACKLOG - STILL_TO_DELIVER {
        acks.ack(offset);
    }
    assert_eq!(acks.frontier(), 0);
    Case {
        name: "stranded",
        table,
        acks,
        expected_first: BACKLOG - STILL_TO_DELIVER,
    }
}

type Search = fn(&Case) -> Vec<u64>;

fn available(case: &Case) -> Vec<u64> {
    case.table
        .available(case.acks.frontier(), BACKLOG, MAX, NOW_MS, |offset| {
            case.acks.unacked_run(offset)
        })
}

/// The search `available` did before: every offset, one by one.
fn scan(case: &Case) -> Vec<u64> {
    (case.acks.frontier()..BACKLOG)
        .filter(|offset| !case.acks.is_acked(*offset) && case.table.is_available(*offset, NOW_MS))
        .take(MAX)
        .collect()
}

fn check(search: Search, case: &Case) {
    let found = search(case);
    assert_eq!(found.len(), MAX, "{}: a full batch", case.name);
    assert_eq!(
        found.first().copied(),
        Some(case.expected_first),
        "{}",
        case.name
    );
}

/// Nanoseconds per call over `iterations` calls.
fn sample(search: Search, case: &Case, iterations: u64) -> f64 {
    let started = Instant::now();
    for _ in 0..iterations {
        black_box(search(black_box(case)));
    }
    started.elapsed().as_nanos() as f64 / iterations as f64
}

/// Enough calls for one sample to last [`SAMPLE_TIME`].
fn calibrate(search: Search, case: &Case) -> u64 {
    let mut iterations = 1;
    while sample(search, case, iterations) * (iterations as f64) < SAMPLE_TIME.as_nanos() as f64 {
        iterations *= 2;
    }
    iterations
}

fn main() {
    // `cargo bench` passes `--bench`; without it (`cargo test --benches`)
    // only the answers in the fresh case are checked.
    let full = std::env::args().any(|a| a == "--bench");
    let fresh = fresh();
    check(available, &fresh);
    check(scan, &fresh);
    if !full {
        return;
    }
    let cases = [fresh, stranded()];
    let searches: [(&str, Search); 2] = [("available", available), ("scan", scan)];
    let runs: Vec<(&str, Search, &Case, u64)> = searches
        .iter()
        .flat_map(|(name, search)| {
            cases.iter().map(|case| {
                check(*search, case);
                (*name, *search, case, calibrate(*search, case))
            })
        })
        .collect();
    // The runs take turns, so that load from elsewhere on the machine falls
    // on all of them alike.
    let mut samples = vec![Vec::with_capacity(SAMPLES); runs.len()];
    for _ in 0..SAMPLES {
        for ((_, search, case, iterations), samples) in runs.iter().zip(&mut samples) {
            samples.push(sample(*search, case, *iterations));
        }
    }
    println!("max {MAX}, backlog {BACKLOG}");
    let mut medians = Vec::new();
    for ((name, _, case, iterations), samples) in runs.iter().zip(&mut samples) {
        samples.sort_by(f64::total_cmp);
        let median = samples[SAMPLES / 2];
        println!(
            "{name:<9} {:<8} median {:>12.0} ns/call  (min {:.0}, max {:.0}; {SAMPLES} samples of {iterations} calls)",
            case.name,
            median,
            samples[0],
            samples[SAMPLES - 1],
        );
        medians.push(median);
    }
    for (i, (name, _)) in searches.iter().enumerate() {
        println!(
            "{name:<9} stranded / fresh = {:.2}",
            medians[2 * i + 1] / medians[2 * i]
        );
    }
}
