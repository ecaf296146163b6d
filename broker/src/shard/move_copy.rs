//! The destination's side of a move's copy as a state machine with no I/O:
//! what to ask the source next, what to write and forget, when to sync,
//! when to freeze the source, and when the copy is complete. `moves.rs`
//! drives it against the source's node and the disk (`Shard::carry_out`);
//! the tests below drive it against a source kept in memory that appends,
//! rolls and deletes segments, and restarts, between any two steps.
//!
//! The rounds, in order:
//! 1. while the source serves, copy until less than
//!    `MOVE_FREEZE_BELOW_BYTES` is missing, then sync and check it;
//! 2. look again, copy until nothing is missing, sync and check;
//! 3. say the freeze is coming, freeze the source and copy what it holds
//!    that the copy lacks, until a frozen source answered every read from
//!    the start of the source node that froze it (a source that restarted
//!    took the freeze up again but may have served a moment: freeze again).
//!
//! Reads while the source serves keep to `cluster.move_bytes_per_s`; once
//! it is frozen they do not (the freeze holds its commits back).

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use narad_storage::limits::BLOCK_BYTES;
use narad_storage::log::copy::{CopyProgress, CopyRead};
use narad_storage::log::SegmentExtent;

use super::redrive::Bucket;
use crate::limits::{MOVE_CHUNK_BYTES, MOVE_FREEZE_BELOW_BYTES, MOVE_PROGRESS_INTERVAL_MS};
use crate::rpc::{MoveAction, SourceState};

/// What the driver does next; each step but `Forget`, `Report`, `Throttle`
/// and `Install` has its answer (`answered`, `written`, `synced`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    /// Ask the source, patiently; its answer goes to [`MoveCopy::answered`].
    Ask(MoveAction),
    /// Write bytes the source answered into the copy's segment `name` at
    /// `pos`; then [`MoveCopy::written`].
    Write {
        name: String,
        pos: u64,
        bytes: Vec<u8>,
    },
    /// Remove the copy of a segment the source no longer holds (its
    /// retention deleted it).
    Forget(String),
    /// Record the move's progress in the metastore (`freezing`: the source
    /// is about to be frozen).
    Report {
        copied: u64,
        remaining: u64,
        freezing: bool,
    },
    /// Wait this long for the rate limit.
    Throttle(Duration),
    /// Sync the segments written since the last sync ([`MoveCopy::take_dirty`]),
    /// read back and check them; then [`MoveCopy::synced`].
    Sync,
    /// The copy holds all a frozen source holds: install it and hand over.
    Install,
}

/// A round of copying while the source serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    /// Until less than `MOVE_FREEZE_BELOW_BYTES` is missing.
    Warm,
    /// Until nothing is missing.
    CatchUp,
}

