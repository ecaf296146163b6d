//! Remote children's copies leave the node here: a [`Ship`] takes a batch
//! of one parent partition for a topic of another Narad cluster and
//! answers once that cluster answered 202 (or why not).
//!
//! [`Shipper`] is the node's: one thread with a tokio runtime, where
//! `narad-client` sends each batch with the remote's batch produce API.
//! Shards await its answers from glommio. Per remote child (a lane) it
//! keeps one client (its connection pool, token and TLS), at most
//! `children.remote_max_in_flight` requests in flight, and the child's
//! byte rate, as this node's share of it. A request is tried once: the
//! copy that sent it decides when to send it again, from its cursor.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use narad_client::{Client, ClientTlsFiles, Error as ClientError, Outgoing, RetryPolicy};
use narad_raft::node::BoxFuture;
use narad_raft::state::RemoteTarget;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::limits::{REMOTE_LANE_IDLE, REMOTE_SHIP_TIMEOUT};

/// One batch for a remote child.
pub struct Shipment {
    /// The remote child (`parent/child/incarnation`): its lane.
    pub lane: String,
    pub target: RemoteTarget,
    /// Keys and values, in the parent partition's order.
    pub messages: Vec<(Option<Vec<u8>>, Bytes)>,
    /// This node's share of the child's byte rate, if it has one.
    pub rate_bytes_per_s: Option<u64>,
}

impl Shipment {
    /// Bytes of keys and values: what the rate counts.
    pub fn bytes(&self) -> u64 {
        self.messages
            .iter()
            .map(|(key, value)| (key.as_ref().map_or(0, Vec::len) + value.len()) as u64)
            .sum()
    }
}

/// Sends batches to remote clusters; `Err` says why one was not taken (a
/// line for the child's status and the log, with the remote's URL).
pub trait Ship {
    fn ship(&self, shipment: Shipment) -> BoxFuture<Result<(), String>>;
}

/// The node's [`Ship`]: a thread of its own with a tokio runtime.
pub struct Shipper {
    runtime: tokio::runtime::Handle,
    lanes: Arc<Mutex<HashMap<String, Arc<Lane>>>>,
    ca_file: Option<String>,
    max_in_flight: usize,
    /// How long an unused lane is kept.
    lane_idle: Duration,
    /// Dropped to end the thread.
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// What is kept per remote child.
struct Lane {
    in_flight: Semaphore,
    /// When a batch last took this lane.
    last_used: Mutex<Instant>,
    /// When the rate lets the next batch go.
    next_free: Mutex<Instant>,
    /// The client of the target it was made for (a new URL or token makes
    /// a new one).
    client: Mutex<Option<(String, Option<String>, Client)>>,
}

impl Shipper {
    /// Starts the thread. `ca_file`: the CA `https://` remotes are verified
    /// against (else the system's bundle).
    pub fn start(ca_file: Option<String>, max_in_flight: usize) -> Result<Self, String> {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        // Runs the shipments until the node drops its shipper.
        let (runtime, _thread) = narad_thread::start("narad-ship", |ready| async move {
            ready.send(tokio::runtime::Handle::current());
            let _ = stopped.await;
        })
        .map_err(|e| format!("starting the remote children's thread: {e}"))?;
        Ok(Self {
            runtime,
            lanes: Arc::new(Mutex::new(HashMap::new())),
            ca_file,
            max_in_flight: max_in_flight.max(1),
            lane_idle: REMOTE_LANE_IDLE,
            _stop: stop,
        })
    }

