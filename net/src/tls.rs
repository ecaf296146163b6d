//! TLS on the client port (rustls): the server's certificate and key, and
//! optionally the CA whose certificates clients must present; loaded at
//! start and again on demand (SIGHUP) without touching open connections.
//! Also the client side the CLI and the Rust client use.

use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The first byte of every TLS connection (a handshake record).
pub const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Where the client port's certificate, key and client CA come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert_file: String,
    pub key_file: String,
    /// Set: clients must present a certificate this CA signed.
    pub client_ca_file: Option<String>,
}

fn read(path: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("reading {path}: {e}"))
}

fn certificates(path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{path}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{path}: no PEM certificate in it"));
    }
    Ok(certs)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(path: &str) -> Result<Arc<rustls::RootCertStore>, String> {
    let mut roots = rustls::RootCertStore::empty();
    // A system bundle may hold a certificate rustls cannot use: skip it.
    let (added, _skipped) = roots.add_parsable_certificates(certificates(path)?);
    if added == 0 {
        return Err(format!("{path}: no usable CA certificate in it"));
    }
    Ok(Arc::new(roots))
}

/// The server side of the client port, from its files.
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, String> {
    let chain = certificates(&files.cert_file)?;
    let key_pem = read(&files.key_file)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| format!("{}: no PEM private key in it ({e})", files.key_file))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &files.client_ca_file {
        Some(ca) => {
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider())
                    .build()
                    .map_err(|e| format!("{ca}: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("{} and {}: {e}", files.cert_file, files.key_file))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The client port's TLS settings now; [`ServerTls::reload`] swaps them
/// for new connections, while open ones keep theirs.
pub struct ServerTls {
    files: TlsFiles,
    current: RwLock<Arc<rustls::ServerConfig>>,
}

impl ServerTls {
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, String> {
        let config = server_config(&files)?;
        Ok(Arc::new(Self {
            files,
            current: RwLock::new(config),
        }))
    }

    /// Reads the files again; on an error the settings stay as they were.
    pub fn reload(&self) -> Result<(), String> {
        let config = server_config(&self.files)?;
        if let Ok(mut current) = self.current.write() {
            *current = config;
        }
        Ok(())
    }

    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        match self.current.read() {
            Ok(current) => current.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

/// What a client trusts and shows: the CA that signed the server's
/// certificate (else the system's roots), and its own certificate and key
/// for a server that asks for one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    pub ca_file: Option<String>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
}

/// The system's CA bundle on Debian-like and Red Hat-like hosts.
const SYSTEM_CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
];

pub fn client_config(files: &ClientTlsFiles) -> Result<Arc<rustls::ClientConfig>, String> {
    let ca = match &files.ca_file {
        Some(ca) => ca.clone(),
        None => SYSTEM_CA_BUNDLES
            .iter()
            .find(|p| std::path::Path::new(p).exists())
            .map(|p| p.to_string())
            .ok_or("no CA file given and no system CA bundle found: give a CA file")?,
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots(&ca)?);
    let mut config = match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            let key_pem = read(key)?;
            let key = PrivateKeyDer::from_pem_slice(&key_pem)
                .map_err(|e| format!("{key}: no PEM private key in it ({e})"))?;
            builder
                .with_client_auth_cert(certificates(cert)?, key)
                .map_err(|e| format!("{cert}: {e}"))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => return Err("a client certificate needs both its cert and key files".into()),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
