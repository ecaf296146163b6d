//! HTTPS on the client port, from outside: clients that trust the right CA,
//! another CA, or speak plain HTTP; mutual TLS; certificates reloaded on
//! SIGHUP while a connection stays open; and the CLI over HTTPS with a
//! token.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use narad_client::blocking::Client;
use narad_client::{ConsumeRequest, Error as ClientError, RetryPolicy};
use narad_net::tls::{client_config, ClientTlsFiles};
use serde_json::{json, Value};
use support::tls::{path, Issued, TestCa};
use support::{eventually, Node};

fn https_node(dir: &Path, server: &Issued, client_ca: Option<&TestCa>, extra: &[&str]) -> Node {
    let mut flags = vec![
        "--set".to_string(),
        format!("http.tls.cert_file={}", path(&server.cert_file)),
        "--set".to_string(),
        format!("http.tls.key_file={}", path(&server.key_file)),
    ];
    if let Some(ca) = client_ca {
        flags.push("--set".into());
        flags.push(format!("http.tls.client_ca_file={}", path(&ca.cert_file)));
    }
    flags.extend(extra.iter().map(|s| s.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Node::start(&dir.join("node"), &flags)
}

fn files(ca: &TestCa, identity: Option<&Issued>) -> ClientTlsFiles {
    ClientTlsFiles {
        ca_file: Some(path(&ca.cert_file)),
        cert_file: identity.map(|i| path(&i.cert_file)),
        key_file: identity.map(|i| path(&i.key_file)),
    }
}

fn https_client(node: &Node, ca: &TestCa, identity: Option<&Issued>) -> Client {
    Client::builder(&format!("https://{}", node.addr))
        .tls(files(ca, identity))
        .retry(RetryPolicy {
            attempts: 1,
            ..Default::default()
        })
        .build()
        .expect("client")
}

/// `GET /v1/topics` with `client`.
fn list_topics(client: &Client) -> Result<Value, ClientError> {
    client
        .request("GET", "/v1/topics", &[], "", Duration::ZERO)
        .map(|answer| answer.body)
}

/// A keep-alive HTTPS connection that sends requests one after another.
struct KeptConnection {
    stream: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
}

impl KeptConnection {
    fn open(addr: &str, files: &ClientTlsFiles) -> Self {
        let tcp = TcpStream::connect(addr).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let config: Arc<rustls::ClientConfig> = client_config(files).expect("config");
        let connection = rustls::ClientConnection::new(config, name).expect("client");
        Self {
            stream: rustls::StreamOwned::new(connection, tcp),
        }
    }

    fn get(&mut self, path: &str) -> u16 {
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n");
        self.stream.write_all(request.as_bytes()).expect("send");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            self.stream.read_exact(&mut byte).expect("head");
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; length];
        self.stream.read_exact(&mut body).expect("body");
        head.split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("status")
    }
}

#[test]
fn https_with_the_right_ca_passes_another_ca_fails_and_plain_http_is_told() {
    let tmp = tempfile::tempdir().expect("tmp");
    let ca = TestCa::new(tmp.path(), "right");
    let other = TestCa::new(tmp.path(), "other");
    let server = ca.issue("server", &["localhost", "127.0.0.1"]);
    let node = https_node(tmp.path(), &server, None, &[]);
    let client = https_client(&node, &ca, None);
    client
        .put_topic("orders", &json!({"partitions": 2}))
        .expect("create over HTTPS");
    client.produce("orders", None, "over tls").expect("produce");
    let request = ConsumeRequest {
        wait_ms: Some(1000),
        ..Default::default()
    };
    let messages = client.consume("orders", &request).expect("consume");
    assert_eq!(&messages[0].value[..], b"over tls");
    // The client's kept-alive connections speak HTTPS too.
    for _ in 0..3 {
        client
            .produce("orders", None, "kept")
            .expect("produce on a kept connection");
    }
    let error = list_topics(&https_client(&node, &other, None))
        .expect_err("a server certificate of another CA is refused");
    assert!(
        matches!(&error, ClientError::Tls(why) if why.contains("certificate")),
        "{error:?}"
    );
    assert!(eventually(Duration::from_secs(5), || node
        .stderr()
        .contains("TLS handshake with a client failed")));
    let (status, answer) = node.request("GET", "/v1/topics", b"");
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("HTTPS"),
        "{answer}"
    );
}

