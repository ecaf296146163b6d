//! The answers of the Kafka listener: each served API on the shard's own
//! code paths (a Produce is [`Shard::produce`], as over HTTP), its errors
//! through [`kafka_error`], and a count per API and error.
//!
//! Every node answers Metadata with every alive node that has a Kafka
//! listener as a broker (broker id = node id) and each partition's owner as
//! its leader (this node when the owner has no listener, or has not
//! answered for the reroute time: [`super::leaders`]): a producer then
//! sends each partition's records where they are committed without a hop,
//! and any node still takes any partition, so a client is never told it
//! asked the wrong broker.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsRequest, CreateTopicsResponse, FetchRequest, FetchResponse,
    FindCoordinatorRequest, FindCoordinatorResponse, InitProducerIdRequest, InitProducerIdResponse,
    MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse, ProducerId, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::ResponseError;
use narad_net::types::TopicPatch;
use narad_net::{ApiError, ErrorCode};
use narad_raft::state::{Action, Topic};

use super::epochs::ProducerEpochs;
use super::errors::kafka_error;
use super::frame::{decode_request, encode_response, FrameError, Request};
use super::leaders::OwnerWatch;
use super::records::{records_of, Producer, RecordsError};
use super::sasl::{before_login, Caller, Login};
use super::share::ShareGroups;
use super::versions::{api_versions, FALLBACK_VERSION};
use crate::limits::KAFKA_OVERLOAD_THROTTLE_MS;
use crate::metric_names::KAFKA_REQUESTS_TOTAL;
use crate::shard::{Incoming, MemberReadiness, Shard};

/// A node's Kafka listener as clients reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advertised {
    pub node_id: i32,
    pub host: String,
    pub port: i32,
}

impl Advertised {
    /// `HOST:PORT` (an IPv6 host in brackets) as a broker of Metadata.
    pub fn parse(node_id: u64, addr: &str) -> Option<Self> {
        let (host, port) = addr.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        Some(Self {
            node_id: i32::try_from(node_id).ok()?,
            host: host.to_string(),
            port: i32::from(port.parse::<u16>().ok()?),
        })
    }
}

/// What the listener does with a request once answered.
#[derive(Debug)]
pub enum Answer {
    /// Write this frame (length included).
    Frame(Bytes),
    /// Nothing to write (a Produce with `acks=0`).
    Nothing,
    /// Close the connection: the request cannot be answered in its
    /// protocol (a frame that does not decode, an API not served), or an
    /// `acks=0` produce failed (Kafka's way of telling such a producer).
    Close(String),
    /// Write this frame, then close (a failed authentication: the client
    /// reads why).
    FrameThenClose(Bytes, String),
}

/// What the listener asks of a Produce's `acks`.
const ACKS_NONE: i16 = 0;
const ACKS_LEADER: i16 = 1;
const ACKS_ALL: i16 = -1;

/// The error label of a request that succeeded.
pub(super) const NO_ERROR: &str = "none";

/// The answers of one shard's Kafka listener.
pub struct Answerer {
    pub(super) shard: Rc<Shard>,
    me: Advertised,
    /// The node's share-group members and sessions (all shards').
    pub(super) shares: Arc<ShareGroups>,
    /// The newest epoch of each idempotent producer (all shards').
    producers: Arc<ProducerEpochs>,
    /// Whether the owners Metadata would name answer this shard.
    owners: Rc<RefCell<OwnerWatch>>,
}

impl Answerer {
    pub fn new(
        shard: Rc<Shard>,
        me: Advertised,
        shares: Arc<ShareGroups>,
        producers: Arc<ProducerEpochs>,
    ) -> Self {
        Self {
            shard,
            me,
            shares,
            producers,
            owners: Rc::default(),
        }
    }

    /// Whether Metadata names `owner` as its partitions' leader: not once
    /// it has failed to answer this shard for the reroute time (then this
    /// node is named). Asks it in the background, at most once a second.
    fn names_owner(&self, owner: u64) -> bool {
        let now = self.shard.mono();
        // Not borrowed across the spawn: glommio may run the probe at once.
        let probe = self.owners.borrow_mut().start_probe(owner, now);
        if probe {
            let shard = self.shard.clone();
            let owners = self.owners.clone();
            // Followed through whatever becomes of the request.
            glommio::spawn_local(async move {
                let answered = shard
                    .readiness_of(&[owner])
                    .await
                    .iter()
                    .all(|r| !matches!(r, MemberReadiness::Unreachable(_)));
                owners
                    .borrow_mut()
                    .probed(owner, now, shard.mono(), answered);
            })
            .detach();
        }
        let reroute_after_ms = self.shard.settings().dispatcher.reroute_after_ms;
        self.owners.borrow().naming(owner, now, reroute_after_ms)
    }

