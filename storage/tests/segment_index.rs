//! Sealed segments' indexes: opening a partition takes a sealed segment
//! from its index without reading it; a damaged, missing or stray index
//! changes nothing a reader sees.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use futures_lite::future::block_on;
use narad_storage::clock::{ManualClock, SharedClock};
use narad_storage::io::sim::SimFs;
use narad_storage::io::FileSystem;
use narad_storage::log::{LogConfig, LogRecovery, Message, PartitionLog};

fn dir() -> PathBuf {
    PathBuf::from("/data/partitions/orders/0")
}

fn config(retention_ms: u64) -> LogConfig {
    LogConfig {
        segment_bytes: 16 * 1024,
        prealloc_step_bytes: 8 * 1024,
        retention_ms,
    }
}

fn messages(ids: std::ops::Range<u128>) -> Vec<Message> {
    ids.map(|id| Message {
        idempotency_key: None,
        id,
        produced_at_ms: 5,
        key: None,
        value: vec![id as u8; 700].into(),
    })
    .collect()
}

fn open(fs: &SimFs, clock: &ManualClock, retention_ms: u64) -> (PartitionLog<SimFs>, LogRecovery) {
    open_with(fs, clock, config(retention_ms))
}

fn open_with(
    fs: &SimFs,
    clock: &ManualClock,
    config: LogConfig,
) -> (PartitionLog<SimFs>, LogRecovery) {
    let shared: SharedClock = Rc::new(clock.clone());
    block_on(PartitionLog::open(fs, &dir(), config, shared)).expect("open log")
}

fn ids(log: &PartitionLog<SimFs>) -> Vec<u128> {
    block_on(log.read(0, 10_000, usize::MAX))
        .expect("read")
        .iter()
        .map(|m| m.message.id)
        .collect()
}

fn names(fs: &SimFs, suffix: &str) -> Vec<String> {
    let mut names: Vec<String> = block_on(fs.list_dir(&dir()))
        .expect("list")
        .into_iter()
        .filter(|n| n.ends_with(suffix))
        .collect();
    names.sort();
    names
}

/// A log of several sealed segments and an active one, 60 messages in
/// batches of 3.
fn written(fs: &SimFs, clock: &ManualClock) -> PartitionLog<SimFs> {
    let (log, _) = open(fs, clock, 0);
    for start in (0..60).step_by(3) {
        block_on(log.append(&messages(start..start + 3))).expect("append");
    }
    assert!(log.segment_count() >= 4, "{} segments", log.segment_count());
    log
}

#[test]
fn a_sealed_segment_is_opened_from_its_index_without_being_read() {
    let fs = SimFs::new(1);
    let clock = ManualClock::new(1_000);
    let log = written(&fs, &clock);
    let segments = log.segment_count();
    let (path, pos, ..) = log.batch_extents()[0].clone();
    drop(log);
    fs.crash_process();
    assert_eq!(
        names(&fs, ".index").len(),
        segments - 1,
        "one per sealed segment"
    );
    // A flipped bit in the first segment's first batch: a scan at open would
    // find and count it; the index does not read the segment at all.
    assert!(fs.flip_bit(&path, pos + 100, 2));
    let (log, recovery) = open(&fs, &clock, 0);
    assert_eq!(recovery.indexed_segments, segments - 1);
    assert_eq!(
        recovery.corrupt_records, 0,
        "the sealed segments were not read"
    );
    assert_eq!(recovery.high_watermark, 60);
    // The damage is found by the read, which checks every record it serves:
    // the first message is lost, nothing else.
    let read = ids(&log);
    assert_eq!(read, (1..60).collect::<Vec<u128>>());
    assert!(log.corrupt_records_read() > 0);
    // Appends go on, and a restart finds everything again.
    block_on(log.append(&messages(60..63))).expect("append after open");
    drop(log);
    fs.crash_process();
    let (log, _) = open(&fs, &clock, 0);
    assert_eq!(ids(&log), (1..63).collect::<Vec<u128>>());
}

#[test]
fn a_damaged_or_missing_index_falls_back_to_the_scan_and_is_written_again() {
    let fs = SimFs::new(2);
    let clock = ManualClock::new(1_000);
    let log = written(&fs, &clock);
    let segments = log.segment_count();
    drop(log);
    fs.crash_process();
    let indexes = names(&fs, ".index");
    // One index damaged, one removed (as data written before indexes).
    assert!(fs.flip_bit(&dir().join(&indexes[0]), 40, 1));
    block_on(fs.remove_file(&dir().join(&indexes[1]))).expect("remove");
    let (log, recovery) = open(&fs, &clock, 0);
    assert_eq!(recovery.indexed_segments, segments - 3);
    assert_eq!(ids(&log), (0..60).collect::<Vec<u128>>());
    drop(log);
    fs.crash_process();
    let (log, recovery) = open(&fs, &clock, 0);
    assert_eq!(
        recovery.indexed_segments,
        segments - 1,
        "the scanned segments got their indexes back"
    );
    assert_eq!(ids(&log), (0..60).collect::<Vec<u128>>());
}

