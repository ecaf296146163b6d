//! The HTTP API (docs/http-api.md): routing, request parsing and JSON answers.
//!
//! Checks run in the order black-box tests rely on: the route (404
//! `not_found`), the method (405 with `Allow`), the topic name (400
//! `invalid_topic_name`), the topic's existence (404 `topic_not_found`, at
//! once), then the body.

use std::rc::Rc;

mod cluster;
pub mod openapi;

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

/// What a route needs of its caller when `auth.enabled` is on
/// (docs/security.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing: health and metrics.
    Open,
    /// Any authenticated user.
    Anyone,
    /// The action's grant on the route's topic.
    Topic(Action),
    /// The `cluster` grant.
    Cluster,
    /// The user the route names, or the `cluster` grant.
    SelfOrCluster,
}

/// One route: its `label` (the metrics' `route` label), its path with
/// `{name}` for a segment it takes, and its methods with what each needs.
#[derive(Debug)]
pub struct RouteSpec {
    pub label: &'static str,
    pub path: &'static str,
    pub methods: &'static [(Method, Need)],
}

const fn spec(
    label: &'static str,
    path: &'static str,
    methods: &'static [(Method, Need)],
) -> RouteSpec {
    RouteSpec {
        label,
        path,
        methods,
    }
}

/// Every route of this build: the router matches paths against these and
/// nothing else, so a route is in this list or does not exist.
pub const ROUTES: &[RouteSpec] = &[
    spec("healthz", "/healthz", &[(Method::GET, Need::Open)]),
    spec("readyz", "/readyz", &[(Method::GET, Need::Open)]),
    spec("metrics", "/metrics", &[(Method::GET, Need::Open)]),
    spec("openapi", "/v1/openapi.json", &[(Method::GET, Need::Open)]),
    spec("cluster", "/v1/cluster", &[(Method::GET, Need::Anyone)]),
    spec(
        "cluster_nodes",
        "/v1/cluster/nodes",
        &[(Method::POST, Need::Cluster)],
    ),
    spec(
        "cluster_node",
        "/v1/cluster/nodes/{node}",
        &[(Method::DELETE, Need::Cluster)],
    ),
    spec(
        "decommission",
        "/v1/cluster/nodes/{node}/decommission",
        &[(Method::POST, Need::Cluster)],
    ),
    spec(
        "rebalance",
        "/v1/cluster/rebalance",
        &[(Method::POST, Need::Cluster)],
    ),
    spec(
        "moves",
        "/v1/cluster/moves",
        &[(Method::GET, Need::Anyone), (Method::POST, Need::Cluster)],
    ),
    spec("topics", "/v1/topics", &[(Method::GET, Need::Anyone)]),
    spec(
        "topic",
        "/v1/topics/{topic}",
        &[
            (Method::GET, Need::Topic(Action::Admin)),
            (Method::PUT, Need::Topic(Action::Admin)),
            (Method::DELETE, Need::Topic(Action::Admin)),
        ],
    ),
    spec(
        "produce",
        "/v1/topics/{topic}/messages",
        &[(Method::POST, Need::Topic(Action::Produce))],
    ),
    spec(
        "produce_batch",
        "/v1/topics/{topic}/messages/batch",
        &[(Method::POST, Need::Topic(Action::Produce))],
    ),
    spec(
        "consume",
        "/v1/topics/{topic}/consume",
        &[(Method::POST, Need::Topic(Action::Consume))],
    ),
    spec(
        "ack",
        "/v1/topics/{topic}/ack",
        &[(Method::POST, Need::Topic(Action::Consume))],
    ),
    spec(
        "ack_batch",
        "/v1/topics/{topic}/ack/batch",
        &[(Method::POST, Need::Topic(Action::Consume))],
    ),
    spec(
        "nack",
        "/v1/topics/{topic}/nack",
        &[(Method::POST, Need::Topic(Action::Consume))],
    ),
    spec(
        "nack_batch",
        "/v1/topics/{topic}/nack/batch",
        &[(Method::POST, Need::Topic(Action::Consume))],
    ),
    spec(
        "extend",
        "/v1/topics/{topic}/extend",
        &[(Method::POST, Need::Topic(Action::Consume))],
    ),
    spec(
        "extend_batch",
        "/v1/topics/{topic}/extend/batch",
        &[(Method::POST, Need::Topic(Action::Consume))],
    ),
    spec(
        "children",
        "/v1/topics/{topic}/children",
        &[(Method::GET, Need::Topic(Action::Admin))],
    ),
    spec(
        "child",
        "/v1/topics/{topic}/children/{child}",
        &[
            (Method::PUT, Need::Topic(Action::Admin)),
            (Method::DELETE, Need::Topic(Action::Admin)),
        ],
    ),
    spec(
        "redrive",
        "/v1/topics/{topic}/redrive",
        &[
            (Method::POST, Need::Topic(Action::Admin)),
            (Method::GET, Need::Topic(Action::Admin)),
        ],
    ),
    spec(
        "redrive_task",
        "/v1/topics/{topic}/redrive/{task}",
        &[(Method::DELETE, Need::Topic(Action::Admin))],
    ),
    spec("schemas", "/v1/schemas", &[(Method::GET, Need::Anyone)]),
    spec(
        "schema",
        "/v1/schemas/{schema}",
        &[
            (Method::GET, Need::Anyone),
            (Method::PUT, Need::Cluster),
            (Method::DELETE, Need::Cluster),
        ],
    ),
    spec("users", "/v1/users", &[(Method::GET, Need::Cluster)]),
    spec(
        "user",
        "/v1/users/{user}",
        &[
            (Method::PUT, Need::Cluster),
            (Method::DELETE, Need::Cluster),
        ],
    ),
    spec(
        "user_tokens",
        "/v1/users/{user}/tokens",
        &[(Method::POST, Need::SelfOrCluster)],
    ),
    spec(
        "user_token",
        "/v1/users/{user}/tokens/{token}",
        &[(Method::DELETE, Need::SelfOrCluster)],
    ),
    spec(
        "user_grants",
        "/v1/users/{user}/grants",
        &[(Method::GET, Need::Cluster), (Method::PUT, Need::Cluster)],
    ),
];

