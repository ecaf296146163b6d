//! A partition's recent history for people watching a topic: for each
//! interval of `RATE_INTERVAL_MS` over the last `RATE_WINDOW_MS`, how many
//! messages were produced, acked and dead-lettered in it, and the backlog
//! (available, in flight) it ended with. Kept in the owner's memory only (a
//! restart starts it anew), at most `RATE_POINTS` points a partition.
//!
//! Pure: time comes in as `now_ms`. Counting is a few additions on the data
//! path; the backlog is worked out only when an interval closes (at the
//! first event or read after it), which is what it ended with, since
//! nothing happened in between.

use std::collections::VecDeque;

use rkyv::{Archive, Deserialize, Serialize};

/// One point's length.
pub const RATE_INTERVAL_MS: u64 = 5_000;
/// How far back the points go.
pub const RATE_WINDOW_MS: u64 = 15 * 60 * 1_000;
/// Points a partition keeps at most: 180.
pub const RATE_POINTS: usize = (RATE_WINDOW_MS / RATE_INTERVAL_MS) as usize;

/// One interval: counts within it, and the backlog at its end (for the
/// interval under way, now).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct RatePoint {
    /// When the interval began (Unix ms, a multiple of the interval).
    pub at_ms: u64,
    pub produced: u64,
    pub acked: u64,
    pub dead_lettered: u64,
    pub available: u64,
    pub in_flight: u64,
}

impl RatePoint {
    /// Adds `other`'s counts and backlog (another partition's point of the
    /// same interval).
    pub fn add(&mut self, other: &RatePoint) {
        self.produced += other.produced;
        self.acked += other.acked;
        self.dead_lettered += other.dead_lettered;
        self.available += other.available;
        self.in_flight += other.in_flight;
    }
}

/// Adds `points` (of other partitions) into `into`, interval by interval.
pub fn merge(into: &mut std::collections::BTreeMap<u64, RatePoint>, points: &[RatePoint]) {
    for point in points {
        into.entry(point.at_ms)
            .or_insert(RatePoint {
                at_ms: point.at_ms,
                ..RatePoint::default()
            })
            .add(point);
    }
}

/// What happened to a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateEvent {
    Produced(u64),
    Acked(u64),
    DeadLettered(u64),
}

/// A partition's points, oldest first.
#[derive(Debug, Default)]
pub struct Rates {
    points: VecDeque<RatePoint>,
}

/// The start of the interval `now_ms` falls in.
fn interval_of(now_ms: u64) -> u64 {
    now_ms - now_ms % RATE_INTERVAL_MS
}

impl Rates {
    /// Counts `event` in the interval of `now_ms`. When that interval is a
    /// new one, those before it are closed with `backlog()`, the
    /// partition's (available, in flight) before the event.
    pub fn note(&mut self, now_ms: u64, event: RateEvent, backlog: impl FnOnce() -> (u64, u64)) {
        let point = self.roll(now_ms, backlog);
        match event {
            RateEvent::Produced(n) => point.produced += n,
            RateEvent::Acked(n) => point.acked += n,
            RateEvent::DeadLettered(n) => point.dead_lettered += n,
        }
    }

    /// Closes the intervals before `now_ms`'s, if it is a new one, with
    /// `backlog()`: called before an event changes the backlog, so that an
    /// interval ends with what it left.
    pub fn close_before(&mut self, now_ms: u64, backlog: impl FnOnce() -> (u64, u64)) {
        self.roll(now_ms, backlog);
    }

    /// Every point kept, up to the interval of `now_ms`, whose backlog is
    /// `backlog` (the partition's now).
    pub fn points(&mut self, now_ms: u64, backlog: (u64, u64)) -> Vec<RatePoint> {
        let point = self.roll(now_ms, || backlog);
        (point.available, point.in_flight) = backlog;
        self.points.iter().copied().collect()
    }

