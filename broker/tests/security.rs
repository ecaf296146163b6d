//! Authentication, grants and schemas, from outside: real `narad`
//! processes with `auth.enabled`, and clients that send no, wrong, revoked
//! and insufficient credentials to every route of the API.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use hyper::Method;
use narad_broker::api::{Need, RouteId, ROUTES};
use narad_raft::state::Action;
use serde_json::{json, Value};
use support::cluster::Cluster;
use support::{eventually, Node};

const ADMIN_PASSWORD: &str = "admin-pw";
const AUTH_FLAGS: [&str; 4] = [
    "--set",
    "auth.enabled=true",
    "--set",
    "auth.admin_password=admin-pw",
];
/// How soon a change of users or grants holds on every node (the contract).
const GRANT_PROPAGATION: Duration = Duration::from_secs(1);

fn basic(user: &str, password: &str) -> String {
    let pair = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// A request with an `Authorization` header (none if empty).
fn call(node: &Node, auth: &str, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let headers: Vec<(&str, &str)> = if auth.is_empty() {
        vec![]
    } else {
        vec![("Authorization", auth)]
    };
    node.request_with(method, path, &headers, body)
}

fn admin(node: &Node, method: &str, path: &str, body: Value) -> (u16, Value) {
    call(
        node,
        &basic("admin", ADMIN_PASSWORD),
        method,
        path,
        body.to_string().as_bytes(),
    )
}

/// Creates a user with a password and grants; returns a fresh token of it.
fn user_with(node: &Node, name: &str, grants: Value) -> String {
    let (status, answer) = admin(
        node,
        "PUT",
        &format!("/v1/users/{name}"),
        json!({"password": format!("{name}-pw")}),
    );
    assert!(status == 201 || status == 200, "{status} {answer}");
    let (status, answer) = admin(
        node,
        "PUT",
        &format!("/v1/users/{name}/grants"),
        json!({ "grants": grants }),
    );
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = admin(node, "POST", &format!("/v1/users/{name}/tokens"), json!({}));
    assert_eq!(status, 201, "{answer}");
    answer["token"].as_str().expect("token").to_string()
}

fn start_secured(dir: &std::path::Path) -> Node {
    let node = Node::start(dir, &AUTH_FLAGS);
    assert!(
        eventually(Duration::from_secs(20), || {
            admin(&node, "GET", "/v1/topics", json!({})).0 == 200
        }),
        "the user admin is bootstrapped"
    );
    node
}

/// What the sweep sends to a route: the path with its segments filled, and
/// a body its right caller gets a success with.
/// The grant each route needs, as the API's "Users and grants" fixes it:
/// written here on its own, so a route whose need changed in the router
/// fails the sweep.
fn documented_need(route: RouteId, method: &Method) -> Need {
    use RouteId as R;
    let get = method == Method::GET;
    match route {
        R::Healthz | R::Readyz | R::Metrics | R::OpenApi => Need::Open,
        R::Cluster | R::Topics | R::Schemas => Need::Anyone,
        R::Schema | R::Moves if get => Need::Anyone,
        R::Moves | R::ClusterNodes | R::ClusterNode | R::Decommission | R::Rebalance => {
            Need::Cluster
        }
        R::Topic | R::Children | R::Child | R::Redrive | R::RedriveTask => {
            Need::Topic(Action::Admin)
        }
        R::Produce | R::ProduceBatch => Need::Topic(Action::Produce),
        R::Search => Need::Topic(Action::Consume),
        R::Rates => Need::TopicEither(Action::Consume, Action::Admin),
        R::Consume
        | R::Browse
        | R::Ack
        | R::Nack
        | R::Extend
        | R::AckBatch
        | R::NackBatch
        | R::ExtendBatch => Need::Topic(Action::Consume),
        R::Schema | R::Users | R::User | R::UserGrants => Need::Cluster,
        R::UserTokens | R::UserToken => Need::SelfOrCluster,
    }
}

fn fixture(
    label: &str,
    path: &str,
    method: &Method,
    caller: &str,
    token_id: &str,
) -> (String, Vec<u8>) {
    let path = path
        .replace("{topic}", "orders")
        .replace("{child}", "orders.audit")
        .replace("{task}", token_id)
        .replace("{schema}", "order")
        .replace("{user}", caller)
        .replace("{token}", token_id)
        .replace("{node}", "1")
        .replace("{partition}", "0");
    let body = match (label, method.as_str()) {
        ("cluster_nodes", _) => json!({"id": 1, "addr": "127.0.0.1:1"}),
        ("moves", "POST") => json!({"topic": "orders", "partition": 0, "to": 1}),
        ("cluster_node" | "decommission" | "rebalance" | "moves", _) => json!({}),
        (
            "healthz" | "readyz" | "metrics" | "openapi" | "cluster" | "topics" | "schemas"
            | "users",
            _,
        )
        | ("topic" | "schema" | "user_grants" | "children" | "child", "GET" | "DELETE")
        | ("user", "DELETE")
        | ("user_tokens" | "user_token", _) => json!({}),
        ("topic", "PUT") => json!({"partitions": 2}),
        ("child", "PUT") => json!({"kind": "fanout"}),
        ("redrive", "POST") => json!({"to": "orders.retry"}),
        ("redrive", "GET") | ("redrive_task", _) => json!({}),
        ("produce", _) => return (path, b"hello".to_vec()),
        ("produce_batch", _) => json!({"messages": [{"value": "a"}, {"value": "b"}]}),
        ("consume", _) => json!({"max_messages": 1}),
        ("browse", _) => json!({}),
        ("search", _) => return (format!("{path}?key=customer-1"), Vec::new()),
        ("rates", _) => return (path, Vec::new()),
        ("ack" | "nack" | "extend", _) => json!({"receipt": "not-a-receipt"}),
        ("ack_batch" | "nack_batch" | "extend_batch", _) => {
            json!({"receipts": ["not-a-receipt"]})
        }
        ("schema", "PUT") => json!({"type": "string"}),
        ("user", "PUT") => json!({"password": "changed-pw"}),
        ("user_grants", "PUT") => json!({"grants": [{"topic": "orders", "actions": ["consume"]}]}),
        _ => panic!("route {label} {method} is not in the sweep: add it"),
    };
    (path, body.to_string().into_bytes())
}

/// Every route, with no credentials, a wrong password, a revoked token, a
/// token of a user without the grant, and the right grant.
#[test]
fn every_route_answers_401_401_401_403_then_succeeds() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = start_secured(&tmp.path().join("n"));
    let no_grant = user_with(
        &node,
        "nobody",
        json!([{"topic": "elsewhere", "actions": ["produce", "consume", "admin"]}]),
    );
    // A revoked token of a user that holds every grant.
    let revoked = user_with(
        &node,
        "revoked",
        json!([{"topic": "*", "actions": ["produce", "consume", "admin", "cluster"]}]),
    );
    let (_, users) = admin(&node, "GET", "/v1/users", json!({}));
    let revoked_id = users["users"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["name"] == "revoked"))
        .and_then(|u| u["tokens"][0]["id"].as_str())
        .expect("revoked token id")
        .to_string();
    let (status, _) = admin(
        &node,
        "DELETE",
        &format!("/v1/users/revoked/tokens/{revoked_id}"),
        json!({}),
    );
    assert_eq!(status, 204);
    let mut swept = 0;
    for spec in ROUTES {
        for (method, need) in spec.methods {
            assert_eq!(
                *need,
                documented_need(spec.id, method),
                "{} {method} needs what the API says",
                spec.label()
            );
            // The right caller for this need, and the user in the path.
            // (Never the user admin, which holds every grant anyway.)
            let (right_user, right_grants) = match need {
                Need::Open | Need::Anyone | Need::SelfOrCluster => ("plain".to_string(), json!([])),
                Need::Cluster => (
                    "operator".to_string(),
                    json!([{"topic": "*", "actions": ["cluster"]}]),
                ),
                // `orders` and its child `orders.audit`.
                // A redrive also writes to its target: `produce` there.
                Need::Topic(action) if spec.id == RouteId::Redrive => (
                    format!("can-{}-redrive", action.as_str()),
                    json!([
                        {"topic": "orders*", "actions": [action.as_str()]},
                        {"topic": "orders.retry", "actions": ["produce"]}
                    ]),
                ),
                Need::Topic(action) | Need::TopicEither(action, _) => (
                    format!("can-{}", action.as_str()),
                    json!([{"topic": "orders*", "actions": [action.as_str()]}]),
                ),
            };
            let right_user = right_user.as_str();
            let right_token = user_with(&node, right_user, right_grants);
            // Fixtures the right call acts on, made again before each route.
            admin(&node, "PUT", "/v1/topics/orders", json!({"partitions": 2}));
            admin(&node, "PUT", "/v1/schemas/order", json!({"type": "object"}));
            user_with(&node, "victim", json!([]));
            // A redrive's target, and a running redrive to cancel.
            let mut redrive_id = String::new();
            if matches!(spec.id, RouteId::Redrive | RouteId::RedriveTask) {
                admin(
                    &node,
                    "PUT",
                    "/v1/topics/orders.retry",
                    json!({"partitions": 1}),
                );
                let (status, answer) = admin(
                    &node,
                    "POST",
                    "/v1/topics/orders/redrive",
                    json!({"to": "orders.retry", "rate_per_s": 1}),
                );
                assert_eq!(status, 202, "{answer}");
                redrive_id = answer["id"].as_str().unwrap_or_default().to_string();
            }
            if spec.id == RouteId::Child {
                // A child to change or delete (PUT again answers 200).
                admin(
                    &node,
                    "PUT",
                    "/v1/topics/orders/children/orders.audit",
                    json!({"kind": "fanout"}),
                );
            }
            let token_of = |name: &str| -> String {
                let (_, users) = admin(&node, "GET", "/v1/users", json!({}));
                users["users"]
                    .as_array()
                    .and_then(|u| u.iter().find(|u| u["name"] == name))
                    .and_then(|u| u["tokens"].as_array()?.last()?["id"].as_str())
                    .unwrap_or_default()
                    .to_string()
            };
            // A user acts on itself where it may; others act on `victim`.
            let path_user = if *need == Need::SelfOrCluster {
                right_user
            } else {
                "victim"
            };
            let in_path = if spec.label() == "redrive_task" {
                redrive_id.clone()
            } else {
                token_of(path_user)
            };
            let (path, body) = fixture(spec.label(), spec.path, method, path_user, &in_path);
            let m = method.as_str();
            let what = format!("{m} {path}");
            if *need == Need::Open {
                let (status, answer) = call(&node, "", m, &path, &body);
                assert_eq!(status, 200, "{what} is open: {answer}");
                swept += 1;
                continue;
            }
            for (auth, why) in [
                (String::new(), "no credentials"),
                (basic("nobody", "wrong"), "a wrong password"),
                (bearer(&revoked), "a revoked token"),
                (bearer("nrd_0000_1111"), "an unknown token"),
            ] {
                let (status, answer) = call(&node, &auth, m, &path, &body);
                assert_eq!(status, 401, "{what} with {why}: {answer}");
                assert_eq!(answer["error"]["code"], "unauthenticated", "{what}");
            }
            let (status, answer) = call(&node, &bearer(&no_grant), m, &path, &body);
            if *need == Need::Anyone {
                assert!(status < 300, "{what} is anyone's: {status} {answer}");
            } else {
                // A user acting on another user's tokens needs `cluster`.
                let (path, body) = if *need == Need::SelfOrCluster {
                    fixture(
                        spec.label(),
                        spec.path,
                        method,
                        "victim",
                        &token_of("victim"),
                    )
                } else {
                    (path.clone(), body.clone())
                };
                let (status, answer) = call(&node, &bearer(&no_grant), m, &path, &body);
                assert_eq!(status, 403, "{what} without the grant: {answer}");
                assert_eq!(answer["error"]["code"], "forbidden", "{what}");
                assert!(!answer.to_string().contains("exist"), "{answer}");
            }
            let _ = (status, answer);
            // The right grant, by password or by token.
            let auth = if swept % 2 == 0 {
                basic(right_user, &format!("{right_user}-pw"))
            } else {
                bearer(&right_token)
            };
            let (status, answer) = call(&node, &auth, m, &path, &body);
            let receipt_route = matches!(
                spec.label(),
                "ack" | "nack" | "extend" | "ack_batch" | "nack_batch" | "extend_batch"
            );
            // A lone node cannot admit a second node 1, remove itself or
            // hand its partitions to nobody: past the grant, the cluster
            // refuses.
            let lone_node_refuses = matches!(
                (spec.label(), m),
                ("cluster_nodes" | "cluster_node" | "decommission", _) | ("moves", "POST")
            );
            if receipt_route {
                assert!(
                    status == 400 || status == 200,
                    "{what} with the grant reaches the receipt check: {status} {answer}"
                );
            } else if lone_node_refuses {
                assert_eq!(
                    status, 409,
                    "{what} with the grant reaches the cluster: {answer}"
                );
            } else {
                assert!(status < 300, "{what} with the grant: {status} {answer}");
            }
            swept += 1;
        }
    }
    assert!(swept >= 25, "{swept} route-methods swept");
}

