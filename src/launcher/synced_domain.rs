//! The domain definition the current spec converts to, as the Sync that accepted the spec
//! converted it: the next Sync compares its own conversion with this one (frozen fields,
//! interfaces) instead of converting the current spec a second time.
//!
//! What the comparison reads does not depend on which volumes are block devices (disks are
//! not compared), so two inputs move under a kept conversion: the memory the guest booted with
//! (`ConvertOptions::guest_at_boot`: it changes with a boot), and the versioned machines the
//! launcher has learnt from its defines (`Launcher::machines`: one more at the first define of
//! an alias, never fewer). A conversion made for other boot memory, or before a machine was
//! learnt, is not used.

use std::sync::Arc;

use crate::domain::DomainDef;

#[derive(Debug, Clone)]
pub(super) struct SyncedDomain {
    guest_at_boot: Option<u64>,
    machines_learnt: usize,
    domain: Arc<DomainDef>,
}

impl SyncedDomain {
    /// `domain`, converted for a guest that booted with `guest_at_boot`, when the launcher had
    /// learnt `machines_learnt` machines.
    pub(super) fn new(
        guest_at_boot: Option<u64>,
        machines_learnt: usize,
        domain: Arc<DomainDef>,
    ) -> SyncedDomain {
        SyncedDomain {
            guest_at_boot,
            machines_learnt,
            domain,
        }
    }

    /// The kept conversion, if it was made for a guest that booted with `guest_at_boot` and
    /// with the `machines_learnt` machines the launcher knows now.
    pub(super) fn for_inputs(
        &self,
        guest_at_boot: Option<u64>,
        machines_learnt: usize,
    ) -> Option<Arc<DomainDef>> {
        (self.guest_at_boot == guest_at_boot && self.machines_learnt == machines_learnt)
            .then(|| Arc::clone(&self.domain))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversion_is_used_only_for_the_boot_memory_it_was_made_for() {
        let domain = Arc::new(DomainDef::default());
        let kept = SyncedDomain::new(Some(1 << 30), 0, Arc::clone(&domain));
        assert!(kept
            .for_inputs(Some(1 << 30), 0)
            .is_some_and(|d| Arc::ptr_eq(&d, &domain)));
        assert!(kept.for_inputs(Some(2 << 30), 0).is_none());
        assert!(kept.for_inputs(None, 0).is_none());
    }
}
