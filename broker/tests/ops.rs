//! The operator files of `ops/` and the API document, each checked by the
//! tool that reads it: promtool (alert rules, their unit tests, and the
//! node's `/metrics`), systemd-analyze (the unit), the node itself (the
//! sample config), openapi-spec-validator and schemathesis (the API
//! document against a live node).
//!
//! `ops/install-check-tools.sh` installs the tools. Where one is missing,
//! its check says so and passes, unless `NARAD_OPS_CHECKS=required` (as
//! `.ci/run` sets), where a missing tool fails the check.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::json;
use support::Node;

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// Whether every tool of `tools` is on the PATH; if one is not, a check
/// that needs it fails under `NARAD_OPS_CHECKS=required` and is skipped
/// (saying so) otherwise.
fn have(tools: &[&str]) -> bool {
    have_or_skip(tools, true)
}

/// As [`have`]; a tool that is not `required_in_ci` skips its check even
/// under `NARAD_OPS_CHECKS=required`.
fn have_or_skip(tools: &[&str], required_in_ci: bool) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|tool| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    let required =
        required_in_ci && std::env::var("NARAD_OPS_CHECKS").is_ok_and(|v| v == "required");
    assert!(
        !required,
        "{missing:?} missing: run ops/install-check-tools.sh"
    );
    eprintln!("skipped: {missing:?} not installed (ops/install-check-tools.sh installs them)");
    false
}

/// Runs `script` of `ops/` with the test's narad binary; fails with its
/// output unless it exits 0.
fn run_script(script: &str) {
    let output = Command::new("bash")
        .arg(root().join("ops").join(script))
        .env("NARAD_BIN", env!("CARGO_BIN_EXE_narad"))
        .current_dir(root())
        .output()
        .expect("run the script");
    assert!(
        output.status.success(),
        "{script} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_alert_rules_pass_their_unit_tests_and_the_dashboard_names_real_metrics() {
    if have(&["promtool", "python3"]) {
        run_script("check-monitoring.sh");
    }
}

#[test]
fn the_systemd_unit_verifies_and_the_sample_config_starts_a_node() {
    if have(&["systemd-analyze", "python3", "curl"]) {
        run_script("check-deploy.sh");
    }
}

#[test]
fn a_busy_node_s_metrics_pass_promtool() {
    if !have(&["promtool"]) {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    node.create_topic("orders", json!({"partitions": 2}));
    let (status, _) = node.json(
        "PUT",
        "/v1/topics/orders/children/orders.audit",
        json!({"kind": "fanout"}),
    );
    assert_eq!(status, 201);
    for i in 0..20 {
        let (status, _) = node.request(
            "POST",
            "/v1/topics/orders/messages",
            format!("m{i}").as_bytes(),
        );
        assert_eq!(status, 202);
    }
    let got = node.consume("orders", json!({"max_messages": 5, "wait_ms": 5000}));
    assert!(!got.is_empty());
    support::ack_batch(&node, "orders", &got);
    let (_, _, body) = support::raw_request(&node.addr, "GET", "/metrics", &[], b"");
    let text = String::from_utf8_lossy(&body).to_string();
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    std::io::Write::write_all(&mut promtool.stdin.take().expect("stdin"), text.as_bytes())
        .expect("write");
    let output = promtool.wait_with_output().expect("promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // The one name the API fixes for a counter without `_total`.
    let findings: Vec<&str> = said
        .lines()
        .filter(|line| !line.trim().is_empty())
        .filter(|line| {
            !line.starts_with("narad_fanout_child_dropped_messages counter metrics should have")
        })
        .collect();
    assert!(
        findings.is_empty(),
        "promtool check metrics: {findings:?}\n{text}"
    );
}

#[test]
fn the_node_serves_its_api_document() {
    let tmp = tempfile::tempdir().expect("tmp");
    let node = Node::start(&tmp.path().join("n"), &[]);
    let (status, served) = node.request("GET", "/v1/openapi.json", b"");
    assert_eq!(status, 200);
    let built: serde_json::Value =
        serde_json::from_slice(&narad_broker::api::openapi::document_json().expect("the document"))
            .expect("json");
    assert_eq!(served, built, "the node serves docs/openapi.yaml as JSON");
    assert!(served["paths"]["/v1/topics/{topic}/messages"]["post"].is_object());
}

#[test]
fn the_api_document_is_valid_and_schemathesis_finds_nothing_on_a_live_node() {
    if have(&["openapi-spec-validator", "schemathesis", "curl", "python3"]) {
        run_script("schemathesis.sh");
    }
}

/// The id a heading gets (as mdBook and GitHub make them, for ASCII):
/// lower case, spaces to `-`, punctuation but `-` and `_` dropped.
fn heading_id(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The ids of the headings of a markdown text (outside code blocks),
/// repeated ones numbered as mdBook does.
fn heading_ids(text: &str) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code || !line.starts_with('#') {
            continue;
        }
        let id = heading_id(line.trim_start_matches('#'));
        let seen = ids
            .iter()
            .filter(|i| **i == id || i.starts_with(&format!("{id}-")))
            .count();
        ids.push(if seen == 0 {
            id
        } else {
            format!("{id}-{seen}")
        });
    }
    ids
}

/// Every `](target)` of a markdown text outside code blocks.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            targets.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    targets
}

#[test]
fn no_link_between_the_docs_is_broken() {
    let root = root();
    let mut pages: Vec<PathBuf> = vec![root.join("README.md"), root.join("ops/README.md")];
    for entry in std::fs::read_dir(root.join("docs")).expect("docs") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("read");
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let linked = if file.is_empty() {
                page.clone()
            } else {
                page.parent().expect("folder").join(file)
            };
            if !linked.exists() {
                broken.push(format!("{}: {target} (no such file)", page.display()));
                continue;
            }
            let is_markdown = linked.extension().is_some_and(|e| e == "md");
            if !anchor.is_empty() && is_markdown {
                let ids = heading_ids(&std::fs::read_to_string(&linked).expect("read"));
                if !ids.iter().any(|id| id == anchor) {
                    broken.push(format!("{}: {target} (no such heading)", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_docs_book_builds() {
    // The pages and links are checked above; here mdbook renders the book
    // (ops/install-check-tools.sh builds it from crates.io, about 90 s).
    if !have(&["mdbook"]) {
        return;
    }
    let out = tempfile::tempdir().expect("tmp");
    let output = Command::new("mdbook")
        .args(["build", "docs", "--dest-dir"])
        .arg(out.path())
        .current_dir(root())
        .output()
        .expect("mdbook");
    assert!(
        output.status.success(),
        "mdbook build docs:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(out.path().join("index.html").exists());
    assert!(out.path().join("delivery-contract.html").exists());
}

#[test]
fn every_page_of_the_docs_is_in_the_book() {
    let docs = root().join("docs");
    let summary = std::fs::read_to_string(docs.join("SUMMARY.md")).expect("SUMMARY.md");
    let listed = link_targets(&summary);
    for entry in std::fs::read_dir(&docs).expect("docs") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .to_string();
        if name.ends_with(".md") && name != "SUMMARY.md" {
            assert!(
                listed.contains(&name),
                "docs/{name} is not in docs/SUMMARY.md"
            );
        }
    }
}
