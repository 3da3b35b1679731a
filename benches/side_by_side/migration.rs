//! The migration rows (issue 31): an idle test guest of 256 MiB, then one of 1 GiB, live-migrated
//! `HOPS` times by the launcher and `HOPS` times by raw libvirt, one TCG guest at a time.
//!
//! - The launcher's side: the guest booted by `vmlauncher run`, then moved by the source's
//!   `Migrate` RPC (timed to its reply) to a new launcher started with `run --incoming`, which
//!   becomes the next hop's source; each source ends its VM's life and exits 0, as in
//!   production. The guest's pause at switch-over is what the target's status says
//!   (`downtimeMs`: libvirt's completed job on the target). The same call is split at the
//!   source's status turning Migrating: what comes before it is the launcher's own preparation
//!   (`PrepareMigrationTarget`: the target launcher starts its private libvirtd and converts the
//!   spec; then the source reads the migratable XML), what comes after it libvirt's migration.
//! - Raw libvirt's side: the same domain (the launcher's own definition of it, read from a
//!   launcher started for that until phase Running, then killed; its paths moved) defined and
//!   started on a private libvirtd the bench starts as a launcher starts its own
//!   (`PrivateDaemon`, the same options, a runtime dir laid out and shared with QEMU's user the
//!   same way, its own host UUID), then moved back and forth between that daemon and a second
//!   one by `virDomainMigrateToURI3` with the launcher's flags, destination XML
//!   (`migratable::for_target`) and memory socket (`<target dir>/qemu/migration.sock`).
//!   Timed: the call alone; the XML it takes is read before. The downtime is libvirt's
//!   completed job on the destination (`virDomainGetJobStats`), where the launcher reads it too.
//!
//! So both sides move the same guest between the same kind of daemon, with the same call. What
//! differs is the launcher's design: its target's libvirtd starts only when a source comes
//! (inside the launcher's timing), where the raw side's daemons run already.
//!
//! Each side's hops run as a block (one guest at a time: the other side's guest is not booted
//! yet); the side that goes first swaps from one guest to the next.
//!
//! The 256 MiB guest is moved once more over TCP, every channel under mutual TLS, as between two
//! machines (over 127.0.0.1): the launchers with `--tls-dir` and targets on `--listen`; the raw
//! daemons with the same TLS listener and QEMU credentials (`DaemonTls`), the call with
//! `VIR_MIGRATE_TLS`, `qemu+tls://` and `tcp://` URIs and the listen address.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use virt::domain::{Domain, MigrateParameters};
use virt::sys;
use vmlauncher::api::tcp::TcpTarget;
use vmlauncher::api::{self, proto};
use vmlauncher::console::ConsoleLog;
use vmlauncher::domain::migratable;
use vmlauncher::host::qemu_user::QemuUser;
use vmlauncher::libvirt::daemon::{DaemonOptions, DaemonTls, PrivateDaemon};
use vmlauncher::libvirt::migrate::{completed_job_of, JobProgress, MIGRATE_FLAGS};
use vmlauncher::migration_tls::MigrationTls;

use crate::common::{self, guest_spec, Client, ConsoleWait, Launched, BOOT_DEADLINE};
use crate::{human, Row, GUEST_DEADLINE};

/// Migrations per side and guest: n of each row.
const HOPS: usize = 5;
const NAME: &str = "bench-mig";
/// The domain's name on every daemon, the launchers' and the raw side's.
const DOMAIN: &str = "default_bench-mig";
/// A TCG guest of 1 GiB on a loaded machine.
const MIGRATION_DEADLINE: Duration = Duration::from_secs(300);
/// How long libvirt may take to have the completed job's statistics on the destination.
const STATS_DEADLINE: Duration = Duration::from_secs(10);

