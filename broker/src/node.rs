//! Starting and stopping a node: the data folder's identity files, the
//! metastore, one glommio executor per shard with its background tasks and
//! its listener on the shared client port, and a graceful stop on SIGTERM or
//! SIGINT.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

use futures_channel::mpsc::UnboundedReceiver;
use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement};
use narad_net::http_server::{serve, Handler, HttpRequest, NodeBudget, ServerLimits};
use narad_net::peer::{PeerEndpoint, PeerHandler, PeerTls};
use narad_raft::node::{BoxFuture, MetaNode, MetaNodeConfig, PeerCaller};
use narad_storage::clock::{SharedClock, SystemClock};
use narad_storage::io::blocking::BlockingFs;
use narad_storage::io::faulty::{remove_unsynced_files, FaultControl};
use narad_storage::io::glommio_fs::GlommioFs;
use narad_storage::wal::{Wal, WalConfig};

use crate::config::Config;
use crate::limits::{
    CLUSTER_CATCH_UP_WAIT, IDLE_PARTITION_FIRST_OPEN, IDLE_PARTITION_OPEN_INTERVAL,
    META_CATCH_UP_TIMEOUT, STOP_BARRIER_TIMEOUT, STOP_POLL_INTERVAL,
};
use crate::mesh::{self, MeshEnds};
use crate::metric_names::{
    CONSUME_LONG_POLLS_WAITING, DISPATCHER_COMMIT_RECORDS, DISPATCHER_REROUTES_TOTAL,
    STORAGE_CORRUPT_RECORDS_TOTAL, WAL_RECORDS_PER_SYNC, WAL_SYNC_SECONDS,
};
use crate::receipt::ReceiptKey;
use crate::remote::{self, DataInbox, Inbound, Peers};
use crate::settings::Settings;
use crate::shard::{every, NodeFs, Shard, ShardIdentity, ShardParts};

const EPOCH_FILE: &str = "node.epoch";
/// Held locked by the process that runs on the data folder.
const LOCK_FILE: &str = "narad.lock";
/// The file a test writes fault names into (`testing.faults` only).
pub const FAULT_CONTROL_FILE: &str = "fault-control";
const FAULT_POLL_INTERVAL: Duration = Duration::from_millis(10);
const RECEIPT_KEY_FILE: &str = "receipt.key";
const IO_MEMORY_BYTES: usize = 16 * 1024 * 1024;
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
                Matcher::Full(WAL_RECORDS_PER_SYNC.into()),
                RECORDS_PER_SYNC_BUCKETS,
            )
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(DISPATCHER_COMMIT_RECORDS.into()),
                RECORDS_PER_SYNC_BUCKETS,
            )
        })
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| format!("installing the metrics recorder: {e}"))
}
/// JSON framing and base64 can grow a batch's values; leave room for it.
const BODY_BYTES_SLACK: u64 = 64 * 1024;

/// Takes the data folder for this process: an exclusive `flock` on
/// `narad.lock`, held until the process exits (the kernel releases it even
/// after SIGKILL). A second process on the folder is refused, naming the
/// holder, before it touches anything.
fn lock_data_dir(dir: &Path) -> Result<std::fs::File, String> {
    use std::os::fd::AsRawFd;
    let path = dir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| format!("opening {}: {e}", path.display()))?;
    // SAFETY: flock on a file descriptor this function owns.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if locked != 0 {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        let holder = holder.trim();
        let holder = if holder.is_empty() {
            "another process".to_string()
        } else {
            format!("process {holder}")
        };
        return Err(format!(
            "the data folder {} is in use by {holder} (it holds {LOCK_FILE}); one narad process per folder",
            dir.display()
        ));
    }
    file.set_len(0)
        .and_then(|()| {
            std::io::Write::write_all(&mut file, std::process::id().to_string().as_bytes())
        })
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(file)
}

