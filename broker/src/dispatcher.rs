//! The dispatcher's batching policy, as a sans-IO state machine.
//!
//! Durable WAL records go in with [`Dispatcher::push`]; commit batches come
//! out of [`Dispatcher::poll_ready`], one destination (topic partition) each.
//! The linger adapts to load: an idle destination gets its records at once;
//! while a commit is in flight, records gather into the next batch. A busy
//! destination (one whose last commit returned recently) commits again only
//! once its linger passed since that return, or at once when the batch is
//! full. The linger follows what commits to the destination cost: it is
//! [`BUSY_LINGER_PER_COMMIT`] times their recent duration, at most
//! `busy_linger_ms`. Cheap commits (an owner with disk to spare) follow each
//! other at once, so messages wait for little more than their own commit;
//! slow commits (an owner bound by its fsyncs) are spaced out, so each takes
//! more records and the partition commits (one write, one fdatasync, one
//! read-back) a bounded number of times a second, however many producers
//! there are. A batch also leaves after
//! `max_linger_ms` even while a commit is in flight (so a slow owner
//! pipelines two commits): no record waits longer than `max_linger_ms`
//! plus one commit's time before it is sent. A failed
//! commit puts its records back at the front, retried with a doubling
//! backoff. Once an attempt to a destination has failed (or timed out), the
//! destination *fails* from the start of its oldest attempt still
//! unanswered or failed; once it has failed for `reroute_after_ms`, or at
//! once when its owner is marked dead, it is *rerouting*: [`Dispatcher::reroutes_due`]
//! names it whenever records wait for it, and the caller moves them to a
//! live sibling partition. A rerouting destination gets no records, only an
//! empty probe commit after each backoff; the first commit that succeeds
//! ends the reroute.
//! Records leave the WAL only through [`Dispatcher::on_committed`], which
//! returns their positions for `Wal::mark_committed`.

use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

use narad_storage::wal::WalPos;

use crate::limits::{
    COMMIT_BATCH_BYTES_MAX, COMMIT_BATCH_RECORDS_MAX, COMMIT_IN_FLIGHT_PER_PARTITION,
    COMMIT_RETRY_BACKOFF_MAX_MS, COMMIT_RETRY_BACKOFF_MIN_MS,
};
use crate::settings::Settings;

/// Where a record goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Destination {
    pub topic: Rc<str>,
    pub partition: u32,
}

/// A durable WAL record waiting for its commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatchRecord {
    pub pos: WalPos,
    pub id: u128,
    pub key: Option<Vec<u8>>,
    pub value: bytes::Bytes,
    pub accept_ms: u64,
    /// The incarnation of the topic that accepted it (the WAL keeps it;
    /// only records written by versions before it are without): a record of
    /// a topic deleted meanwhile never lands in one created again under its
    /// name.
    pub incarnation: Option<u64>,
    /// The producer's idempotency key: the owner drops this copy if it
    /// committed one with the same key within the topic's window.
    pub idempotency_key: Option<bytes::Bytes>,
}

impl DispatchRecord {
    /// Whether the record goes to this incarnation of its topic (one of
    /// unknown incarnation goes to whichever exists).
    pub fn belongs_to(&self, incarnation: u64) -> bool {
        self.incarnation.is_none_or(|i| i == incarnation)
    }

    fn bytes(&self) -> u64 {
        (self.value.len() + self.key.as_ref().map_or(0, Vec::len) + 64) as u64
    }
}

/// The linger of a busy destination is this many times the recent duration
/// of its commits (at most `busy_linger_ms`): a partition spends at most
/// about a third of its time committing, and the time between its commits
/// grows with what each costs.
pub const BUSY_LINGER_PER_COMMIT: f64 = 2.0;

/// The weight of the newest commit in a destination's average commit time.
const COMMIT_TIME_WEIGHT: f64 = 0.25;

/// One commit to send to a destination's owner.
/// The first wait before a batch whose partition moved is sent again: the
/// new owner takes it as soon as this node's metadata names it.
pub const MOVED_RETRY_MS: u64 = 1;

/// A batch without records is a probe: it asks a rerouting destination's
/// owner whether it takes commits again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitBatch {
    pub batch_id: u64,
    pub destination: Destination,
    pub records: Vec<DispatchRecord>,
}

