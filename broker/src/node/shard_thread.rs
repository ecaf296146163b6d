//! One shard's thread: its listener, WAL, metastore wait, the shard and
//! its background tasks, serving until the stop, and the two halves of the
//! graceful stop.

use super::telemetry::METRICS_UPKEEP_INTERVAL;
use super::*;
use crate::kafka::listener::serve_kafka;
use crate::kafka::serve::{Advertised, Answerer};
use crate::limits::{CLIENT_LISTEN_BACKLOG, KAFKA_ADDRESS_RETRY, STOP_DISPATCHER_WAIT};
use narad_raft::state::Command;

pub(super) async fn run_shard(start: ShardStart) -> Result<(), String> {
    let ShardStart {
        index,
        common,
        listen,
        kafka_listen,
        ends,
        startup,
        inbox: remote_inbox,
    } = start;
    let ShardCommon {
        settings,
        data_dir,
        identity,
        key,
        meta,
        node,
        metrics,
        faults,
        peers,
        nodes,
        tls,
        kafka_tls,
    } = common;
    // Connecting waits for every peer to connect too: start it first, so a
    // slow bind here never holds another shard.
    let connecting = glommio::spawn_local(ends.connect());
    let listener = client_listener(listen).map_err(|e| format!("listening on {listen}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let kafka = match kafka_listen {
        Some(addr) => {
            let listener =
                client_listener(addr).map_err(|e| format!("kafka.listen {addr}: {e}"))?;
            let bound = listener.local_addr().map_err(|e| e.to_string())?;
            Some((listener, bound))
        }
        None => None,
    };
    let _ = startup.send(Startup::Bound {
        client: local,
        kafka: kafka.as_ref().map(|(_, bound)| *bound),
    });
    let (mesh, inbox) = connecting.await;

    let disk = GlommioFs::new(&data_dir)
        .await
        .map_err(|e| format!("preparing {}: {e}", data_dir.display()))?;
    let fs = NodeFs::wrap(disk, faults.clone());
    let clock: SharedClock = Rc::new(SystemClock);
    let wal_config = WalConfig {
        ring_bytes: settings.storage.wal_ring_bytes,
        ..WalConfig::default()
    };
    let wal_dir = data_dir.join("wal");
    let (wal, recovery) = Wal::open(&fs, &wal_dir.join(format!("shard-{index}")), wal_config)
        .await
        .map_err(|e| format!("opening the ingress WAL of shard {index}: {e}"))?;
    // Keyed produces wait until every shard put its keys back, and those
    // of the rings of removed shards it adopts.
    let orphans = orphan_wals(&wal_dir, index, node.shards);
    node.keys.expect_adopted(orphans.len());
    node.keys
        .recover(recovery.keys.iter().map(|(_, key)| key), clock.now_ms());
    node.keys.shard_loaded();
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
        shard_id: u16::try_from(index).map_err(|_| "too many shards".to_string())?,
        ..identity
    };
    let shard = Shard::new(ShardParts {
        identity,
        settings: settings.clone(),
        links: Links {
            shards: Box::new(mesh),
            nodes: nodes.map(|nodes| Box::new(nodes) as Box<dyn Transport>),
        },
        wal: wal.clone(),
        peers,
        env: ShardEnv {
            data_dir: data_dir.clone(),
            fs,
            clock,
            runtime: Rc::new(GlommioRuntime),
            meta: Rc::new(meta.clone()),
            receipt_key: key,
            metrics: metrics.clone(),
            wal_failed: node.wal_failed.clone(),
            keys: node.keys.clone(),
            recovered: node.recovered.clone(),
            folders: node.folders.clone(),
            http_budget: node.http_budget.clone(),
            ship: node.ship.clone(),
            faults,
        },
    });
    for inbox in inbox {
        glommio::spawn_local(shard.clone().serve_from(inbox, Reach::Shard)).detach();
    }
    if let Some(remote_inbox) = remote_inbox {
        glommio::spawn_local(shard.clone().serve_from(remote_inbox, Reach::Node)).detach();
    }
    if !recovery.records.is_empty() {
        tracing::info!(
            shard = index,
            records = recovery.records.len(),
            "committing again what the WAL holds above its checkpoint"
        );
    }
    shard.start_tasks(
        recovery
            .records
            .into_iter()
            .map(|r| (r.pos, r.record))
            .collect(),
    );
    if index == 0 {
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(METRICS_UPKEEP_INTERVAL).await;
                metrics.run_upkeep();
            }
        })
        .detach();
    }
    let dispatcher = glommio::spawn_local(shard.clone().run_dispatcher());
    for orphan in orphans {
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
    let screen_shard = shard.clone();
    let screen: Screen = Rc::new(move |head| crate::api::screen(&screen_shard, head));
    let accepting = Rc::new(std::cell::Cell::new(false));
    let server = glommio::spawn_local(serve(
        listener,
        limits,
        handler,
        Some(screen),
        accepting,
        node.http_budget.clone(),
        tls,
    ));
    let advertised = kafka
        .as_ref()
        .map(|(_, bound)| kafka_advertised(&settings, *bound));
    let kafka_server = kafka.map(|(listener, bound)| {
        let me = advertised
            .as_deref()
            .and_then(|addr| Advertised::parse(u64::from(identity.node_id), addr))
            .unwrap_or(Advertised {
                node_id: i32::from(identity.node_id),
                host: bound.ip().to_string(),
                port: i32::from(bound.port()),
            });
        glommio::spawn_local(serve_kafka(
            listener,
            Rc::new(Answerer::new(
                shard.clone(),
                me,
                node.shares.clone(),
                node.producers.clone(),
            )),
            node.http_budget.clone(),
            kafka_tls,
        ))
    });
    if index == 0 {
        glommio::spawn_local(record_kafka_address(
            shard.clone(),
            identity.node_id,
            advertised,
            node.stop.clone(),
        ))
        .detach();
    }
    let _ = startup.send(Startup::Serving);
    while !node.stop.load(Ordering::SeqCst) {
        glommio::timer::sleep(STOP_POLL_INTERVAL).await;
    }
    drop(server);
    drop(kafka_server);
    shard.drain().await;
    node.barrier(&node.drained, "dispatchers drained").await;
    shard.finish().await;
    node.barrier(&node.finished, "acks flushed").await;
    // The dispatcher ends once nothing is left to commit. When the drain
    // gave up (an owner that does not answer, no live sibling to reroute
    // to), it would retry forever: its records stay in the WAL, and the
    // next start commits them.
    let ended = futures_lite::future::or(
        async {
            dispatcher.await;
            true
        },
        async {
            glommio::timer::sleep(STOP_DISPATCHER_WAIT).await;
            false
        },
    )
    .await;
    if !ended {
        tracing::warn!(
            shard = index,
            records = shard.undispatched(),
            "stopped with records not yet committed; the WAL keeps them for the next start"
        );
    }
    tracing::info!(shard = index, "stopped");
    Ok(())
}