impl Round {
    /// Copy while at least this many bytes are missing.
    fn until(self) -> u64 {
        match self {
            Round::Warm => MOVE_FREEZE_BELOW_BYTES,
            Round::CatchUp => 1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Ask where the serving source stands.
    Look(Round),
    Copy(Round),
    Sync(Round),
    /// Say the freeze is coming.
    Announce,
    /// Ask for the freeze.
    Freeze,
    /// Copy what the frozen source holds that the copy lacks; complete if
    /// every answer came from the start of the source node that froze it.
    FrozenCopy {
        frozen_by: u64,
    },
    Complete,
}

/// What a move's destination knows of its copy and the source.
pub(super) struct MoveCopy {
    stage: Stage,
    progress: CopyProgress,
    /// The source's last answer (its bytes taken out).
    latest: SourceState,
    /// Segment files written since they were last synced.
    dirty: BTreeSet<String>,
    /// `cluster.move_bytes_per_s`, while the source serves.
    bucket: Bucket,
    /// Reads of a frozen source.
    unlimited: Bucket,
    reported_at: u64,
    /// Copies of deleted segments to remove.
    forgets: VecDeque<String>,
    /// The read asked for; then where its answer's bytes go, and the
    /// bytes until a `Write` step takes them.
    reading: Option<CopyRead>,
    writing: Option<(String, u64, u64)>,
    to_write: Option<Vec<u8>>,
    /// The recent ids the freeze answered (reads answer none).
    frozen_recent: Vec<(u128, u64)>,
}

impl MoveCopy {
    pub(super) fn new(bytes_per_s: u64, now_ms: u64) -> Self {
        Self {
            stage: Stage::Look(Round::Warm),
            progress: CopyProgress::default(),
            latest: SourceState::default(),
            dirty: BTreeSet::new(),
            bucket: Bucket::new(bytes_per_s, now_ms),
            unlimited: Bucket::new(u64::MAX / 4, now_ms),
            reported_at: now_ms,
            forgets: VecDeque::new(),
            reading: None,
            writing: None,
            to_write: None,
            frozen_recent: Vec::new(),
        }
    }

    /// The next step at `now_ms`.
    pub(super) fn next(&mut self, now_ms: u64) -> Step {
        loop {
            if let Some(name) = self.forgets.pop_front() {
                return Step::Forget(name);
            }
            if let (Some(bytes), Some((name, pos, _))) = (self.to_write.take(), &self.writing) {
                return Step::Write {
                    name: name.clone(),
                    pos: *pos,
                    bytes,
                };
            }
            match self.stage {
                Stage::Look(_) => return Step::Ask(MoveAction::Read(None)),
                Stage::Freeze => return Step::Ask(MoveAction::Freeze),
                Stage::Sync(_) => return Step::Sync,
                Stage::Announce => {
                    self.stage = Stage::Freeze;
                    return Step::Report {
                        copied: self.progress.copied_bytes(),
                        remaining: 0,
                        freezing: true,
                    };
                }
                Stage::Complete => return Step::Install,
                Stage::Copy(round) => {
                    if let Some(step) = self.copy_step(now_ms, round.until(), false) {
                        return step;
                    }
                    self.stage = Stage::Sync(round);
                }
                Stage::FrozenCopy { frozen_by } => {
                    if let Some(step) = self.copy_step(now_ms, 1, true) {
                        return step;
                    }
                    self.stage = if self.latest.incarnation == frozen_by && self.complete() {
                        self.latest.recent = std::mem::take(&mut self.frozen_recent);
                        Stage::Complete
                    } else {
                        Stage::Freeze
                    };
                }
            }
        }
    }

    /// The next step of a copy round, `None` once less than `until` bytes
    /// are missing (or nothing is left to read).
    fn copy_step(&mut self, now_ms: u64, until: u64, frozen: bool) -> Option<Step> {
        let extents = extents_of(&self.latest);
        let stale = self.progress.drop_stale(&extents);
        if !stale.is_empty() {
            // Their files go: nothing is left of them to sync.
            for name in &stale {
                self.dirty.remove(name);
            }
            self.forgets.extend(stale);
            return self.forgets.pop_front().map(Step::Forget);
        }
        let remaining = self.progress.remaining(&extents);
        if now_ms.saturating_sub(self.reported_at) >= MOVE_PROGRESS_INTERVAL_MS {
            self.reported_at = now_ms;
            return Some(Step::Report {
                copied: self.progress.copied_bytes(),
                remaining,
                freezing: false,
            });
        }
        let bucket = if frozen {
            &mut self.unlimited
        } else {
            &mut self.bucket
        };
        // A read is never more than a second's worth of the rate (and at
        // least a block), so the rate holds from the first read on.
        let chunk = MOVE_CHUNK_BYTES
            .min(bucket.rate() / BLOCK_BYTES * BLOCK_BYTES)
            .max(BLOCK_BYTES);
        let read = self
            .progress
            .next_read(&extents, chunk)
            .filter(|_| remaining >= until.max(1))?;
        // The wait is for the whole read, not for one byte: a copy sleeps
        // about once a read rather than a millisecond at a time (1,000
        // timer wakeups a second per copy, for nothing).
        let needed = read.len.min(bucket.rate());
        if bucket.available(now_ms) < needed {
            return Some(Step::Throttle(Duration::from_millis(
                bucket.wait_for_ms(needed).max(1),
            )));
        }
        bucket.take(read.len);
        let asked = MoveAction::Read(Some((read.name.clone(), read.pos, read.len)));
        self.reading = Some(read);
        Some(Step::Ask(asked))
    }

    /// Whether the copy holds all the source's last answer lists, and no
    /// segment it does not.
    fn complete(&self) -> bool {
        let extents = extents_of(&self.latest);
        let stale = self
            .progress
            .names()
            .any(|n| !extents.iter().any(|e| e.name == n));
        self.progress.remaining(&extents) == 0 && !stale
    }

    /// The source answered the step's question.
    pub(super) fn answered(&mut self, mut state: SourceState) {
        let bytes = std::mem::take(&mut state.bytes);
        self.latest = state;
        match self.stage {
            Stage::Look(round) => self.stage = Stage::Copy(round),
            Stage::Freeze => {
                self.stage = if self.complete() {
                    Stage::Complete
                } else {
                    self.frozen_recent = self.latest.recent.clone();
                    Stage::FrozenCopy {
                        frozen_by: self.latest.incarnation,
                    }
                };
            }
            Stage::Copy(_) | Stage::FrozenCopy { .. } => {
                if let Some(read) = self.reading.take() {
                    if !bytes.is_empty() {
                        self.writing = Some((read.name, read.pos, bytes.len() as u64));
                        self.to_write = Some(bytes);
                    }
                }
            }
            Stage::Sync(_) | Stage::Announce | Stage::Complete => {}
        }
    }

    /// The bytes of the last `Write` step are in the copy's file.
    pub(super) fn written(&mut self) -> u64 {
        let Some((name, pos, len)) = self.writing.take() else {
            return 0;
        };
        self.progress.record(&name, pos, len);
        self.dirty.insert(name);
        len
    }

    /// The `Sync` step's segments are synced and checked.
    pub(super) fn synced(&mut self) {
        if let Stage::Sync(round) = self.stage {
            self.stage = match round {
                Round::Warm => Stage::Look(Round::CatchUp),
                Round::CatchUp => Stage::Announce,
            };
        }
    }

    /// The segment files written since the last call.
    pub(super) fn take_dirty(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.dirty)
    }

    pub(super) fn progress(&self) -> &CopyProgress {
        &self.progress
    }

    /// The source's last answer: the ack set, cursors and recent ids an
    /// install writes (the freeze's recent ids, once complete).
    pub(super) fn latest(&self) -> &SourceState {
        &self.latest
    }
}

/// The source's segments as the copy's bookkeeping takes them.
fn extents_of(state: &SourceState) -> Vec<SegmentExtent> {
    state
        .extents
        .iter()
        .map(|(name, written)| SegmentExtent {
            name: name.clone(),
            written: *written,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A source partition in memory: segments that only grow, oldest first.
    #[derive(Clone)]
    struct Source {
        segments: Vec<(String, Vec<u8>)>,
        next_segment: u32,
        frozen: bool,
        /// Which start of the source node this is.
        incarnation: u64,
        appended: u64,
    }

    impl Source {
        fn new() -> Self {
            Self {
                segments: vec![(format!("{:020}.seg", 0), Vec::new())],
                next_segment: 1,
                frozen: false,
                incarnation: 1,
                appended: 0,
            }
        }

        /// A new segment, unless the last is empty or the source frozen.
        fn roll(&mut self) {
            let last_empty = self.segments.last().is_some_and(|(_, b)| b.is_empty());
            if self.frozen || last_empty {
                return;
            }
            self.segments
                .push((format!("{:020}.seg", self.next_segment), Vec::new()));
            self.next_segment += 1;
        }

        /// Appends `len` bytes, unless frozen (commits wait then).
        fn append(&mut self, len: usize) {
            if self.frozen {
                return;
            }
            let fill = (self.appended % 251) as u8;
            if let Some((_, bytes)) = self.segments.last_mut() {
                bytes.extend(std::iter::repeat_n(fill, len));
            }
            self.appended += 1;
        }

        fn recent(&self) -> Vec<(u128, u64)> {
            vec![(u128::from(self.appended), self.incarnation)]
        }

        fn answer(&mut self, action: &MoveAction) -> SourceState {
            let mut state = SourceState {
                extents: self
                    .segments
                    .iter()
                    .map(|(name, bytes)| (name.clone(), bytes.len() as u64))
                    .collect(),
                incarnation: self.incarnation,
                ..SourceState::default()
            };
            match action {
                MoveAction::Read(Some((name, pos, len))) => {
                    if let Some((_, bytes)) = self.segments.iter().find(|(n, _)| n == name) {
                        let start = (*pos as usize).min(bytes.len());
                        let end = (start + *len as usize).min(bytes.len());
                        state.bytes = bytes[start..end].to_vec();
                    }
                }
                MoveAction::Read(None) => {}
                MoveAction::Freeze => {
                    self.frozen = true;
                    state.recent = self.recent();
                }
                MoveAction::Thaw => self.frozen = false,
            }
            state
        }
    }

    /// What the driver saw: the steps in order and the copy's files.
    #[derive(Default)]
    struct Run {
        steps: Vec<Step>,
        files: BTreeMap<String, Vec<u8>>,
        now_ms: u64,
        /// The bytes asked for while the source served, per second of the run.
        served_reads: BTreeMap<u64, u64>,
        synced: BTreeSet<String>,
    }

    /// Drives a copy to its install, calling `meddle` on the source before
    /// every step; each step takes a millisecond, throttles their time.
    fn drive(
        source: &mut Source,
        bytes_per_s: u64,
        mut meddle: impl FnMut(&mut Source, &Run),
    ) -> (MoveCopy, Run) {
        let mut copy = MoveCopy::new(bytes_per_s, 0);
        let mut run = Run::default();
        for _ in 0..100_000 {
            meddle(source, &run);
            let step = copy.next(run.now_ms);
            run.steps.push(step.clone());
            run.now_ms += 1;
            match step {
                Step::Ask(action) => {
                    if let MoveAction::Read(Some((_, _, len))) = &action {
                        if !source.frozen {
                            *run.served_reads.entry(run.now_ms / 1000).or_default() += len;
                        }
                    }
                    assert_ne!(action, MoveAction::Thaw, "the copy never thaws");
                    copy.answered(source.answer(&action));
                }
                Step::Write { name, pos, bytes } => {
                    let file = run.files.entry(name).or_default();
                    assert_eq!(file.len() as u64, pos, "a write lands at the copy's end");
                    file.extend_from_slice(&bytes);
                    copy.written();
                }
                Step::Forget(name) => {
                    run.files.remove(&name);
                    run.synced.remove(&name);
                }
                Step::Report { .. } => {}
                Step::Throttle(wait) => run.now_ms += wait.as_millis() as u64,
                Step::Sync => {
                    // A sync opens each file it is given: every one must be there.
                    for name in copy.take_dirty() {
                        assert!(
                            run.files.contains_key(&name),
                            "asked to sync {name}, which was forgotten"
                        );
                        run.synced.insert(name);
                    }
                    copy.synced();
                }
                Step::Install => return (copy, run),
            }
        }
        panic!(
            "the copy never completed: last steps {:?}",
            &run.steps[run.steps.len() - 10..]
        );
    }

    /// The source's segments that hold bytes (a copy has no file for an
    /// empty one).
    fn source_files(source: &Source) -> BTreeMap<String, Vec<u8>> {
        source
            .segments
            .iter()
            .filter(|(_, bytes)| !bytes.is_empty())
            .cloned()
            .collect()
    }

    fn position(run: &Run, wanted: impl Fn(&Step) -> bool) -> Option<usize> {
        run.steps.iter().position(wanted)
    }

    #[test]
    fn a_quiet_source_is_copied_whole_synced_twice_then_frozen_once() {
        let mut source = Source::new();
        for _ in 0..300 {
            source.append(4096);
            if source.appended % 100 == 0 {
                source.roll();
            }
        }
        let (copy, run) = drive(&mut source, 1 << 30, |_, _| {});
        assert_eq!(run.files, source_files(&source));
        assert!(source.frozen);
        let syncs = run.steps.iter().filter(|s| **s == Step::Sync).count();
        assert_eq!(
            syncs, 2,
            "one sync after the warm round, one after catching up"
        );
        let freezes: Vec<usize> = run
            .steps
            .iter()
            .enumerate()
            .filter(|(_, s)| **s == Step::Ask(MoveAction::Freeze))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(freezes.len(), 1, "nothing was missing once frozen");
        let announced = position(&run, |s| matches!(s, Step::Report { freezing: true, .. }));
        let last_sync = run.steps.iter().rposition(|s| *s == Step::Sync);
        assert!(last_sync < announced && announced < Some(freezes[0]));
        assert_eq!(
            copy.latest().recent,
            source.recent(),
            "the freeze's recent ids"
        );
        assert_eq!(
            run.synced.len(),
            run.files.len(),
            "every file was synced before the freeze"
        );
    }

    #[test]
    fn what_the_source_appends_while_copied_or_before_a_freeze_is_copied_too() {
        let mut source = Source::new();
        for _ in 0..50 {
            source.append(64 * 1024);
        }
        // Appends between every step while it serves (a freeze stops them),
        // with a roll now and then.
        let (copy, run) = drive(&mut source, 1 << 30, |source, run| {
            if run.steps.len() % 3 == 0 {
                source.append(10_000);
            }
            if run.steps.len() % 97 == 0 {
                source.roll();
            }
        });
        assert_eq!(run.files, source_files(&source));
        assert!(copy.progress().remaining(&extents_of(copy.latest())) == 0);
        // The copy went on from the warm round while the source appended.
        assert!(
            run.steps
                .iter()
                .filter(|s| matches!(s, Step::Write { .. }))
                .count()
                > 4
        );
    }

    #[test]
    fn a_restart_of_the_source_during_the_frozen_copy_means_another_freeze() {
        let mut source = Source::new();
        for _ in 0..8 {
            source.append(MOVE_CHUNK_BYTES as usize);
        }
        let mut phase = 0;
        let (copy, run) = drive(&mut source, 1 << 30, |source, run| {
            let last = run.steps.last();
            // The first freeze comes while a chunk is still missing: the
            // source appended a lot after the catch-up's look.
            if phase == 0 && matches!(last, Some(Step::Report { freezing: true, .. })) {
                phase = 1;
                source.append(3 * MOVE_CHUNK_BYTES as usize);
            } else if phase == 1 && matches!(last, Some(Step::Write { .. })) {
                // Mid frozen copy: the source node restarts.
                phase = 2;
                source.incarnation += 1;
            }
        });
        assert_eq!(phase, 2);
        assert_eq!(
            run.files,
            source_files(&source),
            "the frozen copy's reads are in the copy"
        );
        let freezes = run
            .steps
            .iter()
            .filter(|s| **s == Step::Ask(MoveAction::Freeze))
            .count();
        assert_eq!(freezes, 2, "frozen again by the source's new start");
        assert_eq!(copy.latest().incarnation, 2);
        assert_eq!(
            copy.latest().recent,
            source.recent(),
            "the last freeze's recent ids"
        );
    }

    #[test]
    fn segments_the_sources_retention_deletes_are_forgotten_by_the_copy() {
        let mut source = Source::new();
        for i in 0..40 {
            source.append(200_000);
            if i % 10 == 9 {
                source.roll();
            }
        }
        let oldest = source.segments[0].0.clone();
        let mut deleted = false;
        let (copy, run) = drive(&mut source, 1 << 30, |source, run| {
            if !deleted && run.files.contains_key(&oldest) && run.files.len() > 1 {
                deleted = true;
                source.segments.remove(0);
            }
        });
        assert!(deleted);
        assert!(run.steps.contains(&Step::Forget(oldest.clone())));
        assert!(!run.files.contains_key(&oldest));
        assert_eq!(run.files, source_files(&source));
        assert!(copy.progress().names().all(|n| n != oldest));
    }

    /// A copy held by the rate waits once for a read's worth of the rate,
    /// not a millisecond at a time.
    #[test]
    fn a_throttled_copy_waits_for_a_whole_read_at_once() {
        let rate = 32 * 1024;
        let mut source = Source::new();
        for _ in 0..12 {
            source.append(64 * 1024);
        }
        let (_, run) = drive(&mut source, rate, |_, _| {});
        assert_eq!(run.files, source_files(&source));
        let throttles = run
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Throttle(_)))
            .count();
        let reads = run
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Ask(MoveAction::Read(Some(_)))))
            .count();
        assert!(
            throttles <= reads + 2,
            "{throttles} waits for {reads} reads"
        );
    }

    #[test]
    fn reads_of_a_serving_source_keep_to_the_rate_and_progress_is_reported_every_interval() {
        let rate = 256 * 1024;
        let mut source = Source::new();
        for _ in 0..40 {
            source.append(64 * 1024);
        }
        let total = 40 * 64 * 1024;
        let (_, run) = drive(&mut source, rate, |_, _| {});
        assert_eq!(run.files, source_files(&source));
        // A second's worth saved up at the start, then the rate.
        for (second, bytes) in &run.served_reads {
            assert!(*bytes <= 2 * rate, "second {second}: {bytes} bytes read");
        }
        let seconds = run.now_ms / 1000;
        assert!(
            seconds + 1 >= total / rate - 1,
            "{total} bytes at {rate}/s took {seconds} s"
        );
        let reports = run
            .steps
            .iter()
            .filter(|s| {
                matches!(
                    s,
                    Step::Report {
                        freezing: false,
                        ..
                    }
                )
            })
            .count() as u64;
        assert!(reports + 2 >= seconds, "{reports} reports in {seconds} s");
    }

    #[test]
    fn any_interleaving_of_appends_rolls_deletes_and_restarts_ends_with_the_frozen_sources_bytes() {
        // A small seeded walk: the copy must end equal to a frozen source,
        // whatever happened between its steps.
        for seed in 1..200u64 {
            let mut rng = narad_storage::rng::SimRng::new(seed);
            let mut next = move || rng.next_u64();
            let mut source = Source::new();
            for _ in 0..(next() % 20) {
                source.append((next() % 300_000) as usize);
            }
            let mut restarts = 0;
            let (copy, run) = drive(&mut source, 1 << 22, |source, _| match next() % 40 {
                0..=9 => source.append((next() % 100_000) as usize),
                10 => source.roll(),
                11 if source.segments.len() > 1 && !source.frozen => {
                    source.segments.remove(0);
                }
                12 if restarts < 3 => {
                    restarts += 1;
                    source.incarnation += 1;
                    let was = source.frozen;
                    source.frozen = false;
                    source.append((next() % 10_000) as usize);
                    source.frozen = was;
                }
                _ => {}
            });
            // What the source holds now: nothing changed since the answer
            // that completed the copy but a restart the copy cannot see yet.
            if copy.latest().incarnation == source.incarnation {
                assert_eq!(run.files, source_files(&source), "seed {seed}");
            }
            assert!(source.frozen, "seed {seed}");
            let holds: BTreeMap<String, u64> = copy
                .latest()
                .extents
                .iter()
                .filter(|(_, written)| *written > 0)
                .cloned()
                .collect();
            let copied: BTreeMap<String, u64> = run
                .files
                .iter()
                .map(|(n, b)| (n.clone(), b.len() as u64))
                .collect();
            assert_eq!(
                copied, holds,
                "seed {seed}: the copy is what the frozen source listed"
            );
        }
    }
}