/// A request's route: its spec and the segments it took.
#[derive(Debug, Clone, Copy)]
struct Route<'a> {
    spec: &'static RouteSpec,
    topic: Option<&'a str>,
    child: Option<&'a str>,
    task: Option<&'a str>,
    schema: Option<&'a str>,
    user: Option<&'a str>,
    token: Option<&'a str>,
    node: Option<&'a str>,
}

impl Route<'_> {
    /// What this route needs for `method`, if the route takes it.
    fn need(&self, method: &Method) -> Option<Need> {
        self.spec
            .methods
            .iter()
            .find(|(m, _)| m == method)
            .map(|(_, need)| *need)
    }

    fn allowed(&self) -> Vec<&'static str> {
        self.spec.methods.iter().map(|(m, _)| m.as_str()).collect()
    }

    /// The settle kind and whether it is a batch, for the settle routes.
    fn settle(&self) -> Option<(SettleKind, bool)> {
        let (kind, batch) = match self.spec.label.split_once('_') {
            Some((kind, "batch")) => (kind, true),
            _ => (self.spec.label, false),
        };
        let kind = match kind {
            "ack" => SettleKind::Ack,
            "nack" => SettleKind::Nack,
            "extend" => SettleKind::Extend,
            _ => return None,
        };
        Some((kind, batch))
    }
}

fn route(path: &str) -> Option<Route<'_>> {
    let path = path.trim_start_matches('/');
    let count = path.split('/').count();
    ROUTES.iter().find_map(|spec| {
        let pattern = spec.path.trim_start_matches('/');
        if pattern.split('/').count() != count {
            return None;
        }
        let mut route = Route {
            spec,
            topic: None,
            child: None,
            task: None,
            schema: None,
            user: None,
            token: None,
            node: None,
        };
        for (want, got) in pattern.split('/').zip(path.split('/')) {
            match want {
                "{topic}" => route.topic = Some(got),
                "{child}" => route.child = Some(got),
                "{task}" => route.task = Some(got),
                "{schema}" => route.schema = Some(got),
                "{user}" => route.user = Some(got),
                "{token}" => route.token = Some(got),
                "{node}" => route.node = Some(got),
                literal if literal == got => {}
                _ => return None,
            }
        }
        Some(route)
    })
}

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
    let matched = route(path);
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
    let label = matched.map_or("unknown", |r| r.spec.label);
    record_request(label, response.status().as_u16(), std::time::Duration::ZERO);
    Some(response)
}

/// What a 401 says a node takes.
const WWW_AUTHENTICATE: &str = r#"Basic realm="narad", Bearer realm="narad""#;

