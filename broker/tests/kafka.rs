//! The Kafka listener from outside: requests encoded as a Kafka client
//! encodes them, against a real node, and stock Kafka clients (installed by
//! `ops/install-check-tools.sh`; required where `NARAD_OPS_CHECKS=required`,
//! as in `.ci/run`) producing to it, their messages consumed over HTTP.

mod support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, FetchRequest, FetchResponse,
    FindCoordinatorRequest, FindCoordinatorResponse, InitProducerIdRequest, InitProducerIdResponse,
    MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse, RequestHeader,
    ResponseHeader, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse, TopicName, TransactionalId,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use kafka_protocol::ResponseError;
use serde_json::{json, Value};
use support::cluster::Cluster;
use support::{eventually, Node, REQUEST_DEADLINE};

const KAFKA_LISTEN: [&str; 2] = ["--kafka-listen", "127.0.0.1:0"];
/// The longest a stock producer may go without a delivery report for a
/// partition whose owner was killed (docs/availability.md).
const KAFKA_REPORT_GAP_MAX_S: f64 = 8.0;

/// One connection speaking the Kafka protocol.
/// A byte stream to the listener: plain TCP or TLS.
trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

struct Conn {
    stream: Box<dyn Stream>,
    next_correlation: i32,
}

impl Conn {
    fn connect(addr: &str) -> Self {
        let stream = TcpStream::connect(addr).expect("connect to the Kafka listener");
        stream
            .set_read_timeout(Some(REQUEST_DEADLINE))
            .expect("timeout");
        Self {
            stream: Box::new(stream),
            next_correlation: 1,
        }
    }

    /// A TLS connection that trusts the CA in `ca_file`.
    fn connect_tls(addr: &str, ca_file: &Path) -> Self {
        let tcp = TcpStream::connect(addr).expect("connect to the Kafka listener");
        tcp.set_read_timeout(Some(REQUEST_DEADLINE))
            .expect("timeout");
        let config = narad_net::tls::client_config(&narad_net::tls::ClientTlsFiles {
            ca_file: Some(support::tls::path(ca_file)),
            ..Default::default()
        })
        .expect("client TLS");
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let connection = rustls::ClientConnection::new(config, name).expect("TLS client");
        Self {
            stream: Box::new(rustls::StreamOwned::new(connection, tcp)),
            next_correlation: 1,
        }
    }

    /// Sends a request; returns its correlation id.
    fn send<M: Encodable>(&mut self, key: ApiKey, version: i16, body: &M) -> i32 {
        let mut encoded = BytesMut::new();
        body.encode(&mut encoded, version).expect("body");
        self.send_raw(key, version, &encoded)
    }

    /// Sends a request whose body is `body` as it is.
    fn send_raw(&mut self, key: ApiKey, version: i16, body: &[u8]) -> i32 {
        let correlation_id = self.next_correlation;
        self.next_correlation += 1;
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("narad-test")));
        let mut out = BytesMut::new();
        out.put_i32(0);
        let header_version = if version > key.valid_versions().max {
            key.request_header_version(key.valid_versions().max)
        } else {
            key.request_header_version(version)
        };
        header.encode(&mut out, header_version).expect("header");
        out.put_slice(body);
        let len = (out.len() - 4) as i32;
        out[..4].copy_from_slice(&len.to_be_bytes());
        self.stream.write_all(&out).expect("send");
        correlation_id
    }

    /// Reads one answer frame; `None` when the node closed the connection.
    fn frame(&mut self) -> Option<Bytes> {
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).ok()?;
        let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
        self.stream.read_exact(&mut body).ok()?;
        Some(Bytes::from(body))
    }

    fn receive<R: Decodable>(&mut self, key: ApiKey, version: i16) -> (i32, R) {
        let mut frame = self.frame().expect("an answer");
        let header = ResponseHeader::decode(&mut frame, key.response_header_version(version))
            .expect("response header");
        let body = R::decode(&mut frame, version).expect("response body");
        assert!(!frame.has_remaining(), "bytes left after the answer");
        (header.correlation_id, body)
    }

    fn call<M: Encodable, R: Decodable>(&mut self, key: ApiKey, version: i16, body: &M) -> R {
        let sent = self.send(key, version, body);
        let (got, answer) = self.receive(key, version);
        assert_eq!(got, sent, "the answer's correlation id");
        answer
    }

    /// Whether the node closed the connection (it answers nothing more).
    fn closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(self.stream.read(&mut byte), Ok(0) | Err(_))
    }
}

fn record(key: Option<&str>, value: &str, producer_id: i64, sequence: i32) -> Record {
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id,
        producer_epoch: if producer_id >= 0 { 0 } else { -1 },
        timestamp_type: TimestampType::Creation,
        offset: i64::from(sequence.max(0)),
        sequence,
        timestamp: 1,
        key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
        value: Some(Bytes::copy_from_slice(value.as_bytes())),
        headers: IndexMap::new(),
    }
}

fn batch(records: &[Record]) -> Bytes {
    let mut out = BytesMut::new();
    let options = RecordEncodeOptions {
        version: 2,
        compression: Compression::None,
    };
    RecordBatchEncoder::encode(&mut out, records.iter(), &options).expect("encode");
    out.freeze()
}

fn produce_request(topic: &str, partition: i32, records: Bytes, acks: i16) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(records))])])
}

/// The error code of the one partition a Produce answer holds.
fn partition_error(answer: &ProduceResponse) -> (i16, Option<String>) {
    let partition = &answer.responses[0].partition_responses[0];
    (
        partition.error_code,
        partition.error_message.as_ref().map(|m| m.to_string()),
    )
}

fn kafka_node(dir: &Path) -> Node {
    Node::start(&dir.join("node"), &KAFKA_LISTEN)
}

/// Every message of `topic` over HTTP, consumed and acked, as (key, value).
fn drain_over_http(node: &Node, topic: &str) -> Vec<(Option<String>, String)> {
    let mut got = Vec::new();
    let emptied = eventually(REQUEST_DEADLINE * 4, || {
        let messages = node.consume(topic, json!({"max_messages": 1000, "wait_ms": 200}));
        if !messages.is_empty() {
            support::ack_batch(node, topic, &messages);
            for message in &messages {
                got.push((
                    message["key"].as_str().map(str::to_string),
                    message["value"].as_str().expect("a text value").to_string(),
                ));
            }
            return false;
        }
        let (_, stats) = node.request("GET", &format!("/v1/topics/{topic}"), b"");
        stats["partition_stats"].as_array().is_some_and(|parts| {
            parts
                .iter()
                .all(|p| p["available"] == 0 && p["in_flight"] == 0)
        })
    });
    assert!(emptied, "{topic} did not empty");
    got
}

/// What an idempotent producer sends first (no transactional id).
fn idempotent_init() -> InitProducerIdRequest {
    InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(60_000)
}

