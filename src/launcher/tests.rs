//! The launcher's own bookkeeping (tasks, events), driven against libvirt's `test:///default`
//! driver: a real libvirt connection whose domains run nothing, so these run in milliseconds and
//! need no guest. What a guest must show is proven by the e2e tests.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::tasks::Work;
use super::*;
use crate::domain::{Bus, DiskDef};
use crate::host::cgroup::{CgroupMount, CgroupRoots};
use crate::host::devnode::NodeOwner;
use crate::libvirt::events::lifecycle_event;
use crate::lifecycle::RunStrategy;

/// A launcher of a running domain on the test driver, the sending end of its event channel (as
/// libvirt's callbacks use it), and its runtime dir.
pub(super) struct TestLauncher {
    pub launcher: Arc<Launcher>,
    pub events: mpsc::UnboundedSender<HypervisorEvent>,
    pub dir: tempfile::TempDir,
}

impl Drop for TestLauncher {
    fn drop(&mut self) {
        // The test driver's state is shared by the whole process: leave no domain behind.
        if let Ok(hv) = self.launcher.hypervisor() {
            let _ = hv.destroy(&self.launcher.domain_name);
            let _ = hv.undefine(&self.launcher.domain_name, crate::libvirt::Nvram::Keep);
        }
    }
}

/// `name` must be unique in the test binary (the test driver's domains are process-wide).
pub(super) async fn test_launcher(name: &str) -> TestLauncher {
    let dir = tempfile::tempdir().unwrap();
    let spec = crate::testing::minimal_vmi(name, "    devices: {}", "");
    let vmi = crate::spec::parse(&spec).unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let connector = Arc::new(Connector::new(
        crate::libvirt::Backend::Uri("test:///default".into()),
        tx.clone(),
    ));
    let convert = ConvertOptions::new(domain::VirtType::Qemu, dir.path().join("console.log"));
    let options = LaunchOptions {
        strategy: RunStrategy::Always,
        convert,
        resync_interval: Duration::from_secs(3600),
        hotplug: HotplugOptions {
            node_owner: NodeOwner { uid: 0, gid: 0 },
            cgroup_roots: CgroupRoots {
                v1_devices: Some(CgroupMount::whole(dir.path().join("devices"))),
                unified: None,
            },
            sys_dev_block: dir.path().join("sys-dev-block"),
            proc_root: dir.path().join("proc"),
            qemu_pid_dir: dir.path().join("run"),
            records: dir.path().join("records.json"),
            last_sync: dir.path().join("last-sync"),
            missing_capabilities: Vec::new(),
            allowed_block_devices: Default::default(),
        },
        spec_text: spec,
        reconnect_timeout: Some(Duration::from_secs(5)),
        host_paths: Default::default(),
        runtime_dir: dir.path().into(),
        incoming: false,
        block_devices: Default::default(),
        migration_tls: None,
    };
    let (launcher, kind) = Launcher::start(connector, vmi, options, rx).await.unwrap();
    assert_eq!(kind, StartKind::Created);
    // "QEMU" (pid 4242) in cgroup /pod/qemu of a v1 devices hierarchy: block volumes' rules
    // are written there, their nodes made in the hotplug dir.
    let cgroup = dir.path().join("devices/pod/qemu");
    std::fs::create_dir_all(&cgroup).unwrap();
    for f in ["devices.allow", "devices.deny"] {
        std::fs::write(cgroup.join(f), "").unwrap();
    }
    let proc = dir.path().join("proc/4242");
    std::fs::create_dir_all(&proc).unwrap();
    std::fs::write(proc.join("cgroup"), "5:devices:/pod/qemu\n").unwrap();
    std::fs::create_dir_all(dir.path().join("run")).unwrap();
    let pid_file = format!("run/{}.pid", launcher.domain_name());
    std::fs::write(dir.path().join(pid_file), "4242\n").unwrap();
    TestLauncher {
        launcher,
        events: tx,
        dir,
    }
}

/// A task whose work panics (a bug anywhere below it).
struct Panics;

impl Work for Panics {
    type Output = ();

    fn command(&self) -> Command {
        Command::Sync
    }

    async fn perform(self, _: &Launcher) -> Result<(), LauncherError> {
        panic!("a bug in a task")
    }
}

/// A panic inside a task (as in a gRPC handler's detached call) must not leave `State.task` set
/// for good, a phantom task in status: it once did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_panics_ends_as_failed() {
    let t = test_launcher("task-panics").await;
    let (_, mut stream) = t.launcher.watch_events();
    let l = t.launcher.clone();
    let joined = tokio::spawn(async move { l.run(Panics).await }).await;
    assert!(joined.unwrap_err().is_panic());
    assert_eq!(t.launcher.status().task, None, "no phantom task");
    let failed = loop {
        let event = tokio::time::timeout(Duration::from_secs(10), stream.recv())
            .await
            .expect("the task's end is announced")
            .unwrap();
        if let EventKind::Task {
            command: Command::Sync,
            outcome: TaskOutcome::Failed(why),
            ..
        } = event.kind
        {
            break why;
        }
    };
    assert_eq!(failed, "the task panicked");
    // The slot is free: the next command runs.
    t.launcher.command(Command::Pause, None).await.unwrap();
    assert_eq!(t.launcher.status().task, None);
}

