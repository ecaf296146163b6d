//! One test per fault kind of the simulated disk, each stating the guarantee.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use futures_lite::future::block_on;
use narad_storage::clock::{ManualClock, SharedClock};
use narad_storage::consumer::{ConsumerConfig, ConsumerState};
use narad_storage::frame::encode_frame;
use narad_storage::io::sim::{FaultError, FaultOp, FaultRule, SimFs};
use narad_storage::limits::BLOCK_BYTES;
use narad_storage::log::{LogConfig, Message, PartitionLog};
use narad_storage::wal::{Wal, WalConfig, WalRecord};
use narad_storage::StorageError;

const RING: WalConfig = WalConfig {
    ring_bytes: 64 * 1024,
    keys_max: narad_storage::limits::IDEMPOTENCY_KEYS_PER_SHARD_MAX,
};

fn wal_dir() -> PathBuf {
    PathBuf::from("/data/wal/shard-0")
}

fn record(id: u128, value_len: usize) -> WalRecord {
    WalRecord {
        id,
        topic: "orders".into(),
        partition: 1,
        key: None,
        value: vec![b'x'; value_len],
        accept_ms: 42,
        topic_incarnation: Some(1),
        offset: None,
        idempotency: None,
        key_only: false,
    }
}

fn append_durably(wal: &Wal<SimFs>, id: u128) -> u64 {
    let appended = wal.append(&record(id, 100).as_ref()).expect("append");
    block_on(wal.flush()).expect("flush");
    assert!(appended.durable.is_durable());
    appended.pos
}

#[test]
fn fsync_eio_fails_the_wal_for_good_and_keeps_what_was_durable() {
    let fs = SimFs::new(1);
    let (wal, _) = block_on(Wal::open(&fs, &wal_dir(), RING)).expect("open");
    append_durably(&wal, 1);
    fs.inject(FaultRule::once(FaultOp::Sync, "ring.wal", FaultError::Eio));
    let doomed = wal.append(&record(2, 100).as_ref()).expect("append");
    let error = block_on(wal.flush()).expect_err("the fsync fails");
    assert_eq!(error.raw_os_error(), Some(libc::EIO));
    assert!(matches!(
        block_on(doomed.durable),
        Err(StorageError::WalFailed { .. })
    ));
    fs.clear_faults();
    assert!(
        matches!(
            wal.append(&record(3, 1).as_ref()),
            Err(StorageError::WalFailed { .. })
        ),
        "failed for good"
    );
    assert!(
        block_on(wal.flush()).is_err(),
        "a failed WAL never flushes again"
    );
    assert!(wal.failure().is_some());
    drop(wal);
    fs.power_loss();
    let (_, recovery) = block_on(Wal::open(&fs, &wal_dir(), RING)).expect("restart");
    assert!(
        recovery.records.iter().any(|r| r.record.id == 1),
        "the durable record survives"
    );
}

#[test]
fn enospc_on_a_wal_write_fails_the_wal() {
    let fs = SimFs::new(2);
    let (wal, _) = block_on(Wal::open(&fs, &wal_dir(), RING)).expect("open");
    fs.inject(FaultRule::once(
        FaultOp::Write,
        "ring.wal",
        FaultError::Enospc,
    ));
    wal.append(&record(1, 10).as_ref()).expect("append");
    let error = block_on(wal.flush()).expect_err("write fails");
    assert_eq!(error.raw_os_error(), Some(libc::ENOSPC));
    fs.clear_faults();
    assert!(matches!(
        wal.append(&record(2, 1).as_ref()),
        Err(StorageError::WalFailed { .. })
    ));
}

#[test]
fn wal_recovery_truncates_a_torn_last_record() {
    let fs = SimFs::new(3);
    let (wal, _) = block_on(Wal::open(&fs, &wal_dir(), RING)).expect("open");
    let first = append_durably(&wal, 1);
    let second = append_durably(&wal, 2);
    assert!(second > first);
    drop(wal);
    fs.crash_process();
    // A record whose header reached the disk and whose body did not.
    let torn_pos = 3 * BLOCK_BYTES;
    let mut frame = Vec::new();
    encode_frame(&mut frame, 0x4E57_414C, torn_pos, |b| {
        b.extend_from_slice(&[7u8; 300])
    });
    frame.truncate(100);
    assert!(fs.scribble(&wal_dir().join("ring.wal"), BLOCK_BYTES + torn_pos, &frame));
    let (wal, recovery) = block_on(Wal::open(&fs, &wal_dir(), RING)).expect("recover");
    assert!(recovery.torn_tail);
    assert_eq!(recovery.corrupt_records, 0);
    let ids: Vec<u128> = recovery.records.iter().map(|r| r.record.id).collect();
    assert_eq!(ids, vec![1, 2]);
    // Appends go on after the torn bytes, and recover.
    append_durably(&wal, 3);
    drop(wal);
    fs.power_loss();
    let (_, recovery) = block_on(Wal::open(&fs, &wal_dir(), RING)).expect("recover again");
    let ids: Vec<u128> = recovery.records.iter().map(|r| r.record.id).collect();
    assert_eq!(ids, vec![1, 2, 3]);
}