/// Answers one request.
pub async fn handle(shard: Rc<Shard>, request: HttpRequest) -> HttpResponse {
    let started = std::time::Instant::now();
    let path = request.uri().path().to_string();
    let matched = route(&path);
    let label = matched.map_or("unknown", |r| r.spec.label);
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
            Need::Cluster => shard.authorize(user, Action::Cluster, None)?,
            Need::SelfOrCluster if route.user == Some(user.as_str()) => {}
            Need::SelfOrCluster => shard.authorize(user, Action::Cluster, None)?,
        }
    }
    let body = request.body().clone();
    let method = request.method().clone();
    match (route.spec.label, route.topic) {
        ("healthz", _) => Ok(json_response(StatusCode::OK, &json!({"status": "ok"}))),
        ("readyz", _) => match shard.not_ready().await {
            // docs/http-api.md: 503 whatever the reason, in the error shape with its code.
            Some(error) => {
                let mut response = error_response(&error);
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                Ok(response)
            }
            None => Ok(json_response(StatusCode::OK, &json!({"status": "ready"}))),
        },
        ("metrics", _) => Ok(metrics(shard).await),
        ("openapi", _) => {
            let mut response = hyper::Response::new(Full::new(openapi::document_json()?));
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            Ok(response)
        }
        ("cluster", _) => Ok(json_response(StatusCode::OK, &cluster_json(shard))),
        ("cluster_nodes", _) => {
            let (id, addr) = cluster::parse_admit(&body)?;
            shard.admit_node(id, addr).await?;
            Ok(json_response(StatusCode::OK, &cluster_json(shard)))
        }
        ("cluster_node", _) => {
            shard.remove_node(cluster::node_id(route.node)?).await?;
            Ok(empty_response(StatusCode::NO_CONTENT))
        }
        ("decommission", _) => {
            let moves = shard.decommission(cluster::node_id(route.node)?).await?;
            Ok(json_response(
                StatusCode::ACCEPTED,
                &cluster::moves_json(&moves),
            ))
        }
        ("rebalance", _) => {
            let moves = shard.rebalance().await?;
            Ok(json_response(
                StatusCode::ACCEPTED,
                &cluster::moves_json(&moves),
            ))
        }
        ("moves", _) if method == Method::POST => {
            let (topic, partition, to) = cluster::parse_move(&body)?;
            let topic = shard.topic(&topic)?;
            let moves = shard.move_partition(&topic, partition, to).await?;
            Ok(json_response(
                StatusCode::ACCEPTED,
                &cluster::moves_json(&moves),
            ))
        }
        ("moves", _) => {
            let view = shard.meta().view();
            let moves: Vec<_> = view.state.moves.values().cloned().collect();
            Ok(json_response(StatusCode::OK, &cluster::moves_json(&moves)))
        }
        ("topics", _) => {
            let topics: Vec<Value> = shard
                .topics()
                .iter()
                .filter(|t| user.as_ref().is_none_or(|u| shard.sees_topic(u, &t.name)))
                .map(topic_json)
                .collect();
            Ok(json_response(StatusCode::OK, &json!({ "topics": topics })))
        }
        ("topic", Some(name)) => match method {
            Method::PUT => put_topic(shard, name, &body, user.as_deref()).await,
            Method::DELETE => {
                if let Some(user) = &user {
                    refuse_if_a_hidden_topic_dead_letters_here(shard, user, name)?;
                }
                shard.delete_topic(name).await?;
                Ok(empty_response(StatusCode::NO_CONTENT))
            }
            _ => get_topic(shard, name).await,
        },
        ("produce", Some(name)) => {
            let topic = shard.topic(name)?;
            let key = produce_key(request.headers())?;
            let idempotency_key = idempotency_key(request.headers())?;
            // One exact-size copy: the request's buffer is hyper's read
            // buffer, which the tail cache must not keep alive.
            let value = Bytes::copy_from_slice(&body);
            let outcome = shard
                .produce(
                    &topic,
                    vec![Incoming {
                        key,
                        value,
                        idempotency_key,
                        partition: None,
                    }],
                )
                .await?;
            let Some(id) = outcome.ids.into_iter().next() else {
                return Err(ApiError::new(
                    ErrorCode::Internal,
                    "a produce of one message answered no id",
                ));
            };
            let answer = if outcome.duplicates.is_empty() {
                json!({ "id": id })
            } else {
                json!({ "id": id, "duplicate": true })
            };
            Ok(json_response(StatusCode::ACCEPTED, &answer))
        }
        ("produce_batch", Some(name)) => {
            let topic = shard.topic(name)?;
            if request.headers().contains_key(IDEMPOTENCY_KEY_HEADER) {
                return Err(ApiError::new(
                    ErrorCode::InvalidRequest,
                    "the Narad-Idempotency-Key header names one message: give each batch item its idempotency_key instead; nothing was written",
                ));
            }
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
                .map(|i| Incoming {
                    key: i.key.map(String::into_bytes),
                    value: Bytes::from(i.value),
                    idempotency_key: i.idempotency_key.map(String::into_bytes),
                    partition: None,
                })
                .collect();
            let outcome = shard.produce(&topic, messages).await?;
            let answer = if outcome.duplicates.is_empty() {
                json!({ "ids": outcome.ids })
            } else {
                json!({ "ids": outcome.ids, "duplicates": outcome.duplicates })
            };
            Ok(json_response(StatusCode::ACCEPTED, &answer))
        }
        ("consume", Some(name)) => {
            let topic = shard.topic(name)?;
            let ConsumeBody {
                request: consume,
                ack,
            } = ConsumeBody::parse(&body)?;
            shard.check_consume(&topic, &consume)?;
            let binary = accepts_binary_messages(
                request
                    .headers()
                    .get(hyper::header::ACCEPT)
                    .map(|v| v.as_bytes()),
            );
            // Acks first: their leases end before new ones are granted,
            // and a consume dropped while it waits has still acked.
            let acks = match ack {
                Some(receipts) => {
                    let answers = shard.settle(&topic, &receipts, SettleAction::Ack).await;
                    Some(settle_results(receipts, answers, 204))
                }
                None => None,
            };
            let messages = shard.consume(&topic, consume).await?;
            let (content_type, answer) = if binary {
                (
                    MESSAGES_MEDIA_TYPE,
                    consume_response_binary(&messages, acks.as_deref()),
                )
            } else {
                (
                    "application/json",
                    consume_response_json(&topic.name, &messages, acks.as_deref()),
                )
            };
            Ok(bytes_response(StatusCode::OK, content_type, answer))
        }
        (_, Some(name)) if route.settle().is_some() => {
            let (kind, batch) = route.settle().unwrap_or((SettleKind::Ack, false));
            let topic = shard.topic(name)?;
            let settle = SettleRequest::parse(&body, kind, batch)?;
            if batch {
                Ok(settle_batch(shard, &topic, settle).await)
            } else {
                settle_one(shard, &topic, settle).await
            }
        }
        ("children", Some(name)) => {
            let parent = shard.topic(name)?;
            let children = shard.child_statuses(&parent).await?;
            Ok(json_response(
                StatusCode::OK,
                &json!({ "children": children_json(&children) }),
            ))
        }
        ("child", Some(parent)) => {
            let child = route.child.unwrap_or_default();
            if method == Method::DELETE {
                shard.delete_child(parent, child).await?;
                return Ok(empty_response(StatusCode::NO_CONTENT));
            }
            // A missing parent is 404 whatever the body holds.
            shard.topic(parent)?;
            put_child(shard, parent, child, &body, user.as_deref()).await
        }
        ("redrive", Some(dlq)) if method == Method::POST => {
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
        ("redrive", Some(dlq)) => {
            let topic = shard.topic(dlq)?;
            let tasks: Vec<Value> = shard
                .redrives(&topic)
                .await?
                .iter()
                .map(redrive_json)
                .collect();
            Ok(json_response(StatusCode::OK, &json!({ "tasks": tasks })))
        }
        ("redrive_task", Some(dlq)) => {
            shard
                .cancel_redrive(dlq, route.task.unwrap_or_default())
                .await?;
            Ok(empty_response(StatusCode::NO_CONTENT))
        }
        ("schemas", _) => Ok(json_response(StatusCode::OK, &schemas_json(shard))),
        ("schema", _) => {
            let name = route.schema.unwrap_or_default();
            schema(shard, &method, name, &body).await
        }
        ("users", _) => Ok(json_response(StatusCode::OK, &users_json(shard))),
        ("user", _) => {
            let name = route.user.unwrap_or_default();
            put_or_delete_user(shard, &method, name, &body).await
        }
        ("user_tokens", _) => {
            let name = route.user.unwrap_or_default();
            let (token, created_at_ms) = shard.add_token(name).await?;
            Ok(json_response(
                StatusCode::CREATED,
                &json!({"id": token.id, "token": token.token, "created_at_ms": created_at_ms}),
            ))
        }
        ("user_token", _) => {
            let (name, id) = (
                route.user.unwrap_or_default(),
                route.token.unwrap_or_default(),
            );
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
        ("user_grants", _) => {
            let name = route.user.unwrap_or_default();
            grants(shard, &method, name, &body).await
        }
        (label, _) => Err(ApiError::new(
            ErrorCode::Internal,
            format!("route {label} has no handler"),
        )),
    }
}

/// The idempotency key of a single produce, from its
/// `Narad-Idempotency-Key` header (checked: 1 to 256 printable ASCII bytes).
fn idempotency_key(headers: &hyper::HeaderMap) -> Result<Option<Vec<u8>>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY_HEADER) else {
        return Ok(None);
    };
    check_idempotency_key("the Narad-Idempotency-Key header", value.as_bytes())?;
    Ok(Some(value.as_bytes().to_vec()))
}

