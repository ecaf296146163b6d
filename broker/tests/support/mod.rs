//! Test support: real `narad` processes on loopback, and a small blocking
//! HTTP/1.1 client. Every wait polls a condition with a deadline.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod cluster;
pub mod netns;
pub mod tls;

/// How tests reach a node that serves HTTPS or wants credentials.
#[derive(Clone)]
pub struct Access {
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// The `Authorization` header sent with every request.
    pub authorization: Option<String>,
}

/// The access of each secured node, by client address: every request
/// helper below looks its address up here.
fn accesses() -> &'static std::sync::Mutex<std::collections::HashMap<String, Access>> {
    static ACCESS: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<String, Access>>,
    > = std::sync::OnceLock::new();
    ACCESS.get_or_init(Default::default)
}

fn access_of(addr: &str) -> Option<Access> {
    accesses().lock().ok()?.get(addr).cloned()
}

/// A stream the request helpers write to: TCP, or TLS over TCP.
trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

/// A connection to `addr`, under TLS if the node serves HTTPS.
fn open(addr: &str, timeout: Duration) -> Result<(Box<dyn Stream>, Option<String>), String> {
    let target: std::net::SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let stream =
        TcpStream::connect_timeout(&target, timeout).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    let Some(access) = access_of(addr) else {
        return Ok((Box::new(stream), None));
    };
    let Some(config) = access.tls else {
        return Ok((Box::new(stream), access.authorization));
    };
    let name = rustls::pki_types::ServerName::from(target.ip());
    let connection = rustls::ClientConnection::new(config, name).map_err(|e| e.to_string())?;
    Ok((
        Box::new(rustls::StreamOwned::new(connection, stream)),
        access.authorization,
    ))
}

pub const START_DEADLINE: Duration = Duration::from_secs(60);
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(30);
/// Pause between two checks of a condition that has no blocking wait.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// One `narad serve` process.
pub struct Node {
    pub data_dir: PathBuf,
    pub addr: String,
    /// The Kafka listener's address, when the node has one.
    pub kafka_addr: Option<String>,
    access: Option<Access>,
    extra: Vec<String>,
    /// A command that runs the node's process (`ip netns exec ...`), or
    /// nothing to run it directly.
    launcher: Vec<String>,
    child: Option<Child>,
    stderr_path: PathBuf,
}

impl Node {
    /// Starts a node on a fresh port with `extra` flags (e.g. `--set k=v`).
    pub fn start(data_dir: &Path, extra: &[&str]) -> Self {
        Self::start_by(data_dir, extra, Vec::new())
    }

    /// [`Node::start`], the process run by `launcher` (a command and its
    /// arguments, before the program's path).
    pub fn start_by(data_dir: &Path, extra: &[&str], launcher: Vec<String>) -> Self {
        let mut node = Self {
            data_dir: data_dir.to_path_buf(),
            addr: String::new(),
            kafka_addr: None,
            access: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            launcher,
            child: None,
            stderr_path: data_dir.with_extension("stderr.log"),
        };
        node.spawn();
        node
    }