#[test]
fn a_damaged_wal_record_never_stops_recovery_of_later_ones() {
    let fs = SimFs::new(4);
    let (wal, _) = block_on(Wal::open(&fs, &wal_dir(), RING)).expect("open");
    let positions: Vec<u64> = (1..=3).map(|id| append_durably(&wal, id)).collect();
    drop(wal);
    fs.crash_process();
    // Flip a bit in the middle record's value.
    assert!(fs.flip_bit(
        &wal_dir().join("ring.wal"),
        BLOCK_BYTES + positions[1] + 120,
        3
    ));
    let (_, recovery) = block_on(Wal::open(&fs, &wal_dir(), RING)).expect("recover");
    let ids: Vec<u128> = recovery.records.iter().map(|r| r.record.id).collect();
    assert_eq!(
        ids,
        vec![1, 3],
        "the damaged record is never returned; the one after it is"
    );
    assert_eq!(recovery.corrupt_records, 1);
}

#[test]
fn a_full_ring_refuses_appends_until_committed_space_is_checkpointed() {
    let fs = SimFs::new(5);
    let (wal, _) = block_on(Wal::open(&fs, &wal_dir(), RING)).expect("open");
    let mut positions = Vec::new();
    let full = loop {
        match wal.append(&record(positions.len() as u128, 3000).as_ref()) {
            Ok(appended) => {
                positions.push(appended.pos);
                block_on(wal.flush()).expect("flush");
            }
            Err(error) => break error,
        }
    };
    assert!(matches!(full, StorageError::WalFull { .. }), "{full}");
    for pos in &positions {
        assert!(wal.mark_committed(*pos));
    }
    assert!(
        wal.append(&record(999, 3000).as_ref()).is_err(),
        "space returns only after a checkpoint"
    );
    assert!(block_on(wal.checkpoint(0)).expect("checkpoint"));
    wal.append(&record(999, 3000).as_ref())
        .expect("room after the checkpoint");
    block_on(wal.flush()).expect("flush");
    drop(wal);
    fs.power_loss();
    let (_, recovery) = block_on(Wal::open(&fs, &wal_dir(), RING)).expect("recover");
    let ids: Vec<u128> = recovery.records.iter().map(|r| r.record.id).collect();
    assert_eq!(
        ids,
        vec![999],
        "only the record above the checkpoint is replayed"
    );
}

fn messages(ids: std::ops::Range<u128>) -> Vec<Message> {
    ids.map(|id| Message {
        idempotency_key: None,
        id,
        produced_at_ms: 5,
        key: Some(b"k".to_vec()),
        value: vec![id as u8; 200].into(),
    })
    .collect()
}

fn log_dir() -> PathBuf {
    PathBuf::from("/data/partitions/orders/1")
}

fn open_log(fs: &SimFs, clock: &ManualClock, config: LogConfig) -> PartitionLog<SimFs> {
    let shared: SharedClock = Rc::new(clock.clone());
    block_on(PartitionLog::open(fs, &log_dir(), config, shared))
        .expect("open log")
        .0
}

fn small_log() -> LogConfig {
    LogConfig {
        segment_bytes: 64 * 1024,
        prealloc_step_bytes: 16 * 1024,
        retention_ms: 0,
    }
}

#[test]
fn a_bit_flipped_on_write_is_caught_by_the_read_back() {
    let fs = SimFs::new(6);
    let clock = ManualClock::new(1_000);
    let log = open_log(&fs, &clock, small_log());
    block_on(log.append(&messages(0..3))).expect("append");
    fs.corrupt_next_writes(".seg", 1);
    let error = block_on(log.append(&messages(3..6))).expect_err("read-back catches the flip");
    assert!(
        matches!(error, StorageError::VerifyFailed { .. }),
        "{error}"
    );
    assert_eq!(log.high_watermark(), 3, "the watermark did not move");
    let base =
        block_on(log.append(&messages(6..9))).expect("the next append goes to a new segment");
    assert_eq!(base, 3);
    assert_eq!(log.segment_count(), 2);
    drop(log);
    fs.crash_process();
    let log = open_log(&fs, &clock, small_log());
    let read = block_on(log.read(0, 100, usize::MAX)).expect("read");
    let ids: Vec<u128> = read.iter().map(|m| m.message.id).collect();
    assert_eq!(
        ids,
        vec![0, 1, 2, 6, 7, 8],
        "the failed batch is superseded"
    );
}

