//! One running test guest per test process, for the tests that only look at a running VM (its
//! processes, its consoles, its API under abuse, a second launcher refused on its dir) and change
//! nothing of it: each of them booted a guest of its own, and a TCG boot with its libvirtd is
//! most of such a test's time. A test that changes the VM (a verb, a Sync, a stop, a crash) keeps
//! its own launcher.
//!
//! Its launcher is started by a keeper, `sh`, whose standard input is a pipe only this process
//! writes to: when the process ends, however it ends, the pipe closes and the keeper stops the
//! launcher with SIGTERM (the guest powers off, libvirtd goes), waits for it, and removes the
//! runtime dir. So no test's end, and no failure, leaves it running.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use vmlauncher::console::ConsoleLog;

use super::{bin, guest_spec, wait_booted};

/// The VMI's name, so the domain is `default_shared`.
pub const SHARED_NAME: &str = "shared";

/// The shared guest, booted: its launcher runs as `run SPEC --runtime-dir DIR --emulation tcg`
/// with the test guest's plain spec, as `Launched::start(&guest_spec(name, "", &[]), &[])`.
#[derive(Debug)]
pub struct SharedGuest {
    dir: PathBuf,
    launcher: i32,
    /// Kept, never read: the keeper waits for its stdin to close.
    _keeper: Child,
}

/// The shared guest, started and booted by the first test that asks for it (the others wait for
/// its boot). A boot that fails panics in that test and leaves the next one to try again.
pub fn shared_guest() -> &'static SharedGuest {
    static GUEST: OnceLock<SharedGuest> = OnceLock::new();
    GUEST.get_or_init(SharedGuest::start)
}

const KEEPER: &str = r#"
"$@" </dev/null >"$VMLTEST_DIR/launcher.stdout" 2>>"$VMLTEST_DIR/launcher.stderr" &
launcher=$!
echo "$launcher"
exec >/dev/null
cat >/dev/null
kill -TERM "$launcher"
wait "$launcher"
rm -rf "$VMLTEST_DIR"
"#;

impl SharedGuest {
    fn start() -> SharedGuest {
        let dir = tempfile::Builder::new()
            .prefix("vml-e2e-shared-")
            .tempdir()
            .expect("temp dir")
            .keep();
        let spec = dir.join("spec.yaml");
        std::fs::write(&spec, guest_spec(SHARED_NAME, "", &[])).unwrap();
        // VMLAUNCHER_TEST_WRAPPER, as every launcher a test starts (`Launched`).
        let wrapper = std::env::var("VMLAUNCHER_TEST_WRAPPER").unwrap_or_default();
        let mut keeper = Command::new("sh")
            .args(["-c", KEEPER, "keeper"])
            .args(wrapper.split_whitespace())
            .arg(bin())
            .arg("run")
            .arg(&spec)
            .arg("--runtime-dir")
            .arg(&dir)
            .args(["--emulation", "tcg"])
            .env("VMLTEST_DIR", &dir)
            .env(
                "VMLAUNCHER_LOG",
                std::env::var("VMLAUNCHER_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn sh");
        let mut line = String::new();
        BufReader::new(keeper.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let launcher = line
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("the keeper's launcher pid {line:?}: {e}"));
        let guest = SharedGuest {
            dir,
            launcher,
            _keeper: keeper,
        };
        wait_booted(&mut guest.console());
        guest
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("launcher.sock")
    }

    pub fn launcher_pid(&self) -> i32 {
        self.launcher
    }

    /// The console log from its start (the boot line included).
    pub fn console(&self) -> ConsoleLog {
        ConsoleLog::from_start(&self.dir.join("console.log")).unwrap()
    }

    /// What its launcher (and any other started on its dir) wrote on standard error.
    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(self.dir.join("launcher.stderr")).unwrap_or_default()
    }

    pub fn pid_from(&self, relative: &str) -> Option<i32> {
        std::fs::read_to_string(self.dir.join(relative))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    pub fn qemu_pid(&self) -> i32 {
        self.pid_from(&format!("libvirt/run/qemu/default_{SHARED_NAME}.pid"))
            .expect("QEMU's pid file")
    }
}