/// The header of idempotent produce (lower case, as hyper names headers).
const IDEMPOTENCY_KEY_HEADER: &str = "narad-idempotency-key";

/// The key of a single produce, from its `Narad-Key` header: UTF-8 (a key
/// comes back as a JSON string) and at most [`KEY_BYTES_MAX`] bytes.
fn produce_key(headers: &hyper::HeaderMap) -> Result<Option<Vec<u8>>, ApiError> {
    let Some(value) = headers.get("narad-key") else {
        return Ok(None);
    };
    let key = std::str::from_utf8(value.as_bytes()).map_err(|_| {
        ApiError::new(
            ErrorCode::InvalidRequest,
            "the Narad-Key header must be UTF-8 text; send a binary key base64-encoded",
        )
    })?;
    if key.len() > KEY_BYTES_MAX {
        return Err(key_too_long("the Narad-Key header", key.len()));
    }
    Ok(Some(key.as_bytes().to_vec()))
}

/// A topic that is the dead-letter topic of another cannot be deleted
/// (409); when the user cannot see that other topic, the answer does not
/// name it.
fn refuse_if_a_hidden_topic_dead_letters_here(
    shard: &Shard,
    user: &str,
    name: &str,
) -> Result<(), ApiError> {
    let view = shard.state();
    let hidden = view.state.topics.values().any(|t| {
        t.config.dead_letter_topic.as_deref() == Some(name) && !shard.sees_topic(user, &t.name)
    });
    if hidden {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!("topic {name:?} is the dead-letter topic of another topic"),
        ));
    }
    Ok(())
}

