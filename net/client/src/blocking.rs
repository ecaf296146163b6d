//! The same client for code without an async runtime (a command-line tool,
//! a benchmark's producer threads): each call runs the async call to its
//! end on a small runtime of the client's own, on the calling thread.
//!
//! ```no_run
//! # fn run() -> Result<(), narad_client::Error> {
//! use narad_client::blocking::Client;
//!
//! let client = Client::builder("http://127.0.0.1:8080").build()?;
//! let id = client.produce("orders", None, "order 1")?;
//! for delivery in client.consume("orders", &Default::default())? {
//!     client.ack("orders", &delivery.receipt)?;
//! }
//! # let _ = id;
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;

use crate::{
    ClientTlsFiles, ConsumeRequest, Consumed, Delivery, Error, Outgoing, Produced, ProducedBatch,
    Response, RetryPolicy, Settle, Settled,
};

/// Builds a blocking [`Client`]; the settings are those of
/// [`crate::ClientBuilder`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    inner: crate::ClientBuilder,
}

impl ClientBuilder {
    /// Sends `Authorization: Bearer TOKEN` with every request.
    pub fn token(self, token: &str) -> Self {
        Self {
            inner: self.inner.token(token),
        }
    }

    /// Sends HTTP Basic credentials with every request.
    pub fn password(self, user: &str, password: &str) -> Self {
        Self {
            inner: self.inner.password(user, password),
        }
    }

    /// For `https://`: the CA to trust and the client certificate to show.
    pub fn tls(self, files: ClientTlsFiles) -> Self {
        Self {
            inner: self.inner.tls(files),
        }
    }

    /// How long one attempt may take (a long poll's `wait_ms` comes on top).
    pub fn timeout(self, timeout: Duration) -> Self {
        Self {
            inner: self.inner.timeout(timeout),
        }
    }

    /// How calls are retried.
    pub fn retry(self, retry: RetryPolicy) -> Self {
        Self {
            inner: self.inner.retry(retry),
        }
    }

    /// See [`crate::ClientBuilder::idempotency_keys`].
    pub fn idempotency_keys(self, on: bool) -> Self {
        Self {
            inner: self.inner.idempotency_keys(on),
        }
    }

    /// The client, with its runtime.
    pub fn build(self) -> Result<Client, Error> {
        // reqwest's connections need a runtime with I/O and timers; one
        // thread is enough, and it is the caller's while a call runs.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Config(format!("the client's runtime: {e}")))?;
        let inner = {
            // reqwest registers its connector with the current runtime.
            let _entered = runtime.enter();
            self.inner.build()?
        };
        Ok(Client { inner, runtime })
    }
}

/// A blocking client of one node: each method is its async namesake of
/// [`crate::Client`], run to its end. It keeps its connections alive
/// between calls. Its runtime runs on whichever thread calls it, one call
/// at a time: threads that call at once should each build their own
/// client (that is cheap).
#[derive(Debug)]
pub struct Client {
    inner: crate::Client,
    runtime: tokio::runtime::Runtime,
}

pub use crate::connection::Connection;

impl Client {
    /// A builder for a client of `url` (`http://HOST:PORT` or
    /// `https://HOST:PORT`).
    pub fn builder(url: &str) -> ClientBuilder {
        ClientBuilder {
            inner: crate::Client::builder(url),
        }
    }

    /// The URL this client sends to.
    pub fn url(&self) -> &str {
        self.inner.url()
    }

    /// A [`Connection`] of its own to the node, with this client's TLS
    /// settings, credentials and timeout (it does not use the client's
    /// runtime or pool).
    pub fn connect(&self) -> Result<Connection, Error> {
        Connection::open(&self.inner)
    }

