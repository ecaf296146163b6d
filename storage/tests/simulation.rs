//! Seeded simulation of the storage engine against the simulated disk:
//! thousands of random workloads with process crashes, power losses, bit
//! flips and failing operations.
//!
//! `NARAD_SIM_ITERATIONS` (default 2000 seeds per engine part) and
//! `NARAD_SIM_SEED` (first seed) control a run; a failure prints the seed that
//! reproduces it: `NARAD_SIM_SEED=<seed> NARAD_SIM_ITERATIONS=1 cargo test -p
//! narad-storage --test simulation`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use futures_lite::future::block_on;
use narad_storage::clock::{ManualClock, SharedClock};
use narad_storage::consumer::{ConsumerConfig, ConsumerState};
use narad_storage::frame::frame_len;
use narad_storage::io::sim::SimFs;
use narad_storage::limits::BLOCK_BYTES;
use narad_storage::log::{LogConfig, Message, PartitionLog};
use narad_storage::rng::{SimRng, SimSeeds};
use narad_storage::wal::{Durable, Idempotency, Wal, WalConfig, WalRecord};

const ITERATIONS_DEFAULT: u64 = 2000;

/// Runs `run` for each seed of the run; a failure prints the seed and
/// the command that replays it.
fn for_each_seed(test: &str, run: impl Fn(u64)) {
    let seeds = SimSeeds::from_env(0x5EED_0000, ITERATIONS_DEFAULT);
    seeds.run(
        seeds.iterations,
        &format!("cargo test -p narad-storage --test simulation {test}"),
        run,
    );
}

/// Batches appended behind were synced and verified: what a crash may
/// have left at their offsets before (a write that failed) is superseded,
/// since they lie after it (in a later segment).
fn verified(
    model: &mut BTreeMap<u64, Message>,
    maybe: &mut BTreeMap<u64, Vec<Message>>,
    batches: BTreeMap<u64, Message>,
) {
    for (offset, message) in batches {
        maybe.remove(&offset);
        model.insert(offset, message);
    }
}

fn random_bytes(rng: &mut SimRng, max: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; usize::try_from(rng.below(max + 1)).unwrap_or(0)];
    rng.fill(&mut bytes);
    bytes
}

// ---------------------------------------------------------------- WAL

struct WalModel {
    /// Every record ever appended, by id.
    appended: HashMap<u128, WalRecord>,
    /// Durable and not yet committed: recovery must return these.
    must_recover: BTreeMap<u128, u64>,
    /// Durable and committed: recovery may return these.
    committed: BTreeSet<u128>,
    /// Idempotency keys of durable records, by id, with when they expire:
    /// recovery must find each until a checkpoint at or past that time.
    keys_owed: HashMap<u128, (Vec<u8>, u64)>,
}

fn wal_physical_range(pos: u64, record: &WalRecord, capacity: u64) -> (u64, u64) {
    let start = BLOCK_BYTES + pos % capacity;
    (start, start + frame_len(record.as_ref().body_len()) as u64)
}

