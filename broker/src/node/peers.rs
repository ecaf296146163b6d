//! The other nodes: `--peers`, the peer network's trust, and the metastore's
//! calls over QUIC.

use super::*;

/// The initial members from `peers` (`1=HOST:PORT,2=HOST:PORT`), this node
/// included; empty without peers (a single-node cluster).
pub(super) fn parse_peers(
    settings: &Settings,
    node_id: u16,
) -> Result<BTreeMap<u64, String>, String> {
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
        let addr = addr.trim();
        crate::config::check_host_port(addr)
            .map_err(|why| format!("--peers: {addr:?} is not HOST:PORT: {why}"))?;
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
pub(super) fn peer_tls(settings: &Settings) -> Result<PeerTls, String> {
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
pub(super) struct QuicCaller(pub(super) Arc<PeerEndpoint>);

impl PeerCaller for QuicCaller {
    fn call(
        &self,
        addr: &str,
        kind: u8,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<Result<Vec<u8>, String>> {
        let endpoint = self.0.clone();
        let addr = addr.to_string();
        Box::pin(async move {
            endpoint
                .call(&addr, kind, payload, timeout)
                .await
                .map_err(|e| e.to_string())
        })
    }
}
