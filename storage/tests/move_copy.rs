//! A partition log copied segment by segment while its source keeps
//! appending (as a partition's move does) opens at the destination with
//! every message at its offset, and appends go on from the same offset.

use std::path::PathBuf;
use std::rc::Rc;

use futures_lite::future::block_on;
use narad_storage::clock::{ManualClock, SharedClock};
use narad_storage::consumer::{write_initial, AckSet, ConsumerConfig, ConsumerState};
use narad_storage::io::sim::SimFs;
use narad_storage::io::FileSystem;
use narad_storage::limits::BLOCK_BYTES;
use narad_storage::log::copy::{sync_copied, write_copied, CopyProgress, VerifiedCopy};
use narad_storage::log::{LogConfig, Message, PartitionLog};

fn messages(from: u128, count: u128) -> Vec<Message> {
    (from..from + count)
        .map(|id| Message {
            idempotency_key: None,
            id,
            produced_at_ms: 1_000,
            key: None,
            value: vec![u8::try_from(id % 251).expect("ok"); 900].into(),
        })
        .collect()
}

fn copy_round(
    fs: &SimFs,
    source: &PartitionLog<SimFs>,
    to: &std::path::Path,
    progress: &mut CopyProgress,
) {
    copy_round_in(fs, source, to, progress, 2 * BLOCK_BYTES);
}

fn copy_round_in(
    fs: &SimFs,
    source: &PartitionLog<SimFs>,
    to: &std::path::Path,
    progress: &mut CopyProgress,
    chunk: u64,
) {
    let extents = source.segment_extents();
    for name in progress.drop_stale(&extents) {
        block_on(fs.remove_file(&to.join(name))).expect("ok");
    }
    while let Some(read) = progress.next_read(&extents, chunk) {
        let bytes = block_on(source.read_segment(&read.name, read.pos, read.len)).expect("ok");
        assert!(!bytes.is_empty());
        block_on(write_copied(fs, to, &read.name, read.pos, &bytes)).expect("ok");
        progress.record(&read.name, read.pos, bytes.len() as u64);
    }
}

#[test]
fn a_log_copied_while_it_grows_opens_whole_at_its_destination() {
    let fs = SimFs::new(7);
    let clock: SharedClock = Rc::new(ManualClock::new(1_000_000));
    let config = LogConfig {
        segment_bytes: 8 * BLOCK_BYTES,
        prealloc_step_bytes: 2 * BLOCK_BYTES,
        retention_ms: 0,
    };
    let from = PathBuf::from("/a/partitions/t-1/0");
    let to = PathBuf::from("/b/partitions/t-1/0.incoming");
    let (source, _) = block_on(PartitionLog::open(&fs, &from, config, clock.clone())).expect("ok");
    block_on(fs.create_dir_all(&to)).expect("ok");
    let mut progress = CopyProgress::default();
    let mut id = 1;
    for round in 0..5 {
        for _ in 0..(3 + round) {
            block_on(source.append(&messages(id, 3))).expect("ok");
            id += 3;
        }
        copy_round(&fs, &source, &to, &mut progress);
    }
    assert!(
        source.segment_count() > 2,
        "the copy spans several segments"
    );
    assert_eq!(progress.remaining(&source.segment_extents()), 0);
    block_on(sync_copied(&fs, &to, progress.names())).expect("ok");
    let mut acks = AckSet::new(4);
    acks.ack(10);
    acks.ack(11);
    let decoded = AckSet::decode(&acks.encode()).expect("the ack set survives its bytes");
    assert_eq!(decoded, acks);
    block_on(write_initial(&fs, &to.join("consumer"), &decoded)).expect("ok");

    let (copy, recovery) =
        block_on(PartitionLog::open(&fs, &to, config, clock.clone())).expect("ok");
    assert_eq!(recovery.corrupt_records, 0);
    assert_eq!(copy.high_watermark(), source.high_watermark());
    let all = block_on(copy.read(0, 10_000, usize::MAX)).expect("ok");
    let expected = block_on(source.read(0, 10_000, usize::MAX)).expect("ok");
    assert_eq!(all.len(), expected.len());
    assert!(all.iter().zip(&expected).all(|(a, b)| a == b));
    // A tool reads the same messages from the files alone.
    let mut files = Vec::new();
    for name in progress.names() {
        let file = block_on(fs.open(
            &to.join(name),
            narad_storage::io::OpenMode::EXISTING_BUFFERED,
        ))
        .expect("open");
        let bytes =
            block_on(narad_storage::io::StorageFile::read_at(&file, 0, 1 << 20)).expect("read");
        files.push((name.to_string(), bytes));
    }
    let read = narad_storage::log::messages_in_segments(
        files.iter().map(|(n, b)| (n.as_str(), b.as_slice())),
    );
    assert_eq!(read, expected, "the files alone hold every message");
    // Appends go on from the source's next offset.
    let next = block_on(copy.append(&messages(id, 1))).expect("ok");
    assert_eq!(next, source.high_watermark());
    let consumer = block_on(ConsumerState::open(
        &fs,
        &to.join("consumer"),
        ConsumerConfig::default(),
        clock,
    ))
    .expect("ok");
    assert_eq!(consumer.frontier(), 4);
    assert!(consumer.is_acked(10) && consumer.is_acked(11) && !consumer.is_acked(5));
}

