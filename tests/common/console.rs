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