    /// Whether connections must authenticate (`auth.enabled`).
    pub fn auth_enabled(&self) -> bool {
        self.shard.settings().auth.enabled
    }

    /// Answers one request frame (without its length) of a connection
    /// whose authentication is `login`.
    pub async fn answer(&self, frame: Bytes, login: &Login) -> Answer {
        let request = match decode_request(frame) {
            Ok(request) => request,
            Err(FrameError::Unsupported {
                api_key,
                api_version,
                correlation_id,
            }) if api_key == ApiKey::ApiVersions as i16 => {
                count("api_versions", "unsupported_version");
                tracing::debug!(api_version, "ApiVersions in a version not served");
                return frame_of(encode_response(
                    ApiKey::ApiVersions,
                    FALLBACK_VERSION,
                    correlation_id,
                    &api_versions(true),
                ));
            }
            Err(error) => {
                count("unknown", "invalid_request");
                return Answer::Close(error.to_string());
            }
        };
        let key = request.api_key;
        let version = request.api_version;
        let correlation_id = request.header.correlation_id;
        let label = api_label(key);
        match key {
            ApiKey::SaslHandshake => return self.sasl_handshake(&request, login),
            ApiKey::SaslAuthenticate => return self.sasl_authenticate(&request, login).await,
            _ => {}
        }
        if !self.login_holds(login) {
            count(label, "sasl_authentication_failed");
            return Answer::Close(
                "the credentials this connection signed in with were revoked".to_string(),
            );
        }
        let caller = match login.caller() {
            Some(caller) => caller,
            None if before_login(key) => Caller::Anyone,
            None => {
                count(label, "illegal_sasl_state");
                return Answer::Close(format!(
                    "{key:?} before SASL authentication (auth.enabled is true)"
                ));
            }
        };
        let answered = match key {
            ApiKey::ApiVersions => Ok(Some((encode(&request, &api_versions(false)), NO_ERROR))),
            ApiKey::Metadata => self
                .metadata(&request, &caller)
                .map(|r| Some((encode(&request, &r), NO_ERROR))),
            ApiKey::InitProducerId => self
                .init_producer_id(&request)
                .map(|(r, e)| Some((encode(&request, &r), e))),
            ApiKey::FindCoordinator => self
                .find_coordinator(&request)
                .map(|(r, e)| Some((encode(&request, &r), e))),
            ApiKey::Fetch => {
                fetch(&request).map(|r| Some((encode(&request, &r), "unsupported_version")))
            }
            ApiKey::ShareGroupHeartbeat => self
                .share_group_heartbeat(&request, &caller)
                .map(|(r, e)| Some((encode(&request, &r), e))),
            ApiKey::ShareFetch => self
                .share_fetch(&request, &caller)
                .await
                .map(|(r, e)| Some((encode(&request, &r), e))),
            ApiKey::ShareAcknowledge => self
                .share_acknowledge(&request, &caller)
                .await
                .map(|(r, e)| Some((encode(&request, &r), e))),
            ApiKey::CreateTopics => self
                .create_topics(&request, &caller)
                .await
                .map(|(r, e)| Some((encode(&request, &r), e))),
            ApiKey::Produce => self
                .produce(&request, &caller)
                .await
                .map(|answer| answer.map(|(r, e)| (encode(&request, &r), e))),
            _ => Err(format!("API {key:?} is not served")),
        };
        match answered {
            Ok(Some((Ok(frame), error))) => {
                count(label, error);
                Answer::Frame(frame)
            }
            Ok(None) => {
                count(label, NO_ERROR);
                Answer::Nothing
            }
            Ok(Some((Err(error), _))) => {
                count(label, "unknown_server_error");
                tracing::warn!(api = label, version, correlation_id, %error, "a Kafka answer did not encode");
                Answer::Close(error.to_string())
            }
            Err(why) => {
                count(label, "invalid_request");
                tracing::debug!(
                    api = label,
                    version,
                    correlation_id,
                    why,
                    "closing a Kafka connection"
                );
                Answer::Close(why)
            }
        }
    }

    fn node_id(&self) -> i32 {
        self.me.node_id
    }

    /// The brokers Metadata names: this node, and every other alive node
    /// that recorded a Kafka listener.
    fn brokers(&self) -> Vec<Advertised> {
        let meta = self.shard.meta();
        let view = meta.view();
        let members = meta.members();
        let mut brokers = vec![self.me.clone()];
        for (id, addr) in &view.state.kafka_addrs {
            if i32::try_from(*id).ok() == Some(self.me.node_id) {
                continue;
            }
            let alive = view.state.nodes.get(id).is_none_or(|node| node.alive);
            let member = members.iter().any(|(member, _)| member == id);
            if !alive || !member {
                continue;
            }
            if let Some(broker) = Advertised::parse(*id, addr) {
                brokers.push(broker);
            }
        }
        brokers.sort_by_key(|b| b.node_id);
        brokers
    }