impl CommitBatch {
    pub fn is_probe(&self) -> bool {
        self.records.is_empty()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DispatcherConfig {
    pub max_linger_ms: u64,
    /// The longest spacing of commits to a busy destination (at most
    /// `max_linger_ms`); the spacing follows what its commits cost.
    pub busy_linger_ms: u64,
    pub reroute_after_ms: u64,
    pub batch_records_max: usize,
    pub batch_bytes_max: u64,
    pub retry_backoff_min_ms: u64,
    pub retry_backoff_max_ms: u64,
    /// Commits in flight to one destination at once (the owner takes its
    /// appends in turn): a second one leaves once its oldest record waited
    /// `max_linger_ms`, so no record waits behind a slow commit for longer.
    pub in_flight_per_destination_max: usize,
}

impl DispatcherConfig {
    /// The configuration a node runs with.
    pub fn of(settings: &Settings) -> Self {
        Self {
            max_linger_ms: settings.dispatcher.max_linger_ms,
            busy_linger_ms: settings.dispatcher.busy_linger_ms,
            reroute_after_ms: settings.dispatcher.reroute_after_ms,
            batch_records_max: COMMIT_BATCH_RECORDS_MAX,
            batch_bytes_max: COMMIT_BATCH_BYTES_MAX,
            retry_backoff_min_ms: COMMIT_RETRY_BACKOFF_MIN_MS,
            retry_backoff_max_ms: COMMIT_RETRY_BACKOFF_MAX_MS,
            in_flight_per_destination_max: COMMIT_IN_FLIGHT_PER_PARTITION,
        }
    }
}

/// What a failed commit means for its destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureOutcome {
    /// The records wait for a retry at `retry_at_ms`.
    Retry { retry_at_ms: u64 },
    /// The destination is rerouting (it has failed for `reroute_after_ms`,
    /// or its owner is dead): the caller should move its records to a live
    /// sibling (with [`Dispatcher::take_pending`]); a probe follows at
    /// `retry_at_ms`.
    RerouteDue { retry_at_ms: u64 },
}

#[derive(Debug, Default)]
struct DestinationState {
    /// Waiting records with the time each was pushed.
    pending: VecDeque<(u64, DispatchRecord)>,
    pending_bytes: u64,
    /// Batches sent and not answered yet: when each was sent.
    sent: Vec<(u64, u64)>,
    /// When the first attempt that failed since the last success started.
    failing_since_ms: Option<u64>,
    /// The owner is marked dead: reroute at once, without waiting for
    /// `reroute_after_ms`.
    owner_dead: bool,
    backoff_ms: u64,
    retry_at_ms: Option<u64>,
    /// When the last commit returned.
    last_done_ms: Option<u64>,
    /// How long its recent commits took, averaged (ms).
    commit_ms: Option<f64>,
}

#[derive(Debug)]
pub struct Dispatcher {
    config: DispatcherConfig,
    destinations: HashMap<Destination, DestinationState>,
    /// Batches sent and not yet answered, with when each was sent.
    in_flight: HashMap<u64, (CommitBatch, u64)>,
    next_batch_id: u64,
}

impl DestinationState {
    fn in_flight(&self) -> usize {
        self.sent.len()
    }

    /// When its oldest unanswered attempt since the last success started:
    /// one that failed, or one still in flight.
    fn unanswered_since(&self) -> Option<u64> {
        let oldest_sent = self.sent.iter().map(|(_, at)| *at).min();
        match (self.failing_since_ms, oldest_sent) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn is_rerouting(&self, config: &DispatcherConfig, now_ms: u64) -> bool {
        self.owner_dead
            || self.failing_since_ms.is_some()
                && self
                    .unanswered_since()
                    .is_some_and(|since| now_ms >= since.saturating_add(config.reroute_after_ms))
    }

    /// When a failing destination that is not rerouting yet becomes so.
    fn reroute_at(&self, config: &DispatcherConfig) -> Option<u64> {
        if self.owner_dead {
            return None;
        }
        self.failing_since_ms?;
        self.unanswered_since()
            .map(|since| since.saturating_add(config.reroute_after_ms))
    }

    fn probe_due(&self, config: &DispatcherConfig, now_ms: u64) -> bool {
        self.is_rerouting(config, now_ms)
            && self.sent.is_empty()
            && self.retry_at_ms.is_none_or(|at| now_ms >= at)
    }
}

impl Dispatcher {
    pub fn new(config: DispatcherConfig) -> Self {
        Self {
            config,
            destinations: HashMap::new(),
            in_flight: HashMap::new(),
            next_batch_id: 1,
        }
    }

