//! The launcher's own bookkeeping (tasks, events), driven against libvirt's `test:///default`
//! driver: a real libvirt connection whose domains run nothing, so these run in milliseconds and
//! need no guest. What a guest must show is proven by the e2e tests.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::tasks::Work;
use super::*;
use crate::host::devnode::NodeOwner;

/// A launcher of a running domain on the test driver, the sending end of its event channel (as
/// libvirt's callbacks use it), and its runtime dir.
pub(super) struct TestLauncher {
    pub launcher: Arc<Launcher>,
    pub events: mpsc::UnboundedSender<HypervisorEvent>,
    _dir: tempfile::TempDir,
}

impl Drop for TestLauncher {
    fn drop(&mut self) {
        // The test driver's state is shared by the whole process: leave no domain behind.
        if let Ok(hv) = self.launcher.hypervisor() {
            let _ = hv.destroy(&self.launcher.domain_name);
            let _ = hv.undefine(&self.launcher.domain_name);
        }
    }
}

/// `name` must be unique in the test binary (the test driver's domains are process-wide).
pub(super) async fn test_launcher(name: &str) -> TestLauncher {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {{name: {name}}}\n\
         spec:\n  domain:\n    memory: {{guest: 64Mi}}\n    devices: {{}}\n"
    );
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
            cgroup_roots: Default::default(),
            sys_dev_block: dir.path().join("sys-dev-block"),
            proc_root: dir.path().join("proc"),
            qemu_pid_dir: dir.path().join("run"),
            records: dir.path().join("records.json"),
            last_sync: dir.path().join("last-sync.json"),
        },
        spec_text: spec,
        reconnect_timeout: Some(Duration::from_secs(5)),
    };
    let (launcher, kind) = Launcher::start(connector, vmi, options, rx).await.unwrap();
    assert_eq!(kind, StartKind::Created);
    TestLauncher {
        launcher,
        events: tx,
        _dir: dir,
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

/// Review, panic inventory: a panic inside a task (as in a gRPC handler's detached call) left
/// `State.task` set for good, a phantom task in status.
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

/// Review L4: a guest storming I/O errors (`errorPolicy: report`) made a log line, an event on
/// the stream and a state read for each one. Sent on the channel libvirt's callbacks use: the
/// first is reported at once, the rest together, by the latest and their count.
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