/// Refuses a client port another process listens on. The shards bind with
/// SO_REUSEPORT (they share the port), which would let a second process
/// share it too; a plain bind fails while anyone else holds it.
fn refuse_port_in_use(listen: SocketAddr) -> Result<(), String> {
    if listen.port() == 0 {
        return Ok(());
    }
    match std::net::TcpListener::bind(listen) {
        Ok(_probe) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => Err(format!(
            "the client port {listen} is in use by another process"
        )),
        Err(error) => Err(format!("listening on {listen}: {error}")),
    }
}

/// A random number drawn at every start: message ids carry it, so they
/// never repeat, even on a node whose data folder was lost or copied.
fn draw_incarnation() -> Result<u64, String> {
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(|e| format!("reading /dev/urandom: {e}"))?;
    Ok(u64::from_le_bytes(bytes))
}

/// Reads, increments and persists the node's start counter.
fn next_epoch(fs: &BlockingFs, dir: &Path) -> Result<u32, String> {
    let previous = match fs.read(&dir.join(EPOCH_FILE)) {
        Ok(Some(bytes)) => std::str::from_utf8(&bytes)
            .ok()
            .and_then(|text| text.trim().parse::<u32>().ok())
            .ok_or_else(|| format!("{EPOCH_FILE} is damaged: not a number"))?,
        Ok(None) => 0,
        Err(error) => return Err(format!("reading {EPOCH_FILE}: {error}")),
    };
    let epoch = previous
        .checked_add(1)
        .ok_or("the node's start counter overflowed")?;
    fs.write_whole(dir, EPOCH_FILE, epoch.to_string().as_bytes())
        .map_err(|e| format!("writing {EPOCH_FILE}: {e}"))?;
    Ok(epoch)
}

/// The key that authenticates receipts; made once, kept across restarts.
fn receipt_key(fs: &BlockingFs, dir: &Path) -> Result<ReceiptKey, String> {
    let path = dir.join(RECEIPT_KEY_FILE);
    let bytes = match fs.read(&path) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => {
            let mut key = [0u8; 32];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))
                .map_err(|e| format!("reading /dev/urandom: {e}"))?;
            fs.write_whole(dir, RECEIPT_KEY_FILE, &key)
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
/// returns a flag that a signal thread sets when one arrives (it also tells
/// `stopping`).
fn stop_on_signal(stopping: mpsc::Sender<()>) -> Result<Arc<AtomicBool>, String> {
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
                let _ = stopping.send(());
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(flag)
}

/// What a starting shard tells the main thread.
enum Startup {
    /// The client listener is bound here (the other shards share the port).
    Bound(SocketAddr),
    Serving,
    Failed(String),
}

/// What every shard of the node shares: the stop flag and the two barriers
/// of a graceful stop. Not on the data path.
struct NodeShared {
    shards: usize,
    /// The node has peers (it may start before the cluster has a leader).
    clustered: bool,
    stop: Arc<AtomicBool>,
    /// Shards whose dispatcher drained (commits may still cross shards).
    drained: AtomicUsize,
    /// Shards that synced their checkpoint and acks.
    finished: AtomicUsize,
    /// Set once any shard's ingress WAL failed.
    wal_failed: Arc<AtomicBool>,
    /// Connections and request bodies the node's clients hold, all shards.
    http_budget: Arc<NodeBudget>,
}

impl NodeShared {
    /// Waits until `counter` counts every shard, or the deadline passes.
    async fn barrier(&self, counter: &AtomicUsize, what: &str) {
        counter.fetch_add(1, Ordering::SeqCst);
        let deadline = std::time::Instant::now() + STOP_BARRIER_TIMEOUT;
        while counter.load(Ordering::SeqCst) < self.shards {
            if std::time::Instant::now() >= deadline {
                tracing::warn!(what, "stopping without waiting longer for other shards");
                return;
            }
            glommio::timer::sleep(STOP_POLL_INTERVAL).await;
        }
    }
}

