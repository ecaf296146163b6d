//! The one way operations travel: [`Transport`] carries an [`Envelope`] to
//! another shard of this node or to another node. The mesh (`mesh.rs`) and
//! QUIC (`remote.rs`) implement it; [`Links`] puts the two together for a
//! shard, and a simulation puts in its own.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_channel::oneshot;
use narad_net::{ApiError, ErrorCode};
use narad_raft::state::NodeId;

use super::ops::{Envelope, Operation, Reply};
use super::wire::decode_answer;
use crate::runtime::Runtime;

/// Where an operation goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Address {
    /// Another shard of this node.
    Shard(usize),
    /// Another node (its home shard for the operation takes it in).
    Node(NodeId),
}

/// How a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// No answer (down, cut off, or slower than the deadline): the
    /// operation may or may not have been carried out.
    Unreachable(String),
    /// The receiver refused it with an error of the API.
    Refused(ApiError),
}

impl CallError {
    /// As the API answers it: 502 `owner_unreachable` for a node that did
    /// not answer, or the receiver's own error.
    pub fn to_api(&self, to: Address) -> ApiError {
        match (self, to) {
            (Self::Refused(error), _) => error.clone(),
            (Self::Unreachable(reason), Address::Node(node)) => ApiError::new(
                ErrorCode::OwnerUnreachable,
                format!("the partition's owner, node {node}, did not answer: {reason}"),
            ),
            (Self::Unreachable(reason), Address::Shard(shard)) => ApiError::new(
                ErrorCode::Internal,
                format!("shard {shard} of this node did not answer: {reason}"),
            ),
        }
    }
}

/// A delivery under way.
pub type Delivered<'a> = Pin<Box<dyn Future<Output = Result<(), CallError>> + 'a>>;

/// Carries operations to other shards and nodes.
pub trait Transport {
    /// Carries `envelope` to `to`. Resolves once it was handed over (the
    /// reply then comes on the envelope's oneshot) or could not be; a
    /// transport that needs one uses `timeout` as its own deadline.
    fn deliver(&self, to: Address, envelope: Envelope, timeout: Option<Duration>) -> Delivered<'_>;
}

/// Hands the reply in an answer that came over the wire to whoever waits
/// for it, or says why there is none: a node's refusal, or bytes that are
/// not an answer of this operation.
pub fn answer_from_wire<O: Operation>(
    bytes: &[u8],
    reply: Reply<O::Reply>,
) -> Result<(), CallError> {
    match decode_answer::<O::Reply>(bytes).map_err(CallError::Unreachable)? {
        Ok(answer) => {
            // A caller that gave up dropped its end.
            let _ = reply.send(answer);
            Ok(())
        }
        Err(refused) => Err(CallError::Refused(refused)),
    }
}

/// Calls `to` with `op` and waits for its reply, at most `timeout`.
pub async fn call<O: Operation>(
    transport: &dyn Transport,
    runtime: &dyn Runtime,
    to: Address,
    op: O,
    timeout: Option<Duration>,
) -> Result<O::Reply, CallError> {
    let (reply, answer) = oneshot::channel();
    let exchange = async {
        transport.deliver(to, op.wrap(reply), timeout).await?;
        answer.await.map_err(|_| {
            CallError::Refused(ApiError::new(
                ErrorCode::Stopping,
                "the receiver stopped before answering; try again",
            ))
        })
    };
    match timeout {
        None => exchange.await,
        Some(timeout) => {
            let expired = async {
                runtime.sleep(timeout).await;
                Err(CallError::Unreachable(format!(
                    "no answer within {timeout:?}"
                )))
            };
            futures_lite::future::or(exchange, expired).await
        }
    }
}

/// A shard's transports: one to the other shards of its node, and one to
/// the other nodes when it has any.
pub struct Links {
    pub shards: Box<dyn Transport>,
    pub nodes: Option<Box<dyn Transport>>,
}

fn no_such_node(node: NodeId) -> CallError {
    CallError::Unreachable(format!(
        "node {node} is not a member of this single-node cluster"
    ))
}

impl Transport for Links {
    fn deliver(&self, to: Address, envelope: Envelope, timeout: Option<Duration>) -> Delivered<'_> {
        match (to, &self.nodes) {
            (Address::Shard(_), _) => self.shards.deliver(to, envelope, timeout),
            (Address::Node(_), Some(nodes)) => nodes.deliver(to, envelope, timeout),
            (Address::Node(node), None) => Box::pin(async move { Err(no_such_node(node)) }),
        }
    }
}
