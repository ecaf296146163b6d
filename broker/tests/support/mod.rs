//! Test support: real `narad` processes on loopback, and a small blocking
//! HTTP/1.1 client. Every wait polls a condition with a deadline.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const START_DEADLINE: Duration = Duration::from_secs(60);
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(30);
/// Pause between two checks of a condition that has no blocking wait.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// One `narad serve` process.
pub struct Node {
    pub data_dir: PathBuf,
    pub addr: String,
    extra: Vec<String>,
    child: Option<Child>,
    stderr_path: PathBuf,
}

impl Node {
    /// Starts a node on a fresh port with `extra` flags (e.g. `--set k=v`).
    pub fn start(data_dir: &Path, extra: &[&str]) -> Self {
        let mut node = Self {
            data_dir: data_dir.to_path_buf(),
            addr: String::new(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
            stderr_path: data_dir.with_extension("stderr.log"),
        };
        node.spawn();
        node
    }

    fn spawn(&mut self) {
        std::fs::create_dir_all(&self.data_dir).expect("data dir");
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.stderr_path)
            .expect("stderr log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_narad"))
            .arg("serve")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--set",
                "storage.wal_ring_bytes=8388608",
            ])
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
                    let addr = rest
                        .split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_string();
                    let _ = sender.send(addr);
                }
            }
        });
        self.addr = receiver
            .recv_timeout(START_DEADLINE)
            .unwrap_or_else(|_| panic!("node did not start: {}", self.stderr()));
        self.child = Some(child);
    }

    /// One shard unless the test chose a count.
    fn default_shards(&self) -> &'static [&'static str] {
        if self.extra.iter().any(|a| a == "--shards") {
            &[]
        } else {
            &["--shards", "1"]
        }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
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
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(REQUEST_DEADLINE))
        .expect("timeout");
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).expect("write head");
    stream.write_all(body).expect("write body");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).expect("read response");
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head");
    let head = String::from_utf8_lossy(&response[..split]).to_string();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (status, head, response[split + 4..].to_vec())
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
