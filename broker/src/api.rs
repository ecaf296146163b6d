//! The HTTP API (docs/http-api.md): routing, request parsing and JSON answers.
//!
//! Checks run in the order black-box tests rely on: the route (404
//! `not_found`), the method (405 with `Allow`), the topic name (400
//! `invalid_topic_name`), the topic's existence (404 `topic_not_found`, at
//! once), then the body.

use std::rc::Rc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, StatusCode};
use narad_net::batch::parse_batch;
use narad_net::http_server::{error_response, HttpRequest, HttpResponse};
use narad_net::names::validate_topic_name;
use narad_net::types::{
    ConsumeRequest, ConsumeResponse, ExtendResponse, SettleAction, SettleBatchResponse, SettleKind,
    SettleRequest, SettleResult, TopicPatch,
};
use narad_net::{ApiError, ErrorCode};
use narad_raft::state::Topic;
use serde_json::{json, Value};

use crate::metric_names::{
    CONNECTIONS_OPEN, CONSUMER_STATE_FAILED, DISPATCHER_PENDING_RECORDS, HTTP_BUFFERED_BODY_BYTES,
    HTTP_REQUESTS_TOTAL, HTTP_REQUEST_SECONDS, INGRESS_WAL_FAILED, NODE_ALIVE,
    PARTITION_AVAILABLE_MESSAGES, PARTITION_FRONTIER, PARTITION_HIGH_WATERMARK,
    PARTITION_IN_FLIGHT, PARTITION_OLDEST_UNACKED_AGE_SECONDS, RAFT_IS_LEADER, RAFT_TERM,
    WAL_USED_BYTES,
};
use crate::rpc::ShardGauges;
use crate::shard::{Shard, MAX_MESSAGE_BYTES_DEFAULT};

/// The routes of this build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route<'a> {
    Healthz,
    Readyz,
    Metrics,
    Cluster,
    Topics,
    Topic(&'a str),
    Produce(&'a str),
    ProduceBatch(&'a str),
    Consume(&'a str),
    Settle(&'a str, SettleKind, bool),
}

impl Route<'_> {
    /// The `route` label of the request metrics.
    fn label(&self) -> &'static str {
        match self {
            Route::Healthz => "healthz",
            Route::Readyz => "readyz",
            Route::Metrics => "metrics",
            Route::Cluster => "cluster",
            Route::Topics => "topics",
            Route::Topic(_) => "topic",
            Route::Produce(_) => "produce",
            Route::ProduceBatch(_) => "produce_batch",
            Route::Consume(_) => "consume",
            Route::Settle(_, SettleKind::Ack, false) => "ack",
            Route::Settle(_, SettleKind::Ack, true) => "ack_batch",
            Route::Settle(_, SettleKind::Nack, false) => "nack",
            Route::Settle(_, SettleKind::Nack, true) => "nack_batch",
            Route::Settle(_, SettleKind::Extend, false) => "extend",
            Route::Settle(_, SettleKind::Extend, true) => "extend_batch",
        }
    }

    fn allowed(&self) -> &'static [Method] {
        match self {
            Route::Healthz | Route::Readyz | Route::Metrics | Route::Topics | Route::Cluster => {
                &[Method::GET]
            }
            Route::Topic(_) => &[Method::GET, Method::PUT, Method::DELETE],
            Route::Produce(_) | Route::ProduceBatch(_) | Route::Consume(_) | Route::Settle(..) => {
                &[Method::POST]
            }
        }
    }

    fn topic(&self) -> Option<&str> {
        match self {
            Route::Topic(t)
            | Route::Produce(t)
            | Route::ProduceBatch(t)
            | Route::Consume(t)
            | Route::Settle(t, ..) => Some(t),
            Route::Healthz | Route::Readyz | Route::Metrics | Route::Topics | Route::Cluster => {
                None
            }
        }
    }
}

fn route(path: &str) -> Option<Route<'_>> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let settle = |kind: &str| match kind {
        "ack" => Some(SettleKind::Ack),
        "nack" => Some(SettleKind::Nack),
        "extend" => Some(SettleKind::Extend),
        _ => None,
    };
    match segments.as_slice() {
        ["healthz"] => Some(Route::Healthz),
        ["readyz"] => Some(Route::Readyz),
        ["metrics"] => Some(Route::Metrics),
        ["v1", "topics"] => Some(Route::Topics),
        ["v1", "cluster"] => Some(Route::Cluster),
        ["v1", "topics", t] => Some(Route::Topic(t)),
        ["v1", "topics", t, "messages"] => Some(Route::Produce(t)),
        ["v1", "topics", t, "messages", "batch"] => Some(Route::ProduceBatch(t)),
        ["v1", "topics", t, "consume"] => Some(Route::Consume(t)),
        ["v1", "topics", t, kind] => settle(kind).map(|k| Route::Settle(t, k, false)),
        ["v1", "topics", t, kind, "batch"] => settle(kind).map(|k| Route::Settle(t, k, true)),
        _ => None,
    }
}

