//! `narad-bench produce`: closed-loop HTTP load on one node over keep-alive
//! connections, one thread per connection, with HdrHistogram latencies.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

pub struct LoadConfig {
    pub addr: String,
    pub path: String,
    pub connections: usize,
    pub duration: Duration,
    pub body: Vec<u8>,
    /// Messages each request carries (for the messages/s figure).
    pub messages_per_request: usize,
    /// An `Authorization` header value sent with every request.
    pub authorization: Option<String>,
}

pub struct LoadResult {
    pub requests: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub latency_us: Histogram<u64>,
}

/// One connection's figures: requests answered 2xx, others, latencies.
type ConnectionFigures = (u64, u64, Histogram<u64>);

fn one_connection(config: &LoadConfig, deadline: Instant) -> Result<ConnectionFigures, String> {
    let mut histogram = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    let stream = TcpStream::connect(&config.addr).map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream);
    let authorization = config
        .authorization
        .as_ref()
        .map_or_else(String::new, |value| format!("Authorization: {value}\r\n"));
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: bench\r\nContent-Length: {}\r\n{authorization}\r\n",
        config.path,
        config.body.len()
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(&config.body);
    let (mut ok, mut errors) = (0u64, 0u64);
    let mut line = String::new();
    while Instant::now() < deadline {
        let sent = Instant::now();
        writer.write_all(&request).map_err(|e| e.to_string())?;
        line.clear();
        reader.read_line(&mut line).map_err(|e| e.to_string())?;
        let status: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut length = 0usize;
        loop {
            line.clear();
            reader.read_line(&mut line).map_err(|e| e.to_string())?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body).map_err(|e| e.to_string())?;
        histogram.record(sent.elapsed().as_micros() as u64).ok();
        if status == 202 || status == 200 {
            ok += 1;
        } else {
            errors += 1;
        }
    }
    Ok((ok, errors, histogram))
}

/// Runs the load and merges every connection's figures.
pub fn run(config: &LoadConfig) -> Result<LoadResult, String> {
    let started = Instant::now();
    let deadline = started + config.duration;
    let results: Vec<Result<ConnectionFigures, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..config.connections)
            .map(|_| scope.spawn(|| one_connection(config, deadline)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a load thread panicked".into()))
            })
            .collect()
    });
    let mut merged = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    let (mut requests, mut errors) = (0, 0);
    for result in results {
        let (ok, failed, histogram) = result?;
        requests += ok;
        errors += failed;
        merged.add(histogram).map_err(|e| e.to_string())?;
    }
    Ok(LoadResult {
        requests,
        errors,
        elapsed: started.elapsed(),
        latency_us: merged,
    })
}