#[test]
fn a_forbidden_user_learns_nothing_of_topics_and_lists_only_its_own() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = start_secured(&tmp.path().join("n"));
    admin(
        &node,
        "PUT",
        "/v1/topics/billing.eu",
        json!({"partitions": 1}),
    );
    admin(&node, "PUT", "/v1/topics/secret", json!({"partitions": 1}));
    let token = user_with(
        &node,
        "ann",
        json!([{"topic": "billing.*", "actions": ["produce", "consume"]}]),
    );
    for topic in ["secret", "missing"] {
        let (status, answer) = call(
            &node,
            &bearer(&token),
            "POST",
            &format!("/v1/topics/{topic}/messages"),
            b"x",
        );
        assert_eq!(status, 403, "{topic}: {answer}");
        assert!(!answer.to_string().contains("exist"), "{answer}");
    }
    let (status, answer) = call(&node, &bearer(&token), "GET", "/v1/topics", b"");
    assert_eq!(status, 200);
    let names: Vec<&str> = answer["topics"]
        .as_array()
        .expect("topics")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, vec!["billing.eu"]);
    // Naming a dead-letter topic needs `produce` on it: nothing is learnt
    // of, or written to, another's topic through one's own settings.
    let owner = user_with(
        &node,
        "owner",
        json!([{"topic": "billing.*", "actions": ["admin"]}]),
    );
    let settings = json!({"partitions": 1, "max_deliveries": 3, "dead_letter_topic": "secret"});
    let (status, answer) = call(
        &node,
        &bearer(&owner),
        "PUT",
        "/v1/topics/billing.jobs",
        settings.to_string().as_bytes(),
    );
    assert_eq!(status, 403, "{answer}");
    // A topic of one's own that a hidden topic uses for dead letters cannot
    // be deleted, and the answer does not name the hidden topic.
    admin(
        &node,
        "PUT",
        "/v1/topics/billing.dlq",
        json!({"partitions": 1}),
    );
    admin(
        &node,
        "PUT",
        "/v1/topics/hidden",
        json!({"partitions": 1, "max_deliveries": 3, "dead_letter_topic": "billing.dlq"}),
    );
    let (status, answer) = call(
        &node,
        &bearer(&owner),
        "DELETE",
        "/v1/topics/billing.dlq",
        b"",
    );
    assert_eq!(status, 409, "{answer}");
    assert!(!answer.to_string().contains("hidden"), "{answer}");
    // Health, readiness and metrics are open by path: a wrong method is 405.
    let (status, _) = call(&node, "", "POST", "/healthz", b"");
    assert_eq!(status, 405);
    // A prefix grant covers a topic made later; a missing one it covers is 404.
    let (status, _) = call(
        &node,
        &bearer(&token),
        "POST",
        "/v1/topics/billing.us/messages",
        b"x",
    );
    assert_eq!(status, 404);
    // The Rust client sends its token on every request of its kept-alive
    // connections.
    let client = narad_client::blocking::Client::builder(&format!("http://{}", node.addr))
        .token(&token)
        .build()
        .expect("client");
    for _ in 0..2 {
        client
            .produce("billing.eu", None, "kept")
            .expect("produce with the token");
    }
    // Its own tokens it may make and revoke; others' it may not.
    let (status, answer) = call(&node, &bearer(&token), "POST", "/v1/users/ann/tokens", b"");
    assert_eq!(status, 201, "{answer}");
    let id = answer["id"].as_str().expect("id");
    let (status, _) = call(
        &node,
        &bearer(&token),
        "POST",
        "/v1/users/admin/tokens",
        b"",
    );
    assert_eq!(status, 403);
    let (status, _) = call(
        &node,
        &bearer(&token),
        "DELETE",
        &format!("/v1/users/ann/tokens/{id}"),
        b"",
    );
    assert_eq!(status, 204);
    // A changed password ends the old one at once; deleting the user ends
    // its tokens.
    let (status, _) = admin(&node, "PUT", "/v1/users/ann", json!({"password": "new-pw"}));
    assert_eq!(status, 200);
    let (status, _) = call(&node, &basic("ann", "ann-pw"), "GET", "/v1/topics", b"");
    assert_eq!(status, 401);
    let (status, _) = call(&node, &basic("ann", "new-pw"), "GET", "/v1/topics", b"");
    assert_eq!(status, 200);
    let (status, _) = admin(&node, "DELETE", "/v1/users/ann", json!({}));
    assert_eq!(status, 204);
    let (status, _) = call(&node, &bearer(&token), "GET", "/v1/topics", b"");
    assert_eq!(status, 401);
    let (status, answer) = admin(&node, "DELETE", "/v1/users/admin", json!({}));
    assert_eq!(status, 409, "{answer}");
    // Bad bodies are 400 in the error shape.
    for (path, body) in [
        ("/v1/users/bob", json!({"password": ""})),
        ("/v1/users/bob", json!({"pass": "x"})),
        (
            "/v1/users/admin/grants",
            json!({"grants": [{"topic": "a*b", "actions": ["produce"]}]}),
        ),
        (
            "/v1/users/admin/grants",
            json!({"grants": [{"topic": "x", "actions": ["fly"]}]}),
        ),
        (
            "/v1/users/admin/grants",
            json!({"grants": [{"topic": "x", "actions": ["cluster"]}]}),
        ),
    ] {
        let (status, answer) = admin(&node, "PUT", path, body);
        assert_eq!(status, 400, "{path}: {answer}");
        assert_eq!(answer["error"]["retry"], false);
    }
    let (status, _) = admin(
        &node,
        "PUT",
        "/v1/users/nobody-here/grants",
        json!({"grants": []}),
    );
    assert_eq!(status, 404);
    let (status, answer) = admin(&node, "PUT", "/v1/users/bob", json!({"pass": "x"}));
    assert_eq!(
        answer["error"]["code"], "unknown_field",
        "{status} {answer}"
    );
    let (status, answer) = admin(&node, "DELETE", "/v1/users/admin/tokens/nope", json!({}));
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let (status, head, _) = support::raw_request(&node.addr, "GET", "/v1/users", &[], b"");
    assert_eq!(status, 401);
    assert!(
        head.to_ascii_lowercase()
            .contains("www-authenticate: basic"),
        "{head}"
    );
    let answer = node.stderr();
    assert!(
        !answer.contains(ADMIN_PASSWORD),
        "the admin password is never logged"
    );
}