    fn metadata(&self, request: &Request, caller: &Caller) -> Result<MetadataResponse, String> {
        let version = request.api_version;
        let body = decode::<MetadataRequest>(request)?;
        let view = self.shard.meta().view();
        let cluster_id = view.state.cluster_id.clone().unwrap_or_default();
        let brokers = self.brokers();
        let leader_of = |owner: u64| -> i32 {
            match i32::try_from(owner) {
                Ok(id) if id == self.node_id() => id,
                Ok(id) if brokers.iter().any(|b| b.node_id == id) && self.names_owner(owner) => id,
                _ => self.node_id(),
            }
        };
        let described = |topic: &Topic| -> MetadataResponseTopic {
            let partitions = (0..topic.config.partitions)
                .map(|p| {
                    let owner = topic.owners.get(p as usize).copied().unwrap_or_default();
                    let leader = BrokerId(leader_of(owner));
                    MetadataResponsePartition::default()
                        .with_partition_index(i32::try_from(p).unwrap_or(i32::MAX))
                        .with_leader_id(leader)
                        .with_replica_nodes(vec![leader])
                        .with_isr_nodes(vec![leader])
                })
                .collect();
            MetadataResponseTopic::default()
                .with_name(Some(TopicName(StrBytes::from_string(topic.name.clone()))))
                .with_topic_id(topic_id(topic))
                .with_partitions(partitions)
        };
        let all = body.topics.is_none()
            || (version == 0 && body.topics.as_ref().is_some_and(Vec::is_empty));
        // A topic the caller holds no grant on is not there for it (as in
        // HTTP's list), and named it is an authorization failure.
        let unseen = |name: &str| !self.sees(caller, name);
        let refused = |name: &TopicName| {
            MetadataResponseTopic::default()
                .with_name(Some(name.clone()))
                .with_error_code(ResponseError::TopicAuthorizationFailed.code())
        };
        let topics: Vec<MetadataResponseTopic> = if all {
            view.state
                .topics
                .values()
                .filter(|t| !unseen(&t.name))
                .map(described)
                .collect()
        } else {
            body.topics
                .unwrap_or_default()
                .into_iter()
                .map(|wanted| {
                    match wanted
                        .name
                        .as_ref()
                        .filter(|n| !n.0.is_empty() || wanted.topic_id.is_nil())
                    {
                        Some(name) if unseen(name.0.as_str()) => refused(name),
                        Some(name) => match view.state.topics.get(name.0.as_str()) {
                            Some(topic) => described(topic),
                            None => MetadataResponseTopic::default()
                                .with_name(Some(name.clone()))
                                .with_error_code(ResponseError::UnknownTopicOrPartition.code()),
                        },
                        None => match view
                            .state
                            .topics
                            .values()
                            .find(|t| topic_id(t) == wanted.topic_id && !unseen(&t.name))
                        {
                            Some(topic) => described(topic),
                            None => MetadataResponseTopic::default()
                                .with_topic_id(wanted.topic_id)
                                .with_error_code(ResponseError::UnknownTopicId.code()),
                        },
                    }
                })
                .collect()
        };
        let controller = self
            .shard
            .meta()
            .leader()
            .and_then(|id| i32::try_from(id).ok())
            .unwrap_or(-1);
        Ok(MetadataResponse::default()
            .with_brokers(
                brokers
                    .into_iter()
                    .map(|b| {
                        MetadataResponseBroker::default()
                            .with_node_id(BrokerId(b.node_id))
                            .with_host(StrBytes::from_string(b.host))
                            .with_port(b.port)
                    })
                    .collect(),
            )
            .with_cluster_id(Some(StrBytes::from_string(cluster_id.clone())))
            .with_controller_id(BrokerId(controller))
            .with_topics(topics))
    }

