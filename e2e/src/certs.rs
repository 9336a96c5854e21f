//! Throw-away key material for one control plane: the API server's serving certificate and
//! the service-account signing key. Generated in-process so the test bed needs no openssl.

/// PEM-encoded key material.
pub(crate) struct Material {
    /// Self-signed serving certificate for `localhost` and `127.0.0.1`; clients trust it
    /// directly as their certificate authority.
    pub serving_cert_pem: String,
    /// Its private key.
    pub serving_key_pem: String,
    /// Private key that signs service-account tokens.
    pub sa_key_pem: String,
    /// Its public key, with which the API server verifies those tokens.
    pub sa_pub_pem: String,
}

/// Generating key material failed.
#[derive(Debug, thiserror::Error)]
#[error("failed to generate control-plane key material")]
pub struct Error(#[from] rcgen::Error);

pub(crate) fn generate() -> Result<Material, Error> {
    let served =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
    let sa = rcgen::KeyPair::generate()?;
    Ok(Material {
        serving_cert_pem: served.cert.pem(),
        serving_key_pem: served.signing_key.serialize_pem(),
        sa_key_pem: sa.serialize_pem(),
        sa_pub_pem: sa.public_key_pem(),
    })
}
