//! Where a copy to a child stands, with no I/O: the copy loop in
//! `children.rs` reads the parent partition, commits to the child and
//! stores its cursor; what it does next, and when, is decided here, so that
//! a test can run the loop against a parent kept in memory, crash it
//! anywhere and check that nothing is skipped but what retention removed.
//!
//! - The position is the next offset to copy: every offset below it was
//!   confirmed by the child's owners, or skipped and counted (retention
//!   removed it first, or the log could not return it).
//! - The cursor file is written at most every `CHILD_CURSOR_STORE_INTERVAL`
//!   while copying (one fdatasync fewer per copy under load), and when the
//!   copy catches up, stops or fails: a crash copies again what followed
//!   the stored position (at least once).
//! - A delay copy whose next message is not due reads nothing again until
//!   it is (`Observed` says when the owner first saw each offset).

use std::collections::VecDeque;
use std::time::Duration;

use narad_storage::log::StoredMessage;

use crate::limits::{
    CHILD_CURSOR_STORE_INTERVAL, CHILD_IDLE_RECHECK, CHILD_OBSERVED_COALESCE_MS,
    CHILD_OBSERVED_MARKS_MAX,
};

/// What the copy does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Write the cursor file at this position; then [`CopyCursor::stored`].
    Store(u64),
    /// Nothing to copy now: wait for a commit to the parent, a wake or this
    /// long (`caught_up`: the copy holds all the parent does).
    Idle { at_most: Duration, caught_up: bool },
    /// Read the parent from this offset; what is due of it goes to the
    /// child ([`due_count`]), then [`CopyCursor::copied`].
    Read(u64),
}

/// A copy's position and its cursor file's.
#[derive(Debug, Clone)]
pub(super) struct CopyCursor {
    position: u64,
    stored: u64,
    stored_at: u64,
    waiting_until: Option<u64>,
}

impl CopyCursor {
    /// A copy starting from its cursor file's position.
    pub(super) fn new(stored: u64, now_ms: u64) -> Self {
        Self {
            position: stored,
            stored,
            stored_at: now_ms,
            waiting_until: None,
        }
    }

    pub(super) fn position(&self) -> u64 {
        self.position
    }

    /// The parent's log starts at `start`: what retention removed before
    /// it was copied is skipped. How many offsets were.
    pub(super) fn skip_to(&mut self, start: u64) -> u64 {
        let lost = start.saturating_sub(self.position);
        self.position = self.position.max(start);
        lost
    }

    /// What to do at `now_ms`, with the parent's high watermark.
    pub(super) fn next(&mut self, now_ms: u64, high_watermark: u64) -> Next {
        let interval = CHILD_CURSOR_STORE_INTERVAL.as_millis() as u64;
        let store_at = self.stored_at.saturating_add(interval);
        if self.position != self.stored && now_ms >= store_at {
            return Next::Store(self.position);
        }
        if let Some(due) = self.waiting_until.filter(|due| now_ms < *due) {
            return Next::Idle {
                at_most: Duration::from_millis(due - now_ms).min(CHILD_IDLE_RECHECK),
                caught_up: false,
            };
        }
        self.waiting_until = None;
        if self.position >= high_watermark {
            // Caught up with a position not stored yet: look again when it
            // is due to be.
            let at_most = if self.position == self.stored {
                CHILD_IDLE_RECHECK
            } else {
                Duration::from_millis(store_at.saturating_sub(now_ms).max(1))
            };
            return Next::Idle {
                at_most,
                caught_up: true,
            };
        }
        Next::Read(self.position)
    }

    /// The cursor file holds `position`, written at `now_ms`.
    pub(super) fn stored(&mut self, position: u64, now_ms: u64) {
        self.stored = position;
        self.stored_at = now_ms;
    }

    /// The position to write before the copy stops or gives up an attempt,
    /// if it moved since it was last written.
    pub(super) fn unstored(&self) -> Option<u64> {
        (self.position != self.stored).then_some(self.position)
    }

    /// The log could not return the message at the position (damaged, and
    /// logged as such): go past it.
    pub(super) fn skip_unreadable(&mut self) {
        self.position += 1;
    }

    /// None of what was read is due before `due_ms`: read nothing again
    /// until then.
    pub(super) fn wait_until(&mut self, due_ms: u64, now_ms: u64) {
        self.waiting_until = Some(due_ms.max(now_ms + 1));
    }