    /// The point of `now_ms`'s interval, closing those before it. Intervals
    /// nothing happened in get a point of their own, with no counts and the
    /// backlog the one before ended with. A clock that went back counts in
    /// the latest point.
    fn roll(&mut self, now_ms: u64, backlog: impl FnOnce() -> (u64, u64)) -> &mut RatePoint {
        let at_ms = interval_of(now_ms);
        let last_at = self.points.back().map(|p| p.at_ms);
        if last_at.is_none_or(|last| last < at_ms) {
            let (available, in_flight) = backlog();
            if let Some(last) = self.points.back_mut() {
                (last.available, last.in_flight) = (available, in_flight);
            }
            // No more than a window's worth of empty intervals.
            let first_gap = last_at
                .map_or(at_ms, |last| last + RATE_INTERVAL_MS)
                .max(at_ms.saturating_sub(RATE_WINDOW_MS));
            let mut at = first_gap;
            while at <= at_ms {
                self.points.push_back(RatePoint {
                    at_ms: at,
                    available,
                    in_flight,
                    ..RatePoint::default()
                });
                at += RATE_INTERVAL_MS;
            }
            while self.points.len() > RATE_POINTS {
                self.points.pop_front();
            }
        }
        self.points
            .back_mut()
            .expect("a point was just made if there was none")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_764_500_000_000;

    #[test]
    fn events_count_in_their_interval_and_an_interval_ends_with_the_backlog_it_left() {
        let mut rates = Rates::default();
        rates.note(T0 + 100, RateEvent::Produced(10), || (0, 0));
        rates.note(T0 + 4_999, RateEvent::Acked(3), || {
            unreachable!("same interval")
        });
        // The next interval: the first closes with what it left.
        rates.note(T0 + 5_000, RateEvent::DeadLettered(1), || (6, 1));
        let points = rates.points(T0 + 7_000, (5, 1));
        assert_eq!(
            points,
            vec![
                RatePoint {
                    at_ms: T0,
                    produced: 10,
                    acked: 3,
                    dead_lettered: 0,
                    available: 6,
                    in_flight: 1
                },
                RatePoint {
                    at_ms: T0 + 5_000,
                    produced: 0,
                    acked: 0,
                    dead_lettered: 1,
                    available: 5,
                    in_flight: 1
                },
            ]
        );
    }

    #[test]
    fn quiet_intervals_get_points_with_no_counts_and_the_backlog_they_kept() {
        let mut rates = Rates::default();
        rates.note(T0, RateEvent::Produced(4), || (0, 0));
        let points = rates.points(T0 + 3 * RATE_INTERVAL_MS + 1, (4, 0));
        assert_eq!(points.len(), 4);
        assert_eq!(points[0].produced, 4);
        for (i, point) in points.iter().enumerate().skip(1) {
            assert_eq!(point.at_ms, T0 + i as u64 * RATE_INTERVAL_MS);
            assert_eq!(
                (point.produced, point.acked, point.dead_lettered),
                (0, 0, 0)
            );
            assert_eq!((point.available, point.in_flight), (4, 0));
        }
    }

    #[test]
    fn at_most_a_window_of_points_is_kept_however_long_or_quiet_it_was() {
        let mut rates = Rates::default();
        for i in 0..1_000 {
            rates.note(T0 + i * 1_000, RateEvent::Produced(1), || (0, 0));
        }
        let points = rates.points(T0 + 1_000_000, (0, 0));
        assert_eq!(points.len(), RATE_POINTS);
        assert_eq!(points.last().map(|p| p.at_ms), Some(T0 + 1_000_000));
        // A day later: still a window, not a day of empty points.
        let points = rates.points(T0 + 86_400_000, (0, 0));
        assert_eq!(points.len(), RATE_POINTS);
        assert!(points.iter().all(|p| p.produced == 0));
        assert_eq!(
            points[0].at_ms,
            T0 + 86_400_000 - RATE_WINDOW_MS + RATE_INTERVAL_MS
        );
    }

    #[test]
    fn a_clock_that_went_back_counts_in_the_latest_point() {
        let mut rates = Rates::default();
        rates.note(T0 + 10_000, RateEvent::Produced(1), || (0, 0));
        rates.note(T0, RateEvent::Produced(2), || {
            unreachable!("no new interval")
        });
        let points = rates.points(T0 + 10_000, (3, 0));
        assert_eq!(points.len(), 1);
        assert_eq!(points[0].produced, 3);
    }
}