    /// A producer id for an idempotent producer: this node's id in the
    /// high bits and random low bits, so that ids stay unique across nodes
    /// and restarts (a retry's copy is dropped by (producer id, epoch,
    /// partition, sequence), so a reused id would drop a new producer's
    /// messages). Given its id and epoch (KIP-360, after records timed
    /// out), the same id in the next epoch.
    fn init_producer_id(
        &self,
        request: &Request,
    ) -> Result<(InitProducerIdResponse, &'static str), String> {
        let body = decode::<InitProducerIdRequest>(request)?;
        let refused = |error: ResponseError, label| {
            Ok((
                InitProducerIdResponse::default()
                    .with_error_code(error.code())
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1),
                label,
            ))
        };
        if body.transactional_id.is_some() {
            return refused(
                ResponseError::TransactionalIdAuthorizationFailed,
                "transactional_id_authorization_failed",
            );
        }
        let held = *body.producer_id;
        if held >= 0 && body.producer_epoch >= 0 {
            match self.producers.bump(held, body.producer_epoch) {
                Ok(Some(epoch)) => {
                    return Ok((
                        InitProducerIdResponse::default()
                            .with_producer_id(ProducerId(held))
                            .with_producer_epoch(epoch),
                        NO_ERROR,
                    ))
                }
                // The epochs of this id are used up: a new id below.
                Ok(None) => {}
                Err(stale) => {
                    tracing::debug!(%stale, "InitProducerId from an epoch already bumped");
                    return refused(
                        ResponseError::InvalidProducerEpoch,
                        "invalid_producer_epoch",
                    );
                }
            }
        }
        let random = crate::auth::random_bytes::<8>().map_err(|e| format!("no randomness: {e}"))?;
        let low = u64::from_le_bytes(random) & PRODUCER_ID_LOW_MASK;
        let id = (u64::from(self.me.node_id as u16) << PRODUCER_ID_LOW_BITS) | low;
        Ok((
            InitProducerIdResponse::default()
                .with_producer_id(ProducerId(i64::try_from(id).unwrap_or(i64::MAX)))
                .with_producer_epoch(0),
            NO_ERROR,
        ))
    }

    /// Every node coordinates every group: the answer is this node.
    /// Transactions have none (Narad has no transactions).
    fn find_coordinator(
        &self,
        request: &Request,
    ) -> Result<(FindCoordinatorResponse, &'static str), String> {
        let body = decode::<FindCoordinatorRequest>(request)?;
        let transactions = body.key_type == COORDINATOR_KEY_TRANSACTION;
        let (error, message, label) = if transactions {
            (
                ResponseError::TransactionalIdAuthorizationFailed.code(),
                Some(StrBytes::from_static_str("Narad has no transactions")),
                "transactional_id_authorization_failed",
            )
        } else {
            (0, None, NO_ERROR)
        };
        let host = StrBytes::from_string(self.me.host.clone());
        let answer = if request.api_version >= FIND_COORDINATOR_BATCHED {
            let coordinators = body
                .coordinator_keys
                .into_iter()
                .map(|key| {
                    let found = Coordinator::default()
                        .with_key(key)
                        .with_error_code(error)
                        .with_error_message(message.clone());
                    if transactions {
                        found.with_node_id(BrokerId(-1)).with_port(-1)
                    } else {
                        found
                            .with_node_id(BrokerId(self.node_id()))
                            .with_host(host.clone())
                            .with_port(self.me.port)
                    }
                })
                .collect();
            FindCoordinatorResponse::default().with_coordinators(coordinators)
        } else if transactions {
            FindCoordinatorResponse::default()
                .with_error_code(error)
                .with_error_message(message)
                .with_node_id(BrokerId(-1))
                .with_port(-1)
        } else {
            FindCoordinatorResponse::default()
                .with_node_id(BrokerId(self.node_id()))
                .with_host(host)
                .with_port(self.me.port)
        };
        Ok((answer, label))
    }

    /// A Produce: each partition's records checked whole, then produced
    /// as over HTTP (answered once durable in this node's WAL), all the
    /// partitions side by side. `None`: `acks=0`, answered with nothing.
    async fn produce(
        &self,
        request: &Request,
        caller: &Caller,
    ) -> Result<Option<(ProduceResponse, &'static str)>, String> {
        let version = request.api_version;
        let body = decode::<ProduceRequest>(request)?;
        let acks = body.acks;
        let refused = if body.transactional_id.is_some() {
            Some((
                ResponseError::TransactionalIdAuthorizationFailed,
                "Narad has no transactions".to_string(),
            ))
        } else if ![ACKS_NONE, ACKS_LEADER, ACKS_ALL].contains(&acks) {
            Some((
                ResponseError::InvalidRequiredAcks,
                format!("acks={acks}: Narad takes 0, 1 or -1 (all)"),
            ))
        } else {
            None
        };
        let mut work = Vec::new();
        for topic_data in body.topic_data {
            let name = topic_data.name.0.to_string();
            let topic = self
                .may(caller, Action::Produce, &name)
                .and_then(|()| self.shard.topic(&name));
            for partition in topic_data.partition_data {
                let outcome = match (&refused, &topic) {
                    (Some((error, message)), _) => {
                        PartitionOutcome::failed(*error, message.clone())
                    }
                    (None, Err(error)) => PartitionOutcome::api(error),
                    (None, Ok(topic)) => PartitionOutcome::Pending(topic.clone()),
                };
                work.push((name.clone(), partition.index, partition.records, outcome));
            }
        }
        let produced = futures_util::future::join_all(work.into_iter().map(
            |(name, index, records, outcome)| async move {
                let outcome = match outcome {
                    PartitionOutcome::Pending(topic) => {
                        self.produce_partition(&topic, index, records).await
                    }
                    done => done,
                };
                (name, index, outcome)
            },
        ))
        .await;
        let mut first_error = NO_ERROR;
        let mut throttle = 0;
        let mut responses: Vec<TopicProduceResponse> = Vec::new();
        for (name, index, outcome) in produced {
            let PartitionOutcome::Done { error, message } = outcome else {
                continue;
            };
            if let Some(error) = error {
                if first_error == NO_ERROR {
                    first_error = error_label(error);
                }
                if error == ResponseError::NotEnoughReplicas {
                    throttle = KAFKA_OVERLOAD_THROTTLE_MS;
                }
            }
            let mut partition = PartitionProduceResponse::default()
                .with_index(index)
                .with_error_code(error.map_or(0, |e| e.code()))
                // The offset is the owner's to give, after the answer.
                .with_base_offset(-1)
                .with_log_append_time_ms(-1)
                .with_log_start_offset(-1);
            if let Some(message) = message {
                if version >= PRODUCE_RECORD_ERRORS && error == Some(ResponseError::InvalidRecord) {
                    partition =
                        partition.with_record_errors(vec![BatchIndexAndErrorMessage::default()
                            .with_batch_index(0)
                            .with_batch_index_error_message(Some(StrBytes::from_string(
                                message.clone(),
                            )))]);
                }
                if version >= PRODUCE_RECORD_ERRORS {
                    partition = partition.with_error_message(Some(StrBytes::from_string(message)));
                }
            }
            match responses.iter_mut().find(|t| t.name.0.as_str() == name) {
                Some(topic) => topic.partition_responses.push(partition),
                None => responses.push(
                    TopicProduceResponse::default()
                        .with_name(TopicName(StrBytes::from_string(name)))
                        .with_partition_responses(vec![partition]),
                ),
            }
        }
        if acks == ACKS_NONE {
            if first_error != NO_ERROR {
                return Err(format!("an acks=0 produce failed ({first_error})"));
            }
            return Ok(None);
        }
        Ok(Some((
            ProduceResponse::default()
                .with_responses(responses)
                .with_throttle_time_ms(throttle),
            first_error,
        )))
    }

    async fn produce_partition(
        &self,
        topic: &Topic,
        index: i32,
        records: Option<Bytes>,
    ) -> PartitionOutcome {
        let partition = match u32::try_from(index) {
            Ok(p) if p < topic.config.partitions => p,
            _ => {
                return PartitionOutcome::failed(
                    ResponseError::UnknownTopicOrPartition,
                    format!(
                        "topic {} has no partition {index} (it has {})",
                        topic.name, topic.config.partitions
                    ),
                )
            }
        };
        let records = match records_of(index, records.unwrap_or_default()) {
            Ok(records) => records,
            Err(error) => return PartitionOutcome::records(&error),
        };
        if records.is_empty() {
            return PartitionOutcome::ok();
        }
        // An older epoch's records are refused whole, before any is written.
        let mut producers: Vec<Producer> = records.iter().filter_map(|r| r.producer).collect();
        producers.sort_unstable();
        producers.dedup();
        for producer in producers {
            if let Err(stale) = self.producers.admit(producer.id, producer.epoch) {
                return PartitionOutcome::failed(
                    ResponseError::InvalidProducerEpoch,
                    stale.to_string(),
                );
            }
        }
        let messages = records
            .into_iter()
            .map(|r| Incoming {
                key: r.key,
                value: r.value,
                idempotency_key: r.idempotency_key,
                partition: Some(partition),
            })
            .collect();
        match self.shard.produce(topic, messages).await {
            Ok(_) => PartitionOutcome::ok(),
            Err(error) => PartitionOutcome::api(&error),
        }
    }
}