/// The sum of a metric over all its labels.
fn labelled_sum(node: &Node, name: &str) -> f64 {
    let (_, _, body) = support::raw_request(&node.addr, "GET", "/metrics", &[], b"");
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|line| line.starts_with(&format!("{name}{{")))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[test]
fn the_listener_answers_what_a_kafka_client_asks_first() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = kafka_node(tmp.path());
    let addr = node
        .kafka_addr
        .clone()
        .expect("the node names its Kafka address");
    node.create_topic("orders", json!({"partitions": 3}));
    let mut conn = Conn::connect(&addr);

    // ApiVersions lists what is served; a version too new is answered in
    // version 0 with UNSUPPORTED_VERSION and the list (KIP-511).
    let versions: ApiVersionsResponse =
        conn.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
    assert_eq!(versions.error_code, 0);
    let listed: BTreeMap<i16, (i16, i16)> = versions
        .api_keys
        .iter()
        .map(|k| (k.api_key, (k.min_version, k.max_version)))
        .collect();
    assert_eq!(listed.get(&(ApiKey::Produce as i16)), Some(&(3, 12)));
    assert_eq!(listed.get(&(ApiKey::Fetch as i16)), Some(&(4, 12)));
    assert_eq!(listed.get(&(ApiKey::InitProducerId as i16)), Some(&(0, 5)));
    let sent = conn.send_raw(ApiKey::ApiVersions, 99, &[]);
    let (got, old): (i32, ApiVersionsResponse) = conn.receive(ApiKey::ApiVersions, 0);
    assert_eq!(got, sent);
    assert_eq!(old.error_code, 35, "UNSUPPORTED_VERSION");
    assert_eq!(old.api_keys.len(), versions.api_keys.len());

    // Metadata: this node is the broker and leads every partition; a
    // topic's id finds it again; a missing topic is UNKNOWN_TOPIC_OR_PARTITION.
    let request = MetadataRequest::default().with_topics(Some(vec![
        MetadataRequestTopic::default()
            .with_name(Some(TopicName(StrBytes::from_static_str("orders")))),
        MetadataRequestTopic::default()
            .with_name(Some(TopicName(StrBytes::from_static_str("nope")))),
    ]));
    let metadata: MetadataResponse = conn.call(ApiKey::Metadata, 12, &request);
    assert_eq!(metadata.brokers.len(), 1);
    let broker = &metadata.brokers[0];
    assert_eq!(
        format!("{}:{}", broker.host.as_str(), broker.port),
        addr,
        "the broker is the listener"
    );
    assert_eq!(*broker.node_id, 1);
    let orders = &metadata.topics[0];
    assert_eq!(orders.error_code, 0);
    assert_eq!(orders.partitions.len(), 3);
    assert!(orders.partitions.iter().all(|p| *p.leader_id == 1));
    assert!(!orders.topic_id.is_nil());
    assert_eq!(metadata.topics[1].error_code, 3);
    let by_id: MetadataResponse = conn.call(
        ApiKey::Metadata,
        12,
        &MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default()
            .with_name(None)
            .with_topic_id(orders.topic_id)])),
    );
    assert_eq!(
        by_id.topics[0].name.as_ref().map(|n| n.0.to_string()),
        Some("orders".to_string())
    );
    let all: MetadataResponse = conn.call(
        ApiKey::Metadata,
        1,
        &MetadataRequest::default().with_topics(None),
    );
    assert_eq!(all.topics.len(), 1, "null topics: all of them");

    // A topic created again is another topic: another id.
    assert_eq!(node.request("DELETE", "/v1/topics/orders", b"").0, 204);
    node.create_topic("orders", json!({"partitions": 3}));
    let again: MetadataResponse = conn.call(ApiKey::Metadata, 12, &request);
    assert_ne!(again.topics[0].topic_id, orders.topic_id);

    // Idempotent producers get distinct ids; transactions are refused.
    let first: InitProducerIdResponse = conn.call(ApiKey::InitProducerId, 4, &idempotent_init());
    let second: InitProducerIdResponse = conn.call(ApiKey::InitProducerId, 4, &idempotent_init());
    assert_eq!(first.error_code, 0);
    assert!(*first.producer_id >= 0 && *second.producer_id >= 0);
    assert_ne!(first.producer_id, second.producer_id);
    let transactional: InitProducerIdResponse = conn.call(
        ApiKey::InitProducerId,
        4,
        &idempotent_init()
            .with_transactional_id(Some(TransactionalId(StrBytes::from_static_str("tx")))),
    );
    assert_ne!(transactional.error_code, 0, "no transactions");

    // Every node coordinates every group: this one.
    let coordinator: FindCoordinatorResponse = conn.call(
        ApiKey::FindCoordinator,
        2,
        &FindCoordinatorRequest::default().with_key(StrBytes::from_static_str("group-a")),
    );
    assert_eq!((coordinator.error_code, *coordinator.node_id), (0, 1));
    let batched: FindCoordinatorResponse = conn.call(
        ApiKey::FindCoordinator,
        4,
        &FindCoordinatorRequest::default()
            .with_coordinator_keys(vec![StrBytes::from_static_str("g1")]),
    );
    assert_eq!(batched.coordinators.len(), 1);
    assert_eq!(batched.coordinators[0].port, broker.port);

    // Fetch is listed, not served.
    let fetch: FetchResponse = conn.call(ApiKey::Fetch, 12, &FetchRequest::default());
    assert_eq!(fetch.error_code, 35);
    let metric = labelled_sum(&node, "narad_kafka_requests_total");
    assert!(metric >= 12.0, "requests counted: {metric}");
}

#[test]
fn records_are_stored_once_whole_or_not_at_all() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = kafka_node(tmp.path());
    let addr = node.kafka_addr.clone().expect("kafka address");
    node.create_topic(
        "orders",
        json!({"partitions": 2, "max_message_bytes": 1024}),
    );
    let mut conn = Conn::connect(&addr);
    let pid: InitProducerIdResponse = conn.call(ApiKey::InitProducerId, 4, &idempotent_init());
    let pid = *pid.producer_id;

    // An idempotent producer's retry of a batch is stored once.
    let records = batch(&[
        record(Some("k0"), "zero", pid, 0),
        record(Some("k1"), "one", pid, 1),
        record(None, "two", pid, 2),
    ]);
    for _ in 0..2 {
        let answer: ProduceResponse = conn.call(
            ApiKey::Produce,
            9,
            &produce_request("orders", 1, records.clone(), -1),
        );
        assert_eq!(partition_error(&answer).0, 0, "{answer:?}");
        assert_eq!(answer.responses[0].partition_responses[0].base_offset, -1);
    }

    // A batch with a bad CRC, one with headers, a record over the topic's
    // limit, a partition or topic that does not exist: refused whole.
    let mut corrupt = BytesMut::from(&batch(&[record(None, "bad", -1, -1)])[..]);
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    let answer: ProduceResponse = conn.call(
        ApiKey::Produce,
        9,
        &produce_request("orders", 0, corrupt.freeze(), -1),
    );
    assert_eq!(partition_error(&answer).0, 2, "CORRUPT_MESSAGE");
    let mut with_header = record(None, "h", -1, -1);
    with_header.headers.insert(
        StrBytes::from_static_str("h"),
        Some(Bytes::from_static(b"v")),
    );
    let answer: ProduceResponse = conn.call(
        ApiKey::Produce,
        9,
        &produce_request(
            "orders",
            0,
            batch(&[record(None, "fine", -1, -1), with_header]),
            -1,
        ),
    );
    let (code, message) = partition_error(&answer);
    assert_eq!(code, 87, "INVALID_RECORD");
    assert!(message.is_some_and(|m| m.contains("headers")));
    let big = "x".repeat(2048);
    let answer: ProduceResponse = conn.call(
        ApiKey::Produce,
        9,
        &produce_request(
            "orders",
            0,
            batch(&[record(None, "fine", -1, -1), record(None, &big, -1, -1)]),
            -1,
        ),
    );
    assert_eq!(partition_error(&answer).0, 10, "MESSAGE_TOO_LARGE");
    let answer: ProduceResponse = conn.call(
        ApiKey::Produce,
        9,
        &produce_request("orders", 7, batch(&[record(None, "x", -1, -1)]), -1),
    );
    assert_eq!(partition_error(&answer).0, 3);
    let answer: ProduceResponse = conn.call(
        ApiKey::Produce,
        9,
        &produce_request("missing", 0, batch(&[record(None, "x", -1, -1)]), -1),
    );
    assert_eq!(
        partition_error(&answer).0,
        3,
        "no topic is created implicitly"
    );
    assert_eq!(node.request("GET", "/v1/topics/missing", b"").0, 404);

    // acks=0 is not answered: the next answer is the next request's.
    conn.send(
        ApiKey::Produce,
        9,
        &produce_request("orders", 0, batch(&[record(None, "quiet", -1, -1)]), 0),
    );
    let sent = conn.send(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
    let (got, _): (i32, ApiVersionsResponse) = conn.receive(ApiKey::ApiVersions, 3);
    assert_eq!(got, sent);

    let mut stored = drain_over_http(&node, "orders");
    stored.sort();
    assert_eq!(
        stored,
        vec![
            (None, "quiet".to_string()),
            (None, "two".to_string()),
            (Some("k0".to_string()), "zero".to_string()),
            (Some("k1".to_string()), "one".to_string()),
        ]
    );
}

