//! Certificates for tests, made on the spot (rcgen): a CA, and server and
//! client certificates it signs, written as PEM files.

use std::path::{Path, PathBuf};

/// A certificate authority that can sign certificates.
pub struct TestCa {
    pub cert_file: PathBuf,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    dir: PathBuf,
}

/// A certificate and its key, as files.
pub struct Issued {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl TestCa {
    /// A CA named `name`, its certificate written to `dir/name-ca.pem`.
    pub fn new(dir: &Path, name: &str) -> Self {
        let key = rcgen::KeyPair::generate().expect("CA key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} test CA"));
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("CA certificate");
        let cert_file = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&cert_file, cert.pem()).expect("write CA");
        Self {
            cert_file,
            issuer: rcgen::Issuer::new(params, key),
            dir: dir.to_path_buf(),
        }
    }

    /// A certificate for `names` (DNS names or IP addresses) signed by
    /// this CA, written as `dir/file-cert.pem` and `dir/file-key.pem`.
    pub fn issue(&self, file: &str, names: &[&str]) -> Issued {
        self.issue_with(file, names, |_| {})
    }

    /// A certificate that expired in 2020.
    pub fn issue_expired(&self, file: &str, names: &[&str]) -> Issued {
        self.issue_with(file, names, |params| {
            params.not_before = rcgen::date_time_ymd(2019, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 1, 1);
        })
    }

    fn issue_with(
        &self,
        file: &str,
        names: &[&str],
        adjust: impl FnOnce(&mut rcgen::CertificateParams),
    ) -> Issued {
        let key = rcgen::KeyPair::generate().expect("key");
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names).expect("params");
        adjust(&mut params);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, file);
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let issued = Issued {
            cert_file: self.dir.join(format!("{file}-cert.pem")),
            key_file: self.dir.join(format!("{file}-key.pem")),
        };
        std::fs::write(&issued.cert_file, cert.pem()).expect("write cert");
        std::fs::write(&issued.key_file, key.serialize_pem()).expect("write key");
        issued
    }
}

pub fn path(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_string()
}
