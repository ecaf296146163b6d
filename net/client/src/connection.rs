//! One kept-alive HTTP/1.1 connection to one node, on blocking sockets, for
//! a thread that sends requests one after another and wants nothing
//! between it and the socket: no runtime, no pool, no retries, no
//! reconnecting (a benchmark's producer, a tool timing one connection).
//! Measured against reqwest and against hyper's client on a runtime per
//! thread, it costs the client the least CPU and adds the least tail
//! latency (docs/benchmarks.md).
//!
//! The answer's head is parsed by `httparse` (hyper's parser), bodies by
//! `Content-Length` or chunked, or to the end of the connection; the
//! request's method, path and headers are checked by the `http` crate's
//! types before anything is written. Most code wants [`crate::Client`] or
//! [`crate::blocking::Client`] instead: they retry as the API's table says
//! and open connections as they need them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use crate::{Error, Response};

/// The most header lines an answer may have.
const MAX_HEADERS: usize = 64;
/// The longest answer head read.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// A socket, or TLS over one.
trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// A kept-alive connection; see the module's text. After a transport error
/// (or an answer that closed it) it is done: open another with
/// [`crate::blocking::Client::connect`].
pub struct Connection {
    stream: BufReader<Box<dyn Stream>>,
    /// The socket under `stream`, for its read timeout.
    socket: TcpStream,
    /// The `Host` header: the URL's `HOST:PORT`.
    host: String,
    /// `http://HOST:PORT`, for error messages.
    base: String,
    authorization: Option<String>,
    timeout: Duration,
    /// The read timeout the socket has now.
    read_timeout: Duration,
    /// The request being written (kept for its capacity).
    out: Vec<u8>,
    /// Set once the connection cannot carry another request.
    closed: Option<String>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("base", &self.base)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Connects as `client` would: its URL, TLS settings, credentials and
    /// timeout.
    pub(crate) fn open(client: &crate::Client) -> Result<Self, Error> {
        let base = client.base.clone();
        let host = base
            .split_once("://")
            .map_or(base.as_str(), |(_, rest)| rest)
            .to_string();
        let transport = |e: &dyn std::fmt::Display| Error::Transport(format!("{base}: {e}"));
        let socket = TcpStream::connect(&host).map_err(|e| transport(&e))?;
        socket.set_nodelay(true).map_err(|e| transport(&e))?;
        socket
            .set_read_timeout(Some(client.timeout))
            .map_err(|e| transport(&e))?;
        socket
            .set_write_timeout(Some(client.timeout))
            .map_err(|e| transport(&e))?;
        let io = socket.try_clone().map_err(|e| transport(&e))?;
        let stream: Box<dyn Stream> = match &client.tls {
            None => Box::new(io),
            Some(config) => {
                let name = host
                    .rsplit_once(':')
                    .map_or(host.as_str(), |(name, _)| name)
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_string();
                let name = rustls::pki_types::ServerName::try_from(name)
                    .map_err(|e| Error::Config(format!("{base}: {e}")))?;
                let mut tls = rustls::ClientConnection::new(Arc::clone(config), name)
                    .map_err(|e| Error::Tls(format!("{base}: {e}")))?;
                // The handshake now, so that a refused certificate is a TLS
                // error here rather than a transport error on the first call.
                let mut io = io;
                while tls.is_handshaking() {
                    tls.complete_io(&mut io).map_err(|e| {
                        match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                            Some(refused) => Error::Tls(format!("{base}: {refused}")),
                            None => transport(&e),
                        }
                    })?;
                }
                Box::new(rustls::StreamOwned::new(tls, io))
            }
        };
        Ok(Self {
            stream: BufReader::new(stream),
            socket,
            host,
            base,
            authorization: client.authorization.clone(),
            timeout: client.timeout,
            read_timeout: client.timeout,
            out: Vec::new(),
            closed: None,
        })
    }

    /// One request, once: the answer as [`crate::Client::request`] gives
    /// it, without retries. `wait` is how long the node may hold it (a long
    /// poll), allowed on top of the timeout.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        wait: Duration,
    ) -> Result<Response, Error> {
        if let Some(why) = &self.closed {
            return Err(Error::Transport(format!("{}: {why}", self.base)));
        }
        self.write_request(method, path, headers, body)?;
        let result = self.exchange(method, wait);
        if let Err(Error::Transport(why)) = &result {
            self.closed = Some(why.clone());
        }
        result
    }

    /// Checks the request and puts it in `out`: nothing is written when a
    /// part of it cannot go in an HTTP/1.1 head.
    fn write_request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), Error> {
        let refuse = |what: String| Error::Config(format!("{method} {path}: {what}"));
        let method = http::Method::from_bytes(method.as_bytes())
            .map_err(|_| refuse("not an HTTP method".into()))?;
        let path = http::uri::PathAndQuery::try_from(path)
            .ok()
            .filter(|p| p.as_str().starts_with('/'))
            .ok_or_else(|| refuse("not a path".into()))?;
        let out = &mut self.out;
        out.clear();
        out.extend_from_slice(method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(path.as_str().as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        out.extend_from_slice(self.host.as_bytes());
        out.extend_from_slice(b"\r\ncontent-type: application/json\r\ncontent-length: ");
        out.extend_from_slice(body.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
        let authorization = self
            .authorization
            .as_deref()
            .map(|value| ("authorization", value));
        for (name, value) in headers.iter().copied().chain(authorization) {
            let name = http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| refuse(format!("{name:?} is not a header name")))?;
            let value = http::HeaderValue::from_bytes(value.as_bytes()).map_err(|_| {
                refuse(format!(
                    "header {name} with value {value:?}: a header holds no line break or control character"
                ))
            })?;
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(body);
        Ok(())
    }

    /// Writes `out`, reads the answer.
    fn exchange(&mut self, method: &str, wait: Duration) -> Result<Response, Error> {
        let base = self.base.clone();
        let transport = |e: std::io::Error| {
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                Error::Transport(format!("{base}: no answer in time"))
            } else {
                Error::Transport(format!("{base}: {e}"))
            }
        };
        let read_timeout = self.timeout + wait;
        if read_timeout != self.read_timeout {
            self.socket
                .set_read_timeout(Some(read_timeout))
                .map_err(transport)?;
            self.read_timeout = read_timeout;
        }
        let writer = self.stream.get_mut();
        writer.write_all(&self.out).map_err(transport)?;
        writer.flush().map_err(transport)?;
        loop {
            let head = read_head(&mut self.stream).map_err(|e| match e {
                HeadError::Io(e) => transport(e),
                HeadError::Bad(why) => Error::BadResponse(format!("{base}: {why}")),
            })?;
            // An informational answer (100 Continue) comes before the real one.
            if (100..200).contains(&head.status) {
                continue;
            }
            let bodiless = method == "HEAD" || head.status == 204 || head.status == 304;
            let body = if bodiless {
                Vec::new()
            } else if head.chunked {
                read_chunked(&mut self.stream).map_err(|e| match e {
                    HeadError::Io(e) => transport(e),
                    HeadError::Bad(why) => Error::BadResponse(format!("{base}: {why}")),
                })?
            } else if let Some(length) = head.length {
                let mut body = vec![0; length];
                self.stream.read_exact(&mut body).map_err(transport)?;
                body
            } else {
                // Neither: the body runs to the end of the connection.
                let mut body = Vec::new();
                self.stream.read_to_end(&mut body).map_err(transport)?;
                self.closed = Some("the node closed the connection".into());
                body
            };
            if head.close {
                self.closed = Some("the node closed the connection".into());
            }
            return crate::answer(head.status, &body);
        }
    }
}

/// What the client needs of an answer's head.
struct Head {
    status: u16,
    length: Option<usize>,
    chunked: bool,
    /// `Connection: close`: no further request on this connection.
    close: bool,
}

enum HeadError {
    Io(std::io::Error),
    Bad(String),
}

impl From<std::io::Error> for HeadError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

/// Reads one answer's head off `stream`, leaving its body there.
fn read_head(stream: &mut impl BufRead) -> Result<Head, HeadError> {
    let mut buffer = Vec::new();
    loop {
        let available = stream.fill_buf()?;
        if available.is_empty() {
            return Err(HeadError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the connection closed before a whole answer",
            )));
        }
        // Parse what came so far together with what is buffered now; take
        // off the stream only the head's bytes.
        let before = buffer.len();
        buffer.extend_from_slice(available);
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut answer = httparse::Response::new(&mut headers);
        match answer.parse(&buffer) {
            Ok(httparse::Status::Complete(end)) => {
                stream.consume(end - before);
                let status = answer
                    .code
                    .ok_or_else(|| HeadError::Bad("an answer without a status".into()))?;
                let mut head = Head {
                    status,
                    length: None,
                    chunked: false,
                    close: false,
                };
                for header in answer.headers.iter() {
                    let value = std::str::from_utf8(header.value).unwrap_or_default().trim();
                    if header.name.eq_ignore_ascii_case("content-length") {
                        head.length =
                            Some(value.parse().map_err(|_| {
                                HeadError::Bad(format!("content-length {value:?}"))
                            })?);
                    } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
                        head.chunked = value
                            .rsplit(',')
                            .next()
                            .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
                    } else if header.name.eq_ignore_ascii_case("connection") {
                        head.close = value
                            .split(',')
                            .any(|token| token.trim().eq_ignore_ascii_case("close"));
                    }
                }
                return Ok(head);
            }
            Ok(httparse::Status::Partial) => {
                let taken = buffer.len() - before;
                stream.consume(taken);
                if buffer.len() > MAX_HEAD_BYTES {
                    return Err(HeadError::Bad("an answer head over 64 KiB".into()));
                }
            }
            Err(e) => return Err(HeadError::Bad(format!("not an HTTP answer: {e}"))),
        }
    }
}

