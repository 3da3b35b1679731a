//! libvirt's numbers in libvirt's words: domain states with their reasons, lifecycle events with
//! their details. One table each, keyed by the binding's own constants (`virt::sys`), so a number
//! is never typed in by hand; the tests walk every constant the binding has.

use virt::sys;

use crate::lifecycle::{DomainState, PowerState};

/// Codes of one enum of the binding, each with libvirt's word for it.
type Words = &'static [(u32, &'static str)];

/// Each state, its name for the lifecycle, and its reasons (`virsh domstate --reason`).
const STATES: &[(u32, DomainState, Words)] = &[
    (
        sys::VIR_DOMAIN_NOSTATE,
        DomainState::NoState,
        &[(sys::VIR_DOMAIN_NOSTATE_UNKNOWN, "unknown")],
    ),
    (
        sys::VIR_DOMAIN_RUNNING,
        DomainState::Running,
        &[
            (sys::VIR_DOMAIN_RUNNING_UNKNOWN, "unknown"),
            (sys::VIR_DOMAIN_RUNNING_BOOTED, "booted"),
            (sys::VIR_DOMAIN_RUNNING_MIGRATED, "migrated"),
            (sys::VIR_DOMAIN_RUNNING_RESTORED, "restored"),
            (sys::VIR_DOMAIN_RUNNING_FROM_SNAPSHOT, "from-snapshot"),
            (sys::VIR_DOMAIN_RUNNING_UNPAUSED, "unpaused"),
            (
                sys::VIR_DOMAIN_RUNNING_MIGRATION_CANCELED,
                "migration-canceled",
            ),
            (sys::VIR_DOMAIN_RUNNING_SAVE_CANCELED, "save-canceled"),
            (sys::VIR_DOMAIN_RUNNING_WAKEUP, "wakeup"),
            (sys::VIR_DOMAIN_RUNNING_CRASHED, "crashed"),
            (sys::VIR_DOMAIN_RUNNING_POSTCOPY, "post-copy"),
            (sys::VIR_DOMAIN_RUNNING_POSTCOPY_FAILED, "postcopy-failed"),
        ],
    ),
    (
        sys::VIR_DOMAIN_BLOCKED,
        DomainState::Blocked,
        &[(sys::VIR_DOMAIN_BLOCKED_UNKNOWN, "unknown")],
    ),
    (
        sys::VIR_DOMAIN_PAUSED,
        DomainState::Paused,
        &[
            (sys::VIR_DOMAIN_PAUSED_UNKNOWN, "unknown"),
            (sys::VIR_DOMAIN_PAUSED_USER, "user"),
            (sys::VIR_DOMAIN_PAUSED_MIGRATION, "migration"),
            (sys::VIR_DOMAIN_PAUSED_SAVE, "save"),
            (sys::VIR_DOMAIN_PAUSED_DUMP, "dump"),
            (sys::VIR_DOMAIN_PAUSED_IOERROR, "ioerror"),
            (sys::VIR_DOMAIN_PAUSED_WATCHDOG, "watchdog"),
            (sys::VIR_DOMAIN_PAUSED_FROM_SNAPSHOT, "from-snapshot"),
            (sys::VIR_DOMAIN_PAUSED_SHUTTING_DOWN, "shutdown"),
            (sys::VIR_DOMAIN_PAUSED_SNAPSHOT, "snapshot"),
            (sys::VIR_DOMAIN_PAUSED_CRASHED, "crashed"),
            (sys::VIR_DOMAIN_PAUSED_STARTING_UP, "starting-up"),
            (sys::VIR_DOMAIN_PAUSED_POSTCOPY, "post-copy"),
            (sys::VIR_DOMAIN_PAUSED_POSTCOPY_FAILED, "postcopy-failed"),
            (sys::VIR_DOMAIN_PAUSED_API_ERROR, "api-error"),
        ],
    ),
    (
        sys::VIR_DOMAIN_SHUTDOWN,
        DomainState::ShuttingDown,
        &[
            (sys::VIR_DOMAIN_SHUTDOWN_UNKNOWN, "unknown"),
            (sys::VIR_DOMAIN_SHUTDOWN_USER, "user"),
        ],
    ),
    (
        sys::VIR_DOMAIN_SHUTOFF,
        DomainState::Shutoff,
        &[
            (sys::VIR_DOMAIN_SHUTOFF_UNKNOWN, "unknown"),
            (sys::VIR_DOMAIN_SHUTOFF_SHUTDOWN, "shutdown"),
            (sys::VIR_DOMAIN_SHUTOFF_DESTROYED, "destroyed"),
            (sys::VIR_DOMAIN_SHUTOFF_CRASHED, "crashed"),
            (sys::VIR_DOMAIN_SHUTOFF_MIGRATED, "migrated"),
            (sys::VIR_DOMAIN_SHUTOFF_SAVED, "saved"),
            (sys::VIR_DOMAIN_SHUTOFF_FAILED, "failed"),
            (sys::VIR_DOMAIN_SHUTOFF_FROM_SNAPSHOT, "from-snapshot"),
            (sys::VIR_DOMAIN_SHUTOFF_DAEMON, "daemon"),
        ],
    ),
    (
        sys::VIR_DOMAIN_CRASHED,
        DomainState::Crashed,
        &[
            (sys::VIR_DOMAIN_CRASHED_UNKNOWN, "unknown"),
            (sys::VIR_DOMAIN_CRASHED_PANICKED, "panicked"),
        ],
    ),
    (
        sys::VIR_DOMAIN_PMSUSPENDED,
        DomainState::PmSuspended,
        &[(sys::VIR_DOMAIN_PMSUSPENDED_UNKNOWN, "unknown")],
    ),
];

