//! Kafka share groups (KIP-932) on Narad's leases: a share consumer's
//! fetch leases messages as an HTTP consume does (for the topic's
//! visibility timeout, Kafka's acquisition lock), and its acknowledgements
//! settle them by the receipts its session keeps: ACCEPT acks, RELEASE
//! nacks, REJECT dead-letters (a copy to the topic's dead-letter topic,
//! then an ack; without one, an ack). A topic has one queue: every share
//! group on it takes from the same messages.
//!
//! Membership and sessions are soft state of the node (every node
//! coordinates every group): a member is given every partition of the
//! topics it subscribes to, and leases keep deliveries exclusive. A share
//! session that closes, is opened again, or goes unused for
//! [`SHARE_MEMBER_TIMEOUT`] gives its records back (nacked, delivered again
//! at once); a member that leaves or goes unheard as long is forgotten,
//! its sessions closing on their own.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::messages::share_fetch_response::{
    AcquiredRecords, PartitionData, ShareFetchableTopicResponse,
};
use kafka_protocol::messages::share_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::{
    share_acknowledge_response, ShareAcknowledgeRequest, ShareAcknowledgeResponse,
    ShareFetchRequest, ShareFetchResponse, ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use kafka_protocol::ResponseError;
use narad_net::types::{ConsumeRequest, ConsumedMessage, SettleAction};
use narad_raft::state::{Action, Topic};

use super::errors::kafka_error;
use super::sasl::Caller;
use super::serve::{decode, topic_id, Answerer};
use crate::limits::{
    KAFKA_REJECT_HOLD_MS, SHARE_ACK_OFFSETS_PER_REQUEST_MAX, SHARE_FETCH_RECORDS_DEFAULT,
    SHARE_FETCH_RECORDS_MAX, SHARE_FETCH_WAIT_MS_MAX, SHARE_HEARTBEAT_INTERVAL_MS,
    SHARE_MEMBER_TIMEOUT, SHARE_SESSIONS_MAX,
};
use narad_storage::log::Message;

/// A member's epoch that joins, and one that leaves.
const EPOCH_JOIN: i32 = 0;
const EPOCH_LEAVE: i32 = -1;
/// A share session's epoch that opens it, and one that closes it.
const SESSION_OPEN: i32 = 0;
const SESSION_CLOSE: i32 = -1;
/// Acknowledgement types (KIP-932).
const ACK_GAP: i8 = 0;
const ACK_ACCEPT: i8 = 1;
const ACK_RELEASE: i8 = 2;
const ACK_REJECT: i8 = 3;

/// A group and a member of it.
type MemberKey = (String, String);
/// A record a session holds: topic, partition, offset.
type RecordKey = (String, u32, u64);

struct Member {
    epoch: i32,
    topics: Vec<String>,
    /// What the member was last told it has: (topic, incarnation, partitions).
    assigned: Vec<(String, u64, u32)>,
    heard: Instant,
}

/// A record leased to a session, with what settling it needs.
struct Held {
    receipt: String,
    id: u128,
    key: Option<Vec<u8>>,
    value: Bytes,
    /// When its lock ends at the latest, on this node's monotonic clock
    /// (asked for before the lease was taken, so never later than the
    /// owner's end of it).
    until: Instant,
}

impl Held {
    fn of(m: &ConsumedMessage, until: Instant) -> Self {
        Self {
            receipt: m.receipt.clone(),
            id: m.id,
            key: m.key.clone(),
            value: m.value.clone(),
            until,
        }
    }
}

struct Session {
    epoch: i32,
    /// When the client last used it.
    touched: Instant,
    /// The partitions of each topic the client fetches from this node.
    partitions: BTreeMap<String, BTreeSet<u32>>,
    held: HashMap<RecordKey, Held>,
}

/// The node's share-group members and sessions, all shards.
#[derive(Default)]
pub struct ShareGroups {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    members: HashMap<MemberKey, Member>,
    sessions: HashMap<MemberKey, Session>,
}

impl ShareGroups {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Members not heard for too long leave, and sessions not used for as
    /// long close; what those sessions held is returned, to be given back.
    fn prune(state: &mut State, now: Instant) -> Vec<(String, Held)> {
        state
            .members
            .retain(|_, m| now.duration_since(m.heard) <= SHARE_MEMBER_TIMEOUT);
        let idle: Vec<MemberKey> = state
            .sessions
            .iter()
            .filter(|(_, s)| now.duration_since(s.touched) > SHARE_MEMBER_TIMEOUT)
            .map(|(k, _)| k.clone())
            .collect();
        let mut released = Vec::new();
        for key in idle {
            if let Some(session) = state.sessions.remove(&key) {
                released.extend(session.held.into_iter().map(|((t, _, _), h)| (t, h)));
            }
        }
        released
    }
}

/// One acknowledgement to carry out.
struct Settling {
    topic: String,
    topic_id: uuid::Uuid,
    partition: u32,
    kind: i8,
    /// `None`: the session holds no such record (never delivered to it, or
    /// already settled): `INVALID_RECORD_STATE`.
    held: Option<Held>,
}

/// A partition's acknowledgement error, if any.
type AckErrors = BTreeMap<(uuid::Uuid, u32), (ResponseError, String)>;

/// A request's acknowledgement batches as (topic id, partition, first
/// offset, last offset, types): ShareFetch and ShareAcknowledge carry them
/// in generated types of their own with the same fields.
macro_rules! acknowledgements_of {
    ($body:expr) => {
        $body.topics.iter().flat_map(|t| {
            t.partitions.iter().flat_map(move |p| {
                p.acknowledgement_batches.iter().map(move |b| {
                    (
                        t.topic_id,
                        p.partition_index,
                        b.first_offset,
                        b.last_offset,
                        b.acknowledge_types.clone(),
                    )
                })
            })
        })
    };
}

/// Topics by their Kafka id.
fn topics_by_id(answerer: &Answerer) -> HashMap<uuid::Uuid, Topic> {
    let view = answerer.shard.meta().view();
    view.state
        .topics
        .values()
        .map(|t| (topic_id(t), t.clone()))
        .collect()
}

impl Answerer {
    pub(super) fn share_group_heartbeat(
        &self,
        request: &super::frame::Request,
        caller: &Caller,
    ) -> Result<(ShareGroupHeartbeatResponse, &'static str), String> {
        let body = decode::<ShareGroupHeartbeatRequest>(request)?;
        let group = body.group_id.0.to_string();
        let refuse = |error: ResponseError, message: &str| {
            Ok((
                ShareGroupHeartbeatResponse::default()
                    .with_error_code(error.code())
                    .with_error_message(Some(StrBytes::from_string(message.to_string()))),
                super::serve::error_label(error),
            ))
        };
        if group.is_empty() {
            return refuse(ResponseError::InvalidGroupId, "a share group needs an id");
        }
        // Subscribing takes records: it needs the consume grant on each.
        for topic in body.subscribed_topic_names.iter().flatten() {
            if let Err(error) = self.may(caller, Action::Consume, topic.0.as_str()) {
                return refuse(ResponseError::TopicAuthorizationFailed, &error.message);
            }
        }
        let now = Instant::now();
        let view = self.shard.meta().view();
        let (answer, released) = {
            let groups = &self.shares;
            let mut state = groups.state();
            let released = ShareGroups::prune(&mut state, now);
            let member_id = if body.member_id.is_empty() {
                uuid_string()
            } else {
                body.member_id.to_string()
            };
            let key = (group.clone(), member_id.clone());
            match body.member_epoch {
                EPOCH_LEAVE => {
                    // Its sessions close on their own (the client closes
                    // them with its last acknowledgements, or they expire).
                    state.members.remove(&key);
                    (
                        Ok(Heartbeat::Answered(
                            ShareGroupHeartbeatResponse::default()
                                .with_member_id(Some(StrBytes::from_string(member_id)))
                                .with_member_epoch(EPOCH_LEAVE),
                        )),
                        released,
                    )
                }
                EPOCH_JOIN => {
                    let Some(topics) = &body.subscribed_topic_names else {
                        drop(state);
                        return refuse(
                            ResponseError::InvalidRequest,
                            "joining needs the topics subscribed to",
                        );
                    };
                    let topics: Vec<String> = topics.iter().map(|t| t.0.to_string()).collect();
                    state.members.insert(
                        key.clone(),
                        Member {
                            epoch: 1,
                            topics,
                            assigned: Vec::new(),
                            heard: now,
                        },
                    );
                    (Ok(Heartbeat::Member(member_id)), released)
                }
                epoch => match state.members.get_mut(&key) {
                    None => (Err(ResponseError::UnknownMemberId), released),
                    Some(member) if member.epoch != epoch => {
                        (Err(ResponseError::FencedMemberEpoch), released)
                    }
                    Some(member) => {
                        member.heard = now;
                        if let Some(topics) = &body.subscribed_topic_names {
                            member.topics = topics.iter().map(|t| t.0.to_string()).collect();
                        }
                        (Ok(Heartbeat::Member(member_id)), released)
                    }
                },
            }
        };
        self.give_back(released);
        let member_id = match answer {
            Ok(Heartbeat::Answered(response)) => return Ok((response, super::serve::NO_ERROR)),
            Ok(Heartbeat::Member(member_id)) => member_id,
            Err(error) => {
                return refuse(
                    error,
                    match error {
                        ResponseError::UnknownMemberId => {
                            "this node does not know the member: join again"
                        }
                        _ => "the member's epoch is not the current one: join again",
                    },
                )
            }
        };
        // Every partition of each subscribed topic that exists.
        let mut state = self.shares.state();
        let key = (group, member_id.clone());
        let Some(member) = state.members.get_mut(&key) else {
            drop(state);
            return refuse(ResponseError::UnknownMemberId, "the member left meanwhile");
        };
        let assigned: Vec<(String, u64, u32)> = member
            .topics
            .iter()
            .filter_map(|name| view.state.topics.get(name))
            .map(|t| (t.name.clone(), t.incarnation, t.config.partitions))
            .collect();
        let changed = assigned != member.assigned || body.member_epoch == EPOCH_JOIN;
        if changed && body.member_epoch != EPOCH_JOIN {
            member.epoch += 1;
        }
        let mut response = ShareGroupHeartbeatResponse::default()
            .with_member_id(Some(StrBytes::from_string(member_id)))
            .with_member_epoch(member.epoch)
            .with_heartbeat_interval_ms(SHARE_HEARTBEAT_INTERVAL_MS);
        if changed {
            let topic_partitions = assigned
                .iter()
                .filter_map(|(name, _, partitions)| {
                    let topic = view.state.topics.get(name)?;
                    Some(
                        TopicPartitions::default()
                            .with_topic_id(topic_id(topic))
                            .with_partitions((0..*partitions as i32).collect()),
                    )
                })
                .collect();
            response = response.with_assignment(Some(
                Assignment::default().with_topic_partitions(topic_partitions),
            ));
            member.assigned = assigned;
        }
        Ok((response, super::serve::NO_ERROR))
    }

    pub(super) async fn share_fetch(
        &self,
        request: &super::frame::Request,
        caller: &Caller,
    ) -> Result<(ShareFetchResponse, &'static str), String> {
        let body = decode::<ShareFetchRequest>(request)?;
        let (Some(group), Some(member)) = (&body.group_id, &body.member_id) else {
            return Ok(share_fetch_error(
                ResponseError::InvalidRequest,
                "a share fetch needs a group and a member",
            ));
        };
        let key = (group.0.to_string(), member.to_string());
        let by_id = topics_by_id(self);
        let asked_acks = body.topics.iter().any(|t| {
            t.partitions
                .iter()
                .any(|p| !p.acknowledgement_batches.is_empty())
        });
        // The session, under the lock; what to settle and give back after.
        let mut released = Vec::new();
        let settling;
        {
            let mut state = self.shares.state();
            released.extend(ShareGroups::prune(&mut state, Instant::now()));
            match body.share_session_epoch {
                SESSION_OPEN => {
                    if asked_acks {
                        drop(state);
                        return Ok(share_fetch_error(
                            ResponseError::InvalidRequest,
                            "a share session opens without acknowledgements",
                        ));
                    }
                    if !state.sessions.contains_key(&key)
                        && state.sessions.len() >= SHARE_SESSIONS_MAX
                    {
                        drop(state);
                        return Ok(share_fetch_error(
                            ResponseError::ShareSessionLimitReached,
                            "this node holds as many share sessions as it may",
                        ));
                    }
                    if let Some(old) = state.sessions.remove(&key) {
                        released.extend(old.held.into_iter().map(|((t, _, _), h)| (t, h)));
                    }
                    state.sessions.insert(
                        key.clone(),
                        Session {
                            epoch: SESSION_OPEN,
                            touched: Instant::now(),
                            partitions: BTreeMap::new(),
                            held: HashMap::new(),
                        },
                    );
                }
                epoch => {
                    let Some(session) = state.sessions.get_mut(&key) else {
                        drop(state);
                        return Ok(share_fetch_error(
                            ResponseError::ShareSessionNotFound,
                            "no such share session on this node: open one (epoch 0)",
                        ));
                    };
                    if epoch != SESSION_CLOSE && epoch != session.epoch.wrapping_add(1) {
                        drop(state);
                        return Ok(share_fetch_error(
                            ResponseError::InvalidShareSessionEpoch,
                            "the share session's epoch is not the next one",
                        ));
                    }
                    if epoch != SESSION_CLOSE {
                        session.epoch = epoch;
                    }
                    session.touched = Instant::now();
                }
            }
            let session = state.sessions.get_mut(&key).expect("made or found above");
            for topic in &body.topics {
                if let Some(t) = by_id.get(&topic.topic_id) {
                    let set = session.partitions.entry(t.name.clone()).or_default();
                    set.extend(
                        topic
                            .partitions
                            .iter()
                            .filter_map(|p| u32::try_from(p.partition_index).ok()),
                    );
                }
            }
            for forgotten in &body.forgotten_topics_data {
                if let Some(t) = by_id.get(&forgotten.topic_id) {
                    if let Some(set) = session.partitions.get_mut(&t.name) {
                        for p in &forgotten.partitions {
                            if let Ok(p) = u32::try_from(*p) {
                                set.remove(&p);
                            }
                        }
                    }
                }
            }
            settling = take_acknowledged(session, &by_id, acknowledgements_of!(body));
            if body.share_session_epoch == SESSION_CLOSE {
                if let Some(closed) = state.sessions.remove(&key) {
                    released.extend(closed.held.into_iter().map(|((t, _, _), h)| (t, h)));
                }
            }
        }
        let ack_errors = self.settle_acknowledged(settling, caller).await;
        self.give_back(released);
        if body.share_session_epoch == SESSION_CLOSE {
            return Ok((
                fetch_answer(Vec::new(), &ack_errors, 0),
                super::serve::NO_ERROR,
            ));
        }
        // Lease what the session's partitions have.
        let wanted: Vec<(String, Vec<u32>)> = {
            let state = self.shares.state();
            state
                .sessions
                .get(&key)
                .map(|s| {
                    s.partitions
                        .iter()
                        .filter(|(_, p)| !p.is_empty())
                        .map(|(t, p)| (t.clone(), p.iter().copied().collect()))
                        .collect()
                })
                .unwrap_or_default()
        };
        let max = match body.max_records {
            n if n > 0 => (n as u64).min(SHARE_FETCH_RECORDS_MAX),
            _ => SHARE_FETCH_RECORDS_DEFAULT,
        };
        let wait_ms = u64::try_from(body.max_wait_ms.max(0))
            .unwrap_or(0)
            .min(SHARE_FETCH_WAIT_MS_MAX);
        let mut fetched: Vec<(Topic, ConsumedMessage, Instant)> = Vec::new();
        let mut lock_ms = 0;
        for waiting in [false, true] {
            for (name, partitions) in &wanted {
                let room = max.saturating_sub(fetched.len() as u64);
                if room == 0 {
                    break;
                }
                // A grant taken away since the member joined stops its fetches.
                if self.may(caller, Action::Consume, name).is_err() {
                    continue;
                }
                let Ok(topic) = self.shard.topic(name) else {
                    continue;
                };
                lock_ms = lock_ms.max(topic.config.visibility_timeout_ms);
                let until =
                    Instant::now() + Duration::from_millis(topic.config.visibility_timeout_ms);
                let consume = ConsumeRequest {
                    max_messages: u32::try_from(room).unwrap_or(u32::MAX),
                    wait_ms: if waiting { wait_ms } else { 0 },
                    visibility_timeout_ms: None,
                    partition: None,
                };
                match self
                    .shard
                    .consume_from(&topic, consume, Some(partitions))
                    .await
                {
                    Ok(messages) => {
                        fetched.extend(messages.into_iter().map(|m| ((*topic).clone(), m, until)))
                    }
                    Err(error) => {
                        tracing::debug!(%error, topic = name, "a share fetch found nothing")
                    }
                }
                if waiting && !fetched.is_empty() {
                    break;
                }
            }
            if !fetched.is_empty() || wait_ms == 0 || wanted.is_empty() {
                break;
            }
        }
        // The session keeps each record's receipt; if it is gone by now
        // (closed, opened again), the records are given back.
        let mut orphans = Vec::new();
        {
            let mut state = self.shares.state();
            let now = Instant::now();
            match state.sessions.get_mut(&key) {
                Some(session) => {
                    session.held.retain(|_, h| h.until > now);
                    for (topic, m, until) in &fetched {
                        session.held.insert(
                            (topic.name.clone(), m.partition, m.offset),
                            Held::of(m, *until),
                        );
                    }
                }
                None => {
                    orphans.extend(
                        fetched
                            .drain(..)
                            .map(|(topic, m, until)| (topic.name, Held::of(&m, until))),
                    );
                }
            }
        }
        self.give_back(orphans);
        let mut by_partition: BTreeMap<(uuid::Uuid, u32), Vec<ConsumedMessage>> = BTreeMap::new();
        for (topic, m, _) in fetched {
            by_partition
                .entry((topic_id(&topic), m.partition))
                .or_default()
                .push(m);
        }
        let lock = i32::try_from(lock_ms).unwrap_or(i32::MAX);
        Ok((
            fetch_answer(by_partition.into_iter().collect(), &ack_errors, lock),
            if ack_errors.is_empty() {
                super::serve::NO_ERROR
            } else {
                "invalid_record_state"
            },
        ))
    }

    pub(super) async fn share_acknowledge(
        &self,
        request: &super::frame::Request,
        caller: &Caller,
    ) -> Result<(ShareAcknowledgeResponse, &'static str), String> {
        let body = decode::<ShareAcknowledgeRequest>(request)?;
        let refuse = |error: ResponseError, message: &str| {
            Ok((
                ShareAcknowledgeResponse::default()
                    .with_error_code(error.code())
                    .with_error_message(Some(StrBytes::from_string(message.to_string()))),
                super::serve::error_label(error),
            ))
        };
        let (Some(group), Some(member)) = (&body.group_id, &body.member_id) else {
            return refuse(
                ResponseError::InvalidRequest,
                "an acknowledgement needs a group and a member",
            );
        };
        let key = (group.0.to_string(), member.to_string());
        let by_id = topics_by_id(self);
        let mut released = Vec::new();
        let settling;
        {
            let mut state = self.shares.state();
            let epoch = body.share_session_epoch;
            let Some(session) = state.sessions.get_mut(&key) else {
                drop(state);
                return refuse(
                    ResponseError::ShareSessionNotFound,
                    "no such share session on this node",
                );
            };
            if epoch == SESSION_OPEN
                || (epoch != SESSION_CLOSE && epoch != session.epoch.wrapping_add(1))
            {
                drop(state);
                return refuse(
                    ResponseError::InvalidShareSessionEpoch,
                    "the share session's epoch is not the next one",
                );
            }
            if epoch != SESSION_CLOSE {
                session.epoch = epoch;
            }
            session.touched = Instant::now();
            settling = take_acknowledged(session, &by_id, acknowledgements_of!(body));
            if epoch == SESSION_CLOSE {
                if let Some(closed) = state.sessions.remove(&key) {
                    released.extend(closed.held.into_iter().map(|((t, _, _), h)| (t, h)));
                }
            }
        }
        let asked: Vec<(uuid::Uuid, i32)> = body
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(move |p| (t.topic_id, p.partition_index))
            })
            .collect();
        let ack_errors = self.settle_acknowledged(settling, caller).await;
        self.give_back(released);
        let mut responses: Vec<share_acknowledge_response::ShareAcknowledgeTopicResponse> =
            Vec::new();
        for (topic_id, partition) in asked {
            let error = u32::try_from(partition)
                .ok()
                .and_then(|p| ack_errors.get(&(topic_id, p)));
            let data = share_acknowledge_response::PartitionData::default()
                .with_partition_index(partition)
                .with_error_code(error.map_or(0, |(e, _)| e.code()))
                .with_error_message(error.map(|(_, m)| StrBytes::from_string(m.clone())));
            match responses.iter_mut().find(|r| r.topic_id == topic_id) {
                Some(r) => r.partitions.push(data),
                None => responses.push(
                    share_acknowledge_response::ShareAcknowledgeTopicResponse::default()
                        .with_topic_id(topic_id)
                        .with_partitions(vec![data]),
                ),
            }
        }
        Ok((
            ShareAcknowledgeResponse::default().with_responses(responses),
            if ack_errors.is_empty() {
                super::serve::NO_ERROR
            } else {
                "invalid_record_state"
            },
        ))
    }

    /// Carries out acknowledgements: acks, nacks, and rejects (a copy to
    /// the dead-letter topic first, when the topic has one).
    async fn settle_acknowledged(&self, settling: Vec<Settling>, caller: &Caller) -> AckErrors {
        let mut errors = AckErrors::new();
        // Grouped by topic and action, in one settle call each.
        let mut groups: BTreeMap<(String, i8), Vec<Settling>> = BTreeMap::new();
        for item in settling {
            if item.held.is_none() {
                errors.entry((item.topic_id, item.partition)).or_insert((
                    ResponseError::InvalidRecordState,
                    "a record this session does not hold (its lock ended, or it was settled)"
                        .to_string(),
                ));
                continue;
            }
            groups
                .entry((item.topic.clone(), item.kind))
                .or_default()
                .push(item);
        }
        for ((name, kind), items) in groups {
            if let Err(error) = self.may(caller, Action::Consume, &name) {
                for item in &items {
                    errors.entry((item.topic_id, item.partition)).or_insert((
                        ResponseError::TopicAuthorizationFailed,
                        error.message.clone(),
                    ));
                }
                continue;
            }
            let Ok(topic) = self.shard.topic(&name) else {
                for item in &items {
                    errors.entry((item.topic_id, item.partition)).or_insert((
                        ResponseError::InvalidRecordState,
                        format!("topic {name} is gone"),
                    ));
                }
                continue;
            };
            let to_settle = if kind == ACK_REJECT && topic.config.dead_letter_topic.is_some() {
                self.dead_letter_rejected(&topic, items, &mut errors).await
            } else {
                items
            };
            let action = match kind {
                ACK_RELEASE => SettleAction::Nack { delay_ms: 0 },
                _ => SettleAction::Ack,
            };
            let receipts: Vec<String> = to_settle
                .iter()
                .filter_map(|i| i.held.as_ref().map(|h| h.receipt.clone()))
                .collect();
            let outcomes = self.shard.settle(&topic, &receipts, action).await;
            for (item, outcome) in to_settle.iter().zip(outcomes) {
                if let Err(error) = outcome {
                    errors
                        .entry((item.topic_id, item.partition))
                        .or_insert((kafka_error(error.code), error.message));
                }
            }
        }
        errors
    }

    /// REJECTed records of a topic with a dead-letter topic: each lock is
    /// first held for [`KAFKA_REJECT_HOLD_MS`] (which also proves it live:
    /// a lapsed lock writes nothing and answers `INVALID_RECORD_STATE`),
    /// then the records are written durably to the dead-letter topic under
    /// their own ids, as the dead-letter mover writes them. What is
    /// returned is to be acked; a record whose copy failed is not, and
    /// comes back when its lock ends.
    async fn dead_letter_rejected(
        &self,
        topic: &Topic,
        items: Vec<Settling>,
        errors: &mut AckErrors,
    ) -> Vec<Settling> {
        let receipts: Vec<String> = items
            .iter()
            .filter_map(|i| i.held.as_ref().map(|h| h.receipt.clone()))
            .collect();
        let hold = SettleAction::Extend {
            visibility_timeout_ms: KAFKA_REJECT_HOLD_MS,
        };
        let held = self.shard.settle(topic, &receipts, hold).await;
        let mut live = Vec::with_capacity(items.len());
        for (item, outcome) in items.into_iter().zip(held) {
            match outcome {
                Ok(_) => live.push(item),
                Err(error) => {
                    errors
                        .entry((item.topic_id, item.partition))
                        .or_insert((kafka_error(error.code), error.message));
                }
            }
        }
        let copies: Vec<Message> = live
            .iter()
            .filter_map(|i| i.held.as_ref())
            .map(|h| Message {
                id: h.id,
                produced_at_ms: 0,
                key: h.key.clone(),
                value: h.value.clone(),
                idempotency_key: None,
            })
            .collect();
        if let Err(error) = self.shard.dead_letter(topic, &copies).await {
            for item in &live {
                errors
                    .entry((item.topic_id, item.partition))
                    .or_insert((kafka_error(error.code), error.message.clone()));
            }
            return Vec::new();
        }
        live
    }

    /// Gives records back at once (a nack without delay): their member
    /// left, or their session closed or opened again.
    fn give_back(&self, released: Vec<(String, Held)>) {
        if released.is_empty() {
            return;
        }
        let mut by_topic: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (topic, held) in released {
            by_topic.entry(topic).or_default().push(held.receipt);
        }
        let shard = self.shard.clone();
        // Followed through whatever becomes of the request that let them go.
        glommio::spawn_local(async move {
            for (name, receipts) in by_topic {
                if let Ok(topic) = shard.topic(&name) {
                    let _ = shard
                        .settle(&topic, &receipts, SettleAction::Nack { delay_ms: 0 })
                        .await;
                }
            }
        })
        .detach();
    }
}

