//! # narad-check
//!
//! The record of what clients did to a Narad cluster and what it answered
//! (a [`History`]), and the [`check`] of that record against the delivery
//! contract. The contract suites record every produce, consume, ack, nack and
//! extend with its start and end time and outcome, every request a client
//! abandoned (sent whole, then the connection closed before the answer), the
//! node that owns each partition, and every fault the nemesis injected; the
//! checker then counts, with examples:
//!
//! - **lost**: answered 202, never delivered;
//! - **unknown**: delivered, never produced;
//! - **wrong topic**: delivered on a topic it was not produced to;
//! - **wrong value**: delivered with a body other than the one its produce
//!   sent, or one body delivered under two ids from one partition (a body
//!   produced more than once is a client's retries of one message with one
//!   idempotency key: the node that took it, or else the partition's owner,
//!   must store it once). Two ids from two partitions are a copy rerouted
//!   to a sibling partition, reported as **rerouted copies**; an id
//!   answered to a retry whose copy the owner dropped is neither lost nor
//!   unacked once another id of its body was delivered;
//! - **duplicates**, split into those the contract explains and those
//!   nothing explains. A second delivery of one entry needs its lease to
//!   have ended (expiry, nack, or a restart or handover of its owner). A
//!   message stored again at another offset needs one of the contract's two
//!   re-commits: its accepting node restarted while the record was still
//!   above that node's WAL checkpoint (within [`CHECKPOINT_LAG_MS`] of the
//!   commit, or later only while some node was down and held an older
//!   record back), or an owner that stored a copy was down around that
//!   commit, so its answer was lost and the record was sent again to the
//!   same partition or a sibling;
//! - **acked, then delivered again**: an ack answered 204, then the same
//!   entry delivered again, unless the node that owns its partition crashed
//!   within the contract's window after the ack ([`ACKS_LOST_TO_A_KILL_MS`],
//!   [`ACKS_LOST_TO_A_POWER_CUT_MS`]); an ack without an answer settles
//!   nothing;
//! - **late acks answered 204**: an ack sent after its lease ended that the
//!   node accepted;
//! - **offset reused**: one offset of a partition delivered as two
//!   messages (an offset consumers saw given to another), unless the
//!   partition changed hands or a volume of its owner was lost;
//! - **never acked**: answered 202 but no delivery of it was ever acked
//!   (an ack whose answer is unknown may have landed: it counts here).
//!
//! Which of these fail a run is the suite's choice ([`Report::violations`]).
//! Times are wall-clock milliseconds on one machine, the clock the node's
//! `lease_expires_at_ms` also uses.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// How late (ms) an ack must start after its lease ended before a 204 to
/// it counts as a violation: the node and the client read the same clock,
/// but a request spends time in flight.
pub const LATE_ACK_SLACK_MS: u64 = 250;
/// `storage.ack_flush_interval_ms`: the default, which the suites keep.
/// Each tick of that interval hands every ack not yet written to the OS.
pub const ACK_FLUSH_INTERVAL_MS: u64 = 100;
/// `storage.consumer_offset_commit_interval_ms`: the default, which the
/// suites keep. Acks written to the OS are fdatasynced once the oldest of
/// them is this old, at the next tick.
pub const ACK_SYNC_INTERVAL_MS: u64 = 1_000;
/// How late the tick that writes (or syncs) acks may come: the ticks run one
/// interval apart, after the previous one's work, on a loaded machine.
pub const ACK_TICK_SLACK_MS: u64 = ACK_FLUSH_INTERVAL_MS;
/// How long before a SIGKILL of a partition's owner an ack answered 204 may
/// have been to be lost. delivery-contract.md, "When a message comes back",
/// 3: "Acks go to disk in batches, so acks from roughly the last **100 ms**
/// before the crash are lost and those messages come back too
/// (`storage.ack_flush_interval_ms`)." Plus one tick of slack.
pub const ACKS_LOST_TO_A_KILL_MS: u64 = ACK_FLUSH_INTERVAL_MS + ACK_TICK_SLACK_MS;
/// The same for a power cut of the owner. delivery-contract.md, "When a
/// message comes back", 4: "As for a crash, but the lost acks cover roughly
/// the last **1.1 s**: the ack sync interval
/// (`storage.consumer_offset_commit_interval_ms`, 1 s), plus about 100 ms,
/// plus the time one sync takes." Plus one tick of slack (which also covers
/// the sync).
pub const ACKS_LOST_TO_A_POWER_CUT_MS: u64 =
    ACK_SYNC_INTERVAL_MS + ACK_FLUSH_INTERVAL_MS + ACK_TICK_SLACK_MS;