#[test]
fn the_admin_password_can_come_from_a_file_and_auth_needs_one() {
    let tmp = tempfile::tempdir().expect("tmp");
    let file = tmp.path().join("admin-password");
    std::fs::write(&file, "from-a-file\n").expect("write");
    let node = Node::start(
        &tmp.path().join("n"),
        &[
            "--set",
            "auth.enabled=true",
            "--set",
            &format!("auth.admin_password_file={}", file.display()),
        ],
    );
    assert!(eventually(Duration::from_secs(20), || {
        call(
            &node,
            &basic("admin", "from-a-file"),
            "GET",
            "/v1/users",
            b"",
        )
        .0 == 200
    }));
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_narad"));
    command
        .args(["serve", "--data-dir"])
        .arg(tmp.path().join("m"))
        .args(["--listen", "127.0.0.1:0", "--set", "auth.enabled=true"]);
    let refused = support::run_to_exit(command, Duration::from_secs(30));
    assert!(!refused.status.success());
    let says = String::from_utf8_lossy(&refused.stderr);
    assert!(says.contains("auth.admin_password"), "{says}");
}

#[test]
fn schemas_refuse_bad_messages_whole_batches_and_their_own_deletion_while_used() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    let put = |name: &str, schema: Value| node.json("PUT", &format!("/v1/schemas/{name}"), schema);
    let order = json!({
        "type": "object",
        "required": ["id", "total"],
        "properties": {"id": {"type": "integer"}, "total": {"type": "number", "minimum": 0}}
    });
    let (status, answer) = put("order", order.clone());
    assert_eq!(
        (status, answer["version"].as_u64()),
        (201, Some(1)),
        "{answer}"
    );
    let (status, answer) = put("broken", json!({"type": 12}));
    assert_eq!(status, 400, "{answer}");
    let (status, _) = node.request("PUT", "/v1/schemas/broken", b"{not json");
    assert_eq!(status, 400);
    let (status, answer) = node.json(
        "PUT",
        "/v1/topics/orders",
        json!({"partitions": 2, "schema": "nope"}),
    );
    assert_eq!(status, 400, "{answer}");
    node.create_topic("orders", json!({"partitions": 2, "schema": "order"}));
    node.produce("orders", r#"{"id": 1, "total": 9.5}"#);
    for (bad, says) in [
        (r#"{"id": 1, "total": -1}"#, "/total"),
        (r#"{"id": "one", "total": 1}"#, "/id"),
        (r#"{"id": 1}"#, "total"),
        ("not json", "not JSON"),
    ] {
        let (status, answer) = node.request("POST", "/v1/topics/orders/messages", bad.as_bytes());
        assert_eq!(status, 422, "{bad}: {answer}");
        assert_eq!(answer["error"]["code"], "schema_mismatch");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{bad}: {message}");
    }
    let batch = json!({"messages": [
        {"value": r#"{"id": 2, "total": 1}"#},
        {"value": r#"{"id": 3, "total": 2}"#},
        {"value": r#"{"id": 4, "total": "lots"}"#},
    ]});
    let (status, answer) = node.json("POST", "/v1/topics/orders/messages/batch", batch);
    assert_eq!(status, 422, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("message 2") && message.contains("/total"),
        "{message}"
    );
    // Nothing of the refused batch was accepted: once the dispatcher holds
    // nothing, the topic holds only the first message.
    assert!(eventually(Duration::from_secs(10), || {
        support::metric(&node, "narad_dispatcher_pending_records{shard=\"0\"}") == 0.0
    }));
    let (_, described) = node.request("GET", "/v1/topics/orders", b"");
    let stored: u64 = described["partition_stats"]
        .as_array()
        .expect("partitions")
        .iter()
        .filter_map(|p| p["high_watermark"].as_u64())
        .sum();
    assert_eq!(stored, 1, "{described}");
    // A new version applies to the next produce.
    let (status, answer) = put("order", json!({"type": "object", "required": ["id"]}));
    assert_eq!(
        (status, answer["version"].as_u64()),
        (200, Some(2)),
        "{answer}"
    );
    node.produce("orders", r#"{"id": 5}"#);
    let (status, answer) = node.request("GET", "/v1/schemas/order", b"");
    assert_eq!(status, 200);
    assert_eq!(answer["version"], 2);
    assert_eq!(answer["schema"]["required"], json!(["id"]));
    let (_, list) = node.request("GET", "/v1/schemas", b"");
    assert_eq!(list, json!({"schemas": [{"name": "order", "version": 2}]}));
    // In use: 409; once the topic is gone, deleted; then 404.
    let (status, answer) = node.request("DELETE", "/v1/schemas/order", b"");
    assert_eq!(status, 409, "{answer}");
    let (status, _) = node.request("DELETE", "/v1/topics/orders", b"");
    assert_eq!(status, 204);
    let (status, _) = node.request("DELETE", "/v1/schemas/order", b"");
    assert_eq!(status, 204);
    let (status, answer) = node.request("GET", "/v1/schemas/order", b"");
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
}

#[test]
fn a_schema_changed_under_load_takes_effect_without_losing_accepted_messages() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &["--shards", "2"]);
    node.json("PUT", "/v1/schemas/event", json!({"type": "object"}));
    node.create_topic("events", json!({"partitions": 4, "schema": "event"}));
    let addr = node.addr.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    // Set once the new version's PUT was answered: every shard checks
    // against it from then on.
    let changed = Arc::new(AtomicBool::new(false));
    let producer = {
        let (stop, sent, changed) = (stop.clone(), sent.clone(), changed.clone());
        std::thread::spawn(move || {
            let mut accepted = Vec::new();
            let mut refused = 0;
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                sent.fetch_add(1, Ordering::SeqCst);
                let after_change = changed.load(Ordering::SeqCst);
                // Every other message lacks `kind`, which version 2 requires.
                let body = if n % 2 == 0 {
                    format!(r#"{{"n": {n}, "kind": "a"}}"#)
                } else {
                    format!(r#"{{"n": {n}}}"#)
                };
                let (status, answer) = support::request(
                    &addr,
                    "POST",
                    "/v1/topics/events/messages",
                    &[],
                    body.as_bytes(),
                );
                match status {
                    202 => {
                        assert!(
                            n % 2 == 0 || !after_change,
                            "message {n} without kind was accepted after the change: {answer}"
                        );
                        accepted.push(answer["id"].as_str().unwrap_or_default().to_string());
                    }
                    422 => {
                        assert!(n % 2 == 1, "message {n} with kind was refused: {answer}");
                        refused += 1;
                    }
                    other => panic!("{other} {answer}"),
                }
            }
            (accepted, refused)
        })
    };
    assert!(eventually(Duration::from_secs(10), || sent
        .load(Ordering::SeqCst)
        > 50));
    let (status, _) = node.json(
        "PUT",
        "/v1/schemas/event",
        json!({"type": "object", "required": ["kind"]}),
    );
    assert_eq!(status, 200);
    changed.store(true, Ordering::SeqCst);
    // Some more produces under the new version (over both shards), then stop.
    let sent_at_change = sent.load(Ordering::SeqCst);
    assert!(eventually(Duration::from_secs(10), || sent
        .load(Ordering::SeqCst)
        > sent_at_change + 20));
    stop.store(true, Ordering::SeqCst);
    let (accepted, refused) = producer.join().expect("producer");
    assert!(refused > 0, "some messages were refused after the change");
    let stored = support::consume_all(&node, "events");
    for id in &accepted {
        assert!(stored.contains_key(id), "202'd message {id} was lost");
    }
}

#[test]
fn grants_and_revocations_hold_on_every_node_within_a_second() {
    let extra: Vec<String> = AUTH_FLAGS.iter().map(|s| s.to_string()).collect();
    let cluster = Cluster::start_each(3, |_| extra.clone());
    cluster.wait_ready(Duration::from_secs(60));
    let (first, third) = (&cluster.nodes[0], &cluster.nodes[2]);
    assert!(eventually(Duration::from_secs(20), || {
        admin(first, "PUT", "/v1/topics/orders", json!({"partitions": 3})).0 < 300
    }));
    let token = user_with(
        first,
        "ann",
        json!([{"topic": "orders", "actions": ["consume"]}]),
    );
    let produce = |node: &Node| {
        call(
            node,
            &bearer(&token),
            "POST",
            "/v1/topics/orders/messages",
            b"x",
        )
        .0
    };
    assert!(eventually(Duration::from_secs(5), || produce(third) == 403));
    let (status, _) = admin(
        first,
        "PUT",
        "/v1/users/ann/grants",
        json!({"grants": [{"topic": "orders", "actions": ["consume", "produce"]}]}),
    );
    assert_eq!(status, 200);
    let granted = Instant::now();
    assert!(
        eventually(GRANT_PROPAGATION, || produce(third) == 202),
        "a grant set on node 1 works on node 3 within {GRANT_PROPAGATION:?}"
    );
    let took = granted.elapsed();
    let (_, users) = admin(first, "GET", "/v1/users", json!({}));
    let id = users["users"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["name"] == "ann"))
        .and_then(|u| u["tokens"][0]["id"].as_str())
        .expect("token id")
        .to_string();
    let (status, _) = admin(
        first,
        "DELETE",
        &format!("/v1/users/ann/tokens/{id}"),
        json!({}),
    );
    assert_eq!(status, 204);
    let revoked = Instant::now();
    assert!(
        eventually(GRANT_PROPAGATION, || produce(third) == 401),
        "a token revoked on node 1 is refused on node 3 within {GRANT_PROPAGATION:?}"
    );
    eprintln!(
        "grant held on node 3 after {took:?}; revocation after {:?}",
        revoked.elapsed()
    );
}

#[test]
fn a_request_without_credentials_is_refused_before_its_body_is_read() {
    use std::io::{Read, Write};
    let tmp = tempfile::tempdir().expect("tmp");
    let node = start_secured(&tmp.path().join("n"));
    admin(&node, "PUT", "/v1/topics/orders", json!({"partitions": 1}));
    for authorization in ["", "Authorization: Bearer nrd_0_0\r\n"] {
        let mut stream = std::net::TcpStream::connect(&node.addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        // A head that announces 10 MB, and no body at all: the answer must
        // not wait for it.
        let head = format!(
            "POST /v1/topics/orders/messages HTTP/1.1\r\nHost: t\r\nContent-Length: 10000000\r\n{authorization}\r\n"
        );
        stream.write_all(head.as_bytes()).expect("send");
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
        assert!(answer.contains("unauthenticated"), "{answer}");
    }
}

/// A child is a topic of its own and a redrive writes to its target: admin
/// on the parent or the dead-letter topic alone is not enough.
#[test]
fn children_need_admin_on_their_own_name_and_redrives_produce_on_their_target() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = start_secured(&tmp.path().join("n"));
    for name in ["orders", "orders-dlq", "elsewhere"] {
        let (status, answer) = admin(&node, "PUT", &format!("/v1/topics/{name}"), json!({}));
        assert_eq!(status, 201, "{answer}");
    }
    let token = user_with(
        &node,
        "ops",
        json!([{"topic": "orders*", "actions": ["admin", "produce"]}]),
    );
    let auth = bearer(&token);
    let body = |v: Value| v.to_string().into_bytes();
    let (status, answer) = call(
        &node,
        &auth,
        "PUT",
        "/v1/topics/orders/children/secret-copy",
        &body(json!({"kind": "fanout"})),
    );
    assert_eq!(status, 403, "a child outside the grants: {answer}");
    let (status, answer) = call(
        &node,
        &auth,
        "PUT",
        "/v1/topics/orders/children/orders.audit",
        &body(json!({"kind": "fanout"})),
    );
    assert_eq!(status, 201, "{answer}");
    let (status, answer) = call(
        &node,
        &auth,
        "POST",
        "/v1/topics/orders-dlq/redrive",
        &body(json!({"to": "elsewhere"})),
    );
    assert_eq!(
        status, 403,
        "a redrive into a topic without produce: {answer}"
    );
    let (status, answer) = call(
        &node,
        &auth,
        "POST",
        "/v1/topics/orders-dlq/redrive",
        &body(json!({"to": "orders"})),
    );
    assert_eq!(status, 202, "{answer}");
}

/// A topic's rates are for its consumers and its admins: either grant will
/// do, and another grant on it is refused.
#[test]
fn a_topics_rates_need_consume_or_admin_on_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = start_secured(&tmp.path().join("n"));
    admin(&node, "PUT", "/v1/topics/orders", json!({"partitions": 2}));
    for (name, action, status) in [
        ("watcher", "consume", 200),
        ("owner", "admin", 200),
        ("writer", "produce", 403),
    ] {
        let token = user_with(
            &node,
            name,
            json!([{"topic": "orders", "actions": [action]}]),
        );
        let (got, answer) = call(
            &node,
            &bearer(&token),
            "GET",
            "/v1/topics/orders/rates",
            b"",
        );
        assert_eq!(got, status, "{name}: {answer}");
    }
}

/// With auth on, the console's files are open (the page asks the user to
/// sign in and then calls the API with the user's own credentials); the
/// API behind it still needs them.
#[test]
fn with_auth_the_console_loads_without_credentials_and_the_api_still_needs_them() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = start_secured(&tmp.path().join("n"));
    for path in ["/ui/", "/ui/app.js", "/ui/app.css"] {
        let (status, _) = call(&node, "", "GET", path, b"");
        assert_eq!(status, 200, "{path}");
    }
    let (status, answer) = call(&node, "", "GET", "/v1/cluster", b"");
    assert_eq!(status, 401, "{answer}");
}