impl Answerer {
    /// CreateTopics: each topic created as `PUT /v1/topics/{topic}` creates
    /// it, with the topic settings Narad knows (its own names, and Kafka's
    /// `retention.ms` and `max.message.bytes`); anything else is refused
    /// naming it. A topic that exists is `TOPIC_ALREADY_EXISTS` (Kafka
    /// never changes one this way).
    async fn create_topics(
        &self,
        request: &Request,
        caller: &Caller,
    ) -> Result<(CreateTopicsResponse, &'static str), String> {
        let version = request.api_version;
        let body = decode::<CreateTopicsRequest>(request)?;
        let mut results = Vec::with_capacity(body.topics.len());
        let mut first_error = NO_ERROR;
        for wanted in body.topics {
            let mut result = CreatableTopicResult::default()
                .with_name(wanted.name.clone())
                .with_error_message(None)
                .with_configs(None);
            let allowed = self
                .may(caller, Action::Admin, wanted.name.0.as_str())
                .map_err(|e| (kafka_error(e.code), e.message));
            let created = match allowed {
                Ok(()) => self.create_topic(&wanted, body.validate_only).await,
                Err(refused) => Err(refused),
            };
            match created {
                Ok((partitions, topic)) => {
                    if version >= CREATE_TOPICS_DETAILS {
                        result = result
                            .with_num_partitions(i32::try_from(partitions).unwrap_or(i32::MAX))
                            .with_replication_factor(1);
                    }
                    if let Some(topic) = topic.filter(|_| version >= CREATE_TOPICS_TOPIC_ID) {
                        result = result.with_topic_id(topic_id(&topic));
                    }
                }
                Err((error, message)) => {
                    if first_error == NO_ERROR {
                        first_error = error_label(error);
                    }
                    result = result
                        .with_error_code(error.code())
                        .with_error_message(Some(StrBytes::from_string(message)));
                }
            }
            results.push(result);
        }
        Ok((
            CreateTopicsResponse::default().with_topics(results),
            first_error,
        ))
    }

