//! The console, tried in a real browser: Debian's Chromium, driven through
//! its chromedriver (installed by `ops/install-check-tools.sh`; required
//! where `NARAD_OPS_CHECKS=required`, as in `.ci/run`), against a
//! three-node cluster with auth on and data in it. Each page is checked
//! against what the API says; creating a topic, producing, browsing,
//! searching, a redrive (and its cancel), a decommission, users, grants,
//! tokens and schemas are done from the page; a user without a grant sees
//! the API's refusal. No page logs an error to the browser's console or
//! asks another origin for anything. The screenshots of docs/console.md
//! are made here (`NARAD_CONSOLE_SCREENSHOTS=docs/images/console` writes
//! them there; otherwise they go to the test's temporary folder).

mod support;

#[path = "console/webdriver.rs"]
mod webdriver;

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use support::cluster::Cluster;
use support::{eventually, Access};
use webdriver::{Browser, PAGE_DEADLINE};

const ADMIN_PASSWORD: &str = "admin-pw";
const VIEWER_PASSWORD: &str = "viewer-pw";
/// Long enough for a decommission's moves of a few small partitions.
const MOVES_DEADLINE: Duration = Duration::from_secs(120);

fn basic(user: &str, password: &str) -> String {
    let pair = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

fn screenshots() -> PathBuf {
    let dir = std::env::var_os("NARAD_CONSOLE_SCREENSHOTS").map_or_else(
        || PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&dir).expect("the screenshots' folder");
    dir
}

/// What the browser logged and asked for since the last check: no error
/// in its console but the refusals `expected` names (an HTTP status the
/// step provokes, logged by the browser as a failed load), and no request
/// to another origin than the node's.
fn clean(browser: &Browser, origin: &str, expected: &[u16], step: &str) {
    for (level, message) in browser.console() {
        if level != "SEVERE" {
            continue;
        }
        let provoked = expected
            .iter()
            .any(|status| message.contains(&format!("status of {status}")));
        assert!(provoked, "{step}: the browser's console logged {message:?}");
    }
    let unnamed = browser.run(
        "return Array.from(document.querySelectorAll('input, select, textarea, button'))
           .filter((c) => !(c.labels && c.labels.length) && !c.getAttribute('aria-label')
             && !(c.tagName === 'BUTTON' && c.innerText.trim()))
           .map((c) => c.outerHTML);",
        json!([]),
    );
    assert_eq!(unnamed, json!([]), "{step}: controls without a name");
    let page = browser.text("body").unwrap_or_default();
    for slip in ["null", "undefined", "NaN", "[object Object]"] {
        assert!(
            !page.split(['\n', '\t', ' ']).any(|word| word == slip),
            "{step}: the page shows {slip:?}: {page}"
        );
    }
    let requested = browser.requested();
    assert!(!requested.is_empty(), "{step}: the page loaded nothing?");
    for url in requested {
        assert!(
            url.starts_with(origin),
            "{step}: the page asked another origin for {url}"
        );
    }
    browser.run(
        "performance.clearResourceTimings(); performance.setResourceTimingBufferSize(100000);",
        json!([]),
    );
}

/// A request with this credential only (the node's own helpers send the
/// admin's).
fn api(addr: &str, authorization: &str, method: &str, path: &str) -> (u16, Value) {
    webdriver::http_with(addr, method, path, &[("Authorization", authorization)], "")
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

#[test]
fn the_console_shows_what_the_api_says_and_acts_from_the_page_in_a_real_browser() {
    let Some((driver, chromium)) = webdriver::installed() else {
        return;
    };
    let shots = screenshots();
    let mut cluster = Cluster::start_with(
        3,
        &[
            "--set",
            "auth.enabled=true",
            "--set",
            &format!("auth.admin_password={ADMIN_PASSWORD}"),
        ],
    );
    let admin = basic("admin", ADMIN_PASSWORD);
    for node in &mut cluster.nodes {
        node.set_access(Access {
            tls: None,
            authorization: Some(admin.clone()),
        });
    }
    cluster.wait_ready(MOVES_DEADLINE);
    let node = &cluster.nodes[0];
    let addr = node.addr.clone();
    let origin = format!("http://{addr}");

    // Data: orders sends its dead letters to orders.dlq.
    node.create_topic("orders.dlq", json!({"partitions": 2}));
    node.create_topic(
        "orders",
        json!({"partitions": 4, "max_deliveries": 1, "dead_letter_topic": "orders.dlq"}),
    );
    let (status, child) = node.json(
        "PUT",
        "/v1/topics/orders/children/orders.audit",
        json!({"kind": "fanout", "topic": {"partitions": 1}}),
    );
    assert_eq!(status, 201, "{child}");
    let batch: Vec<Value> = (0..40)
        .map(|i| json!({"key": format!("customer-{i}"), "value": json!({"order": i, "amount": i * 10}).to_string()}))
        .collect();
    node.produce_batch("orders", batch);
    node.produce_batch(
        "orders",
        vec![json!({"key": "raw", "value_base64": "AAEC/w=="})],
    );
    // Five messages delivered once and never acked become dead letters.
    let mut leased = 0;
    assert!(eventually(PAGE_DEADLINE, || {
        leased += node
            .consume(
                "orders",
                json!({"max_messages": 5 - leased, "wait_ms": 1000, "visibility_timeout_ms": 200}),
            )
            .len();
        leased == 5
    }));
    assert!(
        eventually(PAGE_DEADLINE, || node.stat_sum("orders.dlq", "available")
            == 5),
        "five dead letters reached orders.dlq"
    );

    let browser = Browser::start(&driver, &chromium);

    // ---- sign-in: `/` leads to the console, which asks for credentials.
    browser.open(&format!("{origin}/"));
    assert!(browser.url().starts_with(&format!("{origin}/ui/")));
    browser.run(
        "performance.setResourceTimingBufferSize(100000);",
        json!([]),
    );
    browser.wait_until(
        "return document.getElementById('sign-in').open;",
        "its sign-in form",
    );
    browser.fill("#sign-in input[name=user]", "admin");
    browser.fill("#sign-in input[name=password]", ADMIN_PASSWORD);
    browser.click("#sign-in button[type=submit]");
    browser.wait_text("#who", |t| t == "signed in as admin");

    // ---- cluster: id, leader, term and every node as the API says.
    let (_, state) = node.request("GET", "/v1/cluster", b"");
    let summary = format!(
        "Cluster {}, leader node {}, term {}",
        state["cluster_id"].as_str().unwrap_or_default(),
        state["leader"],
        state["term"]
    );
    browser.wait_text("main", |t| t.contains(&summary));
    for n in state["nodes"].as_array().expect("nodes") {
        assert_eq!(n["ready"], true, "{state}");
        let row = format!(
            "{}\t{}\t{}\t{}\tready",
            n["id"],
            n["addr"].as_str().unwrap_or_default(),
            n["state"].as_str().unwrap_or_default(),
            n["partitions"]
        );
        browser.wait_text("main", |t| t.contains(&row));
    }
    browser.screenshot(&shots.join("cluster.png"));
    clean(&browser, &origin, &[401], "the cluster page");

    // ---- topics: each topic with its partitions and backlog; create one.
    browser.open(&format!("{origin}/ui/#/topics"));
    for topic in ["orders", "orders.dlq"] {
        let (_, described) = node.request("GET", &format!("/v1/topics/{topic}"), b"");
        let available: u64 = described["partition_stats"]
            .as_array()
            .expect("stats")
            .iter()
            .map(|p| p["available"].as_u64().unwrap_or(0))
            .sum();
        let row = format!("{topic}\t{}\t{available}\t", described["partitions"]);
        browser.wait_text("main", |t| t.contains(&row));
    }
    browser.screenshot(&shots.join("topics.png"));
    // What is typed survives the list's refresh; the form is sent from
    // the keyboard (Enter in its last field).
    browser.fill("input[name=name]", "audit");
    browser.run(
        "window.shownTable = document.querySelector('main table');",
        json!([]),
    );
    browser.wait_until(
        "return document.querySelector('main table') !== window.shownTable;",
        "a refreshed list",
    );
    assert_eq!(
        browser.run(
            "return document.querySelector('input[name=name]').value;",
            json!([])
        ),
        "audit"
    );
    browser.fill("input[name=partitions]", "2\u{E007}");
    browser.wait_text("h1", |t| t == "Topic audit");
    let (status, audit) = node.request("GET", "/v1/topics/audit", b"");
    assert_eq!((status, &audit["partitions"]), (200, &json!(2)), "{audit}");
    clean(&browser, &origin, &[], "the topics page");

    // ---- a topic: the partition table as the API says; produce, browse,
    // search and change a setting from the page.
    browser.open(&format!("{origin}/ui/#/topics/orders"));
    let (_, described) = node.request("GET", "/v1/topics/orders", b"");
    for p in described["partition_stats"].as_array().expect("stats") {
        let row = format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t",
            p["partition"],
            p["owner"],
            p["high_watermark"],
            p["frontier"],
            p["available"],
            p["in_flight"]
        );
        browser.wait_text("main", |t| t.contains(&row));
    }
    browser.wait_text("main", |t| t.contains("Produced per 5 s"));
    // Its child, with the lag and state the API gives.
    assert!(eventually(PAGE_DEADLINE, || {
        support::child_status(node, "orders", "orders.audit")["lag_messages"] == 0
    }));
    let child = support::child_status(node, "orders", "orders.audit");
    let row = format!(
        "orders.audit\tfanout\t0\t0 s\t{}\t{}",
        child["dropped_messages"],
        child["state"].as_str().unwrap_or_default()
    );
    browser.wait_text("main", |t| t.contains(&row));
    browser.fill("input[name=produce-key]", "customer-4242");
    browser.fill(
        "textarea[name=produce-value]",
        r#"{"order": 4242, "note": "from the console"}"#,
    );
    browser.press("Produce");
    let accepted = browser.wait_text("main", |t| t.contains("Accepted: message "));
    let (_, found) = node.request("GET", "/v1/topics/orders/messages?key=customer-4242", b"");
    let message = found["messages"][0].clone();
    let id = message["id"].as_str().expect("the produced message");
    assert!(accepted.contains(id), "the page showed the API's id {id}");
    browser.fill("input[name=partition]", &message["partition"].to_string());
    browser.fill("input[name=offset]", &message["offset"].to_string());
    browser.press("Show");
    browser.wait_text("section[aria-label=Messages]", |t| {
        t.contains("\"note\": \"from the console\"") && t.contains("customer-4242")
    });
    let (_, raw) = node.request("GET", "/v1/topics/orders/messages?key=raw", b"");
    browser.fill(
        "input[name=partition]",
        &raw["messages"][0]["partition"].to_string(),
    );
    browser.fill(
        "input[name=offset]",
        &raw["messages"][0]["offset"].to_string(),
    );
    browser.press("Show");
    let shown = browser.wait_text("section[aria-label=Messages]", |t| {
        t.contains("hex: 00 01 02 ff")
    });
    assert!(
        shown.contains(" s ago (") || shown.contains(" min ago ("),
        "a time both relative and absolute: {shown}"
    );
    browser.fill("input[name=contains]", "\"amount\":390");
    browser.press("Search");
    browser.wait_text("section[aria-label='Search results']", |t| {
        t.contains("customer-39") && t.contains("Every retained message was searched.")
    });
    browser.screenshot(&shots.join("browse.png"));
    browser.run("window.scrollTo(0, 0);", json!([]));
    browser.screenshot(&shots.join("topic.png"));
    assert!(
        browser.text("main").is_some_and(|t| !t.contains("Redrive")),
        "a topic that takes no dead letters has no redrive card"
    );
    browser.fill("input[name=visibility_timeout_ms]", "45000");
    browser.press("Save settings");
    browser.wait_text("main", |t| t.contains("Saved: visibility_timeout_ms."));
    let (_, described) = node.request("GET", "/v1/topics/orders", b"");
    assert_eq!(described["visibility_timeout_ms"], 45000);
    clean(&browser, &origin, &[], "the topic page");

    // ---- the dead-letter topic: a slow redrive cancelled, then one that
    // moves everything back.
    node.produce_batch(
        "orders.dlq",
        (0..20)
            .map(|i| json!({"value": format!("stray-{i}")}))
            .collect(),
    );
    browser.open(&format!("{origin}/ui/#/topics/orders.dlq"));
    browser.wait_text("main", |t| t.contains("Dead letters of orders land here."));
    browser.fill("input[name=rate_per_s]", "1");
    browser.press("Start redrive");
    let started = browser.wait_text("main", |t| {
        t.contains("started: it moves messages to orders.")
    });
    let (_, tasks) = node.request("GET", "/v1/topics/orders.dlq/redrive", b"");
    let slow = tasks["tasks"][0]["id"]
        .as_str()
        .expect("a task")
        .to_string();
    assert!(started.contains(&slow));
    browser.wait_text("main", |t| t.contains("running"));
    browser.screenshot(&shots.join("redrive.png"));
    browser.click(&format!("button[aria-label='Cancel redrive {slow}']"));
    assert!(eventually(PAGE_DEADLINE, || {
        node.request("GET", "/v1/topics/orders.dlq/redrive", b"").1["tasks"][0]["state"]
            == "cancelled"
    }));
    browser.wait_text("main", |t| t.contains("cancelled"));
    browser.fill("input[name=rate_per_s]", "");
    browser.press("Start redrive");
    assert!(
        eventually(PAGE_DEADLINE, || node.stat_sum("orders.dlq", "available")
            == 0),
        "the redrive moved every dead letter back"
    );
    browser.wait_text("main", |t| t.contains("done"));
    clean(&browser, &origin, &[], "the dead-letter topic's page");

    // ---- delete a topic only after typing its name.
    browser.open(&format!("{origin}/ui/#/topics/audit"));
    browser.wait_text("h1", |t| t == "Topic audit");
    assert!(browser.disabled("Delete topic"));
    browser.fill("input[name=confirm-name]", "audit");
    browser.press("Delete topic");
    browser.wait_text("h1", |t| t == "Topics");
    assert_eq!(node.request("GET", "/v1/topics/audit", b"").0, 404);
    clean(&browser, &origin, &[], "deleting a topic");

    // ---- decommission node 3: the confirmation names what moves.
    browser.open(&format!("{origin}/ui/#/cluster"));
    let (_, dry) = node.json(
        "POST",
        "/v1/cluster/nodes/3/decommission?dry_run=true",
        json!({}),
    );
    let moving = dry["moves"].as_array().expect("moves").len();
    assert!(moving > 0, "node 3 owns partitions: {dry}");
    browser.press("Decommission node 3…");
    let confirmation = browser.wait_text("#confirm", |t| t.contains("will move"));
    assert!(
        confirmation.contains(&format!("{moving} partition")),
        "{confirmation}"
    );
    for m in dry["moves"].as_array().expect("moves") {
        let line = format!(
            "{} partition {}: node 3 → node {}",
            m["topic"].as_str().unwrap_or_default(),
            m["partition"],
            m["to"]
        );
        assert!(confirmation.contains(&line), "{line} in {confirmation}");
    }
    browser.screenshot(&shots.join("decommission.png"));
    browser.press("Decommission node 3");
    browser.wait_text("main", |t| t.contains("move") && t.contains("planned."));
    assert!(
        eventually(MOVES_DEADLINE, || {
            node.request("GET", "/v1/cluster", b"").1["nodes"]
                .as_array()
                .is_some_and(|nodes| {
                    nodes.iter().any(|n| {
                        n["id"] == 3 && n["state"] == "decommissioned" && n["partitions"] == 0
                    })
                })
        }),
        "node 3 was decommissioned: {}",
        node.request("GET", "/v1/cluster/moves", b"").1
    );
    browser.wait_text("main", |t| t.contains("decommissioned\t0"));
    let (_, moves) = node.request("GET", "/v1/cluster/moves", b"");
    for m in moves["moves"].as_array().expect("moves") {
        let row = format!(
            "{}\t{}\t3\t{}\t{}\t",
            m["topic"].as_str().unwrap_or_default(),
            m["partition"],
            m["to"],
            m["state"].as_str().unwrap_or_default()
        );
        browser.wait_text("main", |t| t.contains("Last ended") && t.contains(&row));
    }
    clean(&browser, &origin, &[], "the decommission");

    // ---- users, grants, tokens and schemas.
    browser.open(&format!("{origin}/ui/#/users"));
    browser.wait_text("main", |t| t.contains("admin"));
    browser.fill("main input[name=name]", "viewer");
    browser.fill("main input[name=password]", VIEWER_PASSWORD);
    browser.press("Create user");
    browser.wait_text("h1", |t| t == "User viewer");
    browser.press("Add a grant");
    browser.fill("input[name=topic]", "orders");
    browser.click("input[name=consume]");
    browser.press("Save grants");
    browser.wait_text("main", |t| t.contains("Saved: orders: consume."));
    let (_, grants) = node.request("GET", "/v1/users/viewer/grants", b"");
    assert_eq!(
        grants["grants"],
        json!([{"topic": "orders", "actions": ["consume"]}])
    );
    browser.press("Create a token");
    let token = browser.wait_text(".secret", |t| !t.is_empty());
    let (status, _) = api(
        &addr,
        &format!("Bearer {}", token.trim()),
        "GET",
        "/v1/cluster",
    );
    assert_eq!(status, 200, "the token shown once works");
    browser.screenshot(&shots.join("user.png"));
    browser.open(&format!("{origin}/ui/#/schemas"));
    browser.fill("input[name=schema-name]", "order");
    browser.press("Create schema");
    browser.wait_text("h1", |t| t == "Schema order, version 1");
    let (status, schema) = node.request("GET", "/v1/schemas/order", b"");
    assert_eq!((status, &schema["version"]), (200, &json!(1)), "{schema}");
    browser.screenshot(&shots.join("schema.png"));
    browser.fill("input[name=confirm-name]", "order");
    browser.press("Delete schema");
    browser.wait_text("h1", |t| t == "Schemas");
    assert_eq!(node.request("GET", "/v1/schemas/order", b"").0, 404);
    clean(&browser, &origin, &[], "users and schemas");

    // ---- a phone's width.
    browser.resize(390, 844);
    browser.open(&format!("{origin}/ui/#/topics/orders"));
    browser.wait_text("main", |t| t.contains("Produced per 5 s"));
    browser.screenshot(&shots.join("phone.png"));
    assert_eq!(
        browser.run(
            "return document.documentElement.scrollWidth <= window.innerWidth;",
            json!([])
        ),
        true,
        "the page fits a phone's width (wide tables scroll within themselves)"
    );
    browser.resize(1280, 800);

    // ---- a user without the grant sees the API's refusal.
    browser.press("Sign out");
    browser.wait_until(
        "return document.getElementById('sign-in').open;",
        "its sign-in form",
    );
    assert_eq!(browser.text("#who").as_deref(), Some(""), "signed out");
    // A wrong password is refused: the form comes back, nobody is shown.
    browser.fill("#sign-in input[name=user]", "viewer");
    browser.fill("#sign-in input[name=password]", "not-the-password");
    browser.click("#sign-in button[type=submit]");
    browser.wait_until(
        "return document.getElementById('sign-in').open && document.getElementById('sign-in-why').innerText.length > 0;",
        "its sign-in form again",
    );
    assert_eq!(browser.text("#who").as_deref(), Some(""));
    browser.fill("#sign-in input[name=user]", "viewer");
    browser.fill("#sign-in input[name=password]", VIEWER_PASSWORD);
    browser.click("#sign-in button[type=submit]");
    browser.wait_text("#who", |t| t == "signed in as viewer");
    // With `consume` on orders only: the list and the topic's page show
    // what the rates and the browser give, and the describe's refusal.
    browser.open(&format!("{origin}/ui/#/topics"));
    browser.wait_text("main", |t| {
        t.contains("orders\t4\t") && !t.contains("orders.dlq")
    });
    browser.open(&format!("{origin}/ui/#/topics/orders"));
    browser.wait_text("main", |t| {
        t.contains("Topic orders")
            && t.contains("403 forbidden: ")
            && t.contains("Partition 0: frontier")
            && t.contains("Produced per 5 s")
            && !t.contains("Delete this topic")
    });
    browser.open(&format!("{origin}/ui/#/topics/orders.dlq"));
    let viewer = basic("viewer", VIEWER_PASSWORD);
    let (status, refusal) = api(&addr, &viewer, "GET", "/v1/topics/orders.dlq");
    assert_eq!(status, 403, "{refusal}");
    let shown = format!(
        "403 forbidden: {}",
        refusal["error"]["message"].as_str().unwrap_or_default()
    );
    browser.wait_text("main", |t| t.contains(&shown));
    browser.open(&format!("{origin}/ui/#/users"));
    browser.wait_text("main", |t| t.contains("403 forbidden"));
    clean(&browser, &origin, &[401, 403], "the refused user");
}
