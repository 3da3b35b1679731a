//! What the launcher last read of the domain from libvirt, and whether it is still the truth:
//! the live disks, the vCPUs and memory, and the moment of the last power-state read, each kept
//! under the count of libvirt's events delivered just before the read (`libvirt::delivered`). A
//! later caller learns from the events since (`carry_disks`, `resources_carry`,
//! `power_state_carries`) whether the read still holds, and asks libvirt only when it does not:
//! a no-op Sync then costs no libvirt call. And the vCPUs of the persistent definition, which
//! only the launcher writes (it defines the domain at every start).
//!
//! Locks: `disks`, `resources`, `next_boot_vcpus` and `power_read_at` are leaves, taken alone
//! and never while calling out; the log of delivered events (which waits for nothing) is read
//! under them. `reading` (async) is held for one power-state read and its update, so that two
//! reads never interleave.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::domain::{LiveDisk, LiveResources, VirtioMemDef};
use crate::libvirt::delivered::Change;

/// When the live disks were read: the count of delivered events and of the launcher's own
/// device changes just before. A read that overlapped a change is never taken for current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LiveKey {
    delivered: u64,
    own_changes: u64,
}

/// The changes libvirt delivered after one count and up to another, if the log still has them
/// all (`libvirt::delivered::between`).
pub(super) type DeliveredLog<'a> = &'a dyn Fn(u64, u64) -> Option<Vec<Change>>;

#[derive(Debug)]
pub(super) struct LiveView {
    /// Off (`VMLAUNCHER_PLAIN`): nothing read is kept; every caller asks libvirt.
    enabled: bool,
    disks: Mutex<Option<(LiveKey, Vec<LiveDisk>)>>,
    /// Bumped before each attach or detach of the launcher's own.
    own_changes: AtomicU64,
    /// The count of delivered events just before the last successful power-state read.
    power_read_at: Mutex<Option<u64>>,
    reading: tokio::sync::Mutex<()>,
    /// The vCPUs and memory last read, or as the launcher's own accepted resize left them, under
    /// the key of that moment (its `own_changes` counting the launcher's resizes).
    resources: Mutex<Option<(LiveKey, LiveResources)>>,
    /// Bumped before each resize of the launcher's own.
    own_resizes: AtomicU64,
    /// The vCPUs the persistent definition enables, as the launcher last read or set them.
    next_boot_vcpus: Mutex<Option<u32>>,
}

impl LiveView {
    pub(super) fn new(enabled: bool) -> LiveView {
        LiveView {
            enabled,
            disks: Mutex::new(None),
            own_changes: AtomicU64::new(0),
            power_read_at: Mutex::new(None),
            reading: tokio::sync::Mutex::new(()),
            resources: Mutex::new(None),
            own_resizes: AtomicU64::new(0),
            next_boot_vcpus: Mutex::new(None),
        }
    }

    /// Whether reads are kept at all (the live state cache is on).
    pub(super) fn keeps(&self) -> bool {
        self.enabled
    }

    /// The key of a read about to be made, `delivered` being the count of events now.
    pub(super) fn key(&self, delivered: u64) -> LiveKey {
        LiveKey {
            delivered,
            own_changes: self.own_changes.load(Ordering::SeqCst),
        }
    }

    /// The live disks of `domain` last read, if nothing can have changed them since (`now` is
    /// the key of now), or if the events since tell all that changed (`carry_disks`):
    /// then kept under `now`.
    pub(super) fn disks(
        &self,
        now: LiveKey,
        domain: &str,
        log: DeliveredLog,
    ) -> Option<Vec<LiveDisk>> {
        let mut kept = self.disks.lock().expect("live disks lock");
        let (at, disks) = kept.as_mut()?;
        if at.own_changes != now.own_changes || at.delivered > now.delivered {
            return None;
        }
        if at.delivered < now.delivered {
            let changes = log(at.delivered, now.delivered)?;
            *disks = carry_disks(disks, domain, &changes)?;
            at.delivered = now.delivered;
        }
        Some(disks.clone())
    }