/// A record of an idempotent producer in `epoch`.
fn in_epoch(value: &str, producer_id: i64, epoch: i16, sequence: i32) -> Record {
    Record {
        producer_epoch: epoch,
        ..record(None, value, producer_id, sequence)
    }
}

#[test]
fn a_new_producer_epoch_starts_new_sequences_and_an_older_epoch_is_fenced() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = kafka_node(tmp.path());
    let addr = node.kafka_addr.clone().expect("kafka address");
    node.create_topic("epochs", json!({"partitions": 1}));
    let mut conn = Conn::connect(&addr);
    let init: InitProducerIdResponse = conn.call(ApiKey::InitProducerId, 4, &idempotent_init());
    let (pid, first) = (*init.producer_id, init.producer_epoch);
    assert_eq!(first, 0);
    let produce = |conn: &mut Conn, records: &[Record]| -> (i16, Option<String>) {
        let answer: ProduceResponse = conn.call(
            ApiKey::Produce,
            9,
            &produce_request("epochs", 0, batch(records), -1),
        );
        partition_error(&answer)
    };
    let epoch0 = [in_epoch("a0", pid, 0, 0), in_epoch("a1", pid, 0, 1)];
    assert_eq!(produce(&mut conn, &epoch0).0, 0);

    // KIP-360: the same id in the next epoch, whose sequences start at 0.
    let bump: InitProducerIdResponse = conn.call(
        ApiKey::InitProducerId,
        4,
        &idempotent_init()
            .with_producer_id(kafka_protocol::messages::ProducerId(pid))
            .with_producer_epoch(0),
    );
    assert_eq!(
        (bump.error_code, *bump.producer_id, bump.producer_epoch),
        (0, pid, 1)
    );
    let epoch1 = [in_epoch("b0", pid, 1, 0), in_epoch("b1", pid, 1, 1)];
    for _ in 0..2 {
        assert_eq!(produce(&mut conn, &epoch1).0, 0, "epoch 1 and its retry");
    }
    // A straggler of epoch 0 is refused and stored nowhere.
    let (code, message) = produce(&mut conn, &[in_epoch("stale", pid, 0, 2)]);
    assert_eq!(
        code,
        ResponseError::InvalidProducerEpoch.code(),
        "{message:?}"
    );
    assert!(message.is_some_and(|m| m.contains("epoch")));
    // A client's local bump (librdkafka's after a timeout): sequences from 0.
    assert_eq!(produce(&mut conn, &[in_epoch("c0", pid, 2, 0)]).0, 0);
    // Asking to bump from an epoch two behind: another instance, fenced.
    let fenced: InitProducerIdResponse = conn.call(
        ApiKey::InitProducerId,
        4,
        &idempotent_init()
            .with_producer_id(kafka_protocol::messages::ProducerId(pid))
            .with_producer_epoch(0),
    );
    assert_eq!(
        fenced.error_code,
        ResponseError::InvalidProducerEpoch.code()
    );

    let mut stored: Vec<String> = drain_over_http(&node, "epochs")
        .into_iter()
        .map(|(_, value)| value)
        .collect();
    stored.sort();
    assert_eq!(stored, ["a0", "a1", "b0", "b1", "c0"]);
}

#[test]
fn a_bad_frame_closes_its_connection_and_the_listener_serves_on() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = kafka_node(tmp.path());
    let addr = node.kafka_addr.clone().expect("kafka address");
    // A length over the limit: closed before the body is read.
    let mut conn = Conn::connect(&addr);
    conn.stream
        .write_all(&(1i32 << 30).to_be_bytes())
        .expect("send");
    assert!(conn.closed());
    // A negative length.
    let mut conn = Conn::connect(&addr);
    conn.stream.write_all(&(-5i32).to_be_bytes()).expect("send");
    assert!(conn.closed());
    // Too short for a header.
    let mut conn = Conn::connect(&addr);
    conn.stream
        .write_all(&[0, 0, 0, 3, 0, 18, 0])
        .expect("send");
    assert!(conn.closed());
    // An API that is not served (DeleteTopics), after a good request that
    // is still answered.
    let mut conn = Conn::connect(&addr);
    let sent = conn.send(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
    conn.send_raw(ApiKey::DeleteTopics, 4, &[0, 0, 0, 0]);
    let (got, _): (i32, ApiVersionsResponse) = conn.receive(ApiKey::ApiVersions, 3);
    assert_eq!(got, sent);
    assert!(conn.closed());
    // A Produce body that does not decode.
    let mut conn = Conn::connect(&addr);
    conn.send_raw(ApiKey::Produce, 9, &[1, 2, 3]);
    assert!(conn.closed());
    // The listener still serves.
    let mut conn = Conn::connect(&addr);
    let versions: ApiVersionsResponse =
        conn.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
    assert_eq!(versions.error_code, 0);
    assert!(node.stderr().lines().all(|l| !l.contains("panicked")));
}

#[test]
fn every_node_names_every_listener_and_each_partition_s_owner() {
    let cluster = Cluster::start_with(3, &KAFKA_LISTEN);
    cluster.wait_ready(Duration::from_secs(60));
    cluster.nodes[0].create_topic("spread", json!({"partitions": 6}));
    let owners = cluster.owners("spread");
    for node in &cluster.nodes {
        let addr = node.kafka_addr.clone().expect("kafka address");
        let mut seen = String::new();
        let named = eventually(Duration::from_secs(30), || {
            let mut conn = Conn::connect(&addr);
            let metadata: MetadataResponse = conn.call(
                ApiKey::Metadata,
                12,
                &MetadataRequest::default().with_topics(None),
            );
            let brokers: Vec<(i32, String)> = metadata
                .brokers
                .iter()
                .map(|b| (*b.node_id, format!("{}:{}", b.host.as_str(), b.port)))
                .collect();
            let expected: Vec<(i32, String)> = cluster
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (i as i32 + 1, n.kafka_addr.clone().expect("kafka")))
                .collect();
            let leaders: Vec<usize> = metadata
                .topics
                .first()
                .map(|t| {
                    let mut parts: Vec<_> = t.partitions.iter().collect();
                    parts.sort_by_key(|p| p.partition_index);
                    parts.iter().map(|p| *p.leader_id as usize - 1).collect()
                })
                .unwrap_or_default();
            seen = format!(
                "brokers {brokers:?} (want {expected:?}), leaders {leaders:?} (want {owners:?})"
            );
            brokers == expected && leaders == owners
        });
        assert!(
            named,
            "node {} names every listener and owner: {seen}",
            node.addr
        );
    }
    // The CLI shows each node's listener.
    let (ok, out, err) = support::narad(&cluster.nodes[1], &["cluster", "status"]);
    assert!(ok, "{err}");
    for node in &cluster.nodes {
        let kafka = node.kafka_addr.as_deref().expect("kafka");
        assert!(out.contains(kafka), "{kafka} in {out}");
    }
}

