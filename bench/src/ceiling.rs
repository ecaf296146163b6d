//! `narad-bench ceiling`: the bare endpoint the broker is measured against:
//! hyper on glommio that answers 202 to any POST once a group-committed
//! fdatasync of the body into a WAL ring returned. No topics, no dispatch.

use std::cell::Cell;
use std::io::Write;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement};
use http_body_util::Full;
use narad_net::http_server::{serve, Handler, HttpRequest, ServerLimits};
use narad_storage::io::glommio_fs::GlommioFs;
use narad_storage::wal::{Wal, WalConfig, WalRecordRef};

const RING_BYTES: u64 = 256 * 1024 * 1024;
const IO_MEMORY_BYTES: usize = 16 * 1024 * 1024;
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(250);

/// Runs the ceiling with `shards` executors on one port, each with its own
/// WAL ring, the shape of a node with that many shards.
pub fn run(listen: &str, dir: &Path, shards: usize) -> Result<(), String> {
    let shards = shards.max(1);
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let (bound, addr) = std::sync::mpsc::channel::<Result<String, String>>();
    let mut listen = listen.to_string();
    let mut handles = Vec::new();
    for index in 0..shards {
        let (dir, listen_at, bound) = (dir.to_path_buf(), listen.clone(), bound.clone());
        let placement = if shards == cpus {
            Placement::Fixed(index)
        } else {
            Placement::Unbound
        };
        let handle = LocalExecutorBuilder::new(placement)
            .io_memory(IO_MEMORY_BYTES)
            .spawn(move || async move {
                let result = shard(index, &listen_at, &dir, &bound).await;
                if let Err(error) = &result {
                    let _ = bound.send(Err(error.clone()));
                }
                result
            })
            .map_err(|e| e.to_string())?;
        handles.push(handle);
        // Every shard binds the port shard 0 got (SO_REUSEPORT).
        let got = addr
            .recv()
            .map_err(|e| e.to_string())
            .and_then(|bound| bound)?;
        if index == 0 {
            listen = got;
        }
    }
    println!("listening client={listen}");
    let _ = std::io::stdout().flush();
    for handle in handles {
        handle.join().map_err(|e| e.to_string())??;
    }
    Ok(())
}

async fn shard(
    index: usize,
    listen: &str,
    dir: &Path,
    bound: &std::sync::mpsc::Sender<Result<String, String>>,
) -> Result<(), String> {
    let fs = GlommioFs::new(dir).await.map_err(|e| e.to_string())?;
    let wal_dir = dir.join(format!("ceiling-wal-{index}"));
    let _ = std::fs::remove_dir_all(&wal_dir);
    let (wal, _) = Wal::open(
        &fs,
        &wal_dir,
        WalConfig {
            ring_bytes: RING_BYTES,
            ..WalConfig::default()
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    glommio::spawn_local(wal.clone().run_committer(|_, _| {})).detach();
    glommio::spawn_local(wal.clone().run_checkpointer(
        CHECKPOINT_INTERVAL,
        glommio::timer::sleep,
        || 0,
    ))
    .detach();
    let seq = Rc::new(Cell::new(0u128));
    let handler: Handler = Rc::new(move |request: HttpRequest| {
        let (wal, seq) = (wal.clone(), seq.clone());
        Box::pin(async move {
            let id = seq.get();
            seq.set(id + 1);
            let record = WalRecordRef {
                id,
                topic: "ceiling",
                partition: 0,
                key: None,
                value: request.body(),
                accept_ms: 0,
                topic_incarnation: Some(0),
                offset: None,
                idempotency: None,
                key_only: false,
            };
            let status = match wal.append(&record) {
                Ok(appended) => {
                    let pos = appended.pos;
                    match appended.durable.await {
                        Ok(()) => {
                            wal.mark_committed(pos);
                            202
                        }
                        Err(_) => 500,
                    }
                }
                Err(_) => 429,
            };
            let mut response =
                hyper::Response::new(Full::new(Bytes::from_static(b"{\"id\":\"ceiling\"}")));
            *response.status_mut() =
                hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::ACCEPTED);
            response
        })
    });
    let listener = TcpListener::bind(listen).map_err(|e| e.to_string())?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let _ = bound.send(Ok(local.to_string()));
    let limits = ServerLimits {
        header_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(120),
        body_bytes_max: 32 * 1024 * 1024,
    };
    serve(
        listener,
        limits,
        handler,
        None,
        Rc::new(Cell::new(false)),
        narad_net::http_server::NodeBudget::unlimited(),
        None,
    )
    .await;
    Ok(())
}