    /// Queues a durable record for its destination.
    pub fn push(&mut self, destination: Destination, record: DispatchRecord, now_ms: u64) {
        let state = self.destinations.entry(destination).or_default();
        state.pending_bytes += record.bytes();
        state.pending.push_back((now_ms, record));
    }

    /// Records waiting or in flight (the `narad_dispatcher_pending_records` gauge).
    pub fn pending_records(&self) -> usize {
        let waiting: usize = self.destinations.values().map(|s| s.pending.len()).sum();
        waiting
            + self
                .in_flight
                .values()
                .map(|(b, _)| b.records.len())
                .sum::<usize>()
    }

    fn is_due(config: &DispatcherConfig, state: &DestinationState, now_ms: u64) -> bool {
        if state.pending.is_empty()
            || state.retry_at_ms.is_some_and(|at| now_ms < at)
            || state.is_rerouting(config, now_ms)
        {
            return false;
        }
        let full = state.pending.len() >= config.batch_records_max
            || state.pending_bytes >= config.batch_bytes_max;
        if state.in_flight() == 0 {
            return full || Self::busy_until(config, state).is_none_or(|until| now_ms >= until);
        }
        let lingered = state
            .pending
            .front()
            .is_some_and(|(t, _)| now_ms.saturating_sub(*t) >= config.max_linger_ms);
        state.in_flight() < config.in_flight_per_destination_max && (lingered || full)
    }

    /// Until when a destination whose last commit returned recently waits
    /// before its next one (`None`: it is idle).
    fn busy_until(config: &DispatcherConfig, state: &DestinationState) -> Option<u64> {
        let linger = Self::linger_ms(config, state);
        state
            .last_done_ms
            .map(|done| done + linger)
            .filter(|_| linger > 0)
    }

    /// The spacing of a busy destination's commits: what they cost, times
    /// [`BUSY_LINGER_PER_COMMIT`], within `busy_linger_ms`.
    fn linger_ms(config: &DispatcherConfig, state: &DestinationState) -> u64 {
        let cap = config.busy_linger_ms.min(config.max_linger_ms);
        let wanted = state
            .commit_ms
            .map_or(0.0, |ms| (ms * BUSY_LINGER_PER_COMMIT).round());
        // `as` saturates for floats: a huge average gives the cap.
        (wanted as u64).min(cap)
    }

    /// The batches to send now.
    pub fn poll_ready(&mut self, now_ms: u64) -> Vec<CommitBatch> {
        let config = self.config;
        // Destinations that went quiet are forgotten once no longer busy.
        self.destinations.retain(|_, state| {
            !(state.pending.is_empty()
                && state.in_flight() == 0
                && state.failing_since_ms.is_none()
                && !state.owner_dead
                && Self::busy_until(&config, state).is_none_or(|until| now_ms >= until))
        });
        let mut ready = Vec::new();
        let mut due: Vec<Destination> = self
            .destinations
            .iter()
            .filter(|(_, state)| {
                Self::is_due(&config, state, now_ms) || state.probe_due(&config, now_ms)
            })
            .map(|(destination, _)| destination.clone())
            .collect();
        due.sort();
        for destination in due {
            let Some(state) = self.destinations.get_mut(&destination) else {
                continue;
            };
            let mut records = Vec::new();
            let mut bytes = 0u64;
            // A probe carries nothing: a rerouting destination's records go
            // to its siblings.
            let probe = state.is_rerouting(&config, now_ms);
            while let Some((_, record)) = state.pending.front().filter(|_| !probe) {
                if !records.is_empty()
                    && (records.len() >= self.config.batch_records_max
                        || bytes + record.bytes() > self.config.batch_bytes_max)
                {
                    break;
                }
                bytes += record.bytes();
                if let Some((_, record)) = state.pending.pop_front() {
                    records.push(record);
                }
            }
            state.pending_bytes -= bytes;
            state.sent.push((self.next_batch_id, now_ms));
            let batch = CommitBatch {
                batch_id: self.next_batch_id,
                destination,
                records,
            };
            self.next_batch_id += 1;
            self.in_flight
                .insert(batch.batch_id, (batch.clone(), now_ms));
            ready.push(batch);
        }
        ready
    }