#[test]
fn a_bit_flip_in_a_stored_record_is_never_served_and_is_counted() {
    let fs = SimFs::new(7);
    let clock = ManualClock::new(1_000);
    let log = open_log(&fs, &clock, small_log());
    block_on(log.append(&messages(0..3))).expect("append");
    block_on(log.append(&messages(3..6))).expect("append");
    let (path, pos, _, _, _) = log.batch_extents()[0].clone();
    // Inside the second record's value of the first batch.
    let second_record_value = 40 + 3 * 8 + (32 + 1 + 200) + 32 + 1 + 50;
    assert!(fs.flip_bit(&path, pos + second_record_value, 0));
    let read = block_on(log.read(0, 100, usize::MAX)).expect("read");
    let offsets: Vec<u64> = read.iter().map(|m| m.offset).collect();
    assert_eq!(offsets, vec![0, 2, 3, 4, 5]);
    assert_eq!(log.corrupt_records_read(), 1);
    drop(log);
    fs.crash_process();
    let shared: SharedClock = Rc::new(clock.clone());
    let (log, recovery) =
        block_on(PartitionLog::open(&fs, &log_dir(), small_log(), shared)).expect("reopen");
    assert_eq!(recovery.corrupt_records, 1, "recovery counts it too");
    assert_eq!(log.high_watermark(), 6);
}

#[test]
fn enospc_on_a_segment_append_reports_an_error_and_loses_nothing() {
    let fs = SimFs::new(8);
    let clock = ManualClock::new(1_000);
    let log = open_log(&fs, &clock, small_log());
    block_on(log.append(&messages(0..2))).expect("append");
    fs.inject(FaultRule::once(FaultOp::Write, ".seg", FaultError::Enospc));
    let error = block_on(log.append(&messages(2..4))).expect_err("ENOSPC");
    assert_eq!(error.raw_os_error(), Some(libc::ENOSPC));
    assert_eq!(log.high_watermark(), 2);
    block_on(log.append(&messages(4..6))).expect("space again");
    drop(log);
    fs.power_loss();
    let log = open_log(&fs, &clock, small_log());
    let ids: Vec<u128> = block_on(log.read(0, 100, usize::MAX))
        .expect("read")
        .iter()
        .map(|m| m.message.id)
        .collect();
    assert_eq!(ids, vec![0, 1, 4, 5]);
}

#[test]
fn retention_deletes_whole_old_segments_and_segments_close_on_age() {
    let fs = SimFs::new(9);
    let clock = ManualClock::new(10_000_000);
    let hour = 3_600_000;
    let config = LogConfig {
        retention_ms: hour,
        ..small_log()
    };
    let log = open_log(&fs, &clock, config);
    block_on(log.append(&messages(0..2))).expect("append");
    clock.advance_ms(hour / 2);
    block_on(log.append(&messages(2..4))).expect("append");
    assert_eq!(
        log.segment_count(),
        2,
        "a segment closes once its first record is half a retention old"
    );
    clock.advance_ms(hour / 2);
    let outcome = block_on(log.enforce_retention()).expect("retention");
    assert_eq!(outcome.deleted_segments, 1);
    assert_eq!(outcome.log_start_offset, 2);
    clock.advance_ms(hour);
    let outcome = block_on(log.enforce_retention()).expect("retention");
    assert_eq!(outcome.deleted_segments, 1);
    assert_eq!(
        outcome.log_start_offset, 4,
        "an empty log starts at its high watermark"
    );
    drop(log);
    fs.power_loss();
    let log = open_log(&fs, &clock, config);
    assert_eq!(
        log.high_watermark(),
        4,
        "offsets are never reused after retention emptied the log"
    );
    assert_eq!(block_on(log.append(&messages(9..10))).expect("append"), 4);
}