/// `{schema}` in a path: a topic name's characters.
fn validate_schema_name(name: &str) -> Result<(), ApiError> {
    validate_topic_name(name).map_err(|_| {
        let shown: String = name.chars().take(64).collect();
        ApiError::new(
            ErrorCode::InvalidRequest,
            format!("schema name {shown:?} must be 1 to 249 characters of A-Z, a-z, 0-9, '.', '_' or '-'"),
        )
    })
}

fn schemas_json(shard: &Shard) -> Value {
    let view = shard.state();
    let schemas: Vec<Value> = view
        .state
        .schemas
        .iter()
        .map(|(name, schema)| json!({"name": name, "version": schema.latest().0}))
        .collect();
    json!({ "schemas": schemas })
}

fn no_such(what: &str, name: &str) -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        format!("{what} {name:?} does not exist"),
    )
}

async fn schema(
    shard: &Shard,
    method: &Method,
    name: &str,
    body: &[u8],
) -> Result<HttpResponse, ApiError> {
    match *method {
        Method::PUT => {
            let document = check_document(body)?;
            let (version, created) = shard.put_schema(name, document).await?;
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(json_response(
                status,
                &json!({"name": name, "version": version}),
            ))
        }
        Method::DELETE => {
            if !shard.state().state.schemas.contains_key(name) {
                return Err(no_such("schema", name));
            }
            shard.delete_schema(name).await?;
            Ok(empty_response(StatusCode::NO_CONTENT))
        }
        _ => {
            let view = shard.state();
            let schema = view
                .state
                .schemas
                .get(name)
                .ok_or_else(|| no_such("schema", name))?;
            let (version, document) = schema.latest();
            let document: Value = serde_json::from_str(document).unwrap_or(Value::Null);
            Ok(json_response(
                StatusCode::OK,
                &json!({"name": name, "version": version, "schema": document}),
            ))
        }
    }
}

fn users_json(shard: &Shard) -> Value {
    let view = shard.state();
    let state = &view.state;
    let users: Vec<Value> = state
        .users
        .iter()
        .map(|(name, user)| {
            let tokens: Vec<Value> = state
                .tokens
                .iter()
                .filter(|(_, t)| t.user == *name)
                .map(|(id, t)| json!({"id": id, "created_at_ms": t.created_at_ms}))
                .collect();
            let grants = if name == ADMIN_USER {
                json!([{"topic": "*", "actions": Action::ALL}])
            } else {
                json!(user.grants)
            };
            json!({
                "name": name,
                "grants": grants,
                "tokens": tokens,
                "created_at_ms": user.created_at_ms,
            })
        })
        .collect();
    json!({ "users": users })
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PasswordBody {
    password: String,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantsBody {
    grants: Vec<GrantBody>,
}

/// One grant as a request writes it: no other field.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantBody {
    topic: String,
    actions: Vec<Action>,
}

fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8], shape: &str) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        // serde's own wording for a field the type does not have.
        let code = if e.to_string().starts_with("unknown field") {
            ErrorCode::UnknownField
        } else {
            ErrorCode::InvalidRequest
        };
        ApiError::new(code, format!("the body must be {shape}: {e}"))
    })
}

async fn put_or_delete_user(
    shard: &Shard,
    method: &Method,
    name: &str,
    body: &[u8],
) -> Result<HttpResponse, ApiError> {
    if *method == Method::DELETE {
        if !shard.state().state.users.contains_key(name) {
            return Err(no_such("user", name));
        }
        shard.delete_user(name).await?;
        return Ok(empty_response(StatusCode::NO_CONTENT));
    }
    let PasswordBody { password } = parse_body(body, r#"{"password": "..."}"#)?;
    validate_password(&password)?;
    let created = shard.put_user(name, password).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json_response(status, &json!({ "name": name })))
}

async fn grants(
    shard: &Shard,
    method: &Method,
    name: &str,
    body: &[u8],
) -> Result<HttpResponse, ApiError> {
    if *method == Method::PUT {
        let GrantsBody { grants } = parse_body(
            body,
            r#"{"grants": [{"topic": "...", "actions": ["produce" | "consume" | "admin" | "cluster"]}]}"#,
        )?;
        let grants: Vec<Grant> = grants
            .into_iter()
            .map(|g| Grant {
                topic: g.topic,
                actions: g.actions,
            })
            .collect();
        validate_grants(&grants)?;
        if !shard.state().state.users.contains_key(name) {
            return Err(no_such("user", name));
        }
        shard.set_grants(name, grants.clone()).await?;
        return Ok(json_response(StatusCode::OK, &json!({ "grants": grants })));
    }
    let view = shard.state();
    let user = view
        .state
        .users
        .get(name)
        .ok_or_else(|| no_such("user", name))?;
    let grants = if name == ADMIN_USER {
        json!([{"topic": "*", "actions": Action::ALL}])
    } else {
        json!(user.grants)
    };
    Ok(json_response(StatusCode::OK, &json!({ "grants": grants })))
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
    let results = settle_results(settle.receipts, answers, ok_status);
    json_response(StatusCode::OK, &SettleBatchResponse { results })
}