#[test]
fn a_copy_verified_while_it_grows_opens_without_reading_it_again_and_damage_is_still_found() {
    let fs = SimFs::new(11);
    let clock: SharedClock = Rc::new(ManualClock::new(1_000_000));
    let config = LogConfig {
        segment_bytes: 16 * BLOCK_BYTES,
        prealloc_step_bytes: 2 * BLOCK_BYTES,
        retention_ms: 0,
    };
    let from = PathBuf::from("/a/partitions/t-1/0");
    let to = PathBuf::from("/b/partitions/t-1/0.incoming");
    let (source, _) = block_on(PartitionLog::open(&fs, &from, config, clock.clone())).expect("ok");
    block_on(fs.create_dir_all(&to)).expect("ok");
    let mut progress = CopyProgress::default();
    let mut verified = VerifiedCopy::default();
    let mut id = 1;
    for round in 0..6 {
        // Batches of two and three blocks, copied three blocks at a time:
        // chunks end inside batches.
        for _ in 0..(2 + round) {
            block_on(source.append(&messages(id, 5 + (round % 2) * 4))).expect("ok");
            id += 5 + (round % 2) * 4;
        }
        copy_round_in(&fs, &source, &to, &mut progress, 3 * BLOCK_BYTES);
        block_on(sync_copied(&fs, &to, progress.names())).expect("ok");
        block_on(verified.verify(&fs, &to, &progress)).expect("ok");
    }
    assert!(source.segment_count() > 2, "several segments");
    assert_eq!(
        verified.verified_bytes(),
        progress.copied_bytes(),
        "every copied byte read back and checked"
    );
    let expected = block_on(source.read(0, 10_000, usize::MAX)).expect("ok");
    let (copy, recovery) = block_on(PartitionLog::open_copy(
        &fs,
        &to,
        config,
        clock.clone(),
        &verified,
    ))
    .expect("ok");
    assert_eq!(recovery.corrupt_records, 0);
    assert_eq!(copy.high_watermark(), source.high_watermark());
    let all = block_on(copy.read(0, 10_000, usize::MAX)).expect("ok");
    assert_eq!(
        all, expected,
        "the verified copy serves what the source holds"
    );
    drop(copy);

    // A copy damaged before it was verified: the damaged segment is left
    // to the open's recovery, which finds it and keeps every valid record.
    let damaged_dir = PathBuf::from("/b/partitions/t-1/1.incoming");
    block_on(fs.create_dir_all(&damaged_dir)).expect("ok");
    let mut damaged = CopyProgress::default();
    copy_round_in(&fs, &source, &damaged_dir, &mut damaged, 3 * BLOCK_BYTES);
    let first = damaged.names().next().expect("a segment").to_string();
    let file = block_on(fs.open(
        &damaged_dir.join(&first),
        narad_storage::io::OpenMode::EXISTING_BUFFERED,
    ))
    .expect("open");
    // A byte inside the first batch's records.
    block_on(narad_storage::io::StorageFile::write_at(
        &file,
        &[0xFF; 8],
        BLOCK_BYTES + 1024,
    ))
    .expect("write");
    block_on(sync_copied(&fs, &damaged_dir, damaged.names())).expect("ok");
    let mut checked = VerifiedCopy::default();
    block_on(checked.verify(&fs, &damaged_dir, &damaged)).expect("ok");
    assert!(checked.verified_bytes() < damaged.copied_bytes());
    let (copy, recovery) = block_on(PartitionLog::open_copy(
        &fs,
        &damaged_dir,
        config,
        clock,
        &checked,
    ))
    .expect("ok");
    assert!(recovery.corrupt_records > 0, "{recovery:?}");
    assert_eq!(copy.high_watermark(), source.high_watermark());
    let served = block_on(copy.read(0, 10_000, usize::MAX)).expect("ok");
    assert!(served.len() < expected.len());
    assert!(served.iter().all(|m| expected.contains(m)));
}

