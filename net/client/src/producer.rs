//! A producer that coalesces: many callers' messages leave as batch
//! requests, and each caller gets its own message's id or error.
//!
//! The producer keeps a few lanes ([`ProducerOptions::lanes`]), each a task
//! with at most one request in flight on one kept-alive connection. A
//! message joins a lane's queue (keyless ones round the lanes, keyed ones
//! by a hash of the key, so one key's messages keep their order). When the
//! lane's request in flight is answered, everything queued leaves in the
//! next one: no linger, no timer. A quiet producer therefore sends each
//! message alone as soon as it comes, and a busy one sends batches as large
//! as the messages that came while the last batch was out, up to
//! [`BATCH_MESSAGES_MAX`] messages and [`ProducerOptions::batch_bytes`]
//! bytes of values.
//!
//! Errors: a batch refused as a whole for one bad message (`400`, `413`,
//! `422`: the error names the item) sends that message alone, so its caller
//! gets the answer its own message earns, and the rest again as a batch; a
//! refusal that names no item sends every message alone. Errors
//! worth retrying are retried by the [`Client`]'s policy, a batch at a
//! time; after the last attempt every caller of that batch gets the error.
//! Every message carries an idempotency key (the client gives one), so a
//! retried batch stores each message once.
//!
//! A caller that stops waiting (its future dropped) does not take its
//! message back: it is sent with the others, as a produce whose client went
//! away may still be stored.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use narad_net::batch::BATCH_MESSAGES_MAX;
use tokio::sync::{mpsc, oneshot};

use crate::{Client, Error, Outgoing};

/// How a [`Producer`] batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerOptions {
    /// Lanes, each with at most one request in flight (so at most this
    /// many connections). One lane sends the fewest and largest requests,
    /// which is what a node handles best: on a node of two shards with 64
    /// callers, one lane carried 52,500 msg/s of 1 KiB and two 35,000.
    /// More lanes help once one lane's batches reach the limits (1,000
    /// messages, [`ProducerOptions::batch_bytes`]), or to spread the load
    /// over the nodes behind a load balancer.
    pub lanes: usize,
    /// The most bytes of values in one batch request (the node refuses a
    /// batch over `http.max_batch_bytes`, 16 MiB by default). A message
    /// larger than this leaves alone.
    pub batch_bytes: usize,
}

/// One lane and 4 MiB batches.
impl Default for ProducerOptions {
    fn default() -> Self {
        Self {
            lanes: 1,
            batch_bytes: 4 * 1024 * 1024,
        }
    }
}

/// A message waiting in a lane, with where its answer goes.
struct Queued {
    topic: String,
    message: Outgoing,
    answer: oneshot::Sender<Result<String, Error>>,
}

/// A coalescing producer; see the module's text. Cheap to share behind an
/// `Arc`: every method takes `&self`. Its lanes run as tasks on the tokio
/// runtime it was made on, and end once the producer is dropped and their
/// queues are sent.
#[derive(Debug)]
pub struct Producer {
    lanes: Vec<mpsc::UnboundedSender<Queued>>,
    next: AtomicUsize,
}

impl Producer {
    /// A producer sending through `client`; its lanes are spawned on the
    /// current tokio runtime (call it from within one).
    pub fn new(client: Client, options: ProducerOptions) -> Self {
        let lanes = (0..options.lanes.max(1))
            .map(|_| {
                let (queue, queued) = mpsc::unbounded_channel();
                tokio::spawn(run_lane(client.clone(), queued, options.batch_bytes));
                queue
            })
            .collect();
        Self {
            lanes,
            next: AtomicUsize::new(0),
        }
    }

    /// Produces one message; its id once the node has it durably, as
    /// [`Client::produce`] answers, sent in a batch with other callers'
    /// messages when they come together.
    pub async fn produce(
        &self,
        topic: &str,
        key: Option<&str>,
        value: impl Into<Bytes>,
    ) -> Result<String, Error> {
        let lane = match key {
            Some(key) => {
                let mut hasher = DefaultHasher::new();
                key.hash(&mut hasher);
                hasher.finish() as usize
            }
            None => self.next.fetch_add(1, Ordering::Relaxed),
        } % self.lanes.len();
        let (answer, answered) = oneshot::channel();
        let message = Outgoing {
            key: key.map(str::to_string),
            value: value.into(),
            // The client gives it a fresh key when its batch leaves.
            idempotency_key: None,
        };
        self.lanes[lane]
            .send(Queued {
                topic: topic.to_string(),
                message,
                answer,
            })
            .map_err(|_| Error::Transport("the producer's lane ended".into()))?;
        answered
            .await
            .map_err(|_| Error::Transport("the producer's lane ended".into()))?
    }
}