/// The Python that has the stock Kafka clients, or `None` (the test is
/// skipped, unless `NARAD_OPS_CHECKS=required`).
fn python_with_clients() -> Option<PathBuf> {
    let python = PathBuf::from("python3");
    let found = Command::new(&python)
        .args(["-c", "import confluent_kafka, kafka, aiokafka"])
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some(python);
    }
    assert!(
        std::env::var("NARAD_OPS_CHECKS").map_or(true, |v| v != "required"),
        "the Kafka clients are missing: run ops/install-check-tools.sh"
    );
    eprintln!("skipped: the Kafka clients are not installed (ops/install-check-tools.sh)");
    None
}

fn run_client(python: &Path, script: &str, args: &[&str]) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("kafka")
        .join(script);
    let output = support::run_to_exit(
        {
            let mut command = Command::new(python);
            command.arg(path).args(args);
            command
        },
        Duration::from_secs(120),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{script} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{script} printed no JSON line ({e}): {stdout}"))
}

#[test]
fn stock_kafka_producers_deliver_every_message_once() {
    let Some(python) = python_with_clients() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let node = kafka_node(tmp.path());
    let addr = node.kafka_addr.clone().expect("kafka address");
    // The topic made by librdkafka's admin client.
    let created = run_client(
        &python,
        "create_topic_confluent.py",
        &[&addr, "orders", "4"],
    );
    assert_eq!(created["created"], true, "{created}");
    let (_, topic) = node.request("GET", "/v1/topics/orders", b"");
    assert_eq!(
        (&topic["partitions"], &topic["retention_ms"]),
        (&json!(4), &json!(0))
    );
    let mut expected = Vec::new();
    // librdkafka (confluent-kafka), idempotent, acks=all, in each codec.
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let prefix = format!("rd-{codec}");
        let report = run_client(
            &python,
            "produce_confluent.py",
            &[&addr, "orders", &prefix, "2000", codec],
        );
        assert_eq!(report["delivered"], 2000, "{report}");
        assert_eq!(report["errors"], json!([]), "{report}");
        expected.extend(
            (0..2000).map(|i| (Some(format!("{prefix}-{i}")), format!("{prefix} value {i}"))),
        );
    }
    for (script, prefix) in [
        ("produce_kafka_python.py", "kp"),
        ("produce_aiokafka.py", "ai"),
    ] {
        let report = run_client(&python, script, &[&addr, "orders", prefix, "500"]);
        assert_eq!(report["delivered"], 500, "{report}");
        expected.extend(
            (0..500).map(|i| (Some(format!("{prefix}-{i}")), format!("{prefix} value {i}"))),
        );
    }
    let mut stored = drain_over_http(&node, "orders");
    stored.sort();
    expected.sort();
    assert_eq!(stored.len(), expected.len(), "each message stored once");
    assert!(stored == expected, "keys and values intact");
}

/// librdkafka's own epoch bump: records sent into a paused node time out
/// on the client, which bumps its epoch locally and numbers its next
/// records from sequence 0 again under the same producer id. Every record
/// it is told was stored must be delivered (they were all dropped as
/// copies of the first records when the key left the epoch out).
#[test]
fn a_stock_producer_s_records_after_its_local_epoch_bump_are_all_stored() {
    let Some(python) = python_with_clients() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let node = kafka_node(tmp.path());
    let addr = node.kafka_addr.clone().expect("kafka address");
    node.create_topic("paused", json!({"partitions": 2}));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kafka/produce_through_pause.py");
    let mut client = Command::new(&python)
        .arg(script)
        .args([&addr, "paused", "p", "2000", "200", "2000"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python");
    let mut stdin = client.stdin.take().expect("stdin");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(
        client.stdout.take().expect("stdout"),
    ));
    let mut next_line = |want: Option<&str>| -> String {
        let line = lines
            .next()
            .and_then(Result::ok)
            .unwrap_or_else(|| panic!("the producer stopped before {want:?}"));
        if let Some(want) = want {
            assert_eq!(line, want);
        }
        line
    };
    next_line(Some("paused?"));
    node.pause();
    // The records of the pause time out on the client (2 s) before the
    // producer says so.
    writeln!(stdin, "go").expect("stdin");
    next_line(Some("resumed?"));
    node.resume();
    writeln!(stdin, "go").expect("stdin");
    let report: Value = serde_json::from_str(&next_line(None)).expect("JSON report");
    let output = client.wait_with_output().expect("python");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        report["errors"]["during"].as_u64() > Some(0),
        "the pause timed records out: {report}"
    );
    let stored: Vec<String> = serde_json::from_value(report["stored"].clone()).expect("keys");
    let after = stored
        .iter()
        .filter(|k| k[2..].parse::<u32>().is_ok_and(|i| i >= 2200))
        .count();
    assert_eq!(
        after, 2000,
        "every record after the pause was stored: {}",
        report["epoch_logs"]
    );
    let delivered: std::collections::BTreeSet<String> = drain_over_http(&node, "paused")
        .into_iter()
        .filter_map(|(key, _)| key)
        .collect();
    let lost: Vec<&String> = stored.iter().filter(|k| !delivered.contains(*k)).collect();
    assert!(
        lost.is_empty(),
        "{} records reported stored were never delivered, e.g. {:?}; librdkafka: {}",
        lost.len(),
        &lost[..lost.len().min(5)],
        report["epoch_logs"]
    );
}

#[test]
fn a_listener_on_every_interface_needs_an_address_to_advertise() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut command = Command::new(env!("CARGO_BIN_EXE_narad"));
    command
        .args(["serve", "--data-dir"])
        .arg(tmp.path().join("node"))
        .args(["--listen", "127.0.0.1:0", "--kafka-listen", "0.0.0.0:0"]);
    let output = support::run_to_exit(command, Duration::from_secs(60));
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("kafka.listen") && said.contains("kafka.advertised_address"),
        "{said}"
    );
}

/// A few bytes that claim an array of two billion items (or a record with
/// two billion headers) are refused without making room for them: the
/// node does not run out of memory, and serves on.
#[test]
fn a_request_that_claims_a_huge_array_does_not_take_the_node_down() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = kafka_node(tmp.path());
    let addr = node.kafka_addr.clone().expect("kafka address");
    node.create_topic("orders", json!({"partitions": 1}));
    // Metadata v1: topics, an array of i32::MAX names, and no more bytes.
    let mut conn = Conn::connect(&addr);
    conn.send_raw(ApiKey::Metadata, 1, &i32::MAX.to_be_bytes());
    assert!(conn.closed());
    // Produce v3 whose topic array claims i32::MAX topics.
    let mut body = BytesMut::new();
    body.put_i16(-1); // transactional id: null
    body.put_i16(-1); // acks
    body.put_i32(30_000); // timeout
    body.put_i32(i32::MAX); // topics
    let mut conn = Conn::connect(&addr);
    conn.send_raw(ApiKey::Produce, 3, &body);
    assert!(conn.closed());
    // A record that claims i32::MAX headers (a varint), in a valid batch.
    let mut records = BytesMut::from(&batch(&[record(None, "v", -1, -1)])[..]);
    // The record's last byte is its header count (0); claim i32::MAX.
    let at = records.len() - 1;
    assert_eq!(records[at], 0);
    records.truncate(at);
    let zigzag = (u64::from(i32::MAX as u32) << 1) as u32;
    let mut value = zigzag;
    while value >= 0x80 {
        records.put_u8((value as u8) | 0x80);
        value >>= 7;
    }
    records.put_u8(value as u8);
    let grown = records.len() - at - 1;
    // Fix the batch and record lengths and the CRC around the longer count.
    let batch_len = i32::from_be_bytes(records[8..12].try_into().expect("len")) + grown as i32;
    records[8..12].copy_from_slice(&batch_len.to_be_bytes());
    let record_at = 61;
    assert_eq!(records[record_at] as usize % 2, 0);
    let record_len = (records[record_at] >> 1) as usize + grown;
    records[record_at] = (record_len << 1) as u8;
    let crc = crc32c::crc32c(&records[21..]);
    records[17..21].copy_from_slice(&crc.to_be_bytes());
    let mut conn = Conn::connect(&addr);
    let answer: ProduceResponse = conn.call(
        ApiKey::Produce,
        9,
        &produce_request("orders", 0, records.freeze(), -1),
    );
    assert_ne!(partition_error(&answer).0, 0);
    // The node never held much memory for them.
    let status = std::fs::read_to_string(format!("/proc/{}/status", node.pid())).expect("status");
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    assert!(
        peak_kib < 512 * 1024,
        "the node's peak memory: {peak_kib} KiB"
    );
    // The node still serves.
    let mut conn = Conn::connect(&addr);
    let versions: ApiVersionsResponse =
        conn.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
    assert_eq!(versions.error_code, 0);
}