#[test]
fn a_copy_cut_short_inside_a_batch_opens_at_the_end_of_its_last_whole_batch() {
    let fs = SimFs::new(13);
    let clock: SharedClock = Rc::new(ManualClock::new(1_000_000));
    let config = LogConfig {
        segment_bytes: 64 * BLOCK_BYTES,
        prealloc_step_bytes: 2 * BLOCK_BYTES,
        retention_ms: 0,
    };
    let from = PathBuf::from("/a/partitions/t-1/0");
    let to = PathBuf::from("/b/partitions/t-1/0.incoming");
    let (source, _) = block_on(PartitionLog::open(&fs, &from, config, clock.clone())).expect("ok");
    block_on(fs.create_dir_all(&to)).expect("ok");
    // Batches of three blocks (nine messages of 900 bytes).
    for round in 0..4 {
        block_on(source.append(&messages(1 + round * 9, 9))).expect("ok");
    }
    // The copy reads two blocks at a time and its source dies after four
    // reads: the copy ends two blocks into the third batch.
    let extents = source.segment_extents();
    let mut progress = CopyProgress::default();
    for _ in 0..4 {
        let read = progress
            .next_read(&extents, 2 * BLOCK_BYTES)
            .expect("a read");
        let bytes = block_on(source.read_segment(&read.name, read.pos, read.len)).expect("ok");
        block_on(write_copied(&fs, &to, &read.name, read.pos, &bytes)).expect("ok");
        progress.record(&read.name, read.pos, bytes.len() as u64);
    }
    block_on(sync_copied(&fs, &to, progress.names())).expect("ok");
    let mut verified = VerifiedCopy::default();
    block_on(verified.verify(&fs, &to, &progress)).expect("ok");
    block_on(verified.cut_partial_batches(&fs, &to, &progress)).expect("ok");

    let expected = block_on(source.read(0, 18, usize::MAX)).expect("ok");
    for reopened in 0..2 {
        let (copy, recovery) = if reopened == 0 {
            block_on(PartitionLog::open_copy(
                &fs,
                &to,
                config,
                clock.clone(),
                &verified,
            ))
        } else {
            // A crash before the copy took an append: a plain open.
            block_on(PartitionLog::open(&fs, &to, config, clock.clone()))
        }
        .expect("ok");
        assert_eq!(recovery.corrupt_records, 0, "{recovery:?}");
        assert_eq!(copy.high_watermark(), 18, "two whole batches");
        let served = block_on(copy.read(0, 10_000, usize::MAX)).expect("ok");
        assert_eq!(served, expected);
        drop(copy);
    }
    let (copy, _) = block_on(PartitionLog::open(&fs, &to, config, clock)).expect("ok");
    assert_eq!(block_on(copy.append(&messages(100, 1))).expect("ok"), 18);
    assert_eq!(
        block_on(copy.read(0, 10_000, usize::MAX))
            .expect("ok")
            .len(),
        19
    );
}
