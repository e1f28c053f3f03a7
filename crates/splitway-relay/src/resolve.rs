//! Domain-name destinations, resolved on the runtime (hickory-resolver).
//! tokio's `lookup_host` runs getaddrinfo on the blocking pool, which
//! creates a thread per concurrent lookup under load: the per-connection
//! thread creation the split-TCP papers remove. The system's hosts file and
//! `/etc/resolv.conf` are honoured (read once, at the first lookup); NSS
//! modules beyond them (mDNS, LDAP) are not.

use std::net::SocketAddr;
use std::sync::OnceLock;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{ResolveHosts, ResolverConfig};
use hickory_resolver::name_server::TokioConnectionProvider;

use crate::error::ConnError;

fn resolver() -> &'static TokioResolver {
    static RESOLVER: OnceLock<TokioResolver> = OnceLock::new();
    RESOLVER.get_or_init(|| {
        let mut builder = TokioResolver::builder_tokio().unwrap_or_else(|e| {
            // No usable resolv.conf (a bare container): the hosts file
            // still answers, names beyond it fail to resolve.
            tracing::warn!(error = %e, "no system DNS configuration; only the hosts file resolves names");
            TokioResolver::builder_with_config(
                ResolverConfig::new(),
                TokioConnectionProvider::default(),
            )
        });
        builder.options_mut().use_hosts_file = ResolveHosts::Always;
        builder.build()
    })
}

/// The first address of `host`, with `port`.
pub async fn lookup(host: &str, port: u16) -> Result<SocketAddr, ConnError> {
    let failed = |detail: String| ConnError::Resolve {
        host: host.to_owned(),
        detail,
    };
    let ips = resolver()
        .lookup_ip(host)
        .await
        .map_err(|e| failed(e.to_string()))?;
    ips.iter()
        .next()
        .map(|ip| SocketAddr::new(ip.to_canonical(), port))
        .ok_or_else(|| failed("no addresses".into()))
}
