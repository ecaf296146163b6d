//! hyper 1.x HTTP/1.1 on glommio, with the timeouts and size limits enforced
//! by us (hyper's own header timer needs a `Send` timer, which a glommio
//! shard does not have).
//!
//! - **Idle**: a connection with no request under way for `idle_timeout` is
//!   closed (this covers a client that stops reading a response too).
//! - **Header**: once the first byte of a request arrived, the whole header
//!   must arrive within `header_timeout`, else the client gets 408
//!   `request_timeout` and the connection closes.
//! - **Body**: the body must arrive within `body_timeout` (408) and hold at
//!   most `body_bytes_max` bytes (413 `too_large`); it is read whole before
//!   the handler runs.
//!
//! Every answer the adapter writes itself uses the API's JSON error shape.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;

use crate::error::{ApiError, ErrorCode};
use crate::tls::{ServerTls, TLS_HANDSHAKE_RECORD};

/// A request with its whole body.
pub type HttpRequest = hyper::Request<Bytes>;
/// A response with its whole body.
pub type HttpResponse = hyper::Response<Full<Bytes>>;
/// What the server calls for each request.
pub type Handler = Rc<dyn Fn(HttpRequest) -> Pin<Box<dyn Future<Output = HttpResponse>>>>;
/// Looks at a request's head before its body is read: an answer refuses
/// the request unread (the connection then closes), as a node refuses a
/// request without credentials before it holds its body.
pub type Screen = Rc<dyn Fn(&hyper::http::request::Parts) -> Option<HttpResponse>>;

/// Bytes read from the socket at a time.
const READ_CHUNK_BYTES: usize = 16 * 1024;
/// How long, and how much, a plain-HTTP request to a TLS port is read
/// after its answer before the connection closes.
const PLAIN_ON_TLS_DRAIN: Duration = Duration::from_secs(1);
const PLAIN_ON_TLS_DRAIN_BYTES: usize = 64 * 1024;
/// How often the watchdog looks at a connection whose handler is running.
const WATCHDOG_IDLE_CHECK: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
    pub body_bytes_max: usize,
}

/// A JSON error response.
/// What the whole node lets its clients hold, shared by every shard's
/// server: open connections (`http.max_connections`; over it a new
/// connection gets `429 overloaded` and is closed) and bytes of request
/// bodies being read or handled (`http.max_buffered_body_bytes`; over it a
/// request gets `429 overloaded`). A permit is given back when dropped, so
/// a connection or request that ends any way at all returns what it held.
#[derive(Debug)]
pub struct NodeBudget {
    max_connections: usize,
    connections: AtomicUsize,
    max_buffered_body_bytes: u64,
    buffered_body_bytes: AtomicU64,
}

impl NodeBudget {
    pub fn new(max_connections: usize, max_buffered_body_bytes: u64) -> Arc<Self> {
        Arc::new(Self {
            max_connections,
            connections: AtomicUsize::new(0),
            max_buffered_body_bytes,
            buffered_body_bytes: AtomicU64::new(0),
        })
    }

    /// No limits (benchmarks and tests of the server alone).
    pub fn unlimited() -> Arc<Self> {
        Self::new(usize::MAX, u64::MAX)
    }

    /// Connections open now (`narad_connections_open`).
    pub fn connections_open(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Bytes of request bodies held now.
    pub fn buffered_body_bytes(&self) -> u64 {
        self.buffered_body_bytes.load(Ordering::SeqCst)
    }

    /// A connection's share, if the node has one left (the Kafka listener
    /// counts its connections here too).
    pub fn try_connection(self: &Arc<Self>) -> Option<Permit> {
        let taken = self
            .connections
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |open| {
                (open < self.max_connections).then_some(open + 1)
            })
            .is_ok();
        taken.then(|| Permit {
            budget: self.clone(),
            kind: PermitKind::Connection,
        })
    }

    /// A share of `bytes` of request bodies, if the node has that left.
    pub fn try_body(self: &Arc<Self>, bytes: u64) -> Option<Permit> {
        let taken = self
            .buffered_body_bytes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                held.checked_add(bytes)
                    .filter(|total| *total <= self.max_buffered_body_bytes)
            })
            .is_ok();
        taken.then(|| Permit {
            budget: self.clone(),
            kind: PermitKind::Body(bytes),
        })
    }
}

#[derive(Debug)]
enum PermitKind {
    Connection,
    Body(u64),
}

/// A share of the [`NodeBudget`], given back on drop.
#[derive(Debug)]
pub struct Permit {
    budget: Arc<NodeBudget>,
    kind: PermitKind,
}