fn wal_workload(seed: u64) {
    let mut rng = SimRng::new(seed);
    let fs = SimFs::new(seed ^ 0xD15C);
    let dir = PathBuf::from("/data/wal/shard-0");
    let capacity = (16 + rng.below(48)) * BLOCK_BYTES;
    let config = WalConfig {
        ring_bytes: capacity,
        ..WalConfig::default()
    };
    let mut model = WalModel {
        appended: HashMap::new(),
        must_recover: BTreeMap::new(),
        committed: BTreeSet::new(),
        keys_owed: HashMap::new(),
    };
    // The accepting node's clock, which keys expire by.
    let mut now_ms: u64 = 1_000;
    // Keys are owed only while no bit rot or want of room excused one.
    let mut keys_excused = false;
    let mut positions: HashMap<u128, u64> = HashMap::new();
    let mut next_id: u128 = 1;
    let (mut wal, recovery) = block_on(Wal::open(&fs, &dir, config)).expect("fresh WAL opens");
    assert!(recovery.records.is_empty());
    let mut in_flight: Vec<(u128, Durable)> = Vec::new();
    let rounds = 3 + rng.below(4);
    for _round in 0..rounds {
        let faulty = rng.chance(1, 5);
        if faulty {
            fs.set_random_failure_rate(20_000);
        }
        for _step in 0..(20 + rng.below(60)) {
            match rng.below(10) {
                0..=4 => {
                    for _ in 0..1 + rng.below(6) {
                        let record = WalRecord {
                            id: next_id,
                            topic: format!("t{}", rng.below(3)),
                            partition: u32::try_from(rng.below(8)).unwrap_or(0),
                            key: rng.chance(1, 2).then(|| random_bytes(&mut rng, 16)),
                            value: random_bytes(&mut rng, 600),
                            accept_ms: rng.below(1 << 40),
                            topic_incarnation: rng.chance(1, 2).then(|| rng.below(1 << 20)),
                            offset: None,
                            idempotency: rng.chance(1, 3).then(|| Idempotency {
                                key: random_bytes(&mut rng, 20),
                                expires_ms: now_ms + rng.below(5_000),
                            }),
                            key_only: false,
                        };
                        next_id += 1;
                        if let Ok(appended) = wal.append(&record.as_ref()) {
                            positions.insert(record.id, appended.pos);
                            in_flight.push((record.id, appended.durable));
                            model.appended.insert(record.id, record);
                        }
                    }
                }
                5..=6 => {
                    let failed_before = wal.failure().is_some();
                    let result = block_on(wal.flush());
                    if failed_before {
                        assert!(result.is_err(), "a failed WAL never flushes again");
                    }
                    in_flight.retain(|(id, durable)| {
                        if durable.is_durable() {
                            model.must_recover.insert(*id, positions[id]);
                            if let Some(key) = &model.appended[id].idempotency {
                                model
                                    .keys_owed
                                    .insert(*id, (key.key.clone(), key.expires_ms));
                            }
                            false
                        } else {
                            true
                        }
                    });
                }
                7..=8 => {
                    // The dispatcher commits durable records, in any order.
                    let ids: Vec<u128> = model.must_recover.keys().copied().collect();
                    for id in ids {
                        if rng.chance(1, 2) {
                            let pos = model.must_recover[&id];
                            assert!(
                                wal.mark_committed(pos),
                                "a durable uncommitted record can be committed"
                            );
                            model.must_recover.remove(&id);
                            model.committed.insert(id);
                        }
                    }
                }
                _ => {
                    now_ms += rng.below(500);
                    let _ = block_on(wal.checkpoint(now_ms));
                }
            }
        }
        if faulty && wal.failure().is_some() {
            fs.clear_faults();
            let probe = WalRecord {
                id: 0,
                topic: "t".into(),
                partition: 0,
                key: None,
                value: vec![],
                accept_ms: 0,
                topic_incarnation: None,
                offset: None,
                idempotency: None,
                key_only: false,
            };
            assert!(
                wal.append(&probe.as_ref()).is_err(),
                "a failed WAL stays failed after the fault is lifted"
            );
        }
        fs.clear_faults();
        // Crash: a process crash or a power loss, sometimes with bit rot.
        in_flight.clear();
        // Keys let go for want of room are not owed (small rings fill up).
        let keys_forgotten = wal.stats().keys_forgotten > 0;
        drop(wal);
        if rng.chance(1, 2) {
            fs.power_loss();
        } else {
            fs.crash_process();
        }
        let flips: Vec<u64> = (0..rng.below(3))
            .filter_map(|_| fs.flip_random_bit("ring.wal"))
            .map(|f| f.pos)
            .collect();
        let excused: BTreeSet<u128> = model
            .must_recover
            .iter()
            .filter(|(id, pos)| {
                let (start, end) = wal_physical_range(**pos, &model.appended[id], capacity);
                flips.iter().any(|f| (start..end).contains(f))
            })
            .map(|(id, _)| *id)
            .collect();
        let (reopened, recovery) = block_on(Wal::open(&fs, &dir, config)).expect("WAL recovers");
        let recovered: BTreeMap<u128, u64> = recovery
            .records
            .iter()
            .map(|r| (r.record.id, r.pos))
            .collect();
        for record in &recovery.records {
            let original = model
                .appended
                .get(&record.record.id)
                .expect("recovered record was appended");
            assert_eq!(&record.record, original, "recovered record is intact");
        }
        for (id, pos) in &model.must_recover {
            if excused.contains(id) {
                continue;
            }
            assert_eq!(
                recovered.get(id),
                Some(pos),
                "durable uncommitted record {id} recovered (seed {seed})"
            );
        }
        // Every key recovered is one a record was appended with, with its
        // id; every key of a durable record is recovered until it expired.
        let recovered_keys: HashMap<u128, &Idempotency> = recovery
            .keys
            .iter()
            .map(|(_, held)| (held.id, &held.idempotency))
            .collect();
        for (id, key) in &recovered_keys {
            let original = model.appended.get(id).expect("a key's record was appended");
            assert_eq!(
                original.idempotency.as_ref(),
                Some(*key),
                "recovered key of record {id} is intact (seed {seed})"
            );
        }
        model
            .keys_owed
            .retain(|_, (_, expires_ms)| *expires_ms > now_ms);
        keys_excused |= !flips.is_empty() || keys_forgotten;
        if !keys_excused {
            for (id, (key, _)) in &model.keys_owed {
                assert_eq!(
                    recovered_keys.get(id).map(|k| &k.key),
                    Some(key),
                    "the key of durable record {id} is recovered before it expires (seed {seed})"
                );
            }
        }
        // Recovering twice gives the same state.
        drop(reopened);
        fs.crash_process();
        let (again, recovery_again) =
            block_on(Wal::open(&fs, &dir, config)).expect("WAL recovers twice");
        assert_eq!(
            recovery_again.records, recovery.records,
            "recovery is idempotent"
        );
        assert_eq!(recovery_again.keys, recovery.keys, "so is its keys");
        wal = again;
        // Records first seen by this recovery were never acknowledged durable
        // (after a failed fsync the page cache may show writes the disk lost),
        // so only those already owed stay owed.
        model
            .must_recover
            .retain(|id, _| recovered.contains_key(id));
        model.committed.clear();
        positions = model
            .must_recover
            .iter()
            .map(|(id, pos)| (*id, *pos))
            .collect();
    }
}