/// The guests, by memory and whether they go over TCP under TLS, and their rows: the whole
/// migration, the launcher's part before libvirt's, the downtime.
const GUESTS: [(u64, bool, [&str; 3]); 3] = [
    (
        256,
        false,
        [
            "live-migrate a 256 MiB idle guest: `Migrate` reply / `virDomainMigrateToURI3`",
            "256 MiB: of which until the source calls libvirt (the target launcher prepared, its libvirtd started) (launcher only)",
            "256 MiB guest paused at switch-over (libvirt's downtime, on the target)",
        ],
    ),
    (
        1024,
        false,
        [
            "live-migrate a 1 GiB idle guest: `Migrate` reply / `virDomainMigrateToURI3`",
            "1 GiB: of which until the source calls libvirt (the target launcher prepared, its libvirtd started) (launcher only)",
            "1 GiB guest paused at switch-over (libvirt's downtime, on the target)",
        ],
    ),
    (
        256,
        true,
        [
            "live-migrate a 256 MiB idle guest over TCP, all under mutual TLS: `Migrate` reply / `virDomainMigrateToURI3`",
            "256 MiB over TLS: of which until the source calls libvirt (launcher only)",
            "256 MiB over TLS: guest paused at switch-over (libvirt's downtime, on the target)",
        ],
    ),
];

/// One migration.
struct Hop {
    took: Duration,
    /// The launcher's: from the call until the source's status said Migrating.
    prepared: Option<Duration>,
    downtime: Duration,
    /// libvirt's completed job on the destination: guest memory bytes, and those sent.
    total: u64,
    sent: u64,
}

/// What the migration rows measured: the rows, and how much each hop moved (for the JSON).
pub struct Migrations {
    pub rows: Vec<Row>,
    pub moved: serde_json::Value,
}

/// The migration rows: for each guest, the launcher's hops and raw libvirt's, the side that
/// goes first swapping from one guest to the next.
pub fn rows(rt: &Runtime, caps: &Path, work: &Path) -> Migrations {
    let (mut rows, mut moved) = (Vec::new(), Vec::new());
    let tls_dir = common::net::migration_credentials(&work.join("migration-tls"));
    for (i, (mib, over_tls, [whole, prepared, downtime])) in GUESTS.into_iter().enumerate() {
        let definition = definition(caps, mib);
        let tls = over_tls.then_some(tls_dir.as_path());
        let how = if over_tls { " over TCP and TLS" } else { "" };
        let (mut launcher, mut raw) = (Vec::new(), Vec::new());
        for launcher_turn in [i % 2 == 0, i % 2 == 1] {
            if launcher_turn {
                eprintln!(
                    "side_by_side: a {mib} MiB guest migrated {HOPS} times{how} by the launcher"
                );
                launcher = launcher_side(rt, caps, mib, tls);
            } else {
                eprintln!(
                    "side_by_side: a {mib} MiB guest migrated {HOPS} times{how} by raw libvirt"
                );
                raw = raw_side(work, caps, mib, &definition, tls);
            }
        }
        let side = |hops: &[Hop], f: fn(&Hop) -> Duration| hops.iter().map(f).collect::<Vec<_>>();
        rows.push(Row {
            what: whole,
            launcher: side(&launcher, |h| h.took),
            raw: Some(side(&raw, |h| h.took)),
        });
        rows.push(Row {
            what: prepared,
            launcher: side(&launcher, |h| h.prepared.expect("the launcher's")),
            raw: None,
        });
        rows.push(Row {
            what: downtime,
            launcher: side(&launcher, |h| h.downtime),
            raw: Some(side(&raw, |h| h.downtime)),
        });
        let bytes = |hops: &[Hop]| {
            hops.iter()
                .map(|h| serde_json::json!({"data_total": h.total, "data_processed": h.sent}))
                .collect::<Vec<_>>()
        };
        moved.push(serde_json::json!({
            "guest_mib": mib,
            "tls": over_tls,
            "launcher": bytes(&launcher),
            "raw": bytes(&raw),
        }));
    }
    Migrations {
        rows,
        moved: moved.into(),
    }
}

/// The test guest with `mib` of memory.
fn spec(mib: u64) -> String {
    let spec = guest_spec(NAME, "", &[])
        .replace("      guest: 256Mi\n", &format!("      guest: {mib}Mi\n"));
    assert!(spec.contains(&format!("guest: {mib}Mi")));
    spec
}

