//! The hyper-on-glommio server against real sockets: keep-alive, and every
//! timeout and limit answered in the API's error shape.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use glommio::net::TcpListener;
use glommio::LocalExecutorBuilder;
use http_body_util::Full;
use narad_net::http_server::{serve, Handler, ServerLimits};

const LIMITS: ServerLimits = ServerLimits {
    header_timeout: Duration::from_millis(300),
    body_timeout: Duration::from_millis(300),
    idle_timeout: Duration::from_millis(600),
    body_bytes_max: 1000,
};
/// How long a test waits for an answer before it fails.
const ANSWER_DEADLINE: Duration = Duration::from_secs(10);

fn start_server() -> SocketAddr {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let executor = LocalExecutorBuilder::default()
            .io_memory(1 << 20)
            .make()
            .expect("executor");
        executor.run(async move {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
            sender
                .send(listener.local_addr().expect("addr"))
                .expect("send addr");
            let handler: Handler = Rc::new(|request: hyper::Request<Bytes>| {
                Box::pin(async move {
                    let body = format!("{} {}", request.method(), request.body().len());
                    hyper::Response::new(Full::new(Bytes::from(body)))
                })
            });
            serve(
                listener,
                LIMITS,
                handler,
                None,
                Rc::new(std::cell::Cell::new(false)),
                narad_net::http_server::NodeBudget::unlimited(),
                None,
            )
            .await;
        });
    });
    receiver
        .recv_timeout(ANSWER_DEADLINE)
        .expect("server started")
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(ANSWER_DEADLINE))
        .expect("read timeout");
    stream
}

/// Reads one response (headers and a Content-Length body).
fn read_response(stream: &mut TcpStream) -> (u16, String) {
    let mut data = Vec::new();
    let mut byte = [0u8; 1];
    while !data.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).expect("read header");
        assert_eq!(n, 1, "connection closed before a response");
        data.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&data).to_string();
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(|v| v.trim().parse().expect("len"))
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).expect("body");
    (status, String::from_utf8_lossy(&body).to_string())
}

fn assert_closed(stream: &mut TcpStream) {
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the server to close the connection, got {other:?}"),
    }
}

fn error_code(body: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(body).expect("JSON error body");
    value["error"]["code"].as_str().expect("code").to_string()
}

#[test]
fn keep_alive_serves_several_requests_on_one_connection() {
    let addr = start_server();
    let mut stream = connect(addr);
    for _ in 0..3 {
        stream
            .write_all(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello")
            .expect("write");
        assert_eq!(read_response(&mut stream), (200, "POST 5".to_string()));
    }
}

#[test]
fn a_stalled_header_gets_408_and_the_connection_closes() {
    let addr = start_server();
    let mut stream = connect(addr);
    stream
        .write_all(b"GET /x HTTP/1.1\r\nHost: a\r\n")
        .expect("write");
    let started = Instant::now();
    let (status, body) = read_response(&mut stream);
    assert_eq!(status, 408);
    assert_eq!(error_code(&body), "request_timeout");
    assert!(started.elapsed() >= LIMITS.header_timeout / 2);
    assert_closed(&mut stream);
}

#[test]
fn a_stalled_body_gets_408() {
    let addr = start_server();
    let mut stream = connect(addr);
    stream
        .write_all(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nonly ten..")
        .expect("write");
    let (status, body) = read_response(&mut stream);
    assert_eq!(status, 408);
    assert_eq!(error_code(&body), "request_timeout");
}

#[test]
fn an_oversized_body_gets_413() {
    let addr = start_server();
    let mut stream = connect(addr);
    let body = vec![b'x'; 2000];
    stream
        .write_all(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 2000\r\n\r\n")
        .expect("write");
    stream.write_all(&body).expect("write body");
    let (status, body) = read_response(&mut stream);
    assert_eq!(status, 413);
    assert_eq!(error_code(&body), "too_large");
}

#[test]
fn an_idle_connection_is_closed() {
    let addr = start_server();
    let mut stream = connect(addr);
    let started = Instant::now();
    assert_closed(&mut stream);
    assert!(
        started.elapsed() >= LIMITS.idle_timeout / 2,
        "closed too early: {:?}",
        started.elapsed()
    );
    // The server still serves new connections.
    let mut again = connect(addr);
    again
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .expect("write");
    assert_eq!(read_response(&mut again).0, 200);
}
