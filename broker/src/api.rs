//! The HTTP API (docs/http-api.md): authentication and dispatch here, the
//! route table in `routes`, the handlers of the data plane (`data`), the
//! control plane (`control`, `cluster`) and `/metrics` (`metrics_page`).
//!
//! Checks run in the order black-box tests rely on: the route (404
//! `not_found`), the method (405 with `Allow`), the topic name (400
//! `invalid_topic_name`), the topic's existence (404 `topic_not_found`, at
//! once), then the body.

use std::rc::Rc;

mod browse;
mod cluster;
pub mod console;
mod control;
mod data;
mod metrics_page;
pub mod openapi;
mod routes;

use cluster::cluster_json;
pub(crate) use control::topic_bounds;
use control::*;
use data::*;
use metrics_page::metrics;
use routes::{route, Route};
pub use routes::{Need, RouteId, RouteSpec, ROUTES};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, StatusCode};
use narad_net::batch::{check_idempotency_key, key_too_long, parse_batch, KEY_BYTES_MAX};
use narad_net::http_server::{error_response, HttpRequest, HttpResponse};
use narad_net::names::validate_topic_name;
use narad_net::types::{
    accepts_binary_messages, consume_response_binary, consume_response_json, ChildKindName,
    ChildRequest, ConsumeBody, ExtendResponse, RedriveRequest, SettleAction, SettleBatchResponse,
    SettleKind, SettleRequest, SettleResult, TopicPatch, MESSAGES_MEDIA_TYPE,
};
use narad_net::{ApiError, ErrorCode};
use narad_raft::state::{Action, ChildKind, Grant, RedriveState, RemoteTarget, Topic, ADMIN_USER};
use serde_json::{json, Value};

use crate::auth::{
    credentials, token_user, validate_grants, validate_password, validate_user_name, Credentials,
};
use crate::metric_names::{
    CONNECTIONS_OPEN, CONSUMER_STATE_FAILED, DEAD_LETTERED_TOTAL, DISPATCHER_PENDING_RECORDS,
    FANOUT_CHILD_DROPPED_MESSAGES, FANOUT_CHILD_LAG_MESSAGES, FANOUT_CHILD_LAG_SECONDS,
    HTTP_BUFFERED_BODY_BYTES, HTTP_REQUESTS_TOTAL, HTTP_REQUEST_SECONDS, IDEMPOTENCY_KEYS,
    IDEMPOTENCY_KEYS_FORGOTTEN_TOTAL, INGRESS_WAL_FAILED, NODE_ALIVE, PARTITION_AVAILABLE_MESSAGES,
    PARTITION_FRONTIER, PARTITION_HIGH_WATERMARK, PARTITION_IN_FLIGHT,
    PARTITION_OLDEST_UNACKED_AGE_SECONDS, RAFT_IS_LEADER, RAFT_TERM, REMOTE_CHILD_HEADROOM_SECONDS,
    WAL_USED_BYTES,
};
use crate::rpc::ShardGauges;
use crate::schemas::check_document;
use crate::shard::{
    child_statuses, ChildStatus, Incoming, RedriveStatus, Shard, MAX_MESSAGE_BYTES_DEFAULT,
};

fn json_response(status: StatusCode, body: &impl serde::Serialize) -> HttpResponse {
    bytes_response(
        status,
        "application/json",
        serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec()),
    )
}

