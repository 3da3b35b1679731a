//! The launcher's API over TCP, for a migration between machines: a target (`run --incoming
//! --listen ADDR:PORT`) serves it under mutual TLS with the launchers' credentials of
//! `--tls-dir` (`crate::migration_tls`), and a source, or `vmlauncher migrate`, connects with its
//! client certificate. Only a peer holding a certificate from the launchers' CA is served (not
//! QEMU's, whose user can read its key), and only what a migration needs: the source's
//! `PrepareMigrationTarget` and following the target (`GetStatus`, `WatchEvents`). The unix
//! socket serves the rest. The target's certificate must name the host the source dials.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::transport::{
    Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig,
};

use super::proto::launcher_client::LauncherClient;
use super::tcp_limits::{self, Limits};
use super::{services, ApiError, Front};
use crate::migration_tls::{Credentials, MigrationTls, TlsError};

/// The calls served over TCP: a source preparing its target, and following it.
const SERVED: [&str; 3] = [
    "/vmlauncher.v1.Launcher/PrepareMigrationTarget",
    "/vmlauncher.v1.Launcher/GetStatus",
    "/vmlauncher.v1.Launcher/WatchEvents",
];

/// A peer that has not finished its TLS handshake by then is dropped: a port anyone may reach
/// must not collect half-open connections.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds `addr` for [`serve`]: a port already taken is the owner's error, said before anything
/// waits on it.
pub(crate) async fn bind(addr: SocketAddr) -> Result<TcpListener, ApiError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ApiError::ListenTcp { addr, source })
}

/// Serves the launcher's API on `listener` under mutual TLS until `shutdown` resolves, within
/// the connection limits of `tcp_limits`; the listener is closed then.
pub(crate) async fn serve(
    front: Arc<Front>,
    listener: TcpListener,
    tls: &MigrationTls,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ApiError> {
    let builder = Server::builder()
        .tls_config(server_config(&tls.launcher))
        .map_err(ApiError::Tls)?
        .layer(tower::layer::layer_fn(MigrationOnly));
    let limits = Limits::new(tcp_limits::PER_PEER, tcp_limits::TOTAL);
    services(builder, front)
        .await
        .serve_with_incoming_shutdown(tcp_limits::incoming(listener, limits), shutdown)
        .await
        .map_err(ApiError::Serve)
}

/// The server's side: its certificate, and a client certificate required and checked against
/// the CA.
fn server_config(tls: &Credentials) -> ServerTlsConfig {
    ServerTlsConfig::new()
        .identity(Identity::from_pem(&tls.server_cert, &tls.server_key))
        .client_ca_root(Certificate::from_pem(&tls.ca_cert))
        .timeout(HANDSHAKE_TIMEOUT)
}

/// The client's side: its certificate, and the server's checked against the CA and `name`.
fn client_config(tls: &Credentials, name: &str) -> ClientTlsConfig {
    ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&tls.ca_cert))
        .identity(Identity::from_pem(&tls.client_cert, &tls.client_key))
        .domain_name(name)
}

/// Whether both sets of `--tls-dir` make working TLS configurations (each key parses and goes
/// with its certificate): said at start, not at the first migration.
pub(crate) fn check_usable(tls: &MigrationTls, dir: &std::path::Path) -> Result<(), TlsError> {
    for (which, set) in [("launchers'", &tls.launcher), ("QEMU's", &tls.qemu)] {
        let unusable = |e: tonic::transport::Error| TlsError::Unusable {
            dir: dir.into(),
            which,
            reason: crate::error_chain(&e),
        };
        Server::builder()
            .tls_config(server_config(set))
            .map_err(unusable)?;
        Endpoint::from_static("https://localhost")
            .tls_config(client_config(set, "localhost"))
            .map_err(unusable)?;
    }
    Ok(())
}

/// Answers only the calls of [`SERVED`]; any other is refused (`PermissionDenied`) unanswered.
#[derive(Debug, Clone)]
struct MigrationOnly<S>(S);

impl<S, B> tower::Service<http::Request<B>> for MigrationOnly<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if SERVED.contains(&request.uri().path()) {
            return Box::pin(self.0.call(request));
        }
        let refused = tonic::Status::permission_denied(
            "over TCP a launcher serves a migration's calls only; the rest on its unix socket",
        );
        Box::pin(std::future::ready(Ok(refused.into_http())))
    }
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
        // An IP address (IPv6 in brackets) or a DNS name: nothing that could mean more in the
        // URIs made of it.
        let valid = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
            None => {
                host.parse::<std::net::Ipv4Addr>().is_ok()
                    || (!host.is_empty()
                        && host.len() <= 253
                        && host.split('.').all(|label| {
                            !label.is_empty()
                                && label.len() <= 63
                                && !label.starts_with('-')
                                && label
                                    .bytes()
                                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                        }))
            }
        };
        valid.then(|| TcpTarget {
            host: host.into(),
            port,
        })
    }

    /// The host as a certificate names it (no brackets).
    pub(crate) fn name(&self) -> &str {
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

/// A client for the launcher serving at `target` (`serve`), presenting this launcher's
/// client certificate and checking the server's against the CA and the target's host.
pub async fn connect(
    target: &TcpTarget,
    tls: &MigrationTls,
) -> Result<LauncherClient<Channel>, ApiError> {
    let connect_err = |source| ApiError::ConnectTcp {
        addr: target.to_string(),
        source,
    };
    let config = client_config(&tls.launcher, target.name());
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
            "[[::1]]:7100",
            "[node]:7100",
            "a?b:7100",
            "a&no_verify=1:7100",
            "-x.example:7100",
            "a b:7100",
        ] {
            assert_eq!(TcpTarget::parse(not_tcp), None, "{not_tcp}");
        }
    }
}
