//! The wire form of operations between nodes: a version byte, then the
//! operation in rkyv. An answer is a version byte, a status byte (the
//! operation's reply follows, or the node refused it before any shard saw
//! it), then that in rkyv. Message keys and values travel as bytes.

use futures_channel::oneshot;
use narad_net::{ApiError, ErrorCode};
use narad_raft::node::BoxFuture;
use rkyv::api::high::{HighSerializer, HighValidator};
use rkyv::bytecheck::CheckBytes;
use rkyv::de::Pool;
use rkyv::rancor::{Error as RkyvError, Strategy};
use rkyv::ser::allocator::ArenaHandle;
use rkyv::util::AlignedVec;

use super::ops::{
    Available, Browse, Collect, Commit, Envelope, Gained, Gauges, KeyedCommit, MoveSource,
    Operation, Produce, Ready, Search, Settle, Stats, TopicRates, Wake,
};

/// The version of this form. A node refuses a request of another version
/// with a clear error rather than misreading it.
pub const WIRE_VERSION: u8 = 1;

/// Request kinds between nodes (the metastore uses 1 to 15; 16 to 20 were
/// the unversioned data plane of earlier releases, which a node of this
/// one refuses as unknown kinds rather than misreading them).
pub const KIND_COMMIT: u8 = 32;
pub const KIND_COLLECT: u8 = 33;
pub const KIND_SETTLE: u8 = 34;
pub const KIND_STATS: u8 = 35;
pub const KIND_AVAILABLE: u8 = 36;
pub const KIND_GAUGES: u8 = 37;
pub const KIND_MOVE_SOURCE: u8 = 38;
pub const KIND_WAKE: u8 = 39;
/// Sent between shards of one node only; another node's is refused.
pub const KIND_PRODUCE: u8 = 40;
/// Named topics gained messages at another node (a node of an earlier
/// release refuses it; the sender then falls back to `KIND_AVAILABLE`).
pub const KIND_GAINED: u8 = 41;
/// A commit whose records carry idempotency keys (a node of an earlier
/// release refuses it; the sender then falls back to `KIND_COMMIT`).
pub const KIND_KEYED_COMMIT: u8 = 42;
/// A page of a partition, leasing nothing (a node of an earlier release
/// refuses it: the browse answers that the owner did not).
pub const KIND_BROWSE: u8 = 43;
/// A search of partitions, changing nothing (refused by an earlier release
/// as [`KIND_BROWSE`] is).
pub const KIND_SEARCH: u8 = 44;
/// A topic's recent rates (an earlier release refuses it: that node's
/// partitions are left out, as for figures).
pub const KIND_RATES: u8 = 45;
/// Whether the node is ready, as its `/readyz` would answer (an earlier
/// release refuses it: `GET /v1/cluster` shows that refusal as the node's
/// reason).
pub const KIND_READY: u8 = 46;

/// Whether `kind` is an operation of the data plane.
pub fn is_operation_kind(kind: u8) -> bool {
    (KIND_COMMIT..=KIND_READY).contains(&kind)
}

const ANSWERED: u8 = 0;
const REFUSED: u8 = 1;

/// A type that travels in rkyv.
pub trait Wire: Sized {
    fn archive(&self) -> Result<AlignedVec, String>;
    fn unarchive(bytes: &[u8]) -> Result<Self, String>;
}

impl<T> Wire for T
where
    T: rkyv::Archive
        + for<'a> rkyv::Serialize<HighSerializer<AlignedVec, ArenaHandle<'a>, RkyvError>>,
    T::Archived: for<'a> CheckBytes<HighValidator<'a, RkyvError>>
        + rkyv::Deserialize<T, Strategy<Pool, RkyvError>>,
{
    fn archive(&self) -> Result<AlignedVec, String> {
        rkyv::to_bytes::<RkyvError>(self).map_err(|e| format!("encoding: {e}"))
    }

    fn unarchive(bytes: &[u8]) -> Result<Self, String> {
        // What QUIC hands over has no alignment guarantee.
        let mut aligned = AlignedVec::<16>::with_capacity(bytes.len());
        aligned.extend_from_slice(bytes);
        rkyv::from_bytes::<T, RkyvError>(&aligned).map_err(|e| format!("malformed: {e}"))
    }
}