    /// Keeps the live disks read under `key`.
    pub(super) fn keep_disks(&self, key: LiveKey, disks: Vec<LiveDisk>) {
        if self.enabled {
            *self.disks.lock().expect("live disks lock") = Some((key, disks));
        }
    }

    /// The launcher is about to change the domain's devices (or lost track of them).
    pub(super) fn forget_disks(&self) {
        self.own_changes.fetch_add(1, Ordering::SeqCst);
        *self.disks.lock().expect("live disks lock") = None;
    }

    /// Whether the power state last read is the truth at count `now`: read since the last event,
    /// or before device events only (`power_state_carries`; then kept as read at `now`).
    pub(super) fn power_state_current_at(&self, now: u64, log: DeliveredLog) -> bool {
        let mut read_at = self.power_read_at.lock().expect("power read lock");
        let Some(at) = *read_at else {
            return false;
        };
        let carries = at == now
            || (at < now && log(at, now).is_some_and(|changes| power_state_carries(&changes)));
        if carries {
            *read_at = Some(now);
        }
        carries
    }

    /// The power state was read successfully at `delivered` (`None`: it is not known). Set only
    /// once the observation it read is in the state: a task that finds the count current takes
    /// that observation for the truth.
    pub(super) fn power_read(&self, delivered: Option<u64>) {
        if self.enabled {
            *self.power_read_at.lock().expect("power read lock") = delivered;
        }
    }

    /// Held for one power-state read and its update.
    pub(super) async fn reading(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.reading.lock().await
    }

    /// The key of a read of the vCPUs and memory about to be made (or of a resize just
    /// accepted), `delivered` being the count of events now.
    pub(super) fn resources_key(&self, delivered: u64) -> LiveKey {
        LiveKey {
            delivered,
            own_changes: self.own_resizes.load(Ordering::SeqCst),
        }
    }

    /// The vCPUs and memory of `domain` last kept, if nothing can have changed them since (`now`
    /// is the key of now, the launcher resized nothing since) or the events since leave them
    /// as they were (`resources_carry`): then kept under `now`.
    pub(super) fn resources(
        &self,
        now: LiveKey,
        domain: &str,
        log: DeliveredLog,
    ) -> Option<LiveResources> {
        let mut kept = self.resources.lock().expect("live resources lock");
        let (at, resources) = kept.as_mut()?;
        if at.own_changes != now.own_changes || at.delivered > now.delivered {
            return None;
        }
        if at.delivered < now.delivered
            && !resources_carry(domain, &log(at.delivered, now.delivered)?)
        {
            return None;
        }
        at.delivered = now.delivered;
        Some(resources.clone())
    }

    /// Keeps the vCPUs and memory read (or left by an accepted resize) under `key`; a read that
    /// began before one of the launcher's own resizes is not kept.
    pub(super) fn keep_resources(&self, key: LiveKey, resources: LiveResources) {
        if !self.enabled {
            return;
        }
        let mut kept = self.resources.lock().expect("live resources lock");
        if key.own_changes == self.own_resizes.load(Ordering::SeqCst) {
            *kept = Some((key, resources));
        }
    }

    /// The guest has `size_kib` of the virtio-mem device plugged now (its size-change event):
    /// what is kept says so, under the same key (the event carries the resources over).
    pub(super) fn guest_plugged(&self, size_kib: u64) {
        let mut kept = self.resources.lock().expect("live resources lock");
        if let Some(mem) = kept.as_mut().and_then(|(_, r)| r.virtio_mem.as_mut()) {
            mem.current_kib = size_kib;
        }
    }

    /// The launcher is about to resize the domain: what was kept is no longer known.
    pub(super) fn forget_resources(&self) {
        self.own_resizes.fetch_add(1, Ordering::SeqCst);
        *self.resources.lock().expect("live resources lock") = None;
    }