/// Everything one shard needs to start, moved into its thread.
struct ShardStart {
    index: usize,
    settings: Arc<Settings>,
    data_dir: PathBuf,
    node_id: u16,
    epoch: u32,
    incarnation: u64,
    key: ReceiptKey,
    meta: Arc<MetaNode>,
    node: Arc<NodeShared>,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    listen: SocketAddr,
    ends: MeshEnds,
    startup: mpsc::Sender<Startup>,
    faults: Arc<FaultControl>,
    peers: Option<Arc<Peers>>,
    inbox: Option<UnboundedReceiver<Inbound>>,
}

/// The number of shards: `shards`, or every online CPU when 0.
fn shard_count(settings: &Settings) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    match settings.shards {
        0 => cpus,
        n => usize::try_from(n).unwrap_or(cpus),
    }
}

/// The fault layer's switches (`testing.faults`; tests only). When on, a
/// thread applies `<data_dir>/fault-control` every few milliseconds; with
/// power loss, files whose creation never became durable are deleted first.
fn fault_control(settings: &Settings, data_dir: &Path) -> Result<Arc<FaultControl>, String> {
    let mode = settings.testing.faults.as_str();
    let control = FaultControl::new(mode == "power_loss");
    if mode == "off" {
        return Ok(control);
    }
    tracing::warn!(mode, "fault injection is on: this node is for tests");
    if control.power_loss() {
        remove_unsynced_files(data_dir)
            .map_err(|e| format!("removing files a power cut lost: {e}"))?;
    }
    let path = data_dir.join(FAULT_CONTROL_FILE);
    let switches = control.clone();
    std::thread::Builder::new()
        .name("narad-faults".into())
        .spawn(move || {
            let mut last = String::new();
            loop {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                if text != last {
                    let unknown = switches.apply(&text);
                    tracing::warn!(faults = %text.trim(), ?unknown, "fault switches changed");
                    last = text;
                }
                std::thread::sleep(FAULT_POLL_INTERVAL);
            }
        })
        .map_err(|e| format!("starting the fault switch thread: {e}"))?;
    Ok(control)
}