/// Each lifecycle event, its name, and its details (`virsh event --event lifecycle`).
const EVENTS: &[(u32, &str, Words)] = &[
    (
        sys::VIR_DOMAIN_EVENT_DEFINED,
        "Defined",
        &[
            (sys::VIR_DOMAIN_EVENT_DEFINED_ADDED, "added"),
            (sys::VIR_DOMAIN_EVENT_DEFINED_UPDATED, "updated"),
            (sys::VIR_DOMAIN_EVENT_DEFINED_RENAMED, "renamed"),
            (sys::VIR_DOMAIN_EVENT_DEFINED_FROM_SNAPSHOT, "from-snapshot"),
        ],
    ),
    (
        sys::VIR_DOMAIN_EVENT_UNDEFINED,
        "Undefined",
        &[
            (sys::VIR_DOMAIN_EVENT_UNDEFINED_REMOVED, "removed"),
            (sys::VIR_DOMAIN_EVENT_UNDEFINED_RENAMED, "renamed"),
        ],
    ),
    (
        sys::VIR_DOMAIN_EVENT_STARTED,
        "Started",
        &[
            (sys::VIR_DOMAIN_EVENT_STARTED_BOOTED, "booted"),
            (sys::VIR_DOMAIN_EVENT_STARTED_MIGRATED, "migrated"),
            (sys::VIR_DOMAIN_EVENT_STARTED_RESTORED, "restored"),
            (sys::VIR_DOMAIN_EVENT_STARTED_FROM_SNAPSHOT, "from-snapshot"),
            (sys::VIR_DOMAIN_EVENT_STARTED_WAKEUP, "wakeup"),
            (sys::VIR_DOMAIN_EVENT_STARTED_RECREATED, "recreated"),
        ],
    ),
    (
        sys::VIR_DOMAIN_EVENT_SUSPENDED,
        "Suspended",
        &[
            (sys::VIR_DOMAIN_EVENT_SUSPENDED_PAUSED, "paused"),
            (sys::VIR_DOMAIN_EVENT_SUSPENDED_MIGRATED, "migrated"),
            (sys::VIR_DOMAIN_EVENT_SUSPENDED_IOERROR, "ioerror"),
            (sys::VIR_DOMAIN_EVENT_SUSPENDED_WATCHDOG, "watchdog"),
            (sys::VIR_DOMAIN_EVENT_SUSPENDED_RESTORED, "restored"),
            (
                sys::VIR_DOMAIN_EVENT_SUSPENDED_FROM_SNAPSHOT,
                "from-snapshot",
            ),
            (sys::VIR_DOMAIN_EVENT_SUSPENDED_API_ERROR, "api-error"),
            (sys::VIR_DOMAIN_EVENT_SUSPENDED_POSTCOPY, "postcopy"),
            (
                sys::VIR_DOMAIN_EVENT_SUSPENDED_POSTCOPY_FAILED,
                "postcopy-failed",
            ),
            (
                sys::VIR_DOMAIN_EVENT_SUSPENDED_GUEST_SHUTDOWN,
                "guest-shutdown",
            ),
        ],
    ),
    (
        sys::VIR_DOMAIN_EVENT_RESUMED,
        "Resumed",
        &[
            (sys::VIR_DOMAIN_EVENT_RESUMED_UNPAUSED, "unpaused"),
            (sys::VIR_DOMAIN_EVENT_RESUMED_MIGRATED, "migrated"),
            (sys::VIR_DOMAIN_EVENT_RESUMED_FROM_SNAPSHOT, "from-snapshot"),
            (sys::VIR_DOMAIN_EVENT_RESUMED_POSTCOPY, "postcopy"),
            (
                sys::VIR_DOMAIN_EVENT_RESUMED_POSTCOPY_FAILED,
                "postcopy-failed",
            ),
        ],
    ),
    (
        sys::VIR_DOMAIN_EVENT_STOPPED,
        "Stopped",
        &[
            (sys::VIR_DOMAIN_EVENT_STOPPED_SHUTDOWN, "shutdown"),
            (sys::VIR_DOMAIN_EVENT_STOPPED_DESTROYED, "destroyed"),
            (sys::VIR_DOMAIN_EVENT_STOPPED_CRASHED, "crashed"),
            (sys::VIR_DOMAIN_EVENT_STOPPED_MIGRATED, "migrated"),
            (sys::VIR_DOMAIN_EVENT_STOPPED_SAVED, "saved"),
            (sys::VIR_DOMAIN_EVENT_STOPPED_FAILED, "failed"),
            (sys::VIR_DOMAIN_EVENT_STOPPED_FROM_SNAPSHOT, "from-snapshot"),
            (sys::VIR_DOMAIN_EVENT_STOPPED_RECREATED, "recreated"),
        ],
    ),
    (
        sys::VIR_DOMAIN_EVENT_SHUTDOWN,
        "Shutdown",
        &[
            (sys::VIR_DOMAIN_EVENT_SHUTDOWN_FINISHED, "finished"),
            (sys::VIR_DOMAIN_EVENT_SHUTDOWN_GUEST, "guest"),
            (sys::VIR_DOMAIN_EVENT_SHUTDOWN_HOST, "host"),
        ],
    ),
    (
        sys::VIR_DOMAIN_EVENT_PMSUSPENDED,
        "PMSuspended",
        &[
            (sys::VIR_DOMAIN_EVENT_PMSUSPENDED_MEMORY, "memory"),
            (sys::VIR_DOMAIN_EVENT_PMSUSPENDED_DISK, "disk"),
        ],
    ),
    (
        sys::VIR_DOMAIN_EVENT_CRASHED,
        "Crashed",
        &[
            (sys::VIR_DOMAIN_EVENT_CRASHED_PANICKED, "panicked"),
            (sys::VIR_DOMAIN_EVENT_CRASHED_CRASHLOADED, "crashloaded"),
        ],
    ),
];

