//! One Debian boot at a time on the host. Cloud-init on the Debian image under TCG takes about
//! 75 s alone on two cores; two at once (the guests tier's `debian` and the KubeVirt node's
//! `kubectl_create_to_succeeded`, which `scripts/test.sh` runs side by side, or another
//! checkout's suite) each take more than twice that and miss their deadlines. So every test that
//! boots the Debian image holds this turn, an `flock` on one file, from before its launcher
//! starts until the guest says cloud-init is done; the kernel releases it if the test dies.

use std::fs::File;
use std::time::Instant;

use nix::fcntl::{Flock, FlockArg};

/// Host-wide, not per checkout: the CPU is what the boots share.
const TURN: &str = "/run/lock/vmlauncher-debian-boot";

/// The turn, held until dropped.
#[derive(Debug)]
pub struct DebianTurn(#[allow(dead_code)] Flock<File>);

/// Waits (as long as it takes: the holder's own deadline bounds its boot) for the turn to boot
/// the Debian image; says how long it waited.
pub fn debian_turn(who: &str) -> DebianTurn {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(TURN)
        .unwrap_or_else(|e| panic!("{TURN}: {e}"));
    let asked = Instant::now();
    let held = Flock::lock(file, FlockArg::LockExclusive)
        .unwrap_or_else(|(_, e)| panic!("flock {TURN}: {e}"));
    eprintln!("{who}: the Debian boot turn after {:.1?}", asked.elapsed());
    DebianTurn(held)
}