/// Runs a node until SIGTERM or SIGINT; returns once it stopped gracefully.
pub fn run(config: Config) -> Result<(), String> {
    let settings = Arc::new(Settings::from_config(&config)?);
    let data_dir: PathBuf = settings.data_dir.clone();
    std::fs::create_dir_all(&data_dir)
        .map_err(|e| format!("creating {}: {e}", data_dir.display()))?;
    // glommio opens directories relative to no directory at all: give it an
    // absolute path (the default `./narad-data` is relative).
    let data_dir = std::fs::canonicalize(&data_dir)
        .map_err(|e| format!("resolving {}: {e}", data_dir.display()))?;
    let _lock = lock_data_dir(&data_dir)?;
    refuse_port_in_use(settings.listen)?;
    let incarnation = draw_incarnation()?;
    let shards = shard_count(&settings);
    let node_id = settings.node_id;
    // Signals are blocked before any thread starts, so every thread
    // inherits the mask and only the signal thread takes SIGTERM.
    let (stopping, stop_signalled) = mpsc::channel();
    let stop = stop_on_signal(stopping.clone())?;
    let faults = fault_control(&settings, &data_dir)?;
    let blocking_fs = BlockingFs::with_faults(faults.clone());
    let epoch = next_epoch(&blocking_fs, &data_dir)?;
    let metrics = install_metrics()?;
    metrics::gauge!(CONSUME_LONG_POLLS_WAITING).set(0.0);
    metrics::counter!(DISPATCHER_REROUTES_TOTAL).absolute(0);
    metrics::counter!(STORAGE_CORRUPT_RECORDS_TOTAL).increment(0);
    let key = receipt_key(&blocking_fs, &data_dir)?;
    let peer = settings.peer_listen;
    let members = parse_peers(&settings, node_id)?;
    let clustered = !members.is_empty();
    let mut meta_config =
        MetaNodeConfig::single(u64::from(node_id), data_dir.join("raft"), peer.to_string());
    meta_config.snapshot_after_entries = settings.raft.snapshot_after_entries;
    meta_config.liveness_interval_ms = settings.cluster.heartbeat_interval_ms;
    meta_config.node_dead_after_ms = settings.cluster.node_dead_after_ms;
    meta_config.fs = blocking_fs;
    // With peers: QUIC up first (the metastore talks through it), the
    // metastore handed to its handler once started.
    let served_meta: Arc<OnceLock<Arc<MetaNode>>> = Arc::default();
    // Data-plane requests from other nodes go to the shards through this.
    let inbox = Arc::new(DataInbox::new());
    let mut peers = None;
    let endpoint = if clustered {
        let tls = peer_tls(&settings)?;
        let handler_meta = served_meta.clone();
        let handler_inbox = inbox.clone();
        let handler: PeerHandler = Arc::new(move |kind, payload| {
            if remote::is_data_kind(kind) {
                return handler_inbox.handle(payload);
            }
            match handler_meta.get() {
                Some(meta) => meta.serve(kind, payload),
                None => Box::pin(async { Err("the metastore is starting".to_string()) }),
            }
        });
        let endpoint = PeerEndpoint::start(peer, &tls, handler)
            .map_err(|e| format!("starting QUIC on {peer}: {e}"))?;
        peers = Some(Arc::new(Peers::new(
            u64::from(node_id),
            endpoint.clone(),
            &members,
        )?));
        meta_config.members = members;
        meta_config.caller = Some(Arc::new(QuicCaller(endpoint.clone())));
        Some(endpoint)
    } else {
        None
    };
    let meta = MetaNode::start(meta_config).map_err(|e| format!("starting the metastore: {e}"))?;
    let meta = Arc::new(meta);
    let _ = served_meta.set(meta.clone());
    let node = Arc::new(NodeShared {
        shards,
        clustered,
        stop,
        drained: AtomicUsize::new(0),
        finished: AtomicUsize::new(0),
        wal_failed: Arc::default(),
        http_budget: NodeBudget::new(
            usize::try_from(settings.http.max_connections).unwrap_or(usize::MAX),
            settings.http.max_buffered_body_bytes,
        ),
    });
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let (startup, started) = mpsc::channel();
    let mut listen = settings.listen;
    let mut handles = Vec::with_capacity(shards);
    let mut inboxes = inbox.wire(shards).into_iter();
    for (index, ends) in mesh::wire(shards).into_iter().enumerate() {
        let start = ShardStart {
            index,
            settings: settings.clone(),
            data_dir: data_dir.clone(),
            node_id,
            epoch,
            incarnation,
            key: key.clone(),
            meta: meta.clone(),
            node: node.clone(),
            metrics: metrics.clone(),
            listen,
            ends,
            startup: startup.clone(),
            faults: faults.clone(),
            peers: peers.clone(),
            inbox: inboxes.next(),
        };
        // One shard per core is the production shape: pin each to its core.
        // Fewer shards than cores (tests, small hosts) leave placement to
        // the kernel.
        let placement = if shards == cpus {
            Placement::Fixed(index)
        } else {
            Placement::Unbound
        };
        let handle = LocalExecutorBuilder::new(placement)
            .name(&format!("narad-shard-{index}"))
            .io_memory(IO_MEMORY_BYTES)
            .spawn(move || async move {
                let startup = start.startup.clone();
                let result = run_shard(start).await;
                if let Err(error) = &result {
                    let _ = startup.send(Startup::Failed(error.clone()));
                }
                result
            })
            .map_err(|e| format!("starting shard {index}: {e}"))?;
        handles.push(handle);
        if index == 0 {
            // Port 0 picks a free port: every other shard joins the one
            // shard 0 got.
            match started.recv() {
                Ok(Startup::Bound(addr)) => listen = addr,
                Ok(Startup::Failed(error)) => return Err(error),
                Ok(Startup::Serving) | Err(_) => {
                    return Err("shard 0 stopped while starting".into());
                }
            }
        }
    }
    let mut serving = 0;
    while serving < shards {
        match started.recv() {
            Ok(Startup::Serving) => serving += 1,
            Ok(Startup::Bound(_)) => {}
            // A shard that failed leaves the others waiting for it: the
            // caller exits the process.
            Ok(Startup::Failed(error)) => return Err(error),
            Err(_) => return Err("a shard stopped while starting".into()),
        }
    }
    // The documented listening line: scripts and tests parse it.
    let peer_addr = endpoint.as_ref().map_or(peer, |e| e.local_addr());
    println!("listening client={listen} peer={peer_addr}");
    let _ = std::io::stdout().flush();
    tracing::info!(client = %listen, shards, "serving");
    // Leadership moves while the shards drain: the successor takes over
    // before this node's QUIC goes away, and the node's own partitions keep
    // answering other nodes meanwhile.
    let handing_over = {
        let meta = meta.clone();
        std::thread::Builder::new()
            .name("narad-handover".into())
            .spawn(move || {
                let _ = stop_signalled.recv();
                let started = std::time::Instant::now();
                if let Some(successor) = meta.hand_over_leadership() {
                    let took_ms = started.elapsed().as_millis();
                    tracing::info!(successor, took_ms, "handed Raft leadership over");
                }
            })
            .map_err(|e| format!("starting the handover thread: {e}"))?
    };
    let mut result = Ok(());
    for (index, handle) in handles.into_iter().enumerate() {
        match handle.join() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => result = Err(error),
            Err(error) => result = Err(format!("shard {index} ended badly: {error}")),
        }
    }
    // Other nodes' requests have no shard to go to any more.
    inbox.close();
    // Shards that ended without a signal (a failure) hand over too.
    let _ = stopping.send(());
    let _ = handing_over.join();
    if let Some(endpoint) = &endpoint {
        endpoint.shutdown();
    }
    drop(served_meta);
    if let Ok(meta) = Arc::try_unwrap(meta) {
        meta.shutdown();
    }
    result
}