/// Waits until the guest has booted and made its first report: from then on it only polls.
fn wait_idle(console: &mut ConsoleLog) {
    common::wait_booted(console);
    console.line("the guest's first disk report", GUEST_DEADLINE, |l| {
        l.starts_with("VMLTEST-DISKS")
    });
}

fn report(side: &str, hop: usize, h: &Hop) {
    eprintln!(
        "side_by_side: {side} hop {hop}: {}, downtime {}, {} of {} MiB sent",
        human(h.took),
        human(h.downtime),
        h.sent >> 20,
        h.total >> 20
    );
}

/// The domain the launcher defines for the guest of `mib`: a launcher started until phase
/// Running (the domain defined and created), its definition read, then killed.
fn definition(caps: &Path, mib: u64) -> Definition {
    let mut vm = Launched::start(&spec(mib), &["--qemu-cache-dir", caps.to_str().unwrap()]);
    vm.wait_stdout("phase Running", BOOT_DEADLINE);
    let xml = {
        let conn = virt::connect::Connect::open(Some(&vm.libvirt_uri())).unwrap();
        let domain = conn.lookup_domain_by_name(DOMAIN).unwrap();
        domain.xml_desc(sys::VIR_DOMAIN_XML_INACTIVE).unwrap()
    };
    common::cli_ok(&vm.socket(), &["kill"]);
    vm.wait_exit(GUEST_DEADLINE);
    // The launcher boots copies of the kernel and initrd in its private dir, gone with it: raw
    // libvirt boots the test guest's own files, as a raw user would.
    let guest = common::guest_dir();
    let xml = replace_element(&xml, "kernel", &guest.join("vmlinuz"));
    let xml = replace_element(&xml, "initrd", &guest.join("initrd.img"));
    Definition {
        xml,
        dir: vm.dir().to_path_buf(),
    }
}

/// `xml` with the text of its (first) `<name>` element replaced by `path`.
fn replace_element(xml: &str, name: &str, path: &Path) -> String {
    let (open, close) = (format!("<{name}>"), format!("</{name}>"));
    let Some(start) = xml.find(&open) else {
        return xml.to_string();
    };
    let end = start + xml[start..].find(&close).expect("closed element");
    format!("{}{open}{}{}", &xml[..start], path.display(), &xml[end..])
}

/// The launcher's side for a guest of `mib`: booted by `vmlauncher run`, then moved from
/// launcher to launcher (over TCP under TLS with the credentials in `tls`).
fn launcher_side(rt: &Runtime, caps: &Path, mib: u64, tls: Option<&Path>) -> Vec<Hop> {
    let mut args = vec!["--qemu-cache-dir", caps.to_str().unwrap()];
    if let Some(dir) = tls {
        args.extend(["--tls-dir", dir.to_str().unwrap()]);
    }
    let mut here = Launched::start(&spec(mib), &args);
    here.wait_stdout("phase Running", BOOT_DEADLINE);
    wait_idle(&mut here.console());
    let mut hops = Vec::new();
    for hop in 0..HOPS {
        let listen = format!("127.0.0.1:{}", common::net::free_ports(4));
        let mut incoming = args.clone();
        if tls.is_some() {
            incoming.extend(["--listen", &listen]);
        }
        let mut there = Launched::incoming(|_| {}, &incoming);
        there.wait_stdout("waiting for an incoming migration", BOOT_DEADLINE);
        // What the source's `Migrate` names: the target's TCP address, or its socket.
        let target = if tls.is_some() {
            there.wait_stdout(&format!("api tcp:{listen}"), BOOT_DEADLINE);
            TcpTarget::parse(&listen).unwrap().to_string()
        } else {
            there.socket().display().to_string()
        };
        let mut source = Client::new(rt.block_on(api::channel(&here.socket())).unwrap());
        let h = rt.block_on(launcher_hop(&mut source, target, &there.socket()));
        report("launcher", hop, &h);
        hops.push(h);
        drop(source);
        here.wait_stdout("phase Succeeded (Succeeded; Migrated)", MIGRATION_DEADLINE);
        assert_eq!(
            here.wait_exit(GUEST_DEADLINE).code(),
            Some(0),
            "{}",
            here.stderr_text()
        );
        here = there;
    }
    common::cli_ok(&here.socket(), &["kill"]);
    here.wait_exit(GUEST_DEADLINE);
    hops
}

