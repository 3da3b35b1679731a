//! The launcher's API over TCP, for a migration between machines: a target (`run --incoming
//! --listen ADDR:PORT`) serves it under mutual TLS with the credentials of `--tls-dir`
//! (`crate::migration_tls`), and a source, or `vmlauncher migrate`, connects with its client
//! certificate. Only a peer holding a certificate from the same CA is served; the target's
//! certificate must name the host the source dials.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{
    Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig,
};

use super::proto::launcher_client::LauncherClient;
use super::{services, ApiError, Front};
use crate::migration_tls::MigrationTls;

/// Binds `addr` for [`serve`]: a port already taken is the owner's error, said before anything
/// waits on it.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ApiError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ApiError::ListenTcp { addr, source })
}

/// Serves the launcher's API on `listener` under mutual TLS until `shutdown` resolves.
pub async fn serve(
    front: Arc<Front>,
    listener: TcpListener,
    tls: &MigrationTls,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ApiError> {
    let config = ServerTlsConfig::new()
        .identity(Identity::from_pem(&tls.server_cert, &tls.server_key))
        // A client certificate is required and checked against the CA.
        .client_ca_root(Certificate::from_pem(&tls.ca_cert));
    let builder = Server::builder()
        .tls_config(config)
        .map_err(ApiError::Tls)?;
    services(builder, front)
        .await
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
        .map_err(ApiError::Serve)
}

/// A launcher's API over TCP as a source or `vmlauncher migrate` names it: `HOST:PORT`, the host
/// a DNS name, an IPv4 address or a bracketed IPv6 one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpTarget {
    /// As given, brackets and all: what the URIs to the target are made of.
    pub host: String,
    pub port: u16,
}

impl TcpTarget {
    /// `None` for anything that is not `HOST:PORT`, a socket path among them (a TCP target
    /// never has a `/`).
    pub fn parse(target: &str) -> Option<TcpTarget> {
        if target.contains('/') {
            return None;
        }
        let (host, port) = target.rsplit_once(':')?;
        let port = port.parse().ok()?;
        let bracketed = host.starts_with('[') && host.ends_with(']');
        let bare = Self::unbracketed(host);
        let valid = !bare.is_empty() && (bracketed || !bare.contains(':'));
        valid.then(|| TcpTarget {
            host: host.into(),
            port,
        })
    }

    /// The host as a certificate names it (no brackets).
    pub fn name(&self) -> &str {
        Self::unbracketed(&self.host)
    }

    fn unbracketed(host: &str) -> &str {
        host.trim_start_matches('[').trim_end_matches(']')
    }
}

impl std::fmt::Display for TcpTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// A client for the launcher serving at `target` ([`serve`]), presenting this launcher's
/// client certificate and checking the server's against the CA and the target's host.
pub async fn connect(
    target: &TcpTarget,
    tls: &MigrationTls,
) -> Result<LauncherClient<Channel>, ApiError> {
    let connect_err = |source| ApiError::ConnectTcp {
        addr: target.to_string(),
        source,
    };
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&tls.ca_cert))
        .identity(Identity::from_pem(&tls.client_cert, &tls.client_key))
        .domain_name(target.name());
    let channel = Endpoint::from_shared(format!("https://{target}"))
        .map_err(connect_err)?
        .tls_config(config)
        .map_err(ApiError::Tls)?
        .connect()
        .await
        .map_err(connect_err)?;
    Ok(LauncherClient::new(channel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tcp_target_is_host_and_port_and_never_a_path() {
        let parsed = |t: &str| TcpTarget::parse(t).map(|t| (t.name().to_owned(), t.port));
        assert_eq!(parsed("10.0.0.7:7100"), Some(("10.0.0.7".into(), 7100)));
        assert_eq!(
            parsed("node-2.example:7100"),
            Some(("node-2.example".into(), 7100))
        );
        assert_eq!(parsed("[fd00::7]:7100"), Some(("fd00::7".into(), 7100)));
        assert_eq!(
            TcpTarget::parse("[fd00::7]:7100").unwrap().to_string(),
            "[fd00::7]:7100"
        );
        for not_tcp in [
            "/run/vmlauncher/b/launcher.sock",
            "./a:1",
            "target.sock",
            "host:port",
            ":7100",
            "fd00::7:7100",
            "host:70000",
        ] {
            assert_eq!(TcpTarget::parse(not_tcp), None, "{not_tcp}");
        }
    }
}