#[test]
fn create_topics_makes_topics_with_the_settings_narad_knows() {
    use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
    use kafka_protocol::messages::{CreateTopicsRequest, CreateTopicsResponse};
    let tmp = tempfile::tempdir().expect("tmp");
    let node = kafka_node(tmp.path());
    let addr = node.kafka_addr.clone().expect("kafka address");
    let mut conn = Conn::connect(&addr);
    let topic = |name: &str, partitions: i32, replication: i16, configs: &[(&str, &str)]| {
        CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_string(name.to_string())))
            .with_num_partitions(partitions)
            .with_replication_factor(replication)
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        CreatableTopicConfig::default()
                            .with_name(StrBytes::from_string(k.to_string()))
                            .with_value(Some(StrBytes::from_string(v.to_string())))
                    })
                    .collect(),
            )
    };
    let request = CreateTopicsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(vec![
            topic(
                "made",
                3,
                -1,
                &[("retention.ms", "-1"), ("visibility_timeout_ms", "5000")],
            ),
            topic("kafkaish", -1, 1, &[("cleanup.policy", "compact")]),
            topic("copies", 2, 3, &[]),
        ]);
    let answer: CreateTopicsResponse = conn.call(ApiKey::CreateTopics, 7, &request);
    let codes: Vec<i16> = answer.topics.iter().map(|t| t.error_code).collect();
    assert_eq!(codes, vec![0, 40, 38], "{answer:?}");
    assert!(answer.topics[1]
        .error_message
        .as_ref()
        .is_some_and(|m| m.contains("cleanup.policy")));
    assert_eq!(answer.topics[0].num_partitions, 3);
    assert!(!answer.topics[0].topic_id.is_nil());
    let (status, made) = node.request("GET", "/v1/topics/made", b"");
    assert_eq!(status, 200);
    assert_eq!(
        (
            &made["partitions"],
            &made["retention_ms"],
            &made["visibility_timeout_ms"]
        ),
        (&json!(3), &json!(0), &json!(5000))
    );
    for name in ["kafkaish", "copies"] {
        assert_eq!(
            node.request("GET", &format!("/v1/topics/{name}"), b"").0,
            404
        );
    }
    // Again: it exists. Validating only creates nothing.
    let again: CreateTopicsResponse = conn.call(ApiKey::CreateTopics, 7, &request);
    assert_eq!(again.topics[0].error_code, 36, "TOPIC_ALREADY_EXISTS");
    let check: CreateTopicsResponse = conn.call(
        ApiKey::CreateTopics,
        5,
        &CreateTopicsRequest::default()
            .with_validate_only(true)
            .with_topics(vec![topic("checked", 4, 1, &[])]),
    );
    assert_eq!(
        (check.topics[0].error_code, check.topics[0].num_partitions),
        (0, 4)
    );
    assert_eq!(node.request("GET", "/v1/topics/checked", b"").0, 404);
}

/// Runs a client script in the background; its JSON line when it ends.
fn spawn_client(python: &Path, script: &str, args: &[&str]) -> std::thread::JoinHandle<Value> {
    let python = python.to_path_buf();
    let script = script.to_string();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    std::thread::spawn(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_client(&python, &script, &args)
    })
}

/// A share consumer's records: (key, value, delivery count, what it did).
fn seen_records(report: &Value) -> Vec<(String, String, u64, String)> {
    report
        .as_array()
        .expect("a list of records")
        .iter()
        .map(|r| {
            (
                r[0].as_str().expect("key").to_string(),
                r[1].as_str().expect("value").to_string(),
                r[2].as_u64().expect("delivery count"),
                r[3].as_str().expect("action").to_string(),
            )
        })
        .collect()
}

fn drained(node: &Node, topic: &str) -> bool {
    let (_, stats) = node.request("GET", &format!("/v1/topics/{topic}"), b"");
    stats["partition_stats"].as_array().is_some_and(|parts| {
        parts
            .iter()
            .all(|p| p["available"] == 0 && p["in_flight"] == 0)
    })
}

#[test]
fn two_share_consumers_accept_every_message_a_kafka_producer_sent() {
    let Some(python) = python_with_clients() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(
        &tmp.path().join("node"),
        &["--kafka-listen", "127.0.0.1:0", "--shards", "2"],
    );
    let addr = node.kafka_addr.clone().expect("kafka address");
    node.create_topic("jobs", json!({"partitions": 4}));
    let sent = run_client(
        &python,
        "produce_confluent.py",
        &[&addr, "jobs", "job", "10000", "lz4"],
    );
    assert_eq!(sent["delivered"], 10000, "{sent}");
    let consumers: Vec<_> = (0..2)
        .map(|_| {
            spawn_client(
                &python,
                "share_consume.py",
                &[&addr, "jobs", "workers", "--idle", "6", "--seconds", "100"],
            )
        })
        .collect();
    let mut accepted: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut per_consumer = Vec::new();
    for consumer in consumers {
        let records = seen_records(&consumer.join().expect("consumer"));
        per_consumer.push(records.len());
        for (key, value, count, action) in records {
            assert_eq!(value, format!("{} value {}", "job", &key["job-".len()..]));
            assert_eq!(action, "accept");
            accepted.entry(key).or_default().push(count);
        }
    }
    assert_eq!(
        accepted.len(),
        10000,
        "every message accepted ({per_consumer:?})"
    );
    // Accepted twice only when a lock ended before the first accept.
    for (key, counts) in &accepted {
        assert!(
            counts.len() == 1 || counts.iter().any(|c| *c > 1),
            "{key} accepted twice within one lock: {counts:?}"
        );
    }
    assert!(
        per_consumer.iter().all(|n| *n > 0),
        "both consumers took records: {per_consumer:?}"
    );
    assert!(drained(&node, "jobs"), "nothing left unacked");
}

