//! HTTPS from PEM files (spec section 18): `[server] tls_cert` (the certificate chain, leaf
//! first) and `tls_key`. The certificate is looked at again at most once a second, at a
//! handshake, and on `SIGHUP`: a change of either file (time or size) is loaded for the next
//! connections without a restart. A pair that does not load (half written, mismatched) is
//! logged and the one in use kept.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// How often a handshake may look at the files.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// What identifies a version of the files: each one's modification time and length.
type Stamp = [(Option<SystemTime>, u64); 2];

/// The server's certificate, reloaded when its files change.
#[derive(Debug)]
pub struct Certs {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<(Arc<CertifiedKey>, Stamp)>,
    checked: Mutex<Instant>,
}

impl Certs {
    /// Load the pair (refused at start when it does not load).
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<Certs>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let stamp = stamp(cert, key);
        let ck = load(&provider, cert, key)?;
        Ok(Arc::new(Certs {
            cert: cert.to_owned(),
            key: key.to_owned(),
            provider,
            current: RwLock::new((Arc::new(ck), stamp)),
            checked: Mutex::new(Instant::now()),
        }))
    }

    /// A TLS server configuration answering with the current certificate (HTTP/2 and
    /// HTTP/1.1 by ALPN).
    pub fn server_config(self: &Arc<Self>) -> Result<rustls::ServerConfig, String> {
        let mut c = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(c)
    }

    /// Load the files again if they changed since the pair in use was loaded.
    pub fn reload_if_changed(&self) {
        let now = stamp(&self.cert, &self.key);
        let known = self.current.read().unwrap_or_else(|p| p.into_inner()).1;
        if now == known {
            return;
        }
        match load(&self.provider, &self.cert, &self.key) {
            Ok(ck) => {
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = (Arc::new(ck), now);
                tracing::info!(cert = %self.cert.display(), "TLS certificate reloaded");
            }
            Err(e) => {
                // Kept as known, so one broken pair is reported once, not at every handshake.
                self.current.write().unwrap_or_else(|p| p.into_inner()).1 = now;
                tracing::warn!(error = %e, "the TLS certificate files changed but do not load; still serving the previous certificate");
            }
        }
    }

    /// Load the files again whatever their stamps say (`SIGHUP`).
    pub fn reload_now(&self) {
        self.current.write().unwrap_or_else(|p| p.into_inner()).1 = [(None, u64::MAX); 2];
        self.reload_if_changed();
    }

    fn maybe_reload(&self) {
        {
            let mut checked = self.checked.lock().unwrap_or_else(|p| p.into_inner());
            if checked.elapsed() < CHECK_EVERY {
                return;
            }
            *checked = Instant::now();
        }
        self.reload_if_changed();
    }
}

impl ResolvesServerCert for Certs {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.maybe_reload();
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .0
                .clone(),
        )
    }
}

fn stamp(cert: &Path, key: &Path) -> Stamp {
    let one = |p: &Path| match std::fs::metadata(p) {
        Ok(m) => (m.modified().ok(), m.len()),
        Err(_) => (None, 0),
    };
    [one(cert), one(key)]
}

/// The chain and key of the PEM files, checked to belong together. Errors name the file, never
/// its content.
fn load(provider: &CryptoProvider, cert: &Path, key: &Path) -> Result<CertifiedKey, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| format!("tls_cert {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("tls_cert {}: no certificate in it", cert.display()));
    }
    let der =
        PrivateKeyDer::from_pem_file(key).map_err(|e| format!("tls_key {}: {e}", key.display()))?;
    let signing = provider
        .key_provider
        .load_private_key(der)
        .map_err(|e| format!("tls_key {}: {e}", key.display()))?;
    let ck = CertifiedKey::new(chain, signing);
    ck.keys_match().map_err(|e| {
        format!(
            "tls_cert {} and tls_key {} do not belong together: {e}",
            cert.display(),
            key.display()
        )
    })?;
    Ok(ck)
}