    /// The owner confirmed a batch: returns the WAL positions it covered.
    pub fn on_committed(&mut self, batch_id: u64, now_ms: u64) -> Vec<WalPos> {
        let Some((batch, sent_ms)) = self.in_flight.remove(&batch_id) else {
            return Vec::new();
        };
        if let Some(state) = self.destinations.get_mut(&batch.destination) {
            if !batch.is_probe() {
                let took = now_ms.saturating_sub(sent_ms) as f64;
                state.commit_ms = Some(state.commit_ms.map_or(took, |average| {
                    average + COMMIT_TIME_WEIGHT * (took - average)
                }));
            }
            state.sent.retain(|(id, _)| *id != batch_id);
            state.failing_since_ms = None;
            state.owner_dead = false;
            state.backoff_ms = 0;
            state.retry_at_ms = None;
            state.last_done_ms = Some(now_ms);
        }
        batch.records.iter().map(|r| r.pos).collect()
    }

    /// A batch failed (or its outcome is unknown): its records go back to the
    /// front of their destination, to be committed again after a backoff.
    pub fn on_failed(&mut self, batch_id: u64, now_ms: u64) -> Option<FailureOutcome> {
        let first = self.config.retry_backoff_min_ms;
        self.requeue(batch_id, now_ms, first, false)
    }

    /// A batch failed because its owner is marked dead: as
    /// [`Self::on_failed`], and the destination reroutes at once.
    pub fn on_owner_dead(&mut self, batch_id: u64, now_ms: u64) -> Option<FailureOutcome> {
        let first = self.config.retry_backoff_min_ms;
        self.requeue(batch_id, now_ms, first, true)
    }

    /// A batch's partition was handed over to another owner while it
    /// waited: its records go back to the front and are sent again almost
    /// at once (to the new owner, once this node's metadata names it),
    /// backing off from [`MOVED_RETRY_MS`] if the old owner is still named.
    pub fn on_moved(&mut self, batch_id: u64, now_ms: u64) -> Option<FailureOutcome> {
        self.requeue(batch_id, now_ms, MOVED_RETRY_MS, false)
    }

    fn requeue(
        &mut self,
        batch_id: u64,
        now_ms: u64,
        first_ms: u64,
        owner_dead: bool,
    ) -> Option<FailureOutcome> {
        let (batch, sent_ms) = self.in_flight.remove(&batch_id)?;
        let config = self.config;
        let state = self.destinations.entry(batch.destination).or_default();
        state.sent.retain(|(id, _)| *id != batch_id);
        for record in batch.records.into_iter().rev() {
            state.pending_bytes += record.bytes();
            state.pending.push_front((now_ms, record));
        }
        // The failure counts from the start of the attempt, not from when
        // its failure was seen (a silent owner answers after a timeout).
        state.failing_since_ms = Some(state.failing_since_ms.map_or(sent_ms, |s| s.min(sent_ms)));
        state.owner_dead |= owner_dead;
        state.backoff_ms = if state.backoff_ms == 0 {
            first_ms.min(config.retry_backoff_max_ms)
        } else {
            (state.backoff_ms * 2).min(config.retry_backoff_max_ms)
        };
        let retry_at_ms = now_ms + state.backoff_ms;
        state.retry_at_ms = Some(retry_at_ms);
        Some(if state.is_rerouting(&config, now_ms) {
            FailureOutcome::RerouteDue { retry_at_ms }
        } else {
            FailureOutcome::Retry { retry_at_ms }
        })
    }

    /// Whether records for `destination` go to a sibling now (its owner
    /// failed for `reroute_after_ms`, or is dead).
    pub fn is_rerouting(&self, destination: &Destination, now_ms: u64) -> bool {
        self.destinations
            .get(destination)
            .is_some_and(|s| s.is_rerouting(&self.config, now_ms))
    }