    fn spawn(&mut self) {
        // The address of an earlier start is no longer this node's.
        if let Ok(mut accesses) = accesses().lock() {
            accesses.remove(&self.addr);
        }
        std::fs::create_dir_all(&self.data_dir).expect("data dir");
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.stderr_path)
            .expect("stderr log");
        let program = env!("CARGO_BIN_EXE_narad");
        let mut command = match self.launcher.split_first() {
            Some((first, rest)) => {
                let mut command = Command::new(first);
                command.args(rest).arg(program);
                command
            }
            None => Command::new(program),
        };
        let mut child = command
            .arg("serve")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(self.default_listen())
            .args(["--set", "storage.wal_ring_bytes=8388608"])
            .args(self.default_shards())
            .args(&self.extra)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn narad");
        let stdout = child.stdout.take().expect("stdout");
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("listening client=") {
                    let _ = sender.send(rest.to_string());
                }
            }
        });
        let listening = receiver
            .recv_timeout(START_DEADLINE)
            .unwrap_or_else(|_| panic!("node did not start: {}", self.stderr()));
        let mut words = listening.split_whitespace();
        self.addr = words.next().unwrap_or_default().to_string();
        self.kafka_addr = words
            .find_map(|word| word.strip_prefix("kafka="))
            .map(str::to_string);
        self.child = Some(child);
        if let (Some(access), Ok(mut accesses)) = (&self.access, accesses().lock()) {
            accesses.insert(self.addr.clone(), access.clone());
        }
    }

    /// Every request helper reaches this node (and itself after a
    /// restart) with `access`.
    pub fn set_access(&mut self, access: Access) {
        if let Ok(mut accesses) = accesses().lock() {
            accesses.insert(self.addr.clone(), access.clone());
        }
        self.access = Some(access);
    }

    /// A free port on loopback unless the test chose an address.
    fn default_listen(&self) -> &'static [&'static str] {
        if self.extra.iter().any(|a| a == "--listen") {
            &[]
        } else {
            &["--listen", "127.0.0.1:0"]
        }
    }

    /// One shard unless the test chose a count.
    fn default_shards(&self) -> &'static [&'static str] {
        if self.extra.iter().any(|a| a == "--shards") {
            &[]
        } else {
            &["--shards", "1"]
        }
    }

    /// The running process's id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the node runs").id()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// SIGSTOP: the process freezes with its sockets open.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// SIGCONT after [`Node::pause`].
    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// Whether the process is still there (it may be paused).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// SIGHUP: the node reloads its client port's certificates.
    pub fn hangup(&self) {
        self.signal("HUP");
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(child.id().to_string())
                .status()
                .expect("kill");
        }
    }

    /// SIGTERM, and waits for a clean exit.
    pub fn terminate(&mut self) {
        self.signal("TERM");
        let status = self.wait_exit();
        assert!(
            status.is_some_and(|s| s.success()),
            "graceful stop exits 0, got {status:?}: {}",
            self.stderr()
        );
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
        }
        self.wait_exit();
    }

    fn wait_exit(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return child.wait().ok();
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    pub fn restart(&mut self) {
        self.spawn();
    }

    /// Raises exactly these faults (`testing.faults` nodes only; see
    /// docs/testing.md) and waits until the node logged the change.
    pub fn set_faults(&self, faults: &str) {
        let before = self.stderr().matches("fault switches changed").count();
        let path = self.data_dir.join("fault-control");
        let tmp = self.data_dir.join("fault-control.tmp");
        std::fs::write(&tmp, faults).expect("write fault control");
        std::fs::rename(&tmp, &path).expect("rename fault control");
        assert!(
            eventually(START_DEADLINE, || {
                self.stderr().matches("fault switches changed").count() > before
            }),
            "the node did not pick up the faults {faults:?}"
        );
    }

    /// Restarts with other flags (the data folder stays).
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| s.to_string()).collect();
        self.spawn();
    }

    pub fn request(&self, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
        request(&self.addr, method, path, &[], body)
    }

    pub fn request_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, Value) {
        request(&self.addr, method, path, headers, body)
    }

    pub fn json(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        self.request(method, path, body.to_string().as_bytes())
    }

    /// Produces one message; it must be answered 202. Returns its id.
    pub fn produce(&self, topic: &str, body: &str) -> String {
        let (status, answer) = self.request(
            "POST",
            &format!("/v1/topics/{topic}/messages"),
            body.as_bytes(),
        );
        assert_eq!(status, 202, "{answer}");
        answer["id"].as_str().expect("id").to_string()
    }

    /// Produces a batch (`messages` as the batch API takes them); it must
    /// be answered 202. Returns the answer.
    pub fn produce_batch(&self, topic: &str, messages: Vec<Value>) -> Value {
        let (status, answer) = self.json(
            "POST",
            &format!("/v1/topics/{topic}/messages/batch"),
            serde_json::json!({ "messages": messages }),
        );
        assert_eq!(status, 202, "{answer}");
        answer
    }

    /// A figure of `GET /v1/topics/{topic}`'s `partition_stats` (such as
    /// `high_watermark` or `in_flight`), summed over the partitions.
    pub fn stat_sum(&self, topic: &str, figure: &str) -> u64 {
        let (status, answer) = self.request("GET", &format!("/v1/topics/{topic}"), b"");
        assert_eq!(status, 200, "{answer}");
        answer["partition_stats"]
            .as_array()
            .expect("partition_stats")
            .iter()
            .map(|s| {
                s[figure]
                    .as_u64()
                    .unwrap_or_else(|| panic!("{figure} in {s}"))
            })
            .sum()
    }

    pub fn create_topic(&self, name: &str, body: Value) {
        let (status, answer) = self.json("PUT", &format!("/v1/topics/{name}"), body);
        assert!(
            status == 201 || status == 200,
            "create {name}: {status} {answer}"
        );
    }

    /// Consumes until `done` says enough or the deadline passes; acks each.
    pub fn consume(&self, topic: &str, body: Value) -> Vec<Value> {
        let (status, answer) = self.json("POST", &format!("/v1/topics/{topic}/consume"), body);
        assert_eq!(status, 200, "{answer}");
        answer["messages"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // A failing test shows the end of the node's log (its folder goes
        // with the test's temporary directory).
        if std::thread::panicking() {
            let log = self.stderr();
            let tail: Vec<&str> = log.lines().rev().take(80).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            eprintln!(
                "--- last lines of node {} ---\n{}",
                self.addr,
                tail.join("\n")
            );
        }
        // A later node may get this port: it is reached plainly unless told.
        if let Ok(mut accesses) = accesses().lock() {
            accesses.remove(&self.addr);
        }
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One HTTP/1.1 request on a fresh connection; the JSON body of the answer
/// (or `null`).
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Value) {
    let (status, _, bytes) = raw_request(addr, method, path, headers, body);
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

pub fn raw_request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    try_raw_request(addr, method, path, headers, body, REQUEST_DEADLINE)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// One request on a fresh connection; `Err` when there is no complete
/// answer within `timeout` (a stopped, paused or killed node).
pub fn try_raw_request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<(u16, String, Vec<u8>), String> {
    let (mut stream, authorization) = open(addr, timeout)?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(authorization) = &authorization {
        head.push_str(&format!("Authorization: {authorization}\r\n"));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body))
        .and_then(|()| stream.flush())
        .map_err(|e| format!("send: {e}"))?;
    let mut response = Vec::new();
    match stream.read_to_end(&mut response) {
        Ok(_) => {}
        // A TLS peer that closed without close_notify after its answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => {}
        Err(e) => return Err(format!("read: {e}")),
    }
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no complete response head")?;
    let head = String::from_utf8_lossy(&response[..split]).to_string();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no status")?;
    Ok((status, head, response[split + 4..].to_vec()))
}

/// Sends one whole request on a fresh connection and closes the connection
/// at once, reading nothing: a client that vanishes mid-request. The node
/// may or may not act on it. `Err` when the request could not be sent.
pub fn send_and_vanish(
    addr: &str,
    method: &str,
    path: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<(), String> {
    let (mut stream, authorization) = open(addr, timeout)?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(authorization) = &authorization {
        head.push_str(&format!("Authorization: {authorization}\r\n"));
    }
    head.push_str("\r\n");
    stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body))
        .and_then(|()| stream.flush())
        .map_err(|e| format!("send: {e}"))?;
    // Dropped unread: the connection closes with the answer unread.
    Ok(())
}