#[test]
fn released_records_come_again_rejected_ones_are_dead_lettered_and_a_vanished_consumer_s_return() {
    let Some(python) = python_with_clients() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let node = kafka_node(tmp.path());
    let addr = node.kafka_addr.clone().expect("kafka address");
    node.create_topic("dead", json!({"partitions": 1}));
    node.create_topic(
        "work",
        json!({"partitions": 2, "dead_letter_topic": "dead", "visibility_timeout_ms": 3000}),
    );
    // Produced over HTTP, consumed over Kafka.
    let produce = |from: usize, to: usize| {
        let items: Vec<Value> = (from..to)
            .map(|i| json!({"key": format!("k{i}"), "value": format!("value {i}")}))
            .collect();
        let (status, answer) = node.json(
            "POST",
            "/v1/topics/work/messages/batch",
            json!({ "messages": items }),
        );
        assert_eq!(status, 202, "{answer}");
    };
    produce(0, 60);
    let report = run_client(
        &python,
        "share_consume.py",
        &[
            &addr,
            "work",
            "g",
            "--release-every",
            "6",
            "--reject-every",
            "5",
            "--idle",
            "4",
        ],
    );
    let records = seen_records(&report);
    for (key, value, _, _) in &records {
        assert_eq!(
            value,
            &format!("value {}", &key[1..]),
            "key and value intact"
        );
    }
    let released: Vec<&String> = records
        .iter()
        .filter(|r| r.3 == "release")
        .map(|r| &r.0)
        .collect();
    let rejected: std::collections::BTreeSet<String> = records
        .iter()
        .filter(|r| r.3 == "reject")
        .map(|r| r.0.clone())
        .collect();
    assert!(!released.is_empty() && !rejected.is_empty());
    for key in &released {
        assert!(
            records
                .iter()
                .any(|r| &&r.0 == key && r.2 == 2 && r.3 == "accept"),
            "{key} came again with delivery count 2"
        );
    }
    let settled: std::collections::BTreeSet<&String> = records
        .iter()
        .filter(|r| r.3 != "release")
        .map(|r| &r.0)
        .collect();
    assert_eq!(settled.len(), 60, "every record accepted or rejected");
    assert!(drained(&node, "work"));
    let dead: std::collections::BTreeSet<String> = drain_over_http(&node, "dead")
        .into_iter()
        .map(|(key, value)| {
            let key = key.expect("a key");
            assert_eq!(value, format!("value {}", &key[1..]));
            key
        })
        .collect();
    assert_eq!(
        dead, rejected,
        "the rejected records, in the dead-letter topic"
    );

    // A consumer that vanishes holding records: they come to the next one
    // once their lock (the topic's visibility timeout) ends. This one
    // leaves acknowledging to the client (implicit mode).
    produce(60, 70);
    let vanished = seen_records(&run_client(
        &python,
        "share_consume.py",
        &[
            &addr,
            "work",
            "g",
            "--vanish-after",
            "10",
            "--seconds",
            "30",
        ],
    ));
    assert_eq!(vanished.len(), 10);
    let next = seen_records(&run_client(
        &python,
        "share_consume.py",
        &[
            &addr,
            "work",
            "g",
            "--mode",
            "implicit",
            "--count",
            "10",
            "--seconds",
            "60",
        ],
    ));
    let mut keys: Vec<&String> = next.iter().map(|r| &r.0).collect();
    keys.sort();
    let mut expected: Vec<&String> = vanished.iter().map(|r| &r.0).collect();
    expected.sort();
    assert_eq!(keys, expected);
    assert!(next.iter().all(|r| r.2 == 2), "delivered again: {next:?}");
    assert!(
        eventually(Duration::from_secs(30), || drained(&node, "work")),
        "implicit acknowledgements settled them"
    );
}