/// The source's `Migrate` to the launcher at `target`, timed to its reply and to the source's
/// status turning Migrating (read on the source's event stream, opened before); then the
/// target's statistics, once its status says the migration ended.
async fn launcher_hop(source: &mut Client, target: String, target_socket: &Path) -> Hop {
    let mut events = source
        .watch_events(proto::WatchEventsRequest {})
        .await
        .unwrap()
        .into_inner();
    // The first message is the whole status as it is.
    events
        .message()
        .await
        .unwrap()
        .expect("the source's resync");
    let request = proto::MigrateRequest {
        target,
        ..Default::default()
    };
    let started = Instant::now();
    let call = source.migrate(request);
    tokio::pin!(call);
    let (mut prepared, mut open) = (None, true);
    let reply = loop {
        tokio::select! {
            reply = &mut call => break reply,
            event = events.message(), if open && prepared.is_none() => match event {
                Ok(Some(e)) => {
                    if migration_of(&e).is_some_and(|m| m.state == "Migrating") {
                        prepared = Some(started.elapsed());
                    }
                }
                _ => open = false,
            },
        }
    };
    let took = started.elapsed();
    let reply = reply
        .unwrap_or_else(|e| panic!("Migrate: {e}"))
        .into_inner();
    let source_side = reply.migration.unwrap_or_default();
    assert_eq!(source_side.state, "Completed", "{source_side:?}");
    let arrived = target_ended(target_socket).await;
    assert_eq!(arrived.state, "Completed", "{arrived:?}");
    // No statistics (the target gave up waiting for them) would read as no downtime.
    assert!(
        arrived.data_total > 0,
        "the target has no statistics of the migration: {arrived:?}"
    );
    Hop {
        took,
        prepared: Some(prepared.expect("the source's status turned Migrating")),
        downtime: Duration::from_millis(arrived.downtime_ms),
        total: arrived.data_total,
        sent: arrived.data_processed,
    }
}

fn migration_of(event: &proto::Event) -> Option<&proto::MigrationStatus> {
    common::event_status(event)?.migration.as_ref()
}

/// The target's migration status once its side ended too (it then has libvirt's statistics):
/// from its event stream, whose first message is the whole status as it is. Read on its unix
/// socket: a target's TCP API closes once its migration ended (security review N-4).
async fn target_ended(socket: &Path) -> proto::MigrationStatus {
    let mut client = api::connect(socket).await.unwrap();
    let mut events = client
        .watch_events(proto::WatchEventsRequest {})
        .await
        .unwrap()
        .into_inner();
    let deadline = tokio::time::Instant::now() + MIGRATION_DEADLINE;
    loop {
        let event = tokio::time::timeout_at(deadline, events.message())
            .await
            .unwrap_or_else(|_| {
                panic!("the target's migration not over within {MIGRATION_DEADLINE:?}")
            })
            .unwrap()
            .expect("the target's event stream stays open");
        if let Some(m) = migration_of(&event)
            .filter(|m| !matches!(m.state.as_str(), "Waiting" | "Preparing" | "Migrating"))
        {
            return m.clone();
        }
    }
}

/// The launcher's definition of the domain, and the runtime dir its paths are under.
struct Definition {
    xml: String,
    dir: PathBuf,
}

/// A private libvirtd of the raw side, in a runtime dir laid out as a launcher's: started as a
/// launcher starts its own (`run::host::prepare`), its private dirs and QEMU's own dir made as
/// a launcher makes them (`host::private_dirs`), QEMU let through the runtime dir.
struct RawHost {
    dir: PathBuf,
    daemon: Option<PrivateDaemon>,
    /// Over TCP under TLS: the first of its four ports, as a launcher's `--listen`.
    tcp_port: Option<u16>,
}

