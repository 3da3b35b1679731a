//! What the launcher does by itself: the run strategy after a stop nobody asked for, the reboot
//! window, the back-off and its reset after a stable run.

use std::time::{Duration, Instant};

use super::{phase, DomainState, Observation, Phase, VmState};

/// A stop followed by a start within this window is a reboot, not a stop.
pub(crate) const REBOOT_WINDOW: Duration = Duration::from_secs(1);
/// A VM that ran this long since its last (re)start has its back-off reset.
pub(crate) const STABLE_RUN: Duration = Duration::from_secs(60);

/// KubeVirt's run strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
pub enum RunStrategy {
    /// Restart whenever it stops, with exponential back-off.
    Always,
    /// Restart only after a failure.
    RerunOnFailure,
    /// Run once; never restart. What a bare VMI does.
    Once,
    /// Start and stop only on request.
    Manual,
    /// Stay stopped until a Start call.
    Halted,
}

impl RunStrategy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RunStrategy::Always => "Always",
            RunStrategy::RerunOnFailure => "RerunOnFailure",
            RunStrategy::Once => "Once",
            RunStrategy::Manual => "Manual",
            RunStrategy::Halted => "Halted",
        }
    }

    /// Boot at launch, or wait for a Start call.
    pub(crate) fn starts_at_launch(self) -> bool {
        !matches!(self, RunStrategy::Manual | RunStrategy::Halted)
    }
}

/// What the reconciler does about an observation while no task runs (`docs/DESIGN.md` §3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reaction {
    Nothing,
    /// The VM stopped by itself: apply the run strategy ([`after_stop`]).
    Stopped {
        failed: bool,
    },
    /// Keep the pause and report it; never auto-resume (an I/O-error pause least of all).
    KeepPaused {
        reason: String,
    },
    /// It runs although the owner stopped it.
    ForceStop,
    /// It stopped while paused: mark it stopped, do not restart.
    MarkStopped,
    /// The domain is gone without the launcher removing it.
    Lost,
}

pub(crate) fn reconcile(vm_state: VmState, observation: &Observation) -> Reaction {
    let power = match observation {
        Observation::Vanished => return Reaction::Lost,
        Observation::NotCreated | Observation::Unreachable => return Reaction::Nothing,
        Observation::Domain(p) => p,
    };
    let active = power.state.is_active();
    match (vm_state, power.state) {
        (VmState::Active, _) if !active => Reaction::Stopped {
            failed: phase(observation, false) == Phase::Failed,
        },
        (VmState::Active, DomainState::Paused) => Reaction::KeepPaused {
            reason: power.reason.clone(),
        },
        (VmState::Stopped, _) if active => Reaction::ForceStop,
        (VmState::Paused, _) if !active => Reaction::MarkStopped,
        _ => Reaction::Nothing,
    }
}

/// What follows a stop the owner did not ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterStop {
    /// Start again after `delay` (shown as CrashLoopBackOff).
    Restart { delay: Duration },
    /// Stay stopped; a Start call may come.
    WaitForStart,
    /// The VM is final: a pod's launcher exits.
    Finish,
}

pub(crate) const BACKOFF_START: Duration = Duration::from_secs(1);
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// `restarts` counts the restarts before this one since the VM last ran stably.
pub(crate) fn after_stop(strategy: RunStrategy, failed: bool, restarts: u32) -> AfterStop {
    let restart = || AfterStop::Restart {
        delay: BACKOFF_START
            .saturating_mul(1u32.checked_shl(restarts).unwrap_or(u32::MAX))
            .min(BACKOFF_MAX),
    };
    match strategy {
        RunStrategy::Always => restart(),
        RunStrategy::RerunOnFailure if failed => restart(),
        RunStrategy::RerunOnFailure | RunStrategy::Once => AfterStop::Finish,
        RunStrategy::Manual | RunStrategy::Halted => AfterStop::WaitForStart,
    }
}

/// What the launcher keeps about restarts: the part of its state the rules below change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Restarts {
    pub vm_state: VmState,
    /// When the domain was first seen stopped without a task (the reboot window's start).
    pub stop_seen: Option<Instant>,
    /// When the pending restart happens (CrashLoopBackOff).
    pub restart_at: Option<Instant>,
    /// Restarts since the VM last ran stably.
    pub restarts: u32,
    pub last_started: Option<Instant>,
    /// The VM will not run again under this launcher.
    pub finished: bool,
}

