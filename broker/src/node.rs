//! Starting and stopping a node: the data folder's identity files, the
//! metastore, the shard and its background tasks, the client listener, and a
//! graceful stop on SIGTERM or SIGINT.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use glommio::net::TcpListener;
use glommio::LocalExecutorBuilder;
use narad_net::http_server::{serve, Handler, HttpRequest, ServerLimits};
use narad_raft::node::{MetaNode, MetaNodeConfig};
use narad_storage::clock::{SharedClock, SystemClock};
use narad_storage::io::glommio_fs::GlommioFs;
use narad_storage::wal::{Wal, WalConfig};

use crate::config::Config;
use crate::receipt::ReceiptKey;
use crate::shard::{every, Shard, ShardIdentity};

const EPOCH_FILE: &str = "node.epoch";
const RECEIPT_KEY_FILE: &str = "receipt.key";
const IO_MEMORY_BYTES: usize = 16 * 1024 * 1024;
/// How long a starting node waits for its metastore to replay its log.
const META_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_POLL_INTERVAL: Duration = Duration::from_millis(20);
/// How often the metrics exporter drains its histograms.
const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(5);
/// Buckets of every latency histogram, in seconds.
const LATENCY_BUCKETS_SECONDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];
/// Buckets of the records-per-fsync histogram.
const RECORDS_PER_SYNC_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

/// Installs the Prometheus recorder that `/metrics` renders.
fn install_metrics() -> Result<metrics_exporter_prometheus::PrometheusHandle, String> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    PrometheusBuilder::new()
        .set_buckets(LATENCY_BUCKETS_SECONDS)
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full("narad_wal_records_per_sync".into()),
                RECORDS_PER_SYNC_BUCKETS,
            )
        })
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| format!("installing the metrics recorder: {e}"))
}
/// JSON framing and base64 can grow a batch's values; leave room for it.
const BODY_BYTES_SLACK: u64 = 64 * 1024;

/// Writes `bytes` to `dir/name` whole: tmp file, fsync, rename, fsync dir.
fn write_whole(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

/// Reads, increments and persists the node's start counter.
fn next_epoch(dir: &Path) -> Result<u32, String> {
    let previous = match std::fs::read_to_string(dir.join(EPOCH_FILE)) {
        Ok(text) => text
            .trim()
            .parse::<u32>()
            .map_err(|e| format!("{EPOCH_FILE} is damaged: {e}"))?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => 0,
        Err(error) => return Err(format!("reading {EPOCH_FILE}: {error}")),
    };
    let epoch = previous
        .checked_add(1)
        .ok_or("the node's start counter overflowed")?;
    write_whole(dir, EPOCH_FILE, epoch.to_string().as_bytes())
        .map_err(|e| format!("writing {EPOCH_FILE}: {e}"))?;
    Ok(epoch)
}

/// The key that authenticates receipts; made once, kept across restarts.
fn receipt_key(dir: &Path) -> Result<ReceiptKey, String> {
    let path = dir.join(RECEIPT_KEY_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let mut key = [0u8; 32];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))
                .map_err(|e| format!("reading /dev/urandom: {e}"))?;
            write_whole(dir, RECEIPT_KEY_FILE, &key)
                .map_err(|e| format!("writing {RECEIPT_KEY_FILE}: {e}"))?;
            key.to_vec()
        }
        Err(error) => return Err(format!("reading {RECEIPT_KEY_FILE}: {error}")),
    };
    let key: [u8; 32] = bytes
        .try_into()
        .map_err(|_| format!("{RECEIPT_KEY_FILE} must hold 32 bytes"))?;
    Ok(ReceiptKey::from_bytes(key))
}