impl RawHost {
    fn start(dir: PathBuf, caps: &Path, qemu: &QemuUser, tls: Option<&MigrationTls>) -> RawHost {
        let owner = vmlauncher::host::NodeOwner {
            uid: qemu.uid,
            gid: qemu.gid,
        };
        vmlauncher::host::private_dirs::prepare_local(&dir, owner).unwrap();
        if !qemu.is_root() {
            vmlauncher::host::acl::grant_search(&dir, qemu.uid).unwrap();
        }
        let tcp_port = tls.map(|_| common::net::free_ports(4));
        // As `run --tls-dir --listen` sets its daemon up.
        let migration_tls = tls.zip(tcp_port).map(|(tls, port)| {
            let owner = vmlauncher::host::NodeOwner {
                uid: qemu.uid,
                gid: qemu.gid,
            };
            Box::new(DaemonTls {
                installed: tls
                    .install(&dir.join("tls"), &dir.join("qemu-tls"), owner)
                    .unwrap(),
                listen: Some(([127, 0, 0, 1], port + 1).into()),
            })
        });
        let daemon = PrivateDaemon::start(
            &dir.join("libvirt"),
            DaemonOptions {
                pod_cgroups: true,
                capability_cache: Some(caps.to_path_buf()),
                qemu_user: qemu.clone(),
                domain_namespace: !vmlauncher::init::is_container_entrypoint(),
                migration_tls,
            },
        )
        .unwrap_or_else(|e| panic!("a private libvirtd: {}", vmlauncher::error_chain(&e)));
        RawHost {
            dir,
            daemon: Some(daemon),
            tcp_port,
        }
    }

    /// How a source's libvirtd reaches this one for a migration, as `Hypervisor::migrate` is
    /// given it: over TLS with the source's client certificate (`from`'s copy), or the socket.
    fn peer_uri(&self, from: &RawHost) -> String {
        match self.tcp_port {
            Some(port) => format!(
                "qemu+tls://127.0.0.1:{}/system?pkipath={}",
                port + 1,
                from.dir.join("tls").display()
            ),
            None => self.uri(),
        }
    }

    fn uri(&self) -> String {
        PrivateDaemon::uri_for(&self.dir.join("libvirt"))
    }

    fn connect(&self) -> virt::connect::Connect {
        virt::connect::Connect::open(Some(&self.uri())).unwrap()
    }

    /// Where this host's QEMU takes a migrating guest's memory, as a launcher's plan says
    /// (`launcher::incoming_plan`).
    fn migration_uri(&self) -> String {
        match self.tcp_port {
            Some(port) => format!("tcp://127.0.0.1:{}", port + 2),
            None => format!("unix://{}", self.dir.join("qemu/migration.sock").display()),
        }
    }
}

impl Drop for RawHost {
    /// A QEMU a failed run left is killed, as `Launched` kills its own; then libvirtd stops.
    fn drop(&mut self) {
        let pids = std::fs::read_dir(self.dir.join("libvirt/run/qemu"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "pid"))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok()?.trim().parse().ok());
        for pid in pids.filter(|p| common::alive(*p)) {
            let _ = common::signal_pid(pid, nix::sys::signal::Signal::SIGKILL);
        }
        self.daemon.take();
    }
}

