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
use narad_net::http_server::{serve, Handler, HttpRequest, NodeBudget, Screen, ServerLimits};
use narad_net::peer::{PeerEndpoint, PeerHandler, PeerTls};
use narad_net::tls::{ServerTls, TlsFiles};
use narad_raft::node::{BoxFuture, MetaNode, MetaNodeConfig, PeerCaller};
use narad_storage::clock::{SharedClock, SystemClock};
use narad_storage::io::blocking::BlockingFs;
use narad_storage::io::faulty::{remove_unsynced_files, FaultControl};
use narad_storage::io::glommio_fs::GlommioFs;
use narad_storage::limits::IDEMPOTENCY_KEYS_PER_SHARD_MAX;
use narad_storage::wal::{Wal, WalConfig};

use crate::config::Config;
use crate::idempotency::NodeKeys;
use crate::limits::{
    CLUSTER_CATCH_UP_WAIT, META_CATCH_UP_TIMEOUT, STOP_BARRIER_TIMEOUT, STOP_POLL_INTERVAL,
};
use crate::mesh::{self, MeshEnds};
use crate::metric_names::{
    CONSUME_EMPTY_WAKES_TOTAL, CONSUME_LONG_POLLS_WAITING, DISPATCHER_COMMIT_RECORDS,
    DISPATCHER_REROUTES_TOTAL, MOVES_IN_PROGRESS, MOVE_COPIED_BYTES_TOTAL,
    STORAGE_CORRUPT_RECORDS_TOTAL, WAL_RECORDS_PER_SYNC,
};
use crate::receipt::ReceiptKey;
use crate::remote::{DataInbox, Peers, QuicNodes};
use crate::rpc::{self, Envelope, Links, Reach, Transport};
use crate::runtime::GlommioRuntime;
use crate::settings::Settings;
use crate::shard::{NodeFs, Shard, ShardEnv, ShardIdentity, ShardParts};

mod faults;
mod folder;
mod peers;
mod shard_thread;
mod telemetry;

use faults::fault_control;
use folder::{draw_incarnation, lock_data_dir, next_epoch, receipt_key, refuse_port_in_use};
use peers::{parse_peers, peer_tls, QuicCaller};
use shard_thread::run_shard;
use telemetry::install_metrics;

const IO_MEMORY_BYTES: usize = 16 * 1024 * 1024;
/// JSON framing and base64 can grow a batch's values; leave room for it.
const BODY_BYTES_SLACK: u64 = 64 * 1024;

/// Blocks SIGTERM, SIGINT and SIGHUP in this thread (and the threads it
/// starts) and returns a flag that a signal thread sets when SIGTERM or
/// SIGINT arrives (it also tells `stopping`). SIGHUP reloads the
/// certificates of the client port and of the Kafka listener, those that
/// have any (`tls`, each with the port's name).
fn handle_signals(
    stopping: mpsc::Sender<()>,
    tls: Vec<(&'static str, Arc<ServerTls>)>,
) -> Result<Arc<AtomicBool>, String> {
    // SAFETY: plain libc signal-mask calls on a zeroed, then filled, sigset.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err("could not block SIGTERM, SIGINT and SIGHUP".into());
        }
        set
    };
    let flag = Arc::new(AtomicBool::new(false));
    let raised = flag.clone();
    std::thread::Builder::new()
        .name("narad-signals".into())
        .spawn(move || loop {
            let mut signal: libc::c_int = 0;
            // SAFETY: waits on the signals blocked above.
            if unsafe { libc::sigwait(&set, &mut signal) } != 0 {
                return;
            }
            if signal == libc::SIGHUP {
                if tls.is_empty() {
                    tracing::info!("SIGHUP: no TLS certificates to reload");
                }
                for (port, tls) in &tls {
                    match tls.reload() {
                        Ok(()) => tracing::info!(port, "reloaded the TLS certificates"),
                        Err(error) => tracing::error!(
                            port,
                            %error,
                            "could not reload the TLS certificates; the previous ones stay"
                        ),
                    }
                }
                continue;
            }
            tracing::info!(signal, "stopping gracefully");
            raised.store(true, Ordering::SeqCst);
            let _ = stopping.send(());
            return;
        })
        .map_err(|e| e.to_string())?;
    Ok(flag)
}

/// What a starting shard tells the main thread.
enum Startup {
    /// The client listener is bound here, and the Kafka listener there if
    /// the node has one (the other shards share the ports).
    Bound {
        client: SocketAddr,
        kafka: Option<SocketAddr>,
    },
    Serving,
    Failed(String),
    /// Shard N's thread ended before the shard ran: glommio could not make
    /// its executor (see [`ExecutorWatch`]).
    NoExecutor(usize),
}

