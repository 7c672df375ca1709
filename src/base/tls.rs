//! TLS: the HTTPS listener's certificate (reloadable without a restart: new handshakes get the
//! new certificate, open connections keep theirs) and CA bundles for verifying upstreams.

use arc_swap::ArcSwap;
use pingora_core::utils::tls::WrappedX509;
use pingora_rustls::sign::CertifiedKey;
use pingora_rustls::{ClientHello, CryptoProvider, ResolvesServerCert};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The listener's certificate and key, swapped whole on reload.
pub struct ReloadableCert {
    cert: PathBuf,
    key: PathBuf,
    current: ArcSwap<CertifiedKey>,
}

impl std::fmt::Debug for ReloadableCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadableCert").field("cert", &self.cert).field("key", &self.key).finish()
    }
}

/// Read a PEM certificate chain and private key into a signing key; the message names the file.
fn load(cert: &Path, key: &Path) -> Result<CertifiedKey, String> {
    pingora_rustls::install_default_crypto_provider();
    let (cert_s, key_s) = (cert.to_string_lossy(), key.to_string_lossy());
    let (chain, private) = match pingora_rustls::load_certs_and_key_files(&cert_s, &key_s) {
        Ok(Some(pair)) => pair,
        Ok(None) => return Err(format!("tls: no certificate in {cert_s} or no private key in {key_s}")),
        Err(e) => return Err(format!("tls: cannot read {cert_s} / {key_s}: {e}")),
    };
    if chain.is_empty() {
        return Err(format!("tls.cert: {cert_s} holds no certificate"));
    }
    let provider = CryptoProvider::get_default().ok_or("tls: no crypto provider installed")?;
    let signing =
        provider.key_provider.load_private_key(private).map_err(|e| format!("tls.key: {key_s} is not a usable private key: {e}"))?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| format!("tls: the key in {key_s} does not belong to the certificate in {cert_s}: {e}"))?;
    Ok(certified)
}

impl ReloadableCert {
    pub fn load(cert: &Path, key: &Path) -> Result<Self, String> {
        let current = load(cert, key)?;
        Ok(ReloadableCert { cert: cert.to_path_buf(), key: key.to_path_buf(), current: ArcSwap::from_pointee(current) })
    }

    /// Re-read the files; on any error the certificate in use stays.
    pub fn reload(&self) -> Result<(), String> {
        let fresh = load(&self.cert, &self.key)?;
        self.current.store(Arc::new(fresh));
        Ok(())
    }
}

impl ResolvesServerCert for ReloadableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// The DER certificates of PEM text (`what` names it in errors), each checked to parse.
pub fn pem_certificates(text: &str, what: &str) -> Result<Vec<Vec<u8>>, String> {
    use base64::Engine;
    let mut certs = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN CERTIFICATE-----") {
        let body = &rest[start + "-----BEGIN CERTIFICATE-----".len()..];
        let end = body.find("-----END CERTIFICATE-----").ok_or_else(|| format!("{what}: unterminated certificate"))?;
        let b64: String = body[..end].chars().filter(|c| !c.is_whitespace()).collect();
        let der = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|e| format!("{what}: bad certificate encoding: {e}"))?;
        // Check it parses before handing it to Pingora's parser (which panics on bad input).
        pingora_rustls::RootCertStore::empty()
            .add(pingora_rustls::CertificateDer::from(der.clone()))
            .map_err(|e| format!("{what}: not a CA certificate: {e}"))?;
        certs.push(der);
        rest = &body[end..];
    }
    if certs.is_empty() {
        return Err(format!("{what}: no PEM certificate found"));
    }
    Ok(certs)
}

/// The CA certificates of a PEM bundle, as Pingora's per-peer CA list.
pub fn load_ca_bundle(path: &Path) -> Result<Arc<[WrappedX509]>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let certs = pem_certificates(&text, &path.display().to_string())?;
    Ok(certs.into_iter().map(|der| WrappedX509::new(der, pingora_core::utils::tls::parse_x509)).collect::<Vec<_>>().into())
}