    /// The child's owners confirmed the messages at these offsets (in
    /// order, from the position on). How many offsets the log skipped
    /// between them (damaged records, or retention that went past the
    /// position meanwhile).
    pub(super) fn copied(&mut self, offsets: impl IntoIterator<Item = u64>) -> u64 {
        let mut skipped = 0;
        for offset in offsets {
            skipped += offset.saturating_sub(self.position);
            self.position = self.position.max(offset + 1);
        }
        skipped
    }
}

/// How many of `batch` (read from the position, in offset order) may go to
/// the child now, and when the first of them is due (its produce time for
/// a copy without delay). None due: wait for the second.
pub(super) fn due_count(
    batch: &[StoredMessage],
    delay_ms: Option<u64>,
    observed: &Observed,
    now_ms: u64,
) -> (usize, u64) {
    let Some(first) = batch.first() else {
        return (0, now_ms);
    };
    match delay_ms {
        None => (batch.len(), first.message.produced_at_ms),
        Some(delay) => (
            batch
                .iter()
                .take_while(|m| due_at(m, observed, delay, now_ms) <= now_ms)
                .count(),
            due_at(first, observed, delay, now_ms),
        ),
    }
}

/// When the owner saw the high watermark pass offsets: a delay copy makes
/// no copy earlier than `delay_ms` after the owner's own clock first saw
/// the message (nor after its produce time), so a node whose clock runs
/// behind another's never makes one early.
#[derive(Default)]
pub(super) struct Observed {
    /// Offsets below `hw` (and above the mark before) were first seen by
    /// `at`, oldest first: (hw, at, when the mark was opened).
    marks: VecDeque<(u64, u64, u64)>,
    /// Offsets below this were in the partition when the copy started.
    from: Option<u64>,
}

impl Observed {
    pub(super) fn note(&mut self, high_watermark: u64, now_ms: u64) {
        if self.from.is_none() {
            // What the partition held before: its produce times count.
            self.from = Some(high_watermark);
            return;
        }
        match self.marks.back_mut() {
            Some((hw, _, _)) if *hw >= high_watermark => {}
            // A mark stays open for a short while: what it covers counts as
            // seen at its latest sight (later, never earlier), and a mark
            // closes however busy the partition is.
            Some((hw, at, opened))
                if now_ms.saturating_sub(*opened) < CHILD_OBSERVED_COALESCE_MS =>
            {
                *hw = high_watermark;
                *at = now_ms;
            }
            _ if self.from.is_some_and(|from| high_watermark <= from) => {}
            _ => {
                self.marks.push_back((high_watermark, now_ms, now_ms));
                self.thin();
            }
        }
    }

    /// When the owner first saw `offset` (`None`: before this copy
    /// started); one it has not noted yet (committed since its last look)
    /// counts as seen `now`.
    fn seen_at(&self, offset: u64, now_ms: u64) -> Option<u64> {
        if self.from.is_none_or(|from| offset < from) {
            return None;
        }
        // Marks rise in both fields: the first whose watermark passed it.
        let index = self.marks.partition_point(|(hw, _, _)| *hw <= offset);
        Some(self.marks.get(index).map_or(now_ms, |(_, at, _)| *at))
    }

    /// Halves the marks when there are too many (a long delay on a busy
    /// partition): each pair becomes its later mark, so what they cover
    /// comes due later, never earlier.
    fn thin(&mut self) {
        if self.marks.len() < CHILD_OBSERVED_MARKS_MAX {
            return;
        }
        let marks: Vec<(u64, u64, u64)> = self.marks.drain(..).collect();
        self.marks = marks
            .chunks(2)
            .filter_map(|pair| pair.last().copied())
            .collect();
    }

    /// Forgets marks wholly below `offset`.
    pub(super) fn forget_below(&mut self, offset: u64) {
        while self.marks.front().is_some_and(|(hw, _, _)| *hw <= offset) {
            self.marks.pop_front();
        }
    }
}

