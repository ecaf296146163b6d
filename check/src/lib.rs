//! # narad-check
//!
//! The record of what clients did to a Narad cluster and what it answered
//! (a [`History`]), and the [`check`] of that record against the delivery
//! contract. The contract suites record every produce, consume, ack, nack and
//! extend with its start and end time and outcome, and every fault the
//! nemesis injected; the checker then counts, with examples:
//!
//! - **lost**: answered 202, never delivered;
//! - **unknown**: delivered, never produced;
//! - **wrong topic**: delivered on a topic it was not produced to;
//! - **duplicates**, split into those a lease end, a nack or a crash
//!   explains and those nothing explains;
//! - **acked, then delivered again** with no crash between the ack and the
//!   delivery to explain it;
//! - **late acks answered 204**: an ack sent after its lease ended that the
//!   node accepted;
//! - **never acked**: answered 202 but no delivery of it was ever acked.
//!
//! Which of these fail a run is the suite's choice ([`Report::violations`]).
//! Times are wall-clock milliseconds on one machine, the clock the node's
//! `lease_expires_at_ms` also uses.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// How late (ms) an ack must start after its lease ended before a 204 to
/// it counts as a violation: the node and the client read the same clock,
/// but a request spends time in flight.
pub const LATE_ACK_SLACK_MS: u64 = 250;
/// Examples kept per kind of finding.
const EXAMPLES_MAX: usize = 5;

/// Wall-clock milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One client operation or nemesis action, with when it started and ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub start_ms: u64,
    pub end_ms: u64,
    /// Which client (or `nemesis`) did it.
    pub client: String,
    pub op: Op,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// `value` is unique in the history: it identifies a message whose
    /// produce had no answer.
    Produce {
        topic: String,
        value: String,
        outcome: Outcome<String>,
    },
    Consume {
        topic: String,
        outcome: Outcome<Vec<Delivery>>,
    },
    Settle {
        action: SettleAction,
        topic: String,
        /// The delivery the receipt came from: its id and its receipt, which
        /// names that one lease.
        id: String,
        receipt: String,
        /// For an extend that succeeded: the new lease end.
        outcome: Outcome<Option<u64>>,
    },
    Nemesis {
        action: NemesisAction,
        node: String,
    },
}

/// What an operation got back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome<T> {
    /// The success answer (202, 200, 204) and what it carried.
    Ok { value: T },
    /// An error answer with its status and code.
    Refused { status: u16, code: String },
    /// No answer: a timeout or a broken connection.
    Unknown { reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub id: String,
    pub topic: String,
    pub partition: u32,
    pub offset: u64,
    pub value: String,
    pub delivery_count: u32,
    pub lease_expires_at_ms: u64,
    pub receipt: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SettleAction {
    Ack,
    Nack,
    Extend,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NemesisAction {
    /// SIGKILL.
    Kill,
    /// SIGKILL with unsynced writes dropped (power-loss mode).
    PowerCut,
    /// SIGTERM (graceful).
    Terminate,
    /// SIGSTOP.
    Pause,
    /// SIGCONT.
    Resume,
    /// The node started again.
    Start,
}

impl NemesisAction {
    /// A crash: writes not yet synced (acks within their flush interval,
    /// records above the WAL checkpoint) may be lost or replayed.
    fn is_crash(self) -> bool {
        matches!(self, NemesisAction::Kill | NemesisAction::PowerCut)
    }

    /// The node stops answering for a while: its partitions' commits fail,
    /// and after `dispatcher.reroute_after_ms` go to a sibling partition, so
    /// a commit that landed late is stored twice (the reroute).
    fn makes_owner_unreachable(self) -> bool {
        !matches!(self, NemesisAction::Start | NemesisAction::Resume)
    }

    /// The node's leases end (every restart hands leased messages out again).
    fn ends_leases(self) -> bool {
        matches!(
            self,
            NemesisAction::Kill | NemesisAction::PowerCut | NemesisAction::Terminate
        )
    }
}

/// A history being recorded by many threads.
#[derive(Debug, Default)]
pub struct History {
    events: Mutex<Vec<Event>>,
}

impl History {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn record(&self, client: &str, start_ms: u64, op: Op) {
        let event = Event {
            start_ms,
            end_ms: now_ms(),
            client: client.to_string(),
            op,
        };
        if let Ok(mut events) = self.events.lock() {
            events.push(event);
        }
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Writes the history as JSON lines, one event each.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
        for event in self.events() {
            serde_json::to_writer(&mut file, &event)?;
            file.write_all(b"\n")?;
        }
        file.flush()
    }

    /// Reads a history written by [`History::write`].
    pub fn read(path: &Path) -> std::io::Result<Vec<Event>> {
        let text = std::fs::read_to_string(path)?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).map_err(std::io::Error::other))
            .collect()
    }
}