/// The initial members from `peers` (`1=HOST:PORT,2=HOST:PORT`), this node
/// included; empty without peers (a single-node cluster).
fn parse_peers(settings: &Settings, node_id: u16) -> Result<BTreeMap<u64, String>, String> {
    let Some(text) = &settings.peers else {
        return Ok(BTreeMap::new());
    };
    let mut members = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (id, addr) = item
            .split_once('=')
            .ok_or_else(|| format!("--peers: {item:?} is not ID=HOST:PORT"))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| format!("--peers: {id:?} is not a node id"))?;
        let addr: SocketAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("--peers: {addr:?} is not HOST:PORT with an IP address"))?;
        if members.insert(id, addr.to_string()).is_some() {
            return Err(format!("--peers names node {id} twice"));
        }
    }
    if !members.contains_key(&u64::from(node_id)) {
        return Err(format!(
            "--peers must include this node (--node-id {node_id})"
        ));
    }
    Ok(members)
}

/// Trust between nodes: operator files when all three are set, else the
/// cluster secret (the config check already refused neither).
fn peer_tls(settings: &Settings) -> Result<PeerTls, String> {
    let files = (
        settings.cluster.tls.ca_file.as_deref(),
        settings.cluster.tls.cert_file.as_deref(),
        settings.cluster.tls.key_file.as_deref(),
    );
    let tls = match (files, settings.cluster.secret.as_deref()) {
        ((Some(ca), Some(cert), Some(key)), _) => PeerTls::from_files(ca, cert, key),
        (_, Some(secret)) => PeerTls::from_secret(secret),
        _ => {
            return Err(
                "--peers needs --cluster-secret or cluster.tls.ca_file, cert_file and key_file"
                    .into(),
            )
        }
    };
    tls.map_err(|e| e.to_string())
}