impl Drop for Permit {
    fn drop(&mut self) {
        match self.kind {
            PermitKind::Connection => {
                self.budget.connections.fetch_sub(1, Ordering::SeqCst);
            }
            PermitKind::Body(bytes) => {
                self.budget
                    .buffered_body_bytes
                    .fetch_sub(bytes, Ordering::SeqCst);
            }
        }
    }
}

fn overloaded(what: &str) -> ApiError {
    ApiError::new(
        ErrorCode::Overloaded,
        format!("the node is shedding load: {what}; retry with backoff"),
    )
}

pub fn error_response(error: &ApiError) -> HttpResponse {
    let mut response = hyper::Response::new(Full::new(Bytes::from(error.to_json())));
    *response.status_mut() = hyper::StatusCode::from_u16(error.status())
        .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Between requests: the idle deadline applies.
    Idle,
    /// A request's header is arriving: the header deadline applies.
    Header,
    /// The handler (and body read) runs; its own timeouts apply.
    Handling,
}

/// What the IO wrapper, the service and the watchdog share about one connection.
struct ConnectionClock {
    phase: Cell<Phase>,
    deadline: Cell<Instant>,
    limits: ServerLimits,
}

impl ConnectionClock {
    fn enter(&self, phase: Phase) {
        self.phase.set(phase);
        let timeout = match phase {
            Phase::Idle => self.limits.idle_timeout,
            Phase::Header => self.limits.header_timeout,
            Phase::Handling => Duration::MAX,
        };
        self.deadline.set(
            Instant::now()
                .checked_add(timeout)
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400)),
        );
    }
}

/// A glommio socket (plain or under TLS) as hyper's IO.
struct Io<S> {
    stream: Rc<RefCell<S>>,
    clock: Rc<ConnectionClock>,
    buffer: Vec<u8>,
    /// hyper's own answer to a request it could not parse, being replaced by
    /// ours: (our bytes, how many are written, how long hyper's was).
    replacing: Option<(Vec<u8>, usize, usize)>,
}

/// hyper answers a request it cannot parse by itself, with an empty body
/// (400, 414 or 431). Every error of the API carries the JSON error shape,
/// so that answer is swapped for ours: 400 `invalid_request`.
fn replace_automatic_error(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    let status = text.strip_prefix("HTTP/1.1 ")?.get(..3)?;
    let reason = match status {
        "400" => "the request line or a header could not be parsed",
        "414" => "the request URI is too long",
        "431" => "the request headers are too large",
        _ => return None,
    };
    let lower = text.to_ascii_lowercase();
    if !lower.contains("\r\ncontent-length: 0\r\n") || !lower.ends_with("\r\n\r\n") {
        return None;
    }
    let body = ApiError::new(ErrorCode::InvalidRequest, reason).to_json();
    Some(
        format!(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

impl<S: AsyncRead + AsyncWrite + Unpin> hyper::rt::Read for Io<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let want = buf.remaining().min(READ_CHUNK_BYTES);
        this.buffer.resize(want, 0);
        let mut stream = this.stream.borrow_mut();
        match Pin::new(&mut *stream).poll_read(cx, &mut this.buffer[..want]) {
            Poll::Ready(Ok(n)) => {
                if n > 0 && this.clock.phase.get() == Phase::Idle {
                    this.clock.enter(Phase::Header);
                }
                buf.put_slice(this.buffer.get(..n).unwrap_or_default());
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> hyper::rt::Write for Io<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.replacing.is_none() {
            if let Some(ours) = replace_automatic_error(buf) {
                this.replacing = Some((ours, 0, buf.len()));
            }
        }
        let mut stream = this.stream.borrow_mut();
        if let Some((ours, written, theirs)) = &mut this.replacing {
            while *written < ours.len() {
                let rest = ours.get(*written..).unwrap_or_default();
                match Pin::new(&mut *stream).poll_write(cx, rest) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Poll::Ready(Ok(n)) => *written += n,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
            let theirs = *theirs;
            drop(stream);
            this.replacing = None;
            return Poll::Ready(Ok(theirs));
        }
        Pin::new(&mut *stream).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut stream = self.stream.borrow_mut();
        Pin::new(&mut *stream).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut stream = self.stream.borrow_mut();
        Pin::new(&mut *stream).poll_close(cx)
    }
}

/// Reads a body whole, within the limits.
async fn read_body(body: Incoming, limits: ServerLimits) -> Result<Bytes, ApiError> {
    let limited = Limited::new(body, limits.body_bytes_max);
    match glommio::timer::timeout(limits.body_timeout, async { Ok(limited.collect().await) }).await
    {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(error))
            if error
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(ApiError::new(
                ErrorCode::TooLarge,
                format!(
                    "the request body is over the limit of {} bytes",
                    limits.body_bytes_max
                ),
            ))
        }
        Ok(Err(error)) => Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("the request body could not be read: {error}"),
        )),
        Err(_) => Err(ApiError::new(
            ErrorCode::RequestTimeout,
            format!(
                "the request body did not arrive within {} ms",
                limits.body_timeout.as_millis()
            ),
        )),
    }
}

