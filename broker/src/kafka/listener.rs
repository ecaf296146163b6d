//! The Kafka listener's sockets: each shard accepts on the shared port (as
//! for HTTP) and serves its connections. A connection's requests run side
//! by side, up to [`KAFKA_IN_FLIGHT_PER_CONNECTION`], and are answered in
//! the order they came, as Kafka clients require. Connections count against
//! the node's `http.max_connections`, and requests being handled against
//! `http.max_buffered_body_bytes`, as HTTP's do.
//!
//! With `kafka.tls.*` every connection is TLS (the handshake within
//! [`KAFKA_TLS_HANDSHAKE_TIMEOUT`]); with `auth.enabled` it authenticates
//! first ([`super::sasl`]), one request at a time until it has.
//!
//! A request that is dropped with its connection (the client went away)
//! is dropped at an await of its handler, which leaves nothing half done:
//! a produce is followed through once its WAL append started.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use bytes::BytesMut;
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use futures_util::stream::{FuturesOrdered, StreamExt};
use glommio::net::{TcpListener, TcpStream};
use narad_net::http_server::NodeBudget;
use narad_net::tls::{ServerTls, TLS_HANDSHAKE_RECORD};

use super::frame::split_frame;
use super::sasl::Login;
use super::serve::{Answer, Answerer};
use crate::limits::{
    KAFKA_IDLE_TIMEOUT, KAFKA_IN_FLIGHT_PER_CONNECTION, KAFKA_REQUEST_BYTES_MAX,
    KAFKA_SESSION_CHECK_INTERVAL, KAFKA_TLS_HANDSHAKE_TIMEOUT,
};

/// Bytes read from the socket at a time.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Accepts connections until dropped; with `tls`, TLS only.
pub async fn serve_kafka(
    listener: TcpListener,
    answerer: Rc<Answerer>,
    budget: Arc<NodeBudget>,
    tls: Option<Arc<ServerTls>>,
) {
    loop {
        let stream = match listener.accept().await {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(%error, "a Kafka connection was not accepted");
                continue;
            }
        };
        let Some(permit) = budget.try_connection() else {
            tracing::debug!("a Kafka connection over http.max_connections was closed");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let answerer = answerer.clone();
        let budget = budget.clone();
        let tls = tls.as_ref().map(|tls| tls.current());
        glommio::spawn_local(async move {
            match tls {
                None => connection(stream, &answerer, &budget).await,
                Some(config) => {
                    if let Some(stream) = handshake(stream, config).await {
                        connection(stream, &answerer, &budget).await;
                    }
                }
            }
            drop(permit);
        })
        .detach();
    }
}

/// The TLS handshake of a new connection, within
/// [`KAFKA_TLS_HANDSHAKE_TIMEOUT`]; `None` (logged) when it fails, and at
/// once when the client speaks plain Kafka.
async fn handshake(
    stream: TcpStream,
    config: Arc<rustls::ServerConfig>,
) -> Option<futures_rustls::server::TlsStream<TcpStream>> {
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let accepted = glommio::timer::timeout(KAFKA_TLS_HANDSHAKE_TIMEOUT, async {
        let mut first = [0u8; 1];
        if stream.peek(&mut first).await? != 1 || first[0] != TLS_HANDSHAKE_RECORD {
            return Ok(Err(
                "the client speaks plain Kafka to a TLS listener".to_string()
            ));
        }
        let acceptor = futures_rustls::TlsAcceptor::from(config);
        Ok(acceptor.accept(stream).await.map_err(|e| e.to_string()))
    })
    .await;
    let error = match accepted {
        Ok(Ok(stream)) => return Some(stream),
        Ok(Err(error)) => error,
        Err(timeout) => timeout.to_string(),
    };
    tracing::info!(%peer, %error, "TLS handshake with a Kafka client failed");
    None
}

/// What woke a connection.
enum Event {
    Read(std::io::Result<usize>),
    Answered(Option<Answer>),
    /// [`KAFKA_SESSION_CHECK_INTERVAL`] passed with nothing to do.
    Quiet,
}

type Pending<'a> = FuturesOrdered<Pin<Box<dyn Future<Output = Answer> + 'a>>>;

async fn connection<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    answerer: &Answerer,
    budget: &Arc<NodeBudget>,
) {
    let mut buf = BytesMut::new();
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    let login = Login::new(answerer.auth_enabled());
    let login = &login;
    let mut pending: Pending<'_> = FuturesOrdered::new();
    let mut reading = true;
    // How long the connection has had no request under way.
    let mut idle = std::time::Duration::ZERO;
    // Until it authenticated, a connection's requests run one at a time:
    // each sees what the one before it did to the login.
    let in_flight = || {
        if login.done() {
            KAFKA_IN_FLIGHT_PER_CONNECTION
        } else {
            1
        }
    };
    loop {
        while reading && pending.len() < in_flight() {
            match split_frame(&mut buf, KAFKA_REQUEST_BYTES_MAX) {
                Ok(Some(frame)) => {
                    let Some(permit) = budget.try_body(frame.len() as u64) else {
                        // The node holds all the request bytes it may: a
                        // client retries on a new connection.
                        tracing::debug!(
                            "closing a Kafka connection: http.max_buffered_body_bytes reached"
                        );
                        return;
                    };
                    pending.push_back(Box::pin(async move {
                        let answer = answerer.answer(frame, login).await;
                        drop(permit);
                        answer
                    }));
                }
                Ok(None) => break,
                Err(error) => {
                    tracing::debug!(%error, "closing a Kafka connection");
                    reading = false;
                    // Nothing after a bad frame can be read: what came
                    // before it is still answered.
                    buf.clear();
                }
            }
        }
        if !reading && pending.is_empty() {
            return;
        }
        let room = reading && pending.len() < in_flight();
        let event = if room && pending.is_empty() {
            futures_lite::future::or(
                async { Event::Read(stream.read(&mut chunk).await) },
                async {
                    glommio::timer::sleep(KAFKA_SESSION_CHECK_INTERVAL).await;
                    Event::Quiet
                },
            )
            .await
        } else if room {
            futures_lite::future::or(
                async { Event::Read(stream.read(&mut chunk).await) },
                async { Event::Answered(pending.next().await) },
            )
            .await
        } else {
            Event::Answered(pending.next().await)
        };
        match event {
            Event::Read(Ok(0)) => reading = false,
            Event::Read(Ok(n)) => {
                idle = std::time::Duration::ZERO;
                buf.extend_from_slice(&chunk[..n]);
            }
            Event::Read(Err(_)) => return,
            Event::Quiet => {
                idle += KAFKA_SESSION_CHECK_INTERVAL;
                if idle >= KAFKA_IDLE_TIMEOUT {
                    return;
                }
                if !answerer.login_holds(login) {
                    tracing::info!("closing a Kafka connection: its credentials were revoked");
                    return;
                }
            }
            Event::Answered(Some(Answer::Frame(frame))) => {
                // Flushed: a TLS stream may hold the frame's last record.
                if stream.write_all(&frame).await.is_err() || stream.flush().await.is_err() {
                    return;
                }
            }
            Event::Answered(Some(Answer::Nothing)) | Event::Answered(None) => {}
            Event::Answered(Some(Answer::Close(why))) => {
                tracing::debug!(why, "closing a Kafka connection");
                return;
            }
            Event::Answered(Some(Answer::FrameThenClose(frame, why))) => {
                let _ = stream.write_all(&frame).await;
                let _ = stream.flush().await;
                let _ = stream.close().await;
                tracing::debug!(why, "closing a Kafka connection");
                return;
            }
        }
    }
}