#[test]
fn wal_recovers_every_durable_record_through_crashes_and_power_loss() {
    for_each_seed(
        "wal_recovers_every_durable_record_through_crashes_and_power_loss",
        wal_workload,
    );
}

// ---------------------------------------------------------------- partition log

fn log_workload(seed: u64) {
    let mut rng = SimRng::new(seed);
    let fs = SimFs::new(seed ^ 0x106);
    let clock = ManualClock::new(1_000_000);
    let shared: SharedClock = Rc::new(clock.clone());
    let dir = PathBuf::from("/data/partitions/t/0");
    let retention_ms = if rng.chance(1, 2) { 0 } else { 10_000 };
    let config = LogConfig {
        segment_bytes: (4 + rng.below(12)) * BLOCK_BYTES,
        prealloc_step_bytes: 2 * BLOCK_BYTES,
        retention_ms,
    };
    let (mut log, _) =
        block_on(PartitionLog::open(&fs, &dir, config, shared.clone())).expect("fresh log opens");
    let mut model: BTreeMap<u64, Message> = BTreeMap::new();
    // A failed append may still be found after a crash (a produce answered
    // 500 may arrive); later appends at the same offsets supersede it.
    let mut maybe: BTreeMap<u64, Vec<Message>> = BTreeMap::new();
    let mut next_id: u128 = 1;
    // Half the seeds also write batches behind (no sync until
    // `sync_behind`), drawn from a second generator so that the seeds of
    // the other half run as they always did.
    let mut behind_rng = SimRng::new(seed ^ 0xB3_41D);
    let behind_mode = behind_rng.chance(1, 2);
    // Batches written behind and not yet synced: readable, not durable.
    let mut pending: BTreeMap<u64, Message> = BTreeMap::new();
    for _round in 0..(2 + rng.below(4)) {
        if rng.chance(1, 5) {
            fs.set_random_failure_rate(30_000);
        }
        if rng.chance(1, 5) {
            fs.corrupt_next_writes(".seg", 1);
        }
        for _step in 0..(10 + rng.below(30)) {
            if behind_mode && behind_rng.chance(1, 8) {
                // The sync beside appends: what is pending written (in
                // turn), a snapshot, maybe another batch appended behind
                // meanwhile, then the sync and read-back. A failed write
                // leaves the pending messages readable and for the next
                // sync to write.
                if block_on(log.write_behind()).is_err() {
                    // A rewrite it needed failed: the log went back.
                    let hw = log.high_watermark();
                    for (offset, message) in pending.split_off(&hw) {
                        maybe.entry(offset).or_default().push(message);
                    }
                }
                if let Some(snapshot) = log.behind_snapshot() {
                    if behind_rng.chance(1, 2) {
                        next_id += 1;
                        let message = Message {
                            idempotency_key: None,
                            id: next_id,
                            produced_at_ms: clock.now_ms_for_test(),
                            key: None,
                            value: random_bytes(&mut behind_rng, 300).into(),
                        };
                        let hw_before = log.high_watermark();
                        match block_on(log.append_behind(std::slice::from_ref(&message))) {
                            Ok(base) => {
                                assert_eq!(base, hw_before);
                                pending.insert(base, message);
                            }
                            Err(_) => {
                                let hw = log.high_watermark();
                                for (offset, message) in pending.split_off(&hw) {
                                    maybe.entry(offset).or_default().push(message);
                                }
                                maybe.entry(hw).or_default().push(message);
                            }
                        }
                    }
                    match block_on(PartitionLog::<SimFs>::verify_behind(&snapshot)) {
                        Ok(true) if log.behind_verified(&snapshot) => {
                            let rest = pending.split_off(&snapshot.end_offset);
                            verified(
                                &mut model,
                                &mut maybe,
                                std::mem::replace(&mut pending, rest),
                            );
                        }
                        Ok(true) => {}
                        _ => log.behind_failed(),
                    }
                }
            }
            if behind_mode && behind_rng.chance(1, 4) {
                let r = block_on(log.sync_behind());
                match r {
                    Ok(end) => {
                        assert_eq!(end, log.high_watermark());
                        verified(&mut model, &mut maybe, std::mem::take(&mut pending));
                    }
                    Err(_) => {
                        let hw = log.high_watermark();
                        for (offset, message) in std::mem::take(&mut pending) {
                            if offset < hw {
                                model.insert(offset, message);
                            } else {
                                maybe.entry(offset).or_default().push(message);
                            }
                        }
                    }
                }
            }
            let op = rng.below(10);
            if behind_mode && op <= 5 && behind_rng.chance(1, 2) {
                let messages: Vec<Message> = (0..1 + behind_rng.below(12))
                    .map(|_| {
                        next_id += 1;
                        Message {
                            idempotency_key: None,
                            id: next_id,
                            produced_at_ms: clock.now_ms_for_test(),
                            key: None,
                            value: random_bytes(&mut behind_rng, 700).into(),
                        }
                    })
                    .collect();
                let hw_before = log.high_watermark();
                let r = block_on(log.append_behind(&messages));
                match r {
                    Ok(base) => {
                        assert_eq!(base, hw_before, "a batch starts at the high watermark");
                        assert_eq!(log.high_watermark(), base + messages.len() as u64);
                        for (offset, message) in (base..).zip(messages) {
                            pending.insert(offset, message);
                        }
                    }
                    Err(_) => {
                        // Its roll may have synced what was written behind,
                        // or, failing, left the log where those began.
                        let hw = log.high_watermark();
                        for (offset, message) in pending.split_off(&hw) {
                            maybe.entry(offset).or_default().push(message);
                        }
                        for (offset, message) in (hw..).zip(messages) {
                            maybe.entry(offset).or_default().push(message);
                        }
                    }
                }
                continue;
            }
            match op {
                0..=5 => {
                    let messages: Vec<Message> = (0..1 + rng.below(12))
                        .map(|_| {
                            next_id += 1;
                            Message {
                                idempotency_key: None,
                                id: next_id,
                                produced_at_ms: clock.now_ms_for_test(),
                                key: rng.chance(1, 3).then(|| random_bytes(&mut rng, 8)),
                                value: random_bytes(&mut rng, 700).into(),
                            }
                        })
                        .collect();
                    let hw_before = log.high_watermark();
                    // An append syncs what was written behind first.
                    let was_behind = std::mem::take(&mut pending);
                    let r = block_on(log.append(&messages));
                    match r {
                        Ok(base) => {
                            assert_eq!(base, hw_before, "a batch starts at the high watermark");
                            model.extend(was_behind);
                            maybe.split_off(&base);
                            assert_eq!(log.high_watermark(), base + messages.len() as u64);
                            for (offset, message) in (base..).zip(messages) {
                                model.insert(offset, message);
                            }
                        }
                        Err(_) => {
                            // Its sync of what was written behind kept
                            // those below where the log now ends (verified,
                            // or written again); the rest may be anywhere.
                            let hw = log.high_watermark();
                            assert!(
                                hw <= hw_before,
                                "a failed append does not move the watermark"
                            );
                            for (offset, message) in was_behind {
                                if offset < hw {
                                    model.insert(offset, message);
                                } else {
                                    maybe.entry(offset).or_default().push(message);
                                }
                            }
                            let hw_before = hw;
                            for (offset, message) in (hw_before..).zip(messages) {
                                maybe.entry(offset).or_default().push(message);
                            }
                        }
                    }
                }
                6..=7 => {
                    let from = rng.below(log.high_watermark() + 1);
                    if let Ok(read) = block_on(log.read(
                        from,
                        1 + usize::try_from(rng.below(50)).unwrap_or(1),
                        1 << 20,
                    )) {
                        for stored in read {
                            assert!(stored.offset >= from);
                            let appended =
                                model.get(&stored.offset).or(pending.get(&stored.offset));
                            assert_eq!(
                                appended,
                                Some(&stored.message),
                                "read returns what was appended (seed {seed})"
                            );
                        }
                    }
                }
                8 => clock.advance_ms(rng.below(4_000)),
                _ => {
                    let r = block_on(log.enforce_retention());
                    match r {
                        Ok(outcome) => {
                            model = model.split_off(&outcome.log_start_offset);
                            pending = pending.split_off(&outcome.log_start_offset);
                        }
                        Err(_) => {
                            // Segments it deleted before it failed stay
                            // deleted (they had expired).
                            model = model.split_off(&log.log_start_offset());
                            let hw = log.high_watermark();
                            for (offset, message) in pending.split_off(&hw) {
                                maybe.entry(offset).or_default().push(message);
                            }
                        }
                    }
                }
            }
        }
        fs.clear_faults();
        if behind_mode && behind_rng.chance(1, 2) && block_on(log.sync_behind()).is_ok() {
            verified(&mut model, &mut maybe, std::mem::take(&mut pending));
        }
        // What was written behind may or may not survive.
        for (offset, message) in std::mem::take(&mut pending) {
            maybe.entry(offset).or_default().push(message);
        }
        let extents = log.batch_extents();
        drop(log);
        if rng.chance(1, 2) {
            fs.power_loss();
        } else {
            fs.crash_process();
        }
        let flips: Vec<_> = (0..rng.below(3))
            .filter_map(|_| fs.flip_random_bit(".seg"))
            .collect();
        let mut excused: BTreeSet<u64> = BTreeSet::new();
        for flip in &flips {
            for (path, pos, len, base, count) in &extents {
                if *path == flip.path && (*pos..pos + len).contains(&flip.pos) {
                    excused.extend(*base..base + u64::from(*count));
                }
            }
        }
        let (reopened, recovery) =
            block_on(PartitionLog::open(&fs, &dir, config, shared.clone())).expect("log recovers");
        let all = block_on(reopened.read(0, usize::MAX, usize::MAX)).expect("read all");
        let got: BTreeMap<u64, Message> = all.into_iter().map(|s| (s.offset, s.message)).collect();
        for (offset, message) in &got {
            let expected = model.get(offset) == Some(message)
                || maybe
                    .get(offset)
                    .is_some_and(|candidates| candidates.contains(message));
            assert!(
                expected,
                "recovered offset {offset} holds what was appended (seed {seed}): got id {}, model {:?}, maybe {:?}",
                message.id,
                model.get(offset).map(|m| m.id),
                maybe.get(offset).map(|c| c.iter().map(|m| m.id).collect::<Vec<_>>())
            );
        }
        for offset in model.keys() {
            if !excused.contains(offset) {
                assert!(
                    got.contains_key(offset),
                    "acknowledged offset {offset} recovered (seed {seed})"
                );
            }
        }
        assert!(
            recovery.high_watermark >= model.keys().next_back().map_or(0, |o| o + 1)
                || !excused.is_empty()
        );
        // Recovering twice gives the same state.
        drop(reopened);
        fs.crash_process();
        let (again, _) = block_on(PartitionLog::open(&fs, &dir, config, shared.clone()))
            .expect("log recovers twice");
        let all_again = block_on(again.read(0, usize::MAX, usize::MAX)).expect("read all");
        assert_eq!(all_again.len(), got.len(), "recovery is idempotent");
        model = got;
        maybe.clear();
        log = again;
    }
}