#[test]
fn mutual_tls_refuses_a_client_without_a_certificate_of_its_ca() {
    let tmp = tempfile::tempdir().expect("tmp");
    let ca = TestCa::new(tmp.path(), "server");
    let clients = TestCa::new(tmp.path(), "clients");
    let strangers = TestCa::new(tmp.path(), "strangers");
    let server = ca.issue("server", &["127.0.0.1"]);
    let node = https_node(tmp.path(), &server, Some(&clients), &[]);
    let member = clients.issue("member", &["member"]);
    let stranger = strangers.issue("stranger", &["stranger"]);
    list_topics(&https_client(&node, &ca, Some(&member)))
        .expect("a client with a certificate of the client CA");
    assert!(list_topics(&https_client(&node, &ca, None)).is_err());
    assert!(list_topics(&https_client(&node, &ca, Some(&stranger))).is_err());
    // An expired certificate of the right CA fails too, and the node says why.
    let expired = clients.issue_expired("expired", &["member"]);
    assert!(list_topics(&https_client(&node, &ca, Some(&expired))).is_err());
    assert!(
        eventually(Duration::from_secs(5), || node
            .stderr()
            .contains("certificate expired")),
        "{}",
        node.stderr()
    );
}

#[test]
fn certificates_are_reloaded_on_sighup_while_open_connections_go_on() {
    let tmp = tempfile::tempdir().expect("tmp");
    let first = TestCa::new(tmp.path(), "first");
    let second = TestCa::new(tmp.path(), "second");
    let server = first.issue("server", &["127.0.0.1"]);
    let node = https_node(tmp.path(), &server, None, &[]);
    let mut kept = KeptConnection::open(&node.addr, &files(&first, None));
    assert_eq!(kept.get("/healthz"), 200);
    // The operator renews the certificate (another CA here, to tell them apart).
    let renewed = second.issue("renewed", &["127.0.0.1"]);
    std::fs::copy(&renewed.cert_file, &server.cert_file).expect("cert");
    std::fs::copy(&renewed.key_file, &server.key_file).expect("key");
    assert!(
        list_topics(&https_client(&node, &second, None)).is_err(),
        "not before SIGHUP"
    );
    node.hangup();
    assert!(
        eventually(Duration::from_secs(10), || list_topics(&https_client(
            &node, &second, None
        ))
        .is_ok()),
        "new connections get the renewed certificate"
    );
    assert!(list_topics(&https_client(&node, &first, None)).is_err());
    assert_eq!(kept.get("/v1/topics"), 200, "the open connection goes on");
    // A bad file on the next SIGHUP keeps the certificate in use.
    std::fs::write(&server.key_file, "not a key").expect("break");
    node.hangup();
    assert!(eventually(Duration::from_secs(10), || node
        .stderr()
        .contains(
            "could not reload the TLS certificates; the previous ones stay port=\"client port\""
        )));
    list_topics(&https_client(&node, &second, None)).expect("still served");
}

#[test]
fn a_node_refuses_to_start_with_unreadable_certificates_or_half_the_pair() {
    let tmp = tempfile::tempdir().expect("tmp");
    for (flags, says) in [
        (
            vec![
                "--set",
                "http.tls.cert_file=/nonexistent/cert.pem",
                "--set",
                "http.tls.key_file=/nonexistent/key.pem",
            ],
            "/nonexistent/cert.pem",
        ),
        (vec!["--set", "http.tls.cert_file=/x.pem"], "go together"),
        (
            vec!["--set", "http.tls.client_ca_file=/x.pem"],
            "needs http.tls.cert_file",
        ),
    ] {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_narad"));
        command
            .args(["serve", "--data-dir"])
            .arg(tmp.path().join("n"))
            .args(["--listen", "127.0.0.1:0"])
            .args(&flags);
        let output = support::run_to_exit(command, Duration::from_secs(30));
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(says), "{stderr}");
    }
}