/// [`try_raw_request`] with the JSON body parsed (`null` if none).
/// What long polls started by [`single_message_polls`] answered, in the
/// order they answered.
pub type PollAnswers = std::sync::mpsc::Receiver<Result<(u16, Value), String>>;

/// Starts `count` long polls of `topic` at `addr`, each waiting up to 20 s
/// for one message, on threads of their own; their answers come through
/// the returned receiver as they arrive.
pub fn single_message_polls(
    addr: &str,
    topic: &str,
    count: usize,
) -> (Vec<std::thread::JoinHandle<()>>, PollAnswers) {
    let (answers, answered) = std::sync::mpsc::channel();
    let polls = (0..count)
        .map(|_| {
            let (addr, answers) = (addr.to_string(), answers.clone());
            let path = format!("/v1/topics/{topic}/consume");
            std::thread::spawn(move || {
                let answer = try_request(
                    &addr,
                    "POST",
                    &path,
                    br#"{"wait_ms": 20000, "max_messages": 1}"#,
                    Duration::from_secs(30),
                );
                let _ = answers.send(answer);
            })
        })
        .collect();
    (polls, answered)
}

pub fn try_request(
    addr: &str,
    method: &str,
    path: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<(u16, Value), String> {
    let (status, _, bytes) = try_raw_request(addr, method, path, &[], body, timeout)?;
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}

/// Runs a command that must exit by itself (a node that refuses to
/// start); kills it and fails if it still runs after `deadline`.
pub fn run_to_exit(mut command: Command, deadline: Duration) -> std::process::Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Read as it comes: a child that writes more than a pipe holds would
    // otherwise wait for us forever.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let exited = eventually(deadline, || matches!(child.try_wait(), Ok(Some(_))));
    if !exited {
        let _ = child.kill();
    }
    let status = child.wait().expect("wait");
    let output = std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    assert!(exited, "{command:?} did not exit within {deadline:?}");
    output
}

/// Polls `condition` until it holds or `deadline` passes.
pub fn eventually(deadline: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if condition() {
            return true;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
    condition()
}

/// Producer threads that send single messages on fresh connections until
/// stopped or until the node stops answering 202; they remember every id
/// answered 202.
pub struct Producers {
    accepted: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Producers {
    pub fn start(addr: &str, topic: &str, threads: usize) -> Self {
        let accepted: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>> =
            std::sync::Arc::default();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..threads)
            .map(|t| {
                let (accepted, stop) = (accepted.clone(), stop.clone());
                let (addr, path) = (addr.to_string(), format!("/v1/topics/{topic}/messages"));
                std::thread::spawn(move || {
                    let mut i = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        i += 1;
                        let body = format!("p{t}-{i}");
                        let Ok((status, answer)) = std::panic::catch_unwind(|| {
                            request(&addr, "POST", &path, &[], body.as_bytes())
                        }) else {
                            return;
                        };
                        if status != 202 {
                            return;
                        }
                        if let Some(id) = answer["id"].as_str() {
                            accepted.lock().expect("lock").insert(id.to_string());
                        }
                    }
                })
            })
            .collect();
        Self {
            accepted,
            stop,
            threads,
        }
    }

    pub fn accepted_count(&self) -> usize {
        self.accepted.lock().expect("lock").len()
    }

    /// Stops the threads (a killed node stops them too) and returns every
    /// id answered 202.
    pub fn finish(self) -> std::collections::BTreeSet<String> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for thread in self.threads {
            let _ = thread.join();
        }
        let accepted = self.accepted.lock().expect("lock").clone();
        accepted
    }
}