    /// The vCPUs the persistent definition enables, if the launcher knows them.
    pub(super) fn next_boot_vcpus(&self) -> Option<u32> {
        *self.next_boot_vcpus.lock().expect("next boot lock")
    }

    /// The launcher read or set the persistent definition's vCPUs (`None`: it does not know them
    /// now: a set that failed, a new definition).
    pub(super) fn keep_next_boot_vcpus(&self, vcpus: Option<u32>) {
        if self.enabled {
            *self.next_boot_vcpus.lock().expect("next boot lock") = vcpus;
        }
    }
}

/// The live disks of `domain` read before `changes`, as they are after them: when every change
/// is the removal of one of its devices (that disk, if it is one, is gone), the addition of a
/// disk the read already shows, or a device event of another domain. A read that shows the
/// added alias was made after the device came (its key was taken before the event was
/// delivered), and libvirt keeps a domain's aliases unique, so the read has that very device:
/// this is how a read the launcher makes right after its own attach stays current. Any other
/// addition (what was added only a read tells) or change needs a read: `None`.
fn carry_disks(read: &[LiveDisk], domain: &str, changes: &[Change]) -> Option<Vec<LiveDisk>> {
    let mut disks = read.to_vec();
    let shows = |disks: &[LiveDisk], alias: &str| {
        disks
            .iter()
            .any(|disk| disk.alias.as_deref() == Some(alias))
    };
    for change in changes {
        match change {
            Change::DeviceRemoved { domain: d, alias } if d == domain => {
                disks.retain(|disk| disk.alias.as_deref() != Some(alias.as_str()));
            }
            Change::DeviceAdded { domain: d, alias } if d == domain => {
                if !shows(&disks, alias) {
                    return None;
                }
            }
            Change::DeviceRemoved { .. } | Change::DeviceAdded { .. } | Change::Guest => {}
            Change::Other => return None,
        }
    }
    Some(disks)
}

/// Whether the vCPUs and memory of `domain` read before `changes` are still what it has after
/// them: a disk or interface coming or going and the guest's agent change neither, and what the
/// guest plugged of its memory (the one thing a size-change event moves) plans nothing; the
/// virtio-mem device itself coming or going, or any other change (a restart above all), needs a
/// read. libvirt sends no event for a vCPU count changed live: the caller reads the count
/// itself before it changes one.
fn resources_carry(domain: &str, changes: &[Change]) -> bool {
    changes.iter().all(|change| match change {
        Change::DeviceRemoved { domain: d, alias } | Change::DeviceAdded { domain: d, alias } => {
            d != domain || alias != VirtioMemDef::ALIAS
        }
        Change::Guest => true,
        Change::Other => false,
    })
}