fn find<T: Copy>(table: &[(u32, T)], raw: i32) -> Option<T> {
    let raw = u32::try_from(raw).ok()?;
    table.iter().find(|(code, _)| *code == raw).map(|(_, v)| *v)
}

/// libvirt's numeric state and reason (`virDomainGetState`), in libvirt's own words. A number
/// this binding does not know reads as `nostate (unknown)` or `<state> (unknown)`.
pub(crate) fn power_state_from_raw(state: i32, reason: i32) -> PowerState {
    let entry = u32::try_from(state)
        .ok()
        .and_then(|s| STATES.iter().find(|(code, _, _)| *code == s));
    let (state, reason) = match entry {
        Some((_, state, reasons)) => (*state, find(reasons, reason).unwrap_or("unknown")),
        None => (DomainState::NoState, "unknown"),
    };
    PowerState {
        state,
        reason: reason.to_string(),
    }
}

/// The lifecycle events the launcher tells apart (`virDomainEventType`).
pub(crate) mod lifecycle_event {
    use virt::sys;

    pub(crate) const DEFINED: i32 = sys::VIR_DOMAIN_EVENT_DEFINED as i32;
    pub(crate) const UNDEFINED: i32 = sys::VIR_DOMAIN_EVENT_UNDEFINED as i32;
}