/// `dispatcher.checkpoint_interval_ms` (the default, which the suites keep)
/// plus one interval of slack: once the owner has confirmed a record and
/// every older record of the accepting node's WAL, the WAL's checkpoint
/// passes it within this long. Until then a crash of the accepting node
/// sends it again.
pub const CHECKPOINT_LAG_MS: u64 = 2 * 250;
/// How long after a restarted node answers again its partitions may still
/// be opening (each opens at its first use, reading back its log's tail),
/// so that a commit sent to it then can outlast its caller's deadline.
pub const PARTITIONS_OPEN_MS: u64 = 1_000;
/// How long after a node answers again a record that waited for it is
/// confirmed: the dispatcher's longest retry backoff (2 s), one commit call
/// timing out (1 s), and the node's partitions opening.
pub const RECOVERY_SLACK_MS: u64 = 2_000 + 1_000 + PARTITIONS_OPEN_MS;
/// How long after a commit was stored its answer can still be lost to a
/// fault of the owner: one commit call's timeout.
pub const ANSWER_LOST_SLACK_MS: u64 = 1_000;
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
    /// `value` identifies a message, also one whose produce had no
    /// answer. Several produces of one value are retries of one message
    /// with one idempotency key, at one node or several, stored once: the
    /// value delivered under two ids from one partition is a finding
    /// (wrong value).
    Produce {
        topic: String,
        value: String,
        /// The partition the message's key maps to, when it was sent with
        /// one (and records wait for their owner rather than being
        /// rerouted): where it is stored.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        partition: Option<u32>,
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
    /// From this event's end on, the network drops every packet from node
    /// `from` to node `to` (`cut`), or carries them again (not `cut`): one
    /// way of one link. While a link of a node is cut, a commit to it or its
    /// answer may be lost, as while it is paused: the dispatcher sends it
    /// again, or to a sibling after the reroute. A cut ends no lease and
    /// loses no ack.
    Link {
        from: String,
        to: String,
        cut: bool,
    },
    /// Which node owns each partition of `topic`: `owners[p]` names the
    /// node of partition `p`, as the nemesis names nodes (`n1`, ...).
    /// Recorded at the start of a run; a partition that moves later says
    /// so with [`Op::Handover`]. A delivery's partition is where its entry
    /// is stored (a rerouted message is stored in a sibling partition), so
    /// this says whose crash can lose its ack or end its lease.
    Owners {
        topic: String,
        owners: Vec<String>,
    },
    /// A partition moved: `to` owns it from the event's end on. The
    /// handover ends the leases `from` granted (their messages are
    /// delivered again, counted from 1), never an ack.
    Handover {
        topic: String,
        partition: u32,
        from: String,
        to: String,
    },
    /// A produce sent whole, after which the client closed the connection
    /// without reading the answer: it may or may not have been accepted.
    ProduceAbandoned {
        topic: String,
        value: String,
    },
    /// A consume sent whole, then abandoned: whatever it leased is held by
    /// nobody until the visibility timeout ends.
    ConsumeAbandoned {
        topic: String,
    },
    /// An ack of the delivery with `receipt` sent whole, then abandoned: it
    /// may or may not have landed.
    AckAbandoned {
        topic: String,
        id: String,
        receipt: String,
    },
    /// `child` became a child of `parent` when this event ended: every
    /// message accepted on `parent` by a produce that started after must be
    /// delivered in `child` at least once, and for a delay child not before
    /// `delay_ms` after its produce started. Consumes and settles of a
    /// child are judged by this rule only (its messages carry the parent's
    /// ids).
    Child {
        parent: String,
        child: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        delay_ms: Option<u64>,
    },
}

impl Op {
    /// The topic a consume or settle is about.
    fn consumed_topic(&self) -> Option<&str> {
        match self {
            Op::Consume { topic, .. }
            | Op::Settle { topic, .. }
            | Op::ConsumeAbandoned { topic }
            | Op::AckAbandoned { topic, .. } => Some(topic),
            _ => None,
        }
    }
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
    /// SIGKILL, then the node's data folder deleted: a lost volume. The node
    /// starts again empty.
    Wipe,
    /// SIGCONT.
    Resume,
    /// The node started again.
    Start,
}

impl NemesisAction {
    /// How long before this fault of a partition's owner an ack answered
    /// 204 may have been, to be lost by it. A SIGTERM writes every ack
    /// before the node exits, and a pause loses nothing: neither excuses
    /// an acked message delivered again.
    pub fn acks_lost_ms(self) -> Option<u64> {
        match self {
            NemesisAction::Kill | NemesisAction::Wipe => Some(ACKS_LOST_TO_A_KILL_MS),
            NemesisAction::PowerCut => Some(ACKS_LOST_TO_A_POWER_CUT_MS),
            NemesisAction::Terminate
            | NemesisAction::Pause
            | NemesisAction::Resume
            | NemesisAction::Start => None,
        }
    }

    /// The node stops answering for a while: its partitions' commits fail,
    /// and after `dispatcher.reroute_after_ms` go to a sibling partition, so
    /// a commit that landed late is stored twice (the reroute).
    fn makes_owner_unreachable(self) -> bool {
        !matches!(self, NemesisAction::Start | NemesisAction::Resume)
    }

    /// The process ends and starts again with its WAL: records above its
    /// checkpoint are committed again (a wipe loses the WAL instead).
    fn replays_wal(self) -> bool {
        matches!(
            self,
            NemesisAction::Kill | NemesisAction::PowerCut | NemesisAction::Terminate
        )
    }