    /// One topic of a CreateTopics: its partition count, and the topic
    /// unless only validated.
    async fn create_topic(
        &self,
        wanted: &CreatableTopic,
        validate_only: bool,
    ) -> Result<(u32, Option<Topic>), (ResponseError, String)> {
        let name = wanted.name.0.as_str();
        narad_net::names::validate_topic_name(name)
            .map_err(|e| (ResponseError::InvalidTopicException, e.message))?;
        if !matches!(wanted.replication_factor, -1 | 1) {
            return Err((
                ResponseError::InvalidReplicationFactor,
                format!(
                    "replication factor {}: Narad keeps one copy of each partition (give -1 or 1)",
                    wanted.replication_factor
                ),
            ));
        }
        if !wanted.assignments.is_empty() {
            return Err((
                ResponseError::InvalidReplicaAssignment,
                "Narad places partitions itself: give no replica assignment".to_string(),
            ));
        }
        let exists = || {
            (
                ResponseError::TopicAlreadyExists,
                format!("topic {name} exists"),
            )
        };
        if self.shard.meta().view().state.topics.contains_key(name) {
            return Err(exists());
        }
        let mut fields = serde_json::Map::new();
        if wanted.num_partitions != -1 {
            fields.insert(
                "partitions".into(),
                serde_json::Value::from(wanted.num_partitions),
            );
        }
        for config in &wanted.configs {
            let value = config.value.as_ref().map(|v| v.to_string());
            let (field, value) = topic_setting(config.name.as_str(), value)
                .map_err(|why| (ResponseError::InvalidConfig, why))?;
            fields.insert(field.into(), value);
        }
        let body = serde_json::Value::Object(fields).to_string();
        let (floor, max_message) = crate::api::topic_bounds(&self.shard);
        let refused = |error: ApiError| match error.code {
            ErrorCode::InvalidRequest | ErrorCode::UnknownField => {
                (ResponseError::InvalidConfig, error.message)
            }
            code => (kafka_error(code), error.message),
        };
        let patch = TopicPatch::parse(body.as_bytes(), floor, max_message).map_err(refused)?;
        if validate_only {
            let (config, _) = self.shard.resolve_config(None, patch).map_err(refused)?;
            return Ok((config.partitions, None));
        }
        match self.shard.put_topic(name, patch).await {
            Ok((true, topic)) => Ok((topic.config.partitions, Some(topic))),
            Ok((false, _)) => Err(exists()),
            Err(error) => Err(refused(error)),
        }
    }
}