/// Counts and examples of one kind of finding.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Finding {
    pub count: usize,
    pub examples: Vec<String>,
}

impl Finding {
    fn add(&mut self, example: impl FnOnce() -> String) {
        self.count += 1;
        if self.examples.len() < EXAMPLES_MAX {
            self.examples.push(example());
        }
    }
}

/// What the checker found in a history.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub accepted: usize,
    pub delivered: usize,
    pub acked: usize,
    pub lost: Finding,
    pub unknown: Finding,
    pub wrong_topic: Finding,
    pub duplicates_explained: Finding,
    pub duplicates_unexplained: Finding,
    pub acked_then_delivered: Finding,
    pub late_ack_accepted: Finding,
    pub never_acked: Finding,
    /// Longest wait from a 202 to the message's first delivery (ms): how
    /// long a message waited on its owner (a node down, a reroute).
    pub max_first_delivery_ms: u64,
    /// Longest wait from a lease's end (its expiry, or a nack) to the next
    /// delivery of the message (ms), for messages that were not acked on
    /// that lease.
    pub max_redelivery_delay_ms: u64,
}

/// Which findings fail a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strictness {
    /// Nothing was broken: any duplicate, loss or stray message fails.
    Healthy,
    /// Faults were injected: every 202 must end up acked; duplicates are
    /// reported, not failed; contract violations still fail.
    Faults,
}

impl Report {
    /// The findings that fail a run under `strictness`, by name.
    pub fn violations(&self, strictness: Strictness) -> Vec<(&'static str, &Finding)> {
        let mut failing = vec![
            ("unknown", &self.unknown),
            ("wrong_topic", &self.wrong_topic),
            ("duplicates_unexplained", &self.duplicates_unexplained),
            ("acked_then_delivered", &self.acked_then_delivered),
            ("late_ack_accepted", &self.late_ack_accepted),
        ];
        match strictness {
            Strictness::Healthy => {
                failing.push(("lost", &self.lost));
                failing.push(("duplicates_explained", &self.duplicates_explained));
            }
            Strictness::Faults => failing.push(("never_acked", &self.never_acked)),
        }
        failing.retain(|(_, f)| f.count > 0);
        failing
    }

    /// A few lines for a test's failure message or log.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "accepted {}, delivered {}, acked {}; longest 202 to first delivery {} ms, \
             longest lease end to redelivery {} ms",
            self.accepted,
            self.delivered,
            self.acked,
            self.max_first_delivery_ms,
            self.max_redelivery_delay_ms
        );
        for (name, finding) in [
            ("lost", &self.lost),
            ("unknown", &self.unknown),
            ("wrong_topic", &self.wrong_topic),
            ("duplicates_explained", &self.duplicates_explained),
            ("duplicates_unexplained", &self.duplicates_unexplained),
            ("acked_then_delivered", &self.acked_then_delivered),
            ("late_ack_accepted", &self.late_ack_accepted),
            ("never_acked", &self.never_acked),
        ] {
            out.push_str(&format!("\n  {name}: {}", finding.count));
            for example in &finding.examples {
                out.push_str(&format!("\n    e.g. {example}"));
            }
        }
        out
    }
}

/// A settle that succeeded: what it did, when, and an extend's new lease end.
type Settled<'a> = (SettleAction, &'a Event, Option<u64>);

/// One delivery with when its consume ran.
#[derive(Debug, Clone)]
struct Seen<'a> {
    delivery: &'a Delivery,
    start_ms: u64,
    end_ms: u64,
}