#[test]
fn consumer_acks_reach_the_disk_on_their_intervals_and_on_flush_now() {
    let fs = SimFs::new(10);
    let clock = ManualClock::new(0);
    let shared: SharedClock = Rc::new(clock.clone());
    let dir = Path::new("/data/partitions/orders/1/consumer");
    let config = ConsumerConfig::default();
    let state = block_on(ConsumerState::open(&fs, dir, config, shared.clone())).expect("open");
    for offset in [0, 1, 2, 5] {
        state.ack(offset);
    }
    assert_eq!(state.frontier(), 3);
    assert_eq!(state.next_deadline_ms(), Some(100));
    clock.advance_ms(100);
    block_on(state.maintain()).expect("write to the OS");
    drop(state);
    fs.crash_process();
    let state = block_on(ConsumerState::open(&fs, dir, config, shared.clone())).expect("reopen");
    assert!(
        state.is_acked(5) && state.frontier() == 3,
        "acks written to the OS survive a process crash"
    );
    state.ack(3);
    clock.advance_ms(100);
    block_on(state.maintain()).expect("write");
    drop(state);
    fs.power_loss();
    let state = block_on(ConsumerState::open(&fs, dir, config, shared.clone())).expect("reopen");
    assert!(
        (3..=4).contains(&state.frontier()),
        "an ack not yet synced may or may not survive a power cut"
    );
    state.ack(3);
    clock.advance_ms(1000);
    block_on(state.maintain()).expect("write and sync");
    state.ack(4);
    block_on(state.flush_now()).expect("flush now");
    drop(state);
    fs.power_loss();
    let state = block_on(ConsumerState::open(&fs, dir, config, shared)).expect("reopen");
    assert_eq!(state.frontier(), 6, "synced acks survive a power cut");
    assert_eq!(state.skip_to_retained(10), 4);
    assert_eq!(state.frontier(), 10);
}

#[test]
fn acks_synced_into_files_a_crashed_open_left_survive_a_later_power_cut() {
    // An open creates a new generation and dies (the process crashes, or
    // its caller is gone) before it made the folder's entries durable. The
    // next open finds files in the shape it would leave and adopts them:
    // acks it then syncs must survive a power cut.
    let fs = SimFs::new(11);
    let clock = ManualClock::new(0);
    let shared: SharedClock = Rc::new(clock.clone());
    let dir = Path::new("/data/partitions/orders/1/consumer");
    let config = ConsumerConfig::default();
    fs.inject(FaultRule::once(
        FaultOp::SyncDir,
        "orders/1/consumer",
        FaultError::Eio,
    ));
    assert!(block_on(ConsumerState::open(&fs, dir, config, shared.clone())).is_err());
    fs.crash_process();
    let state = block_on(ConsumerState::open(&fs, dir, config, shared.clone())).expect("open");
    for offset in 0..4 {
        state.ack(offset);
    }
    block_on(state.flush_now()).expect("write and sync");
    drop(state);
    fs.power_loss();
    let state = block_on(ConsumerState::open(&fs, dir, config, shared)).expect("reopen");
    assert_eq!(state.frontier(), 4, "synced acks survive a power cut");
}

#[test]
fn a_failed_read_is_an_error_never_a_wrong_answer() {
    let fs = SimFs::new(11);
    let clock = ManualClock::new(1_000);
    let log = open_log(&fs, &clock, small_log());
    block_on(log.append(&messages(0..3))).expect("append");
    fs.inject(FaultRule::once(FaultOp::Read, ".seg", FaultError::Eio));
    let error = block_on(log.read(0, 10, usize::MAX)).expect_err("read fails");
    assert_eq!(error.raw_os_error(), Some(libc::EIO));
    assert_eq!(
        block_on(log.read(0, 10, usize::MAX))
            .expect("next read works")
            .len(),
        3
    );
    // A read-back that fails fails the append: the watermark stays.
    fs.inject(FaultRule::once(FaultOp::Read, ".seg", FaultError::Eio));
    assert!(block_on(log.append(&messages(3..4))).is_err());
    assert_eq!(log.high_watermark(), 3);
    // The WAL refuses to open on a failed read rather than recover part of it.
    let (wal, _) = block_on(Wal::open(&fs, &wal_dir(), RING)).expect("open");
    append_durably(&wal, 1);
    drop(wal);
    fs.crash_process();
    fs.inject(FaultRule::once(FaultOp::Read, "ring.wal", FaultError::Eio));
    assert!(block_on(Wal::open(&fs, &wal_dir(), RING)).is_err());
    let (_, recovery) = block_on(Wal::open(&fs, &wal_dir(), RING)).expect("open after the fault");
    assert_eq!(recovery.records.len(), 1);
}

#[test]
fn a_batch_that_does_not_fit_is_refused_whole() {
    let fs = SimFs::new(12);
    let (wal, _) = block_on(Wal::open(&fs, &wal_dir(), RING)).expect("open");
    let big: Vec<WalRecord> = (0..20).map(|id| record(id, 4000)).collect();
    let refs: Vec<_> = big.iter().map(WalRecord::as_ref).collect();
    let used_before = wal.stats().used_bytes;
    assert!(matches!(
        wal.append_batch(&refs),
        Err(StorageError::WalFull { .. })
    ));
    assert_eq!(wal.stats().used_bytes, used_before, "nothing was added");
    assert!(!wal.has_pending());
    let small: Vec<WalRecord> = (0..3).map(|id| record(100 + id, 10)).collect();
    let refs: Vec<_> = small.iter().map(WalRecord::as_ref).collect();
    assert_eq!(wal.append_batch(&refs).expect("fits").len(), 3);
}