    /// See [`crate::Client::request`].
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
        wait: Duration,
    ) -> Result<Response, Error> {
        self.runtime
            .block_on(self.inner.request(method, path, headers, body, wait))
    }

    /// See [`crate::Client::put_topic`].
    pub fn put_topic(&self, topic: &str, settings: &Value) -> Result<Value, Error> {
        self.runtime.block_on(self.inner.put_topic(topic, settings))
    }

    /// See [`crate::Client::produce`].
    pub fn produce(
        &self,
        topic: &str,
        key: Option<&str>,
        value: impl Into<Bytes>,
    ) -> Result<String, Error> {
        self.runtime.block_on(self.inner.produce(topic, key, value))
    }

    /// See [`crate::Client::produce_batch`].
    pub fn produce_batch(&self, topic: &str, messages: &[Outgoing]) -> Result<Vec<String>, Error> {
        self.runtime
            .block_on(self.inner.produce_batch(topic, messages))
    }

    /// See [`crate::Client::produce_message`].
    pub fn produce_message(&self, topic: &str, message: &Outgoing) -> Result<Produced, Error> {
        self.runtime
            .block_on(self.inner.produce_message(topic, message))
    }

    /// See [`crate::Client::produce_batch_detailed`].
    pub fn produce_batch_detailed(
        &self,
        topic: &str,
        messages: &[Outgoing],
    ) -> Result<ProducedBatch, Error> {
        self.runtime
            .block_on(self.inner.produce_batch_detailed(topic, messages))
    }

    /// See [`crate::Client::consume`].
    pub fn consume(&self, topic: &str, request: &ConsumeRequest) -> Result<Vec<Delivery>, Error> {
        self.runtime.block_on(self.inner.consume(topic, request))
    }

    /// See [`crate::Client::consume_acking`].
    pub fn consume_acking(
        &self,
        topic: &str,
        acks: &[&str],
        request: &ConsumeRequest,
    ) -> Result<Consumed, Error> {
        self.runtime
            .block_on(self.inner.consume_acking(topic, acks, request))
    }

    /// See [`crate::Client::browse`].
    pub fn browse(
        &self,
        topic: &str,
        partition: u32,
        offset: Option<u64>,
        limit: u32,
    ) -> Result<crate::BrowsedPage, Error> {
        self.runtime
            .block_on(self.inner.browse(topic, partition, offset, limit))
    }

    /// See [`crate::Client::search`].
    pub fn search(
        &self,
        topic: &str,
        query: &crate::SearchQuery,
    ) -> Result<crate::SearchPage, Error> {
        self.runtime.block_on(self.inner.search(topic, query))
    }

    /// See [`crate::Client::rates`].
    pub fn rates(&self, topic: &str) -> Result<crate::Rates, Error> {
        self.runtime.block_on(self.inner.rates(topic))
    }

    /// See [`crate::Client::ack`].
    pub fn ack(&self, topic: &str, receipt: &str) -> Result<(), Error> {
        self.runtime.block_on(self.inner.ack(topic, receipt))
    }

    /// See [`crate::Client::nack`].
    pub fn nack(&self, topic: &str, receipt: &str, delay: Duration) -> Result<(), Error> {
        self.runtime
            .block_on(self.inner.nack(topic, receipt, delay))
    }

    /// See [`crate::Client::extend`].
    pub fn extend(&self, topic: &str, receipt: &str, visibility: Duration) -> Result<u64, Error> {
        self.runtime
            .block_on(self.inner.extend(topic, receipt, visibility))
    }

    /// See [`crate::Client::settle_batch`].
    pub fn settle_batch(
        &self,
        topic: &str,
        receipts: &[&str],
        how: Settle,
    ) -> Result<Vec<Settled>, Error> {
        self.runtime
            .block_on(self.inner.settle_batch(topic, receipts, how))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port nothing listens on.
    fn closed_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(1)
    }

    /// Serves one request on `listener` with a batch produce's answer and
    /// returns the request as received (head and body).
    fn answer_one_batch(listener: &std::net::TcpListener) -> String {
        use std::io::{Read as _, Write as _};
        let (mut stream, _) = listener.accept().expect("accept");
        let mut received = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = stream.read(&mut buf).expect("read");
            assert!(n > 0, "the request ended early");
            received.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&received).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_string())
                    })
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                if body.len() >= length {
                    break;
                }
            }
        }
        let answer = r#"{"ids":["0123456789abcdef0123456789abcdef"]}"#;
        write!(
            stream,
            "HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
            answer.len()
        )
        .expect("answer");
        String::from_utf8_lossy(&received).to_string()
    }

    #[test]
    fn a_key_with_a_line_break_never_goes_in_a_header() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = Client::builder(&format!("http://{addr}"))
            .build()
            .expect("client");
        for key in ["k\r\nX-Injected: 1", "k\nx", "k\0"] {
            let received = std::thread::scope(|scope| {
                let server = scope.spawn(|| answer_one_batch(&listener));
                let id = client.produce("orders", Some(key), "v");
                assert!(id.is_ok(), "{key:?}: {id:?}");
                server.join().expect("server")
            });
            let (head, body) = received.split_once("\r\n\r\n").unwrap_or_default();
            assert!(
                head.starts_with("POST /v1/topics/orders/messages/batch "),
                "{key:?} goes in a batch of one: {head}"
            );
            assert!(
                !head.to_ascii_lowercase().contains("x-injected")
                    && !head.to_ascii_lowercase().contains("narad-key"),
                "{key:?} is in no header: {head}"
            );
            let sent: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
            assert_eq!(sent["messages"][0]["key"], key, "{body}");
        }
    }

    #[test]
    fn a_refused_connection_is_retried_then_reported_with_the_url() {
        let url = format!("http://127.0.0.1:{}", closed_port());
        let client = Client::builder(&url)
            .retry(RetryPolicy {
                attempts: 3,
                backoff_base: Duration::from_millis(1),
                backoff_max: Duration::from_millis(2),
            })
            .build()
            .expect("client");
        match client.request("GET", "/v1/topics", &[], Bytes::new(), Duration::ZERO) {
            Err(Error::Transport(detail)) => assert!(detail.contains(&url), "{detail}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_answer_sent_in_chunks_is_read_whole() {
        // A server (or a proxy before it) may send any answer chunked.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let (mut stream, _) = listener.accept().expect("accept");
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = stream.read(&mut buf).expect("read");
                assert!(n > 0, "the client hung up");
                request.extend_from_slice(&buf[..n]);
            }
            stream
                .write_all(
                    b"HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\n\
                      transfer-encoding: chunked\r\n\r\n\
                      5\r\n{\"id\"\r\n9\r\n:\"m-0001\"\r\n1\r\n}\r\n0\r\n\r\n",
                )
                .expect("write");
        });
        let client = Client::builder(&format!("http://{addr}"))
            .build()
            .expect("client");
        assert_eq!(
            client.produce("orders", None, "v").expect("produce"),
            "m-0001"
        );
        server.join().expect("server");
    }

    #[test]
    fn a_connection_reads_chunked_answers_and_keeps_going() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let (mut stream, _) = listener.accept().expect("accept");
            let mut seen = Vec::new();
            let mut buf = [0u8; 1024];
            for answer in [
                &b"HTTP/1.1 202 Accepted\r\ntransfer-encoding: chunked\r\n\r\n\
                   5\r\n{\"id\"\r\n4\r\n:\"a\"\r\n1\r\n}\r\n0\r\n\r\n"[..],
                &b"HTTP/1.1 202 Accepted\r\ncontent-length: 10\r\n\r\n{\"id\":\"b\"}"[..],
            ] {
                // Each request's head and its one-byte body.
                while !seen.windows(5).any(|w| w == b"\r\n\r\nv") {
                    let n = stream.read(&mut buf).expect("read");
                    assert!(n > 0, "the client hung up");
                    seen.extend_from_slice(&buf[..n]);
                }
                seen.clear();
                stream.write_all(answer).expect("write");
            }
        });
        let client = Client::builder(&format!("http://{addr}"))
            .build()
            .expect("client");
        let mut connection = client.connect().expect("connect");
        for id in ["a", "b"] {
            let answer = connection
                .request("POST", "/v1/topics/t/messages", &[], b"v", Duration::ZERO)
                .expect("answer");
            assert_eq!((answer.status, answer.body["id"].as_str()), (202, Some(id)));
        }
        assert!(matches!(
            connection.request(
                "POST",
                "/p",
                &[("Narad-Key", "a\r\nb")],
                b"v",
                Duration::ZERO
            ),
            Err(Error::Config(_))
        ));
        server.join().expect("server");
    }
}
