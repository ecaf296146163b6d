//! Between nodes: QUIC (quinn) with mutual TLS (rustls, ring provider).
//!
//! One tokio current-thread runtime per node, on its own thread, owns the
//! quinn endpoint (quinn's runtime must be `Send`; glommio shards and the
//! Raft thread reach it through [`PeerEndpoint::call`], which runs the call
//! on that runtime and can be awaited from any executor).
//!
//! Every call is one bidirectional stream: the request is a kind byte and
//! the payload, the answer a status byte (0 ok, 1 error text) and the bytes.
//! Each call has a deadline; a lost connection is dropped and made again on
//! the next call, so it never blocks a caller for longer than its deadline.
//!
//! Trust: with a cluster secret, every node derives the same cluster CA
//! (an Ed25519 key from the secret, a certificate with fixed fields, so the
//! same bytes on every node) and signs a fresh certificate of its own with
//! it; nodes verify each other against that CA both ways. A node of another
//! cluster, or a process without the secret, fails the handshake and is
//! refused and logged. Production uses operator files instead
//! ([`PeerTls::from_files`]).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The name every node's certificate carries and every client checks.
pub const PEER_SERVER_NAME: &str = "narad-node";
const ALPN: &[u8] = b"narad-peer/1";
/// Largest answer or request accepted on one stream.
const MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;
const KEEP_ALIVE: Duration = Duration::from_millis(500);
const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// At shutdown, answers still being written get this long to reach their
/// callers (a commit whose answer is lost is committed again).
const ANSWER_DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
const ANSWER_DRAIN_POLL: Duration = Duration::from_millis(5);
/// PKCS#8 v1 wrapping of a raw Ed25519 seed (RFC 8410).
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    #[error("TLS setup: {0}")]
    Tls(String),
    #[error("peer endpoint: {0}")]
    Endpoint(String),
    /// The peer could not be reached or did not answer in time.
    #[error("peer {addr} unreachable: {reason}")]
    Unreachable { addr: String, reason: String },
    /// The peer answered with an error.
    #[error("peer {addr} answered an error: {reason}")]
    Remote { addr: String, reason: String },
}

/// The TLS settings of a node, both directions.
#[derive(Clone)]
pub struct PeerTls {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
}

fn tls_err(e: impl std::fmt::Display) -> PeerError {
    PeerError::Tls(e.to_string())
}

impl PeerTls {
    /// Trust derived from a shared secret: no files prepared by hand.
    pub fn from_secret(secret: &str) -> Result<Self, PeerError> {
        if secret.is_empty() {
            return Err(PeerError::Tls("the cluster secret is empty".into()));
        }
        let seed = blake3::derive_key("narad cluster CA v1 ed25519 seed", secret.as_bytes());
        let mut pkcs8 = ED25519_PKCS8_PREFIX.to_vec();
        pkcs8.extend_from_slice(&seed);
        let ca_key = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(
            &PrivatePkcs8KeyDer::from(pkcs8),
            &rcgen::PKCS_ED25519,
        )
        .map_err(tls_err)?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(tls_err)?;
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "narad cluster CA");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        ca_params.not_before = rcgen::date_time_ymd(2024, 1, 1);
        ca_params.not_after = rcgen::date_time_ymd(2124, 1, 1);
        ca_params.serial_number = Some(rcgen::SerialNumber::from(1u64));
        let ca_cert = ca_params.self_signed(&ca_key).map_err(tls_err)?;
        let issuer = rcgen::Issuer::new(ca_params, ca_key);