/// Whether a power state read before `changes` is still the truth after them: devices coming
/// and going and the guest's own doings (its agent, its memory) do not change it; every other
/// change of it comes with an event of its own.
fn power_state_carries(changes: &[Change]) -> bool {
    changes.iter().all(Change::keeps_power_state)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(alias: &str) -> LiveDisk {
        LiveDisk {
            alias: Some(alias.into()),
            target: format!("sd-{alias}"),
            bus: "scsi".into(),
            serial: None,
            source: None,
            address: None,
            xml: String::new(),
        }
    }

    fn no_log(_: u64, _: u64) -> Option<Vec<Change>> {
        None
    }

    fn removed(domain: &str, alias: &str) -> Change {
        Change::DeviceRemoved {
            domain: domain.into(),
            alias: alias.into(),
        }
    }

    #[test]
    fn disks_read_under_the_current_key_are_current() {
        let view = LiveView::new(true);
        assert_eq!(view.disks(view.key(5), "vm", &no_log), None);
        view.keep_disks(view.key(5), vec![disk("ua-a")]);
        assert_eq!(
            view.disks(view.key(5), "vm", &no_log),
            Some(vec![disk("ua-a")])
        );
    }

    #[test]
    fn an_own_change_makes_the_disks_unknown_even_a_read_that_overlapped_it() {
        let view = LiveView::new(true);
        let before = view.key(5);
        view.forget_disks();
        // A read begun before the change, kept after it.
        view.keep_disks(before, vec![disk("ua-a")]);
        assert_eq!(view.disks(view.key(5), "vm", &no_log), None);
    }

    #[test]
    fn removals_since_the_read_are_carried_and_anything_else_needs_a_read() {
        let view = LiveView::new(true);
        view.keep_disks(view.key(1), vec![disk("ua-a"), disk("ua-b")]);
        let log = |after: u64, upto: u64| {
            assert_eq!((after, upto), (1, 2));
            Some(vec![removed("vm", "ua-a")])
        };
        assert_eq!(
            view.disks(view.key(2), "vm", &log),
            Some(vec![disk("ua-b")])
        );
        // Kept under the new count: the same question again needs no log.
        assert_eq!(
            view.disks(view.key(2), "vm", &no_log),
            Some(vec![disk("ua-b")])
        );
        // A disk the read does not show.
        let added = |_, _| Some(vec![added("vm", "ua-c")]);
        assert_eq!(view.disks(view.key(3), "vm", &added), None);
        // Events the log no longer has: unknown.
        assert_eq!(view.disks(view.key(3), "vm", &no_log), None);
    }

    #[test]
    fn a_power_state_read_stays_current_until_an_event_other_than_a_device() {
        let view = LiveView::new(true);
        assert!(!view.power_state_current_at(1, &no_log));
        view.power_read(Some(1));
        assert!(view.power_state_current_at(1, &no_log));
        let devices = |_, _| Some(vec![removed("vm", "ua-a")]);
        assert!(view.power_state_current_at(2, &devices));
        let other = |_, _| Some(vec![Change::Other]);
        assert!(!view.power_state_current_at(3, &other));
        view.power_read(None);
        assert!(!view.power_state_current_at(2, &no_log));
    }

    #[test]
    fn switched_off_it_keeps_nothing() {
        let view = LiveView::new(false);
        view.keep_disks(view.key(1), vec![disk("ua-a")]);
        assert_eq!(view.disks(view.key(1), "vm", &no_log), None);
        view.power_read(Some(1));
        assert!(!view.power_state_current_at(1, &no_log));
        view.keep_resources(view.resources_key(1), cpus(2));
        assert_eq!(view.resources(view.resources_key(1), "vm", &no_log), None);
        view.keep_next_boot_vcpus(Some(2));
        assert_eq!(view.next_boot_vcpus(), None);
    }

    fn cpus(vcpus: u32) -> LiveResources {
        LiveResources {
            vcpus,
            max_vcpus: 8,
            ..LiveResources::default()
        }
    }

    #[test]
    fn resources_carry_over_other_devices_and_the_guests_doings_only() {
        let view = LiveView::new(true);
        assert_eq!(view.resources(view.resources_key(3), "vm", &no_log), None);
        view.keep_resources(view.resources_key(3), cpus(2));
        assert_eq!(
            view.resources(view.resources_key(3), "vm", &no_log),
            Some(cpus(2))
        );
        // Events the log no longer has: unknown.
        assert_eq!(view.resources(view.resources_key(4), "vm", &no_log), None);
        let log = |from: u64, to: u64| -> Option<Vec<Change>> {
            let all = [
                removed("vm", "ua-disk"),
                added("vm", "ua-net"),
                Change::Guest,
                removed("other", VirtioMemDef::ALIAS),
                removed("vm", VirtioMemDef::ALIAS),
                Change::Other,
            ];
            Some(all[from as usize - 3..to as usize - 3].to_vec())
        };
        for now in 4..=7 {
            assert_eq!(
                view.resources(view.resources_key(now), "vm", &log),
                Some(cpus(2)),
                "{now}"
            );
        }
        // The device itself gone: a read tells what the domain has.
        assert_eq!(view.resources(view.resources_key(8), "vm", &log), None);
        view.keep_resources(view.resources_key(8), cpus(3));
        assert_eq!(
            view.resources(view.resources_key(9), "vm", &log),
            None,
            "a restart"
        );
    }

    #[test]
    fn what_the_guest_plugged_is_kept_under_the_same_key() {
        let view = LiveView::new(true);
        view.guest_plugged(512);
        assert_eq!(view.resources(view.resources_key(1), "vm", &no_log), None);
        let with_mem = LiveResources {
            virtio_mem: Some(crate::domain::LiveVirtioMem::default()),
            ..cpus(2)
        };
        view.keep_resources(view.resources_key(1), with_mem);
        view.guest_plugged(512);
        let kept = view
            .resources(view.resources_key(1), "vm", &no_log)
            .unwrap();
        assert_eq!(kept.virtio_mem.map(|m| m.current_kib), Some(512));
    }

    #[test]
    fn a_read_that_began_before_the_launchers_own_resize_is_not_kept() {
        let view = LiveView::new(true);
        view.keep_resources(view.resources_key(1), cpus(2));
        let read_began = view.resources_key(1);
        view.forget_resources();
        assert_eq!(view.resources(view.resources_key(1), "vm", &no_log), None);
        // The read finishes after the resize: what it saw may be from before.
        view.keep_resources(read_began, cpus(2));
        assert_eq!(view.resources(view.resources_key(1), "vm", &no_log), None);
        // The resize's own outcome, kept under a key taken after it began, is current.
        view.keep_resources(view.resources_key(1), cpus(4));
        assert_eq!(
            view.resources(view.resources_key(1), "vm", &no_log),
            Some(cpus(4))
        );
    }

    fn added(domain: &str, alias: &str) -> Change {
        Change::DeviceAdded {
            domain: domain.into(),
            alias: alias.into(),
        }
    }

    #[test]
    fn disks_carry_over_removals_and_other_domains_devices_only() {
        let read = [disk("ua-a"), disk("ua-b"), disk("scsi0-0-0-2")];
        let cases: [(&[Change], Option<Vec<LiveDisk>>); 11] = [
            (&[], Some(read.to_vec())),
            (
                &[removed("vm", "ua-a")],
                Some(vec![disk("ua-b"), disk("scsi0-0-0-2")]),
            ),
            (
                &[removed("vm", "scsi0-0-0-2"), removed("vm", "ua-b")],
                Some(vec![disk("ua-a")]),
            ),
            // Not a disk of this domain (a network card, or another domain's disk).
            (
                &[removed("vm", "net0"), removed("other", "ua-a")],
                Some(read.to_vec()),
            ),
            (&[added("other", "ua-c")], Some(read.to_vec())),
            // The read was made after the disk came, before its event was delivered.
            (&[added("vm", "ua-b")], Some(read.to_vec())),
            // A device the read does not show: only a new read tells what it is.
            (&[added("vm", "ua-c")], None),
            (&[added("vm", "net1")], None),
            // Gone and back under the same alias: the read shows the old one.
            (&[removed("vm", "ua-a"), added("vm", "ua-a")], None),
            (&[Change::Other, removed("vm", "ua-a")], None),
            // The agent connected, the guest plugged memory: no disk came or went.
            (
                &[Change::Guest, removed("vm", "ua-a")],
                Some(vec![disk("ua-b"), disk("scsi0-0-0-2")]),
            ),
        ];
        for (changes, expected) in cases {
            assert_eq!(carry_disks(&read, "vm", changes), expected, "{changes:?}");
        }
    }

    #[test]
    fn the_power_state_carries_over_device_events_only() {
        assert!(power_state_carries(&[]));
        assert!(power_state_carries(&[
            removed("vm", "ua-a"),
            added("other", "ua-a")
        ]));
        assert!(power_state_carries(&[Change::Guest, added("vm", "ua-a")]));
        assert!(!power_state_carries(&[added("vm", "ua-a"), Change::Other]));
    }
}