/// What Metadata tells Kafka clients to connect to for this node:
/// `kafka.advertised_address`, else `kafka.listen` as given (a DNS name
/// stays a name), with the port bound when it was 0.
fn kafka_advertised(settings: &Settings, bound: SocketAddr) -> String {
    match (&settings.kafka.advertised_address, &settings.kafka.listen) {
        (Some(advertised), _) => advertised.clone(),
        (None, Some(listen)) if !listen.ends_with(":0") => listen.clone(),
        _ => bound.to_string(),
    }
}

/// Records this node's Kafka address in the metastore (or that it has
/// none), so that every node's Metadata names it; tries again until the
/// metastore has it or the node stops.
async fn record_kafka_address(
    shard: Rc<Shard>,
    node_id: u16,
    addr: Option<String>,
    stop: Arc<AtomicBool>,
) {
    let id = u64::from(node_id);
    while !stop.load(Ordering::SeqCst) {
        if shard.meta().view().state.kafka_addrs.get(&id) == addr.as_ref() {
            return;
        }
        let command = Command::SetKafkaAddress {
            id,
            addr: addr.clone(),
        };
        if let Err(error) = shard.meta().propose(command).await {
            tracing::debug!(%error, "the Kafka address is not recorded yet");
            glommio::timer::sleep(KAFKA_ADDRESS_RETRY).await;
        }
    }
}

/// WAL folders of shards beyond the current count (the node ran with more
/// shards before) that shard `index` takes over: `shard-j` with
/// `j % shards == index`.
pub(super) fn orphan_wals(wal_dir: &Path, index: usize, shards: usize) -> Vec<PathBuf> {
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

/// A shard's client listener. Every shard binds the port (SO_REUSEPORT) and
/// the kernel spreads connections over them; SO_REUSEADDR, which the
/// accepted connections inherit, lets a node that restarts bind the port
/// while the connections its predecessor closed linger in TIME-WAIT (a
/// listening process still refuses it: see `folder::refuse_port_in_use`).
fn client_listener(listen: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::os::fd::{FromRawFd, IntoRawFd};
    let socket = Socket::new(
        Domain::for_address(listen),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&listen.into())?;
    socket.listen(CLIENT_LISTEN_BACKLOG)?;
    // SAFETY: the descriptor is a bound, listening TCP socket that only the
    // listener made from it owns.
    Ok(unsafe { TcpListener::from_raw_fd(socket.into_raw_fd()) })
}