/// The VM stopped without a task, seen at `now`: wait out the reboot window, then apply the run
/// strategy, with the back-off reset if the VM had run for [`STABLE_RUN`].
pub(crate) fn after_unasked_stop(
    strategy: RunStrategy,
    failed: bool,
    before: Restarts,
    now: Instant,
) -> Restarts {
    let mut r = before;
    // Already decided: a restart is pending or the VM is final. Arming the reboot window again
    // would make the reconciler's timer fire in a loop until the restart.
    if r.restart_at.is_some() || r.finished {
        r.stop_seen = None;
        return r;
    }
    let Some(seen) = r.stop_seen else {
        r.stop_seen = Some(now);
        return r;
    };
    if now < seen + REBOOT_WINDOW {
        return r;
    }
    let stable = r
        .last_started
        .is_some_and(|t| now.duration_since(t) >= STABLE_RUN);
    let restarts = if stable { 0 } else { r.restarts };
    match after_stop(strategy, failed, restarts) {
        AfterStop::Restart { delay } => {
            r.restarts = restarts + 1;
            r.restart_at = Some(now + delay);
        }
        AfterStop::WaitForStart => r.vm_state = VmState::Stopped,
        AfterStop::Finish => {
            r.vm_state = if failed {
                VmState::Error
            } else {
                VmState::Stopped
            };
            r.finished = true;
        }
    }
    r.stop_seen = None;
    r
}