/// A CreateTopics config as the topic field it sets: Narad's own names,
/// and Kafka's two that mean the same (`retention.ms`, where -1 is
/// forever, and `max.message.bytes`).
fn topic_setting(
    key: &str,
    value: Option<String>,
) -> Result<(&'static str, serde_json::Value), String> {
    let Some(value) = value else {
        return Err(format!("config {key} has no value"));
    };
    let number = |field: &'static str| -> Result<(&'static str, serde_json::Value), String> {
        let parsed: u64 = value
            .trim()
            .parse()
            .map_err(|_| format!("config {key} = {value:?} is not a whole number"))?;
        Ok((field, serde_json::Value::from(parsed)))
    };
    match key {
        "retention.ms" if value.trim() == "-1" => Ok(("retention_ms", serde_json::Value::from(0))),
        "retention.ms" | "retention_ms" => number("retention_ms"),
        "max.message.bytes" | "max_message_bytes" => number("max_message_bytes"),
        "visibility_timeout_ms" => number("visibility_timeout_ms"),
        "max_deliveries" => number("max_deliveries"),
        "idempotency_window_ms" => number("idempotency_window_ms"),
        "dead_letter_topic" => Ok(("dead_letter_topic", serde_json::Value::from(value))),
        "schema" => Ok(("schema", serde_json::Value::from(value))),
        other => Err(format!(
            "config {other} is not a Narad topic setting (Narad takes retention.ms, max.message.bytes, visibility_timeout_ms, max_deliveries, dead_letter_topic, schema and idempotency_window_ms)"
        )),
    }
}

/// CreateTopics answers partitions and replication from this version, and
/// the topic id from version 7.
const CREATE_TOPICS_DETAILS: i16 = 5;
const CREATE_TOPICS_TOPIC_ID: i16 = 7;

/// A partition of a Produce: to be produced, or answered.
enum PartitionOutcome {
    Pending(Rc<Topic>),
    Done {
        error: Option<ResponseError>,
        message: Option<String>,
    },
}

impl PartitionOutcome {
    fn ok() -> Self {
        Self::Done {
            error: None,
            message: None,
        }
    }

    fn failed(error: ResponseError, message: String) -> Self {
        Self::Done {
            error: Some(error),
            message: Some(message),
        }
    }

    fn api(error: &ApiError) -> Self {
        Self::failed(kafka_error(error.code), error.message.clone())
    }

    fn records(error: &RecordsError) -> Self {
        let code = error.code();
        let error_code = match code {
            c if c == ResponseError::CorruptMessage.code() => ResponseError::CorruptMessage,
            c if c == ResponseError::UnsupportedCompressionType.code() => {
                ResponseError::UnsupportedCompressionType
            }
            _ => ResponseError::InvalidRecord,
        };
        Self::failed(error_code, error.to_string())
    }
}

/// FindCoordinator's key type of a transaction.
const COORDINATOR_KEY_TRANSACTION: i8 = 1;
/// FindCoordinator answers a list of keys from this version.
const FIND_COORDINATOR_BATCHED: i16 = 4;
/// Produce answers carry per-batch errors and a message from this version.
const PRODUCE_RECORD_ERRORS: i16 = 8;
/// Low bits of a producer id drawn at random (the node id is above them).
const PRODUCER_ID_LOW_BITS: u32 = 47;
const PRODUCER_ID_LOW_MASK: u64 = (1 << PRODUCER_ID_LOW_BITS) - 1;

/// Fetch is advertised (clients take record batches v2 and zstd only from
/// a broker that lists it) and answered `UNSUPPORTED_VERSION`: classic
/// consumers are not served; share groups are.
fn fetch(request: &Request) -> Result<FetchResponse, String> {
    let body = decode::<FetchRequest>(request)?;
    let unsupported = ResponseError::UnsupportedVersion.code();
    let responses = body
        .topics
        .into_iter()
        .map(|topic| {
            FetchableTopicResponse::default()
                .with_topic(topic.topic)
                .with_topic_id(topic.topic_id)
                .with_partitions(
                    topic
                        .partitions
                        .into_iter()
                        .map(|p| {
                            PartitionData::default()
                                .with_partition_index(p.partition)
                                .with_error_code(unsupported)
                        })
                        .collect(),
                )
        })
        .collect();
    Ok(FetchResponse::default()
        .with_error_code(unsupported)
        .with_responses(responses))
}

/// A topic's Kafka id: stable for the topic's life (it must not change
/// when the cluster gets its id, which may come after the first requests),
/// new when a topic of the same name is created again (its incarnation and
/// creation time), and different in another cluster (the creation time).
pub fn topic_id(topic: &Topic) -> uuid::Uuid {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"narad kafka topic id\0");
    hasher.update(topic.name.as_bytes());
    hasher.update(b"\0");
    hasher.update(&topic.incarnation.to_le_bytes());
    hasher.update(&topic.created_at_ms.to_le_bytes());
    let hash = hasher.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&hash.as_bytes()[..16]);
    uuid::Uuid::from_bytes(bytes)
}

pub(super) fn decode<M: Decodable>(request: &Request) -> Result<M, String> {
    M::decode(&mut request.body.clone(), request.api_version)
        .map_err(|e| format!("a {:?} request that does not decode: {e}", request.api_key))
}

