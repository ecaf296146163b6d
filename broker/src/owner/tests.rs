//! Tests of [`super`].

use std::path::Path;
use std::rc::Rc;

use futures_lite::future::block_on;
use narad_storage::clock::{ManualClock, Now, SharedClock};
use narad_storage::consumer::ConsumerConfig;
use narad_storage::io::sim::SimFs;
use narad_storage::log::LogConfig;

use super::*;
use narad_storage::clock::Clock;

const CONFIG: OwnerConfig = OwnerConfig {
    max_deliveries: 0,
    tail_cache_bytes: 1 << 20,
    first_lease_id: 1,
    idempotency_window_ms: 60_000,
};

fn open(fs: &SimFs, clock: &ManualClock, config: OwnerConfig) -> PartitionOwner<SimFs> {
    open_in(fs, clock, config, "/data/partitions/orders/0")
}

fn open_in(
    fs: &SimFs,
    clock: &ManualClock,
    config: OwnerConfig,
    dir: &str,
) -> PartitionOwner<SimFs> {
    let shared: SharedClock = Rc::new(clock.clone());
    let dir = Path::new(dir);
    let log_config = LogConfig {
        segment_bytes: 1 << 20,
        prealloc_step_bytes: 1 << 16,
        retention_ms: 0,
    };
    let (log, _) = block_on(PartitionLog::open(fs, dir, log_config, shared.clone())).expect("log");
    let acks = block_on(ConsumerState::open(
        fs,
        &dir.join("consumer"),
        ConsumerConfig::default(),
        shared,
    ))
    .expect("acks");
    PartitionOwner::new(log, acks, config)
}

fn messages(n: u128) -> Vec<Message> {
    (0..n)
        .map(|id| Message {
            id,
            produced_at_ms: 1,
            key: None,
            value: format!("m{id}").into_bytes().into(),
            idempotency_key: None,
        })
        .collect()
}

#[test]
fn commit_times_stay_bounded_and_keep_the_oldest() {
    let mut times = VecDeque::new();
    for commit in 0..100_000u64 {
        record_commit_time(&mut times, commit * 10, commit);
    }
    assert!(times.len() <= COMMIT_TIMES_MAX);
    assert_eq!(times.front(), Some(&(0, 0)), "the oldest batch stays");
    assert_eq!(
        times.back(),
        Some(&(999_990, 99_999)),
        "the newest is there"
    );
}