/// When a message may be copied to a delay child.
pub(super) fn due_at(
    message: &StoredMessage,
    observed: &Observed,
    delay_ms: u64,
    now_ms: u64,
) -> u64 {
    let accepted = observed
        .seen_at(message.offset, now_ms)
        .map_or(message.message.produced_at_ms, |seen| {
            seen.max(message.message.produced_at_ms)
        });
    accepted.saturating_add(delay_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_storage::log::Message;
    use std::collections::BTreeMap;

    fn stored(offset: u64, produced_at_ms: u64) -> StoredMessage {
        StoredMessage {
            offset,
            message: Message {
                idempotency_key: None,
                id: u128::from(offset),
                produced_at_ms,
                key: None,
                value: bytes::Bytes::new(),
            },
        }
    }

    #[test]
    fn a_delay_counts_from_the_later_of_produce_time_and_the_owners_first_sight() {
        let mut observed = Observed::default();
        // What the partition held when the copy started: produce times.
        observed.note(4, 900);
        assert_eq!(observed.seen_at(3, 900), None);
        observed.note(10, 1_000);
        // Close marks merge into the later one.
        observed.note(12, 1_020);
        observed.note(20, 2_000);
        assert_eq!(observed.seen_at(3, 2_500), None);
        assert_eq!(observed.seen_at(5, 2_500), Some(1_020));
        assert_eq!(observed.seen_at(15, 2_500), Some(2_000));
        // Committed since the last look: seen now.
        assert_eq!(observed.seen_at(25, 2_500), Some(2_500));
        // A busy partition: sights every 10 ms still close a mark within
        // the coalescing time, so what it covers comes due.
        let mut busy = Observed::default();
        busy.note(0, 0);
        for i in 1..=100 {
            busy.note(i, i * 10);
        }
        assert!(busy
            .seen_at(1, 5_000)
            .is_some_and(|at| at < CHILD_OBSERVED_COALESCE_MS + 10));
        assert!(busy.marks.len() > 10);
        // A producer's clock ahead of the owner's: its time counts.
        assert_eq!(due_at(&stored(15, 2_500), &observed, 100, 2_500), 2_600);
        // Behind: the owner's first sight counts, never earlier.
        assert_eq!(due_at(&stored(15, 1_500), &observed, 100, 2_500), 2_100);
        observed.forget_below(12);
        assert_eq!(observed.seen_at(15, 2_500), Some(2_000));
        // Too many marks: halved, each pair as its later one.
        let mut long = Observed::default();
        long.note(0, 0);
        for i in 1..=(CHILD_OBSERVED_MARKS_MAX as u64) {
            long.note(i, i * 100);
        }
        assert!(long.marks.len() <= CHILD_OBSERVED_MARKS_MAX / 2 + 1);
        assert_eq!(long.seen_at(0, 0), Some(200), "later, never earlier");
    }

    const INTERVAL: u64 = CHILD_CURSOR_STORE_INTERVAL.as_millis() as u64;

    /// A parent partition in memory: offsets from `start` to `end`, some
    /// unreadable.
    struct Parent {
        start: u64,
        end: u64,
        unreadable: Vec<u64>,
    }

    /// What the child received (offset -> copies) and the cursor file.
    #[derive(Default)]
    struct Child {
        received: BTreeMap<u64, u32>,
        file: u64,
        stores: Vec<u64>,
    }

    /// One copy attempt as the loop runs it, for `steps` steps of a
    /// millisecond each; `meddle` changes the parent between steps. Ends
    /// like a crash: nothing more is stored.
    fn run(
        parent: &mut Parent,
        child: &mut Child,
        now_ms: &mut u64,
        steps: u32,
        skipped: &mut u64,
        mut meddle: impl FnMut(&mut Parent, u64),
    ) {
        let mut cursor = CopyCursor::new(child.file, *now_ms);
        for _ in 0..steps {
            meddle(parent, *now_ms);
            *now_ms += 1;
            *skipped += cursor.skip_to(parent.start);
            match cursor.next(*now_ms, parent.end) {
                Next::Store(position) => {
                    child.file = position;
                    child.stores.push(*now_ms);
                    cursor.stored(position, *now_ms);
                }
                Next::Idle { at_most, .. } => {
                    *now_ms += (at_most.as_millis() as u64).min(20);
                }
                Next::Read(from) => {
                    // A read of at most 7 records, past unreadable ones.
                    let offsets: Vec<u64> = (from..parent.end)
                        .filter(|o| !parent.unreadable.contains(o))
                        .take(7)
                        .collect();
                    if offsets.is_empty() {
                        cursor.skip_unreadable();
                        *skipped += 1;
                        continue;
                    }
                    for offset in &offsets {
                        *child.received.entry(*offset).or_default() += 1;
                    }
                    *skipped += cursor.copied(offsets);
                }
            }
        }
    }

    #[test]
    fn crashes_anywhere_copy_again_what_followed_the_stored_cursor_and_skip_nothing_retained() {
        for seed in 1..300u64 {
            let mut rng = narad_storage::rng::SimRng::new(seed);
            let mut next = move || rng.next_u64();
            let mut parent = Parent {
                start: 0,
                end: next() % 50,
                unreadable: vec![next() % 400, next() % 400],
            };
            let mut child = Child::default();
            let mut now_ms = 0;
            let mut skipped = 0;
            // What retention removed before a copy: may be skipped.
            let mut removed_below = 0;
            for _attempt in 0..10 {
                let steps = (next() % 200) as u32;
                let mut coin = next();
                run(
                    &mut parent,
                    &mut child,
                    &mut now_ms,
                    steps,
                    &mut skipped,
                    |p, _| {
                        coin = coin.rotate_left(5) ^ 0x9e37_79b9;
                        if coin % 3 == 0 {
                            p.end += coin % 5;
                        }
                        if coin % 97 == 0 && p.start + 3 < p.end {
                            p.start += 3;
                        }
                    },
                );
                removed_below = removed_below.max(parent.start);
                // The stored cursor never passes what the child received.
                assert!(
                    (0..child.file).all(|o| child.received.contains_key(&o)
                        || o < removed_below
                        || parent.unreadable.contains(&o)),
                    "seed {seed}: the cursor passed offsets the child never got"
                );
            }
            // A last attempt long enough to catch up.
            run(
                &mut parent,
                &mut child,
                &mut now_ms,
                5_000,
                &mut skipped,
                |_, _| {},
            );
            for offset in parent.start..parent.end {
                if !parent.unreadable.contains(&offset) {
                    assert!(
                        child.received.contains_key(&offset),
                        "seed {seed}: offset {offset} never copied"
                    );
                }
            }
            assert_eq!(
                child.file, parent.end,
                "seed {seed}: caught up, the cursor is stored"
            );
        }
    }

    #[test]
    fn the_cursor_is_stored_at_most_every_interval_while_copying_and_once_caught_up() {
        let mut parent = Parent {
            start: 0,
            end: 10_000,
            unreadable: Vec::new(),
        };
        let mut child = Child::default();
        let (mut now_ms, mut skipped) = (0, 0);
        run(
            &mut parent,
            &mut child,
            &mut now_ms,
            3_000,
            &mut skipped,
            |_, _| {},
        );
        assert_eq!(child.file, 10_000);
        assert_eq!(skipped, 0);
        for pair in child.stores.windows(2) {
            assert!(pair[1] - pair[0] >= INTERVAL, "stored at {pair:?}");
        }
        // About one store per interval while copying, not one per read.
        let copying_ms = child.stores.last().copied().unwrap_or(0);
        assert!(child.stores.len() as u64 <= copying_ms / INTERVAL + 1);
        assert!(
            child.received.values().all(|n| *n == 1),
            "no crash, no second copy"
        );
    }

    #[test]
    fn a_copy_behind_retention_skips_and_counts_what_was_removed() {
        let mut cursor = CopyCursor::new(10, 0);
        assert_eq!(
            cursor.skip_to(4),
            0,
            "retention behind the cursor skips nothing"
        );
        assert_eq!(cursor.skip_to(25), 15);
        assert_eq!(cursor.position(), 25);
        assert_eq!(
            cursor.unstored(),
            Some(25),
            "the skip is stored like a copy"
        );
        // Offsets the log skipped inside a read count too.
        assert_eq!(cursor.copied([25, 26, 30, 31]), 3);
        assert_eq!(cursor.position(), 32);
    }

    #[test]
    fn a_delay_copy_reads_nothing_again_until_its_next_message_is_due() {
        let mut cursor = CopyCursor::new(0, 0);
        assert_eq!(cursor.next(1, 5), Next::Read(0));
        cursor.wait_until(3_500, 1);
        match cursor.next(2, 5) {
            Next::Idle { at_most, caught_up } => {
                assert!(!caught_up);
                assert_eq!(
                    at_most, CHILD_IDLE_RECHECK,
                    "a long wait looks again every recheck"
                );
            }
            other => panic!("read before due: {other:?}"),
        }
        match cursor.next(3_400, 5) {
            Next::Idle { at_most, .. } => assert_eq!(at_most, Duration::from_millis(100)),
            other => panic!("read before due: {other:?}"),
        }
        assert_eq!(cursor.next(3_500, 5), Next::Read(0));
    }
}