/// Watches one connection's deadlines; returns when the connection must go,
/// with whether a request header was under way (so it gets a 408).
async fn watchdog(clock: Rc<ConnectionClock>) -> bool {
    loop {
        let now = Instant::now();
        let deadline = clock.deadline.get();
        if clock.phase.get() != Phase::Handling && now >= deadline {
            return clock.phase.get() == Phase::Header;
        }
        let wait = deadline
            .saturating_duration_since(now)
            .min(WATCHDOG_IDLE_CHECK);
        glommio::timer::sleep(wait.max(Duration::from_millis(1))).await;
    }
}

/// Serves one connection until the client closes it or a deadline passes.
pub async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin + 'static>(
    stream: S,
    limits: ServerLimits,
    handler: Handler,
    screen: Option<Screen>,
    budget: Arc<NodeBudget>,
) {
    let stream = Rc::new(RefCell::new(stream));
    let clock = Rc::new(ConnectionClock {
        phase: Cell::new(Phase::Idle),
        deadline: Cell::new(Instant::now()),
        limits,
    });
    clock.enter(Phase::Idle);
    let io = Io {
        stream: stream.clone(),
        clock: clock.clone(),
        buffer: Vec::with_capacity(READ_CHUNK_BYTES),
        replacing: None,
    };
    let service_clock = clock.clone();
    let service = service_fn(move |request: hyper::Request<Incoming>| {
        let clock = service_clock.clone();
        let handler = handler.clone();
        let screen = screen.clone();
        let budget = budget.clone();
        async move {
            clock.enter(Phase::Handling);
            let (parts, body) = request.into_parts();
            if let Some(mut refused) = screen.as_ref().and_then(|screen| screen(&parts)) {
                refused.headers_mut().insert(
                    hyper::header::CONNECTION,
                    hyper::header::HeaderValue::from_static("close"),
                );
                clock.enter(Phase::Idle);
                return Ok::<_, std::convert::Infallible>(refused);
            }
            // The body counts against the node's budget from before it is
            // read until the answer: its declared length, or the most a
            // body may be when it declares none.
            let declared = hyper::body::Body::size_hint(&body)
                .exact()
                .unwrap_or(limits.body_bytes_max as u64)
                .min(limits.body_bytes_max as u64);
            let permit = budget.try_body(declared);
            let read = match &permit {
                Some(_) => read_body(body, limits).await,
                None => Err(overloaded(
                    "request bodies being read fill http.max_buffered_body_bytes",
                )),
            };
            let response = match read {
                Ok(bytes) => handler(hyper::Request::from_parts(parts, bytes)).await,
                Err(error) => {
                    let mut response = error_response(&error);
                    response.headers_mut().insert(
                        hyper::header::CONNECTION,
                        hyper::header::HeaderValue::from_static("close"),
                    );
                    response
                }
            };
            drop(permit);
            clock.enter(Phase::Idle);
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let connection = async {
        if let Err(error) = http1::Builder::new()
            .keep_alive(true)
            .serve_connection(io, service)
            .await
        {
            tracing::debug!(%error, "HTTP connection ended with an error");
        }
        false
    };
    let header_timed_out = futures_lite::future::or(connection, watchdog(clock.clone())).await;
    if header_timed_out {
        let error = ApiError::new(
            ErrorCode::RequestTimeout,
            format!(
                "the request header did not arrive within {} ms",
                limits.header_timeout.as_millis()
            ),
        );
        let body = error.to_json();
        let response = format!(
            "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        // The connection future is gone, so this is the last handle.
        if let Ok(cell) = Rc::try_unwrap(stream) {
            let mut stream = cell.into_inner();
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.close().await;
        }
    }
}

/// Accepts connections until `stop` is set, serving each on its own task
/// while the node's budget has room for it; with `tls`, HTTPS only.
pub async fn serve(
    listener: TcpListener,
    limits: ServerLimits,
    handler: Handler,
    screen: Option<Screen>,
    stop: Rc<Cell<bool>>,
    budget: Arc<NodeBudget>,
    tls: Option<Arc<ServerTls>>,
) {
    while !stop.get() {
        match listener.accept().await {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                let Some(permit) = budget.try_connection() else {
                    glommio::spawn_local(refuse_connection(stream)).detach();
                    continue;
                };
                let (handler, screen, budget) = (handler.clone(), screen.clone(), budget.clone());
                let tls = tls.as_ref().map(|tls| tls.current());
                glommio::spawn_local(async move {
                    let _permit = permit;
                    match tls {
                        Some(config) => {
                            serve_tls(stream, config, limits, handler, screen, budget).await
                        }
                        None => serve_connection(stream, limits, handler, screen, budget).await,
                    }
                })
                .detach();
            }
            Err(error) => tracing::warn!(%error, "accept failed"),
        }
    }
}

/// Serves one connection of a TLS port: the handshake (within the header
/// timeout), then HTTP inside it. A client that speaks plain HTTP gets a
/// plain answer saying so; a failed handshake is logged with its reason.
async fn serve_tls(
    stream: TcpStream,
    config: Arc<rustls::ServerConfig>,
    limits: ServerLimits,
    handler: Handler,
    screen: Option<Screen>,
    budget: Arc<NodeBudget>,
) {
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    // One deadline for the first byte and the whole handshake.
    let deadline = Instant::now() + limits.header_timeout;
    let mut first = [0u8; 1];
    let peeked = glommio::timer::timeout(limits.header_timeout, async {
        Ok(stream.peek(&mut first).await)
    })
    .await;
    match peeked {
        Ok(Ok(1)) if first[0] == TLS_HANDSHAKE_RECORD => {}
        Ok(Ok(1)) => {
            tracing::info!(%peer, "plain HTTP on the TLS client port refused");
            answer_plain_on_tls_port(stream).await;
            return;
        }
        // Closed, failed or silent before its first byte.
        _ => return,
    }
    let acceptor = futures_rustls::TlsAcceptor::from(config);
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let handshake =
        glommio::timer::timeout(left, async { Ok(acceptor.accept(stream).await) }).await;
    match handshake {
        Ok(Ok(tls)) => serve_connection(tls, limits, handler, screen, budget).await,
        Ok(Err(error)) => tracing::warn!(%peer, %error, "TLS handshake with a client failed"),
        Err(_) => tracing::warn!(
            %peer,
            timeout_ms = limits.header_timeout.as_millis() as u64,
            "TLS handshake with a client did not finish in time"
        ),
    }
}

/// The answer to plain HTTP on a TLS port, in plain HTTP.
async fn answer_plain_on_tls_port(mut stream: TcpStream) {
    let body = ApiError::new(
        ErrorCode::InvalidRequest,
        "this port serves HTTPS only: connect with https://",
    )
    .to_json();
    let response = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    // Closing with the request unread would reset the connection, and the
    // client could lose the answer: stop writing, read what it still sends
    // (a little, for a short while), then close.
    let _ = stream.shutdown(std::net::Shutdown::Write).await;
    let mut sink = vec![0u8; 4096];
    let mut drained = 0;
    let _ = glommio::timer::timeout(PLAIN_ON_TLS_DRAIN, async {
        while drained < PLAIN_ON_TLS_DRAIN_BYTES {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
        Ok(())
    })
    .await;
    let _ = stream.close().await;
}

/// Answers `429 overloaded` on a connection over `http.max_connections`,
/// without reading it, and closes it.
async fn refuse_connection(mut stream: TcpStream) {
    let body = overloaded("the node holds http.max_connections connections").to_json();
    let response = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.close().await;
}

#[cfg(test)]
mod tests {
    use super::replace_automatic_error;

    #[test]
    fn hypers_bodyless_parse_errors_become_json_errors() {
        let theirs = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: Mon, 30 Nov 2026 12:00:00 GMT\r\n\r\n";
        let ours =
            String::from_utf8(replace_automatic_error(theirs).expect("replaced")).expect("utf8");
        assert!(ours.starts_with("HTTP/1.1 400 Bad Request\r\n"));
        assert!(ours.contains("\"code\":\"invalid_request\""), "{ours}");
        let body = ours.split("\r\n\r\n").nth(1).expect("body");
        assert!(ours.contains(&format!("content-length: {}\r\n", body.len())));
        let big = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n";
        assert!(replace_automatic_error(big).is_some());
    }

    #[test]
    fn our_own_answers_pass_untouched() {
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{\"error\":{}}";
        assert!(replace_automatic_error(ours).is_none());
        let no_content = b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n";
        assert!(replace_automatic_error(no_content).is_none());
        assert!(replace_automatic_error(b"HTTP/1.1 202 Accepted\r\n").is_none());
    }
}
