//! A small blocking Rust client for the HTTP API, used by the `narad` CLI
//! (and by tests and tools that do not need a runtime).
//!
//! It retries what docs/status-codes.md marks retryable (408, 429, 500, 502,
//! 503) and failed connections, with exponential backoff and jitter, and
//! never retries another 4xx. A retried produce may store a second copy: the
//! contract allows it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use std::sync::Arc;

use crate::error::{ApiError, ErrorCode};
use crate::tls::{client_config, ClientTlsFiles};

/// How the client retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 5,
            backoff_base: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
        }
    }
}

/// How long one request may take before the client gives up on it, unless
/// [`Client::with_timeout`] says otherwise.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientError {
    /// The server answered with an API error.
    Api { status: u16, error: ApiError },
    /// No answer: connection refused, reset, timed out.
    Transport(String),
    /// The TLS handshake failed (a certificate the other side does not
    /// trust, a missing client certificate): trying again changes nothing.
    Tls(String),
    /// An answer that is not what the API promises.
    BadResponse(String),
    /// The server URL is not `http://HOST:PORT`.
    BadUrl(String),
    /// The request cannot be written as HTTP (a header value with a line
    /// break, a path with a space): nothing was sent.
    BadRequest(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Api { error, .. } => write!(f, "{} ({})", error.message, error.code.as_str()),
            Self::Transport(detail) => write!(f, "no answer from the server: {detail}"),
            Self::Tls(detail) => write!(f, "TLS with the server failed: {detail}"),
            Self::BadResponse(detail) => write!(f, "unexpected answer from the server: {detail}"),
            Self::BadRequest(detail) => write!(f, "the request cannot be sent: {detail}"),
            Self::BadUrl(url) => write!(
                f,
                "server URL {url:?} must look like http://HOST:PORT or https://HOST:PORT"
            ),
        }
    }
}

impl std::error::Error for ClientError {}

impl ClientError {
    fn retryable(&self) -> bool {
        match self {
            Self::Api { error, .. } => error.code.retry(),
            Self::Transport(_) => true,
            Self::Tls(_) => false,
            Self::BadResponse(_) | Self::BadUrl(_) | Self::BadRequest(_) => false,
        }
    }
}

/// A client of one node.
#[derive(Debug, Clone)]
pub struct Client {
    addr: String,
    retry: RetryPolicy,
    /// Set for an `https://` URL.
    tls: Option<Tls>,
    /// The `Authorization` header sent with every request.
    authorization: Option<String>,
    /// How long one attempt may wait on the socket.
    timeout: Duration,
}

/// How a client speaks TLS: its settings, or why it cannot.
#[derive(Debug, Clone)]
enum Tls {
    Ready(Arc<rustls::ClientConfig>),
    Unavailable(String),
}

/// A stream the client reads and writes: TCP, or TLS over TCP (both may
/// move between threads, as a benchmark's connections do).
trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// A successful answer: its status and JSON body (`null` when empty).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

/// Percent-encodes a path segment (everything but `A-Za-z0-9-._~@`; `@`
/// is allowed in a path segment, and user names may hold it).
pub fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b'@') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The error code an answer without a JSON error body stands for.
pub fn code_for_status(status: u16) -> ErrorCode {
    match status {
        400 => ErrorCode::InvalidRequest,
        401 => ErrorCode::Unauthenticated,
        403 => ErrorCode::Forbidden,
        404 => ErrorCode::NotFound,
        405 => ErrorCode::MethodNotAllowed,
        408 => ErrorCode::RequestTimeout,
        409 => ErrorCode::Conflict,
        410 => ErrorCode::LeaseGone,
        413 => ErrorCode::TooLarge,
        422 => ErrorCode::SchemaMismatch,
        429 => ErrorCode::Overloaded,
        502 => ErrorCode::OwnerUnreachable,
        503 => ErrorCode::Stopping,
        _ => ErrorCode::Internal,
    }
}

fn jitter_below(bound_ms: u64) -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut x = u64::from(nanos) ^ 0x9E37_79B9_7F4A_7C15;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x % bound_ms.max(1)
}

