//! What the launcher knows of the domain without asking libvirt: the rules by which state read
//! before some events is still the truth after them (see `libvirt::delivered`). Pure.

use crate::domain::LiveDisk;
use crate::libvirt::delivered::Change;

/// The live disks of `domain` read before `changes`, as they are after them: when every change
/// is the removal of one of its devices (that disk, if it is one, is gone) or a device event of
/// another domain. Anything else, an addition above all (what was added only a read tells),
/// needs a read: `None`.
pub(super) fn carry_disks(
    read: &[LiveDisk],
    domain: &str,
    changes: &[Change],
) -> Option<Vec<LiveDisk>> {
    let mut gone = Vec::new();
    for change in changes {
        match change {
            Change::DeviceRemoved { domain: d, alias } if d == domain => gone.push(alias.as_str()),
            Change::DeviceRemoved { domain: d, .. } | Change::DeviceAdded { domain: d }
                if d != domain => {}
            _ => return None,
        }
    }
    Some(
        read.iter()
            .filter(|disk| !disk.alias.as_deref().is_some_and(|a| gone.contains(&a)))
            .cloned()
            .collect(),
    )
}

/// Whether a power state read before `changes` is still the truth after them: devices coming
/// and going do not change it; every other change of it comes with an event of its own.
pub(super) fn power_state_carries(changes: &[Change]) -> bool {
    changes.iter().all(Change::is_device)
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

    fn removed(domain: &str, alias: &str) -> Change {
        Change::DeviceRemoved {
            domain: domain.into(),
            alias: alias.into(),
        }
    }

    fn added(domain: &str) -> Change {
        Change::DeviceAdded {
            domain: domain.into(),
        }
    }

    #[test]
    fn disks_carry_over_removals_and_other_domains_devices_only() {
        let read = [disk("ua-a"), disk("ua-b"), disk("scsi0-0-0-2")];
        let cases: [(&[Change], Option<Vec<LiveDisk>>); 7] = [
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
            (&[added("other")], Some(read.to_vec())),
            (&[removed("vm", "ua-a"), added("vm")], None),
            (&[Change::Other, removed("vm", "ua-a")], None),
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
            added("other")
        ]));
        assert!(!power_state_carries(&[added("vm"), Change::Other]));
    }
}
