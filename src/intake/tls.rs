//! The intake's TLS (`[intake.tls]`): a certificate chain and its key from PEM files, served
//! with rustls on the aws-lc-rs provider (the one dedupd's other TLS clients use).

use std::path::Path;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The server's TLS settings from `cert_file` (the chain, leaf first) and `key_file`; the
/// error names which file and why.
pub fn server_config(cert_file: &Path, key_file: &Path) -> Result<Arc<ServerConfig>, String> {
    let chain = CertificateDer::pem_file_iter(cert_file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read a certificate chain from {}: {e}", cert_file.display()))?;
    if chain.is_empty() {
        return Err(format!("{} holds no certificate", cert_file.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| format!("cannot read a private key from {}: {e}", key_file.display()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("the key in {} does not fit the certificate: {e}", key_file.display()))?;
    Ok(Arc::new(config))
}