/// Reads a chunked body to its end (trailers read and dropped).
fn read_chunked(stream: &mut impl BufRead) -> Result<Vec<u8>, HeadError> {
    let mut body = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        read_line(stream, &mut line)?;
        let size = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16)
            .map_err(|_| HeadError::Bad(format!("chunk size {size:?}")))?;
        if size == 0 {
            // Trailers, up to an empty line.
            loop {
                line.clear();
                read_line(stream, &mut line)?;
                if line.trim_end_matches(['\r', '\n']).is_empty() {
                    return Ok(body);
                }
            }
        }
        let start = body.len();
        body.resize(start + size, 0);
        stream.read_exact(&mut body[start..])?;
        line.clear();
        read_line(stream, &mut line)?;
        if line != "\r\n" {
            return Err(HeadError::Bad("a chunk not followed by CRLF".into()));
        }
    }
}

/// One line (with its line end); a closed connection is an error.
fn read_line(stream: &mut impl BufRead, line: &mut String) -> Result<(), HeadError> {
    if stream.read_line(line)? == 0 {
        return Err(HeadError::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the connection closed inside an answer",
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head_of(text: &[u8]) -> Result<(Head, Vec<u8>), HeadError> {
        let mut reader = BufReader::with_capacity(7, text);
        let head = read_head(&mut reader)?;
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest)?;
        Ok((head, rest))
    }

    #[test]
    fn a_head_split_across_reads_is_parsed_and_the_body_left_behind() {
        let Ok((head, rest)) =
            head_of(b"HTTP/1.1 202 Accepted\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody")
        else {
            panic!("parse");
        };
        assert_eq!(head.status, 202);
        assert_eq!(head.length, Some(4));
        assert!(head.close && !head.chunked);
        assert_eq!(rest, b"body");
    }

    #[test]
    fn a_chunked_body_is_joined_and_its_trailers_dropped() {
        let text = b"3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nx-trailer: 1\r\n\r\nnext";
        let mut reader = BufReader::with_capacity(5, &text[..]);
        let Ok(body) = read_chunked(&mut reader) else {
            panic!("chunked");
        };
        assert_eq!(body, b"abcde");
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).expect("rest");
        assert_eq!(rest, b"next");
    }

    #[test]
    fn garbage_and_cut_answers_are_errors_not_hangs() {
        assert!(matches!(
            head_of(b"SMTP ready\r\n\r\n"),
            Err(HeadError::Bad(_))
        ));
        assert!(matches!(
            head_of(b"HTTP/1.1 200 OK\r\nContent-"),
            Err(HeadError::Io(_))
        ));
        let mut cut = BufReader::new(&b"5\r\nab"[..]);
        assert!(read_chunked(&mut cut).is_err());
        let mut bad = BufReader::new(&b"zz\r\n"[..]);
        assert!(matches!(read_chunked(&mut bad), Err(HeadError::Bad(_))));
    }
}