/// The metastore's way to other nodes: this node's QUIC endpoint.
struct QuicCaller(Arc<PeerEndpoint>);

impl PeerCaller for QuicCaller {
    fn call(
        &self,
        addr: &str,
        kind: u8,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<Result<Vec<u8>, String>> {
        let endpoint = self.0.clone();
        let addr = addr.parse::<SocketAddr>();
        Box::pin(async move {
            let addr = addr.map_err(|e| format!("a peer address: {e}"))?;
            endpoint
                .call(addr, kind, payload, timeout)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

async fn run_shard(start: ShardStart) -> Result<(), String> {
    let ShardStart {
        index,
        settings,
        data_dir,
        node_id,
        epoch,
        incarnation,
        key,
        meta,
        node,
        metrics,
        listen,
        ends,
        startup,
        faults,
        peers,
        inbox: remote_inbox,
    } = start;
    // Connecting waits for every peer to connect too: start it first, so a
    // slow bind here never holds another shard.
    let connecting = glommio::spawn_local(ends.connect());
    let listener = TcpListener::bind(listen).map_err(|e| format!("listening on {listen}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let _ = startup.send(Startup::Bound(local));
    let (mesh, inbox) = connecting.await;

    let disk = GlommioFs::new(&data_dir)
        .await
        .map_err(|e| format!("preparing {}: {e}", data_dir.display()))?;
    let fs = NodeFs::wrap(disk, faults);
    let clock: SharedClock = Rc::new(SystemClock);
    let wal_config = WalConfig {
        ring_bytes: settings.storage.wal_ring_bytes,
    };
    let wal_dir = data_dir.join("wal");
    let (wal, recovery) = Wal::open(&fs, &wal_dir.join(format!("shard-{index}")), wal_config)
        .await
        .map_err(|e| format!("opening the ingress WAL of shard {index}: {e}"))?;
    if node.clustered {
        // A cluster may have no leader yet (its other nodes are starting):
        // serve anyway; /readyz says no_leader until there is one.
        if let Err(error) = meta.wait_caught_up(CLUSTER_CATCH_UP_WAIT).await {
            tracing::info!(%error, "serving before the metastore has a leader");
        }
    } else {
        meta.wait_caught_up(META_CATCH_UP_TIMEOUT)
            .await
            .map_err(|e| format!("metastore did not catch up: {e}"))?;
    }
    let identity = ShardIdentity {
        node_id,
        shard_id: u16::try_from(index).map_err(|_| "too many shards".to_string())?,
        epoch,
        incarnation,
    };
    let shard = Shard::new(ShardParts {
        identity,
        settings: settings.clone(),
        data_dir: data_dir.clone(),
        fs,
        clock,
        wal: wal.clone(),
        meta,
        receipt_key: key,
        metrics: metrics.clone(),
        mesh,
        peers,
        node_wal_failed: node.wal_failed.clone(),
        http_budget: node.http_budget.clone(),
    });
    for inbox in inbox {
        glommio::spawn_local(shard.clone().serve_peers(inbox)).detach();
    }
    glommio::spawn_local(shard.clone().watch_topics()).detach();
    if let Some(remote_inbox) = remote_inbox {
        glommio::spawn_local(shard.clone().serve_remote(remote_inbox)).detach();
    }
    glommio::spawn_local(shard.clone().notify_peers()).detach();
    glommio::spawn_local(shard.clone().run_dead_letters()).detach();
    if !recovery.records.is_empty() {
        tracing::info!(
            shard = index,
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

    let committed = shard.clone();
    let committer = wal.clone().run_committer(move |outcome, elapsed| {
        metrics::histogram!(WAL_SYNC_SECONDS).record(elapsed.as_secs_f64());
        metrics::histogram!(WAL_RECORDS_PER_SYNC).record(outcome.records as f64);
        // Every durable record goes to the dispatcher, whether or not the
        // request that appended it still waits.
        committed.dispatch_durable();
    });
    let (failed_wal, node_wal_failed) = (wal.clone(), node.wal_failed.clone());
    glommio::spawn_local(async move {
        committer.await;
        // The committer ends at a close or a failure: a failure stops
        // produces on every shard of the node.
        if failed_wal.failure().is_some() {
            node_wal_failed.store(true, Ordering::SeqCst);
        }
    })
    .detach();
    if index == 0 {
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(METRICS_UPKEEP_INTERVAL).await;
                metrics.run_upkeep();
            }
        })
        .detach();
    }
    let checkpoint_interval = Duration::from_millis(settings.dispatcher.checkpoint_interval_ms);
    glommio::spawn_local(wal.clone().run_checkpointer(checkpoint_interval)).detach();
    let dispatcher = glommio::spawn_local(shard.clone().run_dispatcher());
    let sweep = Duration::from_millis(settings.leases.sweep_interval_ms);
    glommio::spawn_local(every(shard.clone(), sweep, |s| {
        Box::pin(async move { s.sweep_all().await })
    }))
    .detach();
    // Partitions nobody touched since the start age out too: open them
    // soon after the start, then now and again.
    let idle = shard.clone();
    glommio::spawn_local(async move {
        glommio::timer::sleep(IDLE_PARTITION_FIRST_OPEN).await;
        idle.open_idle_partitions().await;
        every(idle, IDLE_PARTITION_OPEN_INTERVAL, |s| {
            Box::pin(async move { s.open_idle_partitions().await })
        })
        .await;
    })
    .detach();
    let maintain = Duration::from_millis(settings.storage.ack_flush_interval_ms);
    glommio::spawn_local(every(shard.clone(), maintain, |s| {
        Box::pin(async move { s.maintain_all().await })
    }))
    .detach();
    for orphan in orphan_wals(&wal_dir, index, node.shards) {
        tracing::info!(dir = %orphan.display(), shard = index, "adopting the WAL of a shard that no longer exists");
        glommio::spawn_local(shard.clone().adopt_wal(orphan, wal_config)).detach();
    }

    let limits = ServerLimits {
        header_timeout: Duration::from_millis(settings.http.header_timeout_ms),
        body_timeout: Duration::from_millis(settings.http.body_timeout_ms),
        idle_timeout: Duration::from_millis(settings.http.idle_timeout_ms),
        body_bytes_max: usize::try_from(2 * settings.http.max_batch_bytes + BODY_BYTES_SLACK)
            .unwrap_or(usize::MAX),
    };
    let handler_shard = shard.clone();
    let handler: Handler = Rc::new(move |request: HttpRequest| {
        let shard = handler_shard.clone();
        Box::pin(async move { crate::api::handle(shard, request).await })
    });
    let accepting = Rc::new(std::cell::Cell::new(false));
    let server = glommio::spawn_local(serve(
        listener,
        limits,
        handler,
        accepting,
        node.http_budget.clone(),
    ));
    let _ = startup.send(Startup::Serving);
    while !node.stop.load(Ordering::SeqCst) {
        glommio::timer::sleep(STOP_POLL_INTERVAL).await;
    }
    drop(server);
    shard.drain().await;
    node.barrier(&node.drained, "dispatchers drained").await;
    shard.finish().await;
    node.barrier(&node.finished, "acks flushed").await;
    dispatcher.await;
    tracing::info!(shard = index, "stopped");
    Ok(())
}

/// WAL folders of shards beyond the current count (the node ran with more
/// shards before) that shard `index` takes over: `shard-j` with
/// `j % shards == index`.
fn orphan_wals(wal_dir: &Path, index: usize, shards: usize) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(wal_dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name();
            let number: usize = name.to_str()?.strip_prefix("shard-")?.parse().ok()?;
            (number >= shards && number % shards == index).then(|| entry.path())
        })
        .collect();
    found.sort();
    found
}