#[test]
fn committed_messages_are_leased_once_and_acked_for_good() {
    let fs = SimFs::new(1);
    let clock = ManualClock::new(1000);
    let owner = open(&fs, &clock, CONFIG);
    let version = owner.version();
    block_on(owner.commit(&messages(5), Now::at(1000))).expect("commit");
    assert_ne!(owner.version(), version, "a commit wakes long polls");
    let first = block_on(owner.consume(3, 30_000, Now::at(1000))).expect("consume");
    assert_eq!(
        first.iter().map(|d| d.offset).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    let second = block_on(owner.consume(10, 30_000, Now::at(1000))).expect("consume");
    assert_eq!(
        second.iter().map(|d| d.offset).collect::<Vec<_>>(),
        vec![3, 4],
        "no offset leased twice"
    );
    for d in first.iter().chain(&second) {
        owner
            .ack(d.offset, d.lease.lease_id, Now::at(1001))
            .expect("ack");
    }
    assert!(matches!(
        owner.ack(0, first[0].lease.lease_id, Now::at(1002)),
        Err(OwnerError::LeaseGone(_))
    ));
    assert_eq!(owner.frontier(), 5);
    assert!(block_on(owner.consume(10, 30_000, Now::at(1003)))
        .expect("consume")
        .is_empty());
    let stats = owner.stats(Now::at(1003));
    assert_eq!(
        (
            stats.high_watermark,
            stats.frontier,
            stats.available,
            stats.in_flight
        ),
        (5, 5, 0, 0)
    );
}

/// After a crash the owner's memory of recent records is gone: a commit
/// of records the WAL gave back appends again those already in the log,
/// unless the owner recalls the log's tail first.
#[test]
fn records_recovered_after_a_crash_are_appended_once_when_recalled() {
    let clock = ManualClock::new(0);
    // 300 records committed, then the owner opened again on the same disk.
    let reopened = |seed| {
        let fs = SimFs::new(seed);
        let owner = open(&fs, &clock, CONFIG);
        block_on(owner.commit(&messages(300), Now::at(0))).expect("commit before the crash");
        drop(owner);
        open(&fs, &clock, CONFIG)
    };
    let forgetful = reopened(9);
    block_on(forgetful.commit(&messages(2), Now::at(1))).expect("without recall");
    assert_eq!(
        forgetful.high_watermark(),
        302,
        "without recall: stored twice"
    );
    // The same records plus two new ones come from the WAL.
    let owner = reopened(10);
    owner.recall_before_next_append(1);
    block_on(owner.commit(&messages(302), Now::at(1))).expect("recovered");
    assert_eq!(
        owner.high_watermark(),
        302,
        "the 300 once, and the 2 new ones"
    );
    let got = block_on(owner.consume(400, 1 << 20, Now::at(2))).expect("consume");
    let ids: Vec<u128> = got.iter().map(|d| d.message.id).collect();
    assert_eq!(ids, (0..302).collect::<Vec<u128>>());
}

#[test]
fn a_commit_sent_again_appends_only_what_is_new() {
    let fs = SimFs::new(7);
    let clock = ManualClock::new(0);
    let owner = open(&fs, &clock, CONFIG);
    block_on(owner.commit(&messages(3), Now::at(0))).expect("commit");
    // The dispatcher did not hear the answer: the same batch, plus one.
    block_on(owner.commit(&messages(4), Now::at(1))).expect("again");
    assert_eq!(owner.high_watermark(), 4, "ids 0..3 once, id 3 added");
    block_on(owner.commit(&messages(4), Now::at(2))).expect("all known");
    assert_eq!(owner.high_watermark(), 4);
    let got = block_on(owner.consume(10, 1000, Now::at(3))).expect("consume");
    let ids: Vec<u128> = got.iter().map(|d| d.message.id).collect();
    assert_eq!(ids, vec![0, 1, 2, 3]);
}

#[test]
fn an_expired_lease_delivers_again_with_a_higher_count() {
    let fs = SimFs::new(2);
    let clock = ManualClock::new(0);
    let owner = open(&fs, &clock, CONFIG);
    block_on(owner.commit(&messages(1), Now::at(0))).expect("commit");
    let first = block_on(owner.consume(1, 100, Now::at(0))).expect("consume");
    assert!(block_on(owner.consume(1, 100, Now::at(100)))
        .expect("consume")
        .is_empty());
    let again = block_on(owner.consume(1, 100, Now::at(101))).expect("consume");
    assert_eq!(again[0].lease.delivery_count, 2);
    assert!(matches!(
        owner.ack(0, first[0].lease.lease_id, Now::at(102)),
        Err(OwnerError::LeaseGone(_))
    ));
    owner
        .ack(0, again[0].lease.lease_id, Now::at(102))
        .expect("current ack");
}

#[test]
fn messages_out_of_deliveries_are_parked_for_the_dead_letter_topic() {
    let fs = SimFs::new(3);
    let clock = ManualClock::new(0);
    let owner = open(
        &fs,
        &clock,
        OwnerConfig {
            max_deliveries: 2,
            ..CONFIG
        },
    );
    block_on(owner.commit(&messages(1), Now::at(0))).expect("commit");
    block_on(owner.consume(1, 10, Now::at(0))).expect("first");
    assert_eq!(
        owner.sweep(Now::at(11)).dead,
        0,
        "one delivery: redelivered"
    );
    block_on(owner.consume(1, 10, Now::at(11))).expect("second");
    assert_eq!(owner.sweep(Now::at(22)).dead, 1);
    let dead = block_on(owner.next_dead_letter())
        .expect("read")
        .expect("queued");
    assert_eq!(dead.message.value, b"m0".to_vec());
    assert!(
        block_on(owner.consume(1, 10, Now::at(23)))
            .expect("consume")
            .is_empty(),
        "parked"
    );
    // A mover dropped before it settled leaves the message queued.
    assert_eq!(
        block_on(owner.next_dead_letter())
            .expect("read")
            .map(|d| d.offset),
        Some(0)
    );
    owner.dead_lettered(0, Now::at(1000));
    assert_eq!(owner.frontier(), 1);
    assert!(!owner.has_dead_letters());
}

#[test]
fn a_nack_of_the_last_allowed_delivery_parks_the_message() {
    let fs = SimFs::new(6);
    let clock = ManualClock::new(0);
    let owner = open(
        &fs,
        &clock,
        OwnerConfig {
            max_deliveries: 2,
            ..CONFIG
        },
    );
    block_on(owner.commit(&messages(1), Now::at(0))).expect("commit");
    let first = block_on(owner.consume(1, 1000, Now::at(0))).expect("first");
    owner
        .nack(0, first[0].lease.lease_id, 0, Now::at(1))
        .expect("nack");
    assert!(!owner.has_dead_letters(), "one delivery: redelivered");
    let second = block_on(owner.consume(1, 1000, Now::at(2))).expect("second");
    assert_eq!(second[0].lease.delivery_count, 2);
    owner
        .nack(0, second[0].lease.lease_id, 0, Now::at(3))
        .expect("nack");
    assert!(
        owner.has_dead_letters(),
        "the second nack ends the last delivery"
    );
    assert!(
        block_on(owner.consume(1, 1000, Now::at(4)))
            .expect("consume")
            .is_empty(),
        "never delivered a third time"
    );
    owner.dead_letter_failed(0);
    assert_eq!(
        block_on(owner.consume(1, 1000, Now::at(5)))
            .expect("consume")
            .len(),
        1,
        "a failed move delivers it again"
    );
}

#[test]
fn nack_with_delay_and_cold_reads_from_the_log() {
    let fs = SimFs::new(4);
    let clock = ManualClock::new(0);
    let owner = open(
        &fs,
        &clock,
        OwnerConfig {
            tail_cache_bytes: 4,
            ..CONFIG
        },
    );
    block_on(owner.commit(&messages(3), Now::at(0))).expect("commit");
    let got = block_on(owner.consume(3, 1000, Now::at(0))).expect("consume from the log");
    assert_eq!(got.len(), 3);
    owner
        .nack(1, got[1].lease.lease_id, 500, Now::at(10))
        .expect("nack");
    assert!(block_on(owner.consume(3, 1000, Now::at(20)))
        .expect("consume")
        .is_empty());
    let later = block_on(owner.consume(3, 1000, Now::at(510))).expect("consume");
    assert_eq!(later.iter().map(|d| d.offset).collect::<Vec<_>>(), vec![1]);
    assert_eq!(
        owner
            .extend(1, later[0].lease.lease_id, 5000, Now::at(600))
            .ok(),
        Some(5600)
    );
}

/// A backlog past the tail cache is read from disk a batch at a time: a
/// consume of many messages of one batch reads that batch once, not once
/// per message (which made draining a large backlog a hundred times slower
/// than the disk).
#[test]
fn a_consume_past_the_cache_reads_each_batch_once() {
    let fs = SimFs::new(6);
    let clock = ManualClock::new(0);
    let owner = open(
        &fs,
        &clock,
        OwnerConfig {
            tail_cache_bytes: 4,
            ..CONFIG
        },
    );
    block_on(owner.commit(&messages(100), Now::at(0))).expect("commit");
    let before = fs.bytes_read();
    let got = block_on(owner.consume(100, 1000, Now::at(0))).expect("consume from the log");
    assert_eq!(
        got.iter().map(|d| d.offset).collect::<Vec<_>>(),
        (0..100).collect::<Vec<_>>()
    );
    assert_eq!(got[42].message.value.as_ref(), b"m42");
    let read = fs.bytes_read() - before;
    let batch = narad_storage::log::batch::encoded_len(&messages(100));
    assert!(
        read <= 2 * batch,
        "read {read} bytes from disk for one batch of {batch}"
    );
}

#[test]
fn after_a_restart_leased_messages_are_available_at_once_and_synced_acks_hold() {
    let fs = SimFs::new(5);
    let clock = ManualClock::new(0);
    let owner = open(&fs, &clock, CONFIG);
    block_on(owner.commit(&messages(3), Now::at(0))).expect("commit");
    let got = block_on(owner.consume(3, 60_000, Now::at(0))).expect("consume");
    owner
        .ack(0, got[0].lease.lease_id, Now::at(1))
        .expect("ack");
    block_on(owner.flush_acks()).expect("flush");
    drop(owner);
    fs.power_loss();
    let owner = open(&fs, &clock, CONFIG);
    let again = block_on(owner.consume(3, 60_000, Now::at(2))).expect("consume");
    assert_eq!(
        again.iter().map(|d| d.offset).collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert!(
        again.iter().all(|d| d.lease.delivery_count == 1),
        "counts restart with the owner"
    );
}

#[test]
fn a_repeated_commit_is_dropped_but_the_same_id_written_again_later_is_kept() {
    let fs = SimFs::new(11);
    let clock = ManualClock::new(1_000);
    let owner = open(&fs, &clock, CONFIG);
    let first = messages(2);
    block_on(owner.commit(&first, Now::at(1_000))).expect("commit");
    // The dispatcher sends the same records again (it missed the answer).
    block_on(owner.commit(&first, Now::at(1_001))).expect("again");
    assert_eq!(owner.high_watermark(), 2, "a repeat is not appended");
    // The same message written again by a dead-letter move or a redrive:
    // a new write of it (a new accept time), which must be kept.
    let again = vec![Message {
        produced_at_ms: 7,
        ..first[0].clone()
    }];
    block_on(owner.commit(&again, Now::at(1_002))).expect("written again");
    assert_eq!(
        owner.high_watermark(),
        3,
        "a message written again is appended"
    );
}

/// A shard's WAL for journal tests (a small ring).
fn open_wal(fs: &SimFs) -> Rc<narad_storage::wal::Wal<SimFs>> {
    let config = narad_storage::wal::WalConfig {
        ring_bytes: 64 * 1024,
        ..narad_storage::wal::WalConfig::default()
    };
    block_on(narad_storage::wal::Wal::open(
        fs,
        Path::new("/data/wal/shard-0"),
        config,
    ))
    .expect("wal")
    .0
}

/// Appends `batch` through the journal without writing journal records:
/// the base offset it got, or why it was not taken.
fn journal_base(owner: &PartitionOwner<SimFs>, batch: &[Message]) -> Result<u64, JournalError> {
    block_on(owner.journal_append(batch, Now::at(1_000), |_| Ok(Vec::new()))).map(|t| t.base)
}

/// Appends `batch` through the journal with its journal copy in `wal`.
fn journal_with_records(
    owner: &PartitionOwner<SimFs>,
    wal: &narad_storage::wal::Wal<SimFs>,
    batch: &[Message],
) -> JournalAppend {
    use narad_storage::wal::WalRecordRef;
    let taken = block_on(owner.journal_append(batch, Now::at(1_000), |base| {
        let records: Vec<WalRecordRef<'_>> = batch
            .iter()
            .zip(base..)
            .map(|(m, offset)| WalRecordRef {
                id: m.id,
                topic: "orders",
                partition: 0,
                key: None,
                value: &m.value,
                accept_ms: 1,
                topic_incarnation: Some(1),
                offset: Some(offset),
                idempotency: None,
                key_only: false,
            })
            .collect();
        wal.append_batch(&records)
    }));
    match taken {
        Ok(taken) => taken,
        Err(_) => panic!("the journal took the batch"),
    }
}

fn keyed(id: u128, key: &str) -> Message {
    Message {
        id,
        produced_at_ms: 1_000,
        key: None,
        value: format!("m{id}").into_bytes().into(),
        idempotency_key: Some(bytes::Bytes::from(key.to_string())),
    }
}

/// The age of the oldest unacked message holds across a reopen: it is
/// taken from the message at the frontier (its write time), not started
/// anew at the reopen.
#[test]
fn the_oldest_unacked_age_counts_from_the_messages_write_time_after_a_reopen() {
    let fs = SimFs::new(13);
    let clock = ManualClock::new(1_000);
    let owner = open(&fs, &clock, CONFIG);
    block_on(owner.commit(
        &[keyed(1, "a"), keyed(2, "b"), keyed(3, "c")],
        Now::at(1_000),
    ))
    .expect("commit");
    clock.advance_ms(4_000);
    assert_eq!(
        owner.stats(Now::at(clock.now_ms())).oldest_unacked_age_ms,
        4_000
    );
    drop(owner);
    fs.power_loss();
    clock.advance_ms(26_000);
    let owner = open(&fs, &clock, CONFIG);
    block_on(owner.load_oldest_unacked_time());
    let stats = owner.stats(Now::at(clock.now_ms()));
    assert_eq!((stats.frontier, stats.available), (0, 3));
    assert_eq!(
        stats.oldest_unacked_age_ms, 30_000,
        "written at 1,000, now 31,000"
    );
    // A partition with nothing unacked has no age, and reads nothing.
    let empty = open_in(&fs, &clock, CONFIG, "/data/partitions/orders/1");
    block_on(empty.load_oldest_unacked_time());
    assert_eq!(
        empty.stats(Now::at(clock.now_ms())).oldest_unacked_age_ms,
        0
    );
}

/// A copy of a key committed within the window (a retry another node
/// accepted under a new id) is not stored, also once the owner opened
/// again from its log; after the window it is.
#[test]
fn a_copy_of_a_committed_key_is_dropped_across_a_reopen_until_the_window_ends() {
    let fs = SimFs::new(12);
    let clock = ManualClock::new(1_000);
    let owner = open(&fs, &clock, CONFIG);
    let first =
        block_on(owner.commit(&[keyed(1, "a"), keyed(2, "b")], Now::at(1_000))).expect("commit");
    assert_eq!(first.duplicates, 0);
    let again =
        block_on(owner.commit(&[keyed(3, "a"), keyed(4, "c")], Now::at(1_001))).expect("again");
    assert_eq!((again.base, again.duplicates), (2, 1));
    assert_eq!(owner.high_watermark(), 3, "only c was stored");
    drop(owner);
    fs.power_loss();
    clock.advance_ms(30_000);
    let owner = open(&fs, &clock, CONFIG);
    block_on(owner.load_idempotency_keys(clock.now_ms())).expect("keys");
    let retry = block_on(owner.commit(&[keyed(5, "b"), keyed(6, "c")], Now::at(clock.now_ms())))
        .expect("retry");
    assert_eq!(retry.duplicates, 2, "the keys came back from the log");
    assert_eq!(owner.high_watermark(), 3);
    // Past the window (60 s from each first commit) a key is new again.
    clock.advance_ms(31_000);
    let owner = {
        drop(owner);
        open(&fs, &clock, CONFIG)
    };
    block_on(owner.load_idempotency_keys(clock.now_ms())).expect("keys");
    let late = block_on(owner.commit(&[keyed(7, "a")], Now::at(clock.now_ms()))).expect("late");
    assert_eq!(late.duplicates, 0);
    assert_eq!(owner.high_watermark(), 4);
    let read = block_on(owner.read(0, 10, usize::MAX)).expect("read");
    let ids: Vec<u128> = read.iter().map(|s| s.message.id).collect();
    assert_eq!(ids, vec![1, 2, 4, 7]);
}

/// A batch through the journal stays invisible until its journal copy is
/// durable, and its WAL records are released only once the log's own copy
/// was synced and read back.
#[test]
fn a_journal_batch_shows_once_durable_and_its_records_go_once_the_log_verified_it() {
    let fs = SimFs::new(5);
    let clock = ManualClock::new(1_000);
    let owner = open(&fs, &clock, CONFIG);
    let wal = open_wal(&fs);
    owner.use_journal(wal.clone());
    let batch = messages(3);
    let taken = journal_with_records(&owner, &wal, &batch);
    assert_eq!(taken.base, 0);
    assert_eq!(
        owner.high_watermark(),
        0,
        "invisible before its copy is durable"
    );
    assert!(block_on(owner.consume(10, 1_000, Now::at(1_000)))
        .expect("consume")
        .is_empty());
    block_on(wal.flush()).expect("flush");
    owner.journal_durable(taken.base, taken.appended.iter().map(|a| a.pos).collect());
    assert_eq!(owner.high_watermark(), 3, "visible once durable");
    assert_eq!(
        wal.stats().uncommitted_records,
        3,
        "held until the log verified its copy"
    );
    assert!(owner.journal_waiting());
    block_on(owner.sync_journal()).expect("sync");
    assert_eq!(wal.stats().uncommitted_records, 0, "released once verified");
    assert!(!owner.journal_waiting());
    assert_eq!(
        block_on(owner.consume(10, 1_000, Now::at(1_000)))
            .expect("consume")
            .len(),
        3
    );
}

/// A freeze for a handover waits for batches written behind whose journal
/// copy is not durable yet: what it answers (the high watermark) covers all
/// the log holds, so the copy a move installs ends where the source said.
#[test]
fn a_freeze_waits_for_journal_batches_written_behind_to_become_visible() {
    for durable in [true, false] {
        freeze_with_a_journal_batch_written_behind(durable);
    }
}

/// The journal copy becomes `durable`, or fails (the WAL failed).
fn freeze_with_a_journal_batch_written_behind(durable: bool) {
    use std::cell::Cell;

    let fs = SimFs::new(6);
    let clock = ManualClock::new(1_000);
    let owner = open(&fs, &clock, CONFIG);
    let wal = open_wal(&fs);
    owner.use_journal(wal.clone());
    let batch = messages(3);
    let taken = journal_with_records(&owner, &wal, &batch);
    assert_eq!(
        owner.high_watermark(),
        0,
        "invisible before its copy is durable"
    );
    let answered = Cell::new(None);
    block_on(futures_lite::future::zip(
        async {
            owner.freeze().await;
            answered.set(Some(owner.high_watermark()));
        },
        async {
            for _ in 0..10 {
                futures_lite::future::yield_now().await;
            }
            if durable {
                wal.flush().await.expect("flush");
                owner.journal_durable(taken.base, taken.appended.iter().map(|a| a.pos).collect());
            } else {
                owner.journal_failed(taken.base);
            }
        },
    ));
    assert_eq!(
        answered.get(),
        Some(3),
        "the frozen partition's end covers the batch its log holds"
    );
    if durable {
        assert_eq!(
            wal.stats().uncommitted_records,
            0,
            "the freeze verified the log's copy and released the journal's"
        );
    }
    assert!(!owner.journal_waiting());
}

/// Keyed messages through the journal: a batch holding a key the partition
/// holds is refused (it takes the usual path); a commit carrying another
/// copy of a key a journal batch took before its copy was durable drops
/// that copy, and a power cut just after keeps the first (the commit
/// synced it before it judged).
#[test]
fn a_journal_batch_with_keys_is_judged_and_its_keys_drop_later_copies_safely() {
    let fs = SimFs::new(9);
    let clock = ManualClock::new(1_000);
    let owner = open(&fs, &clock, CONFIG);
    owner.use_journal(open_wal(&fs));
    let journal = |batch: &[Message]| journal_base(&owner, batch);
    assert!(matches!(journal(&[keyed(1, "a"), keyed(2, "b")]), Ok(0)));
    assert!(
        matches!(journal(&[keyed(3, "a")]), Err(JournalError::Refused)),
        "a copy of a key the partition holds"
    );
    assert!(
        matches!(
            journal(&[keyed(4, "c"), keyed(5, "c")]),
            Err(JournalError::Refused)
        ),
        "one key twice in a batch"
    );
    // Only the copy: the commit appends nothing of its own.
    let again = block_on(owner.commit(&[keyed(6, "a")], Now::at(1_001))).expect("commit");
    assert_eq!(again.duplicates, 1, "the journal batch's key held");
    drop(owner);
    fs.power_loss();
    let owner = open(&fs, &clock, CONFIG);
    let read = block_on(owner.read(0, 10, usize::MAX)).expect("read");
    let ids: Vec<u128> = read.iter().map(|s| s.message.id).collect();
    assert_eq!(ids, vec![1, 2], "the first copy outlived the power cut");
    block_on(owner.load_idempotency_keys(clock.now_ms())).expect("keys");
    let retry = block_on(owner.commit(&[keyed(8, "b")], Now::at(clock.now_ms()))).expect("retry");
    assert_eq!(
        retry.duplicates, 1,
        "the journal batch's keys came back from the log"
    );
}

/// A log that loses a journal batch written behind (its write fails, and
/// so does the synced append of the next batch) breaks the journal: a
/// later commit is refused rather than judged against the lost batch's
/// keys, which would drop a retry of a message the log no longer holds.
#[test]
fn a_log_that_went_back_under_a_failed_journal_append_breaks_the_journal() {
    use narad_storage::io::sim::{FaultError, FaultOp, FaultRule};

    let fs = SimFs::new(21);
    let clock = ManualClock::new(1_000);
    let owner = open(&fs, &clock, CONFIG);
    owner.use_journal(open_wal(&fs));
    let journal = |batch: &[Message]| journal_base(&owner, batch);
    assert!(matches!(journal(&[keyed(1, "a")]), Ok(0)));
    // The next batch does not fit beside the first in one write: writing
    // the first fails, and so does the synced append that follows.
    fs.inject(FaultRule::always(
        FaultOp::Write,
        "partitions/orders/0",
        FaultError::Eio,
    ));
    let big = Message {
        value: vec![5u8; 1_100_000].into(),
        ..keyed(2, "b")
    };
    assert!(matches!(
        journal(&[big]),
        Err(JournalError::LogFailed { .. })
    ));
    fs.clear_faults();
    let lost = owner.high_watermark() == 0
        && block_on(owner.read(0, 10, usize::MAX)).map_or(true, |r| r.is_empty());
    assert!(lost, "the log lost the first batch in this failure");
    // A retry of the first message, from another node.
    let retry = block_on(owner.commit(&[keyed(3, "a")], Now::at(1_001)));
    assert!(
        retry.is_err(),
        "a commit judged against a batch the log lost: {retry:?}"
    );
}

/// Browsing changes nothing: two owners get the same commits, consumes,
/// acks, nacks and sweeps, and one of them is also browsed from random
/// offsets between every step. What each consume gets (offsets, messages,
/// lease ids, so receipts, and delivery counts), what each settle answers,
/// and the figures at the end are the same; and what a browse shows of each
/// message (acked, leased, available; its delivery count) is what the
/// operations made of it.
#[test]
fn browsing_never_changes_what_a_consume_then_gets_its_receipts_or_delivery_counts() {
    use narad_net::types::MessageState;
    use narad_storage::rng::SimRng;
    use std::collections::{BTreeMap, BTreeSet};

    for seed in 0..60u64 {
        let clock = ManualClock::new(1_000);
        let (fs_plain, fs_browsed) = (SimFs::new(seed), SimFs::new(seed));
        let plain = open(&fs_plain, &clock, CONFIG);
        let browsed = open(&fs_browsed, &clock, CONFIG);
        let mut rng = SimRng::new(seed);
        let mut next_id: u128 = 0;
        // What the operations made of each offset.
        let mut acked: BTreeSet<u64> = BTreeSet::new();
        let mut leased: BTreeMap<u64, (u64, u64)> = BTreeMap::new(); // offset -> (lease id, expiry)
        let mut deliveries: BTreeMap<u64, u32> = BTreeMap::new();
        for step in 0..150 {
            let now = clock.now_ms();
            match rng.below(6) {
                0 | 1 => {
                    let n = 1 + rng.below(8) as u128;
                    let batch: Vec<Message> = (next_id..next_id + n)
                        .map(|id| Message {
                            id,
                            produced_at_ms: now,
                            key: (id % 3 == 0).then(|| format!("k{id}").into_bytes()),
                            value: format!("value {id}").into_bytes().into(),
                            idempotency_key: None,
                        })
                        .collect();
                    next_id += n;
                    let a = block_on(plain.commit(&batch, Now::at(now))).expect("commit");
                    let b = block_on(browsed.commit(&batch, Now::at(now))).expect("commit");
                    assert_eq!(a, b, "seed {seed} step {step}");
                }
                2 => {
                    let (max, visibility) = (1 + rng.below(6) as usize, 1 + rng.below(3_000));
                    let a =
                        block_on(plain.consume(max, visibility, Now::at(now))).expect("consume");
                    let b =
                        block_on(browsed.consume(max, visibility, Now::at(now))).expect("consume");
                    assert_eq!(a, b, "seed {seed} step {step}: a consume after browses");
                    for d in &a {
                        leased.insert(d.offset, (d.lease.lease_id, d.lease.expires_at_ms));
                        *deliveries.entry(d.offset).or_default() += 1;
                    }
                }
                3 | 4 => {
                    let Some((&offset, &(lease_id, _))) = leased
                        .iter()
                        .nth(rng.below(leased.len().max(1) as u64) as usize)
                    else {
                        continue;
                    };
                    let ack = rng.chance(1, 2);
                    let settle = |owner: &PartitionOwner<SimFs>| {
                        if ack {
                            owner.ack(offset, lease_id, Now::at(now)).is_ok()
                        } else {
                            owner.nack(offset, lease_id, 0, Now::at(now)).is_ok()
                        }
                    };
                    let (a, b) = (settle(&plain), settle(&browsed));
                    assert_eq!(a, b, "seed {seed} step {step}: a settle after browses");
                    leased.remove(&offset);
                    if a && ack {
                        acked.insert(offset);
                    }
                }
                _ => {
                    clock.advance_ms(rng.below(2_000));
                    let now = clock.now_ms();
                    assert_eq!(
                        plain.sweep(Now::at(now)),
                        browsed.sweep(Now::at(now)),
                        "seed {seed} step {step}"
                    );
                    leased.retain(|_, (_, expires)| *expires >= now);
                }
            }
            // Browse the second owner a few times, anywhere.
            let now = clock.now_ms();
            for _ in 0..3 {
                let from = rng.below(browsed.high_watermark() + 2);
                let limit = 1 + rng.below(20) as usize;
                let page =
                    block_on(browsed.browse(from, limit, 1 << 20, Now::at(now))).expect("browse");
                assert!(page.len() <= limit);
                for (stored, state, count) in &page {
                    let offset = stored.offset;
                    assert!(offset >= from && offset < browsed.high_watermark());
                    assert_eq!(
                        stored.message.value,
                        format!("value {}", stored.message.id).into_bytes()
                    );
                    let expected = if acked.contains(&offset) {
                        MessageState::Acked
                    } else if leased.get(&offset).is_some_and(|(_, e)| *e >= now) {
                        MessageState::Leased
                    } else {
                        MessageState::Available
                    };
                    assert_eq!(*state, expected, "seed {seed} step {step}: offset {offset}");
                    // An acked message's count is not kept.
                    let deliveries_now = if acked.contains(&offset) {
                        0
                    } else {
                        deliveries.get(&offset).copied().unwrap_or(0)
                    };
                    assert_eq!(
                        *count, deliveries_now,
                        "seed {seed} step {step}: deliveries of {offset}"
                    );
                }
            }
        }
        let now = clock.now_ms();
        assert_eq!(
            plain.stats(Now::at(now)),
            browsed.stats(Now::at(now)),
            "seed {seed}"
        );
        let rest_a = block_on(plain.consume(10_000, 1_000, Now::at(now))).expect("consume");
        let rest_b = block_on(browsed.consume(10_000, 1_000, Now::at(now))).expect("consume");
        assert_eq!(rest_a, rest_b, "seed {seed}: what is left");
    }
}

/// An interval of the rates ends with the backlog it left, not with what
/// the event that closes it (the next interval's first) changed.
#[test]
fn an_interval_of_the_rates_ends_with_the_backlog_before_the_next_ones_first_event() {
    let fs = SimFs::new(1);
    let clock = ManualClock::new(1_000_000);
    let owner = open(&fs, &clock, CONFIG);
    block_on(owner.commit(&messages(10), Now::at(1_000_000))).expect("commit");
    let leased = block_on(owner.consume(2, 60_000, Now::at(1_000_000))).expect("consume");
    // The next interval opens with a commit, an ack and a dead letter's end.
    let next = 1_000_000 + crate::rates::RATE_INTERVAL_MS;
    let fresh: Vec<Message> = messages(15).into_iter().skip(10).collect();
    block_on(owner.commit(&fresh, Now::at(next))).expect("commit");
    owner
        .ack(leased[0].offset, leased[0].lease.lease_id, Now::at(next))
        .expect("ack");
    let points = owner.rate_points(Now::at(next));
    assert_eq!(points.len(), 2);
    assert_eq!(
        (points[0].produced, points[0].available, points[0].in_flight),
        (10, 8, 2)
    );
    assert_eq!((points[1].produced, points[1].acked), (5, 1));
    assert_eq!((points[1].available, points[1].in_flight), (13, 1));
}