trait NowForTest {
    fn now_ms_for_test(&self) -> u64;
}
impl NowForTest for ManualClock {
    fn now_ms_for_test(&self) -> u64 {
        narad_storage::clock::Clock::now_ms(self)
    }
}

#[test]
fn partition_log_keeps_every_acknowledged_batch_through_crashes_and_power_loss() {
    for_each_seed(
        "partition_log_keeps_every_acknowledged_batch_through_crashes_and_power_loss",
        log_workload,
    );
}

// ---------------------------------------------------------------- consumer state

fn consumer_workload(seed: u64) {
    let mut rng = SimRng::new(seed);
    let fs = SimFs::new(seed ^ 0xC0);
    let clock = ManualClock::new(5_000);
    let shared: SharedClock = Rc::new(clock.clone());
    let dir = Path::new("/data/partitions/t/0/consumer");
    let config = ConsumerConfig {
        ack_flush_interval_ms: 100,
        commit_interval_ms: 1000,
        compact_bytes: 256 + rng.below(2048),
    };
    let mut state =
        block_on(ConsumerState::open(&fs, dir, config, shared.clone())).expect("fresh state opens");
    let mut acked: BTreeSet<u64> = BTreeSet::new();
    let mut durable: BTreeSet<u64> = BTreeSet::new();
    let mut skipped_below = 0u64;
    for _round in 0..(2 + rng.below(4)) {
        for _step in 0..(20 + rng.below(60)) {
            match rng.below(10) {
                0..=5 => {
                    let offset = rng.below(300);
                    if state.ack(offset) {
                        acked.insert(offset);
                    }
                }
                6 => clock.advance_ms(rng.below(400)),
                7 => {
                    let _ = block_on(state.maintain());
                }
                8 => {
                    if block_on(state.flush_now()).is_ok() {
                        durable.extend(acked.iter().copied());
                    }
                }
                _ => {
                    if rng.chance(1, 4) {
                        let to = rng.below(100);
                        state.skip_to_retained(to);
                        skipped_below = skipped_below.max(to);
                    }
                }
            }
        }
        drop(state);
        if rng.chance(1, 2) {
            fs.power_loss();
        } else {
            fs.crash_process();
        }
        state = block_on(ConsumerState::open(&fs, dir, config, shared.clone()))
            .expect("state recovers");
        // Recovering twice gives the same state.
        let first = state.ack_set();
        drop(state);
        fs.crash_process();
        state = block_on(ConsumerState::open(&fs, dir, config, shared.clone()))
            .expect("state recovers twice");
        assert_eq!(
            state.ack_set(),
            first,
            "consumer recovery is idempotent (seed {seed})"
        );
        for offset in &durable {
            assert!(
                state.is_acked(*offset),
                "fsynced ack of {offset} survives (seed {seed})"
            );
        }
        for offset in 0..400 {
            if state.is_acked(offset) {
                assert!(
                    acked.contains(&offset) || offset < skipped_below,
                    "offset {offset} reported acked but never acked (seed {seed})"
                );
            }
        }
        // What recovery reports is now durable (it compacts at open).
        durable = (0..400)
            .filter(|o| state.is_acked(*o) && acked.contains(o))
            .collect();
        acked.retain(|o| state.is_acked(*o));
    }
}

#[test]
fn consumer_state_never_loses_a_synced_ack_nor_invents_one() {
    for_each_seed(
        "consumer_state_never_loses_a_synced_ack_nor_invents_one",
        consumer_workload,
    );
}

/// Seeds that once found a bug, kept so the bug stays fixed.
#[test]
fn seeds_that_found_bugs_stay_green() {
    // Empty segment from a failed roll superseding acknowledged batches.
    log_workload(1_592_590_343);
    // A damaged last batch dropped whole as a torn tail.
    log_workload(1_592_590_336);
    // fsyncgate phantom batch served after a process crash.
    log_workload(1_592_590_476);
    // A phantom batch resurfacing when bit rot destroyed its superseding batch.
    log_workload(1_592_591_598);
    log_workload(777_654);
    // A retention that failed after deleting expired segments.
    log_workload(9_026_424);
    // Batches written behind, discarded by a failed sync, then counted.
    log_workload(9_000_654);
    // A sync beside appends trusted after a failed write of its segment.
    log_workload(9_000_577);
    // A torn WAL record's extent hiding newer durable records.
    wal_workload(782_911);
    wal_workload(1_592_590_360);
}