        let node_key =
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(tls_err)?;
        let mut node_params =
            rcgen::CertificateParams::new(vec![PEER_SERVER_NAME.to_string()]).map_err(tls_err)?;
        node_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, PEER_SERVER_NAME);
        node_params.not_before = rcgen::date_time_ymd(2024, 1, 1);
        node_params.not_after = rcgen::date_time_ymd(2124, 1, 1);
        let node_cert = node_params.signed_by(&node_key, &issuer).map_err(tls_err)?;
        Self::build(
            ca_cert.der().clone(),
            vec![node_cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(node_key.serialize_der())),
        )
    }

    /// Trust from operator files: the cluster CA, this node's certificate
    /// (chain) and its private key, all PEM. The certificate must name
    /// `narad-node` (the name every node checks).
    pub fn from_files(ca: &str, cert: &str, key: &str) -> Result<Self, PeerError> {
        let read = |path: &str| {
            std::fs::read(path).map_err(|e| PeerError::Tls(format!("reading {path}: {e}")))
        };
        let ca_pem = read(ca)?;
        let cert_pem = read(cert)?;
        let key_pem = read(key)?;
        use rustls::pki_types::pem::PemObject;
        let ca = CertificateDer::pem_slice_iter(&ca_pem)
            .next()
            .ok_or_else(|| PeerError::Tls(format!("{ca}: no certificate")))?
            .map_err(tls_err)?;
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(tls_err)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(tls_err)?;
        Self::build(ca, chain, key)
    }

    fn build(
        ca: CertificateDer<'static>,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Self, PeerError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca).map_err(tls_err)?;
        let roots = Arc::new(roots);
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(tls_err)?;
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls_err)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(tls_err)?;
        server.alpn_protocols = vec![ALPN.to_vec()];
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls_err)?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(tls_err)?;
        client.alpn_protocols = vec![ALPN.to_vec()];
        Ok(Self {
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }
}

/// Answers one request: its kind and payload, to the answer bytes or an
/// error text.
pub type PeerHandler = Arc<
    dyn Fn(u8, Vec<u8>) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + Send>>
        + Send
        + Sync,
>;

/// `HOST:PORT` as a socket address: an IP address as it is, a DNS name
/// looked up (its first address of the local endpoint's family, which is
/// the one the endpoint can send to, else its first).
async fn resolve(addr: &str, local: SocketAddr) -> Result<SocketAddr, String> {
    if let Ok(ip) = addr.parse::<SocketAddr>() {
        return Ok(ip);
    }
    let found: Vec<SocketAddr> = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| format!("looking up {addr}: {e}"))?
        .collect();
    found
        .iter()
        .find(|a| a.is_ipv4() == local.is_ipv4())
        .or(found.first())
        .copied()
        .ok_or_else(|| format!("{addr} resolves to no address"))
}

/// This node's QUIC endpoint: serves peers and calls them.
pub struct PeerEndpoint {
    endpoint: quinn::Endpoint,
    client_config: quinn::ClientConfig,
    runtime: tokio::runtime::Handle,
    /// By the peer's address as configured (`HOST:PORT`, an IP address or
    /// a DNS name): a name is resolved again for every new connection, so a
    /// peer that comes back at another IP address is found.
    connections: Mutex<HashMap<String, quinn::Connection>>,
    local_addr: SocketAddr,
    stop: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
}