/// A run-strategy restart failed at `now`: the next one backs off further, if the strategy
/// restarts at all. Returns the new restart count and when to try again.
pub(crate) fn after_failed_restart(
    strategy: RunStrategy,
    restarts: u32,
    now: Instant,
) -> Option<(u32, Instant)> {
    match after_stop(strategy, true, restarts) {
        AfterStop::Restart { delay } => Some((restarts + 1, now + delay)),
        AfterStop::WaitForStart | AfterStop::Finish => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::tests::observations;

    #[test]
    fn reconcile_every_vm_state_with_every_observation() {
        // Columns follow `observations()`: `.` nothing, `L` lost, `s` stopped, `F` stopped and
        // failed, `k` keep paused (with libvirt's reason), `m` mark stopped, `x` force stop.
        let table = [
            (VmState::Building, "..L............."),
            (VmState::Active, "..L.kksFFs...kks"),
            (VmState::Paused, "..L...mmmm.....m"),
            (VmState::Stopped, "..Lxxx....xxxxx."),
            (VmState::Error, "..L............."),
        ];
        for (vm, row) in table {
            assert_eq!(row.len(), observations().len());
            for ((name, obs), code) in observations().iter().zip(row.chars()) {
                let want = match (code, obs) {
                    ('.', _) => Reaction::Nothing,
                    ('L', _) => Reaction::Lost,
                    ('s', _) => Reaction::Stopped { failed: false },
                    ('F', _) => Reaction::Stopped { failed: true },
                    ('k', Observation::Domain(p)) => Reaction::KeepPaused {
                        reason: p.reason.clone(),
                    },
                    ('m', _) => Reaction::MarkStopped,
                    ('x', _) => Reaction::ForceStop,
                    other => panic!("bad table entry {other:?}"),
                };
                assert_eq!(reconcile(vm, obs), want, "{vm:?} × {name}");
            }
        }
    }

    #[test]
    fn run_strategies_after_a_stop() {
        use std::time::Duration;
        let restart = |s| AfterStop::Restart {
            delay: Duration::from_secs(s),
        };
        assert_eq!(after_stop(RunStrategy::Always, false, 0), restart(1));
        assert_eq!(after_stop(RunStrategy::Always, true, 3), restart(8));
        assert_eq!(after_stop(RunStrategy::Always, true, 9), restart(300));
        assert_eq!(after_stop(RunStrategy::Always, true, 40), restart(300));
        assert_eq!(after_stop(RunStrategy::RerunOnFailure, true, 0), restart(1));
        assert_eq!(
            after_stop(RunStrategy::RerunOnFailure, false, 0),
            AfterStop::Finish
        );
        assert_eq!(after_stop(RunStrategy::Once, true, 0), AfterStop::Finish);
        assert_eq!(after_stop(RunStrategy::Once, false, 0), AfterStop::Finish);
        assert_eq!(
            after_stop(RunStrategy::Manual, true, 0),
            AfterStop::WaitForStart
        );
        assert_eq!(
            after_stop(RunStrategy::Halted, false, 0),
            AfterStop::WaitForStart
        );
    }

    /// A VM that has run 10s (not stably), stopped by itself, never seen stopped before.
    fn running(t0: Instant) -> Restarts {
        Restarts {
            vm_state: VmState::Active,
            stop_seen: None,
            restart_at: None,
            restarts: 0,
            last_started: Some(t0),
            finished: false,
        }
    }

    #[test]
    fn an_unasked_stop_waits_out_the_reboot_window_then_follows_the_strategy() {
        use RunStrategy::*;
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let r0 = running(t0);
        let seen = |at: Duration, r: Restarts| Restarts {
            stop_seen: Some(t0 + at),
            ..r
        };
        // (what, strategy, failed, before, now, after)
        let table: Vec<(&str, RunStrategy, bool, Restarts, Instant, Restarts)> = vec![
            (
                "first sight opens the window",
                Always,
                false,
                r0,
                t0 + s(10),
                seen(s(10), r0),
            ),
            (
                "inside the window: a reboot, nothing yet",
                Always,
                false,
                seen(s(10), r0),
                t0 + s(10) + ms(999),
                seen(s(10), r0),
            ),
            (
                "window over, unstable run: back-off grows",
                Always,
                false,
                seen(s(10), Restarts { restarts: 2, ..r0 }),
                t0 + s(11),
                Restarts {
                    restarts: 3,
                    restart_at: Some(t0 + s(11) + s(4)),
                    ..r0
                },
            ),
            (
                "after a stable run the back-off starts over",
                Always,
                true,
                seen(s(99), Restarts { restarts: 5, ..r0 }),
                t0 + s(100),
                Restarts {
                    restarts: 1,
                    restart_at: Some(t0 + s(100) + s(1)),
                    ..r0
                },
            ),
            (
                "exactly STABLE_RUN is stable",
                Always,
                true,
                seen(s(59), Restarts { restarts: 4, ..r0 }),
                t0 + s(60),
                Restarts {
                    restarts: 1,
                    restart_at: Some(t0 + s(61)),
                    ..r0
                },
            ),
            (
                "RerunOnFailure restarts a failed VM",
                RerunOnFailure,
                true,
                seen(s(10), r0),
                t0 + s(12),
                Restarts {
                    restarts: 1,
                    restart_at: Some(t0 + s(13)),
                    ..r0
                },
            ),
            (
                "RerunOnFailure ends a VM that succeeded",
                RerunOnFailure,
                false,
                seen(s(10), r0),
                t0 + s(12),
                Restarts {
                    vm_state: VmState::Stopped,
                    finished: true,
                    ..r0
                },
            ),
            (
                "Once ends a failed VM in Error",
                Once,
                true,
                seen(s(10), r0),
                t0 + s(12),
                Restarts {
                    vm_state: VmState::Error,
                    finished: true,
                    ..r0
                },
            ),
            (
                "Manual waits for a Start",
                Manual,
                true,
                seen(s(10), r0),
                t0 + s(12),
                Restarts {
                    vm_state: VmState::Stopped,
                    ..r0
                },
            ),
            (
                "Halted waits for a Start",
                Halted,
                false,
                seen(s(10), r0),
                t0 + s(12),
                Restarts {
                    vm_state: VmState::Stopped,
                    ..r0
                },
            ),
            (
                "a pending restart is not decided again",
                Always,
                false,
                seen(
                    s(10),
                    Restarts {
                        restart_at: Some(t0 + s(20)),
                        ..r0
                    },
                ),
                t0 + s(12),
                Restarts {
                    restart_at: Some(t0 + s(20)),
                    ..r0
                },
            ),
            (
                "a final VM is not decided again",
                Always,
                true,
                seen(
                    s(10),
                    Restarts {
                        finished: true,
                        ..r0
                    },
                ),
                t0 + s(12),
                Restarts {
                    finished: true,
                    ..r0
                },
            ),
        ];
        for (what, strategy, failed, before, now, want) in table {
            assert_eq!(
                after_unasked_stop(strategy, failed, before, now),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn a_failed_restart_backs_off_further_if_the_strategy_restarts() {
        use RunStrategy::*;
        let now = Instant::now();
        let s = Duration::from_secs;
        let table = [
            (Always, 0, Some((1, now + s(1)))),
            (Always, 3, Some((4, now + s(8)))),
            (RerunOnFailure, 9, Some((10, now + s(300)))),
            (Once, 0, None),
            (Manual, 2, None),
            (Halted, 0, None),
        ];
        for (strategy, restarts, want) in table {
            assert_eq!(
                after_failed_restart(strategy, restarts, now),
                want,
                "{strategy:?} after {restarts}"
            );
        }
    }
}