/// Takes the records that acknowledgements name out of the session.
fn take_acknowledged(
    session: &mut Session,
    by_id: &HashMap<uuid::Uuid, Topic>,
    batches: impl Iterator<Item = (uuid::Uuid, i32, i64, i64, Vec<i8>)>,
) -> Vec<Settling> {
    let mut out = Vec::new();
    // Offsets looked at in all: a request's ranges cannot make the node
    // walk more (what lies beyond stays held, and comes back when its
    // lock ends).
    let mut budget = SHARE_ACK_OFFSETS_PER_REQUEST_MAX;
    for (id, partition, first, last, types) in batches {
        let (Some(topic), Ok(partition)) = (by_id.get(&id), u32::try_from(partition)) else {
            continue;
        };
        if first < 0 || last < first || types.is_empty() {
            continue;
        }
        let span = u64::try_from(last - first)
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let walked = span.min(budget);
        budget -= walked;
        let last = first.saturating_add(i64::try_from(walked).unwrap_or(i64::MAX) - 1);
        for (index, offset) in (first..=last).enumerate() {
            let kind = if types.len() == 1 {
                types[0]
            } else {
                types.get(index).copied().unwrap_or(ACK_GAP)
            };
            if kind == ACK_GAP || !(ACK_ACCEPT..=ACK_REJECT).contains(&kind) {
                continue;
            }
            let held = session
                .held
                .remove(&(topic.name.clone(), partition, offset as u64));
            out.push(Settling {
                topic: topic.name.clone(),
                topic_id: id,
                partition,
                kind,
                held,
            });
        }
    }
    out
}