    /// The node's leases end (every restart hands leased messages out again).
    fn ends_leases(self) -> bool {
        matches!(
            self,
            NemesisAction::Kill
                | NemesisAction::PowerCut
                | NemesisAction::Terminate
                | NemesisAction::Wipe
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

    /// Records an event whose times are known (what the cluster reports
    /// afterwards, such as when a handover applied).
    pub fn record_at(&self, client: &str, start_ms: u64, end_ms: u64, op: Op) {
        let event = Event {
            start_ms,
            end_ms,
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
    pub wrong_value: Finding,
    pub duplicates_explained: Finding,
    pub duplicates_unexplained: Finding,
    pub acked_then_delivered: Finding,
    /// Acked with a 204, then delivered again after a crash of the owner
    /// within the window: allowed, and counted to show the windows at work
    /// (each example says how long before the crash the ack was answered).
    pub acked_then_delivered_excused: Finding,
    pub late_ack_accepted: Finding,
    /// One offset of a partition delivered with two different messages: an
    /// offset consumers saw was given to another message (after a crash
    /// lost what was there). Excused only when the partition changed hands
    /// (a move or a promotion ends a copy where it ends) or a volume of
    /// its owner was lost.
    pub offset_reused: Finding,
    pub never_acked: Finding,
    /// Accepted messages that may have been on a volume when it was lost:
    /// in a partition its node owned, or in its WAL (accepted by it, not yet
    /// handed to the owner), 202'd before the loss.
    pub on_a_lost_volume: usize,
    /// Those of them never acked: gone with the volume, as the contract
    /// allows. Reported, never failed; every other accepted message is
    /// still held to `lost` and `never_acked`.
    pub lost_with_a_volume: Finding,
    /// Accepted messages whose only acks got no answer (or 502): they may
    /// have landed, so they are not "never acked".
    pub acked_unanswered_only: usize,
    /// Requests sent whole and then abandoned: produces, consumes, acks.
    pub abandoned: [usize; 3],
    /// Longest wait from a 202 to the message's first delivery (ms): how
    /// long a message waited on its owner (a node down, a reroute).
    pub max_first_delivery_ms: u64,
    /// Longest wait from a lease's end (its expiry, or a nack) to the next
    /// delivery of the message (ms), for messages that were not acked on
    /// that lease.
    pub max_redelivery_delay_ms: u64,
    /// Messages accepted on a parent after its child existed, never
    /// delivered in the child.
    pub child_missing: Finding,
    /// Deliveries in a delay child that ended before the delay had passed
    /// since their produce started.
    pub child_early: Finding,
    /// Deliveries in children, all told.
    pub child_delivered: usize,
    /// Ids answered 202 to a retry at another node whose copy the
    /// partition's owner dropped (a copy with the same idempotency key was
    /// stored there): their value was delivered under another id of its
    /// produces, so they are neither lost nor unacked.
    pub dropped_at_owner: usize,
    /// A value delivered under two ids from two partitions: one copy was
    /// rerouted to a sibling partition while its owner was unavailable,
    /// the one case idempotency keys do not cover. Reported, never failed.
    pub rerouted_copies: Finding,
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
            ("wrong_value", &self.wrong_value),
            ("duplicates_unexplained", &self.duplicates_unexplained),
            ("acked_then_delivered", &self.acked_then_delivered),
            ("late_ack_accepted", &self.late_ack_accepted),
            ("offset_reused", &self.offset_reused),
            ("child_missing", &self.child_missing),
            ("child_early", &self.child_early),
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
            "accepted {}, delivered {}, acked {} ({} accepted ones only by acks without \
             an answer, {} on a lost volume); abandoned {} produces, {} consumes, {} acks; \
             longest 202 to first delivery {} ms, longest lease end to redelivery {} ms; \
             {} deliveries in children; {} retried ids dropped at the owner",
            self.accepted,
            self.delivered,
            self.acked,
            self.acked_unanswered_only,
            self.on_a_lost_volume,
            self.abandoned[0],
            self.abandoned[1],
            self.abandoned[2],
            self.max_first_delivery_ms,
            self.max_redelivery_delay_ms,
            self.child_delivered,
            self.dropped_at_owner
        );
        for (name, finding) in [
            ("lost", &self.lost),
            ("unknown", &self.unknown),
            ("wrong_topic", &self.wrong_topic),
            ("wrong_value", &self.wrong_value),
            ("duplicates_explained", &self.duplicates_explained),
            ("duplicates_unexplained", &self.duplicates_unexplained),
            ("acked_then_delivered", &self.acked_then_delivered),
            (
                "acked_then_delivered_excused",
                &self.acked_then_delivered_excused,
            ),
            ("late_ack_accepted", &self.late_ack_accepted),
            ("offset_reused", &self.offset_reused),
            ("never_acked", &self.never_acked),
            ("lost_with_a_volume", &self.lost_with_a_volume),
            ("child_missing", &self.child_missing),
            ("child_early", &self.child_early),
            ("rerouted_copies", &self.rerouted_copies),
        ] {
            out.push_str(&format!("\n  {name}: {}", finding.count));
            for example in &finding.examples {
                out.push_str(&format!("\n    e.g. {example}"));
            }
        }
        out
    }
}

/// Every offset delivered with more than one message, unless its partition
/// changed hands or lost a volume of an owner ([`Report::offset_reused`]).
fn check_offsets(
    deliveries: &BTreeMap<&str, Vec<Seen<'_>>>,
    owners: &HashMap<(&str, u32), Vec<&str>>,
    handovers: &[(&str, u32, u64)],
    faults: &[Fault<'_>],
    report: &mut Report,
) {
    let mut at: BTreeMap<(&str, u32, u64), BTreeMap<&str, u64>> = BTreeMap::new();
    for (id, seen) in deliveries {
        for s in seen {
            let d = s.delivery;
            at.entry((d.topic.as_str(), d.partition, d.offset))
                .or_default()
                .entry(id)
                .or_insert(s.end_ms);
        }
    }
    for ((topic, partition, offset), ids) in at {
        if ids.len() < 2 {
            continue;
        }
        let moved = handovers
            .iter()
            .any(|(t, p, _)| *t == topic && *p == partition);
        let wiped = owners.get(&(topic, partition)).is_some_and(|nodes| {
            faults
                .iter()
                .any(|f| f.action == NemesisAction::Wipe && nodes.contains(&f.node))
        });
        if moved || wiped {
            continue;
        }
        report.offset_reused.add(|| {
            let seen: Vec<String> = ids
                .iter()
                .map(|(id, at_ms)| format!("{id} at {at_ms}"))
                .collect();
            format!(
                "{topic} p{partition} o{offset} delivered as {}",
                seen.join(" and as ")
            )
        });
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

/// A fault the nemesis injected into one node, with when it started and
/// ended (the process was signalled in between).
#[derive(Debug, Clone, Copy)]
struct Fault<'a> {
    node: &'a str,
    action: NemesisAction,
    start_ms: u64,
    end_ms: u64,
}

/// One way of a link cut or healed ([`Op::Link`]).
#[derive(Debug)]
struct LinkChange<'a> {
    ends: [&'a str; 2],
    cut: bool,
    start_ms: u64,
    end_ms: u64,
}

/// The node that accepted a message, as the nemesis names nodes (`n2`): a
/// message id's first 16 bits are the accepting node's id.
fn accepted_by(id: &str) -> Option<String> {
    let node = u16::from_str_radix(id.get(..4)?, 16).ok()?;
    Some(format!("n{node}"))
}

/// When each node was not answering: from a fault that stopped it to the
/// end of the start or resume that brought it back (or the history's end),
/// and from the first cut of a link to or from it to the end of the heal
/// that left none of its links cut.
#[derive(Debug, Default)]
struct Downtime<'a> {
    by_node: BTreeMap<&'a str, Vec<(u64, u64)>>,
    /// Each node's spans down that ended with a restart, stretched by
    /// [`PARTITIONS_OPEN_MS`]: down, or opening its partitions.
    restarting: BTreeMap<&'a str, Vec<(u64, u64)>>,
    /// Every node's spans, each stretched by [`RECOVERY_SLACK_MS`], merged:
    /// the times at which some record may have waited on some node.
    merged: Vec<(u64, u64)>,
}

impl<'a> Downtime<'a> {
    fn of(faults: &[Fault<'a>], links: &[LinkChange<'a>]) -> Self {
        let mut ordered: Vec<&Fault<'a>> = faults.iter().collect();
        ordered.sort_by_key(|f| f.start_ms);
        let mut by_node: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
        let mut restarting: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
        let mut down_since: BTreeMap<&str, u64> = BTreeMap::new();
        for f in ordered {
            if f.action.makes_owner_unreachable() {
                down_since.entry(f.node).or_insert(f.start_ms);
            } else if let Some(since) = down_since.remove(f.node) {
                by_node.entry(f.node).or_default().push((since, f.end_ms));
                if f.action == NemesisAction::Start {
                    let opened = f.end_ms.saturating_add(PARTITIONS_OPEN_MS);
                    restarting.entry(f.node).or_default().push((since, opened));
                }
            }
        }
        for (node, since) in down_since {
            by_node.entry(node).or_default().push((since, u64::MAX));
        }
        let mut ordered: Vec<&LinkChange<'a>> = links.iter().collect();
        ordered.sort_by_key(|l| l.start_ms);
        let mut cuts: BTreeMap<&str, BTreeSet<[&str; 2]>> = BTreeMap::new();
        let mut cut_since: BTreeMap<&str, u64> = BTreeMap::new();
        for link in ordered {
            for node in link.ends {
                let node_cuts = cuts.entry(node).or_default();
                if link.cut {
                    node_cuts.insert(link.ends);
                    cut_since.entry(node).or_insert(link.start_ms);
                } else {
                    node_cuts.remove(&link.ends);
                    if node_cuts.is_empty() {
                        if let Some(since) = cut_since.remove(node) {
                            by_node.entry(node).or_default().push((since, link.end_ms));
                        }
                    }
                }
            }
        }
        for (node, since) in cut_since {
            by_node.entry(node).or_default().push((since, u64::MAX));
        }
        let mut stretched: Vec<(u64, u64)> = by_node
            .values()
            .flatten()
            .map(|&(from, to)| (from, to.saturating_add(RECOVERY_SLACK_MS)))
            .collect();
        stretched.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (from, to) in stretched {
            match merged.last_mut() {
                Some(last) if from <= last.1 => last.1 = last.1.max(to),
                _ => merged.push((from, to)),
            }
        }
        Self {
            by_node,
            restarting,
            merged,
        }
    }

    /// Some node was down, or just back, at every moment from `from` to
    /// `to` (an empty range needs nothing).
    fn covers(&self, from: u64, to: u64) -> bool {
        to <= from
            || self
                .merged
                .iter()
                .any(|&(start, end)| start <= from && to <= end)
    }

    /// `node` was down at some moment from `from` to `to`.
    fn down_between(&self, node: &str, from: u64, to: u64) -> bool {
        Self::any_between(&self.by_node, node, from, to)
    }

    /// `node` was down, or restarted and still opening its partitions, at
    /// some moment from `from` to `to`.
    fn down_or_opening_between(&self, node: &str, from: u64, to: u64) -> bool {
        self.down_between(node, from, to) || Self::any_between(&self.restarting, node, from, to)
    }

    fn any_between(
        spans: &BTreeMap<&str, Vec<(u64, u64)>>,
        node: &str,
        from: u64,
        to: u64,
    ) -> bool {
        spans
            .get(node)
            .into_iter()
            .flatten()
            .any(|&(start, end)| start <= to && end >= from)
    }
}

/// An accepted message: its topic, value, when its produce started, and
/// the partition its key maps to.
type Accepted<'a> = (&'a str, &'a str, u64, Option<u32>);

/// One produce attempt: its topic, if it was answered 202 the id, and
/// when it started.
#[derive(Debug, Clone, Copy)]
struct Produced<'a> {
    topic: &'a str,
    id: Option<&'a str>,
    start_ms: u64,
}

/// The children's rules: every message accepted on a parent by a produce
/// that started after its child existed is delivered in the child, and a
/// delay child delivers none before its delay passed.
fn check_children(
    events: &[Event],
    children: &BTreeMap<&str, (&str, Option<u64>, u64)>,
    report: &mut Report,
) {
    if children.is_empty() {
        return;
    }
    // Accepted produces by topic: value → when its produce started (its
    // first attempt, for a value retried with one idempotency key) and
    // the ids it was answered under (a retry at another node gets a new
    // one; the owner keeps one copy).
    let mut accepted: BTreeMap<&str, BTreeMap<&str, (u64, Vec<&str>)>> = BTreeMap::new();
    let mut first_attempt: HashMap<&str, u64> = HashMap::new();
    // Deliveries by child: value → the end of each consume that carried
    // it (under whichever id the owner kept).
    let mut delivered: BTreeMap<&str, BTreeMap<&str, Vec<u64>>> = BTreeMap::new();
    for event in events {
        match &event.op {
            Op::Produce { value, .. } | Op::ProduceAbandoned { value, .. } => {
                let first = first_attempt
                    .entry(value.as_str())
                    .or_insert(event.start_ms);
                *first = (*first).min(event.start_ms);
                if let Op::Produce {
                    topic,
                    outcome: Outcome::Ok { value: id },
                    ..
                } = &event.op
                {
                    let entry = accepted
                        .entry(topic.as_str())
                        .or_default()
                        .entry(value.as_str())
                        .or_insert((*first, Vec::new()));
                    entry.0 = entry.0.min(*first);
                    entry.1.push(id.as_str());
                }
            }
            Op::Consume {
                topic,
                outcome: Outcome::Ok { value },
            } if children.contains_key(topic.as_str()) => {
                for delivery in value {
                    report.child_delivered += 1;
                    delivered
                        .entry(topic.as_str())
                        .or_default()
                        .entry(delivery.value.as_str())
                        .or_default()
                        .push(event.end_ms);
                }
            }
            _ => {}
        }
    }
    let none = BTreeMap::new();
    for (child, (parent, delay_ms, created_ms)) in children {
        let seen = delivered.get(child).unwrap_or(&none);
        for (value, (produced_ms, ids)) in accepted.get(parent).unwrap_or(&BTreeMap::new()) {
            let id = ids.first().copied().unwrap_or_default();
            if let Some(delay) = delay_ms {
                for at in seen.get(value).map(Vec::as_slice).unwrap_or_default() {
                    if *at < produced_ms.saturating_add(*delay) {
                        report.child_early.add(|| {
                            format!(
                                "{id} in {child}: delivered {} ms after its produce started, delay {delay} ms",
                                at.saturating_sub(*produced_ms)
                            )
                        });
                    }
                }
            }
            if *produced_ms >= *created_ms && !seen.contains_key(value) {
                report.child_missing.add(|| {
                    format!(
                        "{id}: 202 on {parent} after {child} existed, never delivered in {child}"
                    )
                });
            }
        }
    }
}

/// Checks a history against the delivery contract.
pub fn check(events: &[Event]) -> Report {
    let mut report = Report::default();
    let children: BTreeMap<&str, (&str, Option<u64>, u64)> = events
        .iter()
        .filter_map(|e| match &e.op {
            Op::Child {
                parent,
                child,
                delay_ms,
            } => Some((child.as_str(), (parent.as_str(), *delay_ms, e.end_ms))),
            _ => None,
        })
        .collect();
    check_children(events, &children, &mut report);
    // Everything else judges the topics that are not children.
    let events: Vec<&Event> = events
        .iter()
        .filter(|e| {
            e.op.consumed_topic()
                .is_none_or(|topic| !children.contains_key(topic))
        })
        .collect();
    // Produces by value (every attempt, answered or not) and the accepted
    // ids with their topic, value and start.
    let mut produced: HashMap<&str, Produced<'_>> = HashMap::new();
    let mut accepted: BTreeMap<&str, Accepted<'_>> = BTreeMap::new();
    let mut deliveries: BTreeMap<&str, Vec<Seen<'_>>> = BTreeMap::new();
    // Values with an attempt that may have been stored unanswered: the
    // message may be delivered under that attempt's id, which nobody saw
    // (a retry at another node was answered with a new one, and the owner
    // kept the first copy).
    let mut uncertain: HashSet<&str> = HashSet::new();
    // Receipt → settle events answered with success.
    let mut settled: HashMap<&str, Vec<Settled<'_>>> = HashMap::new();
    let mut acked_ids: BTreeSet<&str> = BTreeSet::new();
    let mut maybe_acked_ids: BTreeSet<&str> = BTreeSet::new();
    // Receipt → nacks that got no answer (or 502): each may have landed.
    let mut maybe_nacked: HashMap<&str, Vec<&Event>> = HashMap::new();
    // Every node that owned a partition during the run (a move adds one):
    // a crash of any of them may explain what happened to its messages.
    let mut owners: HashMap<(&str, u32), Vec<&str>> = HashMap::new();
    let mut handovers: Vec<(&str, u32, u64)> = Vec::new();
    let mut faults: Vec<Fault<'_>> = Vec::new();
    let mut links: Vec<LinkChange<'_>> = Vec::new();
    for event in events.iter().copied() {
        match &event.op {
            Op::Produce {
                topic,
                value,
                partition,
                outcome,
            } => {
                let id = match outcome {
                    Outcome::Ok { value: id } => Some(id.as_str()),
                    _ => None,
                };
                if matches!(
                    outcome,
                    Outcome::Unknown { .. }
                        | Outcome::Refused {
                            status: 500 | 502 | 504,
                            ..
                        }
                ) {
                    uncertain.insert(value.as_str());
                }
                // A retry of the value (same idempotency key): the message
                // dates from its first attempt, and keeps an id answered.
                let earlier = produced.get(value.as_str()).copied();
                let start_ms = earlier.map_or(event.start_ms, |p| p.start_ms.min(event.start_ms));
                produced.insert(
                    value,
                    Produced {
                        topic,
                        id: id.or(earlier.and_then(|p| p.id)),
                        start_ms,
                    },
                );
                if let Some(id) = id {
                    accepted.insert(id, (topic, value, start_ms, *partition));
                }
            }
            // May have been accepted: it may appear, with this value.
            Op::ProduceAbandoned { topic, value } => {
                report.abandoned[0] += 1;
                uncertain.insert(value.as_str());
                let earlier = produced.get(value.as_str()).copied();
                produced.insert(
                    value,
                    Produced {
                        topic,
                        id: earlier.and_then(|p| p.id),
                        start_ms: earlier
                            .map_or(event.start_ms, |p| p.start_ms.min(event.start_ms)),
                    },
                );
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
            // Its leases, if it got any, end with the visibility timeout;
            // nobody saw its deliveries.
            Op::ConsumeAbandoned { .. } => report.abandoned[1] += 1,
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
            // An ack without an answer, or answered 502, may or may not have
            // landed: it settles nothing (a delivery after it is fine), but
            // its message is not "never acked" either (if it did not land,
            // the lease brings the message back and a later ack counts).
            Op::Settle {
                action: SettleAction::Ack,
                id,
                outcome: Outcome::Unknown { .. } | Outcome::Refused { status: 502, .. },
                ..
            } => {
                maybe_acked_ids.insert(id);
            }
            // Likewise a nack: a delivery after it, even within the lease,
            // is fine.
            Op::Settle {
                action: SettleAction::Nack,
                receipt,
                outcome: Outcome::Unknown { .. } | Outcome::Refused { status: 502, .. },
                ..
            } => maybe_nacked.entry(receipt).or_default().push(event),
            Op::Settle { .. } => {}
            Op::AckAbandoned { id, .. } => {
                report.abandoned[2] += 1;
                maybe_acked_ids.insert(id);
            }
            Op::Owners {
                topic,
                owners: nodes,
            } => {
                for (partition, node) in nodes.iter().enumerate() {
                    let partition = u32::try_from(partition).unwrap_or(u32::MAX);
                    owners.insert((topic, partition), vec![node.as_str()]);
                }
            }
            Op::Handover {
                topic,
                partition,
                from,
                to,
            } => {
                let known = owners.entry((topic, *partition)).or_default();
                for node in [from, to] {
                    if !known.contains(&node.as_str()) {
                        known.push(node);
                    }
                }
                handovers.push((topic, *partition, event.end_ms));
            }
            Op::Nemesis { action, node } => faults.push(Fault {
                node,
                action: *action,
                start_ms: event.start_ms,
                end_ms: event.end_ms,
            }),
            Op::Link { from, to, cut } => links.push(LinkChange {
                ends: [from, to],
                cut: *cut,
                start_ms: event.start_ms,
                end_ms: event.end_ms,
            }),
            Op::Child { .. } => {}
        }
    }
    // Every id a value was answered 202 under (a retry at another node
    // gets a new id), and those whose copy the owner dropped: never
    // delivered, while the value was (under another id, answered or not).
    let mut ids_of_value: HashMap<&str, Vec<&str>> = HashMap::new();
    for (id, (_, value, _, _)) in &accepted {
        ids_of_value.entry(value).or_default().push(id);
    }
    let delivered_values: HashSet<&str> = deliveries
        .values()
        .flatten()
        .map(|s| s.delivery.value.as_str())
        .collect();
    let dropped: BTreeSet<&str> = accepted
        .iter()
        .filter(|(id, (_, value, _, _))| {
            !deliveries.contains_key(*id)
                && delivered_values.contains(value)
                && (ids_of_value.get(value).is_some_and(|ids| ids.len() > 1)
                    || uncertain.contains(value))
        })
        .map(|(id, _)| *id)
        .collect();
    report.dropped_at_owner = dropped.len();
    accepted.retain(|id, _| !dropped.contains(id));
    report.accepted = accepted.len();
    report.delivered = deliveries.len();
    check_offsets(&deliveries, &owners, &handovers, &faults, &mut report);
    // The node that owns the partition a delivery's entry is stored in; a
    // partition whose owner the history does not record excuses nothing.
    let owners_of = |d: &Delivery| owners_at(&owners, d);
    let downtime = Downtime::of(&faults, &links);
    // Processes stopped or paused, not links cut: a cut link of the
    // accepting node to a third node loses no answer of the owner.
    let stopped = Downtime::of(&faults, &[]);
    // A message stored again at another offset after a copy of it was
    // first delivered at `before`: the contract allows two ways.
    //
    // 1. Its accepting node restarted while the record was above the WAL's
    //    checkpoint: the crash came within `CHECKPOINT_LAG_MS` of that
    //    copy's commit (which was before its first delivery), or later while
    //    an older record held the checkpoint back, which needs some node
    //    down or just back from `before` until the checkpoint was due.
    let replayed = |id: &str, produced_ms: u64, before: u64| {
        let Some(by) = accepted_by(id) else {
            return false;
        };
        faults.iter().any(|f| {
            f.node == by
                && f.action.replays_wal()
                && f.start_ms >= produced_ms
                && downtime.covers(before, f.start_ms.saturating_sub(CHECKPOINT_LAG_MS))
        })
    };
    // 2. A commit stored at an owner whose answer a fault of that owner
    //    lost (a kill just after the write, or a pause that held the commit
    //    until after the dispatcher gave up on it), then sent again to the
    //    same partition or to a sibling. The copy whose answer was lost was
    //    stored before the one sent again, so (for two copies, and for more
    //    when the lost one was delivered first) no later than `before`, the
    //    first delivery of the copy before this one: some copy's owner was
    //    down (or, restarted, still opening its partitions: a commit then
    //    can outlast its call's deadline) between the produce and
    //    `ANSWER_LOST_SLACK_MS` after that.
    //    The same when the accepting node's process was down (paused)
    //    then: its call's deadline passed while it waited, so it could not
    //    tell that the commit landed (a cut link between it and the owner
    //    is the owner's downtime above).
    let answer_lost = |id: &str, copies: &[(&Delivery, u64)], produced_ms: u64, before: u64| {
        let until = before.saturating_add(ANSWER_LOST_SLACK_MS);
        let sender_down =
            accepted_by(id).is_some_and(|by| stopped.down_between(&by, produced_ms, until));
        sender_down
            || copies.iter().any(|(copy, _)| {
                owners_of(copy)
                    .iter()
                    .any(|owner| downtime.down_or_opening_between(owner, produced_ms, until))
            })
    };
    // The owner of `d`'s partition went down (which ends its leases)
    // between `from` and `to`.
    let owner_restarted = |d: &Delivery, from: u64, to: u64| {
        let moved = handovers.iter().any(|(topic, p, at)| {
            *topic == d.topic && *p == d.partition && (from..=to).contains(at)
        });
        moved
            || owners_of(d).iter().any(|owner| {
                faults.iter().any(|f| {
                    f.node == *owner && f.action.ends_leases() && f.end_ms >= from && f.end_ms <= to
                })
            })
    };
    // A crash of the owner of `d`'s partition may have lost `ack` (answered
    // 204) before the delivery that ended at `until`: it came no earlier
    // than the ack was sent, and no later than the crash's window after
    // the ack's answer.
    let ack_lost = |d: &Delivery, ack: &Event, until: u64| {
        let owners = owners_of(d);
        faults.iter().find(|f| {
            owners.contains(&f.node)
                && f.start_ms <= until
                && f.end_ms >= ack.start_ms
                && f.action
                    .acks_lost_ms()
                    .is_some_and(|window| f.start_ms <= ack.end_ms.saturating_add(window))
        })
    };

    // Whether an accepted message may have been on a volume when it was
    // lost: produced before the wipe ended, and stored in a partition of the
    // wiped node or accepted by it (its WAL went too).
    let on_a_lost_volume = |id: &str, (topic, _, start_ms, partition): &Accepted<'_>| {
        let by = accepted_by(id);
        let held_by = partition
            .and_then(|p| owners.get(&(*topic, p)))
            .map_or(&[][..], Vec::as_slice);
        faults.iter().any(|f| {
            f.action == NemesisAction::Wipe
                && *start_ms <= f.end_ms
                && (by.as_deref() == Some(f.node) || held_by.contains(&f.node))
        })
    };
    for (id, message) in &accepted {
        let topic = message.0;
        if on_a_lost_volume(id, message) {
            report.on_a_lost_volume += 1;
            continue;
        }
        if !deliveries.contains_key(id) {
            report
                .lost
                .add(|| format!("{id} on {topic}: 202, never delivered"));
        }
    }
    // The id and partition each value was first delivered under: one
    // value, one message (unless a copy was rerouted).
    let mut id_of_value: HashMap<&str, (&str, u32)> = HashMap::new();
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
            let value = s.delivery.value.as_str();
            match produced.get(value) {
                None => report.unknown.add(|| {
                    format!(
                        "{id} value {value:?} on {}: never produced",
                        s.delivery.topic
                    )
                }),
                Some(p) if p.topic != s.delivery.topic => report.wrong_topic.add(|| {
                    format!(
                        "{id}: produced to {}, delivered on {}",
                        p.topic, s.delivery.topic
                    )
                }),
                Some(p) => {
                    let partition = s.delivery.partition;
                    let (first_id, first_partition) =
                        *id_of_value.entry(value).or_insert((id, partition));
                    let answered = ids_of_value.get(value).map(Vec::as_slice);
                    if let Some((_, sent, _, _)) = accepted.get(id).filter(|a| a.1 != value) {
                        report.wrong_value.add(|| {
                            format!("{id}: produced with {sent:?}, delivered with {value:?}")
                        });
                    } else if let Some(other) = p.id.filter(|_| {
                        !uncertain.contains(value) && answered.is_some_and(|ids| !ids.contains(id))
                    }) {
                        report.wrong_value.add(|| {
                            format!("{value:?}: answered 202 as {other}, delivered as {id}")
                        });
                    } else if first_id != *id && first_partition != partition {
                        report.rerouted_copies.add(|| {
                            format!("{value:?}: delivered as {first_id} in partition {first_partition} and as {id} in {partition}")
                        });
                    } else if first_id != *id {
                        report
                            .wrong_value
                            .add(|| format!("{value:?}: delivered as {first_id} and as {id}"));
                    }
                }
            }
        }
        if let (Some((_, _, accepted_at, _)), Some(first)) =
            (accepted.get(id), seen.iter().map(|s| s.end_ms).min())
        {
            report.max_first_delivery_ms = report
                .max_first_delivery_ms
                .max(first.saturating_sub(*accepted_at));
        }
        let mut was_acked = false;
        for (j, next) in seen.iter().enumerate().skip(1) {
            let prev = &seen[j - 1];
            let same = |s: &Seen<'_>| {
                s.delivery.partition == next.delivery.partition
                    && s.delivery.offset == next.delivery.offset
            };
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
                .any(|(a, _, _)| *a == SettleAction::Nack)
                || maybe_nacked
                    .get(prev.delivery.receipt.as_str())
                    .is_some_and(|nacks| nacks.iter().any(|e| e.start_ms <= next.end_ms));
            let lease_end = settles
                .iter()
                .filter(in_window)
                .filter_map(|(a, _, v)| (*a == SettleAction::Extend).then_some(*v).flatten())
                .fold(prev.delivery.lease_expires_at_ms, u64::max);
            let acked = settles
                .iter()
                .filter(in_window)
                .any(|(a, _, _)| *a == SettleAction::Ack);
            if !acked {
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
            let describe = |prev: &Seen<'_>| {
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
            // Every earlier delivery of this entry acked with a 204 before
            // this one answered, with the owner's crash that may have lost
            // the ack, if any.
            let acks: Vec<(&Seen<'_>, &Event, Option<&Fault<'_>>)> = seen[..j]
                .iter()
                .filter(|s| same(s))
                .flat_map(|earlier| {
                    settled
                        .get(earlier.delivery.receipt.as_str())
                        .into_iter()
                        .flatten()
                        .filter(|(a, e, _)| *a == SettleAction::Ack && e.start_ms <= next.end_ms)
                        .map(move |(_, e, _)| (earlier, *e))
                })
                .map(|(earlier, e)| (earlier, e, ack_lost(next.delivery, e, next.end_ms)))
                .collect();
            if let Some((earlier, ack, _)) = acks.iter().find(|(_, _, lost)| lost.is_none()) {
                report.acked_then_delivered.add(|| {
                    format!(
                        "{} after an ack answered 204 at {}; owner {}",
                        describe(earlier),
                        ack.end_ms,
                        match owners_of(next.delivery).as_slice() {
                            [] => "not recorded".to_string(),
                            nodes => nodes.join(", "),
                        }
                    )
                });
                continue;
            }
            if let Some((earlier, ack, Some(crash))) = acks.first() {
                report.acked_then_delivered_excused.add(|| {
                    format!(
                        "{} after an ack answered 204 at {}, {} ms before the owner {}'s {:?}",
                        describe(earlier),
                        ack.end_ms,
                        i128::from(crash.start_ms) - i128::from(ack.end_ms),
                        crash.node,
                        crash.action
                    )
                });
            }
            if same(prev) {
                // The second lease was granted some time before its consume
                // answered (a consume to a paused node is served after the
                // pause): only one that answered before the first lease
                // ended proves an overlap, unless the partition's owner went
                // down in between (a restart forgets its leases).
                let explained = nacked
                    || next.end_ms >= lease_end
                    || owner_restarted(next.delivery, prev.start_ms, next.end_ms);
                if explained {
                    report.duplicates_explained.add(|| describe(prev));
                } else {
                    report.duplicates_unexplained.add(|| describe(prev));
                }
            }
        }
        // Copies at other offsets (or partitions), in the order they were
        // first delivered: each after the first was stored again.
        let mut copies: Vec<(&Delivery, u64)> = Vec::new();
        for s in seen.iter() {
            let d = s.delivery;
            match copies
                .iter_mut()
                .find(|(c, _)| c.partition == d.partition && c.offset == d.offset)
            {
                Some((_, first_ms)) => *first_ms = (*first_ms).min(s.end_ms),
                None => copies.push((d, s.end_ms)),
            }
        }
        copies.sort_by_key(|(_, first_ms)| *first_ms);
        let produced_ms = seen
            .first()
            .and_then(|s| produced.get(s.delivery.value.as_str()))
            .map(|p| p.start_ms);
        if let (Some(produced_ms), true) = (produced_ms, copies.len() > 1) {
            for pair in copies.windows(2) {
                let [(before, before_ms), (again, again_ms)] = pair else {
                    continue;
                };
                let describe = || {
                    format!(
                        "{id}: stored at p{} o{} (first delivered at {before_ms}) and again at p{} \
                         o{} (first delivered at {again_ms}), produced at {produced_ms}",
                        before.partition, before.offset, again.partition, again.offset
                    )
                };
                if answer_lost(id, &copies, produced_ms, *before_ms)
                    || replayed(id, produced_ms, *before_ms)
                {
                    report.duplicates_explained.add(describe);
                } else {
                    report.duplicates_unexplained.add(describe);
                }
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
    for (id, message) in &accepted {
        let topic = message.0;
        if acked_ids.contains(id) {
            continue;
        }
        if on_a_lost_volume(id, message) {
            report
                .lost_with_a_volume
                .add(|| format!("{id} on {topic}: 202, then its volume was lost"));
            continue;
        }
        // Delivered, and acked without an answer: it may have landed.
        if maybe_acked_ids.contains(id) && deliveries.contains_key(id) {
            report.acked_unanswered_only += 1;
            continue;
        }
        report
            .never_acked
            .add(|| format!("{id} on {topic}: 202, never acked"));
    }
    report
}

#[cfg(test)]
mod tests;

/// Every node that owned the partition a delivery's entry is stored in.
fn owners_at<'a>(owners: &HashMap<(&str, u32), Vec<&'a str>>, d: &Delivery) -> Vec<&'a str> {
    owners
        .get(&(d.topic.as_str(), d.partition))
        .cloned()
        .unwrap_or_default()
}