#[test]
fn retention_removes_a_segments_index_with_it_and_a_stray_index_goes_at_open() {
    let fs = SimFs::new(3);
    let clock = ManualClock::new(1_000);
    let (log, _) = open(&fs, &clock, 10_000);
    for start in (0..30).step_by(3) {
        block_on(log.append(&messages(start..start + 3))).expect("append");
    }
    clock.advance_ms(60_000);
    let outcome = block_on(log.enforce_retention()).expect("retention");
    assert!(outcome.deleted_segments > 0);
    let segments: Vec<String> = names(&fs, ".seg");
    for index in names(&fs, ".index") {
        let segment = index.strip_suffix(".index").expect("suffix");
        assert!(
            segments.iter().any(|s| s == segment),
            "{index} outlived its segment"
        );
    }
    drop(log);
    fs.crash_process();
    // An index left without its segment (a crash between the two removals).
    let stray = dir().join("0000000000-00000000000000000000.seg.index");
    write_file(&fs, &stray, b"left behind");
    let (log, _) = open(&fs, &clock, 10_000);
    assert!(
        !block_on(fs.exists(&stray)).expect("stat"),
        "the stray index was removed"
    );
    assert_eq!(ids(&log), Vec::<u128>::new(), "every message had aged out");
    block_on(log.append(&messages(30..33))).expect("append");
    assert_eq!(ids(&log), (30..33).collect::<Vec<u128>>());
}

fn write_file(fs: &SimFs, path: &Path, bytes: &[u8]) {
    use narad_storage::io::{OpenMode, StorageFile};
    let file = block_on(fs.open(path, OpenMode::CREATE_BUFFERED)).expect("create");
    block_on(file.write_at(bytes, 0)).expect("write");
    block_on(file.sync_data()).expect("sync");
    block_on(fs.sync_dir(&dir())).expect("sync dir");
}

#[test]
fn after_a_clean_close_the_newest_segment_is_not_rewritten_and_after_a_crash_it_is() {
    let fs = SimFs::new(4);
    let clock = ManualClock::new(1_000);
    let log = written(&fs, &clock);
    block_on(log.mark_clean()).expect("mark clean");
    drop(log);
    fs.crash_process();
    let (log, recovery) = open(&fs, &clock, 0);
    assert_eq!(
        recovery.rewritten_bytes, 0,
        "a clean close: nothing rewritten"
    );
    assert_eq!(ids(&log), (0..60).collect::<Vec<u128>>());
    // The open took the mark away: a crash now is a crash.
    block_on(log.append(&messages(60..63))).expect("append");
    drop(log);
    fs.crash_process();
    let (log, recovery) = open(&fs, &clock, 0);
    assert!(
        recovery.rewritten_bytes > 0,
        "after a crash the newest segment is rewritten"
    );
    // A mark left before further appends does not match the log: rewritten.
    block_on(log.mark_clean()).expect("mark clean");
    block_on(log.append(&messages(63..66))).expect("append after the mark");
    drop(log);
    fs.crash_process();
    let (log, recovery) = open(&fs, &clock, 0);
    assert!(recovery.rewritten_bytes > 0, "the mark was stale");
    assert_eq!(ids(&log), (0..66).collect::<Vec<u128>>());
}

#[test]
fn a_log_whose_append_failed_is_never_marked_clean() {
    use narad_storage::io::sim::{FaultError, FaultOp, FaultRule};
    let fs = SimFs::new(5);
    let clock = ManualClock::new(1_000);
    let log = written(&fs, &clock);
    fs.inject(FaultRule::once(FaultOp::Sync, ".seg", FaultError::Eio));
    assert!(block_on(log.append(&messages(60..63))).is_err());
    fs.clear_faults();
    block_on(log.append(&messages(63..66))).expect("the next append goes on");
    block_on(log.mark_clean()).expect("mark clean");
    drop(log);
    fs.crash_process();
    let (log, recovery) = open(&fs, &clock, 0);
    assert!(
        recovery.rewritten_bytes > 0,
        "not marked clean after a failed fdatasync"
    );
    let read = ids(&log);
    assert!(!read.contains(&60), "the failed batch is never served");
    assert!(read.ends_with(&[63, 64, 65]));
}

/// A segment sealed once (with its index), found again as the newest at
/// open (its successor never made it to disk), takes appends: the old index
/// no longer covers it. If the next seal then fails to write a new index,
/// the old one must not be believed.
#[test]
fn an_index_of_a_segment_that_took_appends_since_is_never_believed() {
    use narad_storage::io::sim::{FaultError, FaultOp, FaultRule};
    let fs = SimFs::new(6);
    let clock = ManualClock::new(1_000);
    let log = written(&fs, &clock);
    drop(log);
    fs.crash_process();
    // The newest segment goes, as if the roll that created it never ran:
    // the sealed, indexed one before it is the newest again.
    let segments = names(&fs, ".seg");
    let newest = segments.last().expect("segments").clone();
    block_on(fs.remove_file(&dir().join(&newest))).expect("remove");
    block_on(fs.sync_dir(&dir())).expect("sync dir");
    // Larger segments from now on (a changed `storage.segment_bytes`), so
    // the old segment has room again.
    let larger = LogConfig {
        segment_bytes: 64 * 1024,
        ..config(0)
    };
    let (log, _) = open_with(&fs, &clock, larger);
    let kept = ids(&log);
    let next = kept.last().map_or(0, |last| last + 1);
    // Appends into it, and the seal that follows fails to write its index.
    fs.inject(FaultRule::always(
        FaultOp::Write,
        ".index",
        FaultError::Enospc,
    ));
    let mut id = next;
    while log.segment_count() == segments.len() - 1 {
        block_on(log.append(&messages(id..id + 3))).expect("append");
        id += 3;
    }
    fs.clear_faults();
    drop(log);
    fs.crash_process();
    let (log, _) = open_with(&fs, &clock, larger);
    let expected: Vec<u128> = kept.iter().copied().chain(next..id).collect();
    assert_eq!(ids(&log), expected, "every appended message is there");
}