/// Consumes and acks a topic until it holds nothing available or in
/// flight; returns how often each id was delivered.
pub fn consume_all(node: &Node, topic: &str) -> std::collections::BTreeMap<String, u64> {
    let mut seen = std::collections::BTreeMap::new();
    let emptied = eventually(REQUEST_DEADLINE * 4, || {
        let messages = node.consume(
            topic,
            serde_json::json!({"max_messages": 500, "wait_ms": 100}),
        );
        if !messages.is_empty() {
            ack_batch(node, topic, &messages);
        }
        for message in &messages {
            if let Some(id) = message["id"].as_str() {
                *seen.entry(id.to_string()).or_insert(0) += 1;
            }
        }
        if !messages.is_empty() {
            return false;
        }
        let (_, stats) = node.request("GET", &format!("/v1/topics/{topic}"), b"");
        stats["partition_stats"].as_array().is_some_and(|parts| {
            parts
                .iter()
                .all(|p| p["available"] == 0 && p["in_flight"] == 0)
        })
    });
    assert!(emptied, "{topic} did not empty");
    seen
}

/// `GET /v1/topics/{parent}/children`, one child by name.
pub fn child_status(node: &Node, parent: &str, child: &str) -> Value {
    let (status, answer) = node.request("GET", &format!("/v1/topics/{parent}/children"), b"");
    assert_eq!(status, 200, "{answer}");
    answer["children"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == child).cloned())
        .unwrap_or_else(|| panic!("no child {child} in {answer}"))
}

/// Acks delivered messages with one batch request; returns each status.
pub fn ack_batch(node: &Node, topic: &str, messages: &[Value]) -> Vec<u64> {
    let receipts: Vec<&str> = messages
        .iter()
        .filter_map(|m| m["receipt"].as_str())
        .collect();
    let (status, answer) = node.json(
        "POST",
        &format!("/v1/topics/{topic}/ack/batch"),
        serde_json::json!({ "receipts": receipts }),
    );
    assert_eq!(status, 200, "{answer}");
    answer["results"]
        .as_array()
        .map(|results| {
            results
                .iter()
                .map(|r| r["status"].as_u64().unwrap_or(0))
                .collect()
        })
        .unwrap_or_default()
}

/// The value of one metric line (`name` with its labels, as exported), or 0.
pub fn metric(node: &Node, name: &str) -> f64 {
    let (_, _, body) = raw_request(&node.addr, "GET", "/metrics", &[], b"");
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|line| {
            let (key, value) = line.rsplit_once(' ')?;
            (key == name).then(|| value.parse().ok())?
        })
        .unwrap_or(0.0)
}

/// The longest a stopping Raft leader may take to hand leadership over.
/// The contract says leadership moves in about 150 ms in a rolling
/// restart; this bound is twice that, for a shared CI machine.
pub const HANDOVER_BOUND_MS: u64 = 300;

/// What a node that stopped gracefully says about its Raft leadership, from
/// its log's last word on it: `Ok(Some(ms))` when it handed leadership over
/// in `ms`, `Ok(None)` when it did not lead, `Err` when the handover failed
/// (or the log says nothing).
pub fn handover_at_stop(log: &str) -> Result<Option<u64>, String> {
    let line = log
        .lines()
        .rev()
        .find(|l| {
            l.contains("handed Raft leadership over")
                || l.contains("not the Raft leader at stop")
                || l.contains("could not hand leadership over")
        })
        .ok_or("the log says nothing about a handover")?;
    if line.contains("not the Raft leader at stop") {
        return Ok(None);
    }
    let took = line
        .split_once("took_ms=")
        .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|ms| ms.parse().ok());
    match took {
        Some(ms) if line.contains("handed Raft leadership over") => Ok(Some(ms)),
        _ => Err(line.to_string()),
    }
}

/// Runs the `narad` CLI against `node`: whether it succeeded, its stdout
/// and its stderr.
pub fn narad(node: &Node, args: &[&str]) -> (bool, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(args)
        .env("NARAD_URL", format!("http://{}", node.addr))
        .output()
        .expect("run narad");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}