/// Raw libvirt's side for a guest of `mib`: the launcher's `definition` defined and started on
/// one of two daemons of the bench's own, then moved between them.
fn raw_side(
    work: &Path,
    caps: &Path,
    mib: u64,
    definition: &Definition,
    tls: Option<&Path>,
) -> Vec<Hop> {
    let qemu = QemuUser::resolve(None)
        .unwrap()
        .unwrap_or_else(QemuUser::root);
    let credentials = tls.map(|dir| MigrationTls::read(dir).unwrap());
    let how = if tls.is_some() { "-tls" } else { "" };
    let hosts = ["a", "b"].map(|h| {
        let started = Instant::now();
        let dir = work.join(format!("raw-mig-{mib}{how}-{h}"));
        let host = RawHost::start(dir, caps, &qemu, credentials.as_ref());
        // What a launcher's target spends on its own daemon inside its preparation, untimed
        // here: printed beside the launcher's "of which" row.
        eprintln!(
            "side_by_side: raw daemon {h} started in {}",
            human(started.elapsed())
        );
        host
    });
    {
        let conn = hosts[0].connect();
        let xml = migratable::for_target(&definition.xml, &[(&definition.dir, &hosts[0].dir)]);
        let domain = conn
            .define_domain_xml(&xml)
            .unwrap_or_else(|e| panic!("defineXML: {e}\n{xml}"));
        domain.create().unwrap_or_else(|e| panic!("create: {e}"));
    }
    wait_idle(&mut ConsoleLog::from_start(&hosts[0].dir.join("console.log")).unwrap());
    let mut hops = Vec::new();
    for hop in 0..HOPS {
        let h = raw_hop(&hosts[hop % 2], &hosts[(hop + 1) % 2]);
        report("raw", hop, &h);
        hops.push(h);
    }
    let conn = hosts[HOPS % 2].connect();
    let domain = conn.lookup_domain_by_name(DOMAIN).unwrap();
    domain.destroy().unwrap();
    domain.undefine().unwrap();
    hops
}

/// `virDomainMigrateToURI3` from `from` to `to`, as the launcher calls it, timed alone; then
/// the destination's statistics of it.
fn raw_hop(from: &RawHost, to: &RawHost) -> Hop {
    let source = from.connect();
    let domain = source.lookup_domain_by_name(DOMAIN).unwrap();
    let xml = domain
        .xml_desc(sys::VIR_DOMAIN_XML_MIGRATABLE | sys::VIR_DOMAIN_XML_SECURE)
        .unwrap();
    let copied = migratable::copied_disks(&xml, &from.dir.join("private")).unwrap();
    assert!(copied.is_empty(), "the launcher would copy {copied:?}");
    let tls = to.tcp_port.is_some();
    let params = MigrateParameters {
        dest_xml: Some(migratable::for_target(&xml, &[(&from.dir, &to.dir)])),
        uri: Some(to.migration_uri()),
        listen_address: tls.then(|| "127.0.0.1".into()),
        ..MigrateParameters::default()
    };
    // What the launcher asks of libvirt (`Hypervisor::migrate`): the test guest has no disk in
    // the launcher's private dir, so nothing is copied and `NON_SHARED_INC` is not set.
    let flags = if tls {
        MIGRATE_FLAGS | sys::VIR_MIGRATE_TLS
    } else {
        MIGRATE_FLAGS
    };
    let destination = to.connect();
    let peer = to.peer_uri(from);
    let started = Instant::now();
    domain
        .migrate_to_uri3(Some(&peer), params, flags)
        .unwrap_or_else(|e| panic!("virDomainMigrateToURI3 to {peer}: {e}"));
    let took = started.elapsed();
    let arrived = destination.lookup_domain_by_name(DOMAIN).unwrap();
    let stats = completed_job(&arrived);
    Hop {
        took,
        prepared: None,
        downtime: Duration::from_millis(stats.downtime_ms.unwrap_or_default()),
        total: stats.data_total,
        sent: stats.data_processed,
    }
}

/// The completed migration's statistics on its destination `domain`, read as the launcher
/// reads them (`completed_job_of`). libvirt sends no event when it has them: read again every
/// 20 ms until `STATS_DEADLINE` (the target launcher tries every 50 ms).
fn completed_job(domain: &Domain) -> JobProgress {
    let deadline = Instant::now() + STATS_DEADLINE;
    loop {
        let stats = completed_job_of(domain)
            .unwrap_or_else(|e| panic!("virDomainGetJobStats: {e}"))
            .filter(|s| s.downtime_ms.is_some());
        if let Some(stats) = stats {
            return stats;
        }
        assert!(
            Instant::now() < deadline,
            "no completed job on the destination within {STATS_DEADLINE:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