#[test]
fn share_sessions_answer_wrong_epochs_and_late_acknowledgements_with_their_errors() {
    use kafka_protocol::messages::share_fetch_request::{
        AcknowledgementBatch, FetchPartition, FetchTopic,
    };
    use kafka_protocol::messages::{
        GroupId, ShareFetchRequest, ShareFetchResponse, ShareGroupHeartbeatRequest,
        ShareGroupHeartbeatResponse,
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let node = kafka_node(tmp.path());
    let addr = node.kafka_addr.clone().expect("kafka address");
    node.create_topic("locks-dead", json!({"partitions": 1}));
    node.create_topic(
        "locks",
        json!({"partitions": 1, "visibility_timeout_ms": 1000, "dead_letter_topic": "locks-dead"}),
    );
    let id = node.produce("locks", "one");
    let mut conn = Conn::connect(&addr);
    let group = || Some(GroupId(StrBytes::from_static_str("g")));
    let member = || Some(StrBytes::from_static_str("member-1"));

    // Heartbeats: a join gets epoch 1 and every partition; an unknown
    // member and a stale epoch get their errors, on a connection that stays.
    let joined: ShareGroupHeartbeatResponse = conn.call(
        ApiKey::ShareGroupHeartbeat,
        1,
        &ShareGroupHeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_member_id(StrBytes::from_static_str("member-1"))
            .with_member_epoch(0)
            .with_subscribed_topic_names(Some(vec![TopicName(StrBytes::from_static_str("locks"))])),
    );
    assert_eq!((joined.error_code, joined.member_epoch), (0, 1));
    let assignment = joined.assignment.expect("an assignment");
    assert_eq!(assignment.topic_partitions[0].partitions, vec![0]);
    let topic_id = assignment.topic_partitions[0].topic_id;
    let stale: ShareGroupHeartbeatResponse = conn.call(
        ApiKey::ShareGroupHeartbeat,
        1,
        &ShareGroupHeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_member_id(StrBytes::from_static_str("member-1"))
            .with_member_epoch(7)
            .with_subscribed_topic_names(None),
    );
    assert_eq!(stale.error_code, 110, "FENCED_MEMBER_EPOCH");
    let unknown: ShareGroupHeartbeatResponse = conn.call(
        ApiKey::ShareGroupHeartbeat,
        1,
        &ShareGroupHeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_member_id(StrBytes::from_static_str("stranger"))
            .with_member_epoch(3)
            .with_subscribed_topic_names(None),
    );
    assert_eq!(unknown.error_code, 25, "UNKNOWN_MEMBER_ID");

    let fetch = |epoch: i32, ack: Option<(i64, i8)>| {
        let partition = FetchPartition::default()
            .with_partition_index(0)
            .with_acknowledgement_batches(
                ack.map(|(offset, kind)| {
                    vec![AcknowledgementBatch::default()
                        .with_first_offset(offset)
                        .with_last_offset(offset)
                        .with_acknowledge_types(vec![kind])]
                })
                .unwrap_or_default(),
            );
        ShareFetchRequest::default()
            .with_group_id(group())
            .with_member_id(member())
            .with_share_session_epoch(epoch)
            .with_max_wait_ms(2000)
            .with_max_records(10)
            .with_topics(vec![FetchTopic::default()
                .with_topic_id(topic_id)
                .with_partitions(vec![partition])])
    };
    // A session that was never opened, then a wrong epoch.
    let none: ShareFetchResponse = conn.call(ApiKey::ShareFetch, 1, &fetch(3, None));
    assert_eq!(none.error_code, 122, "SHARE_SESSION_NOT_FOUND");
    let opened: ShareFetchResponse = conn.call(ApiKey::ShareFetch, 1, &fetch(0, None));
    assert_eq!(opened.error_code, 0);
    assert_eq!(opened.acquisition_lock_timeout_ms, 1000);
    let partition = &opened.responses[0].partitions[0];
    assert_eq!(partition.acquired_records.len(), 1);
    let acquired = &partition.acquired_records[0];
    assert_eq!(acquired.delivery_count, 1);
    let skipped: ShareFetchResponse = conn.call(ApiKey::ShareFetch, 1, &fetch(5, None));
    assert_eq!(skipped.error_code, 123, "INVALID_SHARE_SESSION_EPOCH");

    // The lock ends (the message is available again); a late REJECT is
    // INVALID_RECORD_STATE and writes nothing to the dead-letter topic,
    // and the record comes again with count 2.
    assert!(eventually(Duration::from_secs(10), || {
        let (_, stats) = node.request("GET", "/v1/topics/locks", b"");
        stats["partition_stats"][0]["in_flight"] == 0
    }));
    let late: ShareFetchResponse = conn.call(
        ApiKey::ShareFetch,
        1,
        &fetch(1, Some((acquired.first_offset, 3))),
    );
    assert_eq!(late.error_code, 0);
    let partition = &late.responses[0].partitions[0];
    assert_eq!(
        partition.acknowledge_error_code, 121,
        "INVALID_RECORD_STATE"
    );
    assert_eq!(partition.acquired_records[0].delivery_count, 2);
    let (_, dead) = node.request("GET", "/v1/topics/locks-dead", b"");
    assert_eq!(
        dead["partition_stats"][0]["available"], 0,
        "a lapsed lock's REJECT wrote a copy: {dead}"
    );
    // A late ACCEPT is refused the same way.
    assert!(eventually(Duration::from_secs(10), || {
        let (_, stats) = node.request("GET", "/v1/topics/locks", b"");
        stats["partition_stats"][0]["in_flight"] == 0
    }));
    let late: ShareFetchResponse = conn.call(
        ApiKey::ShareFetch,
        1,
        &fetch(2, Some((acquired.first_offset, 1))),
    );
    let partition = &late.responses[0].partitions[0];
    assert_eq!(partition.acknowledge_error_code, 121);
    assert_eq!(partition.acquired_records[0].delivery_count, 3);
    // Rejected within its lock, it is gone, and its copy in the
    // dead-letter topic has the record's own id.
    let rejected: ShareFetchResponse = conn.call(
        ApiKey::ShareFetch,
        1,
        &fetch(3, Some((partition.acquired_records[0].first_offset, 3))).with_max_wait_ms(0),
    );
    assert_eq!(rejected.error_code, 0);
    assert!(rejected
        .responses
        .iter()
        .all(|t| t.partitions.iter().all(|p| p.acknowledge_error_code == 0)));
    assert!(drained(&node, "locks"));
    let copies = node.consume("locks-dead", json!({"max_messages": 10, "wait_ms": 2000}));
    let copied: Vec<(&str, &str)> = copies
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap_or(""),
                m["value"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(copied, vec![(id.as_str(), "one")]);
    // A range of every offset there could be is answered (the node walks a
    // bounded number of them), on the same connection.
    let everything: ShareFetchResponse = conn.call(
        ApiKey::ShareFetch,
        1,
        &fetch(4, Some((0, 1)))
            .with_max_wait_ms(0)
            .with_topics(vec![FetchTopic::default()
                .with_topic_id(topic_id)
                .with_partitions(vec![FetchPartition::default()
                    .with_partition_index(0)
                    .with_acknowledgement_batches(vec![
                        AcknowledgementBatch::default()
                            .with_first_offset(0)
                            .with_last_offset(i64::MAX)
                            .with_acknowledge_types(vec![1]),
                    ])])]),
    );
    assert_eq!(everything.error_code, 0);
}

/// Three nodes with default settings: a Kafka producer bootstrapped at
/// two, share consumers on two, and the third node SIGKILLed mid-run
/// (then started again). The producer's delivery reports keep coming for
/// every partition (long before the dead node is marked dead, the others
/// name themselves leaders of its partitions), and every message the
/// producer was told was stored is accepted by a consumer.
#[test]
fn a_node_killed_mid_run_loses_nothing_a_kafka_producer_was_told_was_stored() {
    let Some(python) = python_with_clients() else {
        return;
    };
    let mut cluster = Cluster::start_with(3, &["--kafka-listen", "127.0.0.1:0"]);
    cluster.wait_ready(Duration::from_secs(60));
    cluster.nodes[0].create_topic(
        "orders",
        json!({"partitions": 6, "visibility_timeout_ms": 5000}),
    );
    let kafka: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| n.kafka_addr.clone().expect("kafka address"))
        .collect();
    let consumers: Vec<_> = [1, 2]
        .iter()
        .map(|i| {
            spawn_client(
                &python,
                "share_consume.py",
                &[
                    &kafka[*i],
                    "orders",
                    "billing",
                    "--idle",
                    "20",
                    "--seconds",
                    "110",
                ],
            )
        })
        .collect();
    let bootstrap = format!("{},{}", kafka[0], kafka[1]);
    let producer = spawn_client(
        &python,
        "produce_confluent.py",
        &[&bootstrap, "orders", "order", "9000", "none", "600"],
    );
    let held = |node: &Node| -> u64 {
        let (_, topic) = node.request("GET", "/v1/topics/orders", b"");
        topic["partition_stats"].as_array().map_or(0, |parts| {
            parts
                .iter()
                .filter_map(|p| p["high_watermark"].as_u64())
                .sum()
        })
    };
    assert!(
        eventually(Duration::from_secs(30), || held(&cluster.nodes[0]) >= 600),
        "the producer is under way"
    );
    cluster.nodes[2].kill();
    let sent = producer.join().expect("producer");
    cluster.nodes[2].restart();
    let told_stored: std::collections::BTreeSet<String> = sent["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| k.as_str().expect("key").to_string())
        .collect();
    assert!(told_stored.len() > 600, "{}", sent["errors"]);
    // The contract's reroute time (3 s), a probe and a metadata refresh.
    let gap = sent["longest_gap_s"].as_f64().expect("longest gap");
    eprintln!("longest gap between delivery reports of a partition: {gap} s");
    assert!(
        gap < KAFKA_REPORT_GAP_MAX_S,
        "a partition got no delivery report for {gap} s across the kill"
    );
    let mut accepted = std::collections::BTreeSet::new();
    for consumer in consumers {
        for (key, _, _, action) in seen_records(&consumer.join().expect("consumer")) {
            if action == "accept" {
                accepted.insert(key);
            }
        }
    }
    // What the consumers missed (the killed node's sessions went with it)
    // is still in the topic: take it over HTTP.
    for (key, _) in drain_over_http(&cluster.nodes[0], "orders") {
        accepted.insert(key.expect("a key"));
    }
    let lost: Vec<&String> = told_stored.difference(&accepted).collect();
    assert!(
        lost.is_empty(),
        "{} lost: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
}

/// `sasl_client.py` (librdkafka over SASL_SSL, PLAIN) against one node.
struct SaslClient<'a> {
    python: &'a Path,
    node: &'a Node,
    ca: &'a support::tls::TestCa,
}

impl SaslClient<'_> {
    /// Runs the client in `mode` as `user` with `password`.
    fn run(&self, mode: &str, user: &str, password: &str, topic: &str, count: usize) -> Value {
        let addr = self.node.kafka_addr.clone().expect("kafka address");
        let ca_file = support::tls::path(&self.ca.cert_file);
        let count = count.to_string();
        run_client(
            self.python,
            "sasl_client.py",
            &[
                mode,
                addr.as_str(),
                ca_file.as_str(),
                user,
                password,
                topic,
                count.as_str(),
            ],
        )
    }
}

fn errors_of(report: &Value) -> String {
    report["errors"].to_string()
}

/// With `auth.enabled` the listener takes TLS and SASL PLAIN only: stock
/// clients get in with a user's password or with a token, a wrong password
/// is refused, and grants hold as over HTTP (produce, consume for a share
/// consumer, admin to create a topic, and Metadata shows only the topics a
/// user holds a grant on). Plain Kafka on the port, and a request before
/// authenticating, get the connection closed.
#[test]
fn with_auth_the_listener_takes_sasl_plain_over_tls_and_grants_hold() {
    let tmp = tempfile::tempdir().expect("tmp");
    let ca = support::tls::TestCa::new(tmp.path(), "kafka");
    let server = ca.issue("kafka-server", &["127.0.0.1", "localhost"]);
    let cert = format!(
        "kafka.tls.cert_file={}",
        support::tls::path(&server.cert_file)
    );
    let key = format!(
        "kafka.tls.key_file={}",
        support::tls::path(&server.key_file)
    );
    let node = Node::start(
        &tmp.path().join("node"),
        &[
            KAFKA_LISTEN[0],
            KAFKA_LISTEN[1],
            "--set",
            "auth.enabled=true",
            "--set",
            "auth.admin_password=admin-pw",
            "--set",
            &cert,
            "--set",
            &key,
        ],
    );
    let admin = |method: &str, path: &str, body: Value| {
        let auth = format!(
            "Basic {}",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, "admin:admin-pw")
        );
        node.request_with(
            method,
            path,
            &[("Authorization", auth.as_str())],
            body.to_string().as_bytes(),
        )
    };
    assert!(
        eventually(Duration::from_secs(20), || admin(
            "GET",
            "/v1/topics",
            json!({})
        )
        .0 == 200),
        "the user admin is bootstrapped"
    );
    let (status, answer) = admin("PUT", "/v1/topics/orders", json!({"partitions": 2}));
    assert!(status == 201 || status == 200, "{status} {answer}");
    let mut token = String::new();
    for (user, actions) in [
        ("writer", json!(["produce"])),
        ("reader", json!(["consume"])),
        ("nobody", json!([])),
    ] {
        let (status, answer) = admin(
            "PUT",
            &format!("/v1/users/{user}"),
            json!({"password": format!("{user}-pw")}),
        );
        assert!(status == 201 || status == 200, "{status} {answer}");
        let grants = if user == "nobody" {
            json!([])
        } else {
            json!([{"topic": "orders", "actions": actions}])
        };
        let (status, answer) = admin(
            "PUT",
            &format!("/v1/users/{user}/grants"),
            json!({ "grants": grants }),
        );
        assert_eq!(status, 200, "{answer}");
        if user == "writer" {
            let (status, answer) = admin("POST", "/v1/users/writer/tokens", json!({}));
            assert_eq!(status, 201, "{answer}");
            token = answer["token"].as_str().expect("token").to_string();
        }
    }

    // Raw: plain Kafka on a TLS listener, and a request before SASL, are
    // closed; a wrong password is answered with why, then closed.
    let mut plain = Conn::connect(&node.kafka_addr.clone().expect("kafka address"));
    plain.send(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
    assert!(plain.closed(), "plain Kafka on a TLS listener");
    let mut early = Conn::connect_tls(
        &node.kafka_addr.clone().expect("kafka address"),
        &ca.cert_file,
    );
    let versions: ApiVersionsResponse =
        early.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
    assert!(versions
        .api_keys
        .iter()
        .any(|k| k.api_key == ApiKey::SaslAuthenticate as i16));
    early.send(ApiKey::Metadata, 12, &MetadataRequest::default());
    assert!(early.closed(), "Metadata before SASL");
    let mut wrong = Conn::connect_tls(
        &node.kafka_addr.clone().expect("kafka address"),
        &ca.cert_file,
    );
    let handshake: SaslHandshakeResponse = wrong.call(
        ApiKey::SaslHandshake,
        1,
        &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
    );
    assert_eq!(handshake.error_code, 0);
    let refused: SaslAuthenticateResponse = wrong.call(
        ApiKey::SaslAuthenticate,
        2,
        &SaslAuthenticateRequest::default()
            .with_auth_bytes(Bytes::from_static(b"\0writer\0not-the-password")),
    );
    assert_eq!(
        refused.error_code,
        ResponseError::SaslAuthenticationFailed.code()
    );
    assert!(refused
        .error_message
        .as_ref()
        .is_some_and(|m| m.contains("wrong user name or password")));
    assert!(wrong.closed(), "closed after a failed authentication");
    // A connection signed in with `plain` (SASL PLAIN's message).
    let signed_in = |plain: &[u8]| {
        let mut conn = Conn::connect_tls(
            &node.kafka_addr.clone().expect("kafka address"),
            &ca.cert_file,
        );
        let _: SaslHandshakeResponse = conn.call(
            ApiKey::SaslHandshake,
            1,
            &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
        );
        let accepted: SaslAuthenticateResponse = conn.call(
            ApiKey::SaslAuthenticate,
            2,
            &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::copy_from_slice(plain)),
        );
        assert_eq!(accepted.error_code, 0, "{:?}", accepted.error_message);
        let _: MetadataResponse = conn.call(ApiKey::Metadata, 12, &MetadataRequest::default());
        conn
    };
    // Metadata lists only the topics a user holds a grant on.
    let mut seeing = signed_in(b"\0nobody\0nobody-pw");
    let listed: MetadataResponse = seeing.call(ApiKey::Metadata, 12, &MetadataRequest::default());
    assert!(listed.topics.is_empty(), "nobody sees no topic: {listed:?}");
    let named: MetadataResponse = seeing.call(
        ApiKey::Metadata,
        12,
        &MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default()
            .with_name(Some(TopicName(StrBytes::from_static_str("orders"))))])),
    );
    assert_eq!(
        named.topics[0].error_code,
        ResponseError::TopicAuthorizationFailed.code()
    );

    // Revoked credentials end the connections they signed in: a deleted
    // user's at its next request, a changed password's too, and a revoked
    // token's while the connection sends nothing.
    let (status, answer) = admin("DELETE", "/v1/users/nobody", json!({}));
    assert_eq!(status, 204, "{answer}");
    seeing.send(ApiKey::Metadata, 12, &MetadataRequest::default());
    assert!(seeing.closed(), "a deleted user's connection goes on");
    let mut by_password = signed_in(b"\0reader\0reader-pw");
    let (status, answer) = admin("PUT", "/v1/users/reader", json!({"password": "reader-pw"}));
    assert_eq!(status, 200, "{answer}");
    by_password.send(ApiKey::Metadata, 12, &MetadataRequest::default());
    assert!(
        by_password.closed(),
        "a changed password's connection goes on"
    );
    let (status, answer) = admin("POST", "/v1/users/reader/tokens", json!({}));
    assert_eq!(status, 201, "{answer}");
    let second = answer["token"].as_str().expect("token").to_string();
    let id = second
        .strip_prefix("nrd_")
        .and_then(|t| t.split_once('_'))
        .map(|(id, _)| id.to_string())
        .expect("a token's id");
    let mut by_token = signed_in(format!("\0token\0{second}").as_bytes());
    let (status, answer) = admin(
        "DELETE",
        &format!("/v1/users/reader/tokens/{id}"),
        json!({}),
    );
    assert_eq!(status, 204, "{answer}");
    let revoked = std::time::Instant::now();
    assert!(by_token.closed(), "a revoked token's idle connection stays");
    assert!(
        revoked.elapsed() < Duration::from_secs(10),
        "closed {:?} after the revocation",
        revoked.elapsed()
    );

    let Some(python) = python_with_clients() else {
        return;
    };
    let client = SaslClient {
        python: &python,
        node: &node,
        ca: &ca,
    };
    // Stock clients: a user's password and a token get in; grants hold.
    let written = client.run("produce", "writer", "writer-pw", "orders", 20);
    assert_eq!(written["delivered"], 20, "{written}");
    let by_token = client.run("produce", "token", &token, "orders", 5);
    assert_eq!(by_token["delivered"], 5, "{by_token}");
    let wrong = client.run("produce", "writer", "nope", "orders", 1);
    assert_eq!(wrong["delivered"], 0, "{wrong}");
    assert!(
        errors_of(&wrong).contains("wrong user name or password"),
        "{wrong}"
    );
    let ungranted = client.run("produce", "reader", "reader-pw", "orders", 1);
    assert_eq!(ungranted["delivered"], 0, "{ungranted}");
    assert!(
        errors_of(&ungranted).to_lowercase().contains("authoriz"),
        "{ungranted}"
    );
    let created = client.run("create", "writer", "writer-pw", "fresh", 0);
    assert_eq!(created["created"], false, "{created}");
    assert!(errors_of(&created).contains("admin"), "{created}");
    let created = client.run("create", "admin", "admin-pw", "fresh", 0);
    assert_eq!(created["created"], true, "{created}");
    let unseen = client.run("share", "writer", "writer-pw", "orders", 25);
    assert_eq!(unseen["seen"], 0, "{unseen}");
    assert!(errors_of(&unseen).contains("consume grant"), "{unseen}");
    let taken = client.run("share", "reader", "reader-pw", "orders", 25);
    assert_eq!(taken["seen"], 25, "{taken}");
}
