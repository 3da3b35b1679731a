//! `vmlauncher run --incoming`: a launcher with no VM, waiting for one to come by live migration.
//! It serves its API at once (status: phase Scheduled, migration Waiting); a source launcher's
//! `PrepareMigrationTarget` brings the spec, and from then on it is a launcher like any other,
//! whose guest arrives instead of booting.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::{follow, say, LaunchBase, RunError, RunOptions, RuntimeDir, Served, StopSignals};
use crate::api;
use crate::ended::Ended;
use crate::launcher::{self, IncomingOffer, IncomingPlan, Launcher, LauncherError};
use crate::libvirt::events::HypervisorEvent;
use crate::libvirt::Connector;
use crate::spec::Validated;
use crate::volumes::HostPaths;

pub(super) struct Target<'a> {
    pub opts: &'a RunOptions,
    pub rt: &'a RuntimeDir,
    pub paths: &'a HostPaths,
    pub connector: &'a Arc<Connector>,
    pub base: &'a LaunchBase,
    pub socket: &'a Path,
    pub qemu_uid: u32,
    /// Where QEMU listens for a source on this host (`None` with `--listen`).
    pub sockets: Option<&'a crate::host::private_dirs::MigrationSockets>,
}

impl Target<'_> {
    pub(crate) async fn run(
        self,
        events: mpsc::UnboundedReceiver<HypervisorEvent>,
        started: Instant,
        signals: &mut StopSignals,
    ) -> Result<Ended, RunError> {
        let uri = self.connector.uri();
        // The private libvirtd now, not when a source comes: its start would otherwise be on
        // every migration's path (0.2–0.3 s, the bench's rows), and a target that cannot start
        // one says so before anyone relies on it.
        let c = self.connector.clone();
        tokio::task::spawn_blocking(move || c.ensure_daemons())
            .await
            .map_err(RunError::Panicked)?
            .map_err(RunError::Daemons)?;
        let (front, mut offers) = api::Front::incoming(&uri);
        let api = self.serve(&front).await?;
        say(format_args!("libvirt {uri}"));
        say(format_args!("waiting for an incoming migration"));
        say(format_args!("api unix:{}", self.socket.display()));
        if let Some(listen) = self.opts.listen {
            say(format_args!("api tcp:{listen} (mutual TLS)"));
        }
        let mut events = Some(events);
        // A predecessor on this dir took a migration whose domain libvirt still has (killed
        // while the guest came in, or after): go on with the offer it took.
        let mut resumed = self.left_by_predecessor().await;
        let launcher = loop {
            if let Some(offer) = resumed.take() {
                say(format_args!(
                    "going on with the migration a predecessor took"
                ));
                match self.resume(&offer, &mut events).await {
                    Ok(launcher) => {
                        front.set(launcher.clone());
                        break launcher;
                    }
                    Err(e) => {
                        self.stop_daemon().await;
                        api.stop(self.socket).await;
                        return Err(RunError::Resumed(e));
                    }
                }
            }
            let (offer, reply) = tokio::select! {
                offer = offers.recv() => match offer {
                    Some(offer) => offer,
                    None => return Err(RunError::NoOffers),
                },
                which = signals.recv() => {
                    say(format_args!("{which}: no migration came; stopping"));
                    self.stop_daemon().await;
                    api.stop(self.socket).await;
                    return Ok(Ended::Done);
                }
            };
            let (spec, options) = match self.check(&offer) {
                Ok(checked) => checked,
                Err(e) => {
                    say(format_args!(
                        "refused a migration: {}",
                        crate::error_chain(&e)
                    ));
                    let _ = reply.send(Err(api::to_status(&e)));
                    continue;
                }
            };
            let events = events
                .take()
                .expect("taken once: a failed start ends the run");
            match Launcher::start(self.connector.clone(), spec, options, events).await {
                Ok((launcher, _)) => {
                    let mut plan = self.plan();
                    plan.pins = launcher.incoming_pins();
                    let _ = reply.send(Ok(plan));
                    front.set(launcher.clone());
                    break launcher;
                }
                Err(e) => {
                    let _ = reply.send(Err(api::to_status(&e)));
                    self.stop_daemon().await;
                    api.stop(self.socket).await;
                    return Err(RunError::Incoming(e));
                }
            }
        };
        say(format_args!(
            "prepared for the incoming migration of domain {}",
            launcher.domain_name()
        ));
        self.follow_prepared(&front, &launcher, api, started, signals)
            .await
    }

    /// Follows the launcher prepared for the guest, as `run` follows its own, until the VM is
    /// final or the launcher is told to stop; then shuts it and the API down.
    async fn follow_prepared(
        &self,
        front: &Arc<api::Front>,
        launcher: &Arc<Launcher>,
        api: Served,
        started: Instant,
        signals: &mut StopSignals,
    ) -> Result<Ended, RunError> {
        let closing = self.opts.listen.is_some().then(|| {
            tokio::spawn(close_tls_listener(
                front.clone(),
                launcher.clone(),
                self.connector.clone(),
            ))
        });
        let ended = follow(launcher, started, signals).await;
        launcher.shut_down().await;
        if let Some(closing) = closing {
            closing.abort();
        }
        api.stop(self.socket).await;
        ended
    }

    /// Serves the API on its unix socket, and with `--listen` on TCP; when it cannot, stops the
    /// private libvirtd.
    async fn serve(&self, front: &Arc<api::Front>) -> Result<Served, RunError> {
        let listener = match api::bind(self.socket) {
            Ok(l) => l,
            Err(e) => {
                self.stop_daemon().await;
                return Err(RunError::Socket(e));
            }
        };
        let mut api = Served::start(front.clone(), listener, self.qemu_uid);
        if let Err(e) = self.serve_tcp(front, &mut api).await {
            self.stop_daemon().await;
            api.stop(self.socket).await;
            return Err(RunError::Socket(e));
        }
        Ok(api)
    }

    /// Starts the launcher for the offer a predecessor took, checked as a new one would be.
    async fn resume(
        &self,
        offer: &IncomingOffer,
        events: &mut Option<mpsc::UnboundedReceiver<HypervisorEvent>>,
    ) -> Result<Arc<Launcher>, LauncherError> {
        let (spec, options) = self.check(offer)?;
        let events = events.take().expect("the first start");
        let (launcher, _) = Launcher::start(self.connector.clone(), spec, options, events).await?;
        Ok(launcher)
    }

    /// The source's spec, checked as a start would check it, and the same as this launcher's
    /// own when it was given one; the launch options for it.
    fn check(
        &self,
        offer: &IncomingOffer,
    ) -> Result<(Validated, launcher::LaunchOptions), LauncherError> {
        let spec = crate::spec::parse(&offer.input.spec)?;
        if let Some(own) = &self.opts.spec {
            if own != &spec {
                return Err(launcher::TargetError::OtherSpec.into());
            }
        }
        let strategy = match &self.opts.spec {
            Some(_) => self.opts.strategy,
            None => spec.run_strategy.unwrap_or(self.opts.strategy),
        };
        let mut options = self
            .base
            .for_spec(&spec, offer.input.spec.clone(), strategy);
        options.incoming = true;
        options.block_devices = offer.input.block_devices.clone();
        options.host_paths.check(&spec)?;
        let name = crate::convert::convert(&spec, &options.convert)?.name;
        if name != offer.domain_name {
            return Err(LauncherError::WrongInstance {
                running: name,
                requested: offer.domain_name.clone(),
            });
        }
        Ok((spec, options))
    }

    async fn left_by_predecessor(&self) -> Option<IncomingOffer> {
        let input = launcher::saved_sync(self.base.last_sync())?;
        let spec = crate::spec::parse(&input.spec).ok()?;
        let options = self
            .base
            .for_spec(&spec, input.spec.clone(), self.opts.strategy);
        let name = crate::convert::convert(&spec, &options.convert).ok()?.name;
        let (c, n) = (self.connector.clone(), name.clone());
        let here = tokio::task::spawn_blocking(move || c.connect().ok()?.exists(&n).ok())
            .await
            .ok()
            .flatten()?;
        here.then(|| IncomingOffer {
            input,
            domain_name: name,
            source_runtime_dir: Default::default(),
            source_hotplug_dir: Default::default(),
        })
    }

    /// With `--listen`: the API on its TCP port too, for a source on another machine.
    async fn serve_tcp(
        &self,
        front: &Arc<api::Front>,
        api: &mut Served,
    ) -> Result<(), api::ApiError> {
        let (Some(listen), Some(tls)) = (self.opts.listen, self.base.migration_tls()) else {
            return Ok(());
        };
        let listener = api::tcp::bind(listen).await?;
        api.also_tcp(
            front.clone(),
            listener,
            tls.credentials.clone(),
            migration_over(front.clone()),
        );
        Ok(())
    }

    fn plan(&self) -> IncomingPlan {
        match self.opts.listen {
            Some(listen) => launcher::incoming_plan_tcp(
                listen,
                self.rt.0.clone(),
                self.paths.hotplug_dir.clone(),
            ),
            None => launcher::incoming_plan(
                self.connector.uri(),
                self.rt.0.clone(),
                self.sockets.map_or(&self.paths.qemu_dir, |s| s.path()),
                self.paths.hotplug_dir.clone(),
            ),
        }
    }

    async fn stop_daemon(&self) {
        let c = self.connector.clone();
        let _ = tokio::task::spawn_blocking(move || c.stop_daemon()).await;
    }
}