fn framed(head: &[u8], body: &AlignedVec) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(head.len() + body.len());
    bytes.extend_from_slice(head);
    bytes.extend_from_slice(body);
    bytes
}

fn versioned(bytes: &[u8]) -> Result<&[u8], String> {
    match bytes.split_first() {
        Some((&WIRE_VERSION, rest)) => Ok(rest),
        Some((version, _)) => Err(format!(
            "wire version {version}; this node speaks version {WIRE_VERSION}"
        )),
        None => Err("an empty message".to_string()),
    }
}

pub fn encode_request<O: Operation>(op: &O) -> Result<Vec<u8>, String> {
    Ok(framed(&[WIRE_VERSION], &op.archive()?))
}

pub fn decode_request<O: Operation>(bytes: &[u8]) -> Result<O, String> {
    O::unarchive(versioned(bytes)?).map_err(|e| format!("a request of kind {}: {e}", O::KIND))
}

pub fn encode_answer<T: Wire>(reply: &T) -> Result<Vec<u8>, String> {
    Ok(framed(&[WIRE_VERSION, ANSWERED], &reply.archive()?))
}

/// The answer of a node that refused a request before any shard saw it.
pub fn encode_refusal(error: &ApiError) -> Result<Vec<u8>, String> {
    Ok(framed(&[WIRE_VERSION, REFUSED], &error.archive()?))
}

/// The reply, or the error the node refused the request with.
pub fn decode_answer<T: Wire>(bytes: &[u8]) -> Result<Result<T, ApiError>, String> {
    match versioned(bytes)?.split_first() {
        Some((&ANSWERED, body)) => T::unarchive(body).map(Ok),
        Some((&REFUSED, body)) => ApiError::unarchive(body).map(Err),
        _ => Err("an answer without a known status".to_string()),
    }
}

/// The reply of a request that arrived as bytes, encoded once a shard
/// answered it.
pub type EncodedReply = BoxFuture<Result<Vec<u8>, String>>;

/// Decodes a request of another node: the envelope to hand a shard, and
/// the future that encodes its reply.
pub fn open(kind: u8, payload: &[u8]) -> Result<(Envelope, EncodedReply), String> {
    match kind {
        KIND_COMMIT => open_as::<Commit>(payload),
        KIND_COLLECT => open_as::<Collect>(payload),
        KIND_SETTLE => open_as::<Settle>(payload),
        KIND_STATS => open_as::<Stats>(payload),
        KIND_AVAILABLE => open_as::<Available>(payload),
        KIND_GAUGES => open_as::<Gauges>(payload),
        KIND_MOVE_SOURCE => open_as::<MoveSource>(payload),
        KIND_WAKE => open_as::<Wake>(payload),
        KIND_PRODUCE => open_as::<Produce>(payload),
        KIND_GAINED => open_as::<Gained>(payload),
        KIND_KEYED_COMMIT => open_as::<KeyedCommit>(payload),
        KIND_BROWSE => open_as::<Browse>(payload),
        KIND_SEARCH => open_as::<Search>(payload),
        KIND_RATES => open_as::<TopicRates>(payload),
        KIND_READY => open_as::<Ready>(payload),
        other => Err(format!("no operation of kind {other}")),
    }
}