fn bytes_response(status: StatusCode, content_type: &'static str, bytes: Vec<u8>) -> HttpResponse {
    let mut response = hyper::Response::new(Full::new(Bytes::from(bytes)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

fn empty_response(status: StatusCode) -> HttpResponse {
    let mut response = hyper::Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

/// Looks at a request's head before its body is read: with auth on, a
/// request to a route that is not open and whose credentials are missing,
/// unreadable or an unknown token is answered 401 unread, so nobody
/// without credentials makes the node hold a body. (A password is checked
/// with the body read, in [`handle`]: a quick refusal would tell unknown
/// users from wrong passwords by its speed.)
pub fn screen(shard: &Shard, head: &hyper::http::request::Parts) -> Option<HttpResponse> {
    if !shard.settings().auth.enabled {
        return None;
    }
    let path = head.uri.path();
    // The console's files are open: its page asks the user to sign in.
    if console::is_console_path(path) {
        return None;
    }
    let matched = route(path).map(|r| r.for_method(&head.method));
    if matched.is_some_and(|r| r.spec.methods.iter().all(|(_, n)| *n == Need::Open)) {
        return None;
    }
    let header = head
        .headers
        .get(hyper::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let refusal = match credentials(header) {
        Err(error) => error,
        Ok(Credentials::Bearer(token)) if token_user(&shard.state().state, &token).is_none() => {
            ApiError::new(
                ErrorCode::Unauthenticated,
                "the bearer token is unknown or revoked",
            )
        }
        Ok(_) => return None,
    };
    let mut response = error_response(&refusal);
    response.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        hyper::header::HeaderValue::from_static(WWW_AUTHENTICATE),
    );
    let label = matched.map_or("unknown", |r| r.spec.label());
    record_request(label, response.status().as_u16(), std::time::Duration::ZERO);
    Some(response)
}

/// What a 401 says a node takes.
const WWW_AUTHENTICATE: &str = r#"Basic realm="narad", Bearer realm="narad""#;

/// Answers one request.
pub async fn handle(shard: Rc<Shard>, request: HttpRequest) -> HttpResponse {
    let started = std::time::Instant::now();
    let path = request.uri().path().to_string();
    if let Some(response) = console::answer(shard.settings().ui.enabled, request.method(), &path) {
        record_request("console", response.status().as_u16(), started.elapsed());
        return response;
    }
    let matched = route(&path).map(|r| r.for_method(request.method()));
    let label = matched.map_or("unknown", |r| r.spec.label());
    let mut response = match dispatch(&shard, request, &path, matched).await {
        Ok(response) => response,
        Err(error) => error_response(&error),
    };
    if response.status() == StatusCode::UNAUTHORIZED {
        // HTTP's way of saying which credentials the node takes.
        response.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static(WWW_AUTHENTICATE),
        );
    }
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
    matched: Option<Route<'_>>,
) -> Result<HttpResponse, ApiError> {
    // With auth on, credentials come first, before any other check: an
    // unknown path answers 401 too, and only health and metrics are open.
    // Open by path: a wrong method on an open path is 405, not 401.
    let open = matched.is_some_and(|r| r.spec.methods.iter().all(|(_, n)| *n == Need::Open));
    let user = if shard.settings().auth.enabled && !open {
        let header = request
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        Some(shard.authenticate(header).await?)
    } else {
        None
    };
    let Some(route) = matched else {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no route {path}"),
        ));
    };
    let Some(need) = route.need(request.method()) else {
        let allow = route.allowed().join(", ");
        let mut response = error_response(&ApiError::new(
            ErrorCode::MethodNotAllowed,
            format!("{} is not allowed on {path}; use {allow}", request.method()),
        ));
        if let Ok(value) = hyper::header::HeaderValue::from_str(&allow) {
            response.headers_mut().insert(hyper::header::ALLOW, value);
        }
        return Ok(response);
    };
    if let Some(topic) = route.topic {
        validate_topic_name(topic)?;
    }
    if let Some(child) = route.child {
        validate_topic_name(child)?;
    }
    if let Some(schema) = route.schema {
        validate_schema_name(schema)?;
    }
    if let Some(name) = route.user {
        validate_user_name(name)?;
    }
    // The grant, before anything says whether the topic exists.
    if let Some(user) = &user {
        match need {
            Need::Open | Need::Anyone => {}
            Need::Topic(action) => {
                shard.authorize(user, action, route.topic)?;
                // A child is a topic of its own: changing it needs admin on it too.
                if route.child.is_some() {
                    shard.authorize(user, action, route.child)?;
                }
            }
            Need::TopicEither(first, second) => {
                if shard.authorize(user, first, route.topic).is_err() {
                    shard.authorize(user, second, route.topic)?;
                }
            }
            Need::Cluster => shard.authorize(user, Action::Cluster, None)?,
            Need::SelfOrCluster if route.user == Some(user.as_str()) => {}
            Need::SelfOrCluster => shard.authorize(user, Action::Cluster, None)?,
        }
    }
    let body = request.body().clone();
    let method = request.method().clone();
    let query = request.uri().query();
    match route.spec.id {
        RouteId::Healthz => Ok(json_response(StatusCode::OK, &json!({"status": "ok"}))),
        RouteId::Readyz => match shard.not_ready().await {
            // docs/http-api.md: 503 whatever the reason, in the error shape with its code.
            Some(error) => {
                let mut response = error_response(&error);
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                Ok(response)
            }
            None => Ok(json_response(StatusCode::OK, &json!({"status": "ready"}))),
        },
        RouteId::Metrics => Ok(metrics(shard).await),
        RouteId::OpenApi => {
            let mut response = hyper::Response::new(Full::new(openapi::document_json()?));
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            Ok(response)
        }
        RouteId::Cluster => Ok(json_response(StatusCode::OK, &cluster_json(shard).await)),
        RouteId::ClusterNodes => {
            let (id, addr) = cluster::parse_admit(&body)?;
            shard.admit_node(id, addr).await?;
            Ok(json_response(StatusCode::OK, &cluster_json(shard).await))
        }
        RouteId::ClusterNode => {
            shard.remove_node(cluster::node_id(route.node()?)?).await?;
            Ok(empty_response(StatusCode::NO_CONTENT))
        }
        RouteId::Decommission => {
            let node = cluster::node_id(route.node()?)?;
            if cluster::dry_run(query)? {
                let plans = shard.decommission_plan(node)?;
                return Ok(json_response(StatusCode::OK, &cluster::plans_json(&plans)));
            }
            let moves = shard.decommission(node).await?;
            Ok(json_response(
                StatusCode::ACCEPTED,
                &cluster::moves_json(&moves),
            ))
        }
        RouteId::Rebalance => {
            if cluster::dry_run(query)? {
                let plans = shard.rebalance_plan();
                return Ok(json_response(StatusCode::OK, &cluster::plans_json(&plans)));
            }
            let moves = shard.rebalance().await?;
            Ok(json_response(
                StatusCode::ACCEPTED,
                &cluster::moves_json(&moves),
            ))
        }
        RouteId::Moves if method == Method::POST => {
            let (topic, partition, to) = cluster::parse_move(&body)?;
            let topic = shard.topic(&topic)?;
            let moves = shard.move_partition(&topic, partition, to).await?;
            Ok(json_response(
                StatusCode::ACCEPTED,
                &cluster::moves_json(&moves),
            ))
        }
        RouteId::Moves => {
            let view = shard.meta().view();
            let moves: Vec<_> = view.state.moves.values().cloned().collect();
            Ok(json_response(StatusCode::OK, &cluster::moves_json(&moves)))
        }
        RouteId::Topics => {
            let topics: Vec<Value> = shard
                .topics()
                .iter()
                .filter(|t| user.as_ref().is_none_or(|u| shard.sees_topic(u, &t.name)))
                .map(topic_json)
                .collect();
            Ok(json_response(StatusCode::OK, &json!({ "topics": topics })))
        }
        RouteId::Topic => {
            let name = route.topic()?;
            match method {
                Method::PUT => put_topic(shard, name, &body, user.as_deref()).await,
                Method::DELETE => {
                    if let Some(user) = &user {
                        refuse_if_a_hidden_topic_dead_letters_here(shard, user, name)?;
                    }
                    shard.delete_topic(name).await?;
                    Ok(empty_response(StatusCode::NO_CONTENT))
                }
                _ => get_topic(shard, name).await,
            }
        }
        RouteId::Produce => produce(shard, route.topic()?, request.headers(), &body).await,
        RouteId::Search => browse::search(shard, route, query).await,
        RouteId::Rates => browse::rates(shard, route, query).await,
        RouteId::ProduceBatch => {
            produce_batch(shard, route.topic()?, request.headers(), &body).await
        }
        RouteId::Consume => consume(shard, route.topic()?, request.headers(), &body).await,
        RouteId::Browse => browse::browse(shard, route, query).await,
        RouteId::Ack
        | RouteId::AckBatch
        | RouteId::Nack
        | RouteId::NackBatch
        | RouteId::Extend
        | RouteId::ExtendBatch => {
            let (kind, batch) = route.settle().ok_or_else(|| route.broken("settle kind"))?;
            settle(shard, route.topic()?, kind, batch, &body).await
        }
        RouteId::Children => {
            let parent = shard.topic(route.topic()?)?;
            let children = shard.child_statuses(&parent).await?;
            Ok(json_response(
                StatusCode::OK,
                &json!({ "children": children_json(&children) }),
            ))
        }
        RouteId::Child => {
            let (parent, child) = (route.topic()?, route.child()?);
            if method == Method::DELETE {
                shard.delete_child(parent, child).await?;
                return Ok(empty_response(StatusCode::NO_CONTENT));
            }
            // A missing parent is 404 whatever the body holds.
            shard.topic(parent)?;
            put_child(shard, parent, child, &body, user.as_deref()).await
        }
        RouteId::Redrive if method == Method::POST => {
            let dlq = route.topic()?;
            // A missing topic is 404 whatever the body holds.
            shard.topic(dlq)?;
            let request = RedriveRequest::parse(&body)?;
            validate_topic_name(&request.to).map_err(|e| {
                ApiError::new(ErrorCode::InvalidRequest, format!("to: {}", e.message))
            })?;
            // Messages are written to `to`: that needs `produce` on it.
            if let Some(user) = &user {
                shard.authorize(user, Action::Produce, Some(&request.to))?;
            }
            let (id, redrive) = shard.start_redrive(dlq, request).await?;
            let listed = RedriveStatus {
                id,
                redrive,
                remaining: 0,
            };
            Ok(json_response(StatusCode::ACCEPTED, &redrive_json(&listed)))
        }
        RouteId::Redrive => {
            let topic = shard.topic(route.topic()?)?;
            let tasks: Vec<Value> = shard
                .redrives(&topic)
                .await?
                .iter()
                .map(redrive_json)
                .collect();
            Ok(json_response(StatusCode::OK, &json!({ "tasks": tasks })))
        }
        RouteId::RedriveTask => {
            shard.cancel_redrive(route.topic()?, route.task()?).await?;
            Ok(empty_response(StatusCode::NO_CONTENT))
        }
        RouteId::Schemas => Ok(json_response(StatusCode::OK, &schemas_json(shard))),
        RouteId::Schema => {
            let name = route.schema()?;
            schema(shard, &method, name, &body).await
        }
        RouteId::Users => Ok(json_response(StatusCode::OK, &users_json(shard))),
        RouteId::User => {
            let name = route.user()?;
            put_or_delete_user(shard, &method, name, &body).await
        }
        RouteId::UserTokens => {
            let name = route.user()?;
            let (token, created_at_ms) = shard.add_token(name).await?;
            Ok(json_response(
                StatusCode::CREATED,
                &json!({"id": token.id, "token": token.token, "created_at_ms": created_at_ms}),
            ))
        }
        RouteId::UserToken => {
            let (name, id) = (route.user()?, route.token()?);
            let held = shard
                .state()
                .state
                .tokens
                .get(id)
                .is_some_and(|t| t.user == name);
            if !held {
                return Err(no_such("token", id));
            }
            shard.revoke_token(name, id).await?;
            Ok(empty_response(StatusCode::NO_CONTENT))
        }
        RouteId::UserGrants => {
            let name = route.user()?;
            grants(shard, &method, name, &body).await
        }
    }
}
