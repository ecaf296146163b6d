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
use glommio::LocalExecutorBuilder;
use http_body_util::Full;
use narad_net::http_server::{serve, Handler, HttpRequest, ServerLimits};
use narad_storage::io::glommio_fs::GlommioFs;
use narad_storage::wal::{Wal, WalConfig, WalRecordRef};

const RING_BYTES: u64 = 256 * 1024 * 1024;
const IO_MEMORY_BYTES: usize = 16 * 1024 * 1024;
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(250);

pub fn run(listen: &str, dir: &Path) -> Result<(), String> {
    let listen = listen.to_string();
    let dir = dir.to_path_buf();
    let executor = LocalExecutorBuilder::default()
        .io_memory(IO_MEMORY_BYTES)
        .make()
        .map_err(|e| e.to_string())?;
    executor.run(async move {
        let fs = GlommioFs::new(&dir).await.map_err(|e| e.to_string())?;
        let _ = std::fs::remove_dir_all(dir.join("ceiling-wal"));
        let (wal, _) = Wal::open(
            &fs,
            &dir.join("ceiling-wal"),
            WalConfig {
                ring_bytes: RING_BYTES,
            },
        )
        .await
        .map_err(|e| e.to_string())?;
        glommio::spawn_local(wal.clone().run_committer(|_, _| {})).detach();
        glommio::spawn_local(wal.clone().run_checkpointer(CHECKPOINT_INTERVAL)).detach();
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
        let listener = TcpListener::bind(listen.as_str()).map_err(|e| e.to_string())?;
        println!(
            "listening client={}",
            listener.local_addr().map_err(|e| e.to_string())?
        );
        let _ = std::io::stdout().flush();
        let limits = ServerLimits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(120),
            body_bytes_max: 32 * 1024 * 1024,
        };
        serve(listener, limits, handler, Rc::new(Cell::new(false))).await;
        Ok(())
    })
}