    /// The lane of `name`, made if needed. Lanes nobody used for
    /// `lane_idle` and with nothing in flight are let go on the way (those of
    /// deleted children among them).
    fn lane(&self, name: &str) -> Arc<Lane> {
        let now = Instant::now();
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        lanes.retain(|kept, lane| {
            let last_used = *lane.last_used.lock().unwrap_or_else(|e| e.into_inner());
            kept == name
                || Arc::strong_count(lane) > 1
                || now.saturating_duration_since(last_used) < self.lane_idle
        });
        let lane = lanes
            .entry(name.to_string())
            .or_insert_with(|| {
                Arc::new(Lane {
                    in_flight: Semaphore::new(self.max_in_flight),
                    last_used: Mutex::new(now),
                    next_free: Mutex::new(now),
                    client: Mutex::new(None),
                })
            })
            .clone();
        *lane.last_used.lock().unwrap_or_else(|e| e.into_inner()) = now;
        lane
    }
}

impl Ship for Shipper {
    fn ship(&self, shipment: Shipment) -> BoxFuture<Result<(), String>> {
        let lane = self.lane(&shipment.lane);
        let ca_file = self.ca_file.clone();
        let task = self.runtime.spawn(async move {
            let _permit = lane
                .in_flight
                .acquire()
                .await
                .map_err(|_| "the node is stopping".to_string())?;
            if let Some(rate) = shipment.rate_bytes_per_s.filter(|r| *r > 0) {
                let cost = Duration::from_secs_f64(shipment.bytes() as f64 / rate as f64);
                let start = {
                    let mut next = lane.next_free.lock().unwrap_or_else(|e| e.into_inner());
                    let start = (*next).max(Instant::now());
                    *next = start + cost;
                    start
                };
                tokio::time::sleep_until(start).await;
            }
            let client = lane.client_for(&shipment.target, ca_file)?;
            let messages: Vec<Outgoing> = shipment
                .messages
                .into_iter()
                .map(|(key, value)| Outgoing {
                    key: key.map(|k| String::from_utf8_lossy(&k).into_owned()),
                    value,
                    idempotency_key: None,
                })
                .collect();
            client
                .produce_batch(&shipment.target.topic, &messages)
                .await
                .map(|_| ())
                .map_err(|error| describe(&shipment.target.url, &error))
        });
        Box::pin(async move {
            task.await
                .map_err(|e| format!("the shipment was cut short: {e}"))?
        })
    }
}

impl Lane {
    fn client_for(&self, target: &RemoteTarget, ca_file: Option<String>) -> Result<Client, String> {
        let mut slot = self.client.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((url, token, client)) = slot.as_ref() {
            if *url == target.url && *token == target.token {
                return Ok(client.clone());
            }
        }
        // The remote cluster may run a release that refuses idempotency
        // keys; a shipment sent again may store copies twice there.
        let mut builder = Client::builder(&target.url)
            .idempotency_keys(false)
            .timeout(REMOTE_SHIP_TIMEOUT)
            .retry(RetryPolicy {
                attempts: 1,
                ..RetryPolicy::default()
            })
            .tls(ClientTlsFiles {
                ca_file,
                ..ClientTlsFiles::default()
            });
        if let Some(token) = &target.token {
            builder = builder.token(token);
        }
        let client = builder
            .build()
            .map_err(|error| describe(&target.url, &error))?;
        *slot = Some((target.url.clone(), target.token.clone(), client.clone()));
        Ok(client)
    }
}

/// A failed shipment as the child's status says it.
fn describe(url: &str, error: &ClientError) -> String {
    match error {
        ClientError::Api { status, error } => format!(
            "the remote {url} answered {status} {}: {}",
            error.code.as_str(),
            error.message
        ),
        ClientError::Transport(detail) => format!("could not reach the remote: {detail}"),
        ClientError::Tls(detail) => format!(
            "TLS with the remote failed (is children.remote_ca_file the CA that signed its certificate?): {detail}"
        ),
        ClientError::Config(detail) => format!("the remote child's settings: {detail}"),
        ClientError::BadResponse(detail) => {
            format!("the remote {url} answered what Narad does not: {detail}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipment(lane: &str) -> Shipment {
        Shipment {
            lane: lane.to_string(),
            target: RemoteTarget {
                // Nothing listens on port 1 of loopback: refused at once.
                url: "http://127.0.0.1:1".into(),
                topic: "copy".into(),
                token: None,
                rate_bytes_per_s: None,
            },
            messages: vec![(None, Bytes::from_static(b"m"))],
            rate_bytes_per_s: None,
        }
    }

    fn lanes(shipper: &Shipper) -> Vec<String> {
        let mut names: Vec<String> = shipper
            .lanes
            .lock()
            .expect("lanes")
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// A deleted child's lane does not stay for the life of the node.
    #[test]
    fn a_lane_nobody_uses_is_let_go() {
        let mut shipper = Shipper::start(None, 2).expect("shipper");
        shipper.lane_idle = Duration::from_millis(50);
        let failed = futures_lite::future::block_on(shipper.ship(shipment("orders/gone/1")));
        assert!(failed.is_err(), "nothing listens there");
        assert_eq!(lanes(&shipper), ["orders/gone/1"]);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let _ = futures_lite::future::block_on(shipper.ship(shipment("orders/live/1")));
            if lanes(&shipper) == ["orders/live/1"] {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "an idle lane is kept: {:?}",
                lanes(&shipper)
            );
        }
    }
}