/// A lifecycle event and its detail in libvirt's words (`virsh event --event lifecycle`).
pub(crate) fn lifecycle_names(event: i32, detail: i32) -> (&'static str, &'static str) {
    let entry = u32::try_from(event)
        .ok()
        .and_then(|e| EVENTS.iter().find(|(code, _, _)| *code == e));
    match entry {
        Some((_, name, details)) => (name, find(details, detail).unwrap_or("unknown")),
        None => ("Unknown", "unknown"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reason code of every state, from 0 up, is in the table exactly once: a constant
    /// the binding has but the table lacks leaves a gap or a duplicate.
    #[test]
    fn every_state_and_reason_of_the_binding_has_its_words() {
        let states: Vec<u32> = STATES.iter().map(|(code, _, _)| *code).collect();
        assert_eq!(
            states,
            (0..=sys::VIR_DOMAIN_PMSUSPENDED).collect::<Vec<_>>()
        );
        for (state, kind, reasons) in STATES {
            let codes: Vec<u32> = reasons.iter().map(|(code, _)| *code).collect();
            assert_eq!(
                codes,
                (0..reasons.len() as u32).collect::<Vec<_>>(),
                "{kind:?}"
            );
            for (code, words) in *reasons {
                let read = power_state_from_raw(*state as i32, *code as i32);
                assert_eq!((read.state, read.reason.as_str()), (*kind, *words));
            }
        }
    }

    /// The reasons the launcher acts on, by the binding's constant, written out.
    #[test]
    fn reasons_the_launcher_acts_on() {
        let read = |state: u32, reason: u32| power_state_from_raw(state as i32, reason as i32);
        let table = [
            (
                read(sys::VIR_DOMAIN_PAUSED, sys::VIR_DOMAIN_PAUSED_CRASHED),
                "paused (crashed)",
            ),
            (
                read(sys::VIR_DOMAIN_PAUSED, sys::VIR_DOMAIN_PAUSED_API_ERROR),
                "paused (api-error)",
            ),
            (
                read(sys::VIR_DOMAIN_PAUSED, sys::VIR_DOMAIN_PAUSED_IOERROR),
                "paused (ioerror)",
            ),
            (
                read(
                    sys::VIR_DOMAIN_PAUSED,
                    sys::VIR_DOMAIN_PAUSED_POSTCOPY_FAILED,
                ),
                "paused (postcopy-failed)",
            ),
            (
                read(sys::VIR_DOMAIN_SHUTOFF, sys::VIR_DOMAIN_SHUTOFF_DESTROYED),
                "shutoff (destroyed)",
            ),
            (
                read(sys::VIR_DOMAIN_SHUTDOWN, sys::VIR_DOMAIN_SHUTDOWN_USER),
                "shutdown (user)",
            ),
            (
                read(
                    sys::VIR_DOMAIN_PMSUSPENDED,
                    sys::VIR_DOMAIN_PMSUSPENDED_UNKNOWN,
                ),
                "pmsuspended (unknown)",
            ),
        ];
        for (got, want) in table {
            assert_eq!(got.to_string(), want);
        }
    }

    #[test]
    fn raw_states_read_as_virsh_says_them() {
        assert_eq!(power_state_from_raw(1, 1).to_string(), "running (booted)");
        assert_eq!(power_state_from_raw(3, 5).to_string(), "paused (ioerror)");
        assert_eq!(
            power_state_from_raw(5, 2).to_string(),
            "shutoff (destroyed)"
        );
        assert_eq!(power_state_from_raw(5, 99).to_string(), "shutoff (unknown)");
        assert_eq!(power_state_from_raw(42, 0).to_string(), "nostate (unknown)");
    }

    #[test]
    fn every_lifecycle_event_and_detail_of_the_binding_has_its_words() {
        let events: Vec<u32> = EVENTS.iter().map(|(code, _, _)| *code).collect();
        assert_eq!(
            events,
            (0..=sys::VIR_DOMAIN_EVENT_CRASHED).collect::<Vec<_>>()
        );
        for (event, name, details) in EVENTS {
            let codes: Vec<u32> = details.iter().map(|(code, _)| *code).collect();
            assert_eq!(
                codes,
                (0..details.len() as u32).collect::<Vec<_>>(),
                "{name}"
            );
            for (code, words) in *details {
                assert_eq!(
                    lifecycle_names(*event as i32, *code as i32),
                    (*name, *words)
                );
            }
        }
        assert_eq!(lifecycle_names(99, 0), ("Unknown", "unknown"));
        assert_eq!(
            lifecycle_names(
                sys::VIR_DOMAIN_EVENT_STOPPED as i32,
                sys::VIR_DOMAIN_EVENT_STOPPED_DESTROYED as i32
            ),
            ("Stopped", "destroyed")
        );
    }
}