/// One result per receipt, in order, as the batch forms answer them.
fn settle_results(
    receipts: Vec<String>,
    answers: crate::rpc::Settled,
    ok_status: u16,
) -> Vec<SettleResult> {
    receipts
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
        .collect()
}

/// `GET /v1/cluster`: the members, their state as the controller last
/// judged it (through Raft), and how many partitions each owns.
fn cluster_json(shard: &Shard) -> Value {
    let meta = shard.meta();
    let view = meta.view();
    let state = &view.state;
    let learners = meta.learners();
    let nodes: Vec<Value> = meta
        .members()
        .into_iter()
        .map(|(id, addr)| {
            let record = state.nodes.get(&id);
            let alive = record.is_none_or(|record| record.alive);
            let partitions = state
                .topics
                .values()
                .flat_map(|t| t.owners.iter())
                .filter(|owner| **owner == id)
                .count();
            json!({
                "id": id,
                "addr": addr,
                "kafka_addr": state.kafka_addrs.get(&id),
                "state": cluster::node_state(alive, record.is_some_and(|r| r.decommissioning), learners.contains(&id), partitions),
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
    let mut value = json!({
        "name": topic.name,
        "partitions": topic.config.partitions,
        "visibility_timeout_ms": topic.config.visibility_timeout_ms,
        "retention_ms": topic.config.retention_ms,
        "max_deliveries": topic.config.max_deliveries,
        "dead_letter_topic": topic.config.dead_letter_topic,
        "schema": topic.config.schema,
        "max_message_bytes": topic.config.max_message_bytes,
        "idempotency_window_ms": topic.config.idempotency_window_ms,
    });
    if let Some(parent) = &topic.parent {
        value["parent"] = json!(parent);
    }
    value
}

async fn topic_json_with_stats(shard: &Shard, topic: &Topic) -> Result<Value, ApiError> {
    let (stats, copies) = shard.partition_stats(topic).await?;
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
    value["children"] = json!(children_json(&child_statuses(topic, &copies)));
    Ok(value)
}

/// A redrive as `GET /v1/topics/{dlq}/redrive` lists it.
fn redrive_json(listed: &RedriveStatus) -> Value {
    let redrive = &listed.redrive;
    let mut value = json!({
        "id": listed.id,
        "to": redrive.to,
        "moved": redrive.moved,
        "remaining": listed.remaining,
        "state": redrive.state.name(),
        "rate_per_s": redrive.rate_per_s,
        "max_messages": redrive.max_messages,
        "node": redrive.node,
        "created_at_ms": redrive.created_at_ms,
    });
    if let RedriveState::Failed(why) = &redrive.state {
        value["error"] = json!(why);
    }
    value
}

/// Children as `GET /v1/topics/{parent}/children` lists them.
fn children_json(children: &[ChildStatus]) -> Vec<Value> {
    children
        .iter()
        .map(|c| {
            let mut value = json!({
                "name": c.name,
                "kind": c.kind.name(),
                "lag_messages": c.lag_messages,
                "lag_seconds": c.lag_seconds,
                "dropped_messages": c.dropped_messages,
                "state": c.state,
                "last_error": c.last_error,
            });
            match &c.kind {
                ChildKind::Delay { delay_ms } => value["delay_ms"] = json!(delay_ms),
                ChildKind::Remote { remote } => value["remote"] = remote_json(remote),
                ChildKind::Fanout | ChildKind::Replica => {}
            }
            value
        })
        .collect()
}

async fn get_topic(shard: &Shard, name: &str) -> Result<HttpResponse, ApiError> {
    let topic = shard.topic(name)?;
    Ok(json_response(
        StatusCode::OK,
        &topic_json_with_stats(shard, &topic).await?,
    ))
}

/// The retention floor and the largest `max_message_bytes` a topic takes.
pub(crate) fn topic_bounds(shard: &Shard) -> (u64, u64) {
    let settings = shard.settings();
    (
        settings.topics.retention_floor_ms,
        settings.http.max_batch_bytes.max(MAX_MESSAGE_BYTES_DEFAULT),
    )
}

/// A remote child's target as answers show it: never its token.
fn remote_json(remote: &RemoteTarget) -> Value {
    json!({
        "url": remote.url,
        "topic": remote.topic,
        "rate_bytes_per_s": remote.rate_bytes_per_s,
    })
}

/// `PUT /v1/topics/{parent}/children/{child}`; a dead-letter topic of the
/// child needs `produce` on it, as for any topic.
async fn put_child(
    shard: &Shard,
    parent: &str,
    child: &str,
    body: &[u8],
    user: Option<&str>,
) -> Result<HttpResponse, ApiError> {
    let (floor, max_message) = topic_bounds(shard);
    let request = ChildRequest::parse(body, floor, max_message)?;
    if let (Some(user), Some(Some(dlq))) = (user, &request.topic.dead_letter_topic) {
        shard.authorize(user, Action::Produce, Some(dlq))?;
    }
    let status = |created| {
        if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        }
    };
    if let ChildKindName::Remote(remote) = request.kind {
        let (created, link) = shard.put_remote_child(parent, child, remote).await?;
        let ChildKind::Remote { remote } = &link.kind else {
            return Err(ApiError::new(
                ErrorCode::Internal,
                "the metastore kept a remote child as another kind",
            ));
        };
        let answer = json!({
            "name": child,
            "parent": parent,
            "kind": "remote",
            "remote": remote_json(remote),
        });
        return Ok(json_response(status(created), &answer));
    }
    let (created, topic) = shard.put_child(parent, child, request).await?;
    Ok(json_response(status(created), &topic_json(&topic)))
}

/// `PUT /v1/topics/{topic}`; with auth on, naming a dead-letter topic
/// also needs `produce` on it (dead letters are written there), so nobody
/// learns of, or writes to, a topic through another's settings.
async fn put_topic(
    shard: &Shard,
    name: &str,
    body: &[u8],
    user: Option<&str>,
) -> Result<HttpResponse, ApiError> {
    let (floor, max_message) = topic_bounds(shard);
    let patch = TopicPatch::parse(body, floor, max_message)?;
    if let (Some(user), Some(Some(dlq))) = (user, &patch.dead_letter_topic) {
        shard.authorize(user, Action::Produce, Some(dlq))?;
    }
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
    // Every topic with a dead-letter topic has its counter from the start,
    // at 0, so an alert on its increase sees the first dead letter.
    for topic in shard.topics() {
        if topic.config.dead_letter_topic.is_some() {
            metrics::counter!(DEAD_LETTERED_TOTAL, "topic" => topic.name).increment(0);
        }
    }
    // Let go early by the node's table or by a shard's WAL (which then
    // does not hold it across a restart).
    let (keys_held, table_forgotten) = shard.idempotency_keys();
    let wal_forgotten: u64 = shards
        .iter()
        .map(|g| g.wal_keys_forgotten + g.owner_keys_forgotten)
        .sum();
    metrics::counter!(IDEMPOTENCY_KEYS_FORGOTTEN_TOTAL).absolute(table_forgotten + wal_forgotten);
    let mut out = shard.render_metrics();
    let mut gauge = |name: &str, samples: Vec<(String, f64)>| {
        let help = crate::metric_names::help(name);
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for (labels, value) in samples {
            // Prometheus spells infinity `+Inf`, Rust `inf`.
            let value = if value == f64::INFINITY {
                "+Inf".to_string()
            } else {
                value.to_string()
            };
            out.push_str(&format!("{name}{labels} {value}\n"));
        }
    };
    let failed = shards.iter().any(|g| g.wal_failure.is_some());
    gauge(
        INGRESS_WAL_FAILED,
        vec![(String::new(), if failed { 1.0 } else { 0.0 })],
    );
    let acks_failed = shards.iter().any(|g| g.ack_state_failure.is_some());
    gauge(
        CONSUMER_STATE_FAILED,
        vec![(String::new(), if acks_failed { 1.0 } else { 0.0 })],
    );
    let per_shard = |f: &dyn Fn(&ShardGauges) -> f64| -> Vec<(String, f64)> {
        shards
            .iter()
            .map(|g| (format!("{{shard=\"{}\"}}", g.shard), f(g)))
            .collect()
    };
    gauge(WAL_USED_BYTES, per_shard(&|g| g.wal_used_bytes as f64));
    gauge(IDEMPOTENCY_KEYS, vec![(String::new(), keys_held as f64)]);
    gauge(
        DISPATCHER_PENDING_RECORDS,
        per_shard(&|g| g.dispatcher_pending as f64),
    );
    gauge(
        RAFT_IS_LEADER,
        vec![(
            String::new(),
            if shard.meta().is_leader() { 1.0 } else { 0.0 },
        )],
    );
    gauge(
        CONNECTIONS_OPEN,
        vec![(String::new(), shard.http_budget().connections_open() as f64)],
    );
    gauge(
        HTTP_BUFFERED_BODY_BYTES,
        vec![(
            String::new(),
            shard.http_budget().buffered_body_bytes() as f64,
        )],
    );
    gauge(
        NODE_ALIVE,
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
    gauge(RAFT_TERM, vec![(String::new(), shard.meta().term() as f64)]);
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
        series(&|s| s.high_watermark as f64),
    );
    gauge(PARTITION_FRONTIER, series(&|s| s.frontier as f64));
    gauge(
        PARTITION_AVAILABLE_MESSAGES,
        series(&|s| s.available as f64),
    );
    gauge(PARTITION_IN_FLIGHT, series(&|s| s.in_flight as f64));
    gauge(
        PARTITION_OLDEST_UNACKED_AGE_SECONDS,
        series(&|s| s.oldest_unacked_age_ms as f64 / 1000.0),
    );
    // Each child's copies of this node's parent partitions, summed.
    let mut copies: std::collections::BTreeMap<(&str, &str), (u64, u64, u64)> =
        std::collections::BTreeMap::new();
    for copy in shards.iter().flat_map(|g| &g.copies) {
        let entry = copies
            .entry((copy.parent.as_str(), copy.child.as_str()))
            .or_default();
        entry.0 += copy.lag_messages;
        entry.1 = entry.1.max(copy.lag_ms);
        entry.2 += copy.dropped;
    }
    let per_child = |f: &dyn Fn(&(u64, u64, u64)) -> f64| -> Vec<(String, f64)> {
        copies
            .iter()
            .map(|((parent, child), v)| {
                (format!("{{parent=\"{parent}\",child=\"{child}\"}}"), f(v))
            })
            .collect()
    };
    let lag_messages = per_child(&|v| v.0 as f64);
    let lag_seconds = per_child(&|v| v.1 as f64 / 1000.0);
    let dropped = per_child(&|v| v.2 as f64);
    gauge(FANOUT_CHILD_LAG_MESSAGES, lag_messages);
    gauge(FANOUT_CHILD_LAG_SECONDS, lag_seconds);
    // The least headroom over this node's partitions of each remote child.
    let mut headroom: std::collections::BTreeMap<(&str, &str), u64> =
        std::collections::BTreeMap::new();
    for (parent, child, ms) in shards.iter().flat_map(|g| &g.remote_headroom) {
        let least = headroom
            .entry((parent.as_str(), child.as_str()))
            .or_insert(u64::MAX);
        *least = (*least).min(*ms);
    }
    gauge(
        REMOTE_CHILD_HEADROOM_SECONDS,
        headroom
            .iter()
            .map(|((parent, child), ms)| {
                let seconds = if *ms == u64::MAX {
                    f64::INFINITY
                } else {
                    *ms as f64 / 1000.0
                };
                (
                    format!("{{parent=\"{parent}\",child=\"{child}\"}}"),
                    seconds,
                )
            })
            .collect(),
    );
    out.push_str(&format!(
        "# HELP {FANOUT_CHILD_DROPPED_MESSAGES} {}\n# TYPE {FANOUT_CHILD_DROPPED_MESSAGES} counter\n",
        crate::metric_names::help(FANOUT_CHILD_DROPPED_MESSAGES)
    ));
    for (labels, value) in dropped {
        out.push_str(&format!(
            "{FANOUT_CHILD_DROPPED_MESSAGES}{labels} {value}\n"
        ));
    }
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
        let label = |path: &str| route(path).map(|r| r.spec.label);
        assert_eq!(label("/v1/topics"), Some("topics"));
        assert_eq!(
            route("/v1/topics/orders").and_then(|r| r.topic),
            Some("orders")
        );
        assert_eq!(
            label("/v1/topics/orders/messages/batch"),
            Some("produce_batch")
        );
        let nack = route("/v1/topics/orders/nack").expect("nack");
        assert_eq!(nack.settle(), Some((SettleKind::Nack, false)));
        let extend = route("/v1/topics/orders/extend/batch").expect("extend");
        assert_eq!(extend.settle(), Some((SettleKind::Extend, true)));
        assert_eq!(route("/v1/topics/orders").and_then(|r| r.settle()), None);
        let child = route("/v1/topics/orders/children/audit").expect("child");
        assert_eq!(
            (child.spec.label, child.topic, child.child),
            ("child", Some("orders"), Some("audit"))
        );
        assert_eq!(label("/v1/nothing"), None);
        assert_eq!(label("/healthz"), Some("healthz"));
        let token = route("/v1/users/ann/tokens/abc").expect("token");
        assert_eq!((token.user, token.token), (Some("ann"), Some("abc")));
        assert_eq!(
            route("/v1/schemas/order").and_then(|r| r.schema),
            Some("order")
        );
    }

    #[test]
    fn every_route_has_one_label_and_only_health_metrics_and_the_api_document_are_open() {
        let mut labels = std::collections::HashSet::new();
        for spec in ROUTES {
            assert!(labels.insert(spec.label), "{} twice", spec.label);
            let open = spec.methods.iter().any(|(_, need)| *need == Need::Open);
            assert_eq!(
                open,
                matches!(spec.label, "healthz" | "readyz" | "metrics" | "openapi"),
                "{}",
                spec.label
            );
        }
    }
}