/// Moved into a shard thread's closure, which glommio calls once it has
/// made the thread's executor: a closure dropped uncalled (io_uring setup
/// or its locked memory refused) tells the main thread, which would
/// otherwise wait for the shard forever.
struct ExecutorWatch {
    startup: mpsc::Sender<Startup>,
    index: usize,
    ran: bool,
}

impl Drop for ExecutorWatch {
    fn drop(&mut self) {
        if !self.ran {
            let _ = self.startup.send(Startup::NoExecutor(self.index));
        }
    }
}

/// Why shard `index`'s executor could not be made, from its thread's end,
/// with the locked-memory limit (the usual cause) and how to raise it.
fn no_executor(index: usize, ended: glommio::Result<Result<(), String>, ()>) -> String {
    let cause = match ended {
        Err(error) => error.to_string(),
        Ok(_) => "its thread ended".to_string(),
    };
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    let known = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } == 0;
    let shown = |bytes: libc::rlim_t| {
        if bytes == libc::RLIM_INFINITY {
            "unlimited".to_string()
        } else {
            format!("{} KiB", bytes / 1024)
        }
    };
    let limit = if known {
        format!("{} (hard {})", shown(limit.rlim_cur), shown(limit.rlim_max))
    } else {
        "unknown".to_string()
    };
    format!(
        "shard {index} could not set up io_uring: {cause}. The usual cause is the locked-memory limit \
         (RLIMIT_MEMLOCK, now {limit}; a shard registers {} MiB of I/O memory): raise it with \
         `ulimit -l unlimited`, or LimitMEMLOCK=infinity under systemd",
        IO_MEMORY_BYTES >> 20
    )
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
    /// The idempotency keys the node accepted, all shards.
    keys: Arc<NodeKeys>,
    /// Partitions that records recovered from the WALs go to, all shards.
    recovered: Arc<crate::recovered::Recovered>,
    /// The topic folders in use, all shards.
    folders: Arc<crate::folders::TopicFolders>,
    /// Connections and request bodies the node's clients hold, all shards.
    http_budget: Arc<NodeBudget>,
    /// Where remote children's copies leave the node.
    ship: Arc<dyn crate::ship::Ship + Send + Sync>,
    /// Kafka share-group members and sessions, all shards.
    shares: Arc<crate::kafka::share::ShareGroups>,
    /// The newest epoch of each idempotent Kafka producer, all shards.
    producers: Arc<crate::kafka::epochs::ProducerEpochs>,
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
    common: ShardCommon,
    listen: SocketAddr,
    kafka_listen: Option<SocketAddr>,
    ends: MeshEnds,
    startup: mpsc::Sender<Startup>,
    inbox: Option<UnboundedReceiver<Envelope>>,
}

/// What every shard of the node starts with.
#[derive(Clone)]
struct ShardCommon {
    settings: Arc<Settings>,
    data_dir: PathBuf,
    /// The node's identity (each shard sets its own `shard_id`).
    identity: ShardIdentity,
    key: ReceiptKey,
    meta: Arc<MetaNode>,
    node: Arc<NodeShared>,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    faults: Arc<FaultControl>,
    peers: Option<Arc<Peers>>,
    /// The other nodes over QUIC; `None` for a single node.
    nodes: Option<QuicNodes>,
    /// HTTPS on the client port; `None` for plain HTTP.
    tls: Option<Arc<ServerTls>>,
    /// TLS on the Kafka listener; `None` for plain Kafka.
    kafka_tls: Option<Arc<ServerTls>>,
}

/// The number of shards: `shards`, or every online CPU when 0.
fn shard_count(settings: &Settings) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    match settings.shards {
        0 => cpus,
        n => usize::try_from(n).unwrap_or(cpus),
    }
}