/// One lane: waits for a message, takes whatever else is queued by then,
/// and sends it, one request at a time.
async fn run_lane(client: Client, mut queued: mpsc::UnboundedReceiver<Queued>, batch_bytes: usize) {
    let mut held: Option<Queued> = None;
    loop {
        let first = match held.take() {
            Some(first) => first,
            None => match queued.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let topic = first.topic.clone();
        let mut bytes = first.message.value.len();
        let mut batch = vec![first];
        // What came while the last request was out, of the same topic, up
        // to the limits; another topic's message starts the next batch.
        while batch.len() < BATCH_MESSAGES_MAX {
            let Ok(next) = queued.try_recv() else {
                break;
            };
            if next.topic != topic || bytes + next.message.value.len() > batch_bytes {
                held = Some(next);
                break;
            }
            bytes += next.message.value.len();
            batch.push(next);
        }
        send(&client, &topic, batch).await;
    }
}

/// Sends one lane's batch and answers each of its callers.
async fn send(client: &Client, topic: &str, mut batch: Vec<Queued>) {
    loop {
        if batch.len() <= 1 {
            if let Some(one) = batch.pop() {
                alone(client, topic, one).await;
            }
            return;
        }
        let messages: Vec<Outgoing> = batch.iter().map(|q| q.message.clone()).collect();
        match client.produce_batch(topic, &messages).await {
            Ok(ids) => {
                for (queued, id) in batch.into_iter().zip(ids) {
                    let _ = queued.answer.send(Ok(id));
                }
                return;
            }
            // Worth retrying, and retried already: nothing tells which of
            // the batch landed, so each caller hears the error.
            Err(error) if error.is_retryable() => {
                for queued in batch {
                    let _ = queued.answer.send(Err(error.clone()));
                }
                return;
            }
            // Refused whole for the item the error names: that one alone
            // (its caller gets the answer its own message earns), the rest
            // again as a batch.
            Err(error) => match refused_item(&error, batch.len()) {
                Some(index) => alone(client, topic, batch.remove(index)).await,
                None => {
                    for queued in batch {
                        alone(client, topic, queued).await;
                    }
                    return;
                }
            },
        }
    }
}

/// Sends one message by itself and answers its caller.
async fn alone(client: &Client, topic: &str, queued: Queued) {
    let message = queued.message;
    let answer = client
        .produce(topic, message.key.as_deref(), message.value)
        .await;
    let _ = queued.answer.send(answer);
}

/// The item a refused batch's error names (`messages[3] ...`), if any.
fn refused_item(error: &Error, len: usize) -> Option<usize> {
    let Error::Api { error, .. } = error else {
        return None;
    };
    let rest = error.message.strip_prefix("messages[")?;
    let index: usize = rest[..rest.find(']')?].parse().ok()?;
    (index < len).then_some(index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_net::{ApiError, ErrorCode};

    #[test]
    fn the_refused_item_is_read_from_the_error_only_when_it_names_one_of_the_batch() {
        let api = |message: &str| Error::Api {
            status: 413,
            error: ApiError::new(ErrorCode::TooLarge, message),
        };
        assert_eq!(
            refused_item(&api("messages[3] is 4000 bytes, over"), 5),
            Some(3)
        );
        assert_eq!(
            refused_item(&api("messages[7].key must be a string"), 8),
            Some(7)
        );
        assert_eq!(refused_item(&api("messages[9] is too big"), 5), None);
        assert_eq!(refused_item(&api("values add up to 17 MiB"), 5), None);
        assert_eq!(refused_item(&api("messages[x] odd"), 5), None);
        assert_eq!(refused_item(&Error::Transport("gone".into()), 5), None);
    }
}