/// Blocks SIGTERM and SIGINT in this thread (and the threads it starts) and
/// returns a flag that a signal thread sets when one arrives.
fn stop_on_signal() -> Result<Arc<AtomicBool>, String> {
    // SAFETY: plain libc signal-mask calls on a zeroed, then filled, sigset.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err("could not block SIGTERM".into());
        }
        set
    };
    let flag = Arc::new(AtomicBool::new(false));
    let raised = flag.clone();
    std::thread::Builder::new()
        .name("narad-signals".into())
        .spawn(move || {
            let mut signal: libc::c_int = 0;
            // SAFETY: waits on the signals blocked above.
            let result = unsafe { libc::sigwait(&set, &mut signal) };
            if result == 0 {
                tracing::info!(signal, "stopping gracefully");
                raised.store(true, Ordering::SeqCst);
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(flag)
}

/// Runs a node until SIGTERM or SIGINT; returns once it stopped gracefully.
pub fn run(config: Config) -> Result<(), String> {
    let data_dir: PathBuf = config.data_dir();
    std::fs::create_dir_all(&data_dir)
        .map_err(|e| format!("creating {}: {e}", data_dir.display()))?;
    // glommio opens directories relative to no directory at all: give it an
    // absolute path (the default `./narad-data` is relative).
    let data_dir = std::fs::canonicalize(&data_dir)
        .map_err(|e| format!("resolving {}: {e}", data_dir.display()))?;
    let shards = config.u64("shards");
    if shards > 1 {
        return Err(format!(
            "--shards {shards}: this build runs one shard per node (cross-shard routing is not built yet); use --shards 1"
        ));
    }
    let node_id = u16::try_from(config.u64("node_id"))
        .map_err(|_| "node_id must fit in 16 bits".to_string())?;
    let epoch = next_epoch(&data_dir)?;
    let metrics = install_metrics()?;
    metrics::gauge!("narad_node_alive", "node" => node_id.to_string()).set(1.0);
    metrics::counter!("narad_dispatcher_reroutes_total").absolute(0);
    metrics::counter!("narad_storage_corrupt_records_total").increment(0);
    let key = receipt_key(&data_dir)?;
    let stop = stop_on_signal()?;
    let peer = config.addr("peer_listen");
    let mut meta_config =
        MetaNodeConfig::single(u64::from(node_id), data_dir.join("raft"), peer.to_string());
    meta_config.snapshot_after_entries = config.u64("raft.snapshot_after_entries");
    let meta = MetaNode::start(meta_config).map_err(|e| format!("starting the metastore: {e}"))?;
    let meta = Arc::new(meta);
    let executor = LocalExecutorBuilder::default()
        .name("narad-shard-0")
        .io_memory(IO_MEMORY_BYTES)
        .make()
        .map_err(|e| format!("starting the shard executor: {e}"))?;
    let config = Rc::new(config);
    let shard_meta = meta.clone();
    let result = executor.run(async move {
        run_shard(
            config, data_dir, node_id, epoch, key, shard_meta, stop, metrics,
        )
        .await
    });
    if let Ok(meta) = Arc::try_unwrap(meta) {
        meta.shutdown();
    }
    result
}

#[allow(clippy::too_many_arguments)]
async fn run_shard(
    config: Rc<Config>,
    data_dir: PathBuf,
    node_id: u16,
    epoch: u32,
    key: ReceiptKey,
    meta: Arc<MetaNode>,
    stop: Arc<AtomicBool>,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
) -> Result<(), String> {
    let fs = GlommioFs::new(&data_dir)
        .await
        .map_err(|e| format!("preparing {}: {e}", data_dir.display()))?;
    let clock: SharedClock = Rc::new(SystemClock);
    let wal_config = WalConfig {
        ring_bytes: config.u64("storage.wal_ring_bytes"),
    };
    let (wal, recovery) = Wal::open(&fs, &data_dir.join("wal").join("shard-0"), wal_config)
        .await
        .map_err(|e| format!("opening the ingress WAL: {e}"))?;
    meta.wait_caught_up(META_CATCH_UP_TIMEOUT)
        .await
        .map_err(|e| format!("metastore did not catch up: {e}"))?;
    let identity = ShardIdentity {
        node_id,
        shard_id: 0,
        epoch,
    };
    let shard = Shard::new(
        identity,
        config.clone(),
        data_dir,
        fs,
        clock,
        wal.clone(),
        meta,
        key,
        metrics.clone(),
    );
    if !recovery.records.is_empty() {
        tracing::info!(
            records = recovery.records.len(),
            "committing again what the WAL holds above its checkpoint"
        );
    }
    shard.redispatch(
        recovery
            .records
            .into_iter()
            .map(|r| (r.pos, r.record))
            .collect(),
    );

    glommio::spawn_local(wal.clone().run_committer(|outcome, elapsed| {
        metrics::histogram!("narad_wal_sync_seconds").record(elapsed.as_secs_f64());
        metrics::histogram!("narad_wal_records_per_sync").record(outcome.records as f64);
    }))
    .detach();
    glommio::spawn_local(async move {
        loop {
            glommio::timer::sleep(METRICS_UPKEEP_INTERVAL).await;
            metrics.run_upkeep();
        }
    })
    .detach();
    let checkpoint_interval =
        Duration::from_millis(config.u64("dispatcher.checkpoint_interval_ms"));
    glommio::spawn_local(wal.clone().run_checkpointer(checkpoint_interval)).detach();
    let dispatcher = glommio::spawn_local(shard.clone().run_dispatcher());
    let sweep = Duration::from_millis(config.u64("leases.sweep_interval_ms"));
    glommio::spawn_local(every(shard.clone(), sweep, |s| {
        Box::pin(async move { s.sweep_all().await })
    }))
    .detach();
    let maintain = Duration::from_millis(config.u64("storage.ack_flush_interval_ms"));
    glommio::spawn_local(every(shard.clone(), maintain, |s| {
        Box::pin(async move { s.maintain_all().await })
    }))
    .detach();

    let listen = config.addr("listen");
    let listener = TcpListener::bind(listen).map_err(|e| format!("listening on {listen}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    println!(
        "listening client={local} peer={}",
        config.addr("peer_listen")
    );
    let _ = std::io::stdout().flush();
    tracing::info!(client = %local, "serving");

    let limits = ServerLimits {
        header_timeout: Duration::from_millis(config.u64("http.header_timeout_ms")),
        body_timeout: Duration::from_millis(config.u64("http.body_timeout_ms")),
        idle_timeout: Duration::from_millis(config.u64("http.idle_timeout_ms")),
        body_bytes_max: usize::try_from(2 * config.u64("http.max_batch_bytes") + BODY_BYTES_SLACK)
            .unwrap_or(usize::MAX),
    };
    let handler_shard = shard.clone();
    let handler: Handler = Rc::new(move |request: HttpRequest| {
        let shard = handler_shard.clone();
        Box::pin(async move { crate::api::handle(shard, request).await })
    });
    let accepting = Rc::new(std::cell::Cell::new(false));
    let server = glommio::spawn_local(serve(listener, limits, handler, accepting));
    while !stop.load(Ordering::SeqCst) {
        glommio::timer::sleep(STOP_POLL_INTERVAL).await;
    }
    drop(server);
    shard.stop().await;
    dispatcher.await;
    tracing::info!("stopped");
    Ok(())
}
