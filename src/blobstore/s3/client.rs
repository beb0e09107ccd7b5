//! The AWS SDK client: credentials registered for redaction, the HTTP client of a CA
//! bundle or fixed addresses (`s3.resolve`).

use super::*;

/// A credentials provider that registers what it provides with [`crate::redact`].
pub(super) struct RegisteringCredentials(pub(super) aws_sdk_s3::config::SharedCredentialsProvider);

impl fmt::Debug for RegisteringCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RegisteringCredentials(..)")
    }
}

impl aws_sdk_s3::config::ProvideCredentials for RegisteringCredentials {
    fn provide_credentials<'a>(
        &'a self,
    ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        aws_credential_types::provider::future::ProvideCredentials::new(async move {
            let c = self.0.provide_credentials().await?;
            crate::redact::register(c.access_key_id());
            crate::redact::register(c.secret_access_key());
            if let Some(t) = c.session_token() {
                crate::redact::register(t);
            }
            Ok(c)
        })
    }
}

/// How many certificates a PEM bundle holds, each parsed as the TLS layer will parse it (PEM,
/// then DER into a root store); an error when one does not parse or there is none. The TLS
/// layer itself would panic on a bad one at the first connection, or — with none — trust
/// nothing, so that every connection failed as "unknown issuer", far from the cause.
pub(super) fn pem_certificates(pem: &[u8]) -> std::result::Result<usize, String> {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::CertificateDer;
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| format!("not PEM: {e}"))?;
    if certs.is_empty() {
        return Err("no -----BEGIN CERTIFICATE----- block".into());
    }
    let mut roots = rustls::RootCertStore::empty();
    for (i, cert) in certs.iter().enumerate() {
        roots
            .add(cert.clone())
            .map_err(|e| format!("certificate {}: {e}", i + 1))?;
    }
    Ok(certs.len())
}

/// The HTTP client when a setting needs one of our own (a CA bundle, fixed addresses);
/// `None`: the SDK's default.
pub(super) fn http_client(
    config: &S3Config,
) -> Result<Option<aws_smithy_runtime_api::client::http::SharedHttpClient>> {
    use aws_smithy_http_client::tls;
    if config.ca_bundle.is_none() && config.resolve.is_empty() {
        return Ok(None);
    }
    let mut trust = tls::TrustStore::default();
    if let Some(path) = &config.ca_bundle {
        let pem = std::fs::read(path)
            .map_err(|e| Error::io(format!("read CA bundle {}", path.display()), e))?;
        let certs = pem_certificates(&pem).map_err(|why| {
            Error::invalid(format!(
                "CA bundle {} is not a PEM bundle of certificates: {why}",
                path.display()
            ))
        })?;
        tracing::debug!(bundle = %path.display(), certs, "CA bundle read");
        trust = trust.with_pem_certificate(pem);
    }
    let ctx = tls::TlsContext::builder()
        .with_trust_store(trust)
        .build()
        .map_err(|e| {
            let what = match &config.ca_bundle {
                Some(p) => format!("CA bundle {} is not usable", p.display()),
                None => "the system's TLS roots are not usable".to_owned(),
            };
            Error::invalid(what).with_source(e)
        })?;
    let builder = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::AwsLc,
        ))
        .tls_context(ctx);
    Ok(Some(if config.resolve.is_empty() {
        builder.build_https()
    } else {
        builder.build_with_resolver(FixedAddresses::new(&config.resolve))
    }))
}

/// The DNS resolver of [`S3Config::resolve`]: listed names at their fixed address, the rest
/// through the system's resolver.
#[derive(Clone, Debug)]
pub(super) struct FixedAddresses {
    /// Exact names.
    exact: BTreeMap<String, IpAddr>,
    /// `*.parent` entries, by `parent`.
    wildcards: BTreeMap<String, IpAddr>,
}

impl FixedAddresses {
    /// The resolver of `resolve` (names as [`S3Config::resolve`] takes them).
    pub(super) fn new(resolve: &BTreeMap<String, IpAddr>) -> Self {
        let (mut exact, mut wildcards) = (BTreeMap::new(), BTreeMap::new());
        for (name, ip) in resolve {
            match name.strip_prefix("*.") {
                Some(parent) => wildcards.insert(parent.to_owned(), *ip),
                None => exact.insert(name.clone(), *ip),
            };
        }
        FixedAddresses { exact, wildcards }
    }

    pub(super) fn lookup(&self, name: &str) -> Option<IpAddr> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(ip) = self.exact.get(&name) {
            return Some(*ip);
        }
        // The nearest wildcard: for a.b.c, `*.b.c` before `*.c`.
        let mut rest = name.as_str();
        while let Some((_, parent)) = rest.split_once('.') {
            if let Some(ip) = self.wildcards.get(parent) {
                return Some(*ip);
            }
            rest = parent;
        }
        None
    }
}

impl aws_smithy_runtime_api::client::dns::ResolveDns for FixedAddresses {
    fn resolve_dns<'a>(
        &'a self,
        name: &'a str,
    ) -> aws_smithy_runtime_api::client::dns::DnsFuture<'a> {
        use aws_smithy_runtime_api::client::dns::{DnsFuture, ResolveDnsError};
        if let Some(ip) = self.lookup(name) {
            tracing::trace!(name, %ip, "s3.resolve");
            return DnsFuture::ready(Ok(vec![ip]));
        }
        DnsFuture::new(async move {
            tokio::net::lookup_host((name, 0))
                .await
                .map(|addrs| addrs.map(|a| a.ip()).collect())
                .map_err(ResolveDnsError::new)
        })
    }
}
