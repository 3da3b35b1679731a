//! Waiting on the guest's serial console, each wait with a deadline.

use std::time::{Duration, Instant};

use vmlauncher::console::ConsoleLog;

use super::BOOT_DEADLINE;

/// Waiting on the guest's console with a deadline counted from now.
pub trait ConsoleWait {
    /// The first line `wanted` accepts within `within`; a panic naming `what` otherwise.
    fn line(&mut self, what: &str, within: Duration, wanted: impl FnMut(&str) -> bool) -> String;
}

impl ConsoleWait for ConsoleLog {
    fn line(&mut self, what: &str, within: Duration, wanted: impl FnMut(&str) -> bool) -> String {
        self.wait_for(what, Instant::now() + within, wanted)
            .unwrap()
    }
}

/// Waits for the test guest's next boot line on `console`.
pub fn wait_booted(console: &mut ConsoleLog) {
    console.line("the guest's boot line", BOOT_DEADLINE, |l| {
        l.contains("VMLTEST-BOOTED")
    });
}

/// The test guest's report after a disk change (`scripts/guest/init`): the serials it sees, what
/// it read back from the disk of serial `CDISK-1` (`vmltest.write=CDISK-1`), its boot id and
/// uptime.
pub struct GuestReport {
    pub serials: Vec<String>,
    pub read_back: String,
    pub boot_id: String,
    pub uptime: f64,
}

/// The next report on `console` whose disks include `serial`.
pub fn report_with(console: &mut ConsoleLog, serial: &str) -> GuestReport {
    let deadline = super::GUEST_DEADLINE;
    let disks = console.line(&format!("the guest's disks with {serial}"), deadline, |l| {
        l.starts_with("VMLTEST-DISKS ") && l.contains(&format!(":{serial}:"))
    });
    let read_back = console.line("what the guest read back", deadline, |l| {
        l.starts_with("VMLTEST-READ CDISK-1 ")
    });
    let uptime = console.line("the guest's uptime", deadline, |l| {
        l.starts_with("VMLTEST-UPTIME ")
    });
    let mut words = uptime.split_whitespace().skip(1);
    GuestReport {
        serials: super::guest_serials(&disks),
        read_back: read_back["VMLTEST-READ CDISK-1 ".len()..].to_string(),
        boot_id: words.next().unwrap().to_string(),
        uptime: words.next().unwrap().parse().unwrap(),
    }
}

/// The guest's next numeric report `what` (`VMLTEST-CPUS`, `VMLTEST-MEMORY`) that `wanted`
/// accepts, within [`BOOT_DEADLINE`] (a report may come only after a boot); its number.
pub fn guest_reports(console: &mut ConsoleLog, what: &str, wanted: impl Fn(u64) -> bool) -> u64 {
    let prefix = format!("{what} ");
    let line = console
        .wait_for(what, Instant::now() + BOOT_DEADLINE, |l| {
            l.strip_prefix(&prefix)
                .and_then(|n| n.trim().parse::<u64>().ok())
                .is_some_and(&wanted)
        })
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    line[prefix.len()..].trim().parse().unwrap()
}