/// An HTTP/1.1 request's head, up to and including the blank line.
fn request_head(
    method: &str,
    path: &str,
    host: &str,
    body_len: usize,
    headers: &[(&str, &str)],
    close: bool,
) -> Result<String, ClientError> {
    // What the head is made of must not end a line or the head early: a
    // key with a line break would otherwise add headers of its own.
    let token = |text: &str| !text.is_empty() && text.bytes().all(|b| b.is_ascii_graphic());
    if !token(method) || !token(path) {
        return Err(ClientError::BadRequest(format!(
            "{method:?} {path:?} is not a request line"
        )));
    }
    for (name, value) in headers {
        let value_ok = value
            .bytes()
            .all(|b| b == b'\t' || b == b' ' || b.is_ascii_graphic() || b >= 0x80);
        if !token(name) || name.contains(':') || !value_ok {
            return Err(ClientError::BadRequest(format!(
                "header {name:?} with value {value:?}: a header holds no line break or control character"
            )));
        }
    }
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {body_len}\r\n");
    if close {
        head.push_str("Connection: close\r\n");
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    Ok(head)
}

/// An answer's status and body as the client's result: 2xx with a JSON (or
/// empty) body, or the API error it carries.
fn answer_from(status: u16, body: &[u8]) -> Result<Answer, ClientError> {
    let parsed: Option<Value> = if body.is_empty() {
        Some(Value::Null)
    } else {
        serde_json::from_slice(body).ok()
    };
    if (200..300).contains(&status) {
        let json = parsed.ok_or_else(|| {
            ClientError::BadResponse(format!("status {status} with a body that is not JSON"))
        })?;
        return Ok(Answer { status, body: json });
    }
    // A body without the API's error shape (a proxy, or hyper refusing a
    // malformed request) still has a status: it decides the code.
    let json = parsed.unwrap_or(Value::Null);
    let code = json["error"]["code"]
        .as_str()
        .and_then(ErrorCode::parse)
        .unwrap_or_else(|| code_for_status(status));
    let message = json["error"]["message"]
        .as_str()
        .map_or_else(|| format!("the server answered {status}"), str::to_string);
    Err(ClientError::Api {
        status,
        error: ApiError::new(code, message),
    })
}

impl Client {
    /// A client of `url` (`http://HOST:PORT` or `https://HOST:PORT`, a
    /// trailing `/` allowed). HTTPS trusts the system's CA bundle until
    /// [`Self::with_tls`] names another CA.
    pub fn new(url: &str) -> Result<Self, ClientError> {
        let (rest, https) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(rest), _) => (rest, false),
            (_, Some(rest)) => (rest, true),
            _ => return Err(ClientError::BadUrl(url.to_string())),
        };
        let addr = rest.trim_end_matches('/');
        if addr.is_empty() || addr.contains('/') {
            return Err(ClientError::BadUrl(url.to_string()));
        }
        let tls = https.then(|| match client_config(&ClientTlsFiles::default()) {
            Ok(config) => Tls::Ready(config),
            Err(reason) => Tls::Unavailable(reason),
        });
        Ok(Self {
            addr: addr.to_string(),
            retry: RetryPolicy::default(),
            tls,
            authorization: None,
            timeout: REQUEST_TIMEOUT,
        })
    }

    /// The CA to trust and the client certificate to show, for HTTPS.
    pub fn with_tls(mut self, files: &ClientTlsFiles) -> Result<Self, ClientError> {
        if self.tls.is_some() {
            let config = client_config(files).map_err(ClientError::Tls)?;
            self.tls = Some(Tls::Ready(config));
        }
        Ok(self)
    }

    /// Sends `Authorization: Bearer TOKEN` with every request.
    pub fn with_token(mut self, token: &str) -> Self {
        self.authorization = Some(format!("Bearer {token}"));
        self
    }

    /// Sends `Authorization: Basic` with this user and password.
    pub fn with_password(mut self, user: &str, password: &str) -> Self {
        use base64::Engine;
        let pair = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        self.authorization = Some(format!("Basic {pair}"));
        self
    }

    /// A TCP connection to the node, under TLS for HTTPS.
    fn open_stream(&self, extra_wait: Duration) -> Result<Box<dyn Stream>, ClientError> {
        let transport = |e: std::io::Error| ClientError::Transport(format!("{}: {e}", self.url()));
        let stream = TcpStream::connect(&self.addr).map_err(transport)?;
        stream.set_nodelay(true).map_err(transport)?;
        stream
            .set_read_timeout(Some(self.timeout + extra_wait))
            .map_err(transport)?;
        stream
            .set_write_timeout(Some(self.timeout))
            .map_err(transport)?;
        let config = match &self.tls {
            None => return Ok(Box::new(stream)),
            Some(Tls::Unavailable(reason)) => {
                return Err(ClientError::Tls(format!("{}: {reason}", self.url())))
            }
            Some(Tls::Ready(config)) => config.clone(),
        };
        let host = self
            .addr
            .rsplit_once(':')
            .map_or(self.addr.as_str(), |(host, _)| host)
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let name = rustls::pki_types::ServerName::try_from(host)
            .map_err(|e| ClientError::BadUrl(format!("{}: {e}", self.addr)))?;
        let connection = rustls::ClientConnection::new(config, name)
            .map_err(|e| ClientError::Transport(format!("{}: TLS: {e}", self.url())))?;
        Ok(Box::new(rustls::StreamOwned::new(connection, stream)))
    }

    /// How long one attempt may wait for the node to take its request or
    /// to answer (a long-polling consume waits its `wait_ms` on top).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The node this client talks to, as a URL.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// One request with the retry policy applied.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Answer, ClientError> {
        self.call_waiting(method, path, headers, body, Duration::ZERO)
    }

    /// [`Self::call`] for a request the node may hold for `wait` before it
    /// answers (a long poll): the socket waits that long on top of the
    /// timeout.
    fn call_waiting(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        wait: Duration,
    ) -> Result<Answer, ClientError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.once(method, path, headers, body, wait) {
                Ok(answer) => return Ok(answer),
                Err(error) if error.retryable() && attempt < self.retry.attempts => {
                    let exponential = self
                        .retry
                        .backoff_base
                        .saturating_mul(1 << (attempt - 1).min(16));
                    let ceiling = exponential.min(self.retry.backoff_max);
                    let wait = Duration::from_millis(jitter_below(
                        u64::try_from(ceiling.as_millis()).unwrap_or(1),
                    ));
                    std::thread::sleep(wait);
                }
                Err(error) => return Err(error),
            }
        }
    }

    fn once(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        wait: Duration,
    ) -> Result<Answer, ClientError> {
        let transport = |e: std::io::Error| {
            // rustls reports a failed handshake as an I/O error wrapping its own.
            match e
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            {
                Some(tls) => ClientError::Tls(format!("{}: {tls}", self.url())),
                None => ClientError::Transport(format!("{}: {e}", self.url())),
            }
        };
        let mut all: Vec<(&str, &str)> = headers.to_vec();
        if let Some(authorization) = &self.authorization {
            all.push(("Authorization", authorization));
        }
        let head = request_head(method, path, &self.addr, body.len(), &all, true)?;
        let mut stream = self.open_stream(wait)?;
        stream.write_all(head.as_bytes()).map_err(transport)?;
        stream.write_all(body).map_err(transport)?;
        stream.flush().map_err(transport)?;
        let mut response = Vec::new();
        match stream.read_to_end(&mut response) {
            Ok(_) => {}
            // A TLS peer that closes without close_notify, after a whole answer.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => {}
            Err(e) => return Err(transport(e)),
        }
        let split = response
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| {
                ClientError::Transport(format!(
                    "{}: the connection closed before a whole answer",
                    self.url()
                ))
            })?;
        let (head, rest) = response.split_at(split);
        let body = rest.get(4..).unwrap_or_default();
        let head = String::from_utf8_lossy(head);
        let status: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ClientError::BadResponse(format!("no status line in {head:?}")))?;
        answer_from(status, body)
    }

    /// A keep-alive connection to this client's node, with its TLS and
    /// credentials.
    pub fn connect(&self) -> Result<Connection, ClientError> {
        Ok(Connection {
            stream: BufReader::new(self.open_stream(Duration::ZERO)?),
            host: self.addr.clone(),
            authorization: self.authorization.clone(),
        })
    }

    pub fn put_topic(&self, topic: &str, config: &Value) -> Result<Answer, ClientError> {
        self.call(
            "PUT",
            &format!("/v1/topics/{}", encode_segment(topic)),
            &[],
            config.to_string().as_bytes(),
        )
    }

    /// `GET /v1/cluster`.
    pub fn cluster(&self) -> Result<Value, ClientError> {
        Ok(self.call("GET", "/v1/cluster", &[], b"")?.body)
    }

    pub fn list_topics(&self) -> Result<Value, ClientError> {
        Ok(self.call("GET", "/v1/topics", &[], b"")?.body)
    }

    pub fn get_topic(&self, topic: &str) -> Result<Value, ClientError> {
        Ok(self
            .call(
                "GET",
                &format!("/v1/topics/{}", encode_segment(topic)),
                &[],
                b"",
            )?
            .body)
    }

    pub fn delete_topic(&self, topic: &str) -> Result<(), ClientError> {
        self.call(
            "DELETE",
            &format!("/v1/topics/{}", encode_segment(topic)),
            &[],
            b"",
        )
        .map(|_| ())
    }

    /// Produces one message; returns its id.
    pub fn produce(
        &self,
        topic: &str,
        key: Option<&str>,
        value: &[u8],
    ) -> Result<String, ClientError> {
        let headers: Vec<(&str, &str)> = key.map(|k| vec![("Narad-Key", k)]).unwrap_or_default();
        let answer = self.call(
            "POST",
            &format!("/v1/topics/{}/messages", encode_segment(topic)),
            &headers,
            value,
        )?;
        answer.body["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| ClientError::BadResponse("no id".into()))
    }

    /// Consumes up to `max` messages, waiting up to `wait_ms` for the first.
    pub fn consume(&self, topic: &str, max: u32, wait_ms: u64) -> Result<Vec<Value>, ClientError> {
        self.consume_with(topic, &json!({"max_messages": max, "wait_ms": wait_ms}))
    }

    /// Consumes with the request body `request` (`max_messages`,
    /// `wait_ms`, `visibility_timeout_ms`, `partition`).
    pub fn consume_with(&self, topic: &str, request: &Value) -> Result<Vec<Value>, ClientError> {
        let wait = Duration::from_millis(request["wait_ms"].as_u64().unwrap_or(0));
        let answer = self.call_waiting(
            "POST",
            &format!("/v1/topics/{}/consume", encode_segment(topic)),
            &[],
            request.to_string().as_bytes(),
            wait,
        )?;
        Ok(answer.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    pub fn ack(&self, topic: &str, receipt: &str) -> Result<(), ClientError> {
        let body = json!({ "receipt": receipt });
        self.call(
            "POST",
            &format!("/v1/topics/{}/ack", encode_segment(topic)),
            &[],
            body.to_string().as_bytes(),
        )
        .map(|_| ())
    }

    /// Acks up to 1000 receipts with one request; the answer has one
    /// result per receipt.
    pub fn ack_batch(&self, topic: &str, receipts: &[&str]) -> Result<Value, ClientError> {
        let body = json!({ "receipts": receipts });
        Ok(self
            .call(
                "POST",
                &format!("/v1/topics/{}/ack/batch", encode_segment(topic)),
                &[],
                body.to_string().as_bytes(),
            )?
            .body)
    }
}

/// One keep-alive HTTP/1.1 connection to a node, for clients that send
/// many requests one after another (benchmarks). It neither retries nor
/// reconnects: a caller that gets a transport error opens a new one.
pub struct Connection {
    /// Read through the buffer; written through `get_mut` (a request is
    /// written only once the previous answer was read whole).
    stream: BufReader<Box<dyn Stream>>,
    host: String,
    /// The `Authorization` header of the client that opened it.
    authorization: Option<String>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("host", &self.host)
            .finish()
    }
}

impl Connection {
    /// Connects to `addr` (`HOST:PORT`) over plain HTTP, without
    /// credentials ([`Client::connect`] for HTTPS or credentials).
    pub fn open(addr: &str) -> Result<Self, ClientError> {
        Client::new(&format!("http://{addr}"))?.connect()
    }

    /// One request; the answer as [`Client::call`] gives it.
    pub fn call(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Answer, ClientError> {
        let transport = |e: std::io::Error| ClientError::Transport(e.to_string());
        let mut all: Vec<(&str, &str)> = headers.to_vec();
        if let Some(authorization) = &self.authorization {
            all.push(("Authorization", authorization));
        }
        let mut bytes =
            request_head(method, path, &self.host, body.len(), &all, false)?.into_bytes();
        bytes.extend_from_slice(body);
        let writer = self.stream.get_mut();
        writer.write_all(&bytes).map_err(transport)?;
        writer.flush().map_err(transport)?;
        let mut line = String::new();
        self.stream.read_line(&mut line).map_err(transport)?;
        let status: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ClientError::Transport(format!("no status line: {line:?}")))?;
        let mut length = 0usize;
        loop {
            line.clear();
            self.stream.read_line(&mut line).map_err(transport)?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = value
                    .trim()
                    .parse()
                    .map_err(|_| ClientError::BadResponse(format!("bad header {line:?}")))?;
            }
        }
        let mut answer = vec![0u8; length];
        self.stream.read_exact(&mut answer).map_err(transport)?;
        answer_from(status, &answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode_segment("orders.v2_x-y"), "orders.v2_x-y");
        assert_eq!(encode_segment("bad name/x"), "bad%20name%2Fx");
    }

    #[test]
    fn urls_are_checked() {
        assert!(Client::new("http://127.0.0.1:8080").is_ok());
        assert!(Client::new("http://127.0.0.1:8080/").is_ok());
        assert!(Client::new("https://127.0.0.1:8443").is_ok());
        assert!(matches!(
            Client::new("ftp://x:1"),
            Err(ClientError::BadUrl(_))
        ));
        assert!(matches!(
            Client::new("127.0.0.1:8080"),
            Err(ClientError::BadUrl(_))
        ));
    }

    #[test]
    fn only_the_tables_retryable_answers_are_retried() {
        let api = |code| ClientError::Api {
            status: 0,
            error: ApiError::new(code, ""),
        };
        assert!(api(ErrorCode::Overloaded).retryable());
        assert!(api(ErrorCode::RequestTimeout).retryable());
        assert!(api(ErrorCode::NoQuorum).retryable());
        assert!(!api(ErrorCode::LeaseGone).retryable());
        assert!(!api(ErrorCode::InvalidRequest).retryable());
        assert!(ClientError::Transport("refused".into()).retryable());
    }

    #[test]
    fn a_header_value_with_a_line_break_is_refused_before_anything_is_sent() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let client = Client::new(&format!("http://{addr}")).unwrap_or_else(|e| panic!("{e}"));
        for key in ["k\r\nX-Injected: 1", "k\nx", "k\0"] {
            assert!(
                matches!(
                    client.produce("orders", Some(key), b"v"),
                    Err(ClientError::BadRequest(_))
                ),
                "{key:?}"
            );
        }
        assert!(matches!(
            client.call("GET", "/v1/topics HTTP/1.1\r\nX: y", &[], b""),
            Err(ClientError::BadRequest(_))
        ));
        assert!(
            listener.accept().is_err(),
            "no connection was made for a request that cannot be sent"
        );
        // A key of any other text goes as it is.
        assert!(request_head("POST", "/p", "h", 0, &[("Narad-Key", "ключ 1")], true).is_ok());
    }

    #[test]
    fn a_refused_connection_is_retried_then_reported() {
        // A port nothing listens on: bind, learn it, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(1);
        let client = Client::new(&format!("http://127.0.0.1:{port}"))
            .unwrap_or_else(|e| panic!("{e}"))
            .with_retry(RetryPolicy {
                attempts: 3,
                backoff_base: Duration::from_millis(1),
                backoff_max: Duration::from_millis(2),
            });
        assert!(matches!(
            client.list_topics(),
            Err(ClientError::Transport(_))
        ));
    }
}