    /// The destinations whose waiting records should go to a sibling now:
    /// those that are rerouting and have records waiting.
    pub fn reroutes_due(&self, now_ms: u64) -> Vec<Destination> {
        let mut due: Vec<Destination> = self
            .destinations
            .iter()
            .filter(|(_, s)| !s.pending.is_empty() && s.is_rerouting(&self.config, now_ms))
            .map(|(destination, _)| destination.clone())
            .collect();
        due.sort();
        due
    }

    /// Takes every waiting record of a destination (to reroute them).
    pub fn take_pending(&mut self, destination: &Destination) -> Vec<DispatchRecord> {
        let Some(state) = self.destinations.get_mut(destination) else {
            return Vec::new();
        };
        state.pending_bytes = 0;
        let records = state.pending.drain(..).map(|(_, record)| record).collect();
        self.forget_idle(destination);
        records
    }

    /// When `poll_ready` may next have something to send, if anything waits.
    pub fn next_deadline_ms(&self, now_ms: u64) -> Option<u64> {
        let config = &self.config;
        self.destinations
            .values()
            .filter_map(|s| {
                if s.is_rerouting(config, now_ms) {
                    // Its records go to siblings when they come; the next
                    // probe once the backoff ends.
                    return s.sent.is_empty().then(|| s.retry_at_ms.unwrap_or(now_ms));
                }
                let send = match s.pending.front() {
                    None => None,
                    // An answer comes first, and wakes the loop.
                    Some(_) if s.in_flight() >= config.in_flight_per_destination_max => None,
                    Some(_) if s.retry_at_ms.is_some_and(|at| at > now_ms) => s.retry_at_ms,
                    Some((pushed, _)) => {
                        let lingered = pushed + config.max_linger_ms;
                        match Self::busy_until(config, s) {
                            Some(until) if s.in_flight() == 0 => Some(until.min(lingered)),
                            _ => Some(lingered),
                        }
                    }
                };
                let reroute = s.reroute_at(config).filter(|_| !s.pending.is_empty());
                match (send, reroute) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            })
            .min()
    }

