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
    #[allow(dead_code)] // used by the event tests
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