fn narad(node: &Node, ca: &TestCa, auth: &[&str], args: &[&str]) -> (bool, Value, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(args)
        .args([
            "--server",
            &format!("https://{}", node.addr),
            "--ca-file",
            &path(&ca.cert_file),
            "--output",
            "json",
        ])
        .args(auth)
        .env_remove("NARAD_URL")
        .output()
        .expect("run narad");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    (
        output.status.success(),
        serde_json::from_str(&stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

#[test]
fn the_cli_manages_users_tokens_grants_and_schemas_over_https() {
    let tmp = tempfile::tempdir().expect("tmp");
    let ca = TestCa::new(tmp.path(), "ca");
    let server = ca.issue("server", &["127.0.0.1"]);
    let node = https_node(
        tmp.path(),
        &server,
        None,
        &[
            "--set",
            "auth.enabled=true",
            "--set",
            "auth.admin_password=root-pw",
        ],
    );
    let admin = ["--user", "admin", "--password", "root-pw"];
    assert!(eventually(Duration::from_secs(20), || narad(
        &node,
        &ca,
        &admin,
        &["user", "list"]
    )
    .0));
    let (ok, _, stderr) = narad(
        &node,
        &ca,
        &admin,
        &["user", "create", "ann", "--new-password", "ann-pw"],
    );
    assert!(ok, "{stderr}");
    let (ok, _, stderr) = narad(
        &node,
        &ca,
        &admin,
        &[
            "grant",
            "set",
            "ann",
            "--grant",
            "orders=produce,consume",
            "--grant",
            "billing.*=admin",
        ],
    );
    assert!(ok, "{stderr}");
    let (ok, grants, _) = narad(&node, &ca, &admin, &["grant", "show", "ann"]);
    assert!(ok);
    assert_eq!(
        grants["grants"][1],
        json!({"topic": "billing.*", "actions": ["admin"]})
    );
    let schema = tmp.path().join("order.json");
    std::fs::write(&schema, r#"{"type": "object", "required": ["id"]}"#).expect("schema");
    let (ok, put, stderr) = narad(
        &node,
        &ca,
        &admin,
        &["schema", "put", "order", &path(&schema)],
    );
    assert!(ok, "{stderr}");
    assert_eq!(put["version"], 1);
    let (ok, listed, _) = narad(&node, &ca, &admin, &["schema", "list"]);
    assert!(ok);
    assert_eq!(listed["schemas"][0]["name"], "order");
    let (ok, _, _) = narad(
        &node,
        &ca,
        &admin,
        &["topic", "create", "orders", "--partitions", "2"],
    );
    assert!(ok);
    let (ok, token, stderr) = narad(
        &node,
        &ca,
        &["--user", "ann", "--password", "ann-pw"],
        &["token", "create", "ann"],
    );
    assert!(ok, "{stderr}");
    let token = token["token"].as_str().expect("token").to_string();
    let with_token = ["--token", token.as_str()];
    let (ok, _, stderr) = narad(&node, &ca, &with_token, &["produce", "orders", "hello"]);
    assert!(ok, "{stderr}");
    let (ok, _, stderr) = narad(&node, &ca, &with_token, &["topic", "delete", "orders"]);
    assert!(!ok && stderr.contains("admin"), "{stderr}");
    let (ok, _, stderr) = narad(
        &node,
        &ca,
        &["--token", "nrd_bad_token"],
        &["topic", "list"],
    );
    assert!(!ok && stderr.contains("unknown or revoked"), "{stderr}");
    let id = {
        let (_, users, _) = narad(&node, &ca, &admin, &["user", "list"]);
        users["users"]
            .as_array()
            .and_then(|u| u.iter().find(|u| u["name"] == "ann"))
            .and_then(|u| u["tokens"][0]["id"].as_str())
            .expect("id")
            .to_string()
    };
    let (ok, _, _) = narad(&node, &ca, &admin, &["token", "revoke", "ann", &id]);
    assert!(ok);
    let (ok, _, _) = narad(&node, &ca, &with_token, &["topic", "list"]);
    assert!(!ok, "a revoked token is refused");
    let (ok, _, _) = narad(&node, &ca, &admin, &["schema", "delete", "order"]);
    assert!(ok);
    let (ok, _, _) = narad(&node, &ca, &admin, &["user", "delete", "ann"]);
    assert!(ok);
}