/// A guest storming I/O errors (`errorPolicy: report`) once made a log line, an event on the
/// stream and a state read for each one, thousands a second. Sent on the channel libvirt's
/// callbacks use: the first is reported at once, the rest together, by the latest and their
/// count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_io_error_storm_is_reported_at_a_bounded_rate() {
    const STORM: u64 = 10_000;
    let t = test_launcher("io-storm").await;
    let domain = t.launcher.domain_name().to_string();
    let (_, mut stream) = t.launcher.watch_events();
    for i in 0..STORM {
        t.events
            .send(HypervisorEvent::IoError {
                domain: domain.clone(),
                alias: "ua-data".into(),
                path: "/dev/data".into(),
                action: "report",
                reason: format!("eio {i}"),
            })
            .unwrap();
    }
    let mut reports = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !reports
        .last()
        .is_some_and(|d: &String| d.contains(&format!("eio {}", STORM - 1)))
    {
        let event = tokio::time::timeout_at(deadline, stream.recv())
            .await
            .expect("the last I/O error is reported")
            .expect("the stream keeps up (no resync)");
        if let EventKind::Hypervisor { event, detail } = event.kind {
            if event == "IOError" {
                reports.push(detail);
            }
        }
    }
    assert!(reports.len() <= 3, "{} reports: {reports:?}", reports.len());
    assert_eq!(
        reports[0],
        "I/O error on ua-data (/dev/data): eio 0; action report"
    );
    let suppressed: u64 = reports[1..]
        .iter()
        .map(|d| {
            let more = d.rsplit_once(" (").unwrap().1;
            more.split(' ').next().unwrap().parse::<u64>().unwrap() + 1
        })
        .sum();
    assert_eq!(1 + suppressed, STORM, "every error counted: {reports:?}");
    assert_eq!(
        t.launcher.state.lock().unwrap().io_error.as_deref(),
        Some(&*format!(
            "I/O error on ua-data (/dev/data): eio {}; action report",
            STORM - 1
        )),
        "the latest error is kept"
    );
}

async fn next(stream: &mut broadcast::Receiver<LauncherEvent>) -> LauncherEvent {
    tokio::time::timeout(Duration::from_secs(10), stream.recv())
        .await
        .expect("an event")
        .unwrap()
}

/// A device-removed event that comes after its detach stopped waiting was once finished at
/// once, beside a Sync in flight that might plug the same name again: it unlinked the new node
/// and revoked its rule. It now waits for the task slot, and releases only the node its detach
/// was about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_device_removal_waits_for_the_task_and_spares_a_volume_plugged_again() {
    const LOOP1: DevNumber = DevNumber { major: 7, minor: 1 };
    const LOOP2: DevNumber = DevNumber { major: 7, minor: 2 };
    let t = test_launcher("late-removal").await;
    let l = &t.launcher;
    let domain = l.domain_name().to_string();
    let hotplug = l.options.convert.paths.hotplug_dir.clone();
    let disk = |volume: &str| DiskDef {
        volume: volume.into(),
        target: format!("sd-{volume}"),
        bus: Bus::Scsi,
        ..DiskDef::default()
    };
    // Two block volumes whose detach stopped waiting (as after DETACH_TIMEOUT): "again" is
    // plugged again by the Sync below, "gone" is not.
    for (volume, dev) in [("again", LOOP1), ("gone", LOOP2)] {
        l.block.plug(volume, dev).unwrap().keep();
        l.set_volume(
            &disk(volume),
            VolumePhase::Detaching,
            "DetachTimeout",
            String::new(),
        );
        l.detaches.begin(volume, l.block.generation(volume), false);
    }
    let (_, mut stream) = l.watch_events();
    // A Sync in flight holds the slot while both removals come.
    let slot = l.tasks.take().await;
    for volume in ["again", "gone"] {
        let alias = format!("{}{volume}", domain::USER_ALIAS_PREFIX);
        t.events
            .send(HypervisorEvent::DeviceRemoved {
                domain: domain.clone(),
                alias,
            })
            .unwrap();
    }
    // Handled in order: once this one is on the stream, so were the removals.
    t.events
        .send(HypervisorEvent::Lifecycle {
            domain: domain.clone(),
            event: lifecycle_event::DEFINED,
            detail: 0,
        })
        .unwrap();
    while !matches!(next(&mut stream).await.kind, EventKind::Hypervisor { .. }) {}
    for volume in ["again", "gone"] {
        assert!(
            hotplug.join(volume).exists(),
            "{volume}: nothing is released beside a task"
        );
    }
    // The Sync plugs "again" once more (the node there is taken as it is), then ends.
    l.block.plug("again", LOOP1).unwrap().keep();
    l.set_volume(&disk("again"), VolumePhase::Ready, "", String::new());
    drop(slot);
    l.signals.wake();

    // Both late removals are finished together, under the slot.
    loop {
        if let EventKind::VolumeRemoved(volume) = next(&mut stream).await.kind {
            assert_eq!(volume, "gone");
            break;
        }
    }
    assert!(!hotplug.join("gone").exists());
    assert_eq!(
        devnode::device_of(&hotplug.join("again")).unwrap(),
        LOOP1,
        "the node plugged again stays"
    );
    assert_eq!(l.block.nodes(), [("again".to_string(), LOOP1)].into());
    let cgroup = t.dir.path().join("devices/pod/qemu");
    assert_eq!(
        std::fs::read_to_string(cgroup.join("devices.deny")).unwrap(),
        "b 7:2 rwm",
        "only the released device is denied"
    );
    let volumes = l.status().volumes;
    assert_eq!(volumes.len(), 1, "{volumes:?}");
    assert_eq!(volumes[0].phase, VolumePhase::Ready);
}