fn json_response(status: StatusCode, body: &impl serde::Serialize) -> HttpResponse {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    let mut response = hyper::Response::new(Full::new(Bytes::from(bytes)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn empty_response(status: StatusCode) -> HttpResponse {
    let mut response = hyper::Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

/// Answers one request.
pub async fn handle(shard: Rc<Shard>, request: HttpRequest) -> HttpResponse {
    let started = std::time::Instant::now();
    let path = request.uri().path().to_string();
    let label = route(&path).map_or("unknown", |r| r.label());
    let response = match dispatch(&shard, request, &path).await {
        Ok(response) => response,
        Err(error) => error_response(&error),
    };
    let status = response.status().as_u16();
    record_request(label, status, started.elapsed());
    response
}

type RequestMetrics =
    std::collections::HashMap<(&'static str, u16), (metrics::Counter, metrics::Histogram)>;

thread_local! {
    /// Metric handles by (route, status): looking a labelled metric up in
    /// the registry on every request costs allocations and hashing.
    static REQUEST_METRICS: std::cell::RefCell<RequestMetrics> = std::cell::RefCell::default();
}

fn record_request(route: &'static str, status: u16, elapsed: std::time::Duration) {
    REQUEST_METRICS.with(|cache| {
        let mut cache = cache.borrow_mut();
        let (counter, histogram) = cache.entry((route, status)).or_insert_with(|| {
            (
                metrics::counter!(HTTP_REQUESTS_TOTAL, "route" => route, "status" => status.to_string()),
                metrics::histogram!(HTTP_REQUEST_SECONDS, "route" => route),
            )
        });
        counter.increment(1);
        histogram.record(elapsed.as_secs_f64());
    });
}

async fn dispatch(
    shard: &Rc<Shard>,
    request: HttpRequest,
    path: &str,
) -> Result<HttpResponse, ApiError> {
    let Some(route) = route(path) else {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no route {path}"),
        ));
    };
    if !route.allowed().contains(request.method()) {
        let allow: Vec<&str> = route.allowed().iter().map(Method::as_str).collect();
        let mut response = error_response(&ApiError::new(
            ErrorCode::MethodNotAllowed,
            format!(
                "{} is not allowed on {path}; use {}",
                request.method(),
                allow.join(", ")
            ),
        ));
        if let Ok(value) = hyper::header::HeaderValue::from_str(&allow.join(", ")) {
            response.headers_mut().insert(hyper::header::ALLOW, value);
        }
        return Ok(response);
    }
    if let Some(topic) = route.topic() {
        validate_topic_name(topic)?;
    }
    let body = request.body().clone();
    match route {
        Route::Healthz => Ok(json_response(StatusCode::OK, &json!({"status": "ok"}))),
        Route::Readyz => match shard.not_ready().await {
            // docs/http-api.md: 503 whatever the reason, in the error shape with its code.
            Some(error) => {
                let mut response = error_response(&error);
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                Ok(response)
            }
            None => Ok(json_response(StatusCode::OK, &json!({"status": "ready"}))),
        },
        Route::Metrics => Ok(metrics(shard).await),
        Route::Cluster => Ok(json_response(StatusCode::OK, &cluster_json(shard))),
        Route::Topics => {
            let topics: Vec<Value> = shard.topics().iter().map(topic_json).collect();
            Ok(json_response(StatusCode::OK, &json!({ "topics": topics })))
        }
        Route::Topic(name) => match *request.method() {
            Method::PUT => put_topic(shard, name, &body).await,
            Method::DELETE => {
                shard.delete_topic(name).await?;
                Ok(empty_response(StatusCode::NO_CONTENT))
            }
            _ => get_topic(shard, name).await,
        },
        Route::Produce(name) => {
            let topic = shard.topic(name)?;
            let key = request
                .headers()
                .get("narad-key")
                .map(|v| v.as_bytes().to_vec());
            // One exact-size copy: the request's buffer is hyper's read
            // buffer, which the tail cache must not keep alive.
            let value = Bytes::copy_from_slice(&body);
            let ids = shard.produce(&topic, vec![(key, value)]).await?;
            let id = ids.into_iter().next().unwrap_or_default();
            Ok(json_response(StatusCode::ACCEPTED, &json!({ "id": id })))
        }
        Route::ProduceBatch(name) => {
            let topic = shard.topic(name)?;
            let items = parse_batch(&body, topic.config.max_message_bytes)?;
            let batch_bytes: usize = items.iter().map(|i| i.value.len()).sum();
            let batch_max = shard.settings().http.max_batch_bytes;
            if batch_bytes as u64 > batch_max {
                return Err(ApiError::new(
                    ErrorCode::TooLarge,
                    format!("the batch holds {batch_bytes} bytes of values, over http.max_batch_bytes of {batch_max}"),
                ));
            }
            let messages = items
                .into_iter()
                .map(|i| (i.key.map(String::into_bytes), Bytes::from(i.value)))
                .collect();
            let ids = shard.produce(&topic, messages).await?;
            Ok(json_response(StatusCode::ACCEPTED, &json!({ "ids": ids })))
        }
        Route::Consume(name) => {
            let topic = shard.topic(name)?;
            let consume = ConsumeRequest::parse(&body)?;
            let messages = shard.consume(&topic, consume).await?;
            Ok(json_response(StatusCode::OK, &ConsumeResponse { messages }))
        }
        Route::Settle(name, kind, batch) => {
            let topic = shard.topic(name)?;
            let settle = SettleRequest::parse(&body, kind, batch)?;
            if batch {
                Ok(settle_batch(shard, &topic, settle).await)
            } else {
                settle_one(shard, &topic, settle).await
            }
        }
    }
}

async fn settle_one(
    shard: &Shard,
    topic: &Topic,
    settle: SettleRequest,
) -> Result<HttpResponse, ApiError> {
    let answer = shard
        .settle(
            topic,
            &settle.receipts[..1.min(settle.receipts.len())],
            settle.action,
        )
        .await
        .into_iter()
        .next()
        .unwrap_or_else(|| Err(ApiError::new(ErrorCode::InvalidRequest, "no receipt given")));
    match answer? {
        Some(lease_expires_at_ms) => Ok(json_response(
            StatusCode::OK,
            &ExtendResponse {
                lease_expires_at_ms,
            },
        )),
        None => Ok(empty_response(StatusCode::NO_CONTENT)),
    }
}

async fn settle_batch(shard: &Shard, topic: &Topic, settle: SettleRequest) -> HttpResponse {
    let ok_status = match settle.action {
        SettleAction::Extend { .. } => 200,
        SettleAction::Ack | SettleAction::Nack { .. } => 204,
    };
    let answers = shard.settle(topic, &settle.receipts, settle.action).await;
    let results = settle
        .receipts
        .into_iter()
        .zip(answers)
        .map(|(receipt, answer)| match answer {
            Ok(lease_expires_at_ms) => SettleResult {
                receipt,
                status: ok_status,
                lease_expires_at_ms,
                error: None,
            },
            Err(error) => SettleResult {
                receipt,
                status: error.status(),
                lease_expires_at_ms: None,
                error: serde_json::from_str::<Value>(&error.to_json())
                    .ok()
                    .map(|v| v["error"].clone()),
            },
        })
        .collect();
    json_response(StatusCode::OK, &SettleBatchResponse { results })
}

/// `GET /v1/cluster`: the members, their state as the controller last
/// judged it (through Raft), and how many partitions each owns.
fn cluster_json(shard: &Shard) -> Value {
    let meta = shard.meta();
    let view = meta.view();
    let state = &view.state;
    let nodes: Vec<Value> = meta
        .members()
        .into_iter()
        .map(|(id, addr)| {
            let alive = state.nodes.get(&id).is_none_or(|record| record.alive);
            let partitions = state
                .topics
                .values()
                .flat_map(|t| t.owners.iter())
                .filter(|owner| **owner == id)
                .count();
            json!({
                "id": id,
                "addr": addr,
                "state": if alive { "alive" } else { "dead" },
                "partitions": partitions,
            })
        })
        .collect();
    json!({
        "cluster_id": state.cluster_id,
        "leader": meta.leader(),
        "term": meta.term(),
        "nodes": nodes,
    })
}

fn topic_json(topic: &Topic) -> Value {
    json!({
        "name": topic.name,
        "partitions": topic.config.partitions,
        "visibility_timeout_ms": topic.config.visibility_timeout_ms,
        "retention_ms": topic.config.retention_ms,
        "max_deliveries": topic.config.max_deliveries,
        "dead_letter_topic": topic.config.dead_letter_topic,
        "schema": topic.config.schema,
        "max_message_bytes": topic.config.max_message_bytes,
    })
}

async fn topic_json_with_stats(shard: &Shard, topic: &Topic) -> Result<Value, ApiError> {
    let stats = shard.partition_stats(topic).await?;
    let mut value = topic_json(topic);
    let partition_stats: Vec<Value> = stats
        .iter()
        .enumerate()
        .map(|(partition, s)| {
            json!({
                "partition": partition,
                "owner": topic.owners.get(partition).copied().unwrap_or(0),
                "high_watermark": s.high_watermark,
                "frontier": s.frontier,
                "available": s.available,
                "in_flight": s.in_flight,
                "oldest_unacked_age_ms": s.oldest_unacked_age_ms,
            })
        })
        .collect();
    value["partition_stats"] = json!(partition_stats);
    value["children"] = json!([]);
    Ok(value)
}

async fn get_topic(shard: &Shard, name: &str) -> Result<HttpResponse, ApiError> {
    let topic = shard.topic(name)?;
    Ok(json_response(
        StatusCode::OK,
        &topic_json_with_stats(shard, &topic).await?,
    ))
}

async fn put_topic(shard: &Shard, name: &str, body: &[u8]) -> Result<HttpResponse, ApiError> {
    let floor = shard.settings().topics.retention_floor_ms;
    let max_message = shard
        .settings()
        .http
        .max_batch_bytes
        .max(MAX_MESSAGE_BYTES_DEFAULT);
    let patch = TopicPatch::parse(body, floor, max_message)?;
    let (created, topic) = shard.put_topic(name, patch).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json_response(
        status,
        &topic_json_with_stats(shard, &topic).await?,
    ))
}

/// Prometheus text exposition of the node's figures, every shard's.
async fn metrics(shard: &Shard) -> HttpResponse {
    let shards = shard.gauges().await;
    let mut out = shard.render_metrics();
    let mut gauge = |name: &str, help: &str, samples: Vec<(String, f64)>| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for (labels, value) in samples {
            out.push_str(&format!("{name}{labels} {value}\n"));
        }
    };
    let failed = shards.iter().any(|g| g.wal_failure.is_some());
    gauge(
        INGRESS_WAL_FAILED,
        "1 once an ingress WAL of the node failed (its shard answers 500 to produces until restart)",
        vec![(String::new(), if failed { 1.0 } else { 0.0 })],
    );
    let acks_failed = shards.iter().any(|g| g.ack_state_failure.is_some());
    gauge(
        CONSUMER_STATE_FAILED,
        "1 once the ack state of a partition on this node failed (its acks answer 503 ack_state_failed)",
        vec![(String::new(), if acks_failed { 1.0 } else { 0.0 })],
    );
    let per_shard = |f: &dyn Fn(&ShardGauges) -> f64| -> Vec<(String, f64)> {
        shards
            .iter()
            .map(|g| (format!("{{shard=\"{}\"}}", g.shard), f(g)))
            .collect()
    };
    gauge(
        WAL_USED_BYTES,
        "bytes of the ingress WAL ring in use",
        per_shard(&|g| g.wal_used_bytes as f64),
    );
    gauge(
        DISPATCHER_PENDING_RECORDS,
        "accepted records not yet committed to their partition",
        per_shard(&|g| g.dispatcher_pending as f64),
    );
    gauge(
        RAFT_IS_LEADER,
        "1 while this node is the Raft leader",
        vec![(
            String::new(),
            if shard.meta().is_leader() { 1.0 } else { 0.0 },
        )],
    );
    gauge(
        CONNECTIONS_OPEN,
        "client connections open on this node (at most http.max_connections)",
        vec![(String::new(), shard.http_budget().connections_open() as f64)],
    );
    gauge(
        HTTP_BUFFERED_BODY_BYTES,
        "bytes of request bodies this node holds (at most http.max_buffered_body_bytes)",
        vec![(
            String::new(),
            shard.http_budget().buffered_body_bytes() as f64,
        )],
    );
    gauge(
        NODE_ALIVE,
        "1 for each member this node's controller sees alive, 0 once marked dead",
        shard
            .members_alive()
            .into_iter()
            .map(|(node, alive)| {
                (
                    format!("{{node=\"{node}\"}}"),
                    if alive { 1.0 } else { 0.0 },
                )
            })
            .collect(),
    );
    gauge(
        RAFT_TERM,
        "current Raft term",
        vec![(String::new(), shard.meta().term() as f64)],
    );
    let partitions: Vec<&(String, u32, crate::owner::PartitionStats)> =
        shards.iter().flat_map(|g| &g.partitions).collect();
    let label =
        |topic: &str, partition: u32| format!("{{topic=\"{topic}\",partition=\"{partition}\"}}");
    let series = |f: &dyn Fn(&crate::owner::PartitionStats) -> f64| -> Vec<(String, f64)> {
        partitions
            .iter()
            .map(|(t, p, s)| (label(t, *p), f(s)))
            .collect()
    };
    gauge(
        PARTITION_HIGH_WATERMARK,
        "next offset of the partition",
        series(&|s| s.high_watermark as f64),
    );
    gauge(
        PARTITION_FRONTIER,
        "lowest offset not acked",
        series(&|s| s.frontier as f64),
    );
    gauge(
        PARTITION_AVAILABLE_MESSAGES,
        "messages neither leased nor acked",
        series(&|s| s.available as f64),
    );
    gauge(
        PARTITION_IN_FLIGHT,
        "messages under a lease",
        series(&|s| s.in_flight as f64),
    );
    gauge(
        PARTITION_OLDEST_UNACKED_AGE_SECONDS,
        "age of the oldest unacked message",
        series(&|s| s.oldest_unacked_age_ms as f64 / 1000.0),
    );
    let mut response = hyper::Response::new(Full::new(Bytes::from(out)));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_the_api() {
        assert_eq!(route("/v1/topics"), Some(Route::Topics));
        assert_eq!(route("/v1/topics/orders"), Some(Route::Topic("orders")));
        assert_eq!(
            route("/v1/topics/orders/messages/batch"),
            Some(Route::ProduceBatch("orders"))
        );
        assert_eq!(
            route("/v1/topics/orders/nack"),
            Some(Route::Settle("orders", SettleKind::Nack, false))
        );
        assert_eq!(
            route("/v1/topics/orders/extend/batch"),
            Some(Route::Settle("orders", SettleKind::Extend, true))
        );
        assert_eq!(
            route("/v1/topics/orders/children"),
            None,
            "children arrive later: 404"
        );
        assert_eq!(route("/v1/nothing"), None);
        assert_eq!(route("/healthz"), Some(Route::Healthz));
    }
}