fn open_as<O: Operation>(payload: &[u8]) -> Result<(Envelope, EncodedReply), String> {
    let op = decode_request::<O>(payload)?;
    let (reply, answer) = oneshot::channel();
    let encoded: EncodedReply = Box::pin(async move {
        match answer.await {
            Ok(reply) => encode_answer(&reply),
            // The shard went away with the request (it stopped).
            Err(_) => encode_refusal(&ApiError::new(
                ErrorCode::Stopping,
                "the shard stopped before answering",
            )),
        }
    });
    Ok((op.wrap(reply), encoded))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use narad_net::types::SettleAction;

    use super::*;
    use crate::rpc::{Record, Settled, TopicRef};

    fn commit() -> Commit {
        Commit {
            topic: TopicRef {
                name: "orders".into(),
                incarnation: 3,
            },
            partition: 7,
            messages: vec![Record {
                id: u128::MAX - 5,
                produced_at_ms: 42,
                key: Some(b"k".to_vec()),
                value: Bytes::from_static(&[0, 1, 2, 255]),
            }],
        }
    }

    /// A keyed commit travels with its keys, and its messages carry them;
    /// the plain commit inside it is what a node of an earlier release
    /// takes.
    #[test]
    fn a_keyed_commit_round_trips_and_gives_each_message_its_key() {
        let mut plain = commit();
        plain.messages.push(plain.messages[0].clone());
        let keyed = crate::rpc::KeyedCommit {
            commit: plain.clone(),
            keys: vec![crate::rpc::KeyAt {
                index: 1,
                key: Bytes::from_static(b"order-7"),
            }],
        };
        let bytes = encode_request(&keyed).expect("encode");
        let round = decode_request::<crate::rpc::KeyedCommit>(&bytes).expect("decode");
        assert_eq!(round, keyed);
        assert!(open(KIND_KEYED_COMMIT, &bytes).is_ok());
        assert!(!is_operation_kind(KIND_READY + 1));
        let messages = round.into_messages();
        assert_eq!(messages[0].idempotency_key, None);
        assert_eq!(
            messages[1].idempotency_key.as_deref(),
            Some(&b"order-7"[..])
        );
        assert_eq!(messages[1].value, plain.messages[1].value);
    }

    #[test]
    fn operations_and_replies_round_trip_with_bytes_and_error_codes_intact() {
        let bytes = encode_request(&commit()).expect("encode");
        // What QUIC hands over has no alignment guarantee.
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&bytes);
        assert_eq!(
            decode_request::<Commit>(&shifted[1..]).expect("decode"),
            commit()
        );

        let reply: Settled = vec![
            Err(ApiError::new(ErrorCode::LeaseGone, "ended")),
            Ok(Some(9)),
            Err(ApiError::new(ErrorCode::AckStateFailed, "disk")),
        ];
        let decoded = decode_answer::<Settled>(&encode_answer(&reply).expect("encode"))
            .expect("decode")
            .expect("answered");
        assert_eq!(decoded, reply);

        let settle = Settle {
            topic: TopicRef {
                name: "t".into(),
                incarnation: 1,
            },
            receipts: vec!["r".into()],
            action: SettleAction::Nack { delay_ms: 5 },
        };
        let round = decode_request::<Settle>(&encode_request(&settle).expect("encode"));
        assert_eq!(round.expect("decode"), settle);

        let refused = ApiError::new(ErrorCode::Overloaded, "full");
        let answer = decode_answer::<Settled>(&encode_refusal(&refused).expect("encode"));
        assert_eq!(answer.expect("decode"), Err(refused));
    }

    #[test]
    fn garbage_another_version_and_the_wrong_kind_are_refused() {
        assert!(decode_request::<Commit>(b"not rkyv at all").is_err());
        assert!(decode_request::<Commit>(&[]).is_err());
        assert!(decode_answer::<Settled>(&[]).is_err());
        let mut bytes = encode_request(&commit()).expect("encode");
        bytes[0] = WIRE_VERSION + 1;
        let error = decode_request::<Commit>(&bytes).expect_err("another version");
        assert!(error.contains("version"), "{error}");
        let bytes = encode_request(&commit()).expect("encode");
        assert!(open(KIND_COMMIT, &bytes).is_ok());
        assert!(open(200, &bytes).is_err());
    }
}