pub(super) fn encode<M: Encodable>(request: &Request, body: &M) -> Result<Bytes, FrameError> {
    encode_response(
        request.api_key,
        request.api_version,
        request.header.correlation_id,
        body,
    )
}

fn frame_of(encoded: Result<Bytes, FrameError>) -> Answer {
    match encoded {
        Ok(frame) => Answer::Frame(frame),
        Err(error) => Answer::Close(error.to_string()),
    }
}

/// The `api` label of `narad_kafka_requests_total`.
fn api_label(key: ApiKey) -> &'static str {
    match key {
        ApiKey::ApiVersions => "api_versions",
        ApiKey::Metadata => "metadata",
        ApiKey::Produce => "produce",
        ApiKey::InitProducerId => "init_producer_id",
        ApiKey::FindCoordinator => "find_coordinator",
        ApiKey::Fetch => "fetch",
        ApiKey::CreateTopics => "create_topics",
        ApiKey::ShareGroupHeartbeat => "share_group_heartbeat",
        ApiKey::ShareFetch => "share_fetch",
        ApiKey::ShareAcknowledge => "share_acknowledge",
        ApiKey::SaslHandshake => "sasl_handshake",
        ApiKey::SaslAuthenticate => "sasl_authenticate",
        _ => "other",
    }
}

/// The `error` label of a Kafka error: its name in snake case.
pub(super) fn error_label(error: ResponseError) -> &'static str {
    match error {
        ResponseError::UnknownTopicOrPartition => "unknown_topic_or_partition",
        ResponseError::MessageTooLarge => "message_too_large",
        ResponseError::InvalidRecord => "invalid_record",
        ResponseError::CorruptMessage => "corrupt_message",
        ResponseError::UnsupportedCompressionType => "unsupported_compression_type",
        ResponseError::KafkaStorageError => "kafka_storage_error",
        ResponseError::NotEnoughReplicas => "not_enough_replicas",
        ResponseError::NotLeaderOrFollower => "not_leader_or_follower",
        ResponseError::TopicAuthorizationFailed => "topic_authorization_failed",
        ResponseError::InvalidRequiredAcks => "invalid_required_acks",
        ResponseError::InvalidProducerEpoch => "invalid_producer_epoch",
        ResponseError::TransactionalIdAuthorizationFailed => {
            "transactional_id_authorization_failed"
        }
        ResponseError::InvalidRequest => "invalid_request",
        ResponseError::RequestTimedOut => "request_timed_out",
        ResponseError::TopicAlreadyExists => "topic_already_exists",
        ResponseError::InvalidRecordState => "invalid_record_state",
        ResponseError::UnknownMemberId => "unknown_member_id",
        ResponseError::FencedMemberEpoch => "fenced_member_epoch",
        ResponseError::ShareSessionNotFound => "share_session_not_found",
        ResponseError::InvalidShareSessionEpoch => "invalid_share_session_epoch",
        ResponseError::ShareSessionLimitReached => "share_session_limit_reached",
        ResponseError::InvalidGroupId => "invalid_group_id",
        ResponseError::InvalidConfig => "invalid_config",
        ResponseError::InvalidReplicationFactor => "invalid_replication_factor",
        ResponseError::InvalidReplicaAssignment => "invalid_replica_assignment",
        ResponseError::InvalidTopicException => "invalid_topic_exception",
        ResponseError::SaslAuthenticationFailed => "sasl_authentication_failed",
        ResponseError::IllegalSaslState => "illegal_sasl_state",
        ResponseError::UnsupportedSaslMechanism => "unsupported_sasl_mechanism",
        _ => "other",
    }
}

type RequestCounters = HashMap<(&'static str, &'static str), metrics::Counter>;

thread_local! {
    /// Counter handles by (api, error): a registry lookup per request
    /// costs allocations and hashing.
    static REQUEST_COUNTERS: RefCell<RequestCounters> = RefCell::default();
}

pub(super) fn count(api: &'static str, error: &'static str) {
    REQUEST_COUNTERS.with(|cache| {
        cache
            .borrow_mut()
            .entry((api, error))
            .or_insert_with(
                || metrics::counter!(KAFKA_REQUESTS_TOTAL, "api" => api, "error" => error),
            )
            .increment(1);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_advertised_address_is_split_into_host_and_port() {
        assert_eq!(
            Advertised::parse(3, "10.0.0.7:9092"),
            Some(Advertised {
                node_id: 3,
                host: "10.0.0.7".into(),
                port: 9092
            })
        );
        assert_eq!(
            Advertised::parse(1, "[::1]:19092").map(|a| a.host),
            Some("::1".to_string())
        );
        assert_eq!(Advertised::parse(1, "no-port"), None);
        assert_eq!(Advertised::parse(1, "host:99999"), None);
    }
}