impl PeerEndpoint {
    /// Binds `bind` (UDP) and starts serving peers with `handler`, on a
    /// thread of its own.
    pub fn start(
        bind: SocketAddr,
        tls: &PeerTls,
        handler: PeerHandler,
    ) -> Result<Arc<Self>, PeerError> {
        let endpoint_err = |e: &dyn std::fmt::Display| PeerError::Endpoint(e.to_string());
        let server_crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls.server.clone())
            .map_err(|e| endpoint_err(&e))?;
        let mut server_config = quinn::ServerConfig::with_crypto(Arc::new(server_crypto));
        let mut transport = quinn::TransportConfig::default();
        transport.keep_alive_interval(Some(KEEP_ALIVE));
        transport.max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(IDLE_TIMEOUT).map_err(|e| endpoint_err(&e))?,
        ));
        let transport = Arc::new(transport);
        server_config.transport_config(transport.clone());
        let client_crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls.client.clone())
            .map_err(|e| endpoint_err(&e))?;
        let mut client_config = quinn::ClientConfig::new(Arc::new(client_crypto));
        client_config.transport_config(transport);

        let started = narad_thread::start("narad-peer", move |ready| async move {
            let endpoint = match quinn::Endpoint::server(server_config, bind) {
                Ok(endpoint) => endpoint,
                Err(error) => {
                    ready.send(Err(PeerError::Endpoint(format!("binding {bind}: {error}"))));
                    return;
                }
            };
            let (stop, stopped) = tokio::sync::oneshot::channel();
            ready.send(Ok((
                endpoint.clone(),
                tokio::runtime::Handle::current(),
                stop,
            )));
            let answering = Arc::new(AtomicUsize::new(0));
            let accepting = accept_loop(endpoint.clone(), handler, answering.clone());
            tokio::select! {
                () = accepting => {}
                _ = stopped => {}
            }
            let deadline = tokio::time::Instant::now() + ANSWER_DRAIN_TIMEOUT;
            while answering.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(ANSWER_DRAIN_POLL).await;
            }
            endpoint.close(0u32.into(), b"stopping");
            endpoint.wait_idle().await;
        });
        let (bound, _thread) = started.map_err(|e| PeerError::Endpoint(e.to_string()))?;
        let (endpoint, runtime, stop) = bound?;
        let local_addr = endpoint.local_addr().map_err(|e| endpoint_err(&e))?;
        Ok(Arc::new(Self {
            endpoint,
            client_config,
            runtime,
            connections: Mutex::new(HashMap::new()),
            local_addr,
            stop: Mutex::new(Some(stop)),
        }))
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Calls a peer at `addr` (`HOST:PORT`, an IP address or a DNS name):
    /// sends `payload` as a request of `kind` and returns the answer, within
    /// `timeout` (a name's lookup included). Runs on the endpoint's runtime,
    /// so it can be awaited from any executor.
    pub async fn call(
        self: &Arc<Self>,
        addr: &str,
        kind: u8,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, PeerError> {
        let this = self.clone();
        let target = addr.to_string();
        let task = self.runtime.spawn(async move {
            match tokio::time::timeout(timeout, this.call_here(&target, kind, payload)).await {
                Ok(result) => result,
                Err(_) => {
                    this.forget(&target);
                    Err(PeerError::Unreachable {
                        addr: target,
                        reason: format!("no answer within {timeout:?}"),
                    })
                }
            }
        });
        task.await.map_err(|e| PeerError::Unreachable {
            addr: addr.to_string(),
            reason: e.to_string(),
        })?
    }

    async fn call_here(
        &self,
        addr: &str,
        kind: u8,
        payload: Vec<u8>,
    ) -> Result<Vec<u8>, PeerError> {
        let unreachable = |reason: String| PeerError::Unreachable {
            addr: addr.to_string(),
            reason,
        };
        let connection = self.connection(addr).await?;
        let result = async {
            let (mut send, mut recv) = connection.open_bi().await.map_err(|e| e.to_string())?;
            send.write_all(&[kind]).await.map_err(|e| e.to_string())?;
            send.write_all(&payload).await.map_err(|e| e.to_string())?;
            send.finish().map_err(|e| e.to_string())?;
            recv.read_to_end(MESSAGE_BYTES_MAX)
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        let answer = match result {
            Ok(answer) => answer,
            Err(reason) => {
                self.forget(addr);
                return Err(unreachable(reason));
            }
        };
        match answer.split_first() {
            Some((0, body)) => Ok(body.to_vec()),
            Some((_, text)) => Err(PeerError::Remote {
                addr: addr.to_string(),
                reason: String::from_utf8_lossy(text).into_owned(),
            }),
            None => Err(unreachable("an empty answer".into())),
        }
    }

    async fn connection(&self, addr: &str) -> Result<quinn::Connection, PeerError> {
        let cached = self
            .connections
            .lock()
            .ok()
            .and_then(|c| c.get(addr).cloned());
        if let Some(connection) = cached {
            if connection.close_reason().is_none() {
                return Ok(connection);
            }
        }
        let unreachable = |reason: String| PeerError::Unreachable {
            addr: addr.to_string(),
            reason,
        };
        let resolved = resolve(addr, self.local_addr).await.map_err(unreachable)?;
        let connecting = self
            .endpoint
            .connect_with(self.client_config.clone(), resolved, PEER_SERVER_NAME)
            .map_err(|e| unreachable(e.to_string()))?;
        let connection = connecting.await.map_err(|e| {
            tracing::warn!(%addr, %resolved, error = %e, "could not connect to a peer (is it of this cluster?)");
            unreachable(e.to_string())
        })?;
        if let Ok(mut connections) = self.connections.lock() {
            connections.insert(addr.to_string(), connection.clone());
        }
        Ok(connection)
    }

    fn forget(&self, addr: &str) {
        if let Ok(mut connections) = self.connections.lock() {
            connections.remove(addr);
        }
    }

    /// Closes the endpoint and stops its thread's accept loop.
    pub fn shutdown(&self) {
        if let Some(stop) = self.stop.lock().ok().and_then(|mut s| s.take()) {
            let _ = stop.send(());
        }
    }
}

async fn accept_loop(endpoint: quinn::Endpoint, handler: PeerHandler, answering: Arc<AtomicUsize>) {
    while let Some(incoming) = endpoint.accept().await {
        let handler = handler.clone();
        let answering = answering.clone();
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            let connection = match incoming.await {
                Ok(connection) => connection,
                Err(error) => {
                    tracing::warn!(%remote, %error, "refused a peer (TLS or another cluster's certificate)");
                    return;
                }
            };
            while let Ok((send, recv)) = connection.accept_bi().await {
                let handler = handler.clone();
                let answering = answering.clone();
                answering.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    serve_stream(send, recv, handler).await;
                    answering.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
    }
}

async fn serve_stream(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    handler: PeerHandler,
) {
    let Ok(request) = recv.read_to_end(MESSAGE_BYTES_MAX).await else {
        return;
    };
    let answer = match request.split_first() {
        Some((kind, payload)) => handler(*kind, payload.to_vec()).await,
        None => Err("an empty request".to_string()),
    };
    let bytes = match answer {
        Ok(body) => {
            let mut bytes = Vec::with_capacity(body.len() + 1);
            bytes.push(0);
            bytes.extend_from_slice(&body);
            bytes
        }
        Err(text) => {
            let mut bytes = vec![1];
            bytes.extend_from_slice(text.as_bytes());
            bytes
        }
    };
    if send.write_all(&bytes).await.is_ok() {
        let _ = send.finish();
        // Wait until the peer has the answer before the stream goes away.
        let _ = send.stopped().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo() -> PeerHandler {
        Arc::new(|kind, payload| {
            Box::pin(async move {
                if kind == 9 {
                    return Err("kind 9 is refused".to_string());
                }
                let mut answer = vec![kind];
                answer.extend(payload);
                Ok(answer)
            })
        })
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    fn local() -> SocketAddr {
        "127.0.0.1:0".parse().expect("addr")
    }

    #[test]
    fn nodes_with_one_secret_talk_and_errors_come_back() {
        let a = PeerEndpoint::start(
            local(),
            &PeerTls::from_secret("s3cret").expect("tls"),
            echo(),
        )
        .expect("a");
        let b = PeerEndpoint::start(
            local(),
            &PeerTls::from_secret("s3cret").expect("tls"),
            echo(),
        )
        .expect("b");
        let timeout = Duration::from_secs(10);
        runtime().block_on(async {
            let answer = a
                .call(&b.local_addr().to_string(), 3, b"hello".to_vec(), timeout)
                .await
                .expect("call");
            assert_eq!(answer, b"\x03hello");
            let again = b.call(&a.local_addr().to_string(), 4, vec![], timeout).await.expect("back");
            assert_eq!(again, vec![4]);
            let refused = a.call(&b.local_addr().to_string(), 9, vec![], timeout).await;
            assert!(
                matches!(refused, Err(PeerError::Remote { ref reason, .. }) if reason.contains("refused")),
                "{refused:?}"
            );
        });
        a.shutdown();
        b.shutdown();
    }

    #[test]
    fn another_clusters_node_is_refused() {
        let ours =
            PeerEndpoint::start(local(), &PeerTls::from_secret("ours").expect("tls"), echo())
                .expect("ours");
        let theirs = PeerEndpoint::start(
            local(),
            &PeerTls::from_secret("theirs").expect("tls"),
            echo(),
        )
        .expect("theirs");
        runtime().block_on(async {
            let refused = theirs
                .call(
                    &ours.local_addr().to_string(),
                    1,
                    vec![],
                    Duration::from_secs(5),
                )
                .await;
            assert!(
                matches!(refused, Err(PeerError::Unreachable { .. })),
                "{refused:?}"
            );
        });
        ours.shutdown();
        theirs.shutdown();
    }

    /// A CA and a node certificate it signs (naming `narad-node`), written
    /// as PEM files in a fresh folder; returns the three paths.
    fn operator_files(tag: &str) -> (String, String, String) {
        let dir = std::env::temp_dir().join(format!(
            "narad-peer-{tag}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        std::fs::create_dir_all(&dir).expect("dir");
        let ca_key = rcgen::KeyPair::generate().expect("ca key");
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).expect("ca cert");
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec![PEER_SERVER_NAME.to_string()])
            .expect("params")
            .signed_by(&key, &issuer)
            .expect("cert");
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write");
            path.to_string_lossy().to_string()
        };
        (
            write("ca.pem", ca_cert.pem()),
            write("node.pem", cert.pem()),
            write("node-key.pem", key.serialize_pem()),
        )
    }

    #[test]
    fn nodes_with_operator_files_of_one_ca_talk_and_another_cas_node_is_refused() {
        let (ca, cert, key) = operator_files("ours");
        let ours = PeerTls::from_files(&ca, &cert, &key).expect("operator files");
        let a = PeerEndpoint::start(local(), &ours, echo()).expect("a");
        let b = PeerEndpoint::start(local(), &ours, echo()).expect("b");
        let (ca2, cert2, key2) = operator_files("theirs");
        let theirs = PeerTls::from_files(&ca2, &cert2, &key2).expect("other files");
        let stranger = PeerEndpoint::start(local(), &theirs, echo()).expect("stranger");
        runtime().block_on(async {
            let answer = a
                .call(
                    &b.local_addr().to_string(),
                    3,
                    b"hi".to_vec(),
                    Duration::from_secs(10),
                )
                .await
                .expect("same CA");
            assert_eq!(answer, b"\x03hi");
            let refused = stranger
                .call(
                    &a.local_addr().to_string(),
                    1,
                    vec![],
                    Duration::from_secs(5),
                )
                .await;
            assert!(
                matches!(refused, Err(PeerError::Unreachable { .. })),
                "{refused:?}"
            );
        });
        assert!(PeerTls::from_files(&ca, "/nonexistent.pem", &key).is_err());
        for endpoint in [a, b, stranger] {
            endpoint.shutdown();
        }
        for file in [ca, ca2] {
            if let Some(dir) = std::path::Path::new(&file).parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }

    #[test]
    fn a_silent_peer_times_out_instead_of_blocking() {
        let a = PeerEndpoint::start(local(), &PeerTls::from_secret("x").expect("tls"), echo())
            .expect("a");
        // A UDP socket that never answers.
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
        let started = std::time::Instant::now();
        let result = runtime().block_on(a.call(
            &silent.local_addr().expect("addr").to_string(),
            1,
            vec![],
            Duration::from_millis(300),
        ));
        assert!(matches!(result, Err(PeerError::Unreachable { .. })));
        assert!(started.elapsed() < Duration::from_secs(5));
        a.shutdown();
    }

    #[test]
    fn a_peer_named_by_a_dns_name_is_found_and_a_name_that_does_not_resolve_is_unreachable() {
        let secret = PeerTls::from_secret("named").expect("tls");
        let a = PeerEndpoint::start(local(), &secret, echo()).expect("a");
        let b = PeerEndpoint::start(local(), &secret, echo()).expect("b");
        let named = format!("localhost:{}", b.local_addr().port());
        let timeout = Duration::from_secs(10);
        runtime().block_on(async {
            let answer = a.call(&named, 5, b"hi".to_vec(), timeout).await.expect("by name");
            assert_eq!(answer, b"\x05hi");
            let nowhere = a
                .call("no-such-host.invalid:9080", 5, vec![], timeout)
                .await;
            assert!(
                matches!(nowhere, Err(PeerError::Unreachable { ref addr, .. }) if addr == "no-such-host.invalid:9080"),
                "{nowhere:?}"
            );
        });
        a.shutdown();
        b.shutdown();
    }
}