fn share_fetch_error(error: ResponseError, message: &str) -> (ShareFetchResponse, &'static str) {
    (
        ShareFetchResponse::default()
            .with_error_code(error.code())
            .with_error_message(Some(StrBytes::from_string(message.to_string()))),
        super::serve::error_label(error),
    )
}

/// A ShareFetch answer: each partition's records as one batch, the runs of
/// offsets leased with one delivery count, and acknowledgement errors.
fn fetch_answer(
    partitions: Vec<((uuid::Uuid, u32), Vec<ConsumedMessage>)>,
    ack_errors: &AckErrors,
    lock_ms: i32,
) -> ShareFetchResponse {
    let mut responses: Vec<ShareFetchableTopicResponse> = Vec::new();
    let mut push = |topic_id: uuid::Uuid, data: PartitionData| match responses
        .iter_mut()
        .find(|r| r.topic_id == topic_id)
    {
        Some(r) => r.partitions.push(data),
        None => responses.push(
            ShareFetchableTopicResponse::default()
                .with_topic_id(topic_id)
                .with_partitions(vec![data]),
        ),
    };
    let mut answered = BTreeSet::new();
    for ((topic_id, partition), mut messages) in partitions {
        messages.sort_by_key(|m| m.offset);
        let records: Vec<Record> = messages
            .iter()
            .map(|m| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: -1,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::LogAppend,
                offset: m.offset as i64,
                sequence: -1,
                timestamp: m.produced_at_ms as i64,
                key: m.key.clone().map(Bytes::from),
                value: Some(m.value.clone()),
                headers: IndexMap::new(),
            })
            .collect();
        let mut batch = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        if RecordBatchEncoder::encode(&mut batch, records.iter(), &options).is_err() {
            continue;
        }
        let mut acquired: Vec<AcquiredRecords> = Vec::new();
        for m in &messages {
            let count = i16::try_from(m.delivery_count).unwrap_or(i16::MAX);
            let offset = m.offset as i64;
            match acquired.last_mut() {
                Some(run) if run.last_offset + 1 == offset && run.delivery_count == count => {
                    run.last_offset = offset;
                }
                _ => acquired.push(
                    AcquiredRecords::default()
                        .with_first_offset(offset)
                        .with_last_offset(offset)
                        .with_delivery_count(count),
                ),
            }
        }
        let mut data = PartitionData::default()
            .with_partition_index(partition as i32)
            .with_records(Some(batch.freeze()))
            .with_acquired_records(acquired);
        if let Some((error, message)) = ack_errors.get(&(topic_id, partition)) {
            data = data
                .with_acknowledge_error_code(error.code())
                .with_acknowledge_error_message(Some(StrBytes::from_string(message.clone())));
        }
        answered.insert((topic_id, partition));
        push(topic_id, data);
    }
    for ((topic_id, partition), (error, message)) in ack_errors {
        if answered.contains(&(*topic_id, *partition)) {
            continue;
        }
        push(
            *topic_id,
            PartitionData::default()
                .with_partition_index(*partition as i32)
                .with_acknowledge_error_code(error.code())
                .with_acknowledge_error_message(Some(StrBytes::from_string(message.clone()))),
        );
    }
    ShareFetchResponse::default()
        .with_acquisition_lock_timeout_ms(lock_ms)
        .with_responses(responses)
}

/// A member id for a member that came without one.
fn uuid_string() -> String {
    let bytes = crate::auth::random_bytes::<16>().unwrap_or_default();
    uuid::Uuid::from_bytes(bytes).to_string()
}

/// What a heartbeat's first step decided.
enum Heartbeat {
    Answered(ShareGroupHeartbeatResponse),
    Member(String),
}