/// Resolves once the launcher `front` is given has taken a migration and it ended, either way.
async fn migration_over(front: Arc<api::Front>) {
    let launcher = front.wait().await;
    let mut status = launcher.subscribe();
    let _ = status
        .wait_for(|s| s.migration.as_ref().is_some_and(|m| m.state.is_over()))
        .await;
}

/// The longest a target waits, once the migration is over, for the source's libvirtd to leave
/// its TLS listener before it closes it. libvirt's peer-to-peer protocol ends with the source's
/// Finish call to this libvirtd, then its Confirm at home, then its disconnect: a libvirtd
/// killed under a Finish whose answer has not reached the source makes the source take the
/// migration for failed and resume its guest, which runs here already. So a client that stays
/// keeps the listener open; only a holder of a launcher's certificate can be one.
const SOURCE_LEAVES: Duration = Duration::from_secs(60);

/// With `--listen`: once the incoming migration is over, either way, and no client that went
/// through the TLS handshake is left on libvirtd's TLS port (the source's libvirtd has gone),
/// libvirtd is started again without that listener (security review N-4). Clients still in
/// their handshake, anyone who reached the port, do not hold it open.
async fn close_tls_listener(
    front: Arc<api::Front>,
    launcher: Arc<Launcher>,
    connector: Arc<Connector>,
) {
    migration_over(front).await;
    let give_up = Instant::now() + SOURCE_LEAVES;
    let mut delay = Duration::from_millis(20);
    loop {
        let c = connector.clone();
        let clients = tokio::task::spawn_blocking(move || c.tls_clients()).await;
        match clients {
            Ok(Ok(clients)) if clients.authenticated == 0 => {
                tracing::info!(
                    ?clients,
                    "no client with a certificate left on libvirtd's TLS listener"
                );
                break;
            }
            Ok(Ok(clients)) => {
                tracing::debug!(?clients, "libvirtd's TLS listener still has clients")
            }
            // Unknown is not gone: asked again until the deadline.
            Ok(Err(e)) => {
                tracing::warn!(error = %crate::error_chain(&e), "cannot list libvirtd's clients")
            }
            Err(e) => tracing::warn!(error = %e, "listing libvirtd's clients panicked"),
        }
        if Instant::now() >= give_up {
            say(format_args!(
                "libvirt tls: stays open, a client with a launcher's certificate is still connected {SOURCE_LEAVES:?} after the incoming migration ended"
            ));
            return;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(500));
    }
    match launcher.close_tls_listener().await {
        Ok(true) => say(format_args!(
            "libvirt tls: closed, the incoming migration ended"
        )),
        Ok(false) => {}
        Err(e) => say(format_args!(
            "libvirt tls: cannot close: {}",
            crate::error_chain(&e)
        )),
    }
}
