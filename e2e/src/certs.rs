//! Throw-away key material for one control plane: the API server's serving certificate,
//! the service-account signing key, and the client certificate the API server shows
//! kubelets. Generated in-process so the test bed needs no openssl.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// The `kubernetes` Service's address: the first of the test bed's Service range
/// (`--service-cluster-ip-range=10.0.0.0/24`), where pods reach the API server.
pub const KUBERNETES_SERVICE_IP: &str = "10.0.0.1";

/// PEM-encoded key material.
pub(crate) struct Material {
    /// Self-signed serving certificate for `localhost`, `127.0.0.1` and the `kubernetes`
    /// Service (its address and DNS names, which in-cluster clients connect to); clients
    /// trust it directly as their certificate authority.
    pub serving_cert_pem: String,
    /// Its private key.
    pub serving_key_pem: String,
    /// Private key that signs service-account tokens.
    pub sa_key_pem: String,
    /// Its public key, with which the API server verifies those tokens.
    pub sa_pub_pem: String,
    /// The CA kubelets trust client certificates of (`clientCAFile`).
    pub kubelet_client_ca_pem: String,
    /// The API server's client certificate for kubelets (`--kubelet-client-certificate`),
    /// in group `system:masters`, so the kubelet's webhook authorizer allows it.
    pub kubelet_client_cert_pem: String,
    /// Its private key.
    pub kubelet_client_key_pem: String,
}

/// Generating key material failed.
#[derive(Debug, thiserror::Error)]
#[error("failed to generate control-plane key material")]
pub struct Error(#[from] rcgen::Error);

pub(crate) fn generate() -> Result<Material, Error> {
    let served = rcgen::generate_simple_self_signed(vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        KUBERNETES_SERVICE_IP.to_string(),
        "kubernetes".to_string(),
        "kubernetes.default".to_string(),
        "kubernetes.default.svc".to_string(),
        "kubernetes.default.svc.cluster.local".to_string(),
    ])?;
    let sa = KeyPair::generate()?;

    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "tessera test bed kubelet client CA");
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca = Issuer::new(ca_params, ca_key);
    let mut client_params = CertificateParams::new(Vec::<String>::new())?;
    client_params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver-kubelet-client");
    client_params
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    client_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate()?;
    let client_cert = client_params.signed_by(&client_key, &ca)?;

    Ok(Material {
        serving_cert_pem: served.cert.pem(),
        serving_key_pem: served.signing_key.serialize_pem(),
        sa_key_pem: sa.serialize_pem(),
        sa_pub_pem: sa.public_key_pem(),
        kubelet_client_ca_pem: ca_cert.pem(),
        kubelet_client_cert_pem: client_cert.pem(),
        kubelet_client_key_pem: client_key.serialize_pem(),
    })
}