/// The address to bind for `key` (`HOST:PORT`, an IP address or a DNS
/// name, looked up now: a name that does not resolve stops the start,
/// naming it).
fn bind_address(key: &str, value: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let mut found = value
        .to_socket_addrs()
        .map_err(|e| format!("{key} {value:?}: {e}"))?;
    found
        .next()
        .ok_or_else(|| format!("{key} {value:?} resolves to no address"))
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
    let client_listen = bind_address("listen", &settings.listen)?;
    refuse_port_in_use(client_listen)?;
    let kafka_listen = match &settings.kafka.listen {
        Some(value) => {
            let addr = bind_address("kafka.listen", value)?;
            if addr.ip().is_unspecified() && settings.kafka.advertised_address.is_none() {
                return Err(format!(
                    "kafka.listen {value} is not an address Kafka clients can be told to connect to; set kafka.advertised_address too"
                ));
            }
            refuse_port_in_use(addr)?;
            Some(addr)
        }
        None => None,
    };
    let incarnation = draw_incarnation()?;
    let shards = shard_count(&settings);
    let node_id = settings.node_id;
    // Signals are blocked before any thread starts, so every thread
    // inherits the mask and only the signal thread takes SIGTERM.
    let tls = match (&settings.http.tls.cert_file, &settings.http.tls.key_file) {
        (Some(cert_file), Some(key_file)) => Some(
            ServerTls::load(TlsFiles {
                cert_file: cert_file.clone(),
                key_file: key_file.clone(),
                client_ca_file: settings.http.tls.client_ca_file.clone(),
            })
            .map_err(|e| format!("http.tls (HTTPS on the client port): {e}"))?,
        ),
        _ => None,
    };
    let kafka_tls = match (&settings.kafka.tls.cert_file, &settings.kafka.tls.key_file) {
        (Some(cert_file), Some(key_file)) => Some(
            ServerTls::load(TlsFiles {
                cert_file: cert_file.clone(),
                key_file: key_file.clone(),
                client_ca_file: None,
            })
            .map_err(|e| format!("kafka.tls (TLS on the Kafka listener): {e}"))?,
        ),
        _ => None,
    };
    // A CA file that cannot serve is refused now, not at the first copy.
    if let Some(ca_file) = &settings.children.remote_ca_file {
        narad_net::tls::client_config(&narad_net::tls::ClientTlsFiles {
            ca_file: Some(ca_file.clone()),
            ..Default::default()
        })
        .map_err(|e| format!("children.remote_ca_file {ca_file}: {e}"))?;
    }
    let (stopping, stop_signalled) = mpsc::channel();
    let reloadable = [("client port", &tls), ("Kafka listener", &kafka_tls)]
        .into_iter()
        .filter_map(|(port, tls)| Some((port, tls.clone()?)))
        .collect();
    let stop = handle_signals(stopping.clone(), reloadable)?;
    let ship = crate::ship::Shipper::start(
        settings.children.remote_ca_file.clone(),
        usize::try_from(settings.children.remote_max_in_flight).unwrap_or(usize::MAX),
    )?;
    let faults = fault_control(&settings, &data_dir)?;
    if settings.testing.short_retention {
        tracing::warn!(
            floor_ms = settings.topics.retention_floor_ms,
            "testing.short_retention is on: topics may keep messages for less than an hour (tests only)"
        );
    }
    let blocking_fs = BlockingFs::with_faults(faults.clone());
    let epoch = next_epoch(&blocking_fs, &data_dir)?;
    let metrics = install_metrics()?;
    metrics::gauge!(CONSUME_LONG_POLLS_WAITING).set(0.0);
    metrics::counter!(CONSUME_EMPTY_WAKES_TOTAL).absolute(0);
    metrics::counter!(DISPATCHER_REROUTES_TOTAL).absolute(0);
    metrics::gauge!(MOVES_IN_PROGRESS).set(0.0);
    metrics::counter!(MOVE_COPIED_BYTES_TOTAL).absolute(0);
    metrics::counter!(STORAGE_CORRUPT_RECORDS_TOTAL).increment(0);
    let key = receipt_key(&blocking_fs, &data_dir)?;
    let peer = bind_address("peer_listen", &settings.peer_listen)?;
    let members = parse_peers(&settings, node_id)?;
    // A node with peers or joining a cluster may start before the cluster
    // has a leader; one with only the peer trust set (a secret or
    // certificates) runs alone until others join it.
    let clustered = !members.is_empty() || settings.join.is_some();
    let peer_network =
        clustered || settings.cluster.secret.is_some() || settings.cluster.tls.ca_file.is_some();
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
    let mut nodes = None;
    let endpoint = if peer_network {
        let tls = peer_tls(&settings)?;
        let handler_meta = served_meta.clone();
        let handler_inbox = inbox.clone();
        let handler: PeerHandler = Arc::new(move |kind, payload| {
            if rpc::is_operation_kind(kind) {
                return handler_inbox.handle(kind, payload);
            }
            match handler_meta.get() {
                Some(meta) => meta.serve(kind, payload),
                None => Box::pin(async { Err("the metastore is starting".to_string()) }),
            }
        });
        let endpoint = PeerEndpoint::start(peer, &tls, handler)
            .map_err(|e| format!("starting QUIC on {peer}: {e}"))?;
        let known = Arc::new(Peers::new(u64::from(node_id), &members));
        nodes = Some(QuicNodes::new(endpoint.clone(), known.clone()));
        peers = Some(known);
        // Other nodes reach this one at the address it was told to listen
        // on (a DNS name stays a name), or where it bound port 0.
        let advertised = if settings.peer_listen.ends_with(":0") {
            endpoint.local_addr().to_string()
        } else {
            settings.peer_listen.clone()
        };
        if settings.join.is_some() && endpoint.local_addr().ip().is_unspecified() {
            return Err(format!(
                "--join: --peer-listen {} is not an address other nodes can reach; name this host",
                settings.peer_listen
            ));
        }
        meta_config.peer_addr = advertised;
        meta_config.members = members;
        meta_config.join = settings.join.clone();
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
        recovered: Arc::default(),
        folders: Arc::default(),
        keys: NodeKeys::new(
            IDEMPOTENCY_KEYS_PER_SHARD_MAX.saturating_mul(shards),
            shards,
        ),
        http_budget: NodeBudget::new(
            usize::try_from(settings.http.max_connections).unwrap_or(usize::MAX),
            settings.http.max_buffered_body_bytes,
        ),
        ship: Arc::new(ship),
        shares: Arc::default(),
        producers: Arc::default(),
    });
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let (startup, started) = mpsc::channel();
    let mut listen = client_listen;
    let mut kafka_bound = kafka_listen;
    let mut handles = Vec::with_capacity(shards);
    let mut inboxes = inbox.wire(shards).into_iter();
    let common = ShardCommon {
        settings: settings.clone(),
        data_dir: data_dir.clone(),
        identity: ShardIdentity {
            node_id,
            shard_id: 0,
            shards: u16::try_from(shards).map_err(|_| format!("{shards} shards is too many"))?,
            epoch,
            incarnation,
        },
        key: key.clone(),
        meta: meta.clone(),
        node: node.clone(),
        metrics: metrics.clone(),
        faults: faults.clone(),
        peers: peers.clone(),
        nodes,
        tls,
        kafka_tls,
    };
    for (index, ends) in mesh::wire(shards).into_iter().enumerate() {
        let start = ShardStart {
            index,
            common: common.clone(),
            listen,
            kafka_listen: kafka_bound,
            ends,
            startup: startup.clone(),
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
        let mut watch = ExecutorWatch {
            startup: startup.clone(),
            index,
            ran: false,
        };
        let handle = LocalExecutorBuilder::new(placement)
            .name(&format!("narad-shard-{index}"))
            .io_memory(IO_MEMORY_BYTES)
            .spawn(move || {
                watch.ran = true;
                drop(watch);
                async move {
                    let startup = start.startup.clone();
                    let result = run_shard(start).await;
                    if let Err(error) = &result {
                        let _ = startup.send(Startup::Failed(error.clone()));
                    }
                    result
                }
            })
            .map_err(|e| format!("starting shard {index}: {e}"))?;
        handles.push(handle);
        if index == 0 {
            // Port 0 picks a free port: every other shard joins the one
            // shard 0 got.
            match started.recv() {
                Ok(Startup::Bound { client, kafka }) => {
                    listen = client;
                    kafka_bound = kafka;
                }
                Ok(Startup::Failed(error)) => return Err(error),
                Ok(Startup::NoExecutor(index)) => {
                    let ended = handles.pop().map_or(Ok(Ok(())), |h| h.join());
                    return Err(no_executor(index, ended));
                }
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
            Ok(Startup::Bound { .. }) => {}
            // A shard that failed leaves the others waiting for it: the
            // caller exits the process.
            Ok(Startup::Failed(error)) => return Err(error),
            Ok(Startup::NoExecutor(index)) => {
                let ended = if index < handles.len() {
                    handles.swap_remove(index).join()
                } else {
                    Ok(Ok(()))
                };
                return Err(no_executor(index, ended));
            }
            Err(_) => return Err("a shard stopped while starting".into()),
        }
    }
    // The documented listening line: scripts and tests parse it.
    let peer_addr = endpoint.as_ref().map_or(peer, |e| e.local_addr());
    match kafka_bound {
        Some(kafka) => println!("listening client={listen} peer={peer_addr} kafka={kafka}"),
        None => println!("listening client={listen} peer={peer_addr}"),
    }
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