    fn forget_idle(&mut self, destination: &Destination) {
        if self.destinations.get(destination).is_some_and(|s| {
            s.pending.is_empty()
                && s.in_flight() == 0
                && s.failing_since_ms.is_none()
                && !s.owner_dead
        }) {
            self.destinations.remove(destination);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: DispatcherConfig = DispatcherConfig {
        max_linger_ms: 50,
        busy_linger_ms: 5,
        reroute_after_ms: 3000,
        batch_records_max: 4,
        batch_bytes_max: 1 << 20,
        retry_backoff_min_ms: 100,
        retry_backoff_max_ms: 1000,
        in_flight_per_destination_max: 2,
    };

    fn dest(partition: u32) -> Destination {
        Destination {
            topic: Rc::from("orders"),
            partition,
        }
    }

    fn record(pos: u64) -> DispatchRecord {
        DispatchRecord {
            idempotency_key: None,
            incarnation: None,
            pos,
            id: u128::from(pos),
            key: None,
            value: bytes::Bytes::from(vec![1; 10]),
            accept_ms: 0,
        }
    }

    fn positions(batch: &CommitBatch) -> Vec<u64> {
        batch.records.iter().map(|r| r.pos).collect()
    }

    #[test]
    fn an_idle_destination_gets_its_records_at_once() {
        let mut d = Dispatcher::new(CONFIG);
        d.push(dest(0), record(1), 0);
        let ready = d.poll_ready(0);
        assert_eq!(ready.len(), 1);
        assert_eq!(positions(&ready[0]), vec![1]);
        assert_eq!(d.on_committed(ready[0].batch_id, 1), vec![1]);
        assert_eq!(d.pending_records(), 0);
        assert_eq!(d.next_deadline_ms(1), None);
        d.push(dest(0), record(2), 40);
        assert_eq!(
            d.poll_ready(40).len(),
            1,
            "long after the last commit: at once again"
        );
    }

    #[test]
    fn records_gather_while_a_commit_is_in_flight_and_leave_when_it_returns() {
        let mut d = Dispatcher::new(CONFIG);
        d.push(dest(0), record(1), 0);
        let first = d.poll_ready(0);
        for pos in 2..=4 {
            d.push(dest(0), record(pos), 1);
        }
        assert!(
            d.poll_ready(10).is_empty(),
            "lingers while the first commit is in flight"
        );
        assert_eq!(d.next_deadline_ms(10), Some(51));
        d.on_committed(first[0].batch_id, 11);
        assert!(
            d.poll_ready(15).is_empty(),
            "a busy destination waits busy_linger_ms after its last commit"
        );
        assert_eq!(d.next_deadline_ms(15), Some(16));
        let second = d.poll_ready(16);
        assert_eq!(positions(&second[0]), vec![2, 3, 4]);
    }

    #[test]
    fn the_linger_follows_what_commits_cost_within_busy_linger_ms() {
        let mut d = Dispatcher::new(CONFIG);
        // A commit that returns within its millisecond: the next records
        // leave the moment they come.
        d.push(dest(0), record(1), 0);
        let first = d.poll_ready(0);
        d.on_committed(first[0].batch_id, 0);
        d.push(dest(0), record(2), 0);
        let second = d.poll_ready(0);
        assert_eq!(second.len(), 1, "cheap commits: no linger");
        // That one takes 2 ms (average 0.5 ms): the next waits 1 ms.
        d.on_committed(second[0].batch_id, 2);
        d.push(dest(0), record(3), 2);
        assert!(d.poll_ready(2).is_empty());
        assert_eq!(d.next_deadline_ms(2), Some(3));
        let third = d.poll_ready(3);
        assert_eq!(positions(&third[0]), vec![3]);
        // Slow commits (an fsync-bound owner): the linger grows to
        // busy_linger_ms (5) and no further.
        d.on_committed(third[0].batch_id, 40);
        d.push(dest(0), record(4), 40);
        assert!(
            d.poll_ready(44).is_empty(),
            "spaced out after a slow commit"
        );
        assert_eq!(d.poll_ready(45).len(), 1, "at most busy_linger_ms");
    }

    #[test]
    fn a_busy_destination_commits_a_full_batch_at_once() {
        let mut d = Dispatcher::new(CONFIG);
        d.push(dest(0), record(1), 0);
        let first = d.poll_ready(0);
        d.on_committed(first[0].batch_id, 1);
        d.push(dest(0), record(2), 2);
        assert!(d.poll_ready(2).is_empty(), "busy: gathers");
        for pos in 3..=5 {
            d.push(dest(0), record(pos), 3);
        }
        let full = d.poll_ready(3);
        assert_eq!(
            positions(&full[0]),
            vec![2, 3, 4, 5],
            "full: leaves at once"
        );
    }

    #[test]
    fn a_slow_owner_gets_a_second_commit_after_max_linger() {
        let mut d = Dispatcher::new(CONFIG);
        d.push(dest(0), record(1), 0);
        d.poll_ready(0);
        d.push(dest(0), record(2), 5);
        assert!(d.poll_ready(54).is_empty());
        assert_eq!(d.poll_ready(55).len(), 1, "lingered 50 ms");
        d.push(dest(0), record(3), 60);
        assert!(
            d.poll_ready(200).is_empty(),
            "at most two commits in flight"
        );
    }

    #[test]
    fn batches_are_capped_and_destinations_independent() {
        let mut d = Dispatcher::new(CONFIG);
        for pos in 1..=6 {
            d.push(dest(0), record(pos), 0);
        }
        d.push(dest(1), record(7), 0);
        let ready = d.poll_ready(0);
        assert_eq!(ready.len(), 2);
        assert_eq!(positions(&ready[0]), vec![1, 2, 3, 4]);
        assert_eq!(positions(&ready[1]), vec![7]);
        assert!(
            d.poll_ready(49).is_empty(),
            "the rest waits for the commit in flight"
        );
        let rest = d.poll_ready(50);
        assert_eq!(
            positions(&rest[0]),
            vec![5, 6],
            "or for the linger bound, counted from its push"
        );
    }

    #[test]
    fn a_failed_commit_is_retried_in_order_with_backoff_then_reroute_is_due() {
        let mut d = Dispatcher::new(CONFIG);
        d.push(dest(0), record(1), 0);
        d.push(dest(0), record(2), 0);
        let batch = d.poll_ready(0).remove(0);
        d.push(dest(0), record(3), 1);
        assert_eq!(
            d.on_failed(batch.batch_id, 10),
            Some(FailureOutcome::Retry { retry_at_ms: 110 })
        );
        assert!(d.poll_ready(109).is_empty(), "backs off");
        let retry = d.poll_ready(110).remove(0);
        assert_eq!(positions(&retry), vec![1, 2, 3], "nothing lost, order kept");
        assert_eq!(
            d.on_failed(retry.batch_id, 200),
            Some(FailureOutcome::Retry { retry_at_ms: 400 })
        );
        let again = d.poll_ready(400).remove(0);
        assert_eq!(
            d.on_failed(again.batch_id, 3010),
            Some(FailureOutcome::RerouteDue { retry_at_ms: 3410 })
        );
        let moved: Vec<u64> = d.take_pending(&dest(0)).iter().map(|r| r.pos).collect();
        assert_eq!(moved, vec![1, 2, 3]);
        assert_eq!(d.pending_records(), 0);
    }

    #[test]
    fn a_batch_whose_partition_moved_is_sent_again_at_once_then_backs_off() {
        let mut d = Dispatcher::new(CONFIG);
        d.push(dest(0), record(1), 0);
        let batch = d.poll_ready(0).remove(0);
        assert_eq!(
            d.on_moved(batch.batch_id, 10),
            Some(FailureOutcome::Retry {
                retry_at_ms: 10 + MOVED_RETRY_MS
            })
        );
        let retry = d.poll_ready(10 + MOVED_RETRY_MS).remove(0);
        assert_eq!(positions(&retry), vec![1], "nothing lost");
        // The old owner still named: the waits grow as for any failure.
        assert_eq!(
            d.on_moved(retry.batch_id, 20),
            Some(FailureOutcome::Retry {
                retry_at_ms: 20 + 2 * MOVED_RETRY_MS
            })
        );
        let again = d.poll_ready(20 + 2 * MOVED_RETRY_MS).remove(0);
        let positions_committed = d.on_committed(again.batch_id, 30);
        assert_eq!(positions_committed, vec![1]);
        // A later ordinary failure starts from the ordinary backoff.
        d.push(dest(0), record(2), 40);
        let late = d.poll_ready(100).remove(0);
        assert_eq!(
            d.on_failed(late.batch_id, 100),
            Some(FailureOutcome::Retry { retry_at_ms: 200 })
        );
    }

    /// A silent owner: each attempt fails after a 1 s timeout. The 3 s
    /// count from the start of the first attempt, not from its failure.
    #[test]
    fn the_reroute_is_due_three_seconds_after_the_first_unanswered_attempt_started() {
        let mut d = Dispatcher::new(CONFIG);
        d.push(dest(0), record(1), 0);
        let first = d.poll_ready(0).remove(0);
        assert_eq!(
            d.on_failed(first.batch_id, 1000),
            Some(FailureOutcome::Retry { retry_at_ms: 1100 })
        );
        let second = d.poll_ready(1100).remove(0);
        d.push(dest(0), record(2), 2990);
        assert!(d.poll_ready(2990).is_empty(), "lingers behind the retry");
        assert!(d.reroutes_due(2999).is_empty(), "not yet");
        assert_eq!(
            d.next_deadline_ms(2990),
            Some(3000),
            "the loop wakes when the reroute comes due"
        );
        assert_eq!(
            d.reroutes_due(3000),
            vec![dest(0)],
            "3 s after the first attempt started, with the second still in flight"
        );
        let moved: Vec<u64> = d.take_pending(&dest(0)).iter().map(|r| r.pos).collect();
        assert_eq!(moved, vec![2]);
        // The attempt in flight fails too: its records are rerouted at once.
        assert_eq!(
            d.on_failed(second.batch_id, 3100),
            Some(FailureOutcome::RerouteDue { retry_at_ms: 3300 })
        );
        assert_eq!(d.reroutes_due(3100), vec![dest(0)]);
        assert_eq!(d.take_pending(&dest(0)).len(), 1);
    }

    #[test]
    fn a_rerouting_destination_sends_new_records_to_siblings_and_only_probes_its_owner() {
        let mut d = Dispatcher::new(CONFIG);
        d.push(dest(0), record(1), 0);
        let first = d.poll_ready(0).remove(0);
        d.on_failed(first.batch_id, 3000);
        assert_eq!(d.reroutes_due(3000), vec![dest(0)]);
        d.take_pending(&dest(0));
        // Ten seconds later a new record for it is rerouted the moment it
        // comes, and no batch carries a record to the failing owner.
        d.push(dest(0), record(2), 13_000);
        assert_eq!(d.reroutes_due(13_000), vec![dest(0)]);
        let ready = d.poll_ready(13_000);
        assert!(
            ready.iter().all(CommitBatch::is_probe),
            "only a probe goes to the failing owner: {ready:?}"
        );
        d.take_pending(&dest(0));
        // A probe that fails keeps the reroute; one that succeeds ends it.
        let probe = match ready.into_iter().next() {
            Some(probe) => probe,
            None => d.poll_ready(14_000).remove(0),
        };
        assert!(probe.is_probe());
        let retry_at = match d.on_failed(probe.batch_id, 14_100) {
            Some(FailureOutcome::RerouteDue { retry_at_ms }) => retry_at_ms,
            other => panic!("{other:?}"),
        };
        assert!(d.poll_ready(retry_at - 1).is_empty(), "probes back off");
        let probe = d.poll_ready(retry_at).remove(0);
        assert!(probe.is_probe());
        assert_eq!(
            d.on_committed(probe.batch_id, retry_at + 1),
            Vec::<u64>::new()
        );
        d.push(dest(0), record(3), retry_at + 2);
        assert!(d.reroutes_due(retry_at + 2).is_empty());
        let ready = d.poll_ready(retry_at + 2);
        assert_eq!(
            positions(&ready[0]),
            vec![3],
            "the owner takes records again"
        );
    }

    #[test]
    fn a_dead_owner_reroutes_at_once() {
        let mut d = Dispatcher::new(CONFIG);
        d.push(dest(0), record(1), 0);
        let first = d.poll_ready(0).remove(0);
        assert_eq!(
            d.on_owner_dead(first.batch_id, 1),
            Some(FailureOutcome::RerouteDue { retry_at_ms: 101 })
        );
        assert_eq!(d.reroutes_due(1), vec![dest(0)]);
        d.take_pending(&dest(0));
        d.push(dest(0), record(2), 5);
        assert_eq!(d.reroutes_due(5), vec![dest(0)], "later records too");
    }

    /// The production configuration: a record never waits longer than
    /// `max_linger_ms` plus one commit's time before it is sent, even
    /// behind a commit that takes its whole 1 s timeout.
    #[test]
    fn in_production_no_record_waits_longer_than_max_linger_plus_one_commit() {
        let config = crate::config::Config::resolve(None, Vec::new(), &[]).expect("defaults");
        let settings = Settings::from_config(&config).expect("settings");
        let config = DispatcherConfig::of(&settings);
        let mut d = Dispatcher::new(config);
        d.push(dest(0), record(1), 0);
        let slow = d.poll_ready(0).remove(0);
        d.push(dest(0), record(2), 5);
        assert!(d.poll_ready(54).is_empty());
        assert_eq!(d.next_deadline_ms(6), Some(55));
        let second = d.poll_ready(55);
        assert_eq!(
            second.iter().map(positions).collect::<Vec<_>>(),
            vec![vec![2]],
            "sent after max_linger_ms, not after the slow commit's 1 s"
        );
        d.on_committed(slow.batch_id, 1000);

        // Many producers, commits of random length: each record is sent
        // within max_linger_ms plus the longest commit.
        let mut d = Dispatcher::new(config);
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % below
        };
        let longest_commit = 400;
        let mut pushed_at = HashMap::new();
        let mut answers: Vec<(u64, u64)> = Vec::new();
        let mut worst = 0;
        for now in 0..20_000u64 {
            if next(4) == 0 {
                let pos = now + 1;
                d.push(dest(0), record(pos), now);
                pushed_at.insert(pos, now);
            }
            answers.retain(|(at, batch_id)| {
                let due = *at <= now;
                if due {
                    d.on_committed(*batch_id, now);
                }
                !due
            });
            for batch in d.poll_ready(now) {
                for pos in positions(&batch) {
                    worst = worst.max(now - pushed_at[&pos]);
                }
                answers.push((now + next(longest_commit + 1), batch.batch_id));
            }
        }
        assert!(
            worst <= settings.dispatcher.max_linger_ms + longest_commit,
            "a record waited {worst} ms before it was sent"
        );
    }
}