/// `vmlauncher run` and the health reporter follow the VM's course; a volume's progress (several
/// status changes per attach) must not wake them, since each wake of the terminal's follower is a
/// futex wake-up of the main thread on the Sync's path. A change of phase still does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_change_moves_the_status_but_not_the_course() {
    let t = test_launcher("course").await;
    let l = &t.launcher;
    let (mut every, mut course) = (l.subscribe(), l.subscribe_course());
    every.mark_unchanged();
    course.mark_unchanged();
    let disk = DiskDef {
        volume: "v".into(),
        target: "sda".into(),
        bus: Bus::Scsi,
        ..DiskDef::default()
    };
    l.set_volume(&disk, VolumePhase::Attaching, "", String::new());
    l.set_volume(&disk, VolumePhase::Ready, "", String::new());
    assert!(every.has_changed().unwrap(), "the status moved");
    assert!(!course.has_changed().unwrap(), "the course did not");
    let before = l.status().phase;
    assert_eq!(course.borrow().phase, before);
    l.update(|s| s.observation = Observation::Vanished);
    assert_ne!(l.status().phase, before, "a vanished domain is a new phase");
    assert!(course.has_changed().unwrap(), "a new phase is a new course");
    assert_eq!(course.borrow_and_update().phase, l.status().phase);
}

/// The condition `AgentConnected` is libvirt's word on the agent's channel, as virt-handler reads
/// it: it follows the domain's own agent events (not another domain's), and a stopped domain
/// has no agent whatever the last event said (libvirt sends none when QEMU ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_condition_follows_libvirts_agent_events_while_the_domain_runs() {
    let t = test_launcher("agent").await;
    let l = &t.launcher;
    let (_, mut stream) = l.watch_events();
    let agent = |l: &Launcher| {
        l.status()
            .conditions
            .iter()
            .any(|c| c.kind == types::AGENT_CONNECTED && c.status)
    };
    assert!(!agent(l), "no agent before libvirt says so");
    for (domain, connected, shown) in [
        (l.domain_name.as_str(), true, true),
        ("another", false, true),
        (l.domain_name.as_str(), false, false),
        (l.domain_name.as_str(), true, true),
    ] {
        let event = HypervisorEvent::AgentLifecycle {
            domain: domain.into(),
            connected,
        };
        t.events.send(event).unwrap();
        // Handled in order: once this one is on the stream, so was the agent event. A marker
        // libvirt itself never sends here ("renamed"): its own "Defined added" of the test
        // domain may still be on its way and must not be taken for the marker.
        t.events
            .send(HypervisorEvent::Lifecycle {
                domain: l.domain_name.clone(),
                event: lifecycle_event::DEFINED,
                detail: virt::sys::VIR_DOMAIN_EVENT_DEFINED_RENAMED as i32,
            })
            .unwrap();
        while !matches!(
            next(&mut stream).await.kind,
            EventKind::Hypervisor { event, detail } if event == "Defined" && detail == "renamed"
        ) {}
        assert_eq!(
            agent(l),
            shown,
            "after {domain}'s agent connected={connected}"
        );
    }
    l.update(|s| {
        s.observation = Observation::Domain(lifecycle::PowerState {
            state: lifecycle::DomainState::Shutoff,
            reason: "shutdown".into(),
        })
    });
    assert!(!agent(l), "a stopped domain has no agent");
}

/// A VM that went to another launcher is never started here again. Its domain is gone from
/// this libvirtd, so the power state alone admits a Start: two guests would then run on one
/// set of disks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_after_the_vm_migrated_away_is_refused_and_starts_nothing() {
    let t = test_launcher("migrated-away-start").await;
    let l = &t.launcher;
    l.update(|s| s.life = s.life.migrated_away());
    let hv = l.hypervisor().unwrap();
    hv.destroy(l.domain_name()).unwrap();
    let e = l.command(Command::Start, None).await.unwrap_err();
    assert!(
        matches!(
            e,
            LauncherError::MigrationEnded {
                command: "Start",
                ..
            }
        ),
        "{e}"
    );
    assert!(!hv.power_state(l.domain_name()).unwrap().state.is_active());
}