/// Checks a history against the delivery contract.
pub fn check(events: &[Event]) -> Report {
    let mut report = Report::default();
    // Produces by value (every attempt) and the accepted ids.
    let mut produced: HashMap<&str, &str> = HashMap::new();
    let mut accepted: BTreeMap<&str, (&str, u64)> = BTreeMap::new();
    let mut deliveries: BTreeMap<&str, Vec<Seen<'_>>> = BTreeMap::new();
    // Receipt → settle events that succeeded with it.
    let mut settled: HashMap<&str, Vec<Settled<'_>>> = HashMap::new();
    let mut acked_ids: BTreeSet<&str> = BTreeSet::new();
    let mut maybe_acked_ids: BTreeSet<&str> = BTreeSet::new();
    let mut crashes: Vec<u64> = Vec::new();
    let mut lease_ends: Vec<u64> = Vec::new();
    let mut outages: Vec<u64> = Vec::new();
    for event in events {
        match &event.op {
            Op::Produce {
                topic,
                value,
                outcome,
            } => {
                produced.insert(value, topic);
                if let Outcome::Ok { value: id } = outcome {
                    accepted.insert(id, (topic, event.start_ms));
                }
            }
            Op::Consume {
                outcome: Outcome::Ok { value },
                ..
            } => {
                for delivery in value {
                    deliveries.entry(&delivery.id).or_default().push(Seen {
                        delivery,
                        start_ms: event.start_ms,
                        end_ms: event.end_ms,
                    });
                }
            }
            Op::Consume { .. } => {}
            Op::Settle {
                action,
                id,
                receipt,
                outcome: Outcome::Ok { value },
                ..
            } => {
                if *action == SettleAction::Ack {
                    acked_ids.insert(id);
                }
                settled
                    .entry(receipt)
                    .or_default()
                    .push((*action, event, *value));
            }
            // An ack without an answer, or answered 502, may have landed:
            // its message is not "never acked" (if it did not land, the
            // lease brings the message back and a later ack counts).
            Op::Settle {
                action: SettleAction::Ack,
                id,
                outcome: Outcome::Unknown { .. } | Outcome::Refused { status: 502, .. },
                ..
            } => {
                maybe_acked_ids.insert(id);
            }
            Op::Settle { .. } => {}
            Op::Nemesis { action, .. } => {
                // A fault's effect spans the whole action.
                if action.is_crash() {
                    crashes.push(event.end_ms);
                }
                if action.makes_owner_unreachable() {
                    outages.push(event.end_ms);
                }
                if action.ends_leases() {
                    lease_ends.push(event.end_ms);
                }
            }
        }
    }
    report.accepted = accepted.len();
    report.delivered = deliveries.len();
    let between = |times: &[u64], from: u64, to: u64| times.iter().any(|t| *t >= from && *t <= to);

    for (id, (topic, _)) in &accepted {
        if !deliveries.contains_key(id) {
            report
                .lost
                .add(|| format!("{id} on {topic}: 202, never delivered"));
        }
    }
    for (id, seen) in &mut deliveries {
        // In the order the leases were granted: a lease ends one visibility
        // timeout after it was granted, and the suites use one visibility per
        // topic (a message has one topic). A consume's answer can arrive long
        // after its lease was granted (its node paused, or it waited on a
        // node that was down), so the answer's time does not order them.
        seen.sort_by_key(|s| {
            (
                s.delivery.lease_expires_at_ms,
                s.delivery.delivery_count,
                s.end_ms,
            )
        });
        for s in seen.iter() {
            match produced.get(s.delivery.value.as_str()) {
                None => report.unknown.add(|| {
                    format!(
                        "{id} value {:?} on {}: never produced",
                        s.delivery.value, s.delivery.topic
                    )
                }),
                Some(topic) if *topic != s.delivery.topic => report.wrong_topic.add(|| {
                    format!(
                        "{id}: produced to {topic}, delivered on {}",
                        s.delivery.topic
                    )
                }),
                Some(_) => {}
            }
        }
        if let (Some((_, accepted_at)), Some(first)) =
            (accepted.get(id), seen.iter().map(|s| s.end_ms).min())
        {
            report.max_first_delivery_ms = report
                .max_first_delivery_ms
                .max(first.saturating_sub(*accepted_at));
        }
        let mut was_acked = false;
        for pair in seen.windows(2) {
            let (prev, next) = (&pair[0], &pair[1]);
            let same_entry = prev.delivery.partition == next.delivery.partition
                && prev.delivery.offset == next.delivery.offset;
            // What the holder of the first lease did with it, before the
            // second delivery ended.
            let settles = settled
                .get(prev.delivery.receipt.as_str())
                .map(Vec::as_slice)
                .unwrap_or_default();
            let in_window = |e: &&Settled<'_>| e.1.start_ms <= next.end_ms;
            let nacked = settles
                .iter()
                .filter(in_window)
                .any(|(a, _, _)| *a == SettleAction::Nack);
            let lease_end = settles
                .iter()
                .filter(in_window)
                .filter_map(|(a, _, v)| (*a == SettleAction::Extend).then_some(*v).flatten())
                .fold(prev.delivery.lease_expires_at_ms, u64::max);
            let ack = settles
                .iter()
                .filter(in_window)
                .find(|(a, _, _)| *a == SettleAction::Ack);
            if ack.is_none() {
                let released = settles
                    .iter()
                    .filter(in_window)
                    .filter(|(a, _, _)| *a == SettleAction::Nack)
                    .map(|(_, e, _)| e.start_ms)
                    .fold(lease_end, u64::min);
                report.max_redelivery_delay_ms = report
                    .max_redelivery_delay_ms
                    .max(next.end_ms.saturating_sub(released));
            }
            let describe = || {
                format!(
                    "{id}: delivered at {} (p{} o{} count {}) and again at {} (p{} o{} count {})",
                    prev.end_ms,
                    prev.delivery.partition,
                    prev.delivery.offset,
                    prev.delivery.delivery_count,
                    next.end_ms,
                    next.delivery.partition,
                    next.delivery.offset,
                    next.delivery.delivery_count
                )
            };
            if same_entry {
                if let Some((_, ack, _)) = ack {
                    if !between(&crashes, ack.start_ms, next.end_ms) {
                        report
                            .acked_then_delivered
                            .add(|| format!("{} after an ack at {}", describe(), ack.end_ms));
                        continue;
                    }
                }
                // The second lease was granted some time before its consume
                // answered (a consume to a paused node is served after the
                // pause): only one that answered before the first lease
                // ended proves an overlap.
                let explained = nacked
                    || next.end_ms >= lease_end
                    || between(&lease_ends, prev.start_ms, next.end_ms);
                if explained {
                    report.duplicates_explained.add(describe);
                } else {
                    report.duplicates_unexplained.add(describe);
                }
            } else if between(&outages, 0, next.end_ms) {
                // Stored twice: a crash replayed records above the
                // checkpoint, or a reroute around an unreachable owner
                // stored again what it had stored late.
                report.duplicates_explained.add(describe);
            } else {
                report.duplicates_unexplained.add(describe);
            }
        }
        for s in seen.iter() {
            let settles = settled
                .get(s.delivery.receipt.as_str())
                .map(Vec::as_slice)
                .unwrap_or_default();
            for (action, event, _) in settles {
                if *action != SettleAction::Ack {
                    continue;
                }
                was_acked = true;
                let extended = settles
                    .iter()
                    .filter(|(a, e, _)| *a == SettleAction::Extend && e.start_ms < event.start_ms)
                    .filter_map(|(_, _, v)| *v)
                    .fold(s.delivery.lease_expires_at_ms, u64::max);
                if event.start_ms > extended + LATE_ACK_SLACK_MS {
                    report.late_ack_accepted.add(|| {
                        format!(
                            "{id}: ack sent at {}, lease ended at {extended}, answered 204",
                            event.start_ms
                        )
                    });
                }
            }
        }
        if was_acked {
            report.acked += 1;
        }
    }
    for (id, (topic, _)) in &accepted {
        if !acked_ids.contains(id) && !maybe_acked_ids.contains(id) {
            report
                .never_acked
                .add(|| format!("{id} on {topic}: 202, never acked"));
        }
    }
    report
}

#[cfg(test)]
mod tests;
